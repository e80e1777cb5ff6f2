"""Shape rules of the description's ops: what a node's inputs make its output, so that a description
whose numbers do not fit together (a convolution fed the wrong channel count, a reshape that changes
the element count, a node with one input too many) is refused when it is read, not predicted.

Shapes exclude the batch dimension; ``dim`` attributes count it (``dim: 1`` = channels), as in the
schema. :func:`shape_problem` returns what is wrong ("" if nothing); an op without a rule here only
has its input count checked.
"""
from typing import Any, Dict, List, Optional, Tuple, Union

__all__ = ["shape_problem", "ARITY", "broadcast", "element_count", "image_size_problem", "shape_text",
           "transposed_side", "transposed_output_padding", "window_pair", "windows_of",
           "SIZE_REFERENCES", "pads_to", "size_reference_problem"]

_UNARY = ("relu", "relu6", "hardswish", "sigmoid", "hardsigmoid", "silu", "gelu", "tanh", "identity", "dropout",
          "leaky_relu", "elu", "softplus", "mish",
          "hardtanh",
          "selu", "celu",
          "hardshrink", "softshrink", "threshold",
          "log_sigmoid",
          "rrelu",
          "alpha_dropout",
          "pow", "exp", "abs",
          "log")

#: op -> (fewest, most) inputs; None = no upper bound
ARITY: Dict[str, Tuple[int, Optional[int]]] = {
    "input": (0, 0), "add": (1, 2), "mul": (1, 2), "cat": (1, None),  # add/mul: two tensors, or one and a scalar
    "div": (2, 2),
    "matmul": (2, 2),
    "maximum": (2, 2), "minimum": (2, 2),
    "flip": (1, 1), "roll": (1, 1),
    "weighted_sum": (2, None),
    **{op: (1, 1) for op in _UNARY + ("conv2d", "batchnorm2d", "linear", "maxpool2d", "avgpool2d",
                                      "adaptiveavgpool2d", "adaptivemaxpool2d", "reshape", "flatten", "squeeze",
                                      "unsqueeze", "select", "narrow", "transpose", "mean", "var", "permute",
                                      "layernorm", "groupnorm", "scale", "shift", "token", "attention",
                                      "window_attention", "patch_merge", "interpolate", "group_attention",
                                      "conv_transpose2d", "instancenorm", "softmax", "log_softmax", "prelu",
                                      "dropout2d")},
    **{op: (1, 1) for op in ("pad", "pixel_shuffle", "pixel_unshuffle")},
    "glu": (1, 1),
    "normalize": (1, 1),
    "logsumexp": (1, 1),
    "cumsum": (1, 1),
    "linspace": (1, 1),
    "where": (1, 4),  # the condition's none (mask_shape), one or two (compare_inputs), then the tensor branches
    "affine_grid": (1, 1),
    "grid_sample": (2, 2),
    "sort": (1, 2), "topk": (1, 2),  # a second input: the tensor gathered at the indices (gather)
    "unfold": (1, 1),
    "fold": (1, 1),
    "local_response_norm": (1, 1),
    "rmsnorm": (1, 1),
    "repeat": (1, 1),
    "fractional_maxpool2d": (1, 1),
    "frozen_batchnorm2d": (1, 1),
}


def shape_text(shape: Any) -> str:
    """A shape as the CSVs and messages write it: its sizes joined by "x" (``[3, 224, 224]`` -> "3x224x224"; an
    empty or missing shape -> "")."""
    return "x".join(str(int(v)) for v in (shape or ()))


