"""Training loop of the GNN predictor (CPU, torch); inference is :mod:`gnn_forward`'s, in numpy.

Samples are (network, batch size) pairs with targets ``log(latency ms)`` and ``log(memory MiB)``;
a missing target is masked out of the loss. Features and targets are standardised with
statistics of the training split only (:class:`~perf4sight.fingerprint.gnn_forward.Normaliser`, stored as JSON).
Loss: L1 on the standardised log targets (close to a relative-error loss). Early stopping watches the loss on a
validation split that holds out whole networks. A training step takes a few networks and all
their (batch size) samples: the graph part runs once per network.

:func:`train_on_samples` wraps this loop with the analytic baseline (:mod:`perf4sight.fingerprint.gnn_baseline`):
the model learns the log targets less the log baseline, and comes back as the arrays of its numpy forward pass,
whose :func:`~perf4sight.fingerprint.gnn_forward.predict_latency_memory` gives latency (ms) and memory (MiB).
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

from perf4sight.fingerprint.gnn_baseline import AnalyticBaseline
from perf4sight.fingerprint.gnn_forward import GNNForward, Normaliser, sample_arrays
from perf4sight.fingerprint.gnn_graph import (EDGE_FEATURES, GLOBAL_FEATURES, NODE_FEATURES, GraphTemplate,
                                              global_features)
from perf4sight.fingerprint.gnn_model import GNNModel
from perf4sight.fingerprint.gnn_samples import TARGETS, Samples

__all__ = ["SampleSet", "TrainSettings", "make_data", "train_model", "train_on_samples", "forward_of"]


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
    a = sample_arrays(templates, batch_sizes, norm)
    graphs = [Data(x=torch.from_numpy(g["x"]), edge_index=torch.from_numpy(g["edge_index"]),
                   edge_attr=torch.from_numpy(g["edge_attr"]), u0=torch.from_numpy(g["u0"])) for g in a.graphs]
    ss = SampleSet(graphs, a.graph_of_sample, torch.from_numpy(a.u))
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


def forward_of(model: GNNModel) -> GNNForward:
    """The trained ``model`` as the arrays of its numpy forward pass (what is stored, and what predicts)."""
    state = {k: v.detach().cpu().numpy() for k, v in model.state_dict().items()}
    return GNNForward(model.arch, state, len(model.layers))


def train_on_samples(s: Samples, idx: np.ndarray, st: TrainSettings,
                     base_kind: str) -> tuple[GNNForward, Normaliser, AnalyticBaseline, dict[str, Any]]:
    """Baseline (``base_kind``: analytic | none), normaliser and model (as :func:`forward_of`) fitted on the samples
    ``idx`` of ``s``."""
    tl = s.tmpl(idx)
    base = AnalyticBaseline.fit(s.F[idx], s.Y[idx], base_kind)
    R = s.Y[idx] - base.log(s.F[idx])
    uniq = list({t.name: t for t in tl}.values())
    norm = Normaliser.fit(uniq, global_features(tl, s.bs[idx]), R)
    ss = make_data(tl, s.bs[idx], norm, R)
    names = list({t.name: None for t in tl})  # graph order of make_data
    dims = (len(NODE_FEATURES), len(EDGE_FEATURES), len(GLOBAL_FEATURES))
    model, summary = train_model(ss, names, dims, len(TARGETS), st)
    return forward_of(model), norm, base, summary

