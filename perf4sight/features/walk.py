"""The one walk over a description's nodes that every per-node consumer shares.

Network features (``aggregate.py``), kernel-level latency terms (``latency_terms.py``), the GNN's
node tensors (``fingerprint/gnn_graph.py``) and the PerfSeer export all need, per node, the
shapes of its inputs, its cost from :data:`~perf4sight.features.formulas.HANDLERS`, and whether its
inputs need a gradient, with what it keeps for backward under the rules of the torch that ran the step
(a ``StepRuntime``). A tensor needs a gradient as torch's ``requires_grad`` says: the network input needs
none, and an op's output needs one where the op has parameters or any of its inputs needs one. So a view
of the input, an ``identity`` of it, and the output of any parameter-free op of such tensors alone (a pool,
a dropout, an input normalisation ``x * a + b``, a resize, a batch norm without affine parameters) need none.
An op none of whose inputs needs a gradient (``first``) computes no input gradient (a conv or a linear layer
there runs its weight's GEMM alone); one with no parameters besides runs no backward at all: it keeps
nothing and counts no backward FLOPs or kernels; one whose backward computes each input's gradient apart (a
quotient: ``formulas.INPUT_GRADIENTS``) costs the gradients of the inputs that need one. Keeping that rule here keeps
the four consumers in agreement.
An activation run in place on a copy of its input (``on_copy``), a linear layer of N-D input whose rows do not fold
(a view of tokens transposed out of a map: ``strided_views.rows_copied``) and an activation in place that keeps a
clone of its input (``StepRuntime.clones_input``) cost each copy's kernel too (``formulas.copied_first``); the linear
layer keeps its copy (``Visit.input_copies``), and so does a matmul of 4 or more dims whose input's dims before its
last two do not fold (``strided_views.batch_copied``: its bmm reads a copy; ``Visit.copied_inputs``).
A node that ``shares`` an earlier node's parameters (one layer called twice) costs its own FLOPs, bytes and saved
tensors, and holds no parameters (``params`` and ``param_tensors`` 0: its first call's count them, once).
A node whose output no gradient reaches (:func:`untrained_nodes`: a dead branch, ``y = self.b(x)`` never used, or a
value read only as a where's condition or for a sort's indices) runs its forward alone, as torch runs it: no backward
(``Visit.trained`` false), nothing kept, and its parameters get no gradient (``.grad`` stays None), so no optimiser
state or update either; they exist all the same (``params`` counts them).
A frozen parameter (``requires_grad`` False, named by the description: ``frozen.py``) gets no gradient either: a node
whose parameters are all frozen needs a gradient only where an input does (a frozen stem on the network input runs
no backward, keeps nothing), and one whose input needs it computes that gradient alone (``frozen.frozen_cost``: no
weight or bias gradient of a frozen convolution or linear layer; ``Visit.frozen`` says what is frozen, for the kernel
table; :func:`trained_params` leaves frozen parameters out).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Iterable, Iterator

from perf4sight.features.formulas import HANDLERS, INPUT_GRADIENTS, NO_GRADIENT_OPS, OpCost, changed, copied_first
from perf4sight.features.frozen import FrozenSplit, frozen_cost, frozen_of, frozen_split
from perf4sight.features.step_runtime import StepRuntime
from perf4sight.features.strided_views import batch_copied, rows_copied
from perf4sight.ir.schema import SHARES, NetworkDescription, Node, split_group, unbind_group, where_condition_inputs

__all__ = ["Visit", "walk", "consumer_counts", "gradient_accumulations", "untrained_nodes", "unreached",
           "trained_params", "trained_tensors", "split_gathers"]


@dataclass(slots=True)
class Visit:
    """One node as the walk sees it. Shapes exclude the batch dimension. Not frozen (a frozen dataclass's
    ``__init__`` sets each of its fields through ``object.__setattr__``: the walk makes one a node); nothing changes
    a visit once made."""

    node: Node
    in_shapes: list[list[int]]
    first: bool           # no input needs a gradient (the network input, views of it, what depends on them alone)
    cost: OpCost | None   # None: the op has no cost formula
    base: str             # the tensor whose storage this node's output shares (its own name unless a view)
    needs_grad: bool = True  # the output needs a gradient (False: the op runs no backward)
    # copies of its first input the op makes before it runs, each a forward kernel of the input read and written: an
    # activation in place on a copy (on_copy), a linear layer of rows that do not fold (strided_views.rows_copied),
    # which keeps its copy, an activation in place that keeps a clone of its input (StepRuntime.clones_input)
    input_copies: int = 0
    # the inputs of a matmul of 4 or more dims that torch copies before its bmm (strided_views.batch_copied), each a
    # forward kernel of that input read and written, the copy what the bmm keeps
    copied_inputs: tuple[int, ...] = ()
    # the backward kernels of the op's whole backward, every input's gradient (``cost``'s: of those that need one,
    # ``formulas.INPUT_GRADIENTS``, where some input needs none)
    all_kernels_bwd: int = 0
    # a gradient reaches the output (False: untrained_nodes', a dead branch: no backward, needs_grad False too, and
    # its parameters no gradient)
    trained: bool = True
    # what of its layer's parameters is frozen (``frozen.py``: no gradient, no optimiser state), None: nothing
    frozen: FrozenSplit | None = None


def walk(desc: NetworkDescription, runtime: StepRuntime = StepRuntime()) -> Iterator[Visit]:
    """Visit the nodes of ``desc`` in order (the description's order is topological), each cost with what it keeps
    for backward under ``runtime``'s rules (``step_runtime.py``; the default: the formulas' own); an op whose
    output needs no gradient (module docstring) with no backward cost (nothing kept, 0 backward FLOPs and
    kernels). An op without a cost formula is taken to need a gradient (it may have parameters). A node no gradient
    reaches (:func:`untrained_nodes`) has no backward cost either, its parameters still counted."""
    untrained = untrained_nodes(desc)
    frozen = frozen_of(desc)
    shapes: dict[str, list[int]] = {}
    base: dict[str, str] = {}
    grad: dict[str, bool] = {}  # tensor -> it needs a gradient
    nodes: dict[str, Node] = {}
    for node in desc.nodes:
        in_shapes = [shapes[i] for i in node.inputs]
        shapes[node.name], nodes[node.name] = node.output_shape, node
        fed = any(grad[i] for i in node.inputs)  # a gradient flows back into some input
        first = bool(node.inputs) and not fed
        handler = HANDLERS.get(node.op)
        on_copy = bool(node.attrs.get("on_copy"))
        cost = None if handler is None else runtime.applied(node.op, handler(node, in_shapes, first), on_copy=on_copy)
        split = frozen_split(node, frozen.get(node.attrs.get(SHARES, node.name))) if frozen else None
        copies = _input_copies(node, runtime, nodes, base, shapes, fed, split is not None and split.weight)
        for _ in range(copies if cost is not None else 0):  # after the runtime's rules (which read the op's bytes)
            cost = copied_first(cost, in_shapes[0])
        copied = _matmul_copies(node, nodes, base, shapes) if cost is not None and node.op == "matmul" else ()
        for i in copied:
            cost = copied_first(cost, in_shapes[i])
        all_kernels_bwd = 0 if cost is None else cost.kernels_bwd
        if cost is not None and fed and node.op in INPUT_GRADIENTS:  # the gradients of those inputs that need one
            cost = INPUT_GRADIENTS[node.op](cost, node, [grad[i] for i in node.inputs], in_shapes)
        if cost is not None and split is not None:  # its frozen parameters' gradients not computed
            cost = frozen_cost(cost, node, split)
        trainable = cost is None or cost.params > (split.params if split is not None else 0)
        grad[node.name] = (trainable or fed) and node.op not in NO_GRADIENT_OPS  # input: False
        if cost is not None and SHARES in node.attrs:  # a layer called again: its parameters are its first call's
            cost = changed(cost, params=0, param_tensors=0)
        trained = node.name not in untrained
        if cost is not None and not (grad[node.name] and trained):
            cost = changed(cost, flops_bwd=0.0, kernels_bwd=0, saved=[], extra_saved_bytes=0.0, batch_saved=())
        is_view = cost is not None and cost.kind == "view" and bool(node.inputs)
        base[node.name] = base.get(node.inputs[0], node.inputs[0]) if is_view else node.name
        yield Visit(node, in_shapes, first, cost, base[node.name], grad[node.name] and trained, copies, copied,
                    all_kernels_bwd, trained, split)


def _input_copies(node: Node, runtime: StepRuntime, nodes: dict[str, Node], base: dict[str, str],
                  shapes: dict[str, list[int]], fed: bool, frozen_weight: bool = False) -> int:
    """Copies of its first input ``node`` makes before it runs (:attr:`Visit.input_copies`; ``nodes``, ``base`` and
    ``shapes``: the walk's so far). An in-place activation's clone is autograd's, made only where its input needs a
    gradient (``fed``; none for the network input or what parameter-free ops made of it alone: a dispatch log of
    torch 2.14). A linear layer of a frozen weight (``frozen_weight``) copies no rows: torch's matmul folds a strided
    input into rows only where the weight needs a gradient (a bmm of the weight expanded else)."""
    on_copy = bool(node.attrs.get("on_copy"))
    rows = node.op == "linear" and not frozen_weight and rows_copied(nodes, node.inputs[0], base, shapes)
    clone = fed and runtime.clones_input(node.op, on_copy or bool(node.attrs.get("inplace")))
    return int(on_copy) + int(rows) + int(clone)


def _matmul_copies(node: Node, nodes: dict[str, Node], base: dict[str, str],
                   shapes: dict[str, list[int]]) -> tuple[int, ...]:
    """The inputs of ``node``, a matmul, that torch copies before its bmm (:attr:`Visit.copied_inputs`): views whose
    dims before their last two do not fold, of those dims the output's (a broadcast one is left as it is)."""
    return tuple(i for i, name in enumerate(node.inputs)
                 if shapes[name][:-2] == node.output_shape[:-2] and batch_copied(nodes, name, base, shapes))


def _gradient_inputs(node: Node) -> list[str]:
    """The inputs of ``node`` its backward hands a gradient to: all but a where's condition reads (compared, no
    gradient back) and the tensor a sort or topk of ``gather`` sorts (its indices alone read)."""
    if node.op in NO_GRADIENT_OPS:  # its input's shape alone read
        return []
    if node.op == "where":
        return list(node.inputs[where_condition_inputs(node.attrs):])
    if node.attrs.get("gather") and node.op in ("sort", "topk"):
        return list(node.inputs[1:])
    return list(node.inputs)


def unreached(desc: NetworkDescription, edges: Callable[[Node], Iterable[str]]) -> frozenset[str]:
    """The nodes of ``desc`` from which no path leads to the network's output, a path going from a node to each value
    ``edges(node)`` names (its inputs that count): :func:`untrained_nodes`' gradient inputs, or the values the
    rebuilt module's call reads (``alloc_model._dead_nodes``). The description's order is topological, so one pass
    from its end reaches them all."""
    reached = {desc.output}
    for node in reversed(desc.nodes):
        if node.name in reached:
            reached.update(edges(node))
    return frozenset(n.name for n in desc.nodes if n.name not in reached)


def untrained_nodes(desc: NetworkDescription) -> frozenset[str]:
    """The nodes whose output no gradient reaches: no path of reads that take a gradient (:func:`_gradient_inputs`)
    leads from them to the network's output. A dead branch (``y = self.b(x)``, ``y`` never used: torch.fx keeps the
    call, and torch runs it forward) and what only such nodes read; a value read only as a where's condition or for a
    sort's indices too. torch runs their forward alone: no backward kernels, nothing kept once their output is
    dropped, their parameters' ``.grad`` None (no optimiser state, no update). Their output may still need a
    gradient as torch's ``requires_grad`` says (:class:`Visit`'s ``needs_grad`` is false for them all the same)."""
    return unreached(desc, _gradient_inputs)


def trained_params(visits: Iterable[Visit]) -> tuple[float, int]:
    """The parameters and parameter tensors of ``walk``'s ``visits`` that get a gradient: a layer's, where any of its
    calls is trained (``Visit.trained``; its first call's node counts them, later ones ``share`` them)."""
    visits = list(visits)
    trained = {v.node.attrs.get(SHARES, v.node.name) for v in visits if v.trained}
    owned = [v for v in visits if v.cost is not None and SHARES not in v.node.attrs and v.node.name in trained]
    return (float(sum(v.cost.params - (v.frozen.params if v.frozen else 0) for v in owned)),
            int(sum(v.cost.param_tensors - _frozen_tensors(v) for v in owned)))


def trained_tensors(v: Visit) -> int:
    """The parameter tensors of ``v``'s layer (its cost's) that get a gradient: those not frozen."""
    return v.cost.param_tensors - _frozen_tensors(v)


def _frozen_tensors(v: Visit) -> int:
    """The parameter tensors of ``v``'s layer that are frozen (all of them where it is frozen whole)."""
    if v.frozen is None:
        return 0
    return v.cost.param_tensors if v.frozen.whole else min(v.frozen.tensors, v.cost.param_tensors)


def consumer_counts(desc: NetworkDescription) -> dict[str, int]:
    """How many ops read each tensor (by name); a tensor read ``k`` times receives ``k`` gradients (where it needs
    one: ``Visit.needs_grad``)."""
    counts: dict[str, int] = {}
    for node in desc.nodes:
        for i in node.inputs:
            counts[i] = counts.get(i, 0) + 1
    return counts


def gradient_accumulations(desc: NetworkDescription, visits: Iterable[Visit]) -> dict[str, int]:
    """Per tensor read by ``k`` > 1 ops that needs a gradient (``Visit.needs_grad`` of ``walk(desc)``'s visits): its
    ``k`` - 1 accumulation adds, in node order. A tensor that needs none (the network input, what parameter-free ops
    make of it alone) receives no gradients to add up, and neither does a where's condition read (its compared inputs:
    :func:`_condition_reads`) nor a read by a node no gradient reaches (``Visit.trained``: a dead branch's); the
    pieces of one split (narrows of ``split_sizes``) or unbind (selects of ``unbind``) hand it one gradient, their
    cat's or stack's (:func:`split_gathers`), and two nodes of one piece (``p[0]`` indexed twice) are one tensor,
    whose gradients are added first (counted at the first node)."""
    visits = list(visits)
    needs_grad = {visit.node.name: visit.needs_grad for visit in visits}
    conditions = _condition_reads(desc)
    counts = {name: k - conditions.get(name, 0) for name, k in consumer_counts(desc).items()}
    for visit in visits:
        if not visit.trained:
            for name in _gradient_inputs(visit.node):
                counts[name] -= 1
    shapes = {visit.node.name: visit.node.output_shape for visit in visits}
    for group, pieces in _trained_splits(visits).items():  # a split's or an unbind's pieces: one gradient, its cat's
        counts[pieces[0].inputs[0]] -= len(pieces) - 1
        first: dict[int, str] = {}  # two nodes of one piece (p[0] read twice, or as p[-8]): one tensor, its grads added
        for piece, at in zip(pieces, _piece_places(group, pieces, shapes[pieces[0].inputs[0]])[1]):
            if at in first:
                counts[first[at]] += 1
            else:
                first[at] = piece.name
    return {name: k - 1 for name, k in counts.items() if k > 1 and needs_grad[name]}


def _piece_group(node: Node) -> tuple | None:
    """The call whose piece ``node`` is: a torch.split's (a narrow of ``split_sizes``: ``schema.split_group``) or a
    torch.unbind's (a select of ``unbind``: ``("unbind",) + schema.unbind_group``); None for any other node."""
    group = split_group(node)
    if group is not None:
        return group
    unbound = unbind_group(node)
    return None if unbound is None else ("unbind", *unbound)


def _trained_splits(visits: Iterable[Visit]) -> dict[tuple, list[Node]]:
    """The torch.split and torch.unbind calls (:func:`_piece_group`) some trained piece of which (a gradient reaches
    it) is read, each with those pieces."""
    splits: dict[tuple, list[Node]] = {}
    for visit in visits:
        group = _piece_group(visit.node)
        if group is not None and visit.trained:
            splits.setdefault(group, []).append(visit.node)
    return splits


def split_gathers(visits: Iterable[Visit]) -> list[tuple[float, float, int]]:
    """The backward of each torch.split call a gradient reaches (a chunk's, rebuilt as one split: ``to_torch``), as
    torch runs it: zeros for each piece no gradient reaches (or no node reads), then one ``cat`` of the pieces'
    gradients into the input's; a torch.unbind's alike (zeros, then one ``stack``). Per call (elements of the input,
    elements of those zeros, how many pieces they are), per sample; none where the input needs no gradient (the
    network input's pieces)."""
    visits = list(visits)
    needs_grad = {v.node.name: v.needs_grad for v in visits}
    shapes = {v.node.name: v.node.output_shape for v in visits}
    out = []
    for group, pieces in _trained_splits(visits).items():
        name = pieces[0].inputs[0]
        if not needs_grad[name]:
            continue
        elems = 1
        for s in shapes[name]:
            elems *= int(s)
        sizes, places = _piece_places(group, pieces, shapes[name])
        starts = set(places)
        missing = [s for i, s in enumerate(sizes) if sum(sizes[:i]) not in starts]
        out.append((float(elems), float(elems * sum(missing) / sum(sizes)), len(missing)))
    return out


def _piece_places(group: tuple, pieces: list[Node], shape: list[int]) -> tuple[list[int], list[int]]:
    """The sizes of the pieces of a split or unbind call (``group``: :func:`_piece_group`) whose input is of per-sample
    ``shape``, and where each of ``pieces`` starts along its dim: an unbind's every index a piece of one element's
    width, its dim counting the batch's (a description file may count it and an index from the end)."""
    if pieces[0].op == "select":
        dim = group[2]
        count = int(shape[dim + len(shape) if dim < 0 else dim - 1])
        return [1] * count, [i + count if i < 0 else i for i in (int(p.attrs["index"]) for p in pieces)]
    return list(group[2]), [int(p.attrs["start"]) for p in pieces]


def _condition_reads(desc: NetworkDescription) -> dict[str, int]:
    """How many times each tensor is read as a where's condition (compared, no gradient back), or as the tensor a
    sort or topk of ``gather`` sorts (its indices alone read: no gradient back)."""
    reads: dict[str, int] = {}
    for node in desc.nodes:
        if node.op == "where":
            for name in node.inputs[:where_condition_inputs(node.attrs)]:
                reads[name] = reads.get(name, 0) + 1
        elif node.attrs.get("gather") and node.op in ("sort", "topk"):
            reads[node.inputs[0]] = reads.get(node.inputs[0], 0) + 1
    return reads
