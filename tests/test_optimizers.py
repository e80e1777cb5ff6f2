"""The measured step's optimiser: ``[profile] optimizer`` (sgd, adam, adamw) from the config to the child's real
optimiser, the rows' ``phase``, the features' state and passes, the fingerprint's metadata and predict."""
from __future__ import annotations

import contextlib
import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import torch.nn as nn
from torch.utils._python_dispatch import TorchDispatchMode

from perf4sight.config import load_config
from perf4sight.errors import UserError
from perf4sight.features.aggregate import features_for, network_features
from perf4sight.features.step_runtime import StepRuntime
from perf4sight.fingerprint.fit import rows_optimizer, step_runtime
from perf4sight.ir.from_torch import describe
from perf4sight.ir.schema import save_description
from perf4sight.profiling import results
from perf4sight.profiling.plan import OPTIMIZERS, TestPlan, phase_optimizer, training_phase

ROOT = Path(__file__).resolve().parents[1]
SHAPE = [3, 32, 32]
MIB = 2.0**20


def wide() -> nn.Module:
    """12.6 M parameters in one linear layer (48 MiB a copy): Adam's two moments and its scratch stand out."""
    return nn.Sequential(nn.Flatten(), nn.Linear(3 * 32 * 32, 4096), nn.ReLU(), nn.Linear(4096, 10))


def tiny() -> nn.Module:
    return nn.Sequential(nn.Conv2d(3, 16, 3, padding=1), nn.BatchNorm2d(16), nn.ReLU(), nn.AdaptiveAvgPool2d(1),
                         nn.Flatten(), nn.Linear(16, 10))


def test_phases_name_the_optimiser_and_sgd_keeps_the_old_one():
    assert [training_phase(o) for o in OPTIMIZERS] == ["train", "train_adam", "train_adamw"]
    assert [phase_optimizer(training_phase(o)) for o in OPTIMIZERS] == list(OPTIMIZERS)
    assert phase_optimizer("") == "sgd" and phase_optimizer("infer") is None
    with pytest.raises(UserError, match=r"plan: 'optimizer' must be one of sgd, adam, adamw, got 'lamb'"):
        TestPlan(device="d", optimizer="lamb").validate()


def test_a_config_naming_another_optimiser_is_one_line_naming_the_key(tmp_path):
    (tmp_path / "config.toml").write_text('[profile]\noptimizer = "lamb"\n')
    with pytest.raises(UserError, match=r"config.toml: \[profile\] optimizer must be one of sgd, adam, adamw, "
                                        r"got 'lamb'"):
        load_config(tmp_path / "config.toml")


def test_adam_features_count_its_two_moments_and_its_longer_update():
    desc = describe(wide(), SHAPE, "wide")
    sgd, adam, adamw = (features_for(network_features(desc, StepRuntime(optimizer=o)), 8) for o in OPTIMIZERS)
    param_mib = desc.params * 4 / MIB
    assert adam["mem_analytic_mb"] - sgd["mem_analytic_mb"] == pytest.approx(param_mib)  # one more copy
    assert adam["mem_alloc_mb"] - sgd["mem_alloc_mb"] == pytest.approx(param_mib)
    # per parameter tensor (4 here): Adam launches 7 kernels, AdamW 8, SGD 4; moving 18, 20 and 10 copies
    assert (adam["lt_launches"] - sgd["lt_launches"], adamw["lt_launches"] - sgd["lt_launches"]) == (12, 16)
    assert adam["lt_ew_bytes"] - sgd["lt_ew_bytes"] == pytest.approx(8 * desc.params * 4)
    assert adam["flops_total"] == sgd["flops_total"] and adam["saved_bytes"] == sgd["saved_bytes"]
    with pytest.raises(ValueError, match="unknown optimizer 'lamb'"):
        StepRuntime(optimizer="lamb")


