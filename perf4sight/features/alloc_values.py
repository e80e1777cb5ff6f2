"""What the allocation model (:mod:`perf4sight.features.alloc_model`) works with as it writes a step down: a forward
value (:class:`_Value`: its storage, bytes, autograd node and strides), an autograd node (:class:`_GradFn`: what it
keeps, where its gradients go and what they cost), the memory (:class:`_Memory`: storages, their holders and the
events), a node's parameter and buffer bytes (:func:`_params`) and one node's context (:class:`_OpContext`: its
inputs, sizes and the helpers that make its autograd node and allocations), with the event kinds and op sets they
share. :class:`NotCovered` says a description goes to the meta trace.
"""
from __future__ import annotations

from dataclasses import dataclass
from math import prod
from typing import TYPE_CHECKING

from perf4sight.features.alloc_strides import _channels_last_like, _dense, _ordered, _strides
from perf4sight.features.allocator import ALLOC, FREE
from perf4sight.ir.schema import Node
from perf4sight.ir.shapes import window_pair

if TYPE_CHECKING:  # annotations only
    from perf4sight.features.alloc_repeat import _Repeat


FLOAT, INT64 = 4, 8
ACCUMULATED = 3  # event kind: a parameter's gradient accumulated (tensor field = parameter index)
Event = tuple[int, int, int, str]  # (kind, storage id, bytes, aten op)
#: Out-of-place activations: op -> (aten name, what the backward keeps: the "input" or the "result").
_ACTIVATIONS = {"hardswish": ("hardswish", "input"), "hardsigmoid": ("hardsigmoid", "input"), "silu": ("silu", "input"),
                "gelu": ("gelu", "input"), "sigmoid": ("sigmoid", "result"), "tanh": ("tanh", "result"),
                "leaky_relu": ("leaky_relu", "input"), "elu": ("elu", "input"),
                "softplus": ("softplus", "input"), "mish": ("mish", "input"),
                "hardtanh": ("hardtanh", "input"),
                "selu": ("elu", "input"), "celu": ("celu", "input"),
                "hardshrink": ("hardshrink", "input"), "softshrink": ("softshrink", "input"),
                "threshold": ("threshold", "input"),
                # aten.log_sigmoid_forward: its output and a buffer it keeps with its input, which CUDA leaves empty
                # (no block; the meta trace makes it so: alloc_trace._cuda_outputs)
                "log_sigmoid": ("log_sigmoid_forward", "input")}
#: Activations whose backward is another kernel's than ``aten.<name>_backward``: a CELU's is an ELU's.
_BACKWARD_OF = {"celu": "elu", "log_sigmoid_forward": "log_sigmoid"}
_VIEWS = {"reshape", "flatten", "squeeze", "unsqueeze"}
#: Ops that take a strided (non-contiguous) input as it is; any other op on one is not covered,
#: except elementwise ones on inputs whose dimensions keep their order (their output is contiguous).
_TAKE_STRIDED = {"conv2d", "conv_transpose2d", "cat", "identity", "transpose", "narrow", "select", "permute",
                 "layernorm", "token",
                 "matmul",
                 "grid_sample"} | _VIEWS
#: Ops that take a dense input of any layout (a channels-last one, a permuted one): their outputs' strides follow
#: the inputs' as torch's TensorIterator lays them out (:func:`_iterated`).
_TAKE_DENSE = {"add", "scale", "shift"}
_ELEMENTWISE = {"add", "mul", "div", "pow", "exp", "abs", "log"} | set(_ACTIVATIONS)


class NotCovered(Exception):
    """The description has an op or a pattern this model does not cover: use the meta trace."""


@dataclass(slots=True)
class _Value:
    """A tensor of the forward pass: its storage, its bytes, the autograd node that made it (None:
    needs no gradient), whether it is a view of another value's storage, its strides."""
    sid: int
    nbytes: int
    fn: int | None
    view: bool = False
    strides: tuple[int, ...] | None = None  # None: contiguous
    base_fn: int | None = None  # a view of a tensor no other value holds (an instance norm's): its base's node
    # torch's strides along every dimension, those of size 1 included, where a permute made them other than a
    # contiguous tensor's (``strides`` leaves those out); ``loose``: not followed there (:func:`_full_strides`)
    raw: tuple[int, ...] | None = None
    loose: bool = False


