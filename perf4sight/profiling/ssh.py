"""One SSH connection to a device: host-key checking, quoted commands, SFTP file transfer.

Security rules kept here, in one place:

* The server's host key is checked against a known_hosts file (the device's ``known_hosts``,
  else ``~/.ssh/known_hosts``). An unknown key is refused unless the device sets
  ``accept_new_host_key = true`` (then it is appended to that file); a *changed* key, or one on an
  ``@revoked`` line, is always refused.
* Authentication is by key file or the SSH agent; never a password.
* Every command is an argv list joined with ``shlex.quote``; remote files are moved with
  SFTP, which runs no shell. A name with spaces, quotes or ``;`` stays one argument.

Times in seconds.
"""
from __future__ import annotations

import errno
import io
import logging
import os
import shlex
import socket
import stat
import threading
import time
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import Sequence

import paramiko
from paramiko.hostkeys import HostKeyEntry
from paramiko.ssh_exception import NoValidConnectionsError

from perf4sight.config import DeviceConfig
from perf4sight.errors import UserError
from perf4sight.wording import device_table

__all__ = ["DeviceError", "HostKeyError", "LoginError", "Remote", "CommandResult", "quote_argv", "CONNECTION_ERRORS",
           "default_known_hosts", "describe_error"]

# paramiko logs a failed handshake from its transport thread, tracebacks included, through logging's last-resort
# handler (stderr); this module reports each connection error once, as one line
logging.getLogger("paramiko").addHandler(logging.NullHandler())

#: What a dropped or refused connection raises (paramiko, sockets, a closed transport).
CONNECTION_ERRORS = (paramiko.SSHException, OSError, EOFError, socket.timeout)


def describe_error(exc: BaseException) -> str:
    """One line for a connection error: its message, or its kind where it has none (a bare timeout)."""
    text = " ".join(str(exc).split())
    if isinstance(exc, socket.timeout) and not text:
        return "timed out waiting for the device"
    return text or type(exc).__name__

_KNOWN_HOSTS_LOCK = threading.Lock()


class DeviceError(UserError):
    """A device could not be reached or used; the message is one line naming the device."""


class HostKeyError(DeviceError):
    """The device's host key is unknown or has changed."""


class LoginError(DeviceError):
    """No login: the key file is missing, unreadable or encrypted, there is no key to offer, or the device
    refused every key offered."""


@dataclass
class CommandResult:
    """Exit status and decoded output of one remote command."""
    rc: int
    stdout: str
    stderr: str


def quote_argv(argv: Sequence[str]) -> str:
    """A POSIX shell command line whose words are exactly ``argv``."""
    return " ".join(shlex.quote(str(a)) for a in argv)


def _host_entry(host: str, port: int) -> str:
    return host if port == 22 else f"[{host}]:{port}"


def _load_known_hosts(dev: DeviceConfig, path: Path, into: paramiko.HostKeys) -> set[str]:
    """Add the host keys of OpenSSH known_hosts file ``path`` to ``into``; returns the keys (base64) its
    ``@revoked`` lines list, which are left out of ``into`` so that a server presenting one meets the refusing
    policies. ``@cert-authority`` lines are passed over: paramiko cannot check host certificates, so the device's
    own key needs its own line. A line paramiko cannot parse is a ``HostKeyError`` naming the file and line."""
    try:
        lines = path.read_text(errors="replace").splitlines()
    except OSError as exc:
        raise HostKeyError(f"device '{dev.name}': cannot read known_hosts {path}: {describe_error(exc)}") from None
    entries, revoked = [], set()
    for number, line in enumerate(lines, 1):
        words = line.split(None, 1)
        if not words or words[0].startswith("#") or words[0] == "@cert-authority":
            continue
        marker = words[0] if words[0].startswith("@") else ""
        if marker not in ("", "@revoked"):
            raise HostKeyError(f"device '{dev.name}': {path} line {number}: unknown marker {marker} (OpenSSH knows "
                               "@cert-authority and @revoked)")
        fields = line.split()[1 if marker else 0:]
        try:
            entry = HostKeyEntry.from_line(" ".join(fields), number)  # None: a key type paramiko does not know
            unreadable = bool(marker) and len(fields) < 3  # a revoked key is never passed over unread
        except paramiko.SSHException:  # a key paramiko cannot use: passed over, as paramiko's own loader does
            entry, unreadable = None, bool(marker)
        except Exception:  # noqa: BLE001 - paramiko's InvalidHostKey (bad base64), or a key it chokes on
            entry, unreadable = None, True
        if unreadable:
            raise HostKeyError(f"device '{dev.name}': {path} line {number} is not a known_hosts line this tool can "
                               "read (host names, key type, base64 key); fix or remove it")
        if entry is not None and marker:
            revoked.add(entry.key.get_base64())
        elif entry is not None:
            entries.append(entry)
    added: set[tuple[str, str]] = set()
    for entry in entries:
        if entry.key.get_base64() not in revoked:
            for name in entry.hostnames:  # the first key of a type for a host, as paramiko's own loader keeps
                if (name, entry.key.get_name()) not in added:  # (HostKeys.add would replace it with a later one)
                    added.add((name, entry.key.get_name()))
                    into.add(name, entry.key.get_name(), entry.key)
    return revoked


