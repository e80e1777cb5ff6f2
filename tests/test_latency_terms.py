"""Kernel-level latency terms: hand-checked GEMM dims, tile padding, kernel counts, batch scaling."""
from __future__ import annotations

import numpy as np
import pytest

from perf4sight.features import FEATURE_NAMES, feature_matrix, features_for, network_features
from perf4sight.features.latency_terms import (BANDWIDTH, DEPTHWISE, GEMM, LATENCY_FEATURES, TILE, kernel_table,
                                               latency_columns)
from perf4sight.ir.schema import Node


from tiny_graphs import conv_node as _conv, tiny_description as _desc  # noqa: E402


def _two_convs(cout2=16, stride=1):
    out = 8 // stride
    return _desc([Node("input", "input", [], {}, [4, 8, 8]),
                  _conv("c1", "input", 4, 8, 3, 1, 8),
                  Node("r1", "relu", ["c1"], {}, [8, 8, 8]),
                  _conv("c2", "r1", 8, cout2, 3, 1, out, stride=stride)])


def _col(F, name):
    return F[:, LATENCY_FEATURES.index(name)]


def test_gemm_rows_by_hand():
    kt = kernel_table(_two_convs())
    g = kt.kind == GEMM
    # c1 reads the input: forward + weight gradient only; c2: forward, input gradient, weight gradient
    assert int(g.sum()) == 2 + 3
    dims = kt.dims[g]
    assert dims[0].tolist() == [64, 8, 4 * 9] and kt.batch_dim[g][0] == 0  # forward: M = batch*Ho*Wo
    assert dims[1].tolist() == [8, 4 * 9, 64] and kt.batch_dim[g][1] == 2  # weight grad: K = batch*Ho*Wo
    assert dims[3].tolist() == [64, 8, 16 * 9]  # c2 input gradient: M = batch*Hi*Wi, N = Cin, K = Cout*kh*kw
    # relu: one forward + one backward bandwidth kernel; optimizer: 4 kernels for each of the 2 weights; the loss
    # over c2's class scores per pixel: log-softmax and likelihood, forward and backward
    assert int((kt.kind == BANDWIDTH).sum()) == 2 + 4 * 2 + 4
    assert kt.launches == 5 + 2 + 8 + 4 and kt.param_tensors == 2


def test_macs_scale_with_batch_and_match_three_gemms():
    kt = kernel_table(_two_convs())
    L = latency_columns(kt, [1, 4])
    fwd = 64 * 8 * 36 + 64 * 16 * 72
    expect = 2 * 64 * 8 * 36 + 3 * 64 * 16 * 72  # c1 has no input gradient
    assert _col(L, "lt_gemm_macs")[0] == pytest.approx(expect)
    assert _col(L, "lt_gemm_macs")[1] == pytest.approx(4 * expect)
    assert fwd < expect
    assert np.all(_col(L, "lt_launches") == kt.launches)  # static


def test_strided_conv_input_gradient_does_forward_macs():
    kt = kernel_table(_two_convs(stride=2))
    g = np.flatnonzero(kt.kind == GEMM)
    fwd, dgrad = kt.dims[g[2]], kt.dims[g[3]]
    assert fwd.prod() == pytest.approx(dgrad.prod())
    assert dgrad[0] == 64  # M is the input's pixel count


def test_tile_padding_counts_odd_channels():
    even = latency_columns(kernel_table(_two_convs(cout2=32)), [8])
    odd = latency_columns(kernel_table(_two_convs(cout2=33)), [8])
    assert _col(even, "lt_gemm_padded_macs")[0] >= _col(even, "lt_gemm_macs")[0]
    # one more output channel costs ~3 % more MACs but a whole extra 32-wide tile of padded work
    assert _col(odd, "lt_gemm_macs")[0] / _col(even, "lt_gemm_macs")[0] < 1.05
    assert _col(odd, "lt_gemm_padded_macs")[0] / _col(even, "lt_gemm_padded_macs")[0] > 1.3
    assert _col(odd, "lt_gemm_waste_macs")[0] > _col(even, "lt_gemm_waste_macs")[0]
    assert TILE[1] == 32
    assert _col(odd, "lt_gemm_padded64_macs")[0] >= _col(odd, "lt_gemm_padded_macs")[0]


