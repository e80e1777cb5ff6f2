"""The compare stage: one report that sets every fingerprinted device side by side.

``compare_devices(cfg, devices, console)`` writes ``<reports_dir>/compare-<UTC time>/`` with
``index.html`` (self-contained), ``report.md`` (same content), the PNG plots and ``data.json``
(the figures), prints a short table to the terminal and returns the folder.
"""
from __future__ import annotations

import datetime as _dt
import json
from pathlib import Path
from typing import Any

import numpy as np
from rich.console import Console
from rich.table import Table as RichTable
from rich.text import Text as RichText

from perf4sight.config import Config
from perf4sight.dataset import default_networks, device_dataset, resolve_networks, undescribed_note
from perf4sight.errors import UserError
from perf4sight.fingerprint.domain import outside_training_batches
from perf4sight.fingerprint.evaluate import metrics
from perf4sight.fingerprint.predict import BATCH_SEARCH_LIMIT, NETWORK_SPLIT, NETWORK_SPLIT_SEEN, RANDOM_SPLIT
from perf4sight.ir.schema import NetworkDescription
from perf4sight.networks.on_request import with_command_line_factories
from perf4sight.profiling.results import batch_size_of, results_path
from perf4sight.report import plots
from perf4sight.report.data import (Curve, DeviceData, batch_grid, feature_sensitivity, measured_vs_predicted,
                                    prediction_curve, shape_label, summarise_measurements, training_shapes_label)
from perf4sight.report.pruning import (LeastLevel, PruningPoint, batch_label, least_levels, print_pruning,
                                       pruning_blocks, pruning_points)
from perf4sight.report.render import Block, Heading, Image, Table, Text, to_html, to_markdown

__all__ = ["compare_devices", "gather_device", "REPORT_FILES"]

REPORT_FILES = ("index.html", "report.md", "data.json", "latency_vs_batch.png", "memory_vs_batch.png",
                "feature_sensitivity.png")
TOP_FEATURES = 8


def gather_device(cfg: Config, device: str) -> tuple[DeviceData, dict[str, NetworkDescription]]:
    """Load ``device``'s fingerprint, measurements (those of the training step it is of) and descriptions; compute
    its report figures."""
    from perf4sight.fingerprint.api import drift_corrected, load_device_fingerprint

    fp = load_device_fingerprint(cfg, device)
    # the rows of the step the fingerprint is of; compare passes stale rows over without a note. Their step times
    # as the fit read them: divided by the device's drift reference where it has one (held_out.csv holds those)
    descs, _, rows, _ = device_dataset(cfg, device, fp.optimizer, fp.loss)
    rows, _ = drift_corrected(cfg, device, rows, fp.optimizer, fp.loss)  # the fit's references
    # the tables count the rows of networks with a description here, as the fit does (the notes count the others)
    shown = [r for r in rows if r["network"] in descs]
    data = DeviceData(name=device, fingerprint=fp, rows=rows, families=summarise_measurements(shown, descs),
                      networks=sorted({r["network"] for r in shown}),
                      scatter=measured_vs_predicted(fp, rows, descs),
                      sensitivity=feature_sensitivity(fp, rows, descs, seed=cfg.project.seed))
    return data, descs


def _measurement_notes(cfg: Config, d: DeviceData, descs: dict[str, NetworkDescription]) -> list[str]:
    """The report's notes on what of ``d``'s measurements it cannot show: none in this project (a fingerprint copied
    or linked in from another), or rows of networks without a description here (measured under another config's
    models folder), which its dots, scatter and feature sensitivity then leave out."""
    path = results_path(cfg.profiling_dir, d.name)
    if not path.is_file():
        return [f"{d.name}: no measurements in {path}: its fingerprint is compared, and its tables of what was "
                "measured, its measured points, scatter and feature sensitivity are empty"]
    gone = undescribed_note(cfg, d.name, d.rows, descs)
    return [f"{gone}; the report's tables of what was measured, measured points, scatter and feature sensitivity of "
            f"{d.name} leave them out"] if gone else []


def _mape(meas: np.ndarray, pred: np.ndarray) -> tuple[float, float]:
    """(MAPE %, % within ±10 %) of the finite predictions."""
    keep = np.isfinite(pred)
    m = metrics(meas[keep], pred[keep])
    return m["mape"], m["within10"]


