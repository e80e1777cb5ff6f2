"""Patterns of fx nodes that describe as other ops than their own, each matcher returning the description nodes it
makes (None where ``n`` is not its pattern): sizes read off another map, a U-Net's pads, a convolution's own pad,
maxima and minima over dimensions, differences, quotients, sums, stacks, standard deviations, composed activations,
channel shuffles, matrix products and einsums, sorts, a pool's values, and the pieces and entries indexing takes."""
from __future__ import annotations

import operator
from typing import Any, Callable

import numpy as np
import torch
import torch.fx as fx
import torch.nn.functional as F
from torch import nn

from perf4sight.ir.schema import PIECE_CALL, SHARES, Node
from perf4sight.ir.shapes import SIZE_REFERENCES
from perf4sight.ir.fx_values import (_SPLITS, _UNBINDS, _arg, _is_tensor, _shape, _shape_value, _target_name,
                                     einsum_operands)
from perf4sight.ir.torch_modules import (_FIXED_SAMPLES, _adaptive_pool, _conv_pad, _fractional_maxpool_attrs, _maxpool,
                                         _softmax_attrs, _weight_norm_attr)
from perf4sight.ir.torch_calls import _STD_CALLS, _dims_after_the_batch, _NoOp, _permuted_dims, _refuse_alpha, _variance


# Sizes read off another map (shapes.SIZE_REFERENCES): a resize to another tensor's height and width, a U-Net's
# pad of its upsampled map to its skip's side, recorded by the node's name so that the description follows another
# input shape. Other arithmetic on sizes stays the numbers the trace gives.

def _shape_read(v: Any) -> tuple[fx.Node, list[int]] | None:
    """(the [N, C, H, W] tensor, the dimensions of it) that ``v`` reads the sizes of: its whole shape (``t.shape``,
    ``t.size()``), a slice of it (``t.shape[-2:]``), one side (``t.shape[2]``, ``t.size()[-1]``, ``t.size(2)``, one
    of ``h, w = t.shape[-2:]``); None for anything else."""
    if not isinstance(v, fx.Node) or not v.args or not isinstance(v.args[0], fx.Node):
        return None
    if (v.op == "call_function" and v.target is getattr and v.args[1:] == ("shape",)) \
            or (v.op == "call_method" and v.target == "size" and len(v.args) == 1 and not v.kwargs):
        tensor, dims = v.args[0], [0, 1, 2, 3]
    elif v.op == "call_method" and v.target == "size" and len(v.args) + len(v.kwargs) == 2:
        tensor, dims = v.args[0], _picked([0, 1, 2, 3], _arg(v, 1, "dim"))
    elif v.op == "call_function" and v.target is operator.getitem and len(v.args) == 2:
        whole = _shape_read(v.args[0])
        tensor, dims = (whole[0], _picked(whole[1], v.args[1])) if whole is not None else (None, None)
    else:
        return None
    rank = len(getattr(getattr(tensor, "meta", {}).get("tensor_meta"), "shape", ()))
    return (tensor, dims) if rank == 4 and dims is not None else None


def _picked(dims: list[int], index: Any) -> list[int] | None:
    """The entries of ``dims`` that ``index`` (a slice, or one position) picks; None for any other index."""
    if isinstance(index, slice) and all(isinstance(b, (int, type(None))) for b in (index.start, index.stop,
                                                                                   index.step)):
        return dims[index]
    if isinstance(index, int) and not isinstance(index, bool) and -len(dims) <= index < len(dims):
        return [dims[index]]
    return None


def _side_read(v: Any, dim: int) -> fx.Node | None:
    """The [N, C, H, W] tensor whose side ``dim`` (2: height, 3: width) ``v`` reads (:func:`_shape_read`); None for
    anything else."""
    read = _shape_read(v)
    return read[0] if read is not None and read[1] == [dim] else None


def _sides_read(v: Any) -> fx.Node | None:
    """The [N, C, H, W] tensor whose height and width ``v`` is (``t.shape[-2:]``, ``t.size()[2:]``,
    ``(t.shape[2], t.shape[3])``, ``[t.size(2), t.size(3)]``, ``(h, w)`` of ``h, w = t.shape[-2:]``); None for
    anything else."""
    if isinstance(v, (list, tuple)) and len(v) == 2:
        height = _side_read(v[0], 2)
        return height if height is not None and _side_read(v[1], 3) is height else None
    read = _shape_read(v)
    return read[0] if read is not None and read[1] == [2, 3] else None


def _is_op(v: Any, fn: Callable, second: Any = None) -> bool:
    """Whether ``v`` is the call ``fn(a, b)`` of two operands (``second``, where given, as ``b``)."""
    return isinstance(v, fx.Node) and v.op == "call_function" and v.target is fn and len(v.args) == 2 \
        and not v.kwargs and (second is None or v.args[1] == second)


def _split_difference(before: Any, after: Any) -> fx.Node | None:
    """The difference ``d`` that ``before`` and ``after`` split as a U-Net's ``Up`` block does (``d // 2`` and
    ``d - d // 2``); None for anything else."""
    if not (_is_op(before, operator.floordiv, 2) and _is_op(after, operator.sub)):
        return None
    d = before.args[0]
    half = after.args[1]
    return d if after.args[0] is d and _is_op(half, operator.floordiv, 2) and half.args[0] is d else None


def _difference_of_sides(d: Any, dim: int) -> tuple[fx.Node, fx.Node] | None:
    """(the larger map, the smaller) whose side ``dim`` the difference ``d`` takes (``x2.size()[2] -
    x1.size()[2]``); None for anything else."""
    if not _is_op(d, operator.sub):
        return None
    larger, smaller = _side_read(d.args[0], dim), _side_read(d.args[1], dim)
    return (larger, smaller) if larger is not None and smaller is not None else None


def _padded_to(n: fx.Node) -> fx.Node | None:
    """The map whose height and width the pad ``n`` brings its input to, where its pads are exactly a U-Net's
    ``Up`` block's (``F.pad(x1, [dx // 2, dx - dx // 2, dy // 2, dy - dy // 2])``, ``dy = x2.size()[2] -
    x1.size()[2]``, ``dx`` the widths', x1 the pad's input); None for other pads."""
    pads = _arg(n, 1, "pad")
    if not isinstance(pads, (list, tuple)) or len(pads) != 4:
        return None
    dx, dy = _split_difference(pads[0], pads[1]), _split_difference(pads[2], pads[3])
    widths, heights = _difference_of_sides(dx, 3), _difference_of_sides(dy, 2)
    if widths is None or widths != heights or widths[1] is not n.args[0]:
        return None
    return widths[0]


def _size_reference(n: fx.Node, op: str) -> fx.Node | None:
    """The tensor whose height and width the resize or pad ``n`` takes its size from, where it reads them (see
    :func:`_sides_read`, :func:`_padded_to`); None for any other node."""
    if n.op != "call_function":
        return None
    if op == "interpolate" and n.target is F.interpolate:
        return _sides_read(_arg(n, 1, "size"))
    if op == "pad" and n.target in (F.pad, torch._C._nn.pad):
        return _padded_to(n)
    if op == "fold" and n.target is F.fold:  # windows put back onto the map they came from: y.shape[-2:]
        return _sides_read(_arg(n, 1, "output_size"))
    return None


def _output_size_read(n: fx.Node, op: str) -> fx.Node | None:
    """The tensor whose height and width the transposed convolution layer ``n`` is given as its output size
    (``up(x, output_size=skip.shape[2:])``, or its whole shape, ``skip.shape``, ``skip.size()``: torch takes the
    last two); None for any other node."""
    if op != "conv_transpose2d" or n.op != "call_module":
        return None
    size = _arg(n, 1, "output_size")
    whole = _shape_read(size)
    return whole[0] if whole is not None and whole[1] == [0, 1, 2, 3] else _sides_read(size)


def _with_size_reference(n: fx.Node, op: str, attrs: dict, alias: dict[str, str]) -> dict:
    """``attrs`` of the node of ``n`` (of description op ``op``), with the name of the node whose map it takes its
    size from (:data:`SIZE_REFERENCES`) where it reads one (:func:`_size_reference`) the description holds; a pad
    computed from sizes otherwise marked ``pads_computed`` (its numbers the traced shape's)."""
    like = _size_reference(n, op) or _output_size_read(n, op)
    if like is not None and like.name in alias and "scale_factor" not in attrs:
        return {**attrs, SIZE_REFERENCES[op]: alias[like.name]}
    if op == "pad" and n.op == "call_function" and isinstance(_arg(n, 1, "pad"), (list, tuple)) \
            and any(isinstance(p, fx.Node) for p in _arg(n, 1, "pad")):
        return {**attrs, "pads_computed": True}
    return attrs


def _padded_first(n: fx.Node, gm: fx.GraphModule, inputs: list[str]) -> Node | None:
    """The ``pad`` node that a convolution ``n`` padding other than with zeros runs first (:func:`_conv_pad`), reading
    ``inputs``; named after the convolution, apart from every node of the trace; None for any other node."""
    m = gm.get_submodule(n.target) if n.op == "call_module" else None
    made = _conv_pad(m) if isinstance(m, nn.Conv2d) else None
    if made is None:
        return None
    op, attrs = made
    left, right, top, bottom = attrs["pads"]
    c, h, w = (int(v) for v in n.args[0].meta["tensor_meta"].shape[1:])
    taken = {x.name for x in gm.graph.nodes}
    name, i = f"{n.name}_pad", 1
    while name in taken:
        name, i = f"{n.name}_pad_{i}", i + 1
    return Node(name, op, inputs, attrs, [c, h + top + bottom, w + left + right])


