"""The measured step's loss: ``[profile] loss`` (cross_entropy, mse, l1) from the config to the child's real loss, the
rows' ``loss`` column and key, the fingerprint's rows and metadata, the features and the allocation model."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import torch.nn as nn

from perf4sight.config import load_config
from perf4sight.errors import UserError
from perf4sight.features.aggregate import network_features
from perf4sight.features.step_runtime import StepRuntime
from perf4sight.fingerprint.fit import rows_loss, step_runtime
from perf4sight.ir.from_torch import describe
from perf4sight.ir.schema import NetworkDescription, save_description
from perf4sight.profiling import results
from perf4sight.profiling.child import loss_function, make_target
from perf4sight.profiling.plan import LOSSES, TestPlan

sys.path.insert(0, str(Path(__file__).parent))
from test_allocator import _as_replayed  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
SHAPE = [3, 16, 16]


def image_to_image(width: int = 8) -> nn.Module:
    """A small image-to-image network: its output has the input's shape ([N, 3, H, W])."""
    return nn.Sequential(nn.Conv2d(3, width, 3, padding=1), nn.ReLU(), nn.Conv2d(width, 3, 3, padding=1))


def classifier() -> nn.Module:
    return nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.ReLU(), nn.AdaptiveAvgPool2d(1), nn.Flatten(),
                         nn.Linear(8, 10))


def test_a_plan_or_config_naming_an_unknown_loss_is_one_line_naming_the_allowed_ones(tmp_path):
    assert LOSSES == ("cross_entropy", "mse", "l1") and TestPlan(device="d").loss == "cross_entropy"
    with pytest.raises(UserError, match=r"plan: 'loss' must be one of cross_entropy, mse, l1, got 'huber'"):
        TestPlan(device="d", loss="huber").validate()
    (tmp_path / "config.toml").write_text('[profile]\nloss = "huber"\n')
    with pytest.raises(UserError, match=r"config.toml: \[profile\] loss must be one of cross_entropy, mse, l1, "
                                        r"got 'huber'"):
        load_config(tmp_path / "config.toml")


def test_a_rows_loss_is_part_of_its_key_and_an_empty_cell_reads_cross_entropy():
    row = {"device": "d", "network": "n", "batch_size": "2", "input_shape": "3x16x16", "phase": "train"}
    assert results.loss_of(row) == results.loss_of(dict(row, loss="")) == "cross_entropy"
    assert results.row_key(row) == results.row_key(dict(row, loss="cross_entropy"))
    assert results.row_key(dict(row, loss="mse")) != results.row_key(row)
    assert results.latest_rows([dict(row, loss="mse"), row]) == [dict(row, loss="mse"), row]  # both stand
    assert "loss" in results.COLUMNS


def test_the_child_compares_an_image_to_image_output_with_a_float_target_of_its_shape():
    i2i, cls = describe(image_to_image(), SHAPE, "i2i"), describe(classifier(), SHAPE, "cls")
    for loss in ("mse", "l1"):
        plan = TestPlan(device="d", loss=loss)
        target = make_target(plan, i2i, SHAPE, 2, "cpu")
        assert target.dtype == torch.float32 and list(target.shape) == [2, 3, 16, 16]
        assert list(make_target(plan, cls, SHAPE, 2, "cpu").shape) == [2, 10]  # a float per class score
        # at another input shape than the description's, the output's shape there
        assert list(make_target(plan, i2i, [3, 8, 12], 2, "cpu").shape) == [2, 3, 8, 12]
    out = torch.zeros(2, 3, 16, 16)
    ones = torch.ones(2, 3, 16, 16)
    assert loss_function("mse")(out, 2 * ones).item() == 4.0 and loss_function("l1")(out, 2 * ones).item() == 2.0
    labels = make_target(TestPlan(device="d"), i2i, SHAPE, 2, "cpu")
    assert labels.dtype == torch.int64 and list(labels.shape) == [2, 16, 16]
    # a plan's input_shape other than the description's: labels of the output's positions there (they were the
    # description's 16x16, and cross entropy failed against the 8x12 output)
    labels = make_target(TestPlan(device="d", input_shape=[3, 8, 12]), i2i, [3, 8, 12], 2, "cpu")
    assert list(labels.shape) == [2, 8, 12]
    assert loss_function("cross_entropy")(torch.zeros(2, 3, 8, 12), labels).item() > 0
    # a description's num_classes above its output's 10 scores (hand-edited: it loads): labels that index the scores
    torch.manual_seed(0)
    labels = make_target(TestPlan(device="d"), NetworkDescription.from_dict(dict(cls.to_dict(), num_classes=1000)),
                         SHAPE, 64, "cpu")
    assert 0 <= labels.min() and labels.max() < 10


