"""The device backend contract: what the runner and the child process ask of a device.

A backend lives on both sides of one measurement:

* runner side (no torch imported, the runner must stay small so ``os.wait4``'s peak RSS
  belongs to the child): :meth:`Backend.watch` is called every ``plan.poll_interval_s``
  while the child runs; returning a message kills the child and records ``oom``.
* child side (torch imported): :meth:`prepare` (threads, device), :attr:`device`,
  :meth:`measure` (warm-up and timed steps -> latency and memory columns),
  :meth:`is_oom` (which exceptions mean out of memory) and :meth:`environment`.

A new backend subclasses :class:`Backend`, overrides what differs (a GPU backend: ``device``,
``synchronize``/``time_step`` with CUDA events, ``reset_peaks``/``memory_columns`` with the
allocator's statistics, ``is_oom`` with ``torch.cuda.OutOfMemoryError``) and is registered in
:data:`BACKENDS`. Every returned dict uses the column names of
:data:`perf4sight.profiling.results.COLUMNS`. Times in milliseconds, memory in MiB.
"""
import importlib
import math
import re
import socket
import time
from typing import Any, Callable, Dict, List, Optional, TYPE_CHECKING

from perf4sight.errors import UserError
from perf4sight.profiling.plan import TestPlan
from perf4sight.profiling.procfs import status_mb

#: An ``oom`` message of :meth:`Backend.over_limit`, read back: (the MiB seen, the memory_limit_mb it exceeded).
LIMIT_OOM = re.compile(r"(\d+(?:\.\d+)?) MiB exceeded memory_limit_mb (\d+)")

if TYPE_CHECKING:  # torch is imported lazily: the runner side must not load it
    import torch

__all__ = ["Backend", "BACKENDS", "get_backend", "latency_stats", "MAX_TIMED_STEPS"]

#: Upper bound on the timed steps of one measurement when ``min_timed_s`` asks for more.
MAX_TIMED_STEPS = 1000

#: backend name -> "module:Class"; the module is imported only when the backend is used.
BACKENDS: Dict[str, str] = {
    "cpu": "perf4sight.profiling.backends.cpu:CpuBackend",
    "nvml": "perf4sight.profiling.backends.nvml:NvmlBackend",
    "jetson": "perf4sight.profiling.backends.jetson:JetsonBackend",
}


def get_backend(plan: TestPlan) -> "Backend":
    """The backend named by ``plan.backend``; ``UserError`` if unknown or not installed."""
    target = BACKENDS.get(plan.backend)
    if target is None:
        raise UserError(f"plan: unknown backend '{plan.backend}' (known: {', '.join(BACKENDS)})")
    module_name, _, class_name = target.partition(":")
    try:
        cls = getattr(importlib.import_module(module_name), class_name)
    except ImportError as exc:
        raise UserError(f"backend '{plan.backend}' is not available on this machine ({exc})") from None
    return cls(plan)


def latency_stats(times_ms: List[float]) -> Dict[str, Any]:
    """Median, mean, p10, p90 and population std (ms) of per-step times; percentiles interpolate linearly."""
    xs = sorted(times_ms)
    n = len(xs)
    if n == 0:
        raise ValueError("no timed steps")

    def pct(q: float) -> float:
        pos = q * (n - 1)
        lo = math.floor(pos)
        hi = min(lo + 1, n - 1)
        return xs[lo] + (xs[hi] - xs[lo]) * (pos - lo)

    mean = sum(xs) / n
    std = math.sqrt(sum((x - mean) ** 2 for x in xs) / n)
    return {"latency_ms_median": round(pct(0.5), 4), "latency_ms_mean": round(mean, 4),
            "latency_ms_p10": round(pct(0.1), 4), "latency_ms_p90": round(pct(0.9), 4),
            "latency_ms_std": round(std, 4), "timed_steps": n}


