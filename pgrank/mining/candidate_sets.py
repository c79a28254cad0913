"""``pgrank mine``: stage-1 candidate sets, exactly as the paper builds them.

For each query of a split (paper, "Data" and "Evaluation Setup"): all judged-relevant documents
(rel > 0), then the stage-1 retriever's top-ranked other documents, until the set has
``mine.candidates`` documents (paper: 1000; fewer only if the corpus is smaller). Every document
keeps its real stage-1 score, and the file's rank order (score descending, then document id) starts
with exactly the retriever's own top ranks.

Caution for first-stage metrics read off a candidate file: cut it by *rank* (the first k lines of a
query), do not hand the whole set to trec_eval. trec_eval breaks score ties by document id
*descending*, so injected relevant documents whose stage-1 score ties with retrieved ones (BM25
scores of 0 on short queries: 75 of nfcorpus' 323 test queries) move into its top 10; nDCG@10 of
BM25 on nfcorpus test is 0.320 by rank but 0.426 from the whole candidate file.

Sources (``mine.source``), looked up by name in :data:`SOURCES` and imported only when used:

* ``dense``: any sentence-transformers model, exact inner-product search over its corpus-embedding
  artifact (:mod:`pgrank.retrieval.dense.retriever`);
* ``bm25``: :mod:`pgrank.retrieval.bm25.retriever`;
* ``published``: the authors' own evaluation sets, converted (:mod:`pgrank.retrieval.published.candidates`);
  dev and test splits only.

Judged-relevant documents missing from the corpus (ArguAna has some) cannot be candidates; they are
counted in :class:`MineResult`. A query with more than ``mine.candidates`` relevant documents keeps
them all, and no others.

Candidate sets are written to a columnar store (:mod:`pgrank.data.candidate_store`: corpus rows and
grades, memory-mapped by training and evaluation) and, for evaluation splits, as a TREC run beside it.
Nothing holds a split's sets in memory: queries are searched :data:`QUERY_BATCH` at a time as arrays,
and each set streams to disk as soon as it is complete.

Example:
    >>> result = mine(params, paths, "scifact", "test")
    >>> read_run(paths.candidates("scifact", "test"))["1"]      # {doc_id: stage-1 score}
"""

from __future__ import annotations

import importlib
import logging
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from pgrank import tracking
from pgrank.config import Params
from pgrank.data.beir import Qrels, load_topics
from pgrank.data.candidate_store import ScoredSet, write_candidates
from pgrank.data.corpus_store import CorpusStore, open_corpus
from pgrank.data.runs import order_keys
from pgrank.errors import DataError, PgrankError
from pgrank.paths import CARVED_SPLITS, Paths, carved_splits

log = logging.getLogger(__name__)

# Queries searched per pass over the corpus (bounds the memory of the running top k: 4096 x 1000 pairs).
QUERY_BATCH = 4096


@dataclass(frozen=True)
class MineResult:
    """What one ``dataset/split`` mining run wrote and saw."""

    dataset: str
    split: str
    source: str
    path: Path  # the candidate store (the TREC run, when written, is Paths.candidates beside it)
    queries: int
    min_size: int
    max_size: int
    relevant: int  # judged-relevant (query, document) pairs in the candidate sets
    relevant_missing: int  # judged-relevant pairs whose document is not in the corpus / set
    stage1_recall: float | None  # share of relevant pairs the retriever itself ranked in the top set size
    oversized: int  # queries whose relevant documents alone exceed mine.candidates
    seconds: float  # for this split, once the corpus and its index or embeddings were ready