class _HostKeyPolicy(paramiko.MissingHostKeyPolicy):
    """What to do with a host key that the device's known_hosts file ``path`` does not hold; ``revoked``: the keys
    (base64) its ``@revoked`` lines list, refused by every policy."""

    def __init__(self, dev: DeviceConfig, path: Path, revoked: set[str]) -> None:
        self.dev, self.path, self.revoked = dev, path, revoked

    def refuse_revoked(self, hostname: str, key: paramiko.PKey) -> None:
        """``HostKeyError`` when ``key`` is one of the keys ``path`` lists on an ``@revoked`` line."""
        if key.get_base64() in self.revoked:
            raise HostKeyError(f"device '{self.dev.name}': host key of {hostname} ({key.get_name()} "
                               f"{key.fingerprint}) is marked @revoked in {self.path}; refusing to connect")


class _AcceptNewPolicy(_HostKeyPolicy):
    """Record a never-seen host key in the device's known_hosts file (only when opted in); a revoked key is
    refused."""

    def missing_host_key(self, client: paramiko.SSHClient, hostname: str, key: paramiko.PKey) -> None:
        self.refuse_revoked(hostname, key)
        try:
            with _KNOWN_HOSTS_LOCK:
                self.path.parent.mkdir(parents=True, exist_ok=True)
                with self.path.open("a") as fh:
                    fh.write(f"{hostname} {key.get_name()} {key.get_base64()}\n")
        except OSError as exc:  # not a connection problem: say so, not "check host and port"
            raise HostKeyError(f"device '{self.dev.name}': cannot record the host key of {hostname} in "
                               f"{self.path}: {describe_error(exc)}") from None
        client.get_host_keys().add(hostname, key.get_name(), key)


class _RefusePolicy(_HostKeyPolicy):
    """Refuse a never-seen host key, saying how to check and record it."""

    def missing_host_key(self, client: paramiko.SSHClient, hostname: str, key: paramiko.PKey) -> None:
        self.refuse_revoked(hostname, key)
        d = self.dev
        raise HostKeyError(
            f"device '{d.name}': host key of {hostname} ({key.get_name()} {key.fingerprint}) is not in "
            f"{self.path}; check it, then add it (ssh-keyscan -p {d.port} {d.host} >> {self.path}) "
            f"or set accept_new_host_key = true in {device_table(d.name)} to record it on first connect")


def _key_algorithms_to_disable(known: set[str]) -> list[str]:
    """Host-key algorithms to turn off so the server presents a key type that known_hosts holds."""
    def key_type(alg: str) -> str:
        return "ssh-rsa" if alg.startswith("rsa-sha2-") else alg.replace("-cert-v01@openssh.com", "")
    return [a for a in paramiko.Transport._preferred_keys if key_type(a) not in known]


