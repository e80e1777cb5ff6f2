"""Import PerfSeer / GAPP-style datasets: pickled networkx graphs plus one label file per graph.

Source layout: any folder tree holding ``<stem>.pkl`` (a ``networkx.DiGraph``, one per
(network, batch size) configuration) next to ``<stem>.txt`` (its label). Each graph node carries a
``feature`` dict::

    type             ONNX op name: Conv, Relu, BatchNormalization, Concat, AveragePool,
                     GlobalAveragePool, Flatten, Gemm, MaxPool, Add (and a few more, see ONNX_TO_OP)
    args             the op's fields: ours (in_channels, kernel_size, ...) or ONNX's (kernel_shape,
                     strides, pads, dilations, group, axis)
    memory_info      batch_size, input_shape / output_shape (with the batch dimension), sizes in bytes
    flops            forward FLOPs of the node for the whole batch
    arith_intensity  flops / bytes moved

Numbers may be stored as strings. The label is a Python dict literal (the spelling is the dataset's; time
in ms, utilisations in %, memory in MiB)::

    {'train': 'time|average_sm_util|average_memory_util|average_memory_usuage|peak_sm_util|peak_memory_util|'
              'peak_memory_usuage', 'infer': ...}

Safety: graphs are unpickled by an allow-list unpickler (networkx graph classes and their cached views, builtin
dict/list/tuple/set/str/int/float/bool only) and labels parsed with ``ast.literal_eval``; anything
else raises ``UserError`` naming the file, so a hostile file cannot run code. A pickle of protocol 0 or 1 makes
its objects with ``copyreg._reconstructor``: allowed for those networkx classes on base ``object`` alone, where it
is ``object.__new__(cls)``, no more than protocol 2's NEWOBJ does.

Mapping: each graph becomes a network description (an ``input`` node is added, fed to the nodes
without predecessors; shapes drop the batch dimension) and each label a tidy row (backend
``imported``, protocol ``perfseer``): ``latency_ms_median`` = ``latency_ms_mean`` = time,
``device_mem_used_mb`` = peak_memory_usuage, ``gpu_util_pct`` = average_sm_util; a ``nan``
figure is written as an empty cell (not measured).

Files written by this tool's exporter (graph attribute ``source == "perf4sight"``) also carry
the description's metadata (``input_node``, ``output``, ``params``, ``num_classes``,
``description_extra``), each node's ``inputs`` in argument order and ``args`` in our names, and
the measurement row (``perf4sight_row``, string values, and ``memory_column``, the column the
label's ``peak_memory_usuage`` came from). Such a file is read back exactly: the description as
it was (node order, names and attributes included) and the row with every column it had, except
``device`` (the ``--device`` given), ``timestamp`` (the import time) and ``description_sha``
(of the description file written).
"""
from __future__ import annotations

import ast
import datetime as _dt
import io
import math
import pickle
import re
from pathlib import Path
from typing import Any, Callable

from perf4sight.errors import UserError
from perf4sight.importers.perf4sight_csv import (ImportSummary, check_backends, check_descriptions,
                                                 check_device_models, description_identity, import_source,
                                                 rows_on_disk, source_kind)
from perf4sight.ir.schema import (INTERPOLATE_MODES, ONE_TENSOR_OPS, OPS, SHARES, NetworkDescription,
                                  save_description)
from perf4sight.ir.shapes import SIZE_REFERENCES, shape_text, size_reference_problem, transposed_output_padding
from perf4sight.profiling.plan import DEFAULT_LOSS
from perf4sight.profiling.results import COLUMNS, file_sha, read_rows, results_path
from perf4sight.wording import shell_word

__all__ = ["import_perfseer", "read_graph", "read_label", "graph_to_description", "is_own_export", "LABEL_FIELDS",
           "ONNX_TO_OP", "OP_TO_ONNX", "PERF4SIGHT_SOURCE", "safe_unpickle"]

LABEL_FIELDS = ("time", "average_sm_util", "average_memory_util", "average_memory_usuage",
                "peak_sm_util", "peak_memory_util", "peak_memory_usuage")

#: ONNX op type -> our op. ``Clip`` is read as ReLU6 (the only Clip torchvision CNNs export),
#: ``Gather`` (one scalar index) as ``select``, ``Slice`` (one axis, step 1) as ``narrow``, and
#: ``Swish`` (ONNX opset 24; its default ``alpha`` 1 is SiLU) as ``silu``. Every op of the
#: description schema but ``input`` has an entry, so any description can be exported.
ONNX_TO_OP: dict[str, str] = {
    "Conv": "conv2d", "Relu": "relu", "BatchNormalization": "batchnorm2d", "Concat": "cat",
    "AveragePool": "avgpool2d", "GlobalAveragePool": "adaptiveavgpool2d", "GlobalMaxPool": "adaptivemaxpool2d",
    "Flatten": "flatten", "Gemm": "linear", "MaxPool": "maxpool2d", "Add": "add", "Mul": "mul",
    "Clip": "relu6", "Sigmoid": "sigmoid", "HardSigmoid": "hardsigmoid", "HardSwish": "hardswish",
    "Tanh": "tanh", "Dropout": "dropout", "Identity": "identity", "Reshape": "reshape", "ReduceMean": "mean",
    "Squeeze": "squeeze", "Unsqueeze": "unsqueeze", "Transpose": "transpose", "Gather": "select",
    "Slice": "narrow", "Gelu": "gelu", "Swish": "silu", "LayerNormalization": "layernorm", "Attention": "attention",
    # no ONNX op: a Swin transformer's, under types of this tool's own
    "WindowAttention": "window_attention", "PatchMerging": "patch_merge", "GroupAttention": "group_attention",
    "Resize": "interpolate", "LeakyRelu": "leaky_relu", "Elu": "elu",
    "Softplus": "softplus", "Mish": "mish", "GroupNormalization": "groupnorm",
    "ConvTranspose": "conv_transpose2d",
    "InstanceNormalization": "instancenorm", "Softmax": "softmax",
    # torch's pixel_shuffle is ONNX's DepthToSpace of mode CRD; its pixel_unshuffle orders the channels as no ONNX
    # op does (SpaceToDepth puts each block's pixels outermost), but for one channel, where the two agree
    "Pad": "pad", "DepthToSpace": "pixel_shuffle", "SpaceToDepth": "pixel_unshuffle",
    "PRelu": "prelu", "LogSoftmax": "log_softmax",
    # ONNX has no dropout of whole channels (its Dropout drops elements; torch's exporter leaves Dropout2d out, as
    # eval mode runs it): a type of this tool's own, which keeps the round trip exact
    "Dropout2d": "dropout2d",
    "Selu": "selu", "Celu": "celu",
    "LRN": "local_response_norm",
    # ONNX's Pow (its exponent a second input: here an arg, as this tool writes it), Exp and Abs
    "Pow": "pow", "Exp": "exp", "Abs": "abs", "Div": "div",
    "Log": "log",  # ONNX's natural logarithm
    "LpNormalization": "normalize",  # ONNX's, of p 2 (its axis our dim; torch's eps in args, ONNX's has none)
    "Im2Col": "unfold",  # ONNX has a Col2Im (opset 18) but no im2col: a type of our own
    "Col2Im": "fold",  # ONNX's (opset 18: its image_shape and block_shape our output_size and kernel_size)
    "ReduceVariance": "var",  # no ONNX op: a type of this tool's own
    # no ONNX op (torch's exporter writes a GLU as a Split, a Sigmoid and a Mul): a type of this tool's own
    "Glu": "glu",
    # ONNX's Shrink is a hardshrink of its bias 0 (its default) and a softshrink of a bias of its lambd
    # (:func:`_shrink_op`); a softshrink is written as a type of this tool's own, which keeps the round trip exact
    "Shrink": "hardshrink", "Softshrink": "softshrink",
    # ONNX's ThresholdedRelu (alpha, 1 where not given) is a threshold of value 0; ours of any value a type of this
    # tool's own
    "ThresholdedRelu": "threshold", "Threshold": "threshold",
    "LogSigmoid": "log_sigmoid",  # no ONNX op (torch's exporter writes a Sigmoid and a Log): a type of our own
    "RMSNormalization": "rmsnorm",  # ONNX opset 23's
    "Tile": "repeat",
    "MatMul": "matmul",  # of two activations (a weight's is a Gemm: linear)
    # ONNX has no RReLU (torch's exporter writes its eval-mode LeakyRelu): a type of this tool's own
    "RRelu": "rrelu",
    "AlphaDropout": "alpha_dropout",  # no ONNX op (torch's exporter leaves it out, as eval mode runs it)
    "FractionalMaxPool": "fractional_maxpool2d",  # no ONNX op (torch's exporter refuses it): a type of our own
    # no ONNX op (torch's exporter writes its scale and shift as a Mul and an Add of constants): a type of our own
    "FrozenBatchNormalization": "frozen_batchnorm2d",
    "Max": "maximum", "Min": "minimum",  # ONNX's of two inputs (of more: refused as a description is read)
    # no ONNX op (torch's exporter writes a flip as a Slice of step -1, a roll as Slices and a Concat): types of our own
    "Flip": "flip", "Roll": "roll",
    # no ONNX op (torch's exporter writes a BiFPN fusion as a Relu, a ReduceSum, an Add, a Div, Gathers, Muls and
    # Adds): a type of our own
    "WeightedSum": "weighted_sum",
    "ReduceLogSumExp": "logsumexp",  # ONNX's (its axes our dims, keepdims our keepdim)
    "CumSum": "cumsum",  # ONNX's (its axis an input: here an arg, dim, as this tool writes it)
    # no ONNX op (torch's exporter writes CoordConv's coordinates as a constant, then an Expand): a type of our own
    "CoordinateChannel": "linspace",
    # ONNX's (its condition a boolean input; here the comparison of the first input with a number, in args)
    "Where": "where",
    # ONNX's (opset 20 and 16): a 2-D grid of [N, 2, 3] matrices; a map sampled at it (mode bilinear, ONNX 20's
    # "linear", padding zeros)
    "AffineGrid": "affine_grid", "GridSample": "grid_sample",
    # ONNX's TopK (its k an input: here an arg) of its values; ONNX has no sort (a TopK of every value): ours
    "TopK": "topk", "Sort": "sort",
}
#: Our op -> ONNX op type. Five of ours share a type with another: ``permute`` is a ``Transpose`` of more than two
#: axes; ``scale``, ``shift`` and ``token`` are a ``Mul``, an ``Add`` and a ``Concat`` with a learnt tensor (an ONNX
#: initializer); ``hardtanh`` is a ``Clip`` of a range other than ReLU6's [0, 6]. An import tells them apart by their
#: args.
OP_TO_ONNX: dict[str, str] = {**{v: k for k, v in ONNX_TO_OP.items()}, "permute": "Transpose", "scale": "Mul",
                              "shift": "Add", "token": "Concat",
                              "hardtanh": "Clip"}

