"""Frozen parameters (``requires_grad`` False: a backbone fine-tuned by its head) in the prediction: no gradient and
no optimiser state for them, no autograd node for an op none of whose inputs needs a gradient (a frozen stem), no
weight-gradient kernels; what a linear layer of a frozen weight keeps is what torch keeps (``features/frozen.py``)."""
from __future__ import annotations

import pytest
import torch
from torch import nn
from torch.utils.flop_counter import FlopCounterMode

from perf4sight.features.aggregate import TRAINED_PARAM_BYTES, features_for, network_features
from perf4sight.features.alloc_trace import record_events, record_runs
from perf4sight.features.latency_terms import GEMM, kernel_table
from perf4sight.ir.from_torch import describe
from test_allocator import _as_replayed


class _Net(nn.Module):
    """A stem (conv, batch norm, ReLU in place), a middle block of the same, a pool and a linear head."""

    def __init__(self) -> None:
        super().__init__()
        self.a, self.an = nn.Conv2d(3, 8, 3, padding=1, bias=False), nn.BatchNorm2d(8)
        self.b, self.bn = nn.Conv2d(8, 16, 3, stride=2, padding=1), nn.BatchNorm2d(16)
        self.fc = nn.Linear(16, 10)

    def forward(self, x):
        x = torch.relu_(self.an(self.a(x)))
        x = torch.relu_(self.bn(self.b(x)))
        return self.fc(torch.flatten(nn.functional.adaptive_avg_pool2d(x, 1), 1))


def _frozen(kind: str) -> nn.Module:
    """``_Net`` with ``kind`` frozen: nothing, the ``stem``, the ``middle`` block (its input needs a gradient), all
    but the ``head``, or ``parts`` (the middle conv's weight, its bias trained; the head's weight, its bias trained)."""
    torch.manual_seed(0)
    net = _Net()
    frozen = {"whole": [], "stem": [net.a, net.an], "middle": [net.b, net.bn], "head": [net.a, net.an, net.b, net.bn],
              "parts": [net.b.weight, net.fc.weight]}[kind]
    for m in frozen:
        m.requires_grad_(False)
    return net


KINDS = ("whole", "stem", "middle", "head", "parts")


@pytest.fixture(scope="module")
def described():
    return {k: (_frozen(k), describe(_frozen(k), [3, 8, 8], f"net_{k}")) for k in KINDS}


def test_the_description_names_what_is_frozen(described):
    assert "frozen_layers" not in described["whole"][1].extra
    assert described["head"][1].extra["frozen_layers"] == ["a", "an", "b", "bn"]
    assert described["parts"][1].extra["frozen_parameters"] == ["b.weight", "fc.weight"]


@pytest.mark.parametrize("kind", KINDS)
def test_the_allocation_model_writes_down_torch_s_events_of_a_frozen_network(described, kind):
    """The events the model writes down are those torch's own step makes on the meta device (the trace rebuilds the
    module frozen), and the model, not the trace, wrote them."""
    desc = described[kind][1]
    assert record_runs(desc, (3,), steps=3, model_only=True) is not None
    model, traced = record_events(desc, 3, steps=3, method="model"), record_events(desc, 3, steps=3, method="trace")
    assert len(model) > 30 and _as_replayed(model) == _as_replayed(traced)


@pytest.mark.parametrize("kind", KINDS)
def test_trained_parameters_and_update_kernels_are_those_torch_s_optimiser_updates(described, kind):
    net, desc = described[kind]
    nf = network_features(desc)
    trained = [p for p in net.parameters() if p.requires_grad]
    assert nf.static[TRAINED_PARAM_BYTES] == 4 * sum(p.numel() for p in trained)
    opt = torch.optim.SGD(trained, lr=0.1, momentum=0.9)
    nn.functional.cross_entropy(net(torch.randn(2, 3, 8, 8)), torch.tensor([1, 2])).backward()
    opt.step()
    assert nf.kernels.param_tensors == len(opt.state) == len(trained)


@pytest.mark.parametrize("kind", KINDS)
def test_the_gemm_work_is_torch_s_counted_forward_and_backward(described, kind):
    """The kernel table's GEMM MACs are the MACs torch's flop counter counts for the step's forward and backward:
    no weight gradient of a frozen weight, no backward at all below the first trained layer."""
    net, desc = described[kind]
    with FlopCounterMode(display=False) as counter:
        out = net(torch.randn(2, 3, 8, 8))
        out.sum().backward() if out.requires_grad else None
    kt = kernel_table(desc)
    gemm = kt.kind == GEMM
    dims = kt.dims[gemm].copy()
    rows = kt.batch_dim[gemm]
    dims[rows >= 0, rows[rows >= 0]] *= 2  # at batch 2
    assert counter.get_total_flops() == pytest.approx(2 * dims.prod(axis=1).sum())


