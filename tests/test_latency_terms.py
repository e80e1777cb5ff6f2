"""Kernel-level latency terms: hand-checked GEMM dims, tile padding, kernel counts, batch scaling."""
from __future__ import annotations

import collections

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


@pytest.mark.parametrize("mode, backward", [("constant", 1), ("reflect", 2), ("replicate", 2), ("circular", 34)])
def test_a_pad_s_backward_kernels_follow_its_mode(mode, backward):
    """A pad copies its input into a bordered output (a kernel); its backward copies the gradient's middle out (a
    constant pad's: a kernel) or zeroes the input's gradient and adds each output pixel's onto the pixel it came
    from (a reflection's or replication's: two), or runs autograd's in-place-copy nodes (a circular pad's: 7 kernels
    a padded side, 6 the middle's; its forward a copy a side too); a pixel shuffle's backward is one unshuffle."""
    conv = _conv("c", "input", 4, 4, 1, 1, 8)
    pad = Node("p", "pad", ["c"], {"pads": [1, 1, 1, 1], "mode": mode}, [4, 10, 10])
    plain = kernel_table(_desc([Node("input", "input", [], {}, [4, 8, 8]), conv]))
    padded = kernel_table(_desc([Node("input", "input", [], {}, [4, 8, 8]), conv, pad]))
    shuffled = kernel_table(_desc([Node("input", "input", [], {}, [4, 8, 8]), conv,
                                   Node("s", "pixel_shuffle", ["c"], {"upscale_factor": 2}, [1, 16, 16])]))
    forward = 5 if mode == "circular" else 1
    assert padded.launches == plain.launches + forward + backward and shuffled.launches == plain.launches + 2


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


def _gradient_pair(groups: int):
    """(a network with a transposed convolution from 16 channels at 8x8 to 8 at 16x16, the same network with the
    conv2d it is the input gradient of, from 8 channels at 16x16 to 16 at 8x8), each after a 1x1 conv2d (so that
    both compute their input's gradient), and the two 1x1 convs alone."""
    from torch import nn

    from perf4sight.ir.from_torch import describe

    stems = nn.Conv2d(4, 16, 1), nn.Conv2d(4, 8, 1)
    up = nn.Sequential(stems[0], nn.ConvTranspose2d(16, 8, 3, 2, 1, 1, groups=groups))
    down = nn.Sequential(stems[1], nn.Conv2d(8, 16, 3, 2, 1, groups=groups))
    return (describe(up, [4, 8, 8], "up"), describe(down, [4, 16, 16], "down"),
            describe(nn.Sequential(stems[0]), [4, 8, 8], "up_stem"),
            describe(nn.Sequential(stems[1]), [4, 16, 16], "down_stem"))


def _gemm_rows(desc) -> collections.Counter:
    """The GEMMs of ``desc``'s kernel table: (M, N, K, the dimension the batch scales), counted."""
    kt = kernel_table(desc)
    g = kt.kind == GEMM
    return collections.Counter(zip(map(tuple, kt.dims[g].round(6).tolist()), kt.batch_dim[g].tolist()))


