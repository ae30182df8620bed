"""GPU reliability tests that can fail (every test is marked ``gpu``, skipped without a GPU):

* a launch soak: hundreds of launches of one plan, the input changing every launch, every output
  checked (the first of each input against float64, the others bitwise against it), then the
  scheduler's state words and counters checked back at their initial values;
* a GPU fuzz of random small layers, task sizes and valid mappings against float64, with
  NaN-poisoned outputs (fixed seed; each failing case is printed whole);
* invalid mappings are never launched: the exception type and message are checked, and an
  output buffer a launch would have written stays NaN.
"""
from __future__ import annotations

import numpy as np
import pytest
from fuzz_support import float32_bound_violation, random_inputs, random_layer, random_topological_order, to_nchw

from megawino.core import abi
from megawino.schedule import mapping as mapping_mod
from megawino.core.spec import LayerSpec
from megawino.core.task_sizes import build_graph

pytestmark = pytest.mark.gpu

SOAK_LAUNCHES = 400
SOAK_INPUT_SETS = 4
GPU_FUZZ_CASES = 500
GPU_FUZZ_SEED = 20261125
# Roundings per reduction term of the GEMM, for the fuzz's per-element bound: 3xTF32 drops the
# small x small product and rounds the split parts to TF32 (each about 2^-22 relative), and the
# tensor cores may truncate their fp32 sums; generous, and still orders of magnitude below a
# wrong or missing term.
GEMM_ROUNDINGS_PER_TERM = {"3xtf32": 16, "ffma": 1}


def _cp():
    import cupy
    return cupy


def scheduler_words(plan) -> tuple[np.ndarray, np.ndarray]:
    """(state words, counters) of ``plan``'s scheduler for the current stream, on the host.
    The one place that knows where a plan keeps them (its per-stream workspace)."""
    ws = plan.workspace()
    return ws.state.get(), ws.counters.get()


def finish(plan) -> None:
    """Wait for the plan's launches (calls are asynchronous) and raise if a watchdog fired."""
    import megawino
    plan.check()
    megawino.synchronize()


def assert_scheduler_at_rest(plan) -> None:
    state, counters = scheduler_words(plan)
    expected = np.zeros(abi.STATE_WORDS, dtype=state.dtype)
    expected[abi.state_offset("BREAK")] = -1
    words = {name: int(state[abi.state_offset(name)]) for name in abi.STATE_LINES}
    assert np.array_equal(state, expected), f"scheduler state not reset: {words}"
    busy = np.flatnonzero(counters)
    assert busy.size == 0, f"{busy.size} counter words not reset, first at {busy[:5]}: {counters[busy[:5]]}"


# ---- (a) launch soak ---------------------------------------------------------------------

@pytest.mark.parametrize("spec, algo", [
    (LayerSpec(2, 32, 32, 16, 16), "megakernel"),
    (LayerSpec(3, 13, 21, 15, 11, padding=0, layout="NHWC"), "megakernel"),
    (LayerSpec(1, 40, 24, 9, 13, padding=2), "nonfused"),
])
def test_launch_soak_checks_every_output_and_resets_the_scheduler(spec, algo):
    """Launch i runs input set i % SOAK_INPUT_SETS (the input changes every launch).  The first
    output of each set is checked against float64; every later one must equal it bitwise (one
    fixed reduction order per element), so every launch is checked."""
    import megawino
    cp = _cp()
    plan = megawino.plan(spec, algo=algo)
    rng = np.random.default_rng(17)
    host = [random_inputs(spec, rng, ("normal", "uniform")[s % 2]) for s in range(SOAK_INPUT_SETS)]
    device = [(cp.asarray(x), cp.asarray(w)) for x, w in host]
    mismatches = cp.full(SOAK_LAUNCHES, -1, dtype=cp.int64)
    outs = [cp.empty(spec.output_shape, dtype=cp.float32) for _ in range(2)]
    first = [None] * SOAK_INPUT_SETS
    for i in range(SOAK_LAUNCHES):
        s = i % SOAK_INPUT_SETS
        out = outs[i % len(outs)]
        out.fill(cp.nan)                         # an unwritten element can equal nothing
        plan(*device[s], out=out, check=False)
        if first[s] is None:
            first[s] = out.copy()
        mismatches[i] = cp.count_nonzero(out.view(cp.uint32) != first[s].view(cp.uint32))
    finish(plan)
    for s, (x, w) in enumerate(host):
        violation = float32_bound_violation(spec, plan.params.m, to_nchw(spec, first[s].get()),
                                            to_nchw(spec, x), w, GEMM_ROUNDINGS_PER_TERM[plan.gemm_math])
        assert violation is None, f"launch {s} (input set {s}): {violation}"
    mismatches = mismatches.get()
    drifted = np.flatnonzero(mismatches != 0)
    assert drifted.size == 0, (f"{drifted.size} of {SOAK_LAUNCHES} launches differ bitwise from the first "
                               f"launch on the same input, first {drifted[:8].tolist()}: "
                               f"{mismatches[drifted[:8]].tolist()} elements")
    assert_scheduler_at_rest(plan)


# ---- (b) GPU fuzz ------------------------------------------------------------------------

