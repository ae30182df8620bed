"""Data shipped with megawino: the benchmark suite (suite_layers.json), read through
importlib.resources."""