def _full_strides(v: _Value, shape: tuple[int, ...]) -> tuple[int, ...] | None:
    """Torch's strides of ``v`` (of ``shape``) along every dimension, those of size 1 included, or None where the
    model does not follow them (a value of size-1 dimensions after a permute, through an op that lays its output out
    as its input)."""
    if v.raw is not None:
        return v.raw
    if v.loose:
        return None
    return v.strides or _strides(shape)


@dataclass(slots=True)
class _GradFn:
    """An autograd node: what it keeps, where its gradients go, and what they cost.

    ``edges[j]``: ("fn", node index) | ("param", parameter index) | None (no gradient needed);
    ``sizes[j]``: bytes of gradient ``j``; ``kernels[j]``: the aten op that allocates it, None where
    the incoming gradient (or a view of it) is handed on; ``order``: the order the gradients are
    computed in; ``full[j]``: for an input that was broadcast, the bytes of its gradient before the
    engine sums it down to ``sizes[j]`` (after the node's own kernels), else None; ``scratch``: (bytes, aten
    op) of temporaries the node allocates after its gradients and frees before it returns; ``handoff``: how
    a node without kernels hands the incoming gradient on: "" as it is (add, clone), "slices" (cat:
    views of parts of it), "view" (a view op: reshaped, a copy where the strides do not allow a
    view), "transpose"; ``then``: the op that makes each gradient of a ``full`` one, which is freed after it (the
    engine's sum down to a broadcast input's shape; an L1 loss's ``mul`` of the incoming gradient by the ``sgn``
    its kernel allocated)."""
    saved: list[int]
    edges: list[tuple[str, int] | None]
    sizes: list[int]
    kernels: list[str | None]
    order: list[int]
    full: list[int | None]
    handoff: str = ""
    shapes: list[tuple[int, ...]] | None = None  # each input's shape (with the batch), for the handoffs
    out_shape: tuple[int, ...] = ()              # the output's shape (with the batch)
    dims: tuple[int, int] = (0, 0)               # a transpose's two dimensions
    scratch: list[tuple[int, str]] | None = None  # temporaries: (bytes, aten op), in allocation order
    # temporaries allocated before the gradients (a pow's x ** (p - 1), then its times p), freed once the first
    # gradient is allocated
    before: list[tuple[int, str]] | None = None
    then: str = "aten.sum.dim_IntList"           # the op that makes a gradient from a full one
    perm: tuple[int, ...] = ()                   # a permute's dimensions (its backward permutes back)
    # the strides of each gradient its kernel allocates: None contiguous, ("fixed", strides), or ("iterated", the
    # other operands' strides): an elementwise kernel of the incoming gradient (first) and those (:func:`_iterated`);
    # ("like", []): as the incoming gradient, which has no dimension of size 1 where it is strided (a layer norm's)
    layouts: list | None = None
    any_strides: bool = False  # its kernels take an incoming gradient of any strides (their outputs' do not follow)
    # per gradient: whether it reaches its parameter with strides other than the parameter's, which AccumulateGrad
    # copies into a new tensor of the parameter's strides (``new_empty_strided``) before keeping it
    restride: list[bool] | None = None
    # a split's node (``torch.chunk``), or a call's of two outputs (``torch.var_mean``'s): the gradients of its parts
    # (outputs), each from its own node, gathered as they arrive (no sum), all freed once its kernel (a split's ``cat``,
    # var_mean's ``add`` of its two parts' gradients) has allocated the input's gradient
    gathers: int = 0
    # per gradient: temporaries (bytes, aten op) allocated, in order, right before its kernel and freed, last first,
    # right after it (a maximum's compares, halved gradient and where); one of (bytes, aten op, at) is freed right
    # after the at-th temporary is allocated instead (a std's backward: alloc_backward._temporaries)
    around: list[list[tuple]] | None = None


class _Memory:
    """Storages with holders; an event per allocation and per free."""

    def __init__(self) -> None:
        self.events: list[Event] = []
        self.holders: dict[int, int] = {}
        self.saved: set[int] = set()  # storages an autograd node of the forward keeps for backward
        self.last_id = 0
        self.repeats: dict[tuple, _Repeat | None] = {}  # a node's key -> what its handler did (:func:`_repeated`)

    def new_id(self) -> int:
        self.last_id += 1
        return self.last_id

    def new(self, nbytes: int, op: str, holders: int = 1) -> int:
        self.last_id += 1  # new_id's, without its call: the model makes thousands
        sid = self.last_id
        self.events.append((ALLOC, sid, nbytes, op))
        self.holders[sid] = holders
        return sid

    def hold(self, sid: int) -> int:
        self.holders[sid] += 1
        return sid

    def drop(self, sid: int) -> None:
        self.holders[sid] -= 1
        if self.holders[sid] == 0:
            del self.holders[sid]
            self.events.append((FREE, sid, 0, ""))


