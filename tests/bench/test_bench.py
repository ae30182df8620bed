"""CPU tests of bench/common.py and bench/compare.py: the pure helpers, argparse,
the summary and table builders, the JSON writer, the no-GPU path of main() and
the ctypes cuDNN wrapper against a fake libcudnn built with the C compiler."""
from __future__ import annotations

import ctypes
import json
import math
import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

BENCH = Path(__file__).resolve().parents[2] / "bench"
sys.path.insert(0, str(BENCH))

import common  # noqa: E402
import compare  # noqa: E402
from megawino.core.spec import LayerSpec  # noqa: E402
from megawino.core.task_sizes import default_params  # noqa: E402
from megawino.core.tasks import Layout  # noqa: E402

MiB = 1 << 20


# ---- statistics --------------------------------------------------------------

def test_median_geomean_ratio_tflops():
    assert common.median([3, 1, 2]) == 2
    assert common.median([4, 1, 2, 3]) == 2.5
    assert common.median([1, None, float("nan"), 5, "x"]) == 3
    assert common.median([]) is None
    assert common.geomean([1, 4]) == pytest.approx(2.0)
    assert common.geomean([2, None, 0, -1, float("inf"), 8]) == pytest.approx(4.0)
    assert common.geomean([None]) is None
    assert common.ratio(6, 3) == 2.0
    assert common.ratio(None, 3) is None and common.ratio(3, 0) is None
    assert common.ratio(float("nan"), 1) is None and common.ratio(True, 1) is None
    assert common.tflops(2e12, 1e6) == pytest.approx(2.0)      # 2 TFLOP in 1 s
    assert common.tflops(1e9, None) is None


def test_rotation_sets():
    l2 = 50 * MiB
    assert common.rotation_sets(10 * MiB, l2) == 15                   # ceil(150 / 10)
    assert common.rotation_sets(7 * MiB, l2) == 22                    # ceil(150 / 7)
    assert common.rotation_sets(822 * MiB, l2) == 2                   # never fewer than 2
    assert common.rotation_sets(822 * MiB, l2, min_sets=1) == 1
    assert common.rotation_sets(1024, l2) == 64                       # capped
    assert common.rotation_sets(1024, l2, max_sets=1000) == 1000
    assert common.rotation_sets(10 * MiB, l2, budget_bytes=40 * MiB) == 4
    assert common.rotation_sets(10 * MiB, l2, budget_bytes=5 * MiB) == 2   # min wins
    assert common.rotation_sets(10 * MiB, l2, factor=1) == 5
    with pytest.raises(ValueError):
        common.rotation_sets(0, l2)


def test_rotation_sets_cover_the_suite():
    """Every suite layer at batch 64: the sets together exceed 3x the L2 or number 64."""
    from megawino.core.suite import load_suite
    specs = load_suite(suite="winograd", batch=64)     # the suite ships in the package
    assert len(specs) == 18
    for spec in specs:
        nbytes = 4 * spec.N * spec.C * spec.H * spec.W
        n = common.rotation_sets(nbytes, 50 * MiB, budget_bytes=4 << 30)
        assert 2 <= n <= 64
        assert n * nbytes >= 3 * 50 * MiB or n == 64


def test_json_clean_and_short_error():
    doc = {"a": float("nan"), "b": [float("inf"), -float("inf"), 1.5, (1, 2)],
           "c": np.float32(0.5), "d": np.int64(3), 4: None, "e": True, "f": object}
    out = common.json_clean(doc)
    text = json.dumps(out, allow_nan=False)
    back = json.loads(text)
    assert back["a"] == "nan" and back["b"][:3] == ["inf", "-inf", 1.5] and back["b"][3] == [1, 2]
    assert back["c"] == 0.5 and back["d"] == 3 and back["4"] is None and back["e"] is True
    assert isinstance(back["f"], str)
    err = common.short_error(ValueError("x\n  y" + "z" * 500), limit=50)
    assert err.startswith("ValueError: x y") and len(err) == 50 and err.endswith("...")


def test_find_loaded_library(tmp_path):
    maps = tmp_path / "maps"
    maps.write_text(
        "7f00-7f01 r-xp 00000000 08:01 1 /usr/lib/libc.so.6\n"
        "7f02-7f03 r-xp 00000000 08:01 2 /site/nvidia/cudnn/lib/libcudnn_cnn.so.9\n"
        "7f04-7f05 r-xp 00000000 08:01 3 /site/nvidia/cudnn/lib/libcudnn.so.9\n"
        "7f06-7f07 rw-p 00000000 00:00 0\n")
    assert common.find_loaded_library(maps_path=str(maps)) == "/site/nvidia/cudnn/lib/libcudnn.so.9"
    maps.write_text("7f04-7f05 r-xp 00000000 08:01 3 /x/libcudnn.so.9.19.0\n")
    assert common.find_loaded_library(maps_path=str(maps)) == "/x/libcudnn.so.9.19.0"
    maps.write_text("7f04-7f05 r-xp 00000000 08:01 3 /x/libcudnn_ops.so.9\n")
    assert common.find_loaded_library(maps_path=str(maps)) is None
    assert common.find_loaded_library(maps_path=str(tmp_path / "missing")) is None


# ---- argparse and layer selection ----------------------------------------------

def test_parse_args_defaults_and_quick():
    a = compare.parse_args([])
    assert (a.suite, a.batch, a.reps, a.warmup, a.quick) == ("winograd", None, 20, 5, False)
    assert a.backends == list(compare.DEFAULT_BACKENDS) and a.layer_names is None
    assert a.legacy_algos == ["winograd_nonfused", "fft_tiling"]
    assert a.out is None          # main() writes bench/results/<gpu>/compare.json
    q = compare.parse_args(["--quick", "--suite", "direct", "--batch", "8", "--layers", "a, b,",
                            "--backends", "cudnn,ours", "--out", "x.json"])
    assert (q.reps, q.warmup, q.suite, q.batch, q.out) == (5, 2, "direct", 8, "x.json")
    assert q.layer_names == ["a", "b"] and q.backends == ["cudnn", "ours"]
    assert compare.parse_args(["--quick", "--reps", "7"]).reps == 7


@pytest.mark.parametrize("argv", [["--suite", "nope"], ["--batch", "0"], ["--reps", "0"],
                                  ["--backends", "ours,bogus"], ["--legacy-algos", "magic"]])
def test_parse_args_rejects(argv):
    with pytest.raises(SystemExit):
        compare.parse_args(argv)


