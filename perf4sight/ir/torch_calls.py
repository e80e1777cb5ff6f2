"""What each torch function or method call an fx graph records is as a description op (:data:`FUNCTION_OPS`,
torchvision's wrapped Swin calls in :data:`_NAMED_CALLS`), and the op of any one fx node, a layer's
(:mod:`perf4sight.ir.torch_modules`) or a call's (:func:`_op_of`; :class:`_NoOp` where the description has none)."""
from __future__ import annotations

import operator
from types import SimpleNamespace
from typing import Any, Callable

import numpy as np
import torch
import torch.fx as fx
import torch.nn.functional as F
from torch import nn

from perf4sight.errors import UserError
from perf4sight.ir.standardised import STANDARDIZE_ATTRS, STANDARDIZES
from perf4sight.ir.fx_values import (_arg, _is_number, _is_tensor, _pair, _shape, _shape_value, _target_name,
                                     einsum_operands)
from perf4sight.ir.torch_modules import (_LEAF_MODULES, MODULE_OPS, _adaptive_pool, _alpha_dropout_attrs, _avgpool,
                                         _celu_attrs, _channel_dropout, _conv_transpose, _conv_transpose_attrs,
                                         _described_whole, _flatten, _fold_attrs, _fractional_maxpool, _gelu_attrs,
                                         _glu_attrs, _groupnorm_attrs, _hardtanh_attrs, _inplace_attr, _instancenorm,
                                         _instancenorm_attrs, _interpolate_attrs, _layernorm_attrs,
                                         _local_response_norm, _lp_pool, _maxpool, _pad_attrs, _padding, _rmsnorm_attrs,
                                         _rrelu_attrs, _running_statistics, _softmax_attrs, _sync_bn, _threshold_attrs,
                                         _unflatten, _unfold_attrs)


def _conv_transpose_call(n: fx.Node) -> tuple[str, dict]:
    """``F.conv_transpose2d(x, weight, bias, stride, padding, output_padding, groups, dilation)``, its weight (and
    bias) a module's own parameter as it is (``get_attr``): the channels and kernel from the weight's shape,
    ``[Cin, Cout / groups, kh, kw]``."""
    weight, bias = _arg(n, 1, "weight"), _arg(n, 2, "bias")
    if isinstance(weight, fx.Node) and STANDARDIZES in weight.meta:  # its parameter standardised (a conv2d's attr)
        weight = weight.meta[STANDARDIZES]
    if any(isinstance(t, fx.Node) and t.op != "get_attr" for t in (weight, bias)) or not isinstance(weight, fx.Node):
        raise ValueError("a transposed convolution whose weight or bias is computed, not a module's parameter as it "
                         "is, has no description op")
    cin, cout_per_group, kh, kw = (int(v) for v in weight.meta["tensor_meta"].shape)
    groups = int(_arg(n, 6, "groups", 1))
    return "conv_transpose2d", _conv_transpose_attrs(
        cin, cout_per_group * groups, [kh, kw], _arg(n, 3, "stride", 1), _arg(n, 4, "padding", 0),
        _arg(n, 5, "output_padding", 0), _arg(n, 7, "dilation", 1), groups, bias is not None)


def _own_weight_and_bias(n: fx.Node, layer: str) -> tuple[fx.Node, Any]:
    """The weight and bias (None where not given) of ``n``, a call of ``F.conv2d`` or ``F.linear``; ``ValueError``
    naming ``layer`` where either is computed rather than a module's parameter as it is (``get_attr``)."""
    weight, bias = _arg(n, 1, "weight"), _arg(n, 2, "bias")
    if isinstance(weight, fx.Node) and STANDARDIZES in weight.meta:  # its parameter standardised (a conv2d's attr)
        weight = weight.meta[STANDARDIZES]
    if any(isinstance(t, fx.Node) and t.op != "get_attr" for t in (weight, bias)) or not isinstance(weight, fx.Node):
        raise ValueError(f"{layer} whose weight or bias is computed, not a module's parameter as it is, has no "
                         "description op")
    return weight, bias


def _numbers(value: Any) -> Any:
    """A call's number, or each of its tuple of numbers, as :func:`_shape_value` reads it (a size the trace computes,
    ``x.shape[1]``, is its number)."""
    return type(value)(_shape_value(v) for v in value) if isinstance(value, (list, tuple)) else _shape_value(value)


def _conv_call(n: fx.Node) -> tuple[str, dict]:
    """``F.conv2d(x, weight, bias, stride, padding, dilation, groups)`` of a map, its weight (and bias) a module's own
    parameter as it is (``get_attr``: a hand-written convolution layer): the channels and kernel from the weight's
    shape, ``[Cout, Cin / groups, kh, kw]``; a padding of ``'same'`` or ``'valid'`` read as nn.Conv2d's is."""
    weight, bias = _own_weight_and_bias(n, "a convolution")
    if len(n.args[0].meta["tensor_meta"].shape) != 4:
        raise ValueError("a convolution of anything but a [N, C, H, W] map has no description op")
    cout, cin_per_group, kh, kw = (int(v) for v in weight.meta["tensor_meta"].shape)
    groups, stride, dilation, padding = (_numbers(_arg(n, i, key, default)) for i, key, default in (
        (6, "groups", 1), (3, "stride", 1), (5, "dilation", 1), (4, "padding", 0)))  # or sizes: groups=x.shape[1]
    groups = int(groups)
    padding = _padding(SimpleNamespace(padding=padding, dilation=dilation, kernel_size=(kh, kw)))
    return "conv2d", {"in_channels": cin_per_group * groups, "out_channels": cout, "kernel_size": [kh, kw],
                      "stride": _pair(stride), "padding": padding, "dilation": _pair(dilation), "groups": groups,
                      "bias": bias is not None, **n.meta.get(STANDARDIZE_ATTRS, {})}


def _linear_call(n: fx.Node) -> tuple[str, dict]:
    """``F.linear(x, weight, bias)``, its weight (and bias) a module's own parameter as it is (``get_attr``: a
    hand-written linear layer): the features from the weight's shape, ``[out, in]``."""
    weight, bias = _own_weight_and_bias(n, "a linear layer")
    out_features, in_features = (int(v) for v in weight.meta["tensor_meta"].shape)
    return "linear", {"in_features": in_features, "out_features": out_features, "bias": bias is not None}


def _einsum_linear_call(n: fx.Node) -> tuple[str, dict]:
    """``torch.einsum("bid,jd->bij", x, self.weight)``: a tensor times a module's own ``[out, in]`` parameter over
    its last letter, F.linear(x, weight) (torch runs it as one bmm of the rows, the same products); any other einsum
    that reaches here is refused naming its form."""
    from perf4sight.ir.torch_patterns import _einsum_linear_form

    equation, operands = n.args[0], einsum_operands(n.args)
    if not (isinstance(equation, str) and len(operands) == 2 and _einsum_linear_form(equation)
            and getattr(operands[1], "op", None) == "get_attr"):
        raise ValueError(f"an einsum of the form {equation!r} has no description op")
    out_features, in_features = (int(v) for v in operands[1].meta["tensor_meta"].shape)
    return "linear", {"in_features": in_features, "out_features": out_features, "bias": False}


def _pad_call(n: fx.Node) -> tuple[str, dict]:
    """``F.pad(x, pad, mode, value)`` of a ``[N, C, H, W]`` map."""
    if len(n.args[0].meta["tensor_meta"].shape) != 4:
        raise ValueError("a pad of anything but a [N, C, H, W] map has no description op")
    pads = [_shape_value(p) for p in _arg(n, 1, "pad")]  # numbers, or sizes the trace computes (a U-Net's)
    return _pad_attrs(pads, _arg(n, 2, "mode", "constant"), _arg(n, 3, "value"))


def _squeeze(n: fx.Node, dim: Any) -> tuple[str, dict]:
    """A squeeze of one dimension; of every size-1 dimension (``x.squeeze()``), or of several, the view to the shape
    it made of each image (traced at a batch of 2, which it kept: at a batch of 1 torch squeezes that too)."""
    return ("squeeze", {"dim": int(dim)}) if isinstance(dim, int) else ("reshape", {"shape": _shape(n)})


def _alpha_dropout_call(n: fx.Node) -> tuple[str, dict]:
    """``F.alpha_dropout(x, p, training, inplace)``, ``F.feature_alpha_dropout``, ``torch.alpha_dropout(x, p, train)``
    and their in-place forms, whatever their training flag, as a dropout's: the layer in training (describe traces
    the eval-mode forward, where ``training=self.training`` reads False, as F.alpha_dropout's default does: fx
    passes either to torch.alpha_dropout as False)."""
    name = n.target.__name__
    inplace = bool(_arg(n, 3, "inplace", False)) or name.endswith("_")
    return _alpha_dropout_attrs(_arg(n, 1, "p", 0.5), "feature" in name, inplace)


def _normalize_call(n: fx.Node) -> tuple[str, dict]:
    """``F.normalize(x, p, dim, eps)`` (a metric-learning or cosine classifier's features scaled to unit length) of
    p 2: the op normalize along ``dim`` (counted from the front; the batch's refused by name). Another p is refused,
    naming the ops that describe the same: torch runs its norm as one kernel (linalg_vector_norm) whose backward
    differs with p, then a clamp and a divide."""
    p, dim, eps = _arg(n, 1, "p", 2.0), _arg(n, 2, "dim", 1), _arg(n, 3, "eps", 1e-12)
    rank = len(n.args[0].meta["tensor_meta"].shape)
    if float(p) == 2 and int(dim) % rank == 0:
        raise ValueError("a normalisation F.normalize over the batch dimension (dim 0) has no description op (a "
                         "description keeps the samples apart); give a dim after the batch's")
    if float(p) == 2:
        return "normalize", {"dim": int(dim) % rank, **({} if float(eps) == 1e-12 else {"eps": float(eps)})}
    norm = "x.abs().pow(p).sum(dim, keepdim=True).pow(1 / p)"
    raise ValueError(f"a normalisation F.normalize(x, p={p}, dim={dim}) has no description op (only p=2 is the op "
                     f"normalize); x / {norm}.clamp_min({eps}) computes the same, its norm as a power and a sum, "
                     "and describes")


