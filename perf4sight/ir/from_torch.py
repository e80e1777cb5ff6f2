"""Describe any traceable ``nn.Module`` as a network description (torch.fx + shape propagation).

The module is traced in eval mode, so stochastic layers (dropout, stochastic depth) trace as
plain calls; dropout is kept as a ``dropout`` node, stochastic depth becomes ``identity``.
Non-tensor values (``x.size()``, shape arithmetic) are dropped: reshapes are recorded with
their concrete output shape, so a description is tied to its input size. A module's own parameters
read outside its layers are taken in by the op that reads them: a layer norm's weight and bias, a
multiply by one (``scale``), an add of one (``shift``), one put first by a concatenation (``token``).
"""
from __future__ import annotations

import collections
import copy
import inspect
import operator
from typing import Any, Callable

import numpy as np
import torch
import torch.fx as fx
import torch.nn.functional as F
from torch import nn

from perf4sight.errors import UserError
from perf4sight.ir.schema import (ON_COPY_OPS, ONE_TENSOR_OPS, PARAMETER_OPS, SHARES, NetworkDescription, Node,
                                  count_params)
from perf4sight.ir.shapes import SIZE_REFERENCES, image_size_problem
from perf4sight.ir.weighted_sums import Fusion, weighted_sums
from perf4sight.ir.fx_values import _SPLITS, _TRACE_BATCH, _UNBINDS, _arg, _is_tensor, _shape, _shape_value
from perf4sight.ir.torch_modules import (_FIXED_SAMPLES, _adaptive_pool, _conv_pad, _fractional_maxpool_attrs, _maxpool,
                                         _softmax_attrs)
from perf4sight.ir.torch_trace import (_ForwardFailed, _propagate_shapes, _root_message, _trace, _trace_stop, _Tracer,
                                       forward_error, in_mode, run_on_meta, stderr_kept_on_success)
from perf4sight.ir.torch_calls import (_MASKED_FILLS, _PARAMETER_CALLS, _RESHAPES, _STD_CALLS, _dims_after_the_batch,
                                       _NoOp, _op_of, _permuted_dims, _position_bias_mlp, _refuse_alpha, _variance)

__all__ = ["describe", "check_input_shape", "forward_error", "has_lazy_parameters", "in_mode",
           "stderr_kept_on_success", "run_on_meta"]


def _mark_cumulative_averages(module: nn.Module, gm: fx.GraphModule, nodes: list[Node]) -> None:
    """Give the node of each batch norm call of a layer of ``module`` whose momentum is None (a cumulative average:
    a subclass of torch's the trace went through, timm's BatchNormAct2d) the momentum None: traced in evaluation,
    torch's forward passes 0.0 for it, which the call's node took (:func:`_batch_norm_call`)."""
    described = {n.name: n for n in nodes}
    for (function, running_mean), calls in _norm_calls(gm.graph).items():
        if function is not F.batch_norm:
            continue
        try:
            layer = module.get_submodule(running_mean.rpartition(".")[0])
        except AttributeError:  # a tensor of the module's own, named as the trace names it
            continue
        if not (isinstance(layer, nn.modules.batchnorm._NormBase) and layer.track_running_stats
                and layer.momentum is None):
            continue
        for n in calls:
            node = described.get(n.name)
            if node is not None and node.op == "batchnorm2d":
                node.attrs = {**node.attrs, "momentum": None}


#: A norm call's flag that picks the input's statistics over the running ones: (position, name, torch's default).
_MODE_FLAGS = {F.batch_norm: (5, "training", False), F.instance_norm: (5, "use_input_stats", True)}


def _mark_constant_modes(module: nn.Module, gm: fx.GraphModule, nodes: list[Node], input_shape: list[int]) -> None:
    """Give the node of each ``F.batch_norm`` or ``F.instance_norm`` call with running statistics whose flag
    (``training``, ``use_input_stats``) is a constant, not the module's mode, that flag as an attr: traced in
    evaluation, ``training=self.training`` reads False as ``training=False`` does, so the forward is traced in training
    too (a call whose running mean the two traces read with the same flag has a constant one). A node without the attr
    follows the mode of the module it is rebuilt into, as torch's layers do; where the training trace fails, none is
    marked. Traced as the description is (:func:`_trace` at ``input_shape``: a loop over a chunk's pieces, a branch
    on a map's size), the module's buffers put back after: a value the trace is told by running the forward up to it
    (a cumulative average's ``1 / num_batches_tracked``) ran that forward's updates of them in training."""
    calls = _norm_calls(gm.graph)
    if all(_follows_its_layer(module, n) for made in calls.values() for n in made):
        return  # none, or each torch's own layer's call (a subclass that keeps torch's forward, traced through)
    kept = [(b, b.detach().clone()) for b in module.buffers() if not nn.parameter.is_lazy(b)]
    try:
        with in_mode(module, training=True):
            trained = _norm_calls(_trace(module, input_shape))
    except Exception:  # a forward torch.fx cannot follow in training without help: left as traced
        return
    finally:
        with torch.no_grad():
            for b, value in kept:
                b.copy_(value)
    described = {n.name: n for n in nodes}
    for key, evaluated in calls.items():
        for n, t in zip(evaluated, trained.get(key, [])):  # a layer called again: its calls in order
            node = described.get(n.name)
            if node is None or node.op not in ("batchnorm2d", "instancenorm") or \
                    not node.attrs.get("track_running_stats", node.op == "batchnorm2d"):
                continue
            position, name, default = _MODE_FLAGS[n.target]
            flags = (_arg(n, position, name, default), _arg(t, position, name, default))
            if all(isinstance(f, bool) for f in flags) and flags[0] == flags[1]:
                node.attrs = {**node.attrs, name: flags[0]}


#: The forwards of torch's norm layers, whose call's flag is the layer's mode (``self.training``, or no running
#: statistics): a subclass that keeps one (traced through, not a leaf) needs no trace in training to tell.
_MODE_FOLLOWING_FORWARDS = (nn.modules.batchnorm._BatchNorm.forward, nn.modules.instancenorm._InstanceNorm.forward)


def _follows_its_layer(module: nn.Module, n: fx.Node) -> bool:
    """Whether the norm call ``n`` (of :func:`_norm_calls`) is made by the forward of the layer whose running mean it
    reads, that forward torch's own (:data:`_MODE_FOLLOWING_FORWARDS`): the flag is the layer's mode. The trace in
    training that tells a constant flag re-traces at every shape check of such a forward (``input.dim() != 4``):
    a ResNet-18 of subclassed batch norms took 4 times as long to describe."""
    stack = n.meta.get("nn_module_stack") or {}
    if not stack:
        return False
    key, value = list(stack.items())[-1]
    path = value[0] if isinstance(value, tuple) else key
    owner = _arg(n, 1, "running_mean").target.rpartition(".")[0]
    if path != owner:
        return False
    try:
        return type(module.get_submodule(owner)).forward in _MODE_FOLLOWING_FORWARDS
    except AttributeError:
        return False


def _norm_calls(graph: fx.Graph) -> dict[tuple[Any, str], list[fx.Node]]:
    """``graph``'s calls of :data:`_MODE_FLAGS` that read a module's running mean, by (function, its name), in
    order."""
    calls: dict[tuple[Any, str], list[fx.Node]] = {}
    for n in graph.nodes:
        running_mean = _arg(n, 1, "running_mean") if n.op == "call_function" and n.target in _MODE_FLAGS else None
        if getattr(running_mean, "op", None) == "get_attr":
            calls.setdefault((n.target, running_mean.target), []).append(n)
    return calls


#: views of a tensor that can add or drop dimensions of size 1 (:func:`_views_a_held_tensor`)
_VIEWS = {"view", "reshape", "unsqueeze", torch.reshape, torch.unsqueeze, operator.getitem}


def _views_a_held_tensor(n: fx.Node, held: dict[str, fx.Node]) -> bool:
    """Whether ``n`` views a module tensor of ``held`` (or a view of one) with dimensions of size 1 added or dropped
    alone, as a layer scale is shaped to broadcast over a map (``gamma.view(1, -1, 1, 1)``, ``gamma.unsqueeze(-1)``,
    ``gamma[:, None, None]``): the op reading it takes the view's shape."""
    if n.op not in ("call_method", "call_function") or n.target not in _VIEWS or not n.args \
            or getattr(n.args[0], "name", None) not in held:
        return False
    if n.target is operator.getitem:
        index = n.args[1] if isinstance(n.args[1], tuple) else (n.args[1],)
        if not all(i is None or i is Ellipsis or i == slice(None) for i in index):
            return False
    before, after = (getattr(v.meta.get("tensor_meta"), "shape", None) for v in (n.args[0], n))
    return before is not None and after is not None and \
        [s for s in before if s != 1] == [s for s in after if s != 1]


def check_input_shape(input_shape: Any, where: str) -> list[int]:
    """``input_shape`` as ``[C, H, W]`` (three positive ints, numpy integers too; no batch dimension);
    ``UserError`` naming ``where`` otherwise."""
    ok = not isinstance(input_shape, (str, bytes)) and np.iterable(input_shape) and len(input_shape) == 3 and all(
        isinstance(v, (int, np.integer)) and not isinstance(v, (bool, np.bool_)) and v >= 1 for v in input_shape)
    if not ok:
        raise UserError(f"{where}: input shape must be [C, H, W], three positive integers for one image "
                        f"(no batch dimension), e.g. [3, 224, 224]; got {input_shape!r}")
    shape = [int(v) for v in input_shape]
    if image_size_problem(shape):
        raise UserError(f"{where}: {image_size_problem(shape)}")
    return shape


def _writes_in_place(n: fx.Node, gm: fx.GraphModule) -> bool:
    """Whether ``n`` writes its first argument in place: ``y.mul_(2)``, ``torch.sigmoid_(y)``,
    ``F.relu(y, inplace=True)``, or a module built with ``inplace=True``. (torch.fx records ``y += x`` as
    ``y = y + x``: it cannot be told apart, and an alias of ``y`` taken before it reads ``y`` unchanged in the
    trace.)"""
    if n.op == "call_method":
        return _in_place_name(n.target)
    if n.op == "call_function":
        return n.kwargs.get("inplace") is True or _in_place_name(getattr(n.target, "__name__", None))
    return n.op == "call_module" and getattr(gm.get_submodule(n.target), "inplace", False) is True


def _in_place_name(name: Any) -> bool:
    """Whether a method's or a function's ``name`` is torch's for one that writes its first argument (``mul_``,
    ``sigmoid_``: a trailing underscore, not a private name)."""
    return isinstance(name, str) and name.endswith("_") and not name.startswith("_")


def _follow_in_place(gm: fx.GraphModule) -> None:
    """Rewire the readers of a tensor written in place. torch.fx records ``y.mul_(2)`` as a node of its own, and a
    later ``torch.sigmoid(y)`` reads ``y``'s node, not the write's: described as traced, the write (a residual
    ``y.add_(x)`` too) would be left out of what follows. Every read of ``y`` after the write reads the write,
    which is what torch computes (a write through a view of ``y`` is not followed)."""
    order = {n: i for i, n in enumerate(gm.graph.nodes)}
    rewired = False
    for n in gm.graph.nodes:
        written = n.args[0] if n.args else None
        if isinstance(written, fx.Node) and _writes_in_place(n, gm):
            for reader in list(written.users):
                if order[reader] > order[n]:
                    reader.replace_input_with(written, n)
                    rewired = True
    if rewired:  # the module's code from the graph again (most networks have nothing to rewire)
        gm.recompile()


def _is_view(n: fx.Node) -> bool:
    """Whether ``n`` views its first argument (:data:`_VIEWING`: a permute, a slice, a split's piece, ``x.mT``)."""
    return n.op in ("call_method", "call_function") and n.target in _VIEWING and bool(n.args) \
        and isinstance(n.args[0], fx.Node)


def _refuse_writes_through_views(gm: fx.GraphModule, where: str) -> None:
    """A ``UserError`` where a node writes in place through a view of a tensor that a later node reads
    (``z.permute(0, 2, 3, 1).sub_(1)``, then ``z``) and its op runs out of place in the description (an add, a
    multiply: no ``inplace`` attr): the later reader would read the tensor unwritten (:func:`_follow_in_place` rewires
    the view's own readers alone). An op the description keeps in place (``relu_``) is rebuilt writing the view."""
    order = {n: i for i, n in enumerate(gm.graph.nodes)}
    for n in gm.graph.nodes:
        written = n.args[0] if n.args else None
        if not (isinstance(written, fx.Node) and _is_view(written) and _writes_in_place(n, gm)):
            continue
        try:
            if _op_of(n, gm)[1].get("inplace"):
                continue
        except Exception:  # noqa: BLE001 - an op without a description: refused by name as the nodes convert
            continue
        tensor = written.args[0]
        while True:
            late = [u for u in tensor.users if order[u] > order[n]]
            if late:
                label = n.target if isinstance(n.target, str) else getattr(n.target, "__name__", str(n.target))
                raise UserError(f"{where}: {label} (node {n.name}) writes in place through the view {written.name} "
                                f"of a tensor read after it (by {late[0].name}), which the description does not "
                                "follow (its op runs out of place there); compute it out of place")
            if not _is_view(tensor):
                break
            tensor = tensor.args[0]


