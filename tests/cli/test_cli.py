"""CPU tests of the ``megawino`` command line and the sweep logic behind it."""
from __future__ import annotations

import io
import json
import os
import pathlib
import subprocess
import sys

import numpy as np
import pytest
from rich.console import Console

from megawino import sweep
from megawino.tuning import table as tuning
from megawino.tuning import choice as tuning_choice
from megawino.gpu.nvrtc import DEFAULT_GEMM_MATH
from megawino.cli import mapping as cli_mapping
from megawino.cli import _strip_lines, main, resolve_layer
from megawino.schedule.mapping import MappingParams, build_interleaved
from megawino.core.networks import find_layer, network_layers
from megawino.core.task_sizes import build_graph, default_params
from megawino.core.tasks import TaskType
from megawino.core.winograd import direct_conv_nchw, rel_l2

REPO = pathlib.Path(__file__).resolve().parents[2]


def run(argv):
    """(exit code, stdout text as an 80-column terminal shows it)."""
    console = Console(width=80, record=True, file=io.StringIO(), color_system=None)
    code = main(argv, console=console)
    return code, console.export_text()


def assert_fits_80(text):
    long = [line for line in text.splitlines() if len(line) > 80]
    assert not long, f"lines over 80 columns: {long[:3]}"


# ---- layers -----------------------------------------------------------------

def test_layers_lists_every_conv_and_marks_winograd():
    code, text = run(["layers", "resnet50"])
    assert code == 0
    assert_fits_80(text)
    rows = {line.split()[0]: line for line in text.splitlines()
            if line.startswith("resnet50.")}
    assert set(rows) == {l.name for l in network_layers("resnet50", 64, winograd_only=False)}
    assert rows["resnet50.conv2_x"].split()[-1] == "yes"
    assert rows["resnet50.conv1"].split()[-1] == "-"
    # default batch 64: conv2_x is N64 C64 K64 56x56
    assert rows["resnet50.conv2_x"].split()[1:6] == ["3", "64", "64", "64", "56x56"]


def test_layers_winograd_filter_and_batch():
    code, text = run(["layers", "vgg16", "--winograd", "--batch", "2"])
    assert code == 0
    names = [line.split()[0] for line in text.splitlines() if line.startswith("vgg16.")]
    assert names == [l.name for l in network_layers("vgg16", 2)]
    assert len(names) == 13


def test_layers_unknown_network_exits_2(capsys):
    assert main(["layers", "resnet5"]) == 2
    err = capsys.readouterr().err
    assert "error:" in err and "resnet50" in err and "Traceback" not in err


# ---- sweep ------------------------------------------------------------------

def test_sweep_json_on_cpu(tmp_path):
    out = tmp_path / "sweep.json"
    code, text = run(["sweep", "resnet50", "--batch", "1", "--backend", "cpu",
                      "--layers", "conv3_x,resnet50.conv2_x.1x1a", "--json", str(out)])
    assert code == 0
    assert_fits_80(text)
    assert "running the CPU executor" in text and "conv3_x" in text
    data = json.loads(out.read_text())
    assert data["backend"] == "cpu" and data["batch"] == 1 and data["network"] == "resnet50"
    assert data["megawino_version"] and data["date"] and data["machine"]["numpy"] == np.__version__
    layers = {l["name"]: l for l in data["layers"]}
    assert list(layers) == ["resnet50.conv2_x.1x1a", "resnet50.conv3_x"]   # network order
    wino = layers["resnet50.conv3_x"]
    assert wino["backend"] == "cpu-executor" and wino["count"] == 3
    assert (wino["N"], wino["C"], wino["K"], wino["H"], wino["R"]) == (1, 128, 128, 28, 3)
    direct = layers["resnet50.conv2_x.1x1a"]
    assert direct["backend"] == "cpu-direct" and direct["R"] == 1
    for layer in layers.values():
        # random inputs (never zeros): the error is small but not exactly 0
        assert 0 < layer["rel_error"] < 1e-5 and layer["passed"] is True
        assert layer["time_ms"] > 0 and layer["tflops"] > 0
    assert data["total_ms"] == pytest.approx(sum(l["time_ms"] * l["count"] for l in layers.values()))


