"""Fingerprints: array trees equal scikit-learn, fit/save/load/predict on the imported TX2 data."""
from __future__ import annotations

import json
import shutil
import threading
import zipfile
from dataclasses import replace

import numpy as np
import pytest

from perf4sight.config import FingerprintConfig
from perf4sight.errors import UserError
from perf4sight.features.aggregate import FEATURE_NAMES
from perf4sight.fingerprint import PREDICTION_KEYS, accuracy_lines, fit_fingerprint, load_fingerprint
from perf4sight.fingerprint.predict import NETWORK_SPLIT
from perf4sight.fingerprint.storage import load_held_out
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


@pytest.mark.parametrize("form", ["overlap", "ceiling"])
def test_the_nonlinear_forms_fit_with_their_exact_jacobian(form):
    """The overlap and saturating forms are fitted by least squares with their Jacobian written out: it equals
    the numerical one (central differences) at the start and at random points, masked columns included; the fit
    recovers the coefficients of noiseless rows."""
    from scipy.optimize._numdiff import approx_derivative

    from perf4sight.fingerprint.trees import (_combine, _fit_ceiling, _fit_overlap, _linear_design, ceiling_problem,
                                              overlap_problem)
    rng = np.random.default_rng(0)
    if form == "overlap":
        terms = ("one", "flops_total", "|", "kernels", "bytes_written", "depthwise_macs")
        coef = np.array([0.5, 2e-9, 1e-2, 3e-8, 0.0])
    else:
        terms = ("one", "sim_reserved_mb", "param_bytes", "ceiling")
        coef = np.array([300.0, 1.5, 2e-6, 3000.0])
    F = np.zeros((60, len(FEATURE_NAMES)))
    for t, hi in zip(terms, (1, 1e11, 1e4, 3e8, 1e4)):
        if t in FEATURE_NAMES:
            F[:, FEATURE_NAMES.index(t)] = rng.uniform(0, hi, len(F))
    if form == "overlap":
        F[:, FEATURE_NAMES.index("depthwise_macs")] = 0.0  # a column no row has: masked
    A = _linear_design(F, terms)
    y = _combine(A, coef, terms)
    col_max = np.abs(A).max(axis=0)
    mask = col_max > 0  # coefficients of order one, as the fits scale them
    scale = np.where(mask, col_max, 1.0) / np.median(y) * rng.uniform(0.5, 2.0, A.shape[1])
    resid, jac = (overlap_problem if form == "overlap" else ceiling_problem)(A, y, terms, mask, scale)
    for u in (coef * scale, rng.uniform(0.1, 3.0, A.shape[1]) * coef.clip(min=1e-3) * scale):
        np.testing.assert_allclose(jac(u), approx_derivative(resid, u, method="3-point"), rtol=1e-4, atol=1e-6)
    fitted = _fit_overlap(A, y, terms) if form == "overlap" else _fit_ceiling(A, y, terms, np.ones(len(coef), bool))
    np.testing.assert_allclose(_combine(A, fitted, terms), y, rtol=1e-3)


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
    assert meta["native_conv_dispatch"] is False  # imported GPU rows: no one-thread CPU dispatch
    assert len(meta["training_data_sha256"]) == 64
    assert "scikit-learn" in meta["versions"]
    assert any("leave-one-family-out" in line for line in accuracy_lines(meta))


def test_storage_has_no_pickle(tx2):
    tmp, *_ = tx2
    folder = tmp / "fp" / "tx2"
    assert sorted(p.name for p in folder.iterdir()) == ["held_out.csv", "metadata.json", "models.npz"]
    meta = json.loads((folder / "metadata.json").read_text())
    # held_out.csv: one out-of-fold prediction per training row, the accuracy table's own figures
    held = load_held_out(folder)
    for target in ("latency", "memory"):
        assert len(held[target]) == meta["training_rows"][target]
        meas, pred = np.array([k[2] for k in held[target]]), np.array(list(held[target].values()))
        mape = 100 * np.mean(np.abs(pred - meas) / meas)
        assert mape == pytest.approx(meta["accuracy"][target]["overall"]["mape"], rel=1e-9)
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


def test_another_optimisers_step_is_read_from_its_features_and_the_fingerprint_is_left_as_it_is(tx2):
    """``for_optimizer`` (predict --optimizer): the TX2's SGD fingerprint given Adam's features (its second moment
    in the analytic memory and the allocator replay, its longer update) predicts a slower, larger step; the
    fingerprint itself still predicts SGD's."""
    from perf4sight.fingerprint import for_optimizer
    tmp, _, descs, _ = tx2
    fp = load_fingerprint(tmp / "fp" / "tx2")
    adam = for_optimizer(fp, "adam")
    assert (fp.optimizer, adam.optimizer, adam.fitted_optimizer) == ("sgd", "adam", "sgd")
    before = fp.predict(descs["resnet50_0"], 8)[0]
    told = adam.predict(descs["resnet50_0"], 8)[0]
    assert told["memory_mb"] > before["memory_mb"] and told["latency_ms"] > before["latency_ms"]
    assert fp.predict(descs["resnet50_0"], 8)[0] == before
    with pytest.raises(UserError, match="^for_optimizer: unknown optimizer 'lamb'"):  # a ValueError before
        for_optimizer(fp, "lamb")
    with pytest.raises(UserError, match="^for_optimizer: unknown optimizer None"):
        for_optimizer(fp, None)
    assert for_optimizer(fp, "ADAM").optimizer == "adam"


def test_max_batch_size_follows_the_oom_data(tx2):
    tmp, rows, descs, _ = tx2
    fp = load_fingerprint(tmp / "fp" / "tx2")
    small, big = fp.max_batch_size(descs["resnet18_90"]), fp.max_batch_size(descs["resnet50_0"])
    assert 0 < big < small
    first_oom = min(int(r["batch_size"]) for r in rows if r["network"] == "resnet50_0" and r["status"] == "oom")
    assert big < first_oom * 1.5


def test_the_largest_batch_is_checked_one_by_one_below_the_boundary(tx2):
    """An allocator replay's reserved memory steps up and down as the batch grows: squeezenet_50 fitted at 204 and
    206, not at 205 or 207, and --max-batch-size said 206 while claiming every batch 1..b fits."""
    from perf4sight.fingerprint.predict import largest_fitting

    dips = {205, 150}
    asked: list[int] = []

    def over(b: int) -> bool:
        asked.append(b)
        return b in dips or b >= 207

    assert largest_fitting(over, 4096) == 204  # 150 lies outside the window below 204: bisection's assumption
    assert len(asked) == len(set(asked)) < 40  # each size predicted once
    assert largest_fitting(lambda b: b >= 5 or b == 3, 100) == 2 and largest_fitting(lambda b: True, 100) == 0
    assert largest_fitting(lambda b: b == 99, 100) == 98 and largest_fitting(lambda b: False, 100) == 100
    tmp, rows, descs, _ = tx2
    fp = load_fingerprint(tmp / "fp" / "tx2")
    for name in ("squeezenet_50", "resnet18_30"):
        top = fp.max_batch_size(descs[name])
        fits = [r["fits"] for r in fp.predict(descs[name], list(range(max(1, top - 12), top + 2)))]
        assert all(fits[:-1]) and not fits[-1], (name, top, fits)


def test_single_family_falls_back_to_network_folds(tx2, tmp_path):
    _, rows, descs, _ = tx2
    sub = [r for r in rows
           if r["family"] == "squeezenet" and r["network"] in ("squeezenet_0", "squeezenet_50", "squeezenet_90")]
    meta = fit_fingerprint(sub, descs, "tx2", tmp_path / "fp", replace(FAST, model="gradient-boosting"))
    assert meta["accuracy"]["latency"]["grouping"] == "network"
    assert "one network family" in meta["accuracy"]["latency"]["note"]
    assert set(meta["accuracy"]["memory"]["per_group"]) == {"squeezenet_0", "squeezenet_50", "squeezenet_90"}


def test_rows_without_a_family_cell_are_folded_by_their_descriptions_family(tx2, tmp_path):
    """Rows with an empty ``family`` cell (a CSV made by hand) were grouped by their network's own name: each pruning
    level a "family", held out with the other levels of its network in training, under a leave-one-family-out
    header. They are folded by their description's family now, as rows that name it."""
    _, rows, descs, _ = tx2
    keep = ("squeezenet_0", "squeezenet_50", "squeezenet_90", "resnet18_0", "resnet18_50", "resnet18_90")
    sub = [dict(r, family="") for r in rows if r["network"] in keep]
    meta = fit_fingerprint(sub, descs, "tx2", tmp_path / "fp", replace(FAST, n_estimators=5))
    for target in ("latency", "memory"):
        assert meta["accuracy"][target]["grouping"] == "family"
        assert set(meta["accuracy"][target]["per_group"]) == {"squeezenet", "resnet18"}, target
    # the compare stage, refitting where it has no held_out.csv, folds them alike: the table's figure again
    from perf4sight.report.data import measured_vs_predicted

    fp = load_fingerprint(tmp_path / "fp")
    fp.held_out = {}
    meas, pred, _ = measured_vs_predicted(fp, sub, descs)["latency"]
    assert 100 * np.mean(np.abs(pred - meas) / meas) == pytest.approx(meta["accuracy"]["latency"]["overall"]["mape"])


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
    with pytest.warns(UserWarning, match="tiny: described at input shape 3x32x32.*3x224x224"):
        out = fp.predict_module(net, [3, 32, 32], [4, 8], name="tiny")
    assert [p["batch_size"] for p in out] == [4, 8] and all(p["memory_mb"] > 0 for p in out)


def test_metadata_has_selection_random_split_and_interval(tx2):
    _, _, _, meta = tx2
    from perf4sight.fingerprint.select import CANDIDATES, FULL_MEMORY_FORM, OVERLAP_FORM
    for target in ("latency", "memory"):
        acc = meta["accuracy"][target]
        sel = acc["selection"]
        assert sel["chosen"] in {c.name for c in CANDIDATES[target]}
        assert set(sel["cv_mean_group_mape"]) == {c.name for c in CANDIDATES[target] if "gpu" in c.kinds}
        # a GPU prefers the overlap form for step time and the form with every physical term for memory
        assert sel["preferred"] == (OVERLAP_FORM if target == "latency" else FULL_MEMORY_FORM)
        best = min(sel["cv_mean_group_mape"].values())
        assert sel["cv_mean_group_mape"][sel["chosen"]] == best or sel["chosen"] == sel["preferred"]
        assert acc["random_split"]["n"] == acc["overall"]["n"] and 0 < acc["random_split"]["mape"] < 40
        # other pruning levels of a family in training are easier to predict than a family never seen
        split = acc["network_split"]
        assert split["n"] == acc["overall"]["n"] and 0 < split["mape"] < acc["overall"]["mape"], (target, split)
        assert acc["network_split_seen"] == split  # every TX2 family has other pruning levels in training
        lo, hi = meta["interval"]["log_ratio_quantiles"][target]
        assert lo < 0 < hi
        # another pruning level of a family the TX2 ran: a narrower band, checked on networks held out that way
        seen_lo, seen_hi = meta["interval"]["log_ratio_quantiles_seen"][target]
        assert lo < seen_lo < 0 < seen_hi < hi and acc["interval_seen_coverage_held_out"] >= 85, (target, acc)
        assert meta["linear_terms"][target][0] == "one"
        assert 50 < acc["interval_coverage_held_out"] <= 100  # 4 families: each checked against the others' band
    lines = accuracy_lines(meta)
    assert any("random 5-fold split" in line for line in lines)
    assert any(line.strip().startswith(NETWORK_SPLIT) for line in lines)
    assert any("model chosen by grouped CV" in line for line in lines)
    chosen = [line for line in lines if "model chosen by grouped CV" in line]
    # each chosen form says why: the preferred form's margin, or its CV score beside the runner-up's
    assert all("preferred form" in line or "runner-up" in line for line in chosen)
    assert any("90% interval" in line and "of a held-out family's rows" in line for line in lines)


