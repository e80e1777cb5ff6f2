"""Blocks of research code the description still refuses, each written here from its paper's description: CondConv
(per-sample kernels mixed from experts), shuffle attention (groups folded into the batch), CoordConv (coordinate
channels from torch.linspace), a blur pool (a fixed filter held as a buffer), weight standardisation (a convolution
whose weight is normalised in the forward) and a gather of a parameter (an embedding's or a relative position bias's
lookup). A blur pool is a conv2d of the flag fixed (its filter a buffer), weight standardisation in seven spellings
a conv2d of standardize (its weight the parameter standardised at every forward; NFNets' ScaledStdConv2d with
standardize_scale, its gain a parameter), CoordConv's channels (a linspace expanded, a meshgrid's grid, the PyTorch
port's arange copied by repeat, a meshgrid of aranges) the op linspace; none of the others fits a description
without an op of its own, and each is refused in one line that names the form, where the refusals named a matmul, a
reshape or a getitem (or spoke of BiFPN's fusion). A weight computed by a parametrization (weight_norm, spectral_norm,
orthogonal, weight standardisation) or by torch's hooks (the old weight_norm and spectral_norm, prune's mask) is refused
naming the form, where the plain layer was described; a parametrization that is the identity describes as the layer.
A hook torch.fx drops (of a layer kept whole, of the model, any backward hook) that returns a value is refused naming
the layer and the hook; observers, and a forward hook of a module traced through (its ops traced), describe."""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from test_ir_maths_calls import SHAPE, _computes_the_same

from torch import nn
from torch.nn.utils import parametrizations, parametrize, prune

from perf4sight.errors import UserError
from perf4sight.ir.from_torch import describe


class _CondConv(nn.Module):
    """CondConv: a routing of the pooled input (sigmoid of a linear layer) mixes ``experts`` kernels into one per
    sample, run as one grouped convolution over the batch folded into the channels."""

    def __init__(self, channels: int = 8, experts: int = 3) -> None:
        super().__init__()
        self.route = nn.Linear(channels, experts)
        self.experts = nn.Parameter(torch.randn(experts, channels * channels * 9) * 0.1)

    def forward(self, x):
        b, c, h, w = x.shape
        mixed = torch.sigmoid(self.route(x.mean((2, 3)))) @ self.experts
        y = F.conv2d(x.reshape(1, b * c, h, w), mixed.reshape(b * c, c, 3, 3), padding=1, groups=b)
        return y.reshape(b, c, h, w)


class _ExpertsSummed(nn.Module):
    """CondConv as the message advises: each expert's convolution of the input, scaled by its routing weight, summed
    (what a mixed kernel computes, a convolution being linear in its weight)."""

    def __init__(self, channels: int = 8, experts: int = 3) -> None:
        super().__init__()
        self.route = nn.Linear(channels, experts)
        self.convs = nn.ModuleList(nn.Conv2d(channels, channels, 3, padding=1, bias=False) for _ in range(experts))

    def forward(self, x):
        r = torch.sigmoid(self.route(x.mean((2, 3))))
        return sum(r[:, i].view(-1, 1, 1, 1) * conv(x) for i, conv in enumerate(self.convs))


class _ExpertsByEinsum(nn.Module):
    """CondConv with its kernels mixed by an einsum, each sample's convolution run alone."""

    def __init__(self, channels: int = 8, experts: int = 3) -> None:
        super().__init__()
        self.route = nn.Linear(channels, experts)
        self.experts = nn.Parameter(torch.randn(experts, channels, channels, 3, 3) * 0.1)

    def forward(self, x):
        kernels = torch.einsum("be,eoikl->boikl", self.route(x.mean((2, 3))).softmax(1), self.experts)
        return torch.cat([F.conv2d(x[i:i + 1], kernels[i], padding=1) for i in range(2)])


class _GeneratedLinear(nn.Module):
    """A hypernetwork's linear layer over each pixel's channels: its weight made by a linear layer from the pooled
    map."""

    def __init__(self) -> None:
        super().__init__()
        self.generate = nn.Linear(8, 64)

    def forward(self, x):
        return F.linear(x.permute(0, 2, 3, 1), self.generate(x.mean((2, 3)))[0].view(8, 8)).permute(0, 3, 1, 2)


class _StandardisedByBatchNorm(nn.Conv2d):
    """Weight standardisation written with F.batch_norm over the weight's rows."""

    def forward(self, x):
        w = F.batch_norm(self.weight.reshape(1, self.out_channels, -1), None, None, training=True,
                         eps=1e-6).reshape_as(self.weight)
        return F.conv2d(x, w, self.bias, self.stride, self.padding, self.dilation, self.groups)


class _ScaledStandardised(nn.Conv2d):
    """NFNets' scaled weight standardisation (Brock et al. 2021) as timm's ScaledStdConv2d writes it: the weight
    standardised per output channel by F.batch_norm, whose weight is a learnt gain per output channel times the fixed
    gamma / sqrt(fan_in)."""

    def __init__(self, *args, gamma: float = 1.7, eps: float = 1e-6, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.gain = nn.Parameter(torch.full((self.out_channels, 1, 1, 1), 0.5) + 0.1 * torch.randn(self.out_channels,
                                                                                                     1, 1, 1))
        self.scale, self.eps = gamma * self.weight[0].numel() ** -0.5, eps

    def forward(self, x):
        w = F.batch_norm(self.weight.reshape(1, self.out_channels, -1), None, None,
                         weight=(self.gain * self.scale).view(-1), training=True, momentum=0., eps=self.eps)
        return F.conv2d(x, w.reshape_as(self.weight), self.bias, self.stride, self.padding, self.dilation, self.groups)


class _ScaledByStdMean(_ScaledStandardised):
    """timm's older ScaledStdConv2d: torch.std_mean's, times the scale, over the std plus eps, times the gain."""

    def forward(self, x):
        std, mean = torch.std_mean(self.weight, dim=[1, 2, 3], keepdim=True, unbiased=False)
        weight = self.scale * (self.weight - mean) / (std + self.eps)
        return F.conv2d(x, self.gain * weight, self.bias, self.stride, self.padding, self.dilation, self.groups)


class _ScaledByLayerNorm(_ScaledStandardised):
    """timm's ScaledStdConv2d of use_layernorm: F.layer_norm over each output channel's kernel, times the scale, times
    the gain (its eps squared)."""

    def forward(self, x):
        weight = self.scale * F.layer_norm(self.weight, self.weight.shape[1:], eps=self.eps ** 2)
        return F.conv2d(x, self.gain * weight, self.bias, self.stride, self.padding, self.dilation, self.groups)


class _StandardisedByLayerNorm(nn.Conv2d):
    """Weight standardisation by F.layer_norm of the weight over each output channel's kernel (its sizes by size())."""

    def forward(self, x):
        w = F.layer_norm(self.weight, self.weight.size()[1:], eps=1e-5)
        return F.conv2d(x, w, self.bias, self.stride, self.padding, self.dilation, self.groups)


class _StandardisedByStd(nn.Conv2d):
    """Weight standardisation as its paper's summary writes it: less the mean, over the (unbiased) std plus eps."""

    def forward(self, x):
        w = self.weight
        w = (w - w.mean(dim=(1, 2, 3), keepdim=True)) / (w.std(dim=(1, 2, 3), keepdim=True) + 1e-5)
        return F.conv2d(x, w, self.bias, self.stride, self.padding, self.dilation, self.groups)


class _StandardisedByVarMean(nn.Conv2d):
    """BiT's StdConv2d: torch.var_mean's biased variance and mean, eps under the square root."""

    def forward(self, x):
        w = self.weight
        v, m = torch.var_mean(w, dim=[1, 2, 3], keepdim=True, unbiased=False)
        w = (w - m) / torch.sqrt(v + 1e-10)
        return F.conv2d(x, w, self.bias, self.stride, self.padding, self.dilation, self.groups)


class _StandardisedByStdMean(nn.Conv2d):
    """timm's older StdConv2d: torch.std_mean's biased std and mean, eps added to the std."""

    def forward(self, x):
        std, mean = torch.std_mean(self.weight, dim=[1, 2, 3], keepdim=True, unbiased=False)
        w = (self.weight - mean) / (std + 1e-5)
        return F.conv2d(x, w, self.bias, self.stride, self.padding, self.dilation, self.groups)


class _StandardisedByRows(nn.Conv2d):
    """mmcv's ConvWS2d: the mean and std of the weight viewed [out, -1], viewed back to [out, 1, 1, 1]."""

    def forward(self, x):
        c_in = self.weight.size(0)
        weight_flat = self.weight.view(c_in, -1)
        mean = weight_flat.mean(dim=1, keepdim=True).view(c_in, 1, 1, 1)
        std = weight_flat.std(dim=1, keepdim=True).view(c_in, 1, 1, 1)
        w = (self.weight - mean) / (std + 1e-5)
        return F.conv2d(x, w, self.bias, self.stride, self.padding, self.dilation, self.groups)


class _StandardisedByChainedMeans(nn.Conv2d):
    """Weight standardisation's first code: the mean taken one dimension at a time, the std of the centred weight
    viewed [out, -1] (no spelling the description reads)."""

    def forward(self, x):
        w = self.weight
        w = w - w.mean(dim=1, keepdim=True).mean(dim=2, keepdim=True).mean(dim=3, keepdim=True)
        w = w / (w.view(w.size(0), -1).std(dim=1).view(-1, 1, 1, 1) + 1e-5)
        return F.conv2d(x, w, self.bias, self.stride, self.padding, self.dilation, self.groups)


class _SlicedWeight(nn.Module):
    """A slimmable layer: a 16-channel convolution's weight sliced to the input's channel count."""

    def __init__(self) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.randn(8, 16, 3, 3) * 0.1)

    def forward(self, x):
        return F.conv2d(x, self.weight[:, :x.shape[1]], padding=1)


class _ShuffleAttention(nn.Module):
    """Shuffle attention: the channels cut into ``groups`` folded into the batch, each group's halves gated by its
    channels' means and by a group norm, the halves put back and the channels shuffled."""

    def __init__(self, channels: int = 8, groups: int = 2) -> None:
        super().__init__()
        half = channels // (2 * groups)
        self.groups, self.norm = groups, nn.GroupNorm(half, half)
        self.gates = nn.Parameter(torch.zeros(4, 1, half, 1, 1))

    def forward(self, x):
        b, c, h, w = x.shape
        x = x.reshape(b * self.groups, -1, h, w)
        pooled, normed = x.chunk(2, dim=1)
        pooled = pooled * torch.sigmoid(self.gates[0] * pooled.mean((2, 3), keepdim=True) + self.gates[1])
        normed = normed * torch.sigmoid(self.gates[2] * self.norm(normed) + self.gates[3])
        y = torch.cat([pooled, normed], dim=1).reshape(b, -1, h, w)
        return y.reshape(b, 2, -1, h, w).transpose(1, 2).reshape(b, -1, h, w)


class _CoordConv(nn.Module):
    """CoordConv: the map's row and column coordinates, -1 to 1, as two more channels before a convolution."""

    def __init__(self, channels: int = 8) -> None:
        super().__init__()
        self.conv = nn.Conv2d(channels + 2, channels, 3, padding=1)

    def forward(self, x):
        b, _, h, w = x.shape
        rows = torch.linspace(-1, 1, h).view(1, 1, h, 1).expand(b, 1, h, w)
        cols = torch.linspace(-1, 1, w).view(1, 1, 1, w).expand(b, 1, h, w)
        return self.conv(torch.cat([x, rows, cols], 1))


class _RepeatedCoordConv(_CoordConv):
    """CoordConv's coordinates copied over the batch and the map (repeat: a copy, where an expand is a view)."""

    def forward(self, x):
        b, _, h, w = x.shape
        rows = torch.linspace(-1, 1, h).view(1, 1, h, 1).repeat(b, 1, 1, w)
        return self.conv(torch.cat([x, rows, rows.transpose(2, 3)], 1))


class _BlurPool(nn.Module):
    """A blur pool: a reflection pad, then a fixed [1, 2, 1] x [1, 2, 1] low-pass filter per channel (a buffer) at
    stride 2."""

    def __init__(self, channels: int = 8) -> None:
        super().__init__()
        taps = torch.tensor([1.0, 2.0, 1.0])
        kernel = taps[:, None] * taps[None, :]
        self.register_buffer("kernel", (kernel / kernel.sum()).expand(channels, 1, 3, 3).clone())

    def forward(self, x):
        return F.conv2d(F.pad(x, (1, 1, 1, 1), mode="reflect"), self.kernel, stride=2, groups=x.shape[1])


class _StandardisedConv(nn.Conv2d):
    """Weight standardisation: each output channel's kernel less its mean, over its standard deviation, at every
    forward."""

    def forward(self, x):
        w = self.weight
        w = (w - w.mean((1, 2, 3), keepdim=True)) / (w.var((1, 2, 3), keepdim=True, unbiased=False) + 1e-5).sqrt()
        return F.conv2d(x, w, self.bias, self.stride, self.padding, self.dilation, self.groups)


class _PositionBias(nn.Module):
    """A relative position bias: a parameter table of the 15 offsets of 8 columns, looked up at a buffer of each
    column pair's offset, added to the map."""

    def __init__(self) -> None:
        super().__init__()
        self.table = nn.Parameter(torch.randn(15) * 0.1)
        cols = torch.arange(8)
        self.register_buffer("offsets", cols[:, None] - cols[None, :] + 7)

    def forward(self, x):
        return x + self.table[self.offsets]


