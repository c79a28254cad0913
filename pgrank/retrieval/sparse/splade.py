"""Learned sparse retrieval (SPLADEv2) through sentence-transformers' ``SparseEncoder``.

Documents and queries become sparse vocabulary-sized vectors; scores are their dot products. The
corpus is encoded in chunks into one ``scipy.sparse`` CSR matrix, and exact top-k search multiplies
query blocks against it (the same deterministic order as :mod:`pgrank.retrieval.dense.exact_search`).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from pgrank.data.runs import id_ranks, top_k


def load_sparse_encoder(source: str, *, device: str | None = None, max_seq_length: int | None = None):
    """A ``SparseEncoder`` from the hub or a folder (SPLADE checkpoints load as MLM + max pooling)."""
    from sentence_transformers import SparseEncoder

    model = SparseEncoder(source, device=device, model_kwargs={"use_safetensors": True})
    if max_seq_length is not None:
        model.max_seq_length = max_seq_length
    return model.eval()


def _to_csr(tensor):
    """A torch sparse tensor as a float32 ``scipy.sparse.csr_matrix``."""
    import scipy.sparse as sp

    coo = tensor.coalesce().cpu()
    rows, cols = coo.indices().numpy()
    return sp.csr_matrix((coo.values().float().numpy(), (rows, cols)), shape=tuple(coo.shape), dtype=np.float32)


def encode_sparse(model, texts: Sequence[str], *, task: str, batch_size: int, chunk: int = 4096):
    """CSR ``(len(texts), vocab)`` of ``encode_query`` / ``encode_document`` outputs, chunk by chunk."""
    import scipy.sparse as sp

    encode = model.encode_query if task == "query" else model.encode_document
    parts = [
        _to_csr(encode(list(texts[i : i + chunk]), batch_size=batch_size, convert_to_sparse_tensor=True))
        for i in range(0, len(texts), chunk)
    ]
    return sp.vstack(parts).tocsr() if parts else sp.csr_matrix((0, 0), dtype=np.float32)


def sparse_scores(queries, documents) -> np.ndarray:
    """Dense ``(Q, N)`` dot products of two CSR matrices."""
    return np.asarray((queries @ documents.T).todense(), dtype=np.float32)


def sparse_search(queries, documents, doc_ids: Sequence[str], k: int, *, block: int = 256):
    """Exact top ``k`` per query: ``(scores, rows)`` each ``(Q, min(k, N))``, best first."""
    ranks = id_ranks(doc_ids)
    n = min(k, len(doc_ids))
    everyone = np.arange(len(doc_ids))[None, :]
    out_s = np.empty((queries.shape[0], n), dtype=np.float32)
    out_r = np.empty((queries.shape[0], n), dtype=np.int64)
    for lo in range(0, queries.shape[0], block):
        scores = sparse_scores(queries[lo : lo + block], documents)
        out_s[lo : lo + block], out_r[lo : lo + block] = top_k(scores, np.broadcast_to(everyone, scores.shape), ranks, n)
    return out_s, out_r
