"""Checks on a traced graph that refuse what a description cannot say, or mark what it shares: in-place writes
followed (and through views refused), tied weights, a forward of several inputs, a deformable convolution, a layer's
weight computed in the forward (or by a parametrization, or torch's reparametrising hooks), a hook torch.fx drops that
returns a value, weights other than float32, layers called in training only, parameters no layer reads, and later
reads of a layer's or a parameter's tensors (``shares``)."""
from __future__ import annotations

import collections
import inspect
import operator
from typing import Any

import torch
import torch.fx as fx
import torch.nn.functional as F
from torch import nn
from torch.nn.utils import parametrizations, parametrize, prune
from torch.nn.utils.spectral_norm import SpectralNorm
from torch.nn.utils.weight_norm import WeightNorm

from perf4sight.errors import UserError
from perf4sight.ir.schema import ONE_TENSOR_OPS, PARAMETER_OPS, SHARES, Node
from perf4sight.ir.fx_values import _target_name
from perf4sight.ir.standardised import STANDARDIZE_ATTRS, standardised_weights
from perf4sight.ir.torch_trace import _trace, in_mode
from perf4sight.ir.torch_calls import _RESHAPES, _op_of
from perf4sight.ir.torch_modules import spectral_norm_form, weight_norm_form


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


#: Methods that return their tensor as it is where it is a float32 module tensor on the device that trains it:
#: research code's ``self.weight.to(x.dtype)``, ``.type_as(x)``, ``.to(x.device)``, ``.contiguous()``, ``.float()``.
_NO_OP_CASTS = frozenset({"to", "type_as", "contiguous", "float"})


def _fold_module_tensor_casts(gm: fx.GraphModule) -> None:
    """Read a module's float32 tensor where the forward casts it to what it already is (``F.conv2d(x,
    self.weight.to(x.dtype))``: a float32 model on one device, as a description is, runs no kernel for it), so that
    the layer reads its parameter as it is; such a weight was refused as one computed in the forward (a cast to
    another dtype, a copy or another memory format is not folded, and is refused as before)."""
    folded = False
    for n in list(gm.graph.nodes):
        if n.op != "call_method" or n.target not in _NO_OP_CASTS or not n.args:
            continue
        source = n.args[0]
        if not (isinstance(source, fx.Node) and source.op == "get_attr" and _no_op_cast(n, gm)):
            continue
        for reader in list(n.users):
            reader.replace_input_with(n, source)
        told = [a for a in n.all_input_nodes if a is not source]  # x.dtype's node: read by the cast alone
        gm.graph.erase_node(n)
        for a in told:
            if not a.users and a.op == "call_function" and a.target is getattr:
                gm.graph.erase_node(a)
        folded = True
    if folded:
        gm.recompile()


def _no_op_cast(n: fx.Node, gm: fx.GraphModule) -> bool:
    """Whether ``n`` (a method of :data:`_NO_OP_CASTS` on a module tensor) returns the tensor as it is: the tensor
    float32 (and contiguous for ``contiguous``), cast to float32, to another float32 tensor's type, or to a device
    (the one training it), with no copy, memory format or other keyword asked for."""
    try:
        t = gm.get_parameter(n.args[0].target) if n.args[0].target in dict(gm.named_parameters()) \
            else gm.get_buffer(n.args[0].target)
    except AttributeError:
        return False
    if not isinstance(t, torch.Tensor) or t.dtype != torch.float32 or set(n.kwargs) - {"dtype", "device",
                                                                                         "non_blocking"}:
        return False
    if n.target in ("contiguous", "float"):
        return len(n.args) == 1 and not n.kwargs and (n.target == "float" or t.is_contiguous())
    told = [*n.args[1:], *(v for k, v in n.kwargs.items() if k != "non_blocking")]
    return bool(told) and all(_float32_or_device(a, gm) for a in told) and (n.target == "to" or len(n.args) == 2)


