"""The seeded carve-out of ``data.train``: pure, deterministic, three disjoint query sets (train-pg, validation,
gate-pg) read back as splits, and a frozen gate that stays apart from training and selection run after run."""

from __future__ import annotations

import random

import pytest
from beir.datasets.data_loader import GenericDataLoader
from tiny_beir import data_config, write_tiny

from pgrank.data.beir import load_qrels, load_split, write_qrels
from pgrank.download.carve_out import carve, write_carve_out
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
    # with no gate, the validation draw is the one a validation carve-out alone always made (the paper's stays)
    assert set(carve(qrels, 10, seed=13).validation) == set(random.Random(13).sample(sorted(qrels), 10))
    with pytest.raises(DataError, match="data.validation_size=50 must be smaller than the 50"):
        carve(qrels, 50, seed=13)
    with pytest.raises(DataError, match="data.validation_size=40 must be smaller than the 35 queries left beside the gate's 15"):
        carve(qrels, 40, seed=13, gate_size=15)
    with pytest.raises(DataError, match="data.gate_size=50 must be smaller than the 50"):
        carve(qrels, 1, seed=13, gate_size=50)


def test_freezing_the_gate_changes_no_split_and_new_judgments_never_reach_it():
    """Run 1 draws the gate; every later run is handed it frozen (data.holdout). Freezing alone changes nothing,
    and as judgments arrive and the other draws move, the gate stays apart from training and validation."""
    qrels = _judgments(f"q{i:03d}" for i in range(60))
    first = carve(qrels, 8, seed=13, gate_size=12)
    frozen = frozenset(first.gate)
    again = carve(qrels, 8, seed=13, gate_size=12, gate=frozen)
    assert (again.train, again.validation, again.gate) == (first.train, first.validation, first.gate)

    runs = [first]
    for new in range(3):  # new queries arrive, and new judgments for known ones (gate queries included)
        qrels = {**qrels, **_judgments(f"new{new}-{i}" for i in range(30))}
        qrels[sorted(frozen)[new]] = {"d-extra": 2, **qrels[sorted(frozen)[new]]}
        runs.append(carve(qrels, 8, seed=13, gate_size=99, gate=frozen))  # a frozen gate: gate_size is not read
    for run in runs:
        assert set(run.gate) == frozen
        assert set(run.train).isdisjoint(frozen) and set(run.validation).isdisjoint(frozen)
        assert set(run.train).isdisjoint(run.validation)
    trained_or_selected = set().union(*(set(r.train) | set(r.validation) for r in runs))
    assert trained_or_selected.isdisjoint(frozen)  # across consecutive runs
    assert runs[-1].gate[sorted(frozen)[0]] == {"d-extra": 2, f"d-{sorted(frozen)[0]}": 1}  # today's judgments
    gone = carve({q: d for q, d in qrels.items() if q != sorted(frozen)[0]}, 8, seed=13, gate=frozen)
    assert set(gone.gate) == frozen - {sorted(frozen)[0]}  # a query no longer judged leaves the gate


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
