"""Pre-tokenized chunks into a model (pgrank.models.packing): sorted by length, cut by a token budget, packed."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from pgrank.data.token_store import TokenRows, tokenize
from pgrank.models.packing import (PackingError, chunk_features, chunks_of, enable_packing, packs, plan_chunks,
                                   run_chunk, scatter)

TEXTS = [("rivers and deltas " * (1 + i % 7)).strip() + f" number {i}" for i in range(30)]


def _model(path, **kw):
    from sentence_transformers import SentenceTransformer

    return SentenceTransformer(str(path), device="cpu", **kw).eval()


def _rows(model, texts=TEXTS, max_length=64):
    ids, lengths, layout = tokenize(model, texts, task="document", max_length=max_length)
    return TokenRows(ids, lengths), layout


def test_chunks_are_sorted_by_length_and_kept_within_the_budget():
    lengths = np.array([5, 40, 12, 40, 3, 7, 30, 30, 2])
    chunks = plan_chunks(lengths, 80)
    assert sorted(np.concatenate(chunks).tolist()) == list(range(len(lengths)))
    flat = lengths[np.concatenate(chunks)]
    assert flat.tolist() == sorted(lengths.tolist(), reverse=True)  # longest first
    assert all(len(c) * lengths[c].max() <= 80 for c in chunks)
    with pytest.raises(PackingError, match="41 tokens"):
        plan_chunks(np.array([41, 3]), 40)
    assert plan_chunks(np.array([], dtype=np.int64), 10) == []


def test_packed_and_padded_chunks_encode_as_plain_encode_does(tiny_model_dir):
    model = _model(tiny_model_dir)
    rows, layout = _rows(model)
    assert enable_packing(model, rows.take(np.arange(4)), layout) and packs(model)
    expected = torch.as_tensor(model.encode(TEXTS))
    for packed in (True, False):
        chunks = chunks_of(rows, layout, 60, packed=packed, device="cpu")
        assert len(chunks) > 3
        with torch.no_grad():
            out = scatter([run_chunk(model, c, task="document") for c in chunks], chunks, len(TEXTS))
        assert torch.allclose(out, expected, atol=1e-5), packed
        real = sum(c.real for c in chunks)
        assert real == int(rows.lengths.sum())
        if packed:  # the linear layers see no padding
            assert sum(c.processed for c in chunks) == real
            assert chunks[0].features["input_ids"].shape == (1, chunks[0].real)


def test_the_real_minilm_packs_and_keeps_its_embeddings(minilm_path):
    model = _model(minilm_path)
    rows, layout = _rows(model, max_length=128)
    assert enable_packing(model, rows.take(np.arange(8)), layout)
    chunks = chunks_of(rows, layout, 256, packed=True, device="cpu")
    with torch.no_grad():
        out = scatter([run_chunk(model, c, task="document") for c in chunks], chunks, len(TEXTS))
    assert torch.allclose(out, torch.as_tensor(model.encode(TEXTS)), atol=1e-5)


def test_a_model_that_cannot_pack_runs_padded(paper_model):
    model = _model(paper_model("gtr-t5"))  # T5: relative position buckets, no per-text position ids
    rows, layout = _rows(model, max_length=model.max_seq_length)
    assert not enable_packing(model, rows.take(np.arange(4)), layout) and not packs(model)
    chunks = chunks_of(rows, layout, 2048, packed=packs(model), device="cpu")
    assert len(chunks) > 1
    with torch.no_grad():
        out = scatter([run_chunk(model, c, task="document") for c in chunks], chunks, len(TEXTS))
    assert torch.allclose(out, torch.as_tensor(model.encode(TEXTS)), atol=1e-5)


def test_distilbert_packs(paper_model):
    model = _model(paper_model("sbert"))
    rows, layout = _rows(model, max_length=model.max_seq_length)
    assert enable_packing(model, rows.take(np.arange(4)), layout)
    features = chunk_features(rows, layout, packed=True)
    with torch.no_grad():
        out = model(features, task="document")["sentence_embedding"]
    assert torch.allclose(out, torch.as_tensor(model.encode(TEXTS)), atol=1e-5)


def test_a_packed_model_saves_and_loads_in_plain_sentence_transformers(tiny_model_dir, tmp_path):
    from sentence_transformers import SentenceTransformer

    model = _model(tiny_model_dir)
    rows, layout = _rows(model)
    enable_packing(model, rows.take(np.arange(4)), layout)
    model.save(str(tmp_path / "saved"))
    again = SentenceTransformer(str(tmp_path / "saved"), device="cpu")
    assert "pgrank" not in str(again[0].auto_model.config._attn_implementation)
    assert torch.allclose(torch.as_tensor(again.encode(TEXTS)), torch.as_tensor(model.encode(TEXTS)), atol=1e-6)
