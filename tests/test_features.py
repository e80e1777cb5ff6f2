"""Per-op formulas on hand-checked tiny graphs, aggregation, batch scaling, TX2 params."""
from __future__ import annotations

import numpy as np
import pytest

from perf4sight.features import FEATURE_NAMES, feature_matrix, features_for, network_features, unsupported_ops
from perf4sight.features.formulas import HANDLERS
from perf4sight.ir.schema import OPS, NetworkDescription, Node, count_params, load_description


def _conv(name, src, cin, cout, k, groups, out_hw, bias=False, stride=1):
    return Node(name, "conv2d", [src], {"in_channels": cin, "out_channels": cout, "kernel_size": [k, k],
                                        "stride": [stride, stride], "padding": [k // 2, k // 2], "dilation": [1, 1],
                                        "groups": groups, "bias": bias}, [cout, out_hw, out_hw])


def _desc(nodes, shape=(4, 8, 8)):
    d = NetworkDescription("tiny", "tiny", list(shape), 5, 0, nodes, nodes[-1].name)
    d.params = count_params(d)
    return d


def _cost(node, in_shapes, first=False):
    return HANDLERS[node.op](node, in_shapes, first)


def test_depthwise_conv_by_hand():
    node = _conv("dw", "input", 4, 4, 3, 4, 8)
    c = _cost(node, [[4, 8, 8]], first=True)
    assert c.kind == "depthwise"
    assert c.macs == 8 * 8 * 4 * 1 * 9  # one input channel per output channel
    assert c.params == 4 * 9
    assert c.flops_fwd == 2 * c.macs
    assert c.flops_bwd == 2 * c.macs  # first layer: weight gradient only
    c2 = _cost(node, [[4, 8, 8]], first=False)
    assert c2.flops_bwd == 4 * c.macs and c2.kernels_bwd == 2


def test_grouped_conv_by_hand():
    node = _conv("g", "x", 8, 16, 3, 2, 4, bias=True, stride=2)
    c = _cost(node, [[8, 8, 8]])
    assert c.kind == "grouped"
    assert c.macs == 4 * 4 * 16 * (8 // 2) * 9 == 9216
    assert c.params == 16 * 4 * 9 + 16
    assert c.flops_fwd == 2 * 9216 + 16 * 16  # + one bias add per output element
    assert c.bytes_read == (8 * 8 * 8 + c.params) * 4
    assert c.bytes_written == 16 * 4 * 4 * 4


def test_linear_by_hand():
    node = Node("fc", "linear", ["x"], {"in_features": 10, "out_features": 5, "bias": True}, [5])
    c = _cost(node, [[10]])
    assert (c.macs, c.params, c.flops_fwd) == (50, 55, 105)
    assert c.flops_bwd == 2 * 50 + 2 * 50 + 5


def test_every_schema_op_has_a_formula():
    assert set(OPS) <= set(HANDLERS)


def _tiny():
    return _desc([
        Node("input", "input", [], {}, [4, 8, 8]),
        _conv("c1", "input", 4, 8, 3, 1, 8),
        Node("bn", "batchnorm2d", ["c1"], {"num_features": 8}, [8, 8, 8]),
        Node("r", "relu", ["bn"], {}, [8, 8, 8]),
        _conv("dw", "r", 8, 8, 3, 8, 8),
        Node("add", "add", ["dw", "r"], {}, [8, 8, 8]),
        Node("pool", "adaptiveavgpool2d", ["add"], {"output_size": [1, 1]}, [8, 1, 1]),
        Node("flat", "reshape", ["pool"], {"shape": [-1]}, [8]),
        Node("fc", "linear", ["flat"], {"in_features": 8, "out_features": 5, "bias": True}, [5]),
    ])


def test_network_aggregation_by_hand():
    d = _tiny()
    nf = network_features(d)
    assert nf.unsupported == []
    dense = 64 * 8 * 4 * 9
    dw = 64 * 8 * 9
    assert nf.per_sample["dense_macs"] == dense and nf.per_sample["depthwise_macs"] == dw
    assert nf.per_sample["macs"] == dense + dw + 40
    assert nf.static["params"] == d.params == 8 * 4 * 9 + 16 + 8 * 9 + 45
    assert nf.static["depth"] == 3  # c1 -> dw -> fc
    assert nf.static["branch_nodes"] == 1 and nf.static["n_add"] == 1  # r feeds dw and add
    # saved for backward: c1 out (bn input), r out (relu output, dw input), flat->pool (fc input,
    # a view resolved to pool); the network input is counted in input_bytes, not here
    assert nf.per_sample["saved_bytes"] == (512 + 512 + 8) * 4 + 2 * 8 * 4  # + bn mean/invstd
    assert nf.per_sample["max_activation_bytes"] == 512 * 4


def test_features_scale_with_batch_size_and_batched_path_agrees():
    nf = network_features(_tiny())
    f1, f8 = features_for(nf, 1), features_for(nf, 8)
    assert f8["macs"] == 8 * f1["macs"] and f8["saved_bytes"] == 8 * f1["saved_bytes"]
    assert f8["params"] == f1["params"] and f8["kernels"] == f1["kernels"] > 0
    expected_mem = (3 * f1["params"] * 4 + 8 * (f1["saved_bytes"] + f1["max_activation_bytes"] + f1["input_bytes"])) / 2**20
    assert f8["mem_analytic_mb"] == pytest.approx(expected_mem)
    M = feature_matrix(nf, [1, 8, 32])
    assert M.shape == (3, len(FEATURE_NAMES))
    np.testing.assert_allclose(M[1], [f8[k] for k in FEATURE_NAMES])
    M2 = feature_matrix([nf, nf], [8, 1])
    np.testing.assert_allclose(M2[0], M[1])


def test_unsupported_op_is_reported_not_zero():
    d = _tiny()
    d.nodes.insert(4, Node("weird", "fancy_op", ["r"], {}, [8, 8, 8]))
    assert unsupported_ops(d) == ["fancy_op"]
    assert network_features(d).unsupported == ["weird (fancy_op)"]


def test_tx2_graph_params_match(tx2_data):
    files = sorted((tx2_data / "graphs").glob("*.json"))
    assert len(files) == 58
    for f in files:
        d = load_description(f)
        nf = network_features(d)
        assert nf.unsupported == [], f.name
        assert nf.static["params"] == d.params, f.name


def test_tx2_resnet18_macs_are_textbook(tx2_data):
    nf = network_features(load_description(tx2_data / "graphs" / "resnet18_0.json"))
    assert nf.per_sample["macs"] == pytest.approx(1.814e9, rel=0.01)  # the well-known 1.8 GMACs
    assert nf.per_sample["depthwise_macs"] == 0
