"""Per-op cost formulas: a plain table from op name to handler.

Every figure is **per sample** (one image, batch size 1); callers multiply by the batch size.
Conventions, stated once:

- ``macs``: multiply-accumulates of the forward pass. ``flops_fwd``: forward FLOPs, where
  **one multiply-add counts as 2 FLOPs** and an element-wise op counts its documented number
  of FLOPs per output element.
- ``flops_bwd``: backward FLOPs. Conv and linear: gradient w.r.t. the input (2 x MACs x 2 FLOPs,
  i.e. one more pass of the same size) plus gradient w.r.t. the weight (same again); a layer whose
  input needs no gradient (``first`` = True: the network input, a view of it, or what parameter-free ops made
  of it alone; ``walk.py``) computes no input gradient. A parameter-free op whose inputs need none runs no
  backward at all: the walk drops its backward FLOPs and kernels and what it keeps.
- Bytes assume fp32 (4 bytes per element): ``bytes_read`` = input activations + parameters read
  by the forward pass, ``bytes_written`` = output activation written by it.
- ``saved``: which tensors autograd keeps for the backward pass, as input positions (0, 1, ...)
  or ``OUTPUT``; the aggregator de-duplicates them by tensor name. ``extra_saved_bytes``: other
  buffers kept (max-pool indices as int64, dropout masks as bool).
- ``batch_saved``: the bytes of each tensor kept for backward once a batch, whatever its size (not per sample: a
  batch norm's mean and 1/std over the batch, ``[C]`` floats each); the aggregator adds them to the step's memory
  once.
- ``kernels_fwd`` / ``kernels_bwd``: approximate GPU kernel launches (views launch none forward; a select's or a
  narrow's backward writes zeros and copies into them: 2).

An op missing from :data:`HANDLERS` is reported by name by the aggregator, never costed as zero.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Callable

from perf4sight.ir.schema import (SHARES, Node, split_group, unbind_group, where_condition_inputs,
                                  window_attention_params)
from perf4sight.ir.shapes import broadcast, window_pair, windows_of

__all__ = ["OpCost", "HANDLERS", "INPUT_GRADIENTS", "OUTPUT", "BYTES_PER_ELEMENT", "numel", "hands_input_back",
           "position_loss", "output_loss", "REGRESSION_LOSS_KERNELS", "is_dilated", "kernel_dilates", "copied_first",
           "sorted_shape", "STANDARDIZE_KERNELS", "NO_GRADIENT_OPS", "scaled_gain_kernels"]

#: Marker in ``OpCost.saved`` for "the op's own output is kept for backward".
OUTPUT = -1
BYTES_PER_ELEMENT = 4  # fp32


def numel(shape: list[int]) -> int:
    """Elements of a per-sample shape (no batch dimension)."""
    return int(math.prod(shape)) if shape else 1


@dataclass
class OpCost:
    """Per-sample cost of one node (see the module docstring for units)."""

    macs: float = 0.0
    flops_fwd: float = 0.0
    flops_bwd: float = 0.0
    bytes_read: float = 0.0
    bytes_written: float = 0.0
    params: int = 0
    param_tensors: int = 0
    saved: list[int] = field(default_factory=list)
    extra_saved_bytes: float = 0.0
    batch_saved: tuple[float, ...] = ()  # bytes of each tensor kept once a batch (module docstring)
    kernels_fwd: int = 0
    kernels_bwd: int = 0
    kind: str = "other"  # dense | depthwise | grouped | linear | norm | pool | elementwise | view | other


Handler = Callable[[Node, list[list[int]], bool], OpCost]


def changed(cost: OpCost, **fields: Any) -> OpCost:
    """A new ``cost`` with ``fields`` set, as ``dataclasses.replace`` makes it (the other fields the same objects),
    in a third of its time: no ``__init__`` called through the fields' list (the walk changes a few hundred costs a
    network). An unknown field is refused, as ``replace`` refuses it."""
    if not cost.__dict__.keys() >= fields.keys():
        raise TypeError(f"OpCost has no field {sorted(fields.keys() - cost.__dict__.keys())[0]!r}")
    new = object.__new__(cost.__class__)
    new.__dict__.update(cost.__dict__, **fields)
    return new


def kernel_dilates(attrs: dict) -> bool:
    """Whether a convolution's (or a transposed one's) ``attrs`` dilate its kernel (a ``dilation`` other than 1 on
    either side)."""
    return any(int(d) != 1 for d in attrs.get("dilation", [1, 1]))


def is_dilated(node: Node) -> bool:
    """Whether ``node`` is a convolution whose kernel dilates (``dilation`` other than ``[1, 1]``)."""
    return node.op == "conv2d" and kernel_dilates(node.attrs)


def _io_bytes(in_shapes: list[list[int]], out_shape: list[int]) -> tuple[float, float]:
    return (sum(numel(s) for s in in_shapes) * BYTES_PER_ELEMENT, numel(out_shape) * BYTES_PER_ELEMENT)


#: A conv2d's weight standardisation (its attr ``standardize``) -> the kernels torch 2.14 runs for it each training
#: step, forward and backward (a dispatch log; views and the gradient's accumulation into the leaf aside), and what
#: its autograd keeps, once a step: (tensors of the weight's size, of one float an output channel). F.batch_norm
#: keeps its mean and 1/std; the moments' spellings keep the centred weight and the spread (std: the std and the std
#: plus eps); every one keeps the standardised weight, which the convolution reads (a plain one keeps its parameter).
STANDARDIZE_KERNELS = {"batch_norm": (1, 1), "std": (5, 19), "var": (6, 17), "var_mean": (5, 17), "std_rows": (5, 19),
                       "std_mean": (4, 19), "layer_norm": (1, 1)}
STANDARDIZE_KEPT = {"batch_norm": (1, 2), "std": (2, 2), "var": (2, 1), "var_mean": (2, 1), "std_rows": (2, 2),
                    "std_mean": (2, 2), "layer_norm": (1, 2)}


def _standardized(cost: OpCost, form: str, weights: int, cout: int) -> OpCost:
    """``cost`` of a convolution with its weight standardised as ``form`` (:data:`STANDARDIZE_KERNELS`): its kernels
    added, and what it keeps once a step (``batch_saved``). Its FLOPs, a few an element of the weight once a step,
    are left out (per-sample figures, they would grow with the batch)."""
    fwd, bwd = STANDARDIZE_KERNELS[form]
    sized, per_channel = STANDARDIZE_KEPT[form]
    kept = (weights * BYTES_PER_ELEMENT,) * sized + (cout * BYTES_PER_ELEMENT,) * per_channel
    return changed(cost, kernels_fwd=cost.kernels_fwd + fwd, kernels_bwd=cost.kernels_bwd + bwd,
                   batch_saved=cost.batch_saved + tuple(float(b) for b in kept))


def scaled_gain_kernels(form: str) -> tuple[int, int]:
    """The kernels (forward, back) of a ScaledStdConv2d's gain and scale of standardisation ``form``
    (:func:`_scaled_gain`): timm's ``batch_norm`` one each way, over a float an output channel; the older
    spellings' two forward and four back, over the weight."""
    return (1, 1) if form == "batch_norm" else (2, 4)


def _scaled_gain(cost: OpCost, form: str, weights: int, cout: int) -> OpCost:
    """``cost`` of a conv2d standardised with a learnt gain per output channel and a fixed scale (its attr
    ``standardize_scale``: NFNets' ScaledStdConv2d): the gain's ``cout`` parameters, a tensor more. By ``batch_norm``
    (timm's, the batch norm's weight ``(gain * scale).view(-1)``): the product, a kernel forward, and the gain's
    gradient, the incoming one times the scale, one back (native_batch_norm_backward's count unchanged: it writes the
    weight's gradient too); kept once a step, the product (``cout`` floats). By ``std_mean`` (timm's older, ``gain *
    (scale * (w - m) / (s + eps))``): the two products forward; back the scale's product and the gain's (the weight's
    gradient, and the gain's, a product summed down); kept, the standardised weight the gain multiplies (torch 2.14,
    a dispatch log)."""
    (fwd, bwd), kept = scaled_gain_kernels(form), cout if form == "batch_norm" else weights
    return changed(cost, params=cost.params + cout, param_tensors=cost.param_tensors + 1,
                   kernels_fwd=cost.kernels_fwd + fwd, kernels_bwd=cost.kernels_bwd + bwd,
                   batch_saved=cost.batch_saved + (float(kept * BYTES_PER_ELEMENT),))


def _weight_normed(cost: OpCost, weights: int, cout: int) -> OpCost:
    """``cost`` of a conv2d or linear whose weight is g * v / ||v|| per output channel (its attr ``weight_norm``,
    either form): g's ``cout`` parameters, a tensor more (v is the weight's); torch's one kernel forward
    (``_weight_norm_interface``, this CPU's and CUDA's alike) and one back (its ``_backward``: v's and g's gradients
    from the weight's); and what autograd keeps once a step: the weight computed, which the layer reads (a plain one
    reads its parameter), and the norm of each output channel. Its FLOPs, a few an element of the weight once a step,
    are left out (per-sample figures)."""
    kept = (float(weights * BYTES_PER_ELEMENT), float(cout * BYTES_PER_ELEMENT))
    return changed(cost, params=cost.params + cout, param_tensors=cost.param_tensors + 1,
                   kernels_fwd=cost.kernels_fwd + 1, kernels_bwd=cost.kernels_bwd + 1,
                   batch_saved=cost.batch_saved + kept)


