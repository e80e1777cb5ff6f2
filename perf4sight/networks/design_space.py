"""The multi-style design space (after PerfSeer): a network spec -> a network description.

A spec is plain data: four stages, each ``{"style", "depth", "width", "stride_at", ...knobs}``.
The description is emitted directly (shapes computed here, no torch), in the schema of
``perf4sight.ir.schema``. Layout: stem (3x3 conv, stride 2, 32 channels, batch norm, ReLU; stride 1
under :data:`FULL_STEM_INPUT` pixels, so that the last stage's maps are at least 2x2: batch norm cannot
train on a 1x1 map of a single image, and the profile stage measures batch size 1), four stages that each
halve the spatial size (stride 2 in their first or last block) and change the width to ``width``, then
global average pooling, flatten and a linear classifier.

Styles and their knobs (``STYLES``):
- ``vgg``: ``depth`` plain conv-BN-ReLU layers; ``kernel`` (3 or 5).
- ``inception``: ``depth`` blocks of ``branches`` (2-4) parallel branches concatenated:
  1x1 | 1x1->3x3 | 3x3 max pool->1x1 | 1x1->5x5, the 1x1 reductions at ``reduce`` x width.
- ``resnext``: ``depth`` bottleneck residual blocks; ``bottleneck`` (inner width / width)
  and ``group_width`` (channels per group of the 3x3 convolution).
- ``densenet``: one dense block of ``depth`` layers (BN-ReLU-1x1(4k)-BN-ReLU-3x3(k)), growth
  rate ``growth`` = k, and a transition (BN-ReLU-1x1, 2x2 average pool) before or after it.
- ``mobilenet``: ``depth`` inverted residual blocks; ``expansion`` (1, 3, 6), ``kernel`` (3, 5).
- ``convnext``: ``depth`` ConvNeXt blocks (a ``kernel`` x ``kernel`` depthwise convolution, then per pixel a
  layer norm and an MLP of ``expansion`` x width with GELU, between two permutes, a layer scale and the residual
  add), and a downsampling layer (layer norm over the channels, 2x2 convolution of stride 2 to ``width``) before
  or after them; ``expansion`` (2, 3, 4), ``kernel`` (3, 5, 7). Not among the default styles
  (:data:`DEFAULT_STYLES`): a config names it in ``[networks.generator] styles``.
- ``transformer``: ``depth`` pre-norm encoder blocks over the map's pixels as tokens (a hybrid stage, as CoAtNet's
  and MobileViT's later stages are): the map flattened to ``H x W`` tokens with a learnt position embedding, then
  per block a layer norm, multi-head self-attention (heads of ``head_dim`` channels, fewer where the width does not
  divide) and the residual add, a layer norm, an MLP of ``expansion`` x width with GELU and the residual add; the
  tokens folded back into the map, and a 2x2 convolution of stride 2 to ``width`` before or after the blocks;
  ``expansion`` (2, 4), ``head_dim`` (16, 32, 64). Its work is mostly matrix products, as a ViT's is. Not among the
  default styles either.
- ``dilated``: ``mobilenet``'s blocks, the depthwise convolutions of those that do not stride dilated by
  ``dilation`` (2), as a segmentation backbone's last stages are (torchvision's MobileNetV3 with ``dilated=True``).
  Not among the default styles either.
"""
from __future__ import annotations

from typing import Any

from perf4sight.errors import UserError
from perf4sight.ir.schema import NetworkDescription, Node, count_params

__all__ = ["STYLES", "DEFAULT_STYLES", "STEM_CHANNELS", "MIN_INPUT", "FULL_STEM_INPUT", "build_description"]

#: The styles a generator draws from unless its config names others: adding one here would change every
#: seed's networks, so a newer style joins :data:`STYLES` alone.
DEFAULT_STYLES: tuple[str, ...] = ("vgg", "inception", "resnext", "densenet", "mobilenet")
STYLES: tuple[str, ...] = DEFAULT_STYLES + ("convnext", "transformer", "dilated")
STEM_CHANNELS = 32
MIN_INPUT = 32  # pixels: four stride-2 steps after a stride-1 stem leave at least 2x2
FULL_STEM_INPUT = 64  # pixels: from here the stem strides by 2 too (five steps leave at least 2x2)


def _out(size: int, kernel: int, stride: int, pad: int) -> int:
    return (size + 2 * pad - kernel) // stride + 1


