"""A chunk's or a split's pieces: narrows of ``split_sizes`` in the description, rebuilt as one ``torch.split`` call,
whose backward is torch's (zeros for a piece no gradient reaches, one ``cat``), not a narrow's each (its gradient
written into zeros of the input's shape, the pieces' gradients added up)."""
from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from torch import nn
from torch.utils._python_dispatch import TorchDispatchMode

from perf4sight.errors import UserError
from perf4sight.features.aggregate import network_features
from perf4sight.features.alloc_trace import record_events
from perf4sight.features.latency_terms import kernel_table
from perf4sight.ir.from_torch import describe
from perf4sight.ir.schema import NetworkDescription
from perf4sight.ir.to_torch import build_module
from test_allocator import _as_replayed


class _Pieces(nn.Module):
    """A convolution's channels taken apart: ``chunk`` (two halves), ``split`` (of sizes 2 and 6), ``three`` (a chunk
    of three, the last two concatenated), ``half`` (a chunk whose second half is dropped), ``dead`` (a chunk whose
    second half only a dead branch reads: ``self.c(q)``, dropped), each through a layer of its own, concatenated."""

    def __init__(self, how: str) -> None:
        super().__init__()
        self.how = how
        self.a = nn.Conv2d(3, 9 if how == "three" else 8, 3, padding=1)
        self.b = nn.Conv2d(3 if how == "three" else 2 if how == "split" else 4, 4, 1)
        self.c = nn.Conv2d(6 if how in ("three", "split") else 4, 4, 1)
        self.fc = nn.Linear(4 if how in ("half", "dead") else 8, 10)

    def forward(self, x):
        x = self.a(x)
        if self.how == "split":
            p, q = torch.split(x, [2, 6], 1)
        elif self.how == "three":
            p, q, r = x.chunk(3, 1)
            q = torch.cat([q, r], 1)
        else:
            p, q = x.chunk(2, 1)
        if self.how == "dead":
            self.c(q)
        y = self.b(p) if self.how in ("half", "dead") else torch.cat([self.b(p), self.c(q)], 1)
        return self.fc(y.mean((2, 3)))


def _backward_ops(model: nn.Module) -> list[str]:
    """The aten ops of ``model``'s backward of a batch of 2 (views and empty tensors left out)."""
    class Ops(TorchDispatchMode):
        seen: list[str] = []

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            name = func.__name__.split(".")[0]
            if name not in ("slice", "as_strided", "detach", "new_empty", "new_empty_strided", "alias", "view", "t",
                            "expand", "squeeze", "unsqueeze", "ones_like"):
                self.seen.append(name)
            return func(*args, **(kwargs or {}))

    out = model(torch.randn(2, 3, 8, 8)).sum()
    Ops.seen = []
    with Ops():
        out.backward()
    return list(Ops.seen)


@pytest.fixture(scope="module")
def described():
    return {how: describe(_Pieces(how), [3, 8, 8], how) for how in ("chunk", "split", "three", "half")}


@pytest.mark.parametrize("how", ["chunk", "split", "three", "half"])
def test_a_chunk_is_rebuilt_as_one_split_that_runs_torch_s_backward(described, how):
    """The rebuilt network ran two slice_backwards (each its zeros and a copy) and an add where torch runs one cat
    (a dropped piece's zeros first): now the same ops, and the description read again from it is the same."""
    desc = described[how]
    pieces = [n for n in desc.nodes if n.op == "narrow"]
    sizes = {"chunk": [4, 4], "split": [2, 6], "three": [3, 3, 3], "half": [4, 4]}[how]
    assert pieces and all(n.attrs["split_sizes"] == sizes for n in pieces)
    rebuilt = build_module(desc)
    assert sum(n.target is torch.split for n in rebuilt.graph.nodes) == 1
    ran = _backward_ops(rebuilt)
    assert ran == _backward_ops(_Pieces(how)) and "slice_backward" not in ran
    assert ran.count("cat") == 1 and ran.count("zeros") == (how == "half")  # (the forward cat's backward: views)
    again = describe(build_module(desc, device="meta"), [3, 8, 8], how)
    assert [(n.op, n.attrs) for n in again.nodes] == [(n.op, n.attrs) for n in desc.nodes]


