"""Model choice by grouped cross-validation, evaluation on random and network splits, group-conformal intervals.

A fingerprint's form for each target (analytic terms, tree correction or not, leaf size) is
picked among a few :data:`CANDIDATES` by leave-one-group-out cross-validation over the
*training* networks only: the score is the mean of the per-group MAPEs, so every held-out
family weighs the same whatever its row count. The chosen candidate's out-of-fold predictions
are the input of the prediction interval; the accuracy table comes from :func:`nested_cv`, which
chooses the form again without each held-out family, so that family takes no part in the choice.

A device kind may have a *preferred* form (:data:`PREFERRED`). On a GPU: for step time the
host|device overlap form (its kernels run asynchronously to the host that issues them); for memory
the form with every physical term (the allocator replay, the analytic estimate, the BLAS library's
context, the convolution workspaces, saturation near the device's limit), each term learnt with a
non-negative coefficient, so a term the device does not show costs little. On a CPU, for step time,
the *mean form*: the geometric mean of every step-time form, their tree corrections applied only to a network
of a family the training rows had (for any other, the members' analytic parts); for memory, the weights,
gradients and optimiser state at their exact bytes plus a slope on the rest of the analytic estimate, its tree
correction likewise for the families seen only (:data:`COPIES_FORM`). A preferred form is kept unless
the best-scoring form beats it by more than one standard error of their per-group MAPE differences (the
one-standard-error rule, paired over the held-out groups): with the three or four families a device has, a point
of CV score is within the noise of which family is out, and of the trees' seed. The CPU's two forms are kept
whatever the scores (:data:`KEPT_WHATEVER_THE_SCORES`): for step time, a form that beat the mean on the training
families read worse on the held-out one in every fold where the rule let one win (docs/accuracy-notes.md, "CPU:
the mean form kept whatever the scores"); for memory, what the exact copies gain shows only on networks larger
than the training ones, which no held-out fold of them is.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import Any, Callable

import numpy as np

from perf4sight.fingerprint.evaluate import CVResult, grouped_cv, metrics
from perf4sight.fingerprint.families import known_families, structures_by_family
from perf4sight.fingerprint.trees import (CEILING, HINGE, KNOT, OVERLAP, MeanModel, Model, TargetModel,
                                          blind_to_linear_work, gemm_dominated, term_features)

__all__ = ["Candidate", "CANDIDATES", "PREFERRED", "KEPT_WHATEVER_THE_SCORES", "RULE_ONE_SE", "RULE_KEPT", "MEAN_FORM",
           "COPIES_FORM",
           "fit_form", "recorded_candidate", "select_candidate", "nested_cv", "can_nest", "NESTED_MAX_GROUPS",
           "random_split_metrics", "NetworkSplit", "network_split", "seen_family_band", "group_conformal",
           "held_out_coverage", "analytic_parts", "held_out_fitter"]


@dataclass(frozen=True)
class Candidate:
    """One model form: analytic ``terms`` (None = default), tree ``correct``ion, ``leaf`` = min samples per leaf,
    offered on the device ``kinds`` named ("cpu", "gpu": see :data:`PREFERRED`)."""

    name: str
    terms: tuple[str, ...] | None = None
    correct: bool = True
    leaf: int | None = None  # None = the configured min_samples_leaf
    kinds: tuple[str, ...] = ("cpu", "gpu")
    #: a mean form: the geometric mean of these forms' predictions (its own terms, correction and leaf unused)
    members: tuple["Candidate", ...] = ()


OVERLAP_FORM = "host|device overlap (64-tiles) x trees, leaf 3"
FULL_MEMORY_FORM = "sim reserved, bent + analytic + BLAS context + workspace, saturating x trees"
# the last terms: 1x1 convolutions a one-thread CPU step runs outside oneDNN (held at 0 on other devices), the
# dilated depthwise convolutions' MACs (0 where no training network has one: the fit gives it no weight), and the
# ops between the convolutions at the device's measured prices (0 where its profile measured none)
_KERNEL_TERMS = ("one", "lt_gemm_padded_macs", "lt_dw_bytes", "lt_ew_bytes", "lt_launches", "batch_size",
                 "native_conv_macs", "dilated_dw_macs", "priced_ops_ms")
_KERNEL_TERMS_64 = ("one", "lt_gemm_padded64_macs", "lt_dw_bytes", "lt_ew_bytes", "lt_launches", "batch_size",
                    "native_conv_macs", "dilated_dw_macs", "priced_ops_ms")
#: host time (fixed + per-launch issue cost) overlapped with device time (GEMM work, bandwidth)
_OVERLAP_TERMS_64 = ("one", "lt_launches", OVERLAP, "lt_gemm_padded64_macs", "lt_dw_bytes", "lt_ew_bytes")

#: The step-time forms. The kernel-terms form first, as it is the one kept when there are too few groups to
#: choose (its per-kernel launch term carries over to families never seen; the FLOP-only forms did not).
_LATENCY_FORMS: tuple[Candidate, ...] = (
    Candidate("kernel terms (64-tiles) x trees, leaf 3", _KERNEL_TERMS_64, leaf=3),
    Candidate("analytic x trees"), Candidate("analytic only", correct=False),
    Candidate("analytic+odd/norm x trees", ("one", "dense_macs", "depthwise_macs", "activation_elems", "kernels",
                                            "batch_size", "odd_channel_macs", "norm_elems", "bytes_written",
                                            "priced_ops_ms")),
    Candidate("analytic x trees, leaf 3", leaf=3),
    # kernel-level terms (features/latency_terms.py): tile-padded GEMM work, bandwidth, launches;
    # always with the tree correction, so the fingerprint still reproduces its own training rows
    Candidate("kernel terms x trees, leaf 3", _KERNEL_TERMS, leaf=3),
    # host and device time overlap: a small step is launch-bound, a large one GEMM-bound
    Candidate(OVERLAP_FORM, _OVERLAP_TERMS_64, leaf=3),
)
#: The geometric mean of every step-time form the device's data can fit (docs/accuracy-notes.md, "CPU: the mean
#: of the step-time forms"): on a CPU the form that scores best over the training families often reads worse on a
#: family never seen than the mean of all of them does. The members keep their tree corrections, but these apply
#: only to a query of a family the training rows had (a pruning level the device never ran of a network it did):
#: learnt on the training families and carried over to a family unlike them they cost more than they brought
#: ("CPU: the generated networks' draw, and the tree corrections"; "CPU: tree corrections for the families seen").
#: Three forms share the analytic terms, so their analytic part weighs three sevenths.
MEAN_FORM = "geometric mean of the step-time forms, trees for the families seen"
#: A CPU's memory form: the weights, gradients and optimiser state at their exact bytes (``param_copies_mb``, held at
#: coefficient 1: trees.EXACT_TERMS) plus a constant and a slope on the rest of the analytic estimate, its tree
#: correction applied to the families seen only. The other memory forms scale the copies with everything else, by
#: a slope learnt where torch's own ~670 MiB and the activations dominate; on a network with many more parameters
#: than any training network that overshoots (docs/accuracy-notes.md, "CPU: the parameter copies at their bytes").
COPIES_FORM = "parameter copies + analytic rest, trees for the families seen"

CANDIDATES: dict[str, tuple[Candidate, ...]] = {
    "memory": (Candidate("analytic x trees"), Candidate("analytic only", correct=False),
               Candidate("split analytic x trees", ("one", "param_bytes", "saved_bytes", "max_activation_bytes",
                                                    "input_bytes")),
               Candidate("analytic x trees, leaf 3", leaf=3),
               # caching-allocator replay of the traced step (features/alloc_trace.py); skipped where not simulated
               Candidate("sim reserved x trees", ("one", "sim_reserved_mb")),
               Candidate("sim reserved + analytic x trees", ("one", "sim_reserved_mb", "mem_analytic_mb")),
               # the BLAS library's context (networks with a linear layer); only where training varies in it
               Candidate("sim reserved + analytic + BLAS context x trees",
                         ("one", "sim_reserved_mb", "mem_analytic_mb", "blas_context")),
               # plus the convolution workspaces the replay cannot see (features/aggregate.py, im2col_mb)
               Candidate("sim reserved + analytic + workspace x trees",
                         ("one", "sim_reserved_mb", "mem_analytic_mb", "im2col_mb")),
               Candidate("sim reserved + analytic + BLAS context + workspace x trees",
                         ("one", "sim_reserved_mb", "mem_analytic_mb", "blas_context", "im2col_mb")),
               # the same sums saturating at a learnt ceiling: used memory stops growing near the device's limit
               Candidate("sim reserved + analytic + workspace, saturating x trees",
                         ("one", "sim_reserved_mb", "mem_analytic_mb", "im2col_mb", CEILING)),
               Candidate("sim reserved + analytic + BLAS context + workspace, saturating x trees",
                         ("one", "sim_reserved_mb", "mem_analytic_mb", "blas_context", "im2col_mb", CEILING)),
               # on a GPU also with the replay's term bent at a learnt knot: a Jetson's used memory grows more slowly
               # than the allocator's reserved memory over the first gigabytes (a process's peak RSS on a CPU is
               # not read through that allocator)
               Candidate("sim reserved, bent + analytic + workspace, saturating x trees",
                         ("one", "sim_reserved_mb", HINGE, KNOT, "mem_analytic_mb", "im2col_mb", CEILING),
                         kinds=("gpu",)),
               Candidate(FULL_MEMORY_FORM,
                         ("one", "sim_reserved_mb", HINGE, KNOT, "mem_analytic_mb", "blas_context", "im2col_mb",
                          CEILING), kinds=("gpu",)),
               # a CPU's peak RSS: the parameter copies at their exact bytes and a slope on the rest of the analytic
               # estimate; a form of one member, so that its trees apply to the families seen only
               Candidate(COPIES_FORM, members=(Candidate("parameter copies + analytic rest x trees",
                                                         ("one", "param_copies_mb", "mem_analytic_rest_mb")),),
                         kinds=("cpu",))),
    "latency": _LATENCY_FORMS + (Candidate(MEAN_FORM, members=_LATENCY_FORMS, kinds=("cpu",)),),
}

#: (target, device kind) -> the form kept unless another is better by more than one standard error, or kept
#: always if it is in :data:`KEPT_WHATEVER_THE_SCORES` (device kind: "gpu" for the nvml and jetson backends and
#: imported GPU data, "cpu" for the cpu backend).
#: A CPU's memory (peak RSS) is preferred with the parameter copies at their bytes (:data:`COPIES_FORM`): the
#: held-out families of small networks score it a little worse than the best form (1.1 against 0.8% on the default
#: config's networks) but no fold of them shows the gain on a network with many more parameters (ViT-B/16: 1.3%,
#: where the form those scores chose read 13%). Its step time is a
#: sum of the kernels' times, which every step-time form models in its own way; which of them carries over to a
#: family never seen was left to chance by the scores (their ranking over the training families did not hold on the
#: held-out one), so the mean of them all is preferred. Where the preferred form's terms cannot be learnt (e.g. no
#: training network without a linear layer, or no replay), the lowest score wins.
PREFERRED: dict[tuple[str, str], str] = {("latency", "gpu"): OVERLAP_FORM, ("memory", "gpu"): FULL_MEMORY_FORM,
                                         ("latency", "cpu"): MEAN_FORM, ("memory", "cpu"): COPIES_FORM}
#: Preferred forms kept whatever the scores (no one-standard-error rule), the others scored beside them for the
#: record: the CPU's mean form and its memory form with exact parameter copies. Where one cannot be fitted (fewer
#: than two members' terms known for the mean form) the lowest score wins.
KEPT_WHATEVER_THE_SCORES = frozenset({MEAN_FORM, COPIES_FORM})
#: The choice rules as the metadata records them (``accuracy.<target>.selection.rule``).
RULE_ONE_SE = "lowest score; the preferred form unless beaten by more than one standard error"
RULE_KEPT = "the preferred form whatever the scores"


def fit_form(target: str, cand: Candidate, F: np.ndarray, y: np.ndarray, model: str, n_est: int, leaf: int,
             seed: int, families: Any = ()) -> Model:
    """``cand`` fitted on feature rows ``F`` and targets ``y`` (ms or MiB): a :class:`TargetModel`, or for a mean
    form the :class:`MeanModel` of its members, each fitted on the same rows (on rows of both kinds of work, those
    blind to a linear layer's work on the convolution rows: ``MeanModel.gemm_split``), its trees for the rows'
    ``families`` (one name per row); ``leaf`` where ``cand`` names none."""
    if cand.members:
        conv = ~gemm_dominated(F)
        blind = [blind_to_linear_work(m.terms, target) for m in cand.members]
        # rows of both kinds of work, and members of both kinds: the blind ones learn from the convolution rows
        split = bool(conv.sum() >= 3 and not conv.all() and any(blind) and not all(blind))
        return MeanModel(target, [fit_form(target, m, F[conv] if split and b else F, y[conv] if split and b else y,
                                           model, n_est, leaf, seed) for m, b in zip(cand.members, blind)],
                         tuple(sorted(set(str(f) for f in families))), split)
    lf = cand.leaf if cand.leaf is not None else leaf
    return TargetModel.fit(target, F, y, model, n_est, lf, seed, cand.correct, cand.terms)


def analytic_parts(cand: Candidate) -> Candidate:
    """A mean form (or a form of one member) whose members have no tree correction: what it predicts for a family
    never seen (its trees apply to the training families only, :class:`MeanModel`); any other form unchanged."""
    if not cand.members:
        return cand
    return replace(cand, members=tuple(replace(m, correct=False) for m in cand.members))


def held_out_fitter(target: str, cand: Candidate, model: str, n_est: int, leaf: int, seed: int, seen: bool):
    """``fit_predict(F_train, y_train, F_test)`` for :func:`grouped_cv`: ``cand`` fitted on the training rows,
    predicting the held-out ones as the fingerprint would. ``seen``: whether the held-out rows' family is among
    the training rows' (a held-out network of a family with other networks in training, or a random split of the
    rows), which a mean form's trees need; not so when a whole family is held out."""
    form = cand if seen else analytic_parts(cand)
    return lambda a, b, c: fit_form(target, form, a, b, model, n_est, leaf, seed).predict(c)