def test_accuracy_table_is_nested(tx2, tmp_path):
    """Each held-out family's row is what a fingerprint fitted without that family predicts for it: the
    family takes no part in choosing the model form (checked for one family, memory)."""
    _, rows, descs, meta = tx2
    acc = meta["accuracy"]["memory"]
    assert acc["nested"] and set(acc["forms_per_fold"]) == set(acc["per_group"])
    # the form is chosen, and the model fitted, before (and whatever) the accuracy table: no nesting needed here
    without = fit_fingerprint([r for r in rows if r["family"] != "squeezenet"], descs, "tx2", tmp_path / "fp", FAST,
                              nested=False)
    fp = load_fingerprint(tmp_path / "fp")
    assert acc["forms_per_fold"]["squeezenet"] == without["accuracy"]["memory"]["selection"]["chosen"]
    ok = [r for r in rows
          if r["family"] == "squeezenet" and r["status"] == "ok" and float(r["device_mem_used_mb"] or 0) > 0]
    pred = np.array([fp.predict(descs[r["network"]], int(r["batch_size"]))[0]["memory_mb"] for r in ok])
    meas = np.array([float(r["device_mem_used_mb"]) for r in ok])
    assert 100 * np.mean(np.abs(pred - meas) / meas) == pytest.approx(acc["per_group"]["squeezenet"]["mape"], rel=1e-6)
    assert any("chosen without the held-out family" in line for line in accuracy_lines(meta))
    flat = {**meta, "accuracy": {t: {**a, "nested": False} for t, a in meta["accuracy"].items()}}
    assert sum("a little optimistic" in line for line in accuracy_lines(flat)) == 2  # too many groups to nest


def test_two_families_say_why_no_form_was_chosen_and_no_interval_tested(tx2):
    """With two families the form is kept, not chosen, and the interval is not tested on a held-out
    family: the table says so instead of leaving the runner-up and the coverage out silently."""
    _, _, _, meta = tx2
    two = {**meta, "accuracy": {t: {**a, "per_group": dict(list(a["per_group"].items())[:2]),
                                    "selection": {**a["selection"], "cv_mean_group_mape": {
                                        a["selection"]["chosen"]: 5.0}},
                                    "interval_coverage_held_out": None}
                                for t, a in meta["accuracy"].items()}}
    lines = accuracy_lines(two)
    assert not any("model chosen by grouped CV" in line for line in lines)
    assert sum("model form kept" in line and "with 2 familys" not in line and "it needs 3 or more" in line
               for line in lines) == 2
    assert sum("not tested on a held-out family: that needs 3 or more" in line for line in lines) == 2


def test_latency_trees_read_work_per_launch_and_older_trees_still_predict():
    """Step time's tree correction also reads ``lt_work_per_launch`` (appended last); a latency model whose
    trees were fitted on the shared inputs alone (a fingerprint saved before) predicts as it did."""
    from perf4sight.features.aggregate import FEATURE_NAMES
    from perf4sight.fingerprint.trees import TREE_FEATURES, TargetModel, tree_features, tree_inputs
    assert tree_features("latency") == TREE_FEATURES + ("lt_work_per_launch",)
    assert tree_features("memory") == TREE_FEATURES
    rng = np.random.default_rng(0)
    F = rng.uniform(1, 100, size=(80, len(FEATURE_NAMES)))
    y = F[:, FEATURE_NAMES.index("batch_size")] * rng.uniform(0.8, 1.2, 80) + 5
    new = TargetModel.fit("latency", F, y, n_estimators=10, terms=("one", "batch_size"))
    assert new.correction is not None and tree_inputs(F, "latency").shape[1] == len(TREE_FEATURES) + 1
    shared = tree_inputs(F).astype(np.float32)  # the inputs before lt_work_per_launch was added
    old_trees = make_regressor("extra-trees", 10, 1, 0).fit(shared, np.log(y / new.analytic(F)))
    old = TargetModel("latency", new.terms, new.coef, TreeEnsemble.from_sklearn(old_trees))
    expected = new.analytic(F) * np.exp(old_trees.predict(shared))
    np.testing.assert_allclose(old.predict(F), expected, rtol=1e-6)


def test_group_conformal_covers_every_group():
    from perf4sight.fingerprint.select import group_conformal
    rng = np.random.default_rng(1)
    tight, wide = rng.normal(0, 0.01, 200), rng.normal(0.3, 0.1, 40)  # one group is biased and wider
    r = np.concatenate([tight, wide])
    g = np.array(["a"] * 200 + ["b"] * 40)
    lo, hi = group_conformal(r, g, 0.9)
    pooled_hi = np.quantile(r, 0.95)
    assert hi > pooled_hi and np.mean((wide >= lo) & (wide <= hi)) >= 0.9
    assert np.mean((tight >= lo) & (tight <= hi)) >= 0.9
    # under 5 residuals: the largest error both ways, widened by (n + 1) / n (it was [0, 0], a band of no width)
    assert group_conformal(np.array([0.1, -0.2]), np.array(["a", "b"]), 0.9) == pytest.approx([-0.3, 0.3])
    assert group_conformal(np.array([np.nan]), np.array(["a"]), 0.9) == [0.0, 0.0]


def test_group_conformal_of_small_groups_covers_new_errors_at_its_nominal_level():
    """Where no group had 5 residuals the band was the pooled central 90% quantiles, no finite-sample correction: of
    6 errors (2 networks, 3 batch sizes) it covered 82% of new errors of their own distribution, 84% of 8, under the
    85% the interval must hold. It is split conformal's band of the pooled errors now (at 6 or 8: the largest,
    widened)."""
    from perf4sight.fingerprint.select import group_conformal

    rng = np.random.default_rng(0)
    for networks, rows in ((2, 3), (2, 4), (3, 3), (12, 3)):
        covered = []
        for _ in range(300):
            lo, hi = group_conformal(rng.normal(size=networks * rows), np.repeat(np.arange(networks), rows), 0.9)
            new = rng.normal(size=200)
            covered.append(np.mean((new >= lo) & (new <= hi)))
        assert 0.88 <= np.mean(covered) <= 0.95, (networks, rows, np.mean(covered))


def test_a_seen_family_band_that_covers_too_little_at_its_widest_gives_way_to_the_family_band():
    """The band of a network of a training family was stored at the whole range of the held-out networks' errors
    where no level reached 90% (5 TX2 networks of two families: x0.89..x1.15 for memory, covering 80% of a held-out
    network's rows, beside a family band of x0.53..x1.89). It is not stored then: such a query gets the family
    band, and the table says why."""
    from perf4sight.fingerprint.select import NetworkSplit, seen_family_band

    nets = np.repeat(["a", "b", "c", "d"], 5)
    errors = np.concatenate([np.linspace(-0.01, 0.01, 5)] * 3 + [np.full(5, 0.5)])  # d far outside the others'
    y = np.full(20, 100.0)
    split = NetworkSplit({}, y / np.exp(errors), np.ones(20, dtype=bool))
    band, covered = seen_family_band(y, split, nets, 0.9)
    assert band is None and covered == pytest.approx(75.0)
    near = NetworkSplit({}, y / np.exp(np.concatenate([np.linspace(-0.01, 0.01, 5)] * 4)), np.ones(20, dtype=bool))
    assert seen_family_band(y, near, nets, 0.9)[0] is not None  # one that holds is kept
    m = {"n": 20, "mape": 1.0, "rmspe": 1.0, "within10": 100.0}
    meta = {"accuracy": {"memory": {"column": "device_mem_used_mb", "grouping": "family", "overall": m,
                                    "per_group": {"f": m, "g": m}, "interval_seen_coverage_held_out": covered}},
            "interval": {"coverage": 0.9, "log_ratio_quantiles": {"memory": [-0.6, 0.6]}}}
    assert accuracy_lines(meta)[-1] == ("  for a network of a training family: this band too (one of their own, at its "
                                        "widest, covered only 75% of a held-out network's rows)")


def test_group_conformal_is_symmetric_with_few_groups_and_one_sided_with_many():
    from perf4sight.fingerprint.select import group_conformal
    rng = np.random.default_rng(2)
    few = rng.normal(0.2, 0.02, 60)  # two families, both over-predicted by ~20 %
    lo, hi = group_conformal(few, np.array(["a"] * 30 + ["b"] * 30), 0.9)
    assert lo == pytest.approx(-hi) and hi > 0.2  # a third family's bias may fall on the other side
    many = rng.normal(0.2, 0.02, 300)  # twelve families: enough for the conformal promise
    lo, hi = group_conformal(many, np.array([f"f{i % 12}" for i in range(300)]), 0.9)
    assert lo == 0.0 and hi > 0.2


def test_select_candidate_prefers_the_right_form():
    """Memory that is exactly linear in the analytic estimate: the analytic-only form must not lose."""
    from perf4sight.features.aggregate import FEATURE_NAMES
    from perf4sight.fingerprint.select import select_candidate
    rng = np.random.default_rng(0)
    F = np.abs(rng.normal(1, 0.5, size=(120, len(FEATURE_NAMES)))) * 100
    y = 1000 + 2.0 * F[:, FEATURE_NAMES.index("mem_analytic_mb")]
    groups = np.repeat(np.array(["a", "b", "c", "d"]), 30)
    cand, cv, scores = select_candidate("memory", F, y, groups, "family", "extra-trees", 10, 1, 0)
    assert scores[cand.name] == min(scores.values())
    assert scores["analytic only"] < 1e-6 and cv.overall["mape"] < 1e-6


def test_forms_for_one_device_kind_are_scored_on_that_kind_only():
    """The bent replay forms model a GPU's used memory against its allocator's reserved memory: a cpu device's
    choice never scores them, a gpu device's does (the simulated columns filled in, as the replay does); the form
    with exact parameter copies models a CPU's peak RSS, and the other way round."""
    from perf4sight.features.aggregate import FEATURE_NAMES
    from perf4sight.fingerprint.select import CANDIDATES, COPIES_FORM, FULL_MEMORY_FORM, select_candidate
    rng = np.random.default_rng(2)
    F = np.abs(rng.normal(1, 0.5, size=(80, len(FEATURE_NAMES)))) * 100
    y = 900 + 1.5 * F[:, FEATURE_NAMES.index("sim_reserved_mb")]
    groups = np.repeat(np.array(["a", "b", "c", "d"]), 20)
    F[:, FEATURE_NAMES.index("blas_context")] = np.isin(groups, ["a", "b"])  # networks with and without a linear layer
    gpu_only = {c.name for c in CANDIDATES["memory"] if c.kinds == ("gpu",)}
    cpu_only = {c.name for c in CANDIDATES["memory"] if c.kinds == ("cpu",)}
    assert FULL_MEMORY_FORM in gpu_only and COPIES_FORM in cpu_only
    args = ("memory", F, y, groups, "family", "extra-trees", 5, 1, 0)
    _, _, on_cpu = select_candidate(*args, kind="cpu")
    _, _, on_gpu = select_candidate(*args, kind="gpu")
    assert not gpu_only & set(on_cpu) and gpu_only <= set(on_gpu)
    assert not cpu_only & set(on_gpu) and cpu_only <= set(on_cpu)
    assert set(on_cpu) - cpu_only < set(on_gpu)


