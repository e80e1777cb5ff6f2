"""Shape propagation on meta tensors that answers the common layers and calls itself.

torch's meta kernels for many ops are Python references (elementwise arithmetic, the activations, the norms, a
mean, an adaptive average pool, a concatenation, a linear layer's addmm) behind a wrapper that imports
``torch._dynamo`` the first time one runs: 3-4 s of a process's first description, in a process that has not
imported torchvision (a user's ``FILE.py:FUNCTION``, ``predict_module``). :class:`MetaShapeProp` makes the output of
those ops itself, an empty meta tensor of the shape and type torch's kernel gives, where its inputs are ones it knows
torch accepts; for anything else, torch's own kernel runs (and raises its own error). The shapes every node records
are the same either way.
"""
from __future__ import annotations

import operator
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn
from torch.fx.passes.shape_prop import ShapeProp

from perf4sight.ir.shapes import broadcast

__all__ = ["MetaShapeProp"]

#: Layers whose output is a tensor of their input's shape and type, whatever it holds.
_SHAPE_KEEPING = (nn.ReLU, nn.ReLU6, nn.Hardswish, nn.Hardsigmoid, nn.SiLU, nn.GELU, nn.Sigmoid, nn.Tanh,
                  nn.LeakyReLU, nn.ELU, nn.Softplus, nn.Mish, nn.Dropout, nn.Dropout2d, nn.Identity, nn.Hardtanh,
                  nn.LogSigmoid, nn.Hardshrink, nn.Threshold, nn.Softsign, nn.Tanhshrink)
#: Dropouts of channels (the layer, the call), answered of a [N, C, L] or [N, C, H, W] input alone: torch refuses a
#: smaller one in training (it reads a vector as no channels) and warns of any other.
_CHANNEL_DROPOUTS = (nn.Dropout2d, F.dropout2d)
#: Calls (functions and tensor methods, by name) whose output is a tensor of their first argument's shape and type.
_SHAPE_KEEPING_CALLS = frozenset({F.relu, F.relu_, torch.relu, torch.relu_, F.relu6, F.hardtanh, F.hardtanh_,
                                  F.leaky_relu, F.leaky_relu_, F.elu, F.elu_, F.gelu, F.silu, F.hardswish,
                                  F.hardsigmoid, torch.sigmoid, torch.tanh, F.mish, F.softplus, F.dropout,
                                  F.dropout2d,
                                  F.logsigmoid, torch.hardshrink, "hardshrink", F.threshold, torch.threshold,
                                  torch.threshold_, F.softsign, F.tanhshrink,
                                  "relu", "relu_", "sigmoid", "sigmoid_", "tanh", "tanh_", "clamp", "clamp_"})
#: Elementwise arithmetic of two operands (tensors or numbers), broadcast.
_ARITHMETIC = frozenset({operator.add, operator.sub, operator.mul, operator.truediv, operator.iadd, operator.isub,
                         operator.imul, operator.itruediv, torch.add, torch.sub, torch.mul, torch.div,
                         "add", "sub", "mul", "div", "add_", "sub_", "mul_", "div_"})
_IN_PLACE = frozenset({operator.iadd, operator.isub, operator.imul, operator.itruediv, "add_", "sub_", "mul_", "div_"})
_CATS = frozenset({torch.cat, torch.concat, torch.concatenate})
_MEANS = frozenset({torch.mean, "mean"})
_LOG_SOFTMAXES = frozenset({F.log_softmax, torch.log_softmax, "log_softmax"})
_PRELUS = frozenset({F.prelu, torch.prelu})


class MetaShapeProp(ShapeProp):
    """``ShapeProp`` on meta tensors, the layers and calls above answered without torch's Python meta kernels."""

    def call_module(self, target: Any, args: Any, kwargs: Any) -> Any:
        x = args[0] if len(args) == 1 and not kwargs else None
        if _is_float_meta(x):
            out = _module_output(self.fetch_attr(target), x)
            if out is not None:
                return out
        return super().call_module(target, args, kwargs)

    def call_function(self, target: Any, args: Any, kwargs: Any) -> Any:
        out = _call_output(target, args, kwargs) if _hashable(target) else None
        return out if out is not None else super().call_function(target, args, kwargs)

    def call_method(self, target: Any, args: Any, kwargs: Any) -> Any:
        out = _call_output(target, args, kwargs)
        return out if out is not None else super().call_method(target, args, kwargs)


