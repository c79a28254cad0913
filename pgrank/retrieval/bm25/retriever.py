"""BM25 as a retriever: one corpus, searched and scored for batches of queries.

Every retriever kind (``pgrank/retrieval/<kind>/retriever.py``) has the same shape, used by mining
(stage-1 candidates) and by evaluation (reranking and first-stage search):

* ``store``: the corpus store (:mod:`pgrank.data.corpus_store`); ``doc_ids``: its ids in row order
  (memory-mapped); ``rows(doc_ids)``: their rows (-1: not in the corpus);
* ``encode(texts)``: a batch of queries in the retriever's own representation;
* ``search(encoded, k)``: ``(scores, rows)``, each ``(Q, min(k, N))``, best first in the run order
  (score descending, then document id ascending; :func:`pgrank.data.runs.top_k`);
* ``score(encoded, query_rows, doc_rows)``: float32 scores of (query, document) pairs.

Example:
    >>> retriever = Bm25Retriever.open(params, paths, "scifact")
    >>> encoded = retriever.encode(["what causes fever"])
    >>> scores, rows = retriever.search(encoded, k=10)
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from pgrank.config import Params
from pgrank.data.corpus_store import open_corpus
from pgrank.paths import Paths
from pgrank.retrieval.bm25.index import Bm25Index, bm25_index


class Bm25Retriever:
    """BM25 with ``mine.bm25``'s settings over one dataset's corpus (its index built on first use)."""

    def __init__(self, store, index: Bm25Index):
        self.store = store
        self.index = index
        self.doc_ids = store.ids

    @classmethod
    def open(cls, params: Params, paths: Paths, dataset: str, *, progress: bool = False) -> "Bm25Retriever":
        store = open_corpus(paths, dataset, progress=progress)
        return cls(store, bm25_index(paths, dataset, params.mine.bm25, store=store, progress=progress))

    def rows(self, doc_ids: Sequence[str]) -> np.ndarray:
        return self.store.rows(doc_ids)

    def encode(self, texts: Sequence[str]) -> list[list[int]]:
        return self.index.token_ids(texts)

    def search(self, encoded: list[list[int]], k: int) -> tuple[np.ndarray, np.ndarray]:
        return self.index.search(encoded, k)

    def score(self, encoded: list[list[int]], query_rows: np.ndarray, doc_rows: np.ndarray) -> np.ndarray:
        out = np.empty(len(doc_rows), dtype=np.float32)
        for q in np.unique(query_rows).tolist():
            mask = query_rows == q
            out[mask] = self.index.pair_scores(encoded[q], doc_rows[mask])
        return out


def for_mining(params: Params, paths: Paths, dataset: str, *, progress: bool = True) -> Bm25Retriever:
    """The stage-1 retriever of ``mine.source: bm25``."""
    return Bm25Retriever.open(params, paths, dataset, progress=progress)


def for_evaluation(params: Params, paths: Paths, system: str, dataset: str, *,
                   candidates: np.ndarray | None = None) -> Bm25Retriever:
    """The ``bm25`` comparison system (``candidates`` is not used: the index is an artifact)."""
    return Bm25Retriever.open(params, paths, dataset)
