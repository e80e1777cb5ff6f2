"""Network description: torch -> description -> torch round trips, and the shared TX2 graphs."""
from __future__ import annotations

import copy
import json
import random
import re
import threading
import warnings
from typing import Any

import pytest
import torch
from torch import nn
from torch.nn import functional as F

from perf4sight.errors import UserError
from perf4sight.ir.from_torch import describe
from perf4sight.ir.schema import NetworkDescription, load_description, save_description
from perf4sight.ir.to_torch import build_module
from perf4sight.networks.zoo import build_zoo_model


def train_one_step(module: nn.Module, input_shape: list[int], num_classes: int, batch: int = 2) -> torch.Tensor:
    """One SGD step; returns the output of the forward pass."""
    module.train()
    opt = torch.optim.SGD(module.parameters(), lr=0.01, momentum=0.9)
    out = module(torch.randn(batch, *input_shape))
    loss = nn.functional.cross_entropy(out, torch.randint(0, num_classes, (batch,)))
    opt.zero_grad()
    loss.backward()
    before = [p.detach().clone() for p in module.parameters()]
    opt.step()
    assert any(not torch.equal(b, p) for b, p in zip(before, module.parameters())), "the step changed no weight"
    return out


@pytest.mark.parametrize("name", ["resnet18", "mobilenet_v2", "googlenet", "densenet121", "shufflenet_v2_x1_0",
                                  "efficientnet_b0", "regnet_y_400mf", "efficientnet_v2_s", "convnext_tiny",
                                  "vit_b_32"])
def test_zoo_round_trip_keeps_params_and_output_shape(name, tmp_path):
    shape = [3, 32, 32]
    original = build_zoo_model(name, num_classes=10, input_shape=shape)
    desc = describe(original, shape, name=name)
    path = save_description(desc, tmp_path / f"{name}.json")
    rebuilt = build_module(load_description(path))
    assert sum(p.numel() for p in rebuilt.parameters()) == sum(p.numel() for p in original.parameters()) == desc.params
    out = train_one_step(rebuilt, shape, 10)
    assert tuple(out.shape) == (2, 10)
    assert desc.node(desc.output).output_shape == [10]
    # and the rebuilt module describes back to the same layers (what rebuilding at another input shape relies on:
    # vit_b_32's class token and its select of that token read back too)
    again = describe(build_module(desc, device="meta"), shape, name=name)
    assert [(n.op, n.attrs, n.output_shape) for n in again.nodes] == [(n.op, n.attrs, n.output_shape)
                                                                       for n in desc.nodes]


def test_round_trip_computes_the_same_function():
    """Copying the original weights into the rebuilt module gives identical outputs."""
    original = nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.BatchNorm2d(8), nn.ReLU(), nn.MaxPool2d(2),
                             nn.Conv2d(8, 8, 3, groups=8, padding=1), nn.ReLU6(), nn.AdaptiveAvgPool2d(1),
                             nn.Flatten(), nn.Linear(8, 5)).eval()
    desc = describe(original, [3, 16, 16], name="tiny")
    rebuilt = build_module(desc).eval()
    for p_new, p_old in zip(rebuilt.state_dict().values(), original.state_dict().values()):
        p_new.copy_(p_old)
    x = torch.randn(3, 3, 16, 16)
    assert torch.allclose(rebuilt(x), original(x), atol=1e-6)


def test_functional_pooling_reads_as_the_pooling_modules():
    """``F.max_pool2d`` / ``F.avg_pool2d`` (inception_v3 pools so) describe as the modules of the same arguments do,
    and rebuild to the same function; a divisor the description cannot hold is one line naming the node."""
    import torch.nn.functional as F

    class Functional(nn.Module):
        def __init__(self, divisor=None):
            super().__init__()
            self.conv, self.divisor = nn.Conv2d(3, 4, 3), divisor

        def forward(self, x):
            x = F.max_pool2d(self.conv(x), 3, stride=2, padding=1, ceil_mode=True)
            return F.avg_pool2d(x, kernel_size=3, stride=1, padding=1, count_include_pad=False,
                                divisor_override=self.divisor)

    modules = nn.Sequential(nn.Conv2d(3, 4, 3), nn.MaxPool2d(3, stride=2, padding=1, ceil_mode=True),
                            nn.AvgPool2d(3, stride=1, padding=1, count_include_pad=False))
    functional = Functional().eval()
    read = describe(functional, [3, 15, 15], name="f")
    assert [(n.op, n.attrs) for n in read.nodes] == [(n.op, n.attrs) for n in describe(modules, [3, 15, 15],
                                                                                       name="m").nodes]
    rebuilt = build_module(read).eval()
    for p_new, p_old in zip(rebuilt.state_dict().values(), functional.state_dict().values()):
        p_new.copy_(p_old)
    x = torch.randn(2, 3, 15, 15)
    assert torch.allclose(rebuilt(x), functional(x), atol=1e-6)
    with pytest.raises(UserError, match="divisor_override=2 has no description op"):
        describe(Functional(divisor=2), [3, 15, 15], name="f")


def test_residual_concat_and_chunk_are_kept():
    class Block(nn.Module):
        def __init__(self):
            super().__init__()
            self.a = nn.Conv2d(4, 4, 1)
            self.b = nn.Conv2d(2, 2, 3, padding=1)

        def forward(self, x):
            y = self.a(x) + x
            left, right = y.chunk(2, dim=1)
            z = torch.cat([left, self.b(right)], dim=1)
            return z.view(z.size(0), -1)

    desc = describe(Block(), [4, 6, 6], name="block")
    ops = [n.op for n in desc.nodes]
    assert ops.count("add") == 1 and ops.count("cat") == 1 and ops.count("narrow") == 2 and "reshape" in ops
    narrows = [n for n in desc.nodes if n.op == "narrow"]
    assert [(n.attrs["start"], n.attrs["length"]) for n in narrows] == [(0, 2), (2, 2)]
    out = build_module(desc)(torch.randn(2, 4, 6, 6))
    assert tuple(out.shape) == (2, 4 * 6 * 6)


def _assert_same_function(desc: NetworkDescription, original: nn.Module, input_shape: list[int]) -> None:
    """The module rebuilt from ``desc``, given ``original``'s weights, computes what ``original`` computes."""
    rebuilt = build_module(desc).eval()
    for p_new, p_old in zip(rebuilt.parameters(), original.parameters()):
        p_new.data.copy_(p_old.data)
    x = torch.randn(2, *input_shape)
    assert torch.allclose(rebuilt(x), original(x), atol=1e-6)


def _small_convnext(layer_scale: float = 0.5) -> nn.Module:
    """torchvision's ConvNeXt, two narrow stages (stochastic depth on: it traces as identity in eval mode)."""
    from torchvision.models.convnext import CNBlockConfig, ConvNeXt
    return ConvNeXt([CNBlockConfig(16, 32, 2), CNBlockConfig(32, None, 1)], stochastic_depth_prob=0.1,
                    layer_scale=layer_scale, num_classes=10)


def test_convnext_computes_what_torchvisions_computes():
    """ConvNeXt's permutes, layer norms (the module, and LayerNorm2d's functional call on its own weight and bias)
    and layer scales (a parameter times the block's output) describe and rebuild to the same function, with the
    same parameters; the description's shapes are checked when it is read back."""
    from perf4sight.ir.to_torch import Scale

    torch.manual_seed(0)
    original = _small_convnext().eval()
    for name, p in original.named_parameters():
        if name.endswith("layer_scale"):
            p.data.uniform_(0.5, 1.5)  # not all alike: a scale applied to the wrong block shows
    desc = NetworkDescription.from_dict(json.loads(describe(original, [3, 32, 32], name="cnx").to_json()))
    ops = [n.op for n in desc.nodes]
    assert ops.count("scale") == 3 and ops.count("layernorm") == 3 + 2 + 1 and ops.count("permute") == 2 * 6
    assert desc.params == sum(p.numel() for p in original.parameters())
    rebuilt = build_module(desc).eval()
    scales = [m.weight for m in rebuilt.modules() if isinstance(m, Scale)]
    others = [p for p in rebuilt.parameters() if all(p is not s for s in scales)]
    originals = [p for n, p in original.named_parameters() if not n.endswith("layer_scale")]
    for new, old in zip(scales + others, [p for n, p in original.named_parameters() if n.endswith("layer_scale")]
                        + originals):
        assert new.shape == old.shape
        new.data.copy_(old.data)
    x = torch.randn(2, 3, 32, 32)
    assert torch.allclose(rebuilt(x), original(x), atol=1e-5)
    assert tuple(train_one_step(rebuilt, [3, 32, 32], 10).shape) == (2, 10)


def _copy_swin_parameters(original: nn.Module, rebuilt: nn.Module) -> None:
    """Copy a torchvision Swin's parameters into its rebuilt twin: attention by attention, and layer by layer of each
    other kind, in the order each model holds them (a V2 block's norm follows its attention in the rebuilt one,
    precedes it in torchvision's)."""
    from torchvision.models.swin_transformer import ShiftedWindowAttention

    from perf4sight.ir.to_torch import WindowAttention

    def units(model: nn.Module, attention: type) -> dict[str, list[list[nn.Parameter]]]:
        found: dict[str, list[list[nn.Parameter]]] = {}
        inside: list[str] = []
        for name, m in model.named_modules():
            if any(name.startswith(a + ".") for a in inside):
                continue
            if isinstance(m, attention):
                inside.append(name)
                found.setdefault("attention", []).append(list(m.parameters()))
            elif list(m.parameters(recurse=False)):
                found.setdefault(type(m).__name__, []).append(list(m.parameters(recurse=False)))
        return found

    old, new = units(original, ShiftedWindowAttention), units(rebuilt, WindowAttention)
    assert old.keys() == new.keys() and all(len(old[k]) == len(new[k]) for k in old)
    for kind in old:
        for olds, news in zip(old[kind], new[kind]):
            assert [p.shape for p in olds] == [p.shape for p in news], kind
            for o, n in zip(olds, news):
                n.data.copy_(o.data)


#: torchvision's Swin of each name, built once for the shapes it is tested at (2-3 s of weight init a build).
_SWINS: dict[str, nn.Module] = {}


def _swin(name: str) -> nn.Module:
    """A copy of the zoo's ``name`` (10 classes, randomly initialised) in eval mode, built once per test process."""
    if name not in _SWINS:
        _SWINS[name] = build_zoo_model(name, 10).eval()
    return copy.deepcopy(_SWINS[name])


@pytest.mark.parametrize("name, shape", [("swin_t", [3, 64, 64]), ("swin_t", [3, 72, 88]),
                                         ("swin_v2_t", [3, 64, 64]), ("swin_v2_t", [3, 72, 88])])
