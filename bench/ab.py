#!/usr/bin/env python3
"""A/B of two builds of the CUDA kernels on one GPU: runs a benchmark under build A and build B
in alternating rounds (A1 B1 A2 B2 ...) and prints, per layer or model, the median time of each
side and the ratio B / A (below 1: B is faster), with the geomean.

A build is a set of CUDA defines (``--a-defines`` / ``--b-defines``, passed as
``MEGAWINO_CUDA_DEFINES``; write ``--b-defines=-DNAME=1``, with ``=``, as the value starts with
a dash) and a folder of CUDA sources (``--a-sources`` / ``--b-sources``: the
``.cu`` / ``.cuh`` files that replace the installed ones for that side; the installed sources are
put back at the end).  The kernel cache keys on the defines and on the sources' hash, so each
build compiles once.

    python3 bench/ab.py --b-defines=-DMW_GEMM_WGMMA=0               # wgmma against mma.sync
    git archive REV cuda | tar x --strip-components=1 -C /tmp/old_cuda    # an older revision's sources
    python3 bench/ab.py --b-sources /tmp/old_cuda --rounds 3 -- --layers vgg16.conv1_2,yolov3.res1
    python3 bench/ab.py --b-defines=-DNAME=1 --command "python3 bench/models.py --models resnet50 --batches 1 --json {out}"

Arguments after ``--`` go to ``bench/compare.py`` (default ``--backends ours``); ``--command``
runs another benchmark instead, whose ``{out}`` is replaced by the JSON path of each run.  Runs
whose JSON has compare.py's ``layers`` compare each layer's primary column, models.py's ``rows``
each (model, batch)'s megawino time; any other command is compared by its wall time.  The runs'
files and a summary (``ab.json``) go to ``--out`` (default: a new temporary folder).
"""
from __future__ import annotations

import argparse
import json
import math
import os
import shlex
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

BENCH_DIR = Path(__file__).resolve().parent
SIDES = ("a", "b")


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__)
    for side in SIDES:
        p.add_argument(f"--{side}-defines", default="", metavar="DEFINES",
                       help=f"build {side.upper()}'s MEGAWINO_CUDA_DEFINES (default: none)")
        p.add_argument(f"--{side}-sources", default=None, metavar="DIR",
                       help=f"build {side.upper()}'s folder of CUDA sources (default: the installed ones)")
    p.add_argument("--rounds", type=int, default=2, help="alternations of A and B (default 2)")
    p.add_argument("--command", default=None,
                   help="benchmark command ({out}: the run's JSON path; default: bench/compare.py)")
    p.add_argument("--out", default=None, help="folder for the runs' files and ab.json")
    p.add_argument("--dry-run", action="store_true", help="print the runs without starting them")
    p.add_argument("compare_args", nargs="*", help="after --: bench/compare.py's options")
    args = p.parse_args(argv)
    if args.rounds < 1:
        p.error("--rounds must be >= 1")
    if args.command and args.compare_args:
        p.error("compare.py options after -- and --command exclude each other")
    for side in SIDES:
        folder = getattr(args, f"{side}_sources")
        if folder is not None and not sorted(Path(folder).glob("*.cu*")):
            p.error(f"--{side}-sources {folder}: no .cu / .cuh files there")
    if (args.a_defines, args.a_sources) == (args.b_defines, args.b_sources):
        p.error("builds A and B are the same: give --b-defines or --b-sources (or the A options)")
    return args


def run_command(args, out: Path) -> list[str]:
    """The benchmark's argv for one run writing ``out``."""
    if args.command:
        return shlex.split(args.command.replace("{out}", shlex.quote(str(out))))
    return [sys.executable, str(BENCH_DIR / "compare.py"), *(args.compare_args or ["--backends", "ours"]),
            "--out", str(out)]


def times_of(path: Path, wall_s: float) -> dict[str, float]:
    """{name: time} of one run: compare.py's primary column per layer (us), models.py's
    megawino time per (model, batch) (ms), else the run's wall time (s)."""
    try:
        doc = json.loads(path.read_text())
    except (OSError, ValueError):
        return {"wall time (s)": wall_s}
    if "layers" in doc:
        return {layer["name"]: layer["derived"]["ours_us"] for layer in doc["layers"]
                if isinstance(layer.get("derived", {}).get("ours_us"), (int, float))}
    if "rows" in doc:
        return {f"{row['model']} batch {row['batch']}": row["megawino_ms"] for row in doc["rows"]
                if isinstance(row.get("megawino_ms"), (int, float))}
    return {"wall time (s)": wall_s}


