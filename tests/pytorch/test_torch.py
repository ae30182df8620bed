"""megawino.torch.conv2d on the CPU: the CPU backend against torch.nn.functional.conv2d, argument
handling and refusals, the autograd fallback, weight tokens (convert: test_torch_convert.py)."""
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
from megawino.torch import functional, gpu, precision, weight_tokens  # noqa: E402
from megawino.core.spec import LayerSpec  # noqa: E402
from torch_support import randn, reference, rel_l2  # noqa: E402


@pytest.fixture
def rng():
    return torch.Generator().manual_seed(12)


def test_import_megawino_does_not_import_torch():
    code = ("import sys, megawino; megawino.LayerSpec(1, 2, 3, 4, 4); "
            "import megawino.cpu.executor, megawino.runtime; print('torch' in sys.modules)")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert result.stdout.strip() == "False"
    code = ("import sys; sys.modules['torch'] = None\n"
            "try:\n    import megawino.torch\nexcept ImportError as err:\n    print(err)")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert "pip install 'megawino[torch]'" in result.stdout


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
    (dict(stride=(1, 2, 1)), "stride"),
    (dict(stride=0), "stride"),
    (dict(stride=1.5), "stride"),
    (dict(padding=(1, -1)), "padding"),
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
    monkeypatch.setattr("megawino.cpu.executor.conv2d_cpu", must_not_run)
    monkeypatch.setattr(gpu, "_gpu", must_not_run)
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


def test_integer_arguments_of_any_integer_type():
    assert functional.conv_arguments((3, 3), np.int64(2), (np.int32(1), 1), torch.tensor(1), np.int8(1)) == (2, 1)
    assert functional.conv_arguments((3, 3), (torch.tensor(2), torch.tensor(2)), [1]) == (2, 1)
    for bad in (True, 1.0, "1"):
        with pytest.raises(ValueError, match="groups"):
            functional.conv_arguments((3, 3), groups=bad)
    # The rule of every entry point (megawino.core.arguments): bools and floats are not integers,
    # as NumPy scalars or 0-d tensors either.
    for bad in (np.bool_(True), np.float32(1), torch.tensor(True), torch.tensor(1.0), torch.tensor([1])):
        with pytest.raises(ValueError, match="stride must be an integer"):
            functional.conv_arguments((3, 3), stride=bad)
    with pytest.raises(ValueError, match="padding must be >= 0, got -1"):
        functional.conv_arguments((3, 3), 1, (np.int8(-1), -1))


def test_padding_same_needs_odd_filter_sizes():
    assert functional.conv_arguments((5, 5), 1, "same") == (1, 2)
    assert functional.conv_arguments((3, 3), (2, 2), "valid") == (2, 0)
    assert functional.conv_arguments((1, 7), 1, "same") == (1, (0, 3))
    assert functional.conv_arguments((7, 1), (1, 1), "same") == (1, (3, 0))
    assert functional.conv_arguments((3, 5), 1, "same") == (1, (1, 2))
    for kernel in ((4, 4), (3, 4), (2, 5)):
        with pytest.raises(ValueError, match="padding='same'"):
            functional.conv_arguments(kernel, 1, "same")


def test_stride_and_padding_pairs():
    """Each dimension its own stride and padding (the direct path runs them); equal members are
    the one int LayerSpec keys by."""
    assert functional.conv_arguments((1, 7), 1, (0, 3)) == (1, (0, 3))
    assert functional.conv_arguments((3, 3), (2, 1), [1, 1]) == ((2, 1), 1)
    assert functional.conv_arguments((3, 3), torch.Size([2, 2]), (np.int64(0), 0)) == (2, 0)


@pytest.mark.parametrize("kernel, stride, padding", [((1, 7), 1, (0, 3)), ((7, 1), 1, (3, 0)),
                                                     ((3, 3), (2, 1), (1, 0)), ((3, 5), 1, "same")])
