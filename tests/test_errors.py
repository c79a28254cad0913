"""pgrank/errors.py: a stop that lands in a finalizer still stops the process."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

# An object whose __del__ is running when a stop signal arrives (the signal is raised from inside it, so the timing
# is exact): Python reports the exception it raises (Ctrl-C's KeyboardInterrupt, or pgrank's Stopped under a signal
# handler of its own) as "Exception ignored" and drops it. SIGINT's handler is set as under a terminal, even where
# pytest runs with it ignored.
FINALIZED = """
import contextlib, signal, time
signal.signal(signal.SIGINT, signal.default_int_handler)
{setup}
class Finalized:
    def __del__(self):
        signal.raise_signal(signal.{signal})

try:
    with {around}:
        Finalized()
        time.sleep(3)
    print("ran on")
except {caught} as stop:
    print("interrupted", *([stop.exit_code] if hasattr(stop, "exit_code") else []))
"""


def stop_in_a_finalizer(setup: str, *, signal: str = "SIGINT", around: str = "contextlib.nullcontext()",
                        caught: str = "KeyboardInterrupt") -> subprocess.CompletedProcess:
    """Run ``setup`` (Python, in the checkout), then ``signal`` inside a finalizer, within the context manager
    ``around``; stdout ends ``interrupted`` (with the exit code of a :class:`pgrank.errors.Stopped`) when the
    ``caught`` exception reached the running code, ``ran on`` when it was dropped."""
    script = FINALIZED.format(setup=setup, signal=signal, around=around, caught=caught)
    return subprocess.run([sys.executable, "-c", script], cwd=ROOT, capture_output=True, text=True, timeout=60)


KEPT = "from pgrank.errors import keep_interrupts\nkeep_interrupts()\nkeep_interrupts()  # a second call changes nothing"


@pytest.mark.parametrize("mode", ["kept", "python's default"])
def test_ctrl_c_during_a_finalizer_interrupts_the_running_code_once_interrupts_are_kept(mode):
    run = stop_in_a_finalizer(KEPT if mode == "kept" else "")
    if mode == "kept":
        assert run.stdout.strip() == "interrupted", run.stderr
        assert "Exception ignored" not in run.stderr and "Traceback" not in run.stderr, run.stderr
    else:  # what the hook is for: without it the process runs on, the stop lost
        assert run.stdout.strip() == "ran on"
        assert "Exception ignored" in run.stderr and "KeyboardInterrupt" in run.stderr


def test_other_exceptions_in_a_finalizer_are_still_reported():
    script = ("from pgrank.errors import keep_interrupts\nkeep_interrupts()\n"
              "class F:\n    def __del__(self):\n        raise ValueError('from a finalizer')\nF()\nprint('ran on')\n")
    run = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60)
    assert run.stdout.strip() == "ran on"
    assert "Exception ignored" in run.stderr and "ValueError: from a finalizer" in run.stderr
