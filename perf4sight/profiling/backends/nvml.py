"""The ``nvml`` backend: desktop NVIDIA GPUs (RTX 3090, 2080 Ti, ...), device side.

Step time with CUDA events; torch allocator peaks (allocated, reserved); and, from NVML
(the ``pynvml`` module of the ``nvidia-ml-py`` package), the device memory in use *including
the CUDA context and every other process* (peak over the steps), GPU utilisation and board
power (means over the steps). CUDA OOM (``torch.cuda.OutOfMemoryError``) is ``oom``.

``gpu_index`` is the CUDA index; ``CUDA_DEVICE_ORDER=PCI_BUS_ID`` is set (unless already set)
before CUDA starts so that CUDA numbers the GPUs as NVML does. NVML ignores ``CUDA_VISIBLE_DEVICES``: where it is
set, the GPU CUDA's index names is its entry there (a number, or a GPU's UUID or the start of one), which NVML is
asked for (:func:`nvml_gpu`). Memory in MiB, power in W.
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
        self.handle = open_gpu(pynvml, self.plan.gpu_index)
        self.nvml = pynvml
        super().prepare()

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


def open_gpu(pynvml: Any, gpu_index: int) -> Any:
    """NVML's handle of the GPU CUDA calls ``gpu_index`` (:func:`nvml_gpu`), after ``nvmlInit``; ``RuntimeError`` where
    NVML cannot open it, naming the ``CUDA_VISIBLE_DEVICES`` entry where one chose it."""
    which = nvml_gpu(gpu_index)
    named = (f"GPU {gpu_index}" if which == gpu_index and isinstance(which, int)
             else f"GPU {gpu_index} (CUDA_VISIBLE_DEVICES entry {which!r})")
    try:
        pynvml.nvmlInit()
        if isinstance(which, int):
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
