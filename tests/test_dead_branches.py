"""A branch whose output no gradient reaches (``y = self.b(x)``, ``y`` never used; a value read only as a where's
condition): torch runs it forward alone. No backward kernels, nothing kept, and its parameters' ``.grad`` stays None,
so that the optimiser keeps no state for them and updates them not (``walk.untrained_nodes``)."""
from __future__ import annotations

import numpy as np
import pytest
import torch
from torch import nn

from perf4sight.features.aggregate import MIB, features_for, network_features
from perf4sight.features.latency_terms import kernel_table
from perf4sight.features.optimizers import optimizer_cost
from perf4sight.features.walk import untrained_nodes, walk
from perf4sight.ir.from_torch import describe
from perf4sight.ir.to_torch import build_module


class _Branches(nn.Module):
    """A stem and a head; ``dead``: a convolution whose output the forward drops; ``shared``: the head's linear layer
    called once more on a dropped value; ``gate``: a convolution read only as a where's condition; ``weight``: a
    parameter multiplied into a dropped value; ``chain``: a dropped block (convolution, batch norm, ReLU in place,
    convolution)."""

    def __init__(self, dead: bool = False, shared: bool = False, gate: bool = False, weight: bool = False,
                 chain: bool = False) -> None:
        super().__init__()
        self.dead, self.shared, self.gate, self.weight, self.chain = dead, shared, gate, weight, chain
        self.a, self.r = nn.Conv2d(3, 8, 3, padding=1), nn.ReLU()
        self.b = nn.Conv2d(8, 16, 3, padding=1)
        self.g = nn.Conv2d(8, 8, 1)
        self.w = nn.Parameter(torch.ones(8, 1, 1))
        self.fc = nn.Linear(8, 10)
        self.c = nn.Sequential(nn.Conv2d(8, 8, 3, padding=1), nn.BatchNorm2d(8), nn.ReLU(inplace=True),
                               nn.Conv2d(8, 4, 1))

    def forward(self, x):
        x = self.r(self.a(x))
        if self.dead:
            self.b(x)  # y = self.b(x), y never used: torch runs it forward alone
        if self.chain:
            self.c(x)
        if self.gate:
            x = torch.where(self.g(x) > 0, x, 0.0)
        if self.weight:
            x * self.w
        h = torch.flatten(nn.functional.adaptive_avg_pool2d(x, 1), 1)
        if self.shared:
            self.fc(h * 2.0)
        return self.fc(h)


def _step(model: nn.Module) -> torch.optim.Optimizer:
    """One SGD step of ``model`` (momentum): the optimiser, its state made."""
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    nn.functional.cross_entropy(model(torch.randn(2, 3, 8, 8)), torch.tensor([1, 2])).backward()
    opt.step()
    return opt


@pytest.fixture(scope="module")
def plain():
    return describe(_Branches(), [3, 8, 8], "plain")


@pytest.mark.parametrize("kind", ["dead", "gate", "weight"])
def test_a_branch_no_gradient_reaches_is_trained_as_torch_trains_it(plain, kind):
    """The description keeps the branch (torch.fx keeps the call, and the rebuilt network runs it: it costs time);
    torch gives it no gradient (its parameters' .grad None, no optimiser state for them), and the features count
    its forward alone: the backward's FLOPs, kernels and kept tensors are the network's without it, its
    parameters counted once (the weights), not three times (weights, gradients, momentum)."""
    desc = describe(_Branches(**{kind: True}), [3, 8, 8], kind)
    layer = {"dead": "b", "gate": "g", "weight": "mul"}[kind]  # the node (and rebuilt module) of the branch's layer
    untrained = untrained_nodes(desc)
    assert layer in untrained and not untrained_nodes(plain)
    rebuilt = build_module(desc)
    opt = _step(rebuilt)
    without_grad = {n for n, p in rebuilt.named_parameters() if p.grad is None}
    assert without_grad and all(n.startswith(layer) for n in without_grad)
    assert len(opt.state) == len(list(rebuilt.parameters())) - len(without_grad)
    assert any(n.op == "call_module" and n.target == layer for n in rebuilt.graph.nodes)  # it runs forward
    f, p = network_features(desc), network_features(plain)
    extra = desc.params - plain.params
    assert extra > 0 and f.static["params"] - p.static["params"] == extra
    assert f.per_sample["flops_fwd"] > p.per_sample["flops_fwd"]
    visits = [v for v in walk(desc) if v.node.name in untrained]
    assert visits and all(not v.trained and not v.needs_grad for v in visits)
    assert all(v.cost.flops_bwd == v.cost.kernels_bwd == 0 and not v.cost.saved for v in visits)
    if kind != "gate":  # (the gated network's where is its own, trained)
        assert [f.per_sample["flops_bwd"], f.per_sample["saved_bytes"], f.static["kernels_bwd"]] == \
            [p.per_sample["flops_bwd"], p.per_sample["saved_bytes"], p.static["kernels_bwd"]]
    at = features_for(f, 4)
    assert np.isclose(at["param_copies_mb"] - features_for(p, 4)["param_copies_mb"], extra * 4 / MIB)


