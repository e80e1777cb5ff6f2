"""CoordConv's coordinate channels found in a torch.fx trace: the op ``linspace`` (:mod:`perf4sight.ir.schema`).

A coordinate channel of a map ``x`` is written::

    b, _, h, w = x.shape
    rows = torch.linspace(-1, 1, h).view(1, 1, h, 1).expand(b, 1, h, w)   # dim 2
    cols = torch.linspace(-1, 1, w).view(1, 1, 1, w).expand(b, 1, h, w)   # dim 3

(``reshape`` for ``view``; ``device=x.device`` and a float32 ``dtype`` at the call), then concatenated to the map.
Its three nodes are one description node, the expand's, whose input is ``x`` (its shape alone read). So is each grid
of ``torch.meshgrid`` of two such linspaces (views of them), expanded over the batch, as SOLO's CoordConv writes it
(:func:`_meshgrid_coordinates`). The common
PyTorch port of CoordConv (an ``AddCoords`` layer) writes them by ``torch.arange`` instead, copied over the map and
the batch, the linspace's attr ``made`` ``arange``::

    rows = torch.arange(h).repeat(1, w, 1)                       # [1, w, h]
    cols = torch.arange(w).repeat(1, h, 1).transpose(1, 2)       # [1, w, h]
    rows = rows.float() / (h - 1) * 2 - 1                        # (cols: / (w - 1)); without * 2 - 1: 0 to 1
    rows = rows.repeat(b, 1, 1, 1).transpose(2, 3)               # [b, 1, h, w], a copy a sample
    torch.cat([x, rows.type_as(x), cols.type_as(x)], 1)          # (type_as optional; device=x.device at arange)

Any other way of making values from numbers (a ``repeat`` of a linspace, a linspace read otherwise, another
arange) is not one, and stays refused by name.
"""
from __future__ import annotations

import operator
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


def _line(line: Any) -> Optional[tuple[Any, Any, Any]]:
    """``(start, end, steps)`` where ``line`` is a float32 ``torch.linspace`` of numbers (``device=`` taken); None
    otherwise."""
    if not (isinstance(line, fx.Node) and line.op == "call_function" and line.target is torch.linspace):
        return None
    if set(line.kwargs) - {"steps", "device", "dtype", "requires_grad"} or len(line.args) > 3 or \
            line.kwargs.get("dtype") not in (None, torch.float32) or line.kwargs.get("requires_grad"):
        return None
    start, stop, steps = _arg(line, 0, "start"), _arg(line, 1, "end"), _arg(line, 2, "steps")
    if any(isinstance(v, bool) or not isinstance(v, (int, float)) for v in (start, stop)):
        return None
    return start, stop, steps


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
    read = _line(line)
    if read is None:
        return None
    start, stop, steps = read
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


def _side(a: Any) -> Optional[tuple[fx.Node, int]]:
    """(the [N, C, H, W] tensor, the dimension) of which ``a`` reads one size (:func:`_shape_read`); None else."""
    read = _shape_read(a)
    return (read[0], read[1][0]) if read is not None and len(read[1]) == 1 else None


def _method(n: Any, name: str, *args: Any) -> Optional[fx.Node]:
    """``n``'s tensor input where ``n`` is the call ``tensor.name(*args)`` (no keywords); None otherwise."""
    if isinstance(n, fx.Node) and n.op == "call_method" and n.target == name and not n.kwargs and \
            tuple(n.args[1:]) == args and isinstance(n.args[0], fx.Node):
        return n.args[0]
    return None


def _call(n: Any, targets: set, number: Any) -> Optional[fx.Node]:
    """``t`` where ``n`` is ``t <op> number`` (``targets`` the op's spellings); None otherwise."""
    if isinstance(n, fx.Node) and n.op in ("call_function", "call_method") and n.target in targets and \
            len(n.args) == 2 and not n.kwargs and isinstance(n.args[0], fx.Node) and n.args[1] == number and \
            not isinstance(n.args[1], bool):
        return n.args[0]
    return None


