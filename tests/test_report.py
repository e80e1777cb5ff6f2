"""The compare report: built from a small fixture of real TX2 measurements, rendered as HTML and
Markdown, and opened in headless Chromium (title set by the page's own script, screenshot not blank)."""
from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest

from perf4sight.config import load_config
from perf4sight.errors import UserError
from perf4sight.fingerprint.api import fit_device, load_device_fingerprint
from perf4sight.importers import import_perf4sight
from perf4sight.report.compare import REPORT_FILES, compare_devices
from perf4sight.report.data import feature_sensitivity, measured_vs_predicted, summarise_measurements
from perf4sight.report.render import Heading, Image, Table, Text, to_html, to_markdown

FAMILIES = ("resnet18", "mobilenetv2", "squeezenet")
SUBSETS = {"tx2a": ("0", "50"), "tx2b": ("0", "25", "75")}  # device -> pruning levels imported


def _subset(src: Path, dst: Path, levels: tuple[str, ...]) -> Path:
    """A perf4sight-layout folder holding only FAMILIES at ``levels`` (symlinks to the shared data)."""
    for fam in FAMILIES:
        for lvl in levels:
            v = f"{fam}_{lvl}"
            (dst / "graphs").mkdir(parents=True, exist_ok=True)
            (dst / "graphs" / f"{v}.json").symlink_to(src / "graphs" / f"{v}.json")
            for kind in ("memory", "latency"):
                d = dst / "profiling_csvs" / "tx2" / "imagenet" / kind
                d.mkdir(parents=True, exist_ok=True)
                (d / f"{v}-gt.csv").symlink_to(src / "profiling_csvs" / "tx2" / "imagenet" / kind / f"{v}-gt.csv")
    return dst


@pytest.fixture(scope="module")
def project(tmp_path_factory):
    """A config in a temp folder with two fingerprinted devices (subsets of the TX2 data, 20 trees)."""
    from conftest import TX2_DATA
    if not (TX2_DATA / "graphs").is_dir():
        pytest.skip(f"shared TX2 data not found at {TX2_DATA} (set PERF4SIGHT_TX2_DATA)")
    tmp = tmp_path_factory.mktemp("report")
    (tmp / "config.toml").write_text(f"""
[networks]
input_shape = [3, 224, 224]
[devices.tx2a]
backend = "jetson"
memory_limit_mb = 7000
[fingerprint]
n_estimators = 20
min_samples_leaf = 2
[compare]
networks = ["resnet18", "{TX2_DATA / 'graphs' / 'mobilenetv2_0.json'}", "{TX2_DATA / 'graphs' / 'resnet50_0.json'}"]
pruning_levels = [50, 0]
pruning_batch_size = 16
""")
    cfg = load_config(tmp / "config.toml")
    from perf4sight.dataset import device_dataset
    for dev, levels in SUBSETS.items():
        src = _subset(TX2_DATA, tmp / f"src_{dev}", levels)
        import_perf4sight(src, dev, cfg.profiling_dir, cfg.models_dir)
        fit_device(cfg, dev, device_dataset(cfg, dev).descriptions)
    return cfg


@pytest.fixture(scope="module")
def report(project):
    from rich.console import Console
    console = Console(record=True, width=140)
    folder = compare_devices(project, list(SUBSETS), console)
    return folder, console.export_text()


def test_compare_reads_the_step_times_the_fingerprint_was_fitted_on(project, monkeypatch):
    """With a drift reference (references.csv) the fit reads step times divided by it; the report's dots, scatter
    and tables read the same figures (they read the raw ones, and its scatter refitted on them)."""
    from perf4sight.dataset import device_dataset
    from perf4sight.fingerprint.api import drift_corrected
    from perf4sight.profiling import results
    from perf4sight.report import compare

    seen = {}
    monkeypatch.setattr(compare, "measured_vs_predicted", lambda fp, rows, descs: seen.setdefault("rows", rows))
    monkeypatch.setattr(compare, "feature_sensitivity", lambda *a, **k: {})
    _, _, raw, _ = device_dataset(project, "tx2a", load_device_fingerprint(project, "tx2a").optimizer)
    refs = results.references_path(project.profiling_dir, "tx2a")
    try:
        for stamp, ms in (("2000-01-01T00:00:00+00:00", 100.0), ("2100-01-01T00:00:00+00:00", 200.0)):
            results.append_row(refs, {**raw[0], "status": "ok", "latency_ms_median": ms, "timestamp": stamp})
        corrected, drift = drift_corrected(project, "tx2a", raw)
        data, _ = compare.gather_device(project, "tx2a")
    finally:
        refs.unlink()
    assert drift["applied"] and drift["rows_corrected"] > 0

    def latency(rows: list[dict]) -> list[str]:
        return [r["latency_ms_median"] for r in rows]
    assert latency(data.rows) == latency(seen["rows"]) == latency(corrected) != latency(raw)


def test_compare_corrects_a_fingerprints_rows_by_its_own_steps_references_whatever_profile_loss_says(project,
                                                                                                       monkeypatch):
    """Under a config of another step than the fingerprint's (``--stage all --loss mse`` comparing a device fitted on
    cross entropy's rows), compare reads the rows the fit read: divided by the references of the fingerprint's step,
    not by the config's step's (none here: the rows were left uncorrected)."""
    import dataclasses

    from perf4sight.dataset import device_dataset
    from perf4sight.fingerprint.api import drift_corrected
    from perf4sight.profiling import results
    from perf4sight.report import compare

    monkeypatch.setattr(compare, "measured_vs_predicted", lambda fp, rows, descs: {})
    monkeypatch.setattr(compare, "feature_sensitivity", lambda *a, **k: {})
    assert load_device_fingerprint(project, "tx2a").loss == "cross_entropy"
    _, _, raw, _ = device_dataset(project, "tx2a")
    refs = results.references_path(project.profiling_dir, "tx2a")
    mse = dataclasses.replace(project, profile=dataclasses.replace(project.profile, loss="mse"))
    try:
        for stamp, ms in (("2000-01-01T00:00:00+00:00", 100.0), ("2100-01-01T00:00:00+00:00", 200.0)):
            results.append_row(refs, {**raw[0], "status": "ok", "latency_ms_median": ms, "timestamp": stamp})
        corrected, drift = drift_corrected(project, "tx2a", raw)
        data, _ = compare.gather_device(mse, "tx2a")
    finally:
        refs.unlink()
    assert drift["applied"] and drift["rows_corrected"] > 0

    def latency(rows: list[dict]) -> list[str]:
        return [r["latency_ms_median"] for r in rows]
    assert latency(data.rows) == latency(corrected) != latency(raw)


def test_report_files(report):
    folder, text = report
    assert folder.parent.name == "reports" and folder.name.startswith("compare-")
    for name in list(REPORT_FILES) + [f"scatter_{d}.png" for d in SUBSETS]:
        assert (folder / name).is_file() and (folder / name).stat().st_size > 0, name
    import matplotlib.image as mpimg
    img = mpimg.imread(folder / "memory_vs_batch.png")
    assert img.ndim == 3 and img.shape[0] > 200 and img[..., :3].std() > 0.05  # drawn, not blank
    for dev in SUBSETS:  # the terminal table names both devices and the report path
        assert dev in text
    assert "index.html" in text


