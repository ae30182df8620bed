"""``python -m megawino.direct_tune``: kept for the docs and scripts that name it; the
tuner is :mod:`megawino.direct.tune`."""
from .direct.tune import layers_for, main, measure_config, tune_layers

__all__ = ["measure_config", "tune_layers", "layers_for", "main"]

if __name__ == "__main__":
    raise SystemExit(main())