#: Graph attribute ``source`` of the files this tool's exporter writes.
PERF4SIGHT_SOURCE = "perf4sight"

_BUILTINS = {"dict", "list", "tuple", "set", "frozenset", "str", "int", "float", "bool"}
#: networkx modules whose classes may appear in a pickled graph (graphs and their cached views).
_NX_MODULES = {"networkx.classes.graph", "networkx.classes.digraph", "networkx.classes.multigraph",
               "networkx.classes.multidigraph", "networkx.classes.reportviews", "networkx.classes.coreviews"}


#: Python 2's names of the modules above, as pickles of protocols 0 to 2 spell them.
_PY2_MODULES = {"__builtin__": "builtins", "copy_reg": "copyreg"}


def _nx_class(obj: Any) -> bool:
    """Whether ``obj`` is a class of the networkx modules a pickled graph may hold (:data:`_NX_MODULES`)."""
    return isinstance(obj, type) and obj.__module__ in _NX_MODULES and not obj.__name__.startswith("__")


def _reconstructor(cls: Any, base: Any, state: Any) -> Any:
    """``copyreg._reconstructor`` (how protocols 0 and 1 make an object) for a networkx class on base ``object``
    only: ``object.__new__(cls)``, as protocol 2's NEWOBJ makes it; the pickle's BUILD then sets its fields. Any
    other class or base (whose ``__new__`` and ``__init__`` would run on ``state``) is refused."""
    if not (_nx_class(cls) and base is object and state is None):
        what = cls.__qualname__ if isinstance(cls, type) else type(cls).__name__
        raise pickle.UnpicklingError(f"forbidden copyreg._reconstructor of {what} (only networkx graph classes on "
                                     "base object)")
    return object.__new__(cls)


class _AllowListUnpickler(pickle.Unpickler):
    def find_class(self, module: str, name: str) -> Any:
        module = _PY2_MODULES.get(module, module)
        if module == "builtins" and name in _BUILTINS:
            return super().find_class(module, name)
        if (module, name) == ("builtins", "object"):  # the base a protocol 0 or 1 pickle names
            return object
        if (module, name) == ("copyreg", "_reconstructor"):
            return _reconstructor
        if module in _NX_MODULES and not name.startswith("__"):
            obj = super().find_class(module, name)
            if _nx_class(obj) and obj.__module__ == module:
                return obj
        raise pickle.UnpicklingError(f"forbidden type {module}.{name}")


def safe_unpickle(data: bytes, where: str) -> Any:
    """Unpickle ``data`` allowing only networkx graphs and builtin containers/scalars."""
    try:
        return _AllowListUnpickler(io.BytesIO(data)).load()
    except Exception as exc:  # any failure of a foreign file is the user's to fix
        raise UserError(f"{where}: not a safe PerfSeer graph pickle ({type(exc).__name__}: {exc})") from None


def read_graph(path: str | Path) -> Any:
    """The ``networkx`` graph stored in ``path`` (allow-list unpickling)."""
    p = Path(path)
    try:
        data = p.read_bytes()
    except OSError as exc:
        raise UserError(f"{p}: cannot read the PerfSeer graph ({exc.strerror or exc})") from None
    graph = safe_unpickle(data, str(p))
    if not hasattr(graph, "nodes") or not hasattr(graph, "predecessors"):
        raise UserError(f"{p}: the pickle holds a {type(graph).__name__}, not a networkx directed graph")
    return graph


def _floats(text: Any, where: str) -> dict[str, float]:
    parts = str(text).split("|")
    if len(parts) != len(LABEL_FIELDS):
        raise UserError(f"{where}: expected {len(LABEL_FIELDS)} '|'-separated figures ({'|'.join(LABEL_FIELDS)}), "
                        f"got {len(parts)}")
    try:
        figures = {k: float(v) for k, v in zip(LABEL_FIELDS, parts)}
    except ValueError as exc:
        raise UserError(f"{where}: non-numeric figure ({exc})") from None
    bad = [k for k, v in figures.items() if not 0 <= v < math.inf and not math.isnan(v)]  # nan: not measured
    if bad:
        value = figures[bad[0]]
        raise UserError(f"{where}: {bad[0]} is {'negative' if value < 0 else 'infinite'} ({value:g}): a time, a use or "
                        "a memory figure is a finite number >= 0 (nan: not measured)")
    return figures


def read_label(path: str | Path) -> dict[str, dict[str, float]]:
    """``{'train': {field: value}, 'infer': {...}}`` from a label file (``ast.literal_eval``)."""
    p = Path(path)
    try:
        raw = ast.literal_eval(p.read_text().strip())
    except OSError as exc:
        raise UserError(f"{p}: cannot read the label ({exc.strerror or exc})") from None
    except (ValueError, SyntaxError, MemoryError, RecursionError) as exc:
        raise UserError(f"{p}: label is not a Python dict literal ({type(exc).__name__})") from None
    if not isinstance(raw, dict) or not raw:
        raise UserError(f"{p}: label must be a dict like {{'train': 'time|...', 'infer': '...'}}")
    return {str(k): _floats(v, f"{p} [{k}]") for k, v in raw.items()}


def _number(v: Any, where: str) -> float:
    try:
        return float(v)
    except (TypeError, ValueError):
        raise UserError(f"{where}: expected a number, got {v!r}") from None


def _ints(v: Any, where: str) -> list[int]:
    if isinstance(v, str):
        v = [x for x in re.split(r"[\s,()\[\]x]+", v) if x]
    if isinstance(v, (int, float)):
        return [int(v)]
    try:
        return [int(float(x)) for x in v]
    except (TypeError, ValueError):
        raise UserError(f"{where}: expected a shape or list of integers, got {v!r}") from None


def _pair(args: dict[str, Any], names: tuple[str, ...], default: list[int], where: str) -> list[int]:
    for n in names:
        if n in args and args[n] is not None:
            vals = _ints(args[n], f"{where} {n}")
            if n in ("pads",) and len(vals) == 4:
                vals = vals[:2]
            return vals * 2 if len(vals) == 1 else vals[:2]
    return list(default)


def _first_int(args: dict[str, Any], names: tuple[str, ...], where: str) -> int | None:
    """The first of ``names`` present in ``args`` as one integer (an ONNX list such as ``axes``: its first entry)."""
    for n in names:
        if n in args and args[n] is not None:
            vals = _ints(args[n], f"{where} {n}")
            if not vals:
                raise UserError(f"{where}: {n} is empty")
            return vals[0]
    return None


def _dropped_axis(longer: list[int], shorter: list[int]) -> int | None:
    """The axis (counting the batch dimension) of a size-1 entry of ``longer`` whose removal gives ``shorter``."""
    for i, size in enumerate(longer):
        if size == 1 and longer[:i] + longer[i + 1:] == shorter:
            return i + 1
    return None


def _required(value: int | None, op: str, name: str, where: str) -> int:
    """``value``, or a ``UserError`` naming the attribute the node lacks."""
    if value is None:
        raise UserError(f"{where}: {op} lacks '{name}' in args and its shapes do not tell it")
    return value


