"""A layer with parameters called more than once in one forward (CBAM's shared MLP, a block applied three times, a
Siamese head): each call a node, the later ones naming the first as the owner of the parameters (``shares``)."""
from __future__ import annotations

import copy

import numpy as np
import pytest
import torch
from torch import nn

from perf4sight.errors import UserError
from perf4sight.features.aggregate import network_features
from perf4sight.features.alloc_trace import record_events
from perf4sight.fingerprint.gnn_graph import graph_template
from perf4sight.ir.from_torch import describe
from perf4sight.ir.schema import NetworkDescription, count_params
from perf4sight.ir.to_torch import build_module
from perf4sight.networks.pruning import PruningPlan, prune_model
from test_allocator import _as_replayed


class _ChannelAttention(nn.Module):
    """CBAM's channel attention: the average- and the max-pooled descriptors through one MLP, summed, a gate."""

    def __init__(self) -> None:
        super().__init__()
        self.stem = nn.Conv2d(3, 16, 3, padding=1)
        self.mlp = nn.Sequential(nn.Conv2d(16, 4, 1), nn.ReLU(), nn.Conv2d(4, 16, 1))
        self.fc = nn.Linear(16, 10)

    def forward(self, x):
        x = self.stem(x)
        gate = torch.sigmoid(self.mlp(nn.functional.adaptive_avg_pool2d(x, 1))
                             + self.mlp(nn.functional.adaptive_max_pool2d(x, 1)))
        return self.fc((x * gate).mean((2, 3)))


class _Recurrent(nn.Module):
    """A block (conv, batch norm, ReLU) applied three times, then a linear layer applied twice (weight-tied)."""

    def __init__(self) -> None:
        super().__init__()
        self.block = nn.Sequential(nn.Conv2d(8, 8, 3, padding=1), nn.BatchNorm2d(8), nn.ReLU())
        self.stem, self.head, self.fc = nn.Conv2d(3, 8, 3, padding=1), nn.Linear(8, 8), nn.Linear(8, 10)

    def forward(self, x):
        x = self.stem(x)
        for _ in range(3):
            x = self.block(x)
        return self.fc(self.head(self.head(x.mean((2, 3)))))


def _unshared(desc: NetworkDescription) -> NetworkDescription:
    """``desc`` with every call a layer of its own (no ``shares``): the description such a network got before."""
    d = desc.to_dict()
    for n in d["nodes"]:
        n["attrs"].pop("shares", None)
    d.pop("params")
    return NetworkDescription.from_dict(d)


def test_a_layer_called_twice_is_one_layer_counted_once_and_rebuilt_as_one_module():
    """CBAM's shared MLP was refused ("layer 'mlp.0' is called 2 times"): each call is a node now, the second naming
    the first (``shares``), the parameters counted once, and the rebuilt network calls one module twice, computing
    the original's outputs with its weights."""
    original = _ChannelAttention().eval()
    desc = NetworkDescription.from_dict(describe(original, [3, 32, 32], "cbam").to_dict())
    assert {n.name: n.attrs["shares"] for n in desc.nodes if "shares" in n.attrs} == {"mlp_3": "mlp_0",
                                                                                      "mlp_5": "mlp_2"}
    mlp = 16 * 4 + 4 + 4 * 16 + 16
    assert desc.params == sum(p.numel() for p in original.parameters()) == 3 * 16 * 9 + 16 + mlp + 16 * 10 + 10
    assert _unshared(desc).params == desc.params + mlp  # what each call's own weights would be
    rebuilt = build_module(desc).eval()
    assert sum(p.numel() for p in rebuilt.parameters()) == desc.params
    assert sum(n.op == "call_module" and n.target == "mlp_0" for n in rebuilt.graph.nodes) == 2
    rebuilt.load_state_dict(dict(zip(rebuilt.state_dict(), original.state_dict().values())))
    x = torch.randn(3, 3, 32, 32)
    assert torch.allclose(rebuilt(x), original(x), atol=1e-6)
    recurrent = _Recurrent()
    again = describe(recurrent, [3, 16, 16], "recurrent")
    assert again.params == sum(p.numel() for p in recurrent.parameters()) == count_params(again)
    assert sum("shares" in n.attrs for n in again.nodes) == 2 * 2 + 1  # conv and norm of the 2nd and 3rd, head


