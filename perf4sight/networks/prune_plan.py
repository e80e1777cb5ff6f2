"""Coupled-channel groups of one network, found once, and pruned copies cut from them.

torch-pruning's dependency graph is traced once per network (the slow part: seconds for
densenet121). Each group (one set of coupled channels) is stored in the unpruned network's
coordinates: for every layer it touches, which of that layer's channel indices follow which
root channel. A pruned copy for any choice of removed root channels is then cut directly
from a deep copy of the unpruned network, each (layer, dimension) sliced once with the union
of what all groups remove from it; no graph is rebuilt or re-mapped between levels. Counting
the parameters of a candidate cut uses a copy on the ``meta`` device (shapes only, no data).

Grouped, non-depthwise convolutions (ResNeXt) are pruned *uniformly per group*: a unit of
removal is one local channel index taken out of every convolution group at once, so each
group keeps the same width and the cardinality (``groups``) is unchanged. Groups whose
channels cannot be cut that way, and groups torch-pruning cannot follow (ShuffleNetV2's channel
shuffle), are left unpruned and listed in ``notes``. A parameter outside any layer that a group
touches (ConvNeXt's layer scale, shape ``[C, 1, 1]``) is cut along the dimension torch-pruning
finds for it (its last one of size above 1) and set back on its module.
"""
from __future__ import annotations

import copy
import functools
import math
import signal
import threading
import warnings
from collections import Counter
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, Callable, Iterator

import numpy as np
import torch
import torch_pruning as tp
from torch import nn

from perf4sight.ir.from_torch import run_on_meta
from perf4sight.ir.torch_trace import hook_computed_weights

__all__ = ["Dep", "Unit", "CoupledGroup", "is_grouped_conv", "find_groups", "set_limits", "removal", "cut",
           "make_counter", "prune_grouped_in_channels", "followed_groups", "UNFOLLOWED", "to_meta_keeping_ties"]

Handler = Callable[[nn.Module, list[int]], nn.Module]


def is_grouped_conv(module: nn.Module) -> bool:
    """A convolution with groups > 1 that is not depthwise (in == out == groups)."""
    return isinstance(module, nn.Conv2d) and module.groups > 1 and not (
        module.groups == module.in_channels == module.out_channels)


def prune_grouped_in_channels(layer: nn.Module, idxs: list[int]) -> nn.Module:
    """Remove input channels ``idxs`` of a grouped conv; they must be the same local indices in every group."""
    per_group = layer.in_channels // layer.groups
    local = sorted({i % per_group for i in idxs})
    if len(idxs) != len(local) * layer.groups:
        raise ValueError(f"input channels {idxs} are not uniform across the {layer.groups} groups")
    keep = torch.tensor([j for j in range(per_group) if j not in set(local)], dtype=torch.long,
                        device=layer.weight.device)
    layer.in_channels -= len(idxs)
    layer.weight = nn.Parameter(torch.index_select(layer.weight, 1, keep))
    return layer


@dataclass
class Dep:
    """One layer dimension a group touches: ``targets[i]`` follows root channel ``roots[i]``."""

    module: str
    handler: Handler
    roots: np.ndarray
    targets: np.ndarray


@dataclass
class Unit:
    """The smallest removable piece of a group: one or more root channels removed together."""

    roots: np.ndarray


@dataclass
class CoupledGroup:
    """A prunable set of coupled channels in unpruned coordinates."""

    root: str
    channels: int  # root channels
    deps: list[Dep]
    units: list[Unit]
    max_removed: int = 0  # units; set by ``find_groups`` from min_channels
    order: list[int] = field(default_factory=list)  # unit removal order, set by the strategy
    weight: float = 1.0
    _cut_order: tuple[Any, list[tuple[np.ndarray, np.ndarray]]] | None = field(default=None, repr=False,
                                                                              compare=False)

    def removed_roots(self, k: int) -> np.ndarray:
        """Root channels gone when the first ``k`` units of ``order`` are removed."""
        if k <= 0:
            return np.zeros(0, dtype=np.int64)
        return np.concatenate([self.units[u].roots for u in self.order[:k]])

    def unit_places(self) -> np.ndarray:
        """Per root channel, the place of its unit in :attr:`order` (``len(order)`` for a unit not in it)."""
        places = np.full(self.channels, len(self.order), dtype=np.int64)
        for pos, u in enumerate(self.order):
            places[self.units[u].roots] = pos
        return places

    def cut_order(self) -> list[tuple[np.ndarray, np.ndarray]]:
        """Per dep, (the place in :attr:`order` of the unit of each (root, target) pair's root, ascending; the pairs'
        targets in that order): the targets of the pairs whose roots the first ``k`` units remove are the first
        ``searchsorted(places, k)``. Made once per order."""
        key = (tuple(self.order), tuple(map(id, self.deps)))
        if self._cut_order is None or self._cut_order[0] != key:
            places = self.unit_places()
            made = []
            for d in self.deps:
                at = places[d.roots]
                ranked = np.argsort(at, kind="stable")
                made.append((at[ranked], d.targets[ranked]))
            self._cut_order = key, made
        return self._cut_order[1]


def _stripes(module: nn.Module | None, handler: Handler) -> tuple[int, int] | None:
    """(channels, groups) of a layer dimension whose groups must lose the same local channels: a grouped conv's, or
    a group norm's of more than one group (torch requires its channels a multiple of its groups); None for others."""
    if is_grouped_conv(module):
        size = module.in_channels if handler is prune_grouped_in_channels else module.out_channels
        return size, module.groups
    if isinstance(module, nn.GroupNorm) and module.num_groups > 1:
        return module.num_channels, module.num_groups
    return None


