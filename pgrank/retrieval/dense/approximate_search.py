"""Approximate maximum-inner-product search with a FAISS ``index_factory`` index (``search.index``).

For users who trade exactness for speed at scale. ``search.index`` names any inner-product index that
``faiss.index_factory`` builds, e.g. ``"IVF4096,Flat"`` (k-means lists, ``search.nprobe`` of them
visited per query), ``"HNSW32"`` (a graph, ``search.ef_search`` deep) or ``"IVF4096,PQ64"``.

This is **approximate**: a query may miss documents of its exact top k, so results (and the metrics
computed from them) differ from those of exact search (``search.index: Flat``), and depend on the
index, its parameters and its training sample. What is returned is still ranked in the one order of
every run (score descending, then document id ascending), but the documents tied at the k-th score are
whichever the index found, not all of them.

Memory: unlike exact search, which streams one block at a time, the index holds the **whole corpus**,
in FAISS's own memory (its codes, not Python objects): ``"IVF4096,Flat"`` and ``"HNSW32"`` keep every
vector at float32 (N x D x 4 bytes: 27 GB for 8.8M x 768; HNSW adds about 2 x 32 x 4 bytes of graph
links per document), ``"IVF4096,SQ8"`` one byte per dimension, ``"IVF4096,PQ64"`` 64 bytes per document.
The index is built from the streamed blocks on every search and never written to disk. An index that
needs training (IVF, PQ) is trained on a seeded sample of the first :func:`_train_rows` streamed rows
(held until training, then added): a corpus stored in a meaningful order (say, by topic) gives a
skewed sample. It is built and searched on CPU.

Example:
    >>> scores, rows = approximate_search(queries, embeddings.blocks(), ranks, 10, index="HNSW32", nprobe=64,
    ...                                   ef_search=128)
"""

from __future__ import annotations

import logging
from collections.abc import Iterable

import numpy as np

from pgrank.data.runs import top_k
from pgrank.errors import PgrankError

log = logging.getLogger(__name__)

TRAIN_ROWS_PER_LIST = 64  # IVF: training vectors per inverted list (FAISS warns below 39)
MIN_TRAIN_ROWS = 65_536  # any trainable index (e.g. PQ's 256 centroids per sub-quantizer)


def import_faiss():
    """The ``faiss`` module.

    Raises:
        PgrankError: FAISS is not installed (it is an extra of its own: faiss-cpu or faiss-gpu, never both).
    """
    try:
        import faiss
    except ImportError:
        raise PgrankError("search: FAISS is not installed; install pgrank's cpu extra (pip install 'pgrank[cpu]', "
                          "faiss-cpu) or its gpu extra (pgrank[gpu], faiss-gpu), or set search.backend to torch") from None
    return faiss


def _reason(exc: RuntimeError) -> str:
    """FAISS's message without its C++ location ("Error in ... at file.cpp:123: <reason>")."""
    return str(exc).strip().splitlines()[0].rsplit(": ", 1)[-1]


def build_index(index: str, dim: int):
    """An empty inner-product index of ``search.index`` for ``dim``-dimensional vectors.

    Raises:
        PgrankError: FAISS cannot build ``index`` (a bad factory string, or one that does not fit ``dim``).
    """
    faiss = import_faiss()

    try:
        return faiss.index_factory(dim, index, faiss.METRIC_INNER_PRODUCT)
    except RuntimeError as exc:
        raise PgrankError(f"search.index: FAISS cannot build {index!r} for {dim}-dimensional vectors "
                          f"({_reason(exc)}); expected an index_factory string such as Flat, HNSW32 or IVF4096,Flat") from None


def _train_rows(index) -> int:
    """How many of the first streamed rows an untrained ``index`` is trained on."""
    faiss = import_faiss()

    ivf = faiss.try_extract_index_ivf(index)
    return max(MIN_TRAIN_ROWS, TRAIN_ROWS_PER_LIST * ivf.nlist if ivf is not None else 0)


def _train_and_add(index, name: str, held: list[np.ndarray], rows: int) -> None:
    """Train ``index`` on a seeded sample of ``rows`` of the held blocks, then add them all."""
    data = np.concatenate(held)
    sample = data if len(data) <= rows else data[np.sort(np.random.default_rng(0).choice(len(data), rows, replace=False))]
    log.info("training FAISS index %s on %d vectors", name, len(sample))
    try:
        index.train(sample)
    except RuntimeError as exc:
        raise PgrankError(f"search.index: {name!r} cannot be trained on {len(sample)} documents ({_reason(exc)})") from None
    index.add(data)


def _set_search_parameters(index, nprobe: int, ef_search: int) -> None:
    """``nprobe`` (IVF) and ``efSearch`` (HNSW, also an IVF's HNSW quantizer) where ``index`` has them."""
    faiss = import_faiss()

    space = faiss.ParameterSpace()
    for name, value in (("nprobe", nprobe), ("efSearch", ef_search), ("quantizer_efSearch", ef_search)):
        try:
            space.set_index_parameter(index, name, value)
        except RuntimeError:  # the index has no such parameter (e.g. nprobe of HNSW32)
            pass


def approximate_search(
    queries: np.ndarray,
    blocks: Iterable[tuple[int, np.ndarray]],
    ranks: np.ndarray,
    k: int,
    *,
    index: str,
    nprobe: int,
    ef_search: int,
) -> tuple[np.ndarray, np.ndarray]:
    """Approximate top ``k`` of every query with a FAISS index of the whole corpus (see the module docstring).

    Args:
        queries: ``(Q, D)`` float32 query embeddings.
        blocks: ``(start_row, (B, D) float32 block)`` pairs covering the corpus in row order.
        ranks: ``(N,)`` :func:`id_ranks` of the corpus (ties go to the smaller document id).
        k: documents per query.
        index: a FAISS ``index_factory`` string (``search.index``).
        nprobe: inverted lists visited per query (IVF indexes).
        ef_search: search depth (HNSW indexes).

    Returns:
        ``(scores, rows)``, each ``(Q, min(k, N))``, best first, in (score descending, id ascending)
        order; ``(-inf, -1)`` where the index found fewer than ``k`` documents.

    Raises:
        PgrankError: ``index`` cannot be built or trained.
    """
    queries = np.ascontiguousarray(queries, dtype=np.float32)
    dim = queries.shape[1]
    built = build_index(index, dim)
    needed = 0 if built.is_trained else _train_rows(built)
    held: list[np.ndarray] = []  # blocks waiting for the index to be trained
    seen = 0
    for start, block in blocks:
        block = np.ascontiguousarray(block, dtype=np.float32)
        if block.shape[1] != dim:
            raise ValueError(f"query dimension {dim} != corpus dimension {block.shape[1]}")
        if start != seen:
            raise ValueError(f"blocks must cover the corpus in row order: block at row {start}, expected {seen}")
        seen += len(block)
        if built.is_trained:
            built.add(block)
            continue
        held.append(block)
        if sum(map(len, held)) >= needed:
            _train_and_add(built, index, held, needed)
            held = []
    if held:  # the whole corpus is smaller than the training sample
        _train_and_add(built, index, held, needed)
    n = min(k, built.ntotal)
    if n == 0:
        return np.zeros((len(queries), 0), np.float32), np.zeros((len(queries), 0), np.int64)
    _set_search_parameters(built, nprobe, ef_search)
    scores, rows = built.search(queries, n)
    scores = np.where(rows >= 0, scores, -np.inf).astype(np.float32)
    return top_k(scores, rows, ranks, n)
