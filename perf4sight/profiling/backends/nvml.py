"""The ``nvml`` backend: desktop NVIDIA GPUs (RTX 3090, 2080 Ti, ...), device side.

Step time with CUDA events; torch allocator peaks (allocated, reserved); and, from NVML
(the ``pynvml`` module of the ``nvidia-ml-py`` package), the device memory in use *including
the CUDA context and every other process* (peak over the steps), GPU utilisation and board
power (means over the steps). CUDA OOM (``torch.cuda.OutOfMemoryError``) is ``oom``.

``gpu_index`` is the CUDA index; ``CUDA_DEVICE_ORDER=PCI_BUS_ID`` is set (unless already set) before CUDA starts
so that CUDA numbers the GPUs as NVML does. NVML ignores ``CUDA_VISIBLE_DEVICES``: where the GPU's entry there is a
UUID (or the start of one), NVML is asked for that; else for the GPU at the PCI address CUDA gives the index
(:func:`cuda_pci_bus_id`), whatever order CUDA numbers the GPUs in. Where neither torch nor the CUDA driver tells that
address, NVML is asked for the entry's number, or the index itself (:func:`nvml_gpu`), and a CUDA order other than
NVML's on a machine of several GPUs is refused. Memory in MiB, power in W.
"""
import os
from typing import Any, Dict, Mapping, Optional, Union

from perf4sight.profiling.backends.cuda import MIB, CudaBackend
from perf4sight.profiling.backends.sampling import Reading, Sampler

__all__ = ["NvmlBackend"]


class NvmlBackend(CudaBackend):
    """CUDA training steps watched through NVML."""

    name = "nvml"

    def __init__(self, plan) -> None:
        super().__init__(plan)
        self.nvml: Any = None
        self.handle: Any = None

    def prepare(self) -> None:
        os.environ.setdefault("CUDA_DEVICE_ORDER", "PCI_BUS_ID")
        try:
            import pynvml
        except ImportError:
            raise RuntimeError("backend 'nvml' needs pynvml on the device (pip install nvidia-ml-py)") from None
        super().prepare()  # CUDA up and gpu_index checked: its PCI address can be asked
        self.handle = open_gpu(pynvml, self.plan.gpu_index, cuda_pci_bus_id(self.plan.gpu_index))
        self.nvml = pynvml

    def read_device(self) -> Reading:
        nv, h = self.nvml, self.handle
        reading: Reading = {"used_mb": nv.nvmlDeviceGetMemoryInfo(h).used / MIB}
        for key, get in (("util_pct", lambda: nv.nvmlDeviceGetUtilizationRates(h).gpu),
                         ("power_w", lambda: nv.nvmlDeviceGetPowerUsage(h) / 1000.0)):  # milliwatts
            try:
                reading[key] = float(get())
            except nv.NVMLError:  # e.g. NVMLError_NotSupported on some boards
                reading[key] = None
        return reading

    def sampled_columns(self, sampler: Sampler) -> Dict[str, Any]:
        cols = {"device_mem_used_mb": sampler.peak("used_mb"), "gpu_util_pct": sampler.mean("util_pct", 1),
                "power_w": sampler.mean("power_w")}
        if sampler.failures:
            cols["message"] = f"{sampler.failures} NVML readings failed: {sampler.error}"[:300]
        return cols

    def device_model(self) -> str:
        if self.handle is not None:
            name = self.nvml.nvmlDeviceGetName(self.handle)
            return name.decode() if isinstance(name, bytes) else str(name)
        return super().device_model()

    def clocks(self) -> str:
        """Current SM and memory clocks, e.g. ``sm 1695MHz mem 9751MHz``; "" if NVML cannot tell."""
        if self.handle is None:
            return ""
        nv = self.nvml
        try:
            return (f"sm {nv.nvmlDeviceGetClockInfo(self.handle, nv.NVML_CLOCK_SM)}MHz "
                    f"mem {nv.nvmlDeviceGetClockInfo(self.handle, nv.NVML_CLOCK_MEM)}MHz")
        except nv.NVMLError:
            return ""


def nvml_gpu(gpu_index: int, env: Optional[Mapping[str, str]] = None) -> Union[int, str]:
    """What NVML knows CUDA's GPU ``gpu_index`` by: its entry in ``CUDA_VISIBLE_DEVICES`` (``env``: the process's
    environment), an NVML index where the entry is a number, else the UUID (or the start of one) it gives; the index
    itself where the variable is unset or has no entry for it (CUDA then refuses the index, or sees every GPU)."""
    visible = (os.environ if env is None else env).get("CUDA_VISIBLE_DEVICES")
    if visible is None:
        return gpu_index
    entries = [e.strip() for e in visible.split(",")]
    if gpu_index >= len(entries) or not entries[gpu_index]:
        return gpu_index
    entry = entries[gpu_index]
    return int(entry) if entry.isdigit() else entry


