"""Plans: one layer shape on the GPU, ready to launch many times.

* :class:`Plan` runs a Winograd layer as the persistent megakernel or as the four non-fused
  kernels; :class:`DirectPlan` runs the direct path.
* Calls are asynchronous on CuPy's current stream.  Each stream gets its own workspace (the
  buffers V and M, the scheduler's counters and state, the parameter blocks), so calls on two
  streams or from two threads never share scratch memory.
* With a ``weight_token`` the prepared weights (U, or the direct path's packed filters) are
  reused while the token stays the same; the megakernel then runs the graph without its filter
  tasks.  While a stream is captured into a CUDA graph the weights are prepared inside the
  captured work, so replays follow later changes of the weight memory.
* A megakernel launch whose watchdog fired is reported by the next call of the plan (launches
  whose status has arrived) or by :meth:`Plan.check` / ``megawino.synchronize()``.
"""
from __future__ import annotations

import dataclasses
import threading
import weakref

import numpy as np

from ..core import abi, task_types
from ..tuning import choice as tuning_choice
from . import identity as gpu_identity, route, weights, workspace
from .launch import KernelLaunch, Launcher
from ..schedule.mapping import resolve_order, ring_buffer_groups, without_filter_tasks
from .nvrtc import (BLOCK_THREADS, DEFAULT_GEMM_MATH, WINOGRAD_ALGOS, GemmSmemKernel, blocks_per_sm, check_gemm_math,
                    cupy_module, gemm_output_tasks_allowed, module, operand_format)
from ..core.spec import LayerSpec
from ..core.task_sizes import build_graph
from ..core.task_graph import TaskGraph
from ..core.tasks import Layout, TaskParams, TaskType, channel_stride
from .call_checks import check_timeout_s, default_timeout_s, prepare_call, require_gpu
from .workspace import WatchdogError, workspace_needs_ring


_LIVE_PLANS: "weakref.WeakSet" = weakref.WeakSet()


class _GraphForm:
    """Task records and ticket order of the graph, full or without filter tasks, on the device."""

    def __init__(self, graph: TaskGraph, order: np.ndarray):
        cupy = cupy_module()
        self.graph = graph
        self.num_tasks = graph.num_tasks
        self.records = cupy.asarray(np.ascontiguousarray(graph.records, dtype=np.int32))
        self.mapping = cupy.asarray(np.ascontiguousarray(order, dtype=np.int32))
        self.ticket_records = cupy.asarray(np.ascontiguousarray(graph.records[order], dtype=np.int32))

    def describe(self, task: int) -> str:
        return self.graph.describe_task(task) if 0 <= task < self.num_tasks else f"task {task}"