class _ParameterSizedOps(TorchDispatchMode):
    """The aten ops dispatched on tensors of ``numel`` elements: (kernels, parameter-sized tensors read or written,
    each counted once per op, its output once; a zeroing op reads nothing)."""

    def __init__(self, numel: int):
        super().__init__()
        self.numel, self.kernels, self.passes = numel, 0, 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        read = {a.data_ptr() for a in args if isinstance(a, torch.Tensor) and a.numel() == self.numel}
        if func is torch.ops.aten.zero_.default:
            read = set()
        if read or (isinstance(out, torch.Tensor) and out.numel() == self.numel):  # not the step counter's scalar
            self.kernels, self.passes = self.kernels + 1, self.passes + len(read) + 1
        return out


@pytest.mark.parametrize("optimizer,kw", [("sgd", {"momentum": 0.9}), ("sgd", {"momentum": 0.0}),
                                          ("sgd", {"momentum": 0.9, "weight_decay": 5e-4}),
                                          ("sgd", {"momentum": 0.0, "weight_decay": 5e-4}), ("adam", {}),
                                          ("adam", {"weight_decay": 0.01}), ("adamw", {})])
def test_the_update_counts_the_kernels_torch_runs_per_parameter_tensor(optimizer, kw):
    """``optimizer_cost`` against torch's own single-tensor update (a CPU's), steady state: each kernel on a
    parameter-sized tensor, and the tensors it moves; zero_grad's zeroing only where the gradients are kept."""
    from perf4sight.features.optimizers import optimizer_cost
    param = nn.Parameter(torch.randn(64, 48))
    opt = {"sgd": torch.optim.SGD, "adam": torch.optim.Adam, "adamw": torch.optim.AdamW}[optimizer](
        [param], lr=0.01, foreach=False, **kw)
    for kept in (False, True):
        counted = _counted_step(opt, param, kept)
        cost = optimizer_cost(optimizer, momentum=kw.get("momentum", 0) > 0,
                              weight_decay=kw.get("weight_decay", 0) > 0, grads_kept=kept)
        assert (cost.kernels_per_tensor, cost.tensor_passes) == (counted.kernels, counted.passes), kept


def _counted_step(opt: torch.optim.Optimizer, param: nn.Parameter, kept: bool) -> _ParameterSizedOps:
    """The kernels and passes of ``opt``'s third step (the first makes the state), its zero_grad's included."""
    counted = _ParameterSizedOps(param.numel())
    for step in range(3):
        with counted if step == 2 else contextlib.nullcontext():
            opt.zero_grad(set_to_none=not kept)
        param.grad = torch.ones_like(param) if param.grad is None else param.grad.add_(1.0)  # the backward's
        with counted if step == 2 else contextlib.nullcontext():
            opt.step()
    return counted


def test_adamw_is_counted_with_its_decay_where_it_ran():
    """With ``weight_decay=0`` torch skips AdamW's decoupled ``mul_`` (7 kernels, 18 passes per parameter tensor, as
    Adam's); the count kept 8 and 20 whatever the decay. Rows of AdamW without a decay count it no more (rows of 0
    and 0.01 are of two updates now); a fingerprint stored before keeps the count it was fitted with."""
    from perf4sight.features.optimizers import optimizer_cost
    for decay, decoupled in ((0.0, False), (0.01, True)):
        param = nn.Parameter(torch.randn(64, 48))
        counted = _counted_step(torch.optim.AdamW([param], lr=0.01, foreach=False, weight_decay=decay), param, False)
        cost = optimizer_cost("adamw", decoupled_decay=decoupled)
        assert (cost.kernels_per_tensor, cost.tensor_passes) == (counted.kernels, counted.passes), decay
        row = {"backend": "cpu", "phase": "train_adamw", "weight_decay": repr(decay)}
        assert step_runtime([row]).update_cost() == cost
    assert (counted.kernels, counted.passes) == (8, 20)
    assert StepRuntime.from_metadata({"optimizer": "adamw"}).update_cost() == cost  # stored before: 8 and 20
    assert StepRuntime(optimizer="adamw", decoupled_decay=False).label() == "AdamW without weight decay"