def test_a_shared_layer_is_named_and_checked():
    """``shares`` names an earlier node of the same op and attrs that shares nothing itself; anything else is refused
    by name, and a description without it loads as before."""
    d = describe(_ChannelAttention(), [3, 32, 32], "cbam").to_dict()
    d.pop("params")

    def load_with(name: str, **change) -> NetworkDescription:
        e = copy.deepcopy(d)
        node = next(n for n in e["nodes"] if n["name"] == name)
        node["attrs"].update(change)
        return NetworkDescription.from_dict(e, "cbam")

    cases = [("mlp_3", {"shares": "nowhere"}, r"attr 'shares' must name an earlier node, got 'nowhere'"),
             ("mlp_0", {"shares": "mlp_3"}, r"attr 'shares' must name an earlier node, got 'mlp_3'"),
             ("mlp_3", {"shares": "mlp_2"}, r"which differs from this node"),
             ("mlp_5", {"shares": "mlp_3"}, r"names 'mlp_3', which shares the parameters of 'mlp_0': name it"),
             ("mlp_3", {"shares": None}, r"attr 'shares' must name an earlier node, got None"),
             ("mlp_1", {"shares": "mlp_0"}, r"unknown attr 'shares'")]
    for name, change, message in cases:
        with pytest.raises(UserError, match=rf"^cbam: node '{name}' \(\w+\): .*{message}"):
            load_with(name, **change)
    assert load_with("mlp_3").params == 766
    assert _unshared(NetworkDescription.from_dict(d)).structure != NetworkDescription.from_dict(d).structure


def test_a_shared_layer_is_looked_up_among_the_earlier_nodes_kept_once(monkeypatch):
    """from_dict looks up the owner a node ``shares`` among the nodes before it in one index it grows node by node
    (it made a dict of all of them for every node: quadratic, 28 ms of a 1,100-node EfficientNet-V2-L's reading);
    each check still sees exactly the nodes before it."""
    from perf4sight.ir import schema
    d = describe(_ChannelAttention(), [3, 32, 32], "cbam").to_dict()
    seen: list[tuple[dict, list[str]]] = []  # each index itself kept (no id reused)
    check = schema._sharing_problem
    monkeypatch.setattr(schema, "_sharing_problem",
                        lambda node, earlier: seen.append((earlier, list(earlier))) or check(node, earlier))
    desc = NetworkDescription.from_dict(d, "cbam")
    names = [n.name for n in desc.nodes]
    assert [before for _, before in seen] == [names[:i] for i in range(len(names))]
    assert all(index is seen[0][0] for index, _ in seen) and any(schema.SHARES in n.attrs for n in desc.nodes)


def test_features_count_each_call_and_the_parameters_once():
    """Every call's FLOPs, bytes and saved tensors are counted, the parameters (and so their gradients and optimiser
    state) once, and a backward kernel more per later call and parameter tensor (the sum of its gradients); the GNN's
    node of a later call holds no parameters (its first call's node does)."""
    desc = describe(_Recurrent(), [3, 16, 16], "recurrent")
    shared, unshared = network_features(desc), network_features(_unshared(desc))
    assert shared.static["params"] == desc.params < unshared.static["params"]
    assert shared.static["param_tensors"] == unshared.static["param_tensors"] - 2 * 4 - 2
    assert shared.per_sample["flops_fwd"] == unshared.per_sample["flops_fwd"] > 0
    assert shared.per_sample["flops_bwd"] == unshared.per_sample["flops_bwd"]
    # each later call's gradient of each parameter tensor summed into the one before: an add (as the kernel table's)
    assert shared.static["kernels_bwd"] == unshared.static["kernels_bwd"] + 2 * 4 + 2
    params_column = graph_template(desc).x[:, -5]  # log1p(params), costs' 8th of 12 (the last five after it)
    names = [n.name for n in desc.nodes]
    assert params_column[names.index("head")] > 0 and params_column[names.index("head_1")] == 0


