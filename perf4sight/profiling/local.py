"""Profile on this machine: write the test plan, run the device runner as a subprocess, follow it.

The runner is the very code a remote device runs (``python -m perf4sight.profiling.runner``);
here it is started locally and its JSON-line progress drives a rich progress bar. Running it
as its own small process (not in this one, which may hold torch and pandas) also keeps the
children's ``os.wait4`` peak RSS clean: a child inherits its parent's peak RSS at spawn.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from perf4sight.config import Config
from perf4sight.errors import UserError
from perf4sight.profiling.plan import TestPlan, save_plan
from perf4sight.profiling.results import OP_PRICES_JSON, results_path
from perf4sight.wording import device_table

__all__ = ["ProfileSummary", "make_plan", "profile_local", "follow_runner", "PLAN_NAME"]

PLAN_NAME = "plan.json"
_PACKAGE_ROOT = Path(__file__).resolve().parents[2]

ProgressSink = Callable[[dict[str, Any]], None]
_RUNNERS: set[subprocess.Popen] = set()  # runner processes being followed, for stop_runners()
_RUNNERS_LOCK = threading.Lock()


@dataclass
class ProfileSummary:
    """What one profiling run added: counts of new rows by status and keys found already measured."""
    device: str
    csv_path: Path
    plan_path: Path
    ok: int = 0
    oom: int = 0
    skipped_after_oom: int = 0
    error: int = 0
    already_measured: int = 0
    wall_s: float = 0.0
    errors: list[str] = field(default_factory=list)  # "network@batch: message" of the error rows
    warnings: list[str] = field(default_factory=list)  # the runner's warnings (e.g. a network that changed)

    @property
    def new_rows(self) -> int:
        """Rows this run wrote: ok, oom, skipped after an oom and error."""
        return self.ok + self.oom + self.skipped_after_oom + self.error


def _reference_batch_size(cfg: Config, descriptions: list[str | Path]) -> int:
    """``[profile] reference_batch_size``; where it is left to its default (0: the smallest batch size) and that is 1,
    which the reference network cannot train (a batch norm over a 1x1 map: every reference an error row, so no drift
    correction at all), the next batch size instead (0 where there is none)."""
    p = cfg.profile
    if p.reference_every <= 0 or p.reference_batch_size or p.batch_sizes[:1] != [1] or not descriptions:
        return p.reference_batch_size
    from perf4sight.ir.schema import load_description

    descs = (load_description(d) for d in descriptions)  # read up to the reference's
    net = next((d for d in descs if not p.reference_network or d.name == p.reference_network), None)
    if net is None or not net.untrainable_at_batch_one:
        return p.reference_batch_size
    return next((b for b in p.batch_sizes if b > 1), 0)


def make_plan(cfg: Config, device_name: str, descriptions: list[str | Path], output: str = "measurements.csv",
              relative_to: Path | None = None) -> TestPlan:
    """The test plan for ``device_name`` from the config's ``[profile]`` and ``[devices.<name>]`` tables.

    Description paths are written relative to ``relative_to`` when given (a remote plan that
    ships with its networks), else absolute.
    """
    dev = cfg.device(device_name)
    p = cfg.profile
    nets = []
    for d in descriptions:
        path = Path(d).resolve()
        if not path.is_file():
            raise UserError(f"network description file not found: {d}")
        nets.append(os.path.relpath(path, relative_to) if relative_to else str(path))
    if not nets:
        raise UserError(f"device '{device_name}': no network descriptions to profile (run the networks stage first)")
    return TestPlan(device=device_name, backend=dev.backend, networks=nets, batch_sizes=list(p.batch_sizes),
                    warmup_steps=p.warmup_steps, timed_steps=p.timed_steps, min_timed_s=p.min_timed_s,
                    repeats=p.repeats, timeout_s=p.timeout_s, max_swap_in_mb=p.max_swap_in_mb,
                    memory_limit_mb=dev.memory_limit_mb, threads=dev.threads, gpu_index=dev.gpu_index,
                    learning_rate=p.learning_rate, momentum=p.momentum, weight_decay=p.weight_decay,
                    optimizer=p.optimizer, loss=p.loss, output=output,
                    reference_every=p.reference_every, reference_network=p.reference_network,
                    reference_batch_size=_reference_batch_size(cfg, descriptions), retry_errors=p.retry_errors,
                    op_prices_output=OP_PRICES_JSON if p.op_prices and dev.backend == "cpu" else "")


def follow_runner(cmd: list[str], on_event: ProgressSink, env: dict[str, str] | None = None,
                  cancel: threading.Event | None = None) -> dict[str, Any]:
    """Run a runner command, pass each JSON event on stdout to ``on_event``; returns the ``done`` event.

    A runner that exits without ``done`` raises ``UserError`` with its last message. Used for
    the local subprocess; a remote orchestrator can pass an ``ssh ...`` command line. ``cancel``:
    once set (an interrupt seen by another thread), a runner started after :func:`stop_runners`
    ran is stopped at once.
    """
    tail: deque[str] = deque(maxlen=5)
    done: dict[str, Any] | None = None
    with subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                          text=True, env=env, bufsize=1) as proc:
        assert proc.stdout is not None
        with _RUNNERS_LOCK:
            _RUNNERS.add(proc)
        if cancel is not None and cancel.is_set():  # interrupted before it was registered
            _stop(proc)
        try:
            for event in _events(proc.stdout, tail):
                if event["event"] == "done":
                    done = event
                on_event(event)
        except BaseException:  # interrupted: stop the runner (it stops its measuring child), rows stay on disk
            _stop(proc)
            raise
        finally:
            with _RUNNERS_LOCK:
                _RUNNERS.discard(proc)
    if done is None:
        last = tail[-1] if tail else f"exit code {proc.returncode}"
        raise UserError(f"the profiling runner stopped early: {last}")
    return done


def stop_runners() -> None:
    """Stop every runner this process follows (from any thread): on Ctrl-C or SIGTERM of the CLI, whose
    main thread is not the one reading them. Their followers then end as with a runner that stopped early."""
    with _RUNNERS_LOCK:
        running = list(_RUNNERS)
    for proc in running:
        _stop(proc)


def _stop(proc: subprocess.Popen, grace_s: float = 10.0) -> None:
    """SIGTERM ``proc`` and give it ``grace_s`` to finish cleanly, then SIGKILL it."""
    if proc.poll() is not None:
        return
    proc.terminate()
    try:
        proc.wait(timeout=grace_s)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


def _events(lines: Any, tail: deque[str]) -> Any:
    """The JSON events among the runner's output ``lines``; other lines (and error messages) go to ``tail``."""
    for line in lines:
        line = line.strip()
        if not line:
            continue
        try:
            event = json.loads(line) if line.startswith("{") else None
        except json.JSONDecodeError:
            event = None
        if not isinstance(event, dict) or "event" not in event:
            tail.append(line)
            continue
        if event["event"] == "error":
            tail.append(str(event.get("message", "")))
        yield event


