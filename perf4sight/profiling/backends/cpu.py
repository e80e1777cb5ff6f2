"""The ``cpu`` backend: any Linux host, timed with ``time.perf_counter``, memory as process RSS.

Peak memory is the measuring child's peak resident set size, read by the runner with
``os.wait4`` (``ru_maxrss``). A ``memory_limit_mb`` makes the runner kill a child whose RSS
crosses it and record ``oom`` (see :meth:`Backend.watch`), so a sweep cannot exhaust the
machine; in the child, ``MemoryError`` and allocator "out of memory" errors are ``oom`` too.
"""
from perf4sight.profiling.backends.base import Backend
from perf4sight.profiling.procfs import cpu_clocks, cpu_model

__all__ = ["CpuBackend"]


class CpuBackend(Backend):
    """Training steps on the host CPU with ``plan.threads`` torch threads (0 = torch's default)."""

    name = "cpu"
    protocol = "perf_counter"

    def device_model(self) -> str:
        return cpu_model()

    def clocks(self) -> str:
        return cpu_clocks()
