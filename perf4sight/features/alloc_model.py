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

- **Setup**: each layer's parameters (weight then bias), then its buffers (batch norm's running mean, running
  variance and int64 step counter), in the order ``Module.to`` moves them to the device (:func:`_moved_order`), then
  the input batch and the labels.
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
  tensor); a chunk's or a split's pieces (narrows of ``split_sizes``, rebuilt as one ``torch.split``) hand theirs to
  the split's one node, which gathers them into the input's (``cat``) once every piece's has arrived. Max pooling
  (plain or adaptive) keeps its input and int64 indices; a scalar add keeps nothing and hands its gradient on, a
  scalar multiply scales it (a new tensor).
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
  A conv2d's standardised weight (``standardize``) is its spelling's ops before the convolution, each its own
  autograd node (:func:`~perf4sight.features.alloc_forward._standardised_weight`; ``torch.var_mean``'s one node
  gathering its two outputs' gradients), the parameter's gradients from them summed as a shared parameter's.
  A conv2d's or linear's weight of weight_norm's parametrization is ``_weight_norm_interface``'s, kept by the layer's
  node, its norms by weight_norm's (:func:`~perf4sight.features.alloc_forward._weight_normed`); of spectral_norm's,
  its power iteration's temporaries, u and v cloned, sigma and the weight over it, whose backward is a division's
  (:func:`~perf4sight.features.alloc_forward._spectral_normed`). Their hook forms go to the trace.
  A log-softmax keeps its result, as a softmax does. A PReLU keeps its input; its backward allocates the input's
  gradient and the slopes' per element, summed down to the slopes (:func:`_prelu`). A dropout2d allocates a
  noise per sample and channel, then its output (the input times the noise); it keeps the noise. A dropout of
  ``p`` 0 (either kind) is the input handed back, as an identity is.
  A GLU allocates its output (half its input) and keeps its input; its backward allocates the input's gradient
  (:func:`_glu`). A hardshrink, a softshrink and a threshold keep their input, a threshold in place a clone of its
  input (made before it runs, as a mish's). A log-sigmoid keeps its input and a buffer that CUDA leaves empty (no
  block; a CPU's is of the input's size).

This module is the entry point (:func:`step_events`), the node loop (:func:`_forward`) and the table of handlers
(``_HANDLERS``); the handlers of one op are in :mod:`~perf4sight.features.alloc_forward`, the composite ops in
:mod:`~perf4sight.features.alloc_composite`, the loss and the backward pass in
:mod:`~perf4sight.features.alloc_backward`, the repeat of a node's work in :mod:`~perf4sight.features.alloc_repeat`,
what they all work with in :mod:`~perf4sight.features.alloc_values` and the strides in
:mod:`~perf4sight.features.alloc_strides`.
"""
from __future__ import annotations

from dataclasses import dataclass
from math import prod
from typing import Callable

from perf4sight.features.alloc_backward import _backward, _loss, _regression_loss, _target_bytes
from perf4sight.features.alloc_composite import _group_attention, _l2_normalize, _patch_merge, _window_attention
from perf4sight.features.alloc_forward import (_activation, _affine_grid, _alpha_dropout, _attention, _combine, _cumsum,
                                               _linspace,
                                               _dropout2d, _extreme, _frozen_batch_norm, _glu, _grid_sample, _im2col,
                                               _instance_norm, _interpolate, _layer_norm, _lays_out, _logsumexp, _maths,
                                               _matrix_product, _permute, _pooling, _prelu, _quotient, _rearrange,
                                               _reordered_copy, _rrelu, _scale, _shift, _softmax, _sorted, _tiling,
                                               _token, _variance, _view_op, _weighted_sum, _where, _with_parameters)
from perf4sight.features.alloc_repeat import _REPEATED, _repeated
from perf4sight.features.alloc_values import (_ACTIVATIONS, _VIEWS, ACCUMULATED, FLOAT, Event, NotCovered, _GradFn,
                                              _Memory, _OpContext, _params, _Value, _window_parameters)
from perf4sight.features.frozen import ALL, frozen_of
from perf4sight.features.walk import unreached
from perf4sight.ir.schema import CONSTANT_MODES, SHARES, NetworkDescription, Node, split_group, unbind_group
from perf4sight.ir.shapes import SIZE_REFERENCES
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
                     "linspace",
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


#: The norms' constant modes (:data:`CONSTANT_MODES`: normalised by running statistics in the training step) left to
#: the meta trace: an instance norm's. A batch norm's is written down as in training
#: (:func:`~perf4sight.features.alloc_forward._with_parameters`: the meta kernel allocates its two statistics all the
#: same).
_TRACED_CONSTANT_MODES = {op: attr for op, attr in CONSTANT_MODES.items() if op != "batchnorm2d"}


def step_events(desc: NetworkDescription, batch_size: int, relu6_clone: bool = False,
                loss_name: str = DEFAULT_LOSS) -> _Step:
    """The setup and first-step events of ``desc`` at ``batch_size`` (bytes); ``relu6_clone``: an in-place
    ReLU6 keeps a clone of its input (PyTorch >= 1.10), not its result; ``loss_name``: the step's loss
    (``profiling.plan.LOSSES``). Raises :class:`NotCovered`."""
    for n in desc.nodes:
        if n.op not in COVERED:
            raise NotCovered(f"op '{n.op}'")
        if n.attrs.get(_TRACED_CONSTANT_MODES.get(n.op, ""), True) is False:
            raise NotCovered(f"{n.op} of {_TRACED_CONSTANT_MODES[n.op]} false")
        for form in ("weight_norm", "spectral_norm"):  # the weight computed and kept, its backward: to the trace
            if n.attrs.get(form) and n.attrs[form] != "parametrization":
                raise NotCovered(f"a {n.op} of {form}")  # but the parametrizations (alloc_forward)
    mem = _Memory()
    b = int(batch_size)
    param_bytes: list[int] = []
    first_param: dict[str, int] = {}
    moved: list[int] = []  # the parameters' and buffers' bytes in the order ``Module.to`` allocates them
    for n in desc.nodes:
        if SHARES in n.attrs:  # a layer called again: its first call's parameters and buffers
            first_param[n.name] = first_param[n.attrs[SHARES]]
            continue
        p, bufs = _params(n)
        first_param[n.name] = len(param_bytes)
        param_bytes += p
        moved += _moved_order(n, p, bufs)
    for nbytes in moved:
        mem.new(nbytes, "setup")
    frozen = _frozen_indices(desc, first_param) if desc.extra else frozenset()
    values: dict[str, _Value] = {}
    fns: list[_GradFn] = []
    reads = {n.name: _reads(n) for n in desc.nodes}  # what each node's call reads: for both below
    users = _last_uses(desc, reads)
    shapes = {n.name: list(n.output_shape) for n in desc.nodes}
    splits: dict = {}  # torch.split calls -> their autograd node (alloc_forward._split_piece)
    dead = _dead_nodes(desc, reads)
    branch = _DeadBranch(fns, mem)
    for n in desc.nodes:
        if n.op == "input":  # held by the caller too
            nbytes = b * prod(desc.input_shape) * FLOAT
            values[n.name] = _Value(mem.new(nbytes, "input", holders=2), nbytes, None)
            mem.new(_target_bytes(desc, b, loss_name), "labels")  # held by the caller for the whole run
            setup = list(mem.events)
            mem.events.clear()
            continue
        ins = [values[i] for i in n.inputs]
        made = len(fns)
        values[n.name] = _forward(n, ins, [shapes[i] for i in n.inputs], b, mem, fns, first_param[n.name],
                                  relu6_clone, splits, frozen)
        if n.name in dead:
            branch.made(range(made, len(fns)), values[n.name])
        for name in users.get(n.name, []):
            mem.drop(values[name].sid)
            if name in dead:
                branch.dropped(values[name])
    if branch.left():
        raise NotCovered("a dead branch's autograd node that its values' drops do not free")
    out = values[desc.output]
    logits, loss, root = _loss(out, len(desc.label_shape), mem, fns) if loss_name == DEFAULT_LOSS else \
        _regression_loss(out, loss_name, mem, fns)
    grads = _backward(fns, root, mem, branch.released)
    body = list(mem.events)
    mem.events.clear()
    mem.drop(logits)  # del out, loss (after the optimizer step)
    mem.drop(loss)
    return _Step(setup, body, list(mem.events), grads, param_bytes, mem.new_id)


def _moved_order(n: Node, params: list[int], buffers: list[int]) -> list[int]:
    """The bytes of ``n``'s parameters and buffers (:func:`_params`' lists) in the order ``Module.to`` moves them to
    the device (``Module._apply``: each submodule first, then the module's own parameters, then its own buffers):
    an attention's output projection before its packed input one (``nn.MultiheadAttention``'s own), a group or
    window attention's linear layers before its bias table (and V2's logit scale), and every layer's buffers right
    after its parameters."""
    if n.op == "attention" and len(params) == 4:  # in_proj weight and bias (its own), out_proj's (a submodule)
        return params[2:] + params[:2] + buffers
    if n.op == "group_attention":  # the bias table (its own), then to_qkv's and merge's
        return params[1:] + params[:1] + buffers
    if n.op == "window_attention":  # its own: the bias table or (V2) the logit scale, first in _window_parameters
        own = sum(name in ("table", "logit_scale") for name in _window_parameters(n, 0))
        return params[own:] + params[:own] + buffers
    if n.attrs.get("weight_norm") == "parametrization":  # its parametrization (a submodule) first: g, v, the bias
        return params[-2:] + params[:-2] + buffers
    if n.attrs.get("spectral_norm") == "parametrization":  # spectral_norm's u and v, its original weight, the bias
        return buffers + params[-1:] + params[:-1]
    return params + buffers


#: The ops whose frozen parameters (``frozen.py``) the model writes down (each checked against the meta trace); any
#: other's go to the trace.
_FROZEN_OPS = ("conv2d", "conv_transpose2d", "batchnorm2d", "linear", "layernorm", "groupnorm", "rmsnorm", "scale",
               "shift", "token", "attention", "window_attention")
#: Of those, the ops frozen whole alone (their parameters are not a weight and a bias).
_FROZEN_WHOLE = ("attention", "window_attention")


def _frozen_indices(desc: NetworkDescription, first_param: dict[str, int]) -> frozenset[int]:
    """The indices of ``desc``'s frozen parameters (``frozen.frozen_of``; ``first_param``: each node's first),
    which get no gradient; :class:`NotCovered` where one is of a layer :data:`_FROZEN_OPS` leaves out (an
    attention's) or of a standardised or normed weight (weight_norm, spectral_norm). The handlers' edges to a frozen
    parameter are none (:meth:`~perf4sight.features.alloc_values._OpContext.grad_fn`)."""
    out: set[int] = set()
    nodes = {n.name: n for n in desc.nodes}
    for name, names in frozen_of(desc).items():
        n = nodes[name]
        p, _ = _params(n)
        if n.op not in _FROZEN_OPS or n.attrs.get("standardize") or n.attrs.get("weight_norm") or \
                n.attrs.get("spectral_norm"):
            raise NotCovered(f"frozen parameters of a {n.op}")
        if not names <= {ALL, "weight", "bias"} or n.op in _FROZEN_WHOLE and ALL not in names:
            raise NotCovered(f"frozen parameters of a {n.op} named {sorted(names)}")
        roles = ("weight", "bias") if n.op not in _FROZEN_WHOLE else ()
        out.update(first_param[name] + k for k in range(len(p)) if ALL in names or k < len(roles) and roles[k] in names)
    return frozenset(out)


def _dead_nodes(desc: NetworkDescription, reads: dict[str, list[str]] | None = None) -> set[str]:
    """The nodes whose value no read leads to the network's output (a dead branch: ``y = self.b(x)``, ``y`` never
    used); a piece of a split among them is :class:`NotCovered` (torch's split backward fills its gradient with
    zeros, which the model does not write down), and so is an op in place (a ReLU, which the step runs in place, an
    activation of ``inplace`` or ``on_copy``): what its node keeps is the value it rebased, freed otherwise. The reads
    are the edges (``walk.unreached``; ``walk.untrained_nodes`` goes by the gradient inputs instead: a where's
    condition is read, so not dead here, but no gradient reaches it). ``reads``: each node's :func:`_reads`, where the
    caller has them."""
    dead = set(unreached(desc, _reads if reads is None else lambda n: reads[n.name]))
    for n in desc.nodes:
        if n.name in dead and (split_group(n) is not None or unbind_group(n) is not None):
            raise NotCovered("a piece of a split that no gradient reaches")
        if n.name in dead and (n.op in ("relu", "relu6") or n.attrs.get("inplace") or n.attrs.get("on_copy")):
            raise NotCovered(f"an op in place in a dead branch ({n.name})")
    return dead


class _DeadBranch:
    """The autograd nodes of a dead branch's ops: torch makes them as for any op (they keep what their backward
    would read), and frees each, and what it keeps, once nothing refers to it: neither a value of the branch (the
    graph module drops a value nothing reads right after it is made) nor a node of the branch after it. None of
    them runs backward (``released``, which :func:`_backward` passes over); their parameters get no gradient."""

    def __init__(self, fns: list[_GradFn], mem: _Memory) -> None:
        self.fns, self.mem = fns, mem
        self.refs: dict[int, int] = {}  # a dead node -> the values and dead nodes that refer to it
        self.released: set[int] = set()

    def made(self, nodes: range, value: _Value) -> None:
        """The autograd ``nodes`` a dead op made, ``value`` its output."""
        for k in nodes:
            self.refs[k] = self.refs.get(k, 0)
            for edge in self.fns[k].edges:
                if edge is not None and edge[0] == "fn" and edge[1] in self.refs:
                    self.refs[edge[1]] += 1
        if value.fn is not None:
            if value.fn not in self.refs:
                raise NotCovered("a dead op's value of a node another op made")
            self.refs[value.fn] += 1

    def dropped(self, value: _Value) -> None:
        """A dead op's ``value`` dropped: its node freed where nothing else refers to it, and so on up the branch."""
        todo = [] if value.fn is None else [value.fn]
        while todo:
            k = todo.pop()
            self.refs[k] -= 1
            if self.refs[k]:
                continue
            self.released.add(k)
            fn = self.fns[k]
            for s in fn.saved:
                self.mem.drop(s)
            kept = {s for j, f in enumerate(self.fns) if j not in self.released for s in f.saved}
            self.mem.saved.difference_update(s for s in fn.saved if s not in kept)
            todo += [edge[1] for edge in fn.edges if edge is not None and edge[0] == "fn" and edge[1] in self.refs]

    def left(self) -> bool:
        """Whether a dead op's node was not freed by the end of the forward."""
        return len(self.released) != len(self.refs)