def test_cpu_backend_runs_pairs_as_torch_does(rng, kernel, stride, padding):
    """Pairs the CPU executor cannot take (it runs Winograd) go to torch, not to an exception."""
    x, weight = randn(rng, 2, 4, 9, 11), randn(rng, 5, 4, *kernel)
    out, ran = functional.conv2d_with_algo(x, weight, None, stride, padding, backend="cpu")
    assert ran == "pytorch-cpu"
    assert torch.equal(out, F.conv2d(x, weight, None, stride, padding))


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
    token = gpu.weight_token(w)
    assert gpu.weight_token(w) == token
    hash(token)
    with torch.no_grad():
        w.add_(1)
    after_add = gpu.weight_token(w)
    assert after_add != token
    conv.load_state_dict(nn.Conv2d(3, 4, 3).state_dict())
    after_load = gpu.weight_token(w)
    assert after_load not in (token, after_add)
    gpu.weights_changed()
    assert gpu.weight_token(w) != after_load
    # A new tensor gets a new token even where it has the same address and version.
    a = randn(rng, 4, 3, 3, 3)
    b = a.view(a.shape)
    assert b.data_ptr() == a.data_ptr() and b._version == a._version
    assert gpu.weight_token(a) != gpu.weight_token(b)
    with torch.inference_mode():
        assert gpu.weight_token(torch.ones(2, 2, 3, 3)) is None


@pytest.mark.parametrize("channels_last", [False, True])
def test_runtime_views_are_compact_aliases(rng, channels_last):
    x, out = randn(rng, 2, 4, 5, 7), torch.empty(2, 6, 3, 5)
    if channels_last:
        x, out = (t.contiguous(memory_format=torch.channels_last) for t in (x, out))
    views = gpu.runtime_views(x, out, channels_last)
    shapes = [(2, 5, 7, 4), (2, 3, 5, 6)] if channels_last else [(2, 4, 5, 7), (2, 6, 3, 5)]
    for view, shape, source in zip(views, shapes, (x, out)):
        assert tuple(view.shape) == shape and view.is_contiguous()
        assert view.data_ptr() == source.data_ptr()          # zero copy


def test_weight_tokens_are_not_copied_with_the_tensor(rng):
    import pickle
    w = randn(rng, 4, 3, 3, 3)
    token = gpu.weight_token(w)
    for other in (copy.deepcopy(w), pickle.loads(pickle.dumps(w))):
        assert gpu.weight_token(other)[0] != token[0]
    count = len(weight_tokens._TRACKED)
    del w, other
    assert len(weight_tokens._TRACKED) <= count - 2


def test_ieee_fp32_convolutions_restores_the_setting():
    conv_flags = torch.backends.cudnn.conv
    before = conv_flags.fp32_precision
    with precision.ieee_fp32_convolutions():
        assert conv_flags.fp32_precision == "ieee"
        assert precision.convolutions_are_ieee()
    assert conv_flags.fp32_precision == before


@pytest.fixture
def precision_flags():
    """The conv, cuDNN and global fp32 precision flags, restored after the test (parents first:
    setting a flag sets its children too)."""
    owners = (torch.backends.cudnn.conv, torch.backends.cudnn, torch.backends)
    saved = [owner.fp32_precision for owner in owners]
    yield owners
    for owner, value in reversed(list(zip(owners, saved))):
        owner.fp32_precision = value


