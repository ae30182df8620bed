"""megawino.torch under tracing and with the inputs megawino does not run, on the CPU backend:
torch.compile (aot_eager, inductor), torch.export and torch.jit.trace keep the registered
operator megawino::conv2d in their graphs; float16 / bfloat16 / float64, autocast, empty
batches and tensors on another device run nn.Conv2d's own convolution, bitwise, with one note."""
import copy
import shutil
import warnings

import pytest

torch = pytest.importorskip("torch")
from torch import nn  # noqa: E402
import torch.nn.functional as F  # noqa: E402

import megawino.torch as mwt  # noqa: E402
from megawino.torch import ops, routing  # noqa: E402
from torch_support import randn, rel_l2  # noqa: E402

OP = torch.ops.megawino.conv2d.default


@pytest.fixture
def rng():
    return torch.Generator().manual_seed(21)


class Head(nn.Module):
    """3x3 convs, a single-output-channel 1x1 head (a U-Net's), 'same' padding, a residual add."""

    def __init__(self):
        super().__init__()
        self.stem = nn.Conv2d(3, 8, 3, padding=1)
        self.body = nn.Conv2d(8, 8, 3, padding="same", bias=False)
        self.down = nn.Conv2d(8, 8, 3, stride=2, padding=1)
        self.head = nn.Conv2d(8, 1, 1)

    def forward(self, x):
        x = F.relu(self.stem(x))
        x = x + F.relu(self.body(x))
        return self.head(F.relu(self.down(x)))


def converted(seed=0):
    torch.manual_seed(seed)
    model = Head().eval()
    return model, mwt.convert(copy.deepcopy(model), backend="cpu", verbose=False)


def calls_of_op(graph) -> int:
    return sum(node.op == "call_function" and node.target in (OP, torch.ops.megawino.conv2d)
               for node in graph.nodes)


# ---------------------------------------------------------------------------
# torch.compile, torch.export, torch.jit.trace
# ---------------------------------------------------------------------------

def test_compile_sees_one_graph_with_the_operator(rng):
    _, model = converted()
    x = randn(rng, 2, 3, 12, 12)
    graphs = []

    def backend(gm, example_inputs):
        graphs.append(gm)
        return gm.forward

    torch._dynamo.reset()
    with torch.no_grad():
        explained = torch._dynamo.explain(model)(x)
        assert explained.graph_break_count == 0 and explained.graph_count == 1
        eager = model(x)
        compiled = torch.compile(model, backend=backend)
        assert torch.equal(compiled(x), eager)
    assert len(graphs) == 1 and calls_of_op(graphs[0].graph) == 4


@pytest.mark.parametrize("backend", ["aot_eager", "inductor"])
@pytest.mark.parametrize("channels_last", [False, True])
def test_compiled_model_matches_eager(rng, backend, channels_last):
    if backend == "inductor" and shutil.which("g++") is None and shutil.which("c++") is None:
        pytest.skip("inductor on the CPU needs a C++ compiler")
    reference_model, model = converted()
    if channels_last:
        model = model.to(memory_format=torch.channels_last)
    torch._dynamo.reset()
    compiled = torch.compile(model, backend=backend)
    with torch.no_grad():
        for n in (2, 2, 3, 1):
            x = randn(rng, n, 3, 12, 12) + 0.25
            if channels_last:
                x = x.contiguous(memory_format=torch.channels_last)
            y, eager = compiled(x), model(x)
            assert torch.equal(y, eager)
            assert rel_l2(y, reference_model.double()(x.double())) < 1e-5
    rows = {row.name: row for row in mwt.report(model).rows}
    assert rows["stem"].algo == "cpu-executor" and rows["head"].algo == "pytorch-cpu"


def test_export_keeps_the_operator(rng):
    _, model = converted()
    x = randn(rng, 2, 3, 12, 12)
    with torch.no_grad():
        program = torch.export.export(model, (x,))
        assert calls_of_op(program.graph) == 4
        assert not any("convolution" in str(node.target) for node in program.graph.nodes)
        assert torch.equal(program.module()(x), model(x))


def test_export_under_autograd_traces_pytorch_as_eager_runs(rng):
    """With gradients wanted the layers run PyTorch (the autograd fallback), traced or not."""
    _, model = converted()
    program = torch.export.export(model, (randn(rng, 2, 3, 12, 12),))
    assert calls_of_op(program.graph) == 0


