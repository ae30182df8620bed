"""CPU tests of the runtime's host side: exact argument checks (before anything compiles or
launches), the CPU reference path behind conv2d for NumPy arrays, environment settings, the
algorithm-choice cache file, and the watchdog status ring's bookkeeping."""
from __future__ import annotations

import json

import numpy as np
import pytest

import megawino
from megawino.core import abi
from megawino.gpu import algo_choice, weights
from megawino import runtime
from megawino.core.winograd import direct_conv_nchw, rel_l2
from megawino.gpu.call_checks import default_timeout_s


def _case(seed=0, n=1, c=3, k=4, h=7, w=6):
    rng = np.random.default_rng(seed)
    return (rng.standard_normal((n, c, h, w)).astype(np.float32) + 0.5,
            rng.standard_normal((k, c, 3, 3)).astype(np.float32))


@pytest.mark.parametrize("kwargs, match", [
    ({"padding": 1.7}, "padding must be an integer"),
    ({"stride": 2.5}, "stride must be an integer"),
    ({"padding": "2"}, "padding must be an integer"),
    ({"padding": True}, "padding must be an integer"),
    ({"stride": np.float32(1)}, "stride must be an integer"),
    ({"stride": 0}, "stride must be >= 1"),
    ({"padding": -1}, "padding must be >= 0"),
    ({"algo": "fast"}, "algo must be one of"),
    ({"layout": "nchw"}, "layout must be one of"),
    ({"gemm_math": "tf32"}, "gemm_math"),
    ({"check": 1}, "check must be True or False"),
    ({"weight_token": ["not", "hashable"]}, "weight_token must be hashable"),
])
def test_conv2d_refuses_inexact_arguments(kwargs, match):
    x, w = _case()
    with pytest.raises(ValueError, match=match):
        megawino.conv2d(x, w, **kwargs)


def test_conv2d_on_numpy_runs_the_cpu_reference_path():
    x, w = _case(1)
    y = megawino.conv2d(x, w, padding=1)
    assert isinstance(y, np.ndarray)
    assert rel_l2(y, direct_conv_nchw(x, w, 1, 1)) < 1e-5
    assert np.array_equal(y, megawino.conv2d(x, w, padding=1, algo="cpu"))


def test_conv2d_on_numpy_refuses_what_the_cpu_path_cannot_run():
    x, w = _case(2)
    with pytest.raises(ValueError, match="conv2d_cpu"):
        megawino.conv2d(x, w, stride=2, padding=1)
    with pytest.raises(ValueError, match="algo must be 'auto' or 'cpu'"):
        megawino.conv2d(x, w, padding=1, algo="megakernel")
    with pytest.raises(ValueError, match="both"):
        megawino.conv2d(x, type("GpuLike", (), {"ndim": 4, "shape": w.shape})(), padding=1)
    with pytest.raises(ValueError, match="4-D"):
        megawino.conv2d(x[0], w, padding=1)


def test_watchdog_limit_from_the_environment(monkeypatch):
    monkeypatch.delenv("MEGAWINO_WATCHDOG_S", raising=False)
    assert default_timeout_s() == 2.0
    monkeypatch.setenv("MEGAWINO_WATCHDOG_S", "60")
    assert default_timeout_s() == 60.0
    for bad in ("0", "-1", "inf", "nan", "two"):
        monkeypatch.setenv("MEGAWINO_WATCHDOG_S", bad)
        with pytest.raises(ValueError, match="MEGAWINO_WATCHDOG_S"):
            default_timeout_s()


def test_cache_limits_from_the_environment(monkeypatch):
    monkeypatch.setenv("MEGAWINO_WEIGHT_CACHE_MB", "12")
    assert weights.limit_bytes() == 12 << 20
    monkeypatch.setenv("MEGAWINO_WEIGHT_CACHE_MB", "1.5")
    with pytest.raises(ValueError, match="MEGAWINO_WEIGHT_CACHE_MB"):
        weights.limit_bytes()
    monkeypatch.setenv("MEGAWINO_PLAN_CACHE", "0")
    with pytest.raises(ValueError, match="MEGAWINO_PLAN_CACHE"):
        runtime._plan_cache_limit()


