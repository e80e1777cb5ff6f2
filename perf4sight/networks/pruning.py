"""Structured (filter/channel) pruning to a target share of parameters removed.

Coupled channels (residual adds, concatenations, depthwise and grouped convolutions) are
found once per network by torch-pruning's dependency graph (``prune_plan``) and removed
together, so every pruned network stays valid. A *level* is the percentage of the unpruned
network's trainable parameters removed (0 = unpruned, at most 99). Each prunable group ``g``
(one set of coupled channels, in removable units: single channels, or for a grouped
convolution one local index across all its groups) has a fixed removal order (its ranking)
and a weight ``w_g``; its ``k``-th unit goes at scale ``k / (w_g * U_g)`` (``U_g`` units), up
to ``max_g`` units, which keep ``min_channels`` in the root layer and at least one channel in
every layer the group touches. Sorting all these removals by scale (ties: earlier layers
first) gives one sequence along which the parameter count falls monotonically; the search
bisects it, counting parameters analytically (or on a shapes-only ``meta`` copy), and returns
the achievable level closest to the target, one unit of one group apart. Rankings are fixed
on the unpruned weights, so the channels removed at a higher level include those removed
at a lower one. ``PruningPlan`` does the tracing once and cuts any number of levels.

Strategies (``STRATEGIES``): ``l1-norm`` ranks a group's units by the L1 norm of the root
layer's filters (smallest first) and prunes every group alike; ``random`` ranks them by a
seeded permutation; ``random-weighted`` also draws per-group weights that favour early or
late layers (the side drawn per network, recorded as ``pruning_bias``).

Left alone, with the reason (counted in ``extra["pruning_unpruned_groups"]``): the
classifier's outputs (the last conv/linear layer run); in torchvision's ShuffleNetV2,
channels that pass through the channel shuffle (torch-pruning cannot follow it), so only
the inner channels of each branch and the last 1x1 convolution are pruned; channels that a slice
(``y[:, :16]``; not one of the whole dimension), split, chunk or unbind takes apart at bounds the model's code
fixes (a cut would move channels across them, and the cut network's forward would fail); grouped
convolutions whose channels cannot be removed uniformly per group; the embedding width of an
attention layer (a ViT's whole token width: its heads would have to shrink alike, and the model
reshapes by a width attribute of its own), so a ViT's MLPs are pruned; a grouped (not depthwise) convolution of
weight_norm or spectral_norm (other such layers are cut by ``prune_plan._normed_cut``). A parameter outside any
layer (ConvNeXt's layer scale) is cut with the channels it multiplies. Networks with grouped
convolutions record ``extra["grouped_conv_pruning"] = "uniform per group"``.
"""
from __future__ import annotations

import bisect
import contextlib
import sys
import zlib
from dataclasses import dataclass, field
from typing import Any, Iterator
from unittest import mock

import numpy as np
import torch
import torch.nn.functional as F
import torch_pruning as tp
from torch import nn

from perf4sight.config import PRUNING_STRATEGIES
from perf4sight.errors import UserError
from perf4sight.ir.from_torch import forward_error, has_lazy_parameters
from perf4sight.ir.torch_trace import _meta_twin
from perf4sight.ir.fx_values import einsum_operands
from perf4sight.ir.torch_modules import spectral_norm_form, weight_norm_form
from perf4sight.networks import prune_plan as pp

__all__ = ["STRATEGIES", "TOLERANCE", "PrunedModel", "PruningPlan", "UnreachableLevel", "prune_model", "check_level",
           "count_parameters"]

STRATEGIES: tuple[str, ...] = PRUNING_STRATEGIES
#: The achieved level should lie within this many percentage points of the target; more than
#: twice this is a ``UserError``.
TOLERANCE = 1.0


class Unprunable(UserError):
    """A network torch-pruning cannot follow (a Swin or MaxViT transformer, a grouped transposed convolution, a pixel
    shuffle or unshuffle): its level 0 alone can be made."""


class UnreachableLevel(UserError):
    """A pruning level a network cannot reach within ``2 * TOLERANCE`` points: beyond the most it reaches
    (``min_channels`` stops it first), or between two of its pruning steps (a step cuts whole groups of coupled
    channels). ``achieved`` is the closest level it can reach (percent of parameters removed); ``reason`` says why
    in words, e.g. "it reaches 27.5% at most"."""

    def __init__(self, message: str, achieved: float, reason: str = "") -> None:
        super().__init__(message)
        self.achieved = achieved
        self.reason = reason


