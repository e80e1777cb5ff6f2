"""A script of bench/ loaded as a module, for the tests of its parts."""
from __future__ import annotations

import importlib.util
import os
from pathlib import Path
from types import ModuleType

BENCH = Path(__file__).resolve().parents[1] / "bench"


def load_bench(name: str) -> ModuleType:
    """``bench/<name>.py``, imported under its own name. The environment is given back as it was: a bench pins
    OpenBLAS's kernels for its own process (``perf4sight.blas.pin_kernels``, a variable its subprocesses inherit),
    which in a test worker made a later test's subprocess compute other floats than the worker."""
    spec = importlib.util.spec_from_file_location(name, BENCH / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    environ = dict(os.environ)
    try:
        spec.loader.exec_module(module)
    finally:
        os.environ.clear()
        os.environ.update(environ)
    return module
