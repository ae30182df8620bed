import pytest


def _gpu_available() -> bool:
    try:
        import cupy
        return bool(cupy.is_available())
    except Exception:   # no CuPy, no driver, no device
        return False


GPU = _gpu_available()


def pytest_collection_modifyitems(config, items):
    if GPU:
        return
    skip = pytest.mark.skip(reason="needs a CUDA GPU")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)
