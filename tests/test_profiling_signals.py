"""The profile stage on the cpu backend, its second half (test_profiling.py holds the first; a file goes to one
worker of ``pytest -n 2 --dist loadfile``, and the two halves run side by side): signals and interrupts, runners'
locks and scratch files, full disks and children that cannot write, killed children, a machine without paramiko.
"""
from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from dataclasses import replace
from pathlib import Path

import pytest
import torch.nn as nn

from perf4sight.config import load_config
from perf4sight.errors import UserError
from perf4sight.ir.from_torch import describe
from perf4sight.ir.schema import load_description, save_description
from perf4sight.profiling import results
from perf4sight.profiling.backends.base import get_backend
from perf4sight.profiling.plan import TestPlan, load_plan, save_plan
from perf4sight.profiling.runner import run_plan

sys.path.insert(0, str(Path(__file__).parent))
from test_profiling import ROOT, SHAPE, tiny, write_config, write_net  # noqa: E402


def _alive_with(text: str) -> list[int]:
    """Pids of live processes whose command line contains ``text``."""
    pids = []
    for proc in Path("/proc").iterdir():
        try:
            if proc.name.isdigit() and text in (proc / "cmdline").read_bytes().replace(b"\0", b" ").decode():
                pids.append(int(proc.name))
        except OSError:
            continue
    return pids


def test_sigterm_to_the_cli_alone_stops_runner_and_child_and_a_rerun_resumes(tmp_path):
    """`kill PID` of main.py (not its process group): the runner and the measuring child stop with it
    within seconds, the rows written stay, and a rerun measures only what is missing."""
    import signal

    from perf4sight.networks.build import write_manifest

    cfg = load_config(write_config(tmp_path, batch_sizes=(1, 2)))  # the signal comes while the second is measured
    net = write_net(cfg.models_dir, "tiny")
    write_manifest([{"network": "tiny", "family": "tiny", "path": net.name}], cfg.models_dir / "manifest.csv")
    csv_path = results.results_path(cfg.profiling_dir, "local")
    cmd = [sys.executable, str(ROOT / "main.py"), "--config", str(cfg.path), "--stage", "profile"]
    proc = subprocess.Popen(cmd, cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True)  # its own group: the signal reaches main.py only
    deadline = time.monotonic() + 120
    while not (csv_path.is_file() and results.read_rows(csv_path)) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert csv_path.is_file(), "no row was written"
    proc.send_signal(signal.SIGTERM)
    sent = time.monotonic()
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 130 and time.monotonic() - sent < 20
    assert err.strip().splitlines()[-1] == "interrupted: measurements taken so far are on disk; rerun to resume"
    time.sleep(0.5)
    assert _alive_with(str(cfg.profiling_dir)) == [], "the runner or its child outlived the CLI"
    kept = results.read_rows(csv_path)
    assert len(kept) == 1 and all(r["status"] == "ok" for r in kept)
    again = subprocess.run(cmd, cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert again.returncode == 0, again.stderr[-2000:]
    rows = results.read_rows(csv_path)
    assert [r["batch_size"] for r in rows] == ["1", "2"] and rows[:len(kept)] == kept


def test_an_interrupt_while_a_child_starts_stops_that_child_too(tmp_path, monkeypatch):
    """A SIGTERM that lands inside ``subprocess.Popen`` (after its fork) raised there: the runner stopped and
    the child it had just started went on measuring alone (the SIGTERM test above caught it now and then: a
    row is written just before the next child starts). The signal is now held until the child can be killed."""
    import signal

    from perf4sight.profiling import runner
    net = write_net(tmp_path, "tiny")
    plan = TestPlan(device="d", networks=[str(net)], batch_sizes=[1], output="m.csv")
    plan_path = save_plan(plan, tmp_path / "plan.json")
    started: list[subprocess.Popen] = []
    real_popen = subprocess.Popen

    def popen_then_sigterm(*args, **kwargs):
        proc = real_popen(*args, **kwargs)
        started.append(proc)
        os.kill(os.getpid(), signal.SIGTERM)  # as if it had come at the end of Popen
        return proc

    handlers = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM)}
    signal.signal(signal.SIGTERM, runner._interrupt)  # what the runner's main() installs
    monkeypatch.setattr(subprocess, "Popen", popen_then_sigterm)
    try:
        with pytest.raises(KeyboardInterrupt):
            runner.run_child(plan, plan_path, 0, 1, get_backend(plan))
        (child,) = started
        assert child.returncode == -signal.SIGKILL, "the child outlived the interrupted runner"
    finally:
        for proc in started:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
        for s, handler in handlers.items():
            signal.signal(s, handler)


