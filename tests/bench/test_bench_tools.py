"""CPU tests of the bench tools other than compare.py (bench/ab.py, sanitize.py, sim_check.py,
readme_tables.py, common.results_path) and of what the repository holds: bench/ is what a user
runs, and the docs name only CUDA defines the kernels have."""
from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
BENCH = REPO / "bench"
sys.path.insert(0, str(BENCH))

import ab  # noqa: E402
import common  # noqa: E402
import readme_tables  # noqa: E402
import sanitize  # noqa: E402


# ---- bench/ab.py ------------------------------------------------------------------

# A stand-in benchmark: writes compare.py's JSON shape, its layer times set by the build's
# defines, so the harness's alternation, its env and its ratio are all visible.
FAKE_BENCH = """
import json, os, sys
slow = "-DSLOW" in os.environ.get("MEGAWINO_CUDA_DEFINES", "")
layers = [{"name": n, "derived": {"ours_us": t * (1.25 if slow else 1.0)}} for n, t in (("a", 100.0), ("b", 40.0))]
with open(sys.argv[1], "a") as log:
    log.write(os.environ.get("MEGAWINO_CUDA_DEFINES", "") + "\\n")
json.dump({"layers": layers}, open(sys.argv[2], "w"))
"""


def test_ab_alternates_builds_and_reports_the_ratio(tmp_path, capsys):
    script, order = tmp_path / "fake_bench.py", tmp_path / "order.txt"
    script.write_text(FAKE_BENCH)
    out = tmp_path / "ab"
    command = f"{sys.executable} {script} {order} {{out}}"
    assert ab.main(["--b-defines=-DSLOW=1", "--rounds", "2", "--command", command, "--out", str(out)]) == 0
    assert order.read_text().splitlines() == ["", "-DSLOW=1", "", "-DSLOW=1"]      # A B A B
    doc = json.loads((out / "ab.json").read_text())
    assert doc["rows"]["a"] == {"a": 100.0, "b": 125.0, "b_over_a": 1.25}
    assert doc["rows"]["b"]["b_over_a"] == pytest.approx(1.25)
    assert doc["geomean_b_over_a"] == pytest.approx(1.25)
    assert "geomean B / A: 1.2500" in capsys.readouterr().out


def test_ab_stops_at_a_failed_run(tmp_path, capsys):
    out = tmp_path / "ab"
    command = f"{sys.executable} -c 'import sys; sys.exit(3)'"
    assert ab.main(["--b-defines=-DX", "--rounds", "1", "--command", command, "--out", str(out)]) == 1
    assert "a1 exited 3" in capsys.readouterr().err and (out / "a1.log").exists()


def test_ab_swaps_the_sources_and_puts_them_back(tmp_path, monkeypatch):
    installed, other = tmp_path / "cuda", tmp_path / "other"
    installed.mkdir(), other.mkdir()
    (installed / "k.cuh").write_text("A")
    (other / "k.cuh").write_text("B")
    (other / "extra.cu").write_text("B2")
    from megawino.core import resources
    monkeypatch.setattr(resources, "cuda_dir", lambda: installed)
    seen = tmp_path / "seen.txt"
    command = (f"{sys.executable} -c \"import pathlib; p = pathlib.Path({str(installed)!r}); "
               f"open({str(seen)!r}, 'a').write(''.join(sorted(f.read_text() for f in p.glob('*.cu*'))) + ',')\"")
    assert ab.main(["--b-sources", str(other), "--rounds", "1", "--command", command,
                    "--out", str(tmp_path / "ab")]) == 0
    assert seen.read_text() == "A,BB2,"
    assert sorted(p.name for p in installed.iterdir()) == ["k.cuh"] and (installed / "k.cuh").read_text() == "A"
    sources = ab.Sources(tmp_path / "saved")
    sources.use(str(installed))         # the installed folder itself (an editable install's cuda/): kept
    assert [p.read_text() for p in installed.iterdir()] == ["A"]


@pytest.mark.parametrize("argv, words", [
    ([], "builds A and B are the same"),
    (["--b-defines=-DX", "--rounds", "0"], "--rounds"),
    (["--b-sources", "/nonexistent"], "no .cu"),
    (["--b-defines=-DX", "--command", "true", "--", "--quick"], "exclude each other"),
    (["--b-rev", "HEAD", "--b-sources", "cuda"], "exclude each other"),
    (["--b-rev", "no-such-revision"], "not a revision"),
    (["--sass", "--command", "true"], "takes no benchmark"),
    (["--sass", "--only", "("], "--only"),
    (["--sass", "--jobs", "0"], "--jobs"),
    (["--sass", "--b-defines=-DMW_M=2"], "MW_M"),
])
def test_ab_refuses_bad_arguments(argv, words, capsys):
    with pytest.raises(SystemExit) as exc:
        ab.parse_args(argv)
    assert exc.value.code == 2 and words in capsys.readouterr().err


