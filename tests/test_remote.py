"""Remote profiling over real SSH: two OpenSSH servers on 127.0.0.1 act as two devices.

The "remote" python is the interpreter running the tests, so the device has torch; set
``PERF4SIGHT_TEST_DEVICE_PYTHON`` to another interpreter with torch (e.g. Python 3.6 and torch 1.10, as a
Jetson TX2 on JetPack 4.6 has) to run the device side under it. Faults:
connections cut mid-run, a device's run killed mid-run, an unknown or changed host key,
hostile names, an unreachable device.
"""
from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import pytest
import torch.nn as nn

from perf4sight.config import load_config
from perf4sight.features.priced_ops import load_op_prices
from perf4sight.ir.from_torch import describe
from perf4sight.ir.schema import save_description
from perf4sight.profiling import results
from perf4sight.profiling.fleet import check_devices, format_checks, format_summaries, profile_devices
from perf4sight.profiling.op_prices import PRICED_OPS
from perf4sight.profiling.outcome import PROBE, PROBE_CACHE
from perf4sight.profiling.pull import CsvPuller, complete_records, csv_with_rows, rows_to_csv
from perf4sight.profiling.remote import RemoteProfiler, remote_dir_name
from perf4sight.profiling.ssh import DeviceError, HostKeyError, LoginError, Remote, quote_argv

sys.path.insert(0, str(Path(__file__).parent))
from sshd import SshServer, ensure_sshd, free_port  # noqa: E402

DEVICE_PYTHON = os.environ.get("PERF4SIGHT_TEST_DEVICE_PYTHON") or sys.executable
#: The follower's settings for the tests: rows pulled every 0.2 s; the run's liveness asked every 5 s (each ask is a
#: command over SSH: a login shell and a Python on the device, ~0.2 s of CPU here; every second, they took a fifth of
#: a core while a run was followed), and at once after a reconnect.
FAST = dict(poll_s=0.2, status_every_s=5.0, connect_timeout_s=5.0, reconnect_timeout_s=30.0)


@pytest.fixture(scope="module")
def servers(tmp_path_factory):
    """Two sshd on free ports sharing one client key; stopped (by pid) at the end."""
    why = ensure_sshd()
    if why:
        pytest.skip(why)
    base = tmp_path_factory.mktemp("sshd")
    try:
        a = SshServer(base / "a").start()
        b = SshServer(base / "b", client_key=a.client_key).start()
    except (RuntimeError, OSError, subprocess.CalledProcessError) as exc:
        pytest.skip(f"cannot start sshd: {exc}")
    hang = a.login_hangs()
    if hang:
        a.stop()
        b.stop()
        pytest.skip(hang)
    yield a, b
    a.stop()
    b.stop()


def _net(width: int) -> nn.Module:
    return nn.Sequential(nn.Conv2d(3, width, 3, padding=1), nn.ReLU(), nn.AdaptiveAvgPool2d(1), nn.Flatten(),
                         nn.Linear(width, 10))


def _descriptions(folder: Path, names: list[str]) -> list[Path]:
    paths = []
    for i, name in enumerate(names):
        p = folder / f"net{i}.json"
        save_description(describe(_net(4 + i), [3, 16, 16], name=name, network="tiny"), p)
        paths.append(p)
    return paths


def _config(folder: Path, devices: dict[str, dict], batch_sizes=(1, 2), op_prices: bool = False,
            probe_cached: bool = True):
    """The config of ``devices`` written into ``folder`` and loaded; with ``probe_cached``, each device run by
    DEVICE_PYTHON gets the probe's cache of torch's facts in its work folder (:func:`_seed_probe_cache`)."""
    lines = [f"[profile]\nbatch_sizes = {list(batch_sizes)}\nwarmup_steps = 1\ntimed_steps = 2\ntimeout_s = 120\n"
             f"op_prices = {json.dumps(op_prices)}\n"]
    for name, keys in devices.items():
        lines.append(f"[devices.{json.dumps(name)}]")
        for k, v in keys.items():
            lines.append(f"{k} = {json.dumps(v)}")
    (folder / "config.toml").write_text("\n".join(lines) + "\n")
    if probe_cached:
        for name, keys in devices.items():
            _seed_probe_cache(name, keys)
    return load_config(folder / "config.toml")


#: probe-cache.json as the profile stage's probe writes it for DEVICE_PYTHON: made once per test process.
_PROBE_CACHE: dict[str, bytes] = {}


def _seed_probe_cache(name: str, keys: dict) -> None:
    """Puts the probe's cache into the work folder of device ``name`` (``keys``: its config table), as a device
    profiled before has it, so that each test's first profile does not import torch in its preflight probe only to
    learn the version (3 s of CPU a test). The probe still runs over SSH and reads the cache: the cache is keyed by
    this Python and torch's files, which the real probe wrote here. Devices of another Python, or whose work folder
    cannot be made, are left as they are. Tests of the probe's own import, or of a work folder the run makes, pass
    ``probe_cached=False``."""
    if keys.get("python") != DEVICE_PYTHON or "workdir" not in keys:
        return
    if "bytes" not in _PROBE_CACHE:
        with tempfile.TemporaryDirectory() as scratch:
            cache = Path(scratch) / PROBE_CACHE
            subprocess.run([DEVICE_PYTHON, "-c", PROBE.read_text(), "cpu", scratch, str(cache)],
                           capture_output=True, text=True, timeout=120)
            _PROBE_CACHE["bytes"] = cache.read_bytes() if cache.is_file() else b""  # none: a Python without torch
    if not _PROBE_CACHE["bytes"]:
        return
    target = Path(keys["workdir"]) / remote_dir_name(name) / PROBE_CACHE
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        if not target.exists():
            target.write_bytes(_PROBE_CACHE["bytes"])
    except OSError:  # a work folder under a file: the test is about that
        pass


