"""PerfSeer export -> import round trips on real networks: zoo descriptions and the TX2 measurements.

A round trip must keep the description (nodes, names, order, attributes, shapes, metadata) and every
column of an exported row except ``device`` (the ``--device`` given) and ``timestamp`` (the import
time); a file read as a foreign one (no perf4sight metadata) must still rebuild the same network.
"""
from __future__ import annotations

import copy
import hashlib
import math
import pickle
from pathlib import Path

import pytest
import torch
from torchvision.ops.misc import FrozenBatchNorm2d

from perf4sight.errors import UserError
from perf4sight.exporters import export_perfseer
from perf4sight.exporters.perfseer import description_to_graph
from perf4sight.features.aggregate import network_features
from perf4sight.features.alloc_trace import simulate
from perf4sight.fingerprint.fit import memory_column
from perf4sight.importers import import_perf4sight
from perf4sight.importers.perfseer import ONNX_TO_OP, OP_TO_ONNX, graph_to_description, import_perfseer
from perf4sight.ir.from_torch import describe
from perf4sight.ir.schema import OPS, NetworkDescription, load_description
from perf4sight.ir.to_torch import build_module
from perf4sight.networks.reshape import described_at
from perf4sight.networks.zoo import describe_zoo
from perf4sight.profiling.results import append_row, read_rows, results_path

TX2 = Path("/work/shared/data/tx2-perf4sight")
SHAPE = [3, 64, 64]


def _output_shape(desc, batch: int = 2) -> list[int]:
    """The output shape of ``desc`` rebuilt as a torch module, run on a real (CPU) batch."""
    torch.manual_seed(0)
    with torch.no_grad():
        return list(build_module(desc).eval()(torch.randn(batch, *desc.input_shape)).shape)


def _rows(desc, batches=(2, 8)) -> list[dict]:
    return [{"device": "d", "backend": "nvml", "network": desc.name, "batch_size": b, "status": "ok", "phase": "train",
             "latency_ms_median": 10.0 * b, "device_mem_used_mb": 100.0 + b} for b in batches]


def test_every_schema_op_has_one_onnx_type():
    assert set(OP_TO_ONNX) == set(OPS) - {"input"}
    # one-to-one but for the two ops that share a type with another (an import tells them apart by their args)
    assert {op: ONNX_TO_OP[t] for op, t in OP_TO_ONNX.items() if ONNX_TO_OP[t] != op} == {
        "permute": "transpose", "scale": "mul", "shift": "add", "token": "cat", "hardtanh": "relu6"}
    assert OP_TO_ONNX["silu"] == "Swish" and OP_TO_ONNX["narrow"] == "Slice" and OP_TO_ONNX["select"] == "Gather"
    assert OP_TO_ONNX["layernorm"] == "LayerNormalization"


class _Views(torch.nn.Module):
    """The ops no zoo network here uses: gelu, avgpool2d, tanh, transpose, narrow, unsqueeze, squeeze,
    adaptivemaxpool2d, select, mean, silu, leaky_relu (in place), elu, mish (in place), softplus (torch's
    defaults, which ONNX's Softplus is), groupnorm, conv_transpose2d (without a bias, with an output padding),
    instancenorm (affine), hardtanh, softmax, pixel_unshuffle (of one channel, which ONNX's SpaceToDepth is),
    pixel_shuffle, pads of each mode, prelu (a slope per channel), dropout2d, log_softmax, selu, celu,
    local_response_norm, pow (a sqrt and the power -1 of a quotient), exp, abs, log, div, var, glu, hardshrink,
    softshrink, threshold (in place), log_sigmoid, rmsnorm, repeat, rrelu, alpha_dropout (of whole channels) and
    fractional_maxpool2d, and matmul (a product of two activations, ONNX's MatMul); maximum and minimum (ONNX's Max
    and Min), flip and roll; weighted_sum (a BiFPN fusion of two maps); normalize (F.normalize, an eps of its own);
    unfold (im2col) and fold (col2im); logsumexp (ONNX's ReduceLogSumExp), cumsum, where (of a number branch),
    affine_grid and grid_sample (ONNX's AffineGrid and GridSample: a spatial transformer); sort and topk (ONNX's
    TopK) of their values; linspace (CoordConv's column coordinates, added to the map).
    Also frozen_batchnorm2d (torchvision's FrozenBatchNorm2d, an eps of its own); the instance norm tracks running
    statistics."""

    def __init__(self):
        super().__init__()
        self.gray, self.widen = torch.nn.Conv2d(3, 1, 1), torch.nn.Conv2d(4, 12, 1)
        self.conv, self.norm = torch.nn.Conv2d(3, 8, 3, padding=1), torch.nn.GroupNorm(2, 8, eps=1e-3)
        self.inorm = torch.nn.InstanceNorm2d(8, eps=1e-4, affine=True, track_running_stats=True, momentum=0.2)
        self.prelu, self.drop, self.lrn = torch.nn.PReLU(8), torch.nn.Dropout2d(0.1), torch.nn.LocalResponseNorm(3)
        self.pool = torch.nn.AvgPool2d(2)
        self.up = torch.nn.ConvTranspose2d(8, 8, 3, stride=2, padding=1, output_padding=1, bias=False)
        self.amax = torch.nn.AdaptiveMaxPool2d(2)
        self.fc, self.cut = torch.nn.Linear(8, 10), torch.nn.Threshold(0.0625, -1.0, inplace=True)
        self.rms = torch.nn.RMSNorm(8, eps=1e-4)
        self.frozen = FrozenBatchNorm2d(8, eps=1e-3)
        self.fusion = torch.nn.Parameter(torch.tensor([0.5, 2.0]))
        self.stn = torch.nn.Linear(3, 6)

    def forward(self, x):
        theta = self.stn(x.mean((2, 3))).view(-1, 2, 3)  # affine_grid and grid_sample: a spatial transformer
        x = torch.nn.functional.grid_sample(x, torch.nn.functional.affine_grid(theta, x.size(), align_corners=True),
                                            align_corners=True)
        x = torch.nn.functional.pixel_shuffle(self.widen(torch.nn.functional.pixel_unshuffle(self.gray(x), 2)), 2)
        x = torch.nn.functional.pad(torch.nn.functional.pad(x, (1, 1, 1, 1), mode="reflect"), (0, 1, 1, 0), "replicate")
        x = torch.nn.functional.pad(torch.nn.functional.pad(x, (1, 0, 0, 1), value=0.5), (1, 0, 0, 1), mode="circular")
        y = self.up(self.norm(self.inorm(self.drop(self.lrn(self.prelu(self.frozen(self.conv(x))))))))
        y = torch.nn.functional.fractional_max_pool2d(y, 3, output_size=(20, 21))
        b, _, h, w = y.shape
        y = y + torch.linspace(-1, 1, w).view(1, 1, 1, w).expand(b, 1, h, w)  # linspace: CoordConv's columns
        y = y + torch.nn.functional.unfold(y, 3, padding=1).view(y.shape[0], 8, 9, 20, 21).mean(2)  # unfold
        y = y + torch.nn.functional.fold(torch.nn.functional.unfold(y, 2, stride=2), (20, 21), 2, stride=2)  # fold
        y = torch.nn.functional.feature_alpha_dropout(y, 0.1, True)
        y = torch.tanh(self.pool(torch.nn.functional.gelu(y))).transpose(2, 3)[:, :, 1:3]
        y = self.amax(torch.squeeze(torch.unsqueeze(torch.nn.functional.leaky_relu(y, 0.2, True), 1), 1))[:, :, :, 0]
        y = y @ y.transpose(1, 2) @ y  # matmul
        y = torch.maximum(y.flip(2), torch.roll(y, (1, -2), (1, 2))).minimum(y)  # maximum, minimum, flip, roll
        fusion = torch.nn.functional.relu(self.fusion)
        fusion = fusion / (torch.sum(fusion, dim=0) + 1e-4)
        y = fusion[0] * y + fusion[1] * y.flip(1)  # weighted_sum
        y = torch.nn.functional.mish(torch.nn.functional.elu(torch.nn.functional.rrelu(y.mean(2), 0.1, 0.3), 0.5),
                                     True)
        y = torch.nn.functional.hardtanh(torch.nn.functional.softplus(y).softmax(-1).log_softmax(1), -0.5, 0.5)
        z = torch.nn.functional.celu(torch.nn.functional.selu(torch.nn.functional.silu(y)), 0.5)
        w = self.rms(z) / torch.log(torch.exp(y[:, :4].repeat(1, 2).abs()) + 1).sqrt() + y.var(1, keepdim=True)
        unit = torch.nn.functional.normalize(w, dim=1, eps=1e-6) - torch.logsumexp(w, 1, keepdim=True) + w.cumsum(1)
        g = torch.nn.functional.hardshrink(torch.nn.functional.glu(torch.cat([w, unit], 1)), 0.25)
        g = torch.where(g >= 0.125, g, 0.0)  # where
        g = g.sort(1, descending=True)[0] + g.topk(2, 1).values.mean(1, keepdim=True)  # sort, topk
        return self.fc(torch.nn.functional.logsigmoid(self.cut(torch.nn.functional.softshrink(g, 0.125))))


