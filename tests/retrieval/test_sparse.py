"""pgrank.retrieval.sparse: SPLADE's corpus matrix as a cached artifact, exact top k in bounded memory."""

from __future__ import annotations

import json

import numpy as np
import pytest

import pgrank.retrieval.sparse.splade as splade
from pgrank.config import ModelsConfig
from pgrank.data.corpus_store import open_corpus
from pgrank.data.runs import top_k
from pgrank.paths import Paths

WORDS = "fever cat dog sleep immune river delta solar wind tax policy protein fold reef coral".split()


@pytest.fixture(scope="module")
def project(tmp_path_factory, tiny_splade_dir):
    tmp_path = tmp_path_factory.mktemp("sparse")
    rng = np.random.default_rng(0)
    paths = Paths(root=tmp_path / "runs", data=tmp_path / "data", embeddings=tmp_path / "emb")
    folder = paths.dataset("toy")
    folder.mkdir(parents=True)
    docs = [{"_id": f"d{(i * 37) % 101:03d}", "title": "", "text": " ".join(rng.choice(WORDS, 5))} for i in range(101)]
    (folder / "corpus.jsonl").write_text("".join(json.dumps(d) + "\n" for d in docs))
    model = splade.load_sparse_encoder(str(tiny_splade_dir), ModelsConfig(), max_seq_length=32)
    store = open_corpus(paths, "toy")
    corpus = splade.build_sparse_corpus(lambda: model, "tiny", store, paths.sparse_corpus("tiny", 32, store.sha256),
                                        corpus_sha256=store.sha256, max_seq_length=32, batch_size=16, chunk_size=16)
    return paths, store, model, corpus


def test_exact_top_k_in_bounded_blocks(project, monkeypatch):
    paths, store, model, corpus = project
    queries = splade.encode_sparse(model, ["fever cat", "solar wind tax", "zzz", "reef"], task="query", batch_size=4)
    full = np.asarray((queries @ corpus.take(np.arange(len(store))).T).toarray(), dtype=np.float32)  # (Q, N), reference
    shapes = []
    real = splade.top_k
    monkeypatch.setattr(splade, "top_k", lambda s, *a: shapes.append(s.shape) or real(s, *a))
    scores, rows = splade.sparse_search(queries, corpus, store.id_ranks, 10, query_block=3, doc_block=7)
    want_s, want_r = top_k(full, np.arange(len(store))[None, :], store.id_ranks, 10)
    np.testing.assert_array_equal(rows, want_r)
    np.testing.assert_allclose(scores, want_s, rtol=1e-5, atol=1e-6)
    # never a (Q, N) block: at most query_block x max(doc_block, 2k) scores at a time
    assert max(q for q, _ in shapes) <= 3 and max(d for _, d in shapes) <= 20


def test_the_corpus_matrix_is_an_artifact_built_once(project, monkeypatch):
    paths, store, model, corpus = project
    assert corpus.num_shards == 7 and corpus.num_docs == 101  # 16 rows a shard, memory-mapped
    shard = corpus.shard(0)
    assert not shard.data.flags.owndata and not shard.indices.flags.owndata  # views of the memory maps, no copy
    np.testing.assert_allclose(corpus.take(np.array([100, 3, 50])).toarray(),
                               splade.encode_sparse(model, store.texts([100, 3, 50]), task="document",
                                                    batch_size=4).toarray(), rtol=1e-5, atol=1e-6)
    monkeypatch.setattr(splade, "encode_sparse", lambda *a, **k: pytest.fail("re-encoded the corpus"))
    again = splade.build_sparse_corpus(lambda: pytest.fail("loaded the model"), "tiny", store, corpus.folder,
                                       corpus_sha256=store.sha256, max_seq_length=32, batch_size=16, chunk_size=16)
    assert again.meta == corpus.meta


def test_an_interrupted_encoding_resumes_from_finished_shards(project, monkeypatch):
    paths, store, model, corpus = project
    folder = paths.sparse_corpus("other", 32, store.sha256)
    real, calls = splade.encode_sparse, []

    def interrupted(m, texts, **kw):
        if len(calls) == 3:
            raise KeyboardInterrupt
        calls.append(len(texts))
        return real(m, texts, **kw)

    monkeypatch.setattr(splade, "encode_sparse", interrupted)
    with pytest.raises(KeyboardInterrupt):
        splade.build_sparse_corpus(lambda: model, "other", store, folder, corpus_sha256=store.sha256,
                                   max_seq_length=32, batch_size=16, chunk_size=16)
    calls.clear()
    monkeypatch.setattr(splade, "encode_sparse", lambda m, texts, **kw: calls.append(len(texts)) or real(m, texts, **kw))
    done = splade.build_sparse_corpus(lambda: model, "other", store, folder, corpus_sha256=store.sha256,
                                      max_seq_length=32, batch_size=16, chunk_size=16)
    assert calls == [16, 16, 16, 5]  # shards 3..6 only
    np.testing.assert_allclose(done.take(np.arange(101)).toarray(), corpus.take(np.arange(101)).toarray(), atol=1e-6)
