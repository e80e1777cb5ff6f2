"""Which parameters of a description a training step leaves untrained (frozen: ``requires_grad`` False).

A description names them (``schema.FROZEN_LAYERS``: nodes whose layer is frozen whole; ``schema.FROZEN_PARAMETERS``:
``node.parameter`` entries, a layer frozen in part or a parameter a function call reads), and the step torch runs
honours them: a frozen parameter gets no gradient (``.grad`` stays None), so no optimiser state and no update; an op
none of whose inputs needs a gradient and whose parameters are all frozen makes no autograd node (it keeps nothing
and runs no backward: a frozen stem on the input image), and one whose input needs a gradient computes that
gradient alone (no weight gradient). :func:`frozen_of` reads the description; :func:`frozen_split` sizes what is
frozen of one node's layer. A parameter whose size this module does not know by its name (an attention's
projections) is taken as trained, as every parameter was before.
"""
from __future__ import annotations

from perf4sight.features.formulas import (BYTES_PER_ELEMENT, STANDARDIZE_KEPT, STANDARDIZE_KERNELS, OpCost, changed,
                                          numel, scaled_gain_kernels, window_geometry)
from perf4sight.ir.schema import (FROZEN_LAYERS, FROZEN_PARAMETERS, SHARES, NetworkDescription, Node, frozen_parameter,
                                  node_params)

__all__ = ["ALL", "frozen_of", "frozen_split", "frozen_cost", "FrozenSplit"]

#: The name standing for every parameter of a layer frozen whole.
ALL = "*"
#: Ops whose layer has a ``weight`` and, where it has one, a ``bias``, each of a size :func:`_sizes` knows.
_WEIGHT_BIAS = ("conv2d", "conv_transpose2d", "linear", "batchnorm2d", "groupnorm", "instancenorm", "layernorm")
#: Ops whose layer has one parameter tensor, ``weight``.
_ONE_TENSOR = ("rmsnorm", "prelu", "scale", "shift", "token", "weighted_sum")


def frozen_of(desc: NetworkDescription) -> dict[str, frozenset[str]]:
    """The frozen parameters of ``desc`` by the node that owns them (a later call of a layer, ``shares``, goes by its
    first call's node): :data:`ALL` for a layer frozen whole, else the parameters' names (``weight``, ``bias``)."""
    out: dict[str, set[str]] = {}
    by_name = {n.name: n for n in desc.nodes}
    for name in desc.extra.get(FROZEN_LAYERS, ()) or ():
        node = by_name.get(name)
        if node is not None:
            out.setdefault(node.attrs.get(SHARES, name), set()).add(ALL)
    for entry in desc.extra.get(FROZEN_PARAMETERS, ()) or ():
        found = frozen_parameter(str(entry), by_name)
        if found is not None:
            out.setdefault(by_name[found[0]].attrs.get(SHARES, found[0]), set()).add(found[1])
    return {k: frozenset(v) for k, v in out.items()}


class FrozenSplit:
    """What is frozen of one layer: ``params`` and ``tensors`` (counts), whether its ``weight`` and its ``bias``
    are, and whether all its parameters are (``whole``)."""

    __slots__ = ("params", "tensors", "weight", "bias", "whole")

    def __init__(self, params: int, tensors: int, weight: bool, bias: bool, whole: bool) -> None:
        self.params, self.tensors, self.weight, self.bias, self.whole = params, tensors, weight, bias, whole


def _sizes(node: Node) -> dict[str, int] | None:
    """The size of each parameter of ``node``'s layer by its name, or None where this module does not know them."""
    a, total = node.attrs, node_params(node)
    if a.get("weight_norm") or a.get("spectral_norm"):
        return _normed_sizes(node, total)
    if node.op in _WEIGHT_BIAS:
        if node.op in ("conv2d", "conv_transpose2d"):
            bias = int(a["out_channels"]) if a.get("bias") else 0
        elif node.op == "linear":
            bias = int(a["out_features"]) if a.get("bias") else 0
        else:  # a norm's weight and bias, of one size each
            bias = total // 2
        gain = int(a["out_channels"]) if "standardize_scale" in a else 0  # ScaledStdConv2d's, one an output channel
        return {"weight": total - bias - gain, **({"gain": gain} if gain else {}),
                **({"bias": bias} if bias else {})} if total else {}
    if node.op in _ONE_TENSOR:
        return {"weight": total} if total else {}
    return None