def test_frozen_layers_cut_memory_and_backward_work_as_torch_skips_them(described):
    """The head alone trained keeps only the head's input for backward (the frozen stem and middle block make no
    autograd node) and runs a GEMM forward per layer and the head's weight gradient alone."""
    whole, head = (features_for(network_features(described[k][1]), 4) for k in ("whole", "head"))
    assert head["saved_bytes"] == 4 * 16 * 4 < whole["saved_bytes"]
    assert head["kernels_bwd"] == 2 and head["flops_bwd"] == 2 * 16 * 10 * 4 + 10 * 4
    assert head["mem_analytic_mb"] < whole["mem_analytic_mb"]


def test_predict_notes_which_frozen_parameters_it_leaves_untrained(described):
    """A description that names its frozen layers is predicted with them untrained, from a fingerprint of networks
    trained whole (said); an older one, ``frozen_params`` alone, is predicted trained whole (said too)."""
    import copy

    from perf4sight.fingerprint.predict import parameter_notes
    head = described["head"][1]
    older = copy.deepcopy(head)
    del older.extra["frozen_layers"]
    older.name = "older"
    named, unnamed = parameter_notes([head, older, described["whole"][1]])
    assert named.startswith("frozen parameters (requires_grad False): net_head 1,432; the prediction trains the others "
                            "alone") and "expect larger errors" in named and "older" not in named
    assert unnamed.startswith("frozen parameters (requires_grad False): older 1,432; the description names none of "
                              "them")
    assert network_features(older).static[TRAINED_PARAM_BYTES] == 4 * (216 + 16 + 1168 + 32 + 170)


class _Shared(nn.Module):
    """A stem, one linear layer called twice on the pooled map (its calls summed), a head."""

    def __init__(self) -> None:
        super().__init__()
        self.a, self.mlp, self.fc = nn.Conv2d(3, 8, 3, padding=1), nn.Linear(8, 8), nn.Linear(8, 10)

    def forward(self, x):
        h = torch.flatten(nn.functional.adaptive_avg_pool2d(self.a(x), 1), 1)
        return self.fc(self.mlp(h) + self.mlp(h * 2.0))


def test_a_frozen_layer_called_twice_sums_no_gradients():
    """A shared layer (called twice) that is frozen gets no gradient from either call: no sums of them in the step's
    kernels, and the allocation model writes down torch's events."""
    from perf4sight.features.optimizers import optimizer_cost
    torch.manual_seed(0)
    net = _Shared()
    whole = describe(net, [3, 8, 8], "shared")
    trained = features_for(network_features(whole), 2)
    net.mlp.requires_grad_(False)
    desc = describe(net, [3, 8, 8], "shared_frozen")
    frozen = features_for(network_features(desc), 2)
    # two tensors' sums (weight, bias), and their two gradients each way (weight's GEMM, bias's reduction) per call
    assert trained["kernels_bwd"] - frozen["kernels_bwd"] == 2 + 2 * 2
    update = 2 * optimizer_cost("sgd").kernels_per_tensor  # and the two tensors' updates
    assert kernel_table(whole).launches - kernel_table(desc).launches == 2 + 2 * 2 + update
    assert _as_replayed(record_events(desc, 3, steps=3, method="model")) == \
        _as_replayed(record_events(desc, 3, steps=3, method="trace"))


def test_an_in_place_relu_on_a_map_that_needs_no_gradient_is_written_down():
    """A ReLU in place on the network input (or a frozen stem's map) runs with no autograd node and keeps nothing:
    the allocation model writes it down (it was left to the trace) with torch's events."""
    torch.manual_seed(0)
    net = nn.Sequential(nn.ReLU(inplace=True), nn.Conv2d(3, 8, 3), nn.ReLU(inplace=True), nn.Flatten(),
                        nn.Linear(8 * 6 * 6, 10))
    desc = describe(net, [3, 8, 8], "relu_first")
    assert record_runs(desc, (3,), steps=3, model_only=True) is not None
    assert _as_replayed(record_events(desc, 3, steps=3, method="model")) == \
        _as_replayed(record_events(desc, 3, steps=3, method="trace"))


def _cnn(width: int, depth: int) -> nn.Module:
    """``depth`` 3x3 convolutions of ``width`` channels with batch norms and ReLUs, pooled, one linear layer."""
    layers: list[nn.Module] = []
    cin = 3
    for _ in range(depth):
        layers += [nn.Conv2d(cin, width, 3, padding=1), nn.BatchNorm2d(width), nn.ReLU()]
        cin = width
    return nn.Sequential(*layers, nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(width, 10))


