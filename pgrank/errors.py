"""The one exception type that reaches users.

Every error a person can fix (a bad config key, a corrupt download, a malformed data line) is raised
as :class:`PgrankError` with a message that names the file, line or key. The CLI prints the message
and exits non-zero without a traceback; everything else is a bug and keeps its traceback.
"""

from __future__ import annotations

import errno
import os
import signal
import sys
import threading


class PgrankError(Exception):
    """An error caused by the user's input, with a message meant for people."""

    exit_code = 2


class ConfigError(PgrankError):
    """``params.yaml`` (or an override) is invalid: unknown key, wrong type, out of range."""


class DataError(PgrankError):
    """A dataset, download or candidate file is missing, corrupt or malformed."""


class Stopped(PgrankError):
    """A signal (SIGINT, SIGTERM, SIGHUP) stopped the run; the exit code is 128 + its number, as a shell reports it.

    ``dropped`` is set when it was raised inside a finalizer and Python dropped it (:func:`keep_interrupts`),
    so that the signal handler that raised it raises it again when the signal is sent once more."""

    dropped = False

    def __init__(self, signum: int, message: str):
        super().__init__(message)
        self.signum = signum
        self.exit_code = 128 + signum


# OS errors that the machine, not pgrank, causes: a full disk or quota, a file-size limit, a read-only or
# forbidden folder. The CLI reports them like bad input (one line naming the file), with exit code 74
# (sysexits' EX_IOERR); any other OSError is a bug and keeps its traceback.
ENVIRONMENT_ERRNOS = frozenset({errno.ENOSPC, errno.EDQUOT, errno.EFBIG, errno.EROFS, errno.EACCES, errno.EPERM})
ENVIRONMENT_EXIT_CODE = 74


def environment_message(exc: OSError) -> str | None:
    """A one-line message for an environment :class:`OSError`, or ``None`` for any other error."""
    if exc.errno not in ENVIRONMENT_ERRNOS:
        return None
    where = exc.filename if exc.filename is not None else "a file"
    hint = {errno.ENOSPC: "free some disk space", errno.EDQUOT: "free some of your quota",
            errno.EFBIG: "the file-size limit (ulimit -f) is too low"}.get(exc.errno, "check the folder's permissions")
    return f"{where}: {exc.strerror or os.strerror(exc.errno)} ({hint}); run again once fixed"


RESEND_DELAY_S = 0.05


def keep_interrupts() -> None:
    """A stop is never lost in a finalizer: a ``KeyboardInterrupt`` (Ctrl-C) or a :class:`Stopped` (a stop signal
    to ``pgrank repro`` while no DVC runs) that lands while Python runs an object's ``__del__`` (GitPython's
    ``Repo`` that MLflow opens, say) is printed as "Exception ignored" and dropped, and the process would go on as
    if never stopped. Installed once per process (the CLI does it), this hook drops that report, marks a
    :class:`Stopped` ``dropped``, and sends its signal (SIGINT for Ctrl-C) again from a helper thread once the hook
    has returned, so the stop reaches the code that was running (were it sent at once, it could land in this hook,
    and be dropped again)."""
    previous = sys.unraisablehook
    if getattr(previous, "keeps_interrupts", False):
        return

    def hook(unraisable) -> None:
        if unraisable.exc_type is not None and issubclass(unraisable.exc_type, (KeyboardInterrupt, Stopped)):
            signum = signal.SIGINT
            if isinstance(unraisable.exc_value, Stopped):
                unraisable.exc_value.dropped = True
                signum = unraisable.exc_value.signum
            again = threading.Timer(RESEND_DELAY_S, os.kill, (os.getpid(), signum))
            again.daemon = True
            again.start()
            return
        previous(unraisable)

    hook.keeps_interrupts = True
    sys.unraisablehook = hook
