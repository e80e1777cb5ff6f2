"""Elementwise maths and normalisations CNN training code calls that the description once refused: torch.reciprocal,
torch.log, F.instance_norm with running statistics, F.normalize: described as torch computes them (the module rebuilt
from the description computes the original's output and gradients), costed as torch runs them, written down by the
allocation model as the meta trace records them, or refused by name with a way around."""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from perf4sight.errors import UserError
from perf4sight.ir.from_torch import describe
from perf4sight.ir.schema import NetworkDescription
from perf4sight.ir.to_torch import build_module

SHAPE = [3, 8, 8]


class _Probe(nn.Module):
    """A convolution's [8, 8, 8] map of an image, ``pattern(y)`` of it, then a classifier of its flattened result
    (``width`` features)."""

    def __init__(self, pattern, width: int = 8 * 8 * 8) -> None:
        super().__init__()
        self.conv, self.pattern, self.fc = nn.Conv2d(3, 8, 3, padding=1), pattern, nn.Linear(width, 10)

    def forward(self, x):
        return self.fc(self.pattern(self.conv(x)).flatten(1))


def _computes_the_same(module: nn.Module, shape: list[int] = SHAPE) -> NetworkDescription:
    """``module``'s description, read back, once the module rebuilt from it, given ``module``'s parameters and
    buffers, has computed at a fixed seed what ``module`` computes in training mode: the same output, the same
    gradient of every parameter and of the input, and the same buffers after (running statistics)."""
    desc = NetworkDescription.from_dict(describe(module, shape, name="probe").to_dict())
    assert desc.params == sum(p.numel() for p in module.parameters())
    rebuilt = build_module(desc)
    for new, old in zip(list(rebuilt.parameters()) + list(rebuilt.buffers()),
                        list(module.parameters()) + list(module.buffers())):
        new.data.copy_(old.data)
    torch.manual_seed(0)
    x = torch.randn(2, *shape)
    outputs, gradients = [], []
    for net in (module.train(), rebuilt.train()):
        xi = x.clone().requires_grad_()
        out = net(xi)
        out.square().sum().backward()
        outputs.append(out)
        gradients.append([xi.grad] + [p.grad for p in net.parameters()])
    assert torch.allclose(outputs[0], outputs[1], atol=1e-5)
    for old, new in zip(*gradients):
        assert torch.allclose(old, new, atol=1e-4)
    for old, new in zip(module.buffers(), rebuilt.buffers()):
        assert torch.allclose(old, new, atol=1e-6)
    return desc


def test_reciprocal_is_the_power_minus_one():
    """torch.reciprocal and x.reciprocal() were refused ("call_function 'reciprocal' has no description op") while
    1 / x described: both are the op pow of exponent -1 (torch's reciprocal kernel, which keeps its result)."""
    desc = _computes_the_same(_Probe(lambda y: torch.reciprocal(y.abs() + 1) + (y.relu() + 2).reciprocal()))
    assert [n.attrs for n in desc.nodes if n.op == "pow"] == [{"exponent": -1.0}] * 2


#: Patterns of a [8, 8, 8] map: (pattern, the op it describes to, the torch call run alone on a leaf for the dispatch
#: log: the op's kernels forward and backward).
_CASES = {
    "log": (lambda y: torch.log(y.abs() + 1) + (y.sigmoid() + 0.5).log(), "log",
            lambda x: torch.log(x.detach().abs().add(1).requires_grad_())),
    "normalize": (lambda y: F.normalize(y, dim=1)
                  + F.normalize(y.mean((2, 3)), dim=-1, eps=1e-6).unsqueeze(2).unsqueeze(3),
                  "normalize", lambda x: F.normalize(x, dim=1)),
}
#: The aten op each case's op starts with.
_FIRST_KERNEL = {"log": "log", "normalize": "linalg_vector_norm"}


def test_log_is_described():
    """torch.log and x.log() were refused ("call_function 'log' has no description op"): they are the op log, and
    the rebuilt module computes the original's output and gradients."""
    desc = _computes_the_same(_Probe(_CASES["log"][0]))
    assert [n.op for n in desc.nodes if n.op == "log"] == ["log"] * 2


def test_normalize_is_described():
    """F.normalize (of p 2, torch's default) was refused naming a rewrite: it is the op normalize along its dim
    (counted from the front; eps written where not torch's), and the rebuilt module computes the original's output
    and gradients."""
    desc = _computes_the_same(_Probe(_CASES["normalize"][0]))
    assert [n.attrs for n in desc.nodes if n.op == "normalize"] == [{"dim": 1}, {"dim": 1, "eps": 1e-6}]


@pytest.mark.parametrize("pattern, match", [
    (lambda y: F.normalize(y, dim=0), r"F.normalize over the batch dimension \(dim 0\) .* give a dim after"),
    (lambda y: F.normalize(y, p=1.0, dim=1), r"only p=2 is the op normalize\); x / x.abs\(\).pow\(p\)"),
])
def test_a_normalisation_of_the_batch_or_of_another_p_is_refused_by_name(pattern, match):
    """A normalisation across the samples, or by another norm than the L2 (whose backward torch runs otherwise), is
    refused by name, the latter naming the ops that describe it."""
    with pytest.raises(UserError, match=match):
        describe(_Probe(pattern), SHAPE, name="refused")


@pytest.mark.parametrize("case", ["log", "normalize"])
@pytest.mark.parametrize("batch", [3, 1])
def test_the_allocation_model_writes_down_the_call_as_traced(case, batch):
    """A log keeps its input; backward its gradient is the incoming one over the input (aten.div.Tensor). A
    normalisation: the norm (keeping the input and itself), its clamp (keeping the norm), the division (keeping the
    input and the clamp); backward the division's gradients, the expand's sum, the clamp's where and the norm's
    masked product, added to the division's. The model's events are the meta trace's, and no longer left to it."""
    from test_allocator import _as_replayed

    from perf4sight.features.alloc_model import COVERED
    from perf4sight.features.alloc_trace import record_events

    desc = describe(_Probe(_CASES[case][0]), SHAPE, name=case)
    model = record_events(desc, batch, steps=2, method="model")
    assert _CASES[case][1] in COVERED
    assert _as_replayed(model) == _as_replayed(record_events(desc, batch, steps=2, method="trace"))


@pytest.mark.parametrize("case", ["log", "normalize"])
def test_the_call_costs_the_kernels_torch_runs(case):
    """The walk's cost of the op counts the kernels this torch runs forward and backward (a dispatch log, views
    left out), and backward an output element's FLOP each (a scalar's fill none): a log one kernel each way, its
    input kept; a normalisation 3 forward (2 FLOPs an element for the norm, 1 for the division, 1 a row for the
    clamp) and 14 back, its input kept and the norm and its clamp (a float a row each)."""
    from test_features import _ops_run

    from perf4sight.features.walk import walk

    pattern, op, torch_run = _CASES[case]
    desc = describe(_Probe(pattern), SHAPE, name=case)
    visit = [v for v in walk(desc) if v.node.op == op][0]
    forward, backward = _ops_run(torch_run, [8, 8, 8])
    mine = [(name, e) for name, e in forward[[name for name, _ in forward].index(_FIRST_KERNEL[case]):]
            if name != "expand"]
    assert (visit.cost.kernels_fwd, visit.cost.kernels_bwd) == (len(mine), len(backward))
    assert visit.cost.flops_bwd == sum(e for name, e in backward if name != "scalar_tensor")
    n, rows = 8 * 8 * 8, 8 * 8
    assert visit.cost.flops_fwd == {"log": n, "normalize": 3 * n + rows}[case]
    assert visit.cost.saved == [0]
    assert visit.cost.extra_saved_bytes == {"log": 0, "normalize": 2 * rows * 4}[case]


