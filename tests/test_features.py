"""Per-op formulas on hand-checked tiny graphs, aggregation, batch scaling, TX2 params."""
from __future__ import annotations

import json
import math
import weakref
from typing import Any

import numpy as np
import pytest

from perf4sight.features import FEATURE_NAMES, feature_matrix, features_for, network_features, unsupported_ops
from perf4sight.features.formulas import HANDLERS
from perf4sight.features.step_runtime import StepRuntime
from perf4sight.ir.schema import OPS, Node, load_description


from tiny_graphs import conv_node as _conv, tiny_description as _desc  # noqa: E402


def _cost(node, in_shapes, first=False):
    return HANDLERS[node.op](node, in_shapes, first)


def test_depthwise_conv_by_hand():
    node = _conv("dw", "input", 4, 4, 3, 4, 8)
    c = _cost(node, [[4, 8, 8]], first=True)
    assert c.kind == "depthwise"
    assert c.macs == 8 * 8 * 4 * 1 * 9  # one input channel per output channel
    assert c.params == 4 * 9
    assert c.flops_fwd == 2 * c.macs
    assert c.flops_bwd == 2 * c.macs  # first layer: weight gradient only
    c2 = _cost(node, [[4, 8, 8]], first=False)
    assert c2.flops_bwd == 4 * c.macs and c2.kernels_bwd == 2


def test_grouped_conv_by_hand():
    node = _conv("g", "x", 8, 16, 3, 2, 4, bias=True, stride=2)
    c = _cost(node, [[8, 8, 8]])
    assert c.kind == "grouped"
    assert c.macs == 4 * 4 * 16 * (8 // 2) * 9 == 9216
    assert c.params == 16 * 4 * 9 + 16
    assert c.flops_fwd == 2 * 9216 + 16 * 16  # + one bias add per output element
    assert c.bytes_read == (8 * 8 * 8 + c.params) * 4
    assert c.bytes_written == 16 * 4 * 4 * 4


def test_linear_by_hand():
    node = Node("fc", "linear", ["x"], {"in_features": 10, "out_features": 5, "bias": True}, [5])
    c = _cost(node, [[10]])
    assert (c.macs, c.params, c.flops_fwd) == (50, 55, 105)
    assert c.flops_bwd == 2 * 50 + 2 * 50 + 5


def test_layer_norm_and_layer_scale_by_hand():
    """A layer norm over 8 channels of a [4, 4, 8] map (ConvNeXt's, after a permute): 16 rows, each keeping a mean
    and an inverse deviation; a layer scale of shape [8, 1, 1] on an [8, 4, 4] map keeps its input."""
    norm = _cost(Node("ln", "layernorm", ["p"], {"normalized_shape": [8]}, [4, 4, 8]), [[4, 4, 8]])
    assert (norm.params, norm.param_tensors, norm.kind, norm.saved) == (16, 2, "norm", [0])
    assert norm.extra_saved_bytes == 2 * 16 * 4 and norm.flops_fwd == 5 * 128 and norm.kernels_bwd == 2
    bare = _cost(Node("ln", "layernorm", ["p"], {"normalized_shape": [8], "elementwise_affine": False}, [4, 4, 8]),
                 [[4, 4, 8]])
    assert (bare.params, bare.param_tensors, bare.kernels_bwd) == (0, 0, 1)
    scale = _cost(Node("s", "scale", ["x"], {"shape": [8, 1, 1]}, [8, 4, 4]), [[8, 4, 4]])
    assert (scale.params, scale.param_tensors, scale.saved, scale.flops_fwd) == (8, 1, [0], 128)
    assert scale.bytes_read == (128 + 8) * 4
    permute = _cost(Node("p", "permute", ["x"], {"dims": [0, 2, 3, 1]}, [4, 4, 8]), [[8, 4, 4]])
    assert permute.kind == "view" and permute.kernels_fwd == 0


def test_batch_norm_without_affine_parameters_by_hand():
    """A batch norm of 8 channels on an [8, 4, 4] map reads its input twice, its running mean and variance, and its
    weight and bias: those two are its parameters. With ``affine: false`` it has neither (it counted 2 x 8 params);
    its work and what it keeps stay."""
    node = Node("bn", "batchnorm2d", ["x"], {"num_features": 8}, [8, 4, 4])
    affine = _cost(node, [[8, 4, 4]])
    assert (affine.params, affine.param_tensors, affine.bytes_read) == (16, 2, (2 * 128 + 4 * 8) * 4)
    bare = _cost(Node("bn", "batchnorm2d", ["x"], {"num_features": 8, "affine": False}, [8, 4, 4]), [[8, 4, 4]])
    assert (bare.params, bare.param_tensors, bare.bytes_read) == (0, 0, (2 * 128 + 2 * 8) * 4)
    assert (bare.flops_fwd, bare.flops_bwd, bare.saved, bare.extra_saved_bytes, bare.kernels_bwd) == (
        affine.flops_fwd, affine.flops_bwd, affine.saved, affine.extra_saved_bytes, affine.kernels_bwd)
    tanh = _cost(Node("g", "gelu", ["x"], {"approximate": "tanh"}, [8, 4, 4]), [[8, 4, 4]])
    assert tanh == _cost(Node("g", "gelu", ["x"], {}, [8, 4, 4]), [[8, 4, 4]])  # the approximation costs the same


def test_self_attention_by_hand():
    """Self-attention over 5 tokens of width 8 in 2 heads: projections 4 x 5 x 8 x 8 MACs, scores and weighted sum
    2 x 5 x 5 x 8; it keeps its input, the queries, keys and values, the fused kernel's output and a log-sum-exp per
    head and token; backward computes the scores again."""
    node = Node("a", "attention", ["x"], {"embed_dim": 8, "num_heads": 2, "bias": True}, [5, 8])
    c = _cost(node, [[5, 8]])
    assert c.macs == 4 * 5 * 8 * 8 + 2 * 5 * 5 * 8 and c.params == 4 * 64 + 4 * 8 and c.param_tensors == 4
    assert c.saved == [0] and c.extra_saved_bytes == (4 * 5 * 8 + 2 * 5) * 4
    assert c.flops_bwd == 4 * c.macs + 2 * 5 * 5 * 8 + 2 * 5 * 2 * 25
    assert _cost(node, [[5, 8]], first=True).flops_bwd < c.flops_bwd
    token = _cost(Node("t", "token", ["x"], {"shape": [1, 8], "dim": 1}, [6, 8]), [[5, 8]])
    shift = _cost(Node("s", "shift", ["x"], {"shape": [6, 8]}, [6, 8]), [[6, 8]])
    assert (token.params, token.flops_fwd, shift.params, shift.flops_fwd) == (8, 0, 48, 48)


def _kept_storages(own: set[int]) -> tuple[Any, dict[int, int]]:
    """A saved-tensors hooks context that records each storage autograd keeps for backward (bytes, by address),
    those at the addresses ``own`` aside, and the dict it fills. (The hooks skip torch's version-counter check: a
    network torch would refuse at backward is counted as if it trained.)"""
    import torch
    saved: dict[int, int] = {}

    def pack(t):
        if t.untyped_storage().data_ptr() not in own:
            saved[t.untyped_storage().data_ptr()] = t.untyped_storage().nbytes()
        return t
    return torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t), saved


def _held_storages(own: set[int]) -> tuple[Any, Any]:
    """:func:`_kept_storages`, counting only what autograd still holds when the second value, a function, is called:
    a saved tensor of a node torch freed before (a dead branch's, a value read only as a where's condition: freed
    with its output) is no longer kept for backward."""
    import torch

    class Packed:
        __slots__ = ("t", "__weakref__")

    packed: list[tuple[Any, int, int]] = []

    def pack(t):
        if t.untyped_storage().data_ptr() in own:
            return t
        box = Packed()
        box.t = t.detach()  # an op's output kept as it is would hold its own node (a cycle that keeps both alive)
        packed.append((weakref.ref(box), t.untyped_storage().data_ptr(), t.untyped_storage().nbytes()))
        return box

    def held() -> dict[int, int]:
        return {ptr: nbytes for ref, ptr, nbytes in packed if ref() is not None}
    return torch.autograd.graph.saved_tensors_hooks(pack, lambda b: b.t if isinstance(b, Packed) else b), held


def _autograd_saved_bytes(desc, batch: int, loss: bool = False, with_input: bool = True,
                          fused_rms_norm: bool = False) -> float:
    """Bytes per sample that autograd keeps for backward in one training forward of ``desc`` built by to_torch (and
    with ``loss``, its cross entropy on random labels, as the profiler's child computes it): each storage once,
    parameters and buffers aside (and the input batch, unless ``with_input``); with ``fused_rms_norm``, its RMS norms
    run as a CUDA build runs them (the trace's stand-in), not op by op as on this CPU. Only what autograd still holds
    at the end of the forward counts (:func:`_held_storages`)."""
    import torch
    from perf4sight.features.alloc_trace import _fused_rms_norm
    from perf4sight.ir.to_torch import build_module
    torch.manual_seed(0)
    model = build_module(desc).train()
    if fused_rms_norm:
        _fused_rms_norm(model)
    x = torch.randn(batch, *desc.input_shape)
    own = {t.untyped_storage().data_ptr() for t in list(model.parameters()) + list(model.buffers())}
    if not with_input:
        own.add(x.untyped_storage().data_ptr())
    hooks, held = _held_storages(own)
    with hooks:
        out = model(x)
        if loss:
            out = torch.nn.functional.cross_entropy(out, torch.randint(0, desc.num_classes, [batch] + desc.label_shape))
    return sum(held().values()) / batch


def test_dilated_depthwise_work_is_a_feature_of_its_own():
    """The MACs of depthwise convolutions that dilate (this CPU runs them 5-12 times as long as undilated ones) are
    counted apart, per sample and scaled by the batch size; an undilated depthwise or a dilated dense convolution
    adds nothing to them."""
    def dilate(node, d):
        node.attrs.update(dilation=[d, d], padding=[d, d])
        return node
    nodes = [Node("input", "input", [], {}, [4, 8, 8]), dilate(_conv("dw2", "input", 4, 4, 3, 4, 8), 2),
             _conv("dw", "dw2", 4, 4, 3, 4, 8), dilate(_conv("dense2", "dw", 4, 8, 3, 1, 8), 2)]
    nf = network_features(_desc(nodes))
    assert nf.per_sample["dilated_dw_macs"] == _cost(nodes[1], [[4, 8, 8]]).macs == 4 * 8 * 8 * 9
    row = dict(zip(FEATURE_NAMES, feature_matrix(nf, [3])[0]))
    assert row["dilated_dw_macs"] == 3 * 4 * 8 * 8 * 9 and FEATURE_NAMES[-2:] == ("dilated_dw_macs", "priced_ops_ms")


@pytest.mark.parametrize("tokens, width, heads", [(256, 64, 4), (17, 96, 3)])
def test_self_attention_keeps_what_torch_keeps(tokens, width, heads):
    """The bytes the formula keeps for backward (the input and the extra tensors) are what autograd saves for a
    real ``nn.MultiheadAttention`` self-attention step on this torch, parameters aside."""
    pytest.importorskip("torch")
    node = Node("a", "attention", ["input"], {"embed_dim": width, "num_heads": heads, "bias": True}, [tokens, width])
    desc = _desc([Node("input", "input", [], {}, [tokens, width]), node], shape=(tokens, width))
    kept = tokens * width * 4 + _cost(node, [[tokens, width]]).extra_saved_bytes  # the input (saved=[0]), the rest
    assert _autograd_saved_bytes(desc, 2) == kept  # each storage once (q, k and v share one)


def test_window_attention_by_hand():
    """Windows of 7x7 over a 10x12 map of width 8 in 2 heads: the map is padded to 14x14 (T = 196 positions, N = 49
    a window); projections 4 T E^2 MACs, scores and weighted sum T N E each; a bias table of 13 x 13 per head; it
    keeps 5 T E + H T N elements, and a shifted one launches more kernels (the roll, the mask)."""
    attrs = {"embed_dim": 8, "num_heads": 2, "window_size": [7, 7], "shift_size": [0, 0], "bias": True}
    plain = _cost(Node("w", "window_attention", ["x"], attrs, [10, 12, 8]), [[10, 12, 8]])
    shifted = _cost(Node("w", "window_attention", ["x"], {**attrs, "shift_size": [3, 3]}, [10, 12, 8]), [[10, 12, 8]])
    assert plain.macs == 4 * 196 * 64 + 2 * 196 * 49 * 8 and plain.params == 4 * 64 + 4 * 8 + 13 * 13 * 2
    assert plain.extra_saved_bytes == (5 * 196 * 8 + 2 * 196 * 49) * 4 and plain.saved == []
    assert shifted.macs == plain.macs and shifted.kernels_fwd > plain.kernels_fwd
    v2 = _cost(Node("w", "window_attention", ["x"], {**attrs, "cosine": True, "position_bias_mlp": 16}, [10, 12, 8]),
               [[10, 12, 8]])  # Swin V2: an MLP 2 -> 16 -> 2 heads for the bias table, a scale per head
    assert v2.macs == plain.macs and v2.params == 4 * 64 + 4 * 8 + 3 * 16 + 16 * 2 + 2
    assert v2.extra_saved_bytes == (8 * 196 * 8 + 2 * 2 * 196 * 49 + 4 * 2 * 196) * 4
    assert v2.flops_fwd > plain.flops_fwd and v2.kernels_fwd > plain.kernels_fwd and v2.param_tensors == 8
    merge = _cost(Node("m", "patch_merge", ["x"], {}, [5, 6, 32]), [[10, 12, 8]])
    assert merge.params == 0 and merge.saved == [] and merge.bytes_written == 2 * 5 * 6 * 32 * 4


@pytest.mark.parametrize("groups, window, width, heads", [(4, [7, 7], 32, 2), (9, [3, 5], 48, 4), (16, [3, 3], 16, 1)])
def test_group_attention_keeps_what_autograd_keeps(groups, window, width, heads):
    """MaxViT's attention within groups of ``N`` tokens, ``T`` in all, after a linear layer (so that its input is kept
    as an activation): projections ``4 T E^2`` MACs, scores and weighted sum ``T N E`` each, a bias per head and
    relative position; it keeps ``5 T E + H T N`` elements per sample (one head: ``6 T E + H T N``), exactly
    autograd's (what a sample adds between batch 2 and 4)."""
    pytest.importorskip("torch")
    n = window[0] * window[1]
    tokens = groups * n
    attrs = {"embed_dim": width, "num_heads": heads, "window_size": window, "bias": True}
    node = Node("g", "group_attention", ["fc"], attrs, [groups, n, width])
    c = _cost(node, [[groups, n, width]])
    assert c.macs == 4 * tokens * width ** 2 + 2 * tokens * n * width and c.saved == [0]
    assert c.params == 4 * width ** 2 + 4 * width + (2 * window[0] - 1) * (2 * window[1] - 1) * heads
    desc = _desc([Node("input", "input", [], {}, [groups, n, width]),
                  Node("fc", "linear", ["input"], {"in_features": width, "out_features": width, "bias": True},
                       [groups, n, width]), node], shape=(groups, n, width))
    nf = network_features(desc)
    at2, at4 = 2 * _autograd_saved_bytes(desc, 2), 4 * _autograd_saved_bytes(desc, 4)
    loss = tokens * width * 4 + n * width * 8  # its output read as scores per position: the log-softmax and labels
    assert nf.per_sample["saved_bytes"] + nf.per_sample["input_bytes"] - loss == (at4 - at2) / 2
    kept = ((5 if heads > 1 else 6) * tokens * width + heads * tokens * n) * 4
    assert kept == c.extra_saved_bytes + tokens * width * 4  # and its input (saved: [0])


@pytest.mark.parametrize("name, shape", [("swin_t", [3, 64, 64]), ("swin_t", [3, 72, 88]),
                                         ("swin_v2_t", [3, 64, 64]), ("swin_v2_t", [3, 72, 88])])
