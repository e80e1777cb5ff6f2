"""Serving predictions from a stored GNN, alone (:class:`GNNPredictor`) or with the trees (:class:`EnsemblePredictor`),
and loading them (:func:`load_gnn`, :func:`load_predictor`): numpy only, no torch (:mod:`gnn_forward`).

Both return the trees' prediction dicts (:func:`perf4sight.fingerprint.predict.prediction_rows`),
one per (network, batch size), network-major: ``latency_ms`` (ms), ``memory_mb`` (MiB), their
bands from the stored group-conformal log-ratio quantiles, and ``fits`` (memory <= the device's
capacity in MiB, where known). The ensemble is the geometric mean of the trees' and the GNN's
predictions.
"""
from __future__ import annotations

import json
import zipfile
from pathlib import Path
from typing import Any, Sequence

import numpy as np

from perf4sight.config import PREDICTORS
from perf4sight.errors import UserError
from perf4sight.features.step_runtime import StepRuntime
from perf4sight.fingerprint.gnn_baseline import AnalyticBaseline
from perf4sight.fingerprint.gnn_forward import GNNForward, Normaliser, predict_latency_memory
from perf4sight.fingerprint.gnn_graph import EDGE_FEATURES, GLOBAL_FEATURES, NODE_FEATURES, graph_template
from perf4sight.fingerprint.predict import ModuleQueries, as_descriptions, batch_list, prediction_rows
from perf4sight.fingerprint.storage import check_metadata, reading
from perf4sight.ir.schema import NetworkDescription

__all__ = ["GNNPredictor", "EnsemblePredictor", "load_gnn", "load_predictor", "GNN_JSON", "GNN_WEIGHTS", "FORMAT"]

GNN_JSON = "gnn.json"
#: the model's ``state_dict`` as plain arrays (``np.load(allow_pickle=False)``: no code); a GNN stored before
#: 2026-11-28 has :data:`OLD_GNN_WEIGHTS` instead, read with torch
GNN_WEIGHTS = "gnn_weights.npz"
OLD_GNN_WEIGHTS = "gnn_weights.pt"
FORMAT = "perf4sight-gnn-v1"


def _rows(names: list[str], bss: list[int], pred: np.ndarray, bands: dict[str, list[float]],
          capacity: float | None) -> list[dict[str, Any]]:
    """Prediction dicts from ``pred`` ([n, 2] latency ms, memory MiB, network-major); fits = memory <= capacity
    (None where the capacity is unknown)."""
    return prediction_rows(names, bss, pred[:, 0], pred[:, 1], bands,
                           [None if capacity is None else m <= capacity for m in pred[:, 1]])


