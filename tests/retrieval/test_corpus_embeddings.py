"""pgrank.retrieval.dense.corpus_embeddings: the sharded float16 corpus-embedding artifact, its reader and its resume."""

from __future__ import annotations

import json

import numpy as np
import pytest

import pgrank.retrieval.dense.corpus_embeddings as embeddings
from pgrank.config import ModelsConfig
from pgrank.data.beir import document_text
from pgrank.errors import DataError
from pgrank.models.loading import load_encoder
from pgrank.retrieval.dense.corpus_embeddings import (
    build_corpus_embeddings,
    open_corpus_embeddings,
)
from pgrank.retrieval.dense.encoding import encode_queries

CORPUS = {
    f"doc{i}": {"title": f"Title {i}" if i % 3 else "", "text": f"Document number {i} talks about topic {i % 5}."}
    for i in range(45)
}


@pytest.fixture(scope="module")
def tiny(tiny_model_dir):
    return load_encoder(str(tiny_model_dir), ModelsConfig(), device="cpu")


def build(folder, model, chunk_size=16, **kw):
    return build_corpus_embeddings(
        lambda: model, "tiny", CORPUS, folder, corpus_sha256="ab" * 32, max_seq_length=64,
        batch_size=8, chunk_size=chunk_size, show_progress=False, **kw,
    )


def test_document_text_follows_beir():
    from beir.retrieval.models.util import extract_corpus_sentences

    docs = [{"title": "T", "text": "body "}, {"title": "", "text": " body"}, {"text": "no title"}]
    assert [document_text(d) for d in docs] == extract_corpus_sentences(docs, sep=" ")


def test_artifact_layout_and_reader(tmp_path, tiny):
    emb = build(tmp_path / "emb", tiny)
    assert emb.num_docs == len(CORPUS) and emb.dim == 32 and emb.num_shards == 3
    shards = sorted(p.name for p in (tmp_path / "emb").glob("shard-*.npy"))
    assert shards == ["shard-00000.npy", "shard-00001.npy", "shard-00002.npy"]
    assert emb.shard(2).dtype == np.float16 and emb.shard(2).shape == (13, 32)
    assert isinstance(emb.shard(0), np.memmap)
    meta = json.loads((tmp_path / "emb" / "meta.json").read_text())
    assert meta["num_docs"] == 45 and meta["model"] == "tiny" and meta["dtype"] == "float16"

    blocks = list(emb.blocks())
    assert [start for start, _ in blocks] == [0, 16, 32]
    assert all(b.dtype == np.float32 for _, b in blocks)
    full = np.concatenate([b for _, b in blocks])
    assert [s for s, _ in emb.blocks(rows=10)] == [0, 10, 20, 30, 40]
    np.testing.assert_array_equal(np.concatenate([b for _, b in emb.blocks(rows=10)]), full)
    np.testing.assert_array_equal(np.concatenate([b for _, b in emb.blocks(rows=100)]), full)
    np.testing.assert_array_equal(emb.rows(14, 35), full[14:35])
    np.testing.assert_array_equal(emb.vectors(np.array([44, 0, 17])), full[[44, 0, 17]])

    # The artifact equals a plain encode of BEIR's document strings, up to float16 rounding.
    direct = tiny.encode([document_text(d) for d in CORPUS.values()], batch_size=8)
    np.testing.assert_allclose(full, direct, rtol=2e-3, atol=2e-3)


def test_a_damaged_meta_is_a_data_error_that_says_to_encode_again(tmp_path, tiny):
    build(tmp_path / "emb", tiny)
    meta = json.loads((tmp_path / "emb" / "meta.json").read_text())
    del meta["dim"]
    (tmp_path / "emb" / "meta.json").write_text(json.dumps(meta))
    with pytest.raises(DataError, match=r"emb/meta.json: no 'dim'; a damaged artifact: delete .*emb and the next "
                                        r"stage encodes the corpus again"):
        open_corpus_embeddings(tmp_path / "emb")


def test_complete_artifact_is_reused_without_loading_the_model(tmp_path, tiny):
    first = build(tmp_path / "emb", tiny)

    def no_model():
        raise AssertionError("the model must not be loaded for a complete artifact")

    again = build_corpus_embeddings(no_model, "tiny", CORPUS, tmp_path / "emb", corpus_sha256="ab" * 32,
                                    max_seq_length=64, batch_size=8, chunk_size=16, show_progress=False)
    assert again.meta == first.meta


