"""Real OpenSSH servers on 127.0.0.1 for the remote-profiling tests.

``SshServer`` starts ``/usr/sbin/sshd -D -e -f <own config>`` on a free port with a freshly
generated ed25519 host key and one authorised client key, logging in as the current user
(root in the test container). It is stopped by its own pid. ``cut_connections()`` kills the
per-connection sshd processes (descendants of the listener, found through /proc) — a dropped
network link as the client sees it — while the session's processes are left to notice it and
processes that detached from the session survive.

If ``/usr/sbin/sshd`` is missing and we are root, ``ensure_sshd()`` tries
``apt-get install -y openssh-server`` once; tests skip with the reason if that fails.
"""
from __future__ import annotations

import getpass
import os
import shutil
import signal
import socket
import subprocess
import time
from pathlib import Path

__all__ = ["SshServer", "ensure_sshd", "free_port", "SSHD", "SSH_KEYGEN"]

SSHD = "/usr/sbin/sshd"
SSH_KEYGEN = shutil.which("ssh-keygen") or "/usr/bin/ssh-keygen"
_install_error: str | None = None


def ensure_sshd() -> str | None:
    """Make sure OpenSSH's server exists; returns None when usable, else why not (for pytest.skip)."""
    global _install_error, SSH_KEYGEN
    if Path(SSHD).is_file() and Path(SSH_KEYGEN).is_file():
        return None
    if _install_error is not None:
        return _install_error
    if os.geteuid() != 0:
        _install_error = f"{SSHD} is missing and we are not root to install openssh-server"
        return _install_error
    env = dict(os.environ, DEBIAN_FRONTEND="noninteractive")
    for cmd in (["apt-get", "update", "-qq"], ["apt-get", "install", "-y", "-qq", "openssh-server", "openssh-client"]):
        try:
            done = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300)
        except (OSError, subprocess.TimeoutExpired) as exc:
            _install_error = f"cannot install openssh-server: {exc}"
            return _install_error
        if done.returncode != 0:
            _install_error = f"cannot install openssh-server: {' '.join(cmd)} failed: {done.stderr.strip()[-200:]}"
            return _install_error
    SSH_KEYGEN = shutil.which("ssh-keygen") or SSH_KEYGEN
    if not Path(SSHD).is_file():
        _install_error = f"openssh-server installed but {SSHD} is still missing"
    return _install_error


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on right now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _keygen(path: Path) -> None:
    subprocess.run([SSH_KEYGEN, "-q", "-t", "ed25519", "-N", "", "-C", "perf4sight-test", "-f", str(path)],
                   check=True, capture_output=True)


def _command_name(pid: int) -> str:
    """The process's command name (``/proc/<pid>/comm``), "" once it is gone."""
    try:
        return Path(f"/proc/{pid}/comm").read_text().strip()
    except OSError:
        return ""


