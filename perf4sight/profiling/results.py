"""The tidy measurement schema shared by every device, backend and importer.

One row per (device, network variant, batch size, input shape, phase, loss, description): a description
that changes under the same name is a new network, measured again; its earlier rows stay on
disk, marked by their ``description_sha``, and the host passes over them. An ``oom`` a lower
memory_limit_mb caused is measured again under a higher one, and an ``error`` with ``retry_errors``: the
new row is appended under the same key, and of two rows of one key the later counts (:func:`latest_rows`).
Rows are appended and flushed one at a time, so a crash loses at most the measurement in flight. Uses only
the standard library (and ``perf4sight.errors``, ``perf4sight.files``): this module runs on the devices too.

Units: times in milliseconds, memory in MiB (2**20 bytes), power in watts.
"""
import csv
import hashlib
import io
import math
import os
from pathlib import Path
from typing import Any, BinaryIO, Callable, Dict, Iterable, List, Optional, Set, Tuple, Union

from perf4sight.errors import UserError
from perf4sight.files import atomic_path, naming_file

__all__ = ["COLUMNS", "STATUSES", "append_row", "upgrade_file", "read_rows", "measured_keys", "row_key", "results_path",
           "references_path", "REFERENCES_CSV", "SUPERSEDED_CSV", "op_prices_path", "OP_PRICES_JSON", "file_sha",
           "split_stale", "number",
           "batch_size_of", "latest_rows",
           "phase_of", "loss_of", "under_load", "LOAD_MARGIN", "take_rows", "written_key"]

#: Column order of every measurement CSV. Empty string = not measured / not applicable.
COLUMNS: List[str] = [
    "device",                 # device name from the config
    "backend",                # cpu | nvml | jetson | imported
    "network",                # description name (variant), e.g. resnet18_l30
    "family",                 # the network it derives from, e.g. resnet18
    "pruning_level",          # % of parameters removed (0 = unpruned)
    "batch_size",             # images per step
    "input_shape",            # CxHxW, e.g. 3x64x64
    "phase",                  # train (one SGD step: forward, loss, zero_grad, backward, step)
    "status",                 # ok | oom | skipped_after_oom | error
    "message",                # why, when status is not ok
    "latency_ms_median",      # median step time over the timed steps
    "latency_ms_mean",
    "latency_ms_p10",
    "latency_ms_p90",
    "latency_ms_std",
    "timed_steps",
    "warmup_steps",
    "protocol",               # how the step was timed, e.g. perf_counter, cuda_events, perf4sight_mean3
    "repeats",                # fresh processes that measured this configuration; the row is their median one
    "latency_ms_repeat_cv",   # spread of the repeats' step-time medians: std / mean, in % (repeats > 1)
    "peak_rss_mb",            # peak resident set size of the measuring process (os.wait4 ru_maxrss)
    "baseline_rss_mb",        # RSS after imports, model build and optimiser creation, before the first step
    "torch_alloc_peak_mb",    # torch allocator peak allocated (GPU backends)
    "torch_reserved_peak_mb", # torch allocator peak reserved (GPU backends)
    "device_mem_used_mb",     # device memory in use incl. context (nvml) / unified memory used (jetson)
    "swap_in_mb",             # what the system swapped back in while the measurement ran (/proc/vmstat)
    "swap_out_mb",            # what the system swapped out while the measurement ran
    "gpu_util_pct",
    "power_w",
    "torch_version",
    "threads",                # torch intra-op threads
    "device_model",           # CPU model or GPU name
    "clocks",                 # power mode / clocks where known
    "hostname",
    "timestamp",              # ISO 8601, UTC, when the row was written
    "description_sha",        # sha256 of the description JSON (first 16 hex digits)
    "momentum",               # SGD's momentum (empty: another optimiser, or a row from before it was recorded)
    "weight_decay",           # the optimiser's weight decay (empty: a row from before it was recorded)
    "update_ms_median",       # median time of the optimiser's update (optimizer.step) inside the timed steps
    "loss",                   # the step's loss: cross_entropy | mse | l1 (empty: a row from before, cross_entropy)
    "load_avg_1m",            # the device's 1-minute load average as the measurement ended (empty: a row from before)
    "cpu_count",              # the device's CPUs (os.cpu_count); a load over it by more than LOAD_MARGIN: other work
]

STATUSES = ("ok", "oom", "skipped_after_oom", "error")


