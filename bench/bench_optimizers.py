"""The measured step's optimiser on this machine's CPU: what Adam costs over SGD, and what a fingerprint of
the wrong optimiser's step would predict.

With the tool's own stages, in a temporary folder: the default config's networks (three torchvision families at
three pruning levels, six generated networks, 3x64x64) profiled on the ``cpu`` backend (one thread, no memory
limit, batch sizes 2, 8 and 32) once with each optimiser of ``--optimizers`` (``[profile] optimizer``), all into
one CSV; then a fingerprint of each optimiser's rows. Prints, per optimiser against the first:

- the median ratio of step time and of peak RSS over the configurations both measured;
- each fingerprint's held-out accuracy (its metadata: leave one family out, nested);
- the first optimiser's fingerprint predicting the other's rows: MAPE and mean signed error. It has seen every
  network (it trained on them), only with the other optimiser, so this is the error of predicting the
  other step from it; then the same fingerprint given the features of the other's step (its state and update
  passes), which its models were not fitted on.

    .venv/bin/python bench/bench_optimizers.py [--optimizers sgd adam] [--keep DIR]

Takes about 5 minutes per optimiser on 2 cores.
"""
from __future__ import annotations

import argparse
import json
import re
import sys
import tempfile
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

from _stages import run_stage  # noqa: E402
from perf4sight.profiling.plan import training_phase  # noqa: E402
from perf4sight.profiling.results import batch_size_of, number, phase_of, read_rows  # noqa: E402

DEVICE = "cpu-optimizers"


def write_config(folder: Path, optimizer: str) -> Path:
    """The default config with this bench's profile settings and ``optimizer``; a fingerprint folder of its own."""
    text = (ROOT / "config.toml").read_text()
    text = re.sub(r"(?m)^batch_sizes = \[1, 2, 4, 8, 16, 32\].*$", "batch_sizes = [2, 8, 32]", text)
    text = re.sub(r'(?m)^optimizer = "sgd".*$', f'optimizer = "{optimizer}"', text)
    text = re.sub(r'(?m)^fingerprint_dir = "fingerprinting".*$', f'fingerprint_dir = "fingerprinting-{optimizer}"',
                  text)
    text = re.sub(r"(?m)^\[devices\.local\]$", f"[devices.{DEVICE}]", text)
    text = re.sub(r"(?m)^memory_limit_mb = 900 .*$", "memory_limit_mb = 0", text)
    config = folder / f"config-{optimizer}.toml"
    config.write_text(text)
    return config


def _by_key(rows: list[dict], phase: str) -> dict[tuple[str, int], dict]:
    return {(r["network"], batch_size_of(r)): r for r in rows if phase_of(r) == phase
            and r["status"] == "ok"}


def _errors(pred: np.ndarray, meas: np.ndarray) -> tuple[float, float]:
    """(MAPE %, mean signed error %: + = predicted above the measurement)."""
    rel = (pred - meas) / meas
    return float(100 * np.mean(np.abs(rel))), float(100 * np.mean(rel))


def _fingerprint_errors(fp: Any, optimizer: str, descs: dict[str, Any],
                        rows: dict[tuple[str, int], dict]) -> tuple[tuple[float, float], tuple[float, float]]:
    """(time, memory) :func:`_errors` of fingerprint ``fp`` on ``rows`` ((network, batch size) -> row), its features
    those of ``optimizer``'s step (its own: as fitted; another's: its models read that step's state and passes,
    ``fingerprint.for_optimizer``, as ``predict --optimizer`` does)."""
    from perf4sight.fingerprint.predict import for_optimizer
    keys = sorted(rows)
    names, batch_sizes = sorted({n for n, _ in keys}), sorted({b for _, b in keys})
    preds = for_optimizer(fp, optimizer).predict([descs[n] for n in names], batch_sizes)
    table = {(p["network"], p["batch_size"]): p for p in preds}
    return tuple(_errors(np.array([table[k][p] for k in keys]), np.array([number(rows[k][c]) for k in keys]))
                 for p, c in (("latency_ms", "latency_ms_median"), ("memory_mb", "peak_rss_mb")))


def _cell(lat: tuple[float, float], mem: tuple[float, float]) -> str:
    return f"{lat[0]:.1f} ({lat[1]:+.1f}) / {mem[0]:.1f} ({mem[1]:+.1f})"