class SshServer:
    """One sshd on 127.0.0.1:<port>; files live in ``folder``.

    ``client_key`` is the private key that may log in; ``host_key_pub`` the server's public
    host key line; ``known_hosts_line`` the line a client's known_hosts needs.
    """

    def __init__(self, folder: Path, client_key: Path | None = None, port: int | None = None) -> None:
        self.folder = Path(folder)
        self.folder.mkdir(parents=True, exist_ok=True)
        self.port = port or free_port()
        self.user = getpass.getuser()
        self.host_key = self.folder / "ssh_host_ed25519_key"
        if not self.host_key.exists():
            _keygen(self.host_key)
        if client_key is None:
            client_key = self.folder / "client_key"
            if not client_key.exists():
                _keygen(client_key)
        self.client_key = Path(client_key)
        self.authorized_keys = self.folder / "authorized_keys"
        self.authorized_keys.write_text(Path(str(self.client_key) + ".pub").read_text())
        self.config = self.folder / "sshd_config"
        self.proc: subprocess.Popen | None = None
        self.log = self.folder / "sshd.log"

    @property
    def host_key_pub(self) -> str:
        return Path(str(self.host_key) + ".pub").read_text().split(" perf4sight-test")[0].strip()

    @property
    def known_hosts_line(self) -> str:
        return f"[127.0.0.1]:{self.port} {self.host_key_pub}\n"

    def _write_config(self) -> None:
        self.config.write_text(
            f"Port {self.port}\nListenAddress 127.0.0.1\nHostKey {self.host_key}\n"
            f"PidFile {self.folder / 'sshd.pid'}\nAuthorizedKeysFile {self.authorized_keys}\n"
            "StrictModes no\nPermitRootLogin prohibit-password\nPubkeyAuthentication yes\n"
            "PasswordAuthentication no\nKbdInteractiveAuthentication no\nUsePAM no\n"
            "Subsystem sftp internal-sftp\nMaxStartups 50\nMaxSessions 50\nLogLevel ERROR\n"
            "ClientAliveInterval 0\nUseDNS no\n")

    def start(self, timeout_s: float = 10.0) -> "SshServer":
        """Start sshd in the foreground (-D) and wait until it accepts TCP connections."""
        Path("/run/sshd").mkdir(parents=True, exist_ok=True)
        self._write_config()
        log = self.log.open("ab")
        self.proc = subprocess.Popen([SSHD, "-D", "-e", "-f", str(self.config)], stdout=log, stderr=log,
                                     stdin=subprocess.DEVNULL)
        log.close()
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"sshd exited with {self.proc.returncode}: {self.log.read_text()[-500:]}")
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=0.5):
                    return self
            except OSError:
                time.sleep(0.05)
        self.stop()
        raise RuntimeError(f"sshd did not listen on port {self.port} within {timeout_s} s")

    def _descendants(self) -> list[int]:
        """Pids of every process below the listener (the per-connection sshd and its session)."""
        if self.proc is None:
            return []
        children: dict[int, list[int]] = {}
        for entry in os.listdir("/proc"):
            if not entry.isdigit():
                continue
            try:
                stat = Path(f"/proc/{entry}/stat").read_text()
            except OSError:
                continue
            ppid = int(stat.rsplit(")", 1)[1].split()[1])
            children.setdefault(ppid, []).append(int(entry))
        out, todo = [], [self.proc.pid]
        while todo:
            for child in children.get(todo.pop(), []):
                out.append(child)
                todo.append(child)
        return out

    def login_hangs(self, timeout_s: float = 30.0) -> str | None:
        """Why a login to run ``true`` with OpenSSH's own client does not finish in ``timeout_s``, else
        None: the account's shell startup (``~/.bashrc`` runs for SSH commands) is the machine's, not ours."""
        ssh = shutil.which("ssh")
        if ssh is None:
            return None  # nothing to check with; the tests themselves will tell
        cmd = [ssh, "-o", "BatchMode=yes", "-o", "StrictHostKeyChecking=no", "-o", "UserKnownHostsFile=/dev/null",
               "-o", "LogLevel=ERROR", "-i", str(self.client_key), "-p", str(self.port),
               f"{self.user}@127.0.0.1", "true"]
        try:
            subprocess.run(cmd, capture_output=True, timeout=timeout_s, stdin=subprocess.DEVNULL)
        except subprocess.TimeoutExpired:
            return (f"an SSH login as {self.user} on 127.0.0.1 does not run 'true' within {timeout_s:.0f} s: the "
                    f"account's shell startup hangs (~/.bashrc; e.g. a stale ~/.pyenv/shims/.pyenv-shim lock)")
        return None

    def cut_connections(self) -> int:
        """Kill every live SSH connection of this server (SIGKILL to its sshd processes, by pid); returns
        how many. The session's own processes are left to notice the closed channel (end of input, a
        broken pipe), as across a real network drop: killing them outright could leave a login shell's
        half-done startup behind (e.g. a ``pyenv rehash`` lock in ~/.bashrc that hangs every later login)."""
        pids = [pid for pid in self._descendants() if _command_name(pid).startswith("sshd")]
        for pid in pids:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        return len(pids)

    def stop(self) -> None:
        """Kill the connections, then the listener (by pid)."""
        self.cut_connections()
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.proc = None