def number(value: Any, finite: bool = True) -> Optional[float]:
    """A cell as a float, or None (empty, not a number, NaN, or infinite unless ``finite`` is False)."""
    try:
        x = float(value)
    except (TypeError, ValueError):
        return None
    return None if math.isnan(x) or (finite and math.isinf(x)) else x


#: how far above its CPU count a device's load average must be for :func:`under_load`: a quiet device whose
#: measurement runs on all its cores (torch's default threads) reads about its count, a few hundredths over it
#: whenever a daemon wakes; half a CPU more is other work that takes cores from the step
LOAD_MARGIN = 0.5


def under_load(row: Dict[str, Any]) -> bool:
    """Whether ``row`` was measured while the device's 1-minute load average (``load_avg_1m``) was more than
    :data:`LOAD_MARGIN` above its CPU count (``cpu_count``): other work then shared its cores, and the step times
    read high and noisy. False where either cell is empty (a row from before they were recorded, an imported row)."""
    load, cpus = number(row.get("load_avg_1m")), number(row.get("cpu_count"))
    return load is not None and bool(cpus) and load > cpus + LOAD_MARGIN


def batch_size_of(row: Dict[str, Any]) -> int:
    """A measurement row's batch size (images per step) as an int; the cell may read ``8`` or ``8.0``."""
    return int(float(row["batch_size"]))


def results_path(profiling_dir: Union[str, Path], device: str) -> Path:
    """Where a device's measurements live: ``<profiling_dir>/<device>/measurements.csv``."""
    return Path(profiling_dir) / device / "measurements.csv"


#: The file name of a device's drift-reference measurements, beside its measurements (locally and on the device).
REFERENCES_CSV = "references.csv"


def references_path(profiling_dir: Union[str, Path], device: str) -> Path:
    """Where a device's drift-reference measurements live (``[profile] reference_every``; the same columns):
    ``<profiling_dir>/<device>/references.csv``."""
    return Path(profiling_dir) / device / REFERENCES_CSV


#: The file name beside a device's measurements that ``--stage profile --remeasure`` moves the rows it measures again
#: into (the same columns; no stage reads it, so the fingerprint fits the newer rows). Host-side only.
SUPERSEDED_CSV = "superseded.csv"

#: The file name of a CPU device's op prices (``op_prices.py``), beside its measurements (locally and on the device).
OP_PRICES_JSON = "op_prices.json"


def op_prices_path(profiling_dir: Union[str, Path], device: str) -> Path:
    """Where a device's measured op prices live (``[profile] op_prices``):
    ``<profiling_dir>/<device>/op_prices.json``."""
    return Path(profiling_dir) / device / OP_PRICES_JSON


def phase_of(row: Dict[str, Any]) -> str:
    """A row's ``phase``; an empty one is ``train`` (SGD's training step, ``plan.training_phase``)."""
    return str(row.get("phase") or "train")


def loss_of(row: Dict[str, Any]) -> str:
    """A row's ``loss`` (``plan.LOSSES``); an empty one (a row from before the loss could be chosen, an imported
    row) is ``cross_entropy``."""
    return str(row.get("loss") or "cross_entropy")


def row_key(row: Dict[str, Any], with_sha: bool = True) -> Tuple[str, ...]:
    """Identity of a measurement: (device, network, batch size, input shape, phase, loss, description sha);
    without the sha for imports (they bring their descriptions with them and measure nothing again)."""
    key = (str(row.get("device", "")), str(row["network"]), str(batch_size_of(row)),
           str(row.get("input_shape", "")), phase_of(row), loss_of(row))
    return key + (str(row.get("description_sha") or ""),) if with_sha else key


def written_key(row: Dict[str, Any]) -> Tuple[str, ...]:
    """One written row's identity: its key (:func:`row_key`) and the time it was written (a drift reference's, of
    which a configuration has many; a row ``--remeasure`` moves aside)."""
    return row_key(row) + (str(row.get("timestamp", "")),)


def file_sha(data: bytes) -> str:
    """A description file's ``description_sha``: the first 16 hex digits of the sha256 of its bytes."""
    return hashlib.sha256(data).hexdigest()[:16]


def split_stale(rows: Iterable[Dict[str, Any]],
                current: Dict[str, str]) -> Tuple[List[Dict[str, Any]], List[Dict[str, Any]]]:
    """(current rows, stale rows): a row is stale when ``current`` (network -> sha of its description
    file now) has its network under another sha, i.e. it was measured on an earlier version of the
    description. Rows without a sha, of networks not in ``current``, or imported (their descriptions
    came with them; there is nothing to measure again) count as current."""
    fresh, stale = [], []
    for r in rows:
        sha, now = str(r.get("description_sha") or ""), current.get(str(r.get("network", "")))
        if r.get("backend") == "imported":
            sha = ""
        (stale if sha and now and sha != now else fresh).append(r)
    return fresh, stale


