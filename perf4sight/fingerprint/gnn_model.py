"""The GNN architectures: ``seernet`` (edge, node and global updates, after PerfSeer's SeerNet) and
``sage`` (GraphSAGE, after PerfSAGE). Both read normalised node, edge and graph-level features and
output standardised log targets (one column per target: log latency, log memory).

The graph part runs once per network (it sees the batch-independent graph-level features through
its global node); the batch size enters through a separate MLP path on the graph-level features
of each (network, batch size) sample, concatenated with the max+mean readout. So one training
step costs one GNN pass per network, not per sample.
"""
from __future__ import annotations

import os
import sys
import tempfile
import warnings

import torch
from torch import nn

with warnings.catch_warnings():  # torch_geometric calls torch.jit.script at import: a FutureWarning
    warnings.filterwarnings("ignore", message=".*torch.jit.script.* is deprecated", category=FutureWarning)
    from torch_geometric.nn import SAGEConv, global_max_pool, global_mean_pool
    from torch_geometric.utils import scatter

from perf4sight.config import GNN_ARCHS as ARCHS  # one list of architectures, in the config

__all__ = ["GNNModel", "ARCHS"]


def _remove_template_files() -> None:
    """Delete the Python files torch_geometric writes into the temporary folder for a message-passing layer's
    generated ``propagate`` (one per layer class and process, never removed: a CI machine collects hundreds). The
    modules stay loaded; only their source files go, once this process has imported them."""
    tmp = os.path.realpath(tempfile.gettempdir())
    for name, module in list(sys.modules.items()):
        path = getattr(module, "__file__", None) or ""
        if name.startswith("torch_geometric.") and os.path.dirname(os.path.realpath(path)) == tmp:
            try:
                os.unlink(path)
            except OSError:  # another process's, already gone
                pass


def _mlp(i: int, h: int, o: int) -> nn.Sequential:
    return nn.Sequential(nn.Linear(i, h), nn.SiLU(), nn.Linear(h, o))


class _SeerLayer(nn.Module):
    """One round: edges from (edge, source, target, global); nodes from (node, mean+max of incoming
    edges, global); global from (global, mean+max of nodes). Residual on all three."""

    def __init__(self, h: int):
        super().__init__()
        self.edge = _mlp(4 * h, h, h)
        self.node = _mlp(4 * h, h, h)
        self.glob = _mlp(3 * h, h, h)
        self.norm_x = nn.LayerNorm(h)

    def forward(self, x, e, u, edge_index, batch):
        s, d = edge_index
        e = e + self.edge(torch.cat([e, x[s], x[d], u[batch[s]]], dim=1))
        n = x.size(0)
        agg_mean = scatter(e, d, dim=0, dim_size=n, reduce="mean")
        agg_max = scatter(e, d, dim=0, dim_size=n, reduce="max")
        x = self.norm_x(x + self.node(torch.cat([x, agg_mean, agg_max, u[batch]], dim=1)))
        u = u + self.glob(torch.cat([u, global_mean_pool(x, batch), global_max_pool(x, batch)], dim=1))
        return x, e, u


class GNNModel(nn.Module):
    """``arch`` in :data:`ARCHS`; dimensions are the feature counts; ``outputs`` targets."""

    def __init__(self, arch: str, node_dim: int, edge_dim: int, global_dim: int, hidden: int = 64,
                 layers: int = 3, outputs: int = 2):
        super().__init__()
        if arch not in ARCHS:
            raise ValueError(f"unknown GNN architecture {arch!r} (known: {', '.join(ARCHS)})")
        self.arch = arch
        self.enc_x = _mlp(node_dim, hidden, hidden)
        self.enc_u = _mlp(global_dim, hidden, hidden)
        if arch == "seernet":
            self.enc_e = _mlp(edge_dim, hidden, hidden)
            self.layers = nn.ModuleList(_SeerLayer(hidden) for _ in range(layers))
        else:
            self.layers = nn.ModuleList(SAGEConv(hidden, hidden, aggr=["mean", "max"]) for _ in range(layers))
            _remove_template_files()
        self.global_path = _mlp(global_dim, hidden, hidden)
        self.head = _mlp(4 * hidden, hidden, outputs)

    def embed(self, x, edge_index, edge_attr, u0, batch):
        """Graph embeddings [graphs, 3 * hidden]: mean and max of the node states and the global node.
        ``u0`` = the normalised graph-level features at batch size 1 (one row per graph)."""
        h = self.enc_x(x)
        u = self.enc_u(u0)
        if self.arch == "seernet":
            e = self.enc_e(edge_attr)
            for layer in self.layers:
                h, e, u = layer(h, e, u, edge_index, batch)
        else:
            h = h + u[batch]
            for layer in self.layers:
                h = h + torch.nn.functional.silu(layer(h, edge_index))
        return torch.cat([global_mean_pool(h, batch), global_max_pool(h, batch), u], dim=1)

    def forward(self, x, edge_index, edge_attr, u0, batch, u_samples, graph_of_sample):
        """Standardised log targets [samples, outputs]; sample ``i`` is graph ``graph_of_sample[i]``
        at the batch size encoded in ``u_samples[i]`` (normalised graph-level features)."""
        emb = self.embed(x, edge_index, edge_attr, u0, batch)
        return self.head(torch.cat([emb[graph_of_sample], self.global_path(u_samples)], dim=1))
