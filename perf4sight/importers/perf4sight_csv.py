"""Import perf4sight's ``-gt.csv`` measurements (and its graphs) into the tidy schema.

Source layout (see ``shared/data/tx2-perf4sight/README.md``)::

    <source>/profiling_csvs/<board>/<dataset>/memory/<net>_<level>-gt.csv    '|'-separated, MiB
    <source>/profiling_csvs/<board>/<dataset>/latency/<net>_<level>-gt.csv   '|'-separated, ms
    <source>/graphs/<net>_<level>.json                                       network descriptions

One board's measurements on one dataset per import: a source holding several ``<board>/<dataset>/`` folders is
refused (one device's rows would mix them); ``--source`` may then name one of them, ``profiling_csvs/<board>`` or
``profiling_csvs/<board>/<dataset>``, its graphs read from the ``graphs/`` beside that ``profiling_csvs/``.

One tidy row per (network variant, batch size): the memory and latency files merge into it
(``device_mem_used_mb`` = ``mem_used``, ``torch_alloc_peak_mb`` = ``mem_alloc``,
``torch_reserved_peak_mb`` = ``mem_reserved``, ``latency_ms_median`` = ``latency_ms_mean`` =
``latency``, the mean of 3 timed steps: protocol ``perf4sight_mean3``). A pair present in only
one file still gets a row with the other figures empty. ``passed=False`` in every file that has
the pair -> status ``oom``; repeated runs of a pair are kept once (figures averaged over the
runs that passed). Re-importing skips rows already on disk.
"""
from __future__ import annotations

import collections
import csv
import datetime as _dt
import json
import math
import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from perf4sight.errors import UserError
from perf4sight.features.optimizers import PERF4SIGHT_MOMENTUM, PERF4SIGHT_WEIGHT_DECAY
from perf4sight.ir.schema import NetworkDescription, is_file_stem, load_description, save_description
from perf4sight.ir.shapes import shape_text
from perf4sight.profiling.plan import DEFAULT_LOSS, update_columns
from perf4sight.profiling.results import append_row, file_sha, number, read_rows, results_path, row_key
from perf4sight.wording import plural, shell_word

__all__ = ["ImportSummary", "check_backends", "check_descriptions", "check_device_models", "check_device_name",
           "description_identity", "import_perf4sight", "mark_thrashing", "read_gt_csv", "rows_on_disk",
           "source_kind", "PROTOCOL", "THRASH_RATIO"]

#: The ``protocol`` cell of an imported row: perf4sight's profiler (latency the mean of 3 timed steps; memory
#: read as ``features/allocator.py``'s ``perf4sight`` replay protocol describes).
PROTOCOL = "perf4sight_mean3"
#: The ``momentum`` and ``weight_decay`` cells of an imported row: perf4sight's profiler's SGD
#: (``features.optimizers.PERF4SIGHT_MOMENTUM``, ``PERF4SIGHT_WEIGHT_DECAY``).
UPDATE = update_columns("sgd", PERF4SIGHT_MOMENTUM, PERF4SIGHT_WEIGHT_DECAY)
#: The ``loss`` cell of an imported row: perf4sight's profiler trained its classifiers with a cross entropy.
LOSS = DEFAULT_LOSS

#: A step whose time per sample is more than this many times that of the network's next smaller batch size that
#: ran is thrashing (unified memory swapped out and back in, zram on a Jetson): recorded as ``oom``, as this tool's
#: own profiler records a step that swapped more than ``[profile] max_swap_in_mb`` back in. perf4sight's data has
#: no swap counters, so the jump in step time is what shows it (a larger batch costs less per sample, not more).
THRASH_RATIO = 2.0

_NAME = re.compile(r"^(?P<net>.+)_(?P<level>\d+(?:\.\d+)?)-gt\.csv$")
_DATASET_SHAPES = {"imagenet": (3, 224, 224), "cifar10": (3, 32, 32), "cifar100": (3, 32, 32)}


