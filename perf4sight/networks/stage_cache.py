"""What the networks stage made of one network, kept for its next run: a rerun that changed nothing, or one after an
interrupt, reads each network's variants back instead of pruning and tracing it again (seconds to minutes a network).

One entry per network (a zoo network, a factory, a description file; a generated network's variants at ``[networks]
extra_input_shapes``) under ``<models_dir>/zoo-cache/networks-stage/``: its descriptions, the notes on what was left
out, and the progress lines it printed. An entry is keyed by everything that decides what it holds, so that a change is
never read past: the network (its name and source; a factory's code files, ``Factory.code_files``: its file, the
Python files beside it and the user's modules they import; the size and time of its other files beside it, which it
may read; a description file's bytes), every ``[networks]`` setting but the lists of other networks and the
generator's (input shapes, class counts, the whole ``[networks.pruning]`` table), the versions of Python, torch,
torchvision, torch-pruning and numpy, the machine's architecture, and the bytes of every file of the perf4sight
package. A data file a factory reads from outside its own folder or below it is not in the key (as for the variants
pruned on request): after an edit there, delete ``zoo-cache/``. Best effort: an entry that cannot be read is made
again, one that cannot be written is passed over.
"""
from __future__ import annotations

import functools
import hashlib
import json
import platform
import re
import sys
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path
from typing import Any

from perf4sight.dataset import ZOO_CACHE
from perf4sight.errors import UserError
from perf4sight.files import package_sha256, write_atomically
from perf4sight.ir.schema import NetworkDescription

__all__ = ["FOLDER", "KEEP", "Made", "data_files", "entry_path", "file_digests", "read_entry", "write_entry"]

FOLDER = "networks-stage"  # under <models_dir>/zoo-cache/ (dataset.ZOO_CACHE)
KEEP = 4  # entries kept per network: a few settings to go back and forth between, not every one ever run
_FORMAT = 1  # of an entry's JSON: a change of it reads no older entry


@dataclass
class Made:
    """What the networks stage made of one network: its descriptions (in the order written), a line per variant
    left out, and the progress lines it printed while making them."""

    descriptions: list[NetworkDescription]
    skipped: list[str]
    progress: list[str]


def _code_sha() -> str | None:
    """A hash of every Python file of the perf4sight package (names and bytes; :func:`files.package_sha256`, hashed
    once per process): any change of the code is a new key; None where one cannot be read: nothing is cached."""
    try:
        return package_sha256()
    except OSError:
        return None


@functools.lru_cache(maxsize=1)
def _environment() -> tuple[str, ...] | None:
    """The versions of what makes a description (None where one is unknown: nothing is cached then)."""
    try:
        versions = [metadata.version(p) for p in ("torch", "torchvision", "torch-pruning", "numpy")]
    except metadata.PackageNotFoundError:
        return None
    return (sys.version.split()[0], platform.machine(), *versions)


def file_digests(paths: tuple[Path, ...] | list[Path]) -> list[list[str]]:
    """[path, sha256 of its bytes] per file, for a key; ``OSError`` where one cannot be read."""
    return [[str(p), hashlib.sha256(Path(p).read_bytes()).hexdigest()] for p in paths]


def data_files(folder: Path) -> list[list[Any]]:
    """[name, size, modification time] of each file of ``folder`` that is not Python (a factory's folder: the widths
    its function reads from a JSON file beside it), for a key: by size and time, not bytes, as one may be large (a
    checkpoint); ``OSError`` where the folder cannot be listed."""
    return sorted([p.name, st.st_size, st.st_mtime_ns] for p in folder.iterdir() if p.suffix != ".py" and p.is_file()
                  for st in [p.stat()])


def entry_path(models_dir: Path, name: str, key: Any) -> Path | None:
    """Where the entry of network ``name`` under ``key`` (JSON-able: the network's source and settings, as the
    caller gathers them) is kept; None where it cannot be keyed (a library version unknown, a file of the code
    unreadable)."""
    env, code = _environment(), _code_sha()
    if env is None or code is None:
        return None
    text = json.dumps([_FORMAT, env, code, key], sort_keys=True, separators=(",", ":"), default=str)
    digest = hashlib.sha256(text.encode()).hexdigest()[:24]
    return models_dir / ZOO_CACHE / FOLDER / f"{_file_stem(name)}-{digest}.json"


def _file_stem(name: str) -> str:
    """``name`` as a file name's start: characters other than letters, digits, '.' and '-' as '_'."""
    return re.sub(r"[^\w.-]", "_", name)[:100] or "_"


def read_entry(path: Path | None) -> Made | None:
    """The entry at ``path``, else None (none there, or one that cannot be read: it is made again)."""
    if path is None or not path.is_file():
        return None
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
        if data.get("format") != _FORMAT or data.get("key") != path.stem.rpartition("-")[2]:
            return None
        descs = [NetworkDescription.from_dict(d, where=str(path)) for d in data["descriptions"]]
        skipped, progress = data["skipped"], data["progress"]
        if not all(isinstance(line, str) for line in [*skipped, *progress]):
            return None
    except (OSError, ValueError, KeyError, TypeError, AttributeError, RecursionError, UserError):
        return None
    return Made(descs, list(skipped), list(progress))


def write_entry(path: Path | None, made: Made) -> None:
    """Keep ``made`` at ``path`` (atomic), and at most ``KEEP`` entries of its network, the newest; an entry that
    cannot be written is passed over (the next run makes the network again)."""
    if path is None:
        return
    data = {"format": _FORMAT, "key": path.stem.rpartition("-")[2],
            "descriptions": [d.to_dict() for d in made.descriptions], "skipped": made.skipped,
            "progress": made.progress}
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        write_atomically(path, json.dumps(data, separators=(",", ":")).encode("utf-8"))
        stem = path.stem.rpartition("-")[0]
        older = [p for p in path.parent.glob(f"{stem}-*.json")  # a stem has no glob pattern
                 if p != path and p.stem.rpartition("-")[0] == stem]
        older.sort(key=lambda p: p.stat().st_mtime_ns, reverse=True)
        for stale in older[KEEP - 1:]:
            stale.unlink()
    except OSError:
        pass

