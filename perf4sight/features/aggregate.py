"""Network-level features from a description, as a function of the batch size.

Pure Python + numpy (no torch). A network's per-sample totals are computed once
(:func:`network_features`); per-batch-size feature vectors then cost a multiply
(:func:`feature_matrix`). Units: FLOPs (1 multiply-add = 2 FLOPs), MACs, bytes (fp32),
MiB for ``mem_analytic_mb``; per-step figures are for the whole batch.

The analytic training-memory estimate (``mem_analytic_mb``) is:
weights + gradients + the optimiser's state (SGD's momentum: 3 x params x 4 bytes in all; Adam's two moments:
4 x params x 4 bytes; ``optimizers.py``; a dead branch's parameters, which get no gradient, once:
``walk.untrained_nodes``) + the tensors autograd keeps for
backward (de-duplicated, views resolved to their base; those kept once a batch, a batch norm's mean and 1/std,
counted once, not in the per-sample ``saved_bytes``) + the input batch + the largest single
activation (a stand-in for the backward pass's transient workspace). A network that scores each
position (a segmentation network: output ``[classes, H, W]``) also counts its loss
(``formulas.position_loss``: the log-softmax kept, its kernels and FLOPs) and its int64 labels (in
``input_bytes``); a classifier's cross entropy over its class scores is left out, as it always was. A step with an
MSE or L1 loss (``[profile] loss``, the features' ``runtime.loss``) counts that loss over any output
(``formulas.output_loss``: its passes, what it keeps) and its float32 target of the output's shape in
``input_bytes``.

``saved_alloc_mb`` models PyTorch's CUDA caching allocator on the same saved tensors at the
step's batch size: every block is rounded up to 512 bytes; a block of at most 1 MiB lives in
the small pool's 2 MiB segments; a block of 1-10 MiB is carved from 20 MiB segments; a larger
block gets its own segment rounded up to 2 MiB. It sums the rounded block sizes (MiB), so it is
not proportional to the batch size. ``mem_alloc_mb`` is ``mem_analytic_mb`` with the saved
tensors counted this way.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from perf4sight.errors import UserError
from perf4sight.features.allocator import K_MIN_BLOCK, K_MIN_LARGE_ALLOC, K_ROUND_LARGE
from perf4sight.features.formulas import (BYTES_PER_ELEMENT, HANDLERS, OUTPUT, OpCost, is_dilated, numel,
                                         output_loss)
from perf4sight.features.latency_terms import LATENCY_FEATURES, KernelTable, kernel_table, latency_columns
from perf4sight.features.priced_ops import priced_ms_per_sample
from perf4sight.features.step_runtime import StepRuntime
from perf4sight.features.walk import (Visit, consumer_counts, gradient_accumulations, split_gathers, trained_params,
                                     trained_tensors, walk)
from perf4sight.ir.schema import SHARES, NetworkDescription, Node

__all__ = ["BeyondReplay", "NetworkFeatures", "network_features", "features_for", "feature_matrix", "unsupported_ops",
           "FEATURE_NAMES", "SCALED_FEATURES", "STATIC_FEATURES",
           "ALLOCATOR_FEATURES", "allocator_bytes", "SIM_FEATURES", "LATENCY_FEATURES", "CONTEXT_FEATURES",
           "WORKSPACE_FEATURES", "DISPATCH_FEATURES", "COPIES_FEATURES", "DILATION_FEATURES", "PRICED_FEATURES",
           "NATIVE_CONV_MAX_BATCH", "NATIVE_CONV_MAX_INPUT"]

MIB = float(2**20)
#: The ``static`` figure (not a feature column) of the parameter bytes that get a gradient (``walk.trained_params``):
#: all but a dead branch's, whose ``.grad`` stays None (no gradient, no optimiser state).
TRAINED_PARAM_BYTES = "trained_param_bytes"

#: Per-sample quantities; the feature is the quantity times the batch size.
SCALED_FEATURES: tuple[str, ...] = (
    "macs", "dense_macs", "depthwise_macs", "grouped_macs", "linear_macs",
    "flops_fwd", "flops_bwd", "flops_total", "bytes_read", "bytes_written",
    "activation_elems", "saved_bytes", "max_activation_bytes", "input_bytes", "norm_elems",
    "odd_channel_macs",
)
#: Quantities independent of the batch size.
STATIC_FEATURES: tuple[str, ...] = (
    "params", "param_bytes", "param_tensors", "kernels", "kernels_fwd", "kernels_bwd", "depth",
    "n_nodes", "n_conv", "n_depthwise", "branch_nodes", "n_cat", "n_add", "depthwise_share",
    "odd_channel_share", "intensity", "mean_conv_channels", "input_hw",
)
#: Figures that are not linear in the batch size (MiB), appended last so older columns keep their index.
ALLOCATOR_FEATURES: tuple[str, ...] = ("saved_alloc_mb", "mem_alloc_mb")
#: Peak reserved / allocated MiB of the caching-allocator replay of a traced training step
#: (``allocator.py``, ``alloc_trace.py``); 0 unless the features carry a trace (``NetworkFeatures.sim``).
SIM_FEATURES: tuple[str, ...] = ("sim_reserved_mb", "sim_alloc_mb")
#: Libraries the step loads into the device context: ``blas_context`` is 1 where the network has an op
#: that runs on the BLAS library (a linear layer, a matrix product: cuBLAS on a GPU, whose kernels and workspace take
#: device memory once loaded), else 0. Appended last so older columns keep their index.
CONTEXT_FEATURES: tuple[str, ...] = ("blas_context",)
#: ``im2col_mb``: MiB an im2col buffer of every dense or grouped convolution wider than 1x1 would take
#: (input channels x kernel area x output positions x 4 bytes, summed over those convolutions, times the
#: batch size). A size of the convolution workspaces a GPU library may request through the caching
#: allocator, which the replay does not see. Appended last so older columns keep their index.
WORKSPACE_FEATURES: tuple[str, ...] = ("im2col_mb",)
#: ``native_conv_macs``: MACs of the convolutions PyTorch's CPU dispatch sends to its native im2col + GEMM path
#: (``Slow2d``; ``SlowDilated2d`` for a dilated one) instead of oneDNN when the step runs on one thread
#: (``torch._C._select_conv_backend``, torch 2.14): the non-strided, undilated 1x1 convolutions at a batch size up
#: to :data:`NATIVE_CONV_MAX_BATCH`, and at batch 1 also every ungrouped convolution no larger than 3 in either
#: kernel dimension whose input has at most :data:`NATIVE_CONV_MAX_INPUT` elements. That path is several times
#: slower per MAC. A fingerprint holds the term at 0 for rows measured otherwise (``fit.hold_native_conv``: more
#: threads, a GPU). Appended last.
DISPATCH_FEATURES: tuple[str, ...] = ("native_conv_macs",)
NATIVE_CONV_MAX_BATCH, NATIVE_CONV_MAX_INPUT = 15, 20480
#: ``mem_analytic_mb`` in two parts (MiB): ``param_copies_mb``, the weights, gradients and optimiser state
#: (``optimizers.py``: 3 parameter-sized copies for SGD with momentum, 4 for Adam), and ``mem_analytic_rest_mb``,
#: everything else (saved activations, the input batch, the largest activation). The copies are exact bytes, not
#: a size that a memory form should scale. Appended last.
COPIES_FEATURES: tuple[str, ...] = ("param_copies_mb", "mem_analytic_rest_mb")
#: Ops that run on the BLAS library: linear layers, attention's projections and products, a product of activations
#: (``matmul``: a batched GEMM, cuBLAS's on a GPU).
BLAS_OPS = frozenset({"linear", "attention", "window_attention", "group_attention", "matmul"})
#: ``dilated_dw_macs``: MACs of the depthwise convolutions that dilate (times the batch size). This machine's CPU runs
#: a dilated depthwise convolution 5-12 times as long as the same one undilated (oneDNN for both; a dense one takes no
#: longer at dilation 2): a cost of its own, which rows of networks with such convolutions can pin (the ``dilated``
#: generator style; docs/accuracy-notes.md, "Segmentation networks"). Appended last.
DILATION_FEATURES: tuple[str, ...] = ("dilated_dw_macs",)
#: ``priced_ops_ms``: the ops between the convolutions (batch norm, activations, additions, pools, ...) at the prices
#: the device charged for each kind in its profile (``priced_ops.py``), ms for the whole batch; 0 where the rows'
#: device measured none (``StepRuntime.op_prices``). Appended last.
PRICED_FEATURES: tuple[str, ...] = ("priced_ops_ms",)
FEATURE_NAMES: tuple[str, ...] = (("batch_size",) + SCALED_FEATURES + STATIC_FEATURES + ("mem_analytic_mb",)
                                  + ALLOCATOR_FEATURES + SIM_FEATURES + LATENCY_FEATURES + CONTEXT_FEATURES
                                  + WORKSPACE_FEATURES + DISPATCH_FEATURES + COPIES_FEATURES + DILATION_FEATURES
                                  + PRICED_FEATURES)


class BeyondReplay(UserError):
    """A query whose step needs more device memory than the allocator replay can hold (256 TiB): more than any
    device has, so it fits none (:func:`~perf4sight.fingerprint.predict.largest_fitting` reads it so)."""


@dataclass
class NetworkFeatures:
    """Per-sample totals (``per_sample``) and batch-independent figures (``static``) of one network."""

    name: str
    per_sample: dict[str, float]
    static: dict[str, float]
    unsupported: list[str] = field(default_factory=list)  # "node (op)" for ops without a formula
    saved_sizes: np.ndarray = field(default_factory=lambda: np.zeros(0))  # bytes per sample of each saved tensor
    # bytes of each tensor kept for backward once a batch, whatever its size (formulas.OpCost.batch_saved)
    batch_saved_sizes: np.ndarray = field(default_factory=lambda: np.zeros(0))
    # allocator.AllocTrace, attached on demand (alloc_trace.attach_simulation)
    sim: Any = field(default=None, repr=False)
    description: Any = field(default=None, repr=False)  # the NetworkDescription these features came from
    kernels: KernelTable | None = field(default=None, repr=False)  # per-kernel latency terms (latency_terms.py)
    runtime: StepRuntime = StepRuntime()  # the rules of the torch whose training step these features are of

    @property
    def optimizer(self) -> str:
        """The training step's optimiser (optimizers.py)."""
        return self.runtime.optimizer

    @property
    def family(self) -> str:
        """The network family of the description these features came from (its name without one)."""
        return self.description.family if self.description is not None else self.name

    @property
    def structure(self) -> str:
        """The layer structure's key of that description (:attr:`NetworkDescription.structure`; "" without one)."""
        return self.description.structure if self.description is not None else ""