def _window_out(size: int, kernel: int, stride: int, pad: int, dilation: int, ceil_mode: bool) -> int:
    """Output length of a sliding window (PyTorch's convolution and pooling formula)."""
    span = size + 2 * pad - dilation * (kernel - 1) - 1
    out = (-(-span // stride) if ceil_mode else span // stride) + 1
    if ceil_mode and (out - 1) * stride >= size + pad:  # the last window must start inside the input
        out -= 1
    return out


def _axis(dim: int, rank: int) -> Optional[int]:
    """Index into a per-sample shape of ``rank`` dims for a ``dim`` that counts the batch (None: the batch)."""
    d = dim + rank + 1 if dim < 0 else dim
    return d - 1 if 1 <= d <= rank else None


def _flipped_or_rolled(op: str, a: Dict[str, Any], x: List[int]) -> Union[List[int], str]:
    """A flip's or a roll's output: its input ``x`` (per sample) as it is, where its ``dims`` (counting the batch,
    never it) are distinct dimensions of it and a roll has a shift for each; else what is wrong."""
    axes = [_axis(int(d), len(x)) for d in a["dims"]]
    if not axes or None in axes or len(set(axes)) != len(axes):
        return f"dims {a['dims']} are not distinct dimensions of its input {x} after the batch"
    if op == "roll" and len(a["shifts"]) != len(axes):
        return f"shifts {a['shifts']} must give one shift per dim of {a['dims']}"
    return list(x)


def _resized(a: Dict[str, Any], x: List[int]) -> Union[List[int], str]:
    """An ``interpolate``'s output: its input ``x`` ([C, H, W]) at ``size``, which is [H sh, W sw] where it resizes
    by a ``scale_factor`` [sh, sw] (torch's floor of the scaled side, whole here); else what is wrong."""
    size = [int(v) for v in a["size"]]
    if len(x) != 3 or len(size) != 2:
        return f"resizes a [channels, height, width] input to a [height, width] size, got {x} and {size}"
    if "scale_factor" in a:
        scaled = [side * factor for side, factor in zip(x[1:], window_pair(a["scale_factor"]))]
        if size != scaled:
            return (f"size {size} is not its input's {x[1]}x{x[2]} times scale_factor "
                    f"{window_pair(a['scale_factor'])} ({scaled})")
    return [x[0]] + size


#: Op -> the optional attr naming another node whose height and width its output takes, whatever the input shape:
#: a resize to another map's size (an FPN's ``F.interpolate(x, size=lateral.shape[-2:])``), and a U-Net's pad of
#: the upsampled map to its skip's size, split as its formula splits it (:func:`pads_to`); a U-Net's transposed
#: convolution given its skip's size at the call (``up(x, output_size=skip.shape[2:])``: its output padding); a fold
#: (col2im) of windows back onto the map they were cut from (``F.fold(cols, y.shape[-2:], ...)``).
SIZE_REFERENCES: Dict[str, str] = {"interpolate": "size_of", "pad": "pad_to",
                                   "conv_transpose2d": "output_size_of", "fold": "output_size_of"}


def pads_to(x: List[int], like: List[int]) -> List[int]:
    """The pads [left, right, top, bottom] that bring a ``[C, H, W]`` map ``x`` to the height and width of the
    ``[C', H', W']`` map ``like``, as a U-Net's ``Up`` block splits them: ``d // 2`` before and ``d - d // 2`` after
    (the odd pixel after) for each side's difference ``d`` (pixels; negative where ``x`` is the larger)."""
    dy, dx = int(like[1]) - int(x[1]), int(like[2]) - int(x[2])
    return [dx // 2, dx - dx // 2, dy // 2, dy - dy // 2]


def size_reference_problem(op: str, a: Dict[str, Any], x: List[int], like: List[int]) -> str:
    """What is wrong with a node of ``op`` whose :data:`SIZE_REFERENCES` attr names a node of shape ``like``, its
    input of shape ``x`` ("" if nothing, or where it names none): the named node must be a ``[C, H, W]`` map, and
    the node's literal ``size`` (a resize), ``pads`` (a pad) or output (a transposed convolution's, of its
    ``output_padding``) must be what that map's height and width give."""
    key = SIZE_REFERENCES.get(op)
    if key is None or key not in a:
        return ""
    if op == "fold" and len(like) == 3:  # its input [C kh kw, L] columns: their windows are checked with its shape
        if [int(v) for v in a["output_size"]] != list(like[1:]):
            return f"output_size {a['output_size']} is not the {like[1]}x{like[2]} of {a[key]!r} ({key})"
        return ""
    if len(like) != 3 or len(x) != 3:
        return f"{key} names {a[key]!r} of shape {like}: it sizes a [channels, height, width] map by another"
    if op == "interpolate":
        if [int(v) for v in a["size"]] != list(like[1:]):
            return f"size {a['size']} is not the {like[1]}x{like[2]} of {a[key]!r} ({key})"
        return ""
    if op == "conv_transpose2d":
        made = _transposed_out(a, x)
        if not isinstance(made, str) and made[1:] != list(like[1:]):
            return f"its output's {made[1]}x{made[2]} is not the {like[1]}x{like[2]} of {a[key]!r} ({key})"
        return ""
    want = pads_to(x, like)
    if [int(p) for p in a["pads"]] != want:
        return (f"pads {a['pads']} do not bring its {x[1]}x{x[2]} input to the {like[1]}x{like[2]} of {a[key]!r} "
                f"({key}: {want}, the odd pixel after)")
    return ""


def _unfolded(a: Dict[str, Any], x: List[int]) -> Union[List[int], str]:
    """An unfold's (im2col's) output: [C kh kw, L] of a [C, H, W] map ``x``, L its windows; else what is wrong."""
    if len(x) != 3:
        return f"needs a [channels, height, width] input, got {x}"
    k, d, p, s = (_pair(a[name]) for name in ("kernel_size", "dilation", "padding", "stride"))
    hw = [_window_out(x[i + 1], k[i], s[i], p[i], d[i], False) for i in range(2)]
    if min(hw) < 1:
        return f"kernel {k} (padding {p}, dilation {d}) does not fit its {x[1]}x{x[2]} input"
    return [x[0] * k[0] * k[1], hw[0] * hw[1]]


def _folded(a: Dict[str, Any], x: List[int]) -> Union[List[int], str]:
    """A fold's (col2im's) output: the [C, H, W] map of output_size [H, W] that [C kh kw, L] columns ``x`` sum
    into, L its windows; else what is wrong."""
    k, size = _pair(a["kernel_size"]), _pair(a["output_size"])
    windows = _unfolded(a, [1] + size)
    if isinstance(windows, str):
        return windows
    if len(x) != 2 or x[0] % (k[0] * k[1]) or x[1] != windows[1]:
        return f"needs [C x {k[0] * k[1]}, {windows[1]}] columns (the windows of a {size[0]}x{size[1]} map), got {x}"
    return [x[0] // (k[0] * k[1])] + size


def _glu_shape(x: List[int], dim: int) -> Union[List[int], str]:
    """A GLU's output: its input ``x`` (per sample) halved along ``dim`` (counting the batch), whose size must be
    even; else what is wrong."""
    axis = _axis(dim, len(x))
    if axis is None:
        return f"dim {dim} is not a dimension of its input {x} after the batch"
    if x[axis] % 2:
        return f"a GLU halves its input along dim {dim}, of odd size {x[axis]}"
    return x[:axis] + [x[axis] // 2] + x[axis + 1:]


def broadcast(a: List[int], b: List[int]) -> Optional[List[int]]:
    """The shape ``a`` and ``b`` broadcast to (numpy's rule: a size of 1 takes the other's); None where they do not."""
    out = []
    for x, y in zip(reversed([1] * (len(b) - len(a)) + a), reversed([1] * (len(a) - len(b)) + b)):
        if x != y and 1 not in (x, y):
            return None
        out.append(y if x == 1 else x)
    return out[::-1]


def _ranks_problem(ins: List[List[int]]) -> str:
    """What is wrong with tensors of per-sample shapes ``ins`` combined elementwise ("" if nothing): each carries the
    batch first, so their ranks must be equal (torch lines up the batch of the one of fewer dims with a dimension of
    the other: ``[N, C, H, W] + [N, W]`` fails, or broadcasts the batch into that dimension at a batch of 1)."""
    if len({len(s) for s in ins}) > 1:
        return f"combines inputs of shapes {ins}, of different ranks (each has the batch first)"
    return ""


def _matmul_out(a: List[int], b: List[int]) -> Union[List[int], str]:
    """The shape of the matrix product of ``a`` [..., M, K] and ``b`` [..., K, N] (no batch: torch's batch is a
    dim before these, so both have it): [..., M, N], the leading dims broadcast; else what is wrong."""
    if len(a) != len(b) or len(a) < 2:
        return f"multiplies matrices of equal ranks of at least 2, got shapes {a} and {b}"
    lead = broadcast(a[:-2], b[:-2])
    if a[-1] != b[-2] or lead is None:
        return f"cannot multiply matrices of shapes {a} and {b}"
    return lead + [a[-2], b[-1]]


def element_count(shape: List[int]) -> int:
    """Elements of a tensor of ``shape`` (math.prod is Python 3.8+)."""
    n = 1
    for s in shape:
        n *= s
    return n


#: The most elements one input image may have: 2^31, 8 GiB as float32 for one image of the batch, more than any
#: device this tool profiles holds for a training step (a typo's extra digits: 3x99999999x99999999)
MAX_IMAGE_ELEMENTS = 2 ** 31


def image_size_problem(shape: List[int]) -> str:
    """What is wrong with an input image of ``shape`` ([C, H, W]) for its size ("" if nothing)."""
    n = element_count(shape)
    if n <= MAX_IMAGE_ELEMENTS:
        return ""
    return (f"one image of {shape_text(shape)} is {n:,} elements ({n * 4 / 2 ** 30:,.0f} GiB as float32), more than "
            f"the {MAX_IMAGE_ELEMENTS:,} a training step's input may have")


def _pair(v: Any) -> List[int]:
    return list(v) if isinstance(v, list) else [v, v]


def window_pair(v: Any) -> List[int]:
    """A window size or shift, an int or an [h, w] pair, as [h, w]."""
    return [int(x) for x in _pair(v)]


def windows_of(height: int, width: int, window_size: Any, shift_size: Any) -> Tuple[int, int, List[int], List[int]]:
    """How a window attention covers an ``height x width`` map (Swin's rule): the map padded at the bottom and right
    to whole windows, ``(padded height, padded width, window [h, w], shift [h, w])``, the shift 0 along a dimension
    that one window spans."""
    wh, ww = window_pair(window_size)
    sh, sw = window_pair(shift_size)
    ph, pw = -(-height // wh) * wh, -(-width // ww) * ww
    return ph, pw, [wh, ww], [0 if wh >= ph else sh, 0 if ww >= pw else sw]


def transposed_side(size: int, kernel: int, stride: int, pad: int, output_pad: int, dilation: int) -> int:
    """Output length of a transposed convolution along one side (PyTorch's formula): the input's ``size`` positions
    spread ``stride`` apart, each reaching ``dilation * (kernel - 1)`` further, less ``pad`` on both ends, plus
    ``output_pad`` at the far end."""
    return (size - 1) * stride - 2 * pad + dilation * (kernel - 1) + output_pad + 1


def transposed_output_padding(x: List[int], out: List[int], kernel: List[int], stride: List[int],
                              padding: List[int], dilation: List[int]) -> List[int]:
    """The output padding that makes a transposed convolution of the ``[C, H, W]`` input ``x`` the ``[C, H, W]``
    ``out`` (what torch does with an ``output_size`` given at the call; ONNX's ``output_shape``)."""
    return [int(out[i + 1]) - transposed_side(int(x[i + 1]), kernel[i], stride[i], padding[i], 0, dilation[i])
            for i in range(2)]


def _transposed_out(a: Dict[str, Any], x: List[int]) -> Union[List[int], str]:
    """A transposed convolution's ``[out_channels, H, W]`` from its ``[in_channels, h, w]`` input ``x``."""
    if len(x) != 3:
        return f"needs a [channels, height, width] input, got {x}"
    if x[0] != a["in_channels"]:
        return f"in_channels {a['in_channels']} but its input has {x[0]} channels"
    k, s, p = _pair(a["kernel_size"]), _pair(a["stride"]), _pair(a["padding"])
    op, d = _pair(a["output_padding"]), _pair(a["dilation"])
    hw = [transposed_side(x[i + 1], k[i], s[i], p[i], op[i], d[i]) for i in range(2)]
    if min(hw) < 1:
        return f"padding {p} leaves no output of its {x[1]}x{x[2]} input (kernel {k}, stride {s})"
    return [a["out_channels"]] + hw


def _fractional_out(a: Dict[str, Any], x: List[int]) -> Union[List[int], str]:
    """A fractional max pool's output shape: ``[C, h, w]`` of its ``output_size``, where each side's last window
    (``kernel_size``) ends inside the ``[C, H, W]`` input (torch's check: ``h + kernel - 1 <= H``)."""
    if len(x) != 3:
        return f"needs a [channels, height, width] input, got {x}"
    k, size = _pair(a["kernel_size"]), [int(v) for v in a["output_size"]]
    if len(size) != 2 or any(size[i] + k[i] - 1 > x[i + 1] for i in range(2)):
        return f"output_size {size} of windows {k} does not fit its {x[1]}x{x[2]} input"
    return [x[0]] + size


def _gathered_shape(op: str, a: Dict[str, Any], x: List[int], y: List[int]) -> Union[List[int], str]:
    """The shape of ``y`` gathered along ``dim`` at the indices of a sort or topk of ``x`` (their shape ``x``'s, k
    along dim for a topk), broadcast to ``y``'s shape but along dim (over its dims after ``x``'s, and where ``x``'s
    are 1); ``y``'s first dims ``x``'s but along dim, or ``x``'s 1."""
    axis = _axis(int(a["dim"]), len(x))
    if axis is None or (op == "topk" and int(a["k"]) > x[axis]):
        return f"dim {a['dim']} (k {a.get('k')}) is not a dimension of its first input {x} after the batch"
    if len(y) < len(x) or any(x[d] not in (y[d], 1) for d in range(len(x)) if d != axis):
        return f"gathers a tensor {y} that does not have its first input's shape {x} but along dim {a['dim']}"
    return y[:axis] + [int(a["k"]) if op == "topk" else x[axis]] + y[axis + 1:]


def _expected(op: str, a: Dict[str, Any], ins: List[List[int]], out: List[int]) -> Optional[Union[List[int], str]]:
    """The output shape ``op`` makes of ``ins`` (a string says what is wrong; None: no rule)."""
    x = ins[0] if ins else []
    if op in _UNARY or op == "batchnorm2d":
        if op == "batchnorm2d" and (len(x) < 1 or x[0] != a["num_features"]):
            return f"num_features {a['num_features']} but its input has shape {x}"
        if op == "batchnorm2d" and len(x) > 3:  # a volume's: torch's BatchNorm2d and BatchNorm1d refuse it
            return f"needs an input of [C], [C, L] or [C, H, W], got {x}"
        return x
    if op == "linspace":  # one channel of the coordinates along the rows or the columns of a [C, H, W] map
        if len(x) != 3 or a["dim"] not in (2, 3) or isinstance(a["dim"], bool):
            return f"dim {a['dim']!r} must be 2 or 3 (the rows or the columns) of a [C, H, W] map, got {x}"
        return [1, x[1], x[2]]
    if op == "frozen_batchnorm2d":  # a [C, H, W] map (its [C] buffers viewed as [1, C, 1, 1])
        if len(x) != 3 or x[0] != a["num_features"]:
            return f"num_features {a['num_features']} needs a [{a['num_features']}, height, width] input, got {x}"
        return x
    if op == "conv2d" or op in ("maxpool2d", "avgpool2d"):
        if len(x) != 3:
            return f"needs a [channels, height, width] input, got {x}"
        if op == "conv2d" and x[0] != a["in_channels"]:
            return f"in_channels {a['in_channels']} but its input has {x[0]} channels"
        k, p = _pair(a["kernel_size"]), _pair(a["padding"])
        s = _pair(a["stride"] if a.get("stride") is not None else a["kernel_size"])
        d = _pair(a.get("dilation", 1) or 1)
        ceil = bool(a.get("ceil_mode", False)) if op != "conv2d" else False
        hw = [_window_out(x[i + 1], k[i], s[i], p[i], d[i], ceil) for i in range(2)]
        if min(hw) < 1:
            return f"kernel {k} (padding {p}) does not fit its {x[1]}x{x[2]} input"
        if op != "conv2d" and any(p[i] > ((k[i] - 1) * d[i] + 1) // 2 for i in range(2)):  # torch's pool check
            return f"padding {p} is more than half its kernel {k} (torch refuses such a pool when it runs)"
        return [a["out_channels"] if op == "conv2d" else x[0]] + hw
    if op == "conv_transpose2d":
        return _transposed_out(a, x)
    if op == "unfold":
        return _unfolded(a, x)
    if op == "fold":
        return _folded(a, x)
    if op == "fractional_maxpool2d":
        return _fractional_out(a, x)
    if op in ("adaptiveavgpool2d", "adaptivemaxpool2d"):
        size = _pair(a["output_size"])
        return [x[0]] + [x[i + 1] if size[i] is None else size[i] for i in range(2)] if len(x) == 3 else None
    if op == "linear":
        if not x or x[-1] != a["in_features"]:
            return f"in_features {a['in_features']} but its input has shape {x}"
        return x[:-1] + [a["out_features"]]
    if op in ("add", "mul", "div"):
        if len(ins) == 1:
            return x if "scalar" in a else "takes two inputs, or one and a 'scalar' attr"
        if "scalar" in a:  # the module adds the number to its first input alone: the second would be dropped
            return "takes two inputs or one and a 'scalar' attr, not both"
        if _ranks_problem(ins):
            return _ranks_problem(ins)
        return broadcast(ins[0], ins[1]) or f"cannot combine inputs of shapes {ins[0]} and {ins[1]}"
    if op == "matmul":
        return _matmul_out(ins[0], ins[1])
    if op == "cat":
        axis = _axis(int(a["dim"]), len(x))
        if axis is None or any(len(s) != len(x) or s[:axis] + s[axis + 1:] != x[:axis] + x[axis + 1:] for s in ins):
            return f"cannot concatenate shapes {ins} along dim {a['dim']}"
        return x[:axis] + [sum(s[axis] for s in ins)] + x[axis + 1:]
    if op == "reshape":  # to its attr shape, whose -1 (one at most) torch works out: the output's size there
        shape = [int(s) for s in a["shape"]]
        if len(shape) != len(out) or shape.count(-1) > 1 or any(s not in (o, -1) for s, o in zip(shape, out)):
            return f"reshapes to shape {a['shape']}, not to its output_shape {out} (-1: one size torch works out)"
        return out if element_count(out) == element_count(x) else f"changes the element count ({x} -> {out})"
    if op in ("flatten", "squeeze", "unsqueeze"):  # unsqueeze: a dimension of the output, which has one more
        key = "start_dim" if op == "flatten" else "dim"
        axis = _axis(int(a[key]), len(x) + (op == "unsqueeze"))
        if axis is None:
            side = "output" if op == "unsqueeze" else "input"
            return f"{key} {a[key]} is not a dimension of its {side} after the batch"
        if op == "flatten":
            return x[:axis] + [element_count(x[axis:])]
        if op == "squeeze":  # as torch: a dimension of size other than 1 stays
            return x[:axis] + x[axis + 1:] if x[axis] == 1 else x
        return x[:axis] + [1] + x[axis:]
    if op == "transpose":
        axes = [_axis(int(a[k]), len(x)) for k in ("dim0", "dim1")]
        if None in axes:
            return f"dims {a['dim0']}, {a['dim1']} are not two dimensions of its input {x} after the batch"
        swapped = list(x)
        swapped[axes[0]], swapped[axes[1]] = x[axes[1]], x[axes[0]]
        return swapped
    if op in ("mean", "var", "logsumexp"):
        axes = [_axis(int(d), len(x)) for d in a["dims"]]
        if not axes or None in axes or len(set(axes)) != len(axes):
            return f"dims {a['dims']} are not distinct dimensions of its input {x} after the batch"
        if a["keepdim"]:
            return [1 if i in axes else s for i, s in enumerate(x)]
        return [s for i, s in enumerate(x) if i not in axes]
    if op == "affine_grid":  # a [2, 3] matrix per sample -> an [H, W, 2] grid
        if x != [2, 3] or len(a["size"]) != 2:
            return f"makes an [H, W, 2] grid of a [2, 3] matrix and an [H, W] size, got {x} and {a['size']}"
        return [int(a["size"][0]), int(a["size"][1]), 2]
    if op == "grid_sample":  # a [C, H, W] map sampled at an [Ho, Wo, 2] grid
        if len(x) != 3 or len(ins[1]) != 3 or ins[1][2] != 2:
            return f"samples a [C, H, W] map at an [Ho, Wo, 2] grid, got {x} and {ins[1]}"
        return [x[0], ins[1][0], ins[1][1]]
    if op == "where":  # the condition's input (or its buffer: mask_shape) and the branches' broadcast together
        out_shape: Optional[List[int]] = x
        if "mask_shape" in a:  # a buffer, broadcast with the batch first: one of size 1 there, if any
            mask = [int(v) for v in a["mask_shape"]]
            if len(mask) > len(x) + 1 or len(mask) == len(x) + 1 and mask[0] != 1:
                return f"compares a buffer of shape {mask} that would broadcast over the batch of inputs {ins}"
            out_shape = broadcast(mask[len(mask) - len(x):] if len(mask) > len(x) else mask, x)
        if _ranks_problem(ins):
            return _ranks_problem(ins)
        for s in ins[1:]:
            out_shape = broadcast(out_shape, s) if out_shape is not None else None
        if out_shape is not None and a.get("inplace") and out_shape != ins[-1]:  # written into its tensor branch
            return f"writes in place into a branch of shape {ins[-1]} an output of shape {out_shape}"
        return out_shape if out_shape is not None else f"cannot combine inputs of shapes {ins}"
    if op in ("maximum", "minimum"):
        if _ranks_problem(ins):
            return _ranks_problem(ins)
        return broadcast(ins[0], ins[1]) or f"cannot combine inputs of shapes {ins[0]} and {ins[1]}"
    if op in ("flip", "roll"):
        return _flipped_or_rolled(op, a, x)
    if op == "weighted_sum":  # inputs of one shape, one per weight
        if len(ins) != a["num_inputs"] or any(s != x for s in ins):
            return f"needs {a['num_inputs']} inputs of one shape, got {ins}"
        return x
    if op == "permute":
        dims = [int(d) for d in a["dims"]]
        if sorted(dims) != list(range(len(x) + 1)) or dims[0] != 0:
            return f"dims {dims} are not an order of its input's {len(x) + 1} dimensions with the batch first"
        return [x[d - 1] for d in dims[1:]]
    if op == "groupnorm":  # a [C, ...] input, any spatial dims (torch: at least a batch and channels)
        if len(x) < 1 or x[0] != a["num_channels"]:
            return f"num_channels {a['num_channels']} but its input has shape {x}"
        return x
    if op == "instancenorm":  # InstanceNorm2d's: a [C, H, W] input
        if len(x) != 3 or x[0] != a["num_features"]:
            return f"num_features {a['num_features']} needs a [{a['num_features']}, height, width] input, got {x}"
        return x
    if op == "prelu":  # one slope, or one per channel (torch's dim 1: the first after the batch)
        if a["num_parameters"] != 1 and (len(x) < 1 or x[0] != a["num_parameters"]):
            return f"num_parameters {a['num_parameters']} is neither 1 nor the channels of its input {x}"
        return x
    if op == "local_response_norm":  # across the channels of a [C, H, W] map
        return x if len(x) == 3 else f"normalises across the channels of a [channels, height, width] map, got {x}"
    if op == "dropout2d":  # Dropout2d's of a [C, H, W] map, Dropout1d's of [C, L]: a channel of each sample at a time
        return x if len(x) in (2, 3) else f"drops channels of a [channels, height, width] or [channels, length] " \
            f"input, got {x}"
    if op == "glu":
        return _glu_shape(x, int(a["dim"]))
    if op in ("sort", "topk") and (len(ins) == 2) != bool(a.get("gather")):
        return "takes a second input, the tensor gathered, with the flag gather alone"
    if op in ("sort", "topk") and len(ins) == 2:  # the second gathered at the first's indices, broadcast after them
        return _gathered_shape(op, a, x, ins[1])
    if op == "topk":  # k of the dim's values
        axis = _axis(int(a["dim"]), len(x))
        if axis is None or int(a["k"]) > x[axis]:
            return f"k {a['k']} along dim {a['dim']} is not a dimension of its input {x} after the batch of k or more"
        return x[:axis] + [int(a["k"])] + x[axis + 1:]
    if op in ("softmax", "log_softmax", "normalize", "cumsum", "sort"):
        if _axis(int(a["dim"]), len(x)) is None:
            return f"dim {a['dim']} is not a dimension of its input {x} after the batch"
        return x
    if op in ("layernorm", "rmsnorm"):
        normalized = [int(s) for s in a["normalized_shape"]]
        if len(normalized) > len(x) or x[len(x) - len(normalized):] != normalized:
            return f"normalized_shape {normalized} is not the last dimensions of its input {x}"
        return x
    if op in ("scale", "shift"):
        if broadcast(x, [int(s) for s in a["shape"]]) != x:
            return f"a {op} of shape {a['shape']} does not broadcast onto its input {x}"
        return x
    if op == "token":
        axis, shape = _axis(int(a["dim"]), len(x)), [int(s) for s in a["shape"]]
        if axis is None or len(shape) != len(x) or shape[:axis] + shape[axis + 1:] != x[:axis] + x[axis + 1:]:
            return f"a token of shape {shape} cannot go before its input {x} along dim {a['dim']}"
        return x[:axis] + [x[axis] + shape[axis]] + x[axis + 1:]
    if op == "attention":
        if len(x) != 2 or x[1] != a["embed_dim"]:
            return f"embed_dim {a['embed_dim']} needs a [tokens, {a['embed_dim']}] input, got {x}"
        return x
    if op == "window_attention":
        if len(x) != 3 or x[2] != a["embed_dim"]:
            return f"embed_dim {a['embed_dim']} needs a [height, width, {a['embed_dim']}] input, got {x}"
        return x
    if op == "group_attention":
        wh, ww = window_pair(a["window_size"])
        if len(x) != 3 or x[1] != wh * ww or x[2] != a["embed_dim"]:
            return (f"embed_dim {a['embed_dim']} in {wh}x{ww} windows needs a [groups, {wh * ww}, "
                    f"{a['embed_dim']}] input, got {x}")
        return x
    if op == "patch_merge":
        if len(x) != 3:
            return f"needs a [height, width, channels] input, got {x}"
        return [-(-x[0] // 2), -(-x[1] // 2), 4 * x[2]]
    if op == "interpolate":
        return _resized(a, x)
    if op == "pad":
        return _padded(a, x)
    if op in ("pixel_shuffle", "pixel_unshuffle"):
        return _shuffled(op, a, x)
    if op == "repeat":
        repeats = [int(r) for r in a["repeats"]]
        if len(repeats) != len(x):
            return f"repeats {repeats} must give one count per dimension of its input {x}"
        return [s * r for s, r in zip(x, repeats)]
    if op in ("select", "narrow"):
        axis = _axis(int(a["dim"]), len(x))
        if axis is None:
            return f"dim {a['dim']} is not a dimension of its input {x}"
        first, count = (int(a["index"]), 1) if op == "select" else (int(a["start"]), int(a["length"]))
        first = first + x[axis] if first < 0 else first
        if not 0 <= first or first + count > x[axis]:
            return f"takes {count} from position {first} of a dimension of size {x[axis]}"
        if op == "narrow" and "split_sizes" in a and sum(int(s) for s in a["split_sizes"]) != x[axis]:
            return f"split_sizes {a['split_sizes']} do not add up to its dimension's size {x[axis]}"
        return x[:axis] + ([] if op == "select" else [count]) + x[axis + 1:]
    return None


def _padded(a: Dict[str, Any], x: List[int]) -> Union[List[int], str]:
    """A ``pad``'s output: ``[C, H + top + bottom, W + left + right]``; a reflection needs each pad less than the
    side it reflects, a circular pad each pad at most its side (it wraps around once: torch's rules)."""
    left, right, top, bottom = (int(p) for p in a["pads"])
    if len(x) != 3:
        return f"pads a [channels, height, width] input, got {x}"
    if a["mode"] == "reflect" and (max(top, bottom) >= x[1] or max(left, right) >= x[2]):
        return f"a reflection pad of {a['pads']} needs each pad less than the side it reflects ({x[1]}x{x[2]})"
    if a["mode"] == "circular" and (max(top, bottom) > x[1] or max(left, right) > x[2]):
        return f"a circular pad of {a['pads']} needs each pad at most the side it wraps ({x[1]}x{x[2]})"
    return [x[0], x[1] + top + bottom, x[2] + left + right]


def _shuffled(op: str, a: Dict[str, Any], x: List[int]) -> Union[List[int], str]:
    """A pixel shuffle's output, ``[C r^2, H, W]`` -> ``[C, H r, W r]``, or an unshuffle's, its inverse."""
    if len(x) != 3:
        return f"needs a [channels, height, width] input, got {x}"
    if op == "pixel_shuffle":
        r = int(a["upscale_factor"])
        if x[0] % (r * r):
            return f"upscale_factor {r} needs channels divisible by {r * r}, its input has {x[0]}"
        return [x[0] // (r * r), x[1] * r, x[2] * r]
    r = int(a["downscale_factor"])
    if x[1] % r or x[2] % r:
        return f"downscale_factor {r} needs a height and width divisible by {r}, its input is {x[1]}x{x[2]}"
    return [x[0] * r * r, x[1] // r, x[2] // r]


def shape_problem(op: str, attrs: Dict[str, Any], in_shapes: List[List[int]], out_shape: List[int]) -> str:
    """What is wrong with a node whose inputs have ``in_shapes`` and which says it outputs ``out_shape``."""
    low, high = ARITY.get(op, (0, None))
    if len(in_shapes) < low or (high is not None and len(in_shapes) > high):
        want = str(low) if low == high else f"at least {low}" if high is None else f"{low} to {high}"
        return f"takes {want} input{'s' if (high or low) != 1 else ''}, got {len(in_shapes)}"
    try:
        expected = _expected(op, attrs, in_shapes, list(out_shape))
    except (TypeError, ValueError, IndexError, KeyError):
        return f"attributes {attrs} do not fit inputs of shapes {in_shapes}"
    if isinstance(expected, str):
        return expected
    if expected is not None and list(expected) != list(out_shape):
        several = len(in_shapes) > 1
        return (f"output_shape {list(out_shape)}, but its input{'s' if several else ''} "
                f"{in_shapes if several else in_shapes[0]} give{'' if several else 's'} {list(expected)}")
    return ""
