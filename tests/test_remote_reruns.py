"""Remote profiling over real SSH, its second half (test_remote.py holds the first, and the servers; a file goes to
one worker of ``pytest -n 2 --dist loadfile``, and the two halves run side by side): what a device measures again
(a changed description, an oom, error rows, another optimiser), interrupts and reattaching, a full disk, work
folders two configs share, a device without torch or with too old a Python.
"""
from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from perf4sight.ir.from_torch import describe
from perf4sight.ir.schema import save_description
from perf4sight.profiling import results
from perf4sight.profiling.fleet import check_devices, format_summaries, profile_devices
from perf4sight.profiling.outcome import probe_problems
from perf4sight.profiling.remote import RemoteProfiler
from perf4sight.profiling.ssh import DeviceError, Remote

sys.path.insert(0, str(Path(__file__).parent))
import test_remote  # noqa: E402
from test_remote import DEVICE_PYTHON, FAST, _config, _descriptions, _device, _keys_once, _net, _rows  # noqa: E402

#: The first half's two sshd, started again for this file (a module's fixture).
servers = test_remote.servers


def test_changed_description_is_measured_again_on_the_device_with_a_warning(servers, tmp_path):
    """A description rewritten under the same name is a new network on a remote device too: measured
    again, the earlier row kept on both sides, the runner's warning in the summary."""
    a, _ = servers
    cfg = _config(tmp_path, {"dev-c": _device(a, tmp_path)}, batch_sizes=(1,), probe_cached=False)
    (desc,) = _descriptions(tmp_path, ["alpha"])
    (first,) = profile_devices(cfg, ["dev-c"], [desc], show_progress=False, **FAST)
    assert first.status == "done" and first.new_rows == 1 and not first.message
    import torch  # the probe's facts of the device's torch, kept for the next profile's probe
    assert json.loads((tmp_path / "remote work" / "dev-c" / "probe-cache.json").read_text())["torch"] == \
        torch.__version__
    save_description(describe(_net(9), [3, 16, 16], name="alpha", network="tiny"), desc)  # same name, wider
    (again,) = profile_devices(cfg, ["dev-c"], [desc], show_progress=False, **FAST)
    assert again.status == "done" and again.new_rows == 1 and (again.rows, again.expected) == (1, 1)
    assert "'alpha' changed since it was measured" in again.message
    rows = _rows(cfg, "dev-c")
    assert (len(rows) == 2
            and rows[1]["description_sha"] == results.file_sha(desc.read_bytes()) != rows[0]["description_sha"])
    remote_csv = tmp_path / "remote work" / "dev-c" / "measurements.csv"
    assert [r["description_sha"] for r in results.read_rows(remote_csv)] == [r["description_sha"] for r in rows]
    (third,) = profile_devices(cfg, ["dev-c"], [desc], show_progress=False, **FAST)
    assert third.new_rows == 0 and not third.message  # resumes; the earlier run's warning is not repeated


def test_an_oom_a_lower_limit_caused_is_measured_again_on_the_device(servers, tmp_path):
    """A memory_limit_mb below what torch takes makes batch 1 an oom; with the limit gone, the next profile
    measures it again on the device and brings the new row over, the earlier one kept on both sides and
    passed over, the runner's warning in the summary."""
    a, _ = servers
    cfg = _config(tmp_path, {"dev-l": _device(a, tmp_path, memory_limit_mb=20)}, batch_sizes=(1,))
    (desc,) = _descriptions(tmp_path, ["alpha"])
    (first,) = profile_devices(cfg, ["dev-l"], [desc], show_progress=False, **FAST)
    assert first.status == "done" and first.counts["oom"] == 1
    cfg.devices["dev-l"].memory_limit_mb = 0
    (again,) = profile_devices(cfg, ["dev-l"], [desc], show_progress=False, **FAST)
    assert again.status == "done" and again.new_rows == 1 and (again.rows, again.expected) == (1, 1)
    assert "'alpha' ran out of memory at batch size 1 under memory_limit_mb = 20 (no limit now)" in again.message
    rows = _rows(cfg, "dev-l")
    assert [r["status"] for r in rows] == ["oom", "ok"] and [r["status"] for r in results.latest_rows(rows)] == ["ok"]
    remote_csv = tmp_path / "remote work" / "dev-l" / "measurements.csv"
    assert [r["timestamp"] for r in results.read_rows(remote_csv)] == [r["timestamp"] for r in rows]
    assert again.counts["ok"] == 1 and again.counts["oom"] == 0  # the plan's rows count by their newest
    (third,) = profile_devices(cfg, ["dev-l"], [desc], show_progress=False, **FAST)
    assert third.new_rows == 0 and not third.message