def unsupported_ops(desc: NetworkDescription) -> list[str]:
    """Names of the ops in ``desc`` that have no cost formula (sorted, unique)."""
    return sorted({n.op for n in desc.nodes if n.op not in HANDLERS})


def _loss_keeps(loss: str, output_root: str, output_elems: int) -> dict[str, float]:
    """What the step's ``loss`` keeps for backward (bytes per sample, by tensor): a cross entropy's log-softmax result
    and an L1 loss's difference of the output and the target (each the output's size), an MSE's the output itself
    (its target, like the labels, is counted in ``input_bytes``)."""
    return {output_root if loss == "mse" else " loss": float(output_elems * BYTES_PER_ELEMENT)}


def _target_bytes(desc: NetworkDescription, loss: str) -> float:
    """Bytes per sample of what ``loss`` compares the output with, held beside the input all step: a cross entropy's
    int64 labels (one per position), an MSE's or an L1 loss's float32 target of the output's shape."""
    if loss == "cross_entropy":
        return 8.0 * numel(desc.label_shape)
    return float(numel(desc.node(desc.output).output_shape) * BYTES_PER_ELEMENT)


def network_features(desc: NetworkDescription, runtime: StepRuntime = StepRuntime()) -> NetworkFeatures:
    """Walk the graph once and total every per-op cost (per sample), for a training step run under ``runtime``'s
    rules (``step_runtime.py``: its optimiser's state and update, and what its torch keeps for backward: a ReLU6's
    input or result, a dropout's mask at one byte or four)."""
    shapes: dict[str, list[int]] = {}
    base: dict[str, str] = {}  # view -> tensor whose storage it shares
    consumers = consumer_counts(desc)
    depth: dict[str, int] = {}
    # im2col: WORKSPACE_FEATURES, native conv (up to batch 15, and the more at batch 1): DISPATCH_FEATURES
    ps = dict.fromkeys(SCALED_FEATURES + ("im2col_bytes", "native_conv_macs", "native_conv_macs_b1")
                       + DILATION_FEATURES, 0.0)
    st = dict.fromkeys(STATIC_FEATURES, 0.0)
    saved: dict[str, float] = {}
    extra_saved = 0.0
    extra_sizes: list[float] = []
    batch_saved: list[float] = []  # once a batch (OpCost.batch_saved)
    max_act = 0.0
    unsupported: list[str] = []
    input_name = desc.nodes[0].name
    conv_channels: list[int] = []
    visits = list(walk(desc, runtime))  # the kernel table below reads them too
    for visit in visits:
        node, cost = visit.node, visit.cost
        shapes[node.name] = node.output_shape
        base[node.name] = visit.base
        weighted = node.op in ("conv2d", "linear", "conv_transpose2d")
        depth[node.name] = max((depth[i] for i in node.inputs), default=0) + (1 if weighted else 0)
        if cost is None:
            unsupported.append(f"{node.name} ({node.op})")
            continue
        _accumulate(ps, st, cost, node.op)
        if cost.kind == "norm":  # the elements it normalises (its output's), whatever its kernels write
            ps["norm_elems"] += numel(node.output_shape)
        if cost.kind in ("dense", "depthwise", "grouped"):
            ps[f"{cost.kind}_macs"] += cost.macs
            kh, kw = node.attrs["kernel_size"]
            if node.op == "conv_transpose2d":
                ps["im2col_bytes"] += _transposed_columns_bytes(node, shapes[node.inputs[0]], cost.kind)
            elif cost.kind != "depthwise" and kh * kw > 1:
                ps["im2col_bytes"] += (node.attrs["in_channels"] * kh * kw * numel(node.output_shape[1:])
                                       * BYTES_PER_ELEMENT)
            native = node.op == "conv2d"  # the dispatch terms were measured on conv2d's paths, not a transposed one's
            if native and (kh, kw) == (1, 1) and all(list(node.attrs.get(k, [1, 1])) == [1, 1]
                                                     for k in ("stride", "dilation")):
                ps["native_conv_macs"] += cost.macs
            elif (native and node.attrs.get("groups", 1) == 1 and min(kh, kw) <= 3
                  and numel(shapes[node.inputs[0]]) <= NATIVE_CONV_MAX_INPUT):
                ps["native_conv_macs_b1"] += cost.macs
            if cost.kind == "depthwise" and is_dilated(node):
                ps["dilated_dw_macs"] += cost.macs
            conv_channels.append(int(node.attrs["out_channels"]))
            if int(node.attrs["out_channels"]) % 8:
                ps["odd_channel_macs"] += cost.macs
        for pos in cost.saved:
            tensor = node.name if pos == OUTPUT else node.inputs[pos]
            root = base.get(tensor, tensor)
            if pos == 0 and node.op == "linear" and visit.input_copies:  # its rows copied, a copy of its own
                saved[f"{node.name} copy"] = numel(shapes[tensor]) * BYTES_PER_ELEMENT
            elif pos in visit.copied_inputs:  # a matmul's input copied for its bmm, which keeps the copy
                saved[f"{node.name} copy {pos}"] = numel(shapes[tensor]) * BYTES_PER_ELEMENT
            elif root != input_name:  # the input batch is counted once, in input_bytes
                saved[root] = numel(shapes[root]) * BYTES_PER_ELEMENT
        extra_saved += cost.extra_saved_bytes
        if cost.extra_saved_bytes:
            extra_sizes.append(cost.extra_saved_bytes)
        batch_saved += cost.batch_saved
        if cost.kind != "view" and node.op != "input":
            elems = numel(node.output_shape)
            ps["activation_elems"] += elems
            max_act = max(max_act, elems * BYTES_PER_ELEMENT)
    loss = output_loss(shapes[desc.output], runtime.loss)
    labels_bytes = 0.0
    if loss is not None:  # a class score per position (segmentation), or an MSE / L1 loss: as large as an activation
        _accumulate(ps, st, loss, "loss")
        saved.update(_loss_keeps(runtime.loss, base.get(desc.output, desc.output), numel(shapes[desc.output])))
        ps["activation_elems"] += loss.bytes_written / BYTES_PER_ELEMENT
        labels_bytes = _target_bytes(desc, runtime.loss)  # held the whole step beside the input
    branch = [n for n, k in consumers.items() if k > 1]
    walked = gradient_accumulations(desc, visits), split_gathers(visits), trained_params(visits)  # the kernel table's
    st["kernels_bwd"] += sum(walked[0].values())  # k gradients into a tensor: k-1 adds
    st["kernels_bwd"] += _shared_gradient_sums(visits)
    st["kernels_bwd"] += sum(1 + pieces for _, _, pieces in walked[1])  # a split's zeros and cat
    ps["saved_bytes"] = sum(saved.values()) + extra_saved
    ps["max_activation_bytes"] = max_act
    ps["input_bytes"] = numel(desc.input_shape) * BYTES_PER_ELEMENT + labels_bytes
    ps["flops_total"] = ps["flops_fwd"] + ps["flops_bwd"]
    st["kernels"] = st["kernels_fwd"] + st["kernels_bwd"]
    st["param_bytes"] = st["params"] * BYTES_PER_ELEMENT
    # those that get a gradient (a dead branch's do not): their gradients and optimiser state (not a feature column)
    st[TRAINED_PARAM_BYTES] = walked[2][0] * BYTES_PER_ELEMENT
    st["depth"] = float(depth.get(desc.output, max(depth.values(), default=0)))
    st["n_nodes"] = float(len(desc.nodes))
    st["branch_nodes"] = float(len(branch))
    conv_macs = ps["dense_macs"] + ps["depthwise_macs"] + ps["grouped_macs"]
    st["depthwise_share"] = ps["depthwise_macs"] / conv_macs if conv_macs else 0.0
    st["odd_channel_share"] = ps["odd_channel_macs"] / conv_macs if conv_macs else 0.0
    moved = ps["bytes_read"] + ps["bytes_written"]
    st["intensity"] = ps["flops_fwd"] / moved if moved else 0.0
    st["mean_conv_channels"] = float(np.mean(conv_channels)) if conv_channels else 0.0
    st["input_hw"] = float(numel(desc.input_shape[1:]))
    st["blas_context"] = float(any(n.op in BLAS_OPS for n in desc.nodes))
    ps["priced_ops_ms"] = priced_ms_per_sample(desc, runtime.op_prices)
    sizes = np.array(list(saved.values()) + extra_sizes + [ps["input_bytes"] - labels_bytes]
                     + ([labels_bytes] if labels_bytes else []), dtype=float)
    return NetworkFeatures(desc.name, ps, st, unsupported, sizes, np.array(batch_saved, dtype=float),
                           description=desc,
                           kernels=kernel_table(desc, runtime.update_cost(), visits, runtime.loss, walked=walked)
                           if not unsupported else None,
                           runtime=runtime)


