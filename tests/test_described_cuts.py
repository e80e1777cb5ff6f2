"""A pruned level's description made from the unpruned network's (networks/described_cuts.py): the same bytes as the
description of a cut copy, and None (a cut copy described instead) wherever the description alone does not say it."""
from __future__ import annotations

import warnings

import pytest
import torch
from torch import nn

from perf4sight.networks import described_cuts
from perf4sight.networks.build import Source, prune_source, pruning_plan
from perf4sight.networks.pruning import PruningPlan
from perf4sight.networks.zoo import build_zoo_model

SHAPE = [3, 32, 32]
warnings.filterwarnings("ignore", module="torch_pruning")


def _levels(src: Source, plan, levels: list[float], monkeypatch: pytest.MonkeyPatch, fast: bool) -> tuple[list, list]:
    """(the descriptions of ``levels``, what was left out), by ``prune_source`` from ``plan``, with the described cuts
    or without them (a cut copy described at every level)."""
    if not fast:
        monkeypatch.setattr(described_cuts, "described_cut", lambda *args: None)
    skipped: list[str] = []
    descs = prune_source(src, SHAPE, levels, "l1-norm", 4, 0, skipped=skipped, plan=plan)
    monkeypatch.undo()
    return [d.to_json() for d in descs], skipped


@pytest.mark.parametrize("zoo", ["mobilenet_v3_small", "squeezenet1_0"])
def test_a_levels_description_from_the_unpruned_ones_is_the_cut_copys(zoo: str, monkeypatch) -> None:
    """Depthwise convolutions, squeeze-and-excitation products (a [C, 1, 1] gate times a map), hard swishes, residual
    additions, a flatten, dropout and linear layers (mobilenet_v3_small), concatenations of channels and
    convolutions without batch norms (squeezenet1_0): every level asked is described from the unpruned description,
    byte for byte the description of the cut copy."""
    src = Source(zoo, f"torchvision:{zoo}", lambda: build_zoo_model(zoo, 10, SHAPE))
    plan = pruning_plan(src, SHAPE, "l1-norm", 4, 0)
    made = []
    real = described_cuts.described_cut

    def counted(*args):
        made.append(real(*args))
        return made[-1]

    monkeypatch.setattr(described_cuts, "described_cut", counted)
    levels = [3.0, 17.0, 41.0, 66.0, 83.0]
    fast = _levels(src, plan, levels, monkeypatch, True)
    assert len(made) == len(levels) and all(made)  # each level made from the unpruned description
    slow = _levels(src, plan, levels, monkeypatch, False)
    assert fast == slow and len(fast[0]) >= 4


