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
``metrics.json`` names a model of the workspace (a policy's checkpoint) by its path relative to
``paths.root``, so that two clones doing the same computation write the same bytes (:func:`model_record`).
Metrics come from pytrec_eval (:mod:`pgrank.core.trec_eval`); documents whose id equals the query id
are ignored when ``evaluate.ignore_identical_ids`` is set (on a copy of the run).
"""

from __future__ import annotations

import json
import logging
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from pgrank import tracking
from pgrank.atomic import write_json
from pgrank.config import EVAL_STAGES, Params, SignificanceConfig
from pgrank.core.significance import paired_tests
from pgrank.core.trec_eval import evaluate_run, mean_metrics
from pgrank.data.beir import load_topics
from pgrank.data.candidate_store import CandidateStore, open_candidates
from pgrank.data.runs import ranked, write_run
from pgrank.errors import PgrankError
from pgrank.evaluation.systems import canonical, open_system, warm_start_of
from pgrank.paths import parse_policy_name, split_run_key
from pgrank.paths import Paths

log = logging.getLogger(__name__)

# Bounds on what one evaluation holds at once: (query, document) pairs scored together when reranking,
# and queries whose runs are evaluated and written together (MS MARCO dev: 7M pairs in all).
RERANK_PAIRS = 65536
EVAL_QUERIES = 1024


@dataclass(frozen=True)
class EvalResult:
    system: str
    dataset: str
    split: str
    stage: str
    metrics: dict[str, float]
    folder: Path


Run = dict[str, dict[str, float]]


def rerank_runs(retriever, encoded, qids: Sequence[str], candidates: CandidateStore) -> Iterator[Run]:
    """Score each query's candidate set with ``retriever``, in chunks of about :data:`RERANK_PAIRS` pairs:
    ``{qid: {doc_id: score}}`` per chunk, queries in sorted id order (queries without a set are left out).

    ``encoded`` holds the queries in the order of ``qids``.
    """
    position = {q: i for i, q in enumerate(qids)}
    todo = [(position[q], at) for q in sorted(qids) if (at := candidates.index(q)) is not None]
    lo = 0
    while lo < len(todo):
        hi, pairs = lo, 0
        while hi < len(todo) and (pairs == 0 or pairs < RERANK_PAIRS):
            pairs += int(candidates.offsets[todo[hi][1] + 1] - candidates.offsets[todo[hi][1]])
            hi += 1
        chunk = todo[lo:hi]
        rows = [candidates.candidates(at)[0] for _, at in chunk]
        query_rows = np.repeat([i for i, _ in chunk], [len(r) for r in rows])
        doc_rows = np.concatenate(rows).astype(np.int64)
        scores = retriever.score(encoded, query_rows, doc_rows).tolist()
        ids = retriever.doc_ids.take(doc_rows)
        run, at = {}, 0
        for (i, _), r in zip(chunk, rows):
            run[qids[i]] = dict(zip(ids[at : at + len(r)], scores[at : at + len(r)]))
            at += len(r)
        yield run
        lo = hi


def search_runs(retriever, encoded, qids: Sequence[str], k: int) -> Iterator[Run]:
    """The top ``k`` of the whole corpus for each query, in chunks of :data:`EVAL_QUERIES` queries (sorted ids)."""
    scores, rows = retriever.search(encoded, k)
    order = sorted(range(len(qids)), key=qids.__getitem__)
    for lo in range(0, len(order), EVAL_QUERIES):
        run = {}
        for i in order[lo : lo + EVAL_QUERIES]:
            keep = rows[i] >= 0
            run[qids[i]] = dict(zip(retriever.doc_ids.take(rows[i][keep]), scores[i][keep].tolist()))
        yield run


def model_record(model: str, paths: Paths) -> str:
    """``model`` as ``metrics.json`` records it: a folder under ``paths.root`` relative to it
    (``models/minilm/pg/selected``), any other name (a hub id, a folder of your own) as given."""
    path = Path(model)
    return path.relative_to(paths.root).as_posix() if path.is_absolute() and path.is_relative_to(paths.root) else model


def evaluate(params: Params, paths: Paths, system: str, eval_set: str, stages: Sequence[str] = EVAL_STAGES, *,
             retriever=None) -> list[EvalResult]:
    """Evaluate one system on one ``dataset/split`` in the given stages; write and return the results.

    ``retriever``: one opened for this system and dataset (:func:`pgrank.evaluation.systems.open_system`),
    shared by the splits of a dataset. Runs are evaluated and written a chunk of queries at a time.
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
            runs = rerank_runs(retriever, encoded, qids, open_candidates(paths, dataset, split))
        else:
            runs = search_runs(retriever, encoded, qids, cfg.top_k + (1 if cfg.ignore_identical_ids else 0))
        folder = paths.results(system, dataset, split, stage)
        per_query: dict[str, dict[str, float]] = {}

        def evaluated(runs=runs, per_query=per_query):
            for run in runs:
                per_query.update(evaluate_run({q: qrels[q] for q in run}, run, ks, mrr_k=10,
                                              ignore_identical_ids=cfg.ignore_identical_ids)[1])
                yield from ((q, ranked(run[q])) for q in sorted(run))

        write_run(folder / "run.trec", evaluated(), system)
        means = mean_metrics(per_query)
        significance = None if warm is None else against_baseline(
            per_query, paths.results(warm, dataset, split, stage) / "per_query.json", warm, cfg.significance)
        system_info = getattr(retriever, "system", None)
        record = {"system": system, "model": model_record(getattr(system_info, "query_model", system), paths),
                  "epoch": getattr(system_info, "epoch", None), "dataset": dataset, "split": split, "stage": stage,
                  "queries": len(per_query), "metrics": means, "significance": significance}
        if getattr(retriever, "encoding", None):  # a dense system: the backends and stored precision behind the figures
            record["encoding"] = retriever.encoding
        write_json(folder / "per_query.json", per_query)
        write_json(folder / "metrics.json", record)
        with tracking.stage_run(params, paths, f"evaluate/{system}/{eval_set}/{stage}",
                                tags={"stage": "evaluate-result", "system": system, "eval_set": eval_set, "eval_stage": stage},
                                log_params={"system": system, "eval_set": eval_set, "stage": stage},
                                enabled=params.tracking.enabled) as mlflow_run:
            tracking.log_metrics(mlflow_run, means)
        results.append(EvalResult(system, dataset, split, stage, means, folder))
    return results


def _candidate_rows(paths: Paths, dataset: str, splits: Sequence[str]) -> np.ndarray:
    """Every corpus row in the candidate sets of ``splits`` (what a rerank-only system must encode)."""
    return np.unique(np.concatenate([np.asarray(open_candidates(paths, dataset, s).rows) for s in splits]))


def evaluate_dataset(params: Params, paths: Paths, system: str, dataset: str) -> list[EvalResult]:
    """Every ``data.eval_sets`` split of ``dataset`` in ``evaluate.stages`` (one DVC stage's work).

    A policy is also reranked at each ``evaluate.policy_epochs`` epoch (the epoch ablation). Writes
    ``Paths.metrics_summary(system, dataset)``: ``{split: {stage: metrics}}`` plus
    ``{"epoch-E": {split: {"rerank": metrics}}}``.
    """
    system = canonical(system)
    splits = params.data.eval_sets_by_dataset().get(dataset)
    if not splits:
        raise PgrankError(f"dataset {dataset!r} is not in data.eval_sets ({', '.join(params.data.eval_sets_by_dataset())})")
    with tracking.stage_run(params, paths, f"evaluate/{system}/{dataset}", tags={"stage": "evaluate", "system": system,
                            "dataset": dataset}, enabled=params.tracking.enabled, resources=True, spool=True):
        results, summary = _evaluate_dataset(params, paths, system, dataset, splits)
    write_json(paths.metrics_summary(system, dataset), summary)
    return results


def _evaluate_dataset(params: Params, paths: Paths, system: str, dataset: str, splits: list[str]):
    results, summary = [], {}
    rerank_only = "full" not in params.evaluate.stages
    candidates = _candidate_rows(paths, dataset, splits) if rerank_only else None
    retriever = open_system(params, paths, system, dataset, candidates=candidates)  # shared by the splits
    for split in splits:
        for r in evaluate(params, paths, system, f"{dataset}/{split}", params.evaluate.stages, retriever=retriever):
            summary.setdefault(split, {})[r.stage] = r.metrics
            results.append(r)
    policy = parse_policy_name(system)
    if policy is not None and policy.epoch is None and "rerank" in params.evaluate.stages:
        kept = params.train.for_run(*split_run_key(policy.objective)).kept_inside(params.evaluate.policy_epochs)
        trained = [e for e in kept if paths.checkpoint(policy.warm, e, policy.objective).is_dir()]
        if len(trained) < len(kept):  # train.selection.patience stopped training before these epochs
            log.warning("%s: epochs %s were not trained (early stopping); not evaluated", system,
                        sorted(set(kept) - set(trained)))
            kept = trained
        elif len(kept) < len(params.evaluate.policy_epochs):
            log.warning("evaluate.policy_epochs %s: only %s are kept epochs strictly inside (0, train.epochs); "
                        "the others are skipped", params.evaluate.policy_epochs, kept)
        candidates = candidates if candidates is not None else _candidate_rows(paths, dataset, splits) if kept else None
        for epoch in kept:  # rerank only: only the documents of the candidate sets are encoded
            epoch_retriever = open_system(params, paths, f"{system}@{epoch}", dataset, candidates=candidates)
            for split in splits:
                for r in evaluate(params, paths, f"{system}@{epoch}", f"{dataset}/{split}", ["rerank"],
                                  retriever=epoch_retriever):
                    summary.setdefault(f"epoch-{epoch}", {}).setdefault(split, {})["rerank"] = r.metrics
                    results.append(r)
    return results, summary


def against_baseline(per_query: dict[str, dict[str, float]], baseline_file: Path, baseline: str,
                     cfg: SignificanceConfig) -> dict | None:
    """Every metric of ``per_query`` tested against the baseline's ``per_query.json``
    (:func:`pgrank.core.significance.paired_tests`, ``evaluate.significance``).

    Returns ``None`` (with a warning) when the baseline has not been evaluated.
    """
    if not baseline_file.is_file():
        log.warning("%s: no results of the warm start %r; run it first for a significance test", baseline_file, baseline)
        return None
    other = json.loads(baseline_file.read_text(encoding="utf-8"))
    return paired_tests(per_query, other, baseline, cfg.test, cfg.alpha)
