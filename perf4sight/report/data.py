"""The numbers behind the compare report, gathered per device from files on disk.

Everything here is plain data (dicts, lists, numpy arrays) for :mod:`perf4sight.report.plots`
and :mod:`perf4sight.report.render`. Units: latency in ms, memory in MiB, importances in
percent (mean absolute change of the prediction when one feature is shuffled).
"""
from __future__ import annotations

import re
from collections import defaultdict
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from perf4sight.features.aggregate import FEATURE_NAMES, feature_matrix, network_features
from perf4sight.fingerprint.evaluate import choose_groups, grouped_cv, row_family
from perf4sight.fingerprint.fit import LATENCY_COLUMN, device_kind, hold_native_conv
from perf4sight.fingerprint.predict import Fingerprint
from perf4sight.fingerprint.select import can_nest, held_out_fitter, nested_cv, recorded_candidate
from perf4sight.fingerprint.storage import stored_predictions
from perf4sight.fingerprint.trees import term_features
from perf4sight.ir.schema import NetworkDescription
from perf4sight.ir.shapes import shape_text
from perf4sight.profiling.results import batch_size_of, number

__all__ = ["DeviceData", "FamilySummary", "Curve", "summarise_measurements", "measured_vs_predicted",
           "feature_sensitivity", "prediction_curve", "matching_measurements", "batch_grid"]


@dataclass
class FamilySummary:
    """What was measured for one network family on one device."""

    family: str
    variants: int
    batch_sizes: list[int]          # every batch size tried, ascending
    ok: int
    oom: int
    other: int                      # skipped_after_oom + error rows
    largest_ok: tuple[int, int]     # (min, max) over variants of the largest batch that ran
    first_oom: tuple[int, int] | None  # (min, max) over variants of the smallest batch that ran out of memory


@dataclass
class Curve:
    """Predicted target against batch size for one (network, device), with measured points."""

    network: str
    device: str
    batch_sizes: np.ndarray
    value: np.ndarray
    low: np.ndarray
    high: np.ndarray
    measured_bs: np.ndarray = field(default_factory=lambda: np.zeros(0))
    measured: np.ndarray = field(default_factory=lambda: np.zeros(0))
    measured_label: str = ""
    input_shape: str = ""  # "CxHxW" the network was described at, where the compared devices' shapes differ


@dataclass
class DeviceData:
    """One device's part of the report."""

    name: str
    fingerprint: Fingerprint
    rows: list[dict[str, str]]
    families: list[FamilySummary]
    scatter: dict[str, tuple[np.ndarray, np.ndarray, str]]   # target -> (measured, predicted, how)
    sensitivity: dict[str, dict[str, float]]                 # target -> feature -> % change
    max_batch: dict[str, int | None] = field(default_factory=dict)  # compare network -> largest fitting batch
    networks: list[str] = field(default_factory=list)  # of its rows, those with a description here (``families``')

    @property
    def metadata(self) -> dict[str, Any]:
        return self.fingerprint.metadata


def summarise_measurements(rows: list[dict[str, str]],
                           descs: dict[str, NetworkDescription] | None = None) -> list[FamilySummary]:
    """Per family: variants, batch sizes, status counts and the out-of-memory boundary. A row without a ``family``
    cell (a CSV made by hand) is of its network description's family (``descs``), as the fit folds it
    (``evaluate.row_family``), else of its network's name."""
    by_family: dict[str, list[dict[str, str]]] = defaultdict(list)
    for r in rows:
        desc = (descs or {}).get(r["network"])
        by_family[row_family(r, desc.family if desc is not None else r["network"])].append(r)
    out = []
    for fam, rs in sorted(by_family.items()):
        largest: dict[str, int] = {}
        first_oom: dict[str, int] = {}
        for r in rs:
            b, net = batch_size_of(r), r["network"]
            if r["status"] == "ok":
                largest[net] = max(largest.get(net, 0), b)
            elif r["status"] == "oom":
                first_oom[net] = min(first_oom.get(net, b), b)
        counts = defaultdict(int)
        for r in rs:
            counts[r["status"]] += 1
        lo = list(largest.values()) or [0]
        out.append(FamilySummary(
            family=fam, variants=len({r["network"] for r in rs}),
            batch_sizes=sorted({batch_size_of(r) for r in rs}),
            ok=counts["ok"], oom=counts["oom"], other=counts["skipped_after_oom"] + counts["error"],
            largest_ok=(min(lo), max(lo)),
            first_oom=(min(first_oom.values()), max(first_oom.values())) if first_oom else None))
    return out


def _ok_rows(rows: list[dict[str, str]], descs: dict[str, NetworkDescription],
             column: str) -> list[dict[str, str]]:
    return [r for r in rows if r["status"] == "ok" and r["network"] in descs and (number(r.get(column)) or 0) > 0]


