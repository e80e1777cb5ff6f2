"""What a traced fx node holds, as the readers of :mod:`perf4sight.ir.from_torch` read it: its arguments, the shape
of one sample it was traced at (a batch of :data:`_TRACE_BATCH`), and the number a node of shape arithmetic is
(``x.shape[2] // 2``); a call's name and what counts as a number; and the calls that make a tuple of tensor pieces
(split, chunk, unbind)."""
from __future__ import annotations

from typing import Any

import torch
import torch.fx as fx


_TRACE_BATCH = 2  # a batch of 2 keeps the batch dimension distinguishable from squeezable 1s


def _pair(v: Any) -> list[int]:
    return [int(v), int(v)] if isinstance(v, int) else [int(v[0]), int(v[1])]


def _arg(n: fx.Node, i: int, key: str, default: Any = None) -> Any:
    if len(n.args) > i:
        return n.args[i]
    return n.kwargs.get(key, default)


def einsum_operands(args: Any) -> list[Any]:
    """The operands of an ``einsum`` call's positional ``args`` (traced nodes or tensors): after the equation, given
    one by one or as one list."""
    rest = list(args[1:])
    return list(rest[0]) if len(rest) == 1 and isinstance(rest[0], (list, tuple)) else rest


def _value_at(a: Any, batch: int) -> Any:
    """What ``a`` (an fx node of shape arithmetic: ``x.shape[2]``, ``h * w``, ``y.size(1) // 2``, or a constant) is
    when the batch is ``batch``: the tensors it reads are meta tensors of their traced shapes, but for that batch."""
    if not isinstance(a, fx.Node):
        return fx.node.map_aggregate(a, lambda v: _value_at(v, batch) if isinstance(v, fx.Node) else v)
    meta = a.meta.get("tensor_meta")
    if hasattr(meta, "shape"):
        return torch.empty([batch, *meta.shape[1:]], dtype=meta.dtype, device="meta")
    if a.op not in ("call_function", "call_method"):
        raise ValueError(f"{a.name} is not computed from tensors' shapes")
    args, kwargs = _value_at(a.args, batch), _value_at(a.kwargs, batch)
    return a.target(*args, **kwargs) if a.op == "call_function" else getattr(args[0], a.target)(*args[1:], **kwargs)


def _shape_value(a: Any) -> Any:
    """``a`` itself, or, for an fx node of shape arithmetic (a tensor's side, a product of sides), the number it is
    (:func:`_value_at`); ``ValueError`` for one that depends on the batch's size (``x.shape[0]``), which a description
    leaves out, or that is no number."""
    if not isinstance(a, fx.Node) or _is_tensor(a):
        return a
    value = _value_at(a, _TRACE_BATCH)
    if isinstance(value, torch.Tensor) or value != _value_at(a, _TRACE_BATCH + 1):
        raise ValueError(f"{a.name} depends on the batch's size (x.shape[0]), which a description leaves out")
    return value


def _target_name(target: Any) -> str:
    """An fx node's target as a call is named in a message: a method's name, a function's ``__name__``."""
    return target if isinstance(target, str) else getattr(target, "__name__", str(target))


def _is_number(v: Any) -> bool:
    """Whether ``v`` is an int or a float (a bool is neither here: ``True`` is no threshold or exponent)."""
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def _shape(n: fx.Node) -> list[int] | None:
    meta = n.meta.get("tensor_meta")
    return list(meta.shape)[1:] if hasattr(meta, "shape") else None


_SPLITS = {torch.chunk, "chunk", torch.split, "split"}  # ops whose tuple of tensors a description can index


def _is_tensor(a: Any) -> bool:
    return isinstance(a, fx.Node) and hasattr(a.meta.get("tensor_meta"), "shape")


_UNBINDS = {torch.unbind, "unbind"}
