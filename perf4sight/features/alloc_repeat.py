"""A node's forward written down once and repeated by renaming (:func:`_repeated`): where a later node of the step has
the same op, attributes, batch and input geometry as an earlier one (a MaxViT's group attentions, :data:`_REPEATED`),
the earlier handler's events, holds and autograd nodes (:class:`_Repeat`, checked renamable by :func:`_record`) are
written again under new storage ids, node indices and parameters, instead of running the handler.
"""
from __future__ import annotations

import json
from dataclasses import dataclass, fields
from operator import attrgetter
from typing import Callable, NamedTuple

from perf4sight.features.alloc_values import _GradFn, _OpContext, _Value


#: Ops whose handler's work a later node of the same kind, attributes and input geometry repeats by renaming
#: (:func:`_repeated`): a MaxViT's group attentions, 22 of them of 4 geometries, 34 autograd nodes each; a Swin's
#: window attentions and a ViT's attentions, alike by stage (swin_v2_b's whole prediction 3.6 ms less).
_REPEATED = {"group_attention", "window_attention", "attention"}
_OTHER_FIELDS = attrgetter(*[f.name for f in fields(_GradFn)][2:])  # an autograd node's fields after saved, edges


@dataclass(slots=True)
class _Repeat:
    """What a handler did for one node, in terms a later node of the same key (:func:`_repeated`) can rename: storage
    ids as offsets from the last id before the call (0: the input's storage), autograd node indices as offsets from
    the first node it made (-1: the input's node), parameters as offsets from its first parameter."""
    events: list[tuple[int, int, int, str]]  # (kind, storage offset, bytes, aten op)
    span: int  # ids the call took
    alive: list[tuple[int, int]]  # (storage offset, holders) of its storages alive after it
    input_holds: int  # holds it added on its input's storage
    fns: list[tuple[list[int], list, tuple]]  # per autograd node: saved offsets, edges renamed, its other fields
    out: _Value  # its output, its storage and node as offsets


def _repeated(ctx: _OpContext, handler: Callable[[_OpContext], _Value]) -> _Value:
    """``handler(ctx)``, or where an earlier node of the step had the same op, attributes, batch and input geometry, its
    work again under new names: the same events of storages numbered on from the last, the same autograd nodes
    appended (edges to its own nodes, to the input's node and to its own parameters renamed), the same holds. Sound
    where the handler reads nothing of the step's state but its node and input (:data:`_REPEATED`'s do not), and
    touches no storage or node made before it but its input's (checked when it runs first: else it always runs)."""
    x, mem, node = ctx.x, ctx.mem, ctx.node
    key = (node.op, json.dumps(node.attrs, sort_keys=True, default=str), ctx.full_in, ctx.full_out,
           len(ctx.inputs), x.nbytes, x.strides, x.raw, x.loose, x.view, x.base_fn is None, x.fn is None,
           ctx.relu6_clone)
    if key not in mem.repeats:
        before = _Before(mem.last_id, len(ctx.fns), len(mem.events), sum(mem.holders.values()),
                         mem.holders.get(x.sid, 0), len(mem.saved), x.sid in mem.saved)
        out = handler(ctx)
        mem.repeats[key] = _record(ctx, out, before)
        return out
    done = mem.repeats[key]
    if done is None:
        return handler(ctx)
    base, first_fn, p0, sid, fn = mem.last_id, len(ctx.fns), ctx.first_param, x.sid, x.fn
    mem.events += [(kind, base + at, nbytes, op) for kind, at, nbytes, op in done.events]
    for at, holds in done.alive:
        mem.holders[base + at] = holds
    if done.input_holds:
        mem.holders[sid] += done.input_holds
    append = ctx.fns.append
    for kept, edges, rest in done.fns:
        if kept:
            kept = [base + at if at else sid for at in kept]
            mem.saved.update(kept)  # as :meth:`_OpContext.grad_fn` keeps them
        append(_GradFn(kept or [], [None if e is None else ("param", p0 + e[1]) if e[0] == "param" else
                                    ("fn", fn if e[1] < 0 else first_fn + e[1]) for e in edges], *rest))
    mem.last_id = base + done.span
    o = done.out
    made = None if o.fn is None else fn if o.fn < 0 else first_fn + o.fn
    return _Value(base + o.sid if o.sid else sid, o.nbytes, made, o.view, o.strides, None, o.raw, o.loose)


class _Before(NamedTuple):
    """The step before a handler ran (:func:`_record`): its last storage id, its counts of autograd nodes and events,
    the sum of its storages' holds, its input's holds, how many storages its nodes keep and whether its input is one."""
    last_id: int
    fns: int
    events: int
    holds: int
    input_holds: int
    saved: int
    input_saved: bool


def _record(ctx: _OpContext, out: _Value, before: _Before) -> _Repeat | None:
    """What the handler did for ``ctx``'s node (:class:`_Repeat`), the step having been as ``before`` says; None where
    a later node could not repeat it by renaming: it touched a storage or a node made before it other than its
    input's (an event of one, a hold on or off one, a node of the earlier ones kept or linked to), took a hold off
    its input, or gave its output a base's node. Checked by counts: a storage's holds change only by holds and drops,
    and the kept storages only grow, by those of the nodes made (:meth:`_OpContext.grad_fn`)."""
    x, mem, fns = ctx.x, ctx.mem, ctx.fns
    first_id, first_fn, first_event = before.last_id, before.fns, before.events

    def storage(s: int) -> int | None:  # its offset; None: made before, not the input's
        return s - first_id if s > first_id else 0 if s == x.sid else None

    def node_of(e: tuple[str, int] | None) -> tuple[str, int] | None | bool:  # renamed; False: not renamable
        if e is None:
            return None
        kind, at = e
        if kind == "param":
            return ("param", at - ctx.first_param)
        if kind == "fn" and at >= first_fn:
            return ("fn", at - first_fn)
        return ("fn", -1) if kind == "fn" and at == x.fn else False

    events = [(kind, s - first_id, nbytes, op) for kind, s, nbytes, op in mem.events[first_event:] if s > first_id]
    if len(events) != len(mem.events) - first_event or len(fns) < first_fn or out.base_fn is not None:
        return None  # an event of a storage made before it (its input's freed, or another's)
    alive = [(s - first_id, mem.holders[s]) for s in range(first_id + 1, mem.last_id + 1) if s in mem.holders]
    holds = mem.holders.get(x.sid, 0) - before.input_holds
    if holds < 0 or sum(mem.holders.values()) - sum(h for _, h in alive) != before.holds + holds:
        return None  # a hold off its input, or on or off another storage made before it
    made, kept_by_nodes = [], set()
    for fn in fns[first_fn:]:
        kept, edges = [storage(s) for s in fn.saved], [node_of(e) for e in fn.edges]
        if None in kept or False in edges:
            return None
        kept_by_nodes.update(fn.saved)
        made.append((kept, edges, _OTHER_FIELDS(fn)))
    grown = len(kept_by_nodes) - (x.sid in kept_by_nodes and before.input_saved)
    result = node_of(("fn", out.fn)) if out.fn is not None else None
    if len(mem.saved) != before.saved + grown or storage(out.sid) is None or result is False:
        return None
    return _Repeat(events, mem.last_id - first_id, alive, holds, made,
                   _Value(storage(out.sid), out.nbytes, None if result is None else result[1], out.view, out.strides,
                          None, out.raw, out.loose))
