"""Several devices at once: ``check_devices`` and ``profile_devices`` (the public API of issue 4).

Each SSH device is handled by its own thread (:class:`RemoteProfiler`); one failing device
never stops the others, and the result is one summary per device. Devices without a host are
the local machine and go through the local runner; only a device with a host imports the SSH modules
(paramiko). Progress is drawn with one rich progress bar per device when ``show_progress`` is true. Times in
seconds, disk in MiB.
"""
from __future__ import annotations

import difflib
import fcntl
import importlib
import os
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath
from typing import Any, Iterator, Sequence

from perf4sight.config import Config, DeviceConfig
from perf4sight.errors import UserError
from perf4sight.files import atomic_path
from perf4sight.ir.schema import load_description
from perf4sight.wording import device_table, plural
from perf4sight.profiling.local import progress_bars, stop_runners
from perf4sight.profiling.plan import training_phase
from perf4sight.profiling.results import (COLUMNS, SUPERSEDED_CSV, append_row, batch_size_of, read_rows,
                                         results_path, row_key, take_rows, written_key)
from perf4sight.profiling.outcome import (PROBE, PROBE_CACHE, DeviceSummary, covering, expected_keys, not_ready,
                                          plan_counts, probe_facts, probe_problems)

__all__ = ["DeviceCheck", "check_devices", "profile_devices", "device_lock", "import_lock", "refuse_another_backend",
           "format_checks", "format_summaries", "remeasure_specs", "supersede", "PROFILE_LOCK", "REMOTE_RUNS_GO_ON"]

#: The file in ``<profiling_dir>/<device>/`` that a profile of the device holds locked (:func:`device_lock`).
PROFILE_LOCK = "profile.lock"
#: What an interrupted profile of SSH devices leaves behind (the words ``KeyboardInterrupt`` carries to the CLI): their
#: detached runs go on measuring, and their rows come over when the profile stage is run again.
REMOTE_RUNS_GO_ON = ("measurements taken or pulled so far are on disk; a run started on an SSH device goes on "
                     "measuring there: rerun to resume and collect its rows")

@dataclass
class DeviceCheck:
    """What ``check`` found on one device; ``ok`` = reachable, torch and backend library present."""
    device: str
    backend: str
    where: str
    reachable: bool = False
    ok: bool = False
    host_key_refused: bool = False  # not connected because its host key is unknown, changed or unreadable
    login_failed: bool = False  # no usable key, or the device refused every key offered
    workdir: str = ""  # the device's work folder (the probe checks it can be created and written)
    message: str = ""
    facts: dict[str, Any] = field(default_factory=dict)  # python, torch, cuda, backend_library_version, free_disk_mb


def _selected(cfg: Config, names: Sequence[str] | None) -> list[DeviceConfig]:
    """The devices named (else ``[profile] devices``, else every configured one), each once: a device named twice
    would be profiled by two threads into one CSV (and refused by its own lock)."""
    chosen = dict.fromkeys(cfg.devices_to_profile(names))
    return [cfg.device(n) for n in chosen]


def _judge(check: DeviceCheck) -> DeviceCheck:
    f = check.facts
    problems = probe_problems(check.backend, f, check.workdir)
    if check.backend == "jetson" and f.get("backend_library_version") and not f.get("jtop_service"):
        check.message = "jtop service not active: rows will carry /proc/meminfo memory only"
    check.ok = not problems
    if problems:
        check.message = "; ".join(problems)
    return check


