"""Where a small layer's megakernel time goes outside its tasks: CUDA-event times of
(1) an empty kernel of the megakernel's grid and block, with no and with all of GemmSmem,
(2) the same grid running the megakernel's exit protocol (every block adds to one counter, the
last one writes four words to pinned host memory behind a system fence, as sched_exit does),
(3) the megakernel and the non-fused path on small layers, and the traced megakernel's span from
its first ticket fetch to its last task end (the rest of the event time is launch and exit).

``python bench/experiments/launch_overhead.py [--json PATH] [--reps 50]``
"""
import argparse
import json
import sys
from pathlib import Path

try:
    import megawino  # noqa: F401
except ImportError:       # run from a checkout without installing
    sys.path.append(str(Path(__file__).resolve().parents[2]))

import numpy as np  # noqa: E402

from megawino.core.spec import LayerSpec  # noqa: E402
from megawino.gpu.timing import rotated_inputs, time_cuda_stats  # noqa: E402

SOURCE = r"""
extern "C" __global__ void empty_kernel(int* sink) {
  extern __shared__ int smem[];
  if (threadIdx.x == 0 && sink[0] == 12345) smem[0] = 1;   // never true: keeps the kernel
}
extern "C" __global__ void exit_protocol(int* exit_count, volatile int* report) {
  __shared__ int last;
  if (threadIdx.x == 0) {
    __threadfence();
    last = atomicAdd(exit_count, 1) == static_cast<int>(gridDim.x) - 1;
    __threadfence();
  }
  __syncthreads();
  if (!last || threadIdx.x != 0) return;
  for (int i = 0; i < 3; ++i) report[i] = i;
  __threadfence_system();
  report[3] = 1;
  *exit_count = 0;
  __threadfence();
}
"""

SPECS = [LayerSpec(1, 8, 8, 4, 4), LayerSpec(1, 64, 64, 8, 8), LayerSpec(64, 192, 48, 7, 7),
         LayerSpec(1, 512, 512, 7, 7), LayerSpec(1, 64, 64, 56, 56)]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--reps", type=int, default=50)
    ap.add_argument("--json", default=None)
    args = ap.parse_args(argv)
    import cupy
    import megawino
    from megawino.gpu import nvrtc
    rows, traces = {}, {}
    mod = cupy.RawModule(code=SOURCE)
    empty, exit_kernel = mod.get_function("empty_kernel"), mod.get_function("exit_protocol")
    whole = nvrtc.module_int(nvrtc.module("megakernel", 4, "NCHW"), "mw_gemm_smem_bytes")
    empty.max_dynamic_shared_size_bytes = whole
    sms = cupy.cuda.Device().attributes["MultiProcessorCount"]
    grid, block = 2 * sms, nvrtc.BLOCK_THREADS
    sink = cupy.zeros(4, cupy.int32)
    pinned = cupy.cuda.alloc_pinned_memory(64)
    report = np.frombuffer(pinned, np.int32, 16)
    report_ptr = int(pinned.ptr)   # unified addressing: the host pointer serves the device too
    for smem in (0, whole):
        rows[f"empty kernel, {grid} x {block}, {smem} B dynamic smem"] = time_cuda_stats(
            lambda _: empty((grid,), (block,), (sink,), shared_mem=smem), [0], reps=args.reps)["median_us"]
    rows[f"exit protocol, {grid} x {block}"] = time_cuda_stats(
        lambda _: exit_kernel((grid,), (block,), (sink, np.uint64(report_ptr))), [0], reps=args.reps)["median_us"]
    rng = np.random.default_rng(0)
    for spec in SPECS:
        xs, w = rotated_inputs(spec, rng, budget_bytes=256 << 20)
        out = cupy.empty(spec.output_shape, cupy.float32)
        for algo in ("megakernel", "nonfused"):
            plan = megawino.plan(spec, algo=algo)
            rows[f"{spec.shape_string} {algo}"] = time_cuda_stats(
                lambda x: plan(x, w, out=out, check=False), xs, reps=args.reps, check=plan.check)["median_us"]
        traced = megawino.plan(spec, trace=True)
        traced(xs[0], w, out=out)
        cupy.cuda.get_current_stream().synchronize()
        tr = traced.trace()
        rows[f"{spec.shape_string} megakernel traced: first fetch to last end"] = float(tr[:, 3].max() - tr[:, 1].min()) / 1e3
        order = np.asarray(traced.order)
        traces[spec.shape_string] = {"task_type": traced.graph.types[order].tolist(),
                                     "fetch_start_end_ns": (tr[:, 1:4] - tr[:, 1].min()).tolist()}
        del xs
    print(report[:4])
    width = max(map(len, rows))
    for name, us in rows.items():
        print(f"{name:{width}s} {us:9.1f} us")
    if args.json:
        Path(args.json).write_text(json.dumps({"times_us": rows, "traces": traces}) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
