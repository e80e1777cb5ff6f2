"""Tracing an ``nn.Module`` with torch.fx and giving its nodes their shapes on the meta device: the tracer that counts
a split's pieces and decides a condition on shapes (:func:`_trace`), shape propagation on a weightless twin
(:func:`_propagate_shapes`, :func:`run_on_meta`), a module in one mode for a block (:func:`in_mode`), and the
one-line error of a forward that fails (:func:`forward_error`)."""
from __future__ import annotations

import contextlib
import copy
import io
import re
import sys
import traceback
from pathlib import Path
from typing import Any, Iterator

import torch
import torch.fx as fx
from torch import nn
from torch._subclasses.fake_tensor import FakeTensorMode
from torch.fx.passes.shape_prop import ShapeProp

from perf4sight.errors import UserError
from perf4sight.ir.meta_shapes import MetaShapeProp
from perf4sight.ir.fx_values import _SPLITS, _TRACE_BATCH, _UNBINDS
from perf4sight.ir.torch_modules import _LEAF_MODULES, _described_whole


@contextlib.contextmanager
def stderr_kept_on_success() -> Iterator[None]:
    """Hold back what is written to stderr (torch's ``ShapeProp`` prints the traceback of a failing node
    before re-raising it); written out once the block succeeds, dropped when it raises."""
    held = io.StringIO()
    with contextlib.redirect_stderr(held):
        yield
    sys.stderr.write(held.getvalue())


def _shape_prop(gm: fx.GraphModule, example: torch.Tensor, fake_mode: Any = None) -> None:
    """``ShapeProp(gm).propagate(example)`` without the traceback it prints when a node fails (on a meta
    ``example``: :class:`MetaShapeProp`)."""
    with stderr_kept_on_success():
        if example.is_meta and fake_mode is None:
            MetaShapeProp(gm).propagate(example)
        else:
            ShapeProp(gm, fake_mode=fake_mode).propagate(example)


def _propagate_shapes(gm: fx.GraphModule, input_shape: list[int]) -> fx.GraphModule:
    """Record every node's output shape without compute; returns the module whose nodes carry them.

    With meta tensors (no memory, no compute): on ``gm`` itself when its weights are on the meta
    device, else on a weightless twin of it (:func:`_meta_twin`, several times faster than fake
    tensors, which copy every weight). An op without a meta kernel: fake tensors, else for real (whose
    error, if that fails too, is the one raised)."""
    meta_example = torch.empty(_TRACE_BATCH, *input_shape, device="meta")
    if any(t.is_meta for t in (*gm.parameters(), *gm.buffers())):
        _shape_prop(gm, meta_example)
        return gm
    try:
        twin = _meta_twin(gm)
        _shape_prop(twin, meta_example)
        return twin
    except Exception:  # an op without a meta kernel: fake tensors on the real module
        pass
    example = torch.randn(_TRACE_BATCH, *input_shape)
    try:
        _shape_prop(gm, example, FakeTensorMode(allow_non_fake_inputs=True))
    except Exception:  # an op without a fake implementation: run it for real
        with torch.no_grad():
            _shape_prop(gm, example)
    return gm


def run_on_meta(module: nn.Module, example: torch.Tensor) -> None:
    """Run ``module`` (its weights on the meta device) on the meta tensor ``example`` ([N, C, H, W]) for shapes alone,
    raising what its forward raises (a layer refusing its input's channels). Its traced graph runs under
    :class:`MetaShapeProp`, which answers the common layers itself: torch's Python meta kernels, which a plain forward
    runs, import ``torch._dynamo`` on their first call (2-3 s of a process). A module torch.fx cannot trace runs its
    own forward."""
    try:
        graph = _trace(module, list(example.shape[1:]))
    except Exception:  # noqa: BLE001 - not traceable (or its pieces' count fails): the forward tells
        module(example)
        return
    _shape_prop(fx.GraphModule(module, graph), example)


def _meta_twin(gm: fx.GraphModule) -> fx.GraphModule:
    """A copy of ``gm`` whose parameters and buffers are empty tensors on the meta device (the weights
    are not copied; ``gm`` is left as it is). The weight torch.nn.utils.weight_norm's (or spectral_norm's) hook last
    computed on a layer (a tensor autograd made, which torch will not deep-copy) is an empty one too: the hook
    computes it again."""
    memo: dict[int, Any] = {}
    for t in (*gm.parameters(), *gm.buffers()):
        empty = torch.empty_like(t, device="meta")
        memo[id(t)] = nn.Parameter(empty, t.requires_grad) if isinstance(t, nn.Parameter) else empty
    for w in hook_computed_weights(gm):
        memo[id(w)] = torch.empty_like(w, device="meta")
    return copy.deepcopy(gm, memo)


