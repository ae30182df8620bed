"""``python -m megawino.cli``: the same as ``python -m megawino`` and ``megawino``."""
import sys

from . import main

if __name__ == "__main__":
    sys.exit(main())
