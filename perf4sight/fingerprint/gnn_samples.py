"""The GNN's training samples of one device, from tidy measurement rows and network descriptions.

A sample is one ``ok`` (network, batch size) row with a network description; its targets are
``log(latency ms)`` (column ``latency_ms_median``) and ``log(memory MiB)`` (the trees' memory
column: ``peak_rss_mb`` for the cpu backend, else ``device_mem_used_mb``; see
:mod:`perf4sight.fingerprint.fit`), NaN where the row has no positive figure. ``oom`` rows are
kept apart: they teach the device's memory capacity. Samples are grouped for cross-validation as
the trees' are, per target (:meth:`Samples.target_groups`: by family, else by network).
"""
from __future__ import annotations

from typing import Any

import numpy as np

from perf4sight.errors import UserError
from perf4sight.features.aggregate import feature_matrix
from perf4sight.fingerprint.evaluate import choose_groups, row_family
from perf4sight.fingerprint.fit import (LATENCY_COLUMN, hold_native_conv, memory_column, memory_replay, records,
                                        step_runtime)
from perf4sight.fingerprint.gnn_graph import GraphTemplate, graph_template
from perf4sight.ir.schema import NetworkDescription
from perf4sight.profiling.results import batch_size_of, number

__all__ = ["Samples", "TARGETS"]

#: The GNN's outputs, in column order: log latency (ms), log memory (MiB).
TARGETS = ("latency", "memory")


def _positive(v: Any) -> float:
    """A cell as a positive float, else NaN."""
    x = number(v)
    return x if x is not None and x > 0 else float("nan")


class Samples:
    """The usable (network, batch size) samples of a device with their log targets [n, 2]."""

    def __init__(self, rows: Any, descriptions: dict[str, NetworkDescription], device: str):
        recs = [r for r in records(rows)
                if str(r.get("device", device)) == device and str(r["network"]) in descriptions]
        if not recs:
            raise UserError(f"gnn: no measurements with a network description for device '{device}'")
        self.mem_col = memory_column(recs)
        self.memory_replay = memory_replay(recs)  # how the trees' allocator replay reads memory, as the fit's
        self.runtime = step_runtime(recs)  # the rules of the rows' torch, which the features count
        self.ok = [r for r in recs if r.get("status") == "ok"]
        self.oom = [r for r in recs if r.get("status") == "oom"]
        lat = np.array([_positive(r.get(LATENCY_COLUMN)) for r in self.ok], dtype=float).reshape(-1)
        mem = np.array([_positive(r.get(self.mem_col)) for r in self.ok], dtype=float).reshape(-1)
        keep = np.isfinite(lat) | np.isfinite(mem)
        self.ok = [r for r, k in zip(self.ok, keep) if k]
        #: the figures as measured [n, 2] (ms, MiB; NaN where none), which the accuracy tables compare with: not
        #: exp(log(figure)), a last bit away, on which the trees refitted for the comparison chose other splits than
        #: the trees fingerprint's own (a held-out family's MAPE 13.1% against its 15.5%)
        self.measured = np.column_stack([lat[keep], mem[keep]])
        self.Y = np.log(self.measured)
        for j, t in enumerate(TARGETS):
            if np.isfinite(self.Y[:, j]).sum() < 3:
                raise UserError(f"gnn: fewer than 3 ok rows with a {t} figure for device '{device}'")
        self.templates = {n: graph_template(descriptions[n], self.runtime)
                          for n in sorted({str(r["network"]) for r in recs})}
        self.nets = np.array([str(r["network"]) for r in self.ok])
        self.bs = np.array([batch_size_of(r) for r in self.ok])
        self.families = np.array([row_family(r, descriptions[str(r["network"])].family) for r in self.ok])
        _, self.grouping = choose_groups(self.families, self.nets)  # of all rows (the folds: target_groups)
        self.F = hold_native_conv(feature_matrix([self.templates[n].features for n in self.nets], self.bs),
                                  self.runtime)

    def tmpl(self, idx: np.ndarray) -> list[GraphTemplate]:
        return [self.templates[n] for n in self.nets[idx]]

    def target_groups(self, j: int) -> tuple[np.ndarray, str]:
        """The fold labels of every sample for target ``j`` (0 latency, 1 memory) and their kind, chosen as the trees
        choose them for that target: by family where the rows with its figure have 2 or more families, else by
        network (:func:`~perf4sight.fingerprint.evaluate.choose_groups` on those rows)."""
        measured = np.isfinite(self.Y[:, j])
        _, grouping = choose_groups(self.families[measured], self.nets[measured])
        return (self.families if grouping == "family" else self.nets), grouping
