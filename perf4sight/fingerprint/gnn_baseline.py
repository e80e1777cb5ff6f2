"""The analytic baseline the GNN corrects (``base="analytic"``), per target.

Per target, the trees' non-negative linear fit on network totals with a relative-error loss
(:class:`perf4sight.fingerprint.trees.TargetModel`, ``correct=False``): latency in ms, memory in
MiB. The GNN then learns ``log(measured / baseline)``. Stored in ``gnn.json`` as
``{target: {"terms": [...], "coef": [...]}}`` (``None`` with ``base="none"``: no baseline, the GNN
learns ``log(measured)``).
"""
from __future__ import annotations

from typing import Any

import numpy as np

from perf4sight.features.aggregate import FEATURE_NAMES
from perf4sight.fingerprint.gnn_samples import TARGETS

__all__ = ["AnalyticBaseline"]


class AnalyticBaseline:
    """Optional analytic baseline per target (the trees' non-negative linear fit on network totals,
    relative-error loss): the GNN then learns ``log(measured / baseline)``. ``None`` = no baseline."""

    def __init__(self, parts: dict[str, dict[str, Any]] | None):
        from perf4sight.fingerprint.trees import TargetModel
        self.parts = parts
        self.models = {t: TargetModel(t, tuple(p["terms"]), np.asarray(p["coef"], dtype=float), None)
                       for t, p in (parts or {}).items()}

    @classmethod
    def stored(cls, base: Any) -> "AnalyticBaseline":
        """The baseline ``gnn.json`` stores as ``base`` (``{"kind": "analytic" | "none", "models": parts}``);
        ``ValueError`` naming ``base`` where it has not the form the fit writes. Read at the first query before, an
        edited one ended it in a traceback, printed NaN figures, or predicted with no baseline at all."""
        if not isinstance(base, dict) or base.get("kind") not in ("analytic", "none"):
            raise ValueError("base is not an object of kind 'analytic' or 'none'")
        parts = base.get("models")
        if base["kind"] == "none":
            return cls(None)
        if not (isinstance(parts, dict) and set(parts) == set(TARGETS)
                and all(isinstance(p, dict) and isinstance(p.get("terms"), list) for p in parts.values())):
            raise ValueError(f"base.models is not an object of {' and '.join(TARGETS)}, each with its terms")
        try:
            made = cls(parts)
            probe = made.log(np.ones((1, len(FEATURE_NAMES))))  # every term known, a coefficient for each
        except (KeyError, ValueError, TypeError, IndexError) as exc:
            raise ValueError(f"base.models cannot be evaluated ({type(exc).__name__}: {exc})") from None
        if not np.all(np.isfinite(probe)):
            raise ValueError("base.models has coefficients that are not finite numbers")
        return made

    @classmethod
    def fit(cls, F: np.ndarray, Y: np.ndarray, kind: str) -> "AnalyticBaseline":
        """The baseline of ``kind`` ("none": no baseline) fitted to feature rows ``F`` and ``Y``, their [n, 2] log
        latency (ms) and log memory (MiB) (NaN where not measured)."""
        if kind == "none":
            return cls(None)
        from perf4sight.fingerprint.trees import TargetModel
        parts = {}
        for j, t in enumerate(TARGETS):
            ok = np.isfinite(Y[:, j])
            if not ok.any():  # a fold of the other target whose training rows have no figure of this one: 1 ms/MiB
                parts[t] = {"terms": ["one"], "coef": [1.0]}  # (what it predicts there is not read)
                continue
            tm = TargetModel.fit(t, F[ok], np.exp(Y[ok, j]), correct=False)
            parts[t] = {"terms": list(tm.terms), "coef": [float(c) for c in tm.coef]}
        return cls(parts)

    def log(self, F: np.ndarray) -> np.ndarray:
        """[n, 2] log of the baseline's latency (ms) and memory (MiB) of feature rows ``F`` (0 without one)."""
        if not self.models:
            return np.zeros((len(F), len(TARGETS)))
        # a row's analytic value is the same bits whatever the other rows (trees._row_sums), so a network's GNN
        # figures do not depend on what else a query asks about
        return np.column_stack([np.log(np.maximum(self.models[t].analytic(F), 1e-6)) for t in TARGETS])
