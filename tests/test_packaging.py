"""A wheel without the CUDA sources is broken even when `pip install -e .` works."""
import subprocess
import sys
import zipfile

from megawino.core import resources


def test_sources_found_through_resources():
    assert (resources.cuda_dir() / "generated_tasks.cuh").is_file()
    assert resources.mapping_dir().is_dir()
    assert len(resources.source_hash()) == 40


def test_wheel_carries_cuda_sources(tmp_path):
    root = resources.cuda_dir().parent
    subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps",
                    "-w", str(tmp_path), str(root)], check=True, capture_output=True)
    wheel = next(tmp_path.glob("megawino-*.whl"))
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