def _scaled_count(scaled: Any) -> Optional[tuple[float, fx.Node, fx.Node, list[fx.Node]]]:
    """``(start, counted, n, nodes)`` where ``scaled`` is ``counted.float() / (n - 1)``, times 2 less 1 (start -1)
    or not (start 0), ``n`` a side read off a map; None otherwise."""
    shifted = _call(scaled, {operator.sub, torch.sub, "sub"}, 1)
    doubled = _call(shifted, {operator.mul, torch.mul, "mul"}, 2) if shifted is not None else None
    divided = doubled if doubled is not None else scaled
    if not (isinstance(divided, fx.Node) and divided.op == "call_function" and divided.target in (
            operator.truediv, torch.div, torch.true_divide) and len(divided.args) == 2 and not divided.kwargs):
        return None
    floated, less = divided.args
    counted = _method(floated, "float")
    if counted is None or not isinstance(less, fx.Node) or not (less.op == "call_function" and less.target in (
            operator.sub,) and less.args[1:] == (1,)) or _side(less.args[0]) is None:
        return None
    nodes = ([scaled, shifted] if doubled is not None else [scaled]) + [divided, floated]
    return (-1.0 if doubled is not None else 0.0), counted, less.args[0], nodes


def _is_arange(line: Any) -> bool:
    """Whether ``line`` is ``torch.arange(n)`` (``device=`` taken)."""
    return isinstance(line, fx.Node) and line.op == "call_function" and line.target is torch.arange and \
        len(line.args) == 1 and set(line.kwargs) <= {"device"}


def _arange_coordinates(end: fx.Node) -> Optional[tuple[fx.Node, dict, list[fx.Node]]]:
    """``(x, attrs, nodes taken in)`` where ``end`` ends a coordinate channel made by ``torch.arange`` as the
    module docstring writes it (``made`` ``arange``); None otherwise."""
    swapped = end
    if end.op == "call_method" and end.target == "type_as" and len(end.args) == 2 and not end.kwargs:
        swapped = end.args[0]
    elif [u.target for u in end.users] == ["type_as"]:
        return None  # the type_as ends it
    copied = _method(swapped, "transpose", 2, 3)
    if copied is None or not (copied.op == "call_method" and copied.target == "repeat" and len(copied.args) == 5
                              and not copied.kwargs and list(copied.args[2:]) == [1, 1, 1]):
        return None
    batch, count = _side(copied.args[1]), _scaled_count(copied.args[0])
    if count is None:
        return None
    start, counted, n, nodes = count
    nodes += [copied, swapped] + ([end] if swapped is not end else [])
    turned = _method(counted, "transpose", 1, 2)
    dim = 3 if turned is not None else 2
    rows = turned if turned is not None else counted
    if not (rows.op == "call_method" and rows.target == "repeat" and len(rows.args) == 4 and not rows.kwargs and
            rows.args[1] == 1 and rows.args[3] == 1) or not _is_arange(rows.args[0]):
        return None
    line = rows.args[0]
    nodes += [rows, line] + ([counted] if turned is not None else [])
    sides = [batch, _side(rows.args[2]), _side(line.args[0]), _side(n)]
    if None in sides or len({t for t, _ in sides}) != 1 or [d for _, d in sides] != [0, 5 - dim, dim, dim]:
        return None
    x = sides[0][0]
    if swapped is not end and end.args[1] is not x:
        return None
    return x, {"start": start, "end": 1.0, "dim": dim, "made": "arange"}, [m for m in nodes if m is not end]


def _meshgrid(grid: Any, made: Any) -> Optional[tuple[fx.Node, int, list[fx.Node]]]:
    """``(line, dim, [mesh, grid])`` where ``grid`` is one of the two grids ``torch.meshgrid`` makes of two tensors
    ``made`` says are lines (``indexing`` "ij" or "xy"): ``line`` the one it spans, along ``dim`` (2 or 3); None
    otherwise."""
    if not (isinstance(grid, fx.Node) and grid.op == "call_function" and grid.target is operator.getitem and
            grid.args[1] in (0, 1) and isinstance(grid.args[0], fx.Node)):
        return None
    mesh, which = grid.args
    lines = list(mesh.args[0]) if len(mesh.args) == 1 and isinstance(mesh.args[0], (list, tuple)) else list(mesh.args)
    if not (mesh.op == "call_function" and mesh.target is torch.meshgrid and set(mesh.kwargs) <= {"indexing"} and
            mesh.kwargs.get("indexing", "ij") in ("ij", "xy") and len(lines) == 2 and
            all(made(a) and len(a.users) == 1 for a in lines)):
        return None
    return lines[which], ((2 + which) if mesh.kwargs.get("indexing", "ij") == "ij" else (3 - which)), [mesh, grid]