def test_select_specs():
    specs = [LayerSpec(1, 8, 8, 8, 8, name=n) for n in
             ("resnet50.conv2_x", "resnet50.conv3_x", "vgg16.conv1_2", "vgg16.conv2_2", "yolov3.res1")]
    assert [s.name for s in compare.select_specs(specs, None, False)] == [s.name for s in specs]
    assert len(compare.select_specs(specs, None, True)) == 4
    got = compare.select_specs(specs, ["yolov3.res1", "conv1_2", "yolov3.res1"], True)
    assert [s.name for s in got] == ["yolov3.res1", "vgg16.conv1_2"]
    with pytest.raises(ValueError, match="matches 2"):
        compare.select_specs(specs, ["resnet50"], False)
    with pytest.raises(ValueError, match="matches 0"):
        compare.select_specs(specs, ["alexnet.conv3"], False)


# ---- derived numbers, summary, table --------------------------------------------

def _fake_layer(name, ours, nonfused, nchw, nhwc, wino, g_ours, g_cublas, err=1e-6, tf32=None):
    """A layer record; ``tf32`` = ((NCHW µs, error), (NHWC µs, error)) adds the TF32 columns
    (None: a record of a run before they existed)."""
    spec = LayerSpec(64, 64, 64, 56, 56, name=name)
    rec = compare.layer_record(spec, Layout(spec, default_params(spec)))
    ok = lambda us, **kw: {"status": "ok", "median_us": us, **kw} if us else {"status": "n/a: boom"}  # noqa: E731
    rec["backends"] = {"megakernel": ok(ours, rel_err_vs_cudnn=err), "nonfused": ok(nonfused),
                       "cudnn_nchw": ok(nchw), "cudnn_nhwc": ok(nhwc),
                       "cudnn_legacy_winograd_nonfused": ok(wino),
                       "gemm_ours": ok(g_ours), "gemm_cublas": ok(g_cublas)}
    for suffix, (us, tf32_err) in zip(("nchw", "nhwc"), tf32 or ()):
        rec["backends"][f"cudnn_tf32_{suffix}"] = ok(us, rel_err_vs_cudnn=tf32_err)
    return rec


def test_layer_record_and_derive():
    rec = _fake_layer("l1", 100.0, 150.0, 300.0, 200.0, 120.0, 50.0, 40.0)
    g = rec["gemm"]
    assert g["alpha2"] == 36 and g["tiles"] == 64 * 14 * 14 and g["tiles_padded"] >= g["tiles"]
    assert g["flops"] == 2 * 36 * g["tiles_padded"] * g["c_stride"] * g["k_stride"]
    d = compare.derive(rec, "megakernel")
    assert d["cudnn_best_us"] == 200.0 and d["cudnn_best_from"] == "cudnn_nhwc"
    assert d["cudnn_best_any_us"] == 120.0 and d["cudnn_best_any_from"] == "cudnn_legacy_winograd_nonfused"
    assert d["ratio_cudnn_best_over_ours"] == pytest.approx(2.0)
    assert d["ratio_cudnn_best_any_over_ours"] == pytest.approx(1.2)
    assert d["ratio_nonfused_over_ours"] == pytest.approx(1.5)
    assert d["tflops_ours"] == pytest.approx(rec["direct_flops"] / 100e-6 / 1e12)
    assert d["gemm_efficiency_vs_cublas"] == pytest.approx(0.8)
    assert d["gemm_tflops_ours"] / d["gemm_tflops_cublas"] == pytest.approx(0.8)
    assert d["cudnn_tf32_us"] is None and d["ratio_cudnn_tf32_over_ours"] is None   # no TF32 columns
    assert d["cudnn_tf32_from"] is None and d["cudnn_tf32_rel_err"] is None
    # the TF32 ratio: the faster layout's time (and its error) over ours; TF32 does not enter "best fp32"
    rec = _fake_layer("l1", 100.0, 150.0, 300.0, 200.0, 120.0, 50.0, 40.0, tf32=((80.0, 4e-4), (60.0, 5e-4)))
    d = compare.derive(rec, "megakernel")
    assert d["cudnn_tf32_us"] == 60.0 and d["cudnn_tf32_from"] == "cudnn_tf32_nhwc"
    assert d["ratio_cudnn_tf32_over_ours"] == pytest.approx(0.6) and d["cudnn_tf32_rel_err"] == 5e-4
    assert d["cudnn_best_us"] == 200.0 and d["cudnn_best_any_us"] == 120.0
    rec = _fake_layer("l1", 100.0, 150.0, 300.0, 200.0, 120.0, 50.0, 40.0, tf32=((250.0, 4e-4), (None, None)))
    d = compare.derive(rec, "megakernel")     # the failed NHWC column does not count
    assert d["cudnn_tf32_from"] == "cudnn_tf32_nchw" and d["ratio_cudnn_tf32_over_ours"] == pytest.approx(2.5)
    assert d["cudnn_tf32_rel_err"] == 4e-4
    # a column that failed does not count
    bad = _fake_layer("l2", None, 150.0, None, None, None, None, 40.0)
    d = compare.derive(bad, "megakernel")
    assert d["ours_us"] is None and d["cudnn_best_us"] is None and d["ratio_nonfused_over_ours"] is None
    assert d["gemm_efficiency_vs_cublas"] is None and d["gemm_tflops_cublas"] is not None


def test_build_summary():
    layers = [_fake_layer("a", 100.0, 150.0, 300.0, 200.0, 120.0, 50.0, 40.0),
              _fake_layer("b", 100.0, 80.0, 50.0, 60.0, 400.0, 10.0, 10.0, err=float("nan")),
              _fake_layer("c", None, 80.0, 50.0, 60.0, None, None, 10.0, err=None),
              _fake_layer("d", 100.0, 120.0, 800.0, 900.0, 200.0, 20.0, 30.0, err=5e-3)]
    for l in layers:
        l["derived"] = compare.derive(l, "megakernel")
    s = compare.build_summary(layers, "megakernel", tol=1e-4)
    assert s["layers"] == 4 and s["layers_timed"] == 3
    assert s["megakernel_beats_nonfused"] == {"count": 2, "of": 3, "layers": ["a", "d"]}
    assert s["geomean_cudnn_best_over_megakernel"] == pytest.approx((2.0 * 0.5 * 8.0) ** (1 / 3))
    assert s["geomean_cudnn_best_any_over_megakernel"] == pytest.approx((1.2 * 0.5 * 2.0) ** (1 / 3))
    assert s["median_gemm_efficiency_vs_cublas"] == pytest.approx(1.0)   # median of 0.8, 1.0, 1.5
    assert s["max_rel_err_vs_cudnn"] == pytest.approx(5e-3)
    assert s["layers_over_tolerance"] == ["b", "d"]
    assert s["not_ok_counts"] == {"megakernel": 1, "cudnn_legacy_winograd_nonfused": 1, "gemm_ours": 1}
    json.dumps(common.json_clean(s), allow_nan=False)
    assert s["geomean_cudnn_tf32_over_megakernel"] is None and s["max_cudnn_tf32_rel_err"] is None
    assert s["megakernel_beats_cudnn_tf32"] == {"count": 0, "of": 0}
    empty = compare.build_summary([], "direct")
    assert empty["layers"] == 0 and empty["geomean_cudnn_best_over_direct"] is None