@pytest.mark.parametrize("how", ["chunk", "split", "three"])
def test_the_allocation_model_writes_down_a_split_s_backward_as_traced(described, how):
    """The allocation model hands each piece's gradient to the split's one node, which allocates the input's
    gradient (cat) once all have arrived: the meta trace's events, and the trace the real optimiser's run."""
    desc = described[how]
    model, traced = record_events(desc, 3, steps=2, method="model"), record_events(desc, 3, steps=2, method="trace")
    assert _as_replayed(model) == _as_replayed(traced) == _as_replayed(record_events(desc, 3, steps=2, fast=False))
    assert not any("slice_backward" in op for _, _, _, op in traced)


def _as_narrows(desc: NetworkDescription) -> NetworkDescription:
    """``desc`` with its pieces narrows of their own (no ``split_sizes``): as an older description, or slices."""
    d = desc.to_dict()
    for n in d["nodes"]:
        n["attrs"].pop("split_sizes", None)
    return NetworkDescription.from_dict(d)


def test_a_split_s_backward_costs_a_cat_and_a_dropped_piece_s_zeros(described):
    """The features: a split's pieces read its input once for the gradient (one cat: the pieces' gradients read, the
    input's written), not an add per piece after the first (three passes); of a dropped piece, its zeros too.
    Slices of a tensor (narrows without split_sizes) keep their adds, and each its slice_backward (zeros of the
    input's shape, the piece's gradient copied into them: two kernels, one input-sized and two piece-sized passes)."""
    three, half = described["three"], described["half"]
    elems = 9 * 8 * 8
    f, slices = network_features(three), network_features(_as_narrows(three))
    assert f.static["kernels_bwd"] == slices.static["kernels_bwd"] - 2 - 3 * 2 + 1
    a, b = kernel_table(three, "sgd"), kernel_table(_as_narrows(three), "sgd")
    assert a.launches == b.launches - 2 - 3 * 2 + 1
    assert np.isclose(b.bytes_ps.sum() - a.bytes_ps.sum(), (2 * 3 - 2 + 3 * (1 + 2 / 3)) * elems * 4)
    h, h_slices = network_features(half), network_features(_as_narrows(half))
    # the dropped half's zeros and the cat, against the kept half's slice_backward (zeros and a copy)
    assert h.static["kernels_bwd"] == h_slices.static["kernels_bwd"]
    assert np.isclose(kernel_table(half, "sgd").bytes_ps.sum() - kernel_table(_as_narrows(half), "sgd").bytes_ps.sum(),
                      (elems // 9 * 8 // 2) * 4)


@pytest.mark.parametrize("sizes, match", [([4, 3], "do not add up to its dimension's size 8"),
                                          ([2, 6], "has no piece of length 4 at 0"),
                                          ([4, 0, 4], "a non-empty list of positive integers")])
def test_a_piece_of_split_sizes_that_do_not_fit_is_refused_by_name(described, sizes, match):
    d = described["chunk"].to_dict()
    d["nodes"][[n["op"] for n in d["nodes"]].index("narrow")]["attrs"]["split_sizes"] = sizes
    with pytest.raises(UserError, match=match):
        NetworkDescription.from_dict(d)


@pytest.mark.parametrize("how", ["half", "dead"])
def test_a_split_with_a_dropped_piece_is_left_to_the_trace_which_fills_its_gradient_with_zeros(described, how):
    """A chunk whose second half is dropped, or read by a dead branch alone: torch's split backward fills that
    half's gradient with zeros before its cat; the allocation model leaves it to the meta trace, by name, whose
    events are the real optimiser's run. The features count the zeros and the cat alike (the dead branch's
    convolution runs no backward)."""
    desc = described[how] if how in described else describe(_Pieces(how), [3, 8, 8], how)
    with pytest.raises(UserError, match="a piece of a split that no gradient reaches"):
        record_events(desc, 3, method="model")
    traced = record_events(desc, 3, steps=2)
    assert _as_replayed(traced) == _as_replayed(record_events(desc, 3, steps=2, fast=False))
    assert sum(op == "aten.zeros.default" and size == 3 * 4 * 8 * 8 * 4 for _, _, size, op in traced) == 2
    assert network_features(desc).static["kernels_bwd"] == network_features(described["half"]).static["kernels_bwd"]


def test_a_chunk_of_the_map_fixed_by_its_sizes_is_refused_at_another_input_shape():
    """Halves of a map's height, described at 8 x 8 and asked at 16 x 16: rebuilt as narrows, the description read
    again took the first 4 and the next 4 rows of 16 (another network, said nothing); the split of sizes [4, 4]
    refuses to run there, and the line says to describe the module at that shape."""
    from perf4sight.networks.reshape import described_at

    class Rows(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.a, self.fc = nn.Conv2d(3, 4, 3, padding=1), nn.Linear(4, 10)

        def forward(self, x):
            p, q = self.a(x).chunk(2, 2)
            return self.fc((p * q).mean((2, 3)))

    desc = describe(Rows(), [3, 8, 8], "rows")
    with pytest.raises(UserError, match=r"split_sizes=\[4, 4\].*describe the network at that shape from its module"):
        described_at(desc, [3, 16, 16])


def test_a_split_of_a_map_named_unbind_is_a_split(described):
    """The features key an unbind's pieces apart from a split's: a split whose input is called ``unbind`` (a user's
    layer of that name) is costed as the same split under another name."""
    d = json.loads(json.dumps(described["three"].to_dict()).replace('"a"', '"unbind"'))
    renamed = NetworkDescription.from_dict(d)
    assert "unbind" in [n.name for n in renamed.nodes]
    assert network_features(renamed).static == network_features(described["three"]).static


class _PieceTwice(nn.Module):
    """A map's channels taken apart (a chunk of four, or an unbind) and put back together with some pieces read
    twice and others not at all: ``twice`` indexes the call's tuple again for each read (``p[0]`` twice, ``p[0]``
    and ``p[-8]``: two fx nodes of one piece), ``once`` reads each piece's one node twice."""

    def __init__(self, how: str, reads: str) -> None:
        super().__init__()
        self.how, self.reads = how, reads
        self.a, self.fc = nn.Conv2d(3, 8, 3, padding=1), nn.Linear(8, 10)

    def forward(self, x):
        x = self.a(x)
        if self.how == "chunk":
            p = x.chunk(4, 1)
            picks = [p[i % 2] for i in range(4)] if self.reads == "twice" else [p[0], p[1]] * 2
            y = torch.cat(picks, 1)
        else:
            p = x.unbind(1)
            picks = [p[i] for i in range(4)] + [p[i - 8] for i in range(4)] if self.reads == "twice" else \
                [p[i] for i in range(4)] * 2
            y = torch.stack(picks, 1)
        return self.fc(y.mean((2, 3)))


@pytest.mark.parametrize("how", ["chunk", "unbind"])
def test_a_piece_read_by_two_nodes_has_its_gradients_added_as_torch_adds_them(how):
    """Two nodes of one piece of a split or unbind (``p[0]`` indexed twice, or ``p[0]`` and ``p[-8]``) are one tensor
    in torch, whose two gradients are added before the call's cat or stack: the features counted no add (2 kernels
    fewer for the chunk, 4 for the unbind, than the same network reading each piece's one node twice, whose backward
    torch runs alike), and the allocation model let both gradients arrive as two pieces' (the unread pieces' zeros
    and the adds left out: 92 events against the trace's 108 and 124). Now the kernels are those of the one-node
    network, and the allocation model leaves the network to the meta trace."""
    twice, once = _PieceTwice(how, "twice"), _PieceTwice(how, "once")
    ran = _backward_ops(twice)
    assert ran == _backward_ops(once) and ran.count("add") == {"chunk": 2, "unbind": 4}[how]
    d_twice, d_once = describe(twice, [3, 8, 8], "twice"), describe(once, [3, 8, 8], "once")
    assert len([n for n in d_twice.nodes if n.op in ("narrow", "select")]) == {"chunk": 4, "unbind": 8}[how]
    assert network_features(d_twice).static["kernels_bwd"] == network_features(d_once).static["kernels_bwd"]
    assert kernel_table(d_twice, "sgd").launches == kernel_table(d_once, "sgd").launches
    with pytest.raises(UserError, match="a piece of a split or unbind taken twice"):
        record_events(d_twice, 3, method="model")
    assert _as_replayed(record_events(d_twice, 3, steps=2)) == _as_replayed(
        record_events(d_twice, 3, steps=2, method="trace"))