class GNNPredictor(ModuleQueries):
    """A loaded GNN: ``predict(descs, batch_sizes)`` returns the trees' prediction dicts."""

    def __init__(self, model: GNNForward, norm: Normaliser, metadata: dict[str, Any]):
        self.model, self.norm, self.metadata = model, norm, metadata
        self.base = AnalyticBaseline.stored(metadata.get("base"))
        self.device: str = metadata.get("device", "")
        self.input_shape: list[int] | None = metadata.get("input_shape")
        self.capacity_mb: float | None = metadata.get("capacity_mb")
        self.bands = metadata.get("interval", {}).get("log_ratio_quantiles", {}).get("gnn", {})
        # the rules of the training rows' torch (a GNN stored before 2026-11-26 names its optimiser alone: the rules
        # of before for the rest), whose step the queries' features are of (another optimiser's: for_optimizer)
        self.runtime = StepRuntime.from_metadata(metadata)
        self.fitted_optimizer: str = self.runtime.optimizer
        self.fitted_loss: str = self.runtime.loss

    def outside_training(self, descs: Any, batch_sizes: int | Sequence[int]) -> list[str]:
        """As :meth:`perf4sight.fingerprint.predict.Fingerprint.outside_training`, on the GNN's training rows
        (the input shape's line alone for a GNN fitted before they were stored)."""
        from perf4sight.features.aggregate import network_features
        from perf4sight.fingerprint.domain import query_notes
        bss = batch_list(batch_sizes)
        descs = as_descriptions(descs, (NetworkDescription,), caller="outside_training")
        return list(filter(None, [self.shape_line(descs)])) + query_notes(
            self.metadata.get("training_domain"), [network_features(d, self.runtime) for d in descs], bss)

    def predict_array(self, descs: Sequence[NetworkDescription], bss: list[int]) -> np.ndarray:
        """[len(descs) * len(bss), 2] latency (ms) and memory (MiB), network-major."""
        tl = [t for t in (graph_template(d, self.runtime) for d in descs) for _ in bss]  # one template per network
        return predict_latency_memory(self.model, self.norm, self.base, tl, bss * len(descs))

    def predict(self, descs: NetworkDescription | str | Path | Sequence[NetworkDescription | str | Path],
                batch_sizes: int | Sequence[int]) -> list[dict[str, Any]]:
        """One dict per (network, batch size): latency (ms), memory (MiB), bands, ``fits``. ``descs``:
        descriptions, description file paths, or one of them; ``batch_sizes``: an int or a list of ints."""
        bss = batch_list(batch_sizes)
        descs = as_descriptions(descs, (NetworkDescription,))
        return _rows([d.name for d in descs], bss, self.predict_array(descs, bss), self.bands, self.capacity_mb)


class EnsemblePredictor(ModuleQueries):
    """Geometric mean of the trees' and the GNN's predictions; bands from the ensemble's own
    out-of-fold residuals. ``fits`` where both predictors say it fits, each against its own capacity (the trees'
    is compared with their analytic demand, not with a memory figure: the mean's could not be held against it);
    ``capacity_mb`` is the trees' (else the GNN's), for display."""

    def __init__(self, trees: Any, gnn: GNNPredictor):
        self.trees, self.gnn = trees, gnn
        if trees.optimizer != gnn.optimizer:
            raise UserError(f"the ensemble's trees were fitted on rows of a step with {trees.optimizer}, its GNN on "
                            f"rows with {gnn.optimizer}: fit both again (--stage fingerprint --predictor ensemble)")
        if trees.loss != gnn.loss:
            raise UserError(f"the ensemble's trees were fitted on rows of a step with loss {trees.loss}, its GNN on "
                            f"rows with {gnn.loss}: fit both again (--stage fingerprint --predictor ensemble)")
        self.fitted_optimizer, self.fitted_loss, self.runtime = trees.fitted_optimizer, trees.fitted_loss, trees.runtime
        self.device, self.input_shape = gnn.device, trees.input_shape or gnn.input_shape
        self.capacity_mb = trees.capacity_mb if trees.capacity_mb is not None else gnn.capacity_mb
        self.capacity_basis = getattr(trees, "capacity_basis", "prediction") if trees.capacity_mb is not None \
            else "prediction"
        self.bands = gnn.metadata.get("interval", {}).get("log_ratio_quantiles", {}).get("ensemble", {})
        self.metadata = gnn.metadata

    def outside_training(self, descs: Any, batch_sizes: int | Sequence[int]) -> list[str]:
        """The trees' :meth:`~perf4sight.fingerprint.predict.Fingerprint.outside_training` (both were fitted
        on the same rows)."""
        return self.trees.outside_training(descs, batch_sizes)

    def predict(self, descs: NetworkDescription | str | Path | Sequence[NetworkDescription | str | Path],
                batch_sizes: int | Sequence[int]) -> list[dict[str, Any]]:
        """As :meth:`GNNPredictor.predict`, from the geometric mean of both predictors."""
        bss = batch_list(batch_sizes)
        descs = as_descriptions(descs, (NetworkDescription,))
        g = self.gnn.predict_array(descs, bss)
        t = self.trees.predict(descs, bss)
        tarr = np.array([[r["latency_ms"], r["memory_mb"]] for r in t])
        cap = self.gnn.capacity_mb
        fits = [_both(r["fits"], None if cap is None else bool(m <= cap)) for r, m in zip(t, g[:, 1])]
        mean = np.sqrt(g * tarr)
        return prediction_rows([d.name for d in descs], bss, mean[:, 0], mean[:, 1], self.bands, fits)


