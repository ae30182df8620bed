"""The device side of bench/compare.py: :class:`Bench` sets up CuPy, PyTorch (cuDNN),
ctypes cuDNN and megawino.runtime once, then runs every backend of a layer, each
guarded (one failure = one "n/a" column, a lost CUDA context marks the rest).

Importing this module needs neither CuPy nor PyTorch: :class:`Bench` imports them.
compare.py, which imports it, turns TF32 off (``CUPY_TF32=0``) before anything does; PyTorch's
TF32 is on only while a ``cudnn_tf32_*`` column runs.
"""
from __future__ import annotations

import os
import sys
import time
import traceback
from pathlib import Path

BENCH_DIR = Path(__file__).resolve().parent
REPO_ROOT = BENCH_DIR.parent
if str(BENCH_DIR) not in sys.path:
    sys.path.insert(0, str(BENCH_DIR))

import compare_gemm  # noqa: E402
from common import (CUDNN_ALGOS, L2_BYTES_DEFAULT, CudnnLegacy, NotAvailable, find_loaded_library,  # noqa: E402
                    free_gpu_memory, git_commit, gpu_rel_l2, layer_record, rotation_sets, set_fp32_precision,
                    short_error, time_cuda_stats)
from megawino.gpu import weights  # noqa: E402
from megawino.gpu.nvrtc import DEFAULT_GEMM_MATH  # noqa: E402
from megawino.core.task_sizes import default_params  # noqa: E402
from megawino.core.tasks import Layout  # noqa: E402

# TF32 products carry about 1e-3 relative error: above this a TF32 output is wrong, not rounded.
TF32_TOLERANCE = 1e-2


# ---------------------------------------------------------------------------
# Device side: every backend guarded, one failure = one "n/a" column
# ---------------------------------------------------------------------------

def _entry_for(err: BaseException) -> dict:
    if isinstance(err, NotAvailable):
        return {"status": f"n/a ({err})"}
    return {"status": f"n/a: {short_error(err)}"}


