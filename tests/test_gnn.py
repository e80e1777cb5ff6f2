"""GNN predictor: graph tensors, fit/store/load/predict on tiny real networks, ensemble, safety."""
from __future__ import annotations

import json
import os
import pickle
import warnings
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
import torch
from torch import nn

from perf4sight.config import FingerprintConfig, ProfileConfig
from perf4sight.errors import UserError
from perf4sight.features.aggregate import features_for
from perf4sight.fingerprint import PREDICTION_KEYS, fit_fingerprint
from perf4sight.fingerprint.gnn import (GNN_JSON, GNN_WEIGHTS, OLD_GNN_WEIGHTS, fit_gnn, gnn_accuracy_lines, load_gnn,
                                        load_predictor)
from perf4sight.fingerprint.gnn_graph import EDGE_FEATURES, NODE_FEATURES, OP_VOCAB, graph_template
from perf4sight.ir.from_torch import describe
from perf4sight.ir.schema import NetworkDescription

BATCHES = (1, 4, 16)


def _net(width: int, depth: int, residual: bool) -> nn.Module:
    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.stem = nn.Sequential(nn.Conv2d(3, width, 3, padding=1), nn.BatchNorm2d(width), nn.ReLU())
            self.blocks = nn.ModuleList(nn.Sequential(nn.Conv2d(width, width, 3, padding=1), nn.ReLU())
                                        for _ in range(depth))
            self.head = nn.Sequential(nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(width, 10))

        def forward(self, x):
            x = self.stem(x)
            for b in self.blocks:
                x = b(x) + x if residual else b(x)
            return self.head(x)
    return Net()


@pytest.fixture(scope="module")
def tiny():
    """3 families x 3 widths of tiny CNNs with synthetic step times and memory that follow their costs."""
    torch.manual_seed(0)
    descs: dict[str, NetworkDescription] = {}
    rows = []
    for fam, (depth, res) in {"plain": (1, False), "deep": (3, False), "res": (2, True)}.items():
        for w in (4, 8, 16):
            name = f"{fam}_w{w}"
            descs[name] = describe(_net(w, depth, res), input_shape=[3, 16, 16], name=name, network=fam)
            for b in BATCHES:
                f = features_for(descs[name], b)
                rows.append({"device": "cpu0", "backend": "cpu", "network": name, "family": fam, "batch_size": b,
                             "status": "ok", "latency_ms_median": 2.0 + f["flops_total"] / 2e6 + 0.1 * f["kernels"],
                             "peak_rss_mb": 20.0 + 40.0 * f["mem_analytic_mb"] ** 1.2})
            rows.append({"device": "cpu0", "backend": "cpu", "network": name, "family": fam, "batch_size": 4096,
                         "status": "oom"})
    return descs, rows


@pytest.fixture(scope="module")
def fitted(tiny, tmp_path_factory):
    descs, rows = tiny
    out = tmp_path_factory.mktemp("gnn") / "cpu0"
    fit_fingerprint(rows, descs, "cpu0", out, FingerprintConfig(n_estimators=10))
    meta = fit_gnn(rows, descs, "cpu0", out, seed=0, arch="seernet", hidden=16, layers=2, max_epochs=60, patience=60,
                   trees_config=FingerprintConfig(n_estimators=10))
    return out, meta


def test_normaliser_drops_columns_constant_in_training():
    """A column constant in the training split (even one whose float32 std is ~1e-6, not 0) becomes 0
    for every value, a value never seen in training included; other columns are standardised."""
    from perf4sight.fingerprint.gnn_forward import Normaliser, standardise
    u = np.column_stack([np.log1p(np.ones(1000, dtype=np.float32)), np.arange(1000, dtype=np.float32)])
    mu, sd = Normaliser._stats(u, 0.0)
    assert sd[0] == 0.0 and sd[1] > 100
    z = standardise(np.array([[0.0, 499.5], [5.0, 0.0]], dtype=np.float32), (mu, sd))
    assert z[0, 0] == 0.0 and z[1, 0] == 0.0 and abs(z[0, 1]) < 1e-6 and z[1, 1] < -1.5
    assert Normaliser._stats(u)[1][0] == 1.0  # targets keep std 1 for a constant column
    # an input that moves by a ten-thousandth over the training rows (a large network's weight-bound total at two
    # batch sizes) is constant there too: standardised, another network's value sat 1e5 of its stds away
    near = np.column_stack([20.6282 + 1e-4 * np.arange(2.0), [0.69, 1.10]])
    graph = SimpleNamespace(x=np.ones((3, 2), dtype=np.float32), edge_attr=np.ones((2, 1), dtype=np.float32))
    norm = Normaliser.fit([graph], near, np.zeros((2, 2)))
    assert norm.u[1][0] == 0.0 and norm.u[1][1] > 0.2
    assert standardise(np.array([[14.07, 0.69]]), norm.u)[0, 0] == 0.0


def test_a_gnn_fitted_on_two_networks_at_two_batch_sizes_stores_a_band_of_sense(tmp_path):
    """Four rows (tests/test_optimizers.py fits such a GNN): each fold trained on one network at batch sizes 1 and
    2, whose weight-bound totals move by 1e-4 in log between them; those columns, standardised with that spread,
    put the other network 1e5 stds out, and its out-of-fold figure came out near e^-670 (or e^+180) of the measured:
    a band of +-838 in log, which made every figure of the fit inf. Such columns are constant now: the band is as
    wide as little data makes it, not absurd, and the GNN's figures are finite."""
    torch.manual_seed(0)
    nets = {"wide": nn.Sequential(nn.Flatten(), nn.Linear(3 * 16 * 16, 2048), nn.ReLU(), nn.Linear(2048, 10)),
            "small": nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.BatchNorm2d(8), nn.ReLU(),
                                   nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(8, 10))}
    descs = {n: describe(m, input_shape=[3, 16, 16], name=n, network=n) for n, m in nets.items()}
    rows = []
    for n, d in descs.items():
        for b in (1, 2):
            f = features_for(d, b)
            rows.append({"device": "cpu0", "backend": "cpu", "network": n, "family": n, "batch_size": b,
                         "status": "ok", "latency_ms_median": 2.0 + f["flops_total"] / 2e6 + 0.1 * f["kernels"],
                         "peak_rss_mb": 600.0 + 40.0 * f["mem_analytic_mb"] ** 1.2})
    meta = fit_gnn(rows, descs, "cpu0", tmp_path, seed=0, hidden=8, layers=1, max_epochs=5, patience=3,
                   trees_config=FingerprintConfig(n_estimators=10))
    bands = meta["interval"]["log_ratio_quantiles"]
    ends = [abs(v) for kind in ("gnn", "ensemble") for t in ("latency", "memory") for v in bands[kind][t]]
    assert max(ends) < 20, bands  # e^20: wide, as 4 rows leave it; before, 214 to 838
    assert all(meta["accuracy"][t]["gnn"]["overall"]["mape"] < 1e4 for t in ("latency", "memory"))
    for p in load_gnn(tmp_path).predict(list(descs.values()), [1, 2]):
        assert all(np.isfinite(p[k]) and p[k] > 0 for k in ("latency_ms_low", "latency_ms_high", "memory_mb_low",
                                                             "memory_mb_high"))