def _hashable(target: Any) -> bool:
    try:
        hash(target)
    except TypeError:
        return False
    return True


def _is_float_meta(x: Any) -> bool:
    return isinstance(x, torch.Tensor) and x.is_meta and x.dtype.is_floating_point


def _empty(shape: Any, like: torch.Tensor) -> torch.Tensor:
    return torch.empty(list(shape), dtype=like.dtype, device="meta")


def _in_order(t: torch.Tensor) -> bool:
    """Whether ``t``'s dimensions (those of more than one element) lie in memory in their order, each a longer step
    than the next (a contiguous tensor, a slice of one): torch's output of an elementwise op of such inputs is
    contiguous, as :func:`_empty` makes it. Of a permuted, transposed or channels-last input, torch's output keeps
    that layout (a later ``view`` of it may fail), and an op in place returns its input as it is: those are left to
    torch's kernel (the shape-keeping layers and calls, the norms but a layer norm, the pools answer a contiguous
    input only; a layer norm's and a linear layer's output is contiguous whatever their input's layout)."""
    steps = [st for sz, st in zip(t.shape, t.stride()) if sz > 1]
    return all(a > b for a, b in zip(steps, steps[1:]))


def _module_output(m: nn.Module, x: torch.Tensor) -> torch.Tensor | None:
    """What layer ``m`` makes of the meta tensor ``x`` where it is one answered here (None otherwise)."""
    kind = type(m)
    if kind in _SHAPE_KEEPING:
        return _empty(x.shape, x) if x.is_contiguous() and (kind not in _CHANNEL_DROPOUTS or x.dim() in (3, 4)) \
            else None
    if not x.is_contiguous() and kind not in (nn.LayerNorm, nn.Linear):  # a norm's, a pool's: the input's layout
        return None
    if kind is nn.BatchNorm2d or kind is nn.InstanceNorm2d:
        ok = x.dim() == 4 and x.shape[1] == m.num_features
        # an instance norm's statistics need more than one pixel a map (torch refuses a 1x1 map)
        return _empty(x.shape, x) if ok and (kind is nn.BatchNorm2d or x.shape[2] * x.shape[3] > 1) else None
    if kind is nn.GroupNorm:
        return _empty(x.shape, x) if x.dim() >= 2 and x.shape[1] == m.num_channels else None
    if kind is nn.Softshrink:  # torch refuses a negative lambd
        return _empty(x.shape, x) if m.lambd >= 0 else None
    if kind is nn.GLU:
        return _glu(x, m.dim)
    if kind is nn.RMSNorm:
        return _rms_norm(m, x)
    if kind is nn.Softmin:
        return _softmin(x, m.dim)
    if kind is nn.PReLU:  # one slope, or one per channel (dim 1), of the input's type (torch promotes none)
        return _prelu(x, m.weight)
    if kind is nn.LogSoftmax:
        return _log_softmax(x, m.dim)
    if kind is nn.LayerNorm:
        ok = tuple(x.shape[x.dim() - len(m.normalized_shape):]) == tuple(m.normalized_shape)
        return _empty(x.shape, x) if ok and x.dim() > len(m.normalized_shape) else None
    if kind is nn.AdaptiveAvgPool2d:
        return _adaptive_pool(x, m.output_size)
    if kind is nn.Linear:  # with a bias, an addmm: a Python decomposition
        return _empty([*x.shape[:-1], m.out_features], x) if x.dim() >= 1 and x.shape[-1] == m.in_features else None
    return None