@pytest.fixture(scope="module")
def fingerprint(tmp_path_factory):
    """A fingerprint fitted on 6 small real CNNs trained whole, their step times following their FLOPs."""
    from perf4sight.config import FingerprintConfig
    from perf4sight.fingerprint import fit_fingerprint, load_fingerprint
    torch.manual_seed(0)
    descs, rows = {}, []
    for family, depth in (("shallow", 1), ("deep", 3)):
        for width in (4, 8, 16):
            name = f"{family}_w{width}"
            descs[name] = describe(_cnn(width, depth), [3, 16, 16], name=name, network=family)
            for b in (1, 4, 16):
                f = features_for(descs[name], b)
                rows.append({"device": "cpu0", "backend": "cpu", "network": name, "family": family, "batch_size": b,
                             "status": "ok", "latency_ms_median": 2.0 + f["flops_total"] / 2e6,
                             "peak_rss_mb": 20.0 + 40.0 * f["mem_analytic_mb"]})
    out = tmp_path_factory.mktemp("frozen") / "cpu0"
    fit_fingerprint(rows, descs, "cpu0", out, FingerprintConfig(n_estimators=10))
    return load_fingerprint(out)


def test_a_frozen_network_s_step_time_is_of_the_forms_that_count_its_kernels(fingerprint):
    """The step-time mean of a frozen network's rows is that of the members whose terms count the step's kernels
    (kernel-table terms, which leave a frozen layer's backward out): the others, of forward work fitted on networks
    trained whole, would carry the whole backward (on this CPU's resnet18 with all but fc frozen, 0.17-0.35 of the
    whole network's step against about 1.0 for those). A network trained whole is predicted as before."""
    from perf4sight.features.aggregate import feature_matrix
    from perf4sight.fingerprint.trees import MeanModel, geometric_mean, sees_backward
    model = fingerprint.models["latency"]
    assert isinstance(model, MeanModel)
    kinds = [sees_backward(m.terms) for m in model.members]
    assert any(kinds) and not all(kinds)
    torch.manual_seed(0)
    net = _cnn(8, 3)
    whole = describe(net, [3, 16, 16], name="deep_w8", network="deep")
    for m in list(net)[:6]:  # the first two blocks frozen, the third and the head trained
        m.requires_grad_(False)
    frozen = describe(net, [3, 16, 16], name="deep_w8", network="deep")
    rows = fingerprint.predict([whole, frozen], [4])
    F = feature_matrix([network_features(frozen, fingerprint.runtime)], [4])
    trees = model.trees_for(["deep"])
    seeing = geometric_mean([m.predict(F, trees) for m, sees in zip(model.members, kinds) if sees])
    assert rows[1]["latency_ms"] == pytest.approx(float(seeing[0]), rel=1e-3)
    assert rows[1]["latency_ms"] < model.predict(F, trees)[0] and rows[1]["latency_ms"] < rows[0]["latency_ms"]
    Fw = feature_matrix([network_features(whole, fingerprint.runtime)], [4])
    assert rows[0]["latency_ms"] == pytest.approx(float(model.predict(Fw, trees)[0]), rel=1e-3)


class _Tokens(nn.Module):
    """A transformer's pieces: a patch conv and a group norm, a class token and a position embedding, a layer norm, a
    linear layer on 3-D input with a bias and one without, a layer scale, a linear head."""

    def __init__(self) -> None:
        super().__init__()
        self.patch, self.gn = nn.Conv2d(3, 16, 4, stride=4), nn.GroupNorm(4, 16)
        self.cls, self.pos = nn.Parameter(torch.zeros(1, 1, 16)), nn.Parameter(torch.zeros(1, 5, 16))
        self.ln, self.fc1, self.fc2 = nn.LayerNorm(16), nn.Linear(16, 32, bias=False), nn.Linear(32, 16)
        self.gamma, self.head = nn.Parameter(torch.ones(16)), nn.Linear(16, 10)

    def forward(self, x):
        x = self.gn(self.patch(x)).reshape(x.shape[0], 4, 16)
        x = torch.cat([self.cls.expand(x.shape[0], -1, -1), x], dim=1) + self.pos
        x = x + self.gamma * self.fc2(nn.functional.gelu(self.fc1(self.ln(x))))
        return self.head(x[:, 0])


def _tokens(kind: str) -> nn.Module:
    torch.manual_seed(0)
    net = _Tokens()
    frozen = {"head": [net.patch, net.gn, net.ln, net.fc1, net.fc2, net.cls, net.pos, net.gamma],
              "stem": [net.patch, net.gn, net.cls, net.pos], "middle": [net.ln, net.fc1, net.fc2, net.gamma],
              "parts": [net.ln.weight, net.fc1.weight, net.fc2.bias]}[kind]
    for m in frozen:
        m.requires_grad_(False)
    return net


@pytest.mark.parametrize("kind", ("head", "stem", "middle", "parts"))
def test_frozen_norms_tokens_scales_and_linear_layers_of_3_d_input_are_written_down(kind):
    """Frozen layer norms, group norms, class tokens, position embeddings, layer scales and linear layers of 3-D input
    (a ViT's or a ConvNeXt's, fine-tuned by its head) are written down by the allocation model, with the meta trace's
    events: a frozen weight takes no gradient, and a layer scale or a linear layer of a frozen weight keeps no input."""
    desc = describe(_tokens(kind), [3, 8, 8], f"tokens_{kind}")
    assert record_runs(desc, (2,), steps=2, model_only=True) is not None
    model, traced = record_events(desc, 2, steps=2, method="model"), record_events(desc, 2, steps=2, method="trace")
    assert len(model) > 100 and _as_replayed(model) == _as_replayed(traced)


