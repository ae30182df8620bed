"""megawino.torch's GPU glue (megawino/torch/gpu.py) on the CPU, against a recording stand-in
for CuPy and megawino.runtime: what is handed to the runtime, the weight view, the per-layer
choice and CUDA-graph capture."""
import pytest

torch = pytest.importorskip("torch")
from torch import nn  # noqa: E402
import torch.nn.functional as F  # noqa: E402

from megawino.torch import gpu  # noqa: E402


def rel_l2(y, ref) -> float:
    ref = ref.detach().double()
    return float((y.detach().double() - ref).norm() / ref.norm())


def reference(x, w, stride=1, padding=0):
    return F.conv2d(x.double(), w.double(), None, stride, padding)


@pytest.fixture
def rng():
    return torch.Generator().manual_seed(14)


def randn(rng, *shape):
    return torch.randn(*shape, generator=rng)


class _Context:
    def __init__(self, *args):
        self.args = args

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


class FakeRuntime:
    """megawino.runtime's contract, computed with F.conv2d on the CPU, every call recorded."""

    def __init__(self, best="megakernel", winner=None):
        self.calls, self.chosen, self.timed = [], [], []
        self.best, self.winner = best, winner

    def conv2d(self, x, w, stride, padding, algo, layout, gemm_math, out, weight_token):
        self.calls.append(dict(x=x, w=w, out=out, algo=algo, layout=layout, token=weight_token,
                               stride=stride, padding=padding, gemm_math=gemm_math))
        nchw = (lambda t: t.permute(0, 3, 1, 2)) if layout == "NHWC" else (lambda t: t)
        nchw(out).copy_(F.conv2d(nchw(x), w, None, stride, padding))
        return out

    def choose_algo(self, spec, gemm_math, prepared_weights=False):
        from megawino.runtime import candidate_algos
        self.chosen.append(spec)
        names = candidate_algos(spec)
        return self.best if self.best in names else names[-1]

    def route(self, spec, algo, gemm_math, device, w, weight_token):
        return FakeRoute(FakePlan(self, spec, algo, gemm_math), w, weight_token)

    def choose_fastest(self, key, candidates, handicaps=None):
        self.timed.append((key, tuple(candidates)))
        for run in candidates.values():
            run()
        return self.winner or next(iter(candidates))


class FakePlan:
    """A plan of the fake runtime: ``run`` (the later calls of a checked shape) computes and
    records like FakeRuntime.conv2d."""

    def __init__(self, runtime, spec, algo, gemm_math):
        self.runtime, self.spec, self.algo, self.gemm_math = runtime, spec, algo, gemm_math

    def run(self, x, w, out, check, weight_token):
        spec = self.spec
        return self.runtime.conv2d(x, w, spec.stride, spec.padding, self.algo, spec.layout, self.gemm_math,
                                   out, weight_token)


class FakeRoute:
    """A route of the fake runtime: no launcher until ``bind`` is handed one (``launcher``), the
    plan's ``run`` otherwise."""

    def __init__(self, plan, w, token, launcher=None):
        self.plan, self.w, self.token, self.launcher = plan, w, token, launcher

    def bound(self):
        return None

    def bind(self, x):
        return self.launcher

    def __call__(self, x, out, check=True):
        return self.plan.run(x, self.w, out, check, self.token)


class FakeCupy:
    """CuPy's zero-copy view API over CPU tensors: ``ndarray`` gives back the owner tensor after
    checking that the pointer, byte size and shape describe it exactly."""

    float32 = "float32"

    def __init__(self):
        self.views = 0
        self.cuda = type("cuda", (), {"ExternalStream": _Context, "Device": _Context,
                                      "UnownedMemory": lambda ptr, size, owner, device: (ptr, size, owner),
                                      "MemoryPointer": lambda memory, offset: (memory, offset)})

    def ndarray(self, shape, dtype, memptr):
        (ptr, size, owner), offset = memptr
        assert dtype == "float32" and offset == 0 and owner.is_contiguous()
        assert ptr == owner.data_ptr() and size == 4 * owner.numel() and shape == tuple(owner.shape)
        self.views += 1
        return owner


@pytest.fixture
def fake_gpu(monkeypatch):
    runtime = FakeRuntime()
    cupy = runtime.cupy = FakeCupy()
    monkeypatch.setattr(gpu, "_gpu", lambda: (cupy, runtime))
    monkeypatch.setattr(torch.cuda, "current_stream", lambda device=None: type("S", (), {"cuda_stream": 7})())
    monkeypatch.setattr(torch.cuda, "is_current_stream_capturing", lambda: False)
    monkeypatch.setattr(gpu, "_CHOICES", {})
    monkeypatch.setattr(gpu, "_STREAMS", {})
    monkeypatch.setattr(gpu, "_LAYERS", {})
    return runtime


