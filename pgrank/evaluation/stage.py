"""The evaluation stage, ``pgrank evaluate`` (paper "Evaluation Setup", "Comparison System").

For one system on one ``dataset/split``, two stages:

* ``rerank`` (second stage): every document of each query's candidate set
  (``Paths.candidates``) is scored and the set is sorted;
* ``full`` (first stage): the whole corpus is searched for the top ``evaluate.top_k``.

Systems are ``evaluate.systems`` by kind (:mod:`pgrank.evaluation.systems`): ``bm25`` (bm25s with
``mine.bm25``'s settings), ``dense`` sentence-transformers models (dot product over the
corpus-embedding artifact, built once and reused by mining and training), ``sparse`` SPLADE models
(``SparseEncoder``), and the trained policies ``pgrank-<warm start>[@epoch]``. A ``tower: query``
checkpoint is a query/document pair: queries go through the trained query route, documents through the
frozen warm start, whose artifact is reused as is.

Outputs, per (system, dataset, split, stage), in ``Paths.results``: ``metrics.json`` (means and, for
policies, a paired significance test against the warm start), ``per_query.json`` and ``run.trec``.
Metrics come from pytrec_eval (:mod:`pgrank.core.trec_eval`); documents whose id equals the query id
are ignored when ``evaluate.ignore_identical_ids`` is set (on a copy of the run).
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from pgrank import tracking
from pgrank.atomic import write_json
from pgrank.config import EVAL_STAGES, Params
from pgrank.core.trec_eval import evaluate_run
from pgrank.data.beir import load_topics
from pgrank.data.runs import ranked, read_run, write_run
from pgrank.errors import PgrankError
from pgrank.evaluation.significance import against_baseline
from pgrank.evaluation.systems import open_system, warm_start_of
from pgrank.paths import Paths

log = logging.getLogger(__name__)

# Queries whose candidate documents are scored together when reranking (bounds the pairs in memory).
RERANK_QUERIES = 256


@dataclass(frozen=True)
class EvalResult:
    system: str
    dataset: str
    split: str
    stage: str
    metrics: dict[str, float]
    folder: Path


def rerank_run(retriever, encoded, qids: Sequence[str], candidates: dict[str, dict[str, float]]) -> dict:
    """Score each query's candidate set with ``retriever``: ``{qid: {doc_id: score}}`` (queries without a set are left out)."""
    run = {}
    todo = [(i, q) for i, q in enumerate(qids) if q in candidates]
    for lo in range(0, len(todo), RERANK_QUERIES):
        chunk = todo[lo : lo + RERANK_QUERIES]
        docs = [list(candidates[q]) for _, q in chunk]
        query_rows = np.repeat([i for i, _ in chunk], [len(d) for d in docs])
        doc_rows = retriever.rows([d for ds in docs for d in ds])
        scores = retriever.score(encoded, query_rows, doc_rows)
        at = 0
        for (_, q), ds in zip(chunk, docs):
            run[q] = {d: float(s) for d, s in zip(ds, scores[at : at + len(ds)])}
            at += len(ds)
    return run


def search_run(retriever, encoded, qids: Sequence[str], k: int) -> dict:
    """The top ``k`` of the whole corpus for each query: ``{qid: {doc_id: score}}``."""
    scores, rows = retriever.search(encoded, k)
    ids = retriever.doc_ids
    return {q: {ids[r]: float(s) for s, r in zip(scores[i], rows[i]) if r >= 0} for i, q in enumerate(qids)}