def _spectral_normed(cost: OpCost, weights: int, cout: int, iterations: int) -> OpCost:
    """``cost`` of a conv2d or linear whose weight is divided by its largest singular value (its attr
    ``spectral_norm``, either form; torch 2.14's kernels, a dispatch log): forward, each power iteration's two
    matrix-vector products, norms, clamps and divisions (8), then u and v cloned, W v, u . W v and the division of the
    weight (5); back 9 (the weight's gradient through the division and through sigma = u . W v: u v^T). Kept once a
    step: the weight divided (which the layer reads), u (``cout`` floats: W v is not kept, u needing no gradient),
    v (the weight's row) and sigma."""
    kept = tuple(float(b * BYTES_PER_ELEMENT) for b in (weights, cout, weights // cout, 1))
    return changed(cost, kernels_fwd=cost.kernels_fwd + 8 * iterations + 5, kernels_bwd=cost.kernels_bwd + 9,
                   batch_saved=cost.batch_saved + kept)


def _conv2d(node: Node, in_shapes: list[list[int]], first: bool) -> OpCost:
    a = node.attrs
    kh, kw = a["kernel_size"]
    cin, cout, groups = int(a["in_channels"]), int(a["out_channels"]), int(a["groups"])
    out = node.output_shape
    hw_out = numel(out[1:]) if len(out) == 3 else 1
    weights = cout * (cin // groups) * kh * kw
    bias = cout if a["bias"] else 0
    macs = float(hw_out * cout * (cin // groups) * kh * kw)
    rd, wr = _io_bytes(in_shapes, out)
    if groups == 1:
        kind = "dense"
    elif groups == cin and cout % cin == 0:
        kind = "depthwise"
    else:
        kind = "grouped"
    grad_input = 0.0 if first else 2 * macs
    if a.get("fixed"):  # its filter a buffer (a blur pool's): the input's gradient alone back (it keeps its input)
        return OpCost(macs=macs, flops_fwd=2 * macs, flops_bwd=grad_input,
                      bytes_read=rd + weights * BYTES_PER_ELEMENT, bytes_written=wr, saved=[0], kernels_fwd=1,
                      kernels_bwd=0 if first else 1, kind=kind)
    cost = OpCost(macs=macs, flops_fwd=2 * macs + (hw_out * cout if bias else 0),
                  flops_bwd=grad_input + 2 * macs + (hw_out * cout if bias else 0),
                  bytes_read=rd + (weights + bias) * BYTES_PER_ELEMENT, bytes_written=wr,
                  params=weights + bias, param_tensors=1 + (1 if bias else 0), saved=[0],
                  kernels_fwd=1 + (1 if bias else 0), kernels_bwd=(1 if first else 2) + (1 if bias else 0),
                  kind=kind)
    if a.get("weight_norm"):
        return _weight_normed(cost, weights, cout)
    if a.get("spectral_norm"):
        return _spectral_normed(cost, weights, cout, int(a.get("spectral_norm_iterations", 1)))
    if not a.get("standardize"):
        return cost
    cost = _standardized(cost, a["standardize"], weights, cout)
    return _scaled_gain(cost, a["standardize"], weights, cout) if "standardize_scale" in a else cost


def _conv_transpose2d(node: Node, in_shapes: list[list[int]], first: bool) -> OpCost:
    """A transposed convolution: the gradient, by its input, of a conv2d from its output to its input. Each input
    pixel meets the whole ``[Cin / g, Cout / g, kh, kw]`` weight of its group: MACs = ``Cin x Cout / g x kh x kw x
    Hin x Win`` (FLOPs: 2 a MAC, plus an add an output element for the bias), as torch's FlopCounterMode counts. Its
    backward, as a conv2d's: the input's gradient (a conv2d of the output's gradient, the same MACs; none for a
    ``first`` layer) and the weight's (the same MACs), and the bias's (an add an output element). It keeps its input
    (its weight is a parameter); bytes as a conv2d's: input and parameters read, output written."""
    a = node.attrs
    kh, kw = a["kernel_size"]
    cin, cout, groups = int(a["in_channels"]), int(a["out_channels"]), int(a["groups"])
    x, out = in_shapes[0], node.output_shape
    hw_out = numel(out[1:])
    weights = cin * (cout // groups) * kh * kw
    bias = cout if a["bias"] else 0
    macs = float(numel(x[1:]) * weights)
    rd, wr = _io_bytes(in_shapes, out)
    kind = "dense" if groups == 1 else "depthwise" if groups == cin and cout % cin == 0 else "grouped"
    bias_flops = hw_out * cout if bias else 0
    return OpCost(macs=macs, flops_fwd=2 * macs + bias_flops,
                  flops_bwd=(0.0 if first else 2 * macs) + 2 * macs + bias_flops,
                  bytes_read=rd + (weights + bias) * BYTES_PER_ELEMENT, bytes_written=wr,
                  params=weights + bias, param_tensors=1 + (1 if bias else 0), saved=[0],
                  kernels_fwd=1 + (1 if bias else 0), kernels_bwd=(1 if first else 2) + (1 if bias else 0),
                  kind=kind)


def _linear(node: Node, in_shapes: list[list[int]], first: bool) -> OpCost:
    a = node.attrs
    fin, fout = int(a["in_features"]), int(a["out_features"])
    rows = numel(node.output_shape) // fout  # leading non-batch dims, usually 1
    bias = fout if a["bias"] else 0
    macs = float(rows * fin * fout)
    rd, wr = _io_bytes(in_shapes, node.output_shape)
    cost = OpCost(macs=macs, flops_fwd=2 * macs + rows * bias,
                  flops_bwd=(0.0 if first else 2 * macs) + 2 * macs + rows * bias,
                  bytes_read=rd + (fin * fout + bias) * BYTES_PER_ELEMENT, bytes_written=wr,
                  params=fin * fout + bias, param_tensors=1 + (1 if bias else 0), saved=[0],
                  kernels_fwd=1, kernels_bwd=(1 if first else 2) + (1 if bias else 0), kind="linear")
    if a.get("spectral_norm"):
        return _spectral_normed(cost, fin * fout, fout, int(a.get("spectral_norm_iterations", 1)))
    return _weight_normed(cost, fin * fout, fout) if a.get("weight_norm") else cost


def _batchnorm2d(node: Node, in_shapes: list[list[int]], first: bool) -> OpCost:
    """Training-mode batch norm: ~5 FLOPs/element forward (mean, var, normalise, scale, shift), ~8 backward. It reads
    its running mean and variance (unless it tracks none: ``track_running_stats`` false) and, unless ``affine`` is
    false, its weight and bias (its parameters). It keeps its input (per sample) and the batch's mean and 1/std
    (torch's ``save_mean``, ``save_invstd``: ``[C]`` floats each, once a batch; measured with saved-tensor hooks on
    torch 2.14, BatchNorm1d and 2d at batches 2 and 5); the weight and running statistics it also hands autograd are
    its own tensors, no new memory."""
    c = int(node.attrs["num_features"])
    params = 2 * c if node.attrs.get("affine", True) else 0
    running = 2 * c if node.attrs.get("track_running_stats", True) else 0
    n = numel(node.output_shape)
    rd, wr = _io_bytes(in_shapes, node.output_shape)
    if node.attrs.get("training") is False:  # by its running statistics in the training step (a frozen one)
        return _constant_mode_batchnorm2d(c, n, params, rd, wr)
    return OpCost(flops_fwd=5.0 * n, flops_bwd=8.0 * n, bytes_read=rd * 2 + (running + params) * BYTES_PER_ELEMENT,
                  bytes_written=wr, params=params, param_tensors=2 if params else 0, saved=[0],
                  batch_saved=(c * BYTES_PER_ELEMENT, c * BYTES_PER_ELEMENT), kernels_fwd=1, kernels_bwd=1,
                  kind="norm")


def _constant_mode_batchnorm2d(c: int, n: int, params: int, rd: int, wr: int) -> OpCost:
    """A batch norm by its running statistics in a training step (``training`` false: ``bn.eval()`` in a training
    model, ``F.batch_norm(..., training=False)``) as torch 2.14 runs it (a dispatch log): one kernel forward
    (``native_batch_norm``, no statistics pass: a scale and a shift, 2 FLOPs an element, the input read once), one back
    (``native_batch_norm_backward``: the gradient times weight / std, 1 FLOP an element, and with a weight its and the
    bias's gradients, the gradient times the normalised input summed and the gradient summed, 4 more). It keeps its
    input, as in training, but no batch mean and 1/std (its kernel returns them empty: autograd's saved tensors on
    this CPU; the meta kernel gives them [C] floats, which the allocation model writes down as the trace does). Of the
    kind ``elementwise``, as a frozen batch norm's: none of a norm's statistics (the features' ``norm_elems``)."""
    return OpCost(flops_fwd=2.0 * n, flops_bwd=(5.0 if params else 1.0) * n,
                  bytes_read=rd + (2 * c + params) * BYTES_PER_ELEMENT, bytes_written=wr, params=params,
                  param_tensors=2 if params else 0, saved=[0], kernels_fwd=1, kernels_bwd=1, kind="elementwise")


def _frozen_batchnorm2d(node: Node, in_shapes: list[list[int]], first: bool) -> OpCost:
    """A frozen batch norm (torchvision's FrozenBatchNorm2d) as torch runs it: five kernels on [C] vectors (its scale,
    weight / sqrt(running_var + eps), and shift, bias - running_mean * scale: once a batch, not a sample, so their
    FLOPs are left out), then x * scale and + shift on the map: 2 FLOPs an element, two kernels, the product written
    and read again. Backward the input's gradient alone (its buffers are not trained): the incoming one times the
    scale, 1 FLOP an element, one kernel. It keeps the [1, C, 1, 1] scale alone, once a batch (``batch_saved``; none a
    sample: measured on torch 2.14). It reads its four [C] buffers; no parameters."""
    c = int(node.attrs["num_features"])
    n = numel(node.output_shape)
    rd, wr = _io_bytes(in_shapes, node.output_shape)
    return OpCost(flops_fwd=2.0 * n, flops_bwd=float(n), bytes_read=rd * 2 + 4 * c * BYTES_PER_ELEMENT,
                  bytes_written=wr * 2, batch_saved=(c * BYTES_PER_ELEMENT,), kernels_fwd=7, kernels_bwd=1,
                  kind="elementwise")


def _layernorm(node: Node, in_shapes: list[list[int]], first: bool) -> OpCost:
    """Layer norm over the last dims: like batch norm, ~5 FLOPs/element forward and ~8 backward; it keeps its input,
    and a mean and an inverse deviation per normalised row; its backward computes the input's gradient and the
    weight's and bias's (two kernels)."""
    a = node.attrs
    width = numel(a["normalized_shape"])
    n = numel(node.output_shape)
    rows = n // max(width, 1)
    params = 2 * width if a.get("elementwise_affine", True) else 0
    rd, wr = _io_bytes(in_shapes, node.output_shape)
    return OpCost(flops_fwd=5.0 * n, flops_bwd=8.0 * n, bytes_read=rd * 2 + params * BYTES_PER_ELEMENT,
                  bytes_written=wr, params=params, param_tensors=2 if params else 0, saved=[0],
                  extra_saved_bytes=2.0 * rows * BYTES_PER_ELEMENT, kernels_fwd=1, kernels_bwd=2 if params else 1,
                  kind="norm")


def _rmsnorm(node: Node, in_shapes: list[list[int]], first: bool) -> OpCost:
    """RMS norm over the last dims as a CUDA build of torch >= 2.8 runs it, one fused kernel (``_fused_rms_norm``)
    each way but for the weight's gradient, a kernel of its own (the CPU runs it op by op instead). FLOPs an element:
    forward a square, a sum and the normalising multiply, and the weight's multiply where affine (3 or 4); backward
    the input's gradient (a multiply by the weight where affine, by the input, a sum, a multiply, a subtract and a
    multiply by 1/rms: 5 or 6) and the weight's (a multiply by the input and 1/rms, a sum over the rows: 3). It
    reads its input twice (the statistics, then the normalising pass) and keeps it, and a float 1/rms per row."""
    a = node.attrs
    width = numel(a["normalized_shape"])
    n = numel(node.output_shape)
    rows = n // max(width, 1)
    params = width if a.get("elementwise_affine", True) else 0
    rd, wr = _io_bytes(in_shapes, node.output_shape)
    return OpCost(flops_fwd=(4.0 if params else 3.0) * n, flops_bwd=(9.0 if params else 5.0) * n,
                  bytes_read=rd * 2 + params * BYTES_PER_ELEMENT, bytes_written=wr, params=params,
                  param_tensors=1 if params else 0, saved=[0], extra_saved_bytes=float(rows * BYTES_PER_ELEMENT),
                  kernels_fwd=1, kernels_bwd=2 if params else 1, kind="norm")


def _scale(node: Node, in_shapes: list[list[int]], first: bool) -> OpCost:
    """The input times a learnt tensor (layer scale): 1 FLOP per element forward; backward, the input's gradient
    (a multiply) and the parameter's (a multiply and a sum down to its shape). It keeps its input."""
    n = numel(node.output_shape)
    width = numel(node.attrs["shape"])
    rd, wr = _io_bytes(in_shapes, node.output_shape)
    return OpCost(flops_fwd=float(n), flops_bwd=3.0 * n, bytes_read=rd + width * BYTES_PER_ELEMENT, bytes_written=wr,
                  params=width, param_tensors=1, saved=[0], kernels_fwd=1, kernels_bwd=3, kind="elementwise")


def _learnt_tensor(node: Node, in_shapes: list[list[int]], first: bool) -> OpCost:
    """``shift`` (plus a learnt tensor, broadcast) and ``token`` (a learnt tensor put first): 1 FLOP per element (the
    token's copy none), nothing kept; backward, the parameter's gradient is the incoming one summed down (shift)
    or sliced (token). A ``fixed`` shift adds a buffer: no parameter, no gradient of it (no kernel back)."""
    n = numel(node.output_shape)
    width = numel(node.attrs["shape"])
    rd, wr = _io_bytes(in_shapes, node.output_shape)
    shift = node.op == "shift"
    learnt = not node.attrs.get("fixed")  # a fixed shift's tensor is a buffer: no gradient, no parameter
    return OpCost(flops_fwd=float(n) if shift else 0.0, flops_bwd=float(n) if shift and learnt else 0.0,
                  bytes_read=rd + width * BYTES_PER_ELEMENT, bytes_written=wr, params=width if learnt else 0,
                  param_tensors=int(learnt), kernels_fwd=1, kernels_bwd=1 if shift and learnt else 0,
                  kind="elementwise" if shift else "other")


def _attention(node: Node, in_shapes: list[list[int]], first: bool) -> OpCost:
    """Multi-head self-attention over ``L`` tokens of width ``E`` in ``H`` heads: the input projection (``3 L E^2``
    MACs), the scores ``Q K^T`` and their weighted sum of ``V`` (``L^2 E`` each), the output projection
    (``L E^2``); a softmax of ``5 H L^2`` FLOPs. Backward: two passes of every product, and the scores computed
    again (``L^2 E``); for the network input (``first``) the input projection's input gradient (``3 L E^2``) is left
    out, the rest run (the queries, keys and values need theirs for the projection's weight).

    Kept for backward as PyTorch 2's fused kernel keeps them (``scaled_dot_product_attention``, which
    ``nn.MultiheadAttention`` runs where no weights are asked for; flash attention on a CPU, memory-efficient
    attention on a GPU): the input, the projected queries, keys and values (one tensor), the kernel's output (also
    the output projection's input), and a log-sum-exp per head and token: ``4 L E + H L`` elements besides the
    input. The math path of torch 1.x kept the softmax's ``H L^2`` weights instead of the log-sum-exp."""
    a = node.attrs
    e, h = int(a["embed_dim"]), int(a["num_heads"])
    tokens = numel(node.output_shape) // e
    bias = bool(a["bias"])
    scores = float(tokens * tokens * e)
    macs = 4 * tokens * e * e + 2 * scores
    softmax = 5.0 * h * tokens * tokens
    params = 4 * e * e + (4 * e if bias else 0)
    rd, wr = _io_bytes(in_shapes, node.output_shape)
    kept = (4 * tokens * e + h * tokens) * BYTES_PER_ELEMENT
    return OpCost(macs=macs, flops_fwd=2 * macs + softmax,
                  flops_bwd=4 * macs - (6.0 * tokens * e * e if first else 0.0) + 2 * scores + 2 * softmax,
                  bytes_read=rd + params * BYTES_PER_ELEMENT, bytes_written=wr, params=params,
                  param_tensors=4 if bias else 2, saved=[0], extra_saved_bytes=float(kept), kernels_fwd=7,
                  kernels_bwd=12, kind="linear")


def window_geometry(node: Node) -> tuple[int, int, int, int, bool]:
    """A window attention's ``(tokens T, window tokens N, width E, heads H, shifted)``, ``T`` the padded map's
    positions (schema: ``window_attention``)."""
    height, width, e = node.output_shape
    ph, pw, (wh, ww), shift = windows_of(height, width, node.attrs["window_size"], node.attrs["shift_size"])
    return ph * pw, wh * ww, int(e), int(node.attrs["num_heads"]), sum(shift) > 0


def _window_attention(node: Node, in_shapes: list[list[int]], first: bool) -> OpCost:
    """Self-attention within windows (a Swin block's), as torchvision writes it (no fused kernel): over the padded
    map's ``T`` positions in windows of ``N``, the projections (``4 T E^2`` MACs), the scores and their weighted sum
    (``T N E`` each), a softmax of ``5 H T N`` FLOPs; backward two passes of every product. Kept for backward: the
    windows (the input projection's input), the scaled queries, the keys and the values (copies the batched products
    make of them), the softmax's output and the output projection's input: ``5 T E + H T N`` elements (the node's
    own input is not kept: it is padded, rolled and cut into windows first; checked against autograd).

    Swin V2's ``cosine`` attention normalises the queries and keys (``4 T E`` FLOPs) and scales the scores (``H T N``)
    instead of scaling the queries, and keeps ``8 T E + 2 H T N + 4 H T`` elements: the windows, the projection's
    output (the norms' input), the normalised queries and keys, a copy of the values, the output projection's input,
    the scores before their scale, the softmax's output, and each query's and key's norm before and after its floor
    (checked against autograd). Its ``position_bias_mlp`` runs once a step whatever the batch (``P = (2 wh - 1)(2 ww -
    1)`` positions through the MLP; the kernels as torch.profiler listed them on torch 2.14: 10 and 5 more forward,
    about 24 and 8 more backward, many of them on a few elements each). Kept once a batch (``batch_saved``): the MLP's
    hidden layer after its ReLU (``P`` x its width), the bias's sigmoid (``H N^2``), and a cosine attention's scale
    per head (the exp of the clamped ``logit_scale``, ``H``): swin_v2_t's 7.8 MB, equal to autograd's at 64x64 and
    72x88 (torch 2.14)."""
    tokens, n, e, h, shifted = window_geometry(node)
    bias, cosine = bool(node.attrs["bias"]), bool(node.attrs.get("cosine"))
    mlp = int(node.attrs.get("position_bias_mlp", 0))
    scores = float(tokens * n * e)
    macs = 4.0 * tokens * e * e + 2 * scores
    softmax = 5.0 * h * tokens * n
    cosine_flops = 4.0 * tokens * e + h * tokens * n if cosine else 0.0
    params = window_attention_params(node.attrs)
    rd, wr = _io_bytes(in_shapes, node.output_shape)
    kept = 8 * tokens * e + 2 * h * tokens * n + 4 * h * tokens if cosine else 5 * tokens * e + h * tokens * n
    once = _window_bias_kept(node) + ((h,) if cosine else ())
    tensors = (5 if bias else 3) + (1 if cosine else 0) + (3 - 1 if mlp else 0)  # the MLP's three, not a table
    return OpCost(macs=macs, flops_fwd=2 * macs + softmax + cosine_flops,
                  flops_bwd=4 * macs + 2 * softmax + 2 * cosine_flops,
                  bytes_read=rd + params * BYTES_PER_ELEMENT, bytes_written=wr, params=params,
                  param_tensors=tensors, extra_saved_bytes=float(kept * BYTES_PER_ELEMENT),
                  batch_saved=tuple(float(k * BYTES_PER_ELEMENT) for k in once),
                  kernels_fwd=14 + (16 if shifted else 0) + (10 if cosine else 0) + (5 if mlp else 0),
                  kernels_bwd=16 + (2 if shifted else 0) + (24 if cosine else 0) + (8 if mlp else 0), kind="linear")


def _window_bias_kept(node: Node) -> tuple[int, ...]:
    """The elements of each tensor a window attention's ``position_bias_mlp`` keeps for backward once a batch: its
    hidden layer over the ``(2 wh - 1)(2 ww - 1)`` relative positions of the configured window, and the sigmoid of
    the bias per head and pair of a window's tokens; none for a table of biases."""
    mlp = int(node.attrs.get("position_bias_mlp", 0))
    if not mlp:
        return ()
    _, n, _, h, _ = window_geometry(node)
    wh, ww = window_pair(node.attrs["window_size"])
    return (2 * wh - 1) * (2 * ww - 1) * mlp, h * n * n


def _group_attention(node: Node, in_shapes: list[list[int]], first: bool) -> OpCost:
    """Self-attention within each group of ``N`` tokens (MaxViT's block and grid attention), over ``T`` tokens in
    all: the projections (``4 T E^2`` MACs), the scores and their weighted sum (``T N E`` each, as einsums), the keys
    scaled (``T E`` FLOPs), the relative position bias added and a softmax (``6 H T N``); backward two passes of every
    product, but the packed projection's input gradient (``3 T E^2``) for the network input (``first``). Kept for
    backward, as autograd keeps them (checked): the input (the projection's), copies of the
    queries, the scaled keys and the values that the batched products make, the softmax's output and the output
    projection's input: ``5 T E + H T N`` elements (with one head the queries and keys are views of the projection's
    output, whose whole storage is kept: ``6 T E``)."""
    groups, n, e = node.output_shape
    tokens, h = groups * n, int(node.attrs["num_heads"])
    scores = float(tokens * n * e)
    macs = 4.0 * tokens * e * e + 2 * scores
    softmax = 6.0 * h * tokens * n
    params = window_attention_params(node.attrs)
    rd, wr = _io_bytes(in_shapes, node.output_shape)
    kept = (4 if h > 1 else 5) * tokens * e + h * tokens * n
    return OpCost(macs=macs, flops_fwd=2 * macs + softmax + tokens * e,
                  flops_bwd=4 * macs - (6.0 * tokens * e * e if first else 0.0) + 2 * softmax + tokens * e,
                  bytes_read=rd + params * BYTES_PER_ELEMENT, bytes_written=wr, params=params,
                  param_tensors=5 if node.attrs["bias"] else 3, saved=[0],
                  extra_saved_bytes=float(kept * BYTES_PER_ELEMENT), kernels_fwd=14, kernels_bwd=25, kind="linear")


def _patch_merge(node: Node, in_shapes: list[list[int]], first: bool) -> OpCost:
    """Each 2x2 patch's pixels side by side: the map padded to even sides (a copy) and its four strided slices
    concatenated (a copy); backward, each slice's gradient written into a zeroed tensor of the input's size and the
    four summed. Nothing kept."""
    rd, wr = _io_bytes(in_shapes, node.output_shape)
    return OpCost(bytes_read=rd + wr, bytes_written=2 * wr, kernels_fwd=2, kernels_bwd=11, kind="other")


def _interpolate(node: Node, in_shapes: list[list[int]], first: bool) -> OpCost:
    """A resize: bilinear reads four input pixels per output element and blends them (8 FLOPs), nearest copies one;
    backward, the input's gradient zeroed, then each output gradient weighted and added into the pixels it came from
    (four for bilinear: 8 FLOPs; nearest: 1). Nothing kept (the backward needs the sizes alone)."""
    n = numel(node.output_shape)
    bilinear = node.attrs.get("mode") == "bilinear"
    rd, wr = _io_bytes(in_shapes, node.output_shape)
    return OpCost(flops_fwd=8.0 * n if bilinear else 0.0, flops_bwd=(8.0 if bilinear else 1.0) * n, bytes_read=rd,
                  bytes_written=wr, kernels_fwd=1, kernels_bwd=2, kind="other")


def position_loss(output_shape: list[int]) -> OpCost | None:
    """The training step's loss where the network scores each position (``[classes, H, W]``: a segmentation
    network's pixels): cross entropy as log-softmax over the classes (about 4 FLOPs an element; its result kept for
    backward) and the negative log-likelihood of each position's label; backward, the likelihood's gradient (zeroed,
    one element per position set) and the log-softmax's. None for a classifier's scores (``[classes]``), whose loss
    the features leave out (a thousand elements a sample: nothing beside a network's activations)."""
    if len(output_shape) < 2:
        return None
    n = numel(output_shape)
    nbytes = n * BYTES_PER_ELEMENT
    return OpCost(flops_fwd=4.0 * n, flops_bwd=3.0 * n, bytes_read=nbytes, bytes_written=nbytes, saved=[OUTPUT],
                  kernels_fwd=2, kernels_bwd=2, kind="elementwise")


#: The kernels of an MSE and an L1 loss (mean reduction) over an output of E elements, as torch runs them: each as
#: (FLOPs per element, elements it reads and writes per element), forward then backward. MSE: the squared
#: differences (read the output and the target, write one float each), their mean; backward, one kernel
#: (2 (x - t) g / E: read both, write the gradient). L1: ``sub``, ``abs``, ``mean``; backward, the mean's gradient
#: (``div`` of the seed expanded), the ``sgn`` of the kept difference, its ``mul`` by the gradient.
REGRESSION_LOSS_KERNELS: dict[str, tuple[tuple[tuple[float, float], ...], tuple[tuple[float, float], ...]]] = {
    "mse": (((2.0, 3.0), (1.0, 1.0)), ((3.0, 3.0),)),
    "l1": (((1.0, 3.0), (1.0, 2.0), (1.0, 1.0)), ((1.0, 1.0), (1.0, 2.0), (1.0, 3.0))),
}


def output_loss(output_shape: list[int], loss: str = "cross_entropy") -> OpCost | None:
    """The training step's ``loss`` (``profiling.plan.LOSSES``) over an output of ``output_shape`` (per sample): a
    cross entropy as :func:`position_loss` counts it (None for a classifier's scores), or an MSE or L1 loss against a
    float target of the output's shape, whatever that shape (a classifier's too): the passes of
    :data:`REGRESSION_LOSS_KERNELS`, no log-softmax kept (an L1 loss keeps the difference of the output and the
    target: ``saved`` [OUTPUT], its ``sub``'s result; an MSE keeps the output and the target themselves, which the
    aggregator counts as they are)."""
    if loss == "cross_entropy":
        return position_loss(output_shape)
    forward, backward = REGRESSION_LOSS_KERNELS[loss]
    nbytes = numel(output_shape) * BYTES_PER_ELEMENT
    elems = float(numel(output_shape))
    written = 1 if loss == "mse" else 2  # the squared differences; the difference and its magnitude
    return OpCost(flops_fwd=sum(f for f, _ in forward) * elems, flops_bwd=sum(f for f, _ in backward) * elems,
                  bytes_read=(sum(m for _, m in forward) - written) * nbytes, bytes_written=written * nbytes,
                  saved=[OUTPUT] if loss == "l1" else [], kernels_fwd=len(forward), kernels_bwd=len(backward),
                  kind="elementwise")


def _pointwise(flops: float, saves: list[int], bwd_flops: float = 1.0, bwd_kernels: int = 1) -> Handler:
    """Element-wise activation with ``flops`` FLOPs per output element; ``saves`` for backward, which runs
    ``bwd_kernels`` kernels."""
    def handler(node: Node, in_shapes: list[list[int]], first: bool) -> OpCost:
        n = numel(node.output_shape)
        rd, wr = _io_bytes(in_shapes, node.output_shape)
        return OpCost(flops_fwd=flops * n, flops_bwd=bwd_flops * n, bytes_read=rd, bytes_written=wr,
                      saved=list(saves), kernels_fwd=1, kernels_bwd=bwd_kernels, kind="elementwise")
    return handler


def _keeps_result_in_place(flops: float, bwd_flops: float) -> Handler:
    """:func:`_pointwise` of an activation whose backward keeps its input, or its result where it runs in place, on
    its input or on a copy of it (``on_copy``: the copy, which the input is not: one tensor of the input's size more
    where something else keeps the input, as autograd counts it)."""
    out_of_place, in_place = _pointwise(flops, [0], bwd_flops), _pointwise(flops, [OUTPUT], bwd_flops)
    return lambda node, in_shapes, first: (in_place if node.attrs.get("inplace") or node.attrs.get("on_copy")
                                           else out_of_place)(node, in_shapes, first)


def copied_first(cost: OpCost, in_shape: list[int]) -> OpCost:
    """``cost`` with one copy of its input made first counted (aten.clone: the input's elements read and written, 4
    bytes each, no FLOPs; its backward hands the gradient on, no kernel): an activation in place on a copy
    (``on_copy``: ``y.clone().leaky_relu_()``), an in-place activation's clone, a linear layer's rows
    (``walk.Visit.input_copies``)."""
    moved = float(numel(in_shape) * BYTES_PER_ELEMENT)
    return changed(cost, kernels_fwd=cost.kernels_fwd + 1, bytes_read=cost.bytes_read + moved,
                   bytes_written=cost.bytes_written + moved)


def _keeps_a_clone_in_place(flops: float, bwd_flops: float) -> Handler:
    """:func:`_pointwise` of an activation that keeps its input, in place a clone of it (mish, threshold); on a copy
    of its input (``on_copy``) that clone is a tensor of its own, neither the input nor the result: its bytes (4 an
    element) are ``extra_saved_bytes`` (as autograd counts it on torch 2.x)."""
    def handler(node: Node, in_shapes: list[list[int]], first: bool) -> OpCost:
        cost = _pointwise(flops, [0], bwd_flops)(node, in_shapes, first)
        if node.attrs.get("on_copy"):
            return changed(cost, saved=[], extra_saved_bytes=float(numel(in_shapes[0]) * BYTES_PER_ELEMENT))
        return cost
    return handler


def _rrelu(node: Node, in_shapes: list[list[int]], first: bool) -> OpCost:
    """RReLU in training as torch runs it (aten.rrelu_with_noise, one kernel): each element's slope drawn from
    [lower, upper] (a draw, a scale and a shift) and written into a noise tensor of the input's size, then a compare
    and a multiply: 5 FLOPs an element; backward the gradient times the noise (1 FLOP, one kernel). It keeps the
    noise (its bytes: ``extra_saved_bytes``), and its input, or its result where it runs in place on its input or on
    a copy of it (``on_copy``): exactly what a sample adds to autograd's saved tensors (measured on torch 2.14)."""
    n = numel(node.output_shape)
    rd, wr = _io_bytes(in_shapes, node.output_shape)
    return OpCost(flops_fwd=5.0 * n, flops_bwd=float(n), bytes_read=rd, bytes_written=wr + n * BYTES_PER_ELEMENT,
                  saved=[OUTPUT] if node.attrs.get("inplace") or node.attrs.get("on_copy") else [0],
                  extra_saved_bytes=float(n * BYTES_PER_ELEMENT),
                  kernels_fwd=1, kernels_bwd=1, kind="elementwise")


def _power(node: Node, in_shapes: list[list[int]], first: bool) -> OpCost:
    """x ** p. sqrt (p 0.5): 1 FLOP an element, backward grad / (2 * result): 2 in 2 kernels, it keeps its result;
    rsqrt (p -0.5): 1, backward -0.5 * grad * result ** 3: 4 in 3 kernels, it keeps its result; any other power
    (exp(p log x): 3; a square: 1), backward grad * p * x ** (p - 1): 3 + 2 in 3 kernels, it keeps its
    input; reciprocal (p -1): 1, backward -grad * result ** 2: 3 in 3 kernels, it keeps its result."""
    exponent = float(node.attrs["exponent"])
    if exponent in (0.5, -0.5, -1.0):
        flops, saves = 1.0, [OUTPUT]
        bwd_flops, bwd_kernels = {0.5: (2.0, 2), -0.5: (4.0, 3), -1.0: (3.0, 3)}[exponent]
    else:
        flops = 1.0 if exponent == 2.0 else 3.0
        saves, bwd_flops, bwd_kernels = [0], flops + 2.0, 3
    return _pointwise(flops, saves, bwd_flops, bwd_kernels)(node, in_shapes, first)


def _quotient(node: Node, in_shapes: list[list[int]], first: bool) -> OpCost:
    """x / y: 1 FLOP an output element; it keeps both inputs. Backward (torch's): x's gradient grad / y (1), y's
    -grad * (x / y) / y (4: two divides, a negate, a multiply), in 5 kernels (both inputs needing a gradient:
    :func:`_quotient_gradients` for one of them alone)."""
    n = numel(node.output_shape)
    rd, wr = _io_bytes(in_shapes, node.output_shape)
    return OpCost(flops_fwd=float(n), flops_bwd=5.0 * n, bytes_read=rd, bytes_written=wr, saved=[0, 1], kernels_fwd=1,
                  kernels_bwd=5, kind="elementwise")


def _quotient_gradients(cost: OpCost, node: Node, needs: list[bool], _: list[list[int]]) -> OpCost:
    """x / y's ``cost`` where ``needs`` says which of x and y need a gradient: torch computes only theirs. y's alone:
    its 4 kernels and FLOPs an element, both inputs kept; x's alone: grad / y (1 kernel, 1 FLOP an element), y alone
    kept (x's value is read by y's gradient only)."""
    n = numel(node.output_shape)
    if needs == [False, True]:
        return changed(cost, flops_bwd=4.0 * n, kernels_bwd=4)
    if needs == [True, False]:
        return changed(cost, flops_bwd=float(n), kernels_bwd=1, saved=[1])
    return cost


def _extreme(node: Node, in_shapes: list[list[int]], first: bool) -> OpCost:
    """maximum / minimum of two tensors: 1 FLOP (a compare) an output element, one kernel; it keeps both inputs.
    Backward (torch 2's, measured with a dispatch log), for each input: a compare of the two (gt or lt), the
    gradient halved (for ties), an equality compare, a where and a masked_fill: 5 kernels and 5 FLOPs an element
    each, the second input's first (a broadcast input's gradient summed down is not counted)."""
    n = numel(node.output_shape)
    rd, wr = _io_bytes(in_shapes, node.output_shape)
    return OpCost(flops_fwd=float(n), flops_bwd=10.0 * n, bytes_read=rd, bytes_written=wr, saved=[0, 1],
                  kernels_fwd=1, kernels_bwd=10, kind="elementwise")


def _extreme_gradients(cost: OpCost, node: Node, needs: list[bool], _: list[list[int]]) -> OpCost:
    """maximum / minimum's ``cost`` where ``needs`` says which input needs a gradient: torch computes only its (5
    kernels, 5 FLOPs an element), both inputs kept (its compare reads both)."""
    if sum(needs) == 1:
        return changed(cost, flops_bwd=cost.flops_bwd / 2, kernels_bwd=5)
    return cost


def _binary(saves_inputs: bool) -> Handler:
    """add / mul: 1 FLOP per output element; mul keeps both tensor inputs for backward (where both need a gradient:
    :func:`_product_gradients` for one alone)."""
    def handler(node: Node, in_shapes: list[list[int]], first: bool) -> OpCost:
        n = numel(node.output_shape)
        rd, wr = _io_bytes(in_shapes, node.output_shape)
        tensors = len(in_shapes)
        saved = list(range(tensors)) if saves_inputs and tensors > 1 else []
        # backward of add only routes the gradient; of mul it multiplies once per input
        return OpCost(flops_fwd=float(n), flops_bwd=float(n * tensors) if saves_inputs else 0.0,
                      bytes_read=rd, bytes_written=wr, saved=saved, kernels_fwd=1,
                      kernels_bwd=tensors if saves_inputs else 0, kind="elementwise")
    return handler


def _product_gradients(cost: OpCost, node: Node, needs: list[bool], _: list[list[int]]) -> OpCost:
    """A product of two tensors' ``cost`` where ``needs`` says which of them needs a gradient: torch computes its
    alone (the incoming gradient times the other input: one kernel, a FLOP an output element) and keeps the other
    input alone (each input is kept for the other's gradient); a scalar's product keeps nothing as it was."""
    if len(needs) != 2 or needs[0] == needs[1]:
        return cost
    return changed(cost, flops_bwd=float(numel(node.output_shape)), kernels_bwd=1, saved=[1] if needs[0] else [0])


def _pool_out(node: Node, in_shapes: list[list[int]], window: int, saves_input: bool,
              index_bytes: float) -> OpCost:
    n = numel(node.output_shape)
    rd, wr = _io_bytes(in_shapes, node.output_shape)
    return OpCost(flops_fwd=float(n * window), flops_bwd=float(max(n * window, numel(in_shapes[0]))),
                  bytes_read=rd, bytes_written=wr, saved=[0] if saves_input else [],
                  extra_saved_bytes=index_bytes, kernels_fwd=1, kernels_bwd=1, kind="pool")


def _maxpool2d(node: Node, in_shapes: list[list[int]], first: bool) -> OpCost:
    kh, kw = node.attrs["kernel_size"]
    return _pool_out(node, in_shapes, kh * kw, True, 8.0 * numel(node.output_shape))


def _fractional_maxpool2d(node: Node, in_shapes: list[list[int]], first: bool) -> OpCost:
    """A fractional max pool: a max pool's compares (kernel_size elements an output element), its input and int64
    indices kept; forward two kernels, the draw of a uniform sample pair per channel (written: 2 floats a channel)
    and the pool; backward one, the gradient scattered to the maxima."""
    kh, kw = node.attrs["kernel_size"]
    cost = _pool_out(node, in_shapes, kh * kw, True, 8.0 * numel(node.output_shape))
    return changed(cost, bytes_written=cost.bytes_written + 2 * in_shapes[0][0] * BYTES_PER_ELEMENT, kernels_fwd=2)


def _avgpool2d(node: Node, in_shapes: list[list[int]], first: bool) -> OpCost:
    """Average pooling keeps its input for backward (autograd's ``avg_pool2d_backward`` reads it)."""
    kh, kw = node.attrs["kernel_size"]
    return _pool_out(node, in_shapes, kh * kw, True, 0.0)


def _adaptive_span(size: int, out: int) -> int:
    """The input elements along one side that an adaptive pool of ``size`` to ``out`` reads, over all its windows
    (torch's: window ``i`` from floor(i size / out) to ceil((i + 1) size / out); they overlap where ``out`` does not
    divide ``size``)."""
    return sum(-(-(i + 1) * size // out) - i * size // out for i in range(out))


def _adaptive(max_pool: bool) -> Handler:
    """Adaptive pooling: a FLOP an element of each window, windows as torch places them (overlapping where the output
    size does not divide the input's); the average keeps its input for backward unless it pools to 1x1 (torch runs
    that as a mean, which keeps nothing)."""
    def handler(node: Node, in_shapes: list[list[int]], first: bool) -> OpCost:
        inn, x, out = numel(in_shapes[0]), in_shapes[0], node.output_shape
        if len(x) == 3 and len(out) == 3:  # a [C, H, W] map: each window's elements, summed over the windows
            reads = x[0] * _adaptive_span(x[1], out[1]) * _adaptive_span(x[2], out[2])
        else:
            reads = numel(out) * max(1, inn // max(1, numel(out)))
        keeps_input = max_pool or numel(node.output_shape[1:]) > 1
        cost = _pool_out(node, in_shapes, 1, keeps_input, 8.0 * numel(node.output_shape) if max_pool else 0.0)
        return changed(cost, flops_fwd=float(reads), flops_bwd=float(max(reads, inn)))
    return handler


def _mean(node: Node, in_shapes: list[list[int]], first: bool) -> OpCost:
    inn = numel(in_shapes[0])
    rd, wr = _io_bytes(in_shapes, node.output_shape)
    return OpCost(flops_fwd=float(inn), flops_bwd=float(inn), bytes_read=rd, bytes_written=wr,
                  kernels_fwd=1, kernels_bwd=1, kind="pool")


def _variance(node: Node, in_shapes: list[list[int]], first: bool) -> OpCost:
    """A variance over dims: 3 FLOPs an input element (a deviation, its square, the sum), one kernel; it keeps its
    input. Backward (torch's 2 / (n - correction) * grad * (x - mean)): the mean (1), the deviation (1), the scaled
    gradient and its product with the deviation (1): 3 an input element in 4 kernels."""
    inn = numel(in_shapes[0])
    rd, wr = _io_bytes(in_shapes, node.output_shape)
    return OpCost(flops_fwd=3.0 * inn, flops_bwd=3.0 * inn, bytes_read=rd, bytes_written=wr, saved=[0],
                  kernels_fwd=1, kernels_bwd=4, kind="pool")


def _cat(node: Node, in_shapes: list[list[int]], first: bool) -> OpCost:
    """Concatenation copies every input once; its backward is slicing (views, no kernel)."""
    rd, wr = _io_bytes(in_shapes, node.output_shape)
    return OpCost(bytes_read=rd, bytes_written=wr, kernels_fwd=1, kind="other")


def _view(node: Node, in_shapes: list[list[int]], first: bool) -> OpCost:
    """Reshape-like ops are views: no FLOPs, no bytes moved, no kernel."""
    return OpCost(kind="view")


def _slice(node: Node, in_shapes: list[list[int]], first: bool) -> OpCost:
    """A select or a narrow: a view forward; backward torch's ``select_backward`` or ``slice_backward`` on any
    device (derivatives.yaml), zeros of the input's shape (one kernel) and the gradient copied into its slice (one
    more), 2 kernels, no FLOPs (``latency_terms._slice_backward``'s rows). A piece of a split (``split_sizes``) or an
    unbind (``unbind``) hands its gradient to the call's one cat or stack (``walk.split_gathers``): none of its own."""
    return OpCost(kind="view", kernels_bwd=0 if split_group(node) or unbind_group(node) else 2)


def _dropout(node: Node, in_shapes: list[list[int]], first: bool) -> OpCost:
    """Dropout in training: a mask drawn and applied, kept for backward (one byte an element, as CUDA's fused
    kernel keeps it; a CPU keeps four: step_runtime.StepRuntime.applied); of ``p`` 0, a view of its input
    (:func:`hands_input_back`)."""
    if hands_input_back(node):
        return _view(node, in_shapes, first)
    n = numel(node.output_shape)
    rd, wr = _io_bytes(in_shapes, node.output_shape)
    return OpCost(flops_fwd=2.0 * n, flops_bwd=float(n), bytes_read=rd, bytes_written=wr,
                  extra_saved_bytes=float(n), kernels_fwd=2, kernels_bwd=1, kind="elementwise")


def _alpha_dropout(node: Node, in_shapes: list[list[int]], first: bool) -> OpCost:
    """Alpha dropout in training as torch runs it on any device (no kernel of its own; measured on torch 2.14): a
    noise (an element's size, or a float per sample and channel: feature) drawn, a shift made of it and both scaled
    (five kernels of the noise's size, a FLOP an element each), then the input times the noise and the shift added in
    place (two kernels, a FLOP an element each). It keeps the noise (``extra_saved_bytes``), by which its one backward
    kernel multiplies the gradient. Of ``p`` 0, a view of its input (:func:`hands_input_back`)."""
    if hands_input_back(node):
        return _view(node, in_shapes, first)
    n = numel(node.output_shape)
    noise = int(node.output_shape[0]) if node.attrs.get("feature") else n
    rd, wr = _io_bytes(in_shapes, node.output_shape)
    return OpCost(flops_fwd=float(2 * n + 5 * noise), flops_bwd=float(n),
                  bytes_read=rd + (6 * noise + n) * BYTES_PER_ELEMENT,
                  bytes_written=2 * wr + 5 * noise * BYTES_PER_ELEMENT,
                  extra_saved_bytes=float(noise * BYTES_PER_ELEMENT), kernels_fwd=7, kernels_bwd=1,
                  kind="elementwise")


def hands_input_back(node: Node) -> bool:
    """Whether ``node`` is a dropout (plain or of channels) of ``p`` 0, which torch runs by handing its input back
    (ViT's are such)."""
    return node.op in ("dropout", "dropout2d", "alpha_dropout") and float(node.attrs.get("p", 0.5)) == 0.0


def _dropout2d(node: Node, in_shapes: list[list[int]], first: bool) -> OpCost:
    """Dropout of whole channels in training, as torch runs it on any device (no fused kernel): a noise of one float
    per sample and channel drawn (bernoulli) and scaled by 1 / (1 - p) in place (two kernels, 2 FLOPs a channel),
    then the input multiplied by it (one kernel, 1 FLOP an element); the noise is kept for backward (C floats a
    sample, ``extra_saved_bytes``), whose one kernel multiplies the incoming gradient by it. Of ``p`` 0, a view of
    its input (:func:`hands_input_back`)."""
    if hands_input_back(node):
        return _view(node, in_shapes, first)
    n, channels = numel(node.output_shape), int(node.output_shape[0])
    rd, wr = _io_bytes(in_shapes, node.output_shape)
    noise = channels * BYTES_PER_ELEMENT
    return OpCost(flops_fwd=float(n + 2 * channels), flops_bwd=float(n), bytes_read=rd + noise,
                  bytes_written=wr + noise, extra_saved_bytes=float(noise), kernels_fwd=3, kernels_bwd=1,
                  kind="elementwise")


def _prelu(node: Node, in_shapes: list[list[int]], first: bool) -> OpCost:
    """PReLU: x where x > 0, else a learnt slope times x (a compare and a multiply an element; its slopes read).
    It keeps its input (and its slopes, a parameter). Backward, one kernel writes two input-sized tensors, the
    input's gradient and the slope's gradient per element (2 FLOPs an element each; torch computes both even where
    the input needs no gradient), then the latter is summed down to the slopes (1 FLOP an element, a second
    kernel)."""
    n, slopes = numel(node.output_shape), int(node.attrs["num_parameters"])
    rd, wr = _io_bytes(in_shapes, node.output_shape)
    return OpCost(flops_fwd=2.0 * n, flops_bwd=5.0 * n, bytes_read=rd + slopes * BYTES_PER_ELEMENT,
                  bytes_written=wr, params=slopes, param_tensors=1, saved=[0], kernels_fwd=1, kernels_bwd=2,
                  kind="elementwise")


def _groupnorm(node: Node, in_shapes: list[list[int]], first: bool) -> OpCost:
    """Group norm: per element, like batch norm, ~5 FLOPs forward (a sum for the mean, a square and sum for the
    variance, the normalise, the scale and the shift) and ~8 backward; it reads the input twice (the statistics, then
    the normalise) and, unless ``affine`` is false, its weight and bias. It keeps its input and a mean and a 1/std per
    sample and group; its backward is one kernel that computes the input's, weight's and bias's gradients."""
    a = node.attrs
    params = 2 * int(a["num_channels"]) if a.get("affine", True) else 0
    n = numel(node.output_shape)
    rd, wr = _io_bytes(in_shapes, node.output_shape)
    return OpCost(flops_fwd=5.0 * n, flops_bwd=8.0 * n, bytes_read=rd * 2 + params * BYTES_PER_ELEMENT,
                  bytes_written=wr, params=params, param_tensors=2 if params else 0, saved=[0],
                  extra_saved_bytes=2.0 * int(a["num_groups"]) * BYTES_PER_ELEMENT, kernels_fwd=1, kernels_bwd=1,
                  kind="norm")


def _instancenorm(node: Node, in_shapes: list[list[int]], first: bool) -> OpCost:
    """Instance norm: a group norm of a group per channel (FLOPs a batch norm's, ~5 an element forward, ~8 backward;
    the input read twice). torch runs it as a batch norm of the [1, N x C, H, W] input: it keeps the input and a
    mean and a 1/std per sample and channel and, where ``affine``, its weight repeated once per sample (C floats a
    sample, bytes in ``extra_saved_bytes``); the repeats (weight and bias) are a kernel each forward, and backward
    the weight's and bias's gradients are summed down from per sample and channel to per channel (two more).
    Tracking running statistics (``track_running_stats``), it repeats its running mean and variance once per sample
    too (two kernels), which the norm updates by momentum (3 FLOPs a value) and keeps (C floats a sample each: what
    autograd keeps more, measured on torch 2.14), then copies their mean over the batch back (a mean, 1 FLOP a
    value, and a copy each: four kernels)."""
    a = node.attrs
    c, affine = int(a["num_features"]), bool(a.get("affine", False))
    tracks = bool(a.get("track_running_stats", False))
    params = 2 * c if affine else 0
    n = numel(node.output_shape)
    rd, wr = _io_bytes(in_shapes, node.output_shape)
    kept = (2 + affine + 2 * tracks) * c  # the mean, the 1/std (the repeated weight, running statistics), a sample
    return OpCost(flops_fwd=5.0 * n + 8.0 * c * tracks, flops_bwd=8.0 * n,
                  bytes_read=rd * 2 + (params + 2 * c * tracks) * BYTES_PER_ELEMENT,
                  bytes_written=wr, params=params, param_tensors=2 if params else 0, saved=[0],
                  extra_saved_bytes=kept * BYTES_PER_ELEMENT, kernels_fwd=(3 if affine else 1) + 6 * tracks,
                  kernels_bwd=3 if affine else 1, kind="norm")


def _pad(node: Node, in_shapes: list[list[int]], first: bool) -> OpCost:
    """A pad: one kernel that copies the input into its output's middle and writes the border around it (the value,
    or pixels reflected or replicated): no FLOPs; bytes: the input read, the output written. Backward, the input's
    gradient: a constant pad's is the incoming one's middle copied out (one kernel, no FLOPs); a reflection's or a
    replication's is zeroed, then each output pixel's gradient added onto the input pixel it came from (two
    kernels; an add, 1 FLOP, per border element). A constant pad keeps nothing; a reflection or replication keeps
    its input (autograd saves it, measured on torch 2.14, though its backward reads only its shape)."""
    if node.attrs["mode"] == "circular":
        return _circular_pad(node, in_shapes)
    rd, wr = _io_bytes(in_shapes, node.output_shape)
    border = node.attrs["mode"] != "constant"
    return OpCost(flops_bwd=float(numel(node.output_shape) - numel(in_shapes[0])) if border else 0.0,
                  bytes_read=rd, bytes_written=wr, saved=[0] if border else [], kernels_fwd=1,
                  kernels_bwd=2 if border else 1, kind="other")


def _circular_pad(node: Node, in_shapes: list[list[int]]) -> OpCost:
    """A circular pad as torch 2 runs it (``_pad_circular``, no kernel of its own, on any device: measured on torch
    2.14): an empty output, the input copied into its middle, then each side of ``k`` non-zero pads copied from the
    output's far side (left and right columns the output's full height, then top and bottom rows its full width, the
    corners written twice): ``1 + k`` kernels, no FLOPs; bytes: the input and the border strips read, the same
    written. It keeps nothing. Backward, autograd's in-place-copy nodes, in reverse: per side, the incoming gradient
    cloned (output-sized), the strip's gradient cloned out and zeroed in it, the strip's gradient written into zeros
    of the output's size and added to the clone (an add, 1 FLOP, per output element): 7 kernels; then the middle's:
    the gradient cloned, its middle cloned out, two slice backwards of the input's size (zeros, then a copy): 6."""
    left, right, top, bottom = (int(p) for p in node.attrs["pads"])
    channels, height, width = node.output_shape
    sides = sum(p > 0 for p in (left, right, top, bottom))
    strips = channels * (height * (left + right) + width * (top + bottom)) * BYTES_PER_ELEMENT
    copied = numel(in_shapes[0]) * BYTES_PER_ELEMENT + strips
    return OpCost(flops_bwd=float(sides * numel(node.output_shape)), bytes_read=copied, bytes_written=copied,
                  kernels_fwd=1 + sides, kernels_bwd=7 * sides + 6, kind="other")


def _local_response_norm(node: Node, in_shapes: list[list[int]], first: bool) -> OpCost:
    """A local response norm as torch 2.14 runs it (F.local_response_norm, no kernel of its own): the input squared,
    padded by ``size`` - 1 zero channels and averaged over ``size`` channels (avg_pool3d), times alpha, plus k, to the
    power beta, the input divided by that: 7 kernels; FLOPs an element: 1 square, ``size`` for the mean, 4 for the
    rest. It keeps its input, the padded squares (the pool's input) and the base and the result of the power (the
    divide's divisor): ``extra_saved_bytes``. Backward, 15 kernels (the divide's two gradients, the power's, the
    pool's, the pad's, the square's and their sums): about ``size`` + 13 FLOPs an element (measured op by op)."""
    n, size = numel(node.output_shape), int(node.attrs["size"])
    padded = (node.output_shape[0] + size - 1) * numel(node.output_shape[1:])
    return OpCost(flops_fwd=float(n * (size + 5)), flops_bwd=float(n * (size + 13)),
                  bytes_read=(7 * n + padded) * BYTES_PER_ELEMENT, bytes_written=(6 * n + padded) * BYTES_PER_ELEMENT,
                  saved=[0], extra_saved_bytes=float((padded + 2 * n) * BYTES_PER_ELEMENT), kernels_fwd=7,
                  kernels_bwd=15, kind="norm")


def _pixel_shuffle(node: Node, in_shapes: list[list[int]], first: bool) -> OpCost:
    """A pixel shuffle or unshuffle: a permuted copy (one kernel, no FLOPs; bytes: the input read, the output
    written); backward, the inverse permuted copy of the incoming gradient (one kernel). It keeps nothing."""
    rd, wr = _io_bytes(in_shapes, node.output_shape)
    return OpCost(bytes_read=rd, bytes_written=wr, kernels_fwd=1, kernels_bwd=1, kind="other")


def _repeat(node: Node, in_shapes: list[list[int]], first: bool) -> OpCost:
    """A tiling (torch's aten.repeat): one kernel copying the input into each tile, no FLOPs; bytes: the input read
    (once per tile), the output written. It keeps nothing. Backward, the incoming gradient summed over the tiles
    (aten.sum.dim_IntList: an add per output element but one per input element, one kernel; bytes: the output's
    gradient read, the input's written), or handed on where every count is 1 (no kernel)."""
    n_out, n_in = numel(node.output_shape), numel(in_shapes[0])
    tiles = n_out != n_in
    return OpCost(flops_bwd=float(n_out - n_in), bytes_read=n_out * BYTES_PER_ELEMENT,
                  bytes_written=n_out * BYTES_PER_ELEMENT, kernels_fwd=1, kernels_bwd=1 if tiles else 0, kind="other")


def _matrix_product(node: Node, in_shapes: list[list[int]], first: bool) -> OpCost:
    """a @ b of [..., M, K] and [..., K, N] activations (per sample, the leading dims broadcast to the output's B
    matrices): B M N K MACs, 2 B M N K FLOPs forward in one batched GEMM; backward (both inputs needing a gradient:
    :func:`_matrix_product_gradients` for one alone) grad @ b^T and a^T @ grad, 4 B M N K FLOPs in 2 GEMMs. It keeps
    both inputs (torch 2's bmm: each for the other's gradient); an input broadcast along a leading dim is kept as
    torch keeps it, expanded to the output's B matrices and copied (a clone kernel before the bmm: the input read, the
    copy written): a tensor of its own (``extra_saved_bytes``), not the input (which it keeps no longer: measured
    with saved-tensor hooks). The sum of a broadcast input's gradient down to its shape is not counted."""
    (a, _), out = in_shapes, node.output_shape
    macs = float(numel(out) * a[-1])
    rd, wr = _io_bytes(in_shapes, out)
    saved, copies = _kept_inputs(in_shapes, out, [0, 1])
    broadcast = [i for i in (0, 1) if i not in saved]  # copied first: expanded along a leading dim
    copy_read = float(sum(numel(in_shapes[i]) for i in broadcast) * BYTES_PER_ELEMENT)
    copy_written = float(sum(numel(out[:-2]) * numel(in_shapes[i][-2:]) for i in broadcast) * BYTES_PER_ELEMENT)
    return OpCost(macs=macs, flops_fwd=2 * macs, flops_bwd=4 * macs, bytes_read=rd + copy_read,
                  bytes_written=wr + copy_written, saved=saved, extra_saved_bytes=copies,
                  kernels_fwd=1 + len(broadcast), kernels_bwd=2, kind="linear")


def _kept_inputs(in_shapes: list[list[int]], out: list[int], kept: list[int]) -> tuple[list[int], float]:
    """What a matmul keeps of its inputs ``kept``: (those kept as they are, the bytes a sample of the copies kept of
    those broadcast along a leading dim, each expanded to the output's leading dims)."""
    batches = numel(out[:-2])
    broadcast = [i for i in kept if numel(in_shapes[i][:-2]) < batches]
    return ([i for i in kept if i not in broadcast],
            float(sum(batches * numel(in_shapes[i][-2:]) for i in broadcast) * BYTES_PER_ELEMENT))


def _matrix_product_gradients(cost: OpCost, node: Node, needs: list[bool], in_shapes: list[list[int]]) -> OpCost:
    """a @ b's ``cost`` where ``needs`` says which of a and b need a gradient: torch computes only theirs, one GEMM
    of 2 B M N K FLOPs, and keeps only the other input (a's gradient reads b, b's reads a)."""
    if needs[0] == needs[1]:
        return cost
    saved, copies = _kept_inputs(in_shapes, node.output_shape, [1] if needs[0] else [0])
    return changed(cost, flops_bwd=cost.flops_bwd / 2, kernels_bwd=1, saved=saved, extra_saved_bytes=copies)


def _reordered_copy(node: Node, in_shapes: list[list[int]], first: bool) -> OpCost:
    """A flip or a roll (torch's aten.flip, aten.roll): a copy of the input in another order (one kernel, no FLOPs;
    bytes: the input read, the output written); backward, the incoming gradient flipped or rolled back (one
    kernel). It keeps nothing."""
    rd, wr = _io_bytes(in_shapes, node.output_shape)
    return OpCost(bytes_read=rd, bytes_written=wr, kernels_fwd=1, kernels_bwd=1, kind="other")


#: A weighted sum's kernels on its n weights alone (torch 2, a dispatch log), forward and backward, by normalisation:
#: relu(w) / (sum(relu(w)) + eps) a relu, a sum, an add and a division forward; backward two divisions, a negate, a
#: multiply, a division, a sum, an add and the relu's threshold_backward. A softmax's one each way.
_WEIGHTS_KERNELS = {"relu": (4, 8), "softmax": (1, 1)}


def _weighted_sum(node: Node, in_shapes: list[list[int]], first: bool) -> OpCost:
    """EfficientDet's BiFPN fusion of n maps (torch 2's kernels, a dispatch log): its n weights normalised (a few
    kernels on n scalars), then a product per map and a sum of the products, one by one: 2n - 1 FLOPs and kernels of
    the output's size. It keeps every map (each weight's gradient reads its map) and, once a batch, the weights'
    tensors (a relu's: its result, the sum plus eps, the weights divided; a softmax's result). Backward, per map
    the incoming gradient times it, summed down to its weight's gradient, and times its weight, the map's gradient
    (3 FLOPs an element, 3 kernels); a select_backward per weight, adds of their n gradients, and the
    normalisation's backward."""
    count, n = len(in_shapes), numel(node.output_shape)
    forward, backward = _WEIGHTS_KERNELS[node.attrs["normalize"]]
    rd, wr = _io_bytes(in_shapes, node.output_shape)
    kept = (count * BYTES_PER_ELEMENT, BYTES_PER_ELEMENT) if node.attrs["normalize"] == "relu" else ()
    return OpCost(flops_fwd=float((2 * count - 1) * n), flops_bwd=3.0 * count * n,
                  bytes_read=rd + count * BYTES_PER_ELEMENT, bytes_written=wr, params=count, param_tensors=1,
                  saved=list(range(count)), batch_saved=(*kept, count * BYTES_PER_ELEMENT),
                  kernels_fwd=2 * count - 1 + forward, kernels_bwd=3 * count + count + count - 1 + backward,
                  kind="elementwise")


def _l2_normalize(node: Node, in_shapes: list[list[int]], first: bool) -> OpCost:
    """x / max(||x||_2 along dim, eps) (torch's F.normalize, measured with a dispatch log of torch 2.14): forward the
    norm (linalg_vector_norm: a square and an add an element), its clamp (one a row) and the division (one an
    element), 3 kernels. Backward 14 kernels: the division's two gradients (x / y, over y, -grad, their product;
    grad / y: 5 an element), the expand's sum, the clamp's (a scalar's fill, a compare and a where, a row each) and
    the norm's (x / norm, an equality compare a row, a masked fill and the product: 3 an element), the two input
    gradients added (1): 9 FLOPs an element and 4 a row. It keeps its input, the norm and its clamp (a float a row
    each)."""
    n = numel(node.output_shape)
    rows = n // int(node.output_shape[int(node.attrs["dim"]) - 1])
    rd, wr = _io_bytes(in_shapes, node.output_shape)
    return OpCost(flops_fwd=3.0 * n + rows, flops_bwd=9.0 * n + 4.0 * rows, bytes_read=rd, bytes_written=wr,
                  saved=[0], extra_saved_bytes=2.0 * rows * BYTES_PER_ELEMENT, kernels_fwd=3, kernels_bwd=14,
                  kind="norm")


def _unfold(node: Node, in_shapes: list[list[int]], first: bool) -> OpCost:
    """im2col (torch's aten.im2col; a dispatch log of torch 2.14): each window's values copied into its column (one
    kernel, no FLOPs; bytes: the input read, the output written); backward col2im (one kernel) adds each column's
    gradient back onto the input's pixels, 1 FLOP an output element. It keeps nothing."""
    rd, wr = _io_bytes(in_shapes, node.output_shape)
    return OpCost(flops_bwd=float(numel(node.output_shape)), bytes_read=rd, bytes_written=wr, kernels_fwd=1,
                  kernels_bwd=1, kind="other")


def _fold(node: Node, in_shapes: list[list[int]], first: bool) -> OpCost:
    """col2im (torch's aten.col2im; a dispatch log of torch 2.14): each column added onto its window of the output
    (one kernel, an add an input element; bytes: the input read, the output written); backward im2col (one kernel, a
    copy of the gradient's windows into columns). It keeps nothing."""
    rd, wr = _io_bytes(in_shapes, node.output_shape)
    return OpCost(flops_fwd=float(numel(in_shapes[0])), bytes_read=rd, bytes_written=wr, kernels_fwd=1,
                  kernels_bwd=1, kind="other")


def _logsumexp(node: Node, in_shapes: list[list[int]], first: bool) -> OpCost:
    """log(sum(exp(x))) over dims as torch runs it (its composite kernel, the same on every device; torch 2.14's
    profiler): forward the max over dims (amax), its infinities zeroed (abs, eq, a copy, masked_fill), x less the max
    (sub), exp in place, the sum, its log and the max added back: 10 kernels, 4 FLOPs an input element (max, sub,
    exp, sum) and 5 an output one (abs, eq, masked_fill, log, add). Backward (a dispatch log): grad * exp(x -
    result), 3 kernels and 3 FLOPs an input element. It keeps its input and its result."""
    n, rows = numel(in_shapes[0]), numel(node.output_shape)
    rd, wr = _io_bytes(in_shapes, node.output_shape)
    return OpCost(flops_fwd=4.0 * n + 5.0 * rows, flops_bwd=3.0 * n, bytes_read=rd, bytes_written=wr,
                  saved=[0, OUTPUT], kernels_fwd=10, kernels_bwd=3, kind="pool")


def _cumsum(node: Node, in_shapes: list[list[int]], first: bool) -> OpCost:
    """A running sum along dim (torch's aten.cumsum, a dispatch log of torch 2.14): one kernel forward, an add an
    element; backward the gradient's reversed running sum, flip, cumsum, flip (3 kernels, an add an element). It
    keeps nothing."""
    n = numel(node.output_shape)
    rd, wr = _io_bytes(in_shapes, node.output_shape)
    return OpCost(flops_fwd=float(n), flops_bwd=float(n), bytes_read=rd, bytes_written=wr, kernels_fwd=1,
                  kernels_bwd=3, kind="other")


def _where(node: Node, in_shapes: list[list[int]], first: bool) -> OpCost:
    """torch.where(x <compare> t, a, b) as torch 2.14 runs it (a dispatch log): the compare (one kernel, a FLOP an
    element of x, a byte written each) and the where (one kernel, a FLOP an output element, the condition read);
    backward, per tensor branch, ``where(condition, grad, 0)`` (one kernel, a FLOP an output element; the zero a
    wrapped number, no kernel). It keeps the condition, a byte an element of x. A condition of two tensors
    (``compare_inputs``: a > b) reads both, its mask their broadcast shape's; a fixed mask (``mask_shape``: a
    boolean buffer) is no compare, nothing kept. A mask cast to float32 and multiplied in (``float_mask``:
    x * (x > 0).float()) is a kernel more forward (the cast, no FLOPs: a byte read, 4 written an element), the
    multiply reading the float mask; it keeps that, 4 bytes an element."""
    k = where_condition_inputs(node.attrs)
    n, branches = numel(node.output_shape), len(in_shapes) - k
    rd, wr = _io_bytes(in_shapes, node.output_shape)
    if k == 0:  # a fixed boolean mask (a buffer, kept already): the where alone forward, the mask read once a batch
        return OpCost(flops_fwd=float(n), flops_bwd=float(branches * n), bytes_read=rd, bytes_written=wr,
                      kernels_fwd=1, kernels_bwd=branches, kind="elementwise")
    condition = in_shapes[0] if k == 1 else broadcast(in_shapes[0], in_shapes[1]) or node.output_shape
    mask = numel(condition)
    if node.attrs.get("float_mask"):
        return OpCost(flops_fwd=float(mask + n), flops_bwd=float(branches * n), bytes_read=rd + 6.0 * mask,
                      bytes_written=wr + 5.0 * mask, extra_saved_bytes=4.0 * mask, kernels_fwd=3,
                      kernels_bwd=branches, kind="elementwise")
    return OpCost(flops_fwd=float(mask + n), flops_bwd=float(branches * n), bytes_read=rd + mask,
                  bytes_written=wr + mask, extra_saved_bytes=float(mask), kernels_fwd=2, kernels_bwd=branches,
                  kind="elementwise")


def _affine_grid(node: Node, in_shapes: list[list[int]], first: bool) -> OpCost:
    """A spatial transformer's grid (torch's affine_grid_generator, torch 2.14's profiler and dispatch log): a base
    grid of [H, W, 3] normalised coordinates and ones built (per side a linspace, and without align_corners its scale:
    a mul and a div, copied in; the ones a fill), then a bmm by theta transposed (12 FLOPs a position); backward
    builds the base grid again and multiplies it by the gradient (bmm: 12 a position), the same kernels: 10 each way,
    6 with align_corners. It keeps nothing. Bytes: theta read, the base grid written and read, the grid written."""
    positions = int(node.attrs["size"][0]) * int(node.attrs["size"][1])
    kernels = 6 if node.attrs["align_corners"] else 10
    rd, wr = _io_bytes(in_shapes, node.output_shape)
    base = 3.0 * positions * BYTES_PER_ELEMENT
    return OpCost(flops_fwd=12.0 * positions, flops_bwd=12.0 * positions, bytes_read=rd + base, bytes_written=wr + base,
                  kernels_fwd=kernels, kernels_bwd=kernels, kind="other")


def _grid_sample(node: Node, in_shapes: list[list[int]], first: bool) -> OpCost:
    """A map sampled bilinearly at a grid (torch's grid_sampler_2d, zeros padding; counted from its kernel's
    arithmetic, one aten op each way): per output position its two coordinates unnormalised and its four corners'
    weights (12 FLOPs), per output element four reads blended (8, as a bilinear resize's). Backward one op, two
    kernels (the map's gradient zeroed, then the kernel): per output element its gradient weighted into the four
    corners (8) and the grid's gradient summed from the corners' differences (8), per position 4. It keeps the map
    and the grid."""
    n = numel(node.output_shape)
    positions = numel(node.output_shape[1:])
    rd, wr = _io_bytes(in_shapes, node.output_shape)
    return OpCost(flops_fwd=8.0 * n + 12.0 * positions, flops_bwd=16.0 * n + 4.0 * positions, bytes_read=rd,
                  bytes_written=wr, saved=[0, 1], kernels_fwd=1, kernels_bwd=2, kind="other")


def _sort(node: Node, in_shapes: list[list[int]], first: bool) -> OpCost:
    """A sort's or a topk's values along dim (torch 2.14's aten.sort and aten.topk, a dispatch log): one kernel
    writing the values and their int64 indices; a sort's compares about log2 L an element (L the dim's length), a
    topk's one an input element and log2 k an output one. Backward the gradient scattered into zeros of the input's
    size (new_zeros, scatter: 2 kernels, no FLOPs). It keeps the indices (8 bytes an output element). Of ``gather`` (a
    second input y gathered at the indices: torch 2.14's dispatch log): the sort's kernel, then gather (one kernel, no
    FLOPs: an index and an element of y read and one written an output element); backward y's gradient scattered
    into zeros (new_zeros, scatter_add: 2 kernels, an add an output element), the sorted input none. It keeps the
    indices and y. One that ``shares`` an earlier one's indices runs its gather alone (:func:`_shared_gather`)."""
    if SHARES in node.attrs:
        return _shared_gather(node)
    if node.attrs.get("gather"):
        return _sort_gather(node, in_shapes)
    n_in, n_out = numel(in_shapes[0]), numel(node.output_shape)
    length = int(in_shapes[0][int(node.attrs["dim"]) - 1])
    flops = n_in * math.log2(length) if node.op == "sort" else n_in + n_out * math.log2(int(node.attrs["k"]))
    rd, wr = _io_bytes(in_shapes, node.output_shape)
    return OpCost(flops_fwd=float(flops), bytes_read=rd, bytes_written=wr + 8.0 * n_out,
                  extra_saved_bytes=8.0 * n_out, kernels_fwd=1, kernels_bwd=2, kind="other")


def sorted_shape(node: Node, in_shape: list[int]) -> list[int]:
    """The per-sample shape of a sort's or a topk's values and indices (``node``, of an input of ``in_shape``): the
    input's, with a topk's ``dim`` (counting the batch) cut to its ``k``. A gathering node's output is the other
    tensor's gathered at them, so the costs and the allocation replay (``alloc_forward``) work this one out."""
    picked = list(in_shape)
    if node.op == "topk":
        picked[int(node.attrs["dim"]) - 1] = int(node.attrs["k"])
    return picked


def _sort_gather(node: Node, in_shapes: list[list[int]]) -> OpCost:
    """:func:`_sort` of ``gather``: the sort's values and indices written (the values not read), y gathered."""
    n_in, n_sorted, n_out = numel(in_shapes[0]), numel(sorted_shape(node, in_shapes[0])), numel(node.output_shape)
    length = int(in_shapes[0][int(node.attrs["dim"]) - 1])
    flops = n_in * math.log2(length) if node.op == "sort" else n_in + n_sorted * math.log2(int(node.attrs["k"]))
    sorted_bytes = 12.0 * n_sorted  # the values' 4 bytes and the indices' 8 an element
    return OpCost(flops_fwd=float(flops), flops_bwd=float(n_out),
                  bytes_read=(n_in + 3.0 * n_out) * BYTES_PER_ELEMENT,
                  bytes_written=sorted_bytes + n_out * BYTES_PER_ELEMENT, saved=[1],
                  extra_saved_bytes=8.0 * n_sorted, kernels_fwd=2, kernels_bwd=2, kind="other")


def _shared_gather(node: Node) -> OpCost:
    """A tensor y gathered at the indices an earlier sort or topk of gather made (``shares``; torch 2.14's dispatch
    log): the gather alone (one kernel, no FLOPs: an index and an element of y read and one written an output
    element); backward y's gradient scattered into zeros (new_zeros, scatter_add: 2 kernels, an add an output
    element). It keeps y; the indices it keeps are the earlier node's (one tensor, counted there)."""
    n_out = numel(node.output_shape)
    return OpCost(flops_fwd=0.0, flops_bwd=float(n_out), bytes_read=3.0 * n_out * BYTES_PER_ELEMENT,
                  bytes_written=n_out * BYTES_PER_ELEMENT, saved=[1], kernels_fwd=1, kernels_bwd=2, kind="other")


def _where_gradients(cost: OpCost, node: Node, needs: list[bool], in_shapes: list[list[int]]) -> OpCost:
    """A where's ``cost`` where ``needs`` says which inputs need a gradient: torch computes those of its tensor
    branches that do (a where each, a FLOP an output element); the condition's input takes none."""
    branches = sum(needs[where_condition_inputs(node.attrs):])
    return changed(cost, flops_bwd=float(branches * numel(node.output_shape)), kernels_bwd=branches)


def _sampled_gradients(cost: OpCost, node: Node, needs: list[bool], in_shapes: list[list[int]]) -> OpCost:
    """A grid_sample's ``cost`` where its map needs no gradient (a spatial transformer sampling the image itself):
    torch's backward computes the grid's alone (no zeroed map gradient: one kernel, 8 FLOPs an output element and 4
    a position)."""
    if needs[0]:
        return cost
    return changed(cost, flops_bwd=8.0 * numel(node.output_shape) + 4.0 * numel(node.output_shape[1:]),
                   kernels_bwd=1)


def _linspace(node: Node, in_shapes: list[list[int]], first: bool) -> OpCost:
    """CoordConv's coordinate channel (torch.linspace viewed and expanded): one kernel forward writing a row or a
    column of floats once a step (no per-sample bytes: the batch's channel is a view of it), nothing back, nothing
    kept; its input's shape alone read (no gradient through it: :data:`NO_GRADIENT_OPS`). One ``made`` by arange
    (:func:`_arange_coordinates`) copies its values over the batch."""
    if node.attrs.get("made") == "arange":
        return _arange_coordinates(node)
    if node.attrs.get("made") == "arange_grid":  # the arange, the cast of its grid, the division (product, difference)
        return OpCost(kernels_fwd=5 if float(node.attrs["start"]) == -1 else 3, kind="other")  # once a step
    return OpCost(kernels_fwd=1, kind="other")


def _arange_coordinates(node: Node) -> OpCost:
    """A coordinate channel made as CoordConv's PyTorch port writes it (the linspace's ``made`` ``arange``): once a
    step the arange, its copy over the map by repeat, the cast to float, the division and, where it starts at -1,
    the product and the difference (a dispatch log, torch 2.14), then per sample its copy over the batch by repeat:
    ``H x W`` floats read and written a sample. Nothing back, nothing kept."""
    hw = numel(node.output_shape)
    return OpCost(bytes_read=float(hw * BYTES_PER_ELEMENT), bytes_written=float(hw * BYTES_PER_ELEMENT),
                  kernels_fwd=7 if float(node.attrs["start"]) == -1 else 5, kind="other")


#: Ops whose output needs no gradient, whatever their inputs (they read their input's shape alone): torch makes
#: their values from numbers.
NO_GRADIENT_OPS = frozenset({"linspace"})


def _input(node: Node, in_shapes: list[list[int]], first: bool) -> OpCost:
    return OpCost(kind="view")


#: op name -> (cost, node, whether each input needs a gradient, input shapes) -> the cost of a backward that computes
#: those inputs' gradients alone, for an op whose backward computes each input's apart (``walk.py`` applies it where
#: some input needs one).
INPUT_GRADIENTS: dict[str, Callable[[OpCost, Node, list[bool], list[list[int]]], OpCost]] = {
    "div": _quotient_gradients, "matmul": _matrix_product_gradients, "mul": _product_gradients,
    "maximum": _extreme_gradients, "minimum": _extreme_gradients,
    "where": _where_gradients, "grid_sample": _sampled_gradients}

#: op name -> handler(node, input shapes (per sample), first) -> OpCost. ``first`` is True when none of the
#: node's inputs needs a gradient (the network input, or what parameter-free ops made of it alone: ``walk.py``),
#: so it computes no input gradient.
HANDLERS: dict[str, Handler] = {
    "input": _input,
    "conv2d": _conv2d,
    "conv_transpose2d": _conv_transpose2d,
    "linear": _linear,
    "batchnorm2d": _batchnorm2d,
    "frozen_batchnorm2d": _frozen_batchnorm2d,
    "relu": _pointwise(1, [OUTPUT]),
    # ReLU6 keeps its result, as an in-place one did before torch 1.10 (the TX2's); a newer torch keeps its input
    # instead (step_runtime.StepRuntime.applied)
    "relu6": _pointwise(2, [OUTPUT]),
    "hardswish": _pointwise(4, [0], 3),
    "hardsigmoid": _pointwise(3, [0], 2),
    "sigmoid": _pointwise(4, [OUTPUT], 2),
    "silu": _pointwise(5, [0], 4),
    "gelu": _pointwise(8, [0], 8),
    "tanh": _pointwise(4, [OUTPUT], 2),
    # a compare and a multiply; its backward keeps the input (the result where it runs in place)
    "leaky_relu": _keeps_result_in_place(2, 2),
    # a compare, an exp, a subtract and a multiply; backward a compare, a multiply (and an add where it reads its
    # result); it keeps its input, or its result where it runs in place
    "elu": _keeps_result_in_place(4, 3),
    # an elu with one more multiply (SELU's scale of the output, CELU's 1 / alpha of the input) each way: torch runs
    # either as its elu kernel of a scale or an input scale (aten.elu, aten.celu), backward aten.elu_backward; each
    # keeps its input, or its result where it runs in place (measured on torch 2.14)
    "selu": _keeps_result_in_place(5, 4),
    "celu": _keeps_result_in_place(5, 4),
    # torch's own kernels (aten.hardshrink, aten.softshrink, aten.threshold; backward aten.<op>_backward, or
    # threshold_backward), each keeping its input, a threshold in place a clone of its input (measured on torch 2.14
    # and, on CUDA, 2.11): two compares (|x| against lambd) and a select; the compares and a subtract or add; one
    # compare and a select. Each backward the compares again and a select of the gradient
    # min(x, 0) - log1p(exp(-|x|)), about 5 FLOPs an element as softplus's; backward (aten.log_sigmoid_backward)
    # the exp again, a divide and the selects, about 4. It keeps its input and a buffer, which CUDA leaves empty
    # (measured on torch 2.11: 0 elements) and a CPU makes of the input's size (StepRuntime.applied)
    "log_sigmoid": _pointwise(5, [0], 4),
    "hardshrink": _pointwise(2, [0], 2),
    "softshrink": _pointwise(3, [0], 2),
    "threshold": _keeps_a_clone_in_place(1, 1),
    "rrelu": _rrelu,
    "alpha_dropout": _alpha_dropout,
    # a multiply, an exp, a log1p, a divide and the threshold's compare; backward an exp, a divide and a multiply
    # or so; it keeps its input (torch has no in-place softplus)
    "softplus": _pointwise(5, [0], 4),
    # x * tanh(log1p(exp(x))): an exp, a log1p (an add and a log), a tanh (4, as tanh's) and a multiply: 8. Its
    # backward recomputes the tanh of the softplus (7), a sigmoid (4, as sigmoid's) and grad * (t + x * s * (1 - t^2)):
    # a square, a subtract, three multiplies and an add, 17 in all. It keeps its input (in place, a clone of it)
    "mish": _keeps_a_clone_in_place(8, 17),
    # a clamp to [min_val, max_val]: two compares, as relu6; its backward keeps the input (the result where it
    # runs in place, as torch before 1.10 did; a newer torch's clone of the input: StepRuntime.applied)
    "hardtanh": _keeps_result_in_place(2, 1),
    # along one dim: a max, a subtract, an exp, a sum and a divide an element, as the attention's softmax counts
    # it (and its backward, twice that); it keeps its result
    "softmax": _pointwise(5, [OUTPUT], 10),
    # along one dim: a max, a subtract, an exp, a sum, a log and a subtract an element, about 4 FLOPs as the loss's
    # log-softmax counts it (formulas.position_loss), backward 3 (an exp, a multiply by the gradient's sum, a
    # subtract); it keeps its result
    "log_softmax": _pointwise(4, [OUTPUT], 3),
    "prelu": _prelu,
    # a * sigmoid(b) of the input's halves: a sigmoid (4 FLOPs, as sigmoid's) and a multiply an output element;
    # backward one kernel (aten.glu_backward) of the sigmoid again, grad * sigmoid(b) and grad * a * s * (1 - s), 9 an
    # output element, writing the input's gradient (twice the output). It keeps its input (measured on torch 2.14)
    "glu": _pointwise(5, [0], 9),
    "dropout2d": _dropout2d,
    "pow": _power,
    "div": _quotient,
    "matmul": _matrix_product,
    "var": _variance,
    # e ** x: 1 FLOP an element; backward grad * result (1), it keeps its result
    "exp": _pointwise(1, [OUTPUT], 1),
    # |x|: 1; backward grad * sgn(x) (2 in 2 kernels), it keeps its input
    "abs": _pointwise(1, [0], 2, 2),
    # ln x: 1; backward grad / x (1, one kernel: a dispatch log of torch 2.14), it keeps its input
    "log": _pointwise(1, [0], 1),
    "normalize": _l2_normalize,
    "logsumexp": _logsumexp,
    "cumsum": _cumsum,
    "linspace": _linspace,
    "where": _where,
    "affine_grid": _affine_grid,
    "grid_sample": _grid_sample,
    "sort": _sort, "topk": _sort,
    "unfold": _unfold,
    "fold": _fold,
    "identity": _view,
    "maxpool2d": _maxpool2d,
    "fractional_maxpool2d": _fractional_maxpool2d,
    "avgpool2d": _avgpool2d,
    "adaptiveavgpool2d": _adaptive(False),
    "adaptivemaxpool2d": _adaptive(True),
    "add": _binary(False),
    "mul": _binary(True),
    "cat": _cat,
    "reshape": _view,
    "flatten": _view,
    "squeeze": _view,
    "unsqueeze": _view,
    "select": _slice,
    "narrow": _slice,
    "transpose": _view,
    "mean": _mean,
    "dropout": _dropout,
    "permute": _view,  # the op after it that needs contiguous memory copies it (see latency_terms)
    "layernorm": _layernorm,
    "rmsnorm": _rmsnorm,
    "groupnorm": _groupnorm,
    "instancenorm": _instancenorm,
    "scale": _scale,
    "shift": _learnt_tensor,
    "token": _learnt_tensor,
    "attention": _attention,
    "window_attention": _window_attention,
    "patch_merge": _patch_merge,
    "interpolate": _interpolate,
    "group_attention": _group_attention,
    "pad": _pad,
    "pixel_shuffle": _pixel_shuffle,
    "pixel_unshuffle": _pixel_shuffle,
    "repeat": _repeat,
    "local_response_norm": _local_response_norm,
    "maximum": _extreme,
    "minimum": _extreme,
    "flip": _reordered_copy,
    "roll": _reordered_copy,
    "weighted_sum": _weighted_sum,
}