def test_ab_takes_a_revisions_cuda_sources(tmp_path):
    if subprocess.run(["git", "-C", str(REPO), "rev-parse", "HEAD"], capture_output=True).returncode:
        pytest.skip("not a git checkout")
    args = ab.parse_args(["--b-rev", "HEAD", "--dry-run", "--command", "true"])
    ab.sources_of_revisions(args, tmp_path)
    folder = Path(args.b_sources)
    tracked = subprocess.run(["git", "-C", str(REPO), "ls-tree", "--name-only", "HEAD", "cuda/"],
                             capture_output=True, text=True, check=True).stdout.split()
    assert sorted(p.name for p in folder.iterdir()) == sorted(Path(t).name for t in tracked)
    shown = subprocess.run(["git", "-C", str(REPO), "show", "HEAD:cuda/gemm.cuh"], capture_output=True, check=True)
    assert (folder / "gemm.cuh").read_bytes() == shown.stdout and args.a_sources is None


def test_ab_sass_lists_every_runtime_build():
    names = [name for name, _, _ in ab.sass_builds(())]
    assert len(names) == len(set(names))
    for target in ("sm_90a", "sm_80"):
        mine = [n for n in names if n.startswith(target + "-")]
        assert len([n for n in mine if "-megakernel-" in n and not n.endswith("trace")]) == 2 * 2 * 3
        assert len([n for n in mine if "-nonfused-" in n]) == 2 * 2 * 3
        assert {f"{target}-pointwise-{m}" for m in ("3xtf32", "bf16x3", "ffma")} <= set(mine)
        assert any(n.endswith("trace") for n in mine) and any("-direct-NHWC" in n for n in mine)
    options = dict((name, opts) for name, _, opts in ab.sass_builds(("-DEXTRA=1",)))
    assert {"-DEXTRA=1", "-DMW_M=2", "-DMW_NHWC=1", "-DMW_GEMM_BF16X3=1"} <= set(options["sm_80-megakernel-m2-NHWC-bf16x3"])
    assert "-DEXTRA=1" not in options["sm_80-direct-NCHW"]
    assert not any(o.startswith(("-I", "-DMW_SOURCE_HASH")) for opts in options.values() for o in opts)


@pytest.mark.skipif(shutil.which("nvcc") is None or ab.find_cuobjdump() is None, reason="needs nvcc and cuobjdump")
def test_ab_sass_tells_identical_from_changed_sources(tmp_path, capsys):
    """One build (sm_80 FFMA pointwise): a tree against its copy is identical (exit 0); against a
    copy with one constant changed, it differs (exit 1) and its diff is written."""
    from megawino.core.resources import cuda_dir
    same, changed = tmp_path / "same", tmp_path / "changed"
    shutil.copytree(cuda_dir(), same)
    shutil.copytree(cuda_dir(), changed)
    text = (changed / "pointwise.cu").read_text()
    assert text.count("pointwise_tile<64>(") == 1
    (changed / "pointwise.cu").write_text(text.replace("pointwise_tile<64>(", "pointwise_tile<128>("))
    build = "sm_80-pointwise-ffma"
    argv = ["--sass", "--only", f"^{build}$", "--a-sources", str(cuda_dir())]
    assert ab.main([*argv, "--b-sources", str(same), "--out", str(tmp_path / "ab1")]) == 0
    assert f"identical  {build}" in capsys.readouterr().out
    assert ab.main([*argv, "--b-sources", str(changed), "--out", str(tmp_path / "ab2")]) == 1
    out = capsys.readouterr().out
    assert f"differs    {build}" in out and "0 of 1 builds identical" in out
    assert "mw_pointwise_64" in (tmp_path / "ab2" / "a" / f"{build}.sass").read_text()
    assert (tmp_path / "ab2" / f"{build}.diff").read_text().count("\n+") > 0


def test_ab_default_runs_compare_and_reads_each_kind_of_result(tmp_path):
    args = ab.parse_args(["--b-defines=-DX", "--", "--layers", "vgg16.conv1_2"])
    argv = ab.run_command(args, tmp_path / "a1.json")
    assert argv[1].endswith("compare.py") and argv[2:] == ["--layers", "vgg16.conv1_2", "--out", str(tmp_path / "a1.json")]
    assert ab.run_command(ab.parse_args(["--b-defines=-DX"]), tmp_path / "x.json")[2:4] == ["--backends", "ours"]
    models = tmp_path / "m.json"
    models.write_text(json.dumps({"rows": [{"model": "resnet50", "batch": 1, "megawino_ms": 3.0},
                                           {"model": "vgg16", "batch": 1, "error": "boom"}]}))
    assert ab.times_of(models, 9.0) == {"resnet50 batch 1": 3.0}
    assert ab.times_of(tmp_path / "missing.json", 9.0) == {"wall time (s)": 9.0}


# ---- bench/sanitize.py -------------------------------------------------------------