def test_mean_form_is_its_members_geometric_mean_and_round_trips(tmp_path):
    """The mean of the step-time forms: its prediction is the geometric mean of its members', their tree
    corrections for a query of a training family only (the analytic parts for any other); its score, over held-out
    families, is the analytic parts' own grouped CV; it is offered on a CPU only; a fingerprint holding one loads to
    the same predictions, families included."""
    from perf4sight.features.aggregate import FEATURE_NAMES
    from perf4sight.fingerprint.evaluate import grouped_cv
    from perf4sight.fingerprint.select import CANDIDATES, MEAN_FORM, analytic_parts, fit_form, select_candidate
    from perf4sight.fingerprint.storage import load_models, save_models
    from perf4sight.fingerprint.trees import MeanModel
    rng = np.random.default_rng(3)
    F = np.abs(rng.normal(1, 0.5, size=(80, len(FEATURE_NAMES)))) * 100
    F[:, FEATURE_NAMES.index("linear_macs")] *= 0.01  # convolution networks (a classifier's share of the MACs)
    y = 20 + 0.3 * F[:, FEATURE_NAMES.index("dense_macs")] + 0.1 * F[:, FEATURE_NAMES.index("lt_launches")]
    groups = np.repeat(np.array(["a", "b", "c", "d"]), 20)
    mean = next(c for c in CANDIDATES["latency"] if c.name == MEAN_FORM)
    forms = [c for c in CANDIDATES["latency"] if not c.members]
    assert mean.kinds == ("cpu",) and list(mean.members) == forms and any(c.correct for c in forms)
    assert not any(m.correct for m in analytic_parts(mean).members)

    direct = grouped_cv(F, y, groups, "family", lambda a, b, c: fit_form("latency", analytic_parts(mean), a, b,
                                                                         "extra-trees", 5, 1, 0).predict(c))
    args = ("latency", F, y, groups, "family", "extra-trees", 5, 1, 0)
    _, _, on_cpu = select_candidate(*args, kind="cpu")
    _, _, on_gpu = select_candidate(*args, kind="gpu")
    assert on_cpu[MEAN_FORM] == pytest.approx(np.mean([m["mape"] for m in direct.per_group.values()]))
    assert MEAN_FORM not in on_gpu and set(on_gpu) == set(on_cpu) - {MEAN_FORM}
    model = fit_form("latency", mean, F, y, "extra-trees", 5, 1, 0, groups)
    assert model.families == ("a", "b", "c", "d") and model.corrected
    queries = ["a", "unseen", "d", "b"] * 20  # one family name per row of F
    trees = model.trees_for(queries)
    assert trees.tolist() == [q != "unseen" for q in queries]
    full = np.exp(np.log([m.predict(F) for m in model.members]).mean(axis=0))
    analytic = np.exp(np.log([np.maximum(m.analytic(F), 1e-9) for m in model.members]).mean(axis=0))
    gated = model.predict(F, trees)
    np.testing.assert_allclose(gated[trees], full[trees])
    np.testing.assert_allclose(gated[~trees], analytic[~trees])
    assert np.abs(np.log(full / analytic)).max() > 1e-3  # the trees change something: the gate could fail
    save_models(tmp_path, {"latency": model}, {"device": "x"})
    loaded, meta = load_models(tmp_path)
    assert isinstance(loaded["latency"], MeanModel) and len(meta["models"]["latency"]["members"]) == len(mean.members)
    assert loaded["latency"].families == model.families
    np.testing.assert_allclose(loaded["latency"].predict(F, loaded["latency"].trees_for(queries)), gated)


def test_mean_form_members_blind_to_linear_work_learn_from_the_convolution_rows(tmp_path):
    """Rows of networks whose work is mostly matrix products beside convolution networks: the mean form's members
    that count convolutions' MACs and not a linear layer's are fitted on the convolution rows alone (as if the others
    were not there) and left out of the mean for a matrix-product query; the members that see both are fitted on
    every row. Rows of one kind leave the mean as it was. A stored model keeps the rule."""
    from perf4sight.features.aggregate import FEATURE_NAMES
    from perf4sight.fingerprint.select import CANDIDATES, MEAN_FORM, fit_form
    from perf4sight.fingerprint.storage import load_models, save_models
    from perf4sight.fingerprint.trees import blind_to_linear_work, gemm_dominated, geometric_mean
    rng = np.random.default_rng(4)
    F = np.abs(rng.normal(1, 0.5, size=(80, len(FEATURE_NAMES)))) * 100
    col = {n: FEATURE_NAMES.index(n) for n in ("linear_macs", "macs", "dense_macs", "lt_launches")}
    F[:, col["linear_macs"]] = 0.01 * F[:, col["macs"]]
    F[60:, col["linear_macs"]] = 0.9 * F[60:, col["macs"]]  # family d: an encoder's matrix products
    y = 20 + 0.3 * F[:, col["dense_macs"]] + 0.1 * F[:, col["lt_launches"]] + 0.5 * F[:, col["linear_macs"]]
    groups = np.repeat(np.array(["a", "b", "c", "d"]), 20)
    gemm = gemm_dominated(F)
    assert gemm.tolist() == [False] * 60 + [True] * 20
    mean = next(c for c in CANDIDATES["latency"] if c.name == MEAN_FORM)
    blind = [blind_to_linear_work(m.terms) for m in mean.members]
    assert any(blind) and not all(blind)  # the analytic forms, and the kernel-term and overlap forms
    model = fit_form("latency", mean, F, y, "extra-trees", 5, 1, 0, groups)
    assert model.gemm_split
    for m, b, fitted in zip(mean.members, blind, model.members):
        rows = ~gemm if b else slice(None)
        alone = fit_form("latency", m, F[rows], y[rows], "extra-trees", 5, 1, 0)
        np.testing.assert_allclose(fitted.predict(F), alone.predict(F))
    pred = model.predict(F, np.zeros(len(F), bool))
    parts = [m.predict(F, np.zeros(len(F), bool)) for m in model.members]
    np.testing.assert_allclose(pred[~gemm], geometric_mean(parts)[~gemm])
    np.testing.assert_allclose(pred[gemm], geometric_mean([p for p, b in zip(parts, blind) if not b])[gemm])
    assert np.abs(np.log(pred[gemm] / geometric_mean(parts)[gemm])).max() > 1e-3  # the rule changes something
    save_models(tmp_path, {"latency": model}, {"device": "x"})
    loaded = load_models(tmp_path)[0]["latency"]
    assert loaded.gemm_split
    np.testing.assert_allclose(loaded.predict(F, np.zeros(len(F), bool)), pred)
    assert not fit_form("latency", mean, F[:60], y[:60], "extra-trees", 5, 1, 0, groups[:60]).gemm_split


def test_cpu_mean_form_is_kept_whatever_the_scores(monkeypatch):
    """The CPU's preferred step-time form, the mean form, is kept even where a member beats it by more than one
    standard error (under that rule alone the member would win on these rows), and the metadata says so."""
    import perf4sight.fingerprint.select as select
    from perf4sight.features.aggregate import FEATURE_NAMES
    from perf4sight.fingerprint.predict import _why_chosen
    rng = np.random.default_rng(3)
    F = np.abs(rng.normal(1, 0.5, size=(80, len(FEATURE_NAMES)))) * 100
    y = 20 + 0.3 * F[:, FEATURE_NAMES.index("dense_macs")] + 0.1 * F[:, FEATURE_NAMES.index("lt_launches")]
    groups = np.repeat(np.array(["a", "b", "c", "d"]), 20)
    args = ("latency", F, y, groups, "family", "extra-trees", 5, 1, 0)
    cand, _, scores = select.select_candidate(*args, kind="cpu", prefer=select.MEAN_FORM)
    assert cand.name == select.MEAN_FORM and scores[select.MEAN_FORM] > min(scores.values())
    record = select.describe_choice(cand, scores, select.MEAN_FORM)
    assert record["rule"] == select.RULE_KEPT and "kept whatever the scores" in _why_chosen(record)
    monkeypatch.setattr(select, "KEPT_WHATEVER_THE_SCORES", frozenset())
    cand, _, _ = select.select_candidate(*args, kind="cpu", prefer=select.MEAN_FORM)
    assert cand.name == min(scores, key=scores.get) != select.MEAN_FORM


def test_cpu_memory_form_counts_the_parameter_copies_at_their_bytes():
    """The CPU's memory form holds the parameter copies' coefficient at 1 whatever the rows say (here they rise
    twice as fast), fits the constant and the slope on the rest, applies its trees to the families seen only, and is
    kept whatever the scores; an exact term cannot sit in a saturating form."""
    import perf4sight.fingerprint.select as select
    from perf4sight.features.aggregate import FEATURE_NAMES
    from perf4sight.fingerprint.fit import choice_rule
    from perf4sight.fingerprint.trees import CEILING, TargetModel
    rng = np.random.default_rng(4)
    F = np.abs(rng.normal(1, 0.5, size=(80, len(FEATURE_NAMES)))) * 100
    copies, rest = (F[:, FEATURE_NAMES.index(k)] for k in ("param_copies_mb", "mem_analytic_rest_mb"))
    terms = ("one", "param_copies_mb", "mem_analytic_rest_mb")
    exact = TargetModel.fit("memory", F, 600 + copies + 1.4 * rest, correct=False, terms=terms)
    np.testing.assert_allclose(exact.coef, [600, 1, 1.4], rtol=1e-6)
    steeper = TargetModel.fit("memory", F, 600 + 2 * copies + 1.4 * rest, correct=False, terms=terms)
    assert steeper.coef[1] == 1.0
    with pytest.raises(ValueError, match="plain linear sum"):
        TargetModel.fit("memory", F, 600 + copies, correct=False, terms=terms + (CEILING,))

    assert choice_rule("memory", "peak_rss_mb") == ("cpu", select.COPIES_FORM)
    y = 900 + 1.5 * F[:, FEATURE_NAMES.index("sim_reserved_mb")]  # rows another form fits far better
    groups = np.repeat(np.array(["a", "b", "c", "d"]), 20)
    args = ("memory", F, y, groups, "family", "extra-trees", 5, 1, 0)
    cand, _, scores = select.select_candidate(*args, kind="cpu", prefer=select.COPIES_FORM)
    assert cand.name == select.COPIES_FORM and scores[select.COPIES_FORM] > min(scores.values())
    model = select.fit_form("memory", cand, F, y, "extra-trees", 5, 1, 0, groups)
    assert model.members[0].coef[1] == 1.0 and model.corrected
    queries = ["a", "unseen"] * 40
    gated = model.predict(F, model.trees_for(queries))
    analytic = model.members[0].analytic(F)
    np.testing.assert_allclose(gated[1::2], analytic[1::2])
    assert np.abs(np.log(gated[::2] / analytic[::2])).max() > 1e-3


def test_preferred_form_is_kept_within_one_standard_error_only():
    """The one-standard-error rule, paired over the held-out groups: a preferred form that loses by
    less than the spread of its per-group differences is kept; one that loses in every group is not."""
    from perf4sight.features.aggregate import FEATURE_NAMES
    from perf4sight.fingerprint.evaluate import CVResult
    from perf4sight.fingerprint.select import _within_one_se, select_candidate

    def cv(*mapes: float) -> CVResult:
        return CVResult(np.array([]), {g: {"mape": m} for g, m in zip("abc", mapes)}, {}, "family")

    assert _within_one_se(cv(10, 5, 8), cv(8, 7, 7))        # differences +2 -2 +1: noise
    assert not _within_one_se(cv(10, 9.5, 8.5), cv(8, 7, 7))  # +2 +2.5 +1.5: worse in every group
    assert not _within_one_se(cv(10), cv(8))                  # one group: no spread to judge by
    rng = np.random.default_rng(0)
    F = np.abs(rng.normal(1, 0.5, size=(120, len(FEATURE_NAMES)))) * 100
    y = 1000 + 2.0 * F[:, FEATURE_NAMES.index("mem_analytic_mb")]
    groups = np.repeat(np.array(["a", "b", "c", "d"]), 30)
    args = ("memory", F, y, groups, "family", "extra-trees", 10, 1, 0)
    cand, _, scores = select_candidate(*args, prefer="split analytic x trees")  # worse on every family
    assert scores[cand.name] == min(scores.values()) < 1e-6 < 0.1 < scores["split analytic x trees"]
    few = np.repeat(np.array(["a", "b"]), 60)  # too few groups to choose on: the preferred form is kept
    cand, _, scores = select_candidate("memory", F, y, few, "family", "extra-trees", 10, 1, 0, prefer="analytic only")
    assert cand.name == "analytic only" and list(scores) == ["analytic only"]


def test_context_flag_term_is_learnt_only_where_it_varies():
    """The BLAS-context term: with networks of both kinds its offset is recovered; where every training
    network has a linear layer the constant keeps the whole offset (the flag's coefficient stays 0)."""
    from perf4sight.features.aggregate import FEATURE_NAMES
    from perf4sight.fingerprint.trees import TargetModel
    rng = np.random.default_rng(1)
    F = np.zeros((80, len(FEATURE_NAMES)))
    F[:, FEATURE_NAMES.index("mem_analytic_mb")] = rng.uniform(100, 4000, 80)
    F[:, FEATURE_NAMES.index("blas_context")] = np.arange(80) % 2
    y = 1300 + 150 * F[:, FEATURE_NAMES.index("blas_context")] + 1.1 * F[:, FEATURE_NAMES.index("mem_analytic_mb")]
    terms = ("one", "mem_analytic_mb", "blas_context")
    np.testing.assert_allclose(TargetModel.fit("memory", F, y, correct=False, terms=terms).coef, [1300, 1.1, 150],
                               rtol=1e-6)
    ones = F[F[:, FEATURE_NAMES.index("blas_context")] == 1]
    coef = TargetModel.fit("memory", ones, y[F[:, FEATURE_NAMES.index("blas_context")] == 1], correct=False,
                           terms=terms).coef
    np.testing.assert_allclose(coef, [1450, 1.1, 0.0], rtol=1e-6, atol=1e-9)


