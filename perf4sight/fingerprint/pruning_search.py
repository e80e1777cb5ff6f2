"""The least pruning that lets a network train on a device at a batch size, searched over pruning levels.

``least_pruning(fp, variant, batch_size, max_latency_ms)`` asks the fingerprint ``fp`` about a network pruned at
whole-percent levels (``variant(level)`` makes the description; the predict stage's ``--prune-to-fit`` prunes as
the networks stage would, :func:`perf4sight.networks.on_request.variant_at`) and returns the least level predicted
to fit the device's memory at ``batch_size`` and, with ``max_latency_ms``, to run a step in that many milliseconds.
The predictions need not fall as the level rises (the H100 fingerprint's resnet18 at batch 128 steps in 24.5 ms
pruned 43% and over 25 ms at 44 to 59%; its memory at batch 4096 fits at 56% and not at 57%), so a bisection can
answer a level above the least: the search asks level 0, the highest level the network reaches (99, or less where
``min_channels`` stops it), then every level from 1 up, and answers the first that meets the limits. Asking a level
costs pruning it once (after the network's trace; cached on disk: a few milliseconds for a zoo network, whose level
is made from its unpruned description, :mod:`perf4sight.networks.described_cuts`; else a tenth of a second for
resnet18, a third for mobilenet_v2 on a 2-core host, to cut a copy and trace it) and one prediction (20-30 ms at
224x224), of every batch size still without an answer (:func:`least_prunings`).
"""
from __future__ import annotations

import math
import numbers
from dataclasses import dataclass, field
from typing import Any, Callable, Sequence

from perf4sight.errors import UserError
from perf4sight.features.aggregate import BeyondReplay
from perf4sight.ir.schema import NetworkDescription

__all__ = ["LeastPruning", "least_pruning", "least_prunings", "TOP_LEVEL"]

TOP_LEVEL = 99  #: the highest level searched (% of parameters removed)


@dataclass
class LeastPruning:
    """The answer for one network and batch size; ``level`` None where no level the network reaches meets it."""

    level: int | None                                 # least whole-percent level asked for
    variant: NetworkDescription | None = None         # the network pruned at ``level``
    prediction: dict[str, Any] | None = None          # ``fp.predict``'s figures for it at the batch size
    tried: dict[int, bool] = field(default_factory=dict)  # level -> met, every level asked about


def least_pruning(fp: Any, variant: Callable[[int], NetworkDescription], batch_size: int,
                  max_latency_ms: float | None = None) -> LeastPruning:
    """The least level of ``variant`` predicted by ``fp`` to fit at ``batch_size`` (``fits`` not False: a
    capacity the fingerprint does not know leaves memory out, and then ``max_latency_ms`` is needed: ``UserError``
    without it) and to step within ``max_latency_ms`` when given.
    A level whose step is beyond the allocator replay (``BeyondReplay``: more than 256 TiB) fits no device: not met.
    A level the network cannot reach under ``min_channels`` (``UnreachableLevel``, which says the most it
    reaches) lowers the top of the search to the level it reaches (none but 0 where it reaches under 1%: a backbone
    frozen whole, whose layers are kept whole); one between two of its pruning steps is not met.
    ``tried`` holds every level asked: all those below the answer (all up to the top where none meets)."""
    return least_prunings(fp, variant, [batch_size], max_latency_ms)[0]


def least_prunings(fp: Any, variant: Callable[[int], NetworkDescription], batch_sizes: Sequence[int],
                   max_latency_ms: float | None = None) -> list[LeastPruning]:
    """:func:`least_pruning` at each of ``batch_sizes``, the same answers, searched together: each level is asked
    once for every batch size still without an answer, in one prediction (a third of the time of three)."""
    if not callable(variant):  # a description or its file given for the function: a TypeError at the first level
        raise UserError(f"least_pruning: variant must be a function of the pruning level (a whole percent) returning "
                        f"the network's description at that level, e.g. lambda level: variant_at(cfg, 'resnet18', "
                        f"level, fp.input_shape)[0]; got {type(variant).__name__}")
    if max_latency_ms is not None:
        if not (isinstance(max_latency_ms, numbers.Real) and not isinstance(max_latency_ms, bool)
                and max_latency_ms > 0):
            raise UserError(f"least_pruning: max_latency_ms must be a positive number of milliseconds (or None), got "
                            f"{max_latency_ms!r}")
        max_latency_ms = float(max_latency_ms)  # numpy's numbers too
    elif getattr(fp, "capacity_mb", None) is None:  # nothing to ask of the predictions: level 0 'fitted' vacuously
        raise UserError("least_pruning: the device's memory capacity is unknown, so no level can be found that fits; "
                        "give max_latency_ms to search for a step-time budget alone")
    wanted = list(dict.fromkeys(batch_sizes))  # a batch size given twice is searched once
    made: dict[Any, dict[int, tuple[NetworkDescription, dict[str, Any]]]] = {b: {} for b in wanted}
    tried: dict[Any, dict[int, bool]] = {b: {} for b in wanted}
    found: dict[Any, LeastPruning] = {}
    still = list(wanted)  # the batch sizes without an answer yet

    def ask(level: int) -> list[Any]:
        """Level ``level`` at every batch size of ``still``: those at which it meets the limits."""
        desc = variant(level)
        try:
            preds: list[dict[str, Any] | None] = list(fp.predict(desc, still))
        except BeyondReplay:  # one batch size's step past the replay: each asked alone, so the others are judged
            preds = []
            for b in still:
                try:
                    preds.append(fp.predict(desc, [b])[0])
                except BeyondReplay:  # over the allocator replay's 256 TiB fits no device: not met (largest_fitting)
                    preds.append(None)
        met = []
        for b, p in zip(still, preds):
            if p is not None:
                made[b][level] = desc, p
            tried[b][level] = p is not None and p["fits"] is not False and (
                max_latency_ms is None or p["latency_ms"] <= max_latency_ms)
            if tried[b][level]:
                met.append(b)
        return met

    def settle(level: int | None, bs: list[Any]) -> None:
        for b in bs:
            desc, p = made[b][level] if level is not None else (None, None)
            found[b] = LeastPruning(level, desc, p, tried[b])
            still.remove(b)

    settle(0, ask(0))
    top, top_met = TOP_LEVEL, []
    if still:
        try:
            top_met = ask(top)
        except UserError as exc:  # UnreachableLevel: the network stops short of 99% (min_channels)
            reached = getattr(exc, "achieved", None)
            if reached is None:
                raise
            top = max(math.floor(reached), 0)  # 0: no level but the unpruned one (its layers all frozen, say)
            top_met = ask(top) if top else []
    for level in range(1, top):  # every level below the top: the predictions need not fall as the level rises
        if not still:
            break
        try:
            settle(level, ask(level))
        except UserError as exc:  # a level between that the pruning steps over: not met (a level beyond is asked)
            if getattr(exc, "achieved", None) is None:
                raise
            for b in still:
                tried[b][level] = False
    settle(top, [b for b in still if b in top_met])
    settle(None, list(still))
    return [found[b] for b in batch_sizes]
