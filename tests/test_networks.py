"""Networks stage: pruning levels and strategies, the generator's styles, factories, the stage."""
from __future__ import annotations

import copy
import csv
import json
import os
import signal
import sys
import warnings
from dataclasses import replace
from pathlib import Path

import pytest
import torch
from torch import nn

from perf4sight.config import load_config
from perf4sight.errors import UserError
from perf4sight.ir.from_torch import describe
from perf4sight.ir.schema import NetworkDescription, load_description
from perf4sight.ir.to_torch import build_module
from perf4sight.networks.build import Source, make_networks, prune_source, variant_name
from perf4sight.networks.design_space import DEFAULT_STYLES, STYLES
from perf4sight.networks.factories import build_factory_model, parse_factory
from perf4sight.networks.generator import GeneratorSettings, forward_flops, generate
from perf4sight.networks.pruning import STRATEGIES, PruningPlan, prune_model
from perf4sight.networks.zoo import build_zoo_model, describe_zoo

ROOT = Path(__file__).resolve().parents[1]
TINY = ROOT / "models" / "imagenet" / "tiny_nets.py"
SHAPE = [3, 32, 32]
CLASSES = 10

warnings.filterwarnings("ignore", module="torch_pruning")


def _train_step(desc: NetworkDescription, batch: int = 2) -> None:
    """Rebuild from JSON and take one SGD step on ``batch`` images; parameters must move and match ``desc.params``."""
    desc = NetworkDescription.from_dict(desc.to_dict())
    model = build_module(desc)
    assert sum(p.numel() for p in model.parameters()) == desc.params
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    before = [p.detach().clone() for p in model.parameters()]
    out = model(torch.randn(batch, *desc.input_shape))
    assert tuple(out.shape) == (batch, desc.num_classes)
    nn.functional.cross_entropy(out, torch.randint(0, desc.num_classes, (batch,))).backward()
    opt.step()
    assert any(not torch.equal(a, b.detach()) for a, b in zip(before, model.parameters()))


def _tiny(function: str) -> Source:
    factory = parse_factory(f"{TINY}:{function}", ROOT)
    return Source(function, factory.source, lambda: build_factory_model(factory, CLASSES))


@pytest.mark.parametrize("strategy", STRATEGIES)
def test_each_strategy_reaches_levels_and_trains(strategy: str) -> None:
    descs = prune_source(_tiny("tiny_resnet"), SHAPE, [0, 30, 70], strategy, 4, seed=3)
    assert [d.name for d in descs] == ["tiny_resnet_l0", "tiny_resnet_l30", "tiny_resnet_l70"]
    p0 = descs[0].params
    for d in descs:
        target = d.extra["target_level"]
        assert abs(d.pruning_level - target) <= 2.0
        assert d.pruning_level == pytest.approx(100 * (1 - d.params / p0), abs=1e-2)
        assert d.num_classes == CLASSES and d.extra["strategy"] == strategy
        _train_step(d)
    assert descs[2].params < descs[1].params < descs[0].params
    assert len({d.structure for d in descs}) == 1  # pruning narrows layers: the structure key stays


@pytest.mark.parametrize("name", ["mobilenet_v2", "squeezenet1_0", "shufflenet_v2_x1_0"])
def test_zoo_network_with_coupled_channels(name: str) -> None:
    """Depthwise + residual (mobilenet), concatenation (squeezenet), channel shuffle (shufflenet)."""
    src = Source(name, f"torchvision:{name}", lambda: build_zoo_model(name, CLASSES))
    (desc,) = prune_source(src, SHAPE, [40], "random", 4, seed=0)
    assert abs(desc.pruning_level - 40) <= 2.0
    assert desc.num_classes == CLASSES
    # the same layers and wiring as the unpruned network (depthwise kept depthwise, the shuffle's slices too)
    assert desc.structure == describe(build_zoo_model(name, CLASSES), SHAPE, name="whole").structure
    assert desc.structure != describe(_tiny("tiny_vgg").build(), SHAPE, name="other").structure
    _train_step(desc)


def test_pruning_imports_neither_torchvision_nor_torchs_compiler_for_a_network_of_its_own() -> None:
    """A process pruning a network of its own does not import torchvision (about 3.5 s: its roi_align imports
    torch._dynamo) for the stand-in of ShuffleNet's block, nor torch._dynamo (2-3 s), which the trial cut's forward
    on the meta device imported through torch's Python meta kernels (it runs under meta shape propagation now, which
    answers an RMS norm too: 1.3 s of a process pruning one before); a ShuffleNetV2 of torchvision's is still traced
    with its blocks' stand-in, and their groups left unpruned."""
    import subprocess
    import sys

    import torchvision

    code = ("import sys; from torch import nn; from perf4sight.networks.pruning import prune_model\n"
            "net = nn.Sequential(nn.Conv2d(3, 16, 3), nn.RMSNorm([16, 14, 14]), nn.ReLU(), nn.Conv2d(16, 16, 3), "
            "nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(16, 10))\n"
            "print(round(prune_model(net, [3, 16, 16], 40).achieved_level), "
            "[m for m in ('torchvision', 'torch._dynamo') if m in sys.modules])")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert done.returncode == 0, done.stderr[-2000:]
    level, imported = done.stdout.split(" ", 1)
    assert abs(int(level) - 40) <= 2 and imported.strip() == "[]"
    plan = PruningPlan(torchvision.models.shufflenet_v2_x0_5(num_classes=CLASSES), SHAPE, "l1-norm", 4, 0, "s")
    assert plan.extra["pruning_unpruned_groups"]["channels through an untraceable InvertedResidual (e.g. channel "
                                                 "shuffle)"] > 0


