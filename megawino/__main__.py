"""``python -m megawino``: the command line (see :mod:`megawino.cli`)."""
import sys

from .cli import main

if __name__ == "__main__":
    sys.exit(main())