#: reductions to the largest (smallest) value over dimensions: those returning values and indices, those values alone
_MAX_CALLS = {torch.max: False, "max": False, torch.min: True, "min": True}
_AMAX_CALLS = {torch.amax: False, "amax": False, torch.amin: True, "amin": True}


def _is_max_call(source: Any) -> bool:
    return isinstance(source, fx.Node) and source.op in ("call_function", "call_method") and \
        source.target in _MAX_CALLS


_EXTREMES = {torch.maximum: "maximum", "maximum": "maximum", torch.minimum: "minimum", "minimum": "minimum",
             torch.max: "maximum", "max": "maximum", torch.min: "minimum", "min": "minimum"}


def _extreme_nodes(n: fx.Node, gm: fx.GraphModule, alias: dict[str, str]) -> list[Node] | None:
    """``torch.maximum(x, y)``, ``torch.minimum``, ``x.maximum(y)``, and ``torch.max(x, y)``/``torch.min`` of two
    tensors: the op maximum or minimum of the two, broadcast; ``ValueError`` where one is a module's own tensor. None
    for any other call (a max over dimensions: :func:`_max_values`)."""
    if n.op not in ("call_function", "call_method") or n.target not in _EXTREMES or len(n.args) + len(n.kwargs) != 2:
        return None
    other = n.args[1] if len(n.args) == 2 else n.kwargs.get("other")
    if not _is_tensor(other):
        return None
    op, first = _EXTREMES[n.target], n.args[0]
    for operand in (first, other):
        _network_tensor(operand, alias, op)
    alias[n.name] = n.name
    return [Node(n.name, op, [alias[first.name], alias[other.name]], {}, _shape(n))]


def _reduced_dims(call: fx.Node) -> tuple[list[int], bool]:
    """The dimensions (counting the batch's) a max, min, amax or amin call ``call`` reduces, and its ``keepdim``;
    ``ValueError`` for the max of two tensors, one over every dimension or the batch's, or dimensions apart."""
    other = _arg(call, 1, "dim", _arg(call, 1, "other"))
    if isinstance(other, fx.Node):
        raise ValueError(f"a {_target_name(call.target)} of two tensors "
                         "has no description op")
    rank = len(call.args[0].meta["tensor_meta"].shape)
    if other is None or other == ():
        raise ValueError("a max or min over every dimension (no dim given) reduces the batch too; give dim=")
    dims = sorted({int(d) % rank for d in ([other] if isinstance(other, int) else other)})
    if dims[0] == 0 or dims != list(range(dims[0], dims[-1] + 1)):
        raise ValueError(f"a max or min over dimensions {dims} (the batch's, or dimensions apart) has no description "
                         "op")
    return dims, bool(_arg(call, 2, "keepdim", False))


def _max_values(n: fx.Node, call: fx.Node, gm: fx.GraphModule, alias: dict[str, str]) -> list[Node]:
    """The values of ``call``, a max or min over dimensions (``torch.max(x, 1, keepdim=True)[0]``, ``.values``,
    ``x.amax((2, 3))``), as the ops that compute them: the input viewed as ``[A, B, C]`` (the dimensions before, over
    and after the reduced ones), an adaptive max pool to ``[A, 1, C]`` (torch's max over a dimension: the values and
    their int64 indices, kept for backward) and a view to the output's shape; a min is the max of the input times -1,
    times -1. ``n`` is the node of those values; the nodes made are named after it."""
    dims, _ = _reduced_dims(call)
    source = call.args[0]
    _network_tensor(source, alias, "max or min")
    sample = [int(v) for v in source.meta["tensor_meta"].shape[1:]]
    before, over, after = (int(np.prod(part)) for part in (sample[:dims[0] - 1], sample[dims[0] - 1:dims[-1]],
                                                              sample[dims[-1]:]))
    taken = {x.name for x in gm.graph.nodes}
    names = iter(name for name in (f"{n.name}_{i}" for i in range(1, 99)) if name not in taken)
    negated = _MAX_CALLS.get(call.target, _AMAX_CALLS.get(call.target))
    made: list[Node] = []

    def add(op: str, attrs: dict, shape: list[int], name: str | None = None) -> None:
        made.append(Node(name or next(names), op, [made[-1].name if made else alias[source.name]], attrs, shape))
    if negated:
        add("mul", {"scalar": -1.0}, sample)
    add("reshape", {"shape": [before, over, after]}, [before, over, after])
    add("adaptivemaxpool2d", {"output_size": [1, after]}, [before, 1, after])
    add("reshape", {"shape": _shape(n)}, _shape(n), None if negated else n.name)
    if negated:
        add("mul", {"scalar": -1.0}, _shape(n), n.name)
    alias[n.name] = n.name
    return made


_SUM_CALLS = {torch.sum, "sum"}
_SUBTRACTIONS = {operator.sub, torch.sub, "sub", torch.rsub}


def _network_tensor(a: Any, alias: dict[str, str], call: str) -> None:
    """``ValueError`` where ``a``, read by ``call``, is a module's own tensor (a buffer, a parameter, or a view of one:
    a tensor no description node computes) rather than one of the network's or a number."""
    if _is_tensor(a) and a.name not in alias:
        article = "an" if call[0] in "aeiou" else "a"
        raise ValueError(f"{article} {call} of the module's tensor {a.target if a.op == 'get_attr' else a.name} has no "
                         "description op (one of the network's own tensors has; a parameter added is a 'shift', one "
                         "multiplied a 'scale')")


def _operand_pair(n: fx.Node, *allowed: str) -> tuple[Any, Any] | None:
    """The two operands of the call ``n``, the second given as it is or as ``other=`` (``torch.sub(x, other=y)``);
    None where it has not two, or a keyword argument besides ``other`` and ``allowed`` (``alpha``)."""
    operands = [*n.args, *(n.kwargs[k] for k in ("other",) if k in n.kwargs)]
    if set(n.kwargs) - {"other", *allowed} or len(operands) != 2:
        return None
    return operands[0], operands[1]


def _difference_nodes(n: fx.Node, gm: fx.GraphModule, alias: dict[str, str]) -> list[Node] | None:
    """``x - y`` of two tensors (``x - x.mean(1, keepdim=True)``) or ``1 - g`` of a number and a tensor (a gated
    fusion's ``x * (1 - g)``): the subtracted tensor times -1, then added (to the other tensor, broadcast, or to the
    number). None for any other subtraction (a tensor less a number: :func:`_by_scalar`); ``ValueError`` for one of a
    module's own tensor (a buffer's mean, a parameter), which no description node is."""
    if n.op not in ("call_function", "call_method") or n.target not in _SUBTRACTIONS:
        return None
    _refuse_alpha(n, *(("an rsub", "y - alpha * x") if n.target is torch.rsub else ("a sub", "x - alpha * y")))
    pair = _operand_pair(n, "alpha")
    if pair is None:
        return None
    first, second = pair[::-1] if n.target is torch.rsub else pair
    if not _is_tensor(second) or isinstance(first, bool) or not (_is_tensor(first) or isinstance(first, (int, float))):
        return None
    for operand in (first, second):
        _network_tensor(operand, alias, "sub")
    taken = {x.name for x in gm.graph.nodes}
    negated = next(name for name in (f"{n.name}_{i}" for i in range(1, 99)) if name not in taken)
    alias[n.name] = n.name
    if _is_tensor(first):
        added: tuple[list[str], dict] = ([alias[first.name], negated], {})
    else:
        added = ([negated], {"scalar": float(first)})
    return [Node(negated, "mul", [alias[second.name]], {"scalar": -1.0}, _shape(second)),
            Node(n.name, "add", added[0], added[1], _shape(n))]


_DIVISIONS = {operator.truediv, torch.div, torch.true_divide, "div", "true_divide"}


def _quotient_nodes(n: fx.Node, gm: fx.GraphModule, alias: dict[str, str]) -> list[Node] | None:
    """``x / y`` of two tensors (an L2 normalisation's ``x / x.pow(2).sum(1, keepdim=True).sqrt()``, a hand-written
    norm's): the op div, broadcast; ``c / y`` of a number and a tensor as torch computes it: the divisor's reciprocal
    (the power -1), times the number. None for any other division (a tensor over a number: :func:`_by_scalar`);
    ``ValueError`` for one of a module's own tensor (``x / self.std``, a buffer), which no description node is."""
    pair = _operand_pair(n, "rounding_mode") if n.op in ("call_function", "call_method") and n.target in _DIVISIONS \
        else None
    if pair is None or n.kwargs.get("rounding_mode") is not None:
        return None
    first, second = pair
    if not _is_tensor(second) or isinstance(first, bool) or not (_is_tensor(first) or isinstance(first, (int, float))):
        return None
    for operand in (first, second):
        _network_tensor(operand, alias, "div")
    alias[n.name] = n.name
    if _is_tensor(first):
        return [Node(n.name, "div", [alias[first.name], alias[second.name]], {}, _shape(n))]
    taken = {x.name for x in gm.graph.nodes}
    inverse = next(name for name in (f"{n.name}_{i}" for i in range(1, 99)) if name not in taken)
    return [Node(inverse, "pow", [alias[second.name]], {"exponent": -1.0}, _shape(second)),
            Node(n.name, "mul", [inverse], {"scalar": float(first)}, _shape(n))]


