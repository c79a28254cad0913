"""One optimisation step's forward and backward: the loss of a (local) batch, its gradients left in the model.

The loss is the objective's (:data:`pgrank.core.objectives.OBJECTIVES`): the paper's policy gradient
(:func:`pgrank.core.estimators.policy_gradient`, with the KL term to the frozen warm start when
``train.pg.kl_coef > 0``), or one of the standard losses on the same candidates. ``tower: both`` encodes the
candidates with cached-gradient chunking (:mod:`pgrank.training.grad_cache`) from the step's token ids
(:mod:`pgrank.training.step_inputs`); ``tower: query`` reads them
from the frozen corpus embeddings. With ``train.document_anchor.coef > 0`` the loss also holds the query tower to
the warm start's document tower on a few of the batch's candidates (:func:`anchor_drift`).

The update that follows the backward is :func:`clip_gradients` and :func:`adamw`'s optimizer: a fixed handful of
dispatched operations for all parameters together, however many the model has.
"""

from __future__ import annotations

import contextlib
import math
from dataclasses import dataclass

import torch

from pgrank.config import Params
from pgrank.core.drift import cosine_drift
from pgrank.core.objectives import OBJECTIVES
from pgrank.errors import PgrankError
from pgrank.training.batches import FrozenDocuments, candidate_scores, query_generators
from pgrank.models.packing import run_features
from pgrank.training.grad_cache import add_gradients, backward_cached, encode_cached
from pgrank.training.reference import ReferencePolicy
from pgrank.training.step_inputs import StepInputs


def adamw(params: list[torch.Tensor], *, lr: float, weight_decay: float) -> torch.optim.AdamW:
    """``torch.optim.AdamW`` over ``params``, fused (one ``_fused_adamw_`` for all of them, no read of a step counter
    per parameter) where PyTorch has the fused kernel for their device and they are floating point; PyTorch's
    default implementation otherwise. The update is the same either way, to float rounding, and the state dict
    has the same entries (a resumed run takes the saved state's ``fused`` setting)."""
    from torch.utils._foreach_utils import _get_fused_kernels_supported_devices

    fused = bool(params) and all(p.device.type in _get_fused_kernels_supported_devices() and p.is_floating_point()
                                 for p in params)
    return torch.optim.AdamW(params, lr=lr, weight_decay=weight_decay, fused=fused or None)


def clip_gradients(params: list[torch.Tensor], max_norm: float) -> torch.Tensor:
    """``torch.nn.utils.clip_grad_norm_(params, max_norm)``: scale the gradients to a total 2-norm of at most
    ``max_norm`` (``inf``: leave them) and return their total norm, without reading it on the host. Gradients on one
    device in one dtype take four operations in all (their norms, the total, the factor, the scaling); others go
    through PyTorch's own function."""
    grads = [p.grad for p in params if p.grad is not None]
    if not grads:
        return torch.zeros(())
    if len({(g.device, g.dtype) for g in grads}) > 1 or any(g.is_sparse for g in grads):
        return torch.nn.utils.clip_grad_norm_(params, max_norm)
    total = torch.linalg.vector_norm(torch.stack(torch._foreach_norm(grads, 2.0)), 2.0)
    torch._foreach_mul_(grads, torch.clamp(max_norm / (total + 1e-6), max=1.0))
    return total


class TrainingError(PgrankError):
    """Training cannot go on (non-finite loss or gradient, no training data)."""


@dataclass(frozen=True)
class StepStats:
    loss: float
    utility: float
    entropy: float
    kl: float = 0.0
    drift: float = 0.0  # train.document_anchor: the query tower's mean 1 - cos to the warm document tower


