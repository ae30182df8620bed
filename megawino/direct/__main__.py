"""``python -m megawino.direct --ptxas``: rewrite the ptxas register table (see :mod:`.ptxas`)."""
from .ptxas import main

if __name__ == "__main__":
    raise SystemExit(main())
