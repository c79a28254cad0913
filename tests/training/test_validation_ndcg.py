"""Validation nDCG during training (pgrank/training/validation_ndcg.py): the queries read as token ids."""

from __future__ import annotations

import pytest
from toy_project import make_project


@pytest.mark.parametrize("tower", ["query", "both"])
def test_validation_reading_token_ids_gives_the_figures_of_validation_tokenizing_the_texts(tmp_path, tiny_model_dir,
                                                                                         monkeypatch, tower):
    """The trainer's path: the validation queries come from their token store, in batches of similar length, and no
    text is tokenized; every query's figures equal those of the text path (batched in the examples' order)."""
    from sentence_transformers import SentenceTransformer

    import pgrank.training.validation_ndcg as validation
    from pgrank.data.beir import load_topics
    from pgrank.data.corpus_store import open_corpus
    from pgrank.data.token_store import corpus_tokens, query_tokens
    from pgrank.models.names import resolve_model
    from pgrank.training.batches import frozen_documents, training_set

    params, paths = make_project(tmp_path, tiny_model_dir, overrides={"train.tower": tower})
    corpus = open_corpus(paths, "toy")
    examples = training_set(paths, "toy", "validation", corpus)
    qrels = validation.qrels_by_row(load_topics(paths, "toy", "validation")[1], corpus)
    model = SentenceTransformer(str(tiny_model_dir), device="cpu").eval()
    if tower == "query":
        frozen, documents = frozen_documents(params, paths, resolve_model(str(tiny_model_dir), params.models), corpus), None
    else:
        frozen, documents = None, corpus_tokens(model, paths, corpus, max_length=params.train.max_doc_length)
    queries = query_tokens(model, paths, examples.store, max_length=params.train.max_query_length)

    by_text = validation.validate_queries(model, examples, qrels, params, frozen=frozen, documents=documents,
                                          batch_size=3)
    longest = []
    real_run = validation.run_features

    def run_features(m, features, **kw):
        longest.append(features["input_ids"].shape[1])
        return real_run(m, features, **kw)

    monkeypatch.setattr(validation, "encode", lambda *a, **k: pytest.fail("validation tokenized query text"))
    monkeypatch.setattr(validation, "run_features", run_features)
    by_ids = validation.validate_queries(model, examples, qrels, params, frozen=frozen, documents=documents,
                                         queries=queries, batch_size=3)

    assert by_ids.keys() == by_text.keys() and len(by_ids) == len(examples) > 3
    for qid, figures in by_text.items():
        assert by_ids[qid].keys() == figures.keys()
        assert all(abs(by_ids[qid][k] - v) < 1e-6 for k, v in figures.items()), qid
    assert len(longest) == -(-len(examples) // 3) and longest == sorted(longest)  # batches by length, shortest first
    assert max(longest) == int(queries.lengths(range(len(examples))).max())