def _shared_layers(gm: fx.GraphModule, where: str) -> None:
    """``UserError`` where two layers called hold one parameter (tied weights, ``b.weight = a.weight``): a description
    gives every layer weights of its own, which would count it twice. (One layer called more than once is described:
    its later calls' nodes name the first as the owner of their parameters, :func:`_mark_shared_calls`.)"""
    calls = collections.Counter(n.target for n in gm.graph.nodes if n.op == "call_module")
    holder: dict[int, str] = {}
    for target in calls:
        for p in gm.get_submodule(target).parameters():
            first = holder.setdefault(id(p), target)
            if first != target:
                raise UserError(f"{where}: layers '{first}' and '{target}' hold one parameter (tied weights); a "
                                "description gives each layer weights of its own, which would count it twice")


def _training_only_layers(module: nn.Module, eval_graph: fx.Graph) -> list[str]:
    """The layers with weights that ``module``'s forward calls in training only (an auxiliary head under ``if
    self.training``), which a description of its eval-mode forward leaves out; [] where the training-mode forward
    cannot be traced."""
    try:
        with in_mode(module, training=True):
            graph = _Tracer().trace(module)
    except Exception:  # a forward torch.fx cannot follow in training: nothing to compare
        return []
    called = {n.target for n in eval_graph.nodes if n.op == "call_module"}
    return sorted(n.target for n in graph.nodes if n.op == "call_module" and n.target not in called
                  and next(module.get_submodule(n.target).parameters(), None) is not None)


def _read_tensors(root: nn.Module, graph: fx.Graph) -> list[tuple[str, Any]]:
    """(name, tensor) of what ``graph``, a trace of ``root``, reads: the parameters and buffers of the layers it
    calls, and what it fetches (``get_attr``; None for a name ``root`` lacks), as ``root``'s own objects."""
    read = [(f"{n.target}.{k}", t) for n in graph.nodes if n.op == "call_module"
            for k, t in (*root.get_submodule(n.target).named_parameters(),
                         *root.get_submodule(n.target).named_buffers())]
    fetched = [(n.target, *n.target.rpartition(".")[::2]) for n in graph.nodes if n.op == "get_attr"]
    return read + [(target, getattr(root.get_submodule(owner), attr, None)) for target, owner, attr in fetched]


def _unread_params(module: nn.Module, graph: fx.Graph) -> int:
    """How many of ``module``'s parameters its traced forward reads nowhere (:func:`_read_tensors`). Counted by what
    the forward reads, not against the description's count, which a layer's reparametrisation makes differ
    (weight_norm's gains and directions make one weight: its gains are read)."""
    read = {id(t) for _, t in _read_tensors(module, graph)}
    return sum(p.numel() for p in module.parameters() if id(p) not in read)


def has_lazy_parameters(module: nn.Module) -> bool:
    """Whether ``module`` has parameters or buffers a lazy layer (``nn.LazyLinear``, ``nn.LazyBatchNorm2d``) makes at
    its first forward, drawing random numbers for its parameters."""
    return any(nn.parameter.is_lazy(t) for t in (*module.parameters(), *module.buffers()))


def _lazy_copy(module: nn.Module) -> nn.Module:
    """A deep copy of ``module`` whose lazy layers are still to be made. torch cannot deep-copy a lazy layer's
    uninitialised buffer (a LazyBatchNorm2d's running statistics: "Attempted to use an uninitialized parameter"):
    each is copied as a new one of its type and device."""
    memo: dict[int, Any] = {id(b): nn.parameter.UninitializedBuffer(requires_grad=b.requires_grad, device=b.device,
                                                                    dtype=b.dtype)
                            for b in module.buffers() if isinstance(b, nn.parameter.UninitializedBuffer)}
    return copy.deepcopy(module, memo)


def _traced_with_shapes(module: nn.Module, input_shape: list[int], name: str) -> fx.GraphModule:
    """``module`` traced by torch.fx, its nodes carrying their output shapes at ``input_shape``. Tracing
    and forward failures come in many types: each becomes one ``UserError`` line."""
    _refuse_other_inputs(module, name)
    try:
        gm = fx.GraphModule(module, _trace(module, input_shape), type(module).__name__)
    except _ForwardFailed as exc:
        raise forward_error(name, input_shape, exc) from None
    except Exception as exc:
        raise UserError(f"{name}: cannot trace the module with torch.fx ({_root_message(exc)}){_trace_stop(exc)}") \
            from None
    _refuse_deformable(gm, name)
    _shared_layers(gm, name)
    _check_float32(gm, name)
    _follow_in_place(gm)
    try:
        gm = _propagate_shapes(gm, input_shape)
    except UserError:
        raise
    except Exception as exc:
        raise forward_error(name, input_shape, exc) from None
    _refuse_writes_through_views(gm, name)
    return gm


def _refuse_other_inputs(module: nn.Module, name: str) -> None:
    """A ``UserError`` naming the inputs where ``module``'s forward needs more than one (two images, an image and a
    mask): a description is of one input, the image. torch.fx's interpreter, run out of inputs, said no more than
    ``StopIteration``. Inputs with a default and ``*args`` are not counted."""
    try:
        params = inspect.signature(module.forward).parameters.values()
    except (TypeError, ValueError):  # no signature to read (a builtin): the trace tells
        return
    needed = [p.name for p in params if p.default is inspect.Parameter.empty
              and p.kind not in (inspect.Parameter.VAR_POSITIONAL, inspect.Parameter.VAR_KEYWORD)]
    if len(needed) > 1:
        raise UserError(f"{name}: its forward takes {len(needed)} inputs ({', '.join(needed)}); a description is of "
                        "a network of one input, an image of [C, H, W]: give a module whose forward takes the image "
                        "alone (a wrapper that makes the others from it)")


def _refuse_deformable(gm: fx.GraphModule, where: str) -> None:
    """A ``UserError`` naming torchvision's deformable convolution where ``gm`` calls it (``DeformConv2d``,
    ``deform_conv2d``: torch.fx traces into them down to torchvision's own op), before the ops of its mask and offsets
    are named in its place."""
    for n in gm.graph.nodes:
        if n.op == "call_function" and str(n.target).endswith("torchvision.deform_conv2d"):
            raise UserError(f"{where}: a deformable convolution (torchvision's DeformConv2d, deform_conv2d: node "
                            f"{n.name}) has no op in the description")


#: Modules that wrap a model, by class name -> (what makes them, the attribute holding the model): torch.fx traces
#: neither (a compiled module "is missing the required forward function"; a DataParallel's "Proxy object cannot be
#: iterated").
_WRAPPERS = {"OptimizedModule": ("torch.compile", "_orig_mod"), "DataParallel": ("nn.DataParallel", "module"),
             "DistributedDataParallel": ("DistributedDataParallel", "module")}


def describe(module: nn.Module, input_shape: list[int], name: str, network: str | None = None,
             pruning_level: float = 0, **extra: Any) -> NetworkDescription:
    """Trace ``module`` (input ``[C, H, W]``, no batch) into a ``NetworkDescription``. Shapes come from
    meta tensors (no compute; a module with weights is copied without them, and left as it is); a
    module built on the meta device describes the same, a little faster, and one with lazy layers is described on a
    copy (the caller's stays lazy, torch's random state as it was).

    Raises ``UserError`` for an input shape that is not three positive ints, a model wrapped by torch.compile or
    DataParallel, a module torch.fx cannot trace, a forward that reads weights other than float32 or fails at
    ``input_shape`` (naming the shape and torch's message), and naming the first op or module the schema cannot
    express.
    """
    if not isinstance(module, nn.Module):
        raise UserError(f"{name}: expected a torch nn.Module instance (e.g. torchvision.models.resnet18()), "
                        f"got {type(module).__name__}")
    wrapped = _WRAPPERS.get(type(module).__name__)
    if wrapped is not None and isinstance(getattr(module, wrapped[1], None), nn.Module):
        raise UserError(f"{name}: the model is wrapped by {wrapped[0]} ({type(module).__name__}); a description is of "
                        f"the model itself, its eager training step on one device: give its .{wrapped[1]}")
    input_shape = check_input_shape(input_shape, name)
    if has_lazy_parameters(module):  # the first forward makes them, drawing random numbers: on a copy
        with torch.random.fork_rng(devices=[]):
            return _described(_lazy_copy(module), input_shape, name, network, pruning_level, extra)
    return _described(module, input_shape, name, network, pruning_level, extra)


def _check_float32(gm: fx.GraphModule, name: str) -> None:
    """``UserError`` where a layer the forward calls, or a tensor it reads, holds floating-point parameters or buffers
    of another type than float32 (a ``.double()`` or ``.half()`` model): a description is of a float32 training step,
    as the profile measures it (its forward also failed on the float32 input, saying only that the types differ).
    The tensors of a layer it never calls (a float64 step counter, a spare head) are no part of the description."""
    other = next(((k, t.dtype) for k, t in _read_tensors(gm, gm.graph)
                  if isinstance(t, torch.Tensor) and t.dtype.is_floating_point and t.dtype != torch.float32), None)
    if other is not None:
        raise UserError(f"{name}: {other[0]} is {str(other[1]).replace('torch.', '')}, and a description is of a "
                        "float32 training step, as the profile measures one: give the model in float32 (.float())")


def _described(module: nn.Module, input_shape: list[int], name: str, network: str | None, pruning_level: float,
               extra: dict[str, Any]) -> NetworkDescription:
    """:func:`describe`'s description of ``module`` (checked), its parameters made."""
    with in_mode(module, training=False):
        gm = _traced_with_shapes(module, input_shape, name)
    nodes, output = _convert(gm, name)
    _mark_cumulative_averages(module, gm, nodes)
    _mark_constant_modes(module, gm, nodes, input_shape)
    desc = NetworkDescription(name=name, network=network or name, input_shape=list(input_shape),
                              num_classes=0, params=0, nodes=nodes, output=output,
                              pruning_level=pruning_level, extra=dict(extra))
    if not desc.node(output).output_shape:
        raise UserError(f"{name}: the model's output ({output}) has no dimension besides the batch's: its forward "
                        "merges the batch into the features somewhere (a view or flatten over dimension 0)")
    desc.num_classes = int(desc.node(output).output_shape[0])
    desc.params = count_params(desc)
    unused = _unread_params(module, gm.graph)
    if unused > 0:  # weights no layer of the (eval-mode) forward reads: only then is the forward traced in training
        in_training = _training_only_layers(module, gm.graph)
        if in_training:
            raise UserError(f"{name}: its forward calls {', '.join(in_training[:3])}"
                            f"{' ...' if len(in_training) > 3 else ''} in training only (an `if self.training` "
                            "branch); a description follows the forward of evaluation: build the model without its "
                            "training-only layers (e.g. aux_logits=False)")
        desc.extra["unused_params"] = unused
    frozen = sum(p.numel() for p in module.parameters() if not p.requires_grad)
    if frozen:  # a description trains every layer it has: a step that freezes some is predicted as one that does not
        desc.extra["frozen_params"] = frozen
    return desc


def _convert(gm: fx.GraphModule, where: str) -> tuple[list[Node], str]:
    nodes: list[Node] = []
    alias: dict[str, str] = {}  # fx node name -> description node name that holds its value
    pieces: dict[str, list[str]] = {}  # chunk/split node used whole (torch.cat(x.chunk(2, 1))) -> its narrow nodes
    held: dict[str, fx.Node] = {}  # get_attr node, or a batch expansion of one -> that get_attr node
    held.update(_computed_position_biases(gm, where))
    output = ""
    missing: dict[str, list[str]] = {}  # kind of op without a description op -> the nodes of that kind
    passed: set[str] = set()  # the nodes of those kinds
    fusions = weighted_sums(gm)
    fused = {name: f for f in fusions for name in (*f.taken, f.final.name)}  # fx node -> the fusion taking it in
    for n in gm.graph.nodes:
        try:
            if n.op == "output":
                output = alias[_returned_tensor(n.args[0], where).name]
                continue
            if n.name in fused:
                converted = _fused_node(n, fused[n.name], fusions, alias, where)
            else:
                converted = _convert_node(n, gm, where, alias, pieces, held)
        except _NoOp as exc:  # the others are named too, at once: read as passing their first input on
            made = exc.node  # n, or the op whose tuple n takes a part of (x.max(2)[0]: max, which has no alias)
            first = next((a for a in (*n.all_input_nodes, *made.all_input_nodes) if a.name in alias), None)
            if made.name not in passed and not (n.target in (operator.getitem, getattr) and first is not None
                                                and first.name in passed):
                missing.setdefault(exc.kind, []).append(exc.what)  # (not a part of such an op's tuple)
            passed.update((n.name, made.name))
            if first is None:
                break
            alias[n.name] = alias[first.name]
            continue
        except UserError:
            if missing:  # from an op read as passing its input on, maybe: the ops missing come first
                break
            raise
        except Exception as exc:  # an fx pattern this converter does not know: one line naming the node
            if missing:
                break
            raise UserError(f"{where}: cannot describe node {n.name} ({_root_message(exc)})") from None
        nodes.extend(converted)
    if missing:
        raise UserError(f"{where}: {_missing_ops(list(missing.values()))}")
    _mark_shared_calls(gm, nodes, held, where)
    return nodes, output


