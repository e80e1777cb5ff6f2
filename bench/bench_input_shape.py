"""Predictions at other input shapes than the fingerprint's training networks', on this machine's CPU: what
``--stage predict --input-shape`` is worth.

With the tool's own stages, in a temporary folder:

1. the default config's networks (three torchvision families at three pruning levels, six generated networks,
   3x64x64) are profiled on the ``cpu`` backend (one thread, no memory limit, batch sizes 2, 8 and 32) and
   fingerprinted, as ``bench_unseen_layers`` does;
2. the three torchvision networks at 0 and 60% pruning are profiled again at each of ``--shapes`` (square images,
   default 64, 96, 128 and 224), each shape in a project of its own; the 64 rows are the same networks at the
   training shape measured again, so they give the noise and drift of a second profile beside the others;
3. the fingerprint predicts every one of those measurements, each network described at its own shape. Printed per
   shape: MAPE, mean signed error (+ = predicted above the measurement) and the share of measurements inside the
   90% interval, for the step time and the peak RSS; then the rows of the largest shape.

The networks' families are the fingerprint's own (their tree corrections apply), so this measures the shape alone,
not a family never seen.

    .venv/bin/python bench/bench_input_shape.py [--shapes 64 96 128 224] [--keep DIR]

Takes about 30 minutes on 2 cores, most of it the 224x224 profile.
"""
from __future__ import annotations

import argparse
import re
import sys
import tempfile
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

from _stages import run_stage  # noqa: E402
from bench_unseen_layers import DEVICE, TARGETS, _errors, write_config  # noqa: E402
from perf4sight.profiling.results import batch_size_of, number, read_rows  # noqa: E402

ZOO = ["resnet18", "mobilenet_v2", "squeezenet1_0"]
LEVELS = [0, 60]


def shape_config(folder: Path, side: int) -> Path:
    """The config of the torchvision networks at ``LEVELS`` and ``side`` x ``side`` images (project folders
    ``<kind>-r<side>``)."""
    config = write_config(folder, f"r{side}", f"r{side}", ZOO)
    text = re.sub(r"(?m)^input_shape = \[3, 64, 64\]", f"input_shape = [3, {side}, {side}]", config.read_text())
    config.write_text(re.sub(r"(?m)^levels = \[0, 30, 60\]", f"levels = {LEVELS}", text))
    return config


def run(shapes: tuple[int, ...] = (64, 96, 128, 224), keep: str = "") -> list[dict]:
    """Profile, fingerprint and predict (see the module doc); rows for bench/run_all.py."""
    from perf4sight.config import load_config
    from perf4sight.dataset import descriptions_and_shas
    from perf4sight.fingerprint.predict import load_fingerprint

    out: list[dict] = []
    with tempfile.TemporaryDirectory(prefix="p4s-shape-") as scratch:
        folder = Path(keep or scratch)
        folder.mkdir(parents=True, exist_ok=True)
        default = write_config(folder, "default", "default")
        for stage in ("networks", "profile", "fingerprint"):
            run_stage(default, stage, "bench_input_shape")
        fp = load_fingerprint(folder / "fingerprinting-default" / DEVICE)
        print(f"fingerprint of {', '.join(map(str, fp.input_shape))} images: {len(fp.metadata['networks'])} networks",
              flush=True)
        table = []
        for side in shapes:
            config = shape_config(folder, side)
            for stage in ("networks", "profile"):
                run_stage(config, stage, "bench_input_shape")
            descs = descriptions_and_shas(load_config(config), DEVICE)[0]
            rows = [r for r in read_rows(folder / f"profiling_csvs-r{side}" / DEVICE / "measurements.csv")
                    if r["status"] == "ok" and r["network"] in descs]
            preds = [fp.predict(descs[r["network"]], batch_size_of(r))[0] for r in rows]
            cells = {}
            for p, c, label in TARGETS:
                meas = np.array([number(r[c]) for r in rows])
                pred = np.array([q[p] for q in preds])
                cover = float(np.mean([q[f"{p}_low"] <= m <= q[f"{p}_high"] for q, m in zip(preds, meas)]))
                mape, bias = _errors(pred, meas)
                cells[label] = (mape, bias, cover)
                out.append({"benchmark": "input_shape", "metric": f"{side}x{side}: {label.split(',')[0]} MAPE",
                            "value": mape, "unit": "%", "note": f"bias {bias:+.1f}%, interval coverage "
                                                                f"{100 * cover:.0f}%, {len(rows)} measurements"})
            table.append((side, len(rows), cells))
            if side == shapes[-1]:
                _print_rows(side, rows, preds)
        print("\npredicted by the fingerprint of the default networks (3x64x64), MAPE % (mean signed error), share in "
              "the 90% interval:")
        print(f"{'shape':<10}{'rows':>5}" + "".join(f"  {label:^30}" for _, _, label in TARGETS))
        for side, n, cells in table:
            print(f"{f'{side}x{side}':<10}{n:>5}" + "".join(
                f"  {m:>8.1f} ({b:+6.1f}) {100 * c:>8.0f}%      " for m, b, c in cells.values()), flush=True)
    return out


def _print_rows(side: int, rows: list[dict], preds: list[dict]) -> None:
    """Each measurement of the ``side`` x ``side`` project beside its prediction."""
    print(f"\n{side}x{side}:{'':<15}" + "".join(f"  {label:^27}" for _, _, label in TARGETS))
    print(f"{'network':<20}{'batch':>6}" + "  measured  predicted    error" * len(TARGETS))
    for r, q in zip(rows, preds):
        cells = []
        for p, c, _ in TARGETS:
            m = number(r[c])
            cells.append(f"  {m:>8.1f} {q[p]:>10.1f} {100 * (q[p] - m) / m:>+7.1f}%")
        print(f"{r['network']:<20}{batch_size_of(r):>6}" + "".join(cells))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--shapes", nargs="+", type=int, default=[64, 96, 128, 224],
                    help="image sides to profile the torchvision networks at (square, 3 channels)")
    ap.add_argument("--keep", default="", help="make the datasets in this folder and keep them (a rerun resumes)")
    args = ap.parse_args()
    run(tuple(args.shapes), args.keep)


if __name__ == "__main__":
    main()
