"""The evaluation stage, ``pgrank evaluate`` (paper "Evaluation Setup", "Comparison System").

For one system on one ``dataset/split``, two stages:

* ``rerank`` (second stage): every document of each query's candidate set
  (``Paths.candidates``) is scored and the set is sorted;
* ``full`` (first stage): the whole corpus is searched for the top ``evaluate.top_k``.

Systems (``evaluate.systems``):

* ``bm25`` — bm25s with ``mine.bm25``'s settings;
* a sentence-transformers model by alias, hub id or folder (SBERT, TAS-B, MiniLM, ...), dense dot
  product over the corpus-embedding artifact (built once, reused by mining and training);
* a name in ``evaluate.sparse_systems`` (SPLADEv2) — sentence-transformers' ``SparseEncoder``;
* ``pgrank-<warm start>`` (the last epoch) or ``pgrank-<warm start>@<epoch>`` — a trained
  checkpoint. A ``tower: query`` checkpoint is a query/document pair: queries go through the trained
  query route, documents through the frozen warm start, whose artifact is reused as is.

Outputs, per (system, dataset, split, stage), in ``Paths.results``: ``metrics.json`` (means and, for
pgrank systems, a paired significance test against the warm start), ``per_query.json`` and
``run.trec``. Metrics come from pytrec_eval (:mod:`pgrank.metrics`); documents whose id equals the
query id are ignored when ``evaluate.ignore_identical_ids`` is set (on a copy of the run).
"""

from __future__ import annotations

import functools
import json
import logging
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from pgrank import tracking
from pgrank.atomic import atomic_path, write_json
from pgrank.config import Params
from pgrank.errors import PgrankError
from pgrank.metrics import evaluate_run
from pgrank.paths import Paths

log = logging.getLogger(__name__)

PGRANK_PREFIX = "pgrank-"
STAGES = ("rerank", "full")


@dataclass(frozen=True)
class System:
    """How to score with one entry of ``evaluate.systems``."""

    name: str
    kind: str  # "bm25" | "dense" | "sparse"
    query_model: str | None = None  # what encodes queries (alias, hub id or folder)
    document_model: str | None = None  # what encodes documents (its corpus artifact is reused)
    similarity: str = "dot"
    warm_start: str | None = None  # the baseline of a pgrank system
    epoch: int | None = None


def resolve_system(params: Params, paths: Paths, name: str) -> System:
    """Turn a name from ``evaluate.systems`` into a :class:`System` (see the module docstring)."""
    from pgrank.checkpoints import read_meta

    if name == "bm25":
        return System(name, "bm25")
    if name in params.evaluate.sparse_systems:
        return System(name, "sparse", query_model=name, document_model=name)
    if name.startswith(PGRANK_PREFIX):
        warm, _, epoch_text = name[len(PGRANK_PREFIX):].partition("@")
        epoch = int(epoch_text) if epoch_text.isdigit() else params.train.epochs
        folder = paths.checkpoint(warm, epoch)
        if not folder.is_dir():
            raise PgrankError(f"{folder}: no checkpoint for system {name!r}; run `pgrank train --warm-start {warm}` "
                              f"with epoch {epoch} in train.keep_epochs")
        meta = read_meta(folder)
        documents = warm if meta.get("tower") == "query" else str(folder)
        return System(name, "dense", str(folder), documents, meta.get("similarity", "dot"), warm, epoch)
    return System(name, "dense", name, name)


def _corpus_embeddings(params: Params, paths: Paths, model: str, dataset: str, corpus_loader):
    from pgrank.embeddings import model_corpus_embeddings
    from pgrank.models import resolve_model

    cfg = params.evaluate
    return model_corpus_embeddings(
        resolve_model(model, params.models), params.models, paths, dataset, max_seq_length=cfg.max_seq_length,
        batch_size=cfg.batch_size, chunk_size=params.mine.chunk_size, corpus_loader=corpus_loader)


