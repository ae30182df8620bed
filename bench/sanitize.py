"""compute-sanitizer's memcheck, racecheck and synccheck over a few small layers with odd sizes:
both Winograd algorithms (megakernel, nonfused), m = 2 and 4, both layouts, odd task sizes, wide
K blocks, V and M as a ring of slots, the GEMM arithmetics, and the pointwise path in both
layouts, each launched twice (the second launch runs on the scheduler state the first one
reset), then twice more through the plan's launcher (megawino.gpu.launch: prepared weights,
argument arrays built once), and checked against a float64 direct convolution.

    python3 bench/sanitize.py [TOOL ...]     # GPU; default: memcheck racecheck synccheck
    python3 bench/sanitize.py --list         # the cases (no GPU needed)

Prints one line per tool and writes ``bench/results/<gpu>/sanitize.json`` (``--json``), the
logs beside it in ``sanitize/<tool>.log``; exits 1 if any tool reports an error, a case fails
or a run does not finish, 2 if compute-sanitizer is not found (``COMPUTE_SANITIZER=path``
picks the binary).  Under the sanitizer this file runs itself with ``--cases``: CuPy's memory
pool is turned off, so every buffer is its own allocation and memcheck sees exact bounds, and
the megakernel's watchdog limit (``$MEGAWINO_WATCHDOG_S``) is 600 s when unset: under the
sanitizer a wait takes far longer than the usual limit.
"""
import argparse
import glob
import json
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

try:
    import megawino  # noqa: F401
except ImportError:       # run from a checkout without installing
    sys.path.append(str(Path(__file__).resolve().parent.parent))

import numpy as np  # noqa: E402

from megawino.core.spec import LayerSpec  # noqa: E402
from megawino.core.tasks import TaskParams  # noqa: E402
from megawino.schedule.mapping import MappingParams  # noqa: E402
from megawino.core.winograd import direct_conv_nchw, rel_l2  # noqa: E402
from megawino.gpu.call_checks import ENV_WATCHDOG  # noqa: E402

SANITIZER_WATCHDOG_S = "600"
# Relative L2 error that says the run did its work (the tests hold tighter bounds; here the
# point is memory and synchronisation errors).
TOLERANCE = 1e-4
ODD_PARAMS = TaskParams(m=4, tiles_per_group=128, input_channels_per_task=20, gemm_k_per_task=36,
                        output_k_per_task=12, filter_pairs_per_task=100, input_tiles_per_task=32,
                        output_tiles_per_task=16)

# Task sizes with K blocks of 100 columns (the split BF16x3 tile's 128-column tiles, partly past
# the block) and groups of 64 tiles (enough groups for a ring of V and M slots).
WIDE_PARAMS = TaskParams(m=4, tiles_per_group=64, input_channels_per_task=24, gemm_k_per_task=100,
                         output_k_per_task=40, filter_pairs_per_task=700, input_tiles_per_task=32,
                         output_tiles_per_task=16)
RING = {"mapping": MappingParams(8, 24, 1), "ring_buffers": True}
# GEMM_OUTPUT tasks (M in shared memory, U transposed) in 32-tile groups of 16-tile input tasks.
FUSED_PARAMS = TaskParams(m=4, tiles_per_group=32, input_channels_per_task=32, gemm_k_per_task=32,
                          output_k_per_task=32, filter_pairs_per_task=256, input_tiles_per_task=16,
                          fused_output=True)