def _random_case(rng):
    """A small layer, valid task sizes, a valid mapping (interleaved with random MappingParams,
    sequential, or a random topological order) and an algo."""
    integer = lambda lo, hi: int(rng.integers(lo, hi + 1))          # noqa: E731
    pick = lambda options: options[int(rng.integers(len(options)))]  # noqa: E731
    spec, params = random_layer(integer, pick, max_batch=3, max_channels=48, max_size=20)
    kind = pick(("interleaved", "sequential", "topological"))
    if kind == "interleaved":
        mapping = mapping_mod.MappingParams(integer(0, 600), integer(0, 600), integer(1, 8))
    elif kind == "sequential":
        mapping = "sequential"
    else:
        mapping = random_topological_order(build_graph(spec, params), rng)
    algo = pick(("megakernel", "megakernel", "nonfused"))
    return spec, params, kind, mapping, algo


def test_gpu_fuzz_random_layers_and_mappings_against_float64():
    import megawino
    cp = _cp()
    rng = np.random.default_rng(GPU_FUZZ_SEED)
    failures = []
    for case in range(GPU_FUZZ_CASES):
        spec, params, kind, mapping, algo = _random_case(rng)
        distribution = "normal" if case % 2 == 0 else "uniform"
        x, w = random_inputs(spec, rng, distribution)
        what = (f"case {case}: {spec!r} {params!r} mapping={kind} "
                f"{mapping if kind == 'interleaved' else ''} algo={algo} inputs={distribution}")
        try:
            plan = megawino.plan(spec, params=params, mapping=mapping, algo=algo)
            out = cp.full(spec.output_shape, cp.nan, dtype=cp.float32)
            plan(cp.asarray(x), cp.asarray(w), out=out, check=True)
            finish(plan)
            y = to_nchw(spec, out.get())
            violation = float32_bound_violation(spec, params.m, y, to_nchw(spec, x), w,
                                                GEMM_ROUNDINGS_PER_TERM[plan.gemm_math])
        except Exception as err:                 # a launch error or the watchdog: a failure too
            violation = f"{type(err).__name__}: {err}"
        if violation is not None:
            print(f"FAILED {what}: {violation}")
            failures.append(f"{what}: {violation}")
            if len(failures) >= 10:
                break
    assert not failures, f"{len(failures)} failing cases (seed {GPU_FUZZ_SEED}):\n" + "\n".join(failures)


# ---- (c) invalid mappings are never launched -----------------------------------------------

def _invalid_mappings(graph):
    order = mapping_mod.sequential_mapping(graph)
    n = graph.num_tasks
    return [
        ("child before its parent", order[::-1].copy(),
         mapping_mod.MappingError, r"^ticket \d+ \((GEMM|OUTPUT) g=\d+.*\) comes before its parent at ticket \d+ \("),
        ("a task missing", order[:-1].copy(),
         mapping_mod.MappingError, rf"^mapping has {n - 1} tickets for {n} tasks; task \d+ \(.*\) is missing"),
        ("a task repeated", np.concatenate([order[:-1], order[:1]]),
         mapping_mod.MappingError, r"^ticket \d+ repeats task \d+ \(.*\), first at ticket \d+"),
        ("a task id out of range", np.concatenate([order[:-1], [n]]).astype(np.int32),
         mapping_mod.MappingError, rf"^ticket {n - 1} holds task id {n}, outside 0\.\.{n - 1}"),
        ("float task ids", order.astype(np.float64),
         mapping_mod.MappingError, r"^a mapping holds integer task ids, got dtype float64"),
        ("a 2-D order", order.reshape(1, -1),
         mapping_mod.MappingError, r"^a mapping is a 1-D array of task ids, got shape \(1, \d+\)"),
    ]


@pytest.mark.parametrize("algo", ["megakernel", "nonfused"])
def test_invalid_mapping_is_refused_before_anything_runs(algo):
    import megawino
    cp = _cp()
    spec = LayerSpec(1, 8, 8, 8, 8)
    graph = build_graph(spec)
    x, w = random_inputs(spec, np.random.default_rng(3), "normal")
    xd, wd = cp.asarray(x), cp.asarray(w)
    out = cp.full(spec.output_shape, cp.nan, dtype=cp.float32)
    # The setup can fail: a valid mapping writes every element of `out`.
    valid = megawino.plan(spec, params=graph.layout.params, mapping="sequential", algo=algo)
    valid(xd, wd, out=out)
    finish(valid)
    assert bool(cp.isfinite(out).all())
    pool = cp.get_default_memory_pool()
    for what, order, error, message in _invalid_mappings(graph):
        out.fill(cp.nan)
        cp.cuda.Device().synchronize()
        used = pool.used_bytes()
        with pytest.raises(error, match=message) as info:
            bad = megawino.plan(spec, params=graph.layout.params, mapping=order, algo=algo)
            bad(xd, wd, out=out)                 # reached only if the plan was accepted
        assert type(info.value) is error, what
        assert "\n" not in str(info.value), what
        cp.cuda.Device().synchronize()
        assert bool(cp.isnan(out).all()), f"{what}: a kernel wrote the output"
        assert pool.used_bytes() <= used, f"{what}: the refused plan allocated device memory"
    with pytest.raises(ValueError, match=r"mapping parameter DIG must be an integer in 0\.\.2147483647"):
        megawino.plan(spec, mapping=mapping_mod.MappingParams(dig=-1))