def test_the_perf4sight_set_counts_each_call_and_the_weights_once():
    """The perf4sight-conv baseline counted a layer called three times (a block) or twice (a linear layer) with its
    weight bytes per call; the weights exist once (4 bytes a weight, biases aside), each call's work and traffic
    counted as before."""
    from perf4sight.features.perf4sight_set import PERF4SIGHT_FEATURES, perf4sight_vectors

    desc = describe(_Recurrent(), [3, 16, 16], "recurrent")
    (static, scaled), (static_u, scaled_u) = perf4sight_vectors(desc), perf4sight_vectors(_unshared(desc))
    column = dict(zip(PERF4SIGHT_FEATURES, static))
    assert column["conv_weight_bytes"] == 4 * (3 * 8 * 9 + 8 * 8 * 9)  # the stem and the block's convolution
    assert column["fc_weight_bytes"] == 4 * (8 * 8 + 8 * 10)  # the head and the classifier
    assert column["n_conv"] == 4 and np.array_equal(scaled, scaled_u)
    weights = [PERF4SIGHT_FEATURES.index(k) for k in ("conv_weight_bytes", "fc_weight_bytes")]
    others = [i for i in range(len(static)) if i not in weights]
    assert np.array_equal(static[others], static_u[others])
    per_call = [column["conv_weight_bytes"] + 2 * 4 * 8 * 8 * 9, column["fc_weight_bytes"] + 4 * 8 * 8]
    assert static_u[weights].tolist() == per_call  # the block's two later calls, the head's one


def test_a_later_calls_weight_gradients_are_summed_once_a_step_and_updated_once():
    """The step's kernels: each later call sums its gradient of each parameter tensor into the earlier one (an add of
    the tensor's bytes, three passes, whatever the batch), and the optimiser updates the layer's tensors once; the
    calls' own kernels are those of layers of their own."""
    from perf4sight.features.latency_terms import BANDWIDTH, kernel_table
    from perf4sight.features.optimizers import optimizer_cost

    desc = describe(_Recurrent(), [3, 16, 16], "recurrent")
    shared, unshared = kernel_table(desc, "sgd"), kernel_table(_unshared(desc), "sgd")
    per_tensor = optimizer_cost("sgd").kernels_per_tensor
    assert unshared.param_tensors - shared.param_tensors == 2 * 4 + 2  # the block's 2nd and 3rd calls', head's 2nd
    assert len(shared.kind) == len(unshared.kind) - per_tensor * (2 * 4 + 2) + (2 * 4 + 2)
    updates = per_tensor * shared.param_tensors  # the optimiser's kernels come last, the sums right before them
    sums = slice(len(shared.kind) - updates - (2 * 4 + 2), len(shared.kind) - updates)
    assert (shared.kind[sums] == BANDWIDTH).all()
    assert not shared.bytes_ps[sums].any() and not shared.flops_ps[sums].any()
    summed = 2 * (8 * 8 * 9 + 8 + 2 * 8) + (8 * 8 + 8)  # parameters summed: the block's twice, the head's once
    assert np.isclose(shared.bytes_fixed[sums].sum(), 3 * 4 * summed)