def _stored_held_out(fp: Fingerprint, target: str, rs: list[dict[str, str]],
                     column: str) -> tuple[np.ndarray, np.ndarray, str] | None:
    """The fingerprint stage's out-of-fold predictions for rows ``rs`` (``storage.stored_predictions``)."""
    pred = stored_predictions(fp.held_out.get(target, {}), rs, column)
    if pred is None:
        return None
    grouping = fp.metadata.get("accuracy", {}).get(target, {}).get("grouping", "family")
    return np.array([float(r[column]) for r in rs]), pred, f"held out, leave-one-{grouping}-out"


def measured_vs_predicted(fp: Fingerprint, rows: list[dict[str, str]], descs: dict[str, NetworkDescription],
                          held_out: bool = True) -> dict[str, tuple[np.ndarray, np.ndarray, str]]:
    """target -> (measured, predicted, how) over the device's ``ok`` rows with a description.

    With ``held_out`` (default) the predictions are out-of-fold: the ones the fingerprint stage
    stored (``held_out.csv``) when they cover every row, else refitted with one network family (or
    variant) held out at a time, as the fingerprint stage evaluates it: the model form chosen again
    without each held-out group where the stage's table is nested, else the stored model's form (its
    analytic terms, tree correction or not, the leaf size and ensemble settings from the metadata);
    ``how`` names the folds. Without it, or when the rows hold a single network, they are the stored
    fingerprint's in-sample predictions.
    """
    columns = {"latency": LATENCY_COLUMN, "memory": fp.metadata.get("memory_target", "peak_rss_mb")}
    settings = fp.metadata.get("model", {})
    feats: dict[str, Any] = {}
    out = {}
    for target, col in columns.items():
        rs = _ok_rows(rows, descs, col)
        if not rs:
            out[target] = (np.zeros(0), np.zeros(0), "no data")
            continue
        stored = _stored_held_out(fp, target, rs, col) if held_out else None
        if stored is not None:
            out[target] = stored
            continue
        for r in rs:
            if r["network"] not in feats:
                feats[r["network"]] = network_features(descs[r["network"]], fp.runtime)
        from perf4sight.features.alloc_trace import ensure_simulation  # memory model may replay the allocator
        ensure_simulation([feats[n] for n in {r["network"] for r in rs}], fp.models[target].terms,
                          fp.memory_replay)
        F = hold_native_conv(feature_matrix([feats[r["network"]] for r in rs], [batch_size_of(r) for r in rs]),
                             fp.runtime)
        y = np.array([float(r[col]) for r in rs])
        groups, grouping = choose_groups(np.array([row_family(r, feats[r["network"]].family) for r in rs]),
                                         np.array([r["network"] for r in rs]))
        if held_out and len(set(groups.tolist())) >= 2:
            acc = fp.metadata.get("accuracy", {}).get(target, {})
            chosen = acc.get("selection") or {}
            name, n_est = str(settings.get("model", "extra-trees")), int(settings.get("n_estimators", 200))
            seed, leaf = int(settings.get("seed", 0)), int(settings.get("min_samples_leaf", 1))
            if acc.get("nested") and can_nest(groups):  # as the fingerprint stage's table
                # whether a row ran out of memory, as the stage's fit reads it: without one, a fold of two families
                # keeps the preferred form's sum without its ceiling (select_candidate)
                saturates = any(r["status"] == "oom" and r["network"] in descs for r in rows)
                cv, _ = nested_cv(target, F, y, groups, grouping, name, n_est, leaf, seed, chosen.get("preferred"),
                                  device_kind(columns["memory"]), saturates)
            else:
                form = recorded_candidate(chosen)
                cv = grouped_cv(F, y, groups, grouping, held_out_fitter(target, form, name, n_est, leaf, seed,
                                                                        seen=grouping != "family"))
            out[target] = (y, cv.predictions, f"held out, leave-one-{grouping}-out")
        else:
            out[target] = (y, fp.models[target].predict(F), "in-sample")
    return out


def _model_features(fp: Fingerprint, target: str) -> list[str]:
    m = fp.models[target]
    by_target = fp.metadata.get("tree_features_by_target", {})  # older fingerprints: one list for both targets
    tree = list(by_target.get(target, fp.metadata.get("tree_features", []))) if m.corrected else []
    names = term_features(m.terms) + tree
    return [n for n in dict.fromkeys(names) if n in FEATURE_NAMES]