def test_a_runners_lock_is_its_own_not_its_childrens(tmp_path):
    """Another process's runner lock on a CSV refuses a second runner in one line; once that process is killed the
    lock is free at once, even while a child it forked (and never exec'd, as in the moment between a fork and its
    exec) lives on with a copy of the lock file's descriptor."""
    import signal

    from perf4sight.profiling import runner
    csv_path = tmp_path / "m.csv"
    holder = subprocess.Popen([sys.executable, "-c", (
        "import os, sys, time; from pathlib import Path; from perf4sight.profiling import runner\n"
        f"with runner._locked(Path({str(csv_path)!r})):\n"
        "    child = os.fork()\n"
        "    if child == 0:\n"
        "        time.sleep(60); os._exit(0)\n"
        "    print(child, flush=True); time.sleep(60)\n")],
        stdout=subprocess.PIPE, text=True, env={**os.environ, "PYTHONPATH": str(ROOT)})
    child = int(holder.stdout.readline())
    try:
        # the holder named (a runner its killed profile left, which stops after its measurement: said so); it was
        # "another runner is writing this file" alone, with no way to tell which process or whether it would end
        with pytest.raises(UserError, match=rf"m.csv: another runner is writing this file \(pid {holder.pid}: a "
                                            r"profile going on, or a runner left by one that was killed, which stops "
                                            r"after its current measurement: rerun once it is gone\)$"):
            with runner._locked(csv_path):
                pass
        holder.kill()
        holder.wait()
        os.kill(child, 0)  # the forked child still lives, holding the descriptor
        with runner._locked(csv_path):
            pass
    finally:
        holder.kill()
        holder.wait()
        os.kill(child, signal.SIGKILL)


def test_a_killed_runners_scratch_files_are_removed_by_the_next_run(tmp_path):
    """A runner killed with SIGKILL (no cleanup runs) leaves its measuring child's folder beside the CSV, not in the
    system's temp folder; the next runner of that CSV removes it, and a run that ends leaves no such folder. Its
    children measure the plan it started with, though the plan file is replaced while it runs, and the descriptions
    whose sha its rows record, though a networks stage rewrites one meanwhile (its child read the new file: an error
    row here, of the old file's sha)."""
    import signal

    from perf4sight.profiling import runner
    net = write_net(tmp_path, "tiny")
    plan = TestPlan(device="d", networks=[str(net)], batch_sizes=[1], warmup_steps=1, timed_steps=50,
                    output="m.csv")
    plan_path = save_plan(plan, tmp_path / "plan.json")
    scratch = runner.children_dir(tmp_path / "m.csv")
    proc = subprocess.Popen([sys.executable, "-m", "perf4sight.profiling.runner", str(plan_path)], cwd=tmp_path,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True,
                            env={**os.environ, "PYTHONPATH": str(ROOT)})
    deadline = time.monotonic() + 60
    while not list(scratch.glob("child-*")) and time.monotonic() < deadline:
        time.sleep(0.05)
    os.killpg(proc.pid, signal.SIGKILL)  # the runner and its measuring child, mid-measurement
    proc.wait()
    assert [p.name[:6] for p in scratch.glob("child-*")] == ["child-"], "no child folder was left to remove"

    sha = results.file_sha(net.read_bytes())

    def another_invocation(event: dict) -> None:  # a second profile, refused by the lock, writes its plan all the same
        if event["event"] == "plan":
            save_plan(replace(plan, networks=[str(write_net(tmp_path, "other", width=64))], timed_steps=3), plan_path)
            rewritten = describe(tiny("tiny"), SHAPE, "tiny")  # a networks stage's new file of that name: its step
            rewritten.num_classes = 1_000_000  # fails (labels of a million classes for ten outputs)
            save_description(rewritten, net)
    counts = runner.run_plan(plan_path, emit=another_invocation)
    assert counts["ok"] + counts["already_measured"] == 1 and not scratch.exists()
    rows = results.read_rows(tmp_path / "m.csv")
    assert {r["timed_steps"] for r in rows} == {"50"}  # the run's own plan
    assert [(r["status"], r["description_sha"]) for r in rows] == [("ok", sha)]  # the description its row names


def test_fleet_summary_counts_earlier_rows_and_error_rows_are_retried_when_asked(tmp_path):
    """The profile stage's line for a local device counts every row of the plan by status (as for a remote
    one), so a rerun that measures nothing still shows the error rows, and says how to retry them; with
    ``retry_errors`` they are measured again."""
    from perf4sight.profiling.fleet import format_summaries, profile_devices

    broken = write_net(tmp_path, "broken")
    cfg = load_config(write_config(tmp_path))
    cfg.profile.timeout_s = 0.3  # an error at each batch size, before the child has imported torch (seconds of CPU)
    (first,) = profile_devices(cfg, ["local"], [broken], show_progress=False)
    (again,) = profile_devices(cfg, ["local"], [broken], show_progress=False)
    assert (first.new_rows, again.new_rows) == (2, 0)
    assert first.counts["error"] == again.counts["error"] == 2
    line = format_summaries([again])
    assert "2/2 rows (0 new)" in line and "error 2" in line and "not measured again unless asked: --retry-errors" \
        in line
    cfg.profile.retry_errors = True  # what --stage profile --retry-errors sets for its run
    (retried,) = profile_devices(cfg, ["local"], [broken], show_progress=False)
    assert retried.new_rows == 2 and retried.counts["error"] == 2 and retried.rows == 2  # the newest row per key
    line = format_summaries([retried])  # it said to pass --retry-errors to the run given it
    assert "error 2] (error rows measured again, as --retry-errors asked)" in line and "unless asked" not in line
    assert len(results.read_rows(results.results_path(cfg.profiling_dir, "local"))) == 4  # the old ones stay


