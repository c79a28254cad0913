"""Loading BEIR folders (equal to ``GenericDataLoader``), errors naming file and line, split names, writing qrels.

The carve-out that writes ``train-pg`` and ``validation`` is tested in tests/download/test_carve_out.py.
"""

from __future__ import annotations

import hashlib
import logging
import os
from pathlib import Path

import pytest
from beir.datasets.data_loader import GenericDataLoader
from tiny_beir import CORPUS, QUERIES, TEST, data_config, write_tiny

from pgrank.data.beir import (
    load_corpus,
    load_qrels,
    load_split,
    load_topics,
    qrels_path,
    write_qrels,
)
from pgrank.data.checksums import corpus_sha256
from pgrank.download.beir_datasets import fetch_dataset, read_sha256sums
from pgrank.download.mirror import resolve_source
from pgrank.errors import DataError
from pgrank.paths import CARVED_TRAIN, VALIDATION, Paths

SCIFACT_CORPUS_SHA256 = "dec31c8182f3d744c7d2c09423756fd1d17cbef75808db13ba01cc0aab4d1ac6"  # shared README


def beir(folder: Path, split: str):
    return GenericDataLoader(data_folder=str(folder)).load(split=split)


@pytest.fixture(scope="module")
def real(tmp_path_factory, beir_mirror) -> Paths:
    """scifact and nfcorpus from the shared mirror, downloaded once for this module."""
    base = tmp_path_factory.mktemp("real")
    paths = Paths.from_config(data_config().paths, base=base)
    source = resolve_source(str(beir_mirror))
    for name in ("scifact", "nfcorpus"):
        fetch_dataset(name, paths.dataset(name), source, read_sha256sums(source), progress=False)
    return paths


@pytest.fixture
def paths(tmp_path) -> Paths:
    return Paths.from_config(data_config().paths, base=tmp_path)


def listing(folder: Path) -> dict[str, str]:
    return {str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in folder.rglob("*") if p.is_file()}


# --------------------------------------------------------------------------------------- real data


@pytest.mark.integration
def test_scifact_test_equals_generic_data_loader(real):
    split = load_split(real, "scifact", "test", progress=False)
    corpus, queries, qrels = beir(real.dataset("scifact"), "test")
    assert (split.corpus, split.queries, split.qrels) == (corpus, queries, qrels)
    assert list(split.queries) == list(queries)  # same order: the qrels' order
    assert len(split.corpus) == 5183 and len(split.queries) == 300
    assert sum(map(len, split.qrels.values())) == 339
    assert load_corpus(real.dataset("scifact"), progress=False) == GenericDataLoader(
        str(real.dataset("scifact"))).load_corpus()


@pytest.mark.integration
@pytest.mark.parametrize("split, n_queries, n_judgments, grades", [
    ("test", 323, 12334, {1, 2}),
    ("dev", 324, 11385, {1, 2}),
    ("train", 2590, 110575, {1}),
])
def test_nfcorpus_graded_qrels_equal_generic_data_loader(real, split, n_queries, n_judgments, grades):
    queries, qrels = load_topics(real, "nfcorpus", split)
    _, beir_queries, beir_qrels = beir(real.dataset("nfcorpus"), split)
    assert (queries, qrels) == (beir_queries, beir_qrels)
    assert len(queries) == n_queries and sum(map(len, qrels.values())) == n_judgments
    assert {s for docs in qrels.values() for s in docs.values()} == grades
    assert all(type(s) is int for docs in qrels.values() for s in docs.values())


@pytest.mark.integration
def test_corpus_sha256_uses_the_download_record_until_the_file_changes(real, monkeypatch):
    folder = real.dataset("scifact")
    assert corpus_sha256(folder) == SCIFACT_CORPUS_SHA256
    monkeypatch.setattr("pgrank.data.checksums.file_sha256", lambda path: pytest.fail("record should have been used"))
    assert corpus_sha256(folder) == SCIFACT_CORPUS_SHA256
    monkeypatch.undo()
    st = (folder / "corpus.jsonl").stat()
    os.utime(folder / "corpus.jsonl", ns=(st.st_atime_ns, st.st_mtime_ns + 1))  # now untrusted: hashed again
    assert corpus_sha256(folder) == SCIFACT_CORPUS_SHA256


# --------------------------------------------------------------------------------------- contract


def test_tiny_folder_equals_generic_data_loader(paths):
    folder = write_tiny(paths)
    for split in ("test", "train"):
        loaded = load_split(paths, "tiny", split, progress=False)
        assert (loaded.corpus, loaded.queries, loaded.qrels) == beir(folder, split)
    test = load_split(paths, "tiny", "test", progress=False)
    assert test.qrels == {"q1": {"d1": 2, "d3": 1}, "q2": {"d3": 0}, "q3": {"d2": 1}}  # CRLF, header, grades kept
    assert test.queries == {"q1": "query 1", "q2": "query 2", "q3": "query 3"}  # only the split's queries
    assert test.corpus["d2"] == {"title": "", "text": "Café culture."}


