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


@pytest.fixture
def spilling_direct_config():
    """A direct-kernel config whose NCHW build spills (from the ptxas table): the resource
    filter must reject it."""
    from megawino.direct import DirectConfig, _PTXAS_SM90
    for key, (_, spills, _) in sorted(_PTXAS_SM90.items()):
        if spills > 0 and key.endswith("nchw"):
            return DirectConfig.from_key(key[:-len("nchw")])
    raise AssertionError("no spilling NCHW config in the ptxas table")


@pytest.fixture(autouse=True)
def _private_cache_dir(tmp_path_factory, monkeypatch):
    """Tuned tables in the user's cache take precedence over the shipped ones: every test
    gets an empty cache of its own, whatever the machine's user has tuned."""
    monkeypatch.setenv("MEGAWINO_CACHE_DIR", str(tmp_path_factory.mktemp("megawino-cache")))
