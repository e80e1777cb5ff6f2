"""The profile stage on the cpu backend: plan, runner, child processes, resume, oom, errors.

Real torch training steps on tiny networks (3x32x32 inputs) in real child processes; each
child costs ~2-3 s (process start and ``import torch``), so the tests share measurements.
"""
from __future__ import annotations

import json
import re
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest
import torch.nn as nn

from perf4sight.config import load_config
from perf4sight.errors import UserError
from perf4sight.ir.from_torch import describe
from perf4sight.ir.schema import save_description
from perf4sight.profiling import results
from perf4sight.profiling.backends.base import get_backend, latency_stats
from perf4sight.profiling.local import make_plan, profile_local
from perf4sight.profiling.plan import TestPlan, load_plan, save_plan
from perf4sight.profiling.runner import run_plan

ROOT = Path(__file__).resolve().parents[1]
SHAPE = [3, 32, 32]


def tiny(name: str, width: int = 16) -> nn.Module:
    return nn.Sequential(nn.Conv2d(3, width, 3, padding=1), nn.BatchNorm2d(width), nn.ReLU(), nn.MaxPool2d(2),
                         nn.Conv2d(width, 8, 3, padding=1), nn.ReLU(), nn.AdaptiveAvgPool2d(1), nn.Flatten(),
                         nn.Linear(8, 10))


def write_net(folder: Path, name: str, width: int = 16) -> Path:
    return save_description(describe(tiny(name, width), SHAPE, name), folder / f"{name}.json")


def write_broken(folder: Path) -> Path:
    """A description the measuring child cannot build: a dropout that drops 150%, refused when it is read (the
    runner alone does not read the plan's descriptions; the profile stage refuses it before any device)."""
    desc = describe(tiny("broken"), SHAPE, "broken")
    relu = next(n for n in desc.nodes if n.op == "relu")
    relu.op, relu.attrs = "dropout", {"p": 1.5}
    return save_description(desc, folder / "broken.json")


def write_failing_step(folder: Path) -> Path:
    """A description that loads and builds but whose training step fails: labels drawn from a million classes for
    an output of ten (cross-entropy's target out of bounds), an error at every batch size."""
    desc = describe(tiny("broken"), SHAPE, "broken")
    desc.num_classes = 1_000_000
    return save_description(desc, folder / "broken.json")


def write_config(folder: Path, memory_limit_mb: int = 0, batch_sizes: tuple[int, ...] = (1, 2)) -> Path:
    path = folder / "config.toml"
    path.write_text(f"""
[profile]
batch_sizes = {list(batch_sizes)}
warmup_steps = 1
timed_steps = 3
timeout_s = 120

[devices.local]
backend = "cpu"
memory_limit_mb = {memory_limit_mb}
threads = 1
""")
    return path


def run_plan_subprocess(plan_path: Path) -> list[dict]:
    """The runner as a device runs it; returns its progress events."""
    out = subprocess.run([sys.executable, "-m", "perf4sight.profiling.runner", str(plan_path)], cwd=ROOT,
                         capture_output=True, text=True, timeout=300, check=True)
    return [json.loads(line) for line in out.stdout.splitlines() if line.startswith("{")]


@pytest.fixture(scope="module")
def measured(tmp_path_factory):
    """One real local run: the tiny network at batch sizes 1 and 2."""
    folder = tmp_path_factory.mktemp("profile")
    net = write_net(folder, "tiny")
    cfg = load_config(write_config(folder))
    events: list[dict] = []
    summary = profile_local(cfg, "local", [net], progress=events.append)
    return cfg, net, summary, events


def test_the_runner_takes_a_networks_name_and_sha_from_one_read_of_its_file(tmp_path, monkeypatch):
    """The runner read a description's bytes (its sha, what the children measure) and then the file again (its name
    and shape): a file rewritten between the two reads (the networks stage again) gave the rows of one version the
    name of the other. One read gives both."""
    from perf4sight.profiling import runner
    path, other = write_net(tmp_path, "alpha"), write_net(tmp_path / "later", "beta")
    before, real = path.read_bytes(), Path.read_bytes

    def read_then_rewritten(self: Path) -> bytes:
        data = real(self)
        if self == path and data == before:
            path.write_bytes(real(other))
        return data

    monkeypatch.setattr(Path, "read_bytes", read_then_rewritten)
    (net,) = runner._describe_networks(TestPlan(device="d", backend="cpu", networks=[str(path)], batch_sizes=[1]),
                                       tmp_path)
    assert (net.name, net.sha, net.data) == ("alpha", results.file_sha(before), before)


def test_real_run_writes_ok_rows(measured):
    cfg, net, summary, events = measured
    assert (summary.ok, summary.oom, summary.error, summary.already_measured) == (2, 0, 0, 0)
    rows = results.read_rows(summary.csv_path)
    assert summary.csv_path == results.results_path(cfg.profiling_dir, "local")
    assert [(r["network"], r["batch_size"], r["status"]) for r in rows] == [("tiny", "1", "ok"), ("tiny", "2", "ok")]
    for r in rows:
        assert float(r["latency_ms_median"]) > 0
        assert float(r["latency_ms_p10"]) <= float(r["latency_ms_median"]) <= float(r["latency_ms_p90"])
        assert 0 < float(r["update_ms_median"]) < float(r["latency_ms_median"])  # the update, timed inside the step
        assert r["timed_steps"] == "3" and r["warmup_steps"] == "1" and r["protocol"] == "perf_counter"
        assert float(r["peak_rss_mb"]) >= float(r["baseline_rss_mb"]) > 50  # torch alone is well above 50 MiB
        assert r["input_shape"] == "3x32x32" and r["threads"] == "1" and r["device_model"]
        assert r["torch_version"] and r["hostname"] and r["timestamp"]
        assert len(r["description_sha"]) == 16
        assert float(r["swap_in_mb"]) >= 0 and float(r["swap_out_mb"]) >= 0  # from /proc/vmstat
    assert [e["event"] for e in events] == ["plan", "row", "row", "done"]
    assert json.loads(summary.plan_path.read_text())["networks"] == [str(net.resolve())]


def test_resume_never_duplicates(measured, tmp_path):
    cfg, net, first, _ = measured
    again = profile_local(cfg, "local", [net], progress=False)
    assert (again.new_rows, again.already_measured) == (0, 2)
    cfg.profile.batch_sizes = [1, 2, 4]  # one new key: only it is measured
    try:
        more = profile_local(cfg, "local", [net], progress=False)
    finally:
        cfg.profile.batch_sizes = [1, 2]
    assert (more.ok, more.already_measured) == (1, 2)
    keys = [results.row_key(r) for r in results.read_rows(first.csv_path)]
    assert len(keys) == len(set(keys)) == 3


