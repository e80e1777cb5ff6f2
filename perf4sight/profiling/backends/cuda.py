"""What every CUDA backend shares: CUDA-event timing, allocator peaks, CUDA OOM (device side).

``gpu_index`` is the CUDA device index. Times in milliseconds, memory in MiB (2**20 bytes).
Subclasses add device-wide readings by overriding :meth:`CudaBackend.read_device`, which a
:class:`Sampler` calls every ``sample_interval_s`` during the warm-up and timed steps.
"""
from typing import Any, Callable, Dict, Optional, TYPE_CHECKING

from perf4sight.profiling.backends.base import Backend
from perf4sight.profiling.backends.sampling import Reading, Sampler

if TYPE_CHECKING:
    import torch

__all__ = ["CudaBackend", "MIB"]

MIB = 2**20


class CudaBackend(Backend):
    """Training steps on CUDA device ``plan.gpu_index``, timed with CUDA events."""

    name = "cuda"
    protocol = "cuda_events"
    sample_interval_s = 0.01

    def __init__(self, plan) -> None:
        super().__init__(plan)
        self.sampler: Optional[Sampler] = None

    def prepare(self) -> None:
        super().prepare()
        import torch

        if not torch.cuda.is_available():
            raise RuntimeError(f"backend '{self.name}': torch {torch.__version__} sees no CUDA device")
        if self.plan.gpu_index >= torch.cuda.device_count():
            raise RuntimeError(f"backend '{self.name}': gpu_index {self.plan.gpu_index} but only "
                               f"{torch.cuda.device_count()} CUDA device(s)")
        torch.cuda.set_device(self.plan.gpu_index)

    @property
    def device(self) -> "torch.device":
        import torch

        return torch.device("cuda", self.plan.gpu_index)

    def synchronize(self) -> None:
        import torch

        torch.cuda.synchronize(self.device)

    def reset_peaks(self) -> None:
        import torch

        torch.cuda.synchronize(self.device)
        torch.cuda.reset_peak_memory_stats(self.device)

    def time_step(self, step: Callable[[], None]) -> float:
        """One step between two CUDA events on the current stream (:meth:`mark`); milliseconds."""
        start = self.mark()
        step()
        return self.span_ms(start, self.mark())

    def mark(self) -> Any:
        """A CUDA event recorded on the current stream (nothing waits for it)."""
        import torch

        event = torch.cuda.Event(enable_timing=True)
        event.record()
        return event

    def span_ms(self, start: Any, end: Any) -> float:
        """The device time between two recorded events, in milliseconds, once the later one is done (waits for it)."""
        end.synchronize()
        return float(start.elapsed_time(end))

    def read_device(self) -> Reading:
        """Device-wide readings for the sampler (memory in MiB, utilisation in %, power in W)."""
        return {}

    def measure(self, step: Callable[[], None], warmup_steps: int, timed_steps: int,
                min_timed_s: float = 0.0) -> Dict[str, Any]:
        """Base measurement (events, allocator peaks) plus :meth:`sampled_columns` of the readings."""
        self.sampler = Sampler(self.read_device, self.sample_interval_s).start()
        try:
            row = super().measure(step, warmup_steps, timed_steps, min_timed_s)
        finally:
            self.sampler.stop()
        row.update(self.sampled_columns(self.sampler))
        return row

    def sampled_columns(self, sampler: Sampler) -> Dict[str, Any]:
        """Columns from the device readings taken during the steps (peaks of memory, means of the rest)."""
        return {}

    def memory_columns(self) -> Dict[str, Any]:
        """Allocator peaks since :meth:`reset_peaks` (read before the sampler stops)."""
        import torch

        return {"torch_alloc_peak_mb": round(torch.cuda.max_memory_allocated(self.device) / MIB, 2),
                "torch_reserved_peak_mb": round(torch.cuda.max_memory_reserved(self.device) / MIB, 2)}

    def is_oom(self, exc: BaseException) -> bool:
        import torch

        oom_class = getattr(torch.cuda, "OutOfMemoryError", None)  # torch 1.13+; before, a RuntimeError said so
        if oom_class is not None and isinstance(exc, oom_class):
            return True
        text = str(exc)
        return super().is_oom(exc) or any(s in text for s in ("CUBLAS_STATUS_ALLOC_FAILED", "CUDNN_STATUS_ALLOC_FAILED",
                                                              "NvMapMemAlloc"))

    def device_model(self) -> str:
        import torch

        return torch.cuda.get_device_name(self.device)
