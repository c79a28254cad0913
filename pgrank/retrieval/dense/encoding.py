"""Inference encoding with sentence-transformers: queries and documents, the model's own prompts.

Documents are BEIR's ``(title + " " + text).strip()`` (:func:`pgrank.data.beir.document_text`); models
are applied as saved, so a model whose pipeline ends in a ``Normalize`` module gives cosine scores
under inner product and a dot model gives dot scores. With several CUDA devices, corpus encoding uses
sentence-transformers' multi-process pool (:func:`encoding_devices`).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    from sentence_transformers import SentenceTransformer


def encoding_devices() -> list[str] | None:
    """CUDA devices for sentence-transformers' multi-process pool, or None for plain ``encode``."""
    import torch

    n = torch.cuda.device_count() if torch.cuda.is_available() else 0
    return [f"cuda:{i}" for i in range(n)] if n > 1 else None


def encode_documents(model: "SentenceTransformer", texts: list[str], *, batch_size: int, pool=None) -> np.ndarray:
    """Encode document strings as float32 ``(n, dim)``: the model's document prompt, if any, applies."""
    emb = model.encode_document(
        texts, batch_size=batch_size, pool=pool, convert_to_numpy=True, show_progress_bar=False
    )
    return np.asarray(emb, dtype=np.float32)


def encode_queries(
    model: "SentenceTransformer", queries: Mapping[str, str], *, batch_size: int, show_progress: bool = False
) -> tuple[list[str], np.ndarray]:
    """Encode queries (the model's query prompt, if any, applies).

    Returns:
        ``(qids, embeddings)``: qids in the mapping's order, float32 ``(Q, dim)``.
    """
    qids = list(queries)
    emb = model.encode_query(
        [queries[q] for q in qids], batch_size=batch_size, convert_to_numpy=True, show_progress_bar=show_progress
    )
    return qids, np.asarray(emb, dtype=np.float32).reshape(len(qids), -1)
