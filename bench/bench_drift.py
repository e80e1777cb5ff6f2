"""Does a drift reference help CPU latency fingerprints? The paired measurement of ``[profile] reference_every``.

On this VM the machine's speed drifts during a sweep (docs/accuracy-notes.md, "CPU: repeats in fresh
processes"), and a sweep that measures network after network turns a drift into a bias of the family measured while it
lasted. This bench profiles the ``bench_cpu_families`` dataset again, in one sweep of the profile stage itself
with a drift reference (``--reference`` at batch ``--reference-batch``, every ``--every`` measurements, into a
scratch profiling folder), then evaluates the same rows held out by torchvision family with
``bench_fingerprint.evaluate`` twice: step times as measured, and corrected by the reference as the fingerprint
stage corrects them (``fingerprint/drift.py``). Takes about 8 minutes with a kept dataset, 16 without.

    .venv/bin/python bench/bench_drift.py [--dataset DIR] [--every 6] [--trees 100]
"""
from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))
from perf4sight.blas import pin_kernels  # noqa: E402

pin_kernels()  # before numpy loads (and OpenBLAS): the figures reproduce on any x86-64 host
import numpy as np  # noqa: E402

from bench_cpu_families import run as make_dataset  # noqa: E402
from bench_fingerprint import evaluate, load_csv  # noqa: E402
from perf4sight.config import load_config  # noqa: E402
from perf4sight.dataset import dataset_descriptions  # noqa: E402
from perf4sight.fingerprint.drift import drift_line, normalise_step_times  # noqa: E402
from perf4sight.fingerprint.fit import LATENCY_COLUMN  # noqa: E402
from perf4sight.profiling.local import profile_local  # noqa: E402
from perf4sight.profiling.results import read_rows, references_path, results_path  # noqa: E402

DEVICE = "cpu-families"


def sweep(dataset: Path, profiling_dir: Path, every: int, reference: str, reference_batch: int
          ) -> tuple[Path, list[dict]]:
    """Profile ``dataset``'s networks anew into ``profiling_dir`` with a drift reference; (the measurements CSV,
    the reference's rows)."""
    cfg = load_config(dataset / "config.toml")
    cfg.project.profiling_dir = str(profiling_dir)
    cfg.profile.reference_every, cfg.profile.reference_network = every, reference
    cfg.profile.reference_batch_size = reference_batch
    profile_local(cfg, DEVICE, dataset_descriptions(cfg), progress=False)
    return results_path(profiling_dir, DEVICE), read_rows(references_path(profiling_dir, DEVICE))


def held_out_families(dataset: Path) -> list[str]:
    """The torchvision families ``dataset`` was made with (its config's ``[networks] zoo``: ``bench_cpu_families
    --zoo``), each held out in turn. The first wide set's six were held out whatever the folder, so a set made
    with other families stopped on an empty fold."""
    return list(load_config(dataset / "config.toml").networks.zoo)


def run(dataset: str = "", every: int = 6, trees: int = 100, reference: str = "resnet18_l0",
        reference_batch: int = 8) -> list[dict[str, Any]]:
    """Sweep, evaluate raw and corrected step times (see module doc); rows for bench/run_all.py."""
    with tempfile.TemporaryDirectory(prefix="p4s-drift-data-") as scratch:
        folder = Path(dataset or scratch)
        if not (folder / "profiling_csvs" / DEVICE / "measurements.csv").is_file():
            make_dataset(keep=str(folder))  # networks and a first profile (bench_cpu_families)
        with tempfile.TemporaryDirectory(prefix="p4s-drift-sweep-") as sweep_dir:
            csv, refs = sweep(folder, Path(sweep_dir), every, reference, reference_batch)
            device, raw, descs = load_csv(csv, folder / "models")
            zoo = held_out_families(folder)
    corrected, drift = normalise_step_times(raw, refs, LATENCY_COLUMN)
    print(drift_line(drift))
    out: list[dict[str, Any]] = []
    for mode, rows in (("raw", raw), ("normalised", corrected)):
        # one seed: raw and corrected are compared on the same trees (docs/accuracy-notes.md's drift figures: seed 0)
        res = evaluate(device, rows, descs, trees=trees, held_out=zoo, seeds=(0,))
        per = {f: m["mape"] for f, m in res["ours"]["latency"].items()}
        mean, rs = float(np.mean(list(per.values()))), res["random_split"]["latency"]["mape"]
        print(f"{mode:>10}: held-out latency MAPE " + ", ".join(f"{f} {v:.1f}" for f, v in per.items())
              + f"; mean {mean:.1f}; random split {rs:.1f}", flush=True)
        out += [{"benchmark": "drift-reference", "metric": f"latency_mape_heldout_mean_{mode}", "value": round(mean, 2),
                 "unit": "%", "note": f"reference every {every} rows"},
                {"benchmark": "drift-reference", "metric": f"latency_mape_random_split_{mode}", "value": round(rs, 2),
                 "unit": "%", "note": ""}]
    out.append({"benchmark": "drift-reference", "metric": "reference_cv", "unit": "%", "note": "during the sweep",
                "value": drift.get("cv_pct")})
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
