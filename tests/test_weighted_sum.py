"""EfficientDet's BiFPN fusion (``relu(w) / (sum(relu(w)) + eps)`` or ``softmax(w)``, then ``w[0] * a + w[1] * b
(+ w[2] * c)``): the op ``weighted_sum``, described, rebuilt, costed, pruned and trained."""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from perf4sight.errors import UserError
from perf4sight.ir.from_torch import describe
from perf4sight.ir.schema import NetworkDescription, Node
from perf4sight.ir.to_torch import build_module

SHAPE = [3, 16, 16]

#: How a BiFPN normalises its fusion weights: zylo117's (an nn.ReLU layer, torch.sum(w, dim=0)), a functional
#: one's (F.relu, w.sum(0), eps first), and the softmax variant.
def _relu_layer(s: nn.Module, w: torch.Tensor) -> torch.Tensor:
    w = s.relu(w)
    return w / (torch.sum(w, dim=0) + 1e-4)


def _functional(s: nn.Module, w: torch.Tensor) -> torch.Tensor:
    w = F.relu(w)
    return w / (1e-3 + w.sum(0))


NORMALISATIONS = {"relu_layer": _relu_layer, "functional": _functional,
                  "softmax": lambda s, w: torch.softmax(w, 0)}


class _SeparableConv(nn.Module):
    """EfficientDet's depthwise-separable convolution: a 3x3 depthwise one, a 1x1 pointwise one, a batch norm."""

    def __init__(self, channels: int) -> None:
        super().__init__()
        self.depthwise = nn.Conv2d(channels, channels, 3, padding=1, groups=channels, bias=False)
        self.pointwise = nn.Conv2d(channels, channels, 1)
        self.bn = nn.BatchNorm2d(channels)

    def forward(self, x):
        return self.bn(self.pointwise(self.depthwise(x)))


class _BiFPN(nn.Module):
    """Two levels of a BiFPN: a top-down node fusing two maps, an output node fusing three, each fusion swished and
    convolved (depthwise-separable), as EfficientDet's; ``normalise(self, w)`` makes a fusion's weights."""

    def __init__(self, normalise, channels: int = 16) -> None:
        super().__init__()
        self.normalise = normalise
        self.stem = nn.Conv2d(3, channels, 3, padding=1)
        self.down = nn.Conv2d(channels, channels, 3, stride=2, padding=1)
        self.relu = nn.ReLU()
        self.w1 = nn.Parameter(torch.tensor([0.3, 1.7]))
        self.w2 = nn.Parameter(torch.tensor([-0.5, 1.0, 2.0]))  # its first weight zeroed by a relu
        self.conv_td, self.conv_out = _SeparableConv(channels), _SeparableConv(channels)
        self.fc = nn.Linear(channels, 10)

    def forward(self, x):
        p3 = self.stem(x)
        p4, p3_down = self.down(p3), F.max_pool2d(p3, 2)
        w1 = self.normalise(self, self.w1)
        td = self.conv_td(F.silu(w1[0] * p4 + w1[1] * p3_down))
        w2 = self.normalise(self, self.w2)
        out = self.conv_out(F.silu(w2[0] * p4 + w2[1] * td + p3_down * w2[2]))
        return self.fc(out.mean((2, 3)))


def _by_name(rebuilt: nn.Module, module: nn.Module, desc: NetworkDescription, owners: dict[int, str]) -> None:
    """Copy ``module``'s weights into ``rebuilt`` by name: a layer's by its path (dots as underscores, the traced
    node's name), a weighted sum's from the parameter ``owners`` names for its number of inputs."""
    fusions = {n.name: owners[n.attrs["num_inputs"]] for n in desc.nodes if n.op == "weighted_sum"}
    original = dict(module.named_parameters())
    by_path = {name.rpartition(".")[0].replace(".", "_") + "." + name.rpartition(".")[2]: p
               for name, p in original.items()}
    copied = 0
    for name, p in rebuilt.named_parameters():
        layer = name.rpartition(".")[0]
        source = original[fusions[layer]] if layer in fusions else by_path[name]
        p.data.copy_(source.data)
        copied += 1
    assert copied == len(original)  # the batch norms' statistics: fresh in both


