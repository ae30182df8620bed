"""CPU tests of the pointwise path's planning: which shapes it takes (and the errors for the
others), the GEMM it maps a layer to, the row-tile rule, and where it enters the algorithm
choice of megawino.runtime and megawino.torch."""
from __future__ import annotations

import pytest

from megawino.core.spec import LayerSpec
from megawino.direct.pointwise import check_pointwise, choose_tile_rows, gemm_dims
from megawino.runtime import candidate_algos


def test_gemm_dims_per_layout():
    nchw = LayerSpec(3, 36, 48, 12, 10, 1, 1, 1, 0)
    assert gemm_dims(nchw) == (48, 120, 36, 3)             # rows K, columns H*W, one GEMM per image
    nhwc = nchw.with_(layout="NHWC")
    assert gemm_dims(nhwc) == (3 * 120, 48, 36, 1)         # rows N*H*W, columns K


@pytest.mark.parametrize("spec, words", [
    (LayerSpec(1, 8, 16, 8, 8, 3, 3, 1, 1), "1x1 filters"),
    (LayerSpec(1, 8, 16, 8, 8, 1, 1, 2, 0), "stride 2"),
    (LayerSpec(1, 8, 16, 8, 8, 1, 1, 1, 1), "padding 1"),
    (LayerSpec(1, 6, 16, 8, 8, 1, 1, 1, 0), "C divisible by 4"),
    (LayerSpec(1, 8, 16, 7, 7, 1, 1, 1, 0), "H\\*W divisible by 4 in NCHW"),
    (LayerSpec(1, 8, 18, 7, 7, 1, 1, 1, 0, "NHWC"), "K divisible by 4 in NHWC"),
])
def test_check_pointwise_names_what_is_wrong(spec, words):
    with pytest.raises(ValueError, match=words):
        check_pointwise(spec)


def test_shapes_the_pointwise_path_takes():
    for spec in (LayerSpec(1, 8, 16, 7, 7, 1, 1, 1, 0, "NHWC"), LayerSpec(64, 256, 64, 56, 56, 1, 1, 1, 0),
                 LayerSpec(1, 4, 3, 2, 2, 1, 1, 1, 0)):
        check_pointwise(spec)


@pytest.mark.parametrize("rows, col_tiles, batch, expected", [
    (256, 49, 64, 128),     # full 128-row tiles, many blocks
    (192, 49, 64, 64),      # 128-row tiles would compute a padded half tile
    (64, 49, 64, 64),
    (1024, 4, 1, 64),       # 32 blocks of 128 rows cannot fill 132 SMs twice
    (1000, 49, 8, 128),     # a last tile of 104 rows: mostly used
])
def test_row_tile_height(rows, col_tiles, batch, expected):
    assert choose_tile_rows(rows, col_tiles, batch, sm_count=132) == expected


def test_candidate_algorithms():
    assert candidate_algos(LayerSpec(1, 8, 16, 8, 8)) == ("megakernel", "nonfused", "direct")
    assert candidate_algos(LayerSpec(1, 8, 16, 8, 8, 1, 1, 1, 0)) == ("direct", "pointwise")
    assert candidate_algos(LayerSpec(1, 8, 16, 7, 7, 1, 1, 1, 0)) == ("direct",)
    assert candidate_algos(LayerSpec(1, 8, 16, 8, 8, 3, 3, 2, 1)) == ("direct",)


def test_torch_candidates_include_pointwise_and_pytorch():
    pytest.importorskip("torch")
    from megawino.torch.gpu import MEGAWINO_ALGOS, candidate_algos as torch_candidates
    assert "pointwise" in MEGAWINO_ALGOS
    assert torch_candidates(LayerSpec(2, 64, 256, 14, 14, 1, 1, 1, 0)) == ("direct", "pointwise", "pytorch")
