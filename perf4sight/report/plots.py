"""PNG plots of the compare report, drawn with matplotlib's Agg backend (no display needed).

Each function writes one PNG and returns its path. Latency in ms, memory in MiB, batch size
in images per step; axes are logarithmic where the devices span orders of magnitude.
"""
from __future__ import annotations

from pathlib import Path
from typing import Sequence

import matplotlib

matplotlib.use("Agg")
import matplotlib.ticker  # noqa: E402
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402

from perf4sight.fingerprint.predict import BATCH_SEARCH_LIMIT  # noqa: E402
from perf4sight.report.data import Curve  # noqa: E402
from perf4sight.report.pruning import LeastLevel, PruningPoint  # noqa: E402

__all__ = ["plot_curves", "plot_sensitivity", "plot_scatter", "plot_pruning", "device_colours"]

UNITS = {"latency": ("predicted training step time", "ms"), "memory": ("predicted memory", "MiB")}


class _PlainLogFormatter(matplotlib.ticker.LogFormatter):
    """Log-axis tick labels as plain numbers (700, not 7x10^2); which ticks get a label stays matplotlib's
    (only the public ``Formatter.__call__`` is overridden)."""

    def __call__(self, x: float, pos: int | None = None) -> str:
        return f"{x:g}" if super().__call__(x, pos) else ""


def _plain_log_ticks(ax: plt.Axes, x_base: float = 10.0) -> None:
    """Label both log axes of ``ax`` (x in powers of ``x_base``, y of 10) in plain numbers, minor ticks too
    where an axis spans under a decade."""
    for axis, base in ((ax.xaxis, x_base), (ax.yaxis, 10.0)):
        axis.set_major_formatter(_PlainLogFormatter(base=base))
        axis.set_minor_formatter(_PlainLogFormatter(base=base, labelOnlyBase=False))


def device_colours(devices: Sequence[str]) -> dict[str, str]:
    """A fixed colour per device (tab10 order)."""
    cycle = plt.get_cmap("tab10").colors
    return {d: matplotlib.colors.to_hex(cycle[i % len(cycle)]) for i, d in enumerate(devices)}


def _save(fig: plt.Figure, path: Path) -> Path:
    fig.savefig(path, dpi=90)
    plt.close(fig)
    return path


def plot_curves(curves: dict[str, list[Curve]], target: str, colours: dict[str, str],
                capacity: dict[str, float | None], path: Path) -> Path:
    """One panel per network: every device's prediction (line), 90% interval (band), measured
    points (dots); memory panels also show each device's capacity (dashed)."""
    nets = list(curves)
    cols = min(2, max(1, len(nets)))
    rows = (len(nets) + cols - 1) // cols
    fig, axes = plt.subplots(rows, cols, figsize=(6.2 * cols, 4.2 * rows), squeeze=False)
    title, unit = UNITS[target]
    for ax, net in zip(axes.flat, nets):
        for c in curves[net]:
            col = colours[c.device]
            at = f" at {c.input_shape}" if c.input_shape else ""
            ax.plot(c.batch_sizes, c.value, color=col, label=f"{c.device} predicted{at}")
            ax.fill_between(c.batch_sizes, c.low, c.high, color=col, alpha=0.18, linewidth=0)
            if c.measured.size:
                ax.plot(c.measured_bs, c.measured, "o", color=col, markersize=4,
                        label=f"{c.device} measured ({c.measured_label})")
            cap = capacity.get(c.device)
            if target == "memory" and cap:
                ax.axhline(cap, color=col, linestyle="--", linewidth=0.9, label=f"{c.device} capacity")
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        _plain_log_ticks(ax, x_base=2)
        ax.set_title(net)
        ax.set_xlabel("batch size (images)")
        ax.set_ylabel(f"{title} ({unit})")
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=7)
    for ax in list(axes.flat)[len(nets):]:
        ax.axis("off")
    fig.suptitle(f"{title} against batch size (band: 90% prediction interval)")
    fig.tight_layout()
    return _save(fig, path)