def _fold_call(n: fx.Node) -> tuple[str, dict]:
    """``F.fold(x, output_size, kernel_size, dilation, padding, stride)``: :func:`_fold_attrs`."""
    return _fold_attrs(n, _arg(n, 2, "kernel_size"), _arg(n, 3, "dilation", 1),
                       _arg(n, 4, "padding", 0), _arg(n, 5, "stride", 1))


def _unfold_call(n: fx.Node) -> tuple[str, dict]:
    """``F.unfold(x, kernel_size, dilation, padding, stride)``: :func:`_unfold_attrs`."""
    return _unfold_attrs(n, _arg(n, 1, "kernel_size"), _arg(n, 2, "dilation", 1), _arg(n, 3, "padding", 0),
                         _arg(n, 4, "stride", 1))


def _dims(v: Any) -> list[int]:
    if v is None:  # torch.mean(x): the batch dimension too, which a description leaves out
        raise ValueError("a mean over every dimension (no dim given) reduces the batch too; give dim=")
    return [int(v)] if isinstance(v, int) else [int(d) for d in v]


#: function or method name -> (fx node) -> (op, attrs).
FUNCTION_OPS: dict[Any, Callable[[fx.Node], tuple[str, dict]]] = {}


def _refuse_alpha(n: fx.Node, call: str, formula: str) -> None:
    """``ValueError`` naming ``alpha`` for the add or sub ``n`` (``call``, computing ``formula``) given one other
    than 1 (``torch.sub(x, y, alpha=a)``: x - a y), which no description op scales the second operand by."""
    alpha = n.kwargs.get("alpha", 1)
    if alpha != 1:
        raise ValueError(f"{call} of alpha {alpha} ({formula}) has no description op; multiply y first")


def _add(n: fx.Node) -> tuple[str, dict]:
    """An add; one of ``alpha`` other than 1 (``torch.add(x, y, alpha=a)``: x + a y), ``ValueError``."""
    _refuse_alpha(n, "an add", "x + alpha * y")
    return "add", {}


for _key in (operator.add, operator.iadd, torch.add, "add", "add_"):
    FUNCTION_OPS[_key] = _add
for _key in (operator.imul, "mul_"):
    FUNCTION_OPS[_key] = lambda n: ("mul", {})
#: the multiplies (out of place) that may multiply a mask in (:func:`_mask_multiplied`)
_MULTIPLIES = (operator.mul, torch.mul, "mul")


def _mask_multiplied(n: fx.Node) -> tuple[fx.Node, fx.Node, fx.Node] | None:
    """(the mask, the float tensor, the comparison) of ``n``, a multiply of a float tensor by a comparison (a mask
    multiplied in: ``x * (x > 0)``, ``(m > 0.5) * y``, ``torch.mul(y, a > b)``), the mask the comparison itself or it
    cast to float32 first (``x * (x > 0).float()``: :func:`_float_mask_of`); None for any other node."""
    if n.op not in ("call_function", "call_method") or n.target not in _MULTIPLIES or len(n.args) != 2 or n.kwargs:
        return None
    masks = [(a, c) for a, c in ((a, _mask_compared(a)) for a in n.args) if c is not None]
    if len(masks) != 1 or n.args[0] is n.args[1]:
        return None
    (mask, compared), = masks
    other = n.args[1] if n.args[0] is mask else n.args[0]
    if not _is_tensor(other) or other.op == "get_attr" or other.meta["tensor_meta"].dtype != torch.float32:
        return None
    return mask, other, compared


def _mask_compared(a: Any) -> fx.Node | None:
    """The comparison of ``a`` as a mask multiplied in: ``a`` itself, or the one it casts to float32
    (:func:`_float_mask_of`); None where it is neither."""
    cast = _float_mask_of(a)
    if cast is not None:
        return cast
    return a if _compared(a) is not None else None


def _float_mask_of(n: Any) -> fx.Node | None:
    """The comparison fx node ``n`` casts to float32 (a mask made a float tensor: ``(x > 0).float()``,
    ``(x > 0).to(x.dtype)``, ``(x > 0).type_as(x)`` of a float32 x); None for anything else."""
    if not isinstance(n, fx.Node) or n.op != "call_method" or not n.args or _compared(n.args[0]) is None:
        return None
    rest = [*n.args[1:], *n.kwargs.values()]
    if n.target == "float" and not rest or n.target == "to" and rest == [torch.float32] or \
            n.target == "type_as" and len(n.args) == 2 and not n.kwargs and _is_tensor(n.args[1]) \
            and n.args[1].meta["tensor_meta"].dtype == torch.float32:
        return n.args[0]
    return None


def _mul(n: fx.Node) -> tuple[str, dict]:
    """A multiply; of a tensor by a comparison (:func:`_mask_multiplied`: x * (x > 0)), the op where of that
    condition, the tensor its true branch, 0 its false one, flagged ``multiply`` (torch runs the compare, then a
    multiply by the boolean mask, which autograd keeps: a where's work and memory, a multiply's kernels); of a
    comparison cast to float32 first (``x * (x > 0).float()``), flagged ``float_mask`` too (the cast a kernel of its
    own, the float mask what autograd keeps)."""
    found = _mask_multiplied(n)
    if found is None:
        return "mul", {}
    mask, _, compared = found
    attrs = {**_condition_attrs(_compared(compared), compared, n), "if_false": 0.0, "multiply": True}
    return "where", {**attrs, "float_mask": True} if compared is not mask else attrs


for _key in _MULTIPLIES:
    FUNCTION_OPS[_key] = _mul


def _by_scalar(n: fx.Node) -> tuple[str, dict]:
    """``x - c`` as ``x + (-c)`` and ``x / c`` as ``x * (1 / c)``: the same elementwise work, on a tensor and a number
    (a scale of an input, ``x / 255``, ``(x - 0.5) / 0.25``). A difference or quotient of two tensors, or of a number
    and a tensor, has no description op."""
    name = _target_name(n.target)
    subtraction = name.rstrip("_") in ("sub", "isub")
    if subtraction:
        _refuse_alpha(n, f"a {name}", "x - alpha * y")
    other = _shape_value(n.args[1] if len(n.args) > 1 else n.kwargs.get("other"))
    if not isinstance(n.args[0], fx.Node) or isinstance(other, fx.Node) or isinstance(other, bool) \
            or not isinstance(other, (int, float)) or set(n.kwargs) - {"other", *(("alpha",) if subtraction else ())}:
        raise ValueError(f"a {name} of anything but a tensor by a number (x - 2, x / 255) has no description op")
    if subtraction:
        return "add", {"scalar": -float(other)}
    if other == 0:
        raise ValueError(f"a {name} by zero has no description op")
    return "mul", {"scalar": 1 / float(other)}


for _key in (operator.sub, operator.isub, torch.sub, "sub", "sub_", operator.truediv, operator.itruediv, torch.div,
             "div", "div_"):
    FUNCTION_OPS[_key] = _by_scalar


def _cast(n: fx.Node) -> tuple[str, dict]:
    """``x.float()``, ``x.to(torch.float32)``: the float32 tensor it is given (a description is of a float32 step)."""
    args = [*n.args[1:], *n.kwargs.values()]
    if n.target == "to" and args != [torch.float32] or n.target == "float" and args:
        raise ValueError("a cast other than to float32 (x.float(), x.to(torch.float32)) has no description op")
    return "alias", {}


FUNCTION_OPS["float"] = FUNCTION_OPS["to"] = _cast


def _type_as(n: fx.Node) -> tuple[str, dict]:
    """``m.type_as(x)`` of a comparison m and a float32 x (a mask multiplied in, :func:`_float_mask_of`), or of two
    float32 tensors: the tensor it is given."""
    if _float_mask_of(n) is None and not (len(n.args) == 2 and not n.kwargs and all(
            _is_tensor(a) and a.meta["tensor_meta"].dtype == torch.float32 for a in n.args)):
        raise ValueError("a type_as other than to float32 of a float32 tensor or a comparison has no description op")
    return "alias", {}


FUNCTION_OPS["type_as"] = _type_as

#: the calls that broadcast their two tensors (what an expanded operand meets): adds and multiplies
_BROADCASTING = {operator.add, operator.iadd, torch.add, "add", "add_", operator.mul, operator.imul, torch.mul, "mul",
                 "mul_"}


def _expand(n: fx.Node) -> tuple[str, dict]:
    """``s.expand_as(x)``, ``s.expand(...)`` read by adds and multiplies only, each of them of the expanded shape and
    broadcasting its operands to it (a squeeze-excitation's ``x * s.expand_as(x)``): the tensor itself, which they
    broadcast to that shape as the expand did (an expand is a view: it computes and allocates nothing). Read by
    anything else, or by an add or multiply that would not broadcast the tensor back (``s.expand_as(x) * 2``),
    ``ValueError``."""
    shape = _shape(n)
    users = list(n.users)
    if not users or any(u.op == "call_module" or u.target not in _BROADCASTING or _shape(u) != shape
                        or n in u.args[2:] or u.kwargs or not _broadcasts_to_its_shape(u) for u in users):
        raise ValueError(f"an {n.target} read by anything but an add or multiply of its own shape (which broadcasts "
                         "as it does) has no description op")
    return "alias", {}