def test_graph_template_shapes(tiny):
    descs, _ = tiny
    d = descs["res_w8"]
    t = graph_template(d)
    n_edges = sum(len(n.inputs) for n in d.nodes)
    assert t.x.shape == (len(d.nodes), len(NODE_FEATURES))
    assert t.edge_index.shape == (2, 2 * n_edges) and t.edge_attr.shape == (2 * n_edges, len(EDGE_FEATURES))
    np.testing.assert_array_equal(t.x[:, :len(OP_VOCAB)].sum(axis=1), 1.0)  # one op each
    assert np.isfinite(t.x).all() and (t.x >= 0).all()
    assert t.edge_attr[:, 1].sum() == n_edges  # half are reverse edges
    assert t.edge_index.max() < len(d.nodes)


def test_the_global_features_stay_as_first_stored():
    """The network totals a GNN reads are the 48 it stored on 2026-11-24, up to ``lt_work_per_launch``: every feature
    appended to FEATURE_NAMES after it is left out (the op price was not, for two days: it failed every older GNN's
    load check and, in new fits, drew other initial weights)."""
    from perf4sight.features.aggregate import FEATURE_NAMES
    from perf4sight.fingerprint.gnn_graph import GLOBAL_FEATURES

    assert len(GLOBAL_FEATURES) == 48 and GLOBAL_FEATURES[-1] == "lt_work_per_launch"
    assert GLOBAL_FEATURES[:3] == ("batch_size", "macs", "dense_macs")
    appended = FEATURE_NAMES[FEATURE_NAMES.index("lt_work_per_launch") + 1:]
    assert "priced_ops_ms" in appended and not set(appended) & set(GLOBAL_FEATURES)


def test_the_op_vocabulary_stays_and_every_schema_op_reads_as_one_of_it():
    """A GNN stores its one-hot vocabulary and refuses another: the vocabulary stays as it was stored before ConvNeXt's
    and ViT's ops joined the schema, which read as their nearest op (so a GNN fitted before still loads)."""
    from perf4sight.fingerprint.gnn_graph import OP_TOKEN
    from perf4sight.ir.schema import OPS
    from perf4sight.networks.zoo import describe_zoo

    assert len(OP_VOCAB) == 29 and set(OP_TOKEN) == set(OPS) and set(OP_TOKEN.values()) <= set(OP_VOCAB)
    desc = describe_zoo("convnext_tiny", [3, 32, 32], num_classes=10)
    t = graph_template(desc)
    norms = [i for i, n in enumerate(desc.nodes) if n.op == "layernorm"]
    assert t.x[norms, OP_VOCAB.index("batchnorm2d")].tolist() == [1.0] * len(norms)
    np.testing.assert_array_equal(t.x[:, :len(OP_VOCAB)].sum(axis=1), 1.0)


def test_fit_writes_json_and_weights(fitted):
    out, meta = fitted
    assert (out / GNN_JSON).is_file() and (out / GNN_WEIGHTS).is_file()
    assert (out / "metadata.json").is_file() and (out / "models.npz").is_file()  # the trees are untouched
    on_disk = json.loads((out / GNN_JSON).read_text())
    assert on_disk["targets"]["memory"]["column"] == "peak_rss_mb"
    assert on_disk["settings"]["arch"] == "seernet" and on_disk["op_vocab"] == list(OP_VOCAB)
    with np.load(out / GNN_WEIGHTS, allow_pickle=False) as state:  # plain arrays, read without torch
        assert state["enc_x.0.weight"].shape == (16, len(NODE_FEATURES))
        assert all(state[k].dtype == np.float32 for k in state.files)
    for target in ("latency", "memory"):
        acc = meta["accuracy"][target]
        assert set(acc["gnn"]["per_group"]) == {"plain", "deep", "res"}
        assert acc["best"] in ("trees", "gnn", "ensemble")
        for k in ("gnn", "trees", "ensemble"):
            assert np.isfinite(acc[k]["overall"]["mape"])
        lo, hi = meta["interval"]["log_ratio_quantiles"]["gnn"][target]
        assert lo <= 0 <= hi
    assert meta["capacity_mb"] is not None
    assert any("ensemble" in line for line in gnn_accuracy_lines(meta))
    # the trees column is the trees fingerprint's own accuracy (its held_out.csv), not a second refit
    trees = json.loads((out / "metadata.json").read_text())["accuracy"]
    for target in ("latency", "memory"):
        assert meta["accuracy"]["trees_source"][target] == "the trees fingerprint's held_out.csv"
        assert meta["accuracy"][target]["trees"]["overall"]["mape"] == pytest.approx(trees[target]["overall"]["mape"])
        for g, m in trees[target]["per_group"].items():
            assert meta["accuracy"][target]["trees"]["per_group"][g]["mape"] == pytest.approx(m["mape"])