def _fused_node(n: fx.Node, fusion: Fusion, fusions: list[Fusion], alias: dict[str, str], where: str) -> list[Node]:
    """The ``weighted_sum`` node of a BiFPN fusion at its last add ``n``; nothing for the nodes it takes in (its
    weights' normalisation, picks, products and the adds before). A later fusion of the same parameter ``shares``
    the first's."""
    if n is not fusion.final:
        return []
    for x in fusion.inputs:
        if x.name not in alias:
            raise UserError(f"{where}: the weighted sum {n.name} of the parameter {fusion.parameter} fuses the "
                            f"module's tensor {x.target if x.op == 'get_attr' else x.name}, not a network's: the "
                            "description has no op for it")
    attrs = fusion.attrs()
    owner = next(f for f in fusions if f.parameter == fusion.parameter)
    if owner is not fusion:
        attrs[SHARES] = owner.final.name
    alias[n.name] = n.name
    return [Node(n.name, "weighted_sum", [alias[x.name] for x in fusion.inputs], attrs, _shape(n))]


#: Calls whose result is a view of their first argument (a reshape of a contiguous tensor among them): an in-place
#: write into it writes that argument.
_VIEWING = {*_RESHAPES, "flatten", torch.flatten, "transpose", torch.transpose, "swapaxes", torch.swapaxes, "t",
            "permute", torch.permute, "unsqueeze", torch.unsqueeze, "squeeze", torch.squeeze, operator.getitem,
            "narrow", torch.narrow, "select", torch.select, "chunk", torch.chunk, "split", torch.split, "unbind",
            torch.unbind, "expand", "expand_as", "view_as",
            torch.swapdims, "swapdims", torch.movedim, "movedim", torch.moveaxis, "moveaxis",
            getattr}  # a tensor's attribute: x.mT, x.mH (views)


def _writes_a_copy(n: fx.Node) -> bool:
    """Whether ``n`` writes in place into a copy, or into a view of one: a clone (``y.clone().tanh_()``,
    ``F.leaky_relu(y.clone(), 0.1, True)``, ``y.clone().flatten(2).relu_()``), or a contiguous copy of a tensor that
    is not (``y.transpose(2, 3).contiguous()``, and a view of it). The copy, described as ``y`` itself (an alias), is
    a tensor of its own, so the pair is the activation out of place; an in-place node would write ``y``, which the
    rebuilt network's later readers of ``y`` would then read written."""
    written = n.args[0] if n.args else None
    while isinstance(written, fx.Node) and written.args:
        if written.target in ("clone", torch.clone):
            return True
        source = written.args[0]
        if written.target == "contiguous":
            meta = source.meta.get("tensor_meta") if isinstance(source, fx.Node) else None
            if hasattr(meta, "memory_format") and meta.memory_format is not torch.contiguous_format:
                return True
        elif written.op not in ("call_method", "call_function") or written.target not in _VIEWING:
            return False
        written = source
    return False


def _mark_shared_calls(gm: fx.GraphModule, nodes: list[Node], held: dict[str, fx.Node], where: str) -> None:
    """Give each node that reads the parameters or buffers an earlier node read (a layer called again: CBAM's MLP
    over the average- and the max-pooled descriptors, a batch norm without affine parameters whose running
    statistics both calls update; a parameter read directly by two ops, ``x * self.g + self.g``) the attr ``shares``:
    the name of the node that read them first, which holds them, so that they count once. ``UserError`` where the
    two cannot share (:func:`_sharing_refused`)."""
    described = {n.name: n for n in nodes}
    first_reader: dict[int, str] = {}  # id of a module tensor -> the description node that read it first
    read_by: dict[str, set[int]] = {}  # description node -> the ids of the module tensors it reads
    for fx_node in gm.graph.nodes:
        node = described.get(fx_node.name)
        if node is None or node.op not in PARAMETER_OPS or SHARES in node.attrs:  # a fusion's sharing: its own
            continue
        tensors = _module_tensors_read(fx_node, gm, held)
        ids = {id(t) for _, t in tensors}
        readers = {first_reader[i] for i in ids if i in first_reader}
        if not readers:
            read_by[node.name] = ids
            first_reader.update((i, node.name) for i in ids)
            continue
        owner = described[next(iter(readers))]
        refusal = _sharing_refused(node, owner, len(readers) == 1 and read_by[owner.name] == ids)
        if refusal:
            names = [name for name, t in tensors if id(t) in first_reader]
            raise UserError(f"{where}: {node.op} (node {node.name}) reads {', '.join(names[:3])}, which {owner.op} "
                            f"(node {owner.name}) reads too: {refusal}")
        node.attrs = {**node.attrs, SHARES: owner.name}


def _module_tensors_read(fx_node: fx.Node, gm: fx.GraphModule, held: dict[str, fx.Node]) -> list[tuple[str, Any]]:
    """(name, tensor) of the module's parameters and buffers that ``fx_node`` reads: a layer's own, or those an op
    fetches (``get_attr`` nodes, or views and batch expansions of them: ``held``)."""
    if fx_node.op == "call_module":
        layer = gm.get_submodule(fx_node.target)
        return [(f"{fx_node.target}.{k}", t) for k, t in (*layer.named_parameters(), *layer.named_buffers())]
    inputs: list[fx.Node] = []
    fx.node.map_arg((fx_node.args, fx_node.kwargs), inputs.append)
    fetches = [held[a.name] for a in inputs if a.name in held and held[a.name].op == "get_attr"]  # (not a Swin V2
    read = [(f.target, _fetched(gm, f.target)) for f in fetches]  # position bias: computed, held as its own node)
    return [(name, t) for name, t in read if isinstance(t, torch.Tensor)]


def _fetched(root: nn.Module, target: str) -> Any:
    """What a ``get_attr`` of ``target`` reads from ``root`` (None for a name ``root`` lacks)."""
    owner, _, attr = target.rpartition(".")
    return getattr(root.get_submodule(owner), attr, None)


def _sharing_refused(node: Node, owner: Node, reads_the_same: bool) -> str:
    """Why ``node``, reading module tensors that ``owner`` read first, cannot share ``owner``'s (``reads_the_same``:
    whether it reads those and no others): "" where it can (the same op and attrs, or a scale and a shift of one
    shape)."""
    alike = owner.op == node.op or {owner.op, node.op} <= set(ONE_TENSOR_OPS)
    if reads_the_same and alike and owner.attrs == node.attrs:
        return ""
    return ("a description counts the tensors of every node that shares no other's, so they would count twice (a "
            "layer called again shares its first call's, and a multiply and an add can share one parameter they read "
            "whole)")


def _missing_ops(kinds: list[list[str]]) -> str:
    """What :class:`_NoOp` says of the first node of each kind of op without a description op (``kinds``: the
    nodes of each kind, in the order met), with the count of the others of its kind."""
    named = [f"{whats[0]}{f' (and {len(whats) - 1} more)' if len(whats) > 1 else ''}" for whats in kinds]
    if len(named) == 1:
        return f"{named[0]} has no description op"
    return f"{', '.join(named[:-1])} and {named[-1]} have no description op"


def _returned_tensor(value: Any, where: str) -> fx.Node:
    """The tensor a module returns: the value itself, or the ``out`` of a dict holding nothing else (torchvision's
    segmentation networks); ``UserError`` for a dict with more (an auxiliary head's ``aux``)."""
    if isinstance(value, fx.Node):
        return value
    if isinstance(value, (tuple, list)):
        raise UserError(f"{where}: the model returns {_several_outputs(value)}")
    if not isinstance(value, dict):
        raise UserError(f"{where}: the model returns {value!r}; a description follows one tensor output (return the "
                        "logits alone)")
    if set(value) != {"out"}:  # torchvision's segmentation networks return 'out' and, with an auxiliary head, 'aux'
        hint = "build a torchvision segmentation network with aux_loss=False" if "out" in value else \
            "return the logits alone"
        raise UserError(f"{where}: the model returns a dict with {sorted(value)}; a description follows one output, "
                        f"its 'out' ({hint})")
    return value["out"]


def _several_outputs(values: tuple | list) -> str:
    """What a model returning the tuple or list ``values`` returns, and what to return instead: a detection head's
    maps (every value a traced tensor of a map or more per sample) flattened and concatenated, else the logits.
    torch.fx's list is a list of its own (``immutable_list``): named a list."""
    kind = "tuple" if isinstance(values, tuple) else "list"
    ranks = [len(v.meta["tensor_meta"].shape) if isinstance(v, fx.Node) and "tensor_meta" in v.meta else 0
             for v in values]
    if values and min(ranks) >= 4:
        return (f"a {kind} of {len(values)} maps; a description follows one tensor output (return one: the maps "
                "flattened and concatenated, torch.cat([m.flatten(2) for m in maps], 2), as a detector's inference "
                "output is)")
    return f"a {kind} of {len(values)}; a description follows one tensor output (return the logits alone)"


def _computed_position_biases(gm: fx.GraphModule, where: str) -> dict[str, fx.Node]:
    """The nodes by which Swin V2's window attentions compute their position biases, each by its name: taken in
    by the attention (its ``position_bias_mlp``), not described apart. A way of computing one that the description
    has no op for is a ``UserError`` naming the attention."""
    found: dict[str, fx.Node] = {}
    for n in gm.graph.nodes:
        if n.op == "call_function" and getattr(n.target, "__name__", "") == "shifted_window_attention":
            try:
                found.update((w.name, w) for w in _position_bias_mlp(n, gm)[1])
            except ValueError as exc:
                raise UserError(f"{where}: cannot describe node {n.name} ({exc})") from None
    return found


def _tiles_a_parameter_over_the_batch(n: fx.Node, held: dict[str, fx.Node]) -> bool:
    """Whether ``n`` tiles a module's tensor of batch size 1 over the batch alone, as a ViT's class token often is
    (``self.cls_token.repeat(x.shape[0], 1, 1)``, ``.tile((B, 1, 1))``, ``torch.tile(token, (B, 1, 1))``): its first
    count read off the input's batch size, every other 1. Read as the tensor itself, as an ``expand`` of it is (a
    copy of the batch's few tokens aside)."""
    if n.target not in ("repeat", "tile", torch.tile) or getattr(n.args[0], "name", None) not in held:
        return False
    counts = n.args[1:] if n.target == "repeat" else (_arg(n, 1, "dims"),)
    if len(counts) == 1 and isinstance(counts[0], (list, tuple)):
        counts = counts[0]
    source, made = n.args[0].meta.get("tensor_meta"), n.meta.get("tensor_meta")
    shapes = [list(getattr(t, "shape", [])) for t in (source, made)]
    return bool(counts) and isinstance(counts[0], fx.Node) and all(c == 1 for c in counts[1:]) \
        and len(counts) == len(shapes[0]) == len(shapes[1]) > 0 and shapes[0][0] == 1 and shapes[0][1:] == shapes[1][1:]