def test_batched_predict_equals_one_by_one_and_capacity_basis(tx2):
    tmp, _, descs, meta = tx2
    fp = load_fingerprint(tmp / "fp" / "tx2")
    assert meta["capacity_basis"] == "analytic" and fp.capacity_basis == "analytic"
    nets = [descs["resnet18_0"], descs["squeezenet_50"], descs["mobilenetv2_20"]]
    together = fp.predict(nets, [3, 40])
    apart = [p for d in nets for p in fp.predict(d, [3, 40])]
    assert together == apart
    # fits and max_batch_size agree: every batch up to the max fits, the next one does not
    m = fp.max_batch_size(descs["resnet50_0"])
    assert [p["fits"] for p in fp.predict(descs["resnet50_0"], [m, m + 1])] == [True, False]


def test_memory_replay_reads_memory_as_the_rows_profiler_did(tx2):
    """Imported perf4sight rows are replayed under perf4sight's protocol, at the fit and at predict
    alike; this tool's own rows under the run's peak; a fingerprint from before keeps the step mean."""
    from perf4sight.features.aggregate import feature_matrix, network_features
    from perf4sight.features.alloc_trace import attach_simulation
    from perf4sight.fingerprint.fit import memory_replay
    tmp, rows, descs, meta = tx2
    assert meta["memory_replay"] == "perf4sight" == memory_replay(rows)
    assert "  allocator replay: as perf4sight's profiler read it: cache emptied before every step, warm-up read " \
        "twice" in accuracy_lines(meta)
    assert memory_replay([dict(r, protocol="cuda_events") for r in rows[:3]] + rows[3:]) == "run_peak"
    fp = load_fingerprint(tmp / "fp" / "tx2")
    assert fp.memory_replay == "perf4sight" and "sim_reserved_mb" in fp.models["memory"].terms
    desc, batches = descs["resnet18_50"], [8, 96, 210]
    got = [p["memory_mb"] for p in fp.predict(desc, batches)]
    want = {proto: fp.models["memory"].predict(feature_matrix(attach_simulation(network_features(desc), desc, proto),
                                                              batches)) for proto in ("perf4sight", "run_peak")}
    np.testing.assert_allclose(got, want["perf4sight"], rtol=1e-9)
    assert not np.allclose(got, want["run_peak"], rtol=1e-3)
    older = {k: v for k, v in fp.metadata.items() if k != "memory_replay"}
    assert type(fp)(fp.models, older).memory_replay == "step_mean"


def test_capacity_basis_is_the_demand_where_the_memory_form_saturates():
    from perf4sight.fingerprint.fit import capacity_basis
    from perf4sight.fingerprint.trees import CEILING, TargetModel
    linear = TargetModel("memory", ("one", "mem_analytic_mb"), np.array([300.0, 1.0]), None)
    saturating = TargetModel("memory", ("one", "mem_analytic_mb", CEILING), np.array([300.0, 1.0, 6000.0]), None)
    assert capacity_basis(7000.0, 7000.0, linear) == "prediction"      # a configured limit: the prediction
    assert capacity_basis(6900.0, 0.0, linear) == "analytic"           # learnt from oom rows: the demand
    assert capacity_basis(7000.0, 7000.0, saturating) == "analytic"    # the prediction never reaches the limit
    assert capacity_basis(None, 0.0, saturating) == "prediction"       # unknown capacity: everything fits
    F = np.zeros((1, len(FEATURE_NAMES)))
    F[0, FEATURE_NAMES.index("mem_analytic_mb")] = 9000.0
    assert saturating.predict(F)[0] < 6000.0 < 7000.0 < saturating.demand(F)[0]


def test_overlap_form_recovers_host_and_device_time(tmp_path):
    """Steps whose time is the smooth maximum of a launch-bound host time and a work-bound device
    time: the overlap fit recovers both sums (flat at small work, proportional at large), a never-seen
    term keeps a zero coefficient, and the form survives a save/load round trip."""
    from perf4sight.features.aggregate import FEATURE_NAMES
    from perf4sight.fingerprint.storage import load_models, save_models
    from perf4sight.fingerprint.trees import OVERLAP, OVERLAP_P, TargetModel
    rng = np.random.default_rng(3)
    F = np.zeros((200, len(FEATURE_NAMES)))
    col = FEATURE_NAMES.index
    F[:, col("lt_launches")] = rng.integers(200, 1200, 200)
    F[:, col("lt_gemm_padded64_macs")] = 10 ** rng.uniform(8, 12, 200)
    host = 15.0 + 0.1 * F[:, col("lt_launches")]
    device = 2e-9 * F[:, col("lt_gemm_padded64_macs")]
    y = (host ** OVERLAP_P + device ** OVERLAP_P) ** (1 / OVERLAP_P)
    terms = ("one", "lt_launches", OVERLAP, "lt_gemm_padded64_macs", "lt_dw_bytes")
    tm = TargetModel.fit("latency", F, y, correct=False, terms=terms)
    np.testing.assert_allclose(tm.coef, [15.0, 0.1, 2e-9, 0.0], rtol=1e-3)
    assert np.max(np.abs(tm.predict(F) / y - 1)) < 1e-4
    linear = TargetModel.fit("latency", F, y, correct=False, terms=("one", "lt_launches", "lt_gemm_padded64_macs"))
    assert np.mean(np.abs(linear.predict(F) / y - 1)) > 0.05  # a sum cannot follow the maximum
    save_models(tmp_path, {"latency": tm}, {})
    back, _ = load_models(tmp_path)
    assert back["latency"].terms == terms
    np.testing.assert_allclose(back["latency"].predict(F), tm.predict(F))


def test_step_time_sum_counts_the_optimizers_pass_over_the_parameters():
    """A step whose time is compute plus a per-parameter optimizer cost (whatever the batch size): the default
    step-time sum learns both from networks with few parameters, so it holds on a parameter-heavy network (an
    alexnet at 64x64, its step mostly the update of its 61 M parameters), where a sum without the term cannot."""
    from perf4sight.fingerprint.trees import LINEAR_TERMS, TargetModel
    rng = np.random.default_rng(5)
    col = FEATURE_NAMES.index
    F = np.zeros((120, len(FEATURE_NAMES)))
    F[:, col("batch_size")] = rng.choice([2, 8, 32], 120)
    F[:, col("dense_macs")] = F[:, col("batch_size")] * 10 ** rng.uniform(7, 9, 120)
    F[:, col("param_bytes")] = 4 * 10 ** rng.uniform(5, 7.3, 120)  # 0.1 M to 20 M parameters
    step_ms = lambda f: 4.0 + 2e-8 * f[:, col("dense_macs")] + 7e-8 * f[:, col("param_bytes")]  # noqa: E731
    alexnet = np.zeros((3, len(FEATURE_NAMES)))
    alexnet[:, col("batch_size")] = [2, 8, 32]
    alexnet[:, col("dense_macs")] = alexnet[:, col("batch_size")] * 1.9e8
    alexnet[:, col("param_bytes")] = 4 * 6.1e7
    assert "param_bytes" in LINEAR_TERMS["latency"]
    tm = TargetModel.fit("latency", F, step_ms(F), correct=False)
    assert np.max(np.abs(tm.predict(alexnet) / step_ms(alexnet) - 1)) < 0.02
    no_params = tuple(t for t in LINEAR_TERMS["latency"] if t != "param_bytes")
    blind = TargetModel.fit("latency", F, step_ms(F), correct=False, terms=no_params)
    assert np.mean(np.abs(blind.predict(alexnet) / step_ms(alexnet) - 1)) > 0.3


def test_native_conv_term_is_held_at_zero_off_a_one_thread_cpu():
    """``native_conv_macs`` (1x1 convolutions torch runs outside oneDNN on one CPU thread) stays in the feature rows
    of a one-thread cpu device and is zeroed for any other (more threads, a GPU, imported rows), so a fit there
    cannot give it weight."""
    from perf4sight.fingerprint.fit import hold_native_conv, native_conv_dispatch, step_runtime
    j = FEATURE_NAMES.index("native_conv_macs")
    one_thread = [{"backend": "cpu", "threads": 1}, {"backend": "cpu", "threads": "1"}]
    for rows, kept in ((one_thread, True), (one_thread + [{"backend": "cpu", "threads": 2}], False),
                       ([{"backend": "nvml", "threads": 1}], False), ([{"backend": "imported"}], False), ([], False)):
        assert native_conv_dispatch(rows) is kept
        F = np.ones((3, len(FEATURE_NAMES)))
        assert hold_native_conv(F, step_runtime(rows))[:, j].tolist() == ([1.0] * 3 if kept else [0.0] * 3)
        assert F[:, FEATURE_NAMES.index("dense_macs")].tolist() == [1.0] * 3  # nothing else touched


def test_saturating_form_recovers_demand_and_ceiling_and_capacity_compares_demand(tmp_path):
    """Memory that follows a linear demand and flattens under a ceiling (a device paging out near its
    limit): the saturating fit recovers the demand's coefficients and the ceiling, a linear sum cannot
    follow it, the capacity is compared with the demand (which keeps growing past the ceiling), and the
    form survives a save/load round trip."""
    from perf4sight.features.aggregate import FEATURE_NAMES
    from perf4sight.fingerprint.storage import load_models, save_models
    from perf4sight.fingerprint.trees import CEILING, CEILING_P, TargetModel
    rng = np.random.default_rng(5)
    F = np.zeros((300, len(FEATURE_NAMES)))
    F[:, FEATURE_NAMES.index("sim_reserved_mb")] = rng.uniform(100, 9000, 300)
    demand = 1200.0 + 0.9 * F[:, FEATURE_NAMES.index("sim_reserved_mb")]
    ceiling = 6300.0
    y = (demand ** -CEILING_P + ceiling ** -CEILING_P) ** (-1 / CEILING_P)
    terms = ("one", "sim_reserved_mb", "mem_analytic_mb", CEILING)
    tm = TargetModel.fit("memory", F, y, correct=False, terms=terms)
    np.testing.assert_allclose(tm.coef, [1200.0, 0.9, 0.0, ceiling], rtol=1e-3, atol=1e-6)
    assert np.max(np.abs(tm.predict(F) / y - 1)) < 1e-4
    np.testing.assert_allclose(tm.demand(F), demand, rtol=1e-3)
    assert tm.predict(F).max() < ceiling < tm.demand(F).max()
    linear = TargetModel.fit("memory", F, y, correct=False, terms=("one", "sim_reserved_mb"))
    assert np.mean(np.abs(linear.predict(F) / y - 1)) > 0.03  # a sum cannot follow the flattening
    save_models(tmp_path, {"memory": tm}, {})
    back, _ = load_models(tmp_path)
    assert back["memory"].terms == terms
    np.testing.assert_allclose(back["memory"].demand(F), tm.demand(F))