def test_depthwise_goes_to_its_own_kernels():
    d = _desc([Node("input", "input", [], {}, [4, 8, 8]), _conv("c", "input", 4, 8, 1, 1, 8),
               _conv("dw", "c", 8, 8, 3, 8, 8)])
    kt = kernel_table(d)
    assert int((kt.kind == DEPTHWISE).sum()) == 3  # forward, input gradient, weight gradient
    L = latency_columns(kt, [2])
    assert _col(L, "lt_dw_bytes")[0] > 0
    assert _col(latency_columns(kernel_table(_two_convs()), [2]), "lt_dw_bytes")[0] == 0


def test_branch_accumulation_and_add_backward():
    nodes = [Node("input", "input", [], {}, [4, 8, 8]), _conv("c", "input", 4, 4, 1, 1, 8),
             Node("a", "relu", ["c"], {}, [4, 8, 8]), Node("b", "relu", ["c"], {}, [4, 8, 8]),
             Node("s", "add", ["a", "b"], {}, [4, 8, 8])]
    kt = kernel_table(_desc(nodes))
    # c: 2 GEMMs; relus: 2 x 2; add: forward only; c's output read twice: 1 accumulation; optimizer 4; the loss
    # over the add's class scores per pixel 4
    assert kt.launches == 2 + 4 + 1 + 1 + 4 + 4


def test_a_parameter_free_op_of_the_input_runs_its_forward_kernel_alone():
    """A max pool of the network input makes a tensor that needs no gradient (torch: no parameters, an input that
    needs none): the pool launches its forward kernel alone (no zero fill or scatter), the conv after it no input
    gradient GEMM, and the pool's output, read by the conv and an add, gets no accumulation. The table is the same
    network's reading the input itself (at the pool's output shape; the input gets none either), plus one kernel."""
    window = {"kernel_size": [2, 2], "stride": [2, 2], "padding": [0, 0], "ceil_mode": False}
    pooled = _desc([Node("input", "input", [], {}, [4, 16, 16]), Node("p", "maxpool2d", ["input"], window, [4, 8, 8]),
                    _conv("c", "p", 4, 4, 3, 1, 8), Node("s", "add", ["c", "p"], {}, [4, 8, 8])], shape=(4, 16, 16))
    direct = _desc([Node("input", "input", [], {}, [4, 8, 8]), _conv("c", "input", 4, 4, 3, 1, 8),
                    Node("s", "add", ["c", "input"], {}, [4, 8, 8])])
    kp, kd = kernel_table(pooled), kernel_table(direct)
    # conv: forward and weight gradient; add: forward; the loss over the add's class scores per pixel 4; optimizer 4
    assert kd.launches == 2 + 1 + 4 + 4 and kp.launches == kd.launches + 1
    np.testing.assert_array_equal(kp.dims[kp.kind == GEMM], kd.dims[kd.kind == GEMM])
    bw = kp.kind == BANDWIDTH
    assert kp.bytes_ps[bw].sum() - kd.bytes_ps[kd.kind == BANDWIDTH].sum() == (4 * 16 * 16 + 4 * 8 * 8) * 4  # pool


def test_feature_matrix_carries_latency_columns():
    d = _two_convs(cout2=33)
    nf = network_features(d)
    F = feature_matrix(nf, [1, 2, 8])
    assert F.shape == (3, len(FEATURE_NAMES))
    for name in LATENCY_FEATURES:
        assert name in FEATURE_NAMES
    direct = latency_columns(kernel_table(d, nf.runtime.update_cost()), [1, 2, 8])  # the update the runtime counts
    cols = [FEATURE_NAMES.index(n) for n in LATENCY_FEATURES]
    np.testing.assert_allclose(F[:, cols], direct)
    many = feature_matrix([nf, network_features(_two_convs()), nf], [2, 2, 8])
    np.testing.assert_allclose(many[[0, 2]][:, cols], direct[[1, 2]])
    assert features_for(nf, 4)["lt_launches"] == kernel_table(d).launches


def test_row_count_mismatch_is_an_error():
    with pytest.raises(ValueError):
        latency_columns([kernel_table(_two_convs())], [1, 2])
