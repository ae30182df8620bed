"""Tuned mapping tables per GPU model, installed as package data (megawino._mapping)."""