def test_jit_trace_runs_the_operator(rng):
    _, model = converted()
    x = randn(rng, 2, 3, 12, 12)
    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("error", torch.jit.TracerWarning)   # none from megawino's checks
        traced = torch.jit.trace(model, x)
    assert "megawino::conv2d" in str(traced.inlined_graph)
    with torch.no_grad():
        assert torch.equal(traced(x), model(x))


def test_functional_conv2d_compiles_into_the_operator(rng):
    x, weight, bias = randn(rng, 2, 3, 9, 9), randn(rng, 5, 3, 3, 3), randn(rng, 5)

    def f(x):
        return mwt.conv2d(x, weight, bias, padding="same", backend="cpu")

    torch._dynamo.reset()
    explained = torch._dynamo.explain(f)(x)
    assert explained.graph_break_count == 0
    assert torch.equal(torch.compile(f, backend="aot_eager", fullgraph=True)(x), f(x))
    with pytest.raises(Exception, match="padding"):
        torch.compile(lambda x: mwt.conv2d(x, weight, padding=(1, -1), backend="cpu"),
                      backend="aot_eager", fullgraph=True)(x)


@pytest.mark.parametrize("shape, channels_last", [((2, 3, 7, 7), False), ((2, 3, 7, 7), True),
                                                  ((1, 1, 1, 1), True), ((1, 3, 3, 3), True)])
@pytest.mark.parametrize("out_channels", [1, 4])
def test_operator_output_is_what_its_fake_says(rng, shape, channels_last, out_channels):
    """The real output has the fake implementation's shape, dtype and strides exactly (size-1
    dimensions included), which inductor relies on."""
    x = randn(rng, *shape)
    if channels_last:
        x = x.contiguous(memory_format=torch.channels_last)
    weight, bias = randn(rng, out_channels, shape[1], 3, 3), randn(rng, out_channels)
    args = (x, weight, bias, [1, 1], [1, 1], 0, "cpu", "auto", "3xtf32")
    torch.library.opcheck(OP, args, test_utils=("test_schema", "test_faketensor"))
    with torch.no_grad():
        real = OP(*args)
    fake = ops._conv2d_fake(*args)
    assert (real.shape, real.stride(), real.dtype) == (fake.shape, fake.stride(), fake.dtype)
    assert rel_l2(real, F.conv2d(x.double(), weight.double(), bias.double(), 1, 1)) < 1e-5


def test_operator_gradients_are_pytorchs(rng):
    x, weight, bias = (randn(rng, *shape).requires_grad_() for shape in ((2, 3, 6, 6), (4, 3, 3, 3), (4,)))
    OP(x, weight, bias, [2, 2], [1, 1], 0, "cpu", "auto", "3xtf32").square().sum().backward()
    ours = [t.grad.clone() for t in (x, weight, bias)]
    for t in (x, weight, bias):
        t.grad = None
    F.conv2d(x, weight, bias, 2, 1).square().sum().backward()
    for mine, theirs in zip(ours, (x.grad, weight.grad, bias.grad)):
        assert torch.allclose(mine, theirs, rtol=1e-4, atol=1e-5)


def test_operator_uses_a_layer_only_when_its_settings_agree(rng, monkeypatch):
    """A layer id read back from a saved program may name another layer of this process."""
    layer = mwt.convert(nn.Conv2d(3, 4, 3, padding=1), backend="cpu", verbose=False)
    called = []
    monkeypatch.setattr(type(layer), "megawino_forward", lambda self, *a: called.append(1) or F.conv2d(*a, 1, 1))
    x, weight = randn(rng, 1, 3, 5, 5), randn(rng, 4, 3, 3, 3)
    with torch.no_grad():
        OP(x, weight, None, [1, 1], [1, 1], layer.megawino_id, "cpu", "auto", "3xtf32")
        assert called == [1]
        y = OP(x, weight, None, [1, 1], [0, 0], layer.megawino_id, "cpu", "auto", "3xtf32")
    assert called == [1] and y.shape == (1, 4, 3, 3)


