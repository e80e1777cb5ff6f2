"""Remote profiling over real SSH (the servers of test_remote.py, started again for this file): what a profile
counts as new where it pulls rows an earlier run measured, a connection dropped while the run is set up, and
``--remeasure`` on an SSH device."""
from __future__ import annotations

import csv
import io
import sys
import time
from pathlib import Path

import pytest

from perf4sight.errors import UserError
from perf4sight.profiling import results
from perf4sight.profiling.fleet import format_summaries, profile_devices, supersede
from perf4sight.profiling.pull import csv_with_rows
from perf4sight.profiling.remote import RemoteProfiler

sys.path.insert(0, str(Path(__file__).parent))
import test_remote  # noqa: E402
from test_remote import FAST, _config, _descriptions, _device, _rows  # noqa: E402

#: The first half's two sshd, started again for this file (a module's fixture).
servers = test_remote.servers


def test_rows_an_earlier_run_measured_are_counted_as_pulled_not_new(servers, tmp_path):
    """The local CSV removed (as the busy-host note said to do), a rerun measures nothing and copies the device's
    rows back: it said "(1 new)"; it says 0 new and 1 pulled, and a run it starts counts its rows as new."""
    a, _ = servers
    cfg = _config(tmp_path, {"dev-n": _device(a, tmp_path)}, batch_sizes=(1,))
    (desc,) = _descriptions(tmp_path, ["alpha"])
    (first,) = profile_devices(cfg, ["dev-n"], [desc], show_progress=False, **FAST)
    assert (first.status, first.new_rows, first.pulled) == ("done", 1, 0), format_summaries([first])
    results.results_path(cfg.profiling_dir, "dev-n").unlink()
    (again,) = profile_devices(cfg, ["dev-n"], [desc], show_progress=False, **FAST)
    assert format_summaries([again]) == ("dev-n: done — 1/1 rows (0 new, 1 pulled that an earlier profile's run "
                                         "measured on the device) [ok 1]")
    assert len(_rows(cfg, "dev-n")) == 1


def test_a_connection_dropped_while_the_run_is_set_up_is_reconnected_and_the_run_measures(servers, tmp_path,
                                                                                       monkeypatch):
    """The connection cut once while the networks and the plan are shipped failed the device at once (only the
    measurement phase reconnected); setup now reconnects as the measurement phase does and ships again, and the
    run measures the plan in that one profile."""
    a, _ = servers
    cfg = _config(tmp_path, {"dev-r": _device(a, tmp_path)}, batch_sizes=(1,))
    (desc,) = _descriptions(tmp_path, ["alpha"])
    ship, cuts = RemoteProfiler._ship, []

    def cut_once_then_ship(self) -> None:
        if not cuts:
            cuts.append(a.cut_connections())
            time.sleep(0.5)  # the client sees the channel close
        ship(self)
    monkeypatch.setattr(RemoteProfiler, "_ship", cut_once_then_ship)
    (summary,) = profile_devices(cfg, ["dev-r"], [desc], show_progress=False, **FAST)
    assert cuts and cuts[0] >= 1
    assert format_summaries([summary]) == "dev-r: done — 1/1 rows (1 new, 1 reconnect) [ok 1]"
    assert len(_rows(cfg, "dev-r")) == 1


def test_the_log_tail_says_why_the_last_run_stopped(tmp_path, monkeypatch):
    """``_log_tail`` (each log line parsed once): the last run's error event, else its last line that is no event (a
    traceback's), "" where it stopped between events; an earlier run's error is not the last run's."""
    cfg = _config(tmp_path, {"d": {"host": "127.0.0.1", "known_hosts": str(tmp_path / "kh")}})
    profiler = RemoteProfiler(cfg, cfg.device("d"), [])
    plan, row = '{"event": "plan", "total": 2}', '{"event": "row", "index": 1}'
    for lines, said in (([plan, '{"event": "error", "message": "earlier"}', plan, row], ""),
                        ([plan, row, "Traceback (most recent call last):", "  MemoryError:   out  "],
                         "MemoryError: out"),
                        ([plan, '{"event": "error", "message": "bad plan"}', row], "bad plan"),
                        ([plan, "null"], "None")):
        monkeypatch.setattr(profiler, "_log_lines", lambda lines=lines: lines)
        assert profiler._log_tail() == said
    monkeypatch.setattr(profiler, "_log_lines", lambda: None)
    assert profiler._log_tail() == "unavailable"