def _conv1d_attrs(m: nn.Conv1d) -> dict:
    """A ``conv2d``'s attrs for ``nn.Conv1d`` ``m`` run on its input viewed as [N, C, 1, L]: a kernel of (1, k), the
    stride, padding and dilation along the width; ``ValueError`` for a padding other than with zeros or a 'same' one
    that pads one side more."""
    if m.padding_mode != "zeros":
        raise ValueError(f"a Conv1d with padding_mode='{m.padding_mode}' has no description op; pad with zeros")
    (k,), (d,) = m.kernel_size, m.dilation
    if m.padding == "same" and d * (k - 1) % 2:
        raise ValueError(f"a Conv1d with padding='same' and kernel {k} (dilation {d}) pads one side more than the "
                         "other, which a description cannot say; give the padding as a number")
    p = 0 if m.padding == "valid" else d * (k - 1) // 2 if m.padding == "same" else int(m.padding[0])
    return {"in_channels": m.in_channels, "out_channels": m.out_channels, "kernel_size": [1, int(k)],
            "stride": [1, int(m.stride[0])], "padding": [0, p], "dilation": [1, int(d)], "groups": m.groups,
            "bias": m.bias is not None, **_weight_norm_attr(m)}


def _conv1d_nodes(n: fx.Node, gm: fx.GraphModule, alias: dict[str, str]) -> list[Node] | None:
    """``nn.Conv1d`` over a [N, C, L] tensor (ECA-Net's gate: a convolution along the channels of a pooled map, viewed
    as [N, 1, C]), as torch runs it: its input viewed as [N, C, 1, L], a ``conv2d`` of kernel (1, k) named after the
    layer, and its output viewed back as [N, C', L']. None for any other node."""
    if n.op != "call_module" or not isinstance(gm.get_submodule(n.target), nn.Conv1d):
        return None
    attrs = _conv1d_attrs(gm.get_submodule(n.target))
    (c, length), (c_out, out_length) = _shape(n.args[0]), _shape(n)
    taken = {x.name for x in gm.graph.nodes}
    viewed, back = (next(name for name in (f"{n.name}_{what}_{i}" for i in range(1, 99)) if name not in taken)
                    for what in ("2d", "1d"))
    alias[n.name] = back
    return [Node(viewed, "unsqueeze", [alias[n.args[0].name]], {"dim": 2}, [c, 1, length]),
            Node(n.name, "conv2d", [viewed], attrs, [c_out, 1, out_length]),
            Node(back, "squeeze", [n.name], {"dim": 2}, [c_out, out_length])]


def _stack_nodes(n: fx.Node, gm: fx.GraphModule, alias: dict[str, str]) -> list[Node] | None:
    """``torch.stack(tensors, dim)`` (SKNet's branches stacked for a softmax over them) as torch computes it: each
    tensor unsqueezed at ``dim`` (a view), then concatenated along it; ``ValueError`` for a stack along the batch
    dimension. None for any other node."""
    if n.op != "call_function" or n.target is not torch.stack:
        return None
    tensors, dim = _arg(n, 0, "tensors"), _arg(n, 1, "dim", 0)
    out = _shape(n)
    pieces = _stacked_pieces(tensors)
    if pieces is None and (not isinstance(tensors, (list, tuple)) or not all(_is_tensor(t) for t in tensors)) \
            or out is None:
        raise ValueError("a stack of anything but a list of tensors, or of an unbind's, chunk's or split's pieces "
                         "(whole or a slice of them), has no description op")
    dim = int(dim) % (len(out) + 1)
    if dim == 0:
        raise ValueError("a stack along the batch dimension (dim 0) has no description op")
    made: list[Node] = []
    if pieces is None:
        for t in tensors:
            _network_tensor(t, alias, "stack")
        inputs = [alias[t.name] for t in tensors]
    else:
        inputs = [_stacked_piece(*piece, alias, made) for piece in pieces]
    taken = {x.name for x in gm.graph.nodes}
    names = iter(name for name in (f"{n.name}_{i}" for i in range(1, 999)) if name not in taken)
    unsqueezed = [Node(next(names), "unsqueeze", [t], {"dim": dim}, out[:dim - 1] + [1] + out[dim:]) for t in inputs]
    alias[n.name] = n.name
    return made + unsqueezed + [Node(n.name, "cat", [u.name for u in unsqueezed], {"dim": dim}, out)]


def _stacked_pieces(tensors: Any) -> list[tuple[fx.Node, int]] | None:
    """The pieces a stack's ``tensors`` are, as (the unbind, chunk or split node, the piece's index), where they are
    that call's tuple whole or a slice of it (``torch.stack(p, 3)``, ``torch.stack(p[:2], 1)``,
    ``torch.stack(p[::-1], 2)`` of ``p = x.unbind(1)``); None for anything else."""
    if not isinstance(tensors, fx.Node):
        return None
    source, index = tensors, slice(None)
    if tensors.op == "call_function" and tensors.target is operator.getitem and isinstance(tensors.args[0], fx.Node) \
            and isinstance(tensors.args[1], slice):
        source, index = tensors.args
    meta = source.meta.get("tensor_meta")
    if source.op not in ("call_function", "call_method") or source.target not in _SPLITS | _UNBINDS \
            or not isinstance(meta, (tuple, list)) or hasattr(meta, "shape") or not meta \
            or not all(hasattr(m, "shape") for m in meta):
        return None
    return [(source, i) for i in range(len(meta))[index]]


def _stacked_piece_made(n: fx.Node, alias: dict[str, str]) -> str | None:
    """The description node of the piece ``n`` takes (``p[1]`` of an unbind's or chunk's tuple ``p``) where a stack
    of the pieces read before made it (:func:`_stacked_piece`), else None."""
    source, index = n.args
    meta = source.meta.get("tensor_meta") if isinstance(source, fx.Node) else None
    if not isinstance(index, int) or isinstance(index, bool) or not isinstance(meta, (tuple, list)) \
            or hasattr(meta, "shape") or not meta:
        return None
    return alias.get(f"{source.name}__stacked_{index % len(meta)}")


def _stacked_piece(source: fx.Node, index: int, alias: dict[str, str], made: list[Node]) -> str:
    """The description node of piece ``index`` of the unbind, chunk or split ``source`` a stack reads: the piece's
    own where a ``source[index]`` read before made it (one tensor), else one made here into ``made`` (a select of
    ``unbind`` true or a narrow of ``split_sizes``, of the call's ``call``), once for every stack that reads it."""
    count = len(source.meta["tensor_meta"])
    for user in source.users:
        if user.op == "call_function" and user.target is operator.getitem and isinstance(user.args[1], int) \
                and user.args[1] % count == index and user.name in alias:
            return alias[user.name]
    name = f"{source.name}__stacked_{index}"
    if name not in alias:
        made.append(_unbound_piece(source, index, name, alias) if source.target in _UNBINDS
                    else _split_piece(source, index, name, alias))
        alias[name] = name
    return alias[name]


_CHANNEL_SHUFFLES = {torch.channel_shuffle, torch.native_channel_shuffle, F.channel_shuffle,
                     F.native_channel_shuffle}