def test_copies_are_layers_of_their_own():
    layer = mwt.convert(nn.Conv2d(3, 4, 3), backend="cpu", verbose=False)
    copied = copy.deepcopy(layer)
    assert copied.megawino_id != layer.megawino_id
    assert ops._LAYERS[copied.megawino_id] is copied and ops._LAYERS[layer.megawino_id] is layer


# ---------------------------------------------------------------------------
# What megawino does not run: nn.Conv2d's own convolution, bitwise, with one note
# ---------------------------------------------------------------------------

@pytest.fixture
def fresh_notes(monkeypatch):
    monkeypatch.setattr(routing, "_noted", set())


def _forward_twice(model, x):
    with warnings.catch_warnings(record=True) as caught, torch.no_grad():
        warnings.simplefilter("always")
        outs = [model(x), model(x)]
    return outs, [str(w.message) for w in caught if "megawino" in str(w.message)]


@pytest.mark.parametrize("dtype", [torch.float64, torch.bfloat16, torch.float16])
def test_other_dtypes_run_pytorch_bitwise(rng, fresh_notes, dtype):
    reference_model, model = converted()
    model, reference_model = model.to(dtype), reference_model.to(dtype)
    x = randn(rng, 2, 3, 12, 12).to(dtype)
    outs, notes = _forward_twice(model, x)
    with torch.no_grad():
        assert all(torch.equal(out, reference_model(x)) for out in outs)
    assert len(notes) == 1 and str(dtype) in notes[0]
    assert {row.algo for row in mwt.report(model).rows} == {"pytorch-dtype"}
    assert "0 of 4 Conv2d layers ran on megawino" in mwt.report(model).title()


def test_autocast_runs_pytorch_bitwise(rng, fresh_notes):
    reference_model, model = converted()
    x = randn(rng, 2, 3, 12, 12)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        outs, notes = _forward_twice(model, x)
        with torch.no_grad():
            expected = reference_model(x)
    assert expected.dtype == torch.bfloat16 and all(torch.equal(out, expected) for out in outs)
    assert len(notes) == 1 and "autocast" in notes[0]
    with torch.no_grad():            # and megawino again once autocast is off
        model(x)
    assert mwt.report(model).rows[0].algo == "cpu-executor"


def test_autocast_under_compile_runs_pytorch(rng):
    reference_model, model = converted()
    x = randn(rng, 2, 3, 12, 12)
    torch._dynamo.reset()
    compiled = torch.compile(model, backend="aot_eager")
    with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):
        assert torch.equal(compiled(x), reference_model(x))


def test_empty_batch_returns_empty_like_pytorch(rng, fresh_notes):
    reference_model, model = converted()
    x = randn(rng, 0, 3, 12, 12)
    outs, notes = _forward_twice(model, x)
    assert all(out.shape == reference_model(x).shape == (0, 1, 6, 6) for out in outs) and not notes
    with torch.no_grad():
        y, ran = mwt.functional.conv2d_with_algo(x, randn(rng, 4, 3, 3, 3), padding=1, backend="cpu")
    assert y.shape == (0, 4, 12, 12) and ran == "pytorch-empty"


def test_a_layer_for_the_gpu_runs_pytorch_on_cpu_tensors(rng, fresh_notes):
    reference_model, model = converted()
    mwt.convert(model, verbose=False)                  # backend "auto": CUDA tensors
    x = randn(rng, 2, 3, 12, 12)
    outs, notes = _forward_twice(model, x)
    with torch.no_grad():
        assert all(torch.equal(out, reference_model(x)) for out in outs)
    assert len(notes) == 1 and "cpu" in notes[0]
    assert mwt.report(model).rows[0].algo == "pytorch-device"


# ---------------------------------------------------------------------------
# The report
# ---------------------------------------------------------------------------

def test_print_report_shows_the_table(rng, capsys):
    _, model = converted()
    print(mwt.report(model))
    before = capsys.readouterr().out
    assert "4 of 4 Conv2d layers converted" in before and "stem" in before and "LayerRow" not in before
    with torch.no_grad():
        model(randn(rng, 1, 3, 8, 8))
    print(mwt.report(model))
    after = capsys.readouterr().out
    # stem and body ran the CPU executor; down (stride 2) and head (1x1) ran PyTorch.
    assert "2 of 4 Conv2d layers ran on megawino" in after and "2 of those ran PyTorch" in after
