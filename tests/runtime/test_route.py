"""megawino.gpu.route on the CPU, against recording stand-ins for a plan, its launcher and the
current stream: which calls run the plan and which its bound launcher, when the launcher is
made again, and which routes a plan keeps."""
import types

import pytest

from megawino.gpu import route as routes


class FakeArray:
    def __init__(self, ptr):
        self.data = types.SimpleNamespace(ptr=ptr)


class FakeLauncher:
    def __init__(self, log):
        self.log, self.is_valid = log, True

    def valid(self):
        return self.is_valid

    def launch(self, x_ptr, out_ptr):
        self.log.append(("launcher", x_ptr, out_ptr))


class FakePlan:
    """A plan whose ``launcher`` exists once a ``run`` has prepared the weight under a token."""

    def __init__(self):
        self.log, self.prepared, self.launchers = [], set(), []

    def run(self, x, w, out, check, weight_token):
        self.log.append(("run", x.data.ptr, out.data.ptr, check, weight_token))
        if weight_token is not None and not stream["capturing"]:
            self.prepared.add(weight_token)
        return out

    def launcher(self, x, w, weight_token):
        if weight_token not in self.prepared or stream["capturing"]:
            return None
        self.launchers.append(FakeLauncher(self.log))
        return self.launchers[-1]


stream = {"ptr": 7, "capturing": False}


@pytest.fixture(autouse=True)
def fake_stream(monkeypatch):
    stream.update(ptr=7, capturing=False)
    monkeypatch.setattr(routes.workspace, "current_stream_ptr", lambda: stream["ptr"])
    monkeypatch.setattr(routes.workspace, "is_capturing", lambda: stream["capturing"])


def kinds(plan):
    return [entry[0] for entry in plan.log]


def test_first_call_runs_the_plan_then_the_bound_launcher_sets_pointers_only():
    plan, w = FakePlan(), FakeArray(0x100)
    for i in range(3):
        out = FakeArray(0x300 + i)
        assert routes.launch(plan, FakeArray(0x200 + i), w, out, True, "w1") is out
    assert plan.log == [("run", 0x200, 0x300, True, "w1"), ("launcher", 0x201, 0x301), ("launcher", 0x202, 0x302)]
    assert len(plan.launchers) == 1                      # bound once


def test_calls_the_launcher_cannot_take_run_the_plan():
    plan, w = FakePlan(), FakeArray(0x100)
    x, out = FakeArray(0x200), FakeArray(0x300)
    for _ in range(2):
        routes.launch(plan, x, w, out, True, None)       # no token: nothing is bound
    assert kinds(plan) == ["run", "run"] and not plan.launchers
    routes.launch(plan, x, w, out, True, "once")         # a token used once: nothing is bound
    assert kinds(plan) == ["run"] * 3 and not plan.launchers
    routes.launch(plan, x, w, out, True, "w1")
    routes.launch(plan, x, w, out, False, "w1")          # check=False: the plan's own launch
    assert kinds(plan) == ["run"] * 5 and not plan.launchers
    routes.launch(plan, x, w, out, True, "w1")           # the second checked call binds
    assert kinds(plan)[5:] == ["launcher"] and len(plan.launchers) == 1
    stream["capturing"] = True                           # capture: the weight prepared in the graph
    routes.launch(plan, x, w, out, True, "w1")
    stream["capturing"] = False
    assert kinds(plan)[6:] == ["run"]
    routes.launch(plan, x, FakeArray(0x900), out, True, "w1", copied_weight=True)   # new memory each call
    routes.launch(plan, x, FakeArray(0x900), out, True, "w1", copied_weight=True)
    assert kinds(plan)[7:] == ["run", "run"] and (0x900, 7) not in plan._routes
    plan.launchers[-1].is_valid = False                  # a cache dropped what it reads: bound again
    routes.launch(plan, x, w, out, True, "w1")
    assert kinds(plan)[9:] == ["launcher"] and len(plan.launchers) == 2
    plan.launchers[-1].is_valid = False
    plan.prepared.clear()                                # ... and the prepared weight with it
    routes.launch(plan, x, w, out, True, "w1")
    routes.launch(plan, x, w, out, True, "w1")
    assert kinds(plan)[10:] == ["run", "launcher"] and len(plan.launchers) == 3