def run(optimizers: tuple[str, ...] = ("sgd", "adam"), keep: str = "") -> list[dict]:
    """Profile and fingerprint each optimiser (see the module doc); rows for bench/run_all.py."""
    from perf4sight.config import load_config
    from perf4sight.dataset import descriptions_and_shas
    from perf4sight.fingerprint.predict import load_fingerprint

    out: list[dict] = []
    with tempfile.TemporaryDirectory(prefix="p4s-optimizers-") as scratch:
        folder = Path(keep or scratch)
        folder.mkdir(parents=True, exist_ok=True)
        configs = {o: write_config(folder, o) for o in optimizers}
        run_stage(configs[optimizers[0]], "networks", "bench_optimizers")
        for o in optimizers:
            for stage in ("profile", "fingerprint"):
                run_stage(configs[o], stage, "bench_optimizers")
            print(f"  {o}: profiled and fingerprinted", flush=True)
        rows = read_rows(folder / "profiling_csvs" / DEVICE / "measurements.csv")
        base = optimizers[0]
        ref = _by_key(rows, training_phase(base))
        first = load_fingerprint(folder / f"fingerprinting-{base}" / DEVICE)
        descs = descriptions_and_shas(load_config(configs[base]), DEVICE)[0]
        print(f"\n{'optimizer':<10}{'ok rows':>8}{'time x':>8}{'RSS x':>7}{'held-out MAPE % time/mem':>26}"
              f"   {base} fingerprint, MAPE % (bias) of time / memory: as fitted | on the row's step's features")
        for o in optimizers:
            mine = _by_key(rows, training_phase(o))
            both = sorted(set(mine) & set(ref))
            ratio = {c: float(np.median([number(mine[k][c]) / number(ref[k][c]) for k in both]))
                     for c in ("latency_ms_median", "peak_rss_mb")}
            meta = json.loads((folder / f"fingerprinting-{o}" / DEVICE / "metadata.json").read_text())
            held = {t: meta["accuracy"][t]["overall"]["mape"] for t in ("latency", "memory")}
            (lat, mem), (lat_told, mem_told) = (_fingerprint_errors(first, step, descs, mine) for step in (base, o))
            print(f"{o:<10}{len(mine):>8}{ratio['latency_ms_median']:>8.2f}{ratio['peak_rss_mb']:>7.2f}"
                  f"{held['latency']:>18.1f} / {held['memory']:<5.1f}   {_cell(lat, mem)}"
                  + (f" | {_cell(lat_told, mem_told)}" if o != base else ""), flush=True)
            note = f"{len(both)} configurations measured with {base} and {o}"
            out += [{"benchmark": "optimizers", "metric": f"{o}: step time / {base}'s", "value": ratio[
                "latency_ms_median"], "unit": "x", "note": note},
                    {"benchmark": "optimizers", "metric": f"{o}: peak RSS / {base}'s", "value": ratio["peak_rss_mb"],
                     "unit": "x", "note": note},
                    {"benchmark": "optimizers", "metric": f"{o} fingerprint: held-out memory MAPE", "value": held[
                        "memory"], "unit": "%", "note": "leave one family out"},
                    {"benchmark": "optimizers", "metric": f"{base} fingerprint on {o} rows: memory error (bias)",
                     "value": mem[1], "unit": "%", "note": f"MAPE {mem[0]:.1f}%; time MAPE {lat[0]:.1f}% "
                                                           f"(bias {lat[1]:+.1f}%)"},
                    {"benchmark": "optimizers", "metric": f"{base} fingerprint on {o}'s features: memory MAPE",
                     "value": mem_told[0], "unit": "%", "note": f"bias {mem_told[1]:+.1f}%; time MAPE "
                                                                f"{lat_told[0]:.1f}% (bias {lat_told[1]:+.1f}%)"}]
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--optimizers", nargs="+", default=["sgd", "adam"], help="the first is the reference")
    ap.add_argument("--keep", default="", help="make the dataset in this folder and keep it (a rerun resumes it)")
    args = ap.parse_args()
    run(tuple(args.optimizers), args.keep)


if __name__ == "__main__":
    main()