def test_a_profile_with_its_stderr_in_a_file_writes_lines_and_no_bar(tmp_path, capsys):
    """With stderr no terminal (``2> log``, CI) the progress is a line per row; rich drew its bar as well when the
    stage ended: a line of box characters in the log after the rows' lines."""
    from perf4sight.profiling.fleet import profile_devices

    broken = write_net(tmp_path, "broken")
    cfg = load_config(write_config(tmp_path))
    cfg.profile.timeout_s = 0.3  # an error at each batch size, before the child has imported torch (seconds of CPU)
    profile_devices(cfg, ["local"], [broken], show_progress=True)
    err = capsys.readouterr().err
    assert "local: 1/2 last: broken @ 1 error" in err and "local: 2/2 last: broken @ 2 error" in err
    assert "━" not in err and "\n\n" not in err, err  # no bar, nor an empty line for it


def test_a_runner_that_stops_early_is_summarised_with_the_rows_it_left(tmp_path, monkeypatch):
    """A runner that died after writing rows (the disk filled up) was summarised as "failed — 0/0 rows": the
    line now counts the plan's rows on disk."""
    import perf4sight.profiling.local as local
    from perf4sight.errors import UserError
    from perf4sight.profiling.fleet import format_summaries, profile_devices

    broken = write_net(tmp_path, "broken")
    cfg = load_config(write_config(tmp_path))
    cfg.profile.timeout_s = 0.3  # an error at each batch size, before the child has imported torch (seconds of CPU)
    real = local.profile_local

    def stops_early(*args, **kwargs):
        real(*args, **kwargs)  # a real run writes its rows, then the runner "fails"
        raise UserError("the profiling runner stopped early: OSError: [Errno 28] No space left on device")

    monkeypatch.setattr(local, "profile_local", stops_early)
    (summary,) = profile_devices(cfg, ["local"], [broken], show_progress=False)
    assert summary.status == "failed" and (summary.rows, summary.expected) == (2, 2)
    assert format_summaries([summary]).startswith("local: failed — 2/2 rows (2 new) [error 2] (error rows are not "
                                                  "measured again unless asked")  # it said 0 new: both were


def test_a_malformed_description_stops_the_profile_before_any_row(tmp_path):
    """A description file that is not valid JSON became an `error` row on every device, never retried, and the
    stage exited 0: it is the user's to fix, one line and exit 2, nothing measured."""
    from perf4sight.profiling.fleet import profile_devices

    cfg = load_config(write_config(tmp_path))
    good = write_net(tmp_path, "tiny")
    (tmp_path / "cut.json").write_text(good.read_text()[:40])
    with pytest.raises(UserError, match=r"cut\.json.*not valid JSON"):
        profile_devices(cfg, ["local"], [good, tmp_path / "cut.json"], show_progress=False)
    assert not results.results_path(cfg.profiling_dir, "local").exists()


