"""The compare report's pruning section: step time, memory and the largest batch against the pruning level.

perf4sight's question: how far must a network be pruned before it trains on a device at a given batch size, and
what does a step then cost there. For each compare network that can be pruned (a zoo network, or one the config's
``[networks]`` names) and each level of ``[compare] pruning_levels``, the variant ``<network>_l<level>`` is the
networks stage's file where the dataset has it at the device's input shape, else it is pruned on request as the
networks stage would (:mod:`perf4sight.networks.on_request`); every device then predicts it at ``[compare]
pruning_batch_size``. ``pruning_points`` gathers the predictions, ``pruning_blocks`` renders the report's section
(the plot is :func:`perf4sight.report.plots.plot_pruning`) and ``print_pruning`` its short terminal table. Units:
step time in ms, memory in MiB, batch sizes in images per step, levels in % of the network's parameters removed.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Sequence

from rich.console import Console
from rich.table import Table as RichTable
from rich.text import Text as RichText

from perf4sight.config import Config
from perf4sight.errors import UserError
from perf4sight.fingerprint.domain import outside_training_batches
from perf4sight.fingerprint.fit import LATENCY_COLUMN
from perf4sight.fingerprint.predict import BATCH_SEARCH_LIMIT
from perf4sight.ir.schema import NetworkDescription
from perf4sight.networks.on_request import PRUNABLE, LevelVariants, prunable_networks, pruned_as, variant_at
from perf4sight.profiling.results import batch_size_of, number
from perf4sight.report.data import shape_label
from perf4sight.report.render import Block, Heading, Image, Table, Text
from perf4sight.wording import plural

__all__ = ["PruningPoint", "LeastLevel", "pruning_points", "least_levels", "pruning_blocks", "print_pruning"]


@dataclass
class PruningPoint:
    """One device's prediction for one pruned variant at the section's batch size."""

    network: str            # the compare network that was pruned
    device: str
    level: float            # asked for, % of parameters removed
    achieved: float         # reached by the pruning
    batch_size: int
    latency_ms: float
    latency_ms_low: float
    latency_ms_high: float
    memory_mb: float
    memory_mb_low: float
    memory_mb_high: float
    fits: bool | None       # at batch_size; None where the device's capacity is unknown
    max_batch: int | None   # largest batch predicted to fit (capped at 1024); None: capacity unknown
    measured_status: str = ""                 # the device's row of this very variant at batch_size ("": none)
    measured_latency_ms: float | None = None  # its step time and memory, where it ran
    measured_memory_mb: float | None = None


@dataclass
class LeastLevel:
    """The least whole-percent pruning level predicted to fit one device at the section's batch size (what
    ``--prune-to-fit`` answers); ``level`` None where no level the network reaches fits."""

    network: str
    device: str
    batch_size: int
    level: int | None
    achieved: float | None = None
    latency_ms: float | None = None
    memory_mb: float | None = None
    searched_up_to: int | None = None  # the highest level asked about: 99, or what min_channels lets it reach
    error: str = ""  # why no level was searched for (the network cannot be pruned there): said in the notes too


def _measured(device: Any, desc: NetworkDescription, batch: int) -> dict[str, Any] | None:
    """The fields of ``PruningPoint`` that hold ``device``'s measurement of the dataset variant ``desc`` at
    ``batch`` (its current row: a stale one is not among ``device.rows``); None where it has none. Only the very
    variant counts: a device's own pruned networks of the family may have other widths at the same level
    (perf4sight's TX2 resnet18_90 keeps 7 stem channels, the l1-norm variant at 90% 20)."""
    shape = shape_label(desc.input_shape)
    rows = [r for r in device.rows if r["network"] == desc.name and batch_size_of(r) == batch
            and r.get("input_shape") == shape]
    if not rows:
        return None
    r, memory = rows[-1], device.fingerprint.metadata.get("memory_target", "peak_rss_mb")
    ok = r["status"] == "ok"
    return {"measured_status": r["status"], "measured_latency_ms": number(r.get(LATENCY_COLUMN)) if ok else None,
            "measured_memory_mb": number(r.get(memory)) if ok else None}


def pruning_points(cfg: Config, devices: Sequence[Any], trained_at: dict[str, tuple[int, ...]],
                   entries: Sequence[str], notes: list[str]) -> list[PruningPoint]:
    """Every device's prediction for every prunable network of ``entries`` at every ``[compare] pruning_levels``
    level; ``devices`` have ``name`` and ``fingerprint`` (``DeviceData``), ``trained_at`` maps a device to the
    input shape its variants are described at. A level a network cannot reach, and the variants pruned on
    request, are said in ``notes``."""
    levels, batch = sorted(cfg.compare.pruning_levels), cfg.compare.pruning_batch_size
    if not levels:
        return []
    points: list[PruningPoint] = []
    made: dict[str, list[str]] = {}  # "CxHxW" -> the variants pruned on request at that shape
    networks, refused = prunable_networks(cfg, entries)
    notes.extend(f"pruning section: {name} left out: only {PRUNABLE} is pruned there" for name in refused)
    for network in networks:
        for level in levels:
            for d in devices:
                try:
                    desc, pruned = variant_at(cfg, network, level, list(trained_at[d.name]))
                except UserError as exc:  # a level the network cannot reach under min_channels
                    notes.append(f"pruning section: {network} at {level:g}% left out ({exc})")
                    break  # the same at every shape
                p = d.fingerprint.predict(desc, [batch])[0]
                if pruned:
                    made.setdefault(shape_label(trained_at[d.name]), []).append(desc.name)
                row = None if pruned else _measured(d, desc, batch)
                points.append(PruningPoint(
                    network=network, device=d.name, level=level, achieved=desc.pruning_level, batch_size=batch,
                    latency_ms=p["latency_ms"], latency_ms_low=p["latency_ms_low"],
                    latency_ms_high=p["latency_ms_high"], memory_mb=p["memory_mb"], memory_mb_low=p["memory_mb_low"],
                    memory_mb_high=p["memory_mb_high"], fits=p.get("fits"),
                    max_batch=d.fingerprint.max_batch_size(desc), **(row or {})))
    for d in devices:  # a largest batch outside the batch sizes the device ran: an extrapolation
        beyond = [(f"{p.network}_l{p.level:g}", p.max_batch) for p in points
                  if p.device == d.name and outside_training_batches(d.fingerprint.metadata, p.max_batch)]
        if beyond:
            notes.append(f"pruning section: {d.name}: the largest batches of "
                         f"{', '.join(f'{v} ({batch_label(b)})' for v, b in beyond)} are outside its training rows' "
                         f"batch sizes {outside_training_batches(d.fingerprint.metadata, beyond[0][1])}: "
                         "extrapolations (expect larger errors)")
    if made:
        listed = "; ".join(f"at {shape}: {', '.join(dict.fromkeys(names))}" for shape, names in made.items())
        notes.append(f"pruning section: variants not in the dataset at a device's input shape pruned on request as "
                     f"the networks stage would ({pruned_as(cfg)}): {listed}")
    return points


def least_levels(cfg: Config, devices: Sequence[Any], trained_at: dict[str, tuple[int, ...]],
                 points: list[PruningPoint], notes: list[str]) -> list[LeastLevel]:
    """For each network of ``points`` and each device of known capacity, the least level predicted to fit at the
    section's batch size (:func:`perf4sight.fingerprint.pruning_search.least_pruning`: every level from 0 up)."""
    from perf4sight.fingerprint.pruning_search import least_pruning

    out = []
    made: set[str] = set()  # "<variant> at <shape>", pruned on request by the searches
    batch = points[0].batch_size if points else 0
    for network in dict.fromkeys(p.network for p in points):
        for d in devices:
            if d.fingerprint.capacity_mb is None:
                continue
            variant = LevelVariants(cfg, network, trained_at[d.name])
            try:
                r = least_pruning(d.fingerprint, variant, batch)
            except UserError as exc:  # pruning_points has said it of the levels asked
                notes.append(f"pruning section: no least level that fits for {network} on {d.name} ({exc})")
                out.append(LeastLevel(network, d.name, batch, None, error=str(exc)))  # not 'unknown capacity'
                continue
            finally:
                made.update(f"{name} at {shape_label(variant.shape)}" for name in variant.pruned)
            p = r.prediction or {}
            out.append(LeastLevel(network, d.name, batch, r.level, None if r.variant is None else
                                  r.variant.pruning_level, p.get("latency_ms"), p.get("memory_mb"),
                                  max(r.tried, default=None)))
    if made:
        notes.append(f"pruning section: the search for the least level that fits asked about "
                     f"{plural(len(made), 'variant')} not in the dataset, pruned on request likewise")
    return out


def batch_label(mb: int) -> str:
    """A largest batch as shown: ``1024+`` where every batch searched fits (as predict's ``--max-batch-size``)."""
    return f"{mb}+" if mb >= BATCH_SEARCH_LIMIT else str(mb)


def _pruning_cell(p: PruningPoint | None) -> str:
    if p is None:
        return "–"
    fits = ", does not fit" if p.fits is False else ""
    largest = "unknown capacity" if p.max_batch is None else f"largest batch {batch_label(p.max_batch)}"
    measured = ""
    if p.measured_status:
        measured = (f"; measured {p.measured_latency_ms:,.1f} ms, {p.measured_memory_mb:,.0f} MiB"
                    if p.measured_latency_ms is not None and p.measured_memory_mb is not None
                    else f"; measured: {p.measured_status}")
    return (f"{p.latency_ms:,.1f} ms [{p.latency_ms_low:,.1f}, {p.latency_ms_high:,.1f}], {p.memory_mb:,.0f} MiB"
            f"{fits}; {largest}{measured}")


def _pruning_rows(points: list[PruningPoint], devices: list[str]) -> list[tuple[str, float, list[PruningPoint | None]]]:
    """(network, level, the point of each device or None) for every network and level, in order."""
    at = {(p.network, p.level, p.device): p for p in points}
    keys = list(dict.fromkeys((p.network, p.level) for p in points))
    return [(net, level, [at.get((net, level, d)) for d in devices]) for net, level in keys]


def _achieved(cells: list[PruningPoint | None]) -> str:
    """The share of parameters removed, once where every device's variant reached the same."""
    reached = sorted({round(p.achieved, 1) for p in cells if p is not None})
    return "–".join(f"{r:.1f}" for r in (reached[:1] if len(reached) == 1 else [reached[0], reached[-1]]))


def _least_cell(found: LeastLevel | None) -> str:
    if found is None:
        return "unknown capacity"
    if found.error:
        return "not searched (Notes)"
    if found.level is None:  # up to the highest level the network reaches (min_channels may stop it short of 99)
        return f"none up to {99 if found.searched_up_to is None else found.searched_up_to}%"
    return f"{found.level}% ({found.latency_ms:,.1f} ms, {found.memory_mb:,.0f} MiB)"


def pruning_blocks(points: list[PruningPoint], least: list[LeastLevel], devices: list[str],
                   images: dict[str, Path]) -> list[Block]:
    """Step time, memory and the largest batch against the pruning level, per network and device."""
    if not points:
        return []
    batch = points[0].batch_size
    b: list[Block] = [Heading("Pruning: step time and the largest batch against the pruning level")]
    b.append(Text(f"How far a network must be pruned to train on each device at batch size {batch}, and what a step "
                  "then costs: each network pruned at the levels of [compare] pruning_levels as the networks stage "
                  "prunes, described at each device's input shape and predicted by each device's fingerprint. Crosses "
                  "are the device's measurements of that very variant where it has them (rows the fingerprint was "
                  "trained on); a device's own pruned networks of another pruning method are not drawn, since they "
                  "may keep other widths at the same share of parameters removed."))
    b.append(Image(images["pruning"], f"predicted step time and memory at batch {batch}, and the largest batch "
                                      "predicted to fit, against the share of parameters removed"))
    b.append(Table(["network", "level %", "removed %"] + list(devices),
                   [[net, f"{level:g}", _achieved(cells)] + [_pruning_cell(c) for c in cells]
                    for net, level, cells in _pruning_rows(points, devices)],
                   f"predicted at batch {batch} (90% interval); largest batch: every batch 1..b predicted to fit "
                   f"({BATCH_SEARCH_LIMIT}+: every batch searched fits)"))
    if least:
        at = {(x.network, x.device): x for x in least}
        b.append(Table(["network"] + list(devices),
                       [[net] + [_least_cell(at.get((net, d))) for d in devices]
                        for net in dict.fromkeys(x.network for x in least)],
                       f"the least pruning level predicted to fit at batch {batch} (whole percents, what "
                       "--prune-to-fit answers), with the step time and memory there"))
    return b


def print_pruning(console: Console, points: list[PruningPoint], least: list[LeastLevel],
                  devices: list[str]) -> None:
    """The pruning section in short: step time and largest batch per network, level and device."""
    if not points:
        return
    t = RichTable(title=f"pruned: step time at batch {points[0].batch_size} (ms) / largest batch")
    for col in ("network", "level %", "removed %"):
        t.add_column(col, no_wrap=True)
    for n in devices:
        t.add_column(RichText(n), justify="right", no_wrap=True)  # a device's [brackets] are no markup
    for net, level, cells in _pruning_rows(points, devices):
        t.add_row(RichText(net), f"{level:g}", _achieved(cells),  # Text: a name's [brackets] are no markup
                  *["–" if c is None else f"{c.latency_ms:,.1f}{'' if c.fits is not False else ' (no fit)'} / "
                    f"{'?' if c.max_batch is None else batch_label(c.max_batch)}" for c in cells])
    at = {(x.network, x.device): x for x in least}

    def least_fit(found: LeastLevel | None) -> str:  # ?: capacity unknown; –: not searched (the notes say why)
        return "?" if found is None else "–" if found.error else "none" if found.level is None else f"{found.level}%"
    for net in dict.fromkeys(x.network for x in least):
        t.add_row(RichText(net), "least fit", "", *[least_fit(at.get((net, d))) for d in devices])
    console.print(t)
