"""Run a command detached from the SSH session and remember how it ended (runs on the device).

Standard library only (and ``perf4sight.files``). Usage, all paths absolute or relative to the current folder::

    python -m perf4sight.profiling.detach start RUN_DIR -- CMD ARG...   # prints a JSON state
    python -m perf4sight.profiling.detach status RUN_DIR                # prints a JSON state
    python -m perf4sight.profiling.detach stop RUN_DIR

``start`` launches a supervisor in a new session (so a dropped SSH connection, which hangs up
the login session, does not reach it) and returns at once. The supervisor runs CMD in RUN_DIR
with stdout and stderr appended to ``run.log`` and, when CMD ends, writes ``run.exit``
(``{"rc": ..., "finished": ...}``) atomically. ``run.json`` holds the supervisor's pid and the
kernel boot id, so a pid left over from before a reboot is never mistaken for a live run.

States: ``running`` (supervisor alive), ``finished`` (run.exit present, with ``rc``), ``dead``
(started, but the supervisor vanished without run.exit: killed, crashed or rebooted), ``none``.
``start`` on a ``running`` directory starts nothing and reports ``running``.
"""
import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from datetime import datetime, timezone
from pathlib import Path

from perf4sight.files import atomic_path, naming_file
from typing import Dict, List, Optional

__all__ = ["state", "start", "stop", "supervise", "main"]

MARK = "perf4sight.profiling.detach"


def _boot_id() -> str:
    try:
        return Path("/proc/sys/kernel/random/boot_id").read_text().strip()
    except OSError:
        return ""


def _write_json(path: Path, obj: Dict) -> None:
    """Write ``obj`` to ``path`` whole or not at all; an ``OSError`` names ``path`` (a failed write names none)."""
    with naming_file(path), atomic_path(path, unique=False) as tmp, tmp.open("w") as fh:  # one writer (profile lock)
        json.dump(obj, fh)
        fh.flush()
        os.fsync(fh.fileno())


def _os_error_line(exc: OSError) -> str:
    """``path: reason`` of an ``OSError``, e.g. ``.../run.json: No space left on device``."""
    return "%s: %s" % (exc.filename, exc.strerror) if exc.filename and exc.strerror else str(exc)


def _read_json(path: Path) -> Optional[Dict]:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


def _is_supervisor(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass
    try:
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    except OSError:
        return True  # no /proc: trust kill(0)
    try:
        with open(f"/proc/{pid}/stat") as fh:
            if fh.read().rsplit(")", 1)[1].split()[0] == "Z":
                return False
    except (OSError, IndexError):
        pass
    return MARK.encode() in cmdline and b"supervise" in cmdline


def state(run_dir: Path) -> Dict:
    """The run's state as a dict with at least ``state``; see the module docstring."""
    run_dir = Path(run_dir)
    info = _read_json(run_dir / "run.json")
    ended = _read_json(run_dir / "run.exit")
    if info and info.get("boot_id") == _boot_id() and _is_supervisor(int(info["pid"])):
        return {"state": "running", "pid": info["pid"], "started": info.get("started")}
    if ended is not None:
        return {"state": "finished", **ended}
    if info:
        return {"state": "dead", "pid": info.get("pid"), "started": info.get("started"),
                "rebooted": info.get("boot_id") != _boot_id()}
    return {"state": "none"}


def start(run_dir: Path, cmd: List[str]) -> Dict:
    """Launch the supervisor for ``cmd`` unless one is running; returns the new state."""
    run_dir = Path(run_dir).resolve()
    now = state(run_dir)
    if now["state"] == "running":
        return now
    if now["state"] == "dead" and not now.get("rebooted") and now.get("pid"):
        try:  # the supervisor died but its command may live on: end the whole group first
            os.killpg(int(now["pid"]), signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
    with contextlib.suppress(FileNotFoundError):  # unlink's missing_ok is Python 3.8+
        (run_dir / "run.exit").unlink()
    proc = subprocess.Popen([sys.executable, "-m", MARK, "supervise", str(run_dir), "--", *cmd],
                            cwd=str(run_dir), stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL, start_new_session=True, close_fds=True)
    started = datetime.now(timezone.utc).isoformat(timespec="seconds")
    try:
        _write_json(run_dir / "run.json", {"pid": proc.pid, "boot_id": _boot_id(), "started": started, "cmd": cmd})
    except OSError:  # untracked, it would run beside the next start's: ended with its group
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
        raise
    return {"state": "started", "pid": proc.pid, "started": started}


def supervise(run_dir: Path, cmd: List[str]) -> int:
    """Run ``cmd``, log its output, record its exit status in run.exit; forwards SIGTERM/SIGINT."""
    run_dir = Path(run_dir)
    signal.signal(signal.SIGHUP, signal.SIG_IGN)
    with (run_dir / "run.log").open("ab") as log:
        child = subprocess.Popen(cmd, cwd=str(run_dir), stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT)

        def forward(signum: int, _frame: object) -> None:
            child.send_signal(signum)

        signal.signal(signal.SIGTERM, forward)
        signal.signal(signal.SIGINT, forward)
        rc = child.wait()
    _write_json(run_dir / "run.exit", {"rc": rc, "finished": datetime.now(timezone.utc).isoformat(timespec="seconds")})
    return rc


def stop(run_dir: Path, grace_s: float = 10.0) -> Dict:
    """SIGTERM the supervisor (it forwards to the command), SIGKILL its group after ``grace_s``."""
    now = state(Path(run_dir))
    if now["state"] != "running":
        return now
    pid = int(now["pid"])
    os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + grace_s
    while time.monotonic() < deadline and _is_supervisor(pid):
        time.sleep(0.1)
    if _is_supervisor(pid):
        os.killpg(pid, signal.SIGKILL)
    return state(Path(run_dir))


def main(argv: Optional[List[str]] = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if len(args) < 2 or args[0] not in ("start", "status", "stop", "supervise"):
        print(__doc__, file=sys.stderr)
        return 2
    action, run_dir, rest = args[0], Path(args[1]), args[2:]
    if rest[:1] == ["--"]:
        rest = rest[1:]
    if action == "supervise":
        return supervise(run_dir, rest)
    try:
        if action == "start":
            if not rest:
                print("detach start: no command given", file=sys.stderr)
                return 2
            result = start(run_dir, rest)
        elif action == "stop":
            result = stop(run_dir)
        else:
            result = state(run_dir)
    except OSError as exc:  # e.g. a full disk: one line naming the file, for the host to show
        print("detach %s: %s" % (action, _os_error_line(exc)), file=sys.stderr)
        return 1
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
