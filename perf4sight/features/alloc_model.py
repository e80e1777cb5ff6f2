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

from perf4sight.features.alloc_repeat import _REPEATED, _repeated
from perf4sight.features.alloc_strides import (_broadcast_strides, _channels_last, _channels_last_like, _dense,
                                               _iterated, _iterated_full, _normal, _ordered, _strides, _view)
from perf4sight.features.alloc_values import (_ACTIVATIONS, _BACKWARD_OF, _VIEWS, ACCUMULATED, FLOAT, INT64, Event,
                                              NotCovered, _edge, _fn_edge, _full_strides, _GradFn, _Memory, _OpContext,
                                              _params, _Value, _window_parameters)
from perf4sight.features.step_runtime import CLONED_IN_PLACE
from perf4sight.ir.schema import CONSTANT_MODES, SHARES, NetworkDescription, Node, where_condition_inputs
from perf4sight.ir.shapes import SIZE_REFERENCES, broadcast, window_pair, windows_of
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

#: Ops whose handlers lay out their outputs along every dimension (:attr:`_Value.raw`): fresh contiguous outputs
#: (a convolution's on the meta device, a layer norm's, a linear layer's, attention's), or the input's own layout.
_LAID_OUT = {"conv2d", "conv_transpose2d", "layernorm", "linear", "attention", "permute", "scale", "shift",
             "identity"}


def _lays_out(n: Node) -> bool:
    """Whether node ``n``'s handler follows its output's strides along dimensions of size 1 (:data:`_LAID_OUT`, an
    add of two tensors, an input handed back by a dropout of ``p`` 0)."""
    return n.op in _LAID_OUT or (n.op == "add" and n.attrs.get("scalar") is None) or \
        (n.op in ("dropout", "dropout2d") and float(n.attrs["p"]) == 0)


def _with_parameters(ctx: _OpContext) -> _Value:
    """conv2d, conv_transpose2d, batchnorm2d, groupnorm, rmsnorm, linear: the layers with parameters (each parameter's
    gradient: its bytes)."""
    n, x, nbytes = ctx.node, ctx.x, ctx.nbytes
    pbytes, _ = _params(n)
    pedges = [("param", ctx.first_param + k) for k in range(len(pbytes))]
    if n.op in ("conv2d", "conv_transpose2d"):  # aten.convolution, transposed or not: keeps its input
        sid = ctx.alloc("convolution.default")
        grads = ["aten.convolution_backward.default"] * (1 + len(pbytes))
        layouts, restride = _convolution_layouts(ctx)
        return _Value(sid, nbytes, ctx.grad_fn([x.sid], [_edge(x)] + pedges, [x.nbytes] + pbytes, grads,
                                               layouts=layouts, restride=restride, any_strides=True))
    # the output, a mean and a 1/std; keeps the input and the two (a batch norm by its running statistics too: the
    # meta kernel gives it [C] floats each, where this CPU's gives empty ones)
    if n.op in ("batchnorm2d", "groupnorm"):
        kernel, stat = (("native_batch_norm", n.attrs["num_features"]) if n.op == "batchnorm2d"  # per channel
                        else ("native_group_norm", ctx.batch * n.attrs["num_groups"]))  # per sample and group
        sid = ctx.alloc(f"{kernel}.default")
        stats = [ctx.alloc(f"{kernel}.default", stat * FLOAT, holders=0) for _ in range(2)]
        grads = [f"aten.{kernel}_backward.default"] * (1 + len(pbytes))
        return _Value(sid, nbytes, ctx.grad_fn([x.sid] + stats, [_edge(x)] + pedges, [x.nbytes] + pbytes, grads))
    if n.op == "rmsnorm":  # CUDA's _fused_rms_norm: the output and a 1/rms per row; keeps the input and the latter
        rows = ctx.batch * prod(ctx.in_shapes[0][:len(ctx.in_shapes[0]) - len(n.attrs["normalized_shape"])])
        sid = ctx.alloc("_fused_rms_norm.default")
        rstd = ctx.alloc("_fused_rms_norm.default", rows * FLOAT, holders=0)
        grads = ["aten._fused_rms_norm_backward.default"] * (1 + len(pbytes))
        return _Value(sid, nbytes, ctx.grad_fn([x.sid, rstd], [_edge(x)] + pedges, [x.nbytes] + pbytes, grads))
    if n.op == "linear":
        if len(ctx.in_shapes[0]) != 1 and not n.attrs["bias"]:
            return _matmul_folded(ctx, pedges, pbytes)
        if len(ctx.in_shapes[0]) != 1:
            return _linear_folded(ctx, pedges, pbytes)
        t = ctx.grad_fn([], [pedges[0]], [pbytes[0]], [None], handoff="view")  # weight.t()
        if n.attrs["bias"]:  # addmm(bias, x, weight.t()): the bias gradient is the incoming one summed down
            sid = ctx.alloc("addmm.default")
            fin, fout = n.attrs["in_features"], n.attrs["out_features"]  # each edge's shape: the bias's, x's, w.t()'s
            return _Value(sid, nbytes, ctx.grad_fn([x.sid], [pedges[1], _edge(x), ("fn", t)],
                                                   [pbytes[1], x.nbytes, pbytes[0]],
                                                   [None, "aten.mm.default", "aten.mm.default"], [0, 1, 2],
                                                   [nbytes, None, None],
                                                   shapes=[(fout,), tuple(ctx.full_in), (fin, fout)]))
        sid = ctx.alloc("mm.default")  # mm(x, weight.t()): the weight's gradient comes first
        grads = ["aten.mm.default", "aten.mm.default"]
        edges, sizes, order = [_edge(x), ("fn", t)], [x.nbytes, pbytes[0]], [1, 0]
        return _Value(sid, nbytes, ctx.grad_fn([x.sid], edges, sizes, grads, order))
    raise NotCovered(f"op '{n.op}'")


def _convolution_layouts(ctx: _OpContext) -> tuple[list, list[bool]]:
    """The strides of a convolution's gradients (input, weight, bias) as the meta kernel lays them out, and which
    of them AccumulateGrad copies to its parameter's strides. The forward's output is contiguous whatever the input;
    the backward's input and weight gradients are channels-last where the input (or the weight) suggests it, the
    bias's contiguous; a channels-last gradient of a weight whose channels-last strides are not its own (a kernel
    wider than 1 x 1 over more than one input channel per group) is copied."""
    weight = _weight_shape(ctx.node)
    if not (ctx.channels_last(ctx.x) or _channels_last_like(weight, None)):
        return [None] * (1 + len(_params(ctx.node)[0])), [False] * (1 + len(_params(ctx.node)[0]))
    layouts = [("fixed", _normal(ctx.full_in, _channels_last(ctx.full_in))),
               ("fixed", _normal(weight, _channels_last(weight)))]
    restride = [False, layouts[1][1] is not None]
    if ctx.node.attrs["bias"]:
        layouts.append(None)
        restride.append(False)
    return layouts, restride


def _weight_shape(node: Node) -> tuple[int, int, int, int]:
    """A convolution's weight shape: [Cout, Cin / groups, kh, kw] ([Cin, Cout / groups, kh, kw] transposed)."""
    a = node.attrs
    kh, kw = a["kernel_size"]
    if node.op == "conv_transpose2d":
        return a["in_channels"], a["out_channels"] // a["groups"], kh, kw
    return a["out_channels"], a["in_channels"] // a["groups"], kh, kw


def _matmul_folded(ctx: _OpContext, pedges: list, pbytes: list[int]) -> _Value:
    """A linear layer without a bias on a contiguous tensor of more than two dimensions: torch's ``matmul(x,
    weight.t())``, the weight transposed first (a view), the input folded into rows (a view), ``mm`` (it keeps the
    rows), the result viewed back. Backward: the output's view reshapes the incoming gradient into rows (a copy where
    it is permuted), then ``mm``'s: the weight's gradient first, then the input's. A strided input not covered."""
    x, nbytes = ctx.x, ctx.nbytes
    if x.strides is not None:
        raise NotCovered("linear without a bias on a strided tensor of more than two dimensions")
    rows = prod(ctx.full_in[:-1])
    folded_in, folded_out = (rows, ctx.full_in[-1]), (rows, ctx.full_out[-1])
    t = ctx.grad_fn([], [pedges[0]], [pbytes[0]], [None], handoff="view")  # weight.t()
    viewed = ctx.grad_fn([], [_edge(x)], [x.nbytes], [None], handoff="view", out_shape=folded_in)
    sid = ctx.alloc("mm.default")
    mm = ctx.grad_fn([x.sid], [_fn_edge(viewed), ("fn", t)], [x.nbytes, pbytes[0]], ["aten.mm.default"] * 2, [1, 0],
                     out_shape=folded_out, shapes=[folded_in, folded_in[1:] + folded_out[1:]], any_strides=True)
    out = ctx.grad_fn([], [_fn_edge(mm)], [nbytes], [None], handoff="view", shapes=[folded_out])
    return _Value(sid, nbytes, out, view=True)


def _linear_folded(ctx: _OpContext, pedges: list, pbytes: list[int]) -> _Value:
    """A linear layer on a tensor of more than two dimensions, as torch folds it where the input is contiguous and
    there is a bias: the input viewed as [rows, in_features], ``addmm``, the result viewed back. Backward: the
    output's view reshapes the incoming gradient to [rows, out_features] (a copy where no view can: a permuted one,
    but at a batch of 1), then ``addmm``'s as a 2-D linear layer's (its products read any strides). Without a bias:
    :func:`_matmul_folded`; a strided input not covered."""
    x, nbytes = ctx.x, ctx.nbytes
    if x.strides is not None:
        raise NotCovered("linear on a strided tensor of more than two dimensions")
    rows = prod(ctx.full_in[:-1])
    folded_in, folded_out = (rows, ctx.full_in[-1]), (rows, ctx.full_out[-1])
    viewed = ctx.grad_fn([], [_edge(x)], [x.nbytes], [None], handoff="view", out_shape=folded_in)
    t = ctx.grad_fn([], [pedges[0]], [pbytes[0]], [None], handoff="view")  # weight.t()
    sid = ctx.alloc("addmm.default")
    edge = None if viewed is None else ("fn", viewed)
    addmm = ctx.grad_fn([x.sid], [pedges[1], edge, ("fn", t)], [pbytes[1], x.nbytes, pbytes[0]],
                        [None, "aten.mm.default", "aten.mm.default"], [0, 1, 2], [nbytes, None, None],
                        out_shape=folded_out, shapes=[folded_out[1:], folded_in, folded_in[1:] + folded_out[1:]],
                        any_strides=True)
    out = ctx.grad_fn([], [("fn", addmm)], [nbytes], [None], handoff="view", shapes=[folded_out])
    return _Value(sid, nbytes, out, view=True)