@dataclass
class ImportSummary:
    """What an import did: counts of rows and descriptions, where they went."""

    device: str
    rows_written: int = 0
    rows_skipped_existing: int = 0
    ok: int = 0
    oom: int = 0
    error: int = 0  # rows of runs that failed otherwise than out of memory
    duplicates_merged: int = 0
    descriptions: int = 0
    networks: list[str] = field(default_factory=list)
    without_graph: list[str] = field(default_factory=list)  # networks whose rows came without a description
    thrashing: list[str] = field(default_factory=list)  # "network at batch b": rows recorded as oom (THRASH_RATIO)
    rows_differing: int = 0  # rows already on disk whose figures the source now gives otherwise (kept as on disk)
    renamed: list[str] = field(default_factory=list)  # "file: name -> variant": graphs named otherwise than their file
    without_phase: list[str] = field(default_factory=list)  # PerfSeer label files with none of the phases imported
    no_latency: int = 0  # ok rows written without a step time (the latency file lacks the batch size, or it failed)
    no_memory: int = 0  # ok rows written without a memory figure
    kind_missing: dict[str, list[str]] = field(default_factory=dict)  # "memory"/"latency" -> networks with no row of it
    without_rows: list[str] = field(default_factory=list)  # networks of files with no row in either kind
    results_path: str = ""
    models_path: str = ""

    def write_new(self, out: Path, row: dict[str, Any], done: dict[tuple, dict[str, Any]]) -> bool:
        """Append ``row`` to ``out`` unless its key is in ``done`` (key -> the row already on disk,
        :func:`rows_on_disk`); count either way, and count a row on disk whose status or figures differ from
        ``row``'s (the source changed since it was imported: the row on disk is kept)."""
        key = row_key(row, with_sha=False)
        if key in done:
            self.rows_skipped_existing += 1
            self.rows_differing += _differs(done[key], row)
            return False
        append_row(out, row)
        done[key] = row
        self.rows_written += 1
        if row.get("status") == "ok":  # a figure the source lacks: its step time, or its memory in either column
            self.no_latency += number(row.get("latency_ms_median")) is None
            self.no_memory += all(number(row.get(col)) is None for col in ("device_mem_used_mb", "peak_rss_mb"))
        return True


#: The cells of an imported row compared with the row on disk when it is imported again.
_COMPARED = ("status", "device_mem_used_mb", "torch_alloc_peak_mb", "torch_reserved_peak_mb", "latency_ms_median")


def _differs(on_disk: dict[str, Any], row: dict[str, Any]) -> bool:
    """Whether ``row`` says something else than the row on disk of the same key: numbers compared as numbers
    (``8`` is ``8.0``), anything else (a status, an empty cell) as text."""
    for col in _COMPARED:
        a, b = on_disk.get(col, ""), row.get(col, "")
        x, y = number(a, finite=False), number(b, finite=False)
        if x is not None and y is not None:
            if x != y:
                return True
        elif str(a or "") != str(b or ""):
            return True
    return False


def rows_on_disk(rows: list[dict[str, Any]]) -> dict[tuple, dict[str, Any]]:
    """The rows already on disk by import key (:func:`row_key` without the sha), for
    :meth:`ImportSummary.write_new`."""
    return {row_key(r, with_sha=False): r for r in rows}


def description_identity(desc: NetworkDescription, ignored: tuple[str, ...] = ("source",)) -> str:
    """``desc`` as JSON less the keys ``ignored``: by default its ``source`` note, which names the file it was read
    from, so that two files of one network compare equal."""
    d = desc.to_dict()
    for key in ignored:
        d.pop(key, None)
    return json.dumps(d, sort_keys=True)


#: What may differ between an import's description of a network and an earlier import's of the same one: the file it
#: was read from, and its name (an earlier version kept a graph's own name where it differed from its file's).
_NAME_AND_SOURCE = ("name", "source")


def check_descriptions(out_models: Path, descs: list[NetworkDescription], existing_rows: list[dict[str, Any]],
                       device: str) -> None:
    """``UserError`` (before anything is written) where a network with rows of ``device`` on disk comes in another
    description than the one imported with them (``<out_models>/<name>.json``): writing it would tie those rows to
    a network they were not measured on."""
    measured = collections.Counter(str(r["network"]) for r in existing_rows)
    for desc in descs:
        path = out_models / f"{desc.name}.json"
        if desc.name not in measured or not path.is_file():
            continue
        try:
            before = load_description(path)
        except UserError:
            continue  # not readable: nothing to keep, it is written anew
        if description_identity(before, _NAME_AND_SOURCE) != description_identity(desc, _NAME_AND_SOURCE):
            raise UserError(f"import: the source's description of {desc.name} differs from the one imported before "
                            f"({path}), which its {plural(measured[desc.name], 'row')} of device '{device}' were "
                            "measured on: import under another --device name, or remove those rows and that file "
                            "first; nothing written")


