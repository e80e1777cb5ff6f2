"""Profile one SSH device: ship the runner, start it detached, follow it, pull its rows back.

Remote layout, under the device's ``workdir`` (``~`` = the login user's home)::

    <workdir>/<device name>/code-<hash>/perf4sight/...  the runner and what it imports (no model code)
    <workdir>/<device name>/nets/<sha>.json      the network descriptions (named by content hash)
    <workdir>/<device name>/plan.json            the test plan
    <workdir>/<device name>/measurements.csv     rows, appended by the runner (only the plan's are pulled)
    <workdir>/<device name>/references.csv       the drift reference's rows ([profile] reference_every), pulled too
    <workdir>/<device name>/.measurements.csv.children/   the measuring children's scratch files, while they run
    <workdir>/<device name>/run.json|run.exit|run.log   the detached run (see detach.py)

The run survives a dropped SSH connection (it is detached); the follower reconnects and
carries on. A rerun after a device crash or reboot resumes: rows already on the device or
already pulled are not measured again (local rows missing on the device are written back to
its CSV before the start), and the local CSV never gets a key twice. Times in seconds.
"""
from __future__ import annotations

import hashlib
import json
import os
import signal
import socket
import sys
import threading
import time
from pathlib import Path, PurePosixPath
from typing import Callable, Sequence

import perf4sight
from perf4sight.config import Config, DeviceConfig
from perf4sight.errors import UserError
from perf4sight.files import write_atomically
from perf4sight.profiling import results
from perf4sight.profiling.local import make_plan
from perf4sight.profiling.plan import training_phase
from perf4sight.profiling.outcome import (PROBE, PROBE_CACHE, DeviceSummary, covering, expected_keys, not_ready,
                                          plan_counts, read_descriptions, read_keys)
from perf4sight.profiling.pull import CsvPuller, csv_with_rows
from perf4sight.profiling.runner import LOAD_ENV
from perf4sight.profiling.ssh import (CONNECTION_ERRORS, DeviceError, HostKeyError, LoginError, Remote,
                                     default_known_hosts, describe_error)
from perf4sight.wording import device_table

__all__ = ["DeviceSummary", "RemoteProfiler", "code_files", "expected_keys", "covering", "plan_counts",
           "remote_dir_name", "known_hosts_path", "key_file_path"]

Progress = Callable[[str, int, int, str], None]  # (device, done, total, note)

_NOT_JSON = object()  # a log line that is no JSON (a traceback's), as :meth:`RemoteProfiler._log_tail` reads it

#: How many times the run is set up (the code, networks and plan shipped) before a connection that drops each time
#: fails the device; each drop is reconnected as the measurement phase reconnects (``reconnect_timeout_s``). A count,
#: not that setting's time: ``reconnect_timeout_s`` bounds how long a device may stay unreachable (a reboot: raised
#: for a slow one), the measurement phase's only bound on drops, as its run makes progress between them; here a link
#: that comes back and drops again each time makes none, and a time bound would re-ship for as long as a reboot may
#: take.
SETUP_ATTEMPTS = 3

#: Host-side modules that never go to a device.
_HOST_ONLY = {"ssh.py", "remote.py", "fleet.py", "pull.py", "probe.py", "local.py", "outcome.py"}


def known_hosts_path(cfg: Config, dev: DeviceConfig) -> Path:
    """The known_hosts file a device is checked against (config-relative path, else ~/.ssh/known_hosts)."""
    return cfg.resolve(dev.known_hosts) if dev.known_hosts else default_known_hosts()


def key_file_path(cfg: Config, dev: DeviceConfig) -> Path | None:
    """The private key a device logs in with (config-relative path), None where it sets none (the agent's keys)."""
    return cfg.resolve(dev.key_file) if dev.key_file else None


def remote_dir_name(device: str) -> str:
    """The device's folder name under its workdir: the name itself, unless it cannot be one."""
    if device in ("", ".", "..") or "/" in device or any(ord(c) < 32 for c in device):
        return "device-" + hashlib.sha256(device.encode()).hexdigest()[:12]
    return device


