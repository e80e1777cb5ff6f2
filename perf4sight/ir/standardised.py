"""Weight standardisation found in a torch.fx trace: a ``conv2d`` whose weight is its parameter standardised per output
channel at every forward (BiT's and timm's ``StdConv2d``), described as the conv2d of the optional attr
``standardize`` (:mod:`perf4sight.ir.schema`). Seven spellings are read, each rebuilt as written (torch runs each
with kernels of its own)::

    F.batch_norm(w.reshape(1, out, -1), None, None, training=True, momentum=0., eps=eps).reshape_as(w)  # batch_norm
    (w - w.mean((1, 2, 3), keepdim=True)) / (w.std((1, 2, 3), keepdim=True) + eps)                    # std
    (w - w.mean((1, 2, 3), keepdim=True)) / (w.var((1, 2, 3), keepdim=True) + eps).sqrt()             # var
    v, m = torch.var_mean(w, (1, 2, 3), keepdim=True); (w - m) / torch.sqrt(v + eps)                    # var_mean
    s, m = torch.std_mean(w, (1, 2, 3), keepdim=True); (w - m) / (s + eps)                # std_mean (timm's older)
    F.layer_norm(w, w.shape[1:], eps=eps)                                                     # layer_norm
    f = w.view(out, -1); (w - f.mean(dim=1, keepdim=True).view(out, 1, 1, 1))
                         / (f.std(dim=1, keepdim=True).view(out, 1, 1, 1) + eps)       # std_rows (mmcv's ConvWS2d)

(``std``, ``var``, ``var_mean`` and ``std_mean`` with ``unbiased=`` or ``correction=`` of 0 or 1, ``std_rows`` with
``unbiased=``: ``standardize_unbiased``; ``out`` an int or the weight's ``size(0)``;
``torch.sqrt(x)`` or ``x.sqrt()``, ``torch.div`` or ``/``). Every node between the parameter and the convolution is
taken in by the conv2d; a spelling with a part read elsewhere, or any other, is not one, and stays refused.
NFNets' ScaledStdConv2d, a learnt gain per output channel and a fixed scale, is ``standardize_scale``: timm's
``batch_norm`` of ``weight=(gain * scale).view(-1)``, and its older ``gain * (scale * (w - m) / (s + eps))`` of
``std_mean`` and ``gain * (scale * F.layer_norm(w, ...))``.
"""
from __future__ import annotations

import operator
from typing import Any, Optional

import torch
import torch.fx as fx
import torch.nn.functional as F

from perf4sight.ir.fx_values import _arg

__all__ = ["STANDARDIZE_GAIN", "STANDARDIZES", "standardised_weights"]

#: fx meta key of a standardised weight's node: the parameter's ``get_attr`` node it is computed from
STANDARDIZES = "perf4sight_standardizes"
#: fx meta key of the convolution reading it: its description attrs (``standardize``, ``standardize_eps``, ...)
STANDARDIZE_ATTRS = "perf4sight_standardize_attrs"
#: fx meta key of the convolution reading it: the ``get_attr`` node of its gain, where it has one (ScaledStdConv2d's)
STANDARDIZE_GAIN = "perf4sight_standardize_gain"

_DIVS = {operator.truediv, torch.div, torch.true_divide, "div", "true_divide"}
_SUBS = {operator.sub, torch.sub, "sub"}
_ADDS = {operator.add, torch.add, "add"}
_MULS = {operator.mul, torch.mul, "mul"}
_SQRTS = {torch.sqrt, "sqrt"}
_MEANS = {torch.mean, "mean"}
_STDS = {torch.std, "std"}
_VARS = {torch.var, "var"}
_RESHAPES_AS = {"reshape_as", "view_as"}


def _shape(p: fx.Node) -> tuple:
    """The shape of the parameter ``p`` reads (a ``get_attr`` node; read off its module, traced shapes or not)."""
    try:
        return tuple(p.graph.owning_module.get_parameter(p.target).shape)
    except AttributeError:  # a buffer, or a module tensor of the trace's own: no standardised weight
        return ()


def _is(n: Any, targets: set) -> bool:
    return isinstance(n, fx.Node) and n.op in ("call_function", "call_method") and n.target in targets


