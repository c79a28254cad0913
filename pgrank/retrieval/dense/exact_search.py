"""Maximum-inner-product search over a corpus-embedding artifact, in the run order (``params.search``).

Dense retrieval streams the corpus-embedding shards a block at a time, so that an 8.8M x 768 corpus
never sits in memory at once: each block is searched for the top k of every query, and the per-block
winners are merged with the running top k in the one order of every run (score descending, then
document id ascending; :func:`pgrank.data.runs.top_k`), with no dependence on a library's order among
tied scores. Two backends compute the same exact top k:

* ``torch``: a float32 matmul + ``torch.topk``, a chunk of queries at a time so that one score matrix stays
  under :data:`SCORE_BYTES`; on the first CUDA device where torch sees one (each block is copied there), else
  on the CPU, where it measured several times faster than FAISS's ``IndexFlatIP`` (``python bench/search.py``).
* ``faiss``: an exact ``IndexFlatIP`` per block, on all GPUs when faiss-gpu sees one, else on the CPU.
* ``faiss-gpu``: the same, on all GPUs, and an error where FAISS has no GPU support or sees no GPU.
* ``numpy``: the same matmul through NumPy's BLAS and ``np.argpartition``, on the CPU: as fast as torch's on a CPU
  (``python bench/search.py``), and it needs no torch, so that a process that searches and encodes with ONNX never
  pays torch's import.

FAISS is an optional dependency: ``pip install 'pgrank[cpu]'`` brings faiss-cpu, ``pgrank[gpu]`` faiss-gpu
(exactly one of the two: both ship the ``faiss`` module). ``auto`` (the default) is
:func:`auto_search_backend`: FAISS where it sees a GPU; else numpy for a search of at most :data:`NUMPY_SCORES`
query-document scores, torch beyond (on CUDA where torch sees a GPU: only a large search repays importing torch to
find out whether it sees one). The choice depends on the search's size and the machine alone, so one search always runs on one
backend. Every backend widens the rows whose k-th and (k+1)-th scores tie to every document tied with the k-th, so
that the merge applies the id order to all of them: all give the rows and scores of a brute-force sort. Scores are
bitwise equal where the arithmetic is exact; otherwise the BLAS libraries under torch, NumPy and FAISS may round a
score apart by its last bit, which can swap two documents whose scores differ by that much (about
0.1% of the entries of a top 1000 over 100k random vectors; ``python bench/search.py``).

An ``index`` other than ``"Flat"`` (a FAISS ``index_factory`` string, e.g. ``"HNSW32"``) is
approximate search instead, always with FAISS: :mod:`pgrank.retrieval.dense.approximate_search`.

Example:
    >>> scores, rows = dense_search(query_vectors, embeddings.blocks(), id_ranks(embeddings.doc_ids), k=10)
    >>> scores, rows = dense_search(query_vectors, embeddings.blocks(), ranks, 10, backend="torch")
"""

from __future__ import annotations

import logging
import warnings
from collections.abc import Callable, Iterable, Iterator
from functools import partial

import numpy as np

from pgrank.data.runs import top_k
from pgrank.errors import PgrankError
from pgrank.retrieval.dense.approximate_search import import_faiss

log = logging.getLogger(__name__)

EXACT_INDEX = "Flat"  # search.index of exact search; any other index_factory string is approximate
SCORE_BYTES = 256 * 2**20  # the torch and numpy backends' bound on one (queries x block) float32 score matrix
# auto's largest numpy search, in query-document scores: about a second of a CPU's search (python bench/search.py,
# 3e7 scores in 0.5 s), below which a GPU could not save what importing torch costs to find out whether it sees one.
NUMPY_SCORES = 2**25

# One block's search: (queries, block, k) -> (query rows, scores, block rows) for each chunk of queries.
BlockSearch = Callable[[np.ndarray, np.ndarray, int], Iterator[tuple[slice, np.ndarray, np.ndarray]]]


def faiss_gpu_available() -> bool:
    """Whether FAISS is installed, built with GPU support, and sees a GPU."""
    try:
        import faiss
    except ImportError:
        return False
    return hasattr(faiss, "get_num_gpus") and faiss.get_num_gpus() > 0


