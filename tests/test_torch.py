"""megawino.torch on the CPU: which layers convert, argument handling and refusals, and
converted models through the CPU executor against torch.nn.functional.conv2d."""
import collections
import copy
import subprocess
import sys
import warnings

import numpy as np
import pytest

torch = pytest.importorskip("torch")
from torch import nn  # noqa: E402
import torch.nn.functional as F  # noqa: E402

import megawino.torch as mwt  # noqa: E402
from megawino.torch import functional  # noqa: E402
from megawino.spec import LayerSpec  # noqa: E402


def rel_l2(y, ref) -> float:
    ref = ref.double()
    return float((y.detach().double() - ref.detach()).norm() / ref.detach().norm())


def reference(x, w, b=None, stride=1, padding=0):
    """float64 F.conv2d."""
    return F.conv2d(x.double(), w.double(), None if b is None else b.double(), stride, padding)


@pytest.fixture
def rng():
    return torch.Generator().manual_seed(12)


def randn(rng, *shape):
    return torch.randn(*shape, generator=rng)


def test_import_megawino_does_not_import_torch():
    code = ("import sys, megawino; megawino.LayerSpec(1, 2, 3, 4, 4); "
            "import megawino.executor, megawino.runtime; print('torch' in sys.modules)")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert result.stdout.strip() == "False"


# ---------------------------------------------------------------------------
# conv2d, CPU backend
# ---------------------------------------------------------------------------

@pytest.mark.parametrize("n, c, k, h, w, r, stride, padding, algo", [
    (2, 3, 8, 9, 9, 3, 1, 1, "cpu-executor"),
    (2, 5, 4, 7, 11, 3, 1, 0, "cpu-executor"),
    (1, 4, 6, 6, 6, 3, 1, 2, "cpu-executor"),
    (2, 4, 6, 8, 8, 3, (1, 1), (1, 1), "cpu-executor"),
    (2, 4, 6, 8, 8, 3, 1, "same", "cpu-executor"),
    (2, 4, 6, 8, 8, 3, 1, "valid", "cpu-executor"),
    (2, 4, 6, 9, 9, 3, 2, 1, "pytorch-cpu"),
    (2, 6, 5, 5, 5, 1, 1, 0, "pytorch-cpu"),
    (2, 3, 4, 12, 12, 7, 2, 3, "pytorch-cpu"),
    (2, 3, 4, 8, 8, 5, 1, "same", "pytorch-cpu"),
])
@pytest.mark.parametrize("with_bias", [False, True])
def test_conv2d_cpu_matches_torch(rng, n, c, k, h, w, r, stride, padding, algo, with_bias):
    x, weight = randn(rng, n, c, h, w), randn(rng, k, c, r, r)
    bias = randn(rng, k) if with_bias else None
    with torch.no_grad():
        y, ran = functional.conv2d_with_algo(x, weight, bias, stride, padding, backend="cpu")
    ref = F.conv2d(x.double(), weight.double(), None if bias is None else bias.double(), stride, padding)
    assert ran == algo
    assert y.dtype == torch.float32 and y.shape == ref.shape
    assert rel_l2(y, ref) < 1e-5


def test_conv2d_cpu_bias_is_added(rng):
    x, weight, bias = randn(rng, 2, 3, 6, 6), randn(rng, 4, 3, 3, 3), randn(rng, 4) + 5
    y_bias = mwt.conv2d(x, weight, bias, padding=1, backend="cpu")
    y = mwt.conv2d(x, weight, padding=1, backend="cpu")
    assert torch.allclose(y_bias - y, bias.view(1, -1, 1, 1).expand_as(y), atol=1e-5)


def test_conv2d_cpu_channels_last_in_channels_last_out(rng):
    x = randn(rng, 2, 4, 7, 9).to(memory_format=torch.channels_last)
    weight, bias = randn(rng, 6, 4, 3, 3), randn(rng, 6)
    y = mwt.conv2d(x, weight, bias, padding=1, backend="cpu")
    assert y.is_contiguous(memory_format=torch.channels_last) and not y.is_contiguous()
    assert rel_l2(y, reference(x, weight, bias, padding=1)) < 1e-5
    y_plain = mwt.conv2d(x.contiguous(), weight, bias, padding=1, backend="cpu")
    assert y_plain.is_contiguous()
    assert rel_l2(y_plain, reference(x, weight, bias, padding=1)) < 1e-5


def test_conv2d_cpu_unbatched_input(rng):
    x, weight = randn(rng, 3, 6, 6), randn(rng, 5, 3, 3, 3)
    y = mwt.conv2d(x, weight, padding=1, backend="cpu")
    assert y.shape == (5, 6, 6)
    assert rel_l2(y, reference(x.unsqueeze(0), weight, padding=1).squeeze(0)) < 1e-5


