"""The ``perf4sight-conv`` feature set: perf4sight's summed per-conv-layer costs, rebuilt in spirit.

perf4sight (Rajagopal & Bouganis, ICCV-W 2021) describes a network by 56 numbers: for every
convolution and each of the three passes of a training step (forward, gradient w.r.t. the input,
gradient w.r.t. the weights) it estimates the work and memory traffic of the algorithms cuDNN may
pick (im2col + GEMM, FFT, Winograd), sums them over the layers, and adds a few layer counts and
the batch size. This module computes such a set from a description so that it can be run through
the same harness as the graph features, as a baseline. It is our own formulation, not a copy.

Every feature is ``static + batch_size * per_sample`` for each layer, summed; units are MACs or
FLOPs (counts), bytes (fp32) and plain counts. Layers other than conv2d / linear / batch norm /
element-wise ops contribute nothing (perf4sight looked at convolutions only, plus the classifier).
A layer called more than once (its later calls' nodes ``share`` the first's parameters) counts each call's work
and traffic, and its weights (``conv_weight_bytes``, ``fc_weight_bytes``) once: they exist once.
"""
from __future__ import annotations

import math

import numpy as np

from perf4sight.features.formulas import BYTES_PER_ELEMENT, kernel_dilates, numel
from perf4sight.ir.schema import SHARES, NetworkDescription, Node

__all__ = ["FEATURE_SET", "PERF4SIGHT_FEATURES", "perf4sight_vectors", "perf4sight_matrix"]

FEATURE_SET = "perf4sight-conv"

_PASSES = ("fwd", "bwd_data", "bwd_weight")
_ALGO = ("gemm_macs", "gemm_a_bytes", "gemm_b_bytes", "gemm_c_bytes", "im2col_bytes",
         "fft_transform_flops", "fft_pointwise_flops", "fft_bytes",
         "wino_transform_flops", "wino_pointwise_flops", "wino_bytes")
_LAYER = ("conv_weight_bytes", "conv_in_bytes", "conv_out_bytes", "n_conv", "n_pointwise", "n_3x3", "n_large_kernel",
          "n_strided", "n_depthwise", "n_grouped", "depthwise_macs", "pointwise_macs", "strided_macs",
          "fc_macs", "fc_weight_bytes", "norm_elems", "act_elems", "pool_elems", "add_elems", "cat_bytes",
          "max_layer_macs", "max_layer_out_bytes")
#: Column names of :func:`perf4sight_matrix`: batch size, 3 passes x 11 algorithm costs, 22 layer totals.
PERF4SIGHT_FEATURES: tuple[str, ...] = (("batch_size",) + tuple(f"{p}_{a}" for p in _PASSES for a in _ALGO)
                                        + _LAYER)
_IDX = {n: i for i, n in enumerate(PERF4SIGHT_FEATURES)}


def _fft_side(n: int, k: int) -> int:
    """Padded FFT length for a ``n``-long signal and ``k``-long kernel (next power of two)."""
    return 1 << max(0, math.ceil(math.log2(max(1, n + k - 1))))


