"""GNN predictor beside the tree fingerprint: the public face (fit and store, load, predict; the ensemble).

One multi-output model per device predicts ``log(latency ms)`` and ``log(memory MiB)`` (same
targets and columns as the trees: see :mod:`perf4sight.fingerprint.fit`) as a correction to the
trees' analytic baseline (``base="analytic"``, the default: on the TX2 data, leave-one-network-out,
it cut the GNN's error from 40 % / 28 % MAPE (latency / memory, outright log targets) to
12 % / 10 %). Default architecture ``sage`` (GraphSAGE): on the TX2 data, the mean over seeds 0-2, it measured a
little better than ``seernet`` on latency (11.5 vs 12.5 %) and trains about 2x faster; ``seernet`` is a little better
on memory (7.8 vs 8.4 %) and stays selectable for larger (e.g. imported PerfSeer) datasets. See bench/bench_gnn.py.
Accuracy comes from the trees' harness (:func:`perf4sight.fingerprint.evaluate.grouped_cv`, leave-one-family-out, or
leave-one-network-out with a single family); the same folds give out-of-fold predictions of the
trees, so the geometric-mean ensemble is measured too and the JSON records which of the three
measured best per target. Prediction intervals: the trees' group-conformal band on out-of-fold
``log(measured/predicted)`` (:func:`perf4sight.fingerprint.select.group_conformal`), with its coverage
on each held-out group measured from the other groups' band (``interval_coverage_held_out``).

This module fits and stores the GNN (:func:`fit_gnn`; torch is imported only there) and re-exports the rest of
the public API, loading among it (:func:`load_gnn`, :func:`load_predictor`, from ``gnn_predictors``). The parts,
bottom up:

- ``gnn_graph``: graph tensors of a network description;
- ``gnn_model``: the architectures (``sage``, ``seernet``);
- ``gnn_samples``: a device's (network, batch size) samples and log targets;
- ``gnn_baseline``: the analytic baseline the GNN corrects;
- ``gnn_train``: training (torch), the model coming back as arrays;
- ``gnn_forward``: inference in numpy (latency ms / memory MiB with the baseline), the normaliser;
- ``gnn_evaluate``: cross-validation against the trees and the ensemble, and its printed table;
- ``gnn_predictors``: :class:`GNNPredictor` and :class:`EnsemblePredictor`, and loading them (no torch).

Files in ``<fingerprint_dir>/<device>/`` (beside the trees' ``metadata.json`` / ``models.npz``)::

    gnn.json          settings, feature names, normalisation statistics, accuracy, intervals (JSON)
    gnn_weights.npz   the model's state_dict as plain arrays, loaded with ``allow_pickle=False`` (a GNN stored
                      before 2026-11-28: ``gnn_weights.pt``, read with ``torch.load(weights_only=True)``)
"""
from __future__ import annotations

import datetime as _dt
import hashlib
import importlib.metadata
import inspect
import json
import time
from pathlib import Path
from typing import Any

import numpy as np

from perf4sight.config import GNN_ARCHS, PREDICTORS
from perf4sight.errors import UserError
from perf4sight.files import atomic_path, write_atomically
from perf4sight.fingerprint.domain import training_domain
from perf4sight.fingerprint.fit import (LATENCY_COLUMN, input_shape_metadata, memory_capacity, records,
                                       software_versions)
from perf4sight.fingerprint.fit_inputs import INPUTS_KEY, inputs_sha256
from perf4sight.fingerprint.gnn_evaluate import cross_validate, gnn_accuracy_lines
from perf4sight.fingerprint.gnn_graph import EDGE_FEATURES, GLOBAL_FEATURES, NODE_FEATURES, OP_VOCAB
from perf4sight.fingerprint.gnn_forward import predict_latency_memory
from perf4sight.fingerprint.gnn_predictors import (FORMAT, GNN_JSON, GNN_WEIGHTS, OLD_GNN_WEIGHTS, EnsemblePredictor,
                                                   GNNPredictor, load_gnn, load_predictor)
from perf4sight.fingerprint.gnn_samples import TARGETS, Samples
from perf4sight.fingerprint.storage import HELD_OUT_FILE, _folder_locked, load_held_out
from perf4sight.ir.schema import NetworkDescription
from perf4sight.profiling.results import batch_size_of
from perf4sight.profiling.runner import torch_version
from perf4sight.wording import named, plural