def _convert_node(n: fx.Node, gm: fx.GraphModule, where: str, alias: dict[str, str],
                  pieces: dict[str, list[str]], held: dict[str, fx.Node]) -> list[Node]:
    """The description nodes of fx node ``n`` (none for shape queries and aliases); fills ``alias`` and ``held``."""
    shape = _shape(n)
    if n.op == "placeholder":
        alias[n.name] = "input"
        return [Node("input", "input", [], {}, shape or [])]
    if n.op == "get_attr":  # a module's own tensor, read by the op that uses it (a layer scale, a norm's weight)
        held[n.name] = n
        return []
    if n.name in held:  # a Swin V2 attention's position bias, computed from module tensors alone
        return []
    if (n.op == "call_method" and n.target == "expand" and getattr(n.args[0], "name", None) in held) \
            or _tiles_a_parameter_over_the_batch(n, held):  # a class token
        held[n.name] = held[n.args[0].name]
        return []
    if (n.op == "call_function" and getattr(n.target, "__name__", "") in _PARAMETER_CALLS
            and getattr(n.args[0], "name", None) in held) or _views_a_held_tensor(n, held):
        held[n.name] = held[n.args[0].name]
        return []
    if n.op == "call_function" and n.target is operator.getitem and _is_attention(n.args[0], gm):
        if n.args[1] == 0:  # the attention's output (its weights, [1], are not asked for: None)
            alias[n.name] = alias[n.args[0].name]
        return []
    if _moves_the_batch_for_picks(n):  # read by its picks alone, each a select and a permute of its input
        return []
    picked = _picked_after_a_moved_batch(n, alias)
    if picked is not None:
        alias[n.name] = n.name
        return picked
    pooled = _pool_part(n, gm, alias)
    if pooled is not None:
        return pooled
    reduced = _max_part(n, gm, alias)
    if reduced is not None:
        return reduced
    ordered = _sorted_part(n, alias)
    if ordered is not None:
        return ordered
    if n.op == "call_function" and n.target is operator.getitem:
        converted = _getitem(n, alias)
        if converted is not None:
            alias[n.name] = converted.name
            return [converted]
    if shape is None and n.op != "call_module":  # sizes, shape arithmetic, tuples from chunk/split: resolved by
        return []                                # their consumers (a module returning a tuple is no op: below)
    try:
        op, attrs = _op_of(n, gm)
    except ValueError:
        _refuse_parameters_alone(n, held, where)
        raise
    if attrs.get("inplace") and _writes_a_copy(n):
        attrs = {k: v for k, v in attrs.items() if k != "inplace"}
        if op in ON_COPY_OPS:  # it keeps the copy (or a clone of it), not its input
            attrs["on_copy"] = True
    op, attrs, own = _with_own_tensors(n, op, attrs, gm, where, held)
    out = _whole_splits(n, alias, pieces)
    tensor_inputs = _tensor_inputs(n, alias, pieces, where, own)
    if op == "attention":
        tensor_inputs, shape = _self_attention(n, tensor_inputs, where)
    if op == "alias":
        alias[n.name] = tensor_inputs[0]
        return out
    if not tensor_inputs:
        raise UserError(f"{where}: {op} (node {n.name}) has no tensor input the description can follow")
    if op in ("add", "mul") and len(tensor_inputs) == 1 and "scalar" not in attrs:
        operands = [*n.args, *(n.kwargs[k] for k in ("other",) if k in n.kwargs)]  # the number: x + 2, other=2
        scalar = next(_shape_value(a) for a in operands if not _is_tensor(a))
        attrs = {"scalar": float(scalar)}
    if op == "reshape":
        tensor_inputs = tensor_inputs[:1]
    if n.target in _MASKED_FILLS:  # x.masked_fill(mask, v): torch.where(mask, v, x), the mask's tensor first
        tensor_inputs = tensor_inputs[::-1]
    meta = n.meta.get("tensor_meta")
    batch = meta.shape[0] if op != "attention" and hasattr(meta, "shape") and len(meta.shape) else _TRACE_BATCH
    if batch != _TRACE_BATCH:  # traced at batch 2: a description's node keeps the batch as it is
        if op == "reshape":
            raise UserError(f"{where}: {n.name} reshapes the batch of {_TRACE_BATCH} images it was traced with into "
                            f"a first dimension of {batch}: it merges the batch into another dimension, or fixes its "
                            "size (x.view(7, -1)); a description keeps the batch first and whole")
        raise UserError(f"{where}: {op} (node {n.name}) makes a first dimension of {batch} of the batch of "
                        f"{_TRACE_BATCH} images it was traced with: it works along the batch dimension (dim 0), which "
                        "a description keeps first and whole")
    first = _padded_first(n, gm, tensor_inputs)
    if first is not None:
        out, tensor_inputs = out + [first], [first.name]
    attrs = _with_size_reference(n, op, attrs, alias)
    alias[n.name] = n.name
    return out + [Node(n.name, op, tensor_inputs, attrs, shape)]


# Sizes read off another map (shapes.SIZE_REFERENCES): a resize to another tensor's height and width, a U-Net's
# pad of its upsampled map to its skip's side, recorded by the node's name so that the description follows another
# input shape. Other arithmetic on sizes stays the numbers the trace gives.

def _shape_read(v: Any) -> tuple[fx.Node, list[int]] | None:
    """(the [N, C, H, W] tensor, the dimensions of it) that ``v`` reads the sizes of: its whole shape (``t.shape``,
    ``t.size()``), a slice of it (``t.shape[-2:]``), one side (``t.shape[2]``, ``t.size()[-1]``, ``t.size(2)``, one
    of ``h, w = t.shape[-2:]``); None for anything else."""
    if not isinstance(v, fx.Node) or not v.args or not isinstance(v.args[0], fx.Node):
        return None
    if (v.op == "call_function" and v.target is getattr and v.args[1:] == ("shape",)) \
            or (v.op == "call_method" and v.target == "size" and len(v.args) == 1 and not v.kwargs):
        tensor, dims = v.args[0], [0, 1, 2, 3]
    elif v.op == "call_method" and v.target == "size" and len(v.args) + len(v.kwargs) == 2:
        tensor, dims = v.args[0], _picked([0, 1, 2, 3], _arg(v, 1, "dim"))
    elif v.op == "call_function" and v.target is operator.getitem and len(v.args) == 2:
        whole = _shape_read(v.args[0])
        tensor, dims = (whole[0], _picked(whole[1], v.args[1])) if whole is not None else (None, None)
    else:
        return None
    rank = len(getattr(getattr(tensor, "meta", {}).get("tensor_meta"), "shape", ()))
    return (tensor, dims) if rank == 4 and dims is not None else None


def _picked(dims: list[int], index: Any) -> list[int] | None:
    """The entries of ``dims`` that ``index`` (a slice, or one position) picks; None for any other index."""
    if isinstance(index, slice) and all(isinstance(b, (int, type(None))) for b in (index.start, index.stop,
                                                                                   index.step)):
        return dims[index]
    if isinstance(index, int) and not isinstance(index, bool) and -len(dims) <= index < len(dims):
        return [dims[index]]
    return None


def _side_read(v: Any, dim: int) -> fx.Node | None:
    """The [N, C, H, W] tensor whose side ``dim`` (2: height, 3: width) ``v`` reads (:func:`_shape_read`); None for
    anything else."""
    read = _shape_read(v)
    return read[0] if read is not None and read[1] == [dim] else None


def _sides_read(v: Any) -> fx.Node | None:
    """The [N, C, H, W] tensor whose height and width ``v`` is (``t.shape[-2:]``, ``t.size()[2:]``,
    ``(t.shape[2], t.shape[3])``, ``[t.size(2), t.size(3)]``, ``(h, w)`` of ``h, w = t.shape[-2:]``); None for
    anything else."""
    if isinstance(v, (list, tuple)) and len(v) == 2:
        height = _side_read(v[0], 2)
        return height if height is not None and _side_read(v[1], 3) is height else None
    read = _shape_read(v)
    return read[0] if read is not None and read[1] == [2, 3] else None


def _is_op(v: Any, fn: Callable, second: Any = None) -> bool:
    """Whether ``v`` is the call ``fn(a, b)`` of two operands (``second``, where given, as ``b``)."""
    return isinstance(v, fx.Node) and v.op == "call_function" and v.target is fn and len(v.args) == 2 \
        and not v.kwargs and (second is None or v.args[1] == second)


def _split_difference(before: Any, after: Any) -> fx.Node | None:
    """The difference ``d`` that ``before`` and ``after`` split as a U-Net's ``Up`` block does (``d // 2`` and
    ``d - d // 2``); None for anything else."""
    if not (_is_op(before, operator.floordiv, 2) and _is_op(after, operator.sub)):
        return None
    d = before.args[0]
    half = after.args[1]
    return d if after.args[0] is d and _is_op(half, operator.floordiv, 2) and half.args[0] is d else None


def _difference_of_sides(d: Any, dim: int) -> tuple[fx.Node, fx.Node] | None:
    """(the larger map, the smaller) whose side ``dim`` the difference ``d`` takes (``x2.size()[2] -
    x1.size()[2]``); None for anything else."""
    if not _is_op(d, operator.sub):
        return None
    larger, smaller = _side_read(d.args[0], dim), _side_read(d.args[1], dim)
    return (larger, smaller) if larger is not None and smaller is not None else None


def _padded_to(n: fx.Node) -> fx.Node | None:
    """The map whose height and width the pad ``n`` brings its input to, where its pads are exactly a U-Net's
    ``Up`` block's (``F.pad(x1, [dx // 2, dx - dx // 2, dy // 2, dy - dy // 2])``, ``dy = x2.size()[2] -
    x1.size()[2]``, ``dx`` the widths', x1 the pad's input); None for other pads."""
    pads = _arg(n, 1, "pad")
    if not isinstance(pads, (list, tuple)) or len(pads) != 4:
        return None
    dx, dy = _split_difference(pads[0], pads[1]), _split_difference(pads[2], pads[3])
    widths, heights = _difference_of_sides(dx, 3), _difference_of_sides(dy, 2)
    if widths is None or widths != heights or widths[1] is not n.args[0]:
        return None
    return widths[0]


def _size_reference(n: fx.Node, op: str) -> fx.Node | None:
    """The tensor whose height and width the resize or pad ``n`` takes its size from, where it reads them (see
    :func:`_sides_read`, :func:`_padded_to`); None for any other node."""
    if n.op != "call_function":
        return None
    if op == "interpolate" and n.target is F.interpolate:
        return _sides_read(_arg(n, 1, "size"))
    if op == "pad" and n.target in (F.pad, torch._C._nn.pad):
        return _padded_to(n)
    if op == "fold" and n.target is F.fold:  # windows put back onto the map they came from: y.shape[-2:]
        return _sides_read(_arg(n, 1, "output_size"))
    return None


def _output_size_read(n: fx.Node, op: str) -> fx.Node | None:
    """The tensor whose height and width the transposed convolution layer ``n`` is given as its output size
    (``up(x, output_size=skip.shape[2:])``, or its whole shape, ``skip.shape``, ``skip.size()``: torch takes the
    last two); None for any other node."""
    if op != "conv_transpose2d" or n.op != "call_module":
        return None
    size = _arg(n, 1, "output_size")
    whole = _shape_read(size)
    return whole[0] if whole is not None and whole[1] == [0, 1, 2, 3] else _sides_read(size)


def _with_size_reference(n: fx.Node, op: str, attrs: dict, alias: dict[str, str]) -> dict:
    """``attrs`` of the node of ``n`` (of description op ``op``), with the name of the node whose map it takes its
    size from (:data:`SIZE_REFERENCES`) where it reads one (:func:`_size_reference`) the description holds; a pad
    computed from sizes otherwise marked ``pads_computed`` (its numbers the traced shape's)."""
    like = _size_reference(n, op) or _output_size_read(n, op)
    if like is not None and like.name in alias and "scale_factor" not in attrs:
        return {**attrs, SIZE_REFERENCES[op]: alias[like.name]}
    if op == "pad" and n.op == "call_function" and isinstance(_arg(n, 1, "pad"), (list, tuple)) \
            and any(isinstance(p, fx.Node) for p in _arg(n, 1, "pad")):
        return {**attrs, "pads_computed": True}
    return attrs


def _padded_first(n: fx.Node, gm: fx.GraphModule, inputs: list[str]) -> Node | None:
    """The ``pad`` node that a convolution ``n`` padding other than with zeros runs first (:func:`_conv_pad`), reading
    ``inputs``; named after the convolution, apart from every node of the trace; None for any other node."""
    m = gm.get_submodule(n.target) if n.op == "call_module" else None
    made = _conv_pad(m) if isinstance(m, nn.Conv2d) else None
    if made is None:
        return None
    op, attrs = made
    left, right, top, bottom = attrs["pads"]
    c, h, w = (int(v) for v in n.args[0].meta["tensor_meta"].shape[1:])
    taken = {x.name for x in gm.graph.nodes}
    name, i = f"{n.name}_pad", 1
    while name in taken:
        name, i = f"{n.name}_pad_{i}", i + 1
    return Node(name, op, inputs, attrs, [c, h + top + bottom, w + left + right])


#: reductions to the largest (smallest) value over dimensions: those returning values and indices, those values alone
_MAX_CALLS = {torch.max: False, "max": False, torch.min: True, "min": True}
_AMAX_CALLS = {torch.amax: False, "amax": False, torch.amin: True, "amin": True}


def _is_max_call(source: Any) -> bool:
    return isinstance(source, fx.Node) and source.op in ("call_function", "call_method") and \
        source.target in _MAX_CALLS


_EXTREMES = {torch.maximum: "maximum", "maximum": "maximum", torch.minimum: "minimum", "minimum": "minimum",
             torch.max: "maximum", "max": "maximum", torch.min: "minimum", "min": "minimum"}


def _extreme_nodes(n: fx.Node, gm: fx.GraphModule, alias: dict[str, str]) -> list[Node] | None:
    """``torch.maximum(x, y)``, ``torch.minimum``, ``x.maximum(y)``, and ``torch.max(x, y)``/``torch.min`` of two
    tensors: the op maximum or minimum of the two, broadcast; ``ValueError`` where one is a module's own tensor. None
    for any other call (a max over dimensions: :func:`_max_values`)."""
    if n.op not in ("call_function", "call_method") or n.target not in _EXTREMES or len(n.args) + len(n.kwargs) != 2:
        return None
    other = n.args[1] if len(n.args) == 2 else n.kwargs.get("other")
    if not _is_tensor(other):
        return None
    op, first = _EXTREMES[n.target], n.args[0]
    for operand in (first, other):
        _network_tensor(operand, alias, op)
    alias[n.name] = n.name
    return [Node(n.name, op, [alias[first.name], alias[other.name]], {}, _shape(n))]


