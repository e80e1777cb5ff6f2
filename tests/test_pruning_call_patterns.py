"""Pruning networks built from popular CNN research blocks (GhostNet's ghost module, CBAM, ECA, split attention):
each pruned so that it runs, or the channels it cannot cut left whole and said so."""
from __future__ import annotations

import sys
import warnings
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from perf4sight.networks.build import Source, prune_source

sys.path.insert(0, str(Path(__file__).parent))
from test_networks import CLASSES, _train_step  # noqa: E402

warnings.filterwarnings("ignore", module="torch_pruning")

SHAPE = [3, 16, 16]


class _Ghost(nn.Module):
    """GhostNet's ghost module: a primary convolution, a cheap depthwise one on its output, both concatenated; then a
    depthwise convolution (GhostNet's strided one), a pointwise one and the classifier."""

    def __init__(self) -> None:
        super().__init__()
        self.stem, self.primary = nn.Conv2d(3, 8, 3, padding=1), nn.Conv2d(8, 6, 1)
        self.cheap = nn.Conv2d(6, 6, 3, padding=1, groups=6)
        self.down, self.head = nn.Conv2d(12, 12, 3, 2, 1, groups=12), nn.Conv2d(12, 16, 1)
        self.fc = nn.Linear(16, CLASSES)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = torch.relu(self.primary(torch.relu(self.stem(x))))
        y = torch.cat([y, torch.relu(self.cheap(y))], 1)
        return self.fc(torch.relu(self.head(self.down(y))).mean((2, 3)))


def test_a_ghost_module_s_channels_torch_pruning_follows_by_one_path_only_stay_whole() -> None:
    """From the depthwise convolution after the concatenation, torch-pruning reaches the primary convolution through
    the cheap one only, not through the concatenation: a cut of the concatenation's first half left the primary
    convolution whole, and the pruned network failed at its first forward ("expected input to have 11 channels"). That
    group stays whole, said in the description; the others are cut and the pruned network describes, rebuilds and
    trains."""
    (desc,) = prune_source(Source("ghost", "test", _Ghost), SHAPE, [15], "l1-norm", 2, seed=0)
    assert desc.extra["pruning_unpruned_groups"] == {
        "channels torch-pruning's dependency graph does not follow whole (a cut of them does not run)": 1}
    widths = {n.name: n.attrs["out_channels"] for n in desc.nodes if n.op == "conv2d"}
    assert widths["primary"] == widths["cheap"] == 6 and widths["down"] == 12
    assert widths["stem"] + widths["head"] < 8 + 16
    _train_step(desc)


class _SpatialGate(nn.Module):
    """CBAM's spatial attention on a block: the block's map times a one-channel gate, a 7x7 convolution of the
    channels' max and mean (reductions over the channels, concatenated)."""

    def __init__(self) -> None:
        super().__init__()
        self.c0, self.c1 = nn.Conv2d(3, 16, 3, padding=1), nn.Conv2d(16, 16, 3, padding=1)
        self.spatial, self.fc = nn.Conv2d(2, 1, 7, padding=3), nn.Linear(16, CLASSES)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = torch.relu(self.c1(torch.relu(self.c0(x))))
        pooled = torch.cat([torch.max(y, 1)[0].unsqueeze(1), y.mean(1, keepdim=True)], 1)
        return self.fc((y * torch.sigmoid(self.spatial(pooled))).mean((2, 3)))


def test_a_one_channel_gate_and_reductions_over_the_channels_leave_the_block_prunable() -> None:
    """torch-pruning coupled the gate's one channel with the block's 16 (a broadcast multiply read as elementwise)
    and the reductions' input channels with the spatial convolution's two: the gate's group could lose nothing and
    swallowed the block's, whose 16 channels stayed whole (a level was reached by cutting the first convolution
    alone). The block's channels are cut now, the gate's convolution keeps its two inputs and one output, and the
    network describes, rebuilds and trains."""
    (desc,) = prune_source(Source("gate", "test", _SpatialGate), SHAPE, [40], "l1-norm", 2, seed=0)
    assert abs(desc.pruning_level - 40) <= 2.0 and "pruning_unpruned_groups" not in desc.extra
    convs = {n.name: n.attrs for n in desc.nodes if n.op == "conv2d"}
    assert convs["c1"]["out_channels"] < 16 and (convs["spatial"]["in_channels"], convs["spatial"]["out_channels"]) \
        == (2, 1)
    _train_step(desc)


