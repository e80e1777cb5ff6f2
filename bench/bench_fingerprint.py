"""Leave-one-network-out accuracy of the fingerprint on the imported Jetson TX2 data.

Trains on 3 of the 4 networks (all their pruned variants) and tests on the 4th, for latency
(``latency_ms_median``, ms) and memory (``device_mem_used_mb``, MiB); prints MAPE per held-out
network beside perf4sight's published figures, plus description->prediction time.

    .venv/bin/python bench/bench_fingerprint.py [--trees 200]
"""
from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from perf4sight.features.aggregate import feature_matrix, network_features  # noqa: E402
from perf4sight.fingerprint.evaluate import grouped_cv  # noqa: E402
from perf4sight.fingerprint.trees import TargetModel  # noqa: E402
from perf4sight.importers import import_perf4sight  # noqa: E402
from perf4sight.ir.schema import load_description  # noqa: E402
from perf4sight.profiling.results import read_rows, results_path  # noqa: E402

TX2 = ROOT.parent / "shared" / "data" / "tx2-perf4sight"
NETS = ("resnet18", "resnet50", "mobilenetv2", "squeezenet")
#: perf4sight (ICCV-W 2021) leave-one-network-out MAPE, percent.
REFERENCE = {"memory": (13.0, 6.2, 6.9, 12.7), "latency": (13.6, 11.1, 37.8, 11.6)}
COLUMN = {"memory": "device_mem_used_mb", "latency": "latency_ms_median"}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--data", type=Path, default=TX2)
    ap.add_argument("--trees", type=int, default=200)
    args = ap.parse_args()
    if not (args.data / "graphs").is_dir():
        sys.exit(f"TX2 data not found at {args.data}")
    with tempfile.TemporaryDirectory() as tmp:
        import_perf4sight(args.data, "tx2", Path(tmp) / "prof", Path(tmp) / "models")
        rows = [r for r in read_rows(results_path(Path(tmp) / "prof", "tx2")) if r["status"] == "ok"]
        descs = {p.stem: load_description(p) for p in (Path(tmp) / "models" / "imported" / "tx2").glob("*.json")}
    feats = {n: network_features(d) for n, d in descs.items()}
    variants = [("analytic only", "extra-trees", False, 1),
                ("analytic x ExtraTrees (default)", "extra-trees", True, 1),
                ("analytic x GradientBoosting", "gradient-boosting", True, 5)]
    for target in ("memory", "latency"):
        rs = [r for r in rows if r[COLUMN[target]]]
        F = feature_matrix([feats[r["network"]] for r in rs], [int(r["batch_size"]) for r in rs])
        y = np.array([float(r[COLUMN[target]]) for r in rs])
        g = np.array([r["family"] for r in rs])
        print(f"\n{target} ({COLUMN[target]}), MAPE % per held-out network, {len(rs)} rows")
        print(f"  {'model':<34}" + "".join(f"{n:>13}" for n in NETS) + f"{'mean':>8}{'±10%':>7}")
        print(f"  {'perf4sight paper (ExtraTrees)':<34}" + "".join(f"{v:>13.1f}" for v in REFERENCE[target])
              + f"{np.mean(REFERENCE[target]):>8.1f}")
        for label, model, correct, leaf in variants:
            t0 = time.perf_counter()
            cv = grouped_cv(F, y, g, "family", lambda a, b, c: TargetModel.fit(
                target, a, b, model, args.trees, leaf, 0, correct).predict(c))
            mapes = [cv.per_group[n]["mape"] for n in NETS]
            print(f"  {label:<34}" + "".join(f"{m:>13.1f}" for m in mapes) + f"{np.mean(mapes):>8.1f}"
                  f"{cv.overall['within10']:>7.1f}   ({time.perf_counter() - t0:.1f} s)")
    # description -> prediction speed with a full-size model
    from perf4sight.config import FingerprintConfig
    from perf4sight.fingerprint import fit_fingerprint, load_fingerprint
    with tempfile.TemporaryDirectory() as tmp:
        import_perf4sight(args.data, "tx2", Path(tmp) / "prof", Path(tmp) / "models")
        all_rows = read_rows(results_path(Path(tmp) / "prof", "tx2"))
        fit_fingerprint(all_rows, descs, "tx2", Path(tmp) / "fp", FingerprintConfig(n_estimators=args.trees))
        fp = load_fingerprint(Path(tmp) / "fp")
        times = []
        for name in sorted(descs):
            t0 = time.perf_counter()
            fp.predict(descs[name], [2, 8, 32, 64])
            times.append(time.perf_counter() - t0)
        print(f"\nprediction (description -> 4 batch sizes, {args.trees} trees): median "
              f"{1e3 * np.median(times):.2f} ms, max {1e3 * max(times):.2f} ms per network")


if __name__ == "__main__":
    main()