def _reduced_dims(call: fx.Node) -> tuple[list[int], bool]:
    """The dimensions (counting the batch's) a max, min, amax or amin call ``call`` reduces, and its ``keepdim``;
    ``ValueError`` for the max of two tensors, one over every dimension or the batch's, or dimensions apart."""
    other = _arg(call, 1, "dim", _arg(call, 1, "other"))
    if isinstance(other, fx.Node):
        raise ValueError(f"a {call.target if isinstance(call.target, str) else call.target.__name__} of two tensors "
                         "has no description op")
    rank = len(call.args[0].meta["tensor_meta"].shape)
    if other is None or other == ():
        raise ValueError("a max or min over every dimension (no dim given) reduces the batch too; give dim=")
    dims = sorted({int(d) % rank for d in ([other] if isinstance(other, int) else other)})
    if dims[0] == 0 or dims != list(range(dims[0], dims[-1] + 1)):
        raise ValueError(f"a max or min over dimensions {dims} (the batch's, or dimensions apart) has no description "
                         "op")
    return dims, bool(_arg(call, 2, "keepdim", False))


def _max_values(n: fx.Node, call: fx.Node, gm: fx.GraphModule, alias: dict[str, str]) -> list[Node]:
    """The values of ``call``, a max or min over dimensions (``torch.max(x, 1, keepdim=True)[0]``, ``.values``,
    ``x.amax((2, 3))``), as the ops that compute them: the input viewed as ``[A, B, C]`` (the dimensions before, over
    and after the reduced ones), an adaptive max pool to ``[A, 1, C]`` (torch's max over a dimension: the values and
    their int64 indices, kept for backward) and a view to the output's shape; a min is the max of the input times -1,
    times -1. ``n`` is the node of those values; the nodes made are named after it."""
    dims, _ = _reduced_dims(call)
    source = call.args[0]
    _network_tensor(source, alias, "max or min")
    sample = [int(v) for v in source.meta["tensor_meta"].shape[1:]]
    before, over, after = (int(np.prod(part)) for part in (sample[:dims[0] - 1], sample[dims[0] - 1:dims[-1]],
                                                              sample[dims[-1]:]))
    taken = {x.name for x in gm.graph.nodes}
    names = iter(name for name in (f"{n.name}_{i}" for i in range(1, 99)) if name not in taken)
    negated = _MAX_CALLS.get(call.target, _AMAX_CALLS.get(call.target))
    made: list[Node] = []

    def add(op: str, attrs: dict, shape: list[int], name: str | None = None) -> None:
        made.append(Node(name or next(names), op, [made[-1].name if made else alias[source.name]], attrs, shape))
    if negated:
        add("mul", {"scalar": -1.0}, sample)
    add("reshape", {"shape": [before, over, after]}, [before, over, after])
    add("adaptivemaxpool2d", {"output_size": [1, after]}, [before, 1, after])
    add("reshape", {"shape": _shape(n)}, _shape(n), None if negated else n.name)
    if negated:
        add("mul", {"scalar": -1.0}, _shape(n), n.name)
    alias[n.name] = n.name
    return made


_SUM_CALLS = {torch.sum, "sum"}
_SUBTRACTIONS = {operator.sub, torch.sub, "sub", torch.rsub}


def _network_tensor(a: Any, alias: dict[str, str], call: str) -> None:
    """``ValueError`` where ``a``, read by ``call``, is a module's own tensor (a buffer, a parameter, or a view of one:
    a tensor no description node computes) rather than one of the network's or a number."""
    if _is_tensor(a) and a.name not in alias:
        article = "an" if call[0] in "aeiou" else "a"
        raise ValueError(f"{article} {call} of the module's tensor {a.target if a.op == 'get_attr' else a.name} has no "
                         "description op (one of the network's own tensors has; a parameter added is a 'shift', one "
                         "multiplied a 'scale')")


def _operand_pair(n: fx.Node, *allowed: str) -> tuple[Any, Any] | None:
    """The two operands of the call ``n``, the second given as it is or as ``other=`` (``torch.sub(x, other=y)``);
    None where it has not two, or a keyword argument besides ``other`` and ``allowed`` (``alpha``)."""
    operands = [*n.args, *(n.kwargs[k] for k in ("other",) if k in n.kwargs)]
    if set(n.kwargs) - {"other", *allowed} or len(operands) != 2:
        return None
    return operands[0], operands[1]


def _difference_nodes(n: fx.Node, gm: fx.GraphModule, alias: dict[str, str]) -> list[Node] | None:
    """``x - y`` of two tensors (``x - x.mean(1, keepdim=True)``) or ``1 - g`` of a number and a tensor (a gated
    fusion's ``x * (1 - g)``): the subtracted tensor times -1, then added (to the other tensor, broadcast, or to the
    number). None for any other subtraction (a tensor less a number: :func:`_by_scalar`); ``ValueError`` for one of a
    module's own tensor (a buffer's mean, a parameter), which no description node is."""
    if n.op not in ("call_function", "call_method") or n.target not in _SUBTRACTIONS:
        return None
    _refuse_alpha(n, *(("an rsub", "y - alpha * x") if n.target is torch.rsub else ("a sub", "x - alpha * y")))
    pair = _operand_pair(n, "alpha")
    if pair is None:
        return None
    first, second = pair[::-1] if n.target is torch.rsub else pair
    if not _is_tensor(second) or isinstance(first, bool) or not (_is_tensor(first) or isinstance(first, (int, float))):
        return None
    for operand in (first, second):
        _network_tensor(operand, alias, "sub")
    taken = {x.name for x in gm.graph.nodes}
    negated = next(name for name in (f"{n.name}_{i}" for i in range(1, 99)) if name not in taken)
    alias[n.name] = n.name
    if _is_tensor(first):
        added: tuple[list[str], dict] = ([alias[first.name], negated], {})
    else:
        added = ([negated], {"scalar": float(first)})
    return [Node(negated, "mul", [alias[second.name]], {"scalar": -1.0}, _shape(second)),
            Node(n.name, "add", added[0], added[1], _shape(n))]


_DIVISIONS = {operator.truediv, torch.div, torch.true_divide, "div", "true_divide"}


def _quotient_nodes(n: fx.Node, gm: fx.GraphModule, alias: dict[str, str]) -> list[Node] | None:
    """``x / y`` of two tensors (an L2 normalisation's ``x / x.pow(2).sum(1, keepdim=True).sqrt()``, a hand-written
    norm's): the op div, broadcast; ``c / y`` of a number and a tensor as torch computes it: the divisor's reciprocal
    (the power -1), times the number. None for any other division (a tensor over a number: :func:`_by_scalar`);
    ``ValueError`` for one of a module's own tensor (``x / self.std``, a buffer), which no description node is."""
    pair = _operand_pair(n, "rounding_mode") if n.op in ("call_function", "call_method") and n.target in _DIVISIONS \
        else None
    if pair is None or n.kwargs.get("rounding_mode") is not None:
        return None
    first, second = pair
    if not _is_tensor(second) or isinstance(first, bool) or not (_is_tensor(first) or isinstance(first, (int, float))):
        return None
    for operand in (first, second):
        _network_tensor(operand, alias, "div")
    alias[n.name] = n.name
    if _is_tensor(first):
        return [Node(n.name, "div", [alias[first.name], alias[second.name]], {}, _shape(n))]
    taken = {x.name for x in gm.graph.nodes}
    inverse = next(name for name in (f"{n.name}_{i}" for i in range(1, 99)) if name not in taken)
    return [Node(inverse, "pow", [alias[second.name]], {"exponent": -1.0}, _shape(second)),
            Node(n.name, "mul", [inverse], {"scalar": float(first)}, _shape(n))]


def _conv1d_attrs(m: nn.Conv1d) -> dict:
    """A ``conv2d``'s attrs for ``nn.Conv1d`` ``m`` run on its input viewed as [N, C, 1, L]: a kernel of (1, k), the
    stride, padding and dilation along the width; ``ValueError`` for a padding other than with zeros or a 'same' one
    that pads one side more."""
    if m.padding_mode != "zeros":
        raise ValueError(f"a Conv1d with padding_mode='{m.padding_mode}' has no description op; pad with zeros")
    (k,), (d,) = m.kernel_size, m.dilation
    if m.padding == "same" and d * (k - 1) % 2:
        raise ValueError(f"a Conv1d with padding='same' and kernel {k} (dilation {d}) pads one side more than the "
                         "other, which a description cannot say; give the padding as a number")
    p = 0 if m.padding == "valid" else d * (k - 1) // 2 if m.padding == "same" else int(m.padding[0])
    return {"in_channels": m.in_channels, "out_channels": m.out_channels, "kernel_size": [1, int(k)],
            "stride": [1, int(m.stride[0])], "padding": [0, p], "dilation": [1, int(d)], "groups": m.groups,
            "bias": m.bias is not None}


def _conv1d_nodes(n: fx.Node, gm: fx.GraphModule, alias: dict[str, str]) -> list[Node] | None:
    """``nn.Conv1d`` over a [N, C, L] tensor (ECA-Net's gate: a convolution along the channels of a pooled map, viewed
    as [N, 1, C]), as torch runs it: its input viewed as [N, C, 1, L], a ``conv2d`` of kernel (1, k) named after the
    layer, and its output viewed back as [N, C', L']. None for any other node."""
    if n.op != "call_module" or not isinstance(gm.get_submodule(n.target), nn.Conv1d):
        return None
    attrs = _conv1d_attrs(gm.get_submodule(n.target))
    (c, length), (c_out, out_length) = _shape(n.args[0]), _shape(n)
    taken = {x.name for x in gm.graph.nodes}
    viewed, back = (next(name for name in (f"{n.name}_{what}_{i}" for i in range(1, 99)) if name not in taken)
                    for what in ("2d", "1d"))
    alias[n.name] = back
    return [Node(viewed, "unsqueeze", [alias[n.args[0].name]], {"dim": 2}, [c, 1, length]),
            Node(n.name, "conv2d", [viewed], attrs, [c_out, 1, out_length]),
            Node(back, "squeeze", [n.name], {"dim": 2}, [c_out, out_length])]


def _stack_nodes(n: fx.Node, gm: fx.GraphModule, alias: dict[str, str]) -> list[Node] | None:
    """``torch.stack(tensors, dim)`` (SKNet's branches stacked for a softmax over them) as torch computes it: each
    tensor unsqueezed at ``dim`` (a view), then concatenated along it; ``ValueError`` for a stack along the batch
    dimension. None for any other node."""
    if n.op != "call_function" or n.target is not torch.stack:
        return None
    tensors, dim = _arg(n, 0, "tensors"), _arg(n, 1, "dim", 0)
    out = _shape(n)
    if not isinstance(tensors, (list, tuple)) or not all(_is_tensor(t) for t in tensors) or out is None:
        raise ValueError("a stack of anything but a list of tensors has no description op")
    dim = int(dim) % (len(out) + 1)
    if dim == 0:
        raise ValueError("a stack along the batch dimension (dim 0) has no description op")
    for t in tensors:
        _network_tensor(t, alias, "stack")
    taken = {x.name for x in gm.graph.nodes}
    names = iter(name for name in (f"{n.name}_{i}" for i in range(1, 999)) if name not in taken)
    unsqueezed = [Node(next(names), "unsqueeze", [alias[t.name]], {"dim": dim}, out[:dim - 1] + [1] + out[dim:])
                  for t in tensors]
    alias[n.name] = n.name
    return unsqueezed + [Node(n.name, "cat", [u.name for u in unsqueezed], {"dim": dim}, out)]


_CHANNEL_SHUFFLES = {torch.channel_shuffle, torch.native_channel_shuffle, F.channel_shuffle,
                     F.native_channel_shuffle}


