"""megawino.torch on the GPU: conv2d and converted models against float64 PyTorch, fresh
results after weight changes, CUDA-graph capture and replay, calls on a second stream."""
import copy

import pytest

torch = pytest.importorskip("torch")
from torch import nn  # noqa: E402
import torch.nn.functional as F  # noqa: E402

import megawino  # noqa: E402
import megawino.torch as mwt  # noqa: E402
from megawino.core.spec import LayerSpec  # noqa: E402
from megawino.torch import functional, gpu  # noqa: E402

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="PyTorch without CUDA")]

TOL = 3e-6       # rel. L2 vs float64 for one layer (the runtime's bar for every suite layer)


def rel_l2(y, ref) -> float:
    return float((y.double() - ref).norm() / ref.norm())


def f64(x, w, b=None, stride=1, padding=0):
    return F.conv2d(x.double(), w.double(), None if b is None else b.double(), stride, padding)


@pytest.fixture
def gen():
    return torch.Generator(device="cuda").manual_seed(5)


def randn(gen, *shape):
    return torch.randn(*shape, device="cuda", generator=gen)


# (N, C, K, H, W, R, stride, padding)
SHAPES = [
    (2, 16, 32, 20, 20, 3, 1, 1),
    (2, 3, 16, 33, 31, 3, 1, 1),
    (2, 32, 64, 14, 14, 1, 1, 0),
    (2, 16, 16, 17, 17, 3, 2, 1),
    (1, 3, 8, 30, 30, 7, 2, 3),
    (2, 8, 8, 12, 12, 3, 1, 0),
]


@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "n{}c{}k{}h{}w{}r{}u{}p{}".format(*s))
@pytest.mark.parametrize("channels_last", [False, True])
def test_conv2d_every_algo_matches_float64(gen, shape, channels_last):
    n, c, k, h, w, r, stride, padding = shape
    layout = "NHWC" if channels_last else "NCHW"
    spec = LayerSpec(n, c, k, h, w, r, r, stride, padding, layout)
    x, weight, bias = randn(gen, n, c, h, w), randn(gen, k, c, r, r), randn(gen, k)
    if channels_last:
        x = x.contiguous(memory_format=torch.channels_last)
    ref = f64(x, weight, bias, stride, padding)
    with torch.inference_mode():
        for algo in gpu.candidate_algos(spec) + ("auto",):
            y, ran = functional.conv2d_with_algo(x, weight, bias, stride, padding, algo=algo)
            torch.cuda.synchronize()
            assert ran in gpu.candidate_algos(spec)
            assert y.shape == ref.shape and y.dtype == torch.float32 and y.device == x.device
            assert y.is_contiguous(memory_format=torch.channels_last if channels_last
                                   else torch.contiguous_format), algo
            assert rel_l2(y, ref) < TOL, (algo, rel_l2(y, ref))
    megawino.synchronize()


def test_conv2d_padding_forms_and_unbatched(gen):
    x, weight = randn(gen, 4, 10, 10), randn(gen, 6, 4, 3, 3)
    with torch.inference_mode():
        same = mwt.conv2d(x, weight, padding="same", algo="megakernel")
        valid = mwt.conv2d(x, weight, padding="valid", stride=(1, 1), algo="direct")
    assert rel_l2(same, f64(x.unsqueeze(0), weight, padding=1).squeeze(0)) < TOL
    assert rel_l2(valid, f64(x.unsqueeze(0), weight).squeeze(0)) < TOL


def test_gpu_refusals(gen):
    x, weight = randn(gen, 2, 4, 8, 8), randn(gen, 4, 4, 3, 3)
    with pytest.raises(ValueError, match="backend"):
        mwt.conv2d(x, weight, backend="cpu")
    with pytest.raises(ValueError, match="input"):
        mwt.conv2d(x.double(), weight.double())
    with pytest.raises(ValueError, match="algo"):
        mwt.conv2d(x, weight[:, :, :1, :1].contiguous(), algo="megakernel")
    with pytest.raises(ValueError, match="weight"):
        mwt.conv2d(x, weight.cpu())


@pytest.mark.parametrize("algo", ["megakernel", "nonfused", "direct"])
def test_weight_changes_give_fresh_results(gen, algo):
    x = randn(gen, 2, 8, 12, 12)
    weight = randn(gen, 16, 8, 3, 3)
    with torch.inference_mode():
        first = mwt.conv2d(x, weight, padding=1, algo=algo)
    assert rel_l2(first, f64(x, weight, padding=1)) < TOL
    with torch.no_grad():
        weight.add_(1)                                   # in place: bumps the version counter
    with torch.inference_mode():
        assert rel_l2(mwt.conv2d(x, weight, padding=1, algo=algo), f64(x, weight, padding=1)) < TOL
    address = weight.data_ptr()
    del weight
    fresh = randn(gen, 16, 8, 3, 3)                      # likely at the freed address
    with torch.inference_mode():
        assert rel_l2(mwt.conv2d(x, fresh, padding=1, algo=algo), f64(x, fresh, padding=1)) < TOL
    fresh.data.copy_(randn(gen, 16, 8, 3, 3))            # invisible to the version counter...
    mwt.weights_changed()                         # ...so the user says so
    with torch.inference_mode():
        assert rel_l2(mwt.conv2d(x, fresh, padding=1, algo=algo), f64(x, fresh, padding=1)) < TOL
    assert address != 0


