"""The split BF16 operand format (megawino.core.abi.split_bf16), which the BF16x3 warpgroup-MMA
build's transforms write and its GEMM reads, and the paired U format of the non-fused 3xTF32
warpgroup-MMA build: CPU only."""
import numpy as np
import pytest

from megawino.core import abi


def test_split_parts_are_nearest_even_bf16_and_sum_to_the_value():
    rng = np.random.default_rng(3)
    x = (rng.standard_normal((5, 7, 24)) * 10.0 ** rng.integers(-20, 20, (5, 7, 1))).astype(np.float32)
    words = abi.split_bf16(x)
    assert words.shape == x.shape and words.dtype == np.uint32
    hi, lo = abi.unsplit_bf16(words)
    # hi is x rounded to 8 significant bits, lo the remainder rounded: together 16 bits.
    assert np.all(np.abs(x - hi) <= np.abs(x) * 2.0 ** -8)
    assert np.all(np.abs(x - (hi + lo)) <= np.abs(x) * 2.0 ** -16)
    assert np.all((hi.view(np.uint32) & 0xFFFF) == 0) and np.all((lo.view(np.uint32) & 0xFFFF) == 0)


def test_bf16_rounding_is_to_nearest_even():
    # 1 + 2^-8 is halfway between BF16 1 and 1 + 2^-7: ties go to the even mantissa (1).
    x = np.array([1 + 2.0 ** -8, 1 + 3 * 2.0 ** -8, 1 + 2.0 ** -8 + 2.0 ** -20, -0.0], dtype=np.float32)
    got = abi.bf16_value(abi.bf16_round(x))
    assert got.tolist() == [1.0, 1 + 4 * 2.0 ** -8, 1 + 2.0 ** -7, -0.0]


def test_row_is_hi_parts_then_lo_parts():
    x = (np.arange(16, dtype=np.float32) + 1) * np.float32(1 + 2.0 ** -10)   # lo parts non-zero
    halves = abi.split_bf16(x).view(np.uint16)
    hi = abi.bf16_round(x)
    lo = abi.bf16_round(x - abi.bf16_value(hi))
    assert np.array_equal(halves[:16], hi) and np.array_equal(halves[16:], lo)
    assert np.any(lo != 0)


def test_paired_filter_matrices_invert_the_paired_format():
    """abi.filter_matrices reads a "float32_u_paired" U (transposed, each 16 channels of a row in
    PAIRED_CHANNELS order, as cuda/filter_transform.cuh writes it) back as [alpha2][c][k], and
    PAIRED_CHANNELS is the A fragments' pairing (generated into cuda/generated_tasks.cuh)."""
    rng = np.random.default_rng(3)
    alpha2, c_stride, k_stride = 4, 32, 12
    u = rng.standard_normal((alpha2, c_stride, k_stride)).astype(np.float32)
    paired = np.empty((alpha2, k_stride, c_stride), np.float32)
    for stored in range(c_stride):
        c = stored // 16 * 16 + abi.PAIRED_CHANNELS[stored % 16]
        paired[:, :, stored] = u[:, c, :]
    assert np.array_equal(abi.filter_matrices(paired.reshape(u.shape), "float32_u_paired"), u)
    assert abi.filter_matrices(u, "float32") is u
    # step q's logical k l of a 16-k sub-tile is channel 4 (l % 4) + 2 q + l // 4 (gemm.cuh split_a_step)
    assert [abi.PAIRED_CHANNELS[8 * q + l] for q in (0, 1) for l in range(8)] == \
        [4 * (l % 4) + 2 * q + l // 4 for q in (0, 1) for l in range(8)]
    with pytest.raises(ValueError, match="split_bf16"):
        abi.filter_matrices(u, "split_bf16")


def test_paired_channels_are_generated_into_the_cuda_header():
    from megawino.core.resources import cuda_dir
    text = (cuda_dir() / "generated_tasks.cuh").read_text()
    packed = int(text.split("PAIRED_CHANNELS_PACKED = ")[1].split("ull")[0], 16)
    assert [(packed >> (4 * i)) & 15 for i in range(16)] == list(abi.PAIRED_CHANNELS)