def test_a_fingerprint_of_adamw_rows_without_decay_says_so_where_the_config_asks_for_one(tmp_path):
    """The fingerprint stage's note where ``[profile]`` asks for another update than the rows ran: AdamW's decay
    (torch's default 0.01) against rows of ``weight_decay = 0``, which it had read as one update."""
    from perf4sight.stages import _other_update_note

    without = StepRuntime(optimizer="adamw", decoupled_decay=False).metadata()
    for decay, said in (("", "its rows' step is AdamW without weight decay, where [profile] asks for AdamW "),
                        ("weight_decay = 0.0\n", "")):
        (tmp_path / "config.toml").write_text(f'[profile]\noptimizer = "adamw"\n{decay}')
        note = _other_update_note(load_config(tmp_path / "config.toml"), "local", [{"backend": "cpu"}], without)
        assert said in note and bool(note) == bool(said), note


def test_no_update_note_for_adams_rows_where_the_config_sets_momentum_0(tmp_path):
    """``[profile] momentum = 0`` is SGD's alone: Adam's and AdamW's rows profiled with it are the step the config
    asks for, and the fingerprint stage said "its rows' step is Adam, where [profile] asks for Adam". SGD's rows with
    momentum against a config without it still get the note."""
    from perf4sight.stages import _other_update_note

    for optimizer in ("adam", "adamw", "sgd"):
        (tmp_path / "config.toml").write_text(f'[profile]\noptimizer = "{optimizer}"\nmomentum = 0.0\n')
        rows = [{"backend": "cpu", "phase": training_phase(optimizer), "momentum": "0.0", "weight_decay": ""}]
        note = _other_update_note(load_config(tmp_path / "config.toml"), "local", rows, step_runtime(rows).metadata())
        assert note == "", (optimizer, note)
    sgd_rows = [{"backend": "cpu", "phase": "train", "momentum": "0.9", "weight_decay": ""}]
    note = _other_update_note(load_config(tmp_path / "config.toml"), "local", sgd_rows,
                              step_runtime(sgd_rows).metadata())
    assert "its rows' step is SGD with momentum" in note, note


def test_a_fingerprint_is_of_one_optimisers_rows():
    assert rows_optimizer([{"phase": "train_adam"}, {"phase": "train_adam"}]) == "adam"
    assert rows_optimizer([{"phase": ""}, {}]) == "sgd"  # rows written before the optimiser could be chosen
    with pytest.raises(UserError, match=r"rows of several optimisers \(sgd, adam\)"):
        rows_optimizer([{"phase": "train_adam"}, {"phase": "train"}])
    with pytest.raises(UserError, match="rows of phase 'infer': a fingerprint is of a training step"):
        rows_optimizer([{"phase": "infer"}])


CONFIG = """
[networks]
zoo = []
description_files = ["wide.json", "tiny.json"]
input_shape = [3, 32, 32]
num_classes = 10

[profile]
batch_sizes = [1, 2]
warmup_steps = 1
timed_steps = 2
optimizer = "{optimizer}"

[devices.local]
backend = "cpu"
threads = 1

[fingerprint]
n_estimators = 20
gnn_hidden = 8
gnn_layers = 1
gnn_max_epochs = 5
gnn_patience = 3
"""


def _main(folder: Path, optimizer: str, *args: str, here=None) -> subprocess.CompletedProcess:
    """``python main.py ARGS`` in ``folder`` with CONFIG of ``optimizer``; with ``here`` (the ``cli_here``
    fixture) in this process instead: a stage that loads torch or scikit-learn (seconds a process) where the
    process boundary is not what is checked."""
    (folder / "config.toml").write_text(CONFIG.format(optimizer=optimizer))
    if here:
        return here(folder, "--config", str(folder / "config.toml"), *args)
    return subprocess.run([sys.executable, str(ROOT / "main.py"), "--config", str(folder / "config.toml"), *args],
                          capture_output=True, text=True, cwd=folder, timeout=600)


