"""Exact maximum-inner-product search over a corpus-embedding artifact, in the run order.

Dense retrieval streams the corpus-embedding shards through a FAISS exact inner-product index
(``IndexFlatIP``), so that an 8.8M x 768 corpus never sits in memory at once: each block of shards is
searched for the top k of every query, and the per-block winners are merged with the running top k in
the one order of every run (score descending, then document id ascending; :func:`pgrank.data.runs.top_k`),
with no dependence on FAISS's order among tied scores.

Example:
    >>> scores, rows = dense_search(query_vectors, embeddings.blocks(), id_ranks(embeddings.doc_ids), k=10)
"""

from __future__ import annotations

import logging
from collections.abc import Iterable

import numpy as np

from pgrank.data.runs import top_k

log = logging.getLogger(__name__)


def _new_index(dim: int, use_gpu: bool):
    import faiss

    index = faiss.IndexFlatIP(dim)
    if use_gpu:
        index = faiss.index_cpu_to_all_gpus(index)
    return index


def gpu_available() -> bool:
    """Whether FAISS was built with GPU support and sees a GPU."""
    import faiss

    return hasattr(faiss, "get_num_gpus") and faiss.get_num_gpus() > 0


def _search_block(index, queries: np.ndarray, block: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
    """Top ``k`` of one block, with FAISS's choice among scores tied at the cut-off undone.

    FAISS keeps an arbitrary subset of the documents tied at the k-th score. We ask for one more
    than needed; rows whose k-th and (k+1)-th scores tie are searched again with a deeper cut-off
    until the tie ends inside the result, so the merge can apply the id order to all tied documents.
    """
    n = block.shape[0]
    index.reset()
    index.add(block)
    depth = min(k + 1, n)
    scores, rows = index.search(queries, depth)
    if depth <= k:  # the block is smaller than k: everything is returned
        return scores, rows
    tied = np.flatnonzero(scores[:, k - 1] == scores[:, k])
    scores, rows = scores[:, :k], rows[:, :k]
    if not tied.size:
        return scores, rows
    # Deeper searches for the few tied rows, on CPU (GPU selection is capped at k=2048). A tied
    # row is replaced whole, so that all its scores come from the same computation.
    cpu = _new_index(block.shape[1], use_gpu=False)
    cpu.add(block)
    deep_rows = {}
    for i in tied:
        deep = 2 * depth
        while True:
            deep = min(deep, n)
            s, r = cpu.search(queries[i : i + 1], deep)
            if deep == n or s[0, -1] != s[0, k - 1]:
                break
            deep *= 2
        keep = s[0] >= s[0, k - 1]  # the top k and every document tied with the k-th
        deep_rows[i] = (s[0, keep], r[0, keep])
    width = max(len(s) for s, _ in deep_rows.values())
    scores = np.pad(scores, ((0, 0), (0, max(0, width - k))), constant_values=-np.inf)
    rows = np.pad(rows, ((0, 0), (0, max(0, width - k))), constant_values=-1)
    for i, (s, r) in deep_rows.items():
        scores[i], rows[i] = -np.inf, -1
        scores[i, : len(s)], rows[i, : len(r)] = s, r
    return scores, rows


def dense_search(
    queries: np.ndarray,
    blocks: Iterable[tuple[int, np.ndarray]],
    ranks: np.ndarray,
    k: int,
    *,
    use_gpu: bool | None = None,
) -> tuple[np.ndarray, np.ndarray]:
    """Exact maximum-inner-product top ``k`` over a corpus given as a stream of blocks.

    Args:
        queries: ``(Q, D)`` float32 query embeddings.
        blocks: ``(start_row, (B, D) float32 block)`` pairs covering the corpus in row order, e.g.
            :meth:`pgrank.retrieval.dense.corpus_embeddings.CorpusEmbeddings.blocks`. Only one block is in memory at once.
        ranks: ``(N,)`` :func:`id_ranks` of the corpus (ties go to the smaller document id).
        k: documents per query.
        use_gpu: search on all GPUs with faiss-gpu; ``None``: when FAISS sees a GPU.

    Returns:
        ``(scores, rows)``, each ``(Q, min(k, N))``, best first; rows index the corpus.
    """
    queries = np.ascontiguousarray(queries, dtype=np.float32)
    use_gpu = gpu_available() if use_gpu is None else use_gpu
    index = _new_index(queries.shape[1], use_gpu)
    best_s = np.full((len(queries), 0), -np.inf, dtype=np.float32)
    best_r = np.full((len(queries), 0), -1, dtype=np.int64)
    for start, block in blocks:
        block = np.ascontiguousarray(block, dtype=np.float32)
        if block.shape[1] != queries.shape[1]:
            raise ValueError(f"query dimension {queries.shape[1]} != corpus dimension {block.shape[1]}")
        s, r = _search_block(index, queries, block, k)
        r = np.where(r >= 0, r + start, -1)
        best_s, best_r = top_k(np.concatenate([best_s, s], 1), np.concatenate([best_r, r], 1), ranks, k)
    n = min(k, len(ranks))
    return best_s[:, :n], best_r[:, :n]