@pytest.mark.parametrize("arch", ["sage", "seernet"])
def test_the_numpy_forward_pass_is_the_torch_models(tiny, arch):
    """Training runs ``GNNModel`` (torch, torch_geometric); predictions run ``GNNForward`` (numpy) on its weights:
    the same outputs for the same samples, three networks at two batch sizes each; a weight of another shape is
    refused."""
    from perf4sight.fingerprint.gnn_forward import Normaliser, sample_arrays
    from perf4sight.fingerprint.gnn_graph import GLOBAL_FEATURES, global_features
    from perf4sight.fingerprint.gnn_model import GNNModel
    from perf4sight.fingerprint.gnn_train import _forward, forward_of, make_data
    descs, _ = tiny
    tl = [t for t in (graph_template(descs[n]) for n in ("deep_w8", "plain_w4", "res_w16")) for _ in (1, 8)]
    bs = [1, 8] * 3
    norm = Normaliser.fit(tl[::2], global_features(tl, bs), np.zeros((6, 2)))
    torch.manual_seed(1)
    dims = (len(NODE_FEATURES), len(EDGE_FEATURES), len(GLOBAL_FEATURES))
    model = GNNModel(arch, *dims, hidden=16, layers=2).eval()
    with torch.no_grad():
        want, samples = _forward(model, make_data(tl, bs, norm), np.arange(3))
    assert samples.tolist() == list(range(6))
    net = forward_of(model)
    net.check(*dims, hidden=16)
    np.testing.assert_allclose(net(sample_arrays(tl, bs, norm)), want.numpy(), rtol=0, atol=1e-6)
    with pytest.raises(ValueError, match=r"head.2.bias is \(2,\), expected \(3,\)"):
        net.check(*dims, hidden=16, outputs=3)


def test_the_numpy_forward_pass_is_the_torch_models_on_trained_weights(fitted, tiny):
    """As above on the weights a fit stored (trained, not drawn): the torch model they were trained as, given the
    same samples of every network of the fit at three batch sizes, reads the same to 1e-6."""
    from perf4sight.fingerprint.gnn_forward import sample_arrays
    from perf4sight.fingerprint.gnn_graph import GLOBAL_FEATURES
    from perf4sight.fingerprint.gnn_model import GNNModel
    from perf4sight.fingerprint.gnn_train import _forward, make_data
    descs, _ = tiny
    out, meta = fitted
    gnn = load_gnn(out)
    st = meta["settings"]
    model = GNNModel(st["arch"], len(NODE_FEATURES), len(EDGE_FEATURES), len(GLOBAL_FEATURES), hidden=st["hidden"],
                     layers=st["layers"]).eval()
    model.load_state_dict({k: torch.from_numpy(v) for k, v in gnn.model.state.items()})
    tl = [t for t in (graph_template(descs[n], gnn.runtime) for n in sorted(descs)) for _ in BATCHES]
    bs = list(BATCHES) * len(descs)
    with torch.no_grad():
        want, samples = _forward(model, make_data(tl, bs, gnn.norm), np.arange(len(descs)))
    assert samples.tolist() == list(range(len(tl)))
    np.testing.assert_allclose(gnn.model(sample_arrays(tl, bs, gnn.norm)), want.numpy(), rtol=0, atol=1e-6)


def test_load_predict(fitted, tiny):
    out, _ = fitted
    descs, rows = tiny
    gnn = load_gnn(out)
    preds = gnn.predict([descs["deep_w8"], descs["plain_w4"]], [1, 16])
    assert [(p["network"], p["batch_size"]) for p in preds] == [("deep_w8", 1), ("deep_w8", 16), ("plain_w4", 1),
                                                               ("plain_w4", 16)]
    for p in preds:
        assert set(p) == set(PREDICTION_KEYS)
        assert p["latency_ms_low"] <= p["latency_ms"] <= p["latency_ms_high"]
        assert p["memory_mb_low"] <= p["memory_mb"] <= p["memory_mb_high"] and p["fits"] is True
    again = load_gnn(out).predict(descs["deep_w8"], 16)[0]
    assert again["memory_mb"] == pytest.approx(preds[1]["memory_mb"], rel=1e-6)
    # another network of the same name asked beside it: each is its own graph, whatever the other
    import copy
    namesake = copy.deepcopy(descs["plain_w4"])
    namesake.name = "deep_w8"
    beside = gnn.predict([namesake, descs["deep_w8"]], [16])[1]
    assert [beside[k] for k in ("latency_ms", "memory_mb")] == pytest.approx([again["latency_ms"], again["memory_mb"]],
                                                                              rel=1e-6)
    # it learnt something: in-sample memory error far below what predicting the mean gives
    ok = [r for r in rows if r["status"] == "ok"]
    y = np.array([r["peak_rss_mb"] for r in ok])
    p = np.array([gnn.predict(descs[r["network"]], r["batch_size"])[0]["memory_mb"] for r in ok])
    assert np.mean(np.abs(p / y - 1)) < 0.5 * np.mean(np.abs(y.mean() / y - 1))
    assert gnn.predict(descs["res_w16"], 4096)[0]["fits"] is False  # the oom rows taught the capacity
    with pytest.raises(UserError, match="batch sizes"):
        gnn.predict(descs["res_w16"], [0])
    from_module = gnn.predict_module(_net(8, 3, False), [3, 16, 16], [1, 16], name="deep_w8")  # an nn.Module
    assert [p["memory_mb"] for p in from_module] == pytest.approx([preds[0]["memory_mb"], preds[1]["memory_mb"]])


def test_a_networks_figures_do_not_depend_on_the_rest_of_the_query(fitted, tiny):
    """A network's GNN figures are the same asked alone, one batch size at a time, or beside other networks and
    batch sizes: the per-sample layers multiplied all the samples' rows at once, and a matrix product of more rows
    sums each in another order (the seventh significant digit moved, the third decimal of a figure of thousands);
    so did the analytic baseline's (the trees' linear sum), in the sixteenth."""
    out, _ = fitted
    descs, _ = tiny
    gnn = load_gnn(out)
    keys = ("latency_ms", "memory_mb", "latency_ms_low", "latency_ms_high", "memory_mb_low", "memory_mb_high")
    sizes = [1, 3, 4, 16, 64, 200, 1000]
    alone = {b: gnn.predict(descs["deep_w8"], [b])[0] for b in sizes}
    assert len({alone[b]["memory_mb"] for b in sizes}) == len(sizes)  # figures that differ, not one constant
    for others, bss in (([], sizes), (["plain_w4", "res_w16"], sizes), (["res_w4"] * 5, [4, 1000, 3]),
                        ([n for n in descs if n != "deep_w8"], [200, 1, 64, 16, 3])):
        query = [descs[n] for n in others[:1]] + [descs["deep_w8"]] + [descs[n] for n in others[1:]]
        got = [p for p in gnn.predict(query, bss) if p["network"] == "deep_w8"]
        assert [p["batch_size"] for p in got] == bss
        for p in got:
            assert [p[k] for k in keys] == [alone[p["batch_size"]][k] for k in keys], (others, p["batch_size"])


