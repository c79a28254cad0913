"""The reference policy of the KL regulariser (``train.pg.kl_coef``, beyond the paper), and the target of the
document anchor (``train.document_anchor`` in ``tower: both``).

The reference is the warm start, frozen: its Plackett-Luce policy ``PL(s_ref / T)`` over the same
candidate set as the trained policy's. :func:`pgrank.core.estimators.policy_gradient` takes its scores
``s_ref`` and adds ``kl_coef * KL(policy || reference)`` (``train.pg.kl``: the exact first-place KL, or
the sampled ranking KL from the rankings already drawn for the gradient).

What the reference scores cost:

* ``tower: query``: the document embeddings are the frozen warm start's already (the corpus-embedding
  artifact both policies read), so the reference re-encodes only the batch's queries, without gradient.
* ``tower: both``: the batch's candidate documents are encoded once more by the frozen warm start,
  without gradient, in the step's chunks of at most ``train.chunk_tokens`` tokens.

The reference model runs in eval mode (no dropout) and draws no random numbers, so a resumed run
replays the same steps.
"""

from __future__ import annotations

import torch
from torch import Tensor

from pgrank.config import TrainConfig
from pgrank.training.batches import FrozenDocuments, candidate_scores
from pgrank.models.packing import run_features
from pgrank.training.grad_cache import encode_tokens


class ReferencePolicy:
    """Scores of the frozen warm start, for the KL term. It reads the step's own laid-out token ids
    (:class:`pgrank.training.step_inputs.StepInputs`): the warm start tokenizes as the policy does."""

    def __init__(self, model: torch.nn.Module, cfg: TrainConfig):
        self.model = model.eval()
        for p in self.model.parameters():
            p.requires_grad_(False)
        self.cfg = cfg

    def _features(self, features: dict, task: str) -> Tensor:
        return run_features(self.model, features, task=task, amp=self.cfg.amp)

    @torch.no_grad()
    def scores(self, inputs, *, frozen: FrozenDocuments | None) -> Tensor:
        """``(B, n)`` reference scores of the step's candidates (float32, no gradient)."""
        batch = inputs.batch
        device = batch.relevance.device
        q = self._features(inputs.queries, "query")
        if frozen is not None:
            docs = frozen.vectors(batch.unique_rows, device)
        else:
            docs = encode_tokens(self.model, inputs.documents, len(batch.unique_rows), task="document",
                                 amp=self.cfg.amp)
        return candidate_scores(q.float(), docs.float(), batch.index, self.cfg.similarity)

    @torch.no_grad()
    def documents(self, features: dict) -> Tensor:
        """The warm start's document embeddings of the anchor's laid-out documents (float32, no gradient): the
        target of ``train.document_anchor`` in ``tower: both``."""
        return self._features(features, "document").float()
