"""bench/bench_op_breakdown.py: a real training step profiled by op, its categories, and the pools' features."""
from __future__ import annotations

import pytest

from perf4sight.dataset import read_manifest
from perf4sight.ir.schema import Node, save_description

from bench_module import load_bench
from tiny_graphs import conv_node, tiny_description


def _bench():
    return load_bench("bench_op_breakdown")


def test_ops_fall_in_their_categories():
    bench = _bench()
    expected = {"aten::convolution_backward": "conv", "aten::mkldnn_convolution": "conv",
                "aten::native_batch_norm_backward": "batch norm", "aten::threshold_backward": "activation",
                "aten::max_pool2d_with_indices_backward": "pooling", "aten::cat": "cat/copy", "aten::addmm": "linear",
                "aten::_log_softmax": "loss", "aten::add_": "other elementwise", "aten::empty": "framework",
                "Optimizer.step#SGD.step": "framework"}
    assert {op: bench.category(op) for op in expected} == expected


def test_a_profiled_step_adds_up_and_its_pools_are_counted(tmp_path):
    """One network in a fresh process: every category's time sums to the step, the convolutions and the pool take
    some of it, and the pool's window work is its output times its 3x3 window, each way."""
    bench = _bench()
    desc = tiny_description([Node("input", "input", [], {}, [4, 8, 8]),
                             conv_node("c", "input", 4, 8, 3, 1, 8),
                             Node("p", "maxpool2d", ["c"], {"kernel_size": [3, 3], "stride": [1, 1],
                                                            "padding": [1, 1], "ceil_mode": False}, [8, 8, 8]),
                             Node("flat", "flatten", ["p"], {"start_dim": 1}, [512]),
                             Node("fc", "linear", ["flat"], {"in_features": 512, "out_features": 5, "bias": True},
                                  [5])])
    save_description(desc, tmp_path / "tiny.json")
    (tmp_path / "manifest.csv").write_text("network,family,path\ntiny,tiny,tiny.json\n")
    nets = read_manifest(tmp_path / "manifest.csv")
    (rec,) = bench.profile_networks(tmp_path, nets, [4])
    assert rec["network"] == "tiny" and rec["batch_size"] == 4 and rec["step_ms"] > 0
    assert sum(rec["ms"].values()) == pytest.approx(rec["step_ms"])
    assert rec["ms"]["conv"] > 0 and rec["ms"]["pooling"] > 0 and rec["ms"]["linear"] > 0
    window, nbytes, count = bench.pool_features(tmp_path, nets)["tiny"]
    assert (window, count) == (2 * 512 * 9, 1.0) and nbytes == 2 * 512 * 4