@pytest.mark.parametrize("name", ["resnet18", "mobilenet_v2", "googlenet", "shufflenet_v2_x1_0", "convnext_tiny"])
def test_zoo_description_from_meta_weights_equals_the_real_model(name: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """describe_zoo builds on the meta device and propagates meta shapes; a real model's shapes are
    propagated on a weightless twin of it (its weights untouched), or, where an op has no meta
    kernel, with fake tensors: the same description all three ways."""
    from perf4sight.ir import torch_trace

    fast = describe_zoo(name, SHAPE, CLASSES)
    model = build_zoo_model(name, CLASSES)
    weights = [p.detach().clone() for p in model.parameters()]
    info = dict(name=name, network=name, source=f"torchvision:{name}")
    real = describe(model, SHAPE, **info)

    def no_meta_kernel(gm: object) -> None:
        raise NotImplementedError("no meta kernel")
    monkeypatch.setattr(torch_trace, "_meta_twin", no_meta_kernel)
    faked = describe(model, SHAPE, **info)
    assert fast.to_json() == real.to_json() == faked.to_json()
    assert len(fast.nodes) > 20 and fast.params == real.params > 0
    assert all(not p.is_meta and torch.equal(p, w) for p, w in zip(model.parameters(), weights))
    with pytest.raises(UserError, match="unknown network 'resnet19'"):
        describe_zoo("resnet19", SHAPE)


def test_the_zoo_is_torchvisions_cnns_and_a_regnet_describes_from_a_real_model() -> None:
    """Every zoo name is a torchvision classifier or segmentation network, and every one of those is a zoo name. A
    regnet's initialiser copies data, which the meta device cannot: it is described from a real model. A ViT and
    MaxViT are built for the input they are described at: square, a multiple of a patch size or of 224."""
    import torchvision.models as tvm

    from perf4sight.networks.zoo import SEGMENTATION_NAMES, ZOO_NAMES

    classifiers = set(tvm.list_models(module=tvm))
    assert set(ZOO_NAMES) - set(SEGMENTATION_NAMES) == classifiers and len(ZOO_NAMES) == 80 + 6
    assert set(SEGMENTATION_NAMES) == set(tvm.list_models(module=tvm.segmentation))
    fast = describe_zoo("regnet_y_400mf", SHAPE, CLASSES)
    model = build_zoo_model("regnet_y_400mf", CLASSES)
    real = describe(model, SHAPE, name="regnet_y_400mf", network="regnet_y_400mf",
                    source="torchvision:regnet_y_400mf")
    assert fast.to_json() == real.to_json() and fast.params == sum(p.numel() for p in model.parameters())
    with pytest.raises(UserError, match=r"'maxvit_t': MaxViT takes square images whose side is a multiple of 224 "
                                        r"\(its 7x7 partitions of maps a 32nd of the input's\); the input shape is "
                                        r"\[3, 32, 32\]"):
        describe_zoo("maxvit_t", SHAPE)
    assert describe_zoo("vit_b_32", [3, 64, 64]).node("add").output_shape == [5, 768]  # 2x2 patches + class token
    with pytest.raises(UserError, match=r"'vit_b_16': a ViT takes square images whose side is a multiple of its "
                                        r"patch size 16; the input shape is \[3, 64, 48\]"):
        describe_zoo("vit_b_16", [3, 64, 48])


def test_zoo_description_cache_is_reused_keyed_and_survives_damage(tmp_path: Path) -> None:
    """A cached zoo description is what a second call returns (read, not re-traced: an edit to the file
    shows); another shape gets its own file; a damaged file is described again and rewritten."""
    first = describe_zoo("squeezenet1_0", SHAPE, CLASSES, cache_dir=tmp_path)
    (cached,) = tmp_path.glob("squeezenet1_0-*.json")
    assert load_description(cached).to_json() == first.to_json()
    edited = json.loads(cached.read_text())
    edited["source"] = "edited in the cache"
    cached.write_text(json.dumps(edited))
    assert describe_zoo("squeezenet1_0", SHAPE, CLASSES, cache_dir=tmp_path).extra["source"] == "edited in the cache"
    other = describe_zoo("squeezenet1_0", [3, 48, 48], CLASSES, cache_dir=tmp_path)
    assert len(list(tmp_path.glob("squeezenet1_0-*.json"))) == 2 and other.to_json() != first.to_json()
    cached.write_text("{not json")
    assert describe_zoo("squeezenet1_0", SHAPE, CLASSES, cache_dir=tmp_path).to_json() == first.to_json()
    assert load_description(cached).to_json() == first.to_json()


def _tiny_resnext(num_classes: int = CLASSES) -> nn.Module:
    """torchvision's ResNeXt blocks (Bottleneck, groups=8, width 4 per group), one per stage."""
    from torchvision.models.resnet import Bottleneck, ResNet

    return ResNet(Bottleneck, [1, 1, 1, 1], groups=8, width_per_group=4, num_classes=num_classes)


@pytest.mark.parametrize("zoo", ["resnext50_32x4d", "mobilenet_v2", "densenet121"])
def test_the_fast_parameter_count_is_a_cut_copys(zoo: str) -> None:
    """The parameters a candidate cut removes, as the plan counts them without cutting (each layer dimension's
    indices cut after the first k units of its group's order), equal those of a meta copy cut the same way: grouped
    convolutions pruned per group, depthwise ones, a DenseNet's concatenations."""
    import numpy as np

    from perf4sight.networks import prune_plan as pp
    from perf4sight.networks.pruning import count_parameters

    plan = PruningPlan(build_zoo_model(zoo, num_classes=10), [3, 32, 32], strategy="random")
    assert plan._fast_count is not None
    rng = np.random.default_rng(1)
    for _ in range(3):
        counts = [int(rng.integers(0, g.max_removed + 1)) for g in plan.groups]
        cut = pp.cut(plan._meta, pp.removal(plan.groups, counts))
        assert 0 < plan._fast_count(counts) == plan.p0 - count_parameters(cut)
    for k in (0, 1, 3, 10 ** 6):  # each (layer, cut)'s indices: the targets of the roots the first k units hold
        want: dict = {}
        for g in plan.groups:
            gone = np.concatenate([g.units[u].roots for u in g.order[:k]]) if k else []
            for d in g.deps if len(gone) else ():
                want.setdefault((d.module, d.handler), set()).update(d.targets[np.isin(d.roots, gone)].tolist())
        got = pp.removal(plan.groups, [k] * len(plan.groups))
        assert list(got.items()) == list(want.items()) and (k == 0) == (not got)


def test_a_bnneck_prunes_with_the_linear_layer_before_it_and_counts_fast() -> None:
    """A BatchNorm1d of a head's [N, C] features (a BNNeck) loses the channels of the linear layer before it, as
    torch-pruning couples them; the fast parameter count, which knew no BatchNorm1d (none: every level then counted
    on a cut copy), is exact, and the pruned network describes with its batch norm as wide as the linear layer."""
    import numpy as np

    from perf4sight.networks import prune_plan as pp
    from perf4sight.networks.pruning import count_parameters

    base = nn.Sequential(nn.Conv2d(3, 16, 3, padding=1), nn.BatchNorm2d(16), nn.ReLU(), nn.Conv2d(16, 32, 3, 2, 1),
                         nn.ReLU(), nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(32, 64), nn.BatchNorm1d(64),
                         nn.ReLU(), nn.Linear(64, 10))
    plan = PruningPlan(base, [3, 16, 16], strategy="random")
    assert plan._fast_count is not None
    rng = np.random.default_rng(0)
    for _ in range(3):
        counts = [int(rng.integers(0, g.max_removed + 1)) for g in plan.groups]
        cut = pp.cut(plan._meta, pp.removal(plan.groups, counts))
        assert plan._fast_count(counts) == plan.p0 - count_parameters(cut)
    pruned = plan.prune(50)
    desc = describe(pruned.module, [3, 16, 16], name="bnneck_l50")
    linears = [n.attrs["out_features"] for n in desc.nodes if n.op == "linear"]
    necks = [n.attrs["num_features"] for n in desc.nodes if n.op == "batchnorm2d" and len(n.output_shape) == 1]
    assert necks == linears[:1] and linears[0] < 64 and desc.params == pruned.params


def test_a_pruning_plan_and_its_levels_leave_torchs_random_state_as_it_was() -> None:
    """A plan traced its network on an example drawn from torch's global generator: pruning on request (predict's
    variant of a level no one profiled, ``on_request.variant_at`` in Python) moved the caller's seeded stream. The
    example comes from a generator of its own now, the same every time."""
    base = nn.Sequential(nn.Conv2d(3, 16, 3, padding=1), nn.BatchNorm2d(16), nn.ReLU(), nn.Conv2d(16, 32, 3, 2, 1),
                         nn.ReLU(), nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(32, 10))
    state = torch.random.get_rng_state()
    pruned = PruningPlan(base, [3, 16, 16]).prune(40)
    assert torch.equal(state, torch.random.get_rng_state()) and 30 < pruned.achieved_level < 50


def test_convnext_prunes_its_stream_with_its_layer_scales_and_its_blocks_mlp() -> None:
    """ConvNeXt's residual stream is multiplied by each block's layer scale, a parameter outside any layer: it is cut
    with the layers of the stream (and torch-pruning's warning about it is not shown), as are the blocks' MLP
    widths. The fast parameter count is exact (a meta copy cut the same way agrees), and the pruned network
    describes, rebuilds and trains. torchvision's ConvNeXt at convnext_tiny's widths with 1, 1, 2 and 1 blocks a
    stage (convnext_tiny's 3, 3, 9 and 3: the same modules, seconds more to trace, cut and train)."""
    import numpy as np
    from torchvision.models.convnext import CNBlockConfig, ConvNeXt

    from perf4sight.networks import prune_plan as pp
    from perf4sight.networks.pruning import count_parameters

    stages = [CNBlockConfig(96, 192, 1), CNBlockConfig(192, 384, 1), CNBlockConfig(384, 768, 2),
              CNBlockConfig(768, None, 1)]
    base = ConvNeXt(stages, stochastic_depth_prob=0.1, num_classes=10)
    with warnings.catch_warnings():
        warnings.filterwarnings("error", message="Unwrapped parameters")
        plan = PruningPlan(base, SHAPE)
    assert plan._fast_count is not None
    rng = np.random.default_rng(0)
    for _ in range(3):
        counts = [int(rng.integers(0, g.max_removed + 1)) for g in plan.groups]
        assert plan._fast_count(counts) == plan.p0 - count_parameters(pp.cut(plan._meta, pp.removal(plan.groups,
                                                                                                       counts)))
    pruned = plan.prune(50)
    assert abs(pruned.achieved_level - 50) <= 1.0 and "pruning_unpruned_groups" not in pruned.extra
    desc = describe(pruned.module, SHAPE, name="convnext_tiny_l50")
    full = describe(base, SHAPE, name="convnext_tiny")
    widths = [[n.attrs["out_channels"] for n in d.nodes if n.op == "conv2d" and n.attrs["groups"] > 1]
              for d in (desc, full)]  # the depthwise convolutions: the stream's width
    assert all(w < f for w, f in zip(*widths))
    assert [n.attrs["shape"][0] for n in desc.nodes if n.op == "scale"] == widths[0]
    assert desc.params == pruned.params and desc.structure == full.structure
    _train_step(desc)


def test_a_swin_transformer_is_refused_for_pruning_at_once() -> None:
    """torch-pruning's dependency graph of a Swin grew past 24 GiB: the plan says so before tracing (and for MaxViT,
    whose attention reshapes its heads by widths of its own), and a level 0 alone needs no plan (the networks stage
    makes it)."""
    import torchvision
    model = torchvision.models.swin_t(num_classes=10)
    with pytest.raises(UserError, match="swin_t: a Swin or MaxViT transformer cannot be pruned"):
        PruningPlan(model, [3, 64, 64], network="swin_t")
    with torch.device("meta"):  # the refusal reads the modules alone: no weights drawn (2.5 s for swin_v2_t)
        swin_v2, maxvit = torchvision.models.swin_v2_t(num_classes=10), torchvision.models.maxvit_t(num_classes=10)
        zoo_params = sum(p.numel() for p in build_zoo_model("swin_t", CLASSES).parameters())
    with pytest.raises(UserError, match="swin_v2_t: a Swin or MaxViT transformer cannot be pruned"):
        PruningPlan(swin_v2, [3, 64, 64], network="swin_v2_t")
    with pytest.raises(UserError, match="maxvit_t: a Swin or MaxViT transformer cannot be pruned"):
        PruningPlan(maxvit, [3, 224, 224], network="maxvit_t")
    assert prune_model(model, [3, 64, 64], 0, network="swin_t").achieved_level == 0
    built = build_zoo_model("swin_t", CLASSES)  # once (a build draws 28 M weights): a copy for each call
    src = Source("swin_t", "torchvision:swin_t", lambda: copy.deepcopy(built))
    (desc,) = prune_source(src, [3, 64, 64], [0], "l1-norm", 4, 0)
    assert desc.name == "swin_t_l0" and desc.params == zoo_params
    with pytest.raises(UserError, match="cannot be pruned"):
        prune_source(src, [3, 64, 64], [0, 30], "l1-norm", 4, 0)
    # the networks stage (which keeps a list of what it leaves out) makes its level 0 and says why the rest is not
    skipped: list[str] = []
    (alone,) = prune_source(src, [3, 64, 64], [0, 30, 60], "l1-norm", 4, 0, skipped=skipped)
    assert alone.to_json() == desc.to_json()
    assert skipped == ["swin_t_l30, swin_t_l60 left out: swin_t: a Swin or MaxViT transformer cannot be pruned "
                       "(torch-pruning cannot follow its windowed attention, which reads its layers' weights directly "
                       "or reshapes its heads by widths of its own); predict or compare it as it is, by its zoo name"]
    with pytest.raises(UserError, match="cannot be pruned"):  # no level 0 asked for: nothing to make
        prune_source(src, [3, 64, 64], [30], "l1-norm", 4, 0, skipped=[])


def test_a_vit_prunes_its_mlps_and_keeps_its_token_width() -> None:
    """A ViT's token width runs through every attention layer (whose heads would have to shrink alike) and the
    model reshapes by a width attribute of its own: that group stays whole, said in the description; the MLPs'
    hidden widths are pruned, and the pruned network describes, rebuilds and trains. torchvision's ViT class at two
    layers of width 64 (its MLPs the wider part): the zoo's vit_b_32 (12 layers, 88 M parameters) has the same
    modules and took seconds more to trace, prune and train."""
    from torchvision.models.vision_transformer import VisionTransformer

    shape = [3, 64, 64]
    base = VisionTransformer(image_size=64, patch_size=32, num_layers=2, num_heads=4, hidden_dim=64, mlp_dim=1024,
                             num_classes=CLASSES)
    pruned = PruningPlan(base, shape).prune(40)
    assert abs(pruned.achieved_level - 40) <= 1.0
    assert pruned.extra["pruning_unpruned_groups"] == {"an attention's embedding width": 1}
    desc = describe(pruned.module, shape, name="vit_l40")
    assert {n.attrs["embed_dim"] for n in desc.nodes if n.op == "attention"} == {64}
    assert all(n.attrs["out_features"] < 1024 for n in desc.nodes if n.op == "linear" and n.name.endswith("mlp_0"))
    _train_step(desc)


class _Halves(nn.Module):
    """A CSP-style block: one convolution's channels taken apart in halves (by slicing, ``torch.split`` or
    ``chunk``), one half through another convolution, the halves put back together."""

    def __init__(self, how: str) -> None:
        super().__init__()
        self.how = how
        self.c0, self.c1 = nn.Conv2d(3, 8, 3, padding=1), nn.Conv2d(8, 32, 3, padding=1)
        self.c2, self.c3, self.fc = nn.Conv2d(16, 16, 3, padding=1), nn.Conv2d(32, 32, 1), nn.Linear(32, CLASSES)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = torch.relu(self.c1(torch.relu(self.c0(x))))
        a, b = {"slice": lambda: (y[:, :16], y[:, 16:]), "split": lambda: torch.split(y, 16, 1),
                "chunk": lambda: y.chunk(2, 1)}[self.how]()
        return self.fc(torch.relu(self.c3(torch.cat([a, torch.relu(self.c2(b))], 1))).mean((2, 3)))


@pytest.mark.parametrize("how", ["slice", "split", "chunk"])
def test_channels_taken_apart_at_the_models_own_bounds_stay_whole(how: str) -> None:
    """The model's code takes ``c1``'s channels apart at 16, wherever a cut left them: cutting that group made the
    pruned network's forward fail (and the networks stage blamed the model). That group stays whole, said in the
    description; the others (``c0``'s, ``c3``'s, and ``c2``'s output, concatenated after the halves: torch-pruning
    coupled it with ``c1``'s until the concatenation's sizes were read from the forward) are pruned, and the pruned
    network describes, rebuilds and trains."""
    (desc,) = prune_source(Source(how, "test", lambda: _Halves(how)), [3, 16, 16], [25], "l1-norm", 4, seed=0)
    assert abs(desc.pruning_level - 25) <= 2.0
    assert desc.extra["pruning_unpruned_groups"] == {
        "channels a slice, split or unbind takes apart (at bounds of the model's own)": 1}
    widths = {n.name: n.attrs["out_channels"] for n in desc.nodes if n.op == "conv2d"}
    assert widths["c1"] == 32 and widths["c2"] < 16 and widths["c0"] < 8 and widths["c3"] < 32
    _train_step(desc)


class _WholeSlice(nn.Module):
    """``c0``'s 16 channels sliced ``[:, :16]``: the whole dimension, as GhostNet's ``[:, :oup]`` of ``oup``."""

    def __init__(self) -> None:
        super().__init__()
        self.c0, self.c1 = nn.Conv2d(3, 16, 3, padding=1), nn.Conv2d(16, 16, 3, padding=1)
        self.fc = nn.Linear(16, CLASSES)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(self.c1(torch.relu(self.c0(x))[:, :16]).mean((2, 3)))


def test_a_slice_of_the_whole_dimension_leaves_its_group_prunable() -> None:
    """A slice to the end of a dimension or past it keeps the whole of it when a cut narrows it: its group is cut."""
    (desc,) = prune_source(Source("whole", "test", _WholeSlice), [3, 16, 16], [30], "l1-norm", 4, seed=0)
    assert "pruning_unpruned_groups" not in desc.extra
    assert {n.name: n.attrs["out_channels"] for n in desc.nodes if n.op == "conv2d"}["c0"] < 16
    _train_step(desc)


@pytest.mark.parametrize("strategy", ["l1-norm", "random-weighted"])
def test_grouped_convolutions_are_pruned_uniformly_per_group(strategy: str) -> None:
    src = Source("tiny_resnext", "test", _tiny_resnext)
    d0, d1 = prune_source(src, SHAPE, [0, 60], strategy, 4, seed=2)
    assert abs(d1.pruning_level - 60) <= 2.0
    assert d1.extra["grouped_conv_pruning"] == "uniform per group" and "pruning_unpruned_groups" not in d1.extra
    before = {n.name: n.attrs for n in d0.nodes if n.op == "conv2d" and n.attrs["groups"] > 1}
    after = {n.name: n.attrs for n in d1.nodes if n.op == "conv2d" and n.attrs["groups"] > 1}
    assert before.keys() == after.keys() and len(after) == 4
    for name, a in after.items():
        assert a["groups"] == before[name]["groups"] == 8  # cardinality kept
        assert a["in_channels"] % 8 == 0 and a["out_channels"] % 8 == 0
    assert sum(a["in_channels"] + a["out_channels"] for a in after.values()) < sum(
        b["in_channels"] + b["out_channels"] for b in before.values())
    assert d0.structure == d1.structure  # still grouped convolutions, whatever their widths
    _train_step(d1)


def test_plan_is_reused_across_levels_and_nests_removed_channels() -> None:
    base = build_factory_model(parse_factory(f"{TINY}:tiny_resnet", ROOT), CLASSES)
    plan = PruningPlan(base, SHAPE, "l1-norm", 4, seed=0, network="tiny_resnet")
    low, high = plan.prune(20), plan.prune(60)
    alone = prune_model(base, SHAPE, 60, "l1-norm", 4, seed=0, network="tiny_resnet")
    assert high.params == alone.params and high.achieved_level == alone.achieved_level
    assert high.params < low.params < plan.p0 == sum(p.numel() for p in base.parameters())
    convs = lambda m: [c.out_channels for c in m.modules() if isinstance(c, nn.Conv2d)]  # noqa: E731
    assert all(h <= lo for h, lo in zip(convs(high.module), convs(low.module)))
    meta = plan.prune(60, meta=True)  # shapes-only copy: same network, no weights
    assert meta.params == high.params and next(meta.module.parameters()).is_meta
    with torch.device("meta"):
        from_meta = describe(meta.module, SHAPE, name="x")
    assert from_meta.to_json() == describe(high.module, SHAPE, name="x").to_json()


def _plan_state(plan: PruningPlan) -> list:
    """What a plan decides: its groups (layers, cuts, channels, units, limits, orders), events and counts."""
    return [plan.p0, plan.unused, plan.extra, plan._event_group.tolist()] + [
        (g.root, g.channels, g.max_removed, g.order, g.weight, [u.roots.tolist() for u in g.units],
         [(d.module, d.handler.__qualname__, d.roots.tolist(), d.targets.tolist()) for d in g.deps])
        for g in plan.groups]


def test_a_zoo_networks_plan_traced_on_a_weightless_twin_is_the_one_traced_for_real(monkeypatch) -> None:
    """A network of torch's and torchvision's layers is traced for its pruning plan on a copy without weights on the
    meta device (the same layers called in the same order, the same groups found, shapes being all either reads);
    the plan is the one of the real forwards. A twin whose forward fails (here: weights off the meta device) leaves
    the real forwards to run; a network of the user's own code, or with lazy layers, has no twin."""
    from perf4sight.networks import pruning

    model = build_zoo_model("mobilenet_v3_small", num_classes=10)
    assert pruning._twin(model) is not None
    twinned = _plan_state(PruningPlan(model, SHAPE, "l1-norm", 4, 0, "m"))
    monkeypatch.setattr(pruning, "_twin", lambda m: None)
    real = _plan_state(PruningPlan(model, SHAPE, "l1-norm", 4, 0, "m"))
    assert twinned == real and len(real) > 20
    monkeypatch.undo()
    monkeypatch.setattr(pruning, "_meta_twin", copy.deepcopy)  # real weights: the meta example fails on them
    assert _plan_state(PruningPlan(model, SHAPE, "l1-norm", 4, 0, "m")) == real
    own = build_factory_model(parse_factory(f"{TINY}:tiny_resnet", ROOT), CLASSES)
    lazy = nn.Sequential(nn.LazyConv2d(8, 3), nn.Flatten(), nn.LazyLinear(10))
    assert pruning._twin(own) is None and pruning._twin(lazy) is None


def test_min_channels_is_kept_and_unreachable_level_is_an_error() -> None:
    base = build_factory_model(parse_factory(f"{TINY}:tiny_vgg", ROOT), CLASSES)
    pruned = prune_model(base, SHAPE, 80, "l1-norm", min_channels=12, network="tiny_vgg")
    convs = [m for m in pruned.module.modules() if isinstance(m, nn.Conv2d)]
    assert min(c.out_channels for c in convs) >= 12
    assert sum(p.numel() for p in base.parameters()) == pruned.params_unpruned  # base left untouched
    with pytest.raises(UserError, match=r"cannot reach pruning level 95% with strategy l1-norm and min_channels=64 "
                                        r"\(it reaches [\d.]+% at most\); lower the level or min_channels"):
        prune_model(base, SHAPE, 95, "l1-norm", min_channels=64, network="tiny_vgg")
    # between two steps of a narrow network (one channel of eight is 8-10% of its parameters): not "at most"
    small = nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.ReLU(), nn.Conv2d(8, 8, 3, padding=1), nn.ReLU(),
                          nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(8, 10))
    with pytest.raises(UserError, match=r"^small: cannot reach pruning level 15% .*\(its pruning steps go from 11.1% "
                                        r"to 19.4% there\); ask for a level near one of those$"):
        prune_model(small, [3, 8, 8], 15, "l1-norm", min_channels=4, network="small")
    assert prune_model(small, [3, 8, 8], 45, "l1-norm", min_channels=4, network="small").achieved_level == \
        pytest.approx(45.9, abs=0.05)