def _is_expand(a: Any) -> bool:
    return isinstance(a, fx.Node) and a.op == "call_method" and a.target in ("expand", "expand_as")


def _broadcasts_to_its_shape(u: fx.Node) -> bool:
    """Whether ``u``'s tensor operands, each expand among them read as the tensor it expands, broadcast to ``u``'s
    shape (batch included)."""
    shapes = [list((a.args[0] if _is_expand(a) else a).meta["tensor_meta"].shape) for a in u.args[:2] if _is_tensor(a)]
    return bool(shapes) and list(torch.broadcast_shapes(*shapes)) == list(u.meta["tensor_meta"].shape)


FUNCTION_OPS["expand"] = FUNCTION_OPS["expand_as"] = _expand
for _key in (F.relu, torch.relu, "relu", "relu_", torch.relu_):  # torch.relu_ is F.relu_
    FUNCTION_OPS[_key] = lambda n: ("relu", _inplace_attr(n.kwargs.get("inplace") or n.target == "relu_"
                                                          or n.target is torch.relu_))
for _key in (F.relu6, "relu6"):  # F.relu6(y, inplace=True) writes y, as nn.ReLU6(inplace=True) does
    FUNCTION_OPS[_key] = lambda n: ("relu6", _inplace_attr(_arg(n, 1, "inplace", False)))
for _key, _op in ((torch.sigmoid, "sigmoid"), ("sigmoid", "sigmoid"), ("tanh", "tanh"), (torch.tanh, "tanh")):
    FUNCTION_OPS[_key] = (lambda op: lambda n: (op, {}))(_op)
# F.silu(y, inplace=True) (keyword or positional) writes y, as nn.SiLU(inplace=True) does; so do hardswish, hardsigmoid
for _key, _op in ((F.silu, "silu"), (F.hardswish, "hardswish"), (F.hardsigmoid, "hardsigmoid")):
    FUNCTION_OPS[_key] = (lambda op: lambda n: (op, _inplace_attr(_arg(n, 1, "inplace", False))))(_op)
# in place (y.sigmoid_(), torch.tanh_(y)): torch writes the input and keeps it as the result for backward
for _key, _op in (("sigmoid_", "sigmoid"), (torch.sigmoid_, "sigmoid"), ("tanh_", "tanh"), (torch.tanh_, "tanh")):
    FUNCTION_OPS[_key] = (lambda op: lambda n: (op, {"inplace": True}))(_op)
FUNCTION_OPS[F.gelu] = lambda n: ("gelu", _gelu_attrs(_arg(n, 1, "approximate", "none")))
for _key in (F.leaky_relu, F.leaky_relu_, "leaky_relu", "leaky_relu_"):
    FUNCTION_OPS[_key] = lambda n: ("leaky_relu", {"negative_slope": float(_arg(n, 1, "negative_slope", 0.01)),
                                                   **_inplace_attr(_arg(n, 2, "inplace", False)
                                                                   or n.target in ("leaky_relu_", F.leaky_relu_))})
for _key in (F.elu, F.elu_):
    FUNCTION_OPS[_key] = lambda n: ("elu", {"alpha": float(_arg(n, 1, "alpha", 1.0)),
                                            **_inplace_attr(_arg(n, 2, "inplace", False) or n.target is F.elu_)})
FUNCTION_OPS[F.softplus] = lambda n: ("softplus", {"beta": float(_arg(n, 1, "beta", 1.0)),
                                                   "threshold": float(_arg(n, 2, "threshold", 20.0))})
for _key in (F.hardtanh, F.hardtanh_):
    FUNCTION_OPS[_key] = lambda n: _hardtanh_attrs(_arg(n, 1, "min_val", -1.0), _arg(n, 2, "max_val", 1.0),
                                                   bool(_arg(n, 3, "inplace", False)) or n.target is F.hardtanh_)
for _key in (F.selu, F.selu_, torch.selu, torch.selu_):
    FUNCTION_OPS[_key] = lambda n: ("selu", _inplace_attr(_arg(n, 1, "inplace", False)
                                                          or n.target in (F.selu_, torch.selu_)))
for _key in (F.celu, F.celu_, torch.celu, torch.celu_):
    FUNCTION_OPS[_key] = lambda n: _celu_attrs(_arg(n, 1, "alpha", 1.0), bool(_arg(n, 2, "inplace", False))
                                               or n.target in (F.celu_, torch.celu_))
FUNCTION_OPS[F.logsigmoid] = lambda n: ("log_sigmoid", {})
for _key, _op in ((torch.hardshrink, "hardshrink"), ("hardshrink", "hardshrink"), (F.softshrink, "softshrink")):
    FUNCTION_OPS[_key] = (lambda op: lambda n: (op, {"lambd": float(_arg(n, 1, "lambd", 0.5))}))(_op)
for _key in (F.threshold, torch.threshold, torch.threshold_):  # F.threshold_ is torch.threshold_
    FUNCTION_OPS[_key] = lambda n: _threshold_attrs(_arg(n, 1, "threshold"), _arg(n, 2, "value"),
                                                    bool(_arg(n, 3, "inplace", False)) or n.target is torch.threshold_)
for _key in (F.alpha_dropout, F.feature_alpha_dropout, torch.alpha_dropout, torch.alpha_dropout_,
             torch.feature_alpha_dropout, torch.feature_alpha_dropout_):
    FUNCTION_OPS[_key] = _alpha_dropout_call
for _key in (F.lp_pool1d, F.lp_pool2d, getattr(F, "lp_pool3d", F.lp_pool2d)):
    FUNCTION_OPS[_key] = _lp_pool
for _key in (F.rrelu, F.rrelu_, torch.rrelu, torch.rrelu_):  # F.rrelu_ is torch.rrelu_; torch's 5th: a generator
    FUNCTION_OPS[_key] = lambda n: _rrelu_attrs(_arg(n, 1, "lower", 1 / 8), _arg(n, 2, "upper", 1 / 3),
                                                bool(_arg(n, 4, "inplace", False)) if n.target is F.rrelu
                                                else n.target is torch.rrelu_)
FUNCTION_OPS[F.mish] = lambda n: ("mish", _inplace_attr(_arg(n, 1, "inplace", False)))


def _power(n: fx.Node) -> tuple[str, dict]:
    """``x ** p``, ``x.pow(p)``, ``torch.pow(x, p)`` of a tensor and a number (a number of shape arithmetic too): the
    op pow; a power of a number by a tensor (``2 ** x``) or of two tensors (GeM's learnt ``p``) has no description
    op."""
    exponent = _shape_value(_arg(n, 1, "exponent"))
    if not _is_tensor(n.args[0]) or not _is_number(exponent):
        raise ValueError("a power of anything but a tensor by a number (x ** 2, x.pow(3.0)) has no description op")
    return "pow", {"exponent": float(exponent)}


for _key in (operator.pow, torch.pow, "pow"):
    FUNCTION_OPS[_key] = _power
for _key, _exponent in ((torch.square, 2.0), ("square", 2.0), (torch.sqrt, 0.5), ("sqrt", 0.5), (torch.rsqrt, -0.5),
                        ("rsqrt", -0.5)):
    FUNCTION_OPS[_key] = (lambda e: lambda n: ("pow", {"exponent": e}))(_exponent)
for _key in (torch.reciprocal, "reciprocal"):  # 1 / x: torch's reciprocal kernel, the power -1's
    FUNCTION_OPS[_key] = lambda n: ("pow", {"exponent": -1.0})


def _repeat(n: fx.Node) -> tuple[str, dict]:
    """``x.repeat(*sizes)``, ``x.tile(dims)``, ``torch.tile(x, dims)`` (a tile's dims shorter than the input's filled
    with ones in front, as torch's): the op repeat of the counts after the batch's. One that tiles the batch or adds
    dimensions before it is refused by name, as a tiling of none (0) is."""
    call = _target_name(n.target)
    sizes = n.args[1:] if call == "repeat" else (_arg(n, 1, "dims"),)
    if len(sizes) == 1 and isinstance(sizes[0], (list, tuple)):
        sizes = sizes[0]
    sizes = [int(_shape_value(s)) for s in sizes]
    rank = len(n.args[0].meta["tensor_meta"].shape)
    if call == "tile":
        sizes = [1] * (rank - len(sizes)) + sizes
    if len(sizes) != rank or sizes[0] != 1 or min(sizes) < 1:
        raise ValueError(f"a {call} of {sizes} tiles the batch, adds dimensions before it or repeats nothing "
                         f"(of a tensor of {rank} dimensions, the batch's first), which has no description op")
    return "repeat", {"repeats": sizes[1:]}


for _key in ("repeat", "tile", torch.tile):
    FUNCTION_OPS[_key] = _repeat
for _key in (operator.neg, torch.neg, "neg"):  # -x: x times -1
    FUNCTION_OPS[_key] = lambda n: ("mul", {"scalar": -1.0})
for _key, _op in ((torch.exp, "exp"), ("exp", "exp"), (torch.abs, "abs"), ("abs", "abs"), (operator.abs, "abs")):
    FUNCTION_OPS[_key] = (lambda op: lambda n: (op, {}))(_op)
for _key in (torch.log, "log"):
    FUNCTION_OPS[_key] = lambda n: ("log", {})
