"""Small ImageNet-shaped CNNs for quick end-to-end runs and tests.

Each function is a factory: ``num_classes`` outputs, random initialisation, any input of
at least 32x32 pixels (global average pooling before the classifier).
Use in config.toml as ``factories = ["models/imagenet/tiny_nets.py:tiny_vgg"]``.
"""
from torch import nn


def _conv_bn_relu(cin: int, cout: int, stride: int = 1) -> list[nn.Module]:
    return [nn.Conv2d(cin, cout, 3, stride, 1, bias=False), nn.BatchNorm2d(cout), nn.ReLU(inplace=True)]


def tiny_vgg(num_classes: int = 1000) -> nn.Module:
    """A VGG-like stack: 6 3x3 convolutions (16-128 channels), max pooling, one linear layer."""
    layers: list[nn.Module] = []
    cin = 3
    for cout, pool in ((16, False), (32, True), (64, False), (64, True), (128, False), (128, True)):
        layers += _conv_bn_relu(cin, cout)
        if pool:
            layers.append(nn.MaxPool2d(2))
        cin = cout
    return nn.Sequential(*layers, nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(cin, num_classes))


class _Basic(nn.Module):
    """A residual block: two 3x3 convolutions plus a (projected when needed) shortcut."""

    def __init__(self, cin: int, cout: int, stride: int) -> None:
        super().__init__()
        self.body = nn.Sequential(*_conv_bn_relu(cin, cout, stride),
                                  nn.Conv2d(cout, cout, 3, 1, 1, bias=False), nn.BatchNorm2d(cout))
        self.short = (nn.Identity() if stride == 1 and cin == cout else
                      nn.Sequential(nn.Conv2d(cin, cout, 1, stride, bias=False), nn.BatchNorm2d(cout)))
        self.relu = nn.ReLU(inplace=True)

    def forward(self, x):
        return self.relu(self.body(x) + self.short(x))


class TinyResNet(nn.Module):
    """A 3-stage residual network (32/64/128 channels)."""

    def __init__(self, num_classes: int = 1000) -> None:
        super().__init__()
        self.stem = nn.Sequential(*_conv_bn_relu(3, 32, 2))
        self.blocks = nn.Sequential(_Basic(32, 32, 1), _Basic(32, 64, 2), _Basic(64, 128, 2))
        self.pool = nn.AdaptiveAvgPool2d(1)
        self.fc = nn.Linear(128, num_classes)

    def forward(self, x):
        x = self.pool(self.blocks(self.stem(x)))
        return self.fc(x.flatten(1))


def tiny_resnet(num_classes: int = 1000) -> nn.Module:
    """A residual network with three stages and projected shortcuts."""
    return TinyResNet(num_classes)
