"""Kernel-level latency terms: one row per GPU kernel of a training step, summed per batch size.

Pure numpy (no torch). :func:`kernel_table` walks a description once and lists, per sample, the
kernels one training step launches — forward, backward (input and weight gradients as
separate GEMMs) and the optimizer's per-parameter updates (``optimizers.py``) — with their kind, FLOPs, bytes and,
for GEMM-like kernels, the implicit-GEMM dimensions. :func:`latency_columns` turns tables into
the :data:`LATENCY_FEATURES` columns at any batch size. Units: MACs (multiply-accumulates), bytes
(fp32), kernel launches (counts).

Conventions, stated once:

- A dense or grouped conv is three implicit GEMMs per group: forward ``M = batch*Ho*Wo,
  N = Cout/g, K = Cin/g*kh*kw``; input gradient ``M = batch*Hi*Wi, N = Cin/g, K = Cout/g*kh*kw``
  (``K`` scaled by ``Ho*Wo / (Hi*Wi)`` so a strided conv's input gradient does the forward's MACs;
  skipped when its input needs no gradient: the network input, or what parameter-free ops made of it alone,
  ``walk.py``); weight gradient ``M = Cout/g,
  N = Cin/g*kh*kw, K = batch*Ho*Wo``. A linear layer likewise (``Ho*Wo`` = 1).
- Tile quantisation: a GEMM tile computes ``TILE_M x TILE_N`` outputs over ``TILE_K``-deep
  slices, so the work done is ``ceil(M/TM)*TM * ceil(N/TN)*TN * ceil(K/TK)*TK`` MACs. Odd channel
  counts after pruning waste the padding; ``lt_gemm_padded_macs`` counts it, ``lt_gemm_macs`` not.
- Depthwise convs run their own (bandwidth-bound) kernels: counted in ``lt_dw_bytes``.
- Bandwidth-bound kernels (batch norm, activations, adds, pooling, concatenation, bias,
  gradient accumulation at branches, a split's backward ``cat`` of its pieces' gradients, a select's or a narrow's
  backward zeros and copy, the optimizer): ``lt_ew_bytes`` = bytes read + written.
- A node no gradient reaches (``walk.untrained_nodes``: a dead branch) runs its forward kernels alone; its
  parameters get no update. An op that copies its
  input first (``walk.Visit.input_copies``: an activation in place on a copy, a linear layer of rows that do not
  fold, an in-place activation's clone kept for backward) runs each copy first: a kernel, the input read and written.
- ``lt_launches`` = all kernel launches of a step (forward + backward + optimizer);
  ``lt_work_per_launch`` = step FLOPs per launch, which tells a
  launch-bound step (small batch, many small kernels) from a compute-bound one.
- ``lt_gemm_padded64_macs``: the padded work with the coarser :data:`TILE64` tiling.
"""
from __future__ import annotations

from dataclasses import dataclass
from itertools import chain
from typing import Sequence

import numpy as np

from perf4sight.features.formulas import (BYTES_PER_ELEMENT, INPUT_GRADIENTS, REGRESSION_LOSS_KERNELS,
                                         STANDARDIZE_KERNELS,
                                         hands_input_back, numel, position_loss, scaled_gain_kernels, window_geometry)
from perf4sight.features.optimizers import DEFAULT_OPTIMIZER, OptimizerCost, optimizer_cost
from perf4sight.features.frozen import FrozenSplit
from perf4sight.features.walk import (Visit, gradient_accumulations, split_gathers, trained_params, trained_tensors,
                                     walk)
from perf4sight.ir.schema import SHARES, NetworkDescription, Node, node_params, where_condition_inputs

__all__ = ["KernelTable", "kernel_table", "latency_columns", "LATENCY_FEATURES", "TILE", "GEMM", "DEPTHWISE",
           "BANDWIDTH"]

#: Kernel kinds.
GEMM, DEPTHWISE, BANDWIDTH = 0, 1, 2
#: (TILE_M, TILE_N, TILE_K) of the padded-work count (a common fp32 implicit-GEMM tiling).
TILE = (32, 32, 8)
#: A coarser tiling (large-tile kernels) for ``lt_gemm_padded64_macs``.
TILE64 = (64, 64, 8)

LATENCY_FEATURES: tuple[str, ...] = (
    "lt_gemm_macs", "lt_gemm_padded_macs", "lt_gemm_waste_macs", "lt_gemm_padded64_macs", "lt_dw_bytes",
    "lt_ew_bytes", "lt_launches", "lt_work_per_launch",
)


@dataclass
class KernelTable:
    """Kernels of one training step; per-kernel arrays, per-sample where they scale with the batch.

    ``dims`` (n, 3): GEMM M, N, K (0 for other kinds); ``batch_dim`` (n,): which of them is
    multiplied by the batch size (-1: none). ``bytes_ps``: activation bytes per sample;
    ``bytes_fixed``: parameter bytes (independent of the batch); ``flops_ps``: FLOPs per sample.
    """

    kind: np.ndarray
    dims: np.ndarray
    batch_dim: np.ndarray
    flops_ps: np.ndarray
    bytes_ps: np.ndarray
    bytes_fixed: np.ndarray
    param_tensors: int

    @property
    def launches(self) -> int:
        """Kernel launches of one step (a static count)."""
        return int(len(self.kind))


class _Rows:
    def __init__(self) -> None:
        self.rows: list[tuple[int, float, float, float, int, float, float, float]] = []
        self.forward_only = False  # the node being listed runs no backward (walk.Visit.trained false): bwd rows left

    def gemm(self, m: float, n: float, k: float, batch_dim: int, bytes_ps: float, bytes_fixed: float,
             bwd: bool = False) -> None:
        """A GEMM of ``m x n x k`` (per sample along ``batch_dim``); ``bwd``: of the backward."""
        if not (bwd and self.forward_only):
            self.rows.append((GEMM, m, n, k, batch_dim, 2.0 * m * n * k, bytes_ps, bytes_fixed))

    def other(self, kind: int, flops_ps: float, bytes_ps: float, bytes_fixed: float = 0.0, bwd: bool = False) -> None:
        if not (bwd and self.forward_only):
            self.rows.append((kind, 0.0, 0.0, 0.0, -1, flops_ps, bytes_ps, bytes_fixed))

    def repeated(self, times: int, kind: int, flops_ps: float, bytes_ps: float) -> None:
        """:meth:`other` of the forward (or of a step's end) ``times`` times: one row, repeated."""
        self.rows += [(kind, 0.0, 0.0, 0.0, -1, flops_ps, bytes_ps, 0.0)] * times


