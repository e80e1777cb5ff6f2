"""The one exception type that reaches the user as a one-line message (exit code 2)."""

import json
from pathlib import Path
from typing import Any, Dict, Tuple, Union

__all__ = ["UserError", "read_json_object", "read_json_bytes"]


class UserError(Exception):
    """A problem the user can fix: bad config, missing file, unknown name.

    The CLI prints ``str(error)`` on one line and exits with code 2; no traceback.
    """


def read_json_object(path: Union[str, Path], what: str) -> Dict[str, Any]:
    """The JSON object in ``path``; a missing file, bad JSON or a non-object is a ``UserError``."""
    return read_json_bytes(path, what)[0]


def read_json_bytes(path: Union[str, Path], what: str) -> Tuple[Dict[str, Any], bytes]:
    """:func:`read_json_object`'s object and the bytes it was read from, in one read (a file rewritten meanwhile
    cannot give the object of one version and the bytes of another)."""
    p = Path(path)
    if p.is_dir():  # there, but not "not found"
        raise UserError(f"{p}: is a folder, not a {what}")
    if not p.is_file():
        raise UserError(f"{p}: {what} not found")
    raw = p.read_bytes()
    try:
        data = json.loads(raw.decode("utf-8-sig"))  # a byte-order mark (Windows' Notepad) is no error
    except (ValueError, RecursionError) as exc:  # bad JSON or text, a number or nesting too large to read
        raise UserError(f"{p}: {what} is not valid JSON ({str(exc).splitlines()[0][:200]})") from None
    if not isinstance(data, dict):
        raise UserError(f"{p}: {what} must be a JSON object")
    return data, raw