def _device(server: SshServer, folder: Path, **extra) -> dict:
    kh = folder / "known_hosts"
    if not kh.exists() or server.known_hosts_line not in kh.read_text():
        with kh.open("a") as fh:
            fh.write(server.known_hosts_line)
    return {"host": "127.0.0.1", "port": server.port, "user": server.user, "key_file": str(server.client_key),
            "known_hosts": str(kh), "python": DEVICE_PYTHON, "workdir": str(folder / "remote work"), **extra}


def _rows(cfg, device: str) -> list[dict]:
    return results.read_rows(results.results_path(cfg.profiling_dir, device))


def _wait_rows(cfg, device: str, n: int, timeout_s: float = 90, worker: threading.Thread | None = None,
               out: dict | None = None) -> None:
    """Until ``device`` has ``n`` local rows; fails at once (with the summaries) if ``worker`` ended first."""
    deadline = time.monotonic() + timeout_s
    while len(_rows(cfg, device)) < n:
        ended = worker is not None and not worker.is_alive()
        if ended or time.monotonic() >= deadline:
            log = Path(cfg.root / "remote work" / device / "run.log")
            why = format_summaries(out["s"]) if ended and out and "s" in out else "run still going"
            pytest.fail(f"no {n} rows for {device} within {timeout_s} s; {why}; "
                        f"remote log tail: {log.read_text()[-600:] if log.is_file() else 'none'}")
        time.sleep(0.1)


def _first_with_a_row(cfg, devices: list[str], worker: threading.Thread, out: dict, timeout_s: float = 90) -> str:
    """The first of ``devices`` to have a local row; fails at once (with the summaries) if ``worker`` ended first."""
    deadline = time.monotonic() + timeout_s
    while True:
        for device in devices:
            if _rows(cfg, device):
                return device
        if not worker.is_alive() or time.monotonic() >= deadline:
            why = format_summaries(out["s"]) if "s" in out else "run still going"
            pytest.fail(f"no row for any of {devices} within {timeout_s} s; {why}")
        time.sleep(0.1)


def _keys_once(rows: list[dict]) -> set:
    keys = [results.row_key(r) for r in rows]
    assert len(keys) == len(set(keys)), f"duplicated rows: {keys}"
    return set(keys)


# --- parallel devices, faults mid-run, resume -------------------------------------------------
def test_two_devices_survive_cut_connection_and_killed_run_then_rerun_adds_nothing(servers, tmp_path):
    a, b = servers
    descs = _descriptions(tmp_path, ["alpha", "beta"])
    # one batch size: two measurements per device (fresh torch processes, the test's cost), each fault injected
    # as soon as the device's first row is in, while its second is measured
    cfg = _config(tmp_path, {"dev-a": _device(a, tmp_path), "dev-b": _device(b, tmp_path)}, batch_sizes=(1,))
    out: dict = {}
    worker = threading.Thread(target=lambda: out.setdefault("s", profile_devices(
        cfg, ["dev-a", "dev-b"], descs, show_progress=False, **FAST)))
    worker.start()
    run_json = tmp_path / "remote work" / "dev-b" / "run.json"
    pending = ["dev-a", "dev-b"]
    while pending:  # each device's fault once its first row is in, whichever device comes first
        dev = _first_with_a_row(cfg, pending, worker, out)
        pending.remove(dev)
        if dev == "dev-a":  # the network drops (every SSH connection killed, the server down for a while)
            assert len(_rows(cfg, "dev-a")) < 2, "the run finished before the fault could be injected"
            a.stop()
            stopped = time.monotonic()
        else:  # the run itself dies (supervisor, runner and child killed, as in a crash)
            assert not run_json.with_name("run.exit").exists(), "the run finished before it could be killed"
            os.killpg(json.loads(run_json.read_text())["pid"], signal.SIGKILL)
    time.sleep(max(0.0, stopped + 1.5 - time.monotonic()))
    a.start()
    worker.join(timeout=180)
    assert not worker.is_alive()
    sa, sb = out["s"]
    assert (sa.status, sb.status) == ("done", "done"), format_summaries(out["s"])
    assert sa.reconnects >= 1 and sb.restarts >= 1
    for dev in ("dev-a", "dev-b"):
        rows = _rows(cfg, dev)
        shas = dict(zip(("alpha", "beta"), (results.file_sha(d.read_bytes()) for d in descs)))
        assert _keys_once(rows) == {(dev, n, "1", "3x16x16", "train", "cross_entropy", shas[n])
                                    for n in ("alpha", "beta")}
        assert all(r["status"] == "ok" and float(r["latency_ms_median"]) > 0 for r in rows)
        remote_rows = results.read_rows(tmp_path / "remote work" / dev / "measurements.csv")
        assert _keys_once(remote_rows) == _keys_once(rows)
    # rerun: nothing new is measured or pulled
    again = profile_devices(cfg, ["dev-a", "dev-b"], descs, show_progress=False, **FAST)
    assert [s.status for s in again] == ["done", "done"] and [s.new_rows for s in again] == [0, 0]
    assert len(_rows(cfg, "dev-a")) == 2
    # the device lost its work folder (re-imaged): local rows are written back, not measured again
    before = {results.row_key(r): r["timestamp"] for r in _rows(cfg, "dev-b")}
    import shutil
    shutil.rmtree(tmp_path / "remote work" / "dev-b")
    third = profile_devices(cfg, ["dev-b"], descs, show_progress=False, **FAST)
    assert third[0].status == "done" and third[0].new_rows == 0
    log = (tmp_path / "remote work" / "dev-b" / "run.log").read_text()
    assert '"event":"already"' in log and '"event":"row"' not in log
    assert {results.row_key(r): r["timestamp"] for r in _rows(cfg, "dev-b")} == before