def test_prune_to_fit_of_a_network_whose_prunable_layers_are_all_frozen_answers_none(fingerprint, tmp_path):
    """A description file whose backbone is frozen whole (its layers kept whole by the pruning) reaches 0% at most:
    --prune-to-fit ended in that error ('cannot reach pruning level 99% ... reaches 0.0% at most') for every network
    asked; now no level meets the limits (only the unpruned one is asked)."""
    from perf4sight.config import load_config
    from perf4sight.fingerprint.pruning_search import least_prunings
    from perf4sight.ir.schema import save_description
    from perf4sight.networks.on_request import LevelVariants
    torch.manual_seed(0)
    net = _cnn(8, 3)
    for m in list(net)[:9]:  # every conv and batch norm frozen: the head alone trained
        m.requires_grad_(False)
    save_description(describe(net, [3, 16, 16], name="backbone", network="backbone"), tmp_path / "backbone.json")
    (tmp_path / "config.toml").write_text('[networks]\nzoo = []\ndescription_files = ["backbone.json"]\n'
                                          'input_shape = [3, 16, 16]\nnum_classes = 10\n')
    variant = LevelVariants(load_config(tmp_path / "config.toml"), "backbone", [3, 16, 16])
    slow, fast = least_prunings(fingerprint, variant, [4, 8], max_latency_ms=1e-6)
    assert slow.level is None and slow.variant is None and slow.tried == {0: False} == fast.tried
    met = least_prunings(fingerprint, variant, [4], max_latency_ms=1e6)[0]
    assert met.level == 0 and met.variant.extra["frozen_layers"]


class _Attending(nn.Module):
    """A patch conv, a layer norm, an ``nn.MultiheadAttention`` (batch first) with its residual, a mean and a head."""

    def __init__(self) -> None:
        super().__init__()
        self.patch, self.ln = nn.Conv2d(3, 16, 4, stride=4), nn.LayerNorm(16)
        self.att, self.head = nn.MultiheadAttention(16, 2, batch_first=True), nn.Linear(16, 10)

    def forward(self, x):
        x = self.patch(x).reshape(x.shape[0], 4, 16)
        y = self.ln(x)
        return self.head((x + self.att(y, y, y, need_weights=False)[0]).mean(1))


@pytest.mark.parametrize("kind", ("attention", "head"))
def test_a_frozen_attention_is_written_down(kind):
    """An attention frozen whole is written down with the meta trace's events: where its input needs a gradient, the
    packed projection of the transposed input is torch's bmm of the weight expanded (its matmul folds no strided input
    it would copy when the weight needs no gradient) and the output projection keeps no input; where nothing needs one
    (a ViT fine-tuned by its head), no node, the kernel's log-sum-exp of 0 bytes and its result freed once copied."""
    torch.manual_seed(0)
    net = _Attending()
    for m in [net.att] if kind == "attention" else [net.patch, net.ln, net.att]:
        m.requires_grad_(False)
    desc = describe(net, [3, 8, 8], f"attending_{kind}")
    assert record_runs(desc, (2,), steps=2, model_only=True) is not None
    model, traced = record_events(desc, 3, steps=2, method="model"), record_events(desc, 3, steps=2, method="trace")
    assert len(model) > 100 and _as_replayed(model) == _as_replayed(traced)


def _dispatched(net: nn.Module, batch: int, shape: tuple[int, ...] = (3, 8, 8)) -> tuple[list[str], list[str]]:
    """The aten kernels (views left out) torch runs for ``net``'s forward and its backward at ``batch`` of
    ``shape``."""
    from torch.utils._python_dispatch import TorchDispatchMode

    class _Ops(TorchDispatchMode):
        def __init__(self) -> None:
            super().__init__()
            self.ops: list[str] = []

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            if func is not torch.ops.aten._unsafe_view.default and not any(  # views (and a copy's result viewed)
                    r.alias_info is not None for r in func._schema.returns):
                self.ops.append(str(func))
            return func(*args, **(kwargs or {}))

    torch.manual_seed(0)
    x = torch.randn(batch, *shape)
    with _Ops() as fwd:
        out = net(x)
    with _Ops() as bwd:
        out.sum().backward()
    return fwd.ops, bwd.ops


