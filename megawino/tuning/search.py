"""The mapping tuner behind ``megawino tune``.

For each layer (GPU required), within the share of the budget :mod:`megawino.tuning.budget`
gives it:
1. time the heuristic choice, the sequential order and the *seeds*: every shipped table's entry
   for the shape and for near shapes (:func:`seed_configs`: all GPUs' tables, both arithmetics)
   and the choice plans make today (:func:`current_choice`: this GPU's table, a table of its
   architecture, or the heuristic);  these are always measured, whatever the simulator thinks;
2. while the layer's share lasts: run the heuristic choice ``traces`` times with tracing,
   calibrate the simulator's cost model on those timelines (:func:`calibrate_on_traces`),
   simulate every candidate of :func:`megawino.tuning.space.candidate_space` and time the ``top``
   predicted ones, then the ring-buffer form of the fastest (V and M in the fewest group slots);
3. measure the fastest so far again with the heuristic choice, the sequential mapping and the
   current choice, alternating, ``confirm_rounds`` times (:func:`confirm`): the first pass's
   fastest time is the minimum over many noisy candidates, biased low; the medians decide, so an
   entry is never written that measured slower than what the plans would use without it;
4. write the winner, its time and its speed-ups over the heuristic and the sequential mapping
   into the table (by default the user's ``<cache>/<gpu>.json``, see
   :mod:`megawino.core.user_files`).  The sequential order is a candidate too: when it is the
   fastest, the table holds its MappingParams equivalent
   (:func:`megawino.schedule.mapping.sequential_equivalent`, ``sequential_order: true``) and the
   speed-up over sequential is 1 (a tie).
"""
from __future__ import annotations

__all__ = ["calibrate_on_traces", "rank_by_simulation", "confirm", "confirmation_configs", "current_choice",
           "seed_configs", "tune_layer", "tune", "summary"]

import dataclasses
import datetime
import math
import pathlib
import time

import numpy as np

from . import budget, choice, space, table as tuning
from ..gpu import identity as gpu_identity
from ..schedule.mapping import build_interleaved, resolve_order, ring_buffer_groups, sequential_equivalent
from ..core import user_files
from ..schedule.simulator import CostModel, simulate
from ..core.spec import LayerSpec
from ..core.task_sizes import build_graph, default_params
from ..schedule.timeline import Timeline
from ..gpu.nvrtc import DEFAULT_GEMM_MATH, gemm_output_tasks_allowed
from ..gpu.timing import rotated_inputs


def calibrate_on_traces(records, order, graph, blocks_per_sm: int,
                        label: str = "", ceilings=None) -> tuple[CostModel, list[Timeline], float]:
    """The tuner's calibration, shared with ``bench/sim_check.py``: the cost model fitted
    to every raw trace in ``records`` (each [tickets][4] from ``plan.trace()``) pooled, starting
    from ``ceilings`` (megawino.gpu.identity.Ceilings; default the H100's),
    the measured timelines, and the median of their makespans (one trace of a small layer
    is too noisy to calibrate on)."""
    timelines = [Timeline.from_gpu_trace(r, order, graph, label=label) for r in records]
    if not timelines:
        raise ValueError("calibrate_on_traces needs at least one trace")
    start = CostModel.for_ceilings(ceilings) if ceilings is not None else CostModel()
    model = dataclasses.replace(start, residents_per_sm=max(1, int(blocks_per_sm))).calibrate(timelines, graph)
    return model, timelines, float(np.median([t.makespan for t in timelines]))