# --- host keys --------------------------------------------------------------------------------
def test_unknown_host_key_is_refused(servers, tmp_path):
    a, _ = servers
    (tmp_path / "known_hosts").write_text("")
    dev = _device(a, tmp_path)
    (tmp_path / "known_hosts").write_text("")  # the server's key is not known
    cfg = _config(tmp_path, {"d": dev})
    with pytest.raises(HostKeyError, match="is not in .*known_hosts.*accept_new_host_key"):
        Remote(cfg.device("d"), Path(dev["known_hosts"])).connect()
    checks = check_devices(cfg)
    assert not checks[0].reachable and "host key" in checks[0].message
    assert "HOST KEY REFUSED" in format_checks(checks) and "UNREACHABLE" not in format_checks(checks)
    (tmp_path / "known_hosts").unlink()  # no known_hosts file at all: nothing was tried, the label says why
    text = format_checks(check_devices(cfg))
    assert "HOST KEY REFUSED" in text and "ssh-keyscan" in text


def test_changed_host_key_is_refused_even_when_accepting_new(servers, tmp_path):
    a, b = servers
    kh = tmp_path / "known_hosts"
    kh.write_text(f"[127.0.0.1]:{a.port} {b.host_key_pub}\n")  # another server's key under a's address
    cfg = _config(tmp_path, {"d": {**_device(a, tmp_path), "accept_new_host_key": True}})
    kh.write_text(f"[127.0.0.1]:{a.port} {b.host_key_pub}\n")
    with pytest.raises(HostKeyError, match="CHANGED"):
        Remote(cfg.device("d"), kh).connect()


def test_accept_new_host_key_records_it(servers, tmp_path):
    a, _ = servers
    kh = tmp_path / "kh" / "known_hosts"
    dev = {**_device(a, tmp_path), "known_hosts": str(kh), "accept_new_host_key": True}
    cfg = _config(tmp_path, {"d": dev})
    with Remote(cfg.device("d"), kh) as r:
        assert r.run(["echo", "hi there"]).stdout == "hi there\n"
    assert a.host_key_pub.split()[1] in kh.read_text()
    cfg2 = _config(tmp_path, {"d": {**dev, "accept_new_host_key": False}})
    with Remote(cfg2.device("d"), kh) as r:  # now known: accepted without the opt-in
        assert r.run(["true"]).rc == 0


def test_known_hosts_markers_and_unreadable_lines(servers, tmp_path):
    """An ``@cert-authority`` line is passed over (check and connect went down with paramiko's InvalidHostKey); a key
    on an ``@revoked`` line is refused, also when accepting new keys; a line paramiko cannot parse is one line naming
    the file and line number."""
    a, b = servers
    kh = tmp_path / "known_hosts"
    cfg = _config(tmp_path, {"d": _device(a, tmp_path)})
    ca = f"@cert-authority *.example.com {b.host_key_pub.split()[0]} {b.host_key_pub.split()[1]}\n"
    kh.write_text(ca + a.known_hosts_line)
    with Remote(cfg.device("d"), kh) as r:
        assert r.run(["true"]).rc == 0
    (check,) = check_devices(cfg, ["d"])
    assert check.reachable, check.message
    a_key = " ".join(a.host_key_pub.split()[:2])
    # a second key of the same type for the host after the right one (two boards once at one address): the first is
    # kept, as paramiko's own loader keeps it (a later one replaced it, and the host read as CHANGED)
    b_key = " ".join(b.host_key_pub.split()[:2])
    assert a_key.split()[0] == b_key.split()[0]
    kh.write_text(a.known_hosts_line + f"[127.0.0.1]:{a.port} {b_key}\n")
    with Remote(cfg.device("d"), kh) as r:
        assert r.run(["true"]).rc == 0
    for accept in (False, True):
        kh.write_text(f"@revoked * {a_key}\n" + a.known_hosts_line)
        cfg = _config(tmp_path, {"d": {**_device(a, tmp_path), "accept_new_host_key": accept}})
        kh.write_text(f"@revoked * {a_key}\n" + a.known_hosts_line)
        with pytest.raises(HostKeyError, match=f"host key of .* is marked @revoked in {kh}; refusing to connect"):
            Remote(cfg.device("d"), kh).connect()
        assert kh.read_text() == f"@revoked * {a_key}\n" + a.known_hosts_line  # nothing recorded
    for bad in (f"[127.0.0.1]:{a.port} ssh-ed25519 not-base64!", "@revoked *", "@trusted * ssh-ed25519 AAAA"):
        kh.write_text(a.known_hosts_line + bad + "\n")
        with pytest.raises(HostKeyError, match=f"^device 'd': {kh} line 2[ :]"):
            Remote(cfg.device("d"), kh).connect()
    (check,) = check_devices(cfg, ["d"])
    assert check.host_key_refused and f"{kh} line 2" in check.message


