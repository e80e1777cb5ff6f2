"""The device-side sweep: ``python -m perf4sight.profiling.runner PLAN.json``.

For every network of the plan and every batch size (ascending) it starts a fresh child process
(:mod:`perf4sight.profiling.child`; ``repeats`` of them in a row when the plan asks, keeping the median one),
watches it (timeout, the backend's memory watchdog, what the system swaps back in), reads the child's peak RSS with
``os.wait4`` and appends one row to the plan's CSV as soon as the measurement ends (the child's result file and
stderr in a folder beside the CSV, :func:`children_dir`). The first ``oom`` stops that network: its larger batch
sizes get ``skipped_after_oom`` rows. A step whose memory does not fit may not fail at all on a device that swaps
(a Jetson's zram): it thrashes, many times slower; more than ``plan.max_swap_in_mb`` swapped back in during a
measurement makes it ``oom`` too. Keys already in the CSV are not measured again, and a network with an ``oom`` row
on disk is not measured at larger batch sizes. A plan with ``reference_every`` also measures its drift reference
around the new measurements, into its own CSV (:class:`_Reference`). A CPU device's plan with ``op_prices_output``
then measures what each kind of op between the convolutions costs per element (``op_prices.py``), once.

Progress goes to stdout as JSON lines, one object per event (``event`` = ``plan``, ``row``, ``already``,
``reference``, ``op_prices``, ``warning``, ``done`` or ``error``), for an orchestrator to follow. This process imports
no torch, so that the peak RSS which a child inherits at spawn (``ru_maxrss`` carries over
``exec``) stays far below what the child itself reaches.

Standard library plus ``perf4sight.profiling`` and ``perf4sight.ir.schema`` only: it runs on the devices.
"""
import errno
import fcntl
import importlib.util
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Callable, Dict, Iterator, List, Optional, Set, Tuple, Union

from perf4sight.errors import UserError
from perf4sight.files import naming_file
from perf4sight.ir.schema import load_description_bytes
from perf4sight.ir.shapes import shape_text
from perf4sight.profiling import results
from perf4sight.profiling.backends.base import LIMIT_OOM, Backend, get_backend
from perf4sight.profiling.child import DISK_FULL, NO_SPACE, RESULT_NOT_WRITTEN
from perf4sight.profiling.plan import TestPlan, load_plan, recorded_update, save_plan, training_phase, update_columns
from perf4sight.profiling.procfs import oom_kills, status_mb, swap_mb

__all__ = ["run_plan", "run_child", "run_repeats", "swapped", "thrashing", "load_reading", "ChildOutcome", "main",
           "LOAD_ENV"]

Emit = Callable[[Dict[str, Any]], None]
_PACKAGE_ROOT = Path(__file__).resolve().parents[2]  # the folder that holds perf4sight/
#: above this RSS (MiB) the runner warns that children's peak RSS figures are inflated
LEAN_RUNNER_MB = 200.0
#: seconds between two readings of the system's swap counters while a child runs
SWAP_POLL_S = 0.5
#: an environment variable that fixes the load average :func:`load_reading` gives (a number; tests set it, so that no
#: row depends on the load of the machine that runs them); unset or empty: the system's own
LOAD_ENV = "PERF4SIGHT_LOAD_AVG"
#: less free space than this where the children write, and a child that left neither result nor stderr met a full disk
FULL_DISK_BYTES = 1 << 20


@dataclass
class _Network:
    """What the runner knows of one description file without torch."""
    index: int
    path: Path
    name: str
    family: str = ""
    pruning_level: Any = ""
    input_shape: str = ""
    sha: str = ""
    problem: str = ""  # the description could not be read
    data: bytes = field(default=b"", repr=False)  # the description's bytes, as read when ``sha`` was taken


@dataclass
class ChildOutcome:
    """How one child ended: its result dict (may be empty), peak RSS (MiB) and wall time (s)."""
    result: Dict[str, Any]
    peak_rss_mb: float
    wall_s: float


def _now() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="seconds")


def print_event(event: Dict[str, Any]) -> None:
    """Default progress sink: one JSON object per line on stdout, flushed."""
    sys.stdout.write(json.dumps(event, separators=(",", ":")) + "\n")
    sys.stdout.flush()


def _describe_networks(plan: TestPlan, plan_dir: Path) -> List[_Network]:
    nets: List[_Network] = []
    names: Dict[str, str] = {}
    for i, rel in enumerate(plan.networks):
        path = plan.resolve(plan_dir, rel)
        try:
            desc, data = load_description_bytes(path)  # one read: name and sha of one version
        except (OSError, UserError) as exc:
            nets.append(_Network(i, path, path.stem, path.stem, input_shape=shape_text(plan.input_shape),
                                 problem=" ".join(str(exc).split())[:300]))
            continue
        shape = shape_text(plan.input_shape or desc.input_shape)
        net = _Network(i, path, desc.name, desc.network, desc.pruning_level, shape, results.file_sha(data), data=data)
        nets.append(net)
    for net in nets:
        if net.name in names:
            raise UserError(f"plan: {names[net.name]} and {net.path} are both named '{net.name}'; names must be unique")
        names[net.name] = str(net.path)
    return nets


