"""Dense bi-encoders as retrievers: exact inner-product search over a corpus-embedding artifact.

The same shape as every retriever kind (see :mod:`pgrank.retrieval.bm25.retriever`). Documents come
from the corpus-embedding artifact of the *document* model (built once per model, length and corpus,
and shared by mining, training and evaluation); queries are encoded by the *query* model. The two
differ for a ``tower: query`` policy, whose checkpoint pairs a trained query encoder with the frozen
warm start (:mod:`pgrank.training.checkpoints`).

Systems (:func:`for_evaluation`): a sentence-transformers model by alias, hub id or folder, or a
trained policy ``pgrank-<warm start>`` (its last epoch) / ``pgrank-<warm start>@<epoch>``.

Example:
    >>> retriever = for_evaluation(params, paths, "pgrank-minilm", "scifact")
    >>> scores, rows = retriever.search(retriever.encode(["what causes fever"]), k=10)
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from pgrank.config import Params
from pgrank.data.artifact_meta import META
from pgrank.errors import PgrankError
from pgrank.paths import Paths, parse_policy_name, split_run_key
from pgrank.retrieval.dense.query_embeddings import QueryEmbeddings


@dataclass(frozen=True)
class DenseSystem:
    """What encodes queries and documents for one system, and how they are compared."""

    name: str
    query_model: str  # alias, hub id or folder
    document_model: str  # its corpus-embedding artifact is what gets searched
    similarity: str = "dot"
    warm_start: str | None = None  # the baseline of a policy
    epoch: int | None = None


def policy_system(params: Params, paths: Paths, name: str) -> DenseSystem:
    """``pgrank-<warm>[+objective]`` (the last epoch, or the one ``train.selection`` chose) or ``...@<epoch>``."""
    from pgrank.models.checkpoint_meta import document_encoder_of, read_checkpoint_meta

    policy = parse_policy_name(name)
    warm, objective = policy.warm, policy.objective
    run = params.train.for_run(*split_run_key(objective))  # a variant may train and select otherwise
    epoch = run.epochs if policy.epoch is None else policy.epoch
    folder = paths.checkpoint(warm, epoch, objective)
    if policy.epoch is None and run.selection.rule != "last":  # the epoch train.selection chose
        folder = paths.selected_checkpoint(warm, objective)
    if not folder.is_dir():
        raise PgrankError(f"{folder}: no checkpoint for system {name!r}; run `pgrank train --warm-start {warm} "
                          f"--objective {objective}` with epoch {epoch} in train.keep_epochs")
    meta = read_checkpoint_meta(folder)
    epoch = meta.get("epoch", epoch)
    # tower:query: the frozen document encoder the policy trained against (the warm start; for a warm start
    # that is itself a tower:query checkpoint, e.g. the champion in continual retraining, its own documents)
    documents = (document_encoder_of(meta) or warm) if meta.get("tower") == "query" else str(folder)
    return DenseSystem(name, str(folder), documents, meta.get("similarity", "dot"), warm, epoch)


def comparison_system(params: Params, name: str) -> DenseSystem:
    """A model of ``evaluate.systems.dense`` (alias, hub id or folder). A ``tower: query`` checkpoint named
    there (a policy's folder, a registered version fetched back, the champion of continual retraining)
    is the system its policy is: queries through it, documents from its frozen document encoder's
    corpus-embedding artifact, which mining already built, instead of encoding the corpus again."""
    from pgrank.models.checkpoint_meta import document_encoder_of, read_checkpoint_meta
    from pgrank.models.names import resolve_model

    ref = resolve_model(name, params.models)
    meta = read_checkpoint_meta(ref.local_dir) if ref.local_dir is not None else {}
    documents = document_encoder_of(meta)
    if documents is None:
        return DenseSystem(name, name, name)
    return DenseSystem(name, name, documents, meta.get("similarity", "dot"))


def _normalize(x: np.ndarray) -> np.ndarray:
    return x / np.maximum(np.linalg.norm(x, axis=-1, keepdims=True), 1e-12)


class DenseRetriever:
    """Exact inner-product (or cosine) search of one dataset's corpus with one :class:`DenseSystem`.

    Documents come from the document model's corpus-embedding artifact, built on first use; or, for a
    rerank-only evaluation (``candidates``: the corpus rows of the candidate sets) of a model whose
    artifact does not exist yet (an epoch-ablation checkpoint of ``tower: both``), from those rows
    alone, encoded once (:class:`pgrank.retrieval.dense.corpus_embeddings.SubsetEmbeddings`).
    """

    def __init__(self, params: Params, paths: Paths, system: DenseSystem, dataset: str, *,
                 max_seq_length: int, batch_size: int, progress: bool = False, candidates: np.ndarray | None = None):
        from pgrank.data.corpus_store import open_corpus
        from pgrank.models.backends import effective_backend, embedding_key
        from pgrank.models.names import resolve_model
        from pgrank.retrieval.dense.corpus_embeddings import (
            VECTORS,
            SubsetEmbeddings,
            corpus_embedding_folder,
            model_corpus_embeddings,
        )

        self.params, self.paths, self.system = params, paths, system
        self.max_seq_length, self.batch_size, self.progress = max_seq_length, batch_size, progress
        self._query_model = None
        # Models are resolved (offline copy found, safetensors only, checksum) before the corpus store is
        # built: a bad model is reported without first writing the store into {paths.data}/.stores.
        document_ref = resolve_model(system.document_model, params.models)
        query_ref = document_ref if self._same_model else resolve_model(system.query_model, params.models)
        self.store = open_corpus(paths, dataset, progress=progress)
        self.doc_ids = self.store.ids
        backend = effective_backend(document_ref, params.models)
        query_backend = backend if self._same_model else effective_backend(query_ref, params.models)
        self._queries = QueryEmbeddings(paths.query_embeddings(embedding_key(query_ref, query_backend), max_seq_length))
        self._refs = {"query": (query_ref, query_backend), "document": (document_ref, backend)}  # loaded as resolved
        self._encoded = False
        artifact = corpus_embedding_folder(document_ref, backend, paths, max_seq_length=max_seq_length,
                                           corpus_sha256=self.store.sha256)
        if candidates is not None and not (artifact / META).is_file():
            from pgrank.data.token_store import corpus_tokens

            self.emb = SubsetEmbeddings(self._document_model(), self.store, candidates, paths.embeddings,
                                        batch_size=batch_size, chunk_size=params.mine.chunk_size, show_progress=progress,
                                        tokens=lambda model: corpus_tokens(model, paths, self.store, build=False,
                                                                           max_length=max_seq_length),
                                        max_seq_length=max_seq_length)
        else:
            self.emb = model_corpus_embeddings(
                document_ref, params.models, paths, self.store, max_seq_length=max_seq_length, batch_size=batch_size,
                chunk_size=params.mine.chunk_size, load_model=self._model if self._same_model else None,
                backend=backend, show_progress=progress)

    @property
    def _same_model(self) -> bool:
        return self.system.query_model == self.system.document_model

    def _model(self):
        """The query model under its inference backend (:mod:`pgrank.models.backends`), loaded on first use
        (kept on the instance: a retriever and its models go together)."""
        from pgrank.models.backends import load_inference_encoder

        if self._query_model is None:
            ref, backend = self._refs["query"]
            self._query_model = load_inference_encoder(ref, self.params.models, self.paths,
                                                       max_seq_length=self.max_seq_length, backend=backend)[0]
        return self._query_model

    @property
    def encoding(self) -> dict:
        """How this retriever's figures were computed, as ``metrics.json`` records it (the model card states it):
        the backend its queries ran under (``None`` until it encoded some), its documents' backend and the precision
        their embeddings are stored at."""
        from pgrank.retrieval.dense.corpus_embeddings import VECTORS

        return {"queries": self._refs["query"][1] if self._encoded else None, "documents": self._refs["document"][1],
                "document_vectors": np.dtype(VECTORS).name}

    def _document_model(self):
        from pgrank.models.backends import load_inference_encoder

        if self._same_model:
            return self._model()
        ref, backend = self._refs["document"]
        return load_inference_encoder(ref, self.params.models, self.paths, max_seq_length=self.max_seq_length,
                                      backend=backend)[0]

    def rows(self, doc_ids: Sequence[str]) -> np.ndarray:
        return self.store.rows(doc_ids)

    def _encode(self, texts: list[str]) -> np.ndarray:
        from pgrank.retrieval.dense.encoding import encode_queries

        return encode_queries(self._model(), dict(enumerate(texts)), batch_size=self.batch_size,
                              show_progress=self.progress)[1]

    def encode(self, texts: Sequence[str]) -> np.ndarray:
        """float32 ``(Q, dim)`` query embeddings (unit length for a cosine system): kept ones where this model
        encoded the same texts before (:mod:`pgrank.retrieval.dense.query_embeddings`), the model for the rest."""
        vecs = self._queries.encode(list(texts), self._encode)
        self._encoded = True
        return _normalize(vecs) if self.system.similarity == "cosine" else vecs

    def search(self, encoded: np.ndarray, k: int, *, block_rows: int | None = None) -> tuple[np.ndarray, np.ndarray]:
        """The top ``k`` of the corpus for each encoded query, as ``params.search`` says (exact unless its index is
        approximate; :func:`pgrank.retrieval.dense.exact_search.dense_search`)."""
        from pgrank.retrieval.dense.exact_search import dense_search

        blocks = self.emb.blocks(block_rows)
        if self.system.similarity == "cosine":
            blocks = ((start, _normalize(b)) for start, b in blocks)
        cfg = self.params.search
        return dense_search(encoded, blocks, self.store.id_ranks, k, backend=cfg.backend, index=cfg.index,
                            nprobe=cfg.nprobe, ef_search=cfg.ef_search)

    def score(self, encoded: np.ndarray, query_rows: np.ndarray, doc_rows: np.ndarray) -> np.ndarray:
        docs = self.emb.vectors(doc_rows)
        if self.system.similarity == "cosine":
            docs = _normalize(docs)
        return np.einsum("pd,pd->p", docs, encoded[query_rows]).astype(np.float32)


def for_mining(params: Params, paths: Paths, dataset: str, *, progress: bool = True) -> DenseRetriever:
    """The stage-1 retriever of ``mine.source: dense``: ``mine.model`` for queries and documents."""
    cfg = params.mine
    system = DenseSystem(cfg.model, cfg.model, cfg.model)
    return DenseRetriever(params, paths, system, dataset, max_seq_length=cfg.max_seq_length,
                          batch_size=cfg.batch_size, progress=progress)


def for_evaluation(params: Params, paths: Paths, name: str, dataset: str, *,
                   candidates: np.ndarray | None = None) -> DenseRetriever:
    """A comparison system of ``evaluate.systems.dense`` or a trained policy (see the module docstring);
    ``candidates``: the corpus rows a rerank-only evaluation scores (see :class:`DenseRetriever`)."""
    system = policy_system(params, paths, name) if parse_policy_name(name) else comparison_system(params, name)
    cfg = params.evaluate
    return DenseRetriever(params, paths, system, dataset, max_seq_length=cfg.max_seq_length, batch_size=cfg.batch_size,
                          candidates=candidates)
