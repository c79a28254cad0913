"""Inference encoding with sentence-transformers: queries and documents, the model's own prompts.

Documents are BEIR's ``(title + " " + text).strip()`` (:func:`pgrank.data.beir.document_text`); models
are applied as saved, so a model whose pipeline ends in a ``Normalize`` module gives cosine scores
under inner product and a dot model gives dot scores. On CUDA, a corpus encodes through sentence-transformers'
multi-process pool (:func:`encoding_devices`): ``models.processes_per_gpu`` processes on every GPU, so that
tokenizing one batch on the CPU overlaps the GPU's work on another (on one GPU, tokenization bounds a single
process: DistilBERT's bf16 forward pass runs several times faster than its texts are tokenized).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    from sentence_transformers import SentenceTransformer


POOL_MIN_DOCUMENTS = 20_000  # below this, starting the pool's processes (seconds each) costs more than it saves


def encoding_devices(documents: int, processes_per_gpu: int = 1) -> list[str] | None:
    """The devices of sentence-transformers' multi-process pool (each GPU ``processes_per_gpu`` times) for
    encoding ``documents`` texts, or None for a plain ``encode`` (no GPU, one process in all, or too few texts)."""
    import torch

    n = torch.cuda.device_count() if torch.cuda.is_available() else 0
    devices = [f"cuda:{i}" for i in range(n) for _ in range(processes_per_gpu)]
    return devices if len(devices) > 1 and documents >= POOL_MIN_DOCUMENTS else None


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