@pytest.mark.parametrize("algo", ["megakernel", "direct"])
def test_load_state_dict_gives_fresh_results(gen, algo):
    conv = mwt.MegawinoConv2d(8, 16, 3, padding=1, algo=algo).cuda().eval()
    x = randn(gen, 2, 8, 10, 10)
    with torch.inference_mode():
        before = conv(x)
    assert rel_l2(before, f64(x, conv.weight, conv.bias, padding=1)) < TOL
    other = nn.Conv2d(8, 16, 3, padding=1).cuda()
    conv.load_state_dict(other.state_dict())
    with torch.inference_mode():
        after = conv(x)
    assert rel_l2(after, f64(x, other.weight, other.bias, padding=1)) < TOL
    assert rel_l2(after, before.double()) > 1e-2


class SmallNet(nn.Module):
    def __init__(self):
        super().__init__()
        self.stem = nn.Conv2d(3, 16, 3, padding=1)
        self.body = nn.Conv2d(16, 32, 3, padding=1, bias=False)
        self.bn = nn.BatchNorm2d(32)
        self.down = nn.Conv2d(32, 32, 3, stride=2, padding=1)
        self.squeeze = nn.Conv2d(32, 16, 1)
        self.depthwise = nn.Conv2d(16, 16, 3, padding=1, groups=16)
        self.head = nn.Conv2d(16, 10, 1)

    def forward(self, x):
        x = F.relu(self.stem(x))
        x = F.relu(self.bn(self.body(x)))
        x = F.max_pool2d(F.relu(self.down(x)), 2)
        x = F.relu(self.depthwise(F.relu(self.squeeze(x))))
        return self.head(x).mean((2, 3))


def small_model():
    torch.manual_seed(1)
    return SmallNet().cuda().eval()


@pytest.mark.parametrize("channels_last", [False, True])
def test_converted_model_matches_float64(gen, channels_last):
    model = small_model()
    reference = copy.deepcopy(model).double()
    x = randn(gen, 2, 3, 32, 32)
    if channels_last:
        model = model.to(memory_format=torch.channels_last)
        x = x.contiguous(memory_format=torch.channels_last)
    mwt.convert(model, example_input=x)
    rep = mwt.report(model)
    assert set(rep.left_alone) == {"depthwise"}
    assert all(row.algo in functional.ALGOS for row in rep.rows if row.replaced)
    with torch.inference_mode():
        y = model(x)
        ref = reference(x.double())
    megawino.synchronize()
    assert rel_l2(y, ref) < 1e-5


def test_cuda_graph_replay_is_bitwise_eager(gen):
    model = mwt.convert(small_model(), verbose=False)
    static_x = randn(gen, 2, 3, 32, 32)
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.inference_mode():
        with torch.cuda.stream(side):                    # warm-up: choices, plans, compiles
            model(static_x)
        torch.cuda.current_stream().wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            static_y = model(static_x)
        assert all(row.algo is not None for row in mwt.report(model).rows if row.replaced)
        for _ in range(3):
            new_x = randn(gen, 2, 3, 32, 32)
            static_x.copy_(new_x)
            graph.replay()
            eager = model(new_x)
            torch.cuda.synchronize()
            assert torch.equal(static_y, eager)
            assert static_y.abs().max() > 0
    megawino.synchronize()


@pytest.mark.parametrize("algo", ["auto", "megakernel", "direct"])
def test_second_stream_gives_the_same_bits(gen, algo):
    x, weight, bias = randn(gen, 2, 16, 18, 18), randn(gen, 32, 16, 3, 3), randn(gen, 32)
    with torch.inference_mode():
        on_default = mwt.conv2d(x, weight, bias, padding=1, algo=algo)
        stream = torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):
            outputs = [mwt.conv2d(x, weight, bias, padding=1, algo=algo) for _ in range(4)]
        torch.cuda.current_stream().wait_stream(stream)
    torch.cuda.synchronize()
    megawino.synchronize()
    for y in outputs:
        assert torch.equal(y, on_default)
    assert rel_l2(on_default, f64(x, weight, bias, padding=1)) < TOL
