"""How much this machine's own measurements move when the same configuration is measured again.

The fingerprint cannot be more accurate than the measurements it is checked against. This bench
measures a few (network, batch size) configurations of the default config's networks (torchvision
resnet18, mobilenet_v2, squeezenet1_0 at 3x64x64) ``--repeats`` times each with the real profiler
(``runner.run_child``: a fresh process per measurement, 2 warm-up + 5 timed steps, 1 thread, as the
profile stage does), visiting the configurations round-robin so slow drifts of the machine show up
as spread rather than as a bias of one configuration. Reports per configuration and overall:

- repeat spread of the step-time median: coefficient of variation (std / mean) and max/min - 1;
- the same for peak RSS (the cpu memory target);
- the within-run spread of the timed steps (std / median), for comparison.

    .venv/bin/python bench/bench_noise.py [--repeats 5]
"""
from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from perf4sight.ir.schema import save_description  # noqa: E402
from perf4sight.profiling.backends.base import get_backend  # noqa: E402
from perf4sight.profiling.plan import TestPlan, save_plan  # noqa: E402
from perf4sight.profiling.runner import run_child  # noqa: E402

NETWORKS = ("resnet18", "mobilenet_v2", "squeezenet1_0")
BATCH_SIZES = (4, 16)
INPUT_SHAPE = [3, 64, 64]


def _cv(xs: list[float]) -> float:
    return 100.0 * float(np.std(xs) / np.mean(xs))


def measure(repeats: int, min_timed_s: float = 0.0) -> dict[tuple[str, int], list[dict[str, Any]]]:
    """Results of ``repeats`` fresh-process measurements per configuration, round-robin."""
    from perf4sight.networks.zoo import describe_zoo

    out: dict[tuple[str, int], list[dict[str, Any]]] = {}
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        files = []
        for name in NETWORKS:
            save_description(describe_zoo(name, INPUT_SHAPE), folder / f"{name}.json")
            files.append(f"{name}.json")
        plan = TestPlan(device="noise", networks=files, batch_sizes=list(BATCH_SIZES), threads=1,
                        warmup_steps=2, timed_steps=5, min_timed_s=min_timed_s, output="m.csv")
        plan_path = save_plan(plan, folder / "plan.json")
        backend = get_backend(plan)
        for rep in range(repeats):
            for i, name in enumerate(NETWORKS):
                for bs in BATCH_SIZES:
                    o = run_child(plan, plan_path, i, bs, backend)
                    if o.result.get("status", "ok") != "ok" or "latency_ms_median" not in o.result:
                        why = o.result.get("message", o.result)
                        sys.exit(f"bench_noise: {name} at batch {bs} did not measure: {why}")
                    out.setdefault((name, bs), []).append({**o.result, "peak_rss_mb": o.peak_rss_mb})
            print(f"  round {rep + 1}/{repeats} done", flush=True)
    return out


def run(repeats: int = 5, min_timed_s: float = 0.0) -> list[dict]:
    """Print the spread table; return rows for bench/run_all.py."""
    res = measure(repeats, min_timed_s)
    print(f"\nrepeat noise on this machine: {repeats} fresh-process measurements per configuration (round-robin), "
          f"5 timed steps" + (f" and at least {min_timed_s:g} s of them" if min_timed_s else ""))
    print(f"{'network':14s} {'batch':>5s} {'step ms (mean)':>15s} {'CV %':>6s} {'max/min-1 %':>12s} "
          f"{'RSS CV %':>9s} {'in-run CV %':>12s}")
    lat_cv, lat_span, mem_cv, within = [], [], [], []
    for (name, bs), rs in res.items():
        lat = [float(r["latency_ms_median"]) for r in rs]
        mem = [float(r["peak_rss_mb"]) for r in rs]
        inr = [float(r["latency_ms_std"]) / float(r["latency_ms_median"]) * 100 for r in rs]
        lat_cv.append(_cv(lat))
        lat_span.append(100 * (max(lat) / min(lat) - 1))
        mem_cv.append(_cv(mem))
        within.append(float(np.median(inr)))
        print(f"{name:14s} {bs:5d} {np.mean(lat):15.1f} {lat_cv[-1]:6.1f} {lat_span[-1]:12.1f} {mem_cv[-1]:9.2f} "
              f"{within[-1]:12.1f}")
    b = "noise-local-cpu"
    note = f"{len(res)} configurations x {repeats} fresh processes"
    return [{"benchmark": b, "metric": "latency_repeat_cv_median", "value": round(float(np.median(lat_cv)), 2),
             "unit": "%", "note": note},
            {"benchmark": b, "metric": "latency_repeat_maxmin_median", "value": round(float(np.median(lat_span)), 2),
             "unit": "%", "note": "max/min - 1 of the step-time medians"},
            {"benchmark": b, "metric": "memory_repeat_cv_median", "value": round(float(np.median(mem_cv)), 2),
             "unit": "%", "note": "peak RSS"},
            {"benchmark": b, "metric": "latency_within_run_cv_median", "value": round(float(np.median(within)), 2),
             "unit": "%", "note": "std / median of the timed steps of one run"}]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--min-timed-s", type=float, default=0.0, help="the profile's [profile] min_timed_s")
    args = ap.parse_args()
    run(args.repeats, args.min_timed_s)


if __name__ == "__main__":
    main()
