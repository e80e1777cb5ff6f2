"""A pruned level's description made from the unpruned network's description, without cutting a copy of the network.

A pruning plan's cut (:meth:`perf4sight.networks.pruning.PruningPlan.counts_at`) takes channels out of layers and
nothing else: the network's graph, its ops and every size but the channels' stay. Where the unpruned network's
description holds only ops whose channel counts the description alone determines (a convolution, plain, grouped (its
groups cut alike, as the plan cuts them) or depthwise, a batch norm (BatchNorm1d's too), a group or affine instance
norm, a PReLU and a linear layer, whose counts the cut sets; elementwise activations, dropout (Dropout2d, AlphaDropout
too), pooling, a resize (a segmentation head's interpolate), a mean over the map, a flatten, a sum, product, quotient,
maximum or minimum of two maps or of a map and a number, a concatenation of channels, whose output channels follow
from their inputs'), the level's description is the unpruned one with those counts changed: what :func:`describe`
gives of the cut copy, at a hundredth of the cost (a cut copy and its trace took 50 ms a level for resnet18 at
224x224 and 230 ms for mobilenet_v2 on a 2-core host; ``--prune-to-fit`` asks up to 100 levels of each network).

Made here only where every check passes, else None (the caller then cuts a copy and describes it, as before):

- every layer of the network is torch's or torchvision's (their forwards do not branch on channel counts, so the cut
  network traces to the same graph; a model of the user's own code might), and every layer with weights is called
  once, by a node of the description (a convolution, norm, PReLU or linear layer, of torch's own class; a convolution
  or linear layer of weight_norm or spectral_norm, either form, too);
- the plan cuts only those layers, with torch-pruning's own cuts of them (a convolution's, a depthwise one's, a
  grouped one's input channels as the plan cuts them, a norm's, a PReLU's, a linear layer's) or this tool's cut of a
  weight-normed one, and every parameter the network has is read (none left out of the count);
- at each node the channels a layer's cut leaves are the ones its input brings (a cut that would not run is left
  to the copy, which fails as it did), and the parameters of the description made are those the plan counts.
"""
from __future__ import annotations

import math
import weakref
from dataclasses import dataclass
from typing import Any

import torch_pruning as tp
from torch import nn
from torch.nn.utils import parametrize

from perf4sight.ir.from_torch import described_with_calls
from perf4sight.ir.schema import SHARES, NetworkDescription, Node, count_params, known_attrs, node_params
from perf4sight.ir.shapes import broadcast
from perf4sight.networks import prune_plan as pp
from perf4sight.networks.prune_plan import removal

__all__ = ["DescribedCut", "described_cut"]

#: elementwise ops of one input: none of their attributes depends on the channel count
_ELEMENTWISE = ("relu", "relu6", "silu", "hardswish", "hardsigmoid", "sigmoid", "identity", "gelu", "tanh",
                "leaky_relu", "elu", "selu", "celu", "hardtanh", "mish", "softplus", "log_sigmoid", "hardshrink",
                "softshrink", "threshold", "rrelu", "abs", "exp", "log", "pow", "dropout", "dropout2d", "alpha_dropout")
#: ops whose output has its input's channels (dimension 0 of the sample's shape) and its other sizes from the
#: unpruned description, by the attributes they may have (none depends on the channel count)
_FOLLOWING = {
    **{op: set(known_attrs(op)) - {SHARES} for op in _ELEMENTWISE},
    **{op: {"kernel_size", "stride", "padding", "dilation", "ceil_mode", "count_include_pad", "divisor_override",
            "output_size"} for op in ("maxpool2d", "avgpool2d", "adaptiveavgpool2d", "adaptivemaxpool2d")},
    "mean": {"dims", "keepdim"},
    "interpolate": set(known_attrs("interpolate")),  # a segmentation head's resize: its sizes are the map's
}
#: ops of two inputs broadcast together (add and mul also of one input and a number, ``scalar``: elementwise)
_BROADCAST = ("add", "mul", "div", "maximum", "minimum")
#: a conv2d's or linear's weight_norm or spectral_norm (over dim 0: cut by ``prune_plan._normed_cut``)
_NORMED = {"weight_norm", "spectral_norm", "spectral_norm_iterations", "spectral_norm_eps"}
_CONV = {"in_channels", "out_channels", "kernel_size", "stride", "padding", "dilation", "groups", "bias"} | _NORMED
_BN = {"num_features", "eps", "affine", "track_running_stats", "momentum"}
_LINEAR = {"in_features", "out_features", "bias"} | _NORMED
#: norm op -> its channel count's attr (a norm's channels are its input's; its cut takes both sides at once)
_NORMS = {"batchnorm2d": "num_features", "groupnorm": "num_channels", "instancenorm": "num_features",
          "prelu": "num_parameters"}
