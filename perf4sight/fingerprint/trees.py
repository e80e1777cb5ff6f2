"""Tree-ensemble regressors stored as plain arrays, and the per-target model built on them.

A fitted scikit-learn ExtraTrees / RandomForest / GradientBoosting regressor is converted to
:class:`TreeEnsemble`: flat numpy arrays (children, split feature, threshold, leaf value) that
predict with a vectorised traversal and save to ``.npz`` without pickle, so a fingerprint
neither breaks on the next scikit-learn release nor runs code when loaded.

:class:`TargetModel` predicts one target (latency in ms or memory in MiB) as
``analytic(x) * exp(trees(x))``: a non-negative linear model over physically meaningful
terms (fitted with a relative-error loss) times a tree correction learnt on ``log(y / analytic)``.

An analytic part may also be the *overlap* form, terms written ``host... | device...``: the host
(Python and kernel-launch) time and the device (GPU kernel) time are two non-negative linear sums,
and the step takes their smooth maximum ``(host^p + device^p)^(1/p)`` with ``p`` =
:data:`OVERLAP_P`, because the host issues kernels while the device runs earlier ones: a step
with little work per kernel is host-bound (its time flat in the batch size), a large one is
device-bound. Fitted on log(predicted / measured) with non-negative coefficients.

A memory form may end with the term ``ceiling``: the linear sum (the *demand*) then saturates at a
learnt ceiling ``C`` (MiB), as the smooth minimum ``(demand^-p + C^-p)^(-1/p)`` with ``p`` =
:data:`CEILING_P`, because a device's used memory cannot grow past what it has: on a Jetson's
unified memory the last batch sizes before an out-of-memory page out (zram) instead, and the measured
figure flattens under the ceiling while the step's demand keeps growing. The capacity test
(``fits``) compares the demand, not the saturated figure. Fitted on log(predicted / measured) too.

A sum may also bend once: the term :data:`HINGE` adds a non-negative slope times the allocator replay's reserved
peak above a knot (the next term, :data:`KNOT`, whose coefficient is the knot itself, MiB), so the sum grows
more slowly in the reserved memory below the knot than above it. On a Jetson the used memory minus the
reserved memory shrinks by some 350 MiB over the first 2 GB reserved and then holds. The knot is chosen on a
grid of the training rows' reserved peaks (:data:`KNOT_QUANTILES`), the lowest loss of the form's own fit.

A linear sum's term may be *exact* (:data:`EXACT_TERMS`): a size already in the target's unit, whose coefficient is
held at 1 rather than fitted. The parameter copies (weights, gradients, optimiser state) are such a size: the bytes
they take do not depend on how the rest of the step's memory scales.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Callable

import numpy as np

from perf4sight.config import TREE_MODELS
from perf4sight.errors import UserError
from perf4sight.features.aggregate import CONTEXT_FEATURES, FEATURE_NAMES, LATENCY_FEATURES

__all__ = ["TreeEnsemble", "TargetModel", "MeanModel", "Model", "make_regressor", "LINEAR_TERMS", "TREE_FEATURES",
           "TARGET_TREE_FEATURES", "tree_features", "geometric_mean", "MODELS",
           "OVERLAP", "OVERLAP_P", "CEILING", "CEILING_P", "HINGE", "KNOT", "KNOT_QUANTILES", "EXACT_TERMS",
           "term_features", "GEMM_SHARE", "gemm_dominated", "blind_to_linear_work"]

MODELS = TREE_MODELS

#: Analytic terms per target (feature names; "one" = constant). Fitted non-negative.
LINEAR_TERMS: dict[str, tuple[str, ...]] = {
    "memory": ("one", "mem_analytic_mb"),  # constant (context, runtime) + scaled analytic estimate
    # step time: compute, activation traffic, launches, per-sample work, the optimizer's pass over the
    # parameters (its state and update read and write every parameter once per step, whatever the batch size),
    # the 1x1 convolutions a one-thread CPU step runs outside oneDNN at small batches (features/aggregate.py;
    # held at 0 on other devices), the dilated depthwise convolutions' MACs (a cost of their own on this CPU), and
    # the ops between the convolutions at the prices the device's profile measured (0 where it measured none)
    "latency": ("one", "dense_macs", "depthwise_macs", "activation_elems", "kernels", "batch_size", "param_bytes",
                "native_conv_macs", "dilated_dw_macs", "priced_ops_ms"),
}
#: Inputs of the tree correction (log1p-transformed). Scale-free shape descriptors plus size.
TREE_FEATURES: tuple[str, ...] = (
    "batch_size", "macs", "saved_bytes", "max_activation_bytes", "params", "kernels", "depth",
    "depthwise_share", "odd_channel_share", "intensity", "mean_conv_channels", "branch_nodes", "mem_analytic_mb",
)
#: Tree inputs per target: :data:`TREE_FEATURES`, and for step time also the work per kernel launch
#: (``lt_work_per_launch``, FLOPs of the step / its launches): where the step sits between launch-bound (many
#: small kernels, the GPU idle between them) and device-bound, which the smooth host|device maximum only
#: approximates; it varies with the batch size and the pruning alike, so it carries over to a family not seen.
#: Appended last, so trees fitted on :data:`TREE_FEATURES` alone read the same columns.
TARGET_TREE_FEATURES: dict[str, tuple[str, ...]] = {
    "memory": TREE_FEATURES,
    "latency": TREE_FEATURES + ("lt_work_per_launch",),
}


def make_regressor(model: str, n_estimators: int, min_samples_leaf: int, seed: int) -> Any:
    """A scikit-learn regressor for ``model`` (one of :data:`MODELS`)."""
    from sklearn.ensemble import ExtraTreesRegressor, GradientBoostingRegressor, RandomForestRegressor
    if model == "extra-trees":
        return ExtraTreesRegressor(n_estimators=n_estimators, min_samples_leaf=min_samples_leaf,
                                   random_state=seed, n_jobs=1)
    if model == "random-forest":
        return RandomForestRegressor(n_estimators=n_estimators, min_samples_leaf=min_samples_leaf,
                                     random_state=seed, n_jobs=1)
    if model == "gradient-boosting":
        return GradientBoostingRegressor(n_estimators=n_estimators, min_samples_leaf=min_samples_leaf,
                                         max_depth=3, learning_rate=0.05, subsample=0.8, random_state=seed)
    raise UserError(f"[fingerprint] model '{model}' is not one of {', '.join(MODELS)}")


#: The fields of a :class:`TreeEnsemble` stored as ``.npz`` arrays (the others are JSON-able scalars).
_ARRAY_FIELDS = ("left", "right", "feature", "threshold", "value", "roots")


@dataclass
class TreeEnsemble:
    """Trees as flat arrays. Prediction = ``init + scale * combine(leaf values)``.

    ``combine`` is the mean over trees (forests) or the sum (boosting). Leaves point to themselves,
    so ``max_depth`` traversal steps land every sample on its leaf.
    """

    left: np.ndarray       # int64, global node index; leaves: own index
    right: np.ndarray      # int64
    feature: np.ndarray    # int64; leaves: 0
    threshold: np.ndarray  # float64; go left when x <= threshold (x compared as float32)
    value: np.ndarray      # float64 leaf (and node) value
    roots: np.ndarray      # int64, root node of each tree
    max_depth: int
    combine: str = "mean"  # mean | sum
    init: float = 0.0
    scale: float = 1.0

    @classmethod
    def from_sklearn(cls, reg: Any) -> "TreeEnsemble":
        """Convert a fitted ExtraTrees / RandomForest / GradientBoosting regressor."""
        if hasattr(reg, "estimators_") and isinstance(reg.estimators_, np.ndarray):  # boosting
            trees = [e.tree_ for e in reg.estimators_[:, 0]]
            combine, init, scale = "sum", float(np.ravel(reg.init_.constant_)[0]), float(reg.learning_rate)
        else:
            trees = [e.tree_ for e in reg.estimators_]
            combine, init, scale = "mean", 0.0, 1.0
        parts: dict[str, list[np.ndarray]] = {k: [] for k in ("left", "right", "feature", "threshold", "value")}
        roots, offset, depth = [], 0, 0
        for t in trees:
            n = t.node_count
            idx = np.arange(n) + offset
            leaf = t.children_left == -1
            parts["left"].append(np.where(leaf, idx, t.children_left + offset))
            parts["right"].append(np.where(leaf, idx, t.children_right + offset))
            parts["feature"].append(np.where(leaf, 0, t.feature).astype(np.int64))
            parts["threshold"].append(np.where(leaf, np.inf, t.threshold))
            parts["value"].append(t.value[:, 0, 0].astype(np.float64))
            roots.append(offset)
            offset += n
            depth = max(depth, int(t.max_depth))
        cat = {k: np.concatenate(v) for k, v in parts.items()}
        return cls(cat["left"].astype(np.int64), cat["right"].astype(np.int64), cat["feature"],
                   cat["threshold"].astype(np.float64), cat["value"], np.asarray(roots, dtype=np.int64),
                   depth, combine, init, scale)

    def leaf_values(self, X: np.ndarray) -> np.ndarray:
        """Per-tree outputs, shape (n_samples, n_trees), in the unit of what the trees were fitted to (a target
        model's correction: a log ratio)."""
        Xf = np.asarray(X, dtype=np.float32).astype(np.float64)
        out = np.empty((Xf.shape[0], len(self.roots)))
        step = 256  # rows per pass: keeps the (rows x trees) index arrays in cache
        for start in range(0, Xf.shape[0], step):
            xc = Xf[start:start + step]
            rows = np.arange(xc.shape[0])[:, None]
            node = np.broadcast_to(self.roots, (xc.shape[0], len(self.roots))).copy()
            for _ in range(self.max_depth):
                go_left = xc[rows, self.feature[node]] <= self.threshold[node]
                node = np.where(go_left, self.left[node], self.right[node])
            out[start:start + step] = self.value[node]
        return out

    def predict(self, X: np.ndarray) -> np.ndarray:
        """Ensemble prediction, shape (n_samples,), in the unit of :meth:`leaf_values`."""
        v = self.leaf_values(X)
        agg = v.mean(axis=1) if self.combine == "mean" else v.sum(axis=1)
        return self.init + self.scale * agg

    def to_arrays(self, prefix: str) -> tuple[dict[str, np.ndarray], dict[str, Any]]:
        """(numeric arrays for ``.npz``, JSON-able scalars)."""
        arrays = {f"{prefix}.{k}": getattr(self, k) for k in _ARRAY_FIELDS}
        return arrays, {"max_depth": self.max_depth, "combine": self.combine, "init": self.init, "scale": self.scale}

    @classmethod
    def from_arrays(cls, prefix: str, arrays: Any, meta: dict[str, Any], width: int | None = None) -> "TreeEnsemble":
        """The ensemble stored under ``prefix``; ``ValueError`` where its arrays could not have been written by
        :meth:`from_sklearn` (a file edited or damaged): node arrays of one length, indices inside them (features
        inside ``width``, the inputs' count), finite values."""
        get = {k: np.asarray(arrays[f"{prefix}.{k}"]) for k in _ARRAY_FIELDS}
        ensemble = cls(**get, max_depth=int(meta["max_depth"]), combine=str(meta["combine"]),
                       init=float(meta["init"]), scale=float(meta["scale"]))
        n = len(ensemble.left)
        if any(a.ndim != 1 for a in get.values()) or {len(get[k]) for k in _ARRAY_FIELDS if k != "roots"} != {n}:
            raise ValueError(f"{prefix}: its node arrays are not of one length, one dimension each")
        for k in ("left", "right", "roots", "feature"):
            top = width if k == "feature" and width is not None else n
            if get[k].dtype.kind not in "iu" or (len(get[k]) and not (0 <= get[k].min() and get[k].max() < top)):
                raise ValueError(f"{prefix}.{k}: not indices in 0..{top - 1}")
        if not (np.all(np.isfinite(ensemble.value)) and not np.any(np.isnan(ensemble.threshold))
                and math.isfinite(ensemble.init) and math.isfinite(ensemble.scale)):
            raise ValueError(f"{prefix}: a value, threshold or scale is not a number")
        if ensemble.combine not in ("mean", "sum"):  # any other word was read as a sum
            raise ValueError(f"{prefix}: combine {ensemble.combine!r} is not mean or sum")
        if not 0 <= ensemble.max_depth <= n or not ensemble._leaves_within_depth():
            raise ValueError(f"{prefix}: max_depth {ensemble.max_depth} does not take every tree to its leaves")
        return ensemble

    def _leaves_within_depth(self) -> bool:
        """Whether :attr:`max_depth` steps from the roots land on leaves on every path (a leaf points to itself), as
        :meth:`leaf_values` takes them to: fewer stop on an inner node, whose value is read as a leaf's."""
        frontier = self.roots
        for _ in range(self.max_depth):
            inner = frontier[self.left[frontier] != frontier]
            frontier = np.concatenate([self.left[inner], self.right[inner]])
            if len(frontier) > len(self.left):  # more nodes than there are: the arrays do not make trees
                return False
        return bool(np.all(self.left[frontier] == frontier) and np.all(self.right[frontier] == frontier))


#: Separator of the host and device sums in an overlap form's terms; the smooth maximum's exponent.
OVERLAP, OVERLAP_P = "|", 3.0
#: Last term of a saturating form (its coefficient is the ceiling, MiB); the smooth minimum's exponent.
CEILING, CEILING_P = "ceiling", 16.0
#: A hinge term's name (its column is :data:`HINGED`), the knot term's that follows it, and the grid the knot is
#: chosen on (quantiles of the hinged column over the training rows).
HINGE, KNOT, HINGED = "sim_reserved_mb over knot", "knot", "sim_reserved_mb"
#: While the knot is searched: the hinge's and the knot's columns once the hinge is applied at a grid point, plain
#: linear terms (any name the form's other terms do not use).
FIXED_HINGE = "hinge at a fixed knot"
KNOT_QUANTILES = np.linspace(0.05, 0.8, 16)
#: Terms whose coefficient is 1, not fitted (MiB that need no scale: ``aggregate.COPIES_FEATURES``); only in a plain
#: linear sum (no overlap, ceiling or hinge).
EXACT_TERMS = frozenset({"param_copies_mb"})


def term_features(terms: tuple[str, ...]) -> list[str]:
    """The feature columns analytic ``terms`` read, each once (a hinge reads :data:`HINGED`; the constant, the
    ceiling, the knot and the overlap separator read none)."""
    names = [HINGED if t == HINGE else t for t in terms if t not in ("one", OVERLAP, CEILING, KNOT)]
    return list(dict.fromkeys(names))


def _columns(names: tuple[str, ...]) -> list[int]:
    return [FEATURE_NAMES.index(n) for n in names]


def _linear_design(F: np.ndarray, terms: tuple[str, ...]) -> np.ndarray:
    """One column per term (the ceiling's and the knot's a column of ones: their coefficients are the ceiling and
    the knot themselves; a hinge's the column it bends)."""
    def column(t: str) -> np.ndarray:
        if t in ("one", CEILING, KNOT):
            return np.ones(len(F))
        return F[:, FEATURE_NAMES.index(HINGED if t == HINGE else t)]
    return np.column_stack([column(t) for t in terms if t != OVERLAP])


def _hinged(A: np.ndarray, h: int, knot: float) -> np.ndarray:
    """Design rows ``A`` with the hinge's column ``h`` replaced by its excess over ``knot`` and the knot's column
    (``h + 1``) zeroed: a plain linear design."""
    out = A.copy()
    out[:, h] = np.maximum(A[:, h] - knot, 0.0)
    out[:, h + 1] = 0.0
    return out


def _row_sums(A: np.ndarray, coef: np.ndarray) -> np.ndarray:
    """``A @ coef``, each row summed term by term in the terms' order, so a row's sum is the same bits whatever the
    other rows: a matrix-vector product's BLAS kernel sums a row in an order that depends on how many rows there are
    (a network's predicted figures moved by 4e-16 with the rest of a query)."""
    out = np.zeros(len(A))
    for j in range(A.shape[1]):
        out += A[:, j] * coef[j]
    return out


#: A linear sum of design rows and coefficients: :func:`_row_sums` where a fingerprint predicts; the matrix product
#: (:data:`FIT_SUMS`) where a form is fitted, whose rows are a fixed set: the least-squares search follows the last
#: bits of its residuals, and with row sums there too the TX2 benchmark's held-out figures moved by up to 0.6 points
Sums = Callable[[np.ndarray, np.ndarray], np.ndarray]
FIT_SUMS: Sums = np.dot


def _linear_sum(A: np.ndarray, coef: np.ndarray, terms: tuple[str, ...], sums: Sums = _row_sums) -> np.ndarray:
    """``A @ coef`` (by ``sums``), the hinge term (if any) bent at its knot."""
    if HINGE in terms:
        h = terms.index(HINGE)
        return sums(_hinged(A, h, float(coef[h + 1])), coef)
    return sums(A, coef)


def _demand(A: np.ndarray, coef: np.ndarray, terms: tuple[str, ...], sums: Sums = _row_sums) -> np.ndarray:
    """A saturating form's linear sum before the ceiling (the whole analytic value of other forms)."""
    if CEILING in terms:
        return _linear_sum(A[:, :-1], coef[:-1], terms[:-1], sums)
    return _combine(A, coef, terms, sums)


def _combine(A: np.ndarray, coef: np.ndarray, terms: tuple[str, ...], sums: Sums = _row_sums) -> np.ndarray:
    """The analytic value of design rows ``A``: a linear sum, the overlap form's smooth maximum, or the
    saturating form's smooth minimum of the linear sum and the ceiling (each sum by ``sums``)."""
    if CEILING in terms:
        demand, ceiling = np.maximum(_demand(A, coef, terms, sums), 1e-9), max(float(coef[-1]), 1e-9)
        return (demand ** -CEILING_P + ceiling ** -CEILING_P) ** (-1.0 / CEILING_P)
    if OVERLAP not in terms:
        return _linear_sum(A, coef, terms, sums)
    k = terms.index(OVERLAP)
    host, device = sums(A[:, :k], coef[:k]), sums(A[:, k:], coef[k:])
    return (host ** OVERLAP_P + device ** OVERLAP_P) ** (1.0 / OVERLAP_P)


#: The log residuals of a form's fit and their Jacobian, both functions of the scaled coefficients ``u`` that
#: :func:`scipy.optimize.least_squares` moves.
Problem = tuple[Callable[[np.ndarray], np.ndarray], Callable[[np.ndarray], np.ndarray]]


def _log_residual(A: np.ndarray, y: np.ndarray, terms: tuple[str, ...], mask: np.ndarray,
                  scale: np.ndarray) -> Callable[[np.ndarray], np.ndarray]:
    """``log(predicted / y)`` of a form's analytic value at coefficients ``where(mask, u, 0) / scale``."""
    def resid(u: np.ndarray) -> np.ndarray:
        return np.log(np.maximum(_combine(A, np.where(mask, u, 0.0) / scale, terms, FIT_SUMS), 1e-12) / y)
    return resid


def overlap_problem(A: np.ndarray, y: np.ndarray, terms: tuple[str, ...], mask: np.ndarray,
                    scale: np.ndarray) -> Problem:
    """The overlap form's ``log(predicted / y)`` at coefficients ``where(mask, u, 0) / scale``, and its exact
    Jacobian: the smooth maximum's log moves with each sum by sum^(P-1) / (host^P + device^P)."""
    k = terms.index(OVERLAP)

    def jac(u: np.ndarray) -> np.ndarray:
        coef = np.where(mask, u, 0.0) / scale
        host, device = A[:, :k] @ coef[:k], A[:, k:] @ coef[k:]
        total = np.maximum(host ** OVERLAP_P + device ** OVERLAP_P, 1e-300)
        J = np.column_stack([(host ** (OVERLAP_P - 1) / total)[:, None] * A[:, :k],
                             (device ** (OVERLAP_P - 1) / total)[:, None] * A[:, k:]])
        return J * (mask / scale)
    return _log_residual(A, y, terms, mask, scale), jac


def ceiling_problem(A: np.ndarray, y: np.ndarray, terms: tuple[str, ...], mask: np.ndarray,
                    scale: np.ndarray) -> Problem:
    """The saturating form's ``log(predicted / y)`` (its demand a plain linear sum: a hinge is bent before, in
    :func:`_fit_sum`) at coefficients ``where(mask, u, 0) / scale``, and its exact Jacobian: the smooth minimum's
    log moves with the demand's log by the weight 1 / (1 + (demand / ceiling)^P), with the ceiling's by the rest."""
    if HINGE in terms:
        raise ValueError(f"the saturating form's Jacobian is for a linear demand, bend the hinge first: {terms}")

    def jac(u: np.ndarray) -> np.ndarray:
        coef = np.where(mask, u, 0.0) / scale
        raw = A[:, :-1] @ coef[:-1]
        demand, ceiling = np.maximum(raw, 1e-9), max(float(coef[-1]), 1e-9)
        with np.errstate(over="ignore"):
            w = 1.0 / (1.0 + (demand / ceiling) ** CEILING_P)
        d_demand = np.where(raw > 1e-9, w / demand, 0.0)
        d_ceiling = (1.0 - w) / ceiling if coef[-1] > 1e-9 else np.zeros(len(A))
        return np.column_stack([d_demand[:, None] * A[:, :-1], d_ceiling]) * (mask / scale)
    return _log_residual(A, y, terms, mask, scale), jac


def _fit_overlap(A: np.ndarray, y: np.ndarray, terms: tuple[str, ...]) -> np.ndarray:
    """Non-negative coefficients of the overlap form minimising sum(log(predicted / y)^2).
    A column that is zero on every training row (e.g. depthwise work when no training network has
    any) keeps a zero coefficient, as in the linear fit."""
    from scipy.optimize import least_squares
    col_scale = np.abs(A).max(axis=0)
    seen = col_scale > 0
    scale = np.where(seen, col_scale, 1.0) / float(np.median(y))
    resid, jac = overlap_problem(A, y, terms, seen, scale)
    sol = least_squares(resid, np.full(A.shape[1], 0.3), jac=jac, bounds=(0.0, np.inf)).x
    return np.where(seen, sol, 0.0) / scale


def _fit_ceiling(A: np.ndarray, y: np.ndarray, terms: tuple[str, ...], free: np.ndarray) -> np.ndarray:
    """Non-negative coefficients of the saturating form (the last one the ceiling) minimising
    sum(log(predicted / y)^2), started from the linear fit and a ceiling above every training figure.
    Columns not ``free``, or zero on every training row, keep a zero coefficient, as in the other fits."""
    from scipy.optimize import least_squares
    seen = np.abs(A[:, :-1]).max(axis=0)
    keep = np.append(free[:-1] & (seen > 0), True)
    linear = _fit_linear(A[:, :-1], y, keep[:-1])
    col_scale = np.append(np.where(seen > 0, seen, 1.0), 1.0) / float(np.median(y))
    start = np.append(linear, 2.0 * float(y.max())) * col_scale
    resid, jac = ceiling_problem(A, y, terms, keep, col_scale)
    sol = least_squares(resid, start, jac=jac, bounds=(0.0, np.inf)).x
    return np.where(keep, sol, 0.0) / col_scale


def _fit_linear(A: np.ndarray, y: np.ndarray, free: np.ndarray, exact: np.ndarray | None = None) -> np.ndarray:
    """Non-negative ``c`` minimising sum(((A c - y) / y)^2), columns not ``free`` held at zero and ``exact`` ones
    at one."""
    from scipy.optimize import nnls  # fitting only: prediction does without scipy (0.4 s to import)
    exact = np.zeros(A.shape[1], dtype=bool) if exact is None else exact
    free = free & ~exact
    col_scale = np.maximum(np.abs(A).max(axis=0), 1e-12)
    sol, _ = nnls((A[:, free] / col_scale[free]) / y[:, None], 1.0 - A[:, exact].sum(axis=1) / y)
    coef = np.where(exact, 1.0, 0.0)
    coef[free] = sol / col_scale[free]
    return coef


def _fit_sum(A: np.ndarray, y: np.ndarray, terms: tuple[str, ...], free: np.ndarray) -> np.ndarray:
    """Non-negative coefficients of a linear or saturating form (columns not ``free`` held at zero); with a hinge,
    the knot is the grid point (:data:`KNOT_QUANTILES` of the hinged column) whose fit has the lowest
    sum(log(predicted / y)^2)."""
    if HINGE not in terms:
        return _fit_ceiling(A, y, terms, free) if CEILING in terms else _fit_linear(A, y, free)
    h = terms.index(HINGE)
    plain = tuple(FIXED_HINGE if t in (HINGE, KNOT) else t for t in terms)  # the same form, the hinge fixed
    best: tuple[float, np.ndarray] = (np.inf, np.zeros(A.shape[1]))
    for knot in np.unique(np.quantile(A[:, h], KNOT_QUANTILES)):
        Ak = _hinged(A, h, float(knot))
        coef = _fit_sum(Ak, y, plain, free)
        loss = float(np.sum(np.log(np.maximum(_combine(Ak, coef, plain, FIT_SUMS), 1e-12) / y) ** 2))
        if loss < best[0]:
            coef[h + 1] = knot
            best = (loss, coef)
    return best[1]


def tree_features(target: str | None = None) -> tuple[str, ...]:
    """The tree correction's input features for ``target`` (:data:`TARGET_TREE_FEATURES`; others and None:
    :data:`TREE_FEATURES`)."""
    return TARGET_TREE_FEATURES.get(target or "", TREE_FEATURES)


def tree_inputs(F: np.ndarray, target: str | None = None) -> np.ndarray:
    """The tree correction's inputs from full feature rows: log1p of :func:`tree_features` (``target``)."""
    return np.log1p(np.maximum(F[:, _columns(tree_features(target))], 0.0))


@dataclass
class TargetModel:
    """``analytic * exp(correction)`` for one target; ``correction`` may be None (analytic only)."""

    target: str
    terms: tuple[str, ...]
    coef: np.ndarray
    correction: TreeEnsemble | None

    @classmethod
    def fit(cls, target: str, F: np.ndarray, y: np.ndarray, model: str = "extra-trees",
            n_estimators: int = 200, min_samples_leaf: int = 1, seed: int = 0,
            correct: bool = True, terms: tuple[str, ...] | None = None) -> "TargetModel":
        """Fit on feature rows ``F`` (columns :data:`FEATURE_NAMES`) and positive targets ``y``;
        ``terms`` overrides the analytic terms (default :data:`LINEAR_TERMS`[target])."""
        terms = tuple(terms) if terms else LINEAR_TERMS[target]
        A = _linear_design(F, terms)
        exact = np.array([t in EXACT_TERMS for t in terms])
        if exact.any() and {OVERLAP, HINGE, CEILING}.intersection(terms):
            raise ValueError(f"an exact term ({', '.join(EXACT_TERMS)}) is for a plain linear sum: {terms}")
        if OVERLAP in terms:
            coef = _fit_overlap(A, y, terms)
        else:
            # a 0/1 context flag with one value on every training row is the constant again: its share
            # of the constant cannot be told apart, so it keeps a zero coefficient (the constant takes it)
            free = np.array([not (t in CONTEXT_FEATURES and np.ptp(A[:, j]) == 0) for j, t in enumerate(terms)])
            coef = _fit_linear(A, y, free, exact) if exact.any() else _fit_sum(A, y, terms, free)
        tm = cls(target, terms, coef, None)
        if correct:
            resid = np.log(y / np.maximum(_combine(A, coef, terms, FIT_SUMS), 1e-9))
            reg = make_regressor(model, n_estimators, min_samples_leaf, seed)
            reg.fit(tree_inputs(F, target).astype(np.float32), resid)
            tm.correction = TreeEnsemble.from_sklearn(reg)
        return tm

    def analytic(self, F: np.ndarray) -> np.ndarray:
        """The analytic part alone (same unit as the target)."""
        return _combine(_linear_design(F, self.terms), self.coef, self.terms)

    def demand(self, F: np.ndarray) -> np.ndarray:
        """The analytic part before a saturating form's ceiling (= :meth:`analytic` for other forms): what
        the capacity is compared with."""
        return _demand(_linear_design(F, self.terms), self.coef, self.terms)

    @property
    def corrected(self) -> bool:
        """Whether the model has a tree correction."""
        return self.correction is not None

    def predict(self, F: np.ndarray, trees: bool | np.ndarray = True) -> np.ndarray:
        """Predicted target (ms or MiB), shape (n,). ``trees``: whether the tree correction applies, for all rows
        or per row (a boolean array, see :meth:`trees_for`); where it does not, the analytic part alone."""
        base = np.maximum(self.analytic(F), 1e-9)
        if self.correction is None or not np.any(trees):
            return base
        return base * np.exp(np.where(trees, self.correction.predict(tree_inputs(F, self.target)), 0.0))

    def trees_for(self, families: list[str]) -> np.ndarray:
        """Which of these queries (one network family name per row) the tree correction applies to: all of them,
        for a single form (its trees were chosen for networks never seen too)."""
        return np.ones(len(families), dtype=bool)


def geometric_mean(parts: list[np.ndarray]) -> np.ndarray:
    """Element-wise geometric mean of positive arrays of one shape (each floored at 1e-9)."""
    return np.exp(np.mean([np.log(np.maximum(p, 1e-9)) for p in parts], axis=0))


@dataclass
class MeanModel:
    """The geometric mean of several :class:`TargetModel` s for one target, each fitted on the same rows (but
    :attr:`gemm_split`): a *mean form* (of one member: that model, its trees for the families seen). Its methods are
    theirs, averaged in log space. The members' tree corrections apply only to
    queries of the ``families`` its training rows came from (:meth:`trees_for`); for any other network the mean
    is of the members' analytic parts (docs/accuracy-notes.md, "CPU: tree corrections for the families seen")."""

    target: str
    members: list[TargetModel]
    #: the training rows' network families (sorted): the queries the members' tree corrections apply to
    families: tuple[str, ...] = ()
    #: fitted on rows of both kinds of work (:func:`gemm_dominated`): the members blind to a linear layer's work
    #: (:func:`blind_to_linear_work`) were fitted on the convolution-dominated rows and are left out of the mean
    #: for a matrix-product-dominated query
    gemm_split: bool = False

    @property
    def terms(self) -> tuple[str, ...]:
        """Every member's analytic terms, each once: what the members read of a feature row."""
        return tuple(dict.fromkeys(t for m in self.members for t in m.terms))

    @property
    def corrected(self) -> bool:
        """Whether any member has a tree correction."""
        return any(m.corrected for m in self.members)

    def _mean(self, F: np.ndarray, parts: list[np.ndarray]) -> np.ndarray:
        """The geometric mean of the members' ``parts`` (one array per member) for feature rows ``F``: for a
        matrix-product-dominated row of a :attr:`gemm_split` model, of the members that see a linear layer's work."""
        mean = geometric_mean(parts)
        if self.gemm_split:
            sees = [p for p, m in zip(parts, self.members) if not blind_to_linear_work(m.terms)]
            gemm = gemm_dominated(F)
            mean[gemm] = geometric_mean(sees)[gemm]
        return mean

    def analytic(self, F: np.ndarray) -> np.ndarray:
        """The members' analytic parts, averaged (same unit as the target)."""
        return self._mean(F, [m.analytic(F) for m in self.members])

    def demand(self, F: np.ndarray) -> np.ndarray:
        """The members' demands (:meth:`TargetModel.demand`), averaged."""
        return self._mean(F, [m.demand(F) for m in self.members])

    def predict(self, F: np.ndarray, trees: bool | np.ndarray = True, frozen: np.ndarray | None = None) -> np.ndarray:
        """Predicted target (ms or MiB), shape (n,); ``trees`` as :meth:`TargetModel.predict`'s (a query's is
        :meth:`trees_for` its family). ``frozen``: the rows of networks with frozen parameters, whose step time is
        the mean of the members that count the step's kernels one by one (:func:`sees_backward`), where some do and
        some do not."""
        parts = [m.predict(F, trees) for m in self.members]
        mean = self._mean(F, parts)
        if frozen is not None and self.target == "latency" and np.any(frozen):
            sees = [p for p, m in zip(parts, self.members) if sees_backward(m.terms)]
            if sees and len(sees) < len(parts):
                mean[frozen] = geometric_mean(sees)[frozen]
        return mean

    def trees_for(self, families: list[str]) -> np.ndarray:
        """Which of these queries (one network family name per row) the members' tree corrections apply to:
        those of a family in :attr:`families`."""
        return np.isin(np.asarray(families, dtype=str), np.asarray(self.families, dtype=str))


#: A fitted model of one target: one form, or the mean of several.
Model = TargetModel | MeanModel

#: A row whose linear layers do more than this share of its MACs is dominated by matrix products (a transformer's
#: encoder, ConvNeXt's per-pixel MLPs), not by convolutions.
GEMM_SHARE = 0.5
#: Terms that count convolutions' work and not a linear layer's, and terms that count a linear layer's work.
_CONV_WORK = frozenset({"dense_macs", "depthwise_macs", "grouped_macs"})
_LINEAR_WORK = frozenset({"linear_macs", "lt_gemm_macs", "lt_gemm_padded_macs", "lt_gemm_padded64_macs"})


def gemm_dominated(F: np.ndarray) -> np.ndarray:
    """Which feature rows ``F`` are dominated by matrix products: their linear layers' MACs are more than
    :data:`GEMM_SHARE` of their MACs."""
    return F[:, FEATURE_NAMES.index("linear_macs")] > GEMM_SHARE * F[:, FEATURE_NAMES.index("macs")]


def sees_backward(terms: tuple[str, ...] | None) -> bool:
    """Whether a step-time form of analytic ``terms`` (None: the default, :data:`LINEAR_TERMS`) counts the step's
    kernels one by one (a term of the kernel table, :data:`LATENCY_FEATURES`): a network with frozen parameters runs
    fewer backward kernels (none below its first trained layer, no weight gradient of a frozen weight), which those
    terms leave out, where a form of forward work (MACs, activations), fitted on networks trained whole, carries the
    whole backward with it (on this CPU's resnet18 with all but fc frozen: 0.17-0.35 of the whole network's step
    against about 1.0; measured 0.26-0.30)."""
    return bool(set(terms if terms is not None else LINEAR_TERMS["latency"]) & set(LATENCY_FEATURES))


def blind_to_linear_work(terms: tuple[str, ...] | None, target: str = "latency") -> bool:
    """Whether a form with analytic ``terms`` (None: ``target``'s default, :data:`LINEAR_TERMS`) counts convolutions'
    work but not a linear layer's: fitted on rows whose time is matrix products, it would give that time to its
    other terms (activations, launches) and carry it to every network (docs/accuracy-notes.md, "CPU: a transformer
    style in the generator")."""
    names = set(terms if terms is not None else LINEAR_TERMS[target])
    return bool(names & _CONV_WORK) and not names & _LINEAR_WORK
