"""The later calls of converted layers on the GPU (megawino.torch.gpu.FastCall: the plan's
launches on the tensors' pointers): the full path's bits for every algorithm and layout, fresh
results after every kind of weight change, the watchdog, and threads on two streams."""
import concurrent.futures
import threading

import pytest

torch = pytest.importorskip("torch")
from torch import nn  # noqa: E402

import megawino  # noqa: E402
import megawino.torch as mwt  # noqa: E402
from megawino import runtime  # noqa: E402
from megawino.core.spec import LayerSpec  # noqa: E402
from megawino.torch import functional, gpu  # noqa: E402
from torch_support import randn, rel_l2, reference as f64  # noqa: E402

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="PyTorch without CUDA")]

TOL = 3e-6

# algo, (N, C, K, H, W), filter, stride, padding
CASES = [
    ("megakernel", (2, 16, 32, 20, 20), 3, 1, 1),
    ("nonfused", (2, 16, 32, 19, 21), 3, 1, 1),
    ("direct", (2, 8, 24, 17, 17), 3, 2, 1),
    ("pointwise", (2, 32, 64, 14, 14), 1, 1, 0),
]


@pytest.fixture
def gen():
    return torch.Generator(device="cuda").manual_seed(23)


@pytest.fixture
def fast_calls(monkeypatch):
    """How many converted-layer calls the fast path ran."""
    counter = {"ran": 0}
    original = gpu.FastCall.__call__

    def counting(self, x, weight, bias=None, stream=None):
        out = original(self, x, weight, bias, stream)
        counter["ran"] += out is not None
        return out
    monkeypatch.setattr(gpu.FastCall, "__call__", counting)
    return counter


def poison_allocator(shape, count=4):
    """Leave NaN-filled blocks of ``shape`` in torch's caching allocator, where the next outputs
    are likely allocated."""
    blocks = [torch.full(shape, float("nan"), device="cuda") for _ in range(count)]
    del blocks


def converted(algo, c, k, r, stride, padding, channels_last=False):
    conv = mwt.MegawinoConv2d(c, k, r, stride=stride, padding=padding, algo=algo).cuda().eval()
    with torch.no_grad():
        conv.bias.normal_()
    return conv.to(memory_format=torch.channels_last) if channels_last else conv


@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
@pytest.mark.parametrize("channels_last", [False, True])
def test_fast_calls_give_the_full_paths_bits(gen, fast_calls, case, channels_last):
    algo, (n, c, k, h, w), r, stride, padding = case
    conv = converted(algo, c, k, r, stride, padding)
    fmt = torch.channels_last if channels_last else torch.contiguous_format
    xs = [randn(gen, n, c, h, w).contiguous(memory_format=fmt) for _ in range(3)]
    with torch.inference_mode():
        full = [functional.conv2d_with_algo(x, conv.weight, conv.bias, stride, padding, algo=algo)[0]
                for x in xs]
        conv(xs[0])                                     # the full path, then the launcher is made
        outs = []
        for x in xs + xs:
            poison_allocator(full[0].shape)
            outs.append(conv(x))
    torch.cuda.synchronize()
    megawino.synchronize()
    assert fast_calls["ran"] == 6, "the later calls did not take the fast path"
    for i, y in enumerate(outs):
        ref_full = full[i % 3]
        assert y.is_contiguous(memory_format=fmt) and y.shape == ref_full.shape
        assert torch.equal(y, ref_full), (algo, i)
        assert rel_l2(y, f64(xs[i % 3], conv.weight, conv.bias, stride, padding)) < TOL


@pytest.mark.parametrize("algo", ["megakernel", "nonfused", "direct", "pointwise"])
def test_fast_calls_follow_weight_changes(gen, fast_calls, algo):
    r, padding = (1, 0) if algo == "pointwise" else (3, 1)
    conv = converted(algo, 16, 16, r, 1, padding)
    x = randn(gen, 2, 16, 12, 12)

    def check(note):
        with torch.inference_mode():
            for _ in range(2):
                y = conv(x)
        assert rel_l2(y, f64(x, conv.weight, conv.bias, padding=padding)) < TOL, note
    check("first")
    with torch.no_grad():
        conv.weight.add_(1)                              # in place: the version counter moves
    check("in-place change")
    conv.load_state_dict(nn.Conv2d(16, 16, r, padding=padding).cuda().state_dict())
    check("load_state_dict")
    conv.weight.data.copy_(randn(gen, *conv.weight.shape))   # unseen by the version counter...
    mwt.weights_changed()                                     # ...so the user says so
    check("weights_changed")
    conv.weight = nn.Parameter(randn(gen, *conv.weight.shape))
    check("a new Parameter")
    assert fast_calls["ran"] >= 5


def test_a_fired_watchdog_surfaces_through_fast_calls(gen, fast_calls, monkeypatch):
    monkeypatch.setenv("MEGAWINO_WATCHDOG_S", "0.5")
    n, c, k, h, w = 2, 24, 24, 16, 16
    conv = converted("megakernel", c, k, 3, 1, 1)
    x = randn(gen, n, c, h, w)
    with torch.inference_mode():
        good = conv(x)
        conv(x)
    assert fast_calls["ran"] == 1
    plan = runtime.cached_plan(LayerSpec(n, c, k, h, w), "megakernel", "3xtf32", x.device.index)
    assert plan.timeout_s == 0.5
    plan._debug_break_counter(plan.task_layout.counter_inputs_done(0))   # the default stream's workspace
    with torch.inference_mode():
        conv(x)                                          # fires
        torch.cuda.synchronize()
        with pytest.raises(RuntimeError, match=r"launch \d+: ticket \d+"):
            conv(x)                                      # the next call reports it, naming the launch
        again = conv(x)
    torch.cuda.synchronize()
    megawino.synchronize()                               # reported once, not again
    assert torch.equal(again, good)
    assert fast_calls["ran"] == 3


def test_threads_on_two_streams_give_the_single_stream_bits(gen, fast_calls):
    layers = [converted(algo, c, k, r, stride, padding) for algo, (_, c, k, _, _), r, stride, padding in CASES]
    inputs = [randn(gen, n, c, h, w) for _, (n, c, _, h, w), _, _, _ in CASES]
    with torch.inference_mode():
        expected = [conv(x) for conv, x in zip(layers, inputs)]
    torch.cuda.synchronize()
    streams = [torch.cuda.Stream() for _ in range(2)]
    failures, barrier = [], threading.Barrier(4)

    def hammer(index):
        stream = streams[index % 2]
        with torch.inference_mode(), torch.cuda.stream(stream):
            barrier.wait()
            for round_ in range(40):
                outs = [conv(x) for conv, x in zip(layers, inputs)]
                stream.synchronize()
                for j, (y, ref) in enumerate(zip(outs, expected)):
                    if not torch.equal(y, ref):
                        failures.append(f"thread {index} round {round_}: {CASES[j][0]} differs")

    with concurrent.futures.ThreadPoolExecutor(4) as pool:
        list(pool.map(hammer, range(4)))          # an exception in a thread fails the test
    megawino.synchronize()
    assert not failures, failures[:5]
    assert fast_calls["ran"] > 4 * 40 * len(CASES) // 2
