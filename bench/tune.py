"""Tune mapping and task parameters on the GPU: ``python bench/tune.py TARGET [options]``.

The same as ``megawino tune`` (see megawino/tune.py for the method); TARGET is a
network, a layer, a shape string or ``suite``.
"""
import sys
from pathlib import Path

try:
    import megawino  # noqa: F401
except ImportError:       # run from a checkout without installing
    sys.path.append(str(Path(__file__).resolve().parent.parent))

from megawino.cli import main  # noqa: E402

if __name__ == "__main__":
    sys.exit(main(["tune", *sys.argv[1:]]))
