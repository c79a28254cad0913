"""Inference encoding with sentence-transformers: queries and documents, the model's own prompts.

Documents are BEIR's ``(title + " " + text).strip()`` (:func:`pgrank.data.beir.document_text`); models
are applied as saved, so a model whose pipeline ends in a ``Normalize`` module gives cosine scores
under inner product and a dot model gives dot scores. On CUDA, a corpus encodes through sentence-transformers'
multi-process pool (:func:`encoding_devices`): ``models.processes_per_gpu`` processes on every GPU, so that
tokenizing one batch on the CPU overlaps the GPU's work on another (on one GPU, tokenization bounds a single
process: DistilBERT's bf16 forward pass runs several times faster than its texts are tokenized).

A PyTorch model (:func:`encodes_tokens`) goes the training step's way instead (:func:`encode_token_rows`): token ids
from the corpus's token store (:mod:`pgrank.data.token_store`, tokenized once and shared with training), in
length-sorted chunks cut by a token budget, packed without padding where the model packs
(:mod:`pgrank.models.packing`: BERT, DistilBERT, MiniLM), and otherwise (T5) padded with at most
:data:`MAX_PADDING` of each chunk's grid padding. The budget is ``batch_size x max_seq_length``, the most tokens a
padded batch of ``batch_size`` texts could hold, so memory stays what it was while each chunk carries many more
short texts. With no tokenizing left to overlap, one process per GPU is enough: on several GPUs the shards are
split between one process on each (:class:`pgrank.retrieval.dense.token_pool.TokenPool`), in the model's own
precision (bf16 weights on CUDA under ``models.backend: auto``). Strings go through sentence-transformers' pool
only for a model without a token path (an ONNX export) or a corpus without a token store.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    from sentence_transformers import SentenceTransformer

    from pgrank.data.token_store import TokenRows


POOL_MIN_DOCUMENTS = 20_000  # below this, starting the pool's processes (seconds each) costs more than it saves
MAX_PADDING = 0.05  # the most of a padded chunk's grid (a model that does not pack: T5) that may be padding


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


def encodes_tokens(model) -> bool:
    """Whether ``model`` encodes pre-tokenized ids exactly as ``encode`` encodes strings: a PyTorch
    sentence-transformers model with a tokenizer (not an ONNX or OpenVINO export). A token store holds the task's
    prompt as ``encode_document`` puts it (:func:`pgrank.data.token_store.task_prompt`), and its layout the prompt's
    length for pooling that leaves the prompt out."""
    import sys

    from pgrank.data.token_store import text_modules

    torch = sys.modules.get("torch")  # a PyTorch model has imported it; an ONNX export run alone has not
    if torch is None or not isinstance(model, torch.nn.Module):  # pgrank's own ONNX encoder (pgrank.models.backends)
        return False
    modules = text_modules(model)
    return bool(modules) and all(isinstance(getattr(m, "auto_model", None), torch.nn.Module) for m in modules)


def encode_token_rows(model, rows: "TokenRows", layout: dict, *, budget: int, task: str = "document",
                      max_padding: float = MAX_PADDING) -> np.ndarray:
    """float32 ``(len(rows), dim)`` embeddings of token-store rows, in their own order: length-sorted chunks of at
    most ``budget`` tokens (:func:`pgrank.models.packing.chunks_of`), packed where the model packs, otherwise with at
    most ``max_padding`` of each chunk's grid padding."""
    import torch

    from pgrank.models.packing import chunks_of, packs, run_chunk, scatter

    if not len(rows):
        return np.zeros((0, model.get_sentence_embedding_dimension() or 0), dtype=np.float32)
    device = next(model.parameters()).device
    with torch.inference_mode():
        chunks = chunks_of(rows, layout, budget, packed=packs(model), device=device, max_padding=max_padding)
        emb = scatter([run_chunk(model, c, task=task) for c in chunks], chunks, len(rows))
    return emb.cpu().numpy().astype(np.float32, copy=False)


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
