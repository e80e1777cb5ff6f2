"""Where one network's description -> prediction time goes, piece by piece (run by hand, not by run_all.py: its name
starts with an underscore): the parts ``bench_replay_speed.py`` times as one.

    .venv/bin/python bench/_where_time_goes.py [--network maxvit_t] [--rounds 15]

Per round, as that benchmark runs it (the simulation cache cleared, Python's collector run first, then paused where
``simulate`` and the replay pause it), the process time of: the cache key; ``step_events`` (its forward's nodes and
its backward timed apart, through wrappers that cost a little: their sum is under the whole); the later steps
written down (``_assemble_steps``) and the events made arrays (``_trace_of``); the trace's once-made parts (the
events as the replay runs them, the setup's shared start, the repeat's plan, the tensors the last step touches); and
the replay at each batch size. Prints the median (and the minimum) of each in ms, then, per batch size, the events
the allocator ran and, in the first step, the ALLOCs of each pool (how many scale with the batch): a part the same
at every batch size could be replayed once, and these say how little is.
"""
from __future__ import annotations

import argparse
import gc
import os
import statistics
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
BATCHES = (2, 8, 32, 64)


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--network", default="maxvit_t")
    ap.add_argument("--side", type=int, default=224)
    ap.add_argument("--rounds", type=int, default=15)
    args = ap.parse_args(argv)
    sys.path.insert(0, str(ROOT))
    from perf4sight.features import alloc_model, alloc_trace, allocator
    from perf4sight.networks.zoo import describe_zoo

    desc = describe_zoo(args.network, [3, args.side, args.side])
    times: dict[str, list[float]] = {}
    inner = {"forward": 0.0, "backward": 0.0}

    def timed(name: str, f):  # noqa: ANN001, ANN202 - a wrapper adding its process time to inner[name]
        def call(*a, **kw):  # noqa: ANN002, ANN003, ANN202
            t0 = time.process_time()
            try:
                return f(*a, **kw)
            finally:
                inner[name] += time.process_time() - t0
        return call

    forward, backward = alloc_model._forward, alloc_model._backward
    step = alloc_trace._OptimizerStep.of({})
    clock = time.process_time
    for _ in range(args.rounds):
        alloc_trace.clear_cache()
        gc.collect()
        part: dict[str, float] = {}
        t0 = clock()
        alloc_trace._key(desc)
        part["cache key"] = clock() - t0
        inner.update(forward=0.0, backward=0.0)
        alloc_model._forward, alloc_model._backward = timed("forward", forward), timed("backward", backward)
        try:
            with allocator.collector_paused():
                t0 = clock()
                st = alloc_model.step_events(desc, alloc_trace.PROBE_BATCH)
                part["step_events"] = clock() - t0
                part["  its forward's nodes"], part["  its backward"] = inner["forward"], inner["backward"]
                t0 = clock()
                events = alloc_trace._assemble_steps(st.setup, st.body, st.tail, dict(st.grads),
                                                     list(st.param_bytes), 2, st.new_id, step)
                part["later steps written down"] = clock() - t0
                t0 = clock()
                trace = alloc_trace._trace_of(desc, [events], (alloc_trace.PROBE_BATCH,), False, {})
                part["events as arrays"] = clock() - t0
                del st, events
        finally:
            alloc_model._forward, alloc_model._backward = forward, backward
        for name, made in (("replay's events, once", trace._fused_runs), ("setup's start, once", trace._setup_start),
                           ("repeat's plan, once", trace._repeat_run),
                           ("last step's tensors, once", trace._last_step_tensors)):
            t0 = clock()
            made()
            part[name] = clock() - t0
        for b in BATCHES:
            t0 = clock()
            trace.replay(b)
            part[f"replay at batch {b}"] = clock() - t0
        for name, t in part.items():
            times.setdefault(name, []).append(1e3 * t)
    print(f"{args.network} {args.side}px, {args.rounds} rounds, process time, load average "
          f"{' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    for name, t in times.items():
        print(f"  {name:30s} {statistics.median(t):7.2f} ms (min {min(t):.2f})")
    _events_run(trace, allocator)


def _events_run(trace, allocator) -> None:  # noqa: ANN001
    """Per batch size, the events the allocator ran in a replay, and the first step's ALLOCs per pool."""
    run = allocator.CachingAllocator.run
    count = [0]

    def counted(self, kinds, ids, sizes, live, record=None):  # noqa: ANN001, ANN202
        count[0] += len(kinds)
        return run(self, kinds, ids, sizes, live, record)

    allocator.CachingAllocator.run = counted
    try:
        for b in BATCHES:
            trace._memo.clear()
            count[0] = 0
            trace.replay(b)
            kinds, _, index = trace._fused_runs()[1]
            sizes = trace._rounded_sizes(b)[index]
            made = np.isin(np.asarray(kinds), (allocator.ALLOC, 3)) & (sizes > 0)
            scaled = (index >= 0) & (np.asarray(trace.per_sample)[index] > 0)
            small = made & (sizes <= allocator.K_SMALL_SIZE)
            large = made & ~small
            print(f"  batch {b:3d}: {count[0]:6d} events run; first step's ALLOCs: small pool {small.sum()} "
                  f"({(small & scaled).sum()} scale with the batch), large pool {large.sum()} "
                  f"({(large & ~scaled).sum()} do not)")
    finally:
        allocator.CachingAllocator.run = run


if __name__ == "__main__":
    main()