def run_gpu(x, weight, stride=1, padding=1, algo="auto", gemm_math="3xtf32"):
    channels_last = x.is_contiguous(memory_format=torch.channels_last) and not x.is_contiguous()
    with torch.no_grad():
        return gpu.run_gpu(x, weight, stride, padding, channels_last, algo, gemm_math)


def test_gpu_glue_makes_the_weight_view_once_per_token_and_stream(rng, fake_gpu, monkeypatch):
    x = randn(rng, 1, 4, 6, 6)
    weight = randn(rng, 4, 4, 3, 3).contiguous(memory_format=torch.channels_last)
    for _ in range(3):
        run_gpu(x, weight, algo="megakernel")
    assert fake_gpu.cupy.views == 3 * 2 + 1                # input and output per call, weight once
    assert len({call["w"].data_ptr() for call in fake_gpu.calls}) == 1
    with torch.no_grad():
        weight.mul_(2)
    y, _ = run_gpu(x, weight, algo="megakernel")
    assert fake_gpu.cupy.views == 4 * 2 + 2
    assert rel_l2(y, reference(x, weight, padding=1)) < 1e-6
    # Another stream gets its own copy (made on it, so ordered before its reads).
    monkeypatch.setattr(torch.cuda, "current_stream", lambda device=None: type("S", (), {"cuda_stream": 9})())
    run_gpu(x, weight, algo="megakernel")
    run_gpu(x, weight, algo="megakernel")
    assert fake_gpu.cupy.views == 6 * 2 + 3
    # Under capture a copy is made for the graph and not kept.
    monkeypatch.setattr(torch.cuda, "is_current_stream_capturing", lambda: True)
    monkeypatch.setattr(torch.cuda, "current_stream", lambda device=None: type("S", (), {"cuda_stream": 11})())
    run_gpu(x, weight, algo="megakernel")
    run_gpu(x, weight, algo="megakernel")
    assert fake_gpu.cupy.views == 8 * 2 + 5


@pytest.mark.parametrize("channels_last", [False, True])
def test_gpu_glue_passes_the_contract(rng, fake_gpu, channels_last):
    x, weight = randn(rng, 2, 4, 9, 7), nn.Parameter(randn(rng, 6, 4, 3, 3))
    if channels_last:
        x = x.contiguous(memory_format=torch.channels_last)
    y, ran = run_gpu(x, weight, algo="direct")
    call = fake_gpu.calls[-1]
    assert ran == "direct" and call["algo"] == "direct" and call["gemm_math"] == "3xtf32"
    assert call["layout"] == ("NHWC" if channels_last else "NCHW")
    assert tuple(call["x"].shape) == ((2, 9, 7, 4) if channels_last else (2, 4, 9, 7))
    assert tuple(call["out"].shape) == ((2, 9, 7, 6) if channels_last else (2, 6, 9, 7))
    assert call["x"].is_contiguous() and call["out"].is_contiguous() and call["w"].is_contiguous()
    assert call["token"] == gpu.weight_token(weight)
    assert torch.equal(call["w"], weight.detach())
    assert call["out"].data_ptr() == y.data_ptr()           # the runtime wrote the returned tensor
    assert y.is_contiguous(memory_format=torch.channels_last) == channels_last
    assert rel_l2(y, reference(x, weight, padding=1)) < 1e-6


def test_gpu_glue_auto_measures_once_and_keeps_the_choice(rng, fake_gpu):
    x, weight = randn(rng, 1, 4, 8, 8), randn(rng, 4, 4, 3, 3)
    fake_gpu.winner = "pytorch"
    for _ in range(3):
        y, ran = run_gpu(x, weight)
        assert ran == "pytorch"
        assert rel_l2(y, reference(x, weight, padding=1)) < 1e-6
    assert len(fake_gpu.chosen) == 1 and len(fake_gpu.timed) == 1
    key, names = fake_gpu.timed[0]
    assert names == ("megakernel", "pytorch") and "n1c4k4h8w8" in key and "3xtf32" in key
    # A 1x1 layer: the runtime's choice of its own paths (direct, pointwise) against PyTorch.
    run_gpu(x, randn(rng, 4, 4, 1, 1), padding=0)
    assert len(fake_gpu.chosen) == 2 and fake_gpu.timed[-1][1] == ("pointwise", "pytorch")
    # A filter too large for megawino: PyTorch without measuring.
    _, ran = run_gpu(randn(rng, 1, 2, 20, 20), randn(rng, 2, 2, 17, 17), padding=8)
    assert ran == "pytorch" and len(fake_gpu.timed) == 2


