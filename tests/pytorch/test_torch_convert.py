"""megawino.torch.convert on the CPU: which layers convert, state_dict round trips, the report,
and converted models (small ones, the YOLOv3-style model of bench/darknet.py) through the CPU
executor against PyTorch; bench/models.py's pure helpers."""
import collections
import copy
import json
import sys
from pathlib import Path

import numpy as np
import pytest

torch = pytest.importorskip("torch")
from torch import nn  # noqa: E402
import torch.nn.functional as F  # noqa: E402

import megawino.torch as mwt  # noqa: E402
from torch_support import randn, reference, rel_l2  # noqa: E402

BENCH = Path(__file__).resolve().parents[2] / "bench"


@pytest.fixture
def rng():
    return torch.Generator().manual_seed(13)


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
        "conv1x7": nn.Conv2d(8, 8, (1, 7), padding=(0, 3)),      # Inception-v3's factorised 7x7
        "conv7x1": nn.Conv2d(8, 8, (7, 1), padding=(3, 0)),
        "same1x5": nn.Conv2d(8, 8, (1, 5), padding="same"),
        "same4x4": nn.Conv2d(8, 8, 4, padding="same"),           # PyTorch pads one side more
        "huge": nn.Conv2d(2, 2, 17, padding=8),
        "float64": nn.Conv2d(4, 4, 3).double(),
        "own_forward": OwnForward(4, 4, 3),
    })


LEFT_ALONE = {"dilated": "dilation", "grouped": "groups", "depthwise": "groups", "reflect": "padding_mode",
              "same4x4": "padding='same'", "huge": "17x17", "float64": "float32",
              "own_forward": "OwnForward"}
REPLACED = ["conv1x1", "conv1x7", "conv3x3", "conv3x3s2", "conv7x1", "conv7x7", "pad10", "same1x5",
            "same5x5", "stride21"]


def test_convert_replaces_what_megawino_runs():
    model = zoo()
    before = {name: type(m) for name, m in model.named_modules()}
    params = {name: p for name, p in model.named_parameters()}
    assert mwt.convert(model, backend="cpu", verbose=False) is model
    rep = mwt.report(model)
    assert sorted(rep.replaced) == REPLACED
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
    assert f"{len(REPLACED)} of {len(zoo())} Conv2d layers" in text
    assert "chosen at first call" in text
    shapes = {row.name: row.shape for row in mwt.report(model).rows}
    assert shapes["conv3x3s2"] == "8->16 3x3 s2 p1"
    assert shapes["stride21"] == "8->8 3x3 s2x1 p1"
    assert shapes["same5x5"] == "8->8 5x5 s1 psame"
    assert shapes["conv1x7"] == "8->8 1x7 s1 p0x3"


# ---------------------------------------------------------------------------
# The YOLOv3-style model of bench/darknet.py and bench/models.py's pure helpers
# ---------------------------------------------------------------------------

def _bench_module(name):
    if str(BENCH) not in sys.path:
        sys.path.insert(0, str(BENCH))
    return __import__(name)


def test_darknet_converts_every_conv_and_matches_torch(rng):
    darknet = _bench_module("darknet")
    from megawino.core.networks import yolov3
    torch.manual_seed(0)
    model = darknet.YOLOv3(num_classes=3, width=4).eval()
    reference_model = copy.deepcopy(model).double()
    x = randn(rng, 1, 3, 32, 32)
    mwt.convert(model, backend="cpu", example_input=x, verbose=False)
    rep = mwt.report(model)
    assert len(rep.replaced) == len(rep.rows) == 75 and not rep.left_alone
    # The full-width network has exactly the conv shapes of megawino.core.networks' YOLOv3 table.
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


def test_bench_models_gemm_math_reaches_convert(monkeypatch, tmp_path, capsys):
    """--gemm-math parses (megawino's own list, the package default), reaches convert() and is
    recorded in the JSON, in each row and in the table's title."""
    from megawino.gpu.nvrtc import DEFAULT_GEMM_MATH
    models = _bench_module("models")
    assert models.parse_args([]).gemm_math == DEFAULT_GEMM_MATH
    assert models.parse_args(["--gemm-math", "bf16x3"]).gemm_math == "bf16x3"
    with pytest.raises(SystemExit):
        models.parse_args(["--gemm-math", "tf32"])
    calls = []
    monkeypatch.setattr(mwt, "convert", lambda model, **kwargs: calls.append(kwargs) or model)
    net, x = nn.Conv2d(3, 4, 3), randn(torch.Generator().manual_seed(0), 1, 3, 8, 8)
    assert models.convert_model(net, x, "bf16x3") is net
    assert calls[0]["gemm_math"] == "bf16x3" and calls[0]["example_input"] is x
    ran = []

    def fake_bench_model(name, batch, reps, seed, gemm_math, graphs):
        ran.append(gemm_math)
        ms = {f"{v}_ms": 1.0 for v in ("pytorch_fp32", "pytorch_tf32", "megawino")}
        graph = {"graph_speedup_vs_fp32": 1.25, "graph_speedup_vs_tf32": 0.75} if graphs else {}
        return {"model": name, "batch": batch, "gemm_math": gemm_math, **ms, **graph,
                "speedup_vs_fp32": 1.0, "speedup_vs_tf32": 1.0, "algos": {"megakernel": 1},
                "rel_l2": {"megawino": 1e-4, "pytorch_fp32": 1e-6, "pytorch_tf32": 1e-3}}

    monkeypatch.setattr(models, "bench_model", fake_bench_model)
    monkeypatch.setattr(models, "host_overhead", lambda calls: [])
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda: "Fake GPU")
    out = tmp_path / "m.json"
    argv = ["--models", "resnet50", "--batches", "1", "--gemm-math", "bf16x3", "--json", str(out)]
    assert models.main(argv) == 0
    doc = json.loads(out.read_text())
    assert ran == ["bf16x3"] and doc["gemm_math"] == "bf16x3" and doc["argv"] == argv
    assert doc["rows"][0]["gemm_math"] == "bf16x3"
    printed = capsys.readouterr().out
    assert "gemm_math=bf16x3" in printed and "1.25" in printed and "0.75" in printed
    assert models.main(argv + ["--no-graphs"]) == 0
    assert "graph_speedup_vs_fp32" not in json.loads(out.read_text())["rows"][0]


def test_a_layer_that_ran_pytorch_takes_the_short_path_next_time(monkeypatch):
    """After the measured choice sends a layer to PyTorch, the next call with the same input
    signature skips megawino's checks; a new signature goes through them again."""
    import torch
    import megawino.torch as mwt
    from megawino.torch import modules
    conv = torch.nn.Conv2d(3, 5, 3, padding=1)
    mwt.convert(conv, backend="cpu", verbose=False)
    calls = []
    real = modules.conv2d_with_algo

    def counting(*args, **kwargs):
        calls.append(1)
        out, _ = real(*args, **kwargs)
        return out, "pytorch"
    monkeypatch.setattr(modules, "conv2d_with_algo", counting)
    x = torch.randn(2, 3, 6, 6)
    with torch.inference_mode():
        first = conv(x)
        second = conv(x)
        third = conv(torch.randn(1, 3, 6, 6))
    assert len(calls) == 2                      # the second call took the short path
    assert torch.allclose(first, second, rtol=1e-5, atol=1e-5)
    assert third.shape == (1, 5, 6, 6)
    ref = torch.nn.functional.conv2d(x, conv.weight, conv.bias, 1, 1)
    assert torch.allclose(second, ref, rtol=1e-5, atol=1e-5)