def _float32_or_device(a: Any, gm: fx.GraphModule) -> bool:
    """Whether a cast's argument ``a`` names float32, a device, or the dtype, device or type of a tensor of the
    forward (float32, as a description's input and tensors are: ``x.dtype``, ``x.device``, ``x``; a module tensor
    read there is asked its dtype)."""
    if a is torch.float32 or isinstance(a, torch.device) or (isinstance(a, str) and a.split(":")[0] in
                                                               ("cpu", "cuda", "meta")):
        return True
    if not isinstance(a, fx.Node):
        return False
    if a.op == "call_function" and a.target is getattr and len(a.args) == 2:
        return a.args[1] == "device" or (a.args[1] == "dtype" and _float32_or_device(a.args[0], gm))
    if a.op == "get_attr":
        t = getattr(gm.get_submodule(a.target.rpartition(".")[0]), a.target.rpartition(".")[2], None)
        return isinstance(t, torch.Tensor) and t.dtype == torch.float32
    return True  # a tensor of the forward (``type_as(x)``): float32, or its own cast is refused where it is made


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
                label = _target_name(n.target)
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


def _training_only_layers(module: nn.Module, eval_graph: fx.Graph, input_shape: list[int]) -> list[str]:
    """The layers with weights that ``module``'s forward calls in training only (an auxiliary head under ``if
    self.training``), which a description of its eval-mode forward leaves out; [] where the training-mode forward
    cannot be traced. Traced as the description is (:func:`_trace` at ``input_shape``: a tensor's dtype read, a loop
    over a chunk's pieces), the module's buffers put back after (a value the trace is told by running the forward up
    to it ran that forward's updates of them in training)."""
    kept = [(b, b.detach().clone()) for b in module.buffers() if not nn.parameter.is_lazy(b)]
    try:
        with in_mode(module, training=True):
            graph = _trace(module, input_shape)
    except Exception:  # a forward torch.fx cannot follow in training: nothing to compare
        return []
    finally:
        with torch.no_grad():
            for b, value in kept:
                b.copy_(value)
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
    the forward reads (a parametrized layer's ``parametrizations.weight.original`` read by the layer's call), not
    against the description's count."""
    read = {id(t) for _, t in _read_tensors(module, graph)}
    return sum(p.numel() for p in module.parameters() if id(p) not in read)


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


#: Calls of a layer's weight given as an argument (``F.conv2d(x, weight, ...)``): the op named in a refusal.
_WEIGHTED_CALLS = {F.conv1d: "convolution", F.conv2d: "convolution", F.conv3d: "convolution",
                   F.conv_transpose1d: "convolution", F.conv_transpose2d: "convolution",
                   F.conv_transpose3d: "convolution", F.linear: "linear layer"}


#: What a refusal of a convolution's computed weight adds: the spellings of weight standardisation that describe.
_STANDARDISED_SAID = (" (weight standardisation describes written as timm's StdConv2d, F.batch_norm(w.reshape(1, out, "
                      "-1), None, None, training=True, eps=eps).reshape_as(w) (NFNets' ScaledStdConv2d with "
                      "weight=(gain * scale).view(-1)), or as (w - w.mean((1, 2, 3), "
                      "keepdim=True)) over (w.std(...) + eps), (w.var(...) + eps).sqrt(), torch.var_mean's or "
                      "torch.std_mean's, or F.layer_norm(w, w.shape[1:]), or as "
                      "mmcv's ConvWS2d, the mean and std of w.view(out, -1)'s rows)")


def _refuse_computed_weights(gm: fx.GraphModule, where: str) -> None:
    """A ``UserError`` naming the form where a ``F.conv2d`` (or another call of :data:`_WEIGHTED_CALLS`) takes a
    weight the description cannot hold, before the ops computing it are named in its place (a matmul of a module's
    tensor, weights from a parameter alone read as BiFPN's): kernels mixed per sample from the input (CondConv's
    experts), or a weight computed from a parameter alone (weight standardisation)."""
    standardised_weights(gm)  # a conv2d's weight standardised as BiT's or timm's StdConv2d: a conv2d's attr
    for n in gm.graph.nodes:
        if n.op != "call_function" or n.target not in _WEIGHTED_CALLS or STANDARDIZE_ATTRS in n.meta:
            continue
        weight = n.args[1] if len(n.args) > 1 else n.kwargs.get("weight")
        if not isinstance(weight, fx.Node):
            continue
        layer = f"the {_WEIGHTED_CALLS[n.target]} {n.name}"
        if weight.op == "get_attr":  # a parameter, or a buffer (a blur pool's filter: a conv2d of fixed)
            continue
        sources = _sources(weight)
        params = dict(gm.named_parameters())
        held = [s.target for s in sources if s.op == "get_attr" and s.target in params]
        if any(s.op == "placeholder" for s in sources):
            of = f" and the parameter {held[0]}" if held else ""
            if n.target is F.linear:
                raise UserError(f"{where}: {layer}'s weight is computed from the input{of} (a hypernetwork's, a "
                                "dynamic layer's): the description has no op for it, which holds one weight for every "
                                "sample")
            raise UserError(f"{where}: {layer}'s weight is computed from the input{of}: kernels mixed per sample "
                            "(CondConv's experts, a dynamic convolution) have no description op, which holds one "
                            "weight for every sample; write it as each expert's convolution scaled by its routing "
                            "weight and summed (r[:, i].view(-1, 1, 1, 1) * conv_i(x))")
        if held:
            raise UserError(f"{where}: {layer}'s weight is computed in the forward from the parameter {held[0]} "
                            "(weight standardisation, a weight normalised or reparametrised): the description has "
                            f"no op for it, which trains a {_WEIGHTED_CALLS[n.target]}'s weight as it is"
                            f"{_STANDARDISED_SAID if n.target is F.conv2d else ''}")