def test_html_is_self_contained_and_matches_markdown(report):
    folder, _ = report
    html = (folder / "index.html").read_text()
    md = (folder / "report.md").read_text()
    assert 'src="http' not in html and "<link" not in html  # nothing fetched from outside
    assert html.count('src="data:image/png;base64,') == 4 + len(SUBSETS)
    for heading in ("Devices at a glance", "What was measured", "Largest batch that fits",
                    "Pruning: step time and the largest batch against the pruning level",
                    "Features each fingerprint leans on", "Predicted against measured"):
        assert f">{heading}</h2>" in html and f"## {heading}" in md
    for pic in ["latency_vs_batch.png", "memory_vs_batch.png", "feature_sensitivity.png", "pruning.png"]:
        assert f"]({pic})" in md
    for dev in SUBSETS:
        assert f"| {dev} |" in md
    assert md.count("| SGD with momentum and weight decay |") == len(SUBSETS)  # the glance table: the TX2s' step
    assert md.count("| networks held out, 5 folds |") == 2 * len(SUBSETS)  # latency and memory, each device
    assert md.count("| networks held out, 5 folds, of a family in training |") == 2 * len(SUBSETS)


def test_report_data(project, report):
    folder, _ = report
    data = json.loads((folder / "data.json").read_text())
    a, b = data["devices"]["tx2a"], data["devices"]["tx2b"]
    assert a["capacity_mb"] == 7000  # configured limit
    assert b["capacity_mb"] is not None and b["capacity_mb"] < 7859  # learnt from the OOM rows
    for dev in (a, b):
        assert set(dev["max_batch"]) == {"resnet18", "mobilenetv2_0", "resnet50_0"}
        assert all(isinstance(v, int) and 8 < v < 1024 for v in dev["max_batch"].values())
    assert data["batch_search_limit"] == 1024  # a max_batch of 1024 reads "1024+" in the tables: every batch fits
    # memory rises with batch size; the zoo resnet18 is matched to the measured unpruned TX2 network
    for c in data["curves"]["memory"]["resnet18"]:
        mem = np.array(c["predicted"])
        assert mem[-1] > 2 * mem[0] and np.all(mem[1:] > 0.95 * mem[:-1])  # tree corrections wiggle a little
        assert np.all(np.array(c["low"]) <= np.array(c["predicted"]))
        assert np.all(np.array(c["predicted"]) <= np.array(c["high"]))
        assert c["measured_network"] == "resnet18_0" and len(c["measured"]) >= 5
    # below the largest fitting batch the predicted memory stays under the capacity; the curve goes past it,
    # unless the memory form saturates: then its prediction stays under the limit, and `fits` compares the demand
    curve = next(c for c in data["curves"]["memory"]["resnet18"] if c["device"] == "tx2a")
    bs, mem = np.array(curve["batch_size"]), np.array(curve["predicted"])
    fp = load_device_fingerprint(project, "tx2a")
    if fp.capacity_basis == "prediction":
        assert mem[bs <= a["max_batch"]["resnet18"]].max() <= 7000 < mem[-1]
    else:
        assert "ceiling" in fp.models["memory"].terms and mem.max() <= 7000
        from perf4sight.networks.zoo import describe_zoo
        m, resnet18 = a["max_batch"]["resnet18"], describe_zoo("resnet18", fp.input_shape, num_classes=1000)
        assert [p["fits"] for p in fp.predict(resnet18, [m, m + 1])] == [True, False]
    # resnet50 is larger than every training network (resnet18, mobilenetv2, squeezenet): the report says so
    md = (folder / "report.md").read_text()
    # a capacity compared with the demand, not with the curve drawn: said, and not drawn over that curve
    demand = {d: load_device_fingerprint(project, d) for d in SUBSETS}
    demand = [f"{d} ({f.capacity_mb:.0f} MiB)" for d, f in demand.items() if f.capacity_basis == "analytic"]
    assert demand and f"Capacity of {', '.join(demand)}: compared with the memory model's analytic demand" in md
    assert "tx2a: MACs per sample outside the training networks' " in md and "resnet50_0 4.09 G" in md
    assert "resnet18:" not in md and "mobilenetv2_0:" not in md  # inside: no note


def test_devices_trained_at_other_input_shapes_are_said_to_differ(project):
    """A CPU fingerprint at 3x64x64 beside a TX2 one at 3x224x224 looked like a CPU three times faster than the TX2
    in the plots: the report says the shapes differ, and each device's curves carry its shape for the legend."""
    from perf4sight.report.compare import _curves, _entries, gather_device

    devs, descs = [], {}
    for name in SUBSETS:
        d, descs[name] = gather_device(project, name)
        devs.append(d)
    devs[1].fingerprint.input_shape = [3, 112, 112]
    notes: list[str] = []
    curves, names = _curves(project, devs, descs, _entries(project), notes)
    assert "the fingerprints were trained at different input shapes (tx2a 3x224x224, tx2b 3x112x112)" in notes[0]
    assert {(c.device, c.input_shape) for c in curves["latency"]["resnet18"]} == {("tx2a", "3x224x224"),
                                                                                    ("tx2b", "3x112x112")}
    devs[1].fingerprint.input_shape = list(devs[0].fingerprint.input_shape)  # the same shape: no note, no label
    notes.clear()
    curves, _ = _curves(project, devs, descs, _entries(project), notes)
    assert not any("input shapes" in n for n in notes)
    assert {c.input_shape for c in curves["memory"]["resnet18"]} == {""}


def test_a_largest_batch_beyond_the_training_batch_sizes_is_said_to_be_an_extrapolation(project):
    """The report's notes said where a network lies outside a fingerprint's training rows at a measured batch size
    only: a largest batch that fits far beyond the batch sizes the device ran (a CPU profiled up to 32 finds 400)
    was shown without a word, where predict's --max-batch-size notes it."""
    from perf4sight.profiling.results import batch_size_of
    from perf4sight.report.compare import _curves, gather_device

    d, descs = gather_device(project, "tx2a")
    notes: list[str] = []
    _curves(project, [d], {"tx2a": descs}, ["resnet18"], notes)
    assert not any("largest batch" in n for n in notes)  # inside the rows' batch sizes: nothing said
    # as if the device had run batch sizes up to 16 only (a CPU's profile stops at 32)
    d.rows = [r for r in d.rows if batch_size_of(r) <= 16]
    d.fingerprint.metadata["training_domain"]["ranges"]["batch_size"] = [2.0, 16.0]
    notes.clear()
    _curves(project, [d], {"tx2a": descs}, ["resnet18"], notes)
    mb = d.max_batch["resnet18"]
    assert mb > 16 and notes == [f"tx2a: resnet18: its largest batch predicted to fit, {mb}, is outside the training "
                                 "rows' batch sizes 2..16: an extrapolation (expect larger errors)"]


