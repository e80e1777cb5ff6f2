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
   90% interval, for the step time and the peak RSS; then the rows of the largest shape;
4. a second fingerprint, fitted on the default rows and the torchvision rows of ``--second-shape`` (128 by default),
   named as ``[networks] extra_input_shapes`` names them (``resnet18_l0_128x128``), predicts the same measurements:
   what rows at two shapes buy. Its rows at that shape are in its training data, so its figures there are not
   held out;
5. each torchvision family held out of both fingerprints' rows (at every shape; the fit without its nested
   evaluation) and predicted at each shape: a family never seen, at a shape never seen.

The networks' families are the fingerprint's own (their tree corrections apply), so this measures the shape alone,
not a family never seen.

    .venv/bin/python bench/bench_input_shape.py [--shapes 64 96 128 224] [--second-shape 128] [--keep DIR]

Takes about 15 minutes on 2 cores, most of it the 224x224 profile.
"""
from __future__ import annotations

import argparse
import dataclasses
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
from perf4sight.ir.shapes import shape_text  # noqa: E402
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


def _project(folder: Path, config: Path, csv_dir: str) -> tuple[dict, list[dict]]:
    """A project's descriptions by name, and its rows of those networks (every status)."""
    from perf4sight.config import load_config
    from perf4sight.dataset import descriptions_and_shas

    descs = descriptions_and_shas(load_config(config), DEVICE)[0]
    return descs, [r for r in read_rows(folder / csv_dir / DEVICE / "measurements.csv") if r["network"] in descs]


def two_shape_rows(folder: Path, side: int) -> tuple[dict, list[dict]]:
    """The default project's descriptions and rows, and the torchvision ones at ``side`` x ``side`` under the names
    ``[networks] extra_input_shapes`` gives them (``<name>_<side>x<side>``)."""
    from perf4sight.networks.reshape import shaped_name

    descs, rows = _project(folder, folder / "config-default.toml", "profiling_csvs-default")
    more, more_rows = _project(folder, folder / f"config-r{side}.toml", f"profiling_csvs-r{side}")
    for name, desc in more.items():
        descs[shaped_name(name, desc.input_shape)] = dataclasses.replace(desc, name=shaped_name(name, desc.input_shape))
    return descs, rows + [dict(r, network=shaped_name(r["network"], more[r["network"]].input_shape))
                          for r in more_rows]


def _fitted(folder: Path, name: str, descs: dict, rows: list[dict], nested: bool = True) -> object:
    """``rows`` fitted as the fingerprint stage fits them (the default config's ``[fingerprint]``) into
    ``fingerprinting-<name>``, loaded."""
    from perf4sight.config import load_config
    from perf4sight.fingerprint import fit_fingerprint, load_fingerprint

    out = folder / f"fingerprinting-{name}" / DEVICE
    fit_fingerprint(rows, descs, DEVICE, out, load_config(folder / "config-default.toml").fingerprint, nested=nested)
    return load_fingerprint(out)


def held_out_families(folder: Path, projects: dict, shapes: tuple[int, ...], second: int) -> list[dict]:
    """Each torchvision family held out of both fingerprints' rows (at every shape) and predicted at each shape: a
    family never seen, at a shape never seen."""
    sets = {"64x64 rows": _project(folder, folder / "config-default.toml", "profiling_csvs-default"),
            f"+ {second}x{second} rows": two_shape_rows(folder, second)}
    out, lines = [], []
    for family in ZOO:
        for title, (descs, rows) in sets.items():
            fp = _fitted(folder, f"without-{family}-{len(lines)}", descs,
                         [r for r in rows if descs[r["network"]].family != family], nested=False)
            cells = []
            for side in shapes:
                d, rs = projects[side]
                scores = _scores(fp, d, [r for r in rs if d[r["network"]].family == family])[0]
                (lm, _, lc), (mm, _, mc) = scores.values()
                cells.append(f"{lm:7.1f} {100 * lc:4.0f}% {mm:6.1f} {100 * mc:4.0f}%")
                out += [{"benchmark": "input_shape", "metric": f"{family} held out, {title}: {side}x{side}: {what} "
                         "MAPE", "value": v, "unit": "%", "note": ""} for what, v in (("time", lm), ("peak RSS", mm))]
            lines.append(f"{family:<15}{title:<16}" + "".join(f"  {c}" for c in cells))
    print("\neach torchvision family held out (at every shape), step time MAPE % and share in the interval, then peak "
          "RSS:")
    print(f"{'held out':<15}{'fingerprint':<16}" + "".join(f"  {f'{s}x{s}':^27}" for s in shapes))
    print("\n".join(lines), flush=True)
    return out