def test_error_rows_are_measured_again_on_the_device_when_asked(servers, tmp_path):
    """A measurement that timed out stays an error on a rerun; with retry_errors (``--retry-errors``) the device
    measures it again and the new row comes over, the error kept on both sides and passed over."""
    a, _ = servers
    cfg = _config(tmp_path, {"dev-e": _device(a, tmp_path)}, batch_sizes=(1,))
    (desc,) = _descriptions(tmp_path, ["alpha"])
    cfg.profile.timeout_s = 0.3
    (first,) = profile_devices(cfg, ["dev-e"], [desc], show_progress=False, **FAST)
    assert first.status == "done" and first.counts["error"] == 1
    cfg.profile.timeout_s = 120.0
    (kept,) = profile_devices(cfg, ["dev-e"], [desc], show_progress=False, **FAST)
    assert kept.new_rows == 0 and kept.counts["error"] == 1 and "--retry-errors" in format_summaries([kept])
    cfg.profile.retry_errors = True
    (again,) = profile_devices(cfg, ["dev-e"], [desc], show_progress=False, **FAST)
    assert again.status == "done" and again.new_rows == 1 and again.counts == {**again.counts, "ok": 1, "error": 0}
    rows = _rows(cfg, "dev-e")
    assert [r["status"] for r in rows] == ["error", "ok"] and rows[0]["message"] == "timed out after 0.3 s"
    remote_csv = tmp_path / "remote work" / "dev-e" / "measurements.csv"
    assert [r["timestamp"] for r in results.read_rows(remote_csv)] == [r["timestamp"] for r in rows]


def test_another_optimiser_is_measured_again_on_the_device_and_its_rows_come_over(servers, tmp_path):
    """The plan carries [profile] optimizer to the device: an Adam sweep after an SGD one measures again there (the
    phase is part of the row key), its rows come back as ``train_adam`` and a rerun of either adds nothing."""
    a, _ = servers
    cfg = _config(tmp_path, {"dev-o": _device(a, tmp_path)}, batch_sizes=(1,))
    (desc,) = _descriptions(tmp_path, ["alpha"])
    (sgd,) = profile_devices(cfg, ["dev-o"], [desc], show_progress=False, **FAST)
    cfg.profile.optimizer = "adam"
    (adam,) = profile_devices(cfg, ["dev-o"], [desc], show_progress=False, **FAST)
    (again,) = profile_devices(cfg, ["dev-o"], [desc], show_progress=False, **FAST)
    assert (sgd.new_rows, adam.new_rows, again.new_rows) == (1, 1, 0) and adam.status == "done"
    rows = _rows(cfg, "dev-o")
    assert [(r["phase"], r["status"]) for r in rows] == [("train", "ok"), ("train_adam", "ok")]
    remote_csv = tmp_path / "remote work" / "dev-o" / "measurements.csv"
    assert [r["phase"] for r in results.read_rows(remote_csv)] == ["train", "train_adam"]