def _check_one(cfg: Config, dev: DeviceConfig, timeout_s: float) -> DeviceCheck:
    if not dev.host:
        # this machine writes its measurements under profiling_dir (workdir is a remote device's)
        check = DeviceCheck(dev.name, dev.backend, "this machine", reachable=True, workdir=str(cfg.profiling_dir))
        try:
            out, err, rc = _probe_here(dev, check.workdir, limit_s=max(timeout_s, 120))
        except UserError as exc:
            check.message = str(exc)
            return check
    else:
        try:
            _require_ssh(dev)
        except UserError as exc:
            return DeviceCheck(dev.name, dev.backend, dev.host, message=str(exc))
        from perf4sight.profiling.remote import key_file_path, known_hosts_path, remote_dir_name
        from perf4sight.profiling.ssh import CONNECTION_ERRORS, HostKeyError, LoginError, Remote, describe_error

        remote = Remote(dev, known_hosts_path(cfg, dev), timeout_s=timeout_s, key_file=key_file_path(cfg, dev))
        run_dir = str(PurePosixPath(dev.workdir) / remote_dir_name(dev.name))  # what profile creates and writes
        check = DeviceCheck(dev.name, dev.backend, remote.where, workdir=run_dir)
        try:
            with remote:
                check.reachable = True
                python = remote.expand(dev.python) if dev.python.startswith("~") else dev.python
                res = remote.run([python, "-c", PROBE.read_text(), dev.backend, run_dir], timeout_s=120)
                out, err, rc = res.stdout, res.stderr, res.rc
        except UserError as exc:
            check.message = str(exc)
            check.host_key_refused = isinstance(exc, HostKeyError)
            check.login_failed = isinstance(exc, LoginError)
            return check
        except CONNECTION_ERRORS as exc:
            check.message = f"device '{dev.name}': connection lost during check: {describe_error(exc)}"
            return check
    try:
        check.facts = probe_facts(dev.python, rc, out, err)
    except UserError as exc:
        check.message = str(exc)
        return check
    return _judge(check)


def _probe_here(dev: DeviceConfig, workdir: str, cache: str | None = None,
                limit_s: float = 120) -> tuple[str, str, int]:
    """(stdout, stderr, exit status) of ``probe.py`` for ``dev``'s backend run by this interpreter, the local runner's
    (``cache``: its torch facts' file, :data:`PROBE_CACHE`); ``UserError`` where it does not answer within
    ``limit_s``, as an SSH device's check says it (``ssh.Remote.run``)."""
    try:
        done = subprocess.run([sys.executable, "-c", PROBE.read_text(), dev.backend, workdir]
                              + ([cache] if cache else []), capture_output=True, text=True, timeout=limit_s)
    except subprocess.TimeoutExpired:
        raise UserError(f"device '{dev.name}': no reply from the probe ({sys.executable}) within {limit_s:.0f} s") \
            from None
    return done.stdout, done.stderr, done.returncode


def _preflight_here(cfg: Config, dev: DeviceConfig) -> None:
    """A device of this machine with a GPU backend is probed before its run, as an SSH device is
    (``RemoteProfiler._preflight``): without torch, its backend's library or CUDA it runs nothing, rather than
    record an error row per configuration. A ``cpu`` device runs on the torch of this interpreter: not probed (an
    ``import torch`` costs seconds)."""
    if dev.backend == "cpu":
        return
    folder = results_path(cfg.profiling_dir, dev.name).parent
    out, err, rc = _probe_here(dev, str(folder), str(folder / PROBE_CACHE))
    said = not_ready(dev.name, dev.backend, sys.executable, rc, out, err, str(folder))
    if said:
        raise UserError(said)


def check_devices(cfg: Config, names: Sequence[str] | None = None, timeout_s: float = 10.0) -> list[DeviceCheck]:
    """Probe the named devices (default: [profile] devices, else all) in parallel; never raises per device."""
    devices = _selected(cfg, names)

    def one(dev: DeviceConfig) -> DeviceCheck:
        try:
            return _check_one(cfg, dev, timeout_s)
        except Exception as exc:  # noqa: BLE001 - a bug on one device must not take down the others' checks
            return DeviceCheck(dev.name, dev.backend, dev.host or "this machine", message=_said(dev, exc))

    with ThreadPoolExecutor(max_workers=max(1, len(devices))) as pool:
        return list(pool.map(one, devices))