def test_resume_after_an_interruption_reuses_finished_shards(tmp_path, tiny, monkeypatch):
    reference = np.concatenate([b for _, b in build(tmp_path / "ref", tiny).blocks()])

    real = embeddings.encode_documents
    calls = []

    def interrupted(model, texts, **kw):
        if len(calls) == 2:
            raise KeyboardInterrupt  # killed while encoding the third shard
        calls.append(len(texts))
        return real(model, texts, **kw)

    monkeypatch.setattr(embeddings, "encode_documents", interrupted)
    with pytest.raises(KeyboardInterrupt):
        build(tmp_path / "emb", tiny)
    folder = tmp_path / "emb"
    assert not (folder / "meta.json").exists()
    assert sorted(p.name for p in folder.glob("shard-*.npy")) == ["shard-00000.npy", "shard-00001.npy"]
    assert not [p for p in folder.iterdir() if p.name.startswith(".")]  # no half-written shard left
    with pytest.raises(DataError, match="not a complete corpus-embedding artifact"):
        open_corpus_embeddings(folder)
    stamps = {p.name: p.stat().st_mtime_ns for p in folder.glob("shard-*.npy")}

    calls.clear()
    monkeypatch.setattr(embeddings, "encode_documents", lambda model, texts, **kw: calls.append(len(texts)) or real(model, texts, **kw))
    emb = build(folder, tiny)
    assert calls == [13]  # only the missing last shard was encoded
    assert {p: (folder / p).stat().st_mtime_ns for p in stamps} == stamps
    np.testing.assert_array_equal(np.concatenate([b for _, b in emb.blocks()]), reference)


def test_a_partial_artifact_from_another_plan_starts_over(tmp_path, tiny, monkeypatch):
    real = embeddings.encode_documents
    calls = []

    def interrupted(model, texts, **kw):
        if calls:
            raise KeyboardInterrupt
        calls.append(len(texts))
        return real(model, texts, **kw)

    monkeypatch.setattr(embeddings, "encode_documents", interrupted)
    with pytest.raises(KeyboardInterrupt):
        build(tmp_path / "emb", tiny, chunk_size=16)
    monkeypatch.setattr(embeddings, "encode_documents", real)
    emb = build(tmp_path / "emb", tiny, chunk_size=20)  # a different shard size: old shards are void
    assert emb.num_shards == 3 and emb.shard(0).shape == (20, 32)
    assert sorted(p.name for p in (tmp_path / "emb").glob("shard-*.npy"))[-1] == "shard-00002.npy"


def test_empty_corpus_is_an_error(tmp_path, tiny):
    with pytest.raises(DataError, match="empty corpus"):
        build_corpus_embeddings(lambda: tiny, "tiny", {}, tmp_path / "e", corpus_sha256="0" * 64,
                                max_seq_length=64, batch_size=8, chunk_size=16)


def test_encode_queries_keeps_the_mapping_order(tiny):
    qids, vecs = encode_queries(tiny, {"q2": "fever", "q1": "topic 3"}, batch_size=4)
    assert qids == ["q2", "q1"] and vecs.shape == (2, 32) and vecs.dtype == np.float32
    np.testing.assert_allclose(vecs[1], tiny.encode(["topic 3"])[0], rtol=1e-5, atol=1e-6)


def test_the_pool_has_processes_per_gpu_on_every_gpu_and_only_for_corpora_worth_starting_it(monkeypatch):
    import torch

    from pgrank.retrieval.dense import encoding

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    assert encoding.encoding_devices(10**6, 2) == ["cuda:0", "cuda:0", "cuda:1", "cuda:1"]
    assert encoding.encoding_devices(10**6, 1) == ["cuda:0", "cuda:1"]
    assert encoding.encoding_devices(encoding.POOL_MIN_DOCUMENTS - 1, 4) is None
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    assert encoding.encoding_devices(10**6, 1) is None and encoding.encoding_devices(10**6, 3) == ["cuda:0"] * 3
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert encoding.encoding_devices(10**6, 4) is None