def code_files() -> list[tuple[Path, str]]:
    """(local file, path relative to code/) of every module the runner needs on a device.

    These run on the device's Python, which may be 3.6 (a Jetson TX2's JetPack 4.6): annotations in
    ``typing``'s forms (``List[int]``, ``Optional[str]``), no ``from __future__ import annotations``, no
    library call newer than 3.6 (``tests/test_remote.py`` checks with vermin)."""
    root = Path(perf4sight.__file__).resolve().parent
    wanted = [root / "__init__.py", root / "errors.py", root / "files.py", root / "ir" / "__init__.py",
              root / "ir" / "schema.py", root / "ir" / "shapes.py", root / "ir" / "to_torch.py"]
    wanted += sorted(p for p in (root / "profiling").rglob("*.py") if p.name not in _HOST_ONLY)
    return [(p, str(PurePosixPath("perf4sight") / p.relative_to(root).as_posix())) for p in wanted if p.is_file()]


class RemoteProfiler:
    """Runs the whole campaign on one SSH device; :meth:`run` never raises for device problems."""

    def __init__(self, cfg: Config, dev: DeviceConfig, descriptions: Sequence[Path], *,
                 progress: Progress | None = None, poll_s: float = 1.0, status_every_s: float = 10.0,
                 connect_timeout_s: float = 10.0, reconnect_timeout_s: float | None = None, max_restarts: int = 2,
                 cancel: threading.Event | None = None, superseded: Sequence[dict] = ()) -> None:
        self.cfg, self.dev = cfg, dev
        self.cancel = cancel or threading.Event()  # set: stop following (the detached run goes on on the device)
        self.descriptions = [Path(d) for d in descriptions]
        self.progress = progress or (lambda *a: None)
        self.poll_s, self.status_every_s = poll_s, status_every_s
        # a reboot can take minutes: the device's own setting unless the caller gives one
        self.reconnect_timeout_s = dev.reconnect_timeout_s if reconnect_timeout_s is None else reconnect_timeout_s
        self.max_restarts = max_restarts
        self.remote = Remote(dev, known_hosts_path(cfg, dev), timeout_s=connect_timeout_s,
                             key_file=key_file_path(cfg, dev))
        self.local_csv = results.results_path(cfg.profiling_dir, dev.name)
        self.summary = DeviceSummary(dev.name, "failed")
        # each description read once: its rows are expected under the sha of these bytes, and these are shipped
        # (after a run attached to has ended, maybe hours later: the file may have been rewritten meanwhile)
        self.read = read_descriptions(self.descriptions)
        keys = read_keys(dev.name, self.read, cfg.profile.batch_sizes, training_phase(cfg.profile.optimizer),
                         cfg.profile.loss)
        self.summary.expected = len(keys)
        self.expected = covering(keys)
        self.puller = CsvPuller(self.local_csv, wanted=self.expected)
        # the drift reference's rows ([profile] reference_every), pulled beside the measurements
        self.reference_puller = CsvPuller(results.references_path(cfg.profiling_dir, dev.name),
                                          key=results.written_key) if cfg.profile.reference_every > 0 else None
        # rows --remeasure moved aside here (fleet.supersede): taken off the device's CSV too, and never pulled back;
        # so are the rows an earlier --remeasure moved (superseded.csv) whose profile ended before it took them off
        self.superseded = list(superseded)
        aside = results.results_path(cfg.profiling_dir, dev.name).with_name(results.SUPERSEDED_CSV)
        self.withdrawn = {results.written_key(r) for r in [*self.superseded, *results.read_rows(aside)]}
        self.puller.copied |= self.withdrawn
        self.run_dir = ""
        self.code_dir = ""
        self.started = False  # a run this invocation started: the rows pulled from then on are its measurements

    # -- paths and commands -----------------------------------------------------------------
    def _path(self, *parts: str) -> str:
        return str(PurePosixPath(self.run_dir, *parts))

    def _python(self) -> str:
        py = self.dev.python or "python3"
        return self.remote.expand(py) if py.startswith("~") else py

    def _detach(self, *args: str, timeout_s: float = 60.0) -> dict:
        argv = ["env", f"PYTHONPATH={self.code_dir}", self._python(), "-m", "perf4sight.profiling.detach",
                args[0], self.run_dir, *args[1:]]
        res = self.remote.run(argv, timeout_s=timeout_s)
        if res.rc != 0:
            raise DeviceError(f"device '{self.dev.name}': {args[0]} failed (exit {res.rc}): "
                              f"{' '.join((res.stderr or res.stdout).split())[-300:]}")
        try:
            return json.loads(res.stdout.strip().splitlines()[-1])
        except (ValueError, IndexError):
            raise DeviceError(f"device '{self.dev.name}': unexpected answer from detach: "
                              f"{res.stdout[-200:]!r}") from None

    def _why_no_folder(self, exc: BaseException) -> str:
        """Why SFTP could not make the work folder: its own words, or where it gave only its generic "Failure" (no
        errno: a read-only file system, a full disk) what the device's ``mkdir -p`` says."""
        said = describe_error(exc)
        if getattr(exc, "errno", None) is None:
            try:
                res = self.remote.run(["mkdir", "-p", self.run_dir], timeout_s=30)
            except CONNECTION_ERRORS:
                return said
            lines = (res.stderr or res.stdout).strip().splitlines()
            if res.rc != 0 and lines:
                return " ".join(lines[-1].split())[-300:]
        return said

    # -- steps ------------------------------------------------------------------------------
    def _preflight(self) -> None:
        """The ``check`` stage's probe: a device whose python cannot run the runner (too old, no torch, no
        backend library) starts nothing, so no row records a missing library as a failed measurement. Torch's facts
        come from :data:`PROBE_CACHE` while its install is the one they were read from (``probe.py``)."""
        res = self.remote.run([self._python(), "-c", PROBE.read_text(), self.dev.backend, self.run_dir,
                               self._path(PROBE_CACHE)], timeout_s=120)
        said = not_ready(self.dev.name, self.dev.backend, self.dev.python, res.rc, res.stdout, res.stderr,
                         self.run_dir)
        if said:
            raise DeviceError(said)

    def _ship_code(self) -> None:
        """The runner's modules into ``code-<hash>/`` (skipped when already there): a live run keeps its own copy."""
        r = self.remote
        files = code_files()
        manifest = hashlib.sha256(b"".join(rel.encode() + p.read_bytes() for p, rel in files)).hexdigest()
        self.code_dir = self._path(f"code-{manifest[:12]}")
        if (r.read_text(f"{self.code_dir}/MANIFEST") or "").strip() == manifest:
            return
        for local, rel in files:
            r.makedirs(str(PurePosixPath(self.code_dir, rel).parent))
            r.put_file(local, f"{self.code_dir}/{rel}")
        r.put_bytes(manifest.encode() + b"\n", f"{self.code_dir}/MANIFEST")

    def _ship(self) -> None:
        """Descriptions (named by content hash; as read when the profiler was made) and the plan, over SFTP."""
        r = self.remote
        r.makedirs(self._path("nets"))
        nets = []
        for _, data, _ in self.read:  # the bytes the expected rows' shas are of
            name = f"nets/{results.file_sha(data)}.json"
            if r.size(self._path(name)) != len(data):
                r.put_bytes(data, self._path(name))
            nets.append(name)
        plan = make_plan(self.cfg, self.dev.name, self.descriptions)
        plan.networks = nets  # shipped next to the plan, named by content
        plan.validate()
        r.put_bytes((json.dumps(plan.to_dict(), indent=1) + "\n").encode(), self._path("plan.json"))

    def _pull(self) -> int:
        csv_path = self._path("measurements.csv")
        before = self.puller.appended
        try:
            fresh = self.puller.pull(lambda: self.remote.size(csv_path),
                                     lambda off: self.remote.read_from(csv_path, off))
            if self.reference_puller is not None:
                ref_path = self._path(results.REFERENCES_CSV)
                self.reference_puller.pull(lambda: self.remote.size(ref_path),
                                           lambda off: self.remote.read_from(ref_path, off))
        finally:  # the rows copied count, though the connection dropped later in this pull (the next finds them here)
            if self.started:
                self.summary.new_rows += self.puller.appended - before
            else:  # measured by an earlier invocation's run (finished, or attached to), not by this one
                self.summary.pulled += self.puller.appended - before
        done = len(self.expected & self.puller.keys)
        last = f"last: {fresh[-1]['network']} @ {fresh[-1]['batch_size']} {fresh[-1]['status']}" if fresh else ""
        self.progress(self.dev.name, done, self.summary.expected, last)
        return len(fresh)

    def _pull_op_prices(self) -> None:
        """The device's op prices (``op_prices.json``, written once at the end of a run), where it has them."""
        text = self.remote.read_text(self._path(results.OP_PRICES_JSON))
        if text is not None:
            write_atomically(results.op_prices_path(self.cfg.profiling_dir, self.dev.name), text.encode())

    def _seed_remote(self) -> None:
        """Write local rows of this plan that the device's CSV lacks back into it, and give a CSV with an
        older column list today's header (no run active: a runner rewriting it while we pull would
        leave the puller at a stale offset)."""
        missing = [row for row in results.read_rows(self.local_csv)
                   if results.row_key(row) in self.expected and results.row_key(row) not in self.puller.remote_keys]
        if not missing and self.puller.header in (None, results.COLUMNS):
            return
        csv_path = self._path("measurements.csv")
        try:
            data = csv_with_rows(self.remote.read_from(csv_path, 0, limit=sys.maxsize), missing)  # all of it
        except ValueError as exc:
            raise DeviceError(f"device '{self.dev.name}': {csv_path}: {exc}; move it away and rerun") from None
        self.remote.put_bytes(data, csv_path)
        self.puller.reset()

    def _supersede_on_device(self) -> None:
        """Take the rows of the configurations ``--remeasure`` measures again (``self.superseded``'s keys) off the
        device's CSV (no run active), so that its runner measures them; a row there that this machine's CSV did not
        hold joins the others in ``superseded.csv`` here. The rows ``superseded.csv`` holds already (an earlier
        ``--remeasure`` whose profile ended before this step) leave it too. Every other byte stays as it is
        (:func:`results.take_rows`)."""
        keys = {results.row_key(r) for r in self.superseded}
        csv_path = self._path("measurements.csv")
        data = self.remote.read_from(csv_path, 0, limit=sys.maxsize)
        rest, gone = results.take_rows(data, lambda row: results.row_key(row) in keys
                                       or results.written_key(row) in self.withdrawn)
        if not gone:
            return
        local = self.puller.copied
        aside = results.results_path(self.cfg.profiling_dir, self.dev.name).with_name(results.SUPERSEDED_CSV)
        for row in gone:
            if results.written_key(row) not in local:
                results.append_row(aside, {k: v for k, v in row.items() if k in results.COLUMNS})
        self.remote.put_bytes(rest, csv_path)
        self.puller.reset()

    def _start(self) -> None:
        cmd = [self._python(), "-m", "perf4sight.profiling.runner", self._path("plan.json")]
        fixed = os.environ.get(LOAD_ENV)  # a load average fixed here (tests) holds for the device's runner too
        load = [f"{LOAD_ENV}={fixed}"] if fixed else []
        state = self._detach("start", "--", "env", f"PYTHONPATH={self.code_dir}", *load, *cmd)
        self.started = True  # the device's CSV was pulled just before: each row that comes over now is this run's
        if state.get("state") not in ("started", "running"):
            raise DeviceError(f"device '{self.dev.name}': could not start the run: {state}")

    def _reconnect(self) -> None:
        """Reconnect until ``reconnect_timeout_s``; a refused host key or login is never retried."""
        self.remote.close()
        deadline = time.monotonic() + self.reconnect_timeout_s
        delay = 0.5
        while True:
            try:
                self.remote.connect()
                self.summary.reconnects += 1
                return
            except (HostKeyError, LoginError):
                raise
            except DeviceError as exc:
                if time.monotonic() > deadline:
                    raise DeviceError(f"{exc} (gave up reconnecting after {self.reconnect_timeout_s:g} s; the run "
                                      "goes on on the device if it was started: rerun the profile stage to follow "
                                      "it and pull its rows)") from None
                self.progress(self.dev.name, -1, self.summary.expected, "reconnecting")
                if self.cancel.wait(delay):
                    self._interrupted()
                delay = min(delay * 2, 5.0)

    def _interrupted(self) -> None:
        """Raise the interrupt's one line: the host stops following; a run already started goes on."""
        raise DeviceError(f"device '{self.dev.name}': interrupted; the run goes on on the device (if it was "
                          "started), rerun the profile stage to follow it and pull its rows")

    def _follow(self) -> dict:
        """Pull rows until run.exit appears; reconnect on drops, restart a dead run (bounded)."""
        last_status = time.monotonic()
        while True:
            try:
                if not self.remote.alive:
                    self._reconnect()
                    last_status = 0.0  # check liveness right after a reconnect
                self._pull()
                ended = self.remote.read_text(self._path("run.exit"))
                if ended is not None:
                    self._pull()
                    self._pull_op_prices()
                    return json.loads(ended)
                if time.monotonic() - last_status >= self.status_every_s:
                    last_status = time.monotonic()
                    state = self._detach("status")
                    if state["state"] == "finished":
                        continue
                    if state["state"] in ("dead", "none"):
                        if self.summary.restarts >= self.max_restarts:
                            raise DeviceError(f"device '{self.dev.name}': the run died {self.summary.restarts + 1} "
                                              f"times (last log: {self._log_tail() or 'no error logged'})")
                        self.summary.restarts += 1
                        self._pull()
                        self._start()
                if self.cancel.wait(self.poll_s):
                    self._interrupted()
            except CONNECTION_ERRORS as exc:
                if self.remote.alive and isinstance(exc, OSError) and not isinstance(exc, socket.timeout):
                    raise DeviceError(f"device '{self.dev.name}': {exc}") from None  # a file problem, not a drop
                self.remote.close()

    def _log_lines(self) -> list[str] | None:
        """The non-empty lines of the runs' log (every run appends its output), None if it cannot be read."""
        try:
            text = self.remote.read_text(self._path("run.log")) or ""
        except CONNECTION_ERRORS:
            return None
        return [ln for ln in text.splitlines() if ln.strip()]

    def _log_warnings(self) -> list[str]:
        """The warning events of the last run in the log (e.g. a network measured again because it changed)."""
        found = []
        for line in self._log_lines() or []:
            try:
                event = json.loads(line)
            except ValueError:
                continue
            if isinstance(event, dict) and event.get("event") == "plan":
                found = []  # the log is appended to by every run: keep the last run's
            elif isinstance(event, dict) and event.get("event") == "warning":
                found.append(str(event.get("message", "")))
        return found

    def _log_tail(self) -> str:
        """Why the last run stopped, from its log: its error event, else its last line that is not an event (a
        traceback's last line); "" where it stopped between events (killed), "unavailable" where unreadable."""
        lines = self._log_lines()
        if lines is None:
            return "unavailable"
        last_run: list[tuple[str, object]] = []  # (line, its JSON: ``_NOT_JSON`` where it is none), each parsed once
        for line in lines:
            try:
                event = json.loads(line)
            except ValueError:
                event = _NOT_JSON
            if isinstance(event, dict) and event.get("event") == "plan":
                last_run = []  # every run appends to the log: an earlier run's error is not this one's
            last_run.append((line, event))
        for line, event in reversed(last_run):
            if event is _NOT_JSON:
                return " ".join(line.split())[-300:]
            if not isinstance(event, dict) or event.get("event") == "error":
                return str(event.get("message", "") if isinstance(event, dict) else event)[-300:]
        return ""

    def _runner_ended(self, rc: object) -> DeviceError:
        """The one line of a run whose runner ended with ``rc`` (not 0): killed by a signal (its name) or exited,
        with what its log says, and that a rerun resumes."""
        how = f"exited with {rc}"
        if isinstance(rc, int) and rc < 0:
            try:
                how = f"was killed by {signal.Signals(-rc).name}"
            except ValueError:
                how = f"was killed by signal {-rc}"
            if rc == -signal.SIGKILL:
                how += " (a kill -9, or the device's out-of-memory killer)"
        tail = self._log_tail()
        return DeviceError(f"device '{self.dev.name}': the runner {how}" + (f": {tail}" if tail else "")
                           + "; rerun the profile stage to resume (rows taken are kept)")

    def _passed_over_note(self) -> list[str]:
        n = len(self.puller.passed_over)
        if not n:
            return []
        return [f"{n} row{'s' if n > 1 else ''} in {self._path('measurements.csv')} {'are' if n > 1 else 'is'} not "
                "in this plan (networks or batch sizes no longer configured, or another config using the same "
                "work folder): left on the device, not pulled"]

    def _set_up(self) -> None:
        """Everything between the first connection and the run's start: the work folder, the probe, the code, a
        run an earlier invocation left going (followed to its end), the rows on the device, the networks and plan,
        the device's CSV topped up, the start. Each step can be taken again: :meth:`run` repeats it all after a
        dropped connection."""
        s = self.summary
        try:
            self.remote.makedirs(self.run_dir)
        except CONNECTION_ERRORS as exc:
            if not self.remote.alive or isinstance(exc, socket.timeout):
                raise
            raise DeviceError(f"device '{self.dev.name}': cannot create the work folder {self.run_dir} "
                              f"({self._why_no_folder(exc)}); set {device_table(self.dev.name)} workdir to a folder "
                              "the device's user can write") from None
        self._preflight()
        self._ship_code()
        while True:
            state = self._detach("status")
            if state["state"] != "running":
                break
            self.progress(self.dev.name, -1, self.summary.expected, "attaching to a running campaign")
            s.attached = True
            self._follow()  # a run from an earlier invocation: let it finish, then top up
        if self.withdrawn:
            self._supersede_on_device()
        self._pull()
        self._ship()
        self._seed_remote()
        if self.cancel.is_set():  # interrupted while shipping: start nothing
            self._interrupted()
        self._start()

    def run(self) -> DeviceSummary:
        """The whole campaign for this device; the summary says how it ended."""
        t0 = time.monotonic()
        s = self.summary
        try:
            try:
                self.remote.connect()
            except HostKeyError:
                raise
            except DeviceError as exc:  # a refused login reached the device: "login failed", as check says
                s.status = "login failed" if isinstance(exc, LoginError) else "unreachable"
                raise exc
            self.run_dir = str(PurePosixPath(self.remote.expand(self.dev.workdir), remote_dir_name(self.dev.name)))
            drops = 0
            while True:  # a connection dropped while the run is set up: reconnect and set it up again (bounded)
                try:
                    self._set_up()
                    break
                except CONNECTION_ERRORS as exc:
                    if self.remote.alive and not isinstance(exc, (socket.timeout, EOFError)):
                        raise  # the connection stands: a file problem, not a drop
                    drops += 1
                    if drops >= SETUP_ATTEMPTS:
                        raise DeviceError(f"device '{self.dev.name}': connection lost: {describe_error(exc)} "
                                          f"({drops} times while the run was set up, reconnected after each but the "
                                          "last); rerun the profile stage to resume (rows taken stay, and a run "
                                          "already started goes on on the device)") from None
                    self.progress(self.dev.name, -1, self.summary.expected, "connection lost while setting up: "
                                  "reconnecting")
                    self._reconnect()
            ended = self._follow()
            if ended.get("rc") != 0:
                raise self._runner_ended(ended.get("rc"))
            s.status = "done"
            s.message = "; ".join(self._log_warnings()[:3] + self._passed_over_note())
        except UserError as exc:
            s.message = str(exc)
            if s.status not in ("unreachable", "login failed"):
                s.status = "failed"
        except CONNECTION_ERRORS as exc:  # a file problem while setting the run up (a drop is reconnected)
            s.status, s.message = "failed", (f"device '{self.dev.name}': connection lost: {describe_error(exc)}; "
                                             "rerun the profile stage to resume (rows taken stay, and a run already "
                                             "started goes on on the device)")
        finally:
            self.remote.close()
            s.rows, s.counts = plan_counts(self.local_csv, self.expected)
            s.elapsed_s = round(time.monotonic() - t0, 2)
        return s