def append_row(path: Union[str, Path], row: Dict[str, Any]) -> None:
    """Append one row (unknown keys are an error), writing the header if the file is new; fsync'd.

    A file written with an older column list (a subset of :data:`COLUMNS`) is first rewritten with
    today's header, its rows kept and the new columns empty (:func:`upgrade_file`).
    """
    unknown = set(row) - set(COLUMNS)
    if unknown:
        raise ValueError(f"unknown measurement columns: {sorted(unknown)}")
    p = Path(path)
    p.parent.mkdir(parents=True, exist_ok=True)
    new = not p.exists() or p.stat().st_size == 0 or _drop_torn_tail(p) == 0
    if not new:
        upgrade_file(p)
    with naming_file(p), p.open("a", newline="") as fh:  # a write or fsync error names no file: say which
        writer = csv.DictWriter(fh, fieldnames=COLUMNS, extrasaction="raise")
        if new:
            writer.writeheader()
        writer.writerow({k: ("" if row.get(k) is None else row.get(k)) for k in COLUMNS})
        fh.flush()
        os.fsync(fh.fileno())


def upgrade_file(path: Union[str, Path]) -> bool:
    """Rewrite a measurement CSV whose header is an older column list with :data:`COLUMNS` (atomic
    replace; rows kept, new columns empty). True if it was rewritten. A header with columns this
    version does not know raises ``UserError`` naming them (the file is left as it is)."""
    p = Path(path)
    with p.open(newline="", encoding="utf-8-sig") as fh:  # -sig: a spreadsheet's byte-order mark
        header = next(csv.reader(fh), [])
    if header == COLUMNS:
        return False
    unknown = [c for c in header if c not in COLUMNS]
    if unknown:
        raise UserError(f"{p}: columns {unknown} are not part of this version's measurement schema; move the file away")
    with p.open(newline="", encoding="utf-8-sig") as fh:
        rows = list(csv.DictReader(fh))
    with atomic_path(p, suffix=".upgrade") as tmp, tmp.open("w", newline="") as fh:
        writer = csv.DictWriter(fh, fieldnames=COLUMNS)
        writer.writeheader()
        for r in rows:
            if None in r:  # a torn or malformed line: more fields than the header
                continue
            writer.writerow({k: r.get(k) or "" for k in COLUMNS})
        fh.flush()
        os.fsync(fh.fileno())
    return True


def complete_records(buf: bytes) -> int:
    """Length of the longest prefix of ``buf`` that ends a CSV record (a newline outside quotes)."""
    ends = _record_ends(buf)
    return ends[-1] if ends else 0


def _record_ends(buf: bytes) -> List[int]:
    """Where each complete CSV record of ``buf`` ends (the offset after its newline outside quotes), in order."""
    ends, quoted = [], False
    for i, byte in enumerate(buf):
        if byte == 0x22:  # '"': doubled quotes toggle twice, which leaves the state unchanged
            quoted = not quoted
        elif byte == 0x0A and not quoted:
            ends.append(i + 1)
    return ends


def _one_record(chunk: bytes, first: bool) -> Optional[List[str]]:
    """The fields of the one CSV record ``chunk`` holds; None where it is not UTF-8 text or reads as other than one
    record (a blank line, a stray carriage return). ``first``: the file's first record, read past a byte-order mark."""
    try:
        text = chunk.decode("utf-8-sig" if first else "utf-8")
    except UnicodeDecodeError:
        return None
    records = list(csv.reader(io.StringIO(text, newline="")))
    return records[0] if len(records) == 1 else None


