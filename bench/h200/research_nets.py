"""Two networks of research code written for the H200's allocation histories of 2026-11-30, each from its paper's
description (no code copied): a ResNet-18 with CBAM in every block, whose channel gate calls one MLP on the average
and on the max pool (a layer called twice: the description's ``shares``), and CycleGAN's 9-block ResNet generator
(reflection pads, instance norms followed by in-place ReLUs, transposed convolutions, a tanh), trained with an L1
loss. ``python bench/h200/research_nets.py`` describes both into ``bench/h200/models/``.
"""
from __future__ import annotations

import sys
from pathlib import Path

import torch
from torch import nn

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parents[1]))


class ChannelGate(nn.Module):
    """CBAM's channel attention: one MLP (1x1 convolutions, reduction 16) on the average and the max pool, summed,
    through a sigmoid."""

    def __init__(self, channels: int, reduction: int = 16) -> None:
        super().__init__()
        hidden = max(channels // reduction, 4)
        self.mlp = nn.Sequential(nn.Conv2d(channels, hidden, 1), nn.ReLU(), nn.Conv2d(hidden, channels, 1))

    def forward(self, x):
        avg = self.mlp(nn.functional.adaptive_avg_pool2d(x, 1))
        peak = self.mlp(nn.functional.adaptive_max_pool2d(x, 1))
        return x * torch.sigmoid(avg + peak)


class SpatialGate(nn.Module):
    """CBAM's spatial attention: the mean and max over channels, a 7x7 convolution, a sigmoid."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(2, 1, 7, padding=3)

    def forward(self, x):
        pooled = torch.cat([x.mean(1, keepdim=True), x.amax(1, keepdim=True)], 1)
        return x * torch.sigmoid(self.conv(pooled))


class CbamBlock(nn.Module):
    """A ResNet basic block with CBAM before the residual add."""

    def __init__(self, cin: int, cout: int, stride: int) -> None:
        super().__init__()
        self.body = nn.Sequential(nn.Conv2d(cin, cout, 3, stride, 1, bias=False), nn.BatchNorm2d(cout),
                                  nn.ReLU(inplace=True), nn.Conv2d(cout, cout, 3, 1, 1, bias=False),
                                  nn.BatchNorm2d(cout), ChannelGate(cout), SpatialGate())
        self.short = (nn.Identity() if stride == 1 and cin == cout else
                      nn.Sequential(nn.Conv2d(cin, cout, 1, stride, bias=False), nn.BatchNorm2d(cout)))
        self.relu = nn.ReLU(inplace=True)

    def forward(self, x):
        return self.relu(self.body(x) + self.short(x))


def cbam_resnet18(num_classes: int = 1000) -> nn.Module:
    """ResNet-18's layout (two blocks a stage, 64-512 channels) with CBAM blocks."""
    layers = [nn.Conv2d(3, 64, 7, 2, 3, bias=False), nn.BatchNorm2d(64), nn.ReLU(inplace=True), nn.MaxPool2d(3, 2, 1)]
    cin = 64
    for cout, stride in ((64, 1), (128, 2), (256, 2), (512, 2)):
        layers += [CbamBlock(cin, cout, stride), CbamBlock(cout, cout, 1)]
        cin = cout
    layers += [nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(512, num_classes)]
    return nn.Sequential(*layers)


class ResidualBlock(nn.Module):
    """CycleGAN's residual block: reflection pad, 3x3 convolution, instance norm, ReLU, then again without the
    ReLU, added to the input."""

    def __init__(self, channels: int) -> None:
        super().__init__()
        self.body = nn.Sequential(nn.ReflectionPad2d(1), nn.Conv2d(channels, channels, 3), nn.InstanceNorm2d(channels),
                                  nn.ReLU(inplace=True), nn.ReflectionPad2d(1), nn.Conv2d(channels, channels, 3),
                                  nn.InstanceNorm2d(channels))

    def forward(self, x):
        return x + self.body(x)


def resnet_generator(blocks: int = 9, width: int = 64) -> nn.Module:
    """CycleGAN's generator: a 7x7 stem, two stride-2 downsamplings, ``blocks`` residual blocks, two transposed
    convolutions back up and a 7x7 convolution to 3 channels through a tanh."""
    layers = [nn.ReflectionPad2d(3), nn.Conv2d(3, width, 7), nn.InstanceNorm2d(width), nn.ReLU(inplace=True)]
    for k in (1, 2):
        layers += [nn.Conv2d(width * k, width * 2 * k, 3, 2, 1), nn.InstanceNorm2d(width * 2 * k),
                   nn.ReLU(inplace=True)]
    layers += [ResidualBlock(width * 4) for _ in range(blocks)]
    for k in (4, 2):
        layers += [nn.ConvTranspose2d(width * k, width * k // 2, 3, 2, 1, output_padding=1),
                   nn.InstanceNorm2d(width * k // 2), nn.ReLU(inplace=True)]
    layers += [nn.ReflectionPad2d(3), nn.Conv2d(width, 3, 7), nn.Tanh()]
    return nn.Sequential(*layers)


def main() -> None:
    from perf4sight.ir.from_torch import describe
    from perf4sight.ir.schema import save_description

    out = HERE / "models"
    out.mkdir(exist_ok=True)
    for name, module, shape in (("cbam_resnet18", cbam_resnet18(), [3, 224, 224]),
                                ("cyclegan_generator", resnet_generator(), [3, 256, 256])):
        desc = describe(module, shape, name)
        save_description(desc, out / f"{name}.json")
        print(f"{name}: {len(desc.nodes)} nodes -> {out / (name + '.json')}")


if __name__ == "__main__":
    main()