def test_stored_gnns_predict_without_torch_and_older_ones_still_load(fitted, tiny, tmp_path):
    """The GNN and the ensemble load and predict in a process that never imports torch (or torch_geometric); a GNN
    stored before its weights were plain arrays (``gnn_weights.pt``) loads and predicts the same."""
    import shutil
    import subprocess
    import sys

    from perf4sight.ir.schema import save_description
    out, _ = fitted
    descs, _ = tiny
    save_description(descs["res_w8"], tmp_path / "res_w8.json")
    script = ("import json, sys; from perf4sight.fingerprint.gnn_predictors import load_predictor; "
              f"rows = [load_predictor({str(out)!r}, k).predict({str(tmp_path / 'res_w8.json')!r}, [2, 16]) "
              "for k in ('gnn', 'ensemble')]; "
              "print(json.dumps([rows, sorted(m for m in sys.modules if m.split('.')[0] in ('torch', "
              "'torch_geometric'))]))")
    run = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120,
                         cwd=Path(__file__).resolve().parents[1])
    assert run.returncode == 0, run.stderr[-2000:]
    (gnn, ensemble), imported = json.loads(run.stdout)
    assert imported == []
    assert gnn == load_gnn(out).predict(descs["res_w8"], [2, 16])
    assert ensemble == load_predictor(out, "ensemble").predict(descs["res_w8"], [2, 16])

    older = tmp_path / "older"
    shutil.copytree(out, older)
    with np.load(older / GNN_WEIGHTS, allow_pickle=False) as arrays:
        torch.save({k: torch.from_numpy(arrays[k]) for k in arrays.files}, older / OLD_GNN_WEIGHTS)
    (older / GNN_WEIGHTS).unlink()
    assert load_gnn(older).predict(descs["res_w8"], [2, 16]) == gnn


def test_ensemble_is_geometric_mean(fitted, tiny):
    out, _ = fitted
    descs, _ = tiny
    t = load_predictor(out, "trees").predict(descs["res_w4"], [4])[0]
    g = load_predictor(out, "gnn").predict(descs["res_w4"], [4])[0]
    e = load_predictor(out, "ensemble").predict(descs["res_w4"], [4])[0]
    assert e["latency_ms"] == pytest.approx(np.sqrt(t["latency_ms"] * g["latency_ms"]))
    assert e["memory_mb"] == pytest.approx(np.sqrt(t["memory_mb"] * g["memory_mb"]))
    with pytest.raises(UserError, match="not one of"):
        load_predictor(out, "forest")


class _Evil:
    def __reduce__(self):
        return (os.system, ("touch pwned_by_weights",))


def test_damaged_or_hostile_files(fitted, tmp_path, monkeypatch):
    out, _ = fitted
    monkeypatch.chdir(tmp_path)
    with pytest.raises(UserError, match="no GNN here"):
        load_gnn(tmp_path)
    (tmp_path / GNN_JSON).write_text((out / GNN_JSON).read_text())
    (tmp_path / GNN_WEIGHTS).write_bytes(pickle.dumps({"w": _Evil()}))
    with pytest.raises(UserError, match="damaged or incompatible"):
        load_gnn(tmp_path)
    with (tmp_path / GNN_WEIGHTS).open("wb") as f:  # arrays, one of them of Python objects
        np.savez(f, **{"enc_x.0.weight": np.array([_Evil()], dtype=object)})
    with pytest.raises(UserError, match="damaged or incompatible"):
        load_gnn(tmp_path)
    (tmp_path / GNN_WEIGHTS).unlink()  # an older GNN's file, read by torch: tensors only
    (tmp_path / OLD_GNN_WEIGHTS).write_bytes(pickle.dumps({"w": _Evil()}))
    with pytest.raises(UserError, match="damaged or incompatible"), warnings.catch_warnings():
        warnings.filterwarnings("ignore", "Detected pickle protocol", UserWarning)  # torch's note on the hostile file
        load_gnn(tmp_path)
    assert not (tmp_path / "pwned_by_weights").exists()
    (tmp_path / OLD_GNN_WEIGHTS).unlink()
    (tmp_path / GNN_WEIGHTS).write_bytes((out / GNN_WEIGHTS).read_bytes())
    meta = json.loads((out / GNN_JSON).read_text())
    meta["node_features"] = meta["node_features"][:-1]
    (tmp_path / GNN_JSON).write_text(json.dumps(meta))
    with pytest.raises(UserError, match="other features"):
        load_gnn(tmp_path)
    meta = json.loads((out / GNN_JSON).read_text())
    meta["training_domain"] = 5  # was read (and crashed) only when a query came
    (tmp_path / GNN_JSON).write_text(json.dumps(meta))
    with pytest.raises(UserError, match="damaged or incompatible .*training_domain is not an object"):
        load_gnn(tmp_path)
    # the accuracy table's figures, which the fingerprint stage prints (gnn_accuracy_lines): a ValueError or a
    # KeyError traceback there
    for edit, field in ((lambda a: a["latency"]["gnn"].update(interval_coverage_held_out="67"),
                         "accuracy.latency.gnn.interval_coverage_held_out is '67'"),
                        (lambda a: a["memory"]["ensemble"]["overall"].update(mape="12"),
                         "accuracy.memory.ensemble.overall is"),
                        (lambda a: a["latency"].pop("trees"), "accuracy.latency.trees is not an object")):
        meta = json.loads((out / GNN_JSON).read_text())
        edit(meta["accuracy"])
        (tmp_path / GNN_JSON).write_text(json.dumps(meta))
        with pytest.raises(UserError, match=f"damaged or incompatible .*{field}"):
            load_gnn(tmp_path)
    (tmp_path / GNN_JSON).write_text("{not json")
    with pytest.raises(UserError, match="damaged"):
        load_gnn(tmp_path)



