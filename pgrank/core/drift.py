"""How far the query tower has drifted from the document tower on documents (beyond the paper).

Fine-tuning the query tower on one collection's queries (``tower: query``, or both towers) teaches it
that collection's questions, and can make it forget how to embed other text: long queries, documents
as queries (argument retrieval, duplicate detection). The warm start embedded a document the same way
with either tower; :func:`cosine_drift` measures how much the trained query tower now departs from the
warm start's document tower on the same documents, and ``train.document_anchor.coef`` adds it to the
loss (a feature-distillation anchor in the sense of Learning without Forgetting, Li & Hoiem 2017,
applied to the documents the batch already holds).
"""

from __future__ import annotations

import torch
from torch import Tensor


def cosine_drift(embedded: Tensor, target: Tensor) -> Tensor:
    """Mean ``1 - cos(embedded_i, target_i)`` over rows: 0 when every row points where its target does.

    Args:
        embedded: ``(k, d)`` the trained tower's embeddings (carry gradient).
        target: ``(k, d)`` the frozen embeddings of the same inputs (no gradient is taken through them).
    """
    if embedded.shape != target.shape or embedded.dim() != 2 or embedded.shape[0] == 0:
        raise ValueError(f"expected two equal (k, d) shapes with k > 0, got {tuple(embedded.shape)} "
                         f"and {tuple(target.shape)}")
    cos = torch.nn.functional.cosine_similarity(embedded.float(), target.detach().float(), dim=-1)
    return (1.0 - cos).mean()