def accumulate_gradients(model, inputs: StepInputs, params: Params, *, epoch: int, frozen: FrozenDocuments | None,
                         forward=None, no_sync=None, reference: ReferencePolicy | None = None,
                         objective: str = "pg") -> StepStats:
    """Forward and backward of one (local) batch; leaves the gradients in ``model``'s parameters.

    Args:
        model: the trainable sentence-transformers model (``forward``: its DDP wrapper, if any).
        inputs: the batch and its laid-out token ids (:func:`pgrank.training.step_inputs.prepare_step`).
        frozen: document embeddings for ``tower: query`` (``None`` for ``tower: both``).
        no_sync: DDP's ``no_sync`` factory; all but the last backward then accumulate locally.
        reference: the frozen warm start, for ``train.pg.kl_coef > 0`` (:mod:`pgrank.training.reference`).

    The loss is ``objective``'s (:data:`pgrank.core.objectives.OBJECTIVES`, one of ``train.objectives``): the
    paper's policy gradient, or one of the standard losses on the same candidates with the same temperature.
    The step reads its statistics back from the device once, at its end.
    """
    cfg = params.train
    batch = inputs.batch
    device = batch.relevance.device
    gens = query_generators(cfg.seed, epoch, [ex.qid for ex in batch.examples], device)
    enc = dict(amp=cfg.amp, forward=forward)
    first = no_sync() if (no_sync is not None and cfg.tower == "both") else contextlib.nullcontext()
    with first:
        q = run_features(model, inputs.queries, task="query", **enc)
        if cfg.tower == "query":
            docs, states = frozen.vectors(batch.unique_rows, device), None
        else:
            docs, states = encode_cached(model, inputs.documents, len(batch.unique_rows), task="document", **enc)
        scores = candidate_scores(q, docs, batch.index, cfg.similarity)
        pg = cfg.pg
        if objective == "pg":
            ref_scores = reference.scores(inputs, frozen=frozen) if cfg.kl_on(objective) else None
            knobs = dict(num_samples=pg.num_samples, utility=pg.utility, estimator=pg.estimator, baseline=pg.baseline,
                         entropy_coef=pg.entropy_coef, entropy=pg.entropy, reference_scores=ref_scores,
                         kl_coef=pg.kl_coef, kl=pg.kl)
        else:
            knobs = {}
        out = OBJECTIVES[objective](scores, batch.relevance, batch.mask, temperature=pg.temperature,
                                        generator=gens, **knobs)
        loss, drift = out.loss, None
        if cfg.document_anchor.coef:
            drift = anchor_drift(model, inputs, frozen=frozen, reference=reference, **enc)
            loss = loss + cfg.document_anchor.coef * drift
        if no_sync is not None and cfg.tower != "both":
            loss.backward()  # DDP all-reduces from its hooks on this backward
        else:
            params = [p for p in model.parameters() if p.requires_grad]
            doc_grads = add_gradients(loss, None, params, [docs] if cfg.tower == "both" else [])
    if cfg.tower == "both":
        backward_cached(model, inputs.documents, doc_grads[0], states, task="document", no_sync=no_sync, **enc)
    zero = loss.new_zeros(())
    figures = torch.stack([loss.detach(), out.utility.detach().float(), out.entropy.detach().float(),
                           out.kl.detach().float(), zero if drift is None else drift.detach()]).tolist()
    if not math.isfinite(figures[0]):
        raise TrainingError(f"epoch {epoch}: the loss is {figures[0]} (queries {[e.qid for e in batch.examples][:5]})")
    return StepStats(*figures)


def anchor_drift(model, inputs: StepInputs, *, frozen: FrozenDocuments | None, reference: ReferencePolicy | None,
                 amp: str = "off", forward=None) -> torch.Tensor:
    """:func:`pgrank.core.drift.cosine_drift` of the query tower from the warm start's document tower, on
    ``train.document_anchor.documents`` of the batch's candidates (:func:`pgrank.training.step_inputs.anchor_rows`):
    their frozen embeddings (``tower: query``), or the frozen warm start's encoding of them (``tower: both``)."""
    device = inputs.batch.relevance.device
    embedded = run_features(model, inputs.anchor_queries, task="query", amp=amp, forward=forward)
    if frozen is not None:
        target = frozen.vectors(inputs.anchor_rows, device)
    else:
        target = reference.documents(inputs.anchor_documents)
    return cosine_drift(embedded, target)
