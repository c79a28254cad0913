"""Learned sparse models (SPLADEv2) as retrievers, through sentence-transformers' ``SparseEncoder``.

The same shape as every retriever kind (see :mod:`pgrank.retrieval.bm25.retriever`): the corpus
becomes one CSR matrix of vocabulary weights, queries become CSR rows, scores are dot products.

Example:
    >>> retriever = for_evaluation(params, paths, "splade-v2", "scifact")
    >>> scores, rows = retriever.search(retriever.encode(["what causes fever"]), k=10)
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from pgrank.config import Params
from pgrank.data.beir import document_text, load_corpus
from pgrank.paths import Paths
from pgrank.retrieval.sparse.splade import (
    encode_sparse,
    load_sparse_encoder,
    sparse_search,
)


class SparseRetriever:
    """One SPLADE model over one dataset's corpus (encoded on construction)."""

    def __init__(self, params: Params, paths: Paths, name: str, dataset: str):
        from pgrank.models.hub import resolve_model

        cfg = params.evaluate
        self.batch_size = cfg.batch_size
        self.model = load_sparse_encoder(resolve_model(name, params.models).source, max_seq_length=cfg.max_seq_length)
        corpus = load_corpus(paths.dataset(dataset), progress=False)
        self.doc_ids = list(corpus)
        self._row = {d: i for i, d in enumerate(self.doc_ids)}
        self.matrix = encode_sparse(self.model, [document_text(corpus[d]) for d in self.doc_ids], task="document",
                                    batch_size=self.batch_size)

    def rows(self, doc_ids: Sequence[str]) -> np.ndarray:
        return np.fromiter((self._row[d] for d in doc_ids), dtype=np.int64, count=len(doc_ids))

    def encode(self, texts: Sequence[str]):
        return encode_sparse(self.model, list(texts), task="query", batch_size=self.batch_size)

    def search(self, encoded, k: int) -> tuple[np.ndarray, np.ndarray]:
        return sparse_search(encoded, self.matrix, self.doc_ids, k)

    def score(self, encoded, query_rows: np.ndarray, doc_rows: np.ndarray) -> np.ndarray:
        pairs = self.matrix[doc_rows].multiply(encoded[query_rows])  # element-wise, row by row
        return np.asarray(pairs.sum(axis=1), dtype=np.float32).ravel()


def for_evaluation(params: Params, paths: Paths, system: str, dataset: str) -> SparseRetriever:
    """A comparison system of ``evaluate.systems.sparse``."""
    return SparseRetriever(params, paths, system, dataset)