#: torch's parametrizations (``torch.nn.utils.parametrizations``) and old reparametrising hooks (a forward pre-hook
#: that computes the weight from parameters of their own) by class -> the form named in a refusal
_TORCH_PARAMETRIZATIONS = {
    parametrizations._WeightNorm: "weight_norm (torch.nn.utils.parametrizations.weight_norm; of dim 0 alone, on an "
                                  "nn.Conv2d, nn.Conv1d or nn.Linear called as the layer, it describes)",
    parametrizations._SpectralNorm: "spectral_norm (torch.nn.utils.parametrizations.spectral_norm, a power iteration "
                                    "at every training step; of dim 0 alone, on an nn.Conv2d, nn.Conv1d or nn.Linear "
                                    "called as the layer, it describes)",
    parametrizations._Orthogonal: "orthogonal (torch.nn.utils.parametrizations.orthogonal)"}
_REPARAMETRISING_HOOKS = {WeightNorm: "torch.nn.utils.weight_norm's hook (from {0}_g and {0}_v; of dim 0 alone, on an "
                                      "nn.Conv2d, nn.Conv1d or nn.Linear called as the layer, it describes)",
                          SpectralNorm: "torch.nn.utils.spectral_norm's hook (from {0}_orig, a power iteration at "
                                        "every training step; of dim 0 alone, on an nn.Conv2d, nn.Conv1d or "
                                        "nn.Linear called as the layer, it describes)",
                          prune.BasePruningMethod: "torch.nn.utils.prune's hook ({0}_orig times the mask {0}_mask; "
                                                   "prune.remove(layer, '{0}') makes it the plain layer)"}


def _refuse_parametrized_weights(root: nn.Module, gm: fx.GraphModule, where: str) -> None:
    """A ``UserError`` naming the form where a layer of ``root`` that the forward calls (or whose tensor it reads:
    ``gm``, its trace) has a tensor computed from parameters at every forward by a parametrization
    (``torch.nn.utils.parametrize.register_parametrization``: weight standardisation, torch's
    ``parametrizations.weight_norm``, ``spectral_norm``, ``orthogonal``) or by torch's old reparametrising hooks
    (``torch.nn.utils.weight_norm``, ``spectral_norm``, ``prune``'s masks). The trace keeps torch's layer whole and
    sees neither (a plain layer was described, the weight's computation, its backward and kept tensors left out). A
    parametrization that returns its input (the identity) computes nothing, and is described as the layer; an
    ``nn.Conv2d``'s, ``nn.Conv1d``'s or ``nn.Linear``'s weight_norm over dim 0 (either form), called as the layer,
    is its attr ``weight_norm`` (torch_modules.weight_norm_form)."""
    called = {n.target for n in gm.graph.nodes if n.op == "call_module"}
    read = {n.target.rpartition(".")[0] for n in gm.graph.nodes if n.op == "get_attr"}
    for owner in sorted(called | read):
        try:
            m = root.get_submodule(owner)
        except AttributeError:  # a tensor of the trace's own (a constant it made)
            continue
        if owner in called - read and (weight_norm_form(m) or spectral_norm_form(m)):  # a layer's attr (dim 0)
            continue
        tensors = list(m.parametrizations.items()) if parametrize.is_parametrized(m) else []
        if isinstance(m, parametrize.ParametrizationList):  # self.conv.weight read by a traced-through forward
            head, _, tensor = owner.rpartition(".")  # owner.parametrizations.tensor, or parametrizations.tensor
            owner = head[:-len("parametrizations")].rstrip(".")
            m, tensors = root.get_submodule(owner), [(tensor, m)]
        layer = f"layer '{owner}' ({_class_name(m)})" if owner else f"the model ({_class_name(m)})"
        # a weight_norm or spectral_norm of the weight over dim 0, which describes alone, named after the rest (a
        # bias's): the refusal names what stops the layer describing
        tensors.sort(key=lambda tc: _describes_alone(tc[0], list(tc[1])))
        for tensor, chain in tensors:
            forms = [_parametrization_form(p) for p in chain if not _is_identity(p)]
            if forms:
                raise UserError(f"{where}: {layer} has its {tensor} parametrized by {' then '.join(forms)}: computed "
                                "from its parameters at every forward, with a backward and tensors kept of its own, "
                                "which the description has no op for (it would count the plain layer alone)")
        for hook in sorted(m._forward_pre_hooks.values(), key=lambda h: _describes_alone(getattr(h, "name", ""), [h])):
            form = next((f for cls, f in _REPARAMETRISING_HOOKS.items() if isinstance(hook, cls)), None)
            if form is not None:
                tensor = getattr(hook, "name", None) or hook._tensor_name  # (torch.nn.utils.prune's name for it)
                raise UserError(f"{where}: {layer} has its {tensor} computed by {form.format(tensor)} at every "
                                "forward, with a backward and tensors kept of its own, which the description has no "
                                "op for (it would count the plain layer alone)")