def _channel_shuffle_nodes(n: fx.Node, gm: fx.GraphModule, alias: dict[str, str]) -> list[Node] | None:
    """``nn.ChannelShuffle(g)``, ``F.channel_shuffle(x, g)`` (ShuffleNet's shuffle of a [N, C, *] map) as torch's
    math_channel_shuffle computes it: a view into [g, C / g, *] groups, the two group dimensions swapped, and a
    reshape back to [C, *] (a copy). Its one output-sized copy forward and one backward are aten.channel_shuffle's
    (no tensor kept), so the description is that of a view-and-transpose shuffle written by hand. None for any other
    node."""
    if n.op == "call_module" and isinstance(gm.get_submodule(n.target), nn.ChannelShuffle):
        groups = gm.get_submodule(n.target).groups
    elif n.op == "call_function" and n.target in _CHANNEL_SHUFFLES:
        groups = _arg(n, 1, "groups")
    else:
        return None
    source, out = n.args[0], _shape(n)
    _network_tensor(source, alias, "channel shuffle")
    channels, rest = out[0], out[1:]
    taken = {x.name for x in gm.graph.nodes}
    grouped, swapped = (next(name for name in (f"{n.name}_{what}_{i}" for i in range(1, 99)) if name not in taken)
                        for what in ("groups", "swapped"))
    alias[n.name] = n.name
    g = int(groups)
    return [Node(grouped, "reshape", [alias[source.name]], {"shape": [g, channels // g, *rest]},
                 [g, channels // g, *rest]),
            Node(swapped, "transpose", [grouped], {"dim0": 1, "dim1": 2}, [channels // g, g, *rest]),
            Node(n.name, "reshape", [swapped], {"shape": out}, out)]


def _std_nodes(n: fx.Node, gm: fx.GraphModule, alias: dict[str, str]) -> list[Node] | None:
    """``x.std(dims, ...)``: the variance (:func:`_variance`), then its square root (torch's std: one kernel keeping
    its input and its result, these two: the input and the root kept, a reduced tensor's kernel more). None for any
    other node."""
    if n.op not in ("call_function", "call_method") or n.target not in _STD_CALLS or _shape(n) is None:
        return None
    _, attrs = _variance(n)
    _network_tensor(n.args[0], alias, "standard deviation")
    rank = len(_shape(n.args[0])) + 1  # the batch's dimension included
    if 0 in {d % rank for d in attrs["dims"]}:
        raise ValueError("a standard deviation over the batch dimension (dim 0) has no description op")
    taken = {x.name for x in gm.graph.nodes}
    variance = next(name for name in (f"{n.name}_{i}" for i in range(1, 99)) if name not in taken)
    alias[n.name] = n.name
    return [Node(variance, "var", [alias[n.args[0].name]], attrs, _shape(n)),
            Node(n.name, "pow", [variance], {"exponent": 0.5}, _shape(n))]


#: Activations torch computes as a few elementwise ops in Python (torch.nn.functional), by their layer and their call:
#: Softsign ``x / (x.abs() + 1)``, Tanhshrink ``x - x.tanh()``, Softmin ``(-x).softmax(dim)``.
_COMPOSED_LAYERS = {nn.Softsign: "softsign", nn.Tanhshrink: "tanhshrink", nn.Softmin: "softmin"}
_COMPOSED_CALLS = {F.softsign: "softsign", F.tanhshrink: "tanhshrink", F.softmin: "softmin"}


def _composed_kind(n: fx.Node, gm: fx.GraphModule) -> str | None:
    """Which of :data:`_COMPOSED_LAYERS` (or their calls) ``n`` is; None for any other node."""
    if n.op == "call_module":
        layer = gm.get_submodule(n.target)
        return next((kind for cls, kind in _COMPOSED_LAYERS.items() if isinstance(layer, cls)), None)
    return _COMPOSED_CALLS.get(n.target) if n.op == "call_function" else None


def _softmin_dim(n: fx.Node, gm: fx.GraphModule) -> Any:
    """The ``dim`` of Softmin ``n`` (the layer's, or the call's; a call that casts, ``dtype=``, ``ValueError``)."""
    if n.op == "call_module":
        return gm.get_submodule(n.target).dim
    dtype = _arg(n, 3, "dtype")
    if dtype is not None and dtype != torch.float32:
        raise ValueError("a softmin that casts (dtype=) has no description op")
    return _arg(n, 1, "dim")


def _composed_activation_nodes(n: fx.Node, gm: fx.GraphModule, alias: dict[str, str]) -> list[Node] | None:
    """Softsign, Tanhshrink and Softmin (the layers and the calls) as torch computes them, op by op: a softsign the
    input over its absolute value plus 1 (abs, add, div), a tanhshrink the input less its tanh (tanh, then the
    difference as every ``x - y`` is described: times -1, added), a softmin the softmax of the input times -1 (along
    a dimension as a softmax's: not the batch's, not torch's implicit choice). The last node is named after ``n``.
    None for any other node."""
    kind = _composed_kind(n, gm)
    if kind is None:
        return None
    source = n.args[0] if n.args else n.kwargs.get("input")
    _network_tensor(source, alias, kind)
    x, shape = alias[source.name], _shape(n)
    taken = {node.name for node in gm.graph.nodes}
    names = (name for name in (f"{n.name}_{i}" for i in range(1, 99)) if name not in taken)
    first, second = next(names), next(names)
    alias[n.name] = n.name
    if kind == "softsign":
        return [Node(first, "abs", [x], {}, shape), Node(second, "add", [first], {"scalar": 1.0}, shape),
                Node(n.name, "div", [x, second], {}, shape)]
    if kind == "tanhshrink":
        return [Node(first, "tanh", [x], {}, shape), Node(second, "mul", [first], {"scalar": -1.0}, shape),
                Node(n.name, "add", [x, second], {}, shape)]
    try:
        op, attrs = _softmax_attrs(n, _softmin_dim(n, gm))
    except ValueError as exc:  # named as the layer or call it is
        raise ValueError(str(exc).replace("a softmax", "a softmin")) from None
    return [Node(first, "mul", [x], {"scalar": -1.0}, shape), Node(n.name, op, [first], attrs, shape)]


def _sum_nodes(n: fx.Node, gm: fx.GraphModule, alias: dict[str, str]) -> list[Node]:
    """``x.sum(dims)``, ``torch.sum(x, dims, keepdim)`` (timm's split attention sums over its radix): the mean over
    those dimensions times their elements' count, the same work on the same tensors; over none given (every
    dimension, the batch's too) or over the batch's, ``ValueError``."""
    dims = _arg(n, 1, "dim")
    if dims is None or isinstance(dims, fx.Node) or n.kwargs.get("dtype") is not None or len(n.args) > 3:
        raise ValueError("a sum over every dimension, or of another type (dtype=), has no description op; give dim=")
    source = n.args[0]
    rank = len(source.meta["tensor_meta"].shape) if _is_tensor(source) else 0
    dims = sorted({int(d) % max(rank, 1) for d in ([dims] if isinstance(dims, int) else dims)})
    return _summed(n, source, dims, bool(_arg(n, 2, "keepdim", False)), gm, alias)


def _summed(n: fx.Node, source: fx.Node, dims: list[int], keepdim: bool, gm: fx.GraphModule,
            alias: dict[str, str]) -> list[Node]:
    """The nodes of ``n``, ``source`` summed over ``dims`` (counted from the front, sorted): the mean over them times
    their elements' count (:func:`_sum_nodes`); over the batch's, ``ValueError``."""
    _network_tensor(source, alias, "sum")
    shape = [int(v) for v in source.meta["tensor_meta"].shape]
    if 0 in dims:
        raise ValueError("a sum over the batch dimension (dim 0) has no description op")
    taken = {x.name for x in gm.graph.nodes}
    mean = next(name for name in (f"{n.name}_{i}" for i in range(1, 99)) if name not in taken)
    count = float(np.prod([shape[d] for d in dims]))
    alias[n.name] = n.name
    return [Node(mean, "mean", [alias[source.name]], {"dims": dims, "keepdim": keepdim}, _shape(n)),
            Node(n.name, "mul", [mean], {"scalar": count}, _shape(n))]


_MATRIX_PRODUCTS = {operator.matmul, torch.matmul, torch.bmm, "matmul", "bmm"}
_SORTS = {torch.sort, "sort", torch.topk, "topk"}
#: A sort's indices alone (torch 2.14 runs aten.sort, its values not read): read by gathers, a sort of gather.
_ARGSORTS = {torch.argsort, "argsort"}


def _sort_attrs(call: fx.Node) -> tuple[str, dict]:
    """The op and attrs of ``torch.sort(x, dim, descending)``/``x.sort`` or ``torch.topk(x, k, dim, largest,
    sorted)``/``x.topk`` (dims counted from the front); one along the batch, a stable sort (``stable=``) or an
    unsorted topk (``sorted=False``: its order is the kernel's) is refused by name."""
    name = _target_name(call.target)
    if name in ("sort", "argsort"):
        if call.kwargs.get("stable") or len(call.args) > 3 and call.args[3]:
            raise ValueError(f"a stable {name} (stable=True) has no description op; leave stable out")
        (dim,) = _dims_after_the_batch(call, _arg(call, 1, "dim", -1), "sort")
        return "sort", {"dim": dim, "descending": bool(_arg(call, 2, "descending", False))}
    if not _arg(call, 4, "sorted", True):
        raise ValueError("a topk of sorted=False (its values in the kernel's order) has no description op")
    (dim,) = _dims_after_the_batch(call, _arg(call, 2, "dim", -1), "topk")
    return "topk", {"k": int(_shape_value(_arg(call, 1, "k"))), "dim": dim,
                    "largest": bool(_arg(call, 3, "largest", True))}


def _sorted_part(n: fx.Node, alias: dict[str, str]) -> list[Node] | None:
    """``n``'s nodes where it reads the values of a sort or a topk (``[0]``, ``.values``: the op sort or topk of
    the call's input; a later read of them that one's node), none where it is their indices and nothing reads them;
    None where it is neither. Indices that are read are a :class:`_NoOp` (a description's tensors are float32), but
    where a gather reads them (:func:`_gathered_at_sorted`): that gather is the op of the call's input and the tensor
    gathered, flagged ``gather``, the indices and their views no nodes of their own."""
    gathered = _gathered_at_sorted(n)
    if gathered is not None:
        return _sorted_gather_nodes(n, gathered, alias)
    if n.op != "call_function" or n.target not in (operator.getitem, getattr) or \
            getattr(n.args[0], "target", None) not in _SORTS:
        return None
    call = n.args[0]
    if n.args[1] in (0, "values"):
        if alias.get(n.name) == n.name:  # put before the gathers at the call's indices (_sorted_gather_nodes)
            return []
        earlier = _earlier_values_read(n, alias)
        if earlier is not None:
            alias[n.name] = alias[earlier.name]
            return []
        op, attrs = _sort_attrs(call)
        if call.args[0].name not in alias:
            raise ValueError(f"a {op} of {call.args[0].name}, a value the description cannot follow, has no "
                             "description op")
        alias[n.name] = n.name
        return [Node(n.name, op, [alias[call.args[0].name]], attrs, _shape(n))]
    if n.users:
        label = _target_name(call.target)
        raise _NoOp(f"the indices (int64) of {call.op} '{label}' (node {call.name}){_index_reader(n)}",
                    f"indices of {label}", n)
    return []


#: Calls that only reshape or broadcast indices on their way to the op that reads them (``idx.unsqueeze(-1)
#: .expand(-1, -1, C)`` before a gather).
_INDEX_VIEWS = {"unsqueeze", "expand", "expand_as", "view", "reshape", "repeat", "flatten", torch.unsqueeze,
                torch.reshape, torch.flatten}


#: Views that broadcast a sort's indices over the gathered tensor's trailing dims (idx.unsqueeze(-1).expand(...)).
_INDEX_BROADCASTS = {"unsqueeze", "expand", "expand_as", "view", "reshape", torch.unsqueeze, torch.reshape}
_GATHERS = {torch.gather, "gather"}


def _is_index_view(n: Any) -> bool:
    """Whether ``n`` is a call of :data:`_INDEX_BROADCASTS` of a traced value (indices on their way to a gather)."""
    return isinstance(n, fx.Node) and n.op in ("call_function", "call_method") and n.target in _INDEX_BROADCASTS \
        and isinstance(n.args[0], fx.Node)


def _index_path(n: fx.Node) -> list[fx.Node]:
    """``n`` and the views it is made of, up to the first value that is no view (the indices)."""
    chain = [n]
    while _is_index_view(chain[-1]):
        chain.append(chain[-1].args[0])
    return chain


def _index_gathers(indices: fx.Node) -> list[fx.Node] | None:
    """The gathers that read ``indices`` through views alone, in the graph's order; None where a view or the indices
    are read by anything else (or by a gather as other than its index)."""
    gathers, views = [], [indices]
    while views:
        view = views.pop()
        for user in view.users:
            if _is_index_view(user) and user.args[0] is view:
                views.append(user)
            elif user.target in _GATHERS and len(user.args) == 3 and not user.kwargs and user.args[2] is view and \
                    user.args[0] is not view and _is_tensor(user.args[0]):
                gathers.append(user)
            else:
                return None
    order = {node: i for i, node in enumerate(indices.graph.nodes)}
    return sorted(set(gathers), key=order.__getitem__) or None


def _gathers_at(call: fx.Node, indices: fx.Node, gather: fx.Node) -> bool:
    """Whether ``gather`` picks a tensor x at ``indices`` of the sort or topk ``call`` along its dim, through views
    that keep the indices' dims or broadcast those of size 1 and add trailing ones, to x's shape but along dim."""
    chain = _index_path(gather.args[2])
    if chain[-1] is not indices:
        return False
    sorted_shape = [int(v) for v in call.args[0].meta["tensor_meta"].shape]
    x_shape = [int(v) for v in gather.args[0].meta["tensor_meta"].shape]
    rank = len(sorted_shape)
    dim = _sort_attrs(call)[1]["dim"]
    picked = [int(v) for v in indices.meta["tensor_meta"].shape]
    if not isinstance(gather.args[1], int) or gather.args[1] % len(x_shape) != dim or len(x_shape) < rank or \
            any(sorted_shape[d] not in (x_shape[d], 1) for d in range(rank) if d != dim):
        return False
    full = [picked[dim] if d == dim else x_shape[d] for d in range(len(x_shape))]  # the indices broadcast to it
    for view in chain[:-1]:  # each keeps the indices' dims, or broadcasts one of size 1, adds trailing
        shape = [int(v) for v in view.meta["tensor_meta"].shape]
        if len(shape) > len(full) or any(shape[d] not in (picked[d], full[d]) for d in range(rank)) or \
                any(v not in (1, full[d]) for d, v in enumerate(shape) if d >= rank):
            return False
    return [int(v) for v in chain[0].meta["tensor_meta"].shape] == full


def _gathered_at_sorted(n: fx.Node) -> tuple[fx.Node, fx.Node, fx.Node] | None:
    """Where ``n`` is a sort's or a topk's indices (``[1]``, ``.indices``), a view of them on their way to gathers,
    or one of those gathers, and each gather picks a tensor x at them along the sort's dim (``x.gather(dim, idx)``
    of an x of the sorted tensor's shape; token pruning's ``x.gather(1, idx.unsqueeze(-1).expand(-1, -1, C))`` of an
    x of its shape and trailing dims, and of the tokens' position codes at the same indices; a map's top channels,
    ``y.gather(1, idx.expand(-1, -1, H, W))`` of indices of a pooled [C, 1, 1]: the indices broadcast to x's shape
    but along dim, their size-1 dims and trailing ones expanded): (the sort's call, ``n`` where it is a gather, else
    the first, the first gather); None for anything else."""
    if n.op in ("call_function", "call_method") and n.target in _GATHERS:
        if len(n.args) != 3 or n.kwargs or not isinstance(n.args[2], fx.Node):
            return None
        indices = _index_path(n.args[2])[-1]
    else:
        indices = _index_path(n)[-1]
    argsort = indices.op in ("call_function", "call_method") and indices.target in _ARGSORTS
    if not argsort and (indices.op != "call_function" or indices.target not in (operator.getitem, getattr) or
                        getattr(indices.args[0], "target", None) not in _SORTS or
                        indices.args[1] not in (1, "indices")):
        return None
    gathers = _index_gathers(indices)
    call = indices if argsort else indices.args[0]
    if gathers is None or not all(_gathers_at(call, indices, gather) for gather in gathers):
        return None
    return call, (n if n in gathers else gathers[0]), gathers[0]


def _sorted_gather_nodes(n: fx.Node, found: tuple[fx.Node, fx.Node, fx.Node], alias: dict[str, str]) -> list[Node]:
    """``n``'s nodes where it is a sort's indices, a view of them or a gather reading them
    (:func:`_gathered_at_sorted`): none but for a gather, the op sort or topk of the sorted tensor and the tensor
    gathered, flagged ``gather``; a later gather at the same indices ``shares`` the first's (its gather alone). Where
    the call's values are read too (``v, i = s.topk(k)``, the tokens weighted by their scores), their node, the op of
    the values alone, is the one every gather ``shares`` (the call runs once), put before the first gather where
    they are read after it."""
    call, gather, first = found
    if n is not gather:
        return []
    op, attrs = _sort_attrs(call)
    for source in (call.args[0], gather.args[0]):
        _network_tensor(source, alias, f"{op} gather")
    values = next((v for v in call.users if v.op == "call_function" and v.target in (operator.getitem, getattr)
                   and v.args[1] in (0, "values") and v.users), None)
    nodes = []
    if values is not None and values.name not in alias:  # read after the gathers: their node put here, before them
        alias[values.name] = values.name
        nodes.append(Node(values.name, op, [alias[call.args[0].name]], attrs, _shape(values)))
    owner = alias[values.name] if values is not None else alias[first.name] if first is not gather else None
    alias[n.name] = n.name
    shared = {SHARES: owner} if owner is not None else {}
    return nodes + [Node(n.name, op, [alias[call.args[0].name], alias[gather.args[0].name]],
                         {**attrs, "gather": True, **shared}, _shape(n))]


def _index_reader(n: fx.Node) -> str:
    """``, which <op> (node <name>) reads,``: the first op that reads the indices ``n`` other than to reshape or
    broadcast them (a gather, an index_select: a selection of entries, token pruning's), for the refusal's line."""
    reader = next(iter(n.users))
    for _ in range(4):
        if reader.target not in _INDEX_VIEWS or not reader.users:
            break
        reader = next(iter(reader.users))
    label = _target_name(reader.target)
    return f", which {reader.op} '{label}' (node {reader.name}) reads,"


_EINSUMS = {torch.einsum}


def _einsum_terms(equation: str) -> tuple[list[str], str] | None:
    """The einsum ``equation``'s operands' letters and its result's, spaces left out (``"bij, bjk -> bik"``:
    ``(["bij", "bjk"], "bik")``); None for an equation without one ``->`` (a result torch infers)."""
    terms = equation.replace(" ", "").split("->")
    return (terms[0].split(","), terms[1]) if len(terms) == 2 else None


def _batched_matmul_form(equation: str) -> tuple[bool, bool, bool] | None:
    """Where the einsum ``equation`` is a batched matrix product, whether each operand is read transposed and whether
    torch multiplies them in the other order: ``"bij,bjk->bik"`` (False, False, False), ``"bji,bjk->bik"`` (a
    non-local block's a^T b: True, False, False), ``"bij,bkj->bik"`` (a b^T: False, True, False); a result whose
    rows are the second operand's, ``"bij,bcj->bci"`` (an attention's weights a, then its values v: v a^T), is
    torch's bmm of the second then the first (a dispatch log), each read transposed where its shared letter is not
    where that product reads it: (False, True, True) there, the second's transpose flag first. Leading letters, the
    batch's first, the same in both operands and the result; then the rows of one by the columns of the other over
    a letter they share, each letter once per operand. None for any other form."""
    operands, out = _einsum_terms(equation) or ([], "")
    if len(operands) != 2 or not all(t.isalpha() for t in (*operands, out)):
        return None
    a, b = operands
    lead = a[:-2]
    once = len(set(a)) == len(a) and len(set(b)) == len(b)
    if not (once and len(a) == len(b) == len(out) >= 3 and len(set(a + b)) == len(a) + 1
            and b[:-2] == lead == out[:-2]):
        return None
    shared = set(a[-2:]) & set(b[-2:])
    if len(shared) != 1:
        return None
    (k,) = shared
    rows, cols = a[-2:].replace(k, ""), b[-2:].replace(k, "")
    if out[-2:] == rows + cols:
        return a[-2] == k, b[-1] == k, False
    return (b[-2] == k, a[-1] == k, True) if out[-2:] == cols + rows else None


def _einsum_linear_form(equation: str) -> bool:
    """Whether the einsum ``equation`` of a tensor and a ``[out, in]`` weight is a linear layer without a bias over
    the tensor's last letter, the result's last letter the weight's first (``"bid,jd->bij"``, a relative position's
    logits; ``"bd,cd->bc"``, a prototype head): F.linear(x, weight)."""
    operands, out = _einsum_terms(equation) or ([], "")
    if len(operands) != 2 or not all(t.isalpha() and len(set(t)) == len(t) for t in (*operands, out)):
        return False
    x, w = operands
    return len(w) == 2 and len(x) >= 2 and x[-1] == w[1] and w[0] not in x and out == x[:-1] + w[0]


def _einsum_permutation(equation: str) -> list[int] | None:
    """Where the einsum ``equation`` of one operand reorders its letters alone (``"bchw->bhwc"``: torch's permuted
    view of it), the dims of that permute, the batch's first; None for any other form."""
    operands, out = _einsum_terms(equation) or ([], "")
    if len(operands) != 1 or not operands[0].isalpha() or len(set(operands[0])) != len(operands[0]):
        return None
    (source,) = operands
    if sorted(out) != sorted(source) or out[0] != source[0]:
        return None
    return [source.index(letter) for letter in out]


def _einsum_sum_dims(equation: str) -> list[int] | None:
    """Where the einsum ``equation`` of one operand sums it over letters the result leaves out, the others in their
    order (``"bij->bi"``, ``"bchw->bc"``: torch's sum over those dims), those dims; None for any other form."""
    operands, out = _einsum_terms(equation) or ([], "")
    if len(operands) != 1 or not operands[0].isalpha() or len(set(operands[0])) != len(operands[0]):
        return None
    (source,) = operands
    kept = [letter for letter in source if letter in out]
    if "".join(kept) != out or len(out) == len(source):
        return None
    return [i for i, letter in enumerate(source) if letter not in out]


def _einsum_product_sum(equation: str) -> tuple[str, str, str, str, bool] | None:
    """Where the einsum ``equation`` of two operands multiplies them and sums the product over letters the result
    leaves out, torch 2.14's bmm of them (a dispatch log): the letters (both operands' and the result's, the batch's
    first; the left operand's and the result's; the right's and the result's; both operands' summed), each group in
    the result's order (the summed ones in the left's), and whether torch multiplies the right by the left (a result
    of the right's letters before the left's). ``"bchw,bchw->bhw"`` (a product summed over the channels: no letters
    of one operand alone), ``"bchw,bhw->bc"`` (a map pooled at a spatial softmax's weights: [C, HW] by [HW, 1]). A
    letter of one operand and not the result (torch sums it first), one twice, a result of the groups in another
    order, and every form of no letter summed or of the batched matrix product (:func:`_batched_matmul_form`) are
    None."""
    operands, out = _einsum_terms(equation) or ([], "")
    if len(operands) != 2 or not all(t.isalpha() and len(set(t)) == len(t) for t in operands) \
            or not (out.isalpha() or out == "") or len(set(out)) != len(out):
        return None
    a, b = operands
    if not set(a) | set(b) >= set(out) or (set(a) ^ set(b)) - set(out) or a[0] != b[0]:
        return None
    both = "".join(x for x in out if x in a and x in b)
    left = "".join(x for x in out if x in a and x not in b)
    right = "".join(x for x in out if x in b and x not in a)
    summed = "".join(x for x in a if x in b and x not in out)
    if not summed or _batched_matmul_form(equation) is not None:
        return None  # a plain product (no letters summed), or one batched matrix product
    if out in (both + left + right, both + right + left):
        return both, left, right, summed, bool(left and right) and out != both + left + right
    return None


def _einsum_broadcast_product(equation: str) -> int | None:
    """Where the einsum ``equation`` of two operands multiplies them, summing nothing, its result one operand's
    letters in their order and the other's letters some of them in that order, the batch's first in both
    (``"bchw,bc->bchw"``, a channel gate; ``"bchw,bhw->bchw"``, a spatial one): torch's mul of them, the other
    broadcast (a dispatch log: views, then mul). That operand's index (0 or 1); None for any other form."""
    operands, out = _einsum_terms(equation) or ([], "")
    if len(operands) != 2 or not all(t.isalpha() and len(set(t)) == len(t) for t in operands):
        return None
    for big, (whole, part) in enumerate((operands, operands[::-1])):
        if whole == out and part[:1] == whole[:1] and "".join(x for x in whole if x in part) == part:
            return big
    return None


def _broadcast_product_nodes(n: fx.Node, operands: list, big: int, equation: str,
                             alias: dict[str, str]) -> list[Node] | None:
    """The nodes of ``n``, an einsum of two tensors multiplied, one broadcast over the other's letters it lacks
    (:func:`_einsum_broadcast_product`): that one made the other's rank (a reshape: a view, size 1 where it lacks a
    letter), then the op mul of the two in the einsum's order. None where the result's shape is not that operand's
    (sizes of 1 broadcast both ways)."""
    letters, _ = _einsum_terms(equation)
    shapes = [[int(v) for v in a.meta["tensor_meta"].shape] for a in operands]
    if shapes[big] != [int(v) for v in n.meta["tensor_meta"].shape]:
        return None
    for operand in operands:
        _network_tensor(operand, alias, "einsum")
    inputs, nodes = [alias[a.name] for a in operands], []
    small = 1 - big
    if len(letters[small]) < len(letters[big]):
        sizes = dict(zip(letters[small], shapes[small]))
        shape = [sizes.get(x, 1) for x in letters[big][1:]]
        nodes.append(Node(f"{n.name}_{'ab'[small]}_broadcast", "reshape", [inputs[small]], {"shape": shape}, shape))
        inputs[small] = nodes[-1].name
    alias[n.name] = n.name
    return nodes + [Node(n.name, "mul", inputs, {}, _shape(n))]


def _product_sum_nodes(n: fx.Node, operands: list, form: tuple[str, str, str, str, bool], equation: str,
                       alias: dict[str, str]) -> list[Node]:
    """The nodes of ``n``, an einsum of two tensors multiplied and summed (:func:`_einsum_product_sum`) as torch 2.14
    runs it (a dispatch log): the left operand's letters put in the order (both's, its own, summed), the right's in
    (both's, summed, its own) (a permute, where they are not in it), each made the rows of one batched product,
    [B, L, S] and [B, S, R] (a reshape: B the elements of the letters after the batch's in both, L and R of each
    one's own, S of the summed; [L, S] and [S, R] where the batch's alone is in both), one product of them (bmm; of
    the right's by the left's, [B, R, S] by [B, S, L], where torch multiplies so), the result made the output's
    shape. ``ValueError`` for a sum over the batch's letter or a letter of two sizes (broadcast)."""
    both, left, right, summed, swapped = form
    letters, _ = _einsum_terms(equation)
    if not both or both[0] != letters[0][0]:
        raise ValueError("an einsum summing over the batch dimension (its first letter) has no description op")
    shapes = [[int(v) for v in a.meta["tensor_meta"].shape] for a in operands]
    size = {}
    for term, shape in zip(letters, shapes):
        for letter, v in zip(term, shape):
            if size.setdefault(letter, v) != v:
                raise ValueError(f"an einsum multiplying tensors of shapes {shapes[0]} and {shapes[1]} (broadcast) and "
                                 "summing the product has no description op; give tensors of one shape")
    for operand in operands:
        _network_tensor(operand, alias, "einsum")
    count = lambda group: int(np.prod([size[x] for x in group]))
    batch = count(both[1:])
    orders = (both + left + summed, both + summed + right) if not swapped else (both + summed + left,
                                                                                 both + right + summed)
    rows = ([batch, count(left), count(summed)], [batch, count(summed), count(right)]) if not swapped else (
        [batch, count(summed), count(left)], [batch, count(right), count(summed)])
    nodes, names = [], []
    for operand, term, order, row, side in zip(operands, letters, orders, rows, "ab"):
        source = alias[operand.name]
        dims = [term.index(x) for x in order]
        if dims != sorted(dims):  # its letters put in the product's order: a permuted view
            nodes.append(Node(f"{n.name}_{side}_permuted", "permute", [source], {"dims": dims},
                              [size[x] for x in order[1:]]))
            source = nodes[-1].name
        row = row if len(both) > 1 else row[1:]
        nodes.append(Node(f"{n.name}_{side}_rows", "reshape", [source], {"shape": row}, row))
        names.append(nodes[-1].name)
    product = [batch, count(left), count(right)] if not swapped else [batch, count(right), count(left)]
    product = product if len(both) > 1 else product[1:]
    nodes.append(Node(f"{n.name}_product", "matmul", names[::-1] if swapped else names, {}, product))
    alias[n.name] = n.name
    return nodes + [Node(n.name, "reshape", [nodes[-1].name], {"shape": _shape(n)}, _shape(n))]


def _matrix_product_nodes(n: fx.Node, gm: fx.GraphModule, alias: dict[str, str]) -> list[Node] | None:
    """``a @ b`` of two of the network's tensors (torch.matmul, bmm, an einsum of a batched matrix product: a
    non-local block's, a hand-written self-attention's): the op matmul, after a transpose of the last two dims of an
    operand the einsum reads transposed. None for any other call; ``ValueError`` for
    an einsum of another form (named), a product of ranks the op does not take, or one of a module's own tensor."""
    if n.op not in ("call_function", "call_method") or n.target not in _MATRIX_PRODUCTS | _EINSUMS or n.kwargs:
        return None
    operands, transposed, sides = list(n.args), (False, False), "ab"
    if n.target in _EINSUMS:
        equation, operands = operands[0], einsum_operands(operands)
        if isinstance(equation, str) and len(operands) == 2 and getattr(operands[1], "op", None) == "get_attr" \
                and _einsum_linear_form(equation):  # a tensor times a module's [out, in] weight: a linear layer
            return None
        dims = _einsum_permutation(equation) if isinstance(equation, str) and len(operands) == 1 else None
        if dims is not None and _is_tensor(operands[0]):  # a permuted view of one tensor
            _network_tensor(operands[0], alias, "einsum")
            alias[n.name] = n.name
            return [Node(n.name, "permute", [alias[operands[0].name]], {"dims": dims}, _shape(n))]
        summed = _einsum_sum_dims(equation) if isinstance(equation, str) and len(operands) == 1 else None
        if summed is not None and _is_tensor(operands[0]):  # a sum over the letters left out
            return _summed(n, operands[0], summed, False, gm, alias)
        big = _einsum_broadcast_product(equation) if isinstance(equation, str) and len(operands) == 2 else None
        if big is not None and all(_is_tensor(a) for a in operands):  # a product, one operand broadcast
            nodes = _broadcast_product_nodes(n, operands, big, equation, alias)
            if nodes is not None:
                return nodes
        product_sum = _einsum_product_sum(equation) if isinstance(equation, str) and len(operands) == 2 else None
        if product_sum is not None and all(_is_tensor(a) for a in operands):  # a product summed: a bmm of rows
            return _product_sum_nodes(n, operands, product_sum, equation, alias)
        form = _batched_matmul_form(equation) if isinstance(equation, str) else None
        if form is None or len(operands) != 2:
            raise ValueError(f"an einsum of the form {equation!r} has no description op (only a batched matrix "
                             "product of two tensors, e.g. 'bij,bjk->bik', either operand's last two letters "
                             "swapped or the rows the second's, 'bij,bcj->bci', is the op matmul, a reordering of "
                             "one tensor's letters after the batch's, e.g. 'bchw->bhwc', the op permute, one "
                             "tensor's sum over letters left out, e.g. 'bchw->bc', a sum, two tensors' product "
                             "summed over letters of both, e.g. 'bchw,bchw->bhw' or 'bchw,bhw->bc', a batched "
                             "product of rows, and a product summing nothing whose result has one operand's letters, "
                             "e.g. 'bc,bchw->bchw', a mul)")
        transposed, swapped = form[:2], form[2]
        if swapped and len(operands) == 2:  # torch's bmm of the second operand by the first
            operands, sides = operands[::-1], "ba"
    if len(operands) != 2 or not all(_is_tensor(a) for a in operands):
        return None
    for operand in operands:
        _network_tensor(operand, alias, "matmul")
    ranks = [len(a.meta["tensor_meta"].shape) for a in operands]
    if ranks[0] != ranks[1] or ranks[0] < 3:
        raise ValueError(f"a matmul of tensors of ranks {ranks} (the batch counted) has no description op: the op "
                         "multiplies batched matrices of one rank, at least 3")
    alias[n.name] = n.name
    inputs, nodes = [], []
    for operand, flip, side in zip(operands, transposed, sides):
        inputs.append(alias[operand.name] if not flip else f"{n.name}_{side}_transposed")
        if flip:  # an einsum's operand read transposed: torch's bmm of its transposed view
            shape = list(operand.meta["tensor_meta"].shape)[1:]
            nodes.append(Node(inputs[-1], "transpose", [alias[operand.name]], {"dim0": -2, "dim1": -1},
                              shape[:-2] + shape[-2:][::-1]))
    return nodes + [Node(n.name, "matmul", inputs, {}, _shape(n))]


def _max_part(n: fx.Node, gm: fx.GraphModule, alias: dict[str, str]) -> list[Node] | None:
    """``n``'s nodes where it is the values of a max or min over dimensions (:func:`_max_values`), none where it is
    their indices and nothing reads them (``values, _ = x.max(1)``); None where it is neither. Indices that are read
    are a :class:`_NoOp`: a description's tensors are float32."""
    if n.op in ("call_function", "call_method") and n.target in _AMAX_CALLS:
        return _max_values(n, n, gm, alias)
    if n.op in ("call_function", "call_method") and n.target in _SUM_CALLS and _shape(n) is not None:
        return _sum_nodes(n, gm, alias)
    for rewrite in (_difference_nodes, _quotient_nodes, _conv1d_nodes, _stack_nodes, _std_nodes,
                    _composed_activation_nodes, _channel_shuffle_nodes, _matrix_product_nodes,
                    _extreme_nodes):
        nodes = rewrite(n, gm, alias)
        if nodes is not None:
            return nodes
    if n.op != "call_function" or n.target not in (operator.getitem, getattr) or not _is_max_call(n.args[0]):
        return None
    if n.args[1] in (0, "values"):
        earlier = _earlier_values_read(n, alias)
        if earlier is None:
            return _max_values(n, n.args[0], gm, alias)
        alias[n.name] = alias[earlier.name]
        return []
    if n.users:  # named with the other ops without a description op, as an op of its own (:class:`_NoOp`)
        call = n.args[0]
        label = _target_name(call.target)
        raise _NoOp(f"the indices (int64) of {call.op} '{label}' (node {call.name}){_index_reader(n)}",
                    f"indices of {label}", n)
    return []


def _earlier_values_read(n: fx.Node, alias: dict[str, str]) -> fx.Node | None:
    """The read of a call's values (its ``[0]`` or ``.values``: a pool returning its indices, a max over a dimension)
    already described that ``n``, another read of them, follows; None where there is none. ``n`` then reads that
    one's node (the call runs once; a read described again would count its work twice, and draw a fractional pool's
    windows twice)."""
    return next((earlier for earlier in n.args[0].users
                 if earlier is not n and earlier.op == "call_function" and earlier.target in (operator.getitem, getattr)
                 and earlier.args[1] in (0, "values") and earlier.name in alias), None)


_POOLS_WITH_INDICES = {F.max_pool2d_with_indices: "max_pool2d", F.fractional_max_pool2d_with_indices:
                       "fractional_max_pool2d", F.adaptive_max_pool2d_with_indices: "adaptive_max_pool2d"}


def _pool_with_indices(call: Any, gm: fx.GraphModule) -> str | None:
    """The name of the pool ``call`` is where it returns its values and their indices (``return_indices=True``: a
    max pool's, a fractional or an adaptive one's, the module or the function, which torch.fx records as
    ``max_pool2d_with_indices``); None for any other node."""
    if not isinstance(call, fx.Node):
        return None
    if call.op == "call_function":
        return _POOLS_WITH_INDICES.get(call.target)
    module = gm.get_submodule(call.target) if call.op == "call_module" else None
    pools = (nn.MaxPool2d, nn.FractionalMaxPool2d, nn.AdaptiveMaxPool2d)
    return type(module).__name__ if isinstance(module, pools) and module.return_indices else None


def _pooled_values(values: fx.Node, call: fx.Node, gm: fx.GraphModule) -> tuple[str, dict]:
    """The op and attrs of pool ``call``'s values, read as ``values`` (its tuple's [0]): the pool without indices,
    which torch computes alike (its backward reads the indices it keeps either way)."""
    if call.op == "call_module":
        m = gm.get_submodule(call.target)
        if isinstance(m, nn.FractionalMaxPool2d):
            if m._random_samples is not None:
                raise ValueError(_FIXED_SAMPLES)
            return _fractional_maxpool_attrs(call.args[0], _shape(values), m.kernel_size)
        if isinstance(m, nn.AdaptiveMaxPool2d):
            return _adaptive_pool("adaptivemaxpool2d", values)
        return _maxpool(nn.MaxPool2d(m.kernel_size, m.stride, m.padding, m.dilation, ceil_mode=m.ceil_mode))
    if call.target is F.fractional_max_pool2d_with_indices:
        if _arg(call, 5, "_random_samples") is not None:
            raise ValueError(_FIXED_SAMPLES)
        return _fractional_maxpool_attrs(call.args[0], _shape(values), _arg(call, 1, "kernel_size"))
    if call.target is F.adaptive_max_pool2d_with_indices:
        return _adaptive_pool("adaptivemaxpool2d", values)
    return _maxpool(nn.MaxPool2d(_arg(call, 1, "kernel_size"), _arg(call, 2, "stride"), _arg(call, 3, "padding", 0),
                                 _arg(call, 4, "dilation", 1), ceil_mode=bool(_arg(call, 5, "ceil_mode", False))))


def _pool_part(n: fx.Node, gm: fx.GraphModule, alias: dict[str, str]) -> list[Node] | None:
    """``n``'s nodes where it is a pool that returns its indices (none: its parts are read apart), the values of one
    (the pool's op) or their indices read by nothing; None for any other node. Indices that are read are a
    :class:`_NoOp`: a description's tensors are float32, and no op reads indices."""
    if _pool_with_indices(n, gm) is not None and all(u.target is operator.getitem for u in n.users):
        return []
    if n.op != "call_function" or n.target is not operator.getitem or _pool_with_indices(n.args[0], gm) is None:
        return None
    call = n.args[0]
    if n.args[1] == 1:
        if n.users:
            name = _pool_with_indices(call, gm)
            raise _NoOp(f"the indices (int64) of {name}(..., return_indices=True) (node {call.name}; a description "
                        f"follows its values alone, read as its [0])", f"indices of {name}", n)
        return []
    earlier = _earlier_values_read(n, alias)
    if earlier is not None:
        alias[n.name] = alias[earlier.name]
        return []
    op, attrs = _pooled_values(n, call, gm)
    _network_tensor(call.args[0], alias, op)
    alias[n.name] = n.name
    return [Node(n.name, op, [alias[call.args[0].name]], attrs, _shape(n))]


def _getitem(n: fx.Node, alias: dict[str, str]) -> Node | None:
    """``chunk``/``split`` followed by ``[i]`` becomes a ``narrow`` node, and so does a tensor indexed
    with ``:`` everywhere but one slice (``x[:, 2:5]``); one integer instead of that slice is a
    ``select`` (``x[:, :, 0]``). Other getitems are shape queries (or, on a tensor, not expressible)."""
    source, index = n.args
    meta = source.meta.get("tensor_meta") if isinstance(source, fx.Node) else None
    if hasattr(meta, "shape") and (isinstance(index, tuple) or index is None):  # x[None]: a tuple of one
        return _index(n, source, index if isinstance(index, tuple) else (index,), meta.shape, alias)
    # a tuple of tensors from chunk/split (TensorMetadata is itself a named tuple: indexing a tensor is not this
    # case); another op's tuple, such as a module's (output, state), has no description
    if not isinstance(index, int) or not isinstance(meta, (tuple, list)) or hasattr(meta, "shape") \
            or not hasattr(meta[index], "shape") or source.target not in _SPLITS | _UNBINDS:
        return None
    if source.target in _UNBINDS:
        return _unbound_piece(source, index, n.name, alias)
    return _split_piece(source, index, n.name, alias)


def _unbound_piece(unbind: fx.Node, index: int, name: str, alias: dict[str, str]) -> Node:
    """Piece ``index`` of the unbind node ``unbind`` (``torch.unbind(x, 1)``, SKNet's branches taken apart) as a
    ``select`` node called ``name``, the view torch's unbind makes, of ``unbind`` true (rebuilt as one unbind call,
    whose backward stacks the pieces' gradients: ``schema.unbind_group``); ``ValueError`` for an unbind of the
    batch."""
    source = unbind.args[0]
    dim = int(_arg(unbind, 1, "dim", 0)) % len(source.meta["tensor_meta"].shape)
    if dim == 0:
        raise ValueError("an unbind along the batch dimension (dim 0) has no description op")
    _network_tensor(source, alias, "unbind")
    return Node(name, "select", [alias[source.name]], {"dim": dim, "index": index, "unbind": True,
                                                       PIECE_CALL: unbind.name},
                list(unbind.meta["tensor_meta"][index].shape)[1:])


_PERMUTES = {torch.permute, "permute"}


def _picks_one_entry(user: fx.Node) -> bool:
    """Whether ``user`` takes one entry of its input's first dimension: ``x[i]`` (an integer), ``x.select(0, i)``,
    or ``x.unbind(0)`` each of whose readers takes one of its pieces (``q, k, v = x.unbind(0)``)."""
    if user.op not in ("call_method", "call_function"):
        return False
    if user.target is operator.getitem:
        return isinstance(user.args[1], int)
    rank = len(user.args[0].meta["tensor_meta"].shape)
    if user.target in (torch.select, "select"):
        return int(_arg(user, 1, "dim")) % rank == 0
    if user.target in _UNBINDS:
        return int(_arg(user, 1, "dim", 0)) % rank == 0 and all(
            u.target is operator.getitem and isinstance(u.args[1], int) for u in user.users)
    return False


def _moves_the_batch_for_picks(n: fx.Node) -> bool:
    """Whether ``n`` is a permute that moves the batch dimension from first, each of its readers taking one entry of
    its first dimension: a packed projection's queries, keys and values
    (``qkv.reshape(B, N, 3, h, d).permute(2, 0, 3, 1, 4)``, then ``q, k, v = qkv.unbind(0)``, timm's attention)."""
    return isinstance(n, fx.Node) and n.op in ("call_method", "call_function") and n.target in _PERMUTES \
        and _permuted_dims(n)[0] != 0 and bool(n.users) and all(_picks_one_entry(u) for u in n.users)


def _picked_after_a_moved_batch(n: fx.Node, alias: dict[str, str]) -> list[Node] | None:
    """The nodes of ``n`` where it takes entry i of a permute that moved the batch (:func:`_moves_the_batch_for_picks`):
    the permute's input's entry i along the dimension the permute put first (a select), then the other dimensions
    in the permute's order (a permute of the batch first; none where they stay in order). None for another node."""
    if n.op not in ("call_method", "call_function"):
        return None
    unbound = ""  # the unbind's name, where ``n`` is a piece of one
    if n.target is operator.getitem and isinstance(n.args[0], fx.Node) and isinstance(n.args[1], int):
        source, index = n.args
        if source.target in _UNBINDS and isinstance(source.args[0], fx.Node):
            source, unbound = source.args[0], source.name
    elif n.target in (torch.select, "select") and isinstance(n.args[0], fx.Node):
        source, index = n.args[0], int(_arg(n, 2, "index"))
    else:
        return None
    if not _moves_the_batch_for_picks(source):
        return None
    return _select_then_permute(n, source, index, alias, unbound)


def _select_then_permute(n: fx.Node, permute: fx.Node, index: int, alias: dict[str, str],
                         unbound: str = "") -> list[Node]:
    """Entry ``index`` of ``permute``'s first dimension, which ``n`` takes, as a select of ``permute``'s input and a
    permute of what is left (``x.permute(2, 0, 3, 1, 4)[i]`` is ``x.select(2, i).permute(0, 2, 1, 3)``); ``unbound``:
    the name of the unbind of the permute (``q, k, v = qkv.unbind(0)``) ``n`` is a piece of, a select of ``unbind``
    true (its ``call``, schema.PIECE_CALL; torch's
    backward stacks the pieces' gradients: the permute's input's, permuted back, a stack along the dim picked)."""
    dims, source = _permuted_dims(permute), permute.args[0]
    picked = dims[0]
    rest = [d - (d > picked) for d in dims[1:]]
    if rest[0] != 0:
        raise ValueError(f"a permute {dims} whose entries put the batch dimension elsewhere than first has no "
                         "description op")
    _network_tensor(source, alias, "permute")
    shape = [int(s) for s in source.meta["tensor_meta"].shape]
    attrs = {"dim": picked, "index": index % shape[picked],
             **({"unbind": True, PIECE_CALL: unbound} if unbound else {})}
    kept = shape[1:picked] + shape[picked + 1:]
    if rest == sorted(rest):
        return [Node(n.name, "select", [alias[source.name]], attrs, kept)]
    select = Node(f"{n.name}__picked", "select", [alias[source.name]], attrs, kept)
    return [select, Node(n.name, "permute", [select.name], {"dims": rest}, _shape(n))]


def _split_piece(split: fx.Node, index: int, name: str, alias: dict[str, str]) -> Node:
    """Piece ``index`` of the chunk/split node ``split`` as a ``narrow`` node called ``name``."""
    meta = split.meta["tensor_meta"]
    dim = int(_arg(split, 2, "dim", 0))
    dim = dim if dim >= 0 else dim + len(meta[index].shape)
    start = sum(int(m.shape[dim]) for m in meta[:index])
    return Node(name, "narrow", [alias[split.args[0].name]],
                {"dim": dim, "start": start, "length": int(meta[index].shape[dim]),
                 "split_sizes": [int(m.shape[dim]) for m in meta], PIECE_CALL: split.name}, list(meta[index].shape)[1:])


def _new_axes(n: fx.Node, source: fx.Node, index: tuple, alias: dict[str, str]) -> Node | None:
    """``x[:, :, None, None]``, ``x[..., None]``, ``x[:, None]`` (new axes of size 1, an SE block's gate broadcast
    over the map): torch's views of ``x`` unsqueezed, a reshape to the output's shape; a new axis before the batch's
    (``x[None]``) is a ``ValueError``. None for an index that also picks or slices."""
    if not all(i is None or i is Ellipsis or i == slice(None) for i in index) or source.name not in alias:
        return None
    if index[0] is None:
        raise ValueError("an index that puts a new axis before the batch (x[None]) has no description op (a "
                         "description keeps the batch first); index after it (x[:, None])")
    out = _shape(n)
    return None if out is None else Node(n.name, "reshape", [alias[source.name]], {"shape": out}, out)


def _index(n: fx.Node, source: fx.Node, index: tuple, shape: Any, alias: dict[str, str]) -> Node | None:
    """``x[:, ..., i]`` -> select, ``x[:, ..., a:b]`` -> narrow (one indexed dimension after the batch); a slice with
    a step of a network tensor is a ``ValueError``; new axes alone (``x[:, :, None]``): :func:`_new_axes`."""
    if any(i is None for i in index):
        return _new_axes(n, source, index, alias)
    if source.name in alias and any(isinstance(i, slice) and _shape_value(i.step) not in (None, 1) for i in index):
        raise ValueError("a slice with a step (x[..., ::2, ::2]: YOLOv5's Focus) has no description op; YOLOv5 "
                         "since v6.0 writes Focus as a 6x6 convolution of stride 2, which describes")
    picked = [(d, i) for d, i in enumerate(index) if i != slice(None)]
    out = _shape(n)
    if len(picked) != 1 or out is None or source.name not in alias:
        return None
    dim, i = picked[0]
    if dim == 0:  # the batch dimension is not part of a description
        return None
    if isinstance(i, slice):  # bounds computed from shapes (y[:, :x.shape[1]]): the numbers they are
        i = slice(*(_shape_value(b) for b in (i.start, i.stop, i.step)))
    if isinstance(i, int):
        return Node(n.name, "select", [alias[source.name]], {"dim": dim, "index": i % int(shape[dim])}, out)
    if isinstance(i, slice) and i.step in (None, 1):
        start, stop, _ = i.indices(int(shape[dim]))
        return Node(n.name, "narrow", [alias[source.name]], {"dim": dim, "start": start, "length": stop - start}, out)
    return None