def take_rows(data: bytes, taken: Callable[[Dict[str, str]], bool]) -> Tuple[bytes, List[Dict[str, str]]]:
    """A measurement CSV's bytes ``data`` less the rows ``taken`` picks (called with each row read as the header
    names it), and those rows, in file order: what ``--stage profile --remeasure`` moves aside, on this machine's CSV
    and on an SSH device's. Every other byte stays as it was: a byte-order mark (read past to find the header), the
    header, a line that cannot be read as a row (not UTF-8, a field count other than the header's, a blank line, a
    row ``taken`` raises ``KeyError`` or ``ValueError`` on) and a last line cut short (the next append drops it, as
    it does in any file; :func:`read_rows` passes over it meanwhile). Nothing is lost, nor decoded and encoded
    again."""
    ends = _record_ends(data)
    header = _one_record(data[:ends[0]], first=True) if ends else None
    if not header:
        return data, []
    kept, rows, start = [data[:ends[0]]], [], ends[0]
    for end in ends[1:]:
        chunk, start = data[start:end], end
        fields = _one_record(chunk, first=False)
        row = dict(zip(header, fields)) if fields is not None and len(fields) == len(header) else None
        try:
            take = row is not None and taken(row)
        except (KeyError, ValueError):
            take = False
        if take:
            rows.append(row)
        else:
            kept.append(chunk)
    kept.append(data[start:])  # a last line cut short, or nothing
    return b"".join(kept), rows


def _ends_a_line(fh: BinaryIO) -> bool:
    """Whether the file open in ``fh`` (binary) is empty or ends with a line break; ``fh`` is left at its end."""
    if fh.seek(0, os.SEEK_END) == 0:
        return True
    fh.seek(-1, os.SEEK_END)
    return fh.read(1) == b"\n"


def _drop_torn_tail(p: Path) -> int:
    """Cut a row that a crash or a full disk left unfinished at the end of ``p`` back to the end of the last
    complete record, and return the file's size. A fresh line after it would not do: where the cut fell inside a
    quoted field (a Jetson's ``clocks``, an error's message), every row after it would read as part of that field."""
    with p.open("rb+") as fh:
        if _ends_a_line(fh):
            return fh.tell()
        fh.seek(0)
        end = complete_records(fh.read())
        fh.truncate(end)
        fh.flush()
        os.fsync(fh.fileno())
        return end


#: The columns of numbers: each cell empty (not measured, not applicable: a cpu device's GPU figures, an ``oom`` or
#: ``error`` row's figures, an imported row's figure its source lacked, a column an older file did not have) or a
#: finite number >= 0, whatever the row's status. The stages read them as numbers (the fingerprint: step time, memory,
#: threads, the update's momentum and weight decay; export: step time, memory, GPU use; compare: those and the
#: pruning level), and ``number`` turns anything else into "not measured" unsaid: a cell edited by hand or damaged
#: ('abc', '-50', 'nan', 'inf', '1e400') would leave its row out of a fit, or an export, without a word.
_NUMBER_COLUMNS = ("pruning_level", "latency_ms_median", "latency_ms_mean", "latency_ms_p10", "latency_ms_p90",
                   "latency_ms_std", "timed_steps", "warmup_steps", "repeats", "latency_ms_repeat_cv", "peak_rss_mb",
                   "baseline_rss_mb", "torch_alloc_peak_mb", "torch_reserved_peak_mb", "device_mem_used_mb",
                   "swap_in_mb", "swap_out_mb", "gpu_util_pct", "power_w", "threads", "momentum", "weight_decay",
                   "update_ms_median", "load_avg_1m", "cpu_count")


def _shown(value: Any) -> str:
    """A cell as a message quotes it: in quotes, on one line (a line break inside a quoted field escaped), cut at 40
    characters."""
    text = repr(str(value))
    return text if len(text) <= 42 else text[:39] + "...'"


def _check_row(row: Dict[str, Any], where: str) -> None:
    """``UserError`` (``where``: the file and line, one line in all) for a row with an unknown ``status``, a
    ``batch_size`` that is not a positive integer or a cell of :data:`_NUMBER_COLUMNS` that is neither empty nor a
    finite number >= 0: what :func:`read_rows` checks of every complete row."""
    if row.get("status") not in STATUSES:
        raise UserError(f"{where}: status {_shown(row.get('status'))} is not one of {', '.join(STATUSES)}")
    try:
        bs = float(row.get("batch_size") or "")
    except ValueError:
        bs = 0.0
    if not (bs >= 1 and bs.is_integer()):  # NaN and infinity fail too
        raise UserError(f"{where}: batch_size {_shown(row.get('batch_size'))} is not a positive integer")
    for col in _NUMBER_COLUMNS:
        cell = row.get(col)
        if not cell:  # empty: not measured; None: a column the file does not have
            continue
        try:
            x = float(cell)
        except (TypeError, ValueError):
            x = -1.0
        if not 0 <= x < math.inf:  # NaN compares false
            raise UserError(f"{where}: {col} {_shown(cell)} is not a finite number >= 0 (an empty cell: not "
                            "measured)")