def _fmt(x: Any, spec: str = ".1f") -> str:
    if x is None or (isinstance(x, float) and not np.isfinite(x)):
        return "–"
    return format(x, spec)


def _range(lo_hi: tuple[int, int] | None) -> str:
    if lo_hi is None:
        return "none"
    return str(lo_hi[0]) if lo_hi[0] == lo_hi[1] else f"{lo_hi[0]}–{lo_hi[1]}"


def _entries(cfg: Config) -> list[str]:
    """The networks the report shows: ``[compare] networks``, else those predict shows (``default_networks``)."""
    return list(cfg.compare.networks or default_networks(cfg))


def _trained_at(cfg: Config, devs: list[DeviceData]) -> dict[str, tuple[int, ...]]:
    """Device -> the input shape its fingerprint was trained at, which its networks are described at."""
    return {d.name: tuple(d.fingerprint.input_shape or cfg.networks.input_shape) for d in devs}


def _differing_shapes(trained_at: dict[str, tuple[int, ...]]) -> dict[str, str]:
    """Device -> its input shape as ``CxHxW`` where the devices' shapes differ (the notes and the legends say
    them); empty where every device has the same."""
    shapes = {name: shape_label(shape) for name, shape in trained_at.items()}
    return shapes if len(set(shapes.values())) > 1 else {}


def _curves(cfg: Config, devs: list[DeviceData], all_descs: dict[str, dict[str, NetworkDescription]],
            entries: list[str], notes: list[str]) -> tuple[dict[str, dict[str, list[Curve]]], list[str]]:
    """target -> network -> curves (one per device) of ``entries`` (:func:`_entries`); fills each device's
    ``max_batch``."""
    names: list[str] = []
    out: dict[str, dict[str, list[Curve]]] = {"latency": {}, "memory": {}}
    by_shape: dict[tuple[int, ...], list[NetworkDescription]] = {}
    trained_at = _trained_at(cfg, devs)
    shapes = _differing_shapes(trained_at)
    if shapes:
        notes.append("the fingerprints were trained at different input shapes ("
                     + ", ".join(f"{n} {s}" for n, s in shapes.items()) + "): each network is predicted at its "
                     "device's own shape, so the curves and largest batches compare different workloads (the plots' "
                     "legends say which)")
    for d in devs:
        shape = trained_at[d.name]
        if shape not in by_shape:
            made: list[str] = []  # variants pruned on request, said in the report's notes
            by_shape[shape] = resolve_networks(cfg, entries, list(shape), made)
            notes.extend(line + (f" (at {shapes[d.name]})" if shapes else "") for line in made)
            names = names or [desc.name for desc in by_shape[shape]]  # labels: zoo name or description name
        measured_max = max((batch_size_of(r) for r in d.rows if r["status"] == "ok"), default=8)
        shown = [r for r in d.rows if r["network"] in all_descs[d.name]]  # dots: rows the fingerprint stage fits
        for name, desc in zip(names, by_shape[shape]):  # same entry order at every shape
            try:
                mb = d.fingerprint.max_batch_size(desc)  # up to BATCH_SEARCH_LIMIT
                d.max_batch[name] = mb
                grid = batch_grid(min(BATCH_SEARCH_LIMIT, max(8, measured_max, int((mb or 0) * 1.25))))
                for target in ("latency", "memory"):
                    c = prediction_curve(d.fingerprint, d.name, desc, target, grid, shown, all_descs[d.name])
                    c.input_shape = shapes.get(d.name, "")
                    out[target].setdefault(name, []).append(c)
                outside = getattr(d.fingerprint, "outside_training", None)  # at a trained batch size: the network only
                notes.extend(f"{d.name}: {line} (expect larger errors)" for line in
                             (outside(desc, [_trained_batch(d, measured_max)]) if outside else []))
                notes.extend(filter(None, [_largest_batch_note(d, name, mb)]))
            except UserError as exc:
                notes.append(f"{d.name}: {name} skipped ({exc})")
    return out, names


def _trained_batch(d: DeviceData, measured_max: int) -> int:
    """A batch size of ``d``'s training rows, at which a query's notes are of its network alone: the largest it
    measured here, else (a fingerprint fitted elsewhere, no rows here: ``measured_max`` is 8, which the rows need not
    hold) the largest of its ``training_domain``."""
    span = ((d.metadata.get("training_domain") or {}).get("ranges") or {}).get("batch_size")
    return int(span[1]) if span and outside_training_batches(d.metadata, measured_max) else measured_max


