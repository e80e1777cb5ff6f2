"""Speed of the networks stage: prune each zoo network at 19 levels, generate 1,000 networks.

Usage: python bench/bench_networks.py [--input 3 224 224] [--strategy l1-norm]
       [--networks resnet18 vgg16 ...] [--count 1000]
Prints, per network: seconds for all levels (trace once + prune + describe), seconds per
level, and the largest gap between target and achieved level; then the generator's time for
``--count`` networks and the spread of their forward FLOPs and parameters. Timings are
wall-clock on this machine (noisy on a shared CPU; the load average is printed). ``run()``
returns the same figures as rows for bench/run_all.py.
"""
from __future__ import annotations

import argparse
import os
import sys
import time
import warnings
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from perf4sight.ir.shapes import shape_text  # noqa: E402
from perf4sight.networks.build import Source, prune_source  # noqa: E402
from perf4sight.networks.generator import GeneratorSettings, forward_flops, generate  # noqa: E402
from perf4sight.networks.zoo import build_zoo_model  # noqa: E402

NETWORKS = ["alexnet", "vgg11", "vgg16", "resnet18", "resnet50", "mobilenet_v2", "mnasnet1_0", "squeezenet1_0",
            "googlenet", "densenet121", "shufflenet_v2_x1_0", "efficientnet_b0"]
LEVELS = [float(x) for x in range(0, 95, 5)]  # 0..90, 19 levels


def run(networks: list[str] | None = None, shape: list[int] | None = None, strategy: str = "l1-norm",
        count: int = 1000) -> list[dict]:
    """Prune ``networks`` at 19 levels and generate ``count`` networks; print the table, return rows."""
    warnings.filterwarnings("ignore")
    shape = shape or [3, 224, 224]
    size = shape_text(shape)
    rows: list[dict] = []

    def row(metric: str, value: float, unit: str, note: str) -> None:
        rows.append({"benchmark": "networks", "metric": metric, "value": round(float(value), 4), "unit": unit,
                     "note": note})
    load = os.getloadavg()[0]
    print(f"pruning: strategy {strategy}, {len(LEVELS)} levels 0..90, input {size}, load average {load:.2f}")
    print(f"{'network':20s} {'params':>12s} {'total s':>8s} {'s/level':>8s} {'max |gap| pp':>13s}")
    worst = 0.0
    for name in networks if networks is not None else NETWORKS:
        src = Source(name, f"torchvision:{name}", lambda n=name: build_zoo_model(n))
        t0 = time.perf_counter()
        descs = prune_source(src, shape, LEVELS, strategy, 4, 0)
        total = time.perf_counter() - t0
        gap = max(abs(d.pruning_level - d.extra["target_level"]) for d in descs)
        worst = max(worst, gap)
        print(f"{name:20s} {descs[0].params:12,d} {total:8.1f} {total / len(LEVELS):8.2f} {gap:13.2f}", flush=True)
        row(f"prune {name} ({len(LEVELS)} levels)", total, "s", f"{strategy}, {size}, incl. describe; load {load:.1f}")
    row("largest |achieved - target| level", worst, "pp", f"all networks, {len(LEVELS)} levels 0..90")
    if count:
        t0 = time.perf_counter()
        nets = generate(GeneratorSettings(count=count, seed=0), shape)
        took = time.perf_counter() - t0
        gflops = np.array([forward_flops(d) / 1e9 for d in nets])
        params = np.array([d.params / 1e6 for d in nets])
        q = [0, 5, 50, 95, 100]
        print(f"generator: {len(nets)} networks at {size} in {took:.2f} s ({1e3 * took / len(nets):.2f} ms each)")
        print("  forward GFLOPs (2 per MAC) percentiles 0/5/50/95/100: "
              + " / ".join(f"{v:.3g}" for v in np.percentile(gflops, q)))
        print("  parameters (M) percentiles 0/5/50/95/100: " + " / ".join(f"{v:.3g}" for v in np.percentile(params, q)))
        styles: dict[str, int] = {}
        for d in nets:
            for s in d.extra["styles"]:
                styles[s] = styles.get(s, 0) + 1
        print("  stage styles: " + ", ".join(f"{k} {v}" for k, v in sorted(styles.items())))
        row(f"generate {count} networks", took, "s", f"seed 0, {size}")
        row("generated forward GFLOPs, min", gflops.min(), "GFLOP", "2 FLOPs per MAC")
        row("generated forward GFLOPs, max", gflops.max(), "GFLOP", "2 FLOPs per MAC")
    print(f"load average after: {os.getloadavg()[0]:.2f}")
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--input", type=int, nargs=3, default=[3, 224, 224], metavar=("C", "H", "W"))
    ap.add_argument("--strategy", default="l1-norm")
    ap.add_argument("--networks", nargs="*", default=NETWORKS)
    ap.add_argument("--count", type=int, default=1000)
    args = ap.parse_args()
    run(args.networks, list(args.input), args.strategy, args.count)


if __name__ == "__main__":
    main()