def _normed_sizes(node: Node, total: int) -> dict[str, int]:
    """:func:`_sizes` of a conv2d's or linear's layer of ``weight_norm`` (g, one a channel, and v) or
    ``spectral_norm`` (the original weight), by the names torch's parametrization or hook gives them."""
    a = node.attrs
    cout = int(a.get("out_channels", a.get("out_features", 0)))
    bias = cout if a.get("bias") else 0
    hook = (a.get("weight_norm") or a.get("spectral_norm")) == "hook"
    if a.get("weight_norm"):
        g, v = ("weight_g", "weight_v") if hook else ("parametrizations.weight.original0",
                                                      "parametrizations.weight.original1")
        sizes = {g: cout, v: total - bias - cout}
    else:
        sizes = {"weight_orig" if hook else "parametrizations.weight.original": total - bias}
    return {**sizes, **({"bias": bias} if bias else {})}


def frozen_split(node: Node, names: frozenset[str] | None) -> FrozenSplit | None:
    """What of ``node``'s layer ``names`` (:func:`frozen_of`'s entry for it) freezes; None where nothing is (or
    nothing this module can size: a layer frozen in part whose parameters' sizes it does not know)."""
    if not names:
        return None
    total = node_params(node)
    sizes = _sizes(node)
    if ALL in names:
        tensors = len(sizes) if sizes is not None else 0
        return FrozenSplit(total, tensors, True, True, True) if total else None
    if sizes is None:
        return None
    known = [k for k in names if k in sizes]
    if not known:
        return None
    params = sum(sizes[k] for k in known)
    whole = len(known) == len(sizes)
    weight = set(sizes) - {"bias"} <= set(known)  # every tensor the weight is made of (a normed layer's g and v)
    return FrozenSplit(params, len(known), weight, "bias" in known or "bias" not in sizes and whole, whole)


#: Ops whose weight's and bias's gradients :func:`frozen_cost` takes out of the backward (the others keep theirs:
#: a norm's fused backward kernel computes the input's gradient with them).
_GRADIENTS_APART = ("conv2d", "conv_transpose2d", "linear")


def frozen_cost(cost: OpCost, node: Node, split: FrozenSplit) -> OpCost:
    """``cost`` of ``node`` without the backward work of its frozen parameters (``split``):
    a convolution's or a linear layer's weight gradient (2 FLOPs a MAC, a kernel) and bias gradient (an add an
    output element, a kernel), and a weight norm's or spectral norm's backward where the layer is frozen whole
    (``formulas._weight_normed``, ``_spectral_normed``: what they added, but the weight they compute, which the layer
    keeps), and so a weight standardisation's and a ScaledStdConv2d's gain's (:func:`_frozen_standardisation`); a
    linear layer whose weight is frozen keeps no input (torch's addmm and mm save their input for the weight's
    gradient alone: saved-tensor hooks, torch 2.14), where a convolution keeps it all the same."""
    if node.op == "attention":
        return _frozen_attention(cost, node) if split.whole else cost
    if node.op == "window_attention":
        return _frozen_window_attention(cost, node) if split.whole else cost
    if node.op not in _GRADIENTS_APART or node.attrs.get("fixed"):
        return cost
    flops, kernels, saved = cost.flops_bwd, cost.kernels_bwd, list(cost.saved)
    bias = node.attrs.get("bias")
    outputs = float(numel(node.output_shape))  # an add of the bias an output element
    if split.weight:
        flops -= 2.0 * cost.macs
        kernels -= 1
        if node.op == "linear":
            saved = [s for s in saved if s != 0]
    if bias and split.bias:
        flops -= outputs
        kernels -= 1
    batch_saved = cost.batch_saved
    if split.weight and node.attrs.get("weight_norm"):  # its g and v frozen: the norm makes no node (no kernel back,
        kernels -= 1  # no norm per output channel kept; the weight computed is kept by the layer all the same)
        batch_saved = batch_saved[:-1]
    if split.weight and node.attrs.get("spectral_norm"):  # nor does the division by sigma (9 kernels back; u, v and
        kernels -= 9  # sigma not kept)
        batch_saved = batch_saved[:-3]
    form = node.attrs.get("standardize")
    if split.weight and form:  # nor does its weight's standardisation, nor a ScaledStdConv2d's gain: their kernels
        kernels, batch_saved = _frozen_standardisation(node, form, kernels, batch_saved)  # back and what they kept
    return changed(cost, flops_bwd=max(flops, 0.0), kernels_bwd=max(kernels, 0), saved=saved, batch_saved=batch_saved)