def test_gpu_glue_under_capture_measures_nothing_and_keeps_nothing(rng, fake_gpu, monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_current_stream_capturing", lambda: True)
    x, weight = randn(rng, 1, 4, 8, 8), randn(rng, 4, 4, 3, 3)
    _, ran = run_gpu(x, weight)
    assert ran == "megakernel" and not fake_gpu.timed and not fake_gpu.chosen
    assert gpu._CHOICES == {}


def test_gpu_glue_refuses_an_algo_the_shape_cannot_take(rng, fake_gpu):
    with pytest.raises(ValueError, match="algo='megakernel'"):
        run_gpu(randn(rng, 1, 4, 8, 8), randn(rng, 4, 4, 1, 1), padding=0, algo="megakernel")
    assert not fake_gpu.calls


class FakeLauncher:
    """A plan's launcher: computes the layer from the input it is handed (found by pointer) into
    the output memory the call allocated, and records the pointers."""

    def __init__(self, weight, inputs):
        self.weight, self.inputs, self.calls, self.is_valid = weight, inputs, [], True

    def valid(self):
        return self.is_valid

    def launch(self, x_ptr, out_ptr):
        import ctypes
        self.calls.append((x_ptr, out_ptr))
        y = F.conv2d(self.inputs[x_ptr], self.weight, None, 1, 1).contiguous()
        ctypes.memmove(out_ptr, y.data_ptr(), y.numel() * y.element_size())


@pytest.fixture
def fast_glue(fake_gpu, monkeypatch):
    """The fake GPU, with torch's current device, raw stream and thread set-up stood in for."""
    stream = {"handle": 7}
    monkeypatch.setattr(torch.cuda, "current_device", lambda: None)     # CPU tensors: device index None
    monkeypatch.setattr(gpu, "_RAW_STREAM", lambda index: stream["handle"])
    fake_gpu.cupy.cuda.runtime = type("runtime", (), {"setDevice": staticmethod(lambda index: None)})
    fake_gpu.plans = []

    def route(spec, algo, gemm_math, device, w, weight_token):
        plan = FakePlan(fake_gpu, spec, algo, gemm_math)
        fake_gpu.plans.append(plan)
        return FakeRoute(plan, w, weight_token, fake_gpu.launcher)
    monkeypatch.setattr(fake_gpu, "route", route)
    fake_gpu.stream = stream
    return fake_gpu


def test_fast_call_repeats_only_a_call_that_nothing_changed(rng, fast_glue, monkeypatch):
    x, weight = randn(rng, 2, 4, 8, 8), nn.Parameter(randn(rng, 6, 4, 3, 3))
    inputs = {x.data_ptr(): x}
    fast_glue.launcher = FakeLauncher(weight.detach(), inputs)
    with torch.no_grad():
        assert gpu.fast_call(x, weight, 1, 1, "megakernel", "3xtf32") is None    # no full call yet
        run_gpu(x, weight, algo="megakernel")
        assert gpu.fast_call(x, weight, 1, 1, "pytorch", "3xtf32") is None
        fast = gpu.fast_call(x, weight, 1, 1, "megakernel", "3xtf32")
        y = fast(x, weight)
    assert fast_glue.launcher.calls == [(x.data_ptr(), y.data_ptr())]
    assert y.shape == (2, 6, 8, 8) and rel_l2(y, reference(x, weight, padding=1)) < 1e-6
    # Each difference from the call it was made after sends the call to the full path.
    other = randn(rng, 2, 4, 8, 8)
    inputs[other.data_ptr()] = other
    with torch.no_grad():
        assert rel_l2(fast(other, weight), reference(other, weight, padding=1)) < 1e-6   # another input
        assert fast(randn(rng, 1, 4, 8, 8), weight) is None                  # another shape
        assert fast(x.double(), weight) is None                              # another dtype
        assert fast(x.contiguous(memory_format=torch.channels_last), weight) is None   # another layout
        assert fast(x.transpose(2, 3), weight) is None                       # not contiguous
        shifted = torch.empty(x.numel() + 1)[1:].view_as(x).copy_(x)
        assert fast(shifted, weight) is None                                 # 4-byte aligned only
        assert fast(x, nn.Parameter(weight.detach().clone())) is None        # another weight tensor
    assert fast(x.requires_grad_(), weight) is None                          # autograd
    x.requires_grad_(False)
    fast_glue.stream["handle"] = 9
    assert fast(x, weight) is None                                           # another stream
    fast_glue.stream["handle"] = 7
    monkeypatch.setattr(torch.cuda, "is_current_stream_capturing", lambda: True)
    assert fast(x, weight) is None                                           # CUDA-graph capture
    monkeypatch.setattr(torch.cuda, "is_current_stream_capturing", lambda: False)
    fast_glue.launcher.is_valid = False
    assert fast(x, weight) is None                                           # prepared weight dropped
    fast_glue.launcher.is_valid = True
    calls = len(fast_glue.launcher.calls)
    with torch.no_grad():
        assert fast(x, weight) is not None
        weight.mul_(2)                                                       # an in-place change
        assert fast(x, weight) is None
        fast = gpu.fast_call(x, weight, 1, 1, "megakernel", "3xtf32")
        assert fast(x, weight) is not None
        gpu.weights_changed()                                                # a change torch cannot see
        assert fast(x, weight) is None
    assert len(fast_glue.launcher.calls) == calls + 2


def test_fast_call_is_not_made_where_the_full_path_must_run(rng, fast_glue):
    x, weight = randn(rng, 1, 4, 8, 8), randn(rng, 4, 4, 3, 3)
    fast_glue.launcher = None                       # the plan has no launcher for this call
    with torch.no_grad():
        run_gpu(x, weight, algo="megakernel")
        assert gpu.fast_call(x, weight, 1, 1, "megakernel", "3xtf32") is None
        fast_glue.launcher = FakeLauncher(weight, {})
        assert gpu.fast_call(x, weight, 1, 1, "megakernel", "3xtf32") is not None
        # An input that run_gpu copies into its layout (the weight is channels_last) is not taken.
        cl_weight = weight.contiguous(memory_format=torch.channels_last)
        run_gpu(x, cl_weight, algo="megakernel")
        assert gpu.fast_call(x, cl_weight, 1, 1, "megakernel", "3xtf32") is None
    with torch.inference_mode():                    # inference tensors carry no version: no token
        w_inf = randn(rng, 4, 4, 3, 3)
        run_gpu(x, w_inf, algo="megakernel")
        assert gpu.fast_call(x, w_inf, 1, 1, "megakernel", "3xtf32") is None


def test_copied_and_pickled_layers_make_their_own_fast_calls():
    import copy
    import pickle
    fast = gpu.FastCall.__new__(gpu.FastCall)
    assert copy.deepcopy({"k": fast}) == {"k": None}
    assert pickle.loads(pickle.dumps({"k": fast})) == {"k": None}


def test_kept_buffers_are_made_outside_the_callers_thread(monkeypatch):
    """torch.compile's CUDA graphs route the warming thread's allocations into the graph's pool:
    the runtime's workspaces are made on a thread of megawino's own, on the caller's stream and
    device; under capture (only the graph's pool may serve) on the caller's thread."""
    import threading
    seen = []
    monkeypatch.setattr(torch.cuda, "current_stream", lambda index=None: ("stream", index))
    monkeypatch.setattr(torch.cuda, "device", lambda index: seen.append(("device", index)) or _Nothing())
    monkeypatch.setattr(torch.cuda, "stream", lambda stream: seen.append(("stream", stream)) or _Nothing())
    made = gpu.outside_graph_pools(lambda: threading.current_thread(), 3)
    assert made is not threading.current_thread() and made.name.startswith("megawino-allocate")
    assert seen == [("device", 3), ("stream", ("stream", 3))]

    class FakeCupy:
        uint8 = "uint8"

        class cuda:
            class Device:
                id = 3
    threads = []
    monkeypatch.setitem(__import__("sys").modules, "cupy", FakeCupy)
    monkeypatch.setattr(gpu, "_cupy_view", lambda cupy, tensor, index, dtype: tensor)
    monkeypatch.setattr(torch, "empty", lambda *a, **k: threads.append(threading.current_thread()))
    for capturing in (False, True):
        monkeypatch.setattr(torch.cuda, "is_current_stream_capturing", lambda: capturing)
        gpu._torch_workspace(64)
    assert threads[0].name.startswith("megawino-allocate") and threads[1] is threading.current_thread()


class _Nothing:
    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False
