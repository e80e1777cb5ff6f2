"""Does a drift reference help CPU latency fingerprints? The measurement that led to ``[profile] reference_every``.

The profile stage now takes the reference itself (``references.csv``; ``bench_fingerprint.py --csv`` reads it,
``--no-drift-reference`` for the raw figures); this bench keeps its own sweep so that raw and corrected figures come
from one profile of the wide CPU set, paired.

On this VM the machine's speed drifts during a sweep (docs/accuracy-notes.md, "CPU: repeats in fresh
processes"), and a sweep that measures network after network turns a drift into a bias of the family measured while it
lasted. This bench re-profiles the ``bench_cpu_families`` dataset in one sweep (the runner's own
``run_child``: a fresh process per row), measuring a fixed reference configuration (``--reference``
at batch ``--reference-batch``) before the sweep, after every ``--every`` rows and at the end. Each
row's step time is then taken raw and *normalised*: multiplied by the reference's median over the
sweep and divided by the reference interpolated (linearly, in time) at the row. Both are evaluated
held out by torchvision family with ``bench_fingerprint.evaluate``, on the same rows, so the
comparison is paired. Takes about 7 minutes with a kept dataset, 15 without.

    .venv/bin/python bench/bench_drift.py [--dataset DIR] [--every 6] [--trees 100]
"""
from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))
from perf4sight.blas import pin_openblas_kernels  # noqa: E402

pin_openblas_kernels()  # before numpy loads OpenBLAS: the figures reproduce on any x86-64 host
import numpy as np  # noqa: E402

from bench_cpu_families import ZOO, run as make_dataset  # noqa: E402
from bench_fingerprint import evaluate, load_csv  # noqa: E402
from perf4sight.config import load_config  # noqa: E402
from perf4sight.dataset import dataset_descriptions  # noqa: E402
from perf4sight.profiling.backends.base import get_backend  # noqa: E402
from perf4sight.profiling.local import make_plan  # noqa: E402
from perf4sight.profiling.plan import save_plan  # noqa: E402
from perf4sight.profiling.results import batch_size_of  # noqa: E402
from perf4sight.profiling.runner import run_child  # noqa: E402

DEVICE = "cpu-families"


def sweep(dataset: Path, every: int, reference: str, reference_batch: int) -> tuple[list[tuple], np.ndarray]:
    """(rows: (time s, network, batch size, latency ms) of the ok measurements, references: [time s, ms])."""
    cfg = load_config(dataset / "config.toml")
    plan = make_plan(cfg, DEVICE, dataset_descriptions(cfg))
    with tempfile.TemporaryDirectory(prefix="p4s-drift-") as tmp:
        plan_path = save_plan(plan, Path(tmp) / "plan.json")
        backend = get_backend(plan)
        ref = next((i for i, p in enumerate(plan.networks) if Path(p).stem == reference), None)
        if ref is None:
            sys.exit(f"bench_drift: reference network {reference} is not in {dataset}")
        refs: list[tuple[float, float]] = []

        def measure_reference() -> None:
            lat = run_child(plan, plan_path, ref, reference_batch, backend).result.get("latency_ms_median")
            if lat:
                refs.append((time.time(), float(lat)))

        rows: list[tuple] = []
        measured = 0
        measure_reference()
        for i, path in enumerate(plan.networks):
            for bs in plan.batch_sizes:
                res = run_child(plan, plan_path, i, bs, backend).result
                if res.get("status") == "ok" and res.get("latency_ms_median"):
                    rows.append((time.time(), Path(path).stem, bs, float(res["latency_ms_median"])))
                measured += 1
                if measured % every == 0:
                    measure_reference()
        measure_reference()
    return rows, np.array(refs)


def _with_latency(template: list[dict], latency: dict[tuple[str, int], float]) -> list[dict]:
    """The dataset's rows (memory and all) with the step time of this sweep, where it measured one."""
    out = []
    for r in template:
        key = (str(r["network"]), batch_size_of(r))
        if key in latency:
            out.append(dict(r, latency_ms_median=str(latency[key])))
    return out


def run(dataset: str = "", every: int = 6, trees: int = 100, reference: str = "resnet18_l0",
        reference_batch: int = 8) -> list[dict[str, Any]]:
    """Sweep, evaluate raw and normalised step times (see module doc); rows for bench/run_all.py."""
    with tempfile.TemporaryDirectory(prefix="p4s-drift-data-") as scratch:
        folder = Path(dataset or scratch)
        if not (folder / "profiling_csvs" / DEVICE / "measurements.csv").is_file():
            make_dataset(keep=str(folder))  # networks and a first profile (bench_cpu_families)
        rows, refs = sweep(folder, every, reference, reference_batch)
        device, template, descs = load_csv(folder / "profiling_csvs" / DEVICE / "measurements.csv", folder / "models")
    med = float(np.median(refs[:, 1]))
    cv = 100 * refs[:, 1].std() / refs[:, 1].mean()
    print(f"reference {reference} @ {reference_batch}: {len(refs)} measurements, median {med:.1f} ms, "
          f"min {refs[:, 1].min():.1f}, max {refs[:, 1].max():.1f} (CV {cv:.1f}%)")
    raw = {(n, b): lat for _, n, b, lat in rows}
    normalised = {(n, b): lat * med / float(np.interp(t, refs[:, 0], refs[:, 1])) for t, n, b, lat in rows}
    out: list[dict[str, Any]] = []
    for mode, lat in (("raw", raw), ("normalised", normalised)):
        # one seed: raw and normalised are compared on the same trees (docs/accuracy-notes.md's drift figures: seed 0)
        res = evaluate(device, _with_latency(template, lat), descs, trees=trees, held_out=list(ZOO), seeds=(0,))
        per = {f: m["mape"] for f, m in res["ours"]["latency"].items()}
        mean, rs = float(np.mean(list(per.values()))), res["random_split"]["latency"]["mape"]
        print(f"{mode:>10}: held-out latency MAPE " + ", ".join(f"{f} {v:.1f}" for f, v in per.items())
              + f"; mean {mean:.1f}; random split {rs:.1f}", flush=True)
        out += [{"benchmark": "drift-reference", "metric": f"latency_mape_heldout_mean_{mode}", "value": round(mean, 2),
                 "unit": "%", "note": f"reference every {every} rows"},
                {"benchmark": "drift-reference", "metric": f"latency_mape_random_split_{mode}", "value": round(rs, 2),
                 "unit": "%", "note": ""}]
    out.append({"benchmark": "drift-reference", "metric": "reference_cv", "unit": "%", "note": "during the sweep",
                "value": round(100 * float(refs[:, 1].std() / refs[:, 1].mean()), 2)})
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--dataset", default="", help="a bench_cpu_families --keep folder (made there when absent)")
    ap.add_argument("--every", type=int, default=6, help="rows between two reference measurements")
    ap.add_argument("--trees", type=int, default=100)
    ap.add_argument("--reference", default="resnet18_l0")
    ap.add_argument("--reference-batch", type=int, default=8)
    args = ap.parse_args()
    run(args.dataset, args.every, args.trees, args.reference, args.reference_batch)


if __name__ == "__main__":
    main()