def hook_computed_weights(root: nn.Module) -> list[torch.Tensor]:
    """The weights torch.nn.utils.weight_norm's and spectral_norm's hooks last computed on ``root``'s layers: each
    held by its layer between forwards, a tensor autograd made after the first (which torch will not deep-copy:
    "Only Tensors created explicitly by the user ..."); the hook computes it again at the layer's next forward."""
    from torch.nn.utils.spectral_norm import SpectralNorm
    from torch.nn.utils.weight_norm import WeightNorm

    found = []
    for m in root.modules():
        for hook in m._forward_pre_hooks.values():
            w = getattr(m, hook.name, None) if isinstance(hook, (WeightNorm, SpectralNorm)) else None
            if isinstance(w, torch.Tensor):
                found.append(w)
    return found


def _root_message(exc: BaseException) -> str:
    """``Type: first line`` of the innermost cause of ``exc`` (ShapeProp wraps the op's own error)."""
    while exc.__cause__ is not None:
        exc = exc.__cause__
    lines = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {lines[0]}" if lines else type(exc).__name__


class _PiecesUnknown(Exception):
    """Raised by :meth:`_Tracer.iter` for the split, chunk or unbind ``node`` iterated over whose pieces it has not
    been told the number of."""

    def __init__(self, node: fx.Node) -> None:
        super().__init__(node.name)
        self.node = node


class _ConditionUnknown(_PiecesUnknown):
    """Raised by :meth:`_Tracer.to_bool` for the condition ``node`` whose value it has not been told."""


class _DtypeUnknown(_PiecesUnknown):
    """Raised by :meth:`_Tracer.dtype_of` for the tensor ``node`` whose dtype it has not been told."""


#: what a trace reads -> the exception a trace not told it raises
_UNKNOWN = {"the pieces of": _PiecesUnknown, "the condition": _ConditionUnknown, "the dtype of": _DtypeUnknown}


class _Proxy(fx.Proxy):
    """torch.fx's proxy, whose ``len`` is the number of pieces of a split, chunk or unbind (:meth:`_Tracer.count`):
    ``list(x.chunk(2, 1))``, as ultralytics' C2f writes it, asks it first; and whose ``dtype`` is the tensor's own
    (:meth:`_Tracer.dtype_of`), not a traced value: attention code's ``torch.finfo(x.dtype).min``, which torch.finfo
    refuses of a proxy, is a number. Named ``Proxy``, as torch.fx's, in the refusals that name its type."""

    def __len__(self) -> int:
        count = self.tracer.count(self)
        return super().__len__() if count is None else count

    def __getattr__(self, k: str) -> Any:
        if k == "dtype":
            dtype = self.tracer.dtype_of(self)
            if dtype is not None:
                return dtype
        return super().__getattr__(k)


_Proxy.__name__ = _Proxy.__qualname__ = "Proxy"


def _makes_pieces(node: fx.Node) -> bool:
    """Whether ``node`` is a split, chunk or unbind call (a tuple of tensors whose number the tracer can be told)."""
    return node.op in ("call_function", "call_method") and node.target in _SPLITS | _UNBINDS


