"""Where the tuners write (the user's cache directory) and how (atomically, never over a file
that is not what the caller expects).

The tuned tables shipped in the package (``mapping/``) are read-only defaults; ``megawino
tune`` and ``python -m megawino.tuning.direct`` write to

1. ``$MEGAWINO_CACHE_DIR`` if set, else
2. ``$XDG_CACHE_HOME/megawino`` if ``XDG_CACHE_HOME`` is an absolute path, else
3. ``~/.cache/megawino``,

or to the path given with ``--out`` / ``out=``.
"""
from __future__ import annotations

import os
import pathlib
import shutil
import tempfile

CACHE_ENV = "MEGAWINO_CACHE_DIR"


def cache_dir() -> pathlib.Path:
    """The user's megawino cache directory (see the module docstring); not created here."""
    own = os.environ.get(CACHE_ENV)
    if own:
        return pathlib.Path(own).expanduser()
    xdg = os.environ.get("XDG_CACHE_HOME", "")
    # The XDG base directory spec: a relative path is invalid and is ignored.
    if xdg and os.path.isabs(xdg):
        return pathlib.Path(xdg) / "megawino"
    return pathlib.Path.home() / ".cache" / "megawino"


def user_table_path(filename: str) -> pathlib.Path:
    """Path of a tuned table (``h100.json``, ``direct_h100.json``) in the user's cache."""
    return cache_dir() / filename


def check_writable(path) -> pathlib.Path:
    """``path`` when a tuner can write its table there, checked before any measuring: its folder
    made (as the write would) and a temporary file created and removed in it, and ``path`` itself,
    when there, a writable regular file; a one-line ValueError otherwise."""
    path = pathlib.Path(path)
    if path.exists() and not path.is_file():
        raise ValueError(f"{path} is not a regular file: the tuner writes a table there; pass another --out")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, probe = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
        os.close(fd)
        os.unlink(probe)
    except OSError as exc:
        raise ValueError(f"cannot write {path} ({exc.strerror or exc}): pass another --out "
                         f"or set {CACHE_ENV}") from None
    if path.exists() and not os.access(path, os.W_OK):
        raise ValueError(f"cannot write {path} (not writable): pass another --out or set {CACHE_ENV}")
    return path


def write_text_atomically(path, text: str) -> pathlib.Path:
    """Write ``text`` to ``path`` through a temporary file in the same directory and
    ``os.replace``: readers see the old file or the new one, never a truncated one.  A symlink
    is written through to its final target (the link itself is kept)."""
    path = pathlib.Path(os.path.realpath(path))
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            fh.write(text)
            fh.flush()
            os.fsync(fh.fileno())
        if path.exists():
            shutil.copymode(path, tmp)
        else:
            os.chmod(tmp, 0o644)    # mkstemp's 0600 would hide a shared table from other users
        os.replace(tmp, path)
    except BaseException:
        pathlib.Path(tmp).unlink(missing_ok=True)
        raise
    return path