def test_the_allocation_model_writes_down_a_shared_layers_gradients_as_the_trace_records_them():
    """torch sums a shared weight's gradients (one per call) out of place before its AccumulateGrad runs, the later
    call's kept until the earlier call's arrives: the model writes down those events, one parameter set in the
    setup, and matches the meta trace event for event (and the trace the real optimizer's run)."""
    desc = describe(_Recurrent(), [3, 16, 16], "recurrent")
    model, traced = record_events(desc, 3, steps=3, method="model"), record_events(desc, 3, steps=3, method="trace")
    assert _as_replayed(model) == _as_replayed(traced)
    assert _as_replayed(traced) == _as_replayed(record_events(desc, 3, steps=3, fast=False))
    setup = [e for e in model if e[3] == "setup"]
    assert len(setup) == 2 + 4 + 3 + 2 + 2  # stem, the block's conv and norm (and its 3 buffers), head, fc
    sums = [e for e in model[:len(model) // 3] if e[3] == "aten.add.Tensor" and e[2] in (8 * 8 * 9 * 4, 8 * 4)]
    assert len(sums) >= 2 * 2  # the block's conv weight and bias, each summed over three calls


@pytest.mark.parametrize("level", [20, 37])
def test_a_network_with_a_shared_layer_prunes_and_runs(level):
    """torch-pruning prunes a layer called twice once, for both calls: the pruned network (the user's and the one
    rebuilt from its description) runs and is described with the shared layer counted once."""
    original = _ChannelAttention()
    for base in (original, build_module(describe(original, [3, 32, 32], "cbam"))):
        pruned = prune_model(base, [3, 32, 32], level, network="cbam")
        out = pruned.module(torch.randn(2, 3, 32, 32))
        again = describe(pruned.module, [3, 32, 32], "cbam_pruned")
        assert list(out.shape) == [2, 10] and np.isclose(pruned.achieved_level, level, atol=2)
        assert again.params == pruned.params == sum(p.numel() for p in pruned.module.parameters())
        assert again.node("mlp_5").attrs["shares"] == "mlp_2" and again.node("mlp_2").attrs["out_channels"] < 16


def test_a_shared_layer_survives_the_perfseer_round_trip(tmp_path):
    """The export writes each call a node, ``shares`` among its args and no weights for a later call; read back, the
    description is the one written."""
    from test_perfseer_round_trip import _rows

    from perf4sight.exporters import export_perfseer
    from perf4sight.exporters.perfseer import description_to_graph
    from perf4sight.importers.perfseer import import_perfseer
    from perf4sight.ir.schema import load_description

    desc = describe(_ChannelAttention(), [3, 32, 32], "cbam")
    weights = {n: f["feature"]["memory_info"]["weight_size"] for n, f in description_to_graph(desc, 2).nodes.items()}
    assert weights["mlp_0"] == (16 * 4 + 4) * 4 and weights["mlp_3"] == 0
    export_perfseer(_rows(desc), {desc.name: desc}, tmp_path / "ds")
    import_perfseer(tmp_path / "ds", "d2", tmp_path / "prof", tmp_path / "models")
    assert load_description(tmp_path / "models" / "imported" / "d2" / "cbam.json").to_dict() == desc.to_dict()


@pytest.mark.parametrize("how", ["cbam", "scale_and_shift", "scaled_twice", "layer_norm_twice"])
def test_a_shared_parameter_survives_our_export_read_as_another_tool_s(how):
    """Our export read as another tool's file (without our metadata: its args read by ONNX's rules) lost ``shares``:
    a later call of a layer, or a shift reading a scale's tensor (``x * g + g``), came back a layer of its own, the
    parameters counted twice (232 -> 240 for ``x * g + g``) and their memory with them. The later node takes its
    owner's attrs and ``shares`` it again: the same description, parameter count and allocation events, and the
    network rebuilt from it computes the original's output with its weights."""
    import pickle

    from perf4sight.exporters.perfseer import description_to_graph
    from perf4sight.importers.perfseer import graph_to_description

    original = _ChannelAttention() if how == "cbam" else _ParameterReadTwice(how)
    desc = describe(original, [3, 8, 8], "twice")
    graph = pickle.loads(pickle.dumps(description_to_graph(desc, 2)))
    graph.graph["source"] = "another tool"  # our args read as a foreign file's
    back = graph_to_description(graph, "twice", "twice.pkl")[0]
    assert [(n.name, n.op, n.attrs) for n in back.nodes] == [(n.name, n.op, n.attrs) for n in desc.nodes]
    assert back.params == desc.params == sum(p.numel() for p in original.parameters()) - (
        0 if how == "cbam" else 16 if how != "layer_norm_twice" else 8)
    assert _as_replayed(record_events(back, 2, steps=2)) == _as_replayed(record_events(desc, 2, steps=2))
    rebuilt = build_module(back)
    read = list(original.parameters()) if how == "cbam" else _read_parameters(original)
    with torch.no_grad():
        for mine, theirs in zip(rebuilt.parameters(), read, strict=True):
            mine.copy_(theirs)
    x = torch.randn(2, 3, 8, 8)
    assert torch.allclose(rebuilt(x), original(x), atol=1e-5)


class _TwiceNormed(nn.Module):
    """A batch norm applied to a map and to its double, the two summed: the norm's backward adds its input's
    gradient into the one the multiply's left, then its weight's and bias's into the first call's."""

    def __init__(self) -> None:
        super().__init__()
        self.conv, self.bn, self.fc = nn.Conv2d(3, 6, 3, padding=1), nn.BatchNorm2d(6), nn.Linear(6, 4)

    def forward(self, x):
        y = self.conv(x)
        return self.fc((self.bn(y) + self.bn(y * 2)).mean((2, 3)))


class _ProductAndSum(nn.Module):
    """a * b + a + b: the product's backward adds both its gradients into buffers the sums filled."""

    def __init__(self) -> None:
        super().__init__()
        self.a, self.b, self.fc = nn.Conv2d(3, 4, 3, padding=1), nn.Conv2d(3, 4, 3, padding=1), nn.Linear(4, 2)

    def forward(self, x):
        a, b = self.a(x), self.b(x)
        return self.fc((a * b + a + b).mean((2, 3)))


@pytest.mark.parametrize("network", [_TwiceNormed, _ProductAndSum])
def test_a_gradient_added_into_a_buffer_is_freed_when_its_node_is_done(network):
    """A node's gradient added into a filled buffer is its output, which the engine holds till the node has handed on
    all its gradients: the model freed it right after the sum, before the node's next sum (a shared layer's weight
    gradient, the other input's), where the trace frees it after them."""
    desc = describe(network(), [3, 8, 8], "net")
    assert _as_replayed(record_events(desc, 2, steps=1, method="model")) == _as_replayed(
        record_events(desc, 2, steps=1, method="trace"))


class _TwiceNormedWithoutAffine(nn.Module):
    """A batch norm without affine parameters applied twice: one set of running statistics, updated by both calls."""

    def __init__(self) -> None:
        super().__init__()
        self.conv, self.bn, self.fc = nn.Conv2d(3, 6, 3, padding=1), nn.BatchNorm2d(6, affine=False), nn.Linear(6, 4)

    def forward(self, x):
        y = self.conv(x)
        return self.fc((self.bn(y) + self.bn(y * 2)).mean((2, 3)))


def test_a_batch_norm_without_parameters_called_twice_keeps_one_set_of_running_statistics():
    """Only a layer with parameters was marked shared: a batch norm without affine ones, called twice, was rebuilt as
    two norms of their own running statistics (each updated by one call, where the network's are by both) and its
    buffers set up twice by the allocation model. Its later call now shares the first's buffers."""
    original = _TwiceNormedWithoutAffine()
    desc = describe(original, [3, 8, 8], "bn")
    assert desc.node("bn_1").attrs.get("shares") == "bn"
    rebuilt = build_module(desc)
    rebuilt.load_state_dict(dict(zip(rebuilt.state_dict(), original.state_dict().values())))
    x = torch.randn(2, 3, 8, 8)
    assert torch.allclose(rebuilt(x), original(x), atol=1e-6)  # training: both update their running statistics
    assert torch.allclose(rebuilt.state_dict()["bn.running_var"], original.bn.running_var)
    assert sum(b.numel() for b in rebuilt.buffers()) == sum(b.numel() for b in original.buffers())
    model = record_events(desc, 2, steps=1, method="model")
    assert _as_replayed(model) == _as_replayed(record_events(desc, 2, steps=1, method="trace"))
    assert len([e for e in model if e[3] == "setup"]) == 2 + 3 + 2  # conv, the norm's 3 buffers once, fc


class _ParameterReadTwice(nn.Module):
    """A convolution, then a [C, 1, 1] parameter read directly by two ops (``how``): multiplied and added
    (``x * g + g``), multiplied twice (``x * g + sigmoid(x) * g``), or a layer norm's weight and bias given twice."""

    def __init__(self, how: str) -> None:
        super().__init__()
        self.how, self.conv = how, nn.Conv2d(3, 8, 3, padding=1)
        self.g = nn.Parameter(torch.randn(8, 1, 1))
        self.w, self.b = nn.Parameter(torch.randn(8)), nn.Parameter(torch.randn(8))

    def forward(self, x):
        y = self.conv(x)
        if self.how == "scale_and_shift":
            return y * self.g + self.g
        if self.how == "scaled_twice":
            return y * self.g + torch.sigmoid(y) * self.g
        y = y.permute(0, 2, 3, 1)
        return nn.functional.layer_norm(nn.functional.layer_norm(y, (8,), self.w, self.b), (8,), self.w, self.b)


def _read_parameters(module: nn.Module) -> list[nn.Parameter]:
    """``module``'s parameters its forward reads (the convolution's, then g, or the layer norm's weight and bias)."""
    names = ("w", "b") if module.how == "layer_norm_twice" else ("g",)
    return [module.conv.weight, module.conv.bias, *(getattr(module, n) for n in names)]


@pytest.mark.parametrize("how", ["scale_and_shift", "scaled_twice", "layer_norm_twice"])
def test_a_parameter_read_by_two_ops_is_one_parameter(how):
    """A parameter read directly by two ops (no layer of its own: ``x * self.g + self.g``) was described as two
    (a scale and a shift, each with a tensor of its own): 8 parameters more than the network has, their gradients and
    optimiser state counted twice, two leaf tensors set up. The later reader now ``shares`` the first's tensor (a
    shift a scale's), so the count, the features and the allocation model's setup are the network's, and the rebuilt
    network holds one Parameter: the original's output and gradients with its weights."""
    original = _ParameterReadTwice(how)
    read = _read_parameters(original)
    desc = NetworkDescription.from_dict(describe(original, [3, 8, 8], "twice").to_dict())
    assert desc.params == sum(p.numel() for p in read) == network_features(desc).static["params"]
    assert sum("shares" in n.attrs for n in desc.nodes) == 1
    rebuilt = build_module(desc)
    assert [p.shape for p in rebuilt.parameters()] == [p.shape for p in read]
    with torch.no_grad():
        for mine, theirs in zip(rebuilt.parameters(), read):
            mine.copy_(theirs)
    x = torch.randn(2, 3, 8, 8)
    out, expected = rebuilt(x), original(x)
    assert torch.allclose(out, expected, atol=1e-6)
    out.square().sum().backward()
    expected.square().sum().backward()
    for mine, theirs in zip(rebuilt.parameters(), read):
        assert torch.allclose(mine.grad, theirs.grad, atol=1e-5)
    model = record_events(desc, 2, steps=2, method="model")
    assert _as_replayed(model) == _as_replayed(record_events(desc, 2, steps=2, method="trace"))
    assert len([e for e in model if e[3] == "setup"]) == len(read)
    assert describe(rebuilt, [3, 8, 8], "twice").to_dict()["nodes"] == desc.to_dict()["nodes"]


class _ScaledAndShiftedHead(nn.Module):
    """A convolution's map times a parameter and plus it (``y * self.g + self.g``), then a classifier: its channels
    prunable, the parameter with them."""

    def __init__(self) -> None:
        super().__init__()
        self.conv, self.fc = nn.Conv2d(3, 16, 3, padding=1), nn.Linear(16, 5)
        self.g = nn.Parameter(torch.randn(16, 1, 1))

    def forward(self, x):
        return self.fc((self.conv(x) * self.g + self.g).mean((2, 3)))


@pytest.mark.parametrize("meta", [False, True])
def test_a_rebuilt_scale_and_shift_of_one_tensor_prune_as_the_network_does(meta):
    """The network rebuilt from the description of ``y * g + g`` (a scale and a shift holding one Parameter) prunes
    as the network does, its tensor cut once: it was left unpruned ('does not follow whole', 0% at most), as moving
    the network to the meta device gave each holder a copy of its own and the cut replaced the first holder's alone.
    The pruned network describes as the original pruned does (the shift sharing the scale's tensor) and runs."""
    torch.manual_seed(0)
    original = _ScaledAndShiftedHead()
    desc = describe(original, [3, 8, 8], "head")
    expected = describe(prune_model(original, [3, 8, 8], 30, network="head").module, [3, 8, 8], "head")
    pruned = PruningPlan(build_module(desc), [3, 8, 8], network="head").prune(30, meta=meta).module
    again = describe(pruned, [3, 8, 8], "head")
    assert again.params == expected.params < desc.params
    assert [(n.op, n.output_shape, n.attrs.get("shares")) for n in again.nodes] == \
        [(n.op, n.output_shape, n.attrs.get("shares")) for n in expected.nodes]
    if not meta:
        assert pruned(torch.randn(2, 3, 8, 8)).shape == (2, 5)


class _LayerWeightReadAgain(nn.Module):
    """A layer norm's weight read again by a multiply: through the layer (``through_layer``) or given to
    ``F.layer_norm`` as a parameter of the network's own."""

    def __init__(self, through_layer: bool) -> None:
        super().__init__()
        self.through_layer, self.conv, self.norm = through_layer, nn.Conv2d(3, 8, 3, padding=1), nn.LayerNorm(8)

    def forward(self, x):
        y = self.conv(x).permute(0, 2, 3, 1)
        if self.through_layer:
            return self.norm(y) * self.norm.weight
        return nn.functional.layer_norm(y, (8,), self.norm.weight, self.norm.bias) * self.norm.weight


@pytest.mark.parametrize("through_layer", [True, False])
def test_a_parameter_read_by_ops_that_cannot_share_it_is_refused_by_name(through_layer):
    """A layer norm's weight multiplied by again was described as a layer norm and a scale each with tensors of
    their own (8 parameters counted twice); no node can hold part of another's, so it is refused, naming both."""
    owner = "norm" if through_layer else "layer_norm"
    with pytest.raises(UserError, match=rf"^net: scale \(node mul\) reads norm\.weight, which layernorm \(node "
                                        rf"{owner}\) reads too: .*count twice"):
        describe(_LayerWeightReadAgain(through_layer), [3, 8, 8], "net")


def test_a_scale_and_a_shift_share_a_tensor_of_one_shape_only():
    """A shift may name a scale (or a scale a shift) as the owner of its tensor where both have one shape; another
    shape, or another op, is refused as a layer called twice unlike itself is."""
    d = describe(_ParameterReadTwice("scale_and_shift"), [3, 8, 8], "net").to_dict()
    shift = next(n for n in d["nodes"] if n["op"] == "shift")
    assert shift["attrs"] == {"shape": [8, 1, 1], "shares": "mul"}
    for attrs in [{"shape": [8, 1, 8], "shares": "mul"}, {"shape": [8, 1, 1], "shares": "conv"}]:
        e = copy.deepcopy(d)
        e.pop("params")
        next(n for n in e["nodes"] if n["name"] == "add")["attrs"] = attrs
        with pytest.raises(UserError, match=r"^net: node 'add' \(shift\): .*which differs from this node"):
            NetworkDescription.from_dict(e, "net")
