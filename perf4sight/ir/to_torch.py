"""Build a trainable ``torch.fx.GraphModule`` from a network description, with torch alone.

This module runs on the devices: it imports only torch, the standard library and the schema.
Weights are randomly initialised (PyTorch defaults); profiling does not need trained weights.
"""
import keyword
import math
import operator
import re
import warnings
from typing import Any, Callable, Dict, List, Optional, Set, Tuple, Union

import torch
import torch.fx as fx
import torch.nn.functional as F
from torch import nn

from perf4sight.errors import UserError
from perf4sight.ir.schema import (FROZEN_LAYERS, FROZEN_PARAMETERS, ONE_TENSOR_OPS, SHARES,
                                  WEIGHTED_SUM_NORMALIZATIONS, NetworkDescription, Node, frozen_parameter, split_group,
                                  unbind_group)
from perf4sight.ir.shapes import SIZE_REFERENCES, window_pair, windows_of

__all__ = ["build_module", "MODULE_BUILDERS", "FUNCTION_BUILDERS", "Scale", "Shift", "Token", "SelfAttention",
           "WindowAttention", "PatchMerge", "GroupAttention", "InPlace", "batch_reshape", "WeightedSum"]


def _pair(v: Any) -> Tuple[int, int]:
    return (v, v) if isinstance(v, int) else (int(v[0]), int(v[1]))


def _pool_size(v: Any) -> Tuple[Optional[int], Optional[int]]:
    """An adaptive pool's ``output_size`` as an (h, w) pair, a null side (the input's size there) kept as None."""
    h, w = v if isinstance(v, list) else (v, v)
    return (None if h is None else int(h), None if w is None else int(w))


class Scale(nn.Module):
    """The input times a learnt tensor of ``shape``, broadcast (ConvNeXt's layer scale), initialised to ones."""

    def __init__(self, shape: List[int], device: Optional[Union[torch.device, str]] = None) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones([int(s) for s in shape], device=device))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * self.weight


class FixedConv2d(nn.Conv2d):
    """An ``nn.Conv2d`` without a bias whose filter is a buffer, learnt nothing (a blur pool's low-pass filter), set
    to ones over the kernel's size (the description holds no values)."""

    def __init__(self, in_channels: int, out_channels: int, kernel_size: List[int], stride: List[int],
                 padding: List[int], dilation: List[int], groups: int,
                 device: Optional[Union[torch.device, str]] = None) -> None:
        super().__init__(in_channels, out_channels, _pair(kernel_size), _pair(stride), _pair(padding), _pair(dilation),
                         groups, False, device=device)
        filt = torch.ones_like(self.weight.data) / float(self.weight[0].numel())
        del self.weight
        self.register_buffer("weight", filt)


class StandardizedConv2d(nn.Conv2d):
    """An ``nn.Conv2d`` whose weight is its parameter standardised per output channel at every forward (weight
    standardisation: BiT's and timm's StdConv2d), computed as ``standardize`` says (the schema's STANDARDIZATIONS),
    each as it is written, so that torch runs its kernels. A ``scale`` (``batch_norm`` alone: NFNets'
    ScaledStdConv2d, as timm writes it) gives it a learnt gain per output channel, ``[out, 1, 1, 1]``, initialised to
    ones, which times ``scale`` is the batch norm's weight."""

    def __init__(self, in_channels: int, out_channels: int, kernel_size: List[int], stride: List[int],
                 padding: List[int], dilation: List[int], groups: int, bias: bool, standardize: str,
                 eps: float = 1e-5, unbiased: bool = True,
                 device: Optional[Union[torch.device, str]] = None, scale: Optional[float] = None) -> None:
        super().__init__(in_channels, out_channels, _pair(kernel_size), _pair(stride), _pair(padding), _pair(dilation),
                         groups, bias, device=device)
        self.standardize, self.eps, self.unbiased, self.scale = standardize, eps, unbiased, scale
        if scale is not None:
            self.gain = nn.Parameter(torch.ones(out_channels, 1, 1, 1, device=device))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        w = self.weight
        if self.standardize == "batch_norm":
            gain = None if self.scale is None else (self.gain * self.scale).view(-1)
            w = F.batch_norm(w.reshape(1, self.out_channels, -1), None, None, weight=gain, training=True, momentum=0.,
                             eps=self.eps).reshape_as(w)
        elif self.standardize == "std":
            w = (w - w.mean((1, 2, 3), keepdim=True)) / (w.std((1, 2, 3), keepdim=True, unbiased=self.unbiased)
                                                         + self.eps)
        elif self.standardize == "var":
            w = (w - w.mean((1, 2, 3), keepdim=True)) / (w.var((1, 2, 3), keepdim=True, unbiased=self.unbiased)
                                                         + self.eps).sqrt()
        elif self.standardize == "var_mean":
            v, m = torch.var_mean(w, (1, 2, 3), keepdim=True, unbiased=self.unbiased)
            w = (w - m) / torch.sqrt(v + self.eps)
        elif self.standardize == "layer_norm":  # timm's ScaledStdConv2d of use_layernorm
            w = F.layer_norm(w, w.shape[1:], eps=self.eps)
            if self.scale is not None:
                w = self.gain * (self.scale * w)
        elif self.standardize == "std_mean":
            s, m = torch.std_mean(w, (1, 2, 3), keepdim=True, unbiased=self.unbiased)
            if self.scale is None:
                w = (w - m) / (s + self.eps)
            else:  # timm's older ScaledStdConv2d
                w = self.gain * (self.scale * (w - m) / (s + self.eps))
        else:  # std_rows: mmcv's ConvWS2d
            c = self.out_channels
            flat = w.view(c, -1)
            mean = flat.mean(dim=1, keepdim=True).view(c, 1, 1, 1)
            std = flat.std(dim=1, keepdim=True, unbiased=self.unbiased).view(c, 1, 1, 1)
            w = (w - mean) / (std + self.eps)
        return F.conv2d(x, w, self.bias, self.stride, self.padding, self.dilation, self.groups)


class Shift(nn.Module):
    """The input plus a learnt tensor of ``shape``, broadcast (a position embedding), initialised to zeros."""

    def __init__(self, shape: List[int], device: Optional[Union[torch.device, str]] = None,
                 fixed: bool = False) -> None:
        super().__init__()
        if fixed:  # a buffer, learnt nothing (a fixed position code)
            self.register_buffer("weight", torch.zeros([int(s) for s in shape], device=device))
        else:
            self.weight = nn.Parameter(torch.zeros([int(s) for s in shape], device=device))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.weight


class Token(nn.Module):
    """A learnt tensor of ``shape`` (per sample) put before the input along ``dim`` (a class token)."""

    def __init__(self, shape: List[int], dim: int, device: Optional[Union[torch.device, str]] = None) -> None:
        super().__init__()
        self.dim = int(dim)
        self.weight = nn.Parameter(torch.zeros([1] + [int(s) for s in shape], device=device))
        self.kept = [-1] * len(shape)  # expand's "keep this size", one per dimension after the batch's

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # sizes held in plain Python, so that torch.fx can trace a rebuilt network (described again at a new shape)
        return torch.cat([self.weight.expand(x.shape[0], *self.kept), x], self.dim)


class WeightedSum(nn.Module):
    """EfficientDet's BiFPN fusion: ``num_inputs`` maps of one shape, each times a learnt weight (a ``[num_inputs]``
    parameter, initialised to ones as EfficientDet's), summed. The weights normalised first, as the BiFPN's:
    ``relu(w) / (sum(relu(w)) + eps)`` ("relu", its fast normalised fusion) or ``softmax(w)`` ("softmax"). The kernels
    of EfficientDet's forward, in its order (the products and sums one by one)."""

    def __init__(self, num_inputs: int, normalize: str = "relu", eps: float = 1e-4,
                 device: Optional[Union[torch.device, str]] = None) -> None:
        super().__init__()
        if normalize not in WEIGHTED_SUM_NORMALIZATIONS:
            raise ValueError(f"normalize must be 'relu' or 'softmax', got {normalize!r}")
        self.normalize, self.eps = normalize, float(eps)
        self.weight = nn.Parameter(torch.ones(int(num_inputs), device=device))

    def forward(self, *xs: torch.Tensor) -> torch.Tensor:
        if self.normalize == "softmax":
            w = torch.softmax(self.weight, 0)
        else:
            w = F.relu(self.weight)
            w = w / (torch.sum(w, dim=0) + self.eps)
        out = w[0] * xs[0]
        for i in range(1, len(xs)):
            out = out + w[i] * xs[i]
        return out


