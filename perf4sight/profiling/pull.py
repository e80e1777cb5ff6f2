"""Copy measurement rows from a device's CSV into the local one, each key exactly once.

The remote CSV only grows (the runner appends and fsyncs one row at a time), so the puller
keeps a byte offset and reads what is new. Only *complete* CSV records are consumed — a row
being written, or torn by a crash, waits or is dropped — and a row is appended locally only
if its key (device, network, batch size, input shape, phase, description sha) is not there yet.
Re-reading from offset 0 after a reconnect or restart is therefore harmless. A puller given the
plan's keys takes only those: a device's work folder may also hold rows of networks no longer
configured, or of another config that uses the same folder, and those stay on the device.
"""
from __future__ import annotations

import csv
import io
from pathlib import Path
from typing import Callable

from perf4sight.profiling import results
from perf4sight.profiling.results import complete_records

__all__ = ["complete_records", "parse_records", "CsvPuller", "rows_to_csv", "csv_with_rows"]


def parse_records(chunk: bytes, header: list[str] | None) -> tuple[list[str] | None, list[dict[str, str]]]:
    """Rows of a chunk of complete records; the first record is the header when ``header`` is None.

    Records whose field count differs from the header's, or that lack a valid status or a
    timestamp (torn rows), are dropped. A byte-order mark before the header is read past.
    """
    # -sig: the file's start, past a byte-order mark (a spreadsheet's), which the device's runner reads past too
    text = chunk.decode("utf-8-sig" if header is None else "utf-8", errors="replace")
    records = list(csv.reader(io.StringIO(text, newline="")))
    if header is None and records:
        header, records = records[0], records[1:]
    rows = []
    for rec in records:
        if header is None or len(rec) != len(header):
            continue
        row = dict(zip(header, rec))
        if row.get("status") in results.STATUSES and row.get("timestamp"):
            rows.append({k: v for k, v in row.items() if k in results.COLUMNS})
    return header, rows


def rows_to_csv(rows: list[dict[str, str]], with_header: bool) -> bytes:
    """Rows in the exact format ``results.append_row`` writes (CRLF records)."""
    buf = io.StringIO(newline="")
    writer = csv.DictWriter(buf, fieldnames=results.COLUMNS, extrasaction="ignore")
    if with_header:
        writer.writeheader()
    for row in rows:
        writer.writerow({k: row.get(k, "") for k in results.COLUMNS})
    return buf.getvalue().encode()


def csv_with_rows(current: bytes, rows: list[dict[str, str]]) -> bytes:
    """A measurement CSV's bytes ``current`` (may be empty) with ``rows`` appended; a file written with
    an older column list (a subset of ``results.COLUMNS``) comes back rewritten with today's header.
    Other headers raise ``ValueError``."""
    if not current:
        return rows_to_csv(rows, with_header=True)
    complete = current[:complete_records(current)]  # a row left unfinished at the end (a crash) is dropped
    header, old = parse_records(complete, None)
    if header == results.COLUMNS:  # as append_row drops it
        return complete + rows_to_csv(rows, with_header=False)
    if header is not None and set(header) <= set(results.COLUMNS):
        return rows_to_csv(old + rows, with_header=True)
    raise ValueError(f"unexpected columns {header}")


class CsvPuller:
    """Incremental, duplicate-free copy of one remote CSV into ``local``.

    ``read_from(offset) -> bytes`` and ``size() -> int | None`` access the remote file. ``wanted``: the
    only keys to copy (None = all); ``passed_over`` collects the keys of remote rows outside it that
    are not local either. ``key``: a row's identity (default ``results.row_key``; a drift reference's rows
    repeat one configuration, and :func:`results.written_key` adds the time each was written). A row is copied
    unless a local row has its key and the time it was written: a measurement taken again (an ``oom`` row of a
    lower memory_limit_mb, an ``error`` retried; ``results.latest_rows``) comes over beside the earlier one. The
    local rows are those in the file when a row is appended (read again where someone else wrote it meanwhile).
    """

    def __init__(self, local: Path, wanted: set[tuple[str, ...]] | None = None,
                 key: Callable[[dict], tuple[str, ...]] = results.row_key) -> None:
        self.local = Path(local)
        self.key = key
        self.keys: set[tuple[str, ...]] = set()
        self.copied: set[tuple[str, ...]] = set()
        self.appended = 0  # rows this puller appended to ``local``, a pull cut short included
        self.seen: tuple[int, ...] | None = None  # the local file as last read or written by this puller
        self._catch_up()
        self.wanted = wanted
        self.offset = 0
        self.header: list[str] | None = None
        self.remote_keys: set[tuple[str, ...]] = set()
        self.passed_over: set[tuple[str, ...]] = set()

    def reset(self) -> None:
        """Forget the position (after the remote file was replaced); the next pull re-reads it all."""
        self.offset, self.header = 0, None
        self.remote_keys, self.passed_over = set(), set()

    def pull(self, size: Callable[[], int | None], read_from: Callable[[int], bytes]) -> list[dict[str, str]]:
        """Append new complete remote rows not local yet (by key and time written); returns those rows."""
        n = size()
        if n is None:
            return []
        if n < self.offset:
            self.reset()
        fresh: list[dict[str, str]] = []
        while self.offset < n:  # ``read_from`` may return less than is there (a limit per read): read on to ``n``
            data = read_from(self.offset)
            end = complete_records(data)
            if end == 0:
                break
            self.header, rows = parse_records(data[:end], self.header)
            self.offset += end
            fresh += self._take(rows)
        return fresh

    def _take(self, rows: list[dict[str, str]]) -> list[dict[str, str]]:
        """Append the rows not copied yet to the local CSV; returns those."""
        fresh = []
        for row in rows:
            key = self.key(row)
            self.remote_keys.add(key)
            if self.wanted is not None and key not in self.wanted:
                if key not in self.keys:
                    self.passed_over.add(key)
                continue
            if self._written(row) not in self.copied:
                self._catch_up()
            if self._written(row) not in self.copied:
                results.append_row(self.local, row)
                self.appended += 1
                self.seen = self._state()
                self.keys.add(key)
                self.copied.add(self._written(row))
                fresh.append(row)
        return fresh

    def _state(self) -> tuple[int, ...] | None:
        """The local file's identity, size and modification time (None while there is none)."""
        try:
            st = self.local.stat()
        except FileNotFoundError:
            return None
        return st.st_ino, st.st_size, st.st_mtime_ns

    def _catch_up(self) -> None:
        """Read the local file again where another writer changed it since this puller last did, so that a row
        already there (copied by another puller of the device) is never appended a second time."""
        state = self._state()
        if state == self.seen and state is not None:
            return
        rows = results.read_rows(self.local)
        self.keys |= {self.key(r) for r in rows}
        self.copied |= {self._written(r) for r in rows}
        self.seen = state

    def _written(self, row: dict) -> tuple[str, ...]:
        """One written row: its key and the time it was written."""
        return self.key(row) + (str(row.get("timestamp", "")),)