def test_a_fingerprint_without_rows_here_is_not_said_to_leave_its_batch_sizes_at_batch_8(project):
    """A fingerprint fitted in another project (no rows here) had its networks' notes asked at batch 8, the default
    of the largest batch measured: the H200's, trained at 32..2,048, printed "h200: batch size 8: outside the
    training rows' 32..2,048" once per network, naming none. Asked at a batch size its rows held, nothing is said."""
    from perf4sight.report.compare import _curves, gather_device

    d, descs = gather_device(project, "tx2a")
    d.rows = []  # its measurements are in another project
    d.fingerprint.metadata["training_domain"]["ranges"]["batch_size"] = [32.0, 256.0]
    notes: list[str] = []
    _curves(project, [d], {"tx2a": descs}, ["resnet18", "resnet18"], notes)
    assert not any("batch size" in n for n in notes), notes
    assert d.fingerprint.outside_training(descs["resnet18_0"], [8])  # what was asked before: a note of batch size 8


def test_the_pruning_sections_largest_batches_beyond_the_training_batch_sizes_are_said_to_be_extrapolations(project):
    """The pruning section's largest batch of each level was shown without a word where it lay beyond the batch sizes
    the device ran, as the report's own table of largest batches was."""
    from perf4sight.report.compare import gather_device
    from perf4sight.report.pruning import pruning_points

    d, _ = gather_device(project, "tx2a")
    shape = {"tx2a": tuple(d.fingerprint.input_shape)}
    ranges = d.fingerprint.metadata["training_domain"]["ranges"]
    notes: list[str] = []
    ranges["batch_size"] = [1.0, 1024.0]  # as if it had run every batch size searched
    points = pruning_points(project, [d], shape, ["resnet18"], notes)
    assert not any("extrapolation" in n for n in notes)  # inside the rows' batch sizes: nothing said
    ranges["batch_size"] = [2.0, 16.0]  # as if it had run up to 16 only
    notes.clear()
    points = pruning_points(project, [d], shape, ["resnet18"], notes)
    whole, half = (p.max_batch for p in points)
    assert 16 < whole < half and [n for n in notes if "extrapolation" in n] == [
        f"pruning section: tx2a: the largest batches of resnet18_l0 ({whole}), resnet18_l50 ({half}) are outside its "
        "training rows' batch sizes 2..16: extrapolations (expect larger errors)"]


def test_data_json_holds_no_nan(project):
    """A fingerprint's accuracy row of no rows (``network_split_seen`` where no held-out network had its family in
    training, a random split of fewer than 10 rows) holds NaN, which data.json wrote as ``NaN``: not JSON (a strict
    reader, JavaScript's JSON.parse or jq, refuses the file). It is null there now."""
    from perf4sight.report.compare import _data_json, _json_text, gather_device

    d, _ = gather_device(project, "tx2a")
    d.metadata["accuracy"]["latency"]["network_split_seen"] = {"n": 0, "mape": float("nan"), "rmspe": float("nan"),
                                                               "within10": float("nan")}
    text = _json_text(_data_json([d], {}, [], []))

    def refuse(constant: str):
        raise ValueError(f"not JSON: {constant}")

    data = json.loads(text, parse_constant=refuse)
    assert data["devices"]["tx2a"]["accuracy"]["latency"]["network_split_seen"] == {
        "n": 0, "mape": None, "rmspe": None, "within10": None}
    assert data["devices"]["tx2a"]["capacity_mb"] == 7000


def test_a_variant_pruned_on_request_is_said_in_the_report(project):
    """[compare] networks may name a level no one profiled (``resnet18_l45``): pruned as the networks stage would,
    predicted on every device, and the report's notes say so."""
    from dataclasses import replace
    from perf4sight.report.compare import _curves, _entries, gather_device

    cfg = replace(project, compare=replace(project.compare, networks=["resnet18_l45"]))
    devs, descs = [], {}
    for name in SUBSETS:
        d, descs[name] = gather_device(cfg, name)
        devs.append(d)
    notes: list[str] = []
    curves, names = _curves(cfg, devs, descs, _entries(cfg), notes)
    assert names == ["resnet18_l45"] and {c.device for c in curves["latency"]["resnet18_l45"]} == set(SUBSETS)
    assert [n for n in notes if "resnet18_l45" in n][0].startswith(
        "resnet18_l45: not in the dataset: resnet18 pruned on request as the networks stage would (l1-norm, "
        "min_channels ")


def test_pruning_section(project, report):
    """Every device predicts resnet18 pruned at each [compare] pruning_levels level (sorted); the description files
    among the compare networks cannot be pruned and are left out with a note; the TX2's own pruned networks have
    other names (resnet18_50), so nothing is drawn as measured."""
    folder, text = report
    pruned = json.loads((folder / "data.json").read_text())["pruning"]
    assert [(p["network"], p["level"], p["device"]) for p in pruned] == [
        ("resnet18", level, dev) for level in (0, 50) for dev in SUBSETS]
    for dev in SUBSETS:
        whole, half = (p for p in pruned if p["device"] == dev)
        assert half["latency_ms"] < whole["latency_ms"] and half["memory_mb"] < whole["memory_mb"]
        assert half["max_batch"] > whole["max_batch"] > 16 and whole["fits"] is True and abs(half["achieved"] - 50) < 2
        assert not whole["measured_status"] and whole["measured_latency_ms"] is None
    from conftest import TX2_DATA
    md = " ".join((folder / "report.md").read_text().split())
    for name in ("mobilenetv2_0.json", "resnet50_0.json"):
        assert f"pruning section: {TX2_DATA / 'graphs' / name} left out: only a zoo network" in md
    assert "pruned on request as the networks stage would (l1-norm, min_channels 4, seed 0): at 3x224x224: " \
        "resnet18_l0, resnet18_l50" in md
    assert "pruned: step time at batch 16 (ms) / largest batch" in text  # the terminal's short table


def test_least_level_agrees_with_the_sections_own_predictions(project, report):
    """At a batch size the unpruned resnet18 just misses, the least level that fits (the search of
    --prune-to-fit) lies above 0, and the section's predictions at its levels fit exactly from there on."""
    from dataclasses import replace
    from perf4sight.report.compare import _trained_at, gather_device
    from perf4sight.report.pruning import least_levels, pruning_points

    folder, _ = report
    data = json.loads((folder / "data.json").read_text())
    assert [(x["network"], x["device"], x["level"]) for x in data["pruning_least"]] == [
        ("resnet18", dev, 0) for dev in SUBSETS]  # batch 16 fits unpruned
    whole = next(p for p in data["pruning"] if p["device"] == "tx2a" and p["level"] == 0)
    cfg = replace(project, compare=replace(project.compare, pruning_batch_size=whole["max_batch"] + 1,
                                           pruning_levels=[0, 25, 50, 75]))
    devs = [gather_device(cfg, "tx2a")[0]]
    notes: list[str] = []
    points = pruning_points(cfg, devs, _trained_at(cfg, devs), ["resnet18"], notes)
    (least,) = least_levels(cfg, devs, _trained_at(cfg, devs), points, notes)
    assert 0 < least.level < 99 and least.batch_size == whole["max_batch"] + 1 and abs(least.achieved - least.level) < 2
    assert [p.fits for p in points] == [p.level >= least.level for p in points]