def _largest_batch_note(d: DeviceData, name: str, mb: int | None) -> str:
    """A note where ``mb``, network ``name``'s largest batch predicted to fit on ``d``, lies outside the batch sizes
    of its fingerprint's training rows (``training_domain``): predict's --max-batch-size notes it, as an extrapolation;
    '' where it is inside, or unknown."""
    span = outside_training_batches(d.metadata, mb)
    return (f"{d.name}: {name}: its largest batch predicted to fit, {_batch_label(mb)}, is outside the training rows' "
            f"batch sizes {span}: an extrapolation (expect larger errors)") if span else ""


def _step(d: DeviceData) -> str:
    """The optimiser of the training step ``d``'s fingerprint is of, in words (with its momentum and weight decay
    where its rows recorded them)."""
    fp = d.fingerprint
    return fp.runtime.with_optimizer(fp.fitted_optimizer).label()


def _glance_blocks(devs: list[DeviceData]) -> list[Block]:
    """One row per device: what it measured, held-out accuracy, capacity."""
    b: list[Block] = [Heading("Devices at a glance")]
    rows = []
    for d in devs:
        m, acc = d.metadata, d.metadata.get("accuracy", {})
        la, me = acc.get("latency", {}).get("overall", {}), acc.get("memory", {}).get("overall", {})
        ok = sum(f.ok for f in d.families)
        oom = sum(f.oom for f in d.families)
        rows.append([d.name, ", ".join(sorted({r.get("backend", "") for r in d.rows})) or "?",
                     _step(d), str(len(d.networks)), f"{ok} / {oom}",
                     training_shapes_label(m),
                     m.get("memory_target", "?"),
                     f"{_fmt(la.get('mape'))} / {_fmt(la.get('within10'), '.0f')}",
                     f"{_fmt(me.get('mape'))} / {_fmt(me.get('within10'), '.0f')}",
                     _fmt(m.get("capacity_mb"), ".0f")])
    b.append(Table(["device", "backend", "optimiser", "networks", "ok / oom rows", "input", "memory target",
                    "latency MAPE % / ±10% share", "memory MAPE % / ±10% share", "capacity MiB"], rows,
                   "held-out accuracy of each fingerprint; networks and rows: those with a description here (the "
                   "notes count any others); capacity: configured limit or learnt from OOM rows"))
    return b


def _measured_blocks(devs: list[DeviceData]) -> list[Block]:
    """Per device, per family: variants, batch sizes, outcomes, the OOM boundary."""
    b: list[Block] = [Heading("What was measured")]
    for d in devs:
        b.append(Table(["family", "variants", "batch sizes", "ok", "oom", "skipped/error", "largest batch that ran",
                        "first OOM batch"],
                       [[f.family, str(f.variants), f"{f.batch_sizes[0]}–{f.batch_sizes[-1]} ({len(f.batch_sizes)})"
                         if f.batch_sizes else "–", str(f.ok), str(f.oom), str(f.other), _range(f.largest_ok),
                         _range(f.first_oom)] for f in d.families],
                       f"{d.name}: ranges are over the family's variants (OOM boundary)"))
    return b


def _accuracy_blocks(devs: list[DeviceData]) -> list[Block]:
    """Per device and target: the held-out accuracy table per network family."""
    b: list[Block] = [Heading("Held-out accuracy per network family")]
    for d in devs:
        for target, acc in d.metadata.get("accuracy", {}).items():
            groups = list(acc.get("per_group", {}).items()) + [("all", acc.get("overall", {}))]
            groups += [(label, acc[key]) for key, label in (
                ("random_split", RANDOM_SPLIT), ("network_split", NETWORK_SPLIT),
                ("network_split_seen", f"{NETWORK_SPLIT}, {NETWORK_SPLIT_SEEN.strip()}"))
                if (acc.get(key) or {}).get("n")]  # networks, or families, seen in training: the easier cases
            b.append(Table(["held out", "n", "MAPE %", "RMSPE %", "within ±10% (%)"],
                           [[g, str(m.get("n", "")), _fmt(m.get("mape")), _fmt(m.get("rmspe")),
                             _fmt(m.get("within10"))] for g, m in groups],
                           f"{d.name}: {target} ({acc.get('column', '')}), leave-one-{acc.get('grouping', '')}-out"))
    return b