def test_remeasure_on_an_ssh_device_takes_the_rows_off_its_own_csv_and_measures_them_again(servers, tmp_path):
    """``--remeasure`` of an SSH device: the local row moves to superseded.csv, the device's own CSV loses it too
    (else its runner counts it as measured and the puller brings it back), the run measures it again and the new
    row comes over alone; the other batch size stays where it was, on both sides."""
    a, _ = servers
    cfg = _config(tmp_path, {"dev-m": _device(a, tmp_path)}, batch_sizes=(1, 2))
    (desc,) = _descriptions(tmp_path, ["alpha"])
    (first,) = profile_devices(cfg, ["dev-m"], [desc], show_progress=False, **FAST)
    assert first.status == "done" and first.new_rows == 2, format_summaries([first])
    before = _rows(cfg, "dev-m")
    time.sleep(1.1)  # a new row's timestamp (whole seconds) differs from the old one's
    (again,) = profile_devices(cfg, ["dev-m"], [desc], show_progress=False, remeasure={"alpha": {2}}, **FAST)
    assert format_summaries([again]) == "dev-m: done — 2/2 rows (1 new) [ok 2]"
    assert again.superseded == 1
    after = _rows(cfg, "dev-m")
    assert len(after) == 2 and after[0] == before[0] and after[1]["batch_size"] == "2" and after[1] != before[1]
    local_aside = results.results_path(cfg.profiling_dir, "dev-m").with_name("superseded.csv")
    assert results.read_rows(local_aside) == [before[1]]
    on_device = results.read_rows(tmp_path / "remote work" / "dev-m" / "measurements.csv")
    assert [r["timestamp"] for r in on_device] == [r["timestamp"] for r in after]


def _csv_lines(folder: Path, device: str) -> list[bytes]:
    """A measurement CSV of ``alpha`` (the network of ``_descriptions``) on ``device`` at batch sizes 1 and 2, as
    append_row writes it: its header and its two rows, each line's bytes."""
    scratch = folder / f"{device}-lines.csv"
    for bs in (1, 2):
        results.append_row(scratch, {"device": device, "backend": "cpu", "network": "alpha", "batch_size": bs,
                                     "input_shape": "3x16x16", "status": "ok", "message": "MSG",
                                     "latency_ms_median": 1.5 * bs, "timestamp": f"2026-11-30T10:00:0{bs}Z"})
    data = scratch.read_bytes()
    scratch.unlink()
    return data.splitlines(keepends=True)


def _csv_rows(header: bytes, *lines: bytes) -> list[dict]:
    return list(csv.DictReader(io.StringIO((header + b"".join(lines)).decode(), newline="")))


def test_remeasure_keeps_every_other_byte_of_a_damaged_csv_here_and_on_the_device(tmp_path, monkeypatch):
    """``--remeasure`` rewrote the CSV it took rows from twice over (here: decoded past a byte-order mark and written
    again without it, a last line cut short dropped; on an SSH device: undecodable bytes replaced in every line kept,
    the cut-short line dropped, and with a byte-order mark the row asked for not found, so the device's runner took it
    as measured). Both now go through results.take_rows: the row leaves, every other byte stays. Here a file that is
    not UTF-8 is refused whole, in one line, as every stage refuses it; nothing moves."""
    cfg = _config(tmp_path, {"here": {"backend": "cpu"},
                             "dev": {"host": "127.0.0.1", "known_hosts": str(tmp_path / "kh")}}, batch_sizes=(1, 2))
    (desc,) = _descriptions(tmp_path, ["alpha"])
    for device in ("here", "dev"):
        header, one, two = _csv_lines(tmp_path, device)
        damaged = {"bom": (b"\xef\xbb\xbf" + header, one, two, b""),
                   "undecodable byte": (header, one.replace(b"MSG", b"M\xffG"), two, b""),
                   "cut-short last line": (header, one, two, one[:60])}
        for how, (head, first, second, tail) in damaged.items():
            path = results.results_path(cfg.profiling_dir, device)
            aside = path.with_name("superseded.csv")
            if aside.exists():
                aside.unlink()
            data, rest = head + first + second + tail, head + first + tail
            if device == "here":
                path.parent.mkdir(parents=True, exist_ok=True)
                path.write_bytes(data)
                if how == "undecodable byte":
                    with pytest.raises(UserError, match="not UTF-8 text"):
                        supersede(cfg, cfg.device(device), [desc], {"alpha": {2}})
                    assert path.read_bytes() == data and not aside.exists()
                    continue
                moved = supersede(cfg, cfg.device(device), [desc], {"alpha": {2}})
                assert path.read_bytes() == rest, how
            else:
                stored = {"csv": data}
                profiler = RemoteProfiler(cfg, cfg.device(device), [desc], superseded=_csv_rows(header, second))
                profiler.run_dir = "/work/dev"
                monkeypatch.setattr(profiler.remote, "read_from", lambda p, off, limit=0: stored["csv"][off:])
                monkeypatch.setattr(profiler.remote, "put_bytes", lambda b, p: stored.update(csv=b))
                profiler.puller.copied.clear()  # the device's row was not here: it joins superseded.csv here
                profiler._supersede_on_device()
                assert stored["csv"] == rest, how
                moved = results.read_rows(aside)
            assert [(r["batch_size"], r["timestamp"]) for r in moved] == [("2", "2026-11-30T10:00:02Z")], how
            assert [r["batch_size"] for r in results.read_rows(aside)] == ["2"], how
    assert csv_with_rows(b"\xef\xbb\xbf" + header + one, []) == b"\xef\xbb\xbf" + header + one  # the puller too