def test_interrupted_host_stops_following_and_a_rerun_attaches_to_the_run_that_went_on(servers, tmp_path):
    """Ctrl-C on the host (the cancel event fleet sets) ends the follow at once with a message; the detached
    run keeps measuring on the device, and the next profile attaches to it and pulls every row."""
    a, _ = servers
    cfg = _config(tmp_path, {"dev-i": _device(a, tmp_path)}, batch_sizes=(1, 2))
    (desc,) = _descriptions(tmp_path, ["alpha"])
    run_json = tmp_path / "remote work" / "dev-i" / "run.json"
    early = threading.Event()
    early.set()  # interrupted before the run was started: nothing is started
    cut = RemoteProfiler(cfg, cfg.device("dev-i"), [desc], cancel=early, **FAST).run()
    assert cut.status == "failed" and "interrupted" in cut.message and not run_json.exists()
    cancel = threading.Event()
    prof = RemoteProfiler(cfg, cfg.device("dev-i"), [desc], cancel=cancel, **FAST)
    start = prof._start

    def start_then_interrupt() -> None:
        start()
        cancel.set()  # Ctrl-C right after the detached run started
    prof._start = start_then_interrupt
    started = time.monotonic()
    cut = prof.run()
    assert cut.status == "failed" and "interrupted; the run goes on on the device" in cut.message
    assert time.monotonic() - started < 15 and run_json.exists()
    assert not run_json.with_name("run.exit").exists(), "the run ended before the rerun could attach to it"
    (later,) = profile_devices(cfg, ["dev-i"], [desc], show_progress=False, **FAST)
    assert later.status == "done" and (later.rows, later.expected) == (2, 2), format_summaries([later])
    assert later.attached and format_summaries([later]).startswith(  # the line says where its rows came from
        "dev-i: done — 2/2 rows (0 new, 2 pulled from the run an earlier profile left going on the device) [ok 2]")
    assert _keys_once(_rows(cfg, "dev-i")) and len(_rows(cfg, "dev-i")) == 2


def _children(pid: int) -> list[int]:
    """The pids whose parent is ``pid`` (read from /proc)."""
    found = []
    for entry in os.listdir("/proc"):
        try:
            stat = Path(f"/proc/{entry}/stat").read_text() if entry.isdigit() else ""
        except OSError:
            continue
        if stat and int(stat.rsplit(")", 1)[1].split()[1]) == pid:
            found.append(int(entry))
    return found


def test_a_runner_killed_on_the_device_is_named_by_its_signal_and_a_rerun_resumes(servers, tmp_path):
    """The runner killed with SIGKILL under its supervisor (a kill -9, the OOM killer): the device's line names the
    signal and says a rerun resumes; it printed "the runner exited with -9:" and the raw JSON of the log's last row
    event. The rerun measures the rest, every row once."""
    a, _ = servers
    cfg = _config(tmp_path, {"dev-k": _device(a, tmp_path)}, batch_sizes=(1, 2))
    descs = _descriptions(tmp_path, ["alpha"])  # two measurements: the runner is killed while the second runs
    out: dict = {}
    worker = threading.Thread(target=lambda: out.setdefault("s", profile_devices(
        cfg, ["dev-k"], descs, show_progress=False, **FAST)))
    worker.start()
    test_remote._wait_rows(cfg, "dev-k", 1, worker=worker, out=out)
    run_dir = tmp_path / "remote work" / "dev-k"
    assert not (run_dir / "run.exit").exists(), "the run finished before its runner could be killed"
    (runner,) = _children(json.loads((run_dir / "run.json").read_text())["pid"])
    os.kill(runner, signal.SIGKILL)
    worker.join(timeout=120)
    assert not worker.is_alive()
    (cut,) = out["s"]
    assert cut.status == "failed" and cut.rows == 1
    assert cut.message == ("device 'dev-k': the runner was killed by SIGKILL (a kill -9, or the device's "
                           "out-of-memory killer); rerun the profile stage to resume (rows taken are kept)")
    (later,) = profile_devices(cfg, ["dev-k"], descs, show_progress=False, **FAST)
    assert later.status == "done" and (later.rows, later.expected) == (2, 2), format_summaries([later])
    assert len(_keys_once(_rows(cfg, "dev-k"))) == 2


