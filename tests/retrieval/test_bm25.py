"""pgrank.retrieval.bm25.index: Anserini-like tokenization, deterministic scores and top k."""

from __future__ import annotations

import numpy as np
import pytest

from pgrank.config import Bm25Config
from pgrank.errors import ConfigError
from pgrank.retrieval.bm25.index import bm25_search, build_bm25, make_tokenizer

CORPUS = {
    "d2": {"title": "Fever", "text": "Fever and the immune response."},
    "d1": {"title": "", "text": "Children's fevers: causes of a high temperature."},
    "d3": {"title": "Cats", "text": "Cats sleep a lot."},
    "d0": {"title": "Dogs", "text": "Dogs sleep a lot."},
}


def test_tokenizer_lowercases_strips_possessives_stopwords_and_stems():
    tokenize = make_tokenizer(Bm25Config())
    assert tokenize("The Children's FEVERS, in 2 days: a B-cell test") == ["children", "fever", "2", "day", "b", "cell", "test"]


def test_tokenizer_without_stemming_or_stopwords():
    tokenize = make_tokenizer(Bm25Config(stemmer=None, stopwords=None))
    assert tokenize("The fevers") == ["the", "fevers"]


@pytest.mark.parametrize(("key", "value"), [("stemmer", "klingon"), ("stopwords", "klingon")])
def test_unknown_stemmer_or_stopwords_name_the_key(key, value):
    with pytest.raises(ConfigError, match=f"mine.bm25.{key}: unknown"):
        make_tokenizer(Bm25Config(**{key: value}))


def test_scores_match_the_query_terms():
    index = build_bm25(CORPUS, Bm25Config())
    scores = index.scores("what causes fever?")
    assert index.doc_ids == list(CORPUS)
    assert scores[0] > 0 and scores[1] > scores[0]  # d1 matches "causes" and "fever"
    assert scores[2] == scores[3] == 0
    assert not index.scores("zebra unicorn").any()  # no term in the vocabulary: all zeros


def test_search_ranks_by_score_then_id():
    index = build_bm25(CORPUS, Bm25Config())
    scores, rows = bm25_search(index, ["sleep", "fever", "zebra"], k=3)
    ids = [[index.doc_ids[r] for r in row] for row in rows]
    assert ids[0][:2] == ["d0", "d3"]  # tied scores: smaller id first
    assert ids[1][:2] == ["d2", "d1"]
    assert ids[2] == ["d0", "d1", "d2"] and not scores[2].any()


def test_k_larger_than_the_corpus():
    scores, rows = bm25_search(build_bm25(CORPUS, Bm25Config()), ["fever"], k=100)
    assert rows.shape == (1, 4) and sorted(rows[0]) == [0, 1, 2, 3]


def test_scores_are_identical_from_build_to_build():
    a = build_bm25(CORPUS, Bm25Config()).scores("fever sleep cats")
    b = build_bm25(dict(CORPUS), Bm25Config()).scores("fever sleep cats")
    np.testing.assert_array_equal(a, b)