def test_conv2d_cpu_algo_pytorch_forces_torch(rng):
    x, weight = randn(rng, 1, 3, 6, 6), randn(rng, 2, 3, 3, 3)
    with torch.no_grad():
        y, ran = functional.conv2d_with_algo(x, weight, padding=1, backend="cpu", algo="pytorch")
    assert ran == "pytorch"
    assert torch.equal(y, F.conv2d(x, weight, padding=1))


REFUSALS = [
    (dict(dilation=2), "dilation"),
    (dict(dilation=(1, 2)), "dilation"),
    (dict(groups=2), "groups"),
    (dict(stride=(1, 2)), "stride"),
    (dict(stride=0), "stride"),
    (dict(stride=1.5), "stride"),
    (dict(padding=(1, 0)), "padding"),
    (dict(padding=-1), "padding"),
    (dict(padding="full"), "padding"),
    (dict(padding="same", stride=2), "padding='same'"),
    (dict(backend="tpu"), "backend"),
    (dict(algo="winograd"), "algo"),
    (dict(algo="direct"), "algo"),            # backend='cpu' has no GPU paths
    (dict(gemm_math="fp16"), "gemm_math"),
]


@pytest.mark.parametrize("kwargs, name", REFUSALS)
def test_conv2d_refusals_name_the_argument(rng, monkeypatch, kwargs, name):
    def must_not_run(*args, **kw):
        raise AssertionError("ran before refusing")
    monkeypatch.setattr("megawino.executor.conv2d_cpu", must_not_run)
    monkeypatch.setattr(functional, "_gpu", must_not_run)
    x, weight = randn(rng, 2, 4, 8, 8), randn(rng, 4, 4, 3, 3)
    kwargs = {"backend": "cpu", **kwargs}
    with pytest.raises(ValueError, match=name):
        mwt.conv2d(x, weight, **kwargs)


@pytest.mark.parametrize("make, name", [
    (lambda r: (randn(r, 2, 4, 8, 8).double(), randn(r, 4, 4, 3, 3), None), "input"),
    (lambda r: (randn(r, 2, 4, 8, 8), randn(r, 4, 4, 3, 3).half(), None), "weight"),
    (lambda r: (randn(r, 2, 4, 8, 8), randn(r, 4, 4, 3, 3), randn(r, 4).double()), "bias"),
    (lambda r: (randn(r, 2, 4, 8, 8), randn(r, 4, 4, 3, 3), randn(r, 5)), "bias"),
    (lambda r: (randn(r, 1, 2, 4, 8, 8), randn(r, 4, 4, 3, 3), None), "input"),
    (lambda r: (randn(r, 2, 4, 8, 8), randn(r, 4, 4, 3), None), "weight"),
    (lambda r: (randn(r, 2, 5, 8, 8), randn(r, 4, 4, 3, 3), None), "weight"),
    (lambda r: (np.ones((2, 4, 8, 8), np.float32), randn(r, 4, 4, 3, 3), None), "input"),
    (lambda r: (randn(r, 2, 4, 8, 8), randn(r, 4, 4, 3, 3).to_sparse(), None), "weight"),
    (lambda r: (randn(r, 2, 4, 8, 8), randn(r, 4, 4, 3, 3).to("meta"), None), "weight"),
])
def test_conv2d_tensor_refusals_name_the_argument(rng, make, name):
    x, weight, bias = make(rng)
    with pytest.raises(ValueError, match=name):
        mwt.conv2d(x, weight, bias, padding=1, backend="cpu")


def test_cpu_tensors_need_the_cpu_backend(rng):
    x, weight = randn(rng, 2, 4, 8, 8), randn(rng, 4, 4, 3, 3)
    for backend in ("auto", "gpu"):
        with pytest.raises(ValueError, match="backend='cpu'"):
            mwt.conv2d(x, weight, padding=1, backend=backend)
    with pytest.raises(ValueError, match="meta"):
        mwt.conv2d(x.to("meta"), weight.to("meta"), padding=1, backend="cpu")


def test_padding_same_needs_odd_square_filter():
    assert functional.conv_arguments((5, 5), 1, "same") == (1, 2)
    assert functional.conv_arguments((3, 3), (2, 2), "valid") == (2, 0)
    for kernel in ((4, 4), (3, 5)):
        with pytest.raises(ValueError, match="padding='same'"):
            functional.conv_arguments(kernel, 1, "same")