def plot_sensitivity(sens: dict[str, dict[str, dict[str, float]]], colours: dict[str, str], path: Path) -> Path:
    """Grouped horizontal bars per target: feature -> % change of the prediction when shuffled,
    one bar per device. ``sens``: device -> target -> feature -> percent."""
    targets = ("latency", "memory")
    devices = list(sens)
    fig, axes = plt.subplots(1, 2, figsize=(12, 5.5))
    for ax, target in zip(axes, targets):
        feats = sorted({f for d in devices for f in sens[d].get(target, {})},
                       key=lambda f: -max(sens[d].get(target, {}).get(f, 0.0) for d in devices))
        y = np.arange(len(feats))
        h = 0.8 / max(1, len(devices))
        for i, d in enumerate(devices):
            vals = [sens[d].get(target, {}).get(f, 0.0) for f in feats]
            ax.barh(y + i * h, vals, height=h, color=colours[d], label=d)
        ax.set_yticks(y + h * (len(devices) - 1) / 2, feats, fontsize=8)
        ax.invert_yaxis()
        ax.set_xlabel("mean |change| of prediction when shuffled (%)")
        ax.set_title(f"{target}: features the fingerprint leans on")
        ax.grid(True, axis="x", alpha=0.3)
        ax.legend(fontsize=8)
    fig.tight_layout()
    return _save(fig, path)


def plot_scatter(device: str, scatter: dict[str, tuple[np.ndarray, np.ndarray, str]], colour: str,
                 path: Path) -> Path:
    """Predicted against measured (log-log) for latency and memory, with y = x and ±10% lines.
    ``scatter``: target -> (measured, predicted, how the predictions were made)."""
    fig, axes = plt.subplots(1, 2, figsize=(11, 4.6))
    for ax, target in zip(axes, ("latency", "memory")):
        meas, pred, how = scatter.get(target, (np.zeros(0), np.zeros(0), "no data"))
        keep = np.isfinite(pred)
        meas, pred = meas[keep], pred[keep]
        unit = UNITS[target][1]
        if meas.size:
            ax.scatter(meas, pred, s=9, color=colour, alpha=0.6, edgecolors="none")
            lo, hi = float(min(meas.min(), pred.min())), float(max(meas.max(), pred.max()))
            xs = np.geomspace(lo * 0.9, hi * 1.1, 50)
            ax.plot(xs, xs, "k-", linewidth=0.8, label="y = x")
            ax.plot(xs, xs * 1.1, "k:", linewidth=0.8, label="±10%")
            ax.plot(xs, xs * 0.9, "k:", linewidth=0.8)
            ax.set_xscale("log")
            ax.set_yscale("log")
            _plain_log_ticks(ax)
            ax.legend(fontsize=8)
        else:
            ax.text(0.5, 0.5, "no measurements with a description", ha="center", transform=ax.transAxes)
        ax.set_xlabel(f"measured {target} ({unit})")
        ax.set_ylabel(f"predicted {target} ({unit})")
        ax.set_title(f"{device}: {target}, {meas.size} configurations ({how})", fontsize=10)
        ax.grid(True, which="both", alpha=0.3)
    fig.tight_layout()
    return _save(fig, path)