def cuda_pci_bus_id(gpu_index: int) -> Optional[str]:
    """The PCI address (``domain:bus:device.function``, hex) of the GPU CUDA calls ``gpu_index`` in this process, as
    CUDA numbers them here (``CUDA_DEVICE_ORDER``, ``CUDA_VISIBLE_DEVICES``): from torch's device properties (their
    ``pci_*`` fields, in torch 2.x), else from the CUDA driver (``cuDeviceGetPCIBusId`` of ``libcuda.so.1``, which
    numbers the GPUs as the runtime does; torch 1.10, a Jetson's, has no such fields); None where neither tells."""
    import torch

    try:
        props = torch.cuda.get_device_properties(gpu_index)
    except (RuntimeError, AssertionError, AttributeError):  # no CUDA: the driver is not asked either
        return None
    fields = [getattr(props, name, None) for name in ("pci_domain_id", "pci_bus_id", "pci_device_id")]
    if all(isinstance(f, int) for f in fields):
        return "%08X:%02X:%02X.0" % tuple(fields)
    import ctypes

    try:
        driver = ctypes.CDLL("libcuda.so.1")
        device, text = ctypes.c_int(), ctypes.create_string_buffer(64)
        if (driver.cuInit(0) or driver.cuDeviceGet(ctypes.byref(device), gpu_index)
                or driver.cuDeviceGetPCIBusId(text, 64, device)):
            return None
    except (OSError, AttributeError):  # no driver library, or one without these calls
        return None
    return text.value.decode() or None


def _call(fn: Any, text: str) -> Any:
    """``fn(text)``: nvidia-ml-py takes a str; an older pynvml's ``c_char_p`` wants bytes."""
    try:
        return fn(text)
    except TypeError:
        return fn(text.encode())


def open_gpu(pynvml: Any, gpu_index: int, pci_bus_id: Optional[str] = None) -> Any:
    """NVML's handle of the GPU CUDA calls ``gpu_index``, after ``nvmlInit``: the GPU of its ``CUDA_VISIBLE_DEVICES``
    entry where that is a UUID (of a MIG instance too, which its PCI address would not tell from the whole GPU), else
    the GPU at ``pci_bus_id`` (:func:`cuda_pci_bus_id`) where given, else :func:`nvml_gpu`'s; ``RuntimeError`` where
    NVML cannot open it, naming the ``CUDA_VISIBLE_DEVICES`` entry where one chose it, or where CUDA may number the
    GPUs otherwise than NVML (``CUDA_DEVICE_ORDER`` other than ``PCI_BUS_ID``) and a number alone says which."""
    which = nvml_gpu(gpu_index)
    if pci_bus_id and isinstance(which, int):  # a UUID entry names the GPU in any order (a MIG one, its instance)
        try:
            pynvml.nvmlInit()
            return _call(pynvml.nvmlDeviceGetHandleByPciBusId, pci_bus_id)
        except pynvml.NVMLError as exc:
            raise RuntimeError(f"NVML cannot open GPU {gpu_index} (PCI {pci_bus_id}): {exc}") from None
    named = (f"GPU {gpu_index}" if which == gpu_index and isinstance(which, int)
             else f"GPU {gpu_index} (CUDA_VISIBLE_DEVICES entry {which!r})")
    order = os.environ.get("CUDA_DEVICE_ORDER", "FASTEST_FIRST")
    try:
        pynvml.nvmlInit()
        if isinstance(which, int):
            if order != "PCI_BUS_ID" and pynvml.nvmlDeviceGetCount() > 1:
                raise RuntimeError(f"NVML cannot tell which GPU is CUDA's {named}: CUDA_DEVICE_ORDER={order} numbers "
                                   "the GPUs otherwise than NVML, and neither torch nor the CUDA driver gave its PCI "
                                   "address; unset it or set PCI_BUS_ID")
            return pynvml.nvmlDeviceGetHandleByIndex(which)
        try:
            return pynvml.nvmlDeviceGetHandleByUUID(which)
        except pynvml.NVMLError:  # CUDA also takes the start of a UUID ("GPU-8932f937"); NVML wants all of it
            pass
        found = []
        for i in range(pynvml.nvmlDeviceGetCount()):
            handle = pynvml.nvmlDeviceGetHandleByIndex(i)
            uuid = pynvml.nvmlDeviceGetUUID(handle)
            if (uuid.decode() if isinstance(uuid, bytes) else str(uuid)).startswith(which):
                found.append(handle)
        if len(found) != 1:
            raise RuntimeError(f"NVML cannot open {named}: {'no' if not found else len(found)} GPU UUID(s) "
                               "start so")
        return found[0]
    except pynvml.NVMLError as exc:
        raise RuntimeError(f"NVML cannot open {named}: {exc}") from None
