#!/usr/bin/env python3
"""A/B of two builds of the CUDA kernels on one GPU: runs a benchmark under build A and build B
in alternating rounds (A1 B1 A2 B2 ...) and prints, per layer or model, the median time of each
side and the ratio B / A (below 1: B is faster), with the geomean.

A build is a set of CUDA defines (``--a-defines`` / ``--b-defines``, passed as
``MEGAWINO_CUDA_DEFINES``; write ``--b-defines=-DNAME=1``, with ``=``, as the value starts with
a dash) and a folder of CUDA sources (``--a-sources`` / ``--b-sources``: the
``.cu`` / ``.cuh`` files that replace the installed ones for that side; the installed sources are
put back at the end) or a git revision's ``cuda/`` (``--a-rev`` / ``--b-rev``, extracted with
``git archive`` into ``--out``).  The kernel cache keys on the defines and on the sources' hash,
so each build compiles once.

    python3 bench/ab.py --b-defines=-DMW_GEMM_WGMMA=0               # wgmma against mma.sync
    python3 bench/ab.py --a-rev main --rounds 3 -- --layers vgg16.conv1_2,yolov3.res1    # main against this tree
    python3 bench/ab.py --b-defines=-DNAME=1 --command "python3 bench/models.py --models resnet50 --batches 1 --json {out}"
    python3 bench/ab.py --sass --a-rev main --b-sources cuda          # a change's SASS, no GPU needed

Arguments after ``--`` go to ``bench/compare.py`` (default ``--backends ours``); ``--command``
runs another benchmark instead, whose ``{out}`` is replaced by the JSON path of each run.  Runs
whose JSON has compare.py's ``layers`` compare each layer's primary column, models.py's ``rows``
each (model, batch)'s megawino time; any other command is compared by its wall time.  The runs'
files and a summary (``ab.json``) go to ``--out`` (default: a new temporary folder).

``--sass`` times nothing: it compiles every module build the runtime makes (megakernel and
non-fused for m 2 / 4, NCHW / NHWC, each GEMM arithmetic; the traced megakernel; pointwise; the
direct kernel) for sm_90a (the wgmma family) and sm_80 (the mma.sync family) from each side's
sources with nvcc and the runtime's defines, and compares ``cuobjdump -sass`` and ``-elf`` of each
build (file names dropped).  It lists each build as identical or differing, writes the dumps and
a diff per differing build to ``--out``, and exits 0 when every build is identical, 1 when some
differ (or fail to compile).  cuobjdump: ``$CUOBJDUMP``, else on PATH, else the one triton ships
(pip install triton).
"""
from __future__ import annotations

import argparse
import concurrent.futures
import difflib
import io
import json
import math
import os
import re
import shlex
import shutil
import statistics
import subprocess
import sys
import tarfile
import tempfile
import time
from pathlib import Path

BENCH_DIR = Path(__file__).resolve().parent
REPO_DIR = BENCH_DIR.parent
SIDES = ("a", "b")


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__)
    for side in SIDES:
        p.add_argument(f"--{side}-defines", default="", metavar="DEFINES",
                       help=f"build {side.upper()}'s MEGAWINO_CUDA_DEFINES (default: none)")
        p.add_argument(f"--{side}-sources", default=None, metavar="DIR",
                       help=f"build {side.upper()}'s folder of CUDA sources (default: the installed ones)")
        p.add_argument(f"--{side}-rev", default=None, metavar="REV",
                       help=f"build {side.upper()}'s CUDA sources: git revision REV's cuda/")
    p.add_argument("--rounds", type=int, default=2, help="alternations of A and B (default 2)")
    p.add_argument("--command", default=None,
                   help="benchmark command ({out}: the run's JSON path; default: bench/compare.py)")
    p.add_argument("--out", default=None, help="folder for the runs' files and ab.json")
    p.add_argument("--dry-run", action="store_true", help="print the runs without starting them")
    p.add_argument("--sass", action="store_true",
                   help="compare every kernel build's SASS (nvcc, cuobjdump; no GPU) instead of timing;"
                        " exit 0: identical, 1: some differ")
    p.add_argument("--only", default=None, metavar="REGEX", help="--sass: only the builds whose name matches")
    p.add_argument("--jobs", type=int, default=2, help="--sass: compiles run at once (default 2)")
    p.add_argument("compare_args", nargs="*", help="after --: bench/compare.py's options")
    args = p.parse_args(argv)
    if args.rounds < 1:
        p.error("--rounds must be >= 1")
    if args.command and args.compare_args:
        p.error("compare.py options after -- and --command exclude each other")
    if args.sass and (args.command or args.compare_args):
        p.error("--sass compiles and compares; it takes no benchmark (--command, options after --)")
    if args.jobs < 1:
        p.error("--jobs must be >= 1")
    if args.only is not None:
        try:
            re.compile(args.only)
        except re.error as exc:
            p.error(f"--only {args.only!r}: {exc}")
    for side in SIDES:
        folder, rev = getattr(args, f"{side}_sources"), getattr(args, f"{side}_rev")
        if folder is not None and rev is not None:
            p.error(f"--{side}-sources and --{side}-rev exclude each other")
        if folder is not None and not sorted(Path(folder).glob("*.cu*")):
            p.error(f"--{side}-sources {folder}: no .cu / .cuh files there")
        if rev is not None and subprocess.run(["git", "-C", str(REPO_DIR), "rev-parse", "--verify", "--quiet",
                                               f"{rev}^{{commit}}"], capture_output=True).returncode:
            p.error(f"--{side}-rev {rev}: not a revision of {REPO_DIR}")
        if args.sass:
            from megawino.gpu import nvrtc
            try:
                nvrtc.check_extra_defines(tuple(getattr(args, f"{side}_defines").split()))
            except ValueError as exc:
                p.error(f"--{side}-defines: {exc}")
    if ((args.a_defines, args.a_sources, args.a_rev) == (args.b_defines, args.b_sources, args.b_rev)
            and not args.sass):
        p.error("builds A and B are the same: give --b-defines, --b-sources or --b-rev (or the A options)")
    return args