def _scores(fp: object, descs: dict, rows: list[dict]) -> tuple[dict, list[dict]]:
    """``fp``'s (MAPE %, mean signed error %, share in the interval) per target on ``rows``, and its predictions."""
    preds = [fp.predict(descs[r["network"]], batch_size_of(r))[0] for r in rows]
    cells = {}
    for p, c, label in TARGETS:
        meas = np.array([number(r[c]) for r in rows])
        cover = float(np.mean([q[f"{p}_low"] <= m <= q[f"{p}_high"] for q, m in zip(preds, meas)]))
        cells[label] = (*_errors(np.array([q[p] for q in preds]), meas), cover)
    return cells, preds


def run(shapes: tuple[int, ...] = (64, 96, 128, 224), keep: str = "", second: int = 128) -> list[dict]:
    """Profile, fingerprint and predict (see the module doc); rows for bench/run_all.py."""
    from perf4sight.fingerprint.predict import load_fingerprint

    out: list[dict] = []
    with tempfile.TemporaryDirectory(prefix="p4s-shape-") as scratch:
        folder = Path(keep or scratch)
        folder.mkdir(parents=True, exist_ok=True)
        default = write_config(folder, "default", "default")
        for stage in ("networks", "profile", "fingerprint"):
            run_stage(default, stage, "bench_input_shape")
        fps = {"64x64 rows": load_fingerprint(folder / "fingerprinting-default" / DEVICE)}
        print(f"fingerprint of {shape_text(fps['64x64 rows'].input_shape)} images: "
              f"{len(fps['64x64 rows'].metadata['networks'])} networks", flush=True)
        projects = {}
        for side in dict.fromkeys((*shapes, second)):
            config = shape_config(folder, side)
            for stage in ("networks", "profile"):
                run_stage(config, stage, "bench_input_shape")
            descs, rows = _project(folder, config, f"profiling_csvs-r{side}")
            projects[side] = descs, [r for r in rows if r["status"] == "ok"]
        fps[f"+ {second}x{second} rows"] = _fitted(folder, f"two-shapes-{second}", *two_shape_rows(folder, second))
        table = []
        for title, fp in fps.items():
            for side in shapes:
                cells, preds = _scores(fp, *projects[side])
                table.append((title, side, len(projects[side][1]), cells))
                for label, (mape, bias, cover) in cells.items():
                    out.append({"benchmark": "input_shape", "metric": f"{title}: {side}x{side}: {label.split(',')[0]} "
                                "MAPE", "value": mape, "unit": "%", "note": f"bias {bias:+.1f}%, interval coverage "
                                f"{100 * cover:.0f}%, {len(projects[side][1])} measurements"})
                if side == shapes[-1] and title == "64x64 rows":
                    _print_rows(side, projects[side][1], preds)
        print(f"\npredicted by a fingerprint of the default networks (3x64x64), and by one with the torchvision rows "
              f"at {second}x{second} too ({second}x{second}: in its training rows), MAPE % (mean signed error), share "
              "in the 90% interval:")
        print(f"{'fingerprint':<20}{'shape':<10}{'rows':>5}" + "".join(f"  {label:^30}" for _, _, label in TARGETS))
        for title, side, n, cells in table:
            print(f"{title:<20}{f'{side}x{side}':<10}{n:>5}" + "".join(
                f"  {m:>8.1f} ({b:+6.1f}) {100 * c:>8.0f}%      " for m, b, c in cells.values()), flush=True)
        out += held_out_families(folder, projects, shapes, second)
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
    ap.add_argument("--second-shape", type=int, default=128,
                    help="the side of the torchvision rows the second fingerprint is also fitted on")
    ap.add_argument("--keep", default="", help="make the datasets in this folder and keep them (a rerun resumes)")
    args = ap.parse_args()
    run(tuple(args.shapes), args.keep, args.second_shape)


if __name__ == "__main__":
    main()