class _EcaBlock(nn.Module):
    """ECA-Net's channel attention on a block: the block's map pooled to [N, C, 1, 1], viewed as [N, 1, C], convolved
    along its channels by a Conv1d of one channel (kernel 3), viewed back and broadcast over the map as a gate."""

    def __init__(self) -> None:
        super().__init__()
        self.c0, self.c1 = nn.Conv2d(3, 16, 3, padding=1), nn.Conv2d(16, 16, 3, padding=1)
        self.eca, self.fc = nn.Conv1d(1, 1, 3, padding=1, bias=False), nn.Linear(16, CLASSES)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = torch.relu(self.c1(torch.relu(self.c0(x))))
        gate = self.eca(nn.functional.adaptive_avg_pool2d(y, 1).squeeze(-1).transpose(-1, -2))
        return self.fc((y * torch.sigmoid(gate.transpose(-1, -2).unsqueeze(-1)).expand_as(y)).mean((2, 3)))


def test_an_eca_gate_leaves_the_block_prunable() -> None:
    """An ECA network was refused ("module 'eca' of type Conv1d has no description op"), and torch-pruning, which
    takes a transpose for an elementwise op, coupled the block's 16 channels with the Conv1d's one: the block stayed
    whole ("channels torch-pruning's dependency graph does not follow whole"). The block's channels are cut now, the
    Conv1d keeps its one channel (a conv2d of kernel (1, 3) in the description), and the network trains."""
    (desc,) = prune_source(Source("eca", "test", _EcaBlock), SHAPE, [40], "l1-norm", 2, seed=0)
    assert abs(desc.pruning_level - 40) <= 2.0 and "pruning_unpruned_groups" not in desc.extra
    convs = {n.name: n.attrs for n in desc.nodes if n.op == "conv2d"}
    assert convs["c1"]["out_channels"] < 16
    assert (convs["eca"]["in_channels"], convs["eca"]["out_channels"], convs["eca"]["kernel_size"]) == (1, 1, [1, 3])
    _train_step(desc)


class _NormalisedGem(nn.Module):
    """A retrieval network's head: the block's map L2-normalised over its channels (x / x.pow(2).sum(1, keepdim=True)
    .sqrt()), GeM-pooled (x.clamp(min=eps).pow(3).mean((2, 3)).pow(1 / 3)), then the classifier."""

    def __init__(self) -> None:
        super().__init__()
        self.c0, self.c1, self.fc = nn.Conv2d(3, 16, 3, padding=1), nn.Conv2d(16, 16, 3, padding=1), nn.Linear(16,
                                                                                                                CLASSES)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.c1(torch.relu(self.c0(x)))
        y = y / y.pow(2).sum(1, keepdim=True).sqrt()
        return self.fc(y.clamp(min=1e-6).pow(3.0).mean((2, 3)).pow(1 / 3.0))


def test_an_l2_normalised_gem_head_leaves_the_block_prunable() -> None:
    """The powers, the quotient by the channels' norm (a broadcast of one channel) and the sum over the channels leave
    the block's channels prunable: both convolutions are cut, nothing stays whole, and the network trains."""
    (desc,) = prune_source(Source("gem", "test", _NormalisedGem), SHAPE, [40], "l1-norm", 2, seed=0)
    assert abs(desc.pruning_level - 40) <= 2.0 and "pruning_unpruned_groups" not in desc.extra
    convs = {n.name: n.attrs["out_channels"] for n in desc.nodes if n.op == "conv2d"}
    assert convs["c0"] < 16 and convs["c1"] < 16 and {"pow", "mean", "mul"} <= {n.op for n in desc.nodes}


