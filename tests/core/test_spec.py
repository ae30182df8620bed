import pytest

from megawino.core.spec import LayerSpec, parse_shape


def test_derived_sizes():
    s = LayerSpec(2, 3, 4, 9, 7, padding=0)
    assert (s.out_h, s.out_w) == (7, 5)
    assert s.input_shape == (2, 3, 9, 7)
    assert s.output_shape == (2, 4, 7, 5)
    assert s.with_(layout="NHWC").output_shape == (2, 7, 5, 4)
    assert s.direct_flops == 2 * 2 * 4 * 3 * 7 * 5 * 9


@pytest.mark.parametrize("field,value", [("N", 0), ("C", -1), ("K", 1.5), ("H", True),
                                         ("stride", 0), ("padding", -1)])
def test_bad_sizes_name_the_field(field, value):
    kwargs = dict(N=1, C=1, K=1, H=8, W=8)
    kwargs[field] = value
    with pytest.raises(ValueError, match=field):
        LayerSpec(**kwargs)


def test_empty_output_and_dtype_and_layout():
    with pytest.raises(ValueError, match="empty output"):
        LayerSpec(1, 1, 1, 2, 2, padding=0)
    with pytest.raises(ValueError, match="dtype"):
        LayerSpec(1, 1, 1, 8, 8, dtype="float16")
    with pytest.raises(ValueError, match="layout"):
        LayerSpec(1, 1, 1, 8, 8, layout="CHWN")


def test_winograd_requirements():
    LayerSpec(1, 1, 1, 8, 8).require_winograd()
    with pytest.raises(ValueError, match="3x3"):
        LayerSpec(1, 1, 1, 8, 8, R=5, S=5, padding=2).require_winograd()
    with pytest.raises(ValueError, match="stride"):
        LayerSpec(1, 1, 1, 8, 8, stride=2).require_winograd()


def test_parse_shape_round_trip():
    s = parse_shape("n64c64k64h56w56")
    assert (s.N, s.C, s.K, s.H, s.W, s.R, s.padding) == (64, 64, 64, 56, 56, 3, 1)
    assert parse_shape(s.shape_string) == s
    t = parse_shape("n2c3k4h9w11r5s5u2p0")
    assert (t.R, t.S, t.stride, t.padding, t.W) == (5, 5, 2, 0, 11)
    assert parse_shape(t.shape_string) == t
    assert parse_shape("n1c1k1h8").W == 8


@pytest.mark.parametrize("text", ["", "n64c64", "x1c2k3h4", "n64c64k64h56w56!", "n0c1k1h4"])
def test_parse_shape_rejects(text):
    with pytest.raises(ValueError):
        parse_shape(text)


@pytest.mark.parametrize("text, field", [("n64c64k64h56w56n32", "'n'"), ("n1c2c3k4h8", "'c'"),
                                         ("n1c2k4h8w8p1p0", "'p'")])
def test_parse_shape_refuses_a_repeated_field(text, field):
    with pytest.raises(ValueError, match=f"gives {field} twice"):
        parse_shape(text)
