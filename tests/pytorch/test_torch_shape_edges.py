"""megawino.torch on the CPU backend at every size-1 dimension (one image, one input or output
channel, a 1x1 image, an unbatched input, channels_last) and with the stride / padding pairs of
Inception-style layers, against float64 torch; tests/gpu/test_gpu_shape_edges.py runs them on the GPU."""
import pytest

torch = pytest.importorskip("torch")
from hypothesis import assume, given, settings, strategies as st  # noqa: E402
from torch import nn  # noqa: E402

import megawino.torch as mwt  # noqa: E402
from megawino.torch import functional  # noqa: E402
from torch_support import reference, rel_l2  # noqa: E402

SIZES = (1, 2, 3, 5, 32)
# The CPU executor's float32 Winograd against float64 (fuzz_support.REL_L2_TOL[4], m = 4).
TOLERANCE = 1e-4


def _tensors(n, c, k, h, w, r, s, seed=0):
    g = torch.Generator().manual_seed(seed)
    return (torch.rand(n, c, h, w, generator=g) * 2.5 - 0.5,
            torch.rand(k, c, r, s, generator=g) * 2.5 - 0.5,
            torch.rand(k, generator=g) - 0.5)


@settings(max_examples=60, deadline=None)
@given(dims=st.tuples(*[st.sampled_from(SIZES)] * 5), channels_last=st.booleans(),
       padding=st.integers(0, 2))
def test_conv2d_cpu_backend_every_edge(dims, channels_last, padding):
    n, c, k, h, w = dims
    assume(n * c * k * h * w <= 1 << 16 and h + 2 * padding >= 3 and w + 2 * padding >= 3)
    x, weight, bias = _tensors(n, c, k, h, w, 3, 3)
    if channels_last:
        x = x.contiguous(memory_format=torch.channels_last)
    out, ran = functional.conv2d_with_algo(x, weight, bias, 1, padding, backend="cpu")
    assert ran == "cpu-executor"
    assert out.shape == (n, k, h + 2 * padding - 2, w + 2 * padding - 2)
    assert rel_l2(out, reference(x, weight, bias, 1, padding)) < TOLERANCE


def test_unbatched_one_channel_input():
    x, weight, bias = _tensors(1, 1, 1, 1, 1, 3, 3)
    out = mwt.conv2d(x[0], weight, bias, padding=1, backend="cpu")
    assert out.shape == (1, 1, 1)
    assert rel_l2(out, reference(x, weight, bias, 1, 1)[0]) < TOLERANCE


def _heads() -> nn.Sequential:
    """A small U-Net-style decoder ending in one-channel heads, and Inception-style 1x7 / 7x1."""
    return nn.Sequential(
        nn.Conv2d(3, 8, 3, padding=1), nn.ReLU(),
        nn.Conv2d(8, 8, (1, 7), padding=(0, 3)), nn.Conv2d(8, 8, (7, 1), padding=(3, 0)),
        nn.Conv2d(8, 8, (1, 5), padding="same"), nn.Conv2d(8, 8, 3, stride=(2, 1), padding=(1, 0)),
        nn.Conv2d(8, 1, 3, padding=1), nn.Conv2d(1, 1, 1), nn.Conv2d(1, 1, 5, padding=2))


def test_convert_heads_and_factorised_filters():
    """Every layer of the model is converted (none is left alone for its shape) and the converted
    model returns what the original returns."""
    torch.manual_seed(3)
    model = _heads().eval()
    x = torch.rand(2, 3, 12, 9)
    with torch.no_grad():
        expected = model.double()(x.double())
        model.float()
        mwt.convert(model, backend="cpu", verbose=False)
        got = model(x)
    report = mwt.report(model)
    assert report.left_alone == {}
    assert rel_l2(got, expected) < TOLERANCE


def test_pairs_compile_into_the_operator():
    """A converted model with 1x7 / 7x1 layers and a stride pair compiles (one graph, the
    registered operator with its [h, w] lists) to the eager result."""
    torch.manual_seed(6)
    model = _heads().eval()
    mwt.convert(model, backend="cpu", verbose=False)
    x = torch.rand(1, 3, 10, 9)
    with torch.no_grad():
        eager = model(x)
        torch._dynamo.reset()
        assert torch._dynamo.explain(model)(x).graph_break_count == 0
        compiled = torch.compile(model, backend="aot_eager", fullgraph=True)(x)
    assert torch.equal(compiled, eager)