def _reads(n: Node) -> list[str]:
    """The values the rebuilt module's call of ``n`` reads: its inputs, then the map it takes its size from where it
    names one (:data:`SIZE_REFERENCES`: the call's argument after its input, read for its shape)."""
    like = n.attrs.get(SIZE_REFERENCES.get(n.op, ""))
    return [*n.inputs, like] if isinstance(like, str) else list(n.inputs)


def _last_uses(desc: NetworkDescription, reads: dict[str, list[str]] | None = None) -> dict[str, list[str]]:
    """Node name -> the values the graph module drops right after it (their last use), in the order
    of its reads (:func:`_reads`); the network's output is kept (returned), and a value nothing reads (a dead branch's
    end) is dropped right after it is made, as torch.fx's code does. Not covered: a map
    whose last reader is a transposed convolution taking its output size from it (the rebuilt module drops it after
    reading its shape, before the convolution runs). ``reads``: each node's :func:`_reads`, where the caller has
    them."""
    reads = {n.name: _reads(n) for n in desc.nodes} if reads is None else reads
    last: dict[str, str] = {}
    for n in desc.nodes:
        for i in reads[n.name]:
            last[i] = n.name
    for n in desc.nodes:
        if n.name not in last and n.name != desc.output:  # a dead branch's end: dropped right after it is made
            last[n.name] = n.name
        if n.op == "conv_transpose2d" and last.get(n.attrs.get("output_size_of", "")) == n.name:
            raise NotCovered("a transposed convolution sized by a map nothing after it reads")
    out: dict[str, list[str]] = {}
    for n in desc.nodes:
        for i in dict.fromkeys([*reads[n.name], n.name]):  # its inputs, then itself where nothing reads it
            if i != desc.output and last[i] == n.name:
                out.setdefault(n.name, []).append(i)
    return out


