"""Where the CUDA sources and mapping tables are, installed or in a checkout."""
from __future__ import annotations

import hashlib
import importlib.resources
import pathlib


def _package_dir(package: str, fallback: str) -> pathlib.Path:
    try:
        path = pathlib.Path(str(importlib.resources.files(package)))
        if path.is_dir():
            return path
    except (ModuleNotFoundError, TypeError):
        pass
    return pathlib.Path(__file__).resolve().parent.parent / fallback


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
