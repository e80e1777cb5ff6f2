"""The network description: a JSON graph every stage shares.

The schema is the one of ``shared/data/tx2-perf4sight/graphs`` (documented in the README),
extended with optional top-level fields (``schema_version``, ``source``) and a few ops.
Shapes exclude the batch dimension; ``dim`` attributes count it (``dim: 1`` = channels).
Nodes are in topological (execution) order and the first node is ``input``.
"""
import difflib
import hashlib
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Dict, Iterable, List, Optional, Set, Tuple, Union

from perf4sight.errors import UserError, read_json_bytes
from perf4sight.files import write_atomically
from perf4sight.ir.shapes import (SIZE_REFERENCES, element_count, image_size_problem, shape_problem,
                                  size_reference_problem, window_pair)

__all__ = ["Node", "NetworkDescription", "OPS", "load_description", "save_description", "is_file_stem",
           "STRUCTURE_VERSION", "window_attention_params", "INTERPOLATE_MODES", "PAD_MODES", "known_attrs",
           "WEIGHTED_SUM_NORMALIZATIONS", "where_condition_inputs",
           "output_padding_problem", "PARAMETER_OPS", "SHARES", "node_params", "ON_COPY_OPS",
           "ONE_TENSOR_OPS", "split_group", "unbind_group", "PIECE_CALL"]

SCHEMA_VERSION = 1

