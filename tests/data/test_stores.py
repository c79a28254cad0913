"""pgrank.data.corpus_store and pgrank.data.candidate_store: the on-disk stores every stage reads by row."""

from __future__ import annotations

import json
import zipfile
from pathlib import Path

import numpy as np
import pytest

import pgrank.data.corpus_store as corpus_store
from pgrank.data.beir import document_text, load_corpus
from pgrank.data.candidate_store import CandidateStoreWriter, open_candidate_store
from pgrank.data.corpus_store import build_corpus_store
from pgrank.data.runs import id_ranks
from pgrank.errors import DataError


def _write(folder: Path, lines: list[str]) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / "corpus.jsonl"
    path.write_text("".join(line + "\n" for line in lines))
    return path


def _doc(doc_id, text="t", title=None):
    return json.dumps({"_id": doc_id, "text": text, **({"title": title} if title is not None else {})})


def test_the_store_reads_like_beir_on_nfcorpus(beir_mirror, tmp_path):
    with zipfile.ZipFile(beir_mirror / "nfcorpus.zip") as zf:
        zf.extractall(tmp_path)
    corpus = load_corpus(tmp_path / "nfcorpus", progress=False)
    store = build_corpus_store(tmp_path / "nfcorpus" / "corpus.jsonl", tmp_path / "store", dataset="nfcorpus",
                               corpus_sha256="0" * 64)
    ids = list(corpus)
    assert len(store) == len(ids) == 3633 and list(store.ids) == ids
    np.testing.assert_array_equal(store.rows(ids[::-1]), np.arange(len(ids))[::-1])
    np.testing.assert_array_equal(store.id_ranks, id_ranks(ids))  # the run order's tie-break
    np.testing.assert_array_equal(store.id_order, np.argsort(np.asarray(ids, dtype=str), kind="stable"))
    rows = [17, 3000, 5, 17]
    assert store.texts(rows) == [document_text(corpus[ids[r]]) for r in rows]
    assert [t for _, block in store.text_blocks(block=1000) for t in block] == [document_text(corpus[d]) for d in ids]
    assert store.records([5]) == [{"title": corpus[ids[5]]["title"], "text": corpus[ids[5]]["text"]}]


def test_ids_blank_lines_missing_titles_and_unknown_ids(tmp_path):
    path = _write(tmp_path / "c", [_doc("b", "two", "T"), "", _doc("a", " one "), "   ", _doc("é", "three", "")])
    store = build_corpus_store(path, tmp_path / "s", dataset="c", corpus_sha256="0" * 64)
    assert list(store.ids) == ["b", "a", "é"] and store.texts([0, 1, 2]) == ["T two", "one", "three"]
    assert store.rows(["é", "zz", "a"]).tolist() == [2, -1, 1]
    assert "a" in store and "zz" not in store
    assert store.id_ranks.tolist() == [1, 0, 2]


def test_ids_sharing_a_hash_are_told_apart(tmp_path, monkeypatch):
    monkeypatch.setattr(corpus_store, "id_hash", lambda doc_id: 7)  # every id collides
    path = _write(tmp_path / "c", [_doc(f"d{i}") for i in range(50)])
    store = build_corpus_store(path, tmp_path / "s", dataset="c", corpus_sha256="0" * 64)
    assert store.rows(["d49", "d0", "d17", "nope"]).tolist() == [49, 0, 17, -1]


@pytest.mark.parametrize(("lines", "message"), [
    ([_doc("a"), _doc("b"), "", _doc("a")], r"corpus.jsonl:4: duplicate _id 'a' \(first on line 1\)"),
    ([_doc("a"), "{not json"], r"corpus.jsonl:2: not a valid JSON line"),
    ([_doc("a"), json.dumps({"_id": "b", "text": 3})], r"corpus.jsonl:2: expected a string \"text\""),
    (["", "  "], r"corpus.jsonl: empty corpus"),
])
def test_a_bad_corpus_names_file_and_line_and_leaves_nothing(tmp_path, lines, message):
    path = _write(tmp_path / "c", lines)
    with pytest.raises(DataError, match=message):
        build_corpus_store(path, tmp_path / "s", dataset="c", corpus_sha256="0" * 64)
    assert not (tmp_path / "s").exists() and not [p for p in tmp_path.iterdir() if p.name.startswith(".s.")]


def test_open_corpus_builds_once_and_keys_by_content(tmp_path, monkeypatch):
    from pgrank.paths import Paths

    paths = Paths(root=tmp_path / "runs", data=tmp_path / "data", embeddings=tmp_path / "emb")
    _write(paths.dataset("c"), [_doc("a"), _doc("b")])
    first = corpus_store.open_corpus(paths, "c")
    monkeypatch.setattr(corpus_store, "build_corpus_store", lambda *a, **k: pytest.fail("rebuilt"))
    assert corpus_store.open_corpus(paths, "c").folder == first.folder
    monkeypatch.undo()
    _write(paths.dataset("c"), [_doc("a"), _doc("b"), _doc("c")])  # new content: a new store
    again = corpus_store.open_corpus(paths, "c")
    assert again.folder != first.folder and len(again) == 3
    with pytest.raises(DataError, match="dataset 'nope' is not downloaded"):
        corpus_store.open_corpus(paths, "nope")


