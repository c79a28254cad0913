"""The seeded validation carve-out of ``data.train``: pure, deterministic, read back as ``train-pg`` and ``validation``."""

from __future__ import annotations

import pytest
from beir.datasets.data_loader import GenericDataLoader
from tiny_beir import data_config, write_tiny

from pgrank.data.beir import load_qrels, load_split
from pgrank.download.carve_out import carve_validation, write_carve_out
from pgrank.errors import DataError
from pgrank.paths import CARVED_TRAIN, VALIDATION, Paths


@pytest.fixture
def paths(tmp_path) -> Paths:
    return Paths.from_config(data_config().paths, base=tmp_path)


def test_carve_validation_is_seeded_disjoint_complete_and_pure():
    qrels = {f"q{i}": {f"d{i}": 1} for i in range(50)}
    original = {q: dict(d) for q, d in qrels.items()}
    train, validation = carve_validation(qrels, 10, seed=13)
    assert qrels == original
    assert len(validation) == 10 and set(train).isdisjoint(validation) and {**train, **validation} == qrels
    assert list(train) == [q for q in qrels if q in train]  # input order kept
    assert carve_validation(dict(reversed(list(qrels.items()))), 10, seed=13)[1].keys() == validation.keys()
    assert carve_validation(qrels, 10, seed=14)[1].keys() != validation.keys()
    with pytest.raises(DataError, match="must be smaller than the 50"):
        carve_validation(qrels, 50, seed=13)


def test_write_carve_out_writes_beir_qrels_read_back_as_train_pg_and_validation(paths):
    write_tiny(paths)
    params = data_config(size=2)
    carve = write_carve_out(paths, params.data)
    assert (carve.train_queries, carve.validation_queries) == (3, 2)
    first = carve.validation_path.read_bytes()
    assert first.startswith(b"query-id\tcorpus-id\tscore\r\n")
    train = load_split(paths, "tiny", CARVED_TRAIN, progress=False)
    validation = load_split(paths, "tiny", VALIDATION, progress=False)
    beir_train = load_qrels(paths.dataset("tiny") / "qrels" / "train.tsv")
    assert set(train.qrels).isdisjoint(validation.qrels) and {**train.qrels, **validation.qrels} == beir_train
    assert set(validation.queries) == set(validation.qrels)
    # BEIR reads the carved files too
    assert GenericDataLoader(data_folder=str(paths.dataset("tiny")), qrels_file=str(carve.validation_path)) \
        .load_custom()[2] == validation.qrels
    write_carve_out(paths, params.data)
    assert carve.validation_path.read_bytes() == first  # deterministic
    assert not list(carve.validation_path.parent.glob(".*"))  # no temporaries left


def test_carve_out_larger_than_the_split_is_a_clear_error(paths):
    write_tiny(paths)
    with pytest.raises(DataError, match=r"data\.validation_size=5 must be smaller than the 5 queries of tiny/train"):
        write_carve_out(paths, data_config(size=5).data)
    assert not paths.root.exists()
