"""pgrank.retrieval.dense.query_embeddings: a query text is encoded once per model, whatever call it comes in."""

from __future__ import annotations

import numpy as np
import pytest

from pgrank.retrieval.dense.query_embeddings import KEYS, VECTORS, QueryEmbeddings


class Encoder:
    """A deterministic stand-in for a model's ``encode_query``: one row per text, counting the texts it saw."""

    def __init__(self, dim: int = 4):
        self.dim, self.seen = dim, []

    def __call__(self, texts: list[str]) -> np.ndarray:
        self.seen += texts
        return np.array([[len(t), sum(map(ord, t)) % 97, i % 3, 1.0][: self.dim] for i, t in enumerate(texts)],
                        dtype=np.float32)


def test_kept_texts_are_not_encoded_again_in_any_call_or_process(tmp_path):
    enc = Encoder()
    store = QueryEmbeddings(tmp_path / "q")
    first = store.encode(["a", "bb", "ccc"], enc)
    assert enc.seen == ["a", "bb", "ccc"]
    again = store.encode(["ccc", "dddd", "a", "dddd"], enc)  # two kept, one new twice
    assert enc.seen == ["a", "bb", "ccc", "dddd"]
    np.testing.assert_array_equal(again[[0, 2]], first[[2, 0]])
    np.testing.assert_array_equal(again[1], again[3])
    reopened = QueryEmbeddings(tmp_path / "q")  # another process: the shards on disk
    fresh = Encoder()
    out = reopened.encode(["dddd", "bb", "a"], fresh)
    assert fresh.seen == []
    np.testing.assert_array_equal(out, np.stack([again[1], first[1], first[0]]))
    assert out.dtype == np.float32 and out.shape == (3, 4)


def test_a_shard_without_its_keys_is_not_trusted_and_is_written_again(tmp_path):
    enc = Encoder()
    QueryEmbeddings(tmp_path / "q").encode(["x", "y"], enc)
    [keys] = (tmp_path / "q").glob(f"*{KEYS}")
    keys.unlink()  # killed between the two writes: the vectors alone mean nothing
    again = Encoder()
    QueryEmbeddings(tmp_path / "q").encode(["x", "y"], again)
    assert again.seen == ["x", "y"]
    assert len(list((tmp_path / "q").glob(f"*{KEYS}"))) == len(list((tmp_path / "q").glob(f"*{VECTORS}"))) == 1


def test_texts_that_differ_anywhere_are_different_queries(tmp_path):
    enc = Encoder()
    store = QueryEmbeddings(tmp_path / "q")
    store.encode(["fever", "Fever", "fever ", "févér"], enc)
    assert len(enc.seen) == 4
    store.encode(["fever", "Fever", "fever ", "févér"], enc)
    assert len(enc.seen) == 4


def test_an_encoder_that_returns_the_wrong_shape_writes_nothing(tmp_path):
    store = QueryEmbeddings(tmp_path / "q")
    with pytest.raises(ValueError, match="shape"):
        store.encode(["a", "b"], lambda texts: np.zeros((1, 4), np.float32))
    assert not (tmp_path / "q").exists() or not list((tmp_path / "q").iterdir())


def test_kept_vectors_of_another_dimension_are_an_error_that_says_what_to_remove(tmp_path):
    QueryEmbeddings(tmp_path / "q").encode(["a"], Encoder(dim=4))
    with pytest.raises(ValueError, match="remove the folder"):
        QueryEmbeddings(tmp_path / "q").encode(["a", "b"], Encoder(dim=3))
