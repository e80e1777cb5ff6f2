"""The ``jetson`` backend: NVIDIA Jetson boards (TX2 and relatives), device side.

CPU and GPU share one memory, so the memory figure is *unified memory used* from
``/proc/meminfo`` (MemTotal - MemFree - Buffers - Cached), relative to the reading taken
before CUDA starts, as perf4sight measured it (peak over the steps). When the jtop service
(jetson-stats) is active, its RAM in use, GPU load and board power are sampled as well; when
it is not, the row's ``message`` says so and those columns stay empty. Torch allocator peaks,
CUDA-event timing and CUDA OOM come from :class:`CudaBackend`. The power mode (nvpmodel)
and jetson_clocks state go into ``clocks``. Memory in MiB, power in W, load in %.
"""
import glob
import subprocess
from pathlib import Path
from typing import Any, Dict, Optional

from perf4sight.profiling.backends.cuda import CudaBackend
from perf4sight.profiling.backends.sampling import Reading, Sampler

__all__ = ["JetsonBackend", "meminfo_used_mb"]

MEMINFO = "/proc/meminfo"
MODEL_FILE = "/proc/device-tree/model"
GPU_FREQ_GLOB = "/sys/devices/gpu.0/devfreq/*/cur_freq"


def meminfo_used_mb(path: str = MEMINFO) -> float:
    """MemTotal - MemFree - Buffers - Cached from ``/proc/meminfo``, in MiB."""
    kib: Dict[str, int] = {}
    with open(path) as fh:
        for line in fh:
            key, _, rest = line.partition(":")
            if key in ("MemTotal", "MemFree", "Buffers", "Cached"):
                kib[key] = int(rest.split()[0])
    return (kib["MemTotal"] - kib["MemFree"] - kib.get("Buffers", 0) - kib.get("Cached", 0)) / 1024