class _Doubled(nn.Module):
    """A network of the user's own code, whose forward reads a channel count (its graph may change with the cut)."""

    def __init__(self) -> None:
        super().__init__()
        self.conv, self.bn, self.fc = nn.Conv2d(3, 16, 3), nn.BatchNorm2d(16), nn.Linear(16, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = torch.relu(self.bn(self.conv(x)))
        if self.conv.out_channels > 12:  # the cut's channels decide the graph: not the unpruned one's
            x = torch.relu(x)
        return self.fc(x.mean((2, 3)))


def _plain() -> nn.Module:
    return nn.Sequential(nn.Conv2d(3, 16, 3), nn.BatchNorm2d(16), nn.ReLU(), nn.Conv2d(16, 32, 3),
                         nn.BatchNorm2d(32), nn.ReLU(), nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(32, 10))


def _grouped() -> nn.Module:
    net = _plain()
    net[3] = nn.Conv2d(16, 32, 3, groups=4)
    return net


def _frozen() -> nn.Module:
    net = _plain()
    net[1].requires_grad_(False)
    return net


def _prelu() -> nn.Module:
    net = _plain()
    net[2] = nn.PReLU(16)
    return net


def _upsampled() -> nn.Module:
    """A segmentation network's shape: a convolution's map resized twice as large, a class score per pixel."""
    return nn.Sequential(nn.Conv2d(3, 16, 3, stride=2), nn.BatchNorm2d(16), nn.ReLU(),
                         nn.Upsample(scale_factor=2, mode="bilinear"), nn.Conv2d(16, 5, 1))


def _softmax() -> nn.Module:
    net = _plain()
    net[2] = nn.Softmax(1)
    return net


@pytest.mark.parametrize("make, fast", [(_plain, True), (_prelu, True), (_grouped, True), (_upsampled, True),
                                        (_Doubled, False), (_frozen, False), (_softmax, False)])
def test_a_cut_is_described_from_the_unpruned_description_only_where_it_alone_says_it(make, fast, monkeypatch):
    """torch's own layers in a Sequential (a PReLU's slopes a channel each, cut with them; a grouped convolution, its
    groups cut alike; a map resized, as a segmentation network's): described so. A model of the user's own code (its
    forward may read a channel count), a frozen layer, a softmax over the channels (an op this does not follow): None,
    and a cut copy is described instead; either way the description is the cut copy's."""
    src = Source("net", "own", make)
    plan = PruningPlan(make(), SHAPE, "l1-norm", 2, 0, "net")
    level = plan._level(plan._counts(len(plan._event_group) // 2))  # one its pruning steps reach
    counts = plan.counts_at(level)
    cut = described_cuts.described_cut(plan, counts, SHAPE)
    assert (cut is not None) == fast
    assert _levels(src, plan, [level], monkeypatch, True) == _levels(src, plan, [level], monkeypatch, False)
    if fast:
        assert cut.params == plan.p0 - plan._fast_count(list(counts)) < plan.p0


_NORMS = {"weight_norm parametrization": nn.utils.parametrizations.weight_norm,
          "weight_norm hook": nn.utils.weight_norm,
          "spectral_norm parametrization": nn.utils.parametrizations.spectral_norm,
          "spectral_norm hook": nn.utils.spectral_norm}


@pytest.mark.filterwarnings("ignore::FutureWarning")  # torch.nn.utils.weight_norm, the older of the two
@pytest.mark.parametrize("how", list(_NORMS.values()), ids=list(_NORMS))
def test_a_cut_of_weight_normed_and_spectral_normed_layers_is_described_from_the_unpruned_description(how):
    """torch's layers of weight_norm or spectral_norm (either form: a parametrized layer's class is torch's made
    anew) in a Sequential, a depthwise one among them: cut by prune_plan's cut of them, each level is described from
    the unpruned description (None before: their attrs and class were not among the layers'), the traced description
    of the pruned module."""
    from perf4sight.ir.from_torch import describe

    torch.manual_seed(0)
    net = nn.Sequential(how(nn.Conv2d(3, 16, 3, padding=1)), nn.ReLU(), how(nn.Conv2d(16, 32, 3, stride=2)), nn.ReLU(),
                        how(nn.Conv2d(32, 32, 3, padding=1, groups=32)), nn.ReLU(), how(nn.Conv2d(32, 32, 1)),
                        nn.AdaptiveAvgPool2d(1), nn.Flatten(), how(nn.Linear(32, 24)), nn.ReLU(),
                        how(nn.Linear(24, 10)))
    net(torch.randn(1, *SHAPE))
    plan = PruningPlan(net, SHAPE, "l1-norm", 2, 0, "net")
    for level in (30, 60):
        counts = plan.counts_at(level)
        cut = described_cuts.described_cut(plan, counts, SHAPE)
        traced = describe(plan.prune(level).module, SHAPE, name="net")
        assert cut is not None and cut.params == traced.params == plan.p0 - plan._fast_count(list(counts))
        assert [n.to_dict() for n in cut.nodes] == [n.to_dict() for n in traced.nodes]

def _activations_and_norms() -> nn.Module:
    """torch's other elementwise layers and norms, each where a pruned network has it: after a layer whose channels
    are cut."""
    return nn.Sequential(
        nn.Conv2d(3, 16, 3), nn.BatchNorm2d(16), nn.Tanh(), nn.Conv2d(16, 32, 3), nn.GroupNorm(4, 32), nn.GELU(),
        nn.Dropout2d(0.1), nn.Conv2d(32, 32, 3), nn.InstanceNorm2d(32, affine=True), nn.LeakyReLU(0.1),
        nn.Conv2d(32, 24, 1), nn.PReLU(24), nn.ELU(), nn.Hardtanh(), nn.Mish(), nn.Softplus(), nn.SELU(),
        nn.Conv2d(24, 24, 1), nn.PReLU(), nn.Softsign(), nn.CELU(), nn.Hardshrink(), nn.Softshrink(), nn.Tanhshrink(),
        nn.LogSigmoid(), nn.AlphaDropout(0.1), nn.FeatureAlphaDropout(0.1), nn.RReLU(), nn.Threshold(0.1, 0.0),
        nn.GELU("tanh"), nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(24, 40), nn.BatchNorm1d(40), nn.ReLU(),
        nn.Dropout(0.2), nn.Linear(40, 10))


def test_elementwise_layers_and_norms_are_cut_from_the_unpruned_description(monkeypatch):
    """Tanh, GELU (both approximations), LeakyReLU, ELU, SELU, CELU, Hardtanh, Mish, Softplus, the shrinks, Softsign
    (abs, add of a number, div), Tanhshrink, LogSigmoid, RReLU, Threshold, Dropout2d, AlphaDropout, a group norm, an
    affine instance norm, a PReLU of a slope a channel and one of a single slope, BatchNorm1d of a head: every level
    is described from the unpruned description (each fell back to a cut copy before), byte for byte the cut copy's,
    the norms' and PReLU's channel counts cut."""
    torch.manual_seed(0)
    src = Source("an", "own", _activations_and_norms)
    plan = PruningPlan(_activations_and_norms(), SHAPE, "l1-norm", 2, 0, "an")
    steps = len(plan._event_group)
    levels = [plan._level(plan._counts(k)) for k in (steps // 5, steps // 2, 4 * steps // 5)]
    cuts = [described_cuts.described_cut(plan, plan.counts_at(lvl), SHAPE) for lvl in levels]
    assert all(cuts)
    skipped: list[str] = []
    fast = [d.to_json() for d in prune_source(src, SHAPE, levels, "l1-norm", 2, 0, skipped=skipped, plan=plan)]
    monkeypatch.setattr(described_cuts, "described_cut", lambda *args: None)
    slow = prune_source(src, SHAPE, levels, "l1-norm", 2, 0, skipped=skipped, plan=plan)
    assert fast == [d.to_json() for d in slow] and len(fast) == 3 and not skipped
    last = slow[-1]
    assert last.node("_4").attrs["num_channels"] < 32 and last.node("_8").attrs["num_features"] < 32
    assert last.node("_11").attrs["num_parameters"] < 24 and last.node("_18").attrs["num_parameters"] == 1
    assert last.node("_33").attrs["num_features"] < 40


class _CatOfCat(nn.Module):
    """Two branches concatenated, a convolution of that concatenated to it again, a depthwise convolution of the
    whole, a head over the mean of the map."""

    def __init__(self) -> None:
        super().__init__()
        self.a, self.b, self.c = nn.Conv2d(3, 8, 3, padding=1), nn.Conv2d(3, 12, 1), nn.Conv2d(20, 6, 3, padding=1)
        self.bn, self.dw, self.fc = nn.BatchNorm2d(26), nn.Conv2d(26, 26, 3, padding=1, groups=26), nn.Linear(26, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        ab = torch.cat([self.a(x), self.b(x)], 1)
        y = torch.relu(self.dw(torch.relu(self.bn(torch.cat([ab, self.c(ab)], 1)))))
        return self.fc(y.mean((2, 3)))


def test_a_description_file_s_network_is_cut_from_its_unpruned_description(monkeypatch):
    """A description file's network (rebuilt by to_torch as a GraphModule of torch's layers) with a concatenation
    of a concatenation and a depthwise convolution after it, at an odd input shape: its levels are described from
    the unpruned description, byte for byte the cut copies' descriptions."""
    from perf4sight.ir.from_torch import describe
    from perf4sight.ir.to_torch import build_module

    shape = [3, 9, 7]
    desc = describe(_CatOfCat(), shape, "catcat")
    src = Source("catcat", "description:catcat.json", lambda: build_module(desc))
    plan = pruning_plan(src, shape, "l1-norm", 1, 0)
    steps = len(plan._event_group)
    levels = [plan._level(plan._counts(steps // 4)), plan._level(plan._counts(3 * steps // 4))]  # two it reaches
    assert all(described_cuts.described_cut(plan, plan.counts_at(lvl), shape) for lvl in levels)
    skipped: list[str] = []
    fast = [d.to_json() for d in prune_source(src, shape, levels, "l1-norm", 1, 0, skipped=skipped, plan=plan)]
    monkeypatch.setattr(described_cuts, "described_cut", lambda *args: None)
    slow = [d.to_json() for d in prune_source(src, shape, levels, "l1-norm", 1, 0, skipped=skipped, plan=plan)]
    assert fast == slow and len(fast) == 2 and not skipped


def test_a_description_file_s_frozen_layers_stay_frozen_in_its_rebuilt_module_and_pruned_levels(tmp_path):
    """A description of a network whose first convolution is frozen names it (``frozen_layers``); the module to_torch
    rebuilds of the file freezes it too, so its pruned level is the original module's (level and parameters: a
    frozen layer is not cut), ``frozen_params`` and ``frozen_layers`` kept, and the profile child's optimiser step
    leaves its weights as they were. A name that is no layer of parameters is refused in one line."""
    from types import SimpleNamespace

    from perf4sight.errors import UserError
    from perf4sight.ir.from_torch import describe
    from perf4sight.ir.schema import NetworkDescription, load_description
    from perf4sight.ir.to_torch import build_module
    from perf4sight.profiling.child import make_optimizer

    torch.manual_seed(0)
    net = _frozen()
    net[1].requires_grad_(True)
    net[0].requires_grad_(False)
    desc = describe(net, SHAPE, "fr")
    assert desc.extra == {"frozen_params": 448, "frozen_layers": ["_0"]}
    path = tmp_path / "fr.json"
    path.write_text(desc.to_json())
    loaded = load_description(path)
    rebuilt = build_module(loaded)
    assert sorted(n for n, p in rebuilt.named_parameters() if not p.requires_grad) == ["_0.bias", "_0.weight"]
    levels = [30]
    mine = prune_source(Source("fr", "description", lambda: build_module(loaded)), SHAPE, levels, "l1-norm", 2,
                        0)
    theirs = prune_source(Source("fr", "description", lambda: net), SHAPE, levels, "l1-norm", 2, 0)
    assert [(d.pruning_level, d.params) for d in mine] == [(d.pruning_level, d.params) for d in theirs]
    assert mine[0].pruning_level > 25 and mine[0].node("_0").attrs["out_channels"] == 16 \
        and mine[0].node("_3").attrs["out_channels"] < 32
    assert all(d.extra["frozen_params"] == 448 and d.extra["frozen_layers"] == ["_0"] for d in mine)
    before = {n: p.detach().clone() for n, p in rebuilt.named_parameters()}
    opt = make_optimizer(SimpleNamespace(optimizer="sgd", learning_rate=0.1, momentum=0.9, weight_decay=1e-4),
                         rebuilt.parameters())
    opt.zero_grad(set_to_none=True)
    rebuilt(torch.randn(2, *SHAPE)).sum().backward()
    opt.step()
    changed = {n for n, p in rebuilt.named_parameters() if not torch.equal(p, before[n])}
    assert "_0.weight" not in changed and "_3.weight" in changed
    bad = {**desc.to_dict(), "frozen_layers": ["_2"]}  # a ReLU's
    with pytest.raises(UserError, match=r"^x: frozen_layers names '_2', which is not a node with parameters$"):
        NetworkDescription.from_dict(bad, "x")


class _PartlyFrozen(nn.Module):
    """A conv whose weight is frozen and bias trained, and a frozen [C, 1, 1] gain its forward multiplies by (a
    function call's parameter, described as a ``scale``)."""

    def __init__(self) -> None:
        super().__init__()
        self.c0, self.c1, self.fc = nn.Conv2d(3, 16, 3), nn.Conv2d(16, 32, 3), nn.Linear(32, 10)
        self.g = nn.Parameter(torch.ones(32, 1, 1))
        self.c0.weight.requires_grad_(False)
        self.g.requires_grad_(False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = torch.relu(self.c1(torch.relu(self.c0(x)))) * self.g
        return self.fc(x.mean((2, 3)))


def _frozen_numel(model: nn.Module) -> int:
    return sum(p.numel() for p in model.parameters() if not p.requires_grad)


def test_a_cut_keeps_a_partly_frozen_layer_s_frozen_weight_frozen_and_counts_it_as_such():
    """torch-pruning makes a cut layer's weight anew: a conv's frozen weight (its bias trained) came out trained, so
    the level lost it from ``frozen_params`` (32, the gain alone, of 302) and the plan, which counted that weight as
    trained when cut, missed its level (34.8% for 30%). Now the cut weight stays frozen and the level is the plan's."""
    torch.manual_seed(0)
    plan = PruningPlan(_PartlyFrozen(), SHAPE, "l1-norm", 2, 0, "pf")
    pruned = plan.prune(30)
    assert pruned.module.c0.out_channels < 16 and not pruned.module.c0.weight.requires_grad
    assert pruned.module.c0.bias.requires_grad and not pruned.module.g.requires_grad
    assert _frozen_numel(pruned.module) == 3 * 9 * pruned.module.c0.out_channels + 32
    assert abs(pruned.achieved_level - 30) < 2


def test_a_description_names_its_partly_frozen_parameters_and_its_rebuilt_module_and_levels_keep_them(tmp_path):
    """A frozen conv weight whose bias trains, and a frozen gain a function call reads, are frozen parameters of no
    layer frozen whole: the description names them (``frozen_parameters``, ``node.parameter``), the module rebuilt of
    the file freezes exactly those (no gradient: no optimiser state), and its pruned level is the module's own, both
    named and counted frozen. A description without the key rebuilds as before (every such parameter trained); a
    name of no node, or of no parameter of its layer, is refused in one line."""
    from perf4sight.errors import UserError
    from perf4sight.ir.from_torch import describe
    from perf4sight.ir.schema import NetworkDescription, load_description
    from perf4sight.ir.to_torch import build_module

    torch.manual_seed(0)
    net = _PartlyFrozen()
    desc = describe(net, SHAPE, "pf")
    assert desc.extra == {"frozen_params": 464, "frozen_parameters": ["c0.weight", "mul.weight"]}
    path = tmp_path / "pf.json"
    path.write_text(desc.to_json())
    loaded = load_description(path)
    rebuilt = build_module(loaded)
    assert sorted(n for n, p in rebuilt.named_parameters() if not p.requires_grad) == ["c0.weight", "mul.weight"]
    rebuilt(torch.randn(2, *SHAPE)).sum().backward()
    grads = {n for n, p in rebuilt.named_parameters() if p.grad is not None}
    assert "c0.bias" in grads and "c0.weight" not in grads and "mul.weight" not in grads
    old = {k: v for k, v in desc.to_dict().items() if k != "frozen_parameters"}
    assert all(p.requires_grad for p in build_module(NetworkDescription.from_dict(old, "old")).parameters())
    mine = prune_source(Source("pf", "description", lambda: build_module(loaded)), SHAPE, [30], "l1-norm", 2, 0)
    theirs = prune_source(Source("pf", "description", _PartlyFrozen), SHAPE, [30], "l1-norm", 2, 0)
    assert [d.to_json() for d in mine] == [d.to_json() for d in theirs]
    level = mine[0]
    assert level.extra["frozen_parameters"] == ["c0.weight", "mul.weight"]
    assert level.extra["frozen_params"] == 3 * 9 * level.node("c0").attrs["out_channels"] + 32
    assert level.node("c0").attrs["out_channels"] < 16 and abs(level.pruning_level - 30) < 2
    with pytest.raises(UserError, match=r"^x: frozen_parameters names 'c9\.weight', which is no parameter of a "
                                        r"node with parameters \('node\.parameter': 'conv1\.weight'\)$"):
        NetworkDescription.from_dict({**desc.to_dict(), "frozen_parameters": ["c9.weight"]}, "x")
    bad = NetworkDescription.from_dict({**desc.to_dict(), "frozen_parameters": ["c1.gain"]}, "x")
    with pytest.raises(UserError, match=r"^pf: frozen_parameters names 'c1\.gain', which is no parameter of the "
                                        r"layer rebuilt of its node$"):
        build_module(bad)


class _FunctionCalls(nn.Module):
    """Parameters read by function calls (a convolution's, a layer norm's, a class token expanded over the batch)
    and torch's attention, rebuilt inside a layer of this tool's (to_torch.SelfAttention)."""

    def __init__(self) -> None:
        super().__init__()
        self.w, self.b = nn.Parameter(torch.randn(8, 3, 3, 3)), nn.Parameter(torch.zeros(8))
        self.lw, self.lb = nn.Parameter(torch.ones(8)), nn.Parameter(torch.zeros(8))
        self.tok = nn.Parameter(torch.zeros(1, 1, 8))
        self.att, self.fc = nn.MultiheadAttention(8, 2, batch_first=True), nn.Linear(8, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = torch.nn.functional.conv2d(x, self.w, self.b).flatten(2).transpose(1, 2)
        x = torch.nn.functional.layer_norm(x, (8,), self.lw, self.lb)
        x = torch.cat([self.tok.expand(x.shape[0], -1, -1), x], 1)
        return self.fc(self.att(x, x, x, need_weights=False)[0].mean(1))


def test_frozen_parameters_of_function_calls_and_of_torch_s_attention_are_named_as_rebuilt(monkeypatch):
    """A frozen bias of F.conv2d, weight of F.layer_norm, class token (read through its expansion), and attention's
    frozen input projection and output bias: named as the rebuilt layers hold them, the rebuilt module freezes exactly
    those (as many elements as frozen_params). A name the rebuilt layers do not hold is left out, not written."""
    from perf4sight.ir import from_torch
    from perf4sight.ir.to_torch import build_module

    net = _FunctionCalls()
    for name in ("b", "lw", "tok", "att.in_proj_weight", "att.out_proj.bias"):
        net.get_parameter(name).requires_grad_(False)
    desc = from_torch.describe(net, [3, 8, 8], "fc")
    names = ["conv2d.bias", "layer_norm.weight", "cat.weight", "att.attention.in_proj_weight",
             "att.attention.out_proj.bias"]
    assert desc.extra == {"frozen_params": 8 + 8 + 8 + 192 + 8, "frozen_parameters": names}
    rebuilt = build_module(desc)
    assert sorted(n for n, p in rebuilt.named_parameters() if not p.requires_grad) == sorted(names)
    assert sum(p.numel() for p in rebuilt.parameters() if not p.requires_grad) == desc.extra["frozen_params"]
    real = from_torch._frozen_parameters
    monkeypatch.setattr(from_torch, "_frozen_parameters", lambda *a: real(*a) + ["fc.gain"])
    assert from_torch.describe(net, [3, 8, 8], "fc").extra["frozen_parameters"] == names


@pytest.mark.parametrize("key", ["frozen_layers", "frozen_parameters"])
def test_a_frozen_key_of_null_is_refused_in_one_line_not_a_crash_of_the_rebuild(key):
    """A description file whose frozen_layers or frozen_parameters is null (JSON's null, written by hand or by a tool
    of the user's) was taken by the schema's check, which skipped a None, and crashed the module's rebuild
    (``TypeError: 'NoneType' object is not iterable``: the networks stage, the profile child). It is refused where
    the file is read, in one line naming the key."""
    from perf4sight.errors import UserError
    from perf4sight.ir.from_torch import describe
    from perf4sight.ir.schema import NetworkDescription

    said = {"frozen_layers": "a list of node names", "frozen_parameters": "a list of 'node.parameter' names"}[key]
    desc = describe(_plain(), SHAPE, "nul").to_dict()
    with pytest.raises(UserError, match=rf"^x\.json: {key} must be {said}, got None$"):
        NetworkDescription.from_dict({**desc, key: None}, "x.json")
