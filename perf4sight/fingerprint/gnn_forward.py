"""The GNN's inference in numpy: predictions without torch or torch_geometric.

Importing those two costs seconds (5.4 s on a slow host) where one network's pass costs milliseconds, so a
stored GNN is read and run here; only training (:mod:`gnn_train`) needs torch. :class:`GNNForward` computes what
:class:`perf4sight.fingerprint.gnn_model.GNNModel` computes, in float32, from the same ``state_dict`` as plain
arrays (names as torch gives them: ``enc_x.0.weight``, ``layers.1.lin_l.bias``...). Aggregations follow
torch_geometric's: a node that receives no edge reads 0 from both the mean and the max.

Also the normaliser of the inputs and targets (:class:`Normaliser`, stored as JSON) and the samples' arrays
(:func:`sample_arrays`), which training wraps as tensors.
"""
from __future__ import annotations

import warnings
from dataclasses import dataclass
from typing import Any, Sequence

import numpy as np

from perf4sight.features.aggregate import feature_matrix
from perf4sight.fingerprint.gnn_graph import GraphTemplate, global_features

__all__ = ["GNNForward", "Normaliser", "SampleArrays", "standardise", "sample_arrays", "predict_latency_memory"]

LAYER_NORM_EPS = 1e-5  # torch.nn.LayerNorm's default, as GNNModel builds it
#: An input column (all are log1p of a count or a size) whose std over the training split is at most this is
#: constant there: it moves the quantity by 0.1% at most. One network at batch sizes 1 and 2 (each fold of a fit on
#: two networks) moves its weight-bound totals by 1e-4; scaled by that, the other network's value sat 1e5 stds out,
#: and its out-of-fold figure came out e^-670 of the measured. On the TX2 data the least spread of a column that
#: moves is 0.048 (any fold), so nothing there changes.
INPUT_SPREAD = 1e-3


@dataclass
class Normaliser:
    """Mean and std of node, edge, global features and of the log targets (training split)."""

    x: tuple[list[float], list[float]]
    e: tuple[list[float], list[float]]
    u: tuple[list[float], list[float]]
    y: tuple[list[float], list[float]]

    @staticmethod
    def _stats(a: np.ndarray, constant_sd: float = 1.0, spread: float = 1e-6) -> tuple[list[float], list[float]]:
        """Column mean and std, ignoring NaN; a constant column (std at most ``spread``) gets std ``constant_sd``
        (0: :func:`standardise` sets the column to 0 everywhere)."""
        a = np.asarray(a, dtype=np.float64)  # float32 sums leave a constant column a std of ~1e-6
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)
            mu = np.nan_to_num(np.nanmean(a, axis=0)) if len(a) else np.zeros(a.shape[1])
            sd = np.nanstd(a, axis=0) if len(a) else np.ones(a.shape[1])
        sd = np.where(np.isfinite(sd) & (sd > spread), sd, constant_sd)
        return [float(v) for v in mu], [float(v) for v in sd]

    @classmethod
    def fit(cls, templates: Sequence[GraphTemplate], u: np.ndarray, y: np.ndarray) -> "Normaliser":
        """Statistics from the training networks' graphs (each counted once) and training samples. An input
        column that is constant in training (to :data:`INPUT_SPREAD`) is dropped (std 0): it taught the model
        nothing, and a value it never took there (a depthwise count on a held-out MobileNet, a network without a
        linear layer) would otherwise reach the model unscaled, or scaled by a spread of next to nothing."""
        return cls(cls._stats(np.concatenate([t.x for t in templates]), 0.0, INPUT_SPREAD),
                   cls._stats(np.concatenate([t.edge_attr for t in templates]), 0.0, INPUT_SPREAD),
                   cls._stats(u, 0.0, INPUT_SPREAD), cls._stats(y))

    def to_json(self) -> dict[str, Any]:
        return {"x": list(self.x), "e": list(self.e), "u": list(self.u), "y": list(self.y)}

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> "Normaliser":
        return cls(*(tuple(d[k]) for k in ("x", "e", "u", "y")))  # type: ignore[arg-type]

    def check(self, node_dim: int, edge_dim: int, global_dim: int, outputs: int = 2) -> None:
        """``ValueError`` naming the first part (``normaliser.x``...) that is not a mean and a std per column of its
        features (stds not negative; the targets' positive). Read unchecked, a part one column short ended a query in
        numpy's broadcast error, and a target part of one column (or of two numbers) gave both targets its figures."""
        for name, n in (("x", node_dim), ("e", edge_dim), ("u", global_dim), ("y", outputs)):
            part = getattr(self, name)
            ok = (isinstance(part, (list, tuple)) and len(part) == 2
                  and all(isinstance(c, list) and len(c) == n for c in part)
                  and all(isinstance(v, (int, float)) and not isinstance(v, bool) for c in part for v in c))
            sd = np.asarray(part[1], dtype=float) if ok else None  # NaN passes here: load_gnn's finite check names it
            if not ok or np.any(sd <= 0 if name == "y" else sd < 0):
                sign = "positive" if name == "y" else "non-negative"
                raise ValueError(f"normaliser.{name} is not a mean and a {sign} std for each of its {n} columns")


