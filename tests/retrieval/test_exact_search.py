"""pgrank.retrieval.dense.exact_search: one total order (score desc, id asc), and streamed FAISS search equal to brute force."""

from __future__ import annotations

import numpy as np
import pytest

from pgrank.data.runs import from_order_keys, id_ranks, order_keys, top_k
from pgrank.retrieval.dense.exact_search import dense_search, gpu_available


def brute_force(queries, corpus, doc_ids, k):
    """Reference: every score, sorted by (score desc, id asc) with Python's sort."""
    scores = queries @ corpus.T
    out_s, out_r = [], []
    for row in scores:
        order = sorted(range(len(doc_ids)), key=lambda j: (-row[j], doc_ids[j]))[:k]
        out_s.append(row[order])
        out_r.append(order)
    return np.array(out_s), np.array(out_r)


def blocks_of(corpus, size):
    return ((lo, corpus[lo : lo + size]) for lo in range(0, len(corpus), size))


def test_id_ranks_follow_string_order():
    ids = ["b", "a10", "a9", "c"]
    assert id_ranks(ids).tolist() == [2, 0, 1, 3]  # "a10" < "a9" as strings


def test_order_keys_sort_scores_descending_then_ids_ascending():
    scores = np.array([np.inf, 3, 1, 0.0, -0.0, -1, -3, -np.inf, 1], dtype=np.float32)
    ranks = np.array([0, 0, 5, 0, 1, 0, 0, 0, 2], dtype=np.uint32)
    order = np.argsort(order_keys(scores, ranks)).tolist()
    assert order == [0, 1, 8, 2, 3, 4, 5, 6, 7]
    # 0.0 and -0.0 are the same score: only the id decides between them.
    assert order_keys(np.float32([0.0]), np.uint32([1]))[0] > order_keys(np.float32([-0.0]), np.uint32([0]))[0]


def test_from_order_keys_gives_back_the_scores_and_rows():
    rng = np.random.default_rng(0)
    scores = np.concatenate([rng.normal(size=200), [0.0, -0.0, np.inf, -np.inf, 1e-30, -1e-30]]).astype(np.float32)
    rows = rng.permutation(len(scores))
    doc_ids = [f"d{i}" for i in range(len(scores))]
    ranks = id_ranks(doc_ids)
    id_order = np.argsort(ranks)
    back_scores, back_rows = from_order_keys(order_keys(scores, ranks[rows]), id_order)
    assert back_scores.dtype == np.float32
    np.testing.assert_array_equal(back_rows, rows)
    np.testing.assert_array_equal(back_scores, scores)  # -0.0 comes back as 0.0, an equal score
    keys = np.sort(order_keys(scores, ranks[rows]))  # sorting keys = top_k's order
    want_s, want_r = top_k(scores[None, :], rows[None, :], ranks, len(scores))
    got_s, got_r = from_order_keys(keys, id_order)
    np.testing.assert_array_equal(got_r, want_r[0])
    np.testing.assert_array_equal(got_s, want_s[0])


def test_top_k_breaks_ties_by_document_id():
    doc_ids = ["d3", "d1", "d2", "d0"]
    scores = np.array([[1.0, 2.0, 2.0, 2.0]], dtype=np.float32)
    s, r = top_k(scores, np.arange(4)[None, :], id_ranks(doc_ids), k=2)
    assert [doc_ids[i] for i in r[0]] == ["d0", "d1"]
    assert s[0].tolist() == [2.0, 2.0]


def test_top_k_ignores_padding():
    scores = np.array([[5.0, -np.inf, 1.0]], dtype=np.float32)
    s, r = top_k(scores, np.array([[0, -1, 1]]), id_ranks(["a", "b"]), k=2)
    assert r.tolist() == [[0, 1]]


@pytest.mark.parametrize("block", [7, 16, 200])
@pytest.mark.parametrize("k", [1, 5, 60])
def test_streamed_search_equals_brute_force_with_ties(block, k):
    rng = np.random.default_rng(0)
    corpus = rng.normal(size=(50, 8)).astype(np.float32)
    corpus[10:20] = corpus[3]  # duplicate documents: tied scores across and within blocks
    corpus[40:45] = corpus[25]
    doc_ids = [f"doc{(i * 37) % 50:02d}" for i in range(50)]  # id order differs from row order
    queries = rng.normal(size=(6, 8)).astype(np.float32)
    queries[5] = 0  # every score ties at zero
    want_s, want_r = brute_force(queries, corpus, doc_ids, k)
    got_s, got_r = dense_search(queries, blocks_of(corpus, block), id_ranks(doc_ids), k, use_gpu=False)
    assert got_r.tolist() == want_r.tolist()
    np.testing.assert_allclose(got_s, want_s, rtol=1e-5, atol=1e-5)


def test_many_ties_at_the_cut_off_within_one_block():
    corpus = np.ones((300, 4), dtype=np.float32)
    doc_ids = [f"d{i:03d}" for i in range(300)][::-1]
    s, r = dense_search(np.ones((2, 4), np.float32), blocks_of(corpus, 300), id_ranks(doc_ids), 10, use_gpu=False)
    assert [doc_ids[i] for i in r[0]] == [f"d{i:03d}" for i in range(10)]


@pytest.mark.gpu
def test_gpu_search_agrees_with_cpu():
    if not gpu_available():
        pytest.skip("faiss-gpu with a visible GPU is needed")
    rng = np.random.default_rng(1)
    corpus = rng.normal(size=(5000, 64)).astype(np.float32)
    queries = rng.normal(size=(20, 64)).astype(np.float32)
    ranks = id_ranks([str(i) for i in range(5000)])
    cpu = dense_search(queries, blocks_of(corpus, 1024), ranks, 100, use_gpu=False)
    gpu = dense_search(queries, blocks_of(corpus, 1024), ranks, 100, use_gpu=True)
    assert (cpu[1] == gpu[1]).mean() > 0.99
