"""Calls research code makes that the description once refused by name: torch.logsumexp, torch.cumsum, torch.where of
a condition computed from the data, F.affine_grid with F.grid_sample. Each is described as torch computes it (the
module rebuilt from the description computes the original's output and gradients), costed as torch runs it (a
dispatch log), keeps what autograd keeps, is written down by the allocation model as the meta trace records it, and a
network holding it prunes and trains."""
from __future__ import annotations

import dataclasses
import math

import pytest
import torch
import torch.nn.functional as F
from test_ir_maths_calls import SHAPE, _computes_the_same, _Probe

from torch import nn

from perf4sight.errors import UserError
from perf4sight.ir.from_torch import describe
from perf4sight.ir.schema import NetworkDescription

#: Patterns of a [8, 8, 8] map: (pattern, the op it describes to, the torch call run alone on a [1, 8, 8, 8] leaf for
#: the dispatch log: the op's kernels forward and backward).
_CASES = {
    "logsumexp": (lambda y: torch.logsumexp(y, 1, keepdim=True) + y * y.logsumexp((2, 3))[:, :, None, None],
                  "logsumexp", lambda x: torch.logsumexp(x, 1, keepdim=True)),
    "cumsum": (lambda y: torch.cumsum(y, 2) + y.cumsum(-1), "cumsum", lambda x: torch.cumsum(x, 2)),
    "where": (lambda y: torch.where(y > 0, y, 0.1 * y) + torch.where(y.le(0.5), y, 0.0), "where",
              lambda x: torch.where(x > 0, x, 0.1 * x)),
    "where of two tensors": (lambda y: (lambda a: torch.where(y > a, y, a))(y.flip(3)), "where",
                             lambda x: torch.where(x > x.flip(3), x, 0.0)),
    "mask multiplied": (lambda y: y * (y > 0) + (y <= 0.5).mul(y), "where", lambda x: x * (x > 0)),
    "float mask multiplied": (lambda y: y * (y > 0).float() + (y <= 0.5).to(y.dtype).mul(y)
                              + (y >= 0.25).type_as(y) * y, "where", lambda x: x * (x > 0).float()),
    "sort's indices gathered": (lambda y: y.gather(2, y.sort(2, descending=True)[1]) + y, "sort",
                                lambda x: x.gather(2, x.sort(2, descending=True)[1])),
    "topk's indices gathered": (lambda y: (lambda s: y.gather(2, s.topk(y.shape[2], dim=2).indices.unsqueeze(-1)
                                                              .expand(-1, -1, -1, y.shape[3])) + s[..., None])(
                                    y.mean(3)),
                                "topk",
                                lambda x: x.gather(2, x.mean(3).topk(8, dim=2).indices.unsqueeze(-1)
                                                   .expand(-1, -1, -1, 8))),
    "top channels gathered": (lambda y: (lambda s: y.gather(1, s.topk(y.shape[1], 1)[1].expand(
        -1, -1, y.shape[2], y.shape[3])) * s)(y.mean((2, 3), keepdim=True)), "topk",
                              lambda x: x.gather(1, x.mean((2, 3), keepdim=True).topk(4, 1)[1].expand(-1, -1, 8, 8))),
    "argsort's indices gathered": (lambda y: y.gather(2, y.argsort(2, descending=True)) + y, "sort",
                                   lambda x: x.gather(2, x.argsort(2, descending=True))),
    "einsum summing a product": (lambda y: y * torch.einsum("bchw,bchw->bch", y, y.sigmoid())[..., None]
                                 + torch.einsum("bc,bc->b", y.mean((2, 3)), y.amax((2, 3)))[:, None, None, None],
                                 "matmul", lambda x: torch.einsum("bchw,bchw->bch", x, x * 2)),
    "einsum of a broadcast operand": (lambda y: torch.einsum("bc,bchw->bchw", y.mean((2, 3)).sigmoid(), y)
                                      + torch.einsum("bchw,bhw->bchw", y, y.mean(1)), "mul",
                                      lambda x: torch.einsum("bchw,bhw->bchw", x, x.mean(1))),
    "einsum pooling at weights": (lambda y: y * torch.einsum("bchw,bhw->bc", y, y.mean(1).sigmoid())[..., None, None],
                                  "matmul", lambda x: torch.einsum("bchw,bhw->bc", x, x.mean(1))),
}
#: torch.where forms: (pattern, the where nodes' (inputs, attrs)).
_WHERES = {
    "leaky gate": (lambda y: torch.where(y > 0, y, 0.1 * y), [(["conv", "conv", "mul"],
                                                                 {"compare": "gt", "threshold": 0.0})]),
    "mask of the data": (lambda y: torch.where(y.mean(1, keepdim=True) >= 0.1, y, -y),
                         [(["mean", "conv", "neg"], {"compare": "ge", "threshold": 0.1})]),
    "numbers and a method": (lambda y: torch.where(y.lt(0.5), y, 0.0) + torch.where(0.5 >= y.sigmoid(), -1.0, y),
                             [(["conv", "conv"], {"compare": "lt", "threshold": 0.5, "if_false": 0.0}),
                              (["sigmoid", "conv"], {"compare": "le", "threshold": 0.5, "if_true": -1.0})]),
    "masked_fill, == and !=": (lambda y: y.masked_fill(y < 0, 0.0) + torch.masked_fill(y, y.sigmoid().ne(0.5), -1)
                               + torch.where(y == 0.25, y, 0.0),
                               [(["conv", "conv"], {"compare": "lt", "threshold": 0.0, "if_true": 0.0}),
                                (["sigmoid", "conv"], {"compare": "ne", "threshold": 0.5, "if_true": -1.0}),
                                (["conv", "conv"], {"compare": "eq", "threshold": 0.25, "if_false": 0.0})]),
    "masked_fill_ in place": (lambda y: y.masked_fill_(y < 0, 0.0) + (y * 2).masked_fill_(y.sigmoid().ge(0.5), -1.0),
                              [(["conv", "conv"], {"compare": "lt", "threshold": 0.0, "if_true": 0.0, "inplace": True}),
                               (["sigmoid", "mul"], {"compare": "ge", "threshold": 0.5, "if_true": -1.0,
                                                     "inplace": True})]),
    "two tensors compared": (lambda y: (lambda a: torch.where(y > a, y, a) + y.masked_fill(y.mean(1, keepdim=True)
                                                                                           <= y, -1.0))(y.flip(3)),
                             [(["conv", "flip", "conv", "flip"], {"compare": "gt", "threshold": 0.0,
                                                                 "compare_inputs": True}),
                              (["mean", "conv", "conv"], {"compare": "le", "threshold": 0.0, "if_true": -1.0,
                                                          "compare_inputs": True})]),
    "the method x.where": (lambda y: y.where(y > 0, -y) + (lambda a: y.where(a <= y, 0.5))(y.flip(2)),
                           [(["conv", "conv", "neg"], {"compare": "gt", "threshold": 0.0}),
                            (["flip", "conv", "conv"], {"compare": "le", "threshold": 0.0, "if_false": 0.5,
                                                        "compare_inputs": True})]),
    "torch.finfo's numbers": (lambda y: y.masked_fill(y < 0, -torch.finfo(y.dtype).max).softmax(-1)
                              + torch.where(y > 0.5, y, torch.finfo(y.sigmoid().dtype).min).softmax(-1),
                              [(["conv", "conv"], {"compare": "lt", "threshold": 0.0,
                                                   "if_true": -torch.finfo(torch.float32).max}),
                               (["conv", "conv"], {"compare": "gt", "threshold": 0.5,
                                                   "if_false": torch.finfo(torch.float32).min})]),
    "a mask multiplied in": (lambda y: y * (y > 0) + torch.mul(y.mean(1, keepdim=True) <= y, y)
                             + (y.sigmoid() >= 0.5).mul(y),
                             [(["conv", "conv"], {"compare": "gt", "threshold": 0.0, "if_false": 0.0,
                                                  "multiply": True}),
                              (["mean", "conv", "conv"], {"compare": "le", "threshold": 0.0, "compare_inputs": True,
                                                          "if_false": 0.0, "multiply": True}),
                              (["sigmoid", "conv"], {"compare": "ge", "threshold": 0.5, "if_false": 0.0,
                                                     "multiply": True})]),
    "a float mask multiplied in": (lambda y: y * (y > 0).float() + torch.mul((y.mean(1, keepdim=True) <= y).to(y.dtype),
                                                                          y) + (y.sigmoid() >= 0.5).type_as(y).mul(y),
                                   [(["conv", "conv"], {"compare": "gt", "threshold": 0.0, "if_false": 0.0,
                                                        "multiply": True, "float_mask": True}),
                                    (["mean", "conv", "conv"], {"compare": "le", "threshold": 0.0,
                                                                "compare_inputs": True, "if_false": 0.0,
                                                                "multiply": True, "float_mask": True}),
                                    (["sigmoid", "conv"], {"compare": "ge", "threshold": 0.5, "if_false": 0.0,
                                                           "multiply": True, "float_mask": True})]),
    "a mask read twice, broadcast": (
        lambda y: (lambda m: torch.where(m > 0, m, y) * torch.where(m > 0, m, 1.0))(y.mean((2, 3), keepdim=True)),
        [(["mean", "mean", "conv"], {"compare": "gt", "threshold": 0.0}),
         (["mean", "mean"], {"compare": "gt", "threshold": 0.0, "if_false": 1.0})]),
}


def test_logsumexp_is_described():
    """torch.logsumexp and x.logsumexp were refused ("call_function 'logsumexp' has no description op"): they are the
    op logsumexp over their dims (counted from the front), keepdim as given, and the rebuilt module computes the
    original's output and gradients."""
    desc = _computes_the_same(_Probe(_CASES["logsumexp"][0]))
    assert [(n.attrs, n.output_shape) for n in desc.nodes if n.op == "logsumexp"] == [
        ({"dims": [1], "keepdim": True}, [1, 8, 8]), ({"dims": [2, 3], "keepdim": False}, [8])]


@pytest.mark.parametrize("pattern, match", [
    (lambda y: torch.logsumexp(y, 0, keepdim=True), r"a logsumexp along the batch dimension \(dims \[0\]\)"),
    (lambda y: y + torch.logsumexp(y, (-1, 0), keepdim=True), r"a logsumexp along the batch dimension"),
])
def test_a_logsumexp_over_the_batch_is_refused_by_name(pattern, match):
    """A logsumexp across the samples mixes them, which a description never does: refused by name."""
    with pytest.raises(UserError, match=match):
        describe(_Probe(pattern), SHAPE, name="refused")


def test_cumsum_is_described():
    """torch.cumsum and x.cumsum were refused ("call_function 'cumsum' has no description op"): they are the op
    cumsum along their dim (counted from the front), and the rebuilt module computes the original's output and
    gradients."""
    desc = _computes_the_same(_Probe(_CASES["cumsum"][0]))
    assert [n.attrs for n in desc.nodes if n.op == "cumsum"] == [{"dim": 2}, {"dim": 3}]


@pytest.mark.parametrize("pattern, match", [
    (lambda y: torch.cumsum(y, 0), r"a cumsum along the batch dimension \(dims \[0\]\)"),
    (lambda y: y.cumsum(1, dtype=torch.float64).float(), r"a cumsum into dtype torch.float64 has no description op"),
])
def test_a_cumsum_over_the_batch_or_into_another_dtype_is_refused_by_name(pattern, match):
    """A running sum across the samples, or into float64, is refused by name."""
    with pytest.raises(UserError, match=match):
        describe(_Probe(pattern), SHAPE, name="refused")


@pytest.mark.parametrize("form", list(_WHERES))
def test_where_is_described(form):
    """torch.where(x > 0, x, 0.1 * x) was refused ("call_function 'gt' and call_function 'where' have no description
    op"): a where of a condition comparing a tensor with a number (a leaky gate's; a mask computed from the data,
    broadcast, read by two wheres; either side of the compare, as an operator or a method), and of tensors or one
    number, is the op where (its compare, its threshold, a number branch's value), the compare no node of its own;
    the rebuilt module computes the original's output and gradients."""
    pattern, wheres = _WHERES[form]
    desc = _computes_the_same(_Probe(pattern))
    assert [(n.inputs, n.attrs) for n in desc.nodes if n.op == "where"] == wheres
    assert not {"gt", "ge", "lt", "le"} & {n.op for n in desc.nodes}


@pytest.mark.parametrize("pattern, match", [
    (lambda y: y + (y > 0).float(), r"a comparison read by anything but torch.where's condition has no description "
                                    r"op"),
    (lambda y: y * (y > 0).float() + (y > 0).float().sum(1, keepdim=True),
     r"a comparison read by anything but torch.where's condition"),
    (lambda y: y * (y > 0).half(), r"a comparison read by anything but torch.where's condition"),
    (lambda y: y + (y > y.sigmoid()), r"a comparison read by anything but torch.where's condition"),
    (lambda y: torch.where(y > 0, 1.0, 0.0), r"a torch.where of two numbers .* give a tensor for one branch"),
    (lambda y: y.where(y > 0, other=-y), r"x.where\(condition, y\) of keyword arguments has no description op"),
    (lambda y: y.masked_fill((y > 0) & (y < y.sigmoid()), 0.0), r"a comparison read by anything but torch.where"),
])
def test_a_where_of_another_condition_or_form_is_refused_by_name(pattern, match):
    """A comparison made a tensor of its own (a mask multiplied in, two masks and-ed), a where of two numbers (a
    boolean tensor made float) and the method form of keyword arguments are refused by name."""
    with pytest.raises(UserError, match=match):
        describe(_Probe(pattern), SHAPE, name="refused")


def test_a_where_of_a_computed_mask_is_left_to_the_trace():
    """A where whose condition's value needs a gradient and is not a branch (``y.mean(1) > 0``: the node that made
    it is reached by no gradient, and autograd frees it with the value) leaves the allocation model; the trace
    writes it down, and a step's events are the trace's."""
    from perf4sight.features.alloc_model import NotCovered, step_events
    from perf4sight.features.alloc_trace import record_events

    desc = describe(_Probe(_WHERES["mask of the data"][0]), SHAPE, name="mask")
    with pytest.raises(NotCovered, match="a where's condition of 'mean'"):
        step_events(desc, 2)
    assert record_events(desc, 2, method="auto") == record_events(desc, 2, method="trace")


@pytest.mark.parametrize("case", list(_CASES))
@pytest.mark.parametrize("batch", [3, 1])
def test_the_allocation_model_writes_down_the_call_as_traced(case, batch):
    """A logsumexp allocates its output (its temporaries lie below the dispatcher) and keeps its input and result;
    backward ``sub`` and ``exp`` of the input's size, then the gradient (``mul``). A cumsum keeps nothing; backward
    ``flip``, ``cumsum``, then the gradient (``flip``). A where: the condition (a byte an element, kept), a number
    branch wrapped, the output; backward per tensor branch, the false one's first, a wrapped zero and the gradient's
    where. The model's events are the meta trace's, not left to it."""
    from test_allocator import _as_replayed

    from perf4sight.features.alloc_model import COVERED
    from perf4sight.features.alloc_trace import record_events

    desc = describe(_Probe(_CASES[case][0]), SHAPE, name=case)
    model = record_events(desc, batch, steps=2, method="model")
    assert _CASES[case][1] in COVERED
    assert _as_replayed(model) == _as_replayed(record_events(desc, batch, steps=2, method="trace"))


