"""Caching-allocator simulation against the TX2 measurements: no fitting, pure prediction.

For every TX2 network variant, the training step is traced on the meta device and replayed through
the caching-allocator model (``perf4sight/features/alloc_trace.py``, ``allocator.py``); the simulated
peak reserved / allocated MiB are compared with the measured ``mem_reserved`` / ``mem_alloc``
(``torch.cuda.max_memory_reserved`` / ``max_memory_allocated``) on every passed row. Prints MAPE and
mean signed error per family, and the cost: trace seconds per network, replay ms per batch size.

    .venv/bin/python bench/bench_allocator.py
"""
from __future__ import annotations

import csv
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from perf4sight.features.alloc_trace import simulate  # noqa: E402
from perf4sight.ir.schema import load_description  # noqa: E402

TX2 = ROOT.parent / "shared" / "data" / "tx2-perf4sight"


def run(data: Path = TX2) -> list[dict]:
    """Print the table; return figures rows for bench/run_all.py."""
    graphs = sorted((data / "graphs").glob("*.json"))
    if not graphs:
        print(f"TX2 data not found at {data}: skipped")
        return []
    err: dict[str, dict[str, list[float]]] = {}
    t_trace, t_replay, n_replay = [], 0.0, 0
    for g in graphs:
        desc = load_description(g)
        fam = desc.network or g.stem.rsplit("_", 1)[0]
        t0 = time.perf_counter()
        tr = simulate(desc)
        t_trace.append(time.perf_counter() - t0)
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
        out += [{"benchmark": "allocator-sim-tx2", "metric": f"reserved_mape_{fam}", "value": round(100 * np.abs(r).mean(), 2),
                 "unit": "%", "note": "simulated vs measured max_memory_reserved, no fitting"},
                {"benchmark": "allocator-sim-tx2", "metric": f"alloc_mape_{fam}", "value": round(100 * np.abs(a).mean(), 2),
                 "unit": "%", "note": "simulated vs measured max_memory_allocated, no fitting"}]
    print(f"cost: trace {np.median(t_trace):.2f} s median per network (max {max(t_trace):.2f} s, first includes torch import); "
          f"replay {1e3 * t_replay / max(1, n_replay):.1f} ms per batch size")
    out.append({"benchmark": "allocator-sim-tx2", "metric": "trace_s_per_network", "value": round(float(np.median(t_trace)), 3),
                "unit": "s", "note": "meta-device trace at 2 batch sizes"})
    out.append({"benchmark": "allocator-sim-tx2", "metric": "replay_ms_per_batch", "unit": "ms",
                "value": round(1e3 * t_replay / max(1, n_replay), 2), "note": "allocator replay, 4 steps"})
    return out


if __name__ == "__main__":
    run()
