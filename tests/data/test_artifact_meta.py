"""pgrank.data.artifact_meta: a folder artifact's meta.json, read and checked in one place."""

from __future__ import annotations

import json
import re

import numpy as np
import pytest

from pgrank.data.artifact_meta import read_meta
from pgrank.data.candidate_store import CandidateStoreWriter, open_candidate_store
from pgrank.data.corpus_store import build_corpus_store, open_corpus_store
from pgrank.errors import DataError

FMT = "pgrank-example/1"


def _read(folder):
    return read_meta(folder, FMT, missing="nothing built here; run the stage", remedy="run the stage again",
                     keys=("num_docs",))


def test_a_complete_artifact_gives_its_meta(tmp_path):
    (tmp_path / "meta.json").write_text(json.dumps({"format": FMT, "num_docs": 3}))
    assert _read(tmp_path) == {"format": FMT, "num_docs": 3}


@pytest.mark.parametrize("text,message", [
    (None, r"{folder}: nothing built here; run the stage$"),
    ('{"format": "pgrank-exa', r"{meta}: not valid JSON \(.*\); a damaged artifact: run the stage again$"),
    (b"\xff\xfe{}", r"{meta}: not valid JSON \(.*\); a damaged artifact: run the stage again$"),
    ("[1, 2]", r"{meta}: a JSON list, not an object; a damaged artifact: run the stage again$"),
    ('{"format": "pgrank-example/2", "num_docs": 3}', r"{meta}: format 'pgrank-example/2', expected 'pgrank-example/1'"),
    ('{"format": "pgrank-example/1"}', r"{meta}: no 'num_docs'; a damaged artifact: run the stage again$"),
], ids=["missing", "cut-short", "not-utf8", "not-an-object", "another-format", "entry-missing"])
def test_a_missing_damaged_or_foreign_meta_names_the_file_and_the_remedy(tmp_path, text, message):
    meta = tmp_path / "meta.json"
    if isinstance(text, bytes):
        meta.write_bytes(text)
    elif text is not None:
        meta.write_text(text)
    pattern = message.format(folder=re.escape(str(tmp_path)), meta=re.escape(str(meta)))
    with pytest.raises(DataError, match=pattern):
        _read(tmp_path)


def test_the_stores_report_a_damaged_meta_as_a_data_error(tmp_path):
    """The corpus and candidate stores read their meta.json through read_meta: a file cut short is an
    error naming it and what to do, not a traceback."""
    corpus = tmp_path / "corpus.jsonl"
    corpus.write_text('{"_id": "d1", "text": "a"}\n{"_id": "d2", "text": "b"}\n')
    build_corpus_store(corpus, tmp_path / "store", dataset="toy", corpus_sha256="0" * 64)
    with CandidateStoreWriter(tmp_path / "sets", {}) as out:
        out.add("q1", "a query", np.array([0, 1]), np.array([1, 0]))
    assert len(open_corpus_store(tmp_path / "store", corpus)) == 2 and open_candidate_store(tmp_path / "sets").pairs == 2

    for folder in (tmp_path / "store", tmp_path / "sets"):
        (folder / "meta.json").write_text('{"format": ')
    with pytest.raises(DataError, match=r"store/meta.json: not valid JSON .*: delete .*store and the next stage"):
        open_corpus_store(tmp_path / "store", corpus)
    with pytest.raises(DataError, match=r"sets/meta.json: not valid JSON .*: mine again"):
        open_candidate_store(tmp_path / "sets")