class _RowColumnGate(nn.Module):
    """A coordinate-attention-like gate: the block's means over its rows and over its columns (no keepdim: [N, C, H]
    and [N, C, W]), each through a 1x1 convolution of its own, gate the block's map. 16 channels at 16 x 16: a mean's
    output [N, 16, 16] has the shape the channels' reduction ([N, H, W]) would have."""

    def __init__(self) -> None:
        super().__init__()
        self.c0, self.rows, self.columns = nn.Conv2d(3, 16, 3, padding=1), nn.Conv2d(16, 16, 1), nn.Conv2d(16, 16, 1)
        self.fc = nn.Linear(16, CLASSES)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = torch.relu(self.c0(x))
        rows, columns = y.mean(3).unsqueeze(-1), y.mean(2).unsqueeze(-2)
        return self.fc((y * torch.sigmoid(self.rows(rows) + self.columns(columns))).mean((2, 3)))


def test_a_mean_over_rows_or_columns_keeps_the_channels_whatever_the_sides() -> None:
    """A reduction over a side was taken for one over the channels where its output's shape matched ([N, C, H] and
    [N, H, W] at C == H == W): the mean's input was cut from the gate's convolutions, which then kept their 16 inputs
    when the block lost channels; the cut did not run and the block stayed whole ("cannot reach pruning level 30%:
    it reaches 0.0% at most"). The reduced dimensions are the reduction's own: the block is cut, the gate with it."""
    (desc,) = prune_source(Source("rows", "test", _RowColumnGate), SHAPE, [25], "l1-norm", 2, seed=0)
    assert abs(desc.pruning_level - 25) <= 2.0 and "pruning_unpruned_groups" not in desc.extra
    convs = {n.name: n.attrs for n in desc.nodes if n.op == "conv2d"}
    assert convs["c0"]["out_channels"] < 16
    assert convs["rows"]["in_channels"] == convs["columns"]["in_channels"] == convs["c0"]["out_channels"]
    _train_step(desc)


class _NonLocalResNet(nn.Module):
    """A ResNet-like network with one non-local block (Wang et al. 2018, embedded Gaussian) after its residual block:
    theta^T phi over the 8x8 map's positions, softmax, times g^T, back to a map, a 1x1 convolution, added to the
    block's input."""

    def __init__(self) -> None:
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(3, 16, 3, padding=1), nn.BatchNorm2d(16), nn.ReLU())
        self.block = nn.Sequential(nn.Conv2d(16, 16, 3, padding=1), nn.BatchNorm2d(16), nn.ReLU(),
                                   nn.Conv2d(16, 16, 3, padding=1), nn.BatchNorm2d(16))
        self.theta, self.phi, self.g = nn.Conv2d(16, 8, 1), nn.Conv2d(16, 8, 1), nn.Conv2d(16, 8, 1)
        self.out, self.fc = nn.Conv2d(8, 16, 1), nn.Linear(16, CLASSES)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.stem(x)
        x = torch.relu(x + self.block(x))
        n, _, h, w = x.shape
        attn = torch.softmax(self.theta(x).flatten(2).transpose(1, 2) @ self.phi(x).flatten(2), -1)
        y = (attn @ self.g(x).flatten(2).transpose(1, 2)).transpose(1, 2).reshape(n, -1, h, w)
        return self.fc((x + self.out(y)).mean((2, 3)))


def test_a_non_local_block_s_products_leave_the_network_prunable() -> None:
    """A non-local block was refused (its products of two activations had no description op). Its inner channels are
    cut, theta's and phi's alike (the product sums over them) and g's with the output convolution's input, with the
    residual channels; the pruned network describes with its two matmuls and trains."""
    descs = prune_source(Source("nonlocal", "test", _NonLocalResNet), [3, 8, 8], [0, 40], "l1-norm", 2, seed=0)
    for desc in descs:
        assert "pruning_unpruned_groups" not in desc.extra
        assert [n.op for n in desc.nodes].count("matmul") == 2
        _train_step(desc)
    convs = {n.name: n.attrs for n in descs[1].nodes if n.op == "conv2d"}
    assert abs(descs[1].pruning_level - 40) <= 2.0
    assert convs["theta"]["out_channels"] == convs["phi"]["out_channels"] < 8
    assert convs["g"]["out_channels"] == convs["out"]["in_channels"] < 8
    assert convs["stem_0"]["out_channels"] == convs["out"]["out_channels"] < 16


