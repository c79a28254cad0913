"""The seeded carve-out of ``data.train``: pure, deterministic, three disjoint query sets (train-pg, validation,
gate-pg) read back as splits, and a frozen gate that stays apart from training and selection run after run."""

from __future__ import annotations

import random

import pytest
from beir.datasets.data_loader import GenericDataLoader
from tiny_beir import data_config, write_tiny

from pgrank.data.beir import load_qrels, load_split, write_qrels
from pgrank.download.carve_out import carve, position, read_bounds, write_carve_out
from pgrank.errors import DataError
from pgrank.paths import CARVED_TRAIN, GATE, VALIDATION, Paths


@pytest.fixture
def paths(tmp_path) -> Paths:
    return Paths.from_config(data_config().paths, base=tmp_path)


def _judgments(qids) -> dict[str, dict[str, int]]:
    return {q: {f"d-{q}": 1} for q in qids}


def test_the_carve_out_is_seeded_disjoint_complete_and_pure():
    qrels = _judgments(f"q{i}" for i in range(50))
    original = {q: dict(d) for q, d in qrels.items()}
    parts = carve(qrels, 10, seed=13, gate_size=15)
    assert qrels == original
    assert (len(parts.train), len(parts.validation), len(parts.gate)) == (25, 10, 15)
    assert set(parts.train).isdisjoint(parts.validation) and set(parts.train).isdisjoint(parts.gate)
    assert set(parts.validation).isdisjoint(parts.gate)
    assert {**parts.train, **parts.validation, **parts.gate} == qrels
    assert list(parts.train) == [q for q in qrels if q in parts.train]  # input order kept
    assert carve(dict(reversed(list(qrels.items()))), 10, seed=13, gate_size=15).gate.keys() == parts.gate.keys()
    assert carve(qrels, 10, seed=14, gate_size=15).gate.keys() != parts.gate.keys()
    # the splits are bands of the hash positions: the gate lowest, then validation, then training
    order = sorted(qrels, key=lambda q: position(13, q))
    assert set(order[:15]) == set(parts.gate) and set(order[15:25]) == set(parts.validation)
    assert position(13, "q1") == position(13, "q1") and 0 <= position(13, "q1") < 1
    with pytest.raises(DataError, match="data.validation_size=50 must be smaller than the 50"):
        carve(qrels, 50, seed=13)
    with pytest.raises(DataError, match="data.validation_size=40 must be smaller than the 35 queries left beside the gate's 15"):
        carve(qrels, 40, seed=13, gate_size=15)
    with pytest.raises(DataError, match="data.gate_size=50 must be smaller than the 50"):
        carve(qrels, 1, seed=13, gate_size=50)


def _split_of(parts) -> dict[str, str]:
    return {q: name for name, part in (("train", parts.train), ("validation", parts.validation), ("gate", parts.gate))
            for q in part}


def test_adding_judged_queries_never_moves_an_existing_query_between_splits():
    """With the first carve-out's bounds (frozen with the gate set), every later carve-out keeps each old
    query where it was, however many queries arrive, and the new ones fill the splits in the configured
    proportions. Without frozen bounds a re-filled quota moves at most one old query per bound."""
    rng = random.Random(0)
    qrels = _judgments(f"q{i:04d}" for i in range(400))
    first = carve(qrels, 50, seed=13, gate_size=40)
    frozen = frozenset(first.gate)
    before = _split_of(first)
    for batch in range(5):  # judged queries arrive in batches of random size, some of them judged again
        qrels = {**qrels, **_judgments(f"new{batch}-{i}" for i in range(rng.randint(1, 400)))}
        qrels[rng.choice(sorted(qrels))] = {"d-again": 2}
        now = _split_of(carve(qrels, 50, seed=13, gate_size=40, gate=frozen, bounds=first.bounds))
        assert {q: now[q] for q in before} == before  # no old query moved
        before = now
    shares = {name: sum(v == name for v in before.values()) / len(before) for name in ("gate", "validation")}
    assert shares["gate"] == pytest.approx(40 / 400, abs=0.03) and shares["validation"] == pytest.approx(50 / 400, abs=0.03)

    # re-filled quotas (no frozen bounds): one new query moves at most one old query per bound
    grown = {**qrels, **_judgments(["one-more"])}
    old, new = _split_of(carve(qrels, 50, seed=13, gate_size=40)), _split_of(carve(grown, 50, seed=13, gate_size=40))
    assert sum(old[q] != new[q] for q in old) <= 2


def test_one_new_query_leaves_validation_as_it_was():
    qrels = _judgments(f"q{i:04d}" for i in range(500))
    grown = {**qrels, **_judgments(["q0000a"])}
    first = carve(qrels, 50, seed=13)
    assert set(carve(grown, 50, seed=13, bounds=first.bounds).validation) - {"q9999"} == set(first.validation)