def test_a_fingerprint_is_of_one_losss_rows_and_its_metadata_says_which():
    rows = [{"phase": "train", "loss": "mse", "backend": "cpu"}] * 2
    assert rows_loss(rows) == "mse" and rows_loss([{"phase": "train"}]) == "cross_entropy"
    with pytest.raises(UserError, match=r"rows of several losses \(cross_entropy, mse\)"):
        rows_loss(rows + [{"loss": ""}])
    runtime = step_runtime(rows)
    assert runtime.loss == "mse" and runtime.metadata()["loss"] == "mse"
    assert StepRuntime.from_metadata(runtime.metadata()) == runtime
    assert StepRuntime.from_metadata({}).loss == "cross_entropy"  # a fingerprint stored before
    assert runtime.label() == "SGD with momentum, MSE loss" and StepRuntime().label() == "SGD with momentum"


CONFIG = """
[networks]
zoo = []
description_files = ["narrow.json", "wide.json"]
input_shape = [3, 16, 16]

[profile]
batch_sizes = {batch_sizes}
warmup_steps = 1
timed_steps = 2
loss = "{loss}"

[devices.local]
backend = "cpu"
threads = 1

[fingerprint]
n_estimators = 10
"""


def _main(folder: Path, loss: str, *args: str, batch_sizes: str = "[1, 2]", code: int = 0,
          here=None) -> subprocess.CompletedProcess:
    """``python main.py ARGS`` in ``folder``; with ``here`` (the ``cli_here`` fixture) in this process instead: a
    stage that loads torch or scikit-learn (seconds a process) where the process boundary is not what is checked."""
    (folder / "config.toml").write_text(CONFIG.format(loss=loss, batch_sizes=batch_sizes))
    if here:
        run = here(folder, "--config", str(folder / "config.toml"), *args)
    else:
        run = subprocess.run([sys.executable, str(ROOT / "main.py"), "--config", str(folder / "config.toml"), *args],
                             capture_output=True, text=True, cwd=folder, timeout=600)
    assert run.returncode == code, run.stdout[-2000:] + run.stderr[-2000:]
    return run