def _channel_stat(n: Any, weight: fx.Node, targets: set) -> Optional[dict]:
    """``{"unbiased": ...}`` where ``n`` is a call of ``targets`` over every dimension of ``weight`` but the first,
    keeping them (``keepdim=True``); None otherwise. A mean has no ``unbiased``."""
    if not _is(n, targets) or n.args[:1] != (weight,) or len(n.args) > 2 or _arg(n, 1, "dim") is None:
        return None
    known = {"dim", "keepdim", "unbiased", "correction"} - ({"unbiased", "correction"} if targets is _MEANS else set())
    if set(n.kwargs) - known or n.kwargs.get("keepdim") is not True:
        return None
    rank = len(_shape(weight))
    if rank != 4:
        return None
    dims = _arg(n, 1, "dim")
    dims = [dims] if isinstance(dims, int) else dims
    if not isinstance(dims, (list, tuple)) or not all(isinstance(d, int) for d in dims) or \
            sorted(d % rank for d in dims) != list(range(1, rank)):
        return None
    if targets is _MEANS:
        return {}
    if "unbiased" in n.kwargs and "correction" in n.kwargs:
        return None
    unbiased = n.kwargs.get("unbiased", True) if "correction" not in n.kwargs else n.kwargs["correction"]
    if unbiased not in (True, False, 0, 1) or isinstance(unbiased, float):
        return None
    return {"unbiased": bool(unbiased)}


def _size_of(a: Any, p: fx.Node, nodes: list) -> Optional[int]:
    """``a`` as a number: an int, or a size of ``p`` read in the trace (``p.size(0)``, ``p.shape[0]``), whose nodes
    are added to ``nodes``; None otherwise."""
    if isinstance(a, int) and not isinstance(a, bool):
        return a
    if not isinstance(a, fx.Node):
        return None
    if a.op == "call_method" and a.target == "size" and a.args[:1] == (p,) and len(a.args) == 2:
        nodes.append(a)
        return _shape(p)[a.args[1]] if isinstance(a.args[1], int) and len(_shape(p)) == 4 else None
    if a.op == "call_function" and a.target is operator.getitem and isinstance(a.args[0], fx.Node) and \
            isinstance(a.args[1], int) and len(_shape(p)) == 4:
        whole = a.args[0]
        if (whole.op == "call_function" and whole.target is getattr and whole.args == (p, "shape")) or \
                (whole.op == "call_method" and whole.target == "size" and whole.args == (p,)):
            nodes += [whole, a]
            return _shape(p)[a.args[1]]
    return None


def _row_stat(n: Any, p: fx.Node, targets: set) -> Optional[tuple[dict, list]]:
    """``({"unbiased": ...}, nodes)`` where ``n`` is mmcv's spelling of a statistic per output channel:
    ``p.view(out, -1)``'s ``targets`` call over its rows (``dim=1``, ``keepdim=True``) viewed ``(out, 1, 1, 1)``;
    None otherwise. A mean has no ``unbiased``."""
    nodes: list = []
    if not _is(n, {"view", "reshape"}) or n.kwargs or len(_shape(p)) != 4:
        return None
    out = _shape(p)[0]
    sizes = list(n.args[1:])
    sizes = list(sizes[0]) if len(sizes) == 1 and isinstance(sizes[0], (list, tuple)) else sizes
    if [_size_of(s, p, nodes) for s in sizes] != [out, 1, 1, 1]:
        return None
    stat = n.args[0]
    if not _is(stat, targets) or len(stat.args) > 2 or set(stat.kwargs) - {"dim", "keepdim", "unbiased"} or \
            _arg(stat, 1, "dim") not in (1, -1, (1,), [1]) or stat.kwargs.get("keepdim") is not True:
        return None
    flat = stat.args[0]
    if not _is(flat, {"view", "reshape"}) or flat.kwargs or flat.args[:1] != (p,) or \
            [_size_of(s, p, nodes) for s in flat.args[1:]] != [out, -1]:
        return None
    unbiased = stat.kwargs.get("unbiased", True)
    if targets is not _MEANS and not isinstance(unbiased, bool):
        return None
    return ({} if targets is _MEANS else {"unbiased": unbiased}), nodes + [flat, stat, n]


def _plus_eps(n: Any) -> Optional[tuple[fx.Node, float]]:
    """``(x, eps)`` where ``n`` adds the number ``eps`` to the node ``x``."""
    if not _is(n, _ADDS) or len(n.args) != 2 or n.kwargs:
        return None
    x, eps = n.args
    if not isinstance(x, fx.Node) or isinstance(eps, bool) or not isinstance(eps, (int, float)):
        return None
    return x, float(eps)