@pytest.mark.parametrize("edit", [
    lambda base: base.update(models=None),                        # a baseline of nothing: 1 ms and 1 MiB figures
    lambda base: base.update(kind=None),
    lambda base: base["models"].pop("memory"),                    # KeyError at the first query
    lambda base: base["models"]["latency"]["terms"].__setitem__(0, "no_such_feature"),   # ValueError there
    lambda base: base["models"]["latency"].update(coef=[1.0]),    # too few coefficients: numpy's matmul error
    lambda base: base["models"]["latency"]["coef"].__setitem__(0, "x"),
    lambda base: base["models"]["memory"]["coef"].__setitem__(0, float("nan")),  # "memory_mb": NaN, not JSON
])
def test_a_baseline_edited_by_hand_is_refused_at_load(fitted, tmp_path, edit):
    """gnn.json's analytic baseline (``base``) was read at the first query, not at load: an edited one ended a
    predict in a traceback, printed NaN, or predicted from no baseline at all. Each is the one-line 'damaged or
    incompatible' at load now."""
    out, _ = fitted
    for name in (GNN_JSON, GNN_WEIGHTS):
        (tmp_path / name).write_bytes((out / name).read_bytes())
    meta = json.loads((out / GNN_JSON).read_text())
    assert meta["base"]["kind"] == "analytic" and load_gnn(tmp_path).base.models  # the file as fitted loads
    edit(meta["base"])
    (tmp_path / GNN_JSON).write_text(json.dumps(meta))
    with pytest.raises(UserError, match=r"GNN files are damaged or incompatible \(\w+: base"):
        load_gnn(tmp_path)
    meta["base"] = None
    (tmp_path / GNN_JSON).write_text(json.dumps(meta))
    with pytest.raises(UserError, match="GNN files are damaged or incompatible"):
        load_gnn(tmp_path)

@pytest.mark.parametrize("edit", [
    lambda n: [n["x"][i].pop() for i in (0, 1)],      # a node column short: numpy's broadcast error at the query
    lambda n: [n["e"][i].append(0.5) for i in (0, 1)],  # an edge column too many: the same
    lambda n: [n["y"][i].pop() for i in (0, 1)],      # one target's statistics: given to both targets
    lambda n: n.update(y=[0.0, 1.0]),                 # numbers, not a column each: the same
    lambda n: n["y"][1].__setitem__(0, -1.0),          # a negative std: the log target turned over
    lambda n: n["u"].append(n["u"][0]),
])
def test_a_normaliser_of_other_sizes_is_refused_at_load(fitted, tiny, tmp_path, edit):
    """gnn.json's normaliser was checked for finite numbers only: statistics of the wrong number of columns loaded,
    and a query then ended in a traceback or predicted from the wrong statistics. Each is the one-line 'damaged or
    incompatible' at load now, naming the part."""
    descs, _ = tiny
    out, _ = fitted
    for name in (GNN_JSON, GNN_WEIGHTS):
        (tmp_path / name).write_bytes((out / name).read_bytes())
    assert load_gnn(tmp_path).predict(descs["res_w4"], [2])[0]["memory_mb"] > 0  # the file as fitted loads
    meta = json.loads((out / GNN_JSON).read_text())
    edit(meta["normaliser"])
    (tmp_path / GNN_JSON).write_text(json.dumps(meta))
    with pytest.raises(UserError, match=r"GNN files are damaged or incompatible \(ValueError: normaliser\.[xeuy] is"):
        load_gnn(tmp_path)


def test_bad_inputs(tiny, tmp_path):
    descs, rows = tiny
    with pytest.raises(UserError, match="architecture"):
        fit_gnn(rows, descs, "cpu0", tmp_path, arch="transformer")
    with pytest.raises(UserError, match="no measurements"):
        fit_gnn(rows, descs, "other-device", tmp_path)
    one = [r for r in rows if r["network"] == "deep_w8"]  # nothing to hold out: refused, as by the trees
    with pytest.raises(UserError, match=r"ok rows with a latency figure of 1 network \(deep_w8\); a GNN needs 2 or"):
        fit_gnn(one, descs, "cpu0", tmp_path, max_epochs=2)
    # nor where the other network ran out of memory at every batch size (its rows counted before: a GNN stored with
    # NaN accuracy and a band of [0, 0]), or measured no memory figure
    oom = one + [r | {"status": "oom"} for r in rows if r["network"] == "res_w4"]
    with pytest.raises(UserError, match=r"latency figure of 1 network \(deep_w8\); a GNN needs 2 or more"):
        fit_gnn(oom, descs, "cpu0", tmp_path, max_epochs=2)
    no_memory = one + [r | {"peak_rss_mb": ""} for r in rows if r["network"] == "res_w4"]
    with pytest.raises(UserError, match=r"memory figure of 1 network \(deep_w8\); a GNN needs 2 or more"):
        fit_gnn(no_memory, descs, "cpu0", tmp_path, max_epochs=2)
    assert not (tmp_path / "gnn.json").exists()
    bad = NetworkDescription.from_dict(descs["plain_w4"].to_dict())
    bad.nodes[2].op = "lstm"
    with pytest.raises(UserError, match="without a cost formula"):
        graph_template(bad)


def test_sage_architecture_trains(tiny, tmp_path):
    descs, rows = tiny
    meta = fit_gnn(rows, descs, "cpu0", tmp_path, arch="sage", hidden=8, layers=1, max_epochs=5, evaluate=False,
                   base="none")
    assert meta["accuracy"] == {} and "none" in meta["interval"]["method"] and meta["base"]["models"] is None
    p = load_gnn(tmp_path).predict(descs["res_w4"], [2])[0]
    assert p["latency_ms"] == p["latency_ms_low"] == p["latency_ms_high"] > 0