for _key in (torch.cat, torch.concat, torch.concatenate):  # each takes its dim as dim= or as axis=
    FUNCTION_OPS[_key] = lambda n: ("cat", {"dim": int(_arg(n, 1, "dim", n.kwargs.get("axis", 0)))})
for _key in (torch.flatten, "flatten"):
    FUNCTION_OPS[_key] = lambda n: _flatten(n, _arg(n, 1, "start_dim", 0), _arg(n, 2, "end_dim", -1))
for _key in (torch.transpose, "transpose", torch.swapaxes, "swapaxes", torch.swapdims, "swapdims"):
    FUNCTION_OPS[_key] = lambda n: ("transpose", {"dim0": int(_arg(n, 1, "dim0")), "dim1": int(_arg(n, 2, "dim1"))})


def _matrix_transpose_attr(n: fx.Node) -> tuple[str, dict]:
    """``x.mT`` (and ``x.mH``, the same for the real tensors a description holds; torch.fx records either as a
    ``getattr``): the last two dimensions swapped, as ``x.transpose(-2, -1)``; ``ValueError`` for ``x.T``/``x.H``
    and for ``x.mT`` of a [B, F] tensor, which swap the batch dimension with another."""
    name, rank = n.args[1], len(n.args[0].meta["tensor_meta"].shape)
    if name in ("T", "H") or rank < 3:
        raise ValueError(f"x.{name} of a tensor of {rank} dimensions moves the batch dimension and has no description "
                         "op; swap two dimensions after the batch's (x.mT or x.transpose(-2, -1) of 3 or more)")
    return "transpose", {"dim0": -2, "dim1": -1}


_MATRIX_TRANSPOSES = ("mT", "mH", "T", "H")


def _moved_dims(n: fx.Node) -> tuple[str, dict]:
    """``torch.movedim(x, source, destination)``/``moveaxis``: the permute that puts each source dimension at its
    destination, the others in their order; ``ValueError`` where it moves the batch's."""
    rank = len(n.args[0].meta["tensor_meta"].shape)
    source, destination = (_arg(n, 1, "source"), _arg(n, 2, "destination"))
    source, destination = ([int(d) % rank for d in ([v] if isinstance(v, int) else v)] for v in (source, destination))
    dims: list[int | None] = [None] * rank
    for s, d in zip(source, destination):
        dims[d] = s
    rest = iter(i for i in range(rank) if i not in source)
    dims = [next(rest) if d is None else d for d in dims]
    if dims[0] != 0:
        raise ValueError(f"a movedim of dims {source} to {destination} moves the batch dimension and has no "
                         "description op; move dimensions after the batch's")
    return "permute", {"dims": dims}


def _refuse_t(n: fx.Node) -> tuple[str, dict]:
    """``x.t()``/``torch.t``: of a tensor of at most two dimensions, the batch's among them: ``ValueError``."""
    raise ValueError("x.t() swaps the batch dimension of a [B, F] tensor and has no description op; swap dimensions "
                     "after the batch's (x.mT or x.transpose(-2, -1) of 3 or more)")


for _key in (torch.movedim, "movedim", torch.moveaxis, "moveaxis"):
    FUNCTION_OPS[_key] = _moved_dims
for _key in (torch.t, "t"):
    FUNCTION_OPS[_key] = _refuse_t


def _dims_after_the_batch(n: fx.Node, dims: Any, call: str) -> list[int]:
    """``dims`` (an int or a sequence) of call ``n`` as dimensions in [1, rank) of its input; ``ValueError`` naming
    ``call`` where one is the batch's."""
    rank = len(n.args[0].meta["tensor_meta"].shape)
    dims = [int(d) % rank for d in ([dims] if isinstance(dims, int) else dims)]
    if not dims or 0 in dims:
        raise ValueError(f"a {call} along the batch dimension (dims {dims}) has no description op (a description "
                         "keeps the batch whole); give dims after the batch's")
    return dims


def _flip_call(n: fx.Node) -> tuple[str, dict]:
    """``torch.flip(x, dims)``, ``x.flip(*dims)``, ``torch.fliplr`` (dim 1) and ``flipud`` (dim 0, the batch's:
    refused)."""
    name = _target_name(n.target)
    if name in ("fliplr", "flipud"):
        return "flip", {"dims": _dims_after_the_batch(n, 1 if name == "fliplr" else 0, name)}
    rest = list(n.args[1:]) or [n.kwargs.get("dims")]
    dims = rest[0] if len(rest) == 1 else rest
    return "flip", {"dims": _dims_after_the_batch(n, dims, "flip")}


def _roll_call(n: fx.Node) -> tuple[str, dict]:
    """``torch.roll(x, shifts, dims)``/``x.roll``: the op roll of a shift per dim; one without dims (torch rolls the
    tensor flattened, the batch with it) or of the batch's dimension is refused by name."""
    shifts, dims = _arg(n, 1, "shifts"), _arg(n, 2, "dims")
    if dims is None or dims == ():
        raise ValueError("a roll without dims moves elements across the batch (torch rolls the tensor flattened) and "
                         "has no description op; give dims after the batch's")
    shifts = [int(_shape_value(s)) for s in ([shifts] if not isinstance(shifts, (list, tuple)) else shifts)]
    dims = _dims_after_the_batch(n, dims, "roll")
    if len(shifts) != len(dims):
        raise ValueError(f"a roll of shifts {shifts} along dims {dims} (not one each) has no description op")
    return "roll", {"shifts": shifts, "dims": dims}


for _key in (torch.flip, "flip", torch.fliplr, "fliplr", torch.flipud, "flipud"):
    FUNCTION_OPS[_key] = _flip_call
for _key in (torch.roll, "roll"):
    FUNCTION_OPS[_key] = _roll_call

for _key in (torch.mean, "mean"):
    FUNCTION_OPS[_key] = lambda n: ("mean", {"dims": _dims(_arg(n, 1, "dim")),
                                             "keepdim": bool(_arg(n, 2, "keepdim", False))})
FUNCTION_OPS[F.local_response_norm] = lambda n: _local_response_norm(
    n, _arg(n, 1, "size"), _arg(n, 2, "alpha", 1e-4), _arg(n, 3, "beta", 0.75), _arg(n, 4, "k", 1.0))
for _key in (torch.unflatten, "unflatten"):
    FUNCTION_OPS[_key] = lambda n: _unflatten(n, _arg(n, 1, "dim"))


def _variance(n: fx.Node) -> tuple[str, dict]:
    """``x.var(dims, unbiased=False, keepdim=True)``, ``torch.var(x, dims, correction=0)``: the op var (torch's
    default correction 1, unbiased); ``ValueError`` over every dimension (no dim, or ``x.var(False)``: a bool first is
    torch's ``unbiased``)."""
    unbiased = _arg(n, 2, "unbiased", None) if not isinstance(_arg(n, 2, "unbiased"), fx.Node) else None
    correction = n.kwargs.get("correction", 1 if unbiased in (None, True) else 0)
    keepdim = n.kwargs.get("keepdim", n.args[3] if len(n.args) > 3 else False)
    if not _is_number(correction) or not isinstance(keepdim, bool):
        raise ValueError("a variance of another correction than a number has no description op")
    if _arg(n, 1, "dim") is None or isinstance(_arg(n, 1, "dim"), bool):  # x.var(False): unbiased, every dimension
        raise ValueError(f"a {'standard deviation' if n.target in _STD_CALLS else 'variance'} over every dimension "
                         "(no dim given) reduces the batch too; give dim=")
    return "var", {"dims": _dims(_arg(n, 1, "dim")), "keepdim": keepdim, "correction": float(correction)}


for _key in (torch.var, "var"):
    FUNCTION_OPS[_key] = _variance
for _key in (torch.squeeze, "squeeze"):
    FUNCTION_OPS[_key] = lambda n: _squeeze(n, _arg(n, 1, "dim"))
for _key in (torch.unsqueeze, "unsqueeze"):
    FUNCTION_OPS[_key] = lambda n: ("unsqueeze", {"dim": int(_arg(n, 1, "dim"))})
FUNCTION_OPS[F.adaptive_avg_pool2d] = lambda n: _adaptive_pool("adaptiveavgpool2d", n)
FUNCTION_OPS[F.adaptive_max_pool2d] = lambda n: _adaptive_pool("adaptivemaxpool2d", n)  # its indices: a tuple, no op
FUNCTION_OPS[F.max_pool2d] = lambda n: _maxpool(nn.MaxPool2d(
    _arg(n, 1, "kernel_size"), _arg(n, 2, "stride"), _arg(n, 3, "padding", 0), _arg(n, 4, "dilation", 1),
    ceil_mode=bool(_arg(n, 5, "ceil_mode", False))))  # read as the module of the same arguments
FUNCTION_OPS[F.avg_pool2d] = lambda n: _avgpool(nn.AvgPool2d(
    _arg(n, 1, "kernel_size"), _arg(n, 2, "stride"), _arg(n, 3, "padding", 0), bool(_arg(n, 4, "ceil_mode", False)),
    bool(_arg(n, 5, "count_include_pad", True)), _arg(n, 6, "divisor_override")))


def _along(n: fx.Node) -> tuple[int, int]:
    """(the dimension counting the batch's, its size) that ``torch.select``/``torch.narrow`` call ``n`` picks along;
    ``ValueError`` for the batch dimension, which a description leaves out."""
    shape = n.args[0].meta["tensor_meta"].shape
    dim = int(_arg(n, 1, "dim")) % len(shape)
    if dim == 0:
        raise ValueError(f"{n.target} along the batch dimension")
    return dim, int(shape[dim])