#: Op name -> attributes it must carry. Optional attributes are not listed.
OPS: Dict[str, Tuple[str, ...]] = {
    "input": (),
    # conv2d: of the optional flag fixed (false), its filter a buffer, learnt nothing (a blur pool's), and no bias;
    # optional standardize (STANDARDIZATIONS: its weight the parameter standardised per output channel at every
    # forward, as written: BiT's and timm's StdConv2d), with standardize_eps (1e-5) and, but for batch_norm,
    # standardize_unbiased (true: torch's default), and for batch_norm or std_mean (timm's older spelling: gain *
    # (scale * (w - m) / (s + eps))) standardize_scale (NFNets' ScaledStdConv2d: the
    # standardised weight times a learnt gain per output channel, a parameter [out, 1, 1, 1], times this fixed scale,
    # gamma * fan_in ** -0.5, as F.batch_norm's weight (gain * scale).view(-1)); optional weight_norm (WEIGHT_NORMS:
    # its weight g * v / ||v|| per output channel, from two parameters, as torch's weight_norm computes it at every
    # forward)
    "conv2d": ("in_channels", "out_channels", "kernel_size", "stride", "padding", "dilation", "groups", "bias"),
    # batchnorm2d: of a [C, H, W] map, or of a [C] or [C, L] input (a head's BatchNorm1d: the same F.batch_norm)
    # optional eps (1e-5), momentum (0.1; null: torch's cumulative average), affine (true: a weight and bias),
    # track_running_stats (true: a running mean and variance, buffers; false: none, the batch's statistics always);
    # training (with running statistics: an F.batch_norm call's constant flag, true the batch's statistics in
    # evaluation too, false the running ones in training too; left out, the layer's mode, as torch's layers)
    "batchnorm2d": ("num_features",),
    # a batch norm frozen (torchvision's FrozenBatchNorm2d, a detection backbone's) of a [C, H, W] map: x * scale +
    # shift, scale = weight / sqrt(running_var + eps) and shift = bias - running_mean * scale made of four [C]
    # buffers (not trained); optional eps (1e-5). No parameters
    "frozen_batchnorm2d": ("num_features",),
    "linear": ("in_features", "out_features", "bias"),
    "relu": (), "relu6": (), "hardswish": (), "sigmoid": (), "hardsigmoid": (), "silu": (),
    "gelu": (), "tanh": (), "identity": (),  # gelu: optional approximate ("none"; "tanh": torch's approximation)
    "leaky_relu": ("negative_slope",),  # x where x > 0, else negative_slope * x
    "elu": ("alpha",),  # x where x > 0, else alpha * (exp(x) - 1)
    # torch's SELU: 1.0507009873554805 * elu(x, 1.6732632423543772); CELU: x where x > 0, else
    # alpha * (exp(x / alpha) - 1), alpha not 0 (ONNX's Selu of its default alpha and gamma, and Celu)
    "selu": (),
    "celu": ("alpha",),
    # RReLU in training: x where x >= 0, else a * x, a drawn per element uniformly from [lower, upper] (torch's
    # rrelu_with_noise, which writes the slopes into a noise tensor of the input's size and keeps it)
    "rrelu": ("lower", "upper"),
    # a self-normalising network's dropout (torch's AlphaDropout): dropped elements set to SELU's negative saturation,
    # then an affine map keeping the mean and variance; feature (optional, false): whole channels of each sample
    # (FeatureAlphaDropout); inplace optional
    "alpha_dropout": ("p",),
    "softplus": ("beta", "threshold"),  # log(1 + exp(beta * x)) / beta; x where beta * x > threshold
    # torch's Hardshrink: x where |x| > lambd, else 0; Softshrink: x - lambd where x > lambd, x + lambd where
    # x < -lambd, else 0 (lambd at least 0); Threshold: x where x > threshold, else value (ONNX's Shrink is either
    # shrink, of a bias of 0 or of lambd)
    "hardshrink": ("lambd",),
    "softshrink": ("lambd",),
    "threshold": ("threshold", "value"),
    "log_sigmoid": (),  # log(sigmoid(x)): torch's LogSigmoid
    "mish": (),  # x * tanh(softplus(x))
    "maxpool2d": ("kernel_size", "stride", "padding", "ceil_mode"),
    "avgpool2d": ("kernel_size", "stride", "padding", "ceil_mode", "count_include_pad"),
    "adaptiveavgpool2d": ("output_size",),
    # a max pool of kernel_size windows at pseudo-random places, drawn per sample and channel at each forward, that
    # makes an [h, w] output_size of a [C, H, W] map (torch's FractionalMaxPool2d; h + kernel - 1 <= H, as torch
    # requires)
    "fractional_maxpool2d": ("kernel_size", "output_size"),
    "adaptivemaxpool2d": ("output_size",),
    "add": (), "mul": (),
    "cat": ("dim",),
    "reshape": ("shape",),
    "flatten": ("start_dim",),
    "squeeze": ("dim",),
    "unsqueeze": ("dim",),
    "select": ("dim", "index"),
    "narrow": ("dim", "start", "length"),
    "transpose": ("dim0", "dim1"),
    "mean": ("dims", "keepdim"),
    "dropout": ("p",),
    "permute": ("dims",),  # every dimension, the batch first (dims[0] = 0)
    "layernorm": ("normalized_shape",),  # over the last dims; optional eps (1e-5), elementwise_affine (true)
    # x / sqrt(mean(x^2) + eps) over the last dims (torch's RMSNorm, >= 2.4), times a weight of normalized_shape
    # where elementwise_affine (true; no bias); optional eps (torch's default None: float32's machine epsilon)
    "rmsnorm": ("normalized_shape",),
    # the input tiled: repeats[i] copies along each dimension after the batch (torch's x.repeat(1, *repeats),
    # x.tile; ONNX's Tile)
    "repeat": ("repeats",),
    # over each of num_groups groups of a [C, ...] input's channels (num_channels = C, a multiple of num_groups);
    # optional eps (1e-5), affine (true: a weight and bias of num_channels each)
    "groupnorm": ("num_groups", "num_channels"),
    # over each sample's channels one by one (InstanceNorm2d) of a [C, H, W] input (num_features = C); optional
    # eps (1e-5), affine (false: torch's default; true: a weight and bias of num_features each),
    # track_running_stats (false; true: a running mean and variance of num_features, buffers, that training updates
    # by momentum (0.1) from the batch's mean of each sample's statistics); use_input_stats (with running
    # statistics: an F.instance_norm call's constant flag, as a batchnorm2d's training)
    "instancenorm": ("num_features",),
    "hardtanh": ("min_val", "max_val"),  # x clamped to [min_val, max_val] (ReLU6, [0, 6], is the op relu6)
    "softmax": ("dim",),  # exp(x) / sum(exp(x)) along dim (counting the batch: 1 = channels; never the batch)
    "log_softmax": ("dim",),  # x - log(sum(exp(x))) along dim, as softmax's dim (a loss's own is not a node)
    # a * sigmoid(b), a and b the first and second halves of the input along dim (as softmax's dim; its size even,
    # halved): torch's GLU, a gated convolution's
    "glu": ("dim",),
    # x where x > 0, else a * x, a learnt slope: one (num_parameters 1) or one per channel of a [C, ...] input
    # (num_parameters = C); torch's PReLU, SRGAN's and EDSR's activation
    "prelu": ("num_parameters",),
    # each channel of each sample of a [C, H, W] map zeroed with probability p in training, the others scaled by
    # 1 / (1 - p) (Dropout2d); as dropout's, a training step's, traced in eval mode where it is the identity
    "dropout2d": ("p",),
    "scale": ("shape",),  # times a learnt tensor of this shape (ConvNeXt's layer scale), broadcast
    # plus a learnt tensor of this shape (a vision transformer's position embedding), broadcast; of the optional flag
    # fixed (false), a buffer of this shape, learnt nothing (a fixed position code, a base grid registered as buffers)
    "shift": ("shape",),
    "token": ("shape", "dim"),  # a learnt tensor of this shape put before the input along dim (the class token)
    "attention": ("embed_dim", "num_heads", "bias"),  # self-attention over the tokens of an [L, E] input; optional
                                                      # dropout (of the attention weights, 0)
    # self-attention within windows of an [H, W, E] input (a Swin transformer's), the windows shifted by
    # shift_size [h, w] (rolled back after); a learnt bias per head for each relative position within a window;
    # optional attention_dropout and dropout (0), and Swin V2's cosine (false: scaled dot products) and
    # position_bias_mlp (0: a table of biases; else the hidden width of an MLP that computes them)
    "window_attention": ("embed_dim", "num_heads", "window_size", "shift_size", "bias"),
    "patch_merge": (),  # [H, W, C] -> [ceil(H/2), ceil(W/2), 4C]: each 2x2 patch's pixels side by side (Swin)
    # self-attention within each group of a [G, P, E] input (MaxViT's block and grid attention, after its partition:
    # P = wh x ww tokens), a learnt bias per head for each relative position within a wh x ww window; the keys
    # scaled by embed_dim^-0.5 (MaxViT's scale: the whole width, not a head's)
    "group_attention": ("embed_dim", "num_heads", "window_size", "bias"),
    # a [C, H, W] map resized to size [h, w] (a segmentation network's upsampling): mode "nearest" or "bilinear";
    # optional align_corners (false; bilinear only) and scale_factor: [sh, sw] whole numbers (or one for both) where
    # the network gave them (nn.Upsample(scale_factor=2), a U-Net's or an FPN's): size is then [H sh, W sw], and the
    # description rebuilt at another input shape resizes by them (no scale_factor: to size, whatever the input);
    # optional size_of instead: the name of an earlier [C, H, W] node whose height and width size is (an FPN's
    # F.interpolate(x, size=lateral.shape[-2:]), a U-Net's size=skip.shape[2:]), which a rebuild resizes to
    "interpolate": ("size", "mode"),
    # a transposed convolution (a decoder's upsampling, the gradient of a conv2d of the same attrs by its input):
    # [Cin, H, W] -> [Cout, (H - 1) stride - 2 padding + dilation (kernel - 1) + output_padding + 1, ...]; its
    # weight [Cin, Cout / groups, kh, kw]; output_padding (per side, added at the bottom and right) is smaller
    # than the stride or the dilation, as torch requires
    # optional output_size_of: the name of an earlier [C, H, W] node whose height and width the output has (a
    # U-Net's up(x, output_size=skip.shape[2:])), which a rebuild gives at the call (torch then works out the
    # output padding)
    "conv_transpose2d": ("in_channels", "out_channels", "kernel_size", "stride", "padding", "output_padding",
                         "dilation", "groups", "bias"),
    # a [C, H, W] map padded by pads [left, right, top, bottom] (F.pad's order for the last two dims; each >= 0) in
    # mode "constant" (optional value, 0), "reflect" (each pad less than its side), "replicate" (the edge pixel) or
    # "circular" (the far side's pixels, as if the map wrapped around: each pad at most its side); optional pad_to:
    # the name of an earlier [C, H, W] node whose height and width the pads bring the map to, each side's
    # difference d split d // 2 before and d - d // 2 after (a U-Net's Up block's F.pad to its skip's odd side),
    # which a rebuild pads to; optional pads_computed (false): true where the trace computed the pads from the maps'
    # sizes otherwise (fixed at the traced shape: a rebuild at another input shape is refused, naming the node)
    "pad": ("pads", "mode"),
    # [C r^2, H, W] -> [C, H r, W r] (torch's pixel_shuffle, ONNX's DepthToSpace of mode CRD; a super-resolution
    # network's upsampling) and its inverse [C, H r, W r] -> [C r^2, H, W] (torch's pixel_unshuffle)
    "pixel_shuffle": ("upscale_factor",),
    "pixel_unshuffle": ("downscale_factor",),
    # AlexNet's across-channel normalisation of a [C, H, W] map (torch's LocalResponseNorm, ONNX's LRN):
    # x / (k + alpha * mean of x^2 over ``size`` neighbouring channels, zeros past the ends) ^ beta
    "local_response_norm": ("size", "alpha", "beta", "k"),
    # elementwise powers: x ** exponent (torch's pow, square; exponent 0.5 is torch's sqrt, -0.5 its rsqrt and -1 its
    # reciprocal, which keep their result for backward where pow keeps its input; a number over a tensor, c / y, is
    # y ** -1 times c, as torch computes it),
    # e ** x, |x|
    "pow": ("exponent",),
    "exp": (),
    "abs": (),
    # the natural logarithm of x (torch's log; its backward divides the gradient by the input, which it keeps)
    "log": (),
    # x over its L2 norm along dim, the norm clamped below at eps (optional, 1e-12): torch's F.normalize of p 2 (a
    # metric-learning head's unit-length embedding, a cosine classifier's features); dim as softmax's; ONNX's
    # LpNormalization of p 2
    "normalize": ("dim",),
    # im2col: each kernel_size window (dilated, of the map padded by zeros, at stride) of a [C, H, W] map as a column
    # of C kh kw values: [C kh kw, L], L the windows (a convolution's output positions; torch's F.unfold, nn.Unfold)
    "unfold": ("kernel_size", "dilation", "padding", "stride"),
    # col2im, unfold's inverse: [C kh kw, L] columns summed back into a [C, H, W] map of output_size [H, W] (each
    # column onto its window, overlaps added, the padding dropped; L the map's windows; torch's F.fold, nn.Fold)
    "fold": ("output_size", "kernel_size", "dilation", "padding", "stride"),
    # the variance over dims (as mean's), its squared deviations summed over their count less correction (torch's
    # var: 1, unbiased; 0 a hand-written norm's); a standard deviation is its pow 0.5
    "var": ("dims", "keepdim", "correction"),
    # log(sum(exp(x))) over dims (as mean's, never the batch's), computed stably (torch's logsumexp: the max taken
    # out first); a mixture's or a soft maximum's log-likelihood
    "logsumexp": ("dims", "keepdim"),
    # the running sum of x along dim (as softmax's dim, never the batch's): torch's cumsum (a scan)
    "cumsum": ("dim",),
    # the coordinate of each position along dim (2: the rows, 3: the columns, counted with the batch's) of its input's
    # [C, H, W] map, start to end in equal steps, as one channel: [1, H, W], its input's values not read (no gradient
    # through it); torch.linspace(start, end, H or W) viewed and expanded over the batch and the map (CoordConv's
    # coordinate channels, then concatenated to the map); optional made "arange" (COORDINATES_MADE): the port's
    # AddCoords, torch.arange(n).repeat(1, m, 1) (its columns' transposed), .float() / (n - 1), * 2 - 1 where start
    # is -1 (start 0 or -1, end 1), copied over the batch by repeat(b, 1, 1, 1) and transposed: [1, H, W] a sample;
    # "arange_grid": a grid of torch.meshgrid of two aranges, scaled so, expanded over the batch (a view)
    "linspace": ("start", "end", "dim"),
    # torch.where(c, a, b) of a condition c = x <compare> threshold (WHERE_COMPARES: gt, ge, lt, le, eq, ne), x the
    # first input: a where c holds, else b, broadcast. a and b are the next inputs, in that order, but where a number
    # (optional if_true, if_false: not both); a leaky gate's torch.where(x > 0, x, 0.1 * x), a mask's
    # torch.where(m > 0.5, x, 0.0), x.masked_fill(m < 0, 0.0); optional inplace (false): of if_true, written into
    # its tensor branch, of the output's shape (x.masked_fill_(m < 0, 0.0)); optional compare_inputs (false): the
    # condition compares the first two inputs, broadcast (torch.where(a > b, a, b)), threshold 0; optional mask_shape:
    # the condition compares a fixed tensor of this shape instead, a buffer of the node (not trained; a registered
    # attention mask: x.masked_fill(self.mask == 0, v)), broadcast with the batch first, its values not described;
    # optional multiply (false): of if_false 0, the mask multiplied into the true branch as torch runs x * (x > 0);
    # optional float_mask (false): of multiply, the mask cast to float32 first (x * (x > 0).float())
    "where": ("compare", "threshold"),
    # a spatial transformer's sampling grid: each sample's [2, 3] affine matrix theta applied to the normalised
    # [-1, 1] coordinates of an [H, W] = size output (align_corners: the corners' pixel centres at -1 and 1, else
    # their outer edges): [H, W, 2] (torch's F.affine_grid of a 4-D size)
    "affine_grid": ("size", "align_corners"),
    # a [C, H, W] map sampled at an [Ho, Wo, 2] grid of normalised (x, y) points (the second input): [C, Ho, Wo]
    # (torch's F.grid_sample of mode bilinear and padding_mode zeros: GRID_SAMPLE_MODES)
    "grid_sample": ("mode", "padding_mode", "align_corners"),
    # x's values sorted along dim (as softmax's dim, never the batch's), descending or ascending: torch's sort of its
    # values alone (its int64 indices, which the backward keeps, read by nothing else)
    "sort": ("dim", "descending"),
    # the k largest (largest, else smallest) of x's values along dim (as sort's), sorted: torch's topk of its values
    # alone (its int64 indices kept for the backward, read by nothing else). Either, of the optional flag gather
    # (false): a second input y gathered at the indices along dim (y.gather(dim, idx), the indices broadcast over y's
    # dims after x's: token pruning's top-k tokens), the values not read; and then of the optional attr shares, an
    # earlier node of the same op, attrs and x (of gather or its values): y gathered at that node's indices (its
    # gather alone)
    "topk": ("k", "dim", "largest"),
    "div": (),  # the first input over the second, broadcast (torch's x / y of two tensors; x / c is mul's scalar 1 / c)
    # the matrix product of two activations of [..., M, K] and [..., K, N] (equal ranks of at least 2; the dims
    # before the last two broadcast, as torch's matmul's do): [..., M, N] (torch's matmul, @, bmm, a batched einsum;
    # a non-local block's, a hand-written self-attention's)
    "matmul": (),
    # the larger (maximum) or the smaller (minimum) of two inputs, element by element, broadcast (torch's maximum and
    # minimum, torch.max and torch.min of two tensors; ONNX's Max and Min of two)
    "maximum": (),
    "minimum": (),
    # the input's elements in reverse order along each of dims (they count the batch's, never among them: >= 1;
    # torch's flip, flipud and fliplr; a copy)
    "flip": ("dims",),
    # the input's elements moved shifts[i] places along dims[i] (as flip's), those past the end brought round to the
    # start (torch's roll of as many shifts as dims; a copy)
    "roll": ("shifts", "dims"),
    # EfficientDet's BiFPN fusion: num_inputs (>= 2) inputs of one shape, each times a learnt weight (num_inputs
    # scalars), summed; the weights normalised first by normalize "relu" (relu(w) / (sum(relu(w)) + eps), its
    # "fast normalised fusion"; optional eps, 1e-4) or "softmax" (softmax(w))
    "weighted_sum": ("num_inputs", "normalize"),
}
#: Ops whose nodes may hold learnt parameters (:func:`node_params`) or buffers (a frozen batch norm's four [C]
#: ones). Such a node may carry the optional attr ``shares``: the name of an earlier node of the same op and attrs
#: whose parameters and buffers it uses (one layer called more than once in a forward, CBAM's shared MLP, a
#: weight-tied block applied twice; a parameter read by two ops, whose ops may differ where both are of
#: :data:`ONE_TENSOR_OPS`). Each call is a node of its own (its FLOPs, activations, saved tensors); the parameters,
#: their gradient and optimiser state, and the buffers are the owner's, counted once.
PARAMETER_OPS = ("conv2d", "conv_transpose2d", "batchnorm2d", "groupnorm", "instancenorm", "prelu", "linear",
                 "layernorm", "scale", "shift", "token", "attention", "window_attention", "group_attention",
                 "rmsnorm",
                 "frozen_batchnorm2d",
                 "weighted_sum")
