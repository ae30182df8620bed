"""A wheel without the CUDA sources is broken even when `pip install -e .` works."""
import shutil
import subprocess
import sys
import zipfile

from megawino.core import resources


def test_sources_found_through_resources():
    assert (resources.cuda_dir() / "generated_tasks.cuh").is_file()
    assert resources.mapping_dir().is_dir()
    assert len(resources.source_hash()) == 40


# What the wheel is built from; copied, so that setuptools' build/ and egg-info land in the
# test's own temporary directory and two test runs in one checkout never share them.
SOURCES = ("pyproject.toml", "LICENSE", "README.md", "megawino", "cuda", "mapping")


def test_wheel_carries_cuda_sources(tmp_path):
    root = resources.cuda_dir().parent
    source = tmp_path / "source"
    for name in SOURCES:
        if (root / name).is_dir():
            shutil.copytree(root / name, source / name,
                            ignore=shutil.ignore_patterns("__pycache__", "*.egg-info", "build"))
        else:
            source.mkdir(exist_ok=True)
            shutil.copy2(root / name, source / name)
    wheels = tmp_path / "wheels"
    in_tree_build = (root / "build").exists()
    proc = subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps",
                           "-w", str(wheels), str(source)], capture_output=True, text=True)
    assert proc.returncode == 0, f"pip wheel failed:\n{proc.stderr[-4000:]}"
    assert (root / "build").exists() == in_tree_build          # nothing built in the checkout
    wheel = next(wheels.glob("megawino-*.whl"))
    names = set(zipfile.ZipFile(wheel).namelist())
    for path in resources.cuda_dir().glob("*.cu*"):
        assert f"megawino/_cuda/{path.name}" in names
    for path in resources.mapping_dir().glob("*.json"):
        assert f"megawino/_mapping/{path.name}" in names
    package_dir = root / "megawino"
    modules = {path.relative_to(root).as_posix() for path in package_dir.rglob("*.py")}
    assert "megawino/core/stages/gemm.py" in modules and len(modules) > 40
    assert not modules - names, f"modules missing from the wheel (pyproject.toml packages): {modules - names}"
    assert {"megawino/py.typed", "megawino/data/suite_layers.json"} <= names
    import megawino
    dist_info = f"megawino-{megawino.__version__}.dist-info"
    assert any(n.startswith(dist_info + "/") and n.endswith("LICENSE") for n in names)
    metadata = zipfile.ZipFile(wheel).read(f"{dist_info}/METADATA").decode()
    requires = [line for line in metadata.splitlines() if line.startswith("Requires-Dist:")]
    cupy = [line for line in requires if "cupy" in line]
    assert cupy and all('extra == "gpu"' in line for line in cupy)      # CuPy only with [gpu]
    assert f"Version: {megawino.__version__}" in metadata and "License-Expression: MIT" in metadata
    # no top-level `cuda` package: it would hide CUDA Python's namespace package
    assert not any(n.startswith("cuda/") for n in names)
