"""EfficientDet's BiFPN fusion found in a torch.fx trace: the op ``weighted_sum`` (:mod:`perf4sight.ir.schema`).

A BiFPN node fuses n maps of one shape with n learnt scalars, normalised ("fast normalised fusion")::

    w = F.relu(self.w)                      # or nn.ReLU()(self.w), torch.relu, self.w.relu()
    w = w / (torch.sum(w, dim=0) + eps)     # or w.sum(0), w.sum()
    out = w[0] * a + w[1] * b (+ w[2] * c)

or with ``w = torch.softmax(self.w, 0)``. Every node of the pattern (the relu, the sum, the add of eps, the
division, the picks, the products and the adds) is taken in by one description node, the last add's; a pattern
with a part read elsewhere (a weight or a product used twice) is not one, and is refused as before.
"""
from __future__ import annotations

import operator
from dataclasses import dataclass, field

import torch
import torch.fx as fx
import torch.nn.functional as F
from torch import nn

__all__ = ["Fusion", "weighted_sums"]

_RELUS = {F.relu, torch.relu, "relu"}
_SOFTMAXES = {F.softmax, torch.softmax, "softmax"}
_SUMS = {torch.sum, "sum"}
_ADDS = {operator.add, torch.add, "add"}
_MULS = {operator.mul, torch.mul, "mul"}
_DIVS = {operator.truediv, torch.div, torch.true_divide, "div", "true_divide"}


@dataclass
class Fusion:
    """One BiFPN fusion: its last add (``final``, the description node's name), the parameter read (its target),
    the normalisation ("relu" or "softmax") and eps, the fused maps in weight order, and the fx nodes taken in."""
    final: fx.Node
    parameter: str
    normalize: str
    eps: float
    inputs: list[fx.Node]
    taken: set[str] = field(default_factory=set)

    def attrs(self) -> dict:
        """The description node's attrs (eps for the relu's normalisation only)."""
        a = {"num_inputs": len(self.inputs), "normalize": self.normalize}
        return {**a, "eps": self.eps} if self.normalize == "relu" else a


def _is_call(n: object, targets: set) -> bool:
    return isinstance(n, fx.Node) and n.op in ("call_function", "call_method") and n.target in targets


def _only_users(n: fx.Node, users: set[fx.Node]) -> bool:
    return set(n.users) == users


def _vector_parameter(n: fx.Node, gm: fx.GraphModule) -> int:
    """The number of scalars of the ``[k]`` parameter ``n`` fetches (``get_attr``), k >= 2; 0 for anything else."""
    if n.op != "get_attr":
        return 0
    try:
        p = gm.get_parameter(n.target)
    except AttributeError:
        return 0
    return p.shape[0] if p.dim() == 1 and p.shape[0] >= 2 else 0


def _along_its_one_dim(call: fx.Node, position: int) -> bool:
    """Whether a reduction or softmax ``call`` of a ``[k]`` vector runs along its one dimension (dim 0, -1 or none
    given for a sum), keeping no dimension and casting nothing."""
    dim = call.args[position] if len(call.args) > position else call.kwargs.get("dim")
    if call.kwargs.get("keepdim") or (len(call.args) > position + 1 and call.args[position + 1] is not False
                                      and call.target in _SUMS) or call.kwargs.get("dtype") is not None:
        return False
    if isinstance(dim, (list, tuple)) and len(dim) == 1:
        dim = dim[0]
    return dim in (0, -1) or (dim is None and call.target in _SUMS)


def _is_relu(n: fx.Node, gm: fx.GraphModule) -> bool:
    if n.op == "call_module":
        return type(gm.get_submodule(n.target)) is nn.ReLU
    return _is_call(n, _RELUS) and not n.kwargs.get("inplace") and len(n.args) == 1


def _relu_weights(relu: fx.Node) -> tuple[fx.Node, float] | None:
    """The division ``relu / (sum(relu) + eps)`` read from ``relu`` and its eps; None where ``relu``'s users are not
    that sum and division alone."""
    sums = [u for u in relu.users if _is_call(u, _SUMS) and u.args[0] is relu and _along_its_one_dim(u, 1)]
    divs = [u for u in relu.users if _is_call(u, _DIVS) and len(u.args) == 2 and u.args[0] is relu and not u.kwargs]
    if len(sums) != 1 or len(divs) != 1 or not _only_users(relu, {sums[0], divs[0]}):
        return None
    total, div = sums[0], divs[0]
    shifted = div.args[1]
    if not (_is_call(shifted, _ADDS) and len(shifted.args) == 2 and not shifted.kwargs
            and _only_users(total, {shifted}) and _only_users(shifted, {div})):
        return None
    a, b = shifted.args
    eps = b if a is total else a if b is total else None
    if isinstance(eps, bool) or not isinstance(eps, (int, float)) or eps < 0:
        return None
    return div, float(eps)