#: The ops :func:`_params` gives parameters or buffers (any other: none, unless weight- or spectral-normed).
_PARAM_OPS = frozenset({"conv2d", "conv_transpose2d", "batchnorm2d", "frozen_batchnorm2d", "groupnorm", "instancenorm",
                        "prelu", "layernorm", "shift", "scale", "token", "weighted_sum", "attention",
                        "window_attention", "group_attention", "rmsnorm", "where", "linear"})


def _params(node: Node) -> tuple[list[int], list[int]]:
    """(parameter bytes, buffer bytes) of ``node``'s module, in registration order."""
    a = node.attrs
    if node.op not in _PARAM_OPS and "weight_norm" not in a and "spectral_norm" not in a:  # most nodes: at once
        return [], []
    if a.get("weight_norm") == "parametrization":  # the layer's bias, then its parametrization's g and v
        return _weight_normed_params(node), []
    if a.get("spectral_norm") == "parametrization":  # the bias, the original weight; the power iteration's u and v
        return _spectral_normed_params(node)
    if node.op in ("conv2d", "conv_transpose2d"):  # a transposed one's weight: [Cin, Cout / groups, kh, kw]
        kh, kw = a["kernel_size"]
        w = a["out_channels"] * (a["in_channels"] // a["groups"]) * kh * kw * FLOAT
        if a.get("fixed"):  # its filter a buffer (a blur pool's), no bias
            return [], [w]
        gain = [a["out_channels"] * FLOAT] if "standardize_scale" in a else []  # a scaled standardisation's gain
        return ([w, a["out_channels"] * FLOAT] if a["bias"] else [w]) + gain, []
    if node.op == "batchnorm2d":  # a weight and a bias unless not affine; the running mean, variance and count
        c = a["num_features"] * FLOAT  # unless it tracks no running statistics
        return ([c, c] if a.get("affine", True) else []), ([c, c, INT64] if a.get("track_running_stats", True) else [])
    if node.op == "frozen_batchnorm2d":  # no parameters; a weight, a bias, a running mean and variance as buffers
        c = a["num_features"] * FLOAT
        return [], [c, c, c, c]
    if node.op == "groupnorm":  # a weight and a bias unless not affine; no buffers
        c = a["num_channels"] * FLOAT
        return ([c, c] if a.get("affine", True) else []), []
    if node.op == "instancenorm":  # a weight and a bias where affine (not by default); the running mean, variance
        c = a["num_features"] * FLOAT  # and count where it tracks running statistics
        return ([c, c] if a.get("affine", False) else []), ([c, c, INT64] if a.get("track_running_stats") else [])
    if node.op == "prelu":  # its slopes
        return [a["num_parameters"] * FLOAT], []
    if node.op == "layernorm":  # a weight and a bias over the normalised shape unless not elementwise affine
        c = prod(a["normalized_shape"]) * FLOAT
        return ([c, c] if a.get("elementwise_affine", True) else []), []
    if node.op == "shift" and a.get("fixed"):  # a buffer, no parameter
        return [], [prod(a["shape"]) * FLOAT]
    if node.op in ("scale", "shift", "token"):
        return [prod(a["shape"]) * FLOAT], []
    if node.op == "weighted_sum":  # a weight per map
        return [a["num_inputs"] * FLOAT], []
    if node.op == "attention":  # the packed input projection's weight and bias, the output projection's
        e = a["embed_dim"]
        return ([3 * e * e * FLOAT, 3 * e * FLOAT, e * e * FLOAT, e * FLOAT] if a["bias"] else []), []
    if node.op == "window_attention":
        return _window_parameter_bytes(node)
    if node.op == "group_attention":  # its bias table (its own), the packed projection's weight and bias, the merge's
        e, heads, (wh, ww) = node.attrs["embed_dim"], node.attrs["num_heads"], window_pair(node.attrs["window_size"])
        params = [(2 * wh - 1) * (2 * ww - 1) * heads * FLOAT, 3 * e * e * FLOAT, 3 * e * FLOAT, e * e * FLOAT,
                  e * FLOAT]
        return params, [wh * ww * wh * ww * INT64]
    if node.op == "rmsnorm":  # a weight of normalized_shape unless not elementwise_affine; no bias, no buffers
        return ([prod(a["normalized_shape"]) * FLOAT] if a.get("elementwise_affine", True) else []), []
    if node.op == "where" and "mask_shape" in a:  # a fixed boolean mask, a byte an element
        return [], [prod(a["mask_shape"])]
    if node.op == "linear":
        w = a["out_features"] * a["in_features"] * FLOAT
        return ([w, a["out_features"] * FLOAT] if a["bias"] else [w]), []
    return [], []


def _edge(v: _Value) -> tuple[str, int] | None:
    """Where the gradient of ``v`` goes: its autograd node, or None where it needs none."""
    return None if v.fn is None else ("fn", v.fn)


@dataclass(slots=True)
class _OpContext:
    """What one node's forward works with: the node, its inputs, the memory and the autograd nodes.

    Shapes: ``in_shapes`` per sample (no batch dimension); ``full_in`` (the first input's) and
    ``full_out`` with the batch. Sizes in bytes at ``batch``."""
    node: Node
    inputs: list[_Value]
    in_shapes: list[list[int]]
    batch: int
    mem: _Memory
    fns: list[_GradFn]
    first_param: int             # index of the node's first parameter (weight; bias next)
    x: _Value                    # the first input
    nbytes: int                  # the output's bytes
    full_in: tuple[int, ...]     # the first input's shape with the batch (() without inputs)
    full_out: tuple[int, ...]    # the output's shape with the batch
    relu6_clone: bool = False    # an in-place ReLU6 keeps a clone of its input (PyTorch >= 1.10)
    # the step's torch.split calls (schema.split_group) -> the autograd node of each, made at its first piece
    splits: dict | None = None
    frozen: frozenset = frozenset()  # the indices of the step's frozen parameters (no gradient: alloc_model)

    def check_strides(self) -> None:
        """:class:`NotCovered` where a strided input reaches an op that does not take one as it is."""
        if self.x.strides is None and len(self.inputs) == 1:  # most nodes: one dense input
            return
        op = self.node.op
        strided = [(tuple([self.batch] + list(sh)), i.strides)
                   for sh, i in zip(self.in_shapes, self.inputs) if i.strides is not None]
        if not strided or op in _TAKE_STRIDED or (op in _ELEMENTWISE and all(_ordered(*st) for st in strided)):
            return
        if self.node.attrs.get("on_copy"):  # a contiguous copy, first
            return
        if op in _TAKE_DENSE and self.node.attrs.get("scalar") is None and all(_dense(*st) for st in strided):
            return
        if op == "adaptiveavgpool2d" and self.channels_last(self.x):  # a mean, then restrided (_pooling)
            return
        if op == "linear" and len(self.in_shapes[0]) == 1:  # addmm reads a strided 2-D input as it is
            return
        if op in ("dropout", "dropout2d") and float(self.node.attrs["p"]) == 0:  # the input handed back
            return
        raise NotCovered(f"{op} of a strided tensor")

    def channels_last(self, x: _Value) -> bool:
        """Whether torch suggests the channels-last format for the first input ``x`` (:func:`_channels_last_like`);
        :class:`NotCovered` where that turns on strides along dimensions of size 1 that the model does not follow."""
        strides = _full_strides(x, self.full_in)
        if strides is None:
            raise NotCovered("the layout of a tensor with a dimension of size 1 after a permute")
        return _channels_last_like(self.full_in, strides)

    def grad_fn(self, saved: list[int], edges: list, sizes: list[int], kernels: list[str | None],
                order: list[int] | None = None, full: list[int | None] | None = None, handoff: str = "",
                out_shape: tuple[int, ...] | None = None, dims: tuple[int, int] = (0, 0),
                scratch: list[tuple[int, str]] | None = None,
                shapes: list[tuple[int, ...]] | None = None,
                before: list[tuple[int, str]] | None = None, **layout) -> int | None:
        """The node's autograd node (fields as :class:`_GradFn`; ``sizes`` and ``full`` in bytes; ``order``
        default: input order; ``out_shape`` default: ``full_out``; ``shapes`` default: the inputs' with the batch;
        ``layout``: ``perm``, ``layouts``, ``any_strides``, ``restride``) appended to ``fns``: its index, or None when
        no input needs a gradient (``saved`` is dropped)."""
        # a frozen parameter takes no gradient (``frozen``), an input that needs none is no edge
        edges = [None if e is not None and (e[1] is None or e[0] == "param" and e[1] in self.frozen) else e
                 for e in edges]
        for s in saved:
            self.mem.hold(s)
        if not any(edges):  # every edge None (an edge is a non-empty tuple)
            for s in saved:
                self.mem.drop(s)
            return None
        self.mem.saved.update(saved)
        self.fns.append(_GradFn(saved, edges, sizes, kernels, order if order is not None else list(range(len(edges))),
                                full or [None] * len(edges), handoff,
                                shapes or [(self.batch, *sh) for sh in self.in_shapes],
                                self.full_out if out_shape is None else out_shape, dims, scratch, before,
                                **layout))
        return len(self.fns) - 1

    def unary_grad_fn(self, kernel: str | None, saved: list[int]) -> int | None:
        """:meth:`grad_fn` of a one-input op whose backward ``kernel`` (None: hands the gradient on)
        allocates a gradient of the input's bytes."""
        return self.grad_fn(saved, [_edge(self.x)], [self.x.nbytes], [kernel])

    def alloc(self, kernel: str, size: int | None = None, holders: int = 1) -> int:
        """A new storage of ``size`` bytes (default: the output's), allocated by ``aten.<kernel>``."""
        return self.mem.new(self.nbytes if size is None else size, "aten." + kernel, holders)


def _weight_normed_params(node: Node) -> list[int]:
    """The parameter bytes of a conv2d or linear of weight_norm's parametrization, as ``Module.parameters`` gives them:
    the layer's own bias (if any), then its parametrization's g (one an output channel) and v (the weight's)."""
    a = dict(node.attrs)
    del a["weight_norm"]
    weight, *bias = _params(Node(node.name, node.op, node.inputs, a, node.output_shape))[0]
    return bias + [a.get("out_channels", a.get("out_features", 0)) * FLOAT, weight]


def _spectral_normed_params(node: Node) -> tuple[list[int], list[int]]:
    """The parameter bytes of a conv2d or linear of spectral_norm's parametrization, as ``Module.parameters`` gives
    them (the layer's own bias, if any, then its parametrization's original weight), and its buffers' (u, one an
    output channel, and v, one a column of the weight viewed [out, -1])."""
    a = {k: v for k, v in node.attrs.items() if not k.startswith("spectral_norm")}
    weight, *bias = _params(Node(node.name, node.op, node.inputs, a, node.output_shape))[0]
    out = a.get("out_channels", a.get("out_features", 0))
    return bias + [weight], [out * FLOAT, weight // out]


def _window_parameters(node: Node, p0: int) -> dict[str, int]:
    """The index of each of a window attention's parameters (its module's own first: the bias table, or V2's logit
    scale; then its children's: the packed projection's weight and bias, the output projection's, the bias MLP's
    first layer's weight and bias and its second's weight), from ``p0``."""
    a, names = node.attrs, []
    names += [] if a.get("position_bias_mlp") else ["table"]
    names += ["logit_scale"] if a.get("cosine") else []
    names += ["qkv", "qkv_bias", "proj", "proj_bias"]
    names += ["mlp", "mlp_bias", "mlp_out"] if a.get("position_bias_mlp") else []
    return {name: p0 + k for k, name in enumerate(names)}


def _window_parameter_bytes(node: Node) -> tuple[list[int], list[int]]:
    """A window attention's parameter bytes (:func:`_window_parameters`' order) and buffer bytes (V2's coordinates
    table, then the relative position index, int64)."""
    a = node.attrs
    e, heads, hidden = int(a["embed_dim"]), int(a["num_heads"]), int(a.get("position_bias_mlp", 0))
    wh, ww = window_pair(a["window_size"])
    positions = (2 * wh - 1) * (2 * ww - 1)
    sizes = {"table": positions * heads, "logit_scale": heads, "qkv": 3 * e * e, "qkv_bias": 3 * e, "proj": e * e,
             "proj_bias": e, "mlp": 2 * hidden, "mlp_bias": hidden, "mlp_out": hidden * heads}
    params = [sizes[name] * FLOAT for name in _window_parameters(node, 0)]
    buffers = [positions * 2 * FLOAT] if hidden else []
    return params, buffers + [wh * ww * wh * ww * INT64]


def _fn_edge(fn: int | None) -> tuple[str, int] | None:
    """The edge to autograd node ``fn`` (None: no gradient needed)."""
    return None if fn is None else ("fn", fn)