def plot_pruning(points: Sequence[PruningPoint], least: Sequence[LeastLevel], colours: dict[str, str],
                 capacity: dict[str, float | None], labels: dict[str, str], path: Path) -> Path:
    """One row per pruned network, against the share of parameters removed: every device's predicted step time
    and memory at the section's batch size (band: 90% interval; hollow marker: predicted not to fit at that batch
    size; cross: the device's measurement of that very variant; dashed: the device's capacity; dotted: the least
    level predicted to fit, of ``least``), and the largest batch size predicted to fit (capped at 1024, a triangle
    there: every batch searched fits; left out where the capacity is unknown or no batch fits). ``labels``: each
    device's legend label."""
    nets = list(dict.fromkeys(p.network for p in points))
    devices = list(dict.fromkeys(p.device for p in points))
    batch = points[0].batch_size
    fig, axes = plt.subplots(len(nets), 3, figsize=(17, 4.2 * len(nets)), squeeze=False)
    panels = (("latency_ms", "step time", "predicted training step time (ms)"),
              ("memory_mb", "memory", "predicted memory (MiB)"))
    for row, net in zip(axes, nets):
        for i, device in enumerate(devices):
            # the markers and dotted lines of the devices drawn first drawn larger, so that one drawn later on the
            # same points (two GPUs both at 1024+, both fitting from 0%) leaves them showing round it
            wider = len(devices) - 1 - i
            pts = sorted((p for p in points if p.network == net and p.device == device), key=lambda p: p.achieved)
            if not pts:
                continue
            col, x = colours[device], np.array([p.achieved for p in pts])
            for ax, (key, _, _) in zip(row, panels):
                y = np.array([getattr(p, key) for p in pts])
                ax.plot(x, y, color=col, label=labels.get(device, device))
                ax.fill_between(x, [getattr(p, f"{key}_low") for p in pts], [getattr(p, f"{key}_high") for p in pts],
                                color=col, alpha=0.18, linewidth=0)
                ax.scatter(x, y, s=28, zorder=3, edgecolors=col,
                           facecolors=[("none" if p.fits is False else col) for p in pts])
                seen = [p for p in pts if getattr(p, f"measured_{key}") is not None]
                if seen:
                    ax.plot([p.achieved for p in seen], [getattr(p, f"measured_{key}") for p in seen], "x", color=col,
                            markersize=7, label=f"{device} measured")
            if capacity.get(device):
                row[1].axhline(capacity[device], color=col, linestyle="--", linewidth=0.9, label=f"{device} capacity")
            fit = next((x for x in least if x.network == net and x.device == device and x.achieved is not None), None)
            if fit is not None:
                row[1].axvline(fit.achieved, color=col, linestyle=":", linewidth=1.1 + wider,
                               label=f"{device}: fits from {fit.level}%")
            fitting = [p for p in pts if p.max_batch]  # a batch of 1 that does not fit (0) has no place on a log axis
            if fitting:
                row[2].plot([p.achieved for p in fitting], [p.max_batch for p in fitting], "o-", color=col,
                            markersize=6 + 3 * wider, label=labels.get(device, device))
            beyond = [p for p in fitting if p.max_batch >= BATCH_SEARCH_LIMIT]  # the search's end: it may fit more
            if beyond:
                row[2].plot([p.achieved for p in beyond], [p.max_batch for p in beyond], "^", color=col,
                            markersize=9 + 4 * wider, linestyle="none",
                            label=f"{device}: {BATCH_SEARCH_LIMIT}+ (every batch searched fits)")
        for ax, (_, what, unit) in zip(row, panels):
            ax.set_yscale("log")
            ax.yaxis.set_major_formatter(_PlainLogFormatter(base=10.0))
            ax.yaxis.set_minor_formatter(_PlainLogFormatter(base=10.0, labelOnlyBase=False))
            ax.set_title(f"{net}: {what} at batch {batch} (hollow: does not fit)", fontsize=10)
            ax.set_ylabel(unit)
        row[2].set_yscale("log", base=2)
        row[2].yaxis.set_major_formatter(_PlainLogFormatter(base=2.0))
        row[2].set_title(f"{net}: largest batch predicted to fit", fontsize=10)
        row[2].set_ylabel("batch size (images)")
        for ax in row:
            ax.set_xlabel("parameters removed by pruning (%)")
            ax.grid(True, which="both", alpha=0.3)
            if ax.get_legend_handles_labels()[0]:
                ax.legend(fontsize=7)
    fig.tight_layout()
    return _save(fig, path)