def _fitter(target: str, cand: Candidate, model: str, n_est: int, leaf: int, seed: int, grouping: str):
    """:func:`held_out_fitter` for folds that hold out one ``grouping`` ("family" or "network", the only family)."""
    return held_out_fitter(target, cand, model, n_est, leaf, seed, seen=grouping != "family")


def _fittable(F: np.ndarray, cand: Candidate) -> Candidate | None:
    """``cand`` if ``F`` can fit it (:func:`_has_terms`), else None; a mean form keeps only the members ``F`` can
    fit, and needs two of them (a form of one member, that one)."""
    if not cand.members:
        return cand if _has_terms(F, cand) else None
    members = tuple(m for m in cand.members if _has_terms(F, m))
    return replace(cand, members=members) if len(members) >= min(2, len(cand.members)) else None


def _has_terms(F: np.ndarray, cand: Candidate) -> bool:
    """Whether every analytic term of ``cand`` is known on all rows of ``F`` (finite; a simulated
    feature is 0 where the network was not simulated)."""
    from perf4sight.features.aggregate import CONTEXT_FEATURES, FEATURE_NAMES, SIM_FEATURES
    terms = term_features(cand.terms or ())
    sim = [FEATURE_NAMES.index(t) for t in terms if t in SIM_FEATURES]
    cols = [FEATURE_NAMES.index(t) for t in terms]
    # a 0/1 context term means something only where the rows have both values (else it is the constant)
    flags = [FEATURE_NAMES.index(t) for t in terms if t in CONTEXT_FEATURES]
    return bool(np.isfinite(F[:, cols]).all() and (F[:, sim] > 0).all()
                and all(len(np.unique(F[:, j])) == 2 for j in flags))