#: description op -> the layer classes that make it, and the attributes its node may have (a batchnorm2d node is
#: BatchNorm1d's too, of a [C] or [C, L] input; an instance norm's running statistics torch-pruning does not cut)
_LAYERS = {"conv2d": ((nn.Conv2d,), _CONV), "batchnorm2d": ((nn.BatchNorm2d, nn.BatchNorm1d), _BN),
           "linear": ((nn.Linear,), _LINEAR), "groupnorm": ((nn.GroupNorm,), {"num_groups", "num_channels", "affine",
                                                                               "eps"}),
           "instancenorm": ((nn.InstanceNorm2d,), {"num_features", "affine", "eps"}),
           "prelu": ((nn.PReLU,), {"num_parameters"})}
_F = tp.pruner.function
#: torch-pruning's cuts this follows: (pruner class, which side of the layer); a norm's (a batch, group or instance
#: norm's, a PReLU's slopes) and a depthwise convolution's cut both sides at once
_CUTS = {(_F.ConvPruner, "prune_out_channels"): "out", (_F.ConvPruner, "prune_in_channels"): "in",
         (_F.LinearPruner, "prune_out_channels"): "out", (_F.LinearPruner, "prune_in_channels"): "in",
         (_F.BatchnormPruner, "prune_out_channels"): "both", (_F.DepthwiseConvPruner, "prune_out_channels"): "both",
         (_F.GroupNormPruner, "prune_out_channels"): "both", (_F.InstanceNormPruner, "prune_out_channels"): "both",
         (_F.PReLUPruner, "prune_out_channels"): "both"}
#: this tool's own cuts, by side: a grouped convolution's input channels (the plan's uniform cut a group), and a layer
#: of weight_norm or spectral_norm's
_OWN_CUTS = {pp.prune_grouped_in_channels: "in", pp.prune_out_channels_normed: "out",
             pp.prune_in_channels_normed: "in", pp.prune_out_channels_depthwise_normed: "both"}


class _Unpruned:
    """A plan's unpruned description and the layer each of its layer nodes calls; ``desc`` None where the plan's
    cuts cannot be described from it."""

    def __init__(self, plan: Any, input_shape: list[int]) -> None:
        self.desc: NetworkDescription | None = None
        self.layers: dict[str, str] = {}  # node name -> the layer (module path) it calls
        model = plan.prune(0, meta=True).module
        if plan.unused or not all(type(m).__module__.split(".")[0] in ("torch", "torchvision")
                                  for m in model.modules()):
            return
        try:
            desc, calls = described_with_calls(model, list(input_shape), "unpruned")
        except Exception:  # noqa: BLE001 - described from a cut copy instead, which says what is wrong
            return
        if desc.extra or count_params(desc) != plan.p0:  # weights frozen or left unread, or counted otherwise
            return
        modules = dict(model.named_modules())
        for n in desc.nodes:
            if n.op in _LAYERS:
                kind, keys = _LAYERS[n.op]
                m = modules.get(calls.get(n.name, ""))
                if _layer_class(m) not in kind or not set(n.attrs) <= keys or not _same_counts(n, m):
                    return
                self.layers[n.name] = calls[n.name]
            elif n.op not in ("input", "flatten", "cat", *_BROADCAST) and n.op not in _FOLLOWING:
                return
        weighted = {name for name, m in modules.items() if any(True for _ in m.parameters(recurse=False))
                    and not isinstance(m, parametrize.ParametrizationList)}  # a layer's parametrization: the layer's
        if len(set(self.layers.values())) != len(self.layers) or not weighted <= set(self.layers.values()):
            return  # a layer called twice, or one with weights no layer node calls
        self.desc = desc


