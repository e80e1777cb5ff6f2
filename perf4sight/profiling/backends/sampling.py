"""Sample readings in a background thread while training steps run (device side, stdlib only).

A reading is a dict of numbers (None = not available this time). Memory readings are
summarised by their peak, utilisation and power by their mean. Interval in seconds.
"""
import threading
from typing import Callable, Dict, List, Optional, Union

__all__ = ["Sampler"]

Reading = Dict[str, Optional[float]]


class Sampler:
    """Calls ``read()`` every ``interval_s`` between :meth:`start` and :meth:`stop`.

    A reading that raises is counted in ``failures`` and its first message kept in ``error``;
    sampling goes on.
    """

    def __init__(self, read: Callable[[], Reading], interval_s: float = 0.01) -> None:
        self.read, self.interval_s = read, interval_s
        self.samples: List[Reading] = []
        self.failures, self.error = 0, ""
        self._stop = threading.Event()
        self._thread: Optional[threading.Thread] = None

    def _take(self) -> None:
        try:
            self.samples.append(self.read())
        except Exception as exc:  # noqa: BLE001 - one bad reading must not stop the measurement
            self.failures += 1
            self.error = self.error or f"{type(exc).__name__}: {exc}"

    def _loop(self) -> None:
        while not self._stop.is_set():
            self._take()
            self._stop.wait(self.interval_s)

    def start(self) -> "Sampler":
        """Take one reading now, then one every ``interval_s`` in a background thread until :meth:`stop`."""
        self._take()  # at least one reading even for very short measurements
        self._thread = threading.Thread(target=self._loop, name="perf4sight-sampler", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> "Sampler":
        """Stop the thread and take one last reading."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
        self._take()
        return self

    def values(self, key: str) -> List[float]:
        """Every reading of ``key``, in order, the missing left out; in the unit ``read()`` gives it, which the key
        names (``used_mb``: MiB, ``util_pct``: percent, ``power_w``: watts)."""
        return [float(s[key]) for s in self.samples if s.get(key) is not None]

    def peak(self, key: str, digits: int = 2) -> Union[float, str]:
        """Largest reading of ``key`` ("" if never available)."""
        xs = self.values(key)
        return round(max(xs), digits) if xs else ""

    def mean(self, key: str, digits: int = 2) -> Union[float, str]:
        """Mean reading of ``key`` ("" if never available)."""
        xs = self.values(key)
        return round(sum(xs) / len(xs), digits) if xs else ""
