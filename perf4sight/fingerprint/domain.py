"""What a fingerprint's training rows covered, and which queries fall outside it.

A tree correction is flat outside the range of its training rows, and a kind of layer no training
network had (depthwise convolutions when a device was profiled on ResNets only) has no learnt cost;
a trait every training network shared (a linear layer, which loads the BLAS library's context into
device memory) is folded into the constant. A query there is an extrapolation: the fit stores the
covered domain in the metadata (``training_domain``) and :func:`outside_notes` says, per query, where
it leaves it. Pure numpy on feature rows (columns :data:`FEATURE_NAMES`).
"""
from __future__ import annotations

from typing import Any, Callable, Sequence

import numpy as np

from perf4sight.features.aggregate import FEATURE_NAMES, NetworkFeatures, feature_matrix
from perf4sight.features.formulas import is_dilated
from perf4sight.fingerprint.trees import gemm_dominated

__all__ = ["training_domain", "op_kinds", "outside_notes", "query_notes", "domain_line", "outside_training_batches"]

#: Ranges stored and checked: key -> (what it is, display scale, display unit).
_RANGES: dict[str, tuple[str, float, str]] = {
    "batch_size": ("batch size", 1.0, ""),
    "macs_per_sample": ("MACs per sample", 1e9, " G"),
    "params": ("parameters", 1e6, " M"),
    # a depthwise cost learnt from networks with a sliver of depthwise work, carried to a mobile network where it
    # is a large part: on a CPU that over-predicted mobilenet_v2 threefold (docs/accuracy-notes.md)
    "depthwise_share": ("depthwise share of convolution MACs", 0.01, "%"),
}
#: A range not noted where the trait it measures was in no training network (the trait's own note says it).
_RANGE_TRAIT = {"depthwise_share": "depthwise"}
#: Traits a training network has or lacks: key -> (feature that is > 0 where it has it, or a test of feature rows,
#: the trait's name).
_TRAITS: dict[str, tuple[str | Callable[[np.ndarray], np.ndarray], str]] = {
    "depthwise": ("n_depthwise", "depthwise convolutions"),
    "grouped": ("grouped_macs", "grouped convolutions"),
    "linear": ("blas_context", "a linear layer (the BLAS library's context in device memory)"),
    "concat": ("n_cat", "concatenations"),
    "residual": ("n_add", "additions (residual branches)"),
    # a step-time cost learnt on convolution networks, carried to one whose work is matrix products: ViT's step
    # time read 33% off on a CPU (docs/accuracy-notes.md, "CPU: a transformer style in the generator")
    "gemm": (gemm_dominated, "linear layers doing most of the work (over half of the MACs, as in a transformer)"),
}
_SHORT = {"linear": "a linear layer", "gemm": "linear layers doing most of the work"}  # names in the summary line


def _has(F: np.ndarray, key: str) -> np.ndarray:
    """Which feature rows ``F`` have the trait ``key`` of :data:`_TRAITS`."""
    test = _TRAITS[key][0]
    return test(F) if callable(test) else F[:, FEATURE_NAMES.index(test)] > 0


def _column(F: np.ndarray, name: str) -> np.ndarray:
    if name == "macs_per_sample":
        return F[:, FEATURE_NAMES.index("macs")] / np.maximum(F[:, FEATURE_NAMES.index("batch_size")], 1.0)
    return F[:, FEATURE_NAMES.index(name)]


#: Ops with no note of their own when a query has one the training lacked: those that cost nothing (the input,
#: views; dropout, of elements or of channels, next to nothing) and those a trait of :data:`_TRAITS` already notes
#: (cat, add, linear).
_UNNOTED_OPS = {"input", "identity", "flatten", "reshape", "squeeze", "unsqueeze", "select", "narrow", "dropout",
                "dropout2d", "cat", "add", "linear"}


def _kind(node: Any) -> str:
    """A node's kind of layer: its op, a dilated convolution told apart (on this machine's CPU a dilated depthwise
    convolution took 5-12 times as long as the same one undilated: docs/accuracy-notes.md, "Segmentation networks")."""
    return "dilated conv2d" if is_dilated(node) else node.op


def op_kinds(descriptions: Sequence[Any]) -> list[str]:
    """The kinds of layer (:func:`_kind`: ``Node.op``, ``dilated conv2d`` apart) of ``descriptions``
    (``NetworkDescription``), sorted, without :data:`_UNNOTED_OPS`."""
    return sorted({_kind(n) for d in descriptions for n in d.nodes} - _UNNOTED_OPS)


def training_domain(F: np.ndarray, descriptions: Sequence[Any] = ()) -> dict[str, Any]:
    """The domain of training feature rows ``F``: ``ranges`` (key -> [min, max]), ``traits`` (key ->
    the values seen: [false], [true] or [false, true]) and, given the training networks' ``descriptions``,
    ``ops`` (:func:`op_kinds`: a query with another kind of layer has no learnt cost for it). JSON-able."""
    ranges = {k: [float(_column(F, k).min()), float(_column(F, k).max())] for k in _RANGES}
    traits = {k: sorted({bool(v) for v in _has(F, k)}) for k in _TRAITS}
    domain: dict[str, Any] = {"ranges": ranges, "traits": traits}
    if descriptions:
        domain["ops"] = op_kinds(descriptions)
    return domain