def test_pruning_is_deterministic_under_a_seed() -> None:
    def run(seed: int) -> list[str]:
        return [d.to_json() for d in prune_source(_tiny("tiny_vgg"), SHAPE, [50], "random-weighted", 4, seed)]

    assert run(7) == run(7)
    assert run(7) != run(8)


def test_random_weighted_favours_one_end() -> None:
    (d0, d1) = prune_source(_tiny("tiny_vgg"), SHAPE, [0, 50], "random-weighted", 1, seed=1)
    before = [n.attrs["out_channels"] for n in d0.nodes if n.op == "conv2d"]
    after = [n.attrs["out_channels"] for n in d1.nodes if n.op == "conv2d"]
    removed = [1 - a / b for a, b in zip(after, before)]
    early, late = sum(removed[:3]) / 3, sum(removed[3:]) / 3
    assert d1.extra["pruning_bias"] in ("early", "late")
    assert (early > late) if d1.extra["pruning_bias"] == "early" else (late > early)


@pytest.mark.parametrize("bad", [-1, 99.5, 120])
def test_level_outside_range_is_an_error(bad: float) -> None:
    base = build_factory_model(parse_factory(f"{TINY}:tiny_vgg", ROOT), CLASSES)
    with pytest.raises(UserError, match="outside 0..99"):
        prune_model(base, SHAPE, bad, network="tiny_vgg")


def test_unknown_names_are_errors() -> None:
    with pytest.raises(UserError, match="unknown network 'resnet19'"):
        build_zoo_model("resnet19")
    base = build_factory_model(parse_factory(f"{TINY}:tiny_vgg", ROOT), CLASSES)
    with pytest.raises(UserError, match="unknown pruning strategy 'magnitude'"):
        prune_model(base, SHAPE, 30, "magnitude")


@pytest.mark.parametrize("style", STYLES)
def test_each_style_rebuilds_and_trains(style: str) -> None:
    (desc,) = generate(GeneratorSettings(count=1, seed=5, styles=(style,), max_params=1_000_000), SHAPE, CLASSES)
    assert desc.extra["styles"] == [style] * 4 and desc.name == "gen_5_0"
    _train_step(desc)
    _train_step(desc, batch=1)  # at the smallest input (32x32) too: batch norm needs more than one value
    traced = describe(build_module(desc), SHAPE, name="traced")  # shapes computed by hand == torch's
    assert [n.output_shape for n in traced.nodes] == [n.output_shape for n in desc.nodes]
    assert traced.params == desc.params


def test_generator_is_deterministic_distinct_and_constrained() -> None:
    settings = GeneratorSettings(count=40, seed=2, min_mflops=20, max_mflops=400, max_params=5_000_000)
    a = generate(settings, [3, 64, 64], CLASSES)
    b = generate(settings, [3, 64, 64], CLASSES)
    assert [d.to_json() for d in a] == [d.to_json() for d in b]
    assert len({str(d.extra["stages"]) for d in a}) == 40
    assert all(20 <= forward_flops(d) / 1e6 <= 400 and d.params <= 5_000_000 for d in a)
    assert len({d.network for d in a}) > 10  # stage styles vary
    other = generate(GeneratorSettings(count=5, seed=3), [3, 64, 64], CLASSES)
    assert [d.to_json() for d in other] != [d.to_json() for d in a[:5]]


def test_cover_styles_gives_each_style_the_largest_maps_of_a_network_in_turn() -> None:
    """With six networks drawn at random, a seed could leave out depthwise (mobilenet) stages on large maps, and a
    fingerprint then learnt their cost from a sliver of work; with ``cover_styles`` each style leads in turn."""
    settings = GeneratorSettings(count=7, seed=1, min_mflops=20, max_mflops=600, max_params=12_000_000)
    plain = generate(settings, [3, 64, 64], CLASSES)
    covered = generate(replace(settings, cover_styles=True), [3, 64, 64], CLASSES)
    leads = (DEFAULT_STYLES * 2)[:7]
    assert [d.extra["styles"][:2] for d in covered] == [[s, s] for s in leads]
    assert all(20 <= forward_flops(d) / 1e6 <= 600 for d in covered)
    assert [d.extra["styles"][:2] for d in plain] != [[s, s] for s in leads]  # off: drawn as before
    with pytest.raises(UserError, match=r"only 0 of 2 networks .*; with cover_styles, none led by vgg did\); widen"):
        generate(replace(settings, count=2, min_mflops=0, max_mflops=0.5, cover_styles=True), [3, 64, 64], CLASSES)


@pytest.mark.parametrize("style, ops", [("convnext", {"permute", "layernorm", "scale", "gelu"}),
                                       ("transformer", {"reshape", "permute", "shift", "layernorm", "attention"}),
                                       ("dilated", {"conv2d", "relu6"})])
def test_a_newer_style_is_drawn_only_where_a_config_names_it(style: str, ops: set[str]) -> None:
    """A style added to the design space would change every seed's networks: ``convnext``, ``transformer`` and
    ``dilated`` are drawn only when named, and then lead in their turn; their stages hold their ops (a dilated
    stage's depthwise convolutions dilate) and rebuild to the shapes torch computes."""
    assert STYLES == DEFAULT_STYLES + ("convnext", "transformer", "dilated")
    drawn = generate(GeneratorSettings(count=12, seed=0), SHAPE, CLASSES)
    assert all(style not in d.extra["styles"] for d in drawn)
    turn = STYLES.index(style)
    (led,) = generate(GeneratorSettings(count=turn + 1, seed=0, styles=STYLES, cover_styles=True), SHAPE,
                      CLASSES)[turn:]
    assert led.extra["styles"][:2] == [style, style]
    assert ops <= {n.op for n in led.nodes}
    dilated = [n for n in led.nodes if n.op == "conv2d" and n.attrs["dilation"] != [1, 1]]
    assert all(n.attrs["groups"] == n.attrs["in_channels"] and n.attrs["dilation"] == [2, 2] for n in dilated)
    assert dilated or style != "dilated"
    traced = describe(build_module(led), SHAPE, name="traced")
    assert [n.output_shape for n in traced.nodes] == [n.output_shape for n in led.nodes]


def test_forward_flops_is_the_features_forward_flops() -> None:
    """The generator's FLOPs, summed over the walk alone, are the features' ``flops_fwd``: on a network led by each
    style, and where the loss is scored per position (a segmentation network's output: its log-softmax counts)."""
    from tiny_graphs import conv_node, tiny_description

    from perf4sight.features.aggregate import network_features
    from perf4sight.ir.schema import Node
    nets = generate(GeneratorSettings(count=len(STYLES), seed=0, styles=STYLES, cover_styles=True), SHAPE, CLASSES)
    per_position = tiny_description([Node("x", "input", [], {}, [4, 8, 8]), conv_node("c", "x", 4, 5, 3, 1, 8)])
    for d in nets + [per_position]:
        assert forward_flops(d) == network_features(d).per_sample["flops_fwd"] > 0, d.name
    assert forward_flops(per_position) == 2 * 4 * 5 * 9 * 64 + 4 * 5 * 64  # the conv's multiply-adds, the loss's


def test_generator_reaches_the_perfseer_range() -> None:
    nets = generate(GeneratorSettings(count=300, seed=0), [3, 224, 224])
    gflops = sorted(forward_flops(d) / 1e9 for d in nets)
    assert gflops[0] < 0.25 and gflops[-1] > 20


def test_generator_errors_name_the_constraint() -> None:
    # (no network under max_mflops: 2,000 candidates drawn and built before the error, so it is tried once, below)
    with pytest.raises(UserError, match="min_params .* exceeds max_params"):
        generate(GeneratorSettings(count=3, min_params=10, max_params=5), SHAPE)
    with pytest.raises(UserError, match="unknown \\['capsule'\\]"):
        generate(GeneratorSettings(count=3, styles=("vgg", "capsule")), SHAPE)
    with pytest.raises(UserError, match="too small"):
        generate(GeneratorSettings(count=1), [3, 16, 16])
    with pytest.raises(UserError, match="styles is empty"):
        generate(GeneratorSettings(count=1, styles=()), SHAPE)
    with pytest.raises(UserError, match="max_mflops must be >= 0, got nan"):  # NaN accepted every network
        generate(GeneratorSettings(count=1, max_mflops=float("nan")), SHAPE)
    # given the config file the settings came from, every error names it
    with pytest.raises(UserError, match=r"^my.toml: \[networks.generator\] only 0 of 3 .*most rejected by max_mflops"):
        generate(GeneratorSettings(count=3, max_mflops=0.5), SHAPE, config="my.toml")
    with pytest.raises(UserError, match=r"^my.toml: \[networks.generator\] min_params .* exceeds max_params"):
        generate(GeneratorSettings(count=3, min_params=10, max_params=5), SHAPE, config="my.toml")
    with pytest.raises(UserError, match=r"^my.toml: \[networks\] input_shape \[3, 16, 16\] is too small"):
        generate(GeneratorSettings(count=1), [3, 16, 16], config="my.toml")


def test_factory_errors(tmp_path: Path) -> None:
    broken = tmp_path / "broken.py"
    broken.write_text("import torch\ndef net(:\n")
    with pytest.raises(UserError, match="broken.py fails to import"):
        build_factory_model(parse_factory(f"{broken}:net", tmp_path))
    with pytest.raises(UserError, match="has no function 'tiny_vggg' \\(functions: .*tiny_vgg"):
        build_factory_model(parse_factory(f"{TINY}:tiny_vggg", ROOT))
    quits = tmp_path / "quits.py"
    quits.write_text("import sys\ndef net():\n    sys.exit('no GPU here')\n")
    with pytest.raises(UserError, match=r"factory '.*quits.py:net': calling net\(\) failed "
                                        r"\(SystemExit: no GPU here\)"):
        build_factory_model(parse_factory(f"{quits}:net", tmp_path))
    notmodel = tmp_path / "notmodel.py"
    notmodel.write_text("def net(num_classes=1000):\n    return 3\n")
    with pytest.raises(UserError, match="returned int"):
        build_factory_model(parse_factory(f"{notmodel}:net", tmp_path))
    a_class = tmp_path / "a_class.py"
    a_class.write_text("from torch import nn\ndef net():\n    return nn.ReLU\n")  # the class, not a module of it
    with pytest.raises(UserError, match=r"net\(\) returned the class ReLU, not a torch.nn.Module made of it: "
                                        r"return ReLU\(...\)$"):
        build_factory_model(parse_factory(f"{a_class}:net", tmp_path))
    with pytest.raises(UserError, match="file not found"):
        parse_factory("nothere:net", tmp_path, tmp_path / "models")


