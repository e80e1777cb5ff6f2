"""Where a CPU training step's time goes, by kind of op, per network family; and what pooling's time goes with.

Every network of a dataset (``models/manifest.csv``; by default the first wide set of ``bench_cpu_families``,
described by the networks stage in a scratch folder, nothing profiled) is run in a fresh process, one thread: two
warm-up steps, five timed steps (the step time), then torch.profiler over three more steps. Each aten op's self
time goes into one :data:`CATEGORIES` entry, and a category's time is its share of the profiled self time times
the unprofiled step. Printed: the shares per family at one batch size, and a check of what pooling's time goes
with: a non-negative linear model of the pooling time, fitted on the other families, predicts each held-out
family's pooling time from the pools' window work (output elements times the window, forward and backward: the
pool FLOPs of ``features/formulas.py``) or from the bytes they read and write (docs/accuracy-notes.md, "CPU: where
a step's time goes, by op"). About 5 minutes for 24 networks at three batch sizes.

    .venv/bin/python bench/bench_op_breakdown.py [--dataset DIR] [--batch-sizes 2 8 32]
"""
from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

#: Categories of a step's ops, in print order; :func:`category` says which an aten op falls in.
CATEGORIES = ("conv", "batch norm", "activation", "pooling", "resize", "cat/copy", "linear", "other elementwise",
              "loss", "framework")
_RULES = (  # (category, substrings of the lower-cased aten op name), the first match wins
    ("conv", ("conv",)),
    ("batch norm", ("batch_norm",)),
    ("activation", ("relu", "threshold", "hardtanh", "clamp", "sigmoid", "hardswish", "silu", "gelu", "tanh")),
    ("pooling", ("pool",)),
    ("resize", ("upsample",)),
    ("cat/copy", ("cat", "copy_", "slice", "narrow", "split", "stack", "transpose", "clone", "contiguous")),
    ("linear", ("addmm", "aten::mm", "aten::linear", "matmul")),
    ("loss", ("softmax", "nll_loss", "cross_entropy")),
    ("other elementwise", ("add", "mul", "fill", "zero", "div", "sub", "_foreach", "lerp")),
)


def category(op: str) -> str:
    """The :data:`CATEGORIES` entry of a profiler event name (anything not an aten op is the framework's)."""
    name = op.lower()
    if not name.startswith("aten::"):
        return "framework"
    return next((cat for cat, keys in _RULES if any(k in name for k in keys)), "framework")


def _child(path: str, batch_sizes: list[int]) -> None:
    """In a fresh process: per batch size, the step time (ms, median of five) and each op's self time (ms per
    step, mean over three profiled steps); one JSON list on stdout."""
    import time

    import torch
    import torch.nn.functional as F
    from torch.profiler import ProfilerActivity, profile, schedule

    from perf4sight.ir.schema import load_description
    from perf4sight.ir.to_torch import build_module

    torch.set_num_threads(1)
    desc = load_description(path)
    torch.manual_seed(0)
    model = build_module(desc).train()
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    out = []
    for bs in batch_sizes:
        x, y = torch.randn(bs, *desc.input_shape), torch.randint(0, desc.num_classes, [bs] + desc.label_shape)

        def step() -> None:
            opt.zero_grad(set_to_none=True)
            F.cross_entropy(model(x), y).backward()
            opt.step()

        for _ in range(2):
            step()
        times = []
        for _ in range(5):
            t0 = time.perf_counter()
            step()
            times.append((time.perf_counter() - t0) * 1e3)
        got: dict[str, Any] = {}
        with profile(activities=[ProfilerActivity.CPU], schedule=schedule(wait=0, warmup=2, active=3, repeat=1),
                     on_trace_ready=lambda p: got.update(events=p.key_averages())) as prof:
            for _ in range(5):
                step()
                prof.step()
        ops = {e.key: e.self_cpu_time_total / 3 / 1e3 for e in got["events"] if not e.key.startswith("ProfilerStep")}
        out.append({"batch_size": bs, "step_ms": sorted(times)[2], "ops": ops})
    print(json.dumps(out))


def profile_networks(models: Path, nets: list[dict[str, str]], batch_sizes: list[int]) -> list[dict[str, Any]]:
    """One record per (network of ``nets``, batch size): network, family, batch_size, step_ms, per-category ms
    (summing to the step), the profiled self time over the step (``profiled_over_step``)."""
    records = []
    for i, net in enumerate(nets, 1):
        proc = subprocess.run([sys.executable, __file__, "--child", str(models / net["path"]),
                               *map(str, batch_sizes)], capture_output=True, text=True)
        if proc.returncode != 0:
            sys.exit(f"bench_op_breakdown: {net['network']} failed: {proc.stderr.strip().splitlines()[-1:]}")
        for r in json.loads(proc.stdout.strip().splitlines()[-1]):
            cats = dict.fromkeys(CATEGORIES, 0.0)
            for op, ms in r["ops"].items():
                cats[category(op)] += ms
            total = sum(cats.values())
            records.append({"network": net["network"], "family": net["family"], "batch_size": r["batch_size"],
                            "step_ms": r["step_ms"], "profiled_over_step": total / r["step_ms"],
                            "ms": {c: v / total * r["step_ms"] for c, v in cats.items()}})
        print(f"  {i}/{len(nets)} {net['network']}", flush=True)
    return records