def test_a_plain_rerun_after_a_remeasure_that_failed_measures_the_row_the_device_still_held(servers, tmp_path,
                                                                                            monkeypatch):
    """``--remeasure`` moved the row here, then the device's profile failed before it took the row off the device's
    own CSV (unreachable, say): the plain rerun the failure asks for pulled the old row back ("1 pulled") instead of
    measuring it, the same row then in the measurements and in superseded.csv. A row superseded.csv holds is now
    taken off the device and never pulled back, by any profile: the rerun measures it."""
    from perf4sight.profiling.ssh import DeviceError

    a, _ = servers
    cfg = _config(tmp_path, {"dev-f": _device(a, tmp_path)}, batch_sizes=(1,))
    (desc,) = _descriptions(tmp_path, ["alpha"])
    old = {"device": "dev-f", "backend": "cpu", "network": "alpha", "batch_size": 1, "input_shape": "3x16x16",
           "status": "ok", "latency_ms_median": 1.5, "timestamp": "2026-11-30T10:00:00+00:00",
           "description_sha": results.file_sha(desc.read_bytes())}  # as the first profile wrote it, here and there
    for csv_path in (results.results_path(cfg.profiling_dir, "dev-f"), tmp_path / "remote work" / "dev-f" /
                     "measurements.csv"):
        results.append_row(csv_path, old)
    (old,) = _rows(cfg, "dev-f")
    set_up = RemoteProfiler._set_up

    def unreachable(self) -> None:
        raise DeviceError("device 'dev-f': cannot reach it")
    monkeypatch.setattr(RemoteProfiler, "_set_up", unreachable)
    (failed,) = profile_devices(cfg, ["dev-f"], [desc], show_progress=False, remeasure={"alpha": None}, **FAST)
    assert (failed.status, failed.superseded, failed.remeasure_left) == ("failed", 1, 1)
    monkeypatch.setattr(RemoteProfiler, "_set_up", set_up)
    (again,) = profile_devices(cfg, ["dev-f"], [desc], show_progress=False, **FAST)
    assert format_summaries([again]) == "dev-f: done — 1/1 rows (1 new) [ok 1]"
    (new,) = _rows(cfg, "dev-f")
    assert new["timestamp"] != old["timestamp"]
    assert results.read_rows(results.results_path(cfg.profiling_dir, "dev-f").with_name("superseded.csv")) == [old]
    on_device = results.read_rows(tmp_path / "remote work" / "dev-f" / "measurements.csv")
    assert [r["timestamp"] for r in on_device] == [new["timestamp"]]


def test_rows_a_pull_copied_before_the_connection_dropped_are_counted(tmp_path):
    """A pull appends each row here as it reads it; where the connection dropped later in that pull (at the drift
    reference's file, or a later stretch of a large CSV), the rows already copied were never counted: the next pull
    found them here, and the device's line said fewer new rows than the run measured. Counted as they are copied
    now. A stand-in for the SSH connection serves the device's files."""
    import dataclasses

    from perf4sight.profiling.pull import rows_to_csv

    cfg = _config(tmp_path, {"d": {"host": "127.0.0.1", "known_hosts": str(tmp_path / "kh")}}, batch_sizes=(1, 2))
    cfg = dataclasses.replace(cfg, profile=dataclasses.replace(cfg.profile, reference_every=1))
    (desc,) = _descriptions(tmp_path, ["alpha"])
    profiler = RemoteProfiler(cfg, cfg.device("d"), [desc])
    key = next(k for k in profiler.expected if k[-1])  # (device, network, batch, shape, phase, loss, sha)
    row = {"device": "d", "backend": "cpu", "network": key[1], "batch_size": key[2], "input_shape": key[3],
           "phase": key[4], "loss": key[5], "description_sha": key[6], "status": "ok", "timestamp": "t1"}
    files = {"/w/d/measurements.csv": rows_to_csv([row], with_header=True), "/w/d/references.csv": b"x"}

    class Link:  # the device's files; the connection drops at the drift reference's
        def size(self, path: str) -> int | None:
            return len(files[path]) if path in files else None

        def read_from(self, path: str, offset: int) -> bytes:
            if path.endswith(results.REFERENCES_CSV):
                raise EOFError()
            return files[path][offset:]

    profiler.remote, profiler.run_dir, profiler.started = Link(), "/w/d", True
    with pytest.raises(EOFError):
        profiler._pull()
    del files["/w/d/references.csv"]  # reconnected; the next pull finds the row here already
    profiler._pull()
    assert len(_rows(cfg, "d")) == 1 and profiler.summary.new_rows == 1