def test_autograd_falls_back_with_one_warning(rng, monkeypatch):
    monkeypatch.setattr(functional, "_autograd_warned", False)
    weight = randn(rng, 4, 3, 3, 3).requires_grad_()
    x = randn(rng, 2, 3, 6, 6)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        outs = [functional.conv2d_with_algo(x, weight, padding=1, backend="cpu") for _ in range(3)]
    assert [w.category for w in caught] == [UserWarning]
    assert "inference" in str(caught[0].message)
    assert all(ran == "pytorch-autograd" for _, ran in outs)
    y = outs[0][0]
    assert torch.equal(y, F.conv2d(x, weight, padding=1))
    y.square().sum().backward()
    assert weight.grad is not None and weight.grad.abs().sum() > 0
    with torch.no_grad():
        assert functional.conv2d_with_algo(x, weight, padding=1, backend="cpu")[1] == "cpu-executor"


# ---------------------------------------------------------------------------
# weight tokens and the GPU-side helpers that need no GPU
# ---------------------------------------------------------------------------

def test_weight_token_follows_every_change(rng):
    conv = nn.Conv2d(3, 4, 3)
    w = conv.weight
    token = functional.weight_token(w)
    assert functional.weight_token(w) == token
    hash(token)
    with torch.no_grad():
        w.add_(1)
    after_add = functional.weight_token(w)
    assert after_add != token
    conv.load_state_dict(nn.Conv2d(3, 4, 3).state_dict())
    after_load = functional.weight_token(w)
    assert after_load not in (token, after_add)
    functional.weights_changed()
    assert functional.weight_token(w) != after_load
    # A new tensor gets a new token even where it has the same address and version.
    a = randn(rng, 4, 3, 3, 3)
    b = a.view(a.shape)
    assert b.data_ptr() == a.data_ptr() and b._version == a._version
    assert functional.weight_token(a) != functional.weight_token(b)
    with torch.inference_mode():
        assert functional.weight_token(torch.ones(2, 2, 3, 3)) is None


def test_ieee_fp32_convolutions_restores_the_setting():
    conv_flags = torch.backends.cudnn.conv
    before = conv_flags.fp32_precision
    with functional._ieee_fp32_convolutions():
        assert conv_flags.fp32_precision == "ieee"
    assert conv_flags.fp32_precision == before


@pytest.mark.parametrize("spec, algos", [
    (LayerSpec(8, 64, 64, 56, 56), ("megakernel", "nonfused", "direct", "pytorch")),
    (LayerSpec(8, 64, 64, 56, 56, 1, 1, 1, 0), ("direct", "pytorch")),
    (LayerSpec(8, 64, 64, 56, 56, 3, 3, 2, 1), ("direct", "pytorch")),
    (LayerSpec(1, 3, 8, 40, 40, 17, 17, 1, 8), ("pytorch",)),
])
def test_candidate_algos(spec, algos):
    assert functional.candidate_algos(spec) == algos


# ---------------------------------------------------------------------------
# convert, MegawinoConv2d, report
# ---------------------------------------------------------------------------

class OwnForward(nn.Conv2d):
    """A Conv2d subclass with its own forward: convert must leave it alone."""

    def forward(self, input):
        return super().forward(input) * 2


def zoo() -> nn.ModuleDict:
    """One conv of each kind; the value says whether megawino takes it."""
    return nn.ModuleDict({
        "conv1x1": nn.Conv2d(8, 16, 1),
        "conv3x3": nn.Conv2d(8, 16, 3, padding=1),
        "conv3x3s2": nn.Conv2d(8, 16, 3, stride=2, padding=1, bias=False),
        "conv7x7": nn.Conv2d(3, 8, 7, stride=2, padding=3),
        "same5x5": nn.Conv2d(8, 8, 5, padding="same"),
        "dilated": nn.Conv2d(8, 8, 3, padding=2, dilation=2),
        "grouped": nn.Conv2d(8, 16, 3, padding=1, groups=2),
        "depthwise": nn.Conv2d(8, 8, 3, padding=1, groups=8),
        "reflect": nn.Conv2d(8, 8, 3, padding=1, padding_mode="reflect"),
        "stride21": nn.Conv2d(8, 8, 3, stride=(2, 1), padding=1),
        "pad10": nn.Conv2d(8, 8, 3, padding=(1, 0)),
        "huge": nn.Conv2d(2, 2, 17, padding=8),
        "float64": nn.Conv2d(4, 4, 3).double(),
        "own_forward": OwnForward(4, 4, 3),
    })


LEFT_ALONE = {"dilated": "dilation", "grouped": "groups", "depthwise": "groups", "reflect": "padding_mode",
              "stride21": "stride", "pad10": "padding", "huge": "17x17", "float64": "float32",
              "own_forward": "OwnForward"}