def test_a_factory_that_parses_its_command_line_sees_a_scripts_argv(tmp_path: Path, monkeypatch) -> None:
    """Research code parses its command line as it is imported (``args = parser.parse_args()`` at module level) or
    as it builds: it read perf4sight's own arguments and failed on them ("fails to import (SystemExit: 2)", after
    argparse's usage line naming main.py, read as perf4sight's). It now sees ``[file]``, as when run as a script with
    no arguments, so its defaults build the network; perf4sight's own argv is put back after."""
    (tmp_path / "research.py").write_text(
        "import argparse, sys\nfrom torch import nn\nparser = argparse.ArgumentParser()\n"
        "parser.add_argument('--width', type=int, default=6)\nargs = parser.parse_args()\n"
        "def net(num_classes=10):\n"
        "    seen = argparse.ArgumentParser()\n    seen.add_argument('--depth', type=int, default=1)\n"
        "    assert seen.parse_args().depth == 1 and sys.argv[1:] == []\n"
        "    return nn.Sequential(nn.Conv2d(3, args.width, 3), nn.Flatten())\n")
    argv = ["main.py", "--config", "config.toml", "--stage", "predict", "--network", "research.py:net"]
    monkeypatch.setattr(sys, "argv", argv)
    model = build_factory_model(parse_factory(f"{tmp_path / 'research.py'}:net", tmp_path))
    assert model[0].out_channels == 6
    assert sys.argv is argv and sys.argv[1] == "--config"


def test_a_factory_file_inside_a_package_says_how_to_give_it(tmp_path: Path) -> None:
    """Research code's model files sit in a package (``mypkg/net.py`` doing ``from .layers import block`` or ``from
    mypkg.layers import block``): imported as a script, they failed with Python's "attempted relative import with no
    known parent package" or "No module named 'mypkg'" alone. The line now says the file is a package's module and
    what works: a file outside the package importing it (checked: that one builds). A library not installed is said
    as before."""
    pkg = tmp_path / "research_pkg"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "layers.py").write_text("from torch import nn\ndef block(i, o):\n    return nn.Conv2d(i, o, 3)\n")
    (pkg / "net.py").write_text("from .layers import block\ndef net():\n    return block(3, 4)\n")
    (pkg / "net_abs.py").write_text("from research_pkg.layers import block\ndef net():\n    return block(3, 4)\n")
    (pkg / "net_lib.py").write_text("import a_library_not_installed_here\ndef net():\n    pass\n")
    for name, why in (("net", "ImportError: attempted relative import with no known parent package"),
                      ("net_abs", "ModuleNotFoundError: No module named 'research_pkg'")):
        with pytest.raises(UserError) as raised:
            build_factory_model(parse_factory(f"{pkg / name}.py:net", tmp_path))
        assert str(raised.value).endswith(
            f"fails to import ({why}); it is a module of the package research_pkg (its folder has __init__.py), and a "
            f"factory's file is imported as a script is run, outside its package: give a file in {tmp_path} that "
            f"imports it, such as one holding `from research_pkg.{name} import net`, as FILE.py:net")
    with pytest.raises(UserError) as raised:
        build_factory_model(parse_factory(f"{pkg / 'net_lib.py'}:net", tmp_path))
    assert str(raised.value).endswith("(ModuleNotFoundError: No module named 'a_library_not_installed_here')")
    (tmp_path / "wrap.py").write_text("from research_pkg.net import net\n")  # the way the line gives
    assert build_factory_model(parse_factory(f"{tmp_path / 'wrap.py'}:net", tmp_path)).out_channels == 4


def test_a_factorys_error_of_several_lines_is_said_in_one(tmp_path: Path, monkeypatch, capsys) -> None:
    """A factory that raised (or whose file raised on import) an exception of several lines printed an error of as
    many lines: its first line is said, and the command line joins any error's lines into one."""
    (tmp_path / "multi.py").write_text("def net():\n    raise ValueError('no weights here\\nsee the log')\n")
    with pytest.raises(UserError) as raised:
        build_factory_model(parse_factory(f"{tmp_path / 'multi.py'}:net", tmp_path))
    assert str(raised.value).endswith("calling net() failed (ValueError: no weights here)")
    (tmp_path / "fails.py").write_text("raise ImportError('no module foo\\ninstall it')\n")
    with pytest.raises(UserError) as raised:
        build_factory_model(parse_factory(f"{tmp_path / 'fails.py'}:net", tmp_path))
    assert str(raised.value).endswith("fails to import (ImportError: no module foo)")

    from perf4sight import blas, cli, stages

    def fails(*args) -> int:
        raise UserError("first line\n  second line\n")
    monkeypatch.setattr(stages, "run", fails)
    monkeypatch.setattr(blas, "pin_kernels", lambda: None)  # this test process's BLAS and numpy as they are
    (tmp_path / "config.toml").write_text("[networks]\nzoo = []\n")
    handler = signal.getsignal(signal.SIGTERM)
    try:
        assert cli.main(["--config", str(tmp_path / "config.toml"), "--stage", "networks"]) == 2
    finally:
        signal.signal(signal.SIGTERM, handler)
    assert capsys.readouterr().err == "error: first line second line\n"


def test_a_zoo_variant_asked_for_by_name_is_pruned_as_the_networks_stage_would(tmp_path: Path, monkeypatch) -> None:
    """``squeezenet1_1_l30`` not in the dataset: pruned on request with the config's [networks.pruning] settings,
    the same description the networks stage writes, cached for the next request; any other name is none."""
    from perf4sight.dataset import resolve_networks
    from perf4sight.networks.on_request import pruned_on_request

    (tmp_path / "config.toml").write_text(
        '[networks]\nzoo = ["squeezenet1_1"]\ninput_shape = [3, 32, 32]\nnum_classes = 10\n'
        '[networks.pruning]\nstrategy = "random"\nlevels = [30]\nseed = 4\n[networks.generator]\ncount = 0\n')
    cfg = load_config(tmp_path / "config.toml")
    asked = pruned_on_request(cfg, "squeezenet1_1_l30", SHAPE)  # before the networks stage ran
    make_networks(cfg)
    made = load_description(tmp_path / "models" / "pruned" / "random" / "squeezenet1_1_l30.json")
    assert asked.to_json() == made.to_json() and asked.extra["strategy"] == "random" and asked.extra["seed"] == 4
    (cached,) = (tmp_path / "models" / "zoo-cache").glob("squeezenet1_1_l30-3x32x32-10-*.json")
    assert load_description(cached).to_json() == made.to_json()
    notes: list[str] = []
    (dataset, other) = resolve_networks(cfg, ["squeezenet1_1_l30", "squeezenet1_1_l45.0"], SHAPE, notes)
    assert dataset.to_json() == made.to_json() and other.name == "squeezenet1_1_l45.0" and other.network == \
        "squeezenet1_1" and abs(other.pruning_level - 45) <= 2 and other.params < made.params
    assert notes == [f"squeezenet1_1_l45.0: not in the dataset: squeezenet1_1 pruned on request as the networks "
                     f"stage would (random, min_channels 4, seed 4: {other.pruning_level:.1f}% of its parameters "
                     "removed)"]
    assert pruned_on_request(cfg, "squeezenet1_1", SHAPE) is None and pruned_on_request(cfg, "mine_l30", SHAPE) is None
    with pytest.raises(UserError, match="'squeezenet1_1_l150': 150% of squeezenet1_1's parameters cannot be pruned"):
        resolve_networks(cfg, ["squeezenet1_1_l150"], SHAPE)
    with pytest.raises(UserError, match=r"unknown network 'squezenet1_1_l30' \(did you mean 'squeezenet1_1_l30'"):
        resolve_networks(cfg, ["squezenet1_1_l30"], SHAPE)
    # a folder of the working directory named like a zoo network does not hide it; another folder is said to be one
    monkeypatch.chdir(tmp_path)
    (tmp_path / "squeezenet1_1").mkdir()
    (tmp_path / "mine").mkdir()
    assert resolve_networks(cfg, ["squeezenet1_1"], SHAPE)[0].name == "squeezenet1_1"
    with pytest.raises(UserError, match=r"^mine: is a folder; give description files \(e.g. mine/\*.json\)$"):
        resolve_networks(cfg, ["mine"], SHAPE)


def test_a_segmentation_network_scores_its_own_class_count_per_pixel(tmp_path: Path) -> None:
    """A segmentation zoo network, by name, as the networks stage makes it and pruned on request, has
    ``segmentation_classes`` classes per pixel (21 unless set); the classifier beside it keeps ``num_classes``."""
    from perf4sight.dataset import resolve_networks

    (tmp_path / "config.toml").write_text(
        '[networks]\nzoo = ["lraspp_mobilenet_v3_large"]\ninput_shape = [3, 32, 32]\nnum_classes = 10\n'
        'segmentation_classes = 5\n[networks.pruning]\nlevels = [0]\n[networks.generator]\ncount = 0\n')
    cfg = load_config(tmp_path / "config.toml")
    make_networks(cfg)
    made = load_description(tmp_path / "models" / "pruned" / "l1-norm" / "lraspp_mobilenet_v3_large_l0.json")
    seg, cls, pruned = resolve_networks(cfg, ["lraspp_mobilenet_v3_large", "resnet18", "lraspp_mobilenet_v3_large_l40"],
                                        SHAPE)
    assert made.node(made.output).output_shape == seg.node(seg.output).output_shape == [5, 32, 32]
    assert (seg.num_classes, cls.num_classes, pruned.num_classes, pruned.label_shape) == (5, 10, 5, [32, 32])
    (tmp_path / "config.toml").write_text('[networks]\nzoo = ["lraspp_mobilenet_v3_large"]\n')
    assert load_config(tmp_path / "config.toml").networks.classes_of("lraspp_mobilenet_v3_large") == 21


def test_a_factory_on_the_command_line_and_a_configs_network_by_its_own_name(tmp_path, monkeypatch):
    """``nets.py:tiny_vgg`` (a file in the current folder) is described as its function builds it, named after the
    function and cached by the file's bytes; ``tiny_resnet``, a factory [networks] names, is its unpruned network:
    the networks stage's ``tiny_resnet_l0`` under its own name, before and after that stage ran."""
    from perf4sight.dataset import resolve_networks

    monkeypatch.chdir(tmp_path)
    (tmp_path / "nets.py").write_text(TINY.read_text())
    (tmp_path / "models" / "imagenet").mkdir(parents=True)
    (tmp_path / "models" / "imagenet" / "mine.py").write_text(TINY.read_text())
    (tmp_path / "config.toml").write_text(
        '[networks]\nzoo = []\nfactories = ["mine:tiny_resnet"]\ninput_shape = [3, 32, 32]\nnum_classes = 10\n'
        '[networks.pruning]\nlevels = [0, 30]\n[networks.generator]\ncount = 0\n')
    cfg = load_config(tmp_path / "config.toml")
    notes: list[str] = []
    cli, own = resolve_networks(cfg, ["nets.py:tiny_vgg", "tiny_resnet"], SHAPE, notes)
    built = build_factory_model(parse_factory("nets.py:tiny_vgg", tmp_path), 10)
    assert cli.to_json() == describe(built, SHAPE, name="tiny_vgg", network="tiny_vgg",
                                     source="factory:nets.py:tiny_vgg").to_json()
    assert own.name == "tiny_resnet" and own.pruning_level == 0 and not notes
    make_networks(cfg)
    made = load_description(tmp_path / "models" / "pruned" / "l1-norm" / "tiny_resnet_l0.json")
    from perf4sight.networks.settings import changed_settings_note
    assert changed_settings_note(cfg) is None
    (tmp_path / "models" / "imagenet" / "helpers.py").write_text("X = 1\n")  # a module the factory could import
    assert "changed since the networks stage wrote" in changed_settings_note(cfg)
    (again,) = resolve_networks(cfg, ["tiny_resnet"], SHAPE)
    assert replace(own, name=made.name).to_json() == replace(again, name=made.name).to_json() == made.to_json()
    cache = tmp_path / "models" / "zoo-cache"
    assert len(list(cache.glob("tiny_vgg-3x32x32-10-*.json"))) == 1
    (tmp_path / "nets.py").write_text(TINY.read_text().replace("128, True)):", "128, True)):  # edited"))
    assert resolve_networks(cfg, ["nets.py:tiny_vgg"], SHAPE)[0].to_json() == cli.to_json()
    assert len(list(cache.glob("tiny_vgg-3x32x32-10-*.json"))) == 2  # the edited file: described anew
    with pytest.raises(UserError, match=r"nets.py: a Python file, not a network: name the function .*nets.py:function"):
        resolve_networks(cfg, ["nets.py"], SHAPE)
    with pytest.raises(UserError, match=r"nets.py has no function 'nope' \(functions: tiny_resnet, tiny_vgg; "
                                        r"nn.Module classes: TinyResNet\)$"):  # a class builds one too: named
        resolve_networks(cfg, ["nets.py:nope"], SHAPE)
    with pytest.raises(UserError, match="unknown network 'tiny_resnett'"):
        resolve_networks(cfg, ["tiny_resnett"], SHAPE)
    (tmp_path / "lib").mkdir()  # a file that imports a module beside it, as a script would
    (tmp_path / "lib" / "p4s_test_blocks.py").write_text(TINY.read_text())
    (tmp_path / "lib" / "uses.py").write_text("from p4s_test_blocks import tiny_vgg\n\n\n"
                                              "def mine(num_classes=1000):\n    return tiny_vgg(num_classes)\n")
    (mine,) = resolve_networks(cfg, ["lib/uses.py:mine"], SHAPE)
    assert mine.name == "mine" and mine.params == cli.params
    (tmp_path / "lib" / "p4s_test_blocks.py").write_text(TINY.read_text() + "\n# edited\n")  # beside it: keyed too
    resolve_networks(cfg, ["lib/uses.py:mine"], SHAPE)
    assert len(list(cache.glob("mine-3x32x32-10-*.json"))) == 2