def _normalize(x: np.ndarray) -> np.ndarray:
    return x / np.maximum(np.linalg.norm(x, axis=-1, keepdims=True), 1e-12)


class _Scorer:
    """Scores queries against candidate lists (rerank) or the whole corpus (full) for one system.

    The heavy parts (corpus, BM25 index, corpus embeddings, models, SPLADE corpus matrix) load once
    per (system, dataset) and are shared by the dataset's splits; :meth:`setup` encodes one split's
    queries.
    """

    def __init__(self, params: Params, paths: Paths, system: System, dataset: str):
        self.params, self.paths, self.system, self.dataset = params, paths, system, dataset

    @functools.cached_property
    def corpus(self) -> dict:
        from pgrank.data import load_corpus

        return load_corpus(self.paths.dataset(self.dataset))

    @functools.cached_property
    def index(self):
        from pgrank.bm25 import build_bm25

        return build_bm25(self.corpus, self.params.mine.bm25)

    @functools.cached_property
    def emb(self):
        return _corpus_embeddings(self.params, self.paths, self.system.document_model, self.dataset, lambda: self.corpus)

    @functools.cached_property
    def model(self):
        cfg = self.params.evaluate
        if self.system.kind == "sparse":
            from pgrank.models import resolve_model
            from pgrank.sparse import load_sparse_encoder

            return load_sparse_encoder(resolve_model(self.system.query_model, self.params.models).source,
                                       max_seq_length=cfg.max_seq_length)
        from pgrank.models import load_encoder

        return load_encoder(self.system.query_model, self.params.models, max_seq_length=cfg.max_seq_length)

    @functools.cached_property
    def dmat(self):
        from pgrank.embeddings import document_text
        from pgrank.sparse import encode_sparse

        return encode_sparse(self.model, [document_text(self.corpus[d]) for d in self.doc_ids], task="document",
                             batch_size=self.params.evaluate.batch_size)

    @functools.cached_property
    def doc_ids(self) -> list[str]:
        kind = self.system.kind
        return self.index.doc_ids if kind == "bm25" else self.emb.doc_ids if kind == "dense" else list(self.corpus)

    @functools.cached_property
    def row(self) -> dict[str, int]:
        return {d: i for i, d in enumerate(self.doc_ids)}

    def setup(self, queries: dict[str, str]) -> None:
        """Encode one split's queries (the shared parts load on first use)."""
        s, cfg = self.system, self.params.evaluate
        self.qids, self.queries = list(queries), queries
        if s.kind == "dense":
            from pgrank.embeddings import encode_queries

            self.qids, self.qvecs = encode_queries(self.model, queries, batch_size=cfg.batch_size)
            if s.similarity == "cosine":
                self.qvecs = _normalize(self.qvecs)
        elif s.kind == "sparse":
            from pgrank.sparse import encode_sparse

            self.qmat = encode_sparse(self.model, [queries[q] for q in self.qids], task="query", batch_size=cfg.batch_size)

    def rerank(self, qid: str, i: int, candidates: list[str]) -> dict[str, float]:
        rows = np.array([self.row[d] for d in candidates], dtype=np.int64)
        if self.system.kind == "bm25":
            scores = self.index.scores(self.queries[qid])[rows]
        elif self.system.kind == "dense":
            docs = self.emb.vectors(rows)
            docs = _normalize(docs) if self.system.similarity == "cosine" else docs
            scores = docs @ self.qvecs[i]
        else:
            scores = np.asarray((self.dmat[rows] @ self.qmat[i].T).todense()).ravel()
        return {d: float(s) for d, s in zip(candidates, scores)}

    def full(self, qids: list[str], k: int) -> dict[str, dict[str, float]]:
        if self.system.kind == "bm25":
            from pgrank.bm25 import bm25_search

            scores, rows = bm25_search(self.index, [self.queries[q] for q in qids], k)
        elif self.system.kind == "dense":
            from pgrank.search import dense_search, id_ranks

            blocks = self.emb.blocks()
            if self.system.similarity == "cosine":
                blocks = ((start, _normalize(b)) for start, b in blocks)
            scores, rows = dense_search(self.qvecs, blocks, id_ranks(self.doc_ids), k)
        else:
            from pgrank.sparse import sparse_search

            scores, rows = sparse_search(self.qmat, self.dmat, self.doc_ids, k)
        return {q: {self.doc_ids[r]: float(s) for s, r in zip(scores[i], rows[i]) if r >= 0} for i, q in enumerate(qids)}


