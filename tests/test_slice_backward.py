"""A select's or a narrow's backward as torch runs it: a view forward, but backward ``select_backward`` or
``slice_backward`` writes zeros of the input's shape and copies the gradient into its slice (two kernels); a piece of
a split hands its gradient to the split's one cat instead, and a slice of a tensor that needs no gradient runs no
backward."""
from __future__ import annotations

import numpy as np
import pytest
import torch
from torch import nn

from perf4sight.features.aggregate import network_features
from perf4sight.features.formulas import BYTES_PER_ELEMENT
from perf4sight.features.latency_terms import kernel_table
from perf4sight.ir.from_torch import describe

SHAPE = [3, 8, 8]


class _Sliced(nn.Module):
    """A convolution, then ``kind``: "plain" (one channel out, no slice), "select" (``x[:, 0]`` of 8 channels),
    "narrow" (``x.narrow(1, 2, 1)`` of 8), "input" (``x[:, 0:1]`` of the network input, before the convolution);
    then a linear layer of the [1, 8, 8] map flattened."""

    def __init__(self, kind: str) -> None:
        super().__init__()
        self.kind = kind
        self.c = nn.Conv2d(1 if kind == "input" else 3, 1 if kind in ("plain", "input") else 8, 3, padding=1)
        self.fc = nn.Linear(64, 10)

    def forward(self, x):
        if self.kind == "input":
            x = x[:, 0:1]
        x = self.c(x)
        if self.kind == "select":
            x = x[:, 0]
        elif self.kind == "narrow":
            x = x.narrow(1, 2, 1)
        return self.fc(torch.flatten(x, 1))


_NOT_KERNELS = {"aten::view", "aten::t", "aten::transpose", "aten::expand", "aten::as_strided", "aten::select",
                "aten::slice", "aten::unsqueeze", "aten::squeeze", "aten::detach", "aten::empty",
                "aten::empty_strided", "aten::reshape", "aten::_reshape_alias", "aten::alias", "aten::resize_"}


def _backward_kernels(kind: str, ops: bool = False) -> list[str]:
    """The kernels (the profiler's innermost aten ops, views and empty tensors aside) of ``_Sliced(kind)``'s
    backward on a batch of 2, by name; ``ops``: every aten op it runs instead."""
    from torch.profiler import ProfilerActivity, profile

    torch.manual_seed(0)
    loss = _Sliced(kind)(torch.randn(2, *SHAPE)).sum()
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        loss.backward()
    return sorted(e.name for e in prof.events() if e.name.startswith("aten::")
                  and (ops or not e.cpu_children and e.name not in _NOT_KERNELS))


@pytest.fixture(scope="module")
def plain():
    return describe(_Sliced("plain"), SHAPE, "plain")


@pytest.mark.parametrize("kind", ["select", "narrow"])
def test_a_slice_s_backward_writes_zeros_and_copies_into_them(plain, kind):
    """torch runs two kernels more backward for the slice than without it (a zero_ and a copy_: select_backward's
    or slice_backward's); the features count them (they counted the slice a free view), and the kernel table lists
    them: zeros of the [8, 8, 8] input written, the [8, 8] gradient read and copied."""
    more = _backward_kernels(kind)
    base = _backward_kernels("plain")
    for name in base:
        more.remove(name)
    assert sorted(more) == ["aten::copy_", "aten::zero_"]
    desc = describe(_Sliced(kind), SHAPE, kind)
    assert kind in [n.op for n in desc.nodes]
    f, p = network_features(desc), network_features(plain)
    assert f.static["kernels_bwd"] - p.static["kernels_bwd"] == 2
    assert f.static["kernels_fwd"] == p.static["kernels_fwd"]
    a, b = kernel_table(plain, "sgd"), kernel_table(desc, "sgd")
    assert b.launches - a.launches == 2
    for moved in (8 * 64 * BYTES_PER_ELEMENT, 2 * 64 * BYTES_PER_ELEMENT):  # zeros written; the gradient copied
        rows = [(t.flops_ps == 0) & np.isclose(t.bytes_ps, moved) for t in (a, b)]
        assert rows[1].sum() - rows[0].sum() == 1


