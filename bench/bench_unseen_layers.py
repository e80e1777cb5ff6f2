"""Networks whose layers no network of the default dataset has, on this machine's CPU: predicted by fingerprints
that never saw them, against their measurements.

torchvision's ConvNeXt runs a 7x7 depthwise convolution, then a layer norm and a two-layer MLP per pixel (linear
layers on 4-D tensors, between two permutes), and a layer scale; a ViT cuts the image into patches and runs
self-attention and MLPs over the tokens, with a class token and a position embedding. With the tool's own
stages, in a temporary folder:

1. ``default``: the default config's networks (three torchvision families at three pruning levels, six generated
   networks, 3x64x64) are profiled on the ``cpu`` backend (one thread, no memory limit, batch sizes 2, 8 and 32)
   and fingerprinted, as ``bench_optimizers`` does;
2. ``+ <style> nets``, for each of ``--styles`` (default: both design-space styles unlike the default dataset's,
   ``convnext`` and ``transformer``): the same dataset and three more generated networks of that style
   alone (``--style-networks``; seed 1, the default config's ranges, given as description files, so pruned at the
   same levels), profiled and fingerprinted in the same project: generated ConvNeXt blocks or encoder stages, no
   torchvision network;
3. each of ``--networks`` (default ``convnext_tiny`` and ``vit_b_16``) at the same pruning levels (a Swin
   transformer, which cannot be pruned, at level 0 alone) is profiled the same way, in a project of its own (so
   that neither fingerprint sees it); a segmentation network (``fcn_resnet50``, ``lraspp_mobilenet_v3_large``...)
   scores 21 classes per pixel (``[networks] segmentation_classes``' default), where a classifier scores 1,000;
4. each fingerprint predicts every measurement of those networks. Printed per network: per configuration the
   measured and predicted step time and peak RSS; then per fingerprint MAPE, mean signed error (+ = predicted
   above the measurement) and the share of measurements inside the 90% interval, beside the fingerprint's own
   held-out MAPE (leave one family out, from its metadata) for scale.
5. why the CPU's memory form counts the parameter copies at their bytes (:func:`parameter_copies_lines`): the peak
   RSS as a line in the analytic memory estimate, fitted on the default rows with one slope for all of it, or with
   the parameter copies (weights, gradients, momentum) counted exactly and the slope on the rest alone; each one's
   error on the default rows' held-out families and on the unseen networks.

    .venv/bin/python bench/bench_unseen_layers.py [--networks convnext_tiny vit_b_16] [--styles convnext transformer]
        [--style-networks 3] [--keep DIR]

Takes about 15 minutes on 2 cores.
"""
from __future__ import annotations

import argparse
import json
import re
import sys
import tempfile
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

from _stages import run_stage  # noqa: E402
from perf4sight.profiling.results import batch_size_of, number, read_rows  # noqa: E402

DEVICE = "cpu-unseen"
TARGETS = (("latency_ms", "latency_ms_median", "time, ms"), ("memory_mb", "peak_rss_mb", "peak RSS, MiB"))


def write_config(folder: Path, name: str, dirs: str, zoo: list[str] | None = None,
                 description_files: list[Path] | None = None) -> Path:
    """The default config with this bench's profile settings, project folders ``<kind>-<dirs>`` (the fingerprints'
    ``fingerprinting-<name>``), and, given ``zoo``, those torchvision networks alone (no generated ones), given
    ``description_files``, those networks too."""
    text = (ROOT / "config.toml").read_text()
    text = re.sub(r"(?m)^batch_sizes = \[1, 2, 4, 8, 16, 32\].*$", "batch_sizes = [2, 8, 32]", text)
    for key, value, suffix in (("models_dir", "models", dirs), ("profiling_dir", "profiling_csvs", dirs),
                               ("fingerprint_dir", "fingerprinting", name)):
        text = re.sub(rf'(?m)^{key} = "{value}".*$', f'{key} = "{value}-{suffix}"', text)
    if zoo is not None:
        text = re.sub(r"(?m)^zoo = \[.*$", f"zoo = {json.dumps(zoo)}", text)
        text = re.sub(r"(?m)^count = 6 .*$", "count = 0", text)
        if any(n.startswith("swin_") for n in zoo):  # a Swin transformer cannot be pruned: its level 0 alone
            text = re.sub(r"(?m)^levels = \[0, 30, 60\].*$", "levels = [0]", text)
    if description_files:
        text = re.sub(r"(?m)^num_classes = 1000$", "num_classes = 1000\ndescription_files = "
                      + json.dumps([str(f) for f in description_files]), text)
    text = re.sub(r"(?m)^\[devices\.local\]$", f"[devices.{DEVICE}]", text)
    text = re.sub(r"(?m)^memory_limit_mb = 900 .*$", "memory_limit_mb = 0", text)
    config = folder / f"config-{name}.toml"
    config.write_text(text)
    return config


