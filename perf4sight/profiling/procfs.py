"""Small readers of Linux ``/proc`` and ``/sys`` used by the runner and the backends.

Standard library only (runs on the devices). Memory in MiB (2**20 bytes). Every reader
returns ``None`` (or "") instead of raising when the file is absent, e.g. off Linux or
after the process has exited.
"""
import os
import platform
from pathlib import Path
from typing import Dict, Optional, Tuple, Union

__all__ = ["status_mb", "swap_mb", "oom_kills", "cpu_model", "cpu_clocks", "KIB_PER_MIB", "VMSTAT"]

KIB_PER_MIB = 1024
VMSTAT = "/proc/vmstat"


def status_mb(pid: Union[int, str], key: str = "VmRSS") -> Optional[float]:
    """A ``kB`` line of ``/proc/<pid>/status`` (VmRSS, VmHWM, ...) in MiB; None if unreadable."""
    try:
        with open(f"/proc/{pid}/status", "rb") as fh:
            prefix = key.encode() + b":"
            for line in fh:
                if line.startswith(prefix):
                    return int(line.split()[1]) / KIB_PER_MIB
    except (OSError, ValueError, IndexError):
        return None
    return None


def swap_mb(path: str = VMSTAT) -> Optional[Tuple[float, float]]:
    """(swapped in, swapped out) since boot in MiB: ``pswpin`` / ``pswpout`` pages of ``/proc/vmstat``
    times the page size; None if unreadable. The difference of two readings is what the whole system
    swapped in between (zram on a Jetson, a swap file elsewhere)."""
    pages: Dict[str, int] = {}
    try:
        with open(path, "rb") as fh:
            for line in fh:
                key, _, value = line.partition(b" ")
                if key in (b"pswpin", b"pswpout"):
                    pages[key.decode()] = int(value)
        page_mib = os.sysconf("SC_PAGE_SIZE") / 2**20
    except (OSError, ValueError):
        return None
    if len(pages) != 2:
        return None
    return pages["pswpin"] * page_mib, pages["pswpout"] * page_mib


def oom_kills(path: str = VMSTAT) -> Optional[int]:
    """How many processes the kernel's OOM killer has killed since boot (``oom_kill`` of ``/proc/vmstat``, Linux
    4.13+; a cgroup's memory limit counts too); None if unreadable or absent."""
    try:
        with open(path, "rb") as fh:
            for line in fh:
                key, _, value = line.partition(b" ")
                if key == b"oom_kill":
                    return int(value)
    except (OSError, ValueError):
        return None
    return None


def cpu_model() -> str:
    """The CPU's model name from ``/proc/cpuinfo`` (ARM boards: Hardware / CPU part), else platform."""
    fields: Dict[str, str] = {}
    try:
        for line in Path("/proc/cpuinfo").read_text(errors="replace").splitlines():
            key, sep, value = line.partition(":")
            if sep and key.strip() not in fields:
                fields[key.strip()] = value.strip()
    except OSError:
        pass
    for key in ("model name", "Model", "Hardware", "cpu model", "Processor"):
        if fields.get(key):
            return fields[key]
    if fields.get("CPU part"):
        return f"{platform.machine()} CPU part {fields['CPU part']}"
    return platform.processor() or platform.machine()


def cpu_clocks() -> str:
    """Governor and maximum frequency of CPU 0, e.g. ``performance@3000MHz``; "" if unknown."""
    base = Path("/sys/devices/system/cpu/cpu0/cpufreq")
    try:
        governor = (base / "scaling_governor").read_text().strip()
        max_khz = int((base / "scaling_max_freq").read_text().strip())
    except (OSError, ValueError):
        return ""
    return f"{governor}@{max_khz // 1000}MHz"