def pool_features(models: Path, nets: list[dict[str, str]]) -> dict[str, tuple[float, float, float]]:
    """Per network of ``nets``, per sample: the pools' window work (elements), their bytes read and written, and their
    count."""
    from perf4sight.features.walk import walk
    from perf4sight.ir.schema import load_description

    out = {}
    for net in nets:
        desc = load_description(models / net["path"])
        pools = [v.cost for v in walk(desc) if v.cost is not None and v.cost.kind == "pool"]
        out[net["network"]] = (sum(c.flops_fwd + c.flops_bwd for c in pools),
                     sum(c.bytes_read + c.bytes_written for c in pools), float(len(pools)))
    return out


def pool_check(records: list[dict[str, Any]], feats: dict[str, tuple[float, float, float]]) -> dict[str, dict]:
    """Per family whose pooling is at least 3% of its step: the pooling time predicted over measured, with the
    window work and with the bytes as the per-sample term (fitted on the other families, relative to the step)."""
    import numpy as np
    from scipy.optimize import nnls

    def design(rs: list[dict[str, Any]], col: int) -> np.ndarray:
        return np.array([[feats[r["network"]][col] * r["batch_size"], feats[r["network"]][2]] for r in rs])

    out: dict[str, dict] = {}
    for fam in sorted({r["family"] for r in records}):
        test = [r for r in records if r["family"] == fam]
        if sum(r["ms"]["pooling"] for r in test) < 0.03 * sum(r["step_ms"] for r in test):
            continue
        train = [r for r in records if r["family"] != fam]
        w = 1.0 / np.array([r["step_ms"] for r in train])
        y = np.array([r["ms"]["pooling"] for r in train])
        measured = sum(r["ms"]["pooling"] for r in test)
        out[fam] = {}
        for label, col in (("window work", 0), ("bytes", 1)):
            a = design(train, col) * w[:, None]
            scale = np.maximum(np.abs(a).max(axis=0), 1e-12)
            coef = nnls(a / scale, y * w)[0] / scale
            out[fam][label] = float((design(test, col) @ coef).sum() / measured)
    return out


def _dataset(folder: Path) -> Path:
    """The first wide set's networks (bench_cpu_families' config), described by the networks stage in ``folder``."""
    from bench_cpu_families import _stage, write_config

    _stage(write_config(folder), "networks")
    return folder / "models"


def run(dataset: str = "", batch_sizes: tuple[int, ...] = (2, 8, 32)) -> list[dict[str, Any]]:
    """Profile, print the tables (see module doc); rows for bench/run_all.py."""
    import numpy as np

    from perf4sight.dataset import read_manifest

    with tempfile.TemporaryDirectory(prefix="p4s-ops-") as scratch:
        models = Path(dataset) / "models" if dataset else _dataset(Path(scratch))
        nets = read_manifest(models / "manifest.csv")  # network, family, path relative to models, ...
        if not nets:
            sys.exit(f"bench_op_breakdown: no networks in {models / 'manifest.csv'} (missing or empty)")
        records = profile_networks(models, nets, list(batch_sizes))
        checks = pool_check(records, pool_features(models, nets))
    shown = sorted(batch_sizes)[len(batch_sizes) // 2]
    print(f"\nshare of the step by kind of op, % (batch {shown}; profiled self time over the step: "
          f"{np.percentile([r['profiled_over_step'] for r in records], 10):.2f}-"
          f"{np.percentile([r['profiled_over_step'] for r in records], 90):.2f}, 10th-90th percentile)")
    print(f"  {'family':44s}" + "".join(f"{c[:10]:>11s}" for c in CATEGORIES))
    rows: list[dict[str, Any]] = []
    for fam in sorted({r["family"] for r in records}):
        rs = [r for r in records if r["family"] == fam and r["batch_size"] == shown]
        share = {c: 100 * float(np.mean([r["ms"][c] / r["step_ms"] for r in rs])) for c in CATEGORIES}
        print(f"  {fam[:44]:44s}" + "".join(f"{share[c]:11.1f}" for c in CATEGORIES))
        if not fam.startswith("gen"):
            rows += [{"benchmark": "op-breakdown", "metric": f"{c}_share_{fam}", "value": round(share[c], 1),
                      "unit": "%", "note": f"batch {shown}, one thread"} for c in ("conv", "pooling")]
    print("\npooling time predicted / measured for a held-out family (fitted on the others), by the per-sample term:")
    for fam, ratio in checks.items():
        print(f"  {fam[:44]:44s} window work {ratio['window work']:.2f}   bytes {ratio['bytes']:.2f}")
    for label in ("window work", "bytes"):
        err = [abs(r[label] - 1) * 100 for r in checks.values()]
        rows.append({"benchmark": "op-breakdown", "metric": f"pool_time_error_by_{label.replace(' ', '_')}",
                     "value": round(float(np.mean(err)), 1) if err else float("nan"), "unit": "%",
                     "note": f"mean |predicted/measured - 1| over {len(err)} held-out families with pools"})
    return rows


def main() -> None:
    if sys.argv[1:2] == ["--child"]:
        _child(sys.argv[2], [int(b) for b in sys.argv[3:]])
        return
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--dataset", default="", help="a folder holding models/manifest.csv (default: the first wide set, "
                                                  "described anew in a scratch folder)")
    ap.add_argument("--batch-sizes", type=int, nargs="+", default=[2, 8, 32])
    args = ap.parse_args()
    run(args.dataset, tuple(args.batch_sizes))


if __name__ == "__main__":
    main()
