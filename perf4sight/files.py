"""Files written whole or not at all: filled beside their final name first, then renamed over it.

A reader (another process, or the next run after a crash) sees the old file or the new one, never
half of one: the rename is atomic on one file system. Standard library only: the modules that run
on the devices (the test plan, the runner, the measuring child) import it.
"""
import contextlib
import functools
import hashlib
import os
import re
import time
from pathlib import Path
from typing import Iterator, Union

__all__ = ["atomic_path", "write_atomically", "naming_file", "sources_sha256", "package_sha256"]

_PACKAGE = Path(__file__).resolve().parent  # perf4sight/


def sources_sha256(package: Path) -> str:
    """sha256 over the Python sources under ``package`` (their relative paths and bytes), in name order. A name that
    is no file is passed over (an editor's lock file, ``.#build.py``, is a link to nowhere); ``OSError`` where a
    source cannot be read."""
    h = hashlib.sha256()
    for path in sorted(package.rglob("*.py")):
        if path.is_file():
            h.update(path.relative_to(package).as_posix().encode() + b"\0" + path.read_bytes() + b"\0")
    return h.hexdigest()


@functools.lru_cache(maxsize=1)
def package_sha256() -> str:
    """:func:`sources_sha256` of the perf4sight package itself, hashed once per process (the networks stage's cache
    and the fingerprint stage's inputs both key on it); ``OSError`` where a source cannot be read (not kept: the
    next call tries again)."""
    return sources_sha256(_PACKAGE)


#: A unique temporary file this old is a dead writer's (a live one renames its file within moments of writing it).
STALE_TEMP_S = 3600.0


def _writer_tag() -> str:
    """What makes one writer's temporary name its own: its process and a random part (threads of one process)."""
    return ".%d.%s" % (os.getpid(), os.urandom(4).hex())


#: (folder, suffix) this process has swept (:func:`_sweep_stale`): once each, as listing a folder of thousands of
#: files at every write made writing them all quadratic.
_SWEPT: set = set()


def _sweep_stale(folder: Path, suffix: str) -> None:
    """Remove the unique temporary files (:func:`atomic_path`) in ``folder`` of writers that died before renaming
    theirs (killed, say), once they are :data:`STALE_TEMP_S` old; whatever cannot be read or removed is passed
    over. Once per folder and suffix in a process."""
    if (str(folder), suffix) in _SWEPT:
        return
    _SWEPT.add((str(folder), suffix))
    scrap = re.compile(r".+\.\d+\.[0-9a-f]{8}" + re.escape(suffix) + "$")
    cutoff = time.time() - STALE_TEMP_S
    with contextlib.suppress(OSError), os.scandir(str(folder)) as entries:
        for entry in entries:
            if scrap.match(entry.name):
                with contextlib.suppress(OSError):
                    if entry.stat(follow_symlinks=False).st_mtime < cutoff:
                        os.unlink(entry.path)


@contextlib.contextmanager
def atomic_path(path: Union[str, Path], suffix: str = ".tmp", unique: bool = True) -> Iterator[Path]:
    """A temporary path beside ``path`` for a writer such as ``np.savez`` or ``torch.save`` to fill; renamed over
    ``path`` when the block ends, removed if it raises.

    ``unique`` (the default): the name is ``path``'s plus this process's id, a random part and ``suffix``, so that
    writers of one file at once (two predicts filling one cache) each rename their own; a dead writer's leftover is
    removed once it is an hour old, by the next process to write a file into its folder. ``unique=False``: the name
    is ``path``'s plus ``suffix`` alone, for a file that one writer at a time holds (under a lock: the runner's, a
    device's profile lock); the next writer overwrites a dead one's leftover."""
    final = Path(path)
    tmp = final.with_name(final.name + (_writer_tag() if unique else "") + suffix)  # the suffix last: ".tmp.npz"
    try:
        yield tmp
    except BaseException:
        with contextlib.suppress(OSError):  # missing too (unlink's missing_ok is Python 3.8+)
            tmp.unlink()
        raise
    tmp.replace(final)
    if unique:
        _sweep_stale(final.parent, suffix)


@contextlib.contextmanager
def naming_file(path: Union[str, Path]) -> Iterator[None]:
    """An ``OSError`` raised in the block that names no file (a write's or an fsync's: a full disk) names ``path``;
    one without an errno is left as it is (a file name would turn its message into ``[Errno None] None: ...``)."""
    try:
        yield
    except OSError as exc:
        if not exc.filename and exc.errno is not None:
            exc.filename = str(path)
        raise


def write_atomically(path: Union[str, Path], data: Union[bytes, str], unique: bool = True) -> Path:
    """Write ``data`` (text in the locale's encoding, as ``Path.write_text``, or bytes) to ``path`` through
    :func:`atomic_path` (``unique`` as there); returns ``path`` as a ``Path``."""
    with atomic_path(path, unique=unique) as tmp:
        if isinstance(data, bytes):
            tmp.write_bytes(data)
        else:
            tmp.write_text(data)
    return Path(path)