def select_candidate(target: str, F: np.ndarray, y: np.ndarray, groups: np.ndarray, grouping: str, model: str,
                     n_est: int, leaf: int, seed: int, candidates: tuple[Candidate, ...] | None = None,
                     prefer: str | None = None, kind: str | None = None,
                     saturates: bool = True) -> tuple[Candidate, CVResult, dict[str, float]]:
    """(chosen candidate, its grouped-CV result, score per candidate) — score = mean per-group MAPE (%).

    The best-scoring candidate is chosen, except that ``prefer`` (a candidate's name) is kept while the
    best beats it by no more than one standard error of their paired per-group MAPE differences, and always
    when it is one of :data:`KEPT_WHATEVER_THE_SCORES`. With
    fewer than 3 groups there is too little to choose on: ``prefer`` (or the first candidate) is kept.
    ``kind``: the device kind, whose candidates alone are scored (None: every candidate). ``saturates`` False (no
    row ran out of memory, so none came near the device's ceiling): a saturating ``prefer`` kept without a choice
    gives way to its sum without the ceiling (:func:`_unsaturated`), whose ceiling the rows could not place.
    """
    fittable = (_fittable(F, c) for c in (candidates or CANDIDATES[target]) if kind is None or kind in c.kinds)
    cands = tuple(c for c in fittable if c is not None)
    preferred = next((c for c in cands if c.name == prefer), None)
    if len(set(groups.tolist())) < 3:
        if not saturates and preferred is not None and CEILING in (preferred.terms or ()):
            preferred = _unsaturated(preferred, cands)
        cands = (preferred or cands[0],)
    results: dict[str, tuple[Candidate, CVResult]] = {}
    scores: dict[str, float] = {}
    for cand in cands:
        cv = grouped_cv(F, y, groups, grouping, _fitter(target, cand, model, n_est, leaf, seed, grouping))
        per = [m["mape"] for m in cv.per_group.values()]
        scores[cand.name] = float(np.mean(per)) if per else float("inf")
        results[cand.name] = (cand, cv)
    best = min(scores, key=scores.__getitem__)
    if preferred is not None and best != preferred.name:  # the preferred form was scored: it is in cands
        if preferred.name in KEPT_WHATEVER_THE_SCORES or _within_one_se(results[preferred.name][1], results[best][1]):
            best = preferred.name
    return results[best][0], results[best][1], scores