def _shared_gradient_sums(visits: list[Visit]) -> int:
    """The adds of a step's backward that sum a layer's parameter gradients over its calls: each later call (a node
    that ``shares`` its first call's parameters) adds its gradient of each of the first call's parameter tensors into
    the one before (``latency_terms._shared_weight_sums``'s kernels); a call no gradient reaches (``Visit.trained``
    false) computes none to add."""
    tensors = {v.node.name: trained_tensors(v) for v in visits if v.cost is not None}  # a frozen one's: no gradient
    calls: dict[str, int] = {}  # the first call -> its layer's trained calls
    for v in visits:
        if v.trained:
            owner = v.node.attrs.get(SHARES, v.node.name)
            calls[owner] = calls.get(owner, 0) + 1
    return sum(tensors.get(owner, 0) * (k - 1) for owner, k in calls.items())


def allocator_bytes(sizes: np.ndarray, batch_size: float | np.ndarray) -> float | np.ndarray:
    """Bytes the caching allocator hands out for tensors of ``sizes`` (bytes per sample) at ``batch_size``
    (a scalar, or an array of batch sizes -> one total per batch size)."""
    bs = np.asarray(batch_size, dtype=float)
    b = np.ceil(np.multiply.outer(bs.reshape(-1), np.asarray(sizes, dtype=float)) / K_MIN_BLOCK) * K_MIN_BLOCK
    b = np.where(b > K_MIN_LARGE_ALLOC, np.ceil(b / K_ROUND_LARGE) * K_ROUND_LARGE, b)
    tot = b.sum(axis=1)
    return float(tot[0]) if bs.ndim == 0 else tot