def test_a_slice_of_a_tensor_no_gradient_reaches_runs_no_backward(plain):
    """A slice of the network input (no gradient): torch runs no slice_backward, and the features count none."""
    ran = _backward_kernels("input", ops=True)
    assert "aten::convolution_backward" in ran and not any(name.endswith("_backward") and "slice" in name
                                                           for name in ran)
    desc = describe(_Sliced("input"), SHAPE, "input")
    assert "narrow" in [n.op for n in desc.nodes]
    assert network_features(desc).static["kernels_bwd"] == network_features(plain).static["kernels_bwd"]
    assert kernel_table(desc, "sgd").launches == kernel_table(plain, "sgd").launches


class _Unbound(nn.Module):
    """A convolution's 16 channels as two branches of 8 (``[N, 2, 8, H, W]``) taken apart by ``torch.unbind`` (SKNet's
    branches), multiplied; ``drop``: the second branch dropped (the first doubled)."""

    def __init__(self, drop: bool = False) -> None:
        super().__init__()
        self.drop = drop
        self.c, self.fc = nn.Conv2d(3, 16, 3, padding=1), nn.Linear(8, 10)

    def forward(self, x):
        a, b = self.c(x).reshape(x.shape[0], 2, 8, 8, 8).unbind(1)
        return self.fc((a * 2 if self.drop else a * b).mean((2, 3)))


def _as_selects(desc):
    """``desc`` with its unbind's pieces plain selects (no ``unbind``): as an older description, or picks."""
    from perf4sight.ir.schema import NetworkDescription

    d = desc.to_dict()
    for n in d["nodes"]:
        n["attrs"].pop("unbind", None)
    return NetworkDescription.from_dict(d)


@pytest.fixture(scope="module")
def unbound():
    return {drop: describe(_Unbound(drop), SHAPE, f"unbound{drop}") for drop in (False, True)}


@pytest.mark.parametrize("drop", [False, True])
def test_an_unbind_is_rebuilt_as_one_call_whose_backward_stacks_its_pieces_gradients(unbound, drop):
    """torch.unbind's pieces were described as plain selects, and the rebuilt network ran a select_backward each
    (zeros of the input's shape, a copy) and an add, where torch runs one stack (zeros first for a dropped piece);
    the pieces carry ``unbind`` now and are rebuilt as one unbind call: torch's ops, and the description read again
    from it is the same. The features count the stack (and the zeros), not two kernels a select and the adds."""
    from perf4sight.ir.to_torch import build_module
    from test_chunk_backward import _backward_ops

    desc = unbound[drop]
    assert [n.attrs for n in desc.nodes if n.op == "select"] == [{"dim": 1, "index": i, "unbind": True}
                                                                 for i in range(2)]
    ran = _backward_ops(build_module(desc))
    assert ran == _backward_ops(_Unbound(drop)) and ran.count("stack") == 1 and "select_backward" not in ran
    assert "select_backward" in _backward_ops(build_module(_as_selects(desc)))
    again = describe(build_module(desc, device="meta"), SHAPE, "again")
    assert [(n.op, n.attrs) for n in again.nodes] == [(n.op, n.attrs) for n in desc.nodes]
    stacked, picked = network_features(desc).static["kernels_bwd"], \
        network_features(_as_selects(desc)).static["kernels_bwd"]
    # two picks: 2 x (zeros, copy) and their add, against one stack; one: (zeros, copy) against (zeros, stack)
    assert picked - stacked == (0 if drop else 2 * 2 + 1 - 1)


def test_the_allocation_model_writes_down_an_unbind_s_stack_as_traced(unbound):
    """The pieces hand their gradients to the unbind's one node, which stacks them into the input's: the meta trace's
    events and the unfast trace's; a dropped piece (zeros in torch's stack) is left to the trace, by name."""
    from perf4sight.errors import UserError
    from perf4sight.features.alloc_trace import record_events
    from test_allocator import _as_replayed

    live, drop = unbound[False], unbound[True]
    model = record_events(live, 3, steps=2, method="model")
    assert _as_replayed(model) == _as_replayed(record_events(live, 3, steps=2, method="trace")) \
        == _as_replayed(record_events(live, 3, steps=2, fast=False))
    assert [size for _, _, size, op in model if op == "aten.stack.default"] == [3 * 16 * 64 * 4] * 2
    assert not any(op == "aten.select_backward.default" for _, _, _, op in model)
    with pytest.raises(UserError, match="a piece of a split that no gradient reaches"):
        record_events(drop, 3, method="model")
    assert _as_replayed(record_events(drop, 3, steps=2)) == _as_replayed(record_events(drop, 3, steps=2, fast=False))


