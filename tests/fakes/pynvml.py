"""A simulated ``pynvml`` (the nvidia-ml-py module) for tests: same names, same exceptions.

Device memory "used" = a 300 MiB CUDA context + what the simulated GPU (cuda_sim) reserves;
utilisation and power rise while the simulated GPU holds memory. Power in milliwatts, as NVML.
``P4S_FAKE_NVML_CRASH=1`` makes nvmlInit kill the process (a crashing driver library).
"""
from __future__ import annotations

import os
import signal
import types

__version__ = "12.0.0-sim"

NVML_SUCCESS = 0
NVML_ERROR_UNINITIALIZED = 1
NVML_ERROR_INVALID_ARGUMENT = 2
NVML_ERROR_NOT_SUPPORTED = 3
NVML_ERROR_NOT_FOUND = 6
NVML_CLOCK_GRAPHICS, NVML_CLOCK_SM, NVML_CLOCK_MEM = 0, 1, 2
CONTEXT_MB = 300
TOTAL_MB = 24576


class NVMLError(Exception):
    """Base NVML error; ``value`` is the NVML return code."""

    _messages = {1: "Uninitialized", 2: "Invalid Argument", 3: "Not Supported", 6: "Not Found"}

    def __init__(self, value: int) -> None:
        super().__init__(value)
        self.value = value

    def __str__(self) -> str:
        return self._messages.get(self.value, f"Unknown Error {self.value}")


class NVMLError_Uninitialized(NVMLError):
    def __init__(self) -> None:
        super().__init__(NVML_ERROR_UNINITIALIZED)


class NVMLError_InvalidArgument(NVMLError):
    def __init__(self) -> None:
        super().__init__(NVML_ERROR_INVALID_ARGUMENT)


class NVMLError_NotSupported(NVMLError):
    def __init__(self) -> None:
        super().__init__(NVML_ERROR_NOT_SUPPORTED)


class NVMLError_NotFound(NVMLError):
    def __init__(self) -> None:
        super().__init__(NVML_ERROR_NOT_FOUND)


_initialised = False
POWER_SUPPORTED = True
GPUS = 1  # a test may set more; NVML numbers them whatever CUDA_VISIBLE_DEVICES says, as the real library does


def _check() -> None:
    if not _initialised:
        raise NVMLError_Uninitialized()


def nvmlInit() -> None:
    global _initialised
    if os.environ.get("P4S_FAKE_NVML_CRASH") == "1":
        os.kill(os.getpid(), signal.SIGSEGV)
    _initialised = True


def nvmlShutdown() -> None:
    global _initialised
    _check()
    _initialised = False


def nvmlDeviceGetCount() -> int:
    _check()
    return GPUS


def _uuid(index: int) -> str:
    return f"GPU-{index:08d}-5a1e-4c0d-9e7f-{index:012d}"


def nvmlDeviceGetHandleByIndex(index: int):
    _check()
    if not 0 <= index < GPUS:
        raise NVMLError_InvalidArgument()
    return types.SimpleNamespace(index=index)


def nvmlDeviceGetHandleByUUID(uuid: str):
    _check()
    for index in range(GPUS):
        if _uuid(index) == uuid:
            return types.SimpleNamespace(index=index)
    raise NVMLError_NotFound()


def _pci_bus_id(index: int) -> str:
    return f"00000000:{0x10 + index:02X}:00.0"  # as nvmlPciInfo_t.busId writes it


def nvmlDeviceGetHandleByPciBusId(pci_bus_id: str):
    """The real one parses "domain:bus:device.function" (hex; the domain may be 4 or 8 digits wide)."""
    _check()
    try:
        domain, bus, rest = pci_bus_id.split(":")
        wanted = (int(domain, 16), int(bus, 16), int(rest.split(".")[0], 16))
    except ValueError:
        raise NVMLError_InvalidArgument() from None
    for index in range(GPUS):
        if wanted == (0, 0x10 + index, 0):
            return types.SimpleNamespace(index=index)
    raise NVMLError_NotFound()


def nvmlDeviceGetPciInfo(handle):
    _check()
    return types.SimpleNamespace(busId=_pci_bus_id(handle.index), domain=0, bus=0x10 + handle.index, device=0)


def nvmlDeviceGetUUID(handle) -> str:
    _check()
    return _uuid(handle.index)


def nvmlDeviceGetName(handle) -> str:
    _check()
    return "NVIDIA Simulated RTX"


def _reserved_mb() -> float:
    import cuda_sim

    return cuda_sim.STATE.reserved / 2**20 if cuda_sim.STATE else 0.0


def nvmlDeviceGetMemoryInfo(handle):
    _check()
    used = int((CONTEXT_MB + _reserved_mb()) * 2**20)
    total = TOTAL_MB * 2**20
    return types.SimpleNamespace(total=total, used=used, free=total - used)


def nvmlDeviceGetUtilizationRates(handle):
    _check()
    busy = _reserved_mb() > 0
    return types.SimpleNamespace(gpu=87 if busy else 0, memory=40 if busy else 0)


def nvmlDeviceGetPowerUsage(handle) -> int:
    _check()
    if not POWER_SUPPORTED:
        raise NVMLError_NotSupported()
    return 250_000 if _reserved_mb() > 0 else 30_000


def nvmlDeviceGetClockInfo(handle, clock_type: int) -> int:
    _check()
    return {NVML_CLOCK_SM: 1695, NVML_CLOCK_MEM: 9751}.get(clock_type, 1500)
