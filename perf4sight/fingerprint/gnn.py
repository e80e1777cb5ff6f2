"""GNN predictor beside the tree fingerprint: fit, evaluate, store, load, predict; and the ensemble.

One multi-output model per device predicts ``log(latency ms)`` and ``log(memory MiB)`` (same
targets and columns as the trees: see :mod:`perf4sight.fingerprint.fit`) as a correction to the
trees' analytic baseline (``base="analytic"``, the default: on the TX2 data, leave-one-network-out,
it cut the GNN's error from 40 % / 28 % MAPE (latency / memory, outright log targets) to
12 % / 10 %). Default architecture ``sage`` (GraphSAGE): on the TX2 data it measured better than
``seernet`` on latency (12.4 vs 18.3 %) and trains 4x faster; ``seernet`` is better on memory
(7.6 vs 9.8 %) and stays selectable for larger (e.g. imported PerfSeer) datasets. See bench/bench_gnn.py. Accuracy comes from the
trees' harness (:func:`perf4sight.fingerprint.evaluate.grouped_cv`, leave-one-family-out, or
leave-one-network-out with a single family); the same folds give out-of-fold predictions of the
trees, so the geometric-mean ensemble is measured too and the JSON records which of the three
measured best per target. Prediction intervals: the trees' group-conformal band on out-of-fold
``log(measured/predicted)`` (:func:`perf4sight.fingerprint.select.group_conformal`), with its coverage
on each held-out group measured from the other groups' band (``interval_coverage_held_out``).

Files in ``<fingerprint_dir>/<device>/`` (beside the trees' ``metadata.json`` / ``models.npz``)::

    gnn.json         settings, feature names, normalisation statistics, accuracy, intervals (JSON)
    gnn_weights.pt   the model's state_dict, loaded with ``torch.load(weights_only=True)``
"""
from __future__ import annotations

import dataclasses
import datetime as _dt
import json
import pickle
import time
from pathlib import Path
from typing import Any, Sequence

import numpy as np
import torch

from perf4sight.config import GNN_ARCHS, PREDICTORS
from perf4sight.errors import UserError
from perf4sight.features.aggregate import feature_matrix
from perf4sight.fingerprint.evaluate import CVResult, choose_groups, grouped_cv, metrics
from perf4sight.fingerprint.fit import (LATENCY_COLUMN, common_input_shape, device_kind, memory_capacity, memory_column,
                                        records)
from perf4sight.fingerprint.gnn_graph import (EDGE_FEATURES, GLOBAL_FEATURES, NODE_FEATURES, OP_VOCAB,
                                              GraphTemplate, global_features, graph_template)
from perf4sight.fingerprint.gnn_model import GNNModel
from perf4sight.fingerprint.predict import ModuleQueries, as_descriptions, batch_list, prediction_rows
from perf4sight.fingerprint.storage import HeldOut, load_held_out, stored_predictions
from perf4sight.fingerprint.select import PREFERRED, group_conformal, held_out_coverage, select_candidate
from perf4sight.fingerprint.gnn_train import Normaliser, TrainSettings, make_data, predict_log, train_model
from perf4sight.ir.schema import NetworkDescription
from perf4sight.profiling.results import number

__all__ = ["fit_gnn", "load_gnn", "load_predictor", "GNNPredictor", "EnsemblePredictor", "gnn_accuracy_lines",
           "GNN_JSON", "GNN_WEIGHTS", "PREDICTORS"]

GNN_JSON = "gnn.json"
GNN_WEIGHTS = "gnn_weights.pt"
TARGETS = ("latency", "memory")
FORMAT = "perf4sight-gnn-v1"


def _positive(v: Any) -> float:
    """A cell as a positive float, else NaN."""
    x = number(v)
    return x if x is not None and x > 0 else float("nan")