class Plan:
    """One Winograd layer shape on the GPU.  ``plan(x, w)`` runs it (asynchronously)."""

    evicted = False              # dropped from the runtime's plan cache

    def __init__(self, spec: LayerSpec, params: TaskParams | None = None, mapping=None,
                 algo: str = "megakernel", timeout_s: float | None = None, trace: bool = False,
                 gemm_math: str = DEFAULT_GEMM_MATH, ring_buffers: bool | None = None):
        if not isinstance(spec, LayerSpec):
            raise ValueError(f"spec must be a LayerSpec, got {type(spec).__name__}")
        spec.require_winograd()
        if algo not in WINOGRAD_ALGOS:
            raise ValueError(f"algo must be one of {WINOGRAD_ALGOS}, got {algo!r}")
        if timeout_s is None:
            timeout_s = default_timeout_s()
        timeout_s = check_timeout_s(timeout_s)
        if not isinstance(trace, bool):
            raise ValueError(f"trace must be True or False, got {trace!r}")
        if trace and algo != "megakernel":
            raise ValueError("trace=True needs algo='megakernel'")
        if params is not None and not isinstance(params, TaskParams):
            raise ValueError(f"params must be a TaskParams, got {type(params).__name__}")
        if not (ring_buffers is None or isinstance(ring_buffers, bool)) or (ring_buffers and algo != "megakernel"):
            raise ValueError(f"ring_buffers must be None (automatic), True or False, and True needs "
                             f"algo='megakernel' (got {ring_buffers!r}, algo={algo!r})")
        self.gemm_math = check_gemm_math(gemm_math)
        cupy = require_gpu()
        if workspace.is_capturing():
            raise ValueError("a plan cannot be made while the stream is captured into a CUDA graph: "
                             "call the layer once before capturing")
        self.spec, self.algo, self.traced = spec, algo, trace
        self.timeout_s = float(timeout_s)
        self.device = cupy.cuda.Device().id
        m = params.m if params is not None else 4
        mod = module(algo, m, spec.layout, trace, self.gemm_math)
        # U and V as megawino.core.abi describes them: float32, or split BF16 (U transposed) where
        # the build's GEMM multiplies BF16x3 on warpgroup MMAs.
        self.operand_format = operand_format(mod)
        sms = cupy.cuda.Device().attributes["MultiProcessorCount"]
        c_stride = channel_stride(spec.C)   # the GEMM's depth: its ring's shared memory
        if algo == "megakernel":
            self._mega = GemmSmemKernel.winograd(mod, "mw_megakernel", c_stride)
            self.blocks_per_sm = blocks_per_sm(self._mega)
        else:
            self._kernels = {type_info.code: GemmSmemKernel.winograd(mod, type_info.kernel_name, c_stride)
                             if type_info.nonfused_gemm_smem else mod.get_function(type_info.kernel_name)
                             for type_info in task_types.registered() if type_info.on_device}
            self._kernels[TaskType.GEMM_OUTPUT].reserve_gemm_output()
            self.blocks_per_sm = blocks_per_sm(self._kernels[TaskType.GEMM])
        self.workers = sms * max(1, self.blocks_per_sm)
        # Parameters: given, else this GPU's or its architecture's tables, else the heuristic.
        self.choice = tuning_choice.GIVEN
        fused_ok = gemm_output_tasks_allowed(self.gemm_math) and not ring_buffers   # GEMM_OUTPUT tasks may run
        if params is None or mapping is None:
            chosen_params, chosen_mapping, self.choice = tuning_choice.choose_for_gpu(
                spec, gpu_identity.current_identity(), self.gemm_math, m, self.workers, fused_output=fused_ok)
            params = chosen_params if params is None else params
            mapping = chosen_mapping if mapping is None else mapping
        if params.fused_output and not fused_ok:
            raise ValueError(f"params.fused_output (GEMM_OUTPUT tasks) runs 3xTF32 products without a ring of "
                             f"buffers, got gemm_math={self.gemm_math!r}, ring_buffers={ring_buffers!r}")
        if ring_buffers is None:
            ring_buffers = algo == "megakernel" and params.buffer_groups is None and not params.fused_output \
                and workspace_needs_ring(Layout(spec, params), cupy.cuda.Device().mem_info[1])
        if params.fused_output:
            self.operand_format = "float32_u_transposed"
            if algo == "megakernel":   # its products wait in shared memory
                self._mega.reserve_gemm_output()
                self.blocks_per_sm = blocks_per_sm(self._mega)
                self.workers = sms * max(1, self.blocks_per_sm)
        if ring_buffers:
            whole = build_graph(spec, dataclasses.replace(params, buffer_groups=None))
            params = dataclasses.replace(params, buffer_groups=ring_buffer_groups(whole, resolve_order(whole, mapping)))
        self.params = params
        self.graph = build_graph(spec, self.params)
        if self.graph.layout.ring and algo != "megakernel":
            raise ValueError(f"params.buffer_groups={params.buffer_groups} makes V and M a ring of "
                             f"{self.graph.layout.buffer_groups} of {self.graph.layout.num_groups} groups, "
                             "which only the megakernel's waits allow: use algo='megakernel' or "
                             "buffer_groups=None")
        self.task_layout = self.graph.layout   # buffers, task counts, counters (spec.layout: NCHW / NHWC)
        # Validate the mapping on the host before anything is allocated or launched.
        self.order = resolve_order(self.graph, mapping)
        self._full = _GraphForm(self.graph, self.order)
        self._prepared = _GraphForm(*without_filter_tasks(self.graph, self.order))
        cupy.cuda.get_current_stream().synchronize()   # other streams read these arrays too
        params_bytes = len(abi.PARAM_FIELDS) * 8
        self.pinned = workspace.PinnedArena(64 * params_bytes)
        self._status = workspace.StatusRing() if algo == "megakernel" else None
        self._workspaces: dict[int, workspace.PlanWorkspace] = {}
        self.captured = False          # a CUDA graph holds its workspaces: never evicted
        self._lock = threading.RLock()
        # Task ids of one type are contiguous: (first id, count) per type.
        self._type_range = {}
        for type_info in task_types.registered():
            ids = np.flatnonzero(self.graph.types == type_info.code)
            self._type_range[type_info.code] = (int(ids[0]) if ids.size else 0, int(ids.size))
            if ids.size and not np.array_equal(ids, np.arange(ids[0], ids[0] + ids.size)):
                raise RuntimeError(f"task ids of type {type_info.name} are not contiguous")
        _LIVE_PLANS.add(self)

    # ---- buffers -------------------------------------------------------
    def workspace(self) -> workspace.PlanWorkspace:
        """The current stream's workspace (made on first use)."""
        return self._workspace(workspace.current_stream_ptr(), workspace.is_capturing())

    def _workspace(self, stream: int, capturing: bool) -> workspace.PlanWorkspace:
        with self._lock:
            ws = self._workspaces.get(stream)
            if ws is None:
                ws = self._workspaces[stream] = workspace.PlanWorkspace(self, capturing)
            elif ws.created_in_capture and not capturing:
                ws.initialize()               # its first initialisation only runs in replays
                ws.created_in_capture = False
        return ws

    @property
    def U(self):
        return self.workspace().U

    @property
    def V(self):
        return self.workspace().V

    @property
    def M(self):
        return self.workspace().M

    def param_values(self, ws: workspace.PlanWorkspace, form: _GraphForm, U) -> np.ndarray:
        spec, lay, par = self.spec, self.task_layout, self.params
        values = {
            "U": U.data.ptr, "V": ws.V.data.ptr, "Mbuf": ws.M.data.ptr,
            "records": form.records.data.ptr, "mapping": form.mapping.data.ptr,
            "ticket_records": form.ticket_records.data.ptr,
            "counters": ws.counters.data.ptr, "state": ws.state.data.ptr,
            "trace": ws.trace.data.ptr if ws.trace is not None else 0,
            "N": spec.N, "C": spec.C, "K": spec.K, "H": spec.H, "W": spec.W, "pad": spec.padding,
            "out_h": spec.out_h, "out_w": spec.out_w,
            "tiles_h": lay.tiles_h, "tiles_w": lay.tiles_w, "tiles": lay.tiles,
            "tiles_per_group": par.tiles_per_group,
            "buffer_groups": lay.buffer_groups, "buffer_tiles": lay.buffer_tiles,
            "c_stride": lay.c_stride, "k_stride": lay.k_stride,
            "input_channels_per_task": par.input_channels_per_task,
            "gemm_k_per_task": par.gemm_k_per_task, "k_blocks": lay.k_blocks,
            "output_k_per_task": par.output_k_per_task,
            "filter_pairs_per_task": par.filter_pairs_per_task,
            "input_tiles_per_task": par.input_tiles_per_task,
            "output_tiles_per_task": par.output_tiles_per_task,
            "num_tasks": form.num_tasks, "num_counters": lay.num_counters,
            "timeout_ns": int(round(self.timeout_s * 1e9)),
            "u_transposed": int(self.operand_format == "float32_u_transposed"),
        }
        return np.array([int(values[name]) for name, _ in abi.PARAM_FIELDS], dtype=np.int64)

    # ---- running -------------------------------------------------------
    def __call__(self, x, w, out=None, check: bool = True, weight_token=None):
        """Launch the layer through the plan's route (megawino.gpu.route) on the current stream,
        return ``out`` (allocated when None) without waiting.  ``check``: first raise for a launch
        whose watchdog fired (its status arrived); ``weight_token``: see megawino.gpu.weights."""
        x, ready_w, out = prepare_call(self.spec, self.device, x, w, out, check, weight_token)
        return route.launch(self, x, ready_w, out, check, weight_token, copied_weight=ready_w is not w)

    def run(self, x, w, out, check: bool = True, weight_token=None):
        """One launch on arrays already checked and made ready (``call_checks.prepare_call``), the
        weight prepared under ``weight_token``: what a route runs until its launcher is bound."""
        with self._lock:
            if check:
                self._raise_reports(done_only=True)
            stream = workspace.current_stream_ptr()
            capturing = workspace.is_capturing()
            ws = self._workspace(stream, capturing)
            self.captured = self.captured or capturing
            entry = None
            if weight_token is None:
                U, prepared = ws.U, False
            else:
                entry = weights.CACHE.get(self._weight_key(weight_token), self.task_layout.u_shape)
                U, prepared = entry.array, entry.ready and not capturing
                entry.pinned = entry.pinned or capturing
                if prepared:
                    entry.wait_on(stream)
            # The non-fused kernels index records by task id: they keep the full graph and only
            # skip the filter stage.
            form = self._prepared if prepared and self.algo == "megakernel" else self._full
            pbuf = ws.params(self, form, U)
            if self.algo == "megakernel":
                grid = max(1, min(form.num_tasks, self.workers))
                report = self._status.claim(id(ws), capturing, form.describe)
                try:
                    self._mega((grid,), (BLOCK_THREADS,), (pbuf, x, w, out, np.uint64(report)))
                except BaseException:
                    self._status.abandon(report)
                    raise
            else:
                arrays = {"w": w, "x": x, "y": out}
                for type_info in self._stages(prepared):
                    self._launch(pbuf, type_info.code, arrays.get(type_info.kernel_array))
            if entry is not None and not entry.ready and not capturing:
                entry.mark_ready(stream)
        return out

    def launcher(self, x, w, weight_token=None):
        """A :class:`megawino.gpu.launch.Launcher` of :meth:`run` (``check=True``) for inputs and
        outputs of the plan's shapes on the current stream, with the weight ``w`` transformed under
        ``weight_token`` (None until that is ready); ``x`` stands for every later input."""
        entry = weights.CACHE.ready(self._weight_key(weight_token))
        if entry is None or workspace.is_capturing():
            return None
        stream = workspace.current_stream_ptr()
        with self._lock:
            ws = self._workspace(stream, False)
            form = self._prepared if self.algo == "megakernel" else self._full
            pbuf = ws.params(self, form, entry.array)
        entry.wait_on(stream)
        keep = (self, ws, pbuf, entry, w)
        if self.algo == "megakernel":
            grid = max(1, min(form.num_tasks, self.workers))
            args = (pbuf, x, w, np.uint64(0), np.uint64(0))   # the output and status slot: per call

            def claim(launches):
                self._raise_reports(done_only=True)
                report = self._status.claim(id(ws), False, form.describe)
                launches[0].set(len(args) - 1, report)
                return report

            def release(report, launched):
                if not launched:
                    self._status.abandon(report)
            mega = KernelLaunch(self._mega, (grid,), (BLOCK_THREADS,), args, stream)
            return Launcher([mega], [(0, 1)], [(0, 3)], before=claim, after=release, lock=self._lock,
                            keep=keep)
        launches, x_slots, out_slots = [], [], []
        arrays = {"w": w, "x": x, "y": np.uint64(0)}
        for type_info in self._stages(prepared=True):
            stage = self._stage_launch(pbuf, type_info.code, arrays.get(type_info.kernel_array))
            if stage is None:
                continue
            slots = {"x": x_slots, "y": out_slots}.get(type_info.kernel_array)
            if slots is not None:
                slots.append((len(launches), 1))
            launches.append(KernelLaunch(self._kernels[type_info.code], *stage, stream))
        return Launcher(launches, x_slots, out_slots, keep=keep)

    def _weight_key(self, weight_token):
        return ("winograd", self.device, weight_token, self.task_layout.u_shape, self.operand_format)

    @staticmethod
    def _stages(prepared: bool):
        """The task types the non-fused path launches, in order (the filter stage skipped when
        U is prepared)."""
        return [type_info for type_info in task_types.registered()
                if type_info.on_device and not (prepared and type_info.code == TaskType.FILTER)]

    def _stage_launch(self, pbuf, task_type: int, array=None):
        """(grid, block, arguments) of one non-fused stage's kernel (one block per task), or None
        when it has no tasks."""
        first, count = self._type_range[int(task_type)]
        if not count:
            return None
        takes_array = task_types.info(task_type).kernel_array is not None
        return (count,), (BLOCK_THREADS,), (pbuf,) + ((array,) if takes_array else ()) + (np.int32(first),)

    def _launch(self, pbuf, task_type: int, array=None) -> None:
        stage = self._stage_launch(pbuf, task_type, array)
        if stage is not None:
            self._kernels[int(task_type)](*stage)

    def launch_stage(self, task_type: TaskType, array=None) -> None:
        """Non-fused path: launch one stage's kernel (one block per task) on the current
        stream's workspace.  FILTER takes w, INPUT x, OUTPUT y, GEMM nothing."""
        if self.algo != "nonfused":
            raise RuntimeError("launch_stage needs algo='nonfused'")
        ws = self.workspace()
        self._launch(ws.params(self, self._full, ws.U), task_types.info(task_type).code, array)

    def _raise_reports(self, done_only: bool) -> None:
        if self.algo != "megakernel":
            return
        reports = self._status.collect(done_only)
        if reports:
            raise WatchdogError(f"megakernel watchdog ({self.spec.describe()}, limit {self.timeout_s} s "
                                "per wait): " + "; ".join(reports))

    def check(self) -> None:
        """Wait for the device, then raise RuntimeError for every launch of this plan whose
        watchdog fired since the last check."""
        if workspace.is_capturing():
            raise ValueError("check() synchronizes: it cannot run while the stream is captured")
        cupy_module().cuda.Device(self.device).synchronize()
        with self._lock:
            self._raise_reports(done_only=False)

    def reset(self) -> None:
        """Put counters, ticket head and status of every workspace back to their initial values."""
        cupy = cupy_module()
        cupy.cuda.Device(self.device).synchronize()
        with self._lock:
            for ws in self._workspaces.values():
                ws.initialize()
        cupy.cuda.Device(self.device).synchronize()

    def trace(self) -> np.ndarray:
        """int64 [tickets][4], the fields of ``abi.TRACE_FIELDS``: SM id, fetch time, start time
        after the wait, end time (ns, %globaltimer) of the current stream's last launch."""
        if not self.traced:
            raise RuntimeError("this plan was made without trace=True")
        return self.workspace().trace.get()

    def _debug_break_counter(self, counter_index: int) -> None:
        """Make one counter unreachable (need + 1) for the current stream's next launch only:
        its waiters time out and the watchdog fires."""
        if isinstance(counter_index, bool) or not isinstance(counter_index, (int, np.integer)) \
                or not 0 <= int(counter_index) < self.task_layout.num_counters:
            raise ValueError(f"counter index {counter_index!r} outside 0..{self.task_layout.num_counters - 1}")
        self.workspace().state[abi.state_offset("BREAK")] = int(counter_index)

    def __repr__(self) -> str:
        lay = self.task_layout
        ring = f", ring of {lay.buffer_groups} of {lay.num_groups} groups" if lay.ring else ""
        ring += ", fused_output" if self.params.fused_output else ""
        return (f"Plan({self.spec.describe()}, {self.spec.layout}, m={self.params.m}, algo={self.algo}, "
                f"gemm_math={self.gemm_math}, tasks={self.graph.num_tasks}{ring}, device={self.device}, "
                f"parameters: {self.choice.describe()})")


def synchronize() -> None:
    """Wait for the current device, then raise RuntimeError for every megakernel launch whose
    watchdog fired since it was last checked (any plan, any stream)."""
    cupy = cupy_module()
    if workspace.is_capturing():
        raise ValueError("synchronize() cannot run while the stream is captured into a CUDA graph")
    cupy.cuda.Device().synchronize()
    reports = []
    device = cupy.cuda.runtime.getDevice()
    for plan in list(_LIVE_PLANS):
        if plan.device != device:
            continue
        try:
            with plan._lock:
                plan._raise_reports(done_only=False)
        except WatchdogError as err:
            reports.append(str(err))
    if reports:
        raise WatchdogError("\n".join(reports))
