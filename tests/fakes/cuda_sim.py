"""A simulated CUDA GPU for machines without one (tests only).

``install(capacity_mb)`` makes ``torch.cuda`` report one device and turns "cuda" tensors into
host tensors through a ``TorchFunctionMode``; every tensor an op returns is counted as
allocated until it is freed, the caching allocator is modelled by rounding the live total up
to 2 MiB blocks that are kept (reserved), and going over ``capacity_mb`` raises the real
``torch.cuda.OutOfMemoryError`` with CUDA's wording. CUDA events time with perf_counter.
Tensors made inside autograd's C++ engine (gradients) are not seen, so the figures are lower
than a real GPU's; they grow with the batch size, which is what the tests need.

The simulated state (``STATE``) is what the fake ``pynvml`` reports as device memory.
"""
from __future__ import annotations

import os
import time
import types
import weakref

import torch
from torch.overrides import TorchFunctionMode
from torch.utils._pytree import tree_map

MIB = 2**20
BLOCK = 2 * MIB
NAME = "Simulated GPU (perf4sight tests)"


class _State:
    def __init__(self, capacity_mb: float) -> None:
        self.capacity = int(capacity_mb * MIB)
        self.live: dict[int, list[int]] = {}  # storage ptr -> [bytes, tracked tensors]
        self.allocated = self.peak_allocated = self.reserved = self.peak_reserved = 0
        self.busy = False

    def _free(self, ptr: int) -> None:
        entry = self.live.get(ptr)
        if entry is None:
            return
        entry[1] -= 1
        if entry[1] == 0:
            self.allocated -= entry[0]
            del self.live[ptr]

    def track(self, t: torch.Tensor) -> None:
        try:
            storage = t.untyped_storage()
        except (RuntimeError, NotImplementedError):
            return
        ptr, nbytes = storage.data_ptr(), storage.nbytes()
        if ptr == 0 or nbytes == 0:
            return
        if ptr in self.live:
            self.live[ptr][1] += 1
        else:
            if self.allocated + nbytes > self.capacity:
                raise torch.cuda.OutOfMemoryError(
                    f"CUDA out of memory. Tried to allocate {nbytes / MIB:.2f} MiB. GPU 0 has a total capacity of "
                    f"{self.capacity / MIB:.2f} MiB of which {(self.capacity - self.allocated) / MIB:.2f} MiB is free.")
            self.live[ptr] = [nbytes, 1]
            self.allocated += nbytes
            self.peak_allocated = max(self.peak_allocated, self.allocated)
            blocks = -(-self.allocated // BLOCK) * BLOCK
            self.reserved = max(self.reserved, blocks)
            self.peak_reserved = max(self.peak_reserved, self.reserved)
        weakref.finalize(t, self._free, ptr)


STATE: _State | None = None


def _is_cuda(x) -> bool:
    return (isinstance(x, torch.device) and x.type == "cuda") or (isinstance(x, str) and x.startswith("cuda"))


def _host(x):
    return torch.device("cpu") if _is_cuda(x) else x


class _CudaOnHost(TorchFunctionMode):
    def __torch_function__(self, func, types_, args=(), kwargs=None):
        kwargs = dict(kwargs or {})
        if "device" in kwargs:
            kwargs["device"] = _host(kwargs["device"])
        if func in (torch.Tensor.to, torch.Tensor.cuda):
            args = tuple(_host(a) for a in args)
            if func is torch.Tensor.cuda:
                func, args = torch.Tensor.to, (args[0], torch.device("cpu"))
        out = func(*args, **kwargs)
        if STATE is not None and getattr(func, "__name__", "") not in ("size", "dim", "numel", "__get__", "item"):
            tree_map(lambda t: STATE.track(t) if isinstance(t, torch.Tensor) else None, out)
        return out


class Event:
    """``torch.cuda.Event`` timed with ``time.perf_counter``."""

    def __init__(self, enable_timing: bool = False, blocking: bool = False, interprocess: bool = False) -> None:
        self.t: float | None = None

    def record(self, stream=None) -> None:
        self.t = time.perf_counter()

    def synchronize(self) -> None:
        pass

    def query(self) -> bool:
        return True

    def elapsed_time(self, end: "Event") -> float:
        return (end.t - self.t) * 1e3


def _reset_peaks(device=None) -> None:
    STATE.peak_allocated = STATE.allocated
    STATE.peak_reserved = STATE.reserved


_MODE: _CudaOnHost | None = None


def install(capacity_mb: float = 512.0) -> _State:
    """Simulate one GPU of ``capacity_mb`` MiB in this process (idempotent)."""
    global STATE, _MODE
    STATE = _State(capacity_mb)
    patch = {
        "is_available": lambda: True, "device_count": lambda: 1, "current_device": lambda: 0,
        "set_device": lambda d: None, "synchronize": lambda device=None: None, "Event": Event,
        "get_device_name": lambda device=None: NAME,
        # where the fake pynvml's first GPU sits on the PCI bus (torch 2.x's fields; torch 1.10's have none)
        "get_device_properties": lambda device=None: types.SimpleNamespace(
            name=NAME, total_memory=STATE.capacity, pci_domain_id=0, pci_bus_id=0x10, pci_device_id=0),
        "memory_allocated": lambda device=None: STATE.allocated,
        "memory_reserved": lambda device=None: STATE.reserved,
        "max_memory_allocated": lambda device=None: STATE.peak_allocated,
        "max_memory_reserved": lambda device=None: STATE.peak_reserved,
        "reset_peak_memory_stats": _reset_peaks,
    }
    for name, value in patch.items():
        setattr(torch.cuda, name, value)
    if _MODE is None:
        _MODE = _CudaOnHost()
        _MODE.__enter__()
    return STATE


def install_from_env() -> None:
    """Used by sitecustomize in child processes: ``P4S_SIM_CUDA_MB`` = capacity."""
    if os.environ.get("P4S_SIM_CUDA_MB"):
        install(float(os.environ["P4S_SIM_CUDA_MB"]))