@pytest.mark.parametrize("dim, index", [(-4, None), (1, -1), (-4, -1)])
def test_an_unbind_s_pieces_counted_from_the_end_cost_as_counted_from_the_start(unbound, dim, index):
    """A description file may give an unbind's dim, or a piece's index, from the end ([N, 2, 8, H, W]: dim -4 is 1,
    index -1 is 1), as the schema reads a select's: its backward is the same one stack, no piece missing. The dim
    from the end crashed the features (IndexError: the count read at dim - 1), the index from the end counted a
    piece missing (zeros of it in the stack)."""
    from perf4sight.features.walk import split_gathers, walk
    from perf4sight.ir.schema import NetworkDescription

    desc = unbound[False]
    d = desc.to_dict()
    for n in d["nodes"]:
        if n["op"] == "select":
            n["attrs"]["dim"] = dim
            if index is not None and n["attrs"]["index"] == 1:
                n["attrs"]["index"] = index
    ended = NetworkDescription.from_dict(d)
    assert split_gathers(walk(ended)) == split_gathers(walk(desc)) == [(2 * 8 * 8 * 8, 0.0, 0)]
    assert network_features(ended).static == network_features(desc).static


class _TakenApartTwice(nn.Module):
    """A convolution's [8, 8, 8] map taken apart twice alike (``how``: "unbind", ``y.unbind(1)``, or "chunk",
    ``y.chunk(2, 1)``), pieces of the two calls combined, then a linear layer of their mean over a dimension."""

    def __init__(self, how: str) -> None:
        super().__init__()
        self.how = how
        self.c, self.fc = nn.Conv2d(3, 8, 3, padding=1), nn.Linear(8 if how == "unbind" else 4, 10)

    def forward(self, x):
        y = self.c(x)
        if self.how == "unbind":
            a, b = y.unbind(1), y.unbind(1)
            return self.fc((a[0] * b[1] + a[2] * b[3]).mean(2))
        a, b = y.chunk(2, 1), y.chunk(2, 1)
        return self.fc((a[0] * b[1] + a[1] * b[0]).mean((2, 3)))


@pytest.mark.parametrize("how, gather", [("unbind", "stack"), ("chunk", "cat")])
def test_a_tensor_taken_apart_twice_alike_is_rebuilt_as_two_calls(how, gather):
    """Two unbinds (or chunks) of one tensor were rebuilt as one call (their pieces' key was the input and dim), where
    torch runs two, each backward its own stack (cat): the second call's pieces carry ``call`` (its number, 1), the
    first's nothing (as before), and the rebuilt network runs torch's ops, two stacks; described again the same. The
    features count the second gather, and the description without the attr reads as one call, as before. A ``call``
    not a positive integer, or on a plain select, is refused in one line."""
    from perf4sight.errors import UserError
    from perf4sight.ir.schema import NetworkDescription
    from perf4sight.ir.to_torch import build_module
    from test_chunk_backward import _backward_ops

    module = _TakenApartTwice(how)
    desc = NetworkDescription.from_dict(describe(module, SHAPE, "twice").to_dict())
    pieces = [n for n in desc.nodes if n.op in ("select", "narrow")]
    calls = [n.attrs.get("call") for n in pieces]
    assert len(pieces) == 4 and calls[0] is None and sorted(calls, key=str) == [1, 1, None, None]
    ran = _backward_ops(build_module(desc))
    assert ran == _backward_ops(module) and ran.count(gather) == 2
    again = describe(build_module(desc, device="meta"), SHAPE, "again")
    assert [(n.op, n.attrs) for n in again.nodes] == [(n.op, n.attrs) for n in desc.nodes]
    d = desc.to_dict()
    for n in d["nodes"]:
        n["attrs"].pop("call", None)
    merged = NetworkDescription.from_dict(d)
    merged_ran = _backward_ops(build_module(merged))
    assert merged_ran.count(gather) == 1
    # as many kernels more as torch runs more: the unbinds' second stack and zeros; the chunks' second cat, where the
    # merged call's pieces read twice (a[0] and b[0]) add their gradients instead (walk.gradient_accumulations)
    more = network_features(desc).static["kernels_bwd"] - network_features(merged).static["kernels_bwd"]
    assert more == len(ran) - len(merged_ran) == {"unbind": 10, "chunk": 0}[how]
    for value, words in [(0, "attr 'call' must be a positive integer, got 0"), ("b", "must be a positive integer")]:
        d["nodes"][3]["attrs"]["call"] = value
        with pytest.raises(UserError, match=f"^x: node '{pieces[1].name}' .*{words}"):
            NetworkDescription.from_dict(d, "x")
    d["nodes"][3]["attrs"] = {"dim": 1, "index": 0, "call": 1} if how == "unbind" else {"dim": 1, "start": 0,
                                                                                       "length": 4, "call": 1}
    with pytest.raises(UserError, match="attr 'call' is for a piece of a split"):
        NetworkDescription.from_dict(d, "x")


