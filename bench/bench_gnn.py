"""GNN versus trees on the imported Jetson TX2 data, leave-one-network-out.

For each GNN architecture (``seernet``, ``sage``): MAPE per held-out network for latency
(``latency_ms_median``, ms) and memory (``device_mem_used_mb``, MiB) of the GNN, the trees
(default fingerprint settings) and their geometric-mean ensemble, all on the same folds; the GNN's
training time (the final model, and the cross-validation); and prediction time: graph extraction
(torch module -> description -> graph tensors) and one prediction, in milliseconds.

    .venv/bin/python bench/bench_gnn.py [--arch seernet sage] [--epochs 300] [--base analytic|none] [--seed 0]
        [--data DIR]
"""
from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
import warnings
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from perf4sight.blas import pin_kernels  # noqa: E402

pin_kernels()  # before numpy loads (and OpenBLAS): the figures reproduce on any x86-64 host
import numpy as np  # noqa: E402

warnings.filterwarnings("ignore", category=FutureWarning)

from perf4sight.fingerprint.gnn import PREDICTORS, fit_gnn, load_gnn  # noqa: E402
from perf4sight.fingerprint.gnn_graph import graph_template  # noqa: E402
from perf4sight.importers import import_perf4sight  # noqa: E402
from perf4sight.ir.schema import load_description  # noqa: E402
from perf4sight.profiling.results import read_rows, results_path  # noqa: E402

#: the shared TX2 folder beside the checkout (PERF4SIGHT_TX2_DATA, as for the tests, where it is elsewhere)
TX2 = Path(os.environ.get("PERF4SIGHT_TX2_DATA", ROOT.parent / "shared" / "data" / "tx2-perf4sight"))
NETS = ("resnet18", "resnet50", "mobilenetv2", "squeezenet")
BENCH = "gnn_tx2"


def _load(data: Path, tmp: Path) -> tuple[list[dict[str, str]], dict[str, Any]]:
    import_perf4sight(data, "tx2", tmp / "prof", tmp / "models")
    rows = read_rows(results_path(tmp / "prof", "tx2"))
    descs = {p.stem: load_description(p) for p in (tmp / "models" / "imported" / "tx2").glob("*.json")}
    return rows, descs


def _timing(folder: Path, descs: dict[str, Any]) -> list[dict[str, Any]]:
    """Extraction and prediction times (ms) on this machine's CPU."""
    import torch

    from perf4sight.ir.from_torch import describe
    from perf4sight.networks.zoo import build_zoo_model
    gnn = load_gnn(folder)
    out = []
    ext, pred, desc_t = [], [], []
    for name in ("resnet18", "resnet50", "mobilenet_v2"):
        model = build_zoo_model(name)
        t0 = time.perf_counter()
        d = describe(model, input_shape=[3, 224, 224], name=name)
        t1 = time.perf_counter()
        graph_template(d)
        t2 = time.perf_counter()
        desc_t.append(1e3 * (t1 - t0))
        ext.append(1e3 * (t2 - t1))
    torch.set_num_threads(1)
    for name in sorted(descs):
        gnn.predict(descs[name], [8])  # warm
        t0 = time.perf_counter()
        gnn.predict(descs[name], [8])
        pred.append(1e3 * (time.perf_counter() - t0))
    many = list(descs.values())
    t0 = time.perf_counter()
    gnn.predict(many, [2, 8, 32, 64])
    per = 1e3 * (time.perf_counter() - t0) / (4 * len(many))
    print("\nprediction time (CPU, 1 thread): "
          f"torch module -> description (fx trace) median {np.median(desc_t):.0f} ms; "
          f"description -> graph tensors median {np.median(ext):.1f} ms; one network at one batch size, "
          f"graph tensors + GNN, median {np.median(pred):.1f} ms; batched over {len(many)} networks x 4 batch sizes "
          f"{per:.2f} ms per prediction (PerfSeer: ~248 ms extraction, ~2 ms per prediction)")
    out.append({"benchmark": BENCH, "metric": "describe_ms", "value": float(np.median(desc_t)), "unit": "ms",
                "note": "torch.fx trace of resnet18/resnet50/mobilenet_v2 at 3x224x224, median"})
    out.append({"benchmark": BENCH, "metric": "graph_tensors_ms", "value": float(np.median(ext)), "unit": "ms",
                "note": "description -> GNN node/edge tensors, median of the three"})
    out.append({"benchmark": BENCH, "metric": "predict_one_ms", "value": float(np.median(pred)), "unit": "ms",
                "note": "one TX2 network at one batch size incl. graph tensors, median"})
    out.append({"benchmark": BENCH, "metric": "predict_batched_ms", "value": per, "unit": "ms",
                "note": f"per (network, batch) prediction, {len(many)} networks x 4 batch sizes in one call"})
    return out


