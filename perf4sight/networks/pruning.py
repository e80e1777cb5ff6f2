"""Structured (filter/channel) pruning to a target share of parameters removed.

Coupled channels (residual adds, concatenations, depthwise convolutions) are found by
torch-pruning's dependency graph and removed together, so the pruned network stays valid.
A *level* is the percentage of the unpruned network's trainable parameters removed
(0 = unpruned, at most 99). Each prunable group ``g`` (one set of coupled channels) has a
fixed removal order (its ranking) and a weight ``w_g``; at scale ``s`` it loses its first
``min(floor(s * w_g * C_g), C_g - min_channels)`` channels. The search walks ``s`` upwards
(secant steps, pruning in place) until the achieved level is within ``TOLERANCE`` points
of the target; rankings are fixed on the unpruned weights, so the channels removed at a
higher level include those removed at a lower one.

Strategies (``STRATEGIES``): ``l1-norm`` ranks a group's channels by the L1 norm of the
root layer's filters (smallest first) and prunes every group alike; ``random`` ranks them
by a seeded permutation; ``random-weighted`` also draws per-group weights that favour early
or late layers (the side drawn per network, recorded as ``pruning_bias``).

Left alone, with the reason: the classifier's outputs (the last conv/linear layer run);
groups touching a grouped, non-depthwise convolution (torch-pruning cannot keep its
channel groups consistent); in torchvision's ShuffleNetV2, channels that pass through the
channel shuffle (torch-pruning cannot follow it), so only the inner channels of each
branch and the last 1x1 convolution are pruned.
"""
from __future__ import annotations

import contextlib
import copy
import math
import zlib
from dataclasses import dataclass, field
from typing import Any, Iterator
from unittest import mock

import numpy as np
import torch
import torch_pruning as tp
from torch import nn

from perf4sight.errors import UserError

__all__ = ["STRATEGIES", "TOLERANCE", "PrunedModel", "prune_model", "check_level", "count_parameters"]

STRATEGIES: tuple[str, ...] = ("l1-norm", "random", "random-weighted")
#: The achieved level lies within this many percentage points of the target.
TOLERANCE = 1.0
_MAX_STEPS = 60  # secant steps per attempt
_MAX_ATTEMPTS = 6  # restarts after overshooting the tolerance window


def _shufflenet_block_trace(self: nn.Module, x: torch.Tensor) -> torch.Tensor:
    """ShuffleNetV2 block as torch-pruning sees it: the shuffle left out, chunk as a sized split.

    torch-pruning cannot follow ``channel_shuffle`` and misreads ``chunk``; every group that
    touches the block's split or concatenation is therefore left unpruned (see ``_State``).
    """
    if self.stride == 1:
        half = x.shape[1] // 2
        x1, x2 = torch.split(x, [half, x.shape[1] - half], dim=1)
        return torch.cat((x1, self.branch2(x2)), dim=1)
    return torch.cat((self.branch1(x), self.branch2(x)), dim=1)


#: Forward methods torch-pruning cannot trace: (module path, class, stand-in used while tracing).
_TRACE_STAND_INS: tuple[tuple[str, str, Any], ...] = (
    ("torchvision.models.shufflenetv2", "InvertedResidual", _shufflenet_block_trace),
)

@dataclass
class PrunedModel:
    """A pruned copy of a network; levels in percent of the unpruned parameter count."""

    module: nn.Module
    target_level: float
    achieved_level: float
    params: int
    params_unpruned: int
    extra: dict[str, Any] = field(default_factory=dict)


def count_parameters(module: nn.Module) -> int:
    """Trainable parameters (elements) of ``module``."""
    return sum(p.numel() for p in module.parameters() if p.requires_grad)


def check_level(level: float, where: str = "pruning level") -> float:
    """``level`` as a float if it lies in 0..99, else ``UserError``."""
    if isinstance(level, bool) or not isinstance(level, (int, float)) or not 0 <= level <= 99:
        raise UserError(f"{where}: {level!r} is outside 0..99 (percent of parameters removed)")
    return float(level)


def _check_strategy(strategy: str) -> None:
    if strategy not in STRATEGIES:
        raise UserError(f"unknown pruning strategy '{strategy}' (known: {', '.join(STRATEGIES)})")


def _rng(seed: int, network: str) -> np.random.Generator:
    """One stream per (seed, network): stable across runs and Python versions."""
    return np.random.default_rng([int(seed) & 0xFFFFFFFF, zlib.crc32(network.encode())])


