"""Layer specification: the one validated description of a convolution layer.

Every entry point (``conv2d``, ``plan``, the CLI, the networks tables) builds a
:class:`LayerSpec`; validation happens here, before any buffer is allocated or
any kernel is compiled.
"""
from __future__ import annotations

import dataclasses
import re

from .arguments import pair_argument

LAYOUTS = ("NCHW", "NHWC")
DTYPES = ("float32",)


def pair_of(value) -> tuple[int, int]:
    """An int or an (h, w) pair (what :func:`megawino.core.arguments.pair_argument` returns) as (h, w)."""
    return tuple(value) if isinstance(value, (tuple, list)) else (value, value)


@dataclasses.dataclass(frozen=True)
class LayerSpec:
    """A 2-D convolution (cross-correlation) layer, float32, dilation 1, groups 1.

    ``stride`` and ``padding`` are an int (the same in both spatial dimensions) or an (h, w)
    pair; a pair of equal values is stored as the int, so that both spell one layer."""

    N: int
    C: int
    K: int
    H: int
    W: int
    R: int = 3
    S: int = 3
    stride: int | tuple[int, int] = 1
    padding: int | tuple[int, int] = 1
    layout: str = "NCHW"
    dtype: str = "float32"
    name: str = ""

    def __post_init__(self):
        for field in ("N", "C", "K", "H", "W", "R", "S"):
            value = getattr(self, field)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"LayerSpec.{field} must be a positive integer, got {value!r}")
        object.__setattr__(self, "stride", pair_argument("LayerSpec.stride", self.stride, 1))
        object.__setattr__(self, "padding", pair_argument("LayerSpec.padding", self.padding, 0))
        if self.layout not in LAYOUTS:
            raise ValueError(f"LayerSpec.layout must be one of {LAYOUTS}, got {self.layout!r}")
        if str(self.dtype) not in DTYPES:
            raise ValueError(f"LayerSpec.dtype must be float32, got {self.dtype!r}")
        if self.out_h < 1 or self.out_w < 1:
            raise ValueError(
                f"LayerSpec gives an empty output ({self.out_h}x{self.out_w}): "
                f"H={self.H}, W={self.W}, R={self.R}, S={self.S}, "
                f"stride={self.stride}, padding={self.padding}")

    # ---- derived sizes -------------------------------------------------
    @property
    def stride_h(self) -> int:
        return pair_of(self.stride)[0]

    @property
    def stride_w(self) -> int:
        return pair_of(self.stride)[1]

    @property
    def pad_h(self) -> int:
        return pair_of(self.padding)[0]

    @property
    def pad_w(self) -> int:
        return pair_of(self.padding)[1]

    @property
    def out_h(self) -> int:
        return (self.H + 2 * self.pad_h - self.R) // self.stride_h + 1

    @property
    def out_w(self) -> int:
        return (self.W + 2 * self.pad_w - self.S) // self.stride_w + 1

    @property
    def input_shape(self) -> tuple[int, int, int, int]:
        if self.layout == "NCHW":
            return (self.N, self.C, self.H, self.W)
        return (self.N, self.H, self.W, self.C)

    @property
    def output_shape(self) -> tuple[int, int, int, int]:
        if self.layout == "NCHW":
            return (self.N, self.K, self.out_h, self.out_w)
        return (self.N, self.out_h, self.out_w, self.K)

    @property
    def weight_shape(self) -> tuple[int, int, int, int]:
        """Filters are always K, C, R, S (PyTorch's layout)."""
        return (self.K, self.C, self.R, self.S)

    @property
    def direct_flops(self) -> int:
        """FLOPs of the direct convolution (2 per multiply-add)."""
        return 2 * self.N * self.K * self.C * self.out_h * self.out_w * self.R * self.S

    @property
    def min_bytes(self) -> int:
        """Input, filter and output, each moved once."""
        return 4 * (self.N * self.C * self.H * self.W + self.K * self.C * self.R * self.S
                    + self.N * self.K * self.out_h * self.out_w)

    @property
    def winograd_eligible(self) -> bool:
        return self.R == 3 and self.S == 3 and self.stride == 1 and isinstance(self.padding, int)

    def require_winograd(self) -> None:
        """Raise ValueError unless this layer can run as Winograd F(m x m, 3 x 3)."""
        if self.R != 3 or self.S != 3:
            raise ValueError(f"Winograd needs a 3x3 filter, got R={self.R}, S={self.S}")
        if self.stride != 1:
            raise ValueError(f"Winograd needs stride 1, got stride={self.stride}")
        if not isinstance(self.padding, int):
            raise ValueError(f"Winograd needs the same padding in both dimensions, got padding={self.padding}")

    def with_(self, **changes) -> "LayerSpec":
        return dataclasses.replace(self, **changes)

    @property
    def shape_string(self) -> str:
        text = f"n{self.N}c{self.C}k{self.K}h{self.H}w{self.W}"
        if (self.R, self.S) != (3, 3):
            text += f"r{self.R}s{self.S}"
        if self.stride != 1:
            text += f"u{_pair_text(self.stride)}"
        if self.padding != 1 or self.R // 2 != 1:       # parse_shape's default: R // 2 where r is given
            text += f"p{_pair_text(self.padding)}"
        return text

    def describe(self) -> str:
        return (f"N{self.N} C{self.C} K{self.K} {self.H}x{self.W} "
                f"{self.R}x{self.S}/s{_pair_text(self.stride)}/p{_pair_text(self.padding)}")