def _by_batch_norm(w: fx.Node) -> Optional[tuple[fx.Node, dict, list[fx.Node]]]:
    """timm's spelling: ``F.batch_norm(p.reshape(1, out, -1), None, None, training=True, ...).reshape_as(p)``."""
    if not _is(w, _RESHAPES_AS) or len(w.args) != 2 or w.kwargs:
        return None
    bn, p = w.args
    if not (isinstance(bn, fx.Node) and bn.op == "call_function" and bn.target is F.batch_norm) or \
            not isinstance(p, fx.Node) or p.op != "get_attr":
        return None
    flat = bn.args[0] if bn.args else None
    if len(_shape(p)) != 4:
        return None
    out = _shape(p)[0]
    if not _is(flat, {"reshape", "view"}) or flat.args[:1] != (p,) or list(flat.args[1:]) not in ([1, out, -1],):
        return None
    if any(_arg(bn, i, key) is not None for i, key in ((1, "running_mean"), (2, "running_var"), (4, "bias"))) or \
            _arg(bn, 5, "training") is not True:
        return None
    eps = _arg(bn, 7, "eps", 1e-5)
    if isinstance(eps, bool) or not isinstance(eps, (int, float)):
        return None
    attrs, chain = {"standardize": "batch_norm", "standardize_eps": float(eps)}, [flat, bn, w]
    if _arg(bn, 3, "weight") is not None:  # NFNets' ScaledStdConv2d: (gain * scale).view(-1), gain [out, 1, 1, 1]
        scaled = _scaled_gain(_arg(bn, 3, "weight"), out)
        if scaled is None:
            return None
        attrs["standardize_scale"] = scaled[0]
        chain[1:1] = scaled[1]
    return p, attrs, chain


def _scaled_gain(weight: Any, out: int) -> Optional[tuple[float, list[fx.Node]]]:
    """``(scale, [product, view])`` where ``weight`` (a batch norm's) is NFNets' learnt gain times a fixed scale,
    as timm's ScaledStdConv2d writes it: ``(gain * scale).view(-1)`` (``scale * gain``; ``reshape(-1)``), ``gain``
    a parameter of ``[out, 1, 1, 1]``; None otherwise."""
    if not _is(weight, {"view", "reshape"}) or weight.kwargs or list(weight.args[1:]) not in ([-1], [(-1,)]):
        return None
    product = weight.args[0]
    scaled = _times_number(product)
    if scaled is None:
        return None
    scale, gain = scaled
    if not isinstance(gain, fx.Node) or gain.op != "get_attr" or _shape(gain) != (out, 1, 1, 1):
        return None
    return scale, [product, weight]


def _times_gain(w: Any) -> Optional[tuple[fx.Node, fx.Node]]:
    """``(gain, other)`` where ``w`` is a product of two nodes, one a parameter (``get_attr``: ScaledStdConv2d's
    gain), in either order; None otherwise."""
    if not _is(w, _MULS) or len(w.args) != 2 or w.kwargs or not all(isinstance(a, fx.Node) for a in w.args):
        return None
    gain, other = w.args if w.args[0].op == "get_attr" else w.args[::-1]
    return (gain, other) if gain.op == "get_attr" else None


def _times_number(n: Any) -> Optional[tuple[float, Any]]:
    """``(number, other)`` where ``n`` is a product of a number (not a bool: ScaledStdConv2d's scale) and another
    value, in either order; None otherwise."""
    if not _is(n, _MULS) or len(n.args) != 2 or n.kwargs:
        return None
    number, other = n.args if not isinstance(n.args[0], fx.Node) else n.args[::-1]
    if isinstance(number, bool) or not isinstance(number, (int, float)):
        return None
    return float(number), other


def _both(first: fx.Node, second: fx.Node) -> Optional[fx.Node]:
    """The call whose outputs 0 and 1 ``first`` and ``second`` pick (torch.var_mean's, torch.std_mean's)."""
    picks = (first, second)
    if not all(isinstance(n, fx.Node) and n.op == "call_function" and n.target is operator.getitem and
               len(n.args) == 2 for n in picks) or first.args[0] is not second.args[0] or \
            (first.args[1], second.args[1]) != (0, 1):
        return None
    return first.args[0]


