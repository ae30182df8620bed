"""The TF32-grade mode (gemm_math="bf16x3") holds its error contract on the GPU: on every suite
layer and on fresh data of three distributions, its rel. L2 error against float64 is at most that
of PyTorch's TF32 convolution on the same inputs (measured side by side) and at most 1e-3, and
the megakernel equals the non-fused path bitwise."""
import contextlib

import pytest

torch = pytest.importorskip("torch")
import torch.nn.functional as F  # noqa: E402

import megawino  # noqa: E402
from megawino.core import suite  # noqa: E402

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="PyTorch without CUDA")]

BOUND = 1e-3
SUITE = suite.load_suite(suite="winograd", batch=2)


@contextlib.contextmanager
def tf32_convolutions():
    """PyTorch's default TF32 cuDNN convolutions inside, IEEE fp32 restored after."""
    flags = getattr(torch.backends.cudnn, "conv", None)
    if flags is not None and hasattr(flags, "fp32_precision"):
        saved = flags.fp32_precision
        flags.fp32_precision = "tf32"
        try:
            yield
        finally:
            flags.fp32_precision = saved
    else:
        saved = torch.backends.cudnn.allow_tf32
        torch.backends.cudnn.allow_tf32 = True
        try:
            yield
        finally:
            torch.backends.cudnn.allow_tf32 = saved


def draw(spec, distribution: str, gen):
    """x and w of ``spec`` (float32, CUDA): "normal" N(0, 1) data, "relu" U(0, 1) data (non-negative,
    mean 0.5), "shifted" U(0, 1) data and weights U(-0.5, 1) (non-zero mean); weights scaled by
    1 / sqrt(9 C)."""
    shape_x, shape_w = (spec.N, spec.C, spec.H, spec.W), spec.weight_shape
    scale = (9 * spec.C) ** -0.5
    if distribution == "normal":
        x = torch.randn(shape_x, device="cuda", generator=gen)
    else:
        x = torch.rand(shape_x, device="cuda", generator=gen)
    if distribution == "shifted":
        w = (torch.rand(shape_w, device="cuda", generator=gen) * 1.5 - 0.5) * scale
    else:
        w = torch.randn(shape_w, device="cuda", generator=gen) * scale
    return x, w


def rel_l2(y, ref) -> float:
    return float((y.double() - ref).norm() / ref.norm())


def run(x, w, padding, algo):
    import cupy
    out = cupy.full((x.shape[0], w.shape[0], x.shape[2] + 2 * padding - 2, x.shape[3] + 2 * padding - 2),
                    float("nan"), dtype=cupy.float32)
    megawino.conv2d(cupy.from_dlpack(x), cupy.from_dlpack(w), padding=padding, algo=algo,
                    gemm_math="bf16x3", out=out)
    return torch.from_dlpack(out)


@pytest.mark.parametrize("distribution", ["normal", "relu", "shifted"])
@pytest.mark.parametrize("index", range(len(SUITE)), ids=[s.name for s in SUITE])
def test_bf16x3_error_at_most_pytorch_tf32(index, distribution):
    spec = SUITE[index]
    gen = torch.Generator(device="cuda").manual_seed(1000 * index + len(distribution))
    x, w = draw(spec, distribution, gen)
    ref = F.conv2d(x.double(), w.double(), None, 1, spec.padding)
    with tf32_convolutions():
        tf32_err = rel_l2(F.conv2d(x, w, None, 1, spec.padding), ref)
    y = run(x, w, spec.padding, "megakernel")
    assert not torch.isnan(y).any(), "unwritten (NaN) outputs"
    err = rel_l2(y, ref)
    assert err <= min(tf32_err, BOUND), f"{spec.name} {distribution}: bf16x3 {err:.3g}, PyTorch TF32 {tf32_err:.3g}"
    assert torch.equal(run(x, w, spec.padding, "nonfused"), y), "megakernel and non-fused differ bitwise"


@pytest.mark.parametrize("layout", ["NCHW", "NHWC"])
def test_split_operands_are_the_float32_operands_split(layout):
    """Where the BF16x3 build keeps U and V as split BF16 (the warpgroup-MMA build), they are
    exactly megawino.core.abi.split_bf16 of the 3xTF32 build's float32 U (transposed) and V on
    the same inputs, and M agrees with the float32 operands' products to BF16x3 accuracy; odd
    C, K and sizes leave partial chunks, tiles and sub-tiles."""
    import cupy
    import numpy as np
    from megawino.core import abi
    from megawino.core.spec import LayerSpec
    spec = LayerSpec(2, 44, 37, 13, 11, layout=layout)
    gen = torch.Generator(device="cuda").manual_seed(7)
    x = torch.randn((spec.N, spec.C, spec.H, spec.W), device="cuda", generator=gen)
    w = torch.randn(spec.weight_shape, device="cuda", generator=gen)
    if layout == "NHWC":
        x = x.permute(0, 2, 3, 1).contiguous()
    plans = {}
    for math in ("3xtf32", "bf16x3"):
        p = megawino.plan(spec, algo="nonfused", gemm_math=math)
        for buf in (p.U, p.V, p.M):
            buf.fill(float("nan"))
        p(cupy.from_dlpack(x), cupy.from_dlpack(w))
        cupy.cuda.get_current_stream().synchronize()
        plans[math] = p
    split = plans["bf16x3"]
    if split.operand_format != "split_bf16":
        pytest.skip(f"this GPU's BF16x3 build keeps float32 operands ({split.operand_format})")
    full = plans["3xtf32"]
    assert full.operand_format in ("float32", "float32_u_paired")
    v = full.V.get()
    assert np.array_equal(split.V.get().view(np.uint32), abi.split_bf16(v)), "V"
    u = abi.filter_matrices(full.U.get(), full.operand_format)   # [alpha2][c_stride][k_stride]; split U is [alpha2][k_stride][c_stride]
    u_split = split.U.get().reshape(u.shape[0], u.shape[2], u.shape[1])
    assert np.array_equal(u_split.view(np.uint32), abi.split_bf16(u.transpose(0, 2, 1))), "U"
    m_full, m_split = full.M.get(), split.M.get()
    assert not np.isnan(m_split).any(), "unwritten M"
    scale = float(np.abs(m_full).max())
    assert float(np.abs(m_split - m_full).max()) <= 1e-4 * scale, "M"