def test_a_frozen_attention_s_features_leave_its_weight_gradients_out():
    """An attention frozen whole whose input needs a gradient computes that gradient alone: two GEMMs and two
    reductions fewer back (its projections' weight and bias gradients) and its input not copied forward, as torch
    runs it; the kernel table's GEMM work falls by what torch's flop counter counts."""
    torch.manual_seed(0)
    net = _Attending()
    whole = describe(net, [3, 8, 8], "attending")
    counted = []
    for frozen in (False, True):
        net.att.requires_grad_(not frozen)
        with FlopCounterMode(display=False) as counter:
            net(torch.randn(2, 3, 8, 8)).sum().backward()
        counted.append((counter.get_total_flops(), *map(len, _dispatched(net, 2))))
    desc = describe(net, [3, 8, 8], "attending_frozen")
    assert desc.extra["frozen_layers"] == ["att"]
    f, w = features_for(network_features(desc), 2), features_for(network_features(whole), 2)
    assert (w["kernels_fwd"] - f["kernels_fwd"], w["kernels_bwd"] - f["kernels_bwd"]) == \
        (counted[0][1] - counted[1][1], counted[0][2] - counted[1][2]) == (1, 4)
    assert w["saved_bytes"] - f["saved_bytes"] == 4 * 16 * 4 * 2  # the copy of the input the projection kept

    def gemm_flops(d):
        kt = kernel_table(d)
        gemm = kt.kind == GEMM
        dims = kt.dims[gemm].copy()
        rows = kt.batch_dim[gemm]
        dims[rows >= 0, rows[rows >= 0]] *= 2
        return 2 * dims.prod(axis=1).sum()
    assert counted[0][0] > counted[1][0]  # and the biases' reductions, an add an output element each (4 tokens of 16)
    assert w["flops_bwd"] - f["flops_bwd"] == pytest.approx(counted[0][0] - counted[1][0] + 4 * 4 * 16 * 2)
    assert gemm_flops(whole) - gemm_flops(desc) == pytest.approx(counted[0][0] - counted[1][0])


class _Mixer(nn.Module):
    """A patch conv, then an MLP-Mixer's token mixing: the tokens transposed (a view that does not fold into rows) and
    a linear layer across them; a mean and a head."""

    def __init__(self) -> None:
        super().__init__()
        self.patch, self.mix, self.head = nn.Conv2d(3, 16, 4, stride=4), nn.Linear(4, 4), nn.Linear(16, 10)

    def forward(self, x):
        x = self.patch(x).reshape(x.shape[0], 4, 16)
        return self.head(self.mix(x.transpose(1, 2)).mean(2))


def test_a_linear_layer_of_a_frozen_weight_copies_no_strided_rows():
    """torch's matmul copies a strided input into rows (and keeps the copy) only where the weight needs a gradient;
    a frozen weight's is multiplied in place (bmm of the weight expanded), nothing copied or kept. The features
    counted the copy whatever was frozen: one kernel forward and its bytes kept, where torch runs and keeps neither."""
    torch.manual_seed(0)
    net = _Mixer()
    whole = describe(net, [3, 8, 8], "mixer")
    ran = [_dispatched(net, 2)]
    net.mix.weight.requires_grad_(False)
    ran.append(_dispatched(net, 2))
    desc = describe(net, [3, 8, 8], "mixer_frozen")
    assert desc.extra["frozen_parameters"] == ["mix.weight"]
    w, f = features_for(network_features(whole), 2), features_for(network_features(desc), 2)
    assert "aten.clone.default" in ran[0][0] and "aten.clone.default" not in ran[1][0]
    assert w["kernels_fwd"] - f["kernels_fwd"] == len(ran[0][0]) - len(ran[1][0]) == 1
    assert w["kernels_bwd"] - f["kernels_bwd"] == len(ran[0][1]) - len(ran[1][1]) == 1  # the weight's gradient
    assert w["saved_bytes"] - f["saved_bytes"] == 4 * 16 * 4 * 2  # the copy of the rows kept


class _Normed(nn.Module):
    """A conv, a weight-normed or spectral-normed conv (torch's parametrization), a head."""

    def __init__(self, norm: str) -> None:
        super().__init__()
        self.a, self.fc = nn.Conv2d(3, 8, 3, padding=1), nn.Linear(8, 10)
        self.b = getattr(nn.utils.parametrizations, norm)(nn.Conv2d(8, 8, 3, padding=1))

    def forward(self, x):
        return self.fc(torch.relu(self.b(torch.relu(self.a(x)))).mean((2, 3)))


def _kept_bytes(net: nn.Module, batch: int, side: int = 8) -> int:
    """The bytes of the tensors (parameters aside) autograd keeps for ``net``'s backward at ``batch`` (images of
    3 x ``side`` x ``side``)."""
    kept: dict[int, int] = {}

    def pack(t):
        if not isinstance(t, nn.Parameter):
            kept[t.untyped_storage().data_ptr()] = t.untyped_storage().nbytes()
        return t
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        net(torch.randn(batch, 3, side, side))
    return sum(kept.values())