def test_fit_device_gnn_reads_config(tiny, tmp_path):
    from types import SimpleNamespace

    from perf4sight.fingerprint.api import fit_device_gnn
    from perf4sight.profiling.results import COLUMNS, append_row, results_path
    descs, rows = tiny
    for r in rows:
        append_row(results_path(tmp_path / "prof", "cpu0"), {k: v for k, v in r.items() if k in COLUMNS}
                   | {"timestamp": "2026-01-01T00:00:00+00:00"})
    fcfg = FingerprintConfig(n_estimators=5, seed=1, gnn_arch="sage", gnn_hidden=8, gnn_layers=1, gnn_max_epochs=3,
                             gnn_patience=3)
    cfg = SimpleNamespace(profiling_dir=tmp_path / "prof", models_dir=tmp_path / "models",
                          fingerprint_dir=tmp_path / "fp", fingerprint=fcfg, profile=ProfileConfig(),
                          devices={"cpu0": SimpleNamespace(memory_limit_mb=2048)})
    meta = fit_device_gnn(cfg, "cpu0", descs)
    assert meta["settings"]["arch"] == "sage" and meta["settings"]["seed"] == 1
    assert meta["capacity_mb"] == 2048 and (tmp_path / "fp" / "cpu0" / GNN_JSON).is_file()
    assert meta["accuracy"]["trees_source"] == {"latency": "refitted", "memory": "refitted"}  # no trees beside it
    with pytest.raises(UserError, match="no measurements"):
        fit_device_gnn(cfg, "nope", descs)
    again = fit_device_gnn(cfg, "cpu0", descs, refit=False)
    assert again["up_to_date"] and again["created"] == meta["created"]
    stored = tmp_path / "fp" / "cpu0" / GNN_JSON  # hand-edited so that it does not load: fitted again, as the trees'
    edited = json.loads(stored.read_text())
    edited["accuracy"]["latency"]["gnn"]["interval_coverage_held_out"] = "x"
    stored.write_text(json.dumps(edited))
    assert "up_to_date" not in fit_device_gnn(cfg, "cpu0", descs, refit=False)
    assert fit_device_gnn(cfg, "cpu0", descs, refit=False)["up_to_date"]


def test_the_gnn_is_found_up_to_date_without_torch():
    """The GNN's input hash reads torch's and torch_geometric's versions without importing them (the same strings
    as their ``__version__``), and its modules import neither: only training does, so the fingerprint stage's
    "up to date" costs no torch."""
    import subprocess
    import sys

    from perf4sight.fingerprint.gnn import gnn_versions
    with warnings.catch_warnings():  # torch_geometric calls torch.jit.script at import: a FutureWarning
        warnings.filterwarnings("ignore", message=".*torch.jit.script.* is deprecated", category=FutureWarning)
        import torch_geometric
    assert gnn_versions() == {"torch": torch.__version__, "torch_geometric": torch_geometric.__version__}
    script = ("import sys; import perf4sight.fingerprint.gnn, perf4sight.fingerprint.api, perf4sight.stages; "
              "print(sorted(m for m in sys.modules if m.split('.')[0] in ('torch', 'torch_geometric')))")
    run = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120,
                         cwd=Path(__file__).resolve().parents[1])
    assert run.returncode == 0 and run.stdout.strip() == "[]", run.stdout + run.stderr[-2000:]


def test_the_gnn_leaves_no_generated_source_in_the_temporary_folder():
    """torch_geometric writes each message-passing layer's generated propagate() to a file in the temporary folder
    and never removes it: the GNN removes it once loaded, and the layer still runs."""
    import sys

    from perf4sight.fingerprint.gnn_model import GNNModel
    model = GNNModel("sage", 5, 2, 3, hidden=8, layers=2)
    generated = [m for n, m in sys.modules.items() if n.startswith("torch_geometric.") and n.endswith("_propagate")]
    assert generated and not any(Path(m.__file__).exists() for m in generated)
    x, edges = torch.randn(4, 5), torch.tensor([[0, 1, 2], [1, 2, 3]])
    out = model(x, edges, torch.randn(3, 2), torch.randn(1, 3), torch.zeros(4, dtype=torch.long), torch.randn(2, 3),
                torch.zeros(2, dtype=torch.long))
    assert out.shape == (2, 2)


def test_the_ensemble_fits_where_both_its_predictors_do(fitted, tiny):
    """The ensemble held the trees' capacity, which they compare with their analytic demand, against its averaged
    memory: on the TX2 it said resnet50_0 fits at batch 64, where it ran out of memory and both parts said no."""
    out, _ = fitted
    descs, _ = tiny
    trees, gnn, ensemble = (load_predictor(out, kind) for kind in ("trees", "gnn", "ensemble"))
    sizes = list(range(256, 8192, 256))
    for name in ("plain_w4", "res_w16", "deep_w8"):
        t, g, e = (p.predict(descs[name], sizes) for p in (trees, gnn, ensemble))
        assert [x["fits"] for x in e] == [a["fits"] and b["fits"] for a, b in zip(t, g)]
        assert ensemble.max_batch_size(descs[name], 8192) == min(trees.max_batch_size(descs[name], 8192),
                                                                   gnn.max_batch_size(descs[name], 8192))


@pytest.mark.parametrize("damage", ["weights", "normaliser.x", "normaliser.y"])
def test_a_nan_in_the_weights_or_the_normaliser_is_refused_at_load(fitted, tmp_path, damage):
    """A NaN in a GNN's weights or its normaliser's statistics made every figure NaN: predict --json printed
    ``"latency_ms": NaN`` (not JSON) and ``"fits": false``. Refused at load, naming the array."""
    out, _ = fitted
    weights = dict(np.load(out / GNN_WEIGHTS))
    meta = json.loads((out / GNN_JSON).read_text())
    if damage == "weights":
        first = sorted(weights)[0]
        weights[first] = weights[first].copy()
        weights[first].flat[0] = np.nan
    else:
        meta["normaliser"][damage[-1]][0][0] = float("nan")
    np.savez(tmp_path / GNN_WEIGHTS, **weights)
    (tmp_path / GNN_JSON).write_text(json.dumps(meta))
    with pytest.raises(UserError, match=r"GNN files are damaged or incompatible \(ValueError: .*not finite numbers"):
        load_gnn(tmp_path)