def _conv_costs(static: np.ndarray, scaled: np.ndarray, cin: int, cout: int, groups: int,
                hw_in: tuple[int, int], hw_out: tuple[int, int], k: tuple[int, int], stride: int,
                own_weights: bool = True, dilated: bool = False, weight_grad: bool = True) -> None:
    """Add one conv layer's per-pass algorithm costs (static part, per-sample part); its weight bytes only where it
    holds ``own_weights`` (not a later call of a layer called before). ``stride``: its larger side's; ``dilated``:
    its kernel dilates (no Winograd then, as none of stride more than 1); ``weight_grad`` false (a fixed filter, a
    buffer): no weight gradient pass."""
    kh, kw = k
    cg = cin // groups
    pin, pout, kk = hw_in[0] * hw_in[1], hw_out[0] * hw_out[1], kh * kw
    w_bytes = cout * cg * kk * BYTES_PER_ELEMENT
    macs = pout * cout * cg * kk  # per sample
    # (M, N per sample, K) of the GEMM each pass lowers to; N scales with the batch
    og = cout // groups  # one GEMM per group
    gemms = {"fwd": (og, pout, cg * kk, True), "bwd_data": (cg * kk, pout, og, True),
             "bwd_weight": (og, cg * kk, pout, False)}  # bwd_weight: K scales with the batch
    ph, pw = _fft_side(hw_in[0], kh), _fft_side(hw_in[1], kw)
    fft_pts = ph * pw
    fft_one = 2.5 * fft_pts * math.log2(max(2, fft_pts))  # FLOPs of one 2-D real FFT
    tiles = math.ceil(hw_out[0] / 2) * math.ceil(hw_out[1] / 2)
    wino_ok = kh == kw == 3 and stride == 1 and groups == 1 and not dilated
    for p, (m, n, kdim, n_scales) in gemms.items():
        if p == "bwd_weight" and not weight_grad:
            continue
        o = 1 + 11 * _PASSES.index(p)
        if n_scales:
            scaled[o] += m * n * kdim * groups
            static[o + 1] += m * kdim * groups * BYTES_PER_ELEMENT
            scaled[o + 2] += kdim * n * groups * BYTES_PER_ELEMENT
            scaled[o + 3] += m * n * groups * BYTES_PER_ELEMENT
        else:
            scaled[o] += m * n * kdim * groups
            scaled[o + 1] += m * kdim * groups * BYTES_PER_ELEMENT
            scaled[o + 2] += kdim * n * groups * BYTES_PER_ELEMENT
            static[o + 3] += m * n * groups * BYTES_PER_ELEMENT
        scaled[o + 4] += (cg * kk * pout * groups if kk > 1 or stride > 1 else 0) * BYTES_PER_ELEMENT
        # FFT: transform inputs and outputs per sample, weights once; pointwise complex products
        scaled[o + 5] += fft_one * (cin + cout)
        static[o + 5] += fft_one * cout * cg
        scaled[o + 6] += 8.0 * fft_pts * cout * cg
        scaled[o + 7] += 8.0 * fft_pts * (cin + cout)
        static[o + 7] += 8.0 * fft_pts * cout * cg
        if wino_ok:  # F(2x2, 3x3): 16 products per 2x2 output tile
            scaled[o + 8] += tiles * (cin + cout) * 32.0
            static[o + 8] += cout * cin * 28.0
            scaled[o + 9] += tiles * 16.0 * cin * cout
            scaled[o + 10] += tiles * 16.0 * (cin + cout) * BYTES_PER_ELEMENT
            static[o + 10] += 16.0 * cin * cout * BYTES_PER_ELEMENT
    static[_IDX["conv_weight_bytes"]] += w_bytes if own_weights else 0
    scaled[_IDX["conv_in_bytes"]] += cin * pin * BYTES_PER_ELEMENT
    scaled[_IDX["conv_out_bytes"]] += cout * pout * BYTES_PER_ELEMENT
    static[_IDX["n_conv"]] += 1
    static[_IDX["n_pointwise"]] += kk == 1
    static[_IDX["n_3x3"]] += kk == 9
    static[_IDX["n_large_kernel"]] += kk > 9
    static[_IDX["n_strided"]] += stride > 1
    depthwise = groups > 1 and groups == cin
    static[_IDX["n_depthwise"]] += depthwise
    static[_IDX["n_grouped"]] += groups > 1 and not depthwise
    scaled[_IDX["depthwise_macs"]] += macs if depthwise else 0
    scaled[_IDX["pointwise_macs"]] += macs if kk == 1 else 0
    scaled[_IDX["strided_macs"]] += macs if stride > 1 else 0


def _stride(attrs: dict) -> int:
    """A convolution's larger stride (a stride of [1, 2] strides)."""
    return max(int(s) for s in attrs["stride"])


def _conv_transpose_costs(static: np.ndarray, scaled: np.ndarray, node: Node, in_shape: list[int]) -> None:
    """Add a transposed convolution's costs: those of the conv2d it is the input gradient of (from its output's
    ``Cout x Ho x Wo`` to its input's ``Cin x Hi x Wi``, the same weight), the forward and input-gradient passes
    swapped (its forward is that conv's input gradient, its input gradient that conv's forward); the weight gradient
    and the layer totals are that conv's."""
    a, out = node.attrs, node.output_shape
    k = (int(a["kernel_size"][0]), int(a["kernel_size"][1]))
    own_static, own_scaled = np.zeros_like(static), np.zeros_like(scaled)
    _conv_costs(own_static, own_scaled, int(a["out_channels"]), int(a["in_channels"]), int(a["groups"]),
                (int(out[1]), int(out[2])), (int(in_shape[1]), int(in_shape[2])), k, _stride(a), SHARES not in a,
                kernel_dilates(a))
    fwd, data = (slice(1 + 11 * _PASSES.index(p), 12 + 11 * _PASSES.index(p)) for p in ("fwd", "bwd_data"))
    for part in (own_static, own_scaled):
        part[fwd], part[data] = part[data].copy(), part[fwd].copy()
    static += own_static
    scaled += own_scaled
    macs = numel(in_shape) * int(a["out_channels"]) // int(a["groups"]) * k[0] * k[1]
    scaled[_IDX["max_layer_macs"]] = max(scaled[_IDX["max_layer_macs"]], macs)
    scaled[_IDX["max_layer_out_bytes"]] = max(scaled[_IDX["max_layer_out_bytes"]], numel(out) * BYTES_PER_ELEMENT)