def _activation(ctx: _OpContext) -> _Value:
    """relu and relu6 (in place), any activation of :data:`_INPLACE_BACKWARD` in place where its node says so (a
    leaky relu, an elu, a mish, a SiLU, a hardswish, ``y.sigmoid_()``; the input's later readers then read its
    result), the out-of-place activations (:data:`_ACTIVATIONS`), dropout."""
    n, x, nbytes, op = ctx.node, ctx.x, ctx.nbytes, ctx.node.op
    if n.attrs.get("on_copy"):
        return _on_copy(ctx)
    if op in ("relu", "relu6") or op in _INPLACE_BACKWARD and n.attrs.get("inplace"):
        # in place, keeps its result (or a clone of its input: a mish's, a threshold's, a SiLU's, a hardswish's, a
        # hardsigmoid's, ``relu6_clone``'s of ReLU6 and hardtanh)
        rebased = x.view and x.base_fn is not None and x.fn == len(ctx.fns) - 1  # nothing has read the view yet
        if x.fn is None or (x.view and not rebased) or x.sid in ctx.mem.saved:
            raise NotCovered(f"in-place {op} on '{n.inputs[0]}'")
        kernel = _INPLACE_BACKWARD[op]
        clone = op in CLONED_IN_PLACE or op in ("relu6", "hardtanh") and ctx.relu6_clone
        kept = ctx.alloc("clone.default", x.nbytes, holders=0) if clone else x.sid
        if rebased:
            return _rebased(ctx, kernel, kept)
        x.fn = ctx.unary_grad_fn(kernel, [kept])  # the input's later readers read the result (``y + y.relu()``)
        return _Value(ctx.mem.hold(x.sid), x.nbytes, x.fn)
    if op in _ACTIVATIONS:
        name, keeps = _ACTIVATIONS[op]
        sid = ctx.alloc(name + ".default")
        return _Value(sid, nbytes, ctx.unary_grad_fn(f"aten.{_BACKWARD_OF.get(name, name)}_backward.default",
                                                     [x.sid if keeps == "input" else sid]))
    if op == "dropout":  # the fused CUDA kernel: the output, then a one-byte mask (kept)
        if float(n.attrs["p"]) == 0:
            return _handed_back(ctx)
        if not 0 < float(n.attrs["p"]) < 1:
            raise NotCovered("dropout with p 1")
        sid = ctx.alloc("native_dropout.default")
        mask = ctx.alloc("native_dropout.default", nbytes // FLOAT, holders=0)
        return _Value(sid, nbytes, ctx.unary_grad_fn("aten.native_dropout_backward.default", [mask]))
    raise NotCovered(f"op '{op}'")


def _on_copy(ctx: _OpContext) -> _Value:
    """An activation in place on a copy of its input (``on_copy``: ``y.clone().leaky_relu_()``): the copy
    (``clone``, whose backward hands the gradient on), then the activation written into it, keeping the copy, or a
    clone of it (a mish's, a threshold's, ``relu6_clone``'s hardtanh's) made before it runs; an rrelu keeps the copy
    and its noise (``empty_like``, allocated before it runs). Of an input that needs no gradient (the network's),
    nothing is kept: a threshold's and a hardtanh's clone is not made, a mish's (its kernel's) and an rrelu's noise
    are, freed once it has run."""
    op = ctx.node.op
    copy = ctx.alloc("clone.default")
    copied = ctx.unary_grad_fn(None, [])
    if op == "rrelu":
        noise = ctx.alloc("empty_like.default", holders=0)
        fn = ctx.grad_fn([copy, noise], [_fn_edge(copied)], [ctx.nbytes], ["aten.rrelu_with_noise_backward.default"])
        return _Value(copy, ctx.nbytes, fn)
    clone = op == "mish" or copied is not None and (op == "threshold" or op == "hardtanh" and ctx.relu6_clone)
    kept = ctx.alloc("clone.default", holders=0) if clone else copy
    fn = ctx.grad_fn([kept], [_fn_edge(copied)], [ctx.nbytes], [_INPLACE_BACKWARD[op]])
    return _Value(copy, ctx.nbytes, fn)


#: Elementwise maths of one tensor (op, or pow's exponent) -> (its aten op, what its backward keeps: the "input" or
#: the "result", the aten ops of the temporaries it allocates before the gradient and frees once that is made, the
#: aten op of the gradient).
_MATHS_KERNELS = {
    "exp": ("exp.default", "result", (), "aten.mul.Tensor"),  # grad * result
    "abs": ("abs.default", "input", ("aten.sgn.default",), "aten.mul.Tensor"),  # grad * sgn(x)
    "log": ("log.default", "input", (), "aten.div.Tensor"),  # grad / x
    0.5: ("sqrt.default", "result", ("aten.mul.Scalar",), "aten.div.Tensor"),  # grad / (2 * result)
    -1.0: ("reciprocal.default", "result", ("aten.mul.Tensor", "aten.neg.default"), "aten.mul.Tensor"),  # -grad *
    # result ** 2
    -0.5: ("rsqrt.default", "result", ("aten.pow.Tensor_Scalar", "aten.mul.Scalar"), "aten.mul.Tensor"),  # (-0.5 *
    # grad) * result ** 3
    "pow": ("pow.Tensor_Scalar", "input", ("aten.pow.Tensor_Scalar", "aten.mul.Scalar"), "aten.mul.Tensor"),  # grad *
    # (p * x ** (p - 1))
}


def _maths(ctx: _OpContext) -> _Value:
    """A power (sqrt, rsqrt and reciprocal: their own kernels), exp, abs or log of a tensor (:data:`_MATHS_KERNELS`)."""
    n, x = ctx.node, ctx.x
    key: str | float = n.op
    if n.op == "pow":
        exponent = float(n.attrs["exponent"])
        if exponent == 0:  # torch's backward is zeros of the input's shape
            raise NotCovered("pow of exponent 0")
        key = exponent if exponent in (0.5, -0.5, -1.0) else "pow"
    kernel, keeps, before, grad = _MATHS_KERNELS[key]
    sid = ctx.alloc(kernel)
    fn = ctx.grad_fn([x.sid if keeps == "input" else sid], [_edge(x)], [x.nbytes], [grad],
                     before=[(ctx.nbytes, k) for k in before])
    return _Value(sid, ctx.nbytes, fn)


#: An in-place activation -> the aten op its backward allocates the input's gradient with.
_INPLACE_BACKWARD = {"relu": "aten.threshold_backward.default", "relu6": "aten.hardtanh_backward.default",
                     "leaky_relu": "aten.leaky_relu_backward.default", "elu": "aten.elu_backward.default",
                     "mish": "aten.mish_backward.default", "hardtanh": "aten.hardtanh_backward.default",
                     "selu": "aten.elu_backward.default", "celu": "aten.elu_backward.default",
                     "sigmoid": "aten.sigmoid_backward.default", "tanh": "aten.tanh_backward.default",
                     "threshold": "aten.threshold_backward.default",
                     "silu": "aten.silu_backward.default", "hardswish": "aten.hardswish_backward.default",
                     "hardsigmoid": "aten.hardsigmoid_backward.default"}


def _rebased(ctx: _OpContext, kernel: str, kept: int) -> _Value:
    """An in-place activation on an instance norm's output, a view of its batch norm's (``kernel``: the activation's
    backward; ``kept``: the storage that backward reads). Torch rebases the view's history: the batch norm's output
    gets a ``CopySlices`` node wrapping the activation's backward, and the view a regenerated ``AsStridedBackward``;
    the view's own node is reached no more. Backward (bytes of the output each): the view's node writes its gradient
    into ``new_zeros`` of the base's shape; ``CopySlices`` allocates the base's gradient (``new_empty_strided``),
    copies the incoming one in, runs the activation's backward on a ``clone`` of the view's part and copies the
    result back, freeing the clone and the result; it keeps what the activation keeps (the base's geometry alone)."""
    x = ctx.x
    ctx.fns.pop()  # the view's node (the last made: nothing has read the view)
    copy = ctx.grad_fn([kept], [("fn", x.base_fn)], [x.nbytes], ["aten.new_empty_strided.default"],
                       scratch=[(x.nbytes, "aten.clone.default"), (x.nbytes, kernel)])
    x.fn = ctx.grad_fn([], [("fn", copy)], [x.nbytes], ["aten.new_zeros.default"])  # later readers of the view too
    x.base_fn = None
    return _Value(ctx.mem.hold(x.sid), x.nbytes, x.fn, view=True)


def _rrelu(ctx: _OpContext) -> _Value:
    """RReLU as torch runs it (aten.rrelu, on any device): a noise of the input's size (``empty_like``; the kernel
    writes each element's slope into it), then its output, or in place its input; it keeps the noise, and its input
    or, in place, its result. Backward ``rrelu_with_noise_backward``: the input's gradient. In place on a view, or
    on a tensor that needs no gradient or that another node keeps, not covered. On a copy: :func:`_on_copy`."""
    n, x = ctx.node, ctx.x
    if n.attrs.get("on_copy"):
        return _on_copy(ctx)
    inplace = bool(n.attrs.get("inplace"))
    if inplace and (x.fn is None or x.view or x.sid in ctx.mem.saved):
        raise NotCovered(f"in-place rrelu on '{n.inputs[0]}'")
    noise = ctx.alloc("empty_like.default", x.nbytes, holders=0)
    sid = ctx.mem.hold(x.sid) if inplace else ctx.alloc("rrelu_with_noise.default")
    return _Value(sid, ctx.nbytes, ctx.unary_grad_fn("aten.rrelu_with_noise_backward.default", [x.sid, noise]))


def _softmax(ctx: _OpContext) -> _Value:
    """A softmax or a log-softmax along a dim (out of place): its output, which its backward keeps."""
    kernel = "_" + ctx.node.op
    sid = ctx.alloc(kernel + ".default")
    return _Value(sid, ctx.nbytes, ctx.unary_grad_fn(f"aten.{kernel}_backward_data.default", [sid]))


def _glu(ctx: _OpContext) -> _Value:
    """A GLU: its output (half its input, ``aten.glu``); it keeps its input, from which its backward
    (``aten.glu_backward``, measured on torch 2.14 on the CPU and 2.11 on CUDA) writes the input's gradient."""
    sid = ctx.alloc("glu.default")
    return _Value(sid, ctx.nbytes, ctx.unary_grad_fn("aten.glu_backward.default", [ctx.x.sid]))


def _prelu(ctx: _OpContext) -> _Value:
    """PReLU: its output; it keeps its input (and its slopes viewed as [1, C, 1, ...], a parameter's storage). Its
    backward allocates the input's gradient, then the slopes' gradient per element, which the engine sums down to
    the slopes' view (the full one freed) and hands on through the view to the parameter. On a tensor that needs no
    gradient (torch still computes both, then frees the input's) not covered."""
    x = ctx.x
    if x.fn is None:
        raise NotCovered("prelu on a tensor that needs no gradient")
    slopes = ctx.node.attrs["num_parameters"] * FLOAT
    viewed = ctx.grad_fn([], [("param", ctx.first_param)], [slopes], [None], handoff="view")  # weight.view(...)
    sid = ctx.alloc("_prelu_kernel.default")
    kernel = "aten._prelu_kernel_backward.default"
    return _Value(sid, ctx.nbytes, ctx.grad_fn([x.sid], [_edge(x), ("fn", viewed)], [x.nbytes, slopes],
                                               [kernel, kernel], full=[None, x.nbytes]))


def _dropout2d(ctx: _OpContext) -> _Value:
    """Dropout of whole channels, as torch runs it on any device: a noise of one float per sample and channel
    (``new_empty``, then drawn and scaled in place), then the input times it, which allocates the output; the
    backward keeps the noise and multiplies the incoming gradient by it (a new tensor). Of ``p`` 0 torch hands the
    input back (:func:`_handed_back`); of ``p`` 1 (a multiply by a zero) not covered."""
    if float(ctx.node.attrs["p"]) == 0:
        return _handed_back(ctx)
    if not 0 < float(ctx.node.attrs["p"]) < 1:
        raise NotCovered("dropout2d with p 1")
    noise = ctx.alloc("new_empty.default", ctx.full_in[0] * ctx.full_in[1] * FLOAT, holders=0)
    sid = ctx.alloc("mul.Tensor")
    return _Value(sid, ctx.nbytes, ctx.unary_grad_fn("aten.mul.Tensor", [noise]))


def _alpha_dropout(ctx: _OpContext) -> _Value:
    """Alpha dropout (of elements, or of whole channels: feature) as torch runs it on any device (no kernel of its
    own): a noise (of the input's size, ``empty_like``; of a float per sample and channel, ``new_empty``) drawn in
    place, a shift made of it (``add.Scalar``: the b of a x + b), both scaled in place, the input times the noise (the
    output) and the shift added to it in place, the shift then freed. It keeps the noise, by which its backward
    multiplies the incoming gradient (a new tensor). Of ``p`` 0 torch hands the input back (:func:`_handed_back`); of
    ``p`` 1 (the input times a zero), or in place, not covered."""
    n = ctx.node
    if float(n.attrs["p"]) == 0:
        return _handed_back(ctx)
    if float(n.attrs["p"]) == 1 or n.attrs.get("inplace"):
        raise NotCovered("alpha_dropout of p 1 or in place")
    feature = bool(n.attrs.get("feature"))
    size = ctx.full_in[0] * ctx.full_in[1] * FLOAT if feature else ctx.x.nbytes
    noise = ctx.alloc("new_empty.default" if feature else "empty_like.default", size, holders=0)
    shift = ctx.alloc("add.Scalar", size)
    sid = ctx.alloc("mul.Tensor")
    ctx.mem.drop(shift)
    return _Value(sid, ctx.nbytes, ctx.unary_grad_fn("aten.mul.Tensor", [noise]))


def _summed(ctx: _OpContext, param: int, size: int, rows: int) -> tuple[str, int]:
    """The edge an instance norm's gradient of its repeated weight or bias (``rows`` bytes, one vector per sample)
    takes to parameter ``param`` (``size`` bytes): through a sum down to ``size`` bytes, or, at a batch of 1 (the
    repeat's backward sums over no repeated dimension), straight to the parameter."""
    if ctx.batch == 1:
        return "param", param
    return "fn", ctx.grad_fn([], [("param", param)], [size], ["aten.sum.dim_IntList"], out_shape=(rows,))


def _instance_norm(ctx: _OpContext) -> _Value:
    """An instance norm as torch runs it: a batch norm of the input viewed as [1, N x C, H, W]. Where affine, the
    weight and the bias are first repeated once per sample (N x C floats each; the bias's repeat is freed after the
    norm, the weight's kept); then the output, a mean and a 1/std per sample and channel, which it keeps with the
    input (and the repeated weight); the output is a view of the norm's. Backward: the input's gradient, the
    repeated weight's and bias's, each of these two then summed down to C floats (the bias's first) and accumulated;
    at a batch of 1 (a repeat once) torch sums nothing, the norm's gradients are the parameters' own (:func:`_summed`).
    Tracking running statistics, it repeats the running mean and variance too (after the weight and bias), which the
    norm keeps, and once it has run makes the mean over the batch of each (C floats), copied into the buffer and
    freed. Bytes at ``ctx.batch``."""
    n, x, nbytes = ctx.node, ctx.x, ctx.nbytes
    pbytes, buffers = _params(n)
    rows = ctx.batch * n.attrs["num_features"] * FLOAT  # bytes of a vector per sample and channel
    repeats = [ctx.alloc("repeat.default", rows) for _ in pbytes]
    running = [ctx.alloc("repeat.default", rows) for _ in buffers[:2]]  # the running mean's and variance's
    summed = [_summed(ctx, ctx.first_param + k, size, rows) for k, size in enumerate(pbytes)]
    viewed = ctx.grad_fn([], [_edge(x)], [x.nbytes], [None], handoff="view")
    sid = ctx.alloc("native_batch_norm.default")
    stats = [ctx.alloc("native_batch_norm.default", rows, holders=0) for _ in range(2)]
    edges = [None if viewed is None else ("fn", viewed)] + summed
    norm = ctx.grad_fn([x.sid] + repeats[:1] + running + stats, edges, [x.nbytes] + [rows] * len(pbytes),
                       ["aten.native_batch_norm_backward.default"] * len(edges))
    for size in buffers[:2]:  # the mean over the batch of a running statistic, copied into the buffer
        ctx.mem.drop(ctx.alloc("mean.dim", size))
    for r in repeats + running:
        ctx.mem.drop(r)  # those the norm keeps live on
    # the output's backward reshapes its gradient to the batch norm's [1, N x C, H, W]: a copy where it is strided
    rows_shape = (1, ctx.full_in[0] * ctx.full_in[1], *ctx.full_in[2:])  # (a slice of a cat's gradient)
    out = ctx.grad_fn([], [None if norm is None else ("fn", norm)], [nbytes], [None], handoff="view",
                      shapes=[rows_shape])
    return _Value(sid, nbytes, out, view=True, base_fn=norm)


def _pooling(ctx: _OpContext) -> _Value:
    """maxpool2d, adaptivemaxpool2d, fractional_maxpool2d, avgpool2d, adaptiveavgpool2d, mean (over H and W)."""
    n, x, nbytes, op = ctx.node, ctx.x, ctx.nbytes, ctx.node.op
    if op in ("maxpool2d", "adaptivemaxpool2d"):  # the output and int64 indices, both kept with the input
        kernel = "max_pool2d_with_indices" if op == "maxpool2d" else "adaptive_max_pool2d"
        sid = ctx.alloc(kernel + ".default")
        indices = ctx.alloc(kernel + ".default", nbytes // FLOAT * INT64, holders=0)
        return _Value(sid, nbytes, ctx.unary_grad_fn(f"aten.{kernel}_backward.default", [x.sid, indices]))
    if op == "fractional_maxpool2d":  # F.fractional_max_pool2d draws its windows' places: [N, C, 2] uniform samples
        samples = ctx.alloc("rand.default", ctx.full_in[0] * ctx.full_in[1] * 2 * FLOAT)
        sid = ctx.alloc("fractional_max_pool2d.default")
        indices = ctx.alloc("fractional_max_pool2d.default", nbytes // FLOAT * INT64, holders=0)
        ctx.mem.drop(samples)  # freed once the pool has read them; the output and indices kept with the input
        return _Value(sid, nbytes, ctx.unary_grad_fn("aten.fractional_max_pool2d_backward.default", [x.sid, indices]))
    if op == "avgpool2d":
        return _Value(ctx.alloc("avg_pool2d.default"), nbytes,
                      ctx.unary_grad_fn("aten.avg_pool2d_backward.default", [x.sid]))
    if op == "adaptiveavgpool2d" and n.attrs["output_size"] not in (1, [1, 1], (1, 1)):
        return _Value(ctx.alloc("_adaptive_avg_pool2d.default"), nbytes,
                      ctx.unary_grad_fn("aten._adaptive_avg_pool2d_backward.default", [x.sid]))
    if op in ("adaptiveavgpool2d", "mean"):  # a mean over H and W: keeps nothing, its backward divides
        sid, mean = ctx.alloc("mean.dim"), ctx.unary_grad_fn("aten.div.Scalar", [])
        if op == "mean" or not ctx.channels_last(x):
            return _Value(sid, nbytes, mean)
        # torch restrides the mean of a channels-last input in place (as_strided_): its backward writes the incoming
        # gradient into new zeros of the output's size, which the mean's then reads
        restrided = ctx.grad_fn([], [None if mean is None else ("fn", mean)], [nbytes], ["aten.new_zeros.default"],
                                any_strides=True)
        n, c = ctx.full_in[:2]
        return _Value(sid, nbytes, restrided, raw=(c, 1, c, c) if 1 in ctx.full_out else None)
    raise NotCovered(f"op '{op}'")


def _interpolate(ctx: _OpContext) -> _Value:
    """A resize: keeps nothing (its backward needs the sizes alone) and writes the input's gradient anew."""
    n = ctx.node
    kernel = "upsample_bilinear2d" if n.attrs["mode"] == "bilinear" else "upsample_nearest2d"
    return _Value(ctx.alloc(kernel + ".default"), ctx.nbytes, ctx.unary_grad_fn(f"aten.{kernel}_backward.default", []))


#: A pad's mode -> (its aten kernel, its backward's kernel, whether it keeps its input), as torch 2 runs them.
_PAD_KERNELS = {"constant": ("constant_pad_nd", "constant_pad_nd", False),
                "reflect": ("reflection_pad2d", "reflection_pad2d_backward", True),
                "replicate": ("replication_pad2d", "replication_pad2d_backward", True)}
#: A pixel shuffle's kernel -> its backward's: the inverse rearrangement.
_SHUFFLE_BACKWARD = {"pixel_shuffle": "pixel_unshuffle", "pixel_unshuffle": "pixel_shuffle"}


def _rearrange(ctx: _OpContext) -> _Value:
    """pad, pixel_shuffle, pixel_unshuffle: a new output; the backward writes the input's gradient anew."""
    n, x, op = ctx.node, ctx.x, ctx.node.op
    if op == "pad" and n.attrs["mode"] == "circular":
        # torch's _pad_circular: copies into slices of an empty output, whose backward is a chain of autograd's
        # in-place-copy and slice nodes (clones, zeros and adds of the output's size per side), left to the trace
        raise NotCovered("a circular pad")
    if op == "pad":
        kernel, backward, keeps_input = _PAD_KERNELS[n.attrs["mode"]]
    else:
        kernel, backward, keeps_input = op, _SHUFFLE_BACKWARD[op], False
    sid = ctx.alloc(kernel + ".default")
    return _Value(sid, ctx.nbytes, ctx.unary_grad_fn(f"aten.{backward}.default", [x.sid] if keeps_input else []))


def _tiling(ctx: _OpContext) -> _Value:
    """A repeat (torch's aten.repeat: a copy, nothing kept). Backward torch views the gradient as (count, size)
    pairs and sums over the counts (aten.sum.dim_IntList: the input's gradient); of counts all 1 it hands the
    gradient on (a view of the same shape)."""
    tiles = any(int(r) > 1 for r in ctx.node.attrs["repeats"])
    sid = ctx.alloc("repeat.default")
    return _Value(sid, ctx.nbytes, ctx.unary_grad_fn("aten.sum.dim_IntList" if tiles else None, []))


def _reordered_copy(ctx: _OpContext) -> _Value:
    """A flip or a roll (torch's aten.flip, aten.roll: a copy in another order, nothing kept). Backward the incoming
    gradient flipped or rolled back, a new tensor of the input's size (the same kernel)."""
    kernel = f"{ctx.node.op}.default"
    sid = ctx.alloc(kernel)
    return _Value(sid, ctx.nbytes, ctx.unary_grad_fn("aten." + kernel, []))


def _im2col(ctx: _OpContext) -> _Value:
    """An unfold (torch's aten.im2col: the windows' values copied into columns, nothing kept) or a fold (aten.col2im:
    the columns added back onto their windows). Backward the other kernel, a new tensor of the input's size."""
    kernel, backward = ("im2col", "col2im") if ctx.node.op == "unfold" else ("col2im", "im2col")
    sid = ctx.alloc(f"{kernel}.default")
    return _Value(sid, ctx.nbytes, ctx.unary_grad_fn(f"aten.{backward}.default", []))


def _logsumexp(ctx: _OpContext) -> _Value:
    """A logsumexp over dims (aten.logsumexp: its output alone, its temporaries below the dispatcher), keeping its
    input and its result. Backward grad * exp(x - result): ``sub`` and ``exp`` (the input's size) before the
    gradient (``mul``), freed once it is made."""
    x = ctx.x
    sid = ctx.alloc("logsumexp.default")
    fn = ctx.grad_fn([x.sid, sid], [_edge(x)], [x.nbytes], ["aten.mul.Tensor"],
                     before=[(x.nbytes, "aten.sub.Tensor"), (x.nbytes, "aten.exp.default")])
    return _Value(sid, ctx.nbytes, fn)


def _cumsum(ctx: _OpContext) -> _Value:
    """A running sum along a dim (aten.cumsum), keeping nothing. Backward the gradient flipped, summed and flipped
    back: the first two (the input's size) before the gradient (``flip``), freed once it is made."""
    sid = ctx.alloc("cumsum.default")
    fn = ctx.grad_fn([], [_edge(ctx.x)], [ctx.x.nbytes], ["aten.flip.default"],
                     before=[(ctx.x.nbytes, "aten.flip.default"), (ctx.x.nbytes, "aten.cumsum.default")])
    return _Value(sid, ctx.nbytes, fn)


def _where(ctx: _OpContext) -> _Value:
    """torch.where(x <compare> threshold, a, b) (:func:`to_torch._where`): the condition (``aten.<compare>.Scalar``,
    a byte an element of x), a number branch wrapped (``scalar_tensor``, 4 bytes, freed after), the output
    (``where.self``); it keeps the condition. Backward, per tensor branch, the false one's first, its gradient
    ``where.self`` of the output's size (a zero wrapped first, ``scalar_tensor``, freed after), one of a broadcast
    branch then summed down to its shape. A condition of a value that needs a gradient and is not a branch too is
    not covered: the node that made it may be reached by no gradient (``y.mean(1) > 0``: autograd frees it with the
    value, which the model does not follow)."""
    n, batch = ctx.node, ctx.batch
    k = where_condition_inputs(n.attrs)  # a > b: two tensors compared (``aten.<compare>.Tensor``)
    for name, value in zip(n.inputs[:k], ctx.inputs):
        if value.fn is not None and name not in n.inputs[k:]:
            raise NotCovered(f"a where's condition of '{name}', a value needing a gradient")
    if k == 0:  # a fixed boolean mask: a buffer (:func:`_params`), no compare
        mask = None
    else:
        shape = ctx.in_shapes[0] if k == 1 else broadcast(list(ctx.in_shapes[0]), list(ctx.in_shapes[1]))
        mask = ctx.mem.new(batch * prod(shape), f"aten.{n.attrs['compare']}.{'Tensor' if k == 2 else 'Scalar'}")
    if n.attrs.get("inplace"):
        return _masked_fill_in_place(ctx, mask)
    if n.attrs.get("multiply"):
        return _mask_multiplied(ctx, mask)
    number = "if_true" in n.attrs or "if_false" in n.attrs
    scalar = ctx.alloc("scalar_tensor.default", FLOAT) if number else None
    sid = ctx.alloc("where.self")
    if scalar is not None:
        ctx.mem.drop(scalar)
    branches = list(zip(ctx.inputs, ctx.in_shapes))[k:]
    edges = [None] * k + [_edge(b) for b, _ in branches]
    sizes = [v.nbytes for v in ctx.inputs[:k]] + [b.nbytes for b, _ in branches]
    full = [None] * k + [ctx.nbytes if list(shape) != list(n.output_shape) else None for _, shape in branches]
    around = [[]] * k + [[(FLOAT, "aten.scalar_tensor.default")] for _ in branches]
    fn = ctx.grad_fn([] if mask is None else [mask], edges, sizes, [None] * k + ["aten.where.self"] * len(branches),
                     list(range(k)) + list(range(k + len(branches) - 1, k - 1, -1)), full, around=around)
    if mask is not None:
        ctx.mem.drop(mask)
    return _Value(sid, ctx.nbytes, fn)


def _mask_multiplied(ctx: _OpContext, mask: int) -> _Value:
    """``b * condition`` (a where of ``multiply``: x * (x > 0)) once its condition is allocated: the output
    (``mul.Tensor``, no number wrapped), the condition kept; backward b's gradient ``mul.Tensor`` of the output's size
    (summed down to a broadcast b's shape)."""
    n, k = ctx.node, where_condition_inputs(ctx.node.attrs)
    sid = ctx.alloc("mul.Tensor")
    b, shape = ctx.inputs[k], ctx.in_shapes[k]
    fn = ctx.grad_fn([mask], [None] * k + [_edge(b)], [v.nbytes for v in ctx.inputs],
                     [None] * k + ["aten.mul.Tensor"], None,
                     [None] * k + [ctx.nbytes if list(shape) != list(n.output_shape) else None])
    ctx.mem.drop(mask)
    return _Value(sid, ctx.nbytes, fn)


def _masked_fill_in_place(ctx: _OpContext, mask: int | None) -> _Value:
    """``b.masked_fill_(condition, value)`` (a where of ``inplace``) once its condition is allocated: the number
    written into b (no allocation), the condition kept; backward b's gradient ``masked_fill.Scalar``. b's later
    readers read the result (:func:`_activation`'s in-place rule). In place on a view, or on a tensor that needs no
    gradient or that another node keeps, not covered."""
    b = ctx.inputs[-1]
    if b.fn is None or b.view or b.sid in ctx.mem.saved:
        raise NotCovered(f"a masked_fill_ of '{ctx.node.inputs[-1]}'")
    edges = [None] * (len(ctx.inputs) - 1) + [_edge(b)]
    b.fn = ctx.grad_fn([] if mask is None else [mask], edges, [v.nbytes for v in ctx.inputs],
                       [None] * len(edges[1:]) + ["aten.masked_fill.Scalar"])
    if mask is not None:  # a fixed mask (None) is a buffer
        ctx.mem.drop(mask)
    return _Value(ctx.mem.hold(b.sid), b.nbytes, b.fn)


def _affine_grid(ctx: _OpContext) -> _Value:
    """An affine grid (aten.affine_grid_generator: its [H, W, 2] grid, nothing kept). Its backward builds the base
    grid anew, an ``empty`` of [N, H, W, 3], then per side (the width's first) a ``linspace`` and, without
    align_corners, its ``mul`` and ``div`` (the side's floats, not the batch's), freed once copied in, then the
    gradient (``bmm``: theta's, laid out transposed), the incoming gradient and the base freed last. Written down as
    three autograd nodes run back to back, as torch's one runs its work: the first hands the incoming gradient on and
    allocates the base (its scratch the width's temporaries), the second hands the base on (the height's), the last
    gathers both (no sum) and computes theta's gradient."""
    x = ctx.x
    sid = ctx.alloc("affine_grid_generator.default")
    if x.fn is None:
        return _Value(sid, ctx.nbytes, None)
    height, width = (int(s) for s in ctx.node.attrs["size"])
    base = ctx.batch * height * width * 3 * FLOAT
    kernels = ["aten.linspace.default"] + ([] if ctx.node.attrs["align_corners"] else
                                           ["aten.mul.Scalar", "aten.div.Scalar"])
    theta = (ctx.batch, 2, 3)
    gradient = ctx.grad_fn([], [_edge(x)], [x.nbytes], ["aten.bmm.default"], out_shape=theta, gathers=2,
                           layouts=[("fixed", _normal(theta, (6, 1, 2)))])
    rows = ctx.grad_fn([], [("fn", gradient)], [base], [None], scratch=[(height * FLOAT, k) for k in kernels])
    fn = ctx.grad_fn([], [("fn", gradient), ("fn", rows)], [ctx.nbytes, base], [None, "aten.empty.memory_format"],
                     scratch=[(width * FLOAT, k) for k in kernels])
    return _Value(sid, ctx.nbytes, fn)


def _grid_sample(ctx: _OpContext) -> _Value:
    """A map sampled at a grid (aten.grid_sampler_2d: its output), keeping both. Backward one op,
    ``grid_sampler_2d_backward``: the map's gradient, then the grid's (of those that need one)."""
    x, grid = ctx.inputs
    sid = ctx.alloc("grid_sampler_2d.default")
    fn = ctx.grad_fn([x.sid, grid.sid], [_edge(x), _edge(grid)], [x.nbytes, grid.nbytes],
                     ["aten.grid_sampler_2d_backward.default"] * 2)
    return _Value(sid, ctx.nbytes, fn)


def _sorted(ctx: _OpContext) -> _Value:
    """A sort's or a topk's values (aten.sort, aten.topk: the values, then their int64 indices, which it keeps).
    Backward the gradient scattered (``scatter.src``, the input's size) into zeros (``new_zeros``, freed once it is
    made)."""
    kernel = f"{ctx.node.op}.default"
    sid = ctx.alloc(kernel)
    indices = ctx.alloc(kernel, ctx.nbytes // FLOAT * INT64, holders=0)
    fn = ctx.grad_fn([indices], [_edge(ctx.x)], [ctx.x.nbytes], ["aten.scatter.src"],
                     before=[(ctx.x.nbytes, "aten.new_zeros.default")])
    return _Value(sid, ctx.nbytes, fn)


def _combine(ctx: _OpContext) -> _Value:
    """add, mul (of two tensors, or of a tensor and a scalar), cat."""
    n, ins, nbytes, op = ctx.node, ctx.inputs, ctx.nbytes, ctx.node.op
    if op in ("add", "mul") and n.attrs.get("scalar") is not None:  # keeps nothing; mul's backward scales
        sid = ctx.alloc("add.Tensor" if op == "add" else "mul.Tensor")
        return _Value(sid, nbytes, ctx.unary_grad_fn(None if op == "add" else "aten.mul.Tensor", []))
    if len(set(n.inputs)) != len(n.inputs) or (op != "cat" and len(ins) != 2):
        raise NotCovered(f"{op} of a value with itself")
    full = [nbytes if shape != n.output_shape and op != "cat" else None for shape in ctx.in_shapes]  # broadcast
    sid = ctx.alloc({"add": "add.Tensor", "mul": "mul.Tensor", "cat": "cat.default"}[op])
    edges, sizes = [_edge(i) for i in ins], [i.nbytes for i in ins]
    if op != "mul":  # the incoming gradient handed on (cat: views of it)
        layout = _sum_layout(ctx) if op == "add" else {}
        return _Value(sid, nbytes, ctx.grad_fn([], edges, sizes, [None] * len(ins), None, full,
                                               "slices" if op == "cat" and len(ins) > 1 else ""), **layout)
    # each input's gradient is the incoming one times the other input (kept when that input needs it);
    # the second input's is computed first
    saved = [ins[0].sid] if ins[1].fn is not None else []
    saved += [ins[1].sid] if ins[0].fn is not None else []
    return _Value(sid, nbytes, ctx.grad_fn(saved, edges, sizes, ["aten.mul.Tensor"] * 2, [1, 0], full))


def _sum_layout(ctx: _OpContext) -> dict:
    """The layout of an add's output (``_Value`` fields): contiguous where its inputs lie in their own order, else
    (dense inputs of the same shape: channels-last ones, permuted ones) as torch's TensorIterator lays them out."""
    followed = any(i.raw is not None or i.loose for i in ctx.inputs)
    if not followed and all(_ordered(ctx.full_out, i.strides) for i in ctx.inputs):
        return {}
    if any(list(shape) != list(ctx.node.output_shape) for shape in ctx.in_shapes):
        raise NotCovered("add of a strided tensor broadcast")
    return _iterated_layout(ctx.full_out, [_full_strides(i, ctx.full_out) for i in ctx.inputs],
                            [i.strides for i in ctx.inputs])


def _iterated_layout(shape: tuple[int, ...], full: list[tuple[int, ...] | None],
                     strides: list[tuple[int, ...] | None]) -> dict:
    """The layout (``_Value`` fields: ``strides``, and ``raw`` or ``loose``) of an elementwise kernel's output over
    operands of torch's strides ``full`` (None: not followed along dimensions of size 1) and the model's
    ``strides``."""
    if all(f is not None for f in full):
        raw = _iterated_full(shape, full)
        return {"strides": _normal(shape, raw), "raw": raw if 1 in shape else None}
    return {"strides": _iterated(shape, strides), "loose": 1 in shape}


def _permute(ctx: _OpContext) -> _Value:
    """A permute: a view of the input's storage with its strides permuted; its backward permutes the gradient back
    (a view)."""
    x, dims = ctx.x, tuple(int(d) for d in ctx.node.attrs["dims"])
    strides, full = x.strides or _strides(ctx.full_in), _full_strides(x, ctx.full_in)
    fn = ctx.grad_fn([], [_edge(x)], [x.nbytes], [None], handoff="permute", perm=dims)
    raw = None if full is None else tuple(full[d] for d in dims)
    return _Value(ctx.mem.hold(x.sid), x.nbytes, fn, view=True,
                  strides=_normal(ctx.full_out, tuple(strides[d] for d in dims)),
                  raw=raw if 1 in ctx.full_out else None, loose=raw is None and 1 in ctx.full_out)


def _layer_norm(ctx: _OpContext) -> _Value:
    """A layer norm over the last dims (``native_layer_norm``): its output (contiguous, whatever the input's strides),
    a mean and a 1/std per row (the dims before the normalised ones); it keeps its input as it is and the two.
    Backward: the input's gradient (laid out as the incoming one, as the meta kernel lays it out; where that is
    strided and has a dimension of size 1, whose strides the meta kernel's layout turns on, not covered), then the
    weight's and the bias's."""
    n, x, nbytes = ctx.node, ctx.x, ctx.nbytes
    pbytes, _ = _params(n)
    rows = prod(ctx.full_in[:len(ctx.full_in) - len(n.attrs["normalized_shape"])]) * FLOAT
    sid = ctx.alloc("native_layer_norm.default")
    stats = [ctx.alloc("native_layer_norm.default", rows, holders=0) for _ in range(2)]
    pedges = [("param", ctx.first_param + k) for k in range(len(pbytes))]
    grads = ["aten.native_layer_norm_backward.default"] * (1 + len(pbytes))
    layouts = [("like", [])] + [None] * len(pbytes)  # the input's gradient laid out as the incoming one
    return _Value(sid, nbytes, ctx.grad_fn([x.sid] + stats, [_edge(x)] + pedges, [x.nbytes] + pbytes, grads,
                                           any_strides=True, layouts=layouts))


def _scale(ctx: _OpContext) -> _Value:
    """The input times a learnt tensor, broadcast (``mul.Tensor``; its output laid out as TensorIterator lays it
    out): it keeps the input. Backward, as a multiply of two tensors: the weight's gradient first (the incoming one
    times the input, full size, summed down to the weight's shape after), then the input's (the incoming one times
    the weight, laid out as the incoming one)."""
    x, nbytes, shape = ctx.x, ctx.nbytes, tuple(int(s) for s in ctx.node.attrs["shape"])
    if ctx.full_in != ctx.full_out:
        raise NotCovered("a scale that broadcasts its input")
    weight = _broadcast_strides(shape, ctx.full_out)
    sid = ctx.alloc("mul.Tensor")
    layout = _iterated_layout(ctx.full_out, [_full_strides(x, ctx.full_in), weight], [x.strides, weight])
    fn = ctx.grad_fn([x.sid], [_edge(x), ("param", ctx.first_param)], [x.nbytes, prod(shape) * FLOAT],
                     ["aten.mul.Tensor"] * 2, [1, 0], [None, nbytes], layouts=[("iterated", [weight]), None],
                     any_strides=True)
    return _Value(sid, nbytes, fn, **layout)


def _shift(ctx: _OpContext) -> _Value:
    """The input plus a learnt tensor, broadcast (a position embedding): ``add.Tensor``, laid out as the input; it
    keeps nothing. Backward: the incoming gradient handed on, and summed down to the weight's shape."""
    x, nbytes, shape = ctx.x, ctx.nbytes, tuple(int(s) for s in ctx.node.attrs["shape"])
    if ctx.full_in != ctx.full_out:
        raise NotCovered("a shift that broadcasts its input")
    sid = ctx.alloc("add.Tensor")
    weight = _broadcast_strides(shape, ctx.full_out)
    layout = _iterated_layout(ctx.full_out, [_full_strides(x, ctx.full_in), weight], [x.strides, weight])
    fn = ctx.grad_fn([], [_edge(x), ("param", ctx.first_param)], [x.nbytes, prod(shape) * FLOAT], [None, None],
                     full=[None, nbytes], shapes=[ctx.full_in, shape])
    return _Value(sid, nbytes, fn, **layout)


def _frozen_batch_norm(ctx: _OpContext) -> _Value:
    """A frozen batch norm as torchvision's FrozenBatchNorm2d runs it: its [C] scale, ``weight * (running_var +
    eps).rsqrt()``, and shift, ``bias - running_mean * scale`` (five [C] tensors, each freed once read, but for the
    two), then ``x * scale`` and ``+ shift`` on the map (the product freed once added). It keeps the scale (the
    ``mul``'s other operand; its buffers need no gradient), freed with the shift once the forward leaves it.
    Backward (``add`` hands the gradient on): the incoming gradient times the scale, the input's."""
    c = ctx.node.attrs["num_features"] * FLOAT
    shifted = ctx.alloc("add.Tensor", c)  # running_var + eps
    root = ctx.alloc("rsqrt.default", c)
    ctx.mem.drop(shifted)
    scale = ctx.alloc("mul.Tensor", c)
    ctx.mem.drop(root)
    product = ctx.alloc("mul.Tensor", c)  # running_mean * scale
    shift = ctx.alloc("sub.Tensor", c)
    ctx.mem.drop(product)
    scaled = ctx.alloc("mul.Tensor")
    sid = ctx.alloc("add.Tensor")
    fn = ctx.unary_grad_fn("aten.mul.Tensor", [scale])
    for temporary in (scaled, shift, scale):
        ctx.mem.drop(temporary)
    return _Value(sid, ctx.nbytes, fn)


def _token(ctx: _OpContext) -> _Value:
    """A learnt tensor put before the input along a dim (a class token): the weight expanded to the batch (a view),
    then ``cat``. Backward: the cat hands on slices of its gradient; the expand's sums the token's down to the
    weight (``sum.dim_IntList``). At a batch of 1 (no sum: the slice itself reaches the weight) not covered."""
    x, nbytes, n = ctx.x, ctx.nbytes, ctx.node
    if ctx.batch == 1:
        raise NotCovered("a class token at batch 1")
    shape = (ctx.batch, *(int(s) for s in n.attrs["shape"]))
    token = prod(n.attrs["shape"]) * FLOAT
    expanded = ctx.grad_fn([], [("param", ctx.first_param)], [token], ["aten.sum.dim_IntList"], out_shape=shape)
    sid = ctx.alloc("cat.default")
    fn = ctx.grad_fn([], [("fn", expanded), _edge(x)], [ctx.batch * token, x.nbytes], [None, None],
                     handoff="slices", shapes=[shape, ctx.full_in])
    return _Value(sid, nbytes, fn)


def _quotient(ctx: _OpContext) -> _Value:
    """x / y of two tensors, broadcast: its output; it keeps y, and x where y needs a gradient. Backward, y's gradient
    first (torch's -grad * ((x / y) / y): x / y, over y, -grad, their product), then x's (grad / y); a broadcast
    input's summed down to its shape."""
    n, ins, nbytes = ctx.node, ctx.inputs, ctx.nbytes
    if len(set(n.inputs)) != len(n.inputs):
        raise NotCovered("div of a value with itself")
    x, y = ins
    sid = ctx.alloc("div.Tensor")
    full = [nbytes if shape != n.output_shape else None for shape in ctx.in_shapes]
    before = [(nbytes, "aten.div.Tensor"), (nbytes, "aten.div.Tensor"), (nbytes, "aten.neg.default")] \
        if y.fn is not None else []
    saved = ([x.sid] if y.fn is not None else []) + [y.sid]
    return _Value(sid, nbytes, ctx.grad_fn(saved, [_edge(x), _edge(y)], [x.nbytes, y.nbytes],
                                           ["aten.div.Tensor", "aten.mul.Tensor"], [1, 0], full, before=before))


def _extreme(ctx: _OpContext) -> _Value:
    """maximum / minimum of two tensors, broadcast (aten.maximum, aten.minimum): its output; it keeps both inputs.
    Backward (torch 2's, the meta trace's), the second input's gradient first: a compare of the two (a bool an
    element), the incoming gradient halved (for ties), an equality compare, a where, then the gradient, a
    masked_fill of the where (the temporaries freed after it, last first); then the first input's, alike; a broadcast
    input's summed down to its shape. A value with itself is not covered."""
    n, nbytes = ctx.node, ctx.nbytes
    if len(set(n.inputs)) != len(n.inputs):
        raise NotCovered(f"{n.op} of a value with itself")
    x, y = ctx.inputs
    sid = ctx.alloc(f"{n.op}.default")
    full = [nbytes if shape != n.output_shape else None for shape in ctx.in_shapes]
    masks = nbytes // FLOAT  # a bool an output element
    # maximum: x's gradient masked where x < y, y's where x > y; minimum the other way round
    compares = ("lt", "gt") if n.op == "maximum" else ("gt", "lt")
    around = [[(masks, f"aten.{compare}.Tensor"), (nbytes, "aten.div.Scalar"), (masks, "aten.eq.Tensor"),
               (nbytes, "aten.where.self")] for compare in compares]
    return _Value(sid, nbytes, ctx.grad_fn([x.sid, y.sid], [_edge(x), _edge(y)], [x.nbytes, y.nbytes],
                                           ["aten.masked_fill.Scalar"] * 2, [1, 0], full, around=around))


def _fusion_weights(ctx: _OpContext) -> tuple[int, int]:
    """A weighted sum's weights from its ``[n]`` parameter, as EfficientDet computes them: relu(w) / (sum(relu(w)) +
    eps) (a relu, a sum, the add of eps, freeing the sum, a division; the relu keeps its result, the division it and
    the sum plus eps) or softmax(w) (it keeps its result). Backward, in the reverse order of their nodes: the
    division's two gradients (the sum's first: w / s, over s, -grad, their product, then the weights' grad / s; the
    sum's summed down to a scalar), the add and the sum handing theirs on (an expand), added to the division's, then
    the relu's threshold_backward into the parameter's gradient; a softmax's _softmax_backward_data. (the weights'
    storage, their autograd node)."""
    count = int(ctx.node.attrs["num_inputs"])
    weights, vector = count * FLOAT, (count,)
    param = [("param", ctx.first_param)]
    if ctx.node.attrs["normalize"] == "softmax":
        soft = ctx.alloc("_softmax.default", weights)
        return soft, ctx.grad_fn([soft], param, [weights], ["aten._softmax_backward_data.default"],
                                 out_shape=vector, shapes=[vector])
    relu = ctx.alloc("relu.default", weights)
    relu_fn = ctx.grad_fn([relu], param, [weights], ["aten.threshold_backward.default"], out_shape=vector,
                          shapes=[vector])
    total = ctx.alloc("sum.dim_IntList", FLOAT)
    total_fn = ctx.grad_fn([], [("fn", relu_fn)], [weights], [None], out_shape=(), shapes=[vector])
    shifted = ctx.alloc("add.Tensor", FLOAT)
    shifted_fn = ctx.grad_fn([], [("fn", total_fn)], [FLOAT], [None], out_shape=(), shapes=[()])
    ctx.mem.drop(total)
    quotient = ctx.alloc("div.Tensor", weights)
    before = [(weights, "aten.div.Tensor"), (weights, "aten.div.Tensor"), (weights, "aten.neg.default")]
    quotient_fn = ctx.grad_fn([relu, shifted], [("fn", relu_fn), ("fn", shifted_fn)], [weights, FLOAT],
                              ["aten.div.Tensor", "aten.mul.Tensor"], [1, 0], [None, weights], out_shape=vector,
                              shapes=[vector, ()], before=before, then="aten.sum.default")
    ctx.mem.drop(shifted)
    ctx.mem.drop(relu)
    return quotient, quotient_fn


def _weighted_sum(ctx: _OpContext) -> _Value:
    """EfficientDet's BiFPN fusion of n maps (:class:`to_torch.WeightedSum`): its weights (:func:`_fusion_weights`),
    then per map a pick of its weight (a view; backward a select_backward of the n weights, added into the weights'
    gradient), its product with the map (it keeps the weights' storage and the map), and from the second on the add
    of it to the sum so far, the product and the old sum freed. Backward per product, the map's gradient first
    (grad times the weight), then the weight's (grad times the map, summed down to a scalar). The meta trace's
    events. A map fused twice is not covered."""
    n, nbytes = ctx.node, ctx.nbytes
    if len(set(n.inputs)) != len(n.inputs):
        raise NotCovered("weighted_sum of a value with itself")
    count = int(n.attrs["num_inputs"])
    weights, weights_fn = _fusion_weights(ctx)
    total: _Value | None = None
    for x, shape in zip(ctx.inputs, ctx.in_shapes):
        pick_fn = ctx.grad_fn([], [("fn", weights_fn)], [count * FLOAT], ["aten.select_backward.default"],
                              out_shape=(), shapes=[(count,)])
        saved = ([weights] if x.fn is not None else []) + [x.sid]
        product = _Value(ctx.alloc("mul.Tensor"), nbytes,
                         ctx.grad_fn(saved, [("fn", pick_fn), _edge(x)], [FLOAT, x.nbytes], ["aten.mul.Tensor"] * 2,
                                     [1, 0], [nbytes, None], shapes=[(), tuple([ctx.batch] + list(shape))],
                                     then="aten.sum.default"))
        if total is None:
            total = product
            continue
        summed = _Value(ctx.alloc("add.Tensor"), nbytes,
                        ctx.grad_fn([], [_edge(total), _edge(product)], [nbytes, nbytes], [None, None]))
        ctx.mem.drop(product.sid)
        ctx.mem.drop(total.sid)
        total = summed
    ctx.mem.drop(weights)
    return total


def _matrix_product(ctx: _OpContext) -> _Value:
    """a @ b of [..., M, K] and [..., K, N] matrices, as torch runs it: each input expanded to the output's leading
    dims and viewed as [B, M, K] and [B, K, N] (B the batch times those dims), copied first (aten.clone, in input
    order) where its leading dims do not merge into one (a permuted input: a hand-written attention's heads; a
    broadcast one, copied at its expanded size), then aten.bmm of the output (viewed back); it keeps each input, or
    its copy, whose other input needs a gradient (a copy no one keeps is freed after the product). Backward, the
    incoming gradient viewed as [B, M, N] (copied, aten.clone, where its leading dims do not view as one: a product
    of heads transposed after), then b's gradient a^T @ grad, then a's grad @ b^T (aten.bmm each, contiguous, of
    the expanded sizes), a broadcast input's then summed down to its shape (aten.sum, torch's expand's backward).
    Not covered: an input not copied whose matrices no GEMM reads as they lie (every other element), a broadcast one
    strided at all, a value times itself."""
    n, ins = ctx.node, ctx.inputs
    if len(set(n.inputs)) != len(n.inputs):
        raise NotCovered("matmul of a value with itself")
    operands = [_matmul_operand(ctx, shape, value) for shape, value in zip(ctx.in_shapes, ins)]
    a, b = ins
    sid = ctx.alloc("bmm.default")
    kept = [storage for storage, _, _ in operands]
    saved = ([kept[0]] if b.fn is not None else []) + ([kept[1]] if a.fn is not None else [])
    stacked = (ctx.batch * prod(n.output_shape[:-2]), *n.output_shape[-2:])
    fn = ctx.grad_fn(saved, [edge for _, edge, _ in operands], [size for _, _, size in operands],
                     ["aten.bmm.default"] * 2, [1, 0], out_shape=stacked, any_strides=True)
    for copy, value in zip(kept, ins):
        if copy != value.sid:  # the copy's own hold: autograd's, where it keeps it, is the last
            ctx.mem.drop(copy)
    if fn is not None and len(n.output_shape) > 2:  # the output viewed back from [B, M, N]: its gradient viewed so
        fn = ctx.grad_fn([], [("fn", fn)], [ctx.nbytes], [None], handoff="view", shapes=[stacked])
    return _Value(sid, ctx.nbytes, fn)


def _matmul_operand(ctx: _OpContext, shape: list[int], value: _Value) -> tuple[int, tuple[str, int] | None, int]:
    """What torch's matmul multiplies of ``value`` (per-sample ``shape``), as (storage, the edge its gradient takes,
    its gradient's bytes): its own storage, where it is contiguous or a transposed view (or a broadcast whose
    expanded leading dims still merge), or where its leading dims merge and a GEMM reads its matrices as they lie
    (a narrowed input; a pick of packed heads at a batch of 1, its batch's dimension of size 1 strided unsure, which
    no check reads); a contiguous copy of it (aten.clone) of its expanded size, where its leading
    dims do not merge into one. A broadcast input's gradient goes through an autograd node of its own that sums it
    down (aten.sum.dim_IntList), run right after the product's."""
    full = (ctx.batch, *shape)
    lead = ctx.node.output_shape[:-2]
    if list(shape[:-2]) != list(lead):
        if value.raw is not None or value.loose or value.strides is not None:
            raise NotCovered("matmul of a strided broadcast input")
        expanded = (ctx.batch, *lead, *shape[-2:])
        strides = tuple(0 if size == 1 and wide != 1 else stride
                        for size, wide, stride in zip(full, expanded, _strides(full)))
        nbytes = value.nbytes * prod(expanded) // prod(full)
        summed = ctx.grad_fn([], [_edge(value)], [value.nbytes], ["aten.sum.dim_IntList"], out_shape=expanded,
                             shapes=[full])
        storage = value.sid if _leading_dims_merge(expanded, strides) else ctx.mem.new(nbytes, "aten.clone.default")
        return storage, None if summed is None else ("fn", summed), nbytes
    if value.raw is None and not value.loose and value.strides in (None, _transposed_strides(full)):
        return value.sid, _edge(value), value.nbytes
    strides = _full_strides(value, full)
    if strides is None and value.raw is None and value.loose and min(full[-2:]) > 1:
        strides = value.strides or _strides(full)  # only its dims of size 1 strided unsure, which no check reads
    if strides is not None and _leading_dims_merge(full, strides) and _blas_strides(full, strides):
        return value.sid, _edge(value), value.nbytes  # read as it lies (a pick of packed heads at a batch of 1)
    if strides is None or _leading_dims_merge(full, strides):
        raise NotCovered("matmul of an input strided other than transposed")
    return ctx.mem.new(value.nbytes, "aten.clone.default"), _edge(value), value.nbytes


def _blas_strides(full: tuple[int, ...], strides: tuple[int, ...]) -> bool:
    """Whether each matrix of ``full`` (strides ``strides``, elements) is one a GEMM reads as it lies: its rows
    (or its columns) of consecutive elements, each at least a row (a column) apart."""
    rows, cols = full[-2:]
    return (strides[-1] == 1 and strides[-2] >= max(cols, 1)) or (strides[-2] == 1 and strides[-1] >= max(rows, 1))


def _transposed_strides(full: tuple[int, ...]) -> tuple[int, ...]:
    """The strides (elements) of a contiguous [..., K, M] tensor viewed as [..., M, K] (``full``)."""
    swapped = _strides(full[:-2] + (full[-1], full[-2]))
    return swapped[:-2] + (swapped[-1], swapped[-2])


def _leading_dims_merge(full: tuple[int, ...], strides: tuple[int, ...]) -> bool:
    """Whether the dims of ``full`` before its last two (strides ``strides``, elements) view as one: each dim's stride
    its next one's times that one's size (dims of size 1 aside)."""
    dims = [(size, stride) for size, stride in zip(full[:-2], strides[:-2]) if size != 1]
    return all(outer[1] == inner[1] * inner[0] for outer, inner in zip(dims, dims[1:]))


def _variance(ctx: _OpContext) -> _Value:
    """A variance over dims: its (reduced) output; it keeps its input. Backward, torch's 2 / (n - correction) * grad *
    (x - x.mean(dims)): the mean, the deviation and the scaled gradient allocated before the product."""
    x, nbytes = ctx.x, ctx.nbytes
    sid = ctx.alloc("var.correction")
    before = [(nbytes, "aten.mean.dim"), (x.nbytes, "aten.sub.Tensor"), (nbytes, "aten.mul.Scalar")]
    return _Value(sid, nbytes, ctx.grad_fn([x.sid], [_edge(x)], [x.nbytes], ["aten.mul.Tensor"], before=before))


def _view_op(ctx: _OpContext) -> _Value:
    """reshape, flatten, squeeze, unsqueeze, transpose, select, narrow, identity: views of the input's
    storage (a reshape no view can express: a contiguous copy)."""
    n, x, nbytes, op = ctx.node, ctx.x, ctx.nbytes, ctx.node.op
    full_in, full_out = ctx.full_in, ctx.full_out
    if op in _VIEWS:
        viewable, strides = _view(full_in, x.strides, full_out)
        if viewable:
            shared = ctx.mem.hold(x.sid)
            fn = ctx.grad_fn([], [_edge(x)], [x.nbytes], [None], handoff="view")
            return _Value(shared, x.nbytes, fn, view=True, strides=strides)
        # no view has these strides: a contiguous copy, then a view of it (clone + _unsafe_view)
        sid = ctx.alloc("clone.default")
        copied = ctx.grad_fn([], [_edge(x)], [x.nbytes], [None], out_shape=full_in)
        edge = None if copied is None else ("fn", copied)
        return _Value(sid, x.nbytes, ctx.grad_fn([], [edge], [x.nbytes], [None], handoff="view"))
    if op == "transpose":
        d0, d1 = (d % len(full_in) for d in (n.attrs["dim0"], n.attrs["dim1"]))
        strides = list(x.strides or _strides(full_in))
        strides[d0], strides[d1] = strides[d1], strides[d0]
        return _Value(ctx.mem.hold(x.sid), x.nbytes,
                      ctx.grad_fn([], [_edge(x)], [x.nbytes], [None], handoff="transpose", dims=(d0, d1)),
                      view=True, strides=_normal(full_out, tuple(strides)))
    if op == "select":  # one index of a dimension: its backward writes into zeros of the input's shape
        d = n.attrs["dim"] % len(full_in)
        strides = list(x.strides or _strides(full_in))
        del strides[d]
        fn = ctx.grad_fn([], [_edge(x)], [x.nbytes], ["aten.select_backward.default"], any_strides=True)
        return _Value(ctx.mem.hold(x.sid), nbytes, fn, view=True, strides=_normal(full_out, tuple(strides)))
    if op == "narrow":  # a slice: its backward writes the gradient into zeros of the input's shape
        strides = x.strides or _strides(full_in)
        return _Value(ctx.mem.hold(x.sid), nbytes, ctx.unary_grad_fn("aten.slice_backward.default", []), view=True,
                      strides=_normal(full_out, strides))
    if op == "identity":
        return _handed_back(ctx)
    raise NotCovered(f"op '{op}'")


#: The fused attention kernel's aten op (its outputs: the result, a log-sum-exp, a seed and an offset).
_EFFICIENT = "_scaled_dot_product_efficient_attention.default"


def _attention(ctx: _OpContext) -> _Value:
    """Self-attention of a contiguous [N, L, E] input as ``nn.MultiheadAttention`` runs it (batch first, bias, no
    dropout) with a CUDA build's memory-efficient kernel (``alloc_trace._fused_attention``). Forward: the input
    transposed to [L, N, E] and copied for the packed projection's ``mm`` (the copy kept), the bias added (the
    product freed), the [3, L, N, E] query, key and value made contiguous (the sum freed; kept by the kernel), the
    kernel's result (kept), a log-sum-exp per head and token (tokens padded to 32; kept), an 8-byte seed and offset
    (kept), the result's heads made contiguous (kept by the output projection), the output projection's ``addmm``,
    viewed back and transposed to [N, L, E]. Backward: the output projection's,
    the kernel's three gradients, each copied twice as its views are reshaped back, each written into zeros of
    [3, L, N, E] and summed, copied again as the projection's reshape, the bias's summed down, then the packed
    projection's weight's and input's."""
    n, x, xb = ctx.node, ctx.x, ctx.nbytes
    e, heads = int(n.attrs["embed_dim"]), int(n.attrs["num_heads"])
    if x.strides is not None or x.fn is None or not n.attrs["bias"] or float(n.attrs.get("dropout", 0)) != 0:
        raise NotCovered("attention of a strided input, without a bias or with a dropout")
    batch, tokens = ctx.full_in[0], ctx.full_in[1]
    shape = _AttentionShape(batch, tokens, e, heads)
    p = ctx.first_param
    transposed = ctx.grad_fn([], [_edge(x)], [xb], [None], handoff="transpose", dims=(0, 1),
                             out_shape=shape.seq, shapes=[ctx.full_in])
    weight_t = ctx.grad_fn([], [("param", p)], [3 * e * e * FLOAT], [None], handoff="view")
    copied = ctx.alloc("clone.default")
    copy_fn = ctx.grad_fn([], [("fn", transposed)], [xb], [None], out_shape=shape.seq, shapes=[shape.seq])
    rows = ctx.grad_fn([], [("fn", copy_fn)], [xb], [None], handoff="view", out_shape=(tokens * batch, e),
                       shapes=[shape.seq])
    product = ctx.alloc("mm.default", 3 * xb)
    mm = ctx.grad_fn([copied], [("fn", rows), ("fn", weight_t)], [xb, 3 * e * e * FLOAT], ["aten.mm.default"] * 2,
                     [1, 0], out_shape=(tokens * batch, 3 * e), shapes=[(tokens * batch, e), (e, 3 * e)])
    ctx.mem.drop(copied)
    packed = ctx.grad_fn([], [("fn", mm)], [3 * xb], [None], handoff="view", out_shape=shape.packed,
                         shapes=[(tokens * batch, 3 * e)])
    biased = ctx.alloc("add.Tensor", 3 * xb)
    ctx.mem.drop(product)
    add = ctx.grad_fn([], [("fn", packed), ("param", p + 1)], [3 * xb, 3 * e * FLOAT], [None, None],
                      full=[None, 3 * xb], out_shape=shape.packed, shapes=[shape.packed, (3 * e,)])
    qkv, selected = _attention_qkv(ctx, shape, add, biased)
    return _attention_output(ctx, shape, _attention_kernel(ctx, shape, qkv, selected))


@dataclass(frozen=True)
class _AttentionShape:
    """The shapes of a self-attention's tensors (N samples of L tokens of E features, ``heads`` heads)."""
    batch: int
    tokens: int
    embed: int
    heads: int

    @property
    def seq(self) -> tuple[int, int, int]:
        """[L, N, E]: the input as ``nn.MultiheadAttention`` reads it."""
        return self.tokens, self.batch, self.embed

    @property
    def packed(self) -> tuple[int, int, int]:
        """[L, N, 3E]: the packed projection's result."""
        return self.tokens, self.batch, 3 * self.embed

    @property
    def split(self) -> tuple[int, int, int, int]:
        """[N, heads, L, E / heads]: a query, key or value as the kernel reads it."""
        return self.batch, self.heads, self.tokens, self.embed // self.heads


def _attention_qkv(ctx: _OpContext, shape: _AttentionShape, add: int | None, biased: int) -> tuple[int, list]:
    """The packed projection unflattened to [L, N, 3, E], permuted to [3, L, N, E] (views) and made contiguous (the
    projection freed); the query, key and value selected, viewed as [L, N x heads, E / heads], transposed and viewed
    as [N, heads, L, E / heads]: (the contiguous copy's storage, the three views' autograd nodes)."""
    xb, (batch, heads, tokens, dim) = ctx.nbytes, shape.split
    stacked = (3, *shape.seq)
    unflattened = ctx.grad_fn([], [_fn_edge(add)], [3 * xb], [None], handoff="view",
                              out_shape=(*shape.seq[:2], 3, shape.embed), shapes=[shape.packed])
    permuted = ctx.grad_fn([], [_fn_edge(unflattened)], [3 * xb], [None], handoff="permute", perm=(2, 0, 1, 3),
                           out_shape=stacked, shapes=[(*shape.seq[:2], 3, shape.embed)])
    qkv = ctx.alloc("clone.default", 3 * xb)
    ctx.mem.drop(biased)
    copy_fn = ctx.grad_fn([], [_fn_edge(permuted)], [3 * xb], [None], out_shape=stacked, shapes=[stacked])
    picked = [ctx.grad_fn([], [_fn_edge(copy_fn)], [3 * xb], ["aten.select_backward.default"], out_shape=shape.seq,
                          shapes=[stacked]) for _ in range(3)]
    transposed = []
    for sel in picked:
        viewed = ctx.grad_fn([], [_fn_edge(sel)], [xb], [None], handoff="view", out_shape=(tokens, batch * heads, dim),
                             shapes=[shape.seq])
        transposed.append(ctx.grad_fn([], [_fn_edge(viewed)], [xb], [None], handoff="transpose", dims=(0, 1),
                                      out_shape=(batch * heads, tokens, dim), shapes=[(tokens, batch * heads, dim)]))
    split = [ctx.grad_fn([], [_fn_edge(t)], [xb], [None], handoff="view", out_shape=shape.split,
                         shapes=[(batch * heads, tokens, dim)]) for t in transposed]
    return qkv, split


def _attention_kernel(ctx: _OpContext, shape: _AttentionShape, qkv: int, split: list) -> int | None:
    """The memory-efficient kernel: its result (laid out as [N, L, heads, E / heads]), a log-sum-exp per head and
    token (the tokens padded to 32), a seed and an offset (8 bytes each), all kept with the query, key and value (in
    the order its node frees them); backward, a gradient of each laid out as the result: its autograd node."""
    xb, (batch, heads, tokens, dim) = ctx.nbytes, shape.split
    out = ctx.alloc(_EFFICIENT, xb, holders=0)
    lse = ctx.alloc(_EFFICIENT, batch * heads * -(-tokens // 32) * 32 * FLOAT, holders=0)
    seed, offset = (ctx.alloc(_EFFICIENT, INT64, holders=0) for _ in range(2))
    laid_out = ("fixed", (tokens * heads * dim, dim, heads * dim, 1))
    kernel = ctx.grad_fn([qkv, lse, out, offset, seed], [_fn_edge(f) for f in split], [xb] * 3,
                         [f"aten.{_EFFICIENT.replace('.default', '_backward.default')}"] * 3,
                         out_shape=shape.split, shapes=[shape.split] * 3, layouts=[laid_out] * 3, any_strides=True)
    ctx.mem.drop(qkv)  # the query, key and value: views the kernel's node keeps
    return kernel


def _attention_output(ctx: _OpContext, shape: _AttentionShape, kernel: int | None) -> _Value:
    """The kernel's result permuted to [L, N, heads, E / heads] and made contiguous (kept by the projection), viewed
    as rows for the output projection (``addmm``), viewed back as [L, N, E] and transposed to [N, L, E]."""
    xb, p, e = ctx.nbytes, ctx.first_param, shape.embed
    heads_first = (shape.tokens, shape.batch, shape.heads, e // shape.heads)
    permuted = ctx.grad_fn([], [_fn_edge(kernel)], [xb], [None], handoff="permute", perm=(2, 0, 1, 3),
                           out_shape=heads_first, shapes=[shape.split])
    copied = ctx.alloc("clone.default")
    copy_fn = ctx.grad_fn([], [_fn_edge(permuted)], [xb], [None], out_shape=heads_first, shapes=[heads_first])
    rows = ctx.grad_fn([], [_fn_edge(copy_fn)], [xb], [None], handoff="view", out_shape=(shape.tokens * shape.batch, e),
                       shapes=[heads_first])
    weight_t = ctx.grad_fn([], [("param", p + 2)], [e * e * FLOAT], [None], handoff="view")
    sid = ctx.alloc("addmm.default")
    flat = (shape.tokens * shape.batch, e)
    addmm = ctx.grad_fn([copied], [("param", p + 3), _fn_edge(rows), ("fn", weight_t)], [e * FLOAT, xb, e * e * FLOAT],
                        [None, "aten.mm.default", "aten.mm.default"], [0, 1, 2], [xb, None, None],
                        out_shape=flat, shapes=[(e,), flat, (e, e)])
    ctx.mem.drop(copied)
    viewed = ctx.grad_fn([], [_fn_edge(addmm)], [xb], [None], handoff="view", out_shape=shape.seq,
                         shapes=[(shape.tokens * shape.batch, e)])
    fn = ctx.grad_fn([], [_fn_edge(viewed)], [xb], [None], handoff="transpose", dims=(0, 1), shapes=[shape.seq])
    raw = (e, shape.batch * e, 1)
    return _Value(sid, xb, fn, view=True, strides=_normal(ctx.full_out, raw), raw=raw if 1 in ctx.full_out else None)


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


def _handed_back(ctx: _OpContext) -> _Value:
    """identity, and a dropout of ``p`` 0 (torch hands the input back: no kernel, no autograd node): the input."""
    x = ctx.x
    return _Value(ctx.mem.hold(x.sid), x.nbytes, x.fn, x.view, x.strides, raw=x.raw, loose=x.loose)


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
