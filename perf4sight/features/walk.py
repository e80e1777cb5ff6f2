"""The one walk over a description's nodes that every per-node consumer shares.

Network features (``aggregate.py``), kernel-level latency terms (``latency_terms.py``), the GNN's
node tensors (``fingerprint/gnn_graph.py``) and the PerfSeer export all need, per node, the
shapes of its inputs, its cost from :data:`~perf4sight.features.formulas.HANDLERS`, and whether it
reads only the network input, with what it keeps for backward under the rules of the torch that ran the step
(a ``StepRuntime``). The last decides whether an input gradient is computed (none is for
the network input), and it must hold through views: a conv reading ``flatten(input)`` or an
``identity`` of the input computes no input gradient either. Keeping that rule here keeps the four
consumers in agreement.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Iterator

from perf4sight.features.formulas import HANDLERS, OpCost
from perf4sight.features.step_runtime import StepRuntime
from perf4sight.ir.schema import NetworkDescription, Node

__all__ = ["Visit", "walk", "consumer_counts"]


@dataclass(frozen=True)
class Visit:
    """One node as the walk sees it. Shapes exclude the batch dimension."""

    node: Node
    in_shapes: list[list[int]]
    first: bool           # every input is the network input or a view of it: no input gradient
    cost: OpCost | None   # None: the op has no cost formula
    base: str             # the tensor whose storage this node's output shares (its own name unless a view)


def walk(desc: NetworkDescription, runtime: StepRuntime = StepRuntime()) -> Iterator[Visit]:
    """Visit the nodes of ``desc`` in order (the description's order is topological), each cost with what it keeps
    for backward under ``runtime``'s rules (``step_runtime.py``; the default: the formulas' own)."""
    shapes: dict[str, list[int]] = {}
    base: dict[str, str] = {}
    input_name = desc.nodes[0].name
    for node in desc.nodes:
        in_shapes = [shapes[i] for i in node.inputs]
        shapes[node.name] = node.output_shape
        first = bool(node.inputs) and all(base.get(i, i) == input_name for i in node.inputs)
        handler = HANDLERS.get(node.op)
        cost = runtime.applied(node.op, handler(node, in_shapes, first)) if handler is not None else None
        is_view = cost is not None and cost.kind == "view" and bool(node.inputs)
        base[node.name] = base.get(node.inputs[0], node.inputs[0]) if is_view else node.name
        yield Visit(node, in_shapes, first, cost, base[node.name])


def consumer_counts(desc: NetworkDescription) -> dict[str, int]:
    """How many ops read each tensor (by name); a tensor read ``k`` times receives ``k`` gradients."""
    counts: dict[str, int] = {}
    for node in desc.nodes:
        for i in node.inputs:
            counts[i] = counts.get(i, 0) + 1
    return counts