def _units(deps: list[Dep], channels: int, modules: dict[str, nn.Module]) -> list[Unit] | None:
    """Root channels grouped so that every grouped conv and group norm loses whole local indices (one channel of
    each of its groups at a time), or None if impossible."""
    grouped = [(d, *shape) for d in deps for shape in [_stripes(modules.get(d.module), d.handler)] if shape]
    if not grouped:
        return [Unit(np.array([c])) for c in range(channels)]
    keys: dict[int, list[tuple[int, ...]]] = {c: [] for c in range(channels)}
    for d, size, groups in grouped:
        per_group = size // groups
        by_root: dict[int, set[int]] = {}
        for r, t in zip(d.roots.tolist(), d.targets.tolist()):
            by_root.setdefault(r, set()).add(t % per_group)
        for c in range(channels):
            keys[c].append(tuple(sorted(by_root.get(c, ()))))
    classes: dict[tuple, list[int]] = {}
    for c in range(channels):
        classes.setdefault(tuple(keys[c]), []).append(c)
    units = [Unit(np.array(v)) for v in classes.values()]
    for d, size, groups in grouped:  # each unit must remove whole stripes (same local index in every group)
        per_group = size // groups
        for u in units:
            got = set(d.targets[np.isin(d.roots, u.roots)].tolist())
            want = {j + g * per_group for j in {t % per_group for t in got} for g in range(groups)}
            if got != want:
                return None
    return units


def _max_removed(group: CoupledGroup, min_channels: int, dims: dict[tuple[str, Handler], int]) -> int:
    """Most units removable while the root keeps ``min_channels`` and no touched layer dimension empties."""
    unit_of = group.unit_places()
    limit = len(group.units)
    for i, d in enumerate(group.deps):
        size = dims[(d.module, d.handler)]
        need = min(min_channels, size) if (i == 0 or len(d.targets) >= size) else 1
        per_unit = np.bincount(unit_of[d.roots], minlength=len(group.units))
        kept = len(np.unique(d.targets)) - np.concatenate([[0], np.cumsum(per_unit)])
        ok = np.nonzero(kept >= need)[0]
        limit = min(limit, int(ok.max()) if len(ok) else 0)
    return limit


@functools.lru_cache(maxsize=None)
def parameter_cut(dim: int) -> Handler:
    """The cut of a parameter outside any layer along ``dim``: (parameter, indices) -> the parameter without them
    (a new ``nn.Parameter``; :func:`cut` sets it on its module). One function per ``dim``, so that the cuts of one
    parameter by several groups meet under one key."""
    def cut_parameter(p: nn.Parameter, idxs: list[int]) -> nn.Parameter:
        gone = set(idxs)
        keep = torch.tensor([i for i in range(p.shape[dim]) if i not in gone], dtype=torch.long, device=p.device)
        return nn.Parameter(torch.index_select(p.data, dim, keep), p.requires_grad)
    cut_parameter.dim = dim  # type: ignore[attr-defined]
    return cut_parameter


def _size(model: nn.Module, modules: dict[str, nn.Module], d: "Dep", out: bool) -> int:
    """Channels of the layer dimension (or parameter dimension) ``d`` of ``model`` (``modules``: its named modules)
    cuts."""
    if d.module not in modules:
        return int(model.get_parameter(d.module).shape[d.handler.dim])  # type: ignore[attr-defined]
    return _dim(modules[d.module], out)


def _dim(module: nn.Module, out: bool) -> int:
    for attr in (("out_channels", "out_features", "num_features") if out else
                 ("in_channels", "in_features", "num_features")):
        if hasattr(module, attr):
            return int(getattr(module, attr))
    return 0


