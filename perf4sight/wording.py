"""Wording of user-facing lines: counts with their noun in the right number. Standard library only."""
from __future__ import annotations

__all__ = ["plural", "named"]


def plural(count: int, noun: str, nouns: str = "") -> str:
    """``count`` and ``noun`` agreeing: ``plural(1, "network")`` is "1 network", ``plural(2, "network")``
    "2 networks"; ``nouns`` is the plural where it is not ``noun`` + "s" (``plural(2, "query", "queries")``)."""
    return f"{count} {noun if count == 1 else nouns or noun + 's'}"


def named(names: list[str], shown: int = 3) -> str:
    """The first ``shown`` of ``names``, comma-separated, with ", ..." when there are more."""
    return ", ".join(names[:shown]) + (", ..." if len(names) > shown else "")