def _by_moments(w: fx.Node) -> Optional[tuple[fx.Node, dict, list[fx.Node]]]:
    """``(p - mean) / (std + eps)``, ``/ (var + eps).sqrt()`` or ``torch.var_mean``'s ``/ torch.sqrt(v + eps)``."""
    if not _is(w, _DIVS) or len(w.args) != 2 or w.kwargs:
        return None
    centred, spread = w.args
    if not _is(centred, _SUBS) or len(centred.args) != 2 or centred.kwargs:
        return None
    p, mean = centred.args
    if not isinstance(p, fx.Node) or p.op != "get_attr" or not isinstance(mean, fx.Node):
        return None
    plus = _plus_eps(spread)
    if plus is not None:  # (p - p.mean(...)) / (p.std(...) + eps)
        std, eps = plus
        rows = _row_stat(std, p, _STDS), _row_stat(mean, p, _MEANS)
        if None not in rows:  # mmcv's ConvWS2d: the statistics of p.view(out, -1)'s rows, viewed back
            inner = list(dict.fromkeys(rows[1][1] + rows[0][1]))
            return p, {"standardize": "std_rows", "standardize_eps": eps,
                       "standardize_unbiased": rows[0][0]["unbiased"]}, inner + [centred, spread, w]
        both = _both(std, mean)
        stat = _channel_stat(both, p, {torch.std_mean}) if both is not None else None
        if stat is not None:  # timm's older StdConv2d: torch.std_mean's std and mean
            return p, {"standardize": "std_mean", "standardize_eps": eps, "standardize_unbiased": stat["unbiased"]}, \
                [both, std, mean, centred, spread, w]
        stat = _channel_stat(std, p, _STDS)
        if stat is None or _channel_stat(mean, p, _MEANS) is None:
            return None
        return p, {"standardize": "std", "standardize_eps": eps, "standardize_unbiased": stat["unbiased"]}, \
            [mean, centred, std, spread, w]
    if not _is(spread, _SQRTS) or len(spread.args) != 1 or spread.kwargs or _plus_eps(spread.args[0]) is None:
        return None
    var, eps = _plus_eps(spread.args[0])
    stat = _channel_stat(var, p, _VARS)
    if stat is not None and _channel_stat(mean, p, _MEANS) is not None:
        return p, {"standardize": "var", "standardize_eps": eps, "standardize_unbiased": stat["unbiased"]}, \
            [mean, centred, var, spread.args[0], spread, w]
    both = _both(var, mean)
    stat = _channel_stat(both, p, {torch.var_mean}) if both is not None else None
    if stat is None:
        return None
    return p, {"standardize": "var_mean", "standardize_eps": eps, "standardize_unbiased": stat["unbiased"]}, \
        [both, var, mean, centred, spread.args[0], spread, w]


def _by_scaled_moments(w: fx.Node) -> Optional[tuple[fx.Node, dict, list[fx.Node]]]:
    """timm's older ScaledStdConv2d: ``s, m = torch.std_mean(p, ...)``, ``gain * (scale * (p - m) / (s + eps))``, the
    gain a parameter ``[out, 1, 1, 1]``: std_mean of ``standardize_scale``."""
    gained = _times_gain(w)
    if gained is None:
        return None
    gain, divided = gained
    if not _is(divided, _DIVS) or len(divided.args) != 2 or divided.kwargs:
        return None
    numerator, spread = divided.args
    scaled = _times_number(numerator)
    if scaled is None:
        return None
    scale, centred = scaled
    if not _is(centred, _SUBS) or len(centred.args) != 2 or centred.kwargs or _plus_eps(spread) is None:
        return None
    p, mean = centred.args
    std, eps = _plus_eps(spread)
    both = _both(std, mean) if isinstance(mean, fx.Node) else None
    if not isinstance(p, fx.Node) or p.op != "get_attr" or both is None or len(_shape(p)) != 4 or \
            _shape(gain) != (_shape(p)[0], 1, 1, 1):
        return None
    stat = _channel_stat(both, p, {torch.std_mean})
    if stat is None:
        return None
    return p, {"standardize": "std_mean", "standardize_eps": eps, "standardize_unbiased": stat["unbiased"],
               "standardize_scale": scale}, [both, std, mean, centred, numerator, spread, divided, w]