#: each network's description as first described in this process: several tests read the same networks
_DESCRIBED: dict[str, NetworkDescription] = {}


def _network(name: str):
    """A real network's description: ``views`` (:class:`_Views`) or a torchvision zoo network at 64x64 (MaxViT at
    224x224, the least it takes); described once per process (seconds for the larger ones), each caller given a
    copy of its own."""
    if name not in _DESCRIBED:
        desc = describe(_Views(), input_shape=[3, 8, 8], name="views", network="views") if name == "views" else \
            describe_zoo(name, [3, 224, 224] if name == "maxvit_t" else SHAPE, num_classes=10)
        _DESCRIBED[name] = desc
    return copy.deepcopy(_DESCRIBED[name])


#: Together these use every op of the schema.
ROUND_TRIP = ["views", "shufflenet_v2_x1_0", "efficientnet_b0", "mobilenet_v2", "mobilenet_v3_small", "googlenet",
              "squeezenet1_1", "resnet18", "convnext_tiny", "vit_b_32", "swin_t", "swin_v2_t",
              "lraspp_mobilenet_v3_large", "maxvit_t"]


def test_the_round_trip_networks_cover_the_schema():
    assert {n.op for name in ROUND_TRIP for n in _network(name).nodes} == set(OPS)


@pytest.mark.parametrize("name", ROUND_TRIP)
def test_round_trip_keeps_the_description(tmp_path, name):
    desc = _network(name)
    summary = export_perfseer(_rows(desc), {desc.name: desc}, tmp_path / "ds")
    assert summary["graphs_written"] == 2
    imp = import_perfseer(tmp_path / "ds", "d2", tmp_path / "prof", tmp_path / "models")
    assert imp.networks == [desc.name] and imp.rows_written == 2
    back = load_description(tmp_path / "models" / "imported" / "d2" / f"{desc.name}.json")
    assert back.to_dict() == desc.to_dict()
    want = _output_shape(desc, 1)  # one image: a batch neither row's (2, 8), and half MaxViT's 224x224 work
    assert want == [1, 10] + desc.input_shape[1:] * (name == "lraspp_mobilenet_v3_large") \
        and _output_shape(back, 1) == want  # a segmentation network scores every pixel


@pytest.mark.parametrize("name, op", [("mobilenet_v3_small", "hardswish"), ("efficientnet_b0", "silu")])
def test_round_trip_keeps_an_activation_in_place(tmp_path, name, op):
    """torchvision's MobileNetV3 runs its hardswish in place, EfficientNet its SiLU: the description says so, and the
    exported dataset read back says so too (our metadata keeps the flag, as a mish's)."""
    desc = _network(name)
    export_perfseer(_rows(desc), {desc.name: desc}, tmp_path / "ds")
    import_perfseer(tmp_path / "ds", "d2", tmp_path / "prof", tmp_path / "models")
    back = load_description(tmp_path / "models" / "imported" / "d2" / f"{desc.name}.json")
    described, read_back = ([bool(n.attrs.get("inplace")) for n in d.nodes if n.op == op] for d in (desc, back))
    assert len(described) > 10 and all(described) and read_back == described


@pytest.mark.parametrize("name", ["views", "shufflenet_v2_x1_0", "efficientnet_b0", "mobilenet_v2", "convnext_tiny",
                                  "vit_b_32"])