def _curve_plot_blocks(names: list[str], images: dict[str, Path]) -> list[Block]:
    """The predicted curves of every device (plots made by the caller)."""
    b: list[Block] = [Heading("Predicted step time and memory against batch size")]
    b.append(Text("Networks: " + ", ".join(names) + ". Each is described at the input shape its device's fingerprint "
                  "was trained at. Dots are measurements of the same architecture where the device has them (rows the "
                  "fingerprint was trained on: the held-out check is the scatter below)."))
    b.append(Image(images["latency"], "predicted training step time (ms) against batch size, every device"))
    b.append(Image(images["memory"], "predicted memory (MiB) against batch size, every device; dashed: capacity (where "
                                     "'fits' compares it with this memory: see Largest batch)"))
    return b


def _against_demand(d: DeviceData) -> bool:
    """Whether ``d``'s capacity is compared with its memory model's analytic demand rather than with the memory it
    predicts (``capacity_basis``: a capacity learnt from out-of-memory rows, or a memory form that saturates)."""
    return d.fingerprint.capacity_mb is not None and getattr(d.fingerprint, "capacity_basis", "") == "analytic"


def _batch_label(mb: int | None) -> str:
    """A largest batch as shown: ``1024+`` where every batch searched fits (as predict's ``--max-batch-size``)."""
    return "–" if mb is None else batch_label(mb)  # –: a network that was not predicted on this device


def _largest_batch_blocks(devs: list[DeviceData], names: list[str]) -> list[Block]:
    """The largest batch that fits, per network and device."""
    b: list[Block] = [Heading("Largest batch that fits")]
    b.append(Table(["network"] + [d.name for d in devs],
                   [[n] + [("unknown capacity" if d.max_batch.get(n, "x") is None else _batch_label(d.max_batch.get(n)))
                           for d in devs] for n in names],
                   "largest b with every batch 1..b predicted under the device's capacity "
                   f"({BATCH_SEARCH_LIMIT}+: every batch searched fits)"))
    demand = [f"{d.name} ({d.fingerprint.capacity_mb:.0f} MiB)" for d in devs if _against_demand(d)]
    if demand:
        b.append(Text(f"Capacity of {', '.join(demand)}: compared with the memory model's analytic demand, which "
                      "keeps growing where the predicted memory levels off near the limit, so a batch can be "
                      "predicted under the capacity and not fit; the plots draw no capacity line for it."))
    return b


def _sensitivity_blocks(devs: list[DeviceData], images: dict[str, Path]) -> list[Block]:
    """The features each fingerprint leans on: plot and top features per target."""
    b: list[Block] = [Heading("Features each fingerprint leans on")]
    b.append(Text("Permutation sensitivity: mean |change| (%) of the prediction when one feature is shuffled across "
                  "the device's measured configurations (analytic terms and tree correction together)."))
    b.append(Image(images["sensitivity"], "feature sensitivity per device, latency (left) and memory (right)"))
    for target in ("latency", "memory"):
        ranked = {d.name: sorted(d.sensitivity.get(target, {}).items(), key=lambda kv: -kv[1])[:TOP_FEATURES]
                  for d in devs}
        b.append(Table(["rank"] + [d.name for d in devs],
                       [[str(i + 1)] + [f"{ranked[d.name][i][0]} ({ranked[d.name][i][1]:.1f}%)"
                                        if i < len(ranked[d.name]) else "" for d in devs]
                        for i in range(max((len(v) for v in ranked.values()), default=0))],
                       f"{target}: top features, side by side"))
    return b


def _scatter_blocks(devs: list[DeviceData], images: dict[str, Path],
                    all_descs: dict[str, dict[str, NetworkDescription]]) -> list[Block]:
    """Per device: predicted against measured, with its MAPE and ±10 % share; ``all_descs``: device -> the
    descriptions its rows were read with (the rows of a network without one are said in the notes)."""
    b: list[Block] = [Heading("Predicted against measured")]
    for d in devs:
        parts = []
        # the ok rows the scatter could show: of a described network (the notes count the others)
        ok = sum(r["status"] == "ok" and r["network"] in all_descs[d.name] for r in d.rows)
        for target in ("latency", "memory"):
            meas, pred, how = d.scatter[target]
            if not meas.size:
                parts.append(f"{target}: no ok measurements with a description here (Notes)")
                continue
            mape, within = _mape(meas, pred)
            missing = f", {ok - meas.size} ok rows without a {target} figure left out" if 0 < meas.size < ok else ""
            parts.append(f"{target} over {meas.size} measurements ({how}{missing}): MAPE {_fmt(mape)}%, "
                         f"{_fmt(within, '.0f')}% within ±10%")
        b.append(Text(f"{d.name}: " + "; ".join(parts) + "."))
        b.append(Image(images[f"scatter:{d.name}"], f"{d.name}: predicted against measured"))
    return b