def test_build_summary_tf32_columns():
    """The ratio to PyTorch's TF32 default: geomean over the layers that have it, how many
    layers megawino wins, and TF32's largest error; a layer from an older run (no TF32
    columns) or with ours failed is left out."""
    layers = [_fake_layer("a", 100.0, 150.0, 300.0, 200.0, 120.0, 50.0, 40.0, tf32=((50.0, 4e-4), (40.0, 6e-4))),
              _fake_layer("b", 100.0, 80.0, 50.0, 60.0, 400.0, 10.0, 10.0, tf32=((300.0, 7e-4), (None, None))),
              _fake_layer("c", 200.0, 150.0, 300.0, 200.0, 120.0, 50.0, 40.0, tf32=((90.0, 5e-4), (110.0, 9e-4))),
              _fake_layer("d", 100.0, 120.0, 800.0, 900.0, 200.0, 20.0, 30.0),
              _fake_layer("e", None, 120.0, 800.0, 900.0, 200.0, 20.0, 30.0, tf32=((70.0, 8e-4), (75.0, 8e-4)))]
    s = compare.build_summary(layers, "megakernel")
    assert s["geomean_cudnn_tf32_over_megakernel"] == pytest.approx((0.4 * 3.0 * 0.45) ** (1 / 3))
    assert s["megakernel_beats_cudnn_tf32"] == {"count": 1, "of": 3}
    assert s["max_cudnn_tf32_rel_err"] == pytest.approx(8e-4)      # layer e's, ours failed there
    rows = compare.table_rows(layers, "megakernel")
    tf32_ms, tf32_ratio, tf32_err = (compare.TABLE_COLUMNS.index(c) for c in ("TF32 ms", "tf32/ours", "TF32 err"))
    assert [r[tf32_ratio] for r in rows[:5]] == ["0.40", "3.00", "0.45", "n/a", "n/a"]
    assert [r[tf32_ms] for r in rows[:5]] == ["0.040", "0.300", "0.090", "n/a", "0.070"]
    assert [r[tf32_err] for r in rows[:5]] == ["6.0e-04", "7.0e-04", "5.0e-04", "n/a", "8.0e-04"]
    assert rows[-1][tf32_ratio] == f"{(0.4 * 3.0 * 0.45) ** (1 / 3):.2f}"
    json.dumps(common.json_clean(s), allow_nan=False)


def _three_tf32_layers():
    return [_fake_layer("a", 100.0, 150.0, 300.0, 200.0, 120.0, 50.0, 40.0, tf32=((50.0, 4e-4), (40.0, 6e-4))),
            _fake_layer("b", 100.0, 80.0, 50.0, 60.0, 400.0, 10.0, 10.0, tf32=((90.0, 7e-4), (None, None))),
            _fake_layer("c", 200.0, 150.0, 300.0, 200.0, 120.0, 50.0, 40.0, tf32=((60.0, 5e-4), (None, None)))]


def _status_column(layers, derived, summary, name):
    """The README status table of ``layers`` (with ``derived``): column ``name``'s cells, and the
    summary line under the table."""
    import readme_tables
    for layer, x in zip(layers, derived):
        layer["derived"] = x
    lines = readme_tables.status_table({"layers": layers, "summary": summary, "date": "today"}).splitlines()
    column = [c.strip() for c in lines[0].strip("|").split("|")].index(name)
    return [line.strip("|").split("|")[column].strip() for line in lines[2:2 + len(layers)]], lines[-1]


def test_prepared_weights_column():
    """The megakernel with its weight prepared once (as a converted model runs it): ratios to the
    best cuDNN fp32 algorithm and to TF32 per layer and as geomeans; absent in older records."""
    layers = _three_tf32_layers()
    layers[0]["backends"]["megakernel_prepared"] = {"status": "ok", "median_us": 80.0}
    layers[1]["backends"]["megakernel_prepared"] = {"status": "ok", "median_us": 90.0}
    layers[2]["backends"]["megakernel_prepared"] = {"status": "n/a: boom"}
    d = [compare.derive(layer, "megakernel") for layer in layers]
    assert d[0]["ours_prepared_us"] == 80.0 and d[2]["ours_prepared_us"] is None
    assert d[0]["ratio_cudnn_tf32_over_ours_prepared"] == pytest.approx(0.5)
    assert d[0]["ratio_cudnn_best_any_over_ours_prepared"] == pytest.approx(1.5)
    assert d[1]["ratio_cudnn_tf32_over_ours_prepared"] == pytest.approx(1.0)
    s = compare.build_summary(layers, "megakernel")
    assert s["geomean_cudnn_tf32_over_megakernel_prepared"] == pytest.approx(0.5 ** 0.5)
    assert s["geomean_cudnn_best_any_over_megakernel_prepared"] == pytest.approx((1.5 * 50 / 90) ** 0.5)
    assert s["geomean_cudnn_tf32_over_megakernel"] == pytest.approx((0.4 * 0.9 * 0.3) ** (1 / 3))
    import readme_tables
    cells, summary_line = _status_column(layers, d, s, "×TF32, weights prepared")
    assert cells == ["0.50", "1.00", readme_tables.MISSING]
    assert "with the weights prepared once 0.71" in summary_line
    rows = compare.table_rows(layers, "megakernel")
    prep_ms, prep_ratio = (compare.TABLE_COLUMNS.index(c) for c in ("prepared ms", "tf32/prep"))
    assert [r[prep_ms] for r in rows] == ["0.080", "0.090", "n/a", f"{(80 * 90) ** 0.5 / 1e3:.3f}"]
    assert [r[prep_ratio] for r in rows] == ["0.50", "1.00", "n/a", f"{0.5 ** 0.5:.2f}"]