def test_foreign_reading_rebuilds_the_same_network(name):
    """Without our metadata (as another tool's file is read): ONNX types and shapes alone rebuild it."""
    desc = _network(name)
    graph = pickle.loads(pickle.dumps(description_to_graph(desc, 4)))
    graph.graph["source"] = "another tool"
    back, batch = graph_to_description(graph, name, f"{name}.pkl")
    assert batch == 4 and [n.name for n in back.nodes] == [n.name for n in desc.nodes]
    assert [(n.op, n.output_shape) for n in back.nodes] == [(n.op, n.output_shape) for n in desc.nodes]
    views = [n for n in desc.nodes
             if n.op in ("reshape", "flatten", "squeeze", "unsqueeze", "transpose", "select", "narrow", "permute",
                         "layernorm", "groupnorm", "scale", "shift", "token", "attention", "conv_transpose2d",
                         "instancenorm", "hardtanh", "softmax", "pad", "pixel_shuffle", "pixel_unshuffle", "prelu",
                         "dropout2d", "log_softmax", "selu", "celu", "local_response_norm",
                         "glu", "hardshrink", "softshrink", "rmsnorm", "repeat", "rrelu", "alpha_dropout",
                         "fractional_maxpool2d",
                         "frozen_batchnorm2d")]
    # a chunk's pieces are Slices there, read as narrows of their own (no split_sizes: rebuilt as narrows, not one
    # split); every other attr as described
    assert views and all(back.node(n.name).attrs == {k: v for k, v in n.attrs.items() if k != "split_sizes"}
                         for n in views)
    # a foreign file does not say which ops ran in place (ONNX has no such notion): read without it, an in-place
    # mish's or threshold's clone of its input (StepRuntime.clones_input) is not counted
    assert network_features(back).per_sample == network_features(_out_of_place(desc)).per_sample
    assert _output_shape(back) == _output_shape(desc) == [2, 10]


def _out_of_place(desc: NetworkDescription) -> NetworkDescription:
    """``desc`` with every op out of place (its ``inplace`` attrs dropped)."""
    data = desc.to_dict()
    for node in data["nodes"]:
        node["attrs"].pop("inplace", None)
    return NetworkDescription.from_dict(data)


def test_onnx_names_of_a_permute_and_a_layer_norm_are_read():
    """A file of another tool, in ONNX's words: a Transpose moving three axes is a permute (two: a transpose), a
    LayerNormalization over the last axis normalises the channels it finds there."""
    import networkx as nx

    g = nx.DiGraph(source="another tool")
    feature = {"conv": ("Conv", {"kernel_shape": [1, 1], "group": 1}, [2, 8, 4, 4]),
               "perm": ("Transpose", {"perm": [0, 2, 3, 1]}, [2, 4, 4, 8]),
               "norm": ("LayerNormalization", {"axis": -1, "epsilon": 1e-6}, [2, 4, 4, 8]),
               "swap": ("Transpose", {"perm": [0, 1, 3, 2]}, [2, 4, 8, 4])}
    shapes = {"conv": [2, 3, 4, 4], "perm": [2, 8, 4, 4], "norm": [2, 4, 4, 8], "swap": [2, 4, 4, 8]}
    previous = None
    for name, (onnx, args, out) in feature.items():
        g.add_node(name, feature={"type": onnx, "args": args, "memory_info": {
            "batch_size": 2, "input_shape": shapes[name], "output_shape": out}})
        if previous:
            g.add_edge(previous, name)
        previous = name
    desc, batch = graph_to_description(g, "foreign", "foreign.pkl")
    assert batch == 2 and [n.op for n in desc.nodes] == ["input", "conv2d", "permute", "layernorm", "transpose"]
    assert desc.node("perm").attrs == {"dims": [0, 2, 3, 1]}
    assert desc.node("norm").attrs == {"normalized_shape": [8], "eps": 1e-6}
    assert desc.node("swap").attrs == {"dim0": 2, "dim1": 3}


def test_onnx_group_normalization_is_read_as_a_group_norm():
    """ONNX's GroupNormalization (num_groups, epsilon; its scale and bias always there) is a groupnorm over the
    channels its input has, its parameters counted."""
    import networkx as nx

    g = nx.DiGraph(source="another tool")
    g.add_node("conv", feature={"type": "Conv", "args": {"kernel_shape": [1, 1], "group": 1}, "memory_info": {
        "batch_size": 2, "input_shape": [2, 3, 4, 4], "output_shape": [2, 8, 4, 4]}})
    g.add_node("norm", feature={"type": "GroupNormalization", "args": {"num_groups": 4, "epsilon": 1e-6},
                                "memory_info": {"batch_size": 2, "input_shape": [2, 8, 4, 4],
                                                "output_shape": [2, 8, 4, 4]}})
    g.add_edge("conv", "norm")
    desc, _ = graph_to_description(g, "foreign", "foreign.pkl")
    assert desc.node("norm").op == "groupnorm"
    assert desc.node("norm").attrs == {"num_groups": 4, "num_channels": 8, "eps": 1e-6}
    assert desc.params == 3 * 8 + 8 + 2 * 8


def test_onnx_conv_transpose_is_read_as_a_transposed_convolution():
    """ONNX's ConvTranspose (kernel_shape, strides, pads, dilations, group; a bias told by the weights' bytes) is a
    conv_transpose2d; an output padding it does not give is the one its output shape takes (ONNX's output_shape)."""
    import networkx as nx

    g = nx.DiGraph(source="another tool")
    g.add_node("conv", feature={"type": "Conv", "args": {"kernel_shape": [1, 1], "group": 1}, "memory_info": {
        "batch_size": 2, "input_shape": [2, 3, 5, 5], "output_shape": [2, 8, 5, 5]}})
    g.add_node("up", feature={"type": "ConvTranspose", "args": {"kernel_shape": [3, 3], "strides": [2, 2],
                                                                 "pads": [1, 1, 1, 1], "group": 2},
                              "memory_info": {"batch_size": 2, "input_shape": [2, 8, 5, 5],
                                              "output_shape": [2, 4, 10, 10], "weight_size": 4 * 8 * 2 * 9}})
    g.add_edge("conv", "up")
    desc, _ = graph_to_description(g, "foreign", "foreign.pkl")
    assert desc.node("up").op == "conv_transpose2d"
    assert desc.node("up").attrs == {"in_channels": 8, "out_channels": 4, "kernel_size": [3, 3], "stride": [2, 2],
                                     "padding": [1, 1], "output_padding": [1, 1], "dilation": [1, 1], "groups": 2,
                                     "bias": False}
    assert desc.params == 3 * 8 + 8 + 8 * 2 * 9