def test_repeated_qrels_pair_keeps_the_last_score_as_beir_does(paths):
    folder = write_tiny(paths, test=TEST + [("q1", "d1", 1)])
    assert load_qrels(folder / "qrels" / "test.tsv") == beir(folder, "test")[2]
    assert load_qrels(folder / "qrels" / "test.tsv")["q1"]["d1"] == 1


def test_missing_title_reads_as_empty_string(paths):
    write_tiny(paths, corpus=CORPUS + ['{"_id": "d5", "text": "No title."}'])
    assert load_corpus(paths.dataset("tiny"), progress=False)["d5"] == {"title": "", "text": "No title."}


@pytest.mark.parametrize("kwargs, message", [
    pytest.param({"corpus": CORPUS[:2] + ['{"_id": "d3" "text": "x"}']},
                 r"tiny/corpus\.jsonl:3: not a valid JSON line", id="malformed-corpus"),
    pytest.param({"corpus": CORPUS + ["[1, 2]"]},
                 r"tiny/corpus\.jsonl:5: expected a JSON object", id="not-an-object"),
    pytest.param({"corpus": CORPUS + ['{"text": "x"}']},
                 r"tiny/corpus\.jsonl:5: expected a non-empty string \"_id\"", id="no-id"),
    pytest.param({"corpus": CORPUS + ['{"_id": "d9", "title": "x"}']},
                 r"tiny/corpus\.jsonl:5: expected a string \"text\"", id="no-text"),
    pytest.param({"corpus": CORPUS + [CORPUS[1]]},
                 r"tiny/corpus\.jsonl:5: duplicate _id 'd2' \(first on line 2\)", id="duplicate-doc"),
    pytest.param({"corpus": []},
                 r"tiny/corpus\.jsonl: empty corpus", id="empty-corpus"),
    pytest.param({"queries": QUERIES[:3] + ["{"]},
                 r"tiny/queries\.jsonl:4: not a valid JSON line", id="malformed-query"),
    pytest.param({"queries": QUERIES + [QUERIES[0]]},
                 r"tiny/queries\.jsonl:8: duplicate _id 'q1' \(first on line 1\)", id="duplicate-query"),
    pytest.param({"test": TEST + [("q3", "d1", "1.5")]},
                 r"tiny/qrels/test\.tsv:6: score '1\.5' is not an integer", id="bad-score"),
    pytest.param({"test": TEST + [("q3", "d1")]},
                 r"tiny/qrels/test\.tsv:6: expected query-id<TAB>corpus-id<TAB>score", id="short-row"),
    pytest.param({"test": TEST + [("q99", "d1", 1)]},
                 r"qrels/test\.tsv: 1 judged queries have no text .*q99", id="query-without-text"),
])
def test_malformed_files_name_file_and_line_and_change_nothing(paths, kwargs, message):
    folder = write_tiny(paths, **kwargs)
    before = listing(folder)
    with pytest.raises(DataError, match=message):
        load_split(paths, "tiny", "test", progress=False)
    assert listing(folder) == before


def test_judgments_of_missing_documents_are_kept_and_reported(paths, caplog):
    write_tiny(paths, test=TEST + [("q2", "gone-1", 1), ("q3", "gone-2", 1)])
    with caplog.at_level(logging.WARNING, logger="pgrank.data.beir"):
        split = load_split(paths, "tiny", "test", progress=False)
    assert split.qrels["q2"]["gone-1"] == 1
    assert "tiny/test: 2 judgments point at documents missing from the corpus" in caplog.text


def test_missing_dataset_or_split_is_explained(paths):
    with pytest.raises(DataError, match=r"dataset 'tiny' is not downloaded; run `pgrank download tiny`"):
        load_split(paths, "tiny", "test")
    write_tiny(paths)
    with pytest.raises(DataError, match=r"tiny has no split 'dev'; it has test, train"):
        load_split(paths, "tiny", "dev")
    with pytest.raises(DataError, match=r"no validation carve-out for 'tiny'"):
        load_split(paths, "tiny", VALIDATION)
    with pytest.raises(DataError, match=r"split name '\.\./x'"):
        qrels_path(paths, "tiny", "../x")


# --------------------------------------------------------------------------------------- split names, writing qrels


def test_split_naming_rule(paths):
    assert qrels_path(paths, "msmarco", "train") == paths.dataset("msmarco") / "qrels" / "train.tsv"
    assert qrels_path(paths, "msmarco", CARVED_TRAIN) == paths.carved_qrels("msmarco", "train")
    assert qrels_path(paths, "msmarco", VALIDATION) == paths.carved_qrels("msmarco", "validation")


def test_write_qrels_round_trips(tmp_path):
    qrels = {"q1": {"d1": 2, "d2": 0}, "q 2": {"d\t3": 1}}
    write_qrels(tmp_path / "x.tsv", qrels)
    assert load_qrels(tmp_path / "x.tsv") == qrels
    beir = GenericDataLoader(data_folder=str(tmp_path), qrels_file=str(tmp_path / "x.tsv"))
    beir._load_qrels()  # BEIR reads the file the test wrote into its own qrels (the method returns nothing)
    assert beir.qrels == qrels