@pytest.mark.parametrize("norm", ("weight_norm", "spectral_norm"))
def test_a_normed_layer_frozen_whole_runs_no_backward_of_its_norm(norm):
    """A weight-normed or spectral-normed layer frozen whole (its input needing a gradient) computes its input's
    gradient alone: torch runs no backward of the norm (one kernel fewer, nine for a spectral norm) and keeps none of
    what the norm kept (the norm per output channel; u, v and sigma), the weight it computes kept by the layer all the
    same; the features counted the norm's backward and what it keeps whatever was frozen."""
    torch.manual_seed(0)
    net = _Normed(norm)
    whole = describe(net, [3, 8, 8], f"{norm}_whole")
    ran, kept = [_dispatched(net, 2)], [2 * _kept_bytes(net, 1) - _kept_bytes(net, 2)]  # kept once a batch
    net.b.requires_grad_(False)
    ran.append(_dispatched(net, 2))
    kept.append(2 * _kept_bytes(net, 1) - _kept_bytes(net, 2))
    desc = describe(net, [3, 8, 8], f"{norm}_frozen")
    assert desc.extra["frozen_layers"] == ["b"]
    w, f = network_features(whole), network_features(desc)
    back = features_for(w, 2)["kernels_bwd"] - features_for(f, 2)["kernels_bwd"]
    # the conv's weight and bias gradients are kernels of their own here, one call of convolution_backward on a CPU
    assert back - 2 == len(ran[0][1]) - len(ran[1][1]) == {"weight_norm": 1, "spectral_norm": 9}[norm]
    assert w.batch_saved_sizes.sum() - f.batch_saved_sizes.sum() == kept[0] - kept[1] > 0


@pytest.mark.parametrize("v2", (False, True))
def test_a_swin_s_frozen_window_attentions_are_named_and_rebuilt_frozen(v2):
    """torchvision's Swin calls ``shifted_window_attention``, a function, with its layer's tensors: a Swin fine-tuned
    by its head counted their parameters frozen (``frozen_params``) but named none of them, so the rebuilt module
    (the profile's step) and the prediction trained them. Its window attentions are now named frozen whole (the layer
    that makes the call has all its parameters frozen)."""
    from torchvision.models.swin_transformer import PatchMergingV2, SwinTransformer, SwinTransformerBlockV2

    from perf4sight.ir.to_torch import build_module
    torch.manual_seed(0)
    parts = {"block": SwinTransformerBlockV2, "downsample_layer": PatchMergingV2} if v2 else {}
    net = SwinTransformer([4, 4], 16, [2, 2], [2, 2], [4, 4], num_classes=10, **parts)
    net.features.requires_grad_(False)
    desc = describe(net, [3, 32, 32], "small_swin")
    windows = [n.name for n in desc.nodes if n.op == "window_attention"]
    assert len(windows) == 4 and set(windows) <= set(desc.extra["frozen_layers"])
    frozen = sum(p.numel() for p in net.parameters() if not p.requires_grad)
    rebuilt = build_module(desc, device="meta")
    assert sum(p.numel() for p in rebuilt.parameters() if not p.requires_grad) == frozen == desc.extra["frozen_params"]
    trained = sum(p.numel() for p in net.parameters() if p.requires_grad)
    assert network_features(desc).static[TRAINED_PARAM_BYTES] == 4 * trained


@pytest.mark.parametrize("kind", ("features", "middle"))
def test_a_swin_s_frozen_window_attentions_are_written_down(kind):
    """A Swin (V1 blocks) with its features frozen, or one stage of them (its attentions' input then needs a
    gradient), is written down by the allocation model with the meta trace's events, where it took the trace."""
    from torchvision.models.swin_transformer import SwinTransformer
    torch.manual_seed(0)
    net = SwinTransformer([4, 4], 16, [2, 2], [2, 2], [4, 4], num_classes=10)
    (net.features if kind == "features" else net.features[1]).requires_grad_(False)
    desc = describe(net, [3, 32, 32], f"small_swin_{kind}")
    assert record_runs(desc, (2,), steps=2, model_only=True) is not None
    model, traced = record_events(desc, 2, steps=2, method="model"), record_events(desc, 2, steps=2, method="trace")
    assert len(model) > 500 and _as_replayed(model) == _as_replayed(traced)


def test_a_swin_stage_frozen_computes_its_input_gradients_alone():
    """A Swin stage frozen whole, its input needing a gradient: its window attentions run no weight, bias or table
    gradient and their projections keep no input, as torch runs them; the features' backward kernels and kept bytes
    fall by what torch's dispatched kernels and saved-tensor hooks do."""
    from torchvision.models.swin_transformer import SwinTransformer
    torch.manual_seed(0)
    net = SwinTransformer([4, 4], 16, [2, 2], [2, 2], [4, 4], num_classes=10)
    whole = describe(net, [3, 32, 32], "small_swin")

    def ran(batch):
        return _kept_bytes(net, batch, 32)

    def flops():
        with FlopCounterMode(display=False) as counter:
            net(torch.randn(2, 3, 32, 32)).sum().backward()
        return counter.get_total_flops()
    before = (len(_dispatched(net, 2, (3, 32, 32))[1]), ran(2) - ran(1), flops())
    net.features[1].requires_grad_(False)
    after = (len(_dispatched(net, 2, (3, 32, 32))[1]), ran(2) - ran(1), flops())
    desc = describe(net, [3, 32, 32], "small_swin_frozen")
    w, f = features_for(network_features(whole), 2), features_for(network_features(desc), 2)
    assert w["kernels_bwd"] - f["kernels_bwd"] == before[0] - after[0] == 22  # 2 x 7 of the attentions, 4 x 2 linear
    assert w["saved_bytes"] - f["saved_bytes"] == 2 * (before[1] - after[1])
    assert _gemm_flops(whole, 2) - _gemm_flops(desc, 2) == pytest.approx(before[2] - after[2])  # the kernel table's