@pytest.mark.parametrize("normalisation", list(NORMALISATIONS))
def test_a_bifpn_s_fusions_are_weighted_sums_the_rebuilt_network_computes_the_same(normalisation):
    """A BiFPN's fusion, weights computed from a parameter alone, was refused naming the parameter ("the description
    has no op for weights computed from parameters"): the relu (or softmax), the normalisation, the picks, the
    products and the sum are one op, weighted_sum, its parameter counted; the network rebuilt from the description
    (read back from JSON), given the original's weights by name, computes the original's output, and describes
    again to the same nodes."""
    torch.manual_seed(0)
    module = _BiFPN(NORMALISATIONS[normalisation]).eval()
    desc = NetworkDescription.from_dict(describe(module, SHAPE, name="bifpn").to_dict())
    fused = [n for n in desc.nodes if n.op == "weighted_sum"]
    eps = {"relu_layer": {"eps": 1e-4}, "functional": {"eps": 1e-3}, "softmax": {}}[normalisation]
    kind = "softmax" if normalisation == "softmax" else "relu"
    assert [n.attrs for n in fused] == [{"num_inputs": 2, "normalize": kind, **eps},
                                        {"num_inputs": 3, "normalize": kind, **eps}]
    assert [n.inputs for n in fused] == [["down", "max_pool2d"], ["down", "conv_td_bn", "max_pool2d"]]
    assert not {"relu", "softmax", "div", "select", "scale"} & {n.op for n in desc.nodes}
    assert desc.params == sum(p.numel() for p in module.parameters())
    rebuilt = build_module(desc).eval()
    _by_name(rebuilt, module, desc, {2: "w1", 3: "w2"})
    x = torch.randn(2, *SHAPE)
    assert torch.allclose(rebuilt(x), module(x), atol=1e-5)
    again = describe(rebuilt, SHAPE, name="bifpn")
    assert [(n.op, n.attrs, n.output_shape) for n in again.nodes] == [(n.op, n.attrs, n.output_shape)
                                                                      for n in desc.nodes]


def test_a_fusion_weight_read_twice_is_still_refused_naming_the_parameter():
    """A weight picked twice (or a product read besides the sum) is no BiFPN fusion: refused as before, naming the
    parameter."""
    class Twice(_BiFPN):
        def forward(self, x):
            p3 = self.stem(x)
            w = F.relu(self.w1)
            w = w / (w.sum(0) + 1e-4)
            return self.fc((w[0] * p3 + w[1] * p3.sigmoid() + w[0] * p3.tanh()).mean((2, 3)))
    with pytest.raises(UserError, match=r"computes from the module's parameter w1 alone"):
        describe(Twice(NORMALISATIONS["functional"]), SHAPE, name="twice")


def test_fusions_of_one_parameter_share_it():
    """A fusion layer called twice (one parameter, two pairs of maps): the second node ``shares`` the first's
    weights, counted once, and the rebuilt network computes the original's output."""
    class Shared(_BiFPN):
        def forward(self, x):
            p3 = self.stem(x)
            first = self.fuse(p3, p3.sigmoid())
            return self.fc(self.fuse(first, p3.tanh()).mean((2, 3)))

        def fuse(self, a, b):
            w = torch.softmax(self.w1, 0)
            return w[0] * a + w[1] * b

    module = Shared(None).eval()
    del module.w2, module.conv_td, module.conv_out, module.down
    desc = describe(module, SHAPE, name="shared")
    first, second = [n for n in desc.nodes if n.op == "weighted_sum"]
    assert second.attrs == {**first.attrs, "shares": first.name}
    assert desc.params == sum(p.numel() for p in module.parameters())
    rebuilt = build_module(desc).eval()
    _by_name(rebuilt, module, desc, {2: "w1"})
    x = torch.randn(2, *SHAPE)
    assert torch.allclose(rebuilt(x), module(x), atol=1e-5)