@pytest.mark.parametrize("conv, cudnn, every, ieee", [
    ("tf32", "none", "none", False),      # torch's default
    ("ieee", "tf32", "tf32", True),       # the conv flag decides when it is set
    ("none", "none", "none", True),       # what the legacy allow_tf32 = False leaves
    ("none", "tf32", "none", False),      # "none" defers to cuDNN's flag ...
    ("none", "ieee", "tf32", True),
    ("none", "none", "tf32", False),      # ... and cuDNN's to every backend's
])
def test_convolutions_are_ieee_resolves_none_like_aten(precision_flags, conv, cudnn, every, ieee):
    for owner, value in reversed(list(zip(precision_flags, (conv, cudnn, every)))):
        owner.fp32_precision = value
    assert precision.convolutions_are_ieee() is ieee
    conv_flags = precision_flags[0]
    before = conv_flags.fp32_precision     # newer torch reads it back resolved
    with precision.ieee_fp32_convolutions():
        assert precision.convolutions_are_ieee()
        # Already IEEE: the user's flags are left as they were, not switched and restored.
        assert conv_flags.fp32_precision == (before if ieee else "ieee")
    assert conv_flags.fp32_precision == before


@pytest.mark.parametrize("conv", ["tf32", "ieee", "none"])
def test_conv2d_ieee_fp32_runs_ieee_and_restores_the_flags(precision_flags, monkeypatch, conv):
    precision_flags[0].fp32_precision = conv
    before = precision_flags[0].fp32_precision
    seen = []

    def conv2d(*args):
        seen.append((precision.convolutions_are_ieee(), precision_flags[0].fp32_precision))
        if len(seen) == 2:
            raise RuntimeError("cuDNN failed")
        return args[0]

    monkeypatch.setattr(precision.F, "conv2d", conv2d)
    x = torch.ones(1)
    assert precision.conv2d_ieee_fp32(x, x, None, 1, 0) is x
    with pytest.raises(RuntimeError):
        precision.conv2d_ieee_fp32(x, x, None, 1, 0)
    # IEEE inside; flags that already meant IEEE untouched; restored after, also after an error.
    assert seen == [(True, "ieee" if conv == "tf32" else before)] * 2
    assert precision_flags[0].fp32_precision == before


@pytest.mark.parametrize("value", ["tf32", "ieee", "none"])
def test_conv_flag_access_is_the_attribute(precision_flags, value):
    # The C functions the switch reads and writes are those behind torch.backends.cudnn.conv.
    access = precision._conv_flag_access()
    assert access is not None       # this torch has them: the fast path is what runs
    read, write = access
    precision_flags[0].fp32_precision = value
    assert read() == precision_flags[0].fp32_precision
    write("ieee" if value != "ieee" else "tf32")
    assert precision_flags[0].fp32_precision == read() != value


def test_legacy_allow_tf32_off_counts_as_ieee(precision_flags):
    torch.backends.cudnn.allow_tf32 = False
    assert precision.convolutions_are_ieee()
    torch.backends.cudnn.allow_tf32 = True
    assert not precision.convolutions_are_ieee()


@pytest.mark.parametrize("spec, algos", [
    (LayerSpec(8, 64, 64, 56, 56), ("megakernel", "nonfused", "direct", "pytorch")),
    (LayerSpec(8, 64, 64, 56, 56, 1, 1, 1, 0), ("direct", "pointwise", "pytorch")),
    (LayerSpec(8, 64, 64, 7, 7, 1, 1, 1, 0), ("direct", "pytorch")),
    (LayerSpec(8, 64, 64, 56, 56, 3, 3, 2, 1), ("direct", "pytorch")),
    (LayerSpec(1, 3, 8, 40, 40, 17, 17, 1, 8), ("pytorch",)),
])
def test_candidate_algos(spec, algos):
    assert gpu.candidate_algos(spec) == algos


def test_an_inference_weight_has_no_token_and_says_why_once(rng, monkeypatch):
    import warnings
    monkeypatch.setattr(weight_tokens, "_inference_warned", False)
    with torch.inference_mode():
        w = randn(rng, 4, 3, 3, 3)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert weight_tokens.weight_token(w) is None
        assert weight_tokens.weight_token(w) is None
    assert len(caught) == 1 and "inference_mode" in str(caught[0].message)
    assert weight_tokens.weight_token(randn(rng, 4, 3, 3, 3)) is not None
