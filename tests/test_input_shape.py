"""Networks described again at another input shape (``--stage predict --input-shape``): a description rebuilt and
traced there is what describing its module there gives; what a description fixes as numbers is refused in one line,
or, for a pruned variant of a zoo network, pruned at the new shape instead."""
from __future__ import annotations

import importlib
import re
import warnings

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from torch import nn

from perf4sight.config import FingerprintConfig, load_config
from perf4sight.dataset import resolve_networks
from perf4sight.errors import UserError
from perf4sight.features.aggregate import features_for
from perf4sight.fingerprint import fit_fingerprint, load_fingerprint
from perf4sight.ir.from_torch import describe
from perf4sight.ir.schema import NetworkDescription, load_description, save_description
from perf4sight.ir.to_torch import build_module
from perf4sight.networks.build import make_networks
from perf4sight.networks.reshape import described_at, query_at
from perf4sight.networks.zoo import build_zoo_model


def _layers(desc) -> list:
    return [(n.op, n.attrs, n.output_shape) for n in desc.nodes]


@pytest.mark.parametrize("name", ["resnet18", "mobilenet_v2", "squeezenet1_1"])
def test_a_rebuilt_description_is_the_module_described_at_the_new_shape(name):
    module = build_zoo_model(name, num_classes=10, input_shape=[3, 32, 32])
    at_32 = describe(module, [3, 32, 32], name=f"{name}_l30", network=name, pruning_level=30.0)
    at_48 = described_at(at_32, [3, 48, 48])
    assert _layers(at_48) == _layers(describe(module, [3, 48, 48], name=name))
    assert _layers(at_48) != _layers(at_32) and at_48.input_shape == [3, 48, 48]
    assert (at_48.name, at_48.network, at_48.pruning_level, at_48.params) == (f"{name}_l30", name, 30.0, at_32.params)
    assert described_at(at_32, (3, 32, 32)) is at_32  # already there