def source_kind(row: dict[str, Any]) -> str:
    """What made a row: its backend, and for an imported row also the tool whose data it came from (its protocol,
    e.g. ``imported (perfseer)``): two tools' data of one device cannot be told apart once mixed either."""
    backend = str(row.get("backend") or "")
    return f"{backend} ({row.get('protocol') or '?'})" if backend == "imported" else backend


def check_backends(out: Path, device: str, existing_rows: list[dict[str, Any]], incoming: set[str],
                   hint: str = "") -> None:
    """``UserError`` (before anything is written) unless every row of ``device``, those in ``out`` and those an
    import brings (their kinds, ``incoming``: :func:`source_kind`), comes from one backend, or one tool's import: a
    fingerprint is fitted on one kind of device, and rows of two cannot be told apart afterwards. ``hint``: what to
    do when the source itself brings rows of several kinds, where the caller knows better than the general advice."""
    have = {source_kind(r) for r in existing_rows} - {""}
    if len(have | incoming) < 2:
        return
    if have - incoming or len(have) > 1:
        what = f"{out} holds {'/'.join(sorted(have))} rows and the source brings {'/'.join(sorted(incoming))} rows"
        hint = "import under another --device name"
    else:
        what = f"the source brings rows of {len(incoming)} backends ({'/'.join(sorted(incoming))})"
        hint = hint or "import each backend's rows on their own, under its own --device name"
    raise UserError(f"import: {what} for device '{device}'; one device's rows come from one backend (or one tool's "
                    f"data): {hint}; nothing written")


def check_device_models(out: Path, existing_rows: list[dict[str, Any]], incoming: set[str]) -> None:
    """``UserError`` (before anything is written) where an import brings rows measured on another device model (their
    ``device_model``: perf4sight's board, or the model an exported row recorded) than every one of the device's rows
    on disk: a perf4sight source of two boards is refused (:func:`_one_folder`), and one board at a time into one
    device mixed them all the same, unsaid (as did two devices' PerfSeer exports, each one's rows of one backend).
    Rows without a model (a foreign PerfSeer dataset's) are not compared."""
    have = {str(r.get("device_model") or "") for r in existing_rows} - {""}
    new = sorted(set(incoming) - {""} - have)
    if have and new:
        raise UserError(f"import: {out} holds rows measured on {' and '.join(sorted(have))} and the source's were "
                        f"measured on {' and '.join(new)} (column device_model), which one device's rows cannot mix: "
                        "import them under another --device name; nothing written")


def import_source(source_dir: str | Path, device: str, tool: str) -> Path:
    """The folder to import from; ``UserError`` if it is missing or ``device`` cannot name a folder."""
    source = Path(source_dir)
    if source.exists() and not source.is_dir():
        raise UserError(f"{source}: is a file, not a folder: --source takes the folder of the {tool} data")
    if not source.is_dir():
        raise UserError(f"{source}: {tool} source folder not found (looked for {source.resolve()})")
    check_device_name(device)
    return source


def check_device_name(device: str) -> None:
    """``UserError`` where ``device`` cannot name the device's folders (under the measurements and models folders)."""
    if not is_file_stem(device):
        raise UserError(f"import: device name {device!r} cannot name a folder (no path separators, no leading '.', "
                        "no surrounding spaces)")


#: The figure each kind of ``-gt.csv`` file must carry (a number wherever ``passed`` is True).
TARGET = {"memory": "mem_used", "latency": "latency"}
#: The figures of each kind of file that become a row's cells (:func:`_merge`), its :data:`TARGET` first.
FIGURES = {"memory": ("mem_used", "mem_alloc", "mem_reserved"), "latency": ("latency",)}