def test_a_connection_cut_while_the_run_is_set_up_says_to_rerun_and_a_rerun_measures(servers, tmp_path,
                                                                                      monkeypatch):
    """Every SSH connection cut while the descriptions and the plan are shipped, each time they are (the setup
    reconnects and ships again, a bounded number of times): the line says the connection was lost, how often, and
    that a rerun resumes (it said only the first); the rerun measures the plan."""
    a, _ = servers
    cfg = _config(tmp_path, {"dev-s": _device(a, tmp_path)}, batch_sizes=(1,))
    (desc,) = _descriptions(tmp_path, ["alpha"])
    ship = RemoteProfiler._ship

    def cut_then_ship(self) -> None:
        assert a.cut_connections() >= 1
        time.sleep(0.5)  # the client sees the channel close
        ship(self)
    monkeypatch.setattr(RemoteProfiler, "_ship", cut_then_ship)
    (cut,) = profile_devices(cfg, ["dev-s"], [desc], show_progress=False, **FAST)
    assert cut.status == "failed" and cut.message.startswith("device 'dev-s': connection lost: ")
    assert "(3 times while the run was set up, reconnected after each but the last)" in cut.message
    assert cut.message.endswith("; rerun the profile stage to resume (rows taken stay, and a run already started goes "
                                "on on the device)") and not _rows(cfg, "dev-s")
    monkeypatch.setattr(RemoteProfiler, "_ship", ship)
    (later,) = profile_devices(cfg, ["dev-s"], [desc], show_progress=False, **FAST)
    assert later.status == "done" and (later.rows, later.expected) == (1, 1), format_summaries([later])


def test_a_bug_on_a_device_after_its_rows_came_over_fails_it_with_the_rows_on_disk(servers, tmp_path, monkeypatch):
    """An unexpected exception on one device (a bug, not a device problem) fails that device alone, and its summary
    line says how many of its plan's rows are on disk, as a failed device's does, on one line: it said 0/0."""
    a, _ = servers
    cfg = _config(tmp_path, {"dev-x": _device(a, tmp_path)}, batch_sizes=(1,))
    (desc,) = _descriptions(tmp_path, ["alpha"])

    def bug(self) -> None:
        raise RuntimeError("an unexpected state\nover two lines")
    monkeypatch.setattr(RemoteProfiler, "_pull_op_prices", bug)  # called once the run ended and its rows came over
    (summary,) = profile_devices(cfg, ["dev-x"], [desc], show_progress=False, **FAST)
    assert len(_rows(cfg, "dev-x")) == 1
    assert format_summaries([summary]) == ("dev-x: failed — 1/1 rows (1 new) [ok 1] — device 'dev-x': RuntimeError: "
                                           "an unexpected state over two lines")


def test_ctrl_c_of_the_cli_says_the_ssh_devices_run_goes_on_and_a_rerun_collects_its_rows(servers, tmp_path):
    """Ctrl-C of ``--stage profile`` with an SSH device: the last line says its run goes on on the device and a
    rerun collects its rows (it said only "measurements taken so far are on disk; rerun to resume"), as it does."""
    from perf4sight.networks.build import write_manifest
    from perf4sight.profiling.fleet import REMOTE_RUNS_GO_ON

    a, _ = servers
    cfg = _config(tmp_path, {"dev-c": _device(a, tmp_path)}, batch_sizes=(1, 2))
    cfg.models_dir.mkdir()
    descs = _descriptions(cfg.models_dir, ["alpha"])  # two measurements: Ctrl-C while the second runs
    write_manifest([{"network": d.stem, "family": "tiny", "path": d.name} for d in descs],
                   cfg.models_dir / "manifest.csv")
    main = Path(__file__).resolve().parents[1] / "main.py"
    proc = subprocess.Popen([sys.executable, str(main), "--config", str(cfg.path), "--stage", "profile"],
                            cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True)  # its own group: the signal reaches main.py only
    try:
        deadline = time.monotonic() + 90
        while not _rows(cfg, "dev-c") and proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.1)
        assert len(_rows(cfg, "dev-c")) == 1, "no row pulled, or the run ended before the interrupt"
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 130 and err.strip().splitlines()[-1] == f"interrupted: {REMOTE_RUNS_GO_ON}", err
    assert "SSH device goes on measuring there" in REMOTE_RUNS_GO_ON
    (later,) = profile_devices(cfg, ["dev-c"], descs, show_progress=False, **FAST)
    assert later.status == "done" and (later.rows, later.expected) == (2, 2), format_summaries([later])


