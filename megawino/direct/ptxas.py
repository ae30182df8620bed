"""ptxas reports of the direct kernel over the whole parameter space.

:func:`ptxas_report` compiles one config with nvcc for sm_90 and reads registers,
spill bytes and static shared memory from ``-Xptxas -v``; :func:`regenerate` does
that for every config the resource filter can see and rewrites
``mapping/direct_ptxas_sm90.json``, the table :func:`megawino.direct.config.ptxas_table`
reads.  Needs nvcc, not a GPU::

    python -m megawino.direct --ptxas [--out PATH] [--nvcc PATH]
"""
from __future__ import annotations

import json
import os
import pathlib
import re
import subprocess
import tempfile

from ..core.resources import cuda_dir
from .config import (FLUSH_TERMS, DirectConfig, _ptxas_key, all_configs, ptxas_table,
                     ptxas_table_path, structural_ok)

ABOUT = ("ptxas -v on cuda/direct.cu (-arch=sm_90) for every structurally valid config of "
         "GRID, both layouts, with and without the flush (key suffix 'f'): [registers, spill "
         "bytes (stack + stores + loads), static smem bytes]. Regenerate with "
         "python -m megawino.direct --ptxas.")
COLUMNS = ("registers", "spill_bytes", "smem_bytes")


def ptxas_report(cfg: DirectConfig, nhwc: bool, flush: int = 0,
                 nvcc: str = "nvcc") -> tuple[int, int, int]:
    """(registers, spill bytes, static smem bytes) from ``nvcc -arch=sm_90 -cubin -Xptxas -v``."""
    with tempfile.TemporaryDirectory() as tmp:
        cmd = [nvcc, "-arch=sm_90", "-cubin", "-Xptxas", "-v", "-I", str(cuda_dir()),
               *cfg.defines(nhwc, flush), str(cuda_dir() / "direct.cu"), "-o", os.path.join(tmp, "k.cubin")]
        proc = subprocess.run(cmd, capture_output=True, text=True)
    text = proc.stdout + proc.stderr
    if proc.returncode != 0:
        raise RuntimeError(f"nvcc failed for {cfg.key}: {text[-2000:]}")
    regs = int(re.search(r"Used (\d+) registers", text).group(1))
    spills = sum(int(v) for v in re.findall(r"(\d+) bytes spill (?:stores|loads)", text))
    stack = re.search(r"(\d+) bytes stack frame", text)
    spills += int(stack.group(1)) if stack else 0
    smem = re.search(r"(\d+) bytes smem", text)
    return regs, spills, int(smem.group(1)) if smem else 0


def ptxas_jobs() -> list[tuple[DirectConfig, bool, int]]:
    """(config, nhwc, flush) of every table entry: the structurally valid configs of
    GRID that fit in 48 KiB of static shared memory and 2048 threads per SM."""
    return [(cfg, nhwc, flush) for cfg in all_configs() for nhwc in (False, True)
            for flush in (0, FLUSH_TERMS)
            if structural_ok(cfg, nhwc) and cfg.smem_bytes(nhwc) <= 48 * 1024
            and cfg.threads * cfg.min_blocks <= 2048]


def nvcc_release(nvcc: str = "nvcc") -> str | None:
    """``"13.0"`` from ``nvcc --version`` (None when it does not run)."""
    try:
        text = subprocess.run([nvcc, "--version"], capture_output=True, text=True).stdout
    except OSError:
        return None
    m = re.search(r"release (\d+\.\d+)", text)
    return m.group(1) if m else None


def table_json(entries: dict[str, tuple[int, int, int]], nvcc_version: str | None) -> str:
    """The table file's text: a header, then one entry per line (readable diffs)."""
    header = {"about": ABOUT, "nvcc": nvcc_version, "arch": "sm_90", "columns": list(COLUMNS)}
    lines = [f"  {json.dumps(key)}: {json.dumps([int(v) for v in value])}"
             for key, value in entries.items()]
    head = [f" {json.dumps(key)}: {json.dumps(value)}," for key, value in header.items()]
    return "\n".join(["{", *head, ' "entries": {', ",\n".join(lines), " }", "}"]) + "\n"


def write_table(entries: dict[str, tuple[int, int, int]], path: str | pathlib.Path | None = None,
                nvcc_version: str | None = None) -> pathlib.Path:
    """Write the table (atomically; default ``mapping/direct_ptxas_sm90.json``) and
    drop the cached copy so that the resource filter reads the new one."""
    path = pathlib.Path(path) if path is not None else ptxas_table_path()
    tmp = path.with_suffix(path.suffix + ".tmp")
    tmp.write_text(table_json(entries, nvcc_version), encoding="utf-8")
    os.replace(tmp, path)
    ptxas_table.cache_clear()
    return path


def regenerate(out: str | pathlib.Path | None = None, nvcc: str = "nvcc",
               workers: int | None = None) -> pathlib.Path:
    """Compile every config of :func:`ptxas_jobs` (in parallel) and write the table."""
    from concurrent.futures import ThreadPoolExecutor

    jobs = ptxas_jobs()
    with ThreadPoolExecutor(max_workers=workers or os.cpu_count() or 4) as pool:
        results = list(pool.map(lambda job: ptxas_report(*job, nvcc=nvcc), jobs))
    entries = {_ptxas_key(*job): res for job, res in zip(jobs, results)}
    return write_table(entries, out, nvcc_release(nvcc))


def main(argv=None) -> int:
    import argparse

    parser = argparse.ArgumentParser(prog="python -m megawino.direct",
                                     description="megawino direct-convolution helpers")
    parser.add_argument("--ptxas", action="store_true",
                        help="compile every config with nvcc (sm_90) and rewrite the register "
                             "table mapping/direct_ptxas_sm90.json")
    parser.add_argument("--out", metavar="PATH", default=None,
                        help="write the table here instead (with --ptxas)")
    parser.add_argument("--nvcc", default="nvcc", help="the nvcc to run (default: nvcc on PATH)")
    args = parser.parse_args(argv)
    if args.ptxas:
        path = regenerate(args.out, args.nvcc)
        print(f"wrote {path} ({len(ptxas_jobs())} entries)")
    return 0