#: The attr naming the node whose parameters a node of :data:`PARAMETER_OPS` uses.
SHARES = "shares"
#: A description's optional key: the nodes whose layer's parameters are all frozen (``requires_grad`` False), which a
#: rebuilt module freezes too; ``frozen_params`` counts every frozen parameter.
FROZEN_LAYERS = "frozen_layers"
#: A description's optional key: the other frozen parameters, each ``node.name`` (the node's name, then the
#: parameter's in the layer to_torch rebuilds of it: ``weight``, ``bias``), which a rebuilt module freezes too: a
#: layer partly frozen (its weight frozen, its bias trained), a frozen parameter a function call reads.
FROZEN_PARAMETERS = "frozen_parameters"


def frozen_parameter(entry: str, nodes: Iterable[str]) -> Optional[Tuple[str, str]]:
    """(node, parameter) of a :data:`FROZEN_PARAMETERS` entry: the longest of ``nodes`` it starts with, then a dot
    and the parameter's name; None if it starts with none."""
    best = max((n for n in nodes if entry.startswith(n + ".") and len(entry) > len(n) + 1), key=len, default=None)
    return None if best is None else (best, entry[len(best) + 1:])
#: Ops whose parameter is one learnt tensor of their attr ``shape``: a node of one may share (``shares``) the tensor
#: of an earlier node of another of them of the same shape (a parameter a network multiplies by and adds,
#: ``x * self.g + self.g``).
ONE_TENSOR_OPS = ("scale", "shift")
#: The modes of ``interpolate``: torch's ``F.interpolate`` modes the description follows.
INTERPOLATE_MODES = ("nearest", "bilinear")
#: The normalisations of ``weighted_sum``'s weights.
WEIGHTED_SUM_NORMALIZATIONS = ("relu", "softmax")
#: The comparisons of ``where``'s condition: its first input against its threshold (torch's x > t, x >= t, x < t,
#: x <= t, x == t, x != t).
WHERE_COMPARES = ("gt", "ge", "lt", "le", "eq", "ne")
#: The modes and padding modes of ``grid_sample``: torch's F.grid_sample ones the description follows.
GRID_SAMPLE_MODES = ("bilinear",)
GRID_SAMPLE_PADDINGS = ("zeros",)
#: The modes of ``pad``: torch's ``F.pad`` modes the description follows (ONNX's Pad calls circular "wrap").
PAD_MODES = ("constant", "reflect", "replicate", "circular")


#: Op -> attributes that must be positive integers, and those that may be an integer or an [h, w] pair
#: of non-negative integers (kernel sizes and strides at least 1; an integer is read as [v, v]).
_POSITIVE: Dict[str, Tuple[str, ...]] = {
    "conv2d": ("in_channels", "out_channels", "groups"), "linear": ("in_features", "out_features"),
    "batchnorm2d": ("num_features",), "groupnorm": ("num_groups", "num_channels"),
    "instancenorm": ("num_features",),
    "frozen_batchnorm2d": ("num_features",),
    "softmax": ("dim",), "log_softmax": ("dim",), "prelu": ("num_parameters",),
    "glu": ("dim",),
    "normalize": ("dim",),
    "cumsum": ("dim",),
    "sort": ("dim",), "topk": ("k", "dim"),
    "attention": ("embed_dim", "num_heads"),
    "window_attention": ("embed_dim", "num_heads"), "group_attention": ("embed_dim", "num_heads"),
    "conv_transpose2d": ("in_channels", "out_channels", "groups"),
    "pixel_shuffle": ("upscale_factor",), "pixel_unshuffle": ("downscale_factor",),
    "local_response_norm": ("size",),
    "weighted_sum": ("num_inputs",),
}
#: Op -> attributes that must be lists of positive integers (a shape).
_SHAPES: Dict[str, Tuple[str, ...]] = {"fractional_maxpool2d": ("output_size",),
                                       "layernorm": ("normalized_shape",), "scale": ("shape",), "shift": ("shape",),
                                       "token": ("shape",), "interpolate": ("size",),
                                       "rmsnorm": ("normalized_shape",),
                                       "repeat": ("repeats",),
                                       "flip": ("dims",), "roll": ("dims",),
                                       "fold": ("output_size",),
                                       "where": ("mask_shape",),
                                       "affine_grid": ("size",)}
#: Op -> attributes that must be integers where given (a dimension counting the batch's, negative from the end; an
#: index; a count): torch takes no float, bool or string there (``torch.cat(xs, "1")`` fails when run).
_INTEGERS: Dict[str, Tuple[str, ...]] = {
    "cat": ("dim",), "flatten": ("start_dim",), "squeeze": ("dim",), "unsqueeze": ("dim",),
    "select": ("dim", "index"), "narrow": ("dim", "start", "length"), "transpose": ("dim0", "dim1"),
    "token": ("dim",), "linspace": ("dim",)}
#: Op -> attributes that must be lists of integers (dimensions counting the batch's; a reshape's sizes, -1 for one
#: that torch works out).
_INTEGER_LISTS: Dict[str, Tuple[str, ...]] = {"mean": ("dims",), "var": ("dims",), "logsumexp": ("dims",),
                                              "reshape": ("shape",)}
#: Op -> attributes that must be true or false where given (required or optional).
_FLAGS: Dict[str, Tuple[str, ...]] = {
    "conv2d": ("bias", "fixed", "standardize_unbiased"), "linear": ("bias",), "attention": ("bias",),
    "group_attention": ("bias",),
    "window_attention": ("bias", "cosine"), "layernorm": ("elementwise_affine",),
    "batchnorm2d": ("affine", "track_running_stats", "training"),
    "groupnorm": ("affine",),
    "instancenorm": ("affine", "track_running_stats", "use_input_stats"),
    "rmsnorm": ("elementwise_affine",),
    "maxpool2d": ("ceil_mode",), "avgpool2d": ("ceil_mode", "count_include_pad"), "mean": ("keepdim",),
    "var": ("keepdim",),
    "logsumexp": ("keepdim",),
    "interpolate": ("align_corners",),
    "pad": ("pads_computed",),
    "conv_transpose2d": ("bias",),
    "shift": ("fixed",),
    **{op: ("inplace",) for op in ("relu", "relu6", "hardswish", "sigmoid", "hardsigmoid", "silu", "gelu", "tanh",
                                   "leaky_relu", "elu", "mish",
                                   "hardtanh",
                                   "selu", "celu",
                                   "threshold",
                                   "rrelu",
                                   "identity", "dropout")},
    "alpha_dropout": ("feature", "inplace"),
    "affine_grid": ("align_corners",), "grid_sample": ("align_corners",),
    "sort": ("descending", "gather"), "topk": ("largest", "gather"),
    "where": ("inplace", "compare_inputs", "multiply", "float_mask"),
    # a piece of a torch.unbind (every index of its dim a piece), rebuilt as one unbind call: unbind_group
    "select": ("unbind",),
}
#: Activations that may run in place on a copy of their input (``y.clone().leaky_relu_()``, ``F.elu(y.contiguous(),
#: inplace=True)`` of a strided y): ``on_copy`` (optional, false) says so. The result is a tensor of its own, as out of
#: place, and backward keeps what the in-place op keeps (its result; a mish's, a threshold's and a newer torch's
#: hardtanh's, a clone of the copy; an rrelu's, its result and its noise), not the input; ``inplace`` then is false.
ON_COPY_OPS = ("leaky_relu", "elu", "selu", "celu", "hardtanh", "mish",
               "threshold", "rrelu")
for _op in ON_COPY_OPS:
    _FLAGS[_op] = (*_FLAGS[_op], "on_copy")