def _view_attrs(op: str, args: dict[str, Any], in_shape: list[int], out: list[int], where: str) -> dict[str, Any]:
    """Attributes of the indexing/view ops (squeeze, unsqueeze, transpose, select, narrow) from ours or ONNX's names."""
    if op == "squeeze":
        dim = _first_int(args, ("dim", "axes"), where)
        return {"dim": _required(dim if dim is not None else _dropped_axis(in_shape, out), op, "dim", where)}
    if op == "unsqueeze":
        dim = _first_int(args, ("dim", "axes"), where)
        return {"dim": _required(dim if dim is not None else _dropped_axis(out, in_shape), op, "dim", where)}
    if op == "transpose":
        d0, d1 = _first_int(args, ("dim0",), where), _first_int(args, ("dim1",), where)
        if d0 is None or d1 is None:
            perm = _ints(args.get("perm", []), f"{where} perm")
            moved = [i for i, p in enumerate(perm) if p != i]
            if len(moved) != 2:
                raise UserError(f"{where}: Transpose needs dim0/dim1 or a perm swapping two axes, got perm {perm}")
            d0, d1 = moved
        return {"dim0": d0, "dim1": d1}
    if op == "select":
        return {"dim": _required(_first_int(args, ("dim", "axis"), where), op, "dim", where),
                "index": _required(_first_int(args, ("index", "indices"), where), op, "index", where)}
    dim = _required(_first_int(args, ("dim", "axes"), where), op, "dim", where)
    start = _required(_first_int(args, ("start", "starts"), where), op, "start", where)
    length = _first_int(args, ("length",), where)
    end = _first_int(args, ("ends",), where)
    if end is not None and 0 < dim <= len(in_shape):
        end = min(end, in_shape[dim - 1])  # ONNX writes "to the end" as a huge end
    if length is None:
        length = end - start if end is not None else (out[dim - 1] if 0 < dim <= len(out) else None)
    return {"dim": dim, "start": start, "length": _required(length, op, "length", where)}


def _shared_type(op: str, args: dict[str, Any], n_inputs: int) -> str:
    """Which of our ops an ONNX type two of them share is: a ``Transpose`` with ``dims`` (ours) or a ``perm`` moving
    more than two axes is a ``permute``; a ``Mul``, an ``Add`` or a ``Concat`` of one input with a ``shape`` (ours) is
    a ``scale``, a ``shift`` or a ``token``; a ``MatMul`` of one input (by a weight) a ``linear`` layer."""
    if op == "transpose" and "dim0" not in args and ("dims" in args or "perm" in args):
        perm = _ints(args.get("dims", args.get("perm")) or [], "Transpose perm")
        if "dims" in args or len([i for i, p in enumerate(perm) if p != i]) > 2:
            return "permute"
    learnt = {"mul": "scale", "add": "shift", "cat": "token"}
    if op in learnt and n_inputs == 1 and "shape" in args:
        return learnt[op]
    if op == "matmul" and n_inputs == 1:  # by a weight, an initializer: an exporter's linear layer without a bias
        return "linear"
    if op == "relu6":
        return _clip_op(args)
    if op == "hardshrink":
        return _shrink_op(args)
    return op


def _shrink_op(args: dict[str, Any]) -> str:
    """Which op a ``Shrink`` is: ONNX's of a bias of 0 (its default) a hardshrink, of a bias equal to its lambd a
    softshrink; any other bias shifts what no torch shrink does (a ``UserError``)."""
    bias = _number(args.get("bias", 0.0), "Shrink bias")
    if bias == 0.0:
        return "hardshrink"
    if bias == _number(args.get("lambd", 0.5), "Shrink lambd"):
        return "softshrink"
    raise UserError(f"a Shrink of bias {bias} and lambd {args.get('lambd', 0.5)} has no description op (a bias of 0 "
                    "is a hardshrink, one of lambd a softshrink)")


def _clip_op(args: dict[str, Any]) -> str:
    """Which op a ``Clip`` is: ours carries ``min_val`` and ``max_val`` (a hardtanh, whatever its range); ONNX's
    ``min`` and ``max`` of a range other than ReLU6's [0, 6] a hardtanh. A Clip of neither is ReLU6, the only Clip
    torchvision CNNs export. ONNX leaves the other side unbounded where one is given alone: a ``min`` of 0 alone is
    a ReLU, any other one-sided clamp has no op (a ``UserError``)."""
    if "min_val" in args or "max_val" in args:
        return "hardtanh"
    low, high = args.get("min"), args.get("max")
    if low is None and high is None:
        return "relu6"
    if low is not None and high is not None:
        return "relu6" if (_number(low, "Clip min"), _number(high, "Clip max")) == (0.0, 6.0) else "hardtanh"
    if high is None and _number(low, "Clip min") == 0.0:
        return "relu"
    bound = f"min {low}" if high is None else f"max {high}"
    raise UserError(f"a Clip of one bound ({bound}; ONNX leaves the other unbounded) has no description op (a "
                    "hardtanh clamps to both, a ReLU is a min of 0 alone)")


def _reshape_target(args: dict[str, Any], out: list[int], where: str) -> list[int]:
    """A reshape's ``shape`` without the batch dimension: ``args['shape']`` when it is one (same rank as the
    output, as this tool writes it), else the output shape (an ONNX target shape includes the batch)."""
    if "shape" in args and args["shape"] is not None:
        shape = _ints(args["shape"], f"{where} shape")
        if len(shape) == len(out) and all(s in (-1, o) for s, o in zip(shape, out)):
            return shape
    return list(out)


def _bias_by_size(weights: int, outputs: int, weight_bytes: Any) -> bool:
    """Whether a convolution or linear layer without a ``bias`` arg has one, read off the node's ``weight_size``
    (``memory_info``, bytes of its weights and bias, fp32 or fp16), as an ONNX graph gives a bias as a third input,
    never as an attribute; True (torch's default) where that does not tell."""
    try:
        size = float(weight_bytes)
    except (TypeError, ValueError):
        return True
    for width in (4, 2):
        if size == width * weights:
            return False
        if size == width * (weights + outputs):
            return True
    return True


