"""What a new user meets in the first hour on a CPU-only machine (issue 17): no CuPy needed,
one-line CLI errors, refused oversize runs, output paths checked first, legends, ASCII."""
from __future__ import annotations

import io
import json
import os
import pathlib
import re
import shlex
import subprocess
import sys
import textwrap

import numpy as np
import pytest
from rich.console import Console

import megawino
from megawino.cpu import executor
from megawino.sweep import cpu as sweep_cpu
from megawino.cli import main
from megawino.core.spec import LayerSpec
from megawino.core.winograd import direct_conv_nchw, rel_l2

REPO = pathlib.Path(__file__).resolve().parents[2]

# A sys.meta_path finder that makes `import cupy` (and its helper packages) fail as on a
# machine where CuPy is not installed, whether or not it is installed here.
BLOCK_CUPY = textwrap.dedent("""
    import sys
    class _NoCupy:
        def find_spec(self, name, path=None, target=None):
            if name.split(".")[0] in ("cupy", "cupyx", "cupy_backends"):
                raise ImportError(f"No module named {name!r}", name=name)
            return None
    sys.meta_path.insert(0, _NoCupy())
""")


def _env(**extra) -> dict:
    env = dict(os.environ, COLUMNS="80", **extra)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))
    return env


def megawino_cli(*argv, env=None, timeout=120):
    """The command line in a fresh process: (exit code, stdout, stderr)."""
    proc = subprocess.run([sys.executable, "-m", "megawino", *argv], cwd=REPO, env=env or _env(),
                          capture_output=True, text=True, timeout=timeout)
    return proc.returncode, proc.stdout, proc.stderr