def _load_key(dev: DeviceConfig, key_file: str) -> paramiko.PKey:
    """The private key in ``key_file``, loaded here so that a refused key reads as a refused login (paramiko,
    given a file name, tries every key type and reports the last type's parse error instead)."""
    where = f"device '{dev.name}': key_file {key_file}"
    if Path(key_file).is_dir():
        raise LoginError(f"{where} is a folder, not a file: set key_file in {device_table(dev.name)} to the private "
                         "key")
    if not Path(key_file).is_file():
        raise LoginError(f"{where} not found")
    try:
        return paramiko.PKey.from_path(key_file)
    except (paramiko.PasswordRequiredException, TypeError):  # TypeError: cryptography's "password-protected"
        raise LoginError(f"{where} is encrypted; load it into ssh-agent and leave key_file empty") from None
    except (paramiko.SSHException, ValueError, OSError) as exc:
        raise LoginError(f"{where} is not a private key this tool can read: {describe_error(exc)}") from None


class Remote:
    """An open SSH connection to one device (reconnectable). Use as a context manager.

    ``known_hosts`` is the absolute path of the file to check against; ``key_file`` that of the private key
    (``remote.key_file_path``: relative to the config file), None for the device's ``key_file`` as written;
    ``timeout_s`` bounds the TCP connect, the banner and authentication.
    """

    def __init__(self, dev: DeviceConfig, known_hosts: Path, timeout_s: float = 10.0,
                 key_file: Path | None = None) -> None:
        if not dev.host:
            raise DeviceError(f"device '{dev.name}' has no host: it is the local machine, not an SSH device")
        self.dev = dev
        self.known_hosts = Path(known_hosts).expanduser()
        if key_file is None and dev.key_file:
            key_file = Path(dev.key_file).expanduser()
        self.key_file = key_file
        self.timeout_s = timeout_s
        self.client: paramiko.SSHClient | None = None
        self._sftp: paramiko.SFTPClient | None = None
        self._home: str | None = None

    @property
    def where(self) -> str:
        user = f"{self.dev.user}@" if self.dev.user else ""
        return f"{user}{self.dev.host}:{self.dev.port}"

    def connect(self) -> "Remote":
        """Open the connection; raises ``DeviceError`` (``HostKeyError`` for key problems)."""
        self.close()
        dev = self.dev
        client = paramiko.SSHClient()
        known_types: set[str] = set()
        revoked: set[str] = set()
        if self.known_hosts.is_dir():
            raise HostKeyError(f"device '{dev.name}': known_hosts {self.known_hosts} is a folder, not a file: set "
                               f"known_hosts in {device_table(dev.name)} to the file itself")
        if self.known_hosts.is_file():
            revoked = _load_known_hosts(dev, self.known_hosts, client.get_host_keys())
            known_types = set((client.get_host_keys().lookup(_host_entry(dev.host, dev.port)) or {}).keys())
        elif not dev.accept_new_host_key:
            raise HostKeyError(f"device '{dev.name}': known_hosts file {self.known_hosts} does not exist; create it "
                               f"(mkdir -p {self.known_hosts.parent} && ssh-keyscan -p {dev.port} {dev.host} "
                               f">> {self.known_hosts}) or set "
                               f"accept_new_host_key = true in {device_table(dev.name)}")
        policy = (_AcceptNewPolicy if dev.accept_new_host_key else _RefusePolicy)(dev, self.known_hosts, revoked)
        client.set_missing_host_key_policy(policy)
        key_file = str(self.key_file) if self.key_file else None
        key = _load_key(dev, key_file) if key_file else None
        try:
            client.connect(dev.host, port=dev.port, username=dev.user or None, pkey=key,
                           allow_agent=key is None, look_for_keys=key is None, password=None,
                           timeout=self.timeout_s, banner_timeout=self.timeout_s, auth_timeout=self.timeout_s,
                           disabled_algorithms=({"keys": _key_algorithms_to_disable(known_types)} if known_types
                                                else None))
        except HostKeyError:
            client.close()
            raise
        except paramiko.BadHostKeyException as exc:
            client.close()
            entry = _host_entry(dev.host, dev.port)
            raise HostKeyError(
                f"device '{dev.name}': host key of {entry} has CHANGED (server presents {exc.key.get_name()} "
                f"{exc.key.fingerprint}, {self.known_hosts} expects {exc.expected_key.fingerprint}); refusing to "
                f"connect. If the device was reinstalled, remove the old entry: ssh-keygen -R '{entry}' "
                f"-f {self.known_hosts}") from None
        except paramiko.AuthenticationException as exc:
            client.close()
            how = f"key_file {key_file}" if key_file else "the SSH agent and default keys"
            raise LoginError(f"device '{dev.name}': authentication failed for {self.where} with {how} "
                             f"({exc})") from None
        except NoValidConnectionsError:
            client.close()
            raise DeviceError(f"device '{dev.name}': cannot reach {self.where}: connection refused (nothing listens "
                              f"there: check host and port in {device_table(dev.name)}, and that sshd runs on the "
                              "device)") from None
        except paramiko.SSHException as exc:
            transport = client.get_transport()
            banner = getattr(transport, "remote_version", "") if transport is not None else ""
            client.close()
            if not banner:  # no "SSH-2.0-..." line came back: something else listens there, or nothing answers
                raise DeviceError(f"device '{dev.name}': no SSH server answered at {self.where} within "
                                  f"{self.timeout_s:g} s (is it an SSH server, on that port?)") from None
            if "no authentication methods available" in str(exc).lower():  # paramiko: not one key to offer
                raise LoginError(f"device '{dev.name}': no key to log in to {self.where} with: key_file is not set, "
                                 f"no SSH agent holds a key and ~/.ssh has no default key; set key_file in "
                                 f"{device_table(dev.name)} (passwords are never used)") from None
            raise DeviceError(f"device '{dev.name}': cannot reach {self.where}: {describe_error(exc)}") from None
        except (OSError, EOFError) as exc:
            client.close()
            why = " ".join(str(exc).split()) or type(exc).__name__
            raise DeviceError(f"device '{dev.name}': cannot reach {self.where}: {why} (check host and port in "
                              f"{device_table(dev.name)}, and that the device is on and on the network)") from None
        transport = client.get_transport()
        if transport is not None:
            transport.set_keepalive(5)
        self.client = client
        return self

    def close(self) -> None:
        """Close SFTP and the connection; never raises."""
        for obj in (self._sftp, self.client):
            try:
                if obj is not None:
                    obj.close()
            except Exception:  # noqa: BLE001 - closing a dead connection may fail in many ways
                pass
        self._sftp, self.client = None, None

    def __enter__(self) -> "Remote":
        return self.connect() if self.client is None else self

    def __exit__(self, *exc: object) -> None:
        self.close()

    @property
    def alive(self) -> bool:
        t = self.client.get_transport() if self.client else None
        return bool(t and t.is_active())

    # -- commands -------------------------------------------------------------------------
    def run(self, argv: Sequence[str], timeout_s: float = 60.0, stdin: bytes | None = None) -> CommandResult:
        """Run one command (argv, quoted); raises a CONNECTION_ERRORS member if the link drops."""
        if self.client is None:
            raise paramiko.SSHException("not connected")
        chan_in, chan_out, chan_err = self.client.exec_command(quote_argv(argv), timeout=timeout_s)
        try:
            if stdin is not None:
                chan_in.write(stdin)
            chan_in.channel.shutdown_write()
            out = chan_out.read()
            err = chan_err.read()
        except socket.timeout:  # paramiko's own carries no message: say what did not answer
            raise socket.timeout(f"no reply to '{Path(argv[0]).name}' within {timeout_s:.0f} s (a stuck login "
                                 "shell on the device, e.g. its ~/.bashrc, or a dead link)") from None
        rc = chan_out.channel.recv_exit_status()
        if rc == -1 and self._dropped():
            raise paramiko.SSHException("the connection closed before the command reported its exit status")
        return CommandResult(rc, out.decode(errors="replace"), err.decode(errors="replace"))

    def _dropped(self, wait_s: float = 2.0) -> bool:
        """True when the transport dies within ``wait_s`` seconds.

        A command with no exit status was either killed by a signal (the link is fine) or cut off
        with the link; paramiko closes the channels slightly before it marks the transport
        inactive, so give it a moment to tell the two apart.
        """
        deadline = time.monotonic() + wait_s
        while time.monotonic() < deadline:
            if not self.alive:
                return True
            time.sleep(0.05)
        return not self.alive

    # -- files ----------------------------------------------------------------------------
    @property
    def sftp(self) -> paramiko.SFTPClient:
        if self.client is None:
            raise paramiko.SSHException("not connected")
        if self._sftp is None:
            self._sftp = self.client.open_sftp()
            self._sftp.get_channel().settimeout(max(self.timeout_s, 30.0))
        return self._sftp

    def home(self) -> str:
        """The login user's home folder on the device (SFTP starts there)."""
        if self._home is None:
            self._home = self.sftp.normalize(".")
        return self._home

    def expand(self, path: str) -> str:
        """A remote path with a leading ``~`` replaced by the home folder; relative = under home."""
        if path == "~" or path.startswith("~/"):
            return str(PurePosixPath(self.home()) / path[2:])
        return path if path.startswith("/") else str(PurePosixPath(self.home()) / path)

    def makedirs(self, path: str) -> None:
        """``mkdir -p`` over SFTP; a folder another client creates between our check and our mkdir (two
        devices on one host sharing a workdir) is fine."""
        parts = PurePosixPath(path).parts
        cur = PurePosixPath(parts[0])
        for part in parts[1:]:
            cur = cur / part
            try:
                st = self.sftp.stat(str(cur))
                if not stat.S_ISDIR(st.st_mode or 0):  # SFTP says "No such file" of the folder to be made under it
                    raise NotADirectoryError(errno.ENOTDIR, f"{cur} is a file, not a folder")
            except FileNotFoundError:
                try:
                    self.sftp.mkdir(str(cur))
                except OSError as exc:  # SFTP answers a generic "Failure" when it exists by now
                    if not self.is_dir(str(cur)):
                        raise exc

    def is_dir(self, path: str) -> bool:
        """Whether ``path`` is a folder on the device."""
        try:
            return stat.S_ISDIR(self.sftp.stat(path).st_mode or 0)
        except FileNotFoundError:
            return False

    def put_bytes(self, data: bytes, path: str) -> None:
        """Write a remote file atomically (temporary file, then rename over the target)."""
        tmp = f"{path}.part"
        with self.sftp.open(tmp, "wb") as fh:
            fh.set_pipelined(True)
            fh.write(data)
        self.sftp.posix_rename(tmp, path)

    def put_file(self, local: Path, path: str) -> None:
        self.put_bytes(Path(local).read_bytes(), path)

    def size(self, path: str) -> int | None:
        """Size in bytes of a remote file, or None if it does not exist."""
        try:
            return self.sftp.stat(path).st_size
        except FileNotFoundError:
            return None

    def read_from(self, path: str, offset: int, limit: int = 8 << 20) -> bytes:
        """Up to ``limit`` bytes of a remote file from ``offset`` (b"" if absent)."""
        try:
            with self.sftp.open(path, "rb") as fh:
                fh.seek(offset)
                buf = io.BytesIO()
                while buf.tell() < limit:
                    chunk = fh.read(min(1 << 20, limit - buf.tell()))
                    if not chunk:
                        break
                    buf.write(chunk)
                return buf.getvalue()
        except FileNotFoundError:
            return b""

    def read_text(self, path: str) -> str | None:
        """A whole small remote text file, or None if absent."""
        try:
            with self.sftp.open(path, "rb") as fh:
                return fh.read().decode(errors="replace")
        except FileNotFoundError:
            return None

    def remove(self, path: str) -> None:
        try:
            self.sftp.remove(path)
        except FileNotFoundError:
            pass


def default_known_hosts() -> Path:
    """``~/.ssh/known_hosts`` of the user running perf4sight."""
    return Path(os.path.expanduser("~/.ssh/known_hosts"))
