"""Stage-level A/B harness for the CUDA transforms and GEMM (docs/experiments.md experiments 4-5).

Compiles cuda/nonfused.cu and cuda/megakernel.cu with extra -D options (variants), launches
their kernels on a normal Plan's parameter block, checks bitwise equality of V / M / y against
the first variant, and times each stage (median of CUDA events).

    PYTHONPATH=$PWD python3 bench/experiments/profile_stages.py variants \
        --layers vgg16.conv1_2,resnet50.conv4 --variants "-DMW_IN_CPT=1 -DMW_OUT_CPT=1;" --json $OUT/v.json
    ncu ... python3 bench/experiments/profile_stages.py ncu --layers vgg16.conv1_2 --batch 16 --variants "..."

A variant is -D options plus optional task-parameter tokens (gk=N: gemm_k_per_task, tpg=N:
tiles_per_group), e.g. "-DMW_GEMM_MIN_BLOCKS=1 gk=64".  The megakernel of a variant runs with
a grid of SMs x its own resident blocks per SM.
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import sys
from pathlib import Path

import numpy as np

import megawino
from megawino.gpu import nvrtc
from megawino.core import suite
from megawino.core.task_sizes import default_params
from megawino.core.tasks import TaskType, channel_stride

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from common import synchronous_median_us  # noqa: E402


def events_median(fn, warmup=2, reps=10):
    """Median microseconds of ``fn()`` after ``warmup`` untimed calls (bench/common.py's loop)."""
    for _ in range(warmup):
        fn()
    return synchronous_median_us(fn, reps)


_MODS = {}


def build(kind, spec, extra):
    import cupy as cp
    key = (kind, spec.layout, extra)
    if key in _MODS:
        return _MODS[key]
    # The runtime's architecture target too (sm_90a: the wgmma GEMM), so that the stages timed are
    # the ones the runtime runs.
    opts = (nvrtc.with_defines(nvrtc.compile_options(4, spec.layout, False), tuple(extra.split()))
            + nvrtc.arch_options(cp.cuda.Device().compute_capability))
    code = (nvrtc.cuda_dir() / f"{kind}.cu").read_text()
    _MODS[key] = cp.RawModule(code=code, options=opts)
    return _MODS[key]


def fn_resources(fn):
    """(registers, local bytes per thread) of a loaded kernel (the driver's JIT result)."""
    from cupy_backends.cuda.api import driver
    ptr = int(getattr(fn, "kernel", fn).ptr)
    return (int(driver.funcGetAttribute(driver.CU_FUNC_ATTRIBUTE_NUM_REGS, ptr)),
            int(driver.funcGetAttribute(driver.CU_FUNC_ATTRIBUTE_LOCAL_SIZE_BYTES, ptr)))


def split_variant(var):
    """'-DX gk=64 tpg=64' -> ('-DX', {'gemm_k_per_task': 64, 'tiles_per_group': 64})."""
    names = {"gk": "gemm_k_per_task", "tpg": "tiles_per_group"}
    defines, over = [], {}
    for tok in var.split():
        key, _, val = tok.partition("=")
        if key in names and val.isdigit():
            over[names[key]] = int(val)
        else:
            defines.append(tok)
    return " ".join(defines), over


def stage_launcher(plan, mod, ttype, arr=None):
    names = {TaskType.FILTER: "filter", TaskType.INPUT: "input", TaskType.GEMM: "gemm",
             TaskType.OUTPUT: "output"}
    name = f"mw_{names[ttype]}_kernel"
    fn = nvrtc.GemmSmemKernel.winograd(mod, name) if ttype == TaskType.GEMM else mod.get_function(name)
    first, count = plan._type_range[ttype]
    workspace = plan.workspace()
    pbuf = workspace.params(plan, plan._full, workspace.U)
    args = (pbuf,) + (() if ttype == TaskType.GEMM else (arr,)) + (np.int32(first),)
    return lambda: fn((count,), (nvrtc.BLOCK_THREADS,), args)


def main(argv=None):
    ap = argparse.ArgumentParser()
    ap.add_argument("mode", choices=("variants", "ncu"))
    ap.add_argument("--layers", default="vgg16.conv1_2")
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--variants", default="-DMW_IN_CPT=1 -DMW_OUT_CPT=1;")
    ap.add_argument("--stages", default="input,output,gemm")
    ap.add_argument("--mega", action="store_true")
    ap.add_argument("--reps", type=int, default=10)
    ap.add_argument("--json", default="")
    args = ap.parse_args(argv)
    import cupy as cp
    specs = suite.select_specs(suite.load_suite(suite="winograd", batch=args.batch), args.layers)
    variants = [v.strip() for v in args.variants.split(";")]
    stages = args.stages.split(",")
    rows = []
    rng = cp.random.default_rng(1)
    for spec in specs:
        base = default_params(spec)
        x = rng.standard_normal(spec.input_shape, dtype=cp.float32)
        w = rng.standard_normal(spec.weight_shape, dtype=cp.float32)
        y = cp.empty(spec.output_shape, dtype=cp.float32)
        ref = {}
        sms = cp.cuda.Device().attributes["MultiProcessorCount"]
        for vi, var in enumerate(variants):
            defines, over = split_variant(var)
            if "gemm_k_per_task" in over:
                over["gemm_k_per_task"] = min(over["gemm_k_per_task"], -(-spec.K // 4) * 4)
            if "tiles_per_group" in over:   # transform tasks then cover whole groups of the new size
                over.update(input_tiles_per_task=None, output_tiles_per_task=None)
            params = dataclasses.replace(base, **over)
            nf = megawino.plan(spec, params=params, algo="nonfused")
            mod = build("nonfused", spec, defines)
            f = stage_launcher(nf, mod, TaskType.FILTER, w)
            fi = stage_launcher(nf, mod, TaskType.INPUT, x)
            fg = stage_launcher(nf, mod, TaskType.GEMM)
            fo = stage_launcher(nf, mod, TaskType.OUTPUT, y)
            for b in (nf.V, nf.M, y):
                b.fill(np.nan)
            f(); fi(); fg(); fo()
            cp.cuda.get_current_stream().synchronize()
            if args.mode == "ncu":
                continue
            got = {"V": nf.V.copy(), "M": nf.M.copy(), "y": y.copy()}
            if vi == 0:
                ref = got
            same = {k: bool(cp.array_equal(got[k], ref[k])) for k in got}
            nan = bool(cp.isnan(y).any())
            row = dict(layer=spec.name, variant=var or "(default)", same=same, nan=nan,
                       tpg=params.tiles_per_group, gk=params.gemm_k_per_task)
            if "input" in stages:
                row["input_us"] = events_median(fi, reps=args.reps)
            if "gemm" in stages:
                row["gemm_us"] = events_median(fg, reps=args.reps)
                lay = nf.task_layout
                row["gemm_tflops"] = 2 * lay.alpha2 * lay.tiles_padded * lay.c_stride * lay.k_stride / row["gemm_us"] / 1e6
            if "output" in stages:
                row["output_us"] = events_median(fo, reps=args.reps)
            if args.mega:
                mm = build("megakernel", spec, defines)
                fn = nvrtc.GemmSmemKernel.winograd(mm, "mw_megakernel", channel_stride(spec.C))
                bps = nvrtc.blocks_per_sm(fn)
                from megawino.tuning import table as tuning
                mp = tuning.default_mapping_params(nf.task_layout, sms * bps)
                mega = megawino.plan(spec, params=params, mapping=mp)
                mega_workspace = mega.workspace()
                mega_pbuf = mega_workspace.params(mega, mega._full, mega_workspace.U)
                grid = max(1, min(mega.graph.num_tasks, sms * bps))
                ym = cp.full(spec.output_shape, np.nan, dtype=cp.float32)
                run = lambda: fn((grid,), (nvrtc.BLOCK_THREADS,), (mega_pbuf, x, w, ym, np.uint64(0)))  # noqa: E731
                run()
                mega.check()
                row["mega_same_as_nonfused"] = bool(cp.array_equal(ym, y))
                row["mega_us"] = events_median(run, reps=args.reps)
                row["mega_blocks_per_sm"] = bps
                row["mega_regs"], row["mega_local_bytes"] = fn_resources(fn)
                mega.check()
                del mega, ym
            rows.append(row)
            print(json.dumps(row), flush=True)
            del nf
        del x, w, y, ref
        cp.get_default_memory_pool().free_all_blocks()
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=1))
    if rows:
        print("\n| layer | variant | gk | input us | GEMM us | TFLOP/s | output us | mega us | mega regs / local B | same |")
        print("|---|---|---|---|---|---|---|---|---|---|")
        for r in rows:
            print(f"| {r['layer']} | {r['variant']} | {r['gk']} | {r.get('input_us', 0):.1f} | {r.get('gemm_us', 0):.1f} | "
                  f"{r.get('gemm_tflops', 0):.1f} | {r.get('output_us', 0):.1f} | {r.get('mega_us', 0):.1f} | "
                  f"{r.get('mega_regs', '-')} / {r.get('mega_local_bytes', '-')} | "
                  f"{all(r['same'].values()) and not r['nan'] and r.get('mega_same_as_nonfused', True)} |")

    if args.mega and rows:
        print_mega_ab(rows)


def print_mega_ab(rows):
    """Megakernel A/B: per layer, each variant's runs (in run order) and its change against the
    first variant (mean of the runs)."""
    layers = list(dict.fromkeys(r["layer"] for r in rows))
    variants = list(dict.fromkeys(r["variant"] for r in rows))
    print("\n| layer | " + " | ".join(variants) + " |")
    print("|---|" + "---|" * len(variants))
    for lay in layers:
        cells, base = [], None
        for v in variants:
            ts = [r["mega_us"] for r in rows if r["layer"] == lay and r["variant"] == v and "mega_us" in r]
            ok = all(all(r["same"].values()) and not r["nan"] and r.get("mega_same_as_nonfused", False)
                     for r in rows if r["layer"] == lay and r["variant"] == v)
            if not ts:
                cells.append("-")
                continue
            mean = sum(ts) / len(ts)
            base = mean if base is None else base
            cells.append(" / ".join(f"{t:.1f}" for t in ts) + f" ({100 * (mean / base - 1):+.1f}%)"
                         + ("" if ok else " NOT BITWISE"))
        print(f"| {lay} | " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main()