class _SqueezeExcitation(nn.Module):
    """A convolution gated by a squeeze-excitation (two linear layers on its channels' means, a sigmoid), then another
    and the classifier; the gate reshaped to the map's ``[N, C, 1, 1]`` by ``spelling``."""

    def __init__(self, spelling: str) -> None:
        super().__init__()
        self.spelling = spelling
        self.c0, self.squeeze, self.excite = nn.Conv2d(3, 16, 3, padding=1), nn.Linear(16, 4), nn.Linear(4, 16)
        self.c1, self.fc = nn.Conv2d(16, 16, 3, padding=1), nn.Linear(16, CLASSES)  # in the order the forward runs

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = torch.relu(self.c0(x))
        b, c = y.shape[:2]
        pooled = y.mean((2, 3)) if self.spelling != "pooled view" else F.adaptive_avg_pool2d(y, 1).view(b, c)
        g = torch.sigmoid(self.excite(torch.relu(self.squeeze(pooled))))
        g = g[:, :, None, None] if self.spelling == "index" else g.view(b, c, 1, 1) if self.spelling == "view" \
            else g.view(-1, c, 1, 1)
        return self.fc(torch.relu(self.c1(y * g)).mean((2, 3)))


def _shapes(desc) -> list[tuple[str, list[int]]]:
    return [(n.op, n.output_shape) for n in desc.nodes]


@pytest.mark.parametrize("spelling", ["index", "view", "pooled view"])
def test_a_rebuilt_squeeze_excitation_gate_prunes_as_its_module(spelling: str) -> None:
    """The rebuild reshaped the gate to a literal ``[16, 1, 1]`` (and the pooled map to ``[16]``), so that no cut of
    the gated channels ran: the rebuilt network left that group whole ("does not follow whole") and reached the level
    by the other convolution alone. Its reshapes keep the channel count as the module's own call reads it now: the
    rebuilt network computes what the module does, and pruned it has the module's pruned shapes at every level."""
    from perf4sight.ir.from_torch import describe
    from perf4sight.ir.to_torch import build_module

    torch.manual_seed(0)
    module = _SqueezeExcitation(spelling).eval()
    desc = describe(module, SHAPE, "se")
    assert "reshape" in {n.op for n in desc.nodes}
    rebuilt = build_module(desc).eval()
    for new, old in zip(rebuilt.parameters(), module.parameters(), strict=True):
        new.data.copy_(old.data)
    x = torch.randn(2, *SHAPE)
    assert torch.allclose(rebuilt(x), module(x), atol=1e-5)
    levels = [10, 30]
    theirs = prune_source(Source("se", "test", lambda: _SqueezeExcitation(spelling)), SHAPE, levels, "l1-norm", 2, 0)
    mine = prune_source(Source("se", "test", lambda: build_module(desc)), SHAPE, levels, "l1-norm", 2, 0)
    for a, b in zip(theirs, mine, strict=True):
        assert "pruning_unpruned_groups" not in b.extra
        assert b.pruning_level == a.pruning_level and b.params == a.params
        assert _shapes(b) == _shapes(a)
        assert [n.attrs["out_channels"] for n in b.nodes if n.op == "conv2d"][0] < 16  # the gated channels cut
        _train_step(b)


def test_a_rebuilt_torchvision_squeeze_excitation_prunes_as_the_zoo_network() -> None:
    """torchvision's gate (1x1 convolutions on a pooled [C, 1, 1] map, no reshape) prunes alike rebuilt and not."""
    from perf4sight.ir.from_torch import describe
    from perf4sight.ir.to_torch import build_module
    from perf4sight.networks.zoo import build_zoo_model

    shape = [3, 32, 32]
    desc = describe(build_zoo_model("mobilenet_v3_small", CLASSES, shape), shape, "m")
    zoo = Source("m", "test", lambda: build_zoo_model("mobilenet_v3_small", CLASSES, shape))
    (theirs,) = prune_source(zoo, shape, [30], "l1-norm", 4, 0)
    (mine,) = prune_source(Source("m", "test", lambda: build_module(desc)), shape, [30], "l1-norm", 4, 0)
    assert mine.params == theirs.params and _shapes(mine) == _shapes(theirs)