def _unsaturated(form: Candidate, cands: tuple[Candidate, ...]) -> Candidate | None:
    """The candidate of ``cands`` summing ``form``'s terms without its ceiling (and without the bend, which comes
    with it): "sim reserved + analytic + BLAS context + workspace x trees" for the preferred GPU form; else the first
    without a ceiling; None where there is none."""
    plain = tuple(t for t in form.terms or () if t not in (CEILING, HINGE, KNOT))
    return next((c for c in cands if c.terms == plain), None) or next(
        (c for c in cands if CEILING not in (c.terms or ())), None)


#: Above this many groups the accuracy table is not nested (its cost grows with the square of the groups).
NESTED_MAX_GROUPS = 8


def can_nest(groups: np.ndarray) -> bool:
    """Whether an accuracy table over these fold labels is nested (:func:`nested_cv`): 2 to
    :data:`NESTED_MAX_GROUPS` groups."""
    return 2 <= len(set(groups.tolist())) <= NESTED_MAX_GROUPS


def nested_cv(target: str, F: np.ndarray, y: np.ndarray, groups: np.ndarray, grouping: str, model: str,
              n_est: int, leaf: int, seed: int, prefer: str | None = None,
              kind: str | None = None, saturates: bool = True) -> tuple[CVResult, dict[str, str]]:
    """Leave-one-group-out accuracy of the whole procedure: for each held-out group the model form is
    chosen again by :func:`select_candidate` on the other groups alone, then fitted on them, so the
    held-out group takes no part in the choice (the table :func:`select_candidate` returns is a little
    optimistic: every group there helped choose the form). Returns the result and the form chosen per
    held-out group. With three groups the inner choice has two groups and keeps ``prefer`` (or the
    first candidate), as a fit on two families would; ``kind`` and ``saturates`` as :func:`select_candidate`'s."""
    forms: dict[str, str] = {}
    pred = np.full(len(y), np.nan)
    per: dict[str, dict[str, float]] = {}
    for g in sorted(set(groups.tolist())):
        test, train = groups == g, groups != g
        cand, _, _ = select_candidate(target, F[train], y[train], groups[train], grouping, model, n_est, leaf,
                                      seed, prefer=prefer, kind=kind, saturates=saturates)
        forms[str(g)] = cand.name
        pred[test] = _fitter(target, cand, model, n_est, leaf, seed, grouping)(F[train], y[train], F[test])
        per[str(g)] = metrics(y[test], pred[test])
    return CVResult(pred, per, metrics(y, pred), grouping), forms


