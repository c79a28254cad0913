"""What a training step feeds its models, made from token stores ahead of the step, on a background thread.

A step reads token ids, never strings (:mod:`pgrank.data.token_store`): the training split's queries, and the
corpus for the documents it encodes (``tower: both``, the KL reference's documents, and the document anchor's).
:func:`prepare_step` gathers them and lays them out (:mod:`pgrank.models.packing`): the queries in
``preprocess``'s padded layout, the candidates as length-sorted chunks of at most ``train.chunk_tokens``
tokens, packed where the model packs. :class:`Prefetcher` prepares the next step's inputs while the device
runs the current one, so the host's work (reading the candidate store, gathering ids, building the layouts,
pinned copies) is off the critical path.
"""

from __future__ import annotations

import zlib
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field, replace

import numpy as np
import torch

from pgrank.config import Params
from pgrank.data.token_store import TokenStore, query_tokens
from pgrank.models.packing import Chunk, chunk_features
from pgrank.training.batches import Batch, make_batch
from pgrank.training.grad_cache import token_chunks


@dataclass(frozen=True)
class StepTokens:
    """A run's token stores: the training split's queries; the corpus as documents (``tower: both`` or a KL
    reference over documents), and as the query route reads it (the document anchor: the same store unless a
    ``Router`` tokenizes queries apart)."""

    queries: TokenStore
    documents: TokenStore | None = None
    anchor: TokenStore | None = None
    validation: dict = field(default_factory=dict)  # tower: both: each train.validation_sets corpus's documents
    validation_queries: TokenStore | None = None  # the in-domain validation split's queries
    ood_queries: dict = field(default_factory=dict)  # each train.validation_sets split's queries, by set name


@dataclass(frozen=True)
class StepInputs:
    """One (local) batch and its laid-out inputs, on their way to the device."""

    batch: Batch
    queries: dict  # the queries' features (padded layout, batch order)
    documents: list[Chunk] | None  # the batch's unique candidates, tower: both
    anchor_rows: np.ndarray | None  # train.document_anchor's candidate rows
    anchor_queries: dict | None  # those rows as the query route tokenizes them (padded)
    anchor_documents: dict | None  # and as the document route does (the warm start's target, tower: both)


def anchor_rows(batch: Batch, seed: int, epoch: int, k: int) -> np.ndarray:
    """``k`` of the batch's candidate rows (all when it has fewer), drawn by the run's seed, the epoch and the
    batch's queries: a resumed run draws the same ones."""
    key = zlib.crc32("\n".join(ex.qid for ex in batch.examples).encode())
    rows = batch.unique_rows
    if len(rows) <= k:
        return rows
    return rows[np.sort(np.random.default_rng([seed, epoch, key]).choice(len(rows), size=k, replace=False))]


def query_features(store: TokenStore, examples, device: torch.device) -> dict:
    """The features of ``examples``' queries (their ``row`` in ``store``), in their order: ``preprocess``'s padded
    layout, as a step feeds its queries to the model (validation too)."""
    return chunk_features(store.gather([ex.row for ex in examples]), store.features, packed=False, device=device)


def prepare_step(examples, params: Params, tokens: StepTokens, *, epoch: int, model,
                 device: torch.device) -> StepInputs:
    """The inputs of a step over ``examples`` (its local share of the batch's queries); ``model``: the policy
    (whether it packs)."""
    cfg = params.train
    batch = make_batch(examples, device)
    queries = query_features(tokens.queries, batch.examples, device)
    documents = None
    if cfg.tower == "both":
        rows = tokens.documents.gather(batch.unique_rows)
        documents = token_chunks(model, rows, tokens.documents.features, cfg.chunk_tokens)
    rows = a_queries = a_documents = None
    if cfg.document_anchor.coef:
        rows = anchor_rows(batch, cfg.seed, epoch, cfg.document_anchor.documents)
        a_queries = chunk_features(tokens.anchor.gather(rows), tokens.anchor.features, packed=False, device=device)
        if cfg.tower == "both":
            a_documents = chunk_features(tokens.documents.gather(rows), tokens.documents.features, packed=False,
                                         device=device)
    return StepInputs(batch, queries, documents, rows, a_queries, a_documents)