def _profiled_forward(fn, shape: list[int]) -> list[str]:
    """The aten ops torch's profiler records under ``fn`` of a [1, *shape] leaf, forward: those that launch a kernel
    on a GPU (allocations, views, the CPU's reduction fills and conversion wrappers left out), in order."""
    from torch.profiler import profile

    x = torch.randn(1, *shape, requires_grad=True)
    with profile() as prof:
        fn(x)
    skip = {"empty", "empty_strided", "fill_", "real", "to", "detach", "view", "as_strided", "unsqueeze"}
    names = [e.name.split("::")[-1] for e in prof.events() if e.name.startswith("aten::")]
    names = [name for name in names if name not in skip]
    # an op calling its own out= variant (logsumexp, abs) is recorded twice in a row: once
    return [name for i, name in enumerate(names) if i == 0 or name != names[i - 1]]


def test_a_logsumexp_costs_the_kernels_torch_runs():
    """A logsumexp is one aten op (CompositeExplicitAutograd) whose kernel runs, on every device, the max over dims,
    its infinities zeroed, x less the max, its exp, the sum, the log and the max added back (the profiler's ops: 10
    kernels, 4 FLOPs an input element and 5 an output one); backward (a dispatch log) sub, exp and mul of the input's
    size (3 kernels, 3 FLOPs an element). It keeps its input and its result."""
    from test_features import _ops_run

    from perf4sight.features.formulas import OUTPUT
    from perf4sight.features.walk import walk

    pattern, op, torch_run = _CASES["logsumexp"]
    desc = describe(_Probe(pattern), SHAPE, name="logsumexp")
    visit = [v for v in walk(desc) if v.node.op == op][0]
    forward, backward = _ops_run(torch_run, [8, 8, 8])
    assert [name for name, _ in forward] == ["logsumexp"]
    inner = _profiled_forward(torch_run, [8, 8, 8])
    assert inner[0] == "logsumexp" and inner[1:] == ["amax", "abs", "eq", "_to_copy", "copy_", "masked_fill_", "sub",
                                                     "exp_", "sum", "log_", "add_"]
    assert visit.cost.kernels_fwd == len(inner) - 2  # the wrapper and _to_copy's copy_ (one kernel) left out
    assert (visit.cost.kernels_bwd, visit.cost.flops_bwd) == (len(backward), sum(e for _, e in backward))
    n, rows = 8 * 8 * 8, 8 * 8
    assert visit.cost.flops_fwd == 4 * n + 5 * rows
    assert visit.cost.saved == [0, OUTPUT]


def test_a_cumsum_costs_the_kernels_torch_runs():
    """A cumsum is one kernel forward (an add an element); backward (a dispatch log) the gradient flipped, summed and
    flipped back (3 kernels; the flips copies, no FLOPs). It keeps nothing."""
    from test_features import _ops_run

    from perf4sight.features.walk import walk

    pattern, op, torch_run = _CASES["cumsum"]
    desc = describe(_Probe(pattern), SHAPE, name="cumsum")
    visit = [v for v in walk(desc) if v.node.op == op][0]
    forward, backward = _ops_run(torch_run, [8, 8, 8])
    assert [name for name, _ in forward] == ["cumsum"] and [name for name, _ in backward] == ["flip", "cumsum", "flip"]
    assert (visit.cost.kernels_fwd, visit.cost.kernels_bwd) == (len(forward), len(backward))
    assert (visit.cost.flops_fwd, visit.cost.flops_bwd) == (forward[0][1], backward[1][1])
    assert visit.cost.saved == [] and visit.cost.extra_saved_bytes == 0


@pytest.mark.parametrize("pattern", [
    _WHERES["a mask read twice, broadcast"][0],
    lambda y: y.masked_fill(y < 0, 0.0) + torch.where(y == 0.25, y, 0.0) * torch.where(y != 0.5, -1.0, y),
    lambda y: (lambda z: z.masked_fill_(z > 1, 1.0) * y)(y.masked_fill_(y < 0, 0.0) * 2),
    lambda y: (lambda a, m: torch.where(y > a, y, a) + torch.where(m >= y, m, y))(y.flip(3), y.mean(1, keepdim=True))],
    ids=["broadcast", "masked_fill", "masked_fill_", "two tensors"])
@pytest.mark.parametrize("batch", [3, 1])
def test_the_allocation_model_writes_down_a_where_of_a_broadcast_branch_as_traced(pattern, batch):
    """A mask that is a branch too, broadcast (its gradient summed down), read by two wheres; a masked_fill (a where
    of a number first), compares of == and !=: the model's events are the meta trace's."""
    from test_allocator import _as_replayed

    from perf4sight.features.alloc_trace import record_events

    desc = describe(_Probe(pattern), SHAPE, name="broadcast")
    model = record_events(desc, batch, steps=2, method="model")
    assert _as_replayed(model) == _as_replayed(record_events(desc, batch, steps=2, method="trace"))


def test_a_where_costs_the_kernels_torch_runs():
    """A where is its compare and the where forward (a FLOP an element each); backward (a dispatch log) a where of the
    gradient per tensor branch (the wrapped zero no kernel). It keeps the condition, a byte an element."""
    from test_features import _ops_run

    from perf4sight.features.walk import walk

    pattern, op, torch_run = _CASES["where"]
    desc = describe(_Probe(pattern), SHAPE, name="where")
    visits = [v for v in walk(desc) if v.node.op == op]
    forward, backward = _ops_run(torch_run, [8, 8, 8])
    assert [name for name, _ in forward] == ["gt", "mul", "where"]
    mine = [(name, e) for name, e in backward if name == "where"]
    assert [name for name, _ in backward] == ["scalar_tensor", "where"] * 2 + ["mul", "add"]
    assert (visits[0].cost.kernels_fwd, visits[0].cost.kernels_bwd) == (2, len(mine))
    assert visits[0].cost.flops_fwd == forward[0][1] + forward[2][1]
    assert visits[0].cost.flops_bwd == sum(e for _, e in mine)
    assert (visits[1].cost.kernels_bwd, visits[1].cost.flops_bwd) == (1, 8 * 8 * 8)
    assert [v.cost.extra_saved_bytes for v in visits] == [8 * 8 * 8] * 2 and visits[0].cost.saved == []


@pytest.mark.parametrize("form", list(_WHERES))
def test_a_where_keeps_what_autograd_keeps(form):
    """What a sample adds to autograd's saved tensors (the network input aside) is the features' (a where's
    condition, a byte an element of its compared tensor)."""
    from test_features import _autograd_saved_bytes

    from perf4sight.features.aggregate import network_features

    desc = describe(_Probe(_WHERES[form][0]), SHAPE, name="where")
    at2, at4 = (b * _autograd_saved_bytes(desc, b, with_input=False) for b in (2, 4))
    assert network_features(desc).per_sample["saved_bytes"] == (at4 - at2) / 2


@pytest.mark.parametrize("case", list(_CASES))
def test_the_call_keeps_what_autograd_keeps(case):
    """What a sample adds to autograd's saved tensors (the network input aside) is the features' (a logsumexp's input
    and its result; a cumsum's nothing)."""
    from test_features import _autograd_saved_bytes

    from perf4sight.features.aggregate import network_features

    desc = describe(_Probe(_CASES[case][0]), SHAPE, name=case)
    at2, at4 = (b * _autograd_saved_bytes(desc, b, with_input=False) for b in (2, 4))
    assert network_features(desc).per_sample["saved_bytes"] == (at4 - at2) / 2


@pytest.mark.parametrize("call, kernels", [(lambda y: torch.logsumexp(y, 1, keepdim=True), 10 + 3),
                                           (lambda y: torch.cumsum(y, 1), 1 + 3),
                                           (lambda y: torch.where(y > 0, y, 0.0), 2 + 1),
                                           (lambda y: torch.sort(y, 1)[0], 1 + 2),
                                           (lambda y: y.gather(2, torch.sort(y, 2)[1]), 2 + 2)])
def test_the_call_runs_its_kernels_in_the_latency_terms(call, kernels):
    """The kernel table runs a logsumexp as torch does: 10 kernels forward and 3 back (formulas' counts); a cumsum
    one forward and 3 back; a where of one tensor branch 2 forward (the compare, the where) and one back; a sort one
    forward and 2 back (new_zeros, scatter); a gather at a sort's indices 2 forward (the sort, the gather) and 2 back
    (new_zeros, scatter_add)."""
    from perf4sight.features.latency_terms import kernel_table

    desc = describe(_Probe(lambda y: y + call(y)), SHAPE, name="called")
    plain = describe(_Probe(lambda y: y + y.mean(1, keepdim=True)), SHAPE, name="plain")
    assert kernel_table(desc).launches == kernel_table(plain).launches - 2 + kernels