def test_login_without_a_key_or_with_a_refused_key_says_so(servers, tmp_path, monkeypatch):
    """No key anywhere (no key_file, no agent, an empty ~/.ssh) and a key the server does not know: each is
    its own line, and check labels it LOGIN FAILED, not UNREACHABLE."""
    import paramiko

    a, _ = servers
    monkeypatch.setenv("HOME", str(tmp_path / "home"))  # paramiko looks for default keys under ~/.ssh
    monkeypatch.delenv("SSH_AUTH_SOCK", raising=False)
    cfg = _config(tmp_path, {"nokey": {**_device(a, tmp_path), "key_file": ""}})
    with pytest.raises(LoginError, match=r"no key to log in to .*set key_file in \[devices.nokey\]"):
        Remote(cfg.device("nokey"), tmp_path / "known_hosts").connect()
    other = tmp_path / "other_key"
    paramiko.RSAKey.generate(2048).write_private_key_file(str(other))
    cfg = _config(tmp_path, {"nokey": {**_device(a, tmp_path), "key_file": ""},
                             "wrongkey": {**_device(a, tmp_path), "key_file": str(other)}})
    with pytest.raises(LoginError, match=f"authentication failed for .* with key_file {other}"):
        Remote(cfg.device("wrongkey"), tmp_path / "known_hosts").connect()
    lines = format_checks(check_devices(cfg)).splitlines()
    assert len(lines) == 2 and all(": LOGIN FAILED" in line for line in lines), lines
    descs = _descriptions(tmp_path, ["net"])  # the profile stage says so too (it said "unreachable")
    (refused,) = profile_devices(cfg, ["wrongkey"], descs, show_progress=False, **FAST)
    assert refused.status == "login failed" and "authentication failed" in refused.message
    assert format_summaries([refused]).startswith("wrongkey: login failed — ")
    (tmp_path / "not_a_key").write_text("hello\n")
    locked = tmp_path / "locked_key"
    paramiko.RSAKey.generate(2048).write_private_key_file(str(locked), password="secret")
    cfg = _config(tmp_path, {"garbled": {**_device(a, tmp_path), "key_file": str(tmp_path / "not_a_key")},
                             "locked": {**_device(a, tmp_path), "key_file": str(locked)}})
    with pytest.raises(LoginError, match="key_file .*not_a_key is not a private key this tool can read"):
        Remote(cfg.device("garbled"), tmp_path / "known_hosts").connect()
    with pytest.raises(LoginError, match="key_file .*locked_key is encrypted; load it into ssh-agent"):
        Remote(cfg.device("locked"), tmp_path / "known_hosts").connect()
    assert format_checks(check_devices(cfg)).count(": LOGIN FAILED") == 2


def test_a_relative_key_file_is_found_beside_the_config_as_known_hosts_is(servers, tmp_path, monkeypatch):
    """``key_file = "keys/id"`` is read from the config file's folder, as a relative known_hosts is, whatever the
    current folder (it was read from the current folder: "key_file keys/id not found")."""
    import shutil

    a, _ = servers
    project = tmp_path / "project"
    (project / "keys").mkdir(parents=True)
    shutil.copy(a.client_key, project / "keys" / "id")
    _device(a, project)  # writes project/known_hosts
    cfg = _config(project, {"d": {**_device(a, project), "key_file": "keys/id", "known_hosts": "known_hosts"}},
                  batch_sizes=(1,))
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    (check,) = check_devices(cfg, ["d"])
    assert check.reachable and not check.login_failed, check.message
    (desc,) = _descriptions(project, ["alpha"])
    # its one row measured already (the key file is what is tested, not a measurement, which costs a fresh torch):
    # the profile still logs in, writes the row to the device and runs the runner there, which measures nothing
    results.append_row(results.results_path(cfg.profiling_dir, "d"), {
        "device": "d", "backend": "cpu", "network": "alpha", "family": "tiny", "batch_size": "1",
        "input_shape": "3x16x16", "phase": "train", "description_sha": results.file_sha(desc.read_bytes()),
        "status": "ok", "latency_ms_median": "1.5", "timestamp": "2026-01-01T00:00:00+00:00"})
    (summary,) = profile_devices(cfg, ["d"], [desc], show_progress=False, **FAST)
    assert summary.status == "done" and (summary.rows, summary.new_rows) == (1, 0), format_summaries([summary])
    assert '"event":"already"' in (project / "remote work" / "d" / "run.log").read_text()


def test_ssh_messages_name_a_devices_table_as_toml_reads_it_and_the_bars_print_names_as_text(tmp_path,
                                                                                          monkeypatch):
    """A device named with a space: the SSH messages wrote [devices.jetson tx2], which is no TOML; they write
    [devices."jetson tx2"]. The progress bars read a device's or a network's name as rich markup ("[b]" vanished);
    they print it as it is. No server: nothing listens on the port, and each message comes before any login."""
    import io

    from rich.console import Console

    from perf4sight.errors import UserError
    from perf4sight.profiling import fleet
    from perf4sight.profiling.local import profile_local, progress_bars
    folder = tmp_path / "a-folder"
    folder.mkdir()
    cfg = _config(tmp_path, {"jetson tx2": {"host": "127.0.0.1", "port": free_port(), "key_file": str(folder)}},
                  probe_cached=False)
    table = r'\[devices\."jetson tx2"\]'
    with pytest.raises(HostKeyError, match=rf"or set accept_new_host_key = true in {table}$"):
        Remote(cfg.device("jetson tx2"), tmp_path / "known_hosts").connect()
    dev = cfg.device("jetson tx2")
    dev.accept_new_host_key = True
    with pytest.raises(LoginError, match=rf"set key_file in {table} to the private key$"):
        Remote(dev, tmp_path / "known_hosts").connect()
    dev.key_file = ""
    with pytest.raises(DeviceError, match=rf"check host and port in {table}, and that sshd runs"):
        Remote(dev, tmp_path / "known_hosts").connect()
    with pytest.raises(UserError, match=rf"config.toml: {table} has host '127.0.0.1': profile it with the remote"):
        profile_local(cfg, "jetson tx2", [])
    monkeypatch.setitem(sys.modules, "perf4sight.profiling.remote", None)  # as without paramiko: an ImportError
    with pytest.raises(UserError, match=rf"reached over SSH \({table} host\), which needs paramiko"):
        fleet._require_ssh(dev)
    bars = progress_bars()
    bars.add_task("profile [b]dev", total=2, note="[b]net @ 1: ok")
    shown = Console(file=io.StringIO(), width=200)
    shown.print(bars.get_renderable())
    assert "profile [b]dev" in shown.file.getvalue() and "[b]net @ 1: ok" in shown.file.getvalue()