def test_held_out_scatter_matches_fingerprint_accuracy(project):
    from perf4sight.profiling.results import read_rows, results_path
    from perf4sight.dataset import device_dataset
    fp = load_device_fingerprint(project, "tx2b")
    rows = read_rows(results_path(project.profiling_dir, "tx2b"))
    descs = device_dataset(project, "tx2b").descriptions
    scatter = measured_vs_predicted(fp, rows, descs)
    for target in ("latency", "memory"):
        meas, pred, how = scatter[target]
        assert how == "held out, leave-one-family-out"
        mape = 100 * np.mean(np.abs(pred - meas) / meas)
        assert mape == pytest.approx(fp.metadata["accuracy"][target]["overall"]["mape"], rel=1e-6)
    meas, pred, how = measured_vs_predicted(fp, rows, descs, held_out=False)["memory"]
    assert how == "in-sample" and np.all(np.isfinite(pred))


def test_stored_held_out_predictions_equal_a_refit_and_are_not_used_for_other_rows(project, monkeypatch):
    """The compare stage reads the fingerprint stage's out-of-fold predictions instead of refitting:
    the same figures; a row the fit did not see (here one measured value changed) makes it refit."""
    from perf4sight.profiling.results import read_rows, results_path
    from perf4sight.dataset import device_dataset
    fp = load_device_fingerprint(project, "tx2b")
    assert set(fp.held_out) == {"latency", "memory"}
    rows, descs = read_rows(results_path(project.profiling_dir, "tx2b")), device_dataset(project, "tx2b").descriptions
    stored = measured_vs_predicted(fp, rows, descs)
    table, fp.held_out = fp.held_out, {}
    refit = measured_vs_predicted(fp, rows, descs)
    for target in ("latency", "memory"):
        assert np.array_equal(stored[target][0], refit[target][0])
        np.testing.assert_allclose(stored[target][1], refit[target][1], rtol=1e-9)
    fp.held_out = table
    changed = [dict(r) for r in rows]
    i = next(i for i, r in enumerate(changed) if r["status"] == "ok")
    changed[i]["device_mem_used_mb"] = str(float(changed[i]["device_mem_used_mb"]) + 1)
    calls = []
    import perf4sight.report.data as data
    real_cv, real_nested = data.grouped_cv, data.nested_cv  # the refit: nested where the stage's table is
    monkeypatch.setattr(data, "grouped_cv", lambda *a, **k: calls.append(1) or real_cv(*a, **k))
    monkeypatch.setattr(data, "nested_cv", lambda *a, **k: calls.append(1) or real_nested(*a, **k))
    measured_vs_predicted(fp, changed, descs)
    assert len(calls) == 1  # memory refitted, latency (unchanged rows) read from the file
    fewer = [r for j, r in enumerate(rows) if j != i]  # a row gone since the fit: its folds changed too
    measured_vs_predicted(fp, fewer, descs)
    assert len(calls) == 3


def test_a_refit_without_out_of_memory_rows_chooses_each_folds_form_as_the_fingerprint_stage_did(project, tmp_path):
    """With no row out of memory a fold of two families keeps the preferred memory form's sum without its ceiling
    (``select_candidate``'s ``saturates``); compare's refit of the held-out scatter kept the saturating form there,
    and read squeezenet's memory up to 14% away from the fingerprint stage's own held-out figures."""
    from perf4sight.dataset import device_dataset
    from perf4sight.fingerprint import fit_fingerprint, load_fingerprint
    from perf4sight.profiling.results import read_rows, results_path
    rows = [r for r in read_rows(results_path(project.profiling_dir, "tx2b")) if r["status"] == "ok"]
    descs = device_dataset(project, "tx2b").descriptions
    meta = fit_fingerprint(rows, descs, "tx2b", tmp_path / "tx2b", project.fingerprint)
    assert meta["oom_rows"] == 0 and "ceiling" not in meta["accuracy"]["memory"]["forms_per_fold"]["squeezenet"]
    fp = load_fingerprint(tmp_path / "tx2b")
    stored = measured_vs_predicted(fp, rows, descs)
    fp.held_out = {}
    refit = measured_vs_predicted(fp, rows, descs)
    for target in ("latency", "memory"):
        np.testing.assert_allclose(refit[target][1], stored[target][1], rtol=1e-9)


def test_feature_sensitivity(project):
    from perf4sight.profiling.results import read_rows, results_path
    from perf4sight.fingerprint.trees import term_features
    from perf4sight.dataset import device_dataset
    fp = load_device_fingerprint(project, "tx2a")
    rows = read_rows(results_path(project.profiling_dir, "tx2a"))
    sens = feature_sensitivity(fp, rows, device_dataset(project, "tx2a").descriptions)
    for target, model in fp.models.items():  # the model's analytic terms plus, with a correction, its tree inputs
        trees = fp.metadata["tree_features_by_target"][target] if model.corrected else []
        assert set(sens[target]) == set(term_features(model.terms)) | set(trees)
    assert all(v >= 0 for t in sens.values() for v in t.values())
    # memory leans on a byte count (analytic estimate, saved activations, weights), not on e.g. depth
    assert max(sens["memory"], key=sens["memory"].get) in {"mem_analytic_mb", "saved_bytes", "param_bytes",
                                                           "max_activation_bytes", "input_bytes",
                                                           "sim_reserved_mb", "sim_alloc_mb"}


def test_summarise_measurements_oom_boundary():
    def row(net, b, status):
        return {"network": net, "family": "f", "batch_size": str(b), "status": status}
    rows = [row("f_0", 1, "ok"), row("f_0", 2, "ok"), row("f_0", 4, "oom"), row("f_0", 8, "skipped_after_oom"),
            row("f_5", 1, "ok"), row("f_5", 2, "ok"), row("f_5", 4, "ok"), row("f_5", 8, "oom")]
    (s,) = summarise_measurements(rows)
    assert (s.variants, s.ok, s.oom, s.other) == (2, 5, 2, 1)
    assert s.largest_ok == (2, 4) and s.first_oom == (4, 8) and s.batch_sizes == [1, 2, 4, 8]


def test_summarise_measurements_folds_rows_without_a_family_cell_by_their_description():
    """Rows of a CSV made by hand leave ``family`` empty: the fit folds them by their description's family
    (``evaluate.row_family``), while the report's measurements table listed each pruning level as a family of one
    variant."""
    from tiny_graphs import conv_node, tiny_description

    descs = {}
    for name in ("mine_0", "mine_30"):
        descs[name] = tiny_description([conv_node("c", "input", 4, 4, 3, 1, 8)])
        descs[name].name, descs[name].network = name, "mine"
    rows = [{"network": n, "family": "", "batch_size": str(b), "status": "ok"} for n in descs for b in (1, 2)]
    (s,) = summarise_measurements(rows, descs)
    assert (s.family, s.variants, s.ok) == ("mine", 2, 4)
    assert [f.family for f in summarise_measurements(rows)] == ["mine_0", "mine_30"]  # no description: the name