def summarise(runs: dict[str, list[dict[str, float]]]) -> dict:
    """Per name: the median of each side's runs and B / A; the geomean of the ratios."""
    rows = {}
    for name in runs["a"][0]:
        a = [r[name] for r in runs["a"] if name in r]
        b = [r[name] for r in runs["b"] if name in r]
        if a and b and min(a) > 0 and min(b) > 0:
            ma, mb = statistics.median(a), statistics.median(b)
            rows[name] = {"a": ma, "b": mb, "b_over_a": mb / ma}
    ratios = [r["b_over_a"] for r in rows.values()]
    geomean = math.exp(sum(map(math.log, ratios)) / len(ratios)) if ratios else None
    return {"rows": rows, "geomean_b_over_a": geomean}


class Sources:
    """Swaps the installed CUDA sources for a side's folder, and back at the end."""

    def __init__(self, out: Path):
        from megawino.core.resources import cuda_dir
        self.installed = cuda_dir()
        self.saved = out / "installed-sources"
        self.saved.mkdir(parents=True, exist_ok=True)
        for path in self.installed.glob("*.cu*"):
            shutil.copy2(path, self.saved / path.name)

    def use(self, folder: str | None) -> None:
        for path in self.installed.glob("*.cu*"):
            path.unlink()
        for path in Path(folder or self.saved).glob("*.cu*"):
            shutil.copy2(path, self.installed / path.name)

    def restore(self) -> None:
        self.use(None)


def main(argv=None) -> int:
    args = parse_args(argv)
    out = Path(args.out) if args.out else Path(tempfile.mkdtemp(prefix="megawino-ab-"))
    out.mkdir(parents=True, exist_ok=True)
    sources = Sources(out) if (args.a_sources or args.b_sources) and not args.dry_run else None
    runs = {side: [] for side in SIDES}
    try:
        for i in range(1, args.rounds + 1):
            for side in SIDES:
                path = out / f"{side}{i}.json"
                argv_run = run_command(args, path)
                defines = getattr(args, f"{side}_defines")
                print(f"ab: {side}{i}: MEGAWINO_CUDA_DEFINES={defines!r}"
                      f" sources={getattr(args, f'{side}_sources') or 'installed'}: {shlex.join(argv_run)}",
                      flush=True)
                if args.dry_run:
                    continue
                if sources:
                    sources.use(getattr(args, f"{side}_sources"))
                env = dict(os.environ, MEGAWINO_CUDA_DEFINES=defines)
                t0 = time.perf_counter()
                with open(out / f"{side}{i}.log", "w") as log:
                    rc = subprocess.run(argv_run, env=env, stdout=log, stderr=subprocess.STDOUT).returncode
                if rc != 0:
                    print(f"ab: {side}{i} exited {rc}; its log: {out / f'{side}{i}.log'}", file=sys.stderr)
                    return 1
                runs[side].append(times_of(path, time.perf_counter() - t0))
    finally:
        if sources:
            sources.restore()
    if args.dry_run:
        return 0
    summary = summarise(runs)
    print(f"{'':28} {'A':>12} {'B':>12} {'B / A':>8}")
    for name, row in summary["rows"].items():
        print(f"{name:28} {row['a']:12.2f} {row['b']:12.2f} {row['b_over_a']:8.3f}")
    if summary["geomean_b_over_a"] is not None:
        print(f"geomean B / A: {summary['geomean_b_over_a']:.4f} ({args.rounds} rounds, medians)")
    (out / "ab.json").write_text(json.dumps({
        "a": {"defines": args.a_defines, "sources": args.a_sources},
        "b": {"defines": args.b_defines, "sources": args.b_sources},
        "rounds": args.rounds, "command": run_command(args, out / "{run}.json"), **summary}, indent=1) + "\n")
    print(f"wrote {out / 'ab.json'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