class _StackedPieces(nn.Module):
    """A convolution's 16 channels as four pieces of 4 (``[N, 4, 4, H, W]``) taken apart by ``torch.unbind(1)`` (or
    ``chunk(4, 1)``, pieces of [1, 4, H, W]), then stacked again by ``how``: the tuple itself or a slice of it (what
    a description can say: a stack of those pieces), or as a list (the spelling described before)."""

    def __init__(self, how: str, chunk: bool = False) -> None:
        super().__init__()
        self.how, self.chunk = how, chunk
        self.c, self.fc = nn.Conv2d(3, 16, 3, padding=1), nn.Linear(1, 10)

    def forward(self, x):
        y = self.c(x).reshape(x.shape[0], 4, 4, 8, 8)
        p = y.chunk(4, 1) if self.chunk else y.unbind(1)
        s = {"whole at 3": lambda: torch.stack(p, 3), "first two at 1": lambda: torch.stack(p[:2], 1),
             "reversed at -1": lambda: torch.stack(p[::-1], -1), "odd at 2": lambda: torch.stack(p[1::2], 2),
             "whole at 2, then the second": lambda: torch.stack(p, 2) + p[1].unsqueeze(2),
             "listed": lambda: torch.stack([p[0], p[1]], 1), "reversed at 0": lambda: torch.stack(p[::-1])}[self.how]()
        return self.fc(torch.flatten(torch.sigmoid(s), 1).mean(1, keepdim=True))


def _step_ops(model: nn.Module, x: torch.Tensor) -> tuple[list[str], list[str]]:
    """The aten ops of ``model``'s forward and of its backward of ``x`` (views and empty tensors left out)."""
    from torch.utils._python_dispatch import TorchDispatchMode

    views = {"view", "_unsafe_view", "_reshape_alias", "slice", "select", "unbind", "split", "split_with_sizes",
             "as_strided", "detach", "alias", "t", "expand", "squeeze", "unsqueeze", "ones_like", "empty_like",
             "new_empty", "new_empty_strided"}

    class Ops(TorchDispatchMode):
        def __init__(self):
            super().__init__()
            self.seen: list[str] = []

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            name = func.__name__.split(".")[0]
            if name not in views:
                self.seen.append(name)
            return func(*args, **(kwargs or {}))

    with Ops() as fwd:
        out = model(x).sum()
    with Ops() as bwd:
        out.backward()
    return fwd.seen, bwd.seen


_STACKED = [("whole at 3", False), ("first two at 1", False), ("reversed at -1", False), ("odd at 2", False),
            ("whole at 2, then the second", False), ("reversed at -1", True), ("first two at 1", True)]


@pytest.fixture(scope="module")
def stacked():
    return {key: describe(_StackedPieces(*key), SHAPE, "stacked") for key in _STACKED + [("listed", False)]}


