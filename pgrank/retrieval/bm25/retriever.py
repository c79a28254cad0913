"""BM25 as a retriever: one corpus, searched and scored for batches of queries.

Every retriever kind (``pgrank/retrieval/<kind>/retriever.py``) has the same shape, used by mining
(stage-1 candidates) and by evaluation (reranking and first-stage search):

* ``doc_ids``: the corpus ids in row order; ``rows(doc_ids)``: their rows;
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
from pgrank.data.beir import load_corpus
from pgrank.paths import Paths
from pgrank.retrieval.bm25.index import Bm25Index, bm25_search, build_bm25


class Bm25Retriever:
    """BM25 with ``mine.bm25``'s settings over one dataset's corpus."""

    def __init__(self, index: Bm25Index):
        self.index = index
        self.doc_ids = index.doc_ids
        self._row = {d: i for i, d in enumerate(self.doc_ids)}

    @classmethod
    def open(cls, params: Params, paths: Paths, dataset: str, *, progress: bool = False) -> "Bm25Retriever":
        corpus = load_corpus(paths.dataset(dataset), progress=progress)
        return cls(build_bm25(corpus, params.mine.bm25, show_progress=progress))

    def rows(self, doc_ids: Sequence[str]) -> np.ndarray:
        return np.fromiter((self._row[d] for d in doc_ids), dtype=np.int64, count=len(doc_ids))

    def encode(self, texts: Sequence[str]) -> list[str]:
        return list(texts)

    def search(self, encoded: list[str], k: int) -> tuple[np.ndarray, np.ndarray]:
        return bm25_search(self.index, encoded, k)

    def score(self, encoded: list[str], query_rows: np.ndarray, doc_rows: np.ndarray) -> np.ndarray:
        out = np.empty(len(doc_rows), dtype=np.float32)
        for q in np.unique(query_rows):
            mask = query_rows == q
            out[mask] = self.index.scores(encoded[int(q)])[doc_rows[mask]]
        return out


def for_mining(params: Params, paths: Paths, dataset: str, *, progress: bool = True) -> Bm25Retriever:
    """The stage-1 retriever of ``mine.source: bm25``."""
    return Bm25Retriever.open(params, paths, dataset, progress=progress)


def for_evaluation(params: Params, paths: Paths, system: str, dataset: str) -> Bm25Retriever:
    """The ``bm25`` comparison system."""
    return Bm25Retriever.open(params, paths, dataset)
