"""The allocation events of a training step worked out from the description alone (no torch).

:mod:`perf4sight.features.alloc_trace` records the events by running the step on the meta device;
this module writes the same events down from the description, 10-30 times faster. It covers every op of the schema
but a local response norm (:data:`COVERED`; it is left to the trace); the few
patterns it does not follow raise :class:`NotCovered` and go to the trace (an in-place ReLU on a tensor a node keeps,
a linear layer on a strided tensor of more than two dimensions, a kernel or a view reading a
gradient with permuted strides, a layout torch decides by strides along dimensions of size 1 that the model does not
follow: after a permute, through an op other than those of :data:`_LAID_OUT`, or a layer norm's input gradient of a
strided incoming one; attention of a strided input, without a bias or with a dropout; a window attention with a
dropout). The two are checked to give the same allocations in the
same order with the same frees between them (the trace's zero-byte allocations aside) on zoo, pruned and generated
networks, ConvNeXt, ViT, Swin (V1 and V2) and MaxViT in ``tests/test_allocator.py``.

Sizes are bytes at one batch size (float32 tensors, int64 pooling indices, labels and counters).
The rules, as PyTorch runs a training step (and as the meta trace shows them):

- **Setup**: every parameter (node order; weight then bias), then every buffer (batch norm's
  running mean, running variance and int64 step counter), then the input batch and the labels.
- **Forward**: each op allocates its outputs; an autograd node (one per op whose input or
  weights need a gradient) holds the tensors its backward reads (*saved*); the graph module drops
  a value after its last use (its inputs in order). A tensor's storage is freed when nothing holds
  it any more (values, views, saved tensors, gradient buffers). ReLU and ReLU6 run in place, as in
  the trace; in place, ReLU keeps its result, and ReLU6 keeps its result as PyTorch 1.9 and older
  did, or (``relu6_clone``) a clone of its input made just before, as PyTorch 1.10 and newer do
  (``hardtanh_``'s backward reads its input since then: pytorch/pytorch#95432). Views (reshape,
  flatten, squeeze, transpose, narrow) share their input's storage; strides are followed, so a
  reshape that no view can express (after a transpose: a channel shuffle) is a contiguous copy, and
  so is the backward's reshape of a gradient with such strides.
  A narrow's or a select's backward writes its gradient into zeros of the input's shape (a new
  tensor). Max pooling (plain or adaptive) keeps its input and int64 indices; a scalar add keeps
  nothing and hands its gradient on, a scalar multiply scales it (a new tensor).
- **Loss**: cross entropy = log-softmax (keeps its result) + NLL loss (a 4-byte loss and a 4-byte
  total weight, which it keeps); ``backward`` starts from a 4-byte seed held until it returns. A classifier's
  scores are read as ``[N, -1]`` (a view); scores per pixel (``[N, C, H, W]``, a segmentation network's) go to
  NLL's 2-D kernels as they are, against int64 labels of ``[N, H, W]``.
  An MSE or L1 loss (``[profile] loss``) compares the output with a float target of its shape, which the caller
  holds beside the input instead of the labels (:func:`_regression_loss`).
- **Backward**: nodes run in reverse creation order (the engine runs the ready node with the
  highest sequence number). A node allocates the gradients it computes; the engine sums the
  gradient of a broadcast input down to its shape (a new tensor, the full one freed); then the
  node releases its incoming gradient and its saved tensors and hands each gradient on: into an
  empty buffer as is, into a filled one as a new sum (the buffer's old value released at once, the
  node's addend once the node has handed on all its gradients: it holds its outputs till then). Pass-through
  backwards (add, cat, views) hand on the incoming gradient or views of it. A parameter's
  gradient is kept as its ``.grad`` where it is accumulated (a mark, so that later steps can free
  it there instead). A layer called more than once (its later calls' nodes ``share`` the first's parameters,
  which are set up once) computes a gradient of each parameter per call: the first to arrive waits in the
  parameter's buffer, each later one is added to it out of place (the old sum freed at once, the addend with its
  node's other outputs), and the parameter's gradient is accumulated when the last has arrived.
- Linear layers are ``t`` + ``addmm`` (the bias gradient is the incoming one summed down, after
  the two matrix products; the weight's reaches it through the ``t`` node) or, without a bias,
  ``t`` + ``mm``, whose backward computes the weight's gradient first, as ``mul`` computes its
  second input's first. Dropout is the fused kernel of a CUDA build (the trace runs it too):
  the output and a one-byte mask, which the backward keeps.
  Out-of-place activations keep their input (hardswish, hardsigmoid, SiLU, GELU) or their result
  (sigmoid, tanh; in place, ``y.sigmoid_()``, no output); a hardswish, a hardsigmoid and a SiLU in place keep a
  clone of their input, made before they run (as a mish's). An in-place activation rebases its input's history: a
  later reader of the input reads its result (``y + y.relu()``: both gradients through the activation's node).
  Group norm allocates its output, then a mean and a 1/std per sample and group; it keeps its
  input and those two (its weight is a parameter), and its backward allocates the input's gradient, then the
  weight's and bias's. A transposed convolution is ``aten.convolution`` as a conv2d is: its output; it keeps its input
  (a strided one as it is), and its backward allocates the input's gradient, the weight's, then the bias's.
  Instance norm is a batch norm of the input viewed as [1, N x C, H, W] (its weight and bias
  repeated per sample first, their gradients summed back down after): :func:`_instance_norm`; its output is a view,
  and an in-place activation on it rebases the view's history (:func:`_rebased`). A softmax keeps
  its result; a hardtanh is a ReLU6 of another range (in place where its node says so).
  A pad and a pixel shuffle or unshuffle allocate their output; a reflection or replication
  pad keeps its input (its backward reads the input's shape from it), the others keep nothing; each backward
  allocates the input's gradient (a constant pad's by a constant pad of negative pads, a shuffle's by an unshuffle,
  an unshuffle's by a shuffle). A circular pad (copies into slices of its output, a chain of autograd nodes) is
  left to the trace, as a local response norm is (not in :data:`COVERED`: seven ops of torch's, each its own
  autograd node).
  ConvNeXt's layouts, as the meta device lays them out: a permute is a view (its backward permutes back); a layer
  norm allocates a contiguous output, then a mean and a 1/std per row, and keeps its input as it is; a linear layer
  on a contiguous tensor of more than two dimensions is ``addmm`` of its rows, viewed back (:func:`_linear_folded`);
  a layer scale (``scale``) is a multiply by a broadcast weight, laid out with an add of two tensors as torch's
  TensorIterator lays them out (:func:`_iterated`). A convolution's output is contiguous, but its backward computes
  channels-last gradients of a channels-last input (:func:`_convolution_layouts`), and AccumulateGrad copies a weight's
  gradient whose strides are not its parameter's into a new tensor (``new_empty_strided``); the mean of an adaptive
  pool of a channels-last input is restrided in place, and its backward writes the gradient into new zeros first.
  Torch tells channels-last from contiguous by strides along dimensions of size 1 too (ConvNeXt's 1 x 1 maps at
  32 x 32): a permuted value and what the ops of :data:`_LAID_OUT` make of it carry those (:attr:`_Value.raw`).
  A ViT's: a class token is a ``cat`` of the weight expanded to the batch (its gradient summed down), a position
  embedding an add of a broadcast weight, a linear layer on a strided 2-D tensor (the class token's select) an
  ``addmm`` as on a contiguous one, and attention ``nn.MultiheadAttention``'s ops around the memory-efficient kernel
  a CUDA build runs (:func:`_attention`), whose output is laid out transposed (so are the residual adds after it).
  A Swin's: a window attention is the ops ``to_torch.WindowAttention`` runs, each with its autograd node as torch
  makes it (:func:`_window_attention`, :class:`_Composite`): pads, rolls, the windows' and heads' copies where a
  reshape cannot be a view, ``bmm`` of 3-D copies, the bias table's ``index`` (backward ``new_zeros`` and
  ``index_put``), a shifted window's mask (no gradient); V2's cosine scores (:func:`_cosine_scores`), its packed
  bias's keys zeroed in place (:func:`_keys_unbiased`) and its bias MLP (:func:`_bias_mlp`); a patch merge a pad,
  strided slices and a ``cat`` (:func:`_patch_merge`); a MaxViT's group attention the ops ``to_torch.GroupAttention``
  runs (:func:`_group_attention`: its chunk one split node whose backward gathers its parts' gradients into a
  ``cat``); a linear layer without a bias on a contiguous N-D tensor
  ``mm`` of its rows (:func:`_matmul_folded`). A layer norm's input gradient is laid out as its incoming gradient
  (the meta kernel's), and a folded linear layer's ``mm`` reads a gradient of any strides (a permuted one folds into
  rows as a view at a batch of 1).
  A log-softmax keeps its result, as a softmax does. A PReLU keeps its input; its backward allocates the input's
  gradient and the slopes' per element, summed down to the slopes (:func:`_prelu`). A dropout2d allocates a
  noise per sample and channel, then its output (the input times the noise); it keeps the noise. A dropout of
  ``p`` 0 (either kind) is the input handed back, as an identity is.
  A GLU allocates its output (half its input) and keeps its input; its backward allocates the input's gradient
  (:func:`_glu`). A hardshrink, a softshrink and a threshold keep their input, a threshold in place a clone of its
  input (made before it runs, as a mish's). A log-sigmoid keeps its input and a buffer that CUDA leaves empty (no
  block; a CPU's is of the input's size).
"""
from __future__ import annotations