class _FolderRemote:
    """The SFTP calls the profiler's shipping makes, on a folder of this machine (the device's work folder)."""

    def makedirs(self, path: str) -> None:
        Path(path).mkdir(parents=True, exist_ok=True)

    def size(self, path: str) -> int | None:
        return Path(path).stat().st_size if Path(path).is_file() else None

    def put_bytes(self, data: bytes, path: str) -> None:
        Path(path).write_bytes(data)


def test_a_description_rewritten_after_the_profile_began_is_shipped_as_it_was_read(tmp_path):
    """The profiler takes the descriptions' shas when it is made and shipped the files later (after following a run
    it attached to): a file rewritten meanwhile (the networks stage again) went with its new bytes, whose rows the
    profile did not expect. The bytes read for the shas are shipped."""
    cfg = _config(tmp_path, {"d": {"host": "127.0.0.1", "port": free_port()}}, probe_cached=False)
    (desc,) = _descriptions(tmp_path, ["alpha"])
    before = desc.read_bytes()
    profiler = RemoteProfiler(cfg, cfg.device("d"), [desc])
    save_description(describe(_net(9), [3, 16, 16], name="alpha", network="tiny"), desc)
    assert desc.read_bytes() != before
    profiler.remote, profiler.run_dir = _FolderRemote(), str(tmp_path / "device")
    profiler._ship()
    sha = results.file_sha(before)
    assert [p.name for p in (tmp_path / "device" / "nets").iterdir()] == [f"{sha}.json"]
    assert (tmp_path / "device" / "nets" / f"{sha}.json").read_bytes() == before
    assert json.loads((tmp_path / "device" / "plan.json").read_text())["networks"] == [f"nets/{sha}.json"]
    assert {key[-1] for key in profiler.expected} == {sha, ""}


def test_a_folder_given_as_key_file_or_known_hosts_is_named_a_folder(servers, tmp_path):
    """A folder as key_file or known_hosts is one line saying so (they read "not found", "does not exist; create
    it", or, accepting new keys, "Is a directory ... check host and port"); a known_hosts that cannot be written
    when accepting a new key says which file and why."""
    a, _ = servers
    folder = tmp_path / "a-folder"
    folder.mkdir()
    cfg = _config(tmp_path, {"d": {**_device(a, tmp_path), "key_file": str(folder)}})
    with pytest.raises(LoginError, match=rf"^device 'd': key_file {folder} is a folder, not a file: set key_file"):
        Remote(cfg.device("d"), tmp_path / "known_hosts").connect()
    for accept in (False, True):
        cfg = _config(tmp_path, {"d": {**_device(a, tmp_path), "known_hosts": str(folder),
                                       "accept_new_host_key": accept}})
        with pytest.raises(HostKeyError, match=rf"^device 'd': known_hosts {folder} is a folder, not a file: set"):
            Remote(cfg.device("d"), folder).connect()
        assert "is a folder, not a file" in format_checks(check_devices(cfg, ["d"]))
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    cfg = _config(tmp_path, {"d": {**_device(a, tmp_path), "known_hosts": str(blocker / "known_hosts"),
                                   "accept_new_host_key": True}})
    with pytest.raises(HostKeyError, match=rf"cannot record the host key of .* in {blocker}/known_hosts: "
                                           rf".*File exists: '{blocker}'"):
        Remote(cfg.device("d"), blocker / "known_hosts").connect()


def test_connection_errors_without_a_message_still_say_something():
    from perf4sight.profiling.ssh import describe_error
    assert describe_error(socket.timeout()) == "timed out waiting for the device"
    assert describe_error(EOFError()) == "EOFError"
    assert describe_error(OSError("Network is\nunreachable")) == "Network is unreachable"


def test_command_without_reply_says_what_timed_out(servers, tmp_path):
    a, _ = servers
    kh = tmp_path / "known_hosts"
    kh.write_text(a.known_hosts_line)
    cfg = _config(tmp_path, {"d": {**_device(a, tmp_path), "known_hosts": str(kh)}})
    with Remote(cfg.device("d"), kh) as r:
        t0 = time.monotonic()
        with pytest.raises(socket.timeout, match=r"no reply to 'sleep' within 1 s"):
            r.run(["sleep", "30"], timeout_s=1)
        assert time.monotonic() - t0 < 10


# --- hostile names, unreachable device, check -------------------------------------------------
def test_hostile_names_cannot_run_commands_and_unreachable_device_fails_fast(servers, tmp_path):
    a, _ = servers
    # a device or network name is a file name (no '/', refused at config load): the canaries are relative, so
    # look where a shell would run them
    evil_dev = "lab 1'; touch pwned1; echo '\"$(touch pwned2)\""
    evil_net = "net $(touch pwned3); touch pwned4 `touch pwned5`"
    descs = _descriptions(tmp_path, [evil_net])
    dead = {"host": "127.0.0.1", "port": free_port(), "user": a.user, "key_file": str(a.client_key),
            "known_hosts": str(tmp_path / "known_hosts"), "python": DEVICE_PYTHON}
    cfg = _config(tmp_path, {evil_dev: _device(a, tmp_path, workdir=str(tmp_path / "w; touch x" / "it's")),
                             "gone": dead}, batch_sizes=[1], probe_cached=False)  # its work folder made by the run
    t0 = time.monotonic()
    good, gone = profile_devices(cfg, [evil_dev, "gone"], descs, show_progress=False, **FAST)
    assert gone.status == "unreachable" and "cannot reach root@127.0.0.1" in gone.message
    assert "refused" in gone.message and gone.elapsed_s < 5
    assert good.status == "done", good.message
    assert [(r["device"], r["network"], r["status"]) for r in _rows(cfg, evil_dev)] == [(evil_dev, evil_net, "ok")]
    assert (tmp_path / "w; touch x" / "it's" / remote_dir_name(evil_dev) / "measurements.csv").is_file()
    assert not Path("x").exists()
    assert not [*Path.home().glob("pwned[1-5]"), *Path.cwd().glob("pwned[1-5]"), *tmp_path.rglob("pwned[1-5]")]
    assert time.monotonic() - t0 < 60
    summary = format_summaries([good, gone])
    assert "gone: unreachable" in summary and "1/1 rows" in summary


