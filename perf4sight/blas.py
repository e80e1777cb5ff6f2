"""One set of OpenBLAS kernels on every x86-64 host, so that a fit gives the same fingerprint everywhere.

numpy and scipy ship OpenBLAS built for many CPUs and pick the kernels of the CPU they load on (AVX-512
ones on a recent Xeon, AVX2 ones on an AMD EPYC). The kernels round differently in the last bits, and the
fit amplifies that (most likely where the trees break a tie between equally good splits): the same
measurements gave per-family held-out figures up to 0.2 points apart on an Intel Xeon and an AMD EPYC (the
TX2 folds). Naming the kernels removes that. Haswell's (AVX2) run on every x86-64 CPU made since 2013; on
this tool's small matrices they are no slower (the TX2 benchmark's fits: 280 s against 284 s on the Xeon).

numpy's own loops (sums, exponentials, ...) are compiled for several instruction sets too and chosen the same
way; with the OpenBLAS kernels named, the TX2 benchmark's held-out figures still moved by up to 0.3 points
between an AVX2-only AMD EPYC and an AVX-512 one (2026-11-29): :func:`pin_numpy_dispatch` turns numpy's targets
above AVX2 off (``NPY_DISABLE_CPU_FEATURES``), and the AVX-512 host then printed the AVX2 host's figures to the
digit, no slower (the bench's predictions 17.5 against 19.5 ms).

OpenBLAS reads ``OPENBLAS_CORETYPE`` once, when numpy or scipy loads it, and numpy reads
``NPY_DISABLE_CPU_FEATURES`` when it loads, so :func:`pin_kernels` must run before either is imported
(``main.py`` and the benchmarks that fit call it first). A value the user has set is kept; other architectures
(aarch64, ...) are left to OpenBLAS and numpy.
"""
from __future__ import annotations

import importlib
import os
import platform
from importlib import metadata
from typing import MutableMapping

#: the kernels named on x86-64: AVX2, present on every x86-64 CPU this tool is likely to run on
X86_KERNELS = "Haswell"
_X86 = ("x86_64", "amd64")


def pin_openblas_kernels(environ: MutableMapping[str, str] | None = None, machine: str | None = None) -> str | None:
    """Set ``OPENBLAS_CORETYPE`` to :data:`X86_KERNELS` on an x86-64 host where it is unset; returns the value
    OpenBLAS will use (None: its own choice). ``environ``/``machine`` default to this process's."""
    env = os.environ if environ is None else environ
    arch = (machine or platform.machine()).lower()
    if arch in _X86:
        env.setdefault("OPENBLAS_CORETYPE", X86_KERNELS)
    return env.get("OPENBLAS_CORETYPE")


#: numpy's dispatched x86 targets above AVX2, as numpy >= 2.4 names them (X86_V3 is AVX2; older numpy names its
#: targets otherwise, and refuses names it does not dispatch, so it is left as it is)
NUMPY_ABOVE_AVX2 = "X86_V4 AVX512_ICL AVX512_SPR"


def pin_numpy_dispatch(environ: MutableMapping[str, str] | None = None, machine: str | None = None,
                       numpy_version: str | None = None) -> str | None:
    """Set ``NPY_DISABLE_CPU_FEATURES`` to :data:`NUMPY_ABOVE_AVX2` on an x86-64 host where it is unset and numpy
    is 2.4 or later (not where the user chose the targets with ``NPY_ENABLE_CPU_FEATURES``); returns the value
    numpy will read (None: every target it has). ``environ``, ``machine`` and ``numpy_version`` default to this
    process's and the installed numpy's (read without importing it)."""
    env = os.environ if environ is None else environ
    arch = (machine or platform.machine()).lower()
    try:
        version = numpy_version or metadata.version("numpy")
        major_minor = tuple(int(part) for part in version.split(".")[:2])
    except (metadata.PackageNotFoundError, ValueError):
        major_minor = (0, 0)
    if arch in _X86 and major_minor >= (2, 4) and "NPY_ENABLE_CPU_FEATURES" not in env:  # numpy takes one, not both
        env.setdefault("NPY_DISABLE_CPU_FEATURES", NUMPY_ABOVE_AVX2)
    return env.get("NPY_DISABLE_CPU_FEATURES")


def pin_kernels() -> None:
    """Both pins for this process: :func:`pin_openblas_kernels` (inherited by the processes it starts, as OpenBLAS
    takes the name on every x86-64 CPU) and :func:`pin_numpy_dispatch`, whose variable is read by importing numpy
    here and then removed, so that a measuring process on another Python, whose numpy may not know those names,
    never sees it. Call it before numpy or scipy is imported."""
    pin_openblas_kernels()
    if "NPY_DISABLE_CPU_FEATURES" not in os.environ and pin_numpy_dispatch() is not None:
        importlib.import_module("numpy")  # reads the variable now, once for this process

        del os.environ["NPY_DISABLE_CPU_FEATURES"]


def numpy_targets() -> str:
    """The dispatched instruction sets numpy's loops run on in this process (``X86_V3`` where pinned on an AVX-512
    host), space-separated; "" where numpy does not say (a private table: read defensively)."""
    try:
        from numpy._core._multiarray_umath import __cpu_dispatch__, __cpu_features__
    except ImportError:
        return ""
    return " ".join(t for t in __cpu_dispatch__ if __cpu_features__.get(t))
