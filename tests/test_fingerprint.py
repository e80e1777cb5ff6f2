"""Fingerprints: array trees equal scikit-learn, fit/save/load/predict on the imported TX2 data."""
from __future__ import annotations

import json
import zipfile
from dataclasses import replace

import numpy as np
import pytest

from perf4sight.config import FingerprintConfig
from perf4sight.errors import UserError
from perf4sight.fingerprint import PREDICTION_KEYS, accuracy_lines, fit_fingerprint, load_fingerprint
from perf4sight.fingerprint.trees import TreeEnsemble, make_regressor
from perf4sight.importers import import_perf4sight
from perf4sight.ir.schema import load_description
from perf4sight.profiling.results import read_rows, results_path

FAST = FingerprintConfig(n_estimators=20, min_samples_leaf=2)


@pytest.mark.parametrize("model", ["extra-trees", "gradient-boosting", "random-forest"])
def test_array_trees_match_sklearn(model):
    rng = np.random.default_rng(0)
    X = rng.normal(size=(300, 5)).astype(np.float32)
    y = X[:, 0] * 3 + np.sin(X[:, 1]) + rng.normal(scale=0.1, size=300)
    reg = make_regressor(model, 15, 1, 0).fit(X, y)
    ens = TreeEnsemble.from_sklearn(reg)
    Xt = rng.normal(size=(50, 5))
    np.testing.assert_allclose(ens.predict(Xt), reg.predict(Xt.astype(np.float32)), rtol=1e-9, atol=1e-9)


@pytest.fixture(scope="module")
def tx2(tmp_path_factory):
    from conftest import TX2_DATA
    if not (TX2_DATA / "graphs").is_dir():
        pytest.skip(f"shared TX2 data not found at {TX2_DATA} (set PERF4SIGHT_TX2_DATA)")
    tmp = tmp_path_factory.mktemp("fp")
    import_perf4sight(TX2_DATA, "tx2", tmp / "prof", tmp / "models")
    rows = read_rows(results_path(tmp / "prof", "tx2"))
    descs = {p.stem: load_description(p) for p in (tmp / "models" / "imported" / "tx2").glob("*.json")}
    meta = fit_fingerprint(rows, descs, "tx2", tmp / "fp" / "tx2", FAST)
    return tmp, rows, descs, meta


def test_fit_metadata(tx2):
    _, rows, descs, meta = tx2
    assert meta["memory_target"] == "device_mem_used_mb"
    assert meta["targets"]["latency"]["column"] == "latency_ms_median"
    for target in ("latency", "memory"):
        acc = meta["accuracy"][target]
        assert acc["grouping"] == "family"
        assert set(acc["per_group"]) == {"resnet18", "resnet50", "mobilenetv2", "squeezenet"}
        assert 0 < acc["overall"]["mape"] < 40  # a broken model is far worse than this
    assert meta["capacity_mb"] is not None and 4000 < meta["capacity_mb"] < 7859  # below the TX2's 8 GB
    assert len(meta["training_data_sha256"]) == 64
    assert "scikit-learn" in meta["versions"]
    assert any("leave-one-family-out" in line for line in accuracy_lines(meta))


def test_storage_has_no_pickle(tx2):
    tmp, *_ = tx2
    folder = tmp / "fp" / "tx2"
    assert sorted(p.name for p in folder.iterdir()) == ["metadata.json", "models.npz"]
    json.loads((folder / "metadata.json").read_text())
    with zipfile.ZipFile(folder / "models.npz") as z:
        assert all(n.endswith(".npy") for n in z.namelist())
    with np.load(folder / "models.npz", allow_pickle=False) as arrays:
        assert all(arrays[k].dtype != object for k in arrays.files)


def test_round_trip_predict(tx2):
    tmp, rows, descs, meta = tx2
    fp = load_fingerprint(tmp / "fp" / "tx2")
    preds = fp.predict([descs["resnet18_0"], descs["mobilenetv2_50"]], [2, 16, 64])
    assert len(preds) == 6
    for p in preds:
        assert tuple(p) == PREDICTION_KEYS
        assert p["latency_ms_low"] <= p["latency_ms"] <= p["latency_ms_high"]
        assert p["memory_mb_low"] <= p["memory_mb"] <= p["memory_mb_high"]
    by = {(p["network"], p["batch_size"]): p for p in preds}
    assert by[("resnet18_0", 64)]["latency_ms"] > by[("resnet18_0", 2)]["latency_ms"]
    # in-sample: the fitted model reproduces a measured point closely
    meas = next(r for r in rows if r["network"] == "resnet18_0" and r["batch_size"] == "16" and r["status"] == "ok")
    assert by[("resnet18_0", 16)]["memory_mb"] == pytest.approx(float(meas["device_mem_used_mb"]), rel=0.1)
    assert by[("resnet18_0", 16)]["latency_ms"] == pytest.approx(float(meas["latency_ms_median"]), rel=0.2)
    huge = fp.predict(descs["resnet50_0"], 1024)[0]
    assert huge["fits"] is False
    assert fp.predict(descs["squeezenet_90"], 2)[0]["fits"] is True


def test_max_batch_size_follows_the_oom_data(tx2):
    tmp, rows, descs, _ = tx2
    fp = load_fingerprint(tmp / "fp" / "tx2")
    small, big = fp.max_batch_size(descs["resnet18_90"]), fp.max_batch_size(descs["resnet50_0"])
    assert 0 < big < small
    first_oom = min(int(r["batch_size"]) for r in rows if r["network"] == "resnet50_0" and r["status"] == "oom")
    assert big < first_oom * 1.5


def test_single_family_falls_back_to_network_folds(tx2, tmp_path):
    _, rows, descs, _ = tx2
    sub = [r for r in rows if r["family"] == "squeezenet" and r["network"] in ("squeezenet_0", "squeezenet_50", "squeezenet_90")]
    meta = fit_fingerprint(sub, descs, "tx2", tmp_path / "fp", replace(FAST, model="gradient-boosting"))
    assert meta["accuracy"]["latency"]["grouping"] == "network"
    assert "one network family" in meta["accuracy"]["latency"]["note"]
    assert set(meta["accuracy"]["memory"]["per_group"]) == {"squeezenet_0", "squeezenet_50", "squeezenet_90"}


def test_fit_errors(tx2, tmp_path):
    _, rows, descs, _ = tx2
    with pytest.raises(UserError, match="no measurements"):
        fit_fingerprint(rows, descs, "other", tmp_path, FAST)
    with pytest.raises(UserError, match="no description"):
        fit_fingerprint(rows, {}, "tx2", tmp_path, FAST)
    with pytest.raises(UserError, match="model"):
        fit_fingerprint(rows, descs, "tx2", tmp_path, replace(FAST, model="svm"))
    with pytest.raises(UserError, match="no fingerprint"):
        load_fingerprint(tmp_path / "missing")


def test_predict_module(tx2):
    torch = pytest.importorskip("torch")
    pytest.importorskip("perf4sight.ir.from_torch")
    tmp, *_ = tx2
    fp = load_fingerprint(tmp / "fp" / "tx2")
    net = torch.nn.Sequential(torch.nn.Conv2d(3, 8, 3, padding=1), torch.nn.BatchNorm2d(8), torch.nn.ReLU(),
                              torch.nn.AdaptiveAvgPool2d(1), torch.nn.Flatten(), torch.nn.Linear(8, 10))
    out = fp.predict_module(net, [3, 32, 32], [4, 8], name="tiny")
    assert [p["batch_size"] for p in out] == [4, 8] and all(p["memory_mb"] > 0 for p in out)