__all__ = ["fit_gnn", "gnn_inputs_sha256", "load_gnn", "load_predictor", "GNNPredictor", "EnsemblePredictor",
           "gnn_accuracy_lines", "GNN_JSON", "GNN_WEIGHTS", "PREDICTORS"]


def fit_gnn(rows: Any, descriptions: dict[str, NetworkDescription], device: str, out_dir: str | Path,
            seed: int = 0, *, arch: str = "sage", hidden: int = 64, layers: int = 3, max_epochs: int = 300,
            patience: int = 40, base: str = "analytic", evaluate: bool = True, memory_limit_mb: float = 0.0,
            trees_config: Any = None, coverage: float = 0.9, drift: dict[str, Any] | None = None,
            op_prices: dict[str, dict[int, float]] | None = None) -> dict[str, Any]:
    """Fit, evaluate and store the GNN of ``device``; returns the JSON metadata written to ``gnn.json``.

    ``rows``: tidy measurement dicts or a DataFrame; ``descriptions``: network name -> description.
    ``evaluate``: run the grouped cross-validation (one extra training per held-out group) that
    yields the accuracy tables, the intervals and the trees/GNN/ensemble comparison;
    ``trees_config``: the ``cfg.fingerprint`` used for the trees in that comparison (defaults).
    ``base``: ``analytic`` (the GNN corrects the trees' analytic baseline) or ``none`` (it predicts
    the log targets outright). ``drift``: the summary of a drift reference's correction of the rows' step times,
    kept in the metadata. ``op_prices``: the device's measured op prices (``priced_ops.check_prices``' table), which
    the trees refitted for the comparison read as the trees fingerprint does (the GNN's own inputs have none).
    """
    key = _inputs_sha256(dict(locals()))  # every argument, before anything else is bound
    from perf4sight.fingerprint.gnn_train import TrainSettings, train_on_samples  # torch: only for a fit
    if base not in ("analytic", "none"):
        raise UserError(f"gnn: base '{base}' is not one of analytic, none")
    if arch not in GNN_ARCHS:
        raise UserError(f"gnn: architecture '{arch}' is not one of {', '.join(GNN_ARCHS)}")
    if trees_config is None:
        from perf4sight.config import FingerprintConfig
        trees_config = FingerprintConfig(seed=seed)
    st = TrainSettings(arch=arch, hidden=hidden, layers=layers, max_epochs=max_epochs, patience=patience, seed=seed)
    s = Samples(rows, descriptions, device)
    for j, target in enumerate(TARGETS):  # as the trees: nothing to hold out, so no accuracy and a zero-width interval
        nets = sorted(set(s.nets[np.isfinite(s.Y[:, j])].tolist()))  # a network out of memory everywhere: not one
        if len(nets) < 2:
            raise UserError(f"gnn: device '{device}' has ok rows with a {target} figure of "
                            f"{plural(len(nets), 'network')} ({named(nets)}); a GNN needs 2 or more, as its accuracy "
                            "and intervals are measured on networks held out of the fit: profile more networks")
    t0 = time.perf_counter()
    trees_held_out = load_held_out(out_dir)  # the trees fingerprint beside it, if fitted: its own figures
    ev = (cross_validate(s, st, trees_config, coverage, base, trees_held_out, op_prices) if evaluate
          else {"accuracy": {}, "intervals": {}})
    t_cv = time.perf_counter() - t0
    t0 = time.perf_counter()
    model, norm, basem, summary = train_on_samples(s, np.arange(len(s.nets)), st, base)
    t_fit = time.perf_counter() - t0
    oom_t = [s.templates[str(r["network"])] for r in s.oom]
    capacity, cap_src = memory_capacity(memory_limit_mb, len(s.oom), lambda: (
        predict_latency_memory(model, norm, basem, s.tmpl(np.arange(len(s.nets))), s.bs)[:, 1],
        predict_latency_memory(model, norm, basem, oom_t, [batch_size_of(r) for r in s.oom])[:, 1]))
    meta: dict[str, Any] = {
        "format": FORMAT, "device": device,
        "created": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        "versions": gnn_versions(),
        "settings": dict(st.__dict__),
        "op_vocab": list(OP_VOCAB), "node_features": list(NODE_FEATURES), "edge_features": list(EDGE_FEATURES),
        "global_features": list(GLOBAL_FEATURES), "normaliser": norm.to_json(),
        "base": {"kind": base, "models": basem.parts},
        "targets": {"latency": {"column": LATENCY_COLUMN, "unit": "ms"},
                    "memory": {"column": s.mem_col, "unit": "MiB"}},
        "target_transform": "log(measured / analytic baseline) (log(measured) with base none), standardised "
                            "with training statistics",
        "training": summary | {"seconds": round(t_fit, 2), "cv_seconds": round(t_cv, 2)},
        **s.runtime.metadata(),  # the rules of the rows' torch (step_runtime.py), the optimiser among them
        "networks": sorted(s.templates), "training_rows": len(s.nets), "oom_rows": len(s.oom), "drift_reference": drift,
        **input_shape_metadata(descriptions, s.templates),
        # what predict notes a query leaves (domain.py)
        # of the rows learnt from: a network out of memory at every batch size taught no cost of its layers
        "training_domain": training_domain(s.F, [descriptions[n] for n in sorted(set(s.nets.tolist()))]),
        "accuracy": ev["accuracy"],
        "interval": {"coverage": coverage, "log_ratio_quantiles": ev["intervals"],
                     "method": "group-conformal on out-of-fold log(measured/predicted)" if evaluate
                     else "none (fitted without evaluation): low = high = prediction"},
        "capacity_mb": capacity, "capacity_source": cap_src, INPUTS_KEY: key,
        "files": [GNN_JSON, GNN_WEIGHTS],
    }
    save_gnn_files(out_dir, model.state, meta)
    return meta


