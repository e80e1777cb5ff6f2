"""The one exception type that reaches the user as a one-line message (exit code 2)."""

__all__ = ["UserError"]


class UserError(Exception):
    """A problem the user can fix: bad config, missing file, unknown name.

    The CLI prints ``str(error)`` on one line and exits with code 2; no traceback.
    """