def _exit_code(status: int) -> int:
    """``Popen.returncode`` of a wait status: the exit code, or minus the signal that ended the process
    (os.waitstatus_to_exitcode is Python 3.9+)."""
    return -os.WTERMSIG(status) if os.WIFSIGNALED(status) else os.WEXITSTATUS(status)


def _kill(pid: int) -> None:
    try:
        os.kill(pid, signal.SIGKILL)
    except ProcessLookupError:
        pass


def _watch_child(proc: subprocess.Popen, plan: TestPlan, backend: Backend, t0: float,
                 swap_before: Optional[Tuple[float, float]]) -> Tuple[Dict[str, str], int, Any]:
    """Wait for the child, killing it on a timeout, over the memory limit or when the system thrashes;
    returns (verdict, wait status, rusage): the verdict is empty when the child ended by itself."""
    verdict: Dict[str, str] = {}
    next_swap_check = t0 + SWAP_POLL_S
    while True:
        pid, status, usage = os.wait4(proc.pid, os.WNOHANG)
        if pid:
            return verdict, status, usage
        now = time.monotonic()
        if now - t0 > plan.timeout_s:
            verdict = {"status": "error", "message": f"timed out after {plan.timeout_s:g} s"}
        else:
            reason = backend.watch(proc.pid)
            if not reason and now >= next_swap_check:
                next_swap_check = now + SWAP_POLL_S
                reason = thrashing(swapped(swap_before, swap_mb()), plan.max_swap_in_mb)
                reason = reason and f"killed: {reason}"
            if reason:
                verdict = {"status": "oom", "message": reason}
        if verdict:
            _kill(proc.pid)
            pid, status, usage = os.wait4(proc.pid, 0)
            return verdict, status, usage
        time.sleep(plan.poll_interval_s)