def _select_call(n: fx.Node) -> tuple[str, dict]:
    """``x.select(dim, index)`` or ``torch.select`` (a rebuilt description's select; ``x[:, i]`` is read by
    ``_index``)."""
    dim, size = _along(n)
    return "select", {"dim": dim, "index": int(_arg(n, 2, "index")) % size}


def _narrow_call(n: fx.Node) -> tuple[str, dict]:
    """``x.narrow(dim, start, length)`` or ``torch.narrow`` (a rebuilt description's narrow)."""
    dim, size = _along(n)
    return "narrow", {"dim": dim, "start": int(_arg(n, 2, "start")) % size, "length": int(_arg(n, 3, "length"))}


for _key in (torch.select, "select"):
    FUNCTION_OPS[_key] = _select_call
for _key in (torch.narrow, "narrow"):
    FUNCTION_OPS[_key] = _narrow_call


def _layer_norm_call(n: fx.Node) -> tuple[str, dict]:
    """``F.layer_norm(x, shape, weight, bias, eps)``, its weight and bias the module's own (``get_attr``)."""
    weight, bias = _arg(n, 2, "weight"), _arg(n, 3, "bias")
    if (weight is None) != (bias is None):
        raise ValueError("a layer norm with a weight but no bias (or a bias but no weight) has no description op")
    return "layernorm", _layernorm_attrs(_arg(n, 1, "normalized_shape"), float(_arg(n, 4, "eps", 1e-5)),
                                         weight is not None)


def _rms_norm_call(n: fx.Node) -> tuple[str, dict]:
    """``F.rms_norm(x, shape, weight, eps)``, its weight (where given) the module's own (``get_attr``); its shape
    may be read off the input (``(x.shape[1],)``)."""
    eps, shape = _arg(n, 3, "eps"), _arg(n, 1, "normalized_shape")
    shape = _shape_value(shape) if isinstance(shape, (fx.Node, int)) else [_shape_value(s) for s in shape]
    return "rmsnorm", _rmsnorm_attrs(shape, None if eps is None else float(eps), _arg(n, 2, "weight") is not None)


def _group_norm_call(n: fx.Node) -> tuple[str, dict]:
    """``F.group_norm(x, num_groups, weight, bias, eps)``: its channels the input's, its weight and bias the module's
    own (``get_attr``)."""
    weight, bias = _arg(n, 2, "weight"), _arg(n, 3, "bias")
    if (weight is None) != (bias is None):
        raise ValueError("a group norm with a weight but no bias (or a bias but no weight) has no description op")
    channels = n.args[0].meta["tensor_meta"].shape[1]
    return "groupnorm", _groupnorm_attrs(_arg(n, 1, "num_groups"), channels, float(_arg(n, 4, "eps", 1e-5)),
                                         weight is not None)


def _running_pair(n: fx.Node, norm: str, hint: str = "") -> list[Any]:
    """The running mean and variance that the norm call ``n`` (of ``norm``: "a batch norm", "an instance norm") is
    given, each None where it is not; one without the other a ``ValueError`` saying so, ``hint`` after it."""
    running = [_arg(n, 1, "running_mean"), _arg(n, 2, "running_var")]
    if (running[0] is None) != (running[1] is None):
        raise ValueError(f"{norm} with a running mean but no running variance (or a variance but no mean) has no "
                         f"description op{hint}")
    return running


def _batch_norm_call(n: fx.Node) -> tuple[str, dict]:
    """``F.batch_norm(x, running_mean, running_var, weight, bias, training, momentum, eps)`` of a ``[N, C]``,
    ``[N, C, L]`` or ``[N, C, H, W]`` input: a batchnorm2d, its channels the input's, its running statistics,
    weight and bias the module's own (``get_attr``), its momentum the call's. Without running statistics (torch then
    normalises by the batch's even in eval mode) one that tracks none; with one of the two alone, ``ValueError``."""
    running = _running_pair(n, "a batch norm")
    if len(n.args[0].meta["tensor_meta"].shape) not in (2, 3, 4):  # a volume's: BatchNorm2d and 1d refuse it
        raise ValueError("a batch norm call of anything but a [N, C, H, W] map, [N, C] or [N, C, L] has no "
                         "description op")
    weight, bias = _arg(n, 3, "weight"), _arg(n, 4, "bias")
    if (weight is None) != (bias is None):
        raise ValueError("a batch norm with a weight but no bias (or a bias but no weight) has no description op")
    attrs: dict[str, Any] = {"num_features": int(n.args[0].meta["tensor_meta"].shape[1])}
    if float(_arg(n, 7, "eps", 1e-5)) != 1e-5:
        attrs["eps"] = float(_arg(n, 7, "eps", 1e-5))
    if weight is None:
        attrs["affine"] = False
    momentum = float(_arg(n, 6, "momentum", 0.1))  # (a layer's None: :func:`_mark_cumulative_averages`)
    return "batchnorm2d", {**attrs, **_running_statistics(running[0] is not None, momentum)}


def _permuted_dims(n: fx.Node) -> list[int]:
    """The dimensions, counting the batch's, that permute call ``n`` (``x.permute(0, 2, 3, 1)``,
    ``torch.permute(x, [0, 2, 3, 1])``) puts in order, each in [0, rank)."""
    rest = list(n.args[1:]) or [n.kwargs.get("dims")]
    dims = rest[0] if len(rest) == 1 and isinstance(rest[0], (list, tuple)) else rest
    rank = len(n.args[0].meta["tensor_meta"].shape)
    return [int(d) % rank for d in dims]


def _permute_call(n: fx.Node) -> tuple[str, dict]:
    """``x.permute(0, 2, 3, 1)`` or ``torch.permute(x, [0, 2, 3, 1])``: dimensions count the batch, which stays."""
    dims = _permuted_dims(n)
    if dims[0] != 0:
        raise ValueError(f"a permute that moves the batch dimension ({dims}) has no description op unless each of "
                         "its readers takes one entry of its first dimension (q, k, v = qkv.unbind(0), qkv[0])")
    return "permute", {"dims": dims}


def _interpolate_call(n: fx.Node) -> tuple[str, dict]:
    """``F.interpolate(x, size, scale_factor, mode, align_corners, recompute_scale_factor, antialias)``."""
    return _interpolate_attrs(n, _arg(n, 3, "mode", "nearest"), _arg(n, 4, "align_corners"),
                              _arg(n, 2, "scale_factor"), _arg(n, 5, "recompute_scale_factor"),
                              _arg(n, 6, "antialias", False))


def _instance_norm_call(n: fx.Node) -> tuple[str, dict]:
    """``F.instance_norm(x, running_mean, running_var, weight, bias, use_input_stats, momentum, eps)``: its
    channels the input's, its weight, bias and running statistics the module's own (``get_attr``). With running
    statistics (nn.InstanceNorm2d's call copied into a module of one's own) it tracks them by ``momentum``; its
    ``use_input_stats``, ``self.training`` there, is read as a training step's (each sample normalised by its own
    statistics), as F.batch_norm's ``training`` is. A running mean without a variance (or the other way) is
    refused by name."""
    running = _running_pair(n, "an instance norm",
                            "; give both (nn.InstanceNorm2d(track_running_stats=True) keeps both)")
    weight, bias = _arg(n, 3, "weight"), _arg(n, 4, "bias")
    if (weight is None) != (bias is None):
        raise ValueError("an instance norm with a weight but no bias (or a bias but no weight) has no description op")
    channels = n.args[0].meta["tensor_meta"].shape[1]
    momentum = None if running[0] is None else float(_arg(n, 6, "momentum", 0.1))
    return "instancenorm", _instancenorm_attrs(channels, float(_arg(n, 7, "eps", 1e-5)), weight is not None,
                                               momentum)


def _softmax_call(n: fx.Node) -> tuple[str, dict]:
    """``F.softmax(x, dim)``, ``torch.softmax(x, dim)``, ``x.softmax(dim)`` and their log-softmax twins
    (``F.log_softmax``, ``torch.log_softmax``, ``x.log_softmax``); one that casts (``dtype=``) refused."""
    op = "log_softmax" if n.target in (F.log_softmax, torch.log_softmax, "log_softmax") else "softmax"
    dtype = _arg(n, 3, "dtype") if n.target in (F.softmax, F.log_softmax) else _arg(n, 2, "dtype")
    if dtype is not None and dtype != torch.float32:
        raise ValueError(f"a {op.replace('_', '-')} that casts (dtype=) has no description op")
    return _softmax_attrs(n, _arg(n, 1, "dim"), op)


def _prelu_call(n: fx.Node) -> tuple[str, dict]:
    """``F.prelu(x, weight)`` on the module's own slopes (a ``get_attr``: one, or one per channel)."""
    weight = _arg(n, 1, "weight")
    if not isinstance(weight, fx.Node) or weight.op != "get_attr":
        raise ValueError("a prelu whose slopes are not a module's own parameter has no description op")
    return "prelu", {"num_parameters": int(np.prod(weight.meta["tensor_meta"].shape))}


def _dropout2d_call(n: fx.Node) -> tuple[str, dict]:
    """``F.dropout1d``, ``F.dropout2d``, ``F.dropout3d`` (x, p): :func:`_channel_dropout`."""
    kind = n.target.__name__
    return _channel_dropout(kind, len(n.args[0].meta["tensor_meta"].shape), _arg(n, 1, "p", 0.5))


#: The largest float32: the bound a clamp to one bound leaves open (no float32 lies beyond it)
_FLOAT32_MAX = float(np.finfo(np.float32).max)