def assert_one_line_error(code: int, err: str, *words: str) -> None:
    assert code != 0
    lines = [line for line in err.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("megawino: error: "), err[-2000:]
    assert "Traceback" not in err
    for word in words:
        assert word in lines[0], (word, lines[0])


# ---- CuPy absent --------------------------------------------------------------

def test_cpu_paths_work_without_cupy(tmp_path):
    """import, the lazy exports, conv2d_cpu and every CPU command run with CuPy missing."""
    out = tmp_path / "sweep.json"
    script = BLOCK_CUPY + textwrap.dedent(f"""
        import numpy as np
        import megawino
        from megawino.cli import main
        from megawino.core.winograd import direct_conv_nchw, rel_l2
        assert megawino.gpu_available() is False
        rng = np.random.default_rng(5)
        x = rng.standard_normal((2, 6, 11, 9), dtype=np.float32)
        w = rng.standard_normal((5, 6, 3, 3), dtype=np.float32)
        err = rel_l2(megawino.conv2d_cpu(x, w), direct_conv_nchw(x, w, 1, 1))
        assert 0 < err < 1e-5, err
        codes = [main(["layers", "resnet50"]),
                 main(["mapping", "n2c16k16h12w12"]),
                 main(["timeline", "n2c16k16h12w12", "--simulate", "--width", "80"]),
                 main(["sweep", "resnet50", "--batch", "1", "--layers", "conv5_x,conv1",
                       "--json", {str(out)!r}]),
                 main(["info"])]
        assert codes == [0, 0, 0, 0, 0], codes
        assert not [m for m in sys.modules if m.split(".")[0] in ("cupy", "cupyx")]
        print("ok")
    """)
    proc = subprocess.run([sys.executable, "-c", script], cwd=tmp_path, env=_env(),
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0 and proc.stdout.rstrip().endswith("ok"), proc.stderr[-3000:]
    assert "no GPU found: running the CPU executor" in proc.stdout
    assert "CuPy is not installed" in proc.stdout or "not installed" in proc.stdout   # info
    layers = json.loads(out.read_text())["layers"]
    assert [l["backend"] for l in layers] == ["cpu-direct", "cpu-executor"]
    assert all(l["passed"] for l in layers)


def test_pyproject_keeps_cupy_in_the_gpu_extra():
    tomllib = pytest.importorskip("tomllib")
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    assert not [d for d in project["dependencies"] if "cupy" in d.lower()]
    assert sorted(project["dependencies"]) == ["networkx", "numpy>=2", "rich", "threadpoolctl>=3"]
    extras = project["optional-dependencies"]
    assert extras["gpu"] == ["cupy-cuda13x[ctk]>=14"]
    assert extras["torch"] == ["torch>=2.4,<2.15"]     # custom_op needs 2.4; the newest tested
    assert "hypothesis" in extras["test"]
    assert project["dynamic"] == ["version"] and "version" not in project
    assert project["license"] == "MIT" and (REPO / "LICENSE").read_text().startswith("MIT License")


# ---- version, exports, CPU entry point -------------------------------------------

def test_version_flag_and_lazy_exports():
    code, out, err = megawino_cli("--version")
    assert code == 0 and out.strip() == f"megawino {megawino.__version__}", err
    names = dir(megawino)
    for name in ("conv2d", "plan", "Plan", "gpu_available", "synchronize", "conv2d_cpu",
                 "LayerSpec", "parse_shape", "__version__"):
        assert name in names
    assert megawino.conv2d_cpu is executor.conv2d_cpu
    with pytest.raises(AttributeError, match="no attribute 'conv3d'"):
        megawino.conv3d    # noqa: B018


def test_conv2d_cpu_stride_and_shapes_refused():
    x = np.ones((1, 2, 8, 8), np.float32)
    w = np.ones((3, 2, 3, 3), np.float32)
    for stride in (2, 1.0, True):
        with pytest.raises(ValueError, match="stride"):
            megawino.conv2d_cpu(x, w, stride=stride)
    with pytest.raises(ValueError, match="3x3"):
        megawino.conv2d_cpu(x, np.ones((3, 2, 5, 5), np.float32), padding=2)
    with pytest.raises(ValueError, match="float32"):
        megawino.conv2d_cpu(x.astype(np.float64), w)


@pytest.mark.parametrize("layout", ["NCHW", "NHWC"])
def test_conv2d_cpu_batches_bound_its_buffers(monkeypatch, layout):
    """A budget of a few images' buffers: the layer runs in batches that each fit, with the
    output of the unbatched run."""
    spec = LayerSpec(7, 12, 10, 34, 31, layout=layout)      # 72 tiles an image
    rng = np.random.default_rng(11)
    x = rng.standard_normal(spec.input_shape, dtype=np.float32)
    w = rng.standard_normal(spec.weight_shape, dtype=np.float32)
    one_image = executor.buffer_bytes(executor._batch_layout(spec, 1, None, 4))
    budget = 2 * one_image
    seen = []
    real = executor.execute

    def spy(graph, order, xb, wb):
        seen.append((graph.layout.spec.N, executor.buffer_bytes(graph.layout)))
        return real(graph, order, xb, wb)

    monkeypatch.setattr(executor, "execute", spy)
    y = megawino.conv2d_cpu(x, w, layout=layout, memory_budget=budget)
    assert sum(n for n, _ in seen) == 7 and len(seen) >= 2
    assert all(nbytes <= budget for _, nbytes in seen)
    seen.clear()
    one_by_one = megawino.conv2d_cpu(x, w, layout=layout, memory_budget=one_image)
    assert [n for n, _ in seen] == [1] * 7
    seen.clear()
    whole = megawino.conv2d_cpu(x, w, layout=layout)
    assert [n for n, _ in seen] == [7]
    # BLAS may block batches differently, and the Winograd transforms amplify the float32
    # rounding differences that makes: equal to a small fraction of the output's scale.
    atol = 1e-5 * float(np.abs(whole).max())
    np.testing.assert_allclose(y, whole, rtol=0, atol=atol)
    np.testing.assert_allclose(one_by_one, whole, rtol=0, atol=atol)
    x_nchw = x if layout == "NCHW" else x.transpose(0, 3, 1, 2)
    y_nchw = y if layout == "NCHW" else y.transpose(0, 3, 1, 2)
    assert 0 < rel_l2(y_nchw, direct_conv_nchw(x_nchw, w, 1, 1)) < 1e-5


def test_sweep_reference_in_batches_matches_whole(monkeypatch):
    spec = LayerSpec(5, 6, 4, 9, 9)
    rng = np.random.default_rng(2)
    x = rng.standard_normal(spec.input_shape, dtype=np.float32)
    w = rng.standard_normal(spec.weight_shape, dtype=np.float32)
    y = x[:, :4, :, :] * np.float32(0.5)        # any output: compare the error only
    whole = rel_l2(y, direct_conv_nchw(x, w, 1, 1))
    monkeypatch.setattr(sweep_cpu, "REFERENCE_BUDGET", 1)     # one image per batch
    assert sweep_cpu._reference_images(spec, np.float64) == 1
    assert sweep_cpu.rel_error_cpu(y, x, w, spec) == pytest.approx(whole, rel=1e-12)


# ---- long CPU work: estimate first, --yes to go on ------------------------------

def test_large_cpu_sweep_refused_with_estimate(monkeypatch, capsys):
    """Batch 256 of VGG-16 holds over 4 GiB of inputs and outputs alone: refused on any CPU,
    before any layer runs or is timed (the work counted, not seconds), with the estimate and
    how to go on."""
    work = []
    monkeypatch.setattr(sweep_cpu, "_run_seconds", lambda spec: work.append(spec) or 1.0)
    monkeypatch.setattr("megawino.sweep.run_layer_cpu", lambda *a, **k: work.append("layer") or pytest.fail("ran"))
    console = Console(width=100, record=True, file=io.StringIO(), color_system=None)
    code = main(["sweep", "vgg16", "--batch", "256", "--backend", "cpu"], console=console)
    assert_one_line_error(code, capsys.readouterr().err, "GiB", "--batch")
    out = console.export_text()
    assert "estimate on this CPU:" in out and "vgg16 sweep" not in out
    assert work == []


def test_cpu_sweep_estimate_and_yes(monkeypatch, capsys):
    monkeypatch.setattr(sweep_cpu, "QUICK_FLOPS", 0.0)      # time even a small sweep
    monkeypatch.setattr(sweep_cpu, "CONFIRM_SECONDS", 1e-9)
    argv = ["sweep", "resnet50", "--batch", "2", "--layers", "conv4_x", "--backend", "cpu"]
    console = Console(width=80, record=True, file=io.StringIO(), color_system=None)
    assert main(argv, console=console) == 2
    err = capsys.readouterr().err
    assert "rerun with --yes" in err and "--batch 1 " not in err     # batch 1 is still "large"
    assert main(argv + ["--yes"], console=console) == 0
    assert "resnet50 sweep" in console.export_text()


def test_estimate_scales_with_the_batch():
    from megawino.core.networks import find_layer
    small = sweep_cpu.layer_peak_bytes(find_layer("vgg16.conv1_2", 8))
    large = sweep_cpu.layer_peak_bytes(find_layer("vgg16.conv1_2", 64))
    assert small < large < 4 << 30
    estimate = sweep_cpu.CpuEstimate(600.0, large)
    assert estimate.large and sweep_cpu.smaller_batch([find_layer("vgg16.conv1_2", 64)], estimate) == 4


# ---- one-line errors ---------------------------------------------------------------

@pytest.mark.parametrize("argv, words", [
    (["mapping", "n100000c100000k100000h100000w100000"], ["tasks", "at most 1,000,000"]),
    (["timeline", "n100000c100000k100000h100000w100000"], ["tasks"]),
    (["mapping", "n1c1k1h100000w100000"], ["tasks"]),
    (["sweep", "vgg16", "--resolution", "100000", "--backend", "cpu"], ["GiB", "more than"]),
    (["sweep", "resnet50", "--seed", "-1"], ["--seed", "non-negative"]),
    (["mapping", "n64c64k64h56w56n32"], ["'n' twice"]),
    (["sweep", "resnet50", "--batch", "two"], ["--batch", "invalid int"]),
    (["timeline", "n2c16k16h12w12", "--sim"], ["unrecognized arguments: --sim"]),
])
def test_cli_failures_are_one_line(argv, words):
    code, _, err = megawino_cli(*argv)
    assert code == 2
    assert_one_line_error(code, err, *words)


def test_malformed_mapping_table_is_one_line(tmp_path):
    table = tmp_path / "broken.json"
    table.write_text(json.dumps({"layers": {"n2c16k16h12w12": {"name": "x"}}}))
    code, _, err = megawino_cli("mapping", "n2c16k16h12w12", env=_env(MEGAWINO_MAPPING=str(table)))
    assert_one_line_error(code, err)


@pytest.mark.parametrize("make_path", [
    lambda tmp: str(tmp),                                 # a directory
    lambda tmp: str(tmp / "missing" / "out.json"),        # a missing parent directory
    lambda tmp: "/proc/megawino-out.json",                # a place no file can be made
])
def test_output_paths_checked_before_the_work(tmp_path, make_path):
    path = make_path(tmp_path)
    for argv in (["sweep", "vgg16", "--batch", "64", "--backend", "cpu", "--yes", "--json", path],
                 ["timeline", "resnet50.conv2_x", "--simulate", "--export", path]):
        code, out, err = megawino_cli(*argv)
        assert code == 2 and "estimate" not in out        # refused before the sweep's estimate
        assert_one_line_error(code, err, "--json" if "--json" in argv else "--export")


def test_output_file_replaced_only_when_done(tmp_path, monkeypatch):
    target = tmp_path / "trace.json"
    target.write_text("old")
    from megawino.cli import timeline as cli_timeline

    def broken(*args, **kwargs):
        raise RuntimeError("simulator broke")

    monkeypatch.setattr(cli_timeline, "_build_mapping", broken)
    assert main(["timeline", "n2c16k16h12w12", "--simulate", "--export", str(target)]) == 3
    assert target.read_text() == "old" and sorted(p.name for p in tmp_path.iterdir()) == ["trace.json"]


def test_unexpected_errors_one_line_and_debug(monkeypatch, capsys):
    def broken(*args, **kwargs):
        raise RuntimeError("something\nbroke")

    monkeypatch.setattr("megawino.core.networks.network_layers", broken)
    assert main(["layers", "vgg16"]) == 3
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "unexpected RuntimeError: something broke" in err
    assert "rerun with --debug" in err
    with pytest.raises(RuntimeError, match="broke"):
        main(["--debug", "layers", "vgg16"])
    with pytest.raises(RuntimeError, match="broke"):
        main(["layers", "vgg16", "--debug"])
    for exc, code, text in ((MemoryError(), 2, "out of memory"), (KeyboardInterrupt(), 130, "interrupted"),
                            (PermissionError(13, "Permission denied", "/x.json"), 2,
                             "Permission denied: /x.json")):
        def raising(*args, exc=exc, **kwargs):
            raise exc
        monkeypatch.setattr("megawino.core.networks.network_layers", raising)
        assert main(["layers", "vgg16"]) == code
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and text in err


# ---- words a newcomer can read ------------------------------------------------------

def test_mapping_and_timeline_explain_themselves():
    console = Console(width=80, record=True, file=io.StringIO(), color_system=None)
    assert main(["mapping", "resnet50.conv2_x"], console=console) == 0
    text = " ".join(console.export_text().split())
    for words in ("N_F: filter-transform tasks", "S_I, S_G, S_O", "NG: task groups",
                  "(DIG d, n below)", "relaxed placements: tasks the builder placed below"):
        assert words in text
    console = Console(width=80, record=True, file=io.StringIO(), color_system=None)
    assert main(["timeline", "n2c16k16h12w12", "--simulate"], console=console) == 0
    text = " ".join(console.export_text().split())
    assert "roofline cost model of an H100 SXM (132 SMs x 2 resident blocks" in text
    assert "simulated wait: from claiming a ticket" in text and "1.00 us" in text


@pytest.mark.parametrize("argv", [
    ["timeline", "n2c16k16h12w12", "--simulate"],
    ["sweep", "resnet50", "--batch", "1", "--layers", "conv5_x", "--backend", "cpu"],
    ["mapping", "n2c16k16h12w12"],
])
def test_console_without_utf8_gets_ascii(argv):
    proc = subprocess.run([sys.executable, "-m", "megawino", *argv], cwd=REPO,
                          env=_env(PYTHONIOENCODING="cp1252"), capture_output=True, timeout=120)
    assert proc.returncode == 0, proc.stderr.decode("cp1252", "replace")[-2000:]
    text = proc.stdout.decode("cp1252")
    assert "Traceback" not in text and len(text.splitlines()) > 5
    assert all(ch not in text for ch in "→—█▁·")
    if argv[0] == "sweep":
        assert "C->K" in text


def test_suite_ships_with_the_package(tmp_path):
    """The suite loads from a directory with no shared/ beside it (and matches shared/'s
    copy where there is one)."""
    code = ("from megawino.core.suite import load_suite, suite_path; "
            "print(len(load_suite()), len(load_suite(suite='direct')), suite_path())")
    env = _env()
    env.pop("MEGAWINO_SUITE", None)
    proc = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, env=env, capture_output=True,
                          text=True, timeout=60)
    assert proc.returncode == 0 and proc.stdout.split()[:2] == ["18", "10"], proc.stderr
    assert pathlib.Path(proc.stdout.split()[2]) == REPO / "megawino" / "data" / "suite_layers.json"
    shared = REPO.parent / "shared" / "suite" / "layers.json"
    if shared.is_file():
        shipped = REPO / "megawino" / "data" / "suite_layers.json"
        assert json.loads(shipped.read_text()) == json.loads(shared.read_text())


def test_output_file_written_whole_with_the_usual_mode(tmp_path):
    from megawino.cli.common import OutputFile
    target = tmp_path / "result.json"
    output = OutputFile(str(target), "--json")
    assert not target.exists()                       # nothing there until the work is done
    output.write_text('{"ok": 1}\n')
    umask = os.umask(0)
    os.umask(umask)
    assert json.loads(target.read_text()) == {"ok": 1}
    assert target.stat().st_mode & 0o777 == 0o666 & ~umask
    assert [p.name for p in tmp_path.iterdir()] == ["result.json"]


# ---- README.md's commands, as written ---------------------------------------------

README = REPO / "README.md"


def _readme_blocks(language: str) -> list[str]:
    return re.findall(rf"```{language}\n(.*?)```", README.read_text(), re.S)


def _readme_commands() -> list[str]:
    """The command lines of README.md's bash blocks, comments dropped."""
    return [line.split("  #")[0].strip() for block in _readme_blocks("bash")
            for line in block.splitlines() if line.strip() and not line.startswith("#")]


def _on_gpu(code: str) -> bool:
    return "cupy" in code or "cuda" in code


# The README's commands that a test cannot run in place: installing (.ci/run does, see below) and
# the test suite itself.
NOT_RUN_HERE = ("pip install", "python3 -m pytest")


def _megawino_command(line: str) -> str:
    """The line with ``megawino`` as installed beside this Python (or ``python -m megawino``)."""
    script = pathlib.Path(sys.executable).with_name("megawino")
    exe = shlex.quote(str(script)) if script.exists() else f"{shlex.quote(sys.executable)} -m megawino"
    return re.sub(r"^megawino\b", exe, line)


def test_readme_is_short_and_has_its_commands():
    assert len(README.read_text().splitlines()) < 250
    commands = _readme_commands()
    assert [c for c in commands if c.startswith("megawino ")], commands
    assert not [c for c in commands if not c.startswith(("megawino ",) + NOT_RUN_HERE)], \
        "a README command no test runs"


@pytest.mark.parametrize("command", [c for c in _readme_commands() if c.startswith("megawino ")])
def test_readme_cpu_command_runs_as_written(command, tmp_path):
    """Each CLI line of README.md, on a CPU (GPU hidden), in a fresh folder: exit 0, and the
    files it names are written."""
    proc = subprocess.run(["bash", "-c", _megawino_command(command)], cwd=tmp_path, capture_output=True,
                          text=True, timeout=600, env=_env(CUDA_VISIBLE_DEVICES=""))
    assert proc.returncode == 0, (command, proc.stdout[-2000:], proc.stderr[-2000:])
    for name in re.findall(r"--(?:json|export) (\S+)", command):
        assert (tmp_path / name).stat().st_size > 0, name
    if "--json" in command:
        layers = json.loads((tmp_path / re.search(r"--json (\S+)", command).group(1)).read_text())["layers"]
        assert layers and all(layer["passed"] for layer in layers)


@pytest.mark.parametrize("code", [c for c in _readme_blocks("python") if not _on_gpu(c)])
def test_readme_cpu_python_runs_as_written(code, tmp_path):
    if "torch" in code:
        pytest.importorskip("torch")
    proc = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, capture_output=True, text=True,
                          timeout=600, env=_env(CUDA_VISIBLE_DEVICES=""))
    assert proc.returncode == 0, proc.stderr[-3000:]
    last = proc.stdout.strip().splitlines()[-1]
    if "torch" in code:        # the converted model's relative error against PyTorch's own
        assert 0 < float(last) < 1e-5, last
    else:
        assert last == "(2, 64, 28, 28)", last


def test_readme_python_blocks_are_cpu_or_gpu():
    blocks = _readme_blocks("python")
    assert len([b for b in blocks if not _on_gpu(b)]) >= 2 and [b for b in blocks if _on_gpu(b)]


def test_ci_runs_the_readmes_install_and_test_commands():
    """.ci/run installs the README's CPU recipe and runs its test command."""
    ci = (REPO / ".ci" / "run").read_text()
    commands = _readme_commands()
    test_command = next(c for c in commands if c.startswith("python3 -m pytest"))
    assert test_command in ci
    torch_line = next(c for c in commands if "torch==" in c)
    for part in torch_line.split("&&"):
        args = part.strip().removeprefix("pip install ").strip()
        assert f"pip_install {args}" in ci, args