def test_a_route_under_capture_binds_nothing_until_a_later_eager_call():
    plan, w = FakePlan(), FakeArray(0x100)
    stream["capturing"] = True
    for _ in range(2):
        routes.launch(plan, FakeArray(1), w, FakeArray(2), True, "w1")
    stream["capturing"] = False
    assert not plan.launchers
    routes.launch(plan, FakeArray(1), w, FakeArray(2), True, "w1")   # prepared eagerly
    routes.launch(plan, FakeArray(1), w, FakeArray(2), True, "w1")
    assert kinds(plan) == ["run", "run", "run", "launcher"]


def test_routes_are_per_weight_memory_and_stream_and_go_with_the_plan():
    plan = FakePlan()
    first = routes.route(plan, FakeArray(0x100), "w1")
    assert routes.route(plan, FakeArray(0x100), "w1") is first        # another array of that memory
    assert routes.route(plan, FakeArray(0x180), "w1") is not first    # another weight
    stream["ptr"] = 9
    other = routes.route(plan, FakeArray(0x100), "w1")
    assert other is not first and other.stream == 9
    stream["ptr"] = 7
    # A new token for the same memory replaces the route (and the launcher of the old contents).
    routes.launch(plan, FakeArray(1), FakeArray(0x100), FakeArray(2), True, "w1")
    routes.launch(plan, FakeArray(1), FakeArray(0x100), FakeArray(2), True, "w1")
    renewed = routes.route(plan, FakeArray(0x100), "w2")
    assert renewed is not first and renewed.launcher is None and renewed.token == "w2"
    assert routes.route(plan, FakeArray(0x100), None) is not routes.route(plan, FakeArray(0x100), None)
    # Full: the routes without a launcher make room first; a route with a live launcher stays.
    bound = routes.route(plan, FakeArray(0x100), "w1")
    for _ in range(2):
        routes.launch(plan, FakeArray(1), FakeArray(0x100), FakeArray(2), True, "w1")
    assert bound.launcher is not None
    for i in range(routes.MAX_ROUTES + 1):
        routes.route(plan, FakeArray(0x1000 + 16 * i), "w")
    assert len(plan._routes) <= routes.MAX_ROUTES and plan._routes[(0x100, 7)] is bound
    routes.forget(plan)
    assert not hasattr(plan, "_routes")
    routes.forget(plan)                                   # nothing to drop


def test_the_plan_cache_drops_the_routes_of_a_plan_it_drops(monkeypatch):
    from megawino import runtime
    monkeypatch.setenv("MEGAWINO_PLAN_CACHE", "1")
    cache = runtime._PlanCache()
    first = cache.get("a", FakePlan)
    routes.route(first, FakeArray(0x100), "w1")
    second = cache.get("b", FakePlan)
    routes.route(second, FakeArray(0x100), "w1")
    assert first.evicted and not hasattr(first, "_routes")    # its workspaces are not kept by a route
    cache.clear()
    assert second.evicted and not hasattr(second, "_routes")


class FakeDeviceArray:
    """A CuPy array's surface over a NumPy array: shape, dtype, device, flags, pointer, size."""

    def __init__(self, host, ptr=None):
        self.host, self.shape, self.dtype, self.ndim = host, host.shape, host.dtype, host.ndim
        self.device = types.SimpleNamespace(id=0)
        self.flags = types.SimpleNamespace(c_contiguous=host.flags.c_contiguous)
        self.data = types.SimpleNamespace(ptr=host.ctypes.data if ptr is None else ptr)
        self.nbytes = host.nbytes