def test_either_layout_column():
    """The megakernel in the other layout on the same layer: the faster of the two against TF32 and
    the best cuDNN fp32 algorithm (whose columns are the faster of NCHW and NHWC too)."""
    layers = _three_tf32_layers()
    layers[0]["backends"]["megakernel_other_layout"] = {"status": "ok", "median_us": 80.0, "layout": "NHWC"}
    layers[1]["backends"]["megakernel_other_layout"] = {"status": "ok", "median_us": 120.0, "layout": "NHWC"}
    layers[2]["backends"]["megakernel_other_layout"] = {"status": "n/a: boom"}
    d = [compare.derive(layer, "megakernel") for layer in layers]
    assert [x["ours_other_layout_us"] for x in d] == [80.0, 120.0, None]
    assert [x["ours_either_layout_us"] for x in d] == [80.0, 100.0, 200.0]
    assert [x["ratio_cudnn_tf32_over_ours_either_layout"] for x in d] == pytest.approx([0.5, 0.9, 0.3])
    assert d[0]["ratio_cudnn_best_any_over_ours_either_layout"] == pytest.approx(1.5)
    s = compare.build_summary(layers, "megakernel")
    assert s["geomean_cudnn_tf32_over_megakernel_either_layout"] == pytest.approx((0.5 * 0.9 * 0.3) ** (1 / 3))
    assert s["geomean_cudnn_tf32_over_megakernel"] == pytest.approx((0.4 * 0.9 * 0.3) ** (1 / 3))
    cells, summary_line = _status_column(layers, d, s, "×TF32, either layout")
    assert cells == ["0.50", "0.90", "0.30"]
    assert f"in the faster of NCHW and NHWC {(0.5 * 0.9 * 0.3) ** (1 / 3):.2f}" in summary_line
    rows = compare.table_rows(layers, "megakernel")
    other_ms, either = (compare.TABLE_COLUMNS.index(c) for c in ("other layout ms", "tf32/either"))
    assert [r[other_ms] for r in rows[:3]] == ["0.080", "0.120", "n/a"]
    assert [r[either] for r in rows[:3]] == ["0.50", "0.90", "0.30"]


def test_table_rows_and_print(capsys):
    layers = [_fake_layer("a", 100.0, 150.0, 300.0, 200.0, 120.0, 50.0, 40.0),
              _fake_layer("b", None, 80.0, 50.0, 60.0, None, None, 10.0)]
    rows = compare.table_rows(layers, "megakernel")
    assert len(rows) == 3 and all(len(r) == len(compare.TABLE_COLUMNS) for r in rows)
    assert rows[0][0] == "a" and rows[0][1] == "0.100" and rows[0][3] == "0.200 (nhwc)"
    assert rows[0][7] == "2.00" and rows[0][9] == "1.50" and rows[0][12] == "0.80"
    assert rows[1][1] == "n/a" and rows[1][7] == "n/a"
    assert rows[2][0] == "geomean" and rows[2][3].startswith(f"{math.sqrt(200 * 50) / 1e3:.3f}")
    compare.print_table(layers, "megakernel", "title")
    out = capsys.readouterr().out
    assert "geomean" in out and "megakernel ms" in out


def test_write_json(tmp_path):
    path = tmp_path / "deep" / "r.json"
    compare.write_json(path, {"x": float("nan"), "y": [1.0]})
    assert json.loads(path.read_text()) == {"x": "nan", "y": [1.0]}
    assert not list(path.parent.glob("*.tmp"))


# ---- whole-script behaviour without a GPU ------------------------------------------