def _both(a: bool | None, b: bool | None) -> bool | None:
    """Fits by both of two answers (None: that predictor knows no capacity); None where neither knows one."""
    known = [x for x in (a, b) if x is not None]
    return all(known) if known else None


def _weights(folder: Path) -> dict[str, np.ndarray]:
    """The stored ``state_dict`` as arrays: :data:`GNN_WEIGHTS`, else an older GNN's :data:`OLD_GNN_WEIGHTS` (torch,
    ``weights_only=True``: tensors, no code)."""
    if (folder / GNN_WEIGHTS).is_file():
        with np.load(folder / GNN_WEIGHTS, allow_pickle=False) as arrays:
            return {k: arrays[k] for k in arrays.files}
    import torch  # an older GNN's file only
    state = torch.load(folder / OLD_GNN_WEIGHTS, weights_only=True, map_location="cpu")
    return {k: v.numpy() for k, v in state.items()}


def _check_finite(arrays: dict[str, Any]) -> None:
    """``ValueError`` naming the first of ``arrays`` (a GNN's weights, its normaliser's statistics) that is not all
    finite numbers: a NaN there made every figure NaN, which ``--json`` printed as ``NaN`` (not JSON)."""
    for name, values in arrays.items():
        a = np.asarray(values)
        if a.dtype.kind not in "fiu" or not np.all(np.isfinite(a)):
            raise ValueError(f"{name}: not finite numbers")


def read_gnn_files(folder: Path) -> tuple[Any, dict[str, np.ndarray]]:
    """``gnn.json`` (parsed) and the weights of the GNN in ``folder``, read under its shared lock
    (``storage.reading``): not a fit's new weights with its old gnn.json (``gnn.save_gnn_files``)."""
    with reading(folder):
        text = (folder / GNN_JSON).read_text()
        weights = _weights(folder)
    return json.loads(text), weights


def load_gnn(out_dir: str | Path) -> GNNPredictor:
    """Load ``gnn.json`` and its weights (:data:`GNN_WEIGHTS`, or an older GNN's :data:`OLD_GNN_WEIGHTS`)."""
    import pickle
    d = Path(out_dir)
    jp = d / GNN_JSON
    if not jp.is_file() or not ((d / GNN_WEIGHTS).is_file() or (d / OLD_GNN_WEIGHTS).is_file()):
        raise UserError(f"{d}: no GNN here (need {GNN_JSON} and {GNN_WEIGHTS}; fit with --predictor gnn)")
    try:
        meta, weights = read_gnn_files(d)
        if meta.get("format") != FORMAT or meta.get("node_features") != list(NODE_FEATURES) \
                or meta.get("global_features") != list(GLOBAL_FEATURES):
            raise UserError(f"{jp}: GNN made with other features or format; refit the fingerprint")
        check_metadata(meta)
        st = meta["settings"]
        norm = Normaliser.from_json(meta["normaliser"])
        norm.check(len(NODE_FEATURES), len(EDGE_FEATURES), len(GLOBAL_FEATURES))
        _check_finite({**weights, **{f"normaliser.{k}": meta["normaliser"][k] for k in ("x", "e", "u", "y")}})
        model = GNNForward(st["arch"], weights, int(st["layers"]))
        model.check(len(NODE_FEATURES), len(EDGE_FEATURES), len(GLOBAL_FEATURES), int(st["hidden"]))
        return GNNPredictor(model, norm, meta)  # which reads the rest of the metadata
    except (json.JSONDecodeError, KeyError, RuntimeError, ValueError, TypeError, AttributeError, OSError, EOFError,
            pickle.UnpicklingError, zipfile.BadZipFile) as exc:
        raise UserError(f"{d}: GNN files are damaged or incompatible ({type(exc).__name__}: {exc})") from None


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