def test_hinged_form_learns_the_knot_and_keeps_a_zero_slope_where_there_is_no_bend(tmp_path):
    """Used memory that grows by 0.8 MiB per reserved MiB up to 2 GB and by 1.0 above (a Jetson's used-minus-
    reserved gap shrinking at first), saturating at a ceiling: the hinged fit finds the knot near 2 GB and the
    extra slope near 0.2, and fits better than the same form without the hinge; on memory that does not bend the
    hinge's slope stays at zero. The knot survives a save/load round trip."""
    from perf4sight.features.aggregate import FEATURE_NAMES
    from perf4sight.fingerprint.storage import load_models, save_models
    from perf4sight.fingerprint.trees import CEILING, CEILING_P, HINGE, KNOT, TargetModel, term_features
    rng = np.random.default_rng(6)
    F = np.zeros((400, len(FEATURE_NAMES)))
    reserved = rng.uniform(50, 8000, 400)
    F[:, FEATURE_NAMES.index("sim_reserved_mb")] = reserved
    demand = 1500.0 + 0.8 * reserved + 0.2 * np.maximum(reserved - 2000.0, 0.0)
    y = (demand ** -CEILING_P + 6300.0 ** -CEILING_P) ** (-1 / CEILING_P)
    terms = ("one", "sim_reserved_mb", HINGE, KNOT, CEILING)
    assert term_features(terms) == ["sim_reserved_mb"]
    tm = TargetModel.fit("memory", F, y, correct=False, terms=terms)
    one, slope, extra, knot, ceiling = tm.coef
    assert abs(knot - 2000.0) < 400 and abs(extra - 0.2) < 0.05 and abs(slope - 0.8) < 0.05
    assert abs(ceiling - 6300.0) < 100
    straight = TargetModel.fit("memory", F, y, correct=False, terms=("one", "sim_reserved_mb", CEILING))
    err = {name: np.mean(np.abs(m.predict(F) / y - 1)) for name, m in (("hinged", tm), ("straight", straight))}
    assert err["hinged"] < 0.01 < err["straight"]
    save_models(tmp_path, {"memory": tm}, {})
    back, _ = load_models(tmp_path)
    np.testing.assert_allclose(back["memory"].predict(F), tm.predict(F))

    no_bend = TargetModel.fit("memory", F, 1500.0 + 0.9 * reserved, correct=False, terms=("one", "sim_reserved_mb",
                                                                                          HINGE, KNOT))
    assert no_bend.coef[2] < 1e-3 and abs(no_bend.coef[1] - 0.9) < 1e-3


def test_held_out_coverage_sees_a_family_outside_the_others_band():
    from perf4sight.fingerprint.select import held_out_coverage
    rng = np.random.default_rng(4)
    near = [rng.normal(0, 0.05, 40) for _ in range(3)]
    assert held_out_coverage(np.concatenate(near), np.repeat(["a", "b", "c"], 40), 0.9) > 85
    off = np.concatenate(near + [rng.normal(1.0, 0.05, 40)])  # a fourth family predicted e times too low
    cov = held_out_coverage(off, np.repeat(["a", "b", "c", "d"], 40), 0.9)
    assert cov < 80  # its rows fall outside the band the other three make
    assert held_out_coverage(off[:80], np.repeat(["a", "b"], 40), 0.9) is None


def _conv_net(name, depthwise, linear, width=8):
    """input -> 3x3 conv (4 -> ``width``) -> relu [-> depthwise 3x3] -> pool [-> linear]: a hand-built description."""
    from tiny_graphs import conv_node, tiny_description
    from perf4sight.ir.schema import Node
    nodes = [Node("input", "input", [], {}, [4, 8, 8]), conv_node("c1", "input", 4, width, 3, 1, 8),
             Node("r", "relu", ["c1"], {}, [width, 8, 8])]
    if depthwise:
        nodes.append(conv_node("dw", nodes[-1].name, width, width, 3, width, 8))
    nodes.append(Node("pool", "adaptiveavgpool2d", [nodes[-1].name], {"output_size": [1, 1]}, [width, 1, 1]))
    if linear:
        nodes += [Node("flat", "reshape", ["pool"], {"shape": [-1]}, [width]),
                  Node("fc", "linear", ["flat"], {"in_features": width, "out_features": 5, "bias": True}, [5])]
    d = tiny_description(nodes)
    d.name = name
    return d


def test_outside_notes_name_the_networks_and_what_training_never_covered():
    from perf4sight.features.aggregate import feature_matrix, network_features
    from perf4sight.fingerprint.domain import domain_line, outside_notes, training_domain
    train = [network_features(_conv_net(f"plain{w}", False, True, w)) for w in (8, 16)]
    domain = training_domain(feature_matrix([nf for nf in train for _ in (2, 4)], [2, 4, 2, 4]))
    assert domain["ranges"]["batch_size"] == [2.0, 4.0] and domain["traits"]["depthwise"] == [False]
    assert domain["traits"]["linear"] == [True]
    inside = network_features(_conv_net("plain12", False, True, 12))
    assert outside_notes(domain, feature_matrix(inside, [3]), ["plain12"]) == []

    query = [network_features(_conv_net("dw", True, True)), network_features(_conv_net("headless", False, False, 12))]
    notes = outside_notes(domain, feature_matrix(query * 2, [2, 2, 8, 8]), ["dw", "headless"] * 2)
    assert "dw: with depthwise convolutions, which no training network had" in notes
    assert any(n.startswith("headless: without a linear layer") for n in notes)
    assert "batch size 8: outside the training rows' 2..4" in notes
    many = outside_notes(domain, feature_matrix(query[:1] * 40, list(range(5, 45))), ["dw"] * 40)
    assert "batch size 5, 6, ..., 44 (40 sizes): outside the training rows' 2..4" in many
    assert len(notes) == 3  # the sizes are inside the range: no note about them
    assert outside_notes({}, feature_matrix(query, [8, 8]), ["dw", "headless"]) == []  # older fingerprints
    assert domain_line(domain).startswith("training domain: batch size 2..4, MACs per sample ")
    wide = training_domain(feature_matrix([train[0], train[0]], [8, 1024]))  # it read 8..1.02e+03
    assert domain_line(wide).startswith("training domain: batch size 8..1,024, MACs per sample ")
    assert "depthwise convolutions in none of the networks" in domain_line(domain)
    assert "a linear layer in all" in domain_line(domain) and domain_line({}) == ""

    # given the training networks' descriptions, a kind of layer none of them had is named too
    domain = training_domain(feature_matrix([nf for nf in train for _ in (2, 4)], [2, 4, 2, 4]),
                             [nf.description for nf in train])
    assert "relu" in domain["ops"] and "input" not in domain["ops"] and "reshape" not in domain["ops"]
    swish = _conv_net("swish", False, True, 12)
    swish.nodes[2].op = "silu"
    notes = outside_notes(domain, feature_matrix([network_features(swish), inside], [3, 3]), ["swish", "plain12"],
                          [swish, inside.description])
    assert notes == ["swish: with silu layers, which no training network had (no learnt cost of their own)"]
    dilated = _conv_net("dilated", False, True, 12)  # a dilated convolution: a kind of its own
    dilated.nodes[1].attrs["dilation"] = [2, 2]
    assert outside_notes(domain, feature_matrix([inside], [3]), ["dilated"], [dilated]) == [
        "dilated: with dilated conv2d layers, which no training network had (no learnt cost of their own)"]

    # a depthwise share beyond the training networks' own (a depthwise cost learnt from a sliver of it) is noted
    from tiny_graphs import conv_node
    mixed = [network_features(_conv_net(name, dw, True, 8)) for name, dw in (("plain8", False), ("dw8", True))]
    domain = training_domain(feature_matrix(mixed, [2, 2]))
    assert domain["ranges"]["depthwise_share"] == [0.0, pytest.approx(0.2)]  # dw8: 8x9 of 4x8x9 + 8x9 MACs
    all_dw = _conv_net("all_dw", False, True, 4)
    all_dw.nodes[1] = conv_node("c1", "input", 4, 4, 3, 4, 8)  # its only convolution depthwise
    inside = network_features(_conv_net("dw16", True, True, 16))
    notes = outside_notes(domain, feature_matrix([network_features(all_dw), inside], [2, 2]), ["all_dw", "dw16"])
    assert [n for n in notes if "depthwise" in n] == [
        "depthwise share of convolution MACs outside the training networks' 0..20%: all_dw 100%"]
    assert "depthwise share of convolution MACs 0..20%" in domain_line(domain)

    # a network whose linear layers do most of its work, where no training network's did, is noted
    from tiny_graphs import tiny_description
    from perf4sight.ir.schema import Node
    mlp = tiny_description([Node("input", "input", [], {}, [4, 8, 8]), conv_node("c1", "input", 4, 8, 3, 1, 8),
                            Node("flat", "reshape", ["c1"], {"shape": [-1]}, [512]),
                            Node("fc", "linear", ["flat"], {"in_features": 512, "out_features": 64, "bias": True},
                                 [64])])  # 32768 of 51200 MACs in the linear layer
    mlp.name = "mlp"
    assert domain["traits"]["gemm"] == [False]
    notes = outside_notes(domain, feature_matrix([network_features(mlp), inside], [2, 2]), ["mlp", "dw16"])
    assert "mlp: with linear layers doing most of the work (over half of the MACs, as in a transformer), which no " \
           "training network had" in notes
    assert "linear layers doing most of the work in none" in domain_line(domain)


def test_fingerprint_stores_its_domain_and_notes_an_unseen_family(tx2, tmp_path):
    """Trained without mobilenetv2, the fingerprint says mobilenetv2's depthwise convolutions were never seen."""
    _, rows, descs, _ = tx2
    meta = fit_fingerprint([r for r in rows if r["family"] != "mobilenetv2"], descs, "tx2", tmp_path / "fp", FAST,
                           nested=False)  # the domain does not depend on how the accuracy table is made
    assert meta["training_domain"]["traits"]["depthwise"] == [False]
    fp = load_fingerprint(tmp_path / "fp")
    notes = fp.outside_training([descs["mobilenetv2_0"], descs["resnet18_0"]], [2, 64])
    assert notes == ["mobilenetv2_0: with depthwise convolutions, which no training network had",
                     "mobilenetv2_0: with relu6 layers, which no training network had (no learnt cost of their own)"]
    assert fp.outside_training(descs["resnet50_0"], [16, 256]) == []


def test_accuracy_table_stays_aligned_with_long_family_names():
    m = {"n": 12, "mape": 5.0, "rmspe": 6.0, "within10": 90.0}
    long = "gen-resnext-inception-resnext-mobilenet"
    meta = {"accuracy": {"latency": {"column": "latency_ms_median", "grouping": "family", "overall": m,
                                     "per_group": {long: m, "resnet18": m}}}}
    table = [line for line in accuracy_lines(meta)[1:] if line.startswith("  ")]
    assert len(table) == 4 and len({len(line) for line in table}) == 1  # header and rows as wide: columns line up
    assert table[1].startswith(f"  {long}  ")


def _measured_tiny_networks(folder, widths: dict[str, int], listed: list[str]) -> None:
    """Real descriptions of small torch networks (3x16x16) under ``folder/models``, the ``listed`` ones in the
    manifest, and a cpu-backend row per network and batch size 1, 2, 4 (step time and peak RSS growing with
    the width and the batch) in ``folder/profiling_csvs/local``, each on its description's sha."""
    from torch import nn

    from perf4sight.ir.from_torch import describe
    from perf4sight.ir.schema import save_description
    from perf4sight.networks.build import write_manifest
    from perf4sight.profiling.results import append_row, file_sha

    rows = []
    for name, width in widths.items():
        model = nn.Sequential(nn.Conv2d(3, width, 3, padding=1), nn.ReLU(), nn.AdaptiveAvgPool2d(1), nn.Flatten(),
                              nn.Linear(width, 10))
        path = save_description(describe(model, [3, 16, 16], name), folder / "models" / "nets" / f"{name}.json")
        sha = file_sha(path.read_bytes())
        for b in (1, 2, 4):
            append_row(results_path(folder / "profiling_csvs", "local"), {
                "device": "local", "backend": "cpu", "network": name, "family": name, "batch_size": b,
                "input_shape": "3x16x16", "phase": "train", "status": "ok", "latency_ms_median": 2 + width * b / 8,
                "peak_rss_mb": 600 + width * b, "threads": 1, "timestamp": "2025-01-01T00:00:00+00:00",
                "description_sha": sha})
        if name in listed:
            rows.append({"network": name, "family": name, "path": f"nets/{name}.json"})
    write_manifest(rows, folder / "models" / "manifest.csv")