# (layer, algo, m (None: not Winograd), task params (None: the table / heuristic), gemm_math[,
# further plan arguments])
CASES = [
    (LayerSpec(1, 13, 11, 9, 7), "megakernel", 4, None, "3xtf32"),
    (LayerSpec(1, 13, 11, 9, 7), "nonfused", 4, None, "3xtf32"),
    (LayerSpec(2, 33, 20, 7, 10, padding=0, layout="NHWC"), "megakernel", 2, None, "3xtf32"),
    (LayerSpec(2, 33, 20, 7, 10, padding=0, layout="NHWC"), "nonfused", 2, None, "3xtf32"),
    (LayerSpec(1, 5, 3, 5, 5, padding=2), "megakernel", 2, None, "ffma"),
    (LayerSpec(1, 5, 3, 5, 5, padding=2), "nonfused", 4, None, "ffma"),
    (LayerSpec(2, 40, 44, 13, 11), "megakernel", 4, ODD_PARAMS, "3xtf32"),
    (LayerSpec(2, 40, 44, 13, 11, layout="NHWC"), "nonfused", 4, ODD_PARAMS, "ffma"),
    # BF16x3: split operands on sm_90a (partial pieces, sub-tiles and column tiles), mma.sync elsewhere.
    (LayerSpec(2, 44, 37, 13, 11), "megakernel", 4, ODD_PARAMS, "bf16x3"),
    (LayerSpec(2, 44, 37, 13, 11, layout="NHWC"), "nonfused", 2, None, "bf16x3"),
    (LayerSpec(2, 40, 150, 9, 12), "megakernel", 4, WIDE_PARAMS, "bf16x3"),
    # V and M as a ring of slots: inputs and GEMMs wait for the group whose slot they reuse.
    (LayerSpec(6, 24, 150, 40, 38), "megakernel", 4, WIDE_PARAMS, "bf16x3", RING),
    (LayerSpec(6, 24, 40, 40, 38, layout="NHWC"), "megakernel", 4, WIDE_PARAMS, "3xtf32", RING),
    # GEMM_OUTPUT tasks: C of 3 k tiles, K past one K block, partial tiles.
    (LayerSpec(2, 48, 40, 13, 11), "megakernel", 4, FUSED_PARAMS, "3xtf32"),
    (LayerSpec(2, 48, 40, 13, 11, layout="NHWC"), "nonfused", 4, FUSED_PARAMS, "3xtf32"),
    (LayerSpec(2, 48, 40, 13, 11, layout="NHWC"), "megakernel", 4, FUSED_PARAMS, "3xtf32"),
    # The pointwise path: partial row and column tiles read and written in unpadded tensors.
    (LayerSpec(3, 36, 200, 6, 10, 1, 1, 1, 0), "pointwise", None, None, "3xtf32"),
    (LayerSpec(3, 20, 44, 7, 5, 1, 1, 1, 0, "NHWC"), "pointwise", None, None, "3xtf32"),
]


def describe(case) -> str:
    spec, algo, m, params, gemm_math, *extra = case
    if m is None:
        return f"{spec.describe()} {spec.layout} {algo} {gemm_math}"
    sizes = {None: "default task sizes", ODD_PARAMS: "odd task sizes", WIDE_PARAMS: "wide K blocks",
             FUSED_PARAMS: "GEMM_OUTPUT tasks"}[params]
    ring = " ring buffers" if extra and extra[0].get("ring_buffers") else ""
    return f"{spec.describe()} {spec.layout} {algo} m={m} {gemm_math} {sizes}{ring}"


def run_case(case, rng) -> float:
    """The larger relative L2 error against float64 of the second plan call and of the second
    launcher call."""
    import cupy
    import megawino
    from megawino.core.task_sizes import default_params
    spec, algo, m, params, gemm_math, *extra = case
    if m is None:          # not Winograd: no task params
        plan = megawino.plan(spec, algo=algo, gemm_math=gemm_math)
    else:
        params = params if params is not None else default_params(spec, m)
        plan = megawino.plan(spec, params=params, algo=algo, gemm_math=gemm_math, **(extra[0] if extra else {}))
        if extra and extra[0].get("ring_buffers") and not plan.task_layout.ring:
            raise RuntimeError("the ring case's plan holds every group: no ring was tested")
    x = rng.standard_normal((spec.N, spec.C, spec.H, spec.W)).astype(np.float32)
    w = rng.standard_normal(spec.weight_shape).astype(np.float32)
    x_layout = x if spec.layout == "NCHW" else np.ascontiguousarray(x.transpose(0, 2, 3, 1))
    xd, wd = cupy.asarray(x_layout), cupy.asarray(w)
    for _ in range(2):
        out = cupy.full(spec.output_shape, np.nan, dtype=cupy.float32)
        plan(xd, wd, out=out, check=True)
        plan.check()                         # waits: the calls are asynchronous
    outputs = [out]
    # Then the launcher's path (megawino.torch's later calls): weights prepared under a token,
    # the kernels launched twice from argument arrays built once.
    token = ("sanitize", describe(case))
    plan(xd, wd, out=cupy.empty(spec.output_shape, dtype=cupy.float32), weight_token=token)
    launcher = plan.launcher(xd, wd, token)
    for _ in range(2):
        outputs.append(cupy.full(spec.output_shape, np.nan, dtype=cupy.float32))
        launcher.launch(xd.data.ptr, outputs[-1].data.ptr)
        plan.check()
    ref = direct_conv_nchw(x, w, 1, spec.padding)
    errors = []
    for out in (outputs[0], outputs[-1]):
        y = out.get()
        errors.append(rel_l2(y if spec.layout == "NCHW" else y.transpose(0, 3, 1, 2), ref))
    return max(errors)


