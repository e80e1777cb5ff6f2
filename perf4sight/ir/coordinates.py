"""CoordConv's coordinate channels found in a torch.fx trace: the op ``linspace`` (:mod:`perf4sight.ir.schema`).

A coordinate channel of a map ``x`` is written::

    b, _, h, w = x.shape
    rows = torch.linspace(-1, 1, h).view(1, 1, h, 1).expand(b, 1, h, w)   # dim 2
    cols = torch.linspace(-1, 1, w).view(1, 1, 1, w).expand(b, 1, h, w)   # dim 3

(``reshape`` for ``view``; ``device=x.device`` and a float32 ``dtype`` at the call), then concatenated to the map.
Its three nodes are one description node, the expand's, whose input is ``x`` (its shape alone read). Any other way
of making values from numbers (a ``repeat`` of them, an ``arange``, a linspace read otherwise) is not one, and stays
refused by name.
"""
from __future__ import annotations

from typing import Any, Optional

import torch
import torch.fx as fx

from perf4sight.ir.fx_values import _arg, _shape_value
from perf4sight.ir.torch_patterns import _shape_read

__all__ = ["coordinate_channels"]


def _size_source(a: Any) -> Optional[fx.Node]:
    """The [N, C, H, W] tensor one of whose sizes ``a`` reads (``x.shape[2]``, ``x.size(0)``, ``x.size()[3]``:
    :func:`perf4sight.ir.torch_patterns._shape_read`); None for a number or anything else."""
    read = _shape_read(a)
    return read[0] if read is not None and len(read[1]) == 1 else None


def _sizes(n: fx.Node) -> list[Any]:
    """The sizes a ``view``, ``reshape`` or ``expand`` call gives, one by one or as one sequence."""
    sizes = list(n.args[1:])
    return list(sizes[0]) if len(sizes) == 1 and isinstance(sizes[0], (list, tuple)) else sizes


def _coordinates(end: fx.Node) -> Optional[tuple[fx.Node, dict, list[fx.Node]]]:
    """``(x, attrs, [linspace, view])`` where ``end`` expands a linspace viewed along dim 2 or 3 over the map ``x``
    whose sizes it reads; None otherwise."""
    if end.op != "call_method" or end.target != "expand" or end.kwargs:
        return None
    view = end.args[0]
    if not (isinstance(view, fx.Node) and view.op == "call_method" and view.target in ("view", "reshape")
            and not view.kwargs):
        return None
    line = view.args[0]
    if not (isinstance(line, fx.Node) and line.op == "call_function" and line.target is torch.linspace):
        return None
    if set(line.kwargs) - {"steps", "device", "dtype", "requires_grad"} or len(line.args) > 3 or \
            line.kwargs.get("dtype") not in (None, torch.float32) or line.kwargs.get("requires_grad"):
        return None
    start, stop, steps = _arg(line, 0, "start"), _arg(line, 1, "end"), _arg(line, 2, "steps")
    if any(isinstance(v, bool) or not isinstance(v, (int, float)) for v in (start, stop)):
        return None
    sources = {_size_source(a) for a in [*_sizes(end), steps] if isinstance(a, fx.Node)}
    if len(sources) != 1 or None in sources or not isinstance(_sizes(end)[0], fx.Node):
        return None  # sizes read off one map, the batch's among them (a batch fixed at the trace is no channel)
    (x,) = sources
    shape = [int(s) for s in x.meta["tensor_meta"].shape] if "tensor_meta" in x.meta else []
    out = [int(s) for s in end.meta["tensor_meta"].shape]
    viewed = [int(_shape_value(s)) for s in _sizes(view)]
    n = int(_shape_value(steps))
    if len(shape) != 4 or out != [shape[0], 1, shape[2], shape[3]]:
        return None
    expected = {2: [1, 1, n, 1], 3: [1, 1, 1, n]}
    dim = next((d for d in (2, 3) if viewed == expected[d] and n == shape[d]), None)
    if dim is None:
        return None
    return x, {"start": float(start), "end": float(stop), "dim": dim}, [line, view]


def coordinate_channels(gm: fx.GraphModule) -> tuple[dict[str, tuple[fx.Node, dict]], set[str]]:
    """CoordConv's coordinate channels in ``gm``: each expand that ends one (module docstring) -> (the map whose sizes
    it reads, its ``linspace`` attrs), and the names of the nodes it takes in (the linspace, its view). One whose
    linspace or view is read elsewhere is left out."""
    found: dict[str, tuple[fx.Node, dict]] = {}
    taken: set[str] = set()
    for n in gm.graph.nodes:
        made = _coordinates(n)
        if made is None:
            continue
        x, attrs, inner = made
        if any(len(m.users) != 1 for m in inner):
            continue
        found[n.name] = (x, attrs)
        taken.update(m.name for m in inner)
    return found, taken