class Prefetcher:
    """Steps' inputs made one step ahead on a background thread: ``for inputs in Prefetcher(prepare, batches)``."""

    def __init__(self, prepare: Callable[[object], StepInputs], items: Iterable):
        self.prepare, self.items = prepare, iter(items)
        self.pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="pgrank-prefetch")

    def __iter__(self) -> Iterator[StepInputs]:
        try:
            pending = self._next()
            while pending is not None:
                current, pending = pending, self._next()
                yield current.result()
        finally:
            self.pool.shutdown(wait=True, cancel_futures=True)

    def _next(self):
        item = next(self.items, None)
        return None if item is None else self.pool.submit(self.prepare, item)


def open_tokens(params: Params, paths, data, models, *, progress: bool = False) -> StepTokens:
    """A run's token stores: :func:`step_tokens` over its training data and models, and the queries of its validation
    splits (in domain and ``train.validation_sets``), which validation reads as token ids."""
    tokens = step_tokens(params, paths, data.train.store, data.corpus, models.policy,
                         reference=getattr(models.reference, "model", None),
                         validation={vs.name: vs.corpus for vs in data.out_of_domain}, progress=progress)
    length = params.train.max_query_length  # validation reads its queries as token ids too (validate_queries)
    return replace(tokens, validation_queries=query_tokens(models.policy, paths, data.validation.store, max_length=length),
                   ood_queries={vs.name: query_tokens(models.policy, paths, vs.examples.store, max_length=length)
                                for vs in data.out_of_domain})


def step_tokens(params: Params, paths, store, corpus, policy, *, reference=None, validation=None,
                progress: bool = False) -> StepTokens:
    """The token stores of a training split (``store``, its candidate store) over ``corpus`` for ``policy``'s
    tokenizer, built on first use; packing is switched on for the models that encode documents in chunks (the
    policy, and the KL ``reference``) when their architecture packs, their layers compiled under
    ``train.compile_layers``. ``validation``: ``{name: corpus store}`` of
    the out-of-domain sets, whose documents ``tower: both`` encodes too."""
    from pgrank.data.token_store import corpus_tokens
    from pgrank.models.packing import compile_layers, enable_packing_for

    cfg = params.train
    queries = query_tokens(policy, paths, store, max_length=cfg.max_query_length)
    documents = anchor = None
    others = {}
    if cfg.tower == "both":
        documents = corpus_tokens(policy, paths, corpus, task="document", max_length=cfg.max_doc_length,
                                  progress=progress)
        for model in (policy, reference):
            if model is not None and enable_packing_for(model, documents):
                compile_layers(model, cfg.compile_layers)
        others = {name: corpus_tokens(policy, paths, other, task="document", max_length=cfg.max_doc_length)
                  for name, other in (validation or {}).items()}
    if cfg.document_anchor.coef:
        anchor = corpus_tokens(policy, paths, corpus, task="query", max_length=cfg.max_doc_length, progress=progress)
    return StepTokens(queries, documents, anchor, others)


def scratch_tokens(params: Params, model, corpus, queries: list[str], folder) -> StepTokens:
    """Token stores in ``folder`` for steps over examples made in code (benchmarks): ``corpus`` (a corpus store, or
    a list of document texts) as documents and as the anchor reads it, and ``queries`` (an example's ``row``
    indexes them); packing is switched on for ``model`` when it packs."""
    from pathlib import Path

    from pgrank.data.token_store import build_token_store, corpus_blocks
    from pgrank.models.packing import compile_layers, enable_packing_for

    cfg, folder = params.train, Path(folder)
    source = {"name": "scratch", "sha256": getattr(corpus, "sha256", "-")}
    texts = corpus_blocks(corpus) if hasattr(corpus, "text_blocks") else (lambda lo, hi: list(corpus[lo:hi]))
    documents = build_token_store(model, texts, len(corpus), folder / "documents", task="document",
                                  max_length=cfg.max_doc_length, source=source)
    anchor = build_token_store(model, texts, len(corpus), folder / "anchor", task="query",
                               max_length=cfg.max_doc_length, source=source) if cfg.document_anchor.coef else None
    asked = build_token_store(model, lambda lo, hi: queries[lo:hi], len(queries), folder / "queries", task="query",
                              max_length=cfg.max_query_length, source={"name": "queries", "sha256": "-"})
    if enable_packing_for(model, documents):
        compile_layers(model, cfg.compile_layers)
    return StepTokens(asked, documents, anchor)