def test_a_device_profiled_by_another_run_is_refused_and_a_killed_runs_lock_is_free(tmp_path):
    """Two profile runs of one SSH device at once each pulled its rows into one CSV: 24 rows of 12 keys. While one
    run profiles a device (here: waiting on an SSH server that never answers), a second naming it is refused in one
    line naming the first, exit 2, nothing measured for any of its devices; once the first is killed, the device's
    lock is free at once."""
    import signal
    import socket

    from perf4sight.networks.build import write_manifest

    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(4)
    server.settimeout(60)
    path = write_config(tmp_path)
    path.write_text(path.read_text() + f'\n[devices.box]\nbackend = "cpu"\nhost = "127.0.0.1"\n'
                    f'port = {server.getsockname()[1]}\nknown_hosts = "kh"\naccept_new_host_key = true\n')
    cfg = load_config(path)
    net = write_net(cfg.models_dir, "tiny")
    write_manifest([{"network": "tiny", "family": "tiny", "path": net.name}], cfg.models_dir / "manifest.csv")
    cmd = [sys.executable, str(ROOT / "main.py"), "--config", str(path), "--stage", "profile", "--device"]
    first = subprocess.Popen(cmd + ["box"], cwd=tmp_path, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        conn, _ = server.accept()  # the first run is connecting to box, and waits for a banner that never comes
        second = subprocess.run(cmd + ["local", "box"], cwd=tmp_path, capture_output=True, text=True, timeout=120)
        assert second.returncode == 2 and len(second.stderr.strip().splitlines()) == 1, second.stderr[-2000:]
        assert f"device 'box' is being profiled by another run on this machine (pid {first.pid}, since " \
            in second.stderr and "this run did nothing" in second.stderr
        assert not results.results_path(cfg.profiling_dir, "local").exists()
        assert not (cfg.profiling_dir / "local" / "plan.json").exists()
        first.send_signal(signal.SIGKILL)
        first.wait()
        conn.close()
        from perf4sight.profiling.fleet import device_lock
        with device_lock(cfg.profiling_dir, "box"):  # a killed run leaves no stale lock
            pass
    finally:
        first.kill()
        first.wait()
        server.close()


def test_devices_of_this_machine_take_turns(tmp_path):
    """Two local devices profiled side by side shared the cores and slowed each other's steps down (up to 2.5x
    in a review): they are measured one after the other, so one device's rows all precede the other's."""
    from perf4sight.profiling.fleet import profile_devices

    path = write_config(tmp_path)
    path.write_text(path.read_text() + '\n[devices.local2]\nbackend = "cpu"\nthreads = 1\n')
    cfg = load_config(path)
    nets = [write_net(tmp_path, "a", 8)]  # two rows each (batch sizes 1, 2): side by side, they would interleave
    summaries = profile_devices(cfg, ["local", "local2"], nets, show_progress=False)
    assert [s.new_rows for s in summaries] == [2, 2], [s.message for s in summaries]
    times = {d: sorted(r["timestamp"] for r in results.read_rows(results.results_path(cfg.profiling_dir, d)))
             for d in ("local", "local2")}
    first, second = sorted(times.values())
    assert first[-1] <= second[0], times  # seconds resolution: a shared second is allowed, an overlap is not


def test_a_runner_started_after_an_interrupt_is_stopped_at_once():
    """The interrupt can land while a device's thread is still writing its plan: the runner it starts
    afterwards sees the cancel event and is stopped, instead of running its whole plan."""
    import threading

    from perf4sight.profiling.local import follow_runner

    cancel = threading.Event()
    cancel.set()
    slow = [sys.executable, "-c", "import time; print('{\"event\": \"plan\"}', flush=True); time.sleep(60)"]
    started = time.monotonic()
    with pytest.raises(UserError, match="stopped early"):
        follow_runner(slow, lambda event: None, cancel=cancel)
    assert time.monotonic() - started < 15


def test_stale_rule_spares_imported_rows_and_import_keys_ignore_the_sha():
    """An imported row's description came with it (an older importer hashed it differently): it is never
    stale, and an import dedups on the measurement alone, so importing again adds nothing."""
    base = {"device": "d", "network": "n", "batch_size": "8", "input_shape": "3x32x32", "phase": "train"}
    mine, imported = {**base, "backend": "cpu", "description_sha": "old"}, {**base, "backend": "imported",
                                                                            "description_sha": "old"}
    assert results.split_stale([mine, imported], {"n": "new"}) == ([imported], [mine])
    assert results.row_key(mine) != results.row_key({**mine, "description_sha": "new"})
    assert results.row_key(mine, with_sha=False) == results.row_key({**mine, "description_sha": "new"}, with_sha=False)
    assert results.measured_keys([mine], with_sha=False) == {results.row_key(imported, with_sha=False)}


def test_measurement_csv_with_another_separator_is_named_not_read_as_empty(tmp_path):
    """A CSV saved with ';' by a spreadsheet read as "no measurements"; now the file and the missing columns."""
    path = tmp_path / "measurements.csv"
    path.write_text("device;network;batch_size;status\nlocal;tiny;2;ok\n")
    with pytest.raises(UserError, match=r"header lacks network, batch_size, status, timestamp \(comma-separated"):
        results.read_rows(path)
    # a hand-written file without the timestamp column: every row was passed over as cut short, unsaid at the end
    path.write_text("device,network,batch_size,status\nlocal,tiny,2,ok\n")
    with pytest.raises(UserError, match=r"header lacks timestamp \(.*a row's timestamp, any text, marks it complete"):
        results.read_rows(path)
    path.write_text("")  # an empty file is no rows, not an error
    assert results.read_rows(path) == []


def test_batch_norm_on_a_1x1_map_at_batch_1_is_explained(tmp_path, capsys):
    """A network whose batch norm sees a 1x1 map cannot train on one image: the error row says so."""
    from perf4sight.profiling.child import measure
    net = nn.Sequential(nn.Conv2d(3, 4, 3, stride=32), nn.BatchNorm2d(4), nn.Flatten(), nn.Linear(4, 10))
    path = save_description(describe(net, SHAPE, "pointwise"), tmp_path / "pointwise.json")
    plan_path = save_plan(TestPlan(device="d", networks=[str(path)], batch_sizes=[1, 2], warmup_steps=0,
                                   timed_steps=1), tmp_path / "plan.json")
    one = measure(plan_path, 0, 1)
    assert one["status"] == "error" and one["stage"] == "step"
    assert one["message"].startswith("ValueError: batch norm over a 1x1 map cannot train on a batch of 1")
    assert measure(plan_path, 0, 2)["status"] == "ok"  # two images: two values per channel
    from perf4sight.stages import _one_image_note  # and predict says so at batch 1, whatever the memory
    _one_image_note([load_description(path)], [1, 2])
    assert "batch 1 does not train pointwise at all: a batch norm over a 1x1 map" in capsys.readouterr().err
    _one_image_note([load_description(path)], [1, 2], ["pointwise"])  # predicted to fit at batch 1: told apart
    assert "pointwise: predicted to fit in memory at batch 1 ('fits' answers memory alone), but a training step at " \
        "batch 1 fails" in capsys.readouterr().err
    _one_image_note([load_description(path)], [2, 4])
    assert capsys.readouterr().err == ""


def test_a_network_frozen_whole_says_that_nothing_trains(tmp_path):
    """A description of a network every layer of which is frozen (``frozen_layers``) is rebuilt frozen: its step has
    no backward, and the error row says why in plain words (it was trained whole before, as if not frozen)."""
    from perf4sight.profiling.child import measure
    net = nn.Sequential(nn.Conv2d(3, 4, 3), nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(4, 10))
    net.requires_grad_(False)
    path = save_description(describe(net, SHAPE, "still"), tmp_path / "still.json")
    plan_path = save_plan(TestPlan(device="d", networks=[str(path)], batch_sizes=[2], warmup_steps=0,
                                   timed_steps=1), tmp_path / "plan.json")
    row = measure(plan_path, 0, 2)
    assert row["status"] == "error" and row["stage"] == "step"
    assert row["message"].startswith("RuntimeError: no parameter of the network trains (none, or every one frozen: "
                                     "its description's frozen_layers)")


def test_a_segmentation_network_trains_on_a_class_per_pixel(tmp_path):
    """A network whose output scores every pixel ([classes, H, W]) is measured on a label per pixel."""
    from perf4sight.profiling.child import measure
    net = nn.Sequential(nn.Conv2d(3, 4, 3, stride=2, padding=1), nn.ReLU(), nn.Conv2d(4, 5, 1),
                        nn.Upsample(scale_factor=2, mode="bilinear"))
    path = save_description(describe(net, SHAPE, "seg"), tmp_path / "seg.json")
    plan_path = save_plan(TestPlan(device="d", networks=[str(path)], batch_sizes=[2], warmup_steps=0,
                                   timed_steps=1), tmp_path / "plan.json")
    row = measure(plan_path, 0, 2)
    assert row["status"] == "ok" and row["latency_ms_median"] > 0, row.get("message")


def test_oom_rows_the_memory_limit_caused_are_explained(tmp_path):
    """A limit typed too low makes every network oom at its smallest batch size: the profile and fingerprint
    stages say which rows the limit caused, and which a higher limit set since has yet to measure again (a lower
    one leaves an oom an oom: nothing to say)."""
    from perf4sight.config import load_config
    from perf4sight.stages import _limit_note

    def oom(net, b, limit, rss=118):
        return {"network": net, "batch_size": str(b), "status": "oom",
                "message": f"RSS {rss} MiB exceeded memory_limit_mb {limit}"}

    def skipped(net, b):
        return {"network": net, "batch_size": str(b), "status": "skipped_after_oom", "message": ""}

    (tmp_path / "c.toml").write_text('[devices.local]\nbackend = "cpu"\nmemory_limit_mb = 100\n')
    cfg = load_config(tmp_path / "c.toml")
    rows = [oom("a", 1, 100), skipped("a", 2), oom("b", 1, 100, 130), skipped("b", 2)]
    assert _limit_note(cfg, "local", rows).startswith(
        "note: local: every network ran out of memory at its smallest batch size under memory_limit_mb = 100 "
        "(RSS up to 130 MiB)")
    ok_a = {"network": "a", "batch_size": "1", "status": "ok", "message": ""}
    assert _limit_note(cfg, "local", [ok_a, oom("a", 2, 100, 990), oom("b", 1, 100)]) == ""  # a trained: no typo
    cfg.devices["local"].memory_limit_mb = 900
    assert _limit_note(cfg, "local", rows).startswith(
        "note: local: 2 oom rows (a, b) were recorded under memory_limit_mb = 100, below the 900 set now: --stage "
        "profile measures them again, with the batch sizes skipped after, and passes over the earlier rows")
    assert _limit_note(cfg, "local", [ok_a, oom("a", 2, 900, 990)]) == ""  # the limit set now: nothing to say
    assert _limit_note(cfg, "local", [ok_a, oom("a", 2, 1000, 990)]) == ""  # over 1000 MiB is over 900 too
    cfg.devices["local"].memory_limit_mb = 0
    assert "was recorded under memory_limit_mb = 1000, none set now: --stage profile measures it again" in \
        _limit_note(cfg, "local", [ok_a, oom("a", 2, 1000, 990)])


def test_a_runner_that_cannot_write_says_so_in_its_error_event(tmp_path, monkeypatch, capsys):
    """A full disk made the runner die with a traceback whose last line was all the profile stage showed:
    now one error event says what failed, and that the rows written before are kept (the second row's write
    fails here, as ENOSPC would)."""
    from perf4sight.profiling import runner

    net = write_net(tmp_path, "tiny")
    plan_path = save_plan(TestPlan(device="d", networks=[str(net)], batch_sizes=[1, 2], output="m.csv"),
                          tmp_path / "plan.json")
    real, calls = results.append_row, []

    def fills_up(path, row):
        calls.append(path)
        if len(calls) > 1:
            raise OSError(28, "No space left on device")
        return real(path, row)

    monkeypatch.setattr(results, "append_row", fills_up)
    assert runner.main([str(plan_path)]) == 1
    events = [json.loads(line) for line in capsys.readouterr().out.splitlines() if line.startswith("{")]
    assert events[-1] == {"event": "error",
                          "message": "OSError (No space left on device): rows already written are kept; free some "
                                     "space and rerun to measure the rest"}
    assert len(results.read_rows(tmp_path / "m.csv")) == 1


#: Runs main.py with its arguments after this line, every import of paramiko refused.
_WITHOUT_PARAMIKO = """
import os, runpy, sys
class Refuse:
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] == "paramiko":
            raise ImportError("paramiko refused by the test")
sys.meta_path.insert(0, Refuse())
sys.argv = sys.argv[1:]
sys.path.insert(0, os.path.dirname(sys.argv[0]))
runpy.run_path(sys.argv[0], run_name="__main__")
"""


def test_this_machines_device_is_profiled_without_the_ssh_library(tmp_path):
    """A GPU machine that runs the profile stage for its own device (no host) needs torch and its backend's library,
    not paramiko: the stage measures, and paramiko was never imported. A device with a host still needs it."""
    from perf4sight.networks.build import write_manifest

    cfg = load_config(write_config(tmp_path, batch_sizes=(1,)))
    net = write_net(cfg.models_dir, "tiny")
    write_manifest([{"network": "tiny", "family": "tiny", "path": net.name}], cfg.models_dir / "manifest.csv")
    run = subprocess.run([sys.executable, "-c", _WITHOUT_PARAMIKO, str(ROOT / "main.py"), "--config", str(cfg.path),
                          "--stage", "profile"], cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert run.returncode == 0 and "1/1 rows (1 new) [ok 1]" in run.stdout, run.stdout[-2000:] + run.stderr[-2000:]
    assert [r["status"] for r in results.read_rows(results.results_path(cfg.profiling_dir, "local"))] == ["ok"]
    with_host = cfg.path.read_text() + '\n[devices.far]\nbackend = "cpu"\nhost = "127.0.0.1"\n'
    cfg.path.write_text(with_host)
    far = subprocess.run([sys.executable, "-c", _WITHOUT_PARAMIKO, str(ROOT / "main.py"), "--config", str(cfg.path),
                          "--stage", "profile", "--device", "far"], cwd=tmp_path, capture_output=True, text=True,
                         timeout=300)
    assert far.returncode != 0 and "device 'far' is reached over SSH ([devices.far] host), which needs paramiko: " \
        "paramiko refused by the test (pip install -r requirements.txt)" in far.stdout, far.stdout + far.stderr
    check = subprocess.run([sys.executable, "-c", _WITHOUT_PARAMIKO, str(ROOT / "main.py"), "--config",
                            str(cfg.path), "--stage", "check", "--device", "far"], cwd=tmp_path, capture_output=True,
                           text=True, timeout=300)
    assert check.returncode != 0 and "far [cpu] 127.0.0.1: UNREACHABLE — device 'far' is reached over SSH" \
        in check.stdout, check.stdout + check.stderr


def test_a_child_that_cannot_write_its_result_says_why_and_the_row_says_so(tmp_path, monkeypatch):
    """A child whose result file meets a full disk (its temporary file leads to /dev/full) exits with DISK_FULL and
    one stderr line naming the file and "No space left on device", which the runner takes for a full disk, as it
    does a child that left no stderr either where the disk is nearly full; a result that cannot be written for
    another reason is an error row quoting the child."""
    from types import SimpleNamespace

    from perf4sight.profiling import runner
    from perf4sight.profiling.child import DISK_FULL, RESULT_NOT_WRITTEN

    result = tmp_path / "result.json"
    Path(str(result) + ".tmp").symlink_to("/dev/full")
    err_file = tmp_path / "stderr.txt"
    with err_file.open("wb") as err:
        done = subprocess.run([sys.executable, "-m", "perf4sight.profiling.child", str(tmp_path / "no-plan.json"),
                               "--network", "0", "--batch-size", "1", "--result", str(result)],
                              stdout=subprocess.DEVNULL, stderr=err, timeout=120, cwd=ROOT)
    stderr = runner._stderr_lines(err_file)
    assert done.returncode == DISK_FULL and not result.exists() and runner._disk_full(done.returncode, stderr, tmp_path)
    assert err_file.read_text() == f"cannot write the result file {result}: No space left on device\n"
    assert runner._crash_verdict(RESULT_NOT_WRITTEN, stderr) == {
        "status": "error", "message": f"child could not write its result: cannot write the result file {result}: "
                                      "No space left on device"}
    err_file.write_text(" \n\n")
    assert runner._stderr_lines(err_file) == []
    assert runner._crash_verdict(120, [])["message"] == "child exited with code 120 without a result"
    assert not runner._disk_full(120, [], tmp_path)
    monkeypatch.setattr(runner.shutil, "disk_usage", lambda path: SimpleNamespace(total=100, used=100, free=0))
    assert runner._disk_full(120, [], tmp_path) and not runner._disk_full(-9, [], tmp_path)
    assert not runner._disk_full(120, stderr, tmp_path)  # a child that wrote why it failed did not meet a full disk


def test_a_result_not_written_for_lack_of_space_stops_the_run_without_a_row(tmp_path, monkeypatch, capsys):
    """The second child's result file leads to /dev/full: the runner stops there in one error event naming the file
    and the full disk, records no error row for it (a full disk went on measuring, an error row for every
    configuration left, none measured again by a rerun), and a rerun measures it."""
    import tempfile

    from perf4sight.profiling import runner

    net = write_net(tmp_path, "tiny")
    plan_path = save_plan(TestPlan(device="d", networks=[str(net)], batch_sizes=[1, 2, 4], output="m.csv"),
                          tmp_path / "plan.json")
    made = []

    class FullFromTheSecond(tempfile.TemporaryDirectory):
        def __enter__(self):
            made.append(super().__enter__())
            if len(made) > 1:
                Path(made[-1], "result.json.tmp").symlink_to("/dev/full")
            return made[-1]

    monkeypatch.setattr(tempfile, "TemporaryDirectory", FullFromTheSecond)
    assert runner.main([str(plan_path)]) == 1
    events = [json.loads(line) for line in capsys.readouterr().out.splitlines() if line.startswith("{")]
    assert events[-1] == {"event": "error", "message": f"OSError writing {made[1]}/result.json (No space left on "
                          "device): rows already written are kept; free some space and rerun to measure the rest"}
    assert len(made) == 2 and [r["status"] for r in results.read_rows(tmp_path / "m.csv")] == ["ok"]
    monkeypatch.undo()
    # the rerun without batch size 4, never tried (a fresh torch for nothing checked): the one that met the full disk
    # is measured, as it left no row
    again = run_plan(save_plan(replace(load_plan(plan_path), batch_sizes=[1, 2]), plan_path), emit=lambda event: None)
    assert (again["ok"], again["error"], again["already_measured"]) == (1, 0, 1)
    assert [(r["batch_size"], r["status"]) for r in results.read_rows(tmp_path / "m.csv")] == [("1", "ok"), ("2", "ok")]


def test_a_disk_filled_mid_profile_stops_it_in_one_line_and_a_rerun_measures_the_rest(tmp_path):
    """profiling_dir on a 1 MiB tmpfs, filled once the first row is written: the profile stage stops at the next
    configuration (no error row for it or any after it) in one line naming the full disk; with space freed, a rerun
    without --retry-errors measures the rest."""
    if os.geteuid() != 0:
        pytest.skip("mounting a tmpfs needs root")
    from perf4sight.networks.build import write_manifest

    cfg = load_config(write_config(tmp_path, batch_sizes=(1, 2)))
    net = write_net(cfg.models_dir, "tiny")
    write_manifest([{"network": "tiny", "family": "tiny", "path": net.name}], cfg.models_dir / "manifest.csv")
    cfg.profiling_dir.mkdir()
    if subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", str(cfg.profiling_dir)]).returncode:
        pytest.skip("cannot mount a tmpfs here")
    try:
        csv_path = results.results_path(cfg.profiling_dir, "local")
        cmd = [sys.executable, str(ROOT / "main.py"), "--config", str(cfg.path), "--stage", "profile"]
        proc = subprocess.Popen(cmd, cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        deadline = time.monotonic() + 120
        while not (csv_path.is_file() and results.read_rows(csv_path)) and time.monotonic() < deadline:
            time.sleep(0.05)
        filler = cfg.profiling_dir / "filler"
        with filler.open("wb", buffering=0) as fh, pytest.raises(OSError, match="No space left on device"):
            while True:
                fh.write(b"x" * 4096)
        out, err = proc.communicate(timeout=120)
        assert proc.returncode != 0 and "Traceback" not in out + err, out + err
        line = next(ln for ln in out.splitlines() if ln.startswith("local: failed"))
        assert "(No space left on device): rows already written are kept; free some space and rerun" in line, line
        assert f"OSError writing {cfg.profiling_dir}/" in line, line
        assert [r["status"] for r in results.read_rows(csv_path)] == ["ok"]
        filler.unlink()
        again = subprocess.run(cmd, cwd=tmp_path, capture_output=True, text=True, timeout=300)
        assert again.returncode == 0, again.stdout[-2000:] + again.stderr[-2000:]
        assert [(r["batch_size"], r["status"]) for r in results.read_rows(csv_path)] == [("1", "ok"), ("2", "ok")]
    finally:
        subprocess.run(["umount", "-l", str(cfg.profiling_dir)])


def test_a_child_killed_by_sigkill_is_an_oom_only_on_evidence_of_it(tmp_path, monkeypatch):
    """`kill -9` of a measuring child made a permanent oom row ("the kernel's OOM killer?") that skipped the larger
    batch sizes: with no OOM kill counted by the kernel and its peak RSS within memory_limit_mb it is an error row
    saying why, the sweep goes on, and retry_errors measures it again. A rise of the kernel's count or a peak over
    the limit still make it oom."""
    import signal
    import threading

    from perf4sight.profiling import runner
    from perf4sight.profiling.backends.base import LIMIT_OOM

    backend = get_backend(TestPlan(device="d", memory_limit_mb=900))
    assert runner._sigkill_verdict(5, 5, 768.0, backend) == {
        "status": "error", "message": "child killed by SIGKILL, not taken for running out of memory: the kernel's "
        "OOM killer killed nothing while it ran (oom_kill in /proc/vmstat), and its peak RSS 768 MiB is within "
        "memory_limit_mb 900"}
    assert runner._sigkill_verdict(5, 5, 768.0, get_backend(TestPlan(device="d")))["message"].endswith(
        "(oom_kill in /proc/vmstat), and no memory_limit_mb to hold its peak RSS 768 MiB against")
    # a kernel before 4.13 (a Jetson TX2's) counts no OOM kills: the OOM killer's, as it was taken before
    assert runner._sigkill_verdict(None, None, 768.0, backend) == {
        "status": "oom", "message": "child killed by SIGKILL (the kernel's OOM killer? this kernel keeps no count of "
        "its kills to tell: no oom_kill in /proc/vmstat)"}
    assert runner._sigkill_verdict(5, 6, 768.0, backend)["status"] == "oom"
    over = runner._sigkill_verdict(None, None, 990.0, backend)
    assert over["status"] == "oom" and LIMIT_OOM.search(over["message"]).groups() == ("990", "900")

    net = write_net(tmp_path, "tiny")
    plan = TestPlan(device="d", networks=[str(net)], batch_sizes=[1, 2], output="m.csv", memory_limit_mb=4000)
    plan_path = save_plan(plan, tmp_path / "plan.json")
    real_popen, started = subprocess.Popen, []

    def killed_in_a_second(*args, **kwargs):  # the first child only, as `kill -9 PID` would
        proc = real_popen(*args, **kwargs)
        if not started:
            threading.Timer(1.0, os.kill, (proc.pid, signal.SIGKILL)).start()
        started.append(proc)
        return proc

    monkeypatch.setattr(subprocess, "Popen", killed_in_a_second)
    counts = run_plan(plan_path, emit=lambda event: None)
    monkeypatch.undo()
    rows = results.read_rows(tmp_path / "m.csv")
    assert [(r["batch_size"], r["status"]) for r in rows] == [("1", "error"), ("2", "ok")] and counts["oom"] == 0
    assert rows[0]["message"].startswith("child killed by SIGKILL, not taken for running out of memory: the kernel")
    again = run_plan(save_plan(replace(plan, retry_errors=True), plan_path), emit=lambda event: None)
    assert (again["ok"], again["already_measured"]) == (1, 1)


def test_a_child_the_kernels_oom_killer_kills_is_an_oom(tmp_path, monkeypatch):
    """The measuring child started in a memory cgroup of 200 MiB, which importing torch outgrows: the kernel's OOM
    killer ends it with SIGKILL, its count in /proc/vmstat rises, and the row is oom."""
    from perf4sight.profiling import runner
    from perf4sight.profiling.procfs import oom_kills

    if os.geteuid() != 0 or oom_kills() is None:
        pytest.skip("needs root and a kernel that counts its OOM kills")
    v1 = Path("/sys/fs/cgroup/memory")  # cgroup v1's memory hierarchy, else v2's one
    base, limit_file = (v1, "memory.limit_in_bytes") if v1.is_dir() else (v1.parent, "memory.max")
    cgroup = base / f"p4s-test-{os.getpid()}"
    try:
        cgroup.mkdir()
        (cgroup / limit_file).write_text(str(200 << 20))
    except OSError as exc:
        if cgroup.is_dir():
            cgroup.rmdir()
        pytest.skip(f"cannot make a memory cgroup: {exc}")
    try:
        real_popen = subprocess.Popen

        def in_the_cgroup(*args, **kwargs):
            procs = str(cgroup / "cgroup.procs")
            return real_popen(*args, preexec_fn=lambda: open(procs, "w").write(str(os.getpid())), **kwargs)

        monkeypatch.setattr(subprocess, "Popen", in_the_cgroup)
        plan = TestPlan(device="d", networks=[str(write_net(tmp_path, "tiny"))], batch_sizes=[1], output="m.csv")
        outcome = runner.run_child(plan, save_plan(plan, tmp_path / "plan.json"), 0, 1, get_backend(plan))
    finally:
        monkeypatch.undo()
        cgroup.rmdir()
    assert outcome.result["status"] == "oom", outcome.result
    assert re.fullmatch(r"child killed by SIGKILL: the kernel's OOM killer killed \d+ process\(es\) while it ran "
                        r"\(oom_kill in /proc/vmstat\)", outcome.result["message"])


def test_a_failed_local_profile_counts_the_rows_on_disk_and_the_new_ones(tmp_path, monkeypatch):
    """A local profile that fails says how many of the plan's rows are on disk and how many it wrote, as one that
    ends does: its runner killed by SIGKILL after one row said "(0 new)", and a plan it could not write (a full disk
    here, a read-only folder for the tester) "0/0 rows" as a traceback's last line, though the CSV held a row; so
    did a bug (an exception other than a UserError) after a row was measured."""
    from perf4sight.profiling import local
    from perf4sight.profiling.fleet import _profile_local, format_summaries, profile_devices

    cfg = load_config(write_config(tmp_path))
    net, dev = write_net(tmp_path, "tiny"), cfg.device("local")

    def kill_the_runner(device: str, done: int, total: int, note: str) -> None:
        if done == 1:
            for proc in list(local._RUNNERS):
                proc.kill()

    killed = format_summaries([_profile_local(cfg, dev, [net], kill_the_runner)])
    assert killed == "local: failed — 1/2 rows (1 new) [ok 1] — the profiling runner stopped early: exit code -9"
    plan_path = results.results_path(cfg.profiling_dir, "local").parent / local.PLAN_NAME
    Path(str(plan_path) + ".tmp").symlink_to("/dev/full")
    refused = format_summaries([_profile_local(cfg, dev, [net], lambda *args: None)])
    assert refused == (f"local: failed — 1/2 rows (0 new) [ok 1] — device 'local': cannot write its plan {plan_path}: "
                       "No space left on device")
    measure = local.profile_local

    def measure_then_a_bug(*args, **kwargs):
        measure(*args, **kwargs)
        raise KeyError("a bug")
    monkeypatch.setattr(local, "profile_local", measure_then_a_bug)
    (bug,) = profile_devices(cfg, ["local"], [net], show_progress=False)
    assert format_summaries([bug]) == "local: failed — 2/2 rows (1 new) [ok 2] — device 'local': KeyError: 'a bug'"