def _shufflenet_block_trace(self: nn.Module, x: torch.Tensor) -> torch.Tensor:
    """ShuffleNetV2 block as torch-pruning sees it: the shuffle left out, chunk as a sized split.

    torch-pruning cannot follow ``channel_shuffle`` and misreads ``chunk``; every group that
    touches the block's split or concatenation is therefore left unpruned (see ``PruningPlan``).
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

def _shuffles_channels(module: nn.Module) -> bool:
    """Whether ``module`` is a rebuilt description (``ir.to_torch.build_module``) that shuffles channels as ShuffleNet
    does: a reshape into channel groups (five dimensions with the batch's) whose second and third dimensions are then
    swapped. torch-pruning's dependency search did not end on a ShuffleNetV2 description (9 minutes, 16 GB); a
    module's own view-and-transpose shuffle prunes (torchvision's blocks get a stand-in, :data:`_TRACE_STAND_INS`)."""
    import torch.fx as fx

    from perf4sight.ir.to_torch import batch_reshape  # the reshape of a rebuilt description

    if not isinstance(module, fx.GraphModule):
        return False
    for n in module.graph.nodes:
        if n.target not in (torch.transpose, "transpose") or len(n.args) < 3 or {n.args[1], n.args[2]} != {1, 2}:
            continue
        source = n.args[0]
        if isinstance(source, fx.Node) and source.target is batch_reshape and len(source.args[1]) == 4:
            return True
    return False


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


class _CircularPadsAsConstant(torch.overrides.TorchFunctionMode):
    """While it is on, a circular pad (``F.pad(..., mode='circular')``: a convolution's of padding_mode 'circular',
    nn.CircularPad2d's) runs as a constant pad of the same pads: the channels pass either one unchanged, and the
    circular pad's backward graph (a chain of in-place copies into slices of its output, each reading the output
    again) kept torch-pruning's dependency search running without end (over 10 minutes on a four-convolution
    network)."""

    def __torch_function__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        kwargs = dict(kwargs or {})
        if func is F.pad and (args[2:3] or [kwargs.get("mode")])[0] == "circular":
            args, kwargs = args[:2], {k: v for k, v in kwargs.items() if k not in ("mode", "value")}
        return func(*args, **kwargs)


@contextlib.contextmanager
def _trace_stand_ins(calls: list[str]) -> Iterator[None]:
    """Swap in the stand-in forwards of ``_TRACE_STAND_INS``, recording which ones ran, and circular pads'
    (:class:`_CircularPadsAsConstant`). A class whose module this process has not imported has no instance to trace:
    it is left alone, and its module (torchvision's: with ``torch._dynamo``, 2-3 s) not imported for it."""
    with contextlib.ExitStack() as stack:
        stack.enter_context(_CircularPadsAsConstant())
        for module_path, cls_name, forward in _TRACE_STAND_INS:
            cls = getattr(sys.modules.get(module_path), cls_name, None)
            if cls is None:
                continue

            def traced(self: nn.Module, *args: Any, _f: Any = forward, _n: str = cls_name) -> Any:
                calls.append(_n)
                return _f(self, *args)
            stack.enter_context(mock.patch.object(cls, "forward", traced))
        yield


#: torch-pruning's ops that take a tensor apart at positions the model's code fixes (``y[:, :16]``, ``torch.split``,
#: ``chunk``, ``unbind``): a cut group's channels would move across those bounds.
_TAKING_APART = frozenset({tp.ops.OPTYPE.SLICE, tp.ops.OPTYPE.SPLIT, tp.ops.OPTYPE.UNBIND})


def _takes_apart(node: Any) -> bool:
    """Whether torch-pruning's dependency-graph node ``node`` is a slice, split or unbind, but for a slice that keeps
    its whole dimension (from 0, step 1, to its end or past it: GhostNet's ``[:, :oup]`` of ``oup`` channels), which
    keeps it whole when the dimension shrinks."""
    if node.type not in _TAKING_APART:
        return False
    if node.type != tp.ops.OPTYPE.SLICE:
        return True
    m = node.module
    sizes = getattr(node.grad_fn, "_saved_self_sym_sizes", None)
    whole = sizes is not None and m.start in (0, None) and m.step in (1, None) and (
        m.end is None or m.end >= int(sizes[m.dim]))
    return not whole


def _halves_channels(node: Any) -> bool:
    """Whether torch-pruning's dependency-graph node ``node`` is a GLU along the channels (torch's ``GluBackward0``):
    along dim 1 (a map's channels, a vector's features), or along the last dim of tokens' features ([N, T, F]: a
    gated MLP's ``F.glu(fc(tokens), -1)``, one of a map's patches) or of a linear layer's (a channels-last map's). It
    multiplies channel ``i`` by the sigmoid of channel ``i + C / 2``, where torch-pruning, which reads it as an
    elementwise op, would cut the same indices of its input and its output."""
    if type(node.grad_fn).__name__ != "GluBackward0":
        return False
    rank = len(node.grad_fn._saved_self.shape)
    dim = pp._saved_dims(node.grad_fn)[0] % rank  # saved unsigned: -1 as 2 ** 64 - 1, 0 modulo a rank of 3
    return dim == 1 or (dim == rank - 1 and (rank == 3 or _next_to_a_linear_layer(node)))


#: torch-pruning's node types that keep a tensor's channels where they are (an activation, a norm over them, an RMS
#: norm's pruner of our own): a linear layer reached through them reads or writes the same last dimension.
_CHANNEL_KEEPING = frozenset({tp.ops.OPTYPE.ELEMENTWISE, tp.ops.OPTYPE.LN, tp.ops.OPTYPE.CUSTOMIZED})


def _next_to_a_linear_layer(node: Any) -> bool:
    """Whether a linear layer writes ``node``'s input or reads its output, through nodes that keep the channels in
    place (:data:`_CHANNEL_KEEPING`): then its last dimension holds the features torch-pruning cuts."""
    todo, seen = list(node.inputs) + list(node.outputs), {node}
    while todo:
        near = todo.pop()
        if near in seen:
            continue
        seen.add(near)
        if near.type == tp.ops.OPTYPE.LINEAR:
            return True
        if near.type in _CHANNEL_KEEPING:
            todo += list(near.inputs) + list(near.outputs)
    return False


#: Attention modules torch-pruning cannot follow, whose layers' weights they read directly (Swin) or whose heads
#: they reshape by widths of their own (MaxViT): its dependency graph of a Swin transformer grew past this machine's
#: 24 GiB (torch-pruning 1.6, swin_t at 64x64).
_UNPRUNABLE = frozenset({"ShiftedWindowAttention", "ShiftedWindowAttentionV2", "RelativePositionalMultiHeadAttention"})


class _UnprunableCalls(torch.overrides.TorchFunctionMode):
    """While it is on, the calls a forward runs that torch-pruning cannot follow, each as (what, why) in ``seen``: a
    pixel shuffle or unshuffle (the layers, the calls), and an einsum of the module's own parameter."""

    def __init__(self) -> None:
        super().__init__()
        self.seen: list[tuple[str, str]] = []

    def __torch_function__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        if func in (torch.pixel_shuffle, torch.pixel_unshuffle):
            self.seen.append((f"a {func.__name__}", "torch-pruning cuts the channels around it one by one, as if it "
                              "kept them: the pruned network's shuffle or the convolution after it refuses its channels"))
        elif func is torch.einsum and any(isinstance(a, nn.Parameter) for a in einsum_operands(args)):
            self.seen.append(("an einsum of its own parameter", "torch-pruning's index maps grow without bound on "
                              "it: gigabytes within seconds"))
        return func(*args, **(kwargs or {}))


def _execution_order(model: nn.Module, example: torch.Tensor) -> tuple[list[nn.Module], Any, set[int]]:
    """Conv (transposed too) and linear modules in the order a forward pass runs them, what the forward returned,
    and the ids of every module it called."""
    order: list[nn.Module] = []
    called: set[int] = set()

    def ran(mod: nn.Module, _inputs: Any, _output: Any) -> None:
        called.add(id(mod))
        if isinstance(mod, (nn.Conv2d, nn.Linear, nn.ConvTranspose2d)):
            order.append(mod)
    hooks = [m.register_forward_hook(ran) for m in model.modules()]
    try:
        with torch.no_grad():
            out = model(example)
    finally:
        for h in hooks:
            h.remove()
    return order, out, called


class _Twin:
    """A weightless copy of a network on the meta device (its tied weights still tied), and its layer of each of the
    network's: its forward calls the same layers in the same order, and torch-pruning finds the same groups in it,
    shapes being all they read."""

    def __init__(self, model: nn.Module) -> None:
        self.model = _meta_twin(model)
        mine = dict(self.model.named_modules())
        self._of = {id(m): mine[name] for name, m in model.named_modules()}
        self._back = {id(mine[name]): m for name, m in model.named_modules()}

    def of(self, module: nn.Module) -> nn.Module:
        """The twin's layer of the network's ``module``."""
        return self._of[id(module)]

    def back(self, module: nn.Module) -> nn.Module:
        """The network's layer of the twin's ``module``."""
        return self._back[id(module)]


def _twin(model: nn.Module) -> _Twin | None:
    """``model``'s :class:`_Twin`, where its forward surely calls the same layers on the meta device: every layer
    torch's or torchvision's (a model of the user's own code may keep state its forward changes), none lazy (a first
    forward makes their weights, drawing random numbers), and torch's meta kernels loaded (their first run imports
    ``torch._dynamo``, 2-3 s: torchvision's import has); else None."""
    if "torch._dynamo" not in sys.modules or has_lazy_parameters(model) or not all(
            type(m).__module__.split(".")[0] in ("torch", "torchvision") for m in model.modules()):
        return None
    return _Twin(model)


def _execution_order_on(twin: _Twin | None, model: nn.Module, example: torch.Tensor) -> tuple[
        list[nn.Module], Any, set[int], list[tuple[str, str]]]:
    """:func:`_execution_order` of ``model`` and the calls torch-pruning cannot follow (:class:`_UnprunableCalls`),
    from a forward of ``twin`` where there is one and it runs (its layers read back as ``model``'s), else of
    ``model``, whose error is the one raised."""
    if twin is not None:
        try:
            with _UnprunableCalls() as unprunable:
                order, out, called = _execution_order(twin.model, example.to("meta"))
            return [twin.back(m) for m in order], out, {id(twin.back(m)) for m in twin.model.modules()
                                                        if id(m) in called}, unprunable.seen
        except Exception:  # noqa: BLE001 - an op without a meta kernel, a forward reading values: run for real
            pass
    with _UnprunableCalls() as unprunable:
        order, out, called = _execution_order(model, example)
    return order, out, called, unprunable.seen


def _refuse_grouped_transposed(traced: nn.Module, order: list[nn.Module], network: str) -> None:
    """:class:`Unprunable` where the forward runs a grouped transposed convolution (of ``order``, what it ran), whose
    weight torch-pruning cuts along the wrong dimension; one the forward never runs is left as it is."""
    ran = {id(m) for m in order}
    grouped_up = [n for n, m in traced.named_modules()
                  if isinstance(m, nn.ConvTranspose2d) and m.groups > 1 and id(m) in ran]
    if grouped_up:
        raise Unprunable(f"{network}: its grouped transposed convolution '{grouped_up[0]}' cannot be pruned "
                         "(torch-pruning cuts such a layer's weight, [Cin, Cout / groups, kh, kw], along Cout / "
                         "groups by indices of all Cout channels); predict it as it is")


def _unreached_parameters(meta: nn.Module, example: torch.Tensor) -> int:
    """How many trainable parameters of ``meta`` (a shapes-only copy of the network) its forward on ``example`` never
    reaches: those autograd gives no gradient (a spare head, a layer of another configuration). No cut touches them
    and no description holds them, so a level leaves them out."""
    params = [p for p in meta.parameters() if p.requires_grad]
    try:
        with torch.enable_grad():
            outs = [t for t in _tensors_in(meta(example)) if t.requires_grad]
            grads = torch.autograd.grad([t.sum() for t in outs], params, allow_unused=True) if outs else ()
    except Exception:  # noqa: BLE001 - an op without a meta kernel or backward: every parameter counted, as before
        return 0
    return sum(p.numel() for p, g in zip(params, grads) if g is None)


def _tensors_in(value: Any) -> list[torch.Tensor]:
    """The tensors of a forward's output: itself, or those its tuple, list or dict holds."""
    if isinstance(value, torch.Tensor):
        return [value]
    items = value.values() if isinstance(value, dict) else value if isinstance(value, (tuple, list)) else ()
    return [t for v in items for t in _tensors_in(v)]


def _holds_a_tensor(value: Any) -> bool:
    """Whether a forward's output is a tensor, or holds one (a tuple, list or dict of them)."""
    if isinstance(value, torch.Tensor):
        return True
    items = value.values() if isinstance(value, dict) else value if isinstance(value, (tuple, list)) else ()
    return any(_holds_a_tensor(v) for v in items)


def _l1_scores(root: nn.Module) -> np.ndarray:
    """L1 norm of each output filter of a conv/linear layer (a transposed convolution's weight, ungrouped, is
    ``[Cin, Cout, kh, kw]``: its filters along the second dimension)."""
    w = root.weight.detach()
    if isinstance(root, nn.ConvTranspose2d):
        w = w.transpose(0, 1)
    return w.abs().reshape(w.shape[0], -1).sum(dim=1).numpy()


class PruningPlan:
    """One network's coupled groups and their removal orders, traced once; ``prune(level)`` per level.

    ``input_shape`` is ``[C, H, W]`` (used to trace the dependency graph); ``seed`` and
    ``network`` seed the random choices. ``base`` is never modified.
    """

    def __init__(self, base: nn.Module, input_shape: list[int], strategy: str = "l1-norm", min_channels: int = 4,
                 seed: int = 0, network: str = "network") -> None:
        _check_strategy(strategy)
        if min_channels < 1:
            raise UserError(f"{network}: min_channels must be >= 1, got {min_channels}")
        if any(type(m).__name__ in _UNPRUNABLE for m in base.modules()):
            raise Unprunable(f"{network}: a Swin or MaxViT transformer cannot be pruned (torch-pruning cannot follow "
                            "its windowed attention, which reads its layers' weights directly or reshapes its heads "
                            "by widths of its own); predict or compare it as it is, by its zoo name")
        if _shuffles_channels(base):
            raise Unprunable(f"{network}: a description with a channel shuffle (a reshape into channel groups, then "
                             "their transpose) cannot be pruned (torch-pruning's dependency search does not end on "
                             "it); prune the zoo network or the module it came from, or predict this as it is")
        self.base, self.network, self.strategy, self.min_channels = base, network, strategy, min_channels
        self._modes = {name: m.training for name, m in base.named_modules()}  # the caller's (a batch norm frozen)
        total = count_parameters(base)
        if total == 0:  # a level is a share of the parameters: none to share
            raise UserError(f"{network}: has no parameters to prune (a network with no layer that learns)")
        self.extra: dict[str, Any] = {}
        self._cache: dict[tuple[int, ...], float] = {}
        example = torch.randn(1, *input_shape, generator=torch.Generator().manual_seed(0))  # not the caller's
        traced = pp.module_copy(base).eval()
        twin = _twin(traced)  # its forwards without compute, where they run the same: a zoo network's at 224x224
        try:  # took a second (resnet50: 2-4 s) on a 2-core host, most of a --prune-to-fit's first run of it
            order, out, called, unprunable = _execution_order_on(twin, traced, example)
        except Exception as exc:  # noqa: BLE001 - the model's own forward: any error is the user's model
            raise forward_error(network, input_shape, exc) from None
        if unprunable:
            what, why = unprunable[0]
            raise Unprunable(f"{network}: a network with {what} cannot be pruned ({why}); predict it as it is")
        _refuse_grouped_transposed(traced, order, network)
        if not _holds_a_tensor(out):  # torch-pruning's trace would fail on it with a traceback
            raise UserError(f"{network}: the model returns {type(out).__name__} {out!r:.40}, not a tensor; a "
                            "description follows one tensor output (return the logits)")
        calls: list[str] = []

        def skip(group: Any) -> str:
            if calls and any(d.target.type in (tp.ops.OPTYPE.CONCAT, tp.ops.OPTYPE.SPLIT) for d, _ in group):
                return f"channels through an untraceable {calls[0]} (e.g. channel shuffle)"
            if any(isinstance(d.target.module, nn.MultiheadAttention) for d, _ in group):
                return "an attention's embedding width"  # its heads, and a ViT's own width attribute, stay
            if any(_takes_apart(d.target) for d, _ in group):
                return "channels a slice, split or unbind takes apart (at bounds of the model's own)"
            if any(_halves_channels(d.target) for d, _ in group):
                return "channels a GLU halves (a channel and its gate, half the channels apart)"
            if any(pp.is_grouped_conv(d.target.module) and (weight_norm_form(d.target.module)
                                                           or spectral_norm_form(d.target.module)) for d, _ in group):
                # cut by prune_plan._normed_cut but for a grouped (not depthwise) convolution's uniform cut
                return "a grouped weight_norm or spectral_norm convolution's channels"
            return ""
        groups, notes = None, None
        if twin is not None:  # the twin's layers bear the names of traced's, which are all the groups hold
            try:
                with _trace_stand_ins(calls):
                    groups, notes = pp.find_groups(twin.model, example.to("meta"), [twin.of(m) for m in order[-1:]],
                                                   skip)
            except Exception:  # noqa: BLE001 - an op without a meta kernel: traced itself, as before
                calls.clear()
        if groups is None:
            with _trace_stand_ins(calls):
                groups, notes = pp.find_groups(traced, example, order[-1:], skip)
        names = {m: n for n, m in traced.named_modules()}
        position = {names[m]: i for i, m in enumerate(order)}
        groups.sort(key=lambda g: position.get(g.root, len(position)))
        self._order_groups(groups, traced, strategy, seed, network)
        pp.set_limits(groups, traced, min_channels)
        self._meta = pp.to_meta_keeping_ties(traced)
        uncalled = any(id(m) not in called and any(True for _ in m.parameters(recurse=False))
                       for m in traced.modules())  # weights of a layer never called: perhaps read directly
        self.unused = _unreached_parameters(self._meta, example.to("meta")) if uncalled else 0
        self.p0 = total - self.unused  # a description's count: the parameters the forward reads
        if self.p0 == 0:
            raise UserError(f"{network}: has no parameters to prune (its forward reads none of its layers' weights)")
        groups, unfollowed = pp.followed_groups(groups, self._meta, example.to("meta"))
        if unfollowed:
            notes[pp.UNFOLLOWED] += unfollowed
        self.groups = groups
        if notes:
            self.extra["pruning_unpruned_groups"] = dict(sorted(notes.items()))
        if any(len(u.roots) > 1 for g in groups for u in g.units):
            self.extra["grouped_conv_pruning"] = "uniform per group"
        self._fast_count = pp.make_counter(groups, self._meta)
        # One event per unit removed: (scale at which it goes, group position); ties go early layers first.
        events = sorted((k / (g.weight * len(g.units)), i) for i, g in enumerate(groups) if g.weight > 0
                        for k in range(1, g.max_removed + 1))
        self._event_group = np.array([i for _, i in events], dtype=np.int64)

    def _order_groups(self, groups: list[pp.CoupledGroup], traced: nn.Module, strategy: str, seed: int,
                      network: str) -> None:
        rng = _rng(seed, network)
        n = len(groups)
        weights = np.ones(n)
        if strategy == "random-weighted" and n:
            bias = "early" if rng.random() < 0.5 else "late"
            self.extra["pruning_bias"] = bias
            depth = np.linspace(0.0, 1.0, n) if n > 1 else np.zeros(1)
            favoured = 1.0 - depth if bias == "early" else depth
            weights = rng.uniform(0.25, 1.0, n) * (1.0 + 2.0 * favoured)
        modules = dict(traced.named_modules())
        for g, w in zip(groups, weights):
            g.weight = float(w)
            if strategy == "l1-norm":
                scores = _l1_scores(modules[g.root])
                unit_scores = np.array([scores[u.roots].sum() for u in g.units])
                g.order = [int(i) for i in np.argsort(unit_scores, kind="stable")]
            else:
                g.order = [int(i) for i in rng.permutation(len(g.units))]

    def _counts(self, n: int) -> tuple[int, ...]:
        """Units removed per group after the first ``n`` events."""
        return tuple(int(c) for c in np.bincount(self._event_group[:n], minlength=len(self.groups)))

    def _level(self, counts: tuple[int, ...]) -> float:
        """Percent of parameters removed for these per-group unit counts (shapes-only copy)."""
        if counts not in self._cache:
            if self._fast_count is not None:
                params = self.p0 - self._fast_count(list(counts))
            else:
                params = count_parameters(pp.cut(self._meta, pp.removal(self.groups, list(counts)))) - self.unused
            self._cache[counts] = 100.0 * (1 - params / self.p0)
        return self._cache[counts]

    def prune(self, level: float, meta: bool = False) -> PrunedModel:
        """A pruned copy of the network with ``level`` % of its parameters removed (closest achievable).

        ``meta=True`` cuts a shapes-only copy on the ``meta`` device (no weights; enough to
        describe the network, far faster for large networks).

        Raises ``UserError`` for a level outside 0..99, and ``UnreachableLevel`` for one that cannot be
        reached within ``2 * TOLERANCE`` points (e.g. because of ``min_channels``).
        """
        level = check_level(level, f"{self.network}: pruning level")
        source = self._meta if meta else self.base
        if level == 0:
            return PrunedModel(self._in_modes(pp.module_copy(source)), 0.0, 0.0, self.p0, self.p0, dict(self.extra))
        model = self._in_modes(pp.cut(source, pp.removal(self.groups, list(self.counts_at(level)))))
        params = count_parameters(model) - self.unused
        return PrunedModel(model, level, self.achieved_level(params), params, self.p0, dict(self.extra))

    def counts_at(self, level: float) -> tuple[int, ...]:
        """Units removed per group (in the order of :attr:`groups`) for ``level`` percent (above 0, checked), the
        closest achievable; ``UnreachableLevel`` where that is more than ``2 * TOLERANCE`` points away."""
        last = len(self._event_group)
        n = bisect.bisect_left(range(last + 1), True, key=lambda j: self._level(self._counts(j)) >= level)
        candidates = [self._counts(j) for j in (n - 1, n) if 0 <= j <= last]
        counts = min(candidates, key=lambda c: abs(self._level(c) - level))
        achieved = self._level(counts)
        if abs(achieved - level) > 2 * TOLERANCE:
            if len(candidates) == 1:  # beyond the last step
                reason, fix = f"it reaches {achieved:.1f}% at most", "lower the level or min_channels"
            else:
                below, above = (self._level(c) for c in candidates)
                reason = f"its pruning steps go from {below:.1f}% to {above:.1f}% there"
                fix = "ask for a level near one of those"
            raise UnreachableLevel(f"{self.network}: cannot reach pruning level {level:g}% with strategy "
                                   f"{self.strategy} and min_channels={self.min_channels} ({reason}); {fix}",
                                   achieved, reason)
        return counts

    def achieved_level(self, params: int) -> float:
        """The level a cut leaving ``params`` of the parameters the forward reads achieves (percent, 3 decimals)."""
        return round(100.0 * (1 - params / self.p0), 3)

    def _in_modes(self, model: nn.Module) -> nn.Module:
        """``model`` (a copy of the network, pruned or not) with each layer in the mode the caller's network had it
        (the shapes-only copy is of one traced in evaluation): a batch norm frozen in evaluation in a network in
        training is described so."""
        for name, m in model.named_modules():
            m.training = self._modes.get(name, m.training)
        return model


def prune_model(base: nn.Module, input_shape: list[int], level: float, strategy: str = "l1-norm",
                min_channels: int = 4, seed: int = 0, network: str = "network") -> PrunedModel:
    """Prune a deep copy of ``base`` so that ``level`` % of its parameters are gone.

    ``input_shape`` is ``[C, H, W]``; for many levels of one network build a ``PruningPlan``
    once instead. Raises ``UserError`` for a bad level or strategy, or when the level cannot
    be reached within ``2 * TOLERANCE`` points (e.g. because of ``min_channels``).
    """
    level = check_level(level, f"{network}: pruning level")
    _check_strategy(strategy)
    if level == 0:
        p0 = count_parameters(base)
        return PrunedModel(pp.module_copy(base), 0.0, 0.0, p0, p0)
    return PruningPlan(base, input_shape, strategy, min_channels, seed, network).prune(level)