def test_compare_errors(project):
    from rich.console import Console
    with pytest.raises(UserError, match="no devices"):
        compare_devices(project, [], Console())
    with pytest.raises(UserError, match="no fingerprint for device 'nope'"):
        compare_devices(project, ["nope"], Console())


def test_log_axes_are_labelled_in_plain_numbers():
    """A narrow memory range gets plain minor labels (700, not 7x10^2); batch sizes on a base-2 axis read as
    numbers (1, 4, 16), not 2^0."""
    import matplotlib.pyplot as plt

    from perf4sight.report.plots import _plain_log_ticks
    fig, (narrow, batch) = plt.subplots(1, 2, figsize=(11, 4))
    narrow.plot([650, 950], [650, 950])
    narrow.set_xscale("log")
    narrow.set_yscale("log")
    _plain_log_ticks(narrow)
    batch.plot([1, 32], [20, 200])
    batch.set_xscale("log", base=2)
    batch.set_yscale("log")
    _plain_log_ticks(batch, x_base=2)
    fig.canvas.draw()
    narrow_labels = {t.get_text() for t in narrow.xaxis.get_ticklabels(minor=True)} - {""}
    batch_labels = [t.get_text() for t in batch.xaxis.get_ticklabels() if 1 <= t.get_position()[0] <= 32]
    plt.close(fig)
    assert {"700", "800", "900"} <= narrow_labels and not any("10^" in s or "times" in s for s in narrow_labels)
    assert "1" in batch_labels and set(batch_labels) <= {"1", "2", "4", "8", "16", "32"}


def test_markdown_escapes_table_cells(tmp_path):
    md = to_markdown("t", [Heading("h"), Text("x"), Table(["a|b"], [["1|2"]])])
    assert "a\\|b" in md and "1\\|2" in md


def test_markdown_images_of_a_device_named_with_a_space_are_images(tmp_path):
    """A device may be named 'jetson tx2' (config: [devices."jetson tx2"]); its scatter plot's link in report.md,
    ![...](scatter_jetson tx2.png), was no image to a Markdown reader (the space ends the address): it showed as
    text. Parsed here with markdown-it (rich's own Markdown parser)."""
    from markdown_it import MarkdownIt

    png = tmp_path / "scatter_jetson tx2.png"
    md = to_markdown("t", [Image(png, "jetson tx2 [b]: predicted against measured")])
    html = MarkdownIt().render(md)
    assert '<img src="scatter_jetson%20tx2.png" alt="jetson tx2 [b]: predicted against measured"' in html


# ---------------------------------------------------------------- headless Chromium

def _chromium() -> str:
    for name in ("chromium", "chromium-browser", "google-chrome"):
        if shutil.which(name):
            return shutil.which(name)
    pytest.skip("chromium not installed (apt-get install -y chromium; ./dev.sh test installs it as root)")


def _open(page: Path, tmp: Path) -> tuple[str, Path]:
    """(title after load from --dump-dom, screenshot path) of ``page`` in headless Chromium."""
    exe = _chromium()
    flags = [exe, "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
             "--disable-background-networking", "--disable-component-update", "--disable-sync",
             "--disable-dev-shm-usage", f"--user-data-dir={tmp / 'profile'}", "--window-size=1200,900"]
    url = page.resolve().as_uri()
    dom = subprocess.run(flags + ["--dump-dom", url], capture_output=True, text=True, timeout=60)
    shot = tmp / "shot.png"
    subprocess.run(flags + [f"--screenshot={shot}", url], capture_output=True, text=True, timeout=60)
    start = dom.stdout.find("<title>")
    title = dom.stdout[start + 7:dom.stdout.find("</title>", start)] if start >= 0 else ""
    return title, shot


def test_report_opens_in_chromium(report, tmp_path):
    folder, _ = report
    title, shot = _open(folder / "index.html", tmp_path)
    assert title.endswith("[ready]"), title
    import matplotlib.image as mpimg
    img = mpimg.imread(shot)
    assert img.shape[:2] == (900, 1200) and img[..., :3].std() > 0.05  # rendered content, not a blank page


def test_chromium_check_sees_a_broken_page(tmp_path):
    """The page's own error hook: a broken image turns the title into an error (so the check can fail)."""
    png = tmp_path / "bad.png"
    png.write_bytes(b"not a png")
    (tmp_path / "bad.html").write_text(to_html("broken", [Image(png, "bad")]))
    title, _ = _open(tmp_path / "bad.html", tmp_path)
    assert "[error" in title and "bad.png" in title


# ---------------------------------------------------------------- bench/run_all.py

def test_run_all_collects_rows_and_printed_output(tmp_path):
    """run_all's contract on toy scripts: run() rows, print-only scripts, a failing script."""
    import sys
    root = Path(__file__).resolve().parents[1]
    bench = tmp_path / "bench"
    bench.mkdir()
    shutil.copy(root / "bench" / "run_all.py", bench / "run_all.py")
    (bench / "bench_rows.py").write_text(
        "def run():\n    print('hello from rows')\n"
        "    return [{'benchmark': 'toy', 'metric': 'mape', 'value': 4.5, 'unit': '%', 'note': 'n=3'}]\n")
    (bench / "prints.py").write_text("print('just printing')\n")
    (bench / "bench_broken.py").write_text("raise SystemExit('broken on purpose')\n")
    (bench / "_helper.py").write_text("raise SystemExit('never run')\n")
    done = subprocess.run([sys.executable, str(bench / "run_all.py"), "--out", str(tmp_path / "res")],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 1  # the broken script fails the run
    md = (tmp_path / "res" / "latest.md").read_text()
    rows = json.loads((tmp_path / "res" / "latest.json").read_text())["rows"]
    assert {"benchmark": "toy", "metric": "mape", "value": 4.5, "unit": "%", "note": "n=3"} in rows
    assert any(r["benchmark"] == "prints" and r["metric"].startswith("ran") for r in rows)
    assert any(r["benchmark"] == "bench_broken" and r["metric"] == "failed" for r in rows)
    assert not any(r["benchmark"] == "_helper" for r in rows)
    assert "hello from rows" in md and "just printing" in md and "broken on purpose" in md
    assert "PerfSeer" in md and "nn-Meter" in md and "DNNPerf" in md and "perf4sight (ICCV-W 2021)" in md
    picked = subprocess.run([sys.executable, str(bench / "run_all.py"), "rows", "--out", str(tmp_path / "one")],
                            capture_output=True, text=True, timeout=60)
    assert picked.returncode == 0 and "just printing" not in (tmp_path / "one" / "latest.md").read_text()


def test_predict_on_several_devices_names_each_in_its_json_lines(project):
    """``--stage predict --device tx2a tx2b`` predicts on each in turn (``--stage all --device A B`` runs it so);
    its JSON lines are the single-device ones with ``device`` first. A device without a fingerprint is said before
    any line is written."""
    import sys

    root = Path(__file__).resolve().parents[1]
    graph = str(project.models_dir / "imported" / "tx2a" / "resnet18_0.json")

    def predict(*devices: str) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, str(root / "main.py"), "--config", str(project.path), "--stage",
                               "predict", "--device", *devices, "--network", graph, "--batch-size", "8", "--json"],
                              capture_output=True, text=True, timeout=300)

    both = predict("tx2a", "tx2b", "tx2a")  # a name given twice: predicted once
    assert both.returncode == 0, both.stderr
    lines = [json.loads(line) for line in both.stdout.splitlines()]
    alone = [json.loads(predict(d).stdout) for d in ("tx2a", "tx2b")]
    assert lines == [{"device": d, **one} for d, one in zip(("tx2a", "tx2b"), alone)]
    assert alone[0]["latency_ms"] != alone[1]["latency_ms"] and "device" not in alone[0]
    missing = predict("tx2a", "nowhere")
    assert missing.returncode == 2 and missing.stdout == "" and "nowhere" in missing.stderr