def _normalised(parameter: fx.Node, first: fx.Node, gm: fx.GraphModule) -> tuple[fx.Node, str, float, set[str]] | None:
    """The node of ``parameter``'s normalised weights that its read ``first`` begins, its normalisation, eps and the
    nodes computing it; None where ``first`` begins no normalisation."""
    if _is_call(first, _SOFTMAXES) and first.args[0] is parameter and _along_its_one_dim(first, 1):
        return first, "softmax", 0.0, {first.name}
    if not _is_relu(first, gm) or first.args[0] is not parameter:
        return None
    found = _relu_weights(first)
    if found is None:
        return None
    div, eps = found
    return div, "relu", eps, {first.name, div.name, *(u.name for u in first.users), div.args[1].name}


def _products(weights: fx.Node, k: int) -> dict[fx.Node, tuple[int, fx.Node]] | None:
    """Each product ``weights[i] * x`` (either order) -> (i, x), one per index in [0, k); None where a weight is
    read otherwise or twice."""
    products: dict[fx.Node, tuple[int, fx.Node]] = {}
    for pick in weights.users:
        if not (pick.op == "call_function" and pick.target is operator.getitem and isinstance(pick.args[1], int)
                and -k <= pick.args[1] < k and len(pick.users) == 1):
            return None
        product = next(iter(pick.users))
        if not (_is_call(product, _MULS) and len(product.args) == 2 and not product.kwargs):
            return None
        a, b = product.args
        x = b if a is pick else a
        if x is pick or not isinstance(x, fx.Node):
            return None
        products[product] = (pick.args[1] % k, x)
    if sorted(i for i, _ in products.values()) != list(range(k)):
        return None
    return products


def _summed(products: dict[fx.Node, tuple[int, fx.Node]], k: int) -> tuple[fx.Node, set[str]] | None:
    """The add that sums every product (through adds of them alone, each read once) and the adds below it; None
    where the products are not summed so."""
    covered = {p: {i} for p, (i, _) in products.items()}
    adds: set[str] = set()
    pending = list(covered)
    while pending:
        part = pending.pop()
        if len(covered[part]) == k:
            return part, adds - {part.name}
        if len(part.users) != 1:
            return None
        add = next(iter(part.users))
        if not (_is_call(add, _ADDS) and len(add.args) == 2 and not add.kwargs):
            return None
        a, b = add.args
        if a not in covered or b not in covered:
            continue  # its other operand's sum is still pending; met again from there
        if covered[a] & covered[b]:
            return None
        covered[add] = covered[a] | covered[b]
        adds.add(add.name)
        pending.append(add)
    return None


def _same_shape(nodes: list[fx.Node]) -> bool:
    shapes = [getattr(n.meta.get("tensor_meta"), "shape", None) for n in nodes]
    return None not in shapes and all(list(s) == list(shapes[0]) for s in shapes)


def weighted_sums(gm: fx.GraphModule) -> list[Fusion]:
    """Every BiFPN fusion of ``gm`` (traced, shapes propagated), each parameter's in the order of its reads."""
    found: list[Fusion] = []
    reads = [(p, first) for p in gm.graph.nodes if _vector_parameter(p, gm) for first in p.users]
    for parameter, first in reads:
        k = _vector_parameter(parameter, gm)
        normalised = _normalised(parameter, first, gm)
        if normalised is None:
            continue
        weights, normalize, eps, taken = normalised
        products = _products(weights, k)
        summed = _summed(products, k) if products else None
        if summed is None:
            continue
        final, adds = summed
        inputs = [x for _, x in sorted(products.values(), key=lambda ix: ix[0])]
        if not _same_shape([*inputs, final]):
            continue
        picks = {u.name for u in weights.users}
        found.append(Fusion(final, parameter.target, normalize, eps, inputs,
                            taken | picks | {p.name for p in products} | adds))
    return found