class _Samples:
    """The usable (network, batch size) samples of a device with their log targets [n, 2]."""

    def __init__(self, rows: Any, descriptions: dict[str, NetworkDescription], device: str):
        recs = [r for r in records(rows) if str(r.get("device", device)) == device and str(r["network"]) in descriptions]
        if not recs:
            raise UserError(f"gnn: no measurements with a network description for device '{device}'")
        self.mem_col = memory_column(recs)
        self.ok = [r for r in recs if r.get("status") == "ok"]
        self.oom = [r for r in recs if r.get("status") == "oom"]
        ylat = np.log([_positive(r.get(LATENCY_COLUMN)) for r in self.ok])
        ymem = np.log([_positive(r.get(self.mem_col)) for r in self.ok])
        keep = np.isfinite(ylat) | np.isfinite(ymem)
        self.ok = [r for r, k in zip(self.ok, keep) if k]
        self.Y = np.column_stack([ylat[keep], ymem[keep]]) if keep.any() else np.zeros((0, 2))
        for j, t in enumerate(TARGETS):
            if np.isfinite(self.Y[:, j]).sum() < 3:
                raise UserError(f"gnn: fewer than 3 ok rows with a {t} figure for device '{device}'")
        self.templates = {n: graph_template(descriptions[n]) for n in sorted({str(r["network"]) for r in recs})}
        self.nets = np.array([str(r["network"]) for r in self.ok])
        self.bs = np.array([int(float(r["batch_size"])) for r in self.ok])
        fams = np.array([str(r.get("family") or r["network"]) for r in self.ok])
        self.groups, self.grouping = choose_groups(fams, self.nets)
        self.F = feature_matrix([self.templates[n].features for n in self.nets], self.bs)

    def tmpl(self, idx: np.ndarray) -> list[GraphTemplate]:
        return [self.templates[n] for n in self.nets[idx]]


class _Base:
    """Optional analytic baseline per target (the trees' non-negative linear fit on network totals,
    relative-error loss): the GNN then learns ``log(measured / baseline)``. ``None`` = no baseline."""

    def __init__(self, parts: dict[str, dict[str, Any]] | None):
        from perf4sight.fingerprint.trees import TargetModel
        self.parts = parts
        self.models = {t: TargetModel(t, tuple(p["terms"]), np.asarray(p["coef"], dtype=float), None)
                       for t, p in (parts or {}).items()}

    @classmethod
    def fit(cls, F: np.ndarray, Y: np.ndarray, kind: str) -> "_Base":
        if kind == "none":
            return cls(None)
        from perf4sight.fingerprint.trees import TargetModel
        parts = {}
        for j, t in enumerate(TARGETS):
            ok = np.isfinite(Y[:, j])
            tm = TargetModel.fit(t, F[ok], np.exp(Y[ok, j]), correct=False)
            parts[t] = {"terms": list(tm.terms), "coef": [float(c) for c in tm.coef]}
        return cls(parts)

    def log(self, F: np.ndarray) -> np.ndarray:
        """[n, 2] log baseline (0 without one)."""
        if not self.models:
            return np.zeros((len(F), len(TARGETS)))
        return np.column_stack([np.log(np.maximum(self.models[t].analytic(F), 1e-6)) for t in TARGETS])


def _train(s: _Samples, idx: np.ndarray, st: TrainSettings,
           base_kind: str) -> tuple[GNNModel, Normaliser, _Base, dict[str, Any]]:
    tl = s.tmpl(idx)
    base = _Base.fit(s.F[idx], s.Y[idx], base_kind)
    R = s.Y[idx] - base.log(s.F[idx])
    uniq = list({t.name: t for t in tl}.values())
    norm = Normaliser.fit(uniq, global_features(tl, s.bs[idx]), R)
    ss = make_data(tl, s.bs[idx], norm, R)
    names = list({t.name: None for t in tl})  # graph order of make_data
    dims = (len(NODE_FEATURES), len(EDGE_FEATURES), len(GLOBAL_FEATURES))
    model, summary = train_model(ss, names, dims, len(TARGETS), st)
    return model, norm, base, summary


def _predict(model: GNNModel, norm: Normaliser, base: _Base, tl: list[GraphTemplate],
             bs: Sequence[int]) -> np.ndarray:
    """Predicted latency (ms) and memory (MiB), shape [n, 2]."""
    F = feature_matrix([t.features for t in tl], list(bs))
    return np.exp(predict_log(model, make_data(tl, list(bs), norm), norm) + base.log(F))


