"""The kill harness's own bookkeeping (tests/faults/supervision.py): pure, fast."""

from __future__ import annotations

import random

import pytest
from supervision import Moment, StageTrace, draw_moments


def test_a_bytes_or_seconds_moment_is_redrawn_at_the_same_share_of_a_faster_run():
    reference = StageTrace("download", pid=1, started=0.0, ended=90.0, written=9_000_000)
    moments = draw_moments(reference, random.Random(13), 4)
    assert [m.kind for m in moments] == ["bytes", "seconds", "bytes", "seconds"]
    faster = StageTrace("download", pid=2, started=0.0, ended=30.0, written=600_000)
    for moment in moments:
        again = moment.redrawn(faster)
        assert again.kind == moment.kind and again.fraction == moment.fraction
        total = faster.written if moment.kind == "bytes" else faster.seconds
        assert again.value == pytest.approx(total * moment.fraction, abs=1)
        assert again.value < moment.value


def test_a_fault_point_is_exact_and_never_redrawn():
    with pytest.raises(ValueError):
        Moment("point", ("extract.chunk", 5), "mid-extract").redrawn(StageTrace("download", 1, 0.0, 1.0))