def style_networks(folder: Path, count: int, style: str) -> list[Path]:
    """``count`` generated networks of ``style`` alone (seed 1, the default config's ranges), named
    ``<style>_gen_1_<i>``, written as description files under ``folder``."""
    from perf4sight.config import load_config
    from perf4sight.ir.schema import save_description
    from perf4sight.networks.generator import GeneratorSettings, generate

    cfg = load_config(ROOT / "config.toml")
    gen = cfg.networks.generator
    settings = GeneratorSettings(count, 1, (style,), gen.min_mflops, gen.max_mflops, gen.min_params,
                                 gen.max_params)
    descs = generate(settings, cfg.networks.input_shape, cfg.networks.num_classes)
    for d in descs:  # each style's own names: the styles' projects share one models folder and one CSV
        d.name = f"{style}_{d.name}"
    return [save_description(d, folder / f"{style}-style" / f"{d.name}.json") for d in descs]


def _errors(pred: np.ndarray, meas: np.ndarray) -> tuple[float, float]:
    """(MAPE %, mean signed error %: + = predicted above the measurement)."""
    rel = (pred - meas) / meas
    return float(100 * np.mean(np.abs(rel))), float(100 * np.mean(rel))


def _memory_rows(folder: Path, config: Path, csv_dir: str,
                 only: set[str] | None = None) -> tuple[np.ndarray, np.ndarray, np.ndarray, list[str]]:
    """The rows' (parameter copies MiB, analytic estimate MiB, peak RSS MiB, family) of one project (of the
    networks ``only`` names, if given): the parameter copies are weights, gradients and momentum
    (``param_copies_mb``), the analytic estimate is those and the tensors kept for backward, the input batch and the
    largest activation (``mem_analytic_mb``)."""
    from perf4sight.config import load_config
    from perf4sight.dataset import descriptions_and_shas
    from perf4sight.features.aggregate import FEATURE_NAMES, feature_matrix, network_features
    from perf4sight.fingerprint.fit import step_runtime

    descs = descriptions_and_shas(load_config(config), DEVICE)[0]
    rows = [r for r in read_rows(folder / csv_dir / DEVICE / "measurements.csv")
            if r["status"] == "ok" and r["network"] in descs and (only is None or r["network"] in only)]
    runtime = step_runtime(rows)  # as the fingerprint computes them: the kept tensors of the rows' torch
    nets = {name: network_features(descs[name], runtime) for name in {r["network"] for r in rows}}
    feats = [dict(zip(FEATURE_NAMES, feature_matrix(nets[r["network"]], [batch_size_of(r)])[0])) for r in rows]
    return (np.array([f["param_copies_mb"] for f in feats]), np.array([f["mem_analytic_mb"] for f in feats]),
            np.array([number(r["peak_rss_mb"]) for r in rows]), [descs[r["network"]].family for r in rows])


def parameter_copies_lines(folder: Path, networks: tuple[str, ...]) -> list[dict]:
    """Why a CPU's memory form counts the parameter copies at their bytes (docs/accuracy-notes.md, "CPU: the
    parameter copies at their bytes"): the peak RSS as a line in the analytic estimate, fitted on the default
    project's rows, either with one slope for all of it (as the forms "analytic only" / "x trees" fit it) or with
    the parameter copies counted exactly (slope 1) and the slope on the rest alone (the CPU's memory form without
    its trees, fitted by least squares). Printed: each one's mean held-out-family MAPE on the default rows, and its
    MAPE on each unseen network."""
    trained = set(json.loads((folder / "fingerprinting-default" / DEVICE / "metadata.json").read_text())["networks"])
    copies, analytic, rss, family = _memory_rows(folder, folder / "config-default.toml", "profiling_csvs-default",
                                                 trained)  # the default fingerprint's networks, no style network
    out = []
    unseen = {network: _memory_rows(folder, folder / f"config-{network}.toml", f"profiling_csvs-{network}")
              for network in networks}  # read once, for both lines
    print("\ntwo lines: peak RSS = a + b x analytic estimate, fitted on the default rows (no trees):")
    for name, exact in (("one slope for all", False), ("parameter copies exact", True)):
        offset = copies if exact else 0 * copies
        design = np.column_stack([np.ones(len(rss)), analytic - offset])
        held = []
        for fam in sorted(set(family)):
            train = np.array([f != fam for f in family])
            coef = np.linalg.lstsq(design[train], (rss - offset)[train], rcond=None)[0]
            held.append(100 * np.mean(np.abs(design[~train] @ coef + offset[~train] - rss[~train]) / rss[~train]))
        coef = np.linalg.lstsq(design, rss - offset, rcond=None)[0]
        cells = []
        for network in networks:
            c, a, y, _ = unseen[network]
            c = c if exact else 0 * c
            mape, bias = _errors(np.column_stack([np.ones(len(y)), a - c]) @ coef + c, y)
            cells.append(f"{network} {mape:.1f} ({bias:+.1f})")
            out.append({"benchmark": "unseen_layers", "metric": f"line, {name}: {network} memory MAPE", "value": mape,
                        "unit": "%", "note": f"bias {bias:+.1f}%; held-out families of the default rows "
                                             f"{float(np.mean(held)):.2f}%"})
        print(f"  {name:<24} b = {coef[1]:.3f}; held-out families {float(np.mean(held)):.2f}%; unseen, MAPE (bias): "
              + ", ".join(cells), flush=True)
    return out