def test_a_factory_on_the_command_line_is_pruned_as_the_configs_own_networks(tmp_path, monkeypatch):
    """``nets.py:tiny_vgg`` joins a copy of the config's [networks] factories (the config itself untouched) under
    its function's name, and its variants are those of the networks stage naming the same factory; a function the
    file lacks, or a name a zoo network or another factory has, is one line about the entry."""
    from perf4sight.networks.on_request import prunable_networks, variant_at, with_command_line_factories

    monkeypatch.chdir(tmp_path)
    (tmp_path / "nets.py").write_text(TINY.read_text())
    (tmp_path / "other.py").write_text(TINY.read_text())
    base = ('[networks]\nzoo = []\ninput_shape = [3, 32, 32]\nnum_classes = 10\n'
            '[networks.pruning]\nlevels = [30]\n[networks.generator]\ncount = 0\n')
    (tmp_path / "config.toml").write_text(base)
    cfg = load_config(tmp_path / "config.toml")
    own, names = with_command_line_factories(cfg, ["nets.py:tiny_vgg", "resnet18", "nets.py:tiny_vgg"])
    assert names == ["tiny_vgg", "resnet18", "tiny_vgg"] and cfg.networks.factories == []
    assert own.networks.factories == [f"{tmp_path / 'nets.py'}:tiny_vgg"]
    assert prunable_networks(own, names) == (["tiny_vgg", "resnet18"], [])
    asked, pruned = variant_at(own, "tiny_vgg", 30, SHAPE)
    (tmp_path / "named.toml").write_text(base.replace("zoo = []", 'zoo = []\nfactories = ["nets.py:tiny_vgg"]'))
    named = load_config(tmp_path / "named.toml")
    (made,) = [load_description(named.models_dir / r["path"]) for r in make_networks(named).rows]
    assert pruned and asked.name == made.name == "tiny_vgg_l30"
    assert replace(asked, extra={}).to_json() == replace(made, extra={}).to_json()  # but the source's spelling
    assert with_command_line_factories(named, ["nets.py:tiny_vgg"])[0] is named  # named there already
    with pytest.raises(UserError, match=r"factory 'nets.py:nope': nets.py has no function 'nope'"):
        with_command_line_factories(cfg, ["nets.py:nope"])
    with pytest.raises(UserError, match=r"other.py:tiny_vgg: its network's name, tiny_vgg, is that of "
                                        r"factory:nets.py:tiny_vgg: name the function otherwise"):
        with_command_line_factories(named, ["other.py:tiny_vgg"])
    (tmp_path / "zoo.py").write_text("def resnet18():\n    pass\n")
    with pytest.raises(UserError, match=r"zoo.py:resnet18: its network's name, resnet18, is a zoo network's"):
        with_command_line_factories(cfg, ["zoo.py:resnet18"])


def test_prunable_networks(tmp_path):
    """Zoo networks, and a variant's name for its network, each once; a description file or a generated network
    cannot be pruned (no torch: the config names no factory or description file)."""
    from perf4sight.networks.on_request import prunable_networks

    (tmp_path / "config.toml").write_text("[networks]\nzoo = ['resnet18']\n")
    cfg = load_config(tmp_path / "config.toml")
    assert prunable_networks(cfg, ["resnet18_l30", "mobilenet_v2", "resnet18", "gen_0_1", "x/resnet18_l30.json",
                                   "squeezenet1_0_l12.5"]) == (["resnet18", "mobilenet_v2", "squeezenet1_0"],
                                                               ["gen_0_1", "x/resnet18_l30.json"])


def test_stage_writes_descriptions_and_manifests(tmp_path: Path) -> None:
    (tmp_path / "models" / "imagenet").mkdir(parents=True)
    (tmp_path / "models" / "imagenet" / "mine.py").write_text(TINY.read_text())
    (tmp_path / "config.toml").write_text(
        '[networks]\nzoo = []\nfactories = ["mine:tiny_resnet"]\ninput_shape = [3, 32, 32]\nnum_classes = 10\n'
        '[networks.pruning]\nstrategy = "random"\nlevels = [0, 25]\nseed = 4\n'
        '[networks.generator]\ncount = 3\nseed = 9\nstyles = ["mobilenet", "densenet"]\n')
    cfg = load_config(tmp_path / "config.toml")
    rows = make_networks(cfg).rows
    assert [r["network"] for r in rows] == ["tiny_resnet_l0", "tiny_resnet_l25", "gen_9_0", "gen_9_1", "gen_9_2"]
    models = tmp_path / "models"
    with (models / "manifest.csv").open() as fh:
        on_disk = list(csv.DictReader(fh))
    assert [r["network"] for r in on_disk] == [r["network"] for r in rows]
    for row in on_disk:
        desc = load_description(models / row["path"])
        assert desc.name == row["network"] and desc.params == int(row["params"])
        assert int(row["flops_fwd"]) > 0 and row["input_shape"] == "3x32x32"
    pruned = on_disk[1]
    assert pruned["source"].startswith("factory:mine:tiny_resnet") and pruned["strategy"] == "random"
    assert abs(float(pruned["achieved_level"]) - 25) <= 2 and pruned["seed"] == "4"
    assert set(on_disk[2]["styles"].split("|")) <= {"mobilenet", "densenet"}
    assert (models / "pruned" / "random" / "manifest.csv").is_file()
    assert (models / "generated" / "manifest.csv").is_file()
    assert variant_name("resnet18", 12.5) == "resnet18_l12.5"
    # a level of the factory's network the stage did not make: pruned on request, as the stage made its own
    from perf4sight.dataset import resolve_networks
    from perf4sight.networks.on_request import pruned_on_request
    assert pruned_on_request(cfg, "tiny_resnet_l25", [3, 32, 32]).to_json() == \
        load_description(models / on_disk[1]["path"]).to_json()
    notes: list[str] = []
    (asked,) = resolve_networks(cfg, ["tiny_resnet_l40"], [3, 32, 32], notes)
    assert asked.name == "tiny_resnet_l40" and asked.extra["source"].startswith("factory:mine:tiny_resnet")
    assert abs(asked.pruning_level - 40) <= 2 and notes[0].startswith("tiny_resnet_l40: not in the dataset: "
                                                                      "tiny_resnet pruned on request")
    from perf4sight.networks import on_request  # the plan kept since l25 gives what a plan traced anew gives
    assert any(key[0].startswith("factory:mine:tiny_resnet") for key in on_request._PLANS)
    on_request._PLANS.clear()
    cache = models / "zoo-cache"
    (cached,) = cache.glob("tiny_resnet_l40-3x32x32-10-*.json")  # kept for the next process, which reads it
    cached.unlink()
    assert pruned_on_request(cfg, "tiny_resnet_l40", [3, 32, 32]).to_json() == asked.to_json()
    assert load_description(cached).to_json() == asked.to_json()
    on_request._PLANS.clear()
    assert pruned_on_request(cfg, "tiny_resnet_l40", [3, 32, 32]).to_json() == asked.to_json()
    assert not on_request._PLANS  # read from the file: nothing traced
    factory = models / "imagenet" / "mine.py"  # an edited factory file: its variants are pruned anew
    factory.write_text(factory.read_text().replace("stride: int) -> None:", "stride: int) -> None:  # edited"))
    assert pruned_on_request(cfg, "tiny_resnet_l40", [3, 32, 32]).to_json() == asked.to_json()
    assert len(list(cache.glob("tiny_resnet_l40-3x32x32-10-*.json"))) == 2 and on_request._PLANS
    assert pruned_on_request(cfg, "gen_9_0_l30", [3, 32, 32]) is None  # not a network [networks] names
    # what compare's pruning section and --prune-to-fit prune: the factory's network, named by a variant too
    from perf4sight.networks.on_request import prunable_networks, variant_at
    assert prunable_networks(cfg, ["tiny_resnet_l0", "gen_9_0", "tiny_resnet"]) == (["tiny_resnet"], ["gen_9_0"])
    same, pruned = variant_at(cfg, "tiny_resnet", 25, [3, 32, 32])  # the dataset's file, at its shape
    assert not pruned and same.to_json() == load_description(models / on_disk[1]["path"]).to_json()
    wider, pruned = variant_at(cfg, "tiny_resnet", 25, [3, 48, 48])  # another shape: pruned at it
    assert pruned and wider.input_shape == [3, 48, 48] and wider.params == same.params


class _SignalledOnce(nn.Module):
    """A small network whose first forward gets signal ``signum`` mid-way: a Ctrl-C (SIGINT) or a `kill` (SIGTERM) of
    a networks stage."""

    def __init__(self, signum: int) -> None:
        super().__init__()
        self.conv, self.fc, self.calls, self.signum = nn.Conv2d(3, 8, 3), nn.Linear(8, 4), 0, signum

    def forward(self, x):
        self.calls += 1
        if self.calls == 1:
            os.kill(os.getpid(), self.signum)
        return self.fc(self.conv(x).mean((2, 3)))


def test_ctrl_c_during_torch_prunings_trace_stops_the_stage():
    """torch-pruning's trace calls the model under a bare except (model(*x), then model(x)), which took a Ctrl-C and
    went on: 2 of 10 interrupts of a networks stage were lost."""
    from perf4sight.networks.prune_plan import find_groups

    model = _SignalledOnce(signal.SIGINT)
    with pytest.raises(KeyboardInterrupt):
        find_groups(model, torch.randn(1, 3, 8, 8), [model.fc], lambda g: "")
    assert model.calls >= 2  # the trace went on past the interrupt, and the stage stops after it
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler  # the handler put back


def test_sigterm_during_torch_prunings_trace_stops_the_stage():
    """The command line turns SIGTERM into a KeyboardInterrupt; raised in torch-pruning's trace, under its bare except,
    it was lost as a Ctrl-C was: `kill` of a networks stage there let it run on (it ended later, exit 0 or 2)."""
    from perf4sight.cli import _terminated
    from perf4sight.networks.prune_plan import find_groups

    model = _SignalledOnce(signal.SIGTERM)
    before = signal.signal(signal.SIGTERM, _terminated)
    try:
        with pytest.raises(KeyboardInterrupt):
            find_groups(model, torch.randn(1, 3, 8, 8), [model.fc], lambda g: "")
        assert model.calls >= 2  # the trace went on past the signal, and the stage stops after it
        assert signal.getsignal(signal.SIGTERM) is _terminated  # the handler put back
    finally:
        signal.signal(signal.SIGTERM, before)


class _EncoderDecoder(nn.Module):
    """A segmentation network's shape: convolutions down, a transposed convolution up (its batch norm after it), the
    skip concatenated, a convolution, and a GAN generator's last layer, a transposed convolution to the classes."""

    def __init__(self, groups: int = 1) -> None:
        super().__init__()
        self.e1 = nn.Sequential(nn.Conv2d(3, 16, 3, padding=1), nn.BatchNorm2d(16), nn.ReLU())
        self.e2 = nn.Sequential(nn.Conv2d(16, 32, 3, stride=2, padding=1), nn.BatchNorm2d(32), nn.ReLU())
        self.up, self.bn = nn.ConvTranspose2d(32, 16, 2, stride=2, groups=groups), nn.BatchNorm2d(16)
        self.dec = nn.Sequential(nn.Conv2d(32, 16, 3, padding=1), nn.ReLU())
        self.head = nn.ConvTranspose2d(16, 5, 3, padding=1)

    def forward(self, x):
        skip = self.e1(x)
        return self.head(self.dec(torch.cat([skip, torch.relu(self.bn(self.up(self.e2(skip))))], 1)))