class _Tracer(fx.Tracer):
    """torch.fx's tracer, with the modules of :data:`_LEAF_MODULES`, and a rebuilt network's modules that stand for
    one node, kept whole. Given ``pieces`` (the number of tensors of each split, chunk or unbind node, by name), it
    iterates over them (:meth:`iter`) and tells their number (``len``, ``list``: :class:`_Proxy`)."""

    def __init__(self, pieces: dict[str, int] | None = None, decided: dict[str, bool | str] | None = None,
                 dtypes: dict[str, torch.dtype | None] | None = None, input_shape: list[int] | None = None) -> None:
        super().__init__()
        self.pieces, self.decided, self.dtypes, self.input_shape = pieces, decided, dtypes, input_shape
        self._meta_root: nn.Module | None = None  # a weightless twin of the module traced, made at a dtype read
        self._meta_run: MetaShapeProp | None = None  # the graph so far run on meta tensors (:meth:`_meta_values`)
        #: what the trace asked of the values it was told of, in order: (what, the node's name, the nodes so far)
        self.reads: list[tuple[str, str, int]] = []

    def _read(self, what: str, node: fx.Node, told: dict[str, Any]) -> None:
        """Note the read of ``what`` of ``node`` (:attr:`reads`); :class:`_PiecesUnknown` of ``what``'s kind where
        ``told`` does not hold ``node``."""
        self.reads.append((what, node.name, len(self.graph.nodes)))
        if node.name not in told:
            raise _UNKNOWN[what](node)

    def is_leaf_module(self, m: nn.Module, module_qualified_name: str) -> bool:
        return (type(m).__name__ in _LEAF_MODULES or _described_whole(m) is not None
                or super().is_leaf_module(m, module_qualified_name))

    def proxy(self, node: fx.Node) -> fx.Proxy:
        """A :class:`_Proxy` (whose pieces ``len`` counts for a split, chunk or unbind, and whose ``dtype`` is a
        dtype)."""
        return _Proxy(node, self)

    def count(self, obj: fx.Proxy) -> int | None:
        """The number of tensors of the split, chunk or unbind ``obj``, as :attr:`pieces` says;
        :class:`_PiecesUnknown` where it does not say; None for any other value, or without :attr:`pieces`."""
        node = obj.node
        if self.pieces is None or not _makes_pieces(node):
            return None
        self._read("the pieces of", node, self.pieces)
        return self.pieces[node.name]

    def dtype_of(self, obj: fx.Proxy) -> torch.dtype | None:
        """The dtype of the tensor ``obj``, as :attr:`dtypes` says; :class:`_DtypeUnknown` where it does not say;
        None (a traced ``getattr``) where ``obj`` is no tensor, or without :attr:`dtypes`."""
        if self.dtypes is None:
            return None
        if obj.node.name not in self.dtypes and self.input_shape is not None:
            self._dtypes_here(obj.node)
        self._read("the dtype of", obj.node, self.dtypes)
        return self.dtypes[obj.node.name]

    def _dtypes_here(self, node: fx.Node) -> None:
        """:attr:`dtypes` told of ``node`` and the nodes before it (:func:`_dtypes_made`) without stopping the trace:
        the graph so far run on meta tensors (:meth:`_meta_values`, each node once a trace: a twin of the graph so far
        and its shapes propagated at each read cost several times as much) with torch.fx's patches of torch (its
        modules' calls among them) taken off meanwhile. Where an op has no meta kernel, :func:`_dtypes_made` as a
        trace traced again would; where that cannot be done either (a torch without the means, the layers failing),
        :attr:`dtypes` is left as it is and the trace stops and is traced again, told."""
        revert = getattr(fx._symbolic_trace, "_maybe_revert_all_patches", None)
        if revert is None:
            return
        try:
            with revert():
                try:
                    made = {n.name: v.dtype if isinstance(v, torch.Tensor) else None
                            for n, v in self._meta_values().items()}
                except Exception:  # noqa: BLE001 - an op without a meta kernel: as a restart works it out
                    made = _dtypes_made(self, node, self.input_shape)
                self.dtypes.update(made)
        except Exception:  # noqa: BLE001 - the model's own layers: said by the trace traced again
            pass

    def _meta_values(self) -> dict[fx.Node, Any]:
        """The value of every node traced so far, run on meta tensors of :attr:`input_shape` on the module's
        weightless twin (:meth:`_twin_so_far`), each node once a trace (a later read runs the nodes since)."""
        if self._meta_run is None:
            run = MetaShapeProp(fx.GraphModule(self._twin_so_far(), fx.Graph()))
            run.module = run.real_module = self._meta_root
            run.env = {}
            self._meta_run = run
        run = self._meta_run
        self._twin_so_far()
        for n in self.graph.nodes:
            if n not in run.env:
                run.env[n] = (torch.empty(_TRACE_BATCH, *self.input_shape, device="meta") if n.op == "placeholder"
                              else fx.Interpreter.run_node(run, n))  # (ShapeProp's would set the node's meta)
        return run.env

    def _twin_so_far(self) -> nn.Module:
        """The weightless twin of the module traced (made at the first call), with the constants the trace has set on
        the module since (``_tensor_constant0``: tensors its forward made) as empty meta tensors."""
        if self._meta_root is None:
            self._meta_root = _meta_twin(self.root)
        for n in self.graph.nodes:
            if n.op == "get_attr" and "." not in n.target and not hasattr(self._meta_root, n.target):
                value = getattr(self.root, n.target)
                setattr(self._meta_root, n.target,
                        torch.empty_like(value, device="meta") if isinstance(value, torch.Tensor) else value)
        return self._meta_root

    def to_bool(self, obj: fx.Proxy) -> bool:
        """A condition's value (``assert x.dim() == 4``, ``if x.shape[-1] % 2``), as :attr:`decided` says;
        :class:`_ConditionUnknown` where it does not say; torch.fx's refusal without :attr:`decided`."""
        if self.decided is None:
            return super().to_bool(obj)
        self._read("the condition", obj.node, self.decided)
        value = self.decided[obj.node.name]
        if isinstance(value, str):  # no value from shapes: refused here, in the model's own frame, saying why
            raise fx.proxy.TraceError(f"symbolically traced variables cannot be used as inputs to control flow "
                                      f"({value})")
        return value

    def iter(self, obj: fx.Proxy) -> Iterator[fx.Proxy]:
        """The pieces of a split, chunk or unbind iterated over (ResNeSt's ``sum(torch.split(x, c, 1))``, a ``zip``
        or a loop over them), as many as :attr:`pieces` says; :class:`_PiecesUnknown` where it does not say. torch.fx
        refuses to iterate over any other value, and over these too (it cannot tell how many pieces there are)."""
        count = self.count(obj)
        return super().iter(obj) if count is None else iter([obj[i] for i in range(count)])