def test_help_and_import_without_gpu_libraries():
    """compare.py --help works, and importing it needs neither CuPy nor PyTorch."""
    r = subprocess.run([sys.executable, str(BENCH / "compare.py"), "--help"],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 0 and "--suite" in r.stdout and "--quick" in r.stdout
    code = ("import sys; sys.modules['cupy'] = None; sys.modules['torch'] = None; "
            f"sys.path.insert(0, {str(BENCH)!r}); import compare, common; print('ok')")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0 and r.stdout.strip() == "ok", r.stderr


BENCH_SCRIPTS = sorted(p.name for p in BENCH.glob("*.py") if "__main__" in p.read_text(encoding="utf-8"))


def test_the_bench_scripts_are_the_user_tools():
    assert {"compare.py", "models.py", "sanitize.py", "sim_check.py", "ab.py", "readme_tables.py"} \
        <= set(BENCH_SCRIPTS)


@pytest.mark.parametrize("script", BENCH_SCRIPTS)
def test_every_bench_script_answers_help_without_cupy(script):
    """Each bench script parses its arguments before it imports CuPy (a broken import or
    argparse setup shows here, on the CPU CI, not in a device call): the script runs as
    ``python SCRIPT --help`` would run it (its folder first on sys.path) with CuPy made
    unimportable, whether or not this machine has it."""
    path = BENCH / script
    runner = ("import runpy, sys; sys.modules['cupy'] = sys.modules['cupy_backends'] = None; "
              f"sys.path[0] = {str(path.parent)!r}; sys.argv = [{str(path)!r}, '--help']; "
              f"runpy.run_path({str(path)!r}, run_name='__main__')")
    r = subprocess.run([sys.executable, "-c", runner], capture_output=True, text=True, timeout=120,
                       env={**os.environ, "CUDA_VISIBLE_DEVICES": ""})
    assert r.returncode == 0 and "usage:" in r.stdout, r.stderr[-2000:]
    assert "Traceback" not in r.stderr, r.stderr[-2000:]


def test_main_without_gpu_writes_error_json(tmp_path, monkeypatch):
    class Broken:
        def __init__(self, *a, **k):
            raise RuntimeError("no CUDA device")
    monkeypatch.setattr(compare, "Bench", Broken)
    out = tmp_path / "r.json"
    assert compare.main(["--quick", "--out", str(out)]) == 2
    doc = json.loads(out.read_text())
    assert doc["complete"] is False and "no CUDA device" in doc["error"]


@pytest.mark.parametrize("suite, name", [("winograd", "compare.json"), ("direct", "compare-direct.json")])
def test_main_default_out_is_the_gpus_results_folder(tmp_path, monkeypatch, suite, name):
    """Without --out the latest run goes to bench/results/<gpu>/, one file per suite."""
    class Broken:
        def __init__(self, *a, **k):
            raise RuntimeError("no CUDA device")
    monkeypatch.setattr(compare, "Bench", Broken)
    monkeypatch.setattr(common, "RESULTS_DIR", tmp_path)
    from megawino.gpu import identity
    monkeypatch.setattr(identity, "device_name", lambda: "NVIDIA H200")
    assert compare.main(["--quick", "--suite", suite]) == 2
    assert json.loads((tmp_path / "h200" / name).read_text())["complete"] is False


def test_main_loop_with_fake_bench(tmp_path, monkeypatch, capsys):
    """The per-layer loop: results written after each layer, a layer that raises is
    recorded and the run goes on, summary and table at the end."""
    calls = []

    class FakeBench:
        dead = None
        environment = {"gpu": "Fake GPU"}
        settings = {"stream": 0}

        def __init__(self, args, primary):
            self.out = Path(args.out)

        def run_layer(self, spec, index):
            if calls:                       # the JSON of the previous layers is on disk
                assert len(json.loads(self.out.read_text())["layers"]) == len(calls)
            calls.append(spec.name)
            if index == 1:
                raise RuntimeError("layer exploded")
            rec = compare.layer_record(spec)
            rec["backends"] = {"megakernel": {"status": "ok", "median_us": 100.0},
                               "cudnn_nchw": {"status": "ok", "median_us": 150.0}}
            return rec

        def close(self):
            pass

    monkeypatch.setattr(compare, "Bench", FakeBench)
    out = tmp_path / "r.json"
    assert compare.main(["--quick", "--out", str(out)]) == 0
    doc = json.loads(out.read_text())
    assert doc["complete"] is True and len(doc["layers"]) == 4 == len(calls)
    assert doc["layers"][1]["error"] == "RuntimeError: layer exploded"
    assert doc["summary"]["geomean_cudnn_best_over_megakernel"] == pytest.approx(1.5)
    assert doc["settings"]["reps"] == 5 and doc["environment"]["gpu"] == "Fake GPU"
    assert "geomean" in capsys.readouterr().out


def test_entry_for_not_available():
    assert compare._entry_for(compare.NotAvailable("direct path not built")) == \
        {"status": "n/a (direct path not built)"}
    assert compare._entry_for(ValueError("bad")) == {"status": "n/a: ValueError: bad"}


# ---- ctypes cuDNN wrapper against a fake library ----------------------------------

FAKE_CUDNN = r"""
#include <stddef.h>
#ifndef WS_BYTES
#define WS_BYTES ((size_t)1 << 33)
#endif
#include <stdlib.h>
typedef struct { int a[8]; } desc_t;
static int last_math = -1, last_algo = -1; static void* last_stream = (void*)1;
size_t cudnnGetVersion(void) { return 91900; }
const char* cudnnGetErrorString(int s) { return s == 9 ? "CUDNN_STATUS_NOT_SUPPORTED" : "OTHER"; }
int cudnnCreate(void** h) { *h = malloc(8); return 0; }
int cudnnDestroy(void* h) { free(h); return 0; }
int cudnnSetStream(void* h, void* s) { last_stream = s; return 0; }
int cudnnCreateTensorDescriptor(void** d) { *d = calloc(1, sizeof(desc_t)); return 0; }
int cudnnCreateFilterDescriptor(void** d) { *d = calloc(1, sizeof(desc_t)); return 0; }
int cudnnCreateConvolutionDescriptor(void** d) { *d = calloc(1, sizeof(desc_t)); return 0; }
int cudnnDestroyTensorDescriptor(void* d) { free(d); return 0; }
int cudnnDestroyFilterDescriptor(void* d) { free(d); return 0; }
int cudnnDestroyConvolutionDescriptor(void* d) { free(d); return 0; }
int cudnnSetTensor4dDescriptor(desc_t* d, int fmt, int dt, int n, int c, int h, int w) {
  if (fmt != 0 || dt != 0) return 3;
  d->a[0] = n; d->a[1] = c; d->a[2] = h; d->a[3] = w; return 0; }
int cudnnSetFilter4dDescriptor(desc_t* d, int dt, int fmt, int k, int c, int r, int s) {
  if (fmt != 0 || dt != 0) return 3;
  d->a[0] = k; d->a[1] = c; d->a[2] = r; d->a[3] = s; return 0; }
int cudnnSetConvolution2dDescriptor(desc_t* d, int ph, int pw, int u, int v, int dh, int dw,
                                    int mode, int ct) {
  if (mode != 1 || ct != 0 || dh != 1 || dw != 1) return 3;
  d->a[0] = ph; d->a[1] = pw; d->a[2] = u; d->a[3] = v; return 0; }
int cudnnSetConvolutionMathType(desc_t* d, int m) { last_math = m; return 0; }
int cudnnGetConvolution2dForwardOutputDim(desc_t* cd, desc_t* x, desc_t* f, int* n, int* c,
                                          int* h, int* w) {
  *n = x->a[0]; *c = f->a[0];
  *h = (x->a[2] + 2 * cd->a[0] - f->a[2]) / cd->a[2] + 1;
  *w = (x->a[3] + 2 * cd->a[1] - f->a[3]) / cd->a[3] + 1; return 0; }
int cudnnGetConvolutionForwardWorkspaceSize(void* h, desc_t* x, desc_t* f, desc_t* cd, desc_t* y,
                                            int algo, size_t* ws) {
  if (algo == 6) return 9;
  *ws = WS_BYTES; return 0; }   /* default > 4 GiB: must not be truncated */
int cudnnConvolutionForward(void* h, const float* alpha, desc_t* xd, const float* x, desc_t* fd,
                            const float* w, desc_t* cd, int algo, void* ws, size_t wsb,
                            const float* beta, desc_t* yd, float* y) {
  if (wsb != WS_BYTES) return 3;
  last_algo = algo;
  y[0] = *alpha * x[0] * w[0] + *beta; y[1] = (float)last_math; y[2] = (float)algo;
  y[3] = (float)(yd->a[0] * 1000 + yd->a[1]); y[4] = (float)(yd->a[2] * 1000 + yd->a[3]);
  y[5] = ws == NULL ? -1.0f : 1.0f; y[6] = last_stream == NULL ? 0.0f : 1.0f;
  return 0; }
"""


def _build_fake_cudnn(tmp_path_factory, *defines) -> str:
    cc = shutil.which("gcc") or shutil.which("cc")
    if cc is None:
        pytest.skip("no C compiler")
    d = tmp_path_factory.mktemp("fakecudnn")
    src, lib = d / "fake.c", d / "libcudnn.so.9"
    src.write_text(FAKE_CUDNN)
    subprocess.run([cc, "-shared", "-fPIC", "-O0", *defines, "-o", str(lib), str(src)], check=True)
    return str(lib)


@pytest.fixture(scope="module")
def fake_cudnn(tmp_path_factory):
    return _build_fake_cudnn(tmp_path_factory)


@pytest.fixture(scope="module")
def fake_cudnn_small_ws(tmp_path_factory):
    return _build_fake_cudnn(tmp_path_factory, "-DWS_BYTES=((size_t)64)")


def test_cudnn_legacy_with_fake_library(fake_cudnn):
    c = common.CudnnLegacy(fake_cudnn)
    assert c.version == 91900
    spec = LayerSpec(2, 3, 5, 7, 9, padding=1)
    conv = c.conv(spec, common.CUDNN_ALGOS["winograd_nonfused"], stream_ptr=0)
    assert conv.workspace == 1 << 33
    x = np.full(8, 2.0, np.float32)
    w = np.full(8, 3.0, np.float32)
    y = np.zeros(8, np.float32)
    ptr = lambda a: a.ctypes.data  # noqa: E731
    conv.run(ptr(x), ptr(w), ptr(y), 12345)
    assert y[0] == 6.0                       # alpha 1 * 2 * 3 + beta 0: floats passed by pointer
    assert y[1] == common.CUDNN_FMA_MATH and y[2] == 7
    assert y[3] == 2 * 1000 + 5 and y[4] == 7 * 1000 + 9
    assert y[5] == 1.0 and y[6] == 0.0       # workspace pointer given; stream 0 is NULL
    conv.run(ptr(x), ptr(w), ptr(y), 0)
    assert y[5] == -1.0
    conv.close()
    with pytest.raises(common.CudnnError, match="NOT_SUPPORTED"):
        c.conv(spec, common.CUDNN_ALGOS["winograd"])
    strided = LayerSpec(1, 4, 4, 9, 9, stride=2, padding=1)
    conv = c.conv(strided, 5)
    conv.run(ptr(x), ptr(w), ptr(y), 1)
    assert y[4] == 5 * 1000 + 5
    conv.close()
    c.close()


# ---- the device side (Bench) on NumPy-backed fakes of CuPy, PyTorch and the runtime --

class _Arr(np.ndarray):
    """A NumPy array that answers ``.data.ptr`` like a CuPy array."""

    @property
    def data(self):
        import types
        return types.SimpleNamespace(ptr=self.ctypes.data)


def _fake_cupy():
    import time as _time
    import types
    cp = types.ModuleType("cupy")
    wrap = lambda a: np.asarray(a).view(_Arr)  # noqa: E731
    cp.__version__ = "fake"
    cp.float32, cp.float64, cp.uint8, cp.uint64, cp.nan = np.float32, np.float64, np.uint8, np.uint64, np.nan
    cp.ndarray = np.ndarray
    cp.full = lambda shape, v, dtype=None: wrap(np.full(shape, v, dtype=dtype))
    cp.empty = lambda shape, dtype=None: wrap(np.zeros(shape, dtype=dtype))
    cp.isnan, cp.sum = np.isnan, np.sum
    cp.asnumpy = lambda a: np.array(a)
    cp.ascontiguousarray = lambda a: wrap(np.ascontiguousarray(a))
    cp.matmul = lambda a, b, out=None: np.matmul(a, b, out=out) if out is not None else wrap(np.matmul(a, b))
    cp.from_dlpack = lambda t: wrap(t.a)

    class RandomState:
        def __init__(self, seed):
            self.rng = np.random.default_rng(seed)

        def standard_normal(self, size, dtype=float):
            return wrap(self.rng.standard_normal(size, dtype=dtype))
    cp.random = types.SimpleNamespace(RandomState=RandomState)

    class Stream:
        ptr = 0

        def synchronize(self):
            pass

        def use(self):
            pass

    class Event:
        def record(self, stream=None):
            self.t = _time.perf_counter()

        def synchronize(self):
            pass
    props = {"name": b"Fake GPU", "multiProcessorCount": 4, "l2CacheSize": 1 << 17,
             "totalGlobalMem": 1 << 34}
    cp.cuda = types.SimpleNamespace(
        runtime=types.SimpleNamespace(getDeviceProperties=lambda i: props, runtimeGetVersion=lambda: 13000,
                                      driverGetVersion=lambda: 13000, memGetInfo=lambda: (1 << 30, 1 << 34),
                                      deviceSynchronize=lambda: None),
        get_current_stream=Stream, ExternalStream=lambda p: Stream(), Event=Event,
        get_elapsed_time=lambda a, b: (b.t - a.t) * 1e3)

    def no_nvrtc(*a, **k):
        raise RuntimeError("no NVRTC here")
    cp.RawKernel = no_nvrtc
    pool = types.SimpleNamespace(free_all_blocks=lambda: None)
    cp.get_default_memory_pool = cp.get_default_pinned_memory_pool = lambda: pool
    return cp, wrap


def _round_tf32(a):
    """fp32 -> TF32, round to nearest (ties away), as Tf32x3::split in cuda/gemm_arithmetic.cuh."""
    bits = np.ascontiguousarray(a, dtype=np.float32).view(np.uint32)
    return ((bits + np.uint32(0x1000)) & np.uint32(0xFFFFE000)).view(np.float32)


def _fake_torch():
    import types
    from megawino.core.winograd import direct_conv_nchw

    class T:
        def __init__(self, a):
            self.a = np.asarray(a)

        def permute(self, *dims):
            return T(self.a.transpose(dims))

        def contiguous(self, memory_format=None):
            return T(np.ascontiguousarray(self.a))

        def data_ptr(self):
            return self.a.ctypes.data

    torch = types.ModuleType("torch")
    torch.__version__, torch.channels_last = "fake", "channels_last"
    torch.from_dlpack = T
    torch.randn = lambda *s, device=None: T(np.random.standard_normal(s).astype(np.float32))
    torch.set_float32_matmul_precision = lambda p: None

    def conv(t, w, b=None, stride=1, padding=0):
        """cuDNN's conv2d; under TF32 (torch's default, as here at start) on TF32-rounded operands."""
        tf32 = torch.backends.cudnn.conv.fp32_precision == "tf32"
        x, w = (_round_tf32(t.a), _round_tf32(w.a)) if tf32 else (t.a, w.a)
        return T(direct_conv_nchw(x, w, stride, padding).astype(np.float32))
    torch.nn = types.SimpleNamespace(functional=types.SimpleNamespace(conv2d=conv))
    torch.version = types.SimpleNamespace(cuda="13.0")
    torch.backends = types.SimpleNamespace(
        cudnn=types.SimpleNamespace(version=lambda: 91900, conv=types.SimpleNamespace(fp32_precision="tf32")),
        cuda=types.SimpleNamespace(matmul=types.SimpleNamespace(fp32_precision="none")))
    torch.cuda = types.SimpleNamespace(is_available=lambda: True, synchronize=lambda: None,
                                       empty_cache=lambda: None,
                                       current_stream=lambda: types.SimpleNamespace(cuda_stream=0))
    return torch


def _fake_runtime(wrap, broken=False):
    import types
    from megawino.core.tasks import TaskType
    from megawino.core.winograd import direct_conv_nchw

    class Plan:
        def __init__(self, spec, algo, gemm_math="3xtf32"):
            if broken:
                raise RuntimeError("NVRTC compile failed")
            assert gemm_math in ("3xtf32", "ffma")
            self.spec, self.algo = spec, algo
            self.task_layout = Layout(spec, default_params(spec))
            rng = np.random.default_rng(1)
            self.U = wrap(rng.standard_normal(self.task_layout.u_shape, dtype=np.float32))
            self.V = wrap(rng.standard_normal(self.task_layout.v_shape, dtype=np.float32))
            self.M = wrap(np.full(self.task_layout.m_shape, np.nan, np.float32))
            self.operand_format = "float32"
            self.blocks_per_sm, self.grid, self.checks = 2, 8, 0

        def __call__(self, x, w, out=None, check=True, weight_token=None):
            nhwc = self.spec.layout == "NHWC"
            y = direct_conv_nchw(x.transpose(0, 3, 1, 2) if nhwc else x, w, 1, self.spec.padding).astype(np.float32)
            y = y.transpose(0, 2, 3, 1) if nhwc else y
            out = wrap(np.empty_like(y)) if out is None else out
            out[...] = y
            self.launch_stage(TaskType.GEMM)
            return out

        def launch_stage(self, task_type, array=None):
            assert task_type == TaskType.GEMM
            np.matmul(self.V, self.U, out=self.M)

        def check(self):
            self.checks += 1

    return types.SimpleNamespace(ALGOS=("megakernel", "nonfused"), plan=lambda spec, algo, **kw: Plan(spec, algo, **kw))


@pytest.fixture
def fake_device(monkeypatch, fake_cudnn_small_ws):
    cp, wrap = _fake_cupy()
    monkeypatch.setitem(sys.modules, "cupy", cp)
    monkeypatch.setitem(sys.modules, "torch", _fake_torch())
    monkeypatch.setattr(compare, "find_loaded_library", lambda: fake_cudnn_small_ws)
    return wrap


def _bench(argv, wrap, broken=False, primary="megakernel"):
    bench = compare.Bench(compare.parse_args(argv + ["--reps", "2", "--warmup", "1"]), primary)
    bench.rt = _fake_runtime(wrap, broken)
    return bench


def test_bench_all_columns_on_fakes(fake_device):
    bench = _bench([], fake_device)
    assert bench.environment["gpu"] == "Fake GPU" and bench.cudnn is not None, bench.environment
    spec = LayerSpec(2, 8, 12, 9, 9, name="tiny")
    rec = bench.run_layer(spec, 0)
    b = rec["backends"]
    assert set(b) == {"megakernel", "megakernel_prepared", "megakernel_other_layout", "nonfused", "cudnn_nchw", "cudnn_nhwc",
                      "cudnn_tf32_nchw", "cudnn_tf32_nhwc",
                      "cudnn_legacy_winograd_nonfused", "cudnn_legacy_fft_tiling",
                      "gemm_ours", "gemm_cublas"}
    for key, entry in b.items():
        assert entry["status"] == "ok", (key, entry)
        assert entry["median_us"] > 0 and entry["reps"] == 2
    assert b["megakernel"]["layout"] == "NCHW" and b["megakernel_other_layout"]["layout"] == "NHWC"
    for key in ("megakernel", "megakernel_prepared", "megakernel_other_layout", "nonfused", "cudnn_nchw", "cudnn_nhwc"):
        assert b[key]["nan_count"] == 0 and b[key]["correct"] is True, (key, b[key])
        assert b[key]["rel_err_vs_cudnn"] < 1e-6 and b[key]["rel_err_vs_f64"] < 1e-6
    assert b["megakernel_prepared"]["bits_equal_plain"] is True and b["megakernel_prepared"]["weight_token"]
    # TF32 columns: TF32-rounded results, correct under TF32's tolerance, and TF32 off after them
    import torch
    for key in ("cudnn_tf32_nchw", "cudnn_tf32_nhwc"):
        assert b[key]["fp32_precision"] == "tf32" and b[key]["correct"] is True, (key, b[key])
        assert 1e-5 < b[key]["rel_err_vs_cudnn"] < 1e-3 and 1e-5 < b[key]["rel_err_vs_f64"] < 1e-3
    assert b["cudnn_nchw"]["fp32_precision"] == "ieee"
    assert torch.backends.cudnn.conv.fp32_precision == "ieee"
    # the fake cuDNN writes 7 numbers only: the poisoned output shows it
    assert b["cudnn_legacy_winograd_nonfused"]["nan_count"] > 0
    assert b["cudnn_legacy_winograd_nonfused"]["correct"] is False
    assert b["gemm_ours"]["rel_err_sample_vs_f64"] < 1e-6 and b["gemm_cublas"]["rel_err_sample_vs_f64"] < 1e-6
    assert b["gemm_ours"]["rotation_sets"] >= 2                # tiny L2 of the fake, small layer
    assert rec["reference"]["status"] == "ok" and rec["reference_f64"]["status"] == "ok"
    assert rec["repeat"]["status"] == "ok" and "repeat_spread" in b["megakernel"]
    assert rec["rotation_sets"] >= 2
    rec["derived"] = compare.derive(rec, "megakernel")
    assert rec["derived"]["ratio_cudnn_best_over_ours"] is not None
    assert rec["derived"]["cudnn_best_any_from"] in ("cudnn_nchw", "cudnn_nhwc")   # wrong outputs excluded
    assert rec["derived"]["gemm_efficiency_vs_cublas"] is not None
    assert rec["derived"]["ratio_cudnn_tf32_over_ours"] is not None
    assert rec["derived"]["cudnn_tf32_from"] in ("cudnn_tf32_nchw", "cudnn_tf32_nhwc")
    json.dumps(common.json_clean(rec), allow_nan=False)
    # second layer: no float64 CPU check past --f64-layers; its fp32 reference is fp32 again
    rec = bench.run_layer(spec, 2)
    assert "reference_f64" not in rec and "rel_err_vs_f64" not in rec["backends"]["megakernel"]
    assert rec["backends"]["megakernel"]["rel_err_vs_cudnn"] < 1e-6
    assert rec["backends"]["cudnn_tf32_nchw"]["rel_err_vs_cudnn"] > 1e-5
    bench.close()


def test_bench_failures_stay_in_their_column(fake_device):
    bench = _bench([], fake_device, broken=True)
    rec = bench.run_layer(LayerSpec(2, 8, 12, 9, 9, name="tiny"), 0)
    b = rec["backends"]
    for key in ("megakernel", "nonfused", "gemm_ours"):
        assert b[key]["status"].startswith("n/a: RuntimeError: NVRTC compile failed"), b[key]
    for key in ("cudnn_nchw", "cudnn_nhwc", "cudnn_legacy_fft_tiling", "gemm_cublas"):
        assert b[key]["status"] == "ok", (key, b[key])
    assert "repeat" not in rec and bench.dead is None


def test_bench_tf32_failure_turns_tf32_off(fake_device):
    """A TF32 column that raises is n/a, and the columns after it run in fp32."""
    import torch
    fp32_conv = torch.nn.functional.conv2d

    def conv(*args, **kwargs):
        if torch.backends.cudnn.conv.fp32_precision == "tf32":
            raise RuntimeError("no TF32 kernel")
        return fp32_conv(*args, **kwargs)
    torch.nn.functional.conv2d = conv
    bench = _bench([], fake_device)
    rec = bench.run_layer(LayerSpec(2, 8, 12, 9, 9, name="tiny"), 0)
    b = rec["backends"]
    assert b["cudnn_tf32_nchw"]["status"] == b["cudnn_tf32_nhwc"]["status"] == "n/a: RuntimeError: no TF32 kernel"
    assert torch.backends.cudnn.conv.fp32_precision == "ieee"
    assert b["cudnn_legacy_fft_tiling"]["status"] == "ok" and b["megakernel"]["correct"] is True
    assert compare.derive(rec, "megakernel")["ratio_cudnn_tf32_over_ours"] is None


def test_bench_lost_context_marks_the_rest(fake_device):
    bench = _bench(["--backends", "ours,cudnn"], fake_device)

    def dead():
        raise RuntimeError("cudaErrorIllegalAddress")
    import cupy
    bench.rt = _fake_runtime(fake_device, broken=True)
    cupy.cuda.runtime.deviceSynchronize = dead
    rec = bench.run_layer(LayerSpec(2, 8, 12, 9, 9, name="tiny"), 0)
    assert bench.dead and "cudaErrorIllegalAddress" in bench.dead
    assert rec["backends"]["cudnn_nchw"]["status"].startswith("n/a (CUDA context lost")
    later = bench.run_layer(LayerSpec(2, 8, 12, 9, 9, name="tiny2"), 1)
    assert later["error"].startswith("skipped: CUDA context lost")


def test_bench_direct_suite_not_built(fake_device):
    bench = _bench(["--suite", "direct"], fake_device, primary="direct")
    spec = LayerSpec(2, 8, 12, 9, 9, R=1, S=1, padding=0, stride=2, name="pointwise")
    rec = bench.run_layer(spec, 0)
    b = rec["backends"]
    assert b["direct"]["status"] == "n/a (direct path not built)"
    assert "nonfused" not in b and "gemm" not in rec
    assert b["cudnn_nchw"]["status"] == "ok" and b["cudnn_nchw"]["correct"] is True
    assert b["cudnn_legacy_winograd_nonfused"]["status"] == "n/a (Winograd needs 3x3 stride 1)"
    assert b["gemm_ours"]["status"] == b["gemm_cublas"]["status"] == "n/a (not a Winograd layer)"


def test_readme_status_table_tf32_column():
    """README's status table: the ×TF32 cell from the derived ratio, "—" where a record (or
    the committed results file, from a run before the column) lacks it."""
    import readme_tables
    layers = [_fake_layer("a", 100.0, 150.0, 300.0, 200.0, 120.0, 50.0, 40.0, tf32=((250.0, 4e-4), (230.0, 6e-4))),
              _fake_layer("b", 100.0, 80.0, 50.0, 60.0, 400.0, 10.0, 10.0)]
    for layer in layers:
        layer["derived"] = compare.derive(layer, "megakernel")
    data = {"layers": layers, "summary": compare.build_summary(layers, "megakernel"), "date": "today"}
    lines = readme_tables.status_table(data).splitlines()
    header = [c.strip() for c in lines[0].strip("|").split("|")]
    column = header.index("×TF32")
    cells = {line.split("|")[1].strip(): [c.strip() for c in line.strip("|").split("|")] for line in lines[2:4]}
    assert len(lines[1].strip("|").split("|")) == len(header) == len(cells["a"])
    assert cells["a"][column] == "2.30" and cells["b"][column] == readme_tables.MISSING
    assert "against PyTorch's TF32 default 2.30" in lines[-1] and "6.0e-04" in lines[-1]
    del data["summary"]["geomean_cudnn_tf32_over_megakernel"]        # a summary from an older run
    assert f"TF32 default {readme_tables.MISSING}" in readme_tables.status_table(data).splitlines()[-1]
    committed = json.loads((BENCH / "results" / "h100" / "compare.json").read_text())
    rows = [r for r in readme_tables.status_table(committed).splitlines()[2:] if r.startswith("| ")]
    assert len(rows) == len(committed["layers"]) == 18
    for layer, row in zip(committed["layers"], rows):
        tf32_ratio = layer["derived"].get("ratio_cudnn_tf32_over_ours")
        expected = readme_tables.MISSING if tf32_ratio is None else f"{tf32_ratio:.2f}"
        assert row.strip("|").split("|")[column].strip() == expected, row


def test_readme_models_table_graph_columns():
    """The README's models table: the CUDA-graph replays' times and ratios where a row has them,
    a dash where an older run has none, and a failed row still spans every column."""
    import readme_tables
    base = {"pytorch_fp32_ms": 4.0, "pytorch_tf32_ms": 3.0, "megawino_ms": 2.0, "speedup_vs_fp32": 2.0,
            "speedup_vs_tf32": 1.5, "rel_l2": {"pytorch_fp32": 1e-6, "pytorch_tf32": 5e-4, "megawino": 2e-6},
            "top1": {"megawino": 1.0}, "algos": {"megakernel": 3, "pytorch": 1}}
    rows = [dict(base, model="resnet50", batch=1, pytorch_fp32_graph_ms=2.0, pytorch_tf32_graph_ms=1.5,
                 megawino_graph_ms=2.5, graph_speedup_vs_fp32=0.8, graph_speedup_vs_tf32=0.6),
            dict(base, model="vgg16", batch=32),
            {"model": "yolov3", "batch": 16, "error": "boom"}]
    lines = readme_tables.models_table({"rows": rows}).splitlines()
    header = [c.strip() for c in lines[0].strip("|").split("|")]
    cells = [[c.strip() for c in line.strip("|").split("|")] for line in lines[2:]]
    assert all(len(c) == len(header) for c in cells)
    graph, fp32, tf32 = (header.index(c) for c in ("CUDA graphs: ms (fp32 / TF32 / megawino)", "graph ×fp32", "graph ×TF32"))
    assert (cells[0][graph], cells[0][fp32], cells[0][tf32]) == ("2.00 / 1.50 / 2.50", "0.800", "0.600")
    assert (cells[1][graph], cells[1][fp32], cells[1][tf32]) == (readme_tables.MISSING,) * 3
    assert cells[2][2] == "failed: boom" and cells[0][-1] == "3 of 4"


def test_warp_specialized_block_shape_choice():
    import compare_gemm
    assert compare_gemm.consumer_warpgroups(3136) == 3     # 192-row tiles: 3264 rows against 3200
    assert compare_gemm.consumer_warpgroups(256) == 2      # 384 rows against 256
    assert compare_gemm.consumer_warpgroups(64) == 2
    assert compare_gemm.TF32X3_PEAK_TFLOPS == pytest.approx(494.7 / 3)