def _trees_features(s: _Samples, trees_cfg: Any) -> np.ndarray:
    """The trees' feature rows of ``s``: as the GNN's, plus the allocator replay when the fingerprint uses it
    (on copies: the GNN's own graph-level features stay those it is served with at prediction time)."""
    if not getattr(trees_cfg, "simulate_memory", False):
        return s.F
    from perf4sight.features.alloc_trace import attach_simulation
    feats = {}
    for name, t in s.templates.items():
        nf = dataclasses.replace(t.features)
        feats[name] = attach_simulation(nf, nf.description) if nf.description is not None else nf
    return feature_matrix([feats[n] for n in s.nets], s.bs)


def _stored_trees_cv(s: _Samples, sel: np.ndarray, col: str, y: np.ndarray, groups: np.ndarray,
                     table: dict[tuple[str, int, float], float]) -> CVResult | None:
    """The trees fingerprint's own out-of-fold predictions (its ``held_out.csv``) for samples ``sel``,
    or None unless it was fitted on exactly these rows (``storage.stored_predictions``)."""
    pred = stored_predictions(table, [s.ok[i] for i in sel], col)
    if pred is None:
        return None
    return CVResult(pred, {str(g): metrics(y[groups == g], pred[groups == g]) for g in dict.fromkeys(groups.tolist())},
                    metrics(y, pred), s.grouping)


def _evaluate(s: _Samples, st: TrainSettings, trees_cfg: Any, coverage: float, base_kind: str,
              trees_held_out: HeldOut | None = None) -> dict[str, Any]:
    """Out-of-fold accuracy of the GNN, the trees and their geometric mean on the same folds. The trees'
    figures are the trees fingerprint's own (``trees_held_out``) where it covers the samples, else the
    trees refitted here as the fingerprint stage fits them."""
    cache: dict[str, np.ndarray] = {}  # held-out group -> GNN predictions for all samples in it

    def gnn_fold(test_idx: np.ndarray) -> np.ndarray:
        g = str(s.groups[test_idx[0]])
        if g not in cache:
            held = s.groups == g
            model, norm, base, _ = _train(s, np.nonzero(~held)[0], st, base_kind)
            cache[g] = np.full((len(s.nets), 2), np.nan)
            cache[g][held] = _predict(model, norm, base, s.tmpl(np.nonzero(held)[0]), s.bs[held])
        return cache[g][test_idx]

    acc: dict[str, Any] = {"grouping": s.grouping}
    intervals: dict[str, dict[str, list[float]]] = {"gnn": {}, "ensemble": {}}
    F_trees = _trees_features(s, trees_cfg)
    for j, target in enumerate(TARGETS):
        sel = np.nonzero(np.isfinite(s.Y[:, j]))[0]
        y, groups = np.exp(s.Y[sel, j]), s.groups[sel]
        cv_g = grouped_cv(sel[:, None], y, groups, s.grouping, lambda a, b, c, j=j: gnn_fold(c[:, 0])[:, j])
        col = LATENCY_COLUMN if target == "latency" else s.mem_col
        cv_t = _stored_trees_cv(s, sel, col, y, groups, (trees_held_out or {}).get(target, {}))
        acc.setdefault("trees_source", {})[target] = "the trees fingerprint's held_out.csv" if cv_t else "refitted"
        if cv_t is None:  # the trees as the fingerprint stage fits them (model form chosen by the same grouped CV)
            _, cv_t, _ = select_candidate(target, F_trees[sel], y, groups, s.grouping, trees_cfg.model,
                                          int(trees_cfg.n_estimators), int(trees_cfg.min_samples_leaf),
                                          int(trees_cfg.seed), prefer=PREFERRED.get((target, device_kind(s.mem_col))))
        ens = np.sqrt(cv_g.predictions * cv_t.predictions)
        res = {"gnn": cv_g, "trees": cv_t}
        entry: dict[str, Any] = {k: {"overall": v.overall, "per_group": v.per_group} for k, v in res.items()}
        entry["ensemble"] = {"overall": metrics(y, ens) if len(cv_g.per_group) else cv_g.overall,
                             "per_group": {g: metrics(y[groups == g], ens[groups == g]) for g in cv_g.per_group}}
        mapes = {k: entry[k]["overall"]["mape"] for k in PREDICTORS}
        finite = {k: v for k, v in mapes.items() if np.isfinite(v)}
        entry["best"] = min(finite, key=finite.get) if finite else None
        acc[target] = entry
        for kind, pred in (("gnn", cv_g.predictions), ("trees", cv_t.predictions), ("ensemble", ens)):
            log_ratio = np.log(y / pred)
            if kind in intervals:  # the trees' own band lives in their fingerprint
                intervals[kind][target] = group_conformal(log_ratio, groups, coverage)
            entry[kind]["interval_coverage_held_out"] = held_out_coverage(log_ratio, groups, coverage)
    return {"accuracy": acc, "intervals": intervals}