def _within_one_se(kept: CVResult, best: CVResult) -> bool:
    """Whether ``kept``'s mean per-group MAPE exceeds ``best``'s by at most one standard error of the
    per-group differences (paired: the same groups held out)."""
    diff = np.array([kept.per_group[g]["mape"] - best.per_group[g]["mape"] for g in best.per_group])
    if len(diff) < 2 or not np.isfinite(diff).all():
        return False
    return bool(diff.mean() <= diff.std(ddof=1) / np.sqrt(len(diff)))


def random_split_metrics(target: str, cand: Candidate, F: np.ndarray, y: np.ndarray, model: str, n_est: int,
                         leaf: int, seed: int, folds: int = 5) -> dict[str, float]:
    """Accuracy (:func:`~perf4sight.fingerprint.evaluate.metrics`: errors in percent) on ``folds`` random splits of
    the rows (rows of a network may sit on both sides, so its family is taken as seen)."""
    if len(y) < 2 * folds:
        return metrics(np.array([]), np.array([]))
    order = np.random.default_rng(seed).permutation(len(y))
    pred = np.empty(len(y))
    fit = held_out_fitter(target, cand, model, n_est, leaf, seed, seen=True)
    for k in range(folds):
        test = np.zeros(len(y), dtype=bool)
        test[order[k::folds]] = True
        pred[test] = fit(F[~test], y[~test], F[test])
    return metrics(y, pred)