def test_sweep_error_above_threshold_exits_1(monkeypatch, capsys):
    monkeypatch.setattr(sweep, "CPU_TOLERANCE", 1e-12)
    console = Console(width=80, record=True, file=io.StringIO(), color_system="truecolor")
    code = main(["sweep", "resnet50", "--batch", "1", "--backend", "cpu", "--layers", "conv3_x"],
                console=console)
    assert code == 1
    err = capsys.readouterr().err
    assert "rel. error threshold" in err and "resnet50.conv3_x" in err
    # the failing row is drawn red
    row = next(line for line in console.export_text(styles=True).splitlines()
               if "conv3_x" in line)
    assert "\x1b[31m" in row or ";31m" in row


def test_sweep_keeps_going_after_a_broken_layer(monkeypatch, capsys):
    real = sweep.run_layer

    def flaky(layer, backend, seed, compare=None):
        if layer.name == "resnet50.conv3_x":
            raise RuntimeError("megakernel watchdog: ticket 7 waited too long")
        return real(layer, backend, seed)

    monkeypatch.setattr(sweep, "run_layer", flaky)
    result = sweep.run_sweep(sweep.select_layers("resnet50", 1, names=["conv3_x", "conv2_x.1x1a"]),
                             "cpu")
    broken, fine = result.layers[1], result.layers[0]
    assert broken.backend == "error" and "watchdog" in broken.error and broken.passed is False
    assert fine.passed is True and result.failures == [broken]
    assert result.to_dict()["layers"][1]["error"].startswith("RuntimeError")
    code, _ = run(["sweep", "resnet50", "--batch", "1", "--backend", "cpu", "--layers", "conv3_x"])
    assert code == 1 and "watchdog" in capsys.readouterr().err


def test_sweep_unknown_layer_name(capsys):
    assert main(["sweep", "resnet50", "--layers", "conv2x", "--backend", "cpu"]) == 2
    err = capsys.readouterr().err
    assert "resnet50.conv2_x" in err and "Traceback" not in err


def test_select_layers():
    default = sweep.select_layers("resnet50", 1)
    assert [l.name for l in default] == [l.name for l in network_layers("resnet50", 1)]
    everything = sweep.select_layers("resnet50", 1, all_layers=True)
    assert len(everything) == len(network_layers("resnet50", 1, winograd_only=False))
    picked = sweep.select_layers("resnet50", 1, names=["conv5_x", "resnet50.conv1", "conv5_x"])
    assert [l.name for l in picked] == ["resnet50.conv1", "resnet50.conv5_x"]


def test_direct_conv_float32_matches_reference():
    rng = np.random.default_rng(1)
    x = rng.standard_normal((2, 5, 11, 9), dtype=np.float32)
    for r, stride, pad in ((1, 2, 0), (7, 2, 3), (3, 1, 1)):
        w = rng.standard_normal((4, 5, r, r), dtype=np.float32)
        y = sweep.direct_conv_float32(x, w, stride, pad)
        ref = direct_conv_nchw(x, w, stride, pad)
        assert y.dtype == np.float32 and y.shape == ref.shape
        assert rel_l2(y, ref) < 1e-6


def test_run_layer_nhwc_matches():
    spec = find_layer("resnet50.conv5_x", 1).with_(layout="NHWC")
    result = sweep.run_layer(spec, "cpu", seed=3)
    assert result.backend == "cpu-executor" and result.passed
    assert 0 < result.rel_error < 1e-5


# ---- mapping ----------------------------------------------------------------

def test_mapping_of_a_gemm_output_graph_names_its_tasks(monkeypatch, tmp_path):
    """A layer whose table entry has GEMM_OUTPUT tasks: the CLI says so, and the DIG distance is
    measured on those tasks."""
    import dataclasses
    spec = resolve_layer("n2c32k64h16w16")
    params = dataclasses.replace(default_params(spec), fused_output=True, gemm_k_per_task=32)
    table = {"layers": {}}
    tuning.write_entry(table, spec, params, tuning.MappingParams(8, 8, 1), time_us=1.0)
    path = tmp_path / "table.json"
    path.write_text(json.dumps(table))
    monkeypatch.setenv("MEGAWINO_MAPPING", str(path))
    code, text = run(["mapping", "n2c32k64h16w16"])
    assert code == 0 and "valid" in text and "invalid" not in text
    flat = " ".join(text.split())
    assert "GEMM + output task 32 K (fused_output)" in flat and "GEMM_OUTPUT" in flat and "(DIG 8," in flat


