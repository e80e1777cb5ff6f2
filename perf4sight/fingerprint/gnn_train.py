"""Training and inference loops of the GNN predictor (CPU).

Samples are (network, batch size) pairs with targets ``log(latency ms)`` and ``log(memory MiB)``;
a missing target is masked out of the loss. Features and targets are standardised with
statistics of the training split only (:class:`Normaliser`, stored as JSON). Loss: L1 on the
standardised log targets (close to a relative-error loss). Early stopping watches the loss on a
validation split that holds out whole networks. A training step takes a few networks and all
their (batch size) samples: the graph part runs once per network.

:func:`train_on_samples` and :func:`predict_latency_memory` wrap these loops with the analytic
baseline (:mod:`perf4sight.fingerprint.gnn_baseline`): the model learns the log targets less the
log baseline, and predictions come back as latency (ms) and memory (MiB).
"""
from __future__ import annotations

import copy
import warnings
from dataclasses import dataclass
from typing import Any, Sequence

import numpy as np
import torch

with warnings.catch_warnings():  # torch_geometric calls torch.jit.script at import: a FutureWarning
    warnings.filterwarnings("ignore", message=".*torch.jit.script.* is deprecated", category=FutureWarning)
    from torch_geometric.data import Batch, Data

from perf4sight.features.aggregate import feature_matrix
from perf4sight.fingerprint.gnn_baseline import AnalyticBaseline
from perf4sight.fingerprint.gnn_graph import (EDGE_FEATURES, GLOBAL_FEATURES, NODE_FEATURES, GraphTemplate,
                                              global_features)
from perf4sight.fingerprint.gnn_model import GNNModel
from perf4sight.fingerprint.gnn_samples import TARGETS, Samples

__all__ = ["Normaliser", "SampleSet", "TrainSettings", "make_data", "train_model", "predict_log", "train_on_samples",
           "predict_latency_memory"]


@dataclass
class Normaliser:
    """Mean and std of node, edge, global features and of the log targets (training split)."""

    x: tuple[list[float], list[float]]
    e: tuple[list[float], list[float]]
    u: tuple[list[float], list[float]]
    y: tuple[list[float], list[float]]

    @staticmethod
    def _stats(a: np.ndarray, constant_sd: float = 1.0) -> tuple[list[float], list[float]]:
        """Column mean and std, ignoring NaN; a constant column gets std ``constant_sd`` (0: :func:`_norm`
        sets the column to 0 everywhere)."""
        a = np.asarray(a, dtype=np.float64)  # float32 sums leave a constant column a std of ~1e-6
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)
            mu = np.nan_to_num(np.nanmean(a, axis=0)) if len(a) else np.zeros(a.shape[1])
            sd = np.nanstd(a, axis=0) if len(a) else np.ones(a.shape[1])
        sd = np.where(np.isfinite(sd) & (sd > 1e-6), sd, constant_sd)
        return [float(v) for v in mu], [float(v) for v in sd]

    @classmethod
    def fit(cls, templates: Sequence[GraphTemplate], u: np.ndarray, y: np.ndarray) -> "Normaliser":
        """Statistics from the training networks' graphs (each counted once) and training samples. An input
        column that is constant in training is dropped (std 0): it taught the model nothing, and a value it
        never took there (a depthwise count on a held-out MobileNet, a network without a linear layer) would
        otherwise reach the model unscaled."""
        return cls(cls._stats(np.concatenate([t.x for t in templates]), 0.0),
                   cls._stats(np.concatenate([t.edge_attr for t in templates]), 0.0),
                   cls._stats(u, 0.0), cls._stats(y))

    def to_json(self) -> dict[str, Any]:
        return {"x": list(self.x), "e": list(self.e), "u": list(self.u), "y": list(self.y)}

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> "Normaliser":
        return cls(*(tuple(d[k]) for k in ("x", "e", "u", "y")))  # type: ignore[arg-type]


def _norm(a: np.ndarray, stats: tuple[list[float], list[float]]) -> torch.Tensor:
    """Standardised columns; a column with std 0 (constant in training) is 0."""
    mu, sd = np.asarray(stats[0]), np.asarray(stats[1])
    z = np.divide(a - mu, sd, out=np.zeros(np.broadcast_shapes(np.shape(a), sd.shape)), where=sd > 0)
    return torch.from_numpy(z.astype(np.float32))