def _clamp_call(n: fx.Node) -> tuple[str, dict]:
    """``torch.clamp(x, lo, hi)``, ``x.clamp(lo, hi)``, ``clip``: a hardtanh of ``[lo, hi]`` (the same function and
    gradient, the input kept for backward as torch keeps it for either); a clamp to one bound (``x.clamp(min=0)``,
    ``clamp_min``, ``clamp_max``) the hardtanh whose other bound is the largest float32 (the same for every finite
    float32); to a tensor's bounds, or to none, ``ValueError``."""
    name = getattr(n.target, "__name__", n.target)
    if name in ("clamp_min", "clamp_max"):
        bound = _arg(n, 1, "min" if name == "clamp_min" else "max")
        low, high = (bound, None) if name == "clamp_min" else (None, bound)
    else:
        low, high = _arg(n, 1, "min"), _arg(n, 2, "max")
    if isinstance(low, fx.Node) or isinstance(high, fx.Node):
        raise ValueError("a clamp to a tensor's bounds has no description op")
    if low is None and high is None:
        raise ValueError("a clamp to no bound has no description op")
    return _hardtanh_attrs(-_FLOAT32_MAX if low is None else low, _FLOAT32_MAX if high is None else high, False)


for _key in (torch.clamp, torch.clip, "clamp", "clip", torch.clamp_min, torch.clamp_max, "clamp_min", "clamp_max"):
    FUNCTION_OPS[_key] = _clamp_call
FUNCTION_OPS[F.interpolate] = _interpolate_call
FUNCTION_OPS[F.instance_norm] = _instance_norm_call
for _key in (F.softmax, torch.softmax, "softmax", F.log_softmax, torch.log_softmax, "log_softmax"):
    FUNCTION_OPS[_key] = _softmax_call
FUNCTION_OPS[F.prelu] = FUNCTION_OPS[torch.prelu] = _prelu_call
FUNCTION_OPS[F.layer_norm] = _layer_norm_call
for _key in (F.rms_norm, torch.rms_norm):
    FUNCTION_OPS[_key] = _rms_norm_call
FUNCTION_OPS[F.group_norm] = _group_norm_call
FUNCTION_OPS[F.batch_norm] = _batch_norm_call
FUNCTION_OPS[F.normalize] = _normalize_call
FUNCTION_OPS[F.unfold] = _unfold_call
FUNCTION_OPS[F.fold] = _fold_call
FUNCTION_OPS[F.fractional_max_pool2d] = lambda n: _fractional_maxpool(
    n, _arg(n, 1, "kernel_size"), _arg(n, 4, "return_indices", False), _arg(n, 5, "_random_samples"))
FUNCTION_OPS[F.conv_transpose2d] = _conv_transpose_call
FUNCTION_OPS[F.conv2d] = _conv_call
FUNCTION_OPS[F.linear] = _linear_call
FUNCTION_OPS[torch.einsum] = _einsum_linear_call
FUNCTION_OPS[F.glu] = lambda n: _glu_attrs(n, _arg(n, 1, "dim", -1))
for _key in (torch.permute, "permute"):
    FUNCTION_OPS[_key] = _permute_call
FUNCTION_OPS[F.dropout] = lambda n: ("dropout", {"p": float(_arg(n, 1, "p", 0.5))})
for _key in (F.dropout1d, F.dropout2d, F.dropout3d):
    FUNCTION_OPS[_key] = _dropout2d_call
for _key in (F.pad, torch._C._nn.pad):
    FUNCTION_OPS[_key] = _pad_call
for _key in (torch.pixel_shuffle, "pixel_shuffle"):
    FUNCTION_OPS[_key] = lambda n: ("pixel_shuffle", {"upscale_factor": int(_arg(n, 1, "upscale_factor"))})
for _key in (torch.pixel_unshuffle, "pixel_unshuffle"):
    FUNCTION_OPS[_key] = lambda n: ("pixel_unshuffle", {"downscale_factor": int(_arg(n, 1, "downscale_factor"))})


def _window_attention_call(n: fx.Node, gm: fx.GraphModule) -> tuple[str, dict]:
    """torchvision's ``shifted_window_attention(x, qkv_weight, proj_weight, relative_position_bias, window_size,
    num_heads, shift_size, attention_dropout, dropout, qkv_bias, proj_bias, logit_scale)`` (a Swin block's, which
    torch.fx keeps as one call); a ``logit_scale`` makes it Swin V2's cosine attention, whose position bias an MLP
    computes (:func:`_position_bias_mlp`)."""
    attrs: dict[str, Any] = {"embed_dim": int(n.args[0].meta["tensor_meta"].shape[-1]),
                             "num_heads": int(_arg(n, 5, "num_heads")),
                             "window_size": [int(v) for v in _arg(n, 4, "window_size")],
                             "shift_size": [int(v) for v in _arg(n, 6, "shift_size")],
                             "bias": _arg(n, 9, "qkv_bias") is not None}
    if (_arg(n, 10, "proj_bias") is not None) != attrs["bias"]:
        raise ValueError("window attention with a bias on one projection only has no description op")
    for key, i in (("attention_dropout", 7), ("dropout", 8)):
        if float(_arg(n, i, key, 0.0)):
            attrs[key] = float(_arg(n, i, key, 0.0))
    if _arg(n, 11, "logit_scale") is not None:
        attrs["cosine"] = True
    hidden, _ = _position_bias_mlp(n, gm)
    if hidden:
        attrs["position_bias_mlp"] = hidden
    return "window_attention", attrs


def _position_bias_mlp(n: fx.Node, gm: fx.GraphModule) -> tuple[int, list[fx.Node]]:
    """How Swin V2's window attention ``n`` computes its position bias, ``16 sigmoid`` of a two-layer MLP
    (``Linear(2, hidden)``, ``ReLU``, ``Linear(hidden, heads, bias=False)``) over a buffer of coordinates: the
    hidden width and the nodes that do it (none for a table of biases, Swin V1's ``_get_relative_position_bias`` of
    a parameter). Another way of computing it is a ``ValueError`` naming the node."""
    bias = _arg(n, 3, "relative_position_bias")
    if not isinstance(bias, fx.Node):
        raise ValueError(f"window attention's position bias is {bias!r}, not a tensor")
    if getattr(bias.target, "__name__", "") in _PARAMETER_CALLS:
        return 0, []
    walked = [bias]  # from the bias back to the coordinates, by each node's first tensor argument
    while len(walked) < 8 and any(isinstance(a, fx.Node) for a in walked[-1].args):
        walked.append(next(a for a in walked[-1].args if isinstance(a, fx.Node)))
    walked += [None] * (8 - len(walked))
    times_16, _sigmoid, _gather, _reshape, *mlp, coordinates = walked
    targets = [getattr(w, "target", None) for w in walked]
    layers = [gm.get_submodule(w.target) if w is not None and w.op == "call_module" else None for w in mlp]
    if not (targets[0] in (operator.mul, torch.mul) and 16 in times_16.args and targets[1] in (torch.sigmoid, "sigmoid")
            and getattr(targets[2], "__name__", "") in _PARAMETER_CALLS and targets[3] in _RESHAPES
            and isinstance(layers[0], nn.Linear) and layers[0].bias is None and isinstance(layers[1], nn.ReLU)
            and isinstance(layers[2], nn.Linear) and layers[2].in_features == 2 and layers[2].bias is not None
            and getattr(coordinates, "op", None) == "get_attr"):
        raise ValueError(f"window attention's position bias ({bias.name}) is neither a table nor Swin V2's MLP "
                         "(16 sigmoid of Linear(2, h), ReLU, Linear(h, heads, bias=False) over its coordinates)")
    return int(layers[2].out_features), walked


#: torchvision's Swin functions that torch.fx records as one call each (``torch.fx.wrap``), by name
_NAMED_CALLS: dict[str, Callable[[fx.Node, fx.GraphModule], tuple[str, dict]]] = {
    "shifted_window_attention": _window_attention_call,
    "_patch_merging_pad": lambda n, gm: ("patch_merge", {}),
}


#: a wrapped call that computes a module's parameter for the op after it: read as that parameter (its first
#: argument), taken in by that op (Swin's relative position bias, from its table)
_PARAMETER_CALLS = frozenset({"_get_relative_position_bias"})
_RESHAPES = {"view", "reshape", torch.reshape, "view_as", "reshape_as"}  # to the shape the trace gives
_ALIASES = {"contiguous", "clone"}  # ops that do not change the value: the node is replaced by its input


def _is_stochastic_depth(target: Any) -> bool:
    return getattr(target, "__name__", "") == "stochastic_depth"


class _NoOp(UserError):
    """A layer or call of a kind the description has no op for: ``what`` names the node, ``kind`` its kind, ``node``
    the fx node of that op (for a part of its tuple, the op that made the tuple)."""

    def __init__(self, what: str, kind: str, node: fx.Node) -> None:
        super().__init__(what)
        self.what, self.kind, self.node = what, kind, node


_STD_CALLS = {torch.std, "std"}


def _unbatched_product(n: fx.Node) -> tuple[str, dict]:
    """``torch.mm``/``addmm`` (2-D matrices: the batch is the first one's rows, which a description's per-sample
    nodes cannot contract over) and ``baddbmm``/``addbmm`` (one GEMM that adds its input, scaled, to the product,
    which no description op runs as one): ``ValueError`` naming the call and what describes instead."""
    name = getattr(n.target, "__name__", n.target)
    if name in ("mm", "addmm"):
        layer = "nn.Linear(K, N, bias=False)" if name == "mm" else "nn.Linear(K, N)"
        raise ValueError(f"torch.{name} multiplies 2-D matrices, the batch the first one's rows, and has no "
                         f"description op; a [B, K] activation times a layer's weight is {layer}, a product of two "
                         "activations batched matrices ([B, M, K] @ [B, K, N], torch.matmul)")
    raise ValueError(f"torch.{name} (beta * input + alpha * the product, one GEMM) has no description op; write "
                     "torch.bmm(b1, b2) * alpha + input, three nodes of their own")