def test_onnx_clip_softmax_and_instance_normalization_are_read():
    """ONNX's Clip is ReLU6 without a range or of [0, 6], a hardtanh of any other, a ReLU of a min of 0 alone (ONNX
    leaves the other bound unbounded); Softmax's axis counts the batch (the last where left out);
    InstanceNormalization (epsilon) is affine where the node has weights."""
    import networkx as nx

    g = nx.DiGraph(source="another tool")
    shape = {"batch_size": 2, "input_shape": [2, 8, 4, 4], "output_shape": [2, 8, 4, 4]}
    feature = {"conv": ("Conv", {"kernel_shape": [1, 1], "group": 1}, {**shape, "input_shape": [2, 3, 4, 4]}),
               "norm": ("InstanceNormalization", {"epsilon": 1e-3}, {**shape, "weight_size": 2 * 8 * 4}),
               "plain": ("InstanceNormalization", {}, shape),
               "six": ("Clip", {"min": 0, "max": 6}, shape), "bare": ("Clip", {}, shape),
               "clip": ("Clip", {"min": -2.5, "max": 1.0}, shape), "relu": ("Clip", {"min": 0.0}, shape),
               "soft": ("Softmax", {}, shape),
               "gate": ("Softmax", {"axis": 1}, shape)}
    previous = None
    for name, (onnx, args, info) in feature.items():
        g.add_node(name, feature={"type": onnx, "args": args, "memory_info": info})
        if previous:
            g.add_edge(previous, name)
        previous = name
    desc, _ = graph_to_description(g, "foreign", "foreign.pkl")
    assert [(n.op, n.attrs) for n in desc.nodes[2:]] == [
        ("instancenorm", {"num_features": 8, "eps": 1e-3, "affine": True}), ("instancenorm", {"num_features": 8}),
        ("relu6", {}), ("relu6", {}), ("hardtanh", {"min_val": -2.5, "max_val": 1.0}), ("relu", {}),
        ("softmax", {"dim": 3}), ("softmax", {"dim": 1})]
    assert desc.params == 3 * 8 + 8 + 2 * 8


@pytest.mark.parametrize("args", [{"min": -2.5}, {"max": 6.0}])
def test_an_onnx_clip_of_one_bound_is_refused_by_name(args):
    """ONNX's Clip leaves a bound it is not given unbounded (its min and max default to the lowest and highest
    floats): a Clip of min -2.5 alone was read as a hardtanh of [-2.5, 1] (torch's default max), a function the
    network does not compute. A one-sided clamp other than a ReLU's has no op: refused, saying why."""
    g = _foreign([("conv", "Conv", {"kernel_shape": [1, 1], "group": 1}, [2, 3, 4, 4], [2, 8, 4, 4]),
                  ("clip", "Clip", args, [2, 8, 4, 4], [2, 8, 4, 4])])
    with pytest.raises(UserError, match=r"a Clip of one bound \((min -2.5|max 6.0); ONNX leaves the other unbounded"):
        graph_to_description(g, "foreign", "foreign.pkl")


def test_onnx_prelu_and_log_softmax_are_read():
    """ONNX's PRelu (its slopes an initializer: as many as its weight_size holds floats, one where it gives none) is
    a prelu, its slopes counted; LogSoftmax's axis counts the batch (the last where left out); a PRelu whose
    weight_size is no whole number of floats is refused, naming the node."""
    import networkx as nx

    def graph(slopes_bytes):
        g = nx.DiGraph(source="another tool")
        shape = {"batch_size": 2, "input_shape": [2, 8, 4, 4], "output_shape": [2, 8, 4, 4]}
        feature = {"conv": ("Conv", {"kernel_shape": [1, 1], "group": 1}, {**shape, "input_shape": [2, 3, 4, 4]}),
                   "act": ("PRelu", {}, {**shape, "weight_size": slopes_bytes}), "one": ("PRelu", {}, shape),
                   "scores": ("LogSoftmax", {"axis": 1}, shape), "rows": ("LogSoftmax", {}, shape)}
        for i, (name, (onnx, args, info)) in enumerate(feature.items()):
            g.add_node(name, feature={"type": onnx, "args": args, "memory_info": info})
            if i:
                g.add_edge(list(feature)[i - 1], name)
        return g

    desc, _ = graph_to_description(graph(8 * 4), "foreign", "foreign.pkl")
    assert [(n.op, n.attrs) for n in desc.nodes[2:]] == [
        ("prelu", {"num_parameters": 8}), ("prelu", {"num_parameters": 1}), ("log_softmax", {"dim": 1}),
        ("log_softmax", {"dim": 3})]
    assert desc.params == 3 * 8 + 8 + 8 + 1
    with pytest.raises(UserError, match="node 'act'.*no whole number of float32 slopes"):
        graph_to_description(graph(10), "foreign", "foreign.pkl")


def _foreign(nodes: list[tuple[str, str, dict, list[int], list[int]]]):
    """A graph of another tool: (name, ONNX type, args, input shape, output shape) in a chain, at batch size 2."""
    import networkx as nx

    g = nx.DiGraph(source="another tool")
    for i, (name, onnx, args, in_shape, out) in enumerate(nodes):
        g.add_node(name, feature={"type": onnx, "args": args, "memory_info": {
            "batch_size": 2, "input_shape": in_shape, "output_shape": out}})
        if i:
            g.add_edge(nodes[i - 1][0], name)
    return g


def test_onnx_selu_and_celu_are_read_and_a_selu_of_other_constants_refused():
    """ONNX's Selu of its default alpha and gamma (float32's of torch's SELU) is a selu, its Celu (alpha, 1 where
    left out) a celu, its LRN (size; alpha, beta and bias, torch's k, defaults where left out) a local_response_norm;
    a Selu of another gamma computes what no torch SELU does: refused by name."""
    g = _foreign([("conv", "Conv", {"kernel_shape": [1, 1], "group": 1}, [2, 3, 4, 4], [2, 3, 4, 4]),
                  ("selu", "Selu", {"alpha": 1.67326319217681884765625, "gamma": 1.05070102214813232421875},
                   [2, 3, 4, 4], [2, 3, 4, 4]),
                  ("celu", "Celu", {"alpha": 0.5}, [2, 3, 4, 4], [2, 3, 4, 4]),
                  ("plain", "Celu", {}, [2, 3, 4, 4], [2, 3, 4, 4]),
                  ("lrn", "LRN", {"size": 3, "bias": 2.0}, [2, 3, 4, 4], [2, 3, 4, 4])])
    desc, _ = graph_to_description(g, "foreign", "foreign.pkl")
    assert [(n.op, n.attrs) for n in desc.nodes[2:]] == [
        ("selu", {}), ("celu", {"alpha": 0.5}), ("celu", {"alpha": 1.0}),
        ("local_response_norm", {"size": 3, "alpha": 1e-4, "beta": 0.75, "k": 2.0})]
    g = _foreign([("conv", "Conv", {"kernel_shape": [1, 1], "group": 1}, [2, 3, 4, 4], [2, 3, 4, 4]),
                  ("selu", "Selu", {"gamma": 2.0}, [2, 3, 4, 4], [2, 3, 4, 4])])
    with pytest.raises(UserError, match="a Selu of gamma 2.0 is no torch SELU"):
        graph_to_description(g, "foreign", "foreign.pkl")


