"""One optimisation step's forward and backward: the loss of a (local) batch, its gradients left in the model.

The loss is the objective's (:data:`pgrank.core.objectives.OBJECTIVES`): the paper's policy gradient
(:func:`pgrank.core.estimators.policy_gradient`, with the KL term to the frozen warm start when
``train.pg.kl_coef > 0``), or one of the standard losses on the same candidates. ``tower: both`` encodes the
candidates with cached-gradient chunking (:mod:`pgrank.training.grad_cache`); ``tower: query`` reads them
from the frozen corpus embeddings. With ``train.document_anchor.coef > 0`` the loss also holds the query tower to
the warm start's document tower on a few of the batch's candidates (:func:`anchor_drift`).
"""

from __future__ import annotations

import contextlib
import zlib
from dataclasses import dataclass

import numpy as np
import torch

from pgrank.config import Params
from pgrank.core.drift import cosine_drift
from pgrank.core.objectives import OBJECTIVES
from pgrank.errors import PgrankError
from pgrank.training.batches import Batch, FrozenDocuments, candidate_scores, query_generators
from pgrank.training.grad_cache import backward_cached, encode, encode_cached
from pgrank.training.reference import ReferencePolicy


class TrainingError(PgrankError):
    """Training cannot go on (non-finite loss or gradient, no training data)."""


@dataclass(frozen=True)
class StepStats:
    loss: float
    utility: float
    entropy: float
    kl: float = 0.0
    drift: float = 0.0  # train.document_anchor: the query tower's mean 1 - cos to the warm document tower


def accumulate_gradients(model, batch: Batch, params: Params, *, epoch: int, frozen: FrozenDocuments | None,
                         corpus=None, forward=None, no_sync=None, reference: ReferencePolicy | None = None,
                         objective: str = "pg") -> StepStats:
    """Forward and backward of one (local) batch; leaves the gradients in ``model``'s parameters.

    Args:
        model: the trainable sentence-transformers model (``forward``: its DDP wrapper, if any).
        batch: queries, candidates, grades and mask.
        frozen: document embeddings for ``tower: query`` (``None`` for ``tower: both``).
        corpus: the corpus store for ``tower: both`` (only the batch's documents are read).
        no_sync: DDP's ``no_sync`` factory; all but the last backward then accumulate locally.
        reference: the frozen warm start, for ``train.pg.kl_coef > 0`` (:mod:`pgrank.training.reference`).

    The loss is ``objective``'s (:data:`pgrank.core.objectives.OBJECTIVES`, one of ``train.objectives``): the
    paper's policy gradient, or one of the standard losses on the same candidates with the same temperature.
    """
    cfg = params.train
    device = batch.relevance.device
    gens = query_generators(cfg.seed, epoch, [ex.qid for ex in batch.examples], device)
    enc = dict(amp=cfg.amp, forward=forward)
    first = no_sync() if (no_sync is not None and cfg.tower == "both") else contextlib.nullcontext()
    with first:
        q = encode(model, [ex.query for ex in batch.examples], task="query", max_length=cfg.max_query_length, **enc)
        if cfg.tower == "query":
            docs, texts, states = frozen.vectors(batch.unique_rows, device), None, None
        else:
            texts = corpus.texts(batch.unique_rows)
            docs, states = encode_cached(model, texts, chunk_size=cfg.grad_chunk_size, task="document",
                                         max_length=cfg.max_doc_length, **enc)
        scores = candidate_scores(q, docs, batch.index, cfg.similarity)
        pg = cfg.pg
        if objective == "pg":
            ref_scores = reference.scores(batch, frozen=frozen, corpus=corpus) if cfg.kl_on(objective) else None
            knobs = dict(num_samples=pg.num_samples, utility=pg.utility, estimator=pg.estimator, baseline=pg.baseline,
                         entropy_coef=pg.entropy_coef, entropy=pg.entropy, reference_scores=ref_scores,
                         kl_coef=pg.kl_coef, kl=pg.kl)
        else:
            knobs = {}
        out = OBJECTIVES[objective](scores, batch.relevance, batch.mask, temperature=pg.temperature,
                                        generator=gens, **knobs)
        loss, drift = out.loss, None
        if cfg.document_anchor.coef:
            drift = anchor_drift(model, batch, params, epoch=epoch, frozen=frozen, corpus=corpus, reference=reference,
                                 forward=forward)
            loss = loss + cfg.document_anchor.coef * drift
        if not torch.isfinite(loss):
            raise TrainingError(f"epoch {epoch}: the loss is {loss.item()} (queries {[e.qid for e in batch.examples][:5]})")
        loss.backward()
    if cfg.tower == "both":
        backward_cached(model, texts, docs.grad, states, chunk_size=cfg.grad_chunk_size, task="document",
                        max_length=cfg.max_doc_length, no_sync=no_sync, **enc)
    return StepStats(loss.item(), out.utility.item(), out.entropy.item(), out.kl.item(),
                     0.0 if drift is None else drift.item())


def anchor_rows(batch: Batch, seed: int, epoch: int, k: int) -> np.ndarray:
    """``k`` of the batch's candidate rows (all when it has fewer), drawn by the run's seed, the epoch and the
    batch's queries: a resumed run draws the same ones."""
    key = zlib.crc32("\n".join(ex.qid for ex in batch.examples).encode())
    rows = batch.unique_rows
    if len(rows) <= k:
        return rows
    return rows[np.sort(np.random.default_rng([seed, epoch, key]).choice(len(rows), size=k, replace=False))]


def anchor_drift(model, batch: Batch, params: Params, *, epoch: int, frozen: FrozenDocuments | None, corpus,
                 reference: ReferencePolicy | None, forward=None) -> torch.Tensor:
    """:func:`pgrank.core.drift.cosine_drift` of the query tower from the warm start's document tower, on
    ``train.document_anchor.documents`` of the batch's candidates: their frozen embeddings (``tower: query``),
    or the frozen warm start's encoding of them (``tower: both``)."""
    cfg = params.train
    anchor = cfg.document_anchor
    rows = anchor_rows(batch, cfg.seed, epoch, anchor.documents)
    texts = corpus.texts(rows)
    device = batch.relevance.device
    embedded = encode(model, texts, task="query", max_length=cfg.max_doc_length, amp=cfg.amp, forward=forward)
    target = frozen.vectors(rows, device) if frozen is not None else reference.documents(texts)
    return cosine_drift(embedded, target)
