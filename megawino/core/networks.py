"""Convolution-layer tables of whole networks (the benchmark suite file: :mod:`megawino.core.suite`).

Each network builder walks the network (convolutions, pools, upsamples) from the
input resolution, so spatial sizes are computed, never pasted, and any input
resolution works.  Layers that occur several times with the same shape in the
same role (the 3x3 conv of every ResNet bottleneck of a stage, say) appear once,
with a ``count``; every entry of a table has a unique name.

Networks (input is square, ``resolution`` x ``resolution``, 3 channels):

``vgg16``        13 convs, ``vgg16.conv1_1`` .. ``vgg16.conv5_3``; default 224.
``resnet50``     torchvision ResNet-50 v1.5 (stride on the 3x3 conv of the first
                 bottleneck of stages 3-5); default 224.  Names per stage
                 ``resnet50.convS_x`` (S = 2..5):

                 - ``resnet50.convS_x``            3x3 stride-1 conv (count 3, 3, 5, 2:
                   in stages 3-5 the first block's 3x3 is the strided one)
                 - ``resnet50.convS_x.3x3s2``      strided 3x3 of the first block (S >= 3)
                 - ``resnet50.convS_x.1x1a``       first 1x1 of the first block
                   (takes the stage's input, e.g. C512 K256 at 28 for S = 4)
                 - ``resnet50.convS_x.1x1a_rest``  first 1x1 of the other blocks
                 - ``resnet50.convS_x.1x1b``       last 1x1 (expansion), every block
                 - ``resnet50.convS_x.downsample`` 1x1 projection shortcut
                 plus ``resnet50.conv1`` (7x7/2).
``yolov3``       Darknet-53 backbone and the three detection heads (COCO, 255
                 output channels); default 416.  ``yolov3.conv0``,
                 ``yolov3.down1`` .. ``down5`` (3x3/2), ``yolov3.resS`` (3x3 of
                 residual stage S) and ``yolov3.resS.1x1``; heads
                 ``yolov3.headH.{1x1_in,1x1,3x3,detect,upsample_1x1}``.
``densenet161``  torchvision DenseNet-161 (growth 48, bn_size 4); default 224.
                 ``densenet161.conv0`` (7x7/2), ``densenet161.blockB`` (the 3x3
                 C192 K48 conv of dense block B, count 6, 12, 36, 24),
                 ``densenet161.blockB.lL.1x1`` (the 1x1 of dense layer L, whose C
                 grows by 48 per layer) and transitions ``densenet161.t1`` .. ``t3``.
                 ``densenet161.bB...`` is accepted by :func:`find_layer` as an alias
                 of ``densenet161.blockB...``.
``alexnet``      torchvision AlexNet's 5 convs, ``alexnet.conv1`` .. ``conv5``; default 224.

Tiny resolutions: convolutions and pools are computed with the frameworks' floor
rule.  If some layer of the network would get an empty (< 1) input or output, the
builder raises ``ValueError`` naming the layer and the smallest resolution that
works; nothing is clamped, so a table always describes the network as it would
actually run.  (ResNet-50 and YOLOv3 work from resolution 1; VGG-16 needs 32,
DenseNet-161 29, AlexNet 31.)
YOLOv3 is meant for multiples of 32; for other sizes each head uses the spatial
size of the backbone feature map it is concatenated with.
"""
from __future__ import annotations

import dataclasses
import difflib
import re
from typing import Callable

from .spec import LayerSpec

__all__ = [
    "NetworkLayer", "NETWORKS", "DEFAULT_RESOLUTION", "network_layers", "find_layer",
    "vgg16", "resnet50", "yolov3", "densenet161", "alexnet",
]


@dataclasses.dataclass(frozen=True)
class NetworkLayer:
    """One distinct conv layer of a network and how many times it occurs."""

    spec: LayerSpec  # spec.name is the layer name, e.g. "resnet50.conv2_x"
    count: int       # how many times this layer shape occurs in the network

    @property
    def name(self) -> str:
        return self.spec.name

    @property
    def total_flops(self) -> int:
        """Direct-convolution FLOPs of all ``count`` occurrences."""
        return self.spec.direct_flops * self.count


