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

Sources (``mine.source``), dispatched through :data:`RETRIEVERS`:

* ``dense``: any sentence-transformers model (:mod:`pgrank.models`), exact inner-product search
  with FAISS (:mod:`pgrank.search`) over the corpus-embedding artifact (:mod:`pgrank.embeddings`).
* ``bm25``: :mod:`pgrank.bm25`.
* ``published``: the authors' own evaluation sets, converted (:mod:`pgrank.candidates`); dev and
  test splits only.

Judged-relevant documents missing from the corpus (ArguAna has some) cannot be candidates; they are
counted in :class:`MineResult`. A query with more than ``mine.candidates`` relevant documents keeps
them all, and no others.

Example:
    >>> result = mine(params, paths, "scifact", "test")
    >>> read_candidates(result.path)["1"]      # {doc_id: stage-1 score}
"""

from __future__ import annotations

import functools
import logging
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from pgrank.candidates import fetch_published, ranked, read_candidates, read_published, write_candidates
from pgrank.config import Params
from pgrank.data import CARVED_TRAIN, VALIDATION, Corpus, Qrels, load_corpus, load_topics
from pgrank.errors import DataError, PgrankError
from pgrank.paths import Paths

__all__ = ["MineResult", "RETRIEVERS", "candidate_set", "default_targets", "mine", "mine_splits", "read_candidates",
           "select_targets"]

log = logging.getLogger(__name__)

# Queries searched per pass over the corpus shards (bounds the memory of the running top k), and
# corpus rows per FAISS call (fewer, larger calls; 2**20 x 768 float32 is 3 GiB).
QUERY_BATCH = 16384
SEARCH_BLOCK_ROWS = 1 << 20

# What a retriever gives for one query: its top documents best first, and the stage-1 scores of
# the query's judged-relevant documents (in the corpus), wherever they rank. A retriever takes the
# queries (in the order to yield them), their relevant documents and k, and yields (qid, Stage1)
# pairs one at a time, so that a split's candidate sets stream into the file (MS MARCO train:
# 500k queries x 1000 documents never sit in memory together).
Stage1 = tuple[list[tuple[str, float]], dict[str, float]]
Retrieve = Callable[[Mapping[str, str], Mapping[str, list[str]], int], Iterator[tuple[str, Stage1]]]


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


def _rows_of(doc_ids: Sequence[str], wanted: set[str]) -> dict[str, int]:
    """Corpus rows of the wanted documents (not a full id->row map: MS MARCO has 8.8M ids)."""
    return {d: i for i, d in enumerate(doc_ids) if d in wanted}


# --------------------------------------------------------------------------------------- retrievers


def _dense_retriever(params: Params, paths: Paths, dataset: str, corpus: Corpus, progress: bool) -> Retrieve:
    from pgrank.embeddings import encode_queries, model_corpus_embeddings
    from pgrank.models import load_encoder, resolve_model
    from pgrank.search import dense_search, id_ranks

    cfg = params.mine
    ref = resolve_model(cfg.model, params.models)
    model = functools.cache(lambda: load_encoder(ref, params.models, max_seq_length=cfg.max_seq_length))
    emb = model_corpus_embeddings(
        ref, params.models, paths, dataset, max_seq_length=cfg.max_seq_length, batch_size=cfg.batch_size,
        chunk_size=cfg.chunk_size, corpus_loader=lambda: corpus, load_model=model, show_progress=progress,
    )
    if len(emb.doc_ids) != len(corpus) or emb.doc_ids != list(corpus):
        raise DataError(
            f"{emb.folder}: built from a different corpus than {paths.dataset(dataset)}; delete the folder to rebuild it"
        )
    ranks = id_ranks(emb.doc_ids)

    def retrieve(queries: Mapping[str, str], relevant: Mapping[str, list[str]], k: int) -> Iterator[tuple[str, Stage1]]:
        qids, qvecs = encode_queries(model(), queries, batch_size=cfg.batch_size, show_progress=progress)
        rows_of = _rows_of(emb.doc_ids, {d for docs in relevant.values() for d in docs})
        for lo in range(0, len(qids), QUERY_BATCH):
            scores, rows = dense_search(qvecs[lo : lo + QUERY_BATCH], emb.blocks(SEARCH_BLOCK_ROWS), ranks, k)
            batch = []
            for i in range(len(scores)):
                top = [(emb.doc_ids[r], float(s)) for s, r in zip(scores[i], rows[i])]
                batch.append((qids[lo + i], top, dict(top)))
            # Relevant documents the retriever ranked below the top k: score them directly.
            pairs = [(i, d) for i, (qid, _, seen) in enumerate(batch) for d in relevant[qid] if d not in seen]
            if pairs:
                vecs = emb.vectors(np.array([rows_of[d] for _, d in pairs]))  # (P, D)
                extra = np.einsum("pd,pd->p", vecs, qvecs[[lo + i for i, _ in pairs]])
                for (i, d), s in zip(pairs, extra):
                    batch[i][2][d] = float(s)
            for qid, top, seen in batch:
                yield qid, (top, {d: seen[d] for d in relevant[qid]})

    return retrieve


def _bm25_retriever(params: Params, paths: Paths, dataset: str, corpus: Corpus, progress: bool) -> Retrieve:
    from pgrank.bm25 import build_bm25
    from pgrank.search import top_k

    index = build_bm25(corpus, params.mine.bm25, show_progress=progress)
    everyone = np.arange(len(index.doc_ids))[None, :]

    def retrieve(queries: Mapping[str, str], relevant: Mapping[str, list[str]], k: int) -> Iterator[tuple[str, Stage1]]:
        from tqdm.auto import tqdm

        rows_of = _rows_of(index.doc_ids, {d for docs in relevant.values() for d in docs})
        for qid, text in tqdm(queries.items(), desc="BM25", unit="query", disable=not progress):
            scores = index.scores(text)
            top_s, top_r = top_k(scores[None, :], everyone, index.ranks, k)
            top = [(index.doc_ids[r], float(s)) for s, r in zip(top_s[0], top_r[0])]
            yield qid, (top, {d: float(scores[rows_of[d]]) for d in relevant[qid]})

    return retrieve


RETRIEVERS: dict[str, Callable[[Params, Paths, str, Corpus, bool], Retrieve]] = {
    "dense": _dense_retriever,
    "bm25": _bm25_retriever,
}


# --------------------------------------------------------------------------------------- the stage


def default_targets(params: Params) -> list[tuple[str, str]]:
    """Every ``(dataset, split)`` the pipeline needs candidates for.

    The training dataset's carved ``train-pg`` and ``validation`` splits, then every
    ``data.eval_sets`` entry. With ``mine.source: published`` only the evaluation sets (the authors
    published no training candidates).
    """
    train_dataset = params.data.train.split("/")[0]
    targets = [] if params.mine.source == "published" else [(train_dataset, CARVED_TRAIN), (train_dataset, VALIDATION)]
    for entry in params.data.eval_sets:
        target = tuple(entry.split("/"))
        if target not in targets:
            targets.append(target)
    return targets


def select_targets(params: Params, dataset: str | None = None, split: str | None = None) -> list[tuple[str, str]]:
    """The ``(dataset, split)`` pairs to mine: both given, that pair; else :func:`default_targets` filtered.

    Raises:
        PgrankError: the filter matches none of the pipeline's splits.
    """
    if dataset is not None and split is not None:
        return [(dataset, split)]
    defaults = default_targets(params)
    targets = [t for t in defaults if dataset in (None, t[0]) and split in (None, t[1])]
    if not targets:
        asked = " ".join(f"--{k} {v}" for k, v in (("dataset", dataset), ("split", split)) if v is not None)
        raise PgrankError(
            f"{asked}: matches none of the splits the pipeline mines ({', '.join('/'.join(t) for t in defaults)}); "
            "give both --dataset and --split to mine any other split"
        )
    return targets


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


def _stream_sets(retrieve: Retrieve, queries: Mapping[str, str], relevant: Mapping[str, list[str]], size: int,
                 tally: _Tally) -> Iterator[tuple[str, list[tuple[str, float]]]]:
    """Candidate sets in sorted query-id order, one query at a time, counted into ``tally``."""
    for qid, (top, rel_scores) in retrieve({q: queries[q] for q in sorted(queries)}, relevant, size):
        chosen = candidate_set(rel_scores, top, size)
        tally.add(len(chosen), len(rel_scores), sum(1 for d, _ in top if d in rel_scores), len(rel_scores) > size)
        yield qid, chosen


def _mine_published(params: Params, paths: Paths, dataset: str, split: str) -> MineResult:
    started = time.perf_counter()
    sets = read_published(fetch_published(dataset, split, params.mine.published_dir))
    _, qrels = load_topics(paths, dataset, split)
    in_set = {q: {d for d, _ in docs} for q, docs in sets.items()}
    relevant = {q: [d for d, r in docs.items() if r > 0 and d in in_set.get(q, ())] for q, docs in qrels.items()}
    missing = sum(1 for q, docs in qrels.items() for d, r in docs.items() if r > 0) - sum(map(len, relevant.values()))
    absent = [q for q in qrels if q not in sets]
    if absent:
        log.warning("%s/%s: %d judged queries have no published candidate set (e.g. %s)",
                    dataset, split, len(absent), absent[:3])
    path = paths.candidates(dataset, split)
    write_candidates(path, sets, "published")
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
    for dataset in dict.fromkeys(d for d, _ in targets):
        splits = [s for d, s in targets if d == dataset]
        if cfg.source == "published":
            for split in splits:
                results[dataset, split] = _mine_published(params, paths, dataset, split)
            continue
        topics = {split: load_topics(paths, dataset, split) for split in splits}  # fail fast on a bad split
        corpus = load_corpus(paths.dataset(dataset), progress=progress)
        retrieve = RETRIEVERS[cfg.source](params, paths, dataset, corpus, progress)
        for split, (queries, qrels) in topics.items():
            started = time.perf_counter()
            size = min(cfg.candidates, len(corpus))
            relevant = _relevant(qrels, corpus.__contains__)
            judged = sum(1 for docs in qrels.values() for r in docs.values() if r > 0)
            tally = _Tally()
            path = paths.candidates(dataset, split)
            write_candidates(path, _stream_sets(retrieve, queries, relevant, size, tally), cfg.source)
            missing = judged - tally.relevant
            results[dataset, split] = tally.result(dataset, split, cfg.source, path, missing, True, started)
            log.info("%s/%s: %d queries -> %s", dataset, split, tally.queries, path)
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