def read_gt_csv(path: Path, kind: str | None = None) -> list[dict[str, str]]:
    """Rows of one perf4sight ``-gt.csv`` file ('|'-separated, one header line); with ``kind`` (memory or
    latency) its figure (:data:`TARGET`) must be a column, and a number on every passed row; that and the other
    figures it brings (:data:`FIGURES`; any other text there is no measurement) finite and >= 0, as a row's
    number cells are (``results.read_rows``)."""
    try:
        with path.open(newline="", encoding="utf-8-sig") as fh:  # a byte-order mark is not part of the first column
            reader = csv.DictReader(fh, delimiter="|")
            rows, header = list(reader), reader.fieldnames or []
    except (OSError, UnicodeDecodeError, csv.Error) as exc:
        raise UserError(f"{path}: cannot read perf4sight CSV ({exc})") from None
    need = {"passed", "bs"} | ({TARGET[kind]} if kind else set())
    if rows and not need <= set(rows[0]):
        raise UserError(f"{path}: not a perf4sight -gt.csv file (columns {sorted(rows[0])}, need {sorted(need)})")
    for i, r in enumerate(rows, start=2):
        if None in r or None in r.values():  # csv: a short line's missing cells are None, a long one's extras r[None]
            fields = sum(v is not None for k, v in r.items() if k is not None) + len(r.get(None) or [])
            raise UserError(f"{path}: line {i}: {fields} fields where the header has {len(header)}")
        passed = _passed(r)
        if passed is None:
            raise UserError(f"{path}: line {i}: passed {r['passed']!r} is neither True nor False")
        if not (kind and passed):
            continue
        target = number(r.get(TARGET[kind]), finite=False)
        if target is None:
            raise UserError(f"{path}: line {i}: {TARGET[kind]} {r.get(TARGET[kind])!r} is not a number")
        for col in FIGURES[kind]:  # the target and the figures beside it (other text there: not measured)
            figure = number(r.get(col), finite=False)
            if figure is not None and not 0 <= figure < math.inf:
                raise UserError(f"{path}: line {i}: {col} {r.get(col)!r} is not a finite number >= 0, as a "
                                "measurement is")
        capacity = number(r.get("capacity"))  # MemTotal: no step uses more than the device has
        if kind == "memory" and capacity and target > capacity:
            raise UserError(f"{path}: line {i}: mem_used {target:g} MiB is more than the device's capacity "
                            f"({capacity:g} MiB)")
    return rows


def _csv_folders(csv_root: Path) -> list[Path]:
    """The folders holding ``memory/`` or ``latency/`` ``*-gt.csv`` files, at most three folders below ``csv_root``
    (perf4sight's ``profiling_csvs/<board>/<dataset>/<kind>/``, or a folder on the way down): a source given by
    mistake, a home folder or ``/tmp``, is not walked to the bottom."""
    found = {p.parent.parent for depth in (1, 2, 3) for p in csv_root.glob("*/" * depth + "*-gt.csv")
             if p.parent.name in ("memory", "latency")}
    return sorted(found)


def _one_folder(source: Path, csv_root: Path, folders: list[Path]) -> Path:
    """The one ``<board>/<dataset>/`` folder of the source; ``UserError`` naming them when there are several: their
    rows were keyed by (network, batch size) only, so two boards' runs were averaged as repeated runs of one."""
    if len(folders) == 1:
        return folders[0]
    names = [f.relative_to(csv_root).as_posix() for f in folders]
    # a folder holding no other one: a --source that reads it alone
    leaf = next(f for f in folders if not any(f in g.parents for g in folders))
    graphs = _graphs_dir(leaf)
    how = (f"import one at a time, e.g. --source {shell_word(leaf)} (graphs read from {graphs})" if graphs.is_dir() else
           "import one at a time, each from a folder holding graphs/ and its profiling_csvs/<board>/<dataset>/")
    raise UserError(f"{source}: holds perf4sight measurements of {len(folders)} board/dataset folders "
                    f"({', '.join(names)}), which one device's rows cannot mix: {how}; nothing written")


