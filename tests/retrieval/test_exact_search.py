"""pgrank.retrieval.dense.exact_search: one total order (score desc, id asc), streamed search equal to brute force
with every backend (torch, NumPy, FAISS), and approximate FAISS indexes in the same order."""

from __future__ import annotations

import subprocess
import sys
import warnings

import numpy as np
import pytest

from pgrank.data.runs import from_order_keys, id_ranks, order_keys, top_k
from pgrank.errors import PgrankError
from pgrank.retrieval.dense import exact_search
from pgrank.retrieval.dense.exact_search import auto_search_backend, dense_search, faiss_gpu_available, resolve_backend

BACKENDS = ["torch", "numpy", "faiss"]


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


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("block", [7, 16, 200])
@pytest.mark.parametrize("k", [1, 5, 60])
def test_streamed_search_equals_brute_force_with_ties(block, k, backend):
    rng = np.random.default_rng(0)
    corpus = rng.normal(size=(50, 8)).astype(np.float32)
    corpus[10:20] = corpus[3]  # duplicate documents: tied scores across and within blocks
    corpus[40:45] = corpus[25]
    doc_ids = [f"doc{(i * 37) % 50:02d}" for i in range(50)]  # id order differs from row order
    queries = rng.normal(size=(6, 8)).astype(np.float32)
    queries[5] = 0  # every score ties at zero
    want_s, want_r = brute_force(queries, corpus, doc_ids, k)
    got_s, got_r = dense_search(queries, blocks_of(corpus, block), id_ranks(doc_ids), k, backend=backend, use_gpu=False)
    assert got_r.tolist() == want_r.tolist()
    np.testing.assert_allclose(got_s, want_s, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("backend", BACKENDS)
def test_many_ties_at_the_cut_off_within_one_block(backend):
    corpus = np.ones((300, 4), dtype=np.float32)
    doc_ids = [f"d{i:03d}" for i in range(300)][::-1]
    s, r = dense_search(np.ones((2, 4), np.float32), blocks_of(corpus, 300), id_ranks(doc_ids), 10, backend=backend,
                        use_gpu=False)
    assert [doc_ids[i] for i in r[0]] == [f"d{i:03d}" for i in range(10)]


@pytest.mark.gpu
def test_faiss_gpu_search_agrees_with_cpu():
    if not faiss_gpu_available():
        pytest.skip("faiss-gpu with a visible GPU is needed (pip install 'pgrank[gpu]')")
    rng = np.random.default_rng(1)
    corpus = rng.normal(size=(5000, 64)).astype(np.float32)
    queries = rng.normal(size=(20, 64)).astype(np.float32)
    ranks = id_ranks([str(i) for i in range(5000)])
    cpu = dense_search(queries, blocks_of(corpus, 1024), ranks, 100, backend="faiss", use_gpu=False)
    gpu = dense_search(queries, blocks_of(corpus, 1024), ranks, 100, backend="faiss-gpu")
    assert (cpu[1] == gpu[1]).mean() > 0.99


@pytest.mark.gpu
def test_torch_search_on_cuda_equals_the_brute_force_bitwise_with_ties():
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("a CUDA device is needed")
    rng = np.random.default_rng(2)
    corpus = integer_corpus(rng, 3000)
    queries = rng.integers(-2, 3, size=(50, 16)).astype(np.float32)
    doc_ids = [f"doc{(i * 7919) % 3000:04d}" for i in range(3000)]
    want_s, want_r = brute_force(queries, corpus, doc_ids, 40)
    got_s, got_r = dense_search(queries, blocks_of(corpus, 700), id_ranks(doc_ids), 40, backend="torch", use_gpu=True)
    assert got_r.tolist() == want_r.tolist()
    np.testing.assert_array_equal(got_s, want_s)


def integer_corpus(rng, n, dim=16):
    """Small-integer vectors: every dot product is exact in float32 whatever the summation order, so every
    backend and the brute force compute bitwise the same scores, with many ties (duplicates included)."""
    corpus = rng.integers(-2, 3, size=(n, dim)).astype(np.float32)
    corpus[n // 4 : n // 4 + 12] = corpus[1]  # duplicated documents, tied in every row
    return corpus


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize(("n", "block", "k"), [(400, 64, 30), (400, 400, 30), (90, 16, 40), (60, 25, 100), (10, 3, 1)])
def test_exact_backends_equal_the_brute_force_bitwise_with_ties_at_the_cut_off(backend, n, block, k):
    rng = np.random.default_rng(n + block + k)
    corpus = integer_corpus(rng, n)
    queries = rng.integers(-2, 3, size=(25, 16)).astype(np.float32)
    queries[0] = 0  # every score ties at zero
    queries[1] = corpus[1]
    doc_ids = [f"doc{(i * 7919) % n:04d}" for i in range(n)]  # id order differs from row order
    want_s, want_r = brute_force(queries, corpus, doc_ids, k)
    got_s, got_r = dense_search(queries, blocks_of(corpus, block), id_ranks(doc_ids), k, backend=backend, use_gpu=False)
    assert got_s.shape == (25, min(k, n)) and got_s.dtype == np.float32
    assert got_r.tolist() == want_r.tolist()
    np.testing.assert_array_equal(got_s, want_s)
    if k < n:  # in some rows at least, the cut-off falls inside a tie: documents tied with the k-th are left out
        kth = want_s[:, -1:]
        assert ((queries @ corpus.T == kth).sum(1) > (want_s == kth).sum(1)).any()


@pytest.mark.parametrize("other", ["faiss", "numpy"])
def test_torch_and_the_other_cpu_backends_give_the_same_rows_and_scores(other):
    rng = np.random.default_rng(3)
    corpus = rng.normal(size=(2000, 64)).astype(np.float32)
    corpus /= np.linalg.norm(corpus, axis=1, keepdims=True)
    queries = rng.normal(size=(40, 64)).astype(np.float32)
    ranks = id_ranks([f"d{i}" for i in range(2000)])
    torch_s, torch_r = dense_search(queries, blocks_of(corpus, 512), ranks, 50, backend="torch")
    faiss_s, faiss_r = dense_search(queries, blocks_of(corpus, 512), ranks, 50, backend=other, use_gpu=False)
    np.testing.assert_array_equal(torch_r, faiss_r)
    np.testing.assert_allclose(torch_s, faiss_s, rtol=2e-6, atol=1e-6)  # BLAS kernels may round a few last bits apart
    # with exact arithmetic (small integers), bitwise the same scores, ties at the cut-off included
    corpus, queries = integer_corpus(rng, 300), rng.integers(-2, 3, size=(40, 16)).astype(np.float32)
    ranks = id_ranks([f"d{i}" for i in range(300)][::-1])
    torch_s, torch_r = dense_search(queries, blocks_of(corpus, 128), ranks, 20, backend="torch")
    faiss_s, faiss_r = dense_search(queries, blocks_of(corpus, 128), ranks, 20, backend=other, use_gpu=False)
    np.testing.assert_array_equal(torch_r, faiss_r)
    np.testing.assert_array_equal(torch_s, faiss_s)


@pytest.mark.parametrize("backend", ["torch", "numpy"])
def test_torch_and_numpy_backends_bound_the_score_matrix_by_chunks_of_queries(monkeypatch, backend):
    monkeypatch.setattr(exact_search, "SCORE_BYTES", 4 * 100 * 7)  # 7 queries per chunk of a 100-document block
    rng = np.random.default_rng(4)
    corpus, queries = integer_corpus(rng, 300), rng.integers(-2, 3, size=(30, 16)).astype(np.float32)
    doc_ids = [f"d{i:03d}" for i in range(300)][::-1]
    chunks = list(getattr(exact_search, f"_{backend}_block")(queries, corpus[:100], 5))
    assert [c[0] for c in chunks] == [slice(lo, min(lo + 7, 30)) for lo in range(0, 30, 7)]
    corpus.setflags(write=False)  # e.g. a memory map: read through a view, without a copy or a warning
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        got_s, got_r = dense_search(queries, blocks_of(corpus, 100), id_ranks(doc_ids), 5, backend=backend)
    want_s, want_r = brute_force(queries, corpus, doc_ids, 5)
    assert got_r.tolist() == want_r.tolist()
    np.testing.assert_array_equal(got_s, want_s)


def test_auto_is_numpy_for_a_small_search_torch_beyond_faiss_gpu_with_it_or_faiss_for_an_approximate_index(monkeypatch):
    small, large = exact_search.NUMPY_SCORES, exact_search.NUMPY_SCORES + 1
    if not faiss_gpu_available():
        assert auto_search_backend() == "torch" and resolve_backend("auto") == "torch"  # size unknown: large
        assert resolve_backend("auto", scores=small) == "numpy" and resolve_backend("auto", scores=large) == "torch"
    monkeypatch.setattr(exact_search, "faiss_gpu_available", lambda: True)
    assert auto_search_backend(small) == "faiss-gpu" and resolve_backend("auto") == "faiss-gpu"
    monkeypatch.setattr(exact_search, "faiss_gpu_available", lambda: False)
    assert resolve_backend("auto") == "torch" and resolve_backend("faiss") == "faiss"
    assert resolve_backend("auto", "HNSW32") == "faiss"


def test_a_small_search_on_a_cpu_imports_no_torch():
    probe = ("import sys, numpy as np; from pgrank.data.runs import id_ranks; "
             "from pgrank.retrieval.dense.exact_search import dense_search; "
             "x = np.eye(8, dtype=np.float32); dense_search(x, [(0, x)], id_ranks(range(8)), 3); "
             "print('torch' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True)
    assert out.returncode == 0 and out.stdout.strip() == "False", out.stderr[-2000:]


def test_faiss_gpu_without_gpu_faiss_is_one_error_naming_the_setting():
    if faiss_gpu_available():
        pytest.skip("this machine has GPU FAISS")
    corpus = np.random.default_rng(8).normal(size=(20, 8)).astype(np.float32)
    with pytest.raises(PgrankError, match=r"^search.backend: faiss-gpu, but the installed FAISS") as err:
        dense_search(corpus[:2], blocks_of(corpus, 10), id_ranks(range(20)), 5, backend="faiss-gpu")
    assert "\n" not in str(err.value) and "pgrank's gpu extra" in str(err.value)


def clustered(rng, n, dim=32, centers=16, latent=8):
    """Unit vectors around ``centers`` means, varying in a ``latent``-dimensional subspace (as embeddings do)."""
    means = rng.normal(size=(centers, dim)).astype(np.float32)
    basis = rng.normal(size=(latent, dim)).astype(np.float32) / np.sqrt(latent)
    x = means[rng.integers(centers, size=n)] + 0.5 * rng.normal(size=(n, latent)).astype(np.float32) @ basis
    return (x / np.linalg.norm(x, axis=1, keepdims=True)).astype(np.float32)


@pytest.mark.parametrize("index", ["HNSW32", "IVF16,Flat"])
def test_approximate_index_keeps_the_run_order_with_high_recall(index):
    rng = np.random.default_rng(5)
    both = clustered(rng, 3040)
    corpus, queries = both[:3000].copy(), both[3000:]
    corpus[10:15] = corpus[2000]  # ties among what the index returns go to the smaller id
    doc_ids = [f"d{(i * 13) % 3000:04d}" for i in range(3000)]
    ranks = id_ranks(doc_ids)
    k = 20
    _, exact = dense_search(queries, blocks_of(corpus, 1000), ranks, k, backend="torch")
    scores, rows = dense_search(queries, blocks_of(corpus, 1000), ranks, k, index=index, nprobe=4, ef_search=64)
    assert rows.shape == (40, k) and (rows >= 0).all()
    recall = np.mean([len(set(a) & set(b)) / k for a, b in zip(rows.tolist(), exact.tolist())])
    assert recall >= 0.9
    for s, r in zip(scores, rows):  # (score desc, id asc)
        keys = [(-float(v), doc_ids[j]) for v, j in zip(s, r)]
        assert keys == sorted(keys)
    np.testing.assert_allclose(scores, np.take_along_axis(queries @ corpus.T, rows, 1), atol=1e-5)


def test_approximate_index_smaller_corpus_than_k():
    rng = np.random.default_rng(6)
    corpus = clustered(rng, 50)
    _, rows = dense_search(clustered(rng, 3), blocks_of(corpus, 16), id_ranks(range(50)), 80, index="HNSW32")
    assert rows.shape == (3, 50) and sorted(rows[0].tolist()) == list(range(50))


@pytest.mark.parametrize(("setting", "kwargs"), [
    ("search.backend", {"backend": "bogus"}),
    ("search.backend", {"backend": "numpy", "use_gpu": True}),  # numpy is CPU only
    ("search.index", {"index": "bogus"}),
    ("search.index", {"index": "PQ5"}),  # 8 dimensions are not a multiple of 5 sub-quantizers
    ("search.index", {"index": "IVF64,Flat"}),  # 20 documents cannot train 64 lists
    ("search.index", {"index": "HNSW32", "backend": "torch"}),  # torch is exact only
    ("search.index", {"index": "HNSW32", "backend": "numpy"}),  # and so is numpy
])
def test_bad_backend_or_index_names_the_setting(setting, kwargs):
    corpus = np.random.default_rng(7).normal(size=(20, 8)).astype(np.float32)
    with pytest.raises(PgrankError, match=f"^{setting}: ") as err:
        dense_search(corpus[:2], blocks_of(corpus, 10), id_ranks(range(20)), 5, **kwargs)
    assert "\n" not in str(err.value)