def _conv_transpose_attrs(args: dict[str, Any], in_shapes: list[list[int]], out: list[int], where: str,
                          num: Callable[..., Any], flag: Callable[..., bool], weight_bytes: Any) -> dict[str, Any]:
    """A ``conv_transpose2d``'s attributes from ours or ONNX's ConvTranspose's (kernel_shape, strides, pads,
    output_padding, dilations, group); an output padding not given is the one its output shape takes (ONNX's
    ``output_shape`` says it that way)."""
    a = {"in_channels": num("in_channels", default=in_shapes[0][0]),
         "out_channels": num("out_channels", default=out[0]),
         "kernel_size": _pair(args, ("kernel_size", "kernel_shape"), [], where) or num("kernel_size"),
         "stride": _pair(args, ("stride", "strides"), [1, 1], where),
         "padding": _pair(args, ("padding", "pads"), [0, 0], where), "output_padding": [0, 0],
         "dilation": _pair(args, ("dilation", "dilations"), [1, 1], where),
         "groups": num("groups", "group", default=1)}
    k = a["kernel_size"] if isinstance(a["kernel_size"], list) else [a["kernel_size"]] * 2
    given = _pair(args, ("output_padding",), [], where)
    shaped = len(out) == 3 and len(in_shapes[0]) == 3
    a["output_padding"] = given or (transposed_output_padding(in_shapes[0], out, k, a["stride"], a["padding"],
                                                              a["dilation"]) if shaped else [0, 0])
    weights = a["in_channels"] * (a["out_channels"] // max(a["groups"], 1)) * k[0] * k[-1]
    return {**a, "bias": flag("bias", _bias_by_size(weights, a["out_channels"], weight_bytes))}


def _attrs(op: str, args: dict[str, Any], in_shapes: list[list[int]], out: list[int], where: str,
           weight_bytes: Any = None) -> dict[str, Any]:
    """Our attributes from the node's ``args`` (ours or ONNX's names), filling gaps from shapes (and a bias from
    ``weight_bytes``, the node's ``memory_info.weight_size``: :func:`_bias_by_size`)."""
    def num(*names: str, default: Any = None) -> Any:
        for n in names:
            if n in args and args[n] is not None:
                v = args[n]
                return v if isinstance(v, bool) else int(_number(v, f"{where} {n}"))
        if default is None:
            raise UserError(f"{where}: {op} lacks '{names[0]}' in args")
        return default

    def flag(name: str, default: bool, *aliases: str) -> bool:
        v = next((args[n] for n in (name, *aliases) if n in args), default)
        return v.strip().lower() in ("1", "true", "yes") if isinstance(v, str) else bool(v)

    def with_eps(a: dict[str, Any]) -> dict[str, Any]:
        """``a`` and a norm's ``eps`` where the args give one (ours, or ONNX's ``epsilon``)."""
        eps = args.get("eps", args.get("epsilon"))
        return a if eps is None else {**a, "eps": _number(eps, f"{where} epsilon")}

    if op == "conv2d":
        a = {"in_channels": num("in_channels", default=in_shapes[0][0]),
             "out_channels": num("out_channels", default=out[0]),
             "kernel_size": _pair(args, ("kernel_size", "kernel_shape"), [], where) or num("kernel_size"),
             "stride": _pair(args, ("stride", "strides"), [1, 1], where),
             "padding": _pair(args, ("padding", "pads"), [0, 0], where),
             "dilation": _pair(args, ("dilation", "dilations"), [1, 1], where),
             "groups": num("groups", "group", default=1)}
        k = a["kernel_size"] if isinstance(a["kernel_size"], list) else [a["kernel_size"]] * 2
        weights = a["out_channels"] * (a["in_channels"] // max(a["groups"], 1)) * k[0] * k[-1]
        fixed = {"fixed": True} if args.get("fixed") else {}  # ours: its filter a buffer (a blur pool's)
        fixed.update((k, args[k]) for k in ("standardize", "standardize_eps", "standardize_unbiased",
                                            "standardize_scale", "weight_norm", "spectral_norm",
                                            "spectral_norm_iterations", "spectral_norm_eps")
                     if k in args)
        return {**a, "bias": flag("bias", _bias_by_size(weights, a["out_channels"], weight_bytes)), **fixed}
    if op == "conv_transpose2d":
        return _conv_transpose_attrs(args, in_shapes, out, where, num, flag, weight_bytes)
    if op == "linear":
        a = {"in_features": num("in_features", default=in_shapes[0][-1]),
             "out_features": num("out_features", default=out[-1])}
        weights = a["in_features"] * a["out_features"]
        normed = {k: args[k] for k in ("weight_norm", "spectral_norm", "spectral_norm_iterations", "spectral_norm_eps")
                  if k in args}  # ours
        return {**a, "bias": flag("bias", _bias_by_size(weights, a["out_features"], weight_bytes)), **normed}
    if op == "batchnorm2d":  # ONNX's BatchNormalization: epsilon (1e-5); our own args' flags (ONNX has none) and a
        # null momentum (torch's cumulative average; ONNX's number is 1 - torch's, so a number is not read)
        a = with_eps({"num_features": num("num_features", default=out[0])})
        if a.get("eps") == 1e-5:  # torch's default, left out as our descriptions leave it (ONNX's files give it)
            del a["eps"]
        for key in ("affine", "track_running_stats"):
            if not flag(key, True):
                a[key] = False
        if "momentum" in args and args["momentum"] is None:
            a["momentum"] = None
        if "training" in args and a.get("track_running_stats", True):  # a functional call's constant mode
            a["training"] = flag("training", False)
        return a
    if op in ("maxpool2d", "avgpool2d"):
        k = _pair(args, ("kernel_size", "kernel_shape"), [], where)
        if not k:
            raise UserError(f"{where}: {op} lacks 'kernel_size' in args")
        a = {"kernel_size": k, "stride": _pair(args, ("stride", "strides"), k, where),
             "padding": _pair(args, ("padding", "pads"), [0, 0], where), "ceil_mode": flag("ceil_mode", False)}
        if op == "avgpool2d":
            a["count_include_pad"] = flag("count_include_pad", True)
        return a
    if op in ("adaptiveavgpool2d", "adaptivemaxpool2d"):
        return {"output_size": _pair(args, ("output_size",), [1, 1], where)}
    if op == "fractional_maxpool2d":  # its windows (required); its output size the node's where not given
        k = _pair(args, ("kernel_size", "kernel_shape"), [], where)
        if not k:
            raise UserError(f"{where}: {op} lacks 'kernel_size' in args")
        return {"kernel_size": k, "output_size": _pair(args, ("output_size",), out[1:3], where)}
    if op == "cat":
        return {"dim": num("dim", "axis", default=1)}
    if op == "flatten":
        return {"start_dim": num("start_dim", "axis", default=1)}
    if op == "reshape":
        return {"shape": _reshape_target(args, out, where)}
    if op in ("squeeze", "unsqueeze", "transpose", "select", "narrow"):
        return _view_attrs(op, args, in_shapes[0], out, where)
    if op == "permute":
        return {"dims": _ints(args.get("dims", args.get("perm")), f"{where} perm")}
    if op in ("scale", "shift"):
        fixed = {"fixed": True} if op == "shift" and args.get("fixed") else {}  # ours: a buffer added
        return {"shape": _ints(args["shape"], f"{where} shape"), **fixed}
    if op == "token":
        return {"shape": _ints(args["shape"], f"{where} shape"), "dim": num("dim", "axis", default=1)}
    if op == "attention":
        a = {"embed_dim": num("embed_dim", default=in_shapes[0][-1]), "num_heads": num("num_heads", "q_num_heads"),
             "bias": flag("bias", True)}
        if args.get("dropout"):
            a["dropout"] = _number(args["dropout"], f"{where} dropout")
        return a
    if op == "window_attention":
        a = {"embed_dim": num("embed_dim", default=in_shapes[0][-1]), "num_heads": num("num_heads"),
             "window_size": _ints(args["window_size"], f"{where} window_size"),
             "shift_size": _ints(args["shift_size"], f"{where} shift_size"), "bias": flag("bias", True)}
        for key in ("attention_dropout", "dropout"):
            if args.get(key):
                a[key] = _number(args[key], f"{where} {key}")
        if flag("cosine", False):  # Swin V2's
            a["cosine"] = True
        if args.get("position_bias_mlp"):
            a["position_bias_mlp"] = num("position_bias_mlp")
        return a
    if op == "interpolate":  # ONNX's Resize: mode "linear" (of a 4-D map: bilinear) or "nearest"
        mode = str(args.get("mode", "nearest")).lower()
        mode = "bilinear" if mode in ("linear", "bilinear") else mode
        if mode not in INTERPOLATE_MODES:
            raise UserError(f"{where}: a resize of mode '{mode}' has no description op")
        a = {"size": list(out[1:]), "mode": mode}
        scale_factor = _whole_scales(args, in_shapes[0], out, where)
        if scale_factor:
            a["scale_factor"] = scale_factor
        if mode == "bilinear" and (flag("align_corners", False)
                                   or args.get("coordinate_transformation_mode") == "align_corners"):
            a["align_corners"] = True
        return a
    if op == "group_attention":
        return {"embed_dim": num("embed_dim", default=in_shapes[0][-1]), "num_heads": num("num_heads"),
                "window_size": _ints(args["window_size"], f"{where} window_size"), "bias": flag("bias", True)}
    if op == "layernorm":
        axis = _first_int(args, ("axis",), where)
        axis = -1 if axis is None else axis
        normalized = _ints(args["normalized_shape"], where) if "normalized_shape" in args else \
            in_shapes[0][axis - 1 if axis > 0 else axis:]
        return with_eps({"normalized_shape": normalized})
    if op == "rmsnorm":
        return _rmsnorm_attrs(args, in_shapes, where)
    if op == "repeat":
        return _repeat_attrs(args, in_shapes, where)
    if op == "groupnorm":  # ONNX's GroupNormalization: num_groups, epsilon (1e-5); a scale and a bias always
        a = with_eps({"num_groups": num("num_groups"), "num_channels": num("num_channels", default=in_shapes[0][0])})
        if not flag("affine", True):
            a["affine"] = False
        return a
    if op == "frozen_batchnorm2d":  # its channels, its epsilon (1e-5)
        return with_eps({"num_features": num("num_features", default=in_shapes[0][0])})
    if op == "instancenorm":  # ONNX's InstanceNormalization: epsilon (1e-5); affine where it has weights
        a = with_eps({"num_features": num("num_features", default=in_shapes[0][0])})
        if flag("affine", _number(weight_bytes or 0, f"{where} weight_size") > 0):
            a["affine"] = True
        if flag("track_running_stats", False):  # our own args (ONNX's has no running statistics)
            a["track_running_stats"] = True
            if args.get("momentum") is not None:
                a["momentum"] = _number(args["momentum"], f"{where} momentum")
            if "use_input_stats" in args:  # a functional call's constant mode
                a["use_input_stats"] = flag("use_input_stats", True)
        return a
    if op == "hardtanh":  # ONNX's Clip of min and max (torch's -1 and 1 where one is left out)
        low, high = args.get("min_val", args.get("min", -1.0)), args.get("max_val", args.get("max", 1.0))
        return {"min_val": _number(low, f"{where} min"), "max_val": _number(high, f"{where} max")}
    if op == "prelu":  # ONNX's PRelu: its slopes an input (an initializer), counted by the node's weight_size
        return {"num_parameters": num("num_parameters", default=_slopes(weight_bytes, where))}
    if op in ("sort", "topk"):  # dim counts the batch (ONNX's axis, -1 where not given)
        rank = len(in_shapes[0]) + 1
        a: dict[str, Any] = {"dim": int(_number(args.get("dim", args.get("axis", -1)), f"{where} axis")) % rank}
        gathered = {"gather": True} if flag("gather", False) else {}  # a second input gathered at the indices
        if op == "sort":
            return {**a, "descending": flag("descending", False), **gathered}
        if args.get("k") is None:
            raise UserError(f"{where}: a TopK without its k (args: k)")
        return {"k": int(_number(args["k"], f"{where} k")), **a, "largest": flag("largest", True), **gathered}
    if op == "affine_grid":  # its [H, W] the grid's sides; ONNX's align_corners (0 where not given)
        return {"size": [int(v) for v in out[:2]], "align_corners": flag("align_corners", False)}
    if op == "grid_sample":  # ONNX's mode "linear" (opset 20) or "bilinear" (16), padding_mode, align_corners
        mode = str(args.get("mode", "bilinear")).lower()
        return {"mode": "bilinear" if mode == "linear" else mode,
                "padding_mode": str(args.get("padding_mode", "zeros")), "align_corners": flag("align_corners", False)}
    if op == "where":  # ours: compare and threshold (required), a number branch's if_true or if_false, the flags
        if args.get("compare") is None or args.get("threshold") is None:
            raise UserError(f"{where}: a Where without its condition (args: compare, threshold)")
        a = {"compare": str(args["compare"]), "threshold": _number(args["threshold"], f"{where} threshold")}
        a.update({k: _number(args[k], f"{where} {k}") for k in ("if_true", "if_false") if k in args})
        if args.get("mask_shape") is not None:  # a fixed mask's (a buffer's) shape
            shape = args["mask_shape"]
            if not isinstance(shape, (list, tuple)):
                raise UserError(f"{where}: a Where's mask_shape must be a list of sizes, got {shape!r}")
            a["mask_shape"] = [int(_number(v, f"{where} mask_shape")) for v in shape]
        return {**a, **{k: True for k in ("inplace", "compare_inputs", "multiply", "float_mask")
                    if flag(k, False)}}
    if op == "linspace":  # ours: start, end and dim in the args
        if any(args.get(k) is None for k in ("start", "end", "dim")):
            raise UserError(f"{where}: a CoordinateChannel without its start, end and dim (args)")
        return {"start": _number(args["start"], f"{where} start"), "end": _number(args["end"], f"{where} end"),
                "dim": int(_number(args["dim"], f"{where} dim")), **({"made": args["made"]} if "made" in args else {})}
    if op == "cumsum":  # ONNX's CumSum: its axis an input a graph's args may not carry: none, no running sum
        if args.get("dim", args.get("axis")) is None:
            raise UserError(f"{where}: a CumSum without its axis (args: dim)")
        return {"dim": int(_number(args.get("dim", args.get("axis")), f"{where} axis")) % (len(in_shapes[0]) + 1)}
    if op in ("softmax", "log_softmax", "glu"):  # ONNX's (Log)Softmax, our Glu: axis counts the batch (-1 where not
        # given: the last, torch's default for a GLU too)
        axis = int(_number(args.get("dim", args.get("axis", -1)), f"{where} axis"))
        return {"dim": axis % (len(in_shapes[0]) + 1)}
    if op in ("unfold", "fold"):  # their windows (required), dilation, padding and stride as a convolution's; a
        # fold's output size (ONNX's Col2Im: block_shape and image_shape)
        k = _pair(args, ("kernel_size", "kernel_shape", "block_shape"), [], where)
        size = _pair(args, ("output_size", "image_shape"), out[1:3], where)
        if not k:
            raise UserError(f"{where}: {op} lacks 'kernel_size' in args")
        a = {"kernel_size": k, "dilation": _pair(args, ("dilation", "dilations"), [1, 1], where),
             "padding": _pair(args, ("padding", "pads"), [0, 0], where),
             "stride": _pair(args, ("stride", "strides"), [1, 1], where)}
        return a if op == "unfold" else {"output_size": size, **a}
    if op == "normalize":  # ONNX's LpNormalization (axis -1 where not given), of p 2 alone (F.normalize's other p
        # has no description op)
        if _number(args.get("p", 2), f"{where} p") != 2:
            raise UserError(f"{where}: an LpNormalization of p {args['p']} has no description op (only p 2)")
        axis = int(_number(args.get("dim", args.get("axis", -1)), f"{where} axis"))
        return with_eps({"dim": axis % (len(in_shapes[0]) + 1)})
    if op == "var":  # our own type: its dims are never implied (a mean's are)
        if args.get("dims") is None:
            raise UserError(f"{where}: ReduceVariance lacks 'dims' in args")
        return {"dims": _ints(args["dims"], where), "keepdim": flag("keepdim", False),
                "correction": _number(args.get("correction", 1.0), f"{where} correction")}
    if op == "logsumexp":  # ONNX's ReduceLogSumExp: axes (required here: ONNX's none reduces the batch too)
        if args.get("dims", args.get("axes")) is None:
            raise UserError(f"{where}: ReduceLogSumExp lacks 'axes' in args")
        return {"dims": _ints(args.get("dims", args.get("axes")), where), "keepdim": flag("keepdim", True, "keepdims")}
    if op == "mean":
        return {"dims": _ints(args.get("dims", args.get("axes", [2, 3])), where),
                "keepdim": flag("keepdim", False, "keepdims")}
    if op in ("dropout", "dropout2d"):
        return {"p": _number(args.get("p", args.get("ratio", 0.5)), where)}
    if op == "leaky_relu":  # ONNX's LeakyRelu: its slope is alpha, 0.01 where not given
        return {"negative_slope": _number(args.get("negative_slope", args.get("alpha", 0.01)), f"{where} alpha")}
    if op == "elu":  # ONNX's Elu: alpha, 1 where not given
        return {"alpha": _number(args.get("alpha", 1.0), f"{where} alpha")}
    if op == "alpha_dropout":
        return {"p": _number(args.get("p", 0.5), f"{where} p"), **({"feature": True} if flag("feature", False) else {})}
    if op == "rrelu":  # torch's defaults where left out
        return {"lower": _number(args.get("lower", 1 / 8), f"{where} lower"),
                "upper": _number(args.get("upper", 1 / 3), f"{where} upper")}
    if op == "celu":  # ONNX's Celu: alpha, 1 where not given
        return {"alpha": _number(args.get("alpha", 1.0), f"{where} alpha")}
    if op == "selu":
        return _selu_attrs(args, where)
    if op in ("hardshrink", "softshrink"):  # ONNX's Shrink: lambd, 0.5 where not given
        return {"lambd": _number(args.get("lambd", 0.5), f"{where} lambd")}
    if op == "threshold":  # ONNX's ThresholdedRelu: alpha (1 where not given), a value of 0
        return {"threshold": _number(args.get("threshold", args.get("alpha", 1.0)), f"{where} alpha"),
                "value": _number(args.get("value", 0.0), f"{where} value")}
    if op == "local_response_norm":  # ONNX's LRN: size (required), alpha 1e-4, beta 0.75, bias (our k) 1
        if args.get("size") is None:
            raise UserError(f"{where}: LRN lacks 'size' in args")
        return {"size": int(_number(args["size"], f"{where} size")),
                "alpha": _number(args.get("alpha", 1e-4), f"{where} alpha"),
                "beta": _number(args.get("beta", 0.75), f"{where} beta"),
                "k": _number(args.get("k", args.get("bias", 1.0)), f"{where} bias")}
    if op == "softplus":  # ONNX's Softplus is log(1 + exp(x)): torch's of beta 1, threshold 20
        return {"beta": _number(args.get("beta", 1.0), f"{where} beta"),
                "threshold": _number(args.get("threshold", 20.0), f"{where} threshold")}
    if op in ("add", "mul") and args.get("scalar") is not None:
        return {"scalar": _number(args["scalar"], f"{where} scalar")}
    if op == "pow":  # ONNX's exponent is an input (an initializer) a graph's args may not carry: none, no power
        if args.get("exponent") is None:
            raise UserError(f"{where}: a Pow without its exponent (args: exponent)")
        return {"exponent": _number(args["exponent"], f"{where} exponent")}
    if op == "pad":
        return _pad_attrs(args, where)
    if op in ("flip", "roll"):  # our own types: dims count the batch, as ours do
        a = {"dims": _ints(args.get("dims"), f"{where} dims")}
        return {"shifts": _ints(args.get("shifts"), f"{where} shifts"), **a} if op == "roll" else a
    if op in ("pixel_shuffle", "pixel_unshuffle"):
        return _shuffle_attrs(op, args, in_shapes[0], out, where)
    if op == "weighted_sum":  # our own type: a weight per input, normalised by a relu (eps 1e-4) or a softmax
        normalize = str(args.get("normalize", "relu"))
        a = {"num_inputs": len(in_shapes), "normalize": normalize}
        return {**a, "eps": _number(args.get("eps", 1e-4), f"{where} eps")} if normalize == "relu" else a
    return {}


#: Bytes of a PRelu's slope (float32).
_BYTES_PER_SLOPE = 4


def _whole_scales(args: dict[str, Any], in_shape: list[int], out: list[int], where: str) -> list[int] | None:
    """A resize's whole scale factors [sh, sw] (ours, ``scale_factor``: one or one per side; ONNX's Resize,
    ``scales``: one per axis of [N, C, H, W], the last two the sides') where they scale ``in_shape`` ([C, H, W]) to
    ``out`` exactly; None where the args give none, or others (a resize by 1.5 is read by its size alone)."""
    given = args.get("scale_factor", args.get("scales"))
    if given is None:
        return None
    if isinstance(given, str):  # a string-typed field: "[1, 1, 2, 2]", "2"
        given = [v for v in re.split(r"[\s,()\[\]]+", given) if v]
    scales = [_number(v, f"{where} scales") for v in (given if isinstance(given, (list, tuple)) else [given])]
    pair = scales * 2 if len(scales) == 1 else scales[-2:]
    if len(pair) != 2 or not all(s >= 1 and float(s).is_integer() for s in pair) \
            or [side * s for side, s in zip(in_shape[1:], pair)] != list(out[1:]):
        return None
    return [int(s) for s in pair]


def _slopes(weight_bytes: Any, where: str) -> int:
    """A PRelu's slopes, from its ``weight_size`` (float32 bytes); one where the node gives none."""
    if weight_bytes is None:
        return 1
    size = _number(weight_bytes, f"{where} weight_size")
    if size <= 0 or size % _BYTES_PER_SLOPE:
        raise UserError(f"{where}: a PRelu's weight_size {weight_bytes!r} is no whole number of float32 slopes")
    return int(size // _BYTES_PER_SLOPE)


def _rmsnorm_attrs(args: dict[str, Any], in_shapes: list[list[int]], where: str) -> dict[str, Any]:
    """An ``rmsnorm``'s attrs from ours (normalized_shape; eps where given, torch's None otherwise; elementwise_affine
    where false) or ONNX's RMSNormalization (opset 23: over the dimensions from ``axis``, -1 where left out, and an
    epsilon of 1e-5 where left out; a scale always)."""
    ours = "normalized_shape" in args
    if ours:
        normalized = _ints(args["normalized_shape"], where)
    else:
        axis = _first_int(args, ("axis",), where)
        axis = -1 if axis is None else axis
        normalized = in_shapes[0][axis - 1 if axis > 0 else axis:]
    eps = args.get("eps", args.get("epsilon", None if ours else 1e-5))
    a: dict[str, Any] = {"normalized_shape": normalized}
    if eps is not None:
        a["eps"] = _number(eps, f"{where} epsilon")
    if args.get("elementwise_affine") is False:
        a["elementwise_affine"] = False
    return a


def _repeat_attrs(args: dict[str, Any], in_shapes: list[list[int]], where: str) -> dict[str, Any]:
    """A ``repeat``'s attrs from ours (repeats after the batch) or ONNX's Tile (its repeats, an input there, an arg
    here: one per dimension, the batch's first, which must be 1); a tiling of the batch is refused by name."""
    repeats = _ints(args.get("repeats"), f"{where} repeats")
    if len(repeats) == len(in_shapes[0]) + 1:
        if repeats[0] != 1:
            raise UserError(f"{where}: a Tile of {repeats} tiles the batch, which has no description op")
        repeats = repeats[1:]
    return {"repeats": repeats}


#: ONNX's Selu defaults (float32), torch's SELU's constants: a Selu of others is no torch SELU.
_SELU_ALPHA, _SELU_GAMMA = 1.6732632423543772, 1.0507009873554805


def _selu_attrs(args: dict[str, Any], where: str) -> dict[str, Any]:
    """A ``selu``'s attrs (none) from ours or ONNX's Selu, whose alpha and gamma, where given, must be torch's SELU's
    (to float32's precision, ONNX's defaults); any other is refused by name."""
    for key, want in (("alpha", _SELU_ALPHA), ("gamma", _SELU_GAMMA)):
        if args.get(key) is not None and abs(_number(args[key], f"{where} {key}") - want) > 1e-6:
            raise UserError(f"{where}: a Selu of {key} {args[key]} is no torch SELU (alpha {_SELU_ALPHA}, gamma "
                            f"{_SELU_GAMMA}): it has no description op")
    return {}


#: ONNX's Pad modes -> ours (ONNX's "wrap", of opset 19, is torch's circular pad; ours as written by the export).
_ONNX_PAD_MODES = {"constant": "constant", "reflect": "reflect", "edge": "replicate", "replicate": "replicate",
                   "wrap": "circular", "circular": "circular"}


def _pad_attrs(args: dict[str, Any], where: str) -> dict[str, Any]:
    """A ``pad``'s attrs from ours (``pads`` [left, right, top, bottom]) or ONNX's Pad: ``pads`` as [begin of each
    axis..., end of each axis...] over the four axes of an NCHW map (the batch's and channels' 0), or over the two
    ``axes`` 2 and 3; ``mode`` constant, reflect, edge or wrap; ``constant_value`` (0)."""
    mode = _ONNX_PAD_MODES.get(str(args.get("mode", "constant")).lower())
    if mode is None:
        raise UserError(f"{where}: a Pad of mode '{args.get('mode')}' has no description op (constant, reflect, edge, "
                        "wrap)")
    if args.get("pads") is None:
        raise UserError(f"{where}: Pad lacks 'pads' in args")
    pads = _ints(args["pads"], f"{where} pads")
    axes = _ints(args["axes"], f"{where} axes") if args.get("axes") is not None else None
    if len(pads) == 8 and not any(pads[i] for i in (0, 1, 4, 5)):  # N, C, H, W begins, then ends
        pads = [pads[3], pads[7], pads[2], pads[6]]
    elif len(pads) == 4 and axes is not None and [a % 4 for a in axes] == [2, 3]:  # H, W begins, then ends
        pads = [pads[1], pads[3], pads[0], pads[2]]
    elif not (len(pads) == 4 and axes is None):  # ours: [left, right, top, bottom]
        raise UserError(f"{where}: a Pad of pads {pads} (axes {axes}) pads more than the height and width")
    a: dict[str, Any] = {"pads": pads, "mode": mode}
    value = args.get("value", args.get("constant_value"))
    if mode == "constant" and value is not None and _number(value, f"{where} constant_value"):
        a["value"] = _number(value, f"{where} constant_value")
    if args.get("pads_computed") is True:  # ours: its numbers the traced shape's
        a["pads_computed"] = True
    return a


def _shuffle_attrs(op: str, args: dict[str, Any], in_shape: list[int], out: list[int],
                   where: str) -> dict[str, Any]:
    """A pixel shuffle's or unshuffle's factor from ours or ONNX's ``blocksize``. ONNX's DepthToSpace is torch's
    pixel shuffle in mode CRD; in its default mode DCR, and as SpaceToDepth, its channels come in another order,
    the same only where one channel is shuffled: any other is refused by name."""
    key = "upscale_factor" if op == "pixel_shuffle" else "downscale_factor"
    if key in args:
        return {key: int(_number(args[key], f"{where} {key}"))}
    r = int(_number(args.get("blocksize"), f"{where} blocksize")) if args.get("blocksize") is not None else None
    if r is None:
        raise UserError(f"{where}: {op} lacks '{key}' (or ONNX's 'blocksize') in args")
    single = (out if op == "pixel_shuffle" else in_shape)[:1] == [1]
    if op == "pixel_shuffle" and str(args.get("mode", "DCR")).upper() != "CRD" and not single:
        raise UserError(f"{where}: a DepthToSpace of mode {args.get('mode', 'DCR')} orders its channels as no "
                        "description op does (pixel_shuffle is mode CRD)")
    if op == "pixel_unshuffle" and not single:
        raise UserError(f"{where}: a SpaceToDepth of more than one channel orders its channels as no description op "
                        "does (torch's pixel_unshuffle keeps each channel's block together)")
    return {key: r}


def _feature(graph: Any, n: Any, where: str) -> dict[str, Any]:
    f = graph.nodes[n].get("feature")
    if not isinstance(f, dict) or "type" not in f:
        raise UserError(f"{where}: node {n!r} has no 'feature' dict with a 'type'")
    return f


def _shape(mi: dict[str, Any], key: str, where: str) -> list[int] | None:
    """A shape from ``memory_info`` without its batch dimension (a list of shapes: the first)."""
    v = mi.get(key)
    if v is None:
        return None
    if isinstance(v, (list, tuple)) and v and isinstance(v[0], (list, tuple)):
        v = v[0]
    return _ints(v, f"{where} memory_info.{key}")[1:]


def is_own_export(graph: Any) -> bool:
    """Whether ``graph`` was written by this tool's exporter (and so carries the extra keys it reads back)."""
    return graph.graph.get("source") == PERF4SIGHT_SOURCE and isinstance(graph.graph.get("input_node"), str)


def _node_order(graph: Any, where: str) -> list[Any]:
    """Nodes in execution order: the file's own order when it is a topological one (our exports list
    the description's order; ONNX-derived graphs list the model's), else a lexicographic topological
    sort. The order matters: the allocator model frees and allocates in it."""
    import networkx as nx
    seen: set[Any] = set()
    for n in graph.nodes:
        if any(p not in seen for p in graph.predecessors(n)):
            break
        seen.add(n)
    else:
        return list(graph.nodes)
    try:
        return list(nx.lexicographical_topological_sort(graph, key=str))
    except (nx.NetworkXUnfeasible, TypeError) as exc:
        raise UserError(f"{where}: graph is not a DAG ({exc})") from None


def _node_names(order: list[Any], own: bool) -> dict[Any, str]:
    """Our node names: the file's names for our exports, else word characters only (made unique)."""
    if own:
        return {n: str(n) for n in order}
    names = {n: re.sub(r"\W+", "_", str(n)).strip("_") or "node" for n in order}
    if len(set(names.values())) != len(names):
        names = {n: f"n{i}_{names[n]}" for i, n in enumerate(order)}
    return names


def _input_names(graph: Any, n: Any, f: dict[str, Any], names: dict[Any, str], input_node: str) -> list[str]:
    """The node's inputs in argument order: the file's ``inputs`` list when it names exactly the graph
    predecessors (plus, for our exports, the network input; repeats allowed), else the predecessors
    sorted by name; a node without predecessors reads the network input."""
    preds = {str(p): p for p in graph.predecessors(n)}
    listed = f.get("inputs")
    if isinstance(listed, list) and listed:
        named = [str(x) for x in listed]
        if set(named) - {input_node} == set(preds) and all(x in preds or x == input_node for x in named):
            return [names[preds[x]] if x in preds else input_node for x in named]
    if not preds:
        return [input_node]
    return [names[preds[k]] for k in sorted(preds)]


def _network_input_shape(graph: Any, own: bool, mi: dict[str, Any], where: str) -> list[int]:
    """The network input's shape (no batch): the graph's ``input_shape`` for our exports, else the
    ``memory_info.input_shape`` of the first node in execution order (it reads the network input)."""
    if own and graph.graph.get("input_shape") is not None:
        return _ints(graph.graph["input_shape"], f"{where} graph input_shape")
    shape = _shape(mi, "input_shape", where)
    if shape is None:
        raise UserError(f"{where}: the first node's memory_info lacks input_shape")
    return shape


def _own_meta(graph: Any, where: str) -> dict[str, Any]:
    """Description fields our exporter records on the graph: output, params, num_classes and the extra fields."""
    meta = graph.graph
    extra = meta.get("description_extra", {})
    if not isinstance(extra, dict):
        raise UserError(f"{where}: description_extra must be a dict")
    d = {k: v for k, v in extra.items() if k not in ("name", "network", "input_shape", "nodes", "output")}
    if "output" in meta:
        if not isinstance(meta["output"], str):
            raise UserError(f"{where}: graph attribute output must be a node name, got {meta['output']!r}")
        d["output"] = meta["output"]
    for key in ("params", "num_classes"):
        if key in meta:
            if not (isinstance(meta[key], int) and not isinstance(meta[key], bool) and meta[key] >= 0):
                raise UserError(f"{where}: graph attribute {key} must be a non-negative integer, got {meta[key]!r}")
            d[key] = meta[key]
    return d


def graph_to_description(graph: Any, name: str, where: str) -> tuple[NetworkDescription, int]:
    """A network description and the batch size of one PerfSeer graph."""
    own = is_own_export(graph)
    order = _node_order(graph, where)
    if not order:
        raise UserError(f"{where}: graph has no nodes")
    names = _node_names(order, own)
    ours_by_file_name = {str(k): names[k] for k in order}
    input_node = str(graph.graph["input_node"]) if own else "input"
    batch, input_shape = None, None
    nodes: list[dict[str, Any]] = []
    shapes: dict[str, list[int]] = {}
    for n in order:
        f = _feature(graph, n, where)
        here = f"{where} node {n!r}"
        onnx = str(f["type"])
        if onnx not in ONNX_TO_OP:
            raise UserError(f"{here}: unsupported op type '{onnx}' (supported: {', '.join(sorted(ONNX_TO_OP))})")
        op = ONNX_TO_OP[onnx]
        mi = f.get("memory_info") or {}
        if not isinstance(mi, dict):
            raise UserError(f"{here}: memory_info must be a dict")
        if "batch_size" in mi and batch is None:
            batch = int(_number(mi["batch_size"], f"{here} memory_info.batch_size"))
        out = _shape(mi, "output_shape", here)
        if out is None:
            raise UserError(f"{here}: memory_info lacks output_shape")
        inputs = _input_names(graph, n, f, names, input_node)
        if input_shape is None:
            input_shape = _network_input_shape(graph, own, mi, here)
        in_shapes = [shapes[i] if i != input_node else input_shape for i in inputs]
        args = f.get("args") or {}
        if not isinstance(args, dict):
            raise UserError(f"{here}: args must be a dict")
        op = _shared_type(op, args, len(inputs))
        if onnx == "MatMul" and op == "linear":  # no bias, whatever its weight_size says
            args = {**args, "bias": False}
        ours = own and all(a in args for a in OPS[op])
        owner = None if ours else _shared_owner(op, args, ours_by_file_name, nodes)
        if owner is not None and op != "where":  # a layer called again (no weights): its owner's attrs, whatever
            attrs = {**owner["attrs"], SHARES: owner["name"]}  # its own say
        else:  # (a where reading an earlier one's fixed mask: its own attrs, its mask the owner's)
            attrs = dict(args) if ours else _attrs(op, args, in_shapes, out, here, mi.get("weight_size"))
            attrs.update({SHARES: owner["name"]} if owner is not None else {})
        if not ours and owner is None:
            attrs.update(_size_reference(op, args, attrs, in_shapes, ours_by_file_name, shapes,
                                         (input_node, input_shape)))
        shapes[names[n]] = out
        nodes.append({"name": names[n], "op": op, "inputs": inputs, "attrs": attrs, "output_shape": out})
    meta = dict(graph.graph)
    d: dict[str, Any] = _own_meta(graph, where) if own else {"source": f"perfseer import: {Path(where).name}"}
    if "output" not in d:
        sinks = [names[n] for n in order if graph.out_degree(n) == 0]
        if len(sinks) != 1:
            raise UserError(f"{where}: expected one output node, found {len(sinks)} ({', '.join(sinks[:5])})")
        d["output"] = sinks[0]
    if batch is None:
        batch = int(_number(meta.get("batch_size", ""), f"{where} batch_size"))
    # the network without a name of its own: the file's, less its batch-size suffix (one per batch size)
    network = meta.get("network", meta.get("family", _variant_name(graph, name, batch)))
    d.update({"name": name, "network": str(network), "input_shape": input_shape,
              "nodes": [{"name": input_node, "op": "input", "inputs": [], "attrs": {}, "output_shape": input_shape}]
              + nodes})
    d.setdefault("num_classes", nodes[-1]["output_shape"][0] if nodes[-1]["output_shape"] else 0)
    if "pruning_level" in meta:
        level = meta["pruning_level"]
        d["pruning_level"] = (level if own and isinstance(level, (int, float))
                              else _number(level, f"{where} pruning_level"))
    return NetworkDescription.from_dict(d, where=where), batch


def _shared_owner(op: str, args: dict[str, Any], names: dict[str, str], nodes: list[dict[str, Any]]
                  ) -> dict[str, Any] | None:
    """Of a file read as another tool's, the earlier node (of ``nodes``, ours so far) whose parameters the node of
    ``op`` shares: the one its ``shares`` arg (ours, as our export writes it) names by the file's name (``names``:
    the file's -> ours), of the same op (or both a scale or a shift) and sharing none itself; None otherwise (the
    node read as one of its own)."""
    given = args.get(SHARES)
    ours = names.get(given) if isinstance(given, str) else None
    owner = next((n for n in nodes if n["name"] == ours), None) if ours is not None else None
    if owner is None or SHARES in owner["attrs"]:
        return None
    return owner if owner["op"] == op or {owner["op"], op} <= set(ONE_TENSOR_OPS) else None


def _size_reference(op: str, args: dict[str, Any], attrs: dict[str, Any], in_shapes: list[list[int]],
                    names: dict[str, str], shapes: dict[str, list[int]], network_input: tuple[str, list[int]]
                    ) -> dict[str, Any]:
    """Our ``size_of`` (a resize's) or ``pad_to`` (a pad's) from the args of a file read as another tool's: the name
    the file gives (``names``: the file's -> ours) of an earlier node (``shapes``: theirs so far, by our name; or
    ``network_input``, its name and shape), where that node's sides give the node's ``attrs`` (read from ``args``);
    nothing otherwise (read by its numbers alone)."""
    key = SIZE_REFERENCES.get(op)
    given = args.get(key) if key is not None else None
    if not isinstance(given, str) or "scale_factor" in attrs or not in_shapes:
        return {}
    ours = network_input[0] if given == network_input[0] else names.get(given)
    like = network_input[1] if ours == network_input[0] else shapes.get(ours)
    if like is None or size_reference_problem(op, {**attrs, key: ours}, in_shapes[0], like):
        return {}
    return {key: ours}


def _variant_name(graph: Any, stem: str, batch: int) -> str:
    """The network's name: the graph's ``name``, else the file stem without its batch-size suffix: the batch size
    after a separator or a ``bs``/``b``/``batch`` marker (``net_bs8``, ``net-8``, ``net_batch_8``, ``netbs8``), so
    that a name ending in the digits of the batch size (``resnet18`` at batch 8) is kept whole."""
    if graph.graph.get("name"):
        return re.sub(r"[^\w.-]+", "_", str(graph.graph["name"]))
    m = re.match(rf"^(.+?)(?:[_-](?:bs|b|batch)?[_-]?|(?:bs|b|batch)[_-]?){batch}$", stem)
    return m.group(1) if m else stem


def _check_named_batch(stem: str, batch: int, where: str) -> None:
    """``UserError`` where the file name marks a batch size (``net_bs8``, ``net_batch8``) other than the graph's."""
    m = re.search(r"(?:^|[_-])(?:bs|batch)[_-]?(\d+)$", stem)
    if m and int(m.group(1)) != batch:
        raise UserError(f"{where}: the file name says batch size {m.group(1)}, its graph's memory_info batch_size "
                        f"{batch}")


def _cell(value: float) -> Any:
    """A label figure as a measurement cell: ``nan`` (not measured) is an empty cell."""
    return value if math.isfinite(value) else ""


#: Row columns an import always sets itself, whatever the file recorded.
_IMPORT_SETS = ("device", "timestamp", "description_sha")


def _recorded_row(graph: Any, where: str) -> dict[str, str]:
    """The measurement row our exporter recorded on the graph (``perf4sight_row``), checked: known columns, text
    values."""
    rec = graph.graph.get("perf4sight_row", {})
    if not isinstance(rec, dict) or not all(isinstance(k, str) and isinstance(v, (str, int, float))
                                            for k, v in rec.items()):
        raise UserError(f"{where}: perf4sight_row must be a dict of column name -> text")
    unknown = sorted(set(rec) - set(COLUMNS))
    if unknown:
        raise UserError(f"{where}: perf4sight_row has columns {unknown} that are not in the measurement schema")
    return {k: str(v) for k, v in rec.items() if k not in _IMPORT_SETS}


def _label_row(graph: Any, phase: str, fig: dict[str, float], where: str) -> dict[str, Any]:
    """Columns of one label's figures: for our exports over the recorded row of that phase (the label
    wins the three columns it carries; its ``loss`` as recorded, a cross entropy's: export writes no other), else the
    foreign mapping (``latency_ms_mean`` = ``latency_ms_median`` = time; a cross entropy's step)."""
    recorded = graph.graph.get("perf4sight_row")
    if not (is_own_export(graph) and isinstance(recorded, dict) and recorded.get("phase", "train") == phase):
        return {"backend": "imported", "protocol": "perfseer", "loss": DEFAULT_LOSS,
                "latency_ms_median": _cell(fig["time"]),
                "latency_ms_mean": _cell(fig["time"]), "device_mem_used_mb": _cell(fig["peak_memory_usuage"]),
                "gpu_util_pct": _cell(fig["average_sm_util"])}
    memory = str(graph.graph.get("memory_column", "device_mem_used_mb"))
    if memory not in ("device_mem_used_mb", "peak_rss_mb"):
        raise UserError(f"{where}: memory_column must be device_mem_used_mb or peak_rss_mb, got {memory!r}")
    row: dict[str, Any] = {"backend": "imported", "protocol": "perfseer", **_recorded_row(graph, where)}
    for column, field in (("latency_ms_median", "time"), ("gpu_util_pct", "average_sm_util"),
                          (memory, "peak_memory_usuage")):
        if not _same_figure(row.get(column, ""), fig[field]):  # keep the recorded text when the label agrees
            row[column] = _cell(fig[field])
    return row


def _same_figure(text: Any, value: float) -> bool:
    """Whether a recorded cell holds ``value`` (an empty cell matches ``nan``)."""
    if text in ("", None):
        return not math.isfinite(value)
    try:
        return float(text) == value
    except ValueError:
        return False


def _description_identity(desc: NetworkDescription, own: bool) -> tuple[str, str]:
    """(text that must agree across the graphs of one network, the text saved): a foreign file's
    ``source`` names the file, so it is left out of the identity."""
    text = desc.to_json()
    return (text if own else description_identity(desc)), text


def import_perfseer(source_dir: str | Path, device: str, profiling_dir: str | Path, models_dir: str | Path,
                    phases: tuple[str, ...] = ("train",)) -> ImportSummary:
    """Import every ``*.pkl`` + ``*.txt`` pair under ``source_dir`` as measurements of ``device``.

    Descriptions go to ``<models_dir>/imported/<device>/<network>.json`` (one per network; the
    batch-size suffix of a file name is dropped), rows to ``results_path(profiling_dir, device)``
    (phases other than ``train`` are written with their phase name). Re-importing skips rows
    already on disk. A graph without a label, an unsafe pickle or a malformed label raises ``UserError``.
    """
    source = import_source(source_dir, device, "PerfSeer")
    pkls = sorted(source.rglob("*.pkl"))
    if not pkls:
        raise UserError(f"{source}: no PerfSeer *.pkl graphs found")
    out_models = Path(models_dir) / "imported" / device
    out = results_path(profiling_dir, device)
    summary = ImportSummary(device=device, results_path=str(out), models_path=str(out_models))
    existing = read_rows(out)
    stamp = _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds")
    # read and check every graph and label first: a bad file or a second backend writes nothing
    # network -> (its first graph's description, the identity its other graphs must share, sha of the file saved)
    descs: dict[str, tuple[NetworkDescription, str, str]] = {}
    rows: list[dict[str, Any]] = []
    read_from: dict[tuple, Path] = {}  # (network, batch size, phase) -> the graph file its row comes from
    folders = sorted({p.relative_to(source).parts[0] for p in pkls if len(p.relative_to(source).parts) > 1})
    per_device = (f"the source holds one folder per device ({', '.join(folders)}), as an export of several devices "
                  f"writes it: import one at a time, e.g. --source {shell_word(source / folders[0])}"
                  ) if len(folders) > 1 else ""
    for pkl in pkls:
        label_path = pkl.with_suffix(".txt")
        if not label_path.is_file():
            raise UserError(f"{pkl}: no label file {label_path.name} beside it")
        graph = read_graph(pkl)
        label = read_label(label_path)
        desc, batch = graph_to_description(graph, pkl.stem, str(pkl))
        _check_named_batch(pkl.stem, batch, str(pkl))
        desc.name = _variant_name(graph, pkl.stem, batch)
        identity, text = _description_identity(desc, is_own_export(graph))
        if desc.name in descs and descs[desc.name][1] != identity:
            raise UserError(f"{pkl}: network '{desc.name}' differs from another graph of the same name")
        descs.setdefault(desc.name, (desc, identity, file_sha(text.encode())))
        if not any(phase in label for phase in phases):
            summary.without_phase.append(label_path.name)
        for phase in phases:
            if phase not in label:
                continue
            twice = read_from.setdefault((desc.name, batch, phase), pkl)
            if twice != pkl:
                raise UserError(f"{pkl}: {desc.name} at batch size {batch} ({phase}) is measured in {twice} too: one "
                                f"source holds one measurement of it{'; ' + per_device if per_device else ''}")
            failed = not (math.isfinite(label[phase]["time"]) or math.isfinite(label[phase]["peak_memory_usuage"]))
            rows.append({
                **_label_row(graph, phase, label[phase], str(pkl)),
                "device": device, "network": desc.name, "family": desc.network,
                "pruning_level": desc.pruning_level, "batch_size": batch,
                "input_shape": shape_text(desc.input_shape), "phase": phase, "status": "error" if failed else "ok",
                **({"message": "the label has neither a time nor a peak memory (nan): a run that failed"}
                   if failed else {}),
                "timestamp": stamp, "description_sha": descs[desc.name][2]})
    check_backends(out, device, existing, {source_kind(r) for r in rows} - {""}, per_device)
    check_device_models(out, existing, {str(r.get("device_model") or "") for r in rows})
    check_descriptions(out_models, [d for d, _, _ in descs.values()], existing, device)
    for desc, _, _ in descs.values():
        save_description(desc, out_models / f"{desc.name}.json")
    summary.descriptions = len(descs)
    done = rows_on_disk(existing)
    for row in rows:
        if summary.write_new(out, row, done):
            summary.ok += row["status"] == "ok"
            summary.error += row["status"] == "error"
    summary.networks = sorted(descs)
    return summary