def perf4sight_vectors(desc: NetworkDescription) -> tuple[np.ndarray, np.ndarray]:
    """(static, per_sample) vectors over :data:`PERF4SIGHT_FEATURES`; row = static + b * per_sample.

    ``max_layer_*`` are per-sample maxima (scaled by the batch like the sums).
    """
    static = np.zeros(len(PERF4SIGHT_FEATURES))
    scaled = np.zeros(len(PERF4SIGHT_FEATURES))
    scaled[0] = 1.0  # batch_size
    shapes: dict[str, list[int]] = {}
    for node in desc.nodes:
        shapes[node.name] = node.output_shape
        out = numel(node.output_shape)
        a = node.attrs
        own = SHARES not in a  # a later call of a layer: its weights are the first call's
        if node.op == "conv2d":
            ins = shapes[node.inputs[0]]
            k = a["kernel_size"]
            _conv_costs(static, scaled, int(a["in_channels"]), int(a["out_channels"]), int(a["groups"]),
                        (int(ins[1]), int(ins[2])), (int(node.output_shape[1]), int(node.output_shape[2])),
                        (int(k[0]), int(k[1])), _stride(a), own and not a.get("fixed"), kernel_dilates(a),
                        not a.get("fixed"))
            macs = out * int(a["in_channels"]) // int(a["groups"]) * int(k[0]) * int(k[1])
            scaled[_IDX["max_layer_macs"]] = max(scaled[_IDX["max_layer_macs"]], macs)
            scaled[_IDX["max_layer_out_bytes"]] = max(scaled[_IDX["max_layer_out_bytes"]], out * BYTES_PER_ELEMENT)
        elif node.op == "conv_transpose2d":
            _conv_transpose_costs(static, scaled, node, shapes[node.inputs[0]])
        elif node.op == "linear":
            scaled[_IDX["fc_macs"]] += int(a["in_features"]) * out
            static[_IDX["fc_weight_bytes"]] += own * int(a["in_features"]) * int(a["out_features"]) * BYTES_PER_ELEMENT
        elif node.op in ("attention", "window_attention", "group_attention"):  # its projections: fully connected
            scaled[_IDX["fc_macs"]] += 4 * int(a["embed_dim"]) * out
            static[_IDX["fc_weight_bytes"]] += own * 4 * int(a["embed_dim"]) ** 2 * BYTES_PER_ELEMENT
        elif node.op == "matmul":  # a product of two activations: its MACs read as a fully connected layer's
            scaled[_IDX["fc_macs"]] += out * shapes[node.inputs[0]][-1]
        elif node.op == "batchnorm2d" and a.get("training") is False:  # by its running statistics: a scale and
            scaled[_IDX["add_elems"]] += out  # a shift, as a frozen batch norm's, no statistics pass
        elif node.op in ("batchnorm2d", "layernorm", "groupnorm", "instancenorm", "local_response_norm",
                         "rmsnorm",
                         "normalize"):
            scaled[_IDX["norm_elems"]] += out
        elif node.op in ("relu", "relu6", "hardswish", "hardsigmoid", "sigmoid", "silu", "gelu", "tanh", "leaky_relu",
                         "elu", "softplus", "mish", "hardtanh", "softmax", "log_softmax", "prelu",
                         "selu", "celu", "rrelu",
                         "pow", "exp", "abs",
                         "log",
                         "glu",
                         "hardshrink", "softshrink", "threshold",
                         "log_sigmoid",
                         "where"):  # a value kept or replaced by a compare, as a relu's
            scaled[_IDX["act_elems"]] += out
        elif node.op == "logsumexp":  # an exp an input element, as a softmax's an output one
            scaled[_IDX["act_elems"]] += numel(shapes[node.inputs[0]])
        elif "pool" in node.op or node.op == "mean":  # a mean over the map: a global average pool as torch runs it
            scaled[_IDX["pool_elems"]] += numel(shapes[node.inputs[0]])
        # a dropout2d, an alpha dropout: a multiply by a noise (an alpha dropout's add besides)
        elif node.op in ("add", "mul", "div", "scale", "shift", "dropout2d", "alpha_dropout",
                         "frozen_batchnorm2d",  # a multiply and an add of [C] constants
                         "maximum", "minimum",
                         "cumsum"):  # a running sum: an add an element
            scaled[_IDX["add_elems"]] += out
        elif node.op == "weighted_sum":  # a product of each map and an add of all but the first
            scaled[_IDX["add_elems"]] += (2 * int(a["num_inputs"]) - 1) * out
        elif node.op == "cat":
            scaled[_IDX["cat_bytes"]] += out * BYTES_PER_ELEMENT
        elif node.op in ("pad", "pixel_shuffle", "pixel_unshuffle", "repeat",
                         "flip", "roll",
                         "unfold", "fold"):  # copies, as a concatenation is
            scaled[_IDX["cat_bytes"]] += out * BYTES_PER_ELEMENT
    return static, scaled


def perf4sight_matrix(vectors: list[tuple[np.ndarray, np.ndarray]], batch_sizes: list[int] | np.ndarray) -> np.ndarray:
    """Rows ``static + b * per_sample`` for paired (network vectors, batch size), shape (n, 56)."""
    bs = np.asarray(batch_sizes, dtype=float).reshape(-1)
    if len(vectors) != len(bs):
        raise ValueError("perf4sight_matrix: one batch size per network expected")
    st = np.array([v[0] for v in vectors]).reshape(len(bs), -1)
    sc = np.array([v[1] for v in vectors]).reshape(len(bs), -1)
    return st + sc * bs[:, None]
