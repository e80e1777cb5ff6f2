"""Describe any traceable ``nn.Module`` as a network description (torch.fx + shape propagation).

The module is traced in eval mode, so stochastic layers (dropout, stochastic depth) trace as
plain calls; dropout is kept as a ``dropout`` node, stochastic depth becomes ``identity``.
Non-tensor values (``x.size()``, shape arithmetic) are dropped: reshapes are recorded with
their concrete output shape, so a description is tied to its input size. A module's own parameters
read outside its layers are taken in by the op that reads them: a layer norm's weight and bias, a
multiply by one (``scale``), an add of one (``shift``), one put first by a concatenation (``token``).

This module is the entry point (:func:`describe`) and the conversion of each fx node; the tracer is in
:mod:`~perf4sight.ir.torch_trace`, what a layer or a call describes as in :mod:`~perf4sight.ir.torch_modules` and
:mod:`~perf4sight.ir.torch_calls`, the patterns of several nodes in :mod:`~perf4sight.ir.torch_patterns`, the
checks on a traced graph in :mod:`~perf4sight.ir.torch_checks`.
"""
from __future__ import annotations

import contextlib
import copy
import operator
import random
from typing import Any, Iterator

import numpy as np
import torch
import torch.fx as fx
import torch.nn.functional as F
from torch import nn

from perf4sight.errors import UserError
from perf4sight.ir.schema import (FROZEN_LAYERS, FROZEN_PARAMETERS, ON_COPY_OPS, PIECE_CALL, SHARES,
                                  NetworkDescription, Node, count_params, node_params, split_group, unbind_group)
from perf4sight.ir.shapes import image_size_problem
from perf4sight.ir.to_torch import build_module
from perf4sight.ir.weighted_sums import Fusion, weighted_sums
from perf4sight.ir.fx_values import _SPLITS, _TRACE_BATCH, _arg, _is_tensor, _shape, _shape_value, _target_name
from perf4sight.ir.coordinates import coordinate_channels
from perf4sight.ir.standardised import STANDARDIZE_GAIN, STANDARDIZES, standardised_weights
from perf4sight.ir.torch_trace import (_ForwardFailed, _propagate_shapes, _root_message, _trace, _trace_stop,
                                       forward_error, in_mode, run_on_meta, stderr_kept_on_success)
from perf4sight.ir.torch_calls import (_MASKED_FILLS, _PARAMETER_CALLS, _NoOp, _mask_multiplied, _op_of,
                                       _position_bias_mlp)
from perf4sight.ir.torch_patterns import (_getitem, _max_part, _moves_the_batch_for_picks, _padded_first,
                                          _picked_after_a_moved_batch, _pool_part, _sorted_part, _split_piece,
                                          _stacked_piece_made, _with_size_reference)
from perf4sight.ir.torch_checks import (COMPUTED_MASKS, _check_float32, _follow_in_place, _mark_shared_calls,
                                        _fold_module_tensor_casts, _refuse_computed_weights, _refuse_deformable,
                                        _refuse_gradient_hooks, _refuse_other_inputs, _refuse_parametrized_weights,
                                        _refuse_value_changing_hooks, _refuse_writes_through_views, _shared_layers,
                                        _training_only_layers, _unread_params, _writes_a_copy, computed_masks)