# --------------------------------------------------------------------------------------- candidate store


def _candidates(folder: Path, sets: dict) -> None:
    with CandidateStoreWriter(folder, {"dataset": "x", "split": "test"}) as out:
        for qid in sorted(sets):
            rows, grades = sets[qid]
            out.add(qid, f"text of {qid}", np.array(rows), np.array(grades))


def test_candidate_store_round_trip(tmp_path):
    sets = {"q2": ([5, 1, 9], [0, 2, 0]), "q10": ([3], [1]), "q1": ([], [])}
    _candidates(tmp_path / "s", sets)
    store = open_candidate_store(tmp_path / "s")
    assert list(store.qids) == ["q1", "q10", "q2"] and store.pairs == 4 and len(store) == 3
    assert store.index("q2") == 2 and store.index("q3") is None
    rows, grades = store.candidates(2)
    assert rows.tolist() == [5, 1, 9] and grades.tolist() == [0, 2, 0]
    assert rows.dtype == np.int32 and grades.dtype == np.int8
    assert store.queries[1] == "text of q10" and store.sizes().tolist() == [0, 1, 3]
    assert store.meta["min_size"] == 0 and store.meta["max_size"] == 3


def test_candidate_store_digest_follows_the_content(tmp_path):
    """meta.json's sha256 (what the trainer's fingerprint compares) changes with a grade, a row, a query's
    text or one more set, and with nothing else (not the folder)."""
    sets = {"q1": ([5, 1, 9], [0, 2, 0]), "q2": ([3], [1])}
    digest = {}
    for name, variant in {"same": sets, "copy": dict(sets), "grade": {**sets, "q2": ([3], [2])},
                          "row": {**sets, "q2": ([4], [1])}, "more": {**sets, "q3": ([7], [0])}}.items():
        _candidates(tmp_path / name, variant)
        digest[name] = open_candidate_store(tmp_path / name).meta["sha256"]
    assert digest["same"] == digest["copy"]
    assert len({digest[k] for k in ("same", "grade", "row", "more")}) == 4
    with CandidateStoreWriter(tmp_path / "text", {}) as out:
        for qid in sorted(sets):
            out.add(qid, f"another text of {qid}", np.array(sets[qid][0]), np.array(sets[qid][1]))
    assert open_candidate_store(tmp_path / "text").meta["sha256"] != digest["same"]


def test_candidate_store_is_all_or_nothing_and_checks_order(tmp_path):
    with pytest.raises(DataError, match="sorted id order"):
        with CandidateStoreWriter(tmp_path / "s", {}) as out:
            out.add("b", "", np.array([1]), np.array([0]))
            out.add("a", "", np.array([2]), np.array([0]))
    assert not (tmp_path / "s").exists()
    with pytest.raises(DataError, match="no candidate sets"):
        open_candidate_store(tmp_path / "s")


def _memory() -> dict[str, int]:
    fields = {}
    for line in Path("/proc/self/status").read_text().splitlines():
        key, _, value = line.partition(":")
        if key in ("RssAnon", "RssFile"):
            fields[key] = int(value.split()[0]) * 1024
    return fields


@pytest.mark.skipif(not Path("/proc/self/status").is_file(), reason="needs Linux /proc")
def test_reading_every_candidate_costs_no_private_memory(tmp_path):
    """Training and evaluation memory-map the store: reading all of it grows shared file pages (which every
    DDP rank shares through the page cache), not this process's private memory."""
    from pgrank.training.batches import TrainingSet

    queries, per_query = 3_000, 4_000  # 12M pairs: 60 MB of columns
    rng = np.random.default_rng(0)
    with CandidateStoreWriter(tmp_path / "s", {}) as out:
        for q in range(queries):
            out.add(f"q{q:05d}", "query", rng.integers(0, 8_000_000, per_query), (rng.random(per_query) < 0.001))
    store = open_candidate_store(tmp_path / "s")
    size = store.pairs * 5
    before = _memory()
    examples = TrainingSet(store)
    touched = 0
    for i in range(len(examples)):
        ex = examples[i]
        touched += int(ex.rows[-1]) + int(ex.relevance.sum())
    after = _memory()
    assert touched and store.pairs == queries * per_query
    assert after["RssAnon"] - before["RssAnon"] < 0.1 * size, (before, after, size)
    assert after["RssFile"] - before["RssFile"] > 0.5 * size  # the pages were read, as shared file pages