def save_gnn_files(out_dir: str | Path, state: dict[str, np.ndarray], meta: dict[str, Any]) -> None:
    """Write a GNN's weights (``state``), then its ``gnn.json`` (``meta``), into ``out_dir``, the folder locked
    meanwhile as a trees fit locks it (``storage._folder_locked``): of two GNN fits of one device at once, one's
    weights were left beside the other's gnn.json (its normaliser and settings: predictions of neither, without a
    word where the architecture matched), and a predict between the two renames read them so."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    with _folder_locked(out):
        with atomic_path(out / GNN_WEIGHTS) as tmp, tmp.open("wb") as f:
            np.savez(f, **state)
        (out / OLD_GNN_WEIGHTS).unlink(missing_ok=True)  # an older GNN's, fitted again
        write_atomically(out / GNN_JSON, json.dumps(meta, indent=2))


def gnn_versions() -> dict[str, str]:
    """torch's and torch_geometric's versions, read without importing either (``torch.__version__`` from its
    ``version.py``; torch_geometric's from its installed metadata, "" if none): so an up-to-date check costs no
    torch."""
    try:
        geometric = importlib.metadata.version("torch_geometric")
    except importlib.metadata.PackageNotFoundError:
        geometric = ""
    return {"torch": torch_version(), "torch_geometric": geometric}


def gnn_inputs_sha256(*args: Any, **kwargs: Any) -> str:
    """The hash of everything ``fit_gnn(*args, **kwargs)`` reads (``fit_inputs.inputs_sha256``), as it stores it
    in ``gnn.json``: equal hashes, equal GNNs."""
    bound = inspect.signature(fit_gnn).bind(*args, **kwargs)
    bound.apply_defaults()
    return _inputs_sha256(bound.arguments)


def _inputs_sha256(arguments: dict[str, Any]) -> str:
    """:func:`gnn_inputs_sha256` of ``fit_gnn``'s bound arguments; the trees' held-out predictions in its folder,
    which its comparison table reads, count as an input."""
    a = dict(arguments)
    rows, descriptions, device, out_dir = (a.pop(k) for k in ("rows", "descriptions", "device", "out_dir"))
    trees, held = a.pop("trees_config"), Path(out_dir) / HELD_OUT_FILE
    settings = a | {"device": device, "trees_config": None if trees is None else dict(vars(trees)),
                    "trees_held_out": hashlib.sha256(held.read_bytes()).hexdigest() if held.is_file() else ""}
    versions = software_versions() | gnn_versions()
    recs = [r for r in records(rows) if str(r.get("device", device)) == device]
    return inputs_sha256("gnn", recs, descriptions, settings, versions)