def run(archs: tuple[str, ...] = ("seernet", "sage"), epochs: int = 300, data: Path = TX2,
        base: str = "analytic", seed: int = 0) -> list[dict[str, Any]]:
    """Fit and evaluate each architecture; print tables; return figures for bench/run_all.py."""
    if not (data / "graphs").is_dir():
        print(f"TX2 data not found at {data} (--data DIR, or PERF4SIGHT_TX2_DATA): skipped")
        return []
    results: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory() as tmpdir:
        tmp = Path(tmpdir)
        rows, descs = _load(data, tmp)
        last = None
        for arch in archs:
            folder = tmp / f"fp_{arch}"
            meta = fit_gnn(rows, descs, "tx2", folder, seed=seed, arch=arch, max_epochs=epochs, base=base)
            tr = meta["training"]
            print(f"\n[{arch}, base {base}, seed {seed}] final model: {tr['seconds']:.0f} s "
                  f"({tr['epochs']} epochs, best {tr['best_epoch']}); "
                  f"cross-validation (4 more models): {tr['cv_seconds']:.0f} s; {meta['training_rows']} rows")
            for target in ("latency", "memory"):
                acc = meta["accuracy"][target]
                print(f"  {target} ({meta['targets'][target]['column']}) MAPE % per held-out network "
                      f"(best overall: {acc['best']})")
                header = "".join(f"{n:>13}" for n in NETS)
                print(f"    {'predictor':<10}" + header + f"{'mean':>8}{'all':>8}{'±10%':>7}")
                for k in PREDICTORS:
                    per = [acc[k]["per_group"][n]["mape"] for n in NETS]
                    print(f"    {k:<10}" + "".join(f"{m:>13.1f}" for m in per) + f"{np.mean(per):>8.1f}"
                          f"{acc[k]['overall']['mape']:>8.1f}{acc[k]['overall']['within10']:>7.1f}")
                    if k == "trees" and arch != archs[0]:
                        continue
                    label = k if k == "trees" else f"{k}_{arch}_{base}"
                    results.append({"benchmark": BENCH, "metric": f"{target}_mape_{label}",
                                    "value": float(np.mean(per)),
                                    "unit": "%", "note": "mean over the 4 held-out networks: "
                                    + ", ".join(f"{n} {m:.1f}" for n, m in zip(NETS, per))})
            note = f"final model on {meta['training_rows']} rows, CPU, 1 thread; CV took {tr['cv_seconds']:.0f} s"
            results.append({"benchmark": BENCH, "metric": f"train_s_{arch}", "value": float(tr["seconds"]),
                            "unit": "s", "note": note})
            last = folder
        if last is not None:
            results += _timing(last, descs)
    return results


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--arch", nargs="+", default=["seernet", "sage"], choices=["seernet", "sage"])
    ap.add_argument("--epochs", type=int, default=300)
    ap.add_argument("--data", type=Path, default=TX2)
    ap.add_argument("--base", default="analytic", choices=["analytic", "none"])
    ap.add_argument("--seed", type=int, default=0,
                    help="the GNN's seed (its weights' initialisation and batches) and the trees' compared")
    args = ap.parse_args()
    run(tuple(args.arch), args.epochs, args.data, args.base, args.seed)


if __name__ == "__main__":
    main()