def _gemm_flops(desc, batch: int) -> float:
    """The FLOPs of the GEMMs of ``desc``'s kernel table at ``batch``."""
    kt = kernel_table(desc)
    gemm = kt.kind == GEMM
    dims = kt.dims[gemm].copy()
    rows = kt.batch_dim[gemm]
    dims[rows >= 0, rows[rows >= 0]] *= batch
    return 2 * dims.prod(axis=1).sum()



def _standardised(form: str) -> nn.Module:
    """``_Normed``'s shape with its middle conv weight-standardised as ``form`` (test_ir_research_blocks' layers)."""
    import test_ir_research_blocks as rb
    cls = {"batch_norm": rb._StandardisedByBatchNorm, "std_mean": rb._StandardisedByStdMean,
           "layer_norm": rb._StandardisedByLayerNorm, "scaled batch_norm": rb._ScaledStandardised,
           "scaled std_mean": rb._ScaledByStdMean, "scaled layer_norm": rb._ScaledByLayerNorm}[form]
    torch.manual_seed(0)
    net = _Normed("weight_norm")
    net.b = cls(8, 8, 3, padding=1)
    return net


def _kept_apart_from_parameters(net: nn.Module, batch: int) -> int:
    """``_kept_bytes``, views of a parameter also left out (a standardised weight reshaped for a batch norm)."""
    params = {p.untyped_storage().data_ptr() for p in net.parameters()}
    kept: dict[int, int] = {}

    def pack(t):
        if t.untyped_storage().data_ptr() not in params:
            kept[t.untyped_storage().data_ptr()] = t.untyped_storage().nbytes()
        return t
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        net(torch.randn(batch, 3, 8, 8))
    return sum(kept.values())


@pytest.mark.parametrize("form", ("batch_norm", "std_mean", "layer_norm", "scaled batch_norm", "scaled std_mean",
                                  "scaled layer_norm"))
def test_a_standardised_layer_frozen_whole_runs_no_backward_of_its_standardisation(form):
    """A weight-standardised conv (ScaledStdConv2d's gain too) frozen whole, its input needing a gradient, runs no
    backward of the standardisation (nor of the gain) and keeps none of what it kept but the weight the conv reads;
    the features counted that backward (18-23 kernels of a std_mean spelling) and those tensors whatever was frozen."""
    from perf4sight.features.formulas import STANDARDIZE_KERNELS
    from perf4sight.features.optimizers import optimizer_cost
    net = _standardised(form)
    whole = describe(net, [3, 8, 8], "std_whole")
    ran, kept = [_dispatched(net, 2)], [2 * _kept_apart_from_parameters(net, 1) - _kept_apart_from_parameters(net, 2)]
    net.b.requires_grad_(False)
    ran.append(_dispatched(net, 2))
    kept.append(2 * _kept_apart_from_parameters(net, 1) - _kept_apart_from_parameters(net, 2))
    desc = describe(net, [3, 8, 8], "std_frozen")
    assert sorted(desc.extra["frozen_parameters"]) == sorted(f"conv2d.{n}" for n, _ in net.b.named_parameters())
    w, f = network_features(whole), network_features(desc)
    back = features_for(w, 2)["kernels_bwd"] - features_for(f, 2)["kernels_bwd"]
    gain = {"scaled batch_norm": 1, "scaled std_mean": 4, "scaled layer_norm": 4}.get(form, 0)
    # the conv's weight and bias gradients are kernels of their own here, one call of convolution_backward on a CPU;
    # std_mean's backward counted 19 where this log runs 18 (its table's count, of a first layer's dispatch log)
    assert back - 2 == STANDARDIZE_KERNELS[form.split()[-1]][1] + gain
    assert abs(back - 2 - (len(ran[0][1]) - len(ran[1][1]))) <= (1 if "std_mean" in form else 0)
    assert w.batch_saved_sizes.sum() - f.batch_saved_sizes.sum() == kept[0] - kept[1] > 0
    kw, kf = kernel_table(whole), kernel_table(desc)  # the same kernels listed back, and the tensors' updates
    update = (kw.param_tensors - kf.param_tensors) * optimizer_cost("sgd").kernels_per_tensor
    assert kw.launches - kf.launches == back + update