def _channel_shuffle_nodes(n: fx.Node, gm: fx.GraphModule, alias: dict[str, str]) -> list[Node] | None:
    """``nn.ChannelShuffle(g)``, ``F.channel_shuffle(x, g)`` (ShuffleNet's shuffle of a [N, C, *] map) as torch's
    math_channel_shuffle computes it: a view into [g, C / g, *] groups, the two group dimensions swapped, and a
    reshape back to [C, *] (a copy). Its one output-sized copy forward and one backward are aten.channel_shuffle's
    (no tensor kept), so the description is that of a view-and-transpose shuffle written by hand. None for any other
    node."""
    if n.op == "call_module" and isinstance(gm.get_submodule(n.target), nn.ChannelShuffle):
        groups = gm.get_submodule(n.target).groups
    elif n.op == "call_function" and n.target in _CHANNEL_SHUFFLES:
        groups = _arg(n, 1, "groups")
    else:
        return None
    source, out = n.args[0], _shape(n)
    _network_tensor(source, alias, "channel shuffle")
    channels, rest = out[0], out[1:]
    taken = {x.name for x in gm.graph.nodes}
    grouped, swapped = (next(name for name in (f"{n.name}_{what}_{i}" for i in range(1, 99)) if name not in taken)
                        for what in ("groups", "swapped"))
    alias[n.name] = n.name
    g = int(groups)
    return [Node(grouped, "reshape", [alias[source.name]], {"shape": [g, channels // g, *rest]},
                 [g, channels // g, *rest]),
            Node(swapped, "transpose", [grouped], {"dim0": 1, "dim1": 2}, [channels // g, g, *rest]),
            Node(n.name, "reshape", [swapped], {"shape": out}, out)]


def _std_nodes(n: fx.Node, gm: fx.GraphModule, alias: dict[str, str]) -> list[Node] | None:
    """``x.std(dims, ...)``: the variance (:func:`_variance`), then its square root (torch's std: one kernel keeping
    its input and its result, these two: the input and the root kept, a reduced tensor's kernel more). None for any
    other node."""
    if n.op not in ("call_function", "call_method") or n.target not in _STD_CALLS or _shape(n) is None:
        return None
    _, attrs = _variance(n)
    _network_tensor(n.args[0], alias, "standard deviation")
    rank = len(_shape(n.args[0])) + 1  # the batch's dimension included
    if 0 in {d % rank for d in attrs["dims"]}:
        raise ValueError("a standard deviation over the batch dimension (dim 0) has no description op")
    taken = {x.name for x in gm.graph.nodes}
    variance = next(name for name in (f"{n.name}_{i}" for i in range(1, 99)) if name not in taken)
    alias[n.name] = n.name
    return [Node(variance, "var", [alias[n.args[0].name]], attrs, _shape(n)),
            Node(n.name, "pow", [variance], {"exponent": 0.5}, _shape(n))]


#: Activations torch computes as a few elementwise ops in Python (torch.nn.functional), by their layer and their call:
#: Softsign ``x / (x.abs() + 1)``, Tanhshrink ``x - x.tanh()``, Softmin ``(-x).softmax(dim)``.
_COMPOSED_LAYERS = {nn.Softsign: "softsign", nn.Tanhshrink: "tanhshrink", nn.Softmin: "softmin"}
_COMPOSED_CALLS = {F.softsign: "softsign", F.tanhshrink: "tanhshrink", F.softmin: "softmin"}


def _composed_kind(n: fx.Node, gm: fx.GraphModule) -> str | None:
    """Which of :data:`_COMPOSED_LAYERS` (or their calls) ``n`` is; None for any other node."""
    if n.op == "call_module":
        layer = gm.get_submodule(n.target)
        return next((kind for cls, kind in _COMPOSED_LAYERS.items() if isinstance(layer, cls)), None)
    return _COMPOSED_CALLS.get(n.target) if n.op == "call_function" else None


def _softmin_dim(n: fx.Node, gm: fx.GraphModule) -> Any:
    """The ``dim`` of Softmin ``n`` (the layer's, or the call's; a call that casts, ``dtype=``, ``ValueError``)."""
    if n.op == "call_module":
        return gm.get_submodule(n.target).dim
    dtype = _arg(n, 3, "dtype")
    if dtype is not None and dtype != torch.float32:
        raise ValueError("a softmin that casts (dtype=) has no description op")
    return _arg(n, 1, "dim")


def _composed_activation_nodes(n: fx.Node, gm: fx.GraphModule, alias: dict[str, str]) -> list[Node] | None:
    """Softsign, Tanhshrink and Softmin (the layers and the calls) as torch computes them, op by op: a softsign the
    input over its absolute value plus 1 (abs, add, div), a tanhshrink the input less its tanh (tanh, then the
    difference as every ``x - y`` is described: times -1, added), a softmin the softmax of the input times -1 (along
    a dimension as a softmax's: not the batch's, not torch's implicit choice). The last node is named after ``n``.
    None for any other node."""
    kind = _composed_kind(n, gm)
    if kind is None:
        return None
    source = n.args[0] if n.args else n.kwargs.get("input")
    _network_tensor(source, alias, kind)
    x, shape = alias[source.name], _shape(n)
    taken = {node.name for node in gm.graph.nodes}
    names = (name for name in (f"{n.name}_{i}" for i in range(1, 99)) if name not in taken)
    first, second = next(names), next(names)
    alias[n.name] = n.name
    if kind == "softsign":
        return [Node(first, "abs", [x], {}, shape), Node(second, "add", [first], {"scalar": 1.0}, shape),
                Node(n.name, "div", [x, second], {}, shape)]
    if kind == "tanhshrink":
        return [Node(first, "tanh", [x], {}, shape), Node(second, "mul", [first], {"scalar": -1.0}, shape),
                Node(n.name, "add", [x, second], {}, shape)]
    try:
        op, attrs = _softmax_attrs(n, _softmin_dim(n, gm))
    except ValueError as exc:  # named as the layer or call it is
        raise ValueError(str(exc).replace("a softmax", "a softmin")) from None
    return [Node(first, "mul", [x], {"scalar": -1.0}, shape), Node(n.name, op, [first], attrs, shape)]


def _sum_nodes(n: fx.Node, gm: fx.GraphModule, alias: dict[str, str]) -> list[Node]:
    """``x.sum(dims)``, ``torch.sum(x, dims, keepdim)`` (timm's split attention sums over its radix): the mean over
    those dimensions times their elements' count, the same work on the same tensors; over none given (every
    dimension, the batch's too) or over the batch's, ``ValueError``."""
    dims = _arg(n, 1, "dim")
    if dims is None or isinstance(dims, fx.Node) or n.kwargs.get("dtype") is not None or len(n.args) > 3:
        raise ValueError("a sum over every dimension, or of another type (dtype=), has no description op; give dim=")
    source = n.args[0]
    _network_tensor(source, alias, "sum")
    shape = [int(v) for v in source.meta["tensor_meta"].shape]
    dims = sorted({int(d) % len(shape) for d in ([dims] if isinstance(dims, int) else dims)})
    if 0 in dims:
        raise ValueError("a sum over the batch dimension (dim 0) has no description op")
    taken = {x.name for x in gm.graph.nodes}
    mean = next(name for name in (f"{n.name}_{i}" for i in range(1, 99)) if name not in taken)
    count = float(np.prod([shape[d] for d in dims]))
    alias[n.name] = n.name
    return [Node(mean, "mean", [alias[source.name]], {"dims": dims, "keepdim": bool(_arg(n, 2, "keepdim", False))},
                 _shape(n)),
            Node(n.name, "mul", [mean], {"scalar": count}, _shape(n))]


_MATRIX_PRODUCTS = {operator.matmul, torch.matmul, torch.bmm, "matmul", "bmm"}
_SORTS = {torch.sort, "sort", torch.topk, "topk"}


def _sort_attrs(call: fx.Node) -> tuple[str, dict]:
    """The op and attrs of ``torch.sort(x, dim, descending)``/``x.sort`` or ``torch.topk(x, k, dim, largest,
    sorted)``/``x.topk`` (dims counted from the front); one along the batch, a stable sort (``stable=``) or an
    unsorted topk (``sorted=False``: its order is the kernel's) is refused by name."""
    name = call.target if isinstance(call.target, str) else call.target.__name__
    if name == "sort":
        if call.kwargs.get("stable"):
            raise ValueError("a stable sort (stable=True) has no description op; leave stable out")
        (dim,) = _dims_after_the_batch(call, _arg(call, 1, "dim", -1), "sort")
        return "sort", {"dim": dim, "descending": bool(_arg(call, 2, "descending", False))}
    if not _arg(call, 4, "sorted", True):
        raise ValueError("a topk of sorted=False (its values in the kernel's order) has no description op")
    (dim,) = _dims_after_the_batch(call, _arg(call, 2, "dim", -1), "topk")
    return "topk", {"k": int(_shape_value(_arg(call, 1, "k"))), "dim": dim,
                    "largest": bool(_arg(call, 3, "largest", True))}


def _sorted_part(n: fx.Node, alias: dict[str, str]) -> list[Node] | None:
    """``n``'s nodes where it reads the values of a sort or a topk (``[0]``, ``.values``: the op sort or topk of
    the call's input; a later read of them that one's node), none where it is their indices and nothing reads them;
    None where it is neither. Indices that are read are a :class:`_NoOp` (a description's tensors are float32)."""
    if n.op != "call_function" or n.target not in (operator.getitem, getattr) or \
            getattr(n.args[0], "target", None) not in _SORTS:
        return None
    call = n.args[0]
    if n.args[1] in (0, "values"):
        earlier = _earlier_values_read(n, alias)
        if earlier is not None:
            alias[n.name] = alias[earlier.name]
            return []
        op, attrs = _sort_attrs(call)
        if call.args[0].name not in alias:
            raise ValueError(f"a {op} of {call.args[0].name}, a value the description cannot follow, has no "
                             "description op")
        alias[n.name] = n.name
        return [Node(n.name, op, [alias[call.args[0].name]], attrs, _shape(n))]
    if n.users:
        label = call.target if isinstance(call.target, str) else call.target.__name__
        raise _NoOp(f"the indices (int64) of {call.op} '{label}' (node {call.name})", f"indices of {label}", n)
    return []


_EINSUMS = {torch.einsum}


def _batched_matmul_form(equation: str) -> tuple[bool, bool] | None:
    """Where the einsum ``equation`` is a batched matrix product, whether each operand is read transposed: ``"bij,
    bjk->bik"`` (False, False), ``"bji,bjk->bik"`` (a non-local block's a^T b: True, False), ``"bij,bkj->bik"`` (a
    b^T: False, True). Leading letters, the batch's first, the same in both operands and the result; then the rows
    of the first by the columns of the second over a letter they share, each letter once per operand. None for any
    other form."""
    terms = equation.replace(" ", "").split("->")
    operands = terms[0].split(",")
    if len(terms) != 2 or len(operands) != 2 or not all(t.isalpha() for t in (*operands, terms[1])):
        return None
    a, b, out = operands[0], operands[1], terms[1]
    lead = a[:-2]
    once = len(set(a)) == len(a) and len(set(b)) == len(b)
    if not (once and len(a) == len(b) == len(out) >= 3 and len(set(a + b)) == len(a) + 1
            and b[:-2] == lead == out[:-2]):
        return None
    shared = set(a[-2:]) & set(b[-2:])
    if len(shared) != 1:
        return None
    (k,) = shared
    rows, cols = a[-2:].replace(k, ""), b[-2:].replace(k, "")
    return (a[-2] == k, b[-1] == k) if out[-2:] == rows + cols else None


def _einsum_permutation(equation: str) -> list[int] | None:
    """Where the einsum ``equation`` of one operand reorders its letters alone (``"bchw->bhwc"``: torch's permuted
    view of it), the dims of that permute, the batch's first; None for any other form."""
    terms = equation.replace(" ", "").split("->")
    if len(terms) != 2 or "," in terms[0] or not terms[0].isalpha() or len(set(terms[0])) != len(terms[0]):
        return None
    source, out = terms
    if sorted(out) != sorted(source) or out[0] != source[0]:
        return None
    return [source.index(letter) for letter in out]


def _matrix_product_nodes(n: fx.Node, gm: fx.GraphModule, alias: dict[str, str]) -> list[Node] | None:
    """``a @ b`` of two of the network's tensors (torch.matmul, bmm, an einsum of a batched matrix product: a
    non-local block's, a hand-written self-attention's): the op matmul, after a transpose of the last two dims of an
    operand the einsum reads transposed. None for any other call; ``ValueError`` for
    an einsum of another form (named), a product of ranks the op does not take, or one of a module's own tensor."""
    if n.op not in ("call_function", "call_method") or n.target not in _MATRIX_PRODUCTS | _EINSUMS or n.kwargs:
        return None
    operands, transposed = list(n.args), (False, False)
    if n.target in _EINSUMS:
        equation, operands = operands[0], operands[1:]
        if len(operands) == 1 and isinstance(operands[0], (list, tuple)):
            operands = list(operands[0])
        dims = _einsum_permutation(equation) if isinstance(equation, str) and len(operands) == 1 else None
        if dims is not None and _is_tensor(operands[0]):  # a permuted view of one tensor
            _network_tensor(operands[0], alias, "einsum")
            alias[n.name] = n.name
            return [Node(n.name, "permute", [alias[operands[0].name]], {"dims": dims}, _shape(n))]
        form = _batched_matmul_form(equation) if isinstance(equation, str) else None
        if form is None or len(operands) != 2:
            raise ValueError(f"an einsum of the form {equation!r} has no description op (only a batched matrix "
                             "product of two tensors, e.g. 'bij,bjk->bik', either operand's last two letters "
                             "swapped, is the op matmul, and a reordering of one tensor's letters after the batch's, "
                             "e.g. 'bchw->bhwc', the op permute)")
        transposed = form
    if len(operands) != 2 or not all(_is_tensor(a) for a in operands):
        return None
    for operand in operands:
        _network_tensor(operand, alias, "matmul")
    ranks = [len(a.meta["tensor_meta"].shape) for a in operands]
    if ranks[0] != ranks[1] or ranks[0] < 3:
        raise ValueError(f"a matmul of tensors of ranks {ranks} (the batch counted) has no description op: the op "
                         "multiplies batched matrices of one rank, at least 3")
    alias[n.name] = n.name
    inputs, nodes = [], []
    for operand, flip, side in zip(operands, transposed, "ab"):
        inputs.append(alias[operand.name] if not flip else f"{n.name}_{side}_transposed")
        if flip:  # an einsum's operand read transposed: torch's bmm of its transposed view
            shape = list(operand.meta["tensor_meta"].shape)[1:]
            nodes.append(Node(inputs[-1], "transpose", [alias[operand.name]], {"dim0": -2, "dim1": -1},
                              shape[:-2] + shape[-2:][::-1]))
    return nodes + [Node(n.name, "matmul", inputs, {}, _shape(n))]


def _max_part(n: fx.Node, gm: fx.GraphModule, alias: dict[str, str]) -> list[Node] | None:
    """``n``'s nodes where it is the values of a max or min over dimensions (:func:`_max_values`), none where it is
    their indices and nothing reads them (``values, _ = x.max(1)``); None where it is neither. Indices that are read
    are a :class:`_NoOp`: a description's tensors are float32."""
    if n.op in ("call_function", "call_method") and n.target in _AMAX_CALLS:
        return _max_values(n, n, gm, alias)
    if n.op in ("call_function", "call_method") and n.target in _SUM_CALLS and _shape(n) is not None:
        return _sum_nodes(n, gm, alias)
    for rewrite in (_difference_nodes, _quotient_nodes, _conv1d_nodes, _stack_nodes, _std_nodes,
                    _composed_activation_nodes, _channel_shuffle_nodes, _matrix_product_nodes,
                    _extreme_nodes):
        nodes = rewrite(n, gm, alias)
        if nodes is not None:
            return nodes
    if n.op != "call_function" or n.target not in (operator.getitem, getattr) or not _is_max_call(n.args[0]):
        return None
    if n.args[1] in (0, "values"):
        earlier = _earlier_values_read(n, alias)
        if earlier is None:
            return _max_values(n, n.args[0], gm, alias)
        alias[n.name] = alias[earlier.name]
        return []
    if n.users:  # named with the other ops without a description op, as an op of its own (:class:`_NoOp`)
        call = n.args[0]
        label = call.target if isinstance(call.target, str) else call.target.__name__
        raise _NoOp(f"the indices (int64) of {call.op} '{label}' (node {call.name})", f"indices of {label}", n)
    return []


def _earlier_values_read(n: fx.Node, alias: dict[str, str]) -> fx.Node | None:
    """The read of a call's values (its ``[0]`` or ``.values``: a pool returning its indices, a max over a dimension)
    already described that ``n``, another read of them, follows; None where there is none. ``n`` then reads that
    one's node (the call runs once; a read described again would count its work twice, and draw a fractional pool's
    windows twice)."""
    return next((earlier for earlier in n.args[0].users
                 if earlier is not n and earlier.op == "call_function" and earlier.target in (operator.getitem, getattr)
                 and earlier.args[1] in (0, "values") and earlier.name in alias), None)


_POOLS_WITH_INDICES = {F.max_pool2d_with_indices: "max_pool2d", F.fractional_max_pool2d_with_indices:
                       "fractional_max_pool2d", F.adaptive_max_pool2d_with_indices: "adaptive_max_pool2d"}


def _pool_with_indices(call: Any, gm: fx.GraphModule) -> str | None:
    """The name of the pool ``call`` is where it returns its values and their indices (``return_indices=True``: a
    max pool's, a fractional or an adaptive one's, the module or the function, which torch.fx records as
    ``max_pool2d_with_indices``); None for any other node."""
    if not isinstance(call, fx.Node):
        return None
    if call.op == "call_function":
        return _POOLS_WITH_INDICES.get(call.target)
    module = gm.get_submodule(call.target) if call.op == "call_module" else None
    pools = (nn.MaxPool2d, nn.FractionalMaxPool2d, nn.AdaptiveMaxPool2d)
    return type(module).__name__ if isinstance(module, pools) and module.return_indices else None


def _pooled_values(values: fx.Node, call: fx.Node, gm: fx.GraphModule) -> tuple[str, dict]:
    """The op and attrs of pool ``call``'s values, read as ``values`` (its tuple's [0]): the pool without indices,
    which torch computes alike (its backward reads the indices it keeps either way)."""
    if call.op == "call_module":
        m = gm.get_submodule(call.target)
        if isinstance(m, nn.FractionalMaxPool2d):
            if m._random_samples is not None:
                raise ValueError(_FIXED_SAMPLES)
            return _fractional_maxpool_attrs(call.args[0], _shape(values), m.kernel_size)
        if isinstance(m, nn.AdaptiveMaxPool2d):
            return _adaptive_pool("adaptivemaxpool2d", values)
        return _maxpool(nn.MaxPool2d(m.kernel_size, m.stride, m.padding, m.dilation, ceil_mode=m.ceil_mode))
    if call.target is F.fractional_max_pool2d_with_indices:
        if _arg(call, 5, "_random_samples") is not None:
            raise ValueError(_FIXED_SAMPLES)
        return _fractional_maxpool_attrs(call.args[0], _shape(values), _arg(call, 1, "kernel_size"))
    if call.target is F.adaptive_max_pool2d_with_indices:
        return _adaptive_pool("adaptivemaxpool2d", values)
    return _maxpool(nn.MaxPool2d(_arg(call, 1, "kernel_size"), _arg(call, 2, "stride"), _arg(call, 3, "padding", 0),
                                 _arg(call, 4, "dilation", 1), ceil_mode=bool(_arg(call, 5, "ceil_mode", False))))


def _pool_part(n: fx.Node, gm: fx.GraphModule, alias: dict[str, str]) -> list[Node] | None:
    """``n``'s nodes where it is a pool that returns its indices (none: its parts are read apart), the values of one
    (the pool's op) or their indices read by nothing; None for any other node. Indices that are read are a
    :class:`_NoOp`: a description's tensors are float32, and no op reads indices."""
    if _pool_with_indices(n, gm) is not None and all(u.target is operator.getitem for u in n.users):
        return []
    if n.op != "call_function" or n.target is not operator.getitem or _pool_with_indices(n.args[0], gm) is None:
        return None
    call = n.args[0]
    if n.args[1] == 1:
        if n.users:
            name = _pool_with_indices(call, gm)
            raise _NoOp(f"the indices (int64) of {name}(..., return_indices=True) (node {call.name}; a description "
                        f"follows its values alone, read as its [0])", f"indices of {name}", n)
        return []
    earlier = _earlier_values_read(n, alias)
    if earlier is not None:
        alias[n.name] = alias[earlier.name]
        return []
    op, attrs = _pooled_values(n, call, gm)
    _network_tensor(call.args[0], alias, op)
    alias[n.name] = n.name
    return [Node(n.name, op, [alias[call.args[0].name]], attrs, _shape(n))]


def _is_attention(source: Any, gm: fx.GraphModule) -> bool:
    return isinstance(source, fx.Node) and source.op == "call_module" and isinstance(
        gm.get_submodule(source.target), nn.MultiheadAttention)


def _self_attention(n: fx.Node, inputs: list[str], where: str) -> tuple[list[str], list[int]]:
    """An attention module's one input (its query, key and value must be that one tensor) and its output shape.
    Its weights must not be asked for (``need_weights=False``): with them torch's training step takes the math path,
    which keeps every head's tokens x tokens weights for backward, not the fused kernel the description counts."""
    if len(inputs) != 3 or len(set(inputs)) != 1 or n.kwargs.get("is_causal") or any(
            n.kwargs.get(k) is not None for k in ("attn_mask", "key_padding_mask")):
        raise UserError(f"{where}: attention (node {n.name}) is described as self-attention only: one tensor as "
                        "query, key and value, no mask")
    if _arg(n, 4, "need_weights", True):
        raise UserError(f"{where}: attention (node {n.name}) asks for its weights (need_weights=True, "
                        "nn.MultiheadAttention's default: torch then keeps every head's weights for backward, which "
                        "the description's fused attention does not); call it with need_weights=False")
    return inputs[:1], list(n.meta["tensor_meta"][0].shape)[1:]


def _per_sample(shape: Any, rank: int) -> list[int]:
    """A parameter's shape as it meets a per-sample tensor of ``rank`` dims: a leading batch dimension of 1 (a
    parameter of the batched tensor's rank, e.g. a position embedding [1, L, E]) is dropped."""
    shape = [int(s) for s in shape]
    return shape[1:] if len(shape) == rank + 1 and shape[0] == 1 else shape


def _is_generator(gm: fx.GraphModule, read: fx.Node) -> bool:
    """Whether the module object that the ``get_attr`` node ``read`` reads is a random generator (``torch.rrelu(x,
    generator=g)``): it picks the stream the numbers are drawn from, not how many, so the op costs the same."""
    value: Any = gm
    for part in str(read.target).split("."):
        value = getattr(value, part, None)
    return isinstance(value, torch.Generator)


def _batch_norm_affine_trained(n: fx.Node, gm: fx.GraphModule, where: str) -> None:
    """Check that an ``F.batch_norm`` call's weight and bias, where it has them, are parameters, as a batchnorm2d's
    are: of buffers (a frozen batch norm written as ``F.batch_norm(x, mean, var, weight, bias, False)``) it would be
    described with parameters the network does not have, trained; ``UserError`` naming the buffer."""
    for read in (_arg(n, 3, "weight"), _arg(n, 4, "bias")):
        if not isinstance(read, fx.Node) or read.op != "get_attr":
            continue
        try:
            gm.get_parameter(read.target)
        except AttributeError:
            raise UserError(f"{where}: batch norm call (node {n.name}) reads {read.target}, a module tensor that is "
                            "no parameter, as its weight or bias (a batch norm frozen: torchvision's "
                            "FrozenBatchNorm2d describes as one), which the description has no op for") from None


def _with_own_tensors(n: fx.Node, op: str, attrs: dict, gm: fx.GraphModule, where: str,
                      held: dict[str, fx.Node]) -> tuple[str, dict, set[str]]:
    """``n``'s op once the module tensors it reads (``get_attr`` nodes, or their batch expansions: ``held``) are
    taken in: a multiply by one parameter is a ``scale`` of that parameter's shape, an add of one a ``shift``, a
    concatenation that puts one first a ``token``; a layer, group or instance norm reads its own weight and bias, a
    PReLU its slopes, a batch norm call its weight, bias and running statistics (an instance norm call's running
    statistics too, where it tracks them); a random generator read is left out
    (:func:`_is_generator`). The names of those nodes come back, so that they are not read as inputs. Any other op
    reading a module tensor is a ``UserError``."""
    own: list[fx.Node] = []
    fx.node.map_arg((n.args, n.kwargs), lambda a: own.append(a) if a.name in held else None)
    generators = {a.name for a in own if _is_generator(gm, held[a.name])}
    own = [a for a in own if a.name not in generators]
    if not own:
        return op, attrs, generators
    if op == "window_attention":  # its weights, its biases' table or MLP, its scale: read from the call itself
        return op, attrs, {a.name for a in own}
    if op == "batchnorm2d":  # F.batch_norm's running statistics (buffers), weight and bias: the call's own
        _batch_norm_affine_trained(n, gm, where)
        return op, attrs, {a.name for a in own}
    running: set[str] = set()
    if op == "instancenorm" and attrs.get("track_running_stats"):  # F.instance_norm's running statistics: buffers
        running = {a.name for a in (_arg(n, 1, "running_mean"), _arg(n, 2, "running_var")) if isinstance(a, fx.Node)}
    for a in own:
        if a.name in running:
            continue
        try:
            gm.get_parameter(held[a.name].target)
        except AttributeError:
            raise UserError(f"{where}: {op} (node {n.name}) reads {held[a.name].target}, a module tensor that is no "
                            "parameter, which the description has no op for") from None
    names = {a.name for a in own}
    rank = len(_shape(n) or [])
    viewed = _views_a_held_tensor(own[0], held)  # its shape the view's
    shape = _per_sample((own[0] if viewed else held[own[0].name]).meta["tensor_meta"].shape, rank)
    if op in ("mul", "add") and len(own) == 1 and len(n.args) == 2 and (own[0].op == "get_attr" or viewed):
        return ("scale" if op == "mul" else "shift"), {"shape": shape}, names
    parts = n.args[0] if op == "cat" else []
    if op == "cat" and len(own) == 1 and len(parts) == 2 and parts[0] is own[0]:
        return "token", {"shape": shape, "dim": attrs["dim"] % (rank + 1)}, names
    if op in ("layernorm", "groupnorm", "conv_transpose2d", "instancenorm", "prelu",
              "rmsnorm"):
        return op, attrs, names
    _refuse_parameters_alone(n, held, where)
    raise UserError(f"{where}: {op} (node {n.name}) reads the module's parameter {held[own[0].name].target} "
                    "directly, which the description has no op for (a multiply by one parameter is a 'scale', an "
                    "add of one a 'shift', one concatenated first a 'token')")


def _refuse_parameters_alone(n: fx.Node, held: dict[str, fx.Node], where: str) -> None:
    """A ``UserError`` naming the parameter where ``n`` computes from module tensors alone (weights in a form other
    than BiFPN's fusion, :mod:`perf4sight.ir.weighted_sums`), whose refusal would otherwise speak of ops or dimensions
    of the network's tensors (a softmax of a ``[2]`` parameter read as one over the batch). Weights whose products
    are stacked (effdet's FpnCombine) are named as such."""
    inputs = n.all_input_nodes
    if not inputs or any(a.name not in held for a in inputs):
        return
    kind = n.target if isinstance(n.target, str) else getattr(n.target, "__name__", str(n.target))
    parameter = held[inputs[0].name].target
    stacked = ("; the weighted maps are stacked, then summed over the new dimension (effdet's FpnCombine): that "
               "sum written as a stack has no description op" if _reaches_a_stack(n) else "")
    raise UserError(f"{where}: {kind} (node {n.name}) computes from the module's parameter {parameter} "
                    "alone, not from the network's input: the description has no op for weights computed from "
                    "parameters but BiFPN's fusion (the op weighted_sum: w = relu(p) / (sum(relu(p)) + eps) or "
                    "softmax(p) of a parameter p of n weights, each picked once, w[0] * a + w[1] * b + ... of n "
                    f"maps of one shape){stacked}")


def _reaches_a_stack(n: fx.Node, hops: int = 4) -> bool:
    """Whether a ``torch.stack`` reads what ``n`` computes within ``hops`` calls (the weights, a pick of one, its
    product with a map, that over a sum), or reads their products' stack (``torch.stack(maps, -1) * w``)."""
    frontier, seen = [n], {n}
    for _ in range(hops):
        frontier = [u for f in frontier for u in f.users if u not in seen]
        seen.update(frontier)
        if any(u.op == "call_function" and u.target is torch.stack for u in frontier) or any(
                a.op == "call_function" and a.target is torch.stack for u in frontier for a in u.all_input_nodes):
            return True
    return False


def _whole_splits(n: fx.Node, alias: dict[str, str], pieces: dict[str, list[str]]) -> list[Node]:
    """Narrow nodes for each piece of a chunk/split that ``n`` takes whole (not indexed), made once."""
    made: list[Node] = []

    def expand(a: fx.Node) -> None:
        meta = a.meta.get("tensor_meta")
        if a.name in alias or a.name in pieces or a.target not in _SPLITS or not isinstance(meta, (tuple, list)) \
                or hasattr(meta, "shape") or a.args[0].name not in alias:
            return
        new = [_split_piece(a, i, f"{a.name}__{i}", alias) for i in range(len(meta))]
        made.extend(new)
        pieces[a.name] = [piece.name for piece in new]
    fx.node.map_arg((n.args, n.kwargs), expand)
    return made


def _tensor_inputs(n: fx.Node, alias: dict[str, str], pieces: dict[str, list[str]], where: str,
                   own: set[str]) -> list[str]:
    """Tensor arguments in argument order, repeats kept (``torch.cat([x, x])`` has two inputs), but for the module
    tensors in ``own``; ``UserError`` for an argument carrying tensors the description does not follow (e.g. the
    tuple a module returned), instead of leaving that input out."""
    found: list[str] = []

    def add(a: fx.Node) -> None:
        if a.name in own:
            return
        if a.name in alias:
            found.append(alias[a.name])
        elif a.name in pieces:
            found.extend(pieces[a.name])
        elif a.meta.get("tensor_meta") is not None:
            raise UserError(f"{where}: node {n.name} takes {a.name}, a value the description cannot follow "
                            "(a tuple of tensors, or a tensor made by an op it has no op for)")
    fx.node.map_arg((n.args, n.kwargs), add)
    return found


def _getitem(n: fx.Node, alias: dict[str, str]) -> Node | None:
    """``chunk``/``split`` followed by ``[i]`` becomes a ``narrow`` node, and so does a tensor indexed
    with ``:`` everywhere but one slice (``x[:, 2:5]``); one integer instead of that slice is a
    ``select`` (``x[:, :, 0]``). Other getitems are shape queries (or, on a tensor, not expressible)."""
    source, index = n.args
    meta = source.meta.get("tensor_meta") if isinstance(source, fx.Node) else None
    if hasattr(meta, "shape") and (isinstance(index, tuple) or index is None):  # x[None]: a tuple of one
        return _index(n, source, index if isinstance(index, tuple) else (index,), meta.shape, alias)
    # a tuple of tensors from chunk/split (TensorMetadata is itself a named tuple: indexing a tensor is not this
    # case); another op's tuple, such as a module's (output, state), has no description
    if not isinstance(index, int) or not isinstance(meta, (tuple, list)) or hasattr(meta, "shape") \
            or not hasattr(meta[index], "shape") or source.target not in _SPLITS | _UNBINDS:
        return None
    if source.target in _UNBINDS:
        return _unbound_piece(source, index, n.name, alias)
    return _split_piece(source, index, n.name, alias)


def _unbound_piece(unbind: fx.Node, index: int, name: str, alias: dict[str, str]) -> Node:
    """Piece ``index`` of the unbind node ``unbind`` (``torch.unbind(x, 1)``, SKNet's branches taken apart) as a
    ``select`` node called ``name``, the view torch's unbind makes; ``ValueError`` for an unbind of the batch."""
    source = unbind.args[0]
    dim = int(_arg(unbind, 1, "dim", 0)) % len(source.meta["tensor_meta"].shape)
    if dim == 0:
        raise ValueError("an unbind along the batch dimension (dim 0) has no description op")
    _network_tensor(source, alias, "unbind")
    return Node(name, "select", [alias[source.name]], {"dim": dim, "index": index},
                list(unbind.meta["tensor_meta"][index].shape)[1:])


_PERMUTES = {torch.permute, "permute"}


def _picks_one_entry(user: fx.Node) -> bool:
    """Whether ``user`` takes one entry of its input's first dimension: ``x[i]`` (an integer), ``x.select(0, i)``,
    or ``x.unbind(0)`` each of whose readers takes one of its pieces (``q, k, v = x.unbind(0)``)."""
    if user.op not in ("call_method", "call_function"):
        return False
    if user.target is operator.getitem:
        return isinstance(user.args[1], int)
    rank = len(user.args[0].meta["tensor_meta"].shape)
    if user.target in (torch.select, "select"):
        return int(_arg(user, 1, "dim")) % rank == 0
    if user.target in _UNBINDS:
        return int(_arg(user, 1, "dim", 0)) % rank == 0 and all(
            u.target is operator.getitem and isinstance(u.args[1], int) for u in user.users)
    return False


def _moves_the_batch_for_picks(n: fx.Node) -> bool:
    """Whether ``n`` is a permute that moves the batch dimension from first, each of its readers taking one entry of
    its first dimension: a packed projection's queries, keys and values
    (``qkv.reshape(B, N, 3, h, d).permute(2, 0, 3, 1, 4)``, then ``q, k, v = qkv.unbind(0)``, timm's attention)."""
    return isinstance(n, fx.Node) and n.op in ("call_method", "call_function") and n.target in _PERMUTES \
        and _permuted_dims(n)[0] != 0 and bool(n.users) and all(_picks_one_entry(u) for u in n.users)


def _picked_after_a_moved_batch(n: fx.Node, alias: dict[str, str]) -> list[Node] | None:
    """The nodes of ``n`` where it takes entry i of a permute that moved the batch (:func:`_moves_the_batch_for_picks`):
    the permute's input's entry i along the dimension the permute put first (a select), then the other dimensions
    in the permute's order (a permute of the batch first; none where they stay in order). None for another node."""
    if n.op not in ("call_method", "call_function"):
        return None
    if n.target is operator.getitem and isinstance(n.args[0], fx.Node) and isinstance(n.args[1], int):
        source, index = n.args
        if source.target in _UNBINDS and isinstance(source.args[0], fx.Node):
            source = source.args[0]
    elif n.target in (torch.select, "select") and isinstance(n.args[0], fx.Node):
        source, index = n.args[0], int(_arg(n, 2, "index"))
    else:
        return None
    if not _moves_the_batch_for_picks(source):
        return None
    return _select_then_permute(n, source, index, alias)


def _select_then_permute(n: fx.Node, permute: fx.Node, index: int, alias: dict[str, str]) -> list[Node]:
    """Entry ``index`` of ``permute``'s first dimension, which ``n`` takes, as a select of ``permute``'s input and a
    permute of what is left (``x.permute(2, 0, 3, 1, 4)[i]`` is ``x.select(2, i).permute(0, 2, 1, 3)``)."""
    dims, source = _permuted_dims(permute), permute.args[0]
    picked = dims[0]
    rest = [d - (d > picked) for d in dims[1:]]
    if rest[0] != 0:
        raise ValueError(f"a permute {dims} whose entries put the batch dimension elsewhere than first has no "
                         "description op")
    _network_tensor(source, alias, "permute")
    shape = [int(s) for s in source.meta["tensor_meta"].shape]
    attrs = {"dim": picked, "index": index % shape[picked]}
    kept = shape[1:picked] + shape[picked + 1:]
    if rest == sorted(rest):
        return [Node(n.name, "select", [alias[source.name]], attrs, kept)]
    select = Node(f"{n.name}__picked", "select", [alias[source.name]], attrs, kept)
    return [select, Node(n.name, "permute", [select.name], {"dims": rest}, _shape(n))]


def _split_piece(split: fx.Node, index: int, name: str, alias: dict[str, str]) -> Node:
    """Piece ``index`` of the chunk/split node ``split`` as a ``narrow`` node called ``name``."""
    meta = split.meta["tensor_meta"]
    dim = int(_arg(split, 2, "dim", 0))
    dim = dim if dim >= 0 else dim + len(meta[index].shape)
    start = sum(int(m.shape[dim]) for m in meta[:index])
    return Node(name, "narrow", [alias[split.args[0].name]],
                {"dim": dim, "start": start, "length": int(meta[index].shape[dim])}, list(meta[index].shape)[1:])


def _new_axes(n: fx.Node, source: fx.Node, index: tuple, alias: dict[str, str]) -> Node | None:
    """``x[:, :, None, None]``, ``x[..., None]``, ``x[:, None]`` (new axes of size 1, an SE block's gate broadcast
    over the map): torch's views of ``x`` unsqueezed, a reshape to the output's shape; a new axis before the batch's
    (``x[None]``) is a ``ValueError``. None for an index that also picks or slices."""
    if not all(i is None or i is Ellipsis or i == slice(None) for i in index) or source.name not in alias:
        return None
    if index[0] is None:
        raise ValueError("an index that puts a new axis before the batch (x[None]) has no description op (a "
                         "description keeps the batch first); index after it (x[:, None])")
    out = _shape(n)
    return None if out is None else Node(n.name, "reshape", [alias[source.name]], {"shape": out}, out)


def _index(n: fx.Node, source: fx.Node, index: tuple, shape: Any, alias: dict[str, str]) -> Node | None:
    """``x[:, ..., i]`` -> select, ``x[:, ..., a:b]`` -> narrow (one indexed dimension after the batch); a slice with
    a step of a network tensor is a ``ValueError``; new axes alone (``x[:, :, None]``): :func:`_new_axes`."""
    if any(i is None for i in index):
        return _new_axes(n, source, index, alias)
    if source.name in alias and any(isinstance(i, slice) and _shape_value(i.step) not in (None, 1) for i in index):
        raise ValueError("a slice with a step (x[..., ::2, ::2]: YOLOv5's Focus) has no description op; YOLOv5 "
                         "since v6.0 writes Focus as a 6x6 convolution of stride 2, which describes")
    picked = [(d, i) for d, i in enumerate(index) if i != slice(None)]
    out = _shape(n)
    if len(picked) != 1 or out is None or source.name not in alias:
        return None
    dim, i = picked[0]
    if dim == 0:  # the batch dimension is not part of a description
        return None
    if isinstance(i, slice):  # bounds computed from shapes (y[:, :x.shape[1]]): the numbers they are
        i = slice(*(_shape_value(b) for b in (i.start, i.stop, i.step)))
    if isinstance(i, int):
        return Node(n.name, "select", [alias[source.name]], {"dim": dim, "index": i % int(shape[dim])}, out)
    if isinstance(i, slice) and i.step in (None, 1):
        start, stop, _ = i.indices(int(shape[dim]))
        return Node(n.name, "narrow", [alias[source.name]], {"dim": dim, "start": start, "length": stop - start}, out)
    return None