@pytest.mark.parametrize("attrs, inputs, problem", [
    ({"num_inputs": 2, "normalize": "sigmoid"}, 2, r"attr 'normalize' must be one of relu, softmax"),
    ({"num_inputs": 3, "normalize": "relu"}, 2, r"needs 3 inputs of one shape"),
    ({"num_inputs": 2, "normalize": "relu", "eps": -1.0}, 2, r"attr 'eps' must be a number >= 0"),
])
def test_a_weighted_sum_s_attrs_are_checked(attrs, inputs, problem):
    """A description's weighted_sum names a normalisation the op has, one input per weight, of one shape."""
    nodes = [Node("input", "input", [], {}, [8, 4, 4]), Node("a", "relu", ["input"], {}, [8, 4, 4]),
             Node("s", "weighted_sum", ["input", "a"][:inputs], attrs, [8, 4, 4]),
             Node("f", "flatten", ["s"], {"start_dim": 1}, [128])]
    with pytest.raises(UserError, match=problem):
        NetworkDescription.from_dict(NetworkDescription(name="n", network="n", input_shape=[8, 4, 4],
                                                        num_classes=128, params=2, nodes=nodes,
                                                        output="f").to_dict())


class _Maps(nn.Module):
    """``count`` maps of one convolution's output (itself, its sigmoid, its tanh), fused by a :class:`WeightedSum`
    (the module a description rebuilds), then a classifier."""

    def __init__(self, count: int, normalize: str) -> None:
        super().__init__()
        from perf4sight.ir.to_torch import WeightedSum
        self.conv, self.fuse, self.fc = nn.Conv2d(3, 8, 3, padding=1), WeightedSum(count, normalize), nn.Linear(8, 10)
        self.count = count

    def forward(self, x):
        y = self.conv(x)
        maps = [y, y.sigmoid()] + ([y.tanh()] if self.count == 3 else [])
        return self.fc(self.fuse(*maps).mean((2, 3)))


def _kernels_run(module: nn.Module, maps: list[torch.Tensor]) -> tuple[list, list]:
    """The aten ops (name, output elements, input elements) ``module`` runs forward and backward on ``maps`` (views
    and detaches left out: they launch no kernel)."""
    from torch.utils._python_dispatch import TorchDispatchMode

    class Ops(TorchDispatchMode):
        def __init__(self):
            super().__init__()
            self.seen = []

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            out = func(*args, **(kwargs or {}))
            name = func.__name__.split(".")[0]
            if name not in ("select", "detach", "unsqueeze", "expand", "view", "alias", "as_strided"):
                read = max((a.numel() for a in args if isinstance(a, torch.Tensor)), default=0)
                self.seen.append((name, out.numel(), read))
            return out

    with Ops() as forward:
        out = module(*maps)
    seed = torch.ones_like(out)
    with Ops() as backward:
        out.backward(seed)
    return forward.seen, backward.seen


@pytest.mark.parametrize("count", [2, 3])
@pytest.mark.parametrize("normalize", ["relu", "softmax"])
def test_a_weighted_sum_costs_the_kernels_torch_runs_and_keeps_what_autograd_saves(count, normalize):
    """The walk's cost of a weighted sum counts the kernels this torch runs each way (a dispatch log of the rebuilt
    module: the weights' normalisation, a product per map and the adds forward; backward per map two products and
    a sum, a select_backward per weight, the adds of their gradients and the normalisation's), the FLOPs of those
    over the maps, and keeps what autograd saves: every map, and once a batch the weights' few tensors."""
    from perf4sight.features.walk import walk
    from perf4sight.ir.to_torch import WeightedSum

    desc = describe(_Maps(count, normalize), [3, 8, 8], name="maps")
    (visit,) = [v for v in walk(desc) if v.node.op == "weighted_sum"]
    elements = 8 * 8 * 8
    maps = [torch.randn(1, 8, 8, 8, requires_grad=True) for _ in range(count)]
    fuse = WeightedSum(count, normalize)
    forward, backward = _kernels_run(fuse, maps)
    assert (visit.cost.kernels_fwd, visit.cost.kernels_bwd) == (len(forward), len(backward))
    assert visit.cost.flops_fwd == sum(out for _, out, _ in forward if out == elements)
    assert visit.cost.flops_bwd == sum(read for _, _, read in backward if read == elements)
    saved: list[torch.Tensor] = []
    with torch.autograd.graph.saved_tensors_hooks(lambda t: saved.append(t) or t, lambda t: t):
        fuse(*maps)
    storages = {t.untyped_storage().data_ptr(): t.untyped_storage().nbytes() for t in saved}
    kept_maps = [m.untyped_storage().data_ptr() for m in maps]
    assert visit.cost.saved == list(range(count)) and set(kept_maps) <= set(storages)
    assert sorted(visit.cost.batch_saved) == sorted(size for ptr, size in storages.items() if ptr not in kept_maps)
    assert visit.cost.params == count