def test_check_reports_versions_disk_and_unreachable(servers, tmp_path):
    a, _ = servers
    dead = {**_device(a, tmp_path), "port": free_port()}
    cfg = _config(tmp_path, {"live": _device(a, tmp_path, backend="nvml"), "dead": dead, "here": {}})
    live, gone, here = check_devices(cfg, ["live", "dead", "here"])
    version = subprocess.run([DEVICE_PYTHON, "-c", "import platform; print(platform.python_version())"],
                             capture_output=True, text=True, check=True).stdout.strip()
    assert live.reachable and live.facts["python"] == version
    assert live.facts["torch"] and live.facts["free_disk_mb"] > 0
    assert live.facts["memory_mb"] > 100 and live.facts["swap_mb"] >= 0          # /proc/meminfo of the device
    assert not live.ok and "pynvml not importable" in live.message  # no NVIDIA library on this host
    assert not gone.reachable and "cannot reach" in gone.message
    assert "check host and port in [devices.dead], and that sshd runs on the device" in gone.message  # the fix
    assert here.reachable and here.where == "this machine" and here.ok
    text = format_checks([live, gone, here])
    assert "dead [cpu]" in text and "UNREACHABLE" in text and "free disk" in text
    assert ", pynvml missing" in text  # the library the backend needs, named as missing (not as if it were there)
    assert f"memory {live.facts['memory_mb']:.0f} MiB, swap {live.facts['swap_mb']:.0f} MiB" in text


def test_a_check_that_fails_on_one_device_leaves_the_others_theirs(tmp_path, monkeypatch):
    """check: a probe of this machine that never answers, or a bug on one device, is that device's line; either
    raised out of check_devices (a traceback, and no line for the other devices)."""
    (tmp_path / "kh").write_text("")
    cfg = _config(tmp_path, {"slow": {}, "odd": {"backend": "nvml"},
                             "gone": {"host": "127.0.0.1", "port": free_port(), "known_hosts": str(tmp_path / "kh")}})

    def probe(argv, **kwargs):
        if argv[3] == "cpu":  # slow's probe: python -c PROBE BACKEND WORKDIR
            raise subprocess.TimeoutExpired(argv, kwargs["timeout"])
        return subprocess.CompletedProcess(argv, 0, "[]\n", "")  # odd's: facts that are no dict, a bug downstream
    monkeypatch.setattr(subprocess, "run", probe)
    slow, odd, gone = check_devices(cfg, ["slow", "odd", "gone"])
    assert slow.message == f"device 'slow': no reply from the probe ({sys.executable}) within 120 s" and not slow.ok
    assert odd.message == "device 'odd': AttributeError: 'list' object has no attribute 'get'" and not odd.ok
    assert "cannot reach" in gone.message and not gone.reachable


# --- pieces -------------------------------------------------------------------------------------
def test_quote_argv_keeps_each_word_whole(tmp_path):
    words = ["a b", "it's", '"q"', "$(touch x)", "; rm -rf /", "`id`", "\\", "", "~"]
    script = quote_argv([sys.executable, "-c", "import json,sys; print(json.dumps(sys.argv[1:]))", *words])
    done = subprocess.run(["sh", "-c", script], capture_output=True, text=True, cwd=tmp_path)
    assert json.loads(done.stdout) == words and not (tmp_path / "x").exists()


def test_puller_takes_complete_records_once(tmp_path):
    row = {c: "" for c in results.COLUMNS}
    row.update(device="d", network="n", batch_size="1", input_shape="3x8x8", phase="train", status="error",
               message='boom\nline two, "quoted"', timestamp="2026-01-01T00:00:00+00:00")
    row2 = {**row, "batch_size": "2", "status": "ok", "message": ""}
    data = rows_to_csv([row, row2], with_header=True)
    assert complete_records(data[:-5]) < complete_records(data) == len(data)
    remote = bytearray(data[:-5])  # second row still being written
    puller = CsvPuller(tmp_path / "local.csv")
    pull = lambda: puller.pull(lambda: len(remote), lambda off: bytes(remote[off:]))  # noqa: E731
    assert [r["batch_size"] for r in pull()] == ["1"]
    remote[:] = data
    assert [r["batch_size"] for r in pull()] == ["2"]
    puller.reset()  # as after a reconnect: re-reading everything adds nothing
    assert pull() == []
    local = results.read_rows(tmp_path / "local.csv")
    assert [r["message"] for r in local] == [row["message"], ""]
    again = {**row, "status": "ok", "message": "", "timestamp": "2026-01-02T00:00:00+00:00"}  # measured again
    remote[:] = data + rows_to_csv([again], with_header=False)
    assert [r["status"] for r in pull()] == ["ok"] and pull() == []
    puller.reset()
    assert pull() == [] and len(results.read_rows(tmp_path / "local.csv")) == 3


