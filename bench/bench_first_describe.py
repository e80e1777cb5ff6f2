"""Time to a process's first description of a user's own network (``--network FILE.py:FUNCTION``, ``predict_module``).

Usage: python bench/bench_first_describe.py [--repeats 3]

Each network below is described at 3x224x224 in ``--repeats`` fresh processes that import torch but not torchvision,
as the predict stage does for a user's file; each prints the wall time of its first ``describe`` and of a second one
of the same network, and whether the process imported ``torch._dynamo`` (which torch's Python meta kernels import on
their first call, 3-4 s). Medians are printed; wall-clock on a shared CPU is noisy (the load average is printed).
``run()`` returns the same figures as rows for bench/run_all.py.
"""
from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

#: The child: the networks a user writes (a small ResNet of residual adds and functional ReLUs with a pooled linear
#: head; a U-Net of concatenated skips and transposed convolutions; a style-transfer network of reflection pads,
#: instance norms and residual blocks), one described twice per process.
CHILD = r'''
import sys, time
import torch
import torch.nn.functional as F
from torch import nn
from perf4sight.ir.from_torch import describe


class Residual(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.c1, self.b1 = nn.Conv2d(c, c, 3, padding=1, bias=False), nn.BatchNorm2d(c)
        self.c2, self.b2 = nn.Conv2d(c, c, 3, padding=1, bias=False), nn.BatchNorm2d(c)

    def forward(self, x):
        return F.relu(x + self.b2(self.c2(F.relu(self.b1(self.c1(x))))))


class ResNet(nn.Module):
    def __init__(self):
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(3, 32, 3, 2, 1), nn.BatchNorm2d(32), nn.ReLU())
        self.blocks = nn.Sequential(Residual(32), Residual(32))
        self.pool, self.fc = nn.AdaptiveAvgPool2d(1), nn.Linear(32, 10)

    def forward(self, x):
        return self.fc(torch.flatten(self.pool(self.blocks(self.stem(x))), 1))


class UNet(nn.Module):
    def __init__(self):
        super().__init__()
        self.d1, self.d2 = nn.Conv2d(3, 16, 3, padding=1), nn.Conv2d(16, 32, 3, padding=1)
        self.up, self.out = nn.ConvTranspose2d(32, 16, 2, stride=2), nn.Conv2d(32, 2, 1)

    def forward(self, x):
        a = F.relu(self.d1(x))
        b = F.relu(self.d2(F.max_pool2d(a, 2)))
        return self.out(torch.cat([a, self.up(b)], 1))


class Style(nn.Module):
    def __init__(self):
        super().__init__()
        self.pad, self.c1, self.n1 = nn.ReflectionPad2d(4), nn.Conv2d(3, 16, 9), nn.InstanceNorm2d(16, affine=True)
        self.c2, self.n2 = nn.Conv2d(16, 16, 3, padding=1), nn.InstanceNorm2d(16, affine=True)
        self.c3 = nn.Conv2d(16, 3, 3, padding=1)

    def forward(self, x):
        y = F.relu(self.n1(self.c1(self.pad(x))))
        return torch.tanh(self.c3(y + self.n2(self.c2(y))))


net = {"resnet": ResNet, "unet": UNet, "style": Style}[sys.argv[1]]()
times = []
for name in ("first", "second"):
    t = time.perf_counter()
    describe(net, [3, 224, 224], sys.argv[1])
    times.append(time.perf_counter() - t)
print(times[0], times[1], "torch._dynamo" in sys.modules)
'''
NETWORKS = ("resnet", "unet", "style")


def _measure(network: str) -> tuple[float, float, bool]:
    """(first, second describe in s, torch._dynamo imported) of one fresh process."""
    done = subprocess.run([sys.executable, "-c", CHILD, network], capture_output=True, text=True, timeout=600,
                          cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)})
    if done.returncode:
        raise RuntimeError(f"{network}: {done.stderr.strip().splitlines()[-1]}")
    first, second, dynamo = done.stdout.split()
    return float(first), float(second), dynamo == "True"


def run(repeats: int = 3) -> list[dict]:
    rows = []
    print(f"load average {os.getloadavg()[0]:.1f}; {repeats} fresh processes per network; medians")
    print(f"{'network':10s} {'first describe s':>17s} {'second s':>9s}  torch._dynamo imported")
    for network in NETWORKS:
        runs = [_measure(network) for _ in range(repeats)]
        first, second = (statistics.median(r[i] for r in runs) for i in (0, 1))
        dynamo = sum(r[2] for r in runs)
        print(f"{network:10s} {first:17.2f} {second:9.3f}  {dynamo} of {repeats}")
        rows += [{"benchmark": "first_describe", "metric": f"{network}: first description in a process",
                  "value": round(first, 3), "unit": "s", "note": f"median of {repeats}; second {second:.3f} s"}]
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    run(parser.parse_args().repeats)


if __name__ == "__main__":
    main()