@pytest.mark.filterwarnings("ignore::FutureWarning")  # torch.nn.utils.weight_norm, the older of the two
@pytest.mark.parametrize("how, part", [("weight_norm", "original1"), ("weight_norm", "original0"),
                                       ("spectral_norm", "original"), ("hook weight_norm", "weight_v"),
                                       ("hook spectral_norm", "weight_orig")])
def test_a_normed_layer_s_frozen_part_is_untrained_in_the_features(how, part):
    """A weight-normed layer's g or v, or a spectral-normed layer's weight, frozen (its bias trained) gets no gradient
    and no optimiser state: the description counted it frozen (frozen_params) while the features took it as trained
    (its size unknown by its name), so the trained bytes and the update kernels were the whole layer's."""
    torch.manual_seed(0)
    net = _Normed("weight_norm")
    conv = nn.Conv2d(8, 8, 3, padding=1)
    net.b = getattr(nn.utils, how.split()[1])(conv) if how.startswith("hook") else \
        getattr(nn.utils.parametrizations, how)(conv)
    whole = describe(net, [3, 8, 8], "normed_whole")
    ran, kept = [_dispatched(net, 2)], [2 * _kept_bytes(net, 1) - _kept_bytes(net, 2)]
    for name, p in net.b.named_parameters():
        if name.endswith(part):
            p.requires_grad_(False)
    ran.append(_dispatched(net, 2))
    kept.append(2 * _kept_bytes(net, 1) - _kept_bytes(net, 2))
    desc = describe(net, [3, 8, 8], "normed_part")
    assert len(desc.extra["frozen_parameters"]) == 1 and desc.extra["frozen_parameters"][0].endswith(part)
    nf = network_features(desc)
    trained = [p for p in net.parameters() if p.requires_grad]
    opt = torch.optim.SGD(trained, lr=0.1, momentum=0.9)
    nn.functional.cross_entropy(net(torch.randn(2, 3, 8, 8)), torch.tensor([1, 2])).backward()
    opt.step()
    assert nf.static[TRAINED_PARAM_BYTES] == 4 * sum(p.numel() for p in trained)
    assert nf.kernels.param_tensors == len(opt.state) == len(trained)
    # a spectral norm's weight frozen: no weight gradient (a kernel of its own here, in convolution_backward on a CPU)
    # nor the norm's backward (9), nor what the norm kept; g or v alone: the weight's gradient and the norm's as before
    back = features_for(network_features(whole), 2)["kernels_bwd"] - features_for(nf, 2)["kernels_bwd"]
    weight = "spectral" in how
    assert back - weight == len(ran[0][1]) - len(ran[1][1]) == (9 if weight else 0)
    assert network_features(whole).batch_saved_sizes.sum() - nf.batch_saved_sizes.sum() == kept[0] - kept[1]


@pytest.mark.parametrize("form", ("scaled batch_norm", "scaled layer_norm"))
@pytest.mark.parametrize("parts", ("gain", "weight", "gain weight"))
def test_a_scaled_standardised_conv_s_frozen_gain_or_weight_is_what_torch_leaves_untrained(form, parts):
    """ScaledStdConv2d's gain frozen alone was taken as trained, and its weight frozen alone counted the gain frozen
    with it (the weight's size was the layer's parameters but the bias's): the trained bytes and updated tensors are
    torch's optimiser's. Both frozen (the bias trained), the standardisation and the gain run nothing back and keep
    nothing but the weight the conv reads, as frozen whole."""
    net = _standardised(form)
    whole = describe(net, [3, 8, 8], "scaled_whole")
    ran, kept = [_dispatched(net, 2)], [2 * _kept_apart_from_parameters(net, 1) - _kept_apart_from_parameters(net, 2)]
    for part in parts.split():
        getattr(net.b, part).requires_grad_(False)
    ran.append(_dispatched(net, 2))
    kept.append(2 * _kept_apart_from_parameters(net, 1) - _kept_apart_from_parameters(net, 2))
    desc = describe(net, [3, 8, 8], "scaled_part")
    assert desc.extra["frozen_parameters"] == [f"conv2d.{part}" for part in parts.split()]
    nf = network_features(desc)
    trained = [p for p in net.parameters() if p.requires_grad]
    assert nf.static[TRAINED_PARAM_BYTES] == 4 * sum(p.numel() for p in trained)
    assert nf.kernels.param_tensors == len(trained)
    if parts == "gain weight":  # the weight's gradient a kernel of its own here, in convolution_backward on a CPU
        w = network_features(whole)
        back = features_for(w, 2)["kernels_bwd"] - features_for(nf, 2)["kernels_bwd"]
        assert back - 1 == len(ran[0][1]) - len(ran[1][1]) > 1
        assert w.batch_saved_sizes.sum() - nf.batch_saved_sizes.sum() == kept[0] - kept[1] > 0