def _graph_up_to(tracer: _Tracer, node: fx.Node) -> fx.GraphModule:
    """The graph ``tracer`` had traced when it stopped at ``node``, returning ``node``."""
    graph = fx.Graph()
    copied: dict[fx.Node, fx.Node] = {}
    for n in tracer.graph.nodes:
        copied[n] = graph.node_copy(n, lambda a: copied[a])
        if n is node:
            break
    graph.output(copied[node])
    return fx.GraphModule(tracer.root, graph)


def _pieces_made(tracer: _Tracer, node: fx.Node, input_shape: list[int]) -> int:
    """How many tensors ``node`` of the graph ``tracer`` had traced when it stopped at ``node`` makes at
    ``input_shape``: the shapes of that graph up to ``node``, propagated."""
    partial = _propagate_shapes(_graph_up_to(tracer, node), input_shape)
    return len(next(n for n in partial.graph.nodes if n.op == "output").args[0].meta["tensor_meta"])


def _dtypes_made(tracer: _Tracer, node: fx.Node, input_shape: list[int]) -> dict[str, torch.dtype | None]:
    """The dtype of each node of the graph ``tracer`` had traced when it stopped at ``node`` (None for a value that
    is no tensor), its shapes propagated at ``input_shape``: ``node``'s, and those a later read asks for."""
    partial = _propagate_shapes(_graph_up_to(tracer, node), input_shape)
    made = {n.name: getattr(n.meta.get("tensor_meta"), "dtype", None) for n in partial.graph.nodes
            if n.op != "output"}
    return {**made, node.name: made.get(node.name)}


def _condition_value(tracer: _Tracer, node: fx.Node, input_shape: list[int]) -> bool | str:
    """The value of the condition ``node`` of the graph ``tracer`` had traced when it stopped there, from shapes
    alone: that graph up to ``node`` run on meta tensors of ``input_shape`` at two batch sizes, and at a batch of 1
    where its layers run at one (``x.shape[0] > 1`` takes one branch at both others). A condition on the tensors'
    values (no value without data) or on the batch's size (the description would keep the traced batch's branch) has
    none: what it is on, said instead."""
    graph = _graph_up_to(tracer, node)
    try:
        return _condition_on_meta(_meta_twin(graph), input_shape)
    except Exception as exc:  # noqa: BLE001 - the model's own layers
        if isinstance(exc, (RuntimeError, NotImplementedError)) and _NEEDS_DATA.search(str(exc)):
            return "a condition on the tensors' values"  # .item(), .tolist(), nonzero: values meta tensors have not
        _propagate_shapes(graph, input_shape)  # the layers' failure as torch words it (a meta kernel's names less)
        raise


#: torch's words for an op that reads a meta tensor's data, which it has not
_NEEDS_DATA = re.compile(r"meta tensor|register_meta|Meta kernel", re.IGNORECASE)