def test_swin_keeps_what_autograd_keeps(name, shape):
    """torchvision's Swin-T, V1 and V2, at two input sizes (at 72x88 no stage's map is a whole number of windows, and
    the last two stages are one window each, unshifted): the tensors kept for backward per sample are exactly
    autograd's (what a sample adds between batch 2 and 4); V2's position-bias MLPs keep theirs once a step, as the
    formulas' once-a-batch tensors say (they said none: 7.8 MB of swin_v2_t's left out)."""
    pytest.importorskip("torch")
    from perf4sight.networks.zoo import describe_zoo
    desc = describe_zoo(name, shape, num_classes=10)
    nf = network_features(desc, StepRuntime(relu6_clone=True, foreach=False, dropout_mask_bytes=4))
    assert nf.unsupported == [] and nf.kernels is not None
    from perf4sight.ir.to_torch import build_module  # the update's kernels: one set per parameter tensor torch has
    assert nf.kernels.param_tensors == nf.static["param_tensors"] == len(list(build_module(desc).parameters()))
    at2, at4 = 2 * _autograd_saved_bytes(desc, 2), 4 * _autograd_saved_bytes(desc, 4)
    assert nf.per_sample["saved_bytes"] + nf.per_sample["input_bytes"] == (at4 - at2) / 2
    once = at2 - (at4 - at2)  # kept once a step: nothing for V1, the MLPs' hidden layers and more for V2
    assert once == 0 if name == "swin_t" else 12 * (15 * 15 * 512 * 4) < once < 10e6
    assert nf.batch_saved_sizes.sum() == once


def test_a_segmentation_step_keeps_what_autograd_keeps():
    """A network that scores every pixel (a strided convolution, scores per class, a bilinear resize back to the
    input's size): its tensors kept for backward, the loss's log-softmax and int64 labels included, are exactly
    autograd's per sample (what a sample adds between batch 2 and 4); the resize keeps nothing, and the loss adds its
    kernels and FLOPs, which a classifier's leaves out."""
    pytest.importorskip("torch")
    from torch import nn

    from perf4sight.ir.from_torch import describe
    net = nn.Sequential(nn.Conv2d(3, 8, 3, stride=2, padding=1), nn.ReLU(), nn.Conv2d(8, 5, 1),
                        nn.Upsample(scale_factor=2, mode="bilinear"))
    desc = describe(net, [3, 16, 16], "seg")
    assert desc.label_shape == [16, 16] and desc.num_classes == 5
    nf = network_features(desc, StepRuntime(relu6_clone=True, foreach=False, dropout_mask_bytes=4))
    at2, at4 = 2 * _autograd_saved_bytes(desc, 2, loss=True), 4 * _autograd_saved_bytes(desc, 4, loss=True)
    assert nf.per_sample["saved_bytes"] + nf.per_sample["input_bytes"] == (at4 - at2) / 2
    assert nf.per_sample["input_bytes"] == (3 * 4 + 8) * 16 * 16  # the images, and a label per pixel
    resize = _cost(desc.nodes[-1], [[5, 8, 8]])
    assert resize.saved == [] and resize.extra_saved_bytes == 0 and resize.flops_fwd == 8 * 5 * 16 * 16
    head = network_features(describe(nn.Sequential(*net, nn.AdaptiveAvgPool2d(1), nn.Flatten()), [3, 16, 16], "cls"))
    assert nf.static["kernels_fwd"] == head.static["kernels_fwd"] - 1 + 2  # no pooling; log-softmax and likelihood


def test_a_resize_costs_and_allocates_by_its_output_whatever_gave_its_size():
    """A resize kept as a scale factor (nn.Upsample(scale_factor=2)) costs what the same resize to its size costs:
    the formulas and the allocation trace read the output's shape and the mode, never ``scale_factor``."""
    pytest.importorskip("torch")
    from torch import nn

    from perf4sight.features.alloc_trace import simulate
    from perf4sight.ir.from_torch import describe
    from perf4sight.ir.schema import NetworkDescription
    net = nn.Sequential(nn.Conv2d(3, 8, 3, stride=2, padding=1), nn.Upsample(scale_factor=2, mode="bilinear"),
                        nn.Conv2d(8, 4, 3, stride=2, padding=1), nn.Upsample(scale_factor=(2, 3)))
    scaled = describe(net, [3, 16, 16], "seg")
    data = scaled.to_dict()
    assert [n["attrs"].pop("scale_factor") for n in data["nodes"] if n["op"] == "interpolate"] == [[2, 2], [2, 3]]
    sized = NetworkDescription.from_dict(data)
    a, b = network_features(scaled), network_features(sized)
    assert (a.per_sample, a.static) == (b.per_sample, b.static) and np.array_equal(a.saved_sizes, b.saved_sizes)
    ta, tb = simulate(scaled, (1, 4)), simulate(sized, (1, 4))
    assert all(np.array_equal(getattr(ta, k), getattr(tb, k)) for k in ("kind", "tensor", "const", "per_sample"))