from dataclasses import dataclass
from math import prod
from typing import Callable

from perf4sight.features.alloc_forward import (_activation, _affine_grid, _alpha_dropout, _attention, _combine, _cumsum,
                                               _dropout2d, _extreme, _frozen_batch_norm, _glu, _grid_sample, _im2col,
                                               _instance_norm, _interpolate, _layer_norm, _lays_out, _linear_folded,
                                               _logsumexp, _maths, _matmul_folded, _matrix_product, _permute, _pooling,
                                               _prelu, _quotient, _rearrange, _reordered_copy, _rrelu, _scale, _shift,
                                               _softmax, _sorted, _tiling, _token, _variance, _view_op, _weighted_sum,
                                               _where, _with_parameters)
from perf4sight.features.alloc_repeat import _REPEATED, _repeated
from perf4sight.features.alloc_strides import _dense, _iterated, _normal, _ordered, _strides, _view
from perf4sight.features.alloc_values import (_ACTIVATIONS, _VIEWS, ACCUMULATED, FLOAT, INT64, Event, NotCovered, _edge,
                                              _fn_edge, _GradFn, _Memory, _OpContext, _params, _Value,
                                              _window_parameters)
from perf4sight.ir.schema import CONSTANT_MODES, SHARES, NetworkDescription, Node
from perf4sight.ir.shapes import SIZE_REFERENCES, window_pair, windows_of
from perf4sight.profiling.plan import DEFAULT_LOSS

__all__ = ["COVERED", "ACCUMULATED", "Event", "NotCovered", "step_events"]

#: Ops whose forward and backward allocations are written down here.
COVERED = frozenset({"input", "conv2d", "batchnorm2d", "linear", "relu", "relu6", "maxpool2d", "avgpool2d",
                     "adaptiveavgpool2d", "mean", "add", "mul", "cat", "reshape", "flatten", "squeeze", "unsqueeze",
                     "identity", "dropout", "hardswish", "hardsigmoid", "silu", "gelu", "sigmoid", "tanh",
                     "transpose", "narrow", "select", "adaptivemaxpool2d", "interpolate", "leaky_relu", "elu",
                     "softplus", "mish", "groupnorm",
                     "conv_transpose2d", "instancenorm", "hardtanh", "softmax", "pad", "pixel_shuffle",
                     "pixel_unshuffle", "log_softmax", "prelu", "dropout2d",
                     "selu", "celu",
                     "pow", "exp", "abs", "div", "var", "permute", "layernorm", "scale", "shift", "token",
                     "attention",
                     "glu",
                     "hardshrink", "softshrink", "threshold",
                     "log_sigmoid",
                     "rmsnorm",
                     "repeat",
                     "rrelu",
                     "alpha_dropout",
                     "fractional_maxpool2d",
                     "window_attention", "patch_merge",
                     "group_attention",
                     "frozen_batchnorm2d",
                     "flip", "roll",
                     "maximum", "minimum",
                     "weighted_sum",
                     "log",
                     "normalize",
                     "logsumexp",
                     "cumsum",
                     "where",
                     "affine_grid", "grid_sample",
                     "sort", "topk",
                     "unfold", "fold",
                     "matmul"})


@dataclass
class _Step:
    """The first training step's events and what later steps need from it."""
    setup: list[Event]
    body: list[Event]           # forward and backward, with ACCUMULATED marks
    tail: list[Event]           # after the optimizer: the logits and the loss dropped
    grads: dict[int, int]       # parameter index -> storage id of its .grad
    param_bytes: list[int]
    new_id: Callable[[], int]   # a fresh storage id


def step_events(desc: NetworkDescription, batch_size: int, relu6_clone: bool = False,
                loss_name: str = DEFAULT_LOSS) -> _Step:
    """The setup and first-step events of ``desc`` at ``batch_size`` (bytes); ``relu6_clone``: an in-place
    ReLU6 keeps a clone of its input (PyTorch >= 1.10), not its result; ``loss_name``: the step's loss
    (``profiling.plan.LOSSES``). Raises :class:`NotCovered`."""
    for n in desc.nodes:
        if n.op not in COVERED:
            raise NotCovered(f"op '{n.op}'")
        if n.op != "batchnorm2d" and n.attrs.get(CONSTANT_MODES.get(n.op, ""), True) is False:  # (a batch norm's:
            raise NotCovered(f"{n.op} of {CONSTANT_MODES[n.op]} false")  # :func:`_with_parameters`, as in training)
    mem = _Memory()
    b = int(batch_size)
    param_bytes: list[int] = []
    first_param: dict[str, int] = {}
    buffers: list[int] = []
    for n in desc.nodes:
        if SHARES in n.attrs:  # a layer called again: its first call's parameters and buffers
            first_param[n.name] = first_param[n.attrs[SHARES]]
            continue
        p, bufs = _params(n)
        first_param[n.name] = len(param_bytes)
        param_bytes += p
        buffers += bufs
    for nbytes in param_bytes + buffers:
        mem.new(nbytes, "setup")
    values: dict[str, _Value] = {}
    fns: list[_GradFn] = []
    users = _last_uses(desc)
    shapes = {n.name: list(n.output_shape) for n in desc.nodes}
    for n in desc.nodes:
        if n.op == "input":  # held by the caller too
            nbytes = b * prod(desc.input_shape) * FLOAT
            values[n.name] = _Value(mem.new(nbytes, "input", holders=2), nbytes, None)
            mem.new(_target_bytes(desc, b, loss_name), "labels")  # held by the caller for the whole run
            setup = list(mem.events)
            mem.events.clear()
            continue
        ins = [values[i] for i in n.inputs]
        values[n.name] = _forward(n, ins, [shapes[i] for i in n.inputs], b, mem, fns, first_param[n.name],
                                  relu6_clone)
        for dead in users.get(n.name, []):
            mem.drop(values[dead].sid)
    out = values[desc.output]
    logits, loss, root = _loss(out, len(desc.label_shape), mem, fns) if loss_name == DEFAULT_LOSS else \
        _regression_loss(out, loss_name, mem, fns)
    grads = _backward(fns, root, mem)
    body = list(mem.events)
    mem.events.clear()
    mem.drop(logits)  # del out, loss (after the optimizer step)
    mem.drop(loss)
    return _Step(setup, body, list(mem.events), grads, param_bytes, mem.new_id)


def _reads(n: Node) -> list[str]:
    """The values the rebuilt module's call of ``n`` reads: its inputs, then the map it takes its size from where it
    names one (:data:`SIZE_REFERENCES`: the call's argument after its input, read for its shape)."""
    like = n.attrs.get(SIZE_REFERENCES.get(n.op, ""))
    return [*n.inputs, like] if isinstance(like, str) else list(n.inputs)


def _last_uses(desc: NetworkDescription) -> dict[str, list[str]]:
    """Node name -> the values the graph module drops right after it (their last use), in the order
    of its reads (:func:`_reads`); the network's output is kept (returned). Unused values are not covered, nor a map
    whose last reader is a transposed convolution taking its output size from it (the rebuilt module drops it after
    reading its shape, before the convolution runs)."""
    last: dict[str, str] = {}
    for n in desc.nodes:
        for i in _reads(n):
            last[i] = n.name
    for n in desc.nodes:
        if n.name not in last and n.name != desc.output:
            raise NotCovered(f"value '{n.name}' is never used")
        if n.op == "conv_transpose2d" and last.get(n.attrs.get("output_size_of", "")) == n.name:
            raise NotCovered("a transposed convolution sized by a map nothing after it reads")
    out: dict[str, list[str]] = {}
    for n in desc.nodes:
        for i in dict.fromkeys(_reads(n)):
            if last[i] == n.name and i != desc.output:
                out.setdefault(n.name, []).append(i)
    return out