def _condition_on_meta(twin: fx.GraphModule, input_shape: list[int]) -> bool | str:
    """:func:`_condition_value` of the condition ``twin`` (a graph on meta tensors returning it) computes."""
    if _reads_the_device(twin, input_shape):
        return "a condition on the device the tensors lie on"
    values = []
    for batch in (_TRACE_BATCH, _TRACE_BATCH + 1):
        value = twin(torch.empty(batch, *input_shape, device="meta"))
        if not isinstance(value, (bool, int)):
            return "a condition on the tensors' values"
        values.append(bool(value))
    if values[0] != values[1] or _value_at_a_batch_of_one(twin, input_shape) not in (None, values[0]):
        return "a condition on the batch's size"
    return values[0]


#: a tensor's attributes and methods that tell its device (worked out on the meta device, they tell the meta device)
_DEVICE_READS = frozenset({"device", "is_cuda", "is_cpu", "is_mps", "is_xpu", "is_meta", "get_device"})


def _reads_the_device(twin: fx.GraphModule, input_shape: list[int]) -> bool:
    """Whether the condition ``twin`` (a graph on meta tensors returning it) computes is computed from a tensor's
    device (``x.is_cuda``, ``x.device.type``, ``x.get_device()``: :data:`_DEVICE_READS`), through the values it reads
    that are no tensors (a tensor made on ``x.device`` has its shape wherever it lies)."""
    tensors = _tensor_nodes(twin, input_shape)
    todo, seen = [next(n for n in twin.graph.nodes if n.op == "output")], set()
    while todo:
        n = todo.pop()
        if n in seen or n.name in tensors:
            continue
        seen.add(n)
        if (n.op == "call_function" and n.target is getattr and len(n.args) > 1 and n.args[1] in _DEVICE_READS) \
                or (n.op == "call_method" and n.target in _DEVICE_READS):
            return True
        todo.extend(n.all_input_nodes)
    return False


def _tensor_nodes(twin: fx.GraphModule, input_shape: list[int]) -> set[str]:
    """The names of ``twin``'s nodes whose values are tensors, run on meta tensors of ``input_shape``."""
    made: set[str] = set()

    class Recorder(fx.Interpreter):
        def run_node(self, n: fx.Node) -> Any:
            value = super().run_node(n)
            if isinstance(value, torch.Tensor):
                made.add(n.name)
            return value
    Recorder(twin).run(torch.empty(_TRACE_BATCH, *input_shape, device="meta"))
    return made


def _value_at_a_batch_of_one(twin: fx.GraphModule, input_shape: list[int]) -> bool | None:
    """The condition ``twin`` (a graph on meta tensors returning it) computes at a batch of 1; None where its layers
    refuse such a batch (a batch norm in training of one value a channel)."""
    try:
        return bool(twin(torch.empty(1, *input_shape, device="meta")))
    except Exception:  # noqa: BLE001 - the model's own layers: any error means no value at a batch of 1
        return None


class _ForwardFailed(Exception):
    """Raised by :func:`_trace` where the layers before a split whose pieces it counts fail at the input shape (its
    cause: torch's error), which is the forward's failure, not the trace's."""


#: How many times :func:`_trace` traces again where the trace before it read otherwise (a forward that changes
#: between calls) before it refuses the forward; and how many times in all (a forward that grows each call, and so
#: each time reads one more split's pieces, reads alike up to each stop)
_OTHER_GRAPHS, _RETRACES = 8, 500


def _trace(module: nn.Module, input_shape: list[int]) -> fx.Graph:
    """``module``'s graph; where its forward iterates over the pieces of a split, chunk or unbind, or branches on a
    condition of shapes, traced again, told how many pieces there are (:func:`_pieces_made`) or the condition's value
    (:func:`_condition_value`) or its dtype (:func:`_dtypes_made`) at ``input_shape``, once for each such node. A
    forward that traces another way when traced again (state kept between calls) is refused, naming what the trace
    was traced again to read, after :data:`_OTHER_GRAPHS` such traces, or :data:`_RETRACES` traces in all, not
    traced again without end (a few are let be: a forward that draws a branch by Python's ``random`` was described
    by the branch it drew). A dtype read is answered without a stop where it can be (:meth:`_Tracer.dtype_of`)."""
    pieces: dict[str, int] = {}
    decided: dict[str, bool | str] = {}
    dtypes: dict[str, torch.dtype | None] = {}
    before: list[tuple[str, str, int]] = []  # the reads of the trace before, the last the one it stopped at
    other_graphs = 0
    for _ in range(_RETRACES + 1):
        tracer = _Tracer(pieces, decided, dtypes, input_shape)
        try:
            return tracer.trace(module)
        except _PiecesUnknown as exc:
            other_graphs += tracer.reads[:len(before)] != before
            if other_graphs > _OTHER_GRAPHS:
                what, name, _ = before[-1]
                raise fx.proxy.TraceError(f"traced again to read {what} {name}, the forward traced another graph (a "
                                          "forward that changes between calls, as one keeping state on the module, "
                                          "cannot be traced)") from None
            before = tracer.reads
            try:
                if isinstance(exc, _DtypeUnknown):
                    dtypes.update(_dtypes_made(tracer, exc.node, input_shape))
                elif isinstance(exc, _ConditionUnknown):
                    decided[exc.node.name] = _condition_value(tracer, exc.node, input_shape)
                else:
                    pieces[exc.node.name] = _pieces_made(tracer, exc.node, input_shape)
            except UserError:
                raise
            except Exception as failed:  # the layers before the split fail at this shape: the forward's failure
                raise _ForwardFailed() from failed
    what, name, _ = before[-1]
    raise fx.proxy.TraceError(f"traced again {_RETRACES} times, the last to read {what} {name} (a forward that grows "
                              "each call, as one keeping state on the module, cannot be traced)")