def _layer_class(m: nn.Module | None) -> type:
    """``m``'s class, that of the layer a parametrization was registered on for a parametrized one (torch makes its
    class anew: ``ParametrizedConv2d``, of ``nn.Conv2d``)."""
    if m is not None and parametrize.is_parametrized(m):
        return type(m).__bases__[0]
    return type(m)


def _same_counts(n: Node, m: nn.Module) -> bool:
    """Whether the unpruned layer node ``n`` says the channel counts of the layer ``m`` it calls."""
    a = n.attrs
    if isinstance(m, nn.Conv2d):
        return (a["in_channels"], a["out_channels"], a["groups"]) == (m.in_channels, m.out_channels, m.groups)
    if n.op in _NORMS:
        return a[_NORMS[n.op]] == getattr(m, _NORMS[n.op])
    return (a["in_features"], a["out_features"]) == (m.in_features, m.out_features)


#: each plan's :class:`_Unpruned`, made at its first cut described
_MADE: weakref.WeakKeyDictionary[Any, dict[tuple[int, ...], _Unpruned]] = weakref.WeakKeyDictionary()


@dataclass
class DescribedCut:
    """The layers of a cut's description: its nodes, the output node's name and the parameters they hold."""

    nodes: list[Node]
    output: str
    params: int

    def description(self, input_shape: list[int], name: str, network: str | None = None, pruning_level: float = 0,
                    **extra: Any) -> NetworkDescription:
        """The description :func:`describe` gives of the cut copy with these arguments."""
        return NetworkDescription(name=name, network=network or name, input_shape=list(input_shape),
                                  num_classes=int(next(n for n in self.nodes if n.name == self.output).output_shape[0]),
                                  params=self.params, nodes=self.nodes, output=self.output,
                                  pruning_level=pruning_level, extra=dict(extra))


def described_cut(plan: Any, counts: tuple[int, ...], input_shape: list[int]) -> DescribedCut | None:
    """The layers of the description of ``plan`` (a ``PruningPlan``) cut by ``counts`` (:meth:`PruningPlan.counts_at`)
    at ``input_shape``: those :func:`describe` gives of the cut copy; None where the checks (the module's docstring)
    do not all pass."""
    made = _MADE.setdefault(plan, {})
    key = tuple(input_shape)
    if key not in made:
        made[key] = _Unpruned(plan, list(input_shape))
    unpruned = made[key]
    if unpruned.desc is None or plan._fast_count is None:
        return None
    removed: dict[str, dict[str, set[int]]] = {}  # layer -> side ("out", "in", "both") -> channels cut
    for (layer, handler), idxs in removal(plan.groups, list(counts)).items():
        side = _OWN_CUTS.get(handler) or _CUTS.get((type(getattr(handler, "__self__", None)),
                                                    getattr(handler, "__name__", "")))
        if side is None:
            return None
        removed.setdefault(layer, {}).setdefault(side, set()).update(idxs)
    if not set(removed) <= set(unpruned.layers.values()):
        return None
    nodes = _cut_nodes(unpruned, removed)
    if nodes is None:
        return None
    params = sum(node_params(n) for n in nodes)
    if params != plan.p0 - plan._fast_count(list(counts)):
        return None
    return DescribedCut(nodes, unpruned.desc.output, params)