#: Op -> attributes that must be numbers where given: (name, least, most); None: no bound. A dropout's
#: probabilities lie in [0, 1]; a norm's eps is at least 0 (torch takes 0).
_NUMBERS: Dict[str, Tuple[Tuple[str, Any, Any], ...]] = {
    "dropout": (("p", 0, 1),), "dropout2d": (("p", 0, 1),), "attention": (("dropout", 0, 1),),
    "window_attention": (("dropout", 0, 1), ("attention_dropout", 0, 1)),
    "batchnorm2d": (("eps", 0, None), ("momentum", 0, 1)), "layernorm": (("eps", 0, None),),
    "linspace": (("start", None, None), ("end", None, None)),
    "conv2d": (("standardize_eps", 0, None), ("standardize_scale", None, None), ("spectral_norm_eps", 0, None)),
    "linear": (("spectral_norm_eps", 0, None),),
    "groupnorm": (("eps", 0, None),),
    "instancenorm": (("eps", 0, None), ("momentum", 0, 1)),
    "frozen_batchnorm2d": (("eps", 0, None),),
    "rmsnorm": (("eps", 0, None),),
    "hardtanh": (("min_val", None, None), ("max_val", None, None)),
    "add": (("scalar", None, None),), "mul": (("scalar", None, None),),
    "leaky_relu": (("negative_slope", None, None),), "elu": (("alpha", None, None),),
    "softplus": (("beta", None, None), ("threshold", None, None)),
    "celu": (("alpha", None, None),),
    "hardshrink": (("lambd", None, None),), "softshrink": (("lambd", 0, None),),
    "threshold": (("threshold", None, None), ("value", None, None)),
    "rrelu": (("lower", None, None), ("upper", None, None)),
    "alpha_dropout": (("p", 0, 1),),
    "local_response_norm": (("alpha", None, None), ("beta", None, None), ("k", None, None)),
    "pad": (("value", None, None),),
    "pow": (("exponent", None, None),),
    "var": (("correction", 0, None),),
    "weighted_sum": (("eps", 0, None),),
    "normalize": (("eps", 0, None),),
    "where": (("threshold", None, None), ("if_true", None, None), ("if_false", None, None)),
}
#: Op -> optional attributes no other table here names (a gelu's approximation, a max pool's dilation, Swin V2's
#: position-bias MLP).
_OPTIONAL: Dict[str, Tuple[str, ...]] = {"gelu": ("approximate",), "maxpool2d": ("dilation",),
                                         "linspace": ("made",),
                                         "conv2d": ("standardize", "weight_norm", "spectral_norm",
                                                    "spectral_norm_iterations"),
                                         "linear": ("weight_norm", "spectral_norm", "spectral_norm_iterations"),
                                         "window_attention": ("position_bias_mlp",),
                                         "interpolate": ("scale_factor", "size_of"),
                                         "pad": ("pad_to",),
                                         "conv_transpose2d": ("output_size_of",),
                                         "fold": ("output_size_of",),
                                         "where": ("mask_shape",),
                                         # a piece of a torch.chunk or torch.split: every piece's length along dim
                                         # (this one's among them, at its start), rebuilt as one split call; of
                                         # which call, where one tensor is split alike more than once: PIECE_CALL
                                         "narrow": ("split_sizes", "call"),
                                         "select": ("call",)}
_PAIRS: Dict[str, Tuple[str, ...]] = {
    "conv2d": ("kernel_size", "stride", "padding", "dilation"),
    "maxpool2d": ("kernel_size", "stride", "padding"), "avgpool2d": ("kernel_size", "stride", "padding"),
    "window_attention": ("window_size", "shift_size"), "group_attention": ("window_size",),
    "conv_transpose2d": ("kernel_size", "stride", "padding", "output_padding", "dilation"),
    "fractional_maxpool2d": ("kernel_size",),
    "unfold": ("kernel_size", "dilation", "padding", "stride"),
    "fold": ("kernel_size", "dilation", "padding", "stride"),
}


def output_padding_problem(output_padding: Any, stride: Any, dilation: Any) -> str:
    """What is wrong with a transposed convolution's ``output_padding`` ("" if nothing): torch requires it smaller
    than the stride or the dilation along each side (its meta kernel does not check, so a description must)."""
    pad, s, d = (v if isinstance(v, list) else [v, v] for v in (output_padding, stride, dilation))
    if any(p >= max(si, di) for p, si, di in zip(pad, s, d)):
        return (f"output_padding {pad} must be smaller than either the stride {s} or the dilation {d} along each "
                "side (as torch requires)")
    return ""


def _is_int(v: Any, least: int) -> bool:
    """Whether ``v`` is an integer (not a bool) of at least ``least``."""
    return isinstance(v, int) and not isinstance(v, bool) and v >= least


def is_file_stem(v: Any) -> bool:
    """Whether ``v`` can name a file in a folder without leaving it."""
    return (isinstance(v, str) and v.strip() == v and v != "" and not v.startswith(".")
            and not any(c in v for c in "/\\") and all(ord(c) >= 32 for c in v))


def known_attrs(op: str) -> Tuple[str, ...]:
    """Every attribute a node of ``op`` may carry: its required ones (:data:`OPS`), then the optional ones."""
    optional = (*_FLAGS.get(op, ()), *(a for a, _, _ in _NUMBERS.get(op, ())), *_PAIRS.get(op, ()),
                *_OPTIONAL.get(op, ()), *((SHARES,) if op in PARAMETER_OPS or op in ("where", "sort", "topk") else ()))
    return tuple(dict.fromkeys((*OPS[op], *optional)))


#: Norm op -> its optional flag of a constant mode (a functional call's), which only running statistics give a use.
CONSTANT_MODES = {"batchnorm2d": "training", "instancenorm": "use_input_stats"}


def _constant_mode_problem(node: "Node") -> str:
    """What is wrong with a norm's constant mode (:data:`CONSTANT_MODES`; "" if nothing, or none): it needs running
    statistics (without them torch normalises by the input's always), and a batch norm's a momentum (a call's)."""
    flag = CONSTANT_MODES.get(node.op)
    if flag not in node.attrs:
        return ""
    if not node.attrs.get("track_running_stats", node.op == "batchnorm2d"):
        return f"attr '{flag}' needs running statistics (track_running_stats true): without them the input's are used"
    if "momentum" in node.attrs and node.attrs["momentum"] is None:
        return f"attr '{flag}' needs a momentum (a functional call's number), not null"
    return ""


def where_condition_inputs(attrs: Dict[str, Any]) -> int:
    """How many of a ``where``'s first inputs its condition compares (read for no gradient): 2 with
    ``compare_inputs`` (a > b), none with ``mask_shape`` (a buffer compared), else 1 (x > threshold). The branches'
    tensors follow them."""
    return 2 if attrs.get("compare_inputs") else 0 if "mask_shape" in attrs else 1


def _where_problem(node: "Node") -> str:
    """What is wrong with a ``where``'s attrs and inputs ("" if nothing): its compare one of
    :data:`WHERE_COMPARES`, its branches not both numbers, an input for its condition and each branch not a number."""
    if node.attrs["compare"] not in WHERE_COMPARES:
        return f"attr 'compare' must be one of {', '.join(WHERE_COMPARES)}, got {node.attrs['compare']!r}"
    numbers = sum(key in node.attrs for key in ("if_true", "if_false"))
    if numbers == 2:
        return "attrs 'if_true' and 'if_false' exclude each other (a where of two numbers takes no gradient)"
    wanted = where_condition_inputs(node.attrs) + 2 - numbers
    if len(node.inputs) != wanted:
        return (f"needs {wanted} inputs (the condition's, then each branch not given as a number), got "
                f"{len(node.inputs)}")
    if node.attrs.get("compare_inputs") and "mask_shape" in node.attrs:
        return "attrs 'compare_inputs' and 'mask_shape' exclude each other (the condition compares inputs or a buffer)"
    if node.attrs.get("compare_inputs") and node.attrs["threshold"] != 0:
        return f"attr 'threshold' must be 0 with 'compare_inputs' (a > b), got {node.attrs['threshold']!r}"
    if node.attrs.get("inplace") and "if_true" not in node.attrs:
        return "attr 'inplace' needs 'if_true' (a masked_fill_ writes its number into the false branch)"
    if node.attrs.get("multiply") and (node.attrs.get("if_false") != 0 or node.attrs.get("inplace")
                                       or "mask_shape" in node.attrs):
        return ("attr 'multiply' needs 'if_false' 0, and neither 'inplace' nor 'mask_shape' (a tensor times a "
                "comparison, x * (x > 0))")
    if node.attrs.get("float_mask") and not node.attrs.get("multiply"):
        return "attr 'float_mask' needs 'multiply' (a tensor times a comparison cast to float, x * (x > 0).float())"
    return ""


def _split_sizes_problem(attrs: Dict[str, Any]) -> str:
    """What is wrong with a narrow's ``split_sizes`` ("" if nothing): a list of positive integers, the narrow's piece
    (``start``, ``length``) one of them at its place."""
    sizes = attrs["split_sizes"]
    if not (isinstance(sizes, list) and sizes and all(_is_int(s, 1) for s in sizes)):
        return "attr 'split_sizes' must be a non-empty list of positive integers, got {!r}".format(sizes)
    starts = [sum(sizes[:i]) for i in range(len(sizes))]
    if (attrs["start"], attrs["length"]) not in list(zip(starts, sizes)):
        return "attr 'split_sizes' {} has no piece of length {} at {}".format(sizes, attrs["length"], attrs["start"])
    return ""


#: The optional attr of a piece of a torch.split or torch.unbind (a narrow of ``split_sizes``, a select of ``unbind``)
#: numbering its call, where the tensor is taken apart so more than once (``a = y.unbind(1); b = y.unbind(1)``): each
#: call is one of its own, whose backward gathers its own pieces' gradients. A piece without it is of its key's first
#: call (0); the second's are 1, and so on.
PIECE_CALL = "call"


def split_group(node: "Node") -> Optional[Tuple[str, int, Tuple[int, ...], int]]:
    """The torch.chunk or torch.split call a ``narrow`` of ``split_sizes`` is a piece of, as (its input, dim, the
    sizes, its :data:`PIECE_CALL`, 0 without): narrows of one key are rebuilt as one call; None for any other node."""
    if node.op != "narrow" or "split_sizes" not in node.attrs:
        return None
    return (node.inputs[0], int(node.attrs["dim"]), tuple(int(s) for s in node.attrs["split_sizes"]),
            int(node.attrs.get(PIECE_CALL, 0)))


