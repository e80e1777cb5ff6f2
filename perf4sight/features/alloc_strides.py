"""Torch's strides, worked out for the allocation model (:mod:`perf4sight.features.alloc_model`): a contiguous
tensor's, whether a view can be taken without a copy and its strides, whether dimensions lie in their own order or
densely, channels-last, and the layout TensorIterator gives an elementwise kernel's output. Strides count elements;
None stands for a contiguous tensor's. The questions asked thousands of times a step are remembered (lru_cache).
"""
from __future__ import annotations

from functools import lru_cache


def _strides(shape: tuple[int, ...]) -> tuple[int, ...]:
    """Strides (elements) of a contiguous tensor of ``shape`` (a tuple or a list)."""
    return _contiguous_strides(tuple(shape))


@lru_cache(maxsize=4096)
def _contiguous_strides(shape: tuple[int, ...]) -> tuple[int, ...]:
    """:func:`_strides`, remembered: a network's few hundred shapes are asked for thousands of times (a MaxViT's
    1,900 in its step's events)."""
    out, step = [], 1
    for size in reversed(shape):
        out.append(step)
        step *= size
    return tuple(reversed(out))


def _normal(shape: tuple[int, ...], strides: tuple[int, ...]) -> tuple[int, ...] | None:
    """``strides``, or None where they are a contiguous tensor's (dimensions of size 1 aside)."""
    try:
        return _normal_of(shape, strides)
    except TypeError:  # a list: not remembered
        return _normal_of.__wrapped__(shape, strides)


@lru_cache(maxsize=4096)
def _normal_of(shape: tuple[int, ...], strides: tuple[int, ...]) -> tuple[int, ...] | None:
    """:func:`_normal`, remembered (a MaxViT's step asks 439 times)."""
    return None if all(a == b for a, b, n in zip(strides, _strides(shape), shape) if n > 1) else strides


def _ordered(shape: tuple[int, ...], strides: tuple[int, ...] | None) -> bool:
    """Whether the dimensions lie in memory in their own order (contiguous, or a slice of such a
    tensor): an elementwise kernel then writes a contiguous result."""
    if strides is None:
        return True
    try:
        return _ordered_of(shape, strides)
    except TypeError:  # a list: not remembered
        return _ordered_of.__wrapped__(shape, strides)


@lru_cache(maxsize=4096)
def _ordered_of(shape: tuple[int, ...], strides: tuple[int, ...]) -> bool:
    """:func:`_ordered` of strides, remembered (a DenseNet-201's step asks 3,600 times, of its slices' gradients)."""
    kept = [st for size, st in zip(shape, strides) if size > 1]
    return all(a >= b for a, b in zip(kept, kept[1:]))


def _view(shape: tuple[int, ...], strides: tuple[int, ...] | None,
          new: tuple[int, ...]) -> tuple[bool, tuple[int, ...] | None]:
    """Whether a tensor of ``shape`` and ``strides`` can be viewed as ``new`` without a copy, and the
    view's strides (None: contiguous). Dimensions of size 1 never matter; the others are grouped into
    runs lying back to back in memory, and each dimension of ``new`` must fall inside one run."""
    if strides is None:
        return True, None
    return _strided_view(tuple(shape), tuple(strides), tuple(new))


@lru_cache(maxsize=4096)
def _strided_view(shape: tuple[int, ...], strides: tuple[int, ...],
                  new: tuple[int, ...]) -> tuple[bool, tuple[int, ...] | None]:
    """:func:`_view` of a strided tensor, remembered: a MaxViT's step asks 240 times for 66 distinct views."""
    runs: list[tuple[int, int]] = []  # (elements, stride of the run's last dimension)
    for size, stride in zip(shape, strides):
        if size == 1:
            continue
        if runs and runs[-1][1] == stride * size:
            runs[-1] = (runs[-1][0] * size, stride)
        else:
            runs.append((size, stride))
    out: list[int] = [0] * len(new)
    r = len(runs) - 1
    left = runs[r][0] if runs else 1  # elements of the current run not yet given to a dimension
    step = runs[r][1] if runs else 1
    for i in range(len(new) - 1, -1, -1):
        size = new[i]
        if size == 1:
            out[i] = step
            continue
        if left == 1 and r > 0:
            r -= 1
            left, step = runs[r]
        if left % size:
            return False, None
        out[i] = step
        step *= size
        left //= size
    if left != 1 or r > 0:
        return False, None
    return True, _normal(new, tuple(out))