@contextlib.contextmanager
def in_mode(module: nn.Module, training: bool) -> Iterator[None]:
    """``module`` in training (or evaluation) mode for the block, then every submodule back in the mode it had: a
    model trained with its batch norms frozen in eval mode keeps them so (``module.train(was_training)`` would set
    them all alike)."""
    modes = [(m, m.training) for m in module.modules()]
    module.train(training)
    try:
        yield
    finally:
        for m, was_training in modes:
            m.training = was_training


def _frames_outside_torch(exc: BaseException) -> list[tuple[str, str, str, int]]:
    """``(module, function, file, line)`` of each frame of ``exc``'s traceback, outermost first, outside torch and
    this package (the tracer's own frames)."""
    frames = []
    for frame, line in traceback.walk_tb(exc.__traceback__):
        module = str(frame.f_globals.get("__name__", ""))
        if module.split(".")[0] not in ("torch", "perf4sight"):
            frames.append((module, frame.f_code.co_name, frame.f_code.co_filename, line))
    return frames


def _is_library(file: str) -> bool:
    """Whether ``file`` is an installed package's (a site's), not the model's own code."""
    return bool({"site-packages", "dist-packages"} & set(Path(file).parts))


def _trace_stop(exc: BaseException) -> str:
    """`` in FILE line N (FUNCTION)``: where in the model's own code torch.fx stopped with ``exc``; where it stopped
    in an installed library's function, `` in MODULE.FUNCTION, called from`` the model's line. Empty where no frame of
    either is in the traceback."""
    frames = _frames_outside_torch(exc)
    own = [f for f in frames if not _is_library(f[2])]
    line = f"{Path(own[-1][2]).name} line {own[-1][3]} ({own[-1][1]})" if own else ""
    if not frames or not _is_library(frames[-1][2]):
        return f" in {line}" if line else ""
    called = f", called from {line}" if line else ""
    return f" in {frames[-1][0]}.{frames[-1][1]}{called}"


def forward_error(name: str, input_shape: list[int], exc: BaseException) -> UserError:
    """The one-line ``UserError`` for ``name``'s forward failing at ``input_shape`` with ``exc``; where torch says a
    map became smaller than a kernel, the likely fix is said first."""
    message = _root_message(exc)
    small = any(s in message for s in _MAP_TOO_SMALL)
    hint = " (its maps shrink below a kernel at this size: give a larger input shape)" if small else \
        _channels_hint(message, input_shape)
    return UserError(f"{name}: the model's forward fails at input shape {list(input_shape)} ([C, H, W]){hint}: "
                     f"{message}")


def _channels_hint(message: str, input_shape: list[int]) -> str:
    """`` (its first layer takes K-channel images: ...)`` where torch's ``message`` says a convolution given the
    input itself (a batch of ``input_shape``) expected K channels; empty for any other failure (a layer deeper given
    the wrong channels is the model's own)."""
    found = re.search(r"expected input\[\d+, ([\d, ]+)\] to have (\d+) channels", message)
    if not found or [int(v) for v in found.group(1).split(",")] != list(input_shape):
        return ""
    channels = found.group(2)
    return f" (its first layer takes {channels}-channel images: give an input shape of [{channels}, H, W])"


#: torch's words for a feature map that a convolution's or pool's kernel no longer fits
_MAP_TOO_SMALL = ("Calculated padded input size per channel", "Kernel size can't be greater than actual input size",
                  "Output size is too small")