def test_the_trees_and_ensembles_figures_do_not_depend_on_the_rest_of_the_query(fitted, tiny):
    """A network's figures from the trees and from the ensemble are the same asked alone, one batch size at a time,
    or beside other networks and batch sizes: the trees' analytic part was one matrix-vector product over all the
    query's rows, whose BLAS kernel sums a row in an order that depends on the row count (the sixteenth significant
    digit moved)."""
    out, _ = fitted
    descs, _ = tiny
    keys = ("latency_ms", "memory_mb", "latency_ms_low", "latency_ms_high", "memory_mb_low", "memory_mb_high",
            "fits")
    sizes = [1, 3, 4, 16, 64, 200, 1000]
    for kind in ("trees", "ensemble"):
        pred = load_predictor(out, kind)
        alone = {b: pred.predict(descs["deep_w8"], [b])[0] for b in sizes}
        assert len({alone[b]["memory_mb"] for b in sizes}) == len(sizes)  # figures that differ, not one constant
        for others, bss in (([], sizes), (["plain_w4", "res_w16"], sizes), (["res_w4"] * 5, [4, 1000, 3]),
                            ([n for n in descs if n != "deep_w8"], [200, 1, 64, 16, 3])):
            query = [descs[n] for n in others[:1]] + [descs["deep_w8"]] + [descs[n] for n in others[1:]]
            got = [p for p in pred.predict(query, bss) if p["network"] == "deep_w8"]
            assert [p["batch_size"] for p in got] == bss
            for p in got:
                assert [p[k] for k in keys] == [alone[p["batch_size"]][k] for k in keys], (kind, others, p)


def test_the_trees_refitted_for_the_comparison_read_as_the_trees_fingerprints_own(fitted, tiny, tmp_path):
    """Without the trees' held_out.csv beside it, the GNN refits the trees for its table, as the fingerprint stage
    fits them: on the same rows the same figures. They were fitted on exp(log(measured)), a last bit away from the
    figures, and the trees' splits moved with it: a held-out family's MAPE differed by points."""
    descs, rows = tiny
    out, _ = fitted
    meta = fit_gnn(rows, descs, "cpu0", tmp_path, seed=0, arch="sage", hidden=4, layers=1, max_epochs=2, patience=2,
                   trees_config=FingerprintConfig(n_estimators=10))
    trees = json.loads((out / "metadata.json").read_text())["accuracy"]
    for target in ("latency", "memory"):
        assert meta["accuracy"]["trees_source"][target] == "refitted"
        got = {g: m["mape"] for g, m in meta["accuracy"][target]["trees"]["per_group"].items()}
        assert got == pytest.approx({g: m["mape"] for g, m in trees[target]["per_group"].items()}, rel=1e-9), target


def test_the_trees_refitted_for_the_comparison_read_the_devices_op_prices(tiny, tmp_path, monkeypatch):
    """A device with measured op prices: its trees fingerprint fits the ``priced_ops_ms`` term; the trees the GNN
    refitted for its table (no trees' held_out.csv beside it) had the term at 0, and read other figures (a held-out
    family's 10.22% against 10.17% on these networks). Now they read the prices as fit_fingerprint does, and
    fit_device_gnn hands them over where ``[profile] op_prices`` is on."""
    from perf4sight.features.aggregate import FEATURE_NAMES, feature_matrix, network_features
    from perf4sight.fingerprint import api, gnn
    from perf4sight.fingerprint.fit import hold_native_conv, step_runtime
    from perf4sight.fingerprint.gnn_evaluate import _trees_features
    from perf4sight.fingerprint.gnn_samples import Samples
    from perf4sight.profiling.results import COLUMNS, append_row, op_prices_path, results_path
    descs, rows = tiny
    prices = {"relu": {4: 50.0, 16: 800.0}, "batchnorm2d": {4: 100.0, 16: 1600.0}}
    s = Samples(rows, descs, "cpu0")
    runtime = step_runtime(rows).with_op_prices(prices)  # as fit_fingerprint(op_prices=prices) reads the rows
    want = hold_native_conv(feature_matrix([network_features(descs[n], runtime) for n in s.nets], s.bs), runtime)
    got = _trees_features(s, FingerprintConfig(simulate_memory=False), prices)
    priced = FEATURE_NAMES.index("priced_ops_ms")
    assert want[:, priced].min() > 0
    np.testing.assert_array_equal(got, want)
    assert _trees_features(s, FingerprintConfig(simulate_memory=False))[:, priced].max() == 0  # none measured
    for r in rows:
        append_row(results_path(tmp_path / "prof", "cpu0"), {k: v for k, v in r.items() if k in COLUMNS}
                   | {"timestamp": "2026-01-01T00:00:00+00:00"})
    op_prices_path(tmp_path / "prof", "cpu0").write_text(json.dumps({"ops": prices}))
    handed = []
    monkeypatch.setattr(gnn, "fit_gnn", lambda *a, **kw: handed.append(kw.get("op_prices")) or {})
    cfg = SimpleNamespace(profiling_dir=tmp_path / "prof", models_dir=tmp_path / "models",
                          fingerprint_dir=tmp_path / "fp", fingerprint=FingerprintConfig(),
                          profile=ProfileConfig(op_prices=True), devices={})
    api.fit_device_gnn(cfg, "cpu0", descs)
    cfg.profile = ProfileConfig(op_prices=False)
    api.fit_device_gnn(cfg, "cpu0", descs)
    assert handed == [prices, None]


def test_the_trees_refitted_for_the_comparison_place_a_ceiling_only_where_a_row_ran_out_of_memory(tiny, tmp_path,
                                                                                              monkeypatch):
    """fit_fingerprint chooses the memory form knowing whether any row ran out of memory (``saturates``: with none,
    a saturating preferred form kept without a choice gives way to its sum without the ceiling); the trees the GNN
    refitted for its table were always told some had. On a GPU's rows without one (three families, one without a
    linear layer) their held-out MAPE read 0.1048 / 0.2429 against the trees fingerprint's 0.1046 / 0.2412."""
    from perf4sight.fingerprint import gnn_evaluate
    from perf4sight.fingerprint.evaluate import CVResult, metrics
    descs, rows = tiny
    told = []

    def nested(target, F, y, groups, grouping, *args, **kwargs):  # what it is told; figures of no matter, cheaply
        told.append(kwargs.get("saturates"))
        per = {str(g): metrics(y[groups == g], 1.1 * y[groups == g]) for g in set(groups.tolist())}
        return CVResult(1.1 * y, per, metrics(y, 1.1 * y), grouping), {}
    monkeypatch.setattr(gnn_evaluate, "nested_cv", nested)
    small = [r for r in rows if r["network"].endswith("_w4") or r["network"].endswith("_w8")]
    for kept in (small, [r for r in small if r["status"] == "ok"]):
        fit_gnn(kept, descs, "cpu0", tmp_path / str(len(told)), hidden=4, layers=1, max_epochs=1, patience=1,
                trees_config=FingerprintConfig(n_estimators=5, simulate_memory=False))
    assert told == [True, True, False, False]  # latency and memory, with the oom rows and without