def test_onnx_shrinks_and_a_thresholded_relu_are_read_and_a_shrink_of_another_bias_refused():
    """ONNX's Shrink of bias 0 (its default) is a hardshrink, of a bias of its lambd a softshrink (lambd 0.5 where
    left out); its ThresholdedRelu (alpha, 1 where left out) a threshold of value 0. A Shrink of another bias shifts
    what no torch shrink does: refused by name."""
    g = _foreign([("conv", "Conv", {"kernel_shape": [1, 1], "group": 1}, [2, 3, 4, 4], [2, 3, 4, 4]),
                  ("hard", "Shrink", {"lambd": 0.25}, [2, 3, 4, 4], [2, 3, 4, 4]),
                  ("soft", "Shrink", {"lambd": 0.25, "bias": 0.25}, [2, 3, 4, 4], [2, 3, 4, 4]),
                  ("plain", "Shrink", {}, [2, 3, 4, 4], [2, 3, 4, 4]),
                  ("thr", "ThresholdedRelu", {"alpha": 0.5}, [2, 3, 4, 4], [2, 3, 4, 4]),
                  ("thr1", "ThresholdedRelu", {}, [2, 3, 4, 4], [2, 3, 4, 4])])
    desc, _ = graph_to_description(g, "foreign", "foreign.pkl")
    assert [(n.op, n.attrs) for n in desc.nodes[2:]] == [
        ("hardshrink", {"lambd": 0.25}), ("softshrink", {"lambd": 0.25}), ("hardshrink", {"lambd": 0.5}),
        ("threshold", {"threshold": 0.5, "value": 0.0}), ("threshold", {"threshold": 1.0, "value": 0.0})]
    g = _foreign([("conv", "Conv", {"kernel_shape": [1, 1], "group": 1}, [2, 3, 4, 4], [2, 3, 4, 4]),
                  ("odd", "Shrink", {"lambd": 0.25, "bias": 0.5}, [2, 3, 4, 4], [2, 3, 4, 4])])
    with pytest.raises(UserError, match="a Shrink of bias 0.5 and lambd 0.25 has no description op"):
        graph_to_description(g, "foreign", "foreign.pkl")


def test_onnx_pads_and_depth_to_space_are_read():
    """ONNX's Pad (pads as begins then ends of each of the four NCHW axes, or of axes 2 and 3; mode edge is a
    replication; a constant_value) is a pad of [left, right, top, bottom]; a DepthToSpace of mode CRD is a pixel
    shuffle, and a SpaceToDepth of one channel a pixel unshuffle; a Pad of mode wrap (opset 19) is a circular pad."""
    g = _foreign([("gray", "Conv", {"kernel_shape": [1, 1], "group": 1}, [2, 3, 4, 4], [2, 1, 4, 4]),
                  ("s2d", "SpaceToDepth", {"blocksize": 2}, [2, 1, 4, 4], [2, 4, 2, 2]),
                  ("d2s", "DepthToSpace", {"blocksize": 2, "mode": "CRD"}, [2, 4, 2, 2], [2, 1, 4, 4]),
                  ("edge", "Pad", {"mode": "edge", "pads": [0, 0, 1, 2, 0, 0, 3, 0]}, [2, 1, 4, 4], [2, 1, 8, 6]),
                  ("value", "Pad", {"pads": [1, 0, 0, 1], "axes": [2, 3], "constant_value": 0.5}, [2, 1, 8, 6],
                   [2, 1, 9, 7]),
                  ("wrap", "Pad", {"mode": "wrap", "pads": [0, 0, 0, 2, 0, 0, 1, 0]}, [2, 1, 9, 7], [2, 1, 10, 9])])
    desc, _ = graph_to_description(g, "foreign", "foreign.pkl")
    assert [n.op for n in desc.nodes[2:]] == ["pixel_unshuffle", "pixel_shuffle", "pad", "pad", "pad"]
    assert desc.node("edge").attrs == {"pads": [2, 0, 1, 3], "mode": "replicate"}
    assert desc.node("value").attrs == {"pads": [0, 1, 1, 0], "mode": "constant", "value": 0.5}
    assert desc.node("wrap").attrs == {"pads": [2, 0, 0, 1], "mode": "circular"}


class _Upsampled(torch.nn.Module):
    """A decoder's step: a convolution's map upsampled by 2 (nearest) and joined to the input."""

    def __init__(self):
        super().__init__()
        self.conv, self.up = torch.nn.Conv2d(3, 4, 3, stride=2, padding=1), torch.nn.Upsample(scale_factor=2)

    def forward(self, x):
        return torch.cat([self.up(self.conv(x)), x], 1)


def test_a_resize_by_a_whole_scale_factor_keeps_it_through_export_and_import(tmp_path):
    """A resize by a scale factor of 2 comes back with it, from our own file and from another tool's (ONNX's
    Resize: scales of the four NCHW axes, maybe as text), so the imported description rebuilds at another input
    shape; a factor that does not give the output's size, or is no whole number, is read as the size alone."""
    desc = describe(_Upsampled(), [3, 8, 8], name="up")
    assert desc.node("up").attrs == {"size": [8, 8], "mode": "nearest", "scale_factor": [2, 2]}
    export_perfseer(_rows(desc), {desc.name: desc}, tmp_path / "ds")
    import_perfseer(tmp_path / "ds", "d2", tmp_path / "prof", tmp_path / "models")
    assert load_description(tmp_path / "models" / "imported" / "d2" / "up.json").to_dict() == desc.to_dict()
    for scales, side, out, kept in ((None, 4, [8, 8], None), ([1.0, 1.0, 2.0, 2.0], 4, [8, 8], [2, 2]),
                                    ("[1, 1, 2, 3]", 4, [8, 12], [2, 3]), ("2", 4, [8, 8], [2, 2]),
                                    ([1, 1, 1.5, 1.5], 4, [6, 6], None),
                                    ([1, 1, 2, 2], 3, [8, 8], None)):  # 3 x 2 is not 8: the size alone
        args = {"mode": "nearest", **({} if scales is None else {"scales": scales})}
        g = _foreign([("conv", "Conv", {"kernel_shape": [1, 1], "group": 1}, [2, 3, side, side], [2, 4, side, side]),
                      ("resize", "Resize", args, [2, 4, side, side], [2, 4, *out])])
        attrs = graph_to_description(g, "foreign", "foreign.pkl")[0].node("resize").attrs
        assert attrs == {"size": out, "mode": "nearest", **({"scale_factor": kept} if kept else {})}, scales
    graph = description_to_graph(desc, 2)
    graph.graph["source"] = "another tool"  # our args read as a foreign file's
    back = graph_to_description(graph, "up", "up.pkl")[0]
    assert back.node("up").attrs == desc.node("up").attrs
    assert _output_shape(described_at(back, [3, 16, 12])) == [2, 7, 16, 12]