def test_changed_description_is_measured_again_and_its_old_rows_are_passed_over(measured, tmp_path):
    """Same name, another network: the profile stage measures it again (a warning says so), keeps the old
    rows on disk, and the host's stages (fingerprint, compare, export) see only the current ones."""
    from perf4sight.fingerprint.api import device_measurements
    from perf4sight.networks.build import write_manifest
    from perf4sight.dataset import current_rows, device_dataset, stale_note

    cfg = load_config(write_config(tmp_path, batch_sizes=(1,)))
    net = write_net(cfg.models_dir, "tiny", width=16)
    write_manifest([{"network": "tiny", "family": "tiny", "path": net.name}], cfg.models_dir / "manifest.csv")
    csv_path = results.results_path(cfg.profiling_dir, "local")  # the fixture's row of the same description
    csv_path.parent.mkdir(parents=True)
    csv_path.write_text("".join(measured[2].csv_path.read_text().splitlines(keepends=True)[:2]))
    first = profile_local(cfg, "local", [net], progress=False)
    assert (first.already_measured, first.ok, first.warnings) == (1, 0, [])
    old_sha = results.read_rows(first.csv_path)[0]["description_sha"]
    assert old_sha == results.file_sha(net.read_bytes())

    write_net(cfg.models_dir, "tiny", width=8)  # the factory changed: narrower first convolution
    events: list[dict] = []
    again = profile_local(cfg, "local", [net], progress=events.append)
    assert (again.ok, again.already_measured) == (1, 0)
    assert len(again.warnings) == 1 and "'tiny' changed since it was measured" in again.warnings[0]
    assert any(e["event"] == "warning" for e in events)
    rows = results.read_rows(first.csv_path)
    assert [r["description_sha"] for r in rows] == [old_sha, results.file_sha(net.read_bytes())]  # nothing lost
    fresh, stale = current_rows(cfg, "local")
    assert (fresh, stale) == ([rows[1]], [rows[0]])
    assert device_measurements(cfg, "local")[0] == [rows[1]]
    assert "1 row of 1 network (tiny) was measured on an earlier version" in stale_note("local", stale)
    assert "(all measured again since)" in stale_note("local", stale, fresh)
    assert "(1 of them not measured again yet: profile them again)" in stale_note("local", stale, [])
    data = device_dataset(cfg, "local")  # what the fingerprint, export and compare stages read
    assert (data.rows, data.note) == ([rows[1]], stale_note("local", stale, fresh))
    assert list(data.descriptions) == ["tiny"] and data.shas == {"tiny": rows[1]["description_sha"]}
    assert device_measurements(cfg, "local", rows=data.rows)[0] is data.rows  # the stage's rows, not read again
    with first.csv_path.open("a") as fh:  # a line without a timestamp: noted from the same read, first
        fh.write("garbage,line\n")
    assert device_dataset(cfg, "local").note.split("\n") == [
        results.incomplete_note(first.csv_path), stale_note("local", stale, fresh)]
    assert "(line 4: no timestamp, more fields than the header, or a last line cut short)" in \
        results.incomplete_note(first.csv_path)
    assert (profile_local(cfg, "local", [net], progress=False).already_measured) == 1  # and now it resumes

    write_net(cfg.models_dir, "tiny", width=4)  # changed again, not yet measured: nothing current is left
    for given in (None, []):  # none given, or none current (the stage's rows): the file is read to say why
        with pytest.raises(UserError, match="all 2 rows .* earlier versions of their descriptions"):
            device_measurements(cfg, "local", rows=given)


def test_a_device_whose_rows_are_of_another_backend_than_its_config_is_refused(measured, tmp_path, monkeypatch):
    """A device's backend changed in the config (cpu to nvml): its cpu rows counted as measured (a row's key has no
    backend), so it was never measured under nvml. The profile is refused in one line before measuring anything,
    the file kept as it is (here on a simulated GPU, as tests/test_backends_gpu.py runs the nvml backend)."""
    from perf4sight.profiling.fleet import profile_devices

    _, net, first, _ = measured
    path = write_config(tmp_path)
    path.write_text(path.read_text().replace('backend = "cpu"\nmemory_limit_mb = 0\nthreads = 1', 'backend = "nvml"'))
    cfg = load_config(path)
    csv_path = results.results_path(cfg.profiling_dir, "local")
    csv_path.parent.mkdir(parents=True)
    csv_path.write_bytes(first.csv_path.read_bytes())
    monkeypatch.setenv("PYTHONPATH", str(ROOT / "tests" / "fakes"))
    monkeypatch.setenv("P4S_SIM_CUDA_MB", "64")
    n = len(results.read_rows(csv_path))  # 2, or 3 after test_resume_never_duplicates
    with pytest.raises(UserError, match=rf"^device 'local': its {n} rows in {re.escape(str(csv_path))} were measured "
                       "by backend cpu, its config says nvml: profile it under another device name, or move the file "
                       "away$"):
        profile_devices(cfg, ["local"], [net], show_progress=False)
    assert csv_path.read_bytes() == first.csv_path.read_bytes() and not (csv_path.parent / "plan.json").exists()
    with pytest.raises(UserError, match=r"^device 'local': its \d+ rows"):  # named twice: once, not "another run"
        profile_devices(cfg, ["local", "local"], [net], show_progress=False)


def test_rows_of_another_device_in_a_devices_file_are_named(measured, tmp_path):
    """A device's file whose rows name another device (a device renamed, rows copied in) was read as having no
    measurements, or fitted on the rest unsaid: one line names the other device and how many rows say it."""
    from perf4sight.fingerprint.api import device_measurements

    cfg, _, first, _ = measured
    cfg = replace(cfg, root=tmp_path)
    path = results.results_path(cfg.profiling_dir, "local")
    path.parent.mkdir(parents=True)
    text = "".join(first.csv_path.read_text().splitlines(keepends=True)[:3])  # the fixture's run; others append
    path.write_text(text)
    shas = {"tiny": results.read_rows(path)[0]["description_sha"]}  # the descriptions as measured
    assert len(device_measurements(cfg, "local", shas)[0]) == 2
    path.write_text(text.replace("\nlocal,", "\njetson,", 1))
    with pytest.raises(UserError, match=r"measurements.csv: 1 row of 2 names another device than 'local' in their "
                                        r"device column: 'jetson' \(1\);"):
        device_measurements(cfg, "local", shas)


def test_rows_at_another_input_shape_than_their_description_are_set_apart(measured, tmp_path):
    """A description is of one input shape: a row measured at another (a file edited by hand, or merged from another
    run) was fitted and exported as if measured at the description's (held-out step time 108% off), unsaid."""
    from perf4sight.dataset import device_dataset
    from perf4sight.fingerprint.api import fit_device
    from perf4sight.networks.build import write_manifest

    _, _, first, _ = measured
    cfg = load_config(write_config(tmp_path))
    net = write_net(cfg.models_dir, "tiny")
    write_manifest([{"network": "tiny", "family": "tiny", "path": net.name}], cfg.models_dir / "manifest.csv")
    path = results.results_path(cfg.profiling_dir, "local")
    path.parent.mkdir(parents=True)
    text = "".join(first.csv_path.read_text().splitlines(keepends=True)[:3])  # the fixture's run; others append
    assert text.count(",3x32x32,") == 2 and results.file_sha(net.read_bytes()) in text  # the same description
    path.write_text(text.replace(",3x32x32,", ",3x64x64,", 1))
    data = device_dataset(cfg, "local")
    assert [r["batch_size"] for r in data.rows] == ["2"]
    assert ("local: 1 row measured at another input shape than their network's description is passed over (e.g. "
            "tiny at 3x64x64, described at 3x32x32)") in data.note
    path.write_text(text.replace(",3x32x32,", ",3x64x64,"))
    with pytest.raises(UserError, match=r"^device 'local': no measurements to fit: every row was measured at another "
                                        r"input shape than its network's description"):
        fit_device(cfg, "local", data.descriptions)
    import argparse

    from perf4sight import stages
    with pytest.raises(UserError, match=r"^export: device 'local' has no ok measurement to export \(any rows passed "
                                        r"over are named in the note above\)"):  # it said: none had a description
        stages.run_export(cfg, argparse.Namespace(format="perfseer", output=str(tmp_path / "out"), device=["local"]))
    assert not (tmp_path / "out").exists()


def test_a_row_torn_after_its_timestamp_is_measured_again_not_lost(measured, tmp_path):
    """The timestamp is no longer the last column: a row a full disk cut after it read as complete (its key done),
    and the next append cut it off as a torn tail, so that configuration was lost until a further run."""
    _, _, first, _ = measured
    path = tmp_path / "measurements.csv"
    lines = first.csv_path.read_text().splitlines(keepends=True)[:3]
    torn = lines[2][: lines[2].index(results.read_rows(first.csv_path)[1]["description_sha"]) + 4]
    path.write_text(lines[0] + lines[1] + torn)
    incomplete: list[int] = []
    assert [r["batch_size"] for r in results.read_rows(path, incomplete)] == ["1"] and incomplete == [3]
    results.append_row(path, {**results.read_rows(first.csv_path)[1]})  # the configuration measured again
    assert [r["batch_size"] for r in results.read_rows(path)] == ["1", "2"]
    for cut in (lines[2][:-3], lines[2][:-1], lines[2].replace("\n", "\r\n")[:-1]):  # in the last field, before
        path.write_text(lines[0] + lines[1] + cut)                            # its end, between \r and \n
        assert [r["batch_size"] for r in results.read_rows(path)] == ["1"], repr(cut[-12:])
    # a row written by hand without its trailing empty cells is whole (the README asks for a timestamp only)
    path.write_text("device,network,batch_size,status,timestamp,latency_ms_median\nlocal,tiny,2,oom,2026-01-01\n")
    assert [r["status"] for r in results.read_rows(path)] == ["oom"]