def _describes_alone(tensor: str, how: list) -> bool:
    """Whether ``how`` (a tensor's parametrizations, or its one reparametrising hook) is a weight_norm or
    spectral_norm of the weight over dim 0, which a layer's attr describes where it is the layer's only one."""
    return tensor == "weight" and len(how) == 1 and isinstance(how[0], (
        parametrizations._WeightNorm, parametrizations._SpectralNorm, WeightNorm, SpectralNorm)) and how[0].dim == 0


def _class_name(m: nn.Module) -> str:
    """``m``'s class name, a parametrized layer's the class torch made it from (``Conv2d``, not
    ``ParametrizedConv2d``)."""
    return (type(m).__bases__[0] if parametrize.is_parametrized(m) else type(m)).__name__


def _parametrization_form(p: nn.Module) -> str:
    """A parametrization's form as a refusal names it: torch's by function, another by its class."""
    known = next((f for cls, f in _TORCH_PARAMETRIZATIONS.items() if isinstance(p, cls)), None)
    return known or f"{type(p).__name__} (the model's own parametrization: weight standardisation, ...)"


def _is_identity(p: nn.Module) -> bool:
    """Whether the parametrization ``p``'s forward returns its one input as it is (torch.fx's trace of it: no op)."""
    if isinstance(p, tuple(_TORCH_PARAMETRIZATIONS)):
        return False
    try:
        graph = fx.symbolic_trace(p).graph
    except Exception:  # noqa: BLE001 - a forward torch.fx cannot follow computes something
        return False
    inputs = [n for n in graph.nodes if n.op == "placeholder"]
    output = next(n for n in graph.nodes if n.op == "output")
    return len(inputs) == 1 and output.args[0] is inputs[0]


def _sources(n: fx.Node) -> list[fx.Node]:
    """The nodes ``n`` is computed from, itself among them, in the order met going back; a tensor's shape read
    (``x.shape[1]``, ``x.size(1)``: a number) is not followed to the tensor."""
    seen, frontier = {n: None}, [n]
    while frontier:
        node = frontier.pop()
        if _reads_a_shape(node):
            continue
        for a in node.all_input_nodes:
            if a not in seen:
                seen[a] = None
                frontier.append(a)
    return list(seen)