#: A conv2d's ``standardize``: how its weight is standardised per output channel, each as written (torch runs each
#: with kernels of its own; perf4sight.ir.standardised): F.batch_norm of the weight viewed [1, out, -1] (timm's
#: StdConv2d), (w - mean) / (std + eps), (w - mean) / sqrt(var + eps), that of torch.var_mean (BiT's), or mmcv's
#: ConvWS2d: (w - mean) / (std + eps) of the statistics of w.view(out, -1)'s rows, viewed back to [out, 1, 1, 1], or
#: (w - mean) / (std + eps) of torch.std_mean (timm's older StdConv2d), or F.layer_norm(w, w.shape[1:], eps=eps)
#: (timm's ScaledStdConv2d of use_layernorm)
STANDARDIZATIONS = ("batch_norm", "std", "var", "var_mean", "std_rows", "std_mean", "layer_norm")


#: (A conv2d's or a linear's ``spectral_norm``, likewise: torch's spectral_norm as its parametrization or its older
#: hook, the weight over its largest singular value, ``spectral_norm_iterations`` power iterations a training forward
#: updating the buffers u [out] and v [in * kh * kw], ``spectral_norm_eps`` 1e-12.)
#: A conv2d's or a linear's ``weight_norm``: its weight w = g * v / ||v||, the norm over each output channel (dim 0),
#: from the parameters g ([out], one a channel) and v (the weight's shape), both trained, computed at every forward
#: by torch's weight_norm (one kernel, ``_weight_norm_interface``, and one back): as the parametrization
#: (``torch.nn.utils.parametrizations.weight_norm``) or as the older forward pre-hook (``torch.nn.utils.weight_norm``,
#: which keeps the weight it last computed on the layer between steps)
WEIGHT_NORMS = ("parametrization", "hook")


def _weight_norm_problem(attrs: Dict[str, Any]) -> str:
    """What is wrong with a conv2d's or a linear's ``weight_norm`` ("" if nothing)."""
    form = attrs.get("weight_norm")
    if form is None:
        return ""
    if form not in WEIGHT_NORMS:
        return f"attr 'weight_norm' must be one of {', '.join(WEIGHT_NORMS)}, got {form!r}"
    if attrs.get("fixed"):
        return "a fixed conv2d (its filter a buffer) has no weight to normalise (weight_norm)"
    if attrs.get("standardize"):
        return "attrs 'weight_norm' and 'standardize' exclude each other (one weight computed one way)"
    return ""


def _spectral_norm_problem(attrs: Dict[str, Any]) -> str:
    """What is wrong with a conv2d's or a linear's ``spectral_norm`` attrs ("" if nothing)."""
    form = attrs.get("spectral_norm")
    if form is None:
        extra = [a for a in ("spectral_norm_iterations", "spectral_norm_eps") if a in attrs]
        return f"attr '{extra[0]}' is for a layer of 'spectral_norm'" if extra else ""
    if form not in WEIGHT_NORMS:
        return f"attr 'spectral_norm' must be one of {', '.join(WEIGHT_NORMS)}, got {form!r}"
    iterations = attrs.get("spectral_norm_iterations", 1)
    if isinstance(iterations, bool) or not isinstance(iterations, int) or iterations < 1:
        return f"attr 'spectral_norm_iterations' must be an integer >= 1, got {iterations!r}"
    others = [a for a in ("fixed", "standardize", "weight_norm") if attrs.get(a)]
    if others:
        return f"attrs 'spectral_norm' and '{others[0]}' exclude each other (one weight computed one way)"
    return ""


#: A linspace's ``made``: how its coordinates are made where not by torch.linspace (perf4sight.ir.coordinates)
COORDINATES_MADE = ("arange", "arange_grid")


def _linspace_problem(attrs: Dict[str, Any]) -> str:
    """What is wrong with a linspace's ``made`` ("" if nothing)."""
    made = attrs.get("made")
    if made is None:
        return ""
    if made not in COORDINATES_MADE:
        return f"attr 'made' must be one of {', '.join(COORDINATES_MADE)}, got {made!r}"
    if (attrs["start"], attrs["end"]) not in ((-1, 1), (0, 1)):
        return (f"a linspace made by {made} runs from -1 or 0 to 1 (i / (n - 1), times 2 less 1), got "
                f"{attrs['start']!r} to {attrs['end']!r}")
    return ""


def _standardize_problem(attrs: Dict[str, Any]) -> str:
    """What is wrong with a conv2d's weight standardisation attrs ("" if nothing)."""
    form = attrs.get("standardize")
    if form is None:
        extra = [a for a in ("standardize_eps", "standardize_unbiased", "standardize_scale") if a in attrs]
        return f"attr '{extra[0]}' is for a conv2d of 'standardize'" if extra else ""
    if form not in STANDARDIZATIONS:
        return f"attr 'standardize' must be one of {', '.join(STANDARDIZATIONS)}, got {form!r}"
    if attrs.get("fixed"):
        return "a fixed conv2d (its filter a buffer) has no weight to standardize"
    if form in ("batch_norm", "layer_norm") and "standardize_unbiased" in attrs:
        return (f"attr 'standardize_unbiased' is not for standardize '{form}' (a {form.replace('_', ' ')}'s variance "
                "is biased)")
    if form not in ("batch_norm", "std_mean", "layer_norm") and "standardize_scale" in attrs:
        return ("attr 'standardize_scale' is for standardize 'batch_norm', 'std_mean' or 'layer_norm' (NFNets' "
                "ScaledStdConv2d, as timm writes it and wrote it)")
    return ""


def unbind_group(node: "Node") -> Optional[Tuple[str, int, int]]:
    """The torch.unbind call a ``select`` of ``unbind`` true is a piece of, as (its input, dim, its
    :data:`PIECE_CALL`, 0 without): selects of one key
    are rebuilt as one call, whose backward stacks the pieces' gradients (zeros for a piece no gradient reaches)
    where selects' write each into zeros of the input's shape and add them up; None for any other node."""
    if node.op != "select" or not node.attrs.get("unbind"):
        return None
    return node.inputs[0], int(node.attrs["dim"]), int(node.attrs.get(PIECE_CALL, 0))


