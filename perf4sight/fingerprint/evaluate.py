"""Accuracy of a fingerprint: grouped cross-validation and relative-error metrics.

Metrics are on relative error ``(predicted - measured) / measured``: MAPE and RMSPE in
percent, ``within10`` = share (percent) of predictions within +-10 %. Folds hold out one
group at a time — a network family (``resnet18`` with all its pruned variants) when the data
has several families, else one network variant.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

import numpy as np

__all__ = ["metrics", "grouped_cv", "CVResult", "choose_groups", "row_family"]


def metrics(y_true: np.ndarray, y_pred: np.ndarray) -> dict[str, float]:
    """``{"n", "mape", "rmspe", "within10"}`` (percent) of predictions against measurements."""
    y_true = np.asarray(y_true, dtype=float)
    rel = (np.asarray(y_pred, dtype=float) - y_true) / y_true
    if rel.size == 0:
        return {"n": 0, "mape": float("nan"), "rmspe": float("nan"), "within10": float("nan")}
    return {"n": int(rel.size), "mape": float(100 * np.mean(np.abs(rel))),
            "rmspe": float(100 * np.sqrt(np.mean(rel**2))), "within10": float(100 * np.mean(np.abs(rel) <= 0.10))}


def row_family(row: dict[str, Any], family: str) -> str:
    """The family a measurement row is folded in: its ``family`` cell, else ``family``, its network description's
    (:attr:`~perf4sight.ir.schema.NetworkDescription.family`; a CSV made by hand may leave the cell empty: by the
    network's own name each pruning level would be a family of its own, its siblings in training when it is held
    out)."""
    return str(row.get("family") or family)


def choose_groups(families: np.ndarray, networks: np.ndarray) -> tuple[np.ndarray, str]:
    """Fold labels and their kind: by family when >= 2 families, else by network variant."""
    if len(set(families.tolist())) >= 2:
        return families, "family"
    return networks, "network"


@dataclass
class CVResult:
    """Out-of-fold predictions plus the per-group and overall accuracy table."""

    predictions: np.ndarray
    per_group: dict[str, dict[str, float]]
    overall: dict[str, float]
    grouping: str


def grouped_cv(F: np.ndarray, y: np.ndarray, groups: np.ndarray, grouping: str,
               fit_predict: Callable[[np.ndarray, np.ndarray, np.ndarray], np.ndarray]) -> CVResult:
    """Leave-one-group-out: ``fit_predict(F_train, y_train, F_test)`` for each group held out."""
    pred = np.full(len(y), np.nan)
    per: dict[str, dict[str, float]] = {}
    labels = sorted(set(groups.tolist()))
    if len(labels) < 2:
        return CVResult(pred, {}, metrics(np.array([]), np.array([])), grouping)
    for g in labels:
        test = groups == g
        pred[test] = fit_predict(F[~test], y[~test], F[test])
        per[str(g)] = metrics(y[test], pred[test])
    return CVResult(pred, per, metrics(y, pred), grouping)