def fit_gnn(rows: Any, descriptions: dict[str, NetworkDescription], device: str, out_dir: str | Path,
            seed: int = 0, *, arch: str = "sage", hidden: int = 64, layers: int = 3, max_epochs: int = 300,
            patience: int = 40, base: str = "analytic", evaluate: bool = True, memory_limit_mb: float = 0.0, trees_config: Any = None,
            coverage: float = 0.9) -> dict[str, Any]:
    """Fit, evaluate and store the GNN of ``device``; returns the JSON metadata written to ``gnn.json``.

    ``rows``: tidy measurement dicts or a DataFrame; ``descriptions``: network name -> description.
    ``evaluate``: run the grouped cross-validation (one extra training per held-out group) that
    yields the accuracy tables, the intervals and the trees/GNN/ensemble comparison;
    ``trees_config``: the ``cfg.fingerprint`` used for the trees in that comparison (defaults).
    ``base``: ``analytic`` (the GNN corrects the trees' analytic baseline) or ``none`` (it predicts
    the log targets outright).
    """
    if base not in ("analytic", "none"):
        raise UserError(f"gnn: base '{base}' is not one of analytic, none")
    if arch not in GNN_ARCHS:
        raise UserError(f"gnn: architecture '{arch}' is not one of {', '.join(GNN_ARCHS)}")
    if trees_config is None:
        from perf4sight.config import FingerprintConfig
        trees_config = FingerprintConfig(seed=seed)
    st = TrainSettings(arch=arch, hidden=hidden, layers=layers, max_epochs=max_epochs, patience=patience, seed=seed)
    s = _Samples(rows, descriptions, device)
    t0 = time.perf_counter()
    trees_held_out = load_held_out(out_dir)  # the trees fingerprint beside it, if fitted: its own figures
    ev = _evaluate(s, st, trees_config, coverage, base, trees_held_out) if evaluate else {"accuracy": {}, "intervals": {}}
    t_cv = time.perf_counter() - t0
    t0 = time.perf_counter()
    model, norm, basem, summary = _train(s, np.arange(len(s.nets)), st, base)
    t_fit = time.perf_counter() - t0
    oom_t = [s.templates[str(r["network"])] for r in s.oom]
    capacity, cap_src = memory_capacity(memory_limit_mb, len(s.oom), lambda: (
        _predict(model, norm, basem, s.tmpl(np.arange(len(s.nets))), s.bs)[:, 1],
        _predict(model, norm, basem, oom_t, [int(float(r["batch_size"])) for r in s.oom])[:, 1]))
    meta: dict[str, Any] = {
        "format": FORMAT, "device": device,
        "created": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        "versions": {"torch": torch.__version__, "torch_geometric": __import__("torch_geometric").__version__},
        "settings": dict(st.__dict__),
        "op_vocab": list(OP_VOCAB), "node_features": list(NODE_FEATURES), "edge_features": list(EDGE_FEATURES),
        "global_features": list(GLOBAL_FEATURES), "normaliser": norm.to_json(),
        "base": {"kind": base, "models": basem.parts},
        "targets": {"latency": {"column": LATENCY_COLUMN, "unit": "ms"}, "memory": {"column": s.mem_col, "unit": "MiB"}},
        "target_transform": "log(measured / analytic baseline) (log(measured) with base none), standardised "
                            "with training statistics",
        "training": summary | {"seconds": round(t_fit, 2), "cv_seconds": round(t_cv, 2)},
        "networks": sorted(s.templates), "training_rows": len(s.nets), "oom_rows": len(s.oom),
        "input_shape": common_input_shape(descriptions, s.templates),
        "accuracy": ev["accuracy"],
        "interval": {"coverage": coverage, "log_ratio_quantiles": ev["intervals"],
                     "method": "group-conformal on out-of-fold log(measured/predicted)" if evaluate
                     else "none (fitted without evaluation): low = high = prediction"},
        "capacity_mb": capacity, "capacity_source": cap_src,
        "files": [GNN_JSON, GNN_WEIGHTS],
    }
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    torch.save(model.state_dict(), out / (GNN_WEIGHTS + ".tmp"))
    (out / (GNN_WEIGHTS + ".tmp")).replace(out / GNN_WEIGHTS)
    (out / (GNN_JSON + ".tmp")).write_text(json.dumps(meta, indent=2))
    (out / (GNN_JSON + ".tmp")).replace(out / GNN_JSON)
    return meta