def _attr_problem(node: "Node") -> str:
    """What is wrong with ``node``'s attributes ("" if nothing): one it cannot carry (a misspelt ``afine`` would
    leave the batch norm affine, unsaid), or a numeric one out of its range."""
    known_here = known_attrs(node.op)
    unknown = [a for a in node.attrs if a not in known_here]
    if unknown:
        known = ", ".join(known_here) or "none"
        return f"unknown attr{'s' if len(unknown) > 1 else ''} {', '.join(map(repr, unknown))} (known: {known})"
    for a in _POSITIVE.get(node.op, ()):
        if not _is_int(node.attrs[a], 1):
            return f"attr '{a}' must be a positive integer, got {node.attrs[a]!r}"
    for a in (a for a in _INTEGERS.get(node.op, ()) if a in node.attrs):
        if not _is_int(node.attrs[a], -2 ** 62):
            return f"attr '{a}' must be an integer, got {node.attrs[a]!r}"
    for a in _INTEGER_LISTS.get(node.op, ()):
        v = node.attrs[a]
        if not (isinstance(v, list) and all(_is_int(x, -2 ** 62) for x in v)):
            return f"attr '{a}' must be a list of integers, got {v!r}"
    if node.op == "narrow" and "split_sizes" in node.attrs:
        problem = _split_sizes_problem(node.attrs)
        if problem:
            return problem
    if PIECE_CALL in node.attrs:
        if not ((node.op == "narrow" and "split_sizes" in node.attrs) or node.attrs.get("unbind")):
            return ("attr 'call' is for a piece of a split (a narrow of 'split_sizes') or an unbind (a select of "
                    "'unbind')")
        if not _is_int(node.attrs[PIECE_CALL], 1):
            return "attr 'call' must be a positive integer, got {!r}".format(node.attrs[PIECE_CALL])
    for a in (a for a in _SHAPES.get(node.op, ()) if a in node.attrs):  # where's mask_shape optional
        v = node.attrs[a]
        if not (isinstance(v, list) and v and all(_is_int(x, 1) for x in v)):
            return f"attr '{a}' must be a non-empty list of positive integers, got {v!r}"
    if node.op == "permute" and not (isinstance(node.attrs["dims"], list) and all(_is_int(x, 0) for x in
                                                                                    node.attrs["dims"])):
        return f"attr 'dims' must be a list of dimensions (integers >= 0, the batch first), got {node.attrs['dims']!r}"
    if node.op == "roll" and not (isinstance(node.attrs["shifts"], list) and all(_is_int(x, -2 ** 62) for x in
                                                                             node.attrs["shifts"])):
        return f"attr 'shifts' must be a list of integers, got {node.attrs['shifts']!r}"
    for a in _PAIRS.get(node.op, ()):
        v = node.attrs.get(a)
        if v is None and a == "stride":  # a pool's stride may be null (= its kernel size)
            continue
        pair = v if isinstance(v, list) else [v, v]
        least = 0 if a in ("padding", "shift_size", "output_padding") else 1
        if not (len(pair) == 2 and all(_is_int(x, least) for x in pair)):
            return f"attr '{a}' must be an integer or an [h, w] pair of integers >= {least}, got {v!r}"
    if node.op == "maxpool2d" and "dilation" in node.attrs:  # optional; as given (an integer not made a pair)
        v = node.attrs["dilation"]
        pair = v if isinstance(v, list) else [v, v]
        if not (len(pair) == 2 and all(_is_int(x, 1) for x in pair)):
            return f"attr 'dilation' must be an integer or an [h, w] pair of integers >= 1, got {v!r}"
    if node.op in ("adaptiveavgpool2d", "adaptivemaxpool2d"):
        v = node.attrs["output_size"]
        pair = v if isinstance(v, list) else [v, v]
        if not (len(pair) == 2 and all(x is None or _is_int(x, 1) for x in pair)) or v is None:
            return (f"attr 'output_size' must be an integer or an [h, w] pair of integers >= 1 (null: the input's "
                    f"size), got {v!r}")
    for a in _FLAGS.get(node.op, ()):
        if a in node.attrs and not isinstance(node.attrs[a], bool):
            return f"attr '{a}' must be true or false, got {node.attrs[a]!r}"
    for a, least, most in _NUMBERS.get(node.op, ()):
        v = node.attrs.get(a)
        if v is None and (a not in node.attrs or a == "momentum"):  # torch's momentum None: a cumulative average
            continue
        if isinstance(v, bool) or not isinstance(v, (int, float)) or v != v \
                or (least is not None and v < least) or (most is not None and v > most):
            bounds = (f" >= {least}" if most is None and least is not None
                      else f" in [{least}, {most}]" if least is not None else "")
            return f"attr '{a}' must be a number{bounds}, got {v!r}"
    problem = _constant_mode_problem(node)
    if problem:
        return problem
    if node.op == "gelu" and node.attrs.get("approximate", "none") not in ("none", "tanh"):
        return f"attr 'approximate' must be 'none' or 'tanh', got {node.attrs['approximate']!r}"
    if node.op == "window_attention" and not _is_int(node.attrs.get("position_bias_mlp", 0), 0):
        return f"attr 'position_bias_mlp' must be an integer >= 0 (0: a table), got {node.attrs['position_bias_mlp']!r}"
    if node.op == "interpolate" and node.attrs["mode"] not in INTERPOLATE_MODES:
        return f"attr 'mode' must be one of {', '.join(INTERPOLATE_MODES)}, got {node.attrs['mode']!r}"
    if node.op == "weighted_sum" and node.attrs["normalize"] not in WEIGHTED_SUM_NORMALIZATIONS:
        return (f"attr 'normalize' must be one of {', '.join(WEIGHTED_SUM_NORMALIZATIONS)}, "
                f"got {node.attrs['normalize']!r}")
    if node.op == "grid_sample" and (node.attrs["mode"] not in GRID_SAMPLE_MODES
                                     or node.attrs["padding_mode"] not in GRID_SAMPLE_PADDINGS):
        return (f"mode {node.attrs['mode']!r} and padding_mode {node.attrs['padding_mode']!r} must be one of "
                f"{', '.join(GRID_SAMPLE_MODES)} and of {', '.join(GRID_SAMPLE_PADDINGS)}")
    if node.op == "where":
        problem = _where_problem(node)  # worked out once
        if problem:
            return problem
    if node.op == "weighted_sum" and node.attrs["num_inputs"] < 2:
        return f"attr 'num_inputs' must be at least 2, got {node.attrs['num_inputs']!r}"
    if node.op == "interpolate" and node.attrs.get("align_corners") and node.attrs["mode"] != "bilinear":
        return "attr 'align_corners' is for mode 'bilinear' only"
    if node.op == "interpolate" and "scale_factor" in node.attrs:
        problem = _scale_factor_problem(node.attrs["scale_factor"])
        if problem:
            return problem
    reference = SIZE_REFERENCES.get(node.op)
    if reference in node.attrs and not (isinstance(node.attrs[reference], str) and node.attrs[reference]):
        return f"attr '{reference}' must name an earlier node, got {node.attrs[reference]!r}"
    if node.op == "interpolate" and "scale_factor" in node.attrs and "size_of" in node.attrs:
        return "attrs 'scale_factor' and 'size_of' exclude each other (a resize by a factor, or to a node's size)"
    if node.op in ("attention", "window_attention", "group_attention") \
            and node.attrs["embed_dim"] % node.attrs["num_heads"]:
        return f"num_heads {node.attrs['num_heads']} does not divide embed_dim {node.attrs['embed_dim']}"
    if node.op in ("conv2d", "conv_transpose2d") and (node.attrs["in_channels"] % node.attrs["groups"]
                                                      or node.attrs["out_channels"] % node.attrs["groups"]):
        return f"groups {node.attrs['groups']} does not divide the channels"
    if node.op == "conv2d" and node.attrs.get("fixed") and node.attrs["bias"]:
        return "a fixed conv2d (its filter a buffer, learnt nothing) has no bias"
    if node.op == "conv2d":
        problem = _standardize_problem(node.attrs)
        if problem:
            return problem
    if node.op == "linspace":
        problem = _linspace_problem(node.attrs)
        if problem:
            return problem
    if node.op in ("conv2d", "linear"):
        problem = _weight_norm_problem(node.attrs) or _spectral_norm_problem(node.attrs)
        if problem:
            return problem
    if node.op == "conv_transpose2d":
        return output_padding_problem(node.attrs["output_padding"], node.attrs["stride"], node.attrs["dilation"])
    if node.op == "groupnorm" and node.attrs["num_channels"] % node.attrs["num_groups"]:
        return f"num_groups {node.attrs['num_groups']} does not divide num_channels {node.attrs['num_channels']}"
    if node.op == "hardtanh" and not node.attrs["min_val"] < node.attrs["max_val"]:
        return f"min_val {node.attrs['min_val']} is not below max_val {node.attrs['max_val']}"
    if node.op == "pad":
        return _pad_problem(node.attrs)
    if node.op == "rrelu" and node.attrs["lower"] > node.attrs["upper"]:
        return f"lower {node.attrs['lower']} is above upper {node.attrs['upper']} (its slopes are drawn between them)"
    if node.attrs.get("on_copy") and node.attrs.get("inplace"):
        return "attrs 'on_copy' and 'inplace' exclude each other (on a copy, the input itself is not written)"
    if node.op == "celu" and node.attrs["alpha"] == 0:
        return "attr 'alpha' of a celu must not be 0 (its input is divided by it)"
    return ""


def _scale_factor_problem(v: Any) -> str:
    """What is wrong with an ``interpolate`` node's ``scale_factor`` ("" if nothing): a whole number of at least 1,
    or an [h, w] pair of them (a resize by another factor is described by its size alone)."""
    pair = v if isinstance(v, list) else [v, v]
    if not (len(pair) == 2 and all(_is_int(x, 1) for x in pair)):
        return f"attr 'scale_factor' must be an integer or an [h, w] pair of integers >= 1, got {v!r}"
    return ""


def _pad_problem(attrs: Dict[str, Any]) -> str:
    """What is wrong with a ``pad`` node's attributes ("" if nothing): four sides of whole pixels, a known mode, a
    value only where it pads with one."""
    pads = attrs["pads"]
    if not (isinstance(pads, list) and len(pads) == 4 and all(_is_int(p, 0) for p in pads)):
        return f"attr 'pads' must be [left, right, top, bottom], integers >= 0, got {pads!r}"
    if attrs["mode"] not in PAD_MODES:
        return f"attr 'mode' must be one of {', '.join(PAD_MODES)}, got {attrs['mode']!r}"
    if "value" in attrs and attrs["mode"] != "constant":
        return "attr 'value' is for mode 'constant' only"
    return ""


#: The recipe of :attr:`NetworkDescription.structure`: raised whenever it changes, so that keys stored by another
#: recipe (a fingerprint's ``training_structures``) are known not to compare with today's.
STRUCTURE_VERSION = 1
#: Attributes that place a layer in the graph whatever its widths: :attr:`NetworkDescription.structure` keeps
#: these and drops the widths (channels, features, reshape sizes), which pruning changes.
_LAYOUT_ATTRS = ("kernel_size", "stride", "padding", "dilation", "ceil_mode", "count_include_pad", "output_size",
                 "dim", "dims", "keepdim", "dim0", "dim1", "mode", "align_corners",
                 "output_padding", "pads", "upscale_factor", "downscale_factor")
#: Ops that do the same to a tensor, one name each in the structure key: a classifier's input flattened by
#: ``flatten`` (torch.fx of torchvision) or ``reshape`` (perf4sight's graphs) is one layout.
_SAME_OP = {"flatten": "reshape"}


def _conv_kind(attrs: Dict[str, Any]) -> str:
    """A convolution's grouping, whatever its widths: dense, depthwise (a group per input channel) or grouped."""
    groups = attrs.get("groups", 1)
    return "dense" if groups == 1 else "depthwise" if groups == attrs.get("in_channels") else "grouped"


@dataclass
class Node:
    """One op of the graph; ``output_shape`` excludes the batch dimension."""

    name: str
    op: str
    inputs: List[str]
    attrs: Dict[str, Any]
    output_shape: List[int]

    def to_dict(self) -> Dict[str, Any]:
        """The node as the description's JSON holds it (copies of its lists and attributes)."""
        return {"name": self.name, "op": self.op, "inputs": list(self.inputs),
                "attrs": dict(self.attrs), "output_shape": list(self.output_shape)}