class _ResolutionTooSmall(ValueError):
    pass


class _Walker:
    """Accumulates conv layers in network order; repeated names add to the count."""

    def __init__(self, network: str, batch: int, resolution: int):
        if isinstance(resolution, bool) or not isinstance(resolution, int) or resolution < 1:
            raise ValueError(f"{network}: resolution must be a positive integer, got {resolution!r}")
        if isinstance(batch, bool) or not isinstance(batch, int) or batch < 1:
            raise ValueError(f"{network}: batch must be a positive integer, got {batch!r}")
        self.network = network
        self.batch = batch
        self.resolution = resolution
        self._specs: dict[str, LayerSpec] = {}
        self._counts: dict[str, int] = {}

    def conv(self, name: str, C: int, K: int, H: int, R: int = 3, stride: int = 1,
             padding: int | None = None, count: int = 1) -> int:
        """Add a square conv on an H x H input; return the output size."""
        if padding is None:
            padding = R // 2
        full = f"{self.network}.{name}"
        out = (H + 2 * padding - R) // stride + 1
        if H < 1 or out < 1:
            raise _ResolutionTooSmall(
                f"{full}: input {H}x{H} gives an empty output at resolution {self.resolution}")
        spec = LayerSpec(N=self.batch, C=C, K=K, H=H, W=H, R=R, S=R, stride=stride,
                         padding=padding, name=full)
        if full in self._specs:
            if self._specs[full] != spec:  # a bug in a table, not a user error
                raise RuntimeError(f"layer name {full} used for two shapes: "
                                   f"{self._specs[full].describe()} and {spec.describe()}")
            self._counts[full] += count
        else:
            self._specs[full] = spec
            self._counts[full] = count
        return out

    def pool(self, where: str, H: int, kernel: int, stride: int, padding: int = 0) -> int:
        """Max or average pool (same size rule); return the output size."""
        out = (H + 2 * padding - kernel) // stride + 1
        if out < 1:
            raise _ResolutionTooSmall(
                f"{self.network}: {where} gets {H}x{H} and gives an empty output "
                f"at resolution {self.resolution}")
        return out

    def layers(self) -> list[NetworkLayer]:
        return [NetworkLayer(spec, self._counts[name]) for name, spec in self._specs.items()]


# ---------------------------------------------------------------------------
# Builders: builder(batch, resolution) -> list[NetworkLayer]
# ---------------------------------------------------------------------------

def vgg16(batch: int = 1, resolution: int = 224) -> list[NetworkLayer]:
    """VGG-16 (configuration D): 13 3x3 convs, 2x2/2 max pool after each block."""
    net = _Walker("vgg16", batch, resolution)
    h, c = resolution, 3
    for block, (width, convs) in enumerate([(64, 2), (128, 2), (256, 3), (512, 3), (512, 3)], 1):
        for i in range(1, convs + 1):
            h = net.conv(f"conv{block}_{i}", c, width, h)
            c = width
        h = net.pool(f"pool{block}", h, 2, 2)
    return net.layers()


def resnet50(batch: int = 1, resolution: int = 224) -> list[NetworkLayer]:
    """torchvision ResNet-50 v1.5 (stride in the 3x3 of each stage's first block)."""
    net = _Walker("resnet50", batch, resolution)
    h = net.conv("conv1", 3, 64, resolution, R=7, stride=2, padding=3)
    h = net.pool("maxpool", h, 3, 2, 1)
    c = 64
    for stage, (width, blocks) in enumerate([(64, 3), (128, 4), (256, 6), (512, 3)], 2):
        p = f"conv{stage}_x"
        stride = 1 if stage == 2 else 2
        for block in range(blocks):
            first = block == 0
            h_in = h
            net.conv(f"{p}.1x1a" if first else f"{p}.1x1a_rest", c, width, h_in, R=1)
            if first and stride != 1:
                h = net.conv(f"{p}.3x3s2", width, width, h_in, R=3, stride=stride)
            else:
                h = net.conv(p, width, width, h_in, R=3)
            net.conv(f"{p}.1x1b", width, 4 * width, h, R=1)
            if first:
                net.conv(f"{p}.downsample", c, 4 * width, h_in, R=1, stride=stride)
            c = 4 * width
    return net.layers()