def _forward(n: Node, ins: list[_Value], in_shapes: list[list[int]], b: int, mem: _Memory, fns: list[_GradFn],
             p0: int, relu6_clone: bool = False) -> _Value:
    """Run node ``n`` forward (inputs ``ins`` of per-sample shapes ``in_shapes``, batch ``b``; its
    parameters are ``p0``, ``p0 + 1``...; ``relu6_clone`` as :func:`step_events`'s): its allocations, its
    autograd node (appended to ``fns``), its value."""
    ctx = _OpContext(n, ins, in_shapes, b, mem, fns, p0, ins[0], b * prod(n.output_shape) * FLOAT,  # output bytes
                     (b, *in_shapes[0]), (b, *n.output_shape), relu6_clone)
    ctx.check_strides()
    handler = _HANDLERS.get(n.op)
    if handler is None:
        raise NotCovered(f"op '{n.op}'")
    out = _repeated(ctx, handler) if n.op in _REPEATED else handler(ctx)
    if out.raw is None and not out.loose and 1 in ctx.full_out and not _lays_out(n) and \
            any(i.raw is not None or i.loose for i in ins):
        out.loose = True  # its output may be laid out as its input, along dimensions of size 1 too
    return out


@dataclass(slots=True)
class _Tensor:
    """A tensor inside a composite op (a window attention, a patch merge): its value (one reference to its storage,
    dropped with :meth:`_Composite.drop` where the Python local dies) and its shape with the batch."""
    value: _Value
    shape: tuple[int, ...]

    @property
    def nbytes(self) -> int:
        """Bytes of the tensor (float32)."""
        return prod(self.shape) * FLOAT