def test_image_to_image_networks_profiled_and_fitted_with_mse_beside_cross_entropy(tmp_path, cli_here):
    """Two tiny image-to-image networks measured on this CPU with ``loss = "mse"``: the rows say so, the fingerprint
    fits them and its metadata says ``mse``, and predict asked for a cross entropy's step says its fingerprint is of
    another loss; ``--loss cross_entropy`` measures the configurations again (the loss is part of a row's key),
    beside the MSE rows."""
    save_description(describe(image_to_image(8), SHAPE, "narrow"), tmp_path / "narrow.json")
    save_description(describe(image_to_image(16), SHAPE, "wide"), tmp_path / "wide.json")
    _main(tmp_path, "mse", "--stage", "networks", here=cli_here)  # torch's seconds: in this process
    run = _main(tmp_path, "mse", "--stage", "profile")
    assert "4/4 rows (4 new)" in run.stdout and "the measured step's loss: mse" in run.stdout
    fitted = _main(tmp_path, "mse", "--stage", "fingerprint", here=cli_here)  # scikit-learn's seconds: in this process
    assert "training step: SGD with momentum, MSE loss" in fitted.stdout
    assert json.loads((tmp_path / "fingerprinting" / "local" / "metadata.json").read_text())["loss"] == "mse"
    asked = ["--stage", "predict", "--network", "narrow_l0", "--batch-size", "2", "--json"]
    plain, other = (_main(tmp_path, "mse", *asked, *extra, here=cli_here)  # in this process: its output checked
                    for extra in ((), ("--loss", "cross_entropy")))
    assert "fitted on steps with loss mse; predicted for loss cross_entropy" in other.stderr
    assert "predicted for loss" not in plain.stderr
    assert json.loads(other.stdout)["memory_mb"] != json.loads(plain.stdout)["memory_mb"]  # its labels, its loss

    again = _main(tmp_path, "mse", "--stage", "profile", "--loss", "cross_entropy", batch_sizes="[1]")
    assert "2/2 rows (2 new)" in again.stdout
    rows = results.read_rows(results.results_path(tmp_path / "profiling_csvs", "local"))
    assert [(r["loss"], r["network"], r["batch_size"], r["status"]) for r in rows] == [
        ("mse", "narrow_l0", "1", "ok"), ("mse", "narrow_l0", "2", "ok"), ("mse", "wide_l0", "1", "ok"),
        ("mse", "wide_l0", "2", "ok"), ("cross_entropy", "narrow_l0", "1", "ok"),
        ("cross_entropy", "wide_l0", "1", "ok")]
    assert all(float(r["latency_ms_median"]) > 0 for r in rows)
    # a loss no row measured: the device is passed over with a note, and the stage stops saying which losses it has
    none = _main(tmp_path, "mse", "--stage", "fingerprint", "--loss", "l1", code=2, here=cli_here)
    assert "local: not fitted: its rows are of steps with loss cross_entropy and mse, none with l1" in none.stderr
    assert "has no rows of a training step with loss l1 ([profile] loss or --loss)" in none.stderr


def test_the_features_count_an_mse_or_l1_loss_over_the_output_and_its_float_target():
    """MSE and L1 over an output of E elements: their passes' FLOPs and kernels, no log-softmax, and a float32
    target of the output's shape in ``input_bytes`` instead of the int64 labels; a classifier's too."""
    desc = describe(image_to_image(), SHAPE, "i2i")
    ce, mse, l1 = (network_features(desc, StepRuntime(loss=loss)) for loss in LOSSES)
    e = 3 * 16 * 16
    image = 4 * e  # the input batch: 3x16x16 floats, as large as the output here
    assert (ce.per_sample["input_bytes"], mse.per_sample["input_bytes"], l1.per_sample["input_bytes"]) == (
        image + 8 * 16 * 16, image + 4 * e, image + 4 * e)
    network = ce.per_sample["flops_total"] - 7 * e  # the cross entropy: log-softmax 4, its likelihood and backward 3
    assert mse.per_sample["flops_total"] == l1.per_sample["flops_total"] == network + 6 * e
    assert mse.static["kernels"] == ce.static["kernels"] - 1 and l1.static["kernels"] == ce.static["kernels"] + 2
    # each keeps one output-sized tensor: the log-softmax's result, the output itself (MSE), the difference (L1)
    assert mse.per_sample["saved_bytes"] == l1.per_sample["saved_bytes"] == ce.per_sample["saved_bytes"]
    assert len(l1.kernels.kind) == len(ce.kernels.kind) + 2 and len(mse.kernels.kind) == len(ce.kernels.kind) - 1
    cls_ce, cls_mse = (network_features(describe(classifier(), SHAPE, "cls"), StepRuntime(loss=loss))
                       for loss in ("cross_entropy", "mse"))
    assert cls_mse.per_sample["input_bytes"] - cls_ce.per_sample["input_bytes"] == 4 * 10  # a float per class