@dataclass(frozen=True)
class NetworkSplit:
    """Whole networks held out (:func:`network_split`): the accuracy table's entry, the out-of-fold predictions (ms
    or MiB, one per row) and which rows' family had another network in training (``seen``)."""

    metrics: dict[str, float]
    predictions: np.ndarray
    seen: np.ndarray


def network_split(target: str, cand: Candidate, F: np.ndarray, y: np.ndarray, networks: np.ndarray,
                  families: np.ndarray, structures: np.ndarray, model: str, n_est: int, leaf: int, seed: int,
                  folds: int = 5) -> NetworkSplit:
    """Networks held out in ``folds`` random groups of whole networks (every row of a network on one side), fitted
    and predicted as the fingerprint would (a mean form's trees for a held-out network of a family still in
    training with its structure, such as another pruning level, :mod:`families`): the case of a network the device
    never ran, of a family it did. ``networks``, ``families``, ``structures`` (layer structure keys): one per row.
    No rows predicted (NaN) with fewer than two networks."""
    names = np.array(sorted(set(networks.tolist())))
    pred, seen = np.full(len(y), np.nan), np.zeros(len(y), dtype=bool)
    if len(names) < 2:
        return NetworkSplit(metrics(np.array([]), np.array([])), pred, seen)
    fold_of = dict(zip(np.random.default_rng(seed).permutation(names).tolist(), range(len(names))))
    row_fold = np.array([fold_of[n] % min(folds, len(names)) for n in networks.tolist()])
    for k in sorted(set(row_fold.tolist())):
        test = row_fold == k
        fitted = fit_form(target, cand, F[~test], y[~test], model, n_est, leaf, seed, families[~test])
        known = known_families(families[test], structures[test],
                               structures_by_family(families[~test], structures[~test]))
        seen[test] = np.array(known, dtype=str) != ""
        pred[test] = fitted.predict(F[test], fitted.trees_for(known))
    return NetworkSplit(metrics(y, pred), pred, seen)