def test_an_encoder_decoder_with_transposed_convolutions_is_pruned() -> None:
    """A transposed convolution's output channels are pruned as a convolution's, by the L1 norms of its filters (its
    weight [Cin, Cout, kh, kw]: along the second dimension), with the batch norm and the concatenation after it; the
    last layer, a transposed one, keeps its classes; the parameters are counted without a cut copy, and the pruned
    network describes with the parameters the plan says. A grouped transposed convolution, whose weight
    torch-pruning cuts along the wrong dimension, is refused by name."""
    from perf4sight.networks.pruning import Unprunable

    torch.manual_seed(0)
    base = _EncoderDecoder()
    plan = PruningPlan(base, [3, 16, 16], network="unet")
    assert plan._fast_count is not None  # counted from the layers' sizes
    pruned = plan.prune(40)
    up, head = pruned.module.up, pruned.module.head
    assert abs(pruned.achieved_level - 40) < 2 and up.out_channels < 16 and head.out_channels == 5
    strongest = base.up.weight.detach().abs().sum(dim=(0, 2, 3)).argsort(descending=True)[:up.out_channels]
    assert torch.equal(up.bias.detach(), base.up.bias.detach()[strongest.sort().values])  # the filters kept
    assert pruned.module(torch.randn(2, 3, 16, 16)).shape == (2, 5, 16, 16)
    desc = describe(pruned.module, [3, 16, 16], "unet_l40")
    assert desc.params == pruned.params == sum(p.numel() for p in pruned.module.parameters())
    with pytest.raises(Unprunable, match=r"^grouped: its grouped transposed convolution 'up' cannot be pruned"):
        PruningPlan(_EncoderDecoder(groups=4), [3, 16, 16], network="grouped")



def test_layers_the_forward_never_runs_neither_block_pruning_nor_count_in_its_level() -> None:
    """Research code keeps layers its forward does not run (a spare head, a branch of another configuration). A
    grouped transposed convolution among them refused the network ("cannot be pruned"), and their parameters, which
    no cut reaches and no description holds, counted in the level: asked for 40%, the description lost 47%."""
    torch.manual_seed(0)
    base = _EncoderDecoder()
    base.spare_up = nn.ConvTranspose2d(16, 16, 4, stride=2, padding=1, groups=16)
    base.spare_head = nn.Conv2d(16, 16, 3)
    plan = PruningPlan(base, [3, 16, 16], network="unet")
    whole = describe(base, [3, 16, 16], "unet").params
    assert plan.p0 == whole < sum(p.numel() for p in base.parameters())
    pruned = plan.prune(40)
    desc = describe(pruned.module, [3, 16, 16], "unet_l40")
    assert desc.params == pruned.params and abs(pruned.achieved_level - 40) < 2
    assert pruned.achieved_level == pytest.approx(100 * (1 - desc.params / whole), abs=1e-2)

class _StyleBlock(nn.Module):
    """A style-transfer network's pattern: a convolution, an affine instance norm and an in-place ReLU (the norm's
    output, a view of torch's batch norm over [1, N x C, H, W], written in place), then a residual block whose
    instance norm feeds the sum."""

    def __init__(self) -> None:
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(3, 16, 3, padding=1), nn.InstanceNorm2d(16, affine=True),
                                  nn.ReLU(inplace=True))
        self.body = nn.Sequential(nn.Conv2d(16, 16, 3, padding=1), nn.InstanceNorm2d(16, affine=True),
                                  nn.ReLU(inplace=True), nn.Conv2d(16, 16, 3, padding=1), nn.InstanceNorm2d(16))
        self.head = nn.Conv2d(16, 3, 3, padding=1)

    def forward(self, x):
        y = self.stem(x)
        return torch.tanh(self.head(y + self.body(y)))


def test_an_instance_norm_before_an_in_place_relu_is_pruned_with_its_convolution() -> None:
    """torch-pruning lost an instance norm whose output an in-place ReLU overwrote (the norm's output, a view, took
    another grad_fn), so its weight kept every channel of the convolution before it and the pruned network failed
    at its first forward; each norm is now cut with its convolution, and the variant runs and describes with the
    parameters the plan says, counted from the layers' sizes (an affine instance norm's as a batch norm's)."""
    torch.manual_seed(0)
    plan = PruningPlan(_StyleBlock(), [3, 16, 16], network="style")
    assert plan._fast_count is not None  # counted from the layers' sizes, the norms' weights and biases too
    pruned = plan.prune(40)
    m = pruned.module
    assert m.stem[0].out_channels < 16 and m.stem[1].num_features == m.stem[1].weight.numel() == m.stem[0].out_channels
    assert m.body[1].num_features == m.body[1].weight.numel() == m.body[0].out_channels < 16
    assert m(torch.randn(2, 3, 16, 16)).shape == (2, 3, 16, 16)
    desc = describe(m, [3, 16, 16], "style_l40")
    assert desc.params == pruned.params == sum(p.numel() for p in m.parameters())
    assert abs(pruned.achieved_level - 40) < 2


@pytest.mark.parametrize("level", [20, 50])
def test_instance_norms_with_running_statistics_are_pruned_with_them(level: int) -> None:
    """torch-pruning cut an instance norm's weight and bias but not the running mean and variance it tracks
    (track_running_stats=True): the pruned network failed at its first forward ("running_mean should contain 14
    elements not 16"), in training and when described. Their running statistics are now cut with their channels:
    the variant runs in training and in eval, and describes with the parameters the plan says."""
    torch.manual_seed(0)
    base = nn.Sequential(nn.Conv2d(3, 16, 3, padding=1), nn.InstanceNorm2d(16, track_running_stats=True), nn.ReLU(),
                         nn.Conv2d(16, 16, 3, padding=1), nn.InstanceNorm2d(16, affine=True, track_running_stats=True),
                         nn.ReLU(), nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(16, 4))
    plan = PruningPlan(base, [3, 8, 8], strategy="random")
    pruned = plan.prune(level)
    m = pruned.module
    for conv, norm in ((m[0], m[1]), (m[3], m[4])):
        assert norm.num_features == norm.running_mean.numel() == norm.running_var.numel() == conv.out_channels < 16
    x = torch.randn(2, 3, 8, 8)
    assert m.train()(x).shape == m.eval()(x).shape == (2, 4)
    desc = describe(m, [3, 8, 8], f"tracked_l{level}")
    assert desc.params == pruned.params == sum(p.numel() for p in m.parameters())
    assert [n.attrs["num_features"] for n in desc.nodes if n.op == "instancenorm"] == [m[1].num_features,
                                                                                       m[4].num_features]


def test_a_resnet_with_frozen_batch_norms_is_pruned_with_their_buffers() -> None:
    """A torchvision ResNet built with FrozenBatchNorm2d (a detection backbone's) could not be pruned at all
    ("cannot reach pruning level 20% ... it reaches 0.0% at most"): torch-pruning read its scale and shift, made of
    buffers, as constants, so a cut of any group through it left its buffers whole and did not run. Its four buffers
    are now cut with its convolution's channels, the same channels from each; the variant runs, counts fast and
    describes with the parameters the plan says."""
    import torchvision
    from torchvision.ops import FrozenBatchNorm2d

    torch.manual_seed(0)
    base = torchvision.models.resnet18(norm_layer=FrozenBatchNorm2d, num_classes=10)
    for norm in (m for m in base.modules() if isinstance(m, FrozenBatchNorm2d)):
        channels = torch.arange(norm.weight.numel(), dtype=torch.float32)
        norm.running_mean.copy_(channels)
        norm.weight.copy_(channels + 1)
        norm.bias.copy_(channels + 2)
        norm.running_var.copy_(channels + 3)
    plan = PruningPlan(base, [3, 32, 32], strategy="random")
    assert plan._fast_count is not None
    pruned = plan.prune(30)
    m = pruned.module
    assert m.conv1.out_channels == m.bn1.weight.numel() < 64
    for norm in (m for m in m.modules() if isinstance(m, FrozenBatchNorm2d)):  # the same channels cut from each
        kept = norm.running_mean
        assert torch.equal(norm.weight, kept + 1) and torch.equal(norm.bias, kept + 2)
        assert torch.equal(norm.running_var, kept + 3)
    assert m(torch.randn(2, 3, 32, 32)).shape == (2, 10)
    desc = describe(m, [3, 32, 32], "frozen_l30")
    assert desc.params == pruned.params == sum(p.numel() for p in m.parameters())
    assert abs(pruned.achieved_level - 30) < 2


class _GroupNormUNet(nn.Module):
    """A diffusion-style U-Net's blocks: convolutions with group norms of 4 and 8 groups, the skip concatenated
    after a transposed convolution."""

    def __init__(self) -> None:
        super().__init__()
        self.e1 = nn.Sequential(nn.Conv2d(3, 32, 3, padding=1), nn.GroupNorm(4, 32), nn.ReLU(inplace=True))
        self.e2 = nn.Sequential(nn.Conv2d(32, 64, 3, stride=2, padding=1), nn.GroupNorm(8, 64), nn.SiLU())
        self.up = nn.ConvTranspose2d(64, 32, 2, stride=2)
        self.dec = nn.Sequential(nn.Conv2d(64, 32, 3, padding=1), nn.GroupNorm(4, 32), nn.ReLU())
        self.head = nn.Conv2d(32, 3, 1)

    def forward(self, x):
        skip = self.e1(x)
        return self.head(self.dec(torch.cat([self.up(self.e2(skip)), skip], 1)))


@pytest.mark.parametrize("level", [20, 60])
def test_a_network_with_group_norms_is_pruned_a_channel_from_every_group_at_a_time(level: int) -> None:
    """torch-pruning cut a group norm's channels one by one, leaving a count its groups do not divide (29 of 4
    groups) and a network that failed at its first forward; a group that touches a group norm now loses one local
    channel from every one of its groups at a time, as a grouped convolution's does, so each group keeps the same
    width, and the variant runs and describes with the parameters the plan says, counted from the layers'
    sizes."""
    torch.manual_seed(0)
    plan = PruningPlan(_GroupNormUNet(), [3, 16, 16], network="gn")
    assert plan._fast_count is not None  # counted from the layers' sizes, the norms' weights and biases too
    pruned = plan.prune(level)
    norms = [m for m in pruned.module.modules() if isinstance(m, nn.GroupNorm)]
    assert all(n.num_channels % n.num_groups == 0 and n.weight.numel() == n.num_channels for n in norms)
    assert any(n.num_channels < 32 for n in norms) and abs(pruned.achieved_level - level) < 2
    assert pruned.module(torch.randn(2, 3, 16, 16)).shape == (2, 3, 16, 16)
    assert describe(pruned.module, [3, 16, 16], "gn").params == pruned.params


class _SuperResolution(nn.Module):
    """An ESPCN's upsampling (convolutions, then a pixel shuffle: the layer or the call), or a pixel unshuffle's
    downsampling before a convolution."""

    def __init__(self, unshuffle: bool = False, call: bool = False) -> None:
        super().__init__()
        self.unshuffle, self.call = unshuffle, call
        self.c1 = nn.Conv2d(3, 8 if unshuffle else 16, 3, padding=1)
        self.c2 = nn.Conv2d(32 if unshuffle else 16, 12, 3, padding=1)
        self.shuffle, self.head = nn.PixelShuffle(2), nn.Conv2d(12 if unshuffle else 3, 3, 1)

    def forward(self, x):
        y = torch.relu(self.c1(x))
        if self.unshuffle:
            return self.head(torch.relu(self.c2(torch.nn.functional.pixel_unshuffle(y, 2))))
        y = self.c2(y)
        return self.head(torch.nn.functional.pixel_shuffle(y, 2) if self.call else self.shuffle(y))


@pytest.mark.parametrize("unshuffle, call", [(False, False), (False, True), (True, True)])
def test_a_network_with_a_pixel_shuffle_is_refused_by_name_as_unprunable(unshuffle: bool, call: bool) -> None:
    """torch-pruning cut the channels before a pixel shuffle one by one (9 left of 12, which its upscale factor's
    square does not divide) and those after an unshuffle as if it kept them: the networks stage failed at the first
    pruned level with torch's error. Such a network is refused by name, as unprunable (its level 0 alone made)."""
    from perf4sight.networks.pruning import Unprunable

    module = _SuperResolution(unshuffle, call)
    assert module(torch.randn(2, 3, 16, 16)).shape[1] == 3
    name = "pixel_unshuffle" if unshuffle else "pixel_shuffle"
    with pytest.raises(Unprunable, match=rf"^espcn: a network with a {name} cannot be pruned"):
        PruningPlan(module, [3, 16, 16], network="espcn")


class _KeyedPixels(nn.Module):
    """A conv's map as pixels, each's logits against the module's own keys (an einsum of a parameter), classified:
    a prototype or codebook head."""

    def __init__(self, weight_first: bool) -> None:
        super().__init__()
        self.weight_first = weight_first
        self.conv, self.keys = nn.Conv2d(3, 8, 3, padding=1), nn.Parameter(torch.randn(16, 8))
        self.fc = nn.Linear(64 * 16, 10)

    def forward(self, x):
        pixels = self.conv(x).flatten(2).transpose(1, 2)
        logits = (torch.einsum("jd,bid->bij", self.keys, pixels) if self.weight_first
                  else torch.einsum("bid,jd->bij", [pixels, self.keys]))
        return self.fc(logits.flatten(1))


@pytest.mark.parametrize("weight_first", [False, True])
def test_a_network_with_an_einsum_of_its_parameter_is_refused_by_name_as_unprunable(weight_first: bool) -> None:
    """torch-pruning's dependency graph of a network holding an einsum of its own parameter, a flatten and a linear
    layer after it, grew without bound (past 2.5 GB within seconds in its index maps, the stage killed by the
    kernel); such a network is refused by name, as unprunable (its level 0 alone made), before torch-pruning runs."""
    from perf4sight.networks.pruning import Unprunable

    module = _KeyedPixels(weight_first)
    assert module(torch.randn(2, 3, 8, 8)).shape == (2, 10)
    with pytest.raises(Unprunable, match=r"^keyed: a network with an einsum of its own parameter cannot be pruned"):
        PruningPlan(module, [3, 8, 8], network="keyed")