def test_work_folder_that_cannot_be_created_fails_check_and_profile_with_its_name(servers, tmp_path):
    """A workdir under a file: `check` says the work folder cannot be created (it used to say ok), and
    `profile` names the folder instead of reporting a lost connection."""
    a, _ = servers
    blocker = tmp_path / "a-file"
    blocker.write_text("not a folder")
    cfg = _config(tmp_path, {"box": {**_device(a, tmp_path), "workdir": str(blocker / "work")}})
    (check,) = check_devices(cfg, ["box"])
    assert check.reachable and not check.ok
    assert f"work folder {blocker / 'work' / 'box'} cannot be created" in check.message
    (desc,) = _descriptions(tmp_path, ["alpha"])
    (summary,) = profile_devices(cfg, ["box"], [desc], show_progress=False, **FAST)
    assert summary.status == "failed" and "cannot create the work folder" in summary.message
    assert "connection lost" not in summary.message and str(blocker) in summary.message


def test_a_work_folder_sftp_cannot_make_says_the_devices_reason_not_sftps_failure(servers, tmp_path):
    """Where SFTP answers its generic "Failure" (no errno: a read-only file system, a full disk, here a name longer
    than the file system takes), profile gives the device's own reason from its ``mkdir -p``: it said "(Failure)"
    where check said "Read-only file system"."""
    a, _ = servers
    workdir = tmp_path / ("w" * 300)
    cfg = _config(tmp_path, {"box": {**_device(a, tmp_path), "workdir": str(workdir)}}, probe_cached=False)
    (desc,) = _descriptions(tmp_path, ["alpha"])
    (summary,) = profile_devices(cfg, ["box"], [desc], show_progress=False, **FAST)
    assert summary.status == "failed" and f"cannot create the work folder {workdir / 'box'} (" in summary.message
    assert "': File name too long); set [devices.box] workdir to a folder" in summary.message
    assert "Failure" not in summary.message


def test_a_full_disk_at_the_start_is_one_line_naming_the_file(servers, tmp_path):
    """The device cannot write run.json (its temporary file leads to /dev/full: "No space left on device"): the
    profile fails in one line naming the file and the reason (it ended in a traceback's last 300 characters), and no
    untracked run is left going."""
    a, _ = servers
    cfg = _config(tmp_path, {"dev-f": _device(a, tmp_path)}, batch_sizes=(1,))
    run_dir = tmp_path / "remote work" / "dev-f"
    run_dir.mkdir(parents=True, exist_ok=True)  # the probe cache made it
    (run_dir / "run.json.tmp").symlink_to("/dev/full")
    (desc,) = _descriptions(tmp_path, ["alpha"])
    (summary,) = profile_devices(cfg, ["dev-f"], [desc], show_progress=False, **FAST)
    assert summary.status == "failed" and "Traceback" not in summary.message
    assert summary.message == (f"device 'dev-f': start failed (exit 1): detach start: {run_dir / 'run.json'}: "
                               "No space left on device")
    assert not (run_dir / "run.json").exists()
    time.sleep(0.5)
    supervisors = [p for p in Path("/proc").glob("[0-9]*") if _cmdline_has(p, f"supervise {run_dir}")]
    assert not supervisors, "the supervisor started before run.json failed is still running"