def test_rows_measured_at_other_threads_stand_with_a_warning(measured, tmp_path):
    """[devices] threads changed after a sweep (1 -> 2): the rows stand, keyed without their threads, and the runner
    says so; the profile said only "0 new", and the fingerprint then fitted the 1-thread rows as the device's."""
    _, net, first, _ = measured
    cfg = load_config(write_config(tmp_path))
    csv_path = results.results_path(cfg.profiling_dir, "local")
    for row in results.read_rows(first.csv_path)[:2]:  # the fixture's own two rows (other tests add to its file)
        results.append_row(csv_path, row)
    assert [(r["batch_size"], r["threads"], r["status"]) for r in results.read_rows(csv_path)] == [
        ("1", "1", "ok"), ("2", "1", "ok")]
    cfg.devices["local"].threads = 2
    again = profile_local(cfg, "local", [net], progress=False)
    assert (again.ok, again.already_measured) == (0, 2)
    assert again.warnings == ["2 rows of this sweep in measurements.csv were measured at threads = 1, the config's is "
                              "threads = 2: they stand and are not measured again (a row is not keyed by its "
                              "threads); to measure at the new setting, profile it under another device name"]
    cfg.devices["local"].threads = 1  # as measured: nothing to say
    assert not profile_local(cfg, "local", [net], progress=False).warnings
    cfg.devices["local"].threads = 0  # torch's default: a row records the count torch chose, which may be any
    assert not profile_local(cfg, "local", [net], progress=False).warnings


def test_oom_under_memory_limit_skips_larger_batches(measured, tmp_path):
    _, net, first, _ = measured
    peak_b1 = float(results.read_rows(first.csv_path)[0]["peak_rss_mb"])
    # batch 1 fits with 150 MiB to spare; batch 1024 needs ~0.5 GiB more at 32x32 -> oom
    cfg = load_config(write_config(tmp_path, memory_limit_mb=int(peak_b1) + 150, batch_sizes=(1, 1024, 2048)))
    csv_path = results.results_path(cfg.profiling_dir, "local")  # batch 1: the fixture's row, not measured again
    csv_path.parent.mkdir(parents=True)
    csv_path.write_text("".join(first.csv_path.read_text().splitlines(keepends=True)[:2]))
    summary = profile_local(cfg, "local", [net], progress=False)
    assert (summary.already_measured, summary.oom, summary.skipped_after_oom) == (1, 1, 1)
    rows = results.read_rows(summary.csv_path)
    assert [(r["batch_size"], r["status"]) for r in rows] == [("1", "ok"), ("1024", "oom"),
                                                             ("2048", "skipped_after_oom")]
    # the row's peak (ru_maxrss) is at the limit: Linux syncs per-thread RSS counters in batches of up to
    # 64 pages, so the peak may read a little under the VmRSS sample that tripped the watchdog
    assert "memory_limit_mb" in rows[1]["message"] and float(rows[1]["peak_rss_mb"]) > int(peak_b1) + 150 - 2
    # a rerun with a larger batch size measures nothing: the network already ran out of memory
    cfg.profile.batch_sizes = [1, 1024, 2048, 4096]
    again = profile_local(cfg, "local", [net], progress=False)
    assert (again.skipped_after_oom, again.ok, again.oom, again.already_measured) == (1, 0, 0, 3)
    # a lower limit leaves the oom an oom: nothing measured again
    cfg.devices["local"].memory_limit_mb = int(peak_b1) + 100
    lower = profile_local(cfg, "local", [net], progress=False)
    assert (lower.ok, lower.oom, lower.skipped_after_oom, lower.already_measured) == (0, 0, 0, 4) and not lower.warnings
    # no limit now: the step the old one stopped is measured again; the earlier rows stay on disk, passed over
    cfg.devices["local"].memory_limit_mb = 0
    cfg.profile.batch_sizes = [1, 1024]
    cfg.profile.warmup_steps, cfg.profile.timed_steps = 0, 1  # one step of 1024 images (seconds each): it is measured
    raised = profile_local(cfg, "local", [net], progress=False)
    assert (raised.ok, raised.oom, raised.already_measured) == (1, 0, 1)
    assert raised.warnings == [f"network '{net.stem}' ran out of memory at batch size 1024 under memory_limit_mb = "
                               f"{int(peak_b1) + 150} (no limit now): measuring it again from there; the earlier "
                               "rows stay in measurements.csv and are passed over"]
    on_disk = results.read_rows(summary.csv_path)
    assert [(r["batch_size"], r["status"]) for r in on_disk] == [
        ("1", "ok"), ("1024", "oom"), ("2048", "skipped_after_oom"), ("4096", "skipped_after_oom"), ("1024", "ok")]
    assert [(r["batch_size"], r["status"]) for r in results.latest_rows(on_disk)] == [
        ("1", "ok"), ("2048", "skipped_after_oom"), ("4096", "skipped_after_oom"), ("1024", "ok")]
    assert profile_local(cfg, "local", [net], progress=False).already_measured == 2  # and once only


def test_erroring_network_gives_error_rows_and_sweep_continues(tmp_path):
    broken, good = write_broken(tmp_path), write_net(tmp_path, "good", width=4)
    cfg = load_config(write_config(tmp_path))
    summary = profile_local(cfg, "local", [broken, good], progress=False)
    rows = results.read_rows(summary.csv_path)
    got = [(r["network"], r["batch_size"], r["status"]) for r in rows]
    assert got == [("broken", "1", "error"), ("broken", "2", "error"), ("good", "1", "ok"), ("good", "2", "ok")]
    assert "(dropout): attr 'p' must be a number in [0, 1], got 1.5" in rows[0]["message"]
    assert "\n" not in rows[0]["message"]
    assert rows[1]["message"] == rows[0]["message"]  # refused when the runner read it: no child at either size
    assert summary.error == 2 and len(summary.errors) == 2


def test_a_drift_reference_is_measured_around_the_new_measurements_only(measured, tmp_path):
    """``reference_every = 2``: the reference (the plan's first network unless named, at the smallest batch size
    unless given) before the first new measurement, after every second and after the last, and never around a row
    measured before (the module fixture's tiny @ 1, copied in) or on a rerun that measures nothing."""
    a, b = write_net(tmp_path, "tiny"), write_net(tmp_path, "b", width=4)  # tiny: the fixture's description
    cfg = load_config(write_config(tmp_path))
    csv_path = results.results_path(cfg.profiling_dir, "local")
    csv_path.parent.mkdir(parents=True)
    csv_path.write_text("".join(measured[2].csv_path.read_text().splitlines(keepends=True)[:2]))
    cfg.profile.reference_every = 2
    cfg.profile.reference_network, cfg.profile.reference_batch_size = "b", 2
    events: list[dict] = []
    summary = profile_local(cfg, "local", [a, b], progress=events.append)
    assert (summary.ok, summary.already_measured) == (3, 1)
    kinds = [e["event"] for e in events if e["event"] in ("row", "reference")]
    assert kinds == ["reference", "row", "row", "reference", "row", "reference"]
    refs = results.read_rows(results.references_path(cfg.profiling_dir, "local"))
    assert [(r["network"], r["batch_size"], r["status"]) for r in refs] == [("b", "2", "ok")] * 3
    assert all(float(r["latency_ms_median"]) > 0 and r["timestamp"] for r in refs)
    from perf4sight.fingerprint.api import fit_device
    from perf4sight.ir.schema import load_description
    meta = fit_device(cfg, "local", {p.stem: load_description(p) for p in (a, b)})
    drift = meta["drift_reference"]  # every new row lies between two references: each is corrected
    assert drift["applied"] and (drift["network"], drift["batch_size"], drift["measurements"]) == ("b", 2, 3)
    assert drift["rows_corrected"] == 3 and drift["rows_outside_span"] == 1  # the copied row, measured before
    assert profile_local(cfg, "local", [a, b], progress=False).already_measured == 4
    assert len(results.read_rows(results.references_path(cfg.profiling_dir, "local"))) == 3
    cfg.profile.reference_network = "c"
    cfg.profile.batch_sizes = [1, 2, 4]
    with pytest.raises(UserError, match="'reference_network' 'c' is not one of its networks"):
        profile_local(cfg, "local", [a, b], progress=False)
    from perf4sight.profiling.fleet import profile_devices  # the stage names the config's key, before any device
    with pytest.raises(UserError, match=r"config.toml: \[profile\] reference_network 'c' is not one of the "
                                        r"networks to profile \(tiny, b\)"):
        profile_devices(cfg, ["local"], [a, b], show_progress=False)


