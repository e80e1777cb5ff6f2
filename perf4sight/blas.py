"""One set of OpenBLAS kernels on every x86-64 host, so that a fit gives the same fingerprint everywhere.

numpy and scipy ship OpenBLAS built for many CPUs and pick the kernels of the CPU they load on (AVX-512
ones on a recent Xeon, AVX2 ones on an AMD EPYC). The kernels round differently in the last bits, and the
fit amplifies that (most likely where the trees break a tie between equally good splits): the same
measurements gave per-family held-out figures up to 0.2 points apart on an Intel Xeon and an AMD EPYC (the
TX2 folds). Naming the kernels removes that. Haswell's (AVX2) run on every x86-64 CPU made since 2013; on
this tool's small matrices they are no slower (the TX2 benchmark's fits: 280 s against 284 s on the Xeon).

OpenBLAS reads ``OPENBLAS_CORETYPE`` once, when numpy or scipy loads it, so :func:`pin_openblas_kernels`
must run before either is imported (``main.py`` and the benchmarks that fit call it first). A value the user
has set is kept; other architectures (aarch64, ...) are left to OpenBLAS.
"""
from __future__ import annotations

import os
import platform
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
