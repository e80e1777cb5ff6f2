"""Files written whole or not at all: filled beside their final name first, then renamed over it.

A reader (another process, or the next run after a crash) sees the old file or the new one, never
half of one: the rename is atomic on one file system. Standard library only: the modules that run
on the devices (the test plan, the runner, the measuring child) import it.
"""
import contextlib
import functools
import hashlib
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


@contextlib.contextmanager
def atomic_path(path: Union[str, Path], suffix: str = ".tmp") -> Iterator[Path]:
    """A temporary path beside ``path`` (its name plus ``suffix``) for a writer such as ``np.savez`` or
    ``torch.save`` to fill; renamed over ``path`` when the block ends, removed if it raises."""
    final = Path(path)
    tmp = final.with_name(final.name + suffix)
    try:
        yield tmp
    except BaseException:
        with contextlib.suppress(OSError):  # missing too (unlink's missing_ok is Python 3.8+)
            tmp.unlink()
        raise
    tmp.replace(final)


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


def write_atomically(path: Union[str, Path], data: Union[bytes, str]) -> Path:
    """Write ``data`` (text in the locale's encoding, as ``Path.write_text``, or bytes) to ``path`` through
    :func:`atomic_path`; returns ``path`` as a ``Path``."""
    with atomic_path(path) as tmp:
        if isinstance(data, bytes):
            tmp.write_bytes(data)
        else:
            tmp.write_text(data)
    return Path(path)