def test_fingerprint_notes_rows_of_networks_removed_from_the_config(tmp_path, cli_here):
    """Rows of a network no longer in models/manifest.csv (removed from the config) were left out of the fit
    without a word: one note gives their count and names the networks."""
    _measured_tiny_networks(tmp_path, {"a": 8, "b": 16, "c": 24, "gone": 32, "big": 40},
                            listed=["a", "b", "c", "big"])
    csv_path = results_path(tmp_path / "profiling_csvs", "local")  # big: out of memory at every batch size
    csv_path.write_text("\n".join(line.replace(",ok,", ",oom,") if ",big," in line else line
                                  for line in csv_path.read_text().splitlines()) + "\n")
    (tmp_path / "config.toml").write_text('[networks]\nzoo = []\ninput_shape = [3, 16, 16]\n'
                                          '[devices.local]\nbackend = "cpu"\n[fingerprint]\nn_estimators = 10\n')
    run = cli_here(tmp_path, "--config", str(tmp_path / "config.toml"), "--stage", "fingerprint")  # scikit-learn
    assert run.returncode == 0, run.stderr[-3000:]
    assert "local: no ok row for 1 network (big: out of memory or failed at every batch size measured): not in " \
           "the fit" in " ".join(run.stderr.split())
    (note,) = [line for line in run.stderr.splitlines() if "passed over" in line]
    assert note == (f"local: 3 rows of 1 network (gone) are passed over: no description of them in "
                    f"{tmp_path / 'models' / 'manifest.csv'} or {tmp_path / 'models' / 'imported' / 'local'} "
                    "(networks removed from the config? to use the rows, add the networks back and rerun "
                    "--stage networks)")
    meta = json.loads((tmp_path / "fingerprinting" / "local" / "metadata.json").read_text())
    assert meta["training_rows"] == {"latency": 9, "memory": 9}  # the fit itself: the listed networks only


def test_the_fingerprint_stage_notes_the_rows_it_fits_that_were_measured_under_load(tmp_path, cli_here):
    """A device profiled on a busy host earlier (its rows' load_avg_1m above their cpu_count) learns it where its
    fingerprint is fitted too: one note, how many rows, the largest load and how to measure them again; rows within
    half a CPU of the CPU count, or from before the load was recorded, are not counted, nor are those of a network
    removed from the config (passed over: the note counted them and told to --remeasure it, which profile refuses)."""
    import csv

    _measured_tiny_networks(tmp_path, {"a": 8, "b": 16, "c": 24, "gone": 32}, listed=["a", "b", "c"])
    csv_path = results_path(tmp_path / "profiling_csvs", "local")
    with csv_path.open(newline="") as fh:
        rows = list(csv.DictReader(fh))
    loads = {("a", "1"): "6.25", ("b", "4"): "4.6", ("c", "1"): "4.4", ("c", "2"): "", ("gone", "1"): "7.5"}
    for r in rows:
        r["load_avg_1m"], r["cpu_count"] = loads.get((r["network"], r["batch_size"]), "0.8"), "4"
    with csv_path.open("w", newline="") as fh:
        writer = csv.DictWriter(fh, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)
    (tmp_path / "config.toml").write_text('[networks]\nzoo = []\ninput_shape = [3, 16, 16]\n'
                                          '[devices.local]\nbackend = "cpu"\n[fingerprint]\nn_estimators = 10\n')
    run = cli_here(tmp_path, "--config", str(tmp_path / "config.toml"), "--stage", "fingerprint")  # scikit-learn
    assert run.returncode == 0, run.stderr[-3000:]
    (note,) = [line for line in run.stderr.splitlines() if "load average" in line]
    assert note == ("note: local: 2 of 9 ok rows were measured while its 1-minute load average was above 4.5 (its 4 "
                    "CPUs and half a CPU more; up to 6.25, column load_avg_1m): other work shared its cores, so their "
                    "step times read high and noisy, and the fingerprint fits them; to measure them again, run "
                    "--stage profile --device local --remeasure a b while the device is quiet (the earlier rows move "
                    "to superseded.csv)")


def test_predict_says_when_the_configured_memory_limit_is_not_the_fingerprints(tmp_path, cli_here):
    """A memory_limit_mb changed after the fit: predict answered 'fits' against the limit the fingerprint was fitted
    under without a word (batch 4 of b, 664 MiB, "fits: under 700 MiB" with 640 set). A note says so now, and how to
    fit the limit set; none where the limits agree."""
    _measured_tiny_networks(tmp_path, {"a": 8, "b": 16, "c": 24}, listed=["a", "b", "c"])
    cfg = tmp_path / "config.toml"
    base = ('[networks]\nzoo = []\ninput_shape = [3, 16, 16]\n[fingerprint]\nn_estimators = 10\n'
            'simulate_memory = false\n[devices.local]\nbackend = "cpu"\n')
    cfg.write_text(base + "memory_limit_mb = 700\n")
    assert cli_here(tmp_path, "--config", str(cfg), "--stage", "fingerprint").returncode == 0

    def predict_notes() -> list[str]:
        run = cli_here(tmp_path, "--config", str(cfg), "--stage", "predict", "--network", "models/nets/b.json",
                       "--batch-size", "4", "--json")
        assert run.returncode == 0, run.stderr[-3000:]
        return [" ".join(line.split()) for line in run.stderr.split("note: ")
                if line.startswith("local: [devices.local]")]

    assert predict_notes() == []
    cfg.write_text(base + "memory_limit_mb = 640\n")
    assert predict_notes() == ["local: [devices.local] memory_limit_mb is 640 MiB now, 700 MiB when its fingerprint "
                               "was fitted: 'fits' and the largest batch are against the fingerprint's capacity, "
                               "700 MiB (configured memory_limit_mb); run --stage fingerprint --device local to fit "
                               "it under the limit set now"]
    cfg.write_text(base)
    assert predict_notes()[0].startswith("local: [devices.local] memory_limit_mb is not set now, 700 MiB when its ")


def test_too_few_ok_rows_is_one_line_in_the_singular_too(tmp_path):
    """"only 1 ok rows": the count and its noun agree."""
    from perf4sight.dataset import descriptions_and_shas
    from perf4sight.config import load_config

    _measured_tiny_networks(tmp_path, {"a": 8}, listed=["a"])
    (tmp_path / "config.toml").write_text('[networks]\nzoo = []\n[devices.local]\nbackend = "cpu"\n')
    descs, _ = descriptions_and_shas(load_config(tmp_path / "config.toml"), "local")
    rows = read_rows(results_path(tmp_path / "profiling_csvs", "local"))[:1]
    with pytest.raises(UserError, match=r"only 1 ok row with 'latency_ms_median' for device 'local' \(need >= 3\)$"):
        fit_fingerprint(rows, descs, "local", tmp_path / "fp", FAST)


def test_four_rows_of_two_networks_get_an_interval_of_some_width(tmp_path):
    """Under 5 held-out errors the 90% interval was x1.00 .. x1.00 (it covered no held-out row); it is now the
    largest error both ways, widened."""
    from perf4sight.dataset import descriptions_and_shas
    from perf4sight.config import load_config

    _measured_tiny_networks(tmp_path, {"a": 8, "b": 16}, listed=["a", "b"])
    (tmp_path / "config.toml").write_text('[networks]\nzoo = []\n[devices.local]\nbackend = "cpu"\n')
    descs, _ = descriptions_and_shas(load_config(tmp_path / "config.toml"), "local")
    rows = read_rows(results_path(tmp_path / "profiling_csvs", "local"))[:4]
    meta = fit_fingerprint(rows, descs, "local", tmp_path / "fp", FAST)
    for target in ("latency", "memory"):
        lo, hi = meta["interval"]["log_ratio_quantiles"][target]
        assert lo < 0 < hi and lo == -hi, (target, lo, hi)


def test_one_network_is_refused_as_it_leaves_nothing_to_hold_out(tmp_path):
    """One network fitted, with exit 0, 'all 0 nan' in its accuracy table and a x1.00 .. x1.00 interval."""
    from perf4sight.dataset import descriptions_and_shas
    from perf4sight.config import load_config

    _measured_tiny_networks(tmp_path, {"a": 8}, listed=["a"])
    (tmp_path / "config.toml").write_text('[networks]\nzoo = []\n[devices.local]\nbackend = "cpu"\n')
    descs, _ = descriptions_and_shas(load_config(tmp_path / "config.toml"), "local")
    rows = read_rows(results_path(tmp_path / "profiling_csvs", "local"))
    with pytest.raises(UserError, match=r"device 'local' has ok rows with 'latency_ms_median' of one network only "
                                        r"\(a\); a fingerprint needs 2 or more"):
        fit_fingerprint(rows, descs, "local", tmp_path / "fp", FAST)
    assert not (tmp_path / "fp").exists()


def _timed(network: str, seconds: int, ms: float, status: str = "ok", batch_size: int = 8) -> dict:
    stamp = f"2026-11-25T10:{seconds // 60:02d}:{seconds % 60:02d}+00:00"
    return {"device": "d", "network": network, "batch_size": str(batch_size), "input_shape": "3x64x64",
            "status": status, "latency_ms_median": str(ms), "timestamp": stamp}


def test_step_times_are_divided_by_the_drift_reference_inside_its_span():
    from perf4sight.fingerprint.drift import drift_line, normalise_step_times
    refs = [_timed("ref", 0, 100.0), _timed("ref", 100, 120.0), _timed("ref", 200, 100.0),
            _timed("other", 150, 999.0, batch_size=2), _timed("ref", 190, 50.0, status="error")]
    rows = [_timed("x", 50, 110.0), _timed("x", 100, 120.0), _timed("y", 300, 80.0), _timed("y", 60, 0, "oom")]
    out, drift = normalise_step_times(rows, refs, "latency_ms_median")
    # the reference's median is 100 ms; at 50 s it reads 110 ms (half way from 100 to 120), at 100 s 120 ms
    assert [float(r["latency_ms_median"]) for r in out] == pytest.approx([100.0, 100.0, 80.0, 0.0])
    assert out[2] is rows[2] and out[3] is rows[3] and rows[0]["latency_ms_median"] == "110.0"  # inputs kept
    assert (drift["network"], drift["batch_size"], drift["measurements"]) == ("ref", 8, 3)
    assert (drift["rows_corrected"], drift["rows_outside_span"], drift["median_ms"]) == (2, 1, 100.0)
    same, why = normalise_step_times(rows, refs[:1], "latency_ms_median")
    assert same is rows and not why["applied"] and "2 or more" in why["reason"]
    assert "ref @ 8 (3 measurements" in drift_line(drift) and "2 rows scaled by x0.83 .. x0.91" in drift_line(drift)
    assert drift_line(why).startswith("step times not corrected for drift: 1 ok reference measurement")
    _, failed = normalise_step_times(rows, refs[-1:], "latency_ms_median")  # a reference that errored: "(1 rows)"
    assert drift_line(failed) == ("step times not corrected for drift: no ok reference measurement among "
                                  "references.csv's 1 row")


def test_a_fingerprint_fitted_from_the_same_inputs_is_not_fitted_again(tmp_path):
    """The fingerprint stage skips a fit whose measurements, networks, settings and code are those the stored
    fingerprint was fitted from (``fit_inputs``); a changed setting, a new row, damaged arrays or ``--refit``
    each fit again."""
    import subprocess
    import sys
    from pathlib import Path

    from perf4sight.config import load_config
    from perf4sight.dataset import descriptions_and_shas
    from perf4sight.fingerprint.api import fit_device
    from perf4sight.profiling.results import append_row

    _measured_tiny_networks(tmp_path, {"a": 8, "b": 16, "c": 24}, listed=["a", "b", "c"])
    (tmp_path / "config.toml").write_text('[networks]\nzoo = []\ninput_shape = [3, 16, 16]\n'
                                          '[devices.local]\nbackend = "cpu"\n[fingerprint]\nn_estimators = 10\n')
    cfg = load_config(tmp_path / "config.toml")
    descs, shas = descriptions_and_shas(cfg, "local")
    meta_path = tmp_path / "fingerprinting" / "local" / "metadata.json"

    def fit(**kw):
        return fit_device(cfg, "local", descs, shas, **kw)

    first = fit(refit=False)
    assert "up_to_date" not in first and len(first["inputs_sha256"]) == 64
    again = fit(refit=False)
    assert again["up_to_date"] and again["created"] == first["created"]
    assert "up_to_date" not in fit()  # the API's default fits
    cfg.fingerprint = replace(cfg.fingerprint, n_estimators=11)
    changed = fit(refit=False)
    assert "up_to_date" not in changed and changed["inputs_sha256"] != first["inputs_sha256"]
    assert fit(refit=False)["up_to_date"]
    cfg.fingerprint = replace(cfg.fingerprint, gnn_max_epochs=30, predictor="ensemble")  # the GNN's: not the trees'
    assert fit(refit=False)["up_to_date"]
    append_row(results_path(tmp_path / "profiling_csvs", "local"), {
        "device": "local", "backend": "cpu", "network": "a", "family": "a", "batch_size": 8, "input_shape": "3x16x16",
        "phase": "train", "status": "ok", "latency_ms_median": 10, "peak_rss_mb": 700, "threads": 1,
        "timestamp": "2025-01-01T00:00:00+00:00", "description_sha": shas["a"]})
    assert "up_to_date" not in fit(refit=False)  # the rows are read again: the new one counts
    (meta_path.parent / "models.npz").write_bytes(b"not a zip")
    assert "up_to_date" not in fit(refit=False)  # damaged arrays are fitted again, not kept
    assert json.loads(meta_path.read_text())["training_rows"] == {"latency": 10, "memory": 10}

    main = Path(__file__).resolve().parents[1] / "main.py"

    def stage(*extra):
        run = subprocess.run([sys.executable, str(main), "--config", str(tmp_path / "config.toml"), "--stage",
                              "fingerprint", *extra], capture_output=True, text=True, cwd=tmp_path, timeout=600)
        assert run.returncode == 0, run.stderr[-3000:]
        return " ".join(run.stdout.split())

    assert "up to date" not in stage()  # n_estimators as the config says, OpenBLAS's kernels as main.py pins them
    up_to_date = stage()
    assert "up to date (fitted " in up_to_date and "--refit fits it again" in up_to_date
    assert "up to date" not in stage("--refit")


