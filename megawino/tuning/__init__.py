"""Tuned parameters: :mod:`.table` reads the tuned tables and chooses a layer's task and mapping
parameters (the runtime uses it); :mod:`.search` is the mapping tuner behind ``megawino tune``;
:mod:`.direct` tunes the direct path (``python -m megawino.tuning.direct``).  ``table`` sits below
the GPU packages, ``search`` and ``direct`` above them (docs/design.md, "Packages")."""
