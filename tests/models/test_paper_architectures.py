"""The paper's four model architectures through pgrank's loaders and backends, on a CPU (tiny random weights with the
real module stacks, ``bench/paper_models.py``): gtr-t5-xl's T5 encoder with a Dense head, SBERT's and TAS-B's DistilBERT
with mean and CLS pooling under dot product, and SPLADE's masked-language-model head."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from pgrank.config import ModelsConfig
from pgrank.models.backends import exports, load_inference_encoder
from pgrank.models.loading import load_encoder
from pgrank.models.names import resolve_model
from pgrank.paths import Paths

TEXTS = ["what causes fever", "a passage about coral reefs and the rivers that feed them " * 6, "x"]
STACKS = {
    "gtr-t5": (["Transformer", "Pooling", "Dense", "Normalize"], "T5EncoderModel", "cosine"),
    "sbert": (["Transformer", "Pooling"], "DistilBertModel", "dot"),
    "tas-b": (["Transformer", "Pooling"], "DistilBertModel", "dot"),
}


@pytest.mark.parametrize("kind", sorted(STACKS))
def test_dense_paper_models_load_as_float32_with_their_module_stacks(paper_model, kind):
    modules, transformer, similarity = STACKS[kind]
    model = load_encoder(str(paper_model(kind)), ModelsConfig(), device="cpu", max_seq_length=64)
    assert [type(m).__name__ for m in model] == modules
    assert type(model[0].auto_model).__name__ == transformer and model.similarity_fn_name == similarity
    assert {p.dtype for p in model.parameters()} == {torch.float32}
    pooling = model[1].get_config_dict()
    assert pooling.get("pooling_mode") == ("cls" if kind == "tas-b" else "mean") or \
        pooling.get(f"pooling_mode_{'cls_token' if kind == 'tas-b' else 'mean_tokens'}")
    emb = model.encode(TEXTS)
    assert emb.shape[0] == 3 and np.isfinite(emb).all()
    if kind == "gtr-t5":
        np.testing.assert_allclose(np.linalg.norm(emb, axis=1), 1.0, atol=1e-5)  # Normalize: cosine under inner product


def test_splade_loads_as_a_sparse_encoder_with_its_mlm_head(paper_model):
    from pgrank.retrieval.sparse.splade import load_sparse_encoder

    model = load_sparse_encoder(str(paper_model("splade")), ModelsConfig(), device="cpu", max_seq_length=64)
    assert [type(m).__name__ for m in model] == ["MLMTransformer", "SpladePooling"]
    emb = model.encode_document(TEXTS[:2], convert_to_sparse_tensor=True)
    assert emb.shape[1] == len(model.tokenizer) and bool((emb.coalesce().values() >= 0).all())


@pytest.mark.parametrize("backend, floor", [("onnx", 0.99999), ("onnx-int8", 0.9), ("torch-bf16", 0.98)])
def test_the_t5_encoder_runs_under_every_cpu_backend_like_torch(tmp_path, paper_model, backend, floor):
    folder = paper_model("gtr-t5")
    models, paths = ModelsConfig(), Paths(root=tmp_path / "r", data=tmp_path / "d", embeddings=tmp_path / "e")
    assert exports(resolve_model(str(folder), models))
    reference, _ = load_inference_encoder(str(folder), models, paths, device="cpu", backend="torch")
    encoder, got = load_inference_encoder(str(folder), models, paths, device="cpu", backend=backend)
    assert got == backend
    a = reference.encode_document(TEXTS, batch_size=2, convert_to_numpy=True)
    b = encoder.encode_document(TEXTS, batch_size=2)
    assert ((a * b).sum(1) / (np.linalg.norm(a, axis=1) * np.linalg.norm(b, axis=1))).min() >= floor


def test_a_t5_training_step_with_cached_gradients_equals_plain_backprop(tmp_path, paper_model):
    from toy_project import make_project, plain_backprop, step_of

    from pgrank.data.candidate_store import open_candidates
    from pgrank.data.corpus_store import open_corpus
    from pgrank.training.batches import TrainingSet, make_batch
    from pgrank.training.trainer import accumulate_gradients

    folder = paper_model("gtr-t5")
    params, paths = make_project(tmp_path, folder, overrides={"train.tower": "both", "train.chunk_tokens": 64})
    examples = TrainingSet(open_candidates(paths, "toy", "train-pg")).examples(range(4))
    corpus, batch = open_corpus(paths, "toy"), make_batch(examples)
    cached = load_encoder(str(folder), params.models, device="cpu").eval()
    accumulate_gradients(cached, step_of(params, paths, cached, examples, corpus), params, epoch=1, frozen=None)
    plain = load_encoder(str(folder), params.models, device="cpu").eval()
    plain_backprop(plain, examples, batch, corpus, params)
    a = {n: p.grad for n, p in cached.named_parameters() if p.grad is not None}
    b = {n: p.grad for n, p in plain.named_parameters() if p.grad is not None}
    assert a.keys() == b.keys() and any("Dense" in n or n.startswith("2.") for n in a)  # the Dense head trains too
    for name in a:
        assert torch.allclose(a[name], b[name], atol=1e-6, rtol=1e-4), name
