"""Caching-allocator simulation against the TX2 measurements: no fitting, pure prediction.

For every TX2 network variant, the training step's allocation events are written down from the
description (``perf4sight/features/alloc_model.py``) and replayed through the caching-allocator
model (``allocator.py``); the simulated peak reserved / allocated MiB are compared with the measured
``mem_reserved`` / ``mem_alloc`` (``torch.cuda.max_memory_reserved`` / ``max_memory_allocated``) on
every passed row, replayed as perf4sight's profiler read them (the ``perf4sight`` protocol: the cache
emptied before every step, the warm-up counted twice; its torch counter for reserved memory also holds
the previous step's cache, as the peaks were reset before the cache was emptied, which the replay's own
per-step peak leaves out). Prints MAPE and mean signed error per family, and the cost: ms per network for the
events (written down, and recorded by the meta-device trace for comparison), ms per batch size for
the replay.

    .venv/bin/python bench/bench_allocator.py [--data DIR]
"""
from __future__ import annotations

import argparse
import csv
import os
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from perf4sight.features.alloc_trace import clear_cache, simulate  # noqa: E402
from perf4sight.features.allocator import PERF4SIGHT  # noqa: E402
from perf4sight.ir.schema import load_description  # noqa: E402

#: the shared TX2 folder beside the checkout (PERF4SIGHT_TX2_DATA, as for the tests, where it is elsewhere)
TX2 = Path(os.environ.get("PERF4SIGHT_TX2_DATA", ROOT.parent / "shared" / "data" / "tx2-perf4sight"))


def run(data: Path = TX2) -> list[dict]:
    """Print the table; return figures rows for bench/run_all.py."""
    graphs = sorted((data / "graphs").glob("*.json"))
    if not graphs:
        print(f"TX2 data not found at {data} (--data DIR, or PERF4SIGHT_TX2_DATA): skipped")
        return []
    err: dict[str, dict[str, list[float]]] = {}
    t_events: dict[str, list[float]] = {"model": [], "trace": []}
    t_replay, n_replay = 0.0, 0
    for g in graphs:
        desc = load_description(g)
        fam = desc.network or g.stem.rsplit("_", 1)[0]
        for method in ("trace", "model"):  # the model's events are the ones replayed below
            clear_cache()
            t0 = time.perf_counter()
            tr = simulate(desc, method=method)
            t_events[method].append(time.perf_counter() - t0)
        tr = tr.with_protocol(PERF4SIGHT)  # replayed as perf4sight's profiler read them
        with (data / "profiling_csvs/tx2/imagenet/memory" / f"{g.stem}-gt.csv").open() as fh:
            rows = [r for r in csv.DictReader(fh, delimiter="|") if r["passed"] == "True"]
        e = err.setdefault(fam, {"reserved": [], "alloc": []})
        for r in rows:
            t0 = time.perf_counter()
            res, alloc = np.array(tr.replay(int(r["bs"]))) / 2**20
            t_replay += time.perf_counter() - t0
            n_replay += 1
            e["reserved"].append(res / float(r["mem_reserved"]) - 1)
            e["alloc"].append(alloc / float(r["mem_alloc"]) - 1)
    out = []
    print("simulated vs measured caching-allocator peaks, TX2 (per family, all passed rows)")
    print(f"  {'family':<14}{'rows':>6}{'reserved MAPE %':>17}{'signed %':>10}{'alloc MAPE %':>14}{'signed %':>10}")
    for fam, e in sorted(err.items()):
        r, a = np.array(e["reserved"]), np.array(e["alloc"])
        print(f"  {fam:<14}{len(r):>6}{100 * np.abs(r).mean():>17.1f}{100 * r.mean():>+10.1f}"
              f"{100 * np.abs(a).mean():>14.1f}{100 * a.mean():>+10.1f}")
        reserved_mape, alloc_mape = round(100 * np.abs(r).mean(), 2), round(100 * np.abs(a).mean(), 2)
        out += [{"benchmark": "allocator-sim-tx2", "metric": f"reserved_mape_{fam}", "value": reserved_mape,
                 "unit": "%", "note": "simulated vs measured max_memory_reserved, no fitting"},
                {"benchmark": "allocator-sim-tx2", "metric": f"alloc_mape_{fam}", "value": alloc_mape,
                 "unit": "%", "note": "simulated vs measured max_memory_allocated, no fitting"}]
    model_ms, trace_ms = (1e3 * float(np.median(t_events[m])) for m in ("model", "trace"))
    print(f"cost per network, median: events written down {model_ms:.1f} ms (meta-device trace {trace_ms:.0f} ms); "
          f"replay {1e3 * t_replay / max(1, n_replay):.1f} ms per batch size")
    out.append({"benchmark": "allocator-sim-tx2", "metric": "events_ms_per_network", "value": round(model_ms, 2),
                "unit": "ms", "note": f"written down from the description (meta trace: {trace_ms:.0f} ms)"})
    out.append({"benchmark": "allocator-sim-tx2", "metric": "replay_ms_per_batch", "unit": "ms",
                "value": round(1e3 * t_replay / max(1, n_replay), 2), "note": "allocator replay, 4 steps"})
    return out


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--data", type=Path, default=TX2, help=f"perf4sight TX2 folder (default: {TX2})")
    run(ap.parse_args().data)