def standardise(a: np.ndarray, stats: tuple[list[float], list[float]]) -> np.ndarray:
    """Standardised columns (float32); a column with std 0 (constant in training) is 0."""
    mu, sd = np.asarray(stats[0]), np.asarray(stats[1])
    z = np.divide(a - mu, sd, out=np.zeros(np.broadcast_shapes(np.shape(a), sd.shape)), where=sd > 0)
    return z.astype(np.float32)


@dataclass
class SampleArrays:
    """Standardised inputs: one graph per distinct network (``x``, ``edge_index``, ``edge_attr``, ``u0``: the
    graph-level features at batch size 1) and one row of graph-level features per (network, batch) sample."""

    graphs: list[dict[str, np.ndarray]]
    graph_of_sample: np.ndarray  # int [samples]
    u: np.ndarray                # [samples, global features]


def sample_arrays(templates: Sequence[GraphTemplate], batch_sizes: Sequence[int], norm: Normaliser) -> SampleArrays:
    """The inputs of the samples ``templates[i]`` at ``batch_sizes[i]``, each template's graph once (by identity:
    two networks of one name, e.g. one at two input shapes, are two graphs)."""
    order: dict[int, int] = {}
    graphs: list[dict[str, np.ndarray]] = []
    for t in templates:
        if id(t) not in order:
            order[id(t)] = len(graphs)
            graphs.append({"x": standardise(t.x, norm.x), "edge_index": t.edge_index,
                           "edge_attr": standardise(t.edge_attr, norm.e),
                           "u0": standardise(global_features([t], [1]), norm.u)})
    return SampleArrays(graphs, np.array([order[id(t)] for t in templates], dtype=np.int64),
                        standardise(global_features(list(templates), list(batch_sizes)), norm.u))


def _silu(x: np.ndarray) -> np.ndarray:
    """x * sigmoid(x), the sigmoid through tanh (no overflow for large |x|)."""
    return x * (0.5 + 0.5 * np.tanh(0.5 * x))


def _mean_and_max(values: np.ndarray, index: np.ndarray, n: int) -> np.ndarray:
    """``values`` rows gathered into ``n`` rows by ``index``: their mean beside their max, [n, 2 * width] (both
    layers read them in that order); a row that receives none is 0 in both."""
    count = np.bincount(index, minlength=n)
    total = np.zeros((n, values.shape[1]), dtype=values.dtype)
    np.add.at(total, index, values)
    top = np.full((n, values.shape[1]), -np.inf, dtype=values.dtype)
    np.maximum.at(top, index, values)
    top[count == 0] = 0.0
    return np.concatenate([total / np.maximum(count, 1).astype(values.dtype)[:, None], top], axis=1)