def test_convert_replaces_what_megawino_runs():
    model = zoo()
    before = {name: type(m) for name, m in model.named_modules()}
    params = {name: p for name, p in model.named_parameters()}
    assert mwt.convert(model, backend="cpu", verbose=False) is model
    rep = mwt.report(model)
    assert sorted(rep.replaced) == ["conv1x1", "conv3x3", "conv3x3s2", "conv7x7", "same5x5"]
    assert set(rep.left_alone) == set(LEFT_ALONE)
    for name, word in LEFT_ALONE.items():
        assert word in rep.left_alone[name], (name, rep.left_alone[name])
        assert type(model[name]) is before[name]
    for name in rep.replaced:
        assert type(model[name]) is mwt.MegawinoConv2d
        assert model[name].megawino_backend == "cpu"
    # The same Parameter objects (optimizers and tied weights keep working).
    assert all(p is params[name] for name, p in model.named_parameters())


def test_convert_refuses_bad_settings_before_touching_the_model():
    model = zoo()
    for kwargs, name in ((dict(backend="tpu"), "backend"), (dict(algo="fast"), "algo"),
                         (dict(gemm_math="int8"), "gemm_math")):
        with pytest.raises(ValueError, match=name):
            mwt.convert(model, verbose=False, **kwargs)
    assert not any(isinstance(m, mwt.MegawinoConv2d) for m in model.modules())
    with pytest.raises(ValueError, match="model"):
        mwt.convert("resnet50")


def test_convert_twice_updates_settings():
    model = nn.Sequential(nn.Conv2d(3, 4, 3))
    mwt.convert(model, backend="cpu", verbose=False)
    mwt.convert(model, backend="gpu", algo="direct", verbose=False)
    assert type(model[0]) is mwt.MegawinoConv2d
    assert (model[0].megawino_backend, model[0].megawino_request) == ("gpu", "direct")


def test_state_dict_round_trip(rng):
    original = nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.BatchNorm2d(8), nn.ReLU(),
                             nn.Conv2d(8, 4, 1, bias=False))
    converted = mwt.convert(copy.deepcopy(original), backend="cpu", verbose=False)
    assert list(converted.state_dict()) == list(original.state_dict())
    for key, value in original.state_dict().items():
        assert torch.equal(converted.state_dict()[key], value)
    # A checkpoint of another (unconverted) model loads into the converted one, and back.
    other = nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.BatchNorm2d(8), nn.ReLU(),
                          nn.Conv2d(8, 4, 1, bias=False))
    converted.load_state_dict(other.state_dict())
    original.load_state_dict(converted.state_dict())
    x = randn(rng, 2, 3, 6, 6)
    with torch.no_grad():
        assert rel_l2(converted.eval()(x), other.eval().double()(x.double())) < 1e-5
        assert torch.equal(original.eval()(x), other.float()(x))


def test_megawino_conv2d_built_directly(rng):
    conv = mwt.MegawinoConv2d(4, 6, 3, padding=1, backend="cpu")
    x = randn(rng, 2, 4, 5, 5)
    with torch.no_grad():
        y = conv(x)
    assert conv.megawino_algo == "cpu-executor" and conv.megawino_input_shape == (2, 4, 5, 5)
    assert rel_l2(y, reference(x, conv.weight, conv.bias, padding=1)) < 1e-5
    assert "backend='cpu'" in repr(conv)
    with pytest.raises(ValueError, match="dilation"):
        mwt.MegawinoConv2d(4, 6, 3, dilation=2)
    with pytest.raises(ValueError, match="backend"):
        mwt.MegawinoConv2d(4, 6, 3, backend="tpu")


class SmallNet(nn.Module):
    """Convs of several kinds, ReLU, pooling and a residual add."""

    def __init__(self):
        super().__init__()
        self.stem = nn.Conv2d(3, 8, 3, padding=1)
        self.down = nn.Conv2d(8, 16, 3, stride=2, padding=1)
        self.body = nn.Conv2d(16, 16, 3, padding=1, bias=False)
        self.squeeze = nn.Conv2d(16, 8, 1)
        self.wide = nn.Conv2d(8, 8, 5, padding=2)
        self.head = nn.Conv2d(8, 10, 3, padding=0)

    def forward(self, x):
        x = F.relu(self.stem(x))
        x = F.max_pool2d(x, 2)
        x = F.relu(self.down(x))
        x = x + F.relu(self.body(x))
        x = F.relu(self.squeeze(x))
        x = F.avg_pool2d(F.relu(self.wide(x)), 1)
        return self.head(x).mean((2, 3))