def yolov3(batch: int = 1, resolution: int = 416, num_classes: int = 80) -> list[NetworkLayer]:
    """YOLOv3 (yolov3.cfg): Darknet-53 backbone and the three detection heads."""
    net = _Walker("yolov3", batch, resolution)
    detect = 3 * (num_classes + 5)
    h = net.conv("conv0", 3, 32, resolution)
    c = 32
    route: dict[int, tuple[int, int]] = {}  # stage -> (channels, size) of its output
    for stage, blocks in enumerate([1, 2, 8, 8, 4], 1):
        h = net.conv(f"down{stage}", c, 2 * c, h, stride=2)
        c *= 2
        for _ in range(blocks):
            net.conv(f"res{stage}.1x1", c, c // 2, h, R=1)
            net.conv(f"res{stage}", c // 2, c, h)
        route[stage] = (c, h)

    def head(index: int, c_in: int, width: int, h: int) -> None:
        p = f"head{index}"
        net.conv(f"{p}.1x1_in" if c_in != 2 * width else f"{p}.1x1", c_in, width, h, R=1)
        net.conv(f"{p}.3x3", width, 2 * width, h)
        for _ in range(2):
            net.conv(f"{p}.1x1", 2 * width, width, h, R=1)
            net.conv(f"{p}.3x3", width, 2 * width, h)
        net.conv(f"{p}.detect", 2 * width, detect, h, R=1)

    head(1, c, 512, h)                                   # 1024 @ 13
    net.conv("head1.upsample_1x1", 512, 256, h, R=1)
    c4, h4 = route[4]                                    # concat with stage 4 output
    head(2, 256 + c4, 256, h4)                           # 768 @ 26
    net.conv("head2.upsample_1x1", 256, 128, h4, R=1)
    c3, h3 = route[3]
    head(3, 128 + c3, 128, h3)                           # 384 @ 52
    return net.layers()


def densenet161(batch: int = 1, resolution: int = 224) -> list[NetworkLayer]:
    """torchvision DenseNet-161: growth 48, bn_size 4, blocks (6, 12, 36, 24), 96 initial."""
    growth, bottleneck = 48, 4 * 48
    net = _Walker("densenet161", batch, resolution)
    h = net.conv("conv0", 3, 96, resolution, R=7, stride=2, padding=3)
    h = net.pool("pool0", h, 3, 2, 1)
    c = 96
    block_config = (6, 12, 36, 24)
    for block, layers in enumerate(block_config, 1):
        for layer in range(1, layers + 1):
            net.conv(f"block{block}.l{layer}.1x1", c, bottleneck, h, R=1)
            net.conv(f"block{block}", bottleneck, growth, h)
            c += growth
        if block < len(block_config):
            net.conv(f"t{block}", c, c // 2, h, R=1)
            c //= 2
            h = net.pool(f"transition{block} avgpool", h, 2, 2)
    return net.layers()


def alexnet(batch: int = 1, resolution: int = 224) -> list[NetworkLayer]:
    """torchvision AlexNet's five convolutions."""
    net = _Walker("alexnet", batch, resolution)
    h = net.conv("conv1", 3, 64, resolution, R=11, stride=4, padding=2)
    h = net.pool("maxpool1", h, 3, 2)
    h = net.conv("conv2", 64, 192, h, R=5, padding=2)
    h = net.pool("maxpool2", h, 3, 2)
    h = net.conv("conv3", 192, 384, h)
    h = net.conv("conv4", 384, 256, h)
    net.conv("conv5", 256, 256, h)
    return net.layers()


NETWORKS: dict[str, Callable[[int, int], list[NetworkLayer]]] = {
    "vgg16": vgg16,
    "resnet50": resnet50,
    "yolov3": yolov3,
    "densenet161": densenet161,
    "alexnet": alexnet,
}

DEFAULT_RESOLUTION: dict[str, int] = {
    "vgg16": 224,
    "resnet50": 224,
    "yolov3": 416,
    "densenet161": 224,
    "alexnet": 224,
}

# Alternative spellings accepted by find_layer: (pattern, replacement).
_ALIASES = [(re.compile(r"^densenet161\.b(\d+)(?=\.|$)"), r"densenet161.block\1")]


def _check_network(network: str) -> str:
    key = network.strip().lower() if isinstance(network, str) else network
    if key not in NETWORKS:
        close = difflib.get_close_matches(str(network), list(NETWORKS), n=3)
        hint = f" (did you mean {', '.join(close)}?)" if close else ""
        raise ValueError(f"unknown network {network!r}{hint}; known networks: "
                         f"{', '.join(NETWORKS)}")
    return key


def _min_resolution(network: str, limit: int = 4096) -> int | None:
    for r in range(1, limit + 1):
        try:
            NETWORKS[network](1, r)
            return r
        except _ResolutionTooSmall:
            continue
    return None


def _build(network: str, batch: int, resolution: int | None) -> list[NetworkLayer]:
    network = _check_network(network)
    if resolution is None:
        resolution = DEFAULT_RESOLUTION[network]
    try:
        return NETWORKS[network](batch, resolution)
    except _ResolutionTooSmall as err:
        smallest = _min_resolution(network)
        raise ValueError(f"resolution {resolution} is too small for {network} ({err}); "
                         f"the smallest resolution that works is {smallest}") from None


def network_layers(network: str, batch: int = 1, resolution: int | None = None,
                   winograd_only: bool = True, layout: str = "NCHW") -> list[NetworkLayer]:
    """Conv layers of ``network`` in network order, each distinct layer once with its count.

    ``winograd_only`` keeps the 3x3 stride-1 layers (``spec.winograd_eligible``);
    ``False`` keeps every conv layer.  ``resolution`` defaults to
    ``DEFAULT_RESOLUTION[network]``.
    """
    layers = _build(network, batch, resolution)
    if winograd_only:
        layers = [layer for layer in layers if layer.spec.winograd_eligible]
    if layout != "NCHW":
        layers = [NetworkLayer(layer.spec.with_(layout=layout), layer.count) for layer in layers]
    return layers


def find_layer(name: str, batch: int = 1, resolution: int | None = None,
               layout: str = "NCHW") -> LayerSpec:
    """The :class:`LayerSpec` of a named layer, e.g. ``find_layer("resnet50.conv2_x", 64)``."""
    if not isinstance(name, str) or "." not in name:
        raise ValueError(f"layer name {name!r} is not of the form NETWORK.LAYER "
                         f"(networks: {', '.join(NETWORKS)})")
    key = name.strip().lower()
    for pattern, replacement in _ALIASES:
        key = pattern.sub(replacement, key)
    network = _check_network(key.split(".", 1)[0])
    layers = network_layers(network, batch, resolution, winograd_only=False, layout=layout)
    by_name = {layer.spec.name: layer.spec for layer in layers}
    if key in by_name:
        return by_name[key]
    close = difflib.get_close_matches(key, list(by_name), n=5, cutoff=0.6)
    hint = f"; close matches: {', '.join(close)}" if close else ""
    raise ValueError(f"unknown layer {name!r} in network {network}{hint} "
                     f"(network_layers({network!r}, winograd_only=False) lists all "
                     f"{len(by_name)})")
