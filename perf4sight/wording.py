"""Wording of user-facing lines: counts with their noun in the right number. Standard library only."""
from __future__ import annotations

import json
import re
import shlex

__all__ = ["plural", "named", "shell_word", "shell_words", "device_table"]


def plural(count: int, noun: str, nouns: str = "") -> str:
    """``count`` and ``noun`` agreeing: ``plural(1, "network")`` is "1 network", ``plural(2, "network")``
    "2 networks"; ``nouns`` is the plural where it is not ``noun`` + "s" (``plural(2, "query", "queries")``)."""
    return f"{count} {noun if count == 1 else nouns or noun + 's'}"


def named(names: list[str], shown: int = 3) -> str:
    """The first ``shown`` of ``names``, comma-separated, with ", ..." when there are more."""
    return ", ".join(names[:shown]) + (", ..." if len(names) > shown else "")


def shell_word(text: object) -> str:
    """``text`` as one word of a command line the tool suggests: as it is where a shell reads it so (``tx2``), else
    quoted (``'jetson tx2'``), so that the line can be pasted as it is."""
    return shlex.quote(str(text))


def shell_words(texts: list) -> str:
    """Each of ``texts`` as :func:`shell_word`, space-separated: the words of ``--device A B``."""
    return " ".join(shell_word(t) for t in texts)


def device_table(name: str) -> str:
    """The config's table header of device ``name`` as TOML reads it: ``[devices.tx2]``, or ``[devices."jetson tx2"]``
    for a name that is no bare key (a space, a dot: ``[devices.jetson tx2]`` is no TOML, and ``[devices.tx2.b]`` a
    table ``b`` inside device ``tx2``)."""
    return f"[devices.{name if re.fullmatch(r'[A-Za-z0-9_-]+', name) else json.dumps(name)}]"
