"""pgrank.retrieval.bm25: bm25s' tokenizer with Anserini-like analysis, the index artifact, exact top k."""

from __future__ import annotations

import json
import random

import numpy as np
import pytest

import pgrank.retrieval.bm25.index as bm25
from pgrank.config import Bm25Config
from pgrank.data.corpus_store import build_corpus_store
from pgrank.data.runs import top_k
from pgrank.errors import ConfigError
from pgrank.retrieval.bm25.index import build_bm25_index, make_tokenizer

CORPUS = {
    "d2": {"title": "Fever", "text": "Fever and the immune response."},
    "d1": {"title": "", "text": "Children's fevers: causes of a high temperature."},
    "d3": {"title": "Cats", "text": "Cats sleep a lot."},
    "d0": {"title": "Dogs", "text": "Dogs sleep a lot."},
}


def _store(tmp_path, corpus=CORPUS, name="c"):
    (tmp_path / name).mkdir(parents=True, exist_ok=True)
    path = tmp_path / name / "corpus.jsonl"
    path.write_text("".join(json.dumps({"_id": d, **v}) + "\n" for d, v in corpus.items()))
    return build_corpus_store(path, tmp_path / f"{name}-store", dataset=name, corpus_sha256="0" * 64)


def _tokens(cfg: Bm25Config, text: str) -> list[str]:
    tokenizer = make_tokenizer(cfg)
    (ids,) = tokenizer.streaming_tokenize([text], update_vocab=True, allow_empty=False)
    vocab = tokenizer.stem_to_sid if cfg.stemmer else tokenizer.word_to_id
    names = {i: t for t, i in vocab.items()}
    return [names[i] for i in ids]


def test_tokenizer_lowercases_strips_possessives_stopwords_and_stems():
    assert _tokens(Bm25Config(), "The Children's FEVERS, in 2 days: a B-cell test") == [
        "children", "fever", "2", "day", "b", "cell", "test"]


def test_tokenizer_without_stemming_or_stopwords():
    assert _tokens(Bm25Config(stemmer=None, stopwords=None), "The fevers") == ["the", "fevers"]


@pytest.mark.parametrize(("key", "value"), [("stemmer", "klingon"), ("stopwords", "klingon")])
def test_unknown_stemmer_or_stopwords_name_the_key(key, value):
    with pytest.raises(ConfigError, match=f"mine.bm25.{key}: unknown"):
        make_tokenizer(Bm25Config(**{key: value}))


def test_scores_match_the_query_terms(tmp_path):
    index = build_bm25_index(_store(tmp_path), Bm25Config(), tmp_path / "bm25")
    scores = index.scores(index.token_ids(["what causes fever?"])[0])
    assert scores[0] > 0 and scores[1] > scores[0]  # d1 matches "causes" and "fever"
    assert scores[2] == scores[3] == 0
    assert index.token_ids(["zebra unicorn"]) == [[]]  # no term in the vocabulary
    assert not index.scores([]).any()


def test_search_ranks_by_score_then_id(tmp_path):
    store = _store(tmp_path)
    index = build_bm25_index(store, Bm25Config(), tmp_path / "bm25")
    scores, rows = index.search(index.token_ids(["sleep", "fever", "zebra"]), k=3)
    ids = [store.ids.take(row) for row in rows]
    assert ids[0][:2] == ["d0", "d3"]  # tied scores: smaller id first
    assert ids[1][:2] == ["d2", "d1"]
    assert ids[2] == ["d0", "d1", "d2"] and not scores[2].any()


def test_k_larger_than_the_corpus(tmp_path):
    index = build_bm25_index(_store(tmp_path), Bm25Config(), tmp_path / "bm25")
    scores, rows = index.search(index.token_ids(["fever"]), k=100)
    assert rows.shape == (1, 4) and sorted(rows[0]) == [0, 1, 2, 3]


def _tied_corpus(n: int = 400, seed: int = 0) -> dict:
    """Short documents over a tiny vocabulary: BM25 scores tie everywhere, also across the cut-off."""
    rng = random.Random(seed)
    words = "alpha beta gamma delta eps zeta eta theta".split()
    return {f"doc{rng.randrange(10**6)}-{i}": {"title": "", "text": " ".join(rng.choices(words, k=rng.choice([2, 3])))}
            for i in range(n)}


@pytest.mark.parametrize("k", [1, 7, 50, 399, 400])
def test_search_is_the_exact_run_order_under_heavy_ties(tmp_path, k):
    store = _store(tmp_path, _tied_corpus())
    index = build_bm25_index(store, Bm25Config(), tmp_path / "bm25")
    queries = index.token_ids(["alpha", "beta gamma", "zeta zeta eta", "nothing", "theta alpha beta"])
    scores, rows = index.search(queries, k)
    everyone = np.arange(len(store))[None, :]
    for i, q in enumerate(queries):
        want_s, want_r = top_k(index.scores(q)[None, :], everyone, store.id_ranks, k)
        np.testing.assert_array_equal(rows[i], want_r[0])
        np.testing.assert_array_equal(scores[i], want_s[0])
        np.testing.assert_array_equal(index.pair_scores(q, rows[i]), scores[i])  # pair scores = search scores


@pytest.mark.slow
def test_the_batched_numba_path_equals_the_exact_path(tmp_path, monkeypatch):
    """bm25s' numba retrieval (about 30 s of JIT compilation), search_depth(k) deep, completed exactly: the same runs."""
    store = _store(tmp_path, _tied_corpus(3000))
    index = build_bm25_index(store, Bm25Config(), tmp_path / "bm25")
    queries = index.token_ids(["alpha", "beta gamma", "zeta zeta eta", "nothing", "theta alpha beta"] * 5)
    small = index.search(queries, 40)
    monkeypatch.setattr(bm25, "NUMBA_WORK", 0)
    large = index.search(queries, 40)
    np.testing.assert_array_equal(small[1], large[1])
    np.testing.assert_array_equal(small[0], large[0])


def test_the_index_is_built_once_per_corpus_and_settings(tmp_path, monkeypatch):
    from pgrank.paths import Paths

    paths = Paths(root=tmp_path / "runs", data=tmp_path / "data", embeddings=tmp_path / "emb")
    folder = paths.dataset("c")
    folder.mkdir(parents=True)
    (folder / "corpus.jsonl").write_text("".join(json.dumps({"_id": d, **v}) + "\n" for d, v in CORPUS.items()))
    first = bm25.bm25_index(paths, "c", Bm25Config())
    files = {p.name: p.read_bytes() for p in first.folder.iterdir()}
    monkeypatch.setattr(bm25, "build_bm25_index", lambda *a, **k: pytest.fail("rebuilt the index"))
    again = bm25.bm25_index(paths, "c", Bm25Config())  # mining and evaluation open the same artifact
    assert again.folder == first.folder
    np.testing.assert_array_equal(again.scores(again.token_ids(["fever"])[0]), first.scores(first.token_ids(["fever"])[0]))
    monkeypatch.undo()
    other = bm25.bm25_index(paths, "c", Bm25Config(k1=1.2))  # other settings: another artifact
    assert other.folder != first.folder and other.folder.parent == first.folder.parent
    # deterministic: a rebuild writes identical bytes
    rebuilt = build_bm25_index(bm25.open_corpus(paths, "c"), Bm25Config(), tmp_path / "again")
    assert {p.name: p.read_bytes() for p in rebuilt.folder.iterdir()} == files
