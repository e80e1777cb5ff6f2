"""Export this tool's measurements and graphs as a PerfSeer / GAPP-style dataset.

For every ``ok`` training measurement with a description, writes ``<out>/<network>_bs<batch>.pkl``
(a ``networkx.DiGraph`` holding only builtin types) and ``<out>/<network>_bs<batch>.txt`` (the label
dict literal). The format is described in :mod:`perf4sight.importers.perfseer`; per node, in the
description's order:

    type             ONNX op name (:data:`perf4sight.importers.perfseer.OP_TO_ONNX`; every op of the
                     description schema has one, ``silu`` being ONNX's ``Swish``)
    args             our attributes (in_channels, kernel_size, stride, ...), exactly as described
    inputs           input node names in argument order, the network input included (an extra key;
                     PerfSeer tools ignore it)
    memory_info      batch_size, input_shape / output_shape with the batch dimension, input_size /
                     output_size / weight_size in bytes (fp32), for the whole batch
    flops            forward FLOPs for the whole batch (1 multiply-add = 2 FLOPs)
    arith_intensity  flops / (bytes read + bytes written)

Graph attributes: name, network, pruning_level, input_shape, batch_size, ``source`` = "perf4sight",
and, for reading the file back exactly, input_node, output, params, num_classes,
description_extra (the description's other top-level fields), perf4sight_row (the measurement
row's non-empty columns as text) and memory_column (the column exported as peak_memory_usuage).

Label: ``train`` = time (ms, median step) | average_sm_util (% , when measured) | average_memory_util |
average_memory_usuage | peak_sm_util | peak_memory_util | peak_memory_usuage (MiB, the fingerprint's
memory target); figures this tool does not measure are written as ``nan``; ``infer`` is all ``nan``.

Every description is checked before the first file is written: a description the format cannot
hold stops the export with one line naming device, network, node and op, and nothing written.
"""
from __future__ import annotations

import math
import pickle
import re
from pathlib import Path
from typing import Any, Iterable

from perf4sight.errors import UserError
from perf4sight.features.formulas import BYTES_PER_ELEMENT, numel
from perf4sight.features.walk import walk
from perf4sight.importers.perfseer import LABEL_FIELDS, OP_TO_ONNX, PERF4SIGHT_SOURCE
from perf4sight.ir.schema import NetworkDescription
from perf4sight.profiling.results import batch_size_of, loss_of, phase_of

__all__ = ["export_perfseer", "description_to_graph", "exportable_rows", "check_exportable"]


def _graph_meta(desc: NetworkDescription, batch_size: int) -> dict[str, Any]:
    """Graph-level attributes: PerfSeer's own plus what reading the file back exactly needs."""
    return {"name": desc.name, "network": desc.network, "pruning_level": desc.pruning_level,
            "input_shape": list(desc.input_shape), "batch_size": int(batch_size), "source": PERF4SIGHT_SOURCE,
            "input_node": desc.nodes[0].name, "output": desc.output, "params": desc.params,
            "num_classes": desc.num_classes, "description_extra": dict(desc.extra)}


def _onnx_type(node: Any) -> str | None:
    """The ONNX type ``node`` is written as; None where it has none: ONNX's Softplus has no beta (and no threshold,
    past which torch's returns x), so only a softplus of beta 1 and threshold 20 (torch's defaults) is one; ONNX's
    SpaceToDepth orders the channels of more than one input channel otherwise than torch's pixel_unshuffle does, so
    only an unshuffle of one channel (an output of r^2) is one."""
    if node.op == "softplus" and (float(node.attrs["beta"]), float(node.attrs["threshold"])) != (1.0, 20.0):
        return None
    if node.op == "pixel_unshuffle" and node.output_shape[0] != int(node.attrs["downscale_factor"]) ** 2:
        return None
    return OP_TO_ONNX.get(node.op)


def description_to_graph(desc: NetworkDescription, batch_size: int) -> Any:
    """A ``networkx.DiGraph`` of ``desc`` at ``batch_size`` in the PerfSeer node-feature format."""
    import networkx as nx
    g = nx.DiGraph(**_graph_meta(desc, batch_size))
    input_name = desc.nodes[0].name
    b = int(batch_size)
    for visit in walk(desc):
        node, in_shapes, cost = visit.node, visit.in_shapes, visit.cost
        if node.name == input_name:
            continue
        if _onnx_type(node) is None or cost is None:
            raise UserError(f"export: network '{desc.name}' node '{node.name}' has op '{node.op}' "
                            f"with no PerfSeer (ONNX) type")
        moved = cost.bytes_read + cost.bytes_written
        flops = cost.flops_fwd * b
        g.add_node(node.name, feature={
            "type": _onnx_type(node),
            "args": {k: (list(v) if isinstance(v, tuple) else v) for k, v in node.attrs.items()},
            "inputs": list(node.inputs),
            "memory_info": {"batch_size": b, "input_shape": [b] + list(in_shapes[0]) if in_shapes else [],
                            "output_shape": [b] + list(node.output_shape),
                            "input_size": int(sum(numel(s) for s in in_shapes) * BYTES_PER_ELEMENT * b),
                            "output_size": int(numel(node.output_shape) * BYTES_PER_ELEMENT * b),
                            "weight_size": int(cost.params * BYTES_PER_ELEMENT)},
            "flops": float(flops), "arith_intensity": float(flops / (moved * b)) if moved else 0.0})
        for i in node.inputs:
            if i != input_name:
                g.add_edge(i, node.name)
    return g