def _child_env(plan: TestPlan) -> Dict[str, str]:
    """The environment of a process the runner starts: this package importable, the plan's threads for OpenMP."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(_PACKAGE_ROOT), env.get("PYTHONPATH", "")) if p)
    if plan.threads > 0:
        env["OMP_NUM_THREADS"] = env["MKL_NUM_THREADS"] = str(plan.threads)
    return env


def run_child(plan: TestPlan, plan_path: Path, index: int, batch_size: int, backend: Backend) -> ChildOutcome:
    """Measure network ``index`` at ``batch_size`` in a fresh child; never raises for child failures.

    The child's result dict gains ``swap_in_mb``/``swap_out_mb`` (what the system swapped while it ran,
    where ``/proc/vmstat`` is readable), and ``status``/``message`` when it was killed (watchdog, or more
    than ``plan.max_swap_in_mb`` swapped back in -> ``oom``; timeout -> ``error``), when its peak RSS or
    its swap-in went over the limit after the last poll (``oom``, figures kept) or when it crashed
    (SIGKILL not sent by us: :func:`_sigkill_verdict`; other signals and exit codes -> ``error``). A child that
    could not write its result for lack of space raises ``OSError`` (ENOSPC) naming its result file: no row can be
    trusted to be written either, and a rerun measures that configuration.
    """
    env = _child_env(plan)
    scratch = children_dir(plan.resolve(plan_path.parent, plan.output))
    scratch.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="child-", dir=str(scratch)) as tmp:
        result_file = Path(tmp) / "result.json"
        err_file = Path(tmp) / "stderr.txt"
        cmd = [sys.executable, "-m", "perf4sight.profiling.child", str(plan_path), "--network", str(index),
               "--batch-size", str(batch_size), "--result", str(result_file)]
        swap_before, kills_before = swap_mb(), oom_kills()
        t0 = time.monotonic()
        proc: Optional[subprocess.Popen] = None
        try:
            with _interrupts_held():  # an interrupt inside Popen would leave the new child running, unknown to us
                with open(err_file, "wb") as err:
                    proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=err,
                                            env=env)
            verdict, status, usage = _watch_child(proc, plan, backend, t0, swap_before)
        except BaseException:  # interrupted (SIGINT/SIGTERM): the measuring child goes with us
            _ignore_interrupts()  # a second signal (Ctrl-C, then the CLI's SIGTERM) must not cut this short
            if proc is not None:
                _kill(proc.pid)
                try:
                    os.wait4(proc.pid, 0)
                except ChildProcessError:  # already reaped
                    pass
                proc.returncode = -signal.SIGKILL
            raise
        wall = time.monotonic() - t0
        peak_mb = round(usage.ru_maxrss / 1024, 2)  # ru_maxrss: KiB on Linux
        proc.returncode = _exit_code(status)  # already reaped: keep Popen from waiting again
        result: Dict[str, Any] = {}
        if result_file.exists():
            try:
                result = json.loads(result_file.read_text())
            except json.JSONDecodeError:
                result = {}
        swap = swapped(swap_before, swap_mb())
        result.update(swap)
        result.update(load_reading())
        if not verdict and result.get("status") == "ok":
            # a peak, or swapping, after the last poll
            over = backend.over_limit(peak_mb) or thrashing(swap, plan.max_swap_in_mb)
            if over:
                verdict = {"status": "oom", "message": over}
        if verdict:
            result.update(verdict)
        elif not result.get("status"):
            stderr = _stderr_lines(err_file)  # read once: for the full-disk verdict and the crash's message
            if _disk_full(proc.returncode, stderr, err_file.parent):
                raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(result_file))
            if proc.returncode == -signal.SIGKILL:
                result.update(_sigkill_verdict(kills_before, oom_kills(), peak_mb, backend))
            else:
                result.update(_crash_verdict(proc.returncode, stderr))
    return ChildOutcome(result, peak_mb, round(wall, 3))


def swapped(before: Optional[Tuple[float, float]], after: Optional[Tuple[float, float]]) -> Dict[str, float]:
    """``swap_in_mb`` / ``swap_out_mb`` between two :func:`~perf4sight.profiling.procfs.swap_mb` readings
    (empty when either is unknown)."""
    if before is None or after is None:
        return {}
    return {"swap_in_mb": round(after[0] - before[0], 2), "swap_out_mb": round(after[1] - before[1], 2)}


def load_reading() -> Dict[str, Any]:
    """``load_avg_1m`` (the system's 1-minute load average, :data:`LOAD_ENV`'s number where it is set) and
    ``cpu_count`` (its CPUs) as a measurement ends; a figure that cannot be read is left out (the cell stays empty).
    A load above the CPU count means other work shared the cores while the step was timed (the host's profile and
    fingerprint stages say so: ``results.under_load``). One small read, no process started."""
    reading: Dict[str, Any] = {}
    fixed = os.environ.get(LOAD_ENV, "").strip()
    try:
        load = float(fixed) if fixed else os.getloadavg()[0]
    except (OSError, ValueError):  # no load average on this system, or a fixed one that is no number
        load = -1.0
    if 0 <= load < float("inf"):
        reading["load_avg_1m"] = round(load, 2)
    cpus = os.cpu_count()
    if cpus:
        reading["cpu_count"] = cpus
    return reading


def thrashing(swap: Dict[str, float], limit_mb: float) -> Optional[str]:
    """The ``oom`` message when more than ``limit_mb`` MiB were swapped back in (0 = no check), else None."""
    back_in = swap.get("swap_in_mb")
    if limit_mb > 0 and back_in is not None and back_in > limit_mb:
        return (f"the system swapped {back_in:.0f} MiB back in during the measurement (max_swap_in_mb "
                f"{limit_mb:g}): the step's memory did not fit (thrashing)")
    return None


def run_repeats(plan: TestPlan, plan_path: Path, index: int, batch_size: int, backend: Backend) -> ChildOutcome:
    """Measure network ``index`` at ``batch_size`` in ``plan.repeats`` fresh children, one after another.

    The first child that does not end ``ok`` ends the repeats and is the outcome (an ``oom`` in any
    repeat makes the configuration ``oom``). Otherwise the outcome is the child whose step-time
    median is the median of the repeats' (the lower middle one for an even count), so that every
    column of the row comes from one measurement; it gains ``repeats`` and ``latency_ms_repeat_cv``
    (std / mean of the repeats' medians, %). ``wall_s`` is the time of all repeats.
    """
    outcomes: List[ChildOutcome] = []
    for _ in range(plan.repeats):
        outcome = run_child(plan, plan_path, index, batch_size, backend)
        if outcome.result.get("status") != "ok":
            if outcomes:
                outcome.result["message"] = f"repeat {len(outcomes) + 1} of {plan.repeats}: " \
                                            f"{outcome.result.get('message', '')}"[:300]
            outcome.wall_s = round(outcome.wall_s + sum(o.wall_s for o in outcomes), 3)
            return outcome
        outcomes.append(outcome)
    medians = [float(o.result.get("latency_ms_median") or 0.0) for o in outcomes]
    order = sorted(range(len(outcomes)), key=medians.__getitem__)
    chosen = outcomes[order[(len(order) - 1) // 2]]
    mean = sum(medians) / len(medians)
    std = (sum((m - mean) ** 2 for m in medians) / len(medians)) ** 0.5
    chosen.result["repeats"] = len(outcomes)
    chosen.result["latency_ms_repeat_cv"] = round(100.0 * std / mean, 3) if len(outcomes) > 1 and mean > 0 else ""
    chosen.wall_s = round(sum(o.wall_s for o in outcomes), 3)
    return chosen


def _sigkill_verdict(kills_before: Optional[int], kills_after: Optional[int], peak_mb: float,
                     backend: Backend) -> Dict[str, str]:
    """The row of a child killed by a SIGKILL the runner did not send: ``oom`` where the kernel's OOM killer killed
    while it ran (its :func:`~perf4sight.profiling.procfs.oom_kills` count rose) or its peak RSS is over
    memory_limit_mb, or where the kernel keeps no such count (before Linux 4.13: the OOM killer's kill is the likely
    one, as it was taken before); else ``error``, which a rerun with retry_errors measures again (someone's
    ``kill -9``), saying why it is not taken for running out of memory."""
    kills = None if kills_before is None or kills_after is None else kills_after - kills_before
    over = backend.over_limit(peak_mb)
    if over:
        return {"status": "oom", "message": f"child killed by SIGKILL: {over}"}  # LIMIT_OOM still reads it
    if kills:
        return {"status": "oom", "message": f"child killed by SIGKILL: the kernel's OOM killer killed {kills} "
                                            "process(es) while it ran (oom_kill in /proc/vmstat)"}
    if kills is None:  # a kernel before 4.13 (a Jetson TX2's 4.9) keeps no count: its OOM killer's kill, as before
        return {"status": "oom", "message": "child killed by SIGKILL (the kernel's OOM killer? this kernel keeps no "
                                            "count of its kills to tell: no oom_kill in /proc/vmstat)"}
    why = "the kernel's OOM killer killed nothing while it ran (oom_kill in /proc/vmstat)"
    limit = backend.plan.memory_limit_mb
    rss = (f"its peak RSS {peak_mb:.0f} MiB is within memory_limit_mb {limit}" if limit > 0
           else f"no memory_limit_mb to hold its peak RSS {peak_mb:.0f} MiB against")
    return {"status": "error", "message": f"child killed by SIGKILL, not taken for running out of memory: {why}, "
                                          f"and {rss}"}


def _stderr_lines(err_file: Path) -> List[str]:
    """The lines a child wrote to its stderr file ``err_file`` that are not blank, stripped."""
    return [ln.strip() for ln in err_file.read_text(errors="replace").splitlines() if ln.strip()]


def _crash_verdict(code: int, stderr: List[str]) -> Dict[str, str]:
    """The error of a child that exited with ``code`` and no result, quoting the last of its ``stderr`` lines
    (:func:`_stderr_lines`)."""
    if code < 0:
        return {"status": "error", "message": f"child killed by signal {signal.Signals(-code).name}"}
    tail = f": {stderr[-1][:300]}" if stderr else ""
    what = "could not write its result" if code == RESULT_NOT_WRITTEN else f"exited with code {code} without a result"
    return {"status": "error", "message": f"child {what}{tail}"}


def _disk_full(code: int, stderr: List[str], folder: Path) -> bool:
    """Whether a child that exited with ``code`` and no result met a full disk: it says so (:data:`DISK_FULL`), or
    it left no ``stderr`` lines (:func:`_stderr_lines`) where less than :data:`FULL_DISK_BYTES` are free in
    ``folder``, where it writes (it could write neither)."""
    if code == DISK_FULL:
        return True
    if code <= 0 or stderr:
        return False
    try:
        return shutil.disk_usage(str(folder)).free < FULL_DISK_BYTES
    except OSError:
        return False


def children_dir(csv_path: Path) -> Path:
    """The folder of the measuring children's scratch files (result and stderr, one folder per child): beside the
    plan's CSV, so a runner killed mid-measurement (SIGKILL, a dropped SSH session) leaves its child's folder where
    the next runner of that CSV, holding its lock, removes it (:func:`run_plan`), not in the system's temp folder."""
    return csv_path.with_name("." + csv_path.name + ".children")


@contextmanager
def _locked(csv_path: Path) -> Iterator[None]:
    """Hold an exclusive lock next to the CSV so two runners never write the same file. A POSIX record lock
    (``lockf``), which belongs to this process alone: a child caught between its fork and its exec holds a copy of
    the lock file's descriptor, and an ``flock`` would stay held through it after this runner was killed."""
    csv_path.parent.mkdir(parents=True, exist_ok=True)
    with open(csv_path.with_name(csv_path.name + ".lock"), "a+") as fh:  # "a+": a refused runner reads the pid
        try:
            fcntl.lockf(fh, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as exc:
            if exc.errno not in (errno.EACCES, errno.EAGAIN):
                raise
            fh.seek(0)
            pid = fh.read().strip()
            raise UserError(f"{csv_path}: another runner is writing this file"
                            + (f" (pid {pid}: a profile going on, or a runner left by one that was killed, which "
                               "stops after its current measurement: rerun once it is gone)" if pid.isdigit() else "")
                            ) from None
        fh.seek(0)
        fh.truncate()
        fh.write(str(os.getpid()))
        fh.flush()
        yield


def raised_limit(row: Dict[str, Any], limit: int) -> Optional[int]:
    """The memory_limit_mb (MiB) that made ``row`` an ``oom`` where it is below ``limit``, the plan's (0: none): the
    step may fit now, so it is measured again. None for any other row."""
    found = LIMIT_OOM.search(str(row.get("message") or "")) if row.get("status") == "oom" else None
    return int(found.group(2)) if found and (limit <= 0 or int(found.group(2)) < limit) else None


def _group(row: Dict[str, Any]) -> Tuple[str, str, str]:
    """The sweep a row belongs to: (network, input shape, description sha)."""
    return row["network"], row["input_shape"], row["description_sha"]


@dataclass
class _OnDisk:
    """What a plan's CSV already holds for its device: its newest rows (``results.latest_rows``; an older row
    without a description sha takes the network's current one), the keys done, each (network, input shape, sha)'s
    first oom batch, and the sweeps measured again from an oom batch because the plan's memory_limit_mb is above
    the one that caused it (group -> (that batch size, that limit)), with the batch sizes skipped after it."""
    rows: List[Dict[str, Any]]
    done: Set[Tuple[str, ...]]
    oom_at: Dict[Tuple[str, str, str], int]
    again: Dict[Tuple[str, str, str], Tuple[int, int]]

    @classmethod
    def read(cls, csv_path: Path, device: str, nets: List[_Network], limit: int = 0,
             retry_errors: bool = False, plan: Optional[TestPlan] = None) -> "_OnDisk":
        """The rows of ``device`` and of the step ``plan`` measures (None: the default plan's): its optimiser's
        ``phase`` (``plan.training_phase``), its ``loss`` and, among the newest rows, those of its momentum and weight
        decay (``plan.recorded_update``): another optimiser's rows, another loss's or another update's, their ooms
        among them, are another sweep's."""
        plan = plan or TestPlan(device=device)
        phase, update = training_phase(plan.optimizer), update_columns(plan.optimizer, plan.momentum,
                                                                       plan.weight_decay)
        sha_of = {n.name: n.sha for n in nets}
        rows = [r for r in results.latest_rows(
            r if r.get("description_sha") else dict(r, description_sha=sha_of.get(r["network"], ""))
            for r in results.read_rows(csv_path)
            if r["device"] == device and results.phase_of(r) == phase and results.loss_of(r) == plan.loss)
            if recorded_update(r, plan.optimizer) == update]
        oom_at: Dict[Tuple[str, str, str], int] = {}
        again: Dict[Tuple[str, str, str], Tuple[int, int]] = {}
        for r in rows:
            if r["status"] != "oom":
                continue
            raised, bs = raised_limit(r, limit), results.batch_size_of(r)
            if raised is None:
                oom_at[_group(r)] = min(oom_at.get(_group(r), 10**9), bs)
            elif bs < again.get(_group(r), (10**9, 0))[0]:
                again[_group(r)] = (bs, raised)

        def stands(r: Dict[str, Any]) -> bool:
            """Whether a rerun keeps ``r``: not an oom measured again, nor a batch size no standing oom stopped, nor
            an error while ``retry_errors``."""
            if r["status"] == "error" and retry_errors:
                return False
            if r["status"] == "skipped_after_oom":
                return results.batch_size_of(r) > oom_at.get(_group(r), 10**9)
            return raised_limit(r, limit) is None
        return cls(rows, results.measured_keys(r for r in rows if stands(r)), oom_at, again)

    def limit_warning(self, net: _Network, limit: int, csv_name: str) -> Optional[str]:
        """The warning for a network whose oom a lower memory_limit_mb than ``limit`` caused, measured again."""
        found = self.again.get((net.name, net.input_shape, net.sha))
        if found is None:
            return None
        now = f"{limit} now" if limit > 0 else "no limit now"
        return (f"network '{net.name}' ran out of memory at batch size {found[0]} under memory_limit_mb = {found[1]} "
                f"({now}): measuring it again from there; the earlier rows stay in {csv_name} and are passed over")

    def threads_warning(self, names: Set[str], threads: int, csv_name: str) -> Optional[str]:
        """The warning for ``ok`` rows of networks ``names`` that a cpu device measured at other torch threads than
        ``threads``, the plan's: they stand (a row's key has no threads), so a changed ``threads`` would otherwise
        measure nothing and say nothing. None for a plan of torch's default (0), whose count the runner does not know
        (a row records the count torch chose), and for a row that records none (written before it was recorded)."""
        if threads <= 0:
            return None
        other = [r for r in self.rows if r["network"] in names and r["status"] == "ok" and r.get("backend") == "cpu"
                 and str(r.get("threads") or "") not in ("", str(threads))]
        if not other:
            return None
        before = ", ".join(sorted({str(r["threads"]) for r in other}, key=lambda t: (len(t), t)))
        many = len(other) > 1
        return (f"{len(other)} row{'s' if many else ''} of this sweep in {csv_name} {'were' if many else 'was'} "
                f"measured at threads = {before}, the config's is threads = {threads}: "
                f"{'they stand' if many else 'it stands'} and "
                f"{'are' if many else 'is'} not measured again (a row is not keyed by its threads); to measure at the "
                "new setting, profile it under another device name")

    def changed_warning(self, net: _Network, n_batch_sizes: int, csv_name: str) -> Optional[str]:
        """The warning for a network whose description changed since its rows were measured, if it has
        batch sizes left to measure."""
        _, stale = results.split_stale([r for r in self.rows if r["network"] == net.name], {net.name: net.sha})
        measured = sum(r["network"] == net.name and r["description_sha"] == net.sha for r in self.rows)
        if not stale or measured >= n_batch_sizes:
            return None
        return (f"network '{net.name}' changed since it was measured (description {stale[0]['description_sha']} -> "
                f"{net.sha}): measuring it again; its {len(stale)} earlier rows stay in {csv_name} and are passed over")


def _lean_runner_warning() -> Optional[str]:
    own_rss = status_mb("self", "VmRSS") or 0.0
    if own_rss <= LEAN_RUNNER_MB:
        return None
    return (f"the runner holds {own_rss:.0f} MiB: children inherit it as their peak RSS floor; run it as "
            "'python -m perf4sight.profiling.runner' in its own process")


def _sweep_network(plan: TestPlan, plan_path: Path, net: _Network, backend: Backend, disk: _OnDisk,
                   env: Dict[str, Any], reference: Optional["_Reference"] = None
                   ) -> Iterator[Tuple[int, Optional[Dict[str, Any]], float]]:
    """Measure ``net`` at each batch size of the plan: yields (batch size, row without the key columns or
    None when already measured, wall s). ``env`` gathers the device facts children report; ``reference``, when
    the plan has one, is measured around the measurements (:class:`_Reference`)."""
    not_run = net.problem  # set when the network cannot be built at all
    for bs in plan.batch_sizes:
        if results.row_key(_key_columns(plan, net, bs)) in disk.done:
            yield bs, None, 0.0
            continue
        stop = disk.oom_at.get((net.name, net.input_shape, net.sha))
        if stop is not None and bs > stop:
            yield bs, {"status": "skipped_after_oom", "message": f"batch size {stop} ran out of memory"}, 0.0
            continue
        if not_run:
            yield bs, {"status": "error", "message": not_run}, 0.0
            continue
        if reference is not None:
            reference.before_measurement()
        outcome = run_repeats(plan, plan_path, net.index, bs, backend)
        if reference is not None:
            reference.after_measurement()
        row = dict(outcome.result)
        row["peak_rss_mb"] = outcome.peak_rss_mb
        if row["status"] == "error" and row.get("stage") in ("setup", "build"):
            not_run = f"not run: {row.get('message', '')}"[:300]
        if row["status"] == "oom":
            disk.oom_at[(net.name, net.input_shape, net.sha)] = bs
        env.update({k: row[k] for k in ("torch_version", "threads", "device_model", "clocks") if row.get(k)})
        yield bs, row, outcome.wall_s


class _Reference:
    """The plan's drift reference (``reference_every`` > 0): one configuration measured in a fresh child before
    the sweep's first new measurement, after every ``reference_every`` new ones and after the last, each row
    appended to ``reference_output`` (same columns as the measurements; the fingerprint divides the step times by
    the reference interpolated in time). A reference that does not end ``ok`` is not measured again in this run
    (a warning says why); the sweep goes on."""

    def __init__(self, plan: TestPlan, plan_path: Path, net: _Network, batch_size: int, backend: Backend,
                 env: Dict[str, Any], emit: Emit) -> None:
        self.plan, self.plan_path, self.net, self.batch_size = plan, plan_path, net, batch_size
        self.backend, self.env, self.emit = backend, env, emit
        self.csv_path = plan.resolve(plan_path.parent, plan.reference_output)
        self.since = -1  # new measurements since the last reference; -1: none taken yet
        self.failed = False

    @classmethod
    def of(cls, plan: TestPlan, plan_path: Path, nets: List[_Network], backend: Backend, env: Dict[str, Any],
           emit: Emit) -> Optional["_Reference"]:
        """The plan's reference, None without one; ``UserError`` for a reference network the plan lacks."""
        if plan.reference_every <= 0 or not nets:
            return None
        wanted = plan.reference_network or nets[0].name
        net = next((n for n in nets if n.name == wanted), None)
        if net is None:
            raise UserError(f"plan: 'reference_network' {wanted!r} is not one of its networks "
                            f"({', '.join(n.name for n in nets[:8])}{', ...' if len(nets) > 8 else ''})")
        return cls(plan, plan_path, net, plan.reference_batch_size or plan.batch_sizes[0], backend, env, emit)

    def before_measurement(self) -> None:
        if self.since < 0 or self.since >= self.plan.reference_every:
            self._measure()

    def after_measurement(self) -> None:
        self.since += 1

    def last(self) -> None:
        """After the sweep: once more if anything was measured since the last reference."""
        if self.since > 0:
            self._measure()

    def _measure(self) -> None:
        self.since = 0
        if self.failed:
            return
        outcome = run_child(self.plan, self.plan_path, self.net.index, self.batch_size, self.backend)
        row = dict(outcome.result, peak_rss_mb=outcome.peak_rss_mb)
        full = _csv_row(self.plan, self.net, self.batch_size, self.env, row)
        results.append_row(self.csv_path, full)
        self.emit({"event": "reference", "network": self.net.name, "batch_size": self.batch_size,
                   "status": full["status"], "latency_ms_median": full.get("latency_ms_median", ""),
                   "wall_s": outcome.wall_s})
        if full["status"] != "ok":
            self.failed = True
            self.emit({"event": "warning", "message": f"drift reference {self.net.name} @ {self.batch_size}: "
                       f"{full['status']} ({full.get('message', '')}); not measured again in this run"})


def _key_columns(plan: TestPlan, net: _Network, bs: int) -> Dict[str, Any]:
    """The columns that say which measurement a row is (``results.row_key`` reads its key from them)."""
    return {"device": plan.device, "backend": plan.backend, "network": net.name, "family": net.family,
            "pruning_level": net.pruning_level, "batch_size": bs, "input_shape": net.input_shape,
            "phase": training_phase(plan.optimizer), "loss": plan.loss,
            "description_sha": net.sha}


def _csv_row(plan: TestPlan, net: _Network, bs: int, env: Dict[str, Any], row: Dict[str, Any]) -> Dict[str, Any]:
    """A measurement's CSV row: the device facts, its key columns, the optimiser's settings, then what the child
    reported."""
    full = {**env, "warmup_steps": plan.warmup_steps, **_key_columns(plan, net, bs),
            **update_columns(plan.optimizer, plan.momentum, plan.weight_decay),
            **{k: v for k, v in row.items() if k in results.COLUMNS}, "timestamp": _now()}
    if full["status"] != "ok":
        full.update(warmup_steps="", timed_steps="")
    return full


def run_plan(plan_path: Union[str, Path], emit: Emit = print_event) -> Dict[str, int]:
    """Run the whole sweep of a plan file; returns counts of new ``ok``/``oom``/``skipped_after_oom``/
    ``error`` rows and of keys ``already_measured``. Bad plans raise ``UserError``."""
    plan_path = Path(plan_path).resolve()
    plan = load_plan(plan_path)
    backend = get_backend(plan)
    nets = _describe_networks(plan, plan_path.parent)
    csv_path = plan.resolve(plan_path.parent, plan.output)
    counts = dict({s: 0 for s in results.STATUSES}, already_measured=0)
    with _locked(csv_path):
        shutil.rmtree(str(children_dir(csv_path)), ignore_errors=True)  # a killed runner's, left behind
        plan, plan_path = _pinned(plan, plan_path, csv_path, nets)
        disk = _OnDisk.read(csv_path, plan.device, nets, plan.memory_limit_mb, plan.retry_errors, plan)
        total = len(nets) * len(plan.batch_sizes)
        emit({"event": "plan", "device": plan.device, "backend": plan.backend, "networks": len(nets),
              "batch_sizes": plan.batch_sizes, "total": total, "csv": str(csv_path)})
        for warning in (_lean_runner_warning(),
                        disk.threads_warning({n.name for n in nets}, plan.threads, csv_path.name)
                        if plan.backend == "cpu" else None):
            if warning:
                emit({"event": "warning", "message": warning})
        env: Dict[str, Any] = {"hostname": socket.gethostname(), "threads": plan.threads or ""}
        position = 0
        t_start = time.monotonic()
        reference = _Reference.of(plan, plan_path, nets, backend, env, emit)
        for net in nets:
            for warning in (disk.changed_warning(net, len(plan.batch_sizes), csv_path.name),
                            disk.limit_warning(net, plan.memory_limit_mb, csv_path.name)):
                if warning:
                    emit({"event": "warning", "message": warning})
            for bs, row, wall in _sweep_network(plan, plan_path, net, backend, disk, env, reference):
                position += 1
                if row is None:
                    counts["already_measured"] += 1
                    emit({"event": "already", "network": net.name, "batch_size": bs, "index": position, "total": total})
                    continue
                full = _csv_row(plan, net, bs, env, row)
                results.append_row(csv_path, full)
                disk.done.add(results.row_key(full))
                counts[full["status"]] += 1
                emit({"event": "row", "network": net.name, "batch_size": bs, "status": full["status"],
                      "message": full.get("message", ""), "latency_ms_median": full.get("latency_ms_median", ""),
                      "peak_rss_mb": full.get("peak_rss_mb", ""), "wall_s": wall, "index": position, "total": total})
        if reference is not None:
            reference.last()
        _price_ops(plan, plan_path, emit)
        shutil.rmtree(str(children_dir(csv_path)), ignore_errors=True)
        emit({"event": "done", "summary": counts, "wall_s": round(time.monotonic() - t_start, 3), "csv": str(csv_path)})
    return counts


def _pinned(plan: TestPlan, plan_path: Path, csv_path: Path, nets: List[_Network]) -> Tuple[TestPlan, Path]:
    """This run's own copy of its plan, in the children's folder (which this runner's lock guards), its paths made
    absolute: the children read it rather than ``plan_path``, which another invocation refused by the lock may
    already have replaced with a plan of its own (other networks, other steps). Its networks are copies too, of the
    bytes each row's ``description_sha`` is taken from (``nets``): a description rewritten while the sweep runs (the
    networks stage run meanwhile) would be measured under the sha of the file it replaced. A description that could
    not be read keeps its own path."""
    def absolute(relative: str) -> str:
        return str(plan.resolve(plan_path.parent, relative)) if relative else ""

    folder = children_dir(csv_path)
    networks = []
    for net in nets:
        if not net.data:
            networks.append(str(net.path))
            continue
        copy = folder / "nets" / str(net.index) / net.path.name
        copy.parent.mkdir(parents=True, exist_ok=True)
        with naming_file(copy):  # a full disk: the error names the file
            copy.write_bytes(net.data)
        networks.append(str(copy))
    pinned = replace(plan, networks=networks, output=absolute(plan.output),
                     reference_output=absolute(plan.reference_output), op_prices_output=absolute(plan.op_prices_output))
    return pinned, save_plan(pinned, folder / "plan.json")


def _prices_current(path: Path, plan: TestPlan) -> bool:
    """Whether ``path`` holds op prices measured as ``plan`` would measure them now (its threads, this torch, each
    op of ``PRICED_OPS`` measured or found missing from this torch). A table measured before an op was added to
    ``PRICED_OPS`` is measured again (the fingerprint prices that op as another until then)."""
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return False
    from perf4sight.profiling.op_prices import FORMAT_VERSION, PRICED_OPS  # imports no torch
    if not isinstance(data, dict) or not isinstance(data.get("ops"), dict):
        return False
    threads = plan.threads or data.get("threads")
    covered = set(data["ops"]) | set(data.get("unmeasured") or ())
    return (data.get("format_version") == FORMAT_VERSION and data.get("threads") == threads
            and data.get("torch_version") == torch_version() and covered >= set(PRICED_OPS))


def torch_version() -> str:
    """The installed torch's version, read without importing it (this process stays lean; ``import torch`` takes
    seconds on a small device): ``torch/version.py``'s ``__version__``, which ``torch.__version__`` is made from, or
    where that file cannot be read, a fresh process's ``torch.__version__``."""
    try:
        spec = importlib.util.find_spec("torch")  # finds the package without running it
    except (ImportError, ValueError):
        spec = None
    if spec is not None and spec.origin:
        try:
            found = re.search(r"^__version__\s*=\s*['\"]([^'\"]+)['\"]",
                              (Path(spec.origin).parent / "version.py").read_text(), re.MULTILINE)
        except OSError:
            found = None
        if found:
            return found.group(1)
    out = subprocess.run([sys.executable, "-c", "import torch; print(torch.__version__)"], stdout=subprocess.PIPE,
                         stderr=subprocess.DEVNULL, universal_newlines=True)
    return out.stdout.strip()


def _price_ops(plan: TestPlan, plan_path: Path, emit: Emit) -> None:
    """Measure the plan's op prices (``op_prices.py``) in a fresh process into ``plan.op_prices_output``, unless
    it holds current ones; a failure is a warning event (the rows stand; the fingerprint does without prices)."""
    if not plan.op_prices_output:
        return
    out = plan.resolve(plan_path.parent, plan.op_prices_output)
    if _prices_current(out, plan):
        return
    cmd = [sys.executable, "-m", "perf4sight.profiling.op_prices", str(out), "--threads", str(plan.threads)]
    emit({"event": "op_prices", "state": "measuring", "path": str(out)})
    t0 = time.monotonic()
    try:
        proc = subprocess.run(cmd, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                              env=_child_env(plan), timeout=plan.timeout_s, universal_newlines=True)
    except subprocess.TimeoutExpired:
        emit({"event": "warning", "message": f"op prices: not measured in {plan.timeout_s:g} s (timeout_s); "
                                             "the fingerprint does without them"})
        return
    if proc.returncode != 0:
        last = (proc.stderr.strip().splitlines() or ["exit code {}".format(proc.returncode)])[-1]
        emit({"event": "warning", "message": f"op prices: not measured ({last[:300]}); the fingerprint does "
                                             "without them"})
        return
    emit({"event": "op_prices", "state": "done", "path": str(out), "wall_s": round(time.monotonic() - t0, 3)})


def main(argv: Optional[List[str]] = None) -> int:
    """CLI entry: run the plan given as the only argument; exit 2 with an ``error`` event on a ``UserError``."""
    argv = sys.argv[1:] if argv is None else argv
    if len(argv) != 1 or argv[0].startswith("-"):
        print("usage: python -m perf4sight.profiling.runner PLAN.json", file=sys.stderr)
        return 2
    signal.signal(signal.SIGTERM, _interrupt)  # a terminated runner stops its measuring child, as on Ctrl-C
    try:
        run_plan(argv[0])
    except UserError as exc:
        print_event({"event": "error", "message": str(exc)})
        print(f"error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print_event({"event": "error", "message": "interrupted: the measurement in flight was stopped, rows "
                                                  "already written are kept"})
        return 130
    except OSError as exc:  # e.g. the disk filled up: which file, and that the rows written are kept
        where = " writing {}".format(exc.filename) if exc.filename else ""
        message = "{}{} ({}): rows already written are kept".format(type(exc).__name__, where, exc.strerror or exc)
        if exc.errno in NO_SPACE:
            message += "; free some space and rerun to measure the rest"
        print_event({"event": "error", "message": message})
        print("error: " + message, file=sys.stderr)
        return 1
    return 0


def _ignore_interrupts() -> None:
    """Ignore SIGINT and SIGTERM from now on (the process is on its way out); a no-op off the main thread."""
    try:
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
    except ValueError:  # signal handlers can only be set from the main thread
        pass


@contextmanager
def _interrupts_held() -> Iterator[None]:
    """Hold SIGINT and SIGTERM while the block runs, then deliver the first that came (to the handlers
    in place before: the same outcome, only later); a no-op off the main thread. Around starting a child:
    a KeyboardInterrupt raised inside ``subprocess.Popen`` after its fork leaves the child running with
    no ``Popen`` to kill it by, so it would go on measuring after the runner stopped."""
    held: List[int] = []
    before = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM)}
    if threading.current_thread() is not threading.main_thread() or None in before.values():
        yield  # handlers can only be set on the main thread, and one set outside Python could not be put back
        return
    for s in before:
        signal.signal(s, lambda signum, frame: held.append(signum))
    try:
        yield
    finally:
        for s, handler in before.items():
            signal.signal(s, handler)
        if held:
            os.kill(os.getpid(), held[0])  # signal.raise_signal is Python 3.8+


def _interrupt(signum: int, frame: Any) -> None:
    raise KeyboardInterrupt(f"signal {signum}")


if __name__ == "__main__":
    sys.exit(main())