@pytest.mark.parametrize("normalisation", ["relu_layer", "softmax"])
def test_a_bifpn_prunes_at_two_levels_its_fused_maps_tied_and_trains(normalisation):
    """Pruning ties the channels of a fusion's maps (as an add's) and leaves its weights whole (one per map, not per
    channel): the network pruned at two levels describes, its fusions kept, and a training step runs."""
    from test_networks import _train_step

    from perf4sight.networks.build import Source, prune_source

    descs = prune_source(Source("bifpn", "test", lambda: _BiFPN(NORMALISATIONS[normalisation])), SHAPE, [20, 40],
                         "l1-norm", 2, seed=0)
    assert len(descs) == 2
    for desc in descs:
        fused = [n for n in desc.nodes if n.op == "weighted_sum"]
        assert [n.attrs["num_inputs"] for n in fused] == [2, 3]
        widths = {n.output_shape[0] for n in fused}  # the stem's, the down convolution's, the top-down node's
        assert len(widths) == 1 and widths.pop() < 16
        _train_step(desc)
    assert descs[1].params < descs[0].params


class _FusesTheInput(nn.Module):
    """A fusion of the network's input (no gradient) and a convolution of it, then a classifier."""

    def __init__(self) -> None:
        super().__init__()
        from perf4sight.ir.to_torch import WeightedSum
        self.conv, self.fuse, self.fc = nn.Conv2d(3, 3, 3, padding=1), WeightedSum(2, "relu"), nn.Linear(3, 10)

    def forward(self, x):
        return self.fc(self.fuse(x, self.conv(x)).mean((2, 3)))


@pytest.mark.parametrize("network", ["maps2_relu", "maps3_relu", "maps2_softmax", "maps3_softmax", "bifpn_relu_layer",
                                     "bifpn_softmax", "the_input"])
@pytest.mark.parametrize("batch", [3, 1])
def test_the_allocation_model_writes_down_a_weighted_sum_as_traced(network, batch):
    """A weighted sum's allocations were left to the meta trace ('the allocation model does not cover op
    weighted_sum'): the model writes them down, its weights' tensors (a relu's result, the sum, the sum plus eps
    after which the sum is freed, the division; a softmax's result), a product per map and the adds (each product
    and old sum freed after), and backward per map its gradient, the weight's full-size one summed to a scalar, a
    select_backward added into the weights' gradient, the division's and the relu's (or the softmax's) gradients:
    its events are the meta trace's, two steps, for maps that need a gradient or not (the network's input)."""
    from test_allocator import _as_replayed

    from perf4sight.features.alloc_trace import record_events

    if network == "the_input":
        module, shape = _FusesTheInput(), [3, 8, 8]
    elif network.startswith("maps"):
        module, shape = _Maps(int(network[4]), network.split("_")[1]), [3, 8, 8]
    else:
        module, shape = _BiFPN(NORMALISATIONS[network[len("bifpn_"):]]), SHAPE
    desc = describe(module, shape, name=network)
    model = record_events(desc, batch, steps=2, method="model")
    assert _as_replayed(model) == _as_replayed(record_events(desc, batch, steps=2, method="trace"))
    picks = [size for kind, _, size, op in model if op == "aten.select_backward.default"]
    fused = [n.attrs["num_inputs"] for n in desc.nodes if n.op == "weighted_sum"]
    assert picks == [count * 4 for count in fused[::-1] for _ in range(count)] * 2