@pytest.mark.parametrize("groups", [1, 2])
def test_a_transposed_convolution_runs_the_gemms_of_the_conv_it_is_the_gradient_of(groups):
    """A transposed convolution's forward is the input gradient of a conv2d from its output to its input, and its
    input gradient that conv's forward: its three GEMMs per group (dims, FLOPs) are that conv's, its forward's rows
    per sample along M like the conv's input gradient's; the perf4sight-conv set reads its forward as that conv's
    input gradient and its input gradient as that conv's forward."""
    from perf4sight.features.perf4sight_set import PERF4SIGHT_FEATURES, perf4sight_vectors

    up, down, up_stem, down_stem = _gradient_pair(groups)
    transposed, conv = _gemm_rows(up) - _gemm_rows(up_stem), _gemm_rows(down) - _gemm_rows(down_stem)
    assert sum(transposed.values()) == 3 * groups and transposed == conv
    cols = {n: i for i, n in enumerate(PERF4SIGHT_FEATURES)}
    own = [np.concatenate(perf4sight_vectors(net)) - np.concatenate(perf4sight_vectors(stem))
           for net, stem in ((up, up_stem), (down, down_stem))]
    algorithms = [n[len("fwd_"):] for n in PERF4SIGHT_FEATURES if n.startswith("fwd_")]
    for side in (0, len(PERF4SIGHT_FEATURES)):  # the static part, then the per-sample one
        for a in algorithms:
            for mine, its in (("fwd", "bwd_data"), ("bwd_data", "fwd"), ("bwd_weight", "bwd_weight")):
                assert own[0][side + cols[f"{mine}_{a}"]] == own[1][side + cols[f"{its}_{a}"]]
    assert own[0][cols["n_conv"]] == 1 and own[0][cols["conv_weight_bytes"]] == own[1][cols["conv_weight_bytes"]] > 0
    assert own[0][len(PERF4SIGHT_FEATURES) + cols["fwd_gemm_c_bytes"]] != own[0][
        len(PERF4SIGHT_FEATURES) + cols["bwd_data_gemm_c_bytes"]]  # the passes' outputs differ: the swap shows


@pytest.mark.parametrize("op, attrs, backward", [("prelu", {"num_parameters": 4}, 2), ("dropout2d", {"p": 0.2}, 1),
                                                 ("log_softmax", {"dim": 1}, 1)])
def test_prelu_dropout2d_and_log_softmax_kernels(op, attrs, backward):
    """A PReLU's backward writes the input's gradient and the slopes' per element (a kernel), then sums the latter
    down to the slopes (another); a Dropout2d's multiplies the gradient by its noise, a log-softmax's is one kernel.
    Each is one kernel forward, and moves its input- and output-sized tensors as :data:`_PASSES` says."""
    from perf4sight.features.latency_terms import _PASSES
    from perf4sight.features.optimizers import DEFAULT_OPTIMIZER, optimizer_cost

    conv = _conv("c", "input", 4, 4, 1, 1, 8)
    plain = kernel_table(_desc([Node("input", "input", [], {}, [4, 8, 8]), conv]))
    table = kernel_table(_desc([Node("input", "input", [], {}, [4, 8, 8]), conv,
                                Node("a", op, ["c"], attrs, [4, 8, 8])]))
    assert table.param_tensors - plain.param_tensors == (op == "prelu")  # its slopes, updated as the conv's weight
    updates = (op == "prelu") * optimizer_cost(DEFAULT_OPTIMIZER).kernels_per_tensor
    assert table.launches == plain.launches + 1 + backward + updates and _PASSES[op][2] == backward


@pytest.mark.parametrize("op, attrs, backward", [("pow", {"exponent": 3.0}, 3), ("pow", {"exponent": -0.5}, 3),
                                                 ("pow", {"exponent": 0.5}, 2), ("abs", {}, 2), ("exp", {}, 1),
                                                 ("div", {}, 5), ("log", {}, 1),
                                                 ("var", {"dims": [1], "keepdim": False, "correction": 1.0}, 4)])
def test_powers_abs_and_exp_kernels(op, attrs, backward):
    """A power's backward is three kernels (x ** (p - 1), times p, times the gradient; rsqrt's of its result), a
    square root's two (2 * result, the gradient over it), abs's two (sgn, times the gradient), exp's one, a quotient's
    five (grad / y; x / y, over y, -grad, their product), a variance's four (the mean, the deviation, the scaled
    gradient, its product with the deviation); each is one kernel forward."""
    conv = _conv("c", "input", 4, 4, 1, 1, 8)
    plain = kernel_table(_desc([Node("input", "input", [], {}, [4, 8, 8]), conv]))
    table = kernel_table(_desc([Node("input", "input", [], {}, [4, 8, 8]), conv,
                                Node("a", op, ["c", "c"][:1 + (op == "div")], attrs, [8, 8] if op == "var" else
                                     [4, 8, 8])]))
    assert table.launches == plain.launches + 1 + backward + (op == "div")  # a div of c by c: its gradients added