def _fig(row: dict[str, Any], col: str) -> str:
    """A row's figure as label text; ``nan`` when not measured (an empty or non-numeric cell)."""
    try:
        v = float(row.get(col, ""))
    except (TypeError, ValueError):
        return "nan"
    return repr(v) if math.isfinite(v) else "nan"


def exportable_rows(rows: Iterable[dict[str, Any]],
                    descriptions: dict[str, NetworkDescription]
                    ) -> tuple[list[tuple[dict[str, Any], NetworkDescription]], int]:
    """(``ok`` rows of SGD's training step with a cross entropy paired with their description, rows skipped for having
    none)."""
    pairs, skipped = [], 0
    for r in rows:
        if r.get("status") != "ok" or phase_of(r) != "train" or loss_of(r) != "cross_entropy":
            continue
        desc = descriptions.get(str(r["network"]))
        if desc is None:
            skipped += 1
        else:
            pairs.append((r, desc))
    return pairs, skipped


def check_exportable(pairs: list[tuple[dict[str, Any], NetworkDescription]]) -> None:
    """Raise ``UserError`` (device, network, node, op) for the first description the format cannot
    hold; run before anything is written so a failed export leaves no files behind."""
    seen: set[str] = set()
    for row, desc in pairs:
        if desc.name in seen:
            continue
        seen.add(desc.name)
        for visit in walk(desc):
            node = visit.node
            if node.name != desc.nodes[0].name and (_onnx_type(node) is None or visit.cost is None):
                raise UserError(f"export: device '{row.get('device', '?')}' network '{desc.name}' node "
                                f"'{node.name}' has op '{node.op}' with no PerfSeer (ONNX) type; nothing written")


def _label_text(row: dict[str, Any], memory_column: str) -> str:
    """The label dict literal of one row (figures this tool does not measure are ``nan``)."""
    figs = {"time": _fig(row, "latency_ms_median"), "average_sm_util": _fig(row, "gpu_util_pct"),
            "peak_memory_usuage": _fig(row, memory_column)}
    train = "|".join(figs.get(k, "nan") for k in LABEL_FIELDS)
    return repr({"train": train, "infer": "|".join(["nan"] * len(LABEL_FIELDS))}) + "\n"


def _row_record(row: dict[str, Any]) -> dict[str, str]:
    """The row's non-empty cells as text (``perf4sight_row``), for an exact re-import."""
    return {str(k): str(v) for k, v in row.items() if k is not None and v not in ("", None)}


def export_perfseer(rows: Iterable[dict[str, Any]], descriptions: dict[str, NetworkDescription],
                    out_dir: str | Path, memory_column: str = "device_mem_used_mb") -> dict[str, Any]:
    """Write one graph + label pair per ``ok`` training row; returns counts and the folder.

    ``memory_column``: the tidy column exported as ``peak_memory_usuage`` (``peak_rss_mb`` for
    cpu-backend data). Rows without a description are counted in ``skipped_no_description``.
    Every description is checked first (:func:`check_exportable`): on error nothing is written.
    """
    pairs, skipped = exportable_rows(rows, descriptions)
    check_exportable(pairs)
    stems = [re.sub(r"[^\w.-]+", "_", desc.name) + f"_bs{batch_size_of(r)}" for r, desc in pairs]
    named: dict[str, tuple[str, str]] = {}
    for stem, (r, desc) in zip(stems, pairs):  # two rows written as one file: the second would replace the first
        first = named.setdefault(stem, (desc.name, str(r.get("input_shape", ""))))
        if first != (desc.name, str(r.get("input_shape", ""))):
            if first[0] == desc.name:
                raise UserError(f"network '{desc.name}' has rows at batch size {batch_size_of(r)} of two input shapes "
                                f"({first[1]} and {r.get('input_shape')}), which would both be written as {stem}.pkl "
                                "(a graph is of one input shape); nothing written")
            raise UserError(f"networks '{first[0]}' and '{desc.name}' would both be written as {stem}.pkl (a file "
                            "name keeps letters, digits, '.', '-' and '_'): rename one; nothing written")
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    for stem, (r, desc) in zip(stems, pairs):
        b = batch_size_of(r)
        graph = description_to_graph(desc, b)
        graph.graph["perf4sight_row"] = _row_record(r)
        graph.graph["memory_column"] = memory_column
        (out / f"{stem}.pkl").write_bytes(pickle.dumps(graph, protocol=4))
        (out / f"{stem}.txt").write_text(_label_text(r, memory_column))
    return {"folder": str(out), "graphs_written": len(pairs), "skipped_no_description": skipped}