class FakeRuntimePlan(FakePlan):
    def __init__(self, spec):
        super().__init__()
        self.spec, self.evicted = spec, False


@pytest.fixture
def fake_cupy(monkeypatch):
    """megawino.conv2d's GPU path on fake device arrays: plans are FakeRuntimePlans."""
    import numpy as np
    from megawino import runtime
    from megawino.gpu import call_checks, nvrtc
    cupy = types.SimpleNamespace(ndarray=FakeDeviceArray,
                                 cuda=types.SimpleNamespace(runtime=types.SimpleNamespace(getDevice=lambda: 0)),
                                 empty=lambda shape, dtype: FakeDeviceArray(np.empty(shape, dtype)))
    for module in (runtime, call_checks, nvrtc, routes.workspace):
        monkeypatch.setattr(module, "cupy_module", lambda: cupy)
    made = []
    monkeypatch.setattr(runtime, "plan", lambda spec, algo, gemm_math: made.append(FakeRuntimePlan(spec)) or made[-1])
    runtime.clear_cache()
    yield made
    runtime.clear_cache()


def test_conv2d_checks_then_binds_its_route_once(fake_cupy):
    import numpy as np
    import megawino
    rng = np.random.default_rng(5)
    x = FakeDeviceArray(rng.standard_normal((1, 4, 6, 6), dtype=np.float32))
    w = FakeDeviceArray(rng.standard_normal((8, 4, 3, 3), dtype=np.float32), ptr=0x1000)
    outs = [FakeDeviceArray(np.empty((1, 8, 6, 6), np.float32), ptr=0x2000 + 0x400 * i) for i in range(3)]
    for out in outs:
        assert megawino.conv2d(x, w, padding=1, algo="megakernel", out=out, weight_token="w1") is out
    plan, = fake_cupy
    assert kinds(plan) == ["run", "launcher", "launcher"] and len(plan.launchers) == 1
    megawino.conv2d(x, w, padding=1, algo="megakernel", out=outs[0], weight_token="w1", check=False)
    megawino.conv2d(x, w, padding=1, algo="megakernel", out=outs[0])
    assert kinds(plan)[3:] == ["run", "run"]
    # The plans' checks, before anything launches: dtype, aliasing, channels.
    with pytest.raises(ValueError, match="x has dtype float64"):
        megawino.conv2d(FakeDeviceArray(np.zeros((1, 4, 6, 6))), w, padding=1, algo="megakernel")
    with pytest.raises(ValueError, match="out overlaps x"):
        megawino.conv2d(x, w, padding=1, algo="megakernel", out=FakeDeviceArray(np.empty((1, 8, 6, 6), np.float32),
                                                                              ptr=x.data.ptr))
    with pytest.raises(ValueError, match="C=4 channels but w expects C=3"):
        megawino.conv2d(x, FakeDeviceArray(np.zeros((8, 3, 3, 3), np.float32)), padding=1, algo="megakernel")
    assert len(plan.log) == 5 and len(fake_cupy) == 1


def test_a_plans_call_takes_the_options_conv2d_takes(fake_cupy):
    import numpy as np
    from megawino.core.spec import LayerSpec
    from megawino.gpu import call_checks
    spec = LayerSpec(1, 4, 8, 6, 6)
    x = FakeDeviceArray(np.ones(spec.input_shape, np.float32))
    w = FakeDeviceArray(np.ones(spec.weight_shape, np.float32), ptr=0x1000)
    with pytest.raises(ValueError, match="check must be True or False"):
        call_checks.prepare_call(spec, 0, x, w, None, check=1)
    with pytest.raises(ValueError, match="weight_token must be hashable"):
        call_checks.prepare_call(spec, 0, x, w, None, weight_token=["w"])
    with pytest.raises(ValueError, match="w has shape"):
        call_checks.prepare_call(spec, 0, x, x, None)
    with pytest.raises(ValueError, match="made on device 1"):
        call_checks.prepare_call(spec, 1, x, w, None)
