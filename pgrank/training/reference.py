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
  without gradient, in chunks of ``train.grad_chunk_size``.

The reference model runs in eval mode (no dropout) and draws no random numbers, so a resumed run
replays the same steps.
"""

from __future__ import annotations

import torch
from torch import Tensor

from pgrank.config import TrainConfig
from pgrank.training.batches import Batch, FrozenDocuments, candidate_scores
from pgrank.training.grad_cache import encode, encode_chunks


class ReferencePolicy:
    """Scores of the frozen warm start, for the KL term."""

    def __init__(self, model: torch.nn.Module, cfg: TrainConfig):
        self.model = model.eval()
        for p in self.model.parameters():
            p.requires_grad_(False)
        self.cfg = cfg

    @torch.no_grad()
    def scores(self, batch: Batch, *, frozen: FrozenDocuments | None, corpus=None) -> Tensor:
        """``(B, n)`` reference scores of ``batch``'s candidates (float32, no gradient)."""
        cfg = self.cfg
        device = batch.relevance.device
        q = encode(self.model, [ex.query for ex in batch.examples], task="query", max_length=cfg.max_query_length,
                   amp=cfg.amp)
        if frozen is not None:
            docs = frozen.vectors(batch.unique_rows, device)
        else:
            docs = encode_chunks(self.model, corpus.texts(batch.unique_rows), chunk_size=cfg.grad_chunk_size,
                                 task="document", max_length=cfg.max_doc_length, amp=cfg.amp)
        return candidate_scores(q.float(), docs.float(), batch.index, cfg.similarity)

    @torch.no_grad()
    def documents(self, texts: list[str]) -> Tensor:
        """The warm start's document embeddings of ``texts`` (float32, no gradient): the target of
        ``train.document_anchor`` in ``tower: both``."""
        cfg = self.cfg
        return encode_chunks(self.model, texts, chunk_size=cfg.grad_chunk_size, task="document",
                             max_length=cfg.max_doc_length, amp=cfg.amp).float()