def rank_by_simulation(spec: LayerSpec, model: CostModel, workers: int, top: int,
                       sim_budget_s: float = 20.0, fused_output: bool = False) -> list[dict]:
    """Candidates to measure, best predicted first: every task-size option with the
    heuristic mapping (the simulator's roofline cannot see how the GEMM tile's
    efficiency changes with task size, so each option is measured), then the best
    simulated mappings of the ``top // 2`` most promising task sizes.  Simulation stops at
    ``sim_budget_s`` (the task sizes simulated by then are ranked)."""
    by_params: dict = {}
    for params, mp in space.candidate_space(spec, workers=workers, fused_output=fused_output):
        by_params.setdefault(params, []).append(mp)
    graphs: dict = {}            # built as the task sizes are simulated
    deadline = time.perf_counter() + sim_budget_s

    def predict(params, mp) -> float:
        graph = graphs[params]
        return simulate(graph, build_interleaved(graph, mp).order, workers, model).makespan

    base = []
    for p in by_params:
        if base and time.perf_counter() > deadline:
            break
        graph = graphs[p] = build_graph(spec, p)
        heuristic = tuning.default_mapping_params(graph.layout, workers)
        base.append({"params": p, "mapping": heuristic, "predicted_us": predict(p, heuristic)})
    base.sort(key=lambda r: r["predicted_us"])
    extra = []
    for cand in base[:max(1, top // 2)]:
        sims = []
        for mp in by_params[cand["params"]]:
            if time.perf_counter() > deadline:
                break
            if mp != cand["mapping"]:
                sims.append({"params": cand["params"], "mapping": mp,
                             "predicted_us": predict(cand["params"], mp)})
        extra += sorted(sims, key=lambda r: r["predicted_us"])[:2]
    # groups_per_column = 1 (one group at a time through the GEMMs) for the best task size is
    # always measured: with few groups, more leaves a tail of output transforms after the last
    # GEMM that the simulator underestimates.
    one = dataclasses.replace(base[0]["mapping"], groups_per_column=1)
    if all(c["mapping"] != one or c["params"] != base[0]["params"] for c in base + extra):
        extra.append({"params": base[0]["params"], "mapping": one,
                      "predicted_us": predict(base[0]["params"], one)})
    return sorted(base + extra, key=lambda r: r["predicted_us"])


def measure_us(runtime, spec, params, mapping, xs, w, reps: int = 10) -> float:
    from ..gpu.timing import time_cuda_stats
    import cupy
    plan = runtime.plan(spec, params=params, mapping=mapping)
    out = cupy.empty(spec.output_shape, dtype=cupy.float32)
    fn = lambda x: plan(x, w, out=out, check=False)  # noqa: E731
    return time_cuda_stats(fn, xs, warmup=3, reps=reps, check=plan.check)["median_us"]


class _GemmMathRuntime:
    """The runtime module with every plan made for one GEMM arithmetic."""

    def __init__(self, runtime, gemm_math: str):
        self._runtime, self._gemm_math = runtime, gemm_math

    def plan(self, *args, **kwargs):
        return self._runtime.plan(*args, gemm_math=self._gemm_math, **kwargs)

    def __getattr__(self, name):
        return getattr(self._runtime, name)


def confirm(measure, names, rounds: int = 3) -> dict:
    """Median time of each configuration in ``names`` over ``rounds`` alternating passes
    (A B C, A B C, ...: a drift of the GPU's clock hits every one alike); ``measure(name)``
    times one configuration once."""
    if rounds < 1:
        raise ValueError(f"rounds must be >= 1, got {rounds}")
    times = {name: [] for name in names}
    for _ in range(rounds):
        for name in names:
            times[name].append(float(measure(name)))
    return {name: float(np.median(t)) for name, t in times.items()}


def confirmation_configs(default, sequential, winner, incumbent=None) -> dict:
    """The (params, mapping) pairs the confirmation times, by name: the heuristic choice
    ("default"), the sequential order, the first pass's winner and the table's current entry
    ("incumbent"), each named once (a winner or incumbent equal to an earlier one is left out;
    ``winner`` None: the first pass kept the default or the sequential order)."""
    configs = {"default": default, "sequential": sequential}
    for name, config in (("winner", winner), ("incumbent", incumbent)):
        if config is not None and config not in configs.values():
            configs[name] = config
    return configs


def seed_configs(spec: LayerSpec, fused_output: bool, m: int = 4) -> list[tuple[str, tuple]]:
    """(label, (TaskParams, MappingParams)) of every shipped table's entry for ``spec``'s shape,
    then for its near shapes (:func:`megawino.tuning.choice.is_near`; ring slots dropped: they
    are counted for the entry's own shape), each configuration once, in file order."""
    lookup = spec.with_(layout="NCHW", name="").shape_string
    exact, near = [], []
    for path in sorted(tuning.mapping_dir().glob("*.json")):
        if path.stem.startswith("direct_"):
            continue
        for shape, entry in tuning.read_table(path)["layers"].items():
            if entry["params"]["m"] != m:
                continue
            if shape == lookup:
                exact.append((f"{path.name}", choice.entry_params(entry, spec, fused_output)))
            elif choice.is_near(spec, shape):       # measured here, whether or not it lends
                near.append((f"{path.name} {shape}", choice.lent_params(entry, spec, fused_output)))
    seen, seeds = set(), []
    for label, config in exact + near:
        if config not in seen:
            seen.add(config)
            seeds.append((label, config))
    return seeds


def current_choice(spec: LayerSpec, gpu, gemm_math: str, fused_output: bool):
    """(TaskParams, MappingParams, ParamsSource) that plans of ``gemm_math`` on ``gpu`` (a
    GpuIdentity) use for ``spec`` today (:func:`megawino.tuning.choice.choose_for_gpu`), or the
    heuristic where MEGAWINO_MAPPING names a file not written yet."""
    try:
        return choice.choose_for_gpu(spec, gpu, gemm_math, fused_output=fused_output)
    except FileNotFoundError:
        return choice.choose_in(spec, [], fused_output=fused_output)


def ring_form(spec: LayerSpec, params, mapping):
    """``params`` with V and M in the fewest group slots ``mapping``'s order allows, or None where
    that is no ring (every group needs its own slot) or the graph has GEMM_OUTPUT tasks."""
    if params.fused_output or params.buffer_groups is not None:
        return None
    graph = build_graph(spec, params)
    slots = ring_buffer_groups(graph, resolve_order(graph, mapping))
    return dataclasses.replace(params, buffer_groups=slots) if slots < graph.layout.num_groups else None


def tune_layer(runtime, spec: LayerSpec, top: int = 6, seed: int = 0, reps: int = 10,
               deadline: float | None = None, traces: int = 3, confirm_rounds: int = 3,
               gemm_math: str | None = None, incumbent: tuple | None = None, seeds=(),
               ceilings=None) -> dict:
    """Tune one layer (plans of ``gemm_math``, default the runtime's); returns the table entry's
    measured fields plus the winner.  ``seeds`` ((label, (TaskParams, MappingParams)) pairs) are
    measured first, whatever the deadline; the simulator's candidates only until ``deadline``.
    ``incumbent`` (the (TaskParams, MappingParams) plans use today, if not the heuristic) takes
    part in the confirmation, so nothing slower than it is shipped."""
    gemm_math = gemm_math or DEFAULT_GEMM_MATH
    runtime = _GemmMathRuntime(runtime, gemm_math)
    rng = np.random.default_rng(seed)
    xs, w = rotated_inputs(spec, rng)
    params, mp, _ = choice.choose(spec, key=None)       # the heuristic, not the table
    default_us = measure_us(runtime, spec, params, mp, xs, w, reps)
    seq_task_params = default_params(spec)
    sequential_us = measure_us(runtime, spec, seq_task_params, "sequential", xs, w, reps)
    default_entry = {"params": params, "mapping": mp, "predicted_us": None}
    seq_memo: list = []

    def sequential_entry():
        """The sequential order as a table entry (its MappingParams equivalent; None if it has
        none); the equivalent graph is built at most once, and only when the order wins."""
        if not seq_memo:
            seq_mapping = sequential_equivalent(build_graph(spec, seq_task_params))
            seq_memo.append(None if seq_mapping is None else {
                "params": seq_task_params, "mapping": seq_mapping, "predicted_us": None,
                "sequential_order": True})
        return seq_memo[0]

    best = dict(default_entry, time_us=default_us)
    # The sequential order is a candidate too (few-group layers can finish faster with every
    # output after every GEMM); the table stores it as its MappingParams equivalent, and the
    # winner's speed-up over sequential is then exactly 1 (a tie, not a win).
    if sequential_us < best["time_us"] and sequential_entry() is not None:
        best = dict(sequential_entry(), time_us=sequential_us)
    measured = {(params, mp)}
    tried = 0

    def try_config(config, predicted=None) -> None:
        nonlocal best, tried
        if config in measured:
            return
        measured.add(config)
        try:
            t = measure_us(runtime, spec, *config, xs, w, reps)
        except (ValueError, MemoryError):   # a seed this plan cannot take (limits, memory)
            return
        tried += 1
        if t < best["time_us"]:
            best = {"params": config[0], "mapping": config[1], "predicted_us": predicted, "time_us": t}

    began = time.perf_counter()
    for _, config in seeds:
        try_config(config)
    # The simulator's candidates only where ``top`` of them and the traces fit before the deadline.
    one_s = (time.perf_counter() - began) / max(1, tried) if tried else 0.0
    simulated = {}
    if deadline is None or time.perf_counter() + (traces + top) * one_s + 1.0 < deadline:
        traced = runtime.plan(spec, params=params, mapping=mp, trace=True)
        records = []
        for i in range(max(1, traces)):
            traced(xs[i % len(xs)], w)
            records.append(np.asarray(traced.trace(), dtype=np.int64))
        graph, workers = traced.graph, int(traced.workers)
        model, _, trace_makespan = calibrate_on_traces(records, traced.order, graph, traced.blocks_per_sm,
                                                       label=spec.name, ceilings=ceilings)
        predicted_default = simulate(graph, traced.order, workers, model).makespan
        del traced
        sim_budget = 20.0 if deadline is None else max(1.0, min(20.0, (deadline - time.perf_counter()) / 3))
        ranked = rank_by_simulation(spec, model, workers, top, sim_budget_s=sim_budget,
                                    fused_output=gemm_output_tasks_allowed(gemm_math))
        simulated = {"trace_makespan_us": trace_makespan, "simulated_makespan_us": float(predicted_default),
                     "simulator_error": float(abs(predicted_default - trace_makespan) / trace_makespan)}
        for cand in ranked:
            if deadline is not None and time.perf_counter() > deadline:
                break
            try_config((cand["params"], cand["mapping"]), cand["predicted_us"])
        # The fastest's ring-buffer form (V and M in fewer group slots: less memory traffic
        # beyond the L2, at the cost of the ring's waits).
        ring = None if best.get("sequential_order") else ring_form(spec, best["params"], best["mapping"])
        if ring is not None and (deadline is None or time.perf_counter() < deadline):
            try_config((ring, best["mapping"]))
    # Confirmation: the first pass's best is the minimum of many noisy times (biased low).
    winner = None if best.get("sequential_order") else (best["params"], best["mapping"])
    configs = confirmation_configs((params, mp), (seq_task_params, "sequential"), winner, incumbent)
    confirmed = confirm(lambda name: measure_us(runtime, spec, *configs[name], xs, w, reps),
                        list(configs), confirm_rounds)
    default_us, sequential_us = confirmed["default"], confirmed["sequential"]
    if min(confirmed, key=confirmed.get) == "sequential" and sequential_entry() is None:
        del confirmed["sequential"]   # no MappingParams equivalent: ship the faster of the others
    fastest = min(confirmed, key=confirmed.get)
    if fastest == "default":
        best = dict(default_entry)
    elif fastest == "sequential":
        best = dict(sequential_entry())
    elif fastest == "incumbent":
        best = {"params": incumbent[0], "mapping": incumbent[1], "predicted_us": None}
    best["time_us"] = confirmed[fastest]
    return {
        "winner": best,
        "time_us": best["time_us"],
        "default_us": default_us,
        "sequential_us": sequential_us,
        "speedup_vs_default": default_us / best["time_us"],
        "speedup_vs_sequential": sequential_us / best["time_us"],
        "candidates_measured": tried,
        "confirm_rounds": confirm_rounds,
        "sequential_order": bool(best.get("sequential_order", False)),
        **simulated,
    }


def tune(specs, out_path=None, top: int = 6, budget_s: float = 600.0, reps: int = 10,
         on_start=None, on_done=None, gemm_math: str | None = None) -> dict:
    """Tune every layer of ``specs`` that fits in ``budget_s`` seconds (megawino.tuning.budget:
    each layer gets at least its seeds and confirmation; a layer whose minimum does not fit is
    left untouched and listed in the result's ``skipped``); updates the JSON table at
    ``out_path`` (default: the user's tuned table for this GPU and ``gemm_math``,
    :func:`megawino.tuning.table.user_table_path` of :func:`megawino.tuning.table.table_key`)
    atomically after each layer.  A file there that is not a mapping table is a ValueError
    before anything is measured."""
    from .. import runtime
    gemm_math = gemm_math or DEFAULT_GEMM_MATH
    gpu = gpu_identity.current_identity()
    ceilings = gpu_identity.ceilings(gpu)
    key = tuning.table_key(gpu.key, gemm_math)
    path = pathlib.Path(out_path) if out_path else tuning.user_table_path(key)
    table = tuning.table_for_update(path)
    user_files.check_writable(path)      # before any layer is measured, not after the first
    table.update(gpu=gpu.name, key=key, updated=datetime.datetime.now(datetime.timezone.utc)
                 .isoformat(timespec="seconds"), method=__doc__.split("\n\n", 1)[1].strip())
    fused_ok = gemm_output_tasks_allowed(gemm_math)
    jobs = []
    for spec in specs:
        params, mapping, source = current_choice(spec, gpu, gemm_math, fused_ok)
        incumbent = None if source.kind == "heuristic" else (params, mapping)
        seeds = seed_configs(spec, fused_ok)
        if incumbent is not None:
            seeds = [(str(source), incumbent)] + [s for s in seeds if s[1] != incumbent]
        jobs.append(budget.LayerJob(spec, seeds, incumbent, budget.minimum_s(spec, len(seeds), ceilings, reps)))
    schedule = budget.Schedule(jobs, budget_s)
    for i, job in enumerate(jobs):
        if on_start:
            on_start(i, job.spec)
        deadline = schedule.start(job)
        if deadline is None:
            if on_done:
                on_done(i, job.spec, None)
            continue
        res = tune_layer(runtime, job.spec, top=top, reps=reps, deadline=deadline, gemm_math=gemm_math,
                         incumbent=job.incumbent, seeds=job.seeds, ceilings=ceilings)
        schedule.done(job)
        win = res.pop("winner")
        tuning.write_entry(table, job.spec, win["params"], win["mapping"], **res)
        tuning.write_table(path, table)
        if on_done:
            on_done(i, job.spec, res)
    table["path"] = str(path)
    table["skipped"] = [job.spec for job in schedule.skipped]
    return table


def summary(table: dict) -> dict:
    entries = list(table["layers"].values())
    if not entries:
        return {}
    geo = lambda vals: math.exp(sum(map(math.log, vals)) / len(vals))  # noqa: E731
    errors = [e["simulator_error"] for e in entries if "simulator_error" in e]
    return {
        "layers": len(entries),
        "beat_sequential": sum(e["speedup_vs_sequential"] > 1 for e in entries),
        "sequential_is_best": sum(bool(e.get("sequential_order")) for e in entries),
        "geomean_speedup_vs_default": geo([e["speedup_vs_default"] for e in entries]),
        "geomean_speedup_vs_sequential": geo([e["speedup_vs_sequential"] for e in entries]),
        "median_simulator_error": float(np.median(errors)) if errors else None,
    }