def sources_of_revisions(args, out: Path) -> None:
    """Extracts each side's ``--X-rev`` cuda/ into ``out`` and makes it that side's sources."""
    for side in SIDES:
        rev = getattr(args, f"{side}_rev")
        if rev is None:
            continue
        folder = out / f"{side}-sources"
        folder.mkdir(parents=True, exist_ok=True)
        archive = subprocess.run(["git", "-C", str(REPO_DIR), "archive", "--format=tar", rev, "cuda"],
                                 capture_output=True, check=True).stdout
        with tarfile.open(fileobj=io.BytesIO(archive)) as tar:
            for member in tar.getmembers():
                if member.isfile():     # cuda/ is flat
                    (folder / Path(member.name).name).write_bytes(tar.extractfile(member).read())
        setattr(args, f"{side}_sources", str(folder))


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
        if folder is not None and Path(folder).resolve() == self.installed.resolve():
            folder = None       # the installed sources themselves (an editable install's cuda/)
        for path in self.installed.glob("*.cu*"):
            path.unlink()
        for path in Path(folder or self.saved).glob("*.cu*"):
            shutil.copy2(path, self.installed / path.name)

    def restore(self) -> None:
        self.use(None)


# ---- --sass: every kernel build's machine code, compared ----------------------------------------

def sass_builds(extra: tuple[str, ...]) -> list[tuple[str, str, tuple[str, ...]]]:
    """(name, source, nvcc options) of every module build the runtime makes, for each architecture-
    specific target (the wgmma family) and sm_80 (the mma.sync family every other GPU runs).
    ``extra``: a side's defines, which the runtime adds to the Winograd and pointwise modules."""
    from megawino.core.spec import LAYOUTS
    from megawino.direct.config import DEFAULT_CONFIG, FLUSH_TERMS
    from megawino.gpu import nvrtc
    from megawino.gpu.identity import ARCH_SPECIFIC_TARGETS

    def runtime(m: int, layout: str, trace: bool, math: str) -> tuple[str, ...]:
        # The runtime's own options, less its include path and its cache key (MW_SOURCE_HASH),
        # which differ between two source trees by construction.
        opts = nvrtc._runtime_options(m, layout, trace, math)
        return (*(o for o in opts if not o.startswith(("-I", "-DMW_SOURCE_HASH="))), *extra)

    out = []
    for target in (*ARCH_SPECIFIC_TARGETS.values(), "sm_80"):
        arch = (f"-arch={target}",)
        for math in nvrtc.GEMM_MATHS:
            for algo in nvrtc.WINOGRAD_ALGOS:
                for m in (2, 4):
                    for layout in LAYOUTS:
                        out.append((f"{target}-{algo}-m{m}-{layout}-{math}", f"{algo}.cu",
                                    arch + runtime(m, layout, False, math)))
            out.append((f"{target}-pointwise-{math}", "pointwise.cu", arch + runtime(4, "NCHW", False, math)))
        out.append((f"{target}-megakernel-m4-NCHW-{nvrtc.DEFAULT_GEMM_MATH}-trace", "megakernel.cu",
                    arch + runtime(4, "NCHW", True, nvrtc.DEFAULT_GEMM_MATH)))
        # The direct kernel: its standalone defaults, and the runtime's default tile in each layout.
        out += [(f"{target}-direct-defaults", "direct.cu", arch),
                (f"{target}-direct-NCHW", "direct.cu", arch + DEFAULT_CONFIG.defines(False)),
                (f"{target}-direct-NHWC-flush", "direct.cu", arch + DEFAULT_CONFIG.defines(True, FLUSH_TERMS))]
    return out