def _profile_local(cfg: Config, dev: DeviceConfig, descriptions: Sequence[Path], progress,
                   cancel: threading.Event | None = None) -> DeviceSummary:
    """A local device goes through the local runner (``perf4sight.profiling.local.profile_local``)."""
    from perf4sight.profiling.local import profile_local

    new_rows = 0  # the rows the runner wrote, for a run that fails before its summary

    def on_event(event: dict) -> None:
        nonlocal new_rows
        new_rows += event.get("event") == "row"
        if event.get("event") in ("row", "already"):
            last = (f"last: {event.get('network', '')} @ {event.get('batch_size', '')} "
                    f"{event.get('status', 'measured before')}")
            progress(dev.name, int(event["index"]), int(event["total"]), last)

    t0 = time.monotonic()
    try:
        _preflight_here(cfg, dev)
        local = profile_local(cfg, dev.name, list(descriptions), progress=on_event, cancel=cancel)
    except Exception as exc:  # noqa: BLE001 - the rows the run wrote before it stopped are on disk: counted
        ran = DeviceSummary(dev.name, "failed", new_rows=new_rows, elapsed_s=round(time.monotonic() - t0, 2))
        return _failed(cfg, dev, descriptions, exc, ran)
    summary = DeviceSummary(dev.name, "done", new_rows=local.new_rows, elapsed_s=round(time.monotonic() - t0, 2))
    summary.counts = {"ok": local.ok, "oom": local.oom, "skipped_after_oom": local.skipped_after_oom,
                      "error": local.error}
    on_disk = _plan_on_disk(cfg, dev, descriptions)
    if on_disk:  # every row of the plan by status, as for a remote device (a rerun shows what is there)
        summary.counts = on_disk[1]
    summary.rows = local.new_rows + local.already_measured
    summary.expected = summary.rows
    summary.message = "; ".join(_first(local.warnings) + _first(local.errors))
    return summary


def _said(dev: DeviceConfig, exc: Exception) -> str:
    """What ``exc`` says of ``dev``, on one line: a ``UserError``'s words; anything else (a bug) named by its type."""
    text = str(exc) if isinstance(exc, UserError) else f"device '{dev.name}': {type(exc).__name__}: {exc}"
    return " ".join(text.split())


def _failed(cfg: Config, dev: DeviceConfig, descriptions: Sequence[Path], exc: Exception,
            ran: DeviceSummary | None = None) -> DeviceSummary:
    """``dev``'s summary of a profile that ``exc`` ended: ``ran`` (what the run counted as it went: new rows,
    reconnects) or a new one, marked failed, with what ``exc`` says (:func:`_said`) and the rows of its plan on disk
    (:func:`_plan_on_disk`), which a failure after some were measured keeps."""
    summary = ran or DeviceSummary(dev.name, "failed")
    summary.status, summary.message = "failed", _said(dev, exc)
    on_disk = _plan_on_disk(cfg, dev, descriptions)
    if on_disk:
        summary.rows, summary.counts, summary.expected = on_disk
    return summary


def _plan_on_disk(cfg: Config, dev: DeviceConfig,
                  descriptions: Sequence[Path]) -> tuple[int, dict[str, int], int] | None:
    """(rows of ``dev``'s plan in its CSV, their count per status, rows the plan has); None where a description or
    the CSV cannot be read now."""
    try:
        keys = expected_keys(dev.name, descriptions, cfg.profile.batch_sizes, training_phase(cfg.profile.optimizer),
                             cfg.profile.loss)
        rows, counts = plan_counts(results_path(cfg.profiling_dir, dev.name), covering(keys))
    except (UserError, OSError):
        return None
    return rows, counts, len(keys)


def _require_ssh(dev: DeviceConfig) -> None:
    """Import the SSH modules for ``dev``, a device with a host (they need paramiko, which this machine's own
    devices do not); ``UserError`` saying what to install where it is missing."""
    try:
        importlib.import_module("perf4sight.profiling.remote")  # paramiko, through ssh.py
    except ImportError as exc:
        raise UserError(f"device '{dev.name}' is reached over SSH ({device_table(dev.name)} host), which needs "
                        f"paramiko: {exc} (pip install -r requirements.txt)") from None


@contextmanager
def device_lock(profiling_dir: Path, device: str) -> Iterator[None]:
    """Hold ``<profiling_dir>/<device>/profile.lock`` while this process profiles ``device``: a profile of it by
    another process of this machine meanwhile is refused (``UserError`` naming the process, before it writes
    anything), since two would each pull or measure the device's rows into one CSV. An ``flock``: the kernel
    releases it when its holder ends, however it ends, so a killed run leaves no stale lock."""
    with _held(Path(profiling_dir) / device / PROFILE_LOCK, device, "profiled"):
        yield