def _board_and_dataset(folder: Path, csv_root: Path) -> tuple[str, str]:
    """(board, dataset) of the folder holding ``memory/`` and ``latency/``: perf4sight's ``<board>/<dataset>/``
    two levels below ``csv_root``, whatever the dataset's name; one level below, a board's own folder
    (``profiling_csvs/nano/memory/``, dataset '') unless it is named for a dataset this tool knows; ``csv_root``
    itself, given as the source, a dataset folder whose parent names the board, or that board's own folder where its
    parent is ``profiling_csvs/`` (``--source profiling_csvs/nano``: the board read 'profiling_csvs' before)."""
    depth = len(folder.relative_to(csv_root).parts)
    folder = Path(os.path.abspath(folder))  # --source . names its folder too
    if folder.name not in _DATASET_SHAPES and (depth == 1 or depth == 0 and folder.parent.name == "profiling_csvs"):
        return folder.name, ""
    return folder.parent.name, folder.name


def _collect(folder: Path, kind: str, pairs: dict, variants: dict, csv_root: Path) -> None:
    """Add the rows of every ``<folder>/<kind>/*-gt.csv`` to ``pairs[(variant, bs)][kind]``."""
    board, dataset = _board_and_dataset(folder, csv_root)
    for f in sorted((folder / kind).glob("*-gt.csv")):
        m = _NAME.match(f.name)
        if not m:
            raise UserError(f"{f}: file name is not <network>_<level>-gt.csv")
        variant = f.name[: -len("-gt.csv")]
        variants[variant] = (m["net"], float(m["level"]), dataset, board)
        for i, r in enumerate(read_gt_csv(f, kind), start=2):
            bs = number(r.get("bs"))
            if bs is None or bs < 1 or bs != int(bs):  # None when infinite too: int() could not take it
                raise UserError(f"{f}: line {i}: bad batch size {r.get('bs')!r}")
            pairs.setdefault((variant, int(bs)), {"memory": [], "latency": []})[kind].append(r)


def _mean(rows: list[dict[str, str]], col: str) -> float | None:
    """Mean of ``col`` over ``rows`` (finite: :func:`read_gt_csv` refused any other number), None if none."""
    vals = [v for v in (number(r.get(col)) for r in rows) if v is not None]
    return sum(vals) / len(vals) if vals else None


#: The spellings of a ``passed`` cell (perf4sight writes ``True``/``False``): any other value is refused with its line.
_PASSED = {"true": True, "1": True, "yes": True, "false": False, "0": False, "no": False}


def _passed(r: dict[str, str]) -> bool | None:
    """A row's ``passed`` cell; None for a spelling of neither (which :func:`read_gt_csv` refuses)."""
    return _PASSED.get(str(r.get("passed", "")).strip().lower())


def _merge(mem: list[dict[str, str]], lat: list[dict[str, str]]) -> tuple[str, str, dict[str, Any]]:
    """(status, message, figures) for one (variant, bs) from its memory and latency rows."""
    mem_ok = [r for r in mem if _passed(r)]
    lat_ok = [r for r in lat if _passed(r)]
    figures: dict[str, Any] = {}
    if mem_ok:
        figures["device_mem_used_mb"] = _mean(mem_ok, "mem_used")
        figures["torch_alloc_peak_mb"] = _mean(mem_ok, "mem_alloc")
        figures["torch_reserved_peak_mb"] = _mean(mem_ok, "mem_reserved")
    if lat_ok:
        lat_ms = _mean(lat_ok, "latency")
        figures.update(latency_ms_median=lat_ms, latency_ms_mean=lat_ms, timed_steps=3 * len(lat_ok), warmup_steps=1)
    notes = []
    if len(mem) > 1 or len(lat) > 1:
        notes.append(f"repeated runs merged (memory {len(mem)}, latency {len(lat)})")
    if not mem:
        notes.append("no memory measurement")
    if not lat:
        notes.append("no latency measurement")
    if mem and not mem_ok and lat_ok:
        notes.append("memory run failed (passed=False), latency run passed")
    if lat and not lat_ok and mem_ok:
        notes.append("latency run failed (passed=False), memory run passed")
    if not mem_ok and not lat_ok:
        return "oom", "; ".join(["passed=False in perf4sight run (out of memory)"] + notes), {}
    return "ok", "; ".join(notes), figures


def _graphs_dir(source: Path) -> Path:
    """``<source>/graphs``; for a source inside a ``profiling_csvs/`` folder (one board's or one dataset's folder of
    it) without a ``graphs/`` of its own, the ``graphs/`` beside that ``profiling_csvs/``."""
    if not (source / "graphs").is_dir():
        for up in source.absolute().parents:
            if up.name == "profiling_csvs" and (up.parent / "graphs").is_dir():
                return up.parent / "graphs"
    return source / "graphs"


