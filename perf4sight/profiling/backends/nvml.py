"""The ``nvml`` backend: desktop NVIDIA GPUs (RTX 3090, 2080 Ti, ...), device side.

Step time with CUDA events; torch allocator peaks (allocated, reserved); and, from NVML
(the ``pynvml`` module of the ``nvidia-ml-py`` package), the device memory in use *including
the CUDA context and every other process* (peak over the steps), GPU utilisation and board
power (means over the steps). CUDA OOM (``torch.cuda.OutOfMemoryError``) is ``oom``.

``gpu_index`` is the CUDA index; ``CUDA_DEVICE_ORDER=PCI_BUS_ID`` is set (unless already set)
before CUDA starts so that it is also the NVML index. Memory in MiB, power in W.
"""
import os
from typing import Any, Dict

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
        try:
            pynvml.nvmlInit()
            self.handle = pynvml.nvmlDeviceGetHandleByIndex(self.plan.gpu_index)
        except pynvml.NVMLError as exc:
            raise RuntimeError(f"NVML cannot open GPU {self.plan.gpu_index}: {exc}") from None
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