@contextmanager
def import_lock(profiling_dir: Path, device: str) -> Iterator[None]:
    """:func:`device_lock` for an import into ``device`` (two at once wrote every row twice). An import that fails
    (its source refused, say) takes back the folders and lock it made, so that it writes nothing into the project."""
    folder = Path(profiling_dir) / device
    made = [p for p in (folder, Path(profiling_dir)) if not p.exists()]  # innermost first
    with _held(folder / PROFILE_LOCK, device, "imported into"):
        try:
            yield
        except BaseException:
            if made and [p.name for p in folder.iterdir()] == [PROFILE_LOCK]:  # removed while it is still held
                (folder / PROFILE_LOCK).unlink()
                for p in made:
                    if not any(p.iterdir()):
                        p.rmdir()
            raise


@contextmanager
def _held(path: Path, device: str, doing: str) -> Iterator[None]:
    """An exclusive ``flock`` on ``path`` (made where missing) for the block; ``UserError`` naming its holder where
    another process has it (``doing``: what that process is doing to ``device``)."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fh = open(path, "a+")
    except OSError as exc:
        raise UserError(f"device '{device}': cannot open its lock {path}: {exc.strerror or exc}") from None
    with fh:
        try:
            fcntl.flock(fh, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            fh.seek(0)
            holder = fh.read().strip() or "its pid not written yet"
            raise UserError(f"device '{device}' is being {doing} by another run on this machine ({holder}; lock "
                            f"{path}): let it end or stop it, then run again; this run did nothing") from None
        except OSError as exc:
            raise UserError(f"device '{device}': cannot lock {path}: {exc.strerror or exc}") from None
        fh.truncate(0)
        fh.write(f"pid {os.getpid()}, since {time.strftime('%Y-%m-%d %H:%M:%S')}\n")
        fh.flush()
        yield


def refuse_another_backend(cfg: Config, dev: DeviceConfig) -> None:
    """``UserError`` where ``dev``'s measurements hold rows of another backend than its config names (it was changed,
    e.g. from cpu to nvml): the profile would count those rows as measured (a row's key has no backend) and never
    measure the device under the new one, and a fingerprint of rows of two backends means neither. The file stays
    as it is."""
    path = results_path(cfg.profiling_dir, dev.name)
    rows = read_rows(path)
    others = [r for r in rows if r.get("backend") and r["backend"] != dev.backend]
    if not others:
        return
    n, which = len(others), "/".join(sorted({r["backend"] for r in others}))
    were = "was" if n == 1 else "were"
    whose = f"its {plural(n, 'row')}" if n == len(rows) else f"{n} of its {len(rows)} rows"
    raise UserError(f"device '{dev.name}': {whose} in {path} {were} measured by backend {which}, its config says "
                    f"{dev.backend}: profile it under another device name, or move the file away")


def _first(messages: list[str], n: int = 3) -> list[str]:
    """The first ``n`` messages, and how many more there are."""
    return messages[:n] + ([f"{len(messages) - n} more like it"] if len(messages) > n else [])


def remeasure_specs(cfg: Config, devices: Sequence[str], networks: Sequence[str],
                    specs: Sequence[str]) -> dict[str, set[int] | None]:
    """``--remeasure``'s ``specs`` (``NETWORK`` or ``NETWORK@BATCH``) as network -> its batch sizes (None: every
    one), checked against ``networks``, the names the profile of ``devices`` measures, and ``[profile]
    batch_sizes``: ``UserError`` naming the spec and the devices, with the names closest to an unknown one."""
    wanted: dict[str, set[int] | None] = {}
    where = f"device{'s' if len(devices) > 1 else ''} {', '.join(repr(d) for d in devices)}"
    for spec in specs:
        name, at, batch = spec.rpartition("@")
        if not at or not batch.isdigit():
            name, batch = spec, ""
        if name not in networks:
            close = difflib.get_close_matches(name, list(networks), n=3, cutoff=0.6)
            guess = f" (did you mean {' or '.join(repr(n) for n in close)}?)" if close else ""
            raise UserError(f"--remeasure {spec}: '{name}' is not one of the {plural(len(networks), 'network')} "
                            f"profiled on {where}{guess}")
        if batch and int(batch) not in cfg.profile.batch_sizes:
            raise UserError(f"--remeasure {spec}: batch size {batch} is not one of [profile] batch_sizes "
                            f"({', '.join(map(str, cfg.profile.batch_sizes))}) profiled on {where}")
        if name in wanted and wanted[name] is None or not batch:
            wanted[name] = None
        else:
            wanted[name] = (wanted.get(name) or set()) | {int(batch)}
    return wanted


def supersede(cfg: Config, dev: DeviceConfig, descriptions: Sequence[Path],
              wanted: dict[str, set[int] | None]) -> list[dict[str, str]]:
    """Move ``dev``'s rows of ``wanted`` (:func:`remeasure_specs`) among the plan's (``descriptions`` at ``[profile]
    batch_sizes``, of its optimiser's step and loss) from its measurements to :data:`SUPERSEDED_CSV` beside them, so
    that the profile measures them again; with an ``oom`` row moved, that network's ``skipped_after_oom`` rows at
    larger batch sizes go too. Returns the rows moved. They are appended (fsync'd) there before the measurements are
    rewritten without them (atomically; every other byte kept as it is: :func:`results.take_rows`)."""
    path = results_path(cfg.profiling_dir, dev.name)
    plan = covering(expected_keys(dev.name, descriptions, cfg.profile.batch_sizes,
                                  training_phase(cfg.profile.optimizer), cfg.profile.loss))
    rows = [r for r in read_rows(path) if row_key(r) in plan and r["network"] in wanted]
    chosen = [r for r in rows if wanted[r["network"]] is None or batch_size_of(r) in wanted[r["network"]]]
    oom_at = {}
    for r in chosen:
        if r["status"] == "oom":
            oom_at[r["network"]] = min(oom_at.get(r["network"], 10**9), batch_size_of(r))
    moved = [r for r in rows if r in chosen or (r["status"] == "skipped_after_oom"
                                                and batch_size_of(r) > oom_at.get(r["network"], 10**9))]
    if not moved:
        return []
    gone = {written_key(r) for r in moved}
    rest, taken = take_rows(path.read_bytes(), lambda r: written_key(r) in gone)
    for r in taken:
        append_row(path.with_name(SUPERSEDED_CSV), {k: v for k, v in r.items() if k in COLUMNS})
    with atomic_path(path, suffix=".remeasure") as tmp, tmp.open("wb") as fh:
        fh.write(rest)
        fh.flush()
        os.fsync(fh.fileno())
    return taken


def profile_devices(cfg: Config, names: Sequence[str] | None, descriptions: Sequence[str | Path], *,
                    show_progress: bool = True, remeasure: dict[str, set[int] | None] | None = None,
                    **follow: Any) -> list[DeviceSummary]:
    """Profile ``descriptions`` (network description files) on every named device at once, except that the
    devices of this machine (no ``host``) take turns: run side by side they would share its cores and memory
    bandwidth and slow each other's steps down.

    ``remeasure`` (:func:`remeasure_specs`): configurations measured again on each device, their earlier rows
    moved aside first (:func:`supersede`; counted in each summary's ``superseded``).
    ``follow`` tunes the SSH follower (``poll_s``, ``status_every_s``, ``connect_timeout_s``,
    ``reconnect_timeout_s``, ``max_restarts``; see RemoteProfiler). Rows land in
    ``<profiling_dir>/<device>/measurements.csv``. Returns one summary per device, in order. ``UserError``, before
    anything is measured, where another process profiles one of the devices (:func:`device_lock`) or one's rows
    are of another backend than its config's (:func:`refuse_another_backend`).
    """
    devices = _selected(cfg, names)
    descs = [Path(d) for d in descriptions]
    missing = [str(d) for d in descs if not d.is_file()]
    if missing:
        raise UserError(f"network description not found: {missing[0]}")
    # a malformed file is the user's to fix (exit 2), not an error row measured on every device
    names_profiled = [load_description(d).name for d in descs]
    wanted = cfg.profile.reference_network
    if cfg.profile.reference_every > 0 and wanted and names_profiled and wanted not in names_profiled:
        listed = ", ".join(names_profiled[:8]) + (", ..." if len(names_profiled) > 8 else "")
        raise UserError(f"{cfg.path}: [profile] reference_network {wanted!r} is not one of the networks to profile "
                        f"({listed})")
    with ExitStack() as held:  # every device's lock before any is measured: a refused run writes nothing
        for dev in devices:
            held.enter_context(device_lock(cfg.profiling_dir, dev.name))
        for dev in devices:
            refuse_another_backend(cfg, dev)
        moved = {dev.name: supersede(cfg, dev, descs, remeasure) if remeasure else [] for dev in devices}
        try:
            summaries = _profile_all(cfg, devices, descs, show_progress, follow, moved)
        except KeyboardInterrupt as exc:
            n = sum(len(rows) for rows in moved.values())
            if not n:
                raise
            said = str(exc) or "measurements taken so far are on disk; rerun to resume"
            raise KeyboardInterrupt(f"{said}; --remeasure moved {plural(n, 'earlier row')} to {SUPERSEDED_CSV} "
                                    "beside the measurements: a rerun without --remeasure measures those not "
                                    "measured again yet") from None
        for s in summaries:
            s.errors_retried = cfg.profile.retry_errors and not s.attached  # an attached run keeps its own plan
            s.superseded = len(moved.get(s.device, []))
            s.remeasure_left = _not_measured_again(cfg, s.device, moved.get(s.device, []))
        return summaries


def _not_measured_again(cfg: Config, device: str, moved: list[dict[str, str]]) -> int:
    """How many configurations of ``moved`` (the rows --remeasure moved aside) have no row in ``device``'s
    measurements now (all of them where the file cannot be read)."""
    keys = {row_key(r) for r in moved}
    try:
        keys -= {row_key(r) for r in read_rows(results_path(cfg.profiling_dir, device))}
    except (UserError, OSError):
        pass
    return len(keys)


class ProgressLog:
    """The progress bars' events as lines, for a stderr that is no terminal: one per event whose note changed (a row
    measured or pulled, a reconnection, a wait), none for the rows an earlier run measured (a rerun of a campaign
    of 1,401 rows would print 1,401 of them), each naming its device and, where known, how far it is."""

    def __init__(self) -> None:
        self._last: dict[str, str] = {}

    def line(self, device: str, done: int, total: int, note: str) -> str | None:
        """The line to print for this event, None for none."""
        if not note or note.endswith("measured before") or self._last.get(device) == note:
            return None
        self._last[device] = note
        return f"{device}: {done}/{total} {note}" if done >= 0 and total else f"{device}: {note}"


def _profile_all(cfg: Config, devices: list[DeviceConfig], descs: list[Path], show_progress: bool,
                 follow: dict[str, Any], moved: dict[str, list[dict[str, str]]]) -> list[DeviceSummary]:
    """:func:`profile_devices` once its checks are passed and its devices' locks held (``moved``: each device's rows
    --remeasure moved aside, which an SSH device's own CSV loses too)."""
    bars = progress_bars() if show_progress else None
    tasks: dict[str, Any] = {}
    lock = threading.Lock()
    # on a stderr that is no terminal (nohup, CI, `2> log`) rich draws the bars once, when the stage ends: a line
    # per event instead, so that a log followed during a run of hours says how far each device is
    log = ProgressLog() if bars is not None and not bars.console.is_terminal else None

    def progress(device: str, done: int, total: int, note: str) -> None:
        if bars is None:
            return
        with lock:
            if done >= 0:
                bars.update(tasks[device], completed=done, total=total, note=note)
            else:
                bars.update(tasks[device], note=note)
            line = log.line(device, done, total, note) if log is not None else None
            if line:
                bars.console.print(line, markup=False, highlight=False)

    cancel = threading.Event()  # Ctrl-C / SIGTERM reach the main thread only: it tells the devices' threads
    this_machine = threading.Lock()  # held by the local device measuring now

    def one(dev: DeviceConfig) -> DeviceSummary:
        profiler = None
        try:
            if not dev.host:
                free = this_machine.acquire(blocking=False)
                if not free:  # said only where another device of this machine measures now
                    progress(dev.name, -1, 0, "waiting: this machine's devices are measured one after another")
                while not free and not this_machine.acquire(timeout=0.2):
                    if cancel.is_set():
                        return DeviceSummary(dev.name, "failed", message=f"device '{dev.name}': interrupted before "
                                             "it started")
                try:
                    return _profile_local(cfg, dev, descs, progress, cancel)
                finally:
                    this_machine.release()
            _require_ssh(dev)
            from perf4sight.profiling.remote import RemoteProfiler

            profiler = RemoteProfiler(cfg, dev, descs, progress=progress, cancel=cancel,
                                      superseded=moved.get(dev.name, ()), **follow)
            return profiler.run()
        # a UserError, e.g. an unreadable description: this device fails, the others go on; and so on a bug
        except Exception as exc:  # noqa: BLE001 - a bug on one device must not take down the others
            return _failed(cfg, dev, descs, exc, profiler.summary if profiler is not None else None)

    if bars is not None:
        for dev in devices:
            tasks[dev.name] = bars.add_task(dev.name, total=None, note="")
        if log is None:  # lines instead: bars never started draw nothing at the end (a bar of box characters in a log)
            bars.start()
    pool = ThreadPoolExecutor(max_workers=max(1, len(devices)))
    try:
        return list(pool.map(one, devices))
    except KeyboardInterrupt:  # stop local runners, stop following remote runs; measured rows stay on disk
        cancel.set()  # first: a runner registered after stop_runners() sees it and stops itself
        stop_runners()
        if any(dev.host for dev in devices):
            raise KeyboardInterrupt(REMOTE_RUNS_GO_ON) from None
        raise
    finally:
        pool.shutdown(wait=True)
        if bars is not None and log is None:  # a stop prints an empty line where no terminal shows the bars
            bars.stop()


def format_checks(checks: Sequence[DeviceCheck]) -> str:
    """One line per device for the CLI."""
    lines = []
    for c in checks:
        f = c.facts
        state = ("ok" if c.ok else "reachable" if c.reachable else "HOST KEY REFUSED" if c.host_key_refused
                 else "LOGIN FAILED" if c.login_failed else "UNREACHABLE")
        lib = f.get("backend_library")
        library = (f"{lib} {f['backend_library_version']}" if lib and f.get("backend_library_version")
                   else f"{lib} missing" if lib else "no backend library needed")
        facts = (f"python {f.get('python', '?')}, torch {f.get('torch') or 'missing'}"
                 f"{', cuda' if f.get('cuda') else ''}, {library}"
                 + (f", memory {f['memory_mb']:.0f} MiB, swap {f.get('swap_mb', 0):.0f} MiB"
                    if f.get("memory_mb") else "")
                 + (f", free disk {f['free_disk_mb']:.0f} MiB" if isinstance(f.get("free_disk_mb"), (int, float))
                    else ", free disk ? MiB")) if f else ""
        lines.append(f"{c.device} [{c.backend}] {c.where}: {state}" + (f"; {facts}" if facts else "")
                     + (f" — {c.message}" if c.message else ""))
    return "\n".join(lines)


def format_summaries(summaries: Sequence[DeviceSummary]) -> str:
    """One line per device: what happened, its plan's rows on disk, how many this invocation measured ("new") and
    how many an earlier one's run on an SSH device measured that it copied over ("pulled"), statuses."""
    lines = []
    for s in summaries:
        counts = ", ".join(f"{k} {v}" for k, v in s.counts.items() if v)
        earlier = ("from the run an earlier profile left going on the device" if s.attached
                   else "that an earlier profile's run measured on the device")
        extra = "".join([f", {s.pulled} pulled {earlier}" if s.pulled else "",
                         f", {plural(s.reconnects, 'reconnect')}" if s.reconnects else "",
                         f", {plural(s.restarts, 'restart')}" if s.restarts else "",
                         ", from the run an earlier profile left going on the device" if s.attached and not s.pulled
                         else ""])
        retry = ("" if not s.counts.get("error")
                 else " (error rows measured again, as --retry-errors asked)" if s.errors_retried and s.status == "done"
                 else " (error rows are not measured again unless asked: --retry-errors)")
        lines.append(f"{s.device}: {s.status} — {s.rows}/{s.expected} rows ({s.new_rows} new{extra})"
                     + (f" [{counts}]{retry}" if counts else "") + (f" — {s.message}" if s.message else ""))
    return "\n".join(lines)