def run_cases() -> int:
    """The workload: every case, one ``driver:`` line each; 1 if any case fails."""
    import cupy
    cupy.cuda.set_allocator(None)            # no pool: memcheck sees each buffer's bounds
    os.environ.setdefault(ENV_WATCHDOG, SANITIZER_WATCHDOG_S)
    print(f"driver: watchdog {os.environ[ENV_WATCHDOG]} s per wait, {len(CASES)} cases", flush=True)
    rng = np.random.default_rng(0)
    failed = 0
    for i, case in enumerate(CASES):
        try:
            err = run_case(case, rng)
            ok = err < TOLERANCE             # False for NaN (an unwritten output)
            why = f"rel. L2 error {err:.2e}"
        except Exception as exc:             # a launch error or the watchdog
            ok, why = False, f"{type(exc).__name__}: {exc}"
        failed += not ok
        print(f"driver: {'ok' if ok else 'FAILED'} case {i}: {describe(case)}: {why}", flush=True)
    print(f"driver: {len(CASES) - failed}/{len(CASES)} cases ok", flush=True)
    return 1 if failed else 0


def find_sanitizer() -> str | None:
    found = os.environ.get("COMPUTE_SANITIZER") or shutil.which("compute-sanitizer")
    for candidate in [found] + sorted(glob.glob("/usr/local/cuda*/bin/compute-sanitizer")):
        if candidate and os.access(candidate, os.X_OK):
            return candidate
    return None


def summarise_log(tool: str, log: str) -> dict:
    """Errors reported and cases passed, from one tool's log (None errors: it did not finish)."""
    errors = re.findall(r"^========= ERROR SUMMARY: (\d+) error", log, re.M)
    race = re.findall(r"^========= RACECHECK SUMMARY: (.*)$", log, re.M)
    if not errors and tool == "racecheck" and race:
        # racecheck closes with its own line: "N hazards displayed (E errors, W warnings)".
        errors = re.findall(r"\((\d+) errors", race[-1])
    return {"errors": int(errors[-1]) if errors else None,
            "cases_ok": len(re.findall(r"^driver: ok", log, re.M)), "cases": len(CASES),
            "racecheck_summary": race[-1] if race else None}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 epilog="tools: memcheck, racecheck, synccheck, initcheck")
    ap.add_argument("tools", nargs="*", default=["memcheck", "racecheck", "synccheck"])
    ap.add_argument("--list", action="store_true", help="print the cases and exit")
    ap.add_argument("--cases", action="store_true", help="run the cases here (what the sanitizer runs)")
    ap.add_argument("--json", default=None, help="results file (default bench/results/<gpu>/sanitize.json)")
    args = ap.parse_args(argv)
    if args.list:
        for i, case in enumerate(CASES):
            print(f"{i}: {describe(case)}")
        return 0
    if args.cases:
        return run_cases()
    sanitizer = find_sanitizer()
    if sanitizer is None:
        print("sanitize: compute-sanitizer not found (set COMPUTE_SANITIZER=/path/to/compute-sanitizer)",
              file=sys.stderr)
        return 2
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from common import results_path
    out = Path(args.json) if args.json else results_path("sanitize")
    logs = out.parent / "sanitize"
    logs.mkdir(parents=True, exist_ok=True)
    version = subprocess.run([sanitizer, "--version"], capture_output=True, text=True).stdout.strip()
    print(f"sanitize: {version.splitlines()[-1] if version else sanitizer}, {len(CASES)} cases, logs in {logs}")
    results, status = {}, 0
    for tool in args.tools:
        t0 = time.monotonic()
        proc = subprocess.run([sanitizer, "--tool", tool, "--print-limit", "1000", sys.executable,
                               str(Path(__file__).resolve()), "--cases"],
                              capture_output=True, text=True, env=dict(os.environ, PYTHONUNBUFFERED="1"))
        log = proc.stdout + proc.stderr
        (logs / f"{tool}.log").write_text(log)
        row = {**summarise_log(tool, log), "exit": proc.returncode, "seconds": round(time.monotonic() - t0)}
        results[tool] = row
        ok = row["errors"] == 0 and row["cases_ok"] == len(CASES) and proc.returncode == 0
        status |= not ok
        found = "no ERROR SUMMARY: the run did not finish" if row["errors"] is None else f"{row['errors']} errors"
        print(f"sanitize: {tool:9s} {found}; {row['cases_ok']}/{len(CASES)} cases ok; exit {proc.returncode}; "
              f"{row['seconds']} s")
    out.write_text(json.dumps({"tool": "bench/sanitize.py", "sanitizer": version, "ok": not status,
                               "cases": [describe(c) for c in CASES], "tools": results}, indent=1) + "\n")
    print(f"wrote {out}")
    return int(status)


if __name__ == "__main__":
    sys.exit(main())