@pytest.mark.parametrize("count", [2, 3])
def test_a_weighted_sum_s_kernels_in_the_latency_terms(count):
    """The kernel table runs a weighted sum of n maps as its products and adds forward (2n - 1 kernels over the
    maps; those on its n weights left out) and 3n backward (per map two products and a sum), moving (5n - 3) map
    passes forward and 6 over the maps backward; its weights are one more tensor for the optimiser to update."""
    from tiny_graphs import conv_node, tiny_description

    from perf4sight.features.latency_terms import BANDWIDTH, kernel_table
    from perf4sight.features.optimizers import DEFAULT_OPTIMIZER, optimizer_cost

    convs = [conv_node(f"c{i}", "input", 4, 4, 1, 1, 8) for i in range(count)]
    head = [Node("input", "input", [], {}, [4, 8, 8]), *convs]
    fused = Node("w", "weighted_sum", [c.name for c in convs], {"num_inputs": count, "normalize": "relu"}, [4, 8, 8])
    adds = [Node("a1", "add", ["c0", "c1"], {}, [4, 8, 8]), Node("a2", "add", ["a1", "c2"], {}, [4, 8, 8])]
    adds = adds[:count - 1]
    plain = kernel_table(tiny_description(head + adds))  # the maps summed: an add's kernel each, forward alone
    table = kernel_table(tiny_description(head + [fused]))
    updates = optimizer_cost(DEFAULT_OPTIMIZER).kernels_per_tensor
    assert table.launches == plain.launches - (count - 1) + (2 * count - 1) + 3 * count + updates
    assert table.param_tensors == plain.param_tensors + 1
    moved = table.bytes_ps[table.kind == BANDWIDTH].sum() - plain.bytes_ps[plain.kind == BANDWIDTH].sum()
    elements = 4 * 8 * 8  # an add moves 3 maps; the weighted sum 5n - 3 forward and 6n backward
    assert moved == pytest.approx(((5 * count - 3) + 6 * count - 3 * (count - 1)) * elements * 4)


class _FpnCombine(nn.Module):
    """effdet's (efficientdet-pytorch's) FpnCombine of two maps: "fastattn" stacks each map times its relu'd weight
    over their sum plus eps, "attn" stacks the maps and multiplies by the softmax of the weights; either summed over
    the new last dimension."""

    def __init__(self, method: str) -> None:
        super().__init__()
        self.method, self.edge_weights = method, nn.Parameter(torch.ones(2))
        self.conv, self.fc = nn.Conv2d(3, 8, 3, padding=1), nn.Linear(8, 10)

    def forward(self, x):
        nodes = [self.conv(x), self.conv(x).sigmoid()]
        if self.method == "fastattn":
            edge_weights = F.relu(self.edge_weights)
            weights_sum = torch.sum(edge_weights)
            out = torch.stack([nodes[i] * edge_weights[i] / (weights_sum + 0.0001) for i in range(2)], dim=-1)
        else:
            out = torch.stack(nodes, dim=-1) * torch.softmax(self.edge_weights, dim=0)
        return self.fc(torch.sum(out, dim=-1).mean((2, 3)))


@pytest.mark.parametrize("method", ["fastattn", "attn"])
def test_effdet_s_stacked_fusion_is_refused_naming_the_stack(method):
    """effdet's FpnCombine sums its weighted maps as a stack (other kernels than a weighted sum's: a divide per map,
    the stack's copy, a sum over it): refused naming the parameter, as before, and now the stack."""
    with pytest.raises(UserError, match=r"computes from the module's parameter edge_weights alone.*; the weighted "
                                        r"maps are stacked, then summed over the new dimension \(effdet's "
                                        r"FpnCombine\): that sum written as a stack has no description op$"):
        describe(_FpnCombine(method), [3, 8, 8], name=method)


def test_perfsight_s_features_count_a_weighted_sum_s_products_and_adds():
    """PerfSight's elementwise count of a weighted sum of n maps is a product per map and n - 1 adds (2n - 1 map
    elements), where an add of two maps counts one."""
    from tiny_graphs import conv_node, tiny_description

    from perf4sight.features.perf4sight_set import PERF4SIGHT_FEATURES, perf4sight_vectors

    head = [Node("input", "input", [], {}, [4, 8, 8])] + [conv_node(f"c{i}", "input", 4, 4, 1, 1, 8) for i in range(3)]
    fused = Node("w", "weighted_sum", ["c0", "c1", "c2"], {"num_inputs": 3, "normalize": "softmax"}, [4, 8, 8])
    added = [Node("a1", "add", ["c0", "c1"], {}, [4, 8, 8]), Node("a2", "add", ["a1", "c2"], {}, [4, 8, 8])]
    column = PERF4SIGHT_FEATURES.index("add_elems")
    weighted = perf4sight_vectors(tiny_description(head + [fused]))[1][column]
    plain = perf4sight_vectors(tiny_description(head + added))[1][column]
    assert plain == 2 * 4 * 8 * 8 and weighted == 5 * 4 * 8 * 8