def _forward(n: Node, ins: list[_Value], in_shapes: list[list[int]], b: int, mem: _Memory, fns: list[_GradFn],
             p0: int, relu6_clone: bool = False, splits: dict | None = None,
             frozen: frozenset = frozenset()) -> _Value:
    """Run node ``n`` forward (inputs ``ins`` of per-sample shapes ``in_shapes``, batch ``b``; its
    parameters are ``p0``, ``p0 + 1``...; ``relu6_clone`` as :func:`step_events`'s; ``splits``: the step's split
    calls so far, :attr:`_OpContext.splits`; ``frozen``: the frozen parameters' indices): its allocations, its
    autograd node (appended to ``fns``), its value."""
    ctx = _OpContext(n, ins, in_shapes, b, mem, fns, p0, ins[0], b * prod(n.output_shape) * FLOAT,  # output bytes
                     (b, *in_shapes[0]), (b, *n.output_shape), relu6_clone, splits, frozen)
    ctx.check_strides()
    handler = _HANDLERS.get(n.op)
    if handler is None:
        raise NotCovered(f"op '{n.op}'")
    out = _repeated(ctx, handler) if n.op in _REPEATED else handler(ctx)
    if out.raw is None and not out.loose and 1 in ctx.full_out and not _lays_out(n) and \
            any(i.raw is not None or i.loose for i in ins):
        out.loose = True  # its output may be laid out as its input, along dimensions of size 1 too
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
    "linspace": _linspace,
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
