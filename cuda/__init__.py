"""CUDA sources of megawino, installed as package data (megawino._cuda)."""