def test_a_default_drift_reference_skips_batch_1_where_its_network_cannot_train_there(tmp_path):
    """The default reference (the plan's first network at the smallest batch size) was batch 1 of resnet18 at 32x32,
    whose batch norm over a 1x1 map torch refuses in training: every reference an error row, and no drift
    correction. Left to its default, the reference takes the next batch size there; a given one is kept."""
    pooled = nn.Sequential(nn.Conv2d(3, 4, 3), nn.AdaptiveAvgPool2d(1), nn.BatchNorm2d(4), nn.Flatten(),
                           nn.Linear(4, 10))
    one = save_description(describe(pooled, SHAPE, "pooled"), tmp_path / "pooled.json")
    other = write_net(tmp_path, "tiny")
    cfg = load_config(write_config(tmp_path, batch_sizes=(1, 2, 4)))
    cfg.profile.reference_every = 2
    assert make_plan(cfg, "local", [one, other]).reference_batch_size == 2
    assert make_plan(cfg, "local", [other, one]).reference_batch_size == 0  # tiny trains at batch 1: the smallest
    cfg.profile.reference_network = "pooled"
    assert make_plan(cfg, "local", [other, one]).reference_batch_size == 2
    cfg.profile.reference_batch_size = 1  # asked for: as asked (its error row says why)
    assert make_plan(cfg, "local", [other, one]).reference_batch_size == 1


def test_timeout_gives_error_row(tmp_path):
    net = write_net(tmp_path, "slow")
    plan = TestPlan(device="local", networks=[net.name], batch_sizes=[1], timeout_s=0.3, output="m.csv")
    plan_path = save_plan(plan, tmp_path / "plan.json")
    events = run_plan_subprocess(plan_path)
    (row,) = results.read_rows(tmp_path / "m.csv")
    assert row["status"] == "error" and row["message"] == "timed out after 0.3 s"
    assert events[-1] == {"event": "done", "summary": {"ok": 0, "oom": 0, "skipped_after_oom": 0, "error": 1,
                                                       "already_measured": 0}, "wall_s": events[-1]["wall_s"],
                          "csv": str(tmp_path / "m.csv")}


def test_retry_errors_measures_an_error_row_again(tmp_path):
    """A timed-out measurement stays an error on a rerun; with ``retry_errors`` (``--retry-errors``) it is measured
    again: the new row is appended and counts, the error stays in the CSV; a row that ran is never measured again."""
    net = write_net(tmp_path, "slow")
    plan = TestPlan(device="local", networks=[net.name], batch_sizes=[1], timeout_s=0.3, output="m.csv")
    plan_path = save_plan(plan, tmp_path / "plan.json")
    run_plan_subprocess(plan_path)
    assert [r["status"] for r in results.read_rows(tmp_path / "m.csv")] == ["error"]
    assert run_plan_subprocess(plan_path)[-1]["summary"]["already_measured"] == 1  # an error stands by default
    save_plan(TestPlan(**{**plan.to_dict(), "timeout_s": 120.0, "batch_sizes": [1, 2], "retry_errors": True}),
              plan_path)
    summary = run_plan_subprocess(plan_path)[-1]["summary"]  # the error again, and a batch size new to the plan
    assert summary["ok"] == 2 and summary["already_measured"] == 0
    rows = results.read_rows(tmp_path / "m.csv")
    assert [(r["batch_size"], r["status"]) for r in rows] == [("1", "error"), ("1", "ok"), ("2", "ok")]
    assert [r["status"] for r in results.latest_rows(rows)] == ["ok"] * 2
    assert run_plan_subprocess(plan_path)[-1]["summary"]["already_measured"] == 2  # ok rows stand, retry or not


def test_tiny_limit_ooms_at_first_batch_without_spending_the_timeout(tmp_path):
    net = write_net(tmp_path, "tiny")
    plan = TestPlan(device="d", networks=[str(net)], batch_sizes=[1, 2, 4], memory_limit_mb=64, output="m.csv",
                    reference_every=1)
    events: list[dict] = []
    counts = run_plan(save_plan(plan, tmp_path / "plan.json"), emit=events.append)
    assert counts["oom"] == 1 and counts["skipped_after_oom"] == 2
    # a drift reference that fails is said once and not taken again; the sweep goes on
    assert [r["status"] for r in results.read_rows(tmp_path / "references.csv")] == ["oom"]
    said = [e["message"] for e in events if e["event"] == "warning" and "drift reference" in e["message"]]
    assert len(said) == 1 and said[0].startswith("drift reference tiny @ 1: oom")
    # the oom row on disk stops the network on a rerun too
    assert run_plan(tmp_path / "plan.json", emit=lambda e: None)["already_measured"] == 3


def test_device_side_modules_import_no_host_libraries():
    code = ("import sys, perf4sight.profiling.runner, perf4sight.profiling.child, perf4sight.profiling.backends.cpu;"
            "import perf4sight.ir.to_torch;"
            "print(sorted({m.split('.')[0] for m in sys.modules} & {'pandas', 'sklearn', 'torchvision', 'rich'}))")
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"
    light = subprocess.run([sys.executable, "-c",
                            "import sys, perf4sight.profiling.runner; print('torch' in sys.modules)"],
                           cwd=ROOT, capture_output=True, text=True, check=True)
    assert light.stdout.strip() == "False"  # the runner stays small: children inherit its peak RSS


