"""megawino.torch on the GPU under torch.compile (default and reduce-overhead), torch.export and
torch.autocast: converted torchvision ResNet-50 and a model with a single-output-channel head."""
import copy

import pytest

torch = pytest.importorskip("torch")
from torch import nn  # noqa: E402

import megawino.torch as mwt  # noqa: E402
from megawino.torch.gpu import MEGAWINO_ALGOS  # noqa: E402

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="PyTorch without CUDA")]

OP = torch.ops.megawino.conv2d


def rel_l2(y, ref) -> float:
    return float((y.double() - ref.double()).norm() / ref.double().norm())


class DepthHead(nn.Module):
    """A small encoder with single-output-channel heads (3x3 and 1x1), as depth or mask models have."""

    def __init__(self):
        super().__init__()
        self.encoder = nn.Sequential(nn.Conv2d(3, 32, 3, padding=1), nn.ReLU(), nn.Conv2d(32, 64, 3, padding=1),
                                     nn.ReLU(), nn.Conv2d(64, 64, 3, stride=2, padding=1), nn.ReLU())
        self.head3 = nn.Conv2d(64, 1, 3, padding=1)
        self.head1 = nn.Conv2d(64, 1, 1)

    def forward(self, x):
        features = self.encoder(x)
        return self.head3(features) + self.head1(features)


def resnet50():
    torchvision = pytest.importorskip("torchvision")
    return torchvision.models.resnet50(weights=None)


# The depth-head model is small enough that cuDNN wins every per-layer choice: it runs megawino's
# direct path on every layer so that the compiled graph holds megawino's kernels.
MODELS = {"resnet50": (resnet50, 8, 224, "auto"), "depth_head": (DepthHead, 2, 64, "direct")}


def converted(name):
    build, batch, size, algo = MODELS[name]
    torch.manual_seed(0)
    model = build().eval().cuda()
    x = torch.randn(batch, 3, size, size, device="cuda", generator=torch.Generator("cuda").manual_seed(1))
    converted_model = mwt.convert(copy.deepcopy(model), algo=algo, example_input=x, verbose=False)
    return model, converted_model, x


def op_calls(graph) -> int:
    return sum(node.op == "call_function" and node.target in (OP, OP.default) for node in graph.nodes)


# Compiled against eager: the converted layers give the same bits, but inductor fuses the layers
# around them (BatchNorm, ReLU, adds) in another order, which moves an unconverted ResNet-50 as
# much (1.71e-6 from eager on the H200, the converted one 1.72e-6; the depth-head model, which has
# no BatchNorm, 0).  So the converted model is held to the unconverted one's own difference.
COMPILED_VS_EAGER = 1e-6
OWN_DIFFERENCE_FACTOR = 1.1


def compiled_outputs(model, x, mode: str) -> list:
    torch._dynamo.reset()
    compiled = torch.compile(model, mode=mode)
    return [compiled(x).clone() for _ in range(4)]      # warm-up, capture and replays


@pytest.mark.parametrize("name", list(MODELS))
@pytest.mark.parametrize("mode", ["default", "reduce-overhead"])
def test_compiled_converted_model_matches_eager(name, mode):
    unconverted, model, x = converted(name)
    replaced = len(mwt.report(model).replaced)
    torch._dynamo.reset()
    with torch.no_grad():
        explained = torch._dynamo.explain(model)(x)
        assert explained.graph_break_count == 0
        assert sum(op_calls(gm.graph) for gm in explained.graphs) == replaced > 0
        eager = model(x)
        outs = compiled_outputs(model, x, mode)
        with torch.backends.cudnn.flags(enabled=True, allow_tf32=False):   # IEEE fp32, as the converted layers
            own_eager = unconverted(x)
            own = max(rel_l2(out, own_eager) for out in compiled_outputs(unconverted, x, mode))
    bound = max(COMPILED_VS_EAGER, OWN_DIFFERENCE_FACTOR * own)
    for out in outs:
        assert rel_l2(out, eager) <= bound
    assert all(torch.equal(out, outs[-1]) for out in outs[2:])
    assert any(row.algo in MEGAWINO_ALGOS for row in mwt.report(model).rows)


def test_export_keeps_the_operator_on_the_gpu():
    _, model, x = converted("depth_head")
    with torch.no_grad():
        program = torch.export.export(model, (x,))
        assert op_calls(program.graph) == len(mwt.report(model).replaced)
        assert torch.equal(program.module()(x), model(x))


@pytest.mark.parametrize("name", list(MODELS))
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_autocast_gives_the_unconverted_models_bits(name, dtype):
    model, converted_model, x = converted(name)
    with torch.no_grad(), torch.autocast("cuda", dtype=dtype):
        assert torch.equal(converted_model(x), model(x))
    with torch.no_grad():        # converted, then cast: PyTorch's convolution in that dtype
        assert torch.equal(copy.deepcopy(converted_model).to(dtype)(x.to(dtype)), copy.deepcopy(model).to(dtype)(x.to(dtype)))
        assert converted_model(x[:0]).shape[0] == 0