def _conv(r: _Rows, node: Node, in_shape: list[int], first: bool, frozen: FrozenSplit | None = None) -> None:
    a = node.attrs
    kh, kw = a["kernel_size"]
    cin, cout, g = int(a["in_channels"]), int(a["out_channels"]), int(a["groups"])
    out = node.output_shape
    hw_out = numel(out[1:]) if len(out) == 3 else 1
    hw_in = numel(in_shape[1:]) if len(in_shape) == 3 else 1
    b_in, b_out = numel(in_shape) * BYTES_PER_ELEMENT, numel(out) * BYTES_PER_ELEMENT
    w_bytes = cout * (cin // g) * kh * kw * BYTES_PER_ELEMENT
    # a fixed one's filter is a buffer (a blur pool's), a frozen one gets no gradient: no weight gradient
    learnt = not a.get("fixed") and not (frozen is not None and frozen.weight)
    if g > 1 and g == cin and cout % cin == 0:  # depthwise: own kernels, bandwidth-bound
        macs = float(hw_out * cout * kh * kw)
        r.other(DEPTHWISE, 2 * macs, b_in + b_out, w_bytes)
        if not first:
            r.other(DEPTHWISE, 2 * macs, b_in + b_out, w_bytes, bwd=True)
        if learnt:
            r.other(DEPTHWISE, 2 * macs, b_in + b_out, w_bytes, bwd=True)
    else:
        cg_in, cg_out = cin // g, cout // g
        for _ in range(g):
            r.gemm(hw_out, cg_out, cg_in * kh * kw, 0, (b_in + b_out) / g, w_bytes / g)
            if not first:
                # transposed conv: each input pixel meets kh*kw*hw_out/hw_in taps on average (stride)
                r.gemm(hw_in, cg_in, cg_out * kh * kw * hw_out / hw_in, 0, (b_in + b_out) / g, w_bytes / g, True)
            if learnt:
                r.gemm(cg_out, cg_in * kh * kw, hw_out, 2, (b_in + b_out) / g, w_bytes / g, True)
    _bias_rows(r, a, hw_out * cout, b_out, frozen)
    _weight_norm_rows(r, a, w_bytes, frozen is None or not frozen.weight)
    if a.get("standardize"):  # its weight standardised once a step: small kernels over the weight, forward and back
        fwd, bwd = STANDARDIZE_KERNELS[a["standardize"]]
        bwd = bwd if frozen is None or not frozen.weight else 0  # none back its weight frozen
        for back in (False,) * fwd + (True,) * bwd:
            r.other(BANDWIDTH, 0.0, 0.0, 2 * w_bytes, back)
        if "standardize_scale" in a:  # ScaledStdConv2d's gain and scale (formulas._scaled_gain): timm's over a float
            # an output channel, one kernel each way; its older spelling's over the weight, 2 forward and 4 back
            fwd, bwd = scaled_gain_kernels(a["standardize"])
            size = cout * BYTES_PER_ELEMENT if a["standardize"] == "batch_norm" else w_bytes
            bwd = bwd if frozen is None or not frozen.weight else 0
            for back in (False,) * fwd + (True,) * bwd:
                r.other(BANDWIDTH, 0.0, 0.0, 2.0 * size, back)


def _arange_coordinates(r: _Rows, node: Node, kernels: int) -> None:
    """A coordinate channel made by arange (formulas._arange_coordinates): its kernels over the ``H x W`` map once a
    step (a read and a write each), the last the port's copy over the batch (a write a sample; a grid's: a view)."""
    hw = float(numel(node.output_shape)) * BYTES_PER_ELEMENT
    copied = node.attrs["made"] == "arange"
    for _ in range(kernels - copied):
        r.other(BANDWIDTH, 0.0, 0.0, 2 * hw)
    if copied:
        r.other(BANDWIDTH, 0.0, hw, hw)


def _weight_norm_rows(r: _Rows, a: dict, w_bytes: float, back: bool = True) -> None:
    """A conv2d's or linear's ``weight_norm``, once a step: its kernel forward (v read, the weight written) and back
    (the weight's gradient and v read, v's gradient written), bandwidth rows over the weight; its ``spectral_norm``'s
    kernels likewise (formulas._spectral_normed); none back where the layer is frozen whole (not ``back``)."""
    if a.get("weight_norm"):
        r.other(BANDWIDTH, 0.0, 0.0, 2 * w_bytes)
        if back:
            r.other(BANDWIDTH, 0.0, 0.0, 3 * w_bytes, True)
    if a.get("spectral_norm"):  # the matrix-vector products and the division read the weight; the rest is small
        iterations = int(a.get("spectral_norm_iterations", 1))
        for _ in range(2 * iterations + 1):
            r.other(BANDWIDTH, 0.0, 0.0, w_bytes)
        r.other(BANDWIDTH, 0.0, 0.0, 2 * w_bytes)
        for _ in range(6 * iterations + 3):
            r.other(BANDWIDTH, 0.0, 0.0, 0.0)
        for k in range(9 if back else 0):  # 8 of the 9 over the weight (one over u)
            r.other(BANDWIDTH, 0.0, 0.0, 2 * w_bytes if k else 0.0, True)


def _conv_transpose(r: _Rows, node: Node, in_shape: list[int], first: bool,
                    frozen: FrozenSplit | None = None) -> None:
    """A transposed convolution: the three GEMMs of a conv2d from its output to its input, their roles swapped. Its
    forward is that conv's input gradient (``M = batch*Ho*Wo, N = Cout/g, K = Cin/g*kh*kw*Hi*Wi / (Ho*Wo)``: the
    MACs ``Cin/g x Cout/g x kh x kw x Hi x Wi``), its input gradient that conv's forward (``M = batch*Hi*Wi, N =
    Cin/g, K = Cout/g*kh*kw``; none for a ``first`` layer), its weight gradient ``M = Cin/g, N = Cout/g*kh*kw, K =
    batch*Hi*Wi``. Depthwise ones (a group per channel) run bandwidth-bound kernels, as a conv2d's."""
    a = node.attrs
    kh, kw = a["kernel_size"]
    cin, cout, g = int(a["in_channels"]), int(a["out_channels"]), int(a["groups"])
    out = node.output_shape
    hw_out, hw_in = numel(out[1:]), numel(in_shape[1:])
    b_in, b_out = numel(in_shape) * BYTES_PER_ELEMENT, numel(out) * BYTES_PER_ELEMENT
    w_bytes = cin * (cout // g) * kh * kw * BYTES_PER_ELEMENT
    if g > 1 and g == cin and cout % cin == 0:
        macs = float(hw_in * cout * kh * kw)
        rows = 2 if first else 3  # forward, the input's gradient (not for a first layer), the weight's
        for i in range(rows):
            if i < rows - 1 or frozen is None or not frozen.weight:
                r.other(DEPTHWISE, 2 * macs, b_in + b_out, w_bytes, bwd=i > 0)
    else:
        cg_in, cg_out = cin // g, cout // g
        for _ in range(g):
            r.gemm(hw_out, cg_out, cg_in * kh * kw * hw_in / hw_out, 0, (b_in + b_out) / g, w_bytes / g)
            if not first:
                r.gemm(hw_in, cg_in, cg_out * kh * kw, 0, (b_in + b_out) / g, w_bytes / g, True)
            if frozen is None or not frozen.weight:
                r.gemm(cg_in, cg_out * kh * kw, hw_in, 2, (b_in + b_out) / g, w_bytes / g, True)
    _bias_rows(r, a, hw_out * cout, b_out, frozen)


def _bias_rows(r: _Rows, a: dict, outputs: float, b_out: float, frozen: FrozenSplit | None) -> None:
    """A convolution's bias: its add forward, and back the incoming gradient summed (none where it is frozen)."""
    if a.get("bias"):
        r.other(BANDWIDTH, outputs, 2 * b_out, int(a["out_channels"]) * BYTES_PER_ELEMENT)  # forward add
        if frozen is None or not frozen.bias:  # backward reduction
            r.other(BANDWIDTH, outputs, b_out, int(a["out_channels"]) * BYTES_PER_ELEMENT, True)


def _attention_gemms(r: _Rows, tokens: int, keys: int, e: int, h: int, first: bool, weights: bool = True) -> None:
    """An attention's GEMMs over ``tokens`` of width ``e`` in ``h`` heads, each attending to ``keys`` of them: the
    input projection to queries, keys and values (no input gradient for the network input, ``first``) and the
    output projection, then the scores and the weighted sum; each with its backward ones (the projections' weight
    gradients where ``weights``: not frozen)."""
    d = e // h
    b_io = 2 * tokens * e * BYTES_PER_ELEMENT
    w = 4 * e * e * BYTES_PER_ELEMENT
    scores = h * tokens * keys * BYTES_PER_ELEMENT
    for m, n, k, fixed, grad_in in ((tokens, 3 * e, e, 0.75 * w, not first), (tokens, e, e, 0.25 * w, True)):
        r.gemm(m, n, k, 0, b_io, fixed)
        if grad_in:
            r.gemm(m, k, n, 0, b_io, fixed, True)
        if weights:
            r.gemm(n, k, m, 2, b_io, fixed, True)
    for i in range(3):  # scores Q K^T and the weighted sum of V, forward and two backward products each
        r.gemm(h * tokens, keys, d, 0, scores, 0.0, i > 0)
        r.gemm(h * tokens, d, keys, 0, scores, 0.0, i > 0)


def _attention(r: _Rows, node: Node, in_shape: list[int], first: bool, frozen: FrozenSplit | None = None) -> None:
    """Self-attention as its GEMMs (the input projection to queries, keys and values, the scores, the weighted sum,
    the output projection; each with its backward ones) and its softmax (bandwidth-bound)."""
    e, h = int(node.attrs["embed_dim"]), int(node.attrs["num_heads"])
    tokens = numel(node.output_shape) // e
    scores = h * tokens * tokens * BYTES_PER_ELEMENT
    _attention_gemms(r, tokens, tokens, e, h, first, frozen is None or not frozen.whole)
    r.other(BANDWIDTH, 5.0 * h * tokens * tokens, 2 * scores)  # softmax
    r.other(BANDWIDTH, 5.0 * h * tokens * tokens, 3 * scores, bwd=True)  # its backward


def _window_attention(r: _Rows, node: Node, frozen: FrozenSplit | None = None) -> None:
    """Self-attention within windows as torchvision runs it: the map padded (a copy), rolled (shifted windows) and
    cut into windows (a copy), the projections' GEMMs over the ``T`` padded positions, the scores and weighted sum
    per window and head, the queries scaled (Swin V2: the queries and keys normalised, the scores scaled), the
    relative position bias (and the shifted windows' mask) added, the softmax, and every copy again on the way back;
    each with its backward kernels. Swin V2's position-bias MLP runs once a step on a few hundred positions: left
    out. One of a table frozen whole (``frozen``): no weight gradients, nor the bias's summed
    (frozen._frozen_window_attention)."""
    tokens, n, e, h, shifted = window_geometry(node)
    b_io = 2 * tokens * e * BYTES_PER_ELEMENT
    scores = h * tokens * n * BYTES_PER_ELEMENT
    learnt = frozen is None or not frozen.whole or bool(node.attrs.get("cosine") or node.attrs.get("position_bias_mlp"))
    _attention_gemms(r, tokens, n, e, h, False, learnt)
    copies = 5 + (2 if shifted else 0)  # pad, windows, heads back together, windows back, crop; two rolls
    for i in range(2 * copies):  # forward, and each one's backward
        r.other(BANDWIDTH, 0.0, b_io, bwd=i % 2 == 1)
    if node.attrs.get("cosine"):  # Swin V2: the queries and keys normalised (a norm and a division each), the
        for _ in range(2):        # scores scaled; each with its backward
            r.other(BANDWIDTH, 2.0 * tokens * e, b_io)
            r.other(BANDWIDTH, 4.0 * tokens * e, 2 * b_io, bwd=True)
        r.other(BANDWIDTH, h * tokens * n, 2 * scores)
        r.other(BANDWIDTH, h * tokens * n, 3 * scores, bwd=True)
    else:
        r.other(BANDWIDTH, tokens * e, b_io)  # the queries scaled, and its backward
        r.other(BANDWIDTH, tokens * e, b_io, bwd=True)
    for _ in range(2 if shifted else 1):  # the bias (and mask) added; backward, the bias's gradient summed
        r.other(BANDWIDTH, h * tokens * n, 3 * scores)
    if learnt:
        r.other(BANDWIDTH, h * tokens * n, scores, bwd=True)
    r.other(BANDWIDTH, 5.0 * h * tokens * n, 2 * scores)  # softmax
    r.other(BANDWIDTH, 5.0 * h * tokens * n, 3 * scores, bwd=True)  # its backward


def _group_attention(r: _Rows, node: Node, first: bool) -> None:
    """Self-attention within groups as torchvision's MaxViT runs it: the projections' GEMMs over the ``T`` tokens,
    the scores and weighted sum per group and head, copies of the queries, keys and values for the batched products
    (and the heads back together), the keys scaled, the relative position bias added and the softmax; each with its
    backward kernels."""
    groups, n, e = node.output_shape
    tokens, h = groups * n, int(node.attrs["num_heads"])
    b_io = 2 * tokens * e * BYTES_PER_ELEMENT
    scores = h * tokens * n * BYTES_PER_ELEMENT
    _attention_gemms(r, tokens, n, e, h, first)
    for i in range(2 * 4):  # the queries, keys, values and the heads back together copied; each one's backward
        r.other(BANDWIDTH, 0.0, b_io, bwd=i % 2 == 1)
    r.other(BANDWIDTH, tokens * e, b_io)  # the keys scaled, and its backward
    r.other(BANDWIDTH, tokens * e, b_io, bwd=True)
    r.other(BANDWIDTH, h * tokens * n, 3 * scores)  # the bias added; backward, the bias's gradient summed
    r.other(BANDWIDTH, h * tokens * n, scores, bwd=True)
    r.other(BANDWIDTH, 5.0 * h * tokens * n, 2 * scores)  # softmax
    r.other(BANDWIDTH, 5.0 * h * tokens * n, 3 * scores, bwd=True)  # its backward


def _linear(r: _Rows, node: Node, in_shape: list[int], first: bool, frozen: FrozenSplit | None = None) -> None:
    a = node.attrs
    fin, fout = int(a["in_features"]), int(a["out_features"])
    rows = max(1, numel(node.output_shape) // fout)
    b_io = (numel(in_shape) + numel(node.output_shape)) * BYTES_PER_ELEMENT
    w = fin * fout * BYTES_PER_ELEMENT
    r.gemm(rows, fout, fin, 0, b_io, w)
    if not first:
        r.gemm(rows, fin, fout, 0, b_io, w, True)
    if frozen is None or not frozen.weight:
        r.gemm(fout, fin, rows, 2, b_io, w, True)
    if a.get("bias") and (frozen is None or not frozen.bias):  # the bias's gradient, the incoming one summed down
        r.other(BANDWIDTH, rows * fout, numel(node.output_shape) * BYTES_PER_ELEMENT, fout * BYTES_PER_ELEMENT, True)
    _weight_norm_rows(r, a, w, frozen is None or not frozen.weight)


def _matrix_product(r: _Rows, node: Node, in_shapes: list[list[int]], needs: list[bool]) -> None:
    """a @ b of [..., M, K] and [..., K, N] activations as its batched GEMMs, the B = the output's leading dims
    matrices of a sample stacked along the rows: forward [B M, K] x [K, N]; backward, for the inputs that need a
    gradient (``needs``), grad @ b^T ([B M, N] x [N, K]) and a^T @ grad ([B K, M] x [M, N]). An input broadcast
    along a leading dim is copied first, expanded (formulas._matrix_product)."""
    (a, _), out = in_shapes, node.output_shape
    batches, m, k, n = numel(out[:-2]), a[-2], a[-1], out[-1]
    b_io = (sum(numel(s) for s in in_shapes) + numel(out)) * BYTES_PER_ELEMENT
    for shape in in_shapes:  # an input broadcast along a leading dim, expanded and copied first: read, copy written
        if numel(shape[:-2]) < batches:
            r.other(BANDWIDTH, 0.0, (numel(shape) + batches * numel(shape[-2:])) * BYTES_PER_ELEMENT)
    r.gemm(batches * m, n, k, 0, b_io, 0.0)
    if needs[0]:
        r.gemm(batches * m, k, n, 0, b_io, 0.0)
    if needs[1]:
        r.gemm(batches * k, n, m, 0, b_io, 0.0)


def _elementwise(r: _Rows, node: Node, in_shapes: list[list[int]], fwd_passes: float, bwd_passes: float,
                 bwd_kernels: int, fwd_kernels: int = 1) -> None:
    """``fwd_kernels`` forward kernels reading its inputs and writing its output ``fwd_passes`` times over in all;
    ``bwd_kernels`` backward kernels moving ``bwd_passes`` output-sized tensors in all."""
    n_out = numel(node.output_shape)
    n_in = sum(numel(s) for s in in_shapes)
    for _ in range(fwd_kernels):
        r.other(BANDWIDTH, float(n_out) / fwd_kernels, fwd_passes / fwd_kernels * (n_in + n_out) * BYTES_PER_ELEMENT)
    for _ in range(bwd_kernels):
        r.other(BANDWIDTH, float(n_out), bwd_passes / bwd_kernels * max(n_in, n_out) * BYTES_PER_ELEMENT)


def _slice_backward(r: _Rows, in_shape: list[int], out_shape: list[int]) -> None:
    """A select's or a narrow's backward (formulas._slice; a split's piece has none): zeros of the input's shape
    written, then the gradient read and copied into its slice."""
    r.other(BANDWIDTH, 0.0, float(numel(in_shape)) * BYTES_PER_ELEMENT, bwd=True)
    r.other(BANDWIDTH, 0.0, 2.0 * numel(out_shape) * BYTES_PER_ELEMENT, bwd=True)


def _loss(r: _Rows, output_shape: list[int], loss: str = "cross_entropy") -> None:
    """The kernels of the step's ``loss``: a cross entropy over a class score per position (formulas.position_loss;
    none for a classifier's): log-softmax and the likelihood forward; backward, the likelihood's zeroed gradient and
    the log-softmax's; an MSE's or an L1 loss's (formulas.REGRESSION_LOSS_KERNELS), each over the output's elements."""
    if loss != "cross_entropy":
        n = float(numel(output_shape))
        for flops, moved in (k for passes in REGRESSION_LOSS_KERNELS[loss] for k in passes):
            r.other(BANDWIDTH, flops * n, moved * n * BYTES_PER_ELEMENT)
        return
    cost = position_loss(output_shape)
    if cost is None:
        return
    n = float(numel(output_shape))
    positions = n / output_shape[0]
    r.other(BANDWIDTH, cost.flops_fwd, 2 * n * BYTES_PER_ELEMENT)
    r.other(BANDWIDTH, positions, positions * BYTES_PER_ELEMENT)
    r.other(BANDWIDTH, 0.0, n * BYTES_PER_ELEMENT)
    r.other(BANDWIDTH, cost.flops_bwd, 3 * n * BYTES_PER_ELEMENT)


_VIEWS = {"input", "identity", "reshape", "flatten", "squeeze", "unsqueeze", "select", "narrow", "transpose"}
#: The bandwidth-bound ops' (forward passes, backward passes, backward kernels) for :func:`_elementwise`; an op not
#: here (activations, average pooling, mean, mul, ...; an op this module does not know): :data:`_DEFAULT_PASSES`.
_PASSES: dict[str, tuple[float, float, int]] = {
    "batchnorm2d": (1.5, 4.0, 1),  # forward: statistics pass + normalise pass; backward: two passes
    "add": (1.0, 0.0, 0),  # backward routes the gradient: no kernel
    "cat": (1.0, 0.0, 0),  # backward slices: views
    "dropout": (1.5, 2.0, 1),
    "permute": (1.0, 1.0, 1),  # a view, copied by the op after it that needs contiguous memory: a copy each way
    "layernorm": (1.5, 4.0, 2),  # like batch norm; backward: the input's gradient, then the weight's and bias's
    # one fused kernel each way (statistics, then normalise), the weight's gradient a kernel of its own (as a layer
    # norm's); without a weight, _PLAIN_RMSNORM_PASSES
    "rmsnorm": (1.5, 4.0, 2),
    "groupnorm": (1.5, 4.0, 1),  # like batch norm: statistics per sample and group, then normalise; one backward
    "instancenorm": (1.5, 4.0, 1),  # a batch norm of every sample's channels apart: statistics, then normalise
    "softmax": (2.0, 3.0, 1),  # forward: a max and a sum of exps along dim, then the divide; backward one kernel
    "log_softmax": (2.0, 3.0, 1),  # as softmax: a max and a sum of exps along dim, then the subtract
    # backward: one kernel reads the gradient and the input and writes two input-sized tensors (the input's gradient,
    # the slopes' per element), a second sums the latter down to the slopes
    "prelu": (1.0, 5.0, 2),
    "dropout2d": (1.0, 2.0, 1),  # a multiply by a noise per channel each way (the noise's own kernels negligible)
    # seven kernels forward (formulas._local_response_norm), fifteen back, each about a pass over the map
    "local_response_norm": (7.0, 15.0, 15),
    "scale": (1.0, 3.0, 3),  # backward: the input's gradient, the parameter's (a multiply and a sum)
    "shift": (1.0, 1.0, 1),  # backward: the parameter's gradient, the incoming one summed down
    "token": (1.0, 0.0, 0),  # a copy; backward slices
    "patch_merge": (2.0, 15.0, 11),  # pad and concatenate; backward: four zeroed input-sized gradients summed
    **dict.fromkeys(("maxpool2d", "adaptivemaxpool2d", "interpolate"), (1.0, 3.0, 2)),  # backward: zero + scatter
    "fractional_maxpool2d": (1.0, 3.0, 2),  # a max pool's (its draw of 2 floats a channel negligible)
    "frozen_batchnorm2d": (2.0, 1.0, 1),  # x * scale, then + shift; backward: the gradient times the scale
    # a copy each way (a constant pad's backward copies the gradient's middle out; a shuffle's is an unshuffle)
    **dict.fromkeys(("pad", "pixel_shuffle", "pixel_unshuffle"), (1.0, 1.0, 1)),
    # a tiling: a copy forward; backward a sum over the tiles (the output-sized gradient read, the input's written);
    # repeats all 1 hand the gradient on: _PLAIN_REPEAT_PASSES
    "repeat": (1.0, 1.0, 1),
    # forward the input read, the output and the noise written; backward the gradient and the noise read, one written
    "rrelu": (1.5, 3.0, 1),
    # seven kernels forward (formulas._alpha_dropout): five over a noise of the input's size, the multiply and the
    # add (two reads and a write each); backward the gradient times the noise; of whole channels: _FEATURE_PASSES
    "alpha_dropout": (7.5, 3.0, 1),
    # backward: x ** (p - 1) (a read, a write), times p (the same), times the gradient (two reads, a write); rsqrt's
    # the same of its result (result ** 3, -0.5 * grad, their product)
    "pow": (1.0, 7.0, 3),
    "abs": (1.0, 5.0, 2),  # backward: sgn(x), then times the gradient
    # backward: grad / y; x / y, over y again, -grad, their product (two reads and a write each but the negate's)
    "div": (1.0, 14.0, 5),
    "var": (1.0, 5.0, 4),  # backward: the mean (a read), the deviation (a read, a write), the scaled product (the same)
    # backward, each input's: a compare of the two (2 reads, a 1-byte write: 2.25), the gradient halved (2), an
    # equality compare (2.25), a where (a mask and 2 reads, a write: 3.25), a masked_fill (2.25): 12 passes, 5 kernels
    **dict.fromkeys(("maximum", "minimum"), (1.0, 24.0, 10)),
    **dict.fromkeys(("flip", "roll"), (1.0, 1.0, 1)),  # a copy each way (backward: the gradient flipped or rolled back)
    # forward the norm (the input read) and the division (read, written), the clamp's rows negligible; backward the
    # division's x / y, over y, -grad (two each) and their product (3), grad / y (2), the expand's sum (1), x / norm
    # and the masked fill (two each), the product (3) and the two gradients' add (3), the row kernels negligible
    "normalize": (1.5, 22.0, 14),
    # forward the max, x less it (a read, a write), its exp in place (the same) and the sum: 6 input-sized passes
    # (formulas._logsumexp's 10 kernels, those over the output negligible); backward x - result, its exp and the
    # product with the broadcast gradient (a read and a write each)
    "logsumexp": (6.0, 6.0, 3),
    "linspace": (0.0, 0.0, 0),  # a few floats once a step (a view over the batch), nothing back
    "cumsum": (1.0, 6.0, 3),  # a scan (a read, a write); backward a flip, the scan and a flip back (the same each)
    # forward four input pixels read an output element (those of neighbours mostly cached: two passes) and the
    # output written; backward the gradient read and the map's (zeroed, then four corners added) and grid's written
    "grid_sample": (2.0, 4.0, 2),
    # forward the input read, the values and int64 indices written (a sort several passes: taken as 3); backward the
    # input-sized zeros written, then the gradient and indices read and scattered into a copy of them
    "sort": (3.0, 4.0, 2), "topk": (1.5, 4.0, 2),
}
#: A square root's: backward 2 * result, then the gradient over it.
_SQRT_PASSES = (1.0, 5.0, 2)
#: A reflection or replication pad's: its backward zeroes the input's gradient, then adds each output pixel's onto
#: the input pixel it came from.
_BORDER_PAD_PASSES = (1.0, 2.0, 2)
_DEFAULT_PASSES = (1.0, 3.0, 1)
#: An RMS norm without a weight: its input's gradient alone, one kernel (reads the gradient and the input, writes one).
_PLAIN_RMSNORM_PASSES = (1.5, 3.0, 1)
#: A batch norm by its running statistics (``training`` false: formulas._constant_mode_batchnorm2d): no statistics
#: pass forward; backward one kernel reading the gradient and the input (for the weight's gradient) and writing the
#: input's; without a weight the gradient read and the input's written.
_CONSTANT_MODE_BATCHNORM_PASSES = {True: (1.0, 3.0, 1), False: (1.0, 2.0, 1)}
#: An alpha dropout of whole channels: its noise's kernels negligible, the multiply and the add each way.
_FEATURE_ALPHA_DROPOUT_PASSES = (2.0, 2.0, 1)
#: A repeat of counts all 1: a copy forward; backward the gradient handed on (no kernel).
_PLAIN_REPEAT_PASSES = (1.0, 0.0, 0)
#: A sort or topk of gather (formulas._sort_gather): its own passes over the sorted input (most of those over the
#: inputs and output counted), the gather about one more (an index and an element read, one written an output
#: element); backward y's zeros written, then the gradient and indices read and added into them.
_SORT_GATHER_PASSES = {"sort": (3.0, 4.0, 2), "topk": (2.0, 4.0, 2)}
#: A shift by a buffer (``fixed``): the add forward; backward the gradient handed on, no kernel.
_FIXED_SHIFT_PASSES = (1.0, 0.0, 0)
#: A gather at an earlier sort's or topk's indices (``shares``: formulas._shared_gather): the gather's pass alone.
_SHARED_GATHER_PASSES = (1.0, 4.0, 2)


def _circular_pad_passes(node: Node) -> tuple[float, float, int]:
    """A circular pad's (formulas._circular_pad): forward, copies of the input and the border strips (about one pass
    over the input and the output); backward, per padded side the gradient cloned (2 output-sized passes), a strip's
    gradient written into zeros of the output's size (1) and added to the clone (3), 7 kernels; then the middle's:
    the gradient cloned (2), its middle cloned out and put through two slice backwards (about 6 input-sized), 6
    kernels."""
    sides = sum(int(p) > 0 for p in node.attrs["pads"])
    return 1.0, 6.0 * sides + 8.0, 7 * sides + 6


def _unfold_passes(node: Node) -> tuple[float, float, int]:
    """An unfold's (im2col's): forward a copy of the input into the columns (one pass over both); backward col2im,
    the columns' gradient read and the input's written: 1 + the smaller over the larger of the two, taken as
    stride_h stride_w / (kh kw) map elements a column element (its windows' overlap; exact where the padding
    keeps the sides whole), one kernel. A fold's (col2im's) alike, the other way round."""
    k, s = node.attrs["kernel_size"], node.attrs["stride"]
    ratio = (int(s[0]) * int(s[1])) / (int(k[0]) * int(k[1]))
    return 1.0, 1.0 + min(ratio, 1.0 / ratio), 1


def _weighted_sum_passes(node: Node) -> tuple[float, float, int]:
    """A BiFPN fusion of n maps (formulas._weighted_sum; its kernels on the n weights alone left out): forward, n
    products (a map read, one written) and n - 1 adds (two read, one written), 5n - 3 map-sized passes over the n + 1
    maps read and written; backward, per map its gradient times the map (3), summed (1) and times its weight (2): 6n
    over the n maps, 3n kernels."""
    n = int(node.attrs["num_inputs"])
    return (5.0 * n - 3.0) / (n + 1.0), 6.0, 3 * n


def _where_passes(node: Node) -> tuple[float, float, int]:
    """A where (formulas._where): forward the compare (x read, a byte an element written) and the where (the
    condition and the branches read, the output written), about 1.5 passes over its inputs and output; backward per
    tensor branch a where of the gradient (the condition, the gradient read, one written: 2.25 output-sized). A
    mask cast to float32 and multiplied in (``float_mask``): the cast besides (a byte read, 4 written an element)
    and the multiply reading 4 bytes of mask an element, not one: about 2.2 passes; backward 3 (a float mask read)."""
    branches = len(node.inputs) - where_condition_inputs(node.attrs)
    if node.attrs.get("float_mask"):
        return 2.2, 3.0 * branches, branches
    return 1.5, 2.25 * branches, branches


def _affine_grid_passes(node: Node) -> tuple[float, float, int]:
    """An affine grid (formulas._affine_grid): forward the base grid written (1.5 grids' worth: three coordinates a
    position against the grid's two) and read by the bmm, the grid written: 4 passes over the grid; backward the
    base grid built again (3) and the gradient read (1), its kernels the forward's."""
    return 4.0, 4.0, 6 if node.attrs["align_corners"] else 10


def kernel_table(desc: NetworkDescription, update: OptimizerCost | str = DEFAULT_OPTIMIZER,
                 visits: Sequence[Visit] | None = None, loss: str = "cross_entropy", *,
                 walked: tuple[dict[str, int], list[tuple[float, float, int]], tuple[float, int]] | None = None
                 ) -> KernelTable:
    """Every kernel of one training step of ``desc`` whose optimiser's update costs ``update`` (an optimiser's name:
    its default settings; see the module docstring and ``optimizers.py``). Ops this module does not know are costed
    as one generic bandwidth-bound kernel over their input and output. An op whose output needs no gradient
    (``walk.py``: a parameter-free op of the network input alone) runs its forward kernels alone, and a tensor that
    needs none gets no gradient accumulation. ``visits``: ``walk(desc)``'s, where the caller walked already (under
    any runtime: the kernels read only the nodes, their input shapes, parameters and which need a gradient).
    ``loss``: the step's loss (``profiling.plan.LOSSES``). ``walked``: what the caller made of those ``visits``
    already, ``gradient_accumulations``', ``split_gathers``' and ``trained_params``'."""
    opt = optimizer_cost(update) if isinstance(update, str) else update
    shapes = {n.name: n.output_shape for n in desc.nodes}
    r = _Rows()
    visits = list(walk(desc)) if visits is None else visits
    if walked is None:
        walked = gradient_accumulations(desc, visits), split_gathers(visits), trained_params(visits)
    accumulations, gathers, (trained, params) = walked  # each tensor that gets a gradient: its own update kernels
    untrained = sum(v.cost.params for v in visits if v.cost is not None) - trained  # a dead branch's
    n_params = _param_count(desc) - untrained
    needs_grad = {v.node.name: v.needs_grad for v in visits}
    for visit in visits:
        node, ins, first = visit.node, visit.in_shapes, visit.first
        op = node.op
        r.forward_only = not (visit.trained and visit.needs_grad)  # no gradient reaches it, or it needs none
        if op in ("select", "narrow") and visit.cost.kernels_bwd:  # its backward: zeros, a copy into them
            _slice_backward(r, ins[0], node.output_shape)
        if op in _VIEWS or hands_input_back(node):
            continue
        for _ in range(visit.input_copies):  # its input copied first (walk.Visit): read and written
            r.other(BANDWIDTH, 0.0, 2.0 * numel(ins[0]) * BYTES_PER_ELEMENT)
        for i in visit.copied_inputs:  # a matmul's inputs copied for its bmm (walk.Visit): read and written
            r.other(BANDWIDTH, 0.0, 2.0 * numel(ins[i]) * BYTES_PER_ELEMENT)
        if op == "conv2d":
            _conv(r, node, ins[0], first, visit.frozen)
        elif op == "conv_transpose2d":
            _conv_transpose(r, node, ins[0], first, visit.frozen)
        elif op == "linear":
            _linear(r, node, ins[0], first, visit.frozen)
        elif op == "attention":
            _attention(r, node, ins[0], first, visit.frozen)
        elif op == "matmul":
            _matrix_product(r, node, ins, [needs_grad[i] and visit.trained for i in node.inputs])
        elif op == "window_attention":
            _window_attention(r, node, visit.frozen)
        elif op == "group_attention":
            _group_attention(r, node, first)
        elif op == "linspace" and node.attrs.get("made") in ("arange", "arange_grid"):
            _arange_coordinates(r, node, visit.cost.kernels_fwd)
        else:
            fwd_passes, bwd_passes, bwd_kernels = _passes(node)
            composite = op in ("local_response_norm", "alpha_dropout", "normalize", "logsumexp", "where",
                               "affine_grid") \
                or op == "pad" and node.attrs["mode"] == "circular" or bool(node.attrs.get("gather"))
            fwd_kernels = visit.cost.kernels_fwd if composite else 1  # torch runs these as several ops
            if op == "weighted_sum":  # its products and adds (those on its weights alone left out)
                fwd_kernels = 2 * int(node.attrs["num_inputs"]) - 1
            if op in INPUT_GRADIENTS and visit.needs_grad:  # the gradients of those inputs that need one alone
                bwd_passes, bwd_kernels = _gradients_run(visit, bwd_passes, bwd_kernels)
            _elementwise(r, node, ins, fwd_passes, bwd_passes, bwd_kernels if visit.needs_grad else 0, fwd_kernels)
    r.forward_only = False
    _loss(r, desc.node(desc.output).output_shape, loss)
    for name, adds in accumulations.items():  # k gradients into one tensor: k-1 adds (a DenseNet's: a thousand)
        elems = numel(shapes[name])
        r.repeated(adds, BANDWIDTH, float(elems), 3.0 * elems * BYTES_PER_ELEMENT)
    for elems, zeros, pieces in gathers:  # a split's backward: zeros for pieces without a gradient, a cat
        for _ in range(pieces):
            r.other(BANDWIDTH, 0.0, zeros / pieces * BYTES_PER_ELEMENT)
        r.other(BANDWIDTH, 0.0, 2.0 * elems * BYTES_PER_ELEMENT)
    _shared_weight_sums(r, visits)
    updates = opt.kernels_per_tensor * params  # each of the same share of the parameters' bytes: one row, repeated
    if updates > 0:
        share = opt.tensor_passes / opt.kernels_per_tensor * n_params * BYTES_PER_ELEMENT / max(params, 1)
        r.rows += [(BANDWIDTH, 0.0, 0.0, 0.0, -1, 0.0, 0.0, share)] * updates
    a = np.fromiter(chain.from_iterable(r.rows), dtype=float, count=8 * len(r.rows)).reshape(-1, 8)
    return KernelTable(kind=a[:, 0].astype(np.int64), dims=a[:, 1:4], batch_dim=a[:, 4].astype(np.int64),
                       flops_ps=a[:, 5], bytes_ps=a[:, 6], bytes_fixed=a[:, 7], param_tensors=params)


def _gradients_run(visit: Visit, bwd_passes: float, bwd_kernels: int) -> tuple[float, int]:
    """The backward passes and kernels of an op whose backward computes each input's gradient apart
    (``formulas.INPUT_GRADIENTS``: a quotient, a product, a maximum, a where, a grid sample) where some inputs need
    none: its passes and kernels in the share of the backward kernels its cost keeps for the inputs that need one
    (``walk``'s; a quotient of a divisor that needs none: 1 of 5), at least one kernel."""
    full = visit.all_kernels_bwd
    if not full or visit.cost.kernels_bwd >= full:
        return bwd_passes, bwd_kernels
    share = visit.cost.kernels_bwd / full
    return bwd_passes * share, max(1, round(bwd_kernels * share))


def _shared_weight_sums(r: _Rows, visits: Sequence[Visit]) -> None:
    """Each later call of a layer (a node that ``shares`` its first call's parameters) sums its gradient of each
    parameter tensor into the one before (an add: two tensors read, one written), once a step whatever the batch.
    The layer's bytes are spread evenly over its tensors, as the update's are. A call no gradient reaches
    (``Visit.trained`` false) computes none to add: the layer's first trained call is the one the others add into."""
    tensors = {v.node.name: trained_tensors(v) for v in visits if v.cost is not None}  # a frozen one's: no gradient
    seen: set[str] = set()  # the layers (by first call) one of whose trained calls came already
    for v in visits:
        owner = v.node.attrs.get(SHARES, v.node.name)
        if not v.trained or not tensors.get(owner):
            continue
        if owner not in seen:  # the first trained call: its gradient waits for the others'
            seen.add(owner)
            continue
        share = 3.0 * node_params(v.node) * BYTES_PER_ELEMENT / tensors[owner]
        for _ in range(tensors[owner]):
            r.other(BANDWIDTH, 0.0, 0.0, share)


def _passes(node: Node) -> tuple[float, float, int]:
    """``node``'s (forward passes, backward passes, backward kernels) for :func:`_elementwise`."""
    if node.op == "pad" and node.attrs["mode"] == "circular":
        return _circular_pad_passes(node)
    if node.op == "pad" and node.attrs["mode"] != "constant":
        return _BORDER_PAD_PASSES
    if node.op == "pow" and float(node.attrs["exponent"]) == 0.5:
        return _SQRT_PASSES
    if node.op == "batchnorm2d" and node.attrs.get("training") is False:
        return _CONSTANT_MODE_BATCHNORM_PASSES[bool(node.attrs.get("affine", True))]
    if node.op == "rmsnorm" and not node.attrs.get("elementwise_affine", True):
        return _PLAIN_RMSNORM_PASSES
    if node.op == "alpha_dropout" and node.attrs.get("feature"):
        return _FEATURE_ALPHA_DROPOUT_PASSES
    if node.op == "repeat" and all(int(r) == 1 for r in node.attrs["repeats"]):
        return _PLAIN_REPEAT_PASSES
    if node.op == "weighted_sum":
        return _weighted_sum_passes(node)
    if node.op in ("unfold", "fold"):
        return _unfold_passes(node)
    if node.op == "where":
        return _where_passes(node)
    if node.op == "affine_grid":
        return _affine_grid_passes(node)
    if node.op == "shift" and node.attrs.get("fixed"):
        return _FIXED_SHIFT_PASSES
    if node.op in ("sort", "topk") and node.attrs.get("gather"):
        return _SHARED_GATHER_PASSES if SHARES in node.attrs else _SORT_GATHER_PASSES[node.op]
    return _PASSES.get(node.op, _DEFAULT_PASSES)


def _param_count(desc: NetworkDescription) -> float:
    if desc.params:
        return float(desc.params)
    from perf4sight.ir.schema import count_params
    return float(count_params(desc))


def _padded(x: np.ndarray, tile: int) -> np.ndarray:
    return np.ceil(x / tile) * tile


def _columns_one(kt: KernelTable, bs: np.ndarray) -> np.ndarray:
    """(len(bs), len(LATENCY_FEATURES)) for one table."""
    g = kt.kind == GEMM
    dims = kt.dims[g]
    scale = np.ones((len(bs), int(g.sum()), 3))
    for d in range(3):
        sel = kt.batch_dim[g] == d
        scale[:, sel, d] = bs[:, None]
    full = dims[None, :, :] * scale  # (rows, gemms, 3)
    macs = full.prod(axis=2).sum(axis=1)
    padded = (_padded(full[..., 0], TILE[0]) * _padded(full[..., 1], TILE[1])
              * _padded(full[..., 2], TILE[2])).sum(axis=1)
    padded64 = (_padded(full[..., 0], TILE64[0]) * _padded(full[..., 1], TILE64[1])
                * _padded(full[..., 2], TILE64[2])).sum(axis=1)
    dw = kt.kind == DEPTHWISE
    ew = kt.kind == BANDWIDTH
    dw_bytes = bs * kt.bytes_ps[dw].sum() + kt.bytes_fixed[dw].sum()
    ew_bytes = bs * kt.bytes_ps[ew].sum() + kt.bytes_fixed[ew].sum()
    launches = np.full(len(bs), float(kt.launches))
    work = bs * kt.flops_ps.sum() / max(kt.launches, 1)
    return np.column_stack([macs, padded, padded - macs, padded64, dw_bytes, ew_bytes, launches, work])


def latency_columns(tables: list[KernelTable] | KernelTable, batch_sizes: list[int] | np.ndarray) -> np.ndarray:
    """:data:`LATENCY_FEATURES` columns: one table at every batch size, or row ``i`` = ``tables[i]`` at
    ``batch_sizes[i]`` (tables shared between rows are evaluated once per distinct table)."""
    bs = np.asarray(batch_sizes, dtype=float).reshape(-1)
    if isinstance(tables, KernelTable):
        return _columns_one(tables, bs)
    if len(tables) != len(bs):
        raise ValueError("latency_columns: one batch size per table expected")
    out = np.empty((len(bs), len(LATENCY_FEATURES)))
    rows_of: dict[int, list[int]] = {}
    for i, t in enumerate(tables):
        rows_of.setdefault(id(t), []).append(i)
    for idx in rows_of.values():
        out[idx] = _columns_one(tables[idx[0]], bs[idx])
    return out
