"""Validation nDCG during training: the candidate sets reranked by the model being trained.

The in-domain set is ``data.train``'s carved ``validation`` split; ``train.validation_sets`` adds
out-of-domain ones (mined by ``mine-train`` into the training sets), each with its own corpus, and, in
``tower: query`` mode, the frozen document embeddings of that corpus. Every set is reranked, not
searched: the nDCG@10 of the candidate sets sorted by the model's scores, as the paper validates.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from pgrank.config import Params
from pgrank.core.trec_eval import evaluate_run, mean_metrics
from pgrank.paths import Paths
from pgrank.training import distributed
from pgrank.training.batches import (
    FrozenDocuments,
    TrainingSet,
    candidate_scores,
    frozen_documents,
    make_batch,
    training_set,
)
from pgrank.models.packing import run_features
from pgrank.training.grad_cache import encode, encode_tokens, token_chunks
from pgrank.training.step_inputs import query_features


METRICS = ("ndcg@1", "ndcg@3", "ndcg@5", "ndcg@10", "mrr@10")


def validate(model, examples: TrainingSet, qrels, params: Params, *, frozen: FrozenDocuments | None,
             documents=None, queries=None, world: distributed.World = distributed.World(),
             batch_size: int = 64) -> dict[str, float]:
    """The means over queries of :func:`validate_queries` (:func:`averages`)."""
    return averages(validate_queries(model, examples, qrels, params, frozen=frozen, documents=documents,
                                     queries=queries, world=world, batch_size=batch_size))


def averages(per_query: dict[str, dict[str, float]]) -> dict[str, float]:
    """nDCG@1/3/5/10 and MRR@10 averaged over the queries of :func:`validate_queries`."""
    averaged = mean_metrics(per_query)
    return {k: averaged[k] for k in METRICS}


@torch.no_grad()
def validate_queries(model, examples: TrainingSet, qrels, params: Params, *, frozen: FrozenDocuments | None,
                     documents=None, queries=None, world: distributed.World = distributed.World(),
                     batch_size: int = 64) -> dict[str, dict[str, float]]:
    """Rerank the validation candidate sets with ``model`` (sorted by score) and evaluate each query.

    ``qrels`` are keyed by corpus row (:func:`qrels_by_row`), as the candidate sets are. The candidates are
    ``frozen``'s embeddings (``tower: query``), or ``documents``' token ids (the corpus's token store,
    ``tower: both``) encoded in chunks of ``train.chunk_tokens``. ``queries``: the token store of the
    examples' queries (:func:`pgrank.data.token_store.query_tokens`, as the trainer passes it); the queries are
    then read as token ids, in batches of ``batch_size`` queries of similar length (sorted, so that a batch pads
    little), laid out as a training step lays out its queries; without it they are tokenized from their text,
    in the examples' order. Sharded under DDP: every rank reranks and evaluates its share of the queries
    (``rank::size``), and the per-query metrics are gathered, so every rank returns every query's, equal
    to a single process's (tested with two gloo processes).
    """
    cfg = params.train
    was_training = model.training
    model.eval()
    device = next(model.parameters()).device
    per_query: dict[str, dict[str, float]] = {}
    mine = np.arange(world.rank, len(examples), world.size, dtype=np.int64)
    if queries is not None:
        mine = mine[np.argsort(queries.lengths(mine), kind="stable")]
    try:
        for lo in range(0, len(mine), batch_size):
            batch = make_batch(examples.examples(mine[lo : lo + batch_size]), device)
            if queries is None:
                q = encode(model, [ex.query for ex in batch.examples], task="query", max_length=cfg.max_query_length,
                           amp=cfg.amp)
            else:
                q = run_features(model, query_features(queries, batch.examples, device), task="query", amp=cfg.amp)
            if frozen is not None:
                docs = frozen.vectors(batch.unique_rows, device)
            else:
                chunks = token_chunks(model, documents.gather(batch.unique_rows), documents.features, cfg.chunk_tokens)
                docs = encode_tokens(model, chunks, len(batch.unique_rows), task="document", amp=cfg.amp)
            scores = candidate_scores(q, docs, batch.index, cfg.similarity).cpu().tolist()
            run = {ex.qid: dict(zip(map(str, ex.rows.tolist()), scores[b])) for b, ex in enumerate(batch.examples)}
            per_query.update(evaluate_run({qid: qrels[qid] for qid in run}, run, ks=(1, 3, 5, 10), mrr_k=10)[1])
    finally:
        model.train(was_training)
    return distributed.gather_dicts(per_query, world)


def qrels_by_row(qrels, corpus) -> dict[str, dict[str, int]]:
    """Judgments keyed by corpus row (``"17"``) instead of document id, as runs over candidate rows are; a
    judged document missing from the corpus keeps a key of its own, so the ideal ranking still counts it."""
    pairs = [(q, d, g) for q, docs in qrels.items() for d, g in docs.items()]
    rows = corpus.rows(d for _, d, _ in pairs).tolist()
    out: dict[str, dict[str, int]] = {q: {} for q in qrels}
    for (q, d, g), r in zip(pairs, rows):
        out[q][str(r) if r >= 0 else f"missing:{d}"] = g
    return out


@dataclass(frozen=True)
class ValidationSet:
    """An out-of-domain validation set (``train.validation_sets``): its own corpus, candidates, judgments."""

    name: str
    examples: TrainingSet
    qrels: dict
    corpus: object
    frozen: FrozenDocuments | None


def out_of_domain_set(params: Params, paths: Paths, name: str, doc_ref) -> ValidationSet:
    """A ``train.validation_sets`` entry (``dataset/split``) with its corpus, candidates and judgments by row."""
    from pgrank.data.beir import load_topics
    from pgrank.data.corpus_store import open_corpus

    dataset, split = name.split("/")
    corpus = open_corpus(paths, dataset)
    examples = training_set(paths, dataset, split, corpus, training=True)
    frozen = frozen_documents(params, paths, doc_ref, corpus) if params.train.tower == "query" else None
    return ValidationSet(name, examples, qrels_by_row(load_topics(paths, dataset, split)[1], corpus), corpus, frozen)