class _SrganBlock(nn.Module):
    """An SRGAN generator's pattern: a convolution and a PReLU of one slope per channel (the stem), residual blocks
    of convolution, PReLU per channel, convolution added back, a PReLU of one slope shared by every channel, then a
    convolution and an up-sampling (not a pixel shuffle, which makes a network unprunable)."""

    def __init__(self) -> None:
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(3, 32, 3, padding=1), nn.PReLU(32))
        self.blocks = nn.ModuleList(nn.Sequential(nn.Conv2d(32, 32, 3, padding=1), nn.PReLU(32),
                                                  nn.Conv2d(32, 32, 3, padding=1)) for _ in range(2))
        self.shared = nn.PReLU()
        self.up = nn.Sequential(nn.Conv2d(32, 8, 3, padding=1), nn.Upsample(scale_factor=2), nn.Conv2d(8, 3, 1))

    def forward(self, x):
        y = self.stem(x)
        for block in self.blocks:
            y = y + block(y)
        return self.up(self.shared(y))


def test_a_prelu_with_a_slope_per_channel_is_pruned_with_its_convolution() -> None:
    """A PReLU of one slope per channel loses the slopes of the channels its convolution loses (torch-pruning's
    PReLU pruner), and one of a single slope keeps it; the variant at level 30 runs, describes with the
    parameters the plan says, counted from the layers' sizes (a PReLU's slopes as a batch norm's weight)."""
    torch.manual_seed(0)
    plan = PruningPlan(_SrganBlock(), [3, 8, 8], network="srgan")
    assert plan._fast_count is not None
    pruned = plan.prune(30)
    m = pruned.module
    assert m.stem[1].num_parameters == m.stem[1].weight.numel() == m.stem[0].out_channels < 32
    assert all(b[1].num_parameters == b[1].weight.numel() == b[0].out_channels < 32 for b in m.blocks)
    assert m.shared.weight.numel() == 1 and abs(pruned.achieved_level - 30) < 2
    assert m(torch.randn(2, 3, 8, 8)).shape == (2, 3, 16, 16)
    desc = describe(m, [3, 8, 8], "srgan_l30")
    assert desc.params == pruned.params == sum(p.numel() for p in m.parameters())
    assert [n.attrs["num_parameters"] for n in desc.nodes if n.op == "prelu"] == [
        m.stem[1].num_parameters, m.blocks[0][1].num_parameters, m.blocks[1][1].num_parameters, 1]


def test_a_network_converted_to_sync_batch_norms_is_pruned_and_described() -> None:
    """A network made ready for several GPUs (nn.SyncBatchNorm.convert_sync_batchnorm, a detection or segmentation
    training script's) was refused: its norms are batch norms on one device. The plan counts their parameters from
    their sizes (the fast count), the variant at level 30 runs and describes with the parameters the plan says."""
    torch.manual_seed(0)
    base = nn.Sequential(nn.Conv2d(3, 16, 3, padding=1), nn.BatchNorm2d(16), nn.ReLU(), nn.Conv2d(16, 16, 3),
                         nn.BatchNorm2d(16), nn.ReLU(), nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(16, 5))
    plan = PruningPlan(nn.SyncBatchNorm.convert_sync_batchnorm(base), [3, 8, 8], network="synced")
    assert plan._fast_count is not None
    pruned = plan.prune(30)
    m = pruned.module
    assert isinstance(m[1], nn.SyncBatchNorm) and m[1].num_features == m[0].out_channels < 16
    desc = describe(m.eval(), [3, 8, 8], "synced_l30")
    assert [n.attrs["num_features"] for n in desc.nodes if n.op == "batchnorm2d"] == [m[1].num_features,
                                                                                       m[4].num_features]
    assert desc.params == pruned.params == sum(p.numel() for p in m.parameters())


def test_a_glu_over_the_channels_keeps_its_channels_and_one_over_the_width_is_pruned_through() -> None:
    """torch-pruning reads a GLU as elementwise: it cut the same channels of the convolution before a GLU over the
    channels and of the one after it, where the GLU pairs channel i with i + C / 2 (the variant's convolutions
    disagreed with it). That group is left whole, named in the plan's notes; a GLU over the width is pruned through.
    The variant at level 30 runs and describes with the parameters the plan says."""
    torch.manual_seed(0)
    net = nn.Sequential(nn.Conv2d(3, 32, 3, padding=1), nn.GLU(1), nn.Conv2d(16, 32, 3, padding=1), nn.ReLU(),
                        nn.Conv2d(32, 32, 3, padding=1), nn.GLU(-1), nn.Conv2d(32, 16, 1), nn.AdaptiveAvgPool2d(1),
                        nn.Flatten(), nn.Linear(16, 5))
    plan = PruningPlan(net, [3, 12, 12], network="gated")
    assert plan.extra["pruning_unpruned_groups"] == {
        "channels a GLU halves (a channel and its gate, half the channels apart)": 1}
    pruned = plan.prune(30)
    m = pruned.module
    assert m[0].out_channels == 32 and m[2].in_channels == 16 and m[4].out_channels == m[6].in_channels < 32
    assert m(torch.randn(2, 3, 12, 12)).shape == (2, 5) and abs(pruned.achieved_level - 30) < 2
    desc = describe(m.eval(), [3, 12, 12], "gated_l30")
    assert desc.params == pruned.params == sum(p.numel() for p in m.parameters())


class _GatedMLP(nn.Module):
    """A gated MLP over tokens (an MLP-Mixer's, a transformer's GLU feed-forward): a linear layer to twice the hidden
    width, F.glu over its features (the last dim of [N, T, F]), a linear layer back, added to its input."""

    def __init__(self) -> None:
        super().__init__()
        self.stem, self.up, self.down = nn.Conv2d(3, 32, 4, 4), nn.Linear(32, 128), nn.Linear(64, 32)
        self.head = nn.Linear(32, 5)

    def forward(self, x):
        tokens = self.stem(x).flatten(2).transpose(1, 2)
        tokens = tokens + self.down(nn.functional.glu(self.up(tokens), -1))
        return self.head(tokens.mean(1))


def test_a_glu_over_a_linear_layer_s_features_keeps_them_whole() -> None:
    """A GLU along the last dim of a linear layer's [N, T, F] features pairs feature i with i + F / 2, as one over a
    map's channels does; its dim, which autograd saves unsigned (-1 read 2 ** 64 - 1, 0 modulo a rank of 3), was read
    as the batch's, and the group was pruned through: the trial cut let it pass where its random order happened to
    keep as many features on each side, and the variant's second layer refused the first's (mat1 and mat2 shapes
    cannot be multiplied). The group is left whole, named in the plan's notes; the variants run and describe."""
    torch.manual_seed(0)
    plan = PruningPlan(_GatedMLP(), [3, 32, 32], network="gated_mlp")
    assert plan.extra["pruning_unpruned_groups"] == {
        "channels a GLU halves (a channel and its gate, half the channels apart)": 1}
    for level in (10, 20):
        pruned = plan.prune(level)
        m = pruned.module.eval()
        assert m.up.out_features == 128 and m.down.in_features == 64 and m.down.out_features < 32
        assert m(torch.randn(2, 3, 32, 32)).shape == (2, 5)
        assert describe(m, [3, 32, 32], f"gated_mlp_l{level}").params == pruned.params


class _GatedPatches(nn.Module):
    """A map's patches as tokens ([N, T, C], the channels last: flatten(2).transpose(1, 2)), gated by F.glu over
    their channels, and a linear layer over the half kept."""

    def __init__(self) -> None:
        super().__init__()
        self.stem, self.mix, self.head = nn.Conv2d(3, 64, 4, 4), nn.Linear(32, 32), nn.Linear(32, 5)

    def forward(self, x):
        tokens = self.stem(x).flatten(2).transpose(1, 2)
        return self.head(self.mix(nn.functional.glu(tokens, -1)).mean(1))


def test_a_glu_over_tokens_channels_keeps_them_whole() -> None:
    """A GLU along the last dim of [N, T, C] tokens made of a map's patches (no linear layer before it) halves the
    convolution's channels: the group was pruned through, and where the trial cut's random order kept as many
    channels on either side (seed 2 here) the variants at levels 10 and 20 failed their forward. It is left whole."""
    torch.manual_seed(2)
    plan = PruningPlan(_GatedPatches(), [3, 32, 32], network="gated_patches")
    assert plan.extra["pruning_unpruned_groups"] == {
        "channels a GLU halves (a channel and its gate, half the channels apart)": 1}
    for level in (10, 20):
        m = plan.prune(level).module.eval()
        assert m.stem.out_channels == 64 and m(torch.randn(2, 3, 32, 32)).shape == (2, 5)


class _SpatialGated(nn.Module):
    """CBAM's spatial attention: the channels' max and mean concatenated (``dim``: 1, or -3 as some code writes it),
    a 7x7 convolution to one gate, the map times its sigmoid, between two convolutions."""

    def __init__(self, dim: int) -> None:
        super().__init__()
        self.dim, self.c1, self.gate = dim, nn.Conv2d(3, 32, 3, padding=1), nn.Conv2d(2, 1, 7, padding=3)
        self.c2, self.fc = nn.Conv2d(32, 32, 3, padding=1), nn.Linear(32, 10)

    def forward(self, x):
        y = torch.relu(self.c1(x))
        pooled = torch.cat([y.max(1, keepdim=True)[0], y.mean(1, keepdim=True)], dim=self.dim)
        return self.fc(self.c2(y * torch.sigmoid(self.gate(pooled))).mean((2, 3)))


@pytest.mark.parametrize("dim", [1, -3])
def test_a_spatial_gate_s_concatenation_along_dim_minus_3_prunes(dim) -> None:
    """A CBAM spatial gate whose pooled maps are concatenated along dim -3 failed the plan with a TypeError
    (unsupported operand type(s) for +: 'int' and 'NoneType'): the cat's dim, which autograd keeps unsigned, was not
    read as the channels', and its inputs' channels were left unknown. It prunes as the one along dim 1 does."""
    torch.manual_seed(0)
    pruned = PruningPlan(_SpatialGated(dim), [3, 16, 16], network="spatial").prune(30)
    assert pruned.module(torch.randn(2, 3, 16, 16)).shape == (2, 10) and abs(pruned.achieved_level - 30) < 2


def test_the_elementwise_activations_and_a_softmin_over_the_channels_are_pruned_through() -> None:
    """Softsign, Tanhshrink (described as the ops torch computes them from), Hardshrink, Softshrink, Threshold (in
    place), LogSigmoid and a Softmin over the channels between convolutions: the plan cuts the channels of the
    convolutions around them, the variant at level 30 runs and describes with the parameters the plan says."""
    torch.manual_seed(0)
    net = nn.Sequential(nn.Conv2d(3, 16, 3, padding=1), nn.Softsign(), nn.Conv2d(16, 16, 3, padding=1),
                        nn.Tanhshrink(), nn.Hardshrink(0.1), nn.Conv2d(16, 16, 3, padding=1), nn.Softshrink(0.1),
                        nn.Threshold(0.0, -0.5, inplace=True), nn.Conv2d(16, 16, 1), nn.LogSigmoid(), nn.Softmin(1),
                        nn.Conv2d(16, 16, 1), nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(16, 5))
    pruned = PruningPlan(net, [3, 12, 12], network="acts").prune(30)
    m = pruned.module
    assert all(m[i].out_channels < 16 for i in (0, 2, 5, 8, 11)) and abs(pruned.achieved_level - 30) < 2
    assert m(torch.randn(2, 3, 12, 12)).shape == (2, 5)
    desc = describe(m.eval(), [3, 12, 12], "acts_l30")
    assert {"abs", "div", "tanh", "hardshrink", "softshrink", "threshold", "log_sigmoid", "softmax"} <= {
        n.op for n in desc.nodes}
    assert desc.params == pruned.params == sum(p.numel() for p in m.parameters())


def test_a_local_response_norm_is_pruned_through() -> None:
    """An AlexNet-style local response norm (across neighbouring channels, no parameters) between convolutions: the
    plan cuts the channels of the convolution before it, the variant at level 30 runs and describes with the
    parameters the plan says."""
    torch.manual_seed(0)
    net = nn.Sequential(nn.Conv2d(3, 16, 3), nn.ReLU(), nn.LocalResponseNorm(5), nn.Conv2d(16, 16, 3), nn.ReLU(),
                        nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(16, 5))
    pruned = PruningPlan(net, [3, 12, 12], network="alexnet").prune(30)
    m = pruned.module
    assert m[0].out_channels == m[3].in_channels < 16 and m(torch.randn(2, 3, 12, 12)).shape == (2, 5)
    desc = describe(m.eval(), [3, 12, 12], "alexnet_l30")
    assert [n.output_shape for n in desc.nodes if n.op == "local_response_norm"] == [[m[0].out_channels, 10, 10]]
    assert desc.params == pruned.params == sum(p.numel() for p in m.parameters())