def _transposed_columns_bytes(node: Node, in_shape: list[int], kind: str) -> float:
    """A transposed convolution's counterpart of a conv2d's im2col buffer (bytes per sample): lowered to a GEMM, it
    multiplies the input by the weight into columns of ``Cout x kh x kw`` per input pixel, then adds them into the
    output (col2im). None for a depthwise one or a 1x1 kernel, as for a conv2d."""
    kh, kw = node.attrs["kernel_size"]
    if kind == "depthwise" or kh * kw == 1:
        return 0.0
    return float(node.attrs["out_channels"] * kh * kw * numel(in_shape[1:]) * BYTES_PER_ELEMENT)


def _accumulate(ps: dict[str, float], st: dict[str, float], cost: OpCost, op: str) -> None:
    ps["macs"] += cost.macs
    ps["flops_fwd"] += cost.flops_fwd
    ps["flops_bwd"] += cost.flops_bwd
    ps["bytes_read"] += cost.bytes_read
    ps["bytes_written"] += cost.bytes_written
    if cost.kind == "linear":
        ps["linear_macs"] += cost.macs
    st["params"] += cost.params
    st["param_tensors"] += cost.param_tensors
    st["kernels_fwd"] += cost.kernels_fwd
    st["kernels_bwd"] += cost.kernels_bwd
    st["n_conv"] += op in ("conv2d", "conv_transpose2d")
    st["n_depthwise"] += cost.kind == "depthwise"
    st["n_cat"] += op == "cat"
    st["n_add"] += op == "add"