class _Lookup(nn.Module):
    """An embedding-like lookup: each pixel's code picked from a parameter table at an index computed from the map."""

    def __init__(self) -> None:
        super().__init__()
        self.table = nn.Parameter(torch.randn(16, 8) * 0.1)

    def forward(self, x):
        codes = self.table[x.mean(1).abs().mul(4).long().clamp(0, 15)]
        return x + codes.permute(0, 3, 1, 2)


class _Block(nn.Module):
    """A convolution's [8, 8, 8] map of an image, the block, then a classifier of its flattened map."""

    def __init__(self, block: nn.Module, width: int = 8 * 8 * 8) -> None:
        super().__init__()
        self.conv, self.block, self.fc = nn.Conv2d(3, 8, 3, padding=1), block, nn.Linear(width, 10)

    def forward(self, x):
        return self.fc(self.block(self.conv(x)).flatten(1))


#: Each block: (the network holding it, what its refusal must say).
_REFUSED = {
    "CondConv": (lambda: _Block(_CondConv()),
                 r"probe: the convolution conv2d's weight is computed from the input and the parameter "
                 r"block.experts: kernels mixed per sample \(CondConv's experts, a dynamic convolution\) have no "
                 r"description op, which holds one weight for every sample; write it as each expert's convolution "
                 r"scaled by its routing weight and summed"),
    "CondConv by an einsum": (lambda: _Block(_ExpertsByEinsum()),
                              r"probe: the convolution conv2d's weight is computed from the input and the parameter "
                              r"block.experts: kernels mixed per sample \(CondConv's"),
    "a hypernetwork's linear layer": (lambda: _Block(_GeneratedLinear()),
                                      r"probe: the linear layer linear's weight is computed from the input \(a "
                                      r"hypernetwork's, a dynamic layer's\): the description has no op for it"),
    "shuffle attention": (lambda: _Block(_ShuffleAttention()),
                          r"probe: reshape reshapes the batch of 2 images .* into a first dimension of 4: .* or folds "
                          r"groups of channels into the batch \(shuffle attention's x.reshape\(b \* groups, -1, h, "
                          r"w\)\)"),
    "CoordConv of repeated coordinates": (lambda: _Block(_RepeatedCoordConv()),
                                          r"probe: call_function 'linspace' \(node linspace: values made in the "
                                          r"forward from numbers alone, as CoordConv's coordinate channels; those of "
                                          r"torch.linspace viewed along the rows or the columns and expanded over "
                                          r"the map, x.shape's sizes, describe: the op linspace, as do the "
                                          r"PyTorch port's AddCoords ones, torch.arange\(n\).repeat\(1, m, 1\) "
                                          r"scaled by .float\(\) / \(n - 1\) and copied over the batch by "
                                          r".repeat\(b, 1, 1, 1\).transpose\(2, 3\)\) has no description op"),
    "weight standardisation by chained means": (lambda: _Block(_StandardisedByChainedMeans(8, 8, 3, padding=1)),
                                                r"probe: the convolution conv2d's weight is computed in the forward "
                                                r"from the parameter block.weight \(weight standardisation, a weight "
                                                r"normalised or reparametrised\): the description has no op for it, "
                                                r"which trains a convolution's weight as it is \(weight "
                                                r"standardisation describes written as timm's StdConv2d"),
    "a weight sliced by the input's width": (lambda: _Block(_SlicedWeight()),
                                             r"probe: the convolution conv2d's weight is computed in the forward "
                                             r"from the parameter block.weight"),
    "relative position bias": (lambda: _Block(_PositionBias()),
                               r"probe: call_function 'getitem' \(node getitem: the parameter block.table indexed by "
                               r"a tensor, an embedding's or a relative position bias's lookup\) has no description "
                               r"op"),
    "lookup at computed indices": (lambda: _Block(_Lookup()),
                                   r"the parameter block.table indexed by a tensor, an embedding's or a relative "
                                   r"position bias's lookup"),
}


@pytest.mark.parametrize("block", list(_REFUSED))
def test_a_research_block_without_an_op_is_refused_naming_its_form(block):
    """Each block is refused in one line naming its form (before: a matmul of the module's tensor, reshape, a
    linspace or a getitem with no description op, a module tensor that is no parameter, BiFPN's fusion)."""
    make, match = _REFUSED[block]
    with pytest.raises(UserError, match=match) as refused:
        describe(make(), SHAPE, name="probe")
    assert "\n" not in str(refused.value)


def test_condconv_written_as_its_experts_summed_is_described():
    """The way around CondConv's refusal describes: the experts' convolutions, each scaled by its routing weight,
    summed; the rebuilt module computes the original's output and gradients."""
    desc = _computes_the_same(_Block(_ExpertsSummed()))
    assert sum(n.op == "conv2d" for n in desc.nodes) == 4


class _BlurredStem(nn.Module):
    """A blur pool of the image itself (no gradient back: its input needs none), then a conv, a blur pool of its
    map and a classifier."""

    def __init__(self) -> None:
        super().__init__()
        self.blur_in, self.conv = _BlurPool(3), nn.Conv2d(3, 8, 3, padding=1)
        self.blur, self.fc = _BlurPool(), nn.Linear(8 * 2 * 2, 10)

    def forward(self, x):
        return self.fc(self.blur(self.conv(self.blur_in(x))).flatten(1))


def test_a_blur_pool_is_a_convolution_by_a_fixed_filter():
    """A blur pool (F.conv2d by a filter held as a buffer) was refused ("conv2d reads kernel, a module tensor that
    is no parameter"): it is a conv2d of the flag fixed, its filter a buffer (no parameter counted, no weight
    gradient: one kernel forward, the input's gradient alone back, none where its input needs none). The rebuilt
    module computes the original's output and gradients and runs its kernels; what a sample adds to autograd's
    saved tensors is the features'; the allocation model writes it down as the meta trace (batches 3 and 1); a
    PerfSeer graph keeps the flag."""
    from test_allocator import _as_replayed
    from test_features import _autograd_saved_bytes
    from test_ir_research_calls import _kernels_run

    from perf4sight.exporters.perfseer import description_to_graph
    from perf4sight.features.aggregate import network_features
    from perf4sight.features.alloc_trace import record_events
    from perf4sight.features.walk import walk
    from perf4sight.importers.perfseer import graph_to_description
    from perf4sight.ir.to_torch import build_module

    module = _BlurredStem()
    desc = _computes_the_same(module)
    blurs = [n for n in desc.nodes if n.attrs.get("fixed")]
    assert [(n.inputs, n.attrs["groups"], n.attrs["stride"], n.attrs["bias"]) for n in blurs] == [
        (["pad"], 3, [2, 2], False), (["pad_1"], 8, [2, 2], False)]
    assert desc.params == sum(p.numel() for p in module.parameters()) == 8 * 3 * 9 + 8 + 32 * 10 + 10
    assert _kernels_run(module) == _kernels_run(build_module(desc))
    costs = [(v.cost.kernels_fwd, v.cost.kernels_bwd, v.cost.params, v.cost.flops_bwd > 0) for v in walk(desc)
             if v.node.attrs.get("fixed")]
    assert costs == [(1, 0, 0, False), (1, 1, 0, True)]
    at2, at4 = (b * _autograd_saved_bytes(desc, b, with_input=False) for b in (2, 4))
    assert network_features(desc).per_sample["saved_bytes"] == (at4 - at2) / 2
    for batch in (3, 1):
        assert _as_replayed(record_events(desc, batch, steps=2, method="model")) == _as_replayed(
            record_events(desc, batch, steps=2, method="trace"))
    back, _ = graph_to_description(description_to_graph(desc, 4), "probe", "probe.pkl")
    assert back.to_dict() == desc.to_dict()