@pytest.mark.parametrize("how, chunk", _STACKED)
def test_a_stack_of_an_unbind_s_or_chunk_s_pieces_is_described_as_torch_runs_it(stacked, how, chunk):
    """``torch.stack(p, 3)``, ``torch.stack(p[:2], 1)``, ``torch.stack(p[::-1], -1)``, ``torch.stack(p[1::2], 2)`` of
    an unbind's (or a chunk's) tuple ``p`` (and ``p[1]`` read after the stack: the stack's piece, one node) were
    refused ("a stack of anything but a list of tensors"): they are the
    pieces taken (selects of ``unbind``, narrows of ``split_sizes``), each unsqueezed, concatenated. The rebuilt module
    computes the module's outputs and gradients and runs its ops forward and backward (one stack each way: the pieces'
    gradients stacked, or concatenated, with zeros for the pieces not taken); what it keeps for backward is
    autograd's; a slice of the first two is described as the list of them is."""
    from perf4sight.ir.to_torch import build_module
    from test_features import _autograd_saved_bytes

    module, desc = _StackedPieces(how, chunk), stacked[(how, chunk)]
    taken = [n.attrs["index"] if n.op == "select" else n.attrs["start"] for n in desc.nodes
             if n.op in ("select", "narrow")]
    assert taken == {"whole at 3": [0, 1, 2, 3], "first two at 1": [0, 1], "reversed at -1": [3, 2, 1, 0],
                     "odd at 2": [1, 3], "whole at 2, then the second": [0, 1, 2, 3]}[how]  # read again: one node
    assert all(n.attrs.get("unbind") or n.attrs.get("split_sizes") == [1] * 4 for n in desc.nodes
               if n.op in ("select", "narrow"))
    rebuilt = build_module(desc)
    rebuilt.load_state_dict(module.state_dict())
    x = torch.randn(2, *SHAPE)
    assert torch.allclose(rebuilt(x), module(x), atol=1e-6)
    theirs, mine = _step_ops(module, x), _step_ops(rebuilt, x)
    stack = theirs[0].index("stack")  # torch's one kernel, a concatenation of the pieces viewed unsqueezed: a cat
    assert mine == ([*theirs[0][:stack], "cat", *theirs[0][stack + 1:]], theirs[1]) and "stack" not in mine[0]
    assert theirs[1].count("cat" if chunk else "stack") == 1
    for a, b in zip(module.parameters(), rebuilt.parameters()):
        assert torch.allclose(a.grad, b.grad, atol=1e-6)
    nf = network_features(desc)
    at2, at4 = 2 * _autograd_saved_bytes(desc, 2), 4 * _autograd_saved_bytes(desc, 4)  # the network's, the loss's aside
    assert nf.per_sample["saved_bytes"] + nf.per_sample["input_bytes"] == (at4 - at2) / 2
    if (how, chunk) == ("first two at 1", False):
        listed = stacked[("listed", False)]
        assert [(n.op, n.attrs) for n in desc.nodes] == [(n.op, n.attrs) for n in listed.nodes]
        assert network_features(listed).static == nf.static


def test_the_allocation_model_writes_down_a_stack_of_every_piece_and_leaves_a_slice_to_the_trace(stacked):
    """A stack of every piece of the unbind (in any order; a piece read again after it): the allocation model's events
    are the meta trace's and the unfast trace's; a stack of some of them (zeros of the others in torch's backward
    stack) is left to the trace, whose events are the unfast trace's."""
    from perf4sight.errors import UserError
    from perf4sight.features.alloc_trace import record_events
    from test_allocator import _as_replayed

    for key in (("whole at 3", False), ("reversed at -1", False), ("whole at 2, then the second", False)):
        desc = stacked[key]
        model = record_events(desc, 3, steps=2, method="model")
        assert _as_replayed(model) == _as_replayed(record_events(desc, 3, steps=2, method="trace")) \
            == _as_replayed(record_events(desc, 3, steps=2, fast=False))
    part = stacked[("first two at 1", False)]
    with pytest.raises(UserError, match="does not cover a split whose parts' gradients do not all arrive"):
        record_events(part, 3, method="model")
    assert _as_replayed(record_events(part, 3, steps=2)) == _as_replayed(record_events(part, 3, steps=2, fast=False))


def test_a_stack_of_an_unbind_s_pieces_along_the_batch_is_refused_in_one_line():
    """``torch.stack(p[::-1])`` stacks along dimension 0, which puts the pieces before the batch: refused, naming
    that; a stack of a module's tuple (no pieces a description follows) still says what a stack may take."""
    from perf4sight.errors import UserError

    with pytest.raises(UserError, match=r"^stacked: cannot describe node stack \(ValueError: a stack along the batch "
                                        r"dimension \(dim 0\) has no description op\)$"):
        describe(_StackedPieces("reversed at 0"), SHAPE, "stacked")
