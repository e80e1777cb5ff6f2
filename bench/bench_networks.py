"""Speed of the networks stage: prune each zoo network at 19 levels, generate 1,000 networks.

Usage: python bench/bench_networks.py [--input 3 224 224] [--strategy l1-norm]
       [--networks resnet18 vgg16 ...] [--count 1000]
Prints, per network: seconds for all levels (prune + describe), seconds per level, and the
largest gap between target and achieved level; then the generator's time for ``--count``
networks and the spread of their forward FLOPs and parameters. Timings are wall-clock on
this machine (noisy on a shared CPU).
"""
from __future__ import annotations

import argparse
import sys
import time
import warnings
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from perf4sight.networks.build import Source, prune_source  # noqa: E402
from perf4sight.networks.generator import GeneratorSettings, forward_flops, generate  # noqa: E402
from perf4sight.networks.zoo import build_zoo_model  # noqa: E402

NETWORKS = ["alexnet", "vgg11", "vgg16", "resnet18", "resnet50", "mobilenet_v2", "mnasnet1_0", "squeezenet1_0",
            "googlenet", "densenet121", "shufflenet_v2_x1_0", "efficientnet_b0"]
LEVELS = [float(x) for x in range(0, 95, 5)]  # 0..90, 19 levels


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--input", type=int, nargs=3, default=[3, 224, 224], metavar=("C", "H", "W"))
    ap.add_argument("--strategy", default="l1-norm")
    ap.add_argument("--networks", nargs="*", default=NETWORKS)
    ap.add_argument("--count", type=int, default=1000)
    args = ap.parse_args()
    warnings.filterwarnings("ignore")
    shape = list(args.input)
    print(f"pruning: strategy {args.strategy}, {len(LEVELS)} levels 0..90, input {'x'.join(map(str, shape))}")
    print(f"{'network':20s} {'params':>12s} {'total s':>8s} {'s/level':>8s} {'max |gap| pp':>13s}")
    for name in args.networks:
        src = Source(name, f"torchvision:{name}", lambda n=name: build_zoo_model(n))
        t0 = time.perf_counter()
        descs = prune_source(src, shape, LEVELS, args.strategy, 4, 0)
        total = time.perf_counter() - t0
        gap = max(abs(d.pruning_level - d.extra["target_level"]) for d in descs)
        print(f"{name:20s} {descs[0].params:12,d} {total:8.1f} {total / len(LEVELS):8.2f} {gap:13.2f}", flush=True)
    if args.count:
        t0 = time.perf_counter()
        nets = generate(GeneratorSettings(count=args.count, seed=0), [3, 224, 224])
        took = time.perf_counter() - t0
        gflops = np.array([forward_flops(d) / 1e9 for d in nets])
        params = np.array([d.params / 1e6 for d in nets])
        q = [0, 5, 50, 95, 100]
        print(f"generator: {len(nets)} networks at 3x224x224 in {took:.2f} s ({1e3 * took / len(nets):.2f} ms each)")
        print("  forward GFLOPs (2 per MAC) percentiles 0/5/50/95/100: "
              + " / ".join(f"{v:.3g}" for v in np.percentile(gflops, q)))
        print("  parameters (M) percentiles 0/5/50/95/100: " + " / ".join(f"{v:.3g}" for v in np.percentile(params, q)))
        styles = {}
        for d in nets:
            for s in d.extra["styles"]:
                styles[s] = styles.get(s, 0) + 1
        print("  stage styles: " + ", ".join(f"{k} {v}" for k, v in sorted(styles.items())))


if __name__ == "__main__":
    main()