def test_the_profile_stage_on_the_host_imports_no_torch(tmp_path):
    """The host's side of the profile stage (its config checks, the networks-changed note, the fleet) and the
    runner's torch version (for the op prices' freshness) load no torch: seconds saved per run on a small host."""
    import torch
    code = ("import sys; from perf4sight.config import load_config; from perf4sight.stages import run_profile;"
            "from perf4sight.networks.settings import changed_settings_note; import perf4sight.profiling.fleet;"
            "from perf4sight.profiling.runner import torch_version;"
            f"print(changed_settings_note(load_config({str(write_config(tmp_path))!r})), torch_version(),"
            "'torch' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["None", torch.__version__, "False"]


def test_plan_round_trip_and_errors(tmp_path):
    cfg = load_config(write_config(tmp_path, memory_limit_mb=900))
    net = write_net(tmp_path, "n")
    plan = make_plan(cfg, "local", [net], relative_to=tmp_path)
    assert plan.networks == ["n.json"] and plan.memory_limit_mb == 900 and plan.threads == 1
    path = save_plan(plan, tmp_path / "plan.json")
    assert load_plan(path) == plan
    bad = tmp_path / "bad.json"
    for raw, needle in [({"device": "d", "batch_sizes": [4, 2]}, "ascending"),
                        ({"device": "d", "batch": [1]}, "unknown"),
                        ({"device": "d", "timeout_s": "1"}, "wrong type"), ({"batch_sizes": [1]}, "device"),
                        ({"device": "d", "min_timed_s": -1}, "min_timed_s"),
                        ({"device": "d", "repeats": 0}, "repeats")]:
        bad.write_text(json.dumps(raw))
        with pytest.raises(UserError, match=needle):
            load_plan(bad)
    with pytest.raises(UserError, match="not found"):
        make_plan(cfg, "local", [tmp_path / "missing.json"])
    with pytest.raises(UserError, match="unknown device"):
        make_plan(cfg, "nowhere", [net])
    with pytest.raises(UserError, match="unknown backend"):
        get_backend(TestPlan(device="d", backend="tpu"))


def test_duplicate_network_names_are_refused(tmp_path):
    a = write_net(tmp_path, "same")
    b = tmp_path / "copy.json"
    b.write_text(a.read_text())
    plan_path = save_plan(TestPlan(device="d", networks=[str(a), str(b)]), tmp_path / "plan.json")
    with pytest.raises(UserError, match="both named 'same'"):
        run_plan(plan_path, emit=lambda e: None)


def test_latency_stats_and_oom_mapping():
    s = latency_stats([4.0, 1.0, 3.0, 2.0, 5.0])
    assert (s["latency_ms_median"], s["latency_ms_mean"], s["timed_steps"]) == (3.0, 3.0, 5)
    assert s["latency_ms_p10"] == pytest.approx(1.4) and s["latency_ms_p90"] == pytest.approx(4.6)
    assert s["latency_ms_std"] == pytest.approx(2 ** 0.5, abs=1e-4)
    backend = get_backend(TestPlan(device="d"))
    assert backend.is_oom(MemoryError())
    assert backend.is_oom(RuntimeError("[enforce fail at alloc_cpu.cpp:117] DefaultCPUAllocator: "
                                       "can't allocate memory"))
    assert not backend.is_oom(RuntimeError("mat1 and mat2 shapes cannot be multiplied"))


def test_min_timed_s_keeps_timing_until_the_budget_is_spent():
    import time as _time
    backend = get_backend(TestPlan(device="d"))
    calls = []

    def step():
        calls.append(1)
        _time.sleep(0.004)

    row = backend.measure(step, warmup_steps=1, timed_steps=2, min_timed_s=0.06)
    assert row["timed_steps"] == len(calls) - 1 > 2              # more than the 2 asked for
    assert row["latency_ms_mean"] * row["timed_steps"] >= 60      # until the timed steps add up to 60 ms
    assert backend.measure(step, 0, 3)["timed_steps"] == 3        # no budget: exactly timed_steps


def test_repeats_measure_in_fresh_processes_and_keep_the_median_one(tmp_path, monkeypatch):
    """``repeats = 3``: three real children per configuration; the row is the one whose step-time median
    is the middle of the three, with the repeats' spread beside it; an oom in a repeat ends the repeats."""
    from perf4sight.profiling import runner
    net = write_net(tmp_path, "rep", width=4)
    children: list[dict] = []

    def counted(*args, **kwargs):
        outcome = real(*args, **kwargs)
        children.append(dict(outcome.result, peak_rss_mb=outcome.peak_rss_mb))
        return outcome

    real = runner.run_child
    monkeypatch.setattr(runner, "run_child", counted)
    plan = TestPlan(device="d", networks=[str(net)], batch_sizes=[2], repeats=3, warmup_steps=1, timed_steps=3,
                    threads=1, output="m.csv")
    counts = run_plan(save_plan(plan, tmp_path / "plan.json"), emit=lambda e: None)
    (row,) = results.read_rows(tmp_path / "m.csv")
    assert counts["ok"] == 1 and len(children) == 3 and row["repeats"] == "3"
    medians = sorted(c["latency_ms_median"] for c in children)
    assert float(row["latency_ms_median"]) == medians[1]
    middle = next(c for c in children if c["latency_ms_median"] == medians[1])
    assert float(row["peak_rss_mb"]) == middle["peak_rss_mb"]     # every column from that one measurement
    mean = sum(medians) / 3
    cv = 100 * (sum((m - mean) ** 2 for m in medians) / 3) ** 0.5 / mean
    assert float(row["latency_ms_repeat_cv"]) == pytest.approx(cv, abs=1e-3)
    children.clear()
    limited = TestPlan(device="d", networks=[str(net)], batch_sizes=[1], repeats=3, memory_limit_mb=64, output="o.csv")
    run_plan(save_plan(limited, tmp_path / "limited.json"), emit=lambda e: None)
    (oom,) = results.read_rows(tmp_path / "o.csv")
    assert oom["status"] == "oom" and len(children) == 1 and oom["repeats"] == ""


def test_a_csv_with_an_older_column_list_is_upgraded_in_place(tmp_path):
    """Rows written before a column existed keep their values; the file gets today's header, both when
    a row is appended locally and when the host seeds a device's CSV."""
    import csv
    from perf4sight.profiling.pull import csv_with_rows, parse_records
    old_columns = [c for c in results.COLUMNS if c not in ("repeats", "latency_ms_repeat_cv")]
    old = {"device": "d", "network": "n", "batch_size": "1", "input_shape": "3x8x8", "phase": "train",
           "status": "ok", "latency_ms_median": "12.5", "timestamp": "2026-01-01T00:00:00+00:00"}
    path = tmp_path / "m.csv"
    with path.open("w", newline="") as fh:
        writer = csv.DictWriter(fh, fieldnames=old_columns)
        writer.writeheader()
        writer.writerow({k: old.get(k, "") for k in old_columns})
    new = dict(old, batch_size="2", repeats=3, latency_ms_repeat_cv=4.2)
    results.append_row(path, new)
    with path.open(newline="") as fh:
        assert next(csv.reader(fh)) == results.COLUMNS
    rows = results.read_rows(path)
    assert [(r["batch_size"], r["latency_ms_median"], r["repeats"]) for r in rows] == [("1", "12.5", ""),
                                                                                      ("2", "12.5", "3")]
    legacy = tmp_path / "legacy.csv"
    with legacy.open("w", newline="") as fh:
        writer = csv.DictWriter(fh, fieldnames=old_columns)
        writer.writeheader()
        writer.writerow({k: old.get(k, "") for k in old_columns})
    header, seeded = parse_records(csv_with_rows(legacy.read_bytes(), [{k: str(v) for k, v in new.items()}]), None)
    assert header == results.COLUMNS and [r["batch_size"] for r in seeded] == ["1", "2"] and seeded[1]["repeats"] == "3"
    with pytest.raises(ValueError, match="unexpected columns"):
        csv_with_rows(b"device,colour\r\nd,red\r\n", [])
    bad = tmp_path / "bad.csv"
    bad.write_text("device,colour\r\nd,red\r\n")
    with pytest.raises(UserError, match="colour"):
        results.append_row(bad, new)


def test_a_peak_between_two_polls_is_an_oom_all_the_same(tmp_path):
    """The watchdog samples RSS every poll interval; a child whose peak it never saw (here: a watchdog
    that never looks) but whose peak RSS from os.wait4 is over the limit is recorded as oom."""
    from perf4sight.profiling.runner import run_child
    net = write_net(tmp_path, "tiny", width=4)
    plan = TestPlan(device="d", networks=[str(net)], batch_sizes=[1], memory_limit_mb=64, threads=1,
                    warmup_steps=0, timed_steps=1, output="m.csv")
    plan_path = save_plan(plan, tmp_path / "plan.json")
    backend = get_backend(plan)
    backend.watch = lambda pid: None
    outcome = run_child(plan, plan_path, 0, 1, backend)
    assert outcome.result["status"] == "oom" and outcome.peak_rss_mb > 64
    assert outcome.result["message"] == f"peak RSS {outcome.peak_rss_mb:.0f} MiB exceeded memory_limit_mb 64"
    assert float(outcome.result["latency_ms_median"]) > 0      # the step did run: its figures are kept


def test_swap_counters_are_read_from_vmstat(tmp_path):
    import os
    from perf4sight.profiling.procfs import swap_mb
    page_mib = os.sysconf("SC_PAGE_SIZE") / 2**20
    vmstat = tmp_path / "vmstat"
    vmstat.write_text("nr_free_pages 1000\npswpin 2560\npswpout 5120\npgfault 9\n")
    assert swap_mb(str(vmstat)) == (2560 * page_mib, 5120 * page_mib)
    vmstat.write_text("nr_free_pages 1000\n")                  # a kernel without swap accounting
    assert swap_mb(str(vmstat)) is None and swap_mb(str(tmp_path / "absent")) is None
    real = swap_mb()
    assert real is None or min(real) >= 0


@pytest.mark.parametrize("poll_s", [1e9, 0.05])
def test_a_thrashing_step_is_an_oom_and_stops_the_network(tmp_path, monkeypatch, poll_s):
    """On a device that swaps, a step whose memory does not fit thrashes instead of failing. The system's
    swap counters (simulated here: this machine has no swap device; real children run) going up by more
    than max_swap_in_mb make the row ``oom``: judged when the child ends (its figures kept), or while it
    runs (killed at once)."""
    from perf4sight.profiling import runner
    net = write_net(tmp_path, "thrash", width=4)
    counters = {"in": 1000.0, "out": 2000.0, "thrashing": False}

    def fake_swap_mb():
        if counters["thrashing"]:   # every reading sees 150 MiB more swapped in and out
            counters["in"] += 150.0
            counters["out"] += 150.0
        return counters["in"], counters["out"]

    def child(plan, plan_path, index, batch_size, backend):
        counters["thrashing"] = batch_size >= 2
        return real(plan, plan_path, index, batch_size, backend)

    real = runner.run_child
    monkeypatch.setattr(runner, "swap_mb", fake_swap_mb)
    monkeypatch.setattr(runner, "run_child", child)
    monkeypatch.setattr(runner, "SWAP_POLL_S", poll_s)
    plan = TestPlan(device="d", networks=[str(net)], batch_sizes=[1, 2, 4], warmup_steps=1, timed_steps=2,
                    threads=1, output="m.csv")
    counts = run_plan(save_plan(plan, tmp_path / "plan.json"), emit=lambda e: None)
    rows = results.read_rows(tmp_path / "m.csv")
    assert [(r["batch_size"], r["status"]) for r in rows] == [("1", "ok"), ("2", "oom"), ("4", "skipped_after_oom")]
    assert counts["oom"] == 1 and (rows[0]["swap_in_mb"], rows[0]["swap_out_mb"]) == ("0.0", "0.0")
    assert "MiB back in during the measurement (max_swap_in_mb 100)" in rows[1]["message"]
    assert float(rows[1]["swap_in_mb"]) > 100 and float(rows[1]["swap_out_mb"]) > 100
    if poll_s > 1:   # never polled: judged after the child ended, its measured figures kept
        assert not rows[1]["message"].startswith("killed") and float(rows[1]["latency_ms_median"]) > 0
    else:            # seen while it ran: killed
        assert rows[1]["message"].startswith("killed: ") and rows[1]["latency_ms_median"] == ""
    if poll_s > 1:  # the check below runs in the polled case alone: it judges both while the child runs and after
        return
    unchecked = TestPlan(device="d", networks=[str(net)], batch_sizes=[2], max_swap_in_mb=0, warmup_steps=1,
                         timed_steps=2, threads=1, output="off.csv")
    run_plan(save_plan(unchecked, tmp_path / "off.json"), emit=lambda e: None)
    (row,) = results.read_rows(tmp_path / "off.csv")
    assert row["status"] == "ok" and float(row["swap_in_mb"]) > 100   # 0 = no check: recorded, not judged


def test_a_measurement_again_cut_short_resumes_where_it_stopped(tmp_path):
    """An oom of a lower limit measured again at its batch size, then the run killed: the next run takes that new
    row as done and measures the batch sizes the old oom had skipped, as none stands before them now; a limit still
    lower than the old one keeps the old oom and its skipped rows."""
    from perf4sight.profiling.runner import _OnDisk

    def row(bs, status, message="", t="t1"):
        return {"device": "d", "network": "n", "batch_size": bs, "input_shape": "3x8x8", "phase": "train",
                "description_sha": "s", "status": status, "message": message, "timestamp": t}
    path = tmp_path / "m.csv"
    for r in (row(1, "ok"), row(64, "oom", "RSS 990 MiB exceeded memory_limit_mb 900"),
              row(128, "skipped_after_oom"), row(256, "skipped_after_oom"), row(64, "ok", t="t2")):
        results.append_row(path, r)
    done = {k[2] for k in _OnDisk.read(path, "d", [], limit=2000).done}
    assert done == {"1", "64"}  # 128 and 256: measured next
    path.unlink()
    for r in (row(1, "ok"), row(64, "oom", "RSS 990 MiB exceeded memory_limit_mb 900"), row(128, "skipped_after_oom")):
        results.append_row(path, r)
    lower = _OnDisk.read(path, "d", [], limit=500)
    assert {k[2] for k in lower.done} == {"1", "64", "128"} and lower.oom_at == {("n", "3x8x8", "s"): 64}
    raised = _OnDisk.read(path, "d", [], limit=0)
    assert {k[2] for k in raised.done} == {"1"} and raised.again == {("n", "3x8x8", "s"): (64, 900)}


def test_of_two_rows_of_one_measurement_the_later_counts(tmp_path):
    """``latest_rows``: a measurement taken again counts by its new row, the earlier kept on disk; a CSV of the
    fewest columns (no device, no input shape) reads the same way."""
    path = tmp_path / "m.csv"
    path.write_text("network,batch_size,status,timestamp\nn,1,oom,t1\nm,2,ok,t1\nn,1.0,ok,t2\n")
    rows = results.read_rows(path)
    assert [(r["network"], r["status"]) for r in results.latest_rows(rows)] == [("m", "ok"), ("n", "ok")]
    assert len(results.read_rows(path)) == 3


def test_a_bad_measurement_csv_is_one_clear_error(tmp_path):
    """A folder, binary bytes, an unknown status or a batch size that is no positive integer: UserError
    naming the file (and the line), never a traceback; a torn last line is still ignored quietly."""
    good = {"device": "d", "network": "n", "batch_size": "2", "input_shape": "3x8x8", "phase": "train",
            "status": "ok", "latency_ms_median": "1.5", "timestamp": "2026-01-01T00:00:00+00:00"}
    path = tmp_path / "m.csv"
    results.append_row(path, good)
    results.append_row(path, dict(good, batch_size="4", momentum="0.9"))
    assert [r["batch_size"] for r in results.read_rows(path)] == ["2", "4"]
    text = path.read_text()
    for bad, expected in ((text.replace(",4,", ",two,"), "line 3: batch_size 'two' is not a positive integer"),
                          (text.replace(",4,", ",0,"), "line 3: batch_size '0'"),
                          (text.replace(",ok,", ",done,", 1), "line 2: status 'done' is not one of"),
                          # the step's update is read back as numbers by the fingerprint stage (a ValueError there)
                          (text.replace(",0.9,", ",abc,"), "line 3: momentum 'abc' is not a finite number >= 0")):
        path.write_text(bad)
        with pytest.raises(UserError, match=expected):
            results.read_rows(path)
    path.write_bytes(b"\x89PNG\r\n\x1a\n\x00\xff" * 10)
    with pytest.raises(UserError, match="not UTF-8"):
        results.read_rows(path)
    (tmp_path / "folder.csv").mkdir()
    with pytest.raises(UserError, match="is a folder"):
        results.read_rows(tmp_path / "folder.csv")
    path.write_text(text + text.splitlines()[-1][:40])          # a crash cut the last row short
    assert len(results.read_rows(path)) == 2
    assert results.incomplete_note(path).endswith("1 incomplete line (line 4: no timestamp, more fields than the "
                                                  "header, or a last line cut short) passed over; a row cut short is "
                                                  "measured again by the next profile run")
    path.write_text(text.replace("\n", "\ngarbage,line\n", 1))   # a line edited in by hand: said too
    lines: list = []
    assert len(results.read_rows(path, lines)) == 2 and lines == [2]
    assert "2 incomplete lines (lines 2, 4: no timestamp" in results.incomplete_note(path, [2, 4])
    first, *rest = text.splitlines(keepends=True)
    path.write_text(first + rest[0].replace("\n", ",EXTRA\n") + "".join(rest[1:]))  # a field beyond the header
    lines = []
    assert len(results.read_rows(path, lines)) == 1 and lines == [2]
    # a blank line and a stray carriage return are lines of the file too: the number is the line's in an editor
    path.write_bytes(first.encode() + b"\r\n" + rest[0].encode().replace(b",", b",\r", 1) + "".join(rest[1:]).encode())
    lines = []
    assert len(results.read_rows(path, lines)) == 1 and lines == [3, 4]
    path.write_text(text)
    assert results.incomplete_note(path) == "" and results.incomplete_note(tmp_path / "none.csv") == ""
    path.write_bytes(b"\xef\xbb\xbf" + text.encode())  # saved by a spreadsheet as "CSV UTF-8": a byte-order mark
    results.append_row(path, dict(good, batch_size="8"))
    assert [(r["device"], r["batch_size"]) for r in results.read_rows(path)] == [("d", "2"), ("d", "4"), ("d", "8")]


@pytest.mark.parametrize("cell", ["abc", "-50", "nan", "inf", "1e400", "-0.5e-3", "12 ms"])
def test_a_figure_that_is_no_number_is_one_line_naming_file_line_and_column(tmp_path, cell):
    """A number column's cell of a complete row (a step time, a memory figure, the threads, the pruning level...) is
    empty (not measured) or a finite number >= 0: anything else, edited in by hand or damaged, is one line naming the
    file, the line and the column. They read as "not measured" before: the fingerprint and the compare report
    passed the row over, the export wrote nan, each unsaid."""
    path = tmp_path / "m.csv"
    good = {"device": "d", "network": "n", "batch_size": "2", "status": "ok", "latency_ms_median": "1.5",
            "peak_rss_mb": "700", "timestamp": "t"}
    for row in (good, dict(good, batch_size="4"),
                dict(good, batch_size="8", status="oom", latency_ms_median="", peak_rss_mb="")):  # oom: empty figures
        results.append_row(path, row)
    text = path.read_text()
    assert len(results.read_rows(path)) == 3
    # the columns the stages read as numbers (fingerprint, export, compare; results._NUMBER_COLUMNS has every one)
    for column in ("latency_ms_median", "peak_rss_mb", "device_mem_used_mb", "torch_reserved_peak_mb", "gpu_util_pct",
                   "threads", "pruning_level", "momentum", "update_ms_median"):
        path.write_text(text)
        results.append_row(path, dict(good, batch_size="16", **{column: cell}))
        with pytest.raises(UserError) as caught:
            results.read_rows(path)
        assert str(caught.value) == (f"{path}: line 5: {column} '{cell}' is not a finite number >= 0 (an empty cell: "
                                     "not measured)")
    path.write_text(text)
    results.append_row(path, dict(good, batch_size="16", status="error", peak_rss_mb=cell))  # whatever the status
    with pytest.raises(UserError, match=r"line 5: peak_rss_mb"):
        results.read_rows(path)


def test_a_jetson_rows_negative_unified_memory_written_before_reads_as_not_measured(tmp_path):
    """The jetson backend wrote unified memory below its reading before the step as a negative figure until it left
    that cell empty: a device's file holding one was refused whole (every stage, and the runner at its next start);
    the row reads as its backend writes it now. Another backend's negative figure is still refused."""
    path = tmp_path / "m.csv"
    good = {"device": "tx2", "backend": "jetson", "network": "n", "batch_size": "2", "status": "ok",
            "latency_ms_median": "12.5", "device_mem_used_mb": "812.4", "timestamp": "t"}
    results.append_row(path, good)
    results.append_row(path, dict(good, batch_size="4", device_mem_used_mb="-23.6"))
    assert [r["device_mem_used_mb"] for r in results.read_rows(path)] == ["812.4", ""]
    results.append_row(path, dict(good, batch_size="8", backend="nvml", device_mem_used_mb="-23.6"))
    with pytest.raises(UserError, match=r"line 4: device_mem_used_mb '-23.6' is not a finite number >= 0"):
        results.read_rows(path)


def test_a_cell_quoted_in_a_message_stays_on_its_one_line(tmp_path):
    """A status or batch size holding a line break (a quoted field) is quoted escaped, not across two lines."""
    path = tmp_path / "m.csv"
    path.write_text('network,batch_size,status,timestamp\nn,1,"o\nk",t\nn,"2\n",ok,t\n')
    with pytest.raises(UserError) as caught:
        results.read_rows(path)
    assert str(caught.value) == f"{path}: line 3: status 'o\\nk' is not one of ok, oom, skipped_after_oom, error"
    path.write_text('network,batch_size,status,timestamp\nn,"2\nx",ok,t\n')
    with pytest.raises(UserError, match=r"line 3: batch_size '2\\nx' is not a positive integer$"):
        results.read_rows(path)


def test_the_stages_refuse_a_figure_that_is_no_number_with_exit_2(tmp_path):
    """fingerprint and export read a device's rows through one check: a hand-edited figure is exit 2 and one line
    naming the file, the line and the column. The fingerprint passed such a row over with a count, and export wrote
    '-50.0' into its PerfSeer label, which the PerfSeer importer refuses (a time is at least 0)."""
    (tmp_path / "config.toml").write_text('[devices.local]\nbackend = "cpu"\n')
    path = results.results_path(tmp_path / "profiling_csvs", "local")
    good = {"device": "local", "backend": "cpu", "network": "n", "batch_size": "2", "status": "ok",
            "latency_ms_median": "1.5", "peak_rss_mb": "700", "timestamp": "t"}
    results.append_row(path, good)
    results.append_row(path, dict(good, batch_size="4", latency_ms_median="-50"))
    for stage in (["fingerprint"], ["export", "--format", "perfseer", "--output", str(tmp_path / "out")]):
        proc = subprocess.run([sys.executable, str(ROOT / "main.py"), "--config", str(tmp_path / "config.toml"),
                               "--stage", *stage], capture_output=True, text=True, cwd=tmp_path)
        assert proc.returncode == 2 and proc.stderr == (f"error: {path}: line 3: latency_ms_median '-50' is not a "
                                                        "finite number >= 0 (an empty cell: not measured)\n"), proc
    assert not (tmp_path / "out").exists()



def test_rows_measured_under_load_record_it_and_the_profile_stage_notes_them(tmp_path, monkeypatch, capsys):
    """A profile on a busy host (load average 4.6 on 2 cores) read one configuration's step time 3 to 30 times over
    between measurements and said nothing. Each row now records the 1-minute load average as it ended and the
    device's CPU count; the profile stage notes the ok rows measured above the CPU count, and the runner's own
    warnings and messages stay as they were. The load is fixed through PERF4SIGHT_LOAD_AVG, never the machine's."""
    import argparse
    import os

    from perf4sight.networks.build import write_manifest
    from perf4sight.profiling.runner import LOAD_ENV
    from perf4sight.stages import run_profile

    write_net(tmp_path / "models" / "nets", "tiny")
    write_manifest([{"network": "tiny", "family": "tiny", "path": "nets/tiny.json"}],
                   tmp_path / "models" / "manifest.csv")
    args = argparse.Namespace(device=["local"], retry_errors=False)
    monkeypatch.setenv(LOAD_ENV, "0.5")  # a quiet device
    assert run_profile(load_config(write_config(tmp_path, batch_sizes=(1,))), args) == 0
    quiet = capsys.readouterr()
    assert "load average" not in quiet.out + quiet.err
    monkeypatch.setenv(LOAD_ENV, "1000")  # a busy one: beyond any machine's cores
    assert run_profile(load_config(write_config(tmp_path, batch_sizes=(1, 2))), args) == 0
    busy = capsys.readouterr()
    csv_path = results.results_path(tmp_path / "profiling_csvs", "local")
    rows = results.read_rows(csv_path)
    assert [(r["batch_size"], r["status"], r["message"], r["load_avg_1m"], r["cpu_count"]) for r in rows] == [
        ("1", "ok", "", "0.5", str(os.cpu_count())), ("2", "ok", "", "1000.0", str(os.cpu_count()))]
    assert "local: done — 2/2 rows (1 new) [ok 2]\n" in busy.out  # no runner warning: the note is the stage's
    (note,) = [line for line in busy.err.splitlines() if "load average" in line]
    cpus = os.cpu_count()
    assert note == (f"note: local: 1 of 2 ok rows was measured while its 1-minute load average was above "
                    f"{cpus + 0.5:g} (its {cpus} CPU{'s' if cpus > 1 else ''} and half a CPU more; up to 1000, column "
                    "load_avg_1m): "
                    "other work shared its cores, so its step time read high and noisy; to measure it again, run "
                    "--stage profile --device local --remeasure tiny while the device is quiet (the earlier rows move "
                    "to superseded.csv)")


def test_a_csv_from_before_the_load_was_recorded_reads_as_not_measured_under_load(tmp_path):
    """A CSV written before `load_avg_1m` and `cpu_count` existed loads, no row of it counts as measured under
    load, and its next append gives it the columns, empty in its old rows."""
    import csv

    from perf4sight.config import load_config as load
    from perf4sight.stages import _load_note

    old_columns = [c for c in results.COLUMNS if c not in ("load_avg_1m", "cpu_count")]
    old = {"device": "local", "backend": "cpu", "network": "n", "batch_size": "1", "input_shape": "3x8x8",
           "phase": "train", "status": "ok", "latency_ms_median": "12.5", "timestamp": "2026-01-01T00:00:00+00:00"}
    path = results.results_path(tmp_path / "profiling_csvs", "local")
    path.parent.mkdir(parents=True)
    with path.open("w", newline="") as fh:
        writer = csv.DictWriter(fh, fieldnames=old_columns)
        writer.writeheader()
        writer.writerow({k: old.get(k, "") for k in old_columns})
    cfg = load(write_config(tmp_path))
    (row,) = results.read_rows(path)
    assert "load_avg_1m" not in row and not results.under_load(row) and _load_note(cfg, "local", [row]) == ""
    results.append_row(path, dict(old, batch_size="2", load_avg_1m="3.5", cpu_count="2"))
    first, second = results.read_rows(path)
    assert (first["load_avg_1m"], first["cpu_count"], second["load_avg_1m"]) == ("", "", "3.5")
    assert [results.under_load(r) for r in (first, second)] == [False, True]
    # a quiet device measuring on all its cores reads about its count: half a CPU more is other work's
    assert [results.under_load(dict(old, load_avg_1m=load, cpu_count="2")) for load in ("2.0", "2.5", "2.51")] == [
        False, False, True]
    assert _load_note(cfg, "local", [first, second]).startswith(
        "note: local: 1 of 2 ok rows was measured while its 1-minute load average was above 2.5 (its 2 CPUs and half a "
        "CPU more; up to 3.5, column load_avg_1m): other work shared its cores")
    results.append_row(path, dict(old, batch_size="4", load_avg_1m="-1"))
    with pytest.raises(UserError, match=r"line 4: load_avg_1m '-1' is not a finite number >= 0"):
        results.read_rows(path)


def test_the_load_note_of_an_ssh_gpu_device_names_its_own_csv_and_says_may(tmp_path):
    """The note of an SSH device's rows names the --remeasure that measures them again (it takes them off the
    device's own CSV too; the note named both files to delete them from); on a GPU the host's load slows only the
    launches: its step times may read high."""
    from perf4sight.config import load_config as load
    from perf4sight.stages import _load_note

    (tmp_path / "config.toml").write_text('[devices.gpu]\nbackend = "nvml"\nhost = "gpu1.lab"\nworkdir = "/data/p4s"\n')
    cfg = load(tmp_path / "config.toml")
    row = {"device": "gpu", "backend": "nvml", "network": "resnet18", "status": "ok", "load_avg_1m": "17.2",
           "cpu_count": "16"}
    rows = [row, dict(row, load_avg_1m="16.4"), dict(row, status="oom", load_avg_1m="40"), dict(row, cpu_count="")]
    assert _load_note(cfg, "gpu", rows, fitting=True) == (
        "note: gpu: 1 of 3 ok rows was measured while its 1-minute load average was above 16.5 (its 16 CPUs and half "
        "a CPU more; up to 17.2, column load_avg_1m): other work shared the CPU cores that launch its kernels, so its "
        "step time may read high and noisy, and the fingerprint fits it; to measure it again, run --stage profile "
        "--device gpu --remeasure resnet18 while the device is quiet (the earlier rows move to superseded.csv)")
    assert _load_note(cfg, "gpu", rows[1:]) == ""  # within half a CPU of the count; an oom's time is no figure
    imported = _load_note(cfg, "exported-gpu", [dict(row, device="exported-gpu")])  # no [devices] table to profile
    assert imported.endswith("so its step time may read high and noisy; to measure it again, rerun it on a quiet "
                             "device (no [devices.exported-gpu] table here to profile it)")


def test_progress_on_a_stderr_that_is_no_terminal_is_a_line_per_event():
    """Profiling with stderr to a file (nohup, CI, ``2> log``) wrote nothing until the stage ended, rich drawing its
    bars once then: a run of hours said nothing of how far it was, nor of an SSH device reconnecting. Each event whose
    note changed is now a line naming its device (the rows an earlier run measured are not: a rerun of a campaign
    would list them all)."""
    from perf4sight.profiling.fleet import ProgressLog

    log = ProgressLog()
    said = [log.line("tx2", 3, 24, "last: resnet18_l0 @ 4 ok"), log.line("tx2", 3, 24, "last: resnet18_l0 @ 4 ok"),
            log.line("box", -1, 24, "reconnecting"), log.line("box", -1, 24, "reconnecting"),
            log.line("local", 5, 30, "last: gen_0_0 @ 8 measured before"), log.line("local", 6, 30, ""),
            log.line("box", 9, 24, "last: gen_0_1 @ 2 oom"), log.line("local", -1, 0, "waiting: one after another")]
    assert said == ["tx2: 3/24 last: resnet18_l0 @ 4 ok", None, "box: reconnecting", None, None, None,
                    "box: 9/24 last: gen_0_1 @ 2 oom", "local: waiting: one after another"]


def test_a_local_gpu_device_is_probed_before_its_run_as_an_ssh_one_is(tmp_path):
    """An SSH device is probed before its run (torch, the backend's library, CUDA seen) and refused in one line; a
    device of this machine was not: a jetson device off a Jetson (no jtop, no CUDA) or an nvml one without a GPU
    started the runner, and every child failed its setup, an error row per configuration that a plain rerun after
    the fix does not measure again. A local device of a GPU backend is now probed first, with the same words."""
    import platform

    import torch

    from perf4sight.profiling import probe
    from perf4sight.profiling.fleet import profile_devices

    net = write_net(tmp_path, "tiny")
    path = write_config(tmp_path)
    path.write_text(path.read_text().replace('backend = "cpu"\nmemory_limit_mb = 0\nthreads = 1', 'backend = "jetson"'))
    cfg = load_config(path)
    csv_path = results.results_path(cfg.profiling_dir, "local")
    csv_path.parent.mkdir(parents=True)
    # torch's facts as the probe keeps them (CUDA seen), so that this probe does not spend seconds importing torch
    key = [sys.executable, platform.python_version(), probe.install_identity("torch")]
    (csv_path.parent / "probe-cache.json").write_text(json.dumps({"key": key, "torch": torch.__version__,
                                                                  "cuda": True}))
    [summary] = profile_devices(cfg, ["local"], [net], show_progress=False)
    assert summary.status == "failed" and summary.new_rows == 0 and not csv_path.exists()
    assert summary.message == ("device 'local' is not ready, nothing was run: jtop not importable "
                               f"(ModuleNotFoundError: No module named 'jtop') (python '{sys.executable}'; see "
                               "--stage check)")