def _vectors(nf: NetworkFeatures) -> tuple[np.ndarray, np.ndarray]:
    return (np.array([nf.per_sample[k] for k in SCALED_FEATURES], dtype=float),
            np.array([nf.static[k] for k in STATIC_FEATURES], dtype=float))


def feature_matrix(nets: list[NetworkFeatures] | NetworkFeatures, batch_sizes: list[int] | np.ndarray) -> np.ndarray:
    """Feature rows (columns = :data:`FEATURE_NAMES`) for every (network, batch size) pair.

    With one network, one row per batch size; with a list of networks and an equal-length list of
    batch sizes, row ``i`` is ``nets[i]`` at ``batch_sizes[i]``.
    """
    bs = np.asarray(batch_sizes, dtype=float).reshape(-1)
    rows = [nets] * len(bs) if isinstance(nets, NetworkFeatures) else nets  # the network of each row
    if isinstance(nets, NetworkFeatures):
        p, s = _vectors(nets)
        per = np.tile(p, (len(bs), 1))
        stat = np.tile(s, (len(bs), 1))
    else:
        if len(nets) != len(bs):
            raise ValueError("feature_matrix: one batch size per network expected")
        vecs = [_vectors(n) for n in nets]
        per = np.array([v[0] for v in vecs]).reshape(len(bs), len(SCALED_FEATURES))
        stat = np.array([v[1] for v in vecs]).reshape(len(bs), len(STATIC_FEATURES))
    scaled = per * bs[:, None]
    i_param = STATIC_FEATURES.index("param_bytes")
    i_saved, i_max, i_in = (SCALED_FEATURES.index(k) for k in ("saved_bytes", "max_activation_bytes", "input_bytes"))
    state = 1.0 + np.array([n.runtime.update_cost().state_copies for n in rows])  # grads, state (weights: 1)
    trained = np.array([n.static.get(TRAINED_PARAM_BYTES, n.static["param_bytes"]) for n in rows], dtype=float)
    copies_mb = (stat[:, i_param] + state * trained) / MIB
    once = np.array([n.batch_saved_sizes.sum() for n in rows], dtype=float)  # kept once a batch (bytes)
    mem = copies_mb + (scaled[:, i_saved] + once + scaled[:, i_max] + scaled[:, i_in]) / MIB
    if isinstance(nets, NetworkFeatures):
        alloc = allocator_bytes(nets.saved_sizes, bs) / MIB
    else:
        alloc = np.empty(len(bs))
        rows_of: dict[int, list[int]] = {}
        for i, n in enumerate(nets):
            rows_of.setdefault(id(n), []).append(i)
        for idx in rows_of.values():
            alloc[idx] = allocator_bytes(nets[idx[0]].saved_sizes, bs[idx]) / MIB
    alloc += _once_a_batch_alloc(rows) / MIB
    extra = (scaled[:, i_saved] + once + scaled[:, i_in]) / MIB  # what alloc replaces (saved + input, exact bytes)
    sim = np.zeros((len(bs), len(SIM_FEATURES)))  # 0 = not simulated
    for i, n in enumerate(rows):
        if n.sim is not None:
            try:
                sim[i] = n.sim.peaks_mb([bs[i]])[0]
            except OverflowError:  # the replay's addresses run out at 256 TiB of segments
                raise BeyondReplay(f"{n.name} at batch size {int(bs[i])}: its step would need more than 256 TiB of "
                                   "device memory, beyond any device and the allocator replay; ask for a smaller "
                                   "batch size or input shape") from None
    lat = _latency_block(rows, bs)
    ctx = np.array([[n.static.get(k, np.nan) for k in CONTEXT_FEATURES] for n in rows], dtype=float)
    im2col = np.array([n.per_sample.get("im2col_bytes", 0.0) for n in rows], dtype=float) * bs / MIB
    native = np.array([[n.per_sample.get(k, 0.0) for k in ("native_conv_macs", "native_conv_macs_b1")] for n in rows],
                      dtype=float).reshape(len(bs), 2)
    native = np.where(bs <= NATIVE_CONV_MAX_BATCH, bs * native[:, 0], 0.0) + np.where(bs == 1, native[:, 1], 0.0)
    dilated = np.array([n.per_sample.get("dilated_dw_macs", 0.0) for n in rows], dtype=float) * bs
    priced = np.array([n.per_sample.get("priced_ops_ms", 0.0) for n in rows], dtype=float) * bs
    return np.column_stack([bs, scaled, stat, mem, alloc, mem - extra + alloc, sim, lat,
                            ctx.reshape(len(bs), len(CONTEXT_FEATURES)), im2col, native, copies_mb, mem - copies_mb,
                            dilated, priced])