@contextlib.contextmanager
def _trace_stand_ins(calls: list[str]) -> Iterator[None]:
    """Swap in the stand-in forwards of ``_TRACE_STAND_INS``, recording which ones ran."""
    with contextlib.ExitStack() as stack:
        for module_path, cls_name, forward in _TRACE_STAND_INS:
            try:
                cls = getattr(__import__(module_path, fromlist=[cls_name]), cls_name)
            except (ImportError, AttributeError):
                continue

            def traced(self: nn.Module, *args: Any, _f: Any = forward, _n: str = cls_name) -> Any:
                calls.append(_n)
                return _f(self, *args)
            stack.enter_context(mock.patch.object(cls, "forward", traced))
        yield


def _execution_order(model: nn.Module, example: torch.Tensor) -> list[nn.Module]:
    """Conv and linear modules in the order a forward pass runs them."""
    order: list[nn.Module] = []
    hooks = [m.register_forward_hook(lambda mod, i, o: order.append(mod))
             for m in model.modules() if isinstance(m, (nn.Conv2d, nn.Linear))]
    try:
        with torch.no_grad():
            model(example)
    finally:
        for h in hooks:
            h.remove()
    return order


def _is_grouped(module: nn.Module) -> bool:
    return isinstance(module, nn.Conv2d) and module.groups > 1 and not (
        module.groups == module.in_channels == module.out_channels)


def _l1_order(root: nn.Module) -> list[int]:
    """Output channels of a conv/linear layer, smallest filter L1 norm first (ties by index)."""
    w = root.weight.detach()
    scores = w.abs().reshape(w.shape[0], -1).sum(dim=1)
    return [int(i) for i in torch.argsort(scores, stable=True)]


class _Group:
    """One set of coupled channels: root layer, pruning function, ranking and state."""

    def __init__(self, root: nn.Module, fn: Any, order: list[int], weight: float, keep_min: int) -> None:
        self.root, self.fn, self.order, self.weight = root, fn, order, weight
        self.channels = len(order)
        self.max_removed = max(0, self.channels - keep_min)
        self.removed = 0

    def wanted(self, scale: float) -> int:
        return min(self.max_removed, int(math.floor(scale * self.weight * self.channels + 1e-9)))

    def next_scale(self) -> float:
        """Smallest scale at which this group loses one more channel (inf when saturated)."""
        if self.removed >= self.max_removed or self.weight <= 0:
            return math.inf
        return (self.removed + 1) / (self.weight * self.channels)


class _State:
    """A fresh copy of the network with its dependency graph and prunable groups."""

    def __init__(self, base: nn.Module, example: torch.Tensor, strategy: str, min_channels: int,
                 seed: int, network: str) -> None:
        self.model = copy.deepcopy(base).eval()
        order = _execution_order(self.model, example)
        classifier = order[-1:]
        calls: list[str] = []
        with _trace_stand_ins(calls):
            self.dg = tp.DependencyGraph().build_dependency(self.model, example_inputs=example)
        opaque = bool(calls)
        rng = _rng(seed, network)
        self.extra: dict[str, Any] = {}
        raw = []
        for group in self.dg.get_all_groups(ignored_layers=classifier, root_module_types=[nn.Conv2d, nn.Linear]):
            modules = [dep.target.module for dep, _ in group]
            if any(_is_grouped(m) for m in modules):
                continue
            if opaque and any(dep.target.type in (tp.ops.OPTYPE.CONCAT, tp.ops.OPTYPE.SPLIT) for dep, _ in group):
                continue
            raw.append(group)
        position = {m: i for i, m in enumerate(order)}
        raw.sort(key=lambda g: position.get(g[0].dep.target.module, len(position)))
        weights = self._weights(strategy, len(raw), rng)
        self.groups: list[_Group] = []
        for group, weight in zip(raw, weights):
            channels = len(group[0].idxs)
            if strategy == "l1-norm":
                order = _l1_order(group[0].dep.target.module)
            else:
                order = [int(i) for i in rng.permutation(channels)]
            self.groups.append(_Group(group[0].dep.target.module, group[0].dep.handler, order, float(weight),
                                      min(min_channels, channels)))

    def _weights(self, strategy: str, n: int, rng: np.random.Generator) -> np.ndarray:
        if strategy != "random-weighted" or n == 0:
            return np.ones(n)
        bias = "early" if rng.random() < 0.5 else "late"
        self.extra["pruning_bias"] = bias
        depth = np.linspace(0.0, 1.0, n) if n > 1 else np.zeros(1)
        favoured = 1.0 - depth if bias == "early" else depth
        return rng.uniform(0.25, 1.0, n) * (1.0 + 2.0 * favoured)

    def apply(self, scale: float) -> None:
        """Prune every group up to ``scale`` (never restores channels)."""
        for g in self.groups:
            want = g.wanted(scale)
            if want <= g.removed:
                continue
            alive = sorted(g.order[g.removed:])  # original ids still present, in tensor order
            drop = set(g.order[g.removed:want])
            idxs = [pos for pos, orig in enumerate(alive) if orig in drop]
            pruning_group = self.dg.get_pruning_group(g.root, g.fn, idxs=idxs)
            if not self.dg.check_pruning_group(pruning_group):
                g.max_removed = g.removed  # would empty a coupled layer: freeze this group
                continue
            pruning_group.prune()
            g.removed = want

    def next_event(self) -> float:
        return min((g.next_scale() for g in self.groups), default=math.inf)