__all__ = ["describe", "described_with_calls", "check_input_shape", "forward_error", "has_lazy_parameters", "in_mode",
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


def _mark_frozen_layers(module: nn.Module, gm: fx.GraphModule, nodes: list[Node]) -> None:
    """Give the node of each batch norm layer that ``module``, in training, holds in evaluation (``bn.eval()`` inside a
    training model: a batch norm frozen for fine-tuning), and that has running statistics, the attr ``training``
    false: it normalises by them in the training step, which a node without the attr (rebuilt following the step's
    mode) would not. Its calls are the layer's (a leaf of the trace) or, a subclass traced through, the
    ``F.batch_norm`` calls of its running mean. A module in evaluation as a whole marks none (the step trains it)."""
    if not module.training:
        return
    frozen = {name for name, m in module.named_modules() if isinstance(m, nn.modules.batchnorm._BatchNorm)
              and not m.training and m.track_running_stats and m.running_mean is not None}
    if not frozen:
        return
    calls = {n.name for n in gm.graph.nodes if n.op == "call_module" and n.target in frozen}
    calls |= {n.name for (function, mean), made in _norm_calls(gm.graph).items()
              if function is F.batch_norm and mean.rpartition(".")[0] in frozen for n in made}
    for node in nodes:
        if node.name in calls and node.op == "batchnorm2d" and "training" not in node.attrs:
            node.attrs = {**node.attrs, "training": False}


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
    _fold_module_tensor_casts(gm)
    _refuse_parametrized_weights(module, gm, name)
    _refuse_computed_weights(gm, name)
    _shared_layers(gm, name)
    _check_float32(gm, name)
    _follow_in_place(gm)
    masks = computed_masks(gm)
    try:
        gm = _propagate_shapes(gm, input_shape)
    except UserError:
        raise
    except Exception as exc:
        raise forward_error(name, input_shape, exc) from None
    _refuse_value_changing_hooks(module, gm, name)
    _refuse_gradient_hooks(module, gm, name)
    gm.meta[COMPUTED_MASKS] = masks
    _refuse_writes_through_views(gm, name)
    return gm


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
    copy (the caller's stays lazy). torch's and Python's random states are left as they were
    (:func:`_random_state_kept`).

    Raises ``UserError`` for an input shape that is not three positive ints, a model wrapped by torch.compile or
    DataParallel, a module torch.fx cannot trace, a forward that reads weights other than float32 or fails at
    ``input_shape`` (naming the shape and torch's message), and naming the first op or module the schema cannot
    express.
    """
    input_shape = _describable(module, input_shape, name, network)
    with _random_state_kept():
        if has_lazy_parameters(module):  # the first forward makes them, drawing random numbers: on a copy
            return _described(_lazy_copy(module), input_shape, name, network, pruning_level, extra)
        return _described(module, input_shape, name, network, pruning_level, extra)


def _describable(module: nn.Module, input_shape: list[int], name: str, network: str | None) -> list[int]:
    """``input_shape`` checked, once :func:`describe`'s checks of its arguments pass (``UserError`` else)."""
    for key, value in (("name", name), ("network", network)):  # written into the description as they are
        if not isinstance(value, str) and (key == "name" or value is not None):
            raise UserError(f"describe: {key} {value!r} ({type(value).__name__}) is not a str")
    if not isinstance(module, nn.Module):
        raise UserError(f"{name}: expected a torch nn.Module instance (e.g. torchvision.models.resnet18()), "
                        f"got {type(module).__name__}")
    wrapped = _WRAPPERS.get(type(module).__name__)
    if wrapped is not None and isinstance(getattr(module, wrapped[1], None), nn.Module):
        raise UserError(f"{name}: the model is wrapped by {wrapped[0]} ({type(module).__name__}); a description is of "
                        f"the model itself, its eager training step on one device: give its .{wrapped[1]}")
    input_shape = check_input_shape(input_shape, name)
    _refuse_graph_module_names(module, name)
    return input_shape


@contextlib.contextmanager
def _random_state_kept() -> Iterator[None]:
    """torch's random state (the CPU's, and each CUDA device's where CUDA is started) and Python's ``random``'s
    put back as they were after the block: describing draws none of the numbers of the caller's seeded training
    (a lazy layer made, a model's forward run for real where its shapes cannot be propagated without data, its
    dropout in training, a forward that draws a branch by ``random``)."""
    devices = list(range(torch.cuda.device_count())) if torch.cuda.is_initialized() else []
    kept = random.getstate()
    try:
        with torch.random.fork_rng(devices=devices):
            yield
    finally:
        random.setstate(kept)


#: Attributes torch.fx's GraphModule has and nn.Module has not: a model's own layer, parameter or buffer of one of
#: these names (a VQ codebook's ``self.code``) cannot be copied onto the traced GraphModule, whose property it is.
_GRAPH_MODULE_NAMES = frozenset(n for n in set(dir(fx.GraphModule)) - set(dir(nn.Module)) if not n.startswith("__"))


def _refuse_graph_module_names(module: nn.Module, name: str) -> None:
    """``UserError`` naming the model's own layer, parameter or buffer whose name torch.fx's GraphModule takes (the
    trace failed with "`code` is not an nn.Module", a traceback, or "Code has not been generated!")."""
    own = [*module._modules, *module._parameters, *module._buffers]
    clash = next((attr for attr in own if attr in _GRAPH_MODULE_NAMES), None)
    if clash is not None:
        raise UserError(f"{name}: the model's attribute '{clash}' has the name of torch.fx's GraphModule.{clash}, "
                        "which the trace cannot copy it onto; rename it (or hold the model in a container module)")


def described_with_calls(module: nn.Module, input_shape: list[int], name: str) -> tuple[NetworkDescription,
                                                                                       dict[str, str]]:
    """:func:`describe`'s description of ``module`` (without lazy layers: ``UserError``), and the layer each node that
    calls one of the module's layers calls, by the node's name (``{"layer1_0_conv1": "layer1.0.conv1"}``: the trace's
    calls; a node of a name that is not there calls none)."""
    input_shape = _describable(module, input_shape, name, None)
    if has_lazy_parameters(module):
        raise UserError(f"{name}: described with its calls without lazy layers")
    calls: dict[str, str] = {}
    with _random_state_kept():
        return _described(module, input_shape, name, None, 0, {}, calls), calls


def _described(module: nn.Module, input_shape: list[int], name: str, network: str | None, pruning_level: float,
               extra: dict[str, Any], calls: dict[str, str] | None = None) -> NetworkDescription:
    """:func:`describe`'s description of ``module`` (checked), its parameters made; ``calls``, where given, gets
    the layer each fx node calls (:func:`described_with_calls`)."""
    with in_mode(module, training=False):
        gm = _traced_with_shapes(module, input_shape, name)
    if calls is not None:
        calls.update((n.name, str(n.target)) for n in gm.graph.nodes if n.op == "call_module")
    nodes, output = _convert(gm, name)
    _mark_cumulative_averages(module, gm, nodes)
    _mark_constant_modes(module, gm, nodes, input_shape)
    _mark_frozen_layers(module, gm, nodes)
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
        in_training = _training_only_layers(module, gm.graph, input_shape)
        if in_training:
            raise UserError(f"{name}: its forward calls {', '.join(in_training[:3])}"
                            f"{' ...' if len(in_training) > 3 else ''} in training only (an `if self.training` "
                            "branch); a description follows the forward of evaluation: build the model without its "
                            "training-only layers (e.g. aux_logits=False)")
        desc.extra["unused_params"] = unused
    frozen = sum(p.numel() for p in module.parameters() if not p.requires_grad)
    if frozen:  # counted and named: the rebuilt module, the profile's step and the prediction leave them untrained
        desc.extra["frozen_params"] = frozen
        layers = _frozen_layers(module, gm, desc)
        if layers:  # which: to_torch freezes them again (a pruned level of a rebuilt description keeps them frozen)
            desc.extra[FROZEN_LAYERS] = layers
        parameters = _frozen_parameters(module, gm, desc, layers)
        if parameters:  # the others: a layer's weight frozen, its bias not; a frozen parameter a function call reads
            desc.extra[FROZEN_PARAMETERS] = parameters
            unknown: list[str] = []  # those of a layer rebuilt under other names (left out: frozen_params counts them)
            build_module(desc, device="meta", unknown_frozen=unknown)
            if unknown:
                desc.extra[FROZEN_PARAMETERS] = [p for p in parameters if p not in unknown]
                if not desc.extra[FROZEN_PARAMETERS]:
                    del desc.extra[FROZEN_PARAMETERS]
    return desc


def _frozen_layers(module: nn.Module, gm: fx.GraphModule, desc: NetworkDescription) -> list[str]:
    """The nodes of ``desc`` that call a layer of ``module`` whose parameters are all frozen (``requires_grad``
    False), in the description's order; a layer partly frozen, or a frozen weight read by a function, is not one."""
    modules = dict(module.named_modules())
    windowed = {n.name for n in desc.nodes if n.op == "window_attention"}
    frozen = set()
    for n in gm.graph.nodes:
        params = list(modules[n.target].parameters()) if n.op == "call_module" and n.target in modules else []
        if n.name in windowed:  # torchvision's shifted_window_attention, a function its layer calls with its tensors
            params = list(_calling_layer(module, n).parameters())
        if params and not any(p.requires_grad for p in params):
            frozen.add(n.name)
    return [n.name for n in desc.nodes if n.name in frozen and node_params(n)]


def _calling_layer(module: nn.Module, n: fx.Node) -> nn.Module:
    """The innermost layer of ``module`` whose forward made the call ``n`` (the trace's module stack; ``module``
    itself where the stack is empty)."""
    stack = n.meta.get("nn_module_stack") or {}
    if not stack:
        return module
    key, value = list(stack.items())[-1]
    path = value[0] if isinstance(value, tuple) else key
    try:
        return module.get_submodule(path)
    except AttributeError:
        return module


def _frozen_parameters(module: nn.Module, gm: fx.GraphModule, desc: NetworkDescription, layers: list[str]
                       ) -> list[str]:
    """The frozen parameters (``requires_grad`` False) of ``desc``'s nodes other than ``layers`` (those frozen
    whole), each named ``node.name`` as the layer to_torch rebuilds of the node calls it: a partly frozen layer's
    (``conv.weight`` frozen, its bias trained: its own name, ``weight``), and one a function call reads (``x *
    self.g``, ``F.conv2d(x, self.w, self.b)``: the argument's name, ``weight`` or ``bias``; a scale's, shift's or
    token's one tensor ``weight``). A call of a layer called before names the first call's node (``shares``)."""
    modules = dict(module.named_modules())
    named = {n.name: n for n in desc.nodes}
    frozen: set[str] = set()
    for n in gm.graph.nodes:
        node = named.get(n.name)
        if node is None or n.name in layers:
            continue
        owner = node.attrs.get(SHARES, node.name)
        if n.op == "call_module" and n.target in modules:
            layer = modules[n.target]  # torch's attention rebuilt inside a layer of ours (to_torch.SelfAttention)
            inner = "attention." if node.op == "attention" and isinstance(layer, nn.MultiheadAttention) else ""
            frozen.update(f"{owner}.{inner}{name}" for name, p in layer.named_parameters() if not p.requires_grad)
        elif n.op in ("call_function", "call_method"):
            for role, a in _parameter_roles(n, node.op):
                if a.op == "get_attr" and _is_parameter(gm, a.target) and not gm.get_parameter(a.target).requires_grad:
                    frozen.add(f"{owner}.{role}")
    return [f"{n.name}.{rest}" for n in desc.nodes for rest in sorted(f[len(n.name) + 1:] for f in frozen
                                                                      if f.startswith(n.name + "."))
            if node_params(n)]


#: The description op of a function call -> (position, name) of the arguments that are its layer's parameters, as
#: torch's functions take them (F.conv2d(x, weight, bias), F.layer_norm(x, shape, weight, bias), ...).
_PARAMETER_ARGS = {"conv2d": ((1, "weight"), (2, "bias")), "conv_transpose2d": ((1, "weight"), (2, "bias")),
                   "linear": ((1, "weight"), (2, "bias")), "layernorm": ((2, "weight"), (3, "bias")),
                   "groupnorm": ((2, "weight"), (3, "bias")), "rmsnorm": ((2, "weight"),),
                   "batchnorm2d": ((3, "weight"), (4, "bias")), "instancenorm": ((3, "weight"), (4, "bias")),
                   "prelu": ((1, "weight"),)}
#: Calls through which a parameter is read as itself (its view, its expansion over the batch: a class token's).
_READ_THROUGH = {*_VIEWS, "expand", "expand_as", "repeat", "tile", torch.tile, "contiguous"}


def _parameter_roles(n: fx.Node, op: str) -> list[tuple[str, fx.Node]]:
    """The module tensors (``get_attr`` nodes, or one read through a view or an expansion) a function call ``n`` of
    the description op ``op`` reads, each with the name of its parameter in the layer to_torch rebuilds of ``op``:
    torch's argument name (``weight``, ``bias``); a scale's, shift's or token's one tensor ``weight``."""
    def held(a: Any) -> fx.Node | None:
        while isinstance(a, fx.Node) and a.op in ("call_method", "call_function") and a.target in _READ_THROUGH:
            a = a.args[0] if a.args else None
        return a if isinstance(a, fx.Node) and a.op == "get_attr" else None

    if op in ("scale", "shift", "token"):
        return [("weight", h) for h in (held(a) for a in n.all_input_nodes) if h is not None]
    roles = [(name, h) for name, h in ((name, held(_arg(n, i, name))) for i, name in _PARAMETER_ARGS.get(op, ()))
             if h is not None]
    weight = _arg(n, 1, "weight")
    if op == "conv2d" and isinstance(weight, fx.Node) and STANDARDIZES in weight.meta:  # standardised: its
        roles.append(("weight", weight.meta[STANDARDIZES]))  # parameter, and ScaledStdConv2d's gain
        roles += [("gain", n.meta[STANDARDIZE_GAIN])] if STANDARDIZE_GAIN in n.meta else []
    return roles


def _convert(gm: fx.GraphModule, where: str) -> tuple[list[Node], str]:
    nodes: list[Node] = []
    alias: dict[str, str] = {}  # fx node name -> description node name that holds its value
    pieces: dict[str, list[str]] = {}  # chunk/split node used whole (torch.cat(x.chunk(2, 1))) -> its narrow nodes
    held: dict[str, fx.Node] = {}  # get_attr node, or a batch expansion of one -> that get_attr node
    held.update(_computed_position_biases(gm, where))
    held.update(standardised_weights(gm))  # a standardised weight's nodes: taken in by its conv2d
    coordinates, coordinate_parts = coordinate_channels(gm)  # CoordConv's: a linspace node each
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
            if n.name in coordinate_parts:  # a coordinate channel's linspace and view: its expand's node
                continue
            if n.name in coordinates and coordinates[n.name][0].name in alias:
                converted = [Node(n.name, "linspace", [alias[coordinates[n.name][0].name]], coordinates[n.name][1],
                                  _shape(n))]
                alias[n.name] = n.name
            elif n.name in fused:
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
    _name_repeated_calls(nodes)
    return nodes, output


def _name_repeated_calls(nodes: list[Node]) -> None:
    """Number the calls of a split or unbind that take one tensor apart alike (``a = y.unbind(1); b = y.unbind(1)``:
    torch runs two, each backward its own stack) in the order of their first pieces: a piece's ``call``
    (schema.PIECE_CALL), made the fx call's name, becomes its call's number, 1 for the second call of its key and
    on; a piece of the first goes without, as before the attr was."""
    calls: dict[tuple, list[str]] = {}
    for node in (n for n in nodes if PIECE_CALL in n.attrs):
        name = node.attrs[PIECE_CALL]
        node.attrs = {k: v for k, v in node.attrs.items() if k != PIECE_CALL}
        seen = calls.setdefault((node.op, *(split_group(node) or unbind_group(node) or ())), [])
        if name not in seen:
            seen.append(name)
        if seen.index(name):
            node.attrs = {**node.attrs, PIECE_CALL: seen.index(name)}


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
        stacked = _stacked_piece_made(n, alias)
        if stacked is not None:  # a piece a stack of the pieces read before: one tensor, one node
            alias[n.name] = stacked
            return []
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
    if op == "where" and n.target == "where" and "mask_shape" not in attrs:  # x.where(c, y): the condition's first
        tensor_inputs = [tensor_inputs[1], tensor_inputs[0], *tensor_inputs[2:]]
    if op == "where" and attrs.get("multiply"):  # x * (x > 0): the compared tensor(s), then the one multiplied
        _, other, compared = _mask_multiplied(n)
        tensor_inputs = _tensor_inputs(compared, alias, pieces, where, own) + \
            [tensor_inputs[0 if n.args[0] is other else -1]]
    elif op == "where" and attrs.get("compare_inputs"):  # a condition of two tensors (a > b): both, then the branches
        condition = n.args[1] if n.target in (*_MASKED_FILLS, "where") else n.args[0]
        tensor_inputs = _tensor_inputs(condition, alias, pieces, where, own) + tensor_inputs[1:]
    meta = n.meta.get("tensor_meta")
    batch = meta.shape[0] if op != "attention" and hasattr(meta, "shape") and len(meta.shape) else _TRACE_BATCH
    if batch != _TRACE_BATCH:  # traced at batch 2: a description's node keeps the batch as it is
        if op == "reshape":
            raise UserError(f"{where}: {n.name} reshapes the batch of {_TRACE_BATCH} images it was traced with into "
                            f"a first dimension of {batch}: it merges the batch into another dimension, or fixes its "
                            "size (x.view(7, -1)), or folds groups of channels into the batch (shuffle attention's "
                            "x.reshape(b * groups, -1, h, w)); a description keeps the batch first and whole")
        raise UserError(f"{where}: {op} (node {n.name}) makes a first dimension of {batch} of the batch of "
                        f"{_TRACE_BATCH} images it was traced with: it works along the batch dimension (dim 0), which "
                        "a description keeps first and whole")
    first = _padded_first(n, gm, tensor_inputs)
    if first is not None:
        out, tensor_inputs = out + [first], [first.name]
    attrs = _with_size_reference(n, op, attrs, alias)
    alias[n.name] = n.name
    return out + [Node(n.name, op, tensor_inputs, attrs, shape)]


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
    taken in: a multiply by one parameter is a ``scale`` of that parameter's shape, an add of one a ``shift`` (of a
    buffer, a ``shift`` of ``fixed``: a fixed position code), a concatenation that puts one first a ``token``, a
    convolution by a buffer (a blur pool's filter) a ``conv2d`` of ``fixed``; a layer, group or instance norm reads
    its own weight and bias, a PReLU its slopes, a batch norm call its weight, bias and running statistics (an
    instance norm call's running statistics too, where it tracks them); a random generator read is left out
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
    if op == "alias" and n.target == "type_as" and all(a is n.args[1] for a in own):  # x.type_as(self.weight): its
        return op, attrs, {a.name for a in own}                                      # dtype alone read
    if op == "where" and "mask_shape" in attrs and len(own) == 1:  # its fixed mask (a buffer): the where's own
        return op, attrs, {own[0].name}
    if op == "batchnorm2d":  # F.batch_norm's running statistics (buffers), weight and bias: the call's own
        _batch_norm_affine_trained(n, gm, where)
        return op, attrs, {a.name for a in own}
    running: set[str] = set()
    if op == "instancenorm" and attrs.get("track_running_stats"):  # F.instance_norm's running statistics: buffers
        running = {a.name for a in (_arg(n, 1, "running_mean"), _arg(n, 2, "running_var")) if isinstance(a, fx.Node)}
    if op == "add" and len(own) == 1 and len(n.args) == 2 and own[0].op == "get_attr" and \
            not _is_parameter(gm, held[own[0].name].target):  # a buffer added: a fixed shift (a position code)
        shape = _per_sample(held[own[0].name].meta["tensor_meta"].shape, len(_shape(n) or []))
        return "shift", {"shape": shape, "fixed": True}, {own[0].name}
    if op == "conv2d" and own[0] is _arg(n, 1, "weight") and own[0].op == "get_attr" and \
            not _is_parameter(gm, held[own[0].name].target):  # a filter held as a buffer (a blur pool's): fixed
        if attrs["bias"]:
            raise UserError(f"{where}: the convolution {n.name} filters by {held[own[0].name].target}, a buffer, "
                            "and adds a bias: a fixed filter with a bias has no description op (one without, a "
                            "blur pool's, has: a conv2d of fixed)")
        return op, {**attrs, "fixed": True}, {own[0].name}
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
    if op in ("layernorm", "groupnorm", "conv2d", "conv_transpose2d", "linear", "instancenorm", "prelu",
              "rmsnorm"):
        return op, attrs, names
    _refuse_parameters_alone(n, held, where)
    raise UserError(f"{where}: {op} (node {n.name}) reads the module's parameter {held[own[0].name].target} "
                    "directly, which the description has no op for (a multiply by one parameter is a 'scale', an "
                    "add of one a 'shift', one concatenated first a 'token')")


def _is_parameter(gm: fx.GraphModule, target: str) -> bool:
    """Whether the module tensor at ``target`` is a parameter (not a buffer)."""
    try:
        gm.get_parameter(target)
    except AttributeError:
        return False
    return True


def _refuse_parameters_alone(n: fx.Node, held: dict[str, fx.Node], where: str) -> None:
    """A ``UserError`` naming the parameter where ``n`` computes from module tensors alone (weights in a form other
    than BiFPN's fusion, :mod:`perf4sight.ir.weighted_sums`), whose refusal would otherwise speak of ops or dimensions
    of the network's tensors (a softmax of a ``[2]`` parameter read as one over the batch). Weights whose products
    are stacked (effdet's FpnCombine) are named as such."""
    inputs = n.all_input_nodes
    if not inputs or any(a.name not in held for a in inputs):
        return
    kind = _target_name(n.target)
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