@pytest.mark.parametrize("channels_last", [False, True])
def test_converted_models_match_torch(rng, channels_last):
    torch.manual_seed(3)
    models = [SmallNet(), nn.Sequential(nn.Conv2d(3, 6, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
                                        nn.Conv2d(6, 6, 3, padding=1), nn.ReLU(), nn.Conv2d(6, 4, 1))]
    x = randn(rng, 2, 3, 16, 16) + 0.5
    for model in models:
        model.eval()
        reference_model = copy.deepcopy(model).double()
        if channels_last:
            model = model.to(memory_format=torch.channels_last)
            x = x.contiguous(memory_format=torch.channels_last)
        mwt.convert(model, backend="cpu", example_input=x, verbose=False)
        rep = mwt.report(model)
        assert not rep.left_alone
        runs = {row.name: row.algo for row in rep.rows}
        assert "cpu-executor" in runs.values()
        for row in rep.rows:
            r, s = row.kernel_size
            expected = "cpu-executor" if (r, s, row.stride) == (3, 3, (1, 1)) else "pytorch-cpu"
            assert row.algo == expected, row
            assert row.input_shape is not None and row.input_shape[0] == 2
        with torch.inference_mode():
            y = model(x)
        ref = reference_model(x.double())
        assert y.abs().max() > 0
        assert rel_l2(y, ref) < 1e-5


def test_report_table_lists_every_layer():
    from rich.console import Console
    model = mwt.convert(zoo(), backend="cpu", verbose=False)
    console = Console(record=True, width=200)
    console.print(mwt.report(model))
    text = console.export_text()
    for name in zoo().keys():
        assert name in text
    assert "5 of 14 Conv2d layers" in text
    assert "chosen at first call" in text


# ---------------------------------------------------------------------------
# The YOLOv3-style model of bench/darknet.py and bench/models.py's pure helpers
# ---------------------------------------------------------------------------

def _bench_module(name):
    from pathlib import Path
    bench = str(Path(__file__).resolve().parent.parent / "bench")
    if bench not in sys.path:
        sys.path.insert(0, bench)
    return __import__(name)


def test_darknet_converts_every_conv_and_matches_torch(rng):
    darknet = _bench_module("darknet")
    from megawino.networks import yolov3
    torch.manual_seed(0)
    model = darknet.YOLOv3(num_classes=3, width=4).eval()
    reference_model = copy.deepcopy(model).double()
    x = randn(rng, 1, 3, 32, 32)
    mwt.convert(model, backend="cpu", example_input=x, verbose=False)
    rep = mwt.report(model)
    assert len(rep.replaced) == len(rep.rows) == 75 and not rep.left_alone
    # The full-width network has exactly the conv shapes of megawino.networks' YOLOv3 table.
    full = darknet.YOLOv3()
    table = collections.Counter((s.spec.C, s.spec.K, s.spec.R, s.spec.stride) for s in yolov3(1, 416)
                                for _ in range(s.count))
    mine = collections.Counter((m.in_channels, m.out_channels, m.kernel_size[0], m.stride[0])
                               for m in full.modules() if isinstance(m, nn.Conv2d))
    assert mine == table
    with torch.inference_mode():
        outputs = model(x)
    references = reference_model(x.double())
    assert [tuple(o.shape) for o in outputs] == [(1, 24, 1, 1), (1, 24, 2, 2), (1, 24, 4, 4)]
    for out, ref in zip(outputs, references):
        assert rel_l2(out, ref) < 1e-5


def test_bench_models_helpers():
    models = _bench_module("models")
    out = [torch.tensor([[1.0, 3.0, 2.0], [5.0, 4.0, 0.0]])]
    ref = [torch.tensor([[1.0, 3.0, 2.5], [3.0, 4.0, 0.0]], dtype=torch.float64)]
    assert models.top1_agreement(out, ref) == 0.5
    expected = float(np.sqrt(0.25 + 4.0) / np.sqrt((ref[0] ** 2).sum().item()))
    assert models.rel_l2(out + out, ref + ref) == pytest.approx(expected)
    assert models.flat_outputs((out[0], out[0])) == [out[0], out[0]]
    assert models.jobs(models.parse_args(["--quick"])) == [(m, b[0]) for m, (b, _, _) in models.MODELS.items()]
    assert models.jobs(models.parse_args(["--models", "vgg16", "--batches", "2,4"])) == [("vgg16", 2), ("vgg16", 4)]
    for bad in (["--models", "alexnet"], ["--batches", "0"], ["--batches", "x"], ["--reps", "0"]):
        with pytest.raises(SystemExit):
            models.parse_args(bad)