def auto_search_backend(scores: int | None = None) -> str:
    """``search.backend: auto`` for a search of ``scores`` query-document scores (``None``: unknown, large):
    ``"faiss-gpu"`` where FAISS sees a GPU; else ``"numpy"`` up to :data:`NUMPY_SCORES` scores; else ``"torch"``
    (on CUDA where torch sees a GPU; on a CPU it is faster than FAISS)."""
    if faiss_gpu_available():
        return "faiss-gpu"
    return "numpy" if scores is not None and scores <= NUMPY_SCORES else "torch"


def _with_ties(scores: np.ndarray, rows: np.ndarray, k: int, tied: dict) -> tuple[np.ndarray, np.ndarray]:
    """The top ``k`` columns, with the rows of ``tied`` (``{row: (scores, block rows)}``) replaced whole
    by their top k and every document tied with the k-th; padding is ``(-inf, -1)``."""
    scores, rows = scores[:, :k], rows[:, :k]
    if not tied:
        return scores, rows
    pad = max(0, max(len(s) for s, _ in tied.values()) - k)
    scores = np.pad(scores, ((0, 0), (0, pad)), constant_values=-np.inf)
    rows = np.pad(rows, ((0, 0), (0, pad)), constant_values=-1)
    for i, (s, r) in tied.items():
        scores[i], rows[i] = -np.inf, -1
        scores[i, : len(s)], rows[i, : len(r)] = s, r
    return scores, rows


def _new_index(dim: int, use_gpu: bool):
    faiss = import_faiss()
    index = faiss.IndexFlatIP(dim)
    if use_gpu:
        index = faiss.index_cpu_to_all_gpus(index)
    return index


def _faiss_block(index, queries: np.ndarray, block: np.ndarray, k: int) -> Iterator[tuple[slice, np.ndarray, np.ndarray]]:
    """Top ``k`` of one block for all queries at once, with FAISS's choice among scores tied at the cut-off undone.

    FAISS keeps an arbitrary subset of the documents tied at the k-th score. The search asks for one more
    than needed; rows whose k-th and (k+1)-th scores tie are searched again with a deeper cut-off
    until the tie ends inside the result.
    """
    n = block.shape[0]
    index.reset()
    index.add(block)
    depth = min(k + 1, n)
    scores, rows = index.search(queries, depth)
    if depth <= k:  # the block is smaller than k: everything is returned
        yield slice(None), scores, rows
        return
    tied = np.flatnonzero(scores[:, k - 1] == scores[:, k])
    deep_rows = {}
    if tied.size:
        # Deeper searches for the few tied rows, on CPU (GPU selection is capped at k=2048). A tied
        # row is replaced whole, so that all its scores come from the same computation.
        cpu = _new_index(block.shape[1], use_gpu=False)
        cpu.add(block)
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
    yield (slice(None), *_with_ties(scores, rows, k, deep_rows))


def _tensor(x: np.ndarray):
    """A torch view of ``x`` (no copy; read-only arrays, such as memory maps, are only ever read)."""
    import torch

    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="The given NumPy array is not writable")
        return torch.from_numpy(x)


