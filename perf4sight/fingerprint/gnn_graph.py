"""Graph tensors for the GNN predictor, from a network description.

Per network (batch-independent, computed once and cached):

- node features: one-hot op (over :data:`OP_VOCAB`), the op's attributes (channels, kernel,
  stride, padding, dilation, groups, bias, depthwise flag, all ``log1p``), ``log1p`` of the
  per-sample output elements and of the per-node costs from :data:`perf4sight.features.formulas.HANDLERS`
  (forward/backward FLOPs, MACs, bytes read/written, parameters, kernels, bytes kept for backward);
- edges: producer -> consumer plus the reverse edge (gradients flow backwards), each with
  ``[log1p(elements of the tensor on the edge, per sample), is_reverse]``.

Per (network, batch size), the graph-level vector is ``log1p`` of every network feature of
:func:`perf4sight.features.aggregate.feature_matrix` (batch size, input size, FLOP/byte totals,
kernel counts, the analytic memory estimate in MiB). Node costs are per sample; the batch size
reaches the nodes through the graph-level vector, which every layer reads. Units before the
log: FLOPs (1 multiply-add = 2 FLOPs), bytes (fp32), elements.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from perf4sight.errors import UserError
from perf4sight.features.aggregate import FEATURE_NAMES, NetworkFeatures, feature_matrix, network_features
from perf4sight.features.formulas import BYTES_PER_ELEMENT, OUTPUT, numel
from perf4sight.features.step_runtime import StepRuntime
from perf4sight.features.walk import walk
from perf4sight.ir.schema import NetworkDescription

__all__ = ["OP_VOCAB", "OP_TOKEN", "NODE_FEATURES", "EDGE_FEATURES", "GLOBAL_FEATURES", "GraphTemplate",
           "graph_template", "global_features"]

#: The one-hot op vocabulary, as it stood when the GNN was first stored. Kept fixed, so that a GNN fitted before an
#: op joined the schema still loads: such an op reads as the op of the vocabulary nearest it (:data:`OP_TOKEN`).
OP_VOCAB: tuple[str, ...] = (
    "adaptiveavgpool2d", "adaptivemaxpool2d", "add", "avgpool2d", "batchnorm2d", "cat", "conv2d", "dropout", "flatten",
    "gelu", "hardsigmoid", "hardswish", "identity", "input", "linear", "maxpool2d", "mean", "mul", "narrow", "relu",
    "relu6", "reshape", "select", "sigmoid", "silu", "squeeze", "tanh", "transpose", "unsqueeze")
#: Schema op -> the vocabulary's op it reads as (every op of the schema reads as itself or one of these).
OP_TOKEN: dict[str, str] = {**{op: op for op in OP_VOCAB},
                            "layernorm": "batchnorm2d", "permute": "transpose", "scale": "mul", "shift": "add",
                            "token": "cat", "attention": "linear", "window_attention": "linear",
                            "patch_merge": "cat", "interpolate": "adaptiveavgpool2d", "group_attention": "linear",
                            "matmul": "linear",  # a product of two activations: a GEMM
                            "leaky_relu": "relu", "elu": "relu", "softplus": "relu",
                            "mish": "silu", "groupnorm": "batchnorm2d",
                            "conv_transpose2d": "conv2d", "instancenorm": "batchnorm2d", "hardtanh": "relu6",
                            "softmax": "sigmoid",
                            # copies that place pixels anew (a border around the map; pixels into channels and back),
                            # as patch_merge's are
                            "pad": "cat", "pixel_shuffle": "cat", "pixel_unshuffle": "cat",
                            "prelu": "relu", "dropout2d": "dropout", "log_softmax": "sigmoid",
                            "selu": "relu", "celu": "relu", "rrelu": "relu", "alpha_dropout": "dropout",
                            "rmsnorm": "batchnorm2d",
                            "repeat": "cat",  # a copy that places its input anew, as a concatenation of it
                            "flip": "cat", "roll": "cat",  # copies in another order, as a concatenation's
                            "maximum": "mul", "minimum": "mul",  # elementwise of two tensors, as a product
                            "weighted_sum": "add",  # a BiFPN fusion: its maps' weighted sum, as an add
                            "local_response_norm": "batchnorm2d",
                            # elementwise maths of one tensor, as sigmoid's is
                            "pow": "sigmoid", "exp": "sigmoid", "abs": "sigmoid", "div": "mul", "var": "mean",
                            "log": "sigmoid",
                            "normalize": "batchnorm2d",  # a norm along one dimension, as an RMS norm's
                            "unfold": "cat",  # a copy of the windows into columns, as a concatenation's
                            "fold": "cat",  # the columns put back into a map, as an unfold's
                            # a half of the input times the sigmoid of the other: silu's work an output element
                            "glu": "silu",
                            # a value kept or replaced by a compare, as relu's
                            "hardshrink": "relu", "softshrink": "relu", "threshold": "relu",
                            "log_sigmoid": "sigmoid",
                            "fractional_maxpool2d": "maxpool2d",
                            "frozen_batchnorm2d": "batchnorm2d",
                            "logsumexp": "mean",  # a reduction over dims (its exps an input element), as a mean
                            "cumsum": "add",  # a running sum: an add an element
                            "linspace": "identity",  # CoordConv's coordinates: a few floats, a view over the batch
                            "where": "relu",  # a value kept or replaced by a compare, as a relu's
                            "affine_grid": "linear",  # each position's coordinates times theta, a small GEMM
                            "grid_sample": "adaptiveavgpool2d",  # a bilinear resampling, as a resize's
                            # values picked by compares along a dim, as a max pool's
                            "sort": "maxpool2d", "topk": "maxpool2d"}
_ATTRS = ("in_ch", "out_ch", "kernel_h", "kernel_w", "stride", "padding", "dilation", "groups", "bias", "depthwise")
_COSTS = ("out_elems", "out_rank", "macs", "flops_fwd", "flops_bwd", "bytes_read", "bytes_written", "params",
          "kernels_fwd", "kernels_bwd", "saved_bytes", "n_inputs")
NODE_FEATURES: tuple[str, ...] = tuple(f"op={o}" for o in OP_VOCAB) + _ATTRS + _COSTS
EDGE_FEATURES: tuple[str, ...] = ("tensor_elems", "reverse")
#: The network totals of :data:`~perf4sight.features.aggregate.FEATURE_NAMES` as a GNN first stored them (2026-11-24),
#: up to ``lt_work_per_launch``. Every feature appended since is left to the trees' linear term: the 0/1
#: library-context flags (as GNN inputs they made the TX2 step-time MAPE worse: 17.7 against 11.1 for ``sage``), the
#: workspace, CPU-dispatch, dilation and op-price terms and the analytic estimate's two parts. Taken by position, so
#: a feature appended later is left out too: one more input column fails every stored GNN's load check and, in a new
#: fit, draws other initial weights (held-out squeezenet's step time read 44.0% instead of 8.4% at seed 0 while the
#: op price was an input).
GLOBAL_FEATURES: tuple[str, ...] = tuple(FEATURE_NAMES[:FEATURE_NAMES.index("lt_work_per_launch") + 1])
_GLOBAL_COLUMNS = [FEATURE_NAMES.index(f) for f in GLOBAL_FEATURES]


@dataclass
class GraphTemplate:
    """Batch-independent tensors of one network (numpy, float32; ``edge_index`` int64 [2, E])."""

    name: str
    x: np.ndarray
    edge_index: np.ndarray
    edge_attr: np.ndarray
    features: NetworkFeatures


def _pair(v: object) -> tuple[float, float]:
    if isinstance(v, (list, tuple)):
        return (float(v[0]), float(v[-1])) if v else (0.0, 0.0)
    return (float(v), float(v)) if isinstance(v, (int, float)) else (0.0, 0.0)


def _attr_vector(op: str, a: dict) -> list[float]:
    if op in ("conv2d", "conv_transpose2d"):  # a transposed one: read as the convolution it is (no output padding)
        cin, cout, groups = float(a["in_channels"]), float(a["out_channels"]), float(a["groups"])
        kh, kw = _pair(a["kernel_size"])
        return [cin, cout, kh, kw, _pair(a["stride"])[0], _pair(a["padding"])[0], _pair(a["dilation"])[0],
                groups, float(bool(a["bias"])), float(groups > 1 and groups == cin)]
    if op == "linear":
        return [float(a["in_features"]), float(a["out_features"]), 0, 0, 0, 0, 0, 1, float(bool(a["bias"])), 0]
    if op in ("attention", "window_attention"):  # groups: its heads
        e = float(a["embed_dim"])
        return [e, e, 0, 0, 0, 0, 0, float(a["num_heads"]), float(bool(a["bias"])), 0]
    if op in ("batchnorm2d", "layernorm", "groupnorm", "instancenorm", "rmsnorm", "frozen_batchnorm2d"):
        c = float(a["num_features"] if op in ("batchnorm2d", "instancenorm", "frozen_batchnorm2d")
                  else a["num_channels"] if op == "groupnorm" else np.prod(a["normalized_shape"]))
        return [c, c, 0, 0, 0, 0, 0, 0, 0, 0]
    if op in ("maxpool2d", "avgpool2d"):
        kh, kw = _pair(a["kernel_size"])
        stride = a.get("stride") or a["kernel_size"]
        return [0, 0, kh, kw, _pair(stride)[0], _pair(a["padding"])[0], 0, 0, 0, 0]
    if op == "fractional_maxpool2d":  # its windows; its strides vary (input / output size, on average)
        kh, kw = _pair(a["kernel_size"])
        return [0, 0, kh, kw, 0, 0, 0, 0, 0, 0]
    if op in ("adaptiveavgpool2d", "adaptivemaxpool2d"):
        oh, ow = _pair(a["output_size"]) if a["output_size"] is not None else (0.0, 0.0)
        return [0, 0, oh, ow, 0, 0, 0, 0, 0, 0]
    return [0.0] * len(_ATTRS)


def graph_template(desc: NetworkDescription, runtime: StepRuntime = StepRuntime()) -> GraphTemplate:
    """Node and edge tensors of ``desc`` (each node's kept tensors and the global features for a step run under
    ``runtime``'s rules); ``UserError`` naming the ops that have no cost formula."""
    nf = network_features(desc, runtime)
    if nf.unsupported:
        raise UserError(f"gnn: network '{desc.name}' has ops without a cost formula: {', '.join(nf.unsupported)}")
    index = {n.name: i for i, n in enumerate(desc.nodes)}
    shapes = {n.name: n.output_shape for n in desc.nodes}
    onehot = {op: i for i, op in enumerate(OP_VOCAB)}
    rows: list[list[float]] = []
    src: list[int] = []
    dst: list[int] = []
    eattr: list[list[float]] = []
    for visit in walk(desc, runtime):
        node, in_shapes, cost = visit.node, visit.in_shapes, visit.cost
        assert cost is not None  # network_features above rejected ops without a formula
        saved = sum(numel(shapes[node.name] if p == OUTPUT else in_shapes[p]) for p in cost.saved) * BYTES_PER_ELEMENT
        oh = [0.0] * len(OP_VOCAB)
        oh[onehot[OP_TOKEN[node.op]]] = 1.0
        costs = [numel(node.output_shape), len(node.output_shape), cost.macs, cost.flops_fwd, cost.flops_bwd,
                 cost.bytes_read, cost.bytes_written, cost.params, cost.kernels_fwd, cost.kernels_bwd,
                 saved + cost.extra_saved_bytes, len(node.inputs)]
        rows.append(oh + list(np.log1p(np.abs(_attr_vector(node.op, node.attrs) + costs))))
        for i in node.inputs:
            size = float(np.log1p(numel(shapes[i])))
            src += [index[i], index[node.name]]
            dst += [index[node.name], index[i]]
            eattr += [[size, 0.0], [size, 1.0]]
    x = np.asarray(rows, dtype=np.float32)
    edge_index = np.asarray([src, dst], dtype=np.int64).reshape(2, -1)
    edge_attr = np.asarray(eattr, dtype=np.float32).reshape(-1, len(EDGE_FEATURES))
    return GraphTemplate(desc.name, x, edge_index, edge_attr, nf)


def global_features(templates: list[GraphTemplate], batch_sizes: list[int] | np.ndarray) -> np.ndarray:
    """``log1p`` of the network features (columns :data:`GLOBAL_FEATURES`), one row per (template, batch)."""
    F = feature_matrix([t.features for t in templates], list(batch_sizes))
    return np.log1p(np.maximum(F[:, _GLOBAL_COLUMNS], 0.0)).astype(np.float32)