def test_multi_process_pool_path(tmp_path, tiny, monkeypatch):
    """With several devices the shards go through sentence-transformers' multi-process pool."""
    reference = np.concatenate([b for _, b in build(tmp_path / "ref", tiny).blocks()])
    monkeypatch.setattr(embeddings, "encoding_devices", lambda documents, per_gpu: ["cpu", "cpu"])
    emb = build(tmp_path / "pool", tiny)
    np.testing.assert_allclose(np.concatenate([b for _, b in emb.blocks()]), reference, atol=2e-3)


@pytest.mark.gpu
def test_bf16_encoding_on_cuda_goes_through_the_multi_process_pool(tmp_path, paper_model, monkeypatch):
    """On CUDA, models.backend auto is bf16 weights: the model stays a SentenceTransformer, so the artifact is encoded
    by sentence-transformers' pool (here two processes on one GPU), with what a plain bf16 encode gives."""
    import torch

    if not torch.cuda.is_available():
        pytest.skip("a CUDA device is needed")
    from pgrank.models.backends import effective_backend, load_inference_encoder
    from pgrank.models.names import resolve_model
    from pgrank.paths import Paths

    folder = paper_model("gtr-t5")
    models, paths = ModelsConfig(), Paths(root=tmp_path / "r", data=tmp_path / "d", embeddings=tmp_path / "e")
    ref = resolve_model(str(folder), models)
    assert effective_backend(ref, models) == "torch-bf16"
    model, backend = load_inference_encoder(ref, models, paths, max_seq_length=64)
    assert backend == "torch-bf16" and model.device.type == "cuda" and hasattr(model, "start_multi_process_pool")
    assert {p.dtype for p in model.parameters()} == {torch.bfloat16}
    reference = np.concatenate([b for _, b in build(tmp_path / "plain", model).blocks()])
    started = []
    real_start = type(model).start_multi_process_pool
    monkeypatch.setattr(embeddings, "encoding_devices", lambda documents, per_gpu: ["cuda:0", "cuda:0"])
    monkeypatch.setattr(type(model), "start_multi_process_pool",
                        lambda self, devices: started.append(devices) or real_start(self, devices))
    pooled = np.concatenate([b for _, b in build(tmp_path / "pool", model).blocks()])
    assert started == [["cuda:0", "cuda:0"]]
    assert model.device.type == "cuda"  # the pool moved the model to the CPU; it went back
    cos = (pooled * reference).sum(1) / (np.linalg.norm(pooled, axis=1) * np.linalg.norm(reference, axis=1))
    assert cos.min() > 0.999  # bf16: batches padded differently round differently


def _corpus_store(tmp_path):
    from pgrank.data.corpus_store import build_corpus_store

    (tmp_path / "c").mkdir()
    path = tmp_path / "c" / "corpus.jsonl"
    path.write_text("".join(json.dumps({"_id": d, **v}) + "\n" for d, v in CORPUS.items()))
    return build_corpus_store(path, tmp_path / "store", dataset="c", corpus_sha256="ab" * 32)


def test_the_artifact_reads_the_corpus_store_shard_by_shard(tmp_path, tiny):
    from_dict = np.concatenate([b for _, b in build(tmp_path / "dict", tiny).blocks()])
    store = _corpus_store(tmp_path)
    emb = build_corpus_embeddings(lambda: tiny, "tiny", store, tmp_path / "store-emb", corpus_sha256=store.sha256,
                                  max_seq_length=64, batch_size=8, chunk_size=16, show_progress=False)
    np.testing.assert_array_equal(np.concatenate([b for _, b in emb.blocks()]), from_dict)


def test_subset_embeddings_encode_only_the_rows_asked_for(tmp_path, tiny, monkeypatch):
    """A rerank-only system encodes the documents of its candidate sets, each once, not the corpus."""
    from pgrank.retrieval.dense.corpus_embeddings import SubsetEmbeddings

    full = np.concatenate([b for _, b in build(tmp_path / "ref", tiny).blocks()])
    store = _corpus_store(tmp_path)
    encoded = []
    real = embeddings.encode_documents
    monkeypatch.setattr(embeddings, "encode_documents", lambda m, texts, **kw: encoded.extend(texts) or real(m, texts, **kw))
    rows = np.array([40, 3, 17, 3, 40, 8])
    subset = SubsetEmbeddings(tiny, store, rows, tmp_path / "scratch", batch_size=8, chunk_size=2)
    assert len(subset) == 4 and sorted(encoded) == sorted(store.texts([3, 8, 17, 40]))
    np.testing.assert_allclose(subset.vectors(np.array([17, 40, 3])), full[[17, 40, 3]], atol=2e-3)
    with pytest.raises(KeyError):
        subset.vectors(np.array([5]))
    scratch = next((tmp_path / "scratch").iterdir())
    del subset
    import gc

    gc.collect()
    assert not scratch.exists()  # the temporary vectors go with the object