_REFLECTED = '''
import torch
from torch import nn


class Reflected(nn.Module):
    """A style-transfer network's pattern: convolutions padding by reflection (a 7x7 stem, a residual block),
    replication or wrapping around (circular: the head), instance norms, in-place ReLUs, a tanh."""

    def __init__(self, num_classes: int = 3) -> None:
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(3, 16, 7, padding=3, padding_mode="reflect"),
                                  nn.InstanceNorm2d(16, affine=True), nn.ReLU(inplace=True))
        self.body = nn.Sequential(nn.Conv2d(16, 16, 3, padding=1, padding_mode="reflect"),
                                  nn.InstanceNorm2d(16, affine=True), nn.ReLU(inplace=True),
                                  nn.Conv2d(16, 16, 3, padding=1, padding_mode="replicate"), nn.InstanceNorm2d(16))
        self.head = nn.Conv2d(16, num_classes, 3, padding=1, padding_mode="circular")

    def forward(self, x):
        y = self.stem(x)
        return torch.tanh(self.head(y + self.body(y)))


def reflected(num_classes: int = 3) -> nn.Module:
    return Reflected(num_classes)
'''


def test_stage_prunes_a_network_whose_convolutions_pad_by_reflection(tmp_path: Path) -> None:
    """A factory's network of convolutions padding by reflection, replication or wrapping (a style-transfer
    network's) stopped the networks stage: describe refused such a convolution. Its level 0 and 30 are made: each
    convolution a pad of its mode then the convolution, the pruned one's narrower, its parameters those the pruned
    module holds, each description rebuilt to a module that runs its training step at the input shape."""
    (tmp_path / "models" / "imagenet").mkdir(parents=True)
    (tmp_path / "models" / "imagenet" / "style.py").write_text(_REFLECTED)
    (tmp_path / "config.toml").write_text(
        '[networks]\nzoo = []\nfactories = ["style:reflected"]\ninput_shape = [3, 16, 16]\nnum_classes = 3\n'
        '[networks.pruning]\nlevels = [0, 30]\n[networks.generator]\ncount = 0\n')
    cfg = load_config(tmp_path / "config.toml")
    rows = make_networks(cfg).rows
    assert [r["network"] for r in rows] == ["reflected_l0", "reflected_l30"]
    descs = [load_description(tmp_path / "models" / r["path"]) for r in rows]
    for desc in descs:
        pads = [n for n in desc.nodes if n.op == "pad"]
        assert [(p.attrs["mode"], p.attrs["pads"]) for p in pads] == [
            ("reflect", [3, 3, 3, 3]), ("reflect", [1] * 4), ("replicate", [1] * 4), ("circular", [1] * 4)]
        assert all(desc.node(n.inputs[0]).op == "pad" and n.attrs["padding"] == [0, 0] for n in desc.nodes
                   if n.op == "conv2d")
        model = build_module(desc)
        assert sum(p.numel() for p in model.parameters()) == desc.params
        out = model(torch.randn(2, 3, 16, 16))
        assert out.shape == (2, 3, 16, 16)
        out.square().mean().backward()
        assert all(p.grad is not None for p in model.parameters())
    full, pruned = descs
    assert abs(float(rows[1]["achieved_level"]) - 30) <= 2 and pruned.params < full.params
    assert pruned.params == int(rows[1]["params"])
    assert [n.attrs["out_channels"] for n in pruned.nodes if n.op == "conv2d"][-1] == 3
    assert any(n.attrs["out_channels"] < 16 for n in pruned.nodes if n.op == "conv2d")


class _ShuffledBlock(nn.Module):
    """A stem and a residual block whose convolution's output is shuffled in four groups by nn.ChannelShuffle."""

    def __init__(self) -> None:
        super().__init__()
        self.stem, self.conv = nn.Conv2d(3, 16, 3, padding=1), nn.Conv2d(16, 16, 3, padding=1)
        self.shuffle, self.mix = nn.ChannelShuffle(4), nn.Conv2d(16, 16, 1)
        self.head = nn.Sequential(nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(16, CLASSES))

    def forward(self, x):
        x = self.stem(x)
        return self.head(self.mix(self.shuffle(torch.relu(self.conv(x)))) + x)


def test_a_network_with_a_channel_shuffle_layer_is_pruned_with_the_shuffled_channels_whole() -> None:
    """torch-pruning does not follow a channel shuffle (it moves channel i of a group to another place): the layer
    it reads keeps its channels whole, so that its groups stay whole, and the rest is cut; each pruned network runs
    and describes (its shuffle a view, a transpose and a reshape of 16 channels)."""
    plan = PruningPlan(_ShuffledBlock(), [3, 16, 16], min_channels=2, network="shuffled")
    for level in (20, 50):
        pruned = plan.prune(level)
        assert pruned.achieved_level == pytest.approx(level, abs=2)
        conv = pruned.module.conv
        assert conv.out_channels == 16 and conv.in_channels < 16 and pruned.module.mix.in_channels == 16
        assert pruned.module(torch.randn(2, 3, 16, 16)).shape == (2, CLASSES)
        desc = describe(pruned.module, [3, 16, 16], name=f"shuffled_l{level}")
        assert [n.attrs["shape"] for n in desc.nodes if n.op == "reshape"] == [[4, 4, 16, 16], [16, 16, 16]]


class _ChannelsLastRMSNorm(nn.Module):
    """An RMS norm over a map's channels, channels last (a weight per channel)."""

    def __init__(self, channels: int) -> None:
        super().__init__()
        self.norm = nn.RMSNorm(channels)

    def forward(self, x):
        return self.norm(x.permute(0, 2, 3, 1)).permute(0, 3, 1, 2)


class _RMSNormBlocks(nn.Module):
    """Three convolutions, the first's output normalised over its channels (channels last), the second's over its
    rows (a weight per column: 8 wide)."""

    def __init__(self) -> None:
        super().__init__()
        self.c1, self.n1 = nn.Conv2d(3, 16, 3, padding=1), _ChannelsLastRMSNorm(16)
        self.c2, self.n2 = nn.Conv2d(16, 16, 3, padding=1), nn.RMSNorm(8)
        self.c3 = nn.Conv2d(16, 16, 3, padding=1)
        self.head = nn.Sequential(nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(16, CLASSES))

    def forward(self, x):
        return self.head(self.c3(torch.relu(self.n2(self.c2(torch.relu(self.n1(self.c1(x))))))))


def test_a_network_with_rms_norms_is_pruned_through_them() -> None:
    """torch-pruning has no pruner of RMS norms: the channels an RMS norm reads were left whole (a cut of them left
    its weight whole, and the network did not run). An RMS norm over a map's channels (channels last: a weight per
    channel) now loses the channels cut with the convolution before it, and one over a map's rows (a weight per
    column) passes them on; the parameters of a cut are counted without a cut copy, as exactly as on one. Each pruned
    network runs and describes, its norms' shapes as cut."""
    from perf4sight.networks import prune_plan as pp
    from perf4sight.networks.pruning import count_parameters

    plan = PruningPlan(_RMSNormBlocks(), [3, 8, 8], min_channels=2, network="rms")
    assert "pruning_unpruned_groups" not in plan.extra
    counter = pp.make_counter(plan.groups, plan._meta)
    for counts in ([3, 0, 0], [0, 5, 0], [2, 4, 6]):
        cut = pp.cut(plan._meta, pp.removal(plan.groups, counts))
        assert counter(counts) == plan.p0 - count_parameters(cut) > 0
    pruned = plan.prune(plan.prune(40, meta=True).achieved_level)
    m = pruned.module
    assert m.c1.out_channels < 16 and m.n1.norm.weight.shape == (m.c1.out_channels,) == m.n1.norm.normalized_shape
    assert m.c2.out_channels < 16 and m.n2.weight.shape == (8,) and m.c3.in_channels == m.c2.out_channels
    assert pruned.params == sum(p.numel() for p in m.parameters())
    assert m(torch.randn(2, 3, 8, 8)).shape == (2, CLASSES)
    desc = describe(m, [3, 8, 8], name="rms_l40")
    assert [n.attrs["normalized_shape"] for n in desc.nodes if n.op == "rmsnorm"] == [[m.c1.out_channels], [8]]


class _TiledChannels(nn.Module):
    """A convolution's channels tiled twice (x.repeat(1, 2, 1, 1)) into the next, then a third convolution."""

    def __init__(self) -> None:
        super().__init__()
        self.c1, self.c2 = nn.Conv2d(3, 8, 3, padding=1), nn.Conv2d(16, 16, 3, padding=1)
        self.c3 = nn.Conv2d(16, 16, 3, padding=1)
        self.head = nn.Sequential(nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(16, CLASSES))

    def forward(self, x):
        return self.head(self.c3(torch.relu(self.c2(torch.relu(self.c1(x)).repeat(1, 2, 1, 1)))))


def test_a_network_with_a_repeat_over_channels_is_pruned_with_the_tiled_channels_whole() -> None:
    """A repeat over the channels ties channel i of its input to channels i and i + C of its output, which
    torch-pruning does not follow (a cut of them does not run): those channels stay whole, with a note, and the
    rest is cut, in the module and in the one rebuilt from its description. Each pruned network runs and describes,
    its repeat as it was."""
    for module in (_TiledChannels(), build_module(describe(_TiledChannels(), [3, 8, 8], name="tiled"))):
        plan = PruningPlan(module, [3, 8, 8], min_channels=2, network="tiled")
        assert plan.extra["pruning_unpruned_groups"]
        pruned = plan.prune(plan.prune(30, meta=True).achieved_level)
        m = pruned.module
        assert (m.c1.out_channels, m.c2.in_channels) == (8, 16) and m.c3.out_channels < 16
        assert m(torch.randn(2, 3, 8, 8)).shape == (2, CLASSES)
        desc = describe(m, [3, 8, 8], name="tiled_l30")
        assert [(n.attrs["repeats"], n.output_shape) for n in desc.nodes if n.op == "repeat"] == [([2, 1, 1],
                                                                                                   [16, 8, 8])]


def test_a_network_with_rrelus_is_pruned_through_them() -> None:
    """An RReLU keeps no weights: its channels are cut with the convolution before it, in place or not, and the pruned
    network runs and describes."""
    module = nn.Sequential(nn.Conv2d(3, 16, 3, padding=1), nn.RReLU(), nn.Conv2d(16, 16, 3, padding=1),
                           nn.RReLU(0.1, 0.3, inplace=True), nn.AdaptiveAvgPool2d(1), nn.Flatten(),
                           nn.Linear(16, CLASSES))
    plan = PruningPlan(module, [3, 8, 8], min_channels=2, network="rrelu")
    assert "pruning_unpruned_groups" not in plan.extra
    pruned = plan.prune(plan.prune(40, meta=True).achieved_level)
    assert pruned.module[0].out_channels < 16 and pruned.module[2].out_channels < 16
    assert pruned.module(torch.randn(2, 3, 8, 8)).shape == (2, CLASSES)
    desc = describe(pruned.module, [3, 8, 8], name="rrelu_l40")
    assert [n.output_shape[0] for n in desc.nodes if n.op == "rrelu"] == [pruned.module[0].out_channels,
                                                                           pruned.module[2].out_channels]


def test_a_self_normalising_network_with_alpha_dropouts_is_pruned_through_them() -> None:
    """Alpha dropouts keep no weights (a channel dropout's noise is drawn per step): their channels are cut with the
    convolution before them, and the pruned network runs and describes."""
    module = nn.Sequential(nn.Conv2d(3, 16, 3, padding=1), nn.SELU(), nn.AlphaDropout(0.1),
                           nn.Conv2d(16, 16, 3, padding=1), nn.SELU(), nn.FeatureAlphaDropout(0.1),
                           nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(16, CLASSES))
    plan = PruningPlan(module, [3, 8, 8], min_channels=2, network="snn")
    assert "pruning_unpruned_groups" not in plan.extra
    pruned = plan.prune(plan.prune(40, meta=True).achieved_level)
    assert pruned.module[0].out_channels < 16 and pruned.module[3].out_channels < 16
    assert pruned.module.train()(torch.randn(2, 3, 8, 8)).shape == (2, CLASSES)
    desc = describe(pruned.module, [3, 8, 8], name="snn_l40")
    assert [n.output_shape[0] for n in desc.nodes if n.op == "alpha_dropout"] == [pruned.module[0].out_channels,
                                                                                   pruned.module[3].out_channels]


def test_cache_file_reads_perf4sight_once_and_a_users_code_file_at_each_call(tmp_path):
    """cache_file keeps perf4sight's own sources and the library versions for the process (a search over levels
    asks it of each level), but a code file of the user's is read at each call: editing it changes the key."""
    from perf4sight.networks.zoo import cache_file

    user = tmp_path / "factory.py"
    user.write_text("def net(): pass\n")
    first = cache_file(tmp_path, "net_l5", [3, 32, 32], 10, packages=("torch-pruning",), settings=(1,), code=(user,))
    assert first == cache_file(tmp_path, "net_l5", [3, 32, 32], 10, packages=("torch-pruning",), settings=(1,),
                               code=(user,))
    user.write_text("def net(): return 1\n")
    edited = cache_file(tmp_path, "net_l5", [3, 32, 32], 10, packages=("torch-pruning",), settings=(1,), code=(user,))
    assert first is not None and edited is not None and edited != first
    assert cache_file(tmp_path, "net_l5", [3, 32, 32], 10, packages=("no-such-package-here",)) is None