def write_trec_run(path: Path, run: dict[str, dict[str, float]], tag: str) -> None:
    """A TREC run file (``qid Q0 doc rank score tag``), each query sorted by score, then doc id."""
    with atomic_path(path) as tmp, open(tmp, "w", encoding="utf-8") as fh:
        for qid in sorted(run):
            ranked = sorted(run[qid].items(), key=lambda kv: (-kv[1], kv[0]))
            fh.writelines(f"{qid} Q0 {d} {r} {s:.9g} {tag}\n" for r, (d, s) in enumerate(ranked, 1))


def paired_test(a: dict[str, float], b: dict[str, float], test: str) -> float:
    """Two-sided p-value of a paired test between per-query values of two systems (same queries)."""
    from scipy import stats

    qids = sorted(set(a) & set(b))
    x, y = np.array([a[q] for q in qids]), np.array([b[q] for q in qids])
    if len(qids) < 2 or np.allclose(x, y):
        return 1.0
    if test == "student":
        return float(stats.ttest_rel(x, y).pvalue)
    if test == "wilcoxon":
        return float(stats.wilcoxon(x, y).pvalue)
    result = stats.permutation_test((x, y), lambda u, v: np.mean(u - v), permutation_type="samples",
                                    n_resamples=9999, random_state=0)  # Fisher's randomization test
    return float(result.pvalue)


def _significance(params: Params, paths: Paths, system: System, dataset: str, split: str, stage: str,
                  per_query: dict) -> dict | None:
    if system.warm_start is None:
        return None
    base = paths.results(system.warm_start, dataset, split, stage) / "per_query.json"
    if not base.is_file():
        log.warning("%s: no results of the warm start %r; run it first for a significance test", base, system.warm_start)
        return None
    baseline = json.loads(base.read_text())
    cfg = params.evaluate.significance
    metrics = sorted(next(iter(per_query.values())).keys()) if per_query else []
    p = {m: paired_test({q: v[m] for q, v in per_query.items()}, {q: v[m] for q, v in baseline.items()}, cfg.test)
         for m in metrics}
    return {"baseline": system.warm_start, "test": cfg.test, "alpha": cfg.alpha, "p_values": p,
            "significant": {m: v < cfg.alpha for m, v in p.items()}}


@dataclass(frozen=True)
class EvalResult:
    system: str
    dataset: str
    split: str
    stage: str
    metrics: dict[str, float]
    folder: Path


def policy_systems(params: Params) -> list[str]:
    """The trained policies, one per warm start: ``pgrank-<warm start>``."""
    return [f"{PGRANK_PREFIX}{w}" for w in params.train.warm_starts]