def _check_top_level(d: Dict[str, Any], where: str) -> None:
    """``UserError`` naming ``where`` for the first of a description's top-level keys that is absent or wrong."""
    required = ("name", "input_shape", "nodes", "output")
    missing = [k for k in required if k not in d]
    if missing:
        raise UserError(f"{where}: missing key(s) {', '.join(missing)}")
    shape = d["input_shape"]
    if not (isinstance(shape, list) and len(shape) == 3 and all(_is_int(x, 1) for x in shape)):
        raise UserError(f"{where}: input_shape must be [channels, height, width] (positive integers), got {shape!r}")
    if image_size_problem(shape):  # as describe and the config refuse it (a file, an imported graph: predicted)
        raise UserError(f"{where}: input_shape: {image_size_problem(shape)}")
    if not isinstance(d["nodes"], list):
        raise UserError(f"{where}: nodes must be a list of node objects")
    if not isinstance(d["output"], str):  # a list ["fc"] was a TypeError (unhashable) out of the set of names
        raise UserError(f"{where}: output must be the name of a node, got {d['output']!r}")
    for key in ("name", "network"):
        if key in d and not is_file_stem(d[key]):
            raise UserError(f"{where}: {key} {d[key]!r} must be usable as a file name (no path separators, "
                            "not starting with '.', no control characters)")
    for key, least in (("num_classes", 1), ("params", 0)):
        if key in d and not _is_int(d[key], least):
            raise UserError(f"{where}: {key} must be an integer >= {least}, got {d[key]!r}")
    version = d.get("schema_version", SCHEMA_VERSION)
    if not _is_int(version, 1) or version > SCHEMA_VERSION:
        raise UserError(f"{where}: schema_version {version!r} is not one this perf4sight reads (1 to "
                        f"{SCHEMA_VERSION}; a newer version of the tool wrote it?)")
    level = d.get("pruning_level", 0)
    if isinstance(level, bool) or not isinstance(level, (int, float)) or not 0 <= level < 100:
        raise UserError(f"{where}: pruning_level must be a percentage in [0, 100), got {level!r}")


#: The keys of a node's JSON object.
_NODE_KEYS = ("name", "op", "inputs", "attrs", "output_shape")


def _read_node(raw: Any, i: int, where: str) -> Node:
    """Node #``i`` of a description from its JSON object ``raw``, checked on its own (its keys, op and attributes;
    not yet its inputs or shape), with an integer pair attribute made ``[v, v]`` and a pool's null stride its
    kernel size; ``UserError`` naming ``where`` otherwise."""
    try:
        if not isinstance(raw, dict):
            raise TypeError("not an object")
        absent_keys = [k for k in ("name", "op", "output_shape") if k not in raw]
        if absent_keys:
            raise KeyError(f"no {', '.join(absent_keys)}")
        unknown_keys = [k for k in raw if k not in _NODE_KEYS]  # a misspelt "atrs": its attrs lost, unsaid
        if unknown_keys:
            raise KeyError(f"unknown key{'s' if len(unknown_keys) > 1 else ''} {', '.join(map(repr, unknown_keys))}"
                           f" (a node has {', '.join(_NODE_KEYS)})")
        if not isinstance(raw.get("inputs", []), list) or not isinstance(raw.get("attrs", {}), dict):
            raise TypeError("'inputs' must be a list and 'attrs' an object")
        out_shape = raw["output_shape"]
        if not isinstance(out_shape, list) or not all(_is_int(x, 0) for x in out_shape):
            raise ValueError(f"output_shape must be a list of non-negative integers, got {out_shape!r}")
        node = Node(str(raw["name"]), str(raw["op"]), [str(x) for x in raw.get("inputs", [])],
                    dict(raw.get("attrs", {})), list(out_shape))
    except (KeyError, TypeError, ValueError) as exc:
        raise UserError(f"{where}: node #{i} is malformed ({exc.args[0] if exc.args else exc})") from None
    if node.op not in OPS:  # a typo's closest ops first: the known ones fill a screen
        close = difflib.get_close_matches(node.op.lower(), sorted(OPS), n=2, cutoff=0.6)
        guess = f" (did you mean {' or '.join(repr(o) for o in close)}?)" if close else ""
        raise UserError(f"{where}: node '{node.name}' has unknown op '{node.op}'{guess} "
                        f"(known: {', '.join(sorted(OPS))})")
    absent = [a for a in OPS[node.op] if a not in node.attrs]
    if absent:
        raise UserError(f"{where}: node '{node.name}' ({node.op}) lacks attrs {absent}")
    problem = _attr_problem(node)
    if problem:
        raise UserError(f"{where}: node '{node.name}' ({node.op}): {problem}")
    for a in _PAIRS.get(node.op, ()):  # an integer means [v, v]: every reader sees the pair
        if isinstance(node.attrs.get(a), int):
            node.attrs[a] = [node.attrs[a]] * 2
    if node.op in ("maxpool2d", "avgpool2d") and node.attrs["stride"] is None:  # null: the kernel size
        node.attrs["stride"] = list(node.attrs["kernel_size"])
    return node


@dataclass
class NetworkDescription:
    """A whole network: metadata plus nodes in execution order.

    ``params`` is the trainable parameter count; ``input_shape`` is ``[C, H, W]``.
    """

    name: str
    network: str
    input_shape: List[int]
    num_classes: int
    params: int
    nodes: List[Node]
    output: str
    pruning_level: float = 0
    extra: Dict[str, Any] = field(default_factory=dict)

    @property
    def family(self) -> str:
        """The network family: ``network`` (what a pruned variant derives from), else the network's own name."""
        return self.network or self.name

    @property
    def structure(self) -> str:
        """A key of the layers and their wiring, widths aside (12 hex digits): the same for every pruning level of
        a network (pruning narrows layers, it removes none), different for another architecture. Each node
        contributes its op (``flatten`` read as ``reshape``), its inputs' positions, its kernel, stride, padding
        and dimension attributes, a convolution its grouping (dense, depthwise or grouped), and a layer called again
        the position of its first call (``shares``; a description without one keys as before)."""
        position = {n.name: i for i, n in enumerate(self.nodes)}
        layers = []
        for n in self.nodes:
            layout = {a: n.attrs[a] for a in _LAYOUT_ATTRS if a in n.attrs}
            if n.op in ("conv2d", "conv_transpose2d"):
                layout["groups"] = _conv_kind(n.attrs)
            if SHARES in n.attrs:  # a layer called again: which one (its first call's position)
                layout[SHARES] = position[n.attrs[SHARES]]
            layers.append([_SAME_OP.get(n.op, n.op), [position.get(i, i) for i in n.inputs], layout])
        text = json.dumps(layers, sort_keys=True, separators=(",", ":"), default=str)
        return hashlib.sha256(text.encode("utf-8")).hexdigest()[:12]

    @property
    def label_shape(self) -> List[int]:
        """The shape of one sample's training labels (no batch): ``[]`` for a classifier (one class per sample),
        else the output's positions (a segmentation network's ``[H, W]``: one class per pixel). The output's
        first dimension holds the class scores."""
        return list(self.node(self.output).output_shape[1:])

    @property
    def untrainable_at_batch_one(self) -> bool:
        """Whether a batch of one image cannot train it at all: a batch norm over a 1x1 map then has one value per
        channel, which torch refuses in training (DeepLabV3's pooled branch; mobilenet_v2 at 32x32), but for one by
        its running statistics always (``training`` false: an ``F.batch_norm(..., training=False)``)."""
        return any(n.op == "batchnorm2d" and all(int(v) == 1 for v in n.output_shape[1:])
                   and n.attrs.get("training") is not False for n in self.nodes)

    def node(self, name: str) -> Node:
        """The node named ``name``; ``KeyError`` where there is none."""
        for n in self.nodes:
            if n.name == name:
                return n
        raise KeyError(name)

    def to_dict(self) -> Dict[str, Any]:
        """The description as its JSON file holds it (:meth:`from_dict` reads it back), stamped with this
        perf4sight's ``schema_version``."""
        d: Dict[str, Any] = {"name": self.name, "network": self.network,
                             "pruning_level": self.pruning_level,
                             "input_shape": list(self.input_shape),
                             "num_classes": self.num_classes, "params": self.params}
        d.update(self.extra)
        d["schema_version"] = SCHEMA_VERSION
        d["nodes"] = [n.to_dict() for n in self.nodes]
        d["output"] = self.output
        return d

    def to_json(self) -> str:
        """:meth:`to_dict` as compact JSON text."""
        return json.dumps(self.to_dict(), separators=(",", ":"))

    @classmethod
    def from_dict(cls, d: Dict[str, Any], where: str = "description") -> "NetworkDescription":
        """The description a JSON object ``d`` holds, checked (``UserError`` naming ``where`` and the first
        problem): its top-level keys (:func:`_check_top_level`), each node on its own (:func:`_read_node`), then
        each node's place in the graph (its inputs defined before it, its output shape the one its op makes of
        them). ``params`` is counted from the nodes; a stated one must agree."""
        _check_top_level(d, where)
        shape = d["input_shape"]
        nodes = []
        seen: Set[str] = set()
        shapes: Dict[str, List[int]] = {}
        by_name: Dict[str, Node] = {}  # the nodes so far, by name (made once: a dict of them per node was quadratic)
        for i, raw in enumerate(d["nodes"]):
            node = _read_node(raw, i, where)
            if node.op != "input" and not node.inputs:
                raise UserError(f"{where}: node '{node.name}' ({node.op}) has no inputs")
            if node.name in seen:
                raise UserError(f"{where}: two nodes are named '{node.name}'")
            unknown_inputs = [x for x in node.inputs if x not in seen]
            if unknown_inputs:
                later = {str(r.get("name")) for r in d["nodes"][i + 1:] if isinstance(r, dict)}
                nowhere = [x for x in unknown_inputs if x not in later]
                if nowhere:  # a node renamed without its readers, say
                    raise UserError(f"{where}: node '{node.name}' uses {nowhere}, which no node is named")
                raise UserError(f"{where}: node '{node.name}' uses {unknown_inputs} before they are defined (a node "
                                "comes after its inputs)")
            problem = _sharing_problem(node, by_name)
            if problem:
                raise UserError(f"{where}: node '{node.name}' ({node.op}): {problem}")
            if node.op == "input" and (nodes or node.output_shape != shape):
                raise UserError(f"{where}: node '{node.name}': the one 'input' node comes first and has "
                                f"output_shape = input_shape {shape}")
            problem = shape_problem(node.op, node.attrs, [shapes[x] for x in node.inputs], node.output_shape) \
                or _reference_problem(node, shapes)
            if problem:
                raise UserError(f"{where}: node '{node.name}' ({node.op}): {problem}")
            seen.add(node.name)
            shapes[node.name] = node.output_shape
            nodes.append(node)
            by_name[node.name] = node
        if not nodes or nodes[0].op != "input":
            raise UserError(f"{where}: the first node must be the 'input' node")
        if d["output"] not in seen:
            raise UserError(f"{where}: output '{d['output']}' is not a node")
        known = {"name", "network", "pruning_level", "input_shape", "num_classes", "params",
                 "nodes", "output", "schema_version"}
        extra = {k: v for k, v in d.items() if k not in known}
        desc = cls(name=str(d["name"]), network=str(d.get("network", d["name"])),
                   input_shape=[int(s) for s in d["input_shape"]],
                   num_classes=int(d.get("num_classes", nodes[-1].output_shape[0] if nodes[-1].output_shape else 0)),
                   params=int(d.get("params", 0)), nodes=nodes, output=str(d["output"]),
                   pruning_level=d.get("pruning_level", 0), extra=extra)
        frozen = extra.get(FROZEN_LAYERS)
        if FROZEN_LAYERS in extra:  # (null too: a list or nothing, as the rebuild reads it)
            named = {n.name: n for n in nodes}
            if not isinstance(frozen, list) or not all(isinstance(f, str) for f in frozen):
                raise UserError(f"{where}: {FROZEN_LAYERS} must be a list of node names, got {frozen!r}")
            bad = [f for f in frozen if f not in named or not node_params(named[f])]
            if bad:
                raise UserError(f"{where}: {FROZEN_LAYERS} names '{bad[0]}', which is not a node with parameters")
        parameters = extra.get(FROZEN_PARAMETERS)
        if FROZEN_PARAMETERS in extra:
            owners = [n.name for n in nodes if node_params(n)]
            if not isinstance(parameters, list) or not all(isinstance(f, str) for f in parameters):
                raise UserError(f"{where}: {FROZEN_PARAMETERS} must be a list of 'node.parameter' names, "
                                f"got {parameters!r}")
            bad = [f for f in parameters if frozen_parameter(f, owners) is None]
            if bad:
                raise UserError(f"{where}: {FROZEN_PARAMETERS} names '{bad[0]}', which is no parameter of a node "
                                "with parameters ('node.parameter': 'conv1.weight')")
        counted = count_params(desc)
        if "params" in d and desc.params != counted:
            raise UserError(f"{where}: params {desc.params} is not the {counted} trainable parameters its nodes "
                            "hold (leave params out to have them counted)")
        desc.params = counted
        return desc


