"""Encoding from token stores (pgrank.retrieval.dense.encoding, .token_pool, .corpus_embeddings): the token path gives
the string path's embeddings, in one process or one per device, for the whole corpus and for a subset of its rows."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

import pgrank.retrieval.dense.corpus_embeddings as embeddings
from pgrank.config import ModelsConfig
from pgrank.data.beir import document_text
from pgrank.data.token_store import TokenRows, tokenize
from pgrank.models.loading import load_encoder
from pgrank.models.packing import enable_packing, packs, plan_chunks
from pgrank.retrieval.dense.encoding import MAX_PADDING, encode_token_rows

CORPUS = {f"doc{i}": {"title": f"Title {i}" if i % 3 else "",
                      "text": " ".join(["tides and estuaries"] * (1 + i % 9)) + f" number {i}."} for i in range(40)}
TEXTS = [document_text(d) for d in CORPUS.values()]
DEVICES = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])


def _model(folder, device: str):
    return load_encoder(str(folder), ModelsConfig(), device=device)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("kind", ["bert", "distilbert", "t5"])
def test_token_rows_encode_as_strings_do_in_float32(kind, device, tiny_model_dir, paper_model):
    """BERT and DistilBERT packed, T5 padded (at most 5% of each chunk padding): the string path's embeddings to
    1e-5, in chunks of a small budget so that the texts span several chunks."""
    folder = {"bert": tiny_model_dir, "distilbert": paper_model("sbert"), "t5": paper_model("gtr-t5")}[kind]
    model = _model(folder, device)
    model.eval()
    model.max_seq_length = 64  # what the strings are truncated to, as the store is
    ids, lengths, layout = tokenize(model, TEXTS, task="document", max_length=64)
    rows = TokenRows(ids, lengths)
    enable_packing(model, rows.take(np.arange(8)), layout)
    assert packs(model) == (kind != "t5")
    expected = model.encode_document(TEXTS, batch_size=4, convert_to_numpy=True)
    got = encode_token_rows(model, rows, layout, budget=256)
    assert got.dtype == np.float32 and got.shape == expected.shape
    np.testing.assert_allclose(got, expected, atol=1e-5, rtol=1e-5)


def test_padded_chunks_keep_padding_under_the_bound():
    lengths = np.random.default_rng(0).integers(3, 200, size=3000)
    chunks = plan_chunks(lengths, 4096, max_padding=MAX_PADDING)
    assert np.array_equal(np.sort(np.concatenate(chunks)), np.arange(len(lengths)))
    for c in chunks:
        grid = len(c) * lengths[c].max()
        assert grid <= 4096 and lengths[c].sum() >= (1 - MAX_PADDING) * grid - 1e-9
    unbounded = plan_chunks(lengths, 4096)
    assert max(1 - lengths[c].sum() / (len(c) * lengths[c].max()) for c in unbounded) > MAX_PADDING


def _corpus_store(tmp_path):
    from pgrank.data.corpus_store import build_corpus_store

    (tmp_path / "c").mkdir()
    path = tmp_path / "c" / "corpus.jsonl"
    path.write_text("".join(json.dumps({"_id": d, **v}) + "\n" for d, v in CORPUS.items()))
    return build_corpus_store(path, tmp_path / "store", dataset="c", corpus_sha256="cd" * 32)


def _token_store(model, store, folder):
    from pgrank.data.token_store import build_token_store, corpus_blocks

    return build_token_store(model, corpus_blocks(store), len(store), folder, task="document", max_length=64,
                             source={"name": "c", "sha256": store.sha256})


@pytest.mark.slow  # three spawned processes, each importing torch and sentence-transformers
def test_on_several_devices_a_corpus_encodes_its_token_store_in_one_process_per_device(tmp_path, tiny_model_dir,
                                                                                      monkeypatch):
    """The shards split between processes (two on the CPU here, one per GPU on CUDA), no string encoded, the
    artifact what one process writes; a process that fails stops the pool with its error."""
    from pgrank.errors import PgrankError
    from pgrank.retrieval.dense.token_pool import TokenPool

    model = _model(tiny_model_dir, "cpu")
    store = _corpus_store(tmp_path)
    tokens = _token_store(model, store, tmp_path / "tok")

    def build(folder):
        return embeddings.build_corpus_embeddings(lambda: model, "tiny", store, folder, corpus_sha256=store.sha256,
                                                  max_seq_length=64, batch_size=4, chunk_size=16, show_progress=False,
                                                  tokens=lambda m: tokens)

    monkeypatch.setattr(embeddings, "encode_documents", lambda *a, **k: pytest.fail("strings encoded"))
    pools = []
    monkeypatch.setattr(embeddings, "encoding_devices", lambda documents, per_gpu: pools.append(per_gpu) or ["cpu", "cpu"])
    pooled = np.concatenate([b for _, b in build(tmp_path / "pooled").blocks()])
    assert pools == [1] and not packs(model)  # the parent's model never encoded: its copies did
    monkeypatch.setattr(embeddings, "encoding_devices", lambda documents, per_gpu: None)
    single = np.concatenate([b for _, b in build(tmp_path / "single").blocks()])
    np.testing.assert_allclose(pooled, single, atol=1e-3)  # float16 artifacts, chunked differently
    with TokenPool(model, tokens, ["cpu"], budget=4) as pool:  # no text fits 4 tokens
        with pytest.raises(PgrankError, match="does not fit a chunk budget"):
            pool.encode(0, 8)


def test_subset_embeddings_encode_their_rows_from_the_token_store(tmp_path, tiny_model_dir, monkeypatch):
    from pgrank.retrieval.dense.corpus_embeddings import SubsetEmbeddings

    model = _model(tiny_model_dir, "cpu")
    store = _corpus_store(tmp_path)
    tokens = _token_store(model, store, tmp_path / "tok")
    rows = np.array([33, 2, 17, 2, 9])
    strings = SubsetEmbeddings(model, store, rows, tmp_path / "s", batch_size=4, chunk_size=3)
    monkeypatch.setattr(embeddings, "encode_documents", lambda *a, **k: pytest.fail("strings encoded"))
    asked = []
    subset = SubsetEmbeddings(model, store, rows, tmp_path / "t", batch_size=4, chunk_size=3,
                              tokens=lambda m: asked.append(m) or tokens, max_seq_length=64)
    assert asked == [model] and packs(model)
    np.testing.assert_allclose(subset.vectors(rows), strings.vectors(rows), atol=1e-3)  # float16 vectors
    direct = model.encode_document(store.texts(np.array([2, 9, 17, 33])), convert_to_numpy=True)
    np.testing.assert_allclose(subset.vectors(np.array([2, 9, 17, 33])), direct, atol=2e-3)
    monkeypatch.undo()
    fallback = SubsetEmbeddings(model, store, rows, tmp_path / "u", batch_size=4, chunk_size=3, tokens=lambda m: None)
    np.testing.assert_array_equal(fallback.vectors(rows), strings.vectors(rows))  # no store built: strings