def _dense(shape: tuple[int, ...], strides: tuple[int, ...] | None) -> bool:
    """Whether a tensor of ``shape`` and ``strides`` (elements) covers its storage once, in some order of its
    dimensions (contiguous, channels-last, any permutation of a contiguous tensor)."""
    if strides is None:
        return True
    step = 1
    for stride, size in sorted((st, sz) for sz, st in zip(shape, strides) if sz > 1):
        if stride != step:
            return False
        step *= size
    return True


def _channels_last_like(shape: tuple[int, ...], strides: tuple[int, ...] | None) -> bool:
    """Whether torch suggests the channels-last format for a tensor of ``shape`` and ``strides`` (its
    ``suggest_memory_format``: 4-D, the channels' stride the smallest, then the width's, the height's, the batch's;
    ambiguous cases are contiguous)."""
    if len(shape) != 4:
        return False
    strides = strides or _strides(shape)
    if strides[1] == 0:
        return False
    least = 0
    for d in (1, 3, 2, 0):
        if shape[d] == 0 or strides[d] < least or (d == 0 and least == strides[1]):
            return False
        least = strides[d] * shape[d]
    return True


def _channels_last(shape: tuple[int, ...]) -> tuple[int, ...]:
    """Strides (elements) of a 4-D tensor of ``shape`` in the channels-last format."""
    n, c, h, w = shape
    return (h * w * c, 1, w * c, c)


def _iterated(shape: tuple[int, ...], operands: list[tuple[int, ...] | None]) -> tuple[int, ...] | None:
    """Strides of the output of an elementwise kernel over ``operands`` (their strides broadcast to ``shape``, 0
    along a broadcast dimension; None: contiguous), as torch's TensorIterator lays it out: the dimensions sorted
    by the first operand whose strides tell them apart; None where that is the contiguous order."""
    return _normal(shape, _iterated_full(shape, operands))


def _iterated_full(shape: tuple[int, ...], operands: list[tuple[int, ...] | None]) -> tuple[int, ...]:
    """:func:`_iterated`'s strides along every dimension, those of size 1 included."""
    try:
        return _iterated_full_of(tuple(shape), tuple(operands))
    except TypeError:  # strides given as a list: not remembered
        return _iterated_full_of.__wrapped__(shape, operands)


@lru_cache(maxsize=4096)
def _iterated_full_of(shape: tuple[int, ...], operands: tuple[tuple[int, ...] | None, ...]) -> tuple[int, ...]:
    """:func:`_iterated_full`, remembered (a MaxViT's step asks 123 times, for a few dozen layouts)."""
    ndim = len(shape)
    given = [st or _strides(shape) for st in operands]

    def should_swap(d0: int, d1: int) -> int:
        for st in given:
            s0, s1 = st[d0], st[d1]
            if s0 == 0 or s1 == 0:
                continue
            if s0 != s1:
                return -1 if s0 < s1 else 1
            if shape[d0] > shape[d1]:
                return 1
        return 0

    perm = list(range(ndim - 1, -1, -1))  # perm[0]: the fastest-varying dimension
    for i in range(1, ndim):
        d1 = i
        for d0 in range(i - 1, -1, -1):
            comparison = should_swap(perm[d0], perm[d1])
            if comparison > 0:
                perm[d0], perm[d1] = perm[d1], perm[d0]
                d1 = d0
            elif comparison < 0:
                break
    out, step = [0] * ndim, 1
    for d in perm:
        out[d] = step
        step *= shape[d]
    return tuple(out)


def _broadcast_strides(shape: tuple[int, ...], full: tuple[int, ...]) -> tuple[int, ...]:
    """Strides of a contiguous tensor of ``shape`` broadcast to ``full`` (right-aligned; 0 along each dimension it
    is expanded over)."""
    own = (0,) * (len(full) - len(shape)) + _strides(shape)
    padded = (1,) * (len(full) - len(shape)) + tuple(shape)
    return tuple(0 if size == 1 and target != 1 else st for size, target, st in zip(padded, full, own))