class JetsonBackend(CudaBackend):
    """CUDA training steps on a Jetson, with unified memory from /proc/meminfo and jtop readings."""

    name = "jetson"

    def __init__(self, plan) -> None:
        super().__init__(plan)
        self.baseline_mb = 0.0
        self.jetson: Any = None
        self.jtop_note = ""
        self.jtop_failures, self.jtop_error = 0, ""  # readings in which a jtop figure failed, and the first reason

    def prepare(self) -> None:
        self.baseline_mb = meminfo_used_mb()  # before CUDA initialises
        try:
            from jtop import JtopException, jtop
        except ImportError:
            self.jtop_note = "jtop (jetson-stats) not installed: RAM, GPU load and power not measured"
        else:
            handle = jtop()
            try:
                handle.start()
                if not handle.ok():
                    raise JtopException("jtop returned no data")
                self.jetson = handle
            except Exception as exc:  # noqa: BLE001 - jtop is optional: whatever its client raises (JtopException; a
                # service that does not answer, queue.Empty; an error its thread kept, which ok() raises) costs its
                # figures, never the measurement (this was the setup's error: no network measured on the device)
                said = " ".join(str(exc).split())
                if not isinstance(exc, JtopException):
                    said = type(exc).__name__ + (f": {said}" if said else "")
                self.jtop_note = f"jtop service not active ({said}): RAM, GPU load and power not measured"[:300]
        super().prepare()

    def read_device(self) -> Reading:
        """Unified memory from /proc/meminfo, then each of jtop's figures on its own: a figure jtop cannot give (its
        service gone mid-step, a jetson-stats of another API: 3.x has no ``memory``, its ``power`` is a tuple) is
        counted in :attr:`jtop_failures` and left out, and never costs the reading the memory figure."""
        reading: Reading = {"unified_mb": meminfo_used_mb() - self.baseline_mb}
        j = self.jetson
        if j is not None:
            failed = ""
            for key, read in (("jtop_ram_mb", _jtop_ram_mb), ("gpu_load_pct", _gpu_load), ("power_w", _jtop_power_w)):
                try:
                    reading[key] = read(j)
                except Exception as exc:  # noqa: BLE001 - jtop's failures are many; the memory figure must stay
                    failed = failed or " ".join(f"{type(exc).__name__}: {exc}".split())
            if failed:
                self.jtop_failures += 1
                self.jtop_error = self.jtop_error or failed
        return reading

    def sampled_columns(self, sampler: Sampler) -> Dict[str, Any]:
        cols: Dict[str, Any] = {"device_mem_used_mb": sampler.peak("unified_mb"),
                                "gpu_util_pct": sampler.mean("gpu_load_pct", 1), "power_w": sampler.mean("power_w")}
        notes = [self.jtop_note] if self.jtop_note else []
        if cols["device_mem_used_mb"] != "" and cols["device_mem_used_mb"] < 0:  # no figure a reader would take
            notes.insert(0, f"unified memory peaked {-cols['device_mem_used_mb']:g} MiB below its reading before the "
                            "step (freed by other processes): not measured")
            cols["device_mem_used_mb"] = ""
        if self.jetson is not None and sampler.values("jtop_ram_mb"):
            notes.append(f"jtop RAM peak {sampler.peak('jtop_ram_mb', 1)} MiB")
        if self.jtop_failures:
            notes.append(f"{self.jtop_failures} jtop readings failed: {self.jtop_error}")
        if sampler.failures:
            notes.append(f"{sampler.failures} readings failed: {sampler.error}")
        if notes:
            cols["message"] = "; ".join(notes)[:300]
        return cols

    def device_model(self) -> str:
        try:
            board = Path(MODEL_FILE).read_text().strip("\x00\n ")
        except OSError:
            board = ""
        gpu = super().device_model()
        return f"{board} ({gpu})" if board else gpu

    def clocks(self) -> str:
        """``nvpmodel <mode>, jetson_clocks on|off, gpu <MHz>`` with whatever is known."""
        parts = []
        j = self.jetson
        if j is not None and j.nvpmodel is not None:
            parts.append(f"nvpmodel {getattr(j.nvpmodel, 'name', j.nvpmodel)}")
        else:
            mode = _nvpmodel_query()
            if mode:
                parts.append(f"nvpmodel {mode}")
        if j is not None and j.jetson_clocks is not None:
            parts.append(f"jetson_clocks {'on' if bool(j.jetson_clocks) else 'off'}")
        for path in sorted(glob.glob(GPU_FREQ_GLOB))[:1]:
            try:
                parts.append(f"gpu {int(Path(path).read_text().strip()) // 1_000_000}MHz")
            except (OSError, ValueError):
                pass
        return ", ".join(parts)

    def environment(self) -> Dict[str, Any]:
        env = super().environment()
        if self.jetson is not None:
            try:
                self.jetson.close()
            except Exception:  # noqa: BLE001 - closing the jtop client must not lose the row
                pass
            self.jetson = None
        return env


def _jtop_ram_mb(j: Any) -> Optional[float]:
    """The RAM in use by jtop 4.x's count (``memory['RAM']['used']``, kB), in MiB."""
    ram = (j.memory or {}).get("RAM", {})
    return ram["used"] / 1024 if "used" in ram else None


def _jtop_power_w(j: Any) -> Optional[float]:
    """The board's power from jtop 4.x (``power['tot']['power']``, milliwatts), in watts."""
    tot = (j.power or {}).get("tot", {})
    return tot["power"] / 1000.0 if "power" in tot else None


def _gpu_load(j: Any) -> Optional[float]:
    """GPU load in % from jtop 4.x (``gpu[name]['status']['load']``), else ``stats['GPU']``."""
    gpus = j.gpu or {}
    for info in gpus.values() if isinstance(gpus, dict) else []:
        load = (info.get("status") or {}).get("load") if isinstance(info, dict) else None
        if load is not None:
            return float(load)
    value = (j.stats or {}).get("GPU")
    return float(value) if isinstance(value, (int, float)) else None


def _nvpmodel_query() -> str:
    """The power mode name from ``nvpmodel -q`` ("" when the tool is absent)."""
    try:
        out = subprocess.run(["nvpmodel", "-q"], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                             universal_newlines=True, timeout=5).stdout
    except (OSError, subprocess.TimeoutExpired):
        return ""
    for line in out.splitlines():
        if "Power Mode" in line:
            return line.split(":", 1)[1].strip()
    return ""
