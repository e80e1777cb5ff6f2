"""What each torch layer (``nn.Module``) is as a description op: its attrs read off the layer (:data:`MODULE_OPS`,
and the layers a trace keeps whole, :data:`_LEAF_MODULES`), with the attrs builders a layer and its functional
call share (``_pad_attrs``, ``_softmax_attrs``, ``_interpolate_attrs``, ...)."""
from __future__ import annotations

from typing import Any, Callable

import torch.fx as fx
from torch import nn
from torch.nn.utils import parametrizations, parametrize, prune
from torch.nn.utils.spectral_norm import SpectralNorm
from torch.nn.utils.weight_norm import WeightNorm

from perf4sight.ir.schema import INTERPOLATE_MODES, PAD_MODES, output_padding_problem
from perf4sight.ir.shapes import transposed_output_padding
from perf4sight.ir.fx_values import _pair, _shape


def _padding(m: nn.Conv2d) -> list[int]:
    """A convolution's padding as two numbers: ``'valid'`` is none, ``'same'`` (stride 1) half the dilated kernel on
    each side, where that is a whole number (torch pads an even dilated kernel more on one side than the other,
    which a description's padding cannot say)."""
    if m.padding == "valid":
        return [0, 0]
    if m.padding != "same":
        return _pair(m.padding)
    reach = [d * (k - 1) for d, k in zip(_pair(m.dilation), _pair(m.kernel_size))]
    if any(r % 2 for r in reach):
        raise ValueError(f"a convolution with padding='same' and kernel {_pair(m.kernel_size)} (dilation "
                         f"{_pair(m.dilation)}) pads one side more than the other, which a description cannot say; "
                         "give the padding as numbers")
    return [r // 2 for r in reach]


def _weight_reparametrisation(m: nn.Module, parametrization: type, hook: type) -> tuple[str, Any] | None:
    """``("parametrization", it)`` where ``m`` (an ``nn.Conv2d``, ``nn.Conv1d`` or ``nn.Linear``) has one torch
    parametrization of class ``parametrization`` over dim 0 on its weight and nothing else, ``("hook", it)`` where its
    one reparametrising forward pre-hook is of class ``hook`` over dim 0 of its weight; None otherwise."""
    if not isinstance(m, (nn.Conv2d, nn.Conv1d, nn.Linear)):
        return None
    hooks = [h for h in m._forward_pre_hooks.values() if isinstance(h, (WeightNorm, SpectralNorm,
                                                                        prune.BasePruningMethod))]
    if parametrize.is_parametrized(m):
        chains = dict(m.parametrizations.items())
        chain = list(chains.get("weight", []))
        alone = len(chain) == 1 and isinstance(chain[0], parametrization) and chain[0].dim == 0
        return ("parametrization", chain[0]) if alone and list(chains) == ["weight"] and not hooks else None
    alone = len(hooks) == 1 and isinstance(hooks[0], hook) and hooks[0].name == "weight" and hooks[0].dim == 0
    return ("hook", hooks[0]) if alone else None


def weight_norm_form(m: nn.Module) -> str | None:
    """The ``weight_norm`` (schema.WEIGHT_NORMS) of an ``nn.Conv2d``, ``nn.Conv1d`` (a conv2d of a one-pixel high
    view: the same norms, g of [out, 1, 1] for [out, 1, 1, 1]) or ``nn.Linear`` whose weight, and nothing else,
    torch's weight_norm computes over dim 0 (each output channel's norm): ``"parametrization"``
    (``torch.nn.utils.parametrizations.weight_norm``, alone) or ``"hook"`` (``torch.nn.utils.weight_norm``'s forward
    pre-hook, its one reparametrising hook); None otherwise (another parametrization or hook, another dim, none)."""
    found = _weight_reparametrisation(m, parametrizations._WeightNorm, WeightNorm)
    return found[0] if found else None


def spectral_norm_form(m: nn.Module) -> dict | None:
    """The attrs of an ``nn.Conv2d``, ``nn.Conv1d`` or ``nn.Linear`` whose weight, and nothing else, torch's
    spectral_norm divides by its largest singular value (over dim 0, the default: the weight viewed [out, -1]), one
    power iteration (or ``n_power_iterations``) a training forward: ``spectral_norm`` ``"parametrization"``
    (``torch.nn.utils.parametrizations.spectral_norm``, alone) or ``"hook"`` (``torch.nn.utils.spectral_norm``'s
    forward pre-hook, its one reparametrising hook), with ``spectral_norm_iterations`` and ``spectral_norm_eps``
    where not torch's defaults (1, 1e-12); None otherwise."""
    found = _weight_reparametrisation(m, parametrizations._SpectralNorm, SpectralNorm)
    if found is None:
        return None
    form, how = found
    attrs: dict = {"spectral_norm": form}
    if how.n_power_iterations != 1:
        attrs["spectral_norm_iterations"] = int(how.n_power_iterations)
    if how.eps != 1e-12:
        attrs["spectral_norm_eps"] = float(how.eps)
    return attrs


def _weight_norm_attr(m: nn.Module) -> dict:
    form = weight_norm_form(m)
    return {"weight_norm": form} if form else spectral_norm_form(m) or {}


def _conv(m: nn.Conv2d) -> tuple[str, dict]:
    """``nn.Conv2d``; one padding other than with zeros (``padding_mode``) pads first (:func:`_conv_pad`), the
    convolution itself then padding nothing, as torch runs it."""
    _conv_pad(m)  # a padding mode no pad op has refused here, by name
    padding = _padding(m) if m.padding_mode == "zeros" else [0, 0]
    return "conv2d", {"in_channels": m.in_channels, "out_channels": m.out_channels,
                      "kernel_size": _pair(m.kernel_size), "stride": _pair(m.stride), "padding": padding,
                      "dilation": _pair(m.dilation), "groups": m.groups, "bias": m.bias is not None,
                      **_weight_norm_attr(m)}


def _conv_pad(m: nn.Conv2d) -> tuple[str, dict] | None:
    """The ``pad`` a convolution padding other than with zeros runs before it (torch's ``_conv_forward``: ``F.pad`` of
    its ``_reversed_padding_repeated_twice``, [left, right, top, bottom], in its ``padding_mode``, then the
    convolution of padding 0; ``'same'`` pads more at the right and bottom where the dilated kernel is even; a padding
    of nothing still copies the input); None for a convolution padding with zeros."""
    if m.padding_mode == "zeros":
        return None
    try:
        return _pad_attrs(m._reversed_padding_repeated_twice, m.padding_mode, None)
    except ValueError:
        raise ValueError(f"a convolution with padding_mode='{m.padding_mode}' has no description op (it pads first, "
                         f"and a pad op pads in mode {', '.join(PAD_MODES)}); pad with one of those") from None


def _conv_transpose_attrs(cin: int, cout: int, kernel: Any, stride: Any, padding: Any, output_padding: Any,
                          dilation: Any, groups: int, bias: bool) -> dict:
    """A ``conv_transpose2d``'s attrs; ``ValueError`` for an output padding torch refuses to run (its meta kernel, which
    the shapes come from, takes any)."""
    attrs = {"in_channels": int(cin), "out_channels": int(cout), "kernel_size": _pair(kernel), "stride": _pair(stride),
             "padding": _pair(padding), "output_padding": _pair(output_padding), "dilation": _pair(dilation),
             "groups": int(groups), "bias": bool(bias)}
    problem = output_padding_problem(attrs["output_padding"], attrs["stride"], attrs["dilation"])
    if problem:
        raise ValueError(f"a transposed convolution's {problem}")
    return attrs


def _conv_transpose(m: nn.ConvTranspose2d, n: fx.Node) -> tuple[str, dict]:
    """``nn.ConvTranspose2d``, called as ``m(x)`` or ``m(x, output_size)``: an output size is read as the output
    padding that makes it (what torch does with it), from the shapes the trace gives."""
    output_padding = _pair(m.output_padding)
    if len(n.args) > 1 or n.kwargs.get("output_size") is not None:
        output_padding = transposed_output_padding(list(n.args[0].meta["tensor_meta"].shape)[1:], _shape(n),
                                                   _pair(m.kernel_size), _pair(m.stride), _pair(m.padding),
                                                   _pair(m.dilation))
    return "conv_transpose2d", _conv_transpose_attrs(m.in_channels, m.out_channels, m.kernel_size, m.stride,
                                                     m.padding, output_padding, m.dilation, m.groups,
                                                     m.bias is not None)


def _bn(m: nn.BatchNorm2d) -> tuple[str, dict]:
    """``nn.BatchNorm2d`` (1d, SyncBatchNorm): its eps, affine and running statistics where not torch's defaults
    (:func:`_running_statistics`); a layer rebuilt on the meta device from a cumulative average (``cumulative_average``,
    run there as the momentum 0.1) of the momentum None."""
    attrs: dict[str, Any] = {"num_features": m.num_features}
    if m.eps != 1e-5:
        attrs["eps"] = m.eps
    if not m.affine:  # written only when false: a description of an affine batch norm reads as it always did
        attrs["affine"] = False
    momentum = None if getattr(m, "cumulative_average", False) else m.momentum
    return "batchnorm2d", {**attrs, **_running_statistics(m.track_running_stats, momentum)}


def _running_statistics(tracked: bool, momentum: float | None) -> dict[str, Any]:
    """A batch norm's attrs of its running statistics where not torch's defaults: none kept (``track_running_stats``
    false: no buffers, the batch's statistics in evaluation too), or their ``momentum`` where not 0.1 (None: torch's
    cumulative average, each batch weighing 1 / the batches seen)."""
    if not tracked:
        return {"track_running_stats": False}
    return {} if momentum == 0.1 else {"momentum": None if momentum is None else float(momentum)}


def _sync_bn(m: nn.SyncBatchNorm, n: fx.Node) -> tuple[str, dict]:
    """``nn.SyncBatchNorm`` (a model made ready for several GPUs by ``convert_sync_batchnorm``) of a
    ``[N, C, H, W]`` map, or of ``[N, C]`` or ``[N, C, L]`` (a BatchNorm1d's input): a batchnorm2d, which is what it
    runs in a step on one device (torch syncs its statistics only inside a process group; otherwise its forward is
    ``F.batch_norm``, a BatchNorm2d's). Of a volume (a BatchNorm3d's), ``ValueError``."""
    if len(n.args[0].meta["tensor_meta"].shape) not in (2, 3, 4):
        raise ValueError("a SyncBatchNorm of anything but a [N, C, H, W] map, [N, C] or [N, C, L] has no description "
                         "op")
    return _bn(m)


def _maxpool(m: nn.MaxPool2d) -> tuple[str, dict]:
    if m.return_indices:  # its values alone, read as its tuple's [0], are the op: _pool_part
        raise ValueError("a max pool's (values, indices) read whole has no description op; read its values ([0])")
    attrs = {"kernel_size": _pair(m.kernel_size), "stride": _pair(m.stride or m.kernel_size),
             "padding": _pair(m.padding), "ceil_mode": bool(m.ceil_mode)}
    if _pair(m.dilation) != [1, 1]:
        attrs["dilation"] = _pair(m.dilation)
    return "maxpool2d", attrs


def _avgpool(m: nn.AvgPool2d) -> tuple[str, dict]:
    if m.divisor_override is not None:
        raise ValueError(f"average pooling with divisor_override={m.divisor_override} has no description op")
    return "avgpool2d", {"kernel_size": _pair(m.kernel_size), "stride": _pair(m.stride or m.kernel_size),
                         "padding": _pair(m.padding), "ceil_mode": bool(m.ceil_mode),
                         "count_include_pad": bool(m.count_include_pad)}


_FIXED_SAMPLES = "a fractional max pool that takes fixed random samples has no description op"


def _fractional_maxpool(n: fx.Node, kernel_size: Any, return_indices: Any, samples: Any) -> tuple[str, dict]:
    """``nn.FractionalMaxPool2d`` or ``F.fractional_max_pool2d`` of a ``[N, C, H, W]`` map: its windows and the
    output size the trace gives (of an ``output_size`` or an ``output_ratio``). With its indices asked for, or with
    fixed ``_random_samples`` (torch then draws none), ``ValueError`` (the values of one that returns its indices:
    :func:`_pool_part`)."""
    if return_indices:
        raise ValueError("a fractional max pool's (values, indices) read whole has no description op; read its "
                         "values ([0])")
    if samples is not None:
        raise ValueError(_FIXED_SAMPLES)
    return _fractional_maxpool_attrs(n.args[0], _shape(n), kernel_size)


def _fractional_maxpool_attrs(source: fx.Node, out: list[int] | None, kernel_size: Any) -> tuple[str, dict]:
    """The op of a fractional max pool of ``source`` whose values are of per-sample shape ``out``."""
    if len(source.meta["tensor_meta"].shape) != 4 or out is None:
        raise ValueError("a fractional max pool of anything but a [N, C, H, W] map has no description op")
    return "fractional_maxpool2d", {"kernel_size": _pair(kernel_size), "output_size": [int(v) for v in out[1:]]}


def _layernorm(m: nn.LayerNorm) -> tuple[str, dict]:
    if m.elementwise_affine and getattr(m, "bias", True) is None:
        raise ValueError("a layer norm with a weight but no bias has no description op")
    return "layernorm", _layernorm_attrs(m.normalized_shape, m.eps, m.elementwise_affine)


def _layernorm_attrs(normalized_shape: Any, eps: float, affine: bool) -> dict:
    shape = [int(normalized_shape)] if isinstance(normalized_shape, int) else [int(s) for s in normalized_shape]
    attrs: dict[str, Any] = {"normalized_shape": shape}
    if eps != 1e-5:
        attrs["eps"] = float(eps)
    if not affine:
        attrs["elementwise_affine"] = False
    return attrs


def _rmsnorm_attrs(normalized_shape: Any, eps: float | None, affine: bool) -> dict:
    """An RMS norm's attrs: eps only where given (torch's None is float32's machine epsilon), elementwise_affine only
    where false."""
    shape = [int(normalized_shape)] if isinstance(normalized_shape, int) else [int(s) for s in normalized_shape]
    return {"normalized_shape": shape, **({"eps": float(eps)} if eps is not None else {}),
            **({} if affine else {"elementwise_affine": False})}


def _groupnorm_attrs(num_groups: Any, num_channels: Any, eps: float, affine: bool) -> dict:
    attrs: dict[str, Any] = {"num_groups": int(num_groups), "num_channels": int(num_channels)}
    if eps != 1e-5:
        attrs["eps"] = float(eps)
    if not affine:  # written only when false, as a batch norm's
        attrs["affine"] = False
    return attrs


def _instancenorm_attrs(num_features: Any, eps: float, affine: bool, momentum: float | None = None) -> dict:
    """An instance norm's attrs; ``momentum`` given (a float, or None for torch's cumulative average, which an
    instance norm runs as 0), one that tracks running statistics (written only then, as its momentum where not
    0.1)."""
    attrs: dict[str, Any] = {"num_features": int(num_features)}
    if eps != 1e-5:
        attrs["eps"] = float(eps)
    if affine:  # written only when true: torch's InstanceNorm2d has no weight and bias by default
        attrs["affine"] = True
    if momentum is not None:
        attrs["track_running_stats"] = True
        if momentum != 0.1:
            attrs["momentum"] = float(momentum)
    return attrs


def _instancenorm(m: nn.InstanceNorm2d, n: fx.Node) -> tuple[str, dict]:
    """``nn.InstanceNorm2d``: its channels its input's where it is neither affine nor tracks running statistics
    (torch then leaves ``num_features`` unused, a mismatch only warned of), its own where it is (torch requires them
    the input's); where it tracks running statistics, their momentum (training normalises each sample by its own
    statistics all the same)."""
    own = m.affine or m.track_running_stats
    channels = m.num_features if own else n.args[0].meta["tensor_meta"].shape[1]
    momentum = (0.0 if m.momentum is None else m.momentum) if m.track_running_stats else None
    return "instancenorm", _instancenorm_attrs(channels, m.eps, m.affine, momentum)


def _inplace_attr(inplace: Any) -> dict:
    """A node's in-place flag: ``{"inplace": True}`` where ``inplace`` holds (truthy), else nothing (out of place: no
    flag)."""
    return {"inplace": True} if inplace else {}


def _hardtanh_attrs(min_val: Any, max_val: Any, inplace: bool) -> tuple[str, dict]:
    """A clamp to ``[min_val, max_val]``: ReLU6's ``[0, 6]`` is the op relu6, any other range a hardtanh; an empty
    range (``min_val >= max_val``, whose output torch makes a constant) ``ValueError``, as the schema refuses it."""
    flag = _inplace_attr(inplace)
    if not float(min_val) < float(max_val):
        raise ValueError(f"a clamp to [{min_val}, {max_val}] (its minimum not below its maximum: a constant output) "
                         "has no description op")
    if (float(min_val), float(max_val)) == (0.0, 6.0):
        return "relu6", flag
    return "hardtanh", {"min_val": float(min_val), "max_val": float(max_val), **flag}


def _pad_attrs(pads: Any, mode: str, value: Any) -> tuple[str, dict]:
    """A ``pad`` of the last two dimensions from torch's ``pad`` ([left, right] or [left, right, top, bottom]; more
    entries only where they are 0), ``mode`` and ``value``. A crop (a negative pad) and a pad of the channels or the
    batch are refused by name."""
    pads = [int(p) for p in pads]
    if any(pads[4:]):
        raise ValueError(f"a pad of {pads} pads the channels or the batch too, which has no description op (a pad "
                         "op pads the height and width)")
    if any(p < 0 for p in pads):
        raise ValueError(f"a pad of {pads} crops (a negative pad), which has no description op; slice instead")
    four = (pads + [0, 0, 0, 0])[:4]
    if mode not in PAD_MODES:
        raise ValueError(f"a pad of mode '{mode}' has no description op (modes: {', '.join(PAD_MODES)})")
    attrs: dict[str, Any] = {"pads": four, "mode": mode}
    if mode == "constant" and value:  # written only where it is not 0
        attrs["value"] = float(value)
    return "pad", attrs


def _adaptive_pool(op: str, n: fx.Node) -> tuple[str, dict]:
    """An adaptive pool's op, its output size the traced output's height and width (an output size of None, the
    input's side kept, is the number it stands for)."""
    return op, {"output_size": list(_shape(n)[-2:])}


def _attention(m: nn.MultiheadAttention) -> tuple[str, dict]:
    if not m.batch_first or not m._qkv_same_embed_dim or m.bias_k is not None or m.add_zero_attn:
        raise ValueError("multi-head attention is described batch first, with query, key and value of one width and "
                         "no added key/value bias or zero attention")
    attrs: dict[str, Any] = {"embed_dim": m.embed_dim, "num_heads": m.num_heads, "bias": m.in_proj_bias is not None}
    if m.dropout:
        attrs["dropout"] = float(m.dropout)
    return "attention", attrs


def _group_attention(m: nn.Module) -> tuple[str, dict]:
    """torchvision's MaxViT attention (``RelativePositionalMultiHeadAttention``): over square windows of ``size``."""
    if m.scale_factor != m.to_qkv.in_features ** -0.5 or m.n_heads * m.head_dim != m.to_qkv.in_features:
        raise ValueError("a MaxViT attention whose heads or scale differ from torchvision's has no description op")
    return "group_attention", {"embed_dim": m.to_qkv.in_features, "num_heads": m.n_heads,
                               "window_size": [m.size, m.size], "bias": m.to_qkv.bias is not None}


def _gelu_attrs(approximate: Any) -> dict:
    """A GELU's attrs: ``approximate`` only where it is torch's tanh approximation (exact GELU: none)."""
    if approximate not in ("none", "tanh"):
        raise ValueError(f"a GELU with approximate={approximate!r} has no description op (none or 'tanh')")
    return {"approximate": "tanh"} if approximate == "tanh" else {}


def _flatten(n: fx.Node, start_dim: Any, end_dim: Any) -> tuple[str, dict]:
    """``flatten(x, start_dim, end_dim)``: a ``flatten`` up to the last dimension, else a ``reshape`` to the shape
    the trace gives (a description's flatten has no end_dim)."""
    rank = len(n.args[0].meta["tensor_meta"].shape)
    if int(start_dim) % rank == 0 and int(end_dim) % rank == rank - 1:
        raise ValueError("a flatten of every dimension merges the batch into each sample's features "
                         "(torch.flatten(x)); flatten from dimension 1: torch.flatten(x, 1)")
    if int(end_dim) % rank == rank - 1:
        return "flatten", {"start_dim": int(start_dim)}
    return "reshape", {"shape": _shape(n)}


def _local_response_norm(n: fx.Node, size: Any, alpha: Any, beta: Any, k: Any) -> tuple[str, dict]:
    """``nn.LocalResponseNorm`` or ``F.local_response_norm`` of a ``[N, C, H, W]`` map (AlexNet's); of another
    input (torch pools a ``[N, C, L]`` one otherwise), ``ValueError``."""
    if len(n.args[0].meta["tensor_meta"].shape) != 4:
        raise ValueError("a local response norm of anything but a [N, C, H, W] map has no description op")
    return "local_response_norm", {"size": int(size), "alpha": float(alpha), "beta": float(beta), "k": float(k)}


def _unflatten(n: fx.Node, dim: Any) -> tuple[str, dict]:
    """``nn.Unflatten(dim, sizes)``, ``torch.unflatten``, ``x.unflatten`` (a decoder's or a generator's vector made a
    map again): a ``reshape`` to the shape the trace gives; of the batch dimension, ``ValueError``."""
    rank = len(n.args[0].meta["tensor_meta"].shape)
    if int(dim) % rank == 0:
        raise ValueError("an unflatten of the batch dimension has no description op (a description is of one image)")
    return "reshape", {"shape": _shape(n)}


def _celu_attrs(alpha: Any, inplace: bool) -> tuple[str, dict]:
    """A CELU of ``alpha`` (not 0: torch's forward refuses it), in place where ``inplace``."""
    return "celu", {"alpha": float(alpha), **_inplace_attr(inplace)}


def _threshold_attrs(threshold: Any, value: Any, inplace: bool) -> tuple[str, dict]:
    """A threshold (x where x > ``threshold``, else ``value``), in place where ``inplace``."""
    return "threshold", {"threshold": float(threshold), "value": float(value), **_inplace_attr(inplace)}


def _rrelu_attrs(lower: Any, upper: Any, inplace: bool) -> tuple[str, dict]:
    """An RReLU of slopes drawn from [lower, upper], in place where ``inplace``. A call of training=False (F.rrelu's
    default: a fixed slope, (lower + upper) / 2) makes and keeps the same noise tensor (torch's rrelu_with_noise
    either way): described as the layer in training, whose slopes are drawn."""
    return "rrelu", {"lower": float(lower), "upper": float(upper), **_inplace_attr(inplace)}


def _alpha_dropout_attrs(p: Any, feature: bool, inplace: bool) -> tuple[str, dict]:
    """An alpha dropout of ``p``, of whole channels where ``feature``, in place where ``inplace``."""
    return "alpha_dropout", {"p": float(p), **({"feature": True} if feature else {}),
                             **_inplace_attr(inplace)}


def _lp_pool(_: Any) -> tuple[str, dict]:
    """An LP pool (nn.LPPool2d, F.lp_pool2d, and their 1-D and 3-D forms): refused, saying why and what describes
    nearly the same."""
    raise ValueError("an LP pool has no description op: torch runs it op by op (x ** p, an average pool, sign(y) * "
                     "relu(|y|), times the window, then ** (1 / p)), a description has no sign op, and its root of p 2 "
                     "would be rebuilt as a square root, which keeps another tensor than torch's pow; where the powers "
                     "are not negative (an even p), F.avg_pool2d(x.pow(p), k, s).mul(k * k).pow(1 / p) (k the window, "
                     "s the stride) describes the same but for the sign's kernels")


def _cross_map_lrn(_: Any) -> tuple[str, dict]:
    """nn.CrossMapLRN2d (Lua Torch's across-channel normalisation, ported): refused, saying why and what describes
    the layer most networks mean by it."""
    raise ValueError("a CrossMapLRN2d has no description op: torch runs it as an autograd Function of its own, a "
                     "running sum over the channels whose window is not LocalResponseNorm's (their outputs differ); "
                     "nn.LocalResponseNorm(size, alpha, beta, k), AlexNet's across-channel normalisation, describes")


def _unfold_attrs(n: fx.Node, kernel_size: Any, dilation: Any, padding: Any, stride: Any) -> tuple[str, dict]:
    """An unfold (im2col: nn.Unfold, F.unfold; an involution's or a local attention's windows) ``n`` of a [N, C, H,
    W] map, its arguments (each an int or a pair) as pairs; of an unbatched [C, H, W] one, ``ValueError`` (a
    description's first dimension is the batch)."""
    if len(n.args[0].meta["tensor_meta"].shape) != 4:
        raise ValueError("an unfold (im2col) of anything but a [N, C, H, W] map has no description op")
    return "unfold", {"kernel_size": _pair(kernel_size), "dilation": _pair(dilation), "padding": _pair(padding),
                      "stride": _pair(stride)}


def _fold_attrs(n: fx.Node, kernel_size: Any, dilation: Any, padding: Any, stride: Any) -> tuple[str, dict]:
    """A fold (col2im: nn.Fold, F.fold; unfold's inverse) ``n`` of [N, C kh kw, L] columns, its arguments as pairs,
    its output size the traced output's height and width (the call's may be read off another map at run time,
    ``x.shape[-2:]``); of unbatched [C kh kw, L] ones, ``ValueError``."""
    if len(n.args[0].meta["tensor_meta"].shape) != 3:
        raise ValueError("a fold (col2im) of anything but [N, C x kh x kw, L] columns has no description op")
    traced = [int(v) for v in n.meta["tensor_meta"].shape[-2:]]
    return "fold", {"output_size": traced, "kernel_size": _pair(kernel_size), "dilation": _pair(dilation),
                    "padding": _pair(padding), "stride": _pair(stride)}


def _inplace(op: str) -> Callable[[nn.Module], tuple[str, dict]]:
    return lambda m: (op, _inplace_attr(getattr(m, "inplace", False)))


#: module type -> (op, attrs). Order matters: subclasses (ReLU6 < Hardtanh) come first.
MODULE_OPS: list[tuple[type, Callable[[Any], tuple[str, dict]]]] = [
    (nn.Conv2d, _conv),
    (nn.BatchNorm2d, _bn),
    (nn.BatchNorm1d, _bn),  # of [N, C] or [N, C, L] (a re-ID or metric-learning head's): the same F.batch_norm
    (nn.Linear, lambda m: ("linear", {"in_features": m.in_features, "out_features": m.out_features,
                                      "bias": m.bias is not None, **_weight_norm_attr(m)})),
    (nn.ReLU, _inplace("relu")),
    (nn.ReLU6, _inplace("relu6")),
    (nn.Hardswish, _inplace("hardswish")),
    (nn.Hardsigmoid, _inplace("hardsigmoid")),
    (nn.SiLU, _inplace("silu")),
    (nn.Sigmoid, lambda m: ("sigmoid", {})),
    (nn.GELU, lambda m: ("gelu", _gelu_attrs(m.approximate))),
    (nn.Tanh, lambda m: ("tanh", {})),
    (nn.LeakyReLU, lambda m: ("leaky_relu", {"negative_slope": float(m.negative_slope), **_inplace_attr(m.inplace)})),
    (nn.ELU, lambda m: ("elu", {"alpha": float(m.alpha), **_inplace_attr(m.inplace)})),
    (nn.Softplus, lambda m: ("softplus", {"beta": float(m.beta), "threshold": float(m.threshold)})),
    (nn.Mish, _inplace("mish")),
    (nn.SELU, _inplace("selu")),
    (nn.CELU, lambda m: _celu_attrs(m.alpha, m.inplace)),
    (nn.LogSigmoid, lambda m: ("log_sigmoid", {})),
    (nn.Hardshrink, lambda m: ("hardshrink", {"lambd": float(m.lambd)})),
    (nn.Softshrink, lambda m: ("softshrink", {"lambd": float(m.lambd)})),
    (nn.Threshold, lambda m: _threshold_attrs(m.threshold, m.value, m.inplace)),
    (nn.RReLU, lambda m: _rrelu_attrs(m.lower, m.upper, m.inplace)),
    *((cls, _lp_pool) for cls in (nn.LPPool1d, nn.LPPool2d, getattr(nn, "LPPool3d", nn.LPPool2d))),
    (nn.CrossMapLRN2d, _cross_map_lrn),
    (nn.AlphaDropout, lambda m: _alpha_dropout_attrs(m.p, False, m.inplace)),
    (nn.FeatureAlphaDropout, lambda m: _alpha_dropout_attrs(m.p, True, m.inplace)),
    (nn.Identity, lambda m: ("identity", {})),
    (nn.MaxPool2d, _maxpool),
    (nn.AvgPool2d, _avgpool),
    (nn.Dropout, lambda m: ("dropout", {"p": float(m.p)})),
    (nn.PReLU, lambda m: ("prelu", {"num_parameters": int(m.num_parameters)})),
    (nn.Flatten, lambda m: ("flatten", {"start_dim": m.start_dim})),
    (nn.LayerNorm, _layernorm),
    (nn.RMSNorm, lambda m: ("rmsnorm", _rmsnorm_attrs(m.normalized_shape, m.eps, m.elementwise_affine))),
    (nn.GroupNorm, lambda m: ("groupnorm", _groupnorm_attrs(m.num_groups, m.num_channels, m.eps, m.affine))),
    (nn.Hardtanh, lambda m: _hardtanh_attrs(m.min_val, m.max_val, m.inplace)),
    (nn.MultiheadAttention, _attention),
    (nn.ConstantPad2d, lambda m: _pad_attrs(m.padding, "constant", m.value)),  # and ZeroPad2d, its subclass
    (nn.ReflectionPad2d, lambda m: _pad_attrs(m.padding, "reflect", None)),
    (nn.ReplicationPad2d, lambda m: _pad_attrs(m.padding, "replicate", None)),
    (nn.CircularPad2d, lambda m: _pad_attrs(m.padding, "circular", None)),
    (nn.PixelShuffle, lambda m: ("pixel_shuffle", {"upscale_factor": int(m.upscale_factor)})),
    (nn.PixelUnshuffle, lambda m: ("pixel_unshuffle", {"downscale_factor": int(m.downscale_factor)})),
]


def _scale_pair(scale_factor: Any) -> list[float] | None:
    """An interpolation's ``scale_factor`` (one number, or one per side) as [height's, width's]; None where none."""
    if scale_factor is None:
        return None
    scales = list(scale_factor) if isinstance(scale_factor, (list, tuple)) else [scale_factor] * 2
    if any(isinstance(v, fx.Node) for v in scales):  # a value of the graph, not a number it was given
        raise ValueError("an interpolation by a scale factor computed from the tensors' shapes has no description op; "
                         "give size= (a map's shape[-2:], say)")
    return [float(v) for v in scales]


def _interpolate_attrs(n: fx.Node, mode: Any, align_corners: Any, scale_factor: Any, recompute: Any,
                       antialias: Any) -> tuple[str, dict]:
    """A resize to the size the traced shapes give its output. A scale factor is taken where it gives that size
    exactly (torch maps the pixels by the scale factor, which is then the same as by the sizes); one of whole
    numbers is kept too (``scale_factor``), so that the description rebuilt at another input shape scales it."""
    if mode not in INTERPOLATE_MODES:
        raise ValueError(f"an interpolation of mode '{mode}' has no description op (modes: "
                         f"{', '.join(INTERPOLATE_MODES)})")
    if antialias:
        raise ValueError("an antialiased interpolation has no description op")
    x, out = n.args[0].meta["tensor_meta"].shape, _shape(n)
    if out is None or len(x) != 4:
        raise ValueError("an interpolation of anything but a [N, C, H, W] map has no description op")
    scales = _scale_pair(scale_factor)
    scaled_exactly = scales is not None and all(float(x[i + 2]) * scales[i] == out[i + 1] for i in range(2))
    if scales is not None and not recompute and not scaled_exactly:
        raise ValueError(f"an interpolation by scale factor {scale_factor} of a {x[2]}x{x[3]} map is no resize "
                         "to a whole size; give size= (or recompute_scale_factor=True)")
    attrs: dict[str, Any] = {"size": [int(out[1]), int(out[2])], "mode": mode}
    if scaled_exactly and all(s >= 1 and s.is_integer() for s in scales):
        attrs["scale_factor"] = [int(s) for s in scales]
    if mode == "bilinear" and align_corners:
        attrs["align_corners"] = True
    return "interpolate", attrs


def _softmax_attrs(n: fx.Node, dim: Any, op: str = "softmax") -> tuple[str, dict]:
    """A softmax (``op``: or a log-softmax) along ``dim`` of ``n``'s input, a negative ``dim`` counted from the last;
    along the batch, or with no ``dim`` (torch's implicit choice), ``ValueError``."""
    name = op.replace("_", "-")
    if dim is None:
        raise ValueError(f"a {name} without dim= (torch's implicit choice of dimension) has no description op")
    rank = len(n.args[0].meta["tensor_meta"].shape)
    if int(dim) % rank == 0:
        raise ValueError(f"a {name} over the batch dimension has no description op")
    return op, {"dim": int(dim) % rank}


def _glu_attrs(n: fx.Node, dim: Any) -> tuple[str, dict]:
    """A GLU of ``n``'s input along ``dim`` (torch's default -1, the last), counted from the front; along the batch,
    ``ValueError``."""
    rank = len(n.args[0].meta["tensor_meta"].shape)
    if int(dim) % rank == 0:
        raise ValueError("a GLU along the batch dimension has no description op")
    return "glu", {"dim": int(dim) % rank}


#: A channel dropout (torch's name) -> the rank of the input it drops whole channels of, as torch 2 reads them.
_CHANNEL_DROPOUT_RANKS = {"dropout1d": 3, "dropout2d": 4, "dropout3d": 5}


def _channel_dropout(kind: str, rank: int, p: Any) -> tuple[str, dict]:
    """A channel dropout of torch's (``kind``: dropout1d, 2d or 3d) of an input of ``rank`` dimensions: the op
    dropout2d (a noise per sample and channel, the input times it) where torch drops the channels of each sample, a
    Dropout1d's of a ``[N, C, L]`` input, a Dropout2d's of a ``[N, C, H, W]`` map. Of any other rank torch drops
    something else (a Dropout3d of a map reads it as one unbatched ``[C, D, H, W]`` volume, dropping whole samples;
    a Dropout1d of a ``[N, C]`` vector its samples; a Dropout2d of ``[N, C, L]`` warns that it will read it
    unbatched) or refuses it: ``ValueError`` saying which."""
    want = _CHANNEL_DROPOUT_RANKS[kind]
    if rank == want and rank in (3, 4):
        return "dropout2d", {"p": float(p)}
    if kind == "dropout3d":
        raise ValueError(f"a dropout3d of a {rank}-D input has no description op (of a [N, C, H, W] map torch reads "
                         "it as one unbatched [C, D, H, W] volume, dropping whole samples); use nn.Dropout2d")
    shape = "[N, C, L] input" if want == 3 else "[N, C, H, W] map"
    raise ValueError(f"a {kind} of a {rank}-D input has no description op (torch drops the channels of a {shape} "
                     "alone; of another it drops samples, warns or refuses)")


def _frozen_bn(m: nn.Module) -> tuple[str, dict]:
    """A batch norm frozen (torchvision's FrozenBatchNorm2d; DETR's and others' of the same name and forward): its
    channels its weight buffer's, its eps where other than 1e-5. Traced through, torch.fx keeps the scale and shift
    it computes from its buffers as constants, which no description op reads."""
    attrs: dict[str, Any] = {"num_features": int(m.weight.shape[0])}
    eps = float(getattr(m, "eps", 1e-5))
    if eps != 1e-5:
        attrs["eps"] = eps
    return "frozen_batchnorm2d", attrs


#: Modules kept as one call (a leaf of the trace), by class name -> how each reads as one op: torchvision's MaxViT
#: attention, and a frozen batch norm.
_LEAF_MODULES: dict[str, Callable[[nn.Module], tuple[str, dict]]] = {
    "RelativePositionalMultiHeadAttention": _group_attention,
    "FrozenBatchNorm2d": _frozen_bn,
}


def _described_whole(m: nn.Module) -> tuple[str, dict] | None:
    """The op and attrs of a rebuilt network's module that stands for one node (``to_torch.DESCRIBED_WHOLE`` marks
    them); None for any other module, a user's own that happens to have such an attribute included."""
    from perf4sight.ir import to_torch

    return getattr(m, "described_as", None) if type(m).__module__ == to_torch.__name__ else None