def _call_output(target: Any, args: Any, kwargs: Any) -> torch.Tensor | None:
    """What the call ``target(*args, **kwargs)`` makes where it is one answered here (None otherwise)."""
    if target in _CATS:
        return _cat(*args, **kwargs)
    if target in _ARITHMETIC:
        return _arithmetic(target, args, kwargs)
    if not args or not _is_float_meta(args[0]):
        return None
    x = args[0]
    if target in _SHAPE_KEEPING_CALLS:
        return _empty(x.shape, x) if x.is_contiguous() and _shape_keeping_args(target, args, kwargs) else None
    if target in _MEANS:
        return _mean(*args, **kwargs) if _in_order(x) else None
    if target in _LOG_SOFTMAXES and x.is_contiguous():
        try:  # torch.log_softmax's and the method's third place is the dtype, F.log_softmax's the stack level
            return _log_softmax(*args, **kwargs) if target is F.log_softmax else _log_softmax_of(*args, **kwargs)
        except TypeError:  # arguments torch's own kernel will judge
            return None
    if target in _PRELUS and x.is_contiguous():
        return _prelu(*args, **kwargs)
    if target is F.glu and x.is_contiguous():
        try:
            return _glu(*args, **kwargs)
        except TypeError:  # arguments torch's own kernel will judge
            return None
    if target is F.softmin and x.is_contiguous() and len(args) <= 2 and kwargs.get("dtype") is None \
            and set(kwargs) <= {"dim", "_stacklevel", "dtype"}:  # the call's keywords as fx records them
        return _softmin(x, args[1] if len(args) > 1 else kwargs.get("dim"))
    if target is F.softshrink and x.is_contiguous() and len(args) + len(kwargs) <= 2:
        lambd = args[1] if len(args) > 1 else kwargs.get("lambd", 0.5)
        return _empty(x.shape, x) if isinstance(lambd, (int, float)) and lambd >= 0 else None
    if target is F.adaptive_avg_pool2d and len(args) + len(kwargs) == 2 and x.is_contiguous():
        return _adaptive_pool(x, args[1] if len(args) == 2 else kwargs.get("output_size"))
    return None


def _rms_norm(m: nn.Module, x: torch.Tensor) -> torch.Tensor | None:
    """nn.RMSNorm ``m`` of ``x``: its shape, where its last dimensions are ``m``'s normalized_shape and its weight
    (where it has one) of that shape too (a cut that left one of them whole does not run); None for anything else."""
    shape = tuple(m.normalized_shape)
    ok = x.dim() > len(shape) and tuple(x.shape[x.dim() - len(shape):]) == shape
    return _empty(x.shape, x) if ok and (m.weight is None or tuple(m.weight.shape) == shape) else None


def _is_dim(x: torch.Tensor, dim: Any) -> bool:
    """Whether ``dim`` names one of ``x``'s dimensions: an int (not a bool), negative ones counted from the end."""
    return isinstance(dim, int) and not isinstance(dim, bool) and -x.dim() <= dim < x.dim()


def _glu(x: torch.Tensor, dim: Any = -1) -> torch.Tensor | None:
    """``glu(x, dim)``: ``x`` halved along ``dim``, whose size must be even; None for anything else."""
    if not _is_dim(x, dim) or x.shape[dim] % 2:
        return None
    shape = list(x.shape)
    shape[dim] //= 2
    return _empty(shape, x)


def _softmin(x: torch.Tensor, dim: Any) -> torch.Tensor | None:
    """``softmin(x, dim)`` along a dim of ``x`` (its shape kept); None for anything else (torch's implicit dim)."""
    return _empty(x.shape, x) if _is_dim(x, dim) else None


def _shape_keeping_args(target: Any, args: Any, kwargs: Any) -> bool:
    """Whether torch takes the arguments after the input of a :data:`_SHAPE_KEEPING_CALLS` call and keeps the input's
    shape: no tensor among them (a clamp to a tensor's bounds broadcasts), a clamp given a bound, a dropout's
    probability in [0, 1] (torch's Python function checks it)."""
    rest = [*args[1:], *kwargs.values()]
    if any(isinstance(a, torch.Tensor) for a in rest):
        return False
    if target in ("clamp", "clamp_"):
        return any(a is not None for a in (*args[1:3], kwargs.get("min"), kwargs.get("max")))
    if target in _CHANNEL_DROPOUTS and args[0].dim() not in (3, 4):
        return False
    if target is F.dropout or target is F.dropout2d:
        p = args[1] if len(args) > 1 else kwargs.get("p", 0.5)
        return isinstance(p, (int, float)) and 0 <= p <= 1
    return True