def _once_a_batch_alloc(rows: list[NetworkFeatures]) -> np.ndarray:
    """Bytes the caching allocator hands out for what each row's network keeps once a batch
    (:attr:`NetworkFeatures.batch_saved_sizes`), one figure a row."""
    of_network: dict[int, float] = {}
    for n in rows:
        if id(n) not in of_network:
            of_network[id(n)] = allocator_bytes(n.batch_saved_sizes, 1.0)
    return np.array([of_network[id(n)] for n in rows], dtype=float)


def _latency_block(rows: list[NetworkFeatures], bs: np.ndarray) -> np.ndarray:
    """:data:`LATENCY_FEATURES` columns (NaN for networks without a kernel table); ``rows``: the network
    of each row."""
    out = np.full((len(bs), len(LATENCY_FEATURES)), np.nan)
    ok = [i for i, n in enumerate(rows) if n.kernels is not None]
    if ok:
        out[ok] = latency_columns([rows[i].kernels for i in ok], bs[ok])
    return out


def features_for(desc: NetworkDescription | NetworkFeatures, batch_size: int) -> dict[str, float]:
    """All features of ``desc`` at ``batch_size`` as a name -> value dict (see module docstring for units)."""
    nf = desc if isinstance(desc, NetworkFeatures) else network_features(desc)
    row = feature_matrix(nf, [batch_size])[0]
    return dict(zip(FEATURE_NAMES, (float(v) for v in row)))