class GNNForward:
    """A stored GNN's forward pass; ``state``: its ``state_dict`` as float32 arrays, ``arch`` ``sage`` or
    ``seernet``, ``layers`` its message-passing rounds."""

    def __init__(self, arch: str, state: dict[str, np.ndarray], layers: int):
        self.arch, self.layers = arch, layers
        self.state = {k: np.asarray(v, dtype=np.float32) for k, v in state.items()}

    def check(self, node_dim: int, edge_dim: int, global_dim: int, hidden: int, outputs: int = 2) -> None:
        """``ValueError`` unless the arrays are those of a ``GNNModel`` of these sizes, name for name and shape
        for shape (as torch's ``load_state_dict`` checks)."""
        h, want = hidden, {}

        def mlp(name: str, i: int, o: int) -> None:
            want.update({f"{name}.0.weight": (h, i), f"{name}.0.bias": (h,), f"{name}.2.weight": (o, h),
                         f"{name}.2.bias": (o,)})
        for name, i, o in (("enc_x", node_dim, h), ("enc_u", global_dim, h), ("global_path", global_dim, h),
                           ("head", 4 * h, outputs)):
            mlp(name, i, o)
        if self.arch == "seernet":
            mlp("enc_e", edge_dim, h)
            for k in range(self.layers):
                for part, i in (("edge", 4 * h), ("node", 4 * h), ("glob", 3 * h)):
                    mlp(f"layers.{k}.{part}", i, h)
                want.update({f"layers.{k}.norm_x.weight": (h,), f"layers.{k}.norm_x.bias": (h,)})
        elif self.arch == "sage":
            for k in range(self.layers):
                want.update({f"layers.{k}.lin_l.weight": (h, 2 * h), f"layers.{k}.lin_l.bias": (h,),
                             f"layers.{k}.lin_r.weight": (h, h)})
        else:
            raise ValueError(f"unknown GNN architecture {self.arch!r}")
        got = {k: v.shape for k, v in self.state.items()}
        wrong = sorted(k for k in set(want) | set(got) if want.get(k) != got.get(k))
        if wrong:
            k = wrong[0]
            raise ValueError(f"the weights are not those of a {self.arch} GNN of width {h} and {self.layers} layers: "
                             f"{k} is {got.get(k, 'missing')}, expected {want.get(k, 'none')}")

    def _linear(self, name: str, x: np.ndarray) -> np.ndarray:
        y = x @ self.state[f"{name}.weight"].T
        bias = self.state.get(f"{name}.bias")
        return y if bias is None else y + bias

    def _mlp(self, name: str, x: np.ndarray) -> np.ndarray:
        return self._linear(f"{name}.2", _silu(self._linear(f"{name}.0", x)))

    def _layer_norm(self, name: str, x: np.ndarray) -> np.ndarray:
        mu = x.mean(axis=1, keepdims=True)
        var = ((x - mu) ** 2).mean(axis=1, keepdims=True)
        return (x - mu) / np.sqrt(var + LAYER_NORM_EPS) * self.state[f"{name}.weight"] + self.state[f"{name}.bias"]

    def _seer_layer(self, k: int, x: np.ndarray, e: np.ndarray, u: np.ndarray,
                    edge_index: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """One round of ``_SeerLayer`` on one graph (``u``: its global state, [1, hidden])."""
        s, d = edge_index
        n, p = len(x), f"layers.{k}"
        e = e + self._mlp(f"{p}.edge", np.concatenate([e, x[s], x[d], np.repeat(u, len(s), axis=0)], axis=1))
        node_in = np.concatenate([x, _mean_and_max(e, d, n), np.repeat(u, n, axis=0)], axis=1)
        x = self._layer_norm(f"{p}.norm_x", x + self._mlp(f"{p}.node", node_in))
        u = u + self._mlp(f"{p}.glob", np.concatenate([u, x.mean(axis=0, keepdims=True), x.max(axis=0, keepdims=True)],
                                                      axis=1))
        return x, e, u

    def _sage_layer(self, k: int, h: np.ndarray, edge_index: np.ndarray) -> np.ndarray:
        """``SAGEConv(aggr=["mean", "max"])``: the incoming neighbours' mean and max side by side through
        ``lin_l``, plus the node's own state through ``lin_r`` (no bias)."""
        s, d = edge_index
        agg = _mean_and_max(h[s], d, len(h))
        return self._linear(f"layers.{k}.lin_l", agg) + h @ self.state[f"layers.{k}.lin_r.weight"].T

    def embed(self, graph: dict[str, np.ndarray]) -> np.ndarray:
        """One graph's embedding [3 * hidden]: mean and max of its node states and its global state."""
        h, u = self._mlp("enc_x", graph["x"]), self._mlp("enc_u", graph["u0"])
        if self.arch == "seernet":
            e = self._mlp("enc_e", graph["edge_attr"])
            for k in range(self.layers):
                h, e, u = self._seer_layer(k, h, e, u, graph["edge_index"])
        else:
            h = h + u
            for k in range(self.layers):
                h = h + _silu(self._sage_layer(k, h, graph["edge_index"]))
        return np.concatenate([h.mean(axis=0), h.max(axis=0), u[0]])

    def __call__(self, arrays: SampleArrays) -> np.ndarray:
        """Standardised log targets [samples, outputs]. Each sample's figures are the same whatever the other
        samples: each graph is embedded alone, and the per-sample layers multiply a stack of [1, width] rows (a
        matrix product of many rows sums each row in an order that depends on their number: float32 figures moved
        in the seventh significant digit with the rest of a query)."""
        emb = np.stack([self.embed(g) for g in arrays.graphs])
        u = arrays.u[:, None, :]
        return self._mlp("head", np.concatenate([emb[arrays.graph_of_sample][:, None, :],
                                                 self._mlp("global_path", u)], axis=2))[:, 0, :]


def predict_latency_memory(net: GNNForward, norm: Normaliser, base: Any, tl: list[GraphTemplate],
                           bs: Sequence[int]) -> np.ndarray:
    """Predicted latency (ms) and memory (MiB), shape [n, 2], of the networks ``tl`` at batch sizes ``bs``;
    ``base``: the analytic baseline the GNN corrects (:class:`.gnn_baseline.AnalyticBaseline`)."""
    F = feature_matrix([t.features for t in tl], list(bs))
    z = net(sample_arrays(tl, bs, norm)).astype(np.float64)
    return np.exp(z * np.asarray(norm.y[1]) + np.asarray(norm.y[0]) + base.log(F))
