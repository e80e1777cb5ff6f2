"""Cross-validated accuracy of the GNN against the trees and their ensemble, and its printed table.

Folds are the trees' (:func:`perf4sight.fingerprint.evaluate.grouped_cv`: leave-one-family-out,
or leave-one-network-out where the rows with the target's figure have a single family: chosen per target,
``accuracy.<target>.grouping``); the GNN is retrained once per held-out group. The
trees' out-of-fold predictions are the trees fingerprint's own (its ``held_out.csv``) where it was
fitted on exactly these rows, else the trees refitted here as the fingerprint stage fits them; the
ensemble is their geometric mean. Metrics (MAPE etc.) are percent of relative error on latency (ms)
and memory (MiB); ``best`` names the predictor with the lowest MAPE per target. Prediction
intervals: group-conformal quantiles of out-of-fold ``log(measured / predicted)``
(:func:`perf4sight.fingerprint.select.group_conformal`), with the coverage of each held-out group
measured from the other groups' band (``interval_coverage_held_out``, percent).
"""
from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING, Any

import numpy as np

from perf4sight.config import PREDICTORS
from perf4sight.features.aggregate import feature_matrix
from perf4sight.fingerprint.evaluate import CVResult, grouped_cv, metrics
from perf4sight.fingerprint.fit import LATENCY_COLUMN, choice_rule, hold_native_conv
from perf4sight.fingerprint.gnn_forward import predict_latency_memory
from perf4sight.fingerprint.gnn_samples import TARGETS, Samples
from perf4sight.fingerprint.select import (can_nest, group_conformal, held_out_coverage, nested_cv,
                                           select_candidate)
from perf4sight.fingerprint.storage import HeldOut, stored_predictions

if TYPE_CHECKING:  # training imports torch: only when a fit runs (the accuracy table is read without it)
    from perf4sight.fingerprint.gnn_train import TrainSettings

__all__ = ["cross_validate", "gnn_accuracy_lines"]


def _trees_features(s: Samples, trees_cfg: Any, op_prices: dict[str, dict[int, float]] | None = None) -> np.ndarray:
    """The trees' feature rows of ``s``: as the GNN's, plus the allocator replay when the fingerprint uses it and the
    device's measured op prices where it has some (``op_prices``, as ``fit_fingerprint`` reads them), on copies: the
    GNN's own graph-level features stay those it is served with at prediction time."""
    simulate = getattr(trees_cfg, "simulate_memory", False)
    if not simulate and not op_prices:
        return s.F
    from perf4sight.features.aggregate import network_features
    from perf4sight.features.alloc_trace import attach_simulation
    runtime = s.runtime.with_op_prices(op_prices)
    feats = {}
    for name, t in s.templates.items():
        nf = network_features(t.features.description, runtime) if op_prices else dataclasses.replace(t.features)
        if simulate and nf.description is not None:
            attach_simulation(nf, nf.description, s.memory_replay)
        feats[name] = nf
    return hold_native_conv(feature_matrix([feats[n] for n in s.nets], s.bs), runtime)  # as s.F and the fit hold it


def _stored_trees_cv(s: Samples, sel: np.ndarray, col: str, y: np.ndarray, groups: np.ndarray, grouping: str,
                     table: dict[tuple[str, int, float], float]) -> CVResult | None:
    """The trees fingerprint's own out-of-fold predictions (its ``held_out.csv``) for samples ``sel``,
    or None unless it was fitted on exactly these rows (``storage.stored_predictions``)."""
    pred = stored_predictions(table, [s.ok[i] for i in sel], col)
    if pred is None:
        return None
    return CVResult(pred, {str(g): metrics(y[groups == g], pred[groups == g]) for g in dict.fromkeys(groups.tolist())},
                    metrics(y, pred), grouping)