def _rows(names: list[str], bss: list[int], pred: np.ndarray, bands: dict[str, list[float]],
          capacity: float | None) -> list[dict[str, Any]]:
    """Prediction dicts from ``pred`` ([n, 2] latency ms, memory MiB, network-major); fits = memory <= capacity."""
    return prediction_rows(names, bss, pred[:, 0], pred[:, 1], bands,
                           [capacity is None or m <= capacity for m in pred[:, 1]])


class GNNPredictor(ModuleQueries):
    """A loaded GNN: ``predict(descs, batch_sizes)`` returns the trees' prediction dicts."""

    def __init__(self, model: GNNModel, norm: Normaliser, metadata: dict[str, Any]):
        self.model, self.norm, self.metadata = model, norm, metadata
        self.base = _Base(metadata.get("base", {}).get("models"))
        self.device: str = metadata.get("device", "")
        self.input_shape: list[int] | None = metadata.get("input_shape")
        self.capacity_mb: float | None = metadata.get("capacity_mb")
        self.bands = metadata.get("interval", {}).get("log_ratio_quantiles", {}).get("gnn", {})

    def predict_array(self, descs: Sequence[NetworkDescription], bss: list[int]) -> np.ndarray:
        """[len(descs) * len(bss), 2] latency (ms) and memory (MiB), network-major."""
        tl = [graph_template(d) for d in descs for _ in bss]
        return _predict(self.model, self.norm, self.base, tl, bss * len(descs))

    def predict(self, descs: NetworkDescription | str | Path | Sequence[NetworkDescription | str | Path],
                batch_sizes: int | Sequence[int]) -> list[dict[str, Any]]:
        """One dict per (network, batch size): latency (ms), memory (MiB), bands, ``fits``. ``descs``:
        descriptions, description file paths, or one of them; ``batch_sizes``: an int or a list of ints."""
        bss = batch_list(batch_sizes)
        descs = as_descriptions(descs, (NetworkDescription,))
        return _rows([d.name for d in descs], bss, self.predict_array(descs, bss), self.bands, self.capacity_mb)


class EnsemblePredictor(ModuleQueries):
    """Geometric mean of the trees' and the GNN's predictions; bands from the ensemble's own
    out-of-fold residuals; capacity from the trees' fingerprint (else the GNN's)."""

    def __init__(self, trees: Any, gnn: GNNPredictor):
        self.trees, self.gnn = trees, gnn
        self.device, self.input_shape = gnn.device, trees.input_shape or gnn.input_shape
        self.capacity_mb = trees.capacity_mb if trees.capacity_mb is not None else gnn.capacity_mb
        self.bands = gnn.metadata.get("interval", {}).get("log_ratio_quantiles", {}).get("ensemble", {})
        self.metadata = gnn.metadata

    def predict(self, descs: NetworkDescription | str | Path | Sequence[NetworkDescription | str | Path],
                batch_sizes: int | Sequence[int]) -> list[dict[str, Any]]:
        """As :meth:`GNNPredictor.predict`, from the geometric mean of both predictors."""
        bss = batch_list(batch_sizes)
        descs = as_descriptions(descs, (NetworkDescription,))
        g = self.gnn.predict_array(descs, bss)
        t = self.trees.predict(descs, bss)
        tarr = np.array([[r["latency_ms"], r["memory_mb"]] for r in t])
        return _rows([d.name for d in descs], bss, np.sqrt(g * tarr), self.bands, self.capacity_mb)