class _FixedResize(nn.Module):
    """A segmentation-like head whose resize back to the input's size was traced as a fixed size."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, 5, 3, stride=2, padding=1)

    def forward(self, x):
        return F.interpolate(self.conv(x), size=(16, 16), mode="bilinear", align_corners=False)


def test_fixed_sizes_and_another_channel_count_are_one_line():
    flat = describe(nn.Sequential(nn.Conv2d(3, 4, 3, padding=1), nn.Flatten(), nn.Linear(4 * 16 * 16, 10)),
                    [3, 16, 16], name="flat")
    with pytest.raises(UserError, match=r"^flat: the model's forward fails at input shape \[3, 24, 24\].*"
                                        r"\(described at 3x16x16, rebuilt at 3x24x24: a description fixes some sizes"):
        described_at(flat, [3, 24, 24])
    resize = describe(_FixedResize(), [3, 16, 16], name="seg")
    with pytest.raises(UserError, match=r"^seg: described at 3x16x16, its output has the input's size, but rebuilt "
                                        r"at 3x24x24 it keeps 16x16 \(a resize to a fixed size\)"):
        described_at(resize, [3, 24, 24])
    with pytest.raises(UserError, match=r"^flat: takes 3-channel images \(described at 3x16x16\), not 1-channel "
                                        r"ones \(1x16x16\)"):
        described_at(flat, [1, 16, 16])
    with pytest.raises(UserError, match=r"^flat: input shape must be \[C, H, W\]"):
        described_at(flat, [3, 0, 16])


class _ScoresOfAPixel(nn.Module):
    """A fully convolutional classifier whose last map is 1x1 at 7x7, its ten scores taken by ``y.view(b, 10)``."""

    def __init__(self) -> None:
        super().__init__()
        self.a, self.b = nn.Conv2d(3, 8, 3, stride=2), nn.Conv2d(8, 10, 3)

    def forward(self, x):
        y = self.b(torch.relu(self.a(x)))
        return y.view(y.shape[0], 10)


def test_a_view_of_a_1x1_map_keeps_its_channel_count_at_another_shape():
    """A reshape adding or dropping size-1 dimensions around one other is rebuilt reading that size at run time (a
    pruned squeeze-excitation gate's channels). Read as -1, a ``[10, 1, 1]`` map's view to ``[10]`` took all 40
    values of its 2x2 map at 9x9: the description said 40 classes where the module fails. It reads the map's channels
    now, and the rebuild fails as the module does, with the one line that says so."""
    desc = describe(_ScoresOfAPixel(), [3, 7, 7], name="pixel")
    assert desc.num_classes == 10 and desc.node(desc.output).op == "reshape"
    with pytest.raises(UserError, match=r"^pixel: the model's forward fails at input shape \[3, 9, 9\].*"
                                        r"\(described at 3x7x7, rebuilt at 3x9x9: a description fixes some sizes"):
        described_at(desc, [3, 9, 9])
    assert described_at(desc, [3, 8, 8]).num_classes == 10  # a map of 1x1 there too


def test_a_pruned_zoo_variant_that_cannot_be_rebuilt_is_pruned_at_the_new_shape(tmp_path):
    """ShuffleNet's channel shuffle reshapes to its map's height and width as numbers: its rebuild fails at another
    shape, so ``shufflenet_v2_x0_5_l0`` is made there as the networks stage would make it."""
    (tmp_path / "config.toml").write_text('[networks]\nzoo = ["shufflenet_v2_x0_5"]\ninput_shape = [3, 32, 32]\n'
                                          'num_classes = 10\n')
    cfg = load_config(tmp_path / "config.toml")
    module = build_zoo_model("shufflenet_v2_x0_5", num_classes=10, input_shape=[3, 32, 32])
    at_32 = describe(module, [3, 32, 32], name="shufflenet_v2_x0_5_l0", network="shufflenet_v2_x0_5")
    with pytest.raises(UserError, match="rebuilt at 3x48x48"):
        described_at(at_32, [3, 48, 48])
    notes: list[str] = []
    at_48 = query_at(cfg, "shufflenet_v2_x0_5_l0", at_32, [3, 48, 48], notes)
    assert at_48.input_shape == [3, 48, 48] and at_48.name == "shufflenet_v2_x0_5_l0"
    assert _layers(at_48) == _layers(describe(module, [3, 48, 48], name="x"))
    assert notes == ["shufflenet_v2_x0_5_l0: its description cannot be rebuilt at 3x48x48: shufflenet_v2_x0_5 "
                     "pruned there as the networks stage would (l1-norm, min_channels 4, seed 0)"]
    with pytest.raises(UserError, match="rebuilt at 3x48x48"):  # not a variant's name: the rebuild's error
        query_at(cfg, "mine", at_32, [3, 48, 48])


def test_a_rebuilt_vit_describes_back_with_torch_geometric_loaded():
    """torch_geometric replaces ``torch.select`` with a function of its own that torch.fx cannot trace through (the
    GNN imports it on the host); the rebuilt module's select is the tensor's method, which it leaves alone."""
    importlib.import_module("torch_geometric")  # its import is the point

    module = build_zoo_model("vit_b_32", num_classes=10, input_shape=[3, 32, 32])
    desc = describe(module, [3, 32, 32], name="vit_b_32_l0", network="vit_b_32")
    assert "select" in {n.op for n in desc.nodes}
    again = describe(build_module(desc, device="meta"), [3, 32, 32], name="vit_b_32_l0")
    assert _layers(again) == _layers(desc)


def test_a_rebuilt_swin_keeps_its_windowed_attention_whole_and_takes_another_shape():
    """A Swin block's window attention and patch merging branch on the input's shape: the rebuilt modules keep
    their node (``to_torch.DESCRIBED_WHOLE``), so the network describes back to itself and at another shape as
    torchvision's does."""
    module = build_zoo_model("swin_t", num_classes=10, input_shape=[3, 32, 32])
    desc = describe(module, [3, 32, 32], name="swin_t_l0", network="swin_t")
    assert _layers(describe(build_module(desc, device="meta"), [3, 32, 32], name="x")) == _layers(desc)
    at_48 = described_at(desc, [3, 48, 48])
    assert _layers(at_48) == _layers(describe(module, [3, 48, 48], name="x")) != _layers(desc)


class _UNet(nn.Module):
    """A two-level U-Net: each decoder stage upsamples by 2 (bilinear; corners aligned or not) and concatenates the
    encoder's map of that size, so a resize that kept its traced size would not fit the skip at another shape."""

    def __init__(self, align_corners: bool = False) -> None:
        super().__init__()
        self.enc1, self.enc2 = _conv_bn(3, 8), _conv_bn(8, 16)
        self.bottom = _conv_bn(16, 32)
        self.pool = nn.MaxPool2d(2)
        self.up = nn.Upsample(scale_factor=2, mode="bilinear", align_corners=align_corners)
        self.dec2, self.dec1 = _conv_bn(32 + 16, 16), _conv_bn(16 + 8, 8)
        self.head = nn.Conv2d(8, 4, 1)

    def forward(self, x):
        e1 = self.enc1(x)
        e2 = self.enc2(self.pool(e1))
        b = self.bottom(self.pool(e2))
        d2 = self.dec2(torch.cat([self.up(b), e2], 1))
        d1 = self.dec1(torch.cat([F.interpolate(d2, scale_factor=2.0, mode="bilinear",
                                                align_corners=self.up.align_corners), e1], 1))
        return self.head(d1)


class _YoloNeck(nn.Module):
    """A YOLOv5-like backbone and neck (PANet): P5 upsampled by nn.Upsample(scale_factor=2) (nearest) and joined to
    P4, that to P3, then down again by strided convolutions; one output of the P5 level's scores."""

    def __init__(self) -> None:
        super().__init__()
        self.stem, self.p3, self.p4, self.p5 = _conv_bn(3, 8, 2), _conv_bn(8, 16, 2), _conv_bn(16, 24, 2), \
            _conv_bn(24, 32, 2)
        self.upsample = nn.Upsample(None, 2, "nearest")  # YOLOv5's own call
        self.lateral5, self.top4 = _conv_bn(32, 16, 1, kernel=1), _conv_bn(16 + 24, 16)
        self.lateral4, self.top3 = _conv_bn(16, 8, 1, kernel=1), _conv_bn(8 + 16, 8)
        self.down3, self.bottom4 = _conv_bn(8, 8, 2), _conv_bn(8 + 8, 16)
        self.down4, self.bottom5 = _conv_bn(16, 16, 2), _conv_bn(16 + 16, 32)
        self.detect = nn.Conv2d(32, 3 * 9, 1)

    def forward(self, x):
        c3 = self.p3(self.stem(x))
        c4 = self.p4(c3)
        l5 = self.lateral5(self.p5(c4))
        l4 = self.lateral4(self.top4(torch.cat([self.upsample(l5), c4], 1)))
        n3 = self.top3(torch.cat([self.upsample(l4), c3], 1))
        n4 = self.bottom4(torch.cat([self.down3(n3), l4], 1))
        return self.detect(self.bottom5(torch.cat([self.down4(n4), l5], 1)))


def _conv_bn(cin: int, cout: int, stride: int = 1, kernel: int = 3) -> nn.Sequential:
    return nn.Sequential(nn.Conv2d(cin, cout, kernel, stride, kernel // 2, bias=False), nn.BatchNorm2d(cout),
                         nn.SiLU())


def _copy_by_module_name(original: nn.Module, rebuilt: nn.Module) -> None:
    """``original``'s parameters and buffers into ``rebuilt``'s, each to the layer of its module's name (a
    description names a layer as torch.fx names its module's call: ``enc1.0`` -> ``enc1_0``); each found once."""
    layers = dict(rebuilt.named_modules())
    for source in (original.named_parameters, original.named_buffers):
        for key, tensor in source():
            module, _, attr = key.rpartition(".")
            target = getattr(layers[module.replace(".", "_")], attr)
            assert target.shape == tensor.shape, key
            target.data.copy_(tensor.data)


@pytest.mark.parametrize("make", [_UNet, lambda: _UNet(align_corners=True), _YoloNeck],
                         ids=["unet", "unet_aligned_corners", "yolo_neck"])
def test_a_description_file_resizing_by_a_scale_factor_is_rebuilt_at_other_shapes(tmp_path, make):
    """A U-Net's or a YOLO neck's upsampling by 2 was described as a resize to its traced size, so its description
    file, asked for at another --input-shape, failed ("a description fixes some sizes"): the description keeps the
    factor, and the file rebuilt at each shape (as --stage predict --input-shape does) is the module there: the same
    layers as the module described there, the same output with the same weights."""
    torch.manual_seed(0)
    module = make().eval()
    for layer in module.modules():
        if isinstance(layer, nn.BatchNorm2d):  # statistics of their own: a norm fed another layer's shows
            layer.running_mean.uniform_(-0.5, 0.5)
            layer.running_var.uniform_(0.5, 2.0)
    path = tmp_path / "net.json"
    path.write_text(describe(module, [3, 64, 64], name="net").to_json())
    (tmp_path / "config.toml").write_text("[networks]\nzoo = []\ninput_shape = [3, 64, 64]\n")
    cfg = load_config(tmp_path / "config.toml")
    for shape in ([3, 96, 128], [3, 48, 176]):
        desc = resolve_networks(cfg, [str(path)], shape)[0]
        at = query_at(cfg, str(path), desc, shape)
        assert at.input_shape == shape and _layers(at) == _layers(describe(module, shape, name="x"))
        rebuilt = build_module(at).eval()
        _copy_by_module_name(module, rebuilt)
        x = torch.randn(2, *shape)
        with torch.no_grad():
            assert torch.allclose(rebuilt(x), module(x), atol=1e-6, rtol=0)


class _MilesialUp(nn.Module):
    """A U-Net's ``Up`` block as milesial's Pytorch-UNet writes it (from memory): the deeper map upsampled by 2, padded
    to its skip's size (odd where the encoder's pool floored an odd side), the two concatenated."""

    def __init__(self, cin: int, cout: int) -> None:
        super().__init__()
        self.up = nn.Upsample(scale_factor=2, mode="bilinear", align_corners=True)
        self.conv = _conv_bn(cin, cout)

    def forward(self, x1, x2):
        x1 = self.up(x1)
        diffY = x2.size()[2] - x1.size()[2]
        diffX = x2.size()[3] - x1.size()[3]
        x1 = F.pad(x1, [diffX // 2, diffX - diffX // 2, diffY // 2, diffY - diffY // 2])
        return self.conv(torch.cat([x2, x1], dim=1))


class _OddUNet(nn.Module):
    """A two-level U-Net of milesial's ``Up`` blocks, at sides the pools floor."""

    def __init__(self) -> None:
        super().__init__()
        self.enc1, self.enc2, self.bottom = _conv_bn(3, 8), _conv_bn(8, 16), _conv_bn(16, 16)
        self.pool = nn.MaxPool2d(2)
        self.up2, self.up1 = _MilesialUp(32, 8), _MilesialUp(16, 8)
        self.head = nn.Conv2d(8, 4, 1)

    def forward(self, x):
        e1 = self.enc1(x)
        e2 = self.enc2(self.pool(e1))
        b = self.bottom(self.pool(e2))
        return self.head(self.up1(self.up2(b, e2), e1))


class _SkipSizedUNet(nn.Module):
    """A U-Net decoder resizing each deeper map to its skip's size (``F.interpolate(x, size=skip.shape[2:])``;
    strided convolutions, which round an odd side up, where a resize by 2 would not fit)."""

    def __init__(self) -> None:
        super().__init__()
        self.enc1, self.enc2, self.bottom = _conv_bn(3, 8), _conv_bn(8, 16, 2), _conv_bn(16, 16, 2)
        self.dec2, self.dec1 = _conv_bn(32, 8), _conv_bn(16, 8)
        self.head = nn.Conv2d(8, 4, 1)

    def forward(self, x):
        e1 = self.enc1(x)
        e2 = self.enc2(e1)
        d2 = self.dec2(torch.cat([F.interpolate(self.bottom(e2), size=e2.shape[2:], mode="bilinear"), e2], 1))
        h, w = e1.shape[-2:]
        return self.head(self.dec1(torch.cat([F.interpolate(d2, size=(h, w), mode="nearest"), e1], 1)))


class _TransposedUNet(nn.Module):
    """A U-Net decoder upsampling by transposed convolutions given their skip's size at the call
    (``up(x, output_size=skip.shape[2:])``: an output padding of 1 where the skip's side is even, 0 where odd)."""

    def __init__(self) -> None:
        super().__init__()
        self.enc1, self.enc2, self.bottom = _conv_bn(3, 8), _conv_bn(8, 16, 2), _conv_bn(16, 16, 2)
        self.up2, self.up1 = nn.ConvTranspose2d(16, 16, 3, 2, 1), nn.ConvTranspose2d(8, 8, 3, 2, 1)
        self.dec2, self.dec1 = _conv_bn(32, 8), _conv_bn(16, 8)
        self.head = nn.Conv2d(8, 4, 1)

    def forward(self, x):
        e1 = self.enc1(x)
        e2 = self.enc2(e1)
        d2 = self.dec2(torch.cat([self.up2(self.bottom(e2), output_size=e2.shape[2:]), e2], 1))
        return self.head(self.dec1(torch.cat([self.up1(d2, e1.size()[-2:]), e1], 1)))


class _TransposedUNetWholeSizes(_TransposedUNet):
    """:class:`_TransposedUNet` giving its skips' whole shapes as the output sizes (``output_size=e2.shape``,
    ``e1.size()``: torch takes their last two), which kept the traced output padding alone before."""

    def forward(self, x):
        e1 = self.enc1(x)
        e2 = self.enc2(e1)
        d2 = self.dec2(torch.cat([self.up2(self.bottom(e2), output_size=e2.shape), e2], 1))
        return self.head(self.dec1(torch.cat([self.up1(d2, e1.size()), e1], 1)))


class _Fpn(nn.Module):
    """A backbone of three strided stages and torchvision's FeaturePyramidNetwork, whose top-down path resizes each
    coarser map to its lateral's size (``F.interpolate(x, size=lateral.shape[-2:])``); its finest map out."""

    def __init__(self) -> None:
        super().__init__()
        from torchvision.ops import FeaturePyramidNetwork

        self.c2, self.c3, self.c4 = _conv_bn(3, 8, 2), _conv_bn(8, 16, 2), _conv_bn(16, 24, 2)
        self.fpn = FeaturePyramidNetwork([8, 16, 24], 8)

    def forward(self, x):
        c2 = self.c2(x)
        c3 = self.c3(c2)
        return self.fpn({"c2": c2, "c3": c3, "c4": self.c4(c3)})["c2"]


@pytest.mark.parametrize("make, attr, count", [(_OddUNet, "pad_to", 2), (_SkipSizedUNet, "size_of", 2),
                                               (_Fpn, "size_of", 2), (_TransposedUNet, "output_size_of", 2),
                                               (_TransposedUNetWholeSizes, "output_size_of", 2)],
                         ids=["milesial_up", "skip_sized", "fpn", "transposed_to_skip", "transposed_to_whole_size"])
def test_a_description_file_sized_by_another_map_is_rebuilt_at_other_shapes(tmp_path, make, attr, count):
    """A U-Net's pad to its skip's odd side, a resize to another map's size (a U-Net decoder's, torchvision's FPN's)
    and a transposed convolution given its skip's size at the call are described naming that map (``pad_to``,
    ``size_of``, ``output_size_of``), beside their traced numbers: the description file at other --input-shape's (odd
    sides) is the module there, the same layers, the same output with the same weights. The pad failed to describe
    before ('int() argument ... not Node'), the resize and the output padding kept their traced numbers."""
    torch.manual_seed(0)
    module = make().eval()
    for layer in module.modules():
        if isinstance(layer, nn.BatchNorm2d):
            layer.running_mean.uniform_(-0.5, 0.5)
            layer.running_var.uniform_(0.5, 2.0)
    desc = describe(module, [3, 45, 61], name="net")
    sized = [n for n in desc.nodes if attr in n.attrs]
    assert len(sized) == count and all(desc.node(n.attrs[attr]).output_shape[1:] == n.output_shape[1:] for n in sized)
    path = tmp_path / "net.json"
    path.write_text(desc.to_json())
    (tmp_path / "config.toml").write_text("[networks]\nzoo = []\ninput_shape = [3, 45, 61]\n")
    cfg = load_config(tmp_path / "config.toml")
    for shape in ([3, 37, 50], [3, 64, 64]):
        at = query_at(cfg, str(path), resolve_networks(cfg, [str(path)], shape)[0], shape)
        assert at.input_shape == shape and _layers(at) == _layers(describe(module, shape, name="x"))
        rebuilt = build_module(at).eval()
        _copy_by_module_name(module, rebuilt)
        x = torch.randn(2, *shape)
        with torch.no_grad():
            assert torch.allclose(rebuilt(x), module(x), atol=1e-5, rtol=0)


@pytest.mark.parametrize("name", ["deeplabv3_mobilenet_v3_large", "lraspp_mobilenet_v3_large"])
def test_a_segmentation_zoo_network_resizing_to_its_input_is_rebuilt_at_another_shape(name):
    """torchvision's segmentation networks resize their scores to the input's size (``size=x.shape[-2:]``; DeepLab's
    pooled branch to its input's): described naming the map, they take another shape, where they were refused as a
    resize to a fixed size."""
    module = build_zoo_model(name, num_classes=5, input_shape=[3, 64, 64])
    at_64 = describe(module, [3, 64, 64], name=name)
    assert at_64.node(at_64.output).attrs["size_of"] == "input"
    at_other = described_at(at_64, [3, 96, 80])
    assert _layers(at_other) == _layers(describe(module, [3, 96, 80], name=name))
    assert at_other.node(at_other.output).output_shape == [5, 96, 80]


def test_a_cumulative_average_batch_norm_keeps_its_momentum_none_at_another_shape():
    """A batch norm of momentum None (torch's cumulative average) is described so, and so again at another
    --input-shape, whose description is traced from the network rebuilt on the meta device (where it runs as the
    momentum 0.1): that one was described of the momentum 0.1 before, its running statistics then moving by 0.1 a
    step when rebuilt, where the network's weigh each batch 1 / the batches seen."""
    module = nn.Sequential(nn.Conv2d(3, 4, 3, padding=1), nn.BatchNorm2d(4, momentum=None), nn.ReLU(),
                           nn.Conv2d(4, 4, 3, padding=1), nn.BatchNorm2d(4, momentum=0.3))
    desc = describe(module, [3, 16, 16], name="cumulative")
    at_other = described_at(desc, [3, 20, 12])
    for d in (desc, at_other):
        assert [n.attrs.get("momentum", 0.1) for n in d.nodes if n.op == "batchnorm2d"] == [None, 0.3]
    rebuilt = build_module(at_other).train()
    rebuilt(torch.randn(2, 3, 20, 12))
    assert [m.momentum for m in rebuilt.modules() if isinstance(m, nn.BatchNorm2d)] == [None, 0.3]


def test_a_pad_of_other_arithmetic_on_sizes_keeps_its_numbers_and_is_refused_at_another_shape():
    """A pad computed from the shapes otherwise than a U-Net's split (all of the difference before) is described by
    the numbers the trace gives, naming no map but marked computed (it failed to describe before: 'int() argument
    ... not Node'); asked for at another shape, where those numbers would no longer be the module's, it is refused
    by name, where it was rebuilt as if it padded by constants."""

    class _PadAllBefore(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.conv = nn.Conv2d(3, 3, 3, stride=2)

        def forward(self, x):
            y = self.conv(x)
            dy, dx = x.size()[2] - y.size()[2], x.size()[3] - y.size()[3]
            return F.pad(y, [dx, 0, dy, 0]) + x

    desc = describe(_PadAllBefore(), [3, 15, 17], name="pads")
    pad = next(n for n in desc.nodes if n.op == "pad")
    assert pad.attrs == {"pads": [9, 0, 8, 0], "mode": "constant", "pads_computed": True}
    with pytest.raises(UserError, match=rf"^pads: {pad.name} pads by numbers its trace computed from the maps' sizes "
                                        r"at 3x15x17 \(other than a U-Net's split of a difference, d // 2 and "
                                        r"d - d // 2, which a description follows\): rebuilt at 3x24x24 they would "
                                        r"pad as there"):
        described_at(desc, [3, 24, 24])
    fixed = describe(nn.Sequential(nn.Conv2d(3, 3, 3), nn.ZeroPad2d((1, 1, 1, 1))), [3, 15, 17], name="fixed")
    assert "pads_computed" not in fixed.nodes[-1].attrs and described_at(fixed, [3, 24, 24]).input_shape == [3, 24, 24]


def test_a_refused_rebuild_names_only_the_resizes_to_a_fixed_size(tmp_path):
    """A description whose rebuild fails (a classifier's flattened map) names its resizes to a fixed size, not one to
    another map's size, which follows the new shape."""

    class _Head(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.conv, self.fc = nn.Conv2d(3, 4, 3, stride=2, padding=1), nn.Linear(4 * 16 * 16, 10)

        def forward(self, x):
            fixed = F.interpolate(self.conv(x), size=(16, 16), mode="nearest")
            return self.fc(torch.flatten(F.interpolate(fixed, size=x.shape[-2:]) + x.mean(1, keepdim=True), 1))

    desc = describe(_Head(), [3, 16, 16], name="head")
    assert [n.attrs.get("size_of") for n in desc.nodes if n.op == "interpolate"] == [None, "input"]
    with pytest.raises(UserError, match=r"a resize's \(interpolate resize to a fixed size;"):
        described_at(desc, [3, 24, 24])


# ---------------------------------------------------------------- a dataset at several shapes

def test_the_networks_stage_makes_every_network_at_the_extra_shapes_too(tmp_path):
    """``[networks] extra_input_shapes``: each pruned and generated network again at each extra shape, named
    ``<name>_<H>x<W>``, of the same family and layers (ShuffleNet's variants, whose rebuild cannot take another
    shape, pruned there); bad shapes are one line naming the key."""
    (tmp_path / "config.toml").write_text(
        '[networks]\nzoo = ["squeezenet1_1", "shufflenet_v2_x0_5"]\ninput_shape = [3, 32, 32]\n'
        'extra_input_shapes = [[3, 48, 40]]\nnum_classes = 10\n[networks.pruning]\nlevels = [0, 50]\n'
        '[networks.generator]\ncount = 1\nmin_mflops = 1\nmax_mflops = 50\n')
    cfg = load_config(tmp_path / "config.toml")
    rows = make_networks(cfg).rows
    names = [r["network"] for r in rows]
    assert names == ["squeezenet1_1_l0", "squeezenet1_1_l0_48x40", "squeezenet1_1_l50", "squeezenet1_1_l50_48x40",
                     "shufflenet_v2_x0_5_l0", "shufflenet_v2_x0_5_l0_48x40", "shufflenet_v2_x0_5_l50",
                     "shufflenet_v2_x0_5_l50_48x40", "gen_0_0", "gen_0_0_48x40"]
    by_name = {r["network"]: r for r in rows}
    for name in names[::2]:
        main, extra = (load_description(cfg.models_dir / by_name[n]["path"]) for n in (name, f"{name}_48x40"))
        assert (by_name[name]["input_shape"], by_name[f"{name}_48x40"]["input_shape"]) == ("3x32x32", "3x48x40")
        assert (extra.network, extra.params, extra.structure) == (main.network, main.params, main.structure)
        assert _layers(extra) != _layers(main) and extra.input_shape == [3, 48, 40]
    for extra, why in (("[3, 64, 64]", "must be a list of integers"), ("[[1, 64, 64]]", "has 1 channels"),
                       ("[[3, 32, 32]]", "names a shape twice, or input_shape again")):
        (tmp_path / "bad.toml").write_text(f"[networks]\ninput_shape = [3, 32, 32]\nextra_input_shapes = {extra}\n")
        with pytest.raises(UserError, match=rf"bad\.toml: \[networks\] .?extra_input_shapes.*{re.escape(why)}"):
            load_config(tmp_path / "bad.toml")


def test_a_description_file_whose_upsampling_kept_its_size_names_its_resizes_when_it_cannot_be_rebuilt(tmp_path):
    """A U-Net's description written before resizes kept their scale factor (each to a fixed size): asked for at
    another shape, its one line says which resizes fixed their sizes, and that a description made now keeps them."""
    data = describe(_UNet().eval(), [3, 64, 64], name="unet").to_dict()
    for node in data["nodes"]:
        node["attrs"].pop("scale_factor", None)
    path = tmp_path / "unet.json"
    save_description(NetworkDescription.from_dict(data), path)
    with pytest.raises(UserError, match=r"^unet: the model's forward fails at input shape \[3, 96, 128\] .*"
                                        r"a description fixes some sizes as numbers, such as a reshape's or a "
                                        r"resize's \(up, interpolate resize to a fixed size; one by a whole scale "
                                        r"factor is described by it now\); describe the network at that shape"):
        described_at(load_description(path), [3, 96, 128])


def test_the_networks_stage_prunes_a_u_net_description_file_at_its_shape_and_the_extra_ones(tmp_path):
    """A ``[networks] description_files`` U-Net described at 64x64, its upsampling by 2 kept as a factor: built at
    ``input_shape`` 32x32, pruned there, and made again at the extra shape, each scoring every pixel of its shape
    (its resize to the 64x64 file's size could not be rebuilt at either)."""
    (tmp_path / "unet.json").write_text(describe(_UNet().eval(), [3, 64, 64], name="unet").to_json())
    (tmp_path / "config.toml").write_text(
        '[networks]\nzoo = []\ndescription_files = ["unet.json"]\ninput_shape = [3, 32, 32]\n'
        'extra_input_shapes = [[3, 48, 80]]\nnum_classes = 4\n[networks.pruning]\nlevels = [0, 50]\n')
    cfg = load_config(tmp_path / "config.toml")
    made = {r["network"]: load_description(cfg.models_dir / r["path"]) for r in make_networks(cfg).rows}
    assert list(made) == ["unet_l0", "unet_l0_48x80", "unet_l50", "unet_l50_48x80"]
    for name, desc in made.items():
        side = [48, 80] if name.endswith("48x80") else [32, 32]
        assert desc.input_shape == [3, *side] and desc.node(desc.output).output_shape == [4, *side]
        assert [n.attrs["scale_factor"] for n in desc.nodes if n.op == "interpolate"] == [[2, 2], [2, 2]]
    assert made["unet_l50"].params == made["unet_l50_48x80"].params < made["unet_l0"].params


def _probe(width: int) -> nn.Module:
    """A small real CNN whose classifier follows an adaptive pool: it runs at any input shape."""
    return nn.Sequential(nn.Conv2d(3, width, 3, padding=1), nn.ReLU(), nn.AdaptiveAvgPool2d(1), nn.Flatten(),
                         nn.Linear(width, 10))


def test_a_fingerprint_of_two_shapes_names_both_and_warns_at_neither_alone(tmp_path):
    """Rows at two shapes: the metadata names both (the shape most rows share first), and a query at either is no
    extrapolation in shape; at a third, the warning names both."""
    descs, rows = {}, []
    for width, side in ((4, 16), (8, 16), (16, 16), (4, 24), (8, 24)):  # most at 16x16
        name = f"net_w{width}_{side}"
        descs[name] = describe(_probe(width), [3, side, side], name=name, network=f"w{width}")
        for b in (1, 4, 16):
            f = features_for(descs[name], b)
            rows.append({"device": "cpu0", "backend": "cpu", "network": name, "batch_size": b, "status": "ok",
                         "latency_ms_median": 2.0 + f["flops_total"] / 2e6,
                         "peak_rss_mb": 20.0 + 40.0 * f["mem_analytic_mb"]})
    meta = fit_fingerprint(rows, descs, "cpu0", tmp_path / "cpu0", FingerprintConfig(n_estimators=10))
    assert (meta["input_shape"], meta["input_shapes"]) == ([3, 16, 16], [[3, 16, 16], [3, 24, 24]])
    fp = load_fingerprint(tmp_path / "cpu0")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        for side in (16, 24):
            fp.predict_module(_probe(6), [3, side, side], 4)
    with pytest.warns(UserWarning, match=r"training networks were 3x16x16 or 3x24x24"):
        fp.predict_module(_probe(6), [3, 32, 32], 4)
    # a network of a family seen gets that band at a training shape, the band of a family never seen at another;
    # these rows' own check held no such band (select.seen_family_band): one is given as a fit that held it would
    fp._seen_bands = {"latency": (-0.05, 0.07), "memory": (-0.02, 0.03)}
    assert fp._seen_bands["latency"] != fp._bands["latency"]
    for side, band in ((24, fp._seen_bands), (32, fp._bands)):
        (p,) = fp.predict(describe(_probe(8), [3, side, side], name="net", network="w8"), 4)
        for target, key in (("latency", "latency_ms"), ("memory", "memory_mb")):
            ratios = (np.log(p[f"{key}_low"] / p[key]), np.log(p[f"{key}_high"] / p[key]))
            assert ratios == pytest.approx(band[target])


def test_a_network_that_cannot_take_an_extra_shape_is_left_out_there_with_a_note(tmp_path):
    """A generated transformer stage's position embedding has one entry per pixel: at another shape it is left out
    (said why), the rest of the dataset is made."""
    (tmp_path / "config.toml").write_text(
        '[networks]\nzoo = ["squeezenet1_1"]\ninput_shape = [3, 32, 32]\nextra_input_shapes = [[3, 48, 48]]\n'
        'num_classes = 10\n[networks.pruning]\nlevels = [0]\n[networks.generator]\ncount = 1\nmin_mflops = 1\n'
        'max_mflops = 200\nstyles = ["transformer"]\n')
    made = make_networks(load_config(tmp_path / "config.toml"))
    assert [r["network"] for r in made.rows] == ["squeezenet1_1_l0", "squeezenet1_1_l0_48x48", "gen_0_0"]
    (line,) = made.skipped
    # why, in words (it was torch's "shape '[2, 16, 256]' is invalid", with advice for a module of the user's own)
    assert re.fullmatch(r"gen_0_0_48x48 left out: gen_0_0 cannot be made at 3x48x48 \(its transformer stage's position "
                        r"embedding \(\w+\) holds one entry per pixel of its map at 3x32x32, \d+ of them\)", line), line


def test_a_shape_given_as_text_is_named_whole():
    flat = describe(nn.Sequential(nn.Conv2d(3, 4, 3, padding=1), nn.Flatten(), nn.Linear(4 * 16 * 16, 10)),
                    [3, 16, 16], name="flat")
    with pytest.raises(UserError, match=r"^flat: input shape must be \[C, H, W\].*; got '3x24x24'$"):
        described_at(flat, "3x24x24")


def test_an_image_of_more_than_two_billion_elements_is_refused_by_describe_and_the_config(tmp_path):
    """A typo's extra digits (3x99999999x99999999) were described and predicted, absurd figures with the usual note on
    extrapolation; one image over 2^31 elements (8 GiB as float32) is now refused in one line, by describe (and so
    --input-shape and the Python API) and by the config's input shapes. One at the limit is described."""
    with pytest.raises(UserError, match=r"^net: one image of 3x99999999x99999999 is 29,999,999,400,000,003 elements "
                                        r"\(111,758,707 GiB as float32\), more than the 2,147,483,648 "):
        describe(nn.Sequential(nn.Conv2d(3, 2, 3)), [3, 99999999, 99999999], "net")
    at_limit = describe(nn.Sequential(nn.Conv2d(2, 1, 1)), [2, 2 ** 15, 2 ** 15], "net")  # meta tensors: no memory
    assert at_limit.nodes[-1].output_shape == [1, 2 ** 15, 2 ** 15]
    for key, value in (("input_shape", "[3, 65536, 65536]"), ("extra_input_shapes", "[[3, 65536, 65536]]")):
        config = tmp_path / f"{key}.toml"
        config.write_text(f"[networks]\nzoo = []\n{key} = {value}\n")
        with pytest.raises(UserError, match=rf"\[networks\] {key}: one image of 3x65536x65536 is 12,884,901,888 "):
            load_config(config)


def test_a_description_file_of_an_image_of_more_than_two_billion_elements_is_refused(tmp_path):
    """A description file (--network FILE.json, the Python API's predict, [networks] description_files) or an
    imported graph whose input image is over 2^31 elements was read and predicted (figures of 10^11 ms and 10^13 MB),
    where describe and the config refuse such a shape: reading it refuses it in one line, naming the file. One at
    the limit is read."""
    small = describe(nn.Sequential(nn.Conv2d(3, 2, 1), nn.ReLU()), [3, 8, 8], "net")

    def at(side: int):
        path = tmp_path / f"net_{side}.json"
        path.write_text(small.to_json().replace("8, 8]", f"{side}, {side}]").replace("8,8]", f"{side},{side}]"))
        return path
    assert load_description(at(26754)).input_shape == [3, 26754, 26754]  # 2,147,329,548 elements
    with pytest.raises(UserError, match=r"^\S+net_99999999\.json: input_shape: one image of 3x99999999x99999999 is "
                                        r"29,999,999,400,000,003 elements .*more than the 2,147,483,648 "):
        load_description(at(99999999))


def test_predict_refuses_another_channel_count_before_torch_loads(tmp_path, cli_here, monkeypatch):
    """``predict --input-shape 1 H W`` of a 3-channel network was refused in one line only once torch had loaded
    and the network was rebuilt or pruned at the shape (~8 s of waiting for an error). A description file's or a
    dataset network's channels are read from its file: the same line, said with torch out of reach (an import of it
    would fail here), before even the fingerprint is looked for (there is none)."""
    import sys

    from perf4sight.networks.build import write_manifest

    net = nn.Sequential(nn.Conv2d(3, 4, 3, padding=1), nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(4, 10))
    save_description(describe(net, [3, 16, 16], name="tiny_l0", network="tiny"), tmp_path / "models" / "tiny_l0.json")
    write_manifest([{"network": "tiny_l0", "family": "tiny", "path": "tiny_l0.json"}],
                   tmp_path / "models" / "manifest.csv")
    (tmp_path / "config.toml").write_text('[devices.local]\nbackend = "cpu"\n')
    for name in ("torch", "perf4sight.ir.from_torch", "perf4sight.ir.to_torch"):
        monkeypatch.setitem(sys.modules, name, None)  # ``import torch`` raises ImportError while the test runs
    for network in ("tiny_l0", "models/tiny_l0.json"):
        ran = cli_here(tmp_path, "--config", "config.toml", "--stage", "predict", "--network", network,
                       "--input-shape", "1", "16", "16")
        assert (ran.returncode, ran.stderr) == (2, "error: tiny_l0: takes 3-channel images (described at 3x16x16), "
                                                   "not 1-channel ones (1x16x16): another input shape can change "
                                                   "the height and width only\n")
    monkeypatch.undo()
    with pytest.raises(UserError, match=r"^tiny_l0: takes 3-channel images \(described at 3x16x16\), not 1-channel"):
        described_at(load_description(tmp_path / "models" / "tiny_l0.json"), [1, 16, 16])  # the rebuild's own line


def test_predict_refuses_a_zoo_network_at_another_channel_count_before_torch_loads(tmp_path, cli_here, monkeypatch):
    """A zoo name or its variant pruned on request at ``--input-shape 1 H W`` was refused by its first convolution
    once torch and torchvision had loaded and the fingerprint was read (~18 s under load; the variant's line named
    the zoo network, not the variant). torchvision's networks take RGB images: the line says so with torch out of
    reach, before the fingerprint is looked for (there is none), as a description file's does; ``describe_zoo``
    and ``build_zoo_model`` (the networks stage, the Python API) say it before torchvision loads too."""
    import sys

    from perf4sight.networks.zoo import build_zoo_model, describe_zoo

    (tmp_path / "config.toml").write_text('[devices.local]\nbackend = "cpu"\n')
    for name in ("torch", "torchvision", "perf4sight.ir.from_torch", "perf4sight.ir.to_torch"):
        monkeypatch.setitem(sys.modules, name, None)  # ``import torch`` raises ImportError while the test runs
    for network, shown in (("resnet18", "resnet18"), ("resnet18_l30", "resnet18_l30"),
                           ("lraspp_mobilenet_v3_large", "lraspp_mobilenet_v3_large")):
        ran = cli_here(tmp_path, "--config", "config.toml", "--stage", "predict", "--network", network,
                       "--input-shape", "1", "32", "32")
        assert (ran.returncode, ran.stderr) == (2, f"error: {shown}: takes 3-channel images (torchvision's "
                                                   f"{network.split('_l3')[0]}), not 1-channel ones (1x32x32): "
                                                   "another input shape can change the height and width only\n")
    for make in (lambda: describe_zoo("vit_b_16", [4, 224, 224], cache_dir=tmp_path),
                 lambda: build_zoo_model("vit_b_16", 10, [4, 224, 224])):
        with pytest.raises(UserError, match=r"^vit_b_16: takes 3-channel images \(torchvision's vit_b_16\), not "
                                            r"4-channel ones \(4x224x224\)"):
            make()
    assert not list(tmp_path.rglob("*.json"))  # nothing cached
