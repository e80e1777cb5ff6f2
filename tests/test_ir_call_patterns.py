"""Call patterns of popular CNN research code (squeeze-excitation, CBAM, split attention, Res2Net, GhostNet):
described as torch computes them, or refused by name."""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from perf4sight.errors import UserError
from perf4sight.ir.from_torch import describe
from perf4sight.ir.to_torch import build_module

SHAPE = [3, 16, 16]


class _Probe(nn.Module):
    """A convolution, then ``pattern(self, y)`` on its output, then a classifier: one call pattern in a network."""

    def __init__(self, pattern) -> None:
        super().__init__()
        self.conv, self.pattern, self.fc = nn.Conv2d(3, 8, 3, padding=1), pattern, nn.Linear(8, 10)

    def forward(self, x):
        y = self.pattern(self, self.conv(x))
        return self.fc(F.adaptive_avg_pool2d(y, 1).flatten(1))


def _computes_the_same(module: nn.Module, shape: list[int] = SHAPE) -> list[str]:
    """The ops of ``module``'s description, once the module rebuilt from it, given ``module``'s weights, has computed
    what ``module`` computes."""
    desc = describe(module.eval(), shape, name="probe")
    assert desc.params == sum(p.numel() for p in module.parameters())
    rebuilt = build_module(desc).eval()
    for new, old in zip(rebuilt.parameters(), module.parameters()):
        new.data.copy_(old.data)
    x = torch.randn(2, *shape)
    assert torch.allclose(rebuilt(x), module(x), atol=1e-5)
    return [n.op for n in desc.nodes]


@pytest.mark.parametrize("pattern", [
    lambda s, y: y * y.mean((2, 3), keepdim=True).sigmoid().expand_as(y),
    lambda s, y: y.mean((2, 3), keepdim=True).expand(-1, -1, y.size(2), y.size(3)) + y,
    lambda s, y: y * torch.sigmoid(y.mean((2, 3), keepdim=True)).expand_as(y) * y.mean(1, keepdim=True).expand_as(y),
])
def test_an_expand_read_by_a_broadcasting_add_or_multiply_is_the_broadcast(pattern):
    """A squeeze-excitation's (and ECA's) ``x * s.expand_as(x)`` was refused ("call_method 'expand_as' has no
    description op"): the multiply broadcasts the gate as the expand did."""
    ops = _computes_the_same(_Probe(pattern))
    assert "mean" in ops and ("mul" in ops or "add" in ops)


@pytest.mark.parametrize("pattern", [
    lambda s, y: torch.cat([y, y.mean((2, 3), keepdim=True).expand_as(y) * 2], 1)[:, :8],
    lambda s, y: torch.cat([y, y.mean((2, 3), keepdim=True).expand_as(y) + 0.5], 1)[:, 8:],
    lambda s, y: torch.cat([y, y.mean((2, 3), keepdim=True).expand_as(y) * y.mean((2, 3), keepdim=True).expand_as(y)],
                           1)[:, 8:],
])
def test_an_expand_whose_shape_no_other_operand_broadcasts_to_is_refused_by_name(pattern):
    """An expand times a number, plus a number or times another expand of the same small tensor: nothing broadcasts
    the small tensor back to the expand's shape, so the tensor itself cannot stand for the expand (the rebuilt
    network's multiply gave [N, 8, 1, 1] where the description said [8, 16, 16], and its concatenation failed)."""
    with pytest.raises(UserError, match="expand_as.*read by anything but an add or multiply"):
        describe(_Probe(pattern), SHAPE, name="probe")


def test_expands_of_two_tensors_broadcasting_each_other_to_the_shape_are_the_broadcast():
    """Two expands whose tensors broadcast each other to the expanded shape (a channel gate and a spatial gate) are
    the broadcast of the two tensors."""
    ops = _computes_the_same(_Probe(lambda s, y: torch.cat([y, y.mean((2, 3), keepdim=True).expand_as(y)
                                                            * y.mean(1, keepdim=True).expand_as(y)], 1)[:, 8:]))
    assert ops.count("mean") == 2 and "cat" in ops


def test_an_expand_read_by_anything_else_is_refused_by_name():
    """Concatenated, an expanded tensor's copies are the op's input: no broadcast can stand for them."""
    module = _Probe(lambda s, y: torch.cat([y, y.mean((2, 3), keepdim=True).expand_as(y)], 1)[:, :8])
    with pytest.raises(UserError, match="expand_as.*read by anything but an add or multiply"):
        describe(module, SHAPE, name="probe")


@pytest.mark.parametrize("pattern, ops", [
    (lambda s, y: y * torch.max(y, dim=1, keepdim=True)[0], ["reshape", "adaptivemaxpool2d", "reshape"]),
    (lambda s, y: y * y.max(1, keepdim=True).values, ["reshape", "adaptivemaxpool2d", "reshape"]),
    (lambda s, y: y * torch.max(y, 1)[0].unsqueeze(1), ["reshape", "adaptivemaxpool2d", "reshape", "unsqueeze"]),
    (lambda s, y: y * y.amax((2, 3), keepdim=True), ["reshape", "adaptivemaxpool2d", "reshape"]),
    (lambda s, y: y * torch.min(y, 1, keepdim=True)[0], ["mul", "reshape", "adaptivemaxpool2d", "reshape", "mul"]),
    (lambda s, y: y * y.amin(-1, keepdim=True), ["mul", "reshape", "adaptivemaxpool2d", "reshape", "mul"]),
    (lambda s, y: y * F.adaptive_max_pool2d(y, 1), ["adaptivemaxpool2d"]),
])
def test_a_max_or_min_over_dimensions_is_an_adaptive_max_pool_of_a_view(pattern, ops):
    """CBAM's spatial attention pools ``torch.max(x, 1, keepdim=True)[0]`` (and its channel attention
    ``F.adaptive_max_pool2d``): refused ("call_function 'max' has no description op"). A max over dimensions is the
    input viewed as [before, over, after], an adaptive max pool to [before, 1, after] (the values and the indices
    torch keeps for backward) and a view; a min the max of the negated input, negated."""
    described = _computes_the_same(_Probe(pattern))
    assert described[2:2 + len(ops)] == ops


@pytest.mark.parametrize("pattern, expected", [
    (lambda s, y: y * torch.max(y, 1, keepdim=True)[1], r"the indices \(int64\) of call_function 'max'"),
    (lambda s, y: y * y.max(), "'max' .* has no description op"),
])
def test_a_max_the_description_cannot_hold_is_refused_by_name(pattern, expected):
    """(A max of two tensors, torch.max(y, y.sigmoid()), is the op maximum: tests/test_ir_user_calls.py.)"""
    with pytest.raises(UserError, match=expected):
        describe(_Probe(pattern), SHAPE, name="probe")


