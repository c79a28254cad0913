"""The document anchor (train.document_anchor): the query tower kept close to the warm document tower."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from toy_project import step_of, training_batch

from pgrank.core.drift import cosine_drift
from pgrank.models.loading import load_encoder
from pgrank.training.grad_cache import encode
from pgrank.training.reference import ReferencePolicy
from pgrank.training.step_inputs import anchor_rows
from pgrank.training.trainer import accumulate_gradients, train
from pgrank.training.warm_start import policy_model


def test_the_anchor_documents_are_drawn_from_the_batch_by_seed_epoch_and_queries(tmp_path, tiny_model_dir):
    *_, batch = training_batch(tmp_path, tiny_model_dir, "query")
    rows = anchor_rows(batch, seed=42, epoch=1, k=3)
    assert len(rows) == 3 and set(rows) <= set(batch.unique_rows)
    assert np.array_equal(rows, anchor_rows(batch, seed=42, epoch=1, k=3))  # a resumed run draws the same
    others = [anchor_rows(batch, seed=s, epoch=e, k=3).tolist() for s, e in [(43, 1), (42, 2), (44, 3), (45, 4)]]
    assert any(o != rows.tolist() for o in others)
    assert np.array_equal(anchor_rows(batch, seed=42, epoch=1, k=10_000), batch.unique_rows)  # all, when fewer


@pytest.mark.parametrize("tower", ["query", "both"])
def test_at_the_warm_start_the_query_tower_embeds_documents_as_the_document_tower_does(tmp_path, tiny_model_dir,
                                                                                        tower):
    params, paths, ref, corpus, frozen, batch = training_batch(tmp_path, tiny_model_dir, tower, **{
        "train.document_anchor.coef": 1.0, "train.document_anchor.documents": 4, "train.amp": "off"})
    reference = ReferencePolicy(policy_model(ref, ref, params, "cpu"), params.train) if tower == "both" else None
    model = policy_model(ref, ref, params, "cpu").eval()  # dropout off: the warm start's function
    inputs = step_of(params, paths, model, batch.examples, corpus, reference=reference)
    stats = accumulate_gradients(model, inputs, params, epoch=1, frozen=frozen, reference=reference)
    assert stats.drift == pytest.approx(0.0, abs=1e-5)
    assert any(p.grad is not None for p in model.parameters())


def test_a_strong_anchor_keeps_the_query_tower_near_the_document_tower(tmp_path, tiny_model_dir):
    """Same seed and data: without the anchor the trained query tower embeds the corpus's documents away from the
    frozen document tower's embeddings of them; with a strong anchor it stays close."""
    drift = {}
    for coef in (0.0, 20.0):
        params, paths, ref, corpus, frozen, batch = training_batch(
            tmp_path / str(coef), tiny_model_dir, "query",
            **{"train.document_anchor.coef": coef, "train.learning_rate": 3e-3, "train.epochs": 2,
               "train.keep_epochs": [2], "train.pg.temperature": 1.0})
        result = train(params, paths, str(tiny_model_dir), device="cpu", progress=False)
        trained = load_encoder(str(result.final), params.models, device="cpu")
        rows = np.arange(len(corpus))
        with torch.no_grad():
            embedded = encode(trained, corpus.texts(rows), task="query", max_length=128, amp="off")
        drift[coef] = cosine_drift(embedded, frozen.vectors(rows, torch.device("cpu"))).item()
    assert drift[0.0] > 0.01
    assert drift[20.0] < drift[0.0] / 3