def _find_graphs(source: Path, variants: dict[str, tuple]) -> dict[str, Path | None]:
    """Each variant's graph (``<graphs>/<variant>.json``, :func:`_graphs_dir`; None where missing); ``UserError``
    when no variant has one: ``source`` is not the folder that holds the graphs (e.g. its ``profiling_csvs/``)."""
    folder = _graphs_dir(source)
    graphs = {variant: folder / f"{variant}.json" for variant in variants}
    graphs = {variant: path if path.is_file() else None for variant, path in graphs.items()}
    if variants and not any(graphs.values()):
        hint = (f" (here: --source {shell_word(source.parent)})" if source.name == "profiling_csvs"
                and (source.parent / "graphs").is_dir() else "")
        raise UserError(f"{source}: no graphs found for {'the' if len(variants) == 1 else 'any of the'} "
                        f"{plural(len(variants), 'network')} read: looked for "
                        f"{folder}/<network>.json; --source should be the folder that holds both "
                        f"profiling_csvs/ and graphs/{hint}")
    return graphs


def mark_thrashing(rows: list[dict[str, Any]], ratio: float = THRASH_RATIO) -> list[str]:
    """Record as ``oom`` each ``ok`` row whose step time per sample is more than ``ratio`` times that of the
    same network's next smaller batch size that ran without thrashing (its figures are kept, its message says
    why); returns "network at batch b" for each. ``ratio`` 0: none is marked."""
    marked: list[str] = []
    if ratio <= 0:
        return marked
    last: dict[str, tuple[int, float]] = {}  # network -> (batch size, ms per sample) of the last sound row
    for r in sorted(rows, key=lambda r: (str(r["network"]), int(r["batch_size"]))):
        ms = number(r.get("latency_ms_median"))
        if r["status"] != "ok" or not ms:
            continue
        per_sample, before = ms / int(r["batch_size"]), last.get(str(r["network"]))
        if before and per_sample > ratio * before[1]:
            r["status"] = "oom"
            r["message"] = "; ".join(m for m in (
                f"thrashing: {per_sample / before[1]:.1f}x the step time per sample of batch {before[0]} (more than "
                f"{ratio:g}x: memory swapped out and back in; this tool's profiler records such a step as oom)",
                r.get("message", "")) if m)
            marked.append(f"{r['network']} at batch {r['batch_size']}")
        else:
            last[str(r["network"])] = (int(r["batch_size"]), per_sample)
    return marked


