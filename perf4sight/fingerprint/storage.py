"""Fingerprint files: numbers in ``models.npz`` (no pickle), everything else in ``metadata.json``.

Layout of ``<fingerprint_dir>/<device>/``::

    metadata.json   device, versions, feature set, training-data hash, targets, accuracy, models' scalars
    models.npz      flat tree arrays and linear coefficients, loaded with ``allow_pickle=False``

Loading executes no code from the files: JSON and plain numeric arrays only.
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np

from perf4sight.errors import UserError
from perf4sight.fingerprint.trees import TargetModel, TreeEnsemble

__all__ = ["save_models", "load_models", "METADATA_FILE", "MODELS_FILE"]

METADATA_FILE = "metadata.json"
MODELS_FILE = "models.npz"


def save_models(out_dir: str | Path, models: dict[str, TargetModel], metadata: dict[str, Any]) -> Path:
    """Write ``models`` (target -> model) and ``metadata`` to ``out_dir``; returns the folder."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    arrays: dict[str, np.ndarray] = {}
    model_meta: dict[str, Any] = {}
    for target, m in models.items():
        arrays[f"{target}.coef"] = np.asarray(m.coef, dtype=np.float64)
        entry: dict[str, Any] = {"terms": list(m.terms), "correction": None}
        if m.correction is not None:
            arr, scalars = m.correction.to_arrays(f"{target}.trees")
            arrays.update(arr)
            entry["correction"] = scalars
        model_meta[target] = entry
    tmp = out / (MODELS_FILE + ".tmp.npz")
    np.savez_compressed(tmp, **arrays)
    tmp.replace(out / MODELS_FILE)
    meta = dict(metadata)
    meta["models"] = model_meta
    meta["files"] = [METADATA_FILE, MODELS_FILE]
    tmpj = out / (METADATA_FILE + ".tmp")
    tmpj.write_text(json.dumps(meta, indent=2, sort_keys=False))
    tmpj.replace(out / METADATA_FILE)
    return out


def load_models(folder: str | Path) -> tuple[dict[str, TargetModel], dict[str, Any]]:
    """Read a fingerprint folder; ``UserError`` if it is missing or damaged."""
    d = Path(folder)
    mpath, npath = d / METADATA_FILE, d / MODELS_FILE
    if not mpath.is_file() or not npath.is_file():
        raise UserError(f"{d}: no fingerprint here (need {METADATA_FILE} and {MODELS_FILE}; run the fingerprint stage)")
    try:
        meta = json.loads(mpath.read_text())
        models: dict[str, TargetModel] = {}
        with np.load(npath, allow_pickle=False) as arrays:
            for target, entry in meta["models"].items():
                corr = entry.get("correction")
                models[target] = TargetModel(
                    target=target, terms=tuple(entry["terms"]), coef=np.asarray(arrays[f"{target}.coef"]),
                    correction=None if corr is None else TreeEnsemble.from_arrays(f"{target}.trees", arrays, corr))
    except (json.JSONDecodeError, KeyError, ValueError, OSError) as exc:
        raise UserError(f"{d}: fingerprint files are damaged or from an incompatible version ({exc})") from None
    return models, meta