class Backend:
    """Base backend: a CPU-like device timed with ``time.perf_counter``.

    Subclasses set :attr:`name` and :attr:`protocol` and override the hooks below.
    """

    name = "base"
    #: how one step is timed; written to the ``protocol`` column
    protocol = "perf_counter"

    def __init__(self, plan: TestPlan) -> None:
        self.plan = plan

    # ----------------------------------------------------------------- runner side
    def watch(self, pid: int) -> Optional[str]:
        """Called every poll interval on the running child; a message = kill it, record ``oom``.

        Default: the child's resident set size against ``plan.memory_limit_mb`` (0 = no limit).
        """
        if self.plan.memory_limit_mb <= 0:
            return None
        return self.over_limit(status_mb(pid, "VmRSS"), "RSS")

    def over_limit(self, rss_mb: Optional[float], what: str = "peak RSS") -> Optional[str]:
        """The ``oom`` message when ``rss_mb`` (MiB) exceeds ``plan.memory_limit_mb`` (0 = no limit), else None.
        The runner also asks it about a finished child's peak RSS: a peak shorter than the poll
        interval escapes :meth:`watch` but is over the limit all the same."""
        limit = self.plan.memory_limit_mb
        if limit > 0 and rss_mb is not None and rss_mb > limit:
            return f"{what} {rss_mb:.0f} MiB exceeded memory_limit_mb {limit}"  # read back by LIMIT_OOM
        return None

    # ------------------------------------------------------------------ child side
    def prepare(self) -> None:
        """Configure torch before the model is built (threads; a GPU backend selects its GPU)."""
        import torch

        if self.plan.threads > 0:
            torch.set_num_threads(self.plan.threads)

    @property
    def device(self) -> "torch.device":
        """Where the model, data and optimiser state live."""
        import torch

        return torch.device("cpu")

    def synchronize(self) -> None:
        """Wait for queued work to finish (a no-op on the CPU)."""

    def reset_peaks(self) -> None:
        """Forget memory peaks seen so far; called once, before the first warm-up step."""

    def time_step(self, step: Callable[[], None]) -> float:
        """Run one training step and return its duration in milliseconds."""
        self.synchronize()
        t0 = time.perf_counter()
        step()
        self.synchronize()
        return (time.perf_counter() - t0) * 1e3

    def mark(self) -> Any:
        """A point in the device's time, for timing a part of a step (:meth:`span_ms`) without waiting for it."""
        return time.perf_counter()

    def span_ms(self, start: Any, end: Any) -> float:
        """Milliseconds between two :meth:`mark` s, read after the step they were taken in has finished."""
        return (end - start) * 1e3

    def memory_columns(self) -> Dict[str, Any]:
        """Device-specific memory columns read after the timed steps (GPU: allocator peaks)."""
        return {}

    def measure(self, step: Callable[[], None], warmup_steps: int, timed_steps: int,
                min_timed_s: float = 0.0) -> Dict[str, Any]:
        """Warm up, then time steps one by one: at least ``timed_steps``, and more until the timed steps add
        up to ``min_timed_s`` seconds (at most :data:`MAX_TIMED_STEPS`); latency columns plus
        :meth:`memory_columns`."""
        self.reset_peaks()
        for _ in range(warmup_steps):
            step()
        self.synchronize()
        times = [self.time_step(step) for _ in range(timed_steps)]
        while sum(times) < 1e3 * min_timed_s and len(times) < MAX_TIMED_STEPS:
            times.append(self.time_step(step))
        row = latency_stats(times)
        row.update(warmup_steps=warmup_steps, protocol=self.protocol)
        row.update(self.memory_columns())
        return row

    def is_oom(self, exc: BaseException) -> bool:
        """True when ``exc`` means the step ran out of memory (then the row is ``oom``, not ``error``)."""
        if isinstance(exc, MemoryError):
            return True
        text = str(exc).lower()
        return isinstance(exc, RuntimeError) and ("out of memory" in text or "can't allocate memory" in text
                                                  or "cannot allocate memory" in text)

    def device_model(self) -> str:
        """Name of the measuring device (CPU model, GPU name)."""
        return ""

    def clocks(self) -> str:
        """Power mode / clocks where known, else ""."""
        return ""

    def environment(self) -> Dict[str, Any]:
        """Environment columns: torch version, threads, device model, clocks, hostname."""
        import torch

        return {"torch_version": torch.__version__, "threads": torch.get_num_threads(),
                "device_model": self.device_model(), "clocks": self.clocks(),
                "hostname": socket.gethostname()}