def _blocks(devs: list[DeviceData], names: list[str], images: dict[str, Path], notes: list[str],
            pruning: list[PruningPoint], least: list[LeastLevel],
            all_descs: dict[str, dict[str, NetworkDescription]]) -> list[Block]:
    """The report, section by section."""
    b: list[Block] = [Text("Latency: one training step (forward, loss, backward, optimiser step) in ms. "
                           "Memory in MiB, the figure each fingerprint was trained on (peak_rss_mb for cpu "
                           "devices, device_mem_used_mb for GPU/Jetson devices). Accuracy is leave-one-family-out "
                           "(or leave-one-variant-out) on each device's own measurements.")]
    b += _glance_blocks(devs) + _measured_blocks(devs) + _accuracy_blocks(devs)
    b += _curve_plot_blocks(names, images) + _largest_batch_blocks(devs, names)
    b += pruning_blocks(pruning, least, [d.name for d in devs], images)
    b += _sensitivity_blocks(devs, images) + _scatter_blocks(devs, images, all_descs)
    if notes:
        b.append(Heading("Notes"))
        b += [Text(n) for n in notes]
    return b


def _data_json(devs: list[DeviceData], curves: dict[str, dict[str, list[Curve]]],
               pruning: list[PruningPoint], least: list[LeastLevel]) -> dict[str, Any]:
    return {
        "devices": {d.name: {
            "input_shape": d.fingerprint.input_shape, "capacity_mb": d.fingerprint.capacity_mb,
            "memory_target": d.metadata.get("memory_target"), "accuracy": d.metadata.get("accuracy", {}),
            "families": [vars(f) for f in d.families], "max_batch": d.max_batch, "sensitivity_pct": d.sensitivity}
            for d in devs},
        "curves": {t: {n: [{"device": c.device, "batch_size": c.batch_sizes.tolist(), "predicted": c.value.tolist(),
                            "low": c.low.tolist(), "high": c.high.tolist(), "measured_network": c.measured_label,
                            "measured_batch_size": c.measured_bs.tolist(), "measured": c.measured.tolist()}
                           for c in cs] for n, cs in per.items()} for t, per in curves.items()},
        "pruning": [vars(p) for p in pruning], "pruning_least": [vars(x) for x in least],
        "batch_search_limit": BATCH_SEARCH_LIMIT,  # a max_batch of this value: every batch searched fits ("1024+")
    }


def _json_text(data: Any) -> str:
    """``data`` as JSON text (numpy's numbers as Python's), a figure that is not finite as null: an accuracy row of no
    rows holds NaN, which ``json.dumps`` writes as ``NaN``, not JSON."""
    def plain(x: Any) -> Any:
        if isinstance(x, dict):
            return {k: plain(v) for k, v in x.items()}
        if isinstance(x, (list, tuple, np.ndarray)):
            return [plain(v) for v in x]
        if isinstance(x, (float, np.floating)):
            return float(x) if np.isfinite(x) else None
        return int(x) if isinstance(x, np.integer) else x
    return json.dumps(plain(data), indent=1, default=float, allow_nan=False)


def _print_summary(console: Console, devs: list[DeviceData], names: list[str], folder: Path) -> None:
    """The terminal's short tables: one row per device, then the largest batch of each network (a row each, a
    column per device, so that many networks neither squeeze the table nor cut its names and figures)."""
    t = RichTable(title="devices compared (held-out accuracy)")
    for col in ("device", "input", "nets", "ok/oom", "lat MAPE%", "mem MAPE%", "cap MiB"):
        t.add_column(col, no_wrap=True)
    for d in devs:
        acc = d.metadata.get("accuracy", {})
        t.add_row(RichText(d.name), training_shapes_label(d.metadata), str(len(d.networks)),
                  f"{sum(f.ok for f in d.families)}/{sum(f.oom for f in d.families)}",
                  _fmt(acc.get("latency", {}).get("overall", {}).get("mape")),
                  _fmt(acc.get("memory", {}).get("overall", {}).get("mape")),
                  _fmt(d.fingerprint.capacity_mb, ".0f"))
    console.print(t)
    if names:
        t = RichTable(title=f"largest batch predicted to fit ({BATCH_SEARCH_LIMIT}+: every batch searched fits)")
        t.add_column("network", no_wrap=True)
        for d in devs:
            t.add_column(RichText(d.name), justify="right", no_wrap=True)  # Text: [brackets] are no markup
        for n in names:
            t.add_row(RichText(n), *["?" if d.max_batch.get(n) is None else _batch_label(d.max_batch[n]) for d in devs])
        console.print(t)
    console.print(f"report: {folder / 'index.html'} (Markdown: {folder / 'report.md'})", markup=False)