def test_two_pullers_of_one_device_copy_each_row_once(tmp_path):
    """Two profiles of one device at once (refused now: the profile lock) each made a puller that read the local CSV
    once, when it was made, and both appended every row the device wrote: 24 rows of 12 keys. A puller now reads
    the local file again before appending where someone else wrote it meanwhile."""
    row = {c: "" for c in results.COLUMNS}
    row.update(device="d", network="n", input_shape="3x8x8", phase="train", status="ok",
               timestamp="2026-01-01T00:00:00+00:00")
    remote = rows_to_csv([{**row, "batch_size": str(b)} for b in (1, 2, 4)], with_header=True)
    first, second = CsvPuller(tmp_path / "local.csv"), CsvPuller(tmp_path / "local.csv")
    assert len(first.pull(lambda: len(remote), lambda off: remote[off:])) == 3
    assert second.pull(lambda: len(remote), lambda off: remote[off:]) == []
    assert [r["batch_size"] for r in results.read_rows(tmp_path / "local.csv")] == ["1", "2", "4"]


def test_a_row_cut_short_inside_quotes_hides_no_row_after_it(tmp_path):
    """A crash or a full disk can leave a row unfinished inside a quoted field (an error's message, a Jetson's
    clocks). The next row appended, locally or on the device, replaces it; the host's rewrite of a device's CSV drops
    it too; and a puller whose reads are capped reads on to the end of the file."""
    row = {c: "" for c in results.COLUMNS}
    row.update(device="d", network="n", batch_size="1", input_shape="3x8x8", phase="train", status="ok",
               clocks='{"gpu": 1300}', timestamp="2026-01-01T00:00:00+00:00")
    path = tmp_path / "m.csv"
    results.append_row(path, row)
    whole = path.read_bytes()
    cut = rows_to_csv([{**row, "batch_size": "2"}], with_header=False)
    path.write_bytes(whole + cut[:cut.index(b'"') + 4])  # cut short after an opening quote
    for bs in ("4", "8"):
        results.append_row(path, {**row, "batch_size": bs})
    assert [r["batch_size"] for r in results.read_rows(path)] == ["1", "4", "8"]
    assert path.read_bytes().startswith(whole) and path.read_bytes().count(b"\n") == 4
    torn = whole + cut[:cut.index(b'"') + 4]
    assert csv_with_rows(torn, [{**row, "batch_size": "2"}]) == whole + cut
    remote = path.read_bytes()
    puller = CsvPuller(tmp_path / "local.csv")
    capped = lambda off: remote[off:off + 700]  # noqa: E731  (the header's 480 bytes, a row's ~150)
    assert len(remote) > 700 and [r["batch_size"] for r in puller.pull(lambda: len(remote), capped)] == ["1", "4", "8"]


def test_unreachable_remote_raises_device_error_quickly(tmp_path):
    cfg = _config(tmp_path, {"d": {"host": "127.0.0.1", "port": free_port(), "known_hosts": str(tmp_path / "kh"),
                                   "accept_new_host_key": True}})
    t0 = time.monotonic()
    with pytest.raises(DeviceError, match="cannot reach 127.0.0.1.*refused"):
        Remote(cfg.device("d"), tmp_path / "kh", timeout_s=3).connect()
    assert time.monotonic() - t0 < 3


def test_reconnecting_gives_up_after_the_devices_own_timeout(tmp_path):
    """[devices.X] reconnect_timeout_s bounds how long a dropped connection is retried."""
    cfg = _config(tmp_path, {"d": {"host": "127.0.0.1", "port": free_port(), "known_hosts": str(tmp_path / "kh"),
                                   "accept_new_host_key": True, "reconnect_timeout_s": 1.5}})
    profiler = RemoteProfiler(cfg, cfg.device("d"), [], connect_timeout_s=1.0)
    t0 = time.monotonic()
    with pytest.raises(DeviceError, match=r"refused .*\(gave up reconnecting after 1.5 s; the run goes on on the "
                                          r"device if it was started: rerun the profile stage to follow it"):
        profiler._reconnect()
    assert 1.5 <= time.monotonic() - t0 < 10


def test_shipped_code_needs_only_torch(tmp_path):
    """What goes to a device imports without paramiko, rich, scikit-learn, pandas or torchvision."""
    from perf4sight.profiling.remote import code_files

    for local, rel in code_files():
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).write_bytes(local.read_bytes())
    assert not list(tmp_path.rglob("ssh.py")) and not list(tmp_path.rglob("remote.py"))
    blocker = ("import sys\nclass B:\n def find_spec(self, name, path=None, target=None):\n"
               "  if name.split('.')[0] in {'paramiko','rich','sklearn','pandas','torchvision','matplotlib',"
               "'skops','torch_pruning'}: raise ImportError('blocked ' + name)\nsys.meta_path.insert(0, B())\n"
               "import perf4sight.profiling.runner, perf4sight.profiling.child, perf4sight.profiling.detach\n"
               "import perf4sight.profiling.backends.cpu, perf4sight.profiling.backends.nvml\n"
               "import perf4sight.profiling.backends.jetson, perf4sight.ir.to_torch\nprint('ok')\n")
    done = subprocess.run([DEVICE_PYTHON, "-c", blocker], capture_output=True, text=True, cwd=tmp_path,
                          env={"PYTHONPATH": str(tmp_path), "PATH": os.environ.get("PATH", "")})
    assert done.stdout.strip() == "ok", done.stderr[-500:]


def _vermin(paths: list) -> subprocess.CompletedProcess:
    """vermin (it reads code, runs none) on ``paths``: does any need a Python newer than 3.6? Annotations
    count as evaluated (no ``from __future__ import annotations`` before 3.7); ``dataclasses`` is allowed,
    because torch's wheels for 3.6 install its backport."""
    argv = ["--no-tips", "--violations", "--eval-annotations", "-t=3.6-", "--exclude", "dataclasses",
            *map(str, paths)]
    code = "import sys, vermin; sys.argv = ['vermin'] + sys.argv[1:]; sys.exit(vermin.main())"
    return subprocess.run([sys.executable, "-c", code, *argv], capture_output=True, text=True)


