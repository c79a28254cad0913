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

Example:
    >>> result = mine(params, paths, "scifact", "test")
    >>> read_run(result.path)["1"]      # {doc_id: stage-1 score}
"""

from __future__ import annotations

import importlib
import logging
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from pgrank import tracking
from pgrank.config import Params
from pgrank.data.beir import Qrels, load_topics
from pgrank.data.runs import ranked, write_run
from pgrank.errors import PgrankError
from pgrank.paths import CARVED_TRAIN, VALIDATION, Paths

log = logging.getLogger(__name__)

# Queries searched per pass over the corpus (bounds the memory of the running top k).
QUERY_BATCH = 16384

# What stage 1 gives for one query: its top documents best first, and the stage-1 scores of the
# query's judged-relevant documents (in the corpus), wherever they rank. They stream query by query
# into the candidate file (MS MARCO train: 500k queries x 1000 documents never sit in memory together).
Stage1 = tuple[list[tuple[str, float]], dict[str, float]]


@dataclass(frozen=True)
class MineResult:
    """What one ``dataset/split`` mining run wrote and saw."""

    dataset: str
    split: str
    source: str
    path: Path
    queries: int
    min_size: int
    max_size: int
    relevant: int  # judged-relevant (query, document) pairs in the candidate sets
    relevant_missing: int  # judged-relevant pairs whose document is not in the corpus / set
    stage1_recall: float | None  # share of relevant pairs the retriever itself ranked in the top set size
    oversized: int  # queries whose relevant documents alone exceed mine.candidates
    seconds: float  # for this split, once the corpus and its index or embeddings were ready


def candidate_set(
    relevant: Mapping[str, float], retrieved: Sequence[tuple[str, float]], size: int
) -> list[tuple[str, float]]:
    """One query's candidate set: every relevant document, then the best other retrieved ones.

    Pure. Args:
        relevant: judged-relevant documents with their stage-1 scores.
        retrieved: the retriever's top documents, best first, with scores.
        size: the set size to fill up to (all relevant documents are kept even beyond it).

    Returns:
        The set in file order (score descending, then document id ascending).
    """
    chosen = dict(relevant)
    for doc, score in retrieved:
        if len(chosen) >= size:
            break
        chosen.setdefault(doc, score)
    return ranked(chosen)


def _relevant(qrels: Qrels, in_corpus: Callable[[str], bool]) -> dict[str, list[str]]:
    return {qid: sorted(d for d, rel in docs.items() if rel > 0 and in_corpus(d)) for qid, docs in qrels.items()}


# --------------------------------------------------------------------------------------- retrievers


def _stage1(retriever, queries: Mapping[str, str], relevant: Mapping[str, list[str]], k: int,
            progress: bool) -> Iterator[tuple[str, Stage1]]:
    """Search ``queries`` (in order) in batches: each query's top ``k`` and its relevant documents' scores."""
    from tqdm.auto import tqdm

    qids = list(queries)
    ids = retriever.doc_ids
    with tqdm(total=len(qids), desc="searching", unit="query", disable=not progress) as bar:
        for lo in range(0, len(qids), QUERY_BATCH):
            batch = qids[lo : lo + QUERY_BATCH]
            encoded = retriever.encode([queries[q] for q in batch])
            scores, rows = retriever.search(encoded, k)
            tops = [[(ids[r], float(s)) for s, r in zip(scores[i], rows[i]) if r >= 0] for i in range(len(batch))]
            seen = [dict(top) for top in tops]
            # Relevant documents the retriever ranked below the top k: score them directly.
            pairs = [(i, d) for i, q in enumerate(batch) for d in relevant[q] if d not in seen[i]]
            if pairs:
                extra = retriever.score(encoded, np.array([i for i, _ in pairs]), retriever.rows([d for _, d in pairs]))
                for (i, d), s in zip(pairs, extra):
                    seen[i][d] = float(s)
            for i, q in enumerate(batch):
                yield q, (tops[i], {d: seen[i][d] for d in relevant[q]})
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
    """The carved ``train-pg`` and ``validation`` splits of ``data.train`` (DVC stage ``mine-train``)."""
    if params.mine.source == "published":
        raise PgrankError("mine.source=published: the authors published no training candidates; "
                          "mine the training splits with mine.source=dense or bm25")
    dataset = params.data.train.split("/")[0]
    return [(dataset, CARVED_TRAIN), (dataset, VALIDATION)]


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
    * nothing: the training splits (unless ``mine.source`` is ``published``), then every evaluation split.

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
    train = [] if params.mine.source == "published" else training_targets(params)
    return train + [t for t in evaluation_targets(params) if t not in train]


@dataclass
class _Tally:
    """Running counts for a :class:`MineResult`, kept while candidate sets stream to the file."""

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


def _stream_sets(retriever, queries: Mapping[str, str], relevant: Mapping[str, list[str]], size: int,
                 tally: _Tally, progress: bool) -> Iterator[tuple[str, list[tuple[str, float]]]]:
    """Candidate sets in sorted query-id order, one query at a time, counted into ``tally``."""
    ordered = {q: queries[q] for q in sorted(queries)}
    for qid, (top, rel_scores) in _stage1(retriever, ordered, relevant, size, progress):
        chosen = candidate_set(rel_scores, top, size)
        tally.add(len(chosen), len(rel_scores), sum(1 for d, _ in top if d in rel_scores), len(rel_scores) > size)
        yield qid, chosen


def _mine_published(params: Params, paths: Paths, dataset: str, split: str) -> MineResult:
    started = time.perf_counter()
    published = importlib.import_module(SOURCES["published"])
    sets = published.read_published(published.fetch_published(dataset, split, params.mine.published_dir))
    _, qrels = load_topics(paths, dataset, split)
    in_set = {q: {d for d, _ in docs} for q, docs in sets.items()}
    relevant = {q: [d for d, r in docs.items() if r > 0 and d in in_set.get(q, ())] for q, docs in qrels.items()}
    missing = sum(1 for q, docs in qrels.items() for d, r in docs.items() if r > 0) - sum(map(len, relevant.values()))
    absent = [q for q in qrels if q not in sets]
    if absent:
        log.warning("%s/%s: %d judged queries have no published candidate set (e.g. %s)",
                    dataset, split, len(absent), absent[:3])
    path = paths.candidates(dataset, split)
    write_run(path, sets, "pgrank-published")
    tally = _Tally()
    for qid, docs in sets.items():
        tally.add(len(docs), len(relevant.get(qid, ())), 0, False)
    return tally.result(dataset, split, "published", path, missing, False, started)


def mine_splits(
    params: Params, paths: Paths, targets: Sequence[tuple[str, str]], *, progress: bool = True
) -> list[MineResult]:
    """Mine several splits, loading each corpus (and building its index or embeddings) once.

    Returns:
        One :class:`MineResult` per target, in order.

    Raises:
        DataError: a dataset or split is missing or malformed, or a published file is unavailable.
    """
    cfg = params.mine
    results: dict[tuple[str, str], MineResult] = {}
    name = "mine/" + ",".join("/".join(t) for t in targets)
    with tracking.stage_run(params, paths, name, tags={"stage": "mine", "source": cfg.source},
                            log_params={"mine": cfg.model_dump(mode="json"), "targets": ["/".join(t) for t in targets]},
                            enabled=params.tracking.enabled, resources=True) as run:
        for dataset in dict.fromkeys(d for d, _ in targets):
            splits = [s for d, s in targets if d == dataset]
            if cfg.source == "published":
                for split in splits:
                    results[dataset, split] = _mine_published(params, paths, dataset, split)
                continue
            topics = {split: load_topics(paths, dataset, split) for split in splits}  # fail fast on a bad split
            retriever = importlib.import_module(SOURCES[cfg.source]).for_mining(params, paths, dataset, progress=progress)
            in_corpus = set(retriever.doc_ids).__contains__
            for split, (queries, qrels) in topics.items():
                started = time.perf_counter()
                size = min(cfg.candidates, len(retriever.doc_ids))
                relevant = _relevant(qrels, in_corpus)
                judged = sum(1 for docs in qrels.values() for r in docs.values() if r > 0)
                tally = _Tally()
                path = paths.candidates(dataset, split)
                write_run(path, _stream_sets(retriever, queries, relevant, size, tally, progress), f"pgrank-{cfg.source}")
                missing = judged - tally.relevant
                results[dataset, split] = tally.result(dataset, split, cfg.source, path, missing, True, started)
                log.info("%s/%s: %d queries -> %s", dataset, split, tally.queries, path)
        for (dataset, split), r in results.items():
            tracking.log_metrics(run, {f"{dataset}/{split}/queries": r.queries, f"{dataset}/{split}/seconds": r.seconds,
                                       **({f"{dataset}/{split}/stage1_recall": r.stage1_recall}
                                          if r.stage1_recall is not None else {})})
    return [results[t] for t in targets]


def mine(params: Params, paths: Paths, dataset: str, split: str, *, progress: bool = True) -> MineResult:
    """Mine the candidate sets of one ``dataset/split`` into ``Paths.candidates(dataset, split)``.

    Args:
        params: the parsed params (``mine``, ``models`` and ``data`` sections are read).
        paths: artifact locations.
        dataset: BEIR name, e.g. ``"msmarco"``.
        split: ``"dev"``, ``"test"``, or the carved ``"train-pg"`` / ``"validation"``.
        progress: show progress bars.
    """
    return mine_splits(params, paths, [(dataset, split)], progress=progress)[0]