def seen_family_band(y: np.ndarray, split: NetworkSplit, networks: np.ndarray,
                     coverage: float) -> tuple[list[float] | None, float | None]:
    """The interval for a query of a family the training rows had, and its coverage on a held-out network (%).

    The band is central quantiles of log(measured / predicted) over the network split's rows whose family was in
    training, pooled (such a query is one more network of a family already seen, like those rows). A network's
    rows err together, so the quantiles' level starts at ``coverage`` and is raised (to at most 1: the whole range)
    until each network, checked against the band of the other networks' rows, is covered at ``coverage`` or more
    over all rows; that check is the coverage returned. The widest per-group bounds of :func:`group_conformal`
    would be set by the one worst of dozens of networks. (None, None) with fewer than 3 such networks; (None, that
    check at the whole range) where no level covers ``coverage`` (a network far outside the others' errors, as a few
    networks may leave it): such a query then gets the band of a family never seen, as without a band of its own."""
    r, g = np.log(y[split.seen] / split.predictions[split.seen]), networks[split.seen]
    if len(set(g.tolist())) < 3:
        return None, None
    for level in np.linspace(coverage, 1.0, 11):
        inside = _inside_when_left_out(r, g, lambda others, _: _central_band(others, level))
        if inside >= coverage * len(r):
            return _central_band(r, level), 100.0 * inside / len(r)
    return None, 100.0 * inside / len(r)


def _central_band(r: np.ndarray, coverage: float) -> list[float]:
    """[low, high]: the central ``coverage`` quantiles of ``r``, widened to hold 0 (the prediction itself)."""
    a = (1 - coverage) / 2
    return [min(0.0, float(np.quantile(r, a))), max(0.0, float(np.quantile(r, 1 - a)))]


def group_conformal(log_ratio: np.ndarray, groups: np.ndarray, coverage: float) -> list[float]:
    """Interval [lo, hi] on log(measured / predicted) from out-of-fold residuals, calibrated per group.

    Each group's own central ``coverage`` quantiles are taken and the widest bounds kept, so the band
    covers ``coverage`` of every held-out group seen in training, not only of the pooled rows. A new
    network family is one more draw among the G groups: the bounds are widened by (G + 1) / G, the
    finite-sample factor of split conformal prediction with G calibration groups. Split conformal
    needs G >= coverage / (1 - coverage) groups (9 for 90 %) to promise anything; with fewer, a new
    family's bias may fall on either side, so the band is made symmetric (the larger bound both ways).
    Where no group has 5 residuals (and so no quantile of its own) the pooled ``n`` residuals are the calibration set
    of split conformal prediction: the band is the ceil((n + 1) * coverage)-th smallest error size both ways, and
    where n is too small for that (under 9 at 90 %) the largest, widened by (n + 1) / n ([0, 0] only with none at
    all). Their central quantiles covered 79-84 % of new errors of their own distribution at 5-8 residuals.
    """
    ok = np.isfinite(log_ratio)
    r, g = log_ratio[ok], groups[ok]
    if not any(np.sum(g == lab) >= 5 for lab in set(g.tolist())):
        return _pooled_conformal(r, coverage)
    a = (1 - coverage) / 2
    lo, hi = float(np.quantile(r, a)), float(np.quantile(r, 1 - a))
    n_groups = 0
    for lab in set(g.tolist()):
        rg = r[g == lab]
        if rg.size >= 5:
            n_groups += 1
            lo, hi = min(lo, float(np.quantile(rg, a))), max(hi, float(np.quantile(rg, 1 - a)))
    widen = (n_groups + 1) / n_groups if n_groups else 1.0
    if n_groups < round(coverage / (1 - coverage), 6):  # round: 0.9 / 0.1 is 9.000000000000002 in floats
        lo, hi = min(lo, -hi), max(hi, -lo)
    return [min(0.0, lo * widen), max(0.0, hi * widen)]