def test_sanitize_reads_each_tools_summary():
    ok_lines = "\n".join(f"driver: ok case {i}" for i in range(len(sanitize.CASES)))
    assert sanitize.summarise_log("memcheck", ok_lines + "\n========= ERROR SUMMARY: 0 errors\n") == {
        "errors": 0, "cases_ok": len(sanitize.CASES), "cases": len(sanitize.CASES), "racecheck_summary": None}
    race = "driver: ok case 0\n========= RACECHECK SUMMARY: 2 hazards displayed (2 errors, 0 warnings)\n"
    row = sanitize.summarise_log("racecheck", race)
    assert row["errors"] == 2 and row["cases_ok"] == 1 and "2 hazards" in row["racecheck_summary"]
    assert sanitize.summarise_log("synccheck", "driver: ok case 0\n")["errors"] is None     # did not finish


def test_sanitize_without_the_sanitizer_says_so(monkeypatch, capsys):
    monkeypatch.setattr(sanitize, "find_sanitizer", lambda: None)
    assert sanitize.main([]) == 2
    assert "compute-sanitizer not found" in capsys.readouterr().err


def test_sanitize_lists_its_cases(capsys):
    assert sanitize.main(["--list"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) == len(sanitize.CASES) >= 18 and lines[0].startswith("0: ")


# ---- results files and the README's tables -----------------------------------------

def test_results_path_is_per_gpu(monkeypatch):
    from megawino.gpu import identity
    monkeypatch.setattr(identity, "device_name", lambda: "NVIDIA H100 80GB HBM3")
    assert common.results_path("models") == BENCH / "results" / "h100" / "models.json"
    monkeypatch.setattr(identity, "device_name", lambda: "")
    assert common.results_path("sanitize", ".txt") == BENCH / "results" / "cpu" / "sanitize.txt"


def test_readme_tables_rewrite_their_block_only():
    text = "intro\n<!-- readme_tables status h100 -->\nold\ntable\n<!-- /readme_tables -->\n" \
           "<!-- readme_tables models h100 -->\nkeep\n<!-- /readme_tables -->\nend\n"
    new = readme_tables.replace_in_readme(text, "status", "h200", "| new |")
    assert new == text.replace("status h100 -->\nold\ntable", "status h200 -->\n| new |")
    with pytest.raises(ValueError, match="no '<!-- readme_tables zoo GPU -->' block"):
        readme_tables.replace_in_readme(text, "zoo", "h200", "x")


def test_readme_tables_are_the_committed_results():
    """README.md's tables are exactly what bench/readme_tables.py renders from the results
    files their markers name (no figure typed by hand)."""
    readme = (REPO / "README.md").read_text()
    blocks = re.findall(r"<!-- readme_tables (\w+) (\S+) -->\n(.*?)\n<!-- /readme_tables -->", readme, re.S)
    assert {table for table, _, _ in blocks} == {"status", "zoo"}      # layers and models
    for table, gpu, text in blocks:
        file_name, render = readme_tables.RENDER[table]
        assert text == render(json.loads((BENCH / "results" / gpu / file_name).read_text())), (table, gpu)


# ---- what the repository holds ------------------------------------------------------

def _tracked(*paths: str) -> list[str]:
    proc = subprocess.run(["git", "ls-files", "--", *paths], cwd=REPO, capture_output=True, text=True)
    if proc.returncode != 0:
        pytest.skip("not a git checkout")
    return proc.stdout.splitlines()


def test_bench_holds_the_user_tools_only():
    files = [f for f in _tracked("bench") if not f.startswith("bench/results/")]
    assert files and len(files) <= 12, files
    assert not [f for f in _tracked("bench") if f.startswith("bench/experiments/")]
    folders = {Path(f).parts[2] for f in _tracked("bench/results") if len(Path(f).parts) > 3}
    assert folders and all(re.fullmatch(r"[a-z0-9]+(-[a-z0-9]+)?", name) for name in folders), folders


def test_cuda_defines_named_in_bench_and_docs_exist_in_the_kernels():
    """Every -DMW_* a user may copy from bench/, README.md or docs/ is a name the CUDA sources
    use (the experiment log writes the defines the kernels no longer have without -D)."""
    cuda = "\n".join(p.read_text() for p in (REPO / "cuda").glob("*.cu*"))
    files = [f for f in _tracked("bench", "docs", "README.md") if not f.startswith("bench/results/")]
    named = {m for f in files for m in re.findall(r"-D(MW_[A-Z0-9_]+)", (REPO / f).read_text(errors="ignore"))}
    assert not {name for name in named if not re.search(rf"\b{name}\b", cuda)}


# The word the repository must not use, split so that this file does not use it either.
ORGANISATION_WORD = "sess" "ion"


def test_the_repository_speaks_of_the_product():
    """No tracked file's name or text says how the work was organised (what
    ``grep -rIi`` of the word would find)."""
    files = _tracked()
    assert not [f for f in files if ORGANISATION_WORD in f.lower()]
    bad = []
    for f in files:
        path = REPO / f
        data = path.read_bytes() if path.is_file() else b""
        if b"\0" not in data and ORGANISATION_WORD.encode() in data.lower():
            bad.append(f)
    assert not bad, bad
