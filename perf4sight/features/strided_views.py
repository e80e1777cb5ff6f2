"""Where a view of the description lies in its base tensor's memory: the strides torch gives it, so that an op that
needs its rows in one block (a linear layer of N-D tokens) can tell a view it copies from one it reads as it lies.
An elementwise op of one tensor (an activation, a dropout, a multiply by a number) writes its output as its input
lies (torch's elementwise kernels order the output's dimensions as the input's strides do), so the layout is
followed through it too (:data:`KEEPS_LAYOUT`).

Pure Python. Shapes and strides count elements and the batch (dim 0); a base tensor is contiguous. The strides are
those at a batch of :data:`BATCH` (more than one): at a batch of 1 a dimension of size 1 leaves more views foldable,
which per-sample features cannot tell apart.
"""
from __future__ import annotations

import math

from perf4sight.ir.schema import Node

__all__ = ["BATCH", "view_layout", "rows_fold", "rows_copied", "batch_copied"]

#: The batch size the strides are worked out at.
BATCH = 2
#: Ops of one tensor whose output torch lays out as their input lies, dense (each checked on torch 2.14 with a
#: transposed and a narrowed transposed input); a log-sigmoid, an RReLU, a roll, a softmax and a norm write theirs
#: contiguous. An add or a multiply counts where it reads one tensor (and a number).
KEEPS_LAYOUT = frozenset({"relu", "relu6", "hardswish", "sigmoid", "hardsigmoid", "silu", "gelu", "tanh", "dropout",
                          "alpha_dropout", "leaky_relu", "elu", "selu", "celu", "softplus", "mish", "hardtanh",
                          "hardshrink", "softshrink", "threshold", "pow", "exp", "abs", "flip", "add", "mul",
                          "log", "normalize"})


def _contiguous(shape: list[int]) -> list[int]:
    """Row-major strides (elements) of ``shape``."""
    strides, step = [], 1
    for size in reversed(shape):
        strides.append(step)
        step *= max(size, 1)
    return strides[::-1]


def _viewed(shape: list[int], strides: list[int], new_shape: list[int]) -> list[int] | None:
    """Strides of ``new_shape`` viewing a tensor of ``shape`` and ``strides`` without a copy, as torch's view and
    reshape work them out (``computeStride``); None where the new shape needs a copy."""
    if math.prod(shape) == 0:
        return _contiguous(new_shape)
    new_strides = [0] * len(new_shape)
    view_d, base = len(new_shape) - 1, strides[-1] if strides else 1
    tensor_numel = view_numel = 1
    for d in range(len(shape) - 1, -1, -1):
        tensor_numel *= shape[d]
        if d == 0 or (shape[d - 1] != 1 and strides[d - 1] != tensor_numel * base):
            while view_d >= 0 and (view_numel < tensor_numel or new_shape[view_d] == 1):
                new_strides[view_d] = view_numel * base
                view_numel *= new_shape[view_d]
                view_d -= 1
            if view_numel != tensor_numel:
                return None
            if d > 0:
                base, tensor_numel, view_numel = strides[d - 1], 1, 1
    return new_strides if view_d == -1 else None


def _keeps_layout(node: Node) -> bool:
    """Whether ``node`` writes its output as its one tensor input lies (:data:`KEEPS_LAYOUT`)."""
    return node.op in KEEPS_LAYOUT and len(node.inputs) == 1


def _dense_like(strides: list[int], shape: list[int]) -> list[int]:
    """Strides (elements) of a new tensor of ``shape`` whose dimensions lie in the order of ``strides`` (the largest
    outermost, ties in their order), without gaps: an elementwise op's output of an input of those strides."""
    order = sorted(range(len(shape)), key=lambda d: -strides[d])
    dense, step = [0] * len(shape), 1
    for d in reversed(order):
        dense[d] = step
        step *= max(shape[d], 1)
    return dense


def _dim(dim: int, rank: int) -> int:
    """A dim attr (counting the batch, negative from the end) as an index into a shape of ``rank`` dims."""
    return dim + rank if dim < 0 else dim