@dataclass
class SampleSet:
    """Normalised tensors: one graph per distinct network and one row per (network, batch) sample."""

    graphs: list[Data]          # per network: x, edge_index, edge_attr, u0 (graph-level features at batch 1)
    graph_of_sample: np.ndarray  # int [samples]
    u: torch.Tensor              # [samples, global features]
    y: torch.Tensor | None = None     # [samples, targets], standardised log targets (0 where missing)
    mask: torch.Tensor | None = None  # [samples, targets], 1 where the target was measured


def make_data(templates: Sequence[GraphTemplate], batch_sizes: Sequence[int], norm: Normaliser,
              y: np.ndarray | None = None) -> SampleSet:
    """Tensors for the samples (``templates[i]`` at ``batch_sizes[i]``); ``y`` = log targets (NaN = missing)."""
    order: dict[str, int] = {}
    graphs: list[Data] = []
    for t in templates:
        if t.name not in order:
            order[t.name] = len(graphs)
            graphs.append(Data(x=_norm(t.x, norm.x), edge_index=torch.from_numpy(t.edge_index),
                               edge_attr=_norm(t.edge_attr, norm.e), u0=_norm(global_features([t], [1]), norm.u)))
    ss = SampleSet(graphs, np.array([order[t.name] for t in templates], dtype=np.int64),
                   _norm(global_features(list(templates), list(batch_sizes)), norm.u))
    if y is not None:
        z = (y - np.asarray(norm.y[0])) / np.asarray(norm.y[1])
        ss.y = torch.from_numpy(np.nan_to_num(z).astype(np.float32))
        ss.mask = torch.from_numpy(np.isfinite(y).astype(np.float32))
    return ss


@dataclass
class TrainSettings:
    """Model and optimiser settings (stored in the GNN's JSON). A step takes ``graphs_per_step``
    networks with all their samples."""

    arch: str = "sage"
    hidden: int = 64
    layers: int = 3
    lr: float = 3e-3
    weight_decay: float = 1e-5
    graphs_per_step: int = 8
    max_epochs: int = 300
    patience: int = 40
    val_share: float = 0.2
    seed: int = 0
    threads: int = 1  # torch intra-op threads while training: small graphs run faster on one


def train_model(ss: SampleSet, names: Sequence[str], dims: tuple[int, int, int], outputs: int,
                s: TrainSettings) -> tuple[GNNModel, dict[str, Any]]:
    """Train on ``ss`` (``names[g]`` = network of graph ``g``); ``val_share`` of the networks (at least
    one when there are >= 3) are held out for early stopping. Returns the best model and a summary."""
    before = torch.get_num_threads()
    torch.set_num_threads(max(1, s.threads))
    try:
        return _train_model(ss, names, dims, outputs, s)
    finally:
        torch.set_num_threads(before)


def _forward(model: GNNModel, ss: SampleSet, graph_ids: np.ndarray) -> tuple[torch.Tensor, np.ndarray]:
    """Outputs for every sample of the graphs ``graph_ids``, and those samples' indices."""
    local = {int(g): k for k, g in enumerate(graph_ids)}
    samples = np.nonzero(np.isin(ss.graph_of_sample, graph_ids))[0]
    b = Batch.from_data_list([ss.graphs[int(g)] for g in graph_ids])
    gos = torch.tensor([local[int(g)] for g in ss.graph_of_sample[samples]], dtype=torch.long)
    return model(b.x, b.edge_index, b.edge_attr, b.u0, b.batch, ss.u[samples], gos), samples


def _l1(out: torch.Tensor, ss: SampleSet, samples: np.ndarray) -> torch.Tensor:
    m = ss.mask[samples]
    return (torch.abs(out - ss.y[samples]) * m).sum() / m.sum().clamp(min=1)


def _eval_loss(model: GNNModel, ss: SampleSet, graph_ids: np.ndarray) -> float:
    model.eval()
    with torch.no_grad():
        out, samples = _forward(model, ss, graph_ids)
        return float(_l1(out, ss, samples))


