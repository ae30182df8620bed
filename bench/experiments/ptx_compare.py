"""Compile every shipped variant of the CUDA sources at two git revisions and compare the PTX.

    python3 bench/experiments/ptx_compare.py                  # merge-base(HEAD, main) vs HEAD
    python3 bench/experiments/ptx_compare.py REV_A REV_B      # any two revisions; "." = working tree
    python3 bench/experiments/ptx_compare.py --normalise      # mangled symbols replaced by SYM<n>
    python3 bench/experiments/ptx_compare.py --ignore-registers   # %r12, %f7 ... compared as %r, %f
    python3 bench/experiments/ptx_compare.py --ptxas          # + registers / spills of the second

Shipped variants: cuda/megakernel.cu for MW_M in {2, 4} x MW_NHWC in {0, 1} x MW_GEMM_TF32X3 in
{0, 1} x MW_TRACE (megawino.gpu.nvrtc.compile_options), cuda/nonfused.cu the same without MW_TRACE,
cuda/direct.cu for every config of mapping/direct_h100.json plus DEFAULT_CONFIG x both layouts x
flush off / on (megawino.direct.config.DirectConfig.defines).  The sources of each revision come
from ``git archive``; the defines from the working tree's Python package.  Needs nvcc and ptxas
(no GPU).  Exit status 1 when some variant differs.
"""
from __future__ import annotations

import argparse
import concurrent.futures
import hashlib
import io
import itertools
import json
import os
import pathlib
import re
import subprocess
import sys
import tarfile
import tempfile

ROOT = pathlib.Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from megawino.direct.config import DEFAULT_CONFIG, FLUSH_TERMS, DirectConfig  # noqa: E402

WORKTREE = "."


def variants() -> list[tuple[str, str, tuple[str, ...]]]:
    """(name, source file, defines) of every shipped build."""
    out = []
    for m, nhwc, tf32x3, trace in itertools.product((2, 4), (0, 1), (0, 1), (False, True)):
        defines = (f"-DMW_M={m}", f"-DMW_NHWC={nhwc}", f"-DMW_GEMM_TF32X3={tf32x3}") + (("-DMW_TRACE",) if trace else ())
        name = f"m{m} {'NHWC' if nhwc else 'NCHW'} {'3xtf32' if tf32x3 else 'ffma'}"
        out.append((f"megakernel {name}{' trace' if trace else ''}", "megakernel.cu", defines))
        if not trace:
            out.append((f"nonfused {name}", "nonfused.cu", defines))
    table = json.loads((ROOT / "mapping" / "direct_h100.json").read_text())
    configs = sorted({DirectConfig.from_key(e["config"]) for e in table["entries"].values()} | {DEFAULT_CONFIG})
    for cfg, nhwc, flush in itertools.product(configs, (False, True), (0, FLUSH_TERMS)):
        name = f"direct {cfg.key} {'NHWC' if nhwc else 'NCHW'}{' flush' if flush else ''}"
        out.append((name, "direct.cu", cfg.defines(nhwc, flush)))
    return out


def export_sources(rev: str, dest: pathlib.Path) -> pathlib.Path:
    """cuda/ of ``rev`` (or of the working tree for ".") under ``dest``."""
    if rev == WORKTREE:
        return ROOT / "cuda"
    data = subprocess.run(["git", "-C", str(ROOT), "archive", rev, "cuda"], check=True,
                          capture_output=True).stdout
    with tarfile.open(fileobj=io.BytesIO(data)) as tar:
        tar.extractall(dest, filter="data")
    return dest / "cuda"


def normalise(ptx: str) -> str:
    """Mangled C++ symbols (``_Z...``) replaced by SYM<n> in order of first appearance, so that
    renamed functions / namespaces compare equal when nothing else changed."""
    names: dict[str, str] = {}
    return re.sub(r"_Z[A-Za-z0-9_$]+", lambda m: names.setdefault(m.group(0), f"SYM{len(names)}"), ptx)


def drop_register_numbers(ptx: str) -> str:
    """Virtual register numbers removed (and the .reg counts), so that two PTX files that differ
    only in the order their registers were numbered compare equal."""
    ptx = re.sub(r"\.reg \.\w+\s+%\w+<\d+>;", ".reg", ptx)
    return re.sub(r"(%(?:rd|rs|r|fd|f|p))\d+", r"\1", ptx)