def test_the_training_domain_leaves_out_a_network_that_ran_out_of_memory_everywhere(tiny, tmp_path):
    """The GNN's training domain took its kinds of layer from every network with a row, one out of memory at every
    batch size too (nothing learnt from it): a query with that network's layer went without the note the trees
    give it ('with hardswish layers, which no training network had')."""
    descs, rows = tiny
    hs = describe(nn.Sequential(nn.Conv2d(3, 4, 3), nn.Hardswish(), nn.AdaptiveAvgPool2d(1), nn.Flatten(),
                                nn.Linear(4, 10)), input_shape=[3, 16, 16], name="hs", network="hs")
    kept = [r for r in rows if r["network"] in ("plain_w4", "deep_w4")]
    kept += [{"device": "cpu0", "backend": "cpu", "network": "hs", "family": "hs", "batch_size": b, "status": "oom"}
             for b in (1, 4)]
    meta = fit_gnn(kept, descs | {"hs": hs}, "cpu0", tmp_path, hidden=4, layers=1, max_epochs=1, evaluate=False)
    assert "hardswish" not in meta["training_domain"]["ops"] and "hs" in meta["networks"]
    notes = load_gnn(tmp_path).outside_training(hs, [1])
    assert any("hs: with hardswish layers, which no training network had" in n for n in notes), notes


def test_a_target_measured_on_one_family_is_held_out_by_network_as_the_trees_do(tiny, tmp_path):
    """The GNN's folds were one grouping for both targets, by family where the rows had two or more: a memory figure
    measured on one family's networks alone then had one group to hold out, and the GNN stored NaN accuracy and a
    band of [0, 0] for memory. The trees choose the grouping per target (their memory by network there); so does
    the GNN now, its latency still by family."""
    descs, rows = tiny
    kept = [r if r["family"] == "plain" else r | {"peak_rss_mb": ""} for r in rows
            if r["network"].endswith(("_w4", "_w8"))]
    meta = fit_gnn(kept, descs, "cpu0", tmp_path, hidden=4, layers=1, max_epochs=1, patience=1,
                   trees_config=FingerprintConfig(n_estimators=5, simulate_memory=False))
    acc = meta["accuracy"]
    assert acc["latency"]["grouping"] == "family" and set(acc["latency"]["gnn"]["per_group"]) == {"plain", "deep",
                                                                                                   "res"}
    assert acc["memory"]["grouping"] == "network"
    assert set(acc["memory"]["gnn"]["per_group"]) == set(acc["memory"]["trees"]["per_group"]) == {"plain_w4",
                                                                                                   "plain_w8"}
    assert all(np.isfinite(acc["memory"][k]["overall"]["mape"]) for k in ("gnn", "trees", "ensemble"))
    lo, hi = meta["interval"]["log_ratio_quantiles"]["gnn"]["memory"]
    assert lo < 0 < hi
    assert any(line.startswith("memory: MAPE % per held-out network") for line in gnn_accuracy_lines(meta))


def test_rows_without_a_family_cell_are_folded_by_their_description_s_family(tiny):
    """A hand-made CSV may leave the ``family`` cell empty: the GNN's samples fold such rows by their network
    description's family (``evaluate.row_family``, as the trees' fit), not by the network's own name, which made
    every width a family of its own, its siblings in training when it was held out."""
    from perf4sight.fingerprint.gnn_samples import Samples
    descs, rows = tiny
    s = Samples([{k: v for k, v in r.items() if k != "family"} for r in rows], descs, "cpu0")
    assert sorted(set(s.families.tolist())) == ["deep", "plain", "res"]
    assert s.target_groups(0)[1] == "family"


def _interleaved(tmp_path, monkeypatch, meanwhile):
    """The first of two GNN saves into ``tmp_path``, ``meanwhile(first_meta)`` run once its weights are renamed and
    before its gnn.json is written (a thread of a second save or a read, given 0.5 s)."""
    import threading

    from perf4sight.fingerprint import gnn

    write_atomically = gnn.write_atomically
    threads = []

    def json_last(path, text):
        if not threads:
            threads.append(threading.Thread(target=meanwhile))
            threads[0].start()
            threads[0].join(0.5)  # it waits for the first's files now
        write_atomically(path, text)

    monkeypatch.setattr(gnn, "write_atomically", json_last)
    gnn.save_gnn_files(tmp_path, {"w": np.array([1.0])}, {"fit": "first"})
    threads[0].join()
    monkeypatch.undo()


def test_a_second_gnn_fit_saving_between_the_firsts_files_waits_for_them(tmp_path, monkeypatch):
    """A GNN fit writes its weights, then gnn.json: a second fit of the device between the two left the first's
    gnn.json beside the second's weights (reproduced: gnn.json 'first', weights 'second'), and a predict reading
    between them read the second's... The folder is locked as a trees fit locks it: each reader and writer gets
    one fit's files."""
    from perf4sight.fingerprint.gnn import save_gnn_files
    from perf4sight.fingerprint.gnn_predictors import read_gnn_files

    _interleaved(tmp_path, monkeypatch, lambda: save_gnn_files(tmp_path, {"w": np.array([2.0])}, {"fit": "second"}))
    meta, weights = read_gnn_files(tmp_path)
    assert {"first": 1.0, "second": 2.0}[meta["fit"]] == float(weights["w"][0])
    save_gnn_files(tmp_path, {"w": np.array([0.0])}, {"fit": "before"})
    read = []
    _interleaved(tmp_path, monkeypatch, lambda: read.append(read_gnn_files(tmp_path)))
    (meta, weights), = read
    assert {"before": 0.0, "first": 1.0}[meta["fit"]] == float(weights["w"][0])