def test_unknown_capacity_offers_a_limit_only_where_the_config_takes_one():
    """An nvml GPU's config refuses memory_limit_mb, so its note must not suggest it; a cpu device's takes one."""
    from types import SimpleNamespace

    from perf4sight.stages import unknown_capacity

    gpu = unknown_capacity(SimpleNamespace(metadata={"memory_target": "device_mem_used_mb"}))
    cpu = unknown_capacity(SimpleNamespace(metadata={"memory_target": "peak_rss_mb"}))
    assert "memory_limit_mb" not in gpu and "no out-of-memory row" in gpu
    assert "or set the device's memory_limit_mb" in cpu
    gnn_cpu = {"targets": {"memory": {"column": "peak_rss_mb", "unit": "MiB"}}}  # a GNN's (and ensemble's) metadata
    assert "or set the device's memory_limit_mb" in unknown_capacity(SimpleNamespace(metadata=gnn_cpu))


def test_a_memory_figure_that_would_read_as_the_capacity_is_shown_to_a_tenth():
    """--prune-to-fit's table read "900 ... yes" under "fits: under 900 MiB" for 899.765 MiB: a figure whose whole
    number is the capacity's is shown to 0.1 MiB, and so is the capacity in the title then."""
    from perf4sight.stages import _capacity_mib, _mib

    assert _mib(899.765, 900.0, "") == "899.8" and _mib(1649.2, 7291.0) == "1,649" and _mib(1649.2, None) == "1,649"
    assert _capacity_mib(900.0, [{"memory_mb": 899.765}]) == "900.0"
    assert _capacity_mib(7291.3, [{"memory_mb": 1649.2}]) == "7,291"


def test_a_learnt_capacity_is_not_shown_as_the_device_s_size():
    """--max-batch-size's title on the H200's fingerprint read "fit h200 (163,259 MiB, ...)" above memory figures of
    141,496 MiB: a capacity learnt from out-of-memory rows is a threshold on the memory model's demand, and the
    tables now say so; a configured limit, compared with the memory shown, reads as its MiB alone."""
    from types import SimpleNamespace

    from perf4sight.stages import capacity_words

    learnt = SimpleNamespace(capacity_mb=163259.2, capacity_basis="analytic")
    configured = SimpleNamespace(capacity_mb=2000.0, capacity_basis="prediction")
    rows = [{"memory_mb": 141496.0}]
    assert capacity_words(learnt, rows) == ("163,259 MiB of the memory model's demand, learnt from out-of-memory rows, "
                                            "not the device's size")
    assert capacity_words(configured, rows) == "2,000 MiB"
    assert capacity_words(SimpleNamespace(capacity_mb=900.0), [{"memory_mb": 899.765}]) == "900.0 MiB"  # a GNN's
    # a configured limit compared with the demand of a saturating memory form (capacity_basis "analytic" too): it
    # was said to be learnt from out-of-memory rows
    saturating = SimpleNamespace(capacity_mb=7000.0, capacity_basis="analytic",
                                 metadata={"capacity_source": "configured memory_limit_mb"})
    assert capacity_words(saturating, rows) == "7,000 MiB, the configured limit, against the memory model's demand"


def test_a_step_beyond_the_allocator_replay_is_one_line_and_fits_nowhere(tx2):
    """Batch 10,000,000 (under the 1e9 guard) ended in the replay's OverflowError; a --max-batch-size of 1e8
    searched into it."""
    tmp, _, descs, _ = tx2
    fp = load_fingerprint(tmp / "fp" / "tx2")
    with pytest.raises(UserError, match=r"^resnet18_0 at batch size 10000000: its step would need more than 256 TiB "
                                        r"of device memory"):
        fp.predict(descs["resnet18_0"], [10**7])
    assert fp.max_batch_size(descs["resnet18_0"], limit=10**8) == fp.max_batch_size(descs["resnet18_0"]) > 0


def test_the_least_pruning_level_is_the_least_whatever_the_predictions_do_between(monkeypatch):
    """The search bisected over the levels, taking predicted memory and step time as falling as the level rises. They
    do not: the H100 fingerprint's resnet18 at batch 128 steps in 27.6 ms unpruned, 24.5 ms at 43%, 22.7 ms at 60%
    and over 25 ms at 44 to 59%, so --max-latency-ms 25 answered 67%; its memory at batch 4096 fits from 56% but not
    at 57%. The search now asks every level from 0 up (the top first: where the network stops short of 99%) and
    answers the first that meets both, so the least one; the predictions here are such curves."""
    from types import SimpleNamespace

    from perf4sight.features.aggregate import BeyondReplay
    from perf4sight.fingerprint.pruning_search import least_pruning
    from perf4sight.networks.pruning import UnreachableLevel

    def search(latency, fits, top=99.0, budget=None, between=(), beyond=()):
        def variant(level):  # ``between``: levels between two pruning steps; ``beyond``: steps past 256 TiB
            if level > top or level in between:
                raise UnreachableLevel(f"net at {level}%", min(top, level - 1.5), "it cannot")
            return SimpleNamespace(name=f"net_l{level}", level=level)

        def predict(descs, batches):  # one description or a list, as every predictor's
            descs = descs if isinstance(descs, list) else [descs]
            if any(d.level in beyond for d in descs):
                raise BeyondReplay(f"{descs[0].name} at batch size {batches[0]}: more than 256 TiB")
            return [{"batch_size": batches[0], "latency_ms": latency(d.level), "fits": fits(d.level)} for d in descs]

        return least_pruning(SimpleNamespace(capacity_mb=1000.0, predict=predict), variant, 128, budget)

    step = lambda level: 24.5 if level == 43 else 30 - level / 10  # noqa: E731 - 25 ms met at 43, then from 50
    found = search(step, lambda level: True, budget=25)
    assert found.level == 43 and found.prediction["latency_ms"] == 24.5 and found.variant.name == "net_l43"
    assert sorted(found.tried) == list(range(44)) + [99]  # level 0, the top, then up from 1 to the first that meets
    assert search(lambda level: 1.0, lambda level: level == 20 or level >= 70).level == 20  # memory alone
    assert search(lambda level: 1.0, lambda level: level >= 56 and level != 57).level == 56
    assert search(lambda level: 1.0, lambda level: True).tried == {0: True}  # fits unpruned: nothing more asked
    odd = search(lambda level: 1.0, lambda level: level in (5, 6, 7), between={5}, beyond={3, 6})
    assert odd.level == 7 and odd.tried[5] is False and odd.tried[6] is False and odd.tried[4] is False
    none = search(step, lambda level: level < 30, top=82.4, budget=25)  # stops short of 99: the top lowered
    assert none.level is None and sorted(none.tried) == list(range(83)) and not any(none.tried.values())


def test_a_batch_beyond_the_allocator_replay_has_no_pruning_level_that_fits(tx2):
    """--prune-to-fit --batch-size 100000000 ended in the error of a step beyond the allocator replay (256 TiB),
    which --max-batch-size's search reads as not fitting: a level whose step is beyond it fits no device, so the
    search goes on above it, and answers that no level fits where none does."""
    from perf4sight.fingerprint.pruning_search import least_pruning

    tmp, _, descs, _ = tx2
    fp = load_fingerprint(tmp / "fp" / "tx2")
    stored = sorted(int(name.split("_")[1]) for name in descs if name.startswith("resnet18_"))

    def resnet18_at(level: int):  # the TX2's resnet18 at the highest level measured up to ``level``
        return descs[f"resnet18_{max(s for s in stored if s <= level)}"]

    with pytest.raises(UserError, match="256 TiB"):
        fp.predict(resnet18_at(0), [10**8])  # the query the search makes first
    found = least_pruning(fp, resnet18_at, 10**8)
    assert found.level is None and found.variant is None and found.tried[0] is False and max(found.tried) == 99
    assert least_pruning(fp, resnet18_at, 2).level == 0  # a batch that fits: unpruned


def test_the_least_pruning_at_several_batch_sizes_asks_each_level_once(tx2, monkeypatch):
    """--prune-to-fit at three batch sizes searched each one alone, predicting a level asked at each once per batch
    size (three predictions where one does). least_prunings asks each level once for every batch size still without
    an answer, in one prediction, and answers as least_pruning does at each."""
    from perf4sight.fingerprint.pruning_search import least_pruning, least_prunings

    tmp, _, descs, _ = tx2
    fp = load_fingerprint(tmp / "fp" / "tx2")
    stored = sorted(int(name.split("_")[1]) for name in descs if name.startswith("resnet18_"))

    def resnet18_at(level: int):  # the TX2's resnet18 at the highest level measured up to ``level``
        return descs[f"resnet18_{max(s for s in stored if s <= level)}"]

    batches = [2, 256, 2, 512, 10**5]
    alone = [least_pruning(fp, resnet18_at, b) for b in batches]
    asked, predict = [], fp.predict
    monkeypatch.setattr(fp, "predict", lambda d, bs: asked.append(list(bs)) or predict(d, bs))
    together = least_prunings(fp, resnet18_at, batches)
    assert [(r.level, r.tried, r.prediction, r.variant) for r in together] == [
        (r.level, r.tried, r.prediction, r.variant) for r in alone]
    assert len({r.level for r in alone}) >= 3 and alone[-1].level is None  # answers at several levels, and none
    assert len(asked) == max(len(r.tried) for r in alone)  # one prediction per level asked, of the open batches
    assert asked[0] == [2, 256, 512, 10**5] and asked[-1] == [10**5]


def test_tree_arrays_edited_by_hand_are_refused_as_damaged(tx2, tmp_path):
    """Indices out of range or of another shape ended in an IndexError at predict; a coefficient or leaf of inf or
    NaN gave NaN figures (invalid JSON) or a traceback in the table."""
    tmp, _, descs, _ = tx2
    source = tmp / "fp" / "tx2"
    with np.load(source / "models.npz", allow_pickle=False) as arrays:
        stored = {k: arrays[k] for k in arrays.files}

    def key(end: str) -> str:
        return next(k for k in sorted(stored) if k.startswith("latency") and k.endswith(end))

    for name, change in ((".trees.feature", lambda a: a + 10**6), (".trees.left", lambda a: a + a.size),
                         (".trees.left", lambda a: a[:-1]), (".trees.roots", lambda a: a + 10**9),
                         (".trees.value", lambda a: a.reshape(1, -1)), (".trees.value", lambda a: a * np.nan),
                         (".coef", lambda a: a * np.inf)):
        folder = tmp_path / name.strip(".").replace(".", "_")
        shutil.copytree(source, folder, dirs_exist_ok=True)
        np.savez(folder / "models.npz", **dict(stored, **{key(name): change(stored[key(name)])}))
        with pytest.raises(UserError, match=r"fingerprint files are damaged or from an incompatible version .*"
                                            r"run the fingerprint stage again"):
            load_fingerprint(folder).predict(descs["resnet18_0"], [8])


