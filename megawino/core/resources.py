"""Where the CUDA sources and mapping tables are, installed or in a checkout."""
from __future__ import annotations

import hashlib
import importlib.util
import pathlib


def _package_dir(package: str, fallback: str) -> pathlib.Path:
    """The folder of a data package.  ``cuda/`` and ``mapping/`` have no
    ``__init__.py`` on purpose: a regular package named ``cuda`` at the repository
    root would hide CUDA Python's ``cuda`` namespace package, which CuPy imports."""
    try:
        spec = importlib.util.find_spec(package)
    except ModuleNotFoundError:
        spec = None
    for location in (spec.submodule_search_locations or []) if spec else []:
        path = pathlib.Path(location)
        if path.is_dir():
            return path
    return pathlib.Path(__file__).resolve().parents[2] / fallback


def cuda_dir() -> pathlib.Path:
    return _package_dir("megawino._cuda", "cuda")


def mapping_dir() -> pathlib.Path:
    return _package_dir("megawino._mapping", "mapping")


def source_hash() -> str:
    """SHA-1 over every CUDA source: CuPy's cache key ignores #included headers."""
    digest = hashlib.sha1()
    for path in sorted(cuda_dir().glob("*.cu*")):
        digest.update(path.name.encode())
        digest.update(path.read_bytes())
    return digest.hexdigest()
