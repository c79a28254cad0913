"""The one exception type that reaches users.

Every error a person can fix (a bad config key, a corrupt download, a malformed data line) is raised
as :class:`PgrankError` with a message that names the file, line or key. The CLI prints the message
and exits non-zero without a traceback; everything else is a bug and keeps its traceback.
"""

from __future__ import annotations


class PgrankError(Exception):
    """An error caused by the user's input, with a message meant for people."""

    exit_code = 2


class ConfigError(PgrankError):
    """``params.yaml`` (or an override) is invalid: unknown key, wrong type, out of range."""


class DataError(PgrankError):
    """A dataset, download or candidate file is missing, corrupt or malformed."""