def _applied(node: Node, shape: list[int], strides: list[int]) -> list[int] | None:
    """The strides of ``node``'s output, a view of a tensor of ``shape`` and ``strides`` (or an elementwise op's
    output laid out as it lies: :data:`KEEPS_LAYOUT`); None for an op this module does not follow."""
    a, out = node.attrs, [BATCH] + list(node.output_shape)
    if _keeps_layout(node):
        return _dense_like(strides, shape)
    if node.op == "identity":
        return list(strides)
    if node.op == "transpose":
        i, j = _dim(int(a["dim0"]), len(shape)), _dim(int(a["dim1"]), len(shape))
        swapped = list(strides)
        swapped[i], swapped[j] = strides[j], strides[i]
        return swapped
    if node.op == "permute":
        return [strides[int(d)] for d in a["dims"]]
    if node.op == "narrow":
        return list(strides)
    if node.op == "select":
        axis = _dim(int(a["dim"]), len(shape))
        return strides[:axis] + strides[axis + 1:]
    if node.op in ("reshape", "flatten", "squeeze", "unsqueeze"):  # a copy, contiguous, where it cannot view
        return _viewed(shape, strides, out) or _contiguous(out)
    return None


def view_layout(chain: list[Node], base_shape: list[int]) -> tuple[list[int], list[int]] | None:
    """(shape, strides) at a batch of :data:`BATCH` of what the view nodes ``chain`` (in order, the first reading the
    base tensor, of per-sample shape ``base_shape``) make of their base; None where one is not followed."""
    shape = [BATCH] + list(base_shape)
    strides = _contiguous(shape)
    for node in chain:
        strides = _applied(node, shape, strides)
        if strides is None:
            return None
        shape = [BATCH] + list(node.output_shape)
    return shape, strides


def rows_fold(shape: list[int], strides: list[int]) -> bool:
    """Whether a tensor of ``shape`` and ``strides`` views as rows of its last dimension (its other dimensions folded
    into one without a copy), as a linear layer reads N-D input."""
    return len(shape) <= 2 or _viewed(shape, strides, [math.prod(shape[:-1]), shape[-1]]) is not None


def rows_copied(nodes: dict[str, Node], tensor: str, base: dict[str, str], shapes: dict[str, list[int]]) -> bool:
    """Whether a linear layer reading ``tensor`` (``nodes`` by name, ``base``: each view's base tensor, ``shapes``
    per sample) copies it into rows first: torch's reshape to ``[-1, K]`` where the other dims of a view (or of an
    elementwise op's output of one: :data:`KEEPS_LAYOUT`) do not fold (tokens transposed out of a map), a copy each
    layer keeps (measured with saved-tensor hooks on torch 2.14). At a batch of 1 such a view may fold, which
    per-sample features cannot tell."""
    if len(shapes[tensor]) < 2:
        return False
    layout = _strided_layout(nodes, tensor, base, shapes)
    return layout is not None and not rows_fold(*layout)


def _strided_layout(nodes: dict[str, Node], tensor: str, base: dict[str, str],
                    shapes: dict[str, list[int]]) -> tuple[list[int], list[int]] | None:
    """(shape, strides) at a batch of :data:`BATCH` of ``tensor`` where it is a view (or an elementwise op's output of
    one: :data:`KEEPS_LAYOUT`) followed from its base; None where it is no view or one not followed."""
    chain = []
    while base.get(tensor, tensor) != tensor or _keeps_layout(nodes[tensor]):
        chain.append(nodes[tensor])
        tensor = chain[-1].inputs[0]
    if not any(base.get(n.name, n.name) != n.name for n in chain):  # no view: every tensor laid out contiguous
        return None
    return view_layout(chain[::-1], shapes[tensor])


def batch_copied(nodes: dict[str, Node], tensor: str, base: dict[str, str], shapes: dict[str, list[int]]) -> bool:
    """Whether a matmul of 4 or more dims reading ``tensor`` copies it first: torch's reshape of the dims before its
    last two (the batch's among them) into one for its bmm, where those of a view do not fold (an einsum's operand
    permuted, its summed dims put last). At a batch of 1 such a view may fold, which per-sample features cannot
    tell."""
    if len(shapes[tensor]) < 3:  # a bmm of [N, M, K] reads it as it lies
        return False
    layout = _strided_layout(nodes, tensor, base, shapes)
    if layout is None:
        return False
    shape, strides = layout
    return _viewed(shape, strides, [math.prod(shape[:-2]), shape[-2], shape[-1]]) is None