def test_swin_computes_what_torchvisions_computes(name, shape):
    """torchvision's Swin-T, V1 and V2 (shifted windows, a relative position bias from a table or an MLP, V2's
    cosine attention and norms after each branch, patch merging), describes and rebuilds, with torch alone, to the
    same function with the same parameters, also where a map is padded to whole windows (72x88) and where one window
    covers a whole map (no shift); the rebuilt network trains."""
    from perf4sight.ir.to_torch import WindowAttention

    torch.manual_seed(0)
    original = _swin(name)
    for key, p in original.named_parameters():
        if key.endswith("logit_scale"):  # not all alike: a scale applied to the wrong head shows
            p.data.uniform_(1.0, 5.0)
    desc = NetworkDescription.from_dict(json.loads(describe(original, shape, name=name).to_json()))
    ops = [n.op for n in desc.nodes]
    assert ops.count("window_attention") == 12 and ops.count("patch_merge") == 3
    attentions = [n.attrs for n in desc.nodes if n.op == "window_attention"]
    window = 8 if name == "swin_v2_t" else 7
    assert [a["shift_size"] for a in attentions][:2] == [[0, 0], [window // 2] * 2]
    assert all(a["window_size"] == [window, window] for a in attentions)
    assert all(a.get("cosine", False) == (name == "swin_v2_t") for a in attentions)
    assert all(a.get("position_bias_mlp", 0) == (512 if name == "swin_v2_t" else 0) for a in attentions)
    assert desc.params == sum(p.numel() for p in original.parameters())
    rebuilt = build_module(desc).eval()
    _copy_swin_parameters(original, rebuilt)
    if name == "swin_t":
        tables = [m.relative_position_bias_table for m in rebuilt.modules() if isinstance(m, WindowAttention)]
        assert len(tables) == 12 and all(t.abs().sum() > 0 for t in tables)  # the biases were copied too
    x = torch.randn(2, *shape)
    assert torch.equal(rebuilt(x), original(x))
    assert tuple(train_one_step(rebuilt, shape, 10).shape) == (2, 10)


def test_maxvit_computes_what_torchvisions_computes():
    """torchvision's MaxViT-T (MBConv blocks, then block and grid attention over 7x7 partitions of the map, each
    attention with a relative position bias table; the partitions as reshapes and permutes, the grid's axes swapped
    as a transpose) describes and rebuilds, with torch alone, to the same function with the same parameters, and
    the rebuilt network trains. MaxViT-T takes 224x224 images (or a multiple): its description and rebuilt
    parameters are checked at 224x224, and the function and the training step on a small MaxViT of the same class
    and partition size (two stages, 56x56 images: a 7x7 map in its last stage, as MaxViT-T has; seconds less)."""
    from torchvision.models.maxvit import MaxVit

    from perf4sight.ir.to_torch import GroupAttention

    def rebuilt_copy(original: nn.Module, shape: list[int], name: str) -> tuple[NetworkDescription, nn.Module]:
        desc = NetworkDescription.from_dict(json.loads(describe(original, shape, name=name).to_json()))
        rebuilt = build_module(desc).eval()
        for old, new in zip(original.parameters(), rebuilt.parameters()):
            assert old.shape == new.shape
            new.data.copy_(old.data)
        tables = [m.relative_position_bias_table for m in rebuilt.modules() if isinstance(m, GroupAttention)]
        assert tables and all(t.abs().sum() > 0 for t in tables)  # the biases were copied too
        return desc, rebuilt

    torch.manual_seed(0)
    original = build_zoo_model("maxvit_t", 10, [3, 224, 224]).eval()
    desc, rebuilt = rebuilt_copy(original, [3, 224, 224], "maxvit_t")
    attentions = [n for n in desc.nodes if n.op == "group_attention"]
    assert len(attentions) == 2 * (2 + 2 + 5 + 2) and all(n.attrs["window_size"] == [7, 7] for n in attentions)
    assert [n.attrs["num_heads"] for n in attentions][::2] == [2, 2, 4, 4] + [8] * 5 + [16, 16]
    assert attentions[0].output_shape == [64, 49, 64] and desc.params == sum(p.numel() for p in original.parameters())
    assert len([m for m in rebuilt.modules() if isinstance(m, GroupAttention)]) == 22
    # stem 16 channels, stages of 16 and 32 channels (2 and 4 heads of 8), 1 and 2 layers; stochastic depth on
    small = MaxVit((56, 56), 16, 7, [16, 32], [1, 2], 8, 0.2, num_classes=10).eval()
    desc, rebuilt = rebuilt_copy(small, [3, 56, 56], "small_maxvit")
    assert [n.attrs["num_heads"] for n in desc.nodes if n.op == "group_attention"] == [2, 2] + [4] * 4
    assert desc.params == sum(p.numel() for p in small.parameters())
    x = torch.randn(2, 3, 56, 56)
    with torch.no_grad():
        assert torch.equal(rebuilt(x), small(x))
    assert tuple(train_one_step(rebuilt, [3, 56, 56], 10).shape) == (2, 10)


def _train_per_pixel(module: nn.Module, shape: list[int], classes: int) -> torch.Tensor:
    """One SGD step of a segmentation network on a class per pixel; returns the forward's output."""
    module.train()
    opt = torch.optim.SGD(module.parameters(), lr=0.01, momentum=0.9)
    out = module(torch.randn(2, *shape))
    nn.functional.cross_entropy(out, torch.randint(0, classes, (2, *shape[1:]))).backward()
    before = [p.detach().clone() for p in module.parameters()]
    opt.step()
    assert any(not torch.equal(b, p) for b, p in zip(before, module.parameters())), "the step changed no weight"
    return out


@pytest.mark.parametrize("name, shape", [("fcn_resnet50", [3, 64, 64]), ("deeplabv3_mobilenet_v3_large", [3, 72, 88]),
                                         ("lraspp_mobilenet_v3_large", [3, 64, 64])])
def test_segmentation_networks_compute_what_torchvisions_compute(name, shape):
    """torchvision's segmentation networks (dilated backbones, ASPP's pooled branch resized back, LR-ASPP's gate,
    the scores resized to the input: bilinear interpolations; a dict output read by its 'out'), described and
    rebuilt with torch alone, compute the same function with the same parameters, and train on a class per pixel."""
    torch.manual_seed(0)
    original = build_zoo_model(name, 6).eval()
    desc = NetworkDescription.from_dict(json.loads(describe(original, shape, name=name).to_json()))
    resizes = [n.attrs for n in desc.nodes if n.op == "interpolate"]
    assert resizes[-1] == {"size": shape[1:], "mode": "bilinear", "size_of": "input"} \
        and desc.node(desc.output).output_shape == [6] + \
        shape[1:] and desc.num_classes == 6 and desc.label_shape == shape[1:]
    assert desc.params == sum(p.numel() for p in original.parameters())
    rebuilt = build_module(desc).eval()
    for old, new in zip(list(original.parameters()) + list(original.buffers()),
                        list(rebuilt.parameters()) + list(rebuilt.buffers())):
        assert old.shape == new.shape
        new.data.copy_(old.data)
    x = torch.randn(2, *shape)
    assert torch.equal(rebuilt(x), original(x)["out"])
    assert tuple(_train_per_pixel(rebuilt, shape, 6).shape) == (2, 6, *shape[1:])


class _Resizes(nn.Module):
    """Every way of resizing a map the description reads: nn.Upsample by a scale factor (nearest), by a size
    (bilinear, corners aligned), nn.UpsamplingBilinear2d, and F.interpolate by size and by a tuple of factors."""

    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(3, 4, 3, stride=2, padding=1)
        self.up = nn.Upsample(scale_factor=2)
        self.sized = nn.Upsample(size=(5, 7), mode="bilinear", align_corners=True)
        self.corners = nn.UpsamplingBilinear2d(scale_factor=2)

    def forward(self, x):
        y = self.corners(self.sized(self.up(self.conv(x))))
        y = nn.functional.interpolate(y, size=(6, 6), mode="bilinear")
        return nn.functional.interpolate(y, scale_factor=(2.0, 1.5), mode="nearest")


class _Resize(nn.Module):
    def __init__(self, **kwargs):
        super().__init__()
        self.conv, self.kwargs = nn.Conv2d(3, 4, 3), kwargs

    def forward(self, x):
        return nn.functional.interpolate(self.conv(x), **self.kwargs)


class _ResizeByShapes(nn.Module):
    """An upsampling by the ratio of two maps' widths: a scale factor the trace computes from the shapes."""

    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(3, 4, 3, stride=2, padding=1)

    def forward(self, x):
        y = self.conv(x)
        return nn.functional.interpolate(y, scale_factor=x.shape[-1] // y.shape[-1])


class _WithAux(nn.Module):
    def __init__(self, keys=("out", "aux")):
        super().__init__()
        self.conv, self.aux, self.keys = nn.Conv2d(3, 4, 3), nn.Conv2d(3, 4, 3), keys

    def forward(self, x):
        return dict(zip(self.keys, (self.conv(x), self.aux(x))))


def test_every_resize_reads_and_computes_as_torch_does():
    module = _Resizes().eval()
    desc = describe(module, [3, 8, 8], name="resizes")
    assert [n.attrs for n in desc.nodes if n.op == "interpolate"] == [
        {"size": [8, 8], "mode": "nearest", "scale_factor": [2, 2]},
        {"size": [5, 7], "mode": "bilinear", "align_corners": True},
        {"size": [10, 14], "mode": "bilinear", "scale_factor": [2, 2], "align_corners": True},
        {"size": [6, 6], "mode": "bilinear"}, {"size": [12, 9], "mode": "nearest"}]  # by 1.5: its size alone
    rebuilt = build_module(desc).eval()
    for old, new in zip(module.parameters(), rebuilt.parameters()):
        new.data.copy_(old.data)
    x = torch.randn(2, 3, 8, 8)
    assert torch.equal(rebuilt(x), module(x))


@pytest.mark.parametrize("kwargs, factor", [
    ({"scale_factor": 2, "recompute_scale_factor": True}, [2, 2]),
    ({"scale_factor": (3.0, 2.0), "mode": "bilinear"}, [3, 2]),
    ({"scale_factor": 2, "mode": "bilinear", "align_corners": True}, [2, 2]),
    ({"scale_factor": 0.5}, None), ({"scale_factor": 1.5, "recompute_scale_factor": True}, None)])
def test_a_whole_scale_factor_is_kept_and_another_is_read_as_the_size(kwargs, factor):
    """A resize by whole factors keeps them (recomputed or not: the same pixels), so the description rebuilt at
    another shape resizes as the module does there; one by 0.5 or 1.5 keeps today's size, which stays put."""
    from perf4sight.networks.reshape import described_at

    module = _Resize(**kwargs).eval()
    desc = describe(module, [3, 8, 8], name="r")
    assert desc.nodes[-1].attrs.get("scale_factor") == factor
    at = described_at(desc, [3, 13, 10])
    rebuilt = build_module(at).eval()
    rebuilt.load_state_dict(module.state_dict())
    x = torch.randn(2, 3, 13, 10)
    if factor:
        assert torch.equal(rebuilt(x), module(x)) and at.nodes[-1].attrs["size"] == [11 * factor[0], 8 * factor[1]]
    else:
        assert at.nodes[-1].attrs["size"] == desc.nodes[-1].attrs["size"] != list(module(x).shape[2:])


@pytest.mark.parametrize("module, expected", [
    (_Resize(scale_factor=1.25), r"an interpolation by scale factor 1.25 of a 6x6 map is no resize to a whole size"),
    (_ResizeByShapes(), r"an interpolation by a scale factor computed from the tensors' shapes has no description "
                        r"op; give size= \(a map's shape\[-2:\], say\)"),
    (_Resize(size=(9, 9), mode="bicubic"), r"an interpolation of mode 'bicubic' has no description op"),
    (_Resize(size=(9, 9), mode="bilinear", antialias=True), r"an antialiased interpolation has no description op"),
    (_WithAux(), r"the model returns a dict with \['aux', 'out'\]; a description follows one output, its 'out' "
                 r"\(build a torchvision segmentation network with aux_loss=False\)$"),
    (_WithAux(("logits", "features")), r"the model returns a dict with \['features', 'logits'\]; a description follows "
                                       r"one output, its 'out' \(return the logits alone\)$"),  # no torchvision hint
])
def test_resizes_and_outputs_the_description_cannot_hold_are_named(module, expected):
    with pytest.raises(UserError, match=expected) as exc:
        describe(module, [3, 8, 8], name="odd")
    assert "\n" not in str(exc.value)


def test_a_position_bias_computed_another_way_is_refused_naming_the_node():
    """A Swin V2 whose position-bias MLP has another activation: one line names the attention's bias node."""
    from torchvision.models import swin_v2_t
    model = swin_v2_t(num_classes=10)
    model.features[1][0].attn.cpb_mlp[1] = nn.GELU()
    with pytest.raises(UserError, match=r"v2: cannot describe node shifted_window_attention \(window attention's "
                                        r"position bias \(mul\) is neither a table nor Swin V2's MLP"):
        describe(model, [3, 32, 32], name="v2")


def test_a_vision_transformer_computes_what_torchvisions_computes():
    """ViT's patches (a convolution, a reshape and a permute), class token (a parameter expanded over the batch and
    put first), position embedding (a parameter added) and self-attention describe and rebuild to the same
    function with the same parameters."""
    from torchvision.models.vision_transformer import VisionTransformer

    torch.manual_seed(0)
    original = VisionTransformer(image_size=32, patch_size=8, num_layers=2, num_heads=2, hidden_dim=16, mlp_dim=32,
                                 num_classes=10).eval()
    with torch.no_grad():
        original.class_token.normal_()
        original.encoder.pos_embedding.normal_()
    desc = NetworkDescription.from_dict(json.loads(describe(original, [3, 32, 32], name="vit").to_json()))
    ops = [n.op for n in desc.nodes]
    assert (ops.count("token"), ops.count("shift"), ops.count("attention")) == (1, 1, 2)
    assert desc.node(next(n.name for n in desc.nodes if n.op == "token")).attrs == {"shape": [1, 16], "dim": 1}
    assert desc.params == sum(p.numel() for p in original.parameters())
    rebuilt = build_module(desc).eval()
    olds = [p for _, p in original.named_parameters()]
    olds = olds[1:3] + olds[:1] + olds[3:]  # the class token is the model's first parameter, the rebuilt's third
    for new, old in zip(rebuilt.parameters(), olds):
        assert new.numel() == old.numel()
        new.data.copy_(old.data.reshape(new.shape))  # the position embedding without its batch dimension of 1
    x = torch.randn(2, 3, 32, 32)
    assert torch.allclose(rebuilt(x), original(x), atol=1e-5)
    assert tuple(train_one_step(rebuilt, [3, 32, 32], 10).shape) == (2, 10)


class _CrossAttention(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv, self.attn = nn.Conv2d(3, 8, 2, 2), nn.MultiheadAttention(8, 2, batch_first=True)

    def forward(self, x):
        y = self.conv(x).flatten(2).transpose(1, 2)
        return self.attn(y, y * 2.0, y)[0].mean(1)


class _TokenLast(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv, self.token = nn.Conv2d(3, 8, 2, 2), nn.Parameter(torch.zeros(1, 1, 8))

    def forward(self, x):
        y = self.conv(x).flatten(2).transpose(1, 2)
        return torch.cat([y, self.token.expand(y.shape[0], -1, -1)], 1).mean(1)


class _BufferScaled(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(3, 4, 3)
        self.register_buffer("gain", torch.ones(4, 1, 1))

    def forward(self, x):
        return self.conv(x) * self.gain


class _BatchPermuted(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(3, 4, 3)

    def forward(self, x):
        return self.conv(x).permute(1, 0, 2, 3)


@pytest.mark.parametrize("module, expected", [
    (_BufferScaled(), r"mul \(node mul\) reads gain, a module tensor that is no parameter"),
    (_BatchPermuted(), r"a permute that moves the batch dimension \(\[1, 0, 2, 3\]\)"),
    (_CrossAttention(), r"attention \(node attn\) is described as self-attention only"),
    (_TokenLast(), r"cat \(node cat\) reads the module's parameter token directly"),
])
def test_module_tensors_and_permutes_the_description_cannot_hold_are_named(module, expected):
    with pytest.raises(UserError, match=expected) as exc:
        describe(module, [3, 8, 8], name="odd")
    assert "\n" not in str(exc.value)


#: a window attention over the [4, 3, 3] map of ``_conv_description`` read as [H, W, E]
_WINDOWS = {"embed_dim": 3, "num_heads": 1, "window_size": [2, 2], "shift_size": [0, 0], "bias": True}


@pytest.mark.parametrize("node, expected", [
    ({"op": "permute", "attrs": {"dims": [0, 1, 3]}, "output_shape": [4, 3, 3]}, r"dims \[0, 1, 3\] are not an order"),
    ({"op": "permute", "attrs": {"dims": [1, 0, 2, 3]}, "output_shape": [4, 3, 3]}, r"with the batch first"),
    ({"op": "permute", "attrs": {"dims": [0, 2, 3, 1]}, "output_shape": [4, 3, 3]},
     r"output_shape \[4, 3, 3\], but its input \[4, 3, 3\] gives \[3, 3, 4\]"),
    ({"op": "layernorm", "attrs": {"normalized_shape": [4]}, "output_shape": [4, 3, 3]},
     r"normalized_shape \[4\] is not the last dimensions of its input \[4, 3, 3\]"),
    ({"op": "layernorm", "attrs": {"normalized_shape": 6}, "output_shape": [4, 3, 3]},
     r"'normalized_shape' must be a non-empty list of positive integers"),
    ({"op": "scale", "attrs": {"shape": [6, 1, 1]}, "output_shape": [4, 3, 3]},
     r"a scale of shape \[6, 1, 1\] does not broadcast onto its input \[4, 3, 3\]"),
    ({"op": "shift", "attrs": {"shape": [4, 2, 3]}, "output_shape": [4, 3, 3]},
     r"a shift of shape \[4, 2, 3\] does not broadcast onto its input \[4, 3, 3\]"),
    ({"op": "token", "attrs": {"shape": [2, 3, 4], "dim": 1}, "output_shape": [6, 3, 3]},
     r"a token of shape \[2, 3, 4\] cannot go before its input \[4, 3, 3\] along dim 1"),
    ({"op": "attention", "attrs": {"embed_dim": 3, "num_heads": 1, "bias": True}, "output_shape": [4, 3, 3]},
     r"embed_dim 3 needs a \[tokens, 3\] input, got \[4, 3, 3\]"),
    ({"op": "attention", "attrs": {"embed_dim": 3, "num_heads": 2, "bias": True}, "output_shape": [4, 3, 3]},
     r"num_heads 2 does not divide embed_dim 3"),
    ({"op": "window_attention", "attrs": {**_WINDOWS, "cosine": "yes"}, "output_shape": [4, 3, 3]},
     r"attr 'cosine' must be true or false, got 'yes'"),
    ({"op": "window_attention", "attrs": {**_WINDOWS, "position_bias_mlp": -1}, "output_shape": [4, 3, 3]},
     r"attr 'position_bias_mlp' must be an integer >= 0 \(0: a table\), got -1"),
    ({"op": "group_attention", "attrs": {"embed_dim": 3, "num_heads": 1, "window_size": [2, 2], "bias": True},
      "output_shape": [4, 3, 3]}, r"embed_dim 3 in 2x2 windows needs a \[groups, 4, 3\] input, got \[4, 3, 3\]"),
    ({"op": "interpolate", "attrs": {"size": [6, 6], "mode": "bicubic"}, "output_shape": [4, 6, 6]},
     r"attr 'mode' must be one of nearest, bilinear, got 'bicubic'"),
    ({"op": "interpolate", "attrs": {"size": [6, 6], "mode": "nearest", "align_corners": True},
      "output_shape": [4, 6, 6]}, r"attr 'align_corners' is for mode 'bilinear' only"),
    ({"op": "interpolate", "attrs": {"size": 6, "mode": "nearest"}, "output_shape": [4, 6, 6]},
     r"attr 'size' must be a non-empty list of positive integers, got 6"),
    ({"op": "interpolate", "attrs": {"size": [6, 6], "mode": "nearest"}, "output_shape": [6, 6, 6]},
     r"output_shape \[6, 6, 6\], but its input \[4, 3, 3\] gives \[4, 6, 6\]"),
    ({"op": "interpolate", "attrs": {"size": [6, 6], "mode": "nearest", "scale_factor": [2, 3]},
      "output_shape": [4, 6, 6]}, r"size \[6, 6\] is not its input's 3x3 times scale_factor \[2, 3\] \(\[6, 9\]\)"),
    ({"op": "interpolate", "attrs": {"size": [6, 6], "mode": "nearest", "scale_factor": 1.5},
      "output_shape": [4, 6, 6]}, r"attr 'scale_factor' must be an integer or an \[h, w\] pair of integers >= 1, "
                                  r"got 1.5"),
    ({"op": "interpolate", "attrs": {"size": [6, 6], "mode": "nearest", "scale_factor": [2, 0]},
      "output_shape": [4, 6, 6]}, r"attr 'scale_factor' must be .*, got \[2, 0\]"),
])
def test_permute_layer_norm_and_scale_shapes_are_checked(node, expected):
    d = _conv_description()
    d["nodes"].append({"name": "odd", "inputs": [d["nodes"][1]["name"]], **node})
    d["output"] = "odd"
    with pytest.raises(UserError, match=expected):
        NetworkDescription.from_dict(d, where="conv.json")
    if node["op"] == "attention":  # on a [tokens, width] view of the map
        d["nodes"].insert(-1, {"name": "tokens", "op": "reshape", "inputs": [d["nodes"][1]["name"]],
                               "attrs": {"shape": [4, 9]}, "output_shape": [4, 9]})
        d["nodes"][-1]["inputs"] = ["tokens"]
    good = {"permute": ({"dims": [0, 2, 3, 1]}, [3, 3, 4], 0), "layernorm": ({"normalized_shape": [3]}, [4, 3, 3], 6),
            "scale": ({"shape": [4, 1, 1]}, [4, 3, 3], 4), "shift": ({"shape": [3, 3]}, [4, 3, 3], 9),
            "token": ({"shape": [2, 3, 3], "dim": 1}, [6, 3, 3], 18),
            "attention": ({"embed_dim": 9, "num_heads": 3, "bias": True}, [4, 9], 4 * 81 + 4 * 9),
            # Swin V2's: the projections, an MLP 2 -> 4 -> 1 head for the biases, one scale
            "window_attention": ({**_WINDOWS, "cosine": True, "position_bias_mlp": 4}, [4, 3, 3],
                                 4 * 9 + 4 * 3 + 3 * 4 + 4 + 1),
            "interpolate": ({"size": [6, 6], "mode": "bilinear", "scale_factor": 2, "align_corners": True}, [4, 6, 6],
                            0),
            # MaxViT's: the projections and a bias per relative position in 1x3 windows (1 x 5 of them)
            "group_attention": ({"embed_dim": 3, "num_heads": 1, "window_size": [1, 3], "bias": True}, [4, 3, 3],
                                4 * 9 + 4 * 3 + 5)}[node["op"]]
    d["nodes"][-1].update(attrs=good[0], output_shape=good[1])
    d.pop("params")  # counted from the nodes
    assert NetworkDescription.from_dict(d).params == 4 * 3 * 3 * 3 + 4 + good[2]


class _ResizedToInput(nn.Module):
    """A convolution's map resized to a size ``size_of(x)`` computes from the input ``x``."""

    def __init__(self, size_of):
        super().__init__()
        self.conv, self.size_of = nn.Conv2d(3, 4, 3, stride=2), size_of

    def forward(self, x):
        return nn.functional.interpolate(self.conv(x), size=self.size_of(x), mode="nearest")


@pytest.mark.parametrize("size_of, named", [
    (lambda x: x.shape[-2:], True), (lambda x: x.size()[2:], True), (lambda x: x.shape[2:4], True),
    (lambda x: (x.shape[2], x.shape[3]), True), (lambda x: [x.size(2), x.size(-1)], True),
    (lambda x: (x.size()[-2], x.shape[-1]), True),
    (lambda x: (x.shape[3], x.shape[2]), False),  # height and width swapped
    (lambda x: (x.shape[2] * 2, x.shape[3] * 2), False), (lambda x: x.shape[1:3], False),
    (lambda x: (x.shape[2], x.shape[3] + 0 * x.shape[1]), False)])
def test_a_resize_names_the_map_whose_height_and_width_it_reads(size_of, named):
    """A size read as a map's height and width, however written, names that map (size_of); a size of other
    arithmetic on sizes (swapped, doubled, other dimensions) is the traced size alone."""
    desc = describe(_ResizedToInput(size_of), [3, 9, 9], name="resize")
    assert desc.nodes[-1].attrs.get("size_of") == ("input" if named else None)


_TRANSPOSED = {"in_channels": 4, "out_channels": 4, "kernel_size": [3, 3], "stride": [2, 2], "padding": [1, 1],
               "dilation": [1, 1], "groups": 1, "bias": False}


@pytest.mark.parametrize("op, attrs, output_shape, expected", [
    ("interpolate", {"size": [5, 5], "mode": "nearest", "size_of": "input"}, [4, 5, 5], None),
    ("pad", {"pads": [1, 1, 1, 1], "mode": "constant", "pad_to": "input"}, [4, 5, 5], None),
    ("interpolate", {"size": [6, 6], "mode": "nearest", "size_of": "input"}, [4, 6, 6],
     r"size \[6, 6\] is not the 5x5 of 'input' \(size_of\)"),
    ("interpolate", {"size": [5, 5], "mode": "nearest", "size_of": "nowhere"}, [4, 5, 5],
     r"attr 'size_of' must name an earlier node, got 'nowhere'"),
    ("interpolate", {"size": [5, 5], "mode": "nearest", "size_of": 3}, [4, 5, 5],
     r"attr 'size_of' must name an earlier node, got 3"),
    ("interpolate", {"size": [6, 6], "mode": "nearest", "size_of": "input", "scale_factor": 2}, [4, 6, 6],
     r"attrs 'scale_factor' and 'size_of' exclude each other"),
    ("interpolate", {"size": [5, 5], "mode": "nearest", "pad_to": "input"}, [4, 5, 5], r"unknown attr 'pad_to'"),
    ("pad", {"pads": [2, 0, 2, 0], "mode": "constant", "pad_to": "input"}, [4, 5, 5],
     r"pads \[2, 0, 2, 0\] do not bring its 3x3 input to the 5x5 of 'input' \(pad_to: \[1, 1, 1, 1\], the odd "
     r"pixel after\)"),
    ("pad", {"pads": [0, 0, 0, 0], "mode": "constant", "pad_to": "flat"}, [4, 3, 3],
     r"pad_to names 'flat' of shape \[36\]: it sizes a \[channels, height, width\] map by another"),
    ("conv_transpose2d", {**_TRANSPOSED, "output_padding": [0, 0], "output_size_of": "input"}, [4, 5, 5], None),
    ("conv_transpose2d", {**_TRANSPOSED, "output_padding": [1, 1], "output_size_of": "input"}, [4, 6, 6],
     r"its output's 6x6 is not the 5x5 of 'input' \(output_size_of\)"),
])
def test_a_size_read_off_another_node_is_checked(op, attrs, output_shape, expected):
    """A resize's ``size_of``, a pad's ``pad_to`` and a transposed convolution's ``output_size_of`` name an earlier
    [C, H, W] node whose height and width the node's literal size (its pads, split as a U-Net's: the odd pixel after;
    its output) give; anything else is refused by name."""
    d = _conv_description()
    conv = d["nodes"][1]["name"]
    d["nodes"][2]["name"] = "flat"
    d["nodes"].append({"name": "sized", "op": op, "inputs": [conv], "attrs": attrs, "output_shape": output_shape})
    d["output"] = "sized"
    d.pop("params")  # counted from the nodes
    if expected is None:
        assert NetworkDescription.from_dict(d).node("sized").attrs == attrs
        return
    with pytest.raises(UserError, match=rf"conv.json: node 'sized' \({op}\): {expected}"):
        NetworkDescription.from_dict(d, where="conv.json")


def test_tensor_indexing_becomes_select_and_narrow():
    """``x[:, :, 0]`` is a select and ``x[:, 2:6]`` a narrow, computing what the module computes;
    indexing the batch or two dimensions at once is a clear error."""
    class Indexed(nn.Module):
        def __init__(self):
            super().__init__()
            self.conv = nn.Conv2d(3, 8, 3, padding=1)

        def forward(self, x):
            y = self.conv(x)
            return torch.cat([y[:, 2:6].mean(3), y[:, :, 0]], 1)

    original = Indexed().eval()
    desc = describe(original, [3, 5, 5], name="indexed")
    picked = {n.op: n.attrs for n in desc.nodes if n.op in ("select", "narrow")}
    assert picked == {"narrow": {"dim": 1, "start": 2, "length": 4}, "select": {"dim": 2, "index": 0}}
    _assert_same_function(desc, original, [3, 5, 5])

    class Batchwise(nn.Module):
        def forward(self, x):
            return x[0:1, :, 0]

    with pytest.raises(UserError, match="getitem"):
        describe(Batchwise(), [3, 4, 4], name="batchwise")


def test_a_chunk_taken_whole_computes_what_the_module_computes():
    """``torch.cat(x.chunk(2, 1)[::-1]...)``-style use of a chunk's tuple without indexing it: the cat had no
    inputs (and predicting raised torch's own error deep inside); each piece is a narrow node now."""
    class Swap(nn.Module):
        def __init__(self):
            super().__init__()
            self.conv = nn.Conv2d(3, 8, 3, padding=1)

        def forward(self, x):
            y = torch.cat(self.conv(x).chunk(2, 1), 1)  # the tuple, whole
            a, b = y.chunk(2, 1)                        # the tuple, indexed
            return torch.cat([b, a], 1).mean((2, 3))

    original = Swap().eval()
    desc = NetworkDescription.from_dict(describe(original, [3, 5, 5], name="swap").to_dict())
    assert [len(n.inputs) for n in desc.nodes if n.op == "cat"] == [2, 2]
    _assert_same_function(desc, original, [3, 5, 5])


class _Recurrent(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv, self.lstm, self.fc = nn.Conv2d(3, 8, 3), nn.LSTM(8, 16, batch_first=True), nn.Linear(16, 10)

    def forward(self, x):
        out, _ = self.lstm(self.conv(x).flatten(2).transpose(1, 2))
        return self.fc(out[:, -1])


class _Attention(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv, self.attn = nn.Conv2d(3, 16, 3), nn.MultiheadAttention(16, 2, batch_first=True, add_bias_kv=True)

    def forward(self, x):
        y = self.conv(x).flatten(2).transpose(1, 2)
        return self.attn(y, y, y)[0].mean(1)


class _MeanOfAll(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(3, 4, 3)

    def forward(self, x):
        return self.conv(x).mean()


@pytest.mark.parametrize("module, expected", [
    (_Recurrent(), "rnn: module 'lstm' of type LSTM has no description op"),  # was dropped: its tuple was read
    (_Attention(), r"rnn: cannot describe node attn \(ValueError: multi-head attention is described batch first, "
                   "with .* no added key/value bias"),  # its tuple was read as a chunk's
    (_MeanOfAll(), r"rnn: cannot describe node mean \(ValueError: a mean over every dimension"),  # a TypeError
    ("resnet18", "rnn: expected a torch nn.Module instance .* got str"),  # an AttributeError
])
def test_what_the_schema_cannot_express_is_one_line_naming_it(module, expected):
    with pytest.raises(UserError, match=expected) as exc:
        describe(module, [3, 8, 8], name="rnn")
    assert "\n" not in str(exc.value)


def test_a_name_or_network_that_is_no_str_is_refused_in_one_line():
    """describe(name=5) wrote 5 into the description (its name and network); a name or network that is no str is
    refused, as predict_module's."""
    conv = nn.Sequential(nn.Conv2d(3, 4, 3))
    with pytest.raises(UserError, match=r"^describe: name 5 \(int\) is not a str$"):
        describe(conv, [3, 8, 8], name=5)
    with pytest.raises(UserError, match=r"^describe: network \['a'\] \(list\) is not a str$"):
        describe(conv, [3, 8, 8], name="conv", network=["a"])


def test_untraceable_module_gives_a_clear_error():
    class Branchy(nn.Module):
        def forward(self, x):
            return x if x.sum() > 0 else -x

    with pytest.raises(UserError, match="cannot trace"):
        describe(Branchy(), [3, 8, 8], name="branchy")


def test_malformed_descriptions_are_rejected(tmp_path):
    good = describe(nn.Sequential(nn.Flatten(), nn.Linear(12, 3)), [3, 2, 2], name="lin").to_dict()
    bad_op = json.loads(json.dumps(good))
    bad_op["nodes"][1]["op"] = "warp_drive"
    with pytest.raises(UserError, match="unknown op 'warp_drive'"):
        NetworkDescription.from_dict(bad_op)
    bad_op = json.loads(json.dumps(good))
    bad_op["nodes"][2]["op"] = "lnear"  # a typo, or another case: the closest ops first
    with pytest.raises(UserError, match=r"unknown op 'lnear' \(did you mean 'linear'\?\) \(known: abs, "):
        NetworkDescription.from_dict(bad_op)
    bad_op["nodes"][2]["op"] = "Linear"
    with pytest.raises(UserError, match=r"unknown op 'Linear' \(did you mean 'linear'"):
        NetworkDescription.from_dict(bad_op)
    bad_edge = json.loads(json.dumps(good))
    bad_edge["nodes"][1]["inputs"] = ["nowhere"]  # a node renamed without its readers: no node is named so
    with pytest.raises(UserError, match=r"node '\S+' uses \['nowhere'\], which no node is named$"):
        NetworkDescription.from_dict(bad_edge)
    later = json.loads(json.dumps(good))
    later["nodes"][1]["inputs"] = [later["nodes"][2]["name"]]  # named, but only further down
    with pytest.raises(UserError, match="before they are defined"):
        NetworkDescription.from_dict(later)
    with_bom = tmp_path / "bom.json"  # as Windows' Notepad saves it: a measurement CSV with one was read
    with_bom.write_bytes(b"\xef\xbb\xbf" + json.dumps(good).encode())
    assert load_description(with_bom).to_dict() == NetworkDescription.from_dict(good).to_dict()
    with pytest.raises(UserError, match="not found"):
        load_description(tmp_path / "missing.json")


def _conv_description() -> dict:
    return describe(nn.Sequential(nn.Conv2d(3, 4, 3), nn.Flatten()), [3, 5, 5], name="conv").to_dict()


@pytest.mark.parametrize("change, expected", [
    (lambda d: d.update(input_shape="3x64x64"), r"input_shape must be \[channels, height, width\]"),
    (lambda d: d["nodes"][1].pop("output_shape"), r"node #1 is malformed \(no output_shape\)"),
    (lambda d: d["nodes"][1].update(output_shape=[4, "x", 3]), r"output_shape must be a list of non-negative"),
    (lambda d: d["nodes"][1]["attrs"].update(out_channels=-3), r"'out_channels' must be a positive integer, got -3"),
    (lambda d: d["nodes"][1]["attrs"].update(kernel_size="7x7"),
     r"'kernel_size' must be an integer or an \[h, w\] pair"),
    (lambda d: d["nodes"][1]["attrs"].update(groups=2), r"groups 2 does not divide the channels"),
    # an attribute the op cannot carry was read past: a misspelt flag left the layer as it was, unsaid
    (lambda d: d["nodes"][1]["attrs"].update(padding_mode="reflect"),
     r"\(conv2d\): unknown attr 'padding_mode' \(known: in_channels, out_channels, kernel_size, stride, padding, "
     r"dilation, groups, bias, fixed, standardize_unbiased, standardize_eps, standardize_scale, spectral_norm_eps, "
     r"standardize, "
     r"weight_norm, spectral_norm, spectral_norm_iterations, shares\)$"),
    (lambda d: d.update(schema_version=2), r"schema_version 2 is not one this perf4sight reads \(1 to 1;"),
    (lambda d: d.update(output=[d["output"]]), r"output must be the name of a node, got \['"),
    (lambda d: d["nodes"][1].update(inputs=[]), r"node '.*' \(conv2d\) has no inputs"),
    (lambda d: d["nodes"][1].update(inputs="x"), r"'inputs' must be a list"),
    # a node key misspelt was read past: "atrs" of a layer whose attrs are all optional lost them, unsaid
    (lambda d: d["nodes"][2].update(atrs=d["nodes"][2].pop("attrs")),
     r"node #2 is malformed \(unknown key 'atrs' \(a node has name, op, inputs, attrs, output_shape\)\)"),
    # numbers that do not fit together: refused when read, never predicted
    (lambda d: d["nodes"][1]["attrs"].update(in_channels=5), r"in_channels 5 but its input has 3 channels"),
    (lambda d: d["nodes"][1].update(output_shape=[4, 5, 5]),
     r"output_shape \[4, 5, 5\], but its input \[3, 5, 5\] gives \[4, 3, 3\]"),
    (lambda d: d["nodes"][1]["attrs"].update(kernel_size=[7, 7]), r"kernel \[7, 7\] .* does not fit its 5x5 input"),
    (lambda d: d["nodes"][2].update(output_shape=[35]), r"output_shape \[35\], but its input \[4, 3, 3\] gives \[36\]"),
    (lambda d: d["nodes"][2].update(op="reshape", attrs={"shape": [35]}, output_shape=[35]),
     r"changes the element count"),
    # a reshape's attr shape is what the module reshapes to: one other than its output_shape built another network
    (lambda d: d["nodes"][2].update(op="reshape", attrs={"shape": [6, 6]}, output_shape=[36]),
     r"\(reshape\): reshapes to shape \[6, 6\], not to its output_shape \[36\]"),
    # an integer attr written as a string, a float or a flag loaded, then failed in torch when the module ran
    (lambda d: d["nodes"][2]["attrs"].update(start_dim="1"),
     r"\(flatten\): attr 'start_dim' must be an integer, got '1'"),
    (lambda d: d["nodes"][2].update(op="reshape", attrs={"shape": [36.0]}),
     r"\(reshape\): attr 'shape' must be a list of integers, got \[36.0\]"),
    (lambda d: d["nodes"][2].update(op="unsqueeze", attrs={"dim": True}, output_shape=[1, 4, 3, 3]),
     r"\(unsqueeze\): attr 'dim' must be an integer, got True"),
    (lambda d: d["nodes"][2].update(op="mean", attrs={"dims": ["2"], "keepdim": False}, output_shape=[4, 3]),
     r"\(mean\): attr 'dims' must be a list of integers, got \['2'\]"),
    (lambda d: d["nodes"][2].update(inputs=[d["nodes"][1]["name"]] * 2), r"takes 1 input, got 2"),
    # pools torch refuses when they run (a padding over half the kernel, a dilation of 0) and an adaptive pool's size
    # that it cannot take (a float, a flag, 0) loaded, to fail on the device
    (lambda d: d["nodes"][2].update(op="maxpool2d", attrs={"kernel_size": 2, "stride": 1, "padding": 2,
                                                           "ceil_mode": False}, output_shape=[4, 6, 6]),
     r"\(maxpool2d\): padding \[2, 2\] is more than half its kernel \[2, 2\]"),
    (lambda d: d["nodes"][2].update(op="avgpool2d", attrs={"kernel_size": 1, "stride": 1, "padding": 1,
                                                           "ceil_mode": False, "count_include_pad": True},
                                    output_shape=[4, 5, 5]),
     r"\(avgpool2d\): padding \[1, 1\] is more than half its kernel \[1, 1\]"),
    (lambda d: d["nodes"][2].update(op="maxpool2d", attrs={"kernel_size": 2, "stride": 1, "padding": 0,
                                                           "ceil_mode": False, "dilation": 0}, output_shape=[4, 2, 2]),
     r"\(maxpool2d\): attr 'dilation' must be an integer or an \[h, w\] pair of integers >= 1, got 0"),
    (lambda d: d["nodes"][2].update(op="adaptiveavgpool2d", attrs={"output_size": 1.0}, output_shape=[4, 1, 1]),
     r"\(adaptiveavgpool2d\): attr 'output_size' must be an integer or an \[h, w\] pair"),
    (lambda d: d["nodes"][2].update(op="adaptivemaxpool2d", attrs={"output_size": [0, 0]}, output_shape=[4, 0, 0]),
     r"\(adaptivemaxpool2d\): attr 'output_size' must be an integer or an \[h, w\] pair"),
    # an add of two tensors and a scalar was rebuilt as the first plus the scalar, the second input dropped
    (lambda d: d["nodes"][2].update(op="add", inputs=[d["nodes"][1]["name"]] * 2, attrs={"scalar": 1.0},
                                    output_shape=[4, 3, 3]),
     r"\(add\): takes two inputs or one and a 'scalar' attr, not both"),
    (lambda d: d["nodes"][2].update(name=d["nodes"][1]["name"]), r"two nodes are named"),
    (lambda d: d["nodes"][0].update(output_shape=[3, 6, 6]), r"the one 'input' node comes first"),
    (lambda d: d.update(name="../../outside"), r"name '../../outside' must be usable as a file name"),
    (lambda d: d.update(num_classes="ten"), r"num_classes must be an integer >= 1, got 'ten'"),
    (lambda d: d["nodes"][1]["attrs"].update(bias="no"), r"\(conv2d\): attr 'bias' must be true or false, got 'no'"),
    (lambda d: d.update(params=50_000_000),
     r"params 50000000 is not the 112 trainable parameters its nodes hold \(leave params out"),
])
def test_bad_node_fields_are_named(change, expected):
    """What used to fail deep inside a stage with an IndexError or ValueError, or pass silently (a node
    without output_shape, negative channels), is one error naming the node and the field."""
    d = _conv_description()
    NetworkDescription.from_dict(json.loads(json.dumps(d)))   # the unchanged one loads
    change(d)
    with pytest.raises(UserError, match=expected) as info:
        NetworkDescription.from_dict(d, where="conv.json")
    assert str(info.value).startswith("conv.json: ") and "\n" not in str(info.value)


@pytest.mark.parametrize("op, attrs, expected", [
    ("mul", {"scalar": "x"}, r"\(mul\): attr 'scalar' must be a number, got 'x'"),
    ("add", {"scalar": None}, r"\(add\): attr 'scalar' must be a number, got None"),
    ("dropout", {"p": 1.5}, r"\(dropout\): attr 'p' must be a number in \[0, 1\], got 1.5"),
    ("relu", {"inplace": "yes"}, r"\(relu\): attr 'inplace' must be true or false, got 'yes'"),
    ("batchnorm2d", {"num_features": 4, "eps": -1}, r"\(batchnorm2d\): attr 'eps' must be a number >= 0, got -1"),
])
def test_flags_and_numbers_of_a_node_are_checked_when_read(op, attrs, expected):
    """A flag written as a string (``"bias": "no"`` read as true) or a scalar that is no number (which failed only
    when the module was built, naming no node) is refused when the description is read, naming the node."""
    d = _conv_description()
    conv = d["nodes"][1]
    d["nodes"].insert(2, {"name": "odd", "op": op, "inputs": [conv["name"]], "attrs": attrs,
                          "output_shape": conv["output_shape"]})
    d["nodes"][3]["inputs"] = ["odd"]
    with pytest.raises(UserError, match=expected):
        NetworkDescription.from_dict(d, where="conv.json")
    d["nodes"][2]["attrs"], own = {"mul": ({"scalar": 0.5}, 0), "add": ({"scalar": 1}, 0), "dropout": ({"p": 0.0}, 0),
                                   "relu": ({"inplace": True}, 0),  # torch takes eps 0 (from_torch writes it so)
                                   "batchnorm2d": ({"num_features": 4, "eps": 0, "momentum": None}, 8)}[op]
    d.pop("params")
    assert NetworkDescription.from_dict(d).params == 112 + own


@pytest.mark.parametrize("op, attrs", [("add", {}), ("maximum", {}), ("where", {"compare": "gt", "threshold": 0})])
def test_tensors_of_different_ranks_are_not_combined(op, attrs):
    """A ``[4, 8, 8]`` map plus its ``[8, 8]`` mean over the channels broadcast per sample, so it loaded; but both
    carry the batch, and torch lines the smaller's batch up with the map's channels: the rebuilt module failed at a
    batch of 2 (and broadcast the batch into the channels at 1)."""
    d = {"name": "ranks", "input_shape": [4, 8, 8], "output": "y", "nodes": [
        {"name": "input", "op": "input", "inputs": [], "attrs": {}, "output_shape": [4, 8, 8]},
        {"name": "m", "op": "mean", "inputs": ["input"], "attrs": {"dims": [1], "keepdim": False},
         "output_shape": [8, 8]},
        {"name": "y", "op": op, "inputs": ["input", "m"] + (["input"] if op == "where" else []), "attrs": attrs,
         "output_shape": [4, 8, 8]}]}
    with pytest.raises(UserError, match=rf"ranks.json: node 'y' \({op}\): combines inputs of shapes .* of different "
                                        r"ranks"):
        NetworkDescription.from_dict(d, where="ranks.json")
    d["nodes"][1]["attrs"]["keepdim"], d["nodes"][1]["output_shape"] = True, [1, 8, 8]  # the same ranks: it loads
    assert build_module(NetworkDescription.from_dict(d))(torch.zeros(2, 4, 8, 8)).shape == (2, 4, 8, 8)


def test_a_rebuilt_gelu_reflection_pad_and_variance_run_under_the_calls_of_a_tx2s_torch(monkeypatch):
    """A TX2's torch 1.10: ``nn.GELU`` takes no ``approximate`` (from 1.12), ``F.pad`` asserts ``value == 0`` outside
    mode constant (None failed it; torch 2 takes None), ``torch.var``'s ``correction`` is an integer (a Scalar from
    2.1). Those calls, stood in for here, failed every rebuilt network with a GELU, a reflection or replication pad
    or a variance on the device."""
    class Gelu110(nn.GELU):
        def __init__(self) -> None:  # 1.10's signature: no arguments
            super().__init__()

    pad, var = F.pad, torch.var

    def pad110(x: torch.Tensor, pads: Any, mode: str = "constant", value: float = 0.0) -> torch.Tensor:
        assert mode == "constant" or value == 0, f'Padding mode "{mode}"" doesn\'t take in value argument'
        return pad(x, pads, mode, value if mode == "constant" else None)

    def var110(x: torch.Tensor, dim: Any, *, correction: Any, keepdim: bool = False) -> torch.Tensor:
        if not isinstance(correction, int):
            raise TypeError(f"var(): argument 'correction' must be int, not {type(correction).__name__}")
        return var(x, dim, correction=correction, keepdim=keepdim)

    class Net(nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            y = F.pad(F.gelu(x), [1, 1, 1, 1], mode="reflect")
            return F.pad(y, [0, 1, 0, 1], mode="replicate") * x.var(1, keepdim=True, unbiased=False).mean((2, 3), True)

    desc = describe(Net(), [2, 4, 4], name="tx2_calls")
    assert {"gelu", "pad", "var"} <= {n.op for n in desc.nodes}
    monkeypatch.setattr(nn, "GELU", Gelu110)
    monkeypatch.setattr(F, "pad", pad110)
    monkeypatch.setattr(torch, "var", var110)
    assert build_module(desc)(torch.randn(2, 2, 4, 4)).shape == (2, 2, 7, 7)


def test_nodes_named_as_python_keywords_or_module_attributes_rebuild():
    """A node named ``forward``, ``to``, ``training`` or ``graph`` (an attribute the rebuilt GraphModule has) or
    ``class`` (a keyword: ``self.class(x)`` is no code) loaded and failed to build or run (add_module's KeyError, a
    SyntaxError, 'str' object is not callable); the layer now takes another attribute name."""
    names = ["class", "forward", "to", "training", "graph"]
    conv = {"in_channels": 2, "out_channels": 2, "kernel_size": 1, "stride": 1, "padding": 0, "dilation": 1,
            "groups": 1, "bias": False}
    d = {"name": "names", "input_shape": [2, 3, 3], "output": names[-1], "nodes": [
        {"name": "def", "op": "input", "inputs": [], "attrs": {}, "output_shape": [2, 3, 3]}] + [
        {"name": n, "op": "conv2d", "inputs": [p], "attrs": conv, "output_shape": [2, 3, 3]}
        for p, n in zip(["def"] + names, names)]}
    module = build_module(NetworkDescription.from_dict(d))
    assert module(torch.ones(1, 2, 3, 3)).shape == (1, 2, 3, 3) and len(list(module.parameters())) == 5
    assert module.eval().training is False


def test_an_adaptive_pool_of_a_null_side_keeps_the_input_size_there_when_rebuilt():
    """An ``output_size`` of ``[2, null]`` (torch's None: the input's width) loaded, then failed when rebuilt
    (``int(None)``); the module now pools to it."""
    d = _conv_description()
    d["nodes"][2].update(op="adaptiveavgpool2d", attrs={"output_size": [2, None]}, output_shape=[4, 2, 3])
    d.pop("params")
    desc = NetworkDescription.from_dict(d)
    assert build_module(desc)(torch.zeros(2, 3, 5, 5)).shape == (2, 4, 2, 3)


def test_integer_pair_attributes_mean_a_square_pair():
    """A hand-written description may give ``kernel_size: 3``: it loads (parameters counted without
    ``params``), every reader sees [3, 3], and features, the allocation model and the module agree with the
    [h, w] spelling."""
    from perf4sight.features.aggregate import feature_matrix, network_features
    from perf4sight.features.alloc_model import step_events

    pairs = _conv_description()
    del pairs["params"]
    ints = json.loads(json.dumps(pairs))
    ints["nodes"][1]["attrs"].update(kernel_size=3, stride=1, padding=0, dilation=1)
    a, b = NetworkDescription.from_dict(pairs), NetworkDescription.from_dict(ints)
    assert b.nodes[1].attrs["kernel_size"] == [3, 3] and b.params == a.params == 4 * 3 * 9 + 4
    assert (feature_matrix(network_features(b), [2, 8]) == feature_matrix(network_features(a), [2, 8])).all()
    sa, sb = step_events(a, 4), step_events(b, 4)
    assert (sb.setup, sb.body, sb.tail, sb.param_bytes) == (sa.setup, sa.body, sa.tail, sa.param_bytes)
    assert sum(p.numel() for p in build_module(b).parameters()) == a.params


def test_every_shared_tx2_graph_rebuilds(tx2_data):
    """All 58 TX2 graphs: parameter count as recorded, output [1000] at 224x224; one step trains per network. The
    other pruning levels run their forward on the meta device: every shape is checked, no arithmetic done."""
    trained: set[str] = set()
    structures: dict[str, set[str]] = {}
    for path in sorted((tx2_data / "graphs").glob("*.json")):
        desc = load_description(path)
        structures.setdefault(desc.family, set()).add(desc.structure)
        train = desc.network not in trained
        module = build_module(desc, device=None if train else "meta")
        assert sum(p.numel() for p in module.parameters()) == desc.params, path.name
        if train:
            out = train_one_step(module, desc.input_shape, desc.num_classes, batch=1)
            trained.add(desc.network)
        else:
            with torch.no_grad():
                out = module.eval()(torch.randn(1, *desc.input_shape, device="meta"))
        assert tuple(out.shape) == (1, 1000), path.name
    assert len(trained) == 4
    # every pruning level of a family has its layers and wiring: one structure key each, four in all
    assert all(len(keys) == 1 for keys in structures.values()) and len(set.union(*structures.values())) == 4
    # torchvision's resnet18 is perf4sight's (its graphs reshape where torch.fx flattens: one layout)
    from perf4sight.networks.zoo import describe_zoo
    assert structures["resnet18"] == {describe_zoo("resnet18", [3, 224, 224]).structure}


@pytest.mark.parametrize("zoo", ["mobilenet_v2", "efficientnet_b0", "vit_b_16"])
def test_shape_keeping_layers_answered_without_running_record_the_shapes_they_would(zoo: str) -> None:
    """On the meta device the activations, dropouts and batch norms are answered by an empty tensor like their input
    instead of run: every node records the shape a plain ``ShapeProp`` run records."""
    import torch.fx as fx
    from torch.fx.passes.shape_prop import ShapeProp

    from perf4sight.ir.torch_trace import _meta_twin
    from perf4sight.ir.meta_shapes import MetaShapeProp

    shape = [3, 224, 224] if zoo == "vit_b_16" else [3, 32, 32]
    model = build_zoo_model(zoo, num_classes=10, input_shape=shape)
    shapes = []
    for prop in (ShapeProp, MetaShapeProp):
        gm = _meta_twin(fx.symbolic_trace(model))
        prop(gm).propagate(torch.empty(2, *shape, device="meta"))
        shapes.append([tuple(n.meta["tensor_meta"].shape) for n in gm.graph.nodes
                       if hasattr(n.meta.get("tensor_meta"), "shape")])
    assert len(shapes[0]) > 50 and shapes[0] == shapes[1]


def test_a_batch_norm_of_another_width_still_fails_the_forward() -> None:
    """A batch norm whose width is not its input's is run, not answered: the forward's failure is the one line."""
    model = nn.Sequential(nn.Conv2d(3, 8, 3), nn.BatchNorm2d(6), nn.ReLU6())
    with pytest.raises(UserError, match="forward fails at input shape"):
        describe(model, [3, 16, 16], name="bad")
    describe(nn.Sequential(nn.Conv2d(3, 6, 3), nn.BatchNorm2d(6), nn.ReLU6()), [3, 16, 16], name="good")


def test_a_map_smaller_than_a_kernel_says_to_give_a_larger_input() -> None:
    """inception_v3 below 75x75 failed with torch's words alone ("Calculated padded input size per channel"): the
    line now says first that the maps shrink below a kernel at that size."""
    model = nn.Sequential(nn.Conv2d(3, 8, 3, stride=2), nn.Conv2d(8, 8, 5))
    with pytest.raises(UserError, match=r"^small: the model's forward fails at input shape \[3, 8, 8\] \(\[C, H, W\]\) "
                                        r"\(its maps shrink below a kernel at this size: give a larger input shape\)"):
        describe(model, [3, 8, 8], name="small")
    assert describe(model, [3, 16, 16], name="small").nodes[-1].output_shape == [8, 3, 3]


class _WeightsAsked(nn.Module):
    """Self-attention called as ``attn(x, x, x)[0]``: ``need_weights`` left at its default, True."""

    def __init__(self, need_weights: bool = True):
        super().__init__()
        self.need_weights = need_weights
        self.conv, self.attn = nn.Conv2d(3, 8, 2, 2), nn.MultiheadAttention(8, 2, batch_first=True)

    def forward(self, x):
        y = self.conv(x).flatten(2).transpose(1, 2)
        return self.attn(y, y, y, need_weights=self.need_weights)[0].mean(1)


def test_an_attention_that_asks_for_its_weights_is_refused():
    """With its weights asked for, torch's training step takes the math path and keeps every head's tokens x tokens
    weights (3.8x the fused kernel's saved memory in the reviewer's case): the description's attention counts the
    fused kernel, so the call is refused with one line saying what to pass; without them it is described."""
    with pytest.raises(UserError, match=r"attention \(node attn\) asks for its weights .* call it with "
                                        r"need_weights=False") as exc:
        describe(_WeightsAsked(), [3, 8, 8], name="odd")
    assert "\n" not in str(exc.value)
    desc = describe(_WeightsAsked(need_weights=False), [3, 8, 8], name="fused")
    assert [n.op for n in desc.nodes if n.op == "attention"] == ["attention"]


class _FlattenedInside(nn.Module):
    """A map's channels and rows flattened together (``end_dim`` 2, not the last), the rows of the result linear."""

    def __init__(self, how: str):
        super().__init__()
        self.how, self.conv, self.flat, self.fc = how, nn.Conv2d(3, 4, 3), nn.Flatten(1, 2), nn.Linear(6, 5)

    def forward(self, x):
        y = self.conv(x)
        y = {"function": lambda: torch.flatten(y, 1, 2), "method": lambda: y.flatten(1, -2),
             "module": lambda: self.flat(y)}[self.how]()
        return self.fc(y)


@pytest.mark.parametrize("how", ["function", "method", "module"])
def test_a_flatten_that_stops_before_the_last_dimension_is_a_reshape(how):
    """``flatten(x, 1, 2)`` of a [4, 6, 6] map is [24, 6]: a description's flatten goes to the last dimension, so it
    reads as a reshape to the traced shape (it was a flatten to [144] rebuilt, which the linear layer then refused),
    and the rebuilt module computes what the module computes; a flatten to the end stays a flatten."""
    original = _FlattenedInside(how).eval()
    desc = NetworkDescription.from_dict(describe(original, [3, 8, 8], name="flat").to_dict())
    assert [(n.op, n.attrs, n.output_shape) for n in desc.nodes if n.op in ("reshape", "flatten")] == [
        ("reshape", {"shape": [24, 6]}, [24, 6])]
    _assert_same_function(desc, original, [3, 8, 8])
    whole = describe(nn.Sequential(nn.Conv2d(3, 4, 3), nn.Flatten(1, -1)), [3, 8, 8], name="whole")
    assert [(n.op, n.attrs) for n in whole.nodes][-1] == ("flatten", {"start_dim": 1})


class _PaddedConvs(nn.Module):
    """Convolutions padding other than with zeros (a style-transfer or CycleGAN network's): by reflection, by
    replication with two paddings, ``'same'`` with a kernel of an even side (torch pads one more at its right), by
    reflection of nothing; and a module named as the first one's pad would be (its name taken)."""

    def __init__(self) -> None:
        super().__init__()
        self.c = nn.Conv2d(3, 8, 3, padding=1, padding_mode="reflect")
        self.c_pad = nn.Conv2d(8, 8, (5, 3), padding=(2, 1), padding_mode="replicate", bias=False)
        self.same = nn.Conv2d(8, 6, (3, 4), padding="same", padding_mode="reflect", dilation=(2, 1))
        self.unpadded = nn.Conv2d(6, 4, 3, stride=2, padding_mode="reflect")

    def forward(self, x):
        return self.unpadded(torch.relu(self.same(torch.tanh(self.c_pad(self.c(x))))))


def test_a_convolution_padding_other_than_zeros_is_a_pad_then_the_convolution():
    """A convolution padding by reflection was refused (as one padding with zeros it would compute something else).
    It is what torch runs (``_conv_forward``): a ``pad`` of its mode by its padding ([left, right, top, bottom]:
    ``'same'`` of an even kernel one more at the right), then the convolution padding nothing; one of a padding of
    nothing still copies its input by a pad. The rebuilt module computes what the module computes, with its
    parameters, and describes back to the same ops."""
    torch.manual_seed(0)
    original = _PaddedConvs().eval()
    desc = NetworkDescription.from_dict(describe(original, [3, 10, 9], name="padded").to_dict())
    assert [(n.name, n.op, n.inputs, n.attrs.get("pads", n.attrs.get("padding")), n.attrs.get("mode"),
             n.output_shape) for n in desc.nodes if n.op in ("pad", "conv2d")] == [
        ("c_pad_1", "pad", ["input"], [1, 1, 1, 1], "reflect", [3, 12, 11]),
        ("c", "conv2d", ["c_pad_1"], [0, 0], None, [8, 10, 9]),
        ("c_pad_pad", "pad", ["c"], [1, 1, 2, 2], "replicate", [8, 14, 11]),
        ("c_pad", "conv2d", ["c_pad_pad"], [0, 0], None, [8, 10, 9]),
        ("same_pad", "pad", ["tanh"], [1, 2, 2, 2], "reflect", [8, 14, 12]),
        ("same", "conv2d", ["same_pad"], [0, 0], None, [6, 10, 9]),
        ("unpadded_pad", "pad", ["relu"], [0, 0, 0, 0], "reflect", [6, 10, 9]),
        ("unpadded", "conv2d", ["unpadded_pad"], [0, 0], None, [4, 4, 4])]
    assert desc.params == sum(p.numel() for p in original.parameters())
    _assert_same_function(desc, original, [3, 10, 9])
    again = describe(build_module(desc), [3, 10, 9], name="padded")
    assert [(n.op, n.attrs) for n in again.nodes] == [(n.op, n.attrs) for n in desc.nodes]


class _Wrapped(nn.Module):
    """Circular padding as a periodic-boundary network (a climate or physics CNN on a torus) writes it: convolutions
    of padding_mode='circular' (one of 'same' with an even kernel, one of nothing), nn.CircularPad2d and F.pad of
    mode 'circular' as wide as the map."""

    def __init__(self) -> None:
        super().__init__()
        self.c = nn.Conv2d(3, 8, 3, padding=1, padding_mode="circular")
        self.same = nn.Conv2d(8, 6, (3, 4), padding="same", padding_mode="circular", bias=False)
        self.wrap = nn.CircularPad2d((2, 0, 1, 3))
        self.unpadded = nn.Conv2d(6, 4, 3, stride=2, padding_mode="circular")

    def forward(self, x):
        y = self.wrap(torch.relu(self.same(self.c(x))))
        return self.unpadded(F.pad(y, (11, 0, 0, 0), mode="circular"))  # its width: it wraps once


def test_circular_padding_is_a_pad_of_mode_circular():
    """A convolution of padding_mode='circular', nn.CircularPad2d and F.pad(mode='circular') were refused: each is
    a pad of mode circular ([left, right, top, bottom], each at most the side it wraps, as torch requires), a
    convolution's followed by the convolution padding nothing. The rebuilt module computes what the module computes
    and describes back to the same ops; a pad wrapping more than once is refused when read."""
    torch.manual_seed(0)
    original = _Wrapped().eval()
    desc = NetworkDescription.from_dict(describe(original, [3, 10, 9], name="wrapped").to_dict())
    assert [(n.name, n.op, n.attrs.get("pads", n.attrs.get("padding")), n.attrs.get("mode"), n.output_shape)
            for n in desc.nodes if n.op in ("pad", "conv2d")] == [
        ("c_pad", "pad", [1, 1, 1, 1], "circular", [3, 12, 11]), ("c", "conv2d", [0, 0], None, [8, 10, 9]),
        ("same_pad", "pad", [1, 2, 1, 1], "circular", [8, 12, 12]), ("same", "conv2d", [0, 0], None, [6, 10, 9]),
        ("wrap", "pad", [2, 0, 1, 3], "circular", [6, 14, 11]), ("pad", "pad", [11, 0, 0, 0], "circular", [6, 14, 22]),
        ("unpadded_pad", "pad", [0, 0, 0, 0], "circular", [6, 14, 22]),
        ("unpadded", "conv2d", [0, 0], None, [4, 6, 10])]
    assert desc.params == sum(p.numel() for p in original.parameters())
    _assert_same_function(desc, original, [3, 10, 9])
    again = describe(build_module(desc), [3, 10, 9], name="wrapped")
    assert [(n.op, n.attrs) for n in again.nodes] == [(n.op, n.attrs) for n in desc.nodes]
    bad = desc.to_dict()
    next(n for n in bad["nodes"] if n["name"] == "pad")["attrs"]["pads"] = [12, 0, 0, 0]
    with pytest.raises(UserError, match=r"a circular pad of \[12, 0, 0, 0\] needs each pad at most the side it wraps"):
        NetworkDescription.from_dict(bad)


def test_a_sync_batch_norm_is_the_batch_norm_it_runs_on_one_device():
    """nn.SyncBatchNorm (convert_sync_batchnorm's) was refused as a layer without a description op: outside a process
    group it runs F.batch_norm, a BatchNorm2d's, so it is a batchnorm2d (eps and affine kept); the rebuilt module
    computes what it computes, in training too; of an [N, C, L] map's rows (a BatchNorm1d's input: converted from
    one) it is one too. One of a volume (a BatchNorm3d's) is refused by name."""
    torch.manual_seed(0)
    net = nn.Sequential(nn.Conv2d(3, 8, 3), nn.BatchNorm2d(8, eps=1e-3), nn.ReLU(), nn.Conv2d(8, 4, 3),
                        nn.BatchNorm2d(4, affine=False))
    original = nn.SyncBatchNorm.convert_sync_batchnorm(net)
    with torch.no_grad():
        original[1].running_mean.uniform_(-1, 1)
        original[1].weight.uniform_(0.5, 2)
    desc = NetworkDescription.from_dict(describe(original, [3, 8, 8], name="synced").to_dict())
    assert [(n.op, n.attrs) for n in desc.nodes if n.op == "batchnorm2d"] == [
        ("batchnorm2d", {"num_features": 8, "eps": 1e-3}), ("batchnorm2d", {"num_features": 4, "affine": False})]
    assert desc.params == sum(p.numel() for p in original.parameters())
    rebuilt = build_module(desc)
    for mine, theirs in zip(rebuilt.parameters(), original.parameters()):
        mine.data.copy_(theirs.data)
    running = [[b for n, b in m.named_buffers() if "running" in n] for m in (rebuilt, original)]
    for mine, theirs in zip(*running):
        mine.copy_(theirs)
    x = torch.randn(2, 3, 8, 8)
    assert torch.allclose(rebuilt.eval()(x), original.eval()(x), atol=1e-6)
    assert torch.allclose(rebuilt.train()(x), original.train()(x), atol=1e-6)
    flat = nn.SyncBatchNorm.convert_sync_batchnorm(nn.Sequential(nn.Conv2d(3, 8, 3), nn.Flatten(2),
                                                                 nn.BatchNorm1d(8, affine=False)))
    assert [(n.op, n.attrs, n.output_shape) for n in describe(flat, [3, 8, 8], name="flat").nodes][-1] == (
        "batchnorm2d", {"num_features": 8, "affine": False}, [8, 36])
    volume = nn.Sequential(nn.Conv2d(3, 8, 3), nn.Unflatten(2, (2, 3)), nn.SyncBatchNorm(8))
    with pytest.raises(UserError, match=r"a SyncBatchNorm of anything but a \[N, C, H, W\] map, \[N, C\] or "):
        describe(volume, [3, 8, 8], name="volume")


class _Bnneck(nn.Module):
    """A re-ID or metric-learning network's head: a batch norm of the pooled [N, C] features (a BNNeck), one of an
    [N, C, L] map's rows (nn.BatchNorm1d, not affine), and F.batch_norm with the module's own buffers and parameters."""

    def __init__(self) -> None:
        super().__init__()
        self.conv, self.rows = nn.Conv2d(3, 8, 3, padding=1), nn.BatchNorm1d(8, affine=False)
        self.embed, self.neck = nn.Linear(8, 16, bias=False), nn.BatchNorm1d(16, eps=1e-3)
        self.fc = nn.Linear(16, 10)
        self.weight, self.bias = nn.Parameter(torch.rand(10) + 0.5), nn.Parameter(torch.rand(10))
        self.register_buffer("running_mean", torch.rand(10))
        self.register_buffer("running_var", torch.rand(10) + 0.5)

    def forward(self, x):
        y = self.rows(self.conv(x).flatten(2)).mean(2)
        y = self.fc(self.neck(self.embed(y)))
        return F.batch_norm(y, self.running_mean, self.running_var, self.weight, self.bias, self.training, 0.1, 1e-4)


def test_a_batch_norm_of_a_heads_features_is_a_batchnorm2d():
    """nn.BatchNorm1d and F.batch_norm were refused as a layer and a call without a description op: of [N, C] or
    [N, C, L] they run the F.batch_norm of a BatchNorm2d, its running statistics per channel, so they are a
    batchnorm2d of a [C] or [C, L] input (eps and affine kept); the rebuilt module (a BatchNorm1d there) computes
    what the original computes, in eval mode and in training, where both update their running statistics alike.
    A batch norm call with a running mean but no variance is refused by name (without both:
    :func:`test_a_batch_norm_s_running_statistics_are_described_and_rebuilt`)."""
    torch.manual_seed(0)
    original = _Bnneck()
    desc = NetworkDescription.from_dict(describe(original, [3, 8, 8], name="bnneck").to_dict())
    assert [(n.op, n.attrs, n.output_shape) for n in desc.nodes if n.op == "batchnorm2d"] == [
        ("batchnorm2d", {"num_features": 8, "affine": False}, [8, 64]),
        ("batchnorm2d", {"num_features": 16, "eps": 1e-3}, [16]),
        ("batchnorm2d", {"num_features": 10, "eps": 1e-4}, [10])]
    assert desc.params == sum(p.numel() for p in original.parameters()) == 8 * 3 * 9 + 8 + 8 * 16 + 32 + 170 + 20
    assert desc.untrainable_at_batch_one  # torch refuses a training batch norm of one value per channel
    rebuilt = build_module(desc)
    assert sum(isinstance(m, nn.BatchNorm1d) for m in rebuilt.modules()) == 3
    in_order = [p for m in (original.conv, original.embed, original.neck, original.fc) for p in m.parameters()]
    for mine, theirs in zip(rebuilt.parameters(), in_order + [original.weight, original.bias], strict=True):
        mine.data.copy_(theirs.data)
    mine_stats = [b for n, b in rebuilt.named_buffers() if "running" in n]
    theirs_stats = [original.rows.running_mean, original.rows.running_var, original.neck.running_mean,
                    original.neck.running_var, original.running_mean, original.running_var]
    for mine, theirs in zip(mine_stats, theirs_stats, strict=True):
        mine.copy_(theirs)
    x = torch.randn(4, 3, 8, 8)
    assert torch.allclose(rebuilt.eval()(x), original.eval()(x), atol=1e-5)
    assert torch.allclose(rebuilt.train()(x), original.train()(x), atol=1e-5)
    assert all(torch.allclose(mine, theirs) for mine, theirs in zip(mine_stats, theirs_stats))

    class HalfKept(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.register_buffer("running_mean", torch.zeros(3))

        def forward(self, x):
            return F.batch_norm(x, self.running_mean, None, training=True)
    with pytest.raises(UserError, match="a batch norm with a running mean but no running variance .* has no "):
        describe(HalfKept(), [3, 8, 8], name="half")


class _BatchNormOfVolume(nn.Module):
    """F.batch_norm of an [N, C, D, H, W] volume (a BatchNorm3d's input) with a BatchNorm3d's buffers and
    parameters."""

    def __init__(self) -> None:
        super().__init__()
        self.bn = nn.BatchNorm3d(3)

    def forward(self, x):
        x = x.reshape(x.shape[0], 3, 4, 4, 4)
        return F.batch_norm(x, self.bn.running_mean, self.bn.running_var, self.bn.weight, self.bn.bias, True)


def test_a_batch_norm_call_of_a_volume_is_refused_by_name():
    """F.batch_norm of a volume was described as a batchnorm2d of a [C, D, H, W] input, which torch's BatchNorm2d
    refuses: the description did not rebuild (torch's ValueError at its first forward). It is refused by name as
    nn.BatchNorm3d and a SyncBatchNorm of a volume are, and so is a batchnorm2d of one in a description written by
    hand."""
    with pytest.raises(UserError, match=r"a batch norm call of anything but a \[N, C, H, W\] map, \[N, C\] or "):
        describe(_BatchNormOfVolume(), [3, 8, 8], name="volume")
    desc = describe(nn.Sequential(nn.Flatten(2), nn.BatchNorm1d(3)), [3, 8, 8], name="rows").to_dict()
    norm = next(n for n in desc["nodes"] if n["op"] == "batchnorm2d")
    assert norm["output_shape"] == [3, 64]
    build_module(NetworkDescription.from_dict(desc))  # a [C, L] input: a BatchNorm1d's
    norm["output_shape"] = [3, 4, 4, 4]
    previous = next(n for n in desc["nodes"] if n["name"] == norm["inputs"][0])
    previous["op"], previous["attrs"], previous["output_shape"] = "reshape", {"shape": [3, 4, 4, 4]}, [3, 4, 4, 4]
    with pytest.raises(UserError, match=r"\(batchnorm2d\): needs an input of \[C\], \[C, L\] or \[C, H, W\], got "):
        NetworkDescription.from_dict(desc)


class _BatchNormOfBuffers(nn.Module):
    """A batch norm frozen as some code bases write one: F.batch_norm in evaluation of four [C] buffers, its weight
    and bias among them (no parameters)."""

    def __init__(self, channels: int) -> None:
        super().__init__()
        for name, value in (("weight", torch.ones(channels)), ("bias", torch.zeros(channels)),
                            ("running_mean", torch.zeros(channels)), ("running_var", torch.ones(channels))):
            self.register_buffer(name, value)

    def forward(self, x):
        return F.batch_norm(x, self.running_mean, self.running_var, self.weight, self.bias, False, 0.0, 1e-5)


def test_a_batch_norm_call_of_a_buffer_weight_is_refused_by_name():
    """F.batch_norm given buffers as its weight and bias (a frozen batch norm) was described as a batchnorm2d with
    parameters, trained: the description counted 2 C parameters the network does not have (276 for its 260). It is
    refused naming the buffer, as a layer norm call of one is; a weight and bias that are parameters still describe."""
    frozen = nn.Sequential(nn.Conv2d(3, 8, 3), _BatchNormOfBuffers(8), nn.ReLU(), nn.AdaptiveAvgPool2d(1),
                           nn.Flatten(), nn.Linear(8, 4))
    with pytest.raises(UserError, match=r"batch norm call \(node batch_norm\) reads 1.weight, a module tensor that is "
                                        r"no parameter"):
        describe(frozen, [3, 8, 8], name="frozen")
    desc = describe(_Bnneck(), [3, 8, 8], name="bnneck")
    assert desc.params == sum(p.numel() for p in _Bnneck().parameters())


class _Fractional(nn.Module):
    """Fractional max pools (Graham's): a layer of an output ratio, a call of an output size."""

    def __init__(self) -> None:
        super().__init__()
        self.conv, self.pool = nn.Conv2d(3, 8, 3, padding=1), nn.FractionalMaxPool2d(3, output_ratio=(0.5, 0.7))
        self.fc = nn.Linear(8, 10)

    def forward(self, x):
        return self.fc(F.fractional_max_pool2d(self.pool(self.conv(x)), 2, output_size=(4, 5)).mean((2, 3)))


def test_a_fractional_max_pool_is_the_op_fractional_maxpool2d():
    """nn.FractionalMaxPool2d and F.fractional_max_pool2d were refused as a layer and a call without a description
    op: they are a fractional_maxpool2d of its windows and the output size the trace gives (of an output ratio too).
    Its windows' places are drawn at each forward, so the rebuilt module makes the same shapes, and given the same
    random samples as the original computes the same. One of fixed samples, or an output size whose windows do not
    fit the input, is refused by name (one returning its indices: tests/test_ir_user_calls.py)."""
    torch.manual_seed(0)
    original = _Fractional()
    desc = NetworkDescription.from_dict(describe(original, [3, 16, 16], name="fractional").to_dict())
    assert [(n.attrs, n.output_shape) for n in desc.nodes if n.op == "fractional_maxpool2d"] == [
        ({"kernel_size": [3, 3], "output_size": [8, 11]}, [8, 8, 11]),
        ({"kernel_size": [2, 2], "output_size": [4, 5]}, [8, 4, 5])]
    rebuilt = build_module(desc)
    rebuilt.load_state_dict(original.state_dict())
    x = torch.randn(2, 3, 16, 16)
    assert rebuilt(x).shape == original(x).shape == (2, 10)
    pools = [m for m in rebuilt.modules() if isinstance(m, nn.FractionalMaxPool2d)]
    samples = torch.rand(2, 8, 2)
    original.pool._random_samples = pools[0]._random_samples = samples
    y = original.pool(original.conv(x))
    assert torch.equal(pools[0](original.conv(x)), y)
    pools[1]._random_samples = samples
    assert torch.equal(pools[1](y), F.fractional_max_pool2d(y, 2, output_size=(4, 5), _random_samples=samples))
    original.pool._random_samples = None

    class Indexed(nn.Module):
        def __init__(self, layer: nn.Module) -> None:
            super().__init__()
            self.conv, self.layer = nn.Conv2d(3, 8, 1), layer

        def forward(self, x):
            y = self.layer(self.conv(x))
            return y[0] if isinstance(y, tuple) else y
    for layer in (nn.FractionalMaxPool2d(2, output_size=4, _random_samples=samples),):
        with pytest.raises(UserError, match="a fractional max pool that takes fixed random samples has no "
                                            "description op"):
            describe(Indexed(layer), [3, 8, 8], name="fixed")
    bad = desc.to_dict()
    next(n for n in bad["nodes"] if n["op"] == "fractional_maxpool2d")["attrs"]["output_size"] = [15, 11]
    with pytest.raises(UserError, match=r"output_size \[15, 11\] of windows \[3, 3\] does not fit its 16x16 input"):
        NetworkDescription.from_dict(bad)


class _Decoder(nn.Module):
    """An autoencoder's decoder or a DCGAN generator's stem: a vector made a map by nn.Unflatten, then by
    torch.unflatten and x.unflatten (a negative dim too), between transposed convolutions."""

    def __init__(self) -> None:
        super().__init__()
        self.fc, self.unflat = nn.Linear(3 * 4 * 4, 8 * 4 * 4), nn.Unflatten(1, (8, 4, 4))
        self.up = nn.ConvTranspose2d(8, 4, 4, stride=2, padding=1)

    def forward(self, x):
        y = self.up(self.unflat(self.fc(torch.flatten(x, 1))))
        y = torch.unflatten(y.flatten(1), 1, (4, 64)).unflatten(-1, (8, 8))
        return y.mean((2, 3))


def test_an_unflatten_is_a_reshape_to_the_traced_shape():
    """nn.Unflatten and its calls (torch.unflatten, x.unflatten) were refused as a layer and calls without a
    description op: each is a reshape to the shape the trace gives, and the rebuilt module computes what the module
    computes; an unflatten of the batch dimension is refused by name."""
    torch.manual_seed(0)
    original = _Decoder().eval()
    desc = NetworkDescription.from_dict(describe(original, [3, 4, 4], name="decoder").to_dict())
    assert [n.attrs["shape"] for n in desc.nodes if n.op == "reshape"] == [[8, 4, 4], [4, 64], [4, 8, 8]]
    _assert_same_function(desc, original, [3, 4, 4])

    class Batch(nn.Module):
        def forward(self, x):
            return torch.unflatten(x, 0, (1, -1))

    with pytest.raises(UserError, match="an unflatten of the batch dimension"):
        describe(Batch(), [3, 4, 4], name="batch")


class _SelfNormalising(nn.Module):
    """A self-normalising network's activations: nn.SELU (in place too), F.selu, nn.CELU, F.celu (in place) and
    torch.celu."""

    def __init__(self) -> None:
        super().__init__()
        self.c1, self.a1, self.c2 = nn.Conv2d(3, 8, 3), nn.SELU(), nn.Conv2d(8, 8, 3)
        self.a2, self.a3, self.a4 = nn.CELU(0.5), nn.SELU(inplace=True), nn.CELU(2.0, inplace=True)

    def forward(self, x):
        y = self.a2(F.selu(self.c2(self.a1(self.c1(x)))))
        y = F.celu(self.a4(self.a3(y * 2.0)), 1.5, inplace=True)
        return torch.celu(y, 0.25).mean((2, 3))


def test_selu_and_celu_are_described_and_rebuilt():
    """SELU and CELU (a self-normalising network's activations: the layers, the calls, in place too) were refused
    as layers without a description op: they are the ops selu and celu (alpha; inplace where given), rebuilt by
    nn.SELU and nn.CELU, which compute what the module computes and describe back to them; a CELU of alpha 0 (whose
    forward torch refuses) is refused when read."""
    torch.manual_seed(0)
    original = _SelfNormalising().eval()
    desc = NetworkDescription.from_dict(describe(original, [3, 8, 8], name="snn").to_dict())
    assert [(n.op, n.attrs) for n in desc.nodes if n.op in ("selu", "celu")] == [
        ("selu", {}), ("selu", {}), ("celu", {"alpha": 0.5}), ("selu", {"inplace": True}),
        ("celu", {"alpha": 2.0, "inplace": True}), ("celu", {"alpha": 1.5, "inplace": True}),
        ("celu", {"alpha": 0.25})]
    _assert_same_function(desc, original, [3, 8, 8])
    again = describe(build_module(desc), [3, 8, 8], name="snn")
    assert [(n.op, n.attrs) for n in again.nodes] == [(n.op, n.attrs) for n in desc.nodes]
    bad = desc.to_dict()
    next(n for n in bad["nodes"] if n["op"] == "celu")["attrs"]["alpha"] = 0.0
    with pytest.raises(UserError, match="alpha' of a celu must not be 0"):
        NetworkDescription.from_dict(bad)


class _AlexNetStem(nn.Module):
    """AlexNet's original stem: a convolution, a ReLU, a local response norm (the layer, then the call), a pool."""

    def __init__(self) -> None:
        super().__init__()
        self.conv, self.norm = nn.Conv2d(3, 8, 5, stride=2), nn.LocalResponseNorm(5, alpha=1e-3, beta=0.5, k=2.0)

    def forward(self, x):
        y = F.local_response_norm(self.norm(torch.relu(self.conv(x))), 3)
        return F.max_pool2d(y, 3, 2)


def test_a_local_response_norm_is_described_and_rebuilt():
    """nn.LocalResponseNorm and F.local_response_norm (AlexNet's, GoogLeNet's first) were refused as a layer and a
    call without a description op: they are the op local_response_norm (size, alpha, beta, k), rebuilt by
    nn.LocalResponseNorm, which computes what the module computes and describes back to it; one of a [N, C, L]
    tensor is refused by name, and one of size 0 when read."""
    torch.manual_seed(0)
    original = _AlexNetStem().eval()
    desc = NetworkDescription.from_dict(describe(original, [3, 15, 15], name="alexnet").to_dict())
    assert [n.attrs for n in desc.nodes if n.op == "local_response_norm"] == [
        {"size": 5, "alpha": 1e-3, "beta": 0.5, "k": 2.0}, {"size": 3, "alpha": 1e-4, "beta": 0.75, "k": 1.0}]
    _assert_same_function(desc, original, [3, 15, 15])
    again = describe(build_module(desc), [3, 15, 15], name="alexnet")
    assert [(n.op, n.attrs) for n in again.nodes] == [(n.op, n.attrs) for n in desc.nodes]
    bad = desc.to_dict()
    next(n for n in bad["nodes"] if n["op"] == "local_response_norm")["attrs"]["size"] = 0
    with pytest.raises(UserError, match="size"):
        NetworkDescription.from_dict(bad)
    with pytest.raises(UserError, match=r"a local response norm of anything but a \[N, C, H, W\] map"):
        describe(_Padded(lambda y: F.local_response_norm(y.flatten(2), 2)), [3, 6, 6], "flat")


class _Gated(nn.Module):
    """A gated convolution block: nn.GLU over the channels, F.glu over its default (the last) dim and over the
    height."""

    def __init__(self) -> None:
        super().__init__()
        self.c1, self.c2, self.gate, self.fc = nn.Conv2d(3, 16, 3), nn.Conv2d(8, 8, 1), nn.GLU(1), nn.Linear(8, 4)

    def forward(self, x):
        y = self.c2(self.gate(self.c1(x)))
        return self.fc(F.glu(F.glu(y, dim=2)).mean((2, 3)))


def test_a_glu_is_described_and_halves_its_dim():
    """GLU (a gated convolution's: nn.GLU, F.glu) was refused as a layer without a description op: it is the op glu
    (dim, counted from the front as a softmax's), whose output halves its input along dim; the rebuilt module computes
    what the original computes and describes back to it. A GLU along the batch is refused by name, and one of a dim
    of odd size when read."""
    torch.manual_seed(0)
    original = _Gated().eval()
    desc = NetworkDescription.from_dict(describe(original, [3, 10, 10], name="gated").to_dict())
    assert [(n.op, n.attrs, n.output_shape) for n in desc.nodes if n.op == "glu"] == [
        ("glu", {"dim": 1}, [8, 8, 8]), ("glu", {"dim": 2}, [8, 4, 8]), ("glu", {"dim": 3}, [8, 4, 4])]
    _assert_same_function(desc, original, [3, 10, 10])
    again = describe(build_module(desc), [3, 10, 10], name="gated")
    assert [(n.op, n.attrs) for n in again.nodes] == [(n.op, n.attrs) for n in desc.nodes]
    bad = describe(nn.Sequential(nn.Conv2d(3, 16, 3), nn.GLU(1)), [3, 7, 7], name="odd").to_dict()
    bad["nodes"][-1]["attrs"]["dim"] = 2  # of a [16, 5, 5] map
    with pytest.raises(UserError, match="halves its input along dim 2, of odd size 5"):
        NetworkDescription.from_dict(bad)
    with pytest.raises(UserError, match="a GLU along the batch dimension has no description op"):
        describe(nn.Sequential(nn.Conv2d(3, 4, 3), nn.GLU(0)), [3, 8, 8], name="batch")


class _Shrinks(nn.Module):
    """nn.Hardshrink, nn.Softshrink and nn.Threshold (in place), and their calls: torch.hardshrink, x.hardshrink,
    F.softshrink, F.threshold (in place too) and torch.threshold_."""

    def __init__(self) -> None:
        super().__init__()
        self.conv, self.fc = nn.Conv2d(3, 8, 3), nn.Linear(8, 4)
        self.hard, self.soft, self.cut = nn.Hardshrink(0.3), nn.Softshrink(0.2), nn.Threshold(0.1, -1.0, True)

    def forward(self, x):
        y = self.cut(self.soft(self.hard(self.conv(x))))
        y = F.threshold(torch.hardshrink(F.softshrink(y * 2.0, 0.1)), 0.0, 2.0)
        y = F.threshold(y.hardshrink(0.2) + 1.0, 0.5, 0.25, True)
        return self.fc(torch.threshold_(y * 0.5, 0.3, 0.0).mean((2, 3)))


def test_hardshrink_softshrink_and_threshold_are_described_and_rebuilt():
    """Hardshrink, Softshrink and Threshold (the layers, the calls, a threshold in place too) were refused as layers
    without a description op: they are the ops hardshrink and softshrink (lambd) and threshold (threshold, value;
    inplace where given), rebuilt by nn.Hardshrink, nn.Softshrink and nn.Threshold, which compute what the module
    computes and describe back to them. A softshrink of a negative lambd (torch refuses it) is refused when read."""
    torch.manual_seed(0)
    original = _Shrinks().eval()
    desc = NetworkDescription.from_dict(describe(original, [3, 8, 8], name="shrinks").to_dict())
    assert [(n.op, n.attrs) for n in desc.nodes if n.op in ("hardshrink", "softshrink", "threshold")] == [
        ("hardshrink", {"lambd": 0.3}), ("softshrink", {"lambd": 0.2}),
        ("threshold", {"threshold": 0.1, "value": -1.0, "inplace": True}), ("softshrink", {"lambd": 0.1}),
        ("hardshrink", {"lambd": 0.5}), ("threshold", {"threshold": 0.0, "value": 2.0}),
        ("hardshrink", {"lambd": 0.2}), ("threshold", {"threshold": 0.5, "value": 0.25, "inplace": True}),
        ("threshold", {"threshold": 0.3, "value": 0.0, "inplace": True})]
    _assert_same_function(desc, original, [3, 8, 8])
    again = describe(build_module(desc), [3, 8, 8], name="shrinks")
    assert [(n.op, n.attrs) for n in again.nodes] == [(n.op, n.attrs) for n in desc.nodes]
    bad = desc.to_dict()
    next(n for n in bad["nodes"] if n["op"] == "softshrink")["attrs"]["lambd"] = -0.5
    with pytest.raises(UserError, match="lambd"):
        NetworkDescription.from_dict(bad)


class _LogSigmoids(nn.Module):
    """nn.LogSigmoid and F.logsigmoid."""

    def __init__(self) -> None:
        super().__init__()
        self.c1, self.act, self.c2, self.fc = nn.Conv2d(3, 8, 3), nn.LogSigmoid(), nn.Conv2d(8, 4, 3), nn.Linear(64, 5)

    def forward(self, x):
        return F.logsigmoid(self.fc(self.c2(self.act(self.c1(x))).flatten(1)))


def test_a_log_sigmoid_is_described_and_rebuilt():
    """LogSigmoid (nn.LogSigmoid, F.logsigmoid) was refused as a layer without a description op: it is the op
    log_sigmoid, rebuilt by nn.LogSigmoid, which computes what the module computes and describes back to it."""
    torch.manual_seed(0)
    original = _LogSigmoids().eval()
    desc = NetworkDescription.from_dict(describe(original, [3, 8, 8], name="logsig").to_dict())
    assert [n.op for n in desc.nodes] == ["input", "conv2d", "log_sigmoid", "conv2d", "flatten", "linear",
                                          "log_sigmoid"]
    _assert_same_function(desc, original, [3, 8, 8])
    again = describe(build_module(desc), [3, 8, 8], name="logsig")
    assert [(n.op, n.attrs) for n in again.nodes] == [(n.op, n.attrs) for n in desc.nodes]


class _Composed(nn.Module):
    """Softsign, Tanhshrink and Softmin as layers and as calls (F.softsign, F.tanhshrink, F.softmin)."""

    def __init__(self) -> None:
        super().__init__()
        self.conv, self.fc = nn.Conv2d(3, 8, 3), nn.Linear(8, 4)
        self.sign, self.shrink, self.soft = nn.Softsign(), nn.Tanhshrink(), nn.Softmin(1)

    def forward(self, x):
        y = self.soft(self.shrink(self.sign(self.conv(x))))
        return self.fc(F.softmin(F.tanhshrink(F.softsign(y * 3.0)), dim=-1).mean((2, 3)))


def test_softsign_tanhshrink_and_softmin_are_described_as_torch_computes_them():
    """Softsign, Tanhshrink and Softmin were refused as layers and calls without a description op. Torch computes each
    in Python from elementwise ops the description has: x / (x.abs() + 1), x - x.tanh() (a difference: times -1,
    added) and (-x).softmax(dim); they are described so, the rebuilt module computes what the original computes and
    describes back to the same ops. A softmin of torch's implicit dimension, or over the batch, is refused as a
    softmax's is."""
    torch.manual_seed(0)
    original = _Composed().eval()
    desc = NetworkDescription.from_dict(describe(original, [3, 8, 8], name="composed").to_dict())
    unit = [("abs", {}), ("add", {"scalar": 1.0}), ("div", {}), ("tanh", {}), ("mul", {"scalar": -1.0}), ("add", {}),
            ("mul", {"scalar": -1.0})]
    ops = [(n.op, n.attrs) for n in desc.nodes if n.op not in ("input", "conv2d", "mean", "linear")]
    assert ops == [*unit, ("softmax", {"dim": 1}), ("mul", {"scalar": 3.0}), *unit, ("softmax", {"dim": 3})]
    assert [desc.node(name).inputs for name in ("sign", "shrink")] == [["conv", "sign_2"], ["sign", "shrink_2"]]
    _assert_same_function(desc, original, [3, 8, 8])
    again = describe(build_module(desc), [3, 8, 8], name="composed")
    assert [(n.op, n.attrs) for n in again.nodes] == [(n.op, n.attrs) for n in desc.nodes]
    for layer, message in ((nn.Softmin(), "without dim="), (nn.Softmin(0), "over the batch dimension")):
        with pytest.raises(UserError, match=f"a softmin {message}"), warnings.catch_warnings():
            warnings.simplefilter("ignore")
            describe(nn.Sequential(nn.Conv2d(3, 8, 3), layer), [3, 8, 8], name="softmin")


def test_a_gelu_of_the_tanh_approximation_is_kept():
    """A GELU of torch's tanh approximation was described as the exact one: it keeps ``approximate: "tanh"``, the
    rebuilt module computes it and describes back to it; an exact GELU's attrs stay empty."""
    import torch.nn.functional as F

    class Gelus(nn.Module):
        def __init__(self):
            super().__init__()
            self.conv, self.gelu, self.exact = nn.Conv2d(3, 4, 3), nn.GELU(approximate="tanh"), nn.GELU()

        def forward(self, x):
            return F.gelu(self.exact(self.gelu(self.conv(x))) * 3.0, approximate="tanh").mean((2, 3))

    original = Gelus().eval()
    desc = NetworkDescription.from_dict(describe(original, [3, 8, 8], name="gelus").to_dict())
    assert [n.attrs for n in desc.nodes if n.op == "gelu"] == [{"approximate": "tanh"}, {}, {"approximate": "tanh"}]
    _assert_same_function(desc, original, [3, 8, 8])
    again = describe(build_module(desc), [3, 8, 8], name="gelus")
    assert [(n.op, n.attrs) for n in again.nodes] == [(n.op, n.attrs) for n in desc.nodes]
    bad = desc.to_dict()
    next(n for n in bad["nodes"] if n["op"] == "gelu")["attrs"]["approximate"] = "erf"
    with pytest.raises(UserError, match=r"attr 'approximate' must be 'none' or 'tanh', got 'erf'"):
        NetworkDescription.from_dict(bad)


def test_a_batch_norm_without_affine_parameters_counts_none():
    """``BatchNorm2d(affine=False)`` has no weight and bias: the description says ``affine: false`` (and nothing for
    an affine one, whose descriptions read as before), and its parameter count, the features' and the rebuilt
    module's are the real module's."""
    from perf4sight.features import network_features

    original = nn.Sequential(nn.Conv2d(3, 8, 3), nn.BatchNorm2d(8, affine=False), nn.BatchNorm2d(8), nn.Flatten(),
                             nn.Linear(8 * 6 * 6, 10)).eval()
    desc = NetworkDescription.from_dict(describe(original, [3, 8, 8], name="bn").to_dict())
    assert [n.attrs for n in desc.nodes if n.op == "batchnorm2d"] == [{"num_features": 8, "affine": False},
                                                                      {"num_features": 8}]
    real = sum(p.numel() for p in original.parameters())
    rebuilt = build_module(desc)
    assert desc.params == network_features(desc).static["params"] == real == sum(
        p.numel() for p in rebuilt.parameters())
    assert [m.affine for m in rebuilt.modules() if isinstance(m, nn.BatchNorm2d)] == [False, True]
    _assert_same_function(desc, original, [3, 8, 8])
    counted = desc.to_dict()
    del counted["params"]
    assert NetworkDescription.from_dict(counted).params == real
    next(n for n in counted["nodes"] if n["op"] == "batchnorm2d")["attrs"]["affine"] = "no"
    with pytest.raises(UserError, match=r"attr 'affine' must be true or false, got 'no'"):
        NetworkDescription.from_dict(counted)


#: (op, attrs, a wrong output_shape of the same elements and, for a transpose, the same sizes, the message, the
#: right output_shape) for a node after the [4, 3, 3] convolution of ``_conv_description``
_VIEWS_AND_MEANS = [
    ("mean", {"dims": [2, 3], "keepdim": False}, [4, 3, 3], r"output_shape \[4, 3, 3\], but its input \[4, 3, 3\] "
                                                            r"gives \[4\]", [4]),
    ("mean", {"dims": [-1], "keepdim": True}, [4, 3, 3], r"gives \[4, 3, 1\]", [4, 3, 1]),
    ("mean", {"dims": [0], "keepdim": False}, [4, 3, 3], r"dims \[0\] are not distinct dimensions of its input", None),
    ("transpose", {"dim0": 1, "dim1": 2}, [3, 3, 4], r"output_shape \[3, 3, 4\], but its input \[4, 3, 3\] gives "
                                                     r"\[3, 4, 3\]", [3, 4, 3]),
    ("transpose", {"dim0": 1, "dim1": 4}, [4, 3, 3], r"dims 1, 4 are not two dimensions of its input", None),
    ("flatten", {"start_dim": 2}, [36], r"gives \[4, 9\]", [4, 9]),
    ("flatten", {"start_dim": 0}, [36], r"start_dim 0 is not a dimension of its input after the batch", None),
    ("squeeze", {"dim": 2}, [4, 9], r"gives \[4, 3, 3\]", [4, 3, 3]),  # a dimension of size 3 stays, as in torch
    ("unsqueeze", {"dim": 1}, [4, 3, 3, 1], r"gives \[1, 4, 3, 3\]", [1, 4, 3, 3]),
    ("unsqueeze", {"dim": -1}, [1, 4, 3, 3], r"gives \[4, 3, 3, 1\]", [4, 3, 3, 1]),
]


@pytest.mark.parametrize("op, attrs, wrong, expected, right", _VIEWS_AND_MEANS)
def test_views_and_means_have_exact_output_shapes(op, attrs, wrong, expected, right):
    """A mean had no shape rule, a transpose was checked by its sorted sizes and a flatten, squeeze or unsqueeze by
    its element count: a hand-written output_shape that torch would not give passed, and the features counted it.
    Now each is refused with the line naming the node; the right one loads and is what the rebuilt module gives."""
    d = _conv_description()
    d["nodes"][2] = {"name": "odd", "op": op, "inputs": [d["nodes"][1]["name"]], "attrs": attrs,
                     "output_shape": wrong}
    d["output"] = "odd"
    with pytest.raises(UserError, match=expected) as exc:
        NetworkDescription.from_dict(d, where="conv.json")
    assert str(exc.value).startswith("conv.json: node 'odd' (") and "\n" not in str(exc.value)
    if right is not None:
        d["nodes"][2]["output_shape"] = right
        desc = NetworkDescription.from_dict(d)
        assert list(build_module(desc)(torch.randn(2, 3, 5, 5)).shape[1:]) == right


def test_a_pool_with_a_null_stride_strides_by_its_kernel():
    """``"stride": null`` (torch's default, the kernel size) was accepted but could not be built: it reads as the
    kernel size, for every reader."""
    d = {"name": "p", "input_shape": [3, 8, 8], "output": "pool", "nodes": [
        {"name": "input", "op": "input", "inputs": [], "attrs": {}, "output_shape": [3, 8, 8]},
        {"name": "pool", "op": "maxpool2d", "inputs": ["input"],
         "attrs": {"kernel_size": 2, "stride": None, "padding": 0, "ceil_mode": False}, "output_shape": [3, 4, 4]},
        {"name": "avg", "op": "avgpool2d", "inputs": ["pool"], "attrs": {"kernel_size": [2, 1], "stride": None,
         "padding": 0, "ceil_mode": False, "count_include_pad": True}, "output_shape": [3, 2, 4]}]}
    d["output"] = "avg"
    desc = NetworkDescription.from_dict(d)
    assert [n.attrs["stride"] for n in desc.nodes[1:]] == [[2, 2], [2, 1]]
    assert tuple(build_module(desc)(torch.randn(2, 3, 8, 8)).shape) == (2, 3, 2, 4)


def test_a_model_of_several_outputs_or_no_parameters_is_one_line():
    """A forward returning (logits, features) was an AttributeError traceback; a network with no parameters to prune
    a ZeroDivisionError."""
    from perf4sight.networks.pruning import PruningPlan

    class TwoOut(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.conv, self.fc = nn.Conv2d(3, 8, 3), nn.Linear(8, 10)

        def forward(self, x):
            f = self.conv(x).mean((2, 3))
            return self.fc(f), f
    with pytest.raises(UserError, match=r"^two: the model returns a tuple of 2; a description follows one tensor "
                                        r"output \(return the logits alone\)$"):
        describe(TwoOut(), [3, 16, 16], "two")
    with pytest.raises(UserError, match=r"^pool: has no parameters to prune"):
        PruningPlan(nn.Sequential(nn.AdaptiveAvgPool2d(1), nn.Flatten()), [3, 16, 16], network="pool")

    class IntOut(nn.Module):  # torch-pruning's trace ended in "TypeError: 'int' object is not iterable"
        def __init__(self) -> None:
            super().__init__()
            self.conv = nn.Conv2d(3, 8, 3)

        def forward(self, x):
            self.conv(x)
            return 3
    with pytest.raises(UserError, match=r"^intout: the model returns int 3, not a tensor; a description follows one "
                                        r"tensor output \(return the logits\)$"):
        PruningPlan(IntOut(), [3, 16, 16], network="intout")
    assert PruningPlan(TwoOut(), [3, 16, 16], network="two").groups  # a tuple of tensors: traced (describe refuses)



class _DetectionHead(nn.Module):
    """A YOLO-style detection head: one 1x1 convolution per scale, the maps returned as a list (``as_tuple``: a
    tuple)."""

    def __init__(self, as_tuple: bool) -> None:
        super().__init__()
        self.downs = nn.ModuleList(nn.Conv2d(c, 8, 3, stride=2, padding=1) for c in (3, 8, 8))
        self.heads, self.as_tuple = nn.ModuleList(nn.Conv2d(8, 15, 1) for _ in range(3)), as_tuple

    def forward(self, x):
        maps = []
        for down in self.downs:
            x = down(x)
            maps.append(x)
        out = [head(m) for head, m in zip(self.heads, maps)]
        return tuple(out) if self.as_tuple else out


@pytest.mark.parametrize("as_tuple", [False, True])
def test_a_detection_head_s_maps_are_refused_saying_how_to_return_one_tensor(as_tuple):
    """A list of maps was refused as "the model returns a immutable_list of 3" (torch.fx's type of a traced list) and
    asked for "the logits alone", which a detector has not."""
    kind = "tuple" if as_tuple else "list"
    with pytest.raises(UserError, match=rf"^det: the model returns a {kind} of 3 maps; a description follows one "
                                        r"tensor output \(return one: the maps flattened and concatenated, "
                                        r"torch\.cat\(\[m\.flatten\(2\) for m in maps\], 2\), as a detector's "
                                        r"inference output is\)$"):
        describe(_DetectionHead(as_tuple), [3, 32, 32], "det")

class _InPlaceTail(nn.Module):
    """A block whose in-place writes are not assigned back: ``y.mul_(0.5)`` and the residual ``y.add_(x)``."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(4, 4, 3, padding=1)
        self.head = nn.Sequential(nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(4, 3))

    def forward(self, x):
        y = self.conv(x).relu()
        y.mul_(0.5)
        y.add_(x)
        return self.head(torch.sigmoid(y) * y)


def test_in_place_writes_that_are_not_assigned_back_are_followed():
    """torch.fx records ``y.mul_(0.5)`` as a node that later readers of ``y`` do not read: the description left both
    writes out and computed another function (max |diff| 0.14), with no word said."""
    torch.manual_seed(0)
    module = _InPlaceTail().eval()
    desc = describe(module, [4, 8, 8], "inplace")
    sigmoid = next(n for n in desc.nodes if n.op == "sigmoid")
    assert sigmoid.inputs == [next(n.name for n in desc.nodes if n.op == "add")]
    _assert_same_function(desc, module, [4, 8, 8])


class _Tied(nn.Module):
    """Two convolutions of one weight (``b.weight = a.weight``): torch keeps one tensor, one gradient."""

    def __init__(self) -> None:
        super().__init__()
        self.stem, self.a, self.b, self.fc = (nn.Conv2d(3, 8, 1), nn.Conv2d(8, 8, 3, padding=1),
                                              nn.Conv2d(8, 8, 3, padding=1), nn.Linear(8, 10))
        self.b.weight = self.a.weight

    def forward(self, x):
        return self.fc(self.b(self.a(self.stem(x))).mean((2, 3)))


class _DeepSupervision(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.body, self.fc = nn.Conv2d(3, 8, 3, padding=1), nn.Linear(8, 10)
        self.aux = nn.Linear(8 * 16 * 16, 10)  # read in training only
        self.unused = nn.Linear(100, 100)

    def forward(self, x):
        x = self.body(x)
        if self.training:
            return self.fc(x.mean((2, 3))) + self.aux(torch.flatten(x, 1))
        return self.fc(x.mean((2, 3)))


class _Leftover(_DeepSupervision):
    def forward(self, x):
        return self.fc(self.body(x).mean((2, 3)))


class _FlattensTheBatch(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv, self.fc = nn.Conv2d(3, 2, 3, padding=1), nn.Linear(2 * 2 * 4 * 4, 10)

    def forward(self, x):
        return self.fc(torch.flatten(self.conv(x)))


def test_modules_a_description_cannot_follow_say_so_and_unused_weights_are_counted():
    """Two layers holding one parameter were described with two sets of weights; an auxiliary head under ``if
    self.training`` was dropped silently (the forward of evaluation is traced); a flatten over the batch ended in an
    IndexError traceback; weights no layer reads went unsaid. (One layer called three times is described:
    tests/test_shared_layers.py.)"""
    with pytest.raises(UserError, match=r"^tied: layers 'a' and 'b' hold one parameter \(tied weights\); a description "
                                        r"gives each layer weights of its own, which would count it twice$"):
        describe(_Tied(), [3, 16, 16], "tied")  # was described with 1,290 parameters of its 714
    with pytest.raises(UserError, match=r"^deepsup: its forward calls aux in training only \(an `if self.training` "
                                        r"branch\)"):
        describe(_DeepSupervision(), [3, 16, 16], "deepsup")
    leftover = describe(_Leftover(), [3, 16, 16], "leftover")
    assert leftover.extra["unused_params"] == 8 * 16 * 16 * 10 + 10 + 100 * 100 + 100
    frozen = _Leftover()
    frozen.body.requires_grad_(False)  # fine-tuning the head alone: counted, so that predict can say so
    assert describe(frozen, [3, 16, 16], "frozen").extra["frozen_params"] == 3 * 8 * 9 + 8
    assert "unused_params" not in describe(build_zoo_model("resnet18", 10), [3, 32, 32], "r18").extra
    with pytest.raises(UserError, match=r"^flat: cannot describe node flatten \(ValueError: a flatten of every "
                                        r"dimension merges the batch"):
        describe(_FlattensTheBatch(), [3, 4, 4], "flat")


class _Unchanged(nn.Module):
    """A parametrization that returns its tensor as it is."""

    def forward(self, w):
        return w


@pytest.mark.filterwarnings("ignore::FutureWarning")  # torch.nn.utils.weight_norm, the older of the two
def test_a_reparametrised_weight_is_read_not_unused():
    """A parametrized layer holds its weight as ``parametrizations.weight.original``, read by the layer's call: not
    unused (weight_norm's gains were said to be read by no layer, and predict called them left out; weight_norm of
    dim 0 is the conv2d's attr weight_norm since 2026-12-01, its gains counted, test_ir_research_blocks)."""
    for weight_norm in (nn.utils.parametrizations.weight_norm, nn.utils.weight_norm):
        module = nn.Sequential(weight_norm(nn.Conv2d(3, 8, 3)), nn.ReLU(), nn.AdaptiveAvgPool2d(1), nn.Flatten())
        desc = describe(module, [3, 8, 8], "wn")
        assert "unused_params" not in desc.extra and desc.params == 8 * 3 * 9 + 8 + 8
    conv = nn.Conv2d(3, 8, 3)
    nn.utils.parametrize.register_parametrization(conv, "weight", _Unchanged())
    module = nn.Sequential(conv, nn.ReLU(), nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(8, 4), nn.Linear(4, 4))
    assert "unused_params" not in describe(module, [3, 8, 8], "wn").extra
    assert describe(_WithSpare(module), [3, 8, 8], "wn").extra["unused_params"] == 4 * 4 + 4


class _Scaled(nn.Module):
    """A network that scales its input in its forward, in one of the ways users write it."""

    def __init__(self, scaling: str) -> None:
        super().__init__()
        self.conv, self.fc, self.scaling = nn.Conv2d(3, 4, 3), nn.Linear(4, 2), scaling

    def forward(self, x):
        if self.scaling == "operators":
            x = (x.float() - 0.5) / 0.25
        elif self.scaling == "methods":
            x = x.to(torch.float32).sub(2).div_(4)
        elif self.scaling == "number minus tensor":
            x = 1 - x
        elif self.scaling == "tensor by tensor":
            x = x / (x + 1)
        elif self.scaling == "floor":
            x = torch.div(x, 2, rounding_mode="floor")
        elif self.scaling == "half":
            x = x.to(torch.float16).float()
        elif self.scaling == "type_as":
            x = (x - 0.5).type_as(x).type_as(self.conv.weight)
        return self.fc(self.conv(x).mean((2, 3)))


def test_a_tensor_less_or_over_a_number_and_a_cast_to_float32_are_described():
    """``(x - 0.5) / 0.25``, ``x.sub(2)``, ``x.float()``, ``y.type_as(x)`` were refused as ops without a description
    op (sub, truediv, float, type_as): they are an add and a multiply by a number and the tensor itself; what they are
    not is named."""
    for scaling, scalars in (("operators", [("add", -0.5), ("mul", 4.0)]), ("methods", [("add", -2.0), ("mul", 0.25)]),
                             ("number minus tensor", [("mul", -1.0), ("add", 1.0)]),  # the tensor negated, added
                             ("tensor by tensor", [("add", 1.0)]),  # and a div
                             ("type_as", [("add", -0.5)])):  # type_as of a float32 tensor or weight: itself
        module = _Scaled(scaling).eval()
        desc = describe(module, [3, 8, 8], scaling)
        assert [(n.op, n.attrs["scalar"]) for n in desc.nodes if "scalar" in n.attrs] == scalars
        _assert_same_function(desc, module, [3, 8, 8])
    for scaling, words in (("floor", "a div of anything but a tensor by a number"),
                           ("half", "a cast other than to float32")):
        with pytest.raises(UserError, match=f"cannot describe node .*{words}"):
            describe(_Scaled(scaling), [3, 8, 8], scaling)


class _Leaky(nn.Module):
    """Leaky ReLUs as a layer (in place) and as calls (out of place, and in place)."""

    def __init__(self) -> None:
        super().__init__()
        self.c1, self.c2, self.fc = nn.Conv2d(3, 8, 3), nn.Conv2d(8, 8, 3), nn.Linear(8, 2)
        self.act = nn.LeakyReLU(0.2, inplace=True)

    def forward(self, x):
        x = F.leaky_relu(self.c2(self.act(self.c1(x))), negative_slope=0.1)
        return self.fc(F.leaky_relu(x, 0.3, True).mean((2, 3)))


def test_a_leaky_relu_is_described_with_its_slope():
    """LeakyReLU (a GAN discriminator's, a YOLO backbone's activation) was refused as a layer without a description
    op; it is one, its slope and in-place flag kept, and the module rebuilt from it computes what the layer did."""
    module = _Leaky().eval()
    desc = NetworkDescription.from_dict(describe(module, [3, 10, 10], "leaky").to_dict())
    assert [n.attrs for n in desc.nodes if n.op == "leaky_relu"] == [
        {"negative_slope": 0.2, "inplace": True}, {"negative_slope": 0.1}, {"negative_slope": 0.3, "inplace": True}]
    _assert_same_function(desc, module, [3, 10, 10])
    broken = desc.to_dict()
    next(n for n in broken["nodes"] if n["op"] == "leaky_relu")["attrs"]["negative_slope"] = "steep"
    with pytest.raises(UserError, match="negative_slope"):
        NetworkDescription.from_dict(broken)


class _Elu(nn.Module):
    """ELUs as a layer (in place) and as calls (out of place, and in place)."""

    def __init__(self) -> None:
        super().__init__()
        self.c1, self.c2, self.fc = nn.Conv2d(3, 8, 3), nn.Conv2d(8, 8, 3), nn.Linear(8, 2)
        self.act = nn.ELU(0.5, inplace=True)

    def forward(self, x):
        x = F.elu(self.c2(self.act(self.c1(x))), alpha=2.0)
        return self.fc(F.elu(x, 1.5, True).mean((2, 3)))


def test_an_elu_is_described_with_its_alpha():
    """ELU was refused as a layer without a description op; it is one, its alpha and in-place flag kept, and the
    module rebuilt from it computes what the layer did."""
    module = _Elu().eval()
    desc = NetworkDescription.from_dict(describe(module, [3, 10, 10], "elu").to_dict())
    assert [n.attrs for n in desc.nodes if n.op == "elu"] == [
        {"alpha": 0.5, "inplace": True}, {"alpha": 2.0}, {"alpha": 1.5, "inplace": True}]
    _assert_same_function(desc, module, [3, 10, 10])
    broken = desc.to_dict()
    next(n for n in broken["nodes"] if n["op"] == "elu")["attrs"]["alpha"] = "steep"
    with pytest.raises(UserError, match="alpha"):
        NetworkDescription.from_dict(broken)


class _Softplus(nn.Module):
    """Softplus as a layer and as a call of torch's defaults."""

    def __init__(self) -> None:
        super().__init__()
        self.c1, self.c2, self.fc = nn.Conv2d(3, 8, 3), nn.Conv2d(8, 8, 3), nn.Linear(8, 2)
        self.act = nn.Softplus(2.0, 5.0)

    def forward(self, x):
        return self.fc(F.softplus(self.c2(self.act(self.c1(x)))).mean((2, 3)))


def test_a_softplus_is_described_with_its_beta_and_threshold():
    """Softplus was refused as a layer without a description op; it is one, its beta and threshold kept, and the
    module rebuilt from it computes what the layer did."""
    module = _Softplus().eval()
    desc = NetworkDescription.from_dict(describe(module, [3, 10, 10], "softplus").to_dict())
    assert [n.attrs for n in desc.nodes if n.op == "softplus"] == [
        {"beta": 2.0, "threshold": 5.0}, {"beta": 1.0, "threshold": 20.0}]
    _assert_same_function(desc, module, [3, 10, 10])
    broken = desc.to_dict()
    next(n for n in broken["nodes"] if n["op"] == "softplus")["attrs"]["beta"] = "steep"
    with pytest.raises(UserError, match="beta"):
        NetworkDescription.from_dict(broken)


class _Mish(nn.Module):
    """Mish as a layer (in place) and as calls (out of place, and in place)."""

    def __init__(self) -> None:
        super().__init__()
        self.c1, self.c2, self.fc = nn.Conv2d(3, 8, 3), nn.Conv2d(8, 8, 3), nn.Linear(8, 2)
        self.act = nn.Mish(inplace=True)

    def forward(self, x):
        x = F.mish(self.c2(self.act(self.c1(x))))
        return self.fc(F.mish(x, inplace=True).mean((2, 3)))


def test_a_mish_is_described_with_its_inplace_flag():
    """Mish was refused as a layer without a description op; it is one, its in-place flag kept, and the module
    rebuilt from it computes what the layer did."""
    module = _Mish().eval()
    desc = NetworkDescription.from_dict(describe(module, [3, 10, 10], "mish").to_dict())
    assert [n.attrs for n in desc.nodes if n.op == "mish"] == [{"inplace": True}, {}, {"inplace": True}]
    rebuilt = build_module(desc)
    assert [m.inplace for m in rebuilt.modules() if isinstance(m, nn.Mish)] == [True, False, True]
    _assert_same_function(desc, module, [3, 10, 10])
    broken = desc.to_dict()
    next(n for n in broken["nodes"] if n["op"] == "mish")["attrs"]["inplace"] = "often"
    with pytest.raises(UserError, match="inplace"):
        NetworkDescription.from_dict(broken)


class _GroupNorms(nn.Module):
    """Group norms as a layer, as calls on the module's own weight and bias and on none, and on a flat vector."""

    def __init__(self) -> None:
        super().__init__()
        self.c1, self.gn = nn.Conv2d(3, 8, 3), nn.GroupNorm(4, 8)
        self.c2 = nn.Conv2d(8, 16, 3)
        self.own = nn.Module()  # the call's weight and bias, in node order (after c2's)
        self.own.weight, self.own.bias = nn.Parameter(torch.rand(16) + 0.5), nn.Parameter(torch.randn(16))
        self.fc, self.flat = nn.Linear(16, 6), nn.GroupNorm(3, 6, eps=1e-3)
        nn.init.uniform_(self.gn.weight, 0.5, 1.5), nn.init.normal_(self.gn.bias)

    def forward(self, x):
        x = F.group_norm(self.c2(torch.relu(self.gn(self.c1(x)))), 2, self.own.weight, self.own.bias, 1e-4)
        return self.flat(self.fc(F.group_norm(x, 8).mean((2, 3))))


def test_a_group_norm_is_described_with_its_groups_and_channels():
    """GroupNorm was refused as a layer without a description op; it is one, its groups, channels, eps and affine
    flag kept, its weight and bias counted, and the module rebuilt from it computes what the layers did. A group
    count that does not divide the channels, or channels other than the input's, are refused when read."""
    torch.manual_seed(0)
    module = _GroupNorms().eval()
    desc = NetworkDescription.from_dict(describe(module, [3, 10, 10], "groupnorm").to_dict())
    assert [n.attrs for n in desc.nodes if n.op == "groupnorm"] == [
        {"num_groups": 4, "num_channels": 8}, {"num_groups": 2, "num_channels": 16, "eps": 1e-4},
        {"num_groups": 8, "num_channels": 16, "affine": False}, {"num_groups": 3, "num_channels": 6, "eps": 1e-3}]
    assert desc.params == sum(p.numel() for p in module.parameters())
    _assert_same_function(desc, module, [3, 10, 10])
    for attr, value, match in (("num_groups", 3, "does not divide"), ("num_channels", 4, "num_channels 4 but"),
                               ("eps", "tiny", "eps")):
        broken = desc.to_dict()
        next(n for n in broken["nodes"] if n["op"] == "groupnorm")["attrs"][attr] = value
        with pytest.raises(UserError, match=match):
            NetworkDescription.from_dict(broken)


class _SmallUNet(nn.Module):
    """A U-Net's levels: convolutions down, transposed convolutions up (a layer given its output size at the call, a
    grouped call on the module's own weight and bias, a dilated one with an output padding), skips concatenated."""

    def __init__(self, side: int) -> None:
        super().__init__()
        self.odd = side % 2  # an odd side: the grouped call pads by 1 and adds an output padding of 1
        self.down1, self.down2 = nn.Conv2d(3, 8, 3, padding=1), nn.Conv2d(8, 16, 3, stride=2, padding=1)
        self.up = nn.ConvTranspose2d(16, 8, 3, stride=2, padding=1)
        self.own = nn.Module()  # the call's weight [Cin, Cout / groups, kh, kw] and bias, in node order (after up's)
        self.own.weight, self.own.bias = nn.Parameter(torch.randn(16, 2, 2, 2)), nn.Parameter(torch.randn(8))
        self.wide = nn.ConvTranspose2d(24, 4, 3, stride=1, padding=2, output_padding=1, dilation=2, bias=False)
        self.head = nn.Conv2d(4, 2, 1)

    def forward(self, x):
        skip = torch.relu(self.down1(x))
        low = torch.relu(self.down2(skip))
        up = self.up(low, output_size=skip.shape[2:])  # 15 at an odd side: an output padding of 0; 16: of 1
        grouped = F.conv_transpose2d(low, self.own.weight, self.own.bias, 2, self.odd, self.odd, 4)
        return self.head(self.wide(torch.cat([skip, up, grouped], 1)))


@pytest.mark.parametrize("side", [15, 16])
def test_a_transposed_convolution_is_described_and_rebuilt(side):
    """ConvTranspose2d (a U-Net's, an FCN's or a GAN generator's upsampling) was refused as a layer without a
    description op; it is the op conv_transpose2d, as a layer and as F.conv_transpose2d on the module's own weight,
    its channels, kernel, stride, padding, output padding (an output size given at the call read into it), dilation,
    groups and bias kept and its weight counted, and the module rebuilt from it computes what the layers did."""
    torch.manual_seed(0)
    module = _SmallUNet(side).eval()
    desc = NetworkDescription.from_dict(describe(module, [3, side, side], "unet").to_dict())
    transposed = [n for n in desc.nodes if n.op == "conv_transpose2d"]
    assert [n.attrs for n in transposed] == [
        {"in_channels": 16, "out_channels": 8, "kernel_size": [3, 3], "stride": [2, 2], "padding": [1, 1],
         "output_padding": [side - 15] * 2, "dilation": [1, 1], "groups": 1, "bias": True, "output_size_of": "relu"},
        {"in_channels": 16, "out_channels": 8, "kernel_size": [2, 2], "stride": [2, 2], "padding": [side % 2] * 2,
         "output_padding": [side % 2] * 2, "dilation": [1, 1], "groups": 4, "bias": True},
        {"in_channels": 24, "out_channels": 4, "kernel_size": [3, 3], "stride": [1, 1], "padding": [2, 2],
         "output_padding": [1, 1], "dilation": [2, 2], "groups": 1, "bias": False}]
    assert [n.output_shape for n in transposed] == [[8, side, side], [8, side, side], [4, side + 1, side + 1]]
    assert desc.params == sum(p.numel() for p in module.parameters())
    _assert_same_function(desc, module, [3, side, side])


def test_a_transposed_convolution_s_attrs_are_checked_when_read():
    """An output padding torch refuses to run (not smaller than the stride or the dilation), groups that do not
    divide the channels, channels other than the input's, or a padding that leaves no output, are refused by name."""
    desc = describe(nn.Sequential(nn.ConvTranspose2d(3, 8, 4, stride=2, padding=1), nn.Conv2d(8, 2, 1)),
                    [3, 8, 8], "up")
    assert desc.nodes[1].output_shape == [8, 16, 16]
    for attr, value, match in (("output_padding", [2, 0], r"output_padding \[2, 0\] must be smaller"),
                               ("groups", 3, "groups 3 does not divide"), ("in_channels", 4, "in_channels 4 but"),
                               ("padding", 9, "leaves no output")):
        broken = desc.to_dict()
        broken["nodes"][1]["attrs"][attr] = value
        broken.pop("params")
        with pytest.raises(UserError, match=match):
            NetworkDescription.from_dict(broken)
    # torch's meta kernel, which describe's shapes come from, takes what its CPU and CUDA kernels refuse
    with pytest.raises(UserError, match=r"output_padding \[1, 1\] must be smaller than either the stride \[1, 1\] "
                                        r"or the dilation \[1, 1\]"):
        describe(nn.Sequential(nn.ConvTranspose2d(3, 8, 3, output_padding=1)), [3, 8, 8], "bad")


class _StyleBlock(nn.Module):
    """A style-transfer network's blocks: conv, InstanceNorm2d (affine, and torch's default without weights), ReLU;
    an instance norm call on the module's own weight and bias; a residual; a hardtanh of [-1, 1] in place and of
    [-0.5, 2] as a call; a ReLU6 written as a hardtanh of [0, 6]."""

    def __init__(self) -> None:
        super().__init__()
        self.c1, self.n1 = nn.Conv2d(3, 8, 3, padding=1), nn.InstanceNorm2d(8, affine=True)
        self.c2, self.n2 = nn.Conv2d(8, 8, 3, padding=1), nn.InstanceNorm2d(8, eps=1e-3)
        self.c3 = nn.Conv2d(8, 8, 3, padding=1)
        self.own = nn.Module()  # the call's weight and bias, in node order (after c3's)
        self.own.weight, self.own.bias = nn.Parameter(torch.rand(8) + 0.5), nn.Parameter(torch.randn(8))
        self.clamp, self.six, self.fc = nn.Hardtanh(inplace=True), nn.Hardtanh(0.0, 6.0), nn.Linear(8, 4)
        nn.init.uniform_(self.n1.weight, 0.5, 1.5), nn.init.normal_(self.n1.bias)

    def forward(self, x):
        x = torch.relu(self.n1(self.c1(x)))
        y = F.instance_norm(self.c3(torch.relu(self.n2(self.c2(x)))), weight=self.own.weight, bias=self.own.bias)
        y = self.six(F.hardtanh(self.clamp(x + y) * 3, -0.5, 2.0))
        return self.fc(y.mean((2, 3)))


def test_instance_norms_and_hardtanhs_are_described_and_rebuilt():
    """InstanceNorm2d and Hardtanh (of any range) were refused as layers without a description op; they are the
    ops instancenorm (eps and affine kept, its weight and bias counted) and hardtanh (its range and in-place flag
    kept), a hardtanh of [0, 6] the op relu6; the module rebuilt from the description computes what the layers
    did. Channels other than the input's, a range that is empty, are refused when read."""
    torch.manual_seed(0)
    module = _StyleBlock().eval()
    desc = NetworkDescription.from_dict(describe(module, [3, 10, 10], "style").to_dict())
    assert [n.attrs for n in desc.nodes if n.op == "instancenorm"] == [
        {"num_features": 8, "affine": True}, {"num_features": 8, "eps": 1e-3}, {"num_features": 8, "affine": True}]
    assert [n.attrs for n in desc.nodes if n.op == "hardtanh"] == [
        {"min_val": -1.0, "max_val": 1.0, "inplace": True}, {"min_val": -0.5, "max_val": 2.0}]
    assert [n.op for n in desc.nodes][-6:] == ["hardtanh", "mul", "hardtanh", "relu6", "mean", "linear"]
    assert desc.params == sum(p.numel() for p in module.parameters())
    _assert_same_function(desc, module, [3, 10, 10])
    for op, attr, value, match in (("instancenorm", "num_features", 4, "num_features 4 needs"),
                                   ("instancenorm", "affine", "yes", "affine"),
                                   ("hardtanh", "min_val", 1.0, "is not below max_val"),
                                   ("hardtanh", "max_val", None, "max_val")):
        broken = desc.to_dict()
        next(n for n in broken["nodes"] if n["op"] == op)["attrs"][attr] = value
        with pytest.raises(UserError, match=match):
            NetworkDescription.from_dict(broken)


def test_a_plain_instance_norm_of_another_width_is_described_with_its_input_s_channels():
    """torch leaves a plain (not affine) InstanceNorm2d's num_features unused, a mismatch with its input only warned
    of, and runs it; describe wrote its num_features down, a description its own load refused. Its channels are its
    input's now, and the module rebuilt computes what it did."""
    module = nn.Sequential(nn.Conv2d(3, 8, 3), nn.InstanceNorm2d(4), nn.Conv2d(8, 2, 1)).eval()
    with pytest.warns(UserWarning, match="does not match num_features"):
        module(torch.randn(2, 3, 8, 8))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        desc = NetworkDescription.from_dict(describe(module, [3, 8, 8], "plain").to_dict())
        assert [n.attrs for n in desc.nodes if n.op == "instancenorm"] == [{"num_features": 8}]
        _assert_same_function(desc, module, [3, 8, 8])


def tracked_instance_norms() -> nn.Module:
    """Instance norms that track running statistics: one of the input (momentum None, torch's 0), one affine after a
    convolution, one plain of momentum 0.3 before a residual add."""
    class Tracked(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.n0 = nn.InstanceNorm2d(3, track_running_stats=True, momentum=None)
            self.c1, self.n1 = nn.Conv2d(3, 8, 3), nn.InstanceNorm2d(8, affine=True, track_running_stats=True)
            self.c2, self.n2 = nn.Conv2d(8, 8, 1), nn.InstanceNorm2d(8, track_running_stats=True, momentum=0.3)
            self.fc = nn.Linear(8, 4)

        def forward(self, x):
            x = torch.relu(self.n1(self.c1(self.n0(x))))
            return self.fc((self.n2(self.c2(x)) + x).mean((2, 3)))
    return Tracked()


def test_an_instance_norm_with_running_statistics_is_described_and_rebuilt():
    """An instance norm that tracks running statistics was refused by name: in training it normalises each sample by
    its own statistics as any instance norm, and updates its running mean and variance by its momentum from their
    mean over the batch; it is an instancenorm with track_running_stats (its momentum where not 0.1; None, which it
    runs as 0, is 0), rebuilt as one that computes what the original computes, its running statistics included, in
    training and then in evaluation, and describes back to the same nodes."""
    torch.manual_seed(0)
    original = tracked_instance_norms()
    desc = NetworkDescription.from_dict(describe(original, [3, 8, 8], "tracked").to_dict())
    assert [n.attrs for n in desc.nodes if n.op == "instancenorm"] == [
        {"num_features": 3, "track_running_stats": True, "momentum": 0.0},
        {"num_features": 8, "affine": True, "track_running_stats": True},
        {"num_features": 8, "track_running_stats": True, "momentum": 0.3}]
    assert desc.params == sum(p.numel() for p in original.parameters())
    rebuilt = build_module(desc)
    rebuilt.load_state_dict(original.state_dict())
    x = torch.randn(2, 3, 8, 8) * 2 + 1
    assert torch.allclose(rebuilt.train()(x), original.train()(x), atol=1e-6)
    for name in ("n0", "n1", "n2"):
        assert torch.allclose(rebuilt.get_submodule(name).running_mean, original.get_submodule(name).running_mean)
        assert torch.allclose(rebuilt.get_submodule(name).running_var, original.get_submodule(name).running_var)
    assert not torch.equal(original.n2.running_mean, torch.zeros(8)) and torch.equal(original.n0.running_var,
                                                                                     torch.ones(3))
    assert torch.allclose(rebuilt.eval()(x), original.eval()(x), atol=1e-6)
    again = describe(rebuilt, [3, 8, 8], "tracked")
    assert [(n.op, n.attrs) for n in again.nodes] == [(n.op, n.attrs) for n in desc.nodes]
    broken = desc.to_dict()
    next(n for n in broken["nodes"] if n["op"] == "instancenorm")["attrs"]["momentum"] = 2
    with pytest.raises(UserError, match="momentum"):
        NetworkDescription.from_dict(broken)


class _SpatialSoftmaxHead(nn.Module):
    """A CNN whose head takes a softmax over each channel's pixels (a spatial softmax: keypoints' expected
    positions), an attention gate's softmax over the channels, and a softmax call on the features."""

    def __init__(self) -> None:
        super().__init__()
        self.body = nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.ReLU(), nn.Conv2d(8, 8, 3, padding=1))
        self.gate, self.spatial = nn.Softmax(dim=1), nn.Softmax(dim=-1)
        self.fc = nn.Linear(8, 5)

    def forward(self, x):
        f = self.body(x)
        f = f * self.gate(f)
        p = self.spatial(f.flatten(2))  # [N, C, H*W]
        return self.fc(F.softmax(p * 10.0, dim=-1).mean(2).softmax(1))


def test_a_spatial_softmax_head_is_described_and_rebuilt():
    """A softmax inside the network (nn.Softmax, F.softmax, x.softmax) was refused as a layer without a description
    op; it is the op softmax, its dim counted from the front (a negative one normalised), and the rebuilt module
    computes what the original did. A softmax over the batch is refused, by name."""
    torch.manual_seed(0)
    module = _SpatialSoftmaxHead().eval()
    desc = NetworkDescription.from_dict(describe(module, [3, 6, 6], "spatial").to_dict())
    assert [n.attrs for n in desc.nodes if n.op == "softmax"] == [{"dim": 1}, {"dim": 2}, {"dim": 2}, {"dim": 1}]
    _assert_same_function(desc, module, [3, 6, 6])
    broken = desc.to_dict()
    next(n for n in broken["nodes"] if n["op"] == "softmax")["attrs"]["dim"] = 0
    with pytest.raises(UserError, match="dim"):
        NetworkDescription.from_dict(broken)
    with pytest.raises(UserError, match="softmax over the batch"):
        describe(nn.Sequential(nn.Flatten(), nn.Softmax(dim=0)), [3, 6, 6], "batch")


class _WithSpare(nn.Module):
    """``body`` and a layer its forward never calls."""

    def __init__(self, body: nn.Module) -> None:
        super().__init__()
        self.body, self.spare = body, nn.Linear(4, 4)

    def forward(self, x):
        return self.body(x)


@pytest.mark.filterwarnings("ignore:Using padding='same' with even kernel")
class _SpareDouble(nn.Module):
    """A float32 network beside float64 tensors its forward never reads: a step counter, a spare head."""

    def __init__(self) -> None:
        super().__init__()
        self.conv, self.fc, self.spare = nn.Conv2d(3, 8, 3), nn.Linear(8, 10), nn.Linear(8, 10).double()
        self.register_buffer("steps", torch.zeros((), dtype=torch.float64))

    def forward(self, x):
        return self.fc(self.conv(x).mean((2, 3)))


def test_float64_tensors_the_forward_never_reads_do_not_refuse_a_float32_network():
    """Only what the forward reads is of the step: a float64 buffer or layer beside it described before the float32
    check, as the layers it leaves out are (unused_params); one it calls is refused, naming it."""
    desc = describe(_SpareDouble(), [3, 16, 16], "spare")
    assert [n.op for n in desc.nodes] == ["input", "conv2d", "mean", "linear"] and desc.extra["unused_params"] == 90
    model = _SpareDouble()
    model.fc = model.fc.double()
    with pytest.raises(UserError, match=r"^spare: fc.weight is float64, and a description is of a float32 training "
                                        r"step"):
        describe(model, [3, 16, 16], "spare")


def test_same_and_valid_padding_are_described_as_numbers():
    """``padding='same'`` was refused without naming the network; it is half the dilated kernel each side where that
    is whole, and refused naming the node where torch pads one side more."""
    torch.manual_seed(0)
    module = nn.Sequential(nn.Conv2d(3, 4, 5, padding="same", dilation=2), nn.Conv2d(4, 4, 3, padding="valid"),
                           nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(4, 3)).eval()
    desc = describe(module, [3, 12, 12], "padded")
    assert [n.attrs["padding"] for n in desc.nodes if n.op == "conv2d"] == [[4, 4], [0, 0]]
    _assert_same_function(desc, module, [3, 12, 12])
    uneven = nn.Sequential(nn.Conv2d(3, 4, 4, padding="same"), nn.Flatten(), nn.Linear(4 * 6 * 6, 2))
    with pytest.raises(UserError, match=r"^uneven: cannot describe node _0 \(ValueError: a convolution with "
                                        r"padding='same' and kernel \[4, 4\]"):
        describe(uneven, [3, 6, 6], "uneven")


def test_a_module_with_lazy_layers_is_described_on_a_copy():
    """Describing made a LazyLinear's weights in the caller's module, at the description's shape, and moved torch's
    random state."""
    module = nn.Sequential(nn.Conv2d(3, 8, 3), nn.Flatten(), nn.LazyLinear(10))
    state = torch.random.get_rng_state()
    desc = describe(module, [3, 8, 8], "lazy")
    assert desc.params == 3 * 8 * 9 + 8 + 8 * 6 * 6 * 10 + 10 and "unused_params" not in desc.extra
    assert isinstance(module[2], nn.LazyLinear) and torch.equal(state, torch.random.get_rng_state())


def test_a_module_with_lazy_batch_norms_is_described_on_a_copy():
    """Describing a LazyBatchNorm2d failed with torch's ValueError (it cannot deep-copy an uninitialised buffer), and
    a LazyBatchNorm1d that is not affine (lazy buffers, no lazy parameter) was made in the caller's module: both are
    described on a copy, the caller's layers left lazy and torch's random state as it was."""
    module = nn.Sequential(nn.Conv2d(3, 8, 3), nn.LazyBatchNorm2d(eps=1e-3), nn.Flatten(), nn.Linear(8 * 6 * 6, 16),
                           nn.LazyBatchNorm1d(affine=False), nn.Linear(16, 10))
    state = torch.random.get_rng_state()
    desc = describe(module, [3, 8, 8], "lazy_norms")
    assert [(n.attrs, n.output_shape) for n in desc.nodes if n.op == "batchnorm2d"] == [
        ({"num_features": 8, "eps": 1e-3}, [8, 6, 6]), ({"num_features": 16, "affine": False}, [16])]
    assert desc.params == 3 * 8 * 9 + 8 + 2 * 8 + 8 * 6 * 6 * 16 + 16 + 16 * 10 + 10
    assert isinstance(module[1].running_mean, nn.parameter.UninitializedBuffer)
    assert isinstance(module[4].running_var, nn.parameter.UninitializedBuffer)
    assert torch.equal(state, torch.random.get_rng_state())


class _LoggedBranch(nn.Module):
    """A convolution with an observing hook that holds a lock (the model cannot be deep-copied, so its shapes are
    propagated on the module itself, on real numbers), then dropout in a branch drawn by Python's ``random``."""

    def __init__(self) -> None:
        super().__init__()
        self.conv, self.drop, self.head = nn.Conv2d(3, 8, 3), nn.Dropout(), nn.Linear(8, 4)
        self.lock, self.seen = threading.Lock(), []
        self.conv.register_forward_hook(self._observe)

    def _observe(self, module, args, out) -> None:
        with self.lock:
            self.seen.append(tuple(out.shape))

    def forward(self, x):
        x = self.conv(x)
        if random.random() < 2:
            x = self.drop(x)
        return self.head(x.mean((2, 3)))


def test_describing_leaves_the_random_states_as_they_were():
    """A model whose weightless copy cannot be made (a hook holding a lock) had its shapes propagated on random
    numbers drawn from torch's global generator, and a forward drawing a branch by Python's ``random`` drew at each
    trace: describing moved the caller's seeded streams. Both are put back now."""
    module = _LoggedBranch()
    torch_state, python_state = torch.random.get_rng_state(), random.getstate()
    desc = describe(module, [3, 8, 8], "logged")
    assert [n.op for n in desc.nodes if n.op in ("conv2d", "dropout", "linear")] == ["conv2d", "dropout", "linear"]
    assert torch.equal(torch_state, torch.random.get_rng_state()) and random.getstate() == python_state


class _Normalized(nn.Module):
    """A cosine classifier's head: its embedding scaled to unit length by ``norm`` (a function of the embedding)."""

    def __init__(self, norm) -> None:
        super().__init__()
        self.conv, self.embed, self.norm = nn.Conv2d(3, 8, 3), nn.Linear(8, 16), norm

    def forward(self, x):
        return self.norm(self.embed(self.conv(x).mean((2, 3))))


@pytest.mark.parametrize("p", [1, 3])
def test_a_normalisation_is_refused_naming_the_ops_that_describe_it(p):
    """F.normalize of a p other than 2 (p 2 is the op normalize) was refused as a call without a description op,
    saying no more: its refusal names the ops that compute the same (as F.normalize does, to float32's rounding) and
    describe."""
    with pytest.raises(UserError) as refused:
        describe(_Normalized(lambda y: F.normalize(y, p=p, dim=1)), [3, 8, 8], "normalized")
    rewrite = re.search(r"; x / (.+?) computes the same", str(refused.value)).group(1)
    hinted = eval(f"lambda x, p, dim=1: x / {rewrite}")  # the refusal's own words, as a user would paste them
    torch.manual_seed(0)
    y = torch.randn(4, 16)
    assert torch.allclose(hinted(y, p), F.normalize(y, p=p, dim=1), atol=1e-6)
    ops = [n.op for n in describe(_Normalized(lambda y: hinted(y, p)), [3, 8, 8], "rewritten").nodes]
    assert ops[-2:] == ["hardtanh", "div"] and "pow" in ops


def test_every_optional_attr_the_readme_names_is_known():
    """The optional attributes the README lists (and from_torch writes) are read; a typo of one is not."""
    from perf4sight.ir.schema import known_attrs

    for op, attrs in {"relu": ["inplace"], "relu6": ["inplace"],
                      "batchnorm2d": ["eps", "momentum", "affine", "track_running_stats", "training"],
                      "instancenorm": ["use_input_stats"], "fold": ["output_size_of"],
                      "gelu": ["approximate"], "maxpool2d": ["dilation"], "layernorm": ["eps", "elementwise_affine"],
                      "interpolate": ["align_corners"], "attention": ["dropout"], "add": ["scalar"],
                      "window_attention": ["attention_dropout", "dropout", "cosine", "position_bias_mlp"]}.items():
        assert set(attrs) <= set(known_attrs(op)), op
    bn = describe(nn.Sequential(nn.Conv2d(3, 4, 3), nn.BatchNorm2d(4)), [3, 5, 5], name="bn").to_dict()
    bn["nodes"][2]["attrs"]["afine"] = False
    with pytest.raises(UserError, match=r"\(batchnorm2d\): unknown attr 'afine' \(known: num_features, affine, "
                                        r"track_running_stats, training, eps, momentum, shares\)"):
        NetworkDescription.from_dict(bn)


def test_describing_leaves_every_layers_mode_as_it_was():
    """Describing set every layer of the caller's module to the module's own mode afterwards: a model trained with its
    batch norms frozen in eval mode (fine-tuning) came back with them training, and one in eval mode with a layer
    left training came back with it in eval. Unused weights trace the forward in training too: the same."""
    frozen_bn = build_zoo_model("resnet18", 10).train()
    for m in frozen_bn.modules():
        if isinstance(m, nn.BatchNorm2d):
            m.eval()
    leftover = _Leftover().eval()
    leftover.fc.train()  # unused weights: its forward is traced in training as well
    for module in (frozen_bn, leftover):
        modes = {name: m.training for name, m in module.named_modules()}
        describe(module, [3, 16, 16], "mine")
        assert {name: m.training for name, m in module.named_modules()} == modes


class _TupleOps(nn.Module):
    """Ops that return a tuple of tensors, one of them taken by index or by name."""

    def __init__(self, pick) -> None:
        super().__init__()
        self.conv, self.fc, self.pick = nn.Conv2d(3, 8, 3, padding=1), nn.Linear(8, 10), pick

    def forward(self, x):
        return self.fc(self.pick(self.conv(x).flatten(2)))


@pytest.mark.parametrize("pick, named", [
    (lambda y: y.median(dim=2)[0], r"call_method 'median' \(node median\)"),  # (a max over a dim is described)
    (lambda y: torch.kthvalue(y, 1, 2)[0], r"call_function 'kthvalue' \(node kthvalue\)"),
    (lambda y: y.cummax(dim=2).values[:, :, 0], r"call_method 'cummax' \(node cummax\)"),
    (lambda y: torch.mode(y, dim=2)[0], r"call_function 'mode' \(node mode\)")])
def test_an_op_returning_a_tuple_is_named_itself_where_it_has_no_description_op(pick, named):
    """The part of a tuple an op returns was named instead of the op: 'call_function getitem (node getitem) has no
    description op' for ``x.median(dim=2)[0]`` (``x.max(dim=2)[0]`` then), 'getattr' for ``x.cummax(2).values`` (then
    ``x.topk(1).values``, which is the op topk since)."""
    with pytest.raises(UserError, match=rf"^tuple: {named} has no description op$"):
        describe(_TupleOps(pick), [3, 8, 8], "tuple")


class _TupleThenLrn(nn.Module):
    """An op without a description op that returns a tuple, both its parts used, then a layer without one."""

    def __init__(self) -> None:
        super().__init__()
        self.conv, self.act, self.fc = nn.Conv2d(3, 8, 3, padding=1), nn.ZeroPad3d(0), nn.Linear(8, 10)

    def forward(self, x):
        values, indices = self.conv(x).median(dim=2)  # (a max's values are described, its indices not)
        return self.fc(self.act((values + indices).unsqueeze(2)).mean((2, 3)))


def test_the_ops_after_a_tuple_without_a_description_op_are_named_too():
    """A part of such a tuple stopped the search at the op that made it: the layer after it went unnamed, and took
    another try to learn of; the op is named once, whichever parts are used."""
    with pytest.raises(UserError, match=r"^tuple: call_method 'median' \(node median\) and module 'act' of type "
                                        r"ZeroPad3d have no description op$"):
        describe(_TupleThenLrn(), [3, 8, 8], "tuple")


def test_every_kind_of_op_without_a_description_op_is_named_at_once():
    """Only the first layer of a kind the description has no op for was named: a network of three such kinds took
    three tries to learn them; a kind met again is counted, not listed."""
    module = nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.ZeroPad3d(0), nn.AvgPool3d(1),
                           nn.Conv2d(8, 8, 3, padding=1), nn.ZeroPad3d(0), nn.AdaptiveAvgPool2d(1), nn.Flatten(),
                           nn.Linear(8, 10))
    with pytest.raises(UserError, match=r"^mine: module '1' of type ZeroPad3d \(and 1 more\) and module '2' of "
                                        r"type AvgPool3d have no description op$"):
        describe(module, [3, 8, 8], "mine")
    module.extend([nn.MaxPool1d(1), nn.Unflatten(1, (10, 1, 1)), nn.MaxPool3d(1)])  # the last makes the output
    with pytest.raises(UserError, match=r"^mine: module '1' of type ZeroPad3d \(and 1 more\), module '2' of "
                                        r"type AvgPool3d, module '8' of type MaxPool1d and module '10' of "
                                        r"type MaxPool3d have no description op$"):
        describe(module, [3, 8, 8], "mine")


class _Squeezed(nn.Module):
    """A 1x1-convolution head squeezed to class scores: ``x.squeeze()``, or ``x.squeeze((2, 3))``."""

    def __init__(self, dims=None) -> None:
        super().__init__()
        self.conv, self.head, self.dims = nn.Conv2d(3, 8, 3, padding=1), nn.Conv2d(8, 10, 1), dims

    def forward(self, x):
        y = self.head(nn.functional.adaptive_avg_pool2d(self.conv(x), 1))
        return y.squeeze() if self.dims is None else y.squeeze(self.dims)


@pytest.mark.parametrize("dims", [None, (2, 3)])
def test_a_squeeze_of_every_unit_dimension_or_of_several_is_described(dims):
    """``x.squeeze()`` at a network's end failed as 'cannot describe node squeeze (TypeError: int() argument must be a
    string, a bytes-like object or a real number, not 'NoneType')'; it is the view to the shape it made of each
    image."""
    module = _Squeezed(dims).eval()
    desc = describe(module, [3, 8, 8], "squeezed")
    assert desc.node(desc.output).op == "reshape" and desc.num_classes == 10
    _assert_same_function(desc, module, [3, 8, 8])


class _AlongTheBatch(nn.Module):
    """A forward that works along the batch dimension (dim 0) at ``where``."""

    def __init__(self, where: str) -> None:
        super().__init__()
        self.conv, self.fc, self.where = nn.Conv2d(3, 8, 3, padding=1), nn.Linear(8, 10), where

    def forward(self, x):
        y = self.conv(x)
        if self.where == "cat":
            y = torch.cat([y, y])  # two copies of the batch, one after the other
        if self.where == "transpose":
            y = y.transpose(0, 1).transpose(0, 1)
        if self.where == "unsqueeze":
            y = y.unsqueeze(0).squeeze(0)
        if self.where == "mean":
            y = y * y.mean(0, keepdim=True)  # by the batch's mean
        return self.fc(y.mean((2, 3)))


@pytest.mark.parametrize("where, node, first", [("cat", "cat", 4), ("transpose", "transpose", 8),
                                                ("unsqueeze", "unsqueeze", 1), ("mean", "mean", 1)])
def test_a_forward_along_the_batch_dimension_is_refused_naming_the_node(where, node, first):
    """Ops along dim 0 were described silently with the batch of 2 images they were traced with in their shapes (a
    transpose(0, 1): [2, 8, 8] per image) or the batch counted once where they doubled it (a cat)."""
    with pytest.raises(UserError, match=rf"^along: {where} \(node {node}\) makes a first dimension of {first} of the "
                                        r"batch of 2 images it was traced with: it works along the batch dimension"):
        describe(_AlongTheBatch(where), [3, 8, 8], "along")


class _SkipJoins(nn.Module):
    """Concatenations of every form torch.fx records: torch.cat, torch.concat and torch.concatenate, a negative dim,
    a keyword dim, numpy's keyword axis, a tuple of three."""

    def __init__(self) -> None:
        super().__init__()
        self.a, self.b = nn.Conv2d(3, 4, 3, padding=1), nn.Conv2d(3, 6, 3, padding=1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        a, b = self.a(x), self.b(x)
        y = torch.cat([a, b], 1)
        y = torch.concat((y, a, x), dim=-3)
        return torch.concatenate([y, b], axis=1)


class _CommonCalls(nn.Module):
    """A user's network of the layers and calls whose meta kernels are torch's Python references: a residual add, a
    number less and over it, an in-place add, functional ReLU and tanh, a ReLU method, instance, group and layer
    norms, a hardtanh, a mean, an adaptive average pool (the layer and the call), concatenations."""

    def __init__(self) -> None:
        super().__init__()
        self.joins = _SkipJoins()
        self.c = nn.Conv2d(23, 8, 3, padding=1)
        self.inorm, self.gnorm, self.lnorm = nn.InstanceNorm2d(8, affine=True), nn.GroupNorm(2, 8), nn.LayerNorm(8)
        self.clamp, self.pool, self.fc = nn.Hardtanh(-2.0, 2.0), nn.AdaptiveAvgPool2d((None, 2)), nn.Linear(8, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = F.relu(self.c(self.joins(x)))
        y = self.gnorm(self.inorm(y)) + y
        y.add_(y / 2 - 1.0)
        y = torch.tanh(self.clamp(y * 0.5)).relu()
        z = self.pool(y)
        t = self.lnorm(z.mean(3).transpose(1, 2))
        return self.fc(t.mean(1)) + F.adaptive_avg_pool2d(y, 1).flatten(1)[:, :3]


def test_meta_shape_propagation_records_the_shapes_torch_computes():
    """The layers and calls the meta shape propagation answers itself record each node's shape and type as torch's
    shape propagation does on a real forward."""
    from torch.fx.passes.shape_prop import ShapeProp

    from perf4sight.ir.meta_shapes import MetaShapeProp

    module = _CommonCalls().eval()
    real, meta = torch.fx.symbolic_trace(module), torch.fx.symbolic_trace(copy.deepcopy(module).to("meta"))
    ShapeProp(real).propagate(torch.randn(2, 3, 8, 8))
    MetaShapeProp(meta).propagate(torch.empty(2, 3, 8, 8, device="meta"))
    recorded = [[(n.name, tuple(n.meta["tensor_meta"].shape), n.meta["tensor_meta"].dtype)
                 for n in gm.graph.nodes if hasattr(n.meta.get("tensor_meta"), "shape")] for gm in (real, meta)]
    assert len(recorded[0]) == 29 and recorded[0] == recorded[1]


class _ChannelsLast(nn.Module):
    """A map made channels-last (as a permute of an [N, H, W, C] tensor back to [N, C, H, W] makes it), then a layer
    or call of it, then a ``view`` to [N, -1]."""

    def __init__(self, op) -> None:
        super().__init__()
        self.op, self.bn, self.pool = op, nn.BatchNorm2d(3), nn.AdaptiveAvgPool2d(2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.op(self, x.contiguous(memory_format=torch.channels_last)).view(x.shape[0], -1)


@pytest.mark.parametrize("op", [lambda m, y: torch.cat([y, y], 1), lambda m, y: m.pool(y),
                                lambda m, y: F.adaptive_avg_pool2d(y, 2), lambda m, y: m.bn(y)])
def test_a_concatenation_norm_or_pool_of_a_channels_last_map_keeps_its_layout_as_torch_does(op):
    """torch's concatenation, batch norm and adaptive average pool of channels-last maps give a channels-last output,
    which a ``view`` then refuses: the meta shape propagation answered them with a contiguous tensor, and a network
    torch cannot run was described. Its forward fails now as torch's does."""
    module = _ChannelsLast(op).eval()
    with pytest.raises(RuntimeError, match="view size is not compatible"):
        module(torch.randn(2, 3, 6, 6))
    with pytest.raises(UserError, match="view size is not compatible"):
        describe(module, [3, 6, 6], "channels_last")


class _ViewedAfter(nn.Module):
    """A layer or call on a map, then a ``view`` of its result to [N, -1]."""

    def __init__(self, op) -> None:
        super().__init__()
        self.c, self.act, self.fc, self.op = nn.Conv2d(3, 4, 3, padding=1), nn.ReLU(), nn.Linear(4 * 36, 2), op

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(self.op(self, self.c(x)).view(x.shape[0], -1))


@pytest.mark.parametrize("op", [
    lambda m, y: m.act(y.permute(0, 2, 3, 1)), lambda m, y: F.relu(y.transpose(2, 3)),
    lambda m, y: torch.sigmoid(y.contiguous(memory_format=torch.channels_last)),
    lambda m, y: y.permute(0, 2, 3, 1) * 0.5, lambda m, y: y.transpose(2, 3) + y.transpose(2, 3)])
def test_an_elementwise_op_of_a_permuted_map_keeps_its_layout_as_torch_does(op):
    """torch's output of an activation or arithmetic on a permuted (transposed, channels-last) map keeps that layout,
    which a ``view`` of it then refuses: the meta shape propagation answered such an op with a contiguous tensor, and
    a network torch cannot run was described. Its forward fails now as torch's does; a slice's does not."""
    module = _ViewedAfter(op)
    with pytest.raises(RuntimeError, match="view size is not compatible"):
        module(torch.randn(2, 3, 6, 6))
    with pytest.raises(UserError, match="view size is not compatible"):
        describe(module, [3, 6, 6], "permuted")
    describe(_ViewedAfter(lambda m, y: F.relu(y[:, :, 1:] + 1.0)), [3, 7, 6], "sliced")


class _Then(nn.Module):
    """A convolution, then ``op`` of its output, then a linear layer of what it makes."""

    def __init__(self, op, features: int, kernel: int = 3) -> None:
        super().__init__()
        self.c, self.norm, self.fc, self.op = nn.Conv2d(3, 4, kernel), nn.InstanceNorm2d(4), nn.LazyLinear(2), op
        self.fc(torch.zeros(1, features))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(self.op(self, self.c(x)).flatten(1))


@pytest.mark.parametrize("op, features, kernel, says", [
    (lambda m, y: m.norm(y), 4, 6, "more than 1 spatial element"),  # a 1x1 map
    (lambda m, y: y.mean((2, -2)), 16, 3, "appears multiple times"),
    (lambda m, y: F.dropout(y, 1.5), 64, 3, "dropout probability has to be between 0 and 1"),
    (lambda m, y: y.clamp(), 64, 3, "At least one of 'min' or 'max'"),
    (lambda m, y: F.glu(y, 2), 18, 4, "Halving dimension must be even"),
    (lambda m, y: F.softshrink(y, -0.5), 64, 3, "lambda must be in range")])
def test_the_meta_shape_propagation_refuses_what_torch_refuses(op, features, kernel, says):
    """An instance norm of a 1x1 map, a mean over a dim named twice, a dropout of a probability over 1, a clamp to
    no bound, a GLU along a dim of odd size, a softshrink of a negative lambd: torch refuses each, and the meta shape
    propagation must not answer it with a tensor (a network torch cannot run described). Each is left to torch,
    whose reason the description's error gives."""
    module = _Then(op, features, kernel).eval()
    with pytest.raises((RuntimeError, ValueError), match=re.escape(says)):
        module(torch.randn(2, 3, 6, 6))
    with pytest.raises(UserError, match=re.escape(says)):
        describe(module, [3, 6, 6], "refused")


def test_a_clamp_to_a_tensor_s_bound_records_the_shape_it_broadcasts_to():
    """``x.clamp(min=t)`` broadcasts ``x`` against ``t``: the meta shape propagation records torch's shape for it."""
    from torch.fx.passes.shape_prop import ShapeProp

    from perf4sight.ir.meta_shapes import MetaShapeProp

    class Clamp(nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return x.mean(1, keepdim=True).clamp(min=torch.zeros(2, 3, 4, 4, device=x.device))

    shapes = []
    for prop in (ShapeProp, MetaShapeProp):
        gm = torch.fx.symbolic_trace(Clamp())
        prop(gm).propagate(torch.empty(2, 3, 4, 4, device="meta"))
        shapes.append([(n.name, tuple(n.meta["tensor_meta"].shape)) for n in gm.graph.nodes
                       if n.op != "placeholder" and hasattr(n.meta.get("tensor_meta"), "shape")])
    assert shapes[0] == shapes[1] and shapes[0][-2:] == [("clamp", (2, 3, 4, 4)), ("output", (2, 3, 4, 4))]


def test_a_users_network_is_described_without_torchs_compiler_import():
    """torch's Python meta kernels (arithmetic, activations, norms, means, adaptive pools, concatenations; PReLU's,
    a log-softmax's, a GLU's, the shrinks', a threshold's, a log-sigmoid's, Softsign's, Tanhshrink's and Softmin's, the
    layers and the calls) import torch._dynamo on their first call: 3-4 s of a user's first
    description in a process without torchvision. A fresh process describes such networks without importing it
    (asked after each), each description the same as this process's."""
    import subprocess
    import sys
    from pathlib import Path

    tests = Path(__file__).resolve().parent
    networks = ["_CommonCalls", "_SrganBlock", "_Gated", "_Shrinks", "_Composed", "_LogSigmoids"]
    code = (f"import sys, torch; sys.path.insert(0, {str(tests)!r}); from test_ir import {', '.join(networks)}; "
            "from perf4sight.ir.from_torch import describe\n"
            f"for network in ({', '.join(networks)}):\n"
            "    torch.manual_seed(0); print(describe(network(), [3, 8, 8], 'calls').to_json())\n"
            "    print('torch._dynamo' in sys.modules)")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300, cwd=tests.parent)
    assert done.returncode == 0, done.stderr[-2000:]
    lines = done.stdout.splitlines()
    assert len(lines) == 2 * len(networks), done.stdout[-2000:]
    for i, network in enumerate(networks):  # one process for both: the first is described in a fresh one
        torch.manual_seed(0)
        module = globals()[network]().eval()  # a dropout the identity, as the rebuilt one is
        desc = describe(module, [3, 8, 8], "calls")
        assert lines[2 * i:2 * i + 2] == [desc.to_json(), "False"], network
        _assert_same_function(desc, module, [3, 8, 8])


def test_a_concatenation_of_tensors_that_disagree_is_refused_with_torchs_own_reason():
    class Bad(nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return torch.cat([x, x[:, :, 1:]], 1)
    with pytest.raises(UserError, match="Sizes of tensors must match"):
        describe(Bad(), [3, 8, 8], "bad")


class _SrganBlock(nn.Module):
    """An SRGAN generator's and a segmentation head's layers: PReLU of one slope per channel (a residual block's),
    of one slope (the stem's), a call on the module's own slopes; Dropout2d and a call of it (in eval mode, where
    the description is traced, the identity); a log-softmax over the channels (the module), over each channel's
    pixels (a call), a method over the rows."""

    def __init__(self) -> None:
        super().__init__()
        self.stem, self.act0 = nn.Conv2d(3, 8, 3, padding=1), nn.PReLU()
        self.c1, self.act1, self.c2 = nn.Conv2d(8, 8, 3, padding=1), nn.PReLU(8), nn.Conv2d(8, 8, 3, padding=1)
        self.own = nn.Module()  # the call's slopes, in node order (after c2's)
        self.own.slopes = nn.Parameter(torch.rand(8) * 0.5)
        self.drop, self.scores, self.fc = nn.Dropout2d(0.2), nn.LogSoftmax(dim=1), nn.Linear(8, 4)
        nn.init.uniform_(self.act1.weight, 0.1, 0.4)

    def forward(self, x):
        x = self.act0(self.stem(x))
        y = F.prelu(self.c2(self.act1(self.c1(x))) + x, self.own.slopes)
        y = F.dropout2d(self.drop(y), 0.1, self.training)
        p = F.log_softmax(self.scores(y).flatten(2), dim=-1).view_as(y)
        return self.fc(p.log_softmax(2).mean((2, 3)))


def test_prelus_dropout2d_and_log_softmaxes_are_described_and_rebuilt():
    """PReLU, Dropout2d and a log-softmax inside the network (nn.PReLU, F.prelu; nn.Dropout2d, F.dropout2d;
    nn.LogSoftmax, F.log_softmax, x.log_softmax) were refused as layers without a description op; they are the ops
    prelu (num_parameters: its slopes counted), dropout2d (p) and log_softmax (dim counted from the front), and the
    module rebuilt from the description computes what the original did. Slopes neither one nor the channels, a
    dropout2d of anything but a map, a log-softmax over the batch are refused."""
    torch.manual_seed(0)
    module = _SrganBlock().eval()
    desc = NetworkDescription.from_dict(describe(module, [3, 6, 6], "srgan").to_dict())
    assert [(n.op, n.attrs) for n in desc.nodes if n.op in ("prelu", "dropout2d", "log_softmax")] == [
        ("prelu", {"num_parameters": 1}), ("prelu", {"num_parameters": 8}), ("prelu", {"num_parameters": 8}),
        ("dropout2d", {"p": 0.2}), ("dropout2d", {"p": 0.1}), ("log_softmax", {"dim": 1}),
        ("log_softmax", {"dim": 2}), ("log_softmax", {"dim": 2})]
    assert desc.params == sum(p.numel() for p in module.parameters())
    _assert_same_function(desc, module, [3, 6, 6])
    assert sum(isinstance(m, nn.Dropout2d) for m in build_module(desc).modules()) == 2
    for op, attr, value, match in (("prelu", "num_parameters", 4, "neither 1 nor the channels"),
                                   ("prelu", "num_parameters", 0, "positive integer"),
                                   ("dropout2d", "p", 1.5, "in \\[0, 1\\]"),
                                   ("log_softmax", "dim", 0, "dim")):
        broken = desc.to_dict()
        next(n for n in broken["nodes"] if n["op"] == op)["attrs"][attr] = value
        with pytest.raises(UserError, match=match):
            NetworkDescription.from_dict(broken)
    with pytest.raises(UserError, match="log-softmax over the batch"):
        describe(nn.Sequential(nn.Flatten(), nn.LogSoftmax(dim=0)), [3, 6, 6], "batch")
    with pytest.raises(UserError, match="a dropout2d of a 3-D input has no description op"):
        describe(_FlatDropout2d(), [3, 6, 6], "flat")


class _ChannelDropouts(nn.Module):
    """A channel dropout of the channels' pixels flattened ([N, C, H x W]: nn.Dropout1d, F.dropout1d), and a map's
    (nn.Dropout2d), between convolutions."""

    def __init__(self) -> None:
        super().__init__()
        self.conv, self.drop1, self.drop2 = nn.Conv2d(3, 8, 3), nn.Dropout1d(0.3), nn.Dropout2d(0.2)
        self.fc = nn.Linear(8, 4)

    def forward(self, x):
        y = self.drop2(self.conv(x))
        return self.fc(F.dropout1d(self.drop1(y.flatten(2)), 0.1, self.training).mean(2))


def test_dropout1d_of_n_c_l_is_a_channel_dropout_and_dropout3d_of_a_map_is_refused():
    """nn.Dropout1d and F.dropout1d were refused as a layer and a call without a description op: of a [N, C, L]
    input (a map's pixels flattened) torch drops whole channels of each sample, as a Dropout2d does of a map: the op
    dropout2d of a [C, L] input, rebuilt as nn.Dropout1d, which drops the same channels (the same random draws) in
    training. nn.Dropout3d and F.dropout3d of a map drop whole samples (torch reads the map as one unbatched
    [C, D, H, W] volume), and a Dropout1d of a [N, C] vector drops samples too: each refused by name."""
    torch.manual_seed(0)
    original = _ChannelDropouts()
    desc = NetworkDescription.from_dict(describe(original, [3, 8, 8], name="drops").to_dict())
    assert [(n.attrs, n.output_shape) for n in desc.nodes if n.op == "dropout2d"] == [
        ({"p": 0.2}, [8, 6, 6]), ({"p": 0.3}, [8, 36]), ({"p": 0.1}, [8, 36])]
    rebuilt = build_module(desc)
    assert [type(m).__name__ for m in rebuilt.modules() if "Dropout" in type(m).__name__] == [
        "Dropout2d", "Dropout1d", "Dropout1d"]
    for mine, theirs in zip(rebuilt.parameters(), original.parameters()):
        mine.data.copy_(theirs.data)
    x = torch.randn(2, 3, 8, 8)
    torch.manual_seed(1)
    want = original.train()(x)
    torch.manual_seed(1)
    assert torch.allclose(rebuilt.train()(x), want, atol=1e-6)
    again = describe(rebuilt, [3, 8, 8], name="drops")
    assert [(n.op, n.attrs) for n in again.nodes] == [(n.op, n.attrs) for n in desc.nodes]
    for layer, message in ((nn.Dropout3d(0.5), "a dropout3d of a 4-D input .* dropping whole samples"),
                           (lambda y: F.dropout3d(y, 0.5), "a dropout3d of a 4-D input"),
                           (lambda y: F.dropout1d(y.mean((2, 3)), 0.5), "a dropout1d of a 2-D input")):
        with pytest.raises(UserError, match=message):
            describe(_Padded(layer), [3, 6, 6], "dropped")


class _FlatDropout2d(nn.Module):
    """A channel dropout of a [N, C, H x W] tensor, which torch reads otherwise than a map's."""

    def forward(self, x):
        return F.dropout2d(x.flatten(2), 0.5, self.training).mean(2)


class _Espcn(nn.Module):
    """An ESPCN-like super-resolution network: convolutions, then a pixel shuffle by 2 (the module and the call);
    a pixel unshuffle back (the module) and a call of it."""

    def __init__(self) -> None:
        super().__init__()
        self.c1, self.c2 = nn.Conv2d(3, 16, 5, padding=2), nn.Conv2d(16, 8, 3, padding=1)
        self.c3, self.shuffle = nn.Conv2d(8, 3 * 4, 3, padding=1), nn.PixelShuffle(2)
        self.unshuffle = nn.PixelUnshuffle(2)

    def forward(self, x):
        y = self.shuffle(self.c3(torch.tanh(self.c2(torch.tanh(self.c1(x))))))
        return F.pixel_shuffle(F.pixel_unshuffle(self.unshuffle(y), 2), 4)


class _PaddedStyleBlock(nn.Module):
    """A style-transfer network's layers: reflection pads before convolutions (the module and F.pad), a
    replication pad, a zero pad and a constant pad of a value, as modules and calls."""

    def __init__(self) -> None:
        super().__init__()
        self.pad, self.conv = nn.ReflectionPad2d(4), nn.Conv2d(3, 8, 9)
        self.conv2, self.zero = nn.Conv2d(8, 8, 3), nn.ZeroPad2d((1, 0, 2, 1))
        self.edge, self.value = nn.ReplicationPad2d((0, 1, 1, 0)), nn.ConstantPad2d(2, 0.5)

    def forward(self, x):
        y = torch.relu(self.conv(self.pad(x)))
        y = self.conv2(F.pad(y, (1, 1, 1, 1), mode="reflect"))
        y = F.pad(self.zero(self.edge(y)), [1, 2], value=-1.0)
        return F.pad(self.value(y), (0, 1, 1, 0, 0, 0), mode="replicate")


def test_super_resolution_and_style_transfer_layers_are_described():
    """Pixel shuffles and pads (an ESPCN's upsampling, a style-transfer network's reflection pads; each layer of
    torch's and its functional call) were refused as layers without a description op; they are the ops
    pixel_shuffle, pixel_unshuffle and pad ([left, right, top, bottom], a mode, a value where it is not 0), and the
    module rebuilt from the description computes what the network did."""
    torch.manual_seed(0)
    sr = _Espcn().eval()
    desc = NetworkDescription.from_dict(describe(sr, [3, 8, 8], "espcn").to_dict())
    assert [(n.op, n.attrs, n.output_shape) for n in desc.nodes if n.op.startswith("pixel")] == [
        ("pixel_shuffle", {"upscale_factor": 2}, [3, 16, 16]), ("pixel_unshuffle", {"downscale_factor": 2}, [12, 8, 8]),
        ("pixel_unshuffle", {"downscale_factor": 2}, [48, 4, 4]), ("pixel_shuffle", {"upscale_factor": 4}, [3, 16, 16])]
    _assert_same_function(desc, sr, [3, 8, 8])
    style = _PaddedStyleBlock().eval()
    desc = NetworkDescription.from_dict(describe(style, [3, 12, 12], "style").to_dict())
    assert [n.attrs for n in desc.nodes if n.op == "pad"] == [
        {"pads": [4, 4, 4, 4], "mode": "reflect"}, {"pads": [1, 1, 1, 1], "mode": "reflect"},
        {"pads": [0, 1, 1, 0], "mode": "replicate"}, {"pads": [1, 0, 2, 1], "mode": "constant"},
        {"pads": [1, 2, 0, 0], "mode": "constant", "value": -1.0}, {"pads": [2, 2, 2, 2], "mode": "constant",
                                                                     "value": 0.5},
        {"pads": [0, 1, 1, 0], "mode": "replicate"}]
    assert desc.node(desc.output).output_shape == [8, 12 + 1 + 3 + 4 + 1, 12 + 1 + 1 + 3 + 4 + 1]
    _assert_same_function(desc, style, [3, 12, 12])


class _Padded(nn.Module):
    def __init__(self, pad: Any) -> None:
        super().__init__()
        self.conv, self.pad = nn.Conv2d(3, 4, 1), pad

    def forward(self, x):
        return self.pad(self.conv(x))


@pytest.mark.parametrize("pad, message", [
    (lambda x: F.pad(x, (1, 1, 1, 1, 1, 0)), "channels or the batch"),
    (lambda x: F.pad(x, (-1, 0, 0, 0)), "crops"), (lambda x: F.pad(x[:, 0], (1, 1)), r"\[N, C, H, W\]")])
def test_pads_that_no_op_describes_are_refused_by_name(pad, message):
    """A pad of the channels, a crop and a pad of anything but a map are refused, each saying why; a circular pad of
    nothing is a pad of nothing in that mode (torch's copy of it)."""
    with pytest.raises(UserError, match=message):
        describe(_Padded(pad), [3, 6, 6], "padded")
    nothing = describe(_Padded(nn.CircularPad2d(0)), [3, 6, 6], "nothing")
    assert [n.attrs for n in nothing.nodes if n.op == "pad"] == [{"pads": [0, 0, 0, 0], "mode": "circular"}]


def test_a_pad_or_shuffle_that_does_not_fit_is_refused_when_read():
    """A description's pad of an unknown mode or of the wrong length, a reflection as wide as its side, a value of a
    reflection, a pixel shuffle of channels not divisible by r^2 and an unshuffle of a side not divisible by r are
    refused when the description is read."""
    good = describe(_Padded(nn.ReflectionPad2d(2)), [3, 6, 6], "padded").to_dict()

    def broken(**attrs: Any) -> dict:
        d = json.loads(json.dumps(good))
        node = next(n for n in d["nodes"] if n["op"] == "pad")
        node["attrs"].update(attrs)
        return d

    for attrs, message in (({"mode": "wrap"}, "mode"), ({"pads": [1, 1, 1]}, "left, right, top, bottom"),
                           ({"pads": [6, 0, 0, 0]}, "less than the side"), ({"value": 1.0}, "constant' only")):
        with pytest.raises(UserError, match=message):
            NetworkDescription.from_dict(broken(**attrs))
    shuffled = describe(_Padded(nn.PixelShuffle(2)), [3, 6, 6], "shuffled").to_dict()
    assert shuffled["nodes"][-1]["output_shape"] == [1, 12, 12]
    shuffled["nodes"][-1]["attrs"]["upscale_factor"] = 3
    with pytest.raises(UserError, match="divisible by 9"):
        NetworkDescription.from_dict(shuffled)
    with pytest.raises(UserError, match="divisible by 4"):
        describe(_Padded(nn.PixelUnshuffle(4)), [3, 6, 6], "unshuffled")


class _ClampedImageToImage(nn.Module):
    """An image-to-image network's ends as its users write them: a clamp of the output to the image's range, a
    softmax over each channel's pixels put back to the map's shape with view_as, and a channel softmax by
    nn.Softmax2d (an attention gate)."""

    def __init__(self) -> None:
        super().__init__()
        self.c1, self.c2, self.gate = nn.Conv2d(3, 8, 3, padding=1), nn.Conv2d(8, 3, 3, padding=1), nn.Softmax2d()

    def forward(self, x):
        y = self.c1(x)
        y = y * y.flatten(2).softmax(-1).view_as(y) + y * self.gate(y)
        y = torch.clamp(y, 0.0, 6.0) + y.clamp(-1.0, 1.0) + y.clip(min=-0.5, max=2.0)
        return torch.clip(self.c2(y), 0, 1)


@pytest.mark.parametrize("call", [lambda y: torch.clamp(y, 1.0, 1.0), lambda y: y.clamp(0.5, -0.5),
                                  lambda y: F.hardtanh(y, 0.25, 0.25)])
def test_a_clamp_to_an_empty_range_is_refused_with_a_line_that_says_so(call):
    """torch runs a clamp whose minimum is not below its maximum (its output a constant); the schema refuses such a
    hardtanh, and describe wrote one down, a description its own load refused. describe refuses it, naming it."""
    class Clamped(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.c = nn.Conv2d(3, 4, 3)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return call(self.c(x))

    module = Clamped()
    module(torch.randn(2, 3, 6, 6))
    with pytest.raises(UserError, match=r"a clamp to \[.*\] \(its minimum not below its maximum"):
        describe(module, [3, 6, 6], "empty_range")


def test_clamps_view_as_and_softmax2d_are_described_and_rebuilt():
    """A clamp to both bounds (torch.clamp, x.clamp, clip), a view_as and nn.Softmax2d were refused as calls without
    a description op; a clamp is the op hardtanh of its range ([0, 6]: relu6), a view_as a reshape to the other
    tensor's shape, a Softmax2d a softmax over the channels, and the rebuilt module computes what the original
    did. A clamp to a tensor's bounds is refused with a line that says so."""
    torch.manual_seed(0)
    module = _ClampedImageToImage().eval()
    desc = NetworkDescription.from_dict(describe(module, [3, 6, 6], "clamped").to_dict())
    assert [n.attrs for n in desc.nodes if n.op == "softmax"] == [{"dim": 2}, {"dim": 1}]
    assert [n.attrs["shape"] for n in desc.nodes if n.op == "reshape"] == [[8, 6, 6]]
    assert [n.attrs for n in desc.nodes if n.op == "hardtanh"] == [
        {"min_val": -1.0, "max_val": 1.0}, {"min_val": -0.5, "max_val": 2.0}, {"min_val": 0.0, "max_val": 1.0}]
    assert [n.op for n in desc.nodes].count("relu6") == 1
    _assert_same_function(desc, module, [3, 6, 6])

    class TensorBounds(nn.Module):
        def forward(self, x):
            low = x.mean((1, 2, 3), keepdim=True)
            return torch.clamp(x, low, low + 1.0)

    with pytest.raises(UserError, match="clamp to a tensor"):
        describe(nn.Sequential(nn.Conv2d(3, 4, 3), TensorBounds()), [3, 6, 6], "bounds")


class _OneBound(nn.Module):
    """Clamps to one bound, as users write a ReLU or a cap: x.clamp(min=0), torch.clamp(x, max=1), clamp_min and
    clamp_max, the method and the function."""

    def __init__(self) -> None:
        super().__init__()
        self.conv, self.fc = nn.Conv2d(3, 4, 3), nn.Linear(4, 2)

    def forward(self, x):
        y = self.conv(x)
        y = y.clamp(min=0.0) + torch.clamp(y, max=1.0) + y.clamp_min(0.5) + torch.clamp_max(y, 2.0)
        return self.fc(y.mean((2, 3)))


def test_a_clamp_to_one_bound_is_a_hardtanh_whose_other_bound_is_the_largest_float32():
    """A clamp to one bound (x.clamp(min=0), clamp_min, clamp_max) was refused; it is a hardtanh whose other bound is
    the largest float32, beyond which no float32 lies: the rebuilt module computes what the original did, and the
    allocation model writes down what torch records for it (the input kept, as a clamp's backward keeps it)."""
    import numpy as np

    from perf4sight.features.alloc_trace import record_events

    torch.manual_seed(0)
    module = _OneBound().eval()
    desc = NetworkDescription.from_dict(describe(module, [3, 6, 6], "one_bound").to_dict())
    top = float(np.finfo(np.float32).max)
    assert [(n.attrs["min_val"], n.attrs["max_val"]) for n in desc.nodes if n.op == "hardtanh"] == [
        (0.0, top), (-top, 1.0), (0.5, top), (-top, 2.0)]
    _assert_same_function(desc, module, [3, 6, 6])
    model, traced = record_events(desc, 2, method="model"), record_events(desc, 2, method="trace")
    assert model == traced


class _LogSoftmaxCast(nn.Module):
    """A log-softmax that casts, its dtype given in its place (``torch.log_softmax(x, dim, dtype)``, the method's)."""

    def forward(self, x):
        return torch.log_softmax(x, 1, torch.float64) + x.log_softmax(2, torch.float64)


class _DropoutOutOfRange(nn.Module):
    def forward(self, x):
        return F.dropout2d(x, 1.5)


class _DropoutOfAVector(nn.Module):
    def forward(self, x):
        return F.dropout2d(x.mean((1, 2, 3)), 0.5)  # in training (the call's default): torch refuses it


class _DropoutLayerOfAVector(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.drop = nn.Dropout2d(0.5)  # in training mode, as built

    def forward(self, x):
        return self.drop(x.mean((1, 2, 3)))


class _HalfPrelu(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.act = nn.PReLU(3)

    def forward(self, x):
        return self.act(x.half())  # float32 slopes: torch refuses to promote


@pytest.mark.parametrize("network", [_LogSoftmaxCast, _DropoutOutOfRange, _DropoutOfAVector,
                                     _DropoutLayerOfAVector, _HalfPrelu])
def test_the_meta_shape_propagation_records_what_torch_records_of_the_new_layers_or_fails_as_it(network):
    """A log-softmax's dtype given in its place was read as the stack level (the result recorded float32, torch's
    float64); a dropout2d call of a probability out of [0, 1], one of a vector in training (the call, the layer),
    and a PReLU of float32 slopes on a half input, were answered where torch refuses them."""
    from torch.fx.passes.shape_prop import ShapeProp

    from perf4sight.ir.meta_shapes import MetaShapeProp

    recorded = []
    for prop in (ShapeProp, MetaShapeProp):
        gm = torch.fx.symbolic_trace(network().to("meta"))
        try:
            prop(gm).propagate(torch.empty(2, 3, 4, 4, device="meta"))
        except Exception as exc:  # noqa: BLE001 (torch's own error, whatever its type)
            recorded.append(type(exc).__name__)
            continue
        recorded.append([(n.name, tuple(n.meta["tensor_meta"].shape), n.meta["tensor_meta"].dtype)
                         for n in gm.graph.nodes if hasattr(n.meta.get("tensor_meta"), "shape")])
    assert recorded[0] == recorded[1]


class _Shuffled(nn.Module):
    """ShuffleNet's shuffle as the layer (nn.ChannelShuffle), the call (F.channel_shuffle) and torch's, of a map and
    of a [N, C, L] sequence."""

    def __init__(self) -> None:
        super().__init__()
        self.c1, self.shuffle, self.c2 = nn.Conv2d(3, 8, 3, padding=1), nn.ChannelShuffle(2), nn.Conv2d(8, 6, 1)

    def forward(self, x):
        y = self.c2(F.channel_shuffle(self.shuffle(self.c1(x)), 4))
        return torch.channel_shuffle(y.flatten(2), 3).mean(2)


def test_a_channel_shuffle_is_a_view_a_transpose_and_a_reshape():
    """nn.ChannelShuffle and F.channel_shuffle were refused as layers without a description op: each is the view into
    [g, C / g, *] groups, the swap of the two and the reshape back torch's math_channel_shuffle computes (ShuffleNet's
    hand-written shuffle), which the rebuilt network computes as the original does, and the view describes back to."""
    torch.manual_seed(0)
    original = _Shuffled().eval()
    desc = NetworkDescription.from_dict(describe(original, [3, 6, 6], name="shuffled").to_dict())
    assert [(n.op, n.attrs, n.output_shape) for n in desc.nodes if n.op in ("reshape", "transpose")] == [
        ("reshape", {"shape": [2, 4, 6, 6]}, [2, 4, 6, 6]), ("transpose", {"dim0": 1, "dim1": 2}, [4, 2, 6, 6]),
        ("reshape", {"shape": [8, 6, 6]}, [8, 6, 6]),
        ("reshape", {"shape": [4, 2, 6, 6]}, [4, 2, 6, 6]), ("transpose", {"dim0": 1, "dim1": 2}, [2, 4, 6, 6]),
        ("reshape", {"shape": [8, 6, 6]}, [8, 6, 6]),
        ("reshape", {"shape": [3, 2, 36]}, [3, 2, 36]), ("transpose", {"dim0": 1, "dim1": 2}, [2, 3, 36]),
        ("reshape", {"shape": [6, 36]}, [6, 36])]
    assert desc.node("shuffle").inputs == ["shuffle_swapped_1"] and desc.node("c2").inputs == ["channel_shuffle"]
    _assert_same_function(desc, original, [3, 6, 6])
    again = describe(build_module(desc), [3, 6, 6], name="shuffled")
    assert [(n.op, n.attrs) for n in again.nodes] == [(n.op, n.attrs) for n in desc.nodes]


class _ChannelRMSNorm(nn.Module):
    """An RMS norm over a map's channels, channels last, by F.rms_norm on its own weight (as ConvNeXt's LayerNorm2d
    calls F.layer_norm)."""

    def __init__(self, channels: int) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.rand(channels) + 0.5)

    def forward(self, x):
        return F.rms_norm(x.permute(0, 2, 3, 1), (x.shape[1],), self.weight, 1e-5).permute(0, 3, 1, 2)


class _RMSNormed(nn.Module):
    """nn.RMSNorm over a whole map (a weight per element), over its rows without a weight (eps 1e-6), F.rms_norm over
    the channels on a weight of its own, and over the rows and columns without one (torch's eps)."""

    def __init__(self) -> None:
        super().__init__()
        self.c1, self.n1 = nn.Conv2d(3, 8, 3, padding=1), nn.RMSNorm([8, 6, 6])
        self.n2, self.n3 = nn.RMSNorm(6, eps=1e-6, elementwise_affine=False), _ChannelRMSNorm(8)
        self.fc = nn.Linear(8, 4)

    def forward(self, x):
        y = self.n3(self.n2(self.n1(self.c1(x))))
        return self.fc(F.rms_norm(y, (6, 6)).mean((2, 3)))


def test_an_rms_norm_is_described_and_rebuilt():
    """nn.RMSNorm and F.rms_norm (torch >= 2.4) were refused as layers without a description op: they are the op
    rmsnorm (normalized_shape; eps where given, torch's None otherwise; elementwise_affine where false), its weight
    counted, rebuilt by nn.RMSNorm, which computes what the module computes and describes back to it; a
    normalized_shape that is not its input's last dimensions is refused when read."""
    torch.manual_seed(0)
    original = _RMSNormed().eval()
    desc = NetworkDescription.from_dict(describe(original, [3, 6, 6], name="rms").to_dict())
    assert [(n.op, n.attrs, n.output_shape) for n in desc.nodes if n.op == "rmsnorm"] == [
        ("rmsnorm", {"normalized_shape": [8, 6, 6]}, [8, 6, 6]),
        ("rmsnorm", {"normalized_shape": [6], "eps": 1e-6, "elementwise_affine": False}, [8, 6, 6]),
        ("rmsnorm", {"normalized_shape": [8], "eps": 1e-5}, [6, 6, 8]),
        ("rmsnorm", {"normalized_shape": [6, 6], "elementwise_affine": False}, [8, 6, 6])]
    assert desc.params == sum(p.numel() for p in original.parameters()) == 3 * 8 * 9 + 8 + 8 * 36 + 8 + 8 * 4 + 4
    _assert_same_function(desc, original, [3, 6, 6])
    again = describe(build_module(desc), [3, 6, 6], name="rms")
    assert [(n.op, n.attrs) for n in again.nodes] == [(n.op, n.attrs) for n in desc.nodes]
    bad = desc.to_dict()
    next(n for n in bad["nodes"] if n["op"] == "rmsnorm")["attrs"]["normalized_shape"] = [6, 8]
    with pytest.raises(UserError, match=r"normalized_shape \[6, 8\] is not the last dimensions"):
        NetworkDescription.from_dict(bad)


class _Randomised(nn.Module):
    """RReLU as the layer (in place too), the call (of a fixed slope: F.rrelu's training=False) and torch's."""

    def __init__(self) -> None:
        super().__init__()
        self.c1, self.a1, self.c2 = nn.Conv2d(3, 8, 3), nn.RReLU(), nn.Conv2d(8, 8, 3)
        self.a2 = nn.RReLU(0.1, 0.3, inplace=True)

    def forward(self, x):
        y = self.a2(F.rrelu(self.c2(self.a1(self.c1(x))), 0.2, 0.25))
        return torch.rrelu(y * 2.0, 0.05, 0.5).mean((2, 3))


def test_an_rrelu_is_described_and_rebuilt():
    """RReLU (nn.RReLU, F.rrelu, torch.rrelu, in place too) was refused as a layer without a description op: it is the
    op rrelu (lower, upper; inplace where given), rebuilt by nn.RReLU, which computes what the module computes (in
    eval mode, a fixed slope) and describes back to it; one of lower above upper is refused when read."""
    torch.manual_seed(0)
    original = _Randomised().eval()
    desc = NetworkDescription.from_dict(describe(original, [3, 8, 8], name="rrelu").to_dict())
    assert [n.attrs for n in desc.nodes if n.op == "rrelu"] == [
        {"lower": 1 / 8, "upper": 1 / 3}, {"lower": 0.2, "upper": 0.25}, {"lower": 0.1, "upper": 0.3, "inplace": True},
        {"lower": 0.05, "upper": 0.5}]
    _assert_same_function(desc, original, [3, 8, 8])
    again = describe(build_module(desc), [3, 8, 8], name="rrelu")
    assert [(n.op, n.attrs) for n in again.nodes] == [(n.op, n.attrs) for n in desc.nodes]
    bad = desc.to_dict()
    next(n for n in bad["nodes"] if n["op"] == "rrelu")["attrs"]["lower"] = 0.5
    with pytest.raises(UserError, match="lower 0.5 is above upper"):
        NetworkDescription.from_dict(bad)


@pytest.mark.parametrize("op", ["leaky_relu", "elu", "selu", "celu", "hardtanh", "mish",
                                "threshold", "rrelu"])
def test_an_activation_in_place_on_a_copy_rebuilds_and_describes_back(op):
    """An activation in place on a copy of its input is the op with ``on_copy`` (not ``inplace``): rebuilt as a
    contiguous clone and the layer in place, which describes back to the same nodes; a node claiming both is refused
    when read."""
    from test_features import on_copy_network

    desc = NetworkDescription.from_dict(describe(on_copy_network(op), [3, 6, 6], name="copied").to_dict())
    assert [n.attrs.get("on_copy") for n in desc.nodes if n.op == op] == [True, True]
    again = describe(build_module(desc), [3, 6, 6], name="copied")
    assert [(n.op, n.attrs) for n in again.nodes] == [(n.op, n.attrs) for n in desc.nodes]
    bad = desc.to_dict()
    next(n for n in bad["nodes"] if n["op"] == op)["attrs"]["inplace"] = True
    with pytest.raises(UserError, match="'on_copy' and 'inplace' exclude each other"):
        NetworkDescription.from_dict(bad)


class _SeededRReLUs(nn.Module):
    """torch.rrelu given its own random generator, by keyword and in the fifth place (where F.rrelu takes its in-place
    flag), and torch.rrelu_ given one: or without (``seeded`` false), the same calls."""

    def __init__(self, seeded: bool) -> None:
        super().__init__()
        self.c1, self.c2 = nn.Conv2d(3, 8, 3), nn.Conv2d(8, 8, 3)
        self.g = torch.Generator().manual_seed(0) if seeded else None

    def forward(self, x):
        y = self.c2(torch.rrelu(self.c1(x), 0.1, 0.3, True, generator=self.g))
        y = torch.rrelu(y, 0.2, 0.25, True, self.g) + y
        return torch.rrelu_(y * 2.0, 0.05, 0.5, True, self.g).mean((2, 3))


def test_an_rrelu_drawing_from_its_own_generator_is_described_as_one_drawing_from_torch_s():
    """torch.rrelu(x, ..., generator=g) was refused as reading '_opaque_obj0, a module tensor that is no parameter':
    a generator picks the stream the slopes are drawn from, not how many, so the description is the one of the same
    calls without it (and a generator in the fifth place is no in-place flag, as F.rrelu's fifth argument is)."""
    seeded = describe(_SeededRReLUs(True), [3, 8, 8], name="seeded")
    plain = describe(_SeededRReLUs(False), [3, 8, 8], name="seeded")
    assert [(n.op, n.inputs, n.attrs) for n in seeded.nodes] == [(n.op, n.inputs, n.attrs) for n in plain.nodes]
    assert [n.attrs.get("inplace") for n in seeded.nodes if n.op == "rrelu"] == [None, None, True]
    build_module(seeded).train()(torch.randn(2, 3, 8, 8)).sum().backward()


class _SelfNormalisingDropouts(nn.Module):
    """A self-normalising network's dropouts: nn.AlphaDropout, nn.FeatureAlphaDropout, F.alpha_dropout given its
    training flag (as self.training: False when traced in eval mode) and without it, F.feature_alpha_dropout in
    place."""

    def __init__(self) -> None:
        super().__init__()
        self.c1, self.d1, self.c2 = nn.Conv2d(3, 8, 3), nn.AlphaDropout(0.1), nn.Conv2d(8, 8, 3)
        self.d2 = nn.FeatureAlphaDropout(0.2)

    def forward(self, x):
        y = self.d2(self.c2(self.d1(torch.selu(self.c1(x)))))
        y = F.alpha_dropout(F.alpha_dropout(y, 0.3, self.training), 0.4)
        return F.feature_alpha_dropout(y * 2.0, 0.05, self.training, True).mean((2, 3))


def test_an_alpha_dropout_is_described_and_rebuilt():
    """AlphaDropout and FeatureAlphaDropout (a self-normalising network's dropouts: the layers, the calls) were
    refused as layers without a description op: they are the op alpha_dropout (p; feature for whole channels;
    inplace where given), rebuilt by nn.AlphaDropout or nn.FeatureAlphaDropout, which compute what the module
    computes and describe back to them; a call is the layer in training whatever its training flag (fx passes
    self.training, False in the eval-mode trace, as torch's default). A p above 1 is refused when read."""
    torch.manual_seed(0)
    original = _SelfNormalisingDropouts().eval()
    desc = NetworkDescription.from_dict(describe(original, [3, 8, 8], name="snn").to_dict())
    assert [n.attrs for n in desc.nodes if n.op == "alpha_dropout"] == [
        {"p": 0.1}, {"p": 0.2, "feature": True}, {"p": 0.3}, {"p": 0.4}, {"p": 0.05, "feature": True, "inplace": True}]
    _assert_same_function(desc, original, [3, 8, 8])
    again = describe(build_module(desc), [3, 8, 8], name="snn")
    assert [(n.op, n.attrs) for n in again.nodes] == [(n.op, n.attrs) for n in desc.nodes]
    bad = desc.to_dict()
    next(n for n in bad["nodes"] if n["op"] == "alpha_dropout")["attrs"]["p"] = 1.5
    with pytest.raises(UserError, match="alpha_dropout"):
        NetworkDescription.from_dict(bad)


def test_a_frozen_batch_norm_rebuilds_without_torchvision(monkeypatch):
    """A device has torch alone: the rebuilt frozen batch norm was torchvision's class, imported when built, so a
    network with one failed to build there. It is the rebuilder's own now, built with every torchvision module
    hidden, and computes what torchvision's does from the same buffers."""
    import sys

    from test_features import frozen_backbone

    torch.manual_seed(0)
    original = frozen_backbone()
    desc = describe(original, [3, 8, 8], name="frozen")
    for name in [m for m in sys.modules if m == "torchvision" or m.startswith("torchvision.")]:
        monkeypatch.setitem(sys.modules, name, None)
    rebuilt = build_module(desc)
    monkeypatch.undo()
    assert not any(type(m).__module__.startswith("torchvision") for m in rebuilt.modules())
    rebuilt.load_state_dict(original.state_dict())
    x = torch.randn(2, 3, 8, 8)
    assert torch.equal(rebuilt(x), original(x))


def test_a_frozen_batch_norm_is_the_op_frozen_batchnorm2d():
    """torchvision's FrozenBatchNorm2d (a detection backbone's) was refused as reading '_tensor_constant0' (torch.fx
    folds the scale and shift it makes of its buffers into constants): it is a frozen_batchnorm2d of its channels
    and eps, without parameters, rebuilt as a FrozenBatchNorm2d that, given the same buffers, computes what the
    original computes and describes back to the same nodes; a ResNet of them (resnet_fpn_backbone's) describes."""
    from test_features import frozen_backbone
    from torchvision.models import resnet18
    from torchvision.ops.misc import FrozenBatchNorm2d

    from perf4sight.ir.schema import count_params

    torch.manual_seed(0)
    original = frozen_backbone()
    desc = NetworkDescription.from_dict(describe(original, [3, 8, 8], name="frozen").to_dict())
    assert [n.attrs for n in desc.nodes if n.op == "frozen_batchnorm2d"] == [
        {"num_features": 3}, {"num_features": 16}, {"num_features": 16, "eps": 0.0}]
    rebuilt = build_module(desc)
    rebuilt.load_state_dict(original.state_dict())
    x = torch.randn(2, 3, 8, 8)
    assert torch.allclose(rebuilt(x), original(x))
    default = build_module(desc)  # the same weights, the buffers' defaults (a batch norm of running mean 0, var 1)
    default.load_state_dict({k: v for k, v in original.state_dict().items() if not k.startswith("f")}, strict=False)
    assert not torch.allclose(default(x), original(x))
    again = describe(rebuilt, [3, 8, 8], name="frozen")
    assert [(n.op, n.attrs) for n in again.nodes] == [(n.op, n.attrs) for n in desc.nodes]
    net = resnet18(norm_layer=FrozenBatchNorm2d, num_classes=10)
    backbone = describe(net, [3, 64, 64], name="frozen_resnet")
    assert sum(n.op == "frozen_batchnorm2d" for n in backbone.nodes) == 20
    assert count_params(backbone) == sum(p.numel() for p in net.parameters())
    bad = desc.to_dict()
    bad["nodes"][1]["attrs"]["num_features"] = 4
    with pytest.raises(UserError, match="num_features 4"):
        NetworkDescription.from_dict(bad)


class _NonLocal(nn.Module):
    """Wang et al. 2018's non-local block (embedded Gaussian) on a [16, 8, 8] map, its products of activations
    written as ``form``: ``@``, torch.bmm and torch.matmul, or a batched einsum; then a classifier."""

    def __init__(self, form: str) -> None:
        super().__init__()
        self.form = form
        self.theta, self.phi, self.g = nn.Conv2d(16, 8, 1), nn.Conv2d(16, 8, 1), nn.Conv2d(16, 8, 1)
        self.out, self.fc = nn.Conv2d(8, 16, 1), nn.Linear(16, 10)

    def product(self, a: torch.Tensor, b: torch.Tensor, second: bool) -> torch.Tensor:
        if self.form == "einsum":
            return torch.einsum("bij,bjk->bik", a, b) if second else torch.einsum("nlc, ncm -> nlm", [a, b])
        if self.form == "bmm":
            return torch.matmul(a, b) if second else torch.bmm(a, b)
        return a @ b

    def forward(self, x):
        n, _, h, w = x.shape
        theta = self.theta(x).flatten(2).transpose(1, 2)
        attn = torch.softmax(self.product(theta, self.phi(x).flatten(2), False), -1)
        y = self.product(attn, self.g(x).flatten(2).transpose(1, 2), True).transpose(1, 2).reshape(n, -1, h, w)
        return self.fc((x + self.out(y)).mean((2, 3)))


@pytest.mark.parametrize("form", ["@", "bmm", "einsum"])
def test_a_non_local_block_s_products_of_activations_are_the_op_matmul(form):
    """A non-local block was refused ("call_function 'matmul' ... has no description op"): each product of two
    activations (theta^T phi, [64, 8] x [8, 64]; its softmax times g^T, [64, 64] x [64, 8]) is the op matmul, and the
    module rebuilt from the description computes what the block did."""
    torch.manual_seed(0)
    module = _NonLocal(form).eval()
    desc = NetworkDescription.from_dict(describe(module, [16, 8, 8], "nonlocal").to_dict())
    products = [(n.inputs, n.output_shape) for n in desc.nodes if n.op == "matmul"]
    assert [shape for _, shape in products] == [[64, 64], [64, 8]]
    assert [desc.node(i).output_shape for i in products[0][0]] == [[64, 8], [8, 64]]
    assert desc.params == sum(p.numel() for p in module.parameters())
    _assert_same_function(desc, module, [16, 8, 8])


class _Product(nn.Module):
    """A conv's map flattened to [N, 8, 16] (``rows`` of it, ``n c l`` in einsum's letters), multiplied by itself as
    ``product`` does."""

    def __init__(self, product) -> None:
        super().__init__()
        self.conv, self.product = nn.Conv2d(3, 8, 3, padding=1), product
        self.weight = nn.Parameter(torch.randn(16, 16))

    def forward(self, x):
        y = self.conv(x).flatten(2)
        return self.product(self, y).flatten(1)


@pytest.mark.parametrize("product, match", [
    (lambda m, y: torch.einsum("ncl,ndl->nld", y, y), r"an einsum of the form 'ncl,ndl->nld' has no description op"),
    (lambda m, y: torch.einsum("ncc,ncl->nl", y[:, :, :8], y), r"einsum of the form 'ncc,ncl->nl'"),
    (lambda m, y: y @ m.weight, r"a matmul of the module's tensor weight has no description op"),
    (lambda m, y: y.unsqueeze(1) @ y.transpose(1, 2), r"a matmul of tensors of ranks \[4, 3\]"),
])
def test_products_the_op_matmul_is_not_are_refused_by_name(product, match):
    """An einsum that is no batched matrix product (a letter kept from both operands beside one summed, a diagonal)
    is refused naming its form; a product with a module's own tensor, or of ranks that mix the batch
    into the matrices, is refused saying so."""
    with pytest.raises(UserError, match=match):
        describe(_Product(product), [3, 4, 4], "product")


def test_a_matmul_of_other_shapes_is_refused_when_read():
    """A matmul whose inner sizes differ, whose leading dims do not broadcast, or whose inputs' ranks differ (or are
    less than 2: a vector) is refused when the description is read; leading dims of 1 broadcast, as torch's do."""
    from perf4sight.ir.shapes import shape_problem
    assert shape_problem("matmul", {}, [[3, 64, 8], [1, 8, 5]], [3, 64, 5]) == ""
    for ins, match in (([[64, 7], [8, 64]], r"cannot multiply matrices of shapes \[64, 7\] and \[8, 64\]"),
                       ([[2, 4, 8], [3, 8, 4]], r"cannot multiply matrices of shapes \[2, 4, 8\] and \[3, 8, 4\]"),
                       ([[2, 4, 8], [8, 4]], "multiplies matrices of equal ranks of at least 2"),
                       ([[8], [8]], "multiplies matrices of equal ranks of at least 2")):
        assert re.search(match, shape_problem("matmul", {}, ins, [4, 4]))


def test_mobilenet_v3_s_hardswish_in_place_is_described_and_rebuilt_in_place():
    """torchvision's MobileNetV3 runs nn.Hardswish(inplace=True), which was described out of place (the flag
    dropped, so the clone torch runs first and keeps went uncounted): its hardswish nodes carry inplace, the rebuilt
    network's Hardswish layers run in place, and, its weights copied from the original by layer name, it computes
    the original's output."""
    torch.manual_seed(0)
    original = build_zoo_model("mobilenet_v3_small", num_classes=10).eval()
    in_place = sum(isinstance(m, nn.Hardswish) and m.inplace for m in original.modules())
    desc = NetworkDescription.from_dict(describe(original, [3, 64, 64], name="mobilenet_v3_small").to_dict())
    assert [n.attrs for n in desc.nodes if n.op == "hardswish"] == [{"inplace": True}] * in_place and in_place > 10
    rebuilt = build_module(desc).eval()
    assert sum(isinstance(m, nn.Hardswish) and m.inplace for m in rebuilt.modules()) == in_place
    by_name = {_rebuilt_key(key): value for key, value in original.state_dict().items()}
    rebuilt.load_state_dict(by_name)  # strict: every tensor of each by its name
    x = torch.randn(2, 3, 64, 64)
    assert torch.equal(rebuilt(x), original(x))


def _rebuilt_key(key: str) -> str:
    """A state-dict key of a torchvision layer (``features.0.1.weight``) as the rebuilt network names it (its layer's
    path joined by underscores: ``features_0_1.weight``)."""
    layer, _, tensor = key.rpartition(".")
    return f"{layer.replace('.', '_')}.{tensor}"


class _BatchNormSubclass(nn.BatchNorm2d):
    """A batch norm of a class of the network's own (timm's BatchNormAct2d is one): traced through torch's forward,
    an ``F.batch_norm`` call of the layer's buffers."""


class _BatchNormCalls(nn.Module):
    """A convolution, then a batch norm as a layer (``norm``) or as ``F.batch_norm`` calls: ``"unkept"`` without
    running statistics, ``"momentum"`` the layer's tensors at a momentum of 0.05."""

    def __init__(self, norm: nn.Module | str) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, 4, 3)
        self.norm = norm if isinstance(norm, nn.Module) else nn.BatchNorm2d(4)
        self.call = None if isinstance(norm, nn.Module) else norm

    def forward(self, x):
        y = self.conv(x)
        if self.call == "unkept":
            return F.batch_norm(y, None, None, self.norm.weight, self.norm.bias, True)
        if self.call == "momentum":
            return F.batch_norm(y, self.norm.running_mean, self.norm.running_var, self.norm.weight, self.norm.bias,
                                self.training, 0.05)
        return self.norm(y)


@pytest.mark.parametrize("norm, attrs", [
    (nn.BatchNorm2d(4, momentum=0.3), {"momentum": 0.3}),
    (nn.BatchNorm2d(4, momentum=None), {"momentum": None}),
    (nn.BatchNorm2d(4, eps=1e-3, momentum=0.01), {"eps": 1e-3, "momentum": 0.01}),
    (nn.BatchNorm2d(4, track_running_stats=False), {"track_running_stats": False}),
    (nn.BatchNorm2d(4, affine=False, track_running_stats=False, momentum=0.5),
     {"affine": False, "track_running_stats": False}),
    (_BatchNormSubclass(4, momentum=None), {"momentum": None}),
    (_BatchNormSubclass(4, momentum=0.2), {"momentum": 0.2}),
    ("unkept", {"track_running_stats": False}),
    ("momentum", {"momentum": 0.05}),
])
def test_a_batch_norm_s_running_statistics_are_described_and_rebuilt(norm, attrs):
    """A batch norm's momentum was not read (a layer's nor a call's: the rebuilt network's running statistics moved
    by 0.1 where the original's by 0.3, or by a cumulative average), and one that tracks no running statistics was
    rebuilt with them (three buffers the network has not, and in evaluation its running statistics where the
    original normalises by the batch's); a call without running statistics was refused. Each is described now (a
    momentum of None: null) and rebuilt alike: the original's output in training, its running statistics after two
    steps, then its output in evaluation; its buffers, and the allocation model's setup."""
    import dataclasses

    from perf4sight.features.alloc_trace import record_events
    from perf4sight.features.formulas import HANDLERS

    torch.manual_seed(0)
    original = _BatchNormCalls(norm)
    desc = NetworkDescription.from_dict(describe(original, [3, 8, 8], name="bn").to_dict())
    (node,) = [n for n in desc.nodes if n.op == "batchnorm2d"]
    assert node.attrs == {"num_features": 4, **attrs}
    rebuilt = build_module(desc)
    with torch.no_grad():
        for mine, theirs in zip(rebuilt.parameters(), original.parameters(), strict=True):
            mine.copy_(theirs)
    for _ in range(2):
        x = torch.randn(3, 3, 8, 8)
        assert torch.allclose(rebuilt.train()(x), original.train()(x), atol=1e-5)
    kept = [b for b in rebuilt.buffers() if b.dtype.is_floating_point]
    assert len(kept) == (0 if attrs.get("track_running_stats") is False else 2)
    assert all(torch.allclose(b, getattr(original.norm, k)) for b, k in zip(kept, ("running_mean", "running_var")))
    assert torch.allclose(rebuilt.eval()(x), original.eval()(x), atol=1e-5)
    setup = [e for e in record_events(desc, 2, steps=1, method="model") if e[3] == "setup"]
    assert len(setup) == 2 + (2 if attrs.get("affine", True) else 0) + len(kept) + (len(kept) > 0)  # + the count
    untracked = dataclasses.replace(node, attrs={**node.attrs, "track_running_stats": False})
    read = [HANDLERS["batchnorm2d"](n, [[4, 6, 6]], False).bytes_read for n in (node, untracked)]
    assert read[0] - read[1] == (0 if attrs.get("track_running_stats") is False else 2 * 4 * 4)  # its [4] statistics


@pytest.mark.parametrize("attrs, inputs, expected", [
    ({"compare": "gt", "threshold": 0.0}, 3, None),
    ({"compare": "above", "threshold": 0.0}, 3, r"attr 'compare' must be one of gt, ge, lt, le, eq, ne, got 'above'"),
    ({"compare": "gt", "threshold": 0.0, "if_true": 1.0, "if_false": 0.0}, 1,
     r"attrs 'if_true' and 'if_false' exclude each other"),
    ({"compare": "gt", "threshold": 0.0, "if_false": 0.0}, 3, r"needs 2 inputs \(the condition's, then each branch"),
])
def test_a_where_node_s_attrs_and_inputs_are_checked_by_name(attrs, inputs, expected):
    """A description's ``where`` node: its compare, its branches given as numbers and its inputs are refused by name
    (``_where_problem``, read once by ``_attr_problem``)."""
    d = _conv_description()
    conv = d["nodes"][1]["name"]
    d["nodes"].append({"name": "gate", "op": "where", "inputs": [conv] * inputs, "attrs": attrs,
                       "output_shape": d["nodes"][1]["output_shape"]})
    d["output"] = "gate"
    d.pop("params")
    if expected is None:
        assert NetworkDescription.from_dict(d).node("gate").attrs == attrs
        return
    with pytest.raises(UserError, match=rf"conv.json: node 'gate' \(where\): {expected}"):
        NetworkDescription.from_dict(d, where="conv.json")