def test_the_step_s_kernels_leave_a_dead_branch_s_backward_and_update_out():
    """The kernel table: a dead convolution's forward GEMM and bias add, no input or weight gradient's GEMM, no bias
    gradient, no update of its two tensors."""
    live = describe(_Branches(), [3, 8, 8], "live")
    dead = describe(_Branches(dead=True), [3, 8, 8], "dead")
    a, b = kernel_table(live, "sgd"), kernel_table(dead, "sgd")
    assert b.param_tensors == a.param_tensors == 4
    assert b.launches == a.launches + 2  # the convolution's GEMM and its bias's add
    assert np.isclose(b.flops_ps.sum() - a.flops_ps.sum(), 2 * 8 * 8 * 16 * 8 * 9 + 8 * 8 * 16)
    update = optimizer_cost("sgd").kernels_per_tensor * 4
    assert np.isclose(b.bytes_fixed[-update:].sum(), a.bytes_fixed[-update:].sum())  # the same parameters updated


def test_a_layer_called_on_a_dropped_value_too_gets_one_gradient():
    """The head's linear layer called twice, its second output dropped: torch computes its weights' gradient once
    (no sum of two), and the optimiser updates them."""
    model = _Branches(shared=True)
    desc = describe(model, [3, 8, 8], "shared")
    assert [n.name for n in desc.nodes if "shares" in n.attrs] and untrained_nodes(desc)
    f, p = network_features(desc), network_features(describe(_Branches(), [3, 8, 8], "plain"))
    assert f.static["kernels_bwd"] == p.static["kernels_bwd"]  # no sum of the two calls' weight gradients
    assert f.static["params"] == p.static["params"]
    assert features_for(f, 4)["param_copies_mb"] == features_for(p, 4)["param_copies_mb"]
    assert kernel_table(desc, "sgd").launches == kernel_table(describe(_Branches(), [3, 8, 8], "p"), "sgd").launches \
        + 2  # the dropped call's multiply by 2 and its GEMM (addmm adds the bias; the bias row is its gradient's)
    rebuilt = build_module(desc)
    _step(rebuilt)
    assert all(p.grad is not None for p in rebuilt.parameters() if p.shape[0] == 10)


@pytest.mark.parametrize("kind", ["dead", "weight", "shared", "chain"])
def test_the_allocation_model_frees_a_dead_branch_as_the_trace_records_it(kind):
    """The allocation model left a network with a value nothing reads to the meta trace ("value 'b' is never used"):
    it drops such a value right after it is made (as torch.fx's code does), frees the branch's autograd nodes and
    what they keep once nothing refers to them, runs no backward of them, and the optimiser makes no state for
    their parameters: the trace's events, and the trace the real optimiser's run, over three steps. A dead branch
    with an op in place (a ReLU) is left to the trace, by name."""
    from perf4sight.errors import UserError
    from perf4sight.features.alloc_trace import record_events
    from test_allocator import _as_replayed

    desc = describe(_Branches(**{kind: True}), [3, 8, 8], kind)
    for setting in ({}, {"optimizer": "adam", "set_to_none": True}):
        if kind == "chain":
            with pytest.raises(UserError, match=r"an op in place in a dead branch \(c_2\)"):
                record_events(desc, 3, method="model", **setting)
        model = record_events(desc, 3, steps=3, method="auto" if kind == "chain" else "model", **setting)
        traced = record_events(desc, 3, steps=3, method="trace", **setting)
        assert _as_replayed(model) == _as_replayed(traced)
        assert _as_replayed(traced) == _as_replayed(record_events(desc, 3, steps=3, fast=False, **setting))


def test_the_two_reachabilities_differ_by_their_edges_alone():
    """``walk.unreached`` serves both: by gradient inputs (untrained_nodes) a where's condition is cut off, by reads
    (the allocation model's dead values) it is not, as the rebuilt module reads it; a dropped value is in both."""
    from perf4sight.features.alloc_model import _dead_nodes

    desc = describe(_Branches(dead=True, gate=True), [3, 8, 8], "both")
    assert untrained_nodes(desc) == {"b", "g"} and _dead_nodes(desc) == {"b"}