def import_perf4sight(source_dir: str | Path, device: str, profiling_dir: str | Path,
                      models_dir: str | Path, thrash_ratio: float = THRASH_RATIO) -> ImportSummary:
    """Import a perf4sight data folder as measurements of ``device``.

    Writes tidy rows (backend ``imported``) to ``results_path(profiling_dir, device)`` and copies
    each graph to ``<models_dir>/imported/<device>/<variant>.json``. Rows already on disk (same
    key) are skipped, so importing twice is harmless. A step that thrashed (:data:`THRASH_RATIO`,
    :func:`mark_thrashing`; ``thrash_ratio`` 0 keeps every passed row ``ok``) is recorded as ``oom``.
    Raises ``UserError`` when the folder has no ``-gt.csv`` files, those of several ``<board>/<dataset>/``
    folders, no graph of any network read (nothing is written then) or a malformed graph.
    """
    source = import_source(source_dir, device, "perf4sight")
    csv_root = source / "profiling_csvs" if (source / "profiling_csvs").is_dir() else source
    folders = _csv_folders(csv_root)
    if not folders:
        raise UserError(f"{source}: no perf4sight memory/ or latency/ *-gt.csv files found (looked up to three "
                        f"folders down, as in {csv_root}/<board>/<dataset>/memory/); --source should be the folder "
                        "that holds both profiling_csvs/ and graphs/")
    folder = _one_folder(source, csv_root, folders)  # before anything is read or written
    pairs: dict[tuple[str, int], dict[str, list]] = {}
    variants: dict[str, tuple[str, float, str, str]] = {}
    _collect(folder, "memory", pairs, variants, csv_root)
    _collect(folder, "latency", pairs, variants, csv_root)
    if not pairs:  # every file empty or cut short before its first row: an empty device folder was made
        raise UserError(f"{folder}: no row in any of its -gt.csv files ({plural(len(variants), 'network')} read, "
                        "every memory/ and latency/ file empty or cut short before its first row): nothing imported")

    out_models = Path(models_dir) / "imported" / device
    out = results_path(profiling_dir, device)
    summary = ImportSummary(device=device, results_path=str(out), models_path=str(out_models))
    graphs = _find_graphs(source, variants)  # before anything is written
    existing = read_rows(out)
    check_backends(out, device, existing, {f"imported ({PROTOCOL})"})
    check_device_models(out, existing, {_board_and_dataset(folder, csv_root)[0]})
    descs: dict[str, NetworkDescription] = {}  # every graph read and checked before the first file is written
    for variant, graph in sorted(graphs.items()):
        if graph is None:
            continue
        desc = load_description(graph)
        if desc.name != variant:  # the file's name is what ties a graph to its CSV files
            summary.renamed.append(f"{graph.name}: {desc.name} -> {variant}")
            desc.name = variant
        desc.extra.setdefault("source", f"perf4sight import: {graph.name}")
        descs[variant] = desc
    check_descriptions(out_models, list(descs.values()), existing, device)
    info: dict[str, tuple[str, str]] = {}  # variant -> (input shape, description sha)
    for variant, (net, level, dataset, _board) in sorted(variants.items()):
        shape = _DATASET_SHAPES.get(dataset)
        if variant in descs:
            desc = descs[variant]
            shape = tuple(desc.input_shape)
            info[variant] = (shape_text(shape), file_sha(desc.to_json().encode()))  # of the file written below
        elif shape is None:  # no row without its input shape
            raise UserError(f"{source}: no graph for {variant}, and no dataset folder ({', '.join(_DATASET_SHAPES)}, "
                            "as in <board>/<dataset>/memory/) tells its input shape: put its graph in the source's "
                            "graphs/ folder")
        else:
            info[variant] = (shape_text(shape), "")
            summary.without_graph.append(variant)
    for variant, desc in descs.items():
        save_description(desc, out_models / f"{variant}.json")
    summary.descriptions = len(descs)

    done = rows_on_disk(existing)
    stamp = _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds")
    rows, repeated = [], set()
    for (variant, bs), files in sorted(pairs.items(), key=lambda kv: (kv[0][0], kv[0][1])):
        net, level, _, board = variants[variant]
        status, message, figures = _merge(files["memory"], files["latency"])
        rows.append({
            "device": device, "backend": "imported", "network": variant, "family": net,
            "pruning_level": level if level != int(level) else int(level), "batch_size": bs,
            "input_shape": info[variant][0], "phase": "train", "status": status, "message": message,
            "protocol": PROTOCOL, "device_model": board, "hostname": "", "timestamp": stamp,
            "description_sha": info[variant][1], "loss": LOSS, **UPDATE,
            **figures,
        })
        if len(files["memory"]) > 1 or len(files["latency"]) > 1:
            repeated.add((variant, bs))
    thrashing = set(mark_thrashing(rows, thrash_ratio))
    for row in rows:
        if not summary.write_new(out, row, done):
            continue
        summary.ok += row["status"] == "ok"
        summary.oom += row["status"] == "oom"
        summary.duplicates_merged += (row["network"], row["batch_size"]) in repeated
        label = f"{row['network']} at batch {row['batch_size']}"  # as mark_thrashing names it
        if label in thrashing:
            summary.thrashing.append(label)
    summary.networks = sorted(variants)
    with_rows = {v for v, _ in pairs}  # the networks of the source's rows, worked out once for both kinds
    summary.without_rows = sorted(set(variants) - with_rows)  # both its files empty: said, not passed over
    summary.without_graph = [v for v in summary.without_graph if v in with_rows]  # "the rows were imported": some
    for kind in ("memory", "latency"):  # a file missing, empty or cut short before its first row
        missing = sorted(with_rows - {v for (v, _), files in pairs.items() if files[kind]})
        if missing:
            summary.kind_missing[kind] = missing
    return summary