@pytest.mark.parametrize("loss", ["mse", "l1"])
def test_the_allocation_model_writes_down_the_traced_events_of_an_mse_or_l1_loss(loss):
    """The events the allocation model writes down for an MSE or L1 loss (forward and backward) are the ones the
    meta-device run of ``F.mse_loss`` / ``F.l1_loss`` records, event for event, on an image-to-image network and a
    classifier; the replay of a step with that loss carries it."""
    from perf4sight.features.alloc_trace import attach_simulation, record_events, simulate

    for desc in (describe(image_to_image(), SHAPE, "i2i"), describe(classifier(), SHAPE, "cls")):
        model = record_events(desc, 3, steps=3, method="model", loss=loss)
        traced = record_events(desc, 3, steps=3, method="trace", loss=loss)
        assert _as_replayed(model) == _as_replayed(traced)
        assert _as_replayed(model) != _as_replayed(record_events(desc, 3, steps=3, method="model"))
        sims = [simulate(desc, method=m, loss=loss) for m in ("model", "trace")]
        assert sims[0].peaks_mb([1, 7, 64]).tolist() == sims[1].peaks_mb([1, 7, 64]).tolist()
    nf = attach_simulation(network_features(desc, StepRuntime(loss=loss)), desc)
    assert nf.sim.loss == loss


def test_export_of_a_device_with_rows_of_another_loss_only_says_so(tmp_path):
    """A PerfSeer label holds a cross entropy's step: a device measured with MSE alone has nothing to export, and the
    error says that its rows are of another loss (it said "no ok measurement to export (any rows passed over are named
    in the note above)", and no note named them)."""
    import argparse

    from perf4sight import stages

    (tmp_path / "config.toml").write_text('[devices.d]\nbackend = "cpu"\n')
    cfg = load_config(tmp_path / "config.toml")
    row = {"device": "d", "backend": "cpu", "network": "net_l0", "batch_size": 2, "input_shape": "3x16x16",
           "phase": "train", "loss": "mse", "status": "ok", "latency_ms_median": 5.0,
           "timestamp": "2026-11-29T00:00:00+00:00"}
    results.append_row(results.results_path(cfg.profiling_dir, "d"), row)
    args = argparse.Namespace(format="perfseer", output=str(tmp_path / "out"), device=["d"])
    with pytest.raises(UserError, match=r"export: device 'd' has no rows of a step with a cross entropy \(cross_entropy"
                                        r"\), the only loss a PerfSeer label holds; its rows are of mse"):
        stages.run_export(cfg, args)
    assert not (tmp_path / "out").exists()


def test_a_device_with_the_optimisers_rows_of_another_loss_is_passed_over_naming_the_loss(tmp_path):
    """A device whose rows are of Adam's step and of SGD's with an MSE loss, under a config of SGD's step with a cross
    entropy: the note passing it over said its rows were of Adam's steps, "none with SGD", and told to fit Adam's; it
    names the loss its SGD rows were measured with."""
    from perf4sight import stages

    (tmp_path / "config.toml").write_text('[devices.d]\nbackend = "cpu"\n')
    cfg = load_config(tmp_path / "config.toml")
    row = {"device": "d", "backend": "cpu", "network": "net_l0", "batch_size": 2, "input_shape": "3x16x16",
           "status": "ok", "latency_ms_median": 5.0, "timestamp": "2026-11-29T00:00:00+00:00"}
    for phase, loss in (("train_adam", "cross_entropy"), ("train", "mse")):
        results.append_row(results.results_path(cfg.profiling_dir, "d"), dict(row, phase=phase, loss=loss))
    note = stages._other_optimizers_note(cfg, "d")
    assert "its rows are of steps with loss mse, none with cross_entropy" in note and "adam" not in note