def evaluate_dataset(params: Params, paths: Paths, system: str, dataset: str) -> list[EvalResult]:
    """Every ``data.eval_sets`` split of ``dataset`` in ``evaluate.stages`` (one DVC stage's work).

    A policy is also reranked at each ``evaluate.policy_epochs`` epoch (the epoch ablation). Writes
    ``Paths.metrics_summary(system, dataset)``: ``{split: {stage: metrics}}`` plus
    ``{"epoch-E": {split: {"rerank": metrics}}}``.
    """
    splits = params.data.eval_sets_by_dataset().get(dataset)
    if not splits:
        raise PgrankError(f"dataset {dataset!r} is not in data.eval_sets ({', '.join(params.data.eval_sets_by_dataset())})")
    results, summary = [], {}
    scorer = _Scorer(params, paths, resolve_system(params, paths, system), dataset)  # shared by the splits
    for split in splits:
        for r in evaluate(params, paths, system, f"{dataset}/{split}", params.evaluate.stages, scorer=scorer):
            summary.setdefault(split, {})[r.stage] = r.metrics
            results.append(r)
    if system.startswith(PGRANK_PREFIX) and "rerank" in params.evaluate.stages:
        kept = [e for e in params.evaluate.policy_epochs if e in params.train.keep_epochs and 0 < e < params.train.epochs]
        if len(kept) < len(params.evaluate.policy_epochs):
            log.warning("evaluate.policy_epochs %s: only %s are kept epochs strictly inside (0, train.epochs); "
                        "the others are skipped", params.evaluate.policy_epochs, kept)
        for epoch in kept:
            epoch_scorer = _Scorer(params, paths, resolve_system(params, paths, f"{system}@{epoch}"), dataset)
            for split in splits:
                for r in evaluate(params, paths, f"{system}@{epoch}", f"{dataset}/{split}", ["rerank"],
                                  scorer=epoch_scorer):
                    summary.setdefault(f"epoch-{epoch}", {}).setdefault(split, {})["rerank"] = r.metrics
                    results.append(r)
    write_json(paths.metrics_summary(system, dataset), summary)
    return results


def evaluate(params: Params, paths: Paths, system_name: str, eval_set: str, stages=STAGES, *,
             scorer: _Scorer | None = None) -> list[EvalResult]:
    """Evaluate one system on one ``dataset/split`` in the given stages; write and return the results.

    ``scorer``: one built for this system and dataset by an earlier call (reused across splits).
    """
    from pgrank.candidates import read_candidates
    from pgrank.data import load_topics

    dataset, _, split = eval_set.partition("/")
    cfg = params.evaluate
    system = resolve_system(params, paths, system_name) if scorer is None else scorer.system
    queries, qrels = load_topics(paths, dataset, split)
    scorer = scorer or _Scorer(params, paths, system, dataset)
    scorer.setup(queries)
    ks = sorted(set(cfg.ks) | {100})
    results = []
    for stage in stages:
        if stage == "rerank":
            cand_path = paths.candidates(dataset, split)
            if not cand_path.is_file():
                raise PgrankError(f"{cand_path}: no candidate sets; run `pgrank mine --dataset {dataset} --split {split}`")
            candidates = read_candidates(cand_path)
            index = {q: i for i, q in enumerate(scorer.qids)}
            run = {q: scorer.rerank(q, index[q], list(candidates[q])) for q in queries if q in candidates}
        else:
            run = scorer.full(list(queries), cfg.top_k + (1 if cfg.ignore_identical_ids else 0))
        means, per_query = evaluate_run(qrels, run, ks, mrr_k=10, ignore_identical_ids=cfg.ignore_identical_ids)
        folder = paths.results(system_name, dataset, split, stage)
        record = {"system": system_name, "model": system.query_model or system.kind, "epoch": system.epoch,
                  "dataset": dataset, "split": split, "stage": stage, "queries": len(per_query), "metrics": means,
                  "significance": _significance(params, paths, system, dataset, split, stage, per_query)}
        write_json(folder / "per_query.json", per_query)
        write_trec_run(folder / "run.trec", run, system_name)
        write_json(folder / "metrics.json", record)
        with tracking.stage_run(params, paths, f"evaluate/{system_name}/{eval_set}/{stage}",
                                tags={"stage": "evaluate", "system": system_name, "eval_set": eval_set, "eval_stage": stage},
                                log_params={"system": system_name, "eval_set": eval_set, "stage": stage},
                                enabled=params.tracking.enabled) as run_:
            tracking.log_metrics(run_, means)
        results.append(EvalResult(system_name, dataset, split, stage, means, folder))
    return results