def test_predict_on_several_devices_says_whose_notes_follow(project, capsys):
    """With ``--device A B`` each device's notes (a batch size outside its rows, a family it was trained on) come
    before its table, so B's printed right under A's table and its "N predictions in" line, naming neither: read as
    A's. Each device's part now starts with a line naming it, on stderr (stdout stays JSON lines alone)."""
    import argparse

    from perf4sight import stages

    graph = str(project.models_dir / "imported" / "tx2a" / "resnet18_0.json")
    for json_lines in (True, False):
        args = argparse.Namespace(device=["tx2a", "tx2b"], network=[graph], batch_size=[8, 100000], json=json_lines,
                                  input_shape=None, max_batch_size=None, prune_to_fit=False, predictor=None)
        assert stages.run_predict(project, args) == 0
        out, err = capsys.readouterr()
        assert "on tx2a:" not in out and err.count("outside this fingerprint's training data") == 2
        first, second = err.split("on tx2b:\n")
        assert first.startswith("on tx2a:\n") and "outside this fingerprint's training data" in first
        assert "outside this fingerprint's training data" in second


def test_a_largest_batch_at_the_search_limit_reads_as_maybe_more():
    """compare's tables show a largest batch of 1024 as 1024+, as predict's --max-batch-size does: every batch
    searched fits, so the device may take more."""
    from perf4sight.report.compare import BATCH_SEARCH_LIMIT, _batch_label

    assert _batch_label(BATCH_SEARCH_LIMIT) == f"{BATCH_SEARCH_LIMIT}+"
    assert _batch_label(37) == "37" and _batch_label(0) == "0" and _batch_label(None) == "–"


def test_a_fingerprint_without_measurements_in_the_project_is_compared_with_a_note(project, tmp_path, capsys):
    """A fingerprint copied in from another project was compared with empty tables of what was measured (0 networks,
    backend '?') and no word why; the terminal said why, the report itself did not."""
    import argparse
    import shutil

    from perf4sight import stages

    (tmp_path / "config.toml").write_text((project.root / "config.toml").read_text())
    cfg = load_config(tmp_path / "config.toml")
    shutil.copytree(project.fingerprint_dir / "tx2a", cfg.fingerprint_dir / "tx2a")
    assert stages.run_compare(cfg, argparse.Namespace(device=["tx2a"])) == 0
    said = f"tx2a: no measurements in {cfg.profiling_dir / 'tx2a' / 'measurements.csv'}: its fingerprint is " \
           "compared, and its tables of what was measured"
    captured = capsys.readouterr()
    assert said in " ".join((captured.out + captured.err).split())
    (folder,) = cfg.reports_dir.glob("compare-*")
    md = (folder / "report.md").read_text()
    assert said in md and "MAPE –%" not in md


def test_measurements_of_networks_without_a_description_here_are_said_in_the_report(project, tmp_path):
    """A device whose fingerprint and measurements come from another config (its descriptions in that config's
    models folder) was compared with an empty scatter ('MAPE –%'), no feature sensitivity and no measured points,
    and no word why. The notes say so; a compared network of a row's name (mobilenetv2_0) drew that row's dots all
    the same: none now."""
    import shutil

    from rich.console import Console

    (tmp_path / "config.toml").write_text((project.root / "config.toml").read_text())
    cfg = load_config(tmp_path / "config.toml")
    shutil.copytree(project.fingerprint_dir / "tx2a", cfg.fingerprint_dir / "tx2a")
    shutil.copytree(project.profiling_dir / "tx2a", cfg.profiling_dir / "tx2a")
    console = Console(record=True, width=400)
    folder = compare_devices(cfg, ["tx2a"], console)
    md = " ".join((folder / "report.md").read_text().split())
    assert "MAPE –%" not in md and "latency: no ok measurements with a description here (Notes)" in md
    assert f"are passed over: no description of them in {cfg.models_dir / 'manifest.csv'}" in md
    assert ("the report's tables of what was measured, measured points, scatter and feature sensitivity of tx2a leave "
            "them out") in md
    assert "leave them out" in console.export_text()
    curves = json.loads((folder / "data.json").read_text())["curves"]  # mobilenetv2_0's 8 rows were dots, unsaid
    assert [c["measured"] for per in curves.values() for cs in per.values() for c in cs] == [[]] * 6


def test_the_devices_tables_count_only_the_networks_with_a_description_here(project, tmp_path):
    """A network whose description is gone (removed from the config, or its graph not imported) keeps its rows in the
    measurements, which the fingerprint stage and the scatter pass over and the notes count: the devices table,
    the terminal's and the table of what was measured counted the network and its rows all the same (6 networks,
    89 / 54 rows with squeezenet_50's 25)."""
    from rich.console import Console

    from perf4sight.profiling.results import read_rows
    (tmp_path / "config.toml").write_text((project.root / "config.toml").read_text())
    cfg = load_config(tmp_path / "config.toml")
    for folder in (project.fingerprint_dir / "tx2a", project.profiling_dir / "tx2a",
                   project.models_dir / "imported" / "tx2a"):
        shutil.copytree(folder, tmp_path / folder.relative_to(project.root))
    (cfg.models_dir / "imported" / "tx2a" / "squeezenet_50.json").unlink()
    kept = [r for r in read_rows(cfg.profiling_dir / "tx2a" / "measurements.csv") if r["network"] != "squeezenet_50"]
    ok, oom = (sum(r["status"] == s for r in kept) for s in ("ok", "oom"))
    console = Console(record=True, width=400)
    folder = compare_devices(cfg, ["tx2a"], console)
    md = (folder / "report.md").read_text()
    assert f"| tx2a | imported | SGD with momentum and weight decay | 5 | {ok} / {oom} |" in md
    assert "| squeezenet | 1 |" in md and "(the notes count any others)" in md
    assert f"│ tx2a   │ 3x224x224 │ 5    │ {ok}/{oom}" in console.export_text()
    assert "rows of 1 network (squeezenet_50) are passed over" in " ".join(md.split())
    families = json.loads((folder / "data.json").read_text())["devices"]["tx2a"]["families"]
    assert sum(f["variants"] for f in families) == 5 and sum(f["ok"] for f in families) == ok