def _pair_text(value) -> str:
    """``3`` or ``0x3`` (h x w): the shape string's form of a stride or padding."""
    return "x".join(map(str, value)) if isinstance(value, tuple) else str(value)


_SHAPE_RE = re.compile(r"([a-z])(\d+(?:x\d+)?)")
_PAIR_KEYS = ("u", "p")         # fields that take an h x w pair
_SHAPE_KEYS = {"n": "N", "c": "C", "k": "K", "h": "H", "w": "W", "r": "R", "s": "S",
               "u": "stride", "p": "padding"}


def parse_shape(text: str, layout: str = "NCHW") -> LayerSpec:
    """Parse a shape string such as ``n64c64k64h56w56`` (optional ``r3s3``,
    ``u2`` for stride, ``p1`` for padding, ``u1x2`` / ``p0x3`` for a different value in H and W;
    ``h`` alone sets H = W)."""
    cleaned = text.strip().lower()
    pairs = _SHAPE_RE.findall(cleaned)
    if not pairs or "".join(k + v for k, v in pairs) != cleaned:
        raise ValueError(
            f"shape string {text!r} is not of the form n64c64k64h56w56[r3s3][u1][p1] "
            "(u and p may be a pair: p0x3)")
    values: dict[str, int] = {}
    for key, number in pairs:
        if key not in _SHAPE_KEYS:
            raise ValueError(f"shape string {text!r}: unknown field {key!r}")
        if _SHAPE_KEYS[key] in values:
            raise ValueError(f"shape string {text!r} gives {key!r} twice")
        if "x" in number and key not in _PAIR_KEYS:
            raise ValueError(f"shape string {text!r}: {key!r} takes one number, got {number!r}")
        values[_SHAPE_KEYS[key]] = tuple(map(int, number.split("x"))) if "x" in number else int(number)
    missing = [f for f in ("N", "C", "K", "H") if f not in values]
    if missing:
        raise ValueError(f"shape string {text!r} lacks {', '.join(missing)}")
    values.setdefault("W", values["H"])
    if "R" in values and "S" not in values:
        values["S"] = values["R"]
    if "R" in values and "padding" not in values:
        values["padding"] = values["R"] // 2
    return LayerSpec(layout=layout, **values)