def _cmdline_has(proc: Path, text: str) -> bool:
    try:
        return text in (proc / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return False


def test_two_configs_sharing_a_work_folder_pull_only_their_own_rows(servers, tmp_path):
    """Two projects profile the same device name in the same remote work folder: each pulls only the rows
    of its own plan, the other's stay on the device, and the summary says how many it passed over."""
    a, _ = servers
    shared = _device(a, tmp_path)  # one workdir for both
    projects = {}
    for name in ("one", "two"):
        folder = tmp_path / name
        folder.mkdir()
        cfg = _config(folder, {"dev-s": shared}, batch_sizes=(1,))
        projects[name] = (cfg, _descriptions(folder, [f"net-{name}"]))
    for name, (cfg, descs) in projects.items():
        (summary,) = profile_devices(cfg, ["dev-s"], descs, show_progress=False, **FAST)
        assert summary.status == "done" and summary.new_rows == 1, format_summaries([summary])
        assert [r["network"] for r in _rows(cfg, "dev-s")] == [f"net-{name}"]
    assert "1 row in" in summary.message and "not in this plan" in summary.message  # project two saw one's row
    remote_csv = tmp_path / "remote work" / "dev-s" / "measurements.csv"
    assert sorted(r["network"] for r in results.read_rows(remote_csv)) == ["net-one", "net-two"]
    cfg, descs = projects["one"]
    (again,) = profile_devices(cfg, ["dev-s"], descs, show_progress=False, **FAST)
    assert again.new_rows == 0 and "1 row in" in again.message
    assert [r["network"] for r in _rows(cfg, "dev-s")] == ["net-one"]


def test_device_without_torch_or_with_too_old_a_python_runs_nothing(servers, tmp_path):
    """A device python that cannot import torch: `profile` refuses before shipping anything, in one line
    naming the device, the python and what is missing, and records no row (it used to record an `error` row
    per measurement, never retried, and exit 0)."""
    a, _ = servers
    no_torch = tmp_path / "python-without-site-packages"  # the same interpreter, without its site-packages
    no_torch.write_text(f"#!/bin/sh\nexec {DEVICE_PYTHON} -S \"$@\"\n")
    no_torch.chmod(0o755)
    cfg = _config(tmp_path, {"box": {**_device(a, tmp_path), "python": str(no_torch)}})
    (desc,) = _descriptions(tmp_path, ["alpha"])
    (summary,) = profile_devices(cfg, ["box"], [desc], show_progress=False, **FAST)
    assert summary.status == "failed", format_summaries([summary])
    assert "device 'box' is not ready, nothing was run: torch not importable" in summary.message
    assert str(no_torch) in summary.message and summary.rows == 0
    assert not _rows(cfg, "box") and not list((tmp_path / "remote work").rglob("measurements.csv"))
    assert probe_problems("cpu", {"python": "3.5.2", "torch": "1.4.0"}, "w") == [
        "python 3.5.2 is older than 3.6, which the runner needs"]
    assert probe_problems("cpu", {"python": "3.6.9", "torch": "1.10.0"}, "w") == []


def test_a_login_shell_that_refuses_says_why_in_check_and_profile(servers, tmp_path):
    """A device account whose shell refuses to run commands (``nologin``, as a service account's: sshd says on
    stderr that it could not chdir home, nologin on stdout that the account is not available): check and profile
    both give what each stream said; they gave stderr's line alone, which blames the home folder."""
    a, _ = servers
    nologin = tmp_path / "nologin-python"  # stands for the login shell: it prints as sshd and nologin do
    nologin.write_text("#!/bin/sh\necho 'Could not chdir to home directory /nonexistent: No such file or directory'"
                       " >&2\necho 'This account is currently not available.'\nexit 1\n")
    nologin.chmod(0o755)
    cfg = _config(tmp_path, {"svc": {**_device(a, tmp_path), "python": str(nologin)}})
    said = (f"python '{nologin}' did not run the probe (exit 1): Could not chdir to home directory /nonexistent: "
            "No such file or directory This account is currently not available.")
    (check,) = check_devices(cfg, ["svc"])
    assert check.reachable and not check.ok and check.message == said
    (desc,) = _descriptions(tmp_path, ["alpha"])
    (summary,) = profile_devices(cfg, ["svc"], [desc], show_progress=False, **FAST)
    assert summary.status == "failed" and summary.message == f"device 'svc': {said}" and not _rows(cfg, "svc")


def _python2() -> str:
    """A Python 2 interpreter (``PERF4SIGHT_TEST_PYTHON2``, on PATH or under pyenv), or skip."""
    import glob
    import shutil

    candidates = [os.environ.get("PERF4SIGHT_TEST_PYTHON2"), shutil.which("python2.7"), shutil.which("python2"),
                  *sorted(glob.glob(os.path.expanduser("~/.pyenv/versions/2.*/bin/python")))]
    for python in filter(None, candidates):
        try:  # a pyenv shim is on PATH even where that version is not selected: it fails
            if subprocess.run([python, "-c", "import sys; sys.exit(sys.version_info[0] != 2)"],
                              capture_output=True, timeout=30).returncode == 0:
                return python
        except OSError:
            continue
    pytest.skip("no Python 2 interpreter here (set PERF4SIGHT_TEST_PYTHON2)")


def test_a_device_python_2_is_named_too_old_by_check_and_profile(servers, tmp_path):
    """The probe reports its version before importing what Python 2 lacks (it said "did not run the probe (exit 1):
    Traceback ... ImportError: No module named util"), so both stages name the python as too old."""
    a, _ = servers
    python2 = _python2()
    cfg = _config(tmp_path, {"old": {**_device(a, tmp_path), "python": python2}})
    (check,) = check_devices(cfg, ["old"])
    assert check.reachable and not check.ok and check.facts["python"].startswith("2.7")
    assert check.message == f"python {check.facts['python']} is older than 3.6, which the runner needs"
    (desc,) = _descriptions(tmp_path, ["alpha"])
    (summary,) = profile_devices(cfg, ["old"], [desc], show_progress=False, **FAST)
    assert summary.status == "failed" and "is not ready, nothing was run: python 2.7" in summary.message
    assert "older than 3.6" in summary.message and "Traceback" not in summary.message


def test_the_profile_stages_probe_imports_torch_again_only_when_its_install_changed(tmp_path):
    """The probe before each profile keeps torch's facts in a cache file beside the device's rows: a second probe
    of the same install reads them instead of importing torch (seconds); a changed torch package, another Python,
    the nvml backend (CUDA can go without a reinstall) and ``check`` (no cache file) import it again. A stand-in
    torch package here counts its imports; the real probe script runs in real processes."""
    from perf4sight.profiling.remote import PROBE
    fake = tmp_path / "site" / "torch"
    fake.mkdir(parents=True)
    imports = tmp_path / "imports.txt"
    (fake / "__init__.py").write_text(
        f"with open({str(imports)!r}, 'a') as fh:\n    fh.write('imported\\n')\n"
        "__version__ = '9.8.7'\n"
        "class cuda:\n    @staticmethod\n    def is_available():\n        return True\n")
    (fake / "version.py").write_text("__version__ = '9.8.7'\n")
    cache = tmp_path / "work" / "probe-cache.json"  # in the work folder, which the profile stage made before
    cache.parent.mkdir()

    def probe(backend: str = "cpu", *cache_arg: str, python: tuple[str, ...] = ()) -> dict:
        out = subprocess.run([sys.executable, *python, str(PROBE), backend, str(tmp_path / "work"), *cache_arg],
                             capture_output=True, text=True, check=True,
                             env={**os.environ, "PYTHONPATH": str(tmp_path / "site")})
        return json.loads(out.stdout.strip().splitlines()[-1])

    def count() -> int:
        return len(imports.read_text().splitlines()) if imports.exists() else 0

    first = probe("cpu", str(cache))
    assert (first["torch"], first["cuda"], count()) == ("9.8.7", True, 1) and cache.is_file()
    again = probe("cpu", str(cache))
    assert (again["torch"], again["torch_error"], again["cuda"], count()) == ("9.8.7", "", True, 1)  # not imported
    assert probe("cpu")["torch"] == "9.8.7" and count() == 2  # check: no cache, always imported
    assert probe("nvml", str(cache))["cuda"] is True and count() == 3
    assert probe("cpu", str(cache), python=("-X", "utf8"))["torch"] == "9.8.7" and count() == 3  # same install
    (fake / "version.py").write_text("__version__ = '9.8.8'\n")  # torch reinstalled: imported again
    assert probe("cpu", str(cache))["torch"] == "9.8.7" and count() == 4
    assert probe("cpu", str(cache))["torch"] == "9.8.7" and count() == 4
    cache.write_text("{damaged")
    assert probe("cpu", str(cache))["torch"] == "9.8.7" and count() == 5 and json.loads(cache.read_text())["cuda"]


def test_two_probes_writing_the_cache_at_once_each_rename_a_file_of_their_own(tmp_path, monkeypatch):
    """The probe's cache was written through one fixed name (probe-cache.json.tmp): a second profile run's probe
    on the same device folder truncated the first's file and renamed it away, so the first's rename failed (and a
    reader could meet an empty cache between the two); a cache path it could not rename onto left the .tmp behind.
    Each writer fills a temporary file of its own now. Here the second probe writes the whole cache while the
    first is about to rename (real torch, already imported: its facts are read again because no cache exists)."""
    import torch

    from perf4sight.profiling import probe
    cache = tmp_path / "probe-cache.json"
    real_replace, failed = os.replace, []

    def replace(src, dst):
        if not failed and not hasattr(replace, "nested"):
            replace.nested = True
            probe._torch_facts(str(cache))  # the other run's probe, started before this one's rename
        try:
            real_replace(src, dst)
        except OSError as exc:
            failed.append(exc)
            raise

    monkeypatch.setattr(probe.os, "replace", replace)
    assert probe._torch_facts(str(cache))[0] == torch.__version__
    assert failed == [] and json.loads(cache.read_text())["torch"] == torch.__version__
    assert os.listdir(tmp_path) == ["probe-cache.json"]
    monkeypatch.setattr(probe.os, "replace", real_replace)
    cache.unlink()
    cache.mkdir()  # a path it cannot rename onto: nothing of its own left beside it
    assert probe._torch_facts(str(cache))[0] == torch.__version__ and os.listdir(tmp_path) == ["probe-cache.json"]


def test_a_port_that_is_no_ssh_server_is_one_line_without_paramikos_tracebacks(tmp_path, capfd):
    """A listener on loopback that never speaks, or answers as a web server: one line saying no SSH server
    answered there, and none of paramiko's own log lines (its transport thread logged two tracebacks)."""
    import paramiko

    key = tmp_path / "key"
    paramiko.RSAKey.generate(2048).write_private_key_file(str(key))
    (tmp_path / "known_hosts").write_text("")
    held: list[socket.socket] = []

    def listen(speak: bool) -> int:
        listener = socket.socket()
        listener.bind(("127.0.0.1", 0))
        listener.listen(8)
        held.append(listener)

        def serve() -> None:
            while True:
                try:
                    conn, _ = listener.accept()
                except OSError:
                    return
                held.append(conn)
                if speak:
                    conn.sendall(b"HTTP/1.1 400 Bad Request\r\n\r\n")
                    conn.close()

        threading.Thread(target=serve, daemon=True).start()
        return listener.getsockname()[1]

    try:
        for speak in (False, True):
            port = listen(speak)
            cfg = _config(tmp_path, {"d": {"host": "127.0.0.1", "port": port, "key_file": str(key),
                                           "known_hosts": str(tmp_path / "known_hosts")}})
            with pytest.raises(DeviceError, match=rf"device 'd': no SSH server answered at 127\.0\.0\.1:{port} "
                                                  r"within 2 s \(is it an SSH server, on that port\?\)$"):
                Remote(cfg.device("d"), tmp_path / "known_hosts", timeout_s=2).connect()
            time.sleep(0.2)  # paramiko's transport thread logs as it ends
            err = capfd.readouterr().err
            assert "Traceback" not in err and "paramiko" not in err.lower(), err
    finally:
        for sock in held:
            sock.close()