class _SizedBySkips(torch.nn.Module):
    """A decoder's two joins at odd sides: a map resized to its skip's size (``size=skip.shape[-2:]``) and one padded
    to it as a U-Net's ``Up`` block pads (the odd pixel after)."""

    def __init__(self):
        super().__init__()
        self.down, self.pool = torch.nn.Conv2d(3, 4, 3, stride=2, padding=1), torch.nn.MaxPool2d(2)
        self.again = torch.nn.Conv2d(4, 3, 3, stride=2, padding=1)

    def forward(self, x):
        y = self.down(x)
        resized = torch.nn.functional.interpolate(y, size=x.shape[-2:], mode="bilinear")
        low = self.pool(x)
        dy, dx = y.size()[2] - low.size()[2], y.size()[3] - low.size()[3]
        padded = torch.nn.functional.pad(low, [dx // 2, dx - dx // 2, dy // 2, dy - dy // 2])
        return self.again(resized) + padded


def test_a_size_read_off_another_map_keeps_it_through_export_and_import(tmp_path):
    """A resize to another map's size (size_of) and a U-Net's pad to it (pad_to) come back naming that map, from our
    own file and from it read as another tool's, so the imported description rebuilds at another input shape."""
    desc = describe(_SizedBySkips(), [3, 9, 11], name="skips")
    sized = {n.op: n.attrs for n in desc.nodes if "size_of" in n.attrs or "pad_to" in n.attrs}
    assert sized["interpolate"]["size_of"] == "input" and sized["pad"]["pad_to"] == "down"
    export_perfseer(_rows(desc), {desc.name: desc}, tmp_path / "ds")
    import_perfseer(tmp_path / "ds", "d2", tmp_path / "prof", tmp_path / "models")
    assert load_description(tmp_path / "models" / "imported" / "d2" / "skips.json").to_dict() == desc.to_dict()
    graph = description_to_graph(desc, 2)
    graph.graph["source"] = "another tool"  # our args read as a foreign file's
    back = graph_to_description(graph, "skips", "skips.pkl")[0]
    assert [n.attrs for n in back.nodes[1:]] == [n.attrs for n in desc.nodes[1:]]
    assert _output_shape(described_at(back, [3, 14, 17])) == [2, 3, 7, 9]


class _PaddedBefore(torch.nn.Module):
    """A map padded to the input's size by the whole difference before it (no U-Net's split): numbers of the trace."""

    def __init__(self):
        super().__init__()
        self.conv = torch.nn.Conv2d(3, 3, 3, stride=2)

    def forward(self, x):
        y = self.conv(x)
        return torch.nn.functional.pad(y, [x.size()[3] - y.size()[3], 0, x.size()[2] - y.size()[2], 0]) + x


def test_a_pad_computed_from_sizes_stays_marked_through_export_and_import(tmp_path):
    """A pad whose numbers the trace computed from the sizes (pads_computed) comes back marked from our own file and
    from it read as another tool's, so the imported description is refused at another input shape by name, not
    rebuilt padding the traced numbers."""
    desc = describe(_PaddedBefore(), [3, 9, 11], name="before")
    assert desc.nodes[-2].attrs == {"pads": [6, 0, 5, 0], "mode": "constant", "pads_computed": True}
    export_perfseer(_rows(desc), {desc.name: desc}, tmp_path / "ds")
    import_perfseer(tmp_path / "ds", "d2", tmp_path / "prof", tmp_path / "models")
    assert load_description(tmp_path / "models" / "imported" / "d2" / "before.json").to_dict() == desc.to_dict()
    graph = description_to_graph(desc, 2)
    graph.graph["source"] = "another tool"
    back = graph_to_description(graph, "before", "before.pkl")[0]
    assert back.nodes[-2].attrs == desc.nodes[-2].attrs
    with pytest.raises(UserError, match=rf"^before: {desc.nodes[-2].name} pads by numbers its trace computed"):
        described_at(back, [3, 14, 17])


@pytest.mark.parametrize("onnx, args, in_shape, out, message", [
    ("DepthToSpace", {"blocksize": 2}, [2, 8, 2, 2], [2, 2, 4, 4], "mode DCR"),
    ("SpaceToDepth", {"blocksize": 2}, [2, 2, 4, 4], [2, 8, 2, 2], "more than one channel"),
    ("Pad", {"mode": "wrap", "pads": [0, 0, 5, 0, 0, 0, 0, 0]}, [2, 2, 4, 4], [2, 2, 9, 4], "wraps"),
    ("Pad", {"pads": [0, 1, 0, 0, 0, 1, 0, 0]}, [2, 2, 4, 4], [2, 4, 4, 4], "more than the height and width")])
def test_onnx_layers_that_no_description_op_computes_are_refused_by_name(onnx, args, in_shape, out, message):
    """A DepthToSpace of mode DCR and a SpaceToDepth of more than one channel order their channels as neither of
    torch's pixel shuffles does; a wrap (circular) pad wider than the map wraps more than once, which torch refuses;
    a pad of the channels has no op: each refused, saying why."""
    g = _foreign([("conv", "Conv", {"kernel_shape": [1, 1], "group": 1}, [2, 3] + in_shape[2:], in_shape),
                  ("layer", onnx, args, in_shape, out)])
    with pytest.raises(UserError, match=message):
        graph_to_description(g, "foreign", "foreign.pkl")


def test_an_unshuffle_of_several_channels_is_not_exported_as_space_to_depth(tmp_path):
    """torch's pixel_unshuffle of more than one channel orders its output channels otherwise than ONNX's
    SpaceToDepth: the export refuses it by name and writes nothing."""
    class Unshuffled(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.conv, self.fc = torch.nn.Conv2d(3, 2, 1), torch.nn.Linear(8, 10)

        def forward(self, x):
            return self.fc(torch.nn.functional.pixel_unshuffle(self.conv(x), 2).mean((2, 3)))

    desc = describe(Unshuffled(), [3, 8, 8], "unshuffled")
    with pytest.raises(UserError, match="'pixel_unshuffle' with no PerfSeer"):
        export_perfseer(_rows(desc), {desc.name: desc}, tmp_path / "ds")
    assert not (tmp_path / "ds").exists()


class _Squeezer(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = torch.nn.Conv2d(3, 4, 3)
        self.pool = torch.nn.AdaptiveAvgPool2d(1)

    def forward(self, x):
        return self.pool(self.conv(x)).squeeze(3).squeeze(2)


def test_an_op_without_onnx_type_stops_before_any_file(tmp_path, monkeypatch):
    """The check covers every network first: the second network's op stops the export, nothing written."""
    fine = describe_zoo("squeezenet1_1", SHAPE, num_classes=10)
    squeezer = describe(_Squeezer(), input_shape=[3, 8, 8], name="squeezer", network="squeezer")
    assert "squeeze" in {n.op for n in squeezer.nodes}
    monkeypatch.delitem(OP_TO_ONNX, "squeeze")  # as if the schema had gained an op the table lacks
    rows = _rows(fine) + [{**r, "device": "jetson7"} for r in _rows(squeezer)]
    with pytest.raises(UserError,
                       match=r"device 'jetson7' network 'squeezer' node '\w+' has op 'squeeze'.*nothing written"):
        export_perfseer(rows, {fine.name: fine, squeezer.name: squeezer}, tmp_path / "ds")
    assert not (tmp_path / "ds").exists()


def test_a_softplus_onnx_cannot_write_stops_the_export(tmp_path):
    """ONNX's Softplus has no beta or threshold: a softplus of other than torch's defaults (beta 1, threshold 20)
    stops the export, nothing written."""
    net = torch.nn.Sequential(torch.nn.Conv2d(3, 4, 3), torch.nn.Softplus(2.0), torch.nn.Flatten(),
                              torch.nn.Linear(144, 10))
    desc = describe(net, input_shape=[3, 8, 8], name="steep", network="steep")
    with pytest.raises(UserError, match=r"network 'steep' node '\w+' has op 'softplus'.*nothing written"):
        export_perfseer(_rows(desc), {desc.name: desc}, tmp_path / "ds")
    assert not (tmp_path / "ds").exists()


def test_cpu_rows_come_back_whole(tmp_path):
    """Every column of a cpu-backend row survives (peak_rss_mb stays peak_rss_mb; mean, spread, steps,
    protocol kept); a figure not measured stays an empty cell, never the text 'nan'."""
    desc = describe_zoo("resnet18", SHAPE, num_classes=10)
    src = results_path(tmp_path / "prof", "cpu1")
    for b in (1, 4):
        append_row(src, {"device": "cpu1", "backend": "cpu", "network": desc.name, "family": "resnet18",
                         "pruning_level": 0, "batch_size": b, "input_shape": "3x64x64", "phase": "train",
                         "status": "ok", "latency_ms_median": 31.25 * b, "latency_ms_mean": 33.5 * b,
                         "latency_ms_p10": 30.0 * b, "latency_ms_p90": 36.0 * b, "latency_ms_std": 1.5,
                         "timed_steps": 5, "warmup_steps": 2, "protocol": "perf_counter", "repeats": 1,
                         "peak_rss_mb": 712.4 + b, "baseline_rss_mb": 650.0, "threads": 1,
                         "torch_version": "2.4.0", "device_model": "Some CPU", "hostname": "h1",
                         "timestamp": "2025-01-01T00:00:00+00:00", "description_sha": "0123456789abcdef"})
    append_row(src, {"device": "cpu1", "backend": "cpu", "network": desc.name, "batch_size": 64, "phase": "train",
                     "input_shape": "3x64x64", "status": "oom", "message": "peak RSS over the limit",
                     "timestamp": "2025-01-01T00:00:00+00:00"})
    rows = read_rows(src)
    assert memory_column(rows) == "peak_rss_mb"
    assert export_perfseer(rows, {desc.name: desc}, tmp_path / "ds", memory_column(rows))["graphs_written"] == 2
    import_perfseer(tmp_path / "ds", "cpu2", tmp_path / "prof", tmp_path / "models")
    back = read_rows(results_path(tmp_path / "prof", "cpu2"))
    assert len(back) == 2 and memory_column(back) == "peak_rss_mb"
    written = (tmp_path / "models" / "imported" / "cpu2" / f"{desc.name}.json").read_bytes()
    for orig, new in zip(rows[:2], sorted(back, key=lambda r: int(r["batch_size"]))):
        assert new["device"] == "cpu2" and new["device_mem_used_mb"] == "" and new["gpu_util_pct"] == ""
        assert new["description_sha"] == hashlib.sha256(written).hexdigest()[:16]
        same = {k for k in orig if k not in ("device", "timestamp", "description_sha")}
        assert {k: new[k] for k in same} == {k: orig[k] for k in same}


def test_foreign_nan_figures_are_empty_cells(tmp_path):
    desc = describe_zoo("squeezenet1_1", SHAPE, num_classes=10)
    graph = description_to_graph(desc, 4)
    graph.graph["source"] = "another tool"
    (tmp_path / "s_bs4.pkl").write_bytes(pickle.dumps(graph))
    (tmp_path / "s_bs4.txt").write_text("{'train': '12.5|nan|nan|nan|nan|nan|300.0', "
                                        "'infer': 'nan|nan|nan|nan|nan|nan|nan'}")
    import_perfseer(tmp_path, "g", tmp_path / "prof", tmp_path / "models")
    (row,) = read_rows(results_path(tmp_path / "prof", "g"))
    assert row["gpu_util_pct"] == "" and float(row["latency_ms_mean"]) == 12.5
    assert float(row["device_mem_used_mb"]) == 300.0 and "nan" not in row.values()


@pytest.fixture(scope="module")
def tx2_round_trip(tmp_path_factory):
    """The TX2 data imported (device tx2), exported and imported again (device tx2b)."""
    if not (TX2 / "profiling_csvs").is_dir():
        pytest.skip(f"the TX2 measurements are not at {TX2} (shared data absent on this machine)")
    root = tmp_path_factory.mktemp("tx2")
    prof, models = root / "prof", root / "models"
    import_perf4sight(TX2, "tx2", prof, models)
    rows = read_rows(results_path(prof, "tx2"))
    descs = {d.name: d for d in map(load_description, sorted((models / "imported" / "tx2").glob("*.json")))}
    done = export_perfseer(rows, descs, root / "ds", memory_column(rows))
    import_perfseer(root / "ds", "tx2b", prof, models)
    return rows, done, models, read_rows(results_path(prof, "tx2b"))


def test_tx2_descriptions_come_back_byte_identical(tx2_round_trip):
    _, _, models, _ = tx2_round_trip
    before = sorted((models / "imported" / "tx2").glob("*.json"))
    assert len(before) == 58
    for p in before:
        assert (models / "imported" / "tx2b" / p.name).read_bytes() == p.read_bytes(), p.name
    for name in ("mobilenetv2_0", "squeezenet_0"):
        assert _output_shape(load_description(models / "imported" / "tx2b" / f"{name}.json")) == [2, 1000]
    resnet = [load_description(models / "imported" / d / "resnet50_0.json") for d in ("tx2", "tx2b")]
    a, b = (simulate(d).peaks_mb([8]) for d in resnet)
    assert (a == b).all()  # the allocator model follows node order: a reordered graph moved it by 7 MiB


def test_tx2_rows_come_back_identical(tx2_round_trip):
    rows, done, _, back = tx2_round_trip
    ok = {(r["network"], r["batch_size"]): r for r in rows if r["status"] == "ok"}
    # 1,401 rows: 870 ok, 531 oom (one of them the step that thrashed)
    assert done["graphs_written"] == len(ok) == len(back) == 870
    for r in back:
        orig = ok[(r["network"], r["batch_size"])]
        assert {k: v for k, v in r.items() if k not in ("device", "timestamp")} == \
               {k: v for k, v in orig.items() if k not in ("device", "timestamp")}
        assert not any(v == "nan" or (v and v.lower() == "nan") for v in r.values())
    assert not math.isnan(float(back[0]["latency_ms_median"]))


def test_onnx_rms_normalization_is_read():
    """ONNX's RMSNormalization (opset 23) is an rmsnorm over the dimensions from its axis (-1 where left out), of its
    epsilon (ONNX's 1e-5 where left out, not torch's None); this tool's own export keeps torch's None by leaving eps
    out beside its normalized_shape, and a norm without a weight."""
    g = _foreign([("conv", "Conv", {"kernel_shape": [1, 1], "group": 1}, [2, 3, 4, 4], [2, 3, 4, 4]),
                  ("last", "RMSNormalization", {}, [2, 3, 4, 4], [2, 3, 4, 4]),
                  ("map", "RMSNormalization", {"axis": 1, "epsilon": 1e-6}, [2, 3, 4, 4], [2, 3, 4, 4]),
                  ("ours", "RMSNormalization", {"normalized_shape": [4, 4], "elementwise_affine": False},
                   [2, 3, 4, 4], [2, 3, 4, 4])])
    desc, _ = graph_to_description(g, "foreign", "foreign.pkl")
    assert [(n.op, n.attrs) for n in desc.nodes[2:]] == [
        ("rmsnorm", {"normalized_shape": [4], "eps": 1e-5}), ("rmsnorm", {"normalized_shape": [3, 4, 4], "eps": 1e-6}),
        ("rmsnorm", {"normalized_shape": [4, 4], "elementwise_affine": False})]
    assert desc.params == 3 * 3 + 3 + 4 + 48


def test_onnx_tile_is_read_and_one_of_the_batch_refused():
    """ONNX's Tile (its repeats an input there, an arg here: one per dimension, the batch's first) is a repeat of the
    counts after the batch's, as this tool's own export writes them; a Tile of the batch is refused by name."""
    g = _foreign([("conv", "Conv", {"kernel_shape": [1, 1], "group": 1}, [2, 3, 4, 4], [2, 3, 4, 4]),
                  ("tile", "Tile", {"repeats": [1, 2, 1, 3]}, [2, 3, 4, 4], [2, 6, 4, 12]),
                  ("ours", "Tile", {"repeats": [1, 2, 1]}, [2, 6, 4, 12], [2, 6, 8, 12])])
    desc, _ = graph_to_description(g, "foreign", "foreign.pkl")
    assert [(n.op, n.attrs, n.output_shape) for n in desc.nodes[2:]] == [
        ("repeat", {"repeats": [2, 1, 3]}, [6, 4, 12]), ("repeat", {"repeats": [1, 2, 1]}, [6, 8, 12])]
    g = _foreign([("conv", "Conv", {"kernel_shape": [1, 1], "group": 1}, [2, 3, 4, 4], [2, 3, 4, 4]),
                  ("tile", "Tile", {"repeats": [2, 1, 1, 1]}, [2, 3, 4, 4], [4, 3, 4, 4])])
    with pytest.raises(UserError, match=r"a Tile of \[2, 1, 1, 1\] tiles the batch"):
        graph_to_description(g, "foreign", "foreign.pkl")


class _Norms(torch.nn.Module):
    """A convolution, then ``norm`` (a layer, or a functional call of its own statistics in a constant mode: ``flag``
    given), then a classifier of the channels' means."""

    def __init__(self, norm, flag=None) -> None:
        super().__init__()
        self.conv, self.norm, self.fc = torch.nn.Conv2d(3, 8, 3, padding=1), norm, torch.nn.Linear(8, 4)
        self.flag = flag
        self.register_buffer("mean", torch.zeros(8))
        self.register_buffer("var", torch.ones(8))

    def forward(self, x):
        y = self.conv(x)
        y = self.norm(y) if self.flag is None else self.norm(y, self.mean, self.var, None, None, self.flag)
        return self.fc(y.mean((2, 3)))


@pytest.mark.parametrize("norm, flag", [
    (torch.nn.functional.batch_norm, False), (torch.nn.functional.batch_norm, True),
    (torch.nn.functional.instance_norm, False),
    (torch.nn.BatchNorm2d(8, eps=1e-3, affine=False, momentum=None), None),
    (torch.nn.BatchNorm2d(8, track_running_stats=False), None),
])
def test_foreign_reading_keeps_a_norm_s_own_args(norm, flag):
    """Without our metadata a batchnorm2d was read as its channels alone and an instancenorm without its constant
    mode: a functional call's ``training`` (``use_input_stats``) was lost (the rebuilt layer then followed the step's
    mode, and the allocation model covered a step it leaves to the trace), as were a batch norm's eps, affine false
    (16 parameters more), track_running_stats false and null momentum. Our args are read for them now, as they are
    for an instance norm (an ONNX momentum, 1 - torch's, is still not read)."""
    desc = describe(_Norms(norm, flag), [3, 8, 8], "norms")
    graph = pickle.loads(pickle.dumps(description_to_graph(desc, 2)))
    graph.graph["source"] = "another tool"
    back = graph_to_description(graph, "norms", "norms.pkl")[0]
    assert [(n.op, n.attrs) for n in back.nodes] == [(n.op, n.attrs) for n in desc.nodes]
    assert back.params == desc.params