class _Composite:
    """The torch ops a composite op runs, one by one, each with its autograd node as torch makes it (views, copies
    where a reshape cannot be a view, fresh kernels), on the op's memory and nodes (``ctx``)."""

    def __init__(self, ctx: _OpContext) -> None:
        self.ctx, self.mem = ctx, ctx.mem

    def drop(self, *tensors: _Tensor) -> None:
        """The Python locals of ``tensors`` die: one reference each dropped."""
        for t in tensors:
            self.mem.drop(t.value.sid)

    def node(self, saved: list[int], edges: list, sizes: list[int], kernels: list[str | None], out_shape: tuple,
             shapes: list[tuple], **kw) -> int | None:
        """An autograd node (:meth:`_OpContext.grad_fn`) of output ``out_shape`` and inputs of ``shapes``."""
        return self.ctx.grad_fn(saved, edges, sizes, kernels, out_shape=out_shape, shapes=shapes, **kw)

    def fresh(self, t: _Tensor, kernel: str, shape: tuple[int, ...], backward: str | None, keep: bool = False,
              any_strides: bool = False) -> _Tensor:
        """A one-input kernel ``aten.<kernel>`` that allocates a contiguous output of ``shape``; its backward's
        ``backward`` allocates the input's gradient (None: hands the incoming one on); ``keep``: it keeps its
        result."""
        sid = self.mem.new(prod(shape) * FLOAT, "aten." + kernel)
        fn = self.node([sid] if keep else [], [_edge(t.value)], [t.nbytes], [backward], shape, [t.shape],
                       any_strides=any_strides)
        return _Tensor(_Value(sid, prod(shape) * FLOAT, fn), shape)

    def view(self, t: _Tensor, shape: tuple[int, ...]) -> _Tensor:
        """``reshape``: a view where the strides allow one, else a contiguous copy (``clone``) viewed."""
        v = t.value
        viewable, strides = _view(t.shape, v.strides, shape)
        if viewable:
            fn = self.node([], [_edge(v)], [t.nbytes], [None], shape, [t.shape], handoff="view")
            return _Tensor(_Value(self.mem.hold(v.sid), t.nbytes, fn, view=True, strides=strides), shape)
        sid = self.mem.new(t.nbytes, "aten.clone.default")
        copied = self.node([], [_edge(v)], [t.nbytes], [None], t.shape, [t.shape])
        fn = self.node([], [_fn_edge(copied)], [t.nbytes], [None], shape, [t.shape], handoff="view")
        return _Tensor(_Value(sid, t.nbytes, fn), shape)

    def contiguous(self, t: _Tensor) -> _Tensor:
        """``.contiguous()``: the tensor itself (a new reference) where it is contiguous, else a ``clone``."""
        if t.value.strides is None:
            return _Tensor(_Value(self.mem.hold(t.value.sid), t.nbytes, t.value.fn, view=t.value.view), t.shape)
        sid = self.mem.new(t.nbytes, "aten.clone.default")
        return _Tensor(_Value(sid, t.nbytes, self.node([], [_edge(t.value)], [t.nbytes], [None], t.shape,
                                                       [t.shape])), t.shape)

    def permute(self, t: _Tensor, dims: tuple[int, ...]) -> _Tensor:
        """A permute: a view; its backward permutes the gradient back."""
        strides = t.value.strides or _strides(t.shape)
        shape = tuple(t.shape[d] for d in dims)
        fn = self.node([], [_edge(t.value)], [t.nbytes], [None], shape, [t.shape], handoff="permute", perm=dims)
        return _Tensor(_Value(self.mem.hold(t.value.sid), t.nbytes, fn, view=True,
                              strides=_normal(shape, tuple(strides[d] for d in dims))), shape)

    def transpose(self, t: _Tensor, d0: int, d1: int) -> _Tensor:
        """A transpose of two dimensions: a view."""
        dims = list(range(len(t.shape)))
        dims[d0], dims[d1] = dims[d1], dims[d0]
        strides = t.value.strides or _strides(t.shape)
        shape = tuple(t.shape[d] for d in dims)
        fn = self.node([], [_edge(t.value)], [t.nbytes], [None], shape, [t.shape], handoff="transpose", dims=(d0, d1))
        return _Tensor(_Value(self.mem.hold(t.value.sid), t.nbytes, fn, view=True,
                              strides=_normal(shape, tuple(strides[d] for d in dims))), shape)

    def select(self, t: _Tensor, dim: int) -> _Tensor:
        """One index of dimension ``dim``: a view; its backward writes the gradient into zeros of the input's
        shape (``select_backward``, contiguous whatever the gradient's strides)."""
        strides = list(t.value.strides or _strides(t.shape))
        del strides[dim]
        shape = t.shape[:dim] + t.shape[dim + 1:]
        fn = self.node([], [_edge(t.value)], [t.nbytes], ["aten.select_backward.default"], shape, [t.shape],
                       any_strides=True)
        return _Tensor(_Value(self.mem.hold(t.value.sid), prod(shape) * FLOAT, fn, view=True,
                              strides=_normal(shape, tuple(strides))), shape)

    def narrow(self, t: _Tensor, dim: int, length: int) -> _Tensor:
        """The first ``length`` of dimension ``dim`` (a slice; none where it is the whole dimension): a view; its
        backward writes the gradient into zeros of the input's shape (``slice_backward``)."""
        if length == t.shape[dim]:
            return _Tensor(_Value(self.mem.hold(t.value.sid), t.nbytes, t.value.fn, view=True,
                                  strides=t.value.strides), t.shape)
        strides = t.value.strides or _strides(t.shape)
        shape = t.shape[:dim] + (length,) + t.shape[dim + 1:]
        fn = self.node([], [_edge(t.value)], [t.nbytes], ["aten.slice_backward.default"], shape, [t.shape],
                       any_strides=True)
        return _Tensor(_Value(self.mem.hold(t.value.sid), prod(shape) * FLOAT, fn, view=True,
                              strides=_normal(shape, strides)), shape)

    def every_other(self, t: _Tensor, dim: int, start: int) -> _Tensor:
        """``start::2`` of dimension ``dim`` (a strided slice): a view; its backward writes the gradient into zeros
        of the input's shape (``slice_backward``)."""
        strides = list(t.value.strides or _strides(t.shape))
        strides[dim] *= 2
        shape = t.shape[:dim] + ((t.shape[dim] - start + 1) // 2,) + t.shape[dim + 1:]
        fn = self.node([], [_edge(t.value)], [t.nbytes], ["aten.slice_backward.default"], shape, [t.shape],
                       any_strides=True)
        return _Tensor(_Value(self.mem.hold(t.value.sid), prod(shape) * FLOAT, fn, view=True,
                              strides=_normal(shape, tuple(strides))), shape)

    def scaled(self, t: _Tensor) -> _Tensor:
        """The tensor times a Python number (``mul.Tensor``, laid out as TensorIterator lays out its input); its
        backward scales the incoming gradient (laid out as that)."""
        sid = self.mem.new(t.nbytes, "aten.mul.Tensor")
        fn = self.node([], [_edge(t.value)], [t.nbytes], ["aten.mul.Tensor"], t.shape, [t.shape],
                       layouts=[("iterated", [])], any_strides=True)
        return _Tensor(_Value(sid, t.nbytes, fn, strides=_iterated(t.shape, [t.value.strides])), t.shape)

    def add(self, a: _Tensor, b: _Tensor) -> _Tensor:
        """``a + b`` (contiguous; ``b`` broadcast to ``a``'s shape): the incoming gradient handed on to ``a``, and
        summed down to ``b``'s shape (where ``b`` needs one)."""
        if a.value.strides is not None or b.value.strides is not None:
            raise NotCovered("an add of strided tensors in a composite op")
        sid = self.mem.new(a.nbytes, "aten.add.Tensor")
        full = [None, a.nbytes if b.shape != a.shape else None]
        fn = self.node([], [_edge(a.value), _edge(b.value)], [a.nbytes, b.nbytes], [None, None], a.shape,
                       [a.shape, b.shape], full=full)
        return _Tensor(_Value(sid, a.nbytes, fn), a.shape)

    def matmul(self, a: _Tensor, b: _Tensor) -> _Tensor:
        """``a.matmul(b)`` of two tensors of the same leading dimensions, as the ``matmul`` op runs it
        (:func:`_matrix_product`: each input viewed as 3-D, or copied where no view can, ``bmm``, the result viewed
        back; its backward the second's gradient, then the first's)."""
        shape = (*a.shape[:-1], b.shape[-1])
        name = self.ctx.node.name
        node = Node(name, "matmul", [f"{name}.a", f"{name}.b"], {}, list(shape[1:]))
        sub = _OpContext(node, [a.value, b.value], [list(a.shape[1:]), list(b.shape[1:])], a.shape[0], self.mem,
                         self.ctx.fns, self.ctx.first_param, a.value, prod(shape) * FLOAT, a.shape, shape,
                         self.ctx.relu6_clone)
        return _Tensor(_matrix_product(sub), shape)

    def linear(self, t: _Tensor, out_features: int, bias: bool, p0: int,
               bias_edge: tuple[str, int] | None = None) -> _Tensor:
        """``F.linear`` of a contiguous tensor of three or more dimensions (parameters ``p0``, and ``p0 + 1`` the bias
        unless ``bias_edge`` says where its gradient goes): :func:`_linear_folded`, :func:`_matmul_folded`."""
        shape = (*t.shape[:-1], out_features)
        node = Node(self.ctx.node.name, "linear", [self.ctx.node.name],
                    {"in_features": t.shape[-1], "out_features": out_features, "bias": bias}, list(shape[1:]))
        sub = _OpContext(node, [t.value], [list(t.shape[1:])], t.shape[0], self.mem, self.ctx.fns, p0, t.value,
                         prod(shape) * FLOAT, t.shape, shape, self.ctx.relu6_clone)
        pbytes, _ = _params(node)
        pedges = [("param", p0 + k) for k in range(len(pbytes))]
        if bias_edge is not None:
            pedges[1] = bias_edge
        folded = _linear_folded if bias else _matmul_folded
        return _Tensor(folded(sub, pedges, pbytes), shape)


def _window_attention(ctx: _OpContext) -> _Value:
    """A Swin window attention as ``to_torch.WindowAttention`` runs it, op by op (:class:`_Composite`): the map
    padded (a copy, even of no padding), rolled where shifted, cut into windows (a copy), the packed projection
    (``addmm`` of the rows), the scores (:func:`_scores`, :func:`_cosine_scores`), each head's bias per relative
    position (:func:`_biased`) and, where shifted, the mask between rolled regions added, a softmax, the values
    weighted (``bmm``), the projection, the windows put back (a copy), rolled back and cropped. Parameters
    (:func:`_window_parameters`): the bias table or Swin V2's logit scale, the packed projection's weight and bias, the
    output projection's, V2's bias MLP's. Dropouts are not covered."""
    a = ctx.node.attrs
    if not a["bias"] or float(a.get("dropout", 0)) or float(a.get("attention_dropout", 0)) or \
            ctx.x.strides is not None:
        raise NotCovered("a window attention with a dropout, without a bias or of a strided input")
    g, p = _Composite(ctx), _window_parameters(ctx.node, ctx.first_param)
    batch, height, width, e = ctx.full_in
    ph, pw, (wh, ww), shift = windows_of(height, width, a["window_size"], a["shift_size"])
    heads, tokens, windows = int(a["num_heads"]), wh * ww, (ph // wh) * (pw // ww)
    rows = batch * windows
    x = g.fresh(_Tensor(ctx.x, ctx.full_in), "constant_pad_nd.default", (batch, ph, pw, e),
                "aten.constant_pad_nd.default")
    if sum(shift) > 0:
        x = _rolled(g, x)
    x = _windows(g, x, (batch, ph // wh, wh, pw // ww, ww, e), (rows, tokens, e))
    bias = _keys_unbiased(g, p["qkv"] + 1, e) if a.get("cosine") else None
    qkv = g.linear(x, 3 * e, True, p["qkv"], None if bias is None else _fn_edge(bias[1]))
    split = g.view(qkv, (rows, tokens, 3, heads, e // heads))
    g.drop(qkv)
    qkv = g.permute(split, (2, 0, 3, 1, 4))
    g.drop(split)
    attn = _cosine_scores(g, qkv, p["logit_scale"]) if a.get("cosine") else _scores(g, qkv)
    v = g.select(qkv, 0)
    attn = _biased(g, attn, p, heads, tokens, (wh, ww), int(a.get("position_bias_mlp", 0)))
    if sum(shift) > 0:
        attn = _masked(g, attn, (batch, windows, heads, tokens, tokens), (ph, pw), (wh, ww))
    weights = g.fresh(attn, "_softmax.default", attn.shape, "aten._softmax_backward_data.default", keep=True)
    g.drop(attn)
    out = g.matmul(weights, v)
    moved = g.transpose(out, 1, 2)
    g.drop(out)
    merged = g.view(moved, (rows, tokens, e))
    g.drop(moved, x)
    projected = g.linear(merged, e, True, p["proj"])
    g.drop(merged)
    y = _windows(g, projected, (batch, ph // wh, pw // ww, wh, ww, e), (batch, ph, pw, e))
    if sum(shift) > 0:
        y = _rolled(g, y)
    cropped = g.narrow(y, 1, height)
    g.drop(y)
    y = g.narrow(cropped, 2, width)
    g.drop(cropped)
    out = g.contiguous(y)
    g.drop(y, qkv, v, weights)
    if bias is not None:
        g.mem.drop(bias[0])
    return out.value


def _group_attention(ctx: _OpContext) -> _Value:
    """A MaxViT attention within groups as ``to_torch.GroupAttention`` runs it, op by op (:class:`_Composite`): the
    packed projection (``addmm`` of the rows) chunked in three (one split node: its backward gathers the three
    gradients into a ``cat``), each part reshaped into heads and permuted (views), the scores
    ``einsum(q, k * scale)`` (the keys scaled, a new tensor laid out as they are; then as a ``matmul``: ``bmm`` of
    copies), the bias per relative position (:func:`_position_bias`) added, a softmax, ``einsum(weights, v)``, the
    heads put back (a copy) and the merging projection. The scores, the bias, the weighted values and the projection
    are freed at the return. Parameters: the bias table (the module's own), the packed projection's weight and bias,
    the merging one's."""
    a = ctx.node.attrs
    if not a.get("bias", True) or ctx.x.strides is not None:
        raise NotCovered("a group attention without a bias or of a strided input")
    g = _Composite(ctx)
    n, groups, tokens, e = ctx.full_in
    heads = int(a["num_heads"])
    wh, ww = window_pair(a["window_size"])
    if wh * ww != tokens:
        raise NotCovered("a group attention whose window is not its groups' tokens")
    qkv = g.linear(_Tensor(ctx.x, ctx.full_in), 3 * e, True, ctx.first_param + 1)
    q, k, v = _chunked(g, qkv, 3)
    g.drop(qkv)
    q, k, v = (_heads_first(g, t, heads) for t in (q, k, v))
    scaled = g.scaled(k)
    keys = g.transpose(scaled, 3, 4)
    scores = g.matmul(q, keys)
    g.drop(keys, scaled)
    bias = _position_bias(g, ("param", ctx.first_param), (2 * wh - 1) * (2 * ww - 1), heads, tokens)
    summed = g.add(scores, bias)
    weights = g.fresh(summed, "_softmax.default", summed.shape, "aten._softmax_backward_data.default", keep=True)
    g.drop(summed)
    out = g.matmul(weights, v)
    moved = g.permute(out, (0, 1, 3, 2, 4))
    merged = g.view(moved, ctx.full_in)
    g.drop(moved)
    projected = g.linear(merged, e, True, ctx.first_param + 3)
    g.drop(merged, q, k, v, scores, bias, weights, out)
    return projected.value


def _chunked(g: _Composite, t: _Tensor, parts: int) -> list[_Tensor]:
    """``torch.chunk(t, parts, dim=-1)``: views of equal parts of the last dimension, of one split node (each part's
    gradient reaches it through a node of its own; :attr:`_GradFn.gathers`), whose backward allocates the input's
    gradient (``cat``)."""
    size = t.shape[-1] // parts
    shape, strides = t.shape[:-1] + (size,), t.value.strides or _strides(t.shape)
    split = g.node([], [_edge(t.value)], [t.nbytes], ["aten.cat.default"], t.shape, [t.shape], any_strides=True,
                   gathers=parts)
    out = []
    for _ in range(parts):
        fn = g.node([], [_fn_edge(split)], [prod(shape) * FLOAT], [None], shape, [shape])
        out.append(_Tensor(_Value(g.mem.hold(t.value.sid), prod(shape) * FLOAT, fn, view=True,
                                  strides=_normal(shape, strides)), shape))
    return out


def _heads_first(g: _Composite, t: _Tensor, heads: int) -> _Tensor:
    """``t.reshape(n, groups, tokens, heads, e / heads).permute(0, 1, 3, 2, 4)`` (the local ``t`` rebound)."""
    n, groups, tokens, e = t.shape
    split = g.view(t, (n, groups, tokens, heads, e // heads))
    g.drop(t)
    out = g.permute(split, (0, 1, 3, 2, 4))
    g.drop(split)
    return out


def _keys_unbiased(g: _Composite, bias: int, e: int) -> tuple[int, int | None]:
    """V2's ``qkv_bias = bias.clone(); qkv_bias[e:2e].zero_()``: a copy of the packed bias (parameter ``bias``), the
    keys' third zeroed in place through a slice, which torch rebases: the copy's node becomes a ``CopySlices`` (its
    backward: ``new_empty_strided`` of the bias, a ``clone`` of the slice's gradient and ``zeros_like`` of it, both
    freed). (The copy's storage, the ``CopySlices`` node.)"""
    sid = g.mem.new(3 * e * FLOAT, "aten.clone.default")
    copied = g.node([], [("param", bias)], [3 * e * FLOAT], [None], (3 * e,), [(3 * e,)])
    rebased = g.node([], [_fn_edge(copied)], [3 * e * FLOAT], ["aten.new_empty_strided.default"], (3 * e,),
                     [(3 * e,)], scratch=[(e * FLOAT, "aten.clone.default"), (e * FLOAT, "aten.zeros_like.default")])
    return sid, rebased


def _normalized(g: _Composite, t: _Tensor, dim: int = -1) -> _Tensor:
    """``F.normalize(t, dim=dim)`` (the last by default): the norm per row along ``dim`` (``linalg_vector_norm``,
    keeping ``t`` and itself; backward ``t / norm`` and ``norm == 0`` freed after ``grad * that``), clamped below
    (``clamp_min``, keeping its input; backward ``scalar_tensor``, ``gt`` and ``where``), expanded (a view; backward
    summed down) and divided by (``div.Tensor``, laid out as ``t``; backward as :func:`_quotient`'s). The gradients'
    strides are not followed past the division (their readers, a select's backward and the engine's sums, take
    any)."""
    axis = dim % len(t.shape)
    mem, rows = g.mem, t.shape[:axis] + (1,) + t.shape[axis + 1:]
    nbytes, count = prod(rows) * FLOAT, prod(rows)
    norm = mem.new(nbytes, "aten.linalg_vector_norm.default")
    norm_fn = g.node([t.value.sid, norm], [_edge(t.value)], [t.nbytes], ["aten.mul.Tensor"], rows, [t.shape],
                     before=[(t.nbytes, "aten.div.Tensor"), (count, "aten.eq.Scalar")], any_strides=True)
    clamped = mem.new(nbytes, "aten.clamp_min.default")
    clamp_fn = g.node([norm], [_fn_edge(norm_fn)], [nbytes], ["aten.where.self"], rows, [rows],
                      before=[(FLOAT, "aten.scalar_tensor.default"), (count, "aten.gt.Scalar")], any_strides=True)
    mem.drop(norm)
    expanded = g.node([], [_fn_edge(clamp_fn)], [nbytes], ["aten.sum.dim_IntList"], t.shape, [rows],
                      any_strides=True)
    sid = mem.new(t.nbytes, "aten.div.Tensor")
    before = [(t.nbytes, "aten.div.Tensor"), (t.nbytes, "aten.div.Tensor"), (t.nbytes, "aten.neg.default")]
    fn = g.node([t.value.sid, clamped], [_edge(t.value), _fn_edge(expanded)], [t.nbytes, t.nbytes],
                ["aten.div.Tensor", "aten.mul.Tensor"], t.shape, [t.shape, t.shape], order=[1, 0], before=before,
                any_strides=True)
    mem.drop(clamped)
    return _Tensor(_Value(sid, t.nbytes, fn, strides=_iterated(t.shape, [t.value.strides])), t.shape)


def _l2_normalize(ctx: _OpContext) -> _Value:
    """The op normalize (torch's F.normalize of p 2) along its dim: :func:`_normalized` of its input."""
    return _normalized(_Composite(ctx), _Tensor(ctx.x, ctx.full_in), int(ctx.node.attrs["dim"])).value


def _cosine_scores(g: _Composite, qkv: _Tensor, logit_scale: int) -> _Tensor:
    """V2's scores: ``normalize(q).matmul(normalize(k).transpose(-2, -1))`` times ``clamp(logit_scale,
    max=log 100).exp()`` (parameter ``logit_scale``, one per head: ``clamp``, freed after the ``exp``, which keeps its
    result; the product keeps both its inputs, its scale's gradient summed down)."""
    mem, heads = g.mem, qkv.shape[2]
    q = g.select(qkv, 0)
    queries = _normalized(g, q)
    k = g.select(qkv, 0)
    keys = _normalized(g, k)
    moved = g.transpose(keys, 2, 3)
    scores = g.matmul(queries, moved)
    g.drop(q, queries, k, keys, moved)
    clamped = mem.new(heads * FLOAT, "aten.clamp.default")
    clamp_fn = g.node([], [("param", logit_scale)], [heads * FLOAT], ["aten.where.self"], (heads, 1, 1),
                      [(heads, 1, 1)], before=[(FLOAT, "aten.scalar_tensor.default"), (heads, "aten.lt.Scalar")])
    scale = mem.new(heads * FLOAT, "aten.exp.default")
    exp_fn = g.node([scale], [_fn_edge(clamp_fn)], [heads * FLOAT], ["aten.mul.Tensor"], (heads, 1, 1),
                    [(heads, 1, 1)])
    mem.drop(clamped)
    sid = mem.new(scores.nbytes, "aten.mul.Tensor")
    fn = g.node([scores.value.sid, scale], [_edge(scores.value), _fn_edge(exp_fn)], [scores.nbytes, heads * FLOAT],
                ["aten.mul.Tensor"] * 2, scores.shape, [scores.shape, (heads, 1, 1)], order=[1, 0],
                full=[None, scores.nbytes])
    mem.drop(scale)
    g.drop(scores)
    return _Tensor(_Value(sid, scores.nbytes, fn), scores.shape)


def _patch_merge(ctx: _OpContext) -> _Value:
    """A Swin patch merge as ``to_torch.PatchMerge`` runs it: the map padded to even sides (a copy, even of no
    padding), each 2 x 2 patch's pixels taken by two strided slices each (views; backward: ``slice_backward`` into
    zeros of the slice's input, then of the map, the four summed by the engine), put side by side (``cat``)."""
    g = _Composite(ctx)
    batch, height, width, c = ctx.full_in
    padded = g.fresh(_Tensor(ctx.x, ctx.full_in), "constant_pad_nd.default",
                     (batch, height + height % 2, width + width % 2, c), "aten.constant_pad_nd.default")
    parts = []
    for row, column in ((0, 0), (1, 0), (0, 1), (1, 1)):
        rows = g.every_other(padded, 1, row)
        parts.append(g.every_other(rows, 2, column))
        g.drop(rows)
    sid = g.mem.new(ctx.nbytes, "aten.cat.default")
    fn = g.node([], [_edge(p.value) for p in parts], [p.nbytes for p in parts], [None] * 4, ctx.full_out,
                [p.shape for p in parts], handoff="slices")
    g.drop(*parts, padded)
    return _Value(sid, ctx.nbytes, fn)


def _rolled(g: _Composite, x: _Tensor) -> _Tensor:
    """``torch.roll`` of ``x`` (the local rebound): a new tensor; its backward rolls the gradient back (a new
    contiguous one, whatever the gradient's strides)."""
    out = g.fresh(x, "roll.default", x.shape, "aten.roll.default", any_strides=True)
    g.drop(x)
    return out


def _windows(g: _Composite, x: _Tensor, split: tuple[int, ...], shape: tuple[int, ...]) -> _Tensor:
    """``x.view(split).permute(0, 1, 3, 2, 4, 5).reshape(shape)`` (the local ``x`` rebound): a map cut into windows,
    or windows put back into a map (a copy where no view can)."""
    viewed = g.view(x, split)
    g.drop(x)
    permuted = g.permute(viewed, (0, 1, 3, 2, 4, 5))
    g.drop(viewed)
    out = g.view(permuted, shape)
    g.drop(permuted)
    return out


def _scores(g: _Composite, qkv: _Tensor) -> _Tensor:
    """``(qkv[0] * scale).matmul(qkv[1].transpose(-2, -1))``: the queries scaled (a new tensor), the keys
    transposed (a view), the scores."""
    q = g.select(qkv, 0)
    scaled = g.scaled(q)
    k = g.select(qkv, 0)
    keys = g.transpose(k, 2, 3)
    scores = g.matmul(scaled, keys)
    g.drop(q, scaled, k, keys)
    return scores


def _biased(g: _Composite, attn: _Tensor, p: dict[str, int], heads: int, tokens: int, window: tuple[int, int],
            hidden: int) -> _Tensor:
    """``attn + bias`` (the old ``attn`` dropped), the bias each head's per pair of a window's positions
    (:func:`_position_bias`): V1's, or V2's with the table made by the bias MLP (:func:`_bias_mlp`) and ``16 sigmoid``
    of the result (the sigmoid keeps its result; both freed with the table after)."""
    positions = (2 * window[0] - 1) * (2 * window[1] - 1)
    table = _bias_mlp(g, p, positions, heads, hidden) if hidden else None
    batched = _position_bias(g, ("param", p["table"]) if table is None else _edge(table.value), positions, heads,
                             tokens)
    if table is not None:
        squashed = g.fresh(batched, "sigmoid.default", batched.shape, "aten.sigmoid_backward.default", keep=True)
        scaled = g.scaled(squashed)
        g.drop(squashed, table, batched)
        batched = scaled
    out = g.add(attn, batched)
    g.drop(attn, batched)
    return out


def _position_bias(g: _Composite, table: tuple[str, int] | None, positions: int, heads: int,
                   tokens: int) -> _Tensor:
    """``table[index].view(T, T, -1).permute(2, 0, 1).contiguous().unsqueeze(0)`` (the table's gradient goes to
    ``table``): the pick is ``index`` (backward: ``new_zeros`` of the table, ``index_put`` into it), made contiguous
    (a copy, the pick freed)."""
    picked_shape = (tokens * tokens, heads)
    sid = g.mem.new(prod(picked_shape) * FLOAT, "aten.index.Tensor")
    fn = g.node([], [table], [positions * heads * FLOAT], ["aten.index_put.default"], picked_shape,
                [(positions, heads)], before=[(positions * heads * FLOAT, "aten.new_zeros.default")], any_strides=True)
    picked = _Tensor(_Value(sid, prod(picked_shape) * FLOAT, fn), picked_shape)
    square = g.view(picked, (tokens, tokens, heads))
    g.drop(picked)
    permuted = g.permute(square, (2, 0, 1))
    g.drop(square)
    bias = g.contiguous(permuted)
    g.drop(permuted)
    batched = g.view(bias, (1, heads, tokens, tokens))
    g.drop(bias)
    return batched


def _bias_mlp(g: _Composite, p: dict[str, int], positions: int, heads: int, hidden: int) -> _Tensor:
    """V2's table of biases: ``cpb_mlp(relative_coords_table).view(-1, heads)``, the coordinates a buffer (no
    gradient): a linear layer (``addmm`` of the rows, viewed back), a ReLU in place on that view (torch rebases it:
    :func:`_rebased_view`), a linear layer without a bias (``mm``), the view."""
    coords = _Tensor(_Value(g.mem.new_id(), positions * 2 * FLOAT, None), (1, positions, 2))
    g.mem.holders[coords.value.sid] = 1  # a buffer of the setup's: never freed here
    hidden_out = g.linear(coords, hidden, True, p["mlp"])
    _rebased_view(g, hidden_out, "aten.threshold_backward.default")
    out = g.linear(hidden_out, heads, False, p["mlp_out"])
    g.drop(hidden_out)
    table = g.view(out, (positions, heads))
    g.drop(out)
    return table


def _rebased_view(g: _Composite, t: _Tensor, kernel: str) -> None:
    """An in-place activation (backward ``kernel``, which reads its result) on ``t``, a folded linear layer's view of
    its ``addmm`` that nothing has read yet, as :func:`_rebased` writes one down: the view's node replaced by a
    ``new_zeros`` one, the ``addmm``'s output's by a ``CopySlices`` that keeps the result."""
    fns = g.ctx.fns
    if t.value.fn != len(fns) - 1:
        raise NotCovered("an in-place activation on a view read before")
    base = fns.pop().edges[0]
    copy = g.node([t.value.sid], [base], [t.nbytes], ["aten.new_empty_strided.default"], t.shape, [t.shape],
                  scratch=[(t.nbytes, "aten.clone.default"), (t.nbytes, kernel)])
    t.value.fn = g.node([], [_fn_edge(copy)], [t.nbytes], ["aten.new_zeros.default"], t.shape, [t.shape])


def _masked(g: _Composite, attn: _Tensor, split: tuple[int, ...], padded: tuple[int, int],
            window: tuple[int, int]) -> _Tensor:
    """A shifted window's mask added: ``attn.view(N, windows, heads, T, T) + mask``, viewed back. The mask needs no
    gradient: zeros of the padded map (``new_zeros``), nine regions filled (a 4-byte ``scalar_tensor`` each, freed at
    once), cut into windows (a copy where no view can), the pairwise difference (``sub``), then ``masked_fill`` of
    ``ne`` and of ``eq`` (one-byte masks), all freed after the add."""
    mem, (ph, pw), (wh, ww) = g.mem, padded, window
    _, windows, heads, tokens, _ = split
    viewed = g.view(attn, split)
    g.drop(attn)
    zeros = mem.new(ph * pw * FLOAT, "aten.new_zeros.default")
    for _ in range(9):
        mem.drop(mem.new(FLOAT, "aten.scalar_tensor.default"))
    cut_shape = (ph // wh, pw // ww, wh, ww)  # the mask viewed as windows, permuted: (rows, columns, wh, ww)
    cut = _view(cut_shape, _normal(cut_shape, (wh * pw, ww, pw, 1)), (windows, tokens))[0]
    if not cut:
        mask = mem.new(ph * pw * FLOAT, "aten.clone.default")
        mem.drop(zeros)
    else:
        mask = zeros
    pairs = windows * tokens * tokens
    diff = mem.new(pairs * FLOAT, "aten.sub.Tensor")
    mem.drop(mask)
    differs = mem.new(pairs, "aten.ne.Scalar")
    first = mem.new(pairs * FLOAT, "aten.masked_fill.Scalar")
    mem.drop(differs)
    equal = mem.new(pairs, "aten.eq.Scalar")
    second = mem.new(pairs * FLOAT, "aten.masked_fill.Scalar")
    for sid in (equal, first, diff):
        mem.drop(sid)
    mask_value = _Tensor(_Value(second, pairs * FLOAT, None), (1, windows, 1, tokens, tokens))
    summed = g.add(viewed, mask_value)
    g.drop(mask_value, viewed)
    out = g.view(summed, (split[0] * windows, heads, tokens, tokens))
    g.drop(summed)
    return out


#: op -> the handler that runs it forward ("input" is the caller's).
_HANDLERS: dict[str, Callable[[_OpContext], _Value]] = {
    **dict.fromkeys(("conv2d", "batchnorm2d", "groupnorm", "linear",
                     "conv_transpose2d"), _with_parameters),
    "rmsnorm": _with_parameters,
    **dict.fromkeys(("relu", "relu6", "dropout", *_ACTIVATIONS), _activation),
    **dict.fromkeys(("pow", "exp", "abs", "log"), _maths),
    "normalize": _l2_normalize,
    "logsumexp": _logsumexp,
    "cumsum": _cumsum,
    "where": _where,
    "affine_grid": _affine_grid,
    "grid_sample": _grid_sample,
    "sort": _sorted, "topk": _sorted,
    "unfold": _im2col,
    "fold": _im2col,
    "div": _quotient,
    "matmul": _matrix_product,
    "var": _variance,
    **dict.fromkeys(("maxpool2d", "adaptivemaxpool2d", "fractional_maxpool2d", "avgpool2d", "adaptiveavgpool2d",
                     "mean"), _pooling),
    **dict.fromkeys(("add", "mul", "cat"), _combine),
    "interpolate": _interpolate,
    **dict.fromkeys(("softmax", "log_softmax"), _softmax),
    "prelu": _prelu,
    "glu": _glu,
    "dropout2d": _dropout2d,
    "instancenorm": _instance_norm,
    "permute": _permute,
    "layernorm": _layer_norm,
    "scale": _scale,
    "shift": _shift,
    "token": _token,
    "attention": _attention,
    "window_attention": _window_attention,
    "patch_merge": _patch_merge,
    "group_attention": _group_attention,
    **dict.fromkeys(("pad", "pixel_shuffle", "pixel_unshuffle"), _rearrange),
    "repeat": _tiling,
    **dict.fromkeys(("flip", "roll"), _reordered_copy),
    **dict.fromkeys(("maximum", "minimum"), _extreme),
    "weighted_sum": _weighted_sum,
    "rrelu": _rrelu,
    "alpha_dropout": _alpha_dropout,
    "frozen_batchnorm2d": _frozen_batch_norm,
    **dict.fromkeys((*_VIEWS, "transpose", "select", "narrow", "identity"), _view_op),
}


def _loss(out: _Value, positions: int, mem: _Memory, fns: list[_GradFn]) -> tuple[int, int, int]:
    """Cross entropy of the logits ``out``: a classifier's (``positions`` 0: reshaped to [N, -1], a view) or a class
    score per pixel (2 positions: [N, C, H, W], NLL's 2-D kernels); (logits storage, loss storage, NLL node)."""
    if out.fn is None:
        raise NotCovered("the network's output needs no gradient")
    if positions not in (0, 2):
        raise NotCovered(f"a loss over {positions} positions per class score")
    nll, edge = "nll_loss" if positions == 0 else "nll_loss2d", _edge(out)
    if positions == 0:  # the reshape to [N, -1]
        fns.append(_GradFn([], [edge], [out.nbytes], [None], [0], [None], "view"))
        edge = ("fn", len(fns) - 1)
    logsm = mem.new(out.nbytes, "aten._log_softmax.default", holders=0)
    fns.append(_GradFn([mem.hold(logsm)], [edge], [out.nbytes], ["aten._log_softmax_backward_data.default"], [0],
                       [None]))
    loss = mem.new(FLOAT, f"aten.{nll}_forward.default")
    total_weight = mem.new(FLOAT, f"aten.{nll}_forward.default", holders=0)
    fns.append(_GradFn([mem.hold(logsm), mem.hold(total_weight)], [("fn", len(fns) - 1)], [out.nbytes],
                       [f"aten.{nll}_backward.default"], [0], [None]))
    return out.sid, loss, len(fns) - 1


def _target_bytes(desc: NetworkDescription, b: int, loss_name: str) -> int:
    """Bytes of what the loss compares the output with at batch size ``b``: a cross entropy's int64 labels (one per
    image, or per position), an MSE's or an L1 loss's float32 target of the output's shape."""
    if loss_name == DEFAULT_LOSS:
        return b * prod(desc.label_shape) * INT64
    return b * prod(desc.node(desc.output).output_shape) * FLOAT


def _regression_loss(out: _Value, loss_name: str, mem: _Memory, fns: list[_GradFn]) -> tuple[int, int, int]:
    """An MSE or L1 loss (mean reduction) of the output ``out`` against a float target of its shape, which the caller
    holds; (output storage, loss storage, the loss's root node). MSE is one kernel each way: a 4-byte loss (it keeps
    the output and the target), and the output's gradient. L1 is composite: ``sub`` (kept by ``abs``), ``abs`` (freed
    after the ``mean``), ``mean``; backward, the mean's gradient (``div`` of the seed expanded), ``abs``'s (``sgn`` of
    the kept difference, then ``mul``, the ``sgn`` freed), handed on through the ``sub`` to the output."""
    if out.fn is None:
        raise NotCovered("the network's output needs no gradient")
    edge = _edge(out)
    if loss_name == "mse":
        loss = mem.new(FLOAT, "aten.mse_loss.default")
        fns.append(_GradFn([mem.hold(out.sid)], [edge], [out.nbytes], ["aten.mse_loss_backward.default"], [0],
                           [None]))
        return out.sid, loss, len(fns) - 1
    diff = mem.new(out.nbytes, "aten.sub.Tensor", holders=0)
    fns.append(_GradFn([], [edge], [out.nbytes], [None], [0], [None]))  # sub: the gradient handed on as it is
    fns.append(_GradFn([mem.hold(diff)], [("fn", len(fns) - 1)], [out.nbytes], ["aten.sgn.default"], [0],
                       [out.nbytes], then="aten.mul.Tensor"))
    magnitude = mem.new(out.nbytes, "aten.abs.default")
    loss = mem.new(FLOAT, "aten.mean.default")
    mem.drop(magnitude)
    fns.append(_GradFn([], [("fn", len(fns) - 1)], [out.nbytes], ["aten.div.Scalar"], [0], [None]))
    return out.sid, loss, len(fns) - 1


def _gradients_per_parameter(fns: list[_GradFn]) -> dict[int, int]:
    """Parameter index -> how many backward nodes compute a gradient of it (more than one for a layer called more
    than once: its ``AccumulateGrad`` waits for them all)."""
    counts: dict[int, int] = {}
    for fn in fns:
        for edge in fn.edges:
            if edge is not None and edge[0] == "param":
                counts[edge[1]] = counts.get(edge[1], 0) + 1
    return counts


def _param_gradient(p: int, sid: int, size: int, pending: dict[int, int], buffers: dict[int, int],
                    mem: _Memory) -> list[int]:
    """Deliver ``sid`` (``size`` bytes), a gradient of parameter ``p``, to the parameter's input buffer: the first
    one is kept as it is; a later one (a layer called again) is added to it out of place (the engine's sum, the
    buffer's old value dropped at once), and is returned: the node that computed it drops it with its other
    outputs, after all its gradients are delivered (as the meta trace shows)."""
    pending[p] -= 1
    if p not in buffers:
        buffers[p] = sid
        return []
    old = buffers[p]
    buffers[p] = mem.new(size, "aten.add.Tensor")
    mem.drop(old)
    return [sid]


def _backward(fns: list[_GradFn], root: int, mem: _Memory) -> dict[int, int]:
    """Run the backward pass from the loss's node ``root``; parameter index -> its gradient's storage.

    Gradients carry their strides (None: contiguous; :data:`_UNKNOWN` after a sum of two tensors of
    which one is permuted): a view op's backward reshapes its gradient, which copies it where no
    view has the strides; transpose and cat hand on views of it (transposed, sliced).
    One loop over thousands of nodes (a MaxViT's 1,400): the memory's methods bound once, and no list made for a
    node's temporaries, sums or gathered parts where it has none."""
    seed = mem.new(FLOAT, "aten.ones_like.default")
    buffers: dict[int, tuple[int, int, tuple[int, ...] | None]] = {root: (mem.hold(seed), FLOAT, None)}
    grads: dict[int, int] = {}
    pending = _gradients_per_parameter(fns)
    buffers_of_params: dict[int, int] = {}  # parameter index -> its gradient so far (a layer called more than once)
    gathered: dict[int, list[int]] = {}  # a split's node -> its parts' gradients after the first (``gathers``)
    new, drop = mem.new, mem.drop
    for k in range(len(fns) - 1, -1, -1):
        entry = buffers.pop(k, None)
        if entry is None:
            raise NotCovered("a node no gradient reaches")
        incoming, _, strides = entry
        fn = fns[k]
        if strides is not None and (strides == _UNKNOWN or (any(fn.kernels) and not fn.any_strides
                                                           and not _ordered(fn.out_shape, strides))):
            raise NotCovered("a gradient with permuted strides")
        edges = fn.edges
        if len(edges) == 1 and fn.kernels[0] is None and edges[0] is not None and edges[0][0] == "fn" and \
                fn.full[0] is None and not (fn.saved or fn.scratch or fn.before or fn.around or fn.gathers) and \
                k not in gathered:  # the incoming gradient handed on to one node (a view, a permute): as below
            sid, out_strides = _handoff(fn, 0, incoming, strides, mem)
            drop(incoming)
            target = edges[0][1]
            if target not in buffers:
                buffers[target] = (sid, fn.sizes[0], out_strides)
            elif fns[target].gathers:
                gathered.setdefault(target, []).append(sid)
            else:
                old, size, old_strides = buffers[target]
                buffers[target] = (new(size, "aten.add.Tensor"), size,
                                   _summed_strides(fn.shapes[0] if fn.shapes else (), old_strides, out_strides))
                drop(old)
                drop(sid)
            continue
        outs = _gradients_of(fn, incoming, strides, mem)
        if fn.scratch:
            temporaries = [new(size, kernel) for size, kernel in fn.scratch]
            for sid in temporaries:
                drop(sid)
        full = fn.full
        if full.count(None) != len(full):
            for j in sorted(outs):  # broadcast inputs: their gradients summed down to their shapes (input order)
                if full[j] is not None:
                    summed = new(fn.sizes[j], fn.then)
                    drop(outs[j][0])
                    outs[j] = (summed, None)
        drop(incoming)
        parts = gathered.pop(k, ())
        if len(parts) + 1 != max(fn.gathers, 1):
            raise NotCovered("a split whose parts' gradients do not all arrive")
        for sid in parts:
            drop(sid)
        for s in fn.saved:
            drop(s)
        accumulated, released = [], []
        for j, edge in enumerate(fn.edges):
            if edge is None:
                continue
            kind, target = edge
            sid, out_strides = outs[j]
            if kind == "param":
                restrided = bool(fn.restride and fn.restride[j])
                if restrided and pending[target] > 1:
                    raise NotCovered("a gradient of a shared parameter with other strides than the parameter's")
                released += _param_gradient(target, sid, fn.sizes[j], pending, buffers_of_params, mem)
                if pending[target] == 0:
                    accumulated.append((target, buffers_of_params.pop(target), restrided, fn.sizes[j]))
            elif target not in buffers:
                buffers[target] = (sid, fn.sizes[j], out_strides)
            elif fns[target].gathers:
                gathered.setdefault(target, []).append(sid)
            else:
                old, size, old_strides = buffers[target]
                shape = fn.shapes[j] if fn.shapes else ()
                buffers[target] = (new(size, "aten.add.Tensor"), size, _summed_strides(shape, old_strides,
                                                                                     out_strides))
                drop(old)
                released.append(sid)
        for sid in released:  # the node's gradients added into a buffer: its outputs, dropped when it is done
            drop(sid)
        for p, sid, restrided, size in accumulated:  # AccumulateGrad nodes run first (highest priority)
            if restrided:  # copied into a tensor of the parameter's strides, which becomes the .grad
                kept = new(size, "aten.new_empty_strided.default")
                drop(sid)
                sid = kept
            mem.events.append((ACCUMULATED, p, 0, ""))
            grads[p] = sid
    if buffers:
        raise NotCovered("gradients left undelivered")
    mem.drop(seed)
    return grads


def _gradients_of(fn: _GradFn, incoming: int, strides: tuple[int, ...] | None,
                  mem: _Memory) -> dict[int, tuple[int, tuple[int, ...] | None]]:
    """The gradients node ``fn`` computes from ``incoming`` (of ``strides``), in its order: input index -> (storage,
    its strides); its temporaries allocated and freed around them (``before``: until the first gradient; ``around``:
    each gradient's own)."""
    new, drop = mem.new, mem.drop
    outs: dict[int, tuple[int, tuple[int, ...] | None]] = {}
    ahead = [new(size, kernel) for size, kernel in fn.before] if fn.before else None
    edges, kernels, around = fn.edges, fn.kernels, fn.around
    for j in fn.order:
        if edges[j] is None:
            continue
        temporaries = [new(size, kernel) for size, kernel in around[j]] if around else None
        if kernels[j]:
            outs[j] = (new(fn.full[j] or fn.sizes[j], kernels[j]), _laid_out(fn, j, strides) if fn.layouts else None)
        else:
            outs[j] = _handoff(fn, j, incoming, strides, mem)
        if temporaries:
            for sid in reversed(temporaries):
                drop(sid)
        if ahead:
            for sid in ahead:
                drop(sid)
            ahead = None
    return outs


#: The strides of a gradient summed from a permuted one: not followed (a view of it is not covered).
_UNKNOWN: tuple[int, ...] = ()


def _summed_strides(shape: tuple[int, ...], old: tuple[int, ...] | None,
                    new: tuple[int, ...] | None) -> tuple[int, ...] | None:
    """The strides of the engine's sum ``old + new`` of two gradients of ``shape``: contiguous where both lie in
    their own order, as TensorIterator lays out two dense ones, else :data:`_UNKNOWN`."""
    if _ordered(shape, old) and _ordered(shape, new):
        return None
    if _UNKNOWN in (old, new) or not (_dense(shape, old) and _dense(shape, new)):
        return _UNKNOWN
    return _iterated(shape, [old, new])


def _laid_out(fn: _GradFn, j: int, incoming: tuple[int, ...] | None) -> tuple[int, ...] | None:
    """The strides of gradient ``j`` that ``fn``'s kernel allocates (:attr:`_GradFn.layouts`), the incoming gradient's
    strides being ``incoming``."""
    layout = fn.layouts[j] if fn.layouts else None
    if layout is None:
        return None
    kind, strides = layout
    if kind == "fixed":
        return strides
    if kind == "like" and incoming is not None and 1 in fn.out_shape:
        raise NotCovered("a layer norm's gradient laid out by strides along dimensions of size 1")
    if not _dense(fn.out_shape, incoming):
        raise NotCovered("an elementwise kernel of a gradient that is not dense")
    return _iterated(fn.out_shape, [incoming] + list(strides))


def _handoff(fn: _GradFn, j: int, incoming: int, strides: tuple[int, ...] | None,
             mem: _Memory) -> tuple[int, tuple[int, ...] | None]:
    """Gradient ``j`` of a node without kernels: the incoming one (``strides``) or a view of it, or a
    copy where a view op's reshape cannot be a view; (storage, its strides)."""
    if fn.handoff == "" or (fn.handoff == "view" and strides is None):  # as it is, or a view of it
        return mem.hold(incoming), strides
    if strides is not None and not fn.shapes:
        raise NotCovered("a strided gradient through the loss")
    if fn.handoff == "slices":
        return mem.hold(incoming), strides or _strides(fn.out_shape)
    if fn.handoff == "permute":  # permuted back: dimension perm[i] of the input is dimension i of the output
        back = [0] * len(fn.perm)
        for i, d in enumerate(fn.perm):
            back[d] = (strides or _strides(fn.out_shape))[i]
        return mem.hold(incoming), _normal(fn.shapes[j], tuple(back))
    if fn.handoff == "transpose":
        d0, d1 = fn.dims
        swapped = list(strides or _strides(fn.out_shape))
        swapped[d0], swapped[d1] = swapped[d1], swapped[d0]
        return mem.hold(incoming), _normal(fn.shapes[j], tuple(swapped))
    viewable, out = _view(fn.out_shape, strides, fn.shapes[j])
    if viewable:
        return mem.hold(incoming), out
    return mem.new(fn.sizes[j], "aten.clone.default"), None