def _arithmetic(target: Any, args: Any, kwargs: Any) -> torch.Tensor | None:
    """Two operands of one floating type (tensors, or a tensor and a Python number) broadcast against each other, an
    in-place one to its first operand's shape; None for anything else (an ``alpha``, a rounding mode, integer
    tensors, shapes that do not broadcast, two numbers: a shape's sides multiplied, a tensor not
    :func:`_in_order`)."""
    if len(args) != 2 or kwargs or any(isinstance(a, bool) or not isinstance(a, (torch.Tensor, int, float))
                                       for a in args):
        return None
    tensors = [a for a in args if isinstance(a, torch.Tensor)]
    if not tensors or not _is_float_meta(tensors[0]) \
            or any(not (t.is_meta and t.dtype == tensors[0].dtype and _in_order(t)) for t in tensors):
        return None
    shape = list(tensors[0].shape) if len(tensors) == 1 else broadcast(list(args[0].shape), list(args[1].shape))
    in_place = target in _IN_PLACE
    if shape is None or in_place and (not isinstance(args[0], torch.Tensor) or shape != list(args[0].shape)
                                      or not args[0].is_contiguous()):
        return None
    return _empty(shape, tensors[0])


def _mean(x: torch.Tensor, dim: Any = None, keepdim: bool = False, **rest: Any) -> torch.Tensor | None:
    """``x.mean(dim, keepdim)`` over the dims given (an int or a sequence of them); None for anything else."""
    if rest or dim is None or not isinstance(keepdim, bool):
        return None
    dims = [dim] if isinstance(dim, int) else list(dim) if isinstance(dim, (list, tuple)) else None
    if not dims or not all(isinstance(d, int) and -x.dim() <= d < x.dim() for d in dims):
        return None
    axes = {d % x.dim() for d in dims}
    if len(axes) < len(dims):  # a dim named twice (2 and -2 of a [N, C, H, W] map): torch refuses it
        return None
    shape = [1 if i in axes else s for i, s in enumerate(x.shape) if keepdim or i not in axes]
    return _empty(shape, x)


def _log_softmax(x: torch.Tensor, dim: Any = None, _stacklevel: int = 3, dtype: Any = None) -> torch.Tensor | None:
    """``log_softmax(x, dim)`` along a dim of ``x``, without a cast (``dtype``); None for anything else."""
    return _empty(x.shape, x) if dtype is None and _is_dim(x, dim) else None


def _log_softmax_of(x: torch.Tensor, dim: Any = None, dtype: Any = None) -> torch.Tensor | None:
    """``torch.log_softmax(x, dim, dtype)`` and ``x.log_softmax(dim, dtype)``: :func:`_log_softmax`."""
    return _log_softmax(x, dim, dtype=dtype)


def _prelu(x: torch.Tensor, weight: Any = None, **rest: Any) -> torch.Tensor | None:
    """``prelu(x, weight)`` of meta slopes of ``x``'s type: one, or a vector of one per channel (dim 1)."""
    if rest or not isinstance(weight, torch.Tensor) or not weight.is_meta or weight.dtype != x.dtype \
            or weight.dim() > 1:
        return None
    return _empty(x.shape, x) if weight.numel() == 1 or x.dim() >= 2 and x.shape[1] == weight.numel() else None


def _adaptive_pool(x: torch.Tensor, size: Any) -> torch.Tensor | None:
    """An adaptive pool of a [N, C, H, W] map to ``size`` (an int, or a pair whose None keeps the input's side)."""
    pair = (size, size) if isinstance(size, int) else tuple(size) if isinstance(size, (list, tuple)) else ()
    if x.dim() != 4 or len(pair) != 2 or not all(s is None or (isinstance(s, int) and s > 0) for s in pair):
        return None
    return _empty([*x.shape[:2], *(x.shape[2 + i] if s is None else s for i, s in enumerate(pair))], x)


def _cat(tensors: Any, dim: int = 0, **rest: Any) -> torch.Tensor | None:
    """``torch.cat(tensors, dim)`` (numpy's ``axis=`` too) of meta tensors of one type and rank that agree but along
    ``dim``; None for anything else."""
    if set(rest) == {"axis"} and dim == 0:
        dim = rest.pop("axis")
    if rest or not isinstance(tensors, (list, tuple)) or not tensors or not isinstance(dim, int):
        return None
    first = tensors[0]
    if not all(isinstance(t, torch.Tensor) and t.is_meta and t.dtype == first.dtype and t.dim() == first.dim()
               and _in_order(t) for t in tensors) or not -first.dim() <= dim < first.dim():
        return None
    dim %= first.dim()
    if any(t.shape[:dim] != first.shape[:dim] or t.shape[dim + 1:] != first.shape[dim + 1:] for t in tensors):
        return None
    shape = list(first.shape)
    shape[dim] = sum(t.shape[dim] for t in tensors)
    return _empty(shape, first)