def _by_layer_norm(w: fx.Node) -> Optional[tuple[fx.Node, dict, list[fx.Node]]]:
    """``F.layer_norm(p, p.shape[1:], eps=eps)`` (timm's ScaledStdConv2d of ``use_layernorm``; a list of the sizes
    for ``p.shape[1:]``), alone or as ``gain * (scale * that)``, the gain a parameter ``[out, 1, 1, 1]``."""
    chain: list[fx.Node] = []
    attrs: dict = {}
    norm = w
    gained = _times_gain(w)
    if gained is not None:  # gain * (scale * F.layer_norm(...)): timm's ScaledStdConv2d of use_layernorm
        gain, scaled = gained
        times = _times_number(scaled)
        if times is None:
            return None
        attrs["standardize_scale"], norm = times
        chain += [scaled, w]
    if not (isinstance(norm, fx.Node) and norm.op == "call_function" and norm.target is F.layer_norm):
        return None
    p, sizes = norm.args[0], _arg(norm, 1, "normalized_shape")
    if not isinstance(p, fx.Node) or p.op != "get_attr" or len(_shape(p)) != 4 or \
            any(_arg(norm, i, key) is not None for i, key in ((2, "weight"), (3, "bias"))):
        return None
    if chain and _shape(gain) != (_shape(p)[0], 1, 1, 1):
        return None
    read: list[fx.Node] = []
    if isinstance(sizes, fx.Node):  # p.shape[1:] or p.size()[1:]
        whole = sizes.args[0] if sizes.op == "call_function" and sizes.target is operator.getitem else None
        if not (isinstance(whole, fx.Node) and sizes.args[1] == slice(1, None, None) and (
                (whole.op == "call_function" and whole.target is getattr and whole.args == (p, "shape")) or
                (whole.op == "call_method" and whole.target == "size" and whole.args == (p,)))):
            return None
        read = [whole, sizes]
    elif not isinstance(sizes, (list, tuple)) or list(sizes) != list(_shape(p)[1:]):
        return None
    eps = _arg(norm, 4, "eps", 1e-5)
    if isinstance(eps, bool) or not isinstance(eps, (int, float)):
        return None
    return p, {"standardize": "layer_norm", "standardize_eps": float(eps), **attrs}, read + [norm] + chain


def standardised_weights(gm: fx.GraphModule) -> dict[str, fx.Node]:
    """Each ``F.conv2d`` of ``gm`` whose weight is a parameter standardised in one of the module docstring's spellings,
    its weight's node marked (``STANDARDIZES``: the parameter's node) and the convolution's (``STANDARDIZE_ATTRS``);
    back come the nodes it takes in, by name, each mapped to the parameter's ``get_attr`` node. A spelling whose
    nodes are read by anything else, or whose parameter is (but by another such spelling: a layer called twice), is
    left out."""
    params = dict(gm.named_parameters())
    found = []
    for n in gm.graph.nodes:
        if n.op != "call_function" or n.target is not F.conv2d:
            continue
        w = _arg(n, 1, "weight")
        if not isinstance(w, fx.Node) or w.op == "get_attr":
            continue
        made = _by_batch_norm(w) or _by_moments(w) or _by_scaled_moments(w) or _by_layer_norm(w)
        if made is None or made[0].target not in params or len(_shape(made[0])) != 4:
            continue
        p, attrs, chain = made
        inside = set(chain) | {n}
        if all(set(m.users) <= inside for m in chain) and list(w.users) == [n]:
            found.append((n, w, p, attrs, chain))
    readers: dict[fx.Node, set] = {}  # each module tensor a spelling reads (its parameter, a gain) -> the nodes
    for _, _, _, _, chain in found:
        for held in {a for m in chain for a in m.all_input_nodes if a.op == "get_attr"}:
            readers.setdefault(held, set()).update(chain)
    taken: dict[str, fx.Node] = {}
    for n, w, p, attrs, chain in found:
        if all(set(a.users) <= readers[a] for m in chain for a in m.all_input_nodes if a.op == "get_attr"):
            w.meta[STANDARDIZES] = p
            n.meta[STANDARDIZE_ATTRS] = attrs
            gains = [a for m in chain for a in m.all_input_nodes if a.op == "get_attr" and a is not p]
            if gains:
                n.meta[STANDARDIZE_GAIN] = gains[0]
            taken.update((m.name, p) for m in chain)
    return taken