def _first(items: Sequence[str], limit: int = 4) -> str:
    """The first ``limit`` items joined, and how many more there are."""
    return ", ".join(items[:limit]) + (f" and {len(items) - limit} more" if len(items) > limit else "")


def _span(key: str, lo: float, hi: float) -> str:
    """A stored range in its display unit, e.g. ``0.069..4.09 G``."""
    _, scale, unit = _RANGES[key]
    if scale == 1.0 and float(lo).is_integer() and float(hi).is_integer():  # batch sizes: 8..1,024, not 8..1.02e+03
        return f"{int(lo):,}..{int(hi):,}{unit}"
    return f"{lo / scale:.3g}..{hi / scale:.3g}{unit}"


def outside_training_batches(metadata: dict[str, Any], batch_size: int | None) -> str:
    """The batch sizes of a fingerprint's training rows (``training_domain``, its ``metadata``'s), ``2..256``, where
    ``batch_size`` lies outside them (a largest batch found there is an extrapolation); '' where it is inside, is
    None or 0, or the rows' batch sizes are not stored."""
    span = ((metadata.get("training_domain") or {}).get("ranges") or {}).get("batch_size")
    if not batch_size or not span or span[0] <= batch_size <= span[1]:
        return ""
    return _span("batch_size", *span)


def outside_notes(domain: dict[str, Any] | None, F: np.ndarray, names: Sequence[str],
                  descriptions: Sequence[Any] = ()) -> list[str]:
    """One line per way the query rows ``F`` (network ``names[i]`` on row ``i``) leave ``domain``
    (:func:`training_domain` of the training rows); none when ``domain`` is empty (older fingerprints).
    ``descriptions``: the query networks, for the kinds of layer (``ops``) the training networks lacked."""
    if not domain or not len(F):
        return []
    names = np.asarray(names)
    notes: list[str] = []
    for key, seen in domain.get("traits", {}).items():
        if key not in _TRAITS or len(seen) != 1:
            continue
        trait = _TRAITS[key][1]
        odd = _has(F, key) != bool(seen[0])
        if odd.any():
            how = (f"without {trait}, which every training network had" if seen[0]
                   else f"with {trait}, which no training network had")
            notes.append(f"{_first(sorted(set(names[odd])))}: {how}")
    if "ops" in domain:
        by_new: dict[tuple[str, ...], list[str]] = {}  # the kinds a query lacks in training -> its networks
        for d in descriptions:
            new = tuple(op for op in op_kinds([d]) if op not in set(domain["ops"]))
            if new and d.name not in by_new.setdefault(new, []):
                by_new[new].append(d.name)
        notes += [f"{_first(sorted(nets))}: with {', '.join(new)} layers, which no training network had (no learnt "
                  "cost of their own)" for new, nets in by_new.items()]
    for key, (lo, hi) in domain.get("ranges", {}).items():
        if key not in _RANGES or domain.get("traits", {}).get(_RANGE_TRAIT.get(key, "")) == [False]:
            continue
        what, scale, unit = _RANGES[key]
        v = _column(F, key)
        odd = (v < lo) | (v > hi)
        if not odd.any():
            continue
        if key == "batch_size":
            odd_sizes = [str(int(b)) for b in sorted(set(v[odd].tolist()))]
            sizes = (", ".join(odd_sizes) if len(odd_sizes) <= 6  # a long sweep: its ends and how many
                     else f"{', '.join(odd_sizes[:2])}, ..., {odd_sizes[-1]} ({len(odd_sizes)} sizes)")
            notes.append(f"batch size {sizes}: outside the training rows' {_span(key, lo, hi)}")
        else:
            per_net = sorted(dict(zip(names[odd], v[odd])).items())
            vals = _first([f"{n} {x / scale:.3g}{unit}" for n, x in per_net])
            notes.append(f"{what} outside the training networks' {_span(key, lo, hi)}: {vals}")
    return notes


def domain_line(domain: dict[str, Any] | None) -> str:
    """The domain in one line for the fingerprint stage to print ('' when none was stored)."""
    if not domain:
        return ""
    spans = [f"{_RANGES[key][0]} {_span(key, lo, hi)}" for key, (lo, hi) in domain.get("ranges", {}).items()
             if key in _RANGES]
    share = {(False,): "none", (True,): "all", (False, True): "some"}
    traits = [f"{_SHORT.get(k, _TRAITS[k][1])} in {share[tuple(seen)]}" for k, seen in domain.get("traits", {}).items()
              if k in _TRAITS and tuple(seen) in share]
    if traits:
        traits[0] += " of the networks"
    return "training domain: " + ", ".join(spans) + ("; " + ", ".join(traits) if traits else "")


def query_notes(domain: dict[str, Any] | None, nets: Sequence[NetworkFeatures],
                batch_sizes: Sequence[int]) -> list[str]:
    """:func:`outside_notes` for every network of ``nets`` at every batch size of ``batch_sizes``."""
    F = feature_matrix([nf for nf in nets for _ in batch_sizes], [b for _ in nets for b in batch_sizes])
    return outside_notes(domain, F, [nf.name for nf in nets for _ in batch_sizes],
                         [nf.description for nf in nets if nf.description is not None])
