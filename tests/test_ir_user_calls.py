"""Calls users write most that the description once refused: timm's packed attention, ``.mT``, ``torch.mm``,
fractional max pools returning indices, ``torch.maximum``, ``torch.flip``, ``torch.roll``: described as torch computes
them (the module rebuilt from the description computes the original's output), or refused by name."""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from perf4sight.errors import UserError
from perf4sight.ir.from_torch import describe
from perf4sight.ir.schema import NetworkDescription
from perf4sight.ir.to_torch import build_module

SHAPE = [3, 16, 16]


def _computes_the_same(module: nn.Module, shape: list[int] = SHAPE) -> NetworkDescription:
    """``module``'s description, read back, once the module rebuilt from it, given ``module``'s weights, has computed
    what ``module`` computes at a fixed seed."""
    torch.manual_seed(0)
    desc = NetworkDescription.from_dict(describe(module.eval(), shape, name="probe").to_dict())
    assert desc.params == sum(p.numel() for p in module.parameters())
    rebuilt = build_module(desc).eval()
    for new, old in zip(rebuilt.parameters(), module.parameters()):
        new.data.copy_(old.data)
    x = torch.randn(2, *shape)
    assert torch.allclose(rebuilt(x), module(x), atol=1e-5)
    return desc


class _PackedAttention(nn.Module):
    """timm's ``Attention``: one linear layer makes the queries, keys and values of ``heads`` heads, reshaped to
    [B, N, 3, heads, d] and permuted to [3, B, heads, N, d], taken apart as ``picks`` says (``unbind``: ``q, k, v =
    qkv.unbind(0)``; ``index``: ``qkv[0], qkv[1], qkv[2]``; ``select``: ``qkv.select(0, i)``)."""

    def __init__(self, dim: int, heads: int, picks: str) -> None:
        super().__init__()
        self.heads, self.scale, self.picks = heads, (dim // heads) ** -0.5, picks
        self.qkv, self.proj = nn.Linear(dim, dim * 3), nn.Linear(dim, dim)

    def forward(self, x):
        b, n, c = x.shape
        qkv = self.qkv(x).reshape(b, n, 3, self.heads, c // self.heads).permute(2, 0, 3, 1, 4)
        if self.picks == "unbind":
            q, k, v = qkv.unbind(0)
        elif self.picks == "index":
            q, k, v = qkv[0], qkv[1], qkv[2]
        else:
            q, k, v = (qkv.select(0, i) for i in range(3))
        attn = ((q @ k.transpose(-2, -1)) * self.scale).softmax(dim=-1)
        return self.proj((attn @ v).transpose(1, 2).reshape(b, n, c))


class _Tokens(nn.Module):
    """A convolution's map of [32, 16] as 32 tokens of 16 features (contiguous), a pre-norm residual block of
    ``attention`` on them, the tokens' mean and a classifier."""

    def __init__(self, attention: nn.Module) -> None:
        super().__init__()
        self.conv, self.norm, self.attn, self.head = nn.Conv2d(3, 32, 4, 4), nn.LayerNorm(16), attention, \
            nn.Linear(16, 10)

    def forward(self, x):
        x = self.conv(x).flatten(2)
        x = x + self.attn(self.norm(x))
        return self.head(x.mean(1))


@pytest.mark.parametrize("picks", ["unbind", "index", "select"])
def test_timm_s_packed_attention_is_described(picks):
    """The permute(2, 0, 3, 1, 4) that puts q, k and v first was refused (it moves the batch dimension): each pick of
    it is the reshaped projection's entry along its third dimension (a select) with the heads put before the tokens
    (a permute), so the whole block describes (two matmuls, the scale, the softmax) and rebuilds to the same
    function."""
    desc = _computes_the_same(_Tokens(_PackedAttention(16, 4, picks)))
    selects = [(n.attrs, n.output_shape) for n in desc.nodes if n.op == "select"]
    unbound = {"unbind": True} if picks == "unbind" else {}  # an unbind's pieces: rebuilt as one unbind call
    assert selects == [({"dim": 2, "index": i, **unbound}, [32, 4, 4]) for i in range(3)]
    assert [n.attrs["dims"] for n in desc.nodes if n.op == "permute"] == [[0, 2, 1, 3]] * 3
    assert [n.output_shape for n in desc.nodes if n.op == "matmul"] == [[4, 32, 32], [4, 32, 4]]


def test_a_permute_that_moves_the_batch_and_is_read_whole_is_refused_by_name():
    """A permute moving the batch read otherwise than by picks of its first dimension still has no description op,
    and the message says which reads would have one."""
    class Moved(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.conv = nn.Conv2d(3, 8, 3, padding=1)

        def forward(self, x):
            y = self.conv(x).permute(1, 0, 2, 3)
            return (y * 2).permute(1, 0, 2, 3).flatten(1)
    with pytest.raises(UserError, match=r"moves the batch dimension .* unless each of its readers takes one entry"):
        describe(Moved(), SHAPE, name="moved")


@pytest.mark.parametrize("picks", ["unbind", "index"])
@pytest.mark.parametrize("batch", [3, 1])
def test_the_allocation_model_writes_down_packed_attention_as_traced(picks, batch):
    """The picks' strides went to the meta trace ("a gradient with permuted strides": a select's backward, which
    writes the gradient into zeros of the input's shape whatever its strides; at a batch of 1 "matmul of an input
    strided other than transposed": the product reads a pick as it lies, its rows a packed row apart). The model
    writes the block down: its events are the meta trace's. An unbind's picks hand their gradients to its one node,
    which stacks them (torch's unbind backward), as the rebuilt module's one unbind call does."""
    from test_allocator import _as_replayed

    from perf4sight.features.alloc_trace import record_events

    desc = describe(_Tokens(_PackedAttention(16, 4, picks)), SHAPE, name="packed")
    model = record_events(desc, batch, steps=2, method="model")
    assert _as_replayed(model) == _as_replayed(record_events(desc, batch, steps=2, method="trace"))
    picked = [size for _, _, size, op in model if op == "aten.select_backward.default"]
    stacked = [size for _, _, size, op in model if op == "aten.stack.default"]
    if picks == "unbind":  # one stack of the packed projection's size a step
        assert not picked and stacked == [batch * 32 * 48 * 4] * 2
    else:  # each pick's gradient of the packed projection's size, 2 steps
        assert picked == [batch * 32 * 48 * 4] * 6 and not stacked


class _Probe(nn.Module):
    """A convolution, then ``pattern(y)`` on its output, then a classifier of the result flattened."""

    def __init__(self, pattern, width: int) -> None:
        super().__init__()
        self.conv, self.pattern, self.fc = nn.Conv2d(3, 8, 3, padding=1), pattern, nn.Linear(width, 10)

    def forward(self, x):
        return self.fc(self.pattern(self.conv(x)).flatten(1))


@pytest.mark.parametrize("pattern", [lambda y: y.flatten(2) @ y.flatten(2).mT,
                                     lambda y: y.flatten(2).mH @ y.flatten(2),
                                     lambda y: y.mT.contiguous()[:, :, 2:10] * 2])
def test_a_matrix_transpose_attribute_is_the_transpose_of_the_last_two_dims(pattern):
    """``x.mT`` and ``x.mH`` (torch.fx records them as getattr) were refused, while ``x.transpose(-2, -1)``
    described: each is that transpose."""
    width = int(pattern(torch.zeros(1, 8, 16, 16)).numel())
    desc = _computes_the_same(_Probe(pattern, width))
    assert [n.attrs for n in desc.nodes if n.op == "transpose"] == [{"dim0": -2, "dim1": -1}]


@pytest.mark.parametrize("pattern, match", [(lambda y: y.mean((2, 3)).T.T, r"x.T of a tensor of 2 dimensions"),
                                            (lambda y: y.mean((2, 3)).mT.mT, r"x.mT of a tensor of 2 dimensions")])
def test_a_matrix_transpose_of_the_batch_is_refused_by_name(pattern, match):
    """``x.T`` (every dimension reversed) and ``x.mT`` of a [B, F] tensor swap the batch dimension: refused naming
    the attribute and what to write instead."""
    with pytest.raises(UserError, match=match + r".*moves the batch dimension.*x.transpose\(-2, -1\)"):
        describe(_Probe(pattern, 8), SHAPE, name="probe")


def test_an_activation_in_place_on_a_matrix_transpose_of_a_copy_is_out_of_place():
    """``y.clone().mT.relu_()`` writes the copy, not ``y``: the walk back from the written tensor passes ``.mT`` as
    it passes ``.transpose``, so the rebuilt network leaves ``y`` unwritten for its other reader."""
    desc = _computes_the_same(_Probe(lambda y: y.clone().mT.relu_() + y, 8 * 16 * 16))
    assert [n.attrs for n in desc.nodes if n.op == "relu"] == [{}]


class _Products(nn.Module):
    """A convolution's [8, 16] map (flattened) and its [8] channel means, then ``product(self, means, map)``."""

    def __init__(self, product) -> None:
        super().__init__()
        self.conv, self.product, self.weight = nn.Conv2d(3, 8, 4, 4), product, nn.Parameter(torch.randn(8, 8))

    def forward(self, x):
        y = self.conv(x).flatten(2)
        return self.product(self, y.mean(2), y).flatten(1)


@pytest.mark.parametrize("product, match", [
    (lambda s, v, y: torch.mm(v, s.weight), r"torch.mm multiplies 2-D matrices.*nn.Linear\(K, N, bias=False\)"),
    (lambda s, v, y: v.mm(s.weight), r"torch.mm multiplies 2-D matrices, the batch the first one's rows"),
    (lambda s, v, y: torch.addmm(v, v, s.weight), r"torch.addmm multiplies 2-D matrices.*nn.Linear\(K, N\),"),
    (lambda s, v, y: torch.baddbmm(y @ y.mT, y, y.mT, alpha=0.5),
     r"torch.baddbmm \(beta \* input \+ alpha \* the product, one GEMM\).*torch.bmm\(b1, b2\) \* alpha \+ input"),
    (lambda s, v, y: torch.addbmm(s.weight, y, y.mT), r"torch.addbmm .* has no description op; write"),
])
def test_products_of_2_d_matrices_and_fused_sums_are_refused_by_name(product, match):
    """torch.mm and addmm (their batch is the first matrix's rows: no per-sample node multiplies so) and baddbmm and
    addbmm (one GEMM adding a scaled input) were refused as any call without a description op, saying nothing of
    what to write: the refusal names the call and what describes instead."""
    with pytest.raises(UserError, match=match):
        describe(_Products(product), SHAPE, name="products")


def test_the_rewrite_a_refused_baddbmm_names_describes():
    """torch.bmm(b1, b2) * alpha + input, the rewrite the refusal names, describes as a matmul, a multiply by the
    number and an add, and rebuilds to the same function as torch.baddbmm computes."""
    def rewritten(y):
        y = y.flatten(2)
        return torch.bmm(y, y.mT) * 0.5 + y @ y.mT
    module = _Probe(rewritten, 64)
    desc = _computes_the_same(module)
    assert [n.op for n in desc.nodes if n.op in ("matmul", "mul", "add")] == ["matmul", "mul", "matmul", "add"]
    y = module.conv(torch.randn(2, *SHAPE)).flatten(2)
    assert torch.allclose(rewritten(y), torch.baddbmm(y @ y.mT, y, y.mT, alpha=0.5), atol=1e-5)


class _Pooled(nn.Module):
    """A convolution, then ``pool(self, y)`` on its [8, 16, 16] map, then a classifier of the channels' means."""

    def __init__(self, pool, layer: nn.Module | None = None) -> None:
        super().__init__()
        self.conv, self.pool, self.layer, self.fc = nn.Conv2d(3, 8, 3, padding=1), pool, layer, nn.Linear(8, 10)

    def forward(self, x):
        return self.fc(self.pool(self, self.conv(x)).mean((2, 3)))


def _values_unpacked(pooled):
    """The values of ``pooled``, a (values, indices) pair, unpacked with the indices left unread."""
    values, _ = pooled
    return values


def _rebuilt_computes_the_same_at_a_seed(module: nn.Module, desc: NetworkDescription):
    """The module rebuilt from ``desc``, given ``module``'s weights, its input and ``module``'s output: the two
    computed alike from one random state (a fractional pool draws its windows)."""
    rebuilt = build_module(desc).eval()
    for new, old in zip(rebuilt.parameters(), module.parameters()):
        new.data.copy_(old.data)
    x = torch.randn(2, *SHAPE)
    torch.manual_seed(1)
    expected = module(x)
    torch.manual_seed(1)
    assert torch.allclose(rebuilt(x), expected, atol=1e-6)
    return rebuilt, x, expected


@pytest.mark.parametrize("module, op", [
    (_Pooled(lambda s, y: s.layer(y)[0], nn.FractionalMaxPool2d(2, output_size=5, return_indices=True)),
     "fractional_maxpool2d"),
    (_Pooled(lambda s, y: F.fractional_max_pool2d(y, 3, output_ratio=(0.5, 0.6), return_indices=True)[0]),
     "fractional_maxpool2d"),
    (_Pooled(lambda s, y: _values_unpacked(F.fractional_max_pool2d(y, 2, output_size=(6, 7), return_indices=True))),
     "fractional_maxpool2d"),
    (_Pooled(lambda s, y: s.layer(y)[0], nn.MaxPool2d(3, 2, 1, return_indices=True)), "maxpool2d"),
    (_Pooled(lambda s, y: _values_unpacked(F.max_pool2d(y, 2, return_indices=True))), "maxpool2d"),
    (_Pooled(lambda s, y: s.layer(y)[0], nn.AdaptiveMaxPool2d(3, return_indices=True)), "adaptivemaxpool2d"),
])
def test_the_values_of_a_pool_returning_its_indices_are_the_pool(module, op):
    """A fractional max pool with return_indices=True (torch.fx records fractional_max_pool2d_with_indices) was
    refused, and so was a max pool's: read as its values alone (the tuple's [0], the indices unread), it is the pool,
    which torch computes alike (keeping the indices for backward either way); the module rebuilt from the
    description computes the same output as the original at the same seed (a fractional pool draws its windows)."""
    desc = NetworkDescription.from_dict(describe(module.eval(), SHAPE, name="pooled").to_dict())
    assert [n.op for n in desc.nodes] == ["input", "conv2d", op, "mean", "linear"]
    rebuilt, x, expected = _rebuilt_computes_the_same_at_a_seed(module, desc)
    if op == "fractional_maxpool2d":  # the windows' draws matter: another seed's differ
        torch.manual_seed(2)
        assert not torch.allclose(rebuilt(x), expected, atol=1e-6)


def _values_read_twice(pooled, attribute: bool = False):
    """``pooled``'s values (its [0], the second time ``.values`` with ``attribute``) times themselves: one result read
    twice, a call that runs once."""
    return pooled[0] * (pooled.values if attribute else pooled[0])


@pytest.mark.parametrize("module, op", [
    (_Pooled(lambda s, y: _values_read_twice(s.layer(y)), nn.MaxPool2d(3, 1, 1, return_indices=True)), "maxpool2d"),
    (_Pooled(lambda s, y: _values_read_twice(F.fractional_max_pool2d(y, 2, output_size=6, return_indices=True))),
     "fractional_maxpool2d"),
    (_Pooled(lambda s, y: _values_read_twice(F.adaptive_max_pool2d(y, 4, return_indices=True))), "adaptivemaxpool2d"),
    (_Pooled(lambda s, y: _values_read_twice(y.max(1, keepdim=True), attribute=True) * y), "adaptivemaxpool2d"),
])
def test_the_values_of_a_pool_or_a_max_read_twice_are_one_op(module, op):
    """A pool returning its indices, or a max over a dimension, whose values are read twice (two [0]s, or [0] and
    .values) runs once, but each read was described as the pool (or the max) of its own: its work, output and kept
    indices counted twice, and two fractional pools, each drawing its windows, computed something else than the
    original. The later reads now read the first's node: one op, and the rebuilt module computes the original's
    output at the same seed."""
    desc = NetworkDescription.from_dict(describe(module.eval(), SHAPE, name="pooled").to_dict())
    assert [n.op for n in desc.nodes].count(op) == 1
    _rebuilt_computes_the_same_at_a_seed(module, desc)


@pytest.mark.parametrize("module, match", [
    (_Pooled(lambda s, y: F.fractional_max_pool2d(y, 2, output_size=8, return_indices=True)[1].float()),
     r"the indices \(int64\) of fractional_max_pool2d\(..., return_indices=True\) \(node "
     r"fractional_max_pool2d_with_indices; a description follows its values alone, read as its \[0\]\) has no"),
    (_Pooled(lambda s, y: s.layer(y)[1].float(), nn.FractionalMaxPool2d(2, output_size=8, return_indices=True)),
     r"the indices \(int64\) of FractionalMaxPool2d\(..., return_indices=True\) \(node layer;"),
    (_Pooled(lambda s, y: y + s.layer(y)[1].float(), nn.MaxPool2d(3, 1, 1, return_indices=True)),
     r"the indices \(int64\) of MaxPool2d\(..., return_indices=True\)"),
])
def test_the_indices_of_a_pool_read_are_refused_by_name(module, match):
    """Indices that are read (an unpool's, a gather's) have no description: the refusal names the pool and says that
    its values alone describe."""
    with pytest.raises(UserError, match=match):
        describe(module, SHAPE, name="pooled")


class _TwoMaps(nn.Module):
    """Two convolutions' [8, 8, 8] maps of an image, ``combine(a, b, x)`` of them (x the network input), then a
    classifier of the channels' means."""

    def __init__(self, combine) -> None:
        super().__init__()
        self.a, self.b, self.combine = nn.Conv2d(3, 8, 3, padding=1), nn.Conv2d(3, 8, 1), combine
        self.fc = nn.Linear(8, 10)

    def forward(self, x):
        return self.fc(self.combine(self.a(x), self.b(x), x).mean((2, 3)))


_COMBINED = {
    "maximum": (lambda a, b, x: torch.maximum(a, b), "maximum", {}),
    "max_of_two": (lambda a, b, x: torch.max(a, b.mean(1, keepdim=True)), "maximum", {}),  # broadcast
    "minimum": (lambda a, b, x: a.minimum(b), "minimum", {}),
    "min_of_the_input": (lambda a, b, x: torch.min(a, x.mean(1, keepdim=True)) * b, "minimum", {}),  # one gradient
    "flip": (lambda a, b, x: a.flip(2, 3) * b, "flip", {"dims": [2, 3]}),
    "flip_last": (lambda a, b, x: torch.flip(a, (-1,)) + b, "flip", {"dims": [3]}),
    "fliplr": (lambda a, b, x: torch.fliplr(a) + b, "flip", {"dims": [1]}),
    "roll": (lambda a, b, x: torch.roll(a, (2, -3), (2, 3)) + b, "roll", {"shifts": [2, -3], "dims": [2, 3]}),
    "roll_channels": (lambda a, b, x: a.roll(5, 1) * b, "roll", {"shifts": [5], "dims": [1]}),
}


@pytest.mark.parametrize("case", list(_COMBINED))
def test_maximum_minimum_flip_and_roll_are_described(case):
    """torch.maximum and minimum (and torch.max, torch.min of two tensors), torch.flip (fliplr) and torch.roll were
    refused as calls without a description op: they are the ops maximum, minimum, flip and roll, and the module
    rebuilt from the description computes what the original computes."""
    combine, op, attrs = _COMBINED[case]
    desc = _computes_the_same(_TwoMaps(combine), [3, 8, 8])
    assert [n.attrs for n in desc.nodes if n.op == op] == [attrs]


@pytest.mark.parametrize("combine, match", [
    (lambda a, b, x: torch.roll(a, 2) + b, r"a roll without dims moves elements across the batch.*give dims"),
    (lambda a, b, x: torch.roll(a, (1, 1), (0, 2)) + b, r"a roll along the batch dimension \(dims \[0, 2\]\)"),
    (lambda a, b, x: torch.flipud(a) + b, r"a flipud along the batch dimension \(dims \[0\]\)"),
    (lambda a, b, x: a.flip(0) + b, r"a flip along the batch dimension"),
])
def test_a_flip_or_roll_of_the_batch_is_refused_by_name(combine, match):
    """A roll without dims (torch rolls the tensor flattened, the batch with it) and a flip or roll along the batch's
    dimension move elements between samples: refused naming the call and what to give instead."""
    with pytest.raises(UserError, match=match):
        describe(_TwoMaps(combine), [3, 8, 8], name="moved")


def test_a_maximum_of_a_module_s_own_tensor_is_refused_by_name():
    """A maximum of a parameter (a learnt floor) is no node's output: refused naming the tensor."""
    class Floor(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.conv, self.floor = nn.Conv2d(3, 8, 1), nn.Parameter(torch.zeros(1, 8, 1, 1))

        def forward(self, x):
            return torch.maximum(self.conv(x), self.floor).flatten(1)
    with pytest.raises(UserError, match=r"a maximum of the module's tensor floor has no description op"):
        describe(Floor(), [3, 4, 4], name="floor")


@pytest.mark.parametrize("case", ["maximum", "max_of_two", "minimum", "min_of_the_input", "flip", "roll",
                                  "roll_channels"])
@pytest.mark.parametrize("batch", [3, 1])
def test_the_allocation_model_writes_down_maximum_minimum_flip_and_roll_as_traced(case, batch):
    """A flip or roll: a copy forward (aten.flip, aten.roll), nothing kept, backward the gradient flipped or rolled
    back. A maximum or minimum keeps both inputs; backward, the second input's gradient first (a compare of the two,
    a bool an element; the gradient halved; an equality compare; a where; then the gradient, a masked_fill, the four
    freed after it, last first), then the first's (one alone where the other needs none), a broadcast one's summed
    down: the model's events are the meta trace's."""
    from test_allocator import _as_replayed

    from perf4sight.features.alloc_trace import record_events

    desc = describe(_TwoMaps(_COMBINED[case][0]), [3, 8, 8], name=case)
    model = record_events(desc, batch, steps=2, method="model")
    assert _as_replayed(model) == _as_replayed(record_events(desc, batch, steps=2, method="trace"))
    if case in ("maximum", "minimum"):
        fills = [size for kind, _, size, op in model if op == "aten.masked_fill.Scalar"]
        assert fills == [batch * 8 * 8 * 8 * 4] * 4  # two gradients a step, two steps


@pytest.mark.parametrize("case, torch_run", [
    ("maximum", lambda x: torch.maximum(x, (x.detach().abs() + 1).requires_grad_())),
    ("min_of_the_input", lambda x: torch.minimum(x, x.detach().abs() + 1)),
    ("flip", lambda x: x.flip(2, 3)),
    ("roll", lambda x: torch.roll(x, (2, -3), (2, 3))),
])
def test_maximum_minimum_flip_and_roll_cost_the_kernels_torch_runs(case, torch_run):
    """The walk's cost of each counts the kernels and FLOPs this torch runs backward (a dispatch log): a maximum's
    ten of two gradients, a minimum's five of one (the other input needs none), both inputs kept; a flip's or roll's
    one (no FLOPs), nothing kept."""
    from test_features import _ops_run

    from perf4sight.features.walk import walk

    desc = describe(_TwoMaps(_COMBINED[case][0]), [3, 8, 8], name=case)
    op = _COMBINED[case][1]
    (visit,) = [v for v in walk(desc) if v.node.op == op]
    forward, backward = _ops_run(torch_run, [8, 8, 8])
    assert visit.cost.kernels_bwd == len(backward) and visit.cost.kernels_fwd == sum(name == op for name, _ in forward)
    if op in ("maximum", "minimum"):
        assert visit.cost.saved == [0, 1]
        assert visit.cost.flops_bwd == sum(elements for _, elements in backward) == len(backward) * 8 * 8 * 8
    else:
        assert (visit.cost.saved, visit.cost.flops_bwd) == ([], 0)


def test_a_network_of_maximum_minimum_flip_and_roll_prunes_and_trains():
    """Pruning ties the channels of a maximum's and a minimum's two inputs (as an add's) and keeps a flip's and a
    roll's shapes (along the channels too): the pruned network describes, and a training step runs."""
    from test_networks import _train_step

    from perf4sight.networks.build import Source, prune_source

    class Net(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.a, self.b = nn.Conv2d(3, 16, 3, padding=1), nn.Conv2d(3, 16, 1)
            self.c, self.fc = nn.Conv2d(16, 16, 3, padding=1), nn.Linear(16, 10)

        def forward(self, x):
            y = torch.maximum(self.a(x), self.b(x)).flip(1)
            y = torch.roll(self.c(y), (1, 2), (1, 3)).minimum(y)
            return self.fc(y.mean((2, 3)))
    (desc,) = prune_source(Source("net", "test", Net), [3, 16, 16], [30], "l1-norm", 2, seed=0)
    widths = {n.attrs["out_channels"] for n in desc.nodes if n.op == "conv2d"}
    assert len(widths) == 1 and widths.pop() < 16
    assert [n.op for n in desc.nodes if n.op in ("maximum", "flip", "roll", "minimum")] == [
        "maximum", "flip", "roll", "minimum"]
    _train_step(desc)


def test_a_fused_attention_is_refused_naming_the_products_that_describe():
    """timm's attention calls F.scaled_dot_product_attention where its fused attention is on (its default): the
    refusal names the hand-written products the packed attention above describes with, and how timm writes them."""
    class Fused(_PackedAttention):
        def forward(self, x):
            b, n, c = x.shape
            q, k, v = self.qkv(x).reshape(b, n, 3, self.heads, c // self.heads).permute(2, 0, 3, 1, 4).unbind(0)
            return self.proj(F.scaled_dot_product_attention(q, k, v).transpose(1, 2).reshape(b, n, c))
    with pytest.raises(UserError, match=r"F.scaled_dot_product_attention .* has no description op; write "
                                        r"softmax\(q @ k.transpose\(-2, -1\) \* scale\) @ v.*TIMM_FUSED_ATTN=0"):
        describe(_Tokens(Fused(16, 4, "unbind")), SHAPE, name="fused")


@pytest.mark.parametrize("pattern, op, attrs", [
    (lambda y: y.swapdims(2, 3), "transpose", {"dim0": 2, "dim1": 3}),
    (lambda y: torch.movedim(y, 1, 3), "permute", {"dims": [0, 2, 3, 1]}),
    (lambda y: y.moveaxis((1, 2), (2, 3)), "permute", {"dims": [0, 3, 1, 2]}),
    (lambda y: torch.movedim(y, -1, 1), "permute", {"dims": [0, 3, 1, 2]}),
])
def test_swapdims_and_movedim_are_a_transpose_and_a_permute(pattern, op, attrs):
    """x.swapdims (transpose's other name) and torch.movedim/moveaxis (a permute named by where dimensions go) were
    refused as calls without a description op: they are a transpose and the permute that puts each source at its
    destination, the others in their order."""
    desc = _computes_the_same(_Probe(lambda y: pattern(y) * 2, 8 * 16 * 16))
    assert [n.attrs for n in desc.nodes if n.op == op] == [attrs]


@pytest.mark.parametrize("pattern, match", [
    (lambda y: torch.movedim(y, 0, 1).movedim(1, 0).mean((2, 3)),
     r"a movedim of dims \[0\] to \[1\] moves the batch dimension"),
    (lambda y: y.mean((2, 3)).t().t(), r"x.t\(\) swaps the batch dimension of a \[B, F\] tensor.*x.mT"),
])
def test_a_movedim_or_t_of_the_batch_is_refused_by_name(pattern, match):
    """A movedim of the batch dimension and x.t() (of at most two dimensions: the batch's swapped) are refused
    naming the call and what to write."""
    with pytest.raises(UserError, match=match):
        describe(_Probe(pattern, 8), SHAPE, name="moved")


class _CastWeight(nn.Module):
    """A hand-written convolution that casts its float32 weight, and a scale and a blur filter, to what they are."""

    def __init__(self, cast):
        super().__init__()
        self.cast = cast
        self.weight = nn.Parameter(torch.randn(8, 3, 3, 3))
        self.gain = nn.Parameter(torch.ones(1, 8, 1, 1))
        self.register_buffer("blur", torch.ones(8, 1, 3, 3) / 9)
        self.register_buffer("steps", torch.zeros(1, dtype=torch.int64))

    def forward(self, x):
        w, g, b = (self.cast(t, x, self) for t in (self.weight, self.gain, self.blur))
        y = F.conv2d(F.conv2d(x, w, padding=1) * g, b, padding=1, groups=8)
        return y.flatten(1)


def test_a_module_tensor_cast_to_what_it_is_reads_the_tensor_as_it_is():
    """Research code casts a float32 weight to its input's type (``self.weight.to(x.dtype)``, ``.type_as(x)``,
    ``.to(x.device)``, ``.contiguous()``, ``.float()``): no kernel in a float32 model on one device, yet the weight
    read as computed in the forward and refused ("weight standardisation"; "CondConv's experts" for ``type_as(x)``).
    Each describes as the tensors read as they are; a cast to float16 or a copy is still refused."""
    plain = describe(_CastWeight(lambda t, x, m: t), SHAPE, name="p").to_dict()
    assert [n["op"] for n in plain["nodes"]] == ["input", "conv2d", "scale", "conv2d", "flatten"]
    casts = {"to(x.dtype)": lambda t, x, m: t.to(x.dtype), "type_as(x)": lambda t, x, m: t.type_as(x),
             "to(x.device)": lambda t, x, m: t.to(x.device), "contiguous()": lambda t, x, m: t.contiguous(),
             "float()": lambda t, x, m: t.float(), "to(dtype=float32)": lambda t, x, m: t.to(dtype=torch.float32)}
    for label, cast in casts.items():
        assert describe(_CastWeight(cast), SHAPE, name="p").to_dict() == plain, label
    for cast in (lambda t, x, m: t.to(torch.float16), lambda t, x, m: t.to(x.dtype, copy=True),
                 lambda t, x, m: t.to(m.steps.dtype)):  # (an int64 buffer's dtype)
        with pytest.raises(UserError, match="p: "):
            describe(_CastWeight(cast), SHAPE, name="p")