def candidate_set(relevant_rows: np.ndarray, relevant_scores: np.ndarray, top_rows: np.ndarray,
                  top_scores: np.ndarray, size: int, ranks: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """One query's candidate set: every relevant document, then the best other retrieved ones.

    Pure. Args:
        relevant_rows, relevant_scores: the judged-relevant documents (corpus rows) and their stage-1 scores.
        top_rows, top_scores: the retriever's top documents, best first.
        size: the set size to fill up to (all relevant documents are kept even beyond it).
        ranks: the corpus' id ranks (:attr:`pgrank.data.corpus_store.CorpusStore.id_ranks`).

    Returns:
        ``(rows, scores)`` in file order (score descending, then document id ascending).
    """
    others = ~np.isin(top_rows, relevant_rows)
    fill = max(size - len(relevant_rows), 0)
    rows = np.concatenate([relevant_rows, top_rows[others][:fill]]).astype(np.int64)
    scores = np.concatenate([relevant_scores, top_scores[others][:fill]]).astype(np.float32)
    order = np.argsort(order_keys(scores, ranks[rows]), kind="stable")
    return rows[order], scores[order]


def _judged(qrels: Qrels, corpus: CorpusStore) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """Each query's judged documents that are in the corpus: ``(rows, grades)``, one id lookup for the split."""
    pairs = [(q, d, g) for q, docs in qrels.items() for d, g in docs.items()]
    rows = corpus.rows(d for _, d, _ in pairs)
    out: dict[str, tuple[list, list]] = {q: ([], []) for q in qrels}
    for (q, _, g), r in zip(pairs, rows.tolist()):
        if r >= 0:
            out[q][0].append(r)
            out[q][1].append(g)
    return {q: (np.array(r, dtype=np.int64), np.array(g, dtype=np.int64)) for q, (r, g) in out.items()}


# --------------------------------------------------------------------------------------- retrievers


def _stage1(retriever, qids: Sequence[str], queries: Mapping[str, str], relevant: Mapping[str, np.ndarray], k: int,
            progress: bool) -> Iterator[tuple[str, np.ndarray, np.ndarray, np.ndarray]]:
    """Search ``qids`` (in order) in batches: ``(qid, top rows, top scores, relevant rows' scores)``."""
    from tqdm.auto import tqdm

    with tqdm(total=len(qids), desc="searching", unit="query", disable=not progress) as bar:
        for lo in range(0, len(qids), QUERY_BATCH):
            batch = qids[lo : lo + QUERY_BATCH]
            encoded = retriever.encode([queries[q] for q in batch])
            scores, rows = retriever.search(encoded, k)
            # Relevant documents the retriever ranked below the top k: score them directly.
            q_rows, d_rows = [], []
            for i, q in enumerate(batch):
                below = relevant[q][~np.isin(relevant[q], rows[i])]
                q_rows.append(np.full(len(below), i))
                d_rows.append(below)
            extra = {}
            if q_rows and sum(map(len, d_rows)):
                q_all, d_all = np.concatenate(q_rows), np.concatenate(d_rows)
                values = retriever.score(encoded, q_all, d_all)
                extra = {(int(i), int(d)): float(v) for i, d, v in zip(q_all, d_all, values)}
            for i, q in enumerate(batch):
                top_rows, top_scores = rows[i][rows[i] >= 0], scores[i][rows[i] >= 0]
                found = dict(zip(top_rows.tolist(), top_scores.tolist()))
                rel_scores = np.array([found[d] if d in found else extra[i, d] for d in relevant[q].tolist()],
                                      dtype=np.float32)
                yield q, top_rows, top_scores, rel_scores
            bar.update(len(batch))


# source -> the module whose for_mining(params, paths, dataset) opens its retriever (dvc.yaml's mine
# stages depend on pgrank/retrieval/${mine.source}, so only the source in use is their code).
SOURCES: dict[str, str] = {
    "dense": "pgrank.retrieval.dense.retriever",
    "bm25": "pgrank.retrieval.bm25.retriever",
    "published": "pgrank.retrieval.published.candidates",
}


# --------------------------------------------------------------------------------------- the stage


def training_targets(params: Params) -> list[tuple[str, str]]:
    """The carved splits of ``data.train`` (DVC stage ``mine-train``): ``train-pg``, ``validation`` and, when
    there is one, ``gate-pg`` (whose candidate sets the champion gate freezes and reranks). They are mined by
    ``mine.training_source`` (the authors published no training candidates, so ``published`` mines them dense)."""
    dataset = params.data.train.split("/")[0]
    return [(dataset, split) for split in carved_splits(params.data)]


def validation_targets(params: Params) -> list[tuple[str, str]]:
    """``train.validation_sets``: out-of-domain sets validated during training, mined as training sets
    (into ``training-sets/``, by ``mine-train``, with ``mine.training_source``) so that training never waits on an
    evaluation stage."""
    return [tuple(s.split("/")) for s in params.train.validation_sets]


def evaluation_targets(params: Params, dataset: str | None = None) -> list[tuple[str, str]]:
    """The ``data.eval_sets`` splits (of ``dataset`` only, when given; DVC stage ``mine@<dataset>``)."""
    by_dataset = params.data.eval_sets_by_dataset()
    if dataset is not None and dataset not in by_dataset:
        raise PgrankError(f"--dataset {dataset}: not in data.eval_sets ({', '.join(by_dataset)}); "
                          "give --split to mine any other split")
    return [(d, s) for d, splits in by_dataset.items() if dataset in (None, d) for s in splits]


def select_targets(params: Params, dataset: str | None = None, splits: Sequence[str] = (),
                   training: bool = False) -> list[tuple[str, str]]:
    """The ``(dataset, split)`` pairs to mine.

    * ``training``: :func:`training_targets`;
    * ``dataset`` and ``splits``: exactly those splits of the dataset;
    * ``dataset`` alone: its evaluation splits;
    * nothing: the training splits, then every evaluation split.

    Raises:
        PgrankError: an impossible combination, or a dataset that is not an evaluation set.
    """
    if training:
        if dataset is not None or splits:
            raise PgrankError("--training mines data.train's carved splits; it takes no --dataset or --split")
        return training_targets(params)
    if splits:
        if dataset is None:
            raise PgrankError("--split needs --dataset")
        return [(dataset, s) for s in dict.fromkeys(splits)]
    if dataset is not None:
        return evaluation_targets(params, dataset)
    train = training_targets(params)
    return train + [t for t in evaluation_targets(params) if t not in train]


@dataclass
class _Tally:
    """Running counts for a :class:`MineResult`, kept while candidate sets stream to disk."""

    queries: int = 0
    min_size: int | None = None
    max_size: int = 0
    relevant: int = 0
    hits: int = 0
    oversized: int = 0

    def add(self, size: int, relevant: int, hits: int, oversized: bool) -> None:
        self.queries += 1
        self.min_size = size if self.min_size is None else min(self.min_size, size)
        self.max_size = max(self.max_size, size)
        self.relevant, self.hits, self.oversized = self.relevant + relevant, self.hits + hits, self.oversized + oversized

    def result(self, dataset, split, source, path, missing, recall: bool, started) -> MineResult:
        return MineResult(
            dataset=dataset, split=split, source=source, path=path, queries=self.queries,
            min_size=self.min_size or 0, max_size=self.max_size, relevant=self.relevant, relevant_missing=missing,
            stage1_recall=self.hits / self.relevant if recall and self.relevant else None,
            oversized=self.oversized, seconds=time.perf_counter() - started,
        )


def _mined_sets(retriever, queries: Mapping[str, str], judged: Mapping[str, tuple[np.ndarray, np.ndarray]],
                size: int, tally: _Tally, progress: bool) -> Iterator[ScoredSet]:
    """Candidate sets in sorted query-id order, one query at a time, counted into ``tally``."""
    ranks = retriever.store.id_ranks
    relevant = {q: np.unique(rows[grades > 0]) for q, (rows, grades) in judged.items()}
    qids = sorted(queries)
    for qid, top_rows, top_scores, rel_scores in _stage1(retriever, qids, queries, relevant, size, progress):
        rel = relevant[qid]
        rows, scores = candidate_set(rel, rel_scores, top_rows, top_scores, size, ranks)
        judged_rows, judged_grades = judged[qid]
        grades = np.zeros(len(rows), dtype=np.int64)
        if len(judged_rows):
            order = np.argsort(judged_rows)
            at = np.minimum(np.searchsorted(judged_rows[order], rows), len(judged_rows) - 1)
            hit = judged_rows[order][at] == rows
            grades[hit] = judged_grades[order][at[hit]]
        tally.add(len(rows), len(rel), int(np.isin(rel, top_rows).sum()), len(rel) > size)
        yield qid, queries[qid], rows, scores, grades


def _mine_published(params: Params, paths: Paths, dataset: str, split: str) -> MineResult:
    from pgrank.data.candidate_store import run_sets

    started = time.perf_counter()
    published = importlib.import_module(SOURCES["published"])
    source = published.fetch_published(dataset, split, params.mine.published_dir)
    sets = published.read_published(source)
    queries, qrels = load_topics(paths, dataset, split)
    unknown = sorted(q for q in sets if q not in queries)
    if unknown:  # checked before the corpus store is built: a bad file changes nothing
        raise DataError(f"{source}: query {unknown[0]!r} is not a query of {dataset}/{split} "
                        f"({len(unknown)} such queries); is it the file of another dataset or split?")
    corpus = open_corpus(paths, dataset)
    absent = [q for q in qrels if q not in sets]
    if absent:
        log.warning("%s/%s: %d judged queries have no published candidate set (e.g. %s)",
                    dataset, split, len(absent), absent[:3])
    known = {}
    for qid, docs in sets.items():
        rows = corpus.rows(d for d, _ in docs)
        if (rows < 0).any():
            log.warning("%s/%s: query %s: %d published candidates are not in the corpus; dropped",
                        dataset, split, qid, int((rows < 0).sum()))
        known[qid] = {d: s for (d, s), r in zip(docs, rows.tolist()) if r >= 0}
    in_set = {q: set(docs) for q, docs in known.items()}
    relevant = {q: [d for d, r in docs.items() if r > 0 and d in in_set.get(q, ())] for q, docs in qrels.items()}
    missing = sum(1 for q, docs in qrels.items() for d, r in docs.items() if r > 0) - sum(map(len, relevant.values()))
    tally = _Tally()
    for qid, docs in known.items():
        tally.add(len(docs), len(relevant.get(qid, ())), 0, False)
    path = write_candidates(paths, dataset, split, run_sets(known, corpus, queries, qrels), corpus=corpus,
                            tag="pgrank-published", trec=True, meta={"source": "published"})
    return tally.result(dataset, split, "published", path, missing, False, started)


def mine_splits(
    params: Params, paths: Paths, targets: Sequence[tuple[str, str]], *, progress: bool = True, training: bool = False
) -> list[MineResult]:
    """Mine several splits, opening each corpus (and its index or embeddings) once.

    Each split's candidate sets go to its store (``Paths.candidate_store``; with ``training``, all of
    them among the training sets, as ``train.validation_sets`` are); the TREC run beside it
    (``Paths.candidates``) is written for evaluation splits, and for the carved training splits only
    with ``mine.training_runs`` (MS MARCO's are 5x10^8 lines, about 25 GB, that nothing downstream reads).
    Training sets (the carved splits, and every target with ``training``) are mined by
    ``mine.training_source``, the others by ``mine.source``.

    Returns:
        One :class:`MineResult` per target, in order.

    Raises:
        DataError: a dataset or split is missing or malformed, or a published file is unavailable.
    """
    cfg = params.mine
    results: dict[tuple[str, str], MineResult] = {}
    name = "mine/" + ",".join("/".join(t) for t in targets)
    by_source = [(d, s, cfg.training_source if training or s in CARVED_SPLITS else cfg.source) for d, s in targets]
    sources = ",".join(dict.fromkeys(src for _, _, src in by_source))
    with tracking.stage_run(params, paths, name, tags={"stage": "mine", "source": sources},
                            log_params={"mine": cfg.model_dump(mode="json"), "targets": ["/".join(t) for t in targets]},
                            enabled=params.tracking.enabled, resources=True, spool=True) as run:
        for dataset, source in dict.fromkeys((d, src) for d, _, src in by_source):
            splits = [s for d, s, src in by_source if (d, src) == (dataset, source)]
            if source == "published":
                for split in splits:
                    results[dataset, split] = _mine_published(params, paths, dataset, split)
                continue
            topics = {split: load_topics(paths, dataset, split) for split in splits}  # fail fast on a bad split
            retriever = importlib.import_module(SOURCES[source]).for_mining(params, paths, dataset, progress=progress)
            corpus = retriever.store
            for split, (queries, qrels) in topics.items():
                started = time.perf_counter()
                size = min(cfg.candidates, len(corpus))
                judged = _judged(qrels, corpus)
                n_relevant = sum(1 for docs in qrels.values() for r in docs.values() if r > 0)
                tally = _Tally()
                trec = not training and split not in CARVED_SPLITS or cfg.training_runs
                path = write_candidates(paths, dataset, split, _mined_sets(retriever, queries, judged, size, tally, progress),
                                        corpus=corpus, tag=f"pgrank-{source}", trec=trec,
                                        meta={"source": source, "candidates": size}, training=training)
                results[dataset, split] = tally.result(dataset, split, source, path, n_relevant - tally.relevant,
                                                       True, started)
                log.info("%s/%s: %d queries -> %s", dataset, split, tally.queries, path)
        for (dataset, split), r in results.items():
            tracking.log_metrics(run, {f"{dataset}/{split}/queries": r.queries, f"{dataset}/{split}/seconds": r.seconds,
                                       **({f"{dataset}/{split}/stage1_recall": r.stage1_recall}
                                          if r.stage1_recall is not None else {})})
    return [results[t] for t in targets]


def mine(params: Params, paths: Paths, dataset: str, split: str, *, progress: bool = True) -> MineResult:
    """Mine the candidate sets of one ``dataset/split`` into ``Paths.candidate_store(dataset, split)``.

    Args:
        params: the parsed params (``mine``, ``models`` and ``data`` sections are read).
        paths: artifact locations.
        dataset: BEIR name, e.g. ``"msmarco"``.
        split: ``"dev"``, ``"test"``, or the carved ``"train-pg"`` / ``"validation"``.
        progress: show progress bars.
    """
    return mine_splits(params, paths, [(dataset, split)], progress=progress)[0]