def _train_model(ss: SampleSet, names: Sequence[str], dims: tuple[int, int, int], outputs: int,
                 s: TrainSettings) -> tuple[GNNModel, dict[str, Any]]:
    torch.manual_seed(s.seed)
    rng = np.random.default_rng(s.seed)
    n = len(ss.graphs)
    n_val = max(1, int(round(s.val_share * n))) if n >= 3 else 0
    perm = rng.permutation(n)
    val, train = np.sort(perm[:n_val]), np.sort(perm[n_val:])
    model = GNNModel(s.arch, *dims, hidden=s.hidden, layers=s.layers, outputs=outputs)
    opt = torch.optim.AdamW(model.parameters(), lr=s.lr, weight_decay=s.weight_decay)
    sched = torch.optim.lr_scheduler.CosineAnnealingLR(opt, T_max=max(1, s.max_epochs))
    best, best_state, best_epoch, epochs = float("inf"), copy.deepcopy(model.state_dict()), 0, 0
    for epoch in range(s.max_epochs):
        epochs = epoch + 1
        model.train()
        order = rng.permutation(train)
        for k in range(0, len(order), s.graphs_per_step):
            out, samples = _forward(model, ss, order[k:k + s.graphs_per_step])
            loss = _l1(out, ss, samples)
            opt.zero_grad()
            loss.backward()
            opt.step()
        sched.step()
        watch = _eval_loss(model, ss, val if len(val) else train)
        if watch < best - 1e-4:
            best, best_state, best_epoch = watch, copy.deepcopy(model.state_dict()), epoch
        elif epoch - best_epoch >= s.patience:
            break
    model.load_state_dict(best_state)
    model.eval()
    return model, {"epochs": epochs, "best_epoch": best_epoch, "best_watch_loss": round(best, 5),
                   "watched": "validation networks" if len(val) else "training loss (too few networks to hold out)",
                   "validation_networks": sorted(names[int(g)] for g in val),
                   "training_samples": int(np.isin(ss.graph_of_sample, train).sum())}


def predict_log(model: GNNModel, ss: SampleSet, norm: Normaliser, chunk: int = 32) -> np.ndarray:
    """Log targets (de-standardised), shape [samples, outputs], in the samples' order."""
    out = np.zeros((len(ss.graph_of_sample), len(norm.y[0])), dtype=np.float64)
    model.eval()
    with torch.no_grad():
        ids = np.arange(len(ss.graphs))
        for k in range(0, len(ids), chunk):
            o, samples = _forward(model, ss, ids[k:k + chunk])
            out[samples] = o.numpy()
    return out * np.asarray(norm.y[1]) + np.asarray(norm.y[0])


def train_on_samples(s: Samples, idx: np.ndarray, st: TrainSettings,
                     base_kind: str) -> tuple[GNNModel, Normaliser, AnalyticBaseline, dict[str, Any]]:
    """Baseline (``base_kind``: analytic | none), normaliser and model fitted on the samples ``idx`` of ``s``."""
    tl = s.tmpl(idx)
    base = AnalyticBaseline.fit(s.F[idx], s.Y[idx], base_kind)
    R = s.Y[idx] - base.log(s.F[idx])
    uniq = list({t.name: t for t in tl}.values())
    norm = Normaliser.fit(uniq, global_features(tl, s.bs[idx]), R)
    ss = make_data(tl, s.bs[idx], norm, R)
    names = list({t.name: None for t in tl})  # graph order of make_data
    dims = (len(NODE_FEATURES), len(EDGE_FEATURES), len(GLOBAL_FEATURES))
    model, summary = train_model(ss, names, dims, len(TARGETS), st)
    return model, norm, base, summary


def predict_latency_memory(model: GNNModel, norm: Normaliser, base: AnalyticBaseline, tl: list[GraphTemplate],
                           bs: Sequence[int]) -> np.ndarray:
    """Predicted latency (ms) and memory (MiB), shape [n, 2]."""
    F = feature_matrix([t.features for t in tl], list(bs))
    return np.exp(predict_log(model, make_data(tl, list(bs), norm), norm) + base.log(F))