@pytest.fixture(scope="module")
def sgd_measured(tmp_path_factory, cli_in_process) -> Path:
    """The start both round trips share: ``wide`` and ``tiny`` described, the networks stage run (in this process:
    it loads torch) and the configurations measured with SGD (batch sizes 1 and 2: 4 rows). Each test works on a
    copy."""
    folder = tmp_path_factory.mktemp("sgd")
    save_description(describe(wide(), SHAPE, "wide"), folder / "wide.json")
    save_description(describe(tiny(), SHAPE, "tiny"), folder / "tiny.json")
    (folder / "config.toml").write_text(CONFIG.format(optimizer="sgd"))
    assert cli_in_process(folder, "--config", str(folder / "config.toml"), "--stage", "networks") == 0
    run = _main(folder, "sgd", "--stage", "profile")
    assert run.returncode == 0, run.stdout[-2000:] + run.stderr[-2000:]
    assert "4/4 rows (4 new)" in run.stdout
    return folder


def test_profile_fingerprint_and_predict_with_adam_beside_sgd(sgd_measured, tmp_path, cli_here):
    """One device measured with SGD, then with Adam: the Adam sweep measures every configuration again (the phase
    is part of a row's key) and its real optimiser's moments and scratch show in the peak RSS; each optimiser's
    rows fit a fingerprint of their own, which says whose it is, and a config naming a third finds none."""
    shutil.copytree(sgd_measured, tmp_path, dirs_exist_ok=True)
    run = _main(tmp_path, "adam", "--stage", "profile")
    assert run.returncode == 0 and "4/4 rows (4 new)" in run.stdout, run.stdout[-2000:] + run.stderr[-2000:]
    again = _main(tmp_path, "sgd", "--stage", "profile", "--optimizer", "adam")  # for this run instead of the config's
    assert "4/4 rows (0 new)" in again.stdout and "phase train_adam" in again.stdout, again.stderr[-2000:]
    rows = results.read_rows(results.results_path(tmp_path / "profiling_csvs", "local"))
    assert [(r["phase"], r["status"]) for r in rows] == [("train", "ok")] * 4 + [("train_adam", "ok")] * 4
    peak = {(r["phase"], r["network"], r["batch_size"]): float(r["peak_rss_mb"]) for r in rows}
    params_mib = describe(wide(), SHAPE, "wide").params * 4 / MIB
    for bs in ("1", "2"):  # Adam's second moment on top of SGD's momentum, and more: the update's scratch
        assert peak["train_adam", "wide_l0", bs] - peak["train", "wide_l0", bs] > params_mib

    fitted = _main(tmp_path, "adam", "--stage", "fingerprint", "--predictor", "ensemble", here=cli_here)
    assert fitted.returncode == 0, fitted.stdout[-2000:] + fitted.stderr[-2000:]
    assert "training step: Adam (the optimiser of its rows)" in fitted.stdout
    meta = json.loads((tmp_path / "fingerprinting" / "local" / "metadata.json").read_text())
    assert meta["optimizer"] == "adam" and meta["training_rows"] == {"latency": 4, "memory": 4}
    assert meta["optimizer_foreach"] is False  # a CPU's rows: Adam's single-tensor update
    assert json.loads((tmp_path / "fingerprinting" / "local" / "gnn.json").read_text())["optimizer"] == "adam"
    table = _main(tmp_path, "adam", "--stage", "predict", "--network", "wide_l0", "--batch-size", "2",
                  "--predictor", "ensemble")
    assert table.returncode == 0 and "predicted training step (Adam) on local by the ensemble" in table.stdout, \
        table.stderr[-2000:]
    # the config's optimiser chooses the rows: with SGD's, a fingerprint of SGD's step
    sgd = _main(tmp_path, "sgd", "--stage", "fingerprint", here=cli_here)
    assert sgd.returncode == 0 and "training step: SGD with momentum" in sgd.stdout, sgd.stderr[-2000:]
    assert json.loads((tmp_path / "fingerprinting" / "local" / "metadata.json").read_text())["optimizer"] == "sgd"
    # asked about Adam's step, the SGD fingerprint reads its features, and says so; the JSON keys are the same
    plain, told = (_main(tmp_path, "sgd", "--stage", "predict", "--network", "wide_l0", "--batch-size", "2", "--json",
                         *extra) for extra in ((), ("--optimizer", "adam")))
    assert plain.returncode == told.returncode == 0, told.stderr[-2000:]
    assert "local's fingerprint was fitted on steps with SGD with momentum; predicted for Adam" in told.stderr
    p, t = json.loads(plain.stdout), json.loads(told.stdout)
    assert set(t) == set(p) and t["memory_mb"] != p["memory_mb"]
    # a config of Adam's step on that SGD fingerprint is --optimizer adam; --optimizer sgd asks for SGD's step
    mixed = _main(tmp_path, "adam", "--stage", "predict", "--network", "wide_l0", "--batch-size", "2", "--json")
    assert mixed.returncode == 0 and json.loads(mixed.stdout) == t and "predicted for Adam" in mixed.stderr
    back = _main(tmp_path, "adam", "--stage", "predict", "--network", "wide_l0", "--batch-size", "2", "--json",
                 "--optimizer", "sgd")
    assert back.returncode == 0 and json.loads(back.stdout) == p and "predicted for" not in back.stderr
    # a device whose rows are all of another optimiser's step (imported data, say) is passed over with a note when
    # the stage fits every device, and is an error when named
    other = tmp_path / "profiling_csvs" / "other" / "measurements.csv"
    other.parent.mkdir()
    for r in (r for r in rows if r["phase"] == "train"):
        results.append_row(other, dict(r, device="other"))
    both = _main(tmp_path, "adam", "--stage", "fingerprint", here=cli_here)
    assert both.returncode == 0 and "training step: Adam" in both.stdout, both.stderr[-2000:]
    assert "other: not fitted: its rows are of steps with sgd, none with Adam ([profile] optimizer or " \
           "--optimizer); --optimizer sgd fits one of its rows" in both.stderr
    assert not (tmp_path / "fingerprinting" / "other").exists()
    named = _main(tmp_path, "adam", "--stage", "fingerprint", "--device", "other")
    assert named.returncode == 2 and "device 'other' has no rows of a training step with adam" in named.stderr
    # export writes SGD's rows whatever the config's optimiser (a PerfSeer label is read back as SGD's); a device
    # without any is one line, and nothing is written
    exported = _main(tmp_path, "adam", "--stage", "export", "--format", "perfseer", "--output", str(tmp_path / "exp"),
                     "--device", "local")
    assert exported.returncode == 0 and any((tmp_path / "exp").iterdir()), exported.stderr[-2000:]
    for r in (r for r in rows if r["phase"] == "train_adam"):
        results.append_row(tmp_path / "profiling_csvs" / "adam-only" / "measurements.csv", dict(r, device="adam-only"))
    refused = _main(tmp_path, "sgd", "--stage", "export", "--format", "perfseer", "--output", str(tmp_path / "none"),
                    "--device", "adam-only")
    assert refused.returncode == 2 and not (tmp_path / "none").exists()
    assert "device 'adam-only' has no rows of a step with sgd, the only optimiser a PerfSeer label holds" \
        in refused.stderr
    # a config naming AdamW finds no rows of its step on any device: the stage stops, and says which there are
    none = _main(tmp_path, "adamw", "--stage", "fingerprint")
    assert none.returncode == 2
    assert "has no rows of a training step with adamw ([profile] optimizer or --optimizer)" in none.stderr
    local = _main(tmp_path, "adamw", "--stage", "fingerprint", "--device", "local")
    assert local.returncode == 2 and "device 'local' has no rows of a training step with adamw" in local.stderr
    assert "only with adam and sgd: set [profile] optimizer (or --optimizer) to fit those, or profile it " \
           "again" in local.stderr