def feature_sensitivity(fp: Fingerprint, rows: list[dict[str, str]], descs: dict[str, NetworkDescription],
                        max_rows: int = 400, seed: int = 0) -> dict[str, dict[str, float]]:
    """How much each target's prediction leans on each input feature, in percent.

    Permutation sensitivity: shuffle one feature column across the device's measured
    configurations and report the mean ``|log(shuffled / original prediction)|`` x 100. It
    covers the analytic terms and the tree correction together, needs only the stored arrays,
    and is comparable between devices. Features: the model's linear terms plus its tree inputs.
    """
    rng = np.random.default_rng(seed)
    rs = [r for r in rows if r["status"] == "ok" and r["network"] in descs]
    if len(rs) > max_rows:
        rs = [rs[i] for i in sorted(rng.choice(len(rs), max_rows, replace=False))]
    if not rs:
        return {t: {} for t in fp.models}
    feats = {n: network_features(descs[n], fp.runtime) for n in {r["network"] for r in rs}}
    from perf4sight.features.alloc_trace import ensure_simulation  # memory model may replay the allocator
    ensure_simulation(list(feats.values()), fp.models["memory"].terms if "memory" in fp.models else (),
                      fp.memory_replay)
    F = feature_matrix([feats[r["network"]] for r in rs], [batch_size_of(r) for r in rs])
    out: dict[str, dict[str, float]] = {}
    for target, model in fp.models.items():
        base = np.maximum(model.predict(F), 1e-12)
        scores = {}
        for name in _model_features(fp, target):
            col = FEATURE_NAMES.index(name)
            Fp = F.copy()
            Fp[:, col] = F[rng.permutation(len(F)), col]
            scores[name] = float(100 * np.mean(np.abs(np.log(np.maximum(model.predict(Fp), 1e-12) / base))))
        out[target] = scores
    return out


def batch_grid(limit: int) -> np.ndarray:
    """Batch sizes 1..``limit`` spaced about evenly on a log axis (at most ~40 points)."""
    limit = max(2, int(limit))
    return np.unique(np.round(np.geomspace(1, limit, 40)).astype(int))


def shape_label(shape: Any) -> str:
    """An input shape as the measurement CSV writes it, ``CxHxW`` ("?" where unknown)."""
    return shape_text(shape) or "?"


def training_shapes_label(metadata: dict[str, Any]) -> str:
    """A fingerprint's training input shapes (``input_shapes``, else ``input_shape``), ``CxHxW`` each, the one most
    of its networks share first ("?" where unknown)."""
    shapes = metadata.get("input_shapes") or [metadata.get("input_shape")]
    return ", ".join(shape_label(s) for s in shapes)


def _key(s: str) -> str:
    return re.sub(r"[^a-z0-9]", "", s.lower())


def matching_measurements(desc: NetworkDescription, rows: list[dict[str, str]],
                          descs: dict[str, NetworkDescription]) -> tuple[str, list[dict[str, str]]]:
    """The device's ``ok`` rows of the same architecture as ``desc`` (same name, or an unpruned
    variant of the same family with the same parameter count and input shape); (network, rows)."""
    shape = shape_label(desc.input_shape)
    want = _key(desc.network or desc.name)
    candidates: dict[str, list[dict[str, str]]] = defaultdict(list)
    for r in rows:
        if r["status"] != "ok" or r.get("input_shape") != shape:
            continue
        net = r["network"]
        if net == desc.name:
            candidates[net].append(r)
            continue
        fam, other = _key(r.get("family") or net), descs.get(net)
        if (fam and (want.startswith(fam) or fam.startswith(want)) and other is not None
                and (number(r.get("pruning_level")) or 0) == 0
                and abs(other.params - desc.params) <= 0.005 * max(desc.params, 1)):
            candidates[net].append(r)
    if not candidates:
        return "", []
    net = desc.name if desc.name in candidates else max(candidates, key=lambda n: len(candidates[n]))
    return net, candidates[net]


def prediction_curve(fp: Fingerprint, device: str, desc: NetworkDescription, target: str,
                     batch_sizes: np.ndarray, rows: list[dict[str, str]],
                     descs: dict[str, NetworkDescription]) -> Curve:
    """Predicted ``target`` (``latency`` ms or ``memory`` MiB) with its interval over ``batch_sizes``."""
    preds = fp.predict(desc, [int(b) for b in batch_sizes])
    key = "latency_ms" if target == "latency" else "memory_mb"
    curve = Curve(desc.name, device, np.asarray(batch_sizes),
                  np.array([p[key] for p in preds]), np.array([p[f"{key}_low"] for p in preds]),
                  np.array([p[f"{key}_high"] for p in preds]))
    col = LATENCY_COLUMN if target == "latency" else fp.metadata.get("memory_target", "peak_rss_mb")
    net, matched = matching_measurements(desc, rows, descs)
    pts = sorted((batch_size_of(r), float(r[col])) for r in matched if (number(r.get(col)) or 0) > 0)
    if pts:
        curve.measured_bs = np.array([p[0] for p in pts])
        curve.measured = np.array([p[1] for p in pts])
        curve.measured_label = net
    return curve
