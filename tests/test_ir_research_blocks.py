"""Blocks of research code the description still refuses, each written here from its paper's description: CondConv
(per-sample kernels mixed from experts), shuffle attention (groups folded into the batch), CoordConv (coordinate
channels from torch.linspace), a blur pool (a fixed filter held as a buffer), weight standardisation (a convolution
whose weight is normalised in the forward) and a gather of a parameter (an embedding's or a relative position bias's
lookup). None fits a description without an op of its own; each is refused in one line that names the form, where the
refusals named a matmul, a reshape or a getitem (or spoke of BiFPN's fusion)."""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from test_ir_maths_calls import SHAPE, _computes_the_same

from torch import nn

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
    "shuffle attention": (lambda: _Block(_ShuffleAttention()),
                          r"probe: reshape reshapes the batch of 2 images .* into a first dimension of 4: .* or folds "
                          r"groups of channels into the batch \(shuffle attention's x.reshape\(b \* groups, -1, h, "
                          r"w\)\)"),
    "CoordConv": (lambda: _Block(_CoordConv()),
                  r"probe: call_function 'linspace' \(node linspace: values made in the forward from numbers alone, "
                  r"as CoordConv's coordinate channels\) has no description op"),
    "blur pool": (lambda: _Block(_BlurPool(), 8 * 4 * 4),
                  r"probe: the convolution conv2d filters by block.kernel, a buffer: a fixed filter \(a blur pool's "
                  r"low-pass\) has no description op, whose convolutions train their weights"),
    "weight standardisation": (lambda: _Block(_StandardisedConv(8, 8, 3, padding=1)),
                               r"probe: the convolution conv2d's weight is computed in the forward from the parameter "
                               r"block.weight \(weight standardisation, a weight normalised or reparametrised\): the "
                               r"description has no op for it, which trains a convolution's weight as it is"),
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
