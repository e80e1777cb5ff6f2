"""A simulated ``jtop`` (jetson-stats 4.x client) for tests: ``from jtop import jtop, JtopException``.

The service is "active" unless ``P4S_FAKE_JTOP=inactive`` (then ``start()`` raises the
real library's message) or ``stuck`` (the service takes the connection but never answers: the real client's
``start()`` then raises ``queue.Empty`` from its configuration request). Memory in kB, power in mW, GPU load in %,
as jtop reports them.
"""
from __future__ import annotations

import os
import queue
import types

__version__ = "4.2.12-sim"


class JtopException(Exception):
    """jtop's general exception."""


class jtop:  # noqa: N801 - the real class name
    def __init__(self, interval: float = 0.5) -> None:
        self.interval = interval
        self._running = False

    def start(self) -> None:
        if os.environ.get("P4S_FAKE_JTOP") == "stuck":
            raise queue.Empty()
        if os.environ.get("P4S_FAKE_JTOP", "active") != "active":
            raise JtopException("The jtop.service is not active. Please run:\nsudo systemctl restart jtop.service")
        self._running = True

    def close(self) -> None:
        self._running = False

    def __enter__(self) -> "jtop":
        self.start()
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def ok(self, spin: bool = False) -> bool:
        return self._running

    def _need(self) -> None:
        if not self._running:
            raise JtopException("jtop is not running")

    @property
    def memory(self) -> dict:
        self._need()
        return {"RAM": {"tot": 8039920, "used": 2_500_000, "free": 4_000_000, "buffers": 100_000,
                        "cached": 1_400_000, "shared": 300_000, "lfb": 512},
                "SWAP": {"tot": 0, "used": 0, "cached": 0, "table": {}}, "EMC": {"online": True, "val": 12}}

    @property
    def gpu(self) -> dict:
        self._need()
        return {"gpu": {"type": "integrated", "status": {"railgate": False, "tpc_pg_mask": False,
                                                           "3d_scaling": True, "load": 76.5},
                        "freq": {"governor": "nvhost_podgov", "cur": 1300500, "max": 1300500, "min": 114750}}}

    @property
    def power(self) -> dict:
        self._need()
        return {"rail": {"VDD_GPU": {"online": True, "volt": 19000, "curr": 300, "power": 5700, "avg": 5000}},
                "tot": {"volt": 19000, "curr": 600, "power": 11400, "avg": 10000, "name": "VDD_IN"}}

    @property
    def stats(self) -> dict:
        self._need()
        return {"GPU": 76.5, "RAM": 0.31, "Power TOT": 11400, "nvp model": "MAXN", "jetson_clocks": "ON"}

    @property
    def nvpmodel(self):
        self._need()
        return types.SimpleNamespace(name="MAXN", id=0)

    @property
    def jetson_clocks(self):
        self._need()
        return True
