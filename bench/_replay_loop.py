"""The allocator replay's event loop alone, a base tree's against this one's, alternating in one process (run by hand,
not by run_all.py: its name starts with an underscore).

    .venv/bin/python bench/_replay_loop.py /path/to/base_clone [--network maxvit_t] [--rounds 31]

Each tree's ``allocator.py`` is loaded on its own; the network's trace is simulated once (this tree's package) and the
events of its setup and steps, as the replay runs them, are run through each tree's ``CachingAllocator.run`` at batch
sizes 2, 8, 32, 64 (no looks, no repeats: the loop and nothing else), the collector off. Both must end in the same
state (peaks, bytes, both pools), else it stops. Prints the minimum and median of each (ms, process time) and the
median of the paired differences: a change of the loop by a few per cent is lost in the whole description ->
prediction time on a loaded machine (bench_replay_speed.py --against), not here.
"""
from __future__ import annotations

import argparse
import gc
import importlib.util
import os
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
BATCHES = (2, 8, 32, 64)


def _allocator(tree: Path, name: str):  # noqa: ANN202 - a module
    """``tree``'s perf4sight/features/allocator.py as a module of its own (``name``)."""
    spec = importlib.util.spec_from_file_location(name, tree / "perf4sight" / "features" / "allocator.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # dataclasses look the module up
    spec.loader.exec_module(module)
    return module


def _events(network: str, side: int) -> list[list[tuple[list[int], list[int], list[int]]]]:
    """Per batch size, the setup's and each step's events as the replay runs them (kinds, ids, rounded sizes)."""
    sys.path.insert(0, str(ROOT))
    from perf4sight.features.alloc_trace import simulate
    from perf4sight.features.allocator import round_size
    from perf4sight.networks.zoo import describe_zoo
    trace = simulate(describe_zoo(network, [3, side, side]))
    out = []
    for b in BATCHES:
        sizes = trace.sizes(b)
        sizes = np.append(np.where(sizes > 0, round_size(sizes), 0), 0)
        out.append([(kinds, ids, sizes[index].tolist()) for kinds, ids, index in trace._fused_runs()])
    return out


def _run_all(module, events: list) -> list[tuple]:  # noqa: ANN001
    """Every batch size's events through ``module``'s allocator; the state each ends in."""
    ends = []
    for runs in events:
        alloc, live = module.CachingAllocator(), {}
        for kinds, ids, sizes in runs:
            alloc.run(kinds, ids, sizes, live)
        ends.append((alloc.peak_reserved, alloc.peak_allocated, alloc.reserved, alloc.allocated,
                     tuple(alloc._pools[0]), tuple(alloc._pools[1])))
        alloc.unlink(live)
    return ends


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("base", type=Path, help="a base tree (a clone of the commit before)")
    ap.add_argument("--network", default="maxvit_t")
    ap.add_argument("--side", type=int, default=224)
    ap.add_argument("--rounds", type=int, default=31)
    args = ap.parse_args(argv)
    modules = {"base": _allocator(args.base.resolve(), "_base_allocator"), "this": _allocator(ROOT, "_this_allocator")}
    events = _events(args.network, args.side)
    if _run_all(modules["base"], events) != _run_all(modules["this"], events):
        sys.exit(f"{args.network}: the two loops end in different states")
    times: dict[str, list[float]] = {"base": [], "this": []}
    gc.disable()
    try:
        for r in range(args.rounds):
            for which in (("base", "this") if r % 2 == 0 else ("this", "base")):
                t0 = time.process_time()
                _run_all(modules[which], events)
                times[which].append(1e3 * (time.process_time() - t0))
    finally:
        gc.enable()
    base, this = np.array(times["base"]), np.array(times["this"])
    print(f"{args.network} {args.side}px, the loop at batch sizes {', '.join(map(str, BATCHES))}, "
          f"{args.rounds} rounds, load average {os.getloadavg()[0]:.2f}: base min {base.min():.2f} median "
          f"{np.median(base):.2f} ms, this min {this.min():.2f} median {np.median(this):.2f} ms, "
          f"paired difference {np.median(this - base):+.2f} ms")


if __name__ == "__main__":
    main()
