"""Which networks a fingerprint counts as of a family it was trained on.

A family is named by a description's ``network`` (:attr:`NetworkDescription.family`: a pruned variant keeps its
source's name). A name alone can mislead: a description of another architecture may call itself ``resnet18``. So
a network counts as of a training family only when a training network had both its family name and its layer
structure (:attr:`NetworkDescription.structure`: the layers and their wiring, widths aside, the same at every
pruning level). Such a network gets a mean step-time form's tree corrections and the interval of networks of a
seen family; any other gets those of a family never seen.
"""
from __future__ import annotations

from collections.abc import Iterable, Mapping

__all__ = ["structures_by_family", "known_families"]


def structures_by_family(families: Iterable[str], structures: Iterable[str]) -> dict[str, list[str]]:
    """``{family: its networks' structure keys, sorted}`` of training networks (one family and key per network
    or row, in step)."""
    out: dict[str, set[str]] = {}
    for family, structure in zip(families, structures):
        out.setdefault(str(family), set()).add(str(structure))
    return {f: sorted(keys) for f, keys in sorted(out.items())}


def known_families(families: Iterable[str], structures: Iterable[str],
                   known: Mapping[str, Iterable[str]]) -> list[str]:
    """Each network's family name where ``known`` (:func:`structures_by_family` of the training networks) has
    that family with that structure, else "" (a family never seen, or a name whose layers differ from its
    training networks')."""
    keys = {str(f): set(map(str, s)) for f, s in known.items()}
    return [str(f) if str(s) in keys.get(str(f), ()) else "" for f, s in zip(families, structures)]