def test_shipped_code_needs_no_python_newer_than_3_6(tmp_path):
    """A Jetson TX2 on JetPack 4.6 has Python 3.6: what goes to a device must run there (the runner's code, and the
    probe, sent as a ``python -c`` script)."""
    from perf4sight.profiling.remote import PROBE, code_files

    done = _vermin([local for local, _ in code_files()] + [PROBE])
    assert done.returncode == 0, done.stdout[-1500:] + done.stderr[-500:]
    newer = tmp_path / "newer.py"  # the check can fail: a builtin generic in an evaluated annotation is 3.9+
    newer.write_text("def f(x: list[int]) -> None:\n    pass\n")
    assert _vermin([newer]).returncode != 0


def test_makedirs_accepts_a_folder_another_client_made_meanwhile(servers, tmp_path):
    """Two devices on one host share a workdir: one's mkdir can lose the race to the other's. The real
    SFTP server answers that mkdir with a bare "Failure"; makedirs must take the folder as made."""
    a, _ = servers
    cfg = _config(tmp_path, {"d": _device(a, tmp_path)})
    target = tmp_path / "shared work" / "dev-x"
    with Remote(cfg.device("d"), Path(cfg.device("d").known_hosts)) as r:
        (tmp_path / "shared work").mkdir()  # made by "the other client" after our check
        real_stat, seen = r.sftp.stat, []
        shared = str(tmp_path / "shared work")

        def stat_missing_once(path):
            if path == shared and path not in seen:
                seen.append(path)
                raise FileNotFoundError(path)  # what our check saw just before the other client's mkdir
            return real_stat(path)

        r.sftp.stat = stat_missing_once
        r.makedirs(str(target))
        assert seen == [shared] and target.is_dir()
        assert r.is_dir(str(target)) and not r.is_dir(str(tmp_path / "nope"))
        (tmp_path / "file.txt").write_text("x")
        # a real failure still fails, and says why (SFTP's own words were "No such file")
        with pytest.raises(NotADirectoryError, match=r"file.txt is a file, not a folder"):
            r.makedirs(str(tmp_path / "file.txt" / "sub"))


def test_device_csv_with_older_columns_is_upgraded_before_the_run_and_repeats_and_references_travel(servers, tmp_path,
                                                                                                 monkeypatch):
    """A device CSV written before `repeats` (and the load average) existed: its rows count as measured and survive,
    the file gets today's header before the runner starts, and the new row is the median of 2 fresh processes. A
    drift reference taken before and after that one new measurement comes back beside it, and so do the CPU's op
    prices, measured on the device after the sweep. A load average fixed here (PERF4SIGHT_LOAD_AVG) holds for the
    device's runner too, so no test reads the machine's."""
    import csv
    from perf4sight.profiling.runner import LOAD_ENV
    monkeypatch.setenv(LOAD_ENV, "12.5")
    a, _ = servers
    (desc,) = _descriptions(tmp_path, ["alpha"])
    # one thread: the op prices at torch's default of one per core cost 3-4 times the CPU on a busy 2-core machine
    cfg = _config(tmp_path, {"dev-old": _device(a, tmp_path, threads=1)}, op_prices=True)
    cfg.profile.repeats = 2
    cfg.profile.reference_every = 1
    old_columns = [c for c in results.COLUMNS
                   if c not in ("repeats", "latency_ms_repeat_cv", "load_avg_1m", "cpu_count")]
    remote_csv = tmp_path / "remote work" / "dev-old" / "measurements.csv"
    remote_csv.parent.mkdir(parents=True, exist_ok=True)  # the probe cache made it
    old_row = {"device": "dev-old", "network": "alpha", "family": "tiny", "batch_size": "1",
               "input_shape": "3x16x16", "phase": "train", "status": "ok", "latency_ms_median": "1.5",
               "timestamp": "2026-01-01T00:00:00+00:00"}
    with remote_csv.open("w", newline="") as fh:
        writer = csv.DictWriter(fh, fieldnames=old_columns)
        writer.writeheader()
        writer.writerow({k: old_row.get(k, "") for k in old_columns})
    (summary,) = profile_devices(cfg, ["dev-old"], [desc], show_progress=False, **FAST)
    assert summary.status == "done", format_summaries([summary])
    with remote_csv.open(newline="") as fh:
        assert next(csv.reader(fh)) == results.COLUMNS
    rows = {r["batch_size"]: r for r in _rows(cfg, "dev-old")}
    assert set(rows) == {"1", "2"} and rows["1"]["timestamp"] == old_row["timestamp"]
    assert rows["2"]["status"] == "ok" and rows["2"]["repeats"] == "2" and float(rows["2"]["latency_ms_repeat_cv"]) >= 0
    assert (rows["1"]["load_avg_1m"], rows["2"]["load_avg_1m"], rows["2"]["cpu_count"]) == ("", "12.5",
                                                                                          str(os.cpu_count()))
    assert {r["batch_size"] for r in results.read_rows(remote_csv)} == {"1", "2"}
    refs = results.read_rows(results.references_path(cfg.profiling_dir, "dev-old"))
    assert [(r["network"], r["batch_size"], r["status"]) for r in refs] == [("alpha", "1", "ok")] * 2
    assert refs == results.read_rows(remote_csv.parent / "references.csv")
    pulled = results.op_prices_path(cfg.profiling_dir, "dev-old")
    assert pulled.read_bytes() == (remote_csv.parent / "op_prices.json").read_bytes()
    assert set(load_op_prices(pulled)) == set(PRICED_OPS) and json.loads(pulled.read_text())["threads"] == 1