def load_gnn(out_dir: str | Path) -> GNNPredictor:
    """Load ``gnn.json`` + ``gnn_weights.pt`` (``weights_only=True``: tensors, no code)."""
    d = Path(out_dir)
    jp, wp = d / GNN_JSON, d / GNN_WEIGHTS
    if not jp.is_file() or not wp.is_file():
        raise UserError(f"{d}: no GNN here (need {GNN_JSON} and {GNN_WEIGHTS}; fit with --predictor gnn)")
    try:
        meta = json.loads(jp.read_text())
        if meta.get("format") != FORMAT or meta.get("node_features") != list(NODE_FEATURES) \
                or meta.get("global_features") != list(GLOBAL_FEATURES):
            raise UserError(f"{jp}: GNN made with other features or format; refit the fingerprint")
        st = meta["settings"]
        model = GNNModel(st["arch"], len(NODE_FEATURES), len(EDGE_FEATURES), len(GLOBAL_FEATURES),
                         hidden=int(st["hidden"]), layers=int(st["layers"]), outputs=len(TARGETS))
        model.load_state_dict(torch.load(wp, weights_only=True, map_location="cpu"))
        norm = Normaliser.from_json(meta["normaliser"])
    except (json.JSONDecodeError, KeyError, RuntimeError, ValueError, OSError, EOFError, pickle.UnpicklingError) as exc:
        raise UserError(f"{d}: GNN files are damaged or incompatible ({type(exc).__name__}: {exc})") from None
    model.eval()
    return GNNPredictor(model, norm, meta)


def load_predictor(out_dir: str | Path, kind: str = "trees") -> Any:
    """The predictor ``kind`` (trees | gnn | ensemble) of a fingerprint folder."""
    if kind not in PREDICTORS:
        raise UserError(f"predictor '{kind}' is not one of {', '.join(PREDICTORS)}")
    from perf4sight.fingerprint.predict import load_fingerprint
    if kind == "trees":
        return load_fingerprint(out_dir)
    if kind == "gnn":
        return load_gnn(out_dir)
    return EnsemblePredictor(load_fingerprint(out_dir), load_gnn(out_dir))


def gnn_accuracy_lines(metadata: dict[str, Any]) -> list[str]:
    """Table of out-of-fold MAPE per held-out group for trees, GNN and ensemble (for the stage to print)."""
    acc = metadata.get("accuracy", {})
    lines = []
    for target in TARGETS:
        e = acc.get(target)
        if not e:
            continue
        source = acc.get("trees_source", {}).get(target)
        lines.append(f"{target}: MAPE % per held-out {acc.get('grouping')} (best: {e.get('best')})"
                     + (f"; trees: {source}" if source else ""))
        lines.append(f"  {'held out':<24}" + "".join(f"{k:>10}" for k in PREDICTORS))
        for g in list(e["gnn"]["per_group"]) + ["all"]:
            vals = [(e[k]["overall"] if g == "all" else e[k]["per_group"].get(g, {})).get("mape", float("nan"))
                    for k in PREDICTORS]
            lines.append(f"  {g:<24}" + "".join(f"{v:>10.1f}" for v in vals))
        cov = [e.get(k, {}).get("interval_coverage_held_out") for k in PREDICTORS]
        lines.append(f"  {'90% band, held-out cov.':<24}" + "".join(f"{'–' if v is None else f'{v:.1f}':>10}" for v in cov))
    return lines