class SelfAttention(nn.Module):
    """Multi-head self-attention over the tokens of a ``[N, L, E]`` input (query = key = value), its output alone."""

    def __init__(self, embed_dim: int, num_heads: int, bias: bool = True, dropout: float = 0.0,
                 device: Optional[Union[torch.device, str]] = None) -> None:
        super().__init__()
        self.attention = nn.MultiheadAttention(embed_dim, num_heads, dropout=dropout, bias=bias, batch_first=True,
                                               device=device)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.attention(x, x, x, need_weights=False)[0]


def _relative_position_index(wh: int, ww: int, device: Optional[Union[torch.device, str]]) -> torch.Tensor:
    """For each pair of positions of a ``wh x ww`` window (row-major, flattened), the row of its relative position
    in a ``(2 wh - 1) x (2 ww - 1)`` table of biases."""
    ys = torch.arange(wh, device=device).repeat_interleave(ww)  # each position's row and column in its window
    xs = torch.arange(ww, device=device).repeat(wh)
    return ((ys[:, None] - ys[None, :] + wh - 1) * (2 * ww - 1) + xs[:, None] - xs[None, :] + ww - 1).flatten()


def _relative_bias(table: torch.Tensor, index: torch.Tensor, tokens: int) -> torch.Tensor:
    """``[1, heads, tokens, tokens]``: each head's bias (``table``'s column) for each pair of a window's positions
    (``index``: :func:`_relative_position_index`)."""
    return table[index].view(tokens, tokens, -1).permute(2, 0, 1).contiguous().unsqueeze(0)