@pytest.mark.parametrize("relu6_clone", [True, False])
def test_instance_norm_hardtanh_and_softmax_keep_what_autograd_keeps(relu6_clone):
    """An instance norm keeps its input, a mean and a 1/std per sample and channel and, where affine, its weight
    repeated per sample; a hardtanh its input (in place: a clone of it on torch >= 1.10, ``relu6_clone``; its result
    before); a softmax its result: what a sample adds to autograd's saved tensors between batch 2 and 4, exactly
    (on this torch; the older rule, one input-sized tensor less per in-place hardtanh)."""
    pytest.importorskip("torch")
    import torch.nn.functional as F
    from torch import nn

    from perf4sight.ir.from_torch import describe

    class Net(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.c1, self.n1 = nn.Conv2d(3, 8, 3, padding=1), nn.InstanceNorm2d(8, affine=True)
            self.c2, self.n2, self.fc = nn.Conv2d(8, 16, 3, 2, 1), nn.InstanceNorm2d(16), nn.Linear(16, 10)

        def forward(self, x):
            x = F.hardtanh(self.n1(self.c1(x)) * 2, -1.0, 1.0, inplace=True)
            y = F.hardtanh(self.n2(self.c2(x)), -0.5, 0.5).flatten(2).softmax(-1)
            return self.fc(y.mean(2))

    desc = describe(Net(), [3, 12, 12], "kept")
    nf = network_features(desc, StepRuntime(relu6_clone=relu6_clone))
    at2, at4 = 2 * _autograd_saved_bytes(desc, 2), 4 * _autograd_saved_bytes(desc, 4)
    clamped = 8 * 12 * 12 * 4  # the in-place hardtanh's input (this torch keeps a clone of it)
    assert nf.per_sample["saved_bytes"] + nf.per_sample["input_bytes"] == (at4 - at2) / 2 - clamped * (not relu6_clone)
    norm = _cost(desc.nodes[2], [[8, 12, 12]])
    assert norm.extra_saved_bytes == 3 * 8 * 4 and norm.params == 16 and norm.kernels_bwd == 3


def test_kept_for_backward_is_what_autograd_keeps():
    """The analytic estimate's activations (the tensors kept for backward and the input batch) against autograd's
    saved tensors of the same networks on this torch, under the rules of a CPU step on it: torchvision's MobileNetV2
    (in-place ReLU6, which keeps a clone of its input on torch >= 1.10), ViT (dropouts of p 0, which hand their input
    back; attention's fused kernel), ConvNeXt, ResNet-18, AlexNet (dropouts that keep the CPU's float noise) and
    generated networks of every style (ReLU6 not in place). Within 4%: batch norm's statistics are per batch,
    counted per sample (at batch 4)."""
    pytest.importorskip("torch")
    from perf4sight.networks.generator import GeneratorSettings, generate
    from perf4sight.networks.zoo import describe_zoo
    descs = [describe_zoo(n, [3, 64, 64], num_classes=10) for n in ("mobilenet_v2", "vit_b_32", "convnext_tiny",
                                                                   "resnet18", "alexnet")]
    descs += generate(GeneratorSettings(count=5, seed=0, cover_styles=True), [3, 64, 64], 10)
    cpu = StepRuntime(relu6_clone=True, foreach=False, dropout_mask_bytes=4)
    for desc in descs:
        nf = network_features(desc, cpu)
        analytic = nf.per_sample["saved_bytes"] + nf.per_sample["input_bytes"]
        assert analytic == pytest.approx(_autograd_saved_bytes(desc, 4), rel=0.04), desc.name
    old = network_features(descs[0], StepRuntime(relu6_clone=False))  # the TX2's torch: one tensor less per ReLU6
    assert old.per_sample["saved_bytes"] < 0.8 * network_features(descs[0], cpu).per_sample["saved_bytes"]
    alexnet = descs[4]  # two dropouts of p 0.5: CUDA's fused kernel keeps a byte an element, the CPU four
    on_gpu = network_features(alexnet, StepRuntime(relu6_clone=True)).per_sample["saved_bytes"]
    dropped = sum(np.prod(n.output_shape) for n in alexnet.nodes if n.op == "dropout")
    assert network_features(alexnet, cpu).per_sample["saved_bytes"] - on_gpu == 3 * dropped > 0
    from perf4sight.fingerprint.gnn_graph import NODE_FEATURES, graph_template  # the GNN's nodes follow the rules
    col = NODE_FEATURES.index("saved_bytes")
    gpu_nodes = np.expm1(graph_template(alexnet).x[:, col].astype(float)).sum()
    assert np.expm1(graph_template(alexnet, cpu).x[:, col].astype(float)).sum() - gpu_nodes == \
        pytest.approx(3 * dropped, rel=1e-4)


def test_step_runtime_is_read_from_the_rows_and_stored_with_the_fingerprint():
    """A set of rows names the rules its torch ran under: a CPU's single-tensor update and float dropout noise, a
    GPU's foreach update and one-byte mask, the ReLU6 of torch >= 1.10; stored in a fingerprint's metadata they read
    back the same, and a fingerprint stored before a rule existed reads that rule's old default."""
    from perf4sight.fingerprint.fit import step_runtime
    cpu_rows = [{"backend": "cpu", "threads": 1, "torch_version": "2.14.1", "phase": "train_adam"}] * 2
    cpu = step_runtime(cpu_rows)
    assert cpu == StepRuntime(optimizer="adam", relu6_clone=True, foreach=False, dropout_mask_bytes=4,
                              native_conv=True, weight_decay=False, grads_to_none=True, update_as_run=True)
    gpu = step_runtime([{"backend": "nvml", "torch_version": "2.1.0"}])
    # SGD with momentum and no weight decay (this tool's profiler before it recorded them), foreach, a one-byte mask,
    # the gradients freed by zero_grad (this tool's profiler always did), cuBLAS's workspace of a GPU named no Hopper
    assert gpu == StepRuntime(relu6_clone=True, weight_decay=False, grads_to_none=True, update_as_run=True,
                              blas_workspace=(8519680, 0))
    assert not step_runtime([{"backend": "imported"}]).grads_to_none  # perf4sight's profiler kept them
    assert not step_runtime([{"backend": "nvml", "torch_version": "1.9.0"}]).foreach  # SGD's loop before torch 2.0
    for rt in (cpu, gpu):
        assert StepRuntime.from_metadata(json.loads(json.dumps(rt.metadata()))) == rt
    assert StepRuntime.from_metadata({"optimizer": "adam", "relu6_clone": True, "optimizer_foreach": False}) == \
        StepRuntime(optimizer="adam", relu6_clone=True, foreach=False)  # stored before the dropout rule
    with pytest.raises(ValueError, match="relu6_clone is not true or false"):
        StepRuntime.from_metadata({"relu6_clone": "yes"})
    with pytest.raises(ValueError, match="dropout_mask_bytes must be 1 or 4"):
        StepRuntime.from_metadata({"dropout_mask_bytes": 2})
    assert cpu.with_optimizer("sgd").optimizer == "sgd" and cpu.with_optimizer("sgd").dropout_mask_bytes == 4


def test_the_updates_momentum_and_weight_decay_are_read_from_the_rows():
    """SGD's momentum buffer and an L2 weight decay change the step's state and kernels: the rows record them; rows
    from before read what their profiler ran (imported perf4sight rows: momentum 0.9 and weight decay 5e-4, as its
    TX2 profiler; this tool's own: momentum, no decay); rows of two updates are refused."""
    from perf4sight.errors import UserError
    from perf4sight.features.optimizers import optimizer_cost
    from perf4sight.fingerprint.fit import step_runtime
    from perf4sight.importers.perf4sight_csv import PROTOCOL, UPDATE
    own = {"backend": "cpu", "torch_version": "2.14.1", "threads": 1}
    plain = step_runtime([dict(own, momentum="0.0", weight_decay="0.0")] * 2)
    decayed = step_runtime([dict(own, momentum="0.9", weight_decay="0.0005"), dict(own, momentum="0.5",
                                                                                   weight_decay="0.01")])
    assert (plain.momentum, plain.decays, decayed.momentum, decayed.decays) == (False, False, True, True)
    assert step_runtime([own]) == step_runtime([dict(own, momentum="0.9", weight_decay="0.0")])  # before: defaults
    imported = [{"backend": "imported", "protocol": PROTOCOL}]
    assert step_runtime(imported) == step_runtime([dict(imported[0], **UPDATE)])
    assert step_runtime(imported).decays and UPDATE == {"momentum": "0.9", "weight_decay": "0.0005"}
    with pytest.raises(UserError, match="rows of several updates"):
        step_runtime([dict(own, momentum="0.0"), own])
    # AdamW's in-place decay is counted where it ran, so rows of 0 and 0.01 are of two updates; Adam's L2 decay: 1
    # kernel, 3 tensors more
    adamw = [dict(own, phase="train_adamw", weight_decay=w) for w in ("0.01", "0.0")]
    assert step_runtime(adamw[:1]).update_cost() == optimizer_cost("adamw")
    with pytest.raises(UserError, match=r"updates \(momentum -, weight decay 0.0; momentum -, weight decay 0.01"):
        step_runtime(adamw)
    adam = step_runtime([dict(own, phase="train_adam", weight_decay="0.01")]).update_cost()
    assert (adam.kernels_per_tensor, adam.tensor_passes) == (8, 21)
    # what the features count: SGD without momentum keeps two parameter copies (weights, grads), with it three
    from perf4sight.networks.zoo import describe_zoo
    desc = describe_zoo("squeezenet1_0", [3, 32, 32], num_classes=10)
    col = FEATURE_NAMES.index("param_copies_mb")
    copies = [feature_matrix(network_features(desc, rt), [4])[0, col] for rt in (plain, decayed)]
    assert copies[1] == pytest.approx(1.5 * copies[0]) and copies[0] == pytest.approx(2 * desc.params * 4 / 2**20)
    for rt in (plain, decayed):
        assert StepRuntime.from_metadata(json.loads(json.dumps(rt.metadata()))) == rt
    old = StepRuntime.from_metadata({"optimizer": "sgd"})  # stored before: SGD's momentum and perf4sight's decay
    assert old.momentum and old.decays and not old.update_as_run
    assert not old.grads_to_none  # and its gradients kept between steps, as perf4sight's torch 1.x did
    # counted as it was fitted: the momentum update one kernel, a zero_() whatever the step did; rows of the same
    # update fitted now count torch's kernels (the momentum's mul_ and add_, the kept gradients' zero_())
    assert (old.update_cost().kernels_per_tensor, old.update_cost().tensor_passes) == (4, 10)
    now = step_runtime(imported).update_cost()
    assert (now.kernels_per_tensor, now.tensor_passes) == (5, 12)
    for bad, message in ((("sgd_momentum", 0), "momentum is not true or false"),
                         (("weight_decay", "yes"), "weight_decay is not true, false or null"),
                         (("zero_grad_set_to_none", 1), "grads_to_none is not true or false"),
                         (("update_counted_as_run", "no"), "update_as_run is not true or false")):
        with pytest.raises(ValueError, match=message):
            StepRuntime.from_metadata(dict([bad]))


def test_pooling_keeps_what_its_backward_reads():
    """Max and average pooling keep their input (max pooling its indices too); adaptive average pooling keeps it
    unless it pools to 1x1, which torch runs as a mean that keeps nothing."""
    window = {"kernel_size": [2, 2], "stride": [2, 2], "padding": [0, 0], "ceil_mode": False}
    assert _cost(Node("m", "maxpool2d", ["x"], window, [4, 4, 4]), [[4, 8, 8]]).saved == [0]
    assert _cost(Node("a", "avgpool2d", ["x"], window, [4, 4, 4]), [[4, 8, 8]]).saved == [0]
    to = {n: _cost(Node("g", "adaptiveavgpool2d", ["x"], {"output_size": [n, n]}, [4, n, n]), [[4, 8, 8]]).saved
          for n in (1, 2)}
    assert to == {1: [], 2: [0]}


def test_convnext_features_count_every_parameter():
    from perf4sight.networks.zoo import describe_zoo

    desc = describe_zoo("convnext_tiny", [3, 32, 32], num_classes=10)
    nf = network_features(desc)
    assert not nf.unsupported and nf.static["params"] == desc.params == 27_827_818
    assert nf.per_sample["norm_elems"] > 0 and nf.kernels is not None
    vit = describe_zoo("vit_b_32", [3, 64, 64], num_classes=10)
    nf = network_features(vit)
    assert not nf.unsupported and nf.static["params"] == vit.params and nf.static["blas_context"] == 1.0


def test_every_schema_op_has_a_formula():
    assert set(OPS) <= set(HANDLERS)


def _tiny():
    return _desc([
        Node("input", "input", [], {}, [4, 8, 8]),
        _conv("c1", "input", 4, 8, 3, 1, 8),
        Node("bn", "batchnorm2d", ["c1"], {"num_features": 8}, [8, 8, 8]),
        Node("r", "relu", ["bn"], {}, [8, 8, 8]),
        _conv("dw", "r", 8, 8, 3, 8, 8),
        Node("add", "add", ["dw", "r"], {}, [8, 8, 8]),
        Node("pool", "adaptiveavgpool2d", ["add"], {"output_size": [1, 1]}, [8, 1, 1]),
        Node("flat", "reshape", ["pool"], {"shape": [-1]}, [8]),
        Node("fc", "linear", ["flat"], {"in_features": 8, "out_features": 5, "bias": True}, [5]),
    ])


def test_network_aggregation_by_hand():
    d = _tiny()
    nf = network_features(d)
    assert nf.unsupported == []
    dense = 64 * 8 * 4 * 9
    dw = 64 * 8 * 9
    assert nf.per_sample["dense_macs"] == dense and nf.per_sample["depthwise_macs"] == dw
    assert nf.per_sample["macs"] == dense + dw + 40
    assert nf.static["params"] == d.params == 8 * 4 * 9 + 16 + 8 * 9 + 45
    assert nf.static["depth"] == 3  # c1 -> dw -> fc
    assert nf.static["branch_nodes"] == 1 and nf.static["n_add"] == 1  # r feeds dw and add
    # saved for backward: c1 out (bn input), r out (relu output, dw input), flat->pool (fc input,
    # a view resolved to pool); the network input is counted in input_bytes, not here
    assert nf.per_sample["saved_bytes"] == (512 + 512 + 8) * 4  # bn mean/invstd: once a batch
    assert nf.batch_saved_sizes.tolist() == [8 * 4, 8 * 4]
    assert nf.per_sample["max_activation_bytes"] == 512 * 4


def test_features_scale_with_batch_size_and_batched_path_agrees():
    nf = network_features(_tiny())
    f1, f8 = features_for(nf, 1), features_for(nf, 8)
    assert f8["macs"] == 8 * f1["macs"] and f8["saved_bytes"] == 8 * f1["saved_bytes"]
    assert f8["params"] == f1["params"] and f8["kernels"] == f1["kernels"] > 0
    expected_mem = (3 * f1["params"] * 4 + nf.batch_saved_sizes.sum()  # the batch norm's statistics, once a batch
                    + 8 * (f1["saved_bytes"] + f1["max_activation_bytes"] + f1["input_bytes"])) / 2**20
    assert f8["mem_analytic_mb"] == pytest.approx(expected_mem)
    M = feature_matrix(nf, [1, 8, 32])
    assert M.shape == (3, len(FEATURE_NAMES))
    np.testing.assert_allclose(M[1], [f8[k] for k in FEATURE_NAMES])
    M2 = feature_matrix([nf, nf], [8, 1])
    np.testing.assert_allclose(M2[0], M[1])


def test_analytic_memory_splits_into_the_parameter_copies_and_the_rest():
    """``param_copies_mb`` is the weights, gradients and optimiser state (3 parameter-sized fp32 copies for SGD
    with momentum, 4 for Adam's two moments), ``mem_analytic_rest_mb`` the rest of the estimate, at any batch size
    and in a batched matrix of networks with different optimisers."""
    sgd, adam = network_features(_tiny()), network_features(_tiny(), StepRuntime(optimizer="adam"))
    for nf, copies in ((sgd, 3), (adam, 4)):
        for bs in (1, 16):
            f = features_for(nf, bs)
            assert f["param_copies_mb"] == pytest.approx(copies * f["params"] * 4 / 2**20)
            assert f["param_copies_mb"] + f["mem_analytic_rest_mb"] == pytest.approx(f["mem_analytic_mb"])
            rest = f["saved_bytes"] + nf.batch_saved_sizes.sum() + f["max_activation_bytes"] + f["input_bytes"]
            assert f["mem_analytic_rest_mb"] == pytest.approx(rest / 2**20)
    M = feature_matrix([sgd, adam], [4, 4])
    col = FEATURE_NAMES.index("param_copies_mb")
    assert M[1, col] / M[0, col] == pytest.approx(4 / 3)


def test_im2col_counts_dense_convolutions_wider_than_1x1_only():
    """The workspace proxy: input channels x kernel area x output positions x 4 bytes, per sample, summed over
    dense and grouped convolutions wider than 1x1 (not depthwise, not 1x1), in MiB at the batch size."""
    nf = network_features(_tiny())  # c1: dense 3x3, 4 -> 8 channels, 8x8 out; dw: depthwise 3x3
    assert features_for(nf, 8)["im2col_mb"] == pytest.approx(8 * 4 * 9 * 64 * 4 / 2**20)
    pointwise = network_features(_desc([Node("input", "input", [], {}, [4, 8, 8]), _conv("p", "input", 4, 8, 1, 1, 8),
                                        Node("flat", "reshape", ["p"], {"shape": [-1]}, [512])]))
    assert features_for(pointwise, 8)["im2col_mb"] == 0.0


def test_native_conv_macs_are_the_convolutions_torch_runs_outside_onednn():
    """``native_conv_macs`` at each batch size is the MACs of exactly the convolutions that torch's own CPU dispatch
    (one thread) sends to a native path instead of oneDNN: non-strided, undilated 1x1 convolutions under batch 16,
    and at batch 1 every small ungrouped one."""
    torch = pytest.importorskip("torch")
    select = getattr(torch._C, "_select_conv_backend", None)
    if select is None:
        pytest.skip("this torch has no torch._C._select_conv_backend to compare with")
    from perf4sight.ir.from_torch import describe
    nn = torch.nn
    net = nn.Sequential(nn.Conv2d(3, 16, 3, padding=1), nn.Conv2d(16, 24, 1), nn.Conv2d(24, 32, 1, stride=2),
                        nn.Conv2d(32, 32, 1, groups=4), nn.Conv2d(32, 16, 3, padding=1),
                        nn.Conv2d(16, 8, 1, dilation=2), nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(8, 10))
    desc = describe(net, [3, 16, 16], "dispatch")
    shapes = {n.name: n.output_shape for n in desc.nodes}
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        slow_at = {}
        for b in (1, 2, 8, 15, 16, 32):
            slow = 0.0
            for node in (n for n in desc.nodes if n.op == "conv2d"):
                a = node.attrs
                x = torch.empty([b] + shapes[node.inputs[0]])
                w = torch.empty(a["out_channels"], a["in_channels"] // a["groups"], *a["kernel_size"])
                backend = select(x, w, None, list(a["stride"]), list(a["padding"]), list(a["dilation"]), False, [0, 0],
                                 a["groups"], None)
                if not str(backend).endswith("Mkldnn"):  # Slow2d, or SlowDilated2d for a dilated one at batch 1
                    slow += (a["in_channels"] // a["groups"] * int(np.prod(a["kernel_size"]))
                             * int(np.prod(node.output_shape)))
            slow_at[b] = slow
            assert features_for(desc, b)["native_conv_macs"] == pytest.approx(slow * b)
    finally:
        torch.set_num_threads(threads)
    assert slow_at[8] == 16 * 24 * 16 * 16 + 8 * 32 * 8 * 8  # the plain and the grouped 1x1 convolutions
    assert slow_at[16] == slow_at[32] == 0.0


def test_blas_context_flags_linear_layers_and_needs_both_values_to_be_a_term():
    """A network with a linear layer, or a product of activations, loads the BLAS library (1), one whose classifier is
    a conv does not (0); the memory form with that term is offered only on rows that have both kinds."""
    from perf4sight.fingerprint.select import CANDIDATES, _has_terms
    with_fc = network_features(_tiny())
    conv_head = network_features(_desc([
        Node("input", "input", [], {}, [4, 8, 8]), _conv("c1", "input", 4, 8, 3, 1, 8),
        Node("pool", "adaptiveavgpool2d", ["c1"], {"output_size": [1, 1]}, [8, 1, 1]),
        Node("flat", "reshape", ["pool"], {"shape": [-1]}, [8])]))
    col = FEATURE_NAMES.index("blas_context")
    assert features_for(with_fc, 4)["blas_context"] == 1.0 and features_for(conv_head, 4)["blas_context"] == 0.0
    product = network_features(_desc([  # a product of two maps' rows, no linear layer: a batched GEMM (cuBLAS's)
        Node("input", "input", [], {}, [4, 8, 8]), _conv("c1", "input", 4, 8, 3, 1, 8),
        Node("t", "transpose", ["c1"], {"dim0": 2, "dim1": 3}, [8, 8, 8]),
        Node("mm", "matmul", ["c1", "t"], {}, [8, 8, 8])]))
    assert features_for(product, 4)["blas_context"] == 1.0
    form = next(c for c in CANDIDATES["memory"] if "blas_context" in (c.terms or ()))
    mixed = feature_matrix([with_fc, conv_head, with_fc], [2, 2, 8])
    mixed[:, FEATURE_NAMES.index("sim_reserved_mb")] = 100.0  # as if simulated
    assert _has_terms(mixed, form)
    same = mixed[[0, 2]]
    assert same[:, col].tolist() == [1.0, 1.0] and not _has_terms(same, form)


def test_unsupported_op_is_reported_not_zero():
    d = _tiny()
    d.nodes.insert(4, Node("weird", "fancy_op", ["r"], {}, [8, 8, 8]))
    assert unsupported_ops(d) == ["fancy_op"]
    assert network_features(d).unsupported == ["weird (fancy_op)"]


def test_tx2_graph_params_match(tx2_data):
    files = sorted((tx2_data / "graphs").glob("*.json"))
    assert len(files) == 58
    for f in files:
        d = load_description(f)
        nf = network_features(d)
        assert nf.unsupported == [], f.name
        assert nf.static["params"] == d.params, f.name


def test_tx2_resnet18_macs_are_textbook(tx2_data):
    nf = network_features(load_description(tx2_data / "graphs" / "resnet18_0.json"))
    assert nf.per_sample["macs"] == pytest.approx(1.814e9, rel=0.01)  # the well-known 1.8 GMACs
    assert nf.per_sample["depthwise_macs"] == 0


def test_allocator_rounding():
    from perf4sight.features.aggregate import allocator_bytes
    assert allocator_bytes(np.array([1.0]), 1) == 512
    assert allocator_bytes(np.array([1000.0]), 2) == 2048  # 2000 B -> 4 blocks of 512
    mib = 2.0**20
    assert allocator_bytes(np.array([5 * mib]), 1) == 5 * mib  # carved from a 20 MiB segment, 512-aligned
    assert allocator_bytes(np.array([11 * mib + 1]), 1) == 12 * mib  # own segment, 2 MiB granularity


def test_allocator_features_columns():
    from perf4sight.features.aggregate import FEATURE_NAMES, feature_matrix, network_features
    from perf4sight.ir.schema import NetworkDescription, Node
    desc = NetworkDescription(name="t", network="t", input_shape=[3, 8, 8], num_classes=4, params=0, nodes=[
        Node("x", "input", [], {}, [3, 8, 8]),
        Node("c", "conv2d", ["x"], {"in_channels": 3, "out_channels": 5, "kernel_size": [3, 3], "stride": [1, 1],
                                    "padding": [1, 1], "dilation": [1, 1], "groups": 1, "bias": False}, [5, 8, 8]),
        Node("r", "relu", ["c"], {}, [5, 8, 8])], output="r")
    nf = network_features(desc)
    F = feature_matrix(nf, [1, 4096])
    row = dict(zip(FEATURE_NAMES, F[1]))
    exact = (row["saved_bytes"] + row["input_bytes"]) / 2**20
    assert row["saved_alloc_mb"] >= exact - 1e-9
    assert row["mem_alloc_mb"] == pytest.approx(row["mem_analytic_mb"] - exact + row["saved_alloc_mb"])
    assert dict(zip(FEATURE_NAMES, F[0]))["saved_alloc_mb"] * 2**20 % 512 == 0


def test_perf4sight_conv_set():
    from perf4sight.features.perf4sight_set import PERF4SIGHT_FEATURES, perf4sight_matrix, perf4sight_vectors
    from perf4sight.ir.schema import NetworkDescription, Node
    conv = {"in_channels": 4, "out_channels": 8, "kernel_size": [3, 3], "stride": [1, 1], "padding": [1, 1],
            "dilation": [1, 1], "groups": 1, "bias": False}
    dw = dict(conv, in_channels=8, out_channels=8, groups=8)
    desc = NetworkDescription(name="t", network="t", input_shape=[4, 8, 8], num_classes=2, params=0, nodes=[
        Node("x", "input", [], {}, [4, 8, 8]), Node("c", "conv2d", ["x"], conv, [8, 8, 8]),
        Node("d", "conv2d", ["c"], dw, [8, 8, 8])], output="d")
    assert len(PERF4SIGHT_FEATURES) == 56
    v = perf4sight_vectors(desc)
    m = dict(zip(PERF4SIGHT_FEATURES, perf4sight_matrix([v, v], [1, 3])[1]))
    assert m["batch_size"] == 3 and m["n_conv"] == 2 and m["n_depthwise"] == 1
    assert m["fwd_gemm_macs"] == 3 * (64 * 8 * 4 * 9 + 64 * 8 * 1 * 9)
    assert m["depthwise_macs"] == 3 * 64 * 8 * 9
    assert m["fwd_wino_pointwise_flops"] > 0  # the dense 3x3 stride-1 layer qualifies for Winograd
    assert m["conv_weight_bytes"] == (8 * 4 * 9 + 8 * 9) * 4  # static: not scaled by the batch


def test_view_of_the_input_counts_as_the_input_everywhere():
    """A conv reading an ``identity`` of the input computes no input gradient, in the network features,
    the kernel-level latency terms and the GNN node costs alike (one shared walk)."""
    from perf4sight.features.latency_terms import kernel_table
    from perf4sight.fingerprint.gnn_graph import NODE_FEATURES, graph_template

    direct = _desc([Node("input", "input", [], {}, [4, 8, 8]), _conv("c", "input", 4, 8, 3, 1, 8),
                               Node("f", "flatten", ["c"], {"start_dim": 1, "end_dim": -1}, [512])])
    viewed = _desc([Node("input", "input", [], {}, [4, 8, 8]), Node("v", "identity", ["input"], {}, [4, 8, 8]),
                               _conv("c", "v", 4, 8, 3, 1, 8),
                               Node("f", "flatten", ["c"], {"start_dim": 1, "end_dim": -1}, [512])])
    a, b = network_features(direct), network_features(viewed)
    assert a.per_sample["flops_bwd"] == b.per_sample["flops_bwd"] > 0
    assert len(kernel_table(direct).kind) == len(kernel_table(viewed).kind)
    col = NODE_FEATURES.index("flops_bwd")
    assert graph_template(direct).x[1, col] == graph_template(viewed).x[2, col]


def _autograd_backward(desc) -> tuple[list[str], int, int]:
    """What one training forward of ``desc`` built by to_torch (batch 2) leaves its backward to run, as autograd's
    graph says: the sorted names of its nodes (one per op that computes a gradient; ``AccumulateGrad``: a
    parameter's), how many of their edges lead nowhere (an input that gets no gradient, a conv's that it does not
    compute), and how many gradients meet another at a node (an add each: ``k - 1`` for ``k`` edges into one)."""
    import torch
    from perf4sight.ir.to_torch import build_module
    torch.manual_seed(0)
    out = build_module(desc).train()(torch.randn(2, *desc.input_shape))
    into: dict = {}
    nowhere = 0
    todo, seen = [out.grad_fn], set()
    while todo:
        fn = todo.pop()
        if fn in seen:
            continue
        seen.add(fn)
        for nxt, _ in fn.next_functions:
            if nxt is None:
                nowhere += 1
            else:
                into[nxt] = into.get(nxt, 0) + 1
                todo.append(nxt)
    return sorted(type(fn).__name__ for fn in seen), nowhere, sum(k - 1 for k in into.values())


def test_parameter_free_ops_of_the_input_run_no_backward():
    """A network that starts with a parameter-free op (a max or average pool, an input normalisation ``x * 4 + (-2)``,
    a dropout, a batch norm without affine parameters, a bilinear resize, a ReLU) makes a tensor that needs no
    gradient: torch runs no backward for that op, keeps nothing for it, and the conv after it computes no input
    gradient. Its features are then those of the same network without that op, described at the op's output shape
    (where the conv reads the input itself), as autograd's graphs of the two are the same; and the bytes it keeps
    for backward are autograd's, the input batch aside (a CPU step's rules: a dropout would keep 4 bytes an
    element)."""
    pytest.importorskip("torch")
    from torch import nn

    from perf4sight.ir.from_torch import describe

    class Normalise(nn.Module):
        def forward(self, x):
            return x * 4.0 + (-2.0)

    class Resize(nn.Module):
        def forward(self, x):
            return nn.functional.interpolate(x, scale_factor=2, mode="bilinear", align_corners=False)

    def net(*first):
        return nn.Sequential(*first, nn.Conv2d(3, 8, 3, padding=1), nn.ReLU(), nn.Conv2d(8, 4, 3, padding=1),
                             nn.Flatten())

    cpu = StepRuntime(relu6_clone=True, foreach=False, dropout_mask_bytes=4)
    cases = [(nn.MaxPool2d(2), 8), (nn.AvgPool2d(2), 8), (Normalise(), 16), (nn.Dropout(0.2), 16),
             (nn.BatchNorm2d(3, affine=False), 16), (Resize(), 32), (nn.ReLU(), 16)]
    for op, side in cases:
        desc = describe(net(op), [3, 16, 16], "first")
        ref = describe(net(), [3, side, side], "ref")
        assert _autograd_backward(desc) == _autograd_backward(ref), type(op).__name__  # torch: the same backward
        nf, rf = network_features(desc, cpu), network_features(ref, cpu)
        assert nf.per_sample["saved_bytes"] == _autograd_saved_bytes(desc, 4, with_input=False), type(op).__name__
        assert nf.per_sample["saved_bytes"] == rf.per_sample["saved_bytes"] + 3 * side * side * 4  # the conv's input
        got, want = features_for(nf, 4), features_for(rf, 4)
        for name in ("flops_bwd", "kernels_bwd", "lt_gemm_macs", "lt_gemm_padded_macs", "lt_dw_bytes"):
            assert got[name] == want[name], (type(op).__name__, name)
        assert got["kernels_fwd"] > want["kernels_fwd"] and got["flops_fwd"] >= want["flops_fwd"]


def test_a_tensor_that_needs_no_gradient_gets_none_to_accumulate():
    """A tensor read by ``k`` ops receives ``k`` gradients and adds ``k - 1`` of them, where it needs a gradient: the
    input (or a max pool of it) added back after a conv gets none, as autograd's graph shows, and counts no more
    backward kernels than a constant added there; a conv's output added back counts one add."""
    torch = pytest.importorskip("torch")
    from torch import nn

    from perf4sight.ir.from_torch import describe

    class Skip(nn.Module):
        def __init__(self, pool: bool, skip: str):
            super().__init__()
            self.pool, self.skip = nn.MaxPool2d(2) if pool else nn.Identity(), skip
            self.conv, self.fc = nn.Conv2d(3, 3, 3, padding=1), nn.Linear(3 * 8 * 8, 5)

        def forward(self, x):
            x = self.pool(x)
            c = self.conv(x)
            y = torch.relu(c)
            return self.fc(torch.flatten(y + {"x": x, "c": c, "none": 1.0}[self.skip], 1))

    for pool in (False, True):
        shape = [3, 16, 16] if pool else [3, 8, 8]
        descs = {skip: describe(Skip(pool, skip), shape, f"skip_{skip}") for skip in ("none", "x", "c")}
        torch_adds = {skip: _autograd_backward(d)[2] for skip, d in descs.items()}
        kernels = {skip: network_features(d).static["kernels_bwd"] for skip, d in descs.items()}
        assert torch_adds == {"none": 0, "x": 0, "c": 1}, pool
        assert kernels["x"] == kernels["none"] == kernels["c"] - 1, pool


@pytest.mark.parametrize("layer", [(16, 8, 3, 2, 1, 1, 1, 1, True), (8, 8, 4, 2, 1, 0, 8, 1, False),
                                   (6, 4, 3, 1, 0, 0, 2, 2, True)])
def test_a_transposed_convolution_costs_what_torch_s_flop_counter_counts(layer):
    """A transposed convolution's forward is Cin x Cout / groups x kh x kw MACs per input pixel (2 FLOPs each, and an
    add per output element for its bias), as torch's FlopCounterMode counts it at a batch of 2; its backward the
    input's gradient and the weight's, the same MACs each, the input's left out for a first layer. (The counter's
    backward of a grouped convolution, transposed or not, counts the weight's gradient groups times over: compared
    where groups is 1.) Its weight and bias are the parameters, its input the tensor kept."""
    import torch
    from torch import nn
    from torch.utils.flop_counter import FlopCounterMode

    from perf4sight.ir.from_torch import describe

    cin, cout, k, stride, pad, out_pad, groups, dilation, bias = layer
    module = nn.ConvTranspose2d(cin, cout, k, stride, pad, out_pad, groups, bias, dilation)
    node = describe(nn.Sequential(module), [cin, 7, 9], "up").nodes[1]
    assert node.op == "conv_transpose2d"
    x = torch.randn(2, cin, 7, 9, requires_grad=True)
    with FlopCounterMode(display=False) as forward:
        y = module(x)
    with FlopCounterMode(display=False) as backward:
        y.sum().backward()
    for first in (False, True):
        c = _cost(node, [[cin, 7, 9]], first=first)
        bias_flops = cout * node.output_shape[1] * node.output_shape[2] if bias else 0
        assert c.macs == cin * cout // groups * k * k * 7 * 9 and 2 * 2 * c.macs == forward.get_total_flops()
        assert c.flops_fwd == 2 * c.macs + bias_flops
        assert c.flops_bwd - bias_flops == (2 if first else 4) * c.macs
        assert c.params == sum(p.numel() for p in module.parameters()) and c.saved == [0]
    if groups == 1:  # at a batch of 2, the input's gradient too
        assert 2 * (_cost(node, [[cin, 7, 9]]).flops_bwd - bias_flops) == backward.get_total_flops()


@pytest.mark.parametrize("op, attrs, out", [
    ("pad", {"pads": [1, 2, 3, 0], "mode": "constant", "value": 0.5}, [8, 11, 11]),
    ("pad", {"pads": [1, 2, 3, 0], "mode": "reflect"}, [8, 11, 11]),
    ("pad", {"pads": [1, 2, 3, 0], "mode": "replicate"}, [8, 11, 11]),
    ("pixel_shuffle", {"upscale_factor": 2}, [2, 16, 16]),
    ("pixel_unshuffle", {"downscale_factor": 2}, [32, 4, 4])])
def test_pads_and_pixel_shuffles_keep_what_autograd_keeps(op, attrs, out):
    """Pads and pixel shuffles are copies: no FLOPs forward, their input read and output written. A reflection or
    replication pad keeps its input (autograd saves it, though its backward reads only its shape) and adds each
    border pixel's gradient back (1 FLOP a border element); a constant pad and the shuffles keep nothing: exactly
    the bytes autograd saves after a convolution, per sample."""
    pytest.importorskip("torch")
    node = Node("p", op, ["conv"], attrs, out)
    desc = _desc([Node("input", "input", [], {}, [4, 8, 8]), _conv("conv", "input", 4, 8, 1, 1, 8), node])
    c = _cost(node, [[8, 8, 8]])
    border = op == "pad" and attrs["mode"] != "constant"
    assert (c.macs, c.flops_fwd, c.params) == (0, 0, 0) and c.flops_bwd == (11 * 11 - 8 * 8) * 8 * border
    assert (c.bytes_read, c.bytes_written) == (8 * 8 * 8 * 4, 8 * 11 * 11 * 4 if op == "pad" else 8 * 8 * 8 * 4)
    assert c.saved == ([0] if border else []) and c.extra_saved_bytes == 0
    assert _autograd_saved_bytes(desc, 2, with_input=False) == 8 * 8 * 8 * 4 * border
    assert not network_features(desc).unsupported


def test_a_local_response_norm_costs_what_torch_runs():
    """A local response norm has no kernel of its own in torch: its cost counts the ops this torch runs (7 forward,
    15 backward), and it keeps its input, the padded squares, and the power's base and result: exactly the bytes a
    sample adds to autograd's saved tensors. It normalises its output's elements (``norm_elems``, as every norm: not
    the bytes its seven kernels write)."""
    pytest.importorskip("torch")
    import torch.nn.functional as F
    from torch import nn

    from perf4sight.ir.from_torch import describe

    forward, backward = _ops_run(lambda x: F.local_response_norm(x, 5), [6, 4, 4])
    node = Node("n", "local_response_norm", ["conv"], {"size": 5, "alpha": 1e-4, "beta": 0.75, "k": 1.0}, [6, 4, 4])
    c = _cost(node, [[6, 4, 4]])
    assert (c.kernels_fwd, c.kernels_bwd) == (len(forward), len(backward)) == (7, 15)
    assert c.saved == [0] and c.extra_saved_bytes == ((6 + 4) * 16 + 2 * 6 * 16) * 4
    net = nn.Sequential(nn.Conv2d(3, 6, 3), nn.LocalResponseNorm(5), nn.Conv2d(6, 4, 1), nn.Flatten(),
                        nn.Linear(4 * 4 * 4, 10))
    desc = describe(net, [3, 6, 6], "alexnet")
    nf = network_features(desc)
    at2, at4 = 2 * _autograd_saved_bytes(desc, 2), 4 * _autograd_saved_bytes(desc, 4)
    assert nf.per_sample["saved_bytes"] + nf.per_sample["input_bytes"] == (at4 - at2) / 2
    assert not nf.unsupported and nf.per_sample["norm_elems"] == 6 * 4 * 4


def test_selu_and_celu_keep_what_autograd_keeps():
    """A SELU and a CELU keep their input, or in place their result: what a sample adds to autograd's saved tensors,
    exactly; their FLOPs an elu's and one more multiply each way."""
    pytest.importorskip("torch")
    from torch import nn

    from perf4sight.ir.from_torch import describe

    net = nn.Sequential(nn.Conv2d(3, 8, 3), nn.SELU(), nn.Conv2d(8, 8, 3), nn.CELU(0.5), nn.Conv2d(8, 8, 3),
                        nn.SELU(inplace=True), nn.Conv2d(8, 8, 1), nn.CELU(2.0, inplace=True), nn.Conv2d(8, 4, 1),
                        nn.Flatten(), nn.Linear(64, 10))
    desc = describe(net, [3, 10, 10], "snn")
    acts = [n for n in desc.nodes if n.op in ("selu", "celu")]
    costs = [_cost(n, [desc.node(n.inputs[0]).output_shape]) for n in acts]
    assert [(c.flops_fwd, c.flops_bwd) for c in costs] == [(5 * math.prod(n.output_shape),
                                                            4 * math.prod(n.output_shape)) for n in acts]
    assert [c.saved for c in costs] == [[0], [0], [-1], [-1]]
    nf = network_features(desc)
    at2, at4 = 2 * _autograd_saved_bytes(desc, 2), 4 * _autograd_saved_bytes(desc, 4)
    assert nf.per_sample["saved_bytes"] + nf.per_sample["input_bytes"] == (at4 - at2) / 2


def test_an_activation_in_place_on_a_copy_keeps_what_autograd_keeps():
    """An ELU in place, then a leaky ReLU in place on a clone of its result (or a contiguous copy of a transposed map):
    torch keeps the ELU's result and the leaky ReLU's, two tensors. The copy was read as the ELU's result itself, so
    the description held two in-place activations in a row on one tensor, and its rebuilt network kept one storage
    for both (and failed its backward: the second wrote what the first keeps), where the saved bytes counted two.
    Described now as the step torch trains, the saved bytes are autograd's of the original network and of the
    rebuilt one (what a sample adds between batch 2 and 4)."""
    pytest.importorskip("torch")
    import torch
    import torch.nn.functional as F
    from torch import nn

    from perf4sight.ir.from_torch import describe
    from perf4sight.ir.to_torch import build_module

    class Copied(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.c1, self.c2 = nn.Conv2d(3, 8, 3, padding=1), nn.Conv2d(8, 8, 3, padding=1)
            self.c3, self.fc = nn.Conv2d(8, 8, 1), nn.Linear(8, 10)

        def forward(self, x):
            y = F.leaky_relu(F.elu(self.c1(x), inplace=True).clone(), 0.1, True)
            y = F.leaky_relu(F.elu(self.c2(y), inplace=True).transpose(2, 3).contiguous(), 0.2, True)
            return self.fc(self.c3(y).mean((2, 3)))

    network = Copied()
    desc = describe(network, [3, 6, 6], "copied")
    assert [(n.op, n.attrs.get("inplace")) for n in desc.nodes if "elu" in n.op] == [
        ("elu", True), ("leaky_relu", None), ("elu", True), ("leaky_relu", None)]
    nf = network_features(desc)
    at2, at4 = 2 * _autograd_saved_bytes(desc, 2), 4 * _autograd_saved_bytes(desc, 4)
    kept = (3 + 4 * 8) * 36 * 4 + 8 * 4  # the input; each ELU's result and each leaky ReLU's; the pooled features
    assert nf.per_sample["saved_bytes"] + nf.per_sample["input_bytes"] == (at4 - at2) / 2 == kept
    build_module(desc).train()(torch.randn(2, 3, 6, 6)).sum().backward()  # the rebuilt network trains
    network(torch.randn(2, 3, 6, 6)).sum().backward()  # as the original does, keeping as much
    assert (_module_saved_bytes(network, [3, 6, 6], 4) - _module_saved_bytes(network, [3, 6, 6], 2)) / 2 == kept


def _module_saved_bytes(module, input_shape: list[int], batch: int) -> int:
    """Bytes that autograd keeps for backward in one training forward of the torch ``module`` itself (not a
    description's rebuilt one) on a batch of ``batch``: each storage once, the input batch's included, parameters
    aside."""
    import torch
    torch.manual_seed(0)
    hooks, saved = _kept_storages({p.untyped_storage().data_ptr() for p in module.parameters()})
    with hooks:
        module.train()(torch.randn(batch, *input_shape))
    return sum(saved.values())


#: An activation run in place, by its description op: its torch.nn layer, the layer's keywords, and a call of it in
#: place given torch and a tensor.
ON_COPY_ACTIVATIONS = {
    "leaky_relu": ("LeakyReLU", {"negative_slope": 0.1}, lambda torch, y: torch.nn.functional.leaky_relu_(y, 0.1)),
    "elu": ("ELU", {"alpha": 0.5}, lambda torch, y: torch.nn.functional.elu_(y, 0.5)),
    "selu": ("SELU", {}, lambda torch, y: torch.selu_(y)),
    "celu": ("CELU", {"alpha": 0.5}, lambda torch, y: torch.nn.functional.celu(y, 0.5, True)),
    "hardtanh": ("Hardtanh", {"min_val": -0.5, "max_val": 0.5},
                 lambda torch, y: torch.nn.functional.hardtanh_(y, -0.5, 0.5)),
    "mish": ("Mish", {}, lambda torch, y: torch.nn.functional.mish(y, inplace=True)),
    "threshold": ("Threshold", {"threshold": 0.4, "value": -1.0},
                  lambda torch, y: torch.nn.functional.threshold_(y, 0.4, -1.0)),
    "rrelu": ("RReLU", {"lower": 0.1, "upper": 0.3}, lambda torch, y: torch.nn.functional.rrelu_(y, 0.1, 0.3, True)),
}


def on_copy_network(op: str):
    """A network of the activation ``op`` run in place on copies: as a layer on a contiguous copy of a transposed
    map, whose result a convolution keeps, and as a call on a clone of a sigmoid's result (kept by the sigmoid),
    whose result nothing keeps."""
    import torch
    from torch import nn
    layer, kwargs, call = ON_COPY_ACTIVATIONS[op]

    class OnCopies(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.c1, self.c2, self.fc = nn.Conv2d(3, 8, 3, padding=1), nn.Conv2d(8, 8, 1), nn.Linear(8, 10)
            self.act = getattr(nn, layer)(**kwargs, inplace=True)

        def forward(self, x):
            e = self.c1(x).sigmoid()
            y = self.c2(self.act(e.transpose(2, 3).contiguous()))
            return self.fc((call(torch, e.clone()) + y + e).mean((2, 3)))
    return OnCopies()


@pytest.mark.parametrize("op", sorted(ON_COPY_ACTIVATIONS))
def test_an_activation_in_place_on_a_copy_keeps_the_copy(op):
    """Leaky ReLU, ELU, SELU, CELU, hardtanh, mish, threshold and RReLU in place on a copy of their input are described
    out of place (``on_copy``): backward keeps the copy (a mish, a threshold and this torch's hardtanh, a clone of it;
    an RReLU, its noise too), not the input, which the sigmoid keeps anyway. The saved bytes counted the input, one
    input-sized tensor short of autograd's where nothing else keeps the result (the call's); they are autograd's of
    the original network and of the rebuilt one (what a sample adds between batch 2 and 4)."""
    pytest.importorskip("torch")
    import torch

    from perf4sight.ir.from_torch import describe
    from perf4sight.ir.to_torch import build_module

    network = on_copy_network(op)
    desc = describe(network, [3, 6, 6], "on_copy")
    assert [(n.attrs.get("inplace"), n.attrs.get("on_copy")) for n in desc.nodes if n.op == op] == [(None, True)] * 2
    runtime = StepRuntime(relu6_clone=True)  # this torch's hardtanh_ keeps a clone of its input
    nf = network_features(desc, runtime)
    at2, at4 = 2 * _autograd_saved_bytes(desc, 2), 4 * _autograd_saved_bytes(desc, 4)
    original = (_module_saved_bytes(network, [3, 6, 6], 4) - _module_saved_bytes(network, [3, 6, 6], 2)) / 2
    assert nf.per_sample["saved_bytes"] + nf.per_sample["input_bytes"] == (at4 - at2) / 2 == original
    x = torch.randn(2, 3, 6, 6)
    rebuilt = build_module(desc)
    rebuilt.load_state_dict(network.state_dict())
    assert torch.allclose(rebuilt(x), network(x))  # the rebuilt network computes what the original does
    rebuilt(x).sum().backward()


@pytest.mark.parametrize("op", sorted(ON_COPY_ACTIVATIONS))
def test_an_activation_in_place_on_a_copy_costs_the_copys_kernel(op):
    """An activation in place on a copy of its input (``on_copy``) runs the copy (aten.clone: the input read and
    written) before its own kernel, and a mish, a threshold and this torch's hardtanh then clone the copy for backward,
    which neither its cost nor the latency terms counted: its forward kernels are those this torch runs (an rrelu's
    empty noise launches none), and the kernel table has a bandwidth-bound kernel of 2 x 4 bytes an element more a
    copy than out of place; backward the copy hands the gradient on."""
    pytest.importorskip("torch")
    import torch

    from perf4sight.features.walk import walk
    from perf4sight.ir.from_torch import describe
    from perf4sight.ir.schema import NetworkDescription

    desc = describe(on_copy_network(op), [3, 6, 6], "on_copy")
    runtime = StepRuntime(relu6_clone=True)  # this torch's hardtanh_ clones its input
    call = ON_COPY_ACTIVATIONS[op][2]
    forward, backward = _ops_run(lambda x: call(torch, x.clone()), [8, 6, 6])
    kernels = [name for name, _ in forward if name != "empty_like"]
    copies = [v for v in walk(desc, runtime) if v.node.attrs.get("on_copy")]
    assert len(copies) == 2
    for visit in copies:
        assert visit.cost.kernels_fwd == len(kernels) == 1 + kernels.count("clone")
        assert visit.cost.kernels_bwd == len(backward) == 1
    plain = NetworkDescription.from_dict(desc.to_dict())
    for node in plain.nodes:
        node.attrs.pop("on_copy", None)
    lat = {name: dict(zip(FEATURE_NAMES, feature_matrix(network_features(d, runtime), [4])[0])) for name, d in
           (("on_copy", desc), ("plain", plain))}
    assert lat["on_copy"]["lt_launches"] - lat["plain"]["lt_launches"] == 2 * kernels.count("clone")
    assert lat["on_copy"]["lt_ew_bytes"] - lat["plain"]["lt_ew_bytes"] == 2 * kernels.count("clone") * (
        2 * 8 * 36 * 4) * 4


@pytest.mark.parametrize("op, clone_rule", [("mish", False), ("threshold", False), ("hardtanh", True),
                                            ("relu6", True), ("leaky_relu", True), ("silu", False),
                                            ("hardswish", False), ("hardsigmoid", False)])
def test_an_activation_in_place_counts_the_clone_it_keeps(op, clone_rule):
    """A mish, a threshold, a SiLU, a hardswish and a hardsigmoid in place clone their input first (the clone kept for
    backward), and so do a hardtanh and a ReLU6 on torch >= 1.10 (relu6_clone): an aten.clone kernel, the input read
    and written, which their cost and the latency terms did not count; a leaky ReLU in place clones nothing. Forward
    kernels are what this torch runs."""
    pytest.importorskip("torch")
    import torch.nn.functional as F

    from perf4sight.features.walk import walk

    calls = {"mish": lambda x: F.mish(x, inplace=True), "threshold": lambda x: F.threshold_(x, 0.4, -1.0),
             "hardtanh": lambda x: F.hardtanh_(x, -0.5, 0.5), "relu6": lambda x: F.relu6(x, inplace=True),
             "leaky_relu": lambda x: F.leaky_relu_(x, 0.1), "silu": lambda x: F.silu(x, inplace=True),
             "hardswish": lambda x: F.hardswish(x, inplace=True), "hardsigmoid": lambda x: F.hardsigmoid(x, True)}
    attrs = {"mish": {}, "threshold": {"threshold": 0.4, "value": -1.0}, "hardtanh": {"min_val": -0.5, "max_val": 0.5},
             "relu6": {}, "leaky_relu": {"negative_slope": 0.1}}.get(op, {})
    forward, _ = _ops_run(lambda x: calls[op](x * 1.0), [8, 6, 6])
    kernels = [name for name, _ in forward][1:]  # after the multiply that makes the input no leaf
    desc = _desc([Node("input", "input", [], {}, [3, 6, 6]), _conv("c", "input", 3, 8, 3, 1, 6),
                  Node("a", op, ["c"], {**attrs, "inplace": True}, [8, 6, 6])])
    desc.nodes[1].attrs["padding"] = [1, 1]
    new, old = StepRuntime(relu6_clone=True), StepRuntime(relu6_clone=False)
    costs = {rt: next(v.cost for v in walk(desc, rt) if v.node.name == "a") for rt in (new, old)}
    assert costs[new].kernels_fwd == len(kernels) == 1 + kernels.count("clone")
    assert costs[old].kernels_fwd == (1 + kernels.count("clone") if not clone_rule else 1)
    n = 8 * 36 * 4
    assert costs[new].bytes_read == n * (1 + kernels.count("clone"))
    table = {rt: network_features(desc, rt).kernels.launches for rt in (new, old)}
    assert table[new] - table[old] == (kernels.count("clone") if clone_rule else 0)


def _forward_ops(network, shape: list[int]) -> list[str]:
    """The aten ops (names) one training forward of ``network`` on a batch of ``shape`` runs."""
    import torch
    from torch.utils._python_dispatch import TorchDispatchMode

    class Ops(TorchDispatchMode):
        def __init__(self):
            super().__init__()
            self.seen = []

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            self.seen.append(func.__name__.split(".")[0])
            return func(*args, **(kwargs or {}))

    with Ops() as ops:
        network.train()(torch.randn(*shape))
    return ops.seen


def _tokens_read_transposed():
    """A hand-written attention over a convolution's map: its tokens are the map flattened and transposed (a strided
    [N, C] view), read by three linear layers (queries, keys, values); then the scores' softmax, the weighted sum of
    the values, a mean over the tokens and a classifier."""
    from torch import nn

    class Attention(nn.Module):
        def __init__(self, c: int = 16) -> None:
            super().__init__()
            self.conv = nn.Conv2d(3, c, 3, padding=1)
            self.q, self.k, self.v, self.fc = nn.Linear(c, c), nn.Linear(c, c), nn.Linear(c, c, bias=False), \
                nn.Linear(c, 5)

        def forward(self, x):
            tokens = self.conv(x).flatten(2).transpose(1, 2)
            q, k, v = self.q(tokens), self.k(tokens), self.v(tokens)
            return self.fc(((q @ k.transpose(1, 2)).softmax(-1) @ v).mean(1))
    return Attention()


def test_linear_layers_reading_a_strided_view_keep_a_copy_each():
    """A linear layer of tokens that do not view as rows (a map's [C, N] transposed to [N, C], at a batch of more than
    one) copies them into rows and keeps its copy: three layers reading the same transposed tokens keep three copies,
    where the features counted the map once (14,464 bytes a sample against autograd's 19,072). What a sample adds
    to autograd's saved tensors between batches 2 and 4 is the features', the original network's and the rebuilt
    one's alike. (At a batch of 1 the tokens view as rows and nothing is copied: the features count a batch's.)"""
    pytest.importorskip("torch")
    from perf4sight.features.walk import walk
    from perf4sight.ir.from_torch import describe

    network = _tokens_read_transposed()
    desc = describe(network, [3, 6, 6], "tokens")
    nf = network_features(desc)
    at2, at4 = 2 * _autograd_saved_bytes(desc, 2), 4 * _autograd_saved_bytes(desc, 4)
    original = (_module_saved_bytes(network, [3, 6, 6], 4) - _module_saved_bytes(network, [3, 6, 6], 2)) / 2
    assert nf.per_sample["saved_bytes"] + nf.per_sample["input_bytes"] == (at4 - at2) / 2 == original
    tokens = 36 * 16 * 4
    assert sorted(nf.saved_sizes.tolist()).count(tokens) >= 3  # a copy each
    # each copy is a kernel of the tokens read and written, as many as torch runs (aten.clone, at batch 2)
    visits = {v.node.name: v for v in walk(desc)}
    assert [name for name, v in visits.items() if v.input_copies] == ["q", "k", "v"]
    assert [visits[name].cost.kernels_fwd for name in ("q", "k", "v", "fc")] == [2, 2, 2, 1]
    assert visits["q"].cost.bytes_read == (2 * 576 + 16 * 16 + 16) * 4  # the tokens twice, the weight and bias
    assert _forward_ops(network, [2, 3, 6, 6]).count("clone") == 3


def _heads_permuted():
    """Multi-head attention written by hand: a map's 16 channels as tokens of 36 features, one linear layer packing
    queries, keys and values, its output reshaped and permuted to [3, N, heads, tokens, 9] and picked (each head's
    matrices a view whose batch and head dims do not fold), the scores' softmax, the weighted values, a classifier."""
    from torch import nn

    class Heads(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.conv, self.qkv, self.fc = nn.Conv2d(3, 16, 3, padding=1), nn.Linear(36, 3 * 36), nn.Linear(9, 5)

        def forward(self, x):
            tokens = self.conv(x).flatten(2)
            q, k, v = self.qkv(tokens).reshape(x.shape[0], 16, 3, 4, 9).permute(2, 0, 3, 1, 4)
            return self.fc(((q @ k.transpose(-2, -1)).softmax(-1) @ v).mean((1, 2)))
    return Heads()


def test_a_matmul_of_heads_that_do_not_fold_copies_them_as_torch_does():
    """torch.matmul of 4-D tensors reshapes the dims before the last two into one for its bmm, which copies a view
    whose dims there do not fold (each head's queries, keys and values picked from a permuted packed projection: 3
    clones at a batch of 2), and the bmm keeps the copies: each a forward kernel of that input read and written, the
    copies what the features count saved (they had counted the projection's output once, no copy kernel). What a
    sample adds to autograd's saved tensors between batches 2 and 4 is the features', the original network's and the
    rebuilt one's alike; the kernel table launches the copies."""
    pytest.importorskip("torch")
    from perf4sight.features.latency_terms import kernel_table
    from perf4sight.features.walk import walk
    from perf4sight.ir.from_torch import describe

    network = _heads_permuted()
    desc = describe(network, [3, 6, 6], "heads")
    visits = [v for v in walk(desc) if v.node.op == "matmul"]
    assert [(v.copied_inputs, v.cost.kernels_fwd) for v in visits] == [((0, 1), 3), ((1,), 2)]
    assert _forward_ops(network, [2, 3, 6, 6]).count("clone") == 3
    nf = network_features(desc)
    at2, at4 = 2 * _autograd_saved_bytes(desc, 2), 4 * _autograd_saved_bytes(desc, 4)
    original = (_module_saved_bytes(network, [3, 6, 6], 4) - _module_saved_bytes(network, [3, 6, 6], 2)) / 2
    assert nf.per_sample["saved_bytes"] + nf.per_sample["input_bytes"] == (at4 - at2) / 2 == original
    from dataclasses import replace

    plain = [replace(v, copied_inputs=()) for v in walk(desc)]
    assert kernel_table(desc).launches == kernel_table(desc, visits=plain).launches + 3


def _activated_tokens(activation: str, keywords: dict):
    """A convolution's [16, 36] map flattened and transposed to 36 tokens of 16 features, ``activation`` (an
    ``nn`` layer's name, made with ``keywords``) of them, and a linear layer of the result, whose tokens' mean a
    classifier reads."""
    from torch import nn

    class Activated(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.conv, self.act = nn.Conv2d(3, 16, 3, padding=1), getattr(nn, activation)(**keywords)
            self.q, self.fc = nn.Linear(16, 16), nn.Linear(16, 5)

        def forward(self, x):
            return self.fc(self.q(self.act(self.conv(x).flatten(2).transpose(1, 2))).mean(1))
    return Activated()


@pytest.mark.parametrize("activation, keywords, copies", [
    ("ReLU", {}, 1), ("GELU", {}, 1), ("Hardswish", {}, 1), ("LeakyReLU", {"inplace": True}, 1),
    ("Sigmoid", {}, 1), ("Softmax", {"dim": -1}, 0), ("LayerNorm", {"normalized_shape": 16}, 0)])
def test_a_linear_layer_after_an_activation_of_strided_tokens_copies_them(activation, keywords, copies):
    """An activation of tokens transposed out of a map writes its output as its input lies (torch's elementwise
    kernels keep a permuted input's layout; a softmax and a layer norm write theirs contiguous), so a linear layer
    reading it copies it into rows, as one reading the view itself does, and keeps its copy: a ReLU's output counted
    once where autograd keeps it and the linear layer's copy (2,304 bytes a sample less than autograd's). The
    features' saved bytes a sample are autograd's for the original network, and the copies torch's clones."""
    pytest.importorskip("torch")
    from perf4sight.features.walk import walk
    from perf4sight.ir.from_torch import describe

    network = _activated_tokens(activation, keywords)
    desc = describe(network, [3, 6, 6], "activated")
    nf = network_features(desc)
    original = (_module_saved_bytes(network, [3, 6, 6], 4) - _module_saved_bytes(network, [3, 6, 6], 2)) / 2
    assert nf.per_sample["saved_bytes"] + nf.per_sample["input_bytes"] == original
    assert [v.input_copies for v in walk(desc) if v.node.op == "linear"] == [copies, 0]
    assert _forward_ops(network, [2, 3, 6, 6]).count("clone") == copies


@pytest.mark.parametrize("spelling", ["keyword", "positional"])
def test_a_functional_relu6_in_place_clones_its_input_as_torch_does(spelling):
    """F.relu6(y, inplace=True) was described out of place (the flag dropped, where nn.ReLU6(inplace=True) keeps
    it), so the clone torch >= 1.10 runs before its in-place kernel, and keeps, went uncounted: it is a ReLU6 in
    place, whose walk counts that clone (two forward kernels, the dispatch log's clone and hardtanh_), and the
    rebuilt network computes the original's output."""
    pytest.importorskip("torch")
    import torch
    import torch.nn.functional as F
    from torch import nn

    from perf4sight.features.walk import walk
    from perf4sight.ir.from_torch import describe
    from perf4sight.ir.to_torch import build_module

    class Clipped(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.conv, self.fc = nn.Conv2d(3, 8, 3), nn.Linear(8, 5)

        def forward(self, x):
            y = self.conv(x) * 4.0
            y = F.relu6(y, inplace=True) if spelling == "keyword" else F.relu6(y, True)
            return self.fc(y.mean((2, 3)))
    network = Clipped()
    desc = describe(network, [3, 8, 8], "clipped")
    assert [n.attrs for n in desc.nodes if n.op == "relu6"] == [{"inplace": True}]
    (visit,) = [v for v in walk(desc, StepRuntime(relu6_clone=True)) if v.node.op == "relu6"]
    ran = _forward_ops(network, [2, 3, 8, 8])
    assert (visit.input_copies, visit.cost.kernels_fwd) == (ran.count("clone"), 2) == (1, 2)
    rebuilt = build_module(desc).eval()
    rebuilt.load_state_dict(network.state_dict())  # its layers by their names: conv, fc
    x = torch.randn(2, 3, 8, 8)
    assert torch.equal(rebuilt(x), network.eval()(x))


@pytest.mark.parametrize("chain", [
    [("transpose", {"dim0": 1, "dim1": 2}, [36, 16])],
    [("permute", {"dims": [0, 2, 1]}, [36, 16]), ("unsqueeze", {"dim": 1}, [1, 36, 16])],
    [("transpose", {"dim0": -1, "dim1": -2}, [36, 16]), ("flatten", {"start_dim": 1}, [576])],
    [("reshape", {"shape": [4, 4, 36]}, [4, 4, 36]), ("select", {"dim": 1, "index": 2}, [4, 36]),
     ("transpose", {"dim0": 1, "dim1": 2}, [36, 4])],
    [("narrow", {"dim": 2, "start": 3, "length": 20}, [16, 20]), ("transpose", {"dim0": 1, "dim1": 2}, [20, 16])],
])
def test_a_views_strides_are_torchs(chain):
    """The strides a chain of view nodes gives a [2, 16, 36] tensor (strided_views.view_layout) are torch's, and a
    linear layer's rows fold where torch's reshape to [-1, K] makes a view of them."""
    pytest.importorskip("torch")
    import torch

    from perf4sight.features.strided_views import rows_fold, view_layout

    nodes = [Node(f"v{i}", op, [f"v{i - 1}"], attrs, shape) for i, (op, attrs, shape) in enumerate(chain)]
    t = torch.empty(2, 16, 36)
    for op, attrs, shape in chain:
        t = {"transpose": lambda: t.transpose(attrs.get("dim0"), attrs.get("dim1")),
             "permute": lambda: t.permute(*attrs.get("dims", [])), "unsqueeze": lambda: t.unsqueeze(attrs.get("dim")),
             "flatten": lambda: t.flatten(attrs.get("start_dim", 1)), "reshape": lambda: t.reshape(2, *shape),
             "select": lambda: t.select(attrs.get("dim"), attrs.get("index", 0)),
             "narrow": lambda: t.narrow(attrs.get("dim"), attrs.get("start", 0), attrs.get("length", 1))}[op]()
    shape, strides = view_layout(nodes, [16, 36])
    assert (shape, strides) == (list(t.shape), list(t.stride()))
    rows = t.reshape(-1, t.shape[-1])
    assert rows_fold(shape, strides) == (rows.data_ptr() == t.data_ptr() and rows._base is not None)


def test_softsign_tanhshrink_and_softmin_keep_what_torch_keeps_for_them():
    """Softsign, Tanhshrink and Softmin, described as the ops torch computes them from, keep per sample exactly what
    autograd keeps for the layers themselves: a softsign its input and the divisor (abs keeps the input, the division
    both operands), a tanhshrink its tanh's result, a softmin its softmax's result."""
    pytest.importorskip("torch")
    from torch import nn

    from perf4sight.ir.from_torch import describe

    net = nn.Sequential(nn.Conv2d(3, 8, 3), nn.Softsign(), nn.Conv2d(8, 8, 3), nn.Tanhshrink(), nn.Conv2d(8, 8, 3),
                        nn.Softmin(1), nn.Conv2d(8, 4, 1), nn.Flatten(), nn.Linear(64, 10))
    desc = describe(net, [3, 10, 10], "composed")
    nf = network_features(desc)
    at2, at4 = _module_saved_bytes(net, [3, 10, 10], 2), _module_saved_bytes(net, [3, 10, 10], 4)
    assert nf.per_sample["saved_bytes"] + nf.per_sample["input_bytes"] == (at4 - at2) / 2
    assert not nf.unsupported


def test_a_glu_keeps_what_torch_keeps_for_it():
    """A GLU keeps its input (twice its output), exactly what autograd keeps for nn.GLU per sample; its FLOPs a
    sigmoid's and a multiply an output element forward, 9 backward, its input read and its output written."""
    pytest.importorskip("torch")
    from torch import nn

    from perf4sight.ir.from_torch import describe

    net = nn.Sequential(nn.Conv2d(3, 16, 3), nn.GLU(1), nn.Conv2d(8, 8, 3), nn.GLU(-1), nn.Conv2d(8, 4, 1),
                        nn.Flatten(), nn.Linear(72, 10))
    desc = describe(net, [3, 10, 10], "gated")
    glus = [n for n in desc.nodes if n.op == "glu"]
    costs = [_cost(n, [desc.node(n.inputs[0]).output_shape]) for n in glus]
    assert [(c.flops_fwd, c.flops_bwd, c.saved) for c in costs] == [(5 * 8 * 8 * 8, 9 * 8 * 8 * 8, [0]),
                                                                     (5 * 8 * 6 * 3, 9 * 8 * 6 * 3, [0])]
    assert [c.bytes_read for c in costs] == [4 * 16 * 8 * 8, 4 * 8 * 6 * 6]
    nf = network_features(desc)
    at2, at4 = _module_saved_bytes(net, [3, 10, 10], 2), _module_saved_bytes(net, [3, 10, 10], 4)
    assert nf.per_sample["saved_bytes"] + nf.per_sample["input_bytes"] == (at4 - at2) / 2
    assert not nf.unsupported


def test_shrinks_and_thresholds_keep_what_torch_keeps_for_them():
    """A hardshrink, a softshrink and a threshold keep their input, a threshold in place a clone of it (torch's
    autograd for threshold_): exactly what autograd keeps for the layers per sample; one kernel each way."""
    pytest.importorskip("torch")
    from torch import nn

    from perf4sight.ir.from_torch import describe

    net = nn.Sequential(nn.Conv2d(3, 8, 3), nn.Hardshrink(0.3), nn.Conv2d(8, 8, 3), nn.Softshrink(0.2),
                        nn.Conv2d(8, 8, 3), nn.Threshold(0.1, 2.0), nn.Conv2d(8, 8, 1), nn.Threshold(0.0, -1.0, True),
                        nn.Conv2d(8, 4, 1), nn.Flatten(), nn.Linear(64, 10))
    desc = describe(net, [3, 10, 10], "shrinks")
    acts = [n for n in desc.nodes if n.op in ("hardshrink", "softshrink", "threshold")]
    costs = [_cost(n, [desc.node(n.inputs[0]).output_shape]) for n in acts]
    assert [(c.flops_fwd / math.prod(n.output_shape), c.kernels_fwd, c.kernels_bwd, c.saved)
            for c, n in zip(costs, acts)] == [(2, 1, 1, [0]), (3, 1, 1, [0]), (1, 1, 1, [0]), (1, 1, 1, [0])]
    nf = network_features(desc)
    at2, at4 = _module_saved_bytes(net, [3, 10, 10], 2), _module_saved_bytes(net, [3, 10, 10], 4)
    assert nf.per_sample["saved_bytes"] + nf.per_sample["input_bytes"] == (at4 - at2) / 2
    assert not nf.unsupported


def test_a_log_sigmoid_keeps_its_input_and_on_a_cpu_its_buffer():
    """A log-sigmoid keeps its input and a buffer, which CUDA leaves empty (measured on torch 2.11) and a CPU makes of
    the input's size: under a CPU's rules the description keeps per sample exactly what autograd keeps here, under a
    GPU's one output fewer."""
    pytest.importorskip("torch")
    from torch import nn

    from perf4sight.features.step_runtime import CPU_MASK_BYTES, StepRuntime
    from perf4sight.ir.from_torch import describe

    net = nn.Sequential(nn.Conv2d(3, 8, 3), nn.LogSigmoid(), nn.Conv2d(8, 4, 3), nn.Flatten(), nn.Linear(144, 10))
    desc = describe(net, [3, 10, 10], "logsig")
    at2, at4 = _module_saved_bytes(net, [3, 10, 10], 2), _module_saved_bytes(net, [3, 10, 10], 4)
    cpu, gpu = network_features(desc, runtime=StepRuntime(dropout_mask_bytes=CPU_MASK_BYTES)), network_features(desc)
    assert cpu.per_sample["saved_bytes"] + cpu.per_sample["input_bytes"] == (at4 - at2) / 2
    assert cpu.per_sample["saved_bytes"] - gpu.per_sample["saved_bytes"] == 8 * 8 * 8 * 4
    assert not gpu.unsupported


def _circular_pad_run(pads: list[int], shape: list[int]) -> tuple[list, list]:
    """The aten ops a circular pad of a [1, *shape] leaf runs forward and backward: :func:`_ops_run`."""
    import torch.nn.functional as F
    return _ops_run(lambda x: F.pad(x, pads, mode="circular"), shape)


def _ops_run(fn, shape: list[int]) -> tuple[list, list]:
    """The aten ops (name, output elements) ``fn`` of a [1, *shape] leaf runs forward and backward on this torch,
    those that only make a view or an empty tensor left out (they launch no kernel)."""
    import torch
    from torch.utils._python_dispatch import TorchDispatchMode

    class Ops(TorchDispatchMode):
        def __init__(self):
            super().__init__()
            self.seen = []

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            out = func(*args, **(kwargs or {}))
            name = func.__name__.split(".")[0]
            if name not in ("slice", "as_strided", "detach", "new_empty", "new_empty_strided", "alias", "view",
                            "squeeze", "unsqueeze"):
                self.seen.append((name, out.numel()))
            return out

    x = torch.randn(1, *shape, requires_grad=True)
    with Ops() as forward:
        y = fn(x)
    seed = torch.ones_like(y)
    with Ops() as backward:
        y.backward(seed)
    return forward.seen, backward.seen


@pytest.mark.parametrize("pads", [[1, 2, 1, 1], [0, 0, 2, 0], [3, 0, 0, 0], [0, 0, 0, 0]])
def test_a_circular_pad_costs_what_torch_runs(pads):
    """A circular pad has no kernel of its own in torch: copies into slices of an empty output, the border strips
    copied from the output's far side, and a backward of autograd's in-place-copy nodes. Its cost counts what this
    torch runs, op by op: a kernel per copy forward (bytes: each copy's elements read and written), a kernel per
    backward op (a slice backward two: zeros, then a copy), an add's elements as its FLOPs; it keeps nothing."""
    pytest.importorskip("torch")
    shape = [4, 5, 6]
    out = [4, 5 + pads[2] + pads[3], 6 + pads[0] + pads[1]]
    forward, backward = _circular_pad_run(pads, shape)
    node = Node("p", "pad", ["conv"], {"pads": pads, "mode": "circular"}, out)
    desc = _desc([Node("input", "input", [], {}, shape), _conv("conv", "input", 4, 4, 1, 1, 5), node])
    desc.nodes[1].output_shape = shape
    c = _cost(node, [shape])
    assert {name for name, _ in forward} == {"copy_"}
    assert c.kernels_fwd == len(forward) and c.flops_fwd == 0 and c.params == 0
    assert c.bytes_read == c.bytes_written == 4 * sum(n for _, n in forward)
    assert c.kernels_bwd == sum(2 if name == "slice_backward" else 1 for name, _ in backward)
    assert c.flops_bwd == sum(n for name, n in backward if name == "add")
    assert c.saved == [] and _autograd_saved_bytes(desc, 2, with_input=False) == 0
    assert not network_features(desc).unsupported


def test_prelu_dropout2d_and_log_softmax_keep_what_autograd_keeps():
    """Measured on this torch: a PReLU keeps its input (its slopes are a parameter), a Dropout2d the float noise it
    multiplied by (one per sample and channel, on any device: torch has no fused kernel for it), a log-softmax its
    result: what a sample adds to autograd's saved tensors between batch 2 and 4, exactly."""
    pytest.importorskip("torch")
    import torch.nn.functional as F
    from torch import nn

    from perf4sight.ir.from_torch import describe

    class Net(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.c1, self.a1, self.drop = nn.Conv2d(3, 8, 3, padding=1), nn.PReLU(8), nn.Dropout2d(0.3)
            self.c2, self.a2, self.fc = nn.Conv2d(8, 16, 3, 2, 1), nn.PReLU(), nn.Linear(16, 10)

        def forward(self, x):
            x = self.drop(self.a1(self.c1(x)) * 2)
            y = F.log_softmax(self.a2(self.c2(x)), 1).flatten(2).log_softmax(-1)
            return self.fc(y.mean(2))

    desc = describe(Net(), [3, 12, 12], "kept")
    nf = network_features(desc)
    at2, at4 = 2 * _autograd_saved_bytes(desc, 2), 4 * _autograd_saved_bytes(desc, 4)
    assert nf.per_sample["saved_bytes"] + nf.per_sample["input_bytes"] == (at4 - at2) / 2
    prelu, drop = _cost(desc.nodes[2], [[8, 12, 12]]), _cost(desc.nodes[4], [[8, 12, 12]])
    assert (prelu.saved, prelu.params, prelu.param_tensors) == ([0], 8, 1)
    assert (drop.saved, drop.extra_saved_bytes, drop.params) == ([], 8 * 4, 0)
    assert _cost(Node("d", "dropout2d", ["x"], {"p": 0.0}, [8, 12, 12]), [[8, 12, 12]]).kind == "view"


@pytest.mark.parametrize("op,attrs,saved,flops,bwd_flops,bwd_kernels", [
    ("pow", {"exponent": 3.0}, [0], 3, 5, 3),     # exp(p log x); grad * p * x ** (p - 1): keeps the input
    ("pow", {"exponent": 2.0}, [0], 1, 3, 3),     # x * x
    ("pow", {"exponent": 0.5}, ["output"], 1, 2, 2),   # sqrt: grad / (2 * result), keeps its result
    ("pow", {"exponent": -0.5}, ["output"], 1, 4, 3),  # rsqrt: -0.5 * grad * result ** 3
    ("pow", {"exponent": -1.0}, ["output"], 1, 3, 3),  # reciprocal: -grad * result ** 2
    ("exp", {}, ["output"], 1, 1, 1),
    ("abs", {}, [0], 1, 2, 2),                     # grad * sgn(x)
    ("div", {}, [0, 1], 1, 5, 5),                  # grad / y; -grad * (x / y) / y
    ("var", {"dims": [1], "keepdim": True, "correction": 0.0}, [0], 3, 3, 4),  # an input element: x - mean, its square
])
def test_powers_exp_and_abs_keep_what_torch_s_backward_reads(op, attrs, saved, flops, bwd_flops, bwd_kernels):
    from perf4sight.features.formulas import OUTPUT
    c = _cost(Node("p", op, ["x", "y"][:1 + (op == "div")], attrs, [4, 8, 8]), [[4, 8, 8]] * (1 + (op == "div")))
    assert c.saved == [OUTPUT if s == "output" else s for s in saved]
    assert (c.flops_fwd, c.flops_bwd, c.kernels_fwd, c.kernels_bwd) == (flops * 256, bwd_flops * 256, 1, bwd_kernels)



@pytest.mark.parametrize("case, torch_run, saved", [
    ("divisor", lambda x: x / (x.detach().abs() + 1), [1]),
    ("dividend", lambda x: (x.detach().abs() + 1) / x, [0, 1]),
    ("both", lambda x: x / (x.detach().abs() + 1).requires_grad_(), [0, 1]),
])
def test_a_quotient_counts_the_gradients_of_the_inputs_that_need_one(case, torch_run, saved):
    """x / y computed 5 backward kernels (x's gradient, y's) where y needs no gradient (a divisor made of the network
    input alone): torch computes x's alone, grad / y, and keeps y alone; where x needs none, y's 4. The quotient's cost
    in the walk counts the kernels and FLOPs this torch runs for the inputs that need a gradient ("divisor": the
    divisor needs none)."""
    pytest.importorskip("torch")
    from torch import nn

    from perf4sight.features.walk import walk
    from perf4sight.ir.from_torch import describe

    class Quotient(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.conv, self.fc = nn.Conv2d(3, 4, 3, padding=1), nn.Linear(4, 10)

        def forward(self, x):
            y, plain = self.conv(x), x.abs().mean(1, keepdim=True) + 1  # plain: the input's alone, no gradient
            q = {"divisor": lambda: y / plain, "dividend": lambda: plain / y, "both": lambda: y / (y.abs() + 1)}[case]()
            return self.fc(q.mean((2, 3)))

    desc = describe(Quotient(), [3, 6, 6], "quotient")
    (visit,) = [v for v in walk(desc) if v.node.op == "div"]
    backward = _ops_run(torch_run, [4, 6, 6])[1]
    assert (visit.cost.kernels_bwd, visit.cost.saved) == (len(backward), saved)
    assert visit.cost.flops_bwd == len(backward) * 4 * 6 * 6 == sum(elements for _, elements in backward)


def test_powers_exp_and_abs_count_as_activations_in_perf4sight_s_features():
    """An elementwise function of one tensor (pow, exp, abs, log) counts its output's elements as an activation's."""
    from perf4sight.features.perf4sight_set import PERF4SIGHT_FEATURES, perf4sight_vectors

    col = PERF4SIGHT_FEATURES.index("act_elems")
    base = [Node("input", "input", [], {}, [4, 8, 8]), _conv("c", "input", 4, 4, 1, 1, 8)]
    plain = perf4sight_vectors(_desc(base))[1][col]
    for op, attrs in (("pow", {"exponent": 2.0}), ("exp", {}), ("abs", {}), ("log", {})):
        assert perf4sight_vectors(_desc(base + [Node("a", op, ["c"], attrs, [4, 8, 8])]))[1][col] == plain + 256
    add = PERF4SIGHT_FEATURES.index("add_elems")  # a quotient of two tensors, with the adds and multiplies
    assert perf4sight_vectors(_desc(base + [Node("a", "div", ["c", "c"], {}, [4, 8, 8])]))[1][add] == \
        perf4sight_vectors(_desc(base + [Node("a", "mul", ["c", "c"], {}, [4, 8, 8])]))[1][add] > 0


def test_an_rms_norm_keeps_what_a_cuda_build_keeps():
    """An RMS norm keeps its input and a 1/rms per row: exactly what a sample adds to autograd's saved tensors where it
    runs as CUDA's fused kernel, and, without a weight, on this CPU too (op by op: the square keeps the input, the
    product the input and the 1/rms); with a weight this CPU keeps the normalised tensor as well. Its FLOPs: 4 an
    element forward and 9 back with a weight, 3 and 5 without; its weight counted."""
    pytest.importorskip("torch")
    from torch import nn

    from perf4sight.ir.from_torch import describe

    net = nn.Sequential(nn.Conv2d(3, 8, 3), nn.RMSNorm([8, 8, 8]), nn.Conv2d(8, 8, 3), nn.RMSNorm(6),
                        nn.Conv2d(8, 8, 1), nn.RMSNorm([6, 6], elementwise_affine=False), nn.Flatten(),
                        nn.Linear(8 * 36, 10))
    desc = describe(net, [3, 10, 10], "rms")
    norms = [n for n in desc.nodes if n.op == "rmsnorm"]
    costs = [_cost(n, [desc.node(n.inputs[0]).output_shape]) for n in norms]
    sizes = [8 * 64, 8 * 36, 8 * 36]
    assert [(c.flops_fwd, c.flops_bwd, c.params) for c in costs] == [(4 * sizes[0], 9 * sizes[0], 512),
                                                                     (4 * sizes[1], 9 * sizes[1], 6),
                                                                     (3 * sizes[2], 5 * sizes[2], 0)]
    assert [(c.saved, c.extra_saved_bytes) for c in costs] == [([0], 4.0), ([0], 8 * 6 * 4.0), ([0], 8 * 4.0)]
    nf = network_features(desc)
    at2, at4 = (b * _autograd_saved_bytes(desc, b, fused_rms_norm=True) for b in (2, 4))
    assert nf.per_sample["saved_bytes"] + nf.per_sample["input_bytes"] == (at4 - at2) / 2
    plain = describe(nn.Sequential(nn.Conv2d(3, 8, 3), nn.RMSNorm([8, 8], elementwise_affine=False), nn.Flatten(),
                                   nn.Linear(8 * 64, 10)), [3, 10, 10], "plain")
    at2, at4 = (b * _autograd_saved_bytes(plain, b) for b in (2, 4))  # torch's own, op by op
    nf = network_features(plain)
    assert nf.per_sample["saved_bytes"] + nf.per_sample["input_bytes"] == (at4 - at2) / 2
    assert not nf.unsupported


def _channels_last_rms_norm(affine: bool, channels_last_conv: bool):
    """A ConvNeXt-style block: a convolution (its output laid out channels last where ``channels_last_conv``), an RMS
    norm over the channels of the map permuted to [N, H, W, C] (with a weight where ``affine``), permuted back."""
    import torch
    from torch import nn

    class Block(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.conv, self.fc = nn.Conv2d(3, 8, 3, padding=1), nn.Linear(8, 10)
            self.norm = nn.RMSNorm(8, elementwise_affine=affine)

        def forward(self, x):
            y = self.conv(x.contiguous(memory_format=torch.channels_last) if channels_last_conv else x)
            return self.fc(self.norm(y.permute(0, 2, 3, 1)).permute(0, 3, 1, 2).mean((2, 3)))
    return Block()


@pytest.mark.parametrize("affine, channels_last_conv", [(True, False), (False, False), (True, True)])
def test_an_rms_norm_of_a_channels_last_map_keeps_what_a_cuda_build_keeps(affine, channels_last_conv):
    """An RMS norm of a map permuted to [N, H, W, C] (ConvNeXt's layout): its strides are not channels-last-like (so
    torch's rms_norm runs CUDA's fused kernel on it, not its channels-last fallback), and its saved bytes are what
    autograd keeps for the original block and for the rebuilt one run as a CUDA build runs them (what a sample adds
    between batch 2 and 4). This CPU runs it op by op, keeping the normalised map as well where it has a weight: one
    map more (measured on torch 2.14), the CPU's difference for any RMS norm with a weight, not the layout's."""
    pytest.importorskip("torch")
    import copy

    import torch
    from torch._prims_common import suggest_memory_format

    from perf4sight.features.alloc_trace import _fused_rms_norm
    from perf4sight.ir.from_torch import describe

    maps = (torch.empty(2, 8, 6, 6), torch.empty(2, 8, 6, 6).contiguous(memory_format=torch.channels_last))
    assert all(suggest_memory_format(m.permute(0, 2, 3, 1)) == torch.contiguous_format for m in maps)
    network = _channels_last_rms_norm(affine, channels_last_conv)
    desc = describe(network, [3, 6, 6], "rms_nhwc")
    assert [n.op for n in desc.nodes][1:5] == ["conv2d", "permute", "rmsnorm", "permute"]
    nf = network_features(desc)
    kept = nf.per_sample["saved_bytes"] + nf.per_sample["input_bytes"]
    fused = copy.deepcopy(network)
    _fused_rms_norm(fused)
    original = (_module_saved_bytes(fused, [3, 6, 6], 4) - _module_saved_bytes(fused, [3, 6, 6], 2)) / 2
    rebuilt = (4 * _autograd_saved_bytes(desc, 4, fused_rms_norm=True)
               - 2 * _autograd_saved_bytes(desc, 2, fused_rms_norm=True)) / 2
    assert kept == original == rebuilt
    on_cpu = (_module_saved_bytes(network, [3, 6, 6], 4) - _module_saved_bytes(network, [3, 6, 6], 2)) / 2
    assert on_cpu - kept == (8 * 6 * 6 * 4 if affine else 0)


def test_a_repeat_keeps_nothing_and_sums_its_gradient_back():
    """A repeat (torch's aten.repeat) is a copy that keeps nothing: a sample adds no saved tensor of it to autograd's;
    no FLOPs forward, an add per output element but one per input element back (the sum over its tiles), and no
    backward kernel where every count is 1."""
    pytest.importorskip("torch")
    from torch import nn

    from perf4sight.ir.from_torch import describe

    class Tile(nn.Module):
        def __init__(self, *repeats: int) -> None:
            super().__init__()
            self.repeats = repeats

        def forward(self, x):
            return x.repeat(1, *self.repeats)

    net = nn.Sequential(nn.Conv2d(3, 4, 3), Tile(2, 1, 1), nn.Conv2d(8, 8, 3), Tile(1, 2, 3), Tile(1, 1, 1),
                        nn.Flatten(), nn.Linear(8 * 8 * 12, 10))
    desc = describe(net, [3, 8, 8], "tiled")
    tiles = [n for n in desc.nodes if n.op == "repeat"]
    costs = [_cost(n, [desc.node(n.inputs[0]).output_shape]) for n in tiles]
    assert [(c.flops_fwd, c.flops_bwd, c.kernels_bwd, c.saved) for c in costs] == [
        (0.0, 4 * 36.0, 1, []), (0.0, 768.0 - 128, 1, []), (0.0, 0.0, 0, [])]
    assert [c.bytes_written for c in costs] == [4.0 * 8 * 36, 4.0 * 768, 4.0 * 768]
    nf = network_features(desc)
    at2, at4 = (b * _autograd_saved_bytes(desc, b) for b in (2, 4))
    assert nf.per_sample["saved_bytes"] + nf.per_sample["input_bytes"] == (at4 - at2) / 2
    assert not nf.unsupported


def test_an_rrelu_keeps_its_noise_and_its_input_or_result():
    """An RReLU keeps a noise tensor of its input's size and its input, or in place its result: exactly what a sample
    adds to autograd's saved tensors; 5 FLOPs an element forward, 1 back."""
    pytest.importorskip("torch")
    from torch import nn

    from perf4sight.ir.from_torch import describe

    net = nn.Sequential(nn.Conv2d(3, 8, 3), nn.RReLU(), nn.Conv2d(8, 8, 3), nn.RReLU(0.1, 0.2, inplace=True),
                        nn.Flatten(), nn.Linear(8 * 36, 10))
    desc = describe(net, [3, 10, 10], "rrelu")
    acts = [n for n in desc.nodes if n.op == "rrelu"]
    costs = [_cost(n, [desc.node(n.inputs[0]).output_shape]) for n in acts]
    assert [(c.flops_fwd, c.flops_bwd, c.saved, c.extra_saved_bytes) for c in costs] == [
        (5.0 * 8 * 64, 8.0 * 64, [0], 4.0 * 8 * 64), (5.0 * 8 * 36, 8.0 * 36, [-1], 4.0 * 8 * 36)]
    nf = network_features(desc)
    at2, at4 = (b * _autograd_saved_bytes(desc, b) for b in (2, 4))
    assert nf.per_sample["saved_bytes"] + nf.per_sample["input_bytes"] == (at4 - at2) / 2
    assert not nf.unsupported


def test_an_alpha_dropout_keeps_its_noise():
    """An alpha dropout keeps its noise alone (an element's size, or a float per sample and channel): exactly what a
    sample adds to autograd's saved tensors; seven kernels forward, one back; of p 0 a view of its input."""
    pytest.importorskip("torch")
    from torch import nn

    from perf4sight.ir.from_torch import describe

    net = nn.Sequential(nn.Conv2d(3, 8, 3), nn.SELU(), nn.AlphaDropout(0.1), nn.Conv2d(8, 8, 3), nn.SELU(),
                        nn.FeatureAlphaDropout(0.2), nn.AlphaDropout(0.0), nn.Flatten(), nn.Linear(8 * 36, 10))
    desc = describe(net, [3, 10, 10], "snn")
    drops = [n for n in desc.nodes if n.op == "alpha_dropout"]
    costs = [_cost(n, [desc.node(n.inputs[0]).output_shape]) for n in drops]
    assert [(c.flops_fwd, c.flops_bwd, c.extra_saved_bytes, c.kernels_fwd) for c in costs] == [
        (7.0 * 8 * 64, 8.0 * 64, 4.0 * 8 * 64, 7), (2.0 * 8 * 36 + 5 * 8, 8.0 * 36, 4.0 * 8, 7), (0.0, 0.0, 0.0, 0)]
    nf = network_features(desc)
    at2, at4 = (b * _autograd_saved_bytes(desc, b) for b in (2, 4))
    assert nf.per_sample["saved_bytes"] + nf.per_sample["input_bytes"] == (at4 - at2) / 2
    assert not nf.unsupported


def frozen_backbone():
    """A detection backbone's stem and block of frozen batch norms (torchvision's FrozenBatchNorm2d, their buffers
    drawn at random): one of the input (which needs no gradient), one after a convolution, one of eps 0 before a
    residual add."""
    import torch
    from torch import nn
    from torchvision.ops.misc import FrozenBatchNorm2d

    class Frozen(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.f0 = FrozenBatchNorm2d(3)
            self.c1, self.f1 = nn.Conv2d(3, 16, 3, 2, 1, bias=False), FrozenBatchNorm2d(16)
            self.c2, self.f2 = nn.Conv2d(16, 16, 3, 1, 1, bias=False), FrozenBatchNorm2d(16, eps=0.0)
            self.fc = nn.Linear(16, 5)
            for norm in (self.f0, self.f1, self.f2):
                for name in ("weight", "bias", "running_mean"):
                    getattr(norm, name).copy_(torch.randn_like(getattr(norm, name)))
                norm.running_var.copy_(torch.rand_like(norm.running_var) + 0.5)

        def forward(self, x):
            x = torch.relu(self.f1(self.c1(self.f0(x))))
            y = self.f2(self.c2(x)) + x
            return self.fc(y.relu().mean((2, 3)))
    return Frozen()


def test_a_frozen_batch_norm_keeps_what_autograd_keeps():
    """A frozen batch norm keeps its [1, C, 1, 1] scale alone, once a batch: what a sample adds to autograd's saved
    tensors (between batch 2 and 4) is the features', the original network's and the rebuilt one's alike; it has no
    parameters, and its costs are a multiply and an add an element forward, a multiply back (none where its input
    needs no gradient, the network input's: nor does the convolution after it compute its input's gradient)."""
    pytest.importorskip("torch")
    from perf4sight.features.walk import walk
    from perf4sight.ir.from_torch import describe
    from perf4sight.ir.schema import count_params

    network = frozen_backbone()
    desc = describe(network, [3, 8, 8], "frozen")
    nf = network_features(desc)
    at2, at4 = 2 * _autograd_saved_bytes(desc, 2), 4 * _autograd_saved_bytes(desc, 4)
    original = (_module_saved_bytes(network, [3, 8, 8], 4) - _module_saved_bytes(network, [3, 8, 8], 2)) / 2
    # nothing keeps the input (the first norm's multiply keeps its scale alone): the saved bytes are all autograd's
    assert nf.per_sample["saved_bytes"] == (at4 - at2) / 2 == original
    # and once a batch, the [1, 16, 1, 1] scales of the two norms whose input needs a gradient
    assert nf.batch_saved_sizes.tolist() == [16 * 4, 16 * 4] and sum(nf.batch_saved_sizes) == at2 - (at4 - at2)
    assert count_params(desc) == sum(p.numel() for p in network.parameters()) == 16 * 27 + 16 * 144 + 16 * 5 + 5
    assert not nf.unsupported
    costs = {visit.node.name: visit.cost for visit in walk(desc)}
    assert (costs["f1"].flops_fwd, costs["f1"].flops_bwd, costs["f1"].params) == (2 * 16 * 16, 16 * 16, 0)
    assert costs["f0"].flops_bwd == 0 and costs["f0"].kernels_bwd == 0  # its input needs no gradient


def _bn_neck():
    """A re-ID network's head: a convolution and a BatchNorm2d, pooled, then a BatchNorm1d of the [C] features (a
    BNNeck) before the classifier."""
    from torch import nn
    return nn.Sequential(nn.Conv2d(3, 16, 3, padding=1), nn.BatchNorm2d(16), nn.ReLU(), nn.AdaptiveAvgPool2d(1),
                         nn.Flatten(), nn.Linear(16, 48), nn.BatchNorm1d(48), nn.Linear(48, 5))


def test_a_batch_norm_keeps_its_mean_and_inverse_deviation_once_a_batch():
    """A batch norm keeps its input a sample and the batch's mean and 1/std (torch's save_mean and save_invstd, [C]
    floats each) once a batch: the features counted them once a sample (a BatchNorm1d of 48 features 384 bytes a
    sample where autograd keeps 384 a batch). What autograd keeps at batch b is b x the features' bytes a sample plus
    what they keep once a batch (measured at batches 2 and 4), and the analytic memory estimate counts that once."""
    pytest.importorskip("torch")
    from perf4sight.features.aggregate import MIB
    from perf4sight.ir.from_torch import describe

    desc = describe(_bn_neck(), [3, 6, 6], "bn_neck")
    nf = network_features(desc)
    at2, at4 = (b * _autograd_saved_bytes(desc, b) for b in (2, 4))
    per_sample, once = (at4 - at2) / 2, at2 - (at4 - at2)
    assert once == 2 * (16 + 48) * 4
    assert nf.per_sample["saved_bytes"] + nf.per_sample["input_bytes"] == per_sample
    assert sorted(nf.batch_saved_sizes) == [64.0, 64.0, 192.0, 192.0]
    mem = {b: features_for(nf, b) for b in (2, 4)}
    intercept = 2 * mem[2]["mem_analytic_mb"] - mem[4]["mem_analytic_mb"]  # the copies and what is kept once
    assert intercept * MIB == pytest.approx(mem[2]["param_copies_mb"] * MIB + once)
    # the caching allocator rounds each of the four [C] tensors up to a 512-byte block, whatever the batch
    alloc = {b: features_for(nf, b)["saved_alloc_mb"] * MIB for b in (2, 4)}
    assert alloc[2] == pytest.approx(
        sum(math.ceil(2 * s / 512) * 512 for s in nf.saved_sizes) + 4 * 512)


def test_an_instance_norm_with_running_statistics_keeps_what_autograd_keeps():
    """An instance norm that tracks running statistics keeps its running mean and variance repeated once per sample
    (C floats a sample each) besides what any instance norm keeps: what a sample adds to autograd's saved tensors is
    the features', the original network's and the rebuilt one's alike."""
    pytest.importorskip("torch")
    from test_ir import tracked_instance_norms

    from perf4sight.ir.from_torch import describe

    network = tracked_instance_norms()
    desc = describe(network, [3, 8, 8], "tracked")
    nf = network_features(desc)
    at2, at4 = 2 * _autograd_saved_bytes(desc, 2), 4 * _autograd_saved_bytes(desc, 4)
    original = (_module_saved_bytes(network, [3, 8, 8], 4) - _module_saved_bytes(network, [3, 8, 8], 2)) / 2
    assert nf.per_sample["saved_bytes"] == (at4 - at2) / 2 == original  # the first norm's input needs no gradient:
    plain = describe(tracked_instance_norms().apply(_untracked), [3, 8, 8], "plain")  # nothing keeps it
    assert nf.per_sample["saved_bytes"] - network_features(plain).per_sample["saved_bytes"] == 2 * (8 + 8) * 4


def _untracked(module) -> None:
    """An instance norm ``module`` made one that tracks no running statistics (others left as they are)."""
    from torch import nn
    if isinstance(module, nn.InstanceNorm2d):
        module.track_running_stats, module.running_mean, module.running_var = False, None, None


def _matmul_description(case: str):
    """An [8, 6] input (per sample; [2, 8, 6] for ``broadcast``), two linear layers of it and their matmul: ``both``,
    fc1 [8, 5] times fc2 transposed [5, 8]; ``first``, fc1 [8, 6] times the input transposed [6, 8] (the input needs
    no gradient); ``broadcast``, fc1 [2, 8, 5] times the first of fc2's two [5, 8] matrices ([1, 5, 8])."""
    def fc(name, fin, fout, shape):
        return Node(name, "linear", ["input"], {"in_features": fin, "out_features": fout, "bias": True}, shape)
    lead = [2] if case == "broadcast" else []
    width = 6 if case == "first" else 5
    nodes = [Node("input", "input", [], {}, lead + [8, 6]), fc("fc1", 6, width, lead + [8, width])]
    if case == "first":
        nodes.append(Node("t", "transpose", ["input"], {"dim0": 1, "dim1": 2}, [6, 8]))
    else:
        dims = {"dim0": 2, "dim1": 3} if lead else {"dim0": 1, "dim1": 2}
        nodes += [fc("fc2", 6, 5, lead + [8, 5]), Node("t", "transpose", ["fc2"], dims, lead + [5, 8])]
    if lead:
        nodes.append(Node("n", "narrow", ["t"], {"dim": 1, "start": 0, "length": 1}, [1, 5, 8]))
    nodes.append(Node("mm", "matmul", ["fc1", nodes[-1].name], {}, lead + [8, 8]))
    return _desc(nodes, shape=lead + [8, 6])


@pytest.mark.parametrize("case, kept", [("both", [0, 1]), ("first", [1]), ("broadcast", [0])])
def test_a_matmul_keeps_what_autograd_keeps(case, kept):
    """A product of two activations: 2 M N K FLOPs per matrix forward, twice that backward for both inputs' gradients
    (half for one alone); it keeps each input that the other's gradient reads (the input transposed alone where only
    fc1 needs a gradient), a broadcast one as torch's bmm keeps it, expanded and copied: a copy of its own, not the
    input (nor the whole linear output it narrows). The bytes kept are what autograd saves in a training forward of
    the rebuilt module (linear layers keep the network input, counted here only where the matmul keeps it too), and so
    are the network's (its loss's log-softmax aside)."""
    pytest.importorskip("torch")
    from perf4sight.features.walk import walk
    desc = _matmul_description(case)
    visit = next(v for v in walk(desc) if v.node.op == "matmul")
    c, a = visit.cost, visit.in_shapes[0]
    matrices = 2 if case == "broadcast" else 1
    assert c.macs == matrices * 8 * 8 * a[-1] and c.flops_fwd == 2 * c.macs
    assert c.flops_bwd == (2 if case == "first" else 4) * c.macs and c.saved == kept
    kept_bytes = sum(math.prod(visit.in_shapes[i]) * 4 for i in c.saved) + c.extra_saved_bytes
    assert c.extra_saved_bytes == (2 * 5 * 8 * 4 if case == "broadcast" else 0)
    assert _autograd_saved_bytes(desc, 3, with_input=case == "first") == kept_bytes
    at2, at4 = (b * _autograd_saved_bytes(desc, b, with_input=False) for b in (2, 4))
    loss = math.prod(desc.node(desc.output).output_shape) * 4
    assert network_features(desc).per_sample["saved_bytes"] - loss == (at4 - at2) / 2
    from perf4sight.ir.to_torch import build_module
    clones = _forward_ops(build_module(desc), [3] + desc.input_shape).count("clone")  # the broadcast input's copy
    assert c.kernels_fwd == 1 + clones and clones == (case == "broadcast")


@pytest.mark.parametrize("case", ["pooled_second", "pooled_first", "input", "both"])
def test_a_product_counts_the_gradient_and_keeps_the_input_of_the_factor_that_needs_one(case):
    """A map times a factor that needs no gradient (the network input, or a pool of it): torch computes the map's
    gradient alone (one kernel, the gradient times the factor) and keeps the factor alone (where both need one, both
    and two kernels): the saved bytes a sample are autograd's at batches 2 and 4 (the input aside)."""
    torch = pytest.importorskip("torch")
    from torch import nn

    from perf4sight.features.walk import walk
    from perf4sight.ir.from_torch import describe

    class Gate(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.conv = nn.Conv2d(3, 3, 3, padding=1)

        def forward(self, x):
            y, pooled = self.conv(x), nn.functional.avg_pool2d(x, 3, 1, 1)
            z = {"pooled_second": lambda: y * pooled, "pooled_first": lambda: pooled * y, "input": lambda: y * x,
                 "both": lambda: y * y.abs()}[case]()
            return torch.flatten(z, 1)

    model = Gate()
    desc = describe(model, [3, 6, 6], "gate")
    (visit,) = [v for v in walk(desc) if v.node.op == "mul"]
    assert visit.cost.kernels_bwd == (2 if case == "both" else 1)
    assert visit.cost.flops_bwd == visit.cost.kernels_bwd * 3 * 6 * 6
    kept = []
    for batch in (2, 4):
        x = torch.randn(batch, 3, 6, 6)
        hooks, saved = _kept_storages({t.untyped_storage().data_ptr() for t in [x, *model.parameters()]})
        with hooks:
            model(x)
        kept.append(sum(saved.values()))
    expected = {"pooled_second": 3 * 6 * 6 * 4, "pooled_first": 3 * 6 * 6 * 4, "input": 0, "both": 2 * 3 * 6 * 6 * 4}
    assert network_features(desc).per_sample["saved_bytes"] == (kept[1] - kept[0]) / 2 == expected[case]


def test_attention_on_the_network_input_leaves_out_its_input_projections_gradient_alone():
    """Self-attention whose input needs no gradient (tokens made of the network input alone) skips one GEMM of its
    backward, the packed input projection's input gradient (3 L E^2 MACs), as torch's FlopCounterMode counts the
    difference; the output projection's and the scores' gradients still run (the queries, keys and values need theirs
    for the projection's weight). It had left out one pass of every product. MaxViT's group attention likewise."""
    torch = pytest.importorskip("torch")
    from torch import nn
    from torch.utils.flop_counter import FlopCounterMode

    tokens, width = 10, 16
    node = Node("a", "attention", ["x"], {"embed_dim": width, "num_heads": 2, "bias": True}, [tokens, width])
    skipped = _cost(node, [[tokens, width]]).flops_bwd - _cost(node, [[tokens, width]], first=True).flops_bwd
    attention = nn.MultiheadAttention(width, 2, batch_first=True)
    counted = []
    for needs_grad in (True, False):
        x = torch.randn(2, tokens, width, requires_grad=needs_grad)
        y = attention(x, x, x, need_weights=False)[0]
        with FlopCounterMode(display=False) as backward:
            y.sum().backward()
        counted.append(backward.get_total_flops() / 2)
    assert skipped == counted[0] - counted[1] == 2 * 3 * tokens * width ** 2
    attrs = {"embed_dim": width, "num_heads": 2, "window_size": [2, 5], "bias": True}
    group = Node("g", "group_attention", ["x"], attrs, [1, tokens, width])
    assert (_cost(group, [[1, tokens, width]]).flops_bwd - _cost(group, [[1, tokens, width]], first=True).flops_bwd
            == 2 * 3 * tokens * width ** 2)


@pytest.mark.parametrize("first", [True, False])
def test_an_in_place_activation_of_what_needs_no_gradient_clones_nothing(first):
    """autograd clones an in-place hardswish's input (to keep it for backward) only where that input needs a gradient:
    of a pool of the network input none, so the walk counts no clone kernel there (a convolution's output: one)."""
    pytest.importorskip("torch")
    from torch import nn

    from perf4sight.features.walk import walk
    from perf4sight.ir.from_torch import describe

    net = nn.Sequential(nn.AvgPool2d(2) if first else nn.Conv2d(3, 3, 1), nn.Hardswish(inplace=True),
                        nn.Conv2d(3, 4, 1), nn.Flatten())
    desc = describe(net, [3, 4, 4], "pooled")
    (visit,) = [v for v in walk(desc) if v.node.op == "hardswish"]
    clones = _forward_ops(net, [2, 3, 4, 4]).count("clone")
    assert (visit.first, visit.input_copies, visit.cost.kernels_fwd) == (first, clones, 1 + clones)
    assert clones == (0 if first else 1)


def test_perf4sight_conv_set_runs_winograd_on_undilated_unstrided_3x3_alone_and_counts_group_attention():
    """The PerfSight set's Winograd costs are for a dense 3x3 convolution of stride 1 (either side) and no dilation, as
    cuDNN's Winograd algorithms require: a dilated one, or one of stride [1, 2] (counted strided), has none. MaxViT's
    attention within groups reads its projections as fully connected layers, as the other attentions do, and a mean
    over the map is a global pool."""
    from perf4sight.features.perf4sight_set import PERF4SIGHT_FEATURES, perf4sight_vectors
    conv = {"in_channels": 4, "out_channels": 8, "kernel_size": [3, 3], "stride": [1, 1], "padding": [1, 1],
            "dilation": [1, 1], "groups": 1, "bias": False}
    wino = PERF4SIGHT_FEATURES.index("fwd_wino_pointwise_flops")

    def vectors(attrs, out):
        return perf4sight_vectors(_desc([Node("input", "input", [], {}, [4, 8, 8]),
                                         Node("c", "conv2d", ["input"], attrs, out)], shape=(4, 8, 8)))
    assert vectors(conv, [8, 8, 8])[1][wino] > 0
    assert vectors(dict(conv, dilation=[2, 2], padding=[2, 2]), [8, 8, 8])[1][wino] == 0
    static, scaled = vectors(dict(conv, stride=[1, 2]), [8, 8, 4])
    assert scaled[wino] == 0 and static[PERF4SIGHT_FEATURES.index("n_strided")] == 1
    attrs = {"embed_dim": 16, "num_heads": 2, "window_size": [2, 2], "bias": True}
    desc = _desc([Node("input", "input", [], {}, [4, 4, 16]),
                  Node("g", "group_attention", ["input"], attrs, [4, 4, 16])], shape=(4, 4, 16))
    assert perf4sight_vectors(desc)[1][PERF4SIGHT_FEATURES.index("fc_macs")] == 4 * 16 * 16 * 16
    pooled = [Node("input", "input", [], {}, [4, 8, 8]), Node("c", "conv2d", ["input"], conv, [8, 8, 8])]
    pools = [perf4sight_vectors(_desc(pooled + [node]))[1][PERF4SIGHT_FEATURES.index("pool_elems")] for node in (
        Node("p", "adaptiveavgpool2d", ["c"], {"output_size": [1, 1]}, [8, 1, 1]),
        Node("p", "mean", ["c"], {"dims": [2, 3], "keepdim": True}, [8, 1, 1]))]
    assert pools == [8 * 8 * 8] * 2  # a global pool, or the mean torch runs it as: its input's elements


def test_an_adaptive_pool_to_a_size_that_does_not_divide_reads_its_overlapping_windows():
    """torch's adaptive pool of 9 rows to 4 reads windows of 3 (rows 0-2, 2-4, 4-6, 6-8: 12 rows in all), of 11
    columns to 3 windows of 4, 5 and 4 (13; each window's first and last row or column found by torch's own max
    pool of their indices): a FLOP an element of each window, 12 x 13 a channel; where the size divides (a global
    pool), the input's elements."""
    import torch
    import torch.nn.functional as F

    def span(size, out):  # the elements of every window along one side, from the windows' first and last indices
        at = torch.arange(size, dtype=torch.float32).reshape(1, 1, size)
        last, first = F.adaptive_max_pool1d(at, out), -F.adaptive_max_pool1d(-at, out)
        return int((last - first + 1).sum())
    assert (span(9, 4), span(11, 3)) == (12, 13)
    for op in ("adaptiveavgpool2d", "adaptivemaxpool2d"):
        c = _cost(Node("p", op, ["x"], {"output_size": [4, 3]}, [4, 4, 3]), [[4, 9, 11]])
        assert c.flops_fwd == 4 * span(9, 4) * span(11, 3)
        assert _cost(Node("p", op, ["x"], {"output_size": [1, 1]}, [4, 1, 1]), [[4, 9, 11]]).flops_fwd == 4 * 9 * 11


def test_changed_cost_is_replace_and_refuses_unknown_fields():
    """formulas.changed (the walk's fast dataclasses.replace of an OpCost) makes what replace makes: a new cost, the
    named fields set, the others the same objects, the original untouched; a name that is no field is refused."""
    import dataclasses

    from perf4sight.features.formulas import changed
    cost = HANDLERS["conv2d"](_conv("c", "input", 3, 8, 3, 1, 16), [[3, 16, 16]], False)
    new = changed(cost, kernels_fwd=cost.kernels_fwd + 1, saved=[])
    assert new == dataclasses.replace(cost, kernels_fwd=cost.kernels_fwd + 1, saved=[])
    assert new is not cost and new.kernels_fwd == cost.kernels_fwd + 1 and new.saved == [] and cost.saved != []
    assert new.batch_saved is cost.batch_saved and list(vars(new)) == list(vars(cost))
    with pytest.raises(TypeError, match="kernels"):
        changed(cost, kernels=1)