@pytest.mark.parametrize("case", list(_CASES))
def test_a_network_using_the_call_prunes_and_trains(case):
    """Pruning a network that calls it keeps the call: the pruned network describes to fewer channels with the op
    still there, and a training step runs."""
    from test_networks import _train_step

    from perf4sight.networks.build import Source, prune_source

    pattern, op, _ = _CASES[case]

    class Net(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.a, self.b = nn.Conv2d(3, 16, 3, padding=1), nn.Conv2d(16, 16, 3, padding=1)
            self.fc = nn.Linear(16, 10)

        def forward(self, x):
            return self.fc(self.b(pattern(self.a(x))).mean((2, 3)))
    (desc,) = prune_source(Source("net", "test", Net), [3, 16, 16], [30], "l1-norm", 2, seed=0)
    assert max(n.attrs["out_channels"] for n in desc.nodes if n.op == "conv2d") < 16
    assert op in [n.op for n in desc.nodes]
    _train_step(desc)


class _SpatialTransformer(nn.Module):
    """A spatial transformer network: a localisation net (a convolution, a ReLU, a pooled 2 x 2 map, a linear layer)
    regresses each sample's [2, 3] affine matrix theta, F.affine_grid makes its sampling grid of a map's size, and
    F.grid_sample resamples the map (bilinear, zeros padding; ``align_corners`` both); ``source`` "input" samples
    the image itself (the STN paper's first layer), "features" a convolution's map. Then a classifier."""

    def __init__(self, align_corners: bool, source: str = "features", width: int = 4) -> None:
        super().__init__()
        self.align_corners, self.source = align_corners, source
        self.loc = nn.Sequential(nn.Conv2d(3, width, 3, padding=1), nn.ReLU(), nn.AdaptiveAvgPool2d(2), nn.Flatten())
        self.theta = nn.Linear(4 * width, 6)
        self.conv = nn.Conv2d(3, 8, 3, padding=1)
        self.fc = nn.Linear(8, 10)

    def forward(self, x):
        theta = self.theta(self.loc(x)).view(-1, 2, 3)
        if self.source == "input":
            grid = F.affine_grid(theta, x.size(), align_corners=self.align_corners)
            return self.fc(self.conv(F.grid_sample(x, grid, align_corners=self.align_corners)).mean((2, 3)))
        y = self.conv(x)
        grid = F.affine_grid(theta, y.size(), align_corners=self.align_corners)
        return self.fc(F.grid_sample(y, grid, align_corners=self.align_corners).mean((2, 3)))


class _Warped(nn.Module):
    """A map warped by a predicted flow (an optical-flow or deformable network's): its grid a linear layer's
    [8, 8, 2] view of pooled features, or (``permuted``) a convolution's 2-channel map put channels last."""

    def __init__(self, permuted: bool) -> None:
        super().__init__()
        self.permuted = permuted
        if permuted:
            self.flow = nn.Conv2d(3, 2, 3, padding=1)
        self.conv = nn.Conv2d(3, 8, 3, padding=1)
        if not permuted:
            self.grid = nn.Linear(16, 8 * 8 * 2)
        self.fc = nn.Linear(8, 10)

    def forward(self, x):
        grid = self.flow(x).permute(0, 2, 3, 1) if self.permuted else None
        y = self.conv(x)
        if not self.permuted:
            grid = self.grid(y.mean(1).flatten(1)[:, :16]).tanh().view(-1, 8, 8, 2)
        return self.fc(F.grid_sample(y, grid, align_corners=True).mean((2, 3)))


@pytest.mark.parametrize("align_corners", [False, True])
@pytest.mark.parametrize("source", ["features", "input"])
def test_a_spatial_transformer_is_described(align_corners, source):
    """F.affine_grid and F.grid_sample were refused as calls without a description op: a spatial transformer is a
    localisation net, theta's view as [2, 3], the op affine_grid (its grid's [H, W], align_corners) and the op
    grid_sample (the map and the grid; bilinear, zeros), and the rebuilt module computes the original's output and
    gradients (the localisation net's included)."""
    desc = _computes_the_same(_SpatialTransformer(align_corners, source))
    (grid,) = [n for n in desc.nodes if n.op == "affine_grid"]
    (sample,) = [n for n in desc.nodes if n.op == "grid_sample"]
    assert (grid.attrs, grid.output_shape) == ({"size": [8, 8], "align_corners": align_corners}, [8, 8, 2])
    assert sample.inputs == [{"features": "conv", "input": "input"}[source], grid.name]
    assert sample.attrs == {"mode": "bilinear", "padding_mode": "zeros", "align_corners": align_corners}


def test_a_flow_warp_is_described():
    """A grid_sample of a grid computed by the network (a flow, channels last by a permute) describes, and the rebuilt
    module computes the original's output and gradients."""
    desc = _computes_the_same(_Warped(True))
    assert [n.inputs for n in desc.nodes if n.op == "grid_sample"] == [["conv", "permute"]]


@pytest.mark.parametrize("call, match", [
    (lambda y, g: F.grid_sample(y, g, mode="nearest", align_corners=False), r"mode 'nearest' .*only mode 'bilinear'"),
    (lambda y, g: F.grid_sample(y, g, padding_mode="border", align_corners=False), r"padding_mode 'border'"),
])
def test_a_grid_sample_of_another_mode_is_refused_by_name(call, match):
    """Nearest sampling, and a border or reflection padding, are refused by name (their kernels are not costed)."""
    class Net(_Warped):
        def forward(self, x):
            return self.fc(call(self.conv(x), self.flow(x).permute(0, 2, 3, 1)).mean((2, 3)))
    with pytest.raises(UserError, match=match):
        describe(Net(True), SHAPE, name="refused")


@pytest.mark.parametrize("permuted", [False, True])
@pytest.mark.parametrize("batch", [3, 1])
def test_the_allocation_model_writes_down_a_grid_sample_as_traced(permuted, batch):
    """A grid_sample allocates its output and keeps the map and the grid (a permuted one as it is); backward one op,
    the map's gradient, then the grid's. The model's events are the meta trace's."""
    from test_allocator import _as_replayed

    from perf4sight.features.alloc_trace import record_events

    desc = describe(_Warped(permuted), SHAPE, name="warped")
    model = record_events(desc, batch, steps=2, method="model")
    assert _as_replayed(model) == _as_replayed(record_events(desc, batch, steps=2, method="trace"))


class _WideGrid(_SpatialTransformer):
    """A spatial transformer whose grid is 6 x 10 (its size given as numbers), sampled from an 8 x 8 map."""

    def forward(self, x):
        theta = self.theta(self.loc(x)).view(-1, 2, 3)
        grid = F.affine_grid(theta, [x.shape[0], 8, 6, 10], align_corners=self.align_corners)
        return self.fc(F.grid_sample(self.conv(x), grid, align_corners=self.align_corners).mean((2, 3)))


@pytest.mark.parametrize("module", [_SpatialTransformer(False), _SpatialTransformer(True),
                                    _SpatialTransformer(False, "input"), _WideGrid(False), _WideGrid(True)],
                         ids=["stn", "aligned", "of the input", "wide", "wide aligned"])
@pytest.mark.parametrize("batch", [3, 1])
def test_the_allocation_model_writes_down_a_spatial_transformer_as_traced(module, batch):
    """An affine grid of learnt matrices: its grid, nothing kept; backward the base grid built anew (an empty of [N, H,
    W, 3]), per side, the width's first, a linspace (and without align_corners its mul and div: the side's floats)
    freed once copied, then theta's gradient (bmm, laid out transposed: the view before it copies it), the incoming
    gradient and the base freed last. The model's events are the meta trace's (it had left them to the trace)."""
    from test_allocator import _as_replayed

    from perf4sight.features.alloc_trace import record_events

    desc = describe(module, SHAPE, name="stn")
    model = record_events(desc, batch, steps=2, method="model")
    assert _as_replayed(model) == _as_replayed(record_events(desc, batch, steps=2, method="trace"))


def _dispatched(fn, leaf: torch.Tensor) -> tuple[list[str], list[str]]:
    """The aten ops (names) ``fn`` of ``leaf`` runs forward and backward (a dispatch log), tuples of outputs too."""
    from torch.utils._python_dispatch import TorchDispatchMode

    class Ops(TorchDispatchMode):
        def __init__(self):
            super().__init__()
            self.seen = []

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            self.seen.append(func.__name__.split(".")[0])
            return func(*args, **(kwargs or {}))

    with Ops() as forward:
        y = fn(leaf.requires_grad_())
    with Ops() as backward:
        y.backward(torch.ones_like(y))
    return forward.seen, backward.seen


@pytest.mark.parametrize("align_corners", [False, True])
def test_an_affine_grid_and_a_grid_sample_cost_the_kernels_torch_runs(align_corners):
    """An affine grid is one aten op forward whose kernel builds the base grid (linspaces, their scale without
    align_corners, copies, a fill) and multiplies it (bmm), as its backward does in a dispatch log: 10 kernels each
    way, 6 with align_corners, 12 FLOPs a position each way, nothing kept. A grid_sample is one op each way (the
    backward's map gradient zeroed first: 2 kernels); it keeps the map and the grid."""
    from perf4sight.features.walk import walk

    desc = describe(_SpatialTransformer(align_corners), SHAPE, name="stn")
    costs = {v.node.op: v.cost for v in walk(desc) if v.node.op in ("affine_grid", "grid_sample")}
    forward, backward = _dispatched(lambda t: F.affine_grid(t, [1, 8, 8, 8], align_corners=align_corners),
                                    torch.randn(1, 2, 3))
    backward = backward[:backward.index("bmm") + 1]  # then AccumulateGrad's copy to theta's strides
    kernels = [name for name in backward if name in ("linspace", "mul", "div", "copy_", "fill_", "bmm")]
    assert forward == ["affine_grid_generator"] and kernels.count("linspace") == 2
    assert costs["affine_grid"].kernels_fwd == costs["affine_grid"].kernels_bwd == len(kernels)
    assert costs["affine_grid"].flops_fwd == costs["affine_grid"].flops_bwd == 2 * 8 * 8 * 3 * 2
    assert costs["affine_grid"].saved == []
    grid = torch.rand(1, 8, 8, 2) * 2 - 1
    forward, backward = _dispatched(lambda x: F.grid_sample(x, grid, align_corners=align_corners),
                                    torch.randn(1, 8, 8, 8))
    assert forward == ["grid_sampler_2d"] and [n for n in backward if n != "detach"] == ["ones_like",
                                                                                        "grid_sampler_2d_backward"]
    assert (costs["grid_sample"].kernels_fwd, costs["grid_sample"].kernels_bwd) == (1, 2)
    assert costs["grid_sample"].saved == [0, 1]


def test_an_affine_grid_runs_its_kernels_in_the_latency_terms():
    """The kernel table runs an affine grid's kernels as formulas counts them: align_corners spares the scale's 4 a
    way (a mul and a div per side)."""
    from perf4sight.features.latency_terms import kernel_table

    launches = [kernel_table(describe(_SpatialTransformer(ac), SHAPE, name="stn")).launches for ac in (False, True)]
    assert launches[0] - launches[1] == 4 + 4


@pytest.mark.parametrize("module", [_SpatialTransformer(False), _Warped(True), _Warped(False)],
                         ids=["stn", "flow", "grid"])
def test_a_grid_sample_keeps_what_autograd_keeps(module):
    """What a sample adds to autograd's saved tensors (the network input aside) is the features' (a grid_sample's map
    and grid; an affine grid's nothing)."""
    from test_features import _autograd_saved_bytes

    from perf4sight.features.aggregate import network_features

    desc = describe(module, SHAPE, name="sampled")
    at2, at4 = (b * _autograd_saved_bytes(desc, b, with_input=False) for b in (2, 4))
    assert network_features(desc).per_sample["saved_bytes"] == (at4 - at2) / 2


def test_a_spatial_transformer_prunes_and_trains():
    """Pruning a spatial transformer cuts its localisation net and the sampled map's channels (a grid_sample passes
    each channel on): the pruned network describes, its affine grid and grid_sample still there, and a training step
    runs."""
    from test_networks import _train_step

    from perf4sight.networks.build import Source, prune_source

    class Net(_SpatialTransformer):
        def __init__(self) -> None:
            super().__init__(False, width=16)
            self.conv, self.head = nn.Conv2d(3, 16, 3, padding=1), nn.Conv2d(16, 16, 3, padding=1)
            self.fc = nn.Linear(16, 10)

        def forward(self, x):
            theta = self.theta(self.loc(x)).view(-1, 2, 3)
            y = self.conv(x)
            grid = F.affine_grid(theta, y.size(), align_corners=False)
            return self.fc(self.head(F.grid_sample(y, grid, align_corners=False)).mean((2, 3)))
    (desc,) = prune_source(Source("net", "test", Net), [3, 16, 16], [30], "l1-norm", 2, seed=0)
    assert min(n.attrs["out_channels"] for n in desc.nodes if n.op == "conv2d") < 16
    assert {"affine_grid", "grid_sample"} <= {n.op for n in desc.nodes}
    _train_step(desc)


#: A sort's and a topk's values: (pattern, the nodes' (op, attrs, output shape)).
_ORDERED = {
    "sort": (lambda y: torch.sort(y, 1)[0] + y.sort(dim=-1, descending=True).values,
             [("sort", {"dim": 1, "descending": False}, [8, 8, 8]),
              ("sort", {"dim": 3, "descending": True}, [8, 8, 8])]),
    "topk": (lambda y: torch.topk(y, 3, 1)[0].mean(1, keepdim=True) * y
             + y.topk(2, dim=-1, largest=False).values.sum(3, keepdim=True),
             [("topk", {"k": 3, "dim": 1, "largest": True}, [3, 8, 8]),
              ("topk", {"k": 2, "dim": 3, "largest": False}, [8, 8, 2])]),
}


@pytest.mark.parametrize("case", list(_ORDERED))
def test_a_sorts_or_topks_values_are_described(case):
    """torch.sort and torch.topk (and their methods) were refused ("call_function 'sort' has no description op"):
    their values read alone ([0], .values) are the op sort (dim, descending) or topk (k, dim, largest), and the
    rebuilt module computes the original's output and gradients."""
    pattern, nodes = _ORDERED[case]
    desc = _computes_the_same(_Probe(pattern))
    assert [(n.op, n.attrs, n.output_shape) for n in desc.nodes if n.op == case] == nodes


@pytest.mark.parametrize("pattern, match", [
    (lambda y: y + torch.sort(y, 1)[1].float(), r"the indices \(int64\) of call_function 'sort' \(node sort\), "
                                                 r"which call_method 'float' \(node float_1\) reads, has no"),
    (lambda y: (lambda i: y.gather(2, i) * i.float())(y.topk(8, 2)[1]),
     r"the indices \(int64\) of call_method 'topk' \(node topk\), which call_method 'gather' \(node gather\) "
     r"reads, has no description op"),
    (lambda y: torch.sort(y, 0)[0], r"a sort along the batch dimension \(dims \[0\]\)"),
    (lambda y: torch.sort(y, dim=1, stable=True)[0], r"a stable sort \(stable=True\) has no description op"),
    (lambda y: y + y.topk(8, 1, sorted=False).values, r"a topk of sorted=False"),
])
def test_a_sorts_indices_or_another_form_are_refused_by_name(pattern, match):
    """The indices of a sort or a topk read by anything but gathers of tensors of their shape (but where theirs
    are 1, and trailing dims): made float, or by a gather and made float (the first reader named); a sort along the
    batch, a stable sort and an unsorted topk are refused by name."""
    with pytest.raises(UserError, match=match):
        describe(_Probe(pattern), SHAPE, name="refused")


@pytest.mark.parametrize("case", list(_ORDERED))
@pytest.mark.parametrize("batch", [3, 1])
def test_the_allocation_model_writes_down_a_sort_as_traced(case, batch):
    """A sort or a topk allocates its values and its int64 indices (kept); backward zeros of the input's size and the
    gradient scattered into them. The model's events are the meta trace's."""
    from test_allocator import _as_replayed

    from perf4sight.features.alloc_trace import record_events

    desc = describe(_Probe(_ORDERED[case][0]), SHAPE, name=case)
    model = record_events(desc, batch, steps=2, method="model")
    assert _as_replayed(model) == _as_replayed(record_events(desc, batch, steps=2, method="trace"))


@pytest.mark.parametrize("case", list(_ORDERED))
def test_a_sort_costs_the_kernels_torch_runs(case):
    """A sort or a topk is one kernel forward writing values and int64 indices (a dispatch log); backward new_zeros
    and a scatter, no FLOPs; it keeps the indices, 8 bytes an output element."""
    from perf4sight.features.walk import walk

    desc = describe(_Probe(_ORDERED[case][0]), SHAPE, name=case)
    cost = [v.cost for v in walk(desc) if v.node.op == case][0]
    call = (lambda x: torch.sort(x, 1)[0]) if case == "sort" else (lambda x: torch.topk(x, 3, 1)[0])
    forward, backward = _dispatched(call, torch.randn(1, 8, 8, 8))
    assert forward == [case, "getitem"] or forward == [case]
    assert [name for name in backward if name not in ("ones_like", "detach")] == ["new_zeros", "scatter"]
    assert (cost.kernels_fwd, cost.kernels_bwd, cost.flops_bwd) == (1, 2, 0.0)
    assert cost.extra_saved_bytes == 8 * {"sort": 8 * 8 * 8, "topk": 3 * 8 * 8}[case] and cost.saved == []


@pytest.mark.parametrize("case", list(_ORDERED))
def test_a_sort_keeps_what_autograd_keeps(case):
    """What a sample adds to autograd's saved tensors (the network input aside) is the features' (a sort's or a
    topk's int64 indices)."""
    from test_features import _autograd_saved_bytes

    from perf4sight.features.aggregate import network_features

    desc = describe(_Probe(_ORDERED[case][0]), SHAPE, name=case)
    at2, at4 = (b * _autograd_saved_bytes(desc, b, with_input=False) for b in (2, 4))
    assert network_features(desc).per_sample["saved_bytes"] == (at4 - at2) / 2


@pytest.mark.parametrize("case", list(_ORDERED))
def test_a_network_sorting_its_values_prunes_and_trains(case):
    """Pruning a network that sorts a map (along its width) or keeps its top 2 values there cuts its convolutions'
    channels through it: the pruned network describes, the op still there, and a training step runs."""
    from test_networks import _train_step

    from perf4sight.networks.build import Source, prune_source

    class Net(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.a, self.b = nn.Conv2d(3, 16, 3, padding=1), nn.Conv2d(16, 16, 3, padding=1)
            self.fc = nn.Linear(16, 10)

        def forward(self, x):
            y = self.a(x)
            y = y.sort(-1, descending=True)[0] if case == "sort" else y.topk(2, -1).values
            return self.fc(self.b(y).mean((2, 3)))
    (desc,) = prune_source(Source("net", "test", Net), [3, 16, 16], [30], "l1-norm", 2, seed=0)
    assert max(n.attrs["out_channels"] for n in desc.nodes if n.op == "conv2d") < 16
    assert case in [n.op for n in desc.nodes]
    _train_step(desc)


def test_a_where_or_grid_sample_costs_the_gradients_torch_computes():
    """Torch's backward of a where computes the gradients of the branches that need one (one where each: a branch
    computed from the image alone needs none), and a grid_sample of the image itself the grid's alone (no zeroed map
    gradient); the walk's costs count those."""
    from perf4sight.features.walk import walk

    class Gated(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.conv, self.fc = nn.Conv2d(3, 8, 3, padding=1), nn.Linear(8, 10)

        def forward(self, x):
            y = self.conv(x)
            return self.fc(torch.where(y > 0, y, x.mean(1, keepdim=True)).mean((2, 3)))
    net = Gated()
    (gate,) = [v.cost for v in walk(describe(net, SHAPE, name="gated")) if v.node.op == "where"]
    out = net(torch.randn(1, *SHAPE))
    _, backward = _dispatched(lambda _: out.sum(), torch.zeros(1))
    assert (gate.kernels_bwd, gate.flops_bwd) == (backward.count("where"), 8 * 8 * 8) == (1, 8 * 8 * 8)
    costs = {source: [v.cost for v in walk(describe(_SpatialTransformer(False, source), SHAPE, name="stn"))
                      if v.node.op == "grid_sample"][0] for source in ("input", "features")}
    assert (costs["input"].kernels_bwd, costs["features"].kernels_bwd) == (1, 2)
    assert costs["input"].flops_bwd == 8 * 3 * 8 * 8 + 4 * 8 * 8


def test_a_masked_fill_in_place_costs_and_round_trips_as_torch_runs_it():
    """``y.masked_fill_(y < 0, 0.0)`` was refused ("a comparison read by anything but torch.where's condition"): it
    is a where of ``inplace``, its compare and the fill forward (a dispatch log: ``lt``, ``masked_fill_``), one
    ``masked_fill`` back, the condition kept, as the out-of-place one; a PerfSeer graph keeps the flag (and a where's
    ``compare_inputs``), and a
    description writing a branch of another shape than its output is refused by name."""
    from perf4sight.exporters.perfseer import description_to_graph
    from perf4sight.features.walk import walk
    from perf4sight.importers.perfseer import graph_to_description
    from perf4sight.ir.schema import NetworkDescription

    desc = describe(_Probe(lambda y: y.masked_fill_(y < 0, 0.0)), SHAPE, name="filled")
    (cost,) = [v.cost for v in walk(desc) if v.node.op == "where"]
    forward, backward = _dispatched(lambda x: (x * 1).masked_fill_(x < 0, 0.0), torch.randn(1, 8, 8, 8))
    assert forward[1:] == ["lt", "masked_fill_"] and backward.count("masked_fill") == 1
    assert (cost.kernels_fwd, cost.kernels_bwd, cost.extra_saved_bytes) == (2, 1, 8 * 8 * 8)
    for kept in (desc, describe(_Probe(_WHERES["two tensors compared"][0]), SHAPE, name="compared")):
        back, _ = graph_to_description(description_to_graph(kept, 4), kept.name, f"{kept.name}.pkl")
        assert back.to_dict() == kept.to_dict()
    data = describe(_Probe(lambda y: y.mean(1, keepdim=True).masked_fill(y < 0, 0.0)), SHAPE,
                    name="broadcast").to_dict()
    NetworkDescription.from_dict(data)
    next(node for node in data["nodes"] if node["op"] == "where")["attrs"]["inplace"] = True
    with pytest.raises(UserError, match=r"node 'masked_fill' \(where\).*writes in place into a branch of shape "
                                        r"\[1, 8, 8\] an output of shape \[8, 8, 8\]"):
        NetworkDescription.from_dict(data)


def test_a_network_masking_in_place_prunes_and_trains():
    """Pruning a network that zeroes a map's negatives in place (``masked_fill_``) cuts its convolutions' channels
    through it: the pruned network describes, its where in place still there, and a training step runs."""
    from test_networks import _train_step

    from perf4sight.networks.build import Source, prune_source

    class Net(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.a, self.b = nn.Conv2d(3, 16, 3, padding=1), nn.Conv2d(16, 16, 3, padding=1)
            self.fc = nn.Linear(16, 10)

        def forward(self, x):
            y = self.a(x)
            y.masked_fill_(y < 0, 0.0)
            return self.fc(self.b(y).mean((2, 3)))
    (desc,) = prune_source(Source("net", "test", Net), [3, 16, 16], [30], "l1-norm", 2, seed=0)
    assert max(n.attrs["out_channels"] for n in desc.nodes if n.op == "conv2d") < 16
    assert [n.attrs.get("inplace") for n in desc.nodes if n.op == "where"] == [True]
    _train_step(desc)


def test_a_where_of_two_tensors_compared_costs_the_kernels_torch_runs():
    """``torch.where(a > b, a, b)`` was refused ("a comparison read by anything but torch.where's condition, or of
    two tensors"): the compare of two tensors (``gt.Tensor``: a FLOP and a byte an element of their broadcast shape)
    and the where forward, a where a branch back (a dispatch log); it keeps the condition, a byte an element of the
    broadcast shape, and neither compared tensor takes a gradient through it (one accumulation add, not two, for a
    tensor that is also a branch)."""
    from test_features import _ops_run

    from perf4sight.features.walk import gradient_accumulations, walk

    desc = describe(_Probe(lambda y: (lambda m: torch.where(m >= y, m, y))(y.mean(1, keepdim=True))), SHAPE,
                    name="compared")
    visits = list(walk(desc))
    (cost,) = [v.cost for v in visits if v.node.op == "where"]
    forward, backward = _ops_run(lambda x: (lambda m: torch.where(m >= x, m, x))(x.mean(1, keepdim=True)), [8, 8, 8])
    assert [name for name, _ in forward] == ["mean", "ge", "where"]
    assert [name for name, _ in backward].count("where") == cost.kernels_bwd == 2
    n = 8 * 8 * 8
    assert (cost.kernels_fwd, cost.flops_fwd, cost.extra_saved_bytes) == (2, forward[1][1] + forward[2][1], n) \
        == (2, 2 * n, n)
    assert gradient_accumulations(desc, visits) == {"conv": 1}  # the mean and the branch; the mean the branch


class _FixedMask(nn.Module):
    """An attention-like map masked by a registered boolean buffer (``[8, 8]``, true above the diagonal: a causal
    mask over the width): ``form`` "masked_fill" (-inf, then a softmax), "where" (``torch.where(mask, 0.0, y)``),
    "in place" (``masked_fill_``) or "compared" (a float buffer compared, ``self.mask == 0``: the trace computes
    the boolean mask once)."""

    def __init__(self, form: str) -> None:
        super().__init__()
        self.form = form
        self.conv, self.fc = nn.Conv2d(3, 8, 3, padding=1), nn.Linear(8 * 8 * 8, 10)
        upper = torch.ones(8, 8).triu(1)
        self.register_buffer("mask", 1 - upper if form == "compared" else upper.bool())

    def forward(self, x):
        y = self.conv(x)
        if self.form == "where":
            y = torch.where(self.mask, 0.0, y)
        elif self.form == "in place":
            y.masked_fill_(self.mask, -1.0)
        else:
            y = y.masked_fill(self.mask == 0 if self.form == "compared" else self.mask, float("-inf")).softmax(-1)
        return self.fc(y.flatten(1))


_FIXED_MASKS = ["masked_fill", "where", "in place", "compared"]


@pytest.mark.parametrize("form", _FIXED_MASKS)
def test_a_where_of_a_fixed_mask_is_described(form):
    """A masked_fill, where or masked_fill_ of a registered boolean buffer (a fixed attention mask) was refused ("a
    masked_fill of anything but a mask comparing a tensor with a number"): it is the op where of ``mask_shape`` (its
    condition a boolean buffer of that shape, compare ``ne`` 0), its inputs the branches alone; the rebuilt module,
    given the original's mask, computes the original's output and gradients (a float buffer compared, ``== 0``, is
    the mask the trace computed: that one is given to the rebuilt module)."""
    module = _FixedMask(form)
    number = {"where": {"if_true": 0.0}, "in place": {"if_true": -1.0, "inplace": True}}.get(form,
                                                                                           {"if_true": -math.inf})
    if form != "compared":
        desc = _computes_the_same(module)
    else:
        desc = describe(module, SHAPE, name="compared")
        _computes_the_same_given_its_mask(module, desc)
    assert [(n.inputs, n.attrs) for n in desc.nodes if n.op == "where"] == [
        (["conv"], {"compare": "ne", "threshold": 0.0, "mask_shape": [8, 8], **number})]


def _computes_the_same_given_its_mask(module: nn.Module, desc: NetworkDescription) -> None:
    """``desc`` (read back from JSON) rebuilt, given ``module``'s weights and the mask its trace computed from a
    float buffer (``module.mask == 0``), computes ``module``'s output."""
    from perf4sight.ir.to_torch import build_module

    rebuilt = build_module(NetworkDescription.from_dict(desc.to_dict()))
    for new, old in zip(rebuilt.parameters(), module.parameters()):
        new.data.copy_(old.data)
    (mask,) = list(rebuilt.buffers())
    mask.copy_(module.mask == 0)
    x = torch.randn(2, *SHAPE)
    assert torch.allclose(module(x), rebuilt(x), atol=1e-5)


@pytest.mark.parametrize("form", _FIXED_MASKS[:3])
@pytest.mark.parametrize("batch", [3, 1])
def test_the_allocation_model_writes_down_a_fixed_mask_as_traced(form, batch):
    """A fixed mask is a buffer at setup (a byte an element); the where allocates its output (a number branch
    wrapped first) and keeps nothing of its own, a masked_fill_ nothing at all; backward as a where's or a
    masked_fill_'s. The model's events are the meta trace's."""
    from test_allocator import _as_replayed

    from perf4sight.features.alloc_trace import record_events

    desc = describe(_FixedMask(form), SHAPE, name="masked")
    model = record_events(desc, batch, steps=2, method="model")
    assert _as_replayed(model) == _as_replayed(record_events(desc, batch, steps=2, method="trace"))


@pytest.mark.parametrize("form", _FIXED_MASKS[:3])
def test_a_where_of_a_fixed_mask_costs_and_keeps_what_torch_does(form):
    """A fixed mask is no compare: the fill (or where) alone forward, one kernel back (a dispatch log); nothing kept
    beyond what autograd keeps (the mask is the module's); a PerfSeer graph keeps its mask_shape."""
    from test_features import _autograd_saved_bytes

    from perf4sight.exporters.perfseer import description_to_graph
    from perf4sight.features.aggregate import network_features
    from perf4sight.features.walk import walk
    from perf4sight.importers.perfseer import graph_to_description

    module = _FixedMask(form)
    desc = describe(module, SHAPE, name="masked")
    (cost,) = [v.cost for v in walk(desc) if v.node.op == "where"]
    forward, backward = _dispatched(lambda y: y.masked_fill(module.mask, -1.0), torch.randn(1, 8, 8, 8))
    assert forward == ["masked_fill"] and backward.count("masked_fill") == 1
    assert (cost.kernels_fwd, cost.kernels_bwd, cost.extra_saved_bytes, cost.saved) == (1, 1, 0.0, [])
    at2, at4 = (b * _autograd_saved_bytes(desc, b, with_input=False) for b in (2, 4))
    assert network_features(desc).per_sample["saved_bytes"] == (at4 - at2) / 2
    back, _ = graph_to_description(description_to_graph(desc, 4), "masked", "masked.pkl")
    assert back.to_dict() == desc.to_dict()


def test_a_network_with_a_fixed_mask_prunes_and_trains():
    """Pruning a network that masks a map by a registered buffer cuts its convolutions' channels through it (the
    mask broadcast over them): the pruned network describes, its where of mask_shape still there, and a training
    step runs."""
    from test_networks import _train_step

    from perf4sight.networks.build import Source, prune_source

    class Net(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.a, self.b = nn.Conv2d(3, 16, 3, padding=1), nn.Conv2d(16, 16, 3, padding=1)
            self.fc = nn.Linear(16, 10)
            self.register_buffer("mask", torch.ones(16, 16).triu(1).bool())

        def forward(self, x):
            return self.fc(self.b(self.a(x).masked_fill(self.mask, 0.0)).mean((2, 3)))
    (desc,) = prune_source(Source("net", "test", Net), [3, 16, 16], [30], "l1-norm", 2, seed=0)
    assert max(n.attrs["out_channels"] for n in desc.nodes if n.op == "conv2d") < 16
    assert [n.attrs.get("mask_shape") for n in desc.nodes if n.op == "where"] == [[16, 16]]
    _train_step(desc)


def test_a_fixed_mask_spanning_the_batch_is_refused_by_name():
    """A registered mask whose first dimension is the traced batch's (a mask per sample of one batch size) is
    refused by name (it had been described, a where of that mask_shape that no other batch size runs)."""
    module = _FixedMask("masked_fill")
    module.mask = torch.rand(2, 8, 8, 8) > 0.5
    with pytest.raises(UserError, match=r"a fixed mask of shape \[2, 8, 8, 8\], a mask per sample of a batch of 2 "
                                        r"\(its first dimension the batch's\), has no description op"):
        describe(module, SHAPE, name="refused")


class _CausalAttention(nn.Module):
    """Self-attention over a map's rows as attention code writes it: scores of 1x1-convolution queries and keys, a
    causal mask (a registered buffer compared, ``self.mask == 0``) filled with ``-torch.finfo(scores.dtype).max``
    (``finfo`` of a traced tensor's dtype), a softmax, the values."""

    def __init__(self) -> None:
        super().__init__()
        self.conv, self.q, self.k = nn.Conv2d(3, 8, 3, padding=1), nn.Conv2d(8, 8, 1), nn.Conv2d(8, 8, 1)
        self.fc = nn.Linear(8 * 8 * 8, 10)
        self.register_buffer("mask", torch.ones(8, 8).tril())

    def forward(self, x):
        y = self.conv(x)
        scores = self.q(y) @ self.k(y).transpose(-1, -2)
        scores = scores.masked_fill(self.mask == 0, -torch.finfo(scores.dtype).max)
        return self.fc((scores.softmax(-1) @ y).flatten(1))


def test_an_attention_mask_filled_with_finfo_is_described():
    """``scores.masked_fill(mask == 0, -torch.finfo(scores.dtype).max)`` could not be traced (torch.finfo refuses
    torch.fx's proxy of ``scores.dtype``): the dtype read is the tensor's own (float32), so the fill is a number, the
    largest float32's negation, which a description holds; the rebuilt module, given the mask, computes the same."""
    module = _CausalAttention()
    desc = describe(module, SHAPE, name="attention")
    assert [n.attrs for n in desc.nodes if n.op == "where"] == [
        {"compare": "ne", "threshold": 0.0, "mask_shape": [8, 8], "if_true": -torch.finfo(torch.float32).max}]
    _computes_the_same_given_its_mask(module, desc)


@pytest.mark.parametrize("batch", [3, 1])
def test_the_allocation_model_writes_down_an_attention_mask_filled_with_finfo_as_traced(batch):
    """The attention's fill of finfo's number is a fixed mask's where: the model's events are the meta trace's."""
    from test_allocator import _as_replayed

    from perf4sight.features.alloc_trace import record_events

    desc = describe(_CausalAttention(), SHAPE, name="attention")
    model = record_events(desc, batch, steps=2, method="model")
    assert _as_replayed(model) == _as_replayed(record_events(desc, batch, steps=2, method="trace"))


def test_a_dtype_read_decides_a_branch_and_a_cast():
    """A traced tensor's ``dtype`` is its own: a branch on it (``if y.dtype == torch.float32``) is taken as the
    tensor's dtype says, and a cast to another tensor's dtype (``y.to(x.dtype)``, float32) is the tensor itself; a
    boolean's dtype, given to torch.finfo, is refused as torch refuses it."""
    desc = describe(_Probe(lambda y: (y * 2 if y.dtype == torch.float32 else y).to(y.dtype)), SHAPE,
                    name="dtype")
    assert [n.op for n in desc.nodes] == ["input", "conv2d", "mul", "flatten", "linear"]
    with pytest.raises(UserError, match=r"torch.finfo\(\) requires a floating point input type"):
        describe(_Probe(lambda y: y.masked_fill(y < 0, torch.finfo((y > 0).dtype).min)), SHAPE, name="dtype")


def _pieces_after_a_dtype_read(y):
    """A chunk, a dtype read of a later node (the trace traced again), then the chunk's pieces listed."""
    pieces = y.chunk(2, 1)
    z = y * 2
    fill = torch.finfo(z.dtype).min
    a, b = list(pieces)
    return torch.cat([a * b, b], 1).masked_fill(z > 0, fill).softmax(-1)


def _condition_after_a_dtype_read(y):
    """A shape condition made, a dtype read of a later node, then the condition decides a branch."""
    wide = y.shape[-1] > 4
    z = y * 2
    fill = torch.finfo(z.dtype).min
    return (z * 3 if wide else z).masked_fill(y > 0, fill).softmax(-1)


@pytest.mark.parametrize("pattern", [_pieces_after_a_dtype_read, _condition_after_a_dtype_read])
def test_a_split_or_a_condition_after_a_dtype_read_is_traced(pattern):
    """A dtype read traced the forward again told the dtype of every node before it, which the check against
    reading a node twice took for a node already told its pieces or condition: a split's pieces or a condition
    made before a dtype read and used after it were refused as "cannot iterate over the pieces of chunk" (or "of
    gt", a condition, no pieces). Each kind of read is told apart now: both are described, and compute the same."""
    desc = _computes_the_same(_Probe(pattern))
    assert [n.op for n in desc.nodes if n.op == "where"] == ["where"]


class _Grows(nn.Module):
    """A forward that runs one more step each call (state kept on the module): a step chunks the map and adds 1;
    ``"last"`` lists the last step's pieces (a split read at a later place each call), ``"each"`` adds each step's
    pieces up (one more split read each call)."""

    def __init__(self, form: str) -> None:
        super().__init__()
        self.form, self.calls = form, 0

    def forward(self, x):
        self.calls += 1
        for _ in range(self.calls):
            pieces = x.chunk(2, 1)
            x = (sum(list(pieces)) if self.form == "each" else x) + 1
        return torch.cat(list(pieces), 1)


def test_a_forward_that_traces_another_graph_each_time_is_refused_naming_the_read(monkeypatch):
    """A forward that changes between calls was traced again without end, each time to read the pieces of a split
    it had not made before (a dtype read's, before they were answered in place: stopped by hand after 60 s). After
    a few traces that read otherwise than the one before, it is refused in one line naming the read; one that reads
    alike up to each stop (growing), after :data:`_RETRACES` traces."""
    from perf4sight.ir import torch_trace

    module = _Grows("last")
    with pytest.raises(UserError, match=r"^grows: cannot trace the module with torch\.fx \(TraceError: traced again "
                                        r"to read the pieces of chunk_8, the forward traced another graph \(a "
                                        r"forward that changes between calls"):
        describe(module, SHAPE, name="grows")
    assert module.calls == 10
    monkeypatch.setattr(torch_trace, "_RETRACES", 12)
    module = _Grows("each")
    with pytest.raises(UserError, match=r"^grows: cannot trace the module with torch\.fx \(TraceError: traced again "
                                        r"12 times, the last to read the pieces of chunk_12 \(a forward that grows "):
        describe(module, SHAPE, name="grows")
    assert module.calls == 13


def test_a_dtype_read_is_answered_without_tracing_again(monkeypatch):
    """Each first read of a node's dtype stopped the trace and traced the forward again (about 40 ms each; an
    8-block attention reading one a block took 9 traces): the graph so far is run on meta tensors in place, with
    torch.fx's patches taken off meanwhile, and the trace goes on: one trace, the same description."""
    from perf4sight.ir import torch_trace

    traces = []

    class Counted(torch_trace._Tracer):
        def trace(self, *args, **kwargs):
            traces.append(1)
            return super().trace(*args, **kwargs)

    module = _CausalAttention()
    plain = describe(module, SHAPE, name="attention")
    monkeypatch.setattr(torch_trace, "_Tracer", Counted)
    assert describe(module, SHAPE, name="attention").to_dict() == plain.to_dict() and len(traces) == 1


def test_a_dtype_read_where_the_graph_cannot_run_in_place_falls_back(monkeypatch):
    """Where the graph so far cannot run node by node (an op without a meta kernel), the dtype is worked out as a
    trace traced again would; where torch has no means to take torch.fx's patches off, the trace is traced again,
    told: the same description either way."""
    import torch.fx as fx

    from perf4sight.ir import torch_trace

    plain = describe(_CausalAttention(), SHAPE, name="attention").to_dict()

    def no_meta_kernel(self):
        raise NotImplementedError("no meta kernel")
    monkeypatch.setattr(torch_trace._Tracer, "_meta_values", no_meta_kernel)
    assert describe(_CausalAttention(), SHAPE, name="attention").to_dict() == plain
    monkeypatch.undo()
    monkeypatch.delattr(fx._symbolic_trace, "_maybe_revert_all_patches")
    assert describe(_CausalAttention(), SHAPE, name="attention").to_dict() == plain


class _MaskReadTwice(nn.Module):
    """A registered boolean mask read by two wheres of their own fills: a masked_fill of -inf (then a softmax) and a
    ``torch.where(mask, 0.0, y * 2)``."""

    def __init__(self) -> None:
        super().__init__()
        self.conv, self.fc = nn.Conv2d(3, 8, 3, padding=1), nn.Linear(8 * 8 * 8, 10)
        self.register_buffer("mask", torch.ones(8, 8).triu(1).bool())

    def forward(self, x):
        y = self.conv(x)
        return self.fc((y.masked_fill(self.mask, float("-inf")).softmax(-1) + torch.where(self.mask, 0.0, y * 2))
                       .flatten(1))


def test_a_fixed_mask_read_by_two_wheres_is_one_buffer():
    """A fixed mask that two wheres read was a buffer of each (the rebuilt network held two, the allocation model set
    up two): the second where ``shares`` the first's, its own fill kept; the rebuilt network holds one mask, and given
    the module's computes its output and gradients. A description whose where shares a where of another mask is
    refused naming the attr."""
    desc = _computes_the_same(_MaskReadTwice())
    assert [(n.name, n.attrs) for n in desc.nodes if n.op == "where"] == [
        ("masked_fill", {"compare": "ne", "threshold": 0.0, "mask_shape": [8, 8], "if_true": -math.inf}),
        ("where", {"compare": "ne", "threshold": 0.0, "mask_shape": [8, 8], "if_true": 0.0, "shares": "masked_fill"})]
    from perf4sight.ir.to_torch import build_module

    assert [tuple(b.shape) for b in build_module(desc).buffers()] == [(8, 8)]
    bad = desc.to_dict()
    bad["nodes"][[n["name"] for n in bad["nodes"]].index("where")]["attrs"]["mask_shape"] = [1, 8]
    with pytest.raises(UserError, match=r"attr 'shares' of a where names the where whose fixed mask it reads"):
        NetworkDescription.from_dict(bad)


@pytest.mark.parametrize("batch", [3, 1])
def test_the_allocation_model_sets_up_a_fixed_mask_read_twice_once(batch):
    """The mask two wheres read is set up once (a byte an element), as the meta trace of the rebuilt network records
    it: the model's events are the trace's."""
    from test_allocator import _as_replayed

    from perf4sight.features.alloc_trace import record_events

    desc = describe(_MaskReadTwice(), SHAPE, name="twice")
    model = record_events(desc, batch, steps=2, method="model")
    assert _as_replayed(model) == _as_replayed(record_events(desc, batch, steps=2, method="trace"))
    assert [e for e in _as_replayed(model) if e[0] == "alloc" and e[2] == "setup" and e[1] == 64] == [
        ("alloc", 64, "setup")]


class _ComputedMaskReadTwice(nn.Module):
    """A mask computed from a buffer at each read, ``self.mask == 0`` (which the trace computes once a read), filled
    by a masked_fill and a where, and ``self.mask != 0`` (other values) by a third where."""

    def __init__(self) -> None:
        super().__init__()
        self.conv, self.fc = nn.Conv2d(3, 8, 3, padding=1), nn.Linear(8 * 8 * 8, 10)
        self.register_buffer("mask", torch.ones(8, 8).tril())

    def forward(self, x):
        y = self.conv(x)
        return self.fc((y.masked_fill(self.mask == 0, float("-inf")).softmax(-1)
                        + torch.where(self.mask == 0, 0.0, y * 2) + torch.where(self.mask != 0, y, 0.0)).flatten(1))


def test_a_mask_computed_alike_at_two_reads_is_one_buffer():
    """``self.mask == 0`` written at two reads was two masks (the trace computes a tensor of its own at each): two
    buffers in the rebuilt network, two set up by the allocation model. Masks the trace computed with the same values
    are one: the later where ``shares`` the first's; one of other values (``self.mask != 0``) keeps its own. The
    rebuilt network, its two masks set to the module's, computes its output and gradients."""
    from perf4sight.ir.to_torch import build_module

    module = _ComputedMaskReadTwice()
    desc = NetworkDescription.from_dict(describe(module, SHAPE, name="computed").to_dict())
    assert [(n.name, n.attrs.get("shares")) for n in desc.nodes if n.op == "where"] == [
        ("masked_fill", None), ("where", "masked_fill"), ("where_1", None)]
    rebuilt = build_module(desc)
    masks = list(rebuilt.buffers())
    assert [tuple(b.shape) for b in masks] == [(8, 8), (8, 8)]
    masks[0].copy_(module.mask == 0)
    masks[1].copy_(module.mask != 0)
    for new, old in zip(rebuilt.parameters(), module.parameters()):
        new.data.copy_(old.data)
    x = torch.randn(2, *SHAPE)
    outputs, gradients = [], []
    for net in (module, rebuilt):
        xi = x.clone().requires_grad_()
        out = net(xi)
        out.square().sum().backward()
        outputs.append(out)
        gradients.append([xi.grad] + [p.grad for p in net.parameters()])
    assert torch.allclose(outputs[0], outputs[1], atol=1e-5)
    assert all(torch.allclose(a, b, atol=1e-4) for a, b in zip(*gradients))


@pytest.mark.parametrize("batch", [3, 1])
def test_the_allocation_model_sets_up_a_mask_computed_alike_twice_once(batch):
    """The masks of ``self.mask == 0`` at two reads are set up once (and ``self.mask != 0``'s once): two 64-byte
    masks, as the meta trace of the rebuilt network records them; the model's events are the trace's."""
    from test_allocator import _as_replayed

    from perf4sight.features.alloc_trace import record_events

    desc = describe(_ComputedMaskReadTwice(), SHAPE, name="computed")
    model = record_events(desc, batch, steps=2, method="model")
    assert _as_replayed(model) == _as_replayed(record_events(desc, batch, steps=2, method="trace"))
    assert [e for e in _as_replayed(model) if e[0] == "alloc" and e[2] == "setup" and e[1] == 64] == [
        ("alloc", 64, "setup")] * 2


def test_a_fixed_mask_read_twice_round_trips():
    """A PerfSeer graph keeps the second where's ``shares`` and its own fill, also read as another tool's file (where
    a later call of a layer takes its owner's attrs: a where keeps its own)."""
    from perf4sight.exporters.perfseer import description_to_graph
    from perf4sight.importers.perfseer import graph_to_description

    desc = describe(_MaskReadTwice(), SHAPE, name="twice")
    back, _ = graph_to_description(description_to_graph(desc, 4), "twice", "twice.pkl")
    assert back.to_dict() == desc.to_dict()
    graph = description_to_graph(desc, 4)
    graph.graph["source"] = "another tool"
    foreign, _ = graph_to_description(graph, "twice", "twice.pkl")
    assert [n.attrs for n in foreign.nodes if n.op == "where"] == [n.attrs for n in desc.nodes if n.op == "where"]


def test_a_mask_multiplied_in_costs_what_torch_runs():
    """``x * (x > 0)`` was refused ("a comparison read by anything but torch.where's condition"): it is a where of
    ``multiply``, whose kernels (a dispatch log: the compare and the multiply forward, the gradient's multiply back),
    FLOPs and kept mask (a byte an element: the multiply keeps its boolean operand, the tensor's gradient reading it)
    are a where's of a number branch; the kernel table launches as many."""
    from test_features import _ops_run

    from perf4sight.features.latency_terms import kernel_table
    from perf4sight.features.walk import walk

    desc = describe(_Probe(lambda y: y * (y > 0)), SHAPE, name="multiplied")
    forward, backward = _ops_run(lambda x: x * (x > 0), [8, 8, 8])
    n = 8 * 8 * 8
    assert forward == [("gt", n), ("mul", n)] and backward == [("mul", n)]
    (cost,) = [v.cost for v in walk(desc) if v.node.op == "where"]
    assert (cost.kernels_fwd, cost.kernels_bwd, cost.flops_fwd, cost.flops_bwd, cost.extra_saved_bytes) == (
        2, 1, 2 * n, n, n)
    where = describe(_Probe(lambda y: torch.where(y > 0, y, 0.0)), SHAPE, name="where")
    assert kernel_table(desc).launches == kernel_table(where).launches


def test_a_float_mask_multiplied_in_costs_what_torch_runs():
    """``x * (x > 0).float()`` was refused ("a comparison read by anything but torch.where's condition"): it is a
    where of ``multiply`` and ``float_mask``, whose kernels (a dispatch log: the compare, the cast and the multiply
    forward, the gradient's multiply back) and kept float mask (4 bytes an element: the multiply keeps its float
    operand) are torch's; the kernel table launches one more than a boolean mask's."""
    from test_features import _ops_run

    from perf4sight.features.latency_terms import kernel_table
    from perf4sight.features.walk import walk

    desc = describe(_Probe(lambda y: y * (y > 0).float()), SHAPE, name="float mask")
    forward, backward = _ops_run(lambda x: x * (x > 0).float(), [8, 8, 8])
    n = 8 * 8 * 8
    assert forward == [("gt", n), ("_to_copy", n), ("mul", n)] and backward == [("mul", n)]
    (cost,) = [v.cost for v in walk(desc) if v.node.op == "where"]
    assert (cost.kernels_fwd, cost.kernels_bwd, cost.flops_fwd, cost.flops_bwd, cost.extra_saved_bytes) == (
        3, 1, 2 * n, n, 4 * n)
    boolean = describe(_Probe(lambda y: y * (y > 0)), SHAPE, name="boolean")
    assert kernel_table(desc).launches == kernel_table(boolean).launches + 1


def test_a_mask_multiplied_in_round_trips_and_is_checked():
    """A PerfSeer graph keeps a where's ``multiply``; a description whose where multiplies with a false branch other
    than 0 (or in place) is refused naming the attr."""
    from perf4sight.exporters.perfseer import description_to_graph
    from perf4sight.importers.perfseer import graph_to_description

    desc = describe(_Probe(lambda y: y * (y > 0)), SHAPE, name="multiplied")
    back, _ = graph_to_description(description_to_graph(desc, 4), "multiplied", "multiplied.pkl")
    assert back.to_dict() == desc.to_dict()
    bad = desc.to_dict()
    (where,) = [n for n in bad["nodes"] if n["op"] == "where"]
    where["attrs"]["if_false"] = 1.0
    with pytest.raises(UserError, match=r"attr 'multiply' needs 'if_false' 0"):
        NetworkDescription.from_dict(bad)
    cast = describe(_Probe(lambda y: y * (y > 0).float()), SHAPE, name="float mask")
    back, _ = graph_to_description(description_to_graph(cast, 4), "float mask", "float.pkl")
    assert back.to_dict() == cast.to_dict()
    bad = cast.to_dict()
    (where,) = [n for n in bad["nodes"] if n["op"] == "where"]
    del where["attrs"]["multiply"]
    with pytest.raises(UserError, match=r"attr 'float_mask' needs 'multiply'"):
        NetworkDescription.from_dict(bad)


@pytest.mark.parametrize("batch", [3, 1])
def test_an_einsum_summing_one_tensor_is_its_sum(batch):
    """An einsum of one tensor that leaves letters out (``'bchw->bc'``, ``'bchw->bcw'``) was refused ("an einsum of
    the form ... has no description op"): torch runs it as a sum over those dims (a dispatch log: a permuted view,
    then ``sum``), so it is described as ``x.sum(dims)`` is, their mean times their count; the rebuilt module
    computes the original's output and gradients, and the allocation model writes it down as the meta trace. A sum
    over the batch's letter is refused as a sum's is."""
    from test_allocator import _as_replayed

    from perf4sight.features.alloc_trace import record_events

    pattern = lambda y: y * torch.einsum("bchw->bc", y)[:, :, None, None] + torch.einsum("bchw->bcw", y)[:, :, None]
    desc = _computes_the_same(_Probe(pattern))
    assert [(n.op, n.attrs) for n in desc.nodes if n.op in ("mean", "mul") and "scalar" in n.attrs or n.op == "mean"] \
        == [("mean", {"dims": [2, 3], "keepdim": False}), ("mul", {"scalar": 64.0}),
            ("mean", {"dims": [2], "keepdim": False}), ("mul", {"scalar": 8.0})]
    forward, _ = _dispatched(lambda y: torch.einsum("bchw->bcw", y), torch.randn(2, 8, 8, 8))
    assert [op for op in forward if op != "permute"] == ["sum"]
    model = record_events(desc, batch, steps=2, method="model")
    assert _as_replayed(model) == _as_replayed(record_events(desc, batch, steps=2, method="trace"))
    with pytest.raises(UserError, match=r"a sum over the batch dimension \(dim 0\) has no description op"):
        describe(_Probe(lambda y: y + torch.einsum("bchw->chw", y)), SHAPE, name="refused")


def test_a_training_only_layer_is_found_in_a_forward_reading_a_dtype():
    """Layers called in training only are found by tracing the forward in training; that trace was torch.fx's plain
    one, which stops at ``torch.finfo(y.dtype)`` and then found none: the auxiliary head was left out without a word
    (its weights counted unused). It is traced as the description is, and the model refused naming the layer."""
    class Auxiliary(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.conv, self.fc, self.aux = nn.Conv2d(3, 8, 3, padding=1), nn.Linear(512, 10), nn.Linear(512, 10)

        def forward(self, x):
            y = self.conv(x)
            y = y.masked_fill(y < 0, torch.finfo(y.dtype).min).softmax(-1).flatten(1)
            return self.fc(y) + self.aux(y) if self.training else self.fc(y)
    with pytest.raises(UserError, match=r"its forward calls aux in training only"):
        describe(Auxiliary(), SHAPE, name="auxiliary")


#: Einsums that multiply two tensors and sum the product over letters the result leaves out: (pattern of a [8, 8, 8]
#: map, the per-sample shapes of the batched product's rows).
_PRODUCT_SUMS = {
    "bchw,bchw->bch": (lambda y: y * torch.einsum("bchw,bchw->bch", y, y.sigmoid())[..., None], [[64, 1, 8],
                                                                                              [64, 8, 1]]),
    "bc,bc->b": (lambda y: y * torch.einsum("bc,bc->b", y.mean((2, 3)), y.amax((2, 3)))[:, None, None, None],
                 [[1, 8], [8, 1]]),
    "bchw,bchw->bhw": (lambda y: y * torch.einsum("bchw,bchw->bhw", y, y.sigmoid())[:, None], [[64, 1, 8],
                                                                                            [64, 8, 1]]),
}


@pytest.mark.parametrize("equation", list(_PRODUCT_SUMS))
def test_an_einsum_summing_a_product_is_a_batched_product_of_rows(equation):
    """An einsum of two tensors of one shape, multiplied and summed over letters left out ('bchw,bchw->bhw',
    'bc,bc->b') was refused ("an einsum of the form ... has no description op"): torch runs it as one bmm of rows
    ([M, 1, S] by [M, S, 1], the summed letters put last by a permute where they are not), which is what it is
    described as (reshapes around a matmul); the rebuilt module computes the original's output and gradients."""
    pattern, rows = _PRODUCT_SUMS[equation]
    desc = _computes_the_same(_Probe(pattern))
    mine = [n for n in desc.nodes if n.name.startswith("einsum")]
    permuted = equation.endswith("bhw")
    assert [n.op for n in mine] == ["permute", "reshape"] * 2 * permuted + ["reshape"] * 2 * (not permuted) + [
        "matmul", "reshape"]
    assert [n.output_shape for n in mine if n.name.endswith("_rows")] == rows


@pytest.mark.parametrize("batch", [3, 1])
def test_the_allocation_model_leaves_a_permuted_einsum_product_to_the_trace(batch):
    """An einsum product summed over a letter before others it keeps ('bchw,bchw->bhw': its operands permuted) hands
    its operands' producers gradients of permuted strides (at a batch of 1, a matmul of rows strided), which the
    model does not follow: it says so, and the step's events are the trace's. (The forms summing trailing letters
    are written down as traced: _CASES.)"""
    from perf4sight.features.alloc_model import NotCovered, step_events
    from perf4sight.features.alloc_trace import record_events

    desc = describe(_Probe(_PRODUCT_SUMS["bchw,bchw->bhw"][0]), SHAPE, name="permuted")
    with pytest.raises(NotCovered, match="a gradient with permuted strides|matmul of an input strided other than"):
        step_events(desc, batch)
    assert record_events(desc, batch, method="auto") == record_events(desc, batch, method="trace")


def test_an_einsum_summing_a_product_costs_the_bmm_torch_runs():
    """Torch runs 'bchw,bchw->bch' as one bmm forward ([B * C * H, 1, W] by [B * C * H, W, 1]: 2 FLOPs a product
    element) and two back (a dispatch log), each operand kept: the matmul node's kernels and FLOPs."""
    from test_features import _ops_run

    from perf4sight.features.walk import walk

    desc = describe(_Probe(_PRODUCT_SUMS["bchw,bchw->bch"][0]), SHAPE, name="einsum")
    forward, backward = _ops_run(lambda x: torch.einsum("bchw,bchw->bch", x, x * 2), [8, 8, 8])
    kernels = [(name, e) for name, e in forward if name != "permute"]  # permutes are views
    assert kernels == [("mul", 512), ("bmm", 64)]  # x * 2, then the einsum: no copy, its rows views
    assert [name for name, _ in backward if name == "bmm"] == ["bmm", "bmm"]  # x * 2's mul and the add aside
    (visit,) = [v for v in walk(desc) if v.node.op == "matmul"]
    assert (visit.cost.kernels_fwd, visit.cost.kernels_bwd, visit.cost.flops_fwd) == (1, 2, 2.0 * 8 * 8 * 8)
    assert visit.cost.saved == [0, 1]


def test_a_permuted_einsum_product_counts_the_copies_torch_makes():
    """'bchw,bchw->bhw' puts each operand's channels last (a permuted view), which torch copies into rows for its bmm
    (2 clones at a batch of 2, the bmm keeping the copies): the matmul counts a copy kernel an operand, and what a
    sample adds to autograd's saved tensors is the features' (they had counted the operands' maps: 4,352 bytes a
    sample against 6,400)."""
    from test_features import _autograd_saved_bytes, _forward_ops

    from perf4sight.features.aggregate import network_features
    from perf4sight.features.walk import walk

    module = _Probe(lambda y: torch.einsum("bchw,bchw->bhw", y, y.sigmoid()), 8 * 8)
    desc = describe(module, SHAPE, name="permuted")
    (visit,) = [v for v in walk(desc) if v.node.op == "matmul"]
    assert (visit.copied_inputs, visit.cost.kernels_fwd) == ((0, 1), 3)
    assert _forward_ops(module, [2, *SHAPE]).count("clone") == 2
    at2, at4 = (b * _autograd_saved_bytes(desc, b, with_input=False) for b in (2, 4))
    assert network_features(desc).per_sample["saved_bytes"] == (at4 - at2) / 2 == 6400


@pytest.mark.parametrize("pattern, match", [
    (lambda y: torch.einsum("bchw,bchw->chw", y, y)[None].expand(2, -1, -1, -1),
     r"an einsum summing over the batch dimension \(its first letter\)"),
    (lambda y: y * torch.einsum("bchw,bchw->bc", y, y.mean((2, 3), keepdim=True))[..., None, None],
     r"an einsum multiplying tensors of shapes \[2, 8, 8, 8\] and \[2, 8, 1, 1\] \(broadcast\)"),
])
def test_an_einsum_product_over_the_batch_or_broadcast_is_refused_by_name(pattern, match):
    """A product summed over the batch's letter, or of two shapes broadcast, is refused by name."""
    with pytest.raises(UserError, match=match):
        describe(_Probe(pattern), SHAPE, name="refused")


class _TokenPruning(nn.Module):
    """Token pruning: a map's 8 channels as tokens of 64 features, each scored (a linear layer), the 2 top-scoring
    kept (``x.gather(1, idx.unsqueeze(-1).expand(-1, -1, C))`` at the topk's indices), a classifier of them and the
    scores' mean added (so that the scorer trains)."""

    def __init__(self) -> None:
        super().__init__()
        self.conv, self.score, self.fc = nn.Conv2d(3, 8, 3, padding=1), nn.Linear(64, 1), nn.Linear(2 * 64, 10)

    def forward(self, x):
        t = self.conv(x).flatten(2)
        s = self.score(t).squeeze(-1)
        idx = s.topk(2, dim=1).indices
        kept = t.gather(1, idx.unsqueeze(-1).expand(-1, -1, t.shape[-1]))
        return self.fc(kept.flatten(1)) + s.mean(1, keepdim=True)


def test_a_tensor_gathered_at_a_topks_indices_is_described():
    """Token pruning's gather at a topk's indices was refused ("the indices (int64) of call_method 'topk' ..., which
    call_method 'gather' reads"): it is the op topk of the scores and the tokens, flagged gather (the indices and
    their views no nodes); the rebuilt module computes the original's output and gradients, and the scores take no
    gradient through it (one read, the mean's, sends theirs: no accumulation counted). So is a gather of a map's top
    channels, the indices of its pooled [C, 1, 1] expanded over its sides."""
    from perf4sight.features.walk import gradient_accumulations, walk

    desc = _computes_the_same(_TokenPruning())
    assert [(n.op, n.inputs, n.attrs, n.output_shape) for n in desc.nodes if n.op == "topk"] == [
        ("topk", ["squeeze", "flatten"], {"k": 2, "dim": 1, "largest": True, "gather": True}, [2, 64])]
    assert gradient_accumulations(desc, list(walk(desc))) == {"flatten": 1}
    top = _computes_the_same(_Probe(lambda y: y.gather(1, y.mean((2, 3), keepdim=True).topk(4, 1)[1]
                                                       .expand(-1, -1, 8, 8)), 4 * 8 * 8))  # a map's top channels
    assert [(n.inputs, n.output_shape) for n in top.nodes if n.op == "topk"] == [(["mean", "conv"], [4, 8, 8])]
    # the indices' shape, which the costs and the allocation replay read: the scores' with dim cut to k (a sort: the
    # scores' own)
    from perf4sight.features.formulas import sorted_shape
    for d, expected in ((desc, [2]), (top, [4, 1, 1])):
        (node,) = [n for n in d.nodes if n.op == "topk"]
        scores = d.node(node.inputs[0]).output_shape
        assert sorted_shape(node, scores) == expected
        assert sorted_shape(dataclasses.replace(node, op="sort"), scores) == scores


@pytest.mark.parametrize("batch", [3, 1])
def test_the_allocation_model_writes_down_token_pruning_as_traced(batch):
    """The topk's values and int64 indices, the values freed, the gather's output; the indices and the tokens kept;
    backward zeros of the tokens' size and the scatter_add of the gradient into them: the model's events are the
    meta trace's."""
    from test_allocator import _as_replayed

    from perf4sight.features.alloc_trace import record_events

    desc = describe(_TokenPruning(), SHAPE, name="pruning")
    model = record_events(desc, batch, steps=2, method="model")
    assert _as_replayed(model) == _as_replayed(record_events(desc, batch, steps=2, method="trace"))


def test_a_gather_at_sorted_indices_costs_what_torch_runs():
    """A gather at a topk's indices is the topk's kernel and the gather forward, new_zeros and scatter_add back (a
    dispatch log); it keeps the indices (8 bytes a picked element) and the tensor gathered, as autograd does."""
    from test_features import _autograd_saved_bytes

    from perf4sight.features.aggregate import network_features
    from perf4sight.features.walk import walk

    pattern, op, _ = _CASES["topk's indices gathered"]
    desc = describe(_Probe(pattern), SHAPE, name="gathered")
    forward, backward = _dispatched(lambda x: x.gather(2, x.detach().mean(3).topk(8, dim=2).indices.unsqueeze(-1)
                                                       .expand(-1, -1, -1, 8)), torch.randn(1, 8, 8, 8))
    assert [name for name in forward if name not in ("unsqueeze", "expand", "detach")] == ["mean", "topk", "gather"]
    assert [name for name in backward if name not in ("ones_like", "detach")] == ["new_zeros", "scatter_add"]
    (visit,) = [v for v in walk(desc) if v.node.op == op]
    assert (visit.cost.kernels_fwd, visit.cost.kernels_bwd, visit.cost.saved, visit.cost.extra_saved_bytes) == (
        2, 2, [1], 8.0 * 8 * 8)
    at2, at4 = (b * _autograd_saved_bytes(desc, b, with_input=False) for b in (2, 4))
    assert network_features(desc).per_sample["saved_bytes"] == (at4 - at2) / 2


def test_a_gather_at_sorted_indices_round_trips_and_is_checked():
    """A PerfSeer graph keeps a topk's ``gather`` and its second input; a description whose topk has a second input
    without the flag is refused naming it."""
    from perf4sight.exporters.perfseer import description_to_graph
    from perf4sight.importers.perfseer import graph_to_description

    desc = describe(_TokenPruning(), SHAPE, name="pruning")
    back, _ = graph_to_description(description_to_graph(desc, 4), "pruning", "pruning.pkl")
    assert back.to_dict() == desc.to_dict()
    bad = desc.to_dict()
    (top,) = [n for n in bad["nodes"] if n["op"] == "topk"]
    del top["attrs"]["gather"]
    with pytest.raises(UserError, match=r"takes a second input, the tensor gathered, with the flag gather alone"):
        NetworkDescription.from_dict(bad)


def _kernels_run(module: nn.Module) -> dict[str, int]:
    """The kernels (aten ops by name, views, the leaves' gradient copies and empty tensors aside) one training step
    of ``module`` runs on a batch of 2 [3, 8, 8] images, forward and backward, counted."""
    from collections import Counter

    from torch.utils._python_dispatch import TorchDispatchMode

    views = {"view", "_unsafe_view", "permute", "transpose", "t", "expand", "unsqueeze", "squeeze", "alias", "detach",
             "slice", "select", "as_strided", "new_empty_strided", "copy_", "ones_like", "empty_like"}

    class Kernels(TorchDispatchMode):
        def __init__(self):
            super().__init__()
            self.seen = Counter()

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            name = func.__name__.split(".")[0]
            self.seen[name] += name not in views
            return func(*args, **(kwargs or {}))

    module.zero_grad(set_to_none=True)
    with Kernels() as ran:
        module.train()(torch.randn(2, *SHAPE)).sum().backward()
    return +ran.seen


#: Einsums of two tensors of other letters: (pattern of a [8, 8, 8] map, the ops of the nodes the einsums become).
_BROADCAST_EINSUMS = {
    "a channel gate, the gate first": (lambda y: torch.einsum("bc,bchw->bchw", y.mean((2, 3)).sigmoid(), y),
                                       ["reshape", "mul"]),
    "a spatial gate": (lambda y: torch.einsum("bchw,bhw->bchw", y, y.mean(1)), ["reshape", "mul"]),
    "a map pooled at spatial weights": (lambda y: y * torch.einsum("bchw,bhw->bc", y, y.mean(1).sigmoid())[
        ..., None, None], ["reshape", "reshape", "matmul", "reshape"]),
    "channels by channels, the right's first": (
        lambda y: y + torch.einsum("bchw,bdhw->bdc", y, y.sigmoid())[..., None],
        ["permute", "reshape", "reshape", "matmul", "reshape"]),
    "a map pooled at weights, permuted": (lambda y: y * torch.einsum("bhwc,bhw->bc", y.permute(0, 2, 3, 1), y.mean(1))[
        ..., None, None], ["permute", "reshape", "reshape", "matmul", "reshape"]),
}


@pytest.mark.parametrize("case", list(_BROADCAST_EINSUMS))
def test_an_einsum_of_operands_of_other_letters_is_described_as_torch_runs_it(case):
    """An einsum of two tensors of other letters was refused ("an einsum of the form ... has no description op"): one
    summing nothing, its result one operand's letters, the other's some of them (a channel or spatial gate, 'bc,bchw->
    bchw'), is torch's mul of the two, the other broadcast (a reshape, a view); one summing letters of both and
    keeping letters of one ('bchw,bhw->bc', a map pooled at spatial weights; 'bchw,bdhw->bdc') torch's bmm of rows,
    [C, HW] by [HW, 1] (of the right's by the left's where the result has the right's letters first), between
    reshapes. The rebuilt module computes the original's output and gradients, and runs the kernels the module runs
    (a dispatch log, forward and backward, views and the leaf's gradient copies aside)."""
    from perf4sight.ir.to_torch import build_module

    pattern, ops = _BROADCAST_EINSUMS[case]
    module = _Probe(pattern)
    desc = _computes_the_same(module)
    assert [n.op for n in desc.nodes if n.name.startswith("einsum")] == ops

    assert _kernels_run(module) == _kernels_run(build_module(desc))


@pytest.mark.parametrize("case", list(_BROADCAST_EINSUMS))
def test_an_einsum_of_operands_of_other_letters_keeps_what_autograd_keeps(case):
    """What a sample adds to autograd's saved tensors (the network input aside) is the features' (a gate's mul keeps
    both operands; a bmm its rows, copies where torch copies them)."""
    from test_features import _autograd_saved_bytes

    from perf4sight.features.aggregate import network_features

    desc = describe(_Probe(_BROADCAST_EINSUMS[case][0]), SHAPE, name="einsum")
    at2, at4 = (b * _autograd_saved_bytes(desc, b, with_input=False) for b in (2, 4))
    assert network_features(desc).per_sample["saved_bytes"] == (at4 - at2) / 2


@pytest.mark.parametrize("case", list(_BROADCAST_EINSUMS))
@pytest.mark.parametrize("batch", [3, 1])
def test_the_allocation_model_writes_down_an_einsum_of_other_letters_as_traced(case, batch):
    """The model's events are the meta trace's; at a batch of 1, a map added to the product of channels by channels
    ('bdc', broadcast over the width) is an add the model declines by name, and the step's events are the trace's."""
    from test_allocator import _as_replayed

    from perf4sight.features.alloc_trace import record_events

    desc = describe(_Probe(_BROADCAST_EINSUMS[case][0]), SHAPE, name="einsum")
    trace = record_events(desc, batch, steps=2, method="trace")
    if case.startswith("channels by channels") and batch == 1:
        with pytest.raises(UserError, match="does not cover add of a strided tensor broadcast"):
            record_events(desc, batch, steps=2, method="model")
        assert record_events(desc, batch, steps=2, method="auto") == trace
        return
    assert _as_replayed(record_events(desc, batch, steps=2, method="model")) == _as_replayed(trace)


@pytest.mark.parametrize("pattern", [lambda y: y.gather(2, y.topk(8, 2)[1]).mean((2, 3)),
                                     lambda y: y.gather(1, y.mean((2, 3), keepdim=True).sort(1)[1]
                                                        .expand(-1, -1, y.shape[2], y.shape[3])).mean((2, 3)),
                                     lambda y: (lambda r: y.gather(2, r[1]) * y.sigmoid().gather(2, r[1])
                                                * r[0])(y.topk(8, 2)).mean((2, 3))])
def test_a_gather_at_sorted_indices_is_described_again_at_another_input_shape(pattern):
    """The rebuilt gather at a sort's or topk's indices broadcast them with sizes read as numbers (``int(y.shape[d])``,
    ``range(y.dim())``), which torch.fx cannot trace, so the description could not be re-shaped (described_at, the
    networks stage's extra shapes, --input-shape: "cannot trace the module with torch.fx (TypeError: 'Proxy' object
    cannot be interpreted as an integer)"). The ranks are the description's and the sizes read at run time: at 8x12
    it is the module's description there."""
    from perf4sight.networks.reshape import described_at

    def layout(desc):  # a node's shares as its owner's position: the rebuilt network names its nodes anew
        at = {n.name: i for i, n in enumerate(desc.nodes)}
        return [(n.op, {k: at[v] if k == "shares" else v for k, v in n.attrs.items()}, n.output_shape)
                for n in desc.nodes]

    module = _Probe(pattern, 8)
    wider = described_at(describe(module, SHAPE, name="gathered"), [3, 8, 12])
    assert layout(wider) == layout(describe(module, [3, 8, 12], name="gathered"))


class _TokensAndCodes(nn.Module):
    """Token pruning keeping each picked token and its code: a map's 8 channels as tokens of 64 features, each
    scored (a linear layer) and coded (another), the tokens and their codes gathered at the 2 top scores' indices
    (one topk, two gathers), a classifier of both and the scores' mean added (so that the scorer trains)."""

    def __init__(self) -> None:
        super().__init__()
        self.conv, self.score, self.coder = nn.Conv2d(3, 8, 3, padding=1), nn.Linear(64, 1), nn.Linear(64, 16)
        self.fc = nn.Linear(2 * 64 + 2 * 16, 10)

    def forward(self, x):
        t = self.conv(x).flatten(2)
        s = self.score(t).squeeze(-1)
        idx = s.topk(2, dim=1).indices.unsqueeze(-1)
        kept, codes = t.gather(1, idx.expand(-1, -1, 64)), self.coder(t).gather(1, idx.expand(-1, -1, 16))
        return self.fc(torch.cat([kept.flatten(1), codes.flatten(1)], 1)) + s.mean(1, keepdim=True)


#: Indices read by two gathers: (module, the sort or topk nodes' (name, inputs, attrs)).
_TWO_GATHERS = {
    "tokens and their codes": (_TokensAndCodes, [
        ("gather", ["squeeze", "flatten"], {"k": 2, "dim": 1, "largest": True, "gather": True}),
        ("gather_1", ["squeeze", "coder"], {"k": 2, "dim": 1, "largest": True, "gather": True, "shares": "gather"})]),
    "a map and its gate, sorted": (lambda: _Probe(lambda y: (lambda i: y.gather(2, i) * y.sigmoid().gather(2, i))(
        y.sort(2, descending=True)[1])), [
        ("gather", ["conv", "conv"], {"dim": 2, "descending": True, "gather": True}),
        ("gather_1", ["conv", "sigmoid"], {"dim": 2, "descending": True, "gather": True, "shares": "gather"})]),
    "a gather, then the values": (lambda: _Probe(lambda y: (lambda r: y.gather(2, r[1]) * r[0].sigmoid())(
        y.topk(8, 2))), [("getitem_1", ["conv"], {"k": 8, "dim": 2, "largest": True}),
                         ("gather", ["conv", "conv"], {"k": 8, "dim": 2, "largest": True, "gather": True,
                                                       "shares": "getitem_1"})]),
    "the values, then a gather": (lambda: _Probe(lambda y: (lambda r: r[0].sigmoid() * y.gather(2, r[1]))(
        y.sort(2))), [("getitem", ["conv"], {"dim": 2, "descending": False}),
                      ("gather", ["conv", "conv"], {"dim": 2, "descending": False, "gather": True,
                                                    "shares": "getitem"})]),
}


@pytest.mark.parametrize("case", list(_TWO_GATHERS))
def test_indices_read_by_two_gathers_are_one_sort(case):
    """Indices read by two gathers (a token's features and its code picked at one topk's indices) were refused ("the
    indices (int64) of call_method 'topk' ..., which call_method 'gather' reads"): each gather is the op of gather,
    the later one ``shares`` the first (its gather alone, at the first's indices). A call whose values are read
    beside a gather (``v, i = s.topk(k)``) was described as two calls (the rebuilt module ran two topks): its values'
    node, put before the gather, is the one the gather shares. The rebuilt module computes the original's output and
    gradients and runs its kernels (one topk or sort), a dispatch log forward and backward."""
    from perf4sight.ir.to_torch import build_module

    make, nodes = _TWO_GATHERS[case]
    module = make()
    desc = _computes_the_same(module)
    assert [(n.name, n.inputs, n.attrs) for n in desc.nodes if n.op in ("sort", "topk")] == nodes
    ran = _kernels_run(module)
    assert ran == _kernels_run(build_module(desc)) and ran[desc.node("gather").op] == 1


@pytest.mark.parametrize("case", list(_TWO_GATHERS))
def test_a_second_gather_costs_and_keeps_what_torch_does(case):
    """The later gather costs its gather alone (one kernel forward, new_zeros and scatter_add back, an add an element
    back), keeps its tensor and no indices of its own (they are the first's: autograd keeps one tensor), so what a
    sample adds to autograd's saved tensors is the features'; the kernel table launches one gather's kernels more
    than the first alone."""
    from test_features import _autograd_saved_bytes

    from perf4sight.features.aggregate import network_features
    from perf4sight.features.latency_terms import kernel_table
    from perf4sight.features.walk import walk

    desc = describe(_TWO_GATHERS[case][0](), SHAPE, name="two")
    first, later = [v for v in walk(desc) if v.node.op in ("sort", "topk")]
    n = 1.0 * math.prod(later.node.output_shape)
    assert (later.cost.kernels_fwd, later.cost.kernels_bwd, later.cost.flops_fwd, later.cost.flops_bwd) == (1, 2, 0, n)
    assert (later.cost.saved, later.cost.extra_saved_bytes) == ([1], 0) and first.cost.extra_saved_bytes > 0
    at2, at4 = (b * _autograd_saved_bytes(desc, b, with_input=False) for b in (2, 4))
    assert network_features(desc).per_sample["saved_bytes"] == (at4 - at2) / 2
    alone = desc.to_dict()
    (node,) = [x for x in alone["nodes"] if x["name"] == later.node.name]
    del node["attrs"]["shares"]
    assert kernel_table(desc).launches == kernel_table(NetworkDescription.from_dict(alone)).launches - 1


@pytest.mark.parametrize("case", ["tokens and their codes", "a gather, then the values"])
@pytest.mark.parametrize("batch", [3, 1])
def test_the_allocation_model_leaves_a_second_gather_to_the_trace(case, batch):
    """The first node's indices, held by the later gather too, are left to the meta trace by name; a step's events
    are the trace's."""
    from perf4sight.features.alloc_model import NotCovered, step_events
    from perf4sight.features.alloc_trace import record_events

    desc = describe(_TWO_GATHERS[case][0](), SHAPE, name="two")
    with pytest.raises(NotCovered, match="a topk's indices read by a second gather"):
        step_events(desc, batch)
    assert record_events(desc, batch, method="auto") == record_events(desc, batch, method="trace")


def test_a_second_gather_round_trips_and_is_checked():
    """A PerfSeer graph keeps the later gather's ``shares`` (also read as another tool's file); a description whose
    later gather names a node of another input, or one not of gather, is refused naming the attr."""
    from perf4sight.exporters.perfseer import description_to_graph
    from perf4sight.importers.perfseer import graph_to_description

    desc = describe(_TokensAndCodes(), SHAPE, name="two")
    back, _ = graph_to_description(description_to_graph(desc, 4), "two", "two.pkl")
    assert back.to_dict() == desc.to_dict()
    graph = description_to_graph(desc, 4)
    graph.graph["source"] = "another tool"
    foreign, _ = graph_to_description(graph, "two", "two.pkl")
    assert [n.attrs for n in foreign.nodes if n.op == "topk"] == [n.attrs for n in desc.nodes if n.op == "topk"]
    bad = desc.to_dict()
    (later,) = [n for n in bad["nodes"] if n["attrs"].get("shares")]
    later["inputs"][0] = "flatten"
    with pytest.raises(UserError, match=r"attr 'shares' of a topk names the topk whose indices it gathers at"):
        NetworkDescription.from_dict(bad)


def test_a_network_gathering_twice_at_one_topk_prunes_and_trains():
    """Pruning keeps both gathers (the tokens' channels cut, the map's): the pruned network describes, the later
    gather sharing the first's indices, and a training step runs."""
    from test_networks import _train_step

    from perf4sight.networks.build import Source, prune_source

    class Net(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.stem, self.block = nn.Conv2d(3, 16, 3, padding=1), _TokensAndCodes()
            self.block.conv = nn.Conv2d(16, 8, 3, padding=1)

        def forward(self, x):
            return self.block(self.stem(x).relu())
    (desc,) = prune_source(Source("net", "test", Net), [3, 8, 8], [30], "l1-norm", 2, seed=0)
    assert desc.node("stem").attrs["out_channels"] < 16
    assert [n.attrs.get("shares") for n in desc.nodes if n.op == "topk"] == [None, "gather"]
    _train_step(desc)


def test_an_argsort_read_by_gathers_is_a_sort_of_gather():
    """torch.argsort (and x.argsort) read by gathers was refused ("call_method 'argsort' has no description op"):
    torch runs it as aten.sort (a dispatch log: its values written, not read), so it is the sort's indices: the op
    sort of gather, a second gather sharing the first, as ``x.sort(d)[1]`` is described. The rebuilt module computes
    the original's output and gradients and runs its kernels; a stable argsort is refused as a stable sort is."""
    from perf4sight.ir.to_torch import build_module

    by_argsort = lambda y: (lambda i: y.gather(2, i) * y.sigmoid().gather(2, i))(torch.argsort(y, 2, True))
    by_sort = lambda y: (lambda i: y.gather(2, i) * y.sigmoid().gather(2, i))(torch.sort(y, 2, True)[1])
    module = _Probe(by_argsort)
    desc = _computes_the_same(module)
    assert [(n.op, n.inputs, n.attrs, n.output_shape) for n in desc.nodes] == [
        (n.op, n.inputs, n.attrs, n.output_shape) for n in describe(_Probe(by_sort), SHAPE, name="sort").nodes]
    assert _kernels_run(module) == _kernels_run(build_module(desc))
    forward, _ = _dispatched(lambda x: x.gather(2, x.argsort(2)), torch.randn(1, 8, 8, 8))
    assert forward[:2] == ["sort", "gather"]
    with pytest.raises(UserError, match=r"a stable argsort \(stable=True\) has no description op"):
        describe(_Probe(lambda y: y.gather(2, torch.argsort(y, dim=2, stable=True))), SHAPE, name="stable")


class _HandConv(nn.Module):
    """A hand-written convolution layer: F.conv2d on its own weight (and bias)."""

    def __init__(self, cin: int, cout: int, groups: int, bias: bool, **call) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.randn(cout, cin // groups, 3, 3) * 0.1)
        self.bias = nn.Parameter(torch.zeros(cout)) if bias else None
        self.groups, self.call = groups, call

    def forward(self, x):
        return F.conv2d(x, self.weight, self.bias, groups=self.groups, **self.call)


class _FunctionalConvs(nn.Module):
    """Hand-written convolution layers after a conv's [8, 8, 8] map: one of a bias, padding 'same', then a grouped,
    strided one without a bias (padding 1); the classifier after."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, 8, 3, padding=1)
        self.weight = _HandConv(8, 8, 1, True, padding="same")
        self.grouped = _HandConv(8, 16, 2, False, stride=2, padding=1)
        self.fc = nn.Linear(16 * 4 * 4, 10)

    def forward(self, x):
        return self.fc(self.grouped(self.weight(self.conv(x)).relu()).flatten(1))


class _LayerConvs(nn.Module):
    """:class:`_FunctionalConvs` of nn.Conv2d layers."""

    def __init__(self) -> None:
        super().__init__()
        self.conv, self.weight = nn.Conv2d(3, 8, 3, padding=1), nn.Conv2d(8, 8, 3, padding=1)
        self.grouped, self.fc = nn.Conv2d(8, 16, 3, stride=2, padding=1, groups=2, bias=False), nn.Linear(256, 10)

    def forward(self, x):
        return self.fc(self.grouped(self.weight(self.conv(x)).relu()).flatten(1))


def test_a_convolution_on_a_modules_own_weight_is_a_conv2d():
    """F.conv2d on a module's own parameters (a hand-written convolution layer) was refused ("call_function 'conv2d'
    has no description op"): it is the op conv2d its weight's shape gives ('same' padding read as nn.Conv2d's), the
    description nn.Conv2d layers of those attrs have (so costed, written down and pruned as they are); the rebuilt
    module computes the original's output and gradients, and the allocation model writes it down as the meta trace
    (batches 3 and 1). A filter held as a buffer (a blur pool's) is a conv2d of fixed (test_ir_research_blocks)."""
    from test_allocator import _as_replayed

    from perf4sight.features.alloc_trace import record_events

    desc = _computes_the_same(_FunctionalConvs())
    layers = describe(_LayerConvs(), SHAPE, name="layers")
    assert [(n.op, n.attrs, n.output_shape) for n in desc.nodes] == [
        (n.op, n.attrs, n.output_shape) for n in layers.nodes]
    for batch in (3, 1):
        assert _as_replayed(record_events(desc, batch, steps=2, method="model")) == _as_replayed(
            record_events(desc, batch, steps=2, method="trace"))

    class Blur(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.conv = nn.Conv2d(3, 8, 3, padding=1)
            self.register_buffer("filt", torch.ones(8, 1, 3, 3) / 9)

        def forward(self, x):
            return F.conv2d(self.conv(x), self.filt, stride=2, padding=1, groups=8).flatten(1)
    assert [n.attrs.get("fixed") for n in describe(Blur(), SHAPE, name="blur").nodes if n.op == "conv2d"] == [
        None, True]


class _ShapedConv(nn.Module):
    """A hand-written depthwise convolution whose groups and padding are read from the map's shape (a blur or
    smoothing layer written for any width: ``groups=x.shape[1]``), between a conv's [8, 8, 8] map and a classifier."""

    def __init__(self) -> None:
        super().__init__()
        self.conv, self.depthwise = nn.Conv2d(3, 8, 3, padding=1), nn.Module()
        self.depthwise.weight = nn.Parameter(torch.randn(8, 1, 3, 3) * 0.1)
        self.fc = nn.Linear(8 * 4 * 4, 10)

    def forward(self, x):
        y = self.conv(x)
        return self.fc(F.conv2d(y, self.depthwise.weight, None, 2, y.shape[1] // 8, 1, y.shape[1]).flatten(1))


def test_a_convolutions_groups_and_padding_read_from_a_shape_are_numbers():
    """F.conv2d's groups or padding given as ``x.shape[1]`` (a number torch.fx traces as a node) ended the description
    in "cannot describe node conv2d (TypeError: int() argument must be ... not 'Node')": they are the numbers the
    trace computes, and the rebuilt module computes the original's output and gradients."""
    desc = _computes_the_same(_ShapedConv())
    assert [n.attrs for n in desc.nodes if n.op == "conv2d"][1] == {
        "in_channels": 8, "out_channels": 8, "kernel_size": [3, 3], "stride": [2, 2], "padding": [1, 1],
        "dilation": [1, 1], "groups": 8, "bias": False}


def test_a_network_of_hand_written_convolutions_prunes_and_trains():
    """torch-pruning cannot cut a bare parameter's channels: the groups through them are kept whole (listed), a
    stem's before them cut, and a training step of the pruned network runs."""
    from test_networks import _train_step

    from perf4sight.networks.build import Source, prune_source

    class Net(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.stem, self.block = nn.Conv2d(3, 16, 3, padding=1), _FunctionalConvs()
            self.block.conv = nn.Conv2d(16, 8, 3, padding=1)

        def forward(self, x):
            return self.block(self.stem(x).relu())
    (desc,) = prune_source(Source("net", "test", Net), SHAPE, [10], "l1-norm", 2, seed=0)
    assert desc.node("stem").attrs["out_channels"] < 16 and [n.op for n in desc.nodes].count("conv2d") == 4
    assert desc.to_dict()["pruning_unpruned_groups"]
    _train_step(desc)


class _Added(nn.Module):
    """Its input plus ``tensor``, a buffer."""

    def __init__(self, tensor: torch.Tensor) -> None:
        super().__init__()
        self.register_buffer("tensor", tensor)

    def forward(self, x):
        return x + self.tensor


class _FixedCodes(nn.Module):
    """Buffers added to a conv's [8, 8, 8] map: a fixed (sinusoidal) position code of the map's shape, then a base
    grid, offsets learnt by a conv added to it, the map resampled there (a deformable-free warp); a classifier."""

    def __init__(self) -> None:
        super().__init__()
        self.conv, self.offsets, self.fc = nn.Conv2d(3, 8, 3, padding=1), nn.Conv2d(8, 2, 3, padding=1), nn.Linear(
            512, 10)
        self.register_buffer("position", torch.sin(torch.arange(512.0)).view(8, 8, 8))
        ys, xs = torch.meshgrid(torch.linspace(-1, 1, 8), torch.linspace(-1, 1, 8), indexing="ij")
        self.register_buffer("base", torch.stack([xs, ys], -1))

    def forward(self, x):
        y = self.conv(x) + self.position
        grid = self.base + self.offsets(y).tanh().permute(0, 2, 3, 1)
        return self.fc(F.grid_sample(y, grid, align_corners=True).flatten(1))


def test_a_buffer_added_is_a_fixed_shift():
    """A module's buffer added to a tensor (a fixed position code, a warp's base grid) was refused ("add reads base, a
    module tensor that is no parameter, which the description has no op for"): it is a shift of the optional flag
    fixed, a buffer learnt nothing (no parameter counted, no gradient of it: one kernel forward, none back, as the
    dispatch log runs). The rebuilt module computes the original's output and gradients and runs its kernels; what a
    sample adds to autograd's saved tensors is the features'; the allocation model writes a code added down as the
    meta trace (batches 3 and 1; the buffer set up, no gradient), and leaves the warp's permuted offsets to it by
    name; a PerfSeer graph keeps the flag."""
    from test_allocator import _as_replayed
    from test_features import _autograd_saved_bytes

    from perf4sight.exporters.perfseer import description_to_graph
    from perf4sight.features.aggregate import network_features
    from perf4sight.features.alloc_model import NotCovered, step_events
    from perf4sight.features.alloc_trace import record_events
    from perf4sight.features.walk import walk
    from perf4sight.importers.perfseer import graph_to_description
    from perf4sight.ir.to_torch import build_module

    module = _FixedCodes()
    desc = _computes_the_same(module)
    assert [(n.inputs, n.attrs) for n in desc.nodes if n.op == "shift"] == [
        (["conv"], {"shape": [8, 8, 8], "fixed": True}), (["permute"], {"shape": [8, 8, 2], "fixed": True})]
    assert _kernels_run(module) == _kernels_run(build_module(desc))
    costs = [(v.cost.kernels_fwd, v.cost.kernels_bwd, v.cost.params) for v in walk(desc) if v.node.op == "shift"]
    assert costs == [(1, 0, 0)] * 2
    at2, at4 = (b * _autograd_saved_bytes(desc, b, with_input=False) for b in (2, 4))
    assert network_features(desc).per_sample["saved_bytes"] == (at4 - at2) / 2
    coded = describe(nn.Sequential(module.conv, _Added(module.position), nn.Flatten(), module.fc), SHAPE, name="code")
    for batch in (3, 1):
        assert _as_replayed(record_events(coded, batch, steps=2, method="model")) == _as_replayed(
            record_events(coded, batch, steps=2, method="trace"))
        with pytest.raises(NotCovered, match="a gradient with permuted strides"):  # the warp's permuted offsets
            step_events(desc, batch)
    back, _ = graph_to_description(description_to_graph(desc, 4), "probe", "probe.pkl")
    assert back.to_dict() == desc.to_dict()


def test_a_network_adding_a_buffer_prunes_and_trains():
    """torch-pruning cannot cut a buffer's channels: the group through it is kept whole (listed), a stem's before it
    cut, and a training step of the pruned network runs."""
    from test_networks import _train_step

    from perf4sight.networks.build import Source, prune_source

    class Net(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.stem, self.block = nn.Conv2d(3, 16, 3, padding=1), _FixedCodes()
            self.block.conv = nn.Conv2d(16, 8, 3, padding=1)

        def forward(self, x):
            return self.block(self.stem(x).relu())
    (desc,) = prune_source(Source("net", "test", Net), SHAPE, [10], "l1-norm", 2, seed=0)
    assert desc.node("stem").attrs["out_channels"] < 16 and [n.op for n in desc.nodes].count("shift") == 2
    _train_step(desc)


class _HandLinear(nn.Module):
    """A hand-written linear layer: F.linear on its own weight (and bias)."""

    def __init__(self, cin: int, cout: int, bias: bool) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.randn(cout, cin) * 0.1)
        self.bias = nn.Parameter(torch.zeros(cout)) if bias else None

    def forward(self, x):
        return F.linear(x, self.weight, self.bias)


class _FunctionalLinears(nn.Module):
    """A conv's [8, 8, 8] map, each channel's 64 pixels mixed by a hand-written linear layer without a bias, then
    classified by one with a bias; ``layer`` makes the layers (nn.Linear: the same network of torch's layers)."""

    def __init__(self, layer=_HandLinear) -> None:
        super().__init__()
        self.conv, self.mix, self.head = nn.Conv2d(3, 8, 3, padding=1), layer(64, 64, False), layer(512, 10, True)

    def forward(self, x):
        return self.head(self.mix(self.conv(x).flatten(2)).flatten(1))


def test_a_linear_layer_on_a_modules_own_weight_is_a_linear():
    """F.linear on a module's own parameters (a hand-written linear layer) was refused ("call_function 'linear' has
    no description op"): it is the op linear its weight's shape gives, the description nn.Linear layers have (so
    costed, written down and pruned as they are); the rebuilt module computes the original's output and gradients
    and runs its kernels, and the allocation model writes it down as the meta trace (batches 3 and 1)."""
    from test_allocator import _as_replayed

    from perf4sight.features.alloc_trace import record_events
    from perf4sight.ir.to_torch import build_module

    module = _FunctionalLinears()
    desc = _computes_the_same(module)
    layers = describe(_FunctionalLinears(lambda i, o, b: nn.Linear(i, o, bias=b)), SHAPE, name="layers")
    assert [(n.op, n.attrs, n.output_shape) for n in desc.nodes] == [
        (n.op, n.attrs, n.output_shape) for n in layers.nodes]
    assert _kernels_run(module) == _kernels_run(build_module(desc))
    for batch in (3, 1):
        assert _as_replayed(record_events(desc, batch, steps=2, method="model")) == _as_replayed(
            record_events(desc, batch, steps=2, method="trace"))


def test_a_network_of_hand_written_linear_layers_prunes_and_trains():
    """The groups through the bare parameters are kept whole (listed), a stem's before them cut, and a training step
    of the pruned network runs."""
    from test_networks import _train_step

    from perf4sight.networks.build import Source, prune_source

    class Net(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.stem, self.block = nn.Conv2d(3, 16, 3, padding=1), _FunctionalLinears()
            self.block.conv = nn.Conv2d(16, 8, 3, padding=1)

        def forward(self, x):
            return self.block(self.stem(x).relu())
    (desc,) = prune_source(Source("net", "test", Net), SHAPE, [10], "l1-norm", 2, seed=0)
    assert desc.node("stem").attrs["out_channels"] < 16 and [n.op for n in desc.nodes].count("linear") == 2
    _train_step(desc)


class _EinsumKeys(nn.Module):
    """Logits of a tensor's rows against a learnt [16, 8] table of keys written as an einsum (a relative position's
    logits, a prototype head): ``torch.einsum("bid,jd->bij", x, self.weight)``; ``einsum`` False: F.linear."""

    def __init__(self, einsum: bool = True) -> None:
        super().__init__()
        self.weight, self.einsum = nn.Parameter(torch.randn(16, 8) * 0.1), einsum

    def forward(self, x):
        return torch.einsum("bid,jd->bij", x, self.weight) if self.einsum else F.linear(x, self.weight)


class _KeyedLogits(nn.Module):
    """A conv's [8, 8, 8] map as 64 pixels of 8 channels, each's logits against the keys, classified."""

    def __init__(self, einsum: bool = True) -> None:
        super().__init__()
        self.conv, self.keys, self.fc = nn.Conv2d(3, 8, 3, padding=1), _EinsumKeys(einsum), nn.Linear(64 * 16, 10)

    def forward(self, x):
        return self.fc(self.keys(self.conv(x).flatten(2).transpose(1, 2)).flatten(1))


def test_an_einsum_of_a_modules_weight_is_a_linear_layer():
    """An einsum of a tensor and a module's own [out, in] parameter over the tensor's last letter ('bid,jd->bij') was
    refused ("an einsum of the form ... has no description op"): it is F.linear(x, weight), the op linear without a
    bias, as F.linear is described; the rebuilt module computes the original's output and gradients. Torch runs the
    einsum as one bmm of the rows folded (the same products: a dispatch log), the linear layer as mm; the kernels
    are otherwise the same; the allocation model leaves linear layers of transposed rows to the trace by name, as
    nn.Linear's. An einsum of the weight first is still refused by its form."""
    from collections import Counter

    from perf4sight.features.alloc_model import NotCovered, step_events
    from perf4sight.features.alloc_trace import record_events
    from perf4sight.ir.to_torch import build_module

    module = _KeyedLogits()
    desc = _computes_the_same(module)
    assert [(n.op, n.attrs, n.output_shape) for n in desc.nodes] == [
        (n.op, n.attrs, n.output_shape) for n in describe(_KeyedLogits(False), SHAPE, name="linear").nodes]
    assert [(n.op, n.attrs) for n in desc.nodes if n.op == "linear"][0] == (
        "linear", {"in_features": 8, "out_features": 16, "bias": False})
    ran = Counter()
    for kernel, count in _kernels_run(module).items():
        ran["mm" if kernel == "bmm" else kernel] += count
    assert ran == _kernels_run(build_module(desc))
    for batch in (3, 1):  # of transposed rows, as an nn.Linear's: declined by name, the trace's events
        with pytest.raises(NotCovered, match="linear of a strided tensor"):
            step_events(desc, batch)
        assert record_events(desc, batch, method="auto") == record_events(desc, batch, method="trace")
    with pytest.raises(UserError, match=r"an einsum of the form 'jd,bid->bij' has no description op"):
        describe(_Probe(lambda y: y.flatten(2).transpose(1, 2) + torch.einsum(
            "jd,bid->bij", torch.ones(8, 8), y.flatten(2).transpose(1, 2))), SHAPE, name="refused")



def test_a_models_attribute_named_as_a_graph_modules_is_refused_in_one_line():
    """A model's own layer or buffer named ``code`` (a codebook's) or ``graph`` cannot be copied onto torch.fx's
    GraphModule, whose property it is: describe failed with a raw AttributeError traceback ("`code` is not an
    nn.Module") or "cannot trace the module with torch.fx (RuntimeError: Code has not been generated! Please report
    a bug to PyTorch)". It is refused in one line naming the attribute; held one level down, it describes."""
    class Coded(nn.Module):
        def __init__(self, buffer: bool) -> None:
            super().__init__()
            self.conv = nn.Conv2d(3, 8, 3)
            if buffer:
                self.register_buffer("graph", torch.zeros(8, 6, 6))
            else:
                self.code = nn.Conv2d(8, 8, 1)

        def forward(self, x):
            y = self.conv(x)
            return (y + self.graph if hasattr(self, "graph") and isinstance(self.graph, torch.Tensor)
                    else self.code(y)).flatten(1)
    for buffer, attr in ((False, "code"), (True, "graph")):
        with pytest.raises(UserError, match=rf"coded: the model's attribute '{attr}' has the name of torch.fx's "
                                            rf"GraphModule.{attr}"):
            describe(Coded(buffer), SHAPE, name="coded")
    held = describe(nn.Sequential(Coded(False)), SHAPE, name="held")
    assert [n.op for n in held.nodes] == ["input", "conv2d", "conv2d", "flatten"]