class GroupAttention(nn.Module):
    """Multi-head self-attention within each group of a ``[N, G, P, E]`` input, as MaxViT's block and grid attention
    run it after partitioning the map (``P = wh x ww`` tokens a group): a learnt bias per head for each relative
    position within a ``wh x ww`` window, the keys scaled by ``E^-0.5``. The same kernels as torchvision's
    ``RelativePositionalMultiHeadAttention``, written with torch alone."""

    def __init__(self, embed_dim: int, num_heads: int, window_size: Any, bias: bool = True,
                 device: Optional[Union[torch.device, str]] = None) -> None:
        super().__init__()
        self.num_heads = int(num_heads)
        wh, ww = window_pair(window_size)
        self.to_qkv = nn.Linear(embed_dim, 3 * embed_dim, bias=bias, device=device)
        self.merge = nn.Linear(embed_dim, embed_dim, bias=bias, device=device)
        self.relative_position_bias_table = nn.Parameter(
            torch.zeros((2 * wh - 1) * (2 * ww - 1), self.num_heads, device=device))
        self.register_buffer("relative_position_index", _relative_position_index(wh, ww, device))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        n, groups, tokens, e = x.shape
        heads = self.num_heads
        q, k, v = torch.chunk(self.to_qkv(x), 3, dim=-1)
        q, k, v = (t.reshape(n, groups, tokens, heads, e // heads).permute(0, 1, 3, 2, 4) for t in (q, k, v))
        scores = torch.einsum("bghid,bghjd->bghij", q, k * e ** -0.5)
        bias = _relative_bias(self.relative_position_bias_table, self.relative_position_index, tokens)
        weights = F.softmax(scores + bias, dim=-1)
        out = torch.einsum("bghij,bghjd->bghid", weights, v)
        return self.merge(out.permute(0, 1, 3, 2, 4).reshape(n, groups, tokens, e))


class WindowAttention(nn.Module):
    """Multi-head self-attention within windows of a ``[N, H, W, E]`` input, as a Swin transformer's block runs it:
    the map padded at the bottom and right to whole windows, rolled back by ``shift_size`` (windows that wrap
    around are masked apart), attention per window with a learnt bias per head and relative position, rolled and
    cropped back. The same kernels as torchvision's ``shifted_window_attention``, written with torch alone.

    Swin V2's form: ``cosine`` scores (the queries and keys normalised, times a learnt scale per head, at most 100;
    the keys' bias held at zero) and a ``position_bias_mlp`` of that hidden width (a two-layer MLP over the relative
    positions' log-spaced coordinates, ``16 sigmoid`` of its output, in place of a table of biases)."""

    def __init__(self, embed_dim: int, num_heads: int, window_size: Any, shift_size: Any, bias: bool = True,
                 attention_dropout: float = 0.0, dropout: float = 0.0, cosine: bool = False,
                 position_bias_mlp: int = 0, device: Optional[Union[torch.device, str]] = None) -> None:
        super().__init__()
        self.num_heads, self.window_size, self.shift_size = int(num_heads), window_pair(window_size), \
            window_pair(shift_size)
        self.attention_dropout, self.dropout, self.cosine = float(attention_dropout), float(dropout), bool(cosine)
        self.qkv = nn.Linear(embed_dim, 3 * embed_dim, bias=bias, device=device)
        self.proj = nn.Linear(embed_dim, embed_dim, bias=bias, device=device)
        wh, ww = self.window_size
        if position_bias_mlp:
            self.register_buffer("relative_coords_table", _log_spaced_coordinates(wh, ww, device))
        else:
            self.relative_position_bias_table = nn.Parameter(
                torch.zeros((2 * wh - 1) * (2 * ww - 1), self.num_heads, device=device))
        self.register_buffer("relative_position_index", _relative_position_index(wh, ww, device))
        if self.cosine:
            self.logit_scale = nn.Parameter(torch.log(10 * torch.ones((self.num_heads, 1, 1), device=device)))
        self.cpb_mlp = None if not position_bias_mlp else nn.Sequential(
            nn.Linear(2, int(position_bias_mlp), device=device), nn.ReLU(inplace=True),
            nn.Linear(int(position_bias_mlp), self.num_heads, bias=False, device=device))

    def _position_bias(self, tokens: int) -> torch.Tensor:
        """``[1, heads, tokens, tokens]``: each head's bias for each pair of positions within a window."""
        table = self.relative_position_bias_table if self.cpb_mlp is None else \
            self.cpb_mlp(self.relative_coords_table).view(-1, self.num_heads)
        bias = _relative_bias(table, self.relative_position_index, tokens)
        return bias if self.cpb_mlp is None else 16 * torch.sigmoid(bias)

    def _mask(self, x: torch.Tensor, ph: int, pw: int, shift: List[int]) -> torch.Tensor:
        """-100 between positions of a window that come from different sides of the roll, else 0."""
        (wh, ww), (sh, sw) = self.window_size, shift
        mask = x.new_zeros((ph, pw))
        count = 0
        for h in ((0, -wh), (-wh, -sh), (-sh, None)):
            for w in ((0, -ww), (-ww, -sw), (-sw, None)):
                mask[h[0]:h[1], w[0]:w[1]] = count
                count += 1
        mask = mask.view(ph // wh, wh, pw // ww, ww).permute(0, 2, 1, 3).reshape(-1, wh * ww)
        mask = mask.unsqueeze(1) - mask.unsqueeze(2)
        return mask.masked_fill(mask != 0, -100.0).masked_fill(mask == 0, 0.0)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        n, height, width, e = x.shape
        ph, pw, (wh, ww), shift = windows_of(height, width, self.window_size, self.shift_size)
        shifted = sum(shift) > 0
        x = F.pad(x, (0, 0, 0, pw - width, 0, ph - height))
        if shifted:
            x = torch.roll(x, shifts=(-shift[0], -shift[1]), dims=(1, 2))
        windows = (ph // wh) * (pw // ww)
        x = x.view(n, ph // wh, wh, pw // ww, ww, e).permute(0, 1, 3, 2, 4, 5).reshape(n * windows, wh * ww, e)
        tokens, heads = wh * ww, self.num_heads
        qkv_bias = self.qkv.bias
        if self.cosine and qkv_bias is not None:  # the keys' bias held at zero
            qkv_bias = qkv_bias.clone()
            qkv_bias[e:2 * e].zero_()
        qkv = F.linear(x, self.qkv.weight, qkv_bias).reshape(x.size(0), tokens, 3, heads, e // heads)
        qkv = qkv.permute(2, 0, 3, 1, 4)
        if self.cosine:
            attn = F.normalize(qkv[0], dim=-1).matmul(F.normalize(qkv[1], dim=-1).transpose(-2, -1))
            attn = attn * torch.clamp(self.logit_scale, max=math.log(100.0)).exp()
        else:
            attn = (qkv[0] * (e // heads) ** -0.5).matmul(qkv[1].transpose(-2, -1))
        v = qkv[2]
        attn = attn + self._position_bias(tokens)
        if shifted:
            attn = attn.view(n, windows, heads, tokens, tokens) + self._mask(x, ph, pw, shift).unsqueeze(1).unsqueeze(0)
            attn = attn.view(-1, heads, tokens, tokens)
        attn = F.dropout(F.softmax(attn, dim=-1), p=self.attention_dropout, training=self.training)
        x = attn.matmul(v).transpose(1, 2).reshape(x.size(0), tokens, e)
        x = F.dropout(self.proj(x), p=self.dropout, training=self.training)
        x = x.view(n, ph // wh, pw // ww, wh, ww, e).permute(0, 1, 3, 2, 4, 5).reshape(n, ph, pw, e)
        if shifted:
            x = torch.roll(x, shifts=(shift[0], shift[1]), dims=(1, 2))
        return x[:, :height, :width, :].contiguous()


def _log_spaced_coordinates(wh: int, ww: int, device: Optional[Union[torch.device, str]]) -> torch.Tensor:
    """``[1, 2 wh - 1, 2 ww - 1, 2]``: each relative position's (row, column) offset within a window, scaled to
    [-8, 8] and taken to ``sign(c) log2(|c| + 1) / 3`` (Swin V2's coordinates)."""
    rows = torch.arange(-(wh - 1), wh, dtype=torch.float32, device=device)
    cols = torch.arange(-(ww - 1), ww, dtype=torch.float32, device=device)
    table = torch.stack([rows[:, None].expand(2 * wh - 1, 2 * ww - 1), cols[None, :].expand(2 * wh - 1, 2 * ww - 1)],
                        dim=-1).unsqueeze(0).contiguous()
    table[:, :, :, 0] /= max(wh - 1, 1)
    table[:, :, :, 1] /= max(ww - 1, 1)
    table *= 8
    return torch.sign(table) * torch.log2(torch.abs(table) + 1.0) / 3.0


class InPlace(nn.Module):
    """An activation written into its input, as the tensor method ``method`` (``sigmoid_``, ``tanh_``) runs it:
    torch.nn has no in-place Sigmoid or Tanh."""

    def __init__(self, method: str) -> None:
        super().__init__()
        self.method = method

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return getattr(x, self.method)()


class PatchMerge(nn.Module):
    """``[N, H, W, C]`` -> ``[N, ceil(H/2), ceil(W/2), 4C]``: the map padded to even sides, each 2x2 patch's four
    pixels put side by side along the channels (a Swin stage's downsampling, before its norm and linear layer)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        height, width = x.shape[-3], x.shape[-2]
        x = F.pad(x, (0, 0, 0, width % 2, 0, height % 2))
        return torch.cat([x[..., 0::2, 0::2, :], x[..., 1::2, 0::2, :], x[..., 0::2, 1::2, :],
                          x[..., 1::2, 1::2, :]], -1)


def _batch_norm(cls: type, a: Dict[str, Any], factory: Dict[str, Any]) -> nn.Module:
    """A batch norm of class ``cls`` (BatchNorm2d, or BatchNorm1d of a [C] or [C, L] input) made of a batchnorm2d's
    attrs. On the meta device a cumulative average (momentum None), whose weight torch reads off the count of batches
    (``float(num_batches_tracked)``, which a meta tensor cannot give), runs as the momentum 0.1: the same kernels and
    allocations, the weight a number on the host; the layer is marked ``cumulative_average``, so that describing it
    again (another input shape's trace of the rebuilt network) gives the momentum None."""
    momentum = a.get("momentum", 0.1)
    on_meta = momentum is None and str(factory.get("device")) == "meta"
    if "training" in a:  # a functional call's constant mode
        cls = FixedModeBatchNorm1d if cls is nn.BatchNorm1d else FixedModeBatchNorm2d
    module = cls(a["num_features"], eps=a.get("eps", 1e-5), momentum=0.1 if on_meta else momentum,
                 affine=bool(a.get("affine", True)), track_running_stats=bool(a.get("track_running_stats", True)),
                 **factory)
    if on_meta:
        module.cumulative_average = True
    if "training" in a:
        module.use_input_stats = bool(a["training"])
    return module


def _fixed_mode_batch_norm(self: Any, x: torch.Tensor) -> torch.Tensor:
    """A batch norm by the batch's statistics (updating the running ones) where ``use_input_stats``, else by the
    running ones, in either mode: ``F.batch_norm(..., training=False)`` written in a forward."""
    return F.batch_norm(x, self.running_mean, self.running_var, self.weight, self.bias, self.use_input_stats,
                        self.momentum, self.eps)


class FixedModeBatchNorm2d(nn.BatchNorm2d):
    """A batchnorm2d of a constant ``training`` (a functional call's), whatever the module's mode; described again
    (traced through, not a leaf) as that call."""

    use_input_stats = True
    forward = _fixed_mode_batch_norm


class FixedModeBatchNorm1d(nn.BatchNorm1d):
    """:class:`FixedModeBatchNorm2d` of a ``[C]`` or ``[C, L]`` input."""

    use_input_stats = True
    forward = _fixed_mode_batch_norm


class FixedModeInstanceNorm2d(nn.InstanceNorm2d):
    """An instancenorm with running statistics and a constant ``use_input_stats`` (``F.instance_norm``'s), whatever
    the module's mode: each sample by its own statistics (updating the running ones) where true, else by the running
    ones."""

    use_input_stats = True

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.instance_norm(x, self.running_mean, self.running_var, self.weight, self.bias, self.use_input_stats,
                               self.momentum, self.eps)


def _instance_norm(a: Dict[str, Any], factory: Dict[str, Any]) -> nn.Module:
    """The InstanceNorm2d of an instancenorm's attrs (of a constant ``use_input_stats``:
    :class:`FixedModeInstanceNorm2d`)."""
    cls = FixedModeInstanceNorm2d if "use_input_stats" in a else nn.InstanceNorm2d
    module = cls(int(a["num_features"]), eps=a.get("eps", 1e-5), affine=bool(a.get("affine", False)),
                 track_running_stats=bool(a.get("track_running_stats", False)), momentum=float(a.get("momentum", 0.1)),
                 **factory)
    if "use_input_stats" in a:
        module.use_input_stats = bool(a["use_input_stats"])
    return module


class FrozenBatchNorm2d(nn.Module):
    """A batch norm whose weight, bias and running statistics are constant buffers of ``[num_features]`` (no
    parameters): ``x * scale + shift`` per channel, ``scale = weight / sqrt(running_var + eps)`` and ``shift = bias -
    running_mean * scale``. The kernels of torchvision's class of this name, in its order, written with torch alone (a
    device has no torchvision); its buffers in torchvision's order and defaults, so its state dict loads."""

    def __init__(self, num_features: int, eps: float = 1e-5, device: Any = None) -> None:
        super().__init__()
        self.eps = eps
        for name, fill in (("weight", 1.0), ("bias", 0.0), ("running_mean", 0.0), ("running_var", 1.0)):
            self.register_buffer(name, torch.full((num_features,), fill, device=device))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        weight, bias = self.weight.reshape(1, -1, 1, 1), self.bias.reshape(1, -1, 1, 1)
        mean, var = self.running_mean.reshape(1, -1, 1, 1), self.running_var.reshape(1, -1, 1, 1)
        scale = weight * (var + self.eps).rsqrt()
        shift = bias - mean * scale
        return x * scale + shift


def _by_torch(module: nn.Module, form: str, function: str, *args: Any) -> nn.Module:
    """``module`` with its weight reparametrised by torch's own ``function`` (``weight_norm``, ``spectral_norm``) of
    ``args``: its parametrization (``nn.utils.parametrizations``) where ``form`` says so and torch has it, else its
    older hook (``nn.utils``; torch 2's FutureWarning for it silenced): the same kernels, the weight it last computed
    held by the layer between steps."""
    made = getattr(getattr(nn.utils, "parametrizations", None), function, None)
    if form == "parametrization" and made is not None:
        return made(module, "weight", *args)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return getattr(nn.utils, function)(module, "weight", *args)


def _normed(module: nn.Module, a: Dict[str, Any]) -> nn.Module:
    """``module`` (an ``nn.Conv2d`` or ``nn.Linear``) with its weight computed as a conv2d's or a linear's attrs
    say, by torch's own function, over dim 0 (:func:`_by_torch`): ``weight_norm``, its parametrization (torch 2.1 on:
    the parameters ``parametrizations.weight.original0`` (g) and ``original1`` (v); torch 1.10 has none, the hook
    stands for it) or its hook (``weight_g``, ``weight_v``); or ``spectral_norm``, its parametrization (torch 1.10
    on: the parameter ``parametrizations.weight.original``, the buffers ``parametrizations.weight.0._u`` and ``_v``)
    or its hook (``weight_orig``, ``weight_u``, ``weight_v``), ``spectral_norm_iterations`` power iterations a
    training forward, ``spectral_norm_eps``."""
    if a.get("spectral_norm") is not None:
        return _by_torch(module, a["spectral_norm"], "spectral_norm", int(a.get("spectral_norm_iterations", 1)),
                         float(a.get("spectral_norm_eps", 1e-12)), 0)
    if a.get("weight_norm") is not None:
        return _by_torch(module, a["weight_norm"], "weight_norm", 0)
    return module


def _conv2d(a: Dict[str, Any], factory: Dict[str, Any]) -> nn.Module:
    """The ``nn.Conv2d`` of a conv2d's attrs (a :class:`FixedConv2d` where ``fixed``; its weight normalised where
    ``weight_norm``), on ``factory``'s device."""
    if a.get("fixed"):
        return FixedConv2d(a["in_channels"], a["out_channels"], a["kernel_size"], a["stride"], a["padding"],
                           a["dilation"], a["groups"], **factory)
    if a.get("standardize"):
        return StandardizedConv2d(a["in_channels"], a["out_channels"], a["kernel_size"], a["stride"], a["padding"],
                                  a["dilation"], a["groups"], bool(a["bias"]), a["standardize"],
                                  float(a.get("standardize_eps", 1e-5)), bool(a.get("standardize_unbiased", True)),
                                  scale=None if a.get("standardize_scale") is None else float(a["standardize_scale"]),
                                  **factory)
    return _normed(nn.Conv2d(a["in_channels"], a["out_channels"], _pair(a["kernel_size"]), _pair(a["stride"]),
                             _pair(a["padding"]), _pair(a["dilation"]), a["groups"], bool(a["bias"]), **factory), a)


def _frozen_batch_norm(a: Dict[str, Any], factory: Dict[str, Any]) -> nn.Module:
    """The :class:`FrozenBatchNorm2d` of a frozen_batchnorm2d's attrs, its four buffers on ``factory``'s device."""
    return FrozenBatchNorm2d(int(a["num_features"]), eps=float(a.get("eps", 1e-5)), **factory)


#: op -> factory of the nn.Module that executes it, given the node's attrs and the factory keyword
#: arguments for its parameters and buffers (``device``).
MODULE_BUILDERS: Dict[str, Callable[..., nn.Module]] = {
    "conv2d": lambda a, **f: _conv2d(a, f),
    "batchnorm2d": lambda a, **f: _batch_norm(nn.BatchNorm2d, a, f),
    "frozen_batchnorm2d": lambda a, **f: _frozen_batch_norm(a, f),
    "linear": lambda a, **f: _normed(nn.Linear(a["in_features"], a["out_features"], bool(a["bias"]), **f), a),
    "relu": lambda a, **f: nn.ReLU(inplace=bool(a.get("inplace", False))),
    "relu6": lambda a, **f: nn.ReLU6(inplace=bool(a.get("inplace", False))),
    "hardswish": lambda a, **f: nn.Hardswish(inplace=bool(a.get("inplace", False))),
    "hardsigmoid": lambda a, **f: nn.Hardsigmoid(inplace=bool(a.get("inplace", False))),
    "sigmoid": lambda a, **f: InPlace("sigmoid_") if a.get("inplace") else nn.Sigmoid(),
    "silu": lambda a, **f: nn.SiLU(inplace=bool(a.get("inplace", False))),
    # torch before 1.12 (a TX2's 1.10) has no approximate argument: the exact GELU is built without it
    "gelu": lambda a, **f: nn.GELU() if a.get("approximate", "none") == "none" else nn.GELU(
        approximate=str(a["approximate"])),
    "tanh": lambda a, **f: InPlace("tanh_") if a.get("inplace") else nn.Tanh(),
    "leaky_relu": lambda a, **f: nn.LeakyReLU(float(a["negative_slope"]), inplace=bool(a.get("inplace", False))),
    "elu": lambda a, **f: nn.ELU(float(a["alpha"]), inplace=bool(a.get("inplace", False))),
    "selu": lambda a, **f: nn.SELU(inplace=bool(a.get("inplace", False))),
    "celu": lambda a, **f: nn.CELU(float(a["alpha"]), inplace=bool(a.get("inplace", False))),
    "log_sigmoid": lambda a, **f: nn.LogSigmoid(),
    "hardshrink": lambda a, **f: nn.Hardshrink(float(a["lambd"])),
    "softshrink": lambda a, **f: nn.Softshrink(float(a["lambd"])),
    "threshold": lambda a, **f: nn.Threshold(float(a["threshold"]), float(a["value"]),
                                             inplace=bool(a.get("inplace", False))),
    "alpha_dropout": lambda a, **f: (nn.FeatureAlphaDropout if a.get("feature") else nn.AlphaDropout)(
        float(a["p"]), inplace=bool(a.get("inplace", False))),
    "rrelu": lambda a, **f: nn.RReLU(float(a["lower"]), float(a["upper"]), inplace=bool(a.get("inplace", False))),
    "local_response_norm": lambda a, **f: nn.LocalResponseNorm(int(a["size"]), float(a["alpha"]), float(a["beta"]),
                                                               float(a["k"])),
    "softplus": lambda a, **f: nn.Softplus(float(a["beta"]), float(a["threshold"])),
    "mish": lambda a, **f: nn.Mish(inplace=bool(a.get("inplace", False))),
    "identity": lambda a, **f: nn.Identity(),
    "maxpool2d": lambda a, **f: nn.MaxPool2d(_pair(a["kernel_size"]), _pair(a["stride"]), _pair(a["padding"]),
                                             _pair(a.get("dilation", 1)), ceil_mode=bool(a["ceil_mode"])),
    "avgpool2d": lambda a, **f: nn.AvgPool2d(_pair(a["kernel_size"]), _pair(a["stride"]), _pair(a["padding"]),
                                             bool(a["ceil_mode"]), bool(a["count_include_pad"])),
    "adaptiveavgpool2d": lambda a, **f: nn.AdaptiveAvgPool2d(_pool_size(a["output_size"])),
    "adaptivemaxpool2d": lambda a, **f: nn.AdaptiveMaxPool2d(_pool_size(a["output_size"])),
    "fractional_maxpool2d": lambda a, **f: nn.FractionalMaxPool2d(_pair(a["kernel_size"]),
                                                                  output_size=_pair(a["output_size"])),
    "dropout": lambda a, **f: nn.Dropout(float(a["p"])),
    "layernorm": lambda a, **f: nn.LayerNorm([int(s) for s in a["normalized_shape"]], eps=a.get("eps", 1e-5),
                                             elementwise_affine=bool(a.get("elementwise_affine", True)), **f),
    "rmsnorm": lambda a, **f: nn.RMSNorm([int(s) for s in a["normalized_shape"]], eps=a.get("eps"),
                                         elementwise_affine=bool(a.get("elementwise_affine", True)), **f),
    "groupnorm": lambda a, **f: nn.GroupNorm(int(a["num_groups"]), int(a["num_channels"]), eps=a.get("eps", 1e-5),
                                             affine=bool(a.get("affine", True)), **f),
    "instancenorm": lambda a, **f: _instance_norm(a, f),
    "hardtanh": lambda a, **f: nn.Hardtanh(float(a["min_val"]), float(a["max_val"]),
                                           inplace=bool(a.get("inplace", False))),
    "softmax": lambda a, **f: nn.Softmax(dim=int(a["dim"])),
    "log_softmax": lambda a, **f: nn.LogSoftmax(dim=int(a["dim"])),
    "glu": lambda a, **f: nn.GLU(dim=int(a["dim"])),
    "prelu": lambda a, **f: nn.PReLU(int(a["num_parameters"]), **f),
    "dropout2d": lambda a, **f: nn.Dropout2d(float(a["p"])),
    "scale": lambda a, **f: Scale(a["shape"], **f),
    "shift": lambda a, **f: Shift(a["shape"], fixed=bool(a.get("fixed", False)), **f),
    "token": lambda a, **f: Token(a["shape"], a["dim"], **f),
    "weighted_sum": lambda a, **f: WeightedSum(int(a["num_inputs"]), str(a["normalize"]), float(a.get("eps", 1e-4)),
                                               **f),
    "attention": lambda a, **f: SelfAttention(int(a["embed_dim"]), int(a["num_heads"]), bool(a["bias"]),
                                              float(a.get("dropout", 0.0)), **f),
    "window_attention": lambda a, **f: WindowAttention(
        int(a["embed_dim"]), int(a["num_heads"]), a["window_size"], a["shift_size"], bool(a["bias"]),
        float(a.get("attention_dropout", 0.0)), float(a.get("dropout", 0.0)), bool(a.get("cosine", False)),
        int(a.get("position_bias_mlp", 0)), **f),
    "patch_merge": lambda a, **f: PatchMerge(),
    "group_attention": lambda a, **f: GroupAttention(int(a["embed_dim"]), int(a["num_heads"]), a["window_size"],
                                                     bool(a["bias"]), **f),
    "conv_transpose2d": lambda a, **f: nn.ConvTranspose2d(
        a["in_channels"], a["out_channels"], _pair(a["kernel_size"]), _pair(a["stride"]), _pair(a["padding"]),
        _pair(a["output_padding"]), a["groups"], bool(a["bias"]), _pair(a["dilation"]), **f),
}


def batch_reshape(x: torch.Tensor, shape: List[int]) -> torch.Tensor:
    """Reshape keeping the (implicit) batch dimension first: a description's `reshape` node, as its rebuilt module
    calls it (the networks stage recognises a channel shuffle by it)."""
    return x.reshape(x.shape[0], *shape)


#: The key of a rebuilt fx node's ``meta`` holding its description node's ``output_shape`` (per sample).
DESCRIBED_SHAPE = "perf4sight_shape"


def _batch_reshape_at(x: torch.Tensor, shape: List[int], position: int, axis: int) -> torch.Tensor:
    """:func:`batch_reshape` to ``shape`` but for its size at ``position``, ``x``'s size along ``axis`` (counting the
    batch's), read at run time as a module's ``g.view(b, c, 1, 1)`` reads ``c``."""
    sizes = list(shape)
    sizes[position] = x.shape[axis]
    return x.reshape(x.shape[0], *sizes)


def _reshape(x: fx.Node, shape: List[int]) -> Tuple[Callable, Tuple]:
    """A ``reshape`` node's call: :func:`batch_reshape` to its ``shape``, but where it adds or removes only
    dimensions of size 1 around one other (a squeeze-excitation gate's ``[C]`` to ``[C, 1, 1]``: ``g[:, :, None,
    None]``, ``g.view(b, c, 1, 1)``; its pooled ``[C, 1, 1]`` to ``[C]``), that one read off the input's dimension of
    that size at run time, as the module's own call reads it: a network pruned through the gate keeps working (a
    literal C refused every cut of those channels). Not as -1: a map of 1x1 at the described shape (a classifier's
    ``y.view(b, 10)`` of a ``[10, 1, 1]`` map) would take every element at another shape where the module fails."""
    sizes = [int(s) for s in shape]
    before = [int(s) for s in x.meta.get(DESCRIBED_SHAPE, ())]
    kept = [s for s in sizes if s != 1]
    if len(kept) == 1 and [s for s in before if s != 1] == kept:
        position = next(i for i, s in enumerate(sizes) if s != 1)
        axis = next(i for i, s in enumerate(before) if s != 1)
        return _batch_reshape_at, (x, sizes, position, axis + 1)
    return batch_reshape, (x, sizes)


def _permute(x: torch.Tensor, dims: List[int]) -> torch.Tensor:
    return x.permute(*dims)


def _scalar_add(x: torch.Tensor, scalar: float) -> torch.Tensor:
    return x + scalar


def _scalar_mul(x: torch.Tensor, scalar: float) -> torch.Tensor:
    return x * scalar


def _select(x: torch.Tensor, dim: int, index: int) -> torch.Tensor:
    # the method, not torch.select: torch_geometric replaces that function with one torch.fx cannot trace through
    return x.select(dim, index)


def _narrow(x: torch.Tensor, dim: int, start: int, length: int) -> torch.Tensor:
    return x.narrow(dim, start, length)  # the method, as _select's


def _interpolate(x: torch.Tensor, size: List[int], mode: str, align_corners: bool) -> torch.Tensor:
    """``x`` ([N, C, H, W]) resized to ``size`` ([h, w]) by ``mode`` ("nearest" or "bilinear")."""
    return F.interpolate(x, size=(int(size[0]), int(size[1])), mode=mode,
                         align_corners=align_corners if mode == "bilinear" else None)


def _interpolate_by(x: torch.Tensor, scale_factor: List[int], mode: str, align_corners: bool) -> torch.Tensor:
    """``x`` ([N, C, H, W]) resized by whole ``scale_factor`` ([sh, sw]) by ``mode``: to [H sh, W sw] at any input
    size, torch's call for a module that gave the factors (nn.Upsample(scale_factor=2))."""
    return F.interpolate(x, scale_factor=(float(scale_factor[0]), float(scale_factor[1])), mode=mode,
                         align_corners=align_corners if mode == "bilinear" else None)


def _resize(x: List, a: Dict) -> Tuple[Callable, Tuple]:
    """An ``interpolate`` node's call: by its ``scale_factor`` where it has one (so a rebuild at another input shape
    scales that shape), else to its ``size``."""
    corners = bool(a.get("align_corners", False))
    if "scale_factor" in a:
        return _interpolate_by, (x[0], window_pair(a["scale_factor"]), str(a["mode"]), corners)
    return _interpolate, (x[0], [int(v) for v in a["size"]], str(a["mode"]), corners)


def _interpolate_to(x: torch.Tensor, like: torch.Tensor, mode: str, align_corners: bool) -> torch.Tensor:
    """``x`` ([N, C, H, W]) resized by ``mode`` to the height and width of ``like`` ([N, C', H', W']), read at run
    time (an FPN's ``size=lateral.shape[-2:]``): a description's ``interpolate`` with ``size_of``."""
    return F.interpolate(x, size=like.shape[-2:], mode=mode,
                         align_corners=align_corners if mode == "bilinear" else None)


def _pad_to(x: torch.Tensor, like: torch.Tensor, mode: str, value: float) -> torch.Tensor:
    """``x`` ([N, C, H, W]) padded in ``mode`` to the height and width of ``like`` ([N, C', H', W']), read at run
    time, each side's difference split as a U-Net's ``Up`` block splits it (the odd pixel at the bottom and right):
    a description's ``pad`` with ``pad_to``."""
    diff_h = like.size()[2] - x.size()[2]
    diff_w = like.size()[3] - x.size()[3]
    return _pad(x, [diff_w // 2, diff_w - diff_w // 2, diff_h // 2, diff_h - diff_h // 2], mode, value)


def _fold_to(x: torch.Tensor, like: torch.Tensor, kernel_size: Tuple[int, int], dilation: Tuple[int, int],
             padding: Tuple[int, int], stride: Tuple[int, int]) -> torch.Tensor:
    """Columns ``x`` ([N, C kh kw, L]) summed back (col2im) into a map of the height and width of ``like`` ([N, C', H,
    W]), read at run time (``F.fold(cols, y.shape[-2:], ...)``): a description's ``fold`` with ``output_size_of``."""
    return F.fold(x, like.shape[-2:], kernel_size, dilation, padding, stride)


def _sized_like(node: Node, x: fx.Node, like: fx.Node) -> Tuple[Callable, Tuple]:
    """The call of a node sized by another's map (its :data:`SIZE_REFERENCES` attr; ``like``, that node's value):
    a resize to its size, a pad to it or a fold onto it, whatever the input shape."""
    a = node.attrs
    if node.op == "interpolate":
        return _interpolate_to, (x, like, str(a["mode"]), bool(a.get("align_corners", False)))
    if node.op == "fold":
        return _fold_to, (x, like, *(_pair(a[k]) for k in ("kernel_size", "dilation", "padding", "stride")))
    return _pad_to, (x, like, str(a["mode"]), float(a.get("value", 0.0)))


def _repeat(x: torch.Tensor, repeats: List[int]) -> torch.Tensor:
    """``x`` tiled ``repeats`` times along each dimension after the batch (torch's repeat: a copy)."""
    return x.repeat(1, *repeats)


def _pad(x: torch.Tensor, pads: List[int], mode: str, value: float) -> torch.Tensor:
    """``x`` ([N, C, H, W]) padded by ``pads`` ([left, right, top, bottom]) in ``mode`` (with ``value``: constant).
    Another mode is given no value: torch before 2 asserts ``value == 0`` there, which None fails."""
    if mode == "constant":
        return F.pad(x, pads, mode=mode, value=value)
    return F.pad(x, pads, mode=mode)


def _power(x: torch.Tensor, exponent: float) -> torch.Tensor:
    """``x ** exponent``, by torch's kernel of that power: sqrt (0.5), rsqrt (-0.5) and reciprocal (-1, a number over
    a tensor's) keep their result for backward, pow (any other) its input."""
    if exponent == -1:
        return torch.reciprocal(x)
    if exponent == 0.5:
        return torch.sqrt(x)
    if exponent == -0.5:
        return torch.rsqrt(x)
    return x.pow(exponent)


def _coordinates(x: torch.Tensor, start: float, end: float, dim: int, made: Optional[str] = None) -> torch.Tensor:
    """CoordConv's coordinate channel of the map ``x``: ``torch.linspace(start, end, x.shape[dim])`` viewed along
    ``dim`` (2: the rows, 3: the columns) and expanded to ``[N, 1, H, W]`` (one kernel; a view of its few floats);
    ``made`` ``arange``: as CoordConv's PyTorch port writes it (perf4sight.ir.coordinates), on the map's device."""
    if made == "arange":
        n, other = x.shape[dim], x.shape[5 - dim]
        counted = torch.arange(n, device=x.device).repeat(1, other, 1)
        if dim == 3:
            counted = counted.transpose(1, 2)
        scaled = counted.float() / (n - 1)
        if start == -1:
            scaled = scaled * 2 - 1
        return scaled.repeat(x.shape[0], 1, 1, 1).transpose(2, 3)
    if made == "arange_grid":  # one grid of a meshgrid of aranges: the arange spread over the map (views)
        h, w, n = x.shape[2], x.shape[3], x.shape[dim]
        line = torch.arange(n, device=x.device)
        grid = (line.view(h, 1) if dim == 2 else line.view(1, w)).expand(h, w).float() / (n - 1)
        if start == -1:
            grid = grid * 2 - 1
        return grid.view(1, 1, h, w).expand(x.shape[0], 1, h, w)
    steps = x.shape[dim]
    line = torch.linspace(start, end, steps, device=x.device)
    line = line.view(1, 1, steps, 1) if dim == 2 else line.view(1, 1, 1, steps)
    return line.expand(x.shape[0], 1, x.shape[2], x.shape[3])


def _variance(x: torch.Tensor, dims: List[int], correction: float, keepdim: bool) -> torch.Tensor:
    """The variance of ``x`` over ``dims``: squared deviations summed over their count less ``correction``, given as
    an integer where it is whole (torch before 2.1, a TX2's 1.10, takes an integer correction alone)."""
    whole = float(correction).is_integer()
    return torch.var(x, dims, correction=int(correction) if whole else correction, keepdim=keepdim)


def _where(x: torch.Tensor, branches: List, compare: str, threshold: float, if_true: Any,
           if_false: Any, inplace: bool = False, compare_inputs: bool = False, multiply: bool = False,
           float_mask: bool = False) -> torch.Tensor:
    """torch.where(x <compare> threshold, a, b): a and b the ``branches`` in that order, but where a number
    (``if_true``, ``if_false``; None where not); ``inplace``: ``b.masked_fill_(condition, if_true)``;
    ``compare_inputs``: x compared with the first of ``branches`` (a > b), the others the branches; ``multiply``:
    ``a * condition`` (of ``if_false`` 0: the mask multiplied in); ``float_mask``: the condition cast to float32
    first (the boolean one freed before the multiply, as ``x * (x > 0).float()`` runs)."""
    rest = list(branches)
    condition = {"gt": torch.gt, "ge": torch.ge, "lt": torch.lt, "le": torch.le, "eq": torch.eq,
                 "ne": torch.ne}[compare](x, rest.pop(0) if compare_inputs else threshold)
    if multiply and float_mask:
        condition = condition.float()
    if multiply:
        return rest[0] * condition
    return _where_of(condition, rest, if_true, if_false, inplace)


def _where_of(condition: torch.Tensor, branches: List, if_true: Any, if_false: Any, inplace: bool) -> torch.Tensor:
    """torch.where(condition, a, b) (:func:`_where`), or ``inplace`` ``b.masked_fill_(condition, if_true)``."""
    rest = list(branches)
    if inplace:
        return rest[-1].masked_fill_(condition, if_true)
    a = rest.pop(0) if if_true is None else if_true
    b = rest.pop(0) if if_false is None else if_false
    try:
        return torch.where(condition, a, b)
    except (TypeError, RuntimeError):  # a torch before 1.9 takes tensors alone: the number as a 0-d tensor
        like = b if isinstance(a, float) else a  # the tensor branch (a description has one at least)
        a, b = (torch.tensor(v, dtype=like.dtype, device=like.device) if isinstance(v, float) else v for v in (a, b))
        return torch.where(condition, a, b)


class FixedMaskWhere(nn.Module):
    """A ``where`` whose condition is a fixed boolean buffer (``mask``, of the node's ``mask_shape``: a registered
    attention mask; all false until a module's own is copied in, the description not holding its values)."""

    def __init__(self, attrs: Dict[str, Any], device: Any = None) -> None:
        super().__init__()
        self.register_buffer("mask", torch.zeros([int(v) for v in attrs["mask_shape"]], dtype=torch.bool,
                                                 device=device))
        self.if_true, self.if_false = (None if attrs.get(k) is None else float(attrs[k]) for k in ("if_true",
                                                                                                 "if_false"))
        self.inplace = bool(attrs.get("inplace", False))

    def forward(self, *branches: torch.Tensor) -> torch.Tensor:
        return _where_of(self.mask, list(branches), self.if_true, self.if_false, self.inplace)


def _sorted(x: torch.Tensor, dim: int, descending: bool) -> torch.Tensor:
    """torch.sort's values along ``dim``."""
    return torch.sort(x, dim, descending)[0]


def _top(x: torch.Tensor, k: int, dim: int, largest: bool) -> torch.Tensor:
    """torch.topk's values (the ``k`` largest or smallest along ``dim``, sorted)."""
    return torch.topk(x, k, dim, largest, True)[0]


def _gathered(y: torch.Tensor, indices: torch.Tensor, dim: int, ranks: Tuple[int, int]) -> torch.Tensor:
    """``y`` gathered along ``dim`` at ``indices`` (a sort's or a topk's; ``ranks``: theirs and y's, the batch
    counted), broadcast to y's shape but along dim (a view: unsqueezed and expanded, as token pruning's
    idx.unsqueeze(-1).expand(-1, -1, C)); y's sizes read at run time, so that the rebuilt network traces (described
    again at another input shape)."""
    for _ in range(ranks[1] - ranks[0]):
        indices = indices.unsqueeze(-1)
    return y.gather(dim, indices.expand([-1 if d == dim else y.size(d) for d in range(ranks[1])]))


def _sorted_gather(x: torch.Tensor, y: torch.Tensor, dim: int, descending: bool,
                   ranks: Tuple[int, int]) -> torch.Tensor:
    """``y`` gathered at the indices of torch.sort of ``x`` along ``dim`` (its values not read)."""
    return _gathered(y, _sort_indices(x, dim, descending), dim, ranks)


def _top_gather(x: torch.Tensor, y: torch.Tensor, k: int, dim: int, largest: bool,
                ranks: Tuple[int, int]) -> torch.Tensor:
    """``y`` gathered at the indices of torch.topk of ``x`` (its values not read)."""
    return _gathered(y, _top_indices(x, k, dim, largest), dim, ranks)


def _gather_ranks(args: List[fx.Node]) -> Tuple[int, int]:
    """The ranks (the batch counted) of a sort's or topk's input and of the tensor gathered at its indices, the
    first two of ``args``, as described (their nodes' shapes)."""
    return len(args[0].meta[DESCRIBED_SHAPE]) + 1, len(args[1].meta[DESCRIBED_SHAPE]) + 1


def _sort_indices(x: torch.Tensor, dim: int, descending: bool) -> torch.Tensor:
    """The indices of torch.sort of ``x`` (its values not read), for gathers at them."""
    return torch.sort(x, dim, descending)[1]


def _top_indices(x: torch.Tensor, k: int, dim: int, largest: bool) -> torch.Tensor:
    """The indices of torch.topk of ``x`` (its values not read), for gathers at them."""
    return torch.topk(x, k, dim, largest, True)[1]


def _sort_pair(x: torch.Tensor, dim: int, descending: bool) -> Tuple[torch.Tensor, torch.Tensor]:
    """torch.sort of ``x``: its values and indices."""
    return torch.sort(x, dim, descending)


def _top_pair(x: torch.Tensor, k: int, dim: int, largest: bool) -> Tuple[torch.Tensor, torch.Tensor]:
    """torch.topk of ``x``: its values and indices."""
    return torch.topk(x, k, dim, largest, True)


def _shared_indices(owner: fx.Node, graph: fx.Graph) -> fx.Node:
    """The indices of ``owner``, a rebuilt sort or topk of gather (:func:`_sorted_gather`, :func:`_top_gather`) or of
    its values (:func:`_sorted`, :func:`_top`), for a later node that gathers at them (``shares``): the first time,
    the owner is split into the call and its gather at the indices, or its values read, so that the call runs once."""
    if owner.target is _gathered:
        return owner.args[1]
    if owner.target is operator.getitem:  # the values of a call split before
        return next(u for u in owner.args[0].users if u.args[1] == 1)
    if owner.target in (_sorted, _top):
        with graph.inserting_before(owner):
            pair = graph.call_function(_sort_pair if owner.target is _sorted else _top_pair, tuple(owner.args))
            indices = graph.call_function(operator.getitem, (pair, 1))
        owner.target, owner.args = operator.getitem, (pair, 0)
        return indices
    x, y, ranks = owner.args[0], owner.args[1], owner.args[-1]
    with graph.inserting_before(owner):
        if owner.target is _top_gather:
            dim = owner.args[3]
            indices = graph.call_function(_top_indices, (x,) + tuple(owner.args[2:-1]))
        else:
            dim = owner.args[2]
            indices = graph.call_function(_sort_indices, (x,) + tuple(owner.args[2:-1]))
    owner.target, owner.args = _gathered, (y, indices, dim, ranks)
    return indices


def _affine_grid(theta: torch.Tensor, size: List[int], align_corners: bool) -> torch.Tensor:
    """F.affine_grid of the batch's [N, 2, 3] matrices for an [H, W] = ``size`` output (the channels a size of 1:
    the grid does not read them)."""
    return F.affine_grid(theta, [theta.shape[0], 1, int(size[0]), int(size[1])], align_corners=align_corners)


def _binary(fn: Callable, scalar_fn: Callable) -> Callable[[List, Dict], Tuple[Callable, Tuple]]:
    def build(args: List, a: Dict) -> Tuple[Callable, Tuple]:
        if "scalar" in a:
            return scalar_fn, (args[0], a["scalar"])
        return fn, tuple(args)
    return build


#: op -> (list of input fx nodes, attrs) -> (function, args) for ops without parameters or state.
FUNCTION_BUILDERS: Dict[str, Callable[[List, Dict], Tuple[Callable, Tuple]]] = {
    "add": _binary(operator.add, _scalar_add),
    "mul": _binary(operator.mul, _scalar_mul),
    "cat": lambda x, a: (torch.cat, (list(x), a["dim"])),
    "reshape": lambda x, a: _reshape(x[0], a["shape"]),
    "flatten": lambda x, a: (torch.flatten, (x[0], a["start_dim"])),
    "squeeze": lambda x, a: (torch.squeeze, (x[0], a["dim"])),
    "unsqueeze": lambda x, a: (torch.unsqueeze, (x[0], a["dim"])),
    "select": lambda x, a: (_select, (x[0], a["dim"], a["index"])),
    "narrow": lambda x, a: (_narrow, (x[0], a["dim"], a["start"], a["length"])),
    "transpose": lambda x, a: (torch.transpose, (x[0], a["dim0"], a["dim1"])),
    "mean": lambda x, a: (torch.mean, (x[0], list(a["dims"]), bool(a["keepdim"]))),
    "permute": lambda x, a: (_permute, (x[0], [int(d) for d in a["dims"]])),
    "interpolate": _resize,
    "pad": lambda x, a: (_pad, (x[0], [int(p) for p in a["pads"]], str(a["mode"]), float(a.get("value", 0.0)))),
    "pixel_shuffle": lambda x, a: (torch.pixel_shuffle, (x[0], int(a["upscale_factor"]))),
    "repeat": lambda x, a: (_repeat, (x[0], [int(r) for r in a["repeats"]])),
    "pixel_unshuffle": lambda x, a: (torch.pixel_unshuffle, (x[0], int(a["downscale_factor"]))),
    "pow": lambda x, a: (_power, (x[0], float(a["exponent"]))),
    "exp": lambda x, a: (torch.exp, (x[0],)),
    "abs": lambda x, a: (torch.abs, (x[0],)),
    "log": lambda x, a: (torch.log, (x[0],)),
    "normalize": lambda x, a: (F.normalize, (x[0], 2.0, int(a["dim"]), float(a.get("eps", 1e-12)))),
    "unfold": lambda x, a: (F.unfold, (x[0], _pair(a["kernel_size"]), _pair(a["dilation"]), _pair(a["padding"]),
                                       _pair(a["stride"]))),
    "fold": lambda x, a: (F.fold, (x[0], _pair(a["output_size"]), _pair(a["kernel_size"]), _pair(a["dilation"]),
                                   _pair(a["padding"]), _pair(a["stride"]))),
    "div": lambda x, a: (operator.truediv, (x[0], x[1])),
    "matmul": lambda x, a: (torch.matmul, (x[0], x[1])),
    # torch.max and torch.min of two tensors: torch's maximum and minimum (before torch 1.7 too)
    "maximum": lambda x, a: (torch.max, (x[0], x[1])),
    "minimum": lambda x, a: (torch.min, (x[0], x[1])),
    "flip": lambda x, a: (torch.flip, (x[0], [int(d) for d in a["dims"]])),
    "roll": lambda x, a: (torch.roll, (x[0], [int(s) for s in a["shifts"]], [int(d) for d in a["dims"]])),
    "var": lambda x, a: (_variance, (x[0], [int(d) for d in a["dims"]], float(a["correction"]), bool(a["keepdim"]))),
    "logsumexp": lambda x, a: (torch.logsumexp, (x[0], [int(d) for d in a["dims"]], bool(a["keepdim"]))),
    "cumsum": lambda x, a: (torch.cumsum, (x[0], int(a["dim"]))),
    "linspace": lambda x, a: (_coordinates, (x[0], float(a["start"]), float(a["end"]), int(a["dim"]),
                                             a.get("made"))),
    "affine_grid": lambda x, a: (_affine_grid, (x[0], [int(s) for s in a["size"]], bool(a["align_corners"]))),
    "grid_sample": lambda x, a: (F.grid_sample, (x[0], x[1], str(a["mode"]), str(a["padding_mode"]),
                                                 bool(a["align_corners"]))),
    "sort": lambda x, a: ((_sorted_gather, (x[0], x[1], int(a["dim"]), bool(a["descending"]), _gather_ranks(x)))
                          if a.get("gather") else (_sorted, (x[0], int(a["dim"]), bool(a["descending"])))),
    "topk": lambda x, a: ((_top_gather, (x[0], x[1], int(a["k"]), int(a["dim"]), bool(a["largest"]),
                                         _gather_ranks(x)))
                          if a.get("gather") else (_top, (x[0], int(a["k"]), int(a["dim"]), bool(a["largest"])))),
    "where": lambda x, a: (_where, (x[0], list(x[1:]), str(a["compare"]), float(a["threshold"]),
                                    *(None if a.get(k) is None else float(a[k]) for k in ("if_true", "if_false")),
                                    bool(a.get("inplace", False)), bool(a.get("compare_inputs", False)),
                                    bool(a.get("multiply", False)), bool(a.get("float_mask", False)))),
}


#: Names a layer of the rebuilt module cannot take: a Python keyword (``self.class`` is no code) or an attribute the
#: GraphModule has (``forward``, ``to``, ``eval``, ``training``, ``graph``, ``code``: add_module refuses them or
#: they shadow it).
_RESERVED = set(keyword.kwlist) | set(dir(fx.GraphModule)) | set(vars(nn.Module())) | {"graph", "code", "meta"}


def _attr_name(name: str, taken: Set[str]) -> str:
    base = re.sub(r"\W", "_", name) or "m"
    if base[0].isdigit() or base in _RESERVED:
        base = "m_" + base
    candidate, i = base, 1
    while candidate in taken:
        candidate, i = f"{base}_{i}", i + 1
    taken.add(candidate)
    return candidate


def build_module(desc: NetworkDescription, device: Optional[Union[torch.device, str]] = None,
                 unknown_frozen: Optional[List[str]] = None) -> fx.GraphModule:
    """A trainable GraphModule computing ``desc`` (input ``[N, *desc.input_shape]``), its parameters
    and buffers made on ``device`` (default: torch's default device). Passing ``device="meta"`` is
    about 20 % faster than building inside ``with torch.device("meta")``, which intercepts every call.
    A ``frozen_parameters`` entry that names no parameter of the rebuilt layers is a ``UserError``, or, given
    ``unknown_frozen``, added to it."""
    root = nn.Module()
    graph = fx.Graph()
    env: Dict[str, fx.Node] = {}
    taken: Set[str] = set()
    factory = {} if device is None else {"device": device}
    layers: Dict[str, str] = {}
    splits: Dict[Tuple[str, int, Tuple[int, ...], int], fx.Node] = {}  # one call a key (schema.PIECE_CALL)
    unbinds: Dict[Tuple[str, int, int], fx.Node] = {}
    for node in desc.nodes:
        group = split_group(node)
        unbound = unbind_group(node)
        if group is not None:
            env[node.name] = _split_piece(node, group, graph, env, splits)
        elif unbound is not None:  # a piece of one torch.unbind call, made at its first piece (as a split's)
            if unbound not in unbinds:
                unbinds[unbound] = graph.call_function(torch.unbind, (env[unbound[0]], unbound[1]))
            env[node.name] = graph.call_function(operator.getitem, (unbinds[unbound], int(node.attrs["index"])))
        else:
            env[node.name] = _emit(node, graph, root, env, taken, desc.name, factory, layers)
        env[node.name].meta[DESCRIBED_SHAPE] = list(node.output_shape)
    graph.output(env[desc.output])
    for name in desc.extra.get(FROZEN_LAYERS, ()):  # frozen as described (the profile's step leaves them untrained)
        getattr(root, layers[name]).requires_grad_(False)
    for entry in desc.extra.get(FROZEN_PARAMETERS, ()):  # a partly frozen layer's, a function call's
        try:
            _frozen_parameter_of(root, layers, entry, desc.name).requires_grad_(False)
        except UserError:
            if unknown_frozen is None:
                raise
            unknown_frozen.append(entry)
    gm = fx.GraphModule(root, graph, class_name=re.sub(r"\W", "_", desc.name) or "Network")
    gm.train()
    return gm


#: weight_norm's parameters as its parametrization names them -> as its hook does, which stands for it where torch
#: has no parametrization of it (before 2.1: a TX2's 1.10; :func:`_by_torch`)
_HOOK_FOR_PARAMETRIZATION = {"parametrizations.weight.original0": "weight_g",
                             "parametrizations.weight.original1": "weight_v"}


def _frozen_parameter_of(root: nn.Module, layers: Dict[str, str], entry: str, where: str) -> nn.Parameter:
    """The parameter of the rebuilt module ``root`` a :data:`FROZEN_PARAMETERS` entry names (``node.weight``:
    ``layers`` gives each node's layer); one it does not name is a ``UserError``."""
    found = frozen_parameter(entry, layers)
    layer = getattr(root, layers[found[0]]) if found else None
    value = layer
    for part in found[1].split(".") if found else ():
        value = getattr(value, part, None)
    if found and not isinstance(value, nn.Parameter):  # a weight_norm parametrization's g or v, where the hook
        value = getattr(layer, _HOOK_FOR_PARAMETRIZATION.get(found[1], ""), None)  # stands for it (torch < 2.1)
    if not isinstance(value, nn.Parameter):
        raise UserError(f"{where}: {FROZEN_PARAMETERS} names '{entry}', which is no parameter of the layer rebuilt of "
                        "its node")
    return value


def _split_piece(node: Node, group: Tuple[str, int, Tuple[int, ...], int], graph: fx.Graph,
                 env: Dict[str, fx.Node], splits: Dict[Tuple[str, int, Tuple[int, ...], int], fx.Node]
                 ) -> fx.Node:
    """A narrow of ``split_sizes`` (a piece of a torch.chunk or torch.split: ``group``, schema.split_group) as that
    piece of one ``torch.split`` call, made at its first piece: torch's split backward gathers the pieces' gradients
    into one ``cat`` (zeros for a piece no gradient reaches), where narrows' write each into zeros of the input's
    shape and add them up."""
    if group not in splits:
        splits[group] = graph.call_function(torch.split, (env[group[0]], list(group[2]), group[1]))
    sizes = group[2]
    index = [sum(sizes[:i]) for i in range(len(sizes))].index(int(node.attrs["start"]))
    return graph.call_function(operator.getitem, (splits[group], index))


#: Ops whose module keeps its node's op and attrs (``described_as``), so that a rebuilt network is described again
#: with the module whole: their forwards branch on the input's shape (a Swin window's padding, MaxViT's partitions),
#: which torch.fx cannot trace through.
DESCRIBED_WHOLE = ("window_attention", "patch_merge", "group_attention")


def _built(node: Node, attrs: Dict[str, Any], factory: Dict[str, Any]) -> nn.Module:
    """The module :data:`MODULE_BUILDERS` makes of ``node`` with ``attrs``; of a batchnorm2d of a ``[C]`` or
    ``[C, L]`` input (a head's BatchNorm1d, which BatchNorm2d refuses: it takes ``[N, C, H, W]`` alone), torch's
    BatchNorm1d."""
    if node.op == "batchnorm2d" and len(node.output_shape) < 3:
        return _batch_norm(nn.BatchNorm1d, attrs, factory)
    return MODULE_BUILDERS[node.op](attrs, **factory)


def _output_size(node: Node, graph: fx.Graph, env: Dict[str, fx.Node]) -> Dict[str, Any]:
    """The keyword arguments of a transposed convolution's call given its output size as another node's height and
    width (``output_size_of``, read at run time: ``like.shape[2:]``); none for any other node."""
    like = node.attrs.get("output_size_of") if node.op == "conv_transpose2d" else None
    if like is None:
        return {}
    shape = graph.call_function(getattr, (env[like], "shape"))
    return {"output_size": graph.call_function(operator.getitem, (shape, slice(2, None)))}


def _same_module(node: Node, owner: nn.Module) -> bool:
    """Whether ``owner``, the module of the node whose parameters ``node`` ``shares``, computes ``node``'s op: one
    layer called again. A scale sharing a shift's tensor (or a shift a scale's) is a module of its own."""
    if node.op == "where":  # a where reading an earlier one's fixed mask: a module of its own, that mask its buffer
        return False
    return node.op not in ONE_TENSOR_OPS or isinstance(owner, Scale if node.op == "scale" else Shift)


def _emit(node: Node, graph: fx.Graph, root: nn.Module, env: Dict[str, fx.Node], taken: Set[str],
          where: str, factory: Dict[str, Any], layers: Dict[str, str]) -> fx.Node:
    """The fx node computing ``node`` from its inputs' (``env``), its module (if any) added to ``root`` under a name
    recorded in ``layers`` (node name -> module name); a node that ``shares`` another's parameters calls that one's
    module again."""
    if node.op == "input":
        return graph.placeholder(_attr_name(node.name, taken))
    args = [env[i] for i in node.inputs]
    if SHARES in node.attrs and node.op in ("sort", "topk"):  # a gather at an earlier node's indices
        indices = _shared_indices(env[node.attrs[SHARES]], graph)
        return graph.call_function(_gathered, (args[1], indices, int(node.attrs["dim"]), _gather_ranks(args)))
    if SHARES in node.attrs and _same_module(node, getattr(root, layers[node.attrs[SHARES]])):
        layers[node.name] = layers[node.attrs[SHARES]]  # one layer called again: its module, its parameters
        return graph.call_module(layers[node.name], tuple(args), _output_size(node, graph, env))
    if node.op == "dropout2d" and len(node.output_shape) == 2:
        # of [C, L]: torch's Dropout1d (from 1.12; a Dropout2d of [N, C, L] dropped the same before, warns since)
        module = getattr(nn, "Dropout1d", nn.Dropout2d)(float(node.attrs["p"]))
        attr = _attr_name(node.name, taken)
        root.add_module(attr, module)
        return graph.call_module(attr, tuple(args))
    attrs = node.attrs
    if attrs.get("on_copy"):  # in place on a (contiguous) copy of its input: the copy, then the in-place activation
        copy = graph.call_method("clone", (args[0],), {"memory_format": torch.contiguous_format})
        args, attrs = [copy, *args[1:]], {**attrs, "inplace": True}
    if node.op in MODULE_BUILDERS:
        try:
            module = _built(node, attrs, factory)
        except (TypeError, ValueError, KeyError) as exc:
            raise UserError(f"{where}: node '{node.name}' ({node.op}) has bad attrs: {exc}") from None
        if node.op in DESCRIBED_WHOLE:
            module.described_as = (node.op, dict(node.attrs))
        if SHARES in node.attrs:  # a scale sharing a shift's tensor, or a shift a scale's: that one Parameter
            module.weight = getattr(root, layers[node.attrs[SHARES]]).weight
        attr = _attr_name(node.name, taken)
        root.add_module(attr, module)
        layers[node.name] = attr
        return graph.call_module(attr, tuple(args), _output_size(node, graph, env))
    if node.op == "where" and "mask_shape" in node.attrs:  # a buffer compared: a module that holds it
        attr = _attr_name(node.name, taken)
        module = FixedMaskWhere(node.attrs, factory.get("device"))
        if SHARES in node.attrs:  # the mask an earlier where reads: that one tensor
            module.mask = getattr(root, layers[node.attrs[SHARES]]).mask
        root.add_module(attr, module)
        layers[node.name] = attr
        return graph.call_module(attr, tuple(args))
    if SIZE_REFERENCES.get(node.op) in node.attrs:  # sized by another node's map, read at run time
        fn, fn_args = _sized_like(node, args[0], env[node.attrs[SIZE_REFERENCES[node.op]]])
        return graph.call_function(fn, fn_args)
    if node.op in FUNCTION_BUILDERS:
        fn, fn_args = FUNCTION_BUILDERS[node.op](args, node.attrs)
        return graph.call_function(fn, fn_args)
    raise UserError(f"{where}: node '{node.name}': op '{node.op}' cannot be built into a torch module")
