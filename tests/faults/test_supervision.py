"""The kill harness's own bookkeeping (tests/faults/supervision.py): pure, fast."""

from __future__ import annotations

import random

import pytest
from supervision import Moment, StageTrace, differences, draw_moments


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


def test_a_cache_entry_may_be_absent_but_one_that_is_there_must_be_the_references():
    """A corpus artifact is one entry (its folder); kept query vectors are one entry per shard, since each encoding
    call adds one: a stage rerun alone brings back its own shards, not those of the stages after it."""
    caches = ("data/embeddings/",)
    reference = {"data/embeddings/m--L64--abc/shard-0.npy": "1", "data/embeddings/m--L64--abc/meta.json": "2",
                 "data/embeddings/m--L64--queries/s1.keys.npy": "3", "data/embeddings/m--L64--queries/s1.vectors.npy": "4",
                 "data/embeddings/m--L64--queries/s2.keys.npy": "5", "data/embeddings/m--L64--queries/s2.vectors.npy": "6",
                 "runs/x.json": "7"}
    only_s1 = {k: v for k, v in reference.items() if "/s2." not in k}
    assert differences(only_s1, reference, caches) == []
    assert differences({**only_s1, "data/embeddings/m--L64--queries/s1.vectors.npy": "x"}, reference, caches) == [
        "data/embeddings/m--L64--queries/s1.vectors.npy"]
    half = {k: v for k, v in reference.items() if not k.endswith("meta.json")}
    assert differences(half, reference, caches) == ["data/embeddings/m--L64--abc/meta.json"]
    assert differences({}, reference, caches) == ["runs/x.json"]