def run(networks: tuple[str, ...] = ("convnext_tiny", "vit_b_16"), count: int = 3, keep: str = "",
        styles: tuple[str, ...] = ("convnext", "transformer")) -> list[dict]:
    """Profile, fingerprint and predict (see the module doc); rows for bench/run_all.py."""
    out: list[dict] = []
    with tempfile.TemporaryDirectory(prefix="p4s-unseen-") as scratch:
        folder = Path(keep or scratch)
        folder.mkdir(parents=True, exist_ok=True)
        configs = {"default": write_config(folder, "default", "default")}
        configs |= {f"style-{s}": write_config(folder, f"style-{s}", "default",
                                               description_files=style_networks(folder, count, s)) for s in styles}
        for key in configs:
            for stage in ("networks", "profile", "fingerprint"):
                run_stage(configs[key], stage, "bench_unseen_layers")
            print(f"  {configs[key].name}: networks, profile, fingerprint done", flush=True)
        for network in networks:
            unseen = write_config(folder, network, network, [network])
            for stage in ("networks", "profile"):
                run_stage(unseen, stage, "bench_unseen_layers")
            out += _predicted(folder, network, unseen, {k: k.replace("style-", "+ ") + " nets" if k != "default"
                                                         else k for k in configs})
        out += parameter_copies_lines(folder, networks)
    return out


def _predicted(folder: Path, network: str, config: Path, names: dict[str, str]) -> list[dict]:
    """The fingerprints ``names`` (key -> title) on ``network``'s measurements (profiled with ``config``): the tables,
    and rows for run_all."""
    from perf4sight.config import load_config
    from perf4sight.dataset import descriptions_and_shas
    from perf4sight.fingerprint.predict import load_fingerprint

    rows = {(r["network"], batch_size_of(r)): r
            for r in read_rows(folder / f"profiling_csvs-{network}" / DEVICE / "measurements.csv")
            if r["status"] == "ok"}
    descs = descriptions_and_shas(load_config(config), DEVICE)[0]
    keys = sorted(rows, key=lambda k: (descs[k[0]].pruning_level, k[1]))
    tables, metas = {}, {}
    for key in names:
        fp_dir = folder / f"fingerprinting-{key}" / DEVICE
        metas[key] = json.loads((fp_dir / "metadata.json").read_text())
        preds = load_fingerprint(fp_dir).predict([descs[n] for n in sorted({n for n, _ in keys})],
                                                 sorted({b for _, b in keys}))
        tables[key] = {(p["network"], p["batch_size"]): p for p in preds}
    columns = ("measured", *names.values())
    print(f"\n{'':<26}" + "".join(f"  {label:^{19 * len(columns)}}" for _, _, label in TARGETS))
    print(f"{'network':<20}{'batch':>6}" + "".join("  " + "".join(f"{c:>19}" for c in columns) for _ in TARGETS))
    for k in keys:
        cells = ["  " + f"{number(rows[k][c]):>19.1f}" + "".join(f"{tables[key][k][p]:>19.1f}" for key in names)
                 for p, c, _ in TARGETS]
        print(f"{k[0]:<20}{k[1]:>6}" + "".join(cells))
    print(f"\n{len(keys)} measurements of {network}, which no fingerprint saw:")
    out = []
    for key, title in names.items():
        for p, c, label in TARGETS:
            meas = np.array([number(rows[k][c]) for k in keys])
            pred = np.array([tables[key][k][p] for k in keys])
            cover = float(np.mean([tables[key][k][f"{p}_low"] <= number(rows[k][c]) <= tables[key][k][f"{p}_high"]
                                   for k in keys]))
            mape, bias = _errors(pred, meas)
            held = metas[key]["accuracy"]["latency" if p == "latency_ms" else "memory"]["overall"]["mape"]
            print(f"  {title:<20}{label:<15} MAPE {mape:5.1f}%  bias {bias:+6.1f}%  in the 90% interval "
                  f"{100 * cover:5.1f}%   (its own held-out MAPE: {held:.1f}%)", flush=True)
            out.append({"benchmark": "unseen_layers", "metric": f"{network}, {title}: {label.split(',')[0]} MAPE",
                        "value": mape, "unit": "%", "note": f"bias {bias:+.1f}%, interval coverage {100 * cover:.0f}%, "
                                                            f"the fingerprint's held-out MAPE {held:.1f}%"})
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--networks", nargs="+", default=["convnext_tiny", "vit_b_16"], help="zoo networks")
    ap.add_argument("--styles", nargs="+", default=["convnext", "transformer"], help="generator styles: one "
                    "fingerprint each with --style-networks networks of the style added to the default dataset")
    ap.add_argument("--style-networks", type=int, default=3, help="generated networks of each style added")
    ap.add_argument("--keep", default="", help="make the datasets in this folder and keep them (a rerun resumes)")
    args = ap.parse_args()
    run(tuple(args.networks), args.style_networks, args.keep, tuple(args.styles))


if __name__ == "__main__":
    main()
