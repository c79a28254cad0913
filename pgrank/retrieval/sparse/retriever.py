"""Learned sparse models (SPLADEv2) as retrievers, through sentence-transformers' ``SparseEncoder``.

The same shape as every retriever kind (see :mod:`pgrank.retrieval.bm25.retriever`): the corpus is a
sparse matrix of vocabulary weights, an artifact encoded once per (model, max length, corpus) and
memory-mapped (:mod:`pgrank.retrieval.sparse.splade`); queries become CSR rows; scores are dot products,
searched exactly in bounded memory.

Example:
    >>> retriever = for_evaluation(params, paths, "splade-v2", "scifact")
    >>> scores, rows = retriever.search(retriever.encode(["what causes fever"]), k=10)
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from pgrank.config import Params
from pgrank.data.artifact_meta import META
from pgrank.data.corpus_store import open_corpus
from pgrank.paths import Paths
from pgrank.retrieval.sparse.splade import (
    build_sparse_corpus,
    encode_sparse,
    load_sparse_encoder,
    open_sparse_corpus,
    sparse_search,
)


class SparseRetriever:
    """One SPLADE model over one dataset's corpus (its corpus matrix built on first use)."""

    def __init__(self, params: Params, paths: Paths, name: str, dataset: str):
        from pgrank.models.names import resolve_model

        cfg = params.evaluate
        self.batch_size, self.max_seq_length = cfg.batch_size, cfg.max_seq_length
        self.ref, self.models = resolve_model(name, params.models), params.models
        self._encoder = None
        self.store = open_corpus(paths, dataset)
        self.doc_ids = self.store.ids
        folder = paths.sparse_corpus(self.ref.key, cfg.max_seq_length, self.store.sha256)
        if (folder / META).is_file():
            self.corpus = open_sparse_corpus(folder)
        else:
            self.corpus = build_sparse_corpus(self._model, self.ref.key, self.store, folder,
                                              corpus_sha256=self.store.sha256, max_seq_length=cfg.max_seq_length,
                                              batch_size=cfg.batch_size, chunk_size=params.mine.chunk_size)

    def _model(self):
        if self._encoder is None:
            self._encoder = load_sparse_encoder(self.ref, self.models, max_seq_length=self.max_seq_length)
        return self._encoder

    def rows(self, doc_ids: Sequence[str]) -> np.ndarray:
        return self.store.rows(doc_ids)

    def encode(self, texts: Sequence[str]):
        return encode_sparse(self._model(), list(texts), task="query", batch_size=self.batch_size)

    def search(self, encoded, k: int) -> tuple[np.ndarray, np.ndarray]:
        return sparse_search(encoded, self.corpus, self.store.id_ranks, k)

    def score(self, encoded, query_rows: np.ndarray, doc_rows: np.ndarray) -> np.ndarray:
        pairs = self.corpus.take(doc_rows).multiply(encoded[query_rows])  # element-wise, row by row
        return np.asarray(pairs.sum(axis=1), dtype=np.float32).ravel()


def for_evaluation(params: Params, paths: Paths, system: str, dataset: str, *,
                   candidates: np.ndarray | None = None) -> SparseRetriever:
    """A comparison system of ``evaluate.systems.sparse`` (``candidates`` is not used: the corpus matrix is
    an artifact shared by every evaluation of the model)."""
    return SparseRetriever(params, paths, system, dataset)