def test_a_fixed_filter_with_a_bias_is_refused_by_name_and_checked():
    """A buffer's filter with a learnt bias is refused by name; a description whose fixed conv2d has a bias is
    refused on reading."""
    from perf4sight.ir.schema import NetworkDescription

    class Biased(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.blur, self.bias = _BlurPool(), nn.Parameter(torch.zeros(8))

        def forward(self, x):
            return F.conv2d(x, self.blur.kernel, self.bias, padding=1, groups=8)
    with pytest.raises(UserError, match=r"probe: the convolution conv2d filters by block.blur.kernel, a buffer, and "
                                        r"adds a bias: a fixed filter with a bias has no description op"):
        describe(_Block(Biased()), SHAPE, name="probe")
    data = describe(_Block(_BlurPool(), 8 * 4 * 4), SHAPE, name="probe").to_dict()
    next(n for n in data["nodes"] if n["attrs"].get("fixed"))["attrs"]["bias"] = True
    with pytest.raises(UserError, match=r"a fixed conv2d \(its filter a buffer, learnt nothing\) has no bias"):
        NetworkDescription.from_dict(data)


def test_a_network_with_a_blur_pool_prunes_and_trains():
    """torch-pruning cannot cut a buffer's channels: the group through the blur pool is kept whole (listed), the
    conv after it cut, and a training step of the pruned network runs."""
    from test_networks import _train_step

    from perf4sight.networks.build import Source, prune_source

    class Net(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.stem, self.blur, self.conv = nn.Conv2d(3, 8, 3, padding=1), _BlurPool(), nn.Conv2d(8, 16, 3, padding=1)
            self.fc = nn.Linear(16 * 4 * 4, 10)

        def forward(self, x):
            return self.fc(self.conv(self.blur(self.stem(x).relu())).relu().flatten(1))
    (desc,) = prune_source(Source("net", "test", Net), SHAPE, [30], "l1-norm", 2, seed=0)
    assert [(n.attrs["out_channels"], n.attrs.get("fixed")) for n in desc.nodes if n.op == "conv2d"] == [
        (8, None), (8, True), (11, None)]
    assert desc.to_dict()["pruning_unpruned_groups"]
    _train_step(desc)


class _WeightStandardisation(nn.Module):
    """Weight standardisation as a parametrization (torch.nn.utils.parametrize.register_parametrization)."""

    def forward(self, w):
        return (w - w.mean((1, 2, 3), keepdim=True)) / (w.var((1, 2, 3), keepdim=True, unbiased=False) + 1e-5).sqrt()


class _Unchanged(nn.Module):
    """A parametrization that returns its tensor as it is (no op: torch runs the plain layer's kernels alone)."""

    def forward(self, w):
        return w


class _HandWrittenConv(nn.Module):
    """A convolution layer of the model's own (traced through: torch.fx sees an old hook's ops in it)."""

    def __init__(self, channels: int = 8) -> None:
        super().__init__()
        self.weight, self.bias = nn.Parameter(torch.randn(8, channels, 3, 3) * 0.1), nn.Parameter(torch.zeros(8))

    def forward(self, x):
        return F.conv2d(x, self.weight, self.bias, padding=1)


class _ReadsItsLayersWeight(nn.Module):
    """A forward that convolves by its layer's weight (``self.inner[0].weight``, not calling the layer)."""

    def __init__(self) -> None:
        super().__init__()
        self.inner = nn.Sequential(nn.Conv2d(3, 8, 3, padding=1))

    def forward(self, x):
        return F.conv2d(x, self.inner[0].weight, self.inner[0].bias, padding=1)


def _parametrized(how, layer=None):
    """A :class:`_Block` whose block (a 3x3 conv2d of 8 channels, or ``layer``) is given to ``how``."""
    block = layer if layer is not None else nn.Conv2d(8, 8, 3, padding=1)
    how(block)
    return _Block(block)


def _identity_then_standardised(conv):
    parametrize.register_parametrization(conv, "weight", _Unchanged())
    parametrize.register_parametrization(conv, "weight", _WeightStandardisation())


_HOOK_SAID = r"at every forward, with a backward and tensors kept of its own, which the description has no op for"
#: Each parametrized layer: (the network holding it, what its refusal must say). Each was described as the plain
#: layer (the parametrization's kernels, their backward and tensors left out), weight_norm's gains not counted.
_PARAMETRIZED = {
    "weight_norm over dim 1": (lambda: _parametrized(lambda c: parametrizations.weight_norm(c, dim=1)),
                               r"probe: layer 'block' \(Conv2d\) has its weight parametrized by weight_norm "
                               r"\(torch.nn.utils.parametrizations.weight_norm; of dim 0 alone, on an nn.Conv2d, "
                               r"nn.Conv1d or nn.Linear called as the layer, it describes\): computed from its "
                               r"parameters " + _HOOK_SAID),
    "weight_norm of the whole weight": (lambda: _parametrized(lambda c: parametrizations.weight_norm(c, dim=None),
                                                              nn.Linear(8, 8)),
                                        r"probe: layer 'block' \(Linear\) has its weight parametrized by weight_norm"),
    "weight_norm of the bias": (lambda: _parametrized(lambda c: parametrizations.weight_norm(c, "bias")),
                                r"probe: layer 'block' \(Conv2d\) has its bias parametrized by weight_norm"),
    # the weight's weight_norm (dim 0) describes alone: the refusal names the bias's, what stops it (it named the
    # weight's, the form it says describes)
    "weight_norm of the weight and of the bias": (
        lambda: _parametrized(lambda c: parametrizations.weight_norm(parametrizations.weight_norm(c), "bias")),
        r"probe: layer 'block' \(Conv2d\) has its bias parametrized by weight_norm"),
    "old weight_norm of the weight and of the bias": (
        lambda: _parametrized(lambda c: torch.nn.utils.weight_norm(torch.nn.utils.weight_norm(c), "bias")),
        r"probe: layer 'block' \(Conv2d\) has its bias computed by torch.nn.utils.weight_norm's hook \(from bias_g"),
    "old weight_norm over dim 1": (lambda: _parametrized(lambda c: torch.nn.utils.weight_norm(c, dim=1)),
                                   r"probe: layer 'block' \(Conv2d\) has its weight computed by "
                                   r"torch.nn.utils.weight_norm's hook \(from weight_g and weight_v; of dim 0 alone, "
                                   r"on an nn.Conv2d, nn.Conv1d or nn.Linear called as the layer, it describes\) "
                                   + _HOOK_SAID),
    "old weight_norm, traced through": (lambda: _parametrized(torch.nn.utils.weight_norm, _HandWrittenConv()),
                                        r"probe: layer 'block' \(_HandWrittenConv\) has its weight computed by "
                                        r"torch.nn.utils.weight_norm's hook"),
    "spectral_norm over dim 1": (lambda: _parametrized(lambda c: parametrizations.spectral_norm(c, dim=1)),
                                 r"probe: layer 'block' \(Conv2d\) has its weight parametrized by spectral_norm "
                                 r"\(torch.nn.utils.parametrizations.spectral_norm, a power iteration at every "
                                 r"training step; of dim 0 alone, on an nn.Conv2d, nn.Conv1d or nn.Linear called as "
                                 r"the layer, it describes\)"),
    "old spectral_norm over dim 1": (lambda: _parametrized(lambda c: torch.nn.utils.spectral_norm(c, dim=1)),
                                     r"probe: layer 'block' \(Conv2d\) has its weight computed by "
                                     r"torch.nn.utils.spectral_norm's hook \(from weight_orig, a power iteration at "
                                     r"every training step; of dim 0 alone, on an nn.Conv2d, nn.Conv1d or nn.Linear "
                                     r"called as the layer, it describes\) " + _HOOK_SAID),
    "unstructured pruning's mask": (lambda: _parametrized(lambda c: prune.l1_unstructured(c, "weight", 0.3)),
                                    r"probe: layer 'block' \(Conv2d\) has its weight computed by torch.nn.utils."
                                    r"prune's hook \(weight_orig times the mask weight_mask; prune.remove\(layer, "
                                    r"'weight'\) makes it the plain layer\) " + _HOOK_SAID),
    "orthogonal": (lambda: _parametrized(parametrizations.orthogonal, nn.Linear(8, 8)),
                   r"probe: layer 'block' \(Linear\) has its weight parametrized by orthogonal "
                   r"\(torch.nn.utils.parametrizations.orthogonal\)"),
    "weight standardisation": (lambda: _parametrized(
        lambda c: parametrize.register_parametrization(c, "weight", _WeightStandardisation())),
        r"probe: layer 'block' \(Conv2d\) has its weight parametrized by _WeightStandardisation \(the model's own "
        r"parametrization: weight standardisation, ...\)"),
    "a weight read by the layer's parent": (lambda: (lambda m: (parametrizations.spectral_norm(m.inner[0]), m)[1])(
        _ReadsItsLayersWeight()), r"probe: layer 'inner.0' \(Conv2d\) has its weight parametrized by spectral_norm"),
    "the model's own weight": (lambda: parametrizations.weight_norm(_HandWrittenConv(3)),
                               r"probe: the model \(_HandWrittenConv\) has its weight parametrized by weight_norm"),
    "the identity, then weight standardisation": (lambda: _parametrized(_identity_then_standardised),
                                                  r"has its weight parametrized by _WeightStandardisation \(the "
                                                  r"model's own"),
}


@pytest.mark.filterwarnings("ignore::FutureWarning")  # torch.nn.utils.weight_norm, the older of the two
@pytest.mark.parametrize("case", list(_PARAMETRIZED))
def test_a_parametrized_weight_is_refused_naming_its_form(case):
    """A layer's weight computed by a parametrization or by torch's old reparametrising hooks was described as the
    plain layer (torch.fx keeps nn.Conv2d whole and sees neither): refused in one line that names the form."""
    make, match = _PARAMETRIZED[case]
    with pytest.raises(UserError, match=match) as refused:
        describe(make(), SHAPE, name="probe")
    assert "\n" not in str(refused.value)


def test_a_parametrization_that_is_the_identity_is_described_as_the_plain_layer():
    """A weight and a bias parametrized by the identity (torch runs the plain layer's kernels alone), and a layer
    pruned by torch.nn.utils.prune once the pruning is made permanent (prune.remove), describe as the plain layer."""
    torch.manual_seed(0)
    plain = _Block(nn.Conv2d(8, 8, 3, padding=1))
    parametrized = _Block(nn.Conv2d(8, 8, 3, padding=1))
    for tensor in ("weight", "bias"):
        parametrize.register_parametrization(parametrized.block, tensor, _Unchanged())
    assert parametrize.is_parametrized(parametrized.block)
    assert describe(parametrized, SHAPE, name="probe").to_dict() == describe(plain, SHAPE, name="probe").to_dict()
    pruned = _Block(nn.Conv2d(8, 8, 3, padding=1))  # unstructured pruning's mask made the weight's zeros: no hook
    prune.remove(prune.l1_unstructured(pruned.block, "weight", 0.3), "weight")
    assert describe(pruned, SHAPE, name="probe").to_dict() == describe(plain, SHAPE, name="probe").to_dict()


def _hooked(register, on_model=False, layer=None):
    """A :class:`_Block` of a 3x3 conv2d of 8 channels (or ``layer``) given to ``register``, or the model itself."""
    net = _Block(layer if layer is not None else nn.Conv2d(8, 8, 3, padding=1))
    register(net if on_model else net.block)
    return net


_VALUE_SAID = r"that returns a value, replacing "
#: Each hook that returns a value: (the network holding it, what its refusal must say). torch.fx drops a hook of a layer
#: it keeps whole, of the model, and every backward hook: each was described as if it were not there.
_VALUE_HOOKS = {
    "forward pre-hook": (lambda: _hooked(lambda m: m.register_forward_pre_hook(lambda mod, args: (args[0] * 2,))),
                         r"probe: layer 'block' \(Conv2d\) has a forward pre-hook \(.*<lambda>\) " + _VALUE_SAID +
                         r"the input: torch.fx drops the hook, so the description would leave out what it computes; "
                         r"write what it computes in a forward instead \(a hook that returns None, an observer, is "
                         r"described\)"),
    "forward hook": (lambda: _hooked(lambda m: m.register_forward_hook(lambda mod, args, out: out.sigmoid())),
                     r"probe: layer 'block' \(Conv2d\) has a forward hook \(.*<lambda>\) " + _VALUE_SAID +
                     "the output"),
    "forward pre-hook with kwargs": (lambda: _hooked(lambda m: m.register_forward_pre_hook(
        lambda mod, args, kwargs: ((args[0] * 2,), kwargs), with_kwargs=True)),
        r"layer 'block' \(Conv2d\) has a forward pre-hook \(.*<lambda>\) " + _VALUE_SAID + "the input"),
    "forward hook with kwargs": (lambda: _hooked(lambda m: m.register_forward_hook(
        lambda mod, args, kwargs, out: out * 2, with_kwargs=True)),
        r"layer 'block' \(Conv2d\) has a forward hook \(.*<lambda>\) " + _VALUE_SAID + "the output"),
    "the model's forward hook": (lambda: _hooked(lambda m: m.register_forward_hook(lambda mod, args, out: out * 2),
                                                 on_model=True),
                                 r"probe: the model \(_Block\) has a forward hook \(.*<lambda>\) " + _VALUE_SAID),
    "full backward hook": (lambda: _hooked(lambda m: m.register_full_backward_hook(
        lambda mod, grad_in, grad_out: (grad_in[0] * 0.5,))),
        r"probe: layer 'block' \(Conv2d\) has a backward hook \(.*<lambda>\) " + _VALUE_SAID + r"the input's gradient: "
        r"torch.fx drops the hook, so the description would leave out what it computes; the description has no op "
        r"for a gradient a hook changes"),
    "full backward pre-hook": (lambda: _hooked(lambda m: m.register_full_backward_pre_hook(
        lambda mod, grad_out: (grad_out[0].clamp(-1, 1),))),
        r"layer 'block' \(Conv2d\) has a backward pre-hook \(.*<lambda>\) " + _VALUE_SAID + "the output's gradient"),
    "backward hook of a module traced through": (lambda: _hooked(lambda m: m.register_full_backward_hook(
        lambda mod, grad_in, grad_out: (grad_in[0] * 0.5,)), layer=_HandWrittenConv()),
        r"probe: layer 'block' \(_HandWrittenConv\) has a backward hook \(.*<lambda>\) " + _VALUE_SAID),
}


@pytest.mark.filterwarnings("ignore:For backward hooks to be called")  # torch's, as fx traces a hooked module
@pytest.mark.parametrize("case", list(_VALUE_HOOKS))
def test_a_hook_that_returns_a_value_is_refused_naming_the_layer_and_the_hook(case):
    """A hook that replaces a value where torch.fx drops it (a layer kept whole, the model, any backward hook) was
    described as if it were not there (a plain conv2d): refused in one line naming the layer and the hook's kind."""
    make, match = _VALUE_HOOKS[case]
    with pytest.raises(UserError, match=match) as refused:
        describe(make(), SHAPE, name="probe")
    assert "\n" not in str(refused.value)


def test_a_global_forward_hook_that_returns_a_value_is_refused():
    """A hook every module runs (``register_module_forward_hook``) that returns a value is refused at the first layer
    kept whole; one that returns None describes as the plain network."""
    from torch.nn.modules.module import register_module_forward_hook
    torch.manual_seed(0)
    net = _Block(nn.Conv2d(8, 8, 3, padding=1))
    plain = describe(net, SHAPE, name="probe").to_dict()
    handle = register_module_forward_hook(lambda mod, args, out: out.relu())
    try:
        with pytest.raises(UserError, match=r"probe: layer 'conv' \(Conv2d\) has a forward hook \(.*<lambda>\) "
                                            r"that returns a value"):
            describe(net, SHAPE, name="probe")
    finally:
        handle.remove()
    seen = []
    handle = register_module_forward_hook(lambda mod, args, out: seen.append(type(mod).__name__))
    try:
        assert describe(net, SHAPE, name="probe").to_dict() == plain
    finally:
        handle.remove()
    assert "Conv2d" in seen  # the observer was called (on empty tensors) and returned None


def test_a_global_backward_hook_that_returns_a_value_is_refused():
    """A backward hook every module runs (``register_module_full_backward_hook``) that scales the gradient is refused
    at the first layer; one that returns the gradients as they came describes as the plain network."""
    from torch.nn.modules.module import register_module_full_backward_hook
    torch.manual_seed(0)
    net = _Block(nn.Conv2d(8, 8, 3, padding=1))
    plain = describe(net, SHAPE, name="probe").to_dict()
    handle = register_module_full_backward_hook(lambda mod, grad_in, grad_out: tuple(g * 0.5 for g in grad_in))
    try:
        with pytest.raises(UserError, match=r"probe: layer 'conv' \(Conv2d\) has a backward hook \(.*<lambda>\) "
                                            r"that returns a value, replacing the input's gradient"):
            describe(net, SHAPE, name="probe")
    finally:
        handle.remove()
    handle = register_module_full_backward_hook(lambda mod, grad_in, grad_out: grad_in)
    try:
        assert describe(net, SHAPE, name="probe").to_dict() == plain
    finally:
        handle.remove()


def test_hooks_that_return_none_describe_as_the_plain_network_and_a_traced_through_hook_as_its_ops():
    """Observers (logging, a feature kept: every kind, on a layer kept whole and on the model), and hooks that return
    the very tensors they were given, describe as the plain network; a forward hook and pre-hook of a module torch.fx
    traces through run in the trace, their ops described."""
    torch.manual_seed(0)
    plain = describe(_Block(nn.Conv2d(8, 8, 3, padding=1)), SHAPE, name="probe").to_dict()
    kept = {}
    net = _Block(nn.Conv2d(8, 8, 3, padding=1))
    for m in (net, net.block):
        m.register_forward_pre_hook(lambda mod, args: None)
        m.register_forward_pre_hook(lambda mod, args, kwargs: None, with_kwargs=True)
        m.register_forward_hook(lambda mod, args, out: kept.update(features=out))
        m.register_forward_hook(lambda mod, args, kwargs, out: None, with_kwargs=True)
        m.register_full_backward_hook(lambda mod, grad_in, grad_out: None)
        m.register_full_backward_pre_hook(lambda mod, grad_out: None)
    assert describe(net, SHAPE, name="probe").to_dict() == plain
    given_back = _Block(nn.Conv2d(8, 8, 3, padding=1))  # each hook returns the very tensors it was given
    for m in (given_back, given_back.block):
        m.register_forward_pre_hook(lambda mod, args: args[0])
        m.register_forward_pre_hook(lambda mod, args, kwargs: (args, kwargs), with_kwargs=True)
        m.register_forward_hook(lambda mod, args, out: out)
        m.register_full_backward_hook(lambda mod, grad_in, grad_out: grad_in)
        m.register_full_backward_pre_hook(lambda mod, grad_out: grad_out)
    assert describe(given_back, SHAPE, name="probe").to_dict() == plain
    logged = _Block(nn.Conv2d(8, 8, 3, padding=1))  # reads the values (fails on meta tensors), returns None
    logged.block.register_forward_hook(lambda mod, args, out: kept.update(mean=out.mean().item()))
    assert describe(logged, SHAPE, name="probe").to_dict() == plain
    clipped = _Block(nn.Conv2d(8, 8, 3, padding=1))  # reads the values, and returns a value where they are large
    clipped.block.register_forward_hook(lambda mod, args, out: out.clamp(-1, 1) if out.abs().max().item() > 1 else None)
    with pytest.raises(UserError, match=r"layer 'block' \(Conv2d\) has a forward hook \(.*<lambda>\) that returns a"):
        describe(clipped, SHAPE, name="probe")
    traced = _Block(_HandWrittenConv())
    traced.block.register_forward_hook(lambda mod, args, out: out.sigmoid())
    traced.block.register_forward_pre_hook(lambda mod, args: (args[0] * 2,))
    ops = [n["op"] for n in describe(traced, SHAPE, name="probe").to_dict()["nodes"]]
    assert ops == ["input", "conv2d", "mul", "conv2d", "sigmoid", "flatten", "linear"]


def test_a_hook_that_fails_on_the_layers_shapes_is_refused_as_untold():
    """A hook that fails on empty tensors, zeros and random numbers of the layer's shapes (a check that the output is
    the layer's of its input, which the forward passes) cannot be told to be an observer."""
    def fails(mod, args, out):
        if not torch.allclose(mod._conv_forward(args[0], mod.weight, mod.bias), out):
            raise RuntimeError("a hook of its own")
    net = _hooked(lambda m: m.register_forward_hook(fails))
    with pytest.raises(UserError, match=r"probe: layer 'block' \(Conv2d\) has a forward hook \(.*fails\) that "
                                        r"cannot be told .* \(RuntimeError: a hook of its own\)"):
        describe(net, SHAPE, name="probe")


#: Each spelling of weight standardisation: (the layer, its conv2d's standardisation attrs).
_STANDARDISED = {
    "timm's F.batch_norm": (lambda: _StandardisedByBatchNorm(8, 8, 3, padding=1),
                            {"standardize": "batch_norm", "standardize_eps": 1e-6}),
    "NFNets' scaled, with a gain": (lambda: _ScaledStandardised(8, 8, 3, padding=1, groups=2),
                                    {"standardize": "batch_norm", "standardize_eps": 1e-6,
                                     "standardize_scale": 1.7 * 36 ** -0.5}),
    "NFNets' scaled, timm's older": (lambda: _ScaledByStdMean(8, 8, 3, padding=1),
                                     {"standardize": "std_mean", "standardize_eps": 1e-6, "standardize_unbiased": False,
                                      "standardize_scale": 1.7 * 72 ** -0.5}),
    "NFNets' scaled, by layer_norm": (lambda: _ScaledByLayerNorm(8, 8, 3, padding=1),
                                      {"standardize": "layer_norm", "standardize_eps": 1e-12,
                                       "standardize_scale": 1.7 * 72 ** -0.5}),
    "F.layer_norm": (lambda: _StandardisedByLayerNorm(8, 8, 3, padding=1, groups=2),
                     {"standardize": "layer_norm", "standardize_eps": 1e-5}),
    "the std": (lambda: _StandardisedByStd(8, 8, 3, padding=1, groups=2),
                {"standardize": "std", "standardize_eps": 1e-5, "standardize_unbiased": True}),
    "the variance's square root": (lambda: _StandardisedConv(8, 8, 3, padding=1),
                                   {"standardize": "var", "standardize_eps": 1e-5, "standardize_unbiased": False}),
    "BiT's torch.var_mean": (lambda: _StandardisedByVarMean(8, 8, 3, padding=1, bias=False),
                             {"standardize": "var_mean", "standardize_eps": 1e-10, "standardize_unbiased": False}),
    "timm's older torch.std_mean": (lambda: _StandardisedByStdMean(8, 8, 3, padding=1, groups=4),
                                    {"standardize": "std_mean", "standardize_eps": 1e-5,
                                     "standardize_unbiased": False}),
    "mmcv's rows": (lambda: _StandardisedByRows(8, 8, 3, padding=1),
                    {"standardize": "std_rows", "standardize_eps": 1e-5, "standardize_unbiased": True}),
}


@pytest.mark.parametrize("case", list(_STANDARDISED))
def test_weight_standardisation_is_a_conv2d_of_standardize(case):
    """A convolution whose weight is its parameter standardised per output channel at every forward (BiT's and
    timm's StdConv2d) was refused ("weight is computed in the forward from the parameter"): it is a conv2d of the attr
    standardize, rebuilt as written. The rebuilt module computes the original's output and gradients, runs its kernels
    and describes again as it; the kernels the features add to a plain conv's are those torch adds (a dispatch log;
    an empty placeholder aside); what autograd keeps per sample and once a step is the features'; the allocation model
    writes every spelling down as the meta trace (batches 3 and 1; it had left all but timm's to the trace); a
    PerfSeer graph keeps the attrs."""
    from test_allocator import _as_replayed
    from test_features import _autograd_saved_bytes
    from test_ir_research_calls import _kernels_run

    from perf4sight.exporters.perfseer import description_to_graph
    from perf4sight.features.aggregate import network_features
    from perf4sight.features.alloc_trace import record_events
    from perf4sight.features.walk import walk
    from perf4sight.importers.perfseer import graph_to_description
    from perf4sight.ir.to_torch import StandardizedConv2d, build_module

    make, attrs = _STANDARDISED[case]
    module = _Block(make())
    desc = _computes_the_same(module)
    conv = desc.nodes[2]
    assert conv.op == "conv2d" and {k: v for k, v in conv.attrs.items() if k.startswith("standardize")} == attrs
    rebuilt = build_module(desc)
    assert isinstance(getattr(rebuilt, conv.name), StandardizedConv2d)
    assert describe(rebuilt, SHAPE, name="probe").to_dict() == desc.to_dict()
    ran = _kernels_run(module)
    assert ran == _kernels_run(rebuilt)
    plain = _Block(nn.Conv2d(8, 8, 3, padding=1, groups=conv.attrs["groups"], bias=conv.attrs["bias"]))
    plain_desc = describe(plain, SHAPE, name="probe")
    added = sum(ran.values()) - ran.get("empty", 0) - sum(_kernels_run(plain).values())
    assert added == sum(v.cost.kernels_fwd + v.cost.kernels_bwd for v in walk(desc)) - sum(
        v.cost.kernels_fwd + v.cost.kernels_bwd for v in walk(plain_desc)) > 0
    at2, at4 = (b * _autograd_saved_bytes(desc, b, with_input=False) for b in (2, 4))
    features = network_features(desc)
    assert features.per_sample["saved_bytes"] == network_features(plain_desc).per_sample["saved_bytes"] == \
        (at4 - at2) / 2
    assert features.batch_saved_sizes.sum() == at2 - 2 * (at4 - at2) / 2 > 8 * 8 * 9 * 4 / conv.attrs["groups"]
    for batch in (3, 1):
        assert _as_replayed(record_events(desc, batch, steps=2, method="model")) == _as_replayed(
            record_events(desc, batch, steps=2, method="trace"))
    back, _ = graph_to_description(description_to_graph(desc, 4), "probe", "probe.pkl")
    assert back.to_dict() == desc.to_dict()


class _StandardisedThrough(nn.Module):
    """A standardised first layer (with a bias, reading the input, which needs no gradient), then a depthwise one
    without a bias called twice (its later call shares the first's parameter, standardised again), a depthwise 1 x 1
    one (its weight [8, 1, 1, 1], of its statistics' shape: nothing broadcast), a classifier."""

    def __init__(self, form: str) -> None:
        from perf4sight.ir.to_torch import StandardizedConv2d
        super().__init__()
        self.stem = StandardizedConv2d(3, 8, [3, 3], [1, 1], [1, 1], [1, 1], 1, True, form, eps=1e-6)
        self.depthwise = StandardizedConv2d(8, 8, [3, 3], [1, 1], [1, 1], [1, 1], 8, False, form, unbiased=False)
        self.point = StandardizedConv2d(8, 8, [1, 1], [1, 1], [0, 0], [1, 1], 8, False, form)
        self.fc = nn.Linear(8 * 8 * 8, 10)

    def forward(self, x):
        return self.fc(self.point(self.depthwise(self.depthwise(self.stem(x).relu()))).flatten(1))


@pytest.mark.parametrize("form", ["std", "var", "var_mean", "std_rows", "std_mean", "layer_norm"])
def test_the_moments_spellings_are_written_down_as_the_trace_records_them(form):
    """The moments' spellings of weight standardisation went to the meta trace (0.28 s for resnet18's step, against
    0.002 s written down): the allocation model writes each down, every op of it an autograd node as torch makes it
    (the parameter's gradients from the subtraction, the statistics and mmcv's view summed out of place; the division's
    temporaries; a std's backward freeing its product before the rest; torch.var_mean's two outputs gathered by one
    node). Its events are the trace's at batches 1 and 3, under SGD and Adam, for a first layer, a depthwise layer
    without a bias, a layer called twice and a 1 x 1 depthwise one (whose statistics' gradients are not summed down)."""
    from test_allocator import _as_replayed

    from perf4sight.features.alloc_trace import record_events

    desc = describe(_StandardisedThrough(form), SHAPE, name="probe")
    convs = [n for n in desc.nodes if n.op == "conv2d"]
    assert [n.attrs["standardize"] for n in convs] == [form] * 4 and convs[2].attrs["shares"] == convs[1].name
    assert convs[3].attrs["kernel_size"] == [1, 1] and convs[3].attrs["groups"] == 8
    assert convs[0].inputs == [desc.nodes[0].name] and convs[1].attrs["groups"] == 8 and not convs[1].attrs["bias"]
    for optimizer in ("sgd", "adam"):
        for batch in (1, 3):
            assert _as_replayed(record_events(desc, batch, steps=2, method="model", optimizer=optimizer)) == \
                _as_replayed(record_events(desc, batch, steps=2, method="trace", optimizer=optimizer))


def test_standardize_attrs_are_checked():
    """A conv2d's standardisation of no known spelling, its eps or flag without it, the flag on a batch norm's, or
    on a fixed filter, are refused on reading, naming the attr."""
    from perf4sight.ir.schema import NetworkDescription

    data = describe(_Block(_StandardisedByBatchNorm(8, 8, 3, padding=1, bias=False)), SHAPE, name="probe").to_dict()
    NetworkDescription.from_dict(data)
    for change, said in (({"standardize": "rms"}, "attr 'standardize' must be one of batch_norm, std, var, var_mean, "
                                                  "std_rows, std_mean"),
                         ({"standardize_unbiased": True}, "attr 'standardize_unbiased' is not for standardize "
                                                          "'batch_norm'"),
                         ({"standardize": None}, "attr 'standardize_eps' is for a conv2d of 'standardize'"),
                         ({"fixed": True}, "a fixed conv2d .* has no weight to standardize"),
                         ({"standardize_eps": -1.0}, "attr 'standardize_eps' must be a number >= 0")):
        changed = {**data, "nodes": [dict(n) for n in data["nodes"]]}
        node = changed["nodes"][2]
        node["attrs"] = {k: v for k, v in {**node["attrs"], **change}.items() if v is not None}
        with pytest.raises(UserError, match=said):
            NetworkDescription.from_dict(changed)
    data = describe(_Block(_ScaledStandardised(8, 8, 3, padding=1)), SHAPE, name="probe").to_dict()
    NetworkDescription.from_dict(data)
    for change, said in (({"standardize": "var"}, "attr 'standardize_scale' is for standardize 'batch_norm', "
                                                  "'std_mean' or 'layer_norm'"),
                         ({"standardize": None, "standardize_eps": None}, "attr 'standardize_scale' is for a conv2d "
                                                                          "of 'standardize'"),
                         ({"standardize_scale": "1.0"}, "attr 'standardize_scale' must be a number")):
        changed = {**data, "nodes": [dict(n) for n in data["nodes"]]}
        node = changed["nodes"][2]
        node["attrs"] = {k: v for k, v in {**node["attrs"], **change}.items() if v is not None}
        with pytest.raises(UserError, match=said):
            NetworkDescription.from_dict(changed)


class _TwiceScaled(nn.Module):
    """A depthwise scaled standardised convolution without a bias called twice, then a plain-shaped one."""

    def __init__(self, make) -> None:
        super().__init__()
        self.a, self.b = make(8, 8, 3, padding=1, groups=8, bias=False), make(8, 8, 3, padding=1)

    def forward(self, x):
        return self.b(self.a(self.a(x)).relu())


@pytest.mark.parametrize("make", [_ScaledStandardised, _ScaledByStdMean, _ScaledByLayerNorm])
def test_scaled_standardisations_are_written_down_as_the_trace_records_them(make):
    """ScaledStdConv2d's gain (timm's and its older spelling) in a depthwise layer called twice (its gain shared) and
    a plain-shaped one: the allocation model's events are the meta trace's at batches 1 and 3, under SGD and Adam
    (the older spelling's centred weight times the scale a temporary; the gain's product keeping the standardised
    weight, its backward the weight's gradient and the gain's, summed down)."""
    from test_allocator import _as_replayed

    from perf4sight.features.alloc_trace import record_events

    desc = describe(_Block(_TwiceScaled(make)), SHAPE, name="probe")
    assert [("standardize_scale" in n.attrs, n.attrs.get("shares")) for n in desc.nodes if n.op == "conv2d"] == [
        (False, None), (True, None), (True, "conv2d"), (True, None)]
    for optimizer in ("sgd", "adam"):
        for batch in (1, 3):
            assert _as_replayed(record_events(desc, batch, steps=2, method="model", optimizer=optimizer)) == \
                _as_replayed(record_events(desc, batch, steps=2, method="trace", optimizer=optimizer))


@pytest.mark.parametrize("frozen", ["weight", "gain"])
def test_a_standardised_convolutions_frozen_parameter_is_rebuilt_frozen(frozen):
    """A standardised convolution's frozen weight (its bias trained), or ScaledStdConv2d's frozen gain, is named in
    the description's frozen parameters and rebuilt frozen: the rebuilt module runs the original's kernels (no
    gradient of it). Both were counted frozen but rebuilt trained (the parameter was read through the
    standardisation, which the frozen parameters' roles did not follow)."""
    from test_ir_research_calls import _kernels_run

    from perf4sight.ir.to_torch import build_module

    module = _Block(_ScaledStandardised(8, 8, 3, padding=1))
    getattr(module.block, frozen).requires_grad_(False)
    desc = describe(module, SHAPE, name="probe")
    assert desc.extra["frozen_parameters"] == [f"conv2d.{frozen}"]
    rebuilt = build_module(desc)
    assert [n for n, p in rebuilt.named_parameters() if not p.requires_grad] == [f"conv2d.{frozen}"]
    assert _kernels_run(module) == _kernels_run(rebuilt)


@pytest.mark.parametrize("make", [_ScaledStandardised, _ScaledByStdMean])
def test_a_network_of_scaled_standardised_convolutions_prunes_and_trains(make):
    """NFNets' ScaledStdConv2d's gain, one an output channel, is cut with its layer's output channels (torch-pruning
    counts it the layer's and left it whole: every group through such a layer was left out, and 30% was out of
    reach), at 30 and 60%; the fixed scale stays the unpruned layer's, as the cut module computes it; a training step
    of each pruned network runs."""
    from test_networks import _train_step

    from perf4sight.networks.build import Source, prune_source

    class Net(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.stem, self.conv = nn.Conv2d(3, 8, 3, padding=1), make(8, 16, 3, padding=1)
            self.conv2, self.fc = make(16, 16, 3, padding=1), nn.Linear(16, 10)

        def forward(self, x):
            return self.fc(self.conv2(self.conv(self.stem(x).relu()).relu()).mean((2, 3)))
    scales = [None, 1.7 * 72 ** -0.5, 1.7 * 144 ** -0.5]
    for desc, widths in zip(prune_source(Source("net", "test", Net), SHAPE, [30, 60], "l1-norm", 2, seed=0),
                            ([7, 13, 13], [5, 9, 10])):
        assert [(n.attrs["out_channels"], n.attrs.get("standardize_scale")) for n in desc.nodes
                if n.op == "conv2d"] == list(zip(widths, scales))
        _train_step(desc)


def test_a_network_of_standardised_convolutions_prunes_and_trains():
    """torch-pruning cuts a standardised convolution's channels as a plain one's (its parameter is the layer's
    weight), and a training step of the pruned network runs."""
    from test_networks import _train_step

    from perf4sight.networks.build import Source, prune_source

    class Net(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.stem, self.conv = nn.Conv2d(3, 8, 3, padding=1), _StandardisedByBatchNorm(8, 16, 3, padding=1)
            self.conv2, self.fc = _StandardisedConv(16, 16, 3, padding=1), nn.Linear(16 * 8 * 8, 10)

        def forward(self, x):
            return self.fc(self.conv2(self.conv(self.stem(x).relu()).relu()).flatten(1))
    (desc,) = prune_source(Source("net", "test", Net), SHAPE, [30], "l1-norm", 2, seed=0)
    assert [(n.attrs["out_channels"], n.attrs.get("standardize")) for n in desc.nodes if n.op == "conv2d"] == [
        (6, None), (12, "batch_norm"), (12, "var")]
    _train_step(desc)


class _CoordConvOnTheDevice(nn.Module):
    """CoordConv as often written: the coordinates made on the map's device, 0 to 1 along the columns first."""

    def __init__(self, channels: int = 8) -> None:
        super().__init__()
        self.conv = nn.Conv2d(channels + 2, channels, 1)

    def forward(self, x):
        n, h, w = x.size(0), x.size(2), x.size(3)
        cols = torch.linspace(0, 1, steps=w, device=x.device).reshape(1, 1, 1, w).expand(n, 1, h, w)
        rows = torch.linspace(0, 1, steps=h, device=x.device).reshape(1, 1, h, 1).expand(n, -1, -1, w)
        return self.conv(torch.cat([cols, x, rows], 1))


@pytest.mark.parametrize("make", [_CoordConv, _CoordConvOnTheDevice])
def test_coordconv_channels_are_the_op_linspace(make):
    """CoordConv's coordinate channels (torch.linspace viewed and expanded over the batch and the map) were refused
    ("call_function 'linspace' has no description op"): each is the op linspace of the map whose sizes it reads
    (start, end, dim), rebuilt as torch.linspace. The rebuilt module computes the original's output and gradients,
    runs its kernels and describes again as it; a linspace costs one kernel forward and none back, passes no gradient
    to its map, keeps nothing (autograd's saved bytes per sample are the features'); the allocation model writes it
    down as the meta trace (batches 3 and 1); a PerfSeer graph keeps it."""
    from test_allocator import _as_replayed
    from test_features import _autograd_saved_bytes
    from test_ir_research_calls import _kernels_run

    from perf4sight.exporters.perfseer import description_to_graph
    from perf4sight.features.aggregate import network_features
    from perf4sight.features.alloc_trace import record_events
    from perf4sight.features.walk import walk
    from perf4sight.importers.perfseer import graph_to_description
    from perf4sight.ir.to_torch import build_module

    module = _Block(make())
    desc = _computes_the_same(module)
    lines = [n for n in desc.nodes if n.op == "linspace"]
    ends = (-1.0, 1.0) if make is _CoordConv else (0.0, 1.0)
    dims = [2, 3] if make is _CoordConv else [3, 2]
    assert [(n.inputs, n.attrs, n.output_shape) for n in lines] == [
        (["conv"], {"start": ends[0], "end": ends[1], "dim": d}, [1, 8, 8]) for d in dims]
    rebuilt = build_module(desc)
    assert describe(rebuilt, SHAPE, name="probe").to_dict() == desc.to_dict()
    ran = _kernels_run(module)
    assert ran == _kernels_run(rebuilt) and ran["linspace"] == 2
    visits = {v.node.name: v for v in walk(desc)}
    assert [(visits[n.name].cost.kernels_fwd, visits[n.name].cost.kernels_bwd, visits[n.name].needs_grad)
            for n in lines] == [(1, 0, False)] * 2
    at2, at4 = (b * _autograd_saved_bytes(desc, b, with_input=False) for b in (2, 4))
    assert network_features(desc).per_sample["saved_bytes"] == (at4 - at2) / 2
    for batch in (3, 1):
        assert _as_replayed(record_events(desc, batch, steps=2, method="model")) == _as_replayed(
            record_events(desc, batch, steps=2, method="trace"))
    back, _ = graph_to_description(description_to_graph(desc, 4), "probe", "probe.pkl")
    assert back.to_dict() == desc.to_dict()


class _GridCoordConv(nn.Module):
    """CoordConv as SOLO's mask head writes it: torch.meshgrid of a linspace over the rows and one over the columns,
    each grid expanded over the batch, the two concatenated, then to the map."""

    def __init__(self, channels: int = 8) -> None:
        super().__init__()
        self.conv = nn.Conv2d(channels + 2, channels, 3, padding=1)

    def forward(self, feat):
        x_range = torch.linspace(-1, 1, feat.shape[-1], device=feat.device)
        y_range = torch.linspace(-1, 1, feat.shape[-2], device=feat.device)
        y, x = torch.meshgrid(y_range, x_range, indexing="ij")
        coord = torch.cat([x.expand([feat.shape[0], 1, -1, -1]), y.expand([feat.shape[0], 1, -1, -1])], 1)
        return self.conv(torch.cat([feat, coord], 1))


class _GridCoordConvXY(_GridCoordConv):
    """The grids by indexing "xy" (the columns' linspace first), 0 to 1, leading dims added by [None, None] and by
    unsqueeze, concatenated to the map one by one."""

    def forward(self, f):
        b, _, h, w = f.shape
        cols, rows = torch.meshgrid(torch.linspace(0, 1, w), torch.linspace(0, 1, h), indexing="xy")
        return self.conv(torch.cat([f, cols[None, None].expand(b, -1, -1, -1),
                                    rows.unsqueeze(0).unsqueeze(0).expand(b, 1, h, w)], 1))


class _OneGridTwice(_GridCoordConv):
    """One grid of a meshgrid expanded twice, the other unread: no coordinate channels (refused)."""

    def forward(self, f):
        b, _, h, w = f.shape
        rows, _ = torch.meshgrid(torch.linspace(-1, 1, h), torch.linspace(-1, 1, w), indexing="ij")
        return self.conv(torch.cat([f, rows.expand(b, 1, h, w), rows.expand(b, 1, h, w)], 1))


@pytest.mark.parametrize("make", [_GridCoordConv, _GridCoordConvXY])
def test_coordconv_channels_by_a_meshgrid_of_linspaces_are_the_op_linspace(make):
    """A meshgrid's grids of two linspaces (views of them) expanded over the batch were refused ("call_function
    'linspace' has no description op"): each is the op linspace along the side its linspace spans. The rebuilt module
    computes the original's output and gradients, runs its kernels (2 linspaces) and describes again as it; the
    allocation model writes it down as the meta trace. One grid read twice and the other not stays refused."""
    from test_allocator import _as_replayed
    from test_ir_research_calls import _kernels_run

    from perf4sight.features.alloc_trace import record_events
    from perf4sight.ir.to_torch import build_module

    module = _Block(make())
    desc = _computes_the_same(module)
    start = -1.0 if make is _GridCoordConv else 0.0
    assert [(n.inputs, n.attrs, n.output_shape) for n in desc.nodes if n.op == "linspace"] == [
        (["conv"], {"start": start, "end": 1.0, "dim": d}, [1, 8, 8]) for d in (3, 2)]  # the columns' first
    rebuilt = build_module(desc)
    assert describe(rebuilt, SHAPE, name="probe").to_dict() == desc.to_dict()
    ran = _kernels_run(module)
    assert ran == _kernels_run(rebuilt) and ran["linspace"] == 2
    for batch in (3, 1):
        assert _as_replayed(record_events(desc, batch, steps=2, method="model")) == _as_replayed(
            record_events(desc, batch, steps=2, method="trace"))
    with pytest.raises(UserError, match=r"call_function 'linspace' \(node linspace: values made in the forward"):
        describe(_Block(_OneGridTwice()), SHAPE, name="probe")


class _GridOfAranges(_GridCoordConv):
    """The grids of a meshgrid of two aranges, each scaled (the rows' to -1..1, the columns' to 0..1) and expanded
    over the batch."""

    def forward(self, x):
        b, _, h, w = x.shape
        rows, cols = torch.meshgrid(torch.arange(h, device=x.device), torch.arange(w, device=x.device), indexing="ij")
        rows = rows.float() / (h - 1) * 2 - 1
        cols = cols.float() / (w - 1)
        return self.conv(torch.cat([x, rows.expand(b, 1, h, w), cols[None, None].expand(b, -1, -1, -1)], 1))


def test_coordconv_channels_by_a_meshgrid_of_aranges_are_a_linspace_made_arange_grid():
    """A meshgrid's grids of two aranges, scaled and expanded over the batch, were refused ("call_function 'arange'
    has no description op"): each is the op linspace of made arange_grid, rebuilt as the arange spread over the map
    (views), cast, divided (and doubled less 1): the original's outputs and gradients, its kernels (5 from -1, 3 from
    0, none back, no gradient), nothing kept, the allocation model's events the meta trace's (batches 3 and 1)."""
    from test_allocator import _as_replayed
    from test_features import _autograd_saved_bytes
    from test_ir_research_calls import _kernels_run

    from perf4sight.features.aggregate import network_features
    from perf4sight.features.alloc_trace import record_events
    from perf4sight.features.walk import walk
    from perf4sight.ir.to_torch import build_module

    module = _Block(_GridOfAranges())
    desc = _computes_the_same(module)
    lines = [n for n in desc.nodes if n.op == "linspace"]
    assert [(n.inputs, n.attrs) for n in lines] == [
        (["conv"], {"start": s, "end": 1.0, "dim": d, "made": "arange_grid"}) for s, d in ((-1.0, 2), (0.0, 3))]
    rebuilt = build_module(desc)
    assert [(n.op, n.attrs) for n in describe(rebuilt, SHAPE, name="probe").nodes] == [(n.op, n.attrs)
                                                                                       for n in desc.nodes]
    ran = _kernels_run(module)
    assert ran == _kernels_run(rebuilt) and ran["arange"] == 2 and ran["_to_copy"] == 2
    visits = {v.node.name: v for v in walk(desc)}
    assert [(visits[n.name].cost.kernels_fwd, visits[n.name].cost.kernels_bwd, visits[n.name].needs_grad)
            for n in lines] == [(5, 0, False), (3, 0, False)]
    at2, at4 = (b * _autograd_saved_bytes(desc, b, with_input=False) for b in (2, 4))
    assert network_features(desc).per_sample["saved_bytes"] == (at4 - at2) / 2
    for batch in (3, 1):
        assert _as_replayed(record_events(desc, batch, steps=2, method="model")) == _as_replayed(
            record_events(desc, batch, steps=2, method="trace"))


class _AddCoords(nn.Module):
    """CoordConv as its common PyTorch port writes it (an AddCoords layer): each coordinate an arange over its side,
    copied over the other, scaled to -1..1 and copied over the batch; made on the CPU, cast to the map's type."""

    def __init__(self, channels: int = 8) -> None:
        super().__init__()
        self.conv = nn.Conv2d(channels + 2, channels, 3, padding=1)

    def forward(self, x):
        batch, _, rows, cols = x.size()
        down = torch.arange(rows).repeat(1, cols, 1)
        across = torch.arange(cols).repeat(1, rows, 1).transpose(1, 2)
        down = down.float() / (rows - 1) * 2 - 1
        across = across.float() / (cols - 1) * 2 - 1
        down = down.repeat(batch, 1, 1, 1).transpose(2, 3)
        across = across.repeat(batch, 1, 1, 1).transpose(2, 3)
        return self.conv(torch.cat([x, down.type_as(x), across.type_as(x)], 1))


class _AddCoordsOnTheDevice(_AddCoords):
    """The port made on the map's device, 0 to 1, the columns' channel first (no cast)."""

    def forward(self, x):
        n, _, h, w = x.shape
        across = torch.arange(w, device=x.device).repeat(1, h, 1).transpose(1, 2).float() / (w - 1)
        down = torch.arange(h, device=x.device).repeat(1, w, 1).float() / (h - 1)
        return self.conv(torch.cat([across.repeat(n, 1, 1, 1).transpose(2, 3), x,
                                    down.repeat(n, 1, 1, 1).transpose(2, 3)], 1))


@pytest.mark.parametrize("make", [_AddCoords, _AddCoordsOnTheDevice])
def test_coordconv_channels_by_arange_are_a_linspace_made_by_arange(make):
    """CoordConv's channels as its PyTorch port writes them (torch.arange copied over the map, scaled, copied over
    the batch by repeat) were refused ("call_function 'arange' has no description op"): each is the op linspace of
    made arange, rebuilt as written on the map's device. The rebuilt module computes the original's output and
    gradients and runs its kernels (7 a channel from -1, 5 from 0; none back; no gradient to the map); nothing is
    kept (autograd's saved bytes per sample are the features'); the allocation model writes it down as the meta
    trace (batches 3 and 1: its temporaries once a step, its copy a sample); a PerfSeer graph keeps it."""
    from test_allocator import _as_replayed
    from test_features import _autograd_saved_bytes
    from test_ir_research_calls import _kernels_run

    from perf4sight.exporters.perfseer import description_to_graph
    from perf4sight.features.aggregate import network_features
    from perf4sight.features.alloc_trace import record_events
    from perf4sight.features.walk import walk
    from perf4sight.importers.perfseer import graph_to_description
    from perf4sight.ir.to_torch import build_module

    module = _Block(make())
    desc = _computes_the_same(module)
    lines = [n for n in desc.nodes if n.op == "linspace"]
    start, dims = (-1.0, [2, 3]) if make is _AddCoords else (0.0, [3, 2])
    assert [(n.inputs, n.attrs, n.output_shape) for n in lines] == [
        (["conv"], {"start": start, "end": 1.0, "dim": d, "made": "arange"}, [1, 8, 8]) for d in dims]
    rebuilt = build_module(desc)
    again = describe(rebuilt, SHAPE, name="probe")  # (the port's type_as names its nodes: the rebuilt's transpose)
    assert [(n.op, n.attrs, n.output_shape) for n in again.nodes] == [(n.op, n.attrs, n.output_shape)
                                                                     for n in desc.nodes]
    ran = _kernels_run(module)
    assert ran == _kernels_run(rebuilt) and ran["arange"] == 2 and ran["repeat"] == 4
    visits = {v.node.name: v for v in walk(desc)}
    kernels = 7 if start == -1 else 5
    assert [(visits[n.name].cost.kernels_fwd, visits[n.name].cost.kernels_bwd, visits[n.name].needs_grad)
            for n in lines] == [(kernels, 0, False)] * 2
    assert sum(ran.get(k, 0) for k in ("arange", "repeat", "_to_copy", "div", "mul", "sub")) == 2 * kernels
    at2, at4 = (b * _autograd_saved_bytes(desc, b, with_input=False) for b in (2, 4))
    assert network_features(desc).per_sample["saved_bytes"] == (at4 - at2) / 2
    for batch in (3, 1):
        assert _as_replayed(record_events(desc, batch, steps=2, method="model")) == _as_replayed(
            record_events(desc, batch, steps=2, method="trace"))
    back, _ = graph_to_description(description_to_graph(desc, 4), "probe", "probe.pkl")
    assert back.to_dict() == desc.to_dict()


def test_a_linspace_of_another_dim_is_refused_on_reading():
    """A linspace along the channels (dim 1) or of a map that is no [C, H, W] is refused when the description is
    read."""
    from perf4sight.ir.schema import NetworkDescription

    data = describe(_Block(_CoordConv()), SHAPE, name="probe").to_dict()
    NetworkDescription.from_dict(data)
    next(n for n in data["nodes"] if n["op"] == "linspace")["attrs"]["dim"] = 1
    with pytest.raises(UserError, match=r"dim 1 must be 2 or 3 \(the rows or the columns\) of a \[C, H, W\] map"):
        NetworkDescription.from_dict(data)
    data = describe(_Block(_AddCoords()), SHAPE, name="probe").to_dict()
    NetworkDescription.from_dict(data)
    for change, said in (({"made": "meshgrid"}, "attr 'made' must be one of arange, arange_grid, got 'meshgrid'"),
                         ({"start": 0.5}, r"a linspace made by arange runs from -1 or 0 to 1 \(i / \(n - 1\), times 2 "
                                          r"less 1\), got 0.5 to 1.0")):
        changed = {**data, "nodes": [dict(n) for n in data["nodes"]]}
        node = next(n for n in changed["nodes"] if n["op"] == "linspace")
        node["attrs"] = {**node["attrs"], **change}
        with pytest.raises(UserError, match=said):
            NetworkDescription.from_dict(changed)


def test_a_network_with_coordconv_prunes_and_trains():
    """torch-pruning cuts the map's channels before a concatenation of coordinate channels (which it leaves whole),
    and a training step of the pruned network runs."""
    from test_networks import _train_step

    from perf4sight.networks.build import Source, prune_source

    class Net(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.stem, self.coord, self.fc = nn.Conv2d(3, 8, 3, padding=1), _CoordConv(8), nn.Linear(8 * 8 * 8, 10)

        def forward(self, x):
            return self.fc(self.coord(self.stem(x).relu()).relu().flatten(1))
    (desc,) = prune_source(Source("net", "test", Net), SHAPE, [30], "l1-norm", 2, seed=0)
    assert [(n.op, n.output_shape[0]) for n in desc.nodes if n.op in ("conv2d", "linspace", "cat")] == [
        ("conv2d", 5), ("linspace", 1), ("linspace", 1), ("cat", 7), ("conv2d", 6)]
    _train_step(desc)


def test_a_network_with_coordconv_by_arange_prunes_at_30_and_60_percent_and_trains():
    """torch-pruning cuts the map's channels before the port's coordinate channels (made by arange, left whole) at
    30 and 60%, and a training step of each pruned network runs."""
    from test_networks import _train_step

    from perf4sight.networks.build import Source, prune_source

    class Net(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.stem, self.coord, self.fc = nn.Conv2d(3, 16, 3, padding=1), _AddCoords(16), nn.Linear(16, 10)

        def forward(self, x):
            return self.fc(self.coord(self.stem(x).relu()).relu().mean((2, 3)))
    for desc in prune_source(Source("net", "test", Net), SHAPE, [30, 60], "l1-norm", 2, seed=0):
        made = [(n.op, n.output_shape[0], n.attrs.get("made")) for n in desc.nodes if n.op in ("linspace", "cat")]
        assert made[:2] == [("linspace", 1, "arange")] * 2 and made[2][1] == 2 + next(
            n.output_shape[0] for n in desc.nodes if n.op == "conv2d") < 18
        _train_step(desc)


def test_a_standardised_convolution_called_twice_shares_its_parameter():
    """A standardised convolution called twice (torch.fx reads its parameter once for both: the weight was refused as
    computed, as the parameter was read by both standardisations) is two conv2d of standardize, the second sharing
    the first's parameter; torch standardises it at each call: the rebuilt module computes the original's output
    and gradients and runs its kernels, and the allocation model writes it down as the meta trace."""
    from test_allocator import _as_replayed
    from test_ir_research_calls import _kernels_run

    from perf4sight.features.alloc_trace import record_events
    from perf4sight.ir.to_torch import build_module

    class Twice(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.conv = _StandardisedByBatchNorm(8, 8, 3, padding=1)

        def forward(self, x):
            return self.conv(self.conv(x).relu())
    module = _Block(Twice())
    desc = _computes_the_same(module)
    assert [(n.attrs.get("standardize"), n.attrs.get("shares")) for n in desc.nodes if n.op == "conv2d"] == [
        (None, None), ("batch_norm", None), ("batch_norm", "conv2d")]
    assert _kernels_run(module) == _kernels_run(build_module(desc))
    for batch in (3, 1):
        assert _as_replayed(record_events(desc, batch, steps=2, method="model")) == _as_replayed(
            record_events(desc, batch, steps=2, method="trace"))


@pytest.mark.filterwarnings("ignore:For backward hooks to be called")
def test_a_hook_that_writes_its_tensors_in_place_is_refused():
    """A hook that changes a value in place (``o.relu_()``, returned or not; ``args[0].mul_(2)``; a gradient scaled in
    place) returns None or the very tensor it was given, and was described as an observer (a plain conv2d, its kernel
    left out): refused naming the layer, the hook and that it writes in place."""
    cases = {"forward hook": lambda m: m.register_forward_hook(lambda mod, args, out: out.relu_()),
             "forward pre-hook": lambda m: m.register_forward_pre_hook(lambda mod, args: (args[0].mul_(2), None)[1]),
             "backward hook": lambda m: m.register_full_backward_hook(lambda mod, gi, go: (gi[0].mul_(0.5), None)[1])}
    for kind, register in cases.items():
        with pytest.raises(UserError, match=rf"probe: layer 'block' \(Conv2d\) has a {kind} \(.*<lambda>\) that "
                                            r"writes a tensor it was given in place: .*writes nothing, an observer"):
            describe(_hooked(register), SHAPE, name="probe")
    model = _hooked(lambda m: m.register_forward_hook(lambda mod, args, out: (out.add_(1), None)[1]), on_model=True)
    with pytest.raises(UserError, match=r"probe: the model \(_Block\) has a forward hook .* in place"):
        describe(model, SHAPE, name="probe")


def test_a_parameters_gradient_hook_that_changes_it_is_refused():
    """A parameter's gradient hook (``weight.register_hook(lambda g: g.clamp(-1, 1))``, a gradient clipped per
    parameter) runs at every backward and the trace never sees it: it was described as the plain network. One that
    returns a value or writes the gradient in place is refused naming the parameter; an observer (None, or the
    gradient as it is) describes as the plain network."""
    torch.manual_seed(0)
    plain = describe(_hooked(lambda m: None), SHAPE, name="probe").to_dict()
    clipped = _hooked(lambda m: m.weight.register_hook(lambda g: g.clamp(-1, 1)))
    with pytest.raises(UserError, match=r"probe: parameter 'block.weight' has a gradient hook \(.*<lambda>, "
                                        r"Tensor.register_hook\) that returns a value, replacing its gradient"):
        describe(clipped, SHAPE, name="probe")
    scaled = _hooked(lambda m: m.bias.register_hook(lambda g: (g.mul_(0.5), None)[1]))
    with pytest.raises(UserError, match=r"parameter 'block.bias' has a gradient hook .* writes its gradient in place"):
        describe(scaled, SHAPE, name="probe")
    norms = []
    observed = _hooked(lambda m: m.weight.register_hook(lambda g: norms.append(g.shape)))
    observed.block.bias.register_hook(lambda g: g)
    assert describe(observed, SHAPE, name="probe").to_dict() == plain
    assert norms  # the observer was called (on an empty gradient)


def test_an_optimisers_step_in_the_backward_is_refused():
    """A post-accumulate-grad hook that steps an optimiser in the backward (torch's "optimizer in backward" recipe:
    each gradient freed once used) or clamps the gradient was described as a plain training step; refused naming
    the parameter, the user's parameter left as it was (the hook is called on a stand-in). One kept by the very
    parameter (an optimiser per parameter) cannot be told apart and is refused as untold; an observer describes."""
    torch.manual_seed(0)
    plain = describe(_hooked(lambda m: None), SHAPE, name="probe").to_dict()

    def step(p):
        with torch.no_grad():
            p.add_(p.grad, alpha=-0.1)
        p.grad = None
    net = _hooked(lambda m: m.weight.register_post_accumulate_grad_hook(step))
    before = net.block.weight.detach().clone()
    with pytest.raises(UserError, match=r"probe: parameter 'block.weight' has a hook run once its gradient is "
                                        r"accumulated \(.*step, Tensor.register_post_accumulate_grad_hook\) that "
                                        r"updates the parameter"):
        describe(net, SHAPE, name="probe")
    assert torch.equal(net.block.weight.detach(), before)
    optimisers = {}
    per_parameter = _hooked(lambda m: m.bias.register_post_accumulate_grad_hook(lambda p: optimisers[p].step()))
    optimisers[per_parameter.block.bias] = torch.optim.SGD([per_parameter.block.bias], lr=0.1)
    with pytest.raises(UserError, match=r"parameter 'block.bias' has a hook run once .* cannot be told .*KeyError"):
        describe(per_parameter, SHAPE, name="probe")
    shapes = []
    observed = _hooked(lambda m: m.weight.register_post_accumulate_grad_hook(lambda p: shapes.append(p.grad.shape)))
    assert describe(observed, SHAPE, name="probe").to_dict() == plain and shapes

#: Each layer of a weight_norm: (the layer made, its description op, its weight_norm attr).
_WEIGHT_NORMED = {
    "a conv2d's parametrization": (lambda: parametrizations.weight_norm(nn.Conv2d(8, 8, 3, padding=1, groups=2)),
                                   "conv2d", "parametrization"),
    "a conv2d's old hook": (lambda: torch.nn.utils.weight_norm(nn.Conv2d(8, 8, 3, padding=1, bias=False)), "conv2d",
                            "hook"),
    "a linear's parametrization": (lambda: parametrizations.weight_norm(nn.Linear(8, 8)), "linear",
                                   "parametrization"),
    "a linear's old hook": (lambda: torch.nn.utils.weight_norm(nn.Linear(8, 8, bias=False)), "linear", "hook"),
}
#: Each layer of a spectral_norm: (the layer made, its description op, its spectral_norm attrs).
_SPECTRAL_NORMED = {
    "a conv2d's parametrization": (lambda: parametrizations.spectral_norm(nn.Conv2d(8, 8, 3, padding=1, groups=2)),
                                   "conv2d", {"spectral_norm": "parametrization"}),
    "a conv2d's old hook, two iterations": (
        lambda: torch.nn.utils.spectral_norm(nn.Conv2d(8, 8, 3, padding=1, bias=False), n_power_iterations=2,
                                             eps=1e-6), "conv2d",
        {"spectral_norm": "hook", "spectral_norm_iterations": 2, "spectral_norm_eps": 1e-6}),
    "a linear's parametrization": (lambda: parametrizations.spectral_norm(nn.Linear(8, 8)), "linear",
                                   {"spectral_norm": "parametrization"}),
    "a linear's old hook": (lambda: torch.nn.utils.spectral_norm(nn.Linear(8, 8, bias=False)), "linear",
                            {"spectral_norm": "hook"}),
}
_NORMED = {**{f"weight_norm: {k}": (make, op, {"weight_norm": form}) for k, (make, op, form) in _WEIGHT_NORMED.items()},
           **{f"spectral_norm: {k}": v for k, v in _SPECTRAL_NORMED.items()}}


class _PerPixel(nn.Module):
    """A linear layer over each pixel's channels."""

    def __init__(self, linear: nn.Module) -> None:
        super().__init__()
        self.linear = linear

    def forward(self, x):
        return self.linear(x.permute(0, 2, 3, 1)).permute(0, 3, 1, 2)


@pytest.mark.filterwarnings("ignore::FutureWarning")  # torch.nn.utils.weight_norm, the older of the two
@pytest.mark.parametrize("case", list(_NORMED))
def test_weight_norm_is_an_attr_of_the_conv2d_or_linear(case):
    """A conv2d's or linear's weight normalised per output channel by torch's weight_norm (w = g * v / ||v||, dim 0:
    the parametrization, or the older hook) was refused ("has its weight parametrized by weight_norm"): it is the
    layer's attr weight_norm, rebuilt by torch's own function; so is one divided by its largest singular value by
    torch's spectral_norm (a power iteration a training forward, its buffers u and v updated), the attr
    spectral_norm. The rebuilt module computes the original's output, gradients and buffers, runs its kernels and
    describes again as it; the kernels the features add to the plain layer's are torch's (weight_norm: one forward,
    one back; spectral_norm: 8 an iteration and 5 forward, 9 back); g's parameters are counted; what autograd keeps
    per sample and once a step is the features'; the allocation model writes the parametrizations down as the meta
    trace and leaves the hooks to it, which runs them step by step; a PerfSeer graph keeps the attrs."""
    from test_allocator import _as_replayed
    from test_features import _autograd_saved_bytes
    from test_ir_research_calls import _kernels_run

    from perf4sight.exporters.perfseer import description_to_graph
    from perf4sight.features.aggregate import network_features
    from perf4sight.features.alloc_trace import record_events
    from perf4sight.features.allocator import STEP
    from perf4sight.features.walk import walk
    from perf4sight.importers.perfseer import graph_to_description
    from perf4sight.ir.schema import NetworkDescription
    from perf4sight.ir.to_torch import build_module

    make, op, attrs = _NORMED[case]
    form = next(iter(attrs))
    torch.manual_seed(0)
    layer = make()
    module = _Block(layer if op == "conv2d" else _PerPixel(layer))
    desc = _computes_the_same(module)
    node = next(n for n in desc.nodes if n.attrs.get(form))
    assert node.op == op and {k: v for k, v in node.attrs.items() if k.startswith(form)} == attrs
    assert [n.name for n in desc.nodes if n.attrs.get(form)] == [node.name]
    rebuilt = build_module(desc)
    assert [name for name, _ in getattr(rebuilt, node.name).named_parameters()] == \
        [name for name, _ in layer.named_parameters()]
    assert [name for name, _ in getattr(rebuilt, node.name).named_buffers()] == \
        [name for name, _ in layer.named_buffers()]
    assert describe(rebuilt, SHAPE, name="probe").to_dict() == desc.to_dict()
    ran = _kernels_run(module)
    assert ran == _kernels_run(rebuilt)
    if form == "weight_norm":
        assert (ran["_weight_norm_interface"], ran["_weight_norm_interface_backward"]) == (1, 1)
    plain_data = desc.to_dict()
    plain_node = next(n for n in plain_data["nodes"] if n["name"] == node.name)
    plain_node["attrs"] = {k: v for k, v in plain_node["attrs"].items() if not k.startswith(form)}
    del plain_data["params"]
    plain_desc = NetworkDescription.from_dict(plain_data)
    assert desc.params - plain_desc.params == (8 if form == "weight_norm" else 0)  # g: one gain an output channel
    added = sum(ran.values()) - sum(_kernels_run(build_module(plain_desc)).values())
    iterations = attrs.get("spectral_norm_iterations", 1)
    assert added == sum(v.cost.kernels_fwd + v.cost.kernels_bwd for v in walk(desc)) - sum(
        v.cost.kernels_fwd + v.cost.kernels_bwd for v in walk(plain_desc)) == (
        2 if form == "weight_norm" else 8 * iterations + 5 + 9)
    at2, at4 = (b * _autograd_saved_bytes(desc, b, with_input=False) for b in (2, 4))
    features = network_features(desc)
    assert features.per_sample["saved_bytes"] == network_features(plain_desc).per_sample["saved_bytes"] == \
        (at4 - at2) / 2
    weights = 8 * 8 // node.attrs["groups"] * 9 if op == "conv2d" else 8 * 8
    kept = weights + 8 if form == "weight_norm" else weights + 8 + weights // 8 + 1  # W / sigma, u, v, sigma
    assert features.batch_saved_sizes.sum() == at2 - 2 * (at4 - at2) / 2 == kept * 4
    trace = record_events(desc, 2, steps=3, method="trace")
    if attrs.get(form) == "parametrization" and op == "conv2d":  # written down (a linear's here is strided)
        assert _as_replayed(record_events(desc, 2, steps=3, method="model")) == _as_replayed(trace)
    else:
        said = "" if attrs.get(form) == "parametrization" else f"a {op} of {form}"
        with pytest.raises(UserError, match=f"the allocation model does not cover {said}"):
            record_events(desc, 2, steps=1, method="model")
    assert _as_replayed(trace) == _as_replayed(record_events(desc, 2, steps=3, method="trace", fast=False))
    held = [_live_bytes(trace[:i]) for i, e in enumerate(trace) if e[0] == STEP][1:] + [_live_bytes(trace)]
    assert held[0] == held[1] == held[2]  # the hook's weight of a step before freed at the next forward
    back, _ = graph_to_description(description_to_graph(desc, 4), "probe", "probe.pkl")
    assert back.to_dict() == desc.to_dict()


class _WeightNormedThrough(nn.Module):
    """weight_norm's parametrization (or ``wn``) on every layer: a first conv reading the input, a 1 x 1 one without a
    bias, a depthwise one called twice, a dilated nn.Conv1d over the map's pixels, one of a channels-last input (after a
    permute), linears over the map's rows (folded: addmm, and without a bias mm), a linear with a bias and one
    without."""

    def __init__(self, wn=parametrizations.weight_norm) -> None:
        super().__init__()
        self.stem, self.point = wn(nn.Conv2d(3, 8, 3, padding=1)), wn(nn.Conv2d(8, 8, 1, bias=False))
        self.depthwise, self.time = wn(nn.Conv2d(8, 8, 3, padding=1, groups=8)), wn(nn.Conv1d(8, 8, 3, padding=2,
                                                                                            dilation=2))
        self.last = wn(nn.Conv2d(8, 8, 3, padding=1))
        self.rows, self.rows_unbiased = wn(nn.Linear(64, 64)), wn(nn.Linear(64, 64, bias=False))
        self.fc, self.out = wn(nn.Linear(8, 16)), wn(nn.Linear(16, 10, bias=False))

    def forward(self, x):
        x = self.point(torch.sigmoid(self.stem(x)))
        x = self.depthwise(torch.sigmoid(self.depthwise(x)))
        x = x + torch.sigmoid(self.time(x.flatten(2))).reshape(x.shape)
        x = self.last(x.permute(0, 2, 3, 1).contiguous().permute(0, 3, 1, 2))
        x = self.rows_unbiased(torch.sigmoid(self.rows(x.reshape(x.shape[0], 8, 64)))).reshape(x.shape)
        return self.out(torch.sigmoid(self.fc(x.mean((2, 3)))))


@pytest.mark.parametrize("how", [parametrizations.weight_norm, parametrizations.spectral_norm,
                                 lambda m: parametrizations.spectral_norm(m, n_power_iterations=2)],
                         ids=["weight_norm", "spectral_norm", "spectral_norm of 2 iterations"])
def test_weight_norms_parametrization_is_written_down_as_the_trace_records_it(how):
    """weight_norm's and spectral_norm's parametrizations went to the meta trace (a resnet18 with every layer of it at
    224x224, four batch sizes: 148 and 1,087 ms of process time, against 5 and 9 ms written down): the allocation
    model writes them down. weight_norm: the weight and its norms made by _weight_norm_interface, the layer's node
    keeping the weight and weight_norm's the norms, whose backward gives v's and g's gradients. spectral_norm: each
    power iteration's products and norms, freed; u and v cloned, sigma (vdot of u and the product of the weight and
    v), the weight over sigma; backward the division's (sigma's gradient first), vdot's and mv's, the weight's two
    gradients added. Its events are the trace's at batch 1 under SGD and 3 under Adam, for a
    first layer, a 1 x 1 one without a bias, a depthwise layer called twice, an nn.Conv1d, one of a channels-last
    input and linears with and without a bias, of vectors and of rows."""
    from test_allocator import _as_replayed

    from perf4sight.features.alloc_trace import record_events

    desc = describe(_WeightNormedThrough(how), SHAPE, name="probe")
    normed = [n for n in desc.nodes if n.attrs.get("weight_norm") or n.attrs.get("spectral_norm")]
    assert len(normed) == 10 and [n.op for n in normed].count("linear") == 4
    assert sum(1 for n in normed if n.attrs.get("shares")) == 1
    for optimizer, batch in (("sgd", 1), ("adam", 3)):
        assert _as_replayed(record_events(desc, batch, steps=2, method="model", optimizer=optimizer)) == \
            _as_replayed(record_events(desc, batch, steps=2, method="trace", optimizer=optimizer))


def _live_bytes(events) -> int:
    """The bytes ``events`` (allocation events) leave allocated."""
    from perf4sight.features.allocator import ALLOC, FREE

    sizes: dict[int, int] = {}
    for kind, sid, size, _ in events:
        if kind == ALLOC:
            sizes[sid] = size
        elif kind == FREE:
            sizes.pop(sid)
    return sum(sizes.values())


def test_weight_norm_attrs_are_checked():
    """A weight_norm of no known form, on a fixed conv2d's filter or on a standardised weight, is refused on
    reading, naming the attr; so are a spectral_norm with it, of no known form, of no power iteration, and its eps
    without it; a description without them (every older one) reads as before."""
    from perf4sight.ir.schema import NetworkDescription

    data = describe(_Block(parametrizations.weight_norm(nn.Conv2d(8, 8, 3, padding=1))), SHAPE,
                    name="probe").to_dict()
    assert data["nodes"][2]["attrs"]["weight_norm"] == "parametrization"
    NetworkDescription.from_dict(data)
    for change, said in (({"weight_norm": "spectral"}, "attr 'weight_norm' must be one of parametrization, hook, got "
                                                       "'spectral'"),
                         ({"fixed": True, "bias": False}, r"a fixed conv2d \(its filter a buffer\) has no weight to "
                                                          r"normalise \(weight_norm\)"),
                         ({"standardize": "batch_norm"}, "attrs 'weight_norm' and 'standardize' exclude each other"),
                         ({"spectral_norm": "hook"}, "attrs 'spectral_norm' and 'weight_norm' exclude each other"),
                         ({"weight_norm": None, "spectral_norm": "power"}, "attr 'spectral_norm' must be one of "
                                                                           "parametrization, hook, got 'power'"),
                         ({"weight_norm": None, "spectral_norm": "hook", "spectral_norm_iterations": 0},
                          "attr 'spectral_norm_iterations' must be an integer >= 1, got 0"),
                         ({"weight_norm": None, "spectral_norm_eps": 1e-6}, "attr 'spectral_norm_eps' is for a layer "
                                                                            "of 'spectral_norm'")):
        changed = {**data, "nodes": [dict(n) for n in data["nodes"]]}
        node = changed["nodes"][2]
        node["attrs"] = {k: v for k, v in {**node["attrs"], **change}.items() if v is not None}
        with pytest.raises(UserError, match=said):
            NetworkDescription.from_dict(changed)


class _WeightNormedNet(nn.Module):
    """A stem, a convolution and a classifier, the last two of torch.nn.utils.weight_norm's hook."""

    def __init__(self) -> None:
        super().__init__()
        self.stem = nn.Conv2d(3, 8, 3, padding=1)
        self.conv = torch.nn.utils.weight_norm(nn.Conv2d(8, 8, 3, padding=1))
        self.fc = torch.nn.utils.weight_norm(nn.Linear(8 * 8 * 8, 10))

    def forward(self, x):
        return self.fc(self.conv(self.stem(x).relu()).flatten(1))


@pytest.mark.filterwarnings("ignore::FutureWarning")  # torch.nn.utils.weight_norm, the older of the two
def test_a_network_of_the_weight_norm_hook_is_copied_for_the_networks_stage():
    """The networks stage deep-copies a network before pruning it (level 0 too), which torch refuses for a layer of
    torch.nn.utils.weight_norm's hook (RuntimeError: "Only Tensors created explicitly by the user ..."): the weight
    the hook made is copied detached, computed again at the next forward; unpruned, it describes with its attr. The
    weightless twin that describing runs on the meta device is made too (it fell back to fake tensors, which copy
    every weight: twice the time of a 12-layer network of 256 channels)."""
    import torch.fx as fx

    from perf4sight.ir.torch_trace import _meta_twin
    from perf4sight.networks.build import Source, prune_source
    from perf4sight.networks.prune_plan import module_copy

    net = _WeightNormedNet()
    copied = module_copy(net)
    assert copied.conv.weight is not net.conv.weight and torch.equal(copied.conv.weight, net.conv.weight)
    x = torch.randn(2, *SHAPE)
    assert torch.equal(copied(x), net(x))
    (desc,) = prune_source(Source("net", "test", _WeightNormedNet), SHAPE, [0], "l1-norm", 2, seed=0)
    assert [n.attrs.get("weight_norm") for n in desc.nodes if n.op in ("conv2d", "linear")] == [None, "hook", "hook"]
    twin = _meta_twin(fx.symbolic_trace(net))
    assert twin.conv.weight.is_meta and twin(torch.empty(2, *SHAPE, device="meta")).shape == (2, 10)


@pytest.mark.filterwarnings("ignore::FutureWarning")  # torch.nn.utils.weight_norm, the older of the two
def test_weight_norm_parametrization_is_rebuilt_by_the_hook_where_torch_has_none(monkeypatch):
    """torch 1.10 (a device's) has torch.nn.utils.weight_norm but not parametrizations.weight_norm (torch 2.1): a
    weight_norm parametrization is rebuilt there by the hook, its g and v in the same order, computing the same."""
    from perf4sight.ir.to_torch import build_module

    torch.manual_seed(0)
    desc = describe(_Block(parametrizations.weight_norm(nn.Conv2d(8, 8, 3, padding=1))), SHAPE, name="probe")
    node = desc.nodes[2]
    assert node.attrs["weight_norm"] == "parametrization"
    new = build_module(desc)
    monkeypatch.delattr(parametrizations, "weight_norm")
    old = build_module(desc)
    assert [n for n, _ in getattr(old, node.name).named_parameters()] == ["bias", "weight_g", "weight_v"]
    for a, b in zip(old.parameters(), new.parameters()):
        b.data.copy_(a.data)
    x = torch.randn(2, *SHAPE)
    outs = [m(x) for m in (old, new)]
    for out in outs:
        out.square().sum().backward()
    assert torch.allclose(outs[0], outs[1], atol=1e-6)
    assert all(torch.allclose(a.grad, b.grad, atol=1e-5) for a, b in zip(old.parameters(), new.parameters()))


@pytest.mark.filterwarnings("ignore::FutureWarning")  # torch.nn.utils.weight_norm, the older of the two
def test_a_frozen_weight_norm_parameter_stays_frozen_where_the_hook_stands_for_the_parametrization(monkeypatch):
    """A weight_norm parametrization whose g (or v) is frozen is named in frozen_parameters by the parametrization's
    name (``parametrizations.weight.original0``); torch 1.10 (a device's) rebuilds the layer by the hook, whose g is
    ``weight_g``: the rebuild refused the description ("names ..., which is no parameter of the layer rebuilt of its
    node"), failing the profile's measurement there. The hook's g and v are frozen in their place."""
    from perf4sight.ir.to_torch import build_module

    net = _Block(parametrizations.weight_norm(nn.Conv2d(8, 8, 3, padding=1)))
    net.block.parametrizations.weight.original0.requires_grad_(False)
    desc = describe(net, SHAPE, name="probe")
    node = desc.nodes[2].name
    assert desc.extra["frozen_parameters"] == [f"{node}.parametrizations.weight.original0"]
    monkeypatch.delattr(parametrizations, "weight_norm")
    old = build_module(desc)
    assert [n for n, p in old.named_parameters() if not p.requires_grad] == [f"{node}.weight_g"]


_NORMS = {"weight_norm parametrization": parametrizations.weight_norm, "weight_norm hook": torch.nn.utils.weight_norm,
          "spectral_norm parametrization": parametrizations.spectral_norm,
          "spectral_norm hook": torch.nn.utils.spectral_norm}


class _AllNormed(nn.Module):
    """A discriminator's or WaveNet's kind of network, every layer of ``how``: convolutions, a stride, a depthwise one
    in a residual block, a dilated nn.Conv1d over the map's pixels, two linears."""

    def __init__(self, how=parametrizations.weight_norm) -> None:
        super().__init__()
        self.c1, self.c2 = how(nn.Conv2d(3, 16, 3, padding=1)), how(nn.Conv2d(16, 32, 3, padding=1, stride=2))
        self.dw, self.c3 = how(nn.Conv2d(32, 32, 3, padding=1, groups=32)), how(nn.Conv2d(32, 32, 1))
        self.t = how(nn.Conv1d(32, 32, 3, padding=2, dilation=2))
        self.fc, self.out = how(nn.Linear(32, 24)), how(nn.Linear(24, 10))

    def forward(self, x):
        x = self.c2(self.c1(x).relu()).relu()
        x = x + self.c3(self.dw(x).relu())
        return self.out(self.fc(self.t(x.flatten(2)).relu().mean(2)).relu())


def _trains(model: nn.Module) -> None:
    """Two SGD steps of ``model`` on 8x8 images: a finite loss, every parameter moved."""
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    before = [p.detach().clone() for p in model.parameters()]
    for _ in range(2):
        loss = F.cross_entropy(model(torch.randn(4, *SHAPE)), torch.randint(0, 10, (4,)))
        opt.zero_grad()
        loss.backward()
        opt.step()
    assert torch.isfinite(loss)
    assert all(not torch.equal(a, b) for a, b in zip(before, model.parameters()))


@pytest.mark.filterwarnings("ignore::FutureWarning")  # torch.nn.utils.weight_norm, the older of the two
@pytest.mark.parametrize("how", list(_NORMS.values()), ids=list(_NORMS))
def test_pruning_cuts_weight_normed_and_spectral_normed_layers(how):
    """A network of weight_norm or spectral_norm layers alone (either form) prunes: their g and v (or the original
    weight, u and v) are cut with the channels (it reached 0.0% at most, every group left whole: torch-pruning cut
    the hook's computed weight, not g and v). At 30 and 60% the networks stage's description is the traced one of the
    pruned module, its parameters the module's, and the module trains, as does the description rebuilt."""
    from test_networks import _train_step

    from perf4sight.networks.build import Source, prune_source
    from perf4sight.networks.pruning import PruningPlan, count_parameters

    torch.manual_seed(0)
    net = _AllNormed(how)
    net(torch.randn(2, *SHAPE))  # the hook form's computed weight, as a trained network holds it
    plan = PruningPlan(net, SHAPE, "l1-norm", 2, network="net")
    descs = prune_source(Source("net", "test", lambda: _AllNormed(how)), SHAPE, [30, 60], "l1-norm", 2, seed=0,
                         plan=plan)
    assert [abs(d.pruning_level - target) < 1 for d, target in zip(descs, (30, 60))] == [True, True]
    assert "pruning_unpruned_groups" not in descs[0].extra
    for desc in descs:
        pruned = plan.prune(desc.extra["target_level"]).module
        assert desc.params == count_parameters(pruned) < count_parameters(net)
        traced = describe(pruned, SHAPE, name=desc.name)
        assert [n.to_dict() for n in traced.nodes] == [n.to_dict() for n in desc.nodes]
        _trains(pruned)
    _train_step(descs[1])


@pytest.mark.filterwarnings("ignore::FutureWarning")
@pytest.mark.parametrize("how", list(_NORMS.values()), ids=list(_NORMS))
def test_a_normed_layers_cut_keeps_what_torch_trains(how):
    """The cut keeps the kept channels' g and v (the original weight) as they were: an output channel cut leaves the
    kept outputs' weight as it was; an input channel cut takes v's (the original's) columns. spectral_norm's u and v
    are the kept entries, unit vectors again."""
    from perf4sight.networks import prune_plan as pp

    torch.manual_seed(0)
    net = nn.Sequential(how(nn.Conv2d(3, 6, 3)), nn.ReLU(), how(nn.Conv2d(6, 4, 3)))
    net(torch.randn(1, *SHAPE))
    a, b = pp._normed_tensors(net[0]), pp._normed_tensors(net[2])
    before = [getattr(h, n).detach().clone() for h, n, *_ in a + b]
    cut = pp.cut(net, {("0", pp.prune_out_channels_normed): {1, 4}, ("2", pp.prune_in_channels_normed): {1, 4}})
    keep = torch.tensor([0, 2, 3, 5])
    (first, second) = cut[0], cut[2]
    assert (first.out_channels, second.in_channels, first.bias.shape[0]) == (4, 4, 4)
    tensors = pp._normed_tensors(first) + pp._normed_tensors(second)
    for i, ((h, n, out_dim, in_how), old) in enumerate(zip(tensors, before)):
        t, mine = getattr(h, n), i < len(a)  # the first layer's (its outputs cut), else the second's (its inputs)
        if mine and out_dim == 0:
            expected = old[keep]
        elif not mine and in_how == "dim1":
            expected = old[:, keep]
        elif not mine and in_how == "flat":  # v of [in * kh * kw]: each kept input's nine entries
            expected = old.reshape(6, 9)[keep].reshape(-1)
        else:
            expected = old
        if isinstance(t, nn.Parameter):
            assert torch.equal(t.detach(), expected), n
        else:  # spectral_norm's u or v: the kept entries, normalised
            assert torch.allclose(t, F.normalize(expected, dim=0)), n
    assert cut(torch.randn(1, *SHAPE)).shape[1] == 4


@pytest.mark.filterwarnings("ignore::FutureWarning")
@pytest.mark.parametrize("how", [torch.nn.utils.weight_norm, parametrizations.spectral_norm])
def test_pruning_keeps_a_grouped_normed_convolutions_channels_and_says_so(how):
    """A grouped (not depthwise) convolution of weight_norm or spectral_norm is left whole, counted by its reason
    (its uniform cut per group is not written): the channels it reads and makes; the last plain conv prunes."""
    from perf4sight.networks.pruning import PruningPlan

    net = nn.Sequential(nn.Conv2d(3, 16, 3, padding=1), nn.ReLU(), how(nn.Conv2d(16, 16, 3, padding=1, groups=4)),
                        nn.ReLU(), nn.Conv2d(16, 16, 3, padding=1), nn.Flatten(), nn.Linear(16 * 64, 10))
    plan = PruningPlan(net, SHAPE, "l1-norm", 2, network="net")
    assert plan.extra["pruning_unpruned_groups"] == {"a grouped weight_norm or spectral_norm convolution's channels": 2}
    assert [g.root for g in plan.groups] == ["4"]


class _TemporalBlock(nn.Module):
    """A TCN's convolution over time: the map's rows as a sequence ([N, C, H * W]), a dilated nn.Conv1d of
    weight_norm's hook (as TCNs write it), a ReLU, back to the map."""

    def __init__(self, how=torch.nn.utils.weight_norm) -> None:
        super().__init__()
        self.conv = how(nn.Conv1d(8, 8, 3, padding=2, dilation=2))

    def forward(self, x):
        return self.conv(x.flatten(2)).relu().view_as(x)


@pytest.mark.filterwarnings("ignore::FutureWarning")  # torch.nn.utils.weight_norm, the older of the two
@pytest.mark.parametrize("how,form", [(torch.nn.utils.weight_norm, ("weight_norm", "hook")),
                                      (parametrizations.spectral_norm, ("spectral_norm", "parametrization"))])
def test_a_conv1d_of_weight_norm_is_a_conv2d_of_weight_norm(how, form):
    """A TCN's (WaveNet's) nn.Conv1d of weight_norm (or spectral_norm) was refused by name: it is the conv2d of
    kernel (1, k) of its one-pixel high view, of weight_norm, as nn.Conv1d is; the rebuilt conv2d (g of [8, 1, 1, 1]
    for the Conv1d's [8, 1, 1], v of [8, 8, 1, 3] for [8, 8, 3]) computes the same output and gradients."""
    from perf4sight.ir.to_torch import build_module

    torch.manual_seed(0)
    module = _Block(_TemporalBlock(how))
    desc = describe(module, SHAPE, name="probe")
    conv = next(n for n in desc.nodes if n.name == "block_conv")
    assert (conv.op, conv.attrs["kernel_size"], conv.attrs["dilation"], conv.attrs[form[0]]) == (
        "conv2d", [1, 3], [1, 2], form[1])
    assert desc.params == sum(p.numel() for p in module.parameters())
    rebuilt = build_module(desc)
    for new, old in zip([*rebuilt.parameters(), *rebuilt.buffers()], [*module.parameters(), *module.buffers()]):
        new.data.copy_(old.data.reshape(new.shape))
    x = torch.randn(2, *SHAPE)
    outs = [m(x) for m in (module, rebuilt)]
    for out in outs:
        out.square().sum().backward()
    assert torch.allclose(outs[0], outs[1], atol=1e-5)
    assert all(torch.allclose(a.grad.reshape(b.shape), b.grad, atol=1e-4)
               for a, b in zip(module.parameters(), rebuilt.parameters()))