class Bench:
    """CuPy, PyTorch (cuDNN), ctypes cuDNN and megawino.runtime, set up once."""

    def __init__(self, args, primary: str):
        import cupy
        self.cp, self.args, self.primary = cupy, args, primary
        self.dead: str | None = None           # set when the CUDA context is lost
        env: dict = {"python": sys.version.split()[0], "cupy": cupy.__version__,
                     "CUPY_TF32": os.environ.get("CUPY_TF32"), "git_commit": git_commit(REPO_ROOT)}
        props = cupy.cuda.runtime.getDeviceProperties(0)
        name = props.get("name", b"?")
        env["gpu"] = name.decode(errors="replace") if isinstance(name, bytes) else str(name)
        env.update(sms=props.get("multiProcessorCount"), l2_bytes=props.get("l2CacheSize"),
                   memory_bytes=props.get("totalGlobalMem"), cuda_runtime=cupy.cuda.runtime.runtimeGetVersion(),
                   cuda_driver=cupy.cuda.runtime.driverGetVersion())
        self.l2 = int(props.get("l2CacheSize") or L2_BYTES_DEFAULT)
        try:
            import megawino
            env["megawino"] = getattr(megawino, "__version__", "?")
            from megawino import runtime
            self.rt, self.rt_error = runtime, None
        except Exception as err:
            self.rt, self.rt_error = None, short_error(err)
            env["runtime_error"] = self.rt_error
        self.torch = self.cudnn = None
        self.torch_error = self.cudnn_error = None
        try:
            import torch
            if not torch.cuda.is_available():
                raise RuntimeError("torch.cuda.is_available() is False")
            torch.backends.cudnn.benchmark = True
            set_fp32_precision("ieee")
            env.update(torch=torch.__version__, torch_cuda=torch.version.cuda,
                       cudnn=torch.backends.cudnn.version())
            t_stream = int(torch.cuda.current_stream().cuda_stream)
            if t_stream != int(cupy.cuda.get_current_stream().ptr):   # one stream for all
                self._stream = cupy.cuda.ExternalStream(t_stream)
                self._stream.use()
            self.torch = torch
        except Exception as err:
            self.torch_error = short_error(err)
            env["torch_error"] = self.torch_error
        self.stream_ptr = int(cupy.cuda.get_current_stream().ptr)
        if self.torch is not None and "legacy" in args.backends:
            try:
                t = self.torch.randn(2, 8, 12, 12, device="cuda")          # loads libcudnn
                self.torch.nn.functional.conv2d(t, self.torch.randn(8, 8, 3, 3, device="cuda"), padding=1)
                self.torch.cuda.synchronize()
                path = self.cudnn_library() or "libcudnn.so.9"
                self.cudnn = CudnnLegacy(path)
                env.update(cudnn_legacy_lib=path, cudnn_legacy_version=self.cudnn.version)
            except Exception as err:
                self.cudnn_error = short_error(err)
                env["cudnn_legacy_error"] = self.cudnn_error
        self.environment = env
        self.gemm_math = getattr(args, "gemm_math", DEFAULT_GEMM_MATH)
        self.settings = {"torch_cudnn_benchmark": True, "tf32": "cudnn_tf32_* columns only",
                         "cudnn_legacy_math": "FMA (3)", "megawino_gemm_math": self.gemm_math,
                         "stream": self.stream_ptr, "l2_bytes_for_rotation": self.l2,
                         "rotation": "ceil(3 * L2 / bytes of x) input sets, >= 2, <= 64, within budget"}

    def cudnn_library(self) -> str | None:
        """The libcudnn PyTorch loaded, for the legacy API (None: not found)."""
        return find_loaded_library()

    # ---- guards ----------------------------------------------------------
    def guard(self, backends: dict, key: str, fn):
        """Run ``fn() -> dict``; on failure record "n/a" and check the context."""
        if self.dead:
            backends[key] = {"status": f"n/a (CUDA context lost: {self.dead})"}
            return None
        try:
            entry = dict(fn())
            entry.setdefault("status", "ok")
            backends[key] = entry
            return entry
        except Exception as err:
            backends[key] = _entry_for(err)
            print(f"    {key}: {backends[key]['status']}", file=sys.stderr, flush=True)
            if not isinstance(err, NotAvailable):
                self._probe_context(key)
            return None

    def _probe_context(self, where: str) -> None:
        try:
            self.cp.cuda.runtime.deviceSynchronize()
        except Exception as err:
            self.dead = f"after {where}: {short_error(err, 200)}"
            print(f"!! CUDA context lost {self.dead}; remaining columns are n/a", file=sys.stderr)

    def _budget(self) -> int:
        free, _ = self.cp.cuda.runtime.memGetInfo()
        return int(min(4 << 30, free // 8))

    def _time(self, fn, inputs, check=None) -> dict:
        return time_cuda_stats(fn, inputs, self.args.warmup, self.args.reps, check=check)

    def _verify(self, entry: dict, y_nchw, ref, tol: float | None = None) -> None:
        """NaN count (outputs were poisoned), rel. L2 vs cuDNN and vs float64 (image 0);
        correct when both are within ``tol`` (default --tol)."""
        cp = self.cp
        entry["nan_count"] = int(cp.isnan(y_nchw).sum())
        if ref.get("cudnn") is not None:
            entry["rel_err_vs_cudnn"] = gpu_rel_l2(y_nchw, ref["cudnn"])
        if ref.get("f64") is not None:
            from megawino.core.winograd import rel_l2
            entry["rel_err_vs_f64"] = rel_l2(cp.asnumpy(y_nchw[0:1]), ref["f64"])
        errs = [e for e in (entry.get("rel_err_vs_cudnn"), entry.get("rel_err_vs_f64")) if e is not None]
        entry["correct"] = entry["nan_count"] == 0 and all(e <= (tol or self.args.tol) for e in errs)

    def _to_nchw(self, y, layout: str):
        return y.transpose(0, 3, 1, 2) if layout == "NHWC" else y

    # ---- one layer ---------------------------------------------------------
    def run_layer(self, spec, index: int) -> dict:
        cp, args = self.cp, self.args
        lay = None
        if spec.winograd_eligible:
            lay = Layout(spec, default_params(spec))
        rec = layer_record(spec, lay)
        b = rec["backends"]
        if self.dead:
            rec["error"] = f"skipped: CUDA context lost {self.dead}"
            return rec
        print(f"-- {spec.name} ({spec.describe()})", file=sys.stderr, flush=True)
        st: dict = {}                                  # live device objects of this layer
        try:
            budget = self._budget()
            nbytes = 4 * spec.N * spec.C * spec.H * spec.W
            n_sets = rotation_sets(nbytes, self.l2, budget_bytes=budget)
            rng = cp.random.RandomState(args.seed + 1000 * index)
            st["xs"] = [rng.standard_normal(spec.input_shape, dtype=cp.float32) for _ in range(n_sets)]
            st["w"] = rng.standard_normal(spec.weight_shape, dtype=cp.float32)
            rec["rotation_sets"] = n_sets
            st["ref"] = {}
            if self.torch is not None:
                self.guard(rec, "reference", lambda: self._reference(spec, st))
            if index < args.f64_layers:
                self.guard(rec, "reference_f64", lambda: self._reference_f64(spec, st))
            if "ours" in args.backends:
                algo = self.primary
                self.guard(b, algo, lambda: self._ours(spec, st, algo))
            if "other_layout" in args.backends and spec.winograd_eligible:
                self.guard(b, self.primary + "_other_layout", lambda: self._ours_other_layout(spec, st))
            if "nonfused" in args.backends and self.primary == "megakernel":
                self.guard(b, "nonfused", lambda: self._ours(spec, st, "nonfused"))
            for backend, precision in (("cudnn", "ieee"), ("cudnn_tf32", "tf32")):
                if backend in args.backends:
                    for suffix, fmt in (("nchw", "nchw"), ("nhwc", "channels_last")):
                        self.guard(b, f"{backend}_{suffix}", lambda: self._cudnn_torch(spec, st, fmt, precision))
            if "legacy" in args.backends:
                for name in args.legacy_algos:
                    self.guard(b, f"cudnn_legacy_{name}", lambda: self._cudnn_legacy(spec, st, name))
            entry = b.get(self.primary)
            if entry and entry.get("status") == "ok" and st.get("plan_" + self.primary) is not None:
                if "prepared" in args.backends:
                    self.guard(b, self.primary + "_prepared", lambda: self._ours_prepared(spec, st))
                self.guard(rec, "repeat", lambda: self._repeat(st, entry))
            for k in ("plan_" + self.primary, "fn_" + self.primary, "t_nchw", "t_any", "ref"):
                st.pop(k, None)
            free_gpu_memory()
            for backend, key, fn in (("gemm_ws", "gemm_ws", compare_gemm.gemm_warp_specialized),
                                     ("gemm_tf32", "gemm_cublas_tf32", compare_gemm.gemm_cublas_tf32)):
                if backend in args.backends:   # the inputs stay: the first runs the non-fused plan on them
                    for k in [k for k in st if k not in ("xs", "w")]:
                        del st[k]
                    free_gpu_memory()
                    self.guard(b, key, lambda: fn(self, spec, st))
            if "gemm" in args.backends:
                self.guard(b, "gemm_ours", lambda: compare_gemm.gemm_ours(self, spec, st))
                st.clear()
                free_gpu_memory()
                self.guard(b, "gemm_cublas", lambda: compare_gemm.gemm_cublas(self, spec, st))
        except Exception as err:
            traceback.print_exc()
            rec["error"] = short_error(err)
            self._probe_context(f"layer {spec.name}")
        finally:
            st.clear()
            free_gpu_memory()
        return rec

    # ---- backends ----------------------------------------------------------
    def _reference(self, spec, st) -> dict:
        torch = self.torch
        tw = torch.from_dlpack(st["w"])
        ts = [torch.from_dlpack(x) for x in st["xs"]]
        if spec.layout == "NHWC":
            ts = [t.permute(0, 3, 1, 2) for t in ts]
        st["t_nchw"] = [t.contiguous() for t in ts]      # views when x is NCHW already
        st["t_any"] = ts
        y = torch.nn.functional.conv2d(st["t_nchw"][0], tw, None, spec.stride, spec.padding)
        st["ref"]["cudnn"] = self.cp.from_dlpack(y.contiguous())
        return {"what": "torch cuDNN float32 NCHW output on input set 0"}

    def _reference_f64(self, spec, st) -> dict:
        from megawino.core.winograd import direct_conv_nchw
        x0 = self._to_nchw(st["xs"][0][0:1], spec.layout)
        t0 = time.perf_counter()
        st["ref"]["f64"] = direct_conv_nchw(self.cp.asnumpy(x0).astype("float64"),
                                            self.cp.asnumpy(st["w"]).astype("float64"),
                                            spec.stride, spec.padding)
        out = {"what": "float64 CPU direct_conv_nchw, image 0", "cpu_s": time.perf_counter() - t0}
        if st["ref"].get("cudnn") is not None:
            from megawino.core.winograd import rel_l2
            out["cudnn_rel_err_vs_f64"] = rel_l2(self.cp.asnumpy(st["ref"]["cudnn"][0:1]), st["ref"]["f64"])
        return out

    def _make_plan(self, spec, algo: str, params=None):
        rt = self.rt
        if rt is None:
            raise NotAvailable(f"megawino.runtime did not import: {self.rt_error}")
        algos = tuple(getattr(rt, "ALGOS", ()))
        if algo == "direct" and "direct" not in algos:
            raise NotAvailable("direct path not built")
        winograd = {} if algo == "direct" else {"gemm_math": self.gemm_math}
        return rt.plan(spec, algo=algo, **winograd, **({} if params is None else {"params": params}))

    def _ours(self, spec, st, algo: str) -> dict:
        entry, st["plan_" + algo], st["fn_" + algo] = self._run_plan(spec, st["xs"], st["w"], algo, st["ref"])
        return entry

    def _run_plan(self, spec, xs, w, algo: str, ref: dict):
        """A plan of ``algo`` for ``spec`` run on ``xs[0]`` (output poisoned, checked), then timed
        over ``xs``: its entry, the plan and the timed call."""
        cp = self.cp
        plan = self._make_plan(spec, algo)
        check = getattr(plan, "check", None)
        y = cp.full(spec.output_shape, cp.nan, dtype=cp.float32)
        out = plan(xs[0], w, out=y, check=True)
        out = y if out is None else out
        cp.cuda.get_current_stream().synchronize()
        source = getattr(plan, "choice", None)      # where a Winograd plan's parameters came from
        entry = {"algo": algo, "plan": repr(plan), "layout": spec.layout,
                 "parameters_from": source.as_dict() if hasattr(source, "as_dict") else None,
                 "blocks_per_sm": getattr(plan, "blocks_per_sm", None), "grid": getattr(plan, "grid", None)}
        self._verify(entry, self._to_nchw(out, spec.layout), ref)
        fn = lambda x: plan(x, w, out=y, check=False)  # noqa: E731
        entry.update(self._time(fn, xs, check=check))
        return entry, plan, fn

    def _ours_other_layout(self, spec, st) -> dict:
        """The primary algorithm in the other layout (NHWC for an NCHW run, and back) on
        transposed copies of the same inputs, as a model in that memory format runs it: the
        cuDNN columns time both layouts too."""
        other = spec.with_(layout="NHWC" if spec.layout == "NCHW" else "NCHW")
        axes = (0, 2, 3, 1) if other.layout == "NHWC" else (0, 3, 1, 2)
        xs = [self.cp.ascontiguousarray(x.transpose(axes)) for x in st["xs"]]
        try:
            return self._run_plan(other, xs, st["w"], self.primary, st["ref"])[0]
        finally:
            del xs
            free_gpu_memory()

    def _ours_prepared(self, spec, st) -> dict:
        """The primary plan as a converted model calls it, the weight prepared once under a token
        (no filter tasks); checked, and against the plain call's bits on the same input."""
        cp, plan, w, token = self.cp, st["plan_" + self.primary], st["w"], ("bench/compare.py", spec.name)
        plain, y = plan(st["xs"][0], w, check=True), cp.empty(spec.output_shape, dtype=cp.float32)
        try:
            for _ in range(2):          # the first call prepares the weight, the second is checked
                y.fill(cp.nan)
                plan(st["xs"][0], w, out=y, check=True, weight_token=token)
            entry = {"algo": self.primary, "weight_token": True, "bits_equal_plain": bool((y == plain).all())}
            self._verify(entry, self._to_nchw(y, spec.layout), st["ref"])
            fn = lambda x: plan(x, w, out=y, check=False, weight_token=token)  # noqa: E731
            entry.update(self._time(fn, st["xs"], check=getattr(plan, "check", None)))
            return entry
        finally:
            weights.CACHE.clear()       # the prepared U of this layer only

    def _repeat(self, st, entry: dict) -> dict:
        plan = st["plan_" + self.primary]
        again = self._time(st["fn_" + self.primary], st["xs"], check=getattr(plan, "check", None))
        a, b = entry["median_us"], again["median_us"]
        entry["repeat_median_us"] = b
        entry["repeat_spread"] = abs(a - b) / min(a, b)
        return {"what": f"{self.primary} timed again after the other columns",
                "median_us": b, "spread": entry["repeat_spread"]}

    def _cudnn_torch(self, spec, st, fmt: str, precision: str = "ieee") -> dict:
        """PyTorch's conv2d in ``fmt``; "tf32" (PyTorch's default) is on for this column alone."""
        torch = self.torch
        if torch is None:
            raise NotAvailable(f"PyTorch unavailable: {self.torch_error}")
        if "t_any" not in st:
            raise NotAvailable("reference run failed (see 'reference')")
        tw = torch.from_dlpack(st["w"])
        if fmt == "nchw":
            ts, tw = st["t_nchw"], tw.contiguous()
        else:
            cl = torch.channels_last
            ts, tw = [t.contiguous(memory_format=cl) for t in st["t_any"]], tw.contiguous(memory_format=cl)
        conv = torch.nn.functional.conv2d
        fn = lambda t: conv(t, tw, None, spec.stride, spec.padding)  # noqa: E731
        set_fp32_precision(precision)
        try:
            y = fn(ts[0])
            entry = {"memory_format": fmt, "fp32_precision": precision}
            self._verify(entry, self.cp.from_dlpack(y.contiguous()), st["ref"],
                         TF32_TOLERANCE if precision == "tf32" else None)
            del y
            entry.update(self._time(fn, ts))
        finally:
            set_fp32_precision("ieee")
        return entry

    def _cudnn_legacy(self, spec, st, name: str) -> dict:
        cp = self.cp
        if self.cudnn is None:
            raise NotAvailable(f"cuDNN legacy API unavailable: {self.cudnn_error or 'PyTorch unavailable'}")
        if "t_nchw" not in st:
            raise NotAvailable("reference run failed (see 'reference')")
        if name.startswith("winograd") and not spec.winograd_eligible:
            raise NotAvailable("Winograd needs 3x3 stride 1")
        conv = self.cudnn.conv(spec, CUDNN_ALGOS[name], self.stream_ptr)
        try:
            ws = cp.empty(max(conv.workspace, 1), dtype=cp.uint8)
            y = cp.full((spec.N, spec.K, spec.out_h, spec.out_w), cp.nan, dtype=cp.float32)
            ptrs = [t.data_ptr() for t in st["t_nchw"]]
            wp, yp, wsp = st["w"].data.ptr, y.data.ptr, ws.data.ptr
            conv.run(ptrs[0], wp, yp, wsp)
            cp.cuda.get_current_stream().synchronize()
            entry = {"algo": CUDNN_ALGOS[name], "math_type": 3, "workspace_bytes": conv.workspace,
                     "layout": "NCHW"}
            self._verify(entry, y, st["ref"])
            entry.update(self._time(lambda p: conv.run(p, wp, yp, wsp), ptrs))
            return entry
        finally:
            conv.close()

    def close(self) -> None:
        try:
            if self.cudnn is not None:
                self.cudnn.close()
        except Exception:
            pass