def _spread(grid: Any) -> Optional[tuple[fx.Node, int, list[fx.Node]]]:
    """``(line, dim, [view, grid])`` where ``grid`` is ``line.view(h, 1).expand(h, w)`` (dim 2) or ``line.view(1,
    w).expand(h, w)`` (dim 3), ``line`` an arange (how to_torch spreads a grid's line); None otherwise."""
    view = grid.args[0] if isinstance(grid, fx.Node) and grid.op == "call_method" and grid.target == "expand" and \
        len(grid.users) == 1 and not grid.kwargs else None
    if not (isinstance(view, fx.Node) and view.op == "call_method" and view.target == "view" and
            not view.kwargs and len(view.args) == 3 and _is_arange(view.args[0]) and "tensor_meta" in grid.meta):
        return None
    ones = [i for i in (1, 2) if view.args[i] == 1]
    if len(ones) != 1 or len(grid.meta["tensor_meta"].shape) != 2:
        return None
    return view.args[0], 3 - ones[0] + 1, [view, grid]


def _meshgrid_coordinates(end: fx.Node) -> Optional[tuple[fx.Node, dict, list[fx.Node]]]:
    """``(x, attrs, nodes taken in)`` where ``end`` expands over the batch one of the two grids ``torch.meshgrid``
    makes of linspaces over the rows and the columns of the map ``x`` (SOLO's CoordConv: ``y, x =
    torch.meshgrid(linspace(-1, 1, h), linspace(-1, 1, w))``, ``y.expand([b, 1, -1, -1])``; ``indexing`` "ij" or
    "xy"; leading dims of 1 added by view, reshape, unsqueeze or ``[None]``): the op linspace, the grids views of the
    linspaces; or of two aranges, each grid scaled as the port scales its aranges (``.float() / (n - 1)``, ``* 2 -
    1`` or not): ``made`` ``arange_grid``. None otherwise."""
    if end.op != "call_method" or end.target != "expand" or end.kwargs or "tensor_meta" not in end.meta:
        return None
    grid, added = end.args[0], []
    while isinstance(grid, fx.Node) and len(grid.users) == 1 and (
            (grid.op == "call_method" and grid.target in ("view", "reshape", "unsqueeze") and not grid.kwargs) or
            (grid.op == "call_function" and grid.target is operator.getitem and isinstance(grid.args[1], tuple))):
        added.append(grid)
        grid = grid.args[0]
    found = _meshgrid(grid, lambda a: _line(a) is not None)
    if found is not None:
        start, stop, steps = _line(found[0])
        attrs = {"start": float(start), "end": float(stop), "dim": found[1]}
        sides = [_side(steps)]
    else:
        count = _scaled_count(grid)
        if count is None:
            return None
        found = _meshgrid(count[1], _is_arange) or _spread(count[1])
        if found is None:
            return None
        attrs = {"start": count[0], "end": 1.0, "dim": found[1], "made": "arange_grid"}
        sides, added = [_side(found[0].args[0]), _side(count[2])], added + count[3]
    batch = _side(_sizes(end)[0]) if _sizes(end) else None
    dim = attrs["dim"]
    if batch is None or None in sides or any(t is not batch[0] or d != dim for t, d in sides) or batch[1] != 0:
        return None
    x = batch[0]
    shape = [int(v) for v in x.meta["tensor_meta"].shape] if "tensor_meta" in x.meta else []
    if len(shape) != 4 or [int(v) for v in end.meta["tensor_meta"].shape] != [shape[0], 1, *shape[2:]] or any(
            [int(v) for v in a.meta["tensor_meta"].shape][-2:] != shape[2:] or
            set(int(v) for v in a.meta["tensor_meta"].shape[:-2]) - {1} for a in added if "tensor_meta" in a.meta):
        return None
    return x, attrs, [found[0], *found[2], *added]


def coordinate_channels(gm: fx.GraphModule) -> tuple[dict[str, tuple[fx.Node, dict]], set[str]]:
    """CoordConv's coordinate channels in ``gm``: each node that ends one (module docstring) -> (the map whose sizes
    it reads, its ``linspace`` attrs), and the names of the nodes it takes in (the linspace, its view, ...). One
    whose nodes are read elsewhere (a meshgrid but by its two grids' channels) is left out."""
    made = {n: m for n in gm.graph.nodes for m in [_coordinates(n) or _meshgrid_coordinates(n) or (
        _arange_coordinates(n) if n.op == "call_method" else None)] if m is not None and all(
        len(k.users) == 1 for k in m[2] if k.target is not torch.meshgrid)}
    while True:  # a meshgrid is read by both its grids' channels: each node taken in read by channels' nodes alone
        inside = set(made) | {m for _, _, inner in made.values() for m in inner}
        out = [n for n, (_, _, inner) in made.items() if any(set(m.users) - inside for m in inner)]
        if not out:
            break
        for n in out:
            del made[n]
    found = {n.name: (x, attrs) for n, (x, attrs, _) in made.items()}
    return found, {m.name for _, _, inner in made.values() for m in inner}
