"""A YOLOv3-style network in PyTorch: the Darknet-53 backbone and the three detection heads of
yolov3.cfg (the layer shapes of ``megawino.core.networks.yolov3``), randomly initialised; no weights
are downloaded.

Every convolution but the detection ones is conv (no bias) + BatchNorm + LeakyReLU(0.1); the
stride-2 3x3 convolutions pad by 1.  ``forward`` returns the three raw detection maps
([N, 3 * (classes + 5), H / s, W / s] for s = 32, 16, 8).  ``width`` scales every channel count
(32 is YOLOv3; small widths make the same topology cheap enough for CPU tests).
"""
from __future__ import annotations

import torch
from torch import nn

STAGE_BLOCKS = (1, 2, 8, 8, 4)     # residual blocks per backbone stage (Darknet-53)


class ConvBNLeaky(nn.Sequential):
    def __init__(self, c_in: int, c_out: int, kernel: int, stride: int = 1):
        super().__init__(nn.Conv2d(c_in, c_out, kernel, stride, kernel // 2, bias=False),
                         nn.BatchNorm2d(c_out), nn.LeakyReLU(0.1))


class Residual(nn.Module):
    def __init__(self, channels: int):
        super().__init__()
        self.reduce = ConvBNLeaky(channels, channels // 2, 1)
        self.expand = ConvBNLeaky(channels // 2, channels, 3)

    def forward(self, x):
        return x + self.expand(self.reduce(x))


class Darknet53(nn.Module):
    """The backbone; ``forward`` returns the outputs of stages 3, 4 and 5 (strides 8, 16, 32)."""

    def __init__(self, width: int = 32):
        super().__init__()
        self.stem = ConvBNLeaky(3, width, 3)
        stages, c = [], width
        for blocks in STAGE_BLOCKS:
            stages.append(nn.Sequential(ConvBNLeaky(c, 2 * c, 3, stride=2),
                                        *(Residual(2 * c) for _ in range(blocks))))
            c *= 2
        self.stages = nn.ModuleList(stages)
        self.channels = (c // 4, c // 2, c)

    def forward(self, x):
        x = self.stem(x)
        outputs = []
        for stage in self.stages:
            x = stage(x)
            outputs.append(x)
        return outputs[2:]


class DetectionHead(nn.Module):
    """Five alternating 1x1 / 3x3 convolutions (the route output), one 3x3 and the 1x1
    detection convolution (with bias)."""

    def __init__(self, c_in: int, width: int, detect: int):
        super().__init__()
        self.route = nn.Sequential(ConvBNLeaky(c_in, width, 1), ConvBNLeaky(width, 2 * width, 3),
                                   ConvBNLeaky(2 * width, width, 1), ConvBNLeaky(width, 2 * width, 3),
                                   ConvBNLeaky(2 * width, width, 1))
        self.detect = nn.Sequential(ConvBNLeaky(width, 2 * width, 3), nn.Conv2d(2 * width, detect, 1))

    def forward(self, x):
        route = self.route(x)
        return route, self.detect(route)


class YOLOv3(nn.Module):
    def __init__(self, num_classes: int = 80, width: int = 32):
        super().__init__()
        detect = 3 * (num_classes + 5)
        self.backbone = Darknet53(width)
        c3, c4, c5 = self.backbone.channels
        self.head1 = DetectionHead(c5, c5 // 2, detect)
        self.lateral1 = ConvBNLeaky(c5 // 2, c5 // 4, 1)
        self.head2 = DetectionHead(c4 + c5 // 4, c4 // 2, detect)
        self.lateral2 = ConvBNLeaky(c4 // 2, c4 // 4, 1)
        self.head3 = DetectionHead(c3 + c4 // 4, c3 // 2, detect)
        self.upsample = nn.Upsample(scale_factor=2, mode="nearest")
        for module in self.modules():
            if isinstance(module, nn.Conv2d):    # keep activations at scale through 75 layers
                nn.init.kaiming_normal_(module.weight, a=0.1, nonlinearity="leaky_relu")

    def forward(self, x) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        f3, f4, f5 = self.backbone(x)
        route, out1 = self.head1(f5)
        route, out2 = self.head2(torch.cat([self.upsample(self.lateral1(route)), f4], 1))
        _, out3 = self.head3(torch.cat([self.upsample(self.lateral2(route)), f3], 1))
        return out1, out2, out3