def test_mapping_valid_and_counts():
    code, text = run(["mapping", "n2c16k16h12w12", "--dig", "4", "--dgo", "8", "--groups-per-column", "2"])
    assert code == 0
    assert run(["mapping", "n2c16k16h12w12", "--dig", "4", "--dgo", "8", "--m", "2"]) == (code, text)   # the alias
    assert_fits_80(text)
    assert "valid" in text and "invalid" not in text
    spec = resolve_layer("n2c16k16h12w12")
    graph = build_graph(spec, tuning_choice.choose_for_gpu(spec, cli_mapping._gpu(), DEFAULT_GEMM_MATH)[0])   # what the CLI ran
    lay = graph.layout
    counts = next(line for line in text.splitlines() if line.split()[:1] == [str(lay.num_filter_tasks)]
                  and len(line.split()) == 7)
    assert counts.split() == [str(v) for v in (lay.num_filter_tasks, lay.inputs_per_group,
                                               lay.gemms_per_group, lay.outputs_per_group,
                                               lay.num_groups, graph.num_tasks, lay.num_counters)]
    # small layer: one character per ticket, in ticket order
    order = build_interleaved(graph, MappingParams(4, 8, 2)).order
    letters = "".join("FIGO"[t] for t in graph.types[order])
    assert letters in text.replace("\n", "")


def test_mapping_sequential_layer_name_default_batch():
    code, text = run(["mapping", "resnet50.conv2_x", "--sequential"])
    assert code == 0
    assert_fits_80(text)
    assert "N64 C64 K64" in text and "sequential" in text and "valid" in text


@pytest.mark.parametrize("flag, value, what", [("--m", "0", "positive"), ("--groups-per-column", "0", "positive"),
                                                ("--dig", "-1", "non-negative"), ("--dgo", "-5", "non-negative")])
def test_mapping_nonsense_parameters_exit_2(capsys, flag, value, what):
    assert main(["mapping", "n2c16k16h12w12", flag, value]) == 2
    err = capsys.readouterr().err
    named = "--groups-per-column/--m" if flag in ("--m", "--groups-per-column") else flag
    assert err.startswith(f"megawino: error: argument {named}: must be a {what} integer, got {value}")
    assert "Traceback" not in err
    assert len(err.strip().splitlines()) == 1


def test_mapping_non_integer_parameter_exits_2(capsys):
    assert main(["mapping", "n2c16k16h12w12", "--dig", "1.5"]) == 2
    assert "invalid int value" in capsys.readouterr().err


def test_mapping_non_winograd_layer_exits_2(capsys):
    assert main(["mapping", "resnet50.conv1"]) == 2
    assert "3x3 stride-1" in capsys.readouterr().err


@pytest.mark.parametrize("text, expected", [("resnet50.conv2x", "resnet50.conv2_x"),
                                            ("conv2_x", "resnet50.conv2_x"),
                                            ("resnt50.conv2_x", "resnet50")])
def test_unknown_layer_suggests_close_match(capsys, text, expected):
    assert main(["mapping", text]) == 2
    err = capsys.readouterr().err
    assert "error:" in err and expected in err and "Traceback" not in err


def test_resolve_layer():
    spec = resolve_layer("resnet50.conv3_x")
    assert (spec.N, spec.C, spec.K, spec.H) == (64, 128, 128, 28)
    assert resolve_layer("resnet50.conv3_x", batch=2).N == 2
    shape = resolve_layer("n3c8k16h10w12", batch=5)
    assert (shape.N, shape.C, shape.K, shape.H, shape.W) == (5, 8, 16, 10, 12)
    with pytest.raises(ValueError, match="positive"):
        resolve_layer("n0c8k16h10")
    with pytest.raises(ValueError, match="resolution"):
        resolve_layer("n1c8k16h10", resolution=224)