def _reference_problem(node: Node, shapes: Dict[str, List[int]]) -> str:
    """What is wrong with ``node``'s :data:`SIZE_REFERENCES` attr ("" if nothing, or none): it names an earlier node
    (``shapes``: their output shapes, by name) whose height and width its size or pads give."""
    key = SIZE_REFERENCES.get(node.op)
    if key not in node.attrs:
        return ""
    if node.attrs[key] not in shapes:
        return f"attr '{key}' must name an earlier node, got {node.attrs[key]!r}"
    return size_reference_problem(node.op, node.attrs, shapes[node.inputs[0]], shapes[node.attrs[key]])


def _sharing_problem(node: Node, earlier: Dict[str, Node]) -> str:
    """What is wrong with ``node``'s ``shares`` ("" if nothing, or none): it names an earlier node (``earlier``, by
    name) of the same op (or both of :data:`ONE_TENSOR_OPS`) and the same attrs that owns its parameters (itself
    sharing none)."""
    if SHARES not in node.attrs:
        return ""
    owner_name = node.attrs[SHARES]
    owner = earlier.get(owner_name) if isinstance(owner_name, str) else None
    if owner is None:
        return f"attr '{SHARES}' must name an earlier node, got {owner_name!r}"
    if SHARES in owner.attrs:
        return f"attr '{SHARES}' names '{owner_name}', which shares the parameters of '{owner.attrs[SHARES]}': name it"
    if node.op == "where":  # a fixed mask read again: the owner's buffer, whatever each fills
        if "mask_shape" not in node.attrs or owner.op != "where" or \
                owner.attrs.get("mask_shape") != node.attrs["mask_shape"]:
            return (f"attr '{SHARES}' of a where names the where whose fixed mask it reads: both of one mask_shape, "
                    f"got '{owner_name}' ({owner.op} {owner.attrs})")
        return ""
    if node.op in ("sort", "topk"):  # a gather at the indices of an earlier node of one sort of one tensor
        own = {k: v for k, v in node.attrs.items() if k not in (SHARES, "gather")}
        if not node.attrs.get("gather") or owner.op != node.op or owner.inputs[:1] != node.inputs[:1] or \
                {k: v for k, v in owner.attrs.items() if k != "gather"} != own:
            return (f"attr '{SHARES}' of a {node.op} names the {node.op} whose indices it gathers at: one of its "
                    f"attrs and first input, itself of gather, got '{owner_name}' ({owner.op} {owner.attrs})")
        return ""
    own = {k: v for k, v in node.attrs.items() if k != SHARES}
    if (owner.op != node.op and not {owner.op, node.op} <= set(ONE_TENSOR_OPS)) or owner.attrs != own:
        return (f"attr '{SHARES}' names '{owner_name}' ({owner.op} {owner.attrs}), which differs from this node "
                f"({node.op} {own}): a layer called twice is the same layer")
    return ""


def count_params(desc: NetworkDescription) -> int:
    """Trainable parameters implied by the nodes, each layer once (a node that ``shares`` another's holds none):
    :func:`node_params`."""
    return sum(node_params(n) for n in desc.nodes if SHARES not in n.attrs)


def node_params(n: Node) -> int:
    """Trainable parameters of one node's layer, as the schema defines them (conv unless fixed, with weight_norm's gain
    per output channel or a scaled standardisation's, batch, layer and group
    norm unless not affine, an instance norm where affine, linear, attention, a PReLU's slopes, and the learnt tensors
    of scale, shift and token), whether it owns them or ``shares`` them."""
    a = n.attrs
    if n.op == "conv2d" and a.get("fixed"):  # its filter a buffer
        return 0
    gains = a.get("out_channels", a.get("out_features", 0)) if a.get("weight_norm") else 0  # weight_norm's g
    if n.op == "conv2d" and "standardize_scale" in a:  # ScaledStdConv2d's learnt gain, one an output channel
        gains = a["out_channels"]
    if n.op in ("conv2d", "conv_transpose2d"):  # a transposed one's weight: [Cin, Cout / groups, kh, kw]
        kh, kw = a["kernel_size"]
        bias = a["out_channels"] if a["bias"] else 0
        return a["out_channels"] * (a["in_channels"] // a["groups"]) * kh * kw + bias + gains
    if n.op == "batchnorm2d":
        return 2 * a["num_features"] if a.get("affine", True) else 0
    if n.op == "groupnorm":
        return 2 * a["num_channels"] if a.get("affine", True) else 0
    if n.op == "instancenorm":
        return 2 * a["num_features"] if a.get("affine", False) else 0
    if n.op == "prelu":  # its slopes
        return a["num_parameters"]
    if n.op == "linear":
        return a["in_features"] * a["out_features"] + (a["out_features"] if a["bias"] else 0) + gains
    if n.op == "layernorm":
        return 2 * element_count(a["normalized_shape"]) if a.get("elementwise_affine", True) else 0
    if n.op == "rmsnorm":  # a weight, no bias
        return element_count(a["normalized_shape"]) if a.get("elementwise_affine", True) else 0
    if n.op in ("scale", "shift", "token"):
        return 0 if a.get("fixed") else element_count(a["shape"])
    if n.op == "weighted_sum":  # a weight per input
        return a["num_inputs"]
    if n.op == "attention":  # the input projection (query, key, value) and the output one
        return 4 * a["embed_dim"] * a["embed_dim"] + (4 * a["embed_dim"] if a["bias"] else 0)
    if n.op in ("window_attention", "group_attention"):
        return window_attention_params(a)
    return 0


def window_attention_params(attrs: Dict[str, Any]) -> int:
    """A window attention's parameters: the projections of an ``attention``, and a bias per head for each of the
    ``(2 wh - 1) x (2 ww - 1)`` relative positions within a window, or the MLP that computes them (from 2
    coordinates to ``position_bias_mlp`` with a bias, then to the heads without); a ``cosine`` one's scale per
    head."""
    e, heads, hidden = int(attrs["embed_dim"]), int(attrs["num_heads"]), int(attrs.get("position_bias_mlp", 0))
    wh, ww = window_pair(attrs["window_size"])
    bias = 3 * hidden + hidden * heads if hidden else (2 * wh - 1) * (2 * ww - 1) * heads
    return 4 * e * e + (4 * e if attrs["bias"] else 0) + bias + (heads if attrs.get("cosine") else 0)


def load_description(path: Union[str, Path]) -> NetworkDescription:
    """Read a description JSON file; a missing or malformed file raises ``UserError``."""
    return load_description_bytes(path)[0]


def load_description_bytes(path: Union[str, Path]) -> Tuple[NetworkDescription, bytes]:
    """:func:`load_description`'s description and the bytes it was read from, in one read (a file rewritten
    meanwhile cannot give the description of one version and the bytes, or their sha, of another)."""
    p = Path(path)
    obj, data = read_json_bytes(p, "network description file")
    return NetworkDescription.from_dict(obj, where=str(p)), data


def save_description(desc: NetworkDescription, path: Union[str, Path]) -> Path:
    """Write ``desc`` as compact JSON (atomic replace), creating parent folders."""
    p = Path(path)
    p.parent.mkdir(parents=True, exist_ok=True)
    return write_atomically(p, desc.to_json())
