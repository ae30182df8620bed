"""Tuners fail loudly: measured nothing -> a non-zero exit and no file; bad numbers refused by
argparse; an output that cannot be written found before anything is measured."""
from __future__ import annotations

import os
import pathlib
import subprocess
import sys

import pytest

from megawino.core import user_files
from megawino.core.spec import LayerSpec
from megawino.tuning import direct as direct_tuner

REPO = pathlib.Path(__file__).resolve().parents[2]
POINTWISE = LayerSpec(8, 64, 64, 28, 28, 1, 1, padding=0)

# A finder that makes `import cupy` fail, as on a machine without CuPy (or a GPU).
BLOCK_CUPY = """
import runpy, sys
class _NoCupy:
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in ("cupy", "cupyx", "cupy_backends"):
            raise ImportError(f"No module named {name!r}", name=name)
sys.meta_path.insert(0, _NoCupy())
sys.argv = ["megawino.tuning.direct"] + sys.argv[1:]
runpy.run_module("megawino.tuning.direct", run_name="__main__")
"""


def test_direct_tuner_without_a_gpu_exits_non_zero_and_writes_nothing(tmp_path):
    env = dict(os.environ, MEGAWINO_CACHE_DIR=str(tmp_path / "cache"))
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))
    proc = subprocess.run([sys.executable, "-c", BLOCK_CUPY, "--network", "resnet50", "--batch", "1"],
                          capture_output=True, text=True, env=env, cwd=tmp_path)
    assert proc.returncode == 1, proc.stderr
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and "error:" in lines[0] and "no table written" in lines[0], proc.stderr
    assert "Traceback" not in proc.stderr
    assert not (tmp_path / "cache").exists() or not any((tmp_path / "cache").iterdir())


def test_direct_tuner_that_measured_nothing_exits_1_and_writes_no_file(tmp_path, monkeypatch, capsys):
    """Every config fails (here: no CuPy to prepare the inputs): exit 1, no table."""
    monkeypatch.setattr("megawino.gpu.call_checks.require_gpu", lambda: None)
    monkeypatch.setattr(direct_tuner, "_prepare", lambda spec: (_ for _ in ()).throw(RuntimeError("no GPU")))
    out = tmp_path / "direct_h100.json"
    with pytest.raises(SystemExit) as exc:
        direct_tuner.main(["--network", "resnet50", "--batch", "1", "--top", "2", "--out", str(out)])
    assert exc.value.code == 1
    assert "measured nothing" in capsys.readouterr().err
    assert list(tmp_path.iterdir()) == []


def test_tune_layers_writes_nothing_when_nothing_was_measured(tmp_path):
    out = tmp_path / "direct.json"

    def failing(spec, cfg):
        raise RuntimeError("compile failed")

    table = direct_tuner.tune_layers([POINTWISE], top=2, out=out, measure=failing, progress=False)
    assert table["entries"] == {} and "path" not in table and not out.exists()
    table = direct_tuner.tune_layers([POINTWISE], top=2, budget_s=0, out=out,
                                     measure=lambda s, c: 1.0, progress=False)
    assert table["entries"] == {} and not out.exists()


@pytest.mark.parametrize("argv, words", [(["--batch", "0"], "--batch"), (["--budget", "-5"], "--budget"),
                                         (["--budget", "nan"], "--budget"), (["--top", "0"], "--top"),
                                         (["--batch", "1.5"], "--batch")])
def test_direct_tuner_arguments_checked_by_argparse(argv, words, monkeypatch, capsys):
    monkeypatch.setattr(direct_tuner, "tune_layers", lambda *a, **k: pytest.fail("the work started"))
    with pytest.raises(SystemExit) as exc:
        direct_tuner.main(["--network", "resnet50"] + argv)
    err = capsys.readouterr().err
    assert exc.value.code == 2 and words in err and "Traceback" not in err


def test_direct_tuner_unwritable_out_refused_before_measuring(tmp_path, monkeypatch, capsys):
    blocker = tmp_path / "file"
    blocker.write_text("x")
    calls = []
    with pytest.raises(ValueError, match="cannot write"):
        direct_tuner.tune_layers([POINTWISE], top=2, out=blocker / "direct.json",
                                 measure=lambda s, c: calls.append(c) or 1.0, progress=False)
    assert calls == []
    monkeypatch.setattr(direct_tuner, "tune_layers", lambda *a, **k: pytest.fail("the work started"))
    with pytest.raises(SystemExit) as exc:
        direct_tuner.main(["--network", "resnet50", "--out", str(blocker / "direct.json")])
    err = capsys.readouterr().err
    assert exc.value.code == 2 and "cannot write" in err and len(err.strip().splitlines()) == 1
    assert blocker.read_text() == "x"


def test_check_writable(tmp_path):
    assert user_files.check_writable(tmp_path / "new" / "t.json") == tmp_path / "new" / "t.json"
    assert list((tmp_path / "new").iterdir()) == []          # the probe file is gone
    with pytest.raises(ValueError, match="is not a regular file"):
        user_files.check_writable(tmp_path)
    os.mkfifo(tmp_path / "fifo")
    with pytest.raises(ValueError, match="is not a regular file"):
        user_files.check_writable(tmp_path / "fifo")


def test_mapping_tuner_unwritable_out_refused_before_measuring(tmp_path, monkeypatch):
    from megawino.tuning import search
    monkeypatch.setattr(search, "tune_layer", lambda *a, **k: pytest.fail("measured"))
    blocker = tmp_path / "file"
    blocker.write_text("x")
    with pytest.raises(ValueError, match="cannot write"):
        search.tune([LayerSpec(2, 16, 16, 12, 12)], out_path=blocker / "h100.json", budget_s=60)


def test_tables_written_through_a_symlink(tmp_path):
    target = tmp_path / "tables" / "direct.json"
    target.parent.mkdir()
    link = tmp_path / "direct.json"
    link.symlink_to(target)
    user_files.write_text_atomically(link, "{}\n")
    assert link.is_symlink() and target.read_text() == "{}\n"