def test_freezing_the_gate_changes_no_split_and_new_judgments_never_reach_it():
    """Run 1 draws the gate; every later run is handed it frozen (data.holdout) with the bounds. Freezing alone
    changes nothing, and as judgments arrive the gate set stays apart from training and validation; new queries
    below the gate bound are the gate reserve, held out too."""
    qrels = _judgments(f"q{i:03d}" for i in range(60))
    first = carve(qrels, 8, seed=13, gate_size=12)
    frozen = frozenset(first.gate)
    again = carve(qrels, 8, seed=13, gate_size=12, gate=frozen, bounds=first.bounds)
    assert (again.train, again.validation, again.gate) == (first.train, first.validation, first.gate)

    runs = [first]
    for new in range(3):  # new queries arrive, and new judgments for known ones (gate queries included)
        qrels = {**qrels, **_judgments(f"new{new}-{i}" for i in range(30))}
        qrels[sorted(frozen)[new]] = {"d-extra": 2, **qrels[sorted(frozen)[new]]}
        runs.append(carve(qrels, 8, seed=13, gate_size=99, gate=frozen, bounds=first.bounds))  # bounds, not sizes
    for run in runs:
        assert frozen <= set(run.gate)
        assert all(position(13, q) < first.bounds.gate_below for q in set(run.gate) - frozen)  # the reserve
        assert set(run.train).isdisjoint(run.gate) and set(run.validation).isdisjoint(run.gate)
        assert set(run.train).isdisjoint(run.validation)
    trained_or_selected = set().union(*(set(r.train) | set(r.validation) for r in runs))
    assert trained_or_selected.isdisjoint(frozen)  # across consecutive runs
    assert runs[-1].gate[sorted(frozen)[0]] == {"d-extra": 2, f"d-{sorted(frozen)[0]}": 1}  # today's judgments
    gone = carve({q: d for q, d in qrels.items() if q != sorted(frozen)[0]}, 8, seed=13, gate=frozen, bounds=first.bounds)
    assert sorted(frozen)[0] not in gone.gate  # a query no longer judged leaves the gate
    # a refresh retires the old set: its queries train, the new set (from the reserve) is the gate
    fresh = frozenset(set(runs[-1].gate) - frozen)
    refreshed = carve(qrels, 8, seed=13, gate=fresh, bounds=first.bounds, retired=frozen)
    assert set(refreshed.gate) == fresh and frozen <= set(refreshed.train)
    assert set(refreshed.validation) == set(runs[-1].validation)  # validation does not move


def test_write_carve_out_writes_beir_qrels_read_back_as_train_pg_and_validation(paths):
    write_tiny(paths)
    params = data_config(size=2)
    carve_out = write_carve_out(paths, params.data)
    assert (carve_out.train_queries, carve_out.validation_queries, carve_out.gate_path) == (3, 2, None)
    first = carve_out.validation_path.read_bytes()
    assert first.startswith(b"query-id\tcorpus-id\tscore\r\n")
    train = load_split(paths, "tiny", CARVED_TRAIN, progress=False)
    validation = load_split(paths, "tiny", VALIDATION, progress=False)
    beir_train = load_qrels(paths.dataset("tiny") / "qrels" / "train.tsv")
    assert set(train.qrels).isdisjoint(validation.qrels) and {**train.qrels, **validation.qrels} == beir_train
    assert set(validation.queries) == set(validation.qrels)
    # BEIR reads the carved files too
    assert GenericDataLoader(data_folder=str(paths.dataset("tiny")), qrels_file=str(carve_out.validation_path)) \
        .load_custom()[2] == validation.qrels
    bounds = read_bounds(paths, "tiny")  # splits/tiny/carve.json: what freezing a gate set records
    assert carve_out.bounds_path.parent == paths.root / "splits" / "tiny" and bounds.seed == params.data.validation_seed
    assert {q for q in beir_train if position(13, q) < bounds.validation_below} == set(validation.qrels)
    write_carve_out(paths, params.data)
    assert carve_out.validation_path.read_bytes() == first  # deterministic
    assert not list(carve_out.validation_path.parent.glob(".*"))  # no temporaries left


def test_a_gate_split_is_written_and_read_back_and_a_frozen_one_replaces_the_draw(paths, tmp_path):
    write_tiny(paths)
    data = data_config(size=1).data.model_copy(update={"gate_size": 2})
    carve_out = write_carve_out(paths, data)
    assert (carve_out.train_queries, carve_out.validation_queries, carve_out.gate_queries) == (2, 1, 2)
    gate = load_split(paths, "tiny", GATE, progress=False)
    assert set(gate.qrels) == set(load_qrels(carve_out.gate_path)) and set(gate.queries) == set(gate.qrels)
    frozen = tmp_path / "frozen.tsv"
    write_qrels(frozen, {"q6": {"d3": 1}, "q-gone": {"d1": 1}})
    held = write_carve_out(paths, data.model_copy(update={"holdout": str(frozen), "gate_size": 0}))
    assert set(load_qrels(held.gate_path)) == {"q6"} and held.gate_queries == 1
    assert "q6" not in load_qrels(held.train_path) and "q6" not in load_qrels(held.validation_path)
    write_carve_out(paths, data.model_copy(update={"gate_size": 0}))
    assert not carve_out.gate_path.exists()  # no gate split any more: no stale file


def test_carve_out_larger_than_the_split_is_a_clear_error(paths):
    write_tiny(paths)
    with pytest.raises(DataError, match=r"data\.validation_size=5 must be smaller than the 5 queries of tiny/train"):
        write_carve_out(paths, data_config(size=5).data)
    with pytest.raises(DataError, match=r"data\.validation_size=3 must be smaller than the 3 queries left beside the "
                                        r"gate's 2 of tiny/train .*--set data\.validation_size=1"):
        write_carve_out(paths, data_config(size=3).data.model_copy(update={"gate_size": 2}))
    assert not paths.root.exists()