def cross_validate(s: Samples, st: TrainSettings, trees_cfg: Any, coverage: float, base_kind: str,
                   trees_held_out: HeldOut | None = None,
                   op_prices: dict[str, dict[int, float]] | None = None) -> dict[str, Any]:
    """Out-of-fold accuracy of the GNN, the trees and their geometric mean on the same folds. The trees'
    figures are the trees fingerprint's own (``trees_held_out``) where it covers the samples, else the
    trees refitted here as the fingerprint stage fits them (with the device's ``op_prices``, where measured)."""
    from perf4sight.fingerprint.gnn_train import train_on_samples
    # (kind of group, held-out group) -> GNN predictions for all samples in it
    cache: dict[tuple[str, str], np.ndarray] = {}

    def gnn_fold(test_idx: np.ndarray, labels: np.ndarray, grouping: str) -> np.ndarray:
        key = (grouping, str(labels[test_idx[0]]))
        if key not in cache:
            held = labels == key[1]  # every sample of the group, those without this target's figure too
            model, norm, base, _ = train_on_samples(s, np.nonzero(~held)[0], st, base_kind)
            cache[key] = np.full((len(s.nets), 2), np.nan)
            cache[key][held] = predict_latency_memory(model, norm, base, s.tmpl(np.nonzero(held)[0]), s.bs[held])
        return cache[key][test_idx]

    acc: dict[str, Any] = {"grouping": s.grouping}
    intervals: dict[str, dict[str, list[float]]] = {"gnn": {}, "ensemble": {}}
    F_trees = _trees_features(s, trees_cfg, op_prices)
    for j, target in enumerate(TARGETS):
        sel = np.nonzero(np.isfinite(s.Y[:, j]))[0]
        labels, grouping = s.target_groups(j)  # per target, as the trees': by network where one family has figures
        y, groups = s.measured[sel, j], labels[sel]  # as measured, as the trees fingerprint reads them
        cv_g = grouped_cv(sel[:, None], y, groups, grouping,
                          lambda a, b, c, j=j, lab=labels, kind=grouping: gnn_fold(c[:, 0], lab, kind)[:, j])
        col = LATENCY_COLUMN if target == "latency" else s.mem_col
        cv_t = _stored_trees_cv(s, sel, col, y, groups, grouping, (trees_held_out or {}).get(target, {}))
        acc.setdefault("trees_source", {})[target] = "the trees fingerprint's held_out.csv" if cv_t else "refitted"
        if cv_t is None:  # the trees evaluated as the fingerprint stage evaluates them (nested where it is)
            args = (target, F_trees[sel], y, groups, grouping, trees_cfg.model, int(trees_cfg.n_estimators),
                    int(trees_cfg.min_samples_leaf), int(trees_cfg.seed))
            kind, prefer = choice_rule(target, s.mem_col)
            saturates = bool(s.oom)  # as fit_fingerprint: no row out of memory, no ceiling to place
            if can_nest(groups):
                cv_t, _ = nested_cv(*args, prefer=prefer, kind=kind, saturates=saturates)
            else:
                _, cv_t, _ = select_candidate(*args, prefer=prefer, kind=kind, saturates=saturates)
        ens = np.sqrt(cv_g.predictions * cv_t.predictions)
        res = {"gnn": cv_g, "trees": cv_t}
        entry: dict[str, Any] = {k: {"overall": v.overall, "per_group": v.per_group} for k, v in res.items()}
        entry["ensemble"] = {"overall": metrics(y, ens) if len(cv_g.per_group) else cv_g.overall,
                             "per_group": {g: metrics(y[groups == g], ens[groups == g]) for g in cv_g.per_group}}
        mapes = {k: entry[k]["overall"]["mape"] for k in PREDICTORS}
        finite = {k: v for k, v in mapes.items() if np.isfinite(v)}
        entry["best"] = min(finite, key=finite.get) if finite else None
        entry["grouping"] = grouping
        acc[target] = entry
        for kind, pred in (("gnn", cv_g.predictions), ("trees", cv_t.predictions), ("ensemble", ens)):
            log_ratio = np.log(y / pred)
            if kind in intervals:  # the trees' own band lives in their fingerprint
                intervals[kind][target] = group_conformal(log_ratio, groups, coverage)
            entry[kind]["interval_coverage_held_out"] = held_out_coverage(log_ratio, groups, coverage)
    return {"accuracy": acc, "intervals": intervals}


def gnn_accuracy_lines(metadata: dict[str, Any]) -> list[str]:
    """Table of out-of-fold MAPE per held-out group for trees, GNN and ensemble (for the stage to print)."""
    acc = metadata.get("accuracy", {})
    lines = []
    for target in TARGETS:
        e = acc.get(target)
        if not e:
            continue
        source = acc.get("trees_source", {}).get(target)
        lines.append(f"{target}: MAPE % per held-out {e.get('grouping', acc.get('grouping'))} (best: {e.get('best')})"
                     + (f"; trees: {source}" if source else ""))
        groups = list(e["gnn"]["per_group"]) + ["all"]
        w = max([24] + [len(g) + 2 for g in groups])  # generated families have long names
        lines.append(f"  {'held out':<{w}}" + "".join(f"{k:>10}" for k in PREDICTORS))
        for g in groups:
            vals = [(e[k]["overall"] if g == "all" else e[k]["per_group"].get(g, {})).get("mape", float("nan"))
                    for k in PREDICTORS]
            lines.append(f"  {g:<{w}}" + "".join(f"{v:>10.1f}" for v in vals))
        cov = [e.get(k, {}).get("interval_coverage_held_out") for k in PREDICTORS]
        lines.append(f"  {'90% band, held-out cov.':<{w}}"
                     + "".join(f"{'–' if v is None else f'{v:.1f}':>10}" for v in cov))
    if metadata.get("drift_reference"):
        from perf4sight.fingerprint.drift import drift_line
        lines.append(drift_line(metadata["drift_reference"]))
    if metadata.get("training_domain"):
        from perf4sight.fingerprint.domain import domain_line
        lines.append(domain_line(metadata["training_domain"]))
    return lines
