"""A wheel without the CUDA sources is broken even when `pip install -e .` works."""
import subprocess
import sys
import zipfile

from megawino import resources


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
    assert "megawino/stages/gemm.py" in names
    # no top-level `cuda` package: it would hide CUDA Python's namespace package
    assert not any(n.startswith("cuda/") for n in names)