@contextmanager
def _interrupt_kept() -> Iterator[None]:
    """Ctrl-C (or SIGTERM, which the command line turns into one) during the block stops the stage even where the code
    inside catches it: torch-pruning's trace calls the model under a bare ``except:`` (it tries ``model(*x)``, then
    ``model(x)``), which took the ``KeyboardInterrupt`` and went on (2 of 10 interrupts of a networks stage were lost
    so). What the signal's own handler raised is raised again when the block ends, or in place of another error the
    block ends with. Only in the main thread, where Python handles signals, and for signals with a handler of
    Python's (not ignored, not the system's default)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    raised: list[BaseException] = []
    handlers = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM)}
    handlers = {s: h for s, h in handlers.items() if callable(h)}

    def interrupt(signum: int, frame: Any) -> None:
        try:
            handlers[signum](signum, frame)
        except BaseException as exc:
            raised.append(exc)
            raise

    for s in handlers:
        signal.signal(s, interrupt)
    try:
        yield
    except BaseException as exc:
        if raised and exc is not raised[0]:  # the interrupt, not what the code that swallowed it ran into next
            raise raised[0] from None
        raise
    finally:
        for s, h in handlers.items():
            signal.signal(s, h)
    if raised:
        raise raised[0]


@contextmanager
def _view_outputs_copied(model: nn.Module) -> Iterator[None]:
    """While the block runs, a layer with weights of its own whose output is a view returns a copy of it instead.

    torch-pruning finds a layer by its output's ``grad_fn``; an instance norm's output is a view (of torch's batch
    norm over ``[1, N x C, H, W]``), and an in-place op on it (a style-transfer block's ``ReLU(inplace=True)``) gives
    the view another ``grad_fn``, so the trace lost the layer and its weight kept every channel of the convolution
    before it: the pruned network failed at its first forward. A copy keeps the graph's shapes and channels."""
    def copied(module: nn.Module, inputs: Any, output: Any) -> Any:
        return output.clone() if isinstance(output, torch.Tensor) and output._is_view() else None

    hooks = [m.register_forward_hook(copied) for m in model.modules()
             if next(m.parameters(recurse=False), None) is not None]
    try:
        yield
    finally:
        for h in hooks:
            h.remove()


def _made_shape(grad_fn: Any, output_nr: int) -> tuple[int, ...] | None:
    """The shape of output ``output_nr`` of the autograd node ``grad_fn`` (of the tensor a forward op made); None
    where torch does not say."""
    try:
        return tuple(int(v) for v in grad_fn._input_metadata[output_nr].shape)
    except (AttributeError, IndexError, RuntimeError, TypeError):
        return None


#: autograd nodes (by the start of their names) of the ops that broadcast their inputs, that reduce over
#: dimensions, and of an unsqueeze
_BROADCASTS, _REDUCTIONS = ("MulBackward", "AddBackward", "SubBackward", "DivBackward"), (
    "MeanBackward", "SumBackward", "MaxBackward", "MinBackward", "AmaxBackward", "AminBackward")


def _saved_dims(grad_fn: Any) -> tuple[int, ...] | None:
    """The dimensions a reduction's autograd node says it reduced (``_saved_dim``: a mean's, sum's, max's over
    dimensions; torch keeps a negative one as an unsigned 64-bit number); None where it does not say (over all)."""
    try:
        dims = getattr(grad_fn, "_saved_dim", None)
        if dims is None:
            return None
        return tuple(int(d) - (1 << 64) if int(d) >= 1 << 63 else int(d)
                     for d in (dims if isinstance(dims, (tuple, list)) else (dims,)))
    except (AttributeError, RuntimeError, TypeError, ValueError):
        return None


def _follows_channels(op: str, source: tuple[int, ...] | None, made: tuple[int, ...] | None,
                      reduced: tuple[int, ...] | None = None) -> bool:
    """Whether the output of shape ``made`` of the op whose autograd node is named ``op`` has its channels
    (dimension 1 of a ``[N, C]`` or ``[N, C, H, W]`` tensor) from its input of shape ``source``: not where a
    broadcast gives it other channels (a ``[N, 1, H, W]`` gate times a ``[N, C, H, W]`` map), a reduction takes
    them to one or none (``x.mean(1, keepdim=True)``, ``torch.max(x, 1)[0]``: ``[N, H, W]``), or an unsqueeze
    gives ``[N, H, W]`` a channel. ``reduced``: the dimensions a reduction reduced (:func:`_saved_dims`), which decide
    where known (a mean over the rows of 16 channels at 16 x 16 makes the [N, H, W] a mean over the channels would);
    else the shapes. Any other op (a permute, which moves the channels elsewhere, included), and unknown shapes,
    follow."""
    if source is None or made is None:
        return True
    if op.startswith(_BROADCASTS) and len(source) == len(made) in (2, 4):
        return source[1] == made[1]
    if op.startswith(_REDUCTIONS) and len(source) == 4 and source[1] > 1:
        if reduced is not None:
            return 1 not in {d % 4 for d in reduced}
        return not (made == source[:1] + source[2:] or len(made) == 4 and made[1] == 1)
    if op.startswith("UnsqueezeBackward") and len(source) == 3:
        return made != (source[0], 1) + source[1:]
    return True


def _uncouple_channel_changes(module2node: dict[Any, Any]) -> None:
    """Cut the edges of torch-pruning's graph into an op it takes for an elementwise one (it couples the channels of
    every input and the output) from an input whose channels the output does not follow (:func:`_follows_channels`):
    a ``[N, 1, H, W]`` gate broadcast over the channels (CBAM's spatial attention, ``x * sigmoid(conv(pooled))``), or
    the input of a reduction over them (CBAM's ``torch.max(x, 1)[0]`` and ``x.mean(1)``). Coupled, the gate's single
    channel became its group's root, which could lose no channel, and every channel of the block, whose group it
    swallowed, stayed whole; the reduction's input channels were cut from the convolution after it by their own
    indices."""
    for node in module2node.values():
        if node.type != tp.ops.OPTYPE.ELEMENTWISE or not hasattr(node.grad_fn, "next_functions"):
            continue
        made = _made_shape(node.grad_fn, 0)
        for fn, nr in node.grad_fn.next_functions:
            if fn is None or _follows_channels(node.grad_fn.name(), _made_shape(fn, nr), made,
                                               _saved_dims(node.grad_fn)):
                continue
            for source in [i for i in node.inputs if i.grad_fn is fn]:
                node.inputs.remove(source)
                source.outputs.remove(node)


def _swaps_channels_away(node: Any) -> bool:
    """Whether torch-pruning's ``node`` is a transpose of a ``[N, C, L]`` tensor that moves its channels to the last
    dimension (``[N, L, C]``), or back."""
    if not node.grad_fn.name().startswith("TransposeBackward"):
        return False
    made = _made_shape(node.grad_fn, 0)
    sources = [_made_shape(fn, nr) for fn, nr in node.grad_fn.next_functions if fn is not None]
    return made is not None and len(made) == 3 and len(sources) == 1 and sources[0] == (made[0], made[2], made[1]) \
        and made[1] != made[2]


def _uncouple_convolutions_along_channels(module2node: dict[Any, Any]) -> None:
    """Cut the edges of torch-pruning's graph between a ``Conv1d`` and a transpose that swaps a map's channels with
    its length (ECA-Net's gate: a pooled ``[N, C]`` map, ``[N, 1, C]``, convolved along its channels by a ``Conv1d``
    of one channel, transposed back and broadcast over the block's map). torch-pruning took the transpose for an
    elementwise op: it coupled the block's channels with the convolution's single channel, their group could lose
    none, and the block stayed whole; the convolution runs on any number of channels."""
    for node in module2node.values():
        if node.type != tp.ops.OPTYPE.ELEMENTWISE or not hasattr(node.grad_fn, "name") \
                or not _swaps_channels_away(node):
            continue
        for other in [i for i in node.inputs if isinstance(i.module, nn.Conv1d)]:
            node.inputs.remove(other)
            other.outputs.remove(node)
        for other in [o for o in node.outputs if isinstance(o.module, nn.Conv1d)]:
            node.outputs.remove(other)
            other.inputs.remove(node)


def _known_concat_sizes(module2node: dict[Any, Any]) -> None:
    """Give each concatenation of channels in torch-pruning's graph the channels of its inputs as the forward made
    them. torch-pruning infers them by walking back to a layer, and an input cut off by
    :func:`_uncouple_channel_changes` (CBAM's ``torch.cat([max, mean], 1)`` of reductions over the channels) has none:
    its index mapping failed with a ``TypeError``. Its dim read signed (autograd keeps ``dim=-3`` unsigned)."""
    for node in module2node.values():
        dims = _saved_dims(node.grad_fn) if node.type == tp.ops.OPTYPE.CONCAT else None
        if not dims:
            continue
        shapes = [_made_shape(fn, nr) for fn, nr in node.grad_fn.next_functions if fn is not None]
        if len(shapes) == len(node.inputs) and all(s is not None and len(s) in (2, 4) for s in shapes) \
                and dims[0] % len(shapes[0]) == 1:  # along the channels: dim 1, or -3 of a map (-1 of a vector)
            node.module.concat_sizes = [s[1] for s in shapes]


class RMSNormPruner(tp.pruner.function.BasePruningFunc):
    """nn.RMSNorm as torch-pruning's dependency graph needs it, which lacks it (the channels an RMS norm reads were
    left whole: a cut of them did not run): a layer that passes its input's channels on. Its cut is
    :func:`rms_norm_cut`'s, along the dimension :func:`_rms_norm_cuts` finds."""

    def prune_out_channels(self, layer: nn.Module, idxs: list[int]) -> nn.Module:
        return rms_norm_cut(None)(layer, idxs)

    prune_in_channels = prune_out_channels

    def get_out_channels(self, layer: nn.Module) -> int | None:
        return None  # not known here: which of its dimensions is over the channels, if any

    get_in_channels = get_out_channels


@functools.lru_cache(maxsize=None)
def rms_norm_cut(dim: int | None) -> Handler:
    """The cut of an nn.RMSNorm whose weight's dimension ``dim`` is over the channels: its weight and
    normalized_shape lose the cut channels there; of one over none (None: a map's rows), nothing. One function per
    ``dim`` (its ``dim`` attribute), named as an output cut (a norm's input and output channels are the same)."""
    def prune_out_channels(layer: nn.Module, idxs: list[int]) -> nn.Module:
        if dim is None:
            return layer
        gone = set(idxs)
        keep = [i for i in range(layer.normalized_shape[dim]) if i not in gone]
        layer.normalized_shape = tuple(len(keep) if i == dim else s for i, s in enumerate(layer.normalized_shape))
        if layer.weight is not None:
            index = torch.tensor(keep, dtype=torch.long, device=layer.weight.device)
            layer.weight = nn.Parameter(torch.index_select(layer.weight.data, dim, index), layer.weight.requires_grad)
        return layer
    prune_out_channels.dim = dim  # type: ignore[attr-defined]
    return prune_out_channels


def _rms_norm_cuts(groups: list["CoupledGroup"], modules: dict[str, nn.Module]) -> None:
    """Each nn.RMSNorm the groups reach gets the cut (:func:`rms_norm_cut`) along the first dimension of its
    normalized_shape as long as the channels that reach it (a norm over a permuted map's channels, (C,); over a whole
    [C, H, W] map, its first), or none (a norm over a map's rows, (W,): a weight per column, which passes the
    channels on). Where a map is as wide as it has channels, a norm over its rows is taken for one over the channels:
    that cut does not run, and :func:`followed_groups` leaves it out."""
    reached: dict[str, set[int]] = {}
    for g in groups:
        for d in g.deps:
            if isinstance(modules.get(d.module), nn.RMSNorm):
                reached.setdefault(d.module, set()).update(d.targets.tolist())
    dims = {name: next((i for i, s in enumerate(modules[name].normalized_shape) if s == len(targets)), None)
            for name, targets in reached.items()}
    for g in groups:
        for d in g.deps:
            if d.module in dims:
                d.handler = rms_norm_cut(dims[d.module])


def prune_out_channels_with_running_stats(layer: nn.Module, idxs: list[int]) -> nn.Module:
    """The cut of an instance norm that tracks running statistics (``track_running_stats=True``): torch-pruning's
    (its weight and bias where affine, its ``num_features``), and its running mean and variance, which torch-pruning
    leaves whole (the pruned norm then failed at its first forward: "running_mean should contain 28 elements not
    32"). Named as an output cut (a norm's input and output channels are the same)."""
    tp.pruner.function.prune_instancenorm_out_channels(layer, idxs)
    _cut_buffers(layer, ("running_mean", "running_var"), idxs)
    return layer


def _cut_buffers(layer: nn.Module, names: tuple[str, ...], idxs: list[int]) -> None:
    """``layer``'s [C] buffers ``names``, each without its entries ``idxs`` (the channels cut)."""
    gone = set(idxs)
    for name in names:
        whole = getattr(layer, name)
        kept = torch.tensor([i for i in range(whole.shape[0]) if i not in gone], dtype=torch.long, device=whole.device)
        setattr(layer, name, torch.index_select(whole, 0, kept))


def _instance_norm_cuts(groups: list["CoupledGroup"], modules: dict[str, nn.Module]) -> None:
    """Each instance norm that tracks running statistics the groups reach gets the cut that cuts them too
    (:func:`prune_out_channels_with_running_stats`)."""
    for g in groups:
        for d in g.deps:
            m = modules.get(d.module)
            if isinstance(m, nn.modules.instancenorm._InstanceNorm) and m.track_running_stats:
                d.handler = prune_out_channels_with_running_stats


def _normed_tensors(layer: nn.Module) -> list[tuple[nn.Module, str, int | None, str | None]] | None:
    """The tensors of a layer of weight_norm or spectral_norm over dim 0 (either form: ``torch_modules``'s
    ``weight_norm_form``, ``spectral_norm_form``) that hold its channels, as (holder, attribute, the dimension of the
    output channels, how the input channels lie: ``"dim1"`` the weight's dimension 1, ``"flat"`` spectral_norm's v, the
    weight's dimensions 1 on flattened); None for another layer."""
    from perf4sight.ir.torch_modules import spectral_norm_form, weight_norm_form

    if weight_norm_form(layer) == "parametrization":
        chain = layer.parametrizations.weight
        return [(chain, "original0", 0, None), (chain, "original1", 0, "dim1")]
    if weight_norm_form(layer) == "hook":
        return [(layer, "weight_g", 0, None), (layer, "weight_v", 0, "dim1")]
    form = (spectral_norm_form(layer) or {}).get("spectral_norm")
    if form == "parametrization":
        chain = layer.parametrizations.weight
        return [(chain, "original", 0, "dim1"), (chain[0], "_u", 0, None), (chain[0], "_v", None, "flat")]
    if form == "hook":
        return [(layer, "weight_orig", 0, "dim1"), (layer, "weight_u", 0, None), (layer, "weight_v", None, "flat")]
    return None


def _normed_cut(layer: nn.Module, idxs: list[int], side: str) -> nn.Module:
    """``layer`` (of weight_norm or spectral_norm, :func:`_normed_tensors`) without its channels ``idxs`` on ``side``
    (``"out"``, ``"in"``, or ``"both"``: a depthwise convolution's), as torch would hold the pruned layer: weight_norm's
    g and v (or the hook's weight_g, weight_v) cut along dim 0 with the outputs and v along dim 1 with the inputs;
    spectral_norm's original weight likewise, its power iteration's u cut with the outputs and v with the inputs (v
    holds the weight's dimensions 1 on flattened: each input channel's kernel entries), both normalised again (the
    pruned layer's iteration goes on from the kept singular vectors' entries). The layer's channel counts and bias
    follow; a hook's weight it last computed is computed again of the cut tensors."""
    gone = set(idxs)
    device = next(t for _, t in layer.named_parameters()).device
    kk = math.prod(getattr(layer, "kernel_size", (1,)))
    out_n = int(getattr(layer, "out_channels", getattr(layer, "out_features", 0)))
    in_n = int(getattr(layer, "in_channels", getattr(layer, "in_features", 0)))
    depthwise = side == "both"
    keep_out = [i for i in range(out_n) if i not in gone] if side in ("out", "both") else list(range(out_n))
    keep_in = [i for i in range(in_n) if i not in gone] if side == "in" else list(range(in_n))
    for holder, attr, out_dim, in_how in _normed_tensors(layer) or []:
        t = getattr(holder, attr)
        vector = not isinstance(t, nn.Parameter)  # spectral_norm's u or v, a buffer
        if out_dim is not None and side in ("out", "both"):
            t = torch.index_select(t.data, out_dim, torch.tensor(keep_out, dtype=torch.long, device=device))
        if in_how is not None and side == "in":
            keep = keep_in if in_how == "dim1" else [c * kk + k for c in keep_in for k in range(kk)]
            t = torch.index_select(t.data, 1 if in_how == "dim1" else 0,
                                   torch.tensor(keep, dtype=torch.long, device=device))
        if vector:  # of the power iteration: a unit vector again
            eps = holder.eps if attr.startswith("_") else _hook_of(layer).eps
            setattr(holder, attr, nn.functional.normalize(t, dim=0, eps=eps))
        else:
            setattr(holder, attr, nn.Parameter(t, getattr(holder, attr).requires_grad))
    if layer.bias is not None and side in ("out", "both"):
        index = torch.tensor(keep_out, dtype=torch.long, device=device)
        layer.bias = nn.Parameter(torch.index_select(layer.bias.data, 0, index), layer.bias.requires_grad)
    if isinstance(layer, nn.Linear):
        layer.out_features, layer.in_features = len(keep_out), len(keep_in)
    else:
        layer.out_channels, layer.in_channels = len(keep_out), len(keep_out) if depthwise else len(keep_in)
        if depthwise:
            layer.groups = len(keep_out)
    hook = _hook_of(layer)
    if hook is not None:  # the weight the hook keeps on the layer, of the cut shape (computed again at each forward)
        with torch.no_grad():
            w = hook.compute_weight(layer, do_power_iteration=False) if hasattr(hook, "n_power_iterations") \
                else hook.compute_weight(layer)
        setattr(layer, hook.name, w.detach())
    return layer


def _hook_of(layer: nn.Module) -> Any:
    """``layer``'s weight_norm or spectral_norm forward pre-hook, if any."""
    from torch.nn.utils.spectral_norm import SpectralNorm
    from torch.nn.utils.weight_norm import WeightNorm

    return next((h for h in layer._forward_pre_hooks.values() if isinstance(h, (WeightNorm, SpectralNorm))), None)


def prune_out_channels_normed(layer: nn.Module, idxs: list[int]) -> nn.Module:
    """:func:`_normed_cut` of output channels."""
    return _normed_cut(layer, idxs, "out")


def prune_in_channels_normed(layer: nn.Module, idxs: list[int]) -> nn.Module:
    """:func:`_normed_cut` of input channels."""
    return _normed_cut(layer, idxs, "in")


def prune_out_channels_depthwise_normed(layer: nn.Module, idxs: list[int]) -> nn.Module:
    """:func:`_normed_cut` of a depthwise convolution's channels (its inputs, outputs and groups at once)."""
    return _normed_cut(layer, idxs, "both")


_NORMED_HANDLERS = (prune_out_channels_normed, prune_in_channels_normed, prune_out_channels_depthwise_normed)


def _normed_cuts(groups: list["CoupledGroup"], modules: dict[str, nn.Module]) -> None:
    """Each layer of weight_norm or spectral_norm the groups reach gets its cut (:func:`_normed_cut`) in place of
    torch-pruning's, which cuts the weight (the hook's, computed; the parametrization's is none) and the bias, not g
    and v, nor the original weight, u and v."""
    for g in groups:
        for d in g.deps:
            m = modules.get(d.module)
            if m is None or _normed_tensors(m) is None:
                continue
            name = getattr(d.handler, "__name__", "")
            if isinstance(getattr(d.handler, "__self__", None), tp.pruner.function.DepthwiseConvPruner):
                d.handler = prune_out_channels_depthwise_normed
            else:
                d.handler = prune_out_channels_normed if name.startswith("prune_out") else prune_in_channels_normed


class FrozenBatchNormPruner(tp.pruner.function.BasePruningFunc):
    """A frozen batch norm (torchvision's FrozenBatchNorm2d, a detection backbone's; DETR's and others' of that name)
    as torch-pruning's dependency graph needs it, which lacks it (its scale and shift, made of buffers, read as
    constants: a cut of its channels did not run, so every group through one was left out): a layer that passes its
    input's channels on, its four [C] buffers cut with them."""

    def prune_out_channels(self, layer: nn.Module, idxs: list[int]) -> nn.Module:
        _cut_buffers(layer, ("weight", "bias", "running_mean", "running_var"), idxs)
        return layer

    prune_in_channels = prune_out_channels

    def get_out_channels(self, layer: nn.Module) -> int:
        return int(layer.weight.shape[0])

    get_in_channels = get_out_channels


def _is_frozen_batch_norm(m: nn.Module) -> bool:
    """Whether ``m`` is a frozen batch norm: a class named FrozenBatchNorm2d (torchvision's, or this tool's rebuilt
    one: torchvision is not imported to ask) without parameters, holding a [C] weight buffer."""
    return (type(m).__name__ == "FrozenBatchNorm2d" and next(m.parameters(), None) is None
            and isinstance(getattr(m, "weight", None), torch.Tensor) and m.weight.dim() == 1)


def _pruners(model: nn.Module) -> dict[Any, tp.pruner.function.BasePruningFunc]:
    """torch-pruning's pruners this tool adds for ``model``: :data:`_PRUNERS`, and one per class of frozen batch
    norm it holds."""
    frozen = {type(m): FrozenBatchNormPruner() for m in model.modules() if _is_frozen_batch_norm(m)}
    return {**_PRUNERS, **frozen}


#: torch-pruning's pruners this tool adds.
_PRUNERS = {nn.RMSNorm: RMSNormPruner()}


class _DependencyGraph(tp.DependencyGraph):
    """torch-pruning's dependency graph, but for the couplings :func:`_uncouple_channel_changes` cuts (the
    concatenations' sizes then known from the forward: :func:`_known_concat_sizes`)."""

    def _trace(self, *args: Any, **kwargs: Any) -> dict[Any, Any]:
        module2node = super()._trace(*args, **kwargs)
        _uncouple_channel_changes(module2node)
        _uncouple_convolutions_along_channels(module2node)
        _known_concat_sizes(module2node)
        return module2node


def _reaches_the_channels(item: Any) -> bool:
    """Whether the parameter outside a layer that torch-pruning's group ``item`` reaches holds every index the group
    would cut along that dimension (a layer scale's ``[C, 1, 1]`` does). EfficientDet's BiFPN fusion weights (a
    ``[n]`` parameter, one weight per fused map, each read as a scalar times a whole map) do not: torch-pruning
    couples them with the maps' channels, and their cut made a pruned network that did not run (the group left
    unpruned). They stay whole."""
    parameter, dim = item.dep.target.module, int(item.dep.target.pruning_dim)
    return parameter.dim() > dim and max(item.idxs, default=-1) < parameter.shape[dim]


def find_groups(model: nn.Module, example: torch.Tensor, ignored: list[nn.Module],
                skip: Callable[[Any], str]) -> tuple[list[CoupledGroup], Counter[str]]:
    """Trace ``model`` once and return its prunable groups (unordered) and why others were left out.

    ``ignored`` layers keep their output channels (the classifier); ``skip(group)`` returns a
    reason to leave a torch-pruning group unpruned ('' to keep it).
    """
    with warnings.catch_warnings(), _interrupt_kept(), _view_outputs_copied(model):
        warnings.filterwarnings("ignore", message="Unwrapped parameters detected")  # a parameter outside a layer
        dg = _DependencyGraph().build_dependency(model, example_inputs=example,  # (a layer scale): cut as it says
                                                 customized_pruners=_pruners(model))
    names = {m: n for n, m in model.named_modules()} | {p: n for n, p in model.named_parameters()}
    modules = dict(model.named_modules())
    groups: list[CoupledGroup] = []
    notes: Counter[str] = Counter()
    for g in dg.get_all_groups(ignored_layers=ignored, root_module_types=[nn.Conv2d, nn.Linear, nn.ConvTranspose2d]):
        reason = skip(g)
        if reason:
            notes[reason] += 1
            continue
        merged: dict[tuple[str, Handler], tuple[list[int], list[int]]] = {}
        for it in g:
            name = names.get(it.dep.target.module)
            if name is None:  # an op (concat, add, reshape): nothing to slice
                continue
            handler = it.dep.handler
            module = it.dep.target.module
            if it.dep.target.type == tp.ops.OPTYPE.PARAMETER and not _reaches_the_channels(it):
                continue
            if it.dep.target.type == tp.ops.OPTYPE.PARAMETER:
                handler = parameter_cut(int(it.dep.target.pruning_dim))
            elif is_grouped_conv(module) and dg.is_in_channel_pruning_fn(handler):
                handler = prune_grouped_in_channels
            roots, targets = merged.setdefault((name, handler), ([], []))
            roots += list(it.root_idxs)
            targets += list(it.idxs)
        deps = [Dep(n, h, np.asarray(r, dtype=np.int64), np.asarray(t, dtype=np.int64))
                for (n, h), (r, t) in merged.items()]
        channels = len(g[0].idxs)
        units = _units(deps, channels, modules)
        if units is None:
            notes["grouped convolution not prunable uniformly per group"] += 1
            continue
        groups.append(CoupledGroup(names[g[0].dep.target.module], channels, deps, units))
    _rms_norm_cuts(groups, modules)
    _instance_norm_cuts(groups, modules)
    _gain_cuts(groups, modules)
    _normed_cuts(groups, modules)
    return groups, notes


def _gain_cuts(groups: list[CoupledGroup], modules: dict[str, nn.Module]) -> None:
    """Each convolution's own parameter beyond its weight and bias of one value per output channel, ``[out, 1, 1,
    1]`` (NFNets' ScaledStdConv2d's gain), cut with its output channels: torch-pruning counts it the layer's and
    leaves it whole (the cut network then failed at its first forward, the batch norm's weight too long, and every
    group through such a layer was left out)."""
    for g in groups:
        for d in list(g.deps):
            m = modules.get(d.module)
            if not isinstance(m, nn.Conv2d) or "out" not in getattr(d.handler, "__name__", "") or \
                    _normed_tensors(m) is not None:  # a weight norm's g, [out, 1, 1, 1] too: :func:`_normed_cuts`'
                continue
            for name, p in m.named_parameters(recurse=False):
                if name not in ("weight", "bias") and tuple(p.shape) == (m.out_channels, 1, 1, 1):
                    g.deps.append(Dep(f"{d.module}.{name}", parameter_cut(0), d.roots, d.targets))


def set_limits(groups: list[CoupledGroup], model: nn.Module, min_channels: int) -> None:
    """Set each ordered group's ``max_removed`` (units) from ``min_channels``."""
    modules = dict(model.named_modules())
    for g in groups:
        dims = {}
        for d in g.deps:
            out = d.handler is not prune_grouped_in_channels and "out" in getattr(d.handler, "__name__", "")
            dims[(d.module, d.handler)] = _size(model, modules, d, out) or len(np.unique(d.targets))
        g.max_removed = _max_removed(g, min_channels, dims)


def removal(groups: list[CoupledGroup], counts: list[int]) -> dict[tuple[str, Handler], set[int]]:
    """Per (layer, pruning function): the union of indices removed when group i loses ``counts[i]`` units."""
    out: dict[tuple[str, Handler], set[int]] = {}
    for g, k in zip(groups, counts):
        k = min(k, len(g.order))  # the first k units of the order: a root of a unit within them is gone
        if k <= 0:
            continue
        for d, (places, targets) in zip(g.deps, g.cut_order()):
            hit = targets[:np.searchsorted(places, k)]  # the targets of pairs whose root is gone
            out.setdefault((d.module, d.handler), set()).update(hit.tolist())
    return out


def module_copy(module: nn.Module) -> nn.Module:
    """``copy.deepcopy(module)``, the weight that torch.nn.utils.weight_norm's (or spectral_norm's) hook last
    computed on a layer (a tensor autograd made, which torch will not deep-copy: "Only Tensors created explicitly by
    the user ...") copied detached: the hook computes it again at the layer's next forward."""
    memo: dict[int, Any] = {id(w): w.detach().clone() for w in hook_computed_weights(module) if not w.is_leaf}
    return copy.deepcopy(module, memo)


def cut(base: nn.Module, cuts: dict[tuple[str, Handler], set[int]]) -> nn.Module:
    """A deep copy of ``base`` with every (layer, pruning function) cut applied once, its frozen parameters
    (``requires_grad`` False) frozen still: torch-pruning's cut makes a layer's weight anew, trained (a frozen conv
    weight of a partly frozen layer, its bias trained, came out trained)."""
    model = module_copy(base)
    frozen = {name for name, p in model.named_parameters() if not p.requires_grad}
    modules = dict(model.named_modules())
    for (name, handler), idxs in cuts.items():
        if name in modules:
            handler(modules[name], sorted(idxs))
        else:  # a parameter outside any layer: its cut copy replaces it wherever it is held
            owner, _, attr = name.rpartition(".")
            old = getattr(modules[owner], attr)
            new = handler(old, sorted(idxs))
            for holder, held in _holders(model, old):
                setattr(holder, held, new)
    for name, p in model.named_parameters():
        if name in frozen:
            p.requires_grad_(False)
    return model


def to_meta_keeping_ties(model: nn.Module) -> nn.Module:
    """``model`` moved to the ``meta`` device (in place, as ``Module.to``), a parameter held by several of its modules
    still one parameter: ``to`` gives each holder a meta copy of its own (a rebuilt description's scale and shift of
    one tensor, ``x * g + g``, became two, whose cut left the second whole)."""
    tied = [holders for holders in _parameter_holders(model).values() if len(holders) > 1]
    model.to("meta")
    for (first, attr), *others in tied:
        for holder, held in others:
            setattr(holder, held, getattr(first, attr))
    return model


def _parameter_holders(model: nn.Module) -> dict[int, list[tuple[nn.Module, str]]]:
    """(module, attribute name) of each module of ``model`` holding a parameter, by the parameter's id."""
    held: dict[int, list[tuple[nn.Module, str]]] = {}
    for m in model.modules():
        for attr, p in m.named_parameters(recurse=False):
            held.setdefault(id(p), []).append((m, attr))
    return held


def _holders(model: nn.Module, parameter: nn.Parameter) -> list[tuple[nn.Module, str]]:
    """(module, attribute name) of each module of ``model`` that holds ``parameter`` itself: one, or several where it
    is shared (a rebuilt description's scale and shift of one tensor, ``x * g + g``)."""
    return _parameter_holders(model).get(id(parameter), [])


#: why a group is left out when a cut of it alone leaves a network that does not run
UNFOLLOWED = "channels torch-pruning's dependency graph does not follow whole (a cut of them does not run)"


def _runs_cut(model: nn.Module, example: torch.Tensor, groups: list[CoupledGroup]) -> bool:
    """Whether ``model`` (eval mode, on the meta device) still runs on the meta ``example`` with each of ``groups`` cut
    as deep as its limit lets (:func:`from_torch.run_on_meta`: without importing ``torch._dynamo``)."""
    try:
        with torch.no_grad():
            run_on_meta(cut(model, removal(groups, [g.max_removed for g in groups])), example)
    except Exception:  # noqa: BLE001 - whatever the pruned forward raises, the cut is not one that runs
        return False
    return True


def followed_groups(groups: list[CoupledGroup], model: nn.Module, example: torch.Tensor) -> tuple[
        list[CoupledGroup], int]:
    """The groups of ``groups`` (limits set) whose cuts leave ``model`` a network that runs on ``example``, and how
    many were left out. torch-pruning's graph can miss a layer a group's channels reach by two paths (GhostNet's
    primary convolution, concatenated both as it is and through its cheap depthwise one: reached by the second path
    only), and the cut then left that layer whole: the pruned network failed at its first forward. One forward with
    every group cut as deep as it may be (on the ``meta`` device, ``model`` and ``example`` there: shapes alone);
    where it fails, one per group, the groups that fail alone left out (and all of them where the others still fail
    together). A model that does not run there uncut (an op without a meta kernel) keeps its groups unchecked."""
    cuttable = [g for g in groups if g.max_removed > 0]
    if not cuttable or _runs_cut(model, example, cuttable) or not _runs_cut(model, example, []):
        return groups, 0
    failing = [g for g in cuttable if not _runs_cut(model, example, [g])]
    kept = [g for g in groups if g.max_removed == 0 or g not in failing] if failing else []
    if failing and not _runs_cut(model, example, [g for g in kept if g.max_removed > 0]):
        kept = [g for g in groups if g.max_removed == 0]
    return kept, len(groups) - len(kept)


def _is_out(handler: Handler) -> bool:
    name = getattr(handler, "__name__", "")
    return name.startswith("prune_out") or name.startswith("prune_depthwise")


def _params_after(m: nn.Module, r_out: int, r_in: int, handler: Handler | None = None,
                  own: list[nn.Parameter] | None = None) -> int | None:
    """Trainable parameters of ``m`` without ``r_out`` output and ``r_in`` input channels; None for other types.
    ``own``: ``m``'s own trainable parameters, where the caller has them (:func:`_own_trainable`)."""
    own = _own_trainable(m) if own is None else own
    bias = int(getattr(m, "bias", None) is not None and m.bias.requires_grad)
    if handler in _NORMED_HANDLERS:
        return _normed_params_after(m, r_out, r_in, bias)
    w = getattr(m, "weight", None)  # frozen alone (its bias trained), or a weight norm's computed weight (counted)
    weight = int(not (isinstance(w, nn.Parameter) and not w.requires_grad))
    if type(m) is nn.Conv2d:
        kk = m.kernel_size[0] * m.kernel_size[1]
        if m.groups == m.in_channels == m.out_channels:  # depthwise: in and out go together
            c = m.out_channels - max(r_out, r_in)
            return weight * c * kk + bias * c
        out, cin = m.out_channels - r_out, m.in_channels - r_in
        return weight * out * (cin // m.groups) * kk + bias * out
    if type(m) is nn.ConvTranspose2d and m.groups == 1:  # weight [Cin, Cout, kh, kw]
        kk = m.kernel_size[0] * m.kernel_size[1]
        out, cin = m.out_channels - r_out, m.in_channels - r_in
        return weight * cin * out * kk + bias * out
    if type(m) in (nn.BatchNorm2d, nn.InstanceNorm2d, nn.SyncBatchNorm, nn.BatchNorm1d):
        return (m.num_features - max(r_out, r_in)) * len(own)
    if type(m) is nn.GroupNorm:
        return (m.num_channels - max(r_out, r_in)) * len(own)
    if type(m) is nn.PReLU:  # a slope per channel, cut with them (torch-pruning's PReLU pruner); one slope stays
        return m.num_parameters if m.num_parameters == 1 else (m.num_parameters - max(r_out, r_in)) * len(own)
    if type(m) is nn.Linear:
        out, cin = m.out_features - r_out, m.in_features - r_in
        return weight * out * cin + bias * out
    if isinstance(m, nn.LayerNorm) and len(m.normalized_shape) == 1:  # ConvNeXt's, LayerNorm2d included
        return (m.normalized_shape[0] - max(r_out, r_in)) * len(own)
    if isinstance(m, nn.RMSNorm):  # its weight loses a slice per channel cut along its cut's dimension, if any
        dim, total = getattr(handler, "dim", None), sum(p.numel() for p in own)
        return total if dim is None else total // m.normalized_shape[dim] * (m.normalized_shape[dim] - max(r_out, r_in))
    return None if own else 0


def _normed_params_after(m: nn.Module, r_out: int, r_in: int, bias: int) -> int:
    """Trainable parameters of a layer of weight_norm or spectral_norm (:func:`_normed_tensors`) without ``r_out``
    output and ``r_in`` input channels (a depthwise convolution's: the more of the two, both sides)."""
    depthwise = isinstance(m, nn.Conv2d) and m.groups == m.in_channels == m.out_channels and m.groups > 1
    out_n = int(getattr(m, "out_channels", getattr(m, "out_features", 0)))
    out_after = out_n - (max(r_out, r_in) if depthwise else r_out)
    total = bias * out_after
    for holder, attr, out_dim, in_how in _normed_tensors(m) or []:
        t = getattr(holder, attr)
        if not (isinstance(t, nn.Parameter) and t.requires_grad):
            continue
        size = t.numel() // t.shape[0] * out_after
        if in_how == "dim1" and not depthwise:
            size = size // t.shape[1] * (t.shape[1] - r_in)
        total += size
    return total


def _own_trainable(m: nn.Module) -> list[nn.Parameter]:
    """The trainable parameters ``m`` holds itself (not its children's; a parametrization's originals, g and v or
    spectral_norm's weight, are the layer's)."""
    chains = m.parametrizations.parameters() if isinstance(getattr(m, "parametrizations", None), nn.ModuleDict) else ()
    return [p for p in [*m.parameters(recurse=False), *chains] if p.requires_grad]


def _cut_so_far(dep: Dep, places: np.ndarray, n: int) -> np.ndarray:
    """``out[k]``: how many of ``dep``'s indices are cut once the first ``k`` of the ``n`` units of its group's
    removal order are removed (k = 0 .. n); an index goes with the first unit that holds one of its root channels
    (``places``: :meth:`CoupledGroup.unit_places`)."""
    if not len(dep.targets):
        return np.zeros(n + 1, dtype=np.int64)
    first = np.full(int(dep.targets.max()) + 1, n, dtype=np.int64)
    np.minimum.at(first, dep.targets, places[dep.roots])  # per index: the first unit removed that cuts it
    cut_at = np.bincount(first[np.unique(dep.targets)], minlength=n + 1)[:n]
    return np.concatenate([[0], np.cumsum(cut_at)])


def make_counter(groups: list[CoupledGroup], model: nn.Module) -> Callable[[list[int]], int] | None:
    """A fast ``counts -> parameters removed`` function for ordered groups, or None if it cannot be exact.

    Exact when every touched layer is a Conv2d, an ungrouped ConvTranspose2d, a BatchNorm2d (or SyncBatchNorm,
    BatchNorm1d), InstanceNorm2d or GroupNorm, a PReLU, a Linear, a LayerNorm over one dimension, an RMSNorm (or has no
    parameters), or a parameter outside any layer, and no two groups cut the same channel of the same dimension.
    """
    modules = dict(model.named_modules())
    seen: dict[tuple[str, Handler], set[int]] = {}
    cums: list[list[tuple[tuple[str, Handler], np.ndarray]]] = []
    for g in groups:
        per_dep = []
        places = g.unit_places()
        for d in g.deps:
            used = seen.setdefault((d.module, d.handler), set())
            mine = set(d.targets.tolist())
            if used & mine:
                return None
            used |= mine
            per_dep.append(((d.module, d.handler), _cut_so_far(d, places, len(g.order))))
        cums.append(per_dep)
    layers = {name for name, _ in seen if name in modules}
    handlers = {name: handler for name, handler in seen}  # a layer's cut (an RMS norm's says its dimension)
    if any(_params_after(modules[n], 0, 0, handlers[n]) is None for n in layers):
        return None
    own = {n: _own_trainable(modules[n]) for n in layers}  # read once: a level's count asks each layer many times
    base = {n: sum(p.numel() for p in own[n]) for n in layers}
    # a parameter outside any layer: (elements, size of the dimension cut), each cut channel taking its share
    loose = {name: (model.get_parameter(name).numel(), model.get_parameter(name).shape[handler.dim])
             for name, handler in seen if name not in modules}

    def removed(counts: list[int]) -> int:
        r: dict[str, list[int]] = {}
        for per_dep, k in zip(cums, counts):
            if k:
                for (name, handler), cum in per_dep:
                    slot = r.setdefault(name, [0, 0])
                    slot[0 if _is_out(handler) else 1] += int(cum[k])
        return sum(base[n] - (_params_after(modules[n], o, i, handlers[n], own[n]) or 0) if n in base
                   else loose[n][0] * (o + i) // loose[n][1] for n, (o, i) in r.items())
    return removed