def test_a_matmul_is_its_batched_gemms():
    """A product of two activations (fc1 [3, 8, 5] times fc2 transposed [3, 5, 8]; 3 matrices a sample) was one
    elementwise kernel of its output forward and one back: it is its GEMMs, the matrices stacked along the rows (the
    rows scale with the batch): forward [24, 5] x [5, 8]; backward a's gradient [24, 8] x [8, 5] and b's [15, 8] x
    [8, 8]; b's alone where the first operand is the network input transposed, which needs no gradient."""
    def fc(name):
        return Node(name, "linear", ["input"], {"in_features": 7, "out_features": 5, "bias": True}, [3, 8, 5])
    head = [Node("input", "input", [], {}, [3, 8, 7]), fc("fc1"), fc("fc2")]
    t = Node("t", "transpose", ["fc2"], {"dim0": 2, "dim1": 3}, [3, 5, 8])
    both = kernel_table(_desc(head + [t, Node("mm", "matmul", ["fc1", "t"], {}, [3, 8, 8])], shape=(3, 8, 7)))
    second = kernel_table(_desc(head + [t, Node("mm", "matmul", ["t", "fc1"], {}, [3, 5, 5])], shape=(3, 8, 7)))
    only_b = kernel_table(_desc(head[:2] + [Node("t", "transpose", ["input"], {"dim0": 2, "dim1": 3}, [3, 7, 8]),
                                            Node("mm", "matmul", ["t", "fc1"], {}, [3, 7, 5])], shape=(3, 8, 7)))

    def products(kt, layers):  # the GEMM rows after the linear layers' (two each: forward, weight gradient)
        return [(d.tolist(), int(b)) for d, b, k in zip(kt.dims, kt.batch_dim, kt.kind) if k == GEMM][2 * layers:]
    assert products(both, 2) == [([24, 8, 5], 0), ([24, 5, 8], 0), ([15, 8, 8], 0)]
    assert products(second, 2) == [([15, 5, 8], 0), ([15, 8, 5], 0), ([24, 5, 5], 0)]
    assert products(only_b, 1) == [([21, 5, 8], 0), ([24, 5, 7], 0)]


@pytest.mark.parametrize("op, kernels", [("div", 1), ("maximum", 5), ("mul", 1)])
def test_an_op_whose_inputs_need_gradients_apart_launches_those_of_the_input_that_needs_one(op, kernels):
    """A convolution's map divided by (or the maximum of it and, or times) the network input: torch computes the map's
    gradient alone (a quotient's 1 backward kernel of 5, a maximum's 5 of 10, a product's 1), as the op's cost in the
    walk counts them; the kernel table launched every input's. Against the same network with an add there (one
    forward kernel, none back), the table has the op's forward kernel and those backward kernels more."""
    def table(name):
        return kernel_table(_desc([Node("input", "input", [], {}, [4, 6, 6]), _conv("c", "input", 4, 4, 3, 1, 6),
                                   Node("o", name, ["c", "input"], {}, [4, 6, 6])], shape=(4, 6, 6)))
    assert table(op).launches - table("add").launches == kernels


def test_a_matmul_input_broadcast_along_a_leading_dim_is_copied_first():
    """A matmul whose second input ([1, 5, 8], a narrow of a [2, 5, 8] view) broadcasts to the output's 2 matrices:
    torch copies it expanded before its bmm (a clone: formulas._matrix_product), one bandwidth kernel of its bytes
    read and the copy's written; the unbroadcast product has none."""
    from test_features import _matmul_description

    def copies(case):
        t = kernel_table(_matmul_description(case))
        return int(np.sum((t.kind == BANDWIDTH) & (t.flops_ps == 0) & np.isclose(t.bytes_ps, (40 + 2 * 40) * 4)))
    assert (copies("broadcast"), copies("both")) == (1, 0)