def _cut_nodes(unpruned: _Unpruned, removed: dict[str, dict[str, set[int]]]) -> list[Node] | None:
    """The unpruned description's nodes with the channels of ``removed`` gone, each node's channels set from its
    inputs' (None where a layer's cut disagrees with what its input brings, or an op's inputs do not combine)."""
    old = {n.name: n.output_shape for n in unpruned.desc.nodes}
    shapes: dict[str, list[int]] = {}
    out: list[Node] = []
    for n in unpruned.desc.nodes:
        ins = [shapes[i] for i in n.inputs]
        attrs = dict(n.attrs)  # the same keys in the same order: the description's JSON as describe writes it
        shape = list(n.output_shape)
        if n.op == "input":
            pass
        elif n.op in _FOLLOWING:
            if len(ins) != 1 or not set(attrs) <= _FOLLOWING[n.op] or not ins[0] or not shape \
                    or shape[0] != old[n.inputs[0]][0] or (n.op == "mean" and not _off_the_channels(attrs, ins[0])):
                return None
            shape[0] = ins[0][0]
        elif n.op in _LAYERS:
            shape = _layer(n, attrs, ins, removed.get(unpruned.layers[n.name], {}))
            if shape is None:
                return None
        elif n.op == "flatten":
            if len(ins) != 1 or attrs.get("start_dim") != 1 or set(attrs) - {"start_dim", "end_dim"} \
                    or attrs.get("end_dim", -1) != -1 or shape != [math.prod(old[n.inputs[0]])]:
                return None
            shape = [math.prod(ins[0])]
        elif n.op in ("add", "mul") and len(ins) == 1:  # a number added or multiplied
            if set(attrs) != {"scalar"} or shape != old[n.inputs[0]]:
                return None
            shape = list(ins[0])
        elif n.op in _BROADCAST:
            if len(ins) != 2 or attrs or broadcast(*[old[i] for i in n.inputs]) != shape:
                return None
            shape = broadcast(ins[0], ins[1])
            if shape is None:
                return None
        else:  # cat
            if attrs != {"dim": 1} or not ins or any(len(s) != len(shape) for s in ins) \
                    or sum(old[i][0] for i in n.inputs) != shape[0]:
                return None
            shape[0] = sum(s[0] for s in ins)
        out.append(Node(n.name, n.op, list(n.inputs), attrs, shape))
        shapes[n.name] = shape
    return out


def _off_the_channels(attrs: dict[str, Any], shape: list[int]) -> bool:
    """Whether a ``mean``'s dimensions (the batch's counted: 1 is the channels) leave the channels of an input of
    per-sample ``shape`` alone."""
    dims = attrs.get("dims")
    rank = len(shape) + 1
    return isinstance(dims, list) and bool(dims) and all(isinstance(d, int) and -rank <= d < rank
                                                         and d % rank >= 2 for d in dims)


def _layer(n: Node, attrs: dict[str, Any], ins: list[list[int]], cut: dict[str, set[int]]) -> list[int] | None:
    """A layer node's output shape, its channel counts in ``attrs`` set from ``cut`` (its channels cut, by side),
    None where the input's channels are not those the cut leaves."""
    if len(ins) != 1:
        return None
    shape, channels = list(n.output_shape), ins[0][0] if ins[0] else None
    out_cut, in_cut, both = (len(cut.get(side, ())) for side in ("out", "in", "both"))
    if n.op == "prelu" and attrs["num_parameters"] == 1:  # one slope for every channel: torch-pruning cuts nothing
        if not ins[0]:
            return None
        shape[0] = channels
        return shape
    depthwise = n.op == "conv2d" and attrs["groups"] == attrs["in_channels"] == attrs["out_channels"] > 1
    if n.op in _NORMS or depthwise:  # in, out and groups at once
        if out_cut or in_cut or len(ins[0]) != (3 if n.op in ("conv2d", "instancenorm") else len(shape)) \
                or not shape:
            return None
        key = _NORMS.get(n.op, "out_channels")
        left = attrs[key] - both
        if left != channels or (n.op == "groupnorm" and left % attrs["num_groups"]):
            return None  # a group norm's channels no longer in whole groups: the copy's forward fails, as it did
        if n.op in _NORMS:
            attrs[key] = left
        else:
            attrs["in_channels"] = attrs["out_channels"] = attrs["groups"] = left
        shape[0] = left
        return shape
    if both:
        return None
    if n.op == "conv2d":
        if len(ins[0]) != 3 or attrs["in_channels"] - in_cut != channels or channels % attrs["groups"] \
                or (attrs["out_channels"] - out_cut) % attrs["groups"]:
            return None  # a grouped convolution's channels cut unevenly across its groups: the copy fails, as it did
        attrs["in_channels"], attrs["out_channels"] = channels, attrs["out_channels"] - out_cut
        shape[0] = attrs["out_channels"]
        return shape
    if len(ins[0]) != 1 or attrs["in_features"] - in_cut != channels:  # linear, of a [features] input
        return None
    attrs["in_features"], attrs["out_features"] = channels, attrs["out_features"] - out_cut
    shape[0] = attrs["out_features"]
    return shape