def test_plan_cache_is_an_lru_that_builds_each_key_once(monkeypatch):
    monkeypatch.setenv("MEGAWINO_PLAN_CACHE", "2")
    cache = runtime._PlanCache()
    made = []

    class FakePlan:
        def __init__(self, key):
            self.key = key

    def make(key):
        plan = FakePlan(key)
        made.append(plan)
        return plan

    for key in ("a", "b", "a", "c", "a", "b"):
        assert cache.get(key, lambda k=key: make(k)).key == key
    assert [p.key for p in made] == ["a", "b", "c", "b"]   # "b" was evicted by "c", "a" stayed in use
    assert len(cache) == 2
    # A dropped plan is marked, so a launcher that holds it stops using it.
    assert [getattr(p, "evicted", False) for p in made] == [False, True, True, False]
    cache.discard("a")
    cache.clear()
    assert all(p.evicted for p in made)


def test_algo_choice_cache_file_round_trip(tmp_path, monkeypatch):
    monkeypatch.setenv("MEGAWINO_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr(algo_choice, "gpu_name", lambda: "Test GPU")
    algo_choice.forget()
    timings = iter([5.0, 3.0, 4.0] * 20)
    monkeypatch.setattr(algo_choice, "measure", lambda c, gpu_time: {n: next(timings) for n in c})
    monkeypatch.setattr("megawino.gpu.workspace.is_capturing", lambda: False)
    calls = {"a": 0, "b": 0, "c": 0}
    candidates = {n: (lambda n=n: calls.__setitem__(n, calls[n] + 1)) for n in calls}
    assert algo_choice.choose_fastest("shape-1", candidates) == "b"
    saved = json.loads((tmp_path / algo_choice.FILE_NAME).read_text())
    assert saved["format"] == algo_choice.FORMAT
    assert saved["gpus"]["Test GPU"]["shape-1"]["choice"] == "b"
    algo_choice.forget()                                  # a new process reads the file
    monkeypatch.setattr(algo_choice, "measure", lambda c, gpu_time: pytest.fail("measured again"))
    assert algo_choice.choose_fastest("shape-1", candidates) == "b"
    (tmp_path / algo_choice.FILE_NAME).write_text("{not json")
    algo_choice.forget()
    monkeypatch.setattr(algo_choice, "measure", lambda c, gpu_time: {"a": 1.0, "b": 2.0, "c": 3.0})
    assert algo_choice.choose_fastest("shape-1", candidates) == "a"   # a broken file is remeasured
    algo_choice.forget()
    (tmp_path / algo_choice.FILE_NAME).unlink()
    # A handicap of 1.5 on "a" (1.0 us) loses to "b" (2.0 us) no more: 1.5 < 2.0; 2.5 does.
    assert algo_choice.choose_fastest("shape-2", candidates, handicaps={"a": 1.5}) == "a"
    assert algo_choice.choose_fastest("shape-3", candidates, handicaps={"a": 2.5}) == "b"
    saved = json.loads((tmp_path / algo_choice.FILE_NAME).read_text())["gpus"]["Test GPU"]
    assert saved["shape-3"]["median_us"] == {"a": 1.0, "b": 2.0, "c": 3.0}    # measured times kept
    with pytest.raises(ValueError):
        algo_choice.choose_fastest("", candidates)
    with pytest.raises(ValueError):
        algo_choice.choose_fastest("k", {})


def test_algo_choice_gpu_timing_is_asked_for_and_kept_apart(tmp_path, monkeypatch):
    """$MEGAWINO_CHOICE_TIMING=gpu measures by the GPU's time alone and keeps those choices
    under their own keys, beside the burst-timed ones; another value is a ValueError."""
    monkeypatch.setenv("MEGAWINO_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr(algo_choice, "gpu_name", lambda: "Test GPU")
    monkeypatch.setattr("megawino.gpu.workspace.is_capturing", lambda: False)
    algo_choice.forget()
    asked = []

    def measure(candidates, gpu_time):
        asked.append(gpu_time)
        return {"host_light": 3.0, "gpu_light": 2.0} if gpu_time else {"host_light": 2.0, "gpu_light": 3.0}
    monkeypatch.setattr(algo_choice, "measure", measure)
    candidates = {"host_light": lambda: None, "gpu_light": lambda: None}
    monkeypatch.delenv(algo_choice.ENV_TIMING, raising=False)
    assert algo_choice.timing() == "burst" and algo_choice.choose_fastest("k", candidates) == "host_light"
    monkeypatch.setenv(algo_choice.ENV_TIMING, "gpu")
    assert algo_choice.choose_fastest("k", candidates) == "gpu_light"
    assert asked == [False, True]
    saved = json.loads((tmp_path / algo_choice.FILE_NAME).read_text())["gpus"]["Test GPU"]
    assert saved["k"]["choice"] == "host_light" and saved["k/gpu-time"]["choice"] == "gpu_light"
    monkeypatch.setenv(algo_choice.ENV_TIMING, "host")
    with pytest.raises(ValueError, match="MEGAWINO_CHOICE_TIMING"):
        algo_choice.choose_fastest("k2", candidates)


def test_status_line_has_the_fired_count_the_ring_reads():
    from megawino.gpu.workspace import StatusRing
    assert abi.STATUS_FIELDS[StatusRing.FIRED] == "FIRED"
    assert len(abi.STATUS_FIELDS) <= abi.STATE_WORDS - abi.state_offset("STATUS")


def test_gpu_entry_points_without_cupy_say_so_in_one_line(monkeypatch):
    import sys
    monkeypatch.setitem(sys.modules, "cupy", None)        # import cupy -> ImportError
    with pytest.raises(RuntimeError) as info:
        megawino.plan(megawino.LayerSpec(1, 8, 8, 8, 8))
    assert "\n" not in str(info.value) and "conv2d_cpu" in str(info.value)
    x, w = _case(3)
    with pytest.raises(RuntimeError, match="conv2d_cpu"):
        megawino.conv2d(type("GpuLike", (), {"ndim": 4, "shape": x.shape})(),
                        type("GpuLike", (), {"ndim": 4, "shape": w.shape})())
    assert np.allclose(megawino.conv2d(x, w, padding=1), megawino.conv2d_cpu(x, w, padding=1), atol=1e-6)


def test_caches_never_evict_what_a_captured_graph_uses(monkeypatch):
    monkeypatch.setenv("MEGAWINO_PLAN_CACHE", "1")
    cache = runtime._PlanCache()
    captured = type("CapturedPlan", (), {"captured": True})()
    cache.get("graph", lambda: captured)
    plain = [type("Plan", (), {})() for _ in range(2)]
    cache.get("a", lambda: plain[0])
    cache.get("b", lambda: plain[1])
    assert cache.get("graph", lambda: pytest.fail("the captured plan was evicted")) is captured
    assert plain[0].evicted and not getattr(captured, "evicted", False)

    class FakeArray:
        def __init__(self, nbytes):
            self.nbytes = nbytes
    monkeypatch.setattr("megawino.gpu.workspace.alloc", lambda shape, dtype: FakeArray(600 << 10))
    monkeypatch.setenv("MEGAWINO_WEIGHT_CACHE_MB", "1")
    store = weights.WeightCache()
    pinned = store.get("w0", (1,))
    pinned.pinned = True
    first = store.get("w1", (1,))
    store.get("w2", (1,))
    assert len(store) == 2 and store.get("w0", (1,)) is pinned
    assert first.evicted and not pinned.evicted and store.lookup("w1") is None