def _pooled_conformal(r: np.ndarray, coverage: float) -> list[float]:
    """The symmetric split-conformal band of the residuals ``r`` at ``coverage`` (:func:`group_conformal` where no
    group has a quantile of its own)."""
    n = r.size
    if n == 0:
        return [0.0, 0.0]
    size = np.sort(np.abs(r))  # the band is symmetric: its score is the error's size
    k = math.ceil(round((n + 1) * coverage, 9))  # round: a whole product may read 9.000000000000002
    if k > n:  # no error lies that far out: the largest, widened
        return [-float(size[-1]) * (n + 1) / n, float(size[-1]) * (n + 1) / n]
    return [-float(size[k - 1]), float(size[k - 1])]


def held_out_coverage(log_ratio: np.ndarray, groups: np.ndarray, coverage: float) -> float | None:
    """Percent of each group's out-of-fold residuals inside the band :func:`group_conformal` makes from
    the *other* groups' residuals, pooled over rows: the interval's coverage on a family it never saw.
    None with fewer than 3 groups (a band from one group says little)."""
    ok = np.isfinite(log_ratio)
    r, g = log_ratio[ok], groups[ok]
    if len(set(g.tolist())) < 3:
        return None
    return 100.0 * _inside_when_left_out(r, g, lambda others, their_groups: group_conformal(others, their_groups,
                                                                                          coverage)) / len(r)


def _inside_when_left_out(r: np.ndarray, g: np.ndarray,
                          band: Callable[[np.ndarray, np.ndarray], list[float]]) -> int:
    """How many of the residuals ``r`` fall inside the band ``band(r_others, g_others)`` makes from the *other*
    groups' residuals, group by group (``g``: one group label per residual)."""
    inside = 0
    for lab in sorted(set(g.tolist())):
        lo, hi = band(r[g != lab], g[g != lab])
        rg = r[g == lab]
        inside += int(np.sum((rg >= lo) & (rg <= hi)))
    return inside


def _form_record(cand: Candidate) -> dict[str, Any]:
    record = {"chosen": cand.name, "terms": list(cand.terms) if cand.terms else None, "correct": cand.correct,
              "leaf": cand.leaf}
    if cand.members:
        record["members"] = [_form_record(m) for m in cand.members]
    return record


def describe_choice(cand: Candidate, scores: dict[str, float], prefer: str | None = None) -> dict[str, Any]:
    """JSON-able record of the choice for the metadata (a mean form's members under ``members``)."""
    rule = RULE_KEPT if prefer in KEPT_WHATEVER_THE_SCORES else RULE_ONE_SE
    return {**_form_record(cand), "cv_mean_group_mape": scores, "preferred": prefer, "rule": rule}


def recorded_candidate(selection: dict[str, Any]) -> Candidate:
    """The form a fingerprint's metadata records as chosen (``accuracy.<target>.selection``, see
    :func:`describe_choice`), to fit it again on other rows."""
    terms = selection.get("terms")
    return Candidate(str(selection.get("chosen", "")), tuple(terms) if terms else None,
                     bool(selection.get("correct", True)), selection.get("leaf"),
                     members=tuple(recorded_candidate(m) for m in selection.get("members") or ()))