def read_rows(path: Union[str, Path], incomplete: Optional[List[int]] = None) -> List[Dict[str, str]]:
    """All complete rows of a measurement CSV; [] if there is no file. A line without a timestamp (one edited in by
    hand), a last line without its end (a row a crash or a full disk cut short) or a line with more fields than the
    header (a trailing comma a spreadsheet added, files pasted together: its values may have shifted) is passed
    over, and its line number
    appended to ``incomplete`` when a list is given (see :func:`incomplete_note`). ``UserError`` naming the file (and
    line) for a folder, a file that is not UTF-8 text, or a complete row that :func:`_check_row` refuses (an unknown
    status, a batch size that is not a positive integer, a number column's cell that is not a finite number >= 0).
    A jetson row's negative ``device_mem_used_mb`` (what that backend wrote before it left such a figure empty) reads
    as empty."""
    p = Path(path)
    if not p.exists():
        return []
    if p.is_dir():
        raise UserError(f"{p}: is a folder, not a measurement CSV")
    try:
        with p.open(newline="", encoding="utf-8-sig") as fh:  # a byte-order mark (a spreadsheet's) is no column
            reader = csv.DictReader(fh)
            # each row with the file's line number where it ends (blank lines and line breaks inside a field count)
            numbered, header = [(reader.line_num, r) for r in reader], reader.fieldnames or []
        with p.open("rb") as raw:  # a last line without its end is a row a crash or a full disk cut short
            torn = not _ends_a_line(raw)
    except UnicodeDecodeError as exc:
        raise UserError(f"{p}: not a measurement CSV (not UTF-8 text: byte {exc.start})") from None
    except csv.Error as exc:
        raise UserError(f"{p}: not a readable CSV ({exc})") from None
    missing = [c for c in ("network", "batch_size", "status", "timestamp") if c not in header]
    if numbered and missing:  # without a timestamp column every row would read as one a crash cut short
        raise UserError(f"{p}: not a measurement CSV: its header lacks {', '.join(missing)} "
                        "(comma-separated, with the header the profile stage writes; a row's timestamp, any text, "
                        "marks it complete)")
    kept = []
    for i, (line, r) in enumerate(numbered):
        # None: csv's key for the fields beyond the header. A last line without its end is cut short whatever it
        # holds: the timestamp is no longer the last column, so a row torn after it read as complete (its
        # configuration done), and the next append cut it off (append_row: _drop_torn_tail)
        if not r.get("timestamp") or None in r or (torn and i == len(numbered) - 1):
            if incomplete is not None:
                incomplete.append(line)
            continue
        if r.get("backend") == "jetson" and (number(r.get("device_mem_used_mb")) or 0) < 0:
            r["device_mem_used_mb"] = ""  # unified memory below its reading before the step, as the jetson backend
            # wrote it before it left that cell empty (not measured): the device's own file stays readable
        _check_row(r, f"{p}: line {line}")
        kept.append(r)
    return kept


def incomplete_note(path: Union[str, Path], lines: Optional[List[int]] = None) -> str:
    """One line naming the lines of ``path`` that :func:`read_rows` passes over ('' if none): a row cut
    short is measured again by the next profile run; anything else there is not a measurement. ``lines``:
    what ``read_rows(path, incomplete)`` reported, when the caller has read the file already."""
    if lines is None:
        lines = []
        read_rows(path, lines)
    if not lines:
        return ""
    many = len(lines) != 1
    shown = ", ".join(map(str, lines[:5])) + (", ..." if len(lines) > 5 else "")
    return (f"note: {path}: {len(lines)} incomplete line{'s' if many else ''} (line{'s' if many else ''} "
            f"{shown}: no timestamp, more fields than the header, or a last line cut short) passed over; a row cut "
            "short is measured again by the next profile run")


def measured_keys(rows: Iterable[Dict[str, Any]], with_sha: bool = True) -> Set[Tuple[str, ...]]:
    """Keys already on disk, so a rerun skips them (see :func:`row_key`)."""
    return {row_key(r, with_sha) for r in rows}


def latest_rows(rows: Iterable[Dict[str, Any]]) -> List[Dict[str, Any]]:
    """The rows less those measured again later: of the rows with one key (:func:`row_key`), the last in file
    order. A measurement is repeated only when the runner takes it again (an ``oom`` a lower memory_limit_mb
    caused, under a higher one; an ``error``, with the plan's ``retry_errors``); its earlier row stays on disk and
    is passed over."""
    rows = list(rows)
    last = {row_key(r): i for i, r in enumerate(rows)}
    return [r for i, r in enumerate(rows) if last[row_key(r)] == i]