def _query_chunks(queries: int, documents: int) -> Iterator[slice]:
    """The chunks of ``queries`` rows whose score matrix against ``documents`` stays under :data:`SCORE_BYTES`."""
    chunk = max(1, SCORE_BYTES // (4 * max(documents, 1)))
    for lo in range(0, queries, chunk):
        yield slice(lo, min(lo + chunk, queries))


def _torch_block(queries: np.ndarray, block: np.ndarray, k: int, device: str = "cpu") -> Iterator[tuple[slice, np.ndarray, np.ndarray]]:
    """Top ``k`` of one block with a matmul and ``torch.topk`` on ``device``, a chunk of queries at a time.

    ``topk`` keeps k+1; a row whose k-th and (k+1)-th scores tie takes, from its full score row,
    every document scoring at least the k-th.
    """
    import torch

    n = block.shape[0]
    docs = _tensor(block).to(device)
    for at in _query_chunks(len(queries), n):
        scores = _tensor(queries[at]).to(device) @ docs.T  # (C, B)
        if n <= k:  # the block is smaller than k: everything is returned
            yield at, scores.cpu().numpy(), np.broadcast_to(np.arange(n), scores.shape).copy()
            continue
        top_s, top_r = torch.topk(scores, k + 1, dim=1)  # sorted, best first
        top_s, top_r = top_s.cpu().numpy(), top_r.cpu().numpy()
        tied = {}
        for i in np.flatnonzero(top_s[:, k - 1] == top_s[:, k]):
            row = scores[int(i)]
            keep = torch.nonzero(row >= float(top_s[i, k - 1])).squeeze(1)  # float32 -> float: exact
            tied[i] = (row[keep].cpu().numpy(), keep.cpu().numpy())
        yield (at, *_with_ties(top_s, top_r, k, tied))


def _numpy_block(queries: np.ndarray, block: np.ndarray, k: int) -> Iterator[tuple[slice, np.ndarray, np.ndarray]]:
    """:func:`_torch_block` with NumPy on the CPU: the top k+1 of each row by ``np.argpartition``, sorted best first;
    a row whose k-th and (k+1)-th scores tie takes every document scoring at least the k-th."""
    n = block.shape[0]
    for at in _query_chunks(len(queries), n):
        scores = queries[at] @ block.T  # (C, B)
        if n <= k:
            yield at, scores, np.broadcast_to(np.arange(n), scores.shape).copy()
            continue
        top_r = np.argpartition(-scores, k, axis=1)[:, : k + 1]  # the k+1 best, in no order
        top_s = np.take_along_axis(scores, top_r, axis=1)
        order = np.argsort(-top_s, axis=1, kind="stable")
        top_s, top_r = np.take_along_axis(top_s, order, axis=1), np.take_along_axis(top_r, order, axis=1)
        tied = {}
        for i in np.flatnonzero(top_s[:, k - 1] == top_s[:, k]):
            keep = np.flatnonzero(scores[i] >= top_s[i, k - 1])
            tied[i] = (scores[i, keep], keep)
        yield (at, *_with_ties(top_s, top_r.astype(np.int64), k, tied))


def _numpy_exact(dim: int, use_gpu: bool | None) -> BlockSearch:
    if use_gpu:
        raise PgrankError("search.backend: numpy runs on the CPU only; set search.backend to torch or faiss-gpu for a GPU")
    return _numpy_block


def _faiss_exact(dim: int, use_gpu: bool | None) -> BlockSearch:
    use_gpu = faiss_gpu_available() if use_gpu is None else use_gpu
    return partial(_faiss_block, _new_index(dim, use_gpu))


def _faiss_gpu_exact(dim: int, use_gpu: bool | None) -> BlockSearch:
    if use_gpu is False:
        return _faiss_exact(dim, False)
    if not faiss_gpu_available():
        faiss = import_faiss()
        why = "sees no GPU" if hasattr(faiss, "get_num_gpus") else "has no GPU support (faiss-cpu)"
        raise PgrankError(f"search.backend: faiss-gpu, but the installed FAISS {why}; install pgrank's gpu extra "
                          "(faiss-gpu, in place of faiss-cpu) on a machine with a GPU, or set search.backend to auto or torch")
    return _faiss_exact(dim, True)


def _torch_exact(dim: int, use_gpu: bool | None) -> BlockSearch:
    import torch

    cuda = torch.cuda.is_available() if use_gpu is None else use_gpu
    if cuda and not torch.cuda.is_available():
        raise PgrankError("search.backend: torch on a GPU was asked for, but torch sees no CUDA device")
    return partial(_torch_block, device="cuda" if cuda else "cpu")


# search.backend -> (query dimension, use_gpu) -> the search of one block
EXACT_BACKENDS: dict[str, Callable[[int, bool | None], BlockSearch]] = {
    "torch": _torch_exact, "numpy": _numpy_exact, "faiss": _faiss_exact, "faiss-gpu": _faiss_gpu_exact}


def resolve_backend(backend: str, index: str = EXACT_INDEX, scores: int | None = None) -> str:
    """The backend that runs ``search.backend`` / ``search.index`` for a search of ``scores`` query-document scores:
    ``"torch"``, ``"numpy"``, ``"faiss"`` or ``"faiss-gpu"``.

    Raises:
        PgrankError: an unknown backend, or an approximate index with an exact-only backend (torch, numpy).
    """
    if backend != "auto" and backend not in EXACT_BACKENDS:
        raise PgrankError(f"search.backend: unknown {backend!r} (expected auto, {', '.join(EXACT_BACKENDS)})")
    if index != EXACT_INDEX:
        if backend in ("torch", "numpy"):
            raise PgrankError(f"search.index: {index!r} is an approximate FAISS index, but search.backend is {backend} "
                              f"(exact only); set search.backend to faiss or auto, or search.index to {EXACT_INDEX}")
        return "faiss"
    return auto_search_backend(scores) if backend == "auto" else backend


def dense_search(
    queries: np.ndarray,
    blocks: Iterable[tuple[int, np.ndarray]],
    ranks: np.ndarray,
    k: int,
    *,
    backend: str = "auto",
    use_gpu: bool | None = None,
    index: str = EXACT_INDEX,
    nprobe: int = 64,
    ef_search: int = 128,
) -> tuple[np.ndarray, np.ndarray]:
    """Maximum-inner-product top ``k`` over a corpus given as a stream of blocks: exact unless ``index`` says otherwise.

    Args:
        queries: ``(Q, D)`` float32 query embeddings.
        blocks: ``(start_row, (B, D) float32 block)`` pairs covering the corpus in row order, e.g.
            :meth:`pgrank.retrieval.dense.corpus_embeddings.CorpusEmbeddings.blocks`. Only one block is in memory at
            once (exact search).
        ranks: ``(N,)`` :func:`id_ranks` of the corpus (ties go to the smaller document id).
        k: documents per query.
        backend: ``"torch"``, ``"numpy"``, ``"faiss"``, ``"faiss-gpu"`` or ``"auto"`` (:func:`auto_search_backend`); see
            the module docstring.
        use_gpu: ``True``/``False`` forces the backend onto the GPU (FAISS: all of them; torch: the first) or the
            CPU; ``None``: on a GPU where the backend sees one.
        index: ``"Flat"`` (exact) or a FAISS ``index_factory`` string of an approximate index, e.g.
            ``"IVF4096,Flat"``, ``"HNSW32"`` (:func:`pgrank.retrieval.dense.approximate_search.approximate_search`).
        nprobe: inverted lists visited per query by an IVF index.
        ef_search: search depth of an HNSW index.

    Returns:
        ``(scores, rows)``, each ``(Q, min(k, N))``, best first; rows index the corpus. Exact search
        gives the rows of a brute-force sort by (score descending, id ascending) with either backend.

    Raises:
        PgrankError: a bad ``backend`` or ``index`` (the message names the ``search`` setting).
    """
    queries = np.ascontiguousarray(queries, dtype=np.float32)
    chosen = resolve_backend(backend, index, scores=len(queries) * len(ranks))
    if index != EXACT_INDEX:
        from pgrank.retrieval.dense.approximate_search import approximate_search

        return approximate_search(queries, blocks, ranks, k, index=index, nprobe=nprobe, ef_search=ef_search)
    search_block = EXACT_BACKENDS[chosen](queries.shape[1], use_gpu)
    best_s = np.full((len(queries), 0), -np.inf, dtype=np.float32)
    best_r = np.full((len(queries), 0), -1, dtype=np.int64)
    for start, block in blocks:
        block = np.ascontiguousarray(block, dtype=np.float32)
        if block.shape[1] != queries.shape[1]:
            raise ValueError(f"query dimension {queries.shape[1]} != corpus dimension {block.shape[1]}")
        merged_s, merged_r = [], []
        for at, s, r in search_block(queries, block, k):
            r = np.where(r >= 0, r + start, -1)
            s, r = top_k(np.concatenate([best_s[at], s], 1), np.concatenate([best_r[at], r], 1), ranks, k)
            merged_s.append(s)
            merged_r.append(r)
        if merged_s:  # every chunk has the same width, min(k, documents so far): the merge cuts tied rows back to k
            best_s, best_r = np.concatenate(merged_s), np.concatenate(merged_r)
    n = min(k, len(ranks))
    return best_s[:, :n], best_r[:, :n]