def test_a_holder_killed_after_finishing_leaves_no_lock_behind(tmp_path, tiny):
    """A process SIGKILLed after meta.json was renamed into place never deleted its lock file; the next one
    that finds the artifact complete clears it (the kill sweep found this after a mine-train kill)."""
    import subprocess
    import sys

    from pgrank.atomic import lock_file

    build(tmp_path / "emb", tiny)
    lock = lock_file(tmp_path / "emb")
    lock.write_text('{"pid": 1, "host": "gone", "since": 0, "command": "pgrank mine --training"}')
    build(tmp_path / "emb", tiny)
    assert not lock.exists()

    # A lock somebody holds is theirs: it stays.
    holder = subprocess.Popen([sys.executable, "-c", (
        "import time; from pgrank.atomic import exclusive\n"
        f"with exclusive({str(lock)!r}, what='x'):\n    print('held', flush=True); time.sleep(60)")],
        stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "held"
        build(tmp_path / "emb", tiny)
        assert lock.exists()
    finally:
        holder.kill()
        holder.wait()


def _token_store(model, store, folder):
    from pgrank.data.token_store import build_token_store, corpus_blocks

    return build_token_store(model, corpus_blocks(store), len(store), folder, task="document", max_length=64,
                             source={"name": "c", "sha256": store.sha256})


def test_a_corpus_encodes_through_its_token_store_in_packed_token_budget_chunks(tmp_path, tiny_model_dir, monkeypatch):
    """No string is tokenized while the shards encode, and the embeddings are what encode gives."""
    from pgrank.models.packing import packs

    model = load_encoder(str(tiny_model_dir), ModelsConfig(), device="cpu")  # packing switches this instance
    store = _corpus_store(tmp_path)
    direct = model.encode_document([document_text(d) for d in CORPUS.values()], batch_size=8)
    tokenized = []
    monkeypatch.setattr(embeddings, "encode_documents", lambda *a, **k: pytest.fail("strings encoded"))
    emb = build_corpus_embeddings(lambda: model, "tiny", store, tmp_path / "emb", corpus_sha256=store.sha256,
                                  max_seq_length=64, batch_size=8, chunk_size=16, show_progress=False,
                                  tokens=lambda m: tokenized.append(m) or _token_store(m, store, tmp_path / "tok"))
    assert tokenized == [model] and packs(model)
    np.testing.assert_allclose(np.concatenate([b for _, b in emb.blocks()]), direct, rtol=2e-3, atol=2e-3)


@pytest.mark.parametrize("include_prompt", [True, False])
def test_a_model_with_a_document_prompt_encodes_its_token_store_as_encode_document_does(tmp_path, tiny_model_dir,
                                                                                         monkeypatch, include_prompt):
    """The store holds the prompt's ids before each text; pooling that leaves the prompt out reads its length."""
    model = load_encoder(str(tiny_model_dir), ModelsConfig(), device="cpu")
    model.prompts = {"document": "passage: "}
    model[1].include_prompt = include_prompt
    store = _corpus_store(tmp_path)
    texts = [document_text(d) for d in CORPUS.values()]
    direct = model.encode_document(texts, batch_size=8)
    assert not np.allclose(direct, model.encode(texts, batch_size=8), atol=2e-3)  # the prompt matters
    model[1].include_prompt = not include_prompt
    assert not np.allclose(direct, model.encode_document(texts, batch_size=8), atol=2e-3)  # and whether it is pooled
    model[1].include_prompt = include_prompt
    monkeypatch.setattr(embeddings, "encode_documents", lambda *a, **k: pytest.fail("strings encoded"))
    emb = build_corpus_embeddings(lambda: model, "tiny", store, tmp_path / "emb", corpus_sha256=store.sha256,
                                  max_seq_length=64, batch_size=8, chunk_size=16, show_progress=False,
                                  tokens=lambda m: _token_store(m, store, tmp_path / "tok"))
    np.testing.assert_allclose(np.concatenate([b for _, b in emb.blocks()]), direct, rtol=2e-3, atol=2e-3)