@pytest.mark.parametrize("case", ["log", "normalize"])
def test_a_network_using_the_call_prunes_and_trains(case):
    """Pruning a network that calls it keeps the call: the pruned network describes to fewer channels with the op
    still there, and a training step runs."""
    from test_networks import _train_step

    from perf4sight.networks.build import Source, prune_source

    pattern, op, _ = _CASES[case]

    class Net(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.a, self.b, self.fc = nn.Conv2d(3, 16, 3, padding=1), nn.Conv2d(16, 16, 3, padding=1), nn.Linear(16, 10)

        def forward(self, x):
            return self.fc(self.b(pattern(self.a(x))).mean((2, 3)))
    (desc,) = prune_source(Source("net", "test", Net), [3, 16, 16], [30], "l1-norm", 2, seed=0)
    assert max(n.attrs["out_channels"] for n in desc.nodes if n.op == "conv2d") < 16
    assert op in [n.op for n in desc.nodes]
    _train_step(desc)


class _InstanceNormCall(nn.Module):
    """nn.InstanceNorm2d's call copied into a module of one's own: F.instance_norm of its own running mean and
    variance (buffers), weight and bias where ``affine``, ``use_input_stats=self.training``."""

    def __init__(self, affine: bool, momentum: float) -> None:
        super().__init__()
        self.momentum = momentum
        self.weight = nn.Parameter(torch.rand(8) + 0.5) if affine else None
        self.bias = nn.Parameter(torch.randn(8)) if affine else None
        self.register_buffer("mean", torch.randn(8))
        self.register_buffer("var", torch.rand(8) + 0.5)

    def forward(self, x):
        return F.instance_norm(x, self.mean, self.var, self.weight, self.bias, self.training, self.momentum, 1e-3)


class _OwnInstanceNorm(nn.Module):
    """A convolution, then :class:`_InstanceNormCall`, a ReLU, the channels' means and a classifier."""

    def __init__(self, affine: bool, momentum: float = 0.1) -> None:
        super().__init__()
        self.conv, self.norm, self.fc = nn.Conv2d(3, 8, 3, padding=1), _InstanceNormCall(affine, momentum), \
            nn.Linear(8, 10)

    def forward(self, x):
        return self.fc(self.norm(self.conv(x)).relu().mean((2, 3)))


@pytest.mark.parametrize("affine, momentum", [(False, 0.1), (True, 0.3)])
def test_an_instance_norm_call_with_running_statistics_is_described(affine, momentum):
    """F.instance_norm with a running mean and variance was refused ("an instance norm with running statistics has
    no description op") where nn.InstanceNorm2d(track_running_stats=True) described: it is that op, tracking them
    by its momentum; the rebuilt module computes the original's output and gradients in training and updates its
    running statistics alike."""
    desc = _computes_the_same(_OwnInstanceNorm(affine, momentum))
    (norm,) = [n for n in desc.nodes if n.op == "instancenorm"]
    expected = {"num_features": 8, "eps": 1e-3, "track_running_stats": True, **({"affine": True} if affine else {}),
                **({} if momentum == 0.1 else {"momentum": momentum})}
    assert norm.attrs == expected


@pytest.mark.parametrize("batch", [3, 1])
def test_the_allocation_model_writes_down_an_instance_norm_call_with_running_statistics_as_traced(batch):
    """The call's instance norm is the layer's: its events, running statistics repeated per sample and averaged
    back included, are the meta trace's."""
    from test_allocator import _as_replayed

    from perf4sight.features.alloc_trace import record_events

    desc = describe(_OwnInstanceNorm(True), SHAPE, name="own")
    model = record_events(desc, batch, steps=2, method="model")
    assert _as_replayed(model) == _as_replayed(record_events(desc, batch, steps=2, method="trace"))


def test_an_instance_norm_call_with_a_running_mean_alone_is_refused_by_name():
    """Running statistics of a mean without a variance: refused, saying to give both."""
    class MeanOnly(_OwnInstanceNorm):
        def forward(self, x):
            return self.fc(F.instance_norm(self.conv(x), self.norm.mean, None, use_input_stats=True).mean((2, 3)))
    with pytest.raises(UserError, match=r"a running mean but no running variance .* give both"):
        describe(MeanOnly(False), SHAPE, name="mean_only")


class _HalfStatistics(nn.Module):
    """A convolution, then ``call`` (F.batch_norm in training, or F.instance_norm) given one running statistic alone
    (``kept``: its mean, or its variance), then a classifier of the channels' means."""

    def __init__(self, call, kept: str) -> None:
        super().__init__()
        self.call, self.kept = call, kept
        self.conv, self.fc = nn.Conv2d(3, 8, 3, padding=1), nn.Linear(8, 10)
        self.register_buffer("stat", torch.rand(8) + 0.5)

    def forward(self, x):
        stats = (self.stat, None) if self.kept == "mean" else (None, self.stat)
        flag = {"training": True} if self.call is F.batch_norm else {}
        return self.fc(self.call(self.conv(x), *stats, **flag).mean((2, 3)))


@pytest.mark.parametrize("kept", ["mean", "var"])
@pytest.mark.parametrize("call, message", [
    (F.batch_norm, "a batch norm with a running mean but no running variance (or a variance but no mean) has no "
                   "description op"),
    (F.instance_norm, "an instance norm with a running mean but no running variance (or a variance but no mean) has "
                      "no description op; give both (nn.InstanceNorm2d(track_running_stats=True) keeps both)")])
def test_a_norm_call_given_one_running_statistic_is_refused_in_its_own_words(call, message, kept):
    """F.batch_norm and F.instance_norm given a running mean without a variance, or a variance without a mean: each
    refused naming its norm, the instance norm's saying how to keep both (one check, each norm's words); the whole
    line, either way round."""
    with pytest.raises(UserError) as refused:
        describe(_HalfStatistics(call, kept), SHAPE, name="half")
    assert str(refused.value) == f"half: cannot describe node {call.__name__} (ValueError: {message})"


@pytest.mark.parametrize("call, flag", [(F.batch_norm, "training"), (F.instance_norm, "use_input_stats")])
def test_a_norm_call_whose_mode_is_the_int_0_fails_as_torch_fails_it(call, flag):
    """``training=0`` (``use_input_stats=0``) is no constant mode read as False: torch's batch_norm and instance_norm
    take a bool alone ("must be bool, not int"), so the forward fails, in torch and in describe alike (a description
    of it would be of a step that cannot run). A False is the constant mode (the tests above)."""
    class IntFlag(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.conv, self.fc = nn.Conv2d(3, 8, 3, padding=1), nn.Linear(8, 10)
            self.register_buffer("mean", torch.zeros(8))
            self.register_buffer("var", torch.ones(8))

        def forward(self, x):
            return self.fc(call(self.conv(x), self.mean, self.var, **{flag: 0}).mean((2, 3)))
    with pytest.raises(TypeError, match=f"argument '{flag}' .* must be bool, not int"):
        IntFlag()(torch.randn(2, *SHAPE))
    with pytest.raises(UserError, match=r"^int: the model's forward fails at input shape \[3, 8, 8\] .*TypeError: "
                       f".*argument '{flag}' .* must be bool, not int"):
        describe(IntFlag(), SHAPE, name="int")


def test_a_network_with_an_instance_norm_call_with_running_statistics_prunes_and_trains():
    """Pruning a network whose own module calls F.instance_norm with running statistics keeps the call's channels
    (its buffers and parameters are no layer torch-pruning cuts) and cuts the others: the pruned network describes,
    its instance norm tracking running statistics, and a training step runs."""
    from test_networks import _train_step

    from perf4sight.networks.build import Source, prune_source

    class Net(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.a, self.norm, self.b = nn.Conv2d(3, 8, 3, padding=1), _InstanceNormCall(True, 0.1), \
                nn.Conv2d(8, 16, 3, padding=1)
            self.fc = nn.Linear(16, 10)

        def forward(self, x):
            return self.fc(self.b(self.norm(self.a(x))).mean((2, 3)))
    (desc,) = prune_source(Source("net", "test", Net), [3, 16, 16], [30], "l1-norm", 2, seed=0)
    (norm,) = [n for n in desc.nodes if n.op == "instancenorm"]
    assert norm.attrs["num_features"] == 8 and norm.attrs["track_running_stats"]
    assert [n.attrs["out_channels"] for n in desc.nodes if n.op == "conv2d"][1] < 16
    _train_step(desc)


class _NormCall(nn.Module):
    """``F.batch_norm`` (or ``F.instance_norm``) of its own running statistics, weight and bias with a constant
    ``training`` (``use_input_stats``) where ``flag`` is a bool, else its mode."""

    def __init__(self, call, flag) -> None:
        super().__init__()
        self.call, self.flag = call, flag
        self.weight, self.bias = nn.Parameter(torch.rand(8) + 0.5), nn.Parameter(torch.randn(8))
        self.register_buffer("mean", torch.randn(8))
        self.register_buffer("var", torch.rand(8) + 0.5)

    def forward(self, x):
        return self.call(x, self.mean, self.var, self.weight, self.bias, self.training if self.flag is None
                         else self.flag)


class _ConstantModeNorm(nn.Module):
    """A convolution, then :class:`_NormCall`, then a classifier of the channels' means."""

    def __init__(self, call, flag) -> None:
        super().__init__()
        self.conv, self.norm, self.fc = nn.Conv2d(3, 8, 3, padding=1), _NormCall(call, flag), nn.Linear(8, 10)

    def forward(self, x):
        return self.fc(self.norm(self.conv(x)).mean((2, 3)))


@pytest.mark.parametrize("call", [F.batch_norm, F.instance_norm])
@pytest.mark.parametrize("flag", [False, True, None])
def test_a_norm_call_of_a_constant_mode_rebuilds_in_that_mode(call, flag):
    """F.batch_norm(..., training=False) (or True) and F.instance_norm(..., use_input_stats=...) in a forward read
    as the layer's mode (traced in evaluation, ``self.training`` reads False too), so the rebuilt layer normalised by
    the batch's statistics in training where the call used the running ones, and by the running ones in evaluation
    where the call used the batch's (and updated the running ones). A constant flag is kept as the attr ``training``
    (``use_input_stats``), told apart from ``self.training`` by a trace in training: the rebuilt network computes the
    module's outputs and running statistics in training and in evaluation, its description again (at another shape,
    on the meta device too) keeps the attr, and the allocation model's events are the meta trace's."""
    from test_allocator import _as_replayed

    from perf4sight.features.alloc_trace import record_events

    torch.manual_seed(0)
    module = _ConstantModeNorm(call, flag)
    desc = _computes_the_same(module)  # in training; then in evaluation, on the weights and statistics as trained
    key = "training" if call is F.batch_norm else "use_input_stats"
    (norm,) = [n for n in desc.nodes if n.op in ("batchnorm2d", "instancenorm")]
    assert norm.attrs.get(key) is flag
    rebuilt = build_module(desc)
    for new, old in zip(list(rebuilt.parameters()) + list(rebuilt.buffers()),
                        list(module.parameters()) + list(module.buffers())):
        new.data.copy_(old.data)
    x = torch.randn(2, *SHAPE)
    for training in (False, True, False):
        assert torch.allclose(rebuilt.train(training)(x), module.train(training)(x), atol=1e-5)
        for old, new in zip(module.buffers(), rebuilt.buffers()):
            assert torch.allclose(old, new, atol=1e-6)
    for device in (None, "meta"):
        again = describe(build_module(desc, device=device), [3, 12, 12], name="probe")
        assert [n.attrs for n in again.nodes if n.op == norm.op] == [norm.attrs]
    assert _as_replayed(record_events(desc, 2, steps=2)) == _as_replayed(record_events(desc, 2, steps=2,
                                                                                          method="trace"))


@pytest.mark.parametrize("call", [F.batch_norm, F.instance_norm])
def test_a_norm_call_of_a_constant_mode_called_twice_is_one_layer_in_that_mode(call):
    """The same call on two maps (one layer called again, ``shares``): both calls keep the constant flag, so the
    description is read (a later call's attrs must be its owner's) and rebuilt as the module computes in training
    and in evaluation."""
    class Twice(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.conv, self.norm, self.fc = nn.Conv2d(3, 8, 3, padding=1), _NormCall(call, False), nn.Linear(8, 10)

        def forward(self, x):
            y = self.conv(x)
            return self.fc((self.norm(y) + self.norm(y * 2)).mean((2, 3)))
    torch.manual_seed(0)
    module = Twice()
    desc = NetworkDescription.from_dict(describe(module, SHAPE, name="twice").to_dict())
    key = "training" if call is F.batch_norm else "use_input_stats"
    norms = [n for n in desc.nodes if n.op in ("batchnorm2d", "instancenorm")]
    assert [n.attrs[key] for n in norms] == [False, False] and norms[1].attrs["shares"] == norms[0].name
    rebuilt = build_module(desc)
    for new, old in zip(list(rebuilt.parameters()) + list(rebuilt.buffers()),
                        list(module.parameters()) + list(module.buffers())):
        new.data.copy_(old.data)
    x = torch.randn(2, *SHAPE)
    for training in (True, False):
        assert torch.allclose(rebuilt.train(training)(x), module.train(training)(x), atol=1e-5)


@pytest.mark.parametrize("helped", ["chunks", "shape condition"])
def test_a_norm_call_of_a_constant_mode_is_kept_where_the_forward_needs_the_shapes_to_trace(helped):
    """The trace in training that tells a constant flag from ``self.training`` was a plain torch.fx trace, which
    stops at a loop over a chunk's pieces or a branch on a map's size (the description's trace is told those at the
    input shape): the flag was dropped without a word and the rebuilt network normalised by the batch's statistics in
    training where the call used the running ones. It is traced as the description is now: the flag is kept and the
    rebuilt network computes the module's output in training and in evaluation."""
    class Helped(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.conv, self.norm = nn.Conv2d(3, 8, 3, padding=1), _NormCall(F.batch_norm, False)
            self.fc = nn.Linear(8, 10)

        def forward(self, x):
            y = self.norm(self.conv(x))
            if helped == "chunks":
                y = torch.cat([p * (i + 1) for i, p in enumerate(y.chunk(2, 1))], 1)
            elif y.shape[-1] > 4:
                y = y * 2
            return self.fc(y.mean((2, 3)))
    torch.manual_seed(0)
    module = Helped()
    statistics = [b.clone() for b in module.buffers()]
    desc = describe(module, SHAPE, name="helped")
    assert all(torch.equal(a, b) for a, b in zip(statistics, module.buffers(), strict=True))  # traced, not run
    (norm,) = [n for n in desc.nodes if n.op == "batchnorm2d"]
    assert norm.attrs.get("training") is False
    rebuilt = build_module(desc)
    for new, old in zip(list(rebuilt.parameters()) + list(rebuilt.buffers()),
                        list(module.parameters()) + list(module.buffers())):
        new.data.copy_(old.data)
    x = torch.randn(2, *SHAPE)
    for training in (True, False):
        assert torch.allclose(rebuilt.train(training)(x), module.train(training)(x), atol=1e-5)


def test_a_subclassed_norm_layer_is_traced_once(monkeypatch):
    """A batch or instance norm of a class of the network's own that keeps torch's forward is traced through that
    forward: an F.batch_norm call of the layer's buffers whose flag is the layer's mode. Its trace in training, to
    tell a constant flag, re-traced at each of the forward's shape checks (a ResNet-18 of such layers: 4 times the
    time to describe); it is not made for calls of torch's own forwards, and still is for a call of the module's own
    (whose constant flag is kept)."""
    import perf4sight.ir.from_torch as from_torch

    class OwnBatchNorm(nn.BatchNorm2d):
        pass

    class OwnInstanceNorm(nn.InstanceNorm2d):
        pass

    class Layers(nn.Module):
        def __init__(self, call: bool) -> None:
            super().__init__()
            self.conv, self.fc = nn.Conv2d(3, 8, 3, padding=1), nn.Linear(8, 10)
            self.bn, self.inorm = OwnBatchNorm(8), OwnInstanceNorm(8, track_running_stats=True)
            self.call = _NormCall(F.batch_norm, False) if call else None

        def forward(self, x):
            y = self.inorm(self.bn(self.conv(x)))
            return self.fc((y if self.call is None else self.call(y)).mean((2, 3)))
    traced, trace = [], from_torch._trace
    monkeypatch.setattr(from_torch, "_trace", lambda *a: traced.append(a) or trace(*a))
    for call, traces in ((False, 1), (True, 2)):
        traced.clear()
        desc = describe(Layers(call), SHAPE, name="layers")
        assert len(traced) == traces
        assert [n.attrs.get("training") for n in desc.nodes if n.op == "batchnorm2d"] == [None, False][:traces]
        assert [n.attrs.get("use_input_stats") for n in desc.nodes if n.op == "instancenorm"] == [None]


@pytest.mark.parametrize("flag", [False, True, None])
def test_a_batch_norm_call_by_its_running_statistics_trains_at_batch_one_over_a_1x1_map(flag):
    """A batch norm over a 1x1 map has one value per channel at batch 1, which torch refuses in training: such a
    network was said not to train at batch 1 at all, also where the call normalises by its running statistics
    (``training=False``), which trains there; the rebuilt network takes that step."""
    class Pooled(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.conv, self.norm, self.fc = nn.Conv2d(3, 8, 3, padding=1), _NormCall(F.batch_norm, flag), \
                nn.Linear(8, 10)

        def forward(self, x):
            return self.fc(self.norm(self.conv(x).mean((2, 3), keepdim=True)).flatten(1))
    desc = describe(Pooled(), SHAPE, name="pooled")
    assert desc.untrainable_at_batch_one is (flag is not False)
    rebuilt = build_module(desc).train()
    if flag is False:
        rebuilt(torch.randn(1, *SHAPE)).sum().backward()
    else:
        with pytest.raises(ValueError, match="Expected more than 1 value per channel when training"):
            rebuilt(torch.randn(1, *SHAPE))


@pytest.mark.parametrize("attrs, problem", [
    ({"num_features": 8, "training": False, "track_running_stats": False}, "needs running statistics"),
    ({"num_features": 8, "training": True, "momentum": None}, "needs a momentum"),
    ({"num_features": 8, "training": "no"}, "must be true or false"),
])
def test_a_constant_mode_without_running_statistics_is_refused(attrs, problem):
    """Without running statistics torch normalises by the input's in either mode (and refuses training=False):
    a description giving a batchnorm2d's constant ``training`` there is refused when read, naming the attr."""
    desc = describe(_ConstantModeNorm(F.batch_norm, False), SHAPE, name="probe").to_dict()
    (norm,) = [n for n in desc["nodes"] if n["op"] == "batchnorm2d"]
    norm["attrs"] = attrs
    with pytest.raises(UserError, match=problem):
        NetworkDescription.from_dict(desc)


@pytest.mark.parametrize("case", ["log", "normalize"])
def test_the_call_keeps_what_autograd_keeps(case):
    """What a sample adds to autograd's saved tensors (the network input aside) is the features' (a log's input; a
    normalisation's input, its norm and the norm clamped, a float a row each)."""
    from test_features import _autograd_saved_bytes

    from perf4sight.features.aggregate import network_features

    desc = describe(_Probe(_CASES[case][0]), SHAPE, name=case)
    at2, at4 = (b * _autograd_saved_bytes(desc, b, with_input=False) for b in (2, 4))
    assert network_features(desc).per_sample["saved_bytes"] == (at4 - at2) / 2


def test_a_normalisation_runs_its_kernels_in_the_latency_terms():
    """The kernel table runs a normalisation as torch does: 3 kernels forward (the norm, its clamp, the division) and
    14 back (formulas' count, from the dispatch log)."""
    from perf4sight.features.latency_terms import kernel_table

    desc = describe(_Probe(lambda y: F.normalize(y, dim=1)), SHAPE, name="normalized")
    plain = describe(_Probe(lambda y: y), SHAPE, name="plain")
    assert kernel_table(desc).launches == kernel_table(plain).launches + 3 + 14


class _Unfolded(nn.Module):
    """An involution-like use of im2col: a convolution's [8, 8, 8] map, its 3 x 3 windows (nn.Unfold, padded) and
    its 2 x 2 patches (F.unfold at stride 2) as columns, each reduced and combined, then a classifier."""

    def __init__(self) -> None:
        super().__init__()
        self.conv, self.windows, self.fc = nn.Conv2d(3, 8, 3, padding=1), nn.Unfold(3, padding=1), nn.Linear(72, 10)

    def forward(self, x):
        y = self.conv(x)
        columns = self.windows(y) * 2  # [N, 72, 64]
        patches = F.unfold(y, 2, dilation=1, stride=2)  # [N, 32, 16]
        return self.fc(columns.mean(2)) + patches.mean(1).sum(1, keepdim=True)


def test_unfold_is_described():
    """F.unfold and nn.Unfold (im2col: an involution's, a local attention's windows as columns) were refused as a
    call without a description op: they are the op unfold (kernel_size, dilation, padding and stride as pairs),
    [C kh kw, L] of a [C, H, W] map, and the rebuilt module computes the original's output and gradients."""
    desc = _computes_the_same(_Unfolded())
    assert [(n.attrs, n.output_shape) for n in desc.nodes if n.op == "unfold"] == [
        ({"kernel_size": [3, 3], "dilation": [1, 1], "padding": [1, 1], "stride": [1, 1]}, [72, 64]),
        ({"kernel_size": [2, 2], "dilation": [1, 1], "padding": [0, 0], "stride": [2, 2]}, [32, 16])]


def test_an_unfold_of_a_3_d_tensor_is_refused_by_name():
    """F.unfold of a [N, C, L] tensor reads it as one unbatched [C, H, W] map, the batch as its channels: refused by
    name."""
    with pytest.raises(UserError, match=r"an unfold \(im2col\) of anything but a \[N, C, H, W\] map"):
        describe(_Probe(lambda y: F.unfold(y.flatten(2), (1, 2)).reshape(y.shape[0], -1), 2 * 8 * 63), SHAPE,
                 name="unbatched")


@pytest.mark.parametrize("batch", [3, 1])
def test_the_allocation_model_writes_down_an_unfold_as_traced(batch):
    """An unfold: its columns (aten.im2col), nothing kept; backward aten.col2im, a gradient of the input's size. The
    model's events are the meta trace's."""
    from test_allocator import _as_replayed

    from perf4sight.features.alloc_trace import record_events

    desc = describe(_Unfolded(), SHAPE, name="unfolded")
    model = record_events(desc, batch, steps=2, method="model")
    assert _as_replayed(model) == _as_replayed(record_events(desc, batch, steps=2, method="trace"))
    assert [size for _, _, size, op in model if op == "aten.col2im.default"] == [batch * 8 * 8 * 8 * 4] * 4


@pytest.mark.parametrize("kernel, stride, padding", [(3, 1, 1), (2, 2, 0)])
def test_an_unfold_costs_the_kernels_torch_runs(kernel, stride, padding):
    """The walk's cost of an unfold counts the kernels this torch runs (a dispatch log): im2col forward, no FLOPs;
    col2im backward, an output element's add each; nothing kept. Its latency terms run one kernel each way."""
    from test_features import _ops_run

    from perf4sight.features.latency_terms import kernel_table
    from perf4sight.features.walk import walk

    desc = describe(_Probe(lambda y: F.unfold(y, kernel, padding=padding, stride=stride),
                           8 * kernel * kernel * (8 // stride) ** 2), SHAPE, name="unfold")
    (visit,) = [v for v in walk(desc) if v.node.op == "unfold"]
    forward, backward = _ops_run(lambda x: F.unfold(x, kernel, padding=padding, stride=stride), [8, 8, 8])
    assert [name for name, _ in forward] == ["im2col"] and [name for name, _ in backward] == ["col2im"]
    assert (visit.cost.kernels_fwd, visit.cost.kernels_bwd, visit.cost.flops_fwd) == (1, 1, 0)
    assert visit.cost.flops_bwd == forward[0][1] and (visit.cost.saved, visit.cost.extra_saved_bytes) == ([], 0)
    plain = describe(_Probe(lambda y: y), SHAPE, name="plain")  # its classifier's kernels as many as the other's
    assert kernel_table(desc).launches - kernel_table(plain).launches == 2


def test_a_network_using_unfold_prunes_and_trains():
    """Pruning a network whose columns (an unfold of its second convolution's map) feed a classifier cuts the first
    convolution and leaves the unfolded channels whole (torch-pruning's graph does not follow them through the
    im2col, and says so): the pruned network describes, its unfold kept, and a training step runs."""
    from test_networks import _train_step

    from perf4sight.networks.build import Source, prune_source

    class Net(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.a, self.b, self.fc = nn.Conv2d(3, 16, 3, padding=1), nn.Conv2d(16, 16, 3, padding=1), nn.Linear(64, 10)

        def forward(self, x):
            return self.fc(F.unfold(self.b(self.a(x)), 2, stride=2).mean(2))
    (desc,) = prune_source(Source("net", "test", Net), [3, 16, 16], [30], "l1-norm", 2, seed=0)
    assert [n.attrs["out_channels"] for n in desc.nodes if n.op == "conv2d"][0] < 16
    assert [n.output_shape for n in desc.nodes if n.op == "unfold"] == [[64, 64]]
    assert sum(desc.extra["pruning_unpruned_groups"].values()) == 1
    _train_step(desc)


def test_an_unfold_keeps_what_autograd_keeps():
    """An unfold keeps nothing for backward: what a sample adds to autograd's saved tensors (the network input
    aside) is the features'."""
    from test_features import _autograd_saved_bytes

    from perf4sight.features.aggregate import network_features

    desc = describe(_Unfolded(), SHAPE, name="unfolded")
    at2, at4 = (b * _autograd_saved_bytes(desc, b, with_input=False) for b in (2, 4))
    assert network_features(desc).per_sample["saved_bytes"] == (at4 - at2) / 2


class _Gate(nn.Module):
    """A squeeze-and-excitation gate: a convolution's [8, 8, 8] map times the sigmoid of a linear layer of its
    channels' means, broadcast back over the map by ``expand`` (new axes of size 1), then a classifier."""

    def __init__(self, expand) -> None:
        super().__init__()
        self.conv, self.excite, self.expand, self.fc = nn.Conv2d(3, 8, 3, padding=1), nn.Linear(8, 8), expand, \
            nn.Linear(8, 10)

    def forward(self, x):
        y = self.conv(x)
        return self.fc((y * self.expand(self.excite(y.mean((2, 3))).sigmoid())).mean((2, 3)))


_NEW_AXES = {"[:, :, None, None]": lambda g: g[:, :, None, None], "[..., None, None]": lambda g: g[..., None, None],
             "[:, :, None][..., None]": lambda g: g[:, :, None][..., None]}


@pytest.mark.parametrize("case", list(_NEW_AXES))
def test_new_axes_by_indexing_with_none_are_a_reshape(case):
    """An SE gate's g[:, :, None, None] (and g[..., None, None]) was refused ("call_function 'getitem' has no
    description op") where g.view(-1, C, 1, 1) described: new axes of size 1 alone are torch's unsqueezed views,
    the op reshape to the output's shape, and the rebuilt module computes the original's output and gradients."""
    desc = _computes_the_same(_Gate(_NEW_AXES[case]))
    assert [n.attrs for n in desc.nodes if n.op == "reshape"][-1] == {"shape": [8, 1, 1]}


@pytest.mark.parametrize("batch", [3, 1])
def test_the_allocation_model_writes_down_new_axes_as_traced(batch):
    """The new axes are views of the gate: the model's events are the meta trace's."""
    from test_allocator import _as_replayed

    from perf4sight.features.alloc_trace import record_events

    desc = describe(_Gate(_NEW_AXES["[:, :, None, None]"]), SHAPE, name="gate")
    model = record_events(desc, batch, steps=2, method="model")
    assert _as_replayed(model) == _as_replayed(record_events(desc, batch, steps=2, method="trace"))


@pytest.mark.parametrize("expand", [lambda g: g[None].squeeze(0)[:, :, None, None],
                                    lambda g: g[None, :, :, None, None].squeeze(0)])
def test_a_new_axis_before_the_batch_is_refused_by_name(expand):
    """A new axis before the batch's (x[None]) moves the batch: refused by name, saying to index after it."""
    with pytest.raises(UserError, match=r"a new axis before the batch \(x\[None\]\) .* index after it"):
        describe(_Gate(expand), SHAPE, name="before")


def test_a_network_gated_through_new_axes_prunes_and_trains():
    """Pruning ties the gate's channels to the map's through the new axes: the pruned network describes, its
    reshape to the pruned channels, and a training step runs."""
    from test_networks import _train_step

    from perf4sight.networks.build import Source, prune_source

    class Net(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.a, self.b = nn.Conv2d(3, 16, 3, padding=1), nn.Conv2d(16, 16, 3, padding=1)
            self.squeeze, self.excite, self.fc = nn.Linear(16, 4), nn.Linear(4, 16), nn.Linear(16, 10)

        def forward(self, x):
            y = self.b(self.a(x).relu())
            gate = self.excite(self.squeeze(y.mean((2, 3))).relu()).sigmoid()
            return self.fc((y * gate[:, :, None, None]).mean((2, 3)))
    (desc,) = prune_source(Source("net", "test", Net), [3, 16, 16], [30], "l1-norm", 2, seed=0)
    channels = [n.attrs["out_channels"] for n in desc.nodes if n.op == "conv2d"]
    assert min(channels) < 16
    assert [n.attrs["shape"] for n in desc.nodes if n.op == "reshape"] == [[channels[1], 1, 1]]
    _train_step(desc)


def test_a_cross_map_lrn_is_refused_naming_the_layer_that_describes():
    """nn.CrossMapLRN2d was refused as a layer without a description op, saying no more: the refusal says why (an
    autograd Function of its own whose window differs: its output is not LocalResponseNorm's) and names the layer
    that describes."""
    module = nn.Sequential(nn.Conv2d(3, 8, 3), nn.CrossMapLRN2d(3, 1e-2, 0.75, 2.0), nn.Flatten())
    with pytest.raises(UserError, match=r"CrossMapLRN2d has no description op: .* nn.LocalResponseNorm\(size, alpha"):
        describe(module, SHAPE, name="lrn")
    x = torch.randn(2, 8, 5, 5)
    assert not torch.allclose(nn.CrossMapLRN2d(3, 1e-2, 0.75, 2.0)(x), nn.LocalResponseNorm(3, 1e-2, 0.75, 2.0)(x))


class _Affinity(nn.Module):
    """Attention written as einsums of two convolutions' [8, 64] flattened maps t and p (``n c l``): the
    affinities ``affinity(t, p)``, softmaxed, then ``attend(p, affinities)``, added back to t, then a classifier."""

    def __init__(self, affinity, attend) -> None:
        super().__init__()
        self.theta, self.phi, self.fc = nn.Conv2d(3, 8, 3, padding=1), nn.Conv2d(3, 8, 1), nn.Linear(8, 10)
        self.affinity, self.attend = affinity, attend

    def forward(self, x):
        t, p = self.theta(x).flatten(2), self.phi(x).flatten(2)
        return self.fc((t + self.attend(p, self.affinity(t, p).softmax(-1))).mean(2))


#: (affinity, attend, transposes): a non-local block's positions (t^T p, then p a^T: both read transposed),
#: DANet's channel attention (t p^T, then a plain a p), and the non-local block with each einsum's operands given in
#: the other order (p first, then the weights first: torch's bmm of the second by the first, t^T p and p a^T again).
_EINSUM_FORMS = {
    "non_local": (lambda t, p: torch.einsum("nci,ncj->nij", t, p), lambda p, a: torch.einsum("ncj,nij->nci", p, a),
                  2),
    "channels": (lambda t, p: torch.einsum("ncl,ndl->ncd", t, p), lambda p, a: torch.einsum("ncd,ndl->ncl", a, p),
                 1),
    "operands_swapped": (lambda t, p: torch.einsum("ncj,nci->nij", p, t),
                         lambda p, a: torch.einsum("nij,ncj->nci", a, p), 2),
}


@pytest.mark.parametrize("case", list(_EINSUM_FORMS))
def test_an_einsum_of_a_transposed_operand_is_a_transpose_and_a_matmul(case):
    """An einsum that multiplies batched matrices one of which it reads transposed ('nci,ncj->nij', a non-local
    block's t^T p; 'ncl,ndl->ncd', DANet's t p^T) was refused as no plain batched matrix product: it is a transpose of
    that operand's last two dims and the op matmul (torch's bmm of the transposed view), and the rebuilt module
    computes the original's output and gradients."""
    affinity, attend, transposes = _EINSUM_FORMS[case]
    desc = _computes_the_same(_Affinity(affinity, attend))
    assert [n.op for n in desc.nodes].count("matmul") == 2
    assert [n.attrs for n in desc.nodes if n.op == "transpose"] == [{"dim0": -2, "dim1": -1}] * transposes


@pytest.mark.parametrize("affinity, attend", [
    (lambda t, p: torch.einsum("nci,ncj->nij", t, p), lambda p, a: torch.einsum("ncj,nji->nci", p, a)),
    _EINSUM_FORMS["channels"][:2],
    (lambda t, p: torch.einsum("ncj,nci->nij", p, t), lambda p, a: torch.einsum("nji,ncj->nci", a, p))])
@pytest.mark.parametrize("batch", [3, 1])
def test_the_allocation_model_writes_down_an_einsum_of_a_transposed_operand_as_traced(affinity, attend, batch):
    """A transposed operand (the first's, t^T p; the second's, t p^T) is a view the product reads as it lies: the
    model's events are the meta trace's. (A product of a softmax's result transposed, p a^T, leaves the model, as
    written by hand with .transpose: its softmax's gradient arrives permuted.)"""
    from test_allocator import _as_replayed

    from perf4sight.features.alloc_trace import record_events

    desc = describe(_Affinity(affinity, attend), SHAPE, name="affinity")
    assert "transpose" in [n.op for n in desc.nodes]
    model = record_events(desc, batch, steps=2, method="model")
    assert _as_replayed(model) == _as_replayed(record_events(desc, batch, steps=2, method="trace"))


@pytest.mark.parametrize("equation, rebuilt", [
    ("bci,bcj->bij", lambda x, y: x.transpose(1, 2) @ y), ("bik,bjk->bij", lambda x, y: x @ y.transpose(1, 2)),
    ("bij,bcj->bci", lambda x, y: y @ x.transpose(1, 2)), ("bji,bjc->bci", lambda x, y: y.transpose(1, 2) @ x)])
def test_an_einsum_of_a_transposed_operand_runs_the_kernels_of_its_description(equation, rebuilt):
    """Torch runs such an einsum as the transpose and matmul it is described by (a dispatch log, views left out):
    one bmm forward; backward the gradient's bmm (and the same copies), so the matmul's costs hold."""
    from test_features import _ops_run

    views = {"permute", "transpose", "expand", "_unsafe_view", "t"}

    def kernels(fn):
        forward, backward = _ops_run(lambda x: fn(x, x.detach() * 2), [8, 16])
        return [[name for name, _ in run if name not in views] for run in (forward, backward)]
    assert kernels(lambda x, y: torch.einsum(equation, x, y)) == kernels(rebuilt)


@pytest.mark.parametrize("case", list(_EINSUM_FORMS))
def test_a_network_of_einsums_of_transposed_operands_prunes_and_trains(case):
    """Pruning ties the channels the einsums multiply (those of both convolutions and of the map they are added
    back to): the pruned network describes, its products of the pruned maps, and a training step runs."""
    from test_networks import _train_step

    from perf4sight.networks.build import Source, prune_source

    affinity, attend, _ = _EINSUM_FORMS[case]

    class Net(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.stem, self.block = nn.Conv2d(3, 16, 3, padding=1), _Affinity(affinity, attend)
            self.block.theta, self.block.phi = nn.Conv2d(16, 16, 3, padding=1), nn.Conv2d(16, 16, 1)
            self.block.fc = nn.Linear(16, 10)

        def forward(self, x):
            return self.block(self.stem(x).relu())
    (desc,) = prune_source(Source("net", "test", Net), [3, 16, 16], [30], "l1-norm", 2, seed=0)
    widths = {n.attrs["out_channels"] for n in desc.nodes if n.op == "conv2d"}
    assert len(widths) == 1 and widths.pop() < 16 and [n.op for n in desc.nodes].count("matmul") == 2
    _train_step(desc)


class _Folded(nn.Module):
    """Soft split and composition (FuseFormer's, an inpainting network's): a convolution's [8, 8, 8] map cut into
    2 x 2 patches as columns (F.unfold), scaled by a sigmoid gate of themselves, put back (nn.Fold); and its
    overlapping 3 x 3 windows summed back (F.fold of F.unfold); then a classifier of the channels' means."""

    def __init__(self) -> None:
        super().__init__()
        self.conv, self.fc = nn.Conv2d(3, 8, 3, padding=1), nn.Linear(8, 10)
        self.compose = nn.Fold((8, 8), 2, stride=2)

    def forward(self, x):
        y = self.conv(x)
        patches = F.unfold(y, 2, stride=2)  # [N, 32, 16]
        overlapped = F.fold(F.unfold(y, 3, padding=1) * 0.5, (8, 8), 3, padding=1)
        return self.fc((self.compose(patches * patches.sigmoid()) + overlapped).mean((2, 3)))


def test_fold_is_described():
    """F.fold and nn.Fold (col2im, unfold's inverse) were refused as calls without a description op: they are the
    op fold (output_size, kernel_size, dilation, padding, stride as pairs), [C, H, W] of [C kh kw, L] columns, and
    the rebuilt module computes the original's output and gradients."""
    desc = _computes_the_same(_Folded())
    assert [(n.attrs, n.output_shape) for n in desc.nodes if n.op == "fold"] == [
        ({"output_size": [8, 8], "kernel_size": [3, 3], "dilation": [1, 1], "padding": [1, 1], "stride": [1, 1]},
         [8, 8, 8]),
        ({"output_size": [8, 8], "kernel_size": [2, 2], "dilation": [1, 1], "padding": [0, 0], "stride": [2, 2]},
         [8, 8, 8])]


def test_a_fold_to_another_maps_size_is_described():
    """F.fold given its output size as another map's sides (``y.shape[-2:]``, windows put back onto the map they were
    cut from) failed to describe ('TypeError: 'Node' object is not subscriptable'): its output size is the traced
    output's, and the rebuilt module computes the original's output and gradients."""
    desc = _computes_the_same(_Probe(lambda y: F.fold(F.unfold(y, 3, padding=1), y.shape[-2:], 3, padding=1)))
    assert [n.attrs["output_size"] for n in desc.nodes if n.op == "fold"] == [SHAPE[1:]]


def _model_is_the_trace(desc: NetworkDescription, covered: bool = True) -> None:
    """The allocation events of ``desc``'s step (the model's where it covers them, else the meta trace's) are the
    meta trace's of the rebuilt module, at batch sizes 1 and 3."""
    from test_allocator import _as_replayed

    from perf4sight.features.alloc_trace import record_events

    for batch in (1, 3):
        method = "model" if covered else "auto"
        assert _as_replayed(record_events(desc, batch, steps=2, method=method)) == _as_replayed(
            record_events(desc, batch, steps=2, method="trace"))


def test_a_transposed_convolution_sized_by_a_map_nothing_else_reads_is_left_to_the_meta_trace():
    """``up(z, output_size=y.shape[2:])`` where nothing after reads ``y``: the rebuilt module drops ``y`` once it has
    read its shape, just before the convolution runs, where the allocation model dropped it after its last input's
    reader (the sigmoid) and wrote a step whose events were not the trace's; it leaves such a step to the meta
    trace now, whose events it is."""
    from perf4sight.features.alloc_trace import record_events

    class Up(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.conv, self.down = nn.Conv2d(3, 8, 3, padding=1), nn.Conv2d(8, 8, 3, stride=2, padding=1)
            self.up, self.fc = nn.ConvTranspose2d(8, 8, 3, stride=2, padding=1), nn.Linear(8, 10)

        def forward(self, x):
            y = self.conv(x)
            return self.fc(self.up(self.down(y.sigmoid()), output_size=y.shape[2:]).mean((2, 3)))
    desc = describe(Up(), [3, 13, 13], name="up")
    assert [n.attrs["output_size_of"] for n in desc.nodes if n.op == "conv_transpose2d"] == ["conv"]
    with pytest.raises(UserError, match="does not cover a transposed convolution sized by a map nothing after it"):
        record_events(desc, 2, steps=2, method="model")
    _model_is_the_trace(desc, covered=False)


def test_a_fold_to_another_maps_size_follows_another_input_shape():
    """That fold's output size was the traced 8x8, so the description rebuilt at 12x12 failed ("expected
    input.size(-1) to be 64 but got 144"): it names the map whose sides it takes (``output_size_of``, as a resize's
    ``size_of``), and described at another shape the rebuilt network computes what the module computes there; the
    name is kept when described again, and a name of anything but a map is refused when read."""
    from perf4sight.networks.reshape import described_at

    class Folded(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.conv, self.fc = nn.Conv2d(3, 8, 3, padding=1), nn.Linear(8, 10)

        def forward(self, x):
            y = self.conv(x)
            return self.fc(F.fold(F.unfold(y, 3, padding=1).sigmoid(), y.shape[-2:], 3, padding=1).mean((2, 3)))
    torch.manual_seed(0)
    module = Folded().eval()
    desc = NetworkDescription.from_dict(describe(module, [3, 12, 12], name="fold").to_dict())
    (fold,) = [n for n in desc.nodes if n.op == "fold"]
    assert fold.attrs["output_size_of"] == "conv" and fold.attrs["output_size"] == [12, 12]
    at = described_at(desc, [3, 16, 12])
    (moved,) = [n for n in at.nodes if n.op == "fold"]
    assert moved.output_shape == [8, 16, 12] and moved.attrs["output_size_of"] == "conv"
    rebuilt = build_module(at).eval()
    for new, old in zip(rebuilt.parameters(), module.parameters(), strict=True):
        new.data.copy_(old.data)
    x = torch.randn(2, 3, 16, 12)
    assert torch.allclose(rebuilt(x), module(x), atol=1e-5)
    _model_is_the_trace(desc)  # the rebuilt module keeps the map until the fold has read its size
    edited = desc.to_dict()
    next(n for n in edited["nodes"] if n["op"] == "fold")["attrs"]["output_size_of"] = "input"  # 3x12x12: its size
    NetworkDescription.from_dict(edited)
    next(n for n in edited["nodes"] if n["op"] == "fold")["attrs"]["output_size_of"] = "unfold"  # no map
    with pytest.raises(UserError, match=r"output_size_of names 'unfold' of shape \[72, 144\]"):
        NetworkDescription.from_dict(edited)


def test_a_fold_of_2_d_columns_is_refused_by_name():
    """F.fold of a [N, L] tensor reads it as one unbatched [C kh kw, L], the batch as its channels: refused by
    name."""
    with pytest.raises(UserError, match=r"a fold \(col2im\) of anything but \[N, C x kh x kw, L\] columns"):
        describe(_Probe(lambda y: F.fold(y.mean((2, 3)), (1, 8), 1), 8), SHAPE, name="unbatched")


@pytest.mark.parametrize("batch", [3, 1])
def test_the_allocation_model_writes_down_a_fold_as_traced(batch):
    """A fold: its map (aten.col2im), nothing kept; backward aten.im2col, a gradient of the columns' size. The
    model's events are the meta trace's."""
    from test_allocator import _as_replayed

    from perf4sight.features.alloc_trace import record_events

    desc = describe(_Folded(), SHAPE, name="folded")
    model = record_events(desc, batch, steps=2, method="model")
    assert _as_replayed(model) == _as_replayed(record_events(desc, batch, steps=2, method="trace"))
    folds = [size for _, _, size, op in model if op == "aten.col2im.default"]
    assert len(folds) == 2 * 2 * 2 and set(folds) == {batch * 8 * 8 * 8 * 4}  # 2 folds and 2 unfolds' backward


@pytest.mark.parametrize("kernel, stride, padding", [(3, 1, 1), (2, 2, 0)])
def test_a_fold_costs_the_kernels_torch_runs(kernel, stride, padding):
    """The walk's cost of a fold counts the kernels this torch runs (a dispatch log): col2im forward, an add a
    column element; im2col backward, no FLOPs; nothing kept."""
    from test_features import _ops_run

    from perf4sight.features.walk import walk

    def fold(y):
        return F.fold(F.unfold(y, kernel, padding=padding, stride=stride), (8, 8), kernel, padding=padding,
                      stride=stride)
    desc = describe(_Probe(fold), SHAPE, name="fold")
    (visit,) = [v for v in walk(desc) if v.node.op == "fold"]
    columns = [8 * kernel * kernel, (8 // stride) ** 2]
    forward, backward = _ops_run(lambda x: F.fold(x, (8, 8), kernel, padding=padding, stride=stride), columns)
    assert [name for name, _ in forward] == ["col2im"] and [name for name, _ in backward] == ["im2col"]
    assert (visit.cost.kernels_fwd, visit.cost.kernels_bwd, visit.cost.flops_bwd) == (1, 1, 0)
    assert visit.cost.flops_fwd == columns[0] * columns[1] and visit.cost.saved == []


def test_a_network_using_fold_prunes_and_trains():
    """Pruning a network that cuts a map into patches and puts them back (an unfold, a fold) cuts the channels
    through both (torch-pruning's graph follows a column's channel into its map's): the pruned network describes,
    its fold of the pruned channels, and a training step runs."""
    from test_networks import _train_step

    from perf4sight.networks.build import Source, prune_source

    class Net(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.a, self.b = nn.Conv2d(3, 16, 3, padding=1), nn.Conv2d(16, 16, 3, padding=1)
            self.c, self.fc = nn.Conv2d(16, 16, 3, padding=1), nn.Linear(16, 10)

        def forward(self, x):
            patches = F.unfold(self.b(self.a(x).relu()), 2, stride=2)
            return self.fc(self.c(F.fold(patches.sigmoid() * patches, (16, 16), 2, stride=2)).mean((2, 3)))
    (desc,) = prune_source(Source("net", "test", Net), [3, 16, 16], [30], "l1-norm", 2, seed=0)
    widths = [n.attrs["out_channels"] for n in desc.nodes if n.op == "conv2d"]
    assert max(widths) < 16 and [n.output_shape for n in desc.nodes if n.op == "fold"] == [[widths[1], 16, 16]]
    _train_step(desc)


def test_a_fold_keeps_what_autograd_keeps():
    """A fold keeps nothing for backward: what a sample adds to autograd's saved tensors (the network input aside)
    is the features'."""
    from test_features import _autograd_saved_bytes

    from perf4sight.features.aggregate import network_features

    desc = describe(_Folded(), SHAPE, name="folded")
    at2, at4 = (b * _autograd_saved_bytes(desc, b, with_input=False) for b in (2, 4))
    assert network_features(desc).per_sample["saved_bytes"] == (at4 - at2) / 2


class _ChannelsLast(nn.Module):
    """A convolution's [8, 8, 8] map put channels last by einsum ``equation``, a layer norm over its channels and a
    classifier of the positions' mean."""

    def __init__(self, equation: str) -> None:
        super().__init__()
        self.conv, self.norm, self.fc, self.equation = nn.Conv2d(3, 8, 3, padding=1), nn.LayerNorm(8), \
            nn.Linear(8, 10), equation

    def forward(self, x):
        return self.fc(self.norm(torch.einsum(self.equation, self.conv(x))).mean((1, 2)))


def test_an_einsum_reordering_one_tensor_is_a_permute():
    """torch.einsum('bchw->bhwc', x) (a ConvNeXt-style block's channels put last) was refused as no batched matrix
    product: torch makes it a permuted view of x, the op permute, and the rebuilt module computes the original's
    output and gradients."""
    desc = _computes_the_same(_ChannelsLast("bchw->bhwc"))
    assert [n.attrs for n in desc.nodes if n.op == "permute"] == [{"dims": [0, 2, 3, 1]}]


@pytest.mark.parametrize("equation, width", [("bchw->hwbc", 512), ("bchw->bwh", 64), ("bcch->bch", 64)])
def test_an_einsum_moving_the_batch_or_reducing_is_refused_by_name(equation, width):
    """A reordering that moves the batch, a sum over a letter that reorders the others (a sum alone is described:
    test_ir_research_calls) or a diagonal is no permute: refused naming its form."""
    with pytest.raises(UserError, match=rf"an einsum of the form '{equation}' has no description op"):
        describe(_Probe(lambda y: torch.einsum(equation, y).reshape(y.shape[0], -1), width), SHAPE, name="refused")


@pytest.mark.parametrize("batch", [3, 1])
def test_the_allocation_model_writes_down_an_einsum_permute_as_traced(batch):
    """The einsum's permute is a view the layer norm reads: the model's events are the meta trace's."""
    from test_allocator import _as_replayed

    from perf4sight.features.alloc_trace import record_events

    desc = describe(_ChannelsLast("bchw->bhwc"), SHAPE, name="channels_last")
    model = record_events(desc, batch, steps=2, method="model")
    assert _as_replayed(model) == _as_replayed(record_events(desc, batch, steps=2, method="trace"))


class _OwnBatchNorm(nn.BatchNorm2d):
    """A batch norm of the network's own class that keeps torch's forward (traced through: an ``F.batch_norm`` call
    whose flag is the layer's mode)."""


class _FrozenNorm(nn.Module):
    """A convolution, a batch norm, a ReLU and a classifier, the norm of ``form``: "eval" (a BatchNorm2d), "no affine"
    (one without a weight), "subclass" (:class:`_OwnBatchNorm`), "1d" (a BatchNorm1d of the pooled [N, C] features)
    or "call" (``F.batch_norm(..., training=False)`` of its layer's buffers); :meth:`frozen` puts the module in
    training and the norm in evaluation (a batch norm frozen for fine-tuning)."""

    def __init__(self, form: str) -> None:
        super().__init__()
        self.form = form
        self.conv = nn.Conv2d(3, 8, 3, padding=1)
        self.bn = {"1d": nn.BatchNorm1d(8), "no affine": nn.BatchNorm2d(8, affine=False),
                   "subclass": _OwnBatchNorm(8)}.get(form, nn.BatchNorm2d(8))
        self.fc = nn.Linear(8 if form == "1d" else 8 * 8 * 8, 10)
        with torch.no_grad():  # running statistics of their own, so that a norm by the batch's would differ
            self.bn.running_mean.uniform_(-0.5, 0.5)
            self.bn.running_var.uniform_(0.5, 2.0)

    def frozen(self) -> "_FrozenNorm":
        self.train()
        self.bn.eval()
        return self

    def forward(self, x):
        y = self.conv(x)
        if self.form == "1d":
            return self.fc(self.bn(y.mean((2, 3))).relu())
        if self.form == "call":
            y = F.batch_norm(y, self.bn.running_mean, self.bn.running_var, self.bn.weight, self.bn.bias,
                             training=False)
        else:
            y = self.bn(y)
        return self.fc(y.relu().flatten(1))


_FROZEN_FORMS = ["eval", "no affine", "subclass", "1d"]


@pytest.mark.parametrize("form", _FROZEN_FORMS)
def test_a_batch_norm_frozen_in_a_training_model_keeps_its_mode(form):
    """A batch norm a training model holds in evaluation (``bn.eval()``: frozen for fine-tuning) was described as any
    batchnorm2d, rebuilt to follow the step's mode: the rebuilt network normalised by the batch's statistics (and
    updated the running ones) where the model used its running ones. It has the attr ``training`` false: the rebuilt
    network computes the module's output, gradients and buffers in a training step. A module in evaluation as a
    whole (the step trains it) marks none."""
    torch.manual_seed(0)
    module = _FrozenNorm(form).frozen()
    desc = NetworkDescription.from_dict(describe(module, SHAPE, name="frozen").to_dict())
    (norm,) = [n for n in desc.nodes if n.op == "batchnorm2d"]
    assert norm.attrs.get("training") is False
    rebuilt = build_module(desc).train()
    for new, old in zip(list(rebuilt.parameters()) + list(rebuilt.buffers()),
                        list(module.parameters()) + list(module.buffers())):
        new.data.copy_(old.data)
    x = torch.randn(2, *SHAPE)
    outputs, gradients = [], []
    for net in (module, rebuilt):
        out = net(x)
        out.square().sum().backward()
        outputs.append(out)
        gradients.append([p.grad for p in net.parameters()])
    assert torch.allclose(outputs[0], outputs[1], atol=1e-5)
    assert all(torch.allclose(a, b, atol=1e-4) for a, b in zip(*gradients, strict=True))
    assert all(torch.equal(a, b) for a, b in zip(module.buffers(), rebuilt.buffers(), strict=True))
    whole = describe(_FrozenNorm(form).eval(), SHAPE, name="evaluated")
    assert [n.attrs.get("training") for n in whole.nodes if n.op == "batchnorm2d"] == [None]


@pytest.mark.parametrize("form", ["eval", "no affine", "1d", "call"])
@pytest.mark.parametrize("batch", [3, 1])
def test_the_allocation_model_writes_down_a_batch_norm_by_its_running_statistics_as_traced(form, batch):
    """A batch norm of ``training`` false was left to the meta trace: the meta kernel allocates what it does in
    training (the output and a [C] mean and 1/std, kept with the input), and backward the same; the model's events
    are the trace's, also at a batch of 1 (of the [N, C] features too, which a batch norm in training refuses)."""
    from test_allocator import _as_replayed

    from perf4sight.features.alloc_trace import record_events

    desc = describe(_FrozenNorm(form).frozen(), SHAPE, name="frozen")
    model = record_events(desc, batch, steps=2, method="model")
    assert _as_replayed(model) == _as_replayed(record_events(desc, batch, steps=2, method="trace"))


@pytest.mark.parametrize("form", ["eval", "no affine"])
def test_a_batch_norm_by_its_running_statistics_costs_what_torch_runs(form):
    """A batch norm by its running statistics was costed as one in training (a statistics pass, 5 FLOPs an element
    forward and 8 back, a [C] mean and 1/std kept a batch). torch runs one kernel each way (a dispatch log) and keeps
    the input alone (the batch statistics it returns are empty): 2 FLOPs an element forward, one back for the input's
    gradient and 4 more for a weight's and a bias's; the kernel table moves one pass less forward and one back (two
    without a weight)."""
    from test_features import _autograd_saved_bytes
    from test_ir_research_calls import _dispatched

    from perf4sight.features.aggregate import network_features
    from perf4sight.features.latency_terms import kernel_table
    from perf4sight.features.walk import walk

    module = _FrozenNorm(form).frozen()
    desc = describe(module, SHAPE, name="frozen")
    leaf = torch.randn(2, 8, 8, 8)
    forward, backward = (
        [op for op in ops if op not in ("empty", "ones_like", "detach")]
        for ops in _dispatched(lambda y: module.bn(y), leaf))
    assert (forward, backward) == (["native_batch_norm"], ["native_batch_norm_backward"])
    (cost,) = [v.cost for v in walk(desc) if v.node.op == "batchnorm2d"]
    n = 8 * 8 * 8
    affine = form == "eval"
    assert (cost.kernels_fwd, cost.kernels_bwd, cost.flops_fwd, cost.flops_bwd) == (1, 1, 2 * n, (5 if affine else 1)
                                                                                      * n)
    nf = network_features(desc)
    at2, at4 = (b * _autograd_saved_bytes(desc, b, with_input=False) for b in (2, 4))
    assert nf.per_sample["saved_bytes"] == (at4 - at2) / 2
    assert sum(nf.batch_saved_sizes) == at2 - (at4 - at2) == 0
    trained = NetworkDescription.from_dict(desc.to_dict())
    for node in trained.nodes:
        node.attrs.pop("training", None)
    moved = [kernel_table(d).bytes_ps.sum() for d in (trained, desc)]
    assert moved[0] - moved[1] == (0.5 * 2 * n + (1 if affine else 2) * n) * 4


@pytest.mark.parametrize("form", ["eval", "no affine"])
def test_a_batch_norm_by_its_running_statistics_is_a_scale_and_shift_to_the_feature_tables(form):
    """A batch norm by its running statistics ran one kernel each way (a dispatch log: no statistics pass) but the
    PerfSight features counted its elements as a norm's (``norm_elems``), and so did the network features; it is a
    scale and a shift, as a frozen batch norm is: its output's elements are ``add_elems``. The GNN reads its node as a
    batch norm, by the costs torch runs (2 FLOPs an element forward)."""
    from test_ir_research_calls import _dispatched

    from perf4sight.features.aggregate import network_features
    from perf4sight.features.perf4sight_set import PERF4SIGHT_FEATURES, perf4sight_vectors
    from perf4sight.fingerprint.gnn_graph import NODE_FEATURES, graph_template

    module = _FrozenNorm(form).frozen()
    desc = describe(module, SHAPE, name="frozen")
    trained = NetworkDescription.from_dict(desc.to_dict())
    for node in trained.nodes:
        node.attrs.pop("training", None)
    log = []
    forward, _ = _dispatched(lambda y: log.append(module.bn(y)) or log[-1], torch.randn(1, 8, 8, 8))
    assert [op for op in forward if op not in ("empty", "detach")] == ["native_batch_norm"]
    n = log[0].numel()  # the one kernel's elements, a sample
    norm, add = PERF4SIGHT_FEATURES.index("norm_elems"), PERF4SIGHT_FEATURES.index("add_elems")
    (_, frozen), (_, training) = perf4sight_vectors(desc), perf4sight_vectors(trained)
    assert (training[norm], frozen[norm], frozen[add] - training[add]) == (n, 0, n)
    assert (network_features(trained).per_sample["norm_elems"], network_features(desc).per_sample["norm_elems"]) \
        == (n, 0)
    (i,) = [k for k, node in enumerate(desc.nodes) if node.op == "batchnorm2d"]
    row = graph_template(desc).x[i]
    assert row[NODE_FEATURES.index("op=batchnorm2d")] == 1
    assert row[NODE_FEATURES.index("flops_fwd")] == pytest.approx(float(torch.log1p(torch.tensor(2.0 * n))))


def test_a_network_with_a_frozen_batch_norm_prunes_and_trains():
    """Pruning a network whose batch norm is frozen (``bn.eval()`` in its constructor, the network in training) cuts
    the norm's channels with its convolution's: the pruned network describes with the norm still by its running
    statistics, and a training step runs."""
    from test_networks import _train_step

    from perf4sight.networks.build import Source, prune_source

    class Net(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.a, self.bn, self.b = nn.Conv2d(3, 16, 3, padding=1), nn.BatchNorm2d(16), nn.Conv2d(16, 16, 3)
            self.fc = nn.Linear(16, 10)
            self.bn.eval()

        def forward(self, x):
            return self.fc(self.b(self.bn(self.a(x)).relu()).mean((2, 3)))
    (desc,) = prune_source(Source("net", "test", Net), [3, 16, 16], [30], "l1-norm", 2, seed=0)
    (norm,) = [n for n in desc.nodes if n.op == "batchnorm2d"]
    assert norm.attrs["num_features"] < 16 and norm.attrs["training"] is False
    _train_step(desc)