def prune_model(base: nn.Module, input_shape: list[int], level: float, strategy: str = "l1-norm",
                min_channels: int = 4, seed: int = 0, network: str = "network") -> PrunedModel:
    """Prune a deep copy of ``base`` so that ``level`` % of its parameters are gone.

    ``input_shape`` is ``[C, H, W]`` (used to trace the dependency graph); ``seed`` and
    ``network`` seed the random choices. Raises ``UserError`` for a bad level or strategy,
    or when the level cannot be reached within ``TOLERANCE`` points (e.g. ``min_channels``).
    """
    level = check_level(level, f"{network}: pruning level")
    _check_strategy(strategy)
    if min_channels < 1:
        raise UserError(f"{network}: min_channels must be >= 1, got {min_channels}")
    p0 = count_parameters(base)
    if level == 0:
        return PrunedModel(copy.deepcopy(base), 0.0, 0.0, p0, p0)
    example = torch.randn(1, *input_shape)
    lo, hi = 0.0, math.inf
    best: tuple[float, _State] | None = None
    for _ in range(_MAX_ATTEMPTS):
        state = _State(base, example, strategy, min_channels, seed, network)
        done, lo, hi, achieved = _walk(state, p0, level, lo, hi)
        if best is None or abs(achieved - level) < abs(best[0] - level):
            best = (achieved, state)
        if done:
            break
    assert best is not None
    achieved, state = best
    if abs(achieved - level) > 2 * TOLERANCE:
        raise UserError(f"{network}: cannot reach pruning level {level:g}% with strategy {strategy} and "
                        f"min_channels={min_channels} (got {achieved:.1f}%); lower the level or min_channels")
    params = count_parameters(state.model)
    return PrunedModel(state.model, level, round(100.0 * (1 - params / p0), 3), params, p0, dict(state.extra))


def _walk(state: _State, p0: int, target: float, lo: float, hi: float) -> tuple[bool, float, float, float]:
    """Walk the scale up from ``lo``, pruning ``state`` in place.

    Returns ``(done, lo, hi, level)``: ``done`` is False after overshooting the window, with
    ``hi`` the overshooting scale, so the caller restarts from ``lo`` on a fresh copy.
    """
    def level() -> float:
        return 100.0 * (1 - count_parameters(state.model) / p0)

    scale = lo
    state.apply(scale)
    prev = (0.0, 0.0) if scale == 0 else None
    current = level()
    for _ in range(_MAX_STEPS):
        if abs(current - target) <= TOLERANCE:
            return True, lo, hi, current
        if current > target:
            return False, lo, scale, current
        lo = scale
        event = state.next_event()
        if event == math.inf:  # nothing left to prune
            return True, lo, hi, current
        if prev is not None and scale > prev[0] and current > prev[1]:
            slope = (current - prev[1]) / (scale - prev[0])
            guess = scale + (target - current) / slope
        else:  # first step: parameters shrink roughly with the square of the kept share
            guess = 0.9 * (1 - math.sqrt(1 - target / 100.0))
        if hi < math.inf:
            guess = min(guess, (lo + hi) / 2)
        prev = (scale, current)
        scale = max(guess, event)
        state.apply(scale)
        current = level()
    return True, lo, hi, current