def compare_devices(cfg: Config, devices: list[str], console: Console) -> Path:
    """Write the compare report for ``devices`` (each must have a fingerprint); returns its folder."""
    if not devices:
        raise UserError("compare: no devices to compare (run --stage fingerprint first)")
    entries = _entries(cfg)
    if not entries:
        raise UserError(f"{cfg.path}: compare: no networks to show: name them in [compare] networks (or [predict] "
                        "networks, [networks] zoo)")
    devs, all_descs = [], {}
    for name in devices:
        d, descs = gather_device(cfg, name)
        devs.append(d)
        all_descs[name] = descs
    notes: list[str] = [line for d in devs for line in _measurement_notes(cfg, d, all_descs[d.name])]
    steps = {d.name: _step(d) for d in devs}
    if len(set(steps.values())) > 1:
        notes.append("the fingerprints are of training steps with different optimisers ("
                     + ", ".join(f"{n}: {s}" for n, s in steps.items()) + "): their figures are of different steps")
    curves, names = _curves(cfg, devs, all_descs, entries, notes)
    if not any(curves.values()):
        raise UserError("compare: no network could be predicted on any device; " + "; ".join(notes))
    trained_at = _trained_at(cfg, devs)
    pruned_cfg, entries = with_command_line_factories(cfg, entries)  # FILE.py:FUNCTION as [networks] factories
    pruning = pruning_points(pruned_cfg, devs, trained_at, entries, notes)
    least = least_levels(pruned_cfg, devs, trained_at, pruning, notes)
    now = _dt.datetime.now(_dt.timezone.utc)
    stamp = now.strftime("%Y%m%d-%H%M%S")
    folder = cfg.reports_dir / f"compare-{stamp}"
    n = 1
    while folder.exists():
        n += 1
        folder = cfg.reports_dir / f"compare-{stamp}-{n}"
    folder.mkdir(parents=True)
    colours = plots.device_colours([d.name for d in devs])
    # a capacity line on the predicted memory only where 'fits' compares the capacity with that memory
    capacity = {d.name: d.fingerprint.capacity_mb for d in devs if not _against_demand(d)}
    images = {t: plots.plot_curves(curves[t], t, colours, capacity, folder / f"{t}_vs_batch.png")
              for t in ("latency", "memory")}
    images["sensitivity"] = plots.plot_sensitivity({d.name: d.sensitivity for d in devs}, colours,
                                                   folder / "feature_sensitivity.png")
    for d in devs:
        images[f"scatter:{d.name}"] = plots.plot_scatter(d.name, d.scatter, colours[d.name],
                                                         folder / f"scatter_{d.name}.png")
    if pruning:
        shapes = _differing_shapes(trained_at)
        labels = {n: f"{n} at {shapes[n]}" if shapes else n for n in trained_at}
        images["pruning"] = plots.plot_pruning(pruning, least, colours, capacity, labels, folder / "pruning.png")
    title = f"perf4sight: {', '.join(d.name for d in devs)} compared"
    blocks = _blocks(devs, names, images, notes, pruning, least, all_descs)
    blocks.insert(0, Text(f"Generated {now:%Y-%m-%d %H:%M:%S} UTC from {cfg.fingerprint_dir} and {cfg.profiling_dir}."))
    (folder / "index.html").write_text(to_html(title, blocks), encoding="utf-8")
    (folder / "report.md").write_text(to_markdown(title, blocks), encoding="utf-8")
    (folder / "data.json").write_text(_json_text(_data_json(devs, curves, pruning, least)))
    print_pruning(console, pruning, least, [d.name for d in devs])
    _print_summary(console, devs, names, folder)
    for note in notes:
        console.print(note, markup=False)
    return folder
