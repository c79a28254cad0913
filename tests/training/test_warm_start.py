"""The models of a training run come from one read of each weight file (pgrank/training/warm_start.py)."""

from __future__ import annotations

from toy_project import make_project

from pgrank.training.trainer import train


def _count_reads(monkeypatch) -> list[str]:
    """Every model that pgrank reads from disk from now on, by the folder it names."""
    from pgrank.models import loading

    read, real = [], loading.load_encoder

    def counted(name, *args, **kwargs):
        read.append(str(getattr(name, "local_dir", None) or name))
        return real(name, *args, **kwargs)

    monkeypatch.setattr(loading, "load_encoder", counted)
    return read


def test_the_policy_its_kl_reference_and_its_document_side_come_from_one_read(tmp_path, tiny_model_dir, monkeypatch):
    """tower: query with the KL term needs the warm start's weights three times: the policy, the frozen reference
    and the document side of every checkpoint (here three); the run reads them once."""
    from pgrank.data.corpus_store import open_corpus
    from pgrank.models.names import resolve_model
    from pgrank.training.batches import frozen_documents

    params, paths = make_project(tmp_path, tiny_model_dir, overrides={
        "train.tower": "query", "train.pg.kl_coef": 0.1, "train.epochs": 2, "train.keep_epochs": [0, 1, 2]})
    frozen_documents(params, paths, resolve_model(str(tiny_model_dir), params.models), open_corpus(paths, "toy"))
    read = _count_reads(monkeypatch)  # from here on: the corpus-embedding artifact is built already
    result = train(params, paths, str(tiny_model_dir), device="cpu", progress=False)
    assert read == [str(tiny_model_dir)]
    assert sorted(p.name for p in result.model_dir.iterdir()) == ["epoch-0", "epoch-1", "epoch-2"]


def test_a_warm_starts_prompts_are_trained_on_and_kept_by_its_query_tower_checkpoint(tmp_path, tiny_model_dir):
    """A warm start with prompts (E5, BGE and the like): training encodes its texts with the prompts that
    ``encode_query`` / ``encode_document`` put before them, and the ``tower: query`` checkpoint (a ``Router`` of the
    trained route and the frozen one) keeps them, so that it encodes as the model that was trained."""
    import numpy as np
    import torch
    from sentence_transformers import SentenceTransformer

    from pgrank.training.checkpoints import query_route, save_model
    from pgrank.training.grad_cache import encode

    texts = ["what causes a fever", "glaciers melt in summer"]
    prompts = {"query": "query: ", "document": "passage: "}
    policy = SentenceTransformer(str(tiny_model_dir), device="cpu", prompts=prompts).eval()
    documents = SentenceTransformer(str(tiny_model_dir), device="cpu", prompts=prompts).eval()
    with torch.no_grad():
        for task, reference in (("query", policy.encode_query), ("document", policy.encode_document)):
            np.testing.assert_allclose(encode(policy, texts, task=task, max_length=32).numpy(),
                                       reference(texts, convert_to_numpy=True), atol=1e-5)
        assert not np.allclose(encode(policy, texts, task="query", max_length=32).numpy(),
                               policy.encode(texts, convert_to_numpy=True), atol=1e-4)  # the prompt matters

    save_model(policy, tmp_path / "checkpoint", {"epoch": 1}, document_model=documents)
    loaded = SentenceTransformer(str(tmp_path / "checkpoint"), device="cpu")
    assert {k: v for k, v in loaded.prompts.items() if v} == prompts
    np.testing.assert_allclose(loaded.encode_query(texts), policy.encode_query(texts), atol=1e-5)
    np.testing.assert_allclose(loaded.encode_document(texts), documents.encode_document(texts), atol=1e-5)
    assert query_route(loaded).prompts["query"] == "query: "