def test_a_dataset_network_asked_by_name_is_predicted_at_the_fingerprints_shape(tx2, tmp_path, capsys):
    """resnet18_l30 of a 64x64 dataset asked of the TX2's 224x224 fingerprint was predicted as described, 114 ms
    against 700 for its neighbours pruned on request at 224x224, with only a note: a name is described at the
    fingerprint's shape, as a zoo name is; a description file is taken as it is."""
    import argparse

    from torch import nn

    from perf4sight import stages
    from perf4sight.config import load_config
    from perf4sight.ir.from_torch import describe
    from perf4sight.ir.schema import save_description
    from perf4sight.networks.build import write_manifest

    tmp, _, _, _ = tx2
    fp = load_fingerprint(tmp / "fp" / "tx2")
    (tmp_path / "config.toml").write_text("")
    cfg = load_config(tmp_path / "config.toml")
    net = nn.Sequential(nn.Conv2d(3, 16, 3, padding=1), nn.ReLU(), nn.AdaptiveAvgPool2d(1), nn.Flatten(),
                        nn.Linear(16, 10))
    path = save_description(describe(net, [3, 64, 64], "small_l30", network="small", pruning_level=30.0),
                            cfg.models_dir / "small_l30.json")
    write_manifest([{"network": "small_l30", "family": "small", "path": path.name}], cfg.models_dir / "manifest.csv")
    args = argparse.Namespace(input_shape=None)
    (by_name,) = stages._described(cfg, args, fp, ["small_l30"])
    assert by_name.input_shape == [3, 224, 224] and by_name.name == "small_l30" and by_name.pruning_level == 30.0
    err = " ".join(capsys.readouterr().err.split())
    assert "note: small_l30: described in the dataset at 3x64x64, predicted at 3x224x224, the fingerprint's" in err
    (as_file,) = stages._described(cfg, args, fp, [str(path)])
    assert as_file.input_shape == [3, 64, 64]
    assert "described at another input shape than this fingerprint's" in " ".join(capsys.readouterr().err.split())


def test_without_an_out_of_memory_row_two_families_keep_no_ceiling(tx2, tmp_path):
    """With two families there is no choosing a form, and the preferred GPU form saturates at a learnt ceiling: on
    rows that never came near the device's limit (no oom row) that ceiling was placed at random, and resnet18_0
    read 2,730 MiB at batch 64 and at 128 (measured 3,450 and 5,270). Its sum without the ceiling is kept instead."""
    _, rows, descs, _ = tx2
    few = [r for r in rows if r["network"] in ("resnet18_0", "squeezenet_0") and r["batch_size"] in ("2", "8", "32")]
    assert {r["status"] for r in few} == {"ok"} and len(few) == 6
    meta = fit_fingerprint(few, descs, "tx2", tmp_path / "twonet", FAST)
    assert meta["accuracy"]["memory"]["selection"]["chosen"] == "sim reserved + analytic + BLAS context + workspace " \
                                                                "x trees"
    fp = load_fingerprint(tmp_path / "twonet")
    at_64, at_128 = (p["memory_mb"] for p in fp.predict(descs["resnet18_0"], [64, 128]))
    assert at_128 > 1.3 * at_64
    with_oom = few + [r for r in rows if r["network"] == "resnet18_0" and r["status"] == "oom"][:1]
    meta = fit_fingerprint(with_oom, descs, "tx2", tmp_path / "oom", FAST)
    assert meta["accuracy"]["memory"]["selection"]["chosen"].endswith("saturating x trees")  # a ceiling seen


def test_a_fingerprint_that_cannot_be_written_leaves_the_previous_one_and_no_scraps(tmp_path, monkeypatch):
    """A full disk while saving: the old fingerprint was kept, but a half-written models.npz.tmp.npz stayed beside
    it, taking what little space there was. The metadata's file is made to land on /dev/full (ENOSPC)."""
    from perf4sight import files
    from perf4sight.features.aggregate import FEATURE_NAMES
    from perf4sight.fingerprint.storage import METADATA_FILE, load_models, save_models
    from perf4sight.fingerprint.trees import TargetModel

    rng = np.random.default_rng(0)
    F = np.abs(rng.normal(1, 0.5, size=(30, len(FEATURE_NAMES)))) * 100
    model = TargetModel.fit("memory", F, 500 + F[:, FEATURE_NAMES.index("mem_analytic_mb")], correct=False)
    save_models(tmp_path, {"memory": model}, {"device": "x"})
    before = {p.name: p.read_bytes() for p in tmp_path.iterdir()}
    monkeypatch.setattr(files, "_writer_tag", lambda: ".4242.0badf00d")  # the name this writer's file will have
    (tmp_path / (METADATA_FILE + ".4242.0badf00d.tmp")).symlink_to("/dev/full")
    with pytest.raises(OSError, match="No space left on device"):
        save_models(tmp_path, {"memory": model}, {"device": "y"})
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(before)  # nothing half-written left (names first:
    assert {p.name: p.read_bytes() for p in tmp_path.iterdir()} == before  # /dev/full would read without end)
    assert load_models(tmp_path)[1]["device"] == "x"


def test_training_data_sha256_changes_with_every_column_the_fit_reads(tmp_path, monkeypatch):
    """The hash predict compares to say whether a fingerprint's rows changed since its fit hashed five columns: an
    edited ``family`` (the folds), ``threads``, ``protocol``, ``torch_version``, ``momentum`` or ``weight_decay`` (the
    step's rules) changed the fit, and the fingerprint was called current. Every column a real fit reads (its rows
    watched as it reads them) changes the hash now; the device's, which picks the rows, excepted."""
    from perf4sight.config import load_config
    from perf4sight.dataset import descriptions_and_shas
    from perf4sight.fingerprint import fit

    _measured_tiny_networks(tmp_path, {"a": 8, "b": 16}, listed=["a", "b"])
    (tmp_path / "config.toml").write_text('[networks]\nzoo = []\n[devices.local]\nbackend = "cpu"\n')
    descs, _ = descriptions_and_shas(load_config(tmp_path / "config.toml"), "local")
    rows = read_rows(results_path(tmp_path / "profiling_csvs", "local"))
    read: set[str] = set()

    class Watched(dict):
        def get(self, key, default=None):
            read.add(key)
            return super().get(key, default)

        def __getitem__(self, key):
            read.add(key)
            return super().__getitem__(key)

    records = fit.records
    monkeypatch.setattr(fit, "records", lambda rs: [Watched(r) for r in records(rs)])
    meta = fit.fit_fingerprint(rows, descs, "local", tmp_path / "fp", FAST, nested=False)
    monkeypatch.undo()
    assert {"family", "threads", "protocol", "torch_version", "momentum", "weight_decay", "loss"} <= read
    assert fit.training_data_sha256(rows, "local", descs, "peak_rss_mb") == meta["training_data_sha256"]
    for column in sorted(read - {"device"}):
        edited = [dict(r) for r in rows]
        edited[0][column] = f"x{edited[0].get(column, '')}"
        assert fit.training_data_sha256(edited, "local", descs, "peak_rss_mb") != meta["training_data_sha256"], column


def test_two_fits_saving_into_one_folder_at_once_each_write_a_whole_fingerprint(tmp_path, monkeypatch):
    """Every save filled ``models.npz.tmp.npz``, ``held_out.csv.tmp`` and ``metadata.json.tmp``: of two fits of one
    device at once, the second renamed the first's half-written files as its own and the first's rename failed
    (FileNotFoundError), leaving its scraps. Each writer's files are its own now (``files.atomic_path``): the first
    to finish is replaced whole by the last, and nothing is left beside them. The second runs while the first
    writes its held-out rows."""
    from perf4sight.features.aggregate import FEATURE_NAMES
    from perf4sight.fingerprint import storage
    from perf4sight.fingerprint.trees import TargetModel

    rng = np.random.default_rng(0)
    F = np.abs(rng.normal(1, 0.5, size=(30, len(FEATURE_NAMES)))) * 100
    model = TargetModel.fit("memory", F, 500 + F[:, FEATURE_NAMES.index("mem_analytic_mb")], correct=False)
    held = {"memory": (["a"], [1], np.array([600.0]), np.array([610.0]))}
    write_held_out = storage._write_held_out

    second = threading.Thread(target=storage.save_models, args=(tmp_path, {"memory": model}, {"device": "second"},
                                                                held))

    def meanwhile(path, rows):
        monkeypatch.setattr(storage, "_write_held_out", write_held_out)
        second.start()
        second.join(0.5)  # it waits for the first's files now (storage._folder_locked)
        write_held_out(path, rows)

    monkeypatch.setattr(storage, "_write_held_out", meanwhile)
    storage.save_models(tmp_path, {"memory": model}, {"device": "first"}, held)
    second.join()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["held_out.csv", "metadata.json", "models.npz"]
    assert storage.load_models(tmp_path)[1]["device"] in ("first", "second")


def test_a_second_fit_saving_between_the_firsts_renames_waits_for_them(tmp_path, monkeypatch):
    """A fit's three files are renamed one after another, metadata last: a second fit of the device whose renames
    fell between the first's left its models.npz beside the first's metadata.json (reproduced: metadata 'first',
    coefficients of 'second'). The folder is locked while a fit writes and renames: the second's files come whole
    after the first's."""
    import contextlib

    from perf4sight.features.aggregate import FEATURE_NAMES
    from perf4sight.fingerprint import storage
    from perf4sight.fingerprint.trees import TargetModel

    rng = np.random.default_rng(0)
    F = np.abs(rng.normal(1, 0.5, size=(30, len(FEATURE_NAMES)))) * 100
    col = F[:, FEATURE_NAMES.index("mem_analytic_mb")]
    models = {"first": TargetModel.fit("memory", F, 500 + col, correct=False),
              "second": TargetModel.fit("memory", F, 100 + 3 * col, correct=False)}
    held = {"memory": (["a"], [1], np.array([600.0]), np.array([610.0]))}
    second = threading.Thread(target=storage.save_models, args=(tmp_path, {"memory": models["second"]},
                                                                {"device": "second"}, held))
    atomic_path = storage.atomic_path

    @contextlib.contextmanager
    def renamed(path, *args, **kwargs):
        with atomic_path(path, *args, **kwargs) as tmp:
            yield tmp
        if path.name == storage.MODELS_FILE and not second.is_alive() and second.ident is None:
            second.start()  # the first's models.npz renamed, its metadata.json not yet
            second.join(0.5)

    monkeypatch.setattr(storage, "atomic_path", renamed)
    storage.save_models(tmp_path, {"memory": models["first"]}, {"device": "first"}, held)
    second.join()
    loaded, meta = storage.load_models(tmp_path)
    np.testing.assert_array_equal(loaded["memory"].coef, models[meta["device"]].coef)


def test_a_fingerprint_read_between_a_fits_renames_waits_for_them(tmp_path, monkeypatch):
    """A predict loading the fingerprint while a fit had renamed its models.npz and not yet its metadata.json read the
    new coefficients with the old metadata (reproduced: metadata 'first', coefficients of 'second'). A reader holds
    the folder shared (``storage.reading``), a fit exclusively: the reader gets one fit's files."""
    import contextlib

    from perf4sight.features.aggregate import FEATURE_NAMES
    from perf4sight.fingerprint import storage
    from perf4sight.fingerprint.trees import TargetModel

    rng = np.random.default_rng(0)
    F = np.abs(rng.normal(1, 0.5, size=(30, len(FEATURE_NAMES)))) * 100
    col = F[:, FEATURE_NAMES.index("mem_analytic_mb")]
    models = {"first": TargetModel.fit("memory", F, 500 + col, correct=False),
              "second": TargetModel.fit("memory", F, 100 + 3 * col, correct=False)}
    storage.save_models(tmp_path, {"memory": models["first"]}, {"device": "first"})
    read = {}
    reader = threading.Thread(target=lambda: read.update(zip(("models", "meta"), storage.load_models(tmp_path))))
    atomic_path = storage.atomic_path

    @contextlib.contextmanager
    def renamed(path, *args, **kwargs):
        with atomic_path(path, *args, **kwargs) as tmp:
            yield tmp
        if path.name == storage.MODELS_FILE and reader.ident is None:
            reader.start()  # the second's models.npz renamed, its metadata.json not yet
            reader.join(0.5)

    monkeypatch.setattr(storage, "atomic_path", renamed)
    storage.save_models(tmp_path, {"memory": models["second"]}, {"device": "second"})
    reader.join()
    np.testing.assert_array_equal(read["models"]["memory"].coef, models[read["meta"]["device"]].coef)