for _key in (torch.mm, "mm", torch.addmm, "addmm", torch.baddbmm, "baddbmm", torch.addbmm, "addbmm"):
    FUNCTION_OPS[_key] = _unbatched_product


def _fused_attention(n: fx.Node) -> tuple[str, dict]:
    """``F.scaled_dot_product_attention`` (timm's attention where its fused attention is on): ``ValueError`` naming
    the hand-written products that describe (its kernel, flash or memory-efficient on a GPU, the math one
    elsewhere, keeps what no description op follows)."""
    raise ValueError("F.scaled_dot_product_attention (a fused kernel: flash or memory-efficient on a GPU) has no "
                     "description op; write softmax(q @ k.transpose(-2, -1) * scale) @ v, which describes (timm: set "
                     "TIMM_FUSED_ATTN=0 before importing it)")


FUNCTION_OPS[F.scaled_dot_product_attention] = _fused_attention


def _logsumexp_call(n: fx.Node) -> tuple[str, dict]:
    """``torch.logsumexp(x, dim, keepdim)``/``x.logsumexp``: the op logsumexp over ``dim`` (one or several, counted
    from the front); one over the batch's, or over every dimension, is refused by name."""
    dims = _arg(n, 1, "dim")
    if dims is None or dims == () or dims == []:
        raise ValueError("a logsumexp over every dimension (no dim given) reduces the batch too; give dim=")
    return "logsumexp", {"dims": _dims_after_the_batch(n, dims, "logsumexp"),
                         "keepdim": bool(_arg(n, 2, "keepdim", False))}


for _key in (torch.logsumexp, "logsumexp"):
    FUNCTION_OPS[_key] = _logsumexp_call


def _cumsum_call(n: fx.Node) -> tuple[str, dict]:
    """``torch.cumsum(x, dim)``/``x.cumsum(dim)``: the op cumsum along ``dim`` (counted from the front); one along
    the batch's, or into another dtype (``dtype=``), is refused by name."""
    (dim,) = _dims_after_the_batch(n, _arg(n, 1, "dim"), "cumsum")
    if n.kwargs.get("dtype") is not None:
        raise ValueError(f"a cumsum into dtype {n.kwargs['dtype']} has no description op (a description's tensors are "
                         "float32); leave dtype out")
    return "cumsum", {"dim": dim}


for _key in (torch.cumsum, "cumsum"):
    FUNCTION_OPS[_key] = _cumsum_call

#: Comparisons of a tensor and a number (the calls, operators and methods torch.fx records) -> where's compare.
_COMPARES: dict[Any, str] = {}
for _name, _keys in (("gt", (operator.gt, torch.gt, torch.greater, "gt", "greater")),
                     ("ge", (operator.ge, torch.ge, torch.greater_equal, "ge", "greater_equal")),
                     ("lt", (operator.lt, torch.lt, torch.less, "lt", "less")),
                     ("le", (operator.le, torch.le, torch.less_equal, "le", "less_equal")),
                     ("eq", (operator.eq, torch.eq, "eq")), ("ne", (operator.ne, torch.ne, torch.not_equal, "ne",
                                                                   "not_equal"))):
    _COMPARES.update(dict.fromkeys(_keys, _name))
#: A comparison read the other way round (a number first: ``torch.gt(0.5, x)`` is ``x < 0.5``).
_REVERSED = {"gt": "lt", "ge": "le", "lt": "gt", "le": "ge", "eq": "eq", "ne": "ne"}


def _compared(n: Any) -> tuple[str, float | None] | None:
    """Where fx node ``n`` compares a tensor with a number (``x > 0``, ``m.ge(0.5)``, ``torch.lt(0.5, x)``): (its
    compare, read with the tensor first, and the number); of two tensors (``a > b``): (its compare, None); None for
    anything else."""
    if not isinstance(n, fx.Node) or n.op not in ("call_function", "call_method") or n.target not in _COMPARES \
            or len(n.args) != 2 or n.kwargs:
        return None
    first, second = n.args
    if _is_tensor(first) and not _is_tensor(second):
        compare, number = _COMPARES[n.target], second
    elif _is_tensor(second) and not _is_tensor(first):
        compare, number = _REVERSED[_COMPARES[n.target]], first
    elif _is_tensor(first) and _is_tensor(second):
        return _COMPARES[n.target], None
    else:
        return None
    number = _shape_value(number)
    if not _is_number(number):
        return None
    return compare, float(number)


def _is_condition_read(user: fx.Node, n: fx.Node) -> bool:
    """Whether ``user`` reads ``n`` as torch.where's condition alone (or as x.where's, refused by the where), as
    x.masked_fill's mask (of a number), or as a mask multiplied into a tensor (:func:`_mask_multiplied`), cast to
    float32 first or not."""
    if user.op == "call_method" and user.target == "where":
        return True
    multiplied = _mask_multiplied(user)
    if multiplied is not None:
        return multiplied[0] is n
    if _float_mask_of(user) is n:  # (x > 0).float(), each of its readers multiplying it into a tensor
        return bool(user.users) and all((_mask_multiplied(u) or (None,))[0] is user for u in user.users)
    if user.target in _MASKED_FILLS:
        return len(user.args) == 3 and user.args[1] is n and user.args[0] is not n and not user.kwargs
    return user.op == "call_function" and user.target is torch.where and len(user.args) == 3 and \
        user.args[0] is n and n not in user.args[1:] and not user.kwargs


def _comparison(n: fx.Node) -> tuple[str, dict]:
    """A comparison of a tensor with a number or with another tensor, every reader of which takes it as
    torch.where's condition (or multiplies it into a tensor): no node of its own (a description has no boolean
    tensors), each where's op ``where`` holds it. Read otherwise (``mask.float()``, two masks and-ed) it has no
    description op."""
    if _compared(n) is None or not n.users or not all(_is_condition_read(u, n) for u in n.users):
        raise ValueError("a comparison read by anything but torch.where's condition has no description op (a "
                         "description has no boolean tensors); torch.where(x > t, a, b) of a number t or a tensor t "
                         "describes")
    return "alias", {}


def _fixed_mask(condition: Any) -> tuple[str, None] | None:
    """Where ``condition`` is a module's boolean tensor (a ``get_attr``: a registered mask, or one the trace computed
    once from a buffer, ``self.mask == 0``): a where's ``("ne", None)`` (a where holding it as a boolean buffer of
    its shape, ``mask_shape``, read as it is); None for anything else."""
    if isinstance(condition, fx.Node) and condition.op == "get_attr" and _is_tensor(condition) \
            and condition.meta["tensor_meta"].dtype == torch.bool:
        return "ne", None
    return None


def _condition_attrs(compared: tuple[str, float | None], condition: fx.Node, n: fx.Node) -> dict[str, Any]:
    """A where's (fx node ``n``'s) attrs of its condition ``compared`` (:func:`_compared`): of a number, its compare
    and threshold; of two tensors, threshold 0 and ``compare_inputs`` (the condition's two tensors its first two
    inputs); of a fixed mask (:func:`_fixed_mask`), ``ne`` 0 and its ``mask_shape``, which spans no batch (a
    ``ValueError`` where it does: a mask of one size of batch)."""
    if _fixed_mask(condition) is not None:
        mask = [int(v) for v in condition.meta["tensor_meta"].shape]
        if len(mask) >= len(n.meta["tensor_meta"].shape) and mask[0] != 1:
            raise ValueError(f"a fixed mask of shape {mask}, a mask per sample of a batch of {mask[0]} (its first "
                             "dimension the batch's), has no description op; a mask of size 1 there (or none) "
                             "describes")
        return {"compare": "ne", "threshold": 0.0, "mask_shape": mask}
    if compared[1] is None:
        return {"compare": compared[0], "threshold": 0.0, "compare_inputs": True}
    return {"compare": compared[0], "threshold": compared[1]}


for _key in _COMPARES:
    FUNCTION_OPS[_key] = _comparison


def _where_call(n: fx.Node) -> tuple[str, dict]:
    """``torch.where(condition, a, b)`` (or ``a.where(condition, b)``) of a condition comparing a tensor with a
    number (``x > 0``; a mask ``m >= 0.5`` computed from the data) and a and b tensors, or one of them a number: the
    op where. Of one argument (the indices where it holds), of another condition, or of two numbers, refused by
    name."""
    if n.target == "where" and (len(n.args) != 3 or n.kwargs):
        raise ValueError("x.where(condition, y) of keyword arguments has no description op; write x.where(condition, "
                         "y) or torch.where(condition, x, y)")
    if len(n.args) != 3 or n.kwargs:
        raise ValueError("torch.where of one argument (the indices where it holds) has no description op")
    condition, a, b = (n.args[1], n.args[0], n.args[2]) if n.target == "where" else n.args  # x.where(c, y)
    compared = _compared(condition) or _fixed_mask(condition)
    if compared is None:
        raise ValueError("a torch.where whose condition is not a comparison of a tensor with a number or another "
                         "tensor (x > 0, m >= 0.5, a > b), nor a module's boolean mask, has no description op (a "
                         "description has no boolean tensors)")
    attrs: dict[str, Any] = _condition_attrs(compared, condition, n)
    for key, branch in (("if_true", a), ("if_false", b)):
        if not _is_tensor(branch):
            value = _shape_value(branch)
            if not _is_number(value):
                raise ValueError(f"a torch.where of a branch {branch!r} (neither a tensor nor a number) has no "
                                 "description op")
            attrs[key] = float(value)
    if "if_true" in attrs and "if_false" in attrs:
        raise ValueError("a torch.where of two numbers is its condition as numbers, a boolean tensor made float, "
                         "which has no description op; give a tensor for one branch")
    return "where", attrs


