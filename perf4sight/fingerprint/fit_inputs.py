"""Everything a fit reads, as one hash: a stored fingerprint with the same hash was fitted from the same
measurement rows, network descriptions, settings, library versions and perf4sight code, so fitting it again
would give the same files. The fingerprint stage compares the hash to skip such a refit (``--refit`` forces one).
"""
from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path
from typing import Any, Iterable

from perf4sight.blas import numpy_targets
from perf4sight.files import package_sha256
from perf4sight.ir.schema import NetworkDescription

__all__ = ["inputs_sha256", "stored_if_current", "INPUTS_KEY"]

#: The metadata key the hash is stored under, in ``metadata.json`` and ``gnn.json``.
INPUTS_KEY = "inputs_sha256"

def _description_sha(desc: NetworkDescription) -> str:
    return hashlib.sha256(desc.to_json().encode()).hexdigest()


def inputs_sha256(kind: str, rows: Iterable[dict[str, Any]], descriptions: dict[str, NetworkDescription],
                  settings: dict[str, Any], versions: dict[str, str]) -> str:
    """The hash of a ``kind`` fit (``trees`` or ``gnn``) of ``rows`` (every column, in any order), the
    descriptions of the networks they name, ``settings`` (everything else the fit takes: the config's
    ``[fingerprint]`` table, the memory limit, the drift correction's summary, ...), ``versions`` (the libraries
    that compute it), the OpenBLAS kernels it runs on and this package's code."""
    rows = list(rows)
    names = sorted({str(r.get("network")) for r in rows} & set(descriptions))
    payload = {
        "kind": kind,
        "rows": sorted(json.dumps({str(k): v for k, v in r.items()}, sort_keys=True, default=str) for r in rows),
        "descriptions": {n: _description_sha(descriptions[n]) for n in names},
        "settings": settings,
        "versions": versions,
        "openblas_coretype": os.environ.get("OPENBLAS_CORETYPE", ""),
        "numpy_targets": numpy_targets(),
        "code": package_sha256(),  # any edit of the code that fits, features or describes: no fingerprint reused
    }
    return hashlib.sha256(json.dumps(payload, sort_keys=True, default=str).encode()).hexdigest()


def stored_if_current(metadata_path: Path, key: str) -> dict[str, Any] | None:
    """The metadata at ``metadata_path`` if it was fitted from inputs hashing to ``key`` and every file it lists
    is beside it (its file's time then set to now, as a refit would, so notes about measurements newer than the
    fingerprint stay quiet), else None."""
    try:
        meta = json.loads(metadata_path.read_text())
    except (OSError, ValueError):
        return None
    if not isinstance(meta, dict) or meta.get(INPUTS_KEY) != key:
        return None
    if not all((metadata_path.parent / str(f)).is_file() for f in meta.get("files") or ()):
        return None
    os.utime(metadata_path)
    return meta