def find_cuobjdump() -> str | None:
    """$CUOBJDUMP, else cuobjdump on PATH, else the copy triton ships."""
    found = os.environ.get("CUOBJDUMP") or shutil.which("cuobjdump")
    if found:
        return found
    try:
        import triton
    except ImportError:
        return None
    shipped = Path(triton.__file__).parent / "backends" / "nvidia" / "bin" / "cuobjdump"
    return str(shipped) if shipped.is_file() else None


# cuobjdump lines naming files (the source, the cubin), which differ between two trees.
FILE_NAME_LINE = re.compile(r"identifier\s*=|\.cubin|\.cu\b|//## File")


def dump_build(cuda: Path, source: str, options, cubin: Path, cuobjdump: str) -> str:
    """``cuobjdump -sass`` and ``-elf`` of one build, without the lines that name files."""
    cmd = ["nvcc", "-cubin", "-I", str(cuda), *options, str(cuda / source), "-o", str(cubin)]
    res = subprocess.run(cmd, capture_output=True, text=True)
    if res.returncode:
        raise RuntimeError(f"{shlex.join(cmd)} failed:\n{res.stderr}")
    text = "".join(subprocess.run([cuobjdump, flag, str(cubin)], capture_output=True, text=True, check=True).stdout
                   for flag in ("-sass", "-elf"))
    return "".join(ln.rstrip() + "\n" for ln in text.splitlines() if not FILE_NAME_LINE.search(ln))


def compare_sass(args, out: Path) -> int:
    """Dumps every build of both sides into ``out``/a and ``out``/b, lists each as identical or
    differing (its diff in ``out``/NAME.diff); 0 when all are identical, 1 otherwise."""
    from megawino.core.resources import cuda_dir
    cuobjdump = find_cuobjdump()
    if shutil.which("nvcc") is None or cuobjdump is None:
        print("ab: --sass needs nvcc on PATH and cuobjdump ($CUOBJDUMP, PATH, or pip install triton)",
              file=sys.stderr)
        return 2
    cuda, builds = {}, {}
    for side in SIDES:
        cuda[side] = Path(getattr(args, f"{side}_sources") or cuda_dir()).resolve()
        builds[side] = [b for b in sass_builds(tuple(getattr(args, f"{side}_defines").split()))
                        if args.only is None or re.search(args.only, b[0])]
        (out / side).mkdir(exist_ok=True)
        print(f"ab: {side}: sources {cuda[side]}, defines {getattr(args, f'{side}_defines')!r}", flush=True)
    names = [name for name, _, _ in builds["a"]]
    if not names:
        print(f"ab: --only {args.only!r} matches no build", file=sys.stderr)
        return 2
    differ = []
    with tempfile.TemporaryDirectory(prefix="megawino-sass-") as work, \
            concurrent.futures.ThreadPoolExecutor(args.jobs) as pool:
        # Both sides of a build one after the other, so that each verdict prints as soon as it is known.
        jobs = {}
        for i, name in enumerate(names):
            for side in SIDES:
                _, source, options = builds[side][i]
                jobs[side, name] = pool.submit(dump_build, cuda[side], source, options,
                                               Path(work) / f"{side}-{name}.cubin", cuobjdump)
        for name in names:
            dumps, failed = {}, []
            for side in SIDES:
                try:
                    dumps[side] = jobs[side, name].result()
                    (out / side / f"{name}.sass").write_text(dumps[side])
                except RuntimeError as exc:     # a failed compile: nvcc's message in place of the dump
                    (out / side / f"{name}.log").write_text(f"{exc}\n")
                    failed.append(str(out / side / f"{name}.log"))
            if failed:
                differ.append(name)
                print(f"failed     {name} (nvcc's message: {', '.join(failed)})", flush=True)
            elif dumps["a"] == dumps["b"]:
                print(f"identical  {name}", flush=True)
            else:
                differ.append(name)
                diff = list(difflib.unified_diff(dumps["a"].splitlines(), dumps["b"].splitlines(), "a", "b",
                                                 n=1, lineterm=""))
                (out / f"{name}.diff").write_text("\n".join(diff) + "\n")
                print(f"differs    {name} ({sum(ln[:1] in '+-' for ln in diff[2:])} lines changed;"
                      f" {out / f'{name}.diff'})", flush=True)
    print(f"ab: {len(names) - len(differ)} of {len(names)} builds identical")
    return 1 if differ else 0


def main(argv=None) -> int:
    args = parse_args(argv)
    out = Path(args.out) if args.out else Path(tempfile.mkdtemp(prefix="megawino-ab-"))
    out.mkdir(parents=True, exist_ok=True)
    sources_of_revisions(args, out)
    if args.sass:
        return compare_sass(args, out)
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
        "a": {"defines": args.a_defines, "sources": args.a_sources, "rev": args.a_rev},
        "b": {"defines": args.b_defines, "sources": args.b_sources, "rev": args.b_rev},
        "rounds": args.rounds, "command": run_command(args, out / "{run}.json"), **summary}, indent=1) + "\n")
    print(f"wrote {out / 'ab.json'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