for _key in (torch.where, "where"):
    FUNCTION_OPS[_key] = _where_call
_MASKED_FILLS = (torch.masked_fill, "masked_fill", "masked_fill_")


def _masked_fill_call(n: fx.Node) -> tuple[str, dict]:
    """``x.masked_fill(mask, value)``/``torch.masked_fill`` of a mask comparing a tensor with a number and a number
    value: torch.where(mask, value, x), the op where (its inputs the mask's tensor, then x: put in that order by the
    converter); ``x.masked_fill_`` the same written into x (``inplace``). Another mask, or a tensor value, is refused
    by name."""
    compared = (_compared(n.args[1]) or _fixed_mask(n.args[1])) if len(n.args) == 3 else None
    value = _shape_value(n.args[2]) if len(n.args) == 3 else None
    if compared is None or not _is_number(value):
        raise ValueError(f"a {_target_name(n.target)} of anything but a mask "
                         "comparing a tensor with a number or a tensor (x < 0, a < b), or a module's boolean mask, "
                         "and a number value has no description op")
    attrs = {**_condition_attrs(compared, n.args[1], n), "if_true": float(value)}
    return "where", {**attrs, "inplace": True} if n.target == "masked_fill_" else attrs


for _key in _MASKED_FILLS:
    FUNCTION_OPS[_key] = _masked_fill_call


def _affine_grid_call(n: fx.Node) -> tuple[str, dict]:
    """``F.affine_grid(theta, size, align_corners)`` of each sample's [2, 3] matrix (a spatial transformer's
    localisation net's output): the op affine_grid, its [H, W] the traced grid's (a size read off a map, ``x.size()``,
    is that map's at the traced shape); torch's default align_corners (None) is False. A 3-D grid (a [2, 3, 4] theta,
    a 5-D size) is refused by name."""
    theta, grid = n.args[0].meta["tensor_meta"].shape, n.meta["tensor_meta"].shape
    if len(theta) != 3 or list(theta[1:]) != [2, 3] or len(grid) != 4:
        raise ValueError(f"an affine_grid of a theta of shape {list(theta)} (a volume's, [N, 3, 4], or not a "
                         "matrix per sample) has no description op; a 2-D grid of [N, 2, 3] matrices describes")
    return "affine_grid", {"size": [int(grid[1]), int(grid[2])],
                           "align_corners": bool(_arg(n, 2, "align_corners", None) or False)}


def _grid_sample_call(n: fx.Node) -> tuple[str, dict]:
    """``F.grid_sample(x, grid, mode, padding_mode, align_corners)`` of a [N, C, H, W] map and an [N, Ho, Wo, 2]
    grid: the op grid_sample; a mode other than bilinear, a padding other than zeros, or a volume's 5-D input is
    refused by name."""
    mode, padding = _arg(n, 2, "mode", "bilinear"), _arg(n, 3, "padding_mode", "zeros")
    if mode != "bilinear" or padding != "zeros":
        raise ValueError(f"a grid_sample of mode {mode!r} and padding_mode {padding!r} has no description op (only "
                         "mode 'bilinear' with padding_mode 'zeros')")
    if len(n.args[0].meta["tensor_meta"].shape) != 4:
        raise ValueError("a grid_sample of anything but an [N, C, H, W] map (a volume's 5-D input) has no "
                         "description op")
    return "grid_sample", {"mode": mode, "padding_mode": padding,
                           "align_corners": bool(_arg(n, 4, "align_corners", None) or False)}


FUNCTION_OPS[F.affine_grid] = _affine_grid_call
FUNCTION_OPS[F.grid_sample] = _grid_sample_call


def _op_of(n: fx.Node, gm: fx.GraphModule) -> tuple[str, dict]:
    """The description op and attrs of ``n``; :class:`_NoOp` for a layer or call of a kind it has no op for."""
    if n.op == "call_module":
        m = gm.get_submodule(n.target)
        if type(m).__name__ in _LEAF_MODULES:
            return _LEAF_MODULES[type(m).__name__](m)
        whole = _described_whole(m)
        if whole is not None:
            return whole[0], dict(whole[1])
        if isinstance(m, nn.Flatten):
            return _flatten(n, m.start_dim, m.end_dim)
        if isinstance(m, nn.ConvTranspose2d):  # its output size, where given at the call, read from the trace
            return _conv_transpose(m, n)
        if isinstance(m, nn.Softmax):
            return _softmax_attrs(n, m.dim)
        if isinstance(m, nn.InstanceNorm2d):
            return _instancenorm(m, n)
        if isinstance(m, nn.SyncBatchNorm):
            return _sync_bn(m, n)
        if isinstance(m, nn.Unflatten):
            return _unflatten(n, m.dim)
        if isinstance(m, nn.LocalResponseNorm):
            return _local_response_norm(n, m.size, m.alpha, m.beta, m.k)
        if isinstance(m, nn.FractionalMaxPool2d):
            return _fractional_maxpool(n, m.kernel_size, m.return_indices, m._random_samples)
        if isinstance(m, (nn.Dropout1d, nn.Dropout2d, nn.Dropout3d)):
            return _channel_dropout(type(m).__name__.lower(), len(n.args[0].meta["tensor_meta"].shape), m.p)
        if isinstance(m, nn.LogSoftmax):
            return _softmax_attrs(n, m.dim, "log_softmax")
        if isinstance(m, nn.GLU):
            return _glu_attrs(n, m.dim)
        if isinstance(m, nn.Unfold):  # as its F.unfold call
            return _unfold_attrs(n, m.kernel_size, m.dilation, m.padding, m.stride)
        if isinstance(m, nn.Fold):  # as its F.fold call
            return _fold_attrs(n, m.kernel_size, m.dilation, m.padding, m.stride)
        if isinstance(m, (nn.AdaptiveAvgPool2d, nn.AdaptiveMaxPool2d)):
            return _adaptive_pool(f"{type(m).__name__.lower()}", n)
        if isinstance(m, nn.Softmax2d):  # over the channels: torch's dim -3 of a [N, C, H, W] map
            return _softmax_attrs(n, -3)
        if isinstance(m, nn.Upsample):  # and its subclasses, UpsamplingNearest2d and UpsamplingBilinear2d
            return _interpolate_attrs(n, m.mode, m.align_corners, m.scale_factor, m.recompute_scale_factor, False)
        for cls, fn in MODULE_OPS:
            if isinstance(m, cls):
                return fn(m)
        raise _NoOp(f"module '{n.target}' of type {type(m).__name__}", type(m).__name__, n)
    target = n.target
    if n.op == "call_function" and _is_stochastic_depth(target):
        return "identity", {}
    if target in _RESHAPES:
        return "reshape", {"shape": _shape(n)}
    if target in _ALIASES:
        return "alias", {}
    if target is getattr and n.args[1] in _MATRIX_TRANSPOSES:
        return _matrix_transpose_attr(n)
    if target in FUNCTION_OPS:
        return FUNCTION_OPS[target](n)
    if n.op == "call_function" and getattr(target, "__name__", "") in _NAMED_CALLS:
        return _NAMED_CALLS[target.__name__](n, gm)
    source = n.args[0] if target in (operator.getitem, getattr) and n.args else None
    if isinstance(source, fx.Node) and source.op != "call_module" and "tensor_meta" in source.meta \
            and not hasattr(source.meta["tensor_meta"], "shape"):
        n, target = source, source.target  # a part of a tuple (x.max(2)[0], x.topk(1).values): the op that made it
    label = _target_name(target)
    raise _NoOp(f"{n.op} '{label}' (node {n.name}{_research_form(n, gm)})", f"{n.op} {label}", n)


#: Calls that make a tensor from numbers alone (the trace's sizes among them).
_MADE_FROM_NUMBERS = {torch.linspace, torch.logspace, torch.arange, torch.meshgrid}


def _research_form(n: fx.Node, gm: fx.GraphModule) -> str:
    """What research code makes with ``n``, a call without a description op, where it is a block's known form
    (said after the node's name): values made from numbers alone (CoordConv's coordinate channels), a parameter
    indexed by a tensor (an embedding's or a relative position bias's lookup); '' otherwise."""
    if n.op == "call_function" and n.target in _MADE_FROM_NUMBERS:
        return (": values made in the forward from numbers alone, as CoordConv's coordinate channels; those of "
                "torch.linspace viewed along the rows or the columns and expanded over the map, x.shape's sizes, "
                "describe: the op linspace, as do the PyTorch port's AddCoords ones, torch.arange(n).repeat(1, m, 1) "
                "scaled by .float() / (n - 1) and copied over the batch by .repeat(b, 1, 1, 1).transpose(2, 3)")
    if n.target is operator.getitem and len(n.args) == 2 and isinstance(n.args[0], fx.Node) \
            and n.args[0].op == "get_attr" and n.args[0].target in dict(gm.named_parameters()):
        indices: list[fx.Node] = []
        fx.node.map_arg(n.args[1], lambda a: indices.append(a) if _is_tensor(a) else None)
        if indices:
            return (f": the parameter {n.args[0].target} indexed by a tensor, an embedding's or a relative "
                    "position bias's lookup")
    return ""