def compile_ptx(cuda: pathlib.Path, source: str, defines, out: pathlib.Path) -> str:
    cmd = ["nvcc", "-arch=sm_90", "-ptx", "--std=c++17", "-I", str(cuda), *defines, str(cuda / source),
           "-o", str(out)]
    res = subprocess.run(cmd, capture_output=True, text=True)
    if res.returncode:
        raise RuntimeError(f"{' '.join(cmd)}\n{res.stderr}")
    return out.read_text()


def ptxas_report(ptx_file: pathlib.Path) -> str:
    """'kernel: R regs, S B spill' per entry point (ptxas -v on the PTX)."""
    res = subprocess.run(["ptxas", "-arch=sm_90", "-v", str(ptx_file), "-o", os.devnull],
                         capture_output=True, text=True, check=True)
    parts, current = [], None
    for line in res.stderr.splitlines():
        m = re.search(r"Compiling entry function '(\w+)'", line)
        if m:
            current = m.group(1)
        m = re.search(r"(\d+) bytes stack frame, (\d+) bytes spill stores, (\d+) bytes spill loads", line)
        if m and current:
            spill = int(m.group(1)) + int(m.group(2)) + int(m.group(3))
            parts.append([current, spill])
        m = re.search(r"Used (\d+) registers", line)
        if m and parts and current:
            parts[-1].insert(1, int(m.group(1)))
            current = None
    return ", ".join(f"{k.removeprefix('mw_')} {r}r/{s}B" for k, r, s in parts)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("revs", nargs="*", help="two revisions (default: merge-base(HEAD, main) and HEAD); '.' = working tree")
    ap.add_argument("--normalise", action="store_true", help="compare with mangled symbols renamed SYM<n>")
    ap.add_argument("--ignore-registers", action="store_true",
                    help="compare with virtual register numbers removed")
    ap.add_argument("--ptxas", action="store_true", help="report registers and spill bytes of the second revision")
    ap.add_argument("--only", default="", help="only the variants whose name contains this")
    args = ap.parse_args(argv)
    revs = args.revs or [subprocess.run(["git", "-C", str(ROOT), "merge-base", "HEAD", "main"], check=True,
                                        capture_output=True, text=True).stdout.strip(), "HEAD"]
    if len(revs) != 2:
        ap.error("give two revisions (or none)")
    todo = [v for v in variants() if args.only in v[0]]
    with tempfile.TemporaryDirectory() as tmp:
        tmp = pathlib.Path(tmp)
        cuda = [export_sources(rev, tmp / f"rev{i}") for i, rev in enumerate(revs)]

        def job(i_rev, i_var):
            name, source, defines = todo[i_var]
            out = tmp / f"{i_rev}_{i_var}.ptx"
            text = compile_ptx(cuda[i_rev], source, defines, out)
            if args.normalise:
                text = normalise(text)
            if args.ignore_registers:
                text = drop_register_numbers(text)
            digest = hashlib.sha256(text.encode()).hexdigest()[:12]
            report = ptxas_report(out) if args.ptxas and i_rev == 1 else ""
            return digest, report

        with concurrent.futures.ThreadPoolExecutor(os.cpu_count()) as pool:
            futures = {(r, v): pool.submit(job, r, v) for r in (0, 1) for v in range(len(todo))}
            results = {key: fut.result() for key, fut in futures.items()}
    width = max(len(v[0]) for v in todo)
    print(f"{'variant':<{width}}  {revs[0][:12]:<12}  {revs[1][:12]:<12}  result")
    changed = 0
    for v, (name, _, _) in enumerate(todo):
        (a, _), (b, report) = results[(0, v)], results[(1, v)]
        same = a == b
        changed += not same
        print(f"{name:<{width}}  {a}  {b}  {'identical' if same else 'CHANGED'}{'  ' + report if report else ''}")
    notes = [n for n, on in (("symbols normalised", args.normalise), ("register numbers ignored", args.ignore_registers)) if on]
    print(f"{len(todo) - changed} identical, {changed} changed{' (' + ', '.join(notes) + ')' if notes else ''}")
    return 1 if changed else 0


if __name__ == "__main__":
    sys.exit(main())
