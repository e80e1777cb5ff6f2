"""How long one profiling measurement takes on this machine, and where the time goes.

Runs the real runner (``python -m perf4sight.profiling.runner``) on a tiny network at batch 1
(warm-up 2, timed 5 steps, the config defaults) ``--repeats`` times, and times the pieces of
a child's life separately: bare interpreter start, ``import torch``, and the child doing the
whole measurement. Also checks that the runner's ``os.wait4`` peak RSS matches the child's own
``VmHWM``. Prints figures; asserts nothing.

    .venv/bin/python bench/profiling_overhead.py [--repeats 5]
"""
from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import torch.nn as nn  # noqa: E402

from perf4sight.ir.from_torch import describe  # noqa: E402
from perf4sight.ir.schema import save_description  # noqa: E402
from perf4sight.profiling import results  # noqa: E402
from perf4sight.profiling.backends.base import get_backend  # noqa: E402
from perf4sight.profiling.plan import TestPlan, save_plan  # noqa: E402


def wall(cmd: list[str], repeats: int) -> list[float]:
    out = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        subprocess.run(cmd, cwd=ROOT, check=True, capture_output=True)
        out.append(time.perf_counter() - t0)
    return out


def fmt(xs: list[float]) -> str:
    return f"median {statistics.median(xs):.2f} s (min {min(xs):.2f}, max {max(xs):.2f}, n={len(xs)})"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=5)
    args = ap.parse_args()
    py = sys.executable
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        net = nn.Sequential(nn.Conv2d(3, 16, 3, padding=1), nn.BatchNorm2d(16), nn.ReLU(), nn.AdaptiveAvgPool2d(1),
                            nn.Flatten(), nn.Linear(16, 10))
        save_description(describe(net, [3, 32, 32], "bench_tiny"), folder / "bench_tiny.json")
        sizes = list(range(1, args.repeats + 1))  # distinct keys: every batch size is a fresh measurement
        plan = TestPlan(device="bench", networks=["bench_tiny.json"], batch_sizes=sizes, threads=1, output="m.csv")
        plan_path = save_plan(plan, folder / "plan.json")

        print(f"python start        : {fmt(wall([py, '-c', 'pass'], args.repeats))}")
        print(f"python + import torch: {fmt(wall([py, '-c', 'import torch'], args.repeats))}")
        t0 = time.perf_counter()
        out = subprocess.run([py, "-m", "perf4sight.profiling.runner", str(plan_path)], cwd=ROOT, check=True,
                             capture_output=True, text=True)
        total = time.perf_counter() - t0
        rows = [json.loads(line) for line in out.stdout.splitlines() if line.startswith('{"event":"row"')]
        print(f"one measurement (runner's wall per child): {fmt([r['wall_s'] for r in rows])}")
        print(f"whole runner for {len(rows)} measurements: {total:.2f} s ({total / len(rows):.2f} s each)")
        csv_rows = results.read_rows(folder / "m.csv")
        print("step latency ms (median of 5):", [r["latency_ms_median"] for r in csv_rows])

        # peak RSS from os.wait4 vs the child's own high-water mark
        from perf4sight.profiling.runner import run_child

        o = run_child(plan, plan_path, 0, 1, get_backend(plan))
        print(f"peak RSS: wait4 {o.peak_rss_mb:.1f} MiB, child VmHWM {o.result['child_hwm_mb']:.1f} MiB, "
              f"baseline {o.result['baseline_rss_mb']:.1f} MiB (this process holds torch: wait4 may show its RSS)")


if __name__ == "__main__":
    main()