def test_a_plain_sgd_step_with_weight_decay_is_measured_again_and_fitted_as_such(sgd_measured, tmp_path,
                                                                              cli_here):
    """``[profile] momentum = 0`` and ``weight_decay``: the child runs that real update, the rows record both, the
    sweep measures again the configurations measured with another update (the newest row of a key counts), the peak
    RSS loses the momentum buffer's copy of the parameters and gains the decayed gradient's, and the fingerprint fits
    that step."""
    shutil.copytree(sgd_measured, tmp_path, dirs_exist_ok=True)  # measured with momentum 0.9, no weight decay
    base = CONFIG.format(optimizer="sgd")

    def main(update: str, stage: str, batch_sizes: str = "[1, 2]") -> subprocess.CompletedProcess:
        (tmp_path / "config.toml").write_text(base.replace('optimizer = "sgd"', 'optimizer = "sgd"\n' + update)
                                              .replace("batch_sizes = [1, 2]", f"batch_sizes = {batch_sizes}"))
        if stage == "fingerprint":  # scikit-learn's seconds: in this process
            run = cli_here(tmp_path, "--config", "config.toml", "--stage", stage)
        else:
            run = subprocess.run([sys.executable, str(ROOT / "main.py"), "--config", "config.toml", "--stage", stage],
                                 capture_output=True, text=True, cwd=tmp_path, timeout=600)
        assert run.returncode == 0, run.stdout[-2000:] + run.stderr[-2000:]
        return run

    updates = ("", "momentum = 0", "momentum = 0\nweight_decay = 5e-4")
    # the plain update's rows are only the baseline of the peaks below: batch size 2 alone (two fresh processes
    # fewer); the update with weight decay, which is fitted, takes every configuration again
    assert "2/2 rows (2 new)" in main(updates[1], "profile", batch_sizes="[2]").stdout
    assert "4/4 rows (4 new)" in main(updates[2], "profile").stdout
    rows = results.read_rows(results.results_path(tmp_path / "profiling_csvs", "local"))
    cells = [("0.9", "0.0"), ("0.0", "0.0"), ("0.0", "0.0005")]
    assert [(r["momentum"], r["weight_decay"]) for r in rows] == [c for c, n in zip(cells, (4, 2, 4))
                                                                   for _ in range(n)]
    peak = [{r["batch_size"]: float(r["peak_rss_mb"]) for r in rows if r["network"] == "wide_l0"
             and (r["momentum"], r["weight_decay"]) == c} for c in cells]
    params_mib = describe(wide(), SHAPE, "wide").params * 4 / MIB
    # no momentum buffer: a copy of the parameters less; the decayed gradients: one more
    assert peak[0]["2"] - peak[1]["2"] > 0.5 * params_mib and peak[2]["2"] - peak[1]["2"] > 0.5 * params_mib
    fitted = main(updates[2], "fingerprint")
    assert "training step: SGD with weight decay, no momentum" in fitted.stdout
    meta = json.loads((tmp_path / "fingerprinting" / "local" / "metadata.json").read_text())
    assert (meta["sgd_momentum"], meta["weight_decay"]) == (False, True)
    other = main("", "fingerprint")  # a config of another update than the rows': a note, the rows' step fitted
    assert "local: its rows' step is SGD with weight decay, no momentum, where [profile] asks for SGD with " \
           "momentum" in other.stderr and "note:" not in fitted.stderr
    (tmp_path / "config.toml").write_text(base)  # the flags stand for the keys: every row is of that update already
    flags = subprocess.run([sys.executable, str(ROOT / "main.py"), "--config", "config.toml", "--stage", "profile",
                            "--momentum", "0", "--weight-decay", "5e-4"], capture_output=True, text=True,
                           cwd=tmp_path, timeout=600)
    assert flags.returncode == 0 and "4/4 rows (0 new)" in flags.stdout, flags.stdout[-2000:] + flags.stderr[-2000:]
    (tmp_path / "config.toml").write_text(base.replace('optimizer = "sgd"', 'optimizer = "sgd"\nweight_decay = -1'))
    bad = subprocess.run([sys.executable, str(ROOT / "main.py"), "--config", "config.toml", "--stage", "profile"],
                         capture_output=True, text=True, cwd=tmp_path, timeout=600)
    assert bad.returncode != 0 and "weight_decay must lie in [0, 1), got -1" in bad.stderr, bad.stderr[-2000:]