def test_the_indices_of_a_max_that_nothing_reads_are_left_out():
    """``values, _ = torch.max(x, dim=1, keepdim=True)`` traces the indices too, read by nothing."""
    class Unpacked(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.conv, self.fc = nn.Conv2d(3, 8, 3, padding=1), nn.Linear(8, 10)

        def forward(self, x):
            y = self.conv(x)
            values, _ = torch.max(y, dim=1, keepdim=True)
            return self.fc((y * values).mean((2, 3)))

    assert "adaptivemaxpool2d" in _computes_the_same(Unpacked())


class _RadixSum(nn.Module):
    """timm's split attention: the radix as a 5-D view, summed over, gated by a softmax over it, summed again."""

    def __init__(self, channels: int = 8, radix: int = 2) -> None:
        super().__init__()
        self.radix = radix
        self.conv = nn.Conv2d(3, channels * radix, 3, padding=1, groups=1)
        self.fc1, self.fc2 = nn.Conv2d(channels, 4, 1), nn.Conv2d(4, channels * radix, 1)
        self.fc = nn.Linear(channels, 10)

    def forward(self, x):
        x = self.conv(x)
        batch, rc, h, w = x.shape
        x = x.reshape((batch, self.radix, rc // self.radix, h, w))
        gap = x.sum(dim=1).mean((2, 3), keepdim=True)
        attn = self.fc2(torch.relu(self.fc1(gap))).view(batch, 1, self.radix, -1).transpose(1, 2)
        attn = F.softmax(attn, dim=1).reshape((batch, self.radix, rc // self.radix, 1, 1))
        out = torch.sum(x * attn, 1)
        return self.fc(out.sum((2, 3), keepdim=False) / (h * w))


def test_a_sum_over_dimensions_is_their_mean_times_their_count():
    """timm's split attention sums over its radix (``x.sum(dim=1)``): refused ("call_method 'sum' has no description
    op"). The mean over those dimensions times their elements' count computes the same."""
    ops = _computes_the_same(_RadixSum())
    assert ops.count("mean") == 4 and ops.count("mul") >= 4


def test_a_sum_over_every_dimension_or_the_batch_is_refused_by_name():
    for pattern in (lambda s, y: y * y.sum(), lambda s, y: y * y.sum(0, keepdim=True)):
        with pytest.raises(UserError, match="a sum over"):
            describe(_Probe(pattern), SHAPE, name="probe")


@pytest.mark.parametrize("pattern", [
    lambda s, y: torch.cat([y[:, :y.shape[1] // 2], y[:, y.size(1) // 2:] * 2], 1),
    lambda s, y: y / (y.shape[2] * y.shape[3]) + y * y.size(1),
    lambda s, y: y + y.sum((2, 3), keepdim=True) / (y.size(-1) * y.size(-2)),
])
def test_numbers_computed_from_shapes_are_the_numbers_they_are(pattern):
    """A slice's bounds from a shape (HRNet's ``y[:, :x.shape[1]]``), a tensor over or times a product of sides
    (``x / (h * w)``): refused ("slice indices must be integers", "a truediv of anything but a tensor by a number")."""
    _computes_the_same(_Probe(pattern))


def test_a_number_that_depends_on_the_batch_s_size_is_refused_by_name():
    with pytest.raises(UserError, match="depends on the batch's size"):
        describe(_Probe(lambda s, y: y / y.shape[0]), SHAPE, name="probe")


class _SplitAttention(nn.Module):
    """ResNeSt's split attention as its authors wrote it: the radix pieces from ``torch.split``, summed with Python's
    ``sum``, gated by a softmax over the radix, and put back together with ``zip`` over the pieces."""

    def __init__(self, channels: int = 8, radix: int = 2) -> None:
        super().__init__()
        self.radix = radix
        self.conv = nn.Conv2d(3, channels * radix, 3, padding=1)
        self.fc1, self.fc2 = nn.Conv2d(channels, 4, 1), nn.Conv2d(4, channels * radix, 1)
        self.fc = nn.Linear(channels, 10)

    def forward(self, x):
        x = self.conv(x)
        batch, rchannel = x.shape[:2]
        splits = torch.split(x, rchannel // self.radix, dim=1)
        gap = F.adaptive_avg_pool2d(sum(splits), 1)
        attn = self.fc2(torch.relu(self.fc1(gap))).view(batch, 1, self.radix, -1).transpose(1, 2)
        attn = F.softmax(attn, dim=1).reshape(batch, -1, 1, 1)
        out = sum(a * s for a, s in zip(torch.split(attn, rchannel // self.radix, dim=1), splits))
        for piece in out.chunk(2, 1):
            out = out + piece.mean(1, keepdim=True)
        return self.fc(out.mean((2, 3)))


def test_the_pieces_of_a_split_or_chunk_iterated_over_are_as_many_as_the_input_s_shape_makes():
    """``sum(splits)``, ``zip(attentions, splits)`` and a loop over a chunk's pieces were refused ("Proxy object
    cannot be iterated"): torch.fx cannot tell how many pieces there are. The trace stops there, counts them from the
    shapes of what it traced up to the split, and traces again."""
    ops = _computes_the_same(_SplitAttention())
    assert ops.count("narrow") >= 6 and "softmax" in ops  # (a piece taken at each iteration: views)


class _C2f(nn.Module):
    """YOLOv8's C2f block as ultralytics writes it: the pieces of ``pieces`` (a chunk or split) listed by ``listed``,
    each bottleneck appended to the list from its last piece, all concatenated."""

    def __init__(self, pieces, listed) -> None:
        super().__init__()
        self.cv1, self.pieces, self.listed = nn.Conv2d(3, 8, 1), pieces, listed
        self.m = nn.ModuleList(nn.Conv2d(4, 4, 3, padding=1) for _ in range(2))
        self.cv2, self.fc = nn.Conv2d(16, 8, 1), nn.Linear(8, 10)  # (in the order they run: weights copied so)

    def forward(self, x):
        y = self.listed(self.pieces(self.cv1(x)))
        y.extend(m(y[-1]) for m in self.m)
        return self.fc(self.cv2(torch.cat(y, 1)).mean((2, 3)))


@pytest.mark.parametrize("pieces", [lambda y: y.chunk(2, 1), lambda y: y.split((4, 4), 1),
                                    lambda y: torch.split(y, 4, dim=1)])
@pytest.mark.parametrize("listed", [list, lambda p: [p[i] for i in range(len(p))]])
def test_a_list_or_len_of_a_split_s_pieces_is_as_many_as_the_input_s_shape_makes(pieces, listed):
    """``list(x.chunk(2, 1))`` (ultralytics' C2f, in every YOLOv8) and ``len`` of a split's pieces were refused:
    torch.fx's ``len`` of a traced value raises, and ``list`` asks it. The pieces are counted as for a loop over
    them."""
    ops = _computes_the_same(_C2f(pieces, listed))
    assert ops.count("narrow") == 2 and ops.count("cat") == 1


class _TokenViT(nn.Module):
    """Patches, a class token put before them as research code often does (``tile(token, batch)`` one of
    ``token.repeat(B, 1, 1)``, ``token.tile((B, 1, 1))``, ``torch.tile(token, (B, 1, 1))``, ``token.expand(B, -1,
    -1)``), a layer norm and a classifier of the class token."""

    def __init__(self, tile) -> None:
        super().__init__()
        self.patches, self.tile = nn.Conv2d(3, 8, 4, 4), tile
        self.token, self.norm, self.fc = nn.Parameter(torch.randn(1, 1, 8)), nn.LayerNorm(8), nn.Linear(8, 10)

    def forward(self, x):
        tokens = self.patches(x).flatten(2).transpose(1, 2)
        tokens = torch.cat([self.tile(self.token, tokens.shape[0]), tokens], dim=1)
        return self.fc(self.norm(tokens)[:, 0])


@pytest.mark.parametrize("tile", [lambda t, b: t.repeat(b, 1, 1), lambda t, b: t.tile((b, 1, 1)),
                                  lambda t, b: torch.tile(t, (b, 1, 1)), lambda t, b: t.expand(b, -1, -1)])
def test_a_class_token_tiled_over_the_batch_is_a_token(tile):
    """A class token repeated or tiled over the batch (``self.cls_token.repeat(x.shape[0], 1, 1)``) was refused
    ("getitem depends on the batch's size (x.shape[0]), which a description leaves out"), where its expand was a
    token: each is the token now, and the rebuilt network computes what the original does."""
    original = _TokenViT(tile).eval()
    desc = describe(original, SHAPE, name="token_vit")
    assert [n.op for n in desc.nodes if n.op in ("token", "repeat")] == ["token"]
    rebuilt = build_module(desc).eval()
    weights = [*original.patches.parameters(), original.token, *original.norm.parameters(), *original.fc.parameters()]
    for new, old in zip(rebuilt.parameters(), weights, strict=True):
        new.data.copy_(old.data.reshape(new.shape))
    x = torch.randn(2, *SHAPE)
    assert torch.allclose(rebuilt(x), original(x), atol=1e-5)


@pytest.mark.parametrize("pattern", [
    lambda s, y: y - y.mean(1, keepdim=True),
    lambda s, y: y * (1 - torch.sigmoid(y)) + torch.rsub(y, 0.5),
    lambda s, y: torch.sub(y, y.sigmoid()),
])
def test_a_difference_of_two_tensors_or_of_a_number_and_a_tensor_is_an_add_of_the_negation(pattern):
    """``x - x.mean(1, keepdim=True)`` and a gated fusion's ``1 - g`` were refused ("a sub of anything but a tensor by
    a number has no description op"): the subtracted tensor times -1, added."""
    ops = _computes_the_same(_Probe(pattern))
    assert "add" in ops and "mul" in ops


@pytest.mark.parametrize("pattern, acts", [
    (lambda s, y: (torch.sigmoid_(y), torch.tanh_(y), y)[-1], [("sigmoid", True), ("tanh", True)]),
    (lambda s, y: y.sigmoid_() * y.clone().tanh_(), [("sigmoid", True), ("tanh", None)]),
    (lambda s, y: y * F.leaky_relu(y.clone(), 0.1, True), [("leaky_relu", None)]),
    (lambda s, y: y * F.leaky_relu(y.transpose(2, 3).contiguous(), 0.1, True).transpose(2, 3), [("leaky_relu", None)]),
    (lambda s, y: F.leaky_relu(y.contiguous(), 0.1, True), [("leaky_relu", True)]),  # y itself: written in place
    (lambda s, y: (F.relu_(y), torch.sigmoid_(y), y)[-1], [("relu", True), ("sigmoid", True)]),
    # a view of a copy: of a clone, of a contiguous copy transposed back (both descriptions' views of y itself)
    (lambda s, y: y * y.clone().flatten(2).relu_().view_as(y), [("relu", None)]),
    (lambda s, y: y * y.transpose(2, 3).contiguous().transpose(2, 3).tanh_(), [("tanh", None)]),
    (lambda s, y: y * y.flatten(2).sigmoid_().view_as(y), [("sigmoid", True)]),  # a view of y: y written
])
def test_an_in_place_sigmoid_or_tanh_is_the_activation_in_place(pattern, acts):
    """``y.sigmoid_()`` and ``y.tanh_()`` were refused ("call_method 'sigmoid_' has no description op"), then
    described as the activations out of place (a new output each, where torch writes the input); ``torch.sigmoid_(y)``
    and ``torch.tanh_(y)`` not assigned back were left out of what reads ``y`` after them, and ``F.relu_(y)`` was
    refused. Each is its activation in place, and the readers after it read it. An activation in place on a clone,
    or on a contiguous copy of a transposed map (an alias of ``y`` in a description), writes a copy of its own: it is
    the activation out of place (described in place, the rebuilt network wrote ``y``, which its later readers then
    read written: another function), as one on a view of such a copy is (``y.clone().flatten(2).relu_()``: in place
    on the view of an alias, the rebuilt network wrote ``y`` through it)."""
    ops = _computes_the_same(_Probe(pattern))
    desc = describe(_Probe(pattern).eval(), SHAPE, name="probe")
    written = [n for n in desc.nodes if n.op in ("sigmoid", "tanh", "leaky_relu", "relu")]
    assert [(n.op, n.attrs.get("inplace")) for n in written] == acts
    assert all(any(n.name in m.inputs for m in desc.nodes) for n in written) and acts[0][0] in ops


class _Gem(nn.Module):
    """GeM pooling (x.clamp(min=eps).pow(p).mean((2, 3)).pow(1 / p)) of a convolution's map, the map L2-normalised over
    its channels first (x / x.pow(2).sum(1, keepdim=True).sqrt()) and a hand-written norm over the channels after
    ((x - mu) * torch.rsqrt(var + eps), over torch.sqrt(var + eps) too), exp and abs on the way."""

    def __init__(self) -> None:
        super().__init__()
        self.conv, self.fc = nn.Conv2d(3, 8, 3, padding=1), nn.Linear(8, 10)

    def forward(self, x):
        y = self.conv(x)
        y = y / y.pow(2).sum(1, keepdim=True).sqrt()
        centred = y - y.mean(1, keepdim=True)
        var = torch.square(centred).mean(1, keepdim=True)
        y = centred * torch.rsqrt(var + 1e-5) + centred / torch.sqrt(var + 1e-5) + torch.exp(-y.abs()) + 1 / (2 + y)
        pooled = y.clamp(min=1e-6).pow(3.0).mean((2, 3)) ** (1 / 3.0)
        return self.fc(pooled)


def test_powers_quotients_exp_and_abs_are_described_as_torch_computes_them():
    """A tensor over a tensor (x / y, 1 / y), x.pow(p), x ** p, torch.square, sqrt, rsqrt, exp and abs were refused
    ("a truediv of anything but a tensor by a number", "call_method 'pow' has no description op", ...): they are
    the ops div, pow (sqrt and rsqrt its exponents 0.5 and -0.5), exp and abs, a number over a tensor the tensor's
    power -1 times the number; the rebuilt module computes what GeM, an L2 normalisation and a hand-written norm do."""
    ops = _computes_the_same(_Gem())
    assert {"pow", "exp", "abs"} <= set(ops) and ops.count("div") == 2
    desc = describe(_Gem().eval(), SHAPE, name="gem")
    exponents = sorted(n.attrs["exponent"] for n in desc.nodes if n.op == "pow")
    assert exponents == sorted([2.0, 0.5, 2.0, -0.5, 0.5, -1.0, 3.0, 1 / 3.0])


@pytest.mark.parametrize("pattern", [lambda s, y: 2 ** y, lambda s, y: y ** y.mean(1, keepdim=True)])
def test_a_power_by_a_tensor_is_refused_by_name(pattern):
    with pytest.raises(UserError, match="a power of anything but a tensor by a number"):
        describe(_Probe(pattern), SHAPE, name="probe")


class _Eca(nn.Module):
    """ECA-Net's gate as its authors wrote it: y = avgpool(x); conv1d(y.squeeze(-1).transpose(-1, -2)) (kernel k,
    padding k // 2, no bias), transposed back, unsqueezed, a sigmoid; x * y.expand_as(x)."""

    def __init__(self, conv: nn.Conv1d) -> None:
        super().__init__()
        self.conv, self.pool, self.eca = nn.Conv2d(3, 8, 3, padding=1), nn.AdaptiveAvgPool2d(1), conv
        self.fc = nn.Linear(8, 10)

    def forward(self, x):
        x = self.conv(x)
        y = self.eca(self.pool(x).squeeze(-1).transpose(-1, -2)).transpose(-1, -2).unsqueeze(-1)
        return self.fc((x * y.sigmoid().expand_as(x)).mean((2, 3)))


@pytest.mark.parametrize("conv", [nn.Conv1d(1, 1, 3, padding=1, bias=False), nn.Conv1d(1, 1, 5, padding="same"),
                                  nn.Conv1d(1, 1, 3, padding=2, dilation=2, bias=False)])
def test_an_eca_gate_s_conv1d_is_a_conv2d_of_a_one_pixel_high_view(conv):
    """nn.Conv1d was refused ("module 'eca' of type Conv1d has no description op"): it is the convolution of kernel
    (1, k) of its [N, C, L] input viewed as [N, C, 1, L], viewed back, as torch runs it; the rebuilt module (its
    weight [1, 1, 1, k], the Conv1d's [1, 1, k] copied in) computes what ECA's gate does."""
    ops = _computes_the_same(_Eca(conv))
    assert ops[ops.index("transpose") + 1:ops.index("transpose") + 4] == ["unsqueeze", "conv2d", "squeeze"]
    eca = next(n for n in describe(_Eca(conv).eval(), SHAPE, name="eca").nodes if n.name == "eca")
    k, d = conv.kernel_size[0], conv.dilation[0]
    assert (eca.attrs["kernel_size"], eca.attrs["padding"], eca.attrs["dilation"]) == ([1, k], [0, d * (k - 1) // 2],
                                                                                        [1, d])
    assert eca.output_shape == [1, 1, 8]


@pytest.mark.parametrize("conv,words", [(nn.Conv1d(1, 1, 4, padding="same"), "pads one side more"),
                                        (nn.Conv1d(1, 1, 3, padding=1, padding_mode="circular"), "padding_mode")])
def test_a_conv1d_a_description_cannot_say_is_refused_by_name(conv, words):
    with pytest.raises(UserError, match=f"cannot describe node eca .*Conv1d.*{words}"):
        describe(_Eca(conv), SHAPE, name="eca")


class _SelectiveKernel(nn.Module):
    """SKNet's selective kernel: two branches stacked (torch.stack(..., 1): [N, 2, C, H, W]), summed, squeezed to
    an attention per branch and channel (a softmax over the branches), the stacked branches weighted and summed;
    then torch.unbind's pieces of the stack, added."""

    def __init__(self) -> None:
        super().__init__()
        self.stem, self.b1, self.b2 = nn.Conv2d(3, 8, 3, padding=1), nn.Conv2d(8, 8, 3, padding=1), nn.Conv2d(
            8, 8, 3, padding=2, dilation=2)
        self.squeeze, self.select, self.fc = nn.Conv2d(8, 4, 1), nn.Conv2d(4, 16, 1), nn.Linear(8, 10)

    def forward(self, x):
        x = torch.relu(self.stem(x))
        feats = torch.stack([self.b1(x), self.b2(x)], dim=1)
        attention = self.select(torch.relu(self.squeeze(feats.sum(1).mean((2, 3), keepdim=True))))
        y = (feats * attention.view(x.shape[0], 2, 8, 1, 1).softmax(1)).sum(1)
        first, second = torch.unbind(torch.stack([y, y * 2], -1), -1)
        return self.fc((first + second).mean((2, 3)))


def test_a_stack_and_its_unbind_are_unsqueezes_concatenated_and_selects():
    """torch.stack and torch.unbind were refused ("call_function 'stack' has no description op"): a stack is each
    tensor unsqueezed at its dim, concatenated along it (torch's own stack), an unbind's pieces are selects (views)."""
    ops = _computes_the_same(_SelectiveKernel())
    assert ops.count("cat") == 2 and ops.count("unsqueeze") == 4 and ops.count("select") == 2


@pytest.mark.parametrize("pattern,words", [
    (lambda s, y: torch.stack([y, y], 0).mean(0), "a stack along the batch dimension"),
    (lambda s, y: sum(torch.unbind(y, 0)).expand_as(y) * y, "an unbind along the batch dimension"),
])
def test_a_stack_or_unbind_of_the_batch_is_refused_by_name(pattern, words):
    with pytest.raises(UserError, match=words):
        describe(_Probe(pattern), SHAPE, name="probe")


@pytest.mark.parametrize("pattern,repeats", [
    (lambda s, y: y.mean(1, keepdim=True).repeat(1, 8, 1, 1) * y, [8, 1, 1]),
    (lambda s, y: torch.tile(y.mean(1, keepdim=True), (8, 1, 1)) + y, [8, 1, 1]),  # dims filled with ones in front
    (lambda s, y: y.repeat((1, 1, 2, 3))[:, :, :, :16], [1, 2, 3]),
    (lambda s, y: y[:, :4].unsqueeze(2).tile((1, 1, y.shape[1] // 4, 1, 1)).flatten(1, 2), [1, 2, 1, 1]),
    (lambda s, y: y.repeat(1, 1, 1, 1), [1, 1, 1])])
def test_a_repeat_or_tile_is_described(pattern, repeats):
    """x.repeat(1, c, 1, 1), x.tile and torch.tile (a channel gate tiled over the channels, a map tiled in space) were
    refused, naming the expand that describes a tiling read by a broadcasting add or multiply: they are the op repeat
    (its counts after the batch's), rebuilt by x.repeat, which computes what the module computes."""
    assert "repeat" in _computes_the_same(_Probe(pattern))
    assert [n.attrs["repeats"] for n in describe(_Probe(pattern), SHAPE, name="probe").nodes
            if n.op == "repeat"] == [repeats]


@pytest.mark.parametrize("pattern,words", [
    (lambda s, y: y.repeat(2, 1, 1, 1)[:1], r"a repeat of \[2, 1, 1, 1\] tiles the batch"),
    (lambda s, y: y.repeat(1, 1, 1, 1, 1)[0], r"a repeat of \[1, 1, 1, 1, 1\] .*adds dimensions before it"),
    (lambda s, y: torch.tile(y, (2, 1, 1, 1, 1))[0], r"a tile of \[2, 1, 1, 1, 1\]"),
    (lambda s, y: torch.cat([y, y.repeat(1, 0, 1, 1)], 1), "repeats nothing")])
def test_a_repeat_of_the_batch_is_refused_by_name(pattern, words):
    with pytest.raises(UserError, match=words):
        describe(_Probe(pattern), SHAPE, name="probe")


class _ChannelNorm(nn.Module):
    """A layer norm over the channels written by hand, as ConvNeXt's channels-first one and many others are:
    (x - mu) / torch.sqrt(var + eps) of torch's var (unbiased=False); then variances and a standard deviation."""

    def __init__(self) -> None:
        super().__init__()
        self.conv, self.fc = nn.Conv2d(3, 8, 3, padding=1), nn.Linear(8, 10)

    def forward(self, x):
        y = self.conv(x)
        y = (y - y.mean(1, keepdim=True)) / torch.sqrt(y.var(1, keepdim=True, unbiased=False) + 1e-6)
        return self.fc(y.var((2, 3)) + torch.var(y, (2, 3), correction=0) + y.std((2, 3)))


def test_a_variance_is_described_as_torch_computes_it():
    """x.var(1, keepdim=True, unbiased=False) was refused ("call_method 'var' has no description op"): it is the op
    var, over the dims torch's is, of its correction (torch's default 1, unbiased; 0 biased); x.std(dims) its square
    root."""
    ops = _computes_the_same(_ChannelNorm())
    assert ops.count("var") == 4 and "div" in ops
    desc = describe(_ChannelNorm().eval(), SHAPE, name="norm")
    assert [(n.attrs["dims"], n.attrs["keepdim"], n.attrs["correction"]) for n in desc.nodes if n.op == "var"] == [
        ([1], True, 0.0), ([2, 3], False, 1.0), ([2, 3], False, 0.0), ([2, 3], False, 1.0)]


@pytest.mark.parametrize("pattern,words", [(lambda s, y: y * y.var(), "a variance"),
                                           (lambda s, y: y * y.std(), "a standard deviation")])
def test_a_variance_over_every_dimension_is_refused_by_name(pattern, words):
    with pytest.raises(UserError, match=f"{words} over every dimension"):
        describe(_Probe(pattern), SHAPE, name="probe")


@pytest.mark.parametrize("pattern,words", [(lambda s, y: y * y.var(False), "a variance over every dimension"),
                                           (lambda s, y: y * y.std(True), "a standard deviation over every dimension"),
                                           (lambda s, y: y * y.std(0), "a standard deviation over the batch")])
def test_a_deviation_over_the_batch_is_refused_by_name(pattern, words):
    """x.var(False) (torch's unbiased over every dimension) was described as a variance over dimension 0 (computing
    another value), x.std(True) over dimension 1, and x.std(0) over the batch described whole: each is refused."""
    with pytest.raises(UserError, match=words):
        describe(_Probe(pattern), SHAPE, name="probe")


class _LessModuleTensor(nn.Module):
    """An input normalised by the module's own tensors, ``(x - mean) / std`` (buffers), or less a learnt parameter."""

    def __init__(self, less: str) -> None:
        super().__init__()
        self.less = less
        self.register_buffer("mean", torch.tensor([0.485, 0.456, 0.406]).view(1, 3, 1, 1))
        self.offset = nn.Parameter(torch.zeros(1, 3, 1, 1))
        self.conv, self.fc = nn.Conv2d(3, 8, 3), nn.Linear(8, 10)

    def forward(self, x):
        x = {"buffer": lambda: x - self.mean, "parameter": lambda: x - self.offset,
             "from parameter": lambda: self.offset - x}[self.less]()
        return self.fc(self.conv(x).mean((2, 3)))


@pytest.mark.parametrize("less", ["buffer", "parameter", "from parameter"])
def test_a_difference_with_a_module_tensor_is_refused_naming_it(less):
    """A difference of a tensor and the module's own tensor (a buffer's mean, a parameter) was refused with "cannot
    describe node sub (KeyError: 'mean')": it is refused naming the module tensor."""
    with pytest.raises(UserError, match=r"node sub \(ValueError: a sub of the module's tensor (mean|offset) has no "
                                        r"description op"):
        describe(_LessModuleTensor(less), SHAPE, name="probe")


class _OverModuleTensor(nn.Module):
    """An input over the module's own tensor (``x / std``, a buffer; a number over a parameter)."""

    def __init__(self, over: str) -> None:
        super().__init__()
        self.over = over
        self.register_buffer("std", torch.tensor([0.229, 0.224, 0.225]).view(1, 3, 1, 1))
        self.spread = nn.Parameter(torch.ones(1, 3, 1, 1))
        self.conv, self.fc = nn.Conv2d(3, 8, 3), nn.Linear(8, 10)

    def forward(self, x):
        x = {"buffer": lambda: x / self.std, "by parameter": lambda: x * (2 / self.spread),
             "parameter over": lambda: self.spread / x}[self.over]()
        return self.fc(self.conv(x).mean((2, 3)))


@pytest.mark.parametrize("over", ["buffer", "by parameter", "parameter over"])
def test_a_quotient_with_a_module_tensor_is_refused_naming_it(over):
    """A quotient of a tensor and the module's own tensor (an input normalised by a buffer's std) stopped with
    "cannot describe node truediv (KeyError: 'std')", as a difference did: it is refused naming the module tensor."""
    with pytest.raises(UserError, match=r"node truediv\w* \(ValueError: a div of the module's tensor (std|spread) has "
                                        r"no description op"):
        describe(_OverModuleTensor(over), SHAPE, name="probe")


class _ReducedParameter(nn.Module):
    """A map times a sum or a max over the channels of the module's own parameter."""

    def __init__(self, reduce) -> None:
        super().__init__()
        self.reduce, self.weights = reduce, nn.Parameter(torch.randn(1, 8, 4, 4))
        self.conv, self.fc = nn.Conv2d(3, 8, 3, stride=4, padding=1), nn.Linear(8, 10)

    def forward(self, x):
        return self.fc((self.conv(x) * self.reduce(self.weights)).mean((2, 3)))


@pytest.mark.parametrize("reduce, words", [(lambda p: p.sum(1, keepdim=True), "a sum"),
                                           (lambda p: p.amax(1, keepdim=True), "a max or min"),
                                           (lambda p: torch.max(p, 1, keepdim=True)[0], "a max or min"),
                                           (lambda p: p.std(1, keepdim=True), "a standard deviation"),
                                           (lambda p: torch.stack([p, p], 1).sum(1), "a stack"),
                                           (lambda p: torch.unbind(p, 1)[0].unsqueeze(1), "an unbind")])
def test_a_sum_or_max_of_a_module_tensor_is_refused_naming_it(reduce, words):
    """A sum or max over the module's own parameter stopped with "cannot describe node sum_1 (KeyError: 'weights')",
    and so did a standard deviation of it, a stack or an unbind (whose refusal read "a unbind")."""
    with pytest.raises(UserError, match=f"{words} of the module's tensor weights has no description op"):
        describe(_ReducedParameter(reduce), SHAPE, name="probe")


@pytest.mark.parametrize("pattern", [
    lambda s, y: torch.add(y, other=2),
    lambda s, y: torch.mul(y, other=3),
    lambda s, y: y.add(other=0.5),
    lambda s, y: torch.mul(y, other=y.shape[2]),
])
def test_a_number_given_as_other_is_the_scalar(pattern):
    """An add or multiply of a tensor and a number given as ``other=`` stopped with "cannot describe node add
    (StopIteration)": the number was looked for among the positional arguments alone."""
    assert "add" in _computes_the_same(_Probe(pattern)) or "mul" in _computes_the_same(_Probe(pattern))


@pytest.mark.parametrize("pattern, op", [(lambda s, y: torch.sub(y, other=y.mean(1, keepdim=True)), "add"),
                                         (lambda s, y: torch.rsub(y, other=y.sigmoid()), "add"),
                                         (lambda s, y: torch.div(y, other=y.abs() + 1), "div"),
                                         (lambda s, y: y.div(other=y.abs() + 1, rounding_mode=None), "div")])
def test_a_tensor_given_as_other_is_subtracted_or_divided_by(pattern, op):
    """A difference or quotient of two tensors, the second given as ``other=``, was refused ("a sub of anything but
    a tensor by a number"): the second tensor was looked for among the positional arguments alone."""
    assert op in _computes_the_same(_Probe(pattern))


@pytest.mark.parametrize("pattern", [lambda s, y: torch.add(y, 2, alpha=3),
                                     lambda s, y: torch.add(y, y * 2, alpha=3),
                                     lambda s, y: y.add(y, alpha=0.5)])
def test_an_add_of_another_alpha_than_1_is_refused_by_name(pattern):
    """``torch.add(x, y, alpha=a)`` is x + a y: it was described as x + y, the rebuilt network computing something
    else."""
    with pytest.raises(UserError, match=r"an add of alpha 3|an add of alpha 0.5"):
        describe(_Probe(pattern), SHAPE, name="probe")


@pytest.mark.parametrize("pattern, words", [(lambda s, y: torch.sub(y, y.sigmoid(), alpha=2),
                                             r"a sub of alpha 2 \(x - alpha \* y\)"),
                                            (lambda s, y: torch.sub(y, 0.5, alpha=2), r"a sub of alpha 2 \(x - alpha"),
                                            (lambda s, y: y.sub(y.mean(1, keepdim=True), alpha=0.5),
                                             r"a sub of alpha 0.5 \(x - alpha \* y\)"),
                                            (lambda s, y: torch.rsub(y, y.sigmoid(), alpha=3),
                                             r"an rsub of alpha 3 \(y - alpha \* x\)")])
def test_a_sub_of_another_alpha_than_1_is_refused_naming_alpha(pattern, words):
    """``torch.sub(x, y, alpha=a)`` (x - a y) was refused with the scalar rule's "a sub of anything but a tensor by a
    number", which names neither alpha nor what to do; it is refused as an add of alpha is."""
    with pytest.raises(UserError, match=rf"{words}.* has no description op; multiply y first"):
        describe(_Probe(pattern), SHAPE, name="probe")


@pytest.mark.parametrize("pattern", [lambda s, y: torch.sub(y, y.sigmoid(), alpha=1),
                                     lambda s, y: y.sub(0.5, alpha=1)])
def test_a_sub_of_alpha_1_is_a_sub(pattern):
    """An alpha of 1, torch's default, leaves a difference a difference (it was refused as any keyword was)."""
    assert "add" in _computes_the_same(_Probe(pattern))


@pytest.mark.parametrize("module", [_Probe(lambda s, y: F.lp_pool2d(y, 2.0, 2)),
                                    _Probe(lambda s, y: F.lp_pool1d(y.flatten(2), 2.0, 4).unsqueeze(3)),
                                    nn.Sequential(nn.Conv2d(3, 8, 3), nn.LPPool2d(3, 2), nn.Flatten())])
def test_an_lp_pool_is_refused_saying_why(module):
    """An LP pool was refused as any layer without a description op is: it now says why (torch runs it op by op,
    with a sign no description op has, and a root a rebuild would run as a square root) and what describes nearly
    the same."""
    with pytest.raises(UserError, match=r"an LP pool has no description op: .*sign.*F.avg_pool2d\(x.pow\(p\), k, "
                                        r"s\).*s the stride"):
        describe(module, SHAPE, name="probe")


class _Deformable(nn.Module):
    """A deformable convolution as DCN-style detectors write it: offsets from a convolution, then torchvision's
    ``DeformConv2d`` (or its ``deform_conv2d`` on the layer's weight)."""

    def __init__(self, functional: bool) -> None:
        super().__init__()
        from torchvision.ops import DeformConv2d

        self.offset, self.dcn, self.functional = nn.Conv2d(3, 18, 3, padding=1), DeformConv2d(3, 8, 3, padding=1), \
            functional

    def forward(self, x):
        if self.functional:
            from torchvision.ops import deform_conv2d

            return deform_conv2d(x, self.offset(x), self.dcn.weight, self.dcn.bias, padding=(1, 1))
        return self.dcn(x, self.offset(x))


@pytest.mark.parametrize("functional", [False, True])
def test_a_deformable_convolution_is_refused_by_name(functional):
    """torchvision's deformable convolution was refused as "cannot trace the module with torch.fx (TraceError:
    symbolically traced variables cannot be used as inputs to control flow)", naming neither the layer nor where."""
    pytest.importorskip("torchvision")
    with pytest.raises(UserError, match=r"^probe: a deformable convolution \(torchvision's DeformConv2d, "
                                        r"deform_conv2d: node deform_conv2d\) has no op in the description$"):
        describe(_Deformable(functional), SHAPE, name="probe")


def test_a_trace_that_fails_in_the_model_s_own_code_names_its_line():
    """Where torch.fx stops in the model's own code, the line is named."""
    class Branchy(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.conv = nn.Conv2d(3, 8, 3)

        def forward(self, x):
            y = self.conv(x)
            if y.sum() > 0:
                return y
            return -y
    with pytest.raises(UserError, match=r"^probe: cannot trace the module with torch\.fx \(TraceError: .*\) in "
                                        r"test_ir_call_patterns\.py line \d+ \(forward\)$"):
        describe(Branchy(), SHAPE, name="probe")


@pytest.mark.parametrize("pattern", [lambda s, y: y * s.gamma.view(1, -1, 1, 1),
                                     lambda s, y: s.gamma[:, None, None] * y,
                                     lambda s, y: s.gamma.unsqueeze(-1).unsqueeze(-1) * y,
                                     lambda s, y: y + s.gamma.reshape(8, 1, 1)])
def test_a_parameter_viewed_to_broadcast_over_a_map_is_a_scale_or_shift(pattern):
    """A layer scale shaped to broadcast over a map (PoolFormer's ``layer_scale.unsqueeze(-1).unsqueeze(-1) * x``,
    ``x * gamma.view(1, -1, 1, 1)``, ``gamma[:, None, None] * x``) was refused: the view "reads the module's
    parameter directly", the index "has no description op". It is the ``scale`` (an add: the ``shift``) of the
    viewed shape, one sample's."""
    module = _Probe(pattern)
    module.gamma = nn.Parameter(torch.randn(8))
    desc = describe(module.eval(), SHAPE, name="probe")
    (own,) = [n for n in desc.nodes if n.op in ("scale", "shift")]
    assert own.attrs["shape"] == [8, 1, 1] and desc.params == sum(p.numel() for p in module.parameters())
    rebuilt = build_module(desc).eval()
    originals = [module.conv.weight, module.conv.bias, module.gamma, *module.fc.parameters()]  # in the order run
    for new, old in zip(rebuilt.parameters(), originals):
        new.data.copy_(old.data.view_as(new))
    x = torch.randn(2, *SHAPE)
    assert torch.allclose(rebuilt(x), module(x), atol=1e-6)


def test_a_view_of_a_parameter_that_regroups_its_dimensions_is_still_refused():
    """Only views that add or drop dimensions of size 1 are read as a scale's shape: one regrouping a [4, 2] table is
    refused as before."""
    module = _Probe(lambda s, y: y * s.table.view(2, 4).reshape(8, 1, 1))
    module.table = nn.Parameter(torch.randn(4, 2))
    with pytest.raises(UserError, match=r"view \(node view\) computes from the module's parameter table alone"):
        describe(module, SHAPE, name="probe")


@pytest.mark.parametrize("weights", [lambda w: F.relu(w) / (F.relu(w).sum() + 1e-4),
                                     lambda w: torch.softmax(w, 0), lambda w: w.softmax(dim=0)])
def test_weights_computed_from_parameters_alone_are_refused_naming_the_parameter(weights):
    """Weights computed from a parameter alone (``relu(w) / sum``, or a softmax of ``w``) in a form BiFPN's fusion
    (the op weighted_sum) does not take, a weight read twice: the softmax was refused as "a softmax over the batch
    dimension", the parameter's one dimension read as the batch."""
    def fuse(s, y):
        w = weights(s.w)
        return w[0] * y + w[1] * y.sigmoid() + w[0] * y.tanh()
    module = _Probe(fuse)
    module.w = nn.Parameter(torch.ones(2))
    with pytest.raises(UserError, match=r"^probe: \w+ \(node \w+\) computes from the module's parameter w alone, "
                                        r"not from the network's input: the description has no op for weights "
                                        r"computed from parameters but BiFPN's fusion \(the op weighted_sum: w = "
                                        r"relu\(p\) / \(sum\(relu\(p\)\) \+ eps\) or softmax\(p\) .* of n maps of "
                                        r"one shape\)$"):
        describe(module, SHAPE, name="probe")


class _Focus(nn.Module):
    """YOLOv5's Focus layer before v6.0: four strided slices of the image concatenated, then a convolution."""

    def __init__(self) -> None:
        super().__init__()
        self.conv, self.fc = nn.Conv2d(12, 8, 3), nn.Linear(8, 10)

    def forward(self, x):
        x = torch.cat([x[..., ::2, ::2], x[..., 1::2, ::2], x[..., ::2, 1::2], x[..., 1::2, 1::2]], 1)
        return self.fc(self.conv(x).mean((2, 3)))


def test_a_slice_with_a_step_is_refused_by_name_with_the_convolution_that_describes():
    """YOLOv5's Focus was refused as "call_function 'getitem' (node getitem) (and 3 more) has no description op"."""
    with pytest.raises(UserError, match=r"^probe: cannot describe node getitem \(ValueError: a slice with a step "
                                        r"\(x\[\.\.\., ::2, ::2\]: YOLOv5's Focus\) has no description op; "
                                        r"YOLOv5 since v6\.0 writes Focus as a 6x6 convolution of stride 2, which "
                                        r"describes\)$"):
        describe(_Focus(), SHAPE, name="probe")


@pytest.mark.parametrize("pattern", [
    lambda s, y: y if y.dim() == 4 else y.flatten(),
    lambda s, y: F.pad(y, [0, 1, 0, 1]) if y.shape[-1] % 2 else y,
    lambda s, y: F.interpolate(y, size=(8, 8)) if y.size(2) != 8 else y,
])
def test_a_condition_on_the_map_s_shape_takes_the_branch_the_input_shape_takes(pattern):
    """Research code branches on shapes (``assert x.dim() == 4``, MobileViT's resize where the map is no whole
    number of patches, a U-Net's pad where a side is odd): torch.fx refused every such condition ("symbolically traced
    variables cannot be used as inputs to control flow"). Its value is worked out from the shapes at the input shape,
    and the trace goes on along that branch."""
    def checked(s, y):
        assert y.shape[1] == 8, "eight channels"
        return pattern(s, y)
    ops = _computes_the_same(_Probe(checked), [3, 15, 15])
    assert ops[:2] == ["input", "conv2d"]


def test_a_condition_on_the_batch_s_size_or_on_values_is_still_refused():
    """A branch on the batch's size would fix the description to the batch it was traced with; one on the tensor's
    values has no value without data."""
    for pattern in (lambda s, y: y * 2 if y.shape[0] > 2 else y, lambda s, y: y * 2 if y.mean() > 0 else y):
        with pytest.raises(UserError, match=r"^probe: cannot trace the module with torch\.fx \(TraceError: .*\) in "
                                            r"test_ir_call_patterns\.py line \d+ \(<lambda>\)"):
            describe(_Probe(pattern), SHAPE, name="probe")


@pytest.mark.parametrize("pattern", [
    lambda s, y: y * 2 if y.shape[0] > 1 else y,
    lambda s, y: y.squeeze(0).unsqueeze(0) if y.size(0) == 1 else y,
    lambda s, y: y * 2 if y.numel() > 8 * 16 * 16 else y,
])
def test_a_condition_telling_a_batch_of_one_from_a_larger_one_is_refused(pattern):
    """A branch that tells a batch of 1 from the others (``x.shape[0] > 1``, ``x.size(0) == 1``: what users write of
    the batch) takes the same branch at the trace's batches of 2 and 3, and was described as that branch, which a
    batch of 1 does not run: the condition is worked out at a batch of 1 too, and one that differs there is refused as
    a condition on the batch's size."""
    with pytest.raises(UserError, match=r"^probe: cannot trace the module with torch\.fx \(TraceError: .*the batch's "
                                        r"size\)\) in test_ir_call_patterns\.py line \d+ \(<lambda>\)"):
        describe(_Probe(pattern), SHAPE, name="probe")


@pytest.mark.parametrize("pattern", [
    lambda s, y: y * 2 if y.mean().item() > 0 else y,
    lambda s, y: y * 2 if y.amax().tolist() > 1 else y,
    lambda s, y: y * 2 if y.flatten().nonzero().shape[0] > 3 else y,
])
def test_a_condition_on_values_that_meta_tensors_cannot_give_is_refused_as_one(pattern):
    """A condition on the tensors' values read out of them (.item(), .tolist(), nonzero's count), which meta tensors
    cannot give, was refused as the model's forward failing at the input shape ('Tensor.item() cannot be called on
    meta tensors'), though the forward runs: it is refused as a condition on the tensors' values, at the model's
    line."""
    with pytest.raises(UserError, match=r"^probe: cannot trace the module with torch\.fx \(TraceError: .*a condition "
                                        r"on the tensors' values\)\) in test_ir_call_patterns\.py line \d+"):
        describe(_Probe(pattern), SHAPE, name="probe")


def _written_through(view, write):
    """A copy of ``y``, ``write`` (an in-place arithmetic) through ``view`` of it, then the copy read whole."""
    def pattern(s, y):
        z = y * 1.5
        write(view(z))
        return z * y
    return pattern


@pytest.mark.parametrize("pattern", [
    _written_through(lambda z: z.permute(0, 2, 3, 1), lambda v: v.sub_(1.0)),
    _written_through(lambda z: z.mT, lambda v: v.mul_(2.0)),
    _written_through(lambda z: z.movedim(1, 3), lambda v: v.add_(1.0)),
    _written_through(lambda z: z[:, :4], lambda v: v.div_(2.0)),
])
def test_an_arithmetic_write_in_place_through_a_view_of_a_tensor_read_after_it_is_refused(pattern):
    """z.permute(...).sub_(1) writes z, but the description's subtraction, out of place, leaves z as it was for its
    readers after (the rebuilt network computed something else): a write in place through a view of a tensor read
    after it is refused, naming the write and the view (an activation in place on a view is rebuilt in place, and
    computes what the original does)."""
    with pytest.raises(UserError, match=r"^probe: .* \(node \w+\) writes in place through the view \w+ of a tensor "
                                        r"read after it"):
        describe(_Probe(pattern), SHAPE, name="probe")


def test_an_arithmetic_write_in_place_through_a_view_read_alone_after_it_describes():
    """A write in place through a view whose tensor nothing reads after it (the view's readers read the write) is
    described, and the rebuilt network computes the original's output; so is an activation in place on a view of a
    tensor read after it (rebuilt in place)."""
    _computes_the_same(_Probe(lambda s, y: (lambda v: v.sub_(1.0) * 2)((y * 1.5).permute(0, 2, 3, 1)).permute(
        0, 3, 1, 2)))
    _computes_the_same(_Probe(_written_through(lambda z: z.permute(0, 2, 3, 1), lambda v: v.relu_())))


def test_a_trace_failure_on_a_proxy_names_torch_fx_s_proxy():
    """torch.fx cannot give a traced value to int() (int(y.shape[-1])): the refusal named the tracer's own proxy class
    ('_PiecesProxy', made for a split's pieces alone), which no user wrote; it names torch.fx's Proxy as before."""
    with pytest.raises(UserError, match=r"not 'Proxy'\) in test_ir_call_patterns\.py line \d+"):
        describe(_Probe(lambda s, y: y * int(y.shape[-1])), SHAPE, name="probe")


@pytest.mark.parametrize("pattern", [
    lambda s, y: y * 2 if y.is_cuda else y,
    lambda s, y: y * 2 if y.device.type == "cpu" else y,
    lambda s, y: y * 2 if y.get_device() >= 0 else y,
])
def test_a_condition_on_the_device_is_refused(pattern):
    """A branch on the device the tensors lie on (a CUDA kernel's path, a CPU fallback) was worked out on the meta
    device, whose tensors are neither a GPU's nor a CPU's: the description took a branch the device does not (a CPU
    ran y * 2 where the description did not). It is refused as a condition on the device."""
    with pytest.raises(UserError, match=r"^probe: cannot trace the module with torch\.fx \(TraceError: .*a condition "
                                        r"on the device the tensors lie on\)\) in test_ir_call_patterns\.py line \d+"):
        describe(_Probe(pattern), SHAPE, name="probe")


def test_a_condition_on_the_shape_of_a_tensor_made_on_the_input_s_device_is_no_device_condition():
    """A tensor made on ``x.device`` has its shape wherever it lies: a condition on that shape reads the device only
    through a tensor, and is no condition on the device; one on ``x.is_cuda`` is."""
    from torch import fx

    from perf4sight.ir.torch_trace import _reads_the_device

    def on_shape(x):
        return (x + torch.ones(x.shape[-1], device=x.device)).shape[-1] % 2 == 1

    def on_device(x):
        return x.is_cuda

    assert not _reads_the_device(fx.symbolic_trace(on_shape), SHAPE)
    assert _reads_the_device(fx.symbolic_trace(on_device), SHAPE)


def test_a_condition_on_shapes_after_layers_a_batch_of_one_fails_is_worked_out_at_the_others():
    """Where the layers before a condition on shapes fail at a batch of 1 (a batch norm that normalises in training
    whatever the module's mode, of one value a channel), the condition's value is the one at the trace's batches, as
    before."""
    class Pooled(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.conv, self.fc = nn.Conv2d(3, 8, 3, padding=1), nn.Linear(8, 10)
            self.register_buffer("mean", torch.zeros(8))
            self.register_buffer("var", torch.ones(8))

        def forward(self, x):
            y = F.batch_norm(F.adaptive_avg_pool2d(self.conv(x), 1), self.mean, self.var, training=True)
            assert y.shape[-1] == 1, "pooled"
            return self.fc(y.flatten(1))
    with pytest.raises(ValueError, match="Expected more than 1 value per channel"):
        Pooled()(torch.randn(1, *SHAPE))
    desc = describe(Pooled(), SHAPE, name="probe")
    assert [n.op for n in desc.nodes] == ["input", "conv2d", "adaptiveavgpool2d", "batchnorm2d", "flatten", "linear"]


def test_a_trace_that_fails_in_an_installed_library_names_its_function_and_the_model_s_line():
    """Where torch.fx stops inside a library's function (torchvision's normalize checks it was given a tensor), the
    function and the model's line that called it are named."""
    tf = pytest.importorskip("torchvision.transforms.functional")
    module = _Probe(lambda s, y: tf.normalize(y, [0.5] * 8, [0.2] * 8))
    with pytest.raises(UserError, match=r"^probe: cannot trace the module with torch\.fx \(TypeError: .*\) in "
                                        r"torchvision\.transforms\.\w+\.normalize, called from "
                                        r"test_ir_call_patterns\.py line \d+ \(<lambda>\)$"):
        describe(module, SHAPE, name="probe")