def test_the_pruning_section_shows_a_largest_batch_at_the_search_limit_as_maybe_more():
    """The pruning table and its terminal table showed a largest batch of 1024 as '1024' where the report's other
    tables (and predict) show '1024+': every batch searched fits, so the device may take more."""
    from rich.console import Console

    from perf4sight.report.pruning import PruningPoint, print_pruning, pruning_blocks

    def point(device: str, largest: int) -> PruningPoint:
        return PruningPoint("resnet18", device, 0.0, 0.0, 32, 11.3, 9.1, 15.1, 2699.0, 2565.0, 2964.0, True, largest,
                            "", None, None)

    points = [point("big", 1024), point("small", 161)]
    (table,) = [b for b in pruning_blocks(points, [], ["big", "small"], {"pruning": Path("p.png")})
                if isinstance(b, Table)]
    assert "largest batch 1024+" in table.rows[0][3] and table.rows[0][4].endswith("largest batch 161")
    console = Console(record=True, width=200)
    print_pruning(console, points, [], ["big", "small"])
    text = console.export_text()
    assert "11.3 / 1024+" in text and "11.3 / 161 " in text


def test_pruning_plot_marks_a_largest_batch_at_the_search_limit(tmp_path, monkeypatch):
    """A largest batch at the search limit is "1024+" in the tables: the plot drew it as a point at 1024 like any
    other; it gets a triangle of its own and a legend entry saying every batch searched fits."""
    from perf4sight.report import plots
    from perf4sight.report.pruning import PruningPoint

    def point(level: float, max_batch: int) -> PruningPoint:
        return PruningPoint("resnet18", "cpu", level, level, 8, 150.0 - level, 80.0, 270.0, 826.0 - level, 820.0,
                            830.0, True, max_batch)
    kept: list = []
    monkeypatch.setattr(plots, "_save", lambda fig, path: kept.append(fig) or path)
    plots.plot_pruning([point(0, 848), point(30, 1024), point(60, 1024)], [], {"cpu": "C0"}, {"cpu": 1500.0},
                       {"cpu": "cpu at 3x32x32"}, tmp_path / "pruning.png")
    (fig,) = kept
    panel = fig.axes[2]
    marked = [ln for ln in panel.get_lines() if ln.get_marker() == "^"]
    assert [list(ln.get_xdata()) for ln in marked] == [[30, 60]] and list(marked[0].get_ydata()) == [1024, 1024]
    assert marked[0].get_label() == "cpu: 1024+ (every batch searched fits)"
    assert "cpu: 1024+ (every batch searched fits)" in [t.get_text() for t in panel.get_legend().get_texts()]


def test_devices_on_the_same_points_of_the_pruning_plot_all_show(tmp_path, monkeypatch):
    """Compared with the TX2, the H100 and the H200 were both at 1024+ at every level and both fitting from 0%: their
    points, triangles and dotted lines were drawn alike, the H200's over the H100's, which could not be seen. The
    devices drawn first have larger markers and wider dotted lines, so that each shows round the ones drawn over it."""
    from perf4sight.report import plots
    from perf4sight.report.pruning import LeastLevel, PruningPoint

    def point(device: str, level: float) -> PruningPoint:
        return PruningPoint("resnet18", device, level, level, 32, 11.0, 9.0, 15.0, 2700.0, 2500.0, 2900.0, True, 1024)
    kept: list = []
    monkeypatch.setattr(plots, "_save", lambda fig, path: kept.append(fig) or path)
    devices = ("h100", "h200")
    plots.plot_pruning([point(d, lvl) for d in devices for lvl in (0, 30)],
                       [LeastLevel("resnet18", d, 32, 0, 0.0) for d in devices], {"h100": "C1", "h200": "C2"},
                       {d: 80000.0 for d in devices}, {}, tmp_path / "pruning.png")
    (fig,) = kept
    memory, largest = fig.axes[1], fig.axes[2]
    for panel, marker in ((largest, "o"), (largest, "^")):
        first, second = [ln for ln in panel.get_lines() if ln.get_marker() == marker]
        assert first.get_markersize() > second.get_markersize() and first.get_color() == "C1"
    first, second = [ln for ln in memory.get_lines() if ln.get_linestyle() == ":"]
    assert first.get_linewidth() > second.get_linewidth() and first.get_label() == "h100: fits from 0%"


def test_the_terminal_summary_cuts_no_network_name_or_largest_batch_of_many_networks():
    """compare's terminal table had a column per network: with 16 networks, printed to a file or a pipe (200
    columns), it cut every name to 'resn…' and a largest batch of 1024+ to '102…'. The largest batches are now a
    table of their own, a row per network and a column per device."""
    from types import SimpleNamespace

    from rich.console import Console

    from perf4sight.report.compare import _print_summary

    names = [f"resnet50_pruned_at_{level}" for level in range(0, 80, 5)]
    devs = [SimpleNamespace(name=name, metadata={"accuracy": {}}, rows=[], families=[], networks=[],
                            fingerprint=SimpleNamespace(capacity_mb=cap), max_batch=dict.fromkeys(names, largest))
            for name, cap, largest in (("h100", 100177.0, 1024), ("tx2", 7291.0, 161))]
    console = Console(record=True, width=200)
    _print_summary(console, devs, names, Path("reports/compare-x"))
    text = console.export_text()
    assert "…" not in text
    rows = [line for line in text.splitlines() if "resnet50_pruned_at_" in line]
    assert len(rows) == len(names) and all("1024+" in r and " 161 " in r for r in rows)


def test_the_scatters_rows_without_a_figure_are_not_counted_with_the_rows_of_networks_without_a_description():
    """The TX2's import with resnet50_90's graph missing: the scatter's line said '25 ok rows without a latency
    figure left out', 12 without a figure and 13 ok rows of the undescribed resnet50_90 (the notes count those)."""
    from types import SimpleNamespace

    from perf4sight.report.compare import _scatter_blocks

    rows = ([{"network": "a", "status": "ok"}] * 10 + [{"network": "gone", "status": "ok"}] * 4
            + [{"network": "a", "status": "oom"}])
    meas = np.linspace(100.0, 200.0, 8)  # two of a's rows have no latency figure, all of its rows a memory one
    scatter = {"latency": (meas, meas * 1.05, "held out"), "memory": (np.ones(10), np.ones(10), "held out")}
    dev = SimpleNamespace(name="tx2", rows=rows, scatter=scatter)
    (text,) = [b.text for b in _scatter_blocks([dev], {"scatter:tx2": Path("s.png")}, {"tx2": {"a": None}})
               if isinstance(b, Text)]
    assert "latency over 8 measurements (held out, 2 ok rows without a latency figure left out)" in text, text
    assert "memory over 10 measurements (held out):" in text, text


