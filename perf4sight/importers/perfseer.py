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

Numbers may be stored as strings. The label is a Python dict literal
``{'train': 'time|average_sm_util|average_memory_util|average_memory_usuage|peak_sm_util|peak_memory_util|peak_memory_usuage', 'infer': ...}``
(the spelling is the dataset's): time in ms, utilisations in %, memory in MiB.

Safety: graphs are unpickled by an allow-list unpickler (networkx graph classes and their cached views, builtin
dict/list/tuple/set/str/int/float/bool only) and labels parsed with ``ast.literal_eval``; anything
else raises ``UserError`` naming the file, so a hostile file cannot run code.

Mapping: each graph becomes a network description (an ``input`` node is added, fed to the nodes
without predecessors; shapes drop the batch dimension) and each label a tidy row (backend
``imported``, protocol ``perfseer``): ``latency_ms_median`` = ``latency_ms_mean`` = time,
``device_mem_used_mb`` = peak_memory_usuage, ``gpu_util_pct`` = average_sm_util.
"""
from __future__ import annotations

import ast
import datetime as _dt
import hashlib
import io
import pickle
import re
from pathlib import Path
from typing import Any

from perf4sight.errors import UserError
from perf4sight.importers.perf4sight_csv import ImportSummary, import_source
from perf4sight.ir.schema import NetworkDescription, save_description
from perf4sight.profiling.results import measured_keys, read_rows, results_path

__all__ = ["import_perfseer", "read_graph", "read_label", "graph_to_description", "LABEL_FIELDS",
           "ONNX_TO_OP", "OP_TO_ONNX", "safe_unpickle"]

LABEL_FIELDS = ("time", "average_sm_util", "average_memory_util", "average_memory_usuage",
                "peak_sm_util", "peak_memory_util", "peak_memory_usuage")

#: ONNX op type -> our op. ``Clip`` is read as ReLU6 (the only Clip torchvision CNNs export).
ONNX_TO_OP: dict[str, str] = {
    "Conv": "conv2d", "Relu": "relu", "BatchNormalization": "batchnorm2d", "Concat": "cat",
    "AveragePool": "avgpool2d", "GlobalAveragePool": "adaptiveavgpool2d", "GlobalMaxPool": "adaptivemaxpool2d",
    "Flatten": "flatten", "Gemm": "linear", "MaxPool": "maxpool2d", "Add": "add", "Mul": "mul",
    "Clip": "relu6", "Sigmoid": "sigmoid", "HardSigmoid": "hardsigmoid", "HardSwish": "hardswish",
    "Tanh": "tanh", "Dropout": "dropout", "Identity": "identity", "Reshape": "reshape", "ReduceMean": "mean",
}
OP_TO_ONNX: dict[str, str] = {v: k for k, v in ONNX_TO_OP.items()}

_BUILTINS = {"dict", "list", "tuple", "set", "frozenset", "str", "int", "float", "bool"}
#: networkx modules whose classes may appear in a pickled graph (graphs and their cached views).
_NX_MODULES = {"networkx.classes.graph", "networkx.classes.digraph", "networkx.classes.multigraph",
               "networkx.classes.multidigraph", "networkx.classes.reportviews", "networkx.classes.coreviews"}


class _AllowListUnpickler(pickle.Unpickler):
    def find_class(self, module: str, name: str) -> Any:
        if module == "builtins" and name in _BUILTINS:
            return super().find_class(module, name)
        if module in _NX_MODULES and not name.startswith("__"):
            obj = super().find_class(module, name)
            if isinstance(obj, type) and obj.__module__ == module:
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
    graph = safe_unpickle(p.read_bytes(), str(p))
    if not hasattr(graph, "nodes") or not hasattr(graph, "predecessors"):
        raise UserError(f"{p}: the pickle holds a {type(graph).__name__}, not a networkx directed graph")
    return graph


def _floats(text: Any, where: str) -> dict[str, float]:
    parts = str(text).split("|")
    if len(parts) != len(LABEL_FIELDS):
        raise UserError(f"{where}: expected {len(LABEL_FIELDS)} '|'-separated figures ({'|'.join(LABEL_FIELDS)}), "
                        f"got {len(parts)}")
    try:
        return {k: float(v) for k, v in zip(LABEL_FIELDS, parts)}
    except ValueError as exc:
        raise UserError(f"{where}: non-numeric figure ({exc})") from None


def read_label(path: str | Path) -> dict[str, dict[str, float]]:
    """``{'train': {field: value}, 'infer': {...}}`` from a label file (``ast.literal_eval``)."""
    p = Path(path)
    try:
        raw = ast.literal_eval(p.read_text().strip())
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


def _attrs(op: str, args: dict[str, Any], in_shapes: list[list[int]], out: list[int], where: str) -> dict[str, Any]:
    """Our attributes from the node's ``args`` (ours or ONNX's names), filling gaps from shapes."""
    def num(*names: str, default: Any = None) -> Any:
        for n in names:
            if n in args and args[n] is not None:
                v = args[n]
                return v if isinstance(v, bool) else int(_number(v, f"{where} {n}"))
        if default is None:
            raise UserError(f"{where}: {op} lacks '{names[0]}' in args")
        return default

    def flag(name: str, default: bool) -> bool:
        v = args.get(name, default)
        return v.strip().lower() in ("1", "true", "yes") if isinstance(v, str) else bool(v)

    if op == "conv2d":
        return {"in_channels": num("in_channels", default=in_shapes[0][0]), "out_channels": num("out_channels", default=out[0]),
                "kernel_size": _pair(args, ("kernel_size", "kernel_shape"), [], where) or num("kernel_size"),
                "stride": _pair(args, ("stride", "strides"), [1, 1], where),
                "padding": _pair(args, ("padding", "pads"), [0, 0], where),
                "dilation": _pair(args, ("dilation", "dilations"), [1, 1], where),
                "groups": num("groups", "group", default=1), "bias": flag("bias", True)}
    if op == "linear":
        return {"in_features": num("in_features", default=in_shapes[0][-1]),
                "out_features": num("out_features", default=out[-1]), "bias": flag("bias", True)}
    if op == "batchnorm2d":
        return {"num_features": num("num_features", default=out[0])}
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
    if op == "cat":
        return {"dim": num("dim", "axis", default=1)}
    if op == "flatten":
        return {"start_dim": num("start_dim", "axis", default=1)}
    if op == "reshape":
        return {"shape": [-1] + list(out)}
    if op == "mean":
        return {"dims": _ints(args.get("dims", args.get("axes", [2, 3])), where), "keepdim": flag("keepdim", False)}
    if op == "dropout":
        return {"p": _number(args.get("p", args.get("ratio", 0.5)), where)}
    return {}


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


def graph_to_description(graph: Any, name: str, where: str) -> tuple[NetworkDescription, int]:
    """A network description and the batch size of one PerfSeer graph."""
    import networkx as nx
    try:
        order = list(nx.lexicographical_topological_sort(graph, key=str))
    except (nx.NetworkXUnfeasible, TypeError) as exc:
        raise UserError(f"{where}: graph is not a DAG ({exc})") from None
    if not order:
        raise UserError(f"{where}: graph has no nodes")
    names = {n: re.sub(r"\W+", "_", str(n)).strip("_") or "node" for n in order}
    if len(set(names.values())) != len(names):
        names = {n: f"n{i}_{names[n]}" for i, n in enumerate(order)}
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
        preds = sorted(graph.predecessors(n), key=str)
        listed = f.get("inputs")  # argument order, when the file records it (our exports do)
        if isinstance(listed, list) and sorted(map(str, listed)) == sorted(map(str, preds)):
            preds = [p for x in listed for p in preds if str(p) == str(x)]
        if not preds and input_shape is None:
            input_shape = _shape(mi, "input_shape", here)
            if input_shape is None:
                raise UserError(f"{here}: the first node's memory_info lacks input_shape")
        inputs = [names[p] for p in preds] if preds else ["input"]
        in_shapes = [shapes[i] if i != "input" else input_shape for i in inputs]
        args = f.get("args") or {}
        if not isinstance(args, dict):
            raise UserError(f"{here}: args must be a dict")
        shapes[names[n]] = out
        nodes.append({"name": names[n], "op": op, "inputs": inputs, "attrs": _attrs(op, args, in_shapes, out, here),
                      "output_shape": out})
    sinks = [names[n] for n in order if graph.out_degree(n) == 0]
    if len(sinks) != 1:
        raise UserError(f"{where}: expected one output node, found {len(sinks)} ({', '.join(sinks[:5])})")
    if batch is None:
        batch = int(_number(graph.graph.get("batch_size", ""), f"{where} batch_size"))
    meta = dict(graph.graph)
    d = {"name": name, "network": str(meta.get("network", meta.get("family", name))), "input_shape": input_shape,
         "num_classes": nodes[-1]["output_shape"][0] if nodes[-1]["output_shape"] else 0,
         "nodes": [{"name": "input", "op": "input", "inputs": [], "attrs": {}, "output_shape": input_shape}] + nodes,
         "output": sinks[0], "source": f"perfseer import: {Path(where).name}"}
    if "pruning_level" in meta:
        d["pruning_level"] = _number(meta["pruning_level"], f"{where} pruning_level")
    return NetworkDescription.from_dict(d, where=where), batch


def _variant_name(graph: Any, stem: str, batch: int) -> str:
    if graph.graph.get("name"):
        return re.sub(r"[^\w.-]+", "_", str(graph.graph["name"]))
    m = re.match(rf"^(.*?)[_-]?(?:bs|b|batch)?[_-]?{batch}$", stem)
    return m.group(1) if m and m.group(1) else stem


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
    done = measured_keys(read_rows(out))
    stamp = _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds")
    saved: dict[str, str] = {}
    for pkl in pkls:
        label_path = pkl.with_suffix(".txt")
        if not label_path.is_file():
            raise UserError(f"{pkl}: no label file {label_path.name} beside it")
        graph = read_graph(pkl)
        label = read_label(label_path)
        desc, batch = graph_to_description(graph, pkl.stem, str(pkl))
        desc.name = _variant_name(graph, pkl.stem, batch)
        source = desc.extra.pop("source", "")
        text = desc.to_json()  # identity without the file name: graphs of one network at other batch sizes match
        desc.extra["source"] = source
        if saved.get(desc.name, text) != text:
            raise UserError(f"{pkl}: network '{desc.name}' differs from another graph of the same name")
        if desc.name not in saved:
            save_description(desc, out_models / f"{desc.name}.json")
            saved[desc.name] = text
            summary.descriptions += 1
        for phase in phases:
            if phase not in label:
                continue
            fig = label[phase]
            row: dict[str, Any] = {
                "device": device, "backend": "imported", "network": desc.name, "family": desc.network,
                "pruning_level": desc.pruning_level, "batch_size": batch,
                "input_shape": "x".join(str(s) for s in desc.input_shape), "phase": phase, "status": "ok",
                "latency_ms_median": fig["time"], "latency_ms_mean": fig["time"], "protocol": "perfseer",
                "device_mem_used_mb": fig["peak_memory_usuage"], "gpu_util_pct": fig["average_sm_util"],
                "timestamp": stamp, "description_sha": hashlib.sha256(text.encode()).hexdigest()[:16]}
            summary.ok += summary.write_new(out, row, done)
    summary.networks = sorted(saved)
    return summary