def _reads_a_shape(n: fx.Node) -> bool:
    """Whether ``n`` reads a tensor's shape (``x.shape``, ``x.size()``, ``x.dim()``): a number, not its values."""
    return (n.op == "call_function" and n.target is getattr and len(n.args) > 1 and n.args[1] in ("shape", "ndim")) \
        or (n.op == "call_method" and n.target in ("size", "dim"))


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
    statistics both calls update; a parameter read directly by two ops, ``x * self.g + self.g``; a fixed boolean
    mask two wheres read, each filling its own number) the attr ``shares``:
    the name of the node that read them first, which holds them, so that they count once. ``UserError`` where the
    two cannot share (:func:`_sharing_refused`)."""
    described = {n.name: n for n in nodes}
    first_reader: dict[int, str] = {}  # id of a module tensor -> the description node that read it first
    read_by: dict[str, set[int]] = {}  # description node -> the ids of the module tensors it reads
    for fx_node in gm.graph.nodes:
        node = described.get(fx_node.name)
        if node is None or (node.op not in PARAMETER_OPS and not _fixed_mask_where(node)) \
                or SHARES in node.attrs:  # a fusion's sharing: its own
            continue
        tensors = _module_tensors_read(fx_node, gm, held)
        if _fixed_mask_where(node):  # two masks the trace computed alike (self.mask == 0 twice): the first's
            same = gm.meta.get(COMPUTED_MASKS, {})
            tensors = [(name, _fetched(gm, same[name]) if name in same else t) for name, t in tensors]
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


#: ``GraphModule.meta``'s key for :func:`computed_masks`' answer, which the shape propagation's twin keeps
COMPUTED_MASKS = "perf4sight_computed_masks"


def computed_masks(gm: fx.GraphModule) -> dict[str, str]:
    """Each boolean tensor the trace computed from the module's tensors (``_tensor_constant<i>``: ``self.mask == 0``,
    a tensor of its own at each read) -> the first one computed before it with the same values, for those that have
    one: two wheres of ``self.mask == 0`` then share one mask, as two of a registered one do
    (:func:`_mark_shared_calls`). Read before the weights go to the meta device (empty where they are there)."""
    seen: list[tuple[str, torch.Tensor]] = []
    same: dict[str, str] = {}
    for node in gm.graph.nodes:
        if node.op != "get_attr" or not str(node.target).startswith("_tensor_constant"):
            continue
        t = _fetched(gm, node.target)
        if not isinstance(t, torch.Tensor) or t.dtype != torch.bool or t.is_meta:
            continue
        first = next((name for name, u in seen if u.shape == t.shape and torch.equal(u, t)), None)
        if first is None:
            seen.append((node.target, t))
        elif first != node.target:
            same[node.target] = first
    return same


def _fetched(root: nn.Module, target: str) -> Any:
    """What a ``get_attr`` of ``target`` reads from ``root`` (None for a name ``root`` lacks)."""
    owner, _, attr = target.rpartition(".")
    return getattr(root.get_submodule(owner), attr, None)


def _fixed_mask_where(node: Node) -> bool:
    """Whether ``node`` is a where of a fixed mask (``mask_shape``: a module's boolean buffer, which a where that
    reads it again shares)."""
    return node.op == "where" and "mask_shape" in node.attrs


def _sharing_refused(node: Node, owner: Node, reads_the_same: bool) -> str:
    """Why ``node``, reading module tensors that ``owner`` read first, cannot share ``owner``'s (``reads_the_same``:
    whether it reads those and no others): "" where it can (the same op and attrs, or a scale and a shift of one
    shape)."""
    alike = owner.op == node.op or {owner.op, node.op} <= set(ONE_TENSOR_OPS)
    if reads_the_same and alike and (owner.attrs == node.attrs or _fixed_mask_where(node)):
        return ""  # (two wheres of one fixed mask: each its own fill, the mask one buffer)
    return ("a description counts the tensors of every node that shares no other's, so they would count twice (a "
            "layer called again shares its first call's, and a multiply and an add can share one parameter they read "
            "whole)")


#: Each kind of hook a module may hold: (its dict on the module, torch's global dict of it, its name in a refusal,
#: what a value it returns replaces)
_HOOKS = (("_forward_pre_hooks", "_global_forward_pre_hooks", "forward pre-hook", "the input"),
          ("_forward_hooks", "_global_forward_hooks", "forward hook", "the output"),
          ("_backward_pre_hooks", "_global_backward_pre_hooks", "backward pre-hook", "the output's gradient"),
          ("_backward_hooks", "_global_backward_hooks", "backward hook", "the input's gradient"))


def _refuse_value_changing_hooks(root: nn.Module, gm: fx.GraphModule, where: str) -> None:
    """A ``UserError`` naming the layer and the hook where a hook that torch.fx drops returns a value (a forward
    pre-hook or hook replacing a layer's input or output, a backward one its gradient): the description would leave
    out what it computes. torch.fx runs no hook of a layer it keeps whole (``nn.Conv2d``: a ``call_module`` node) or
    of the model itself (its forward is traced, not called), nor any backward hook; it runs the forward hooks of a
    module it traces through, whose ops are then described as any others. Each hook is called on empty tensors of the
    shapes ``gm`` (its shapes propagated) gives (meta tensors; zeros and random numbers where a hook fails on those):
    one that returns None, or the very tensors it was given, observes (logging, a feature kept), host Python of no
    kernel, and is described. A hook that fails on all is refused, as one that cannot be told apart."""
    module_globals = torch.nn.modules.module
    if not any(getattr(module_globals, g) for _, g, _, _ in _HOOKS) and not any(
            getattr(m, own) for m in root.modules() for own, _, _, _ in _HOOKS):
        return  # (most networks: no hook at all)
    values = _node_values(gm)
    calls: dict[str, tuple[list[Any], Any]] = {}  # a module's path -> (its inputs, its output), at its first call
    inside: dict[str, list[fx.Node]] = collections.defaultdict(list)  # a module traced through -> its nodes
    for n in gm.graph.nodes:
        if n.op == "call_module" and n.target not in calls:
            read = fx.node.map_arg((n.args, n.kwargs), values.get)
            calls[n.target] = ([*read[0], *read[1].values()], values.get(n))
        for key, value in (n.meta.get("nn_module_stack") or {}).items():
            path = value[0] if isinstance(value, tuple) else key  # (its path, its class), as from_torch reads it
            if path != n.target:
                inside[path].append(n)
    leaves = set(calls)
    output = next(n for n in gm.graph.nodes if n.op == "output")
    calls[""] = ([values.get(n) for n in gm.graph.nodes if n.op == "placeholder"],
                 fx.node.map_arg(output.args[0], values.get))
    for path, nodes in inside.items():
        calls.setdefault(path, _boundary(nodes, values))  # traced through: its backward hooks were not run
    for path, (inputs, output_value) in calls.items():
        try:
            m = root.get_submodule(path)
        except AttributeError:
            continue
        for own, globals_, kind, replaced in _HOOKS:
            if kind.startswith("forward") and path and path not in leaves:
                continue  # the trace ran it, as torch calls the module: what it returns is in the graph
            with_kwargs = {**getattr(m, f"{own}_with_kwargs", {}),
                           **{("global", k): v for k, v in getattr(module_globals, f"{globals_}_with_kwargs",
                                                                    {}).items()}}
            hooks = [(k, h) for k, h in getattr(m, own).items()]
            hooks += [(("global", k), h) for k, h in getattr(module_globals, globals_).items()]
            for key, hook in hooks:
                if getattr(hook, "__func__", None) is nn.modules.lazy.LazyModuleMixin._infer_parameters:
                    continue  # a lazy layer's own, which makes its weights and returns None
                layer = f"layer '{path}' ({_class_name(m)})" if path else f"the model ({_class_name(m)})"
                does = _hook_returns(hook, m, kind, key in with_kwargs, inputs, output_value, f"{where}: {layer}")
                if does:
                    fix = "the description has no op for a gradient a hook changes" if kind.startswith("back") \
                        else "write what it computes in a forward instead"
                    what, observer = ((f"returns a value, replacing {replaced}", "returns None") if does == "returns"
                                      else ("writes a tensor it was given in place", "writes nothing"))
                    raise UserError(f"{where}: {layer} has a {kind} ({_hook_name(hook)}) that {what}: torch.fx drops "
                                    f"the hook, so the description would leave out what it computes; {fix} (a hook "
                                    f"that {observer}, an observer, is described)")


def _refuse_gradient_hooks(root: nn.Module, gm: fx.GraphModule, where: str) -> None:
    """A ``UserError`` naming the parameter and the hook where a parameter the forward reads has a gradient hook
    (``Tensor.register_hook``: a gradient clipped or scaled per parameter) that returns a value other than the
    gradient it was given, or writes it in place: torch runs it at every backward, and the trace (of the module's
    forward) never sees it, so the description would leave out its kernels. Each hook is called as
    :func:`_refuse_value_changing_hooks` calls a layer's, on an empty gradient of the parameter's shape; one that
    returns None or the gradient as it is, unwritten (logging a norm), is described."""
    if not any(t._backward_hooks or getattr(t, "_post_accumulate_grad_hooks", None) for t in root.parameters()):
        return  # (most networks: no hook at all)
    seen: set[int] = set()
    for name, t in _read_tensors(root, gm.graph):
        if not isinstance(t, nn.Parameter) or id(t) in seen or not t.requires_grad:
            continue
        seen.add(id(t))
        for hook in list((getattr(t, "_post_accumulate_grad_hooks", None) or {}).values()):
            if _accumulated_hook_writes(hook, t, f"{where}: parameter '{name}'"):
                raise UserError(f"{where}: parameter '{name}' has a hook run once its gradient is accumulated "
                                f"({_hook_name(hook)}, Tensor.register_post_accumulate_grad_hook) that updates the "
                                "parameter or changes or frees its gradient in the backward (an optimiser's step "
                                "there): the trace does not see it, and the description would count the step's "
                                "memory and update as a plain training step's (a hook that writes nothing, an "
                                "observer, is described)")
        grad = torch.empty(t.shape, dtype=t.dtype, device="meta")
        for hook in list((t._backward_hooks or {}).values()):
            does = _hook_returns(hook, root, "gradient hook", False, [], grad, f"{where}: parameter '{name}'")
            if does:
                what = "returns a value, replacing its gradient" if does == "returns" else \
                    "writes its gradient in place"
                raise UserError(f"{where}: parameter '{name}' has a gradient hook ({_hook_name(hook)}, "
                                f"Tensor.register_hook) that {what} at every backward: the trace does not "
                                "see it, so the description would leave out what it computes; the description has "
                                "no op for a gradient a hook changes (a hook that returns None and writes nothing, an "
                                "observer, is described)")


def _accumulated_hook_writes(hook: Any, param: nn.Parameter, who: str) -> bool:
    """Whether a post-accumulate-grad ``hook`` of ``param`` writes the parameter or its gradient in place, or sets
    another gradient (None: freed), when called on a stand-in of the parameter with a gradient (empty meta tensors;
    zeros and random numbers where it fails on those: never the user's own parameter, which an optimiser's step
    would move); ``UserError`` naming ``who`` where it fails on all three (an optimiser kept by the very
    parameter cannot be told from an observer)."""
    problem = None
    for made_as in ("meta", "zeros", "random"):
        twin = nn.Parameter(_as_real(torch.empty(param.shape, dtype=param.dtype, device="meta"), made_as))
        grad = twin.grad = _as_real(torch.empty(param.shape, dtype=param.dtype, device="meta"), made_as)
        versions = (twin._version, grad._version)
        try:
            with torch.no_grad():
                hook(twin)
        except Exception as exc:  # noqa: BLE001 - a hook may fail on empty tensors, or on a stand-in
            problem = exc
            continue
        return twin.grad is not grad or (twin._version, grad._version) != versions
    said = str(problem).splitlines()[0] if str(problem) else ""
    raise UserError(f"{who} has a hook run once its gradient is accumulated ({_hook_name(hook)}, "
                    "Tensor.register_post_accumulate_grad_hook) that cannot be told to write nothing (an observer) or "
                    "to update the parameter or its gradient in the backward (which the description would leave out): "
                    f"called on a stand-in of the parameter it failed ({type(problem).__name__}: {said})")


def _node_values(gm: fx.GraphModule) -> dict[fx.Node, Any]:
    """Each node's value as an empty meta tensor of its propagated shape and dtype (a tuple or list of them)."""
    def made(meta: Any) -> Any:
        if hasattr(meta, "shape") and hasattr(meta, "dtype"):
            return torch.empty(tuple(meta.shape), dtype=meta.dtype, device="meta")
        if isinstance(meta, (tuple, list)):
            return type(meta)(made(v) for v in meta)
        return meta
    return {n: made(n.meta["tensor_meta"]) for n in gm.graph.nodes if "tensor_meta" in n.meta}


def _boundary(nodes: list[fx.Node], values: dict[fx.Node, Any]) -> tuple[list[Any], Any]:
    """The input (the first value read from outside ``nodes``, a module's traced forward, in a list; none where it
    reads nothing from outside) and the output (its last node's value read outside them) of a module traced
    through."""
    held = set(nodes)
    inputs = [values[a] for n in nodes for a in n.all_input_nodes if a not in held and a.op != "get_attr"
              and a in values]
    outputs = [values[n] for n in nodes if n in values and any(u not in held for u in n.users)]
    return inputs[:1], outputs[-1] if outputs else None


def _tensors(value: Any) -> tuple[Any, ...]:
    """The tensors of ``value`` (a tensor, or a tuple or list of them) as a tuple, as a backward hook is given."""
    if isinstance(value, torch.Tensor):
        return (value,)
    return tuple(v for v in value if isinstance(v, torch.Tensor)) if isinstance(value, (tuple, list)) else ()


def _hook_returns(hook: Any, m: nn.Module, kind: str, with_kwargs: bool, inputs: list[Any], output: Any,
                  who: str) -> str:
    """What ``hook`` (of ``kind``, on ``m``) does to the values it is given, when called on ``inputs`` and ``output``
    as meta tensors, or where it fails on those (it reads their values) as zeros and as random numbers (either
    call telling is enough): "returns" where it returns a value other than None and other than the very tensors it
    was given, "in place" where it writes one of those tensors in place (``o.mul_(2)``, ``o.relu_()`` returned: a
    tensor's version moved), "" for an observer; ``UserError`` naming ``who`` (the layer) where it fails on all
    three."""
    problem, told = None, []
    for made_as in ("meta", "zeros", "random"):  # empty tensors first; values where a hook reads them
        args = [_as_real(v, made_as) for v in inputs]
        out = _as_real(output, made_as)
        call = {"forward pre-hook": (m, tuple(args), {}) if with_kwargs else (m, tuple(args)),
                "forward hook": (m, tuple(args), {}, out) if with_kwargs else (m, tuple(args), out),
                "backward pre-hook": (m, _tensors(out)),
                "backward hook": (m, _tensors(args), _tensors(out)),
                "gradient hook": (out,)}[kind]  # a parameter's (Tensor.register_hook): its gradient alone
        given = (call[1:] if kind == "forward pre-hook" else call[1] if kind == "backward hook"  # what it would
                 else call[-1])  # replace
        versions = [(t, t._version) for t in _flat(call) if isinstance(t, torch.Tensor)]
        try:
            with torch.no_grad():
                made = hook(*call)
        except Exception as exc:  # noqa: BLE001 - a hook of any kind may fail on empty tensors
            problem = exc  # (said: on random numbers, the last tried)
            continue
        if kind == "forward pre-hook" and not with_kwargs:
            made = made if made is None or isinstance(made, tuple) else (made,)  # as torch takes a single value
            given = given[0]
        told.append("in place" if any(t._version != v for t, v in versions) else
                    "returns" if made is not None and not _same_objects(made, given) else "")
        if made_as == "meta":
            break
    if told:
        return max(told, key=lambda does: ("", "in place", "returns").index(does))
    said = str(problem).splitlines()[0] if str(problem) else ""
    raise UserError(f"{who} has a {kind} ({_hook_name(hook)}) that cannot be told to return None (an observer) or "
                    "a value (which the description would leave out): called on tensors of the layer's shapes it "
                    f"failed ({type(problem).__name__}: {said})")


def _same_objects(made: Any, given: Any) -> bool:
    """Whether what a hook returned (``made``) holds the very tensors and values it was given, in order (a hook that
    returns its output as it is, after logging it, changes nothing)."""
    made, given = _flat(made), _flat(given)
    return len(made) == len(given) and all(a is b for a, b in zip(made, given))


def _flat(v: Any) -> list[Any]:
    """The items of ``v`` (a value, or tuples, lists and dicts of them, nested) in order."""
    if isinstance(v, (tuple, list)):
        return [x for item in v for x in _flat(item)]
    return [x for item in v.values() for x in _flat(item)] if isinstance(v, dict) else [v]


def _as_real(value: Any, made_as: str) -> Any:
    """``value``'s meta tensors as they are (``made_as`` "meta"), or as zeros or random numbers on the CPU."""
    if isinstance(value, torch.Tensor) and made_as != "meta":
        if not value.dtype.is_floating_point:
            return torch.zeros(value.shape, dtype=value.dtype)
        if made_as == "zeros":
            return torch.zeros(value.shape, dtype=value.dtype)
        # a generator of its own: describing draws nothing from the model's random numbers (its training's seed)
        return torch.randn(value.shape, dtype=value.dtype, generator=torch.Generator().manual_seed(0))
    if isinstance(value, (tuple, list)):
        return type(value)(_as_real(v, made_as) for v in value)
    return value


def _hook_name(hook: Any) -> str:
    """A hook's name as a refusal gives it: its function's, or its class's."""
    return getattr(hook, "__qualname__", None) or type(hook).__name__