def progress_bars() -> Any:
    """Rich progress bars (one task per device: description, bar, done/total, time, its ``note`` field), on
    stderr: progress is not output, so stdout piped to a file holds the stage's tables alone."""
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    return Progress(TextColumn("{task.description}", markup=False), BarColumn(), MofNCompleteColumn(),
                    TimeElapsedColumn(), TextColumn("{task.fields[note]}", markup=False),
                    console=Console(stderr=True))  # names as text: a device or network "[b]" is no markup


def _rich_sink(device: str) -> tuple[ProgressSink, Callable[[], None]]:
    """A rich progress bar fed by runner events; returns (sink, close)."""
    bar = progress_bars()
    state: dict[str, Any] = {}

    def sink(event: dict[str, Any]) -> None:
        kind = event.get("event")
        if kind == "plan":
            bar.start()
            state["task"] = bar.add_task(f"profile {device}", total=event["total"], note="")
        elif kind in ("row", "already") and "task" in state:
            status = event.get("status", "already measured")
            extra = f" {event['latency_ms_median']} ms" if event.get("latency_ms_median") not in (None, "") else ""
            bar.update(state["task"], completed=event["index"],
                       note=f"{event['network']} @ {event['batch_size']}: {status}{extra}")
        elif kind == "op_prices" and "task" in state:
            bar.update(state["task"], note="pricing the ops between the convolutions" if event.get("state") ==
                       "measuring" else f"ops priced in {event.get('wall_s', 0):.0f} s")

    return sink, bar.stop


def profile_local(cfg: Config, device_name: str, descriptions: list[Path],
                  progress: ProgressSink | bool | None = None, cancel: threading.Event | None = None) -> ProfileSummary:
    """Profile ``descriptions`` on this machine as device ``device_name``; resumable.

    Writes ``<profiling_dir>/<device>/plan.json``, runs the runner in a subprocess and appends
    to ``results_path(cfg.profiling_dir, device)``. ``progress``: None/True = rich progress bar,
    a callable = receives every runner event (dicts, see ``perf4sight.profiling.runner``),
    False = silent. Raises ``UserError`` if the device is remote or the runner fails.
    """
    dev = cfg.device(device_name)
    if dev.host:
        raise UserError(f"{cfg.path}: {device_table(device_name)} has host '{dev.host}': "
                        "profile it with the remote profiler")
    csv_path = results_path(cfg.profiling_dir, device_name)
    plan_path = csv_path.parent / PLAN_NAME
    plan = make_plan(cfg, device_name, list(descriptions), output=csv_path.name)
    try:
        save_plan(plan, plan_path)
    except OSError as exc:  # e.g. a read-only profiling_dir
        raise UserError(f"device '{device_name}': cannot write its plan {plan_path}: {exc.strerror or exc}") from None
    summary = ProfileSummary(device=device_name, csv_path=csv_path, plan_path=plan_path)

    close: Callable[[], None] = lambda: None
    if progress is None or progress is True:
        sink, close = _rich_sink(device_name)
    elif progress is False:
        sink = lambda event: None  # noqa: E731
    else:
        sink = progress

    def on_event(event: dict[str, Any]) -> None:
        if event.get("event") == "row" and event.get("status") == "error":
            summary.errors.append(f"{event['network']}@{event['batch_size']}: {event.get('message', '')}")
        if event.get("event") == "warning":
            summary.warnings.append(str(event.get("message", "")))
        sink(event)

    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(_PACKAGE_ROOT), env.get("PYTHONPATH", "")) if p)
    try:
        done = follow_runner([sys.executable, "-m", "perf4sight.profiling.runner", str(plan_path)], on_event, env,
                             cancel)
    finally:
        close()
    for key, value in done.get("summary", {}).items():
        if hasattr(summary, key):
            setattr(summary, key, int(value))
    summary.wall_s = float(done.get("wall_s", 0.0))
    return summary