def evaluate(params: Params, paths: Paths, system: str, eval_set: str, stages: Sequence[str] = EVAL_STAGES, *,
             retriever=None) -> list[EvalResult]:
    """Evaluate one system on one ``dataset/split`` in the given stages; write and return the results.

    ``retriever``: one opened for this system and dataset (:func:`pgrank.evaluation.systems.open_system`),
    shared by the splits of a dataset.
    """
    dataset, _, split = eval_set.partition("/")
    cfg = params.evaluate
    queries, qrels = load_topics(paths, dataset, split)
    retriever = retriever or open_system(params, paths, system, dataset)
    qids = list(queries)
    encoded = retriever.encode([queries[q] for q in qids])
    ks = sorted(set(cfg.ks) | {100})
    warm = warm_start_of(system)
    results = []
    for stage in stages:
        if stage == "rerank":
            cand_path = paths.candidates(dataset, split)
            if not cand_path.is_file():
                raise PgrankError(f"{cand_path}: no candidate sets; run `pgrank mine --dataset {dataset}`")
            run = rerank_run(retriever, encoded, qids, read_run(cand_path, known=queries))
        else:
            run = search_run(retriever, encoded, qids, cfg.top_k + (1 if cfg.ignore_identical_ids else 0))
        means, per_query = evaluate_run(qrels, run, ks, mrr_k=10, ignore_identical_ids=cfg.ignore_identical_ids)
        folder = paths.results(system, dataset, split, stage)
        significance = None if warm is None else against_baseline(
            per_query, paths.results(warm, dataset, split, stage) / "per_query.json", warm, cfg.significance)
        system_info = getattr(retriever, "system", None)
        record = {"system": system, "model": getattr(system_info, "query_model", system),
                  "epoch": getattr(system_info, "epoch", None), "dataset": dataset, "split": split, "stage": stage,
                  "queries": len(per_query), "metrics": means, "significance": significance}
        write_json(folder / "per_query.json", per_query)
        write_run(folder / "run.trec", ((q, ranked(run[q])) for q in sorted(run)), system)
        write_json(folder / "metrics.json", record)
        with tracking.stage_run(params, paths, f"evaluate/{system}/{eval_set}/{stage}",
                                tags={"stage": "evaluate-result", "system": system, "eval_set": eval_set, "eval_stage": stage},
                                log_params={"system": system, "eval_set": eval_set, "stage": stage},
                                enabled=params.tracking.enabled) as mlflow_run:
            tracking.log_metrics(mlflow_run, means)
        results.append(EvalResult(system, dataset, split, stage, means, folder))
    return results


def evaluate_dataset(params: Params, paths: Paths, system: str, dataset: str) -> list[EvalResult]:
    """Every ``data.eval_sets`` split of ``dataset`` in ``evaluate.stages`` (one DVC stage's work).

    A policy is also reranked at each ``evaluate.policy_epochs`` epoch (the epoch ablation). Writes
    ``Paths.metrics_summary(system, dataset)``: ``{split: {stage: metrics}}`` plus
    ``{"epoch-E": {split: {"rerank": metrics}}}``.
    """
    splits = params.data.eval_sets_by_dataset().get(dataset)
    if not splits:
        raise PgrankError(f"dataset {dataset!r} is not in data.eval_sets ({', '.join(params.data.eval_sets_by_dataset())})")
    with tracking.stage_run(params, paths, f"evaluate/{system}/{dataset}", tags={"stage": "evaluate", "system": system,
                            "dataset": dataset}, enabled=params.tracking.enabled, resources=True):
        results, summary = _evaluate_dataset(params, paths, system, dataset, splits)
    write_json(paths.metrics_summary(system, dataset), summary)
    return results


def _evaluate_dataset(params: Params, paths: Paths, system: str, dataset: str, splits: list[str]):
    results, summary = [], {}
    retriever = open_system(params, paths, system, dataset)  # shared by the splits
    for split in splits:
        for r in evaluate(params, paths, system, f"{dataset}/{split}", params.evaluate.stages, retriever=retriever):
            summary.setdefault(split, {})[r.stage] = r.metrics
            results.append(r)
    if warm_start_of(system) is not None and "@" not in system and "rerank" in params.evaluate.stages:
        kept = [e for e in params.evaluate.policy_epochs if e in params.train.keep_epochs and 0 < e < params.train.epochs]
        if len(kept) < len(params.evaluate.policy_epochs):
            log.warning("evaluate.policy_epochs %s: only %s are kept epochs strictly inside (0, train.epochs); "
                        "the others are skipped", params.evaluate.policy_epochs, kept)
        for epoch in kept:
            epoch_retriever = open_system(params, paths, f"{system}@{epoch}", dataset)
            for split in splits:
                for r in evaluate(params, paths, f"{system}@{epoch}", f"{dataset}/{split}", ["rerank"],
                                  retriever=epoch_retriever):
                    summary.setdefault(f"epoch-{epoch}", {}).setdefault(split, {})["rerank"] = r.metrics
                    results.append(r)
    return results, summary