def test_the_least_level_table_says_how_far_the_search_went_where_no_level_fits(monkeypatch):
    """With [networks.pruning] min_channels = 128, the TX2's resnet18 at batch 2048 reaches 82% at most: predict's
    --prune-to-fit said 'none up to 82', the compare report 'none up to 99%'."""
    from types import SimpleNamespace

    from perf4sight.networks.pruning import UnreachableLevel
    from perf4sight.report import pruning

    class Variants:  # the network pruned at a level, as LevelVariants; it reaches 82.4% at most
        def __init__(self, cfg, network, shape):
            self.shape, self.pruned = shape, []

        def __call__(self, level):
            if level > 82.4:
                raise UnreachableLevel(f"resnet18 at {level}%", 82.4, "it reaches 82.4% at most")
            return SimpleNamespace(name=f"resnet18_l{level}", pruning_level=float(level))

    monkeypatch.setattr(pruning, "LevelVariants", Variants)
    fp = SimpleNamespace(capacity_mb=7291.0, predict=lambda desc, batches: [
        {"fits": False, "latency_ms": 4.0e4, "memory_mb": 9.0e3}])
    point = pruning.PruningPoint("resnet18", "tx2", 0.0, 0.0, 2048, 4.0e4, 3.6e4, 4.4e4, 9.0e3, 8.5e3, 9.5e3, False,
                                 161)
    least = pruning.least_levels(None, [SimpleNamespace(name="tx2", fingerprint=fp)], {"tx2": (3, 224, 224)},
                                 [point], [])
    assert [(x.level, x.searched_up_to) for x in least] == [(None, 82)]
    tables = [b for b in pruning.pruning_blocks([point], least, ["tx2"], {"pruning": Path("p.png")})
              if isinstance(b, Table)]
    assert tables[-1].rows == [["resnet18", "none up to 82%"]]


def test_a_least_level_search_that_could_not_run_is_not_called_an_unknown_capacity(monkeypatch):
    """With min_channels = 4096 resnet18 cannot be pruned at all: the TX2's search for its least level at batch 2048
    read 'unknown capacity', though the TX2's capacity is 7,291 MiB. The search asks the one level the network
    reaches, 0, and says none up to it fits (the search had stopped there, its cell 'not searched', until
    --prune-to-fit answered a network that reaches 0% at most, as a backbone frozen whole)."""
    from types import SimpleNamespace

    from rich.console import Console

    from perf4sight.networks.pruning import UnreachableLevel
    from perf4sight.report import pruning

    class Variants:  # the network at a level, as LevelVariants; it cannot be pruned at all
        def __init__(self, cfg, network, shape):
            self.shape, self.pruned = shape, []

        def __call__(self, level):
            if level > 0:
                raise UnreachableLevel(f"resnet18 at {level}%", 0.0, "it reaches 0.0% at most")
            return SimpleNamespace(name="resnet18_l0", pruning_level=0.0)

    monkeypatch.setattr(pruning, "LevelVariants", Variants)

    def device(name: str, fits: bool) -> SimpleNamespace:
        return SimpleNamespace(name=name, fingerprint=SimpleNamespace(capacity_mb=7291.0, predict=lambda d, b: [
            {"fits": fits, "latency_ms": 430.0, "memory_mb": 7.9e4}]))

    devices = [device("h100", True), device("tx2", False)]
    points = [pruning.PruningPoint("resnet18", d.name, 0.0, 0.0, 2048, 430.0, 400.0, 460.0, 7.9e4, 7.5e4, 8.3e4, fits,
                                   1024) for d, fits in zip(devices, (True, False))]
    notes: list[str] = []
    least = pruning.least_levels(None, devices, {"h100": (3, 224, 224), "tx2": (3, 224, 224)}, points, notes)
    assert notes == []
    tables = [b for b in pruning.pruning_blocks(points, least, ["h100", "tx2"], {"pruning": Path("p.png")})
              if isinstance(b, Table)]
    assert tables[-1].rows == [["resnet18", "0% (430.0 ms, 79,000 MiB)", "none up to 0%"]]
    console = Console(record=True, width=200)
    pruning.print_pruning(console, points, least, ["h100", "tx2"])
    (row,) = [line for line in console.export_text().splitlines() if "least fit" in line]
    assert row.split("│")[4].strip() == "0%" and row.split("│")[5].strip() == "none", row


def test_the_predict_stage_computes_each_network_s_features_once(project, capsys, monkeypatch):
    """``--stage predict`` asks a trees fingerprint for its predictions and for the notes on its training data, and
    ``--max-batch-size`` for the largest batch and the figures there: each network's features (a walk of its graph
    and its kernel table, 10-20 ms for a large network) were computed for each question (two, three times); now once,
    the answers as before (a batch size outside the rows still noted)."""
    import argparse

    from perf4sight import stages
    from perf4sight.fingerprint import predict as predict_module

    graph = str(project.models_dir / "imported" / "tx2a" / "resnet18_0.json")
    computed: list[str] = []
    features = predict_module.network_features
    monkeypatch.setattr(predict_module, "network_features", lambda d, *a: computed.append(d.name) or features(d, *a))
    for largest in (None, 64):
        computed.clear()
        args = argparse.Namespace(device=["tx2a"], network=[graph], batch_size=None if largest else [8, 100000],
                                  json=True, input_shape=None, max_batch_size=largest, prune_to_fit=False,
                                  predictor=None)
        assert stages.run_predict(project, args) == 0
        out, err = capsys.readouterr()
        lines = [json.loads(line) for line in out.splitlines()]
        assert [line["network"] for line in lines] == ["resnet18_0"] * (1 if largest else 2)
        assert computed == ["resnet18_0"], largest
        assert largest or "batch size 100000: outside the training rows'" in err

def test_the_note_of_devices_with_only_a_gnn_names_those_compared(tmp_path, cli_here):
    """compare's note of the devices that have a GNN and no trees named every such device, compared or not, and said
    "two only have a GNN" of one device named "two": it names the devices asked for, in the number they are."""
    (tmp_path / "config.toml").write_text('[networks]\nzoo = ["resnet18"]\n[devices.local]\nbackend = "cpu"\n')
    for name in ("two", "other"):
        (tmp_path / "fingerprinting" / name).mkdir(parents=True)
        (tmp_path / "fingerprinting" / name / "gnn.json").write_text("{}")
    done = cli_here(tmp_path, "--config", "config.toml", "--stage", "compare", "--device", "two")
    assert done.returncode == 2
    assert ("note: two has only a GNN; compare shows trees fingerprints: run --stage fingerprint --predictor trees "
            "(or ensemble) for it") in done.stderr and "other" not in done.stderr.split("error:")[0], done.stderr