def _frozen_standardisation(node: Node, form: str, kernels: int,
                             batch_saved: tuple[float, ...]) -> tuple[int, tuple[float, ...]]:
    """``kernels`` back and ``batch_saved`` of a conv2d standardised as ``form`` (``formulas._standardized``, and
    ``_scaled_gain`` where it has ``standardize_scale``) frozen whole: none of the kernels back they added, and of
    what they kept the weight the convolution reads alone (a tensor of the weight's size), as torch 2.14 runs it on a
    CPU (a dispatch log, saved-tensor hooks)."""
    scaled = "standardize_scale" in node.attrs
    sized, per_channel = STANDARDIZE_KEPT[form]
    added = sized + per_channel + (1 if scaled else 0)
    kernels -= STANDARDIZE_KERNELS[form][1] + (scaled_gain_kernels(form)[1] if scaled else 0)
    a = node.attrs
    weights = int(a["out_channels"]) * (int(a["in_channels"]) // int(a["groups"])) * numel(a["kernel_size"])
    return kernels, batch_saved[:-added] + (float(weights * BYTES_PER_ELEMENT),)


def _frozen_attention(cost: OpCost, node: Node) -> OpCost:
    """``cost`` of an ``nn.MultiheadAttention`` frozen whole (``formulas._attention``): no weight gradient of its two
    projections (``4 L E^2`` MACs, two GEMMs) nor bias gradient (``4 L E`` adds, two reductions); its input projection
    keeps nothing and copies nothing forward (torch's matmul folds no transposed input into rows where the weight
    needs no gradient: a ``bmm`` of the weight expanded in place of the copy and ``mm``), as torch 2.14 runs it."""
    e = int(node.attrs["embed_dim"])
    tokens = numel(node.output_shape) // e
    bias = bool(node.attrs["bias"])
    flops = 8.0 * tokens * e * e + (4.0 * tokens * e if bias else 0.0)
    return changed(cost, flops_bwd=max(cost.flops_bwd - flops, 0.0),
                   kernels_bwd=max(cost.kernels_bwd - (4 if bias else 2), 0), kernels_fwd=cost.kernels_fwd - 1,
                   saved=[])


def _frozen_window_attention(cost: OpCost, node: Node) -> OpCost:
    """``cost`` of a Swin's window attention frozen whole (``formulas._window_attention``), of a table of biases (a
    V2's cosine scores and bias MLP are left as they are): no weight gradient of its two projections (``4 T E^2``
    MACs, two GEMMs), no bias gradient (``4 T E`` adds, two reductions), no gradient of the table (the biases summed
    over the windows, zeros and an index_put: three kernels), and neither projection keeps its input (``2 T E``
    elements), as torch 2.14 runs it on a CPU (a dispatch log, saved-tensor hooks)."""
    if node.attrs.get("cosine") or node.attrs.get("position_bias_mlp"):
        return cost
    tokens, _, e, _, _ = window_geometry(node)
    flops = 8.0 * tokens * e * e + (4.0 * tokens * e if node.attrs["bias"] else 0.0)
    return changed(cost, flops_bwd=max(cost.flops_bwd - flops, 0.0),
                   kernels_bwd=max(cost.kernels_bwd - (7 if node.attrs["bias"] else 5), 0),
                   extra_saved_bytes=max(cost.extra_saved_bytes - 2.0 * tokens * e * 4, 0.0))