def test_strip_buckets_fit_six_lines():
    types = np.array([0] * 4 + [1, 2, 2, 2] * 500 + [3] * 100)
    lines, per = _strip_lines(types, 80)
    assert per == -(-len(types) // (80 * 6)) and 1 < per
    assert len(lines) <= 6 and all(len(line) <= 80 for line in lines)
    joined = "".join(line.plain for line in lines)
    assert len(joined) == -(-len(types) // per)
    # buckets of 5: FFFFI (mixed, F majority), then I G G G ... (mixed, G majority),
    # then the pure output tail
    assert per == 5 and joined == "f" + "g" * 400 + "O" * 20
    one, per1 = _strip_lines(np.array([0, 1, 2, 3]), 80)
    assert per1 == 1 and one[0].plain == "FIGO"


# ---- timeline ---------------------------------------------------------------

def test_timeline_export_perfetto(tmp_path):
    path = tmp_path / "tmp.json"
    code, text = run(["timeline", "resnet50.conv2_x", "--dig", "64", "--dgo", "128", "--m", "4",
                      "--export", str(path)])
    assert code == 0
    assert_fits_80(text)
    assert "makespan" in text and "cost model" in text
    assert str(path) in text.replace("\n", "")
    trace = json.loads(path.read_text())
    slices = [e for e in trace["traceEvents"] if e["ph"] == "X" and e.get("cat") != "wait"]
    spec = find_layer("resnet50.conv2_x", 64)
    graph = build_graph(spec, tuning_choice.choose_for_gpu(spec, cli_mapping._gpu(), DEFAULT_GEMM_MATH)[0])   # what the CLI ran
    assert len(slices) == graph.num_tasks
    assert {e["cat"] for e in slices} == {TaskType(int(c)).name for c in np.unique(graph.types)}


def test_timeline_options_and_errors(capsys):
    code, text = run(["timeline", "n2c16k16h12w12", "--sequential", "--workers", "4",
                      "--lanes", "2", "--width", "60", "--simulate"])
    assert code == 0
    assert max(len(line) for line in text.splitlines()) <= 80
    assert "4 workers" in text
    assert main(["timeline", "n2c16k16h12w12", "--workers", "0", "--simulate"]) == 2
    assert main(["timeline", "n2c16k16h12w12", "--m", "0"]) == 2
    assert "--m: must be a positive integer" in capsys.readouterr().err


def test_timeline_measured_without_gpu(capsys, monkeypatch):
    monkeypatch.setattr(sweep, "gpu_runtime", lambda: None)
    assert main(["timeline", "n2c16k16h12w12", "--measured"]) == 2
    assert "needs a GPU" in capsys.readouterr().err


# ---- info, entry points -----------------------------------------------------

def test_info():
    code, text = run(["info"])
    assert code == 0
    assert_fits_80(text)
    for word in ("megawino", "numpy", "networkx", "rich", "cupy", "GPU", "nvcc", "Winograd GEMM", "3xtf32"):
        assert word in text
    assert np.__version__ in text


def test_info_names_the_gpus_tables_or_the_tune_command(monkeypatch):
    """On a GPU megawino has a table for, info names it; on one it has never been measured on
    (an sm_80 GPU here), it says every layer takes the heuristic and how to tune it."""
    from megawino.gpu import identity
    monkeypatch.setattr(sweep, "gpu_status", lambda: (object(), ""))
    monkeypatch.setattr(sweep, "machine_info", lambda what: {"gpu": "test GPU"})
    monkeypatch.setattr(identity, "current_identity", lambda: identity.identity_of("NVIDIA H200", "90", sms=132))
    squeeze = lambda text: "".join(text.split())   # noqa: E731  (rich wraps long paths anywhere)
    code, text = run(["info"])
    flat = squeeze(text)
    assert code == 0 and squeeze("NVIDIA H200 (key h200, sm_90, GEMM on wgmma)") in flat
    assert squeeze("h200.json (tuned for this GPU, 18 layers); then") in flat and "4.27TB/s" in flat
    monkeypatch.setattr(identity, "current_identity", lambda: identity.identity_of("NVIDIA A100-SXM4-80GB", "80"))
    flat = squeeze(run(["info"])[1])
    assert "GEMMonmma.sync" in flat and squeeze("none: megawino has not been measured on this GPU (a100, sm_80)") in flat
    assert squeeze("Tune it: megawino tune suite --gemm-math bf16x3") in flat


def test_info_shows_cuda_defines(monkeypatch):
    monkeypatch.setenv("MEGAWINO_CUDA_DEFINES", "-DMW_GEMM_TF32X3=0")
    code, text = run(["info"])
    assert code == 0 and "-DMW_GEMM_TF32X3=0" in text


def test_python_m_megawino_help():
    env = dict(os.environ, PYTHONPATH=str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", ""),
               COLUMNS="80")
    proc = subprocess.run([sys.executable, "-m", "megawino", "--help"], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    for command in ("layers", "sweep", "mapping", "timeline", "info"):
        assert command in proc.stdout
    proc = subprocess.run([sys.executable, "-m", "megawino", "mapping", "nonsense"], cwd=REPO,
                          env=env, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2 and proc.stderr.startswith("megawino: error:")
    assert len(proc.stderr.splitlines()) == 1


def test_sweep_table_marks_skipped_layers(monkeypatch):
    real = sweep.run_layer

    def no_direct(layer, backend, seed, compare=None):
        if not layer.spec.winograd_eligible:
            return sweep.LayerResult(layer.name, layer.spec, layer.count, sweep.SKIPPED_DIRECT,
                                     None, None, None)
        return real(layer, backend, seed)

    monkeypatch.setattr(sweep, "run_layer", no_direct)
    code, text = run(["sweep", "resnet50", "--batch", "1", "--backend", "cpu",
                      "--layers", "conv1,conv3_x"])
    assert code == 0                     # skipped is not failed
    assert_fits_80(text)
    row = next(line for line in text.splitlines() if line.startswith("conv1 "))
    assert "skipped" in row
    assert "skipped: direct path not built (1 layer)" in text


@pytest.mark.gpu
def test_sweep_on_gpu(tmp_path):
    out = tmp_path / "gpu.json"
    code, text = run(["sweep", "resnet50", "--batch", "2", "--backend", "gpu",
                      "--layers", "conv4_x", "--json", str(out)])
    assert code == 0, text
    layer = json.loads(out.read_text())["layers"][0]
    assert layer["backend"] == "megakernel" and 0 < layer["rel_error"] < sweep.GPU_TOLERANCE
    assert layer["tflops"] > 0 and "TFLOP/s" in text


def test_timeline_sim_needs_a_measured_run(capsys, monkeypatch):
    monkeypatch.setattr(sweep, "gpu_runtime", lambda: None)
    assert main(["timeline", "n2c16k16h12w12", "--compare-sim"]) == 2
    assert "needs a GPU" in capsys.readouterr().err
    assert main(["timeline", "n2c16k16h12w12", "--sim"]) == 2      # no abbreviation of --simulate
    assert "unrecognized arguments: --sim" in capsys.readouterr().err


def test_mapping_defaults_come_from_the_table(capsys, monkeypatch):
    monkeypatch.setattr(sweep, "gpu_runtime", lambda: None)
    code, text = run(["mapping", "resnet50.conv3_x"])
    # mapping/h100.json holds the suite layers; without a GPU the default target's tables apply
    assert code == 0 and "(defaults: tuned for this GPU: h100.json)" in " ".join(text.split())


def test_gpu_sweep_table_with_cudnn_fits_80_columns():
    from megawino.cli.sweep import sweep_table
    from megawino.core.networks import network_layers
    layers = network_layers("densenet161", 8, winograd_only=False)[-3:] + \
        network_layers("resnet50", 8)[:2]
    rows = [sweep.LayerResult(l.name, l.spec, l.count, "gpu-direct" if not l.spec.winograd_eligible
                              else "megakernel", 0.2345, 1.2e-6, 3e-6, cudnn_ms=0.0612)
            for l in layers]
    result = sweep.SweepResult(layers=rows, backend="gpu")
    console = Console(width=80, record=True, file=io.StringIO())
    console.print(sweep_table(result, "densenet161", 8, 224, compared=True))
    text = console.export_text()
    assert_fits_80(text)
    assert "direct " in text and "mega " in text and "gpu-direc" not in text