class _Builder:
    """Appends nodes with computed output shapes ([C, H, W], no batch)."""

    def __init__(self, input_shape: list[int]) -> None:
        self.nodes = [Node("input", "input", [], {}, list(input_shape))]
        self.shape = {"input": list(input_shape)}

    def _add(self, name: str, op: str, inputs: list[str], attrs: dict[str, Any], shape: list[int]) -> str:
        if min(shape) < 1:
            raise UserError(f"generator: node '{name}' would have an empty output {shape}; use a larger input")
        self.nodes.append(Node(name, op, inputs, attrs, shape))
        self.shape[name] = shape
        return name

    def conv(self, name: str, x: str, cout: int, kernel: int = 1, stride: int = 1, groups: int = 1,
             bias: bool = False, pad: int | None = None, dilation: int = 1) -> str:
        c, h, w = self.shape[x]
        pad = dilation * (kernel // 2) if pad is None else pad
        span = dilation * (kernel - 1) + 1  # the kernel's extent on the map
        attrs = {"in_channels": c, "out_channels": cout, "kernel_size": [kernel, kernel], "stride": [stride, stride],
                 "padding": [pad, pad], "dilation": [dilation, dilation], "groups": groups, "bias": bias}
        return self._add(name, "conv2d", [x], attrs, [cout, _out(h, span, stride, pad), _out(w, span, stride, pad)])

    def bn(self, name: str, x: str) -> str:
        return self._add(name, "batchnorm2d", [x], {"num_features": self.shape[x][0]}, list(self.shape[x]))

    def act(self, name: str, x: str, op: str = "relu") -> str:
        return self._add(name, op, [x], {}, list(self.shape[x]))

    def cbr(self, name: str, x: str, cout: int, kernel: int = 1, stride: int = 1, groups: int = 1,
            act: str | None = "relu", dilation: int = 1) -> str:
        """conv -> batch norm -> activation (none when ``act`` is None)."""
        y = self.bn(f"{name}_bn", self.conv(f"{name}_conv", x, cout, kernel, stride, groups, dilation=dilation))
        return self.act(f"{name}_{act}", y, act) if act else y

    def pool(self, name: str, x: str, op: str, kernel: int, stride: int, pad: int) -> str:
        c, h, w = self.shape[x]
        attrs: dict[str, Any] = {"kernel_size": [kernel, kernel], "stride": [stride, stride], "padding": [pad, pad],
                                 "ceil_mode": False}
        if op == "avgpool2d":
            attrs["count_include_pad"] = True
        return self._add(name, op, [x], attrs, [c, _out(h, kernel, stride, pad), _out(w, kernel, stride, pad)])

    def permute(self, name: str, x: str, dims: list[int]) -> str:
        """``dims`` count the batch (first, staying)."""
        return self._add(name, "permute", [x], {"dims": list(dims)}, [self.shape[x][d - 1] for d in dims[1:]])

    def layernorm(self, name: str, x: str) -> str:
        """A layer norm over the last dimension (ConvNeXt's epsilon)."""
        return self._add(name, "layernorm", [x], {"normalized_shape": [self.shape[x][-1]], "eps": 1e-6},
                         list(self.shape[x]))

    def linear(self, name: str, x: str, cout: int) -> str:
        """A linear layer (with bias) on the last dimension."""
        return self._add(name, "linear", [x], {"in_features": self.shape[x][-1], "out_features": cout, "bias": True},
                         self.shape[x][:-1] + [cout])

    def scale(self, name: str, x: str) -> str:
        """A learnt scale per channel of a [C, H, W] tensor (ConvNeXt's layer scale)."""
        return self._add(name, "scale", [x], {"shape": [self.shape[x][0], 1, 1]}, list(self.shape[x]))

    def add(self, name: str, a: str, b: str) -> str:
        return self._add(name, "add", [a, b], {}, list(self.shape[a]))

    def reshape(self, name: str, x: str, shape: list[int]) -> str:
        """A view of ``x`` as ``shape`` (per sample)."""
        return self._add(name, "reshape", [x], {"shape": list(shape)}, list(shape))

    def cat(self, name: str, xs: list[str]) -> str:
        _, h, w = self.shape[xs[0]]
        return self._add(name, "cat", list(xs), {"dim": 1}, [sum(self.shape[x][0] for x in xs), h, w])


def _vgg(b: _Builder, x: str, p: str, st: dict[str, Any], strides: list[int]) -> str:
    for i, s in enumerate(strides):
        x = b.cbr(f"{p}_b{i}", x, st["width"], st["kernel"], s)
    return x


def _split(total: int, parts: int) -> list[int]:
    base = max(1, total // parts)
    sizes = [base] * parts
    sizes[-1] = max(1, total - base * (parts - 1))
    return sizes


def _inception(b: _Builder, x: str, p: str, st: dict[str, Any], strides: list[int]) -> str:
    n = st["branches"]
    for i, s in enumerate(strides):
        q = f"{p}_b{i}"
        outs = _split(st["width"], n)
        red = max(8, int(st["reduce"] * st["width"]) // 8 * 8)
        branches = [b.cbr(f"{q}_1x1", x, outs[0], 1, s)]
        branches.append(b.cbr(f"{q}_3x3", b.cbr(f"{q}_3x3r", x, red), outs[1], 3, s))
        if n >= 3:
            pooled = b.pool(f"{q}_pool", x, "maxpool2d", 3, s, 1)
            branches.append(b.cbr(f"{q}_poolproj", pooled, outs[2]))
        if n >= 4:
            branches.append(b.cbr(f"{q}_5x5", b.cbr(f"{q}_5x5r", x, red), outs[3], 5, s))
        x = b.cat(f"{q}_cat", branches)
    return x


def _resnext(b: _Builder, x: str, p: str, st: dict[str, Any], strides: list[int]) -> str:
    gw = st["group_width"]
    inner = max(gw, round(st["bottleneck"] * st["width"] / gw) * gw)
    for i, s in enumerate(strides):
        q = f"{p}_b{i}"
        y = b.cbr(f"{q}_a", x, inner)
        y = b.cbr(f"{q}_b", y, inner, 3, s, groups=inner // gw)
        y = b.cbr(f"{q}_c", y, st["width"], act=None)
        short = x if s == 1 and b.shape[x][0] == st["width"] else b.cbr(f"{q}_proj", x, st["width"], 1, s, act=None)
        x = b.act(f"{q}_relu", b.add(f"{q}_add", y, short))
    return x


def _densenet(b: _Builder, x: str, p: str, st: dict[str, Any], strides: list[int]) -> str:
    k, depth = st["growth"], st["depth"]

    def transition(q: str, x: str, cout: int) -> str:
        y = b.conv(f"{q}_conv", b.act(f"{q}_relu", b.bn(f"{q}_bn", x)), cout)
        return b.pool(f"{q}_pool", y, "avgpool2d", 2, 2, 0)

    if st["stride_at"] == "first":
        x = transition(f"{p}_trans", x, max(k, st["width"] - depth * k))
    for i in range(depth):
        q = f"{p}_l{i}"
        y = b.conv(f"{q}_conv1", b.act(f"{q}_relu1", b.bn(f"{q}_bn1", x)), 4 * k)
        y = b.conv(f"{q}_conv2", b.act(f"{q}_relu2", b.bn(f"{q}_bn2", y)), k, 3)
        x = b.cat(f"{q}_cat", [x, y])
    if st["stride_at"] == "last":
        x = transition(f"{p}_trans", x, st["width"])
    return x


def _mobilenet(b: _Builder, x: str, p: str, st: dict[str, Any], strides: list[int]) -> str:
    """Inverted residual blocks; a ``dilated`` stage's depthwise convolutions dilate by ``dilation`` where they do
    not stride."""
    for i, s in enumerate(strides):
        q = f"{p}_b{i}"
        cin = b.shape[x][0]
        hidden = cin * st["expansion"]
        y = b.cbr(f"{q}_expand", x, hidden, act="relu6") if st["expansion"] != 1 else x
        y = b.cbr(f"{q}_dw", y, hidden, st["kernel"], s, groups=hidden, act="relu6",
                  dilation=st.get("dilation", 1) if s == 1 else 1)
        y = b.cbr(f"{q}_project", y, st["width"], act=None)
        x = b.add(f"{q}_add", y, x) if s == 1 and cin == st["width"] else y
    return x


def _convnext(b: _Builder, x: str, p: str, st: dict[str, Any], strides: list[int]) -> str:
    def downsample(q: str, x: str) -> str:
        normed = b.permute(f"{q}_nchw", b.layernorm(f"{q}_norm", b.permute(f"{q}_nhwc", x, [0, 2, 3, 1])), [0, 3, 1, 2])
        return b.conv(f"{q}_conv", normed, st["width"], 2, 2, bias=True, pad=0)

    if st["stride_at"] == "first":
        x = downsample(f"{p}_down", x)
    for i in range(st["depth"]):
        q = f"{p}_b{i}"
        c = b.shape[x][0]
        y = b.permute(f"{q}_nhwc", b.conv(f"{q}_dw", x, c, st["kernel"], groups=c, bias=True), [0, 2, 3, 1])
        y = b.linear(f"{q}_fc1", b.layernorm(f"{q}_norm", y), c * st["expansion"])
        y = b.linear(f"{q}_fc2", b.act(f"{q}_gelu", y, "gelu"), c)
        x = b.add(f"{q}_add", b.scale(f"{q}_scale", b.permute(f"{q}_nchw", y, [0, 3, 1, 2])), x)
    if st["stride_at"] == "last":
        x = downsample(f"{p}_down", x)
    return x


def _heads(width: int, head_dim: int) -> int:
    """Attention heads of about ``head_dim`` channels that divide ``width``."""
    heads = max(1, width // head_dim)
    while width % heads:
        heads -= 1
    return heads


def _transformer(b: _Builder, x: str, p: str, st: dict[str, Any], strides: list[int]) -> str:
    def downsample(q: str, x: str) -> str:
        return b.conv(f"{q}_conv", x, st["width"], 2, 2, bias=True, pad=0)

    if st["stride_at"] == "first":
        x = downsample(f"{p}_down", x)
    c, h, w = b.shape[x]
    t = b.permute(f"{p}_tokens", b.reshape(f"{p}_flat", x, [c, h * w]), [0, 2, 1])
    t = b._add(f"{p}_pos", "shift", [t], {"shape": [h * w, c]}, [h * w, c])
    for i in range(st["depth"]):
        q = f"{p}_b{i}"
        y = b._add(f"{q}_attn", "attention", [b.layernorm(f"{q}_ln1", t)],
                   {"embed_dim": c, "num_heads": _heads(c, st["head_dim"]), "bias": True}, [h * w, c])
        t = b.add(f"{q}_add1", y, t)
        y = b.linear(f"{q}_fc1", b.layernorm(f"{q}_ln2", t), c * st["expansion"])
        t = b.add(f"{q}_add2", b.linear(f"{q}_fc2", b.act(f"{q}_gelu", y, "gelu"), c), t)
    x = b.reshape(f"{p}_map", b.permute(f"{p}_channels", t, [0, 2, 1]), [c, h, w])
    if st["stride_at"] == "last":
        x = downsample(f"{p}_down", x)
    return x


_STAGES = {"vgg": _vgg, "inception": _inception, "resnext": _resnext, "densenet": _densenet, "mobilenet": _mobilenet,
           "convnext": _convnext, "transformer": _transformer, "dilated": _mobilenet}


def build_description(spec: list[dict[str, Any]], input_shape: list[int], num_classes: int, name: str,
                      network: str | None = None, **extra: Any) -> NetworkDescription:
    """Emit the description of ``spec`` (four stage dicts) at ``input_shape`` ([C, H, W])."""
    if min(input_shape[1:]) < MIN_INPUT:
        raise UserError(f"generator: input {input_shape[1]}x{input_shape[2]} is too small; "
                        f"generated networks need at least {MIN_INPUT}x{MIN_INPUT}")
    b = _Builder(input_shape)
    x = b.cbr("stem", "input", STEM_CHANNELS, 3, 2 if min(input_shape[1:]) >= FULL_STEM_INPUT else 1)
    for i, st in enumerate(spec):
        if st["style"] not in _STAGES:
            raise UserError(f"generator: unknown style '{st['style']}' (known: {', '.join(STYLES)})")
        depth = st["depth"]
        strides = [2 if (j == 0 and st["stride_at"] == "first") or (j == depth - 1 and st["stride_at"] == "last")
                   else 1 for j in range(depth)]
        x = _STAGES[st["style"]](b, x, f"s{i + 1}", st, strides)
    x = b._add("avgpool", "adaptiveavgpool2d", [x], {"output_size": [1, 1]}, [b.shape[x][0], 1, 1])
    x = b._add("flatten", "flatten", [x], {"start_dim": 1}, [b.shape[x][0]])
    out = b._add("fc", "linear", [x], {"in_features": b.shape[x][0], "out_features": num_classes, "bias": True},
                 [num_classes])
    desc = NetworkDescription(name=name, network=network or name, input_shape=list(input_shape),
                              num_classes=num_classes, params=0, nodes=b.nodes, output=out, extra=dict(extra))
    desc.params = count_params(desc)
    return desc
