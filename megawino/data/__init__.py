"""Data shipped with megawino: the benchmark suite (suite_layers.json, a copy of the
project's shared/suite/layers.json), read through importlib.resources."""
