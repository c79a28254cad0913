"""TREC runs, and the one order every run of pgrank follows: score descending, then document id ascending.

A run is a BEIR run ``{qid: {doc_id: score}}``; a stage-1 candidate set *is* a run. On disk it is a
TREC run file (``Paths.candidates`` for candidate sets, ``Paths.results(...)/run.trec`` for results)::

    qid Q0 doc_id rank score tag

grouped by query (queries in sorted id order), and within a query ranked by score descending, then
document id ascending; ``rank`` counts from 1. Scores are float32, written with 9 significant digits
(which round-trips float32 exactly).

The same order, made total by a single ``uint64`` key per (query, document) (:func:`order_keys`: the
high 32 bits encode the float32 score so that a larger score gives a smaller key, the low 32 bits the
document's rank in id order), selects the best ``k`` of score arrays (:func:`top_k`) with no Python
sort over millions of documents, for every retriever (BM25, dense, SPLADE).

Note that trec_eval itself breaks score ties by document id *descending*;
:func:`pgrank.core.trec_eval.trec_eval_cut` follows trec_eval where a run is cut for it.

Example:
    >>> write_run("runs/x/candidates/scifact/test.trec", {"q1": [("d1", 2.5), ("d7", 1.0)]}, "pgrank-bm25")
    >>> read_run("runs/x/candidates/scifact/test.trec")
    {'q1': {'d1': 2.5, 'd7': 1.0}}
"""

from __future__ import annotations

import re
from collections.abc import Container, Iterable, Iterator, Mapping, Sequence
from pathlib import Path

import numpy as np

from pgrank.atomic import atomic_path, fault_point
from pgrank.errors import DataError

Ranked = Sequence[tuple[str, float]]
_SIGN = np.uint32(0x80000000)


def ranked(scores: Mapping[str, float]) -> list[tuple[str, float]]:
    """A candidate set in file order: float32 score descending, then document id ascending."""
    items = list(zip(scores, np.asarray(list(scores.values()), dtype=np.float32).tolist()))
    return sorted(items, key=lambda item: (-item[1], item[0]))


_SPACE = re.compile(r"\s")  # str.isspace's characters


def _check_id(kind: str, value: str, path: Path) -> None:
    if not value or _SPACE.search(value):
        raise DataError(f"{path}: {kind} {value!r} is empty or contains whitespace; a TREC run cannot hold it")


def write_run(path: str | Path, sets: Mapping[str, Ranked] | Iterable[tuple[str, Ranked]], tag: str) -> None:
    """Write a run as a TREC run file, atomically.

    Args:
        path: the output file.
        sets: ``{qid: [(doc_id, score), ...]}`` (written in sorted qid order), or ``(qid, ranked)``
            pairs written as they come (a generator streams a large split to disk); each list
            already in rank order (see :func:`ranked`).
        tag: the run tag (last column), e.g. ``pgrank-bm25``.

    Raises:
        DataError: an id with whitespace, or a query given twice; nothing is left behind.
    """
    path = Path(path)
    items = ((q, sets[q]) for q in sorted(sets)) if isinstance(sets, Mapping) else sets
    seen: set[str] = set()
    with atomic_path(path) as tmp, open(tmp, "w", encoding="utf-8", newline="\n") as fh:
        for qid, docs in items:
            _check_id("query id", qid, path)
            if qid in seen:
                raise DataError(f"{path}: query {qid!r} given twice")
            seen.add(qid)
            ids = [doc for doc, _ in docs]
            if not all(ids) or _SPACE.search("".join(ids)):  # one search a query; the message names the id
                for doc in ids:
                    _check_id("document id", doc, path)
            fh.writelines([f"{qid} Q0 {doc} {rank} {float(score):.9g} {tag}\n"
                           for rank, (doc, score) in enumerate(docs, start=1)])
            fault_point("run.query", qid)


def iter_run(path: str | Path, known: Container[str] | None = None) -> Iterator[tuple[str, dict[str, float]]]:
    """Stream a run file query by query: ``(qid, {doc_id: score})`` in rank order.

    Memory holds one query's set at a time (MS MARCO train has 500k of them).

    Args:
        path: the run file.
        known: the queries the file may hold (those of its split), if given.

    Raises:
        DataError: a malformed line, a repeated document, a query whose lines are not
            contiguous, or one not in ``known`` (a file of another split), naming the file and line.
    """
    path = Path(path)
    if not path.is_file():
        raise DataError(f"{path}: no such run file (for candidate sets, run `pgrank mine` first)")
    seen: set[str] = set()
    qid, docs = None, {}
    with open(path, encoding="utf-8") as fh:
        for line_no, line in enumerate(fh, start=1):
            if not line.strip():
                continue
            fields = line.split()
            if len(fields) != 6:
                raise DataError(f"{path}:{line_no}: expected 6 fields 'qid Q0 doc_id rank score tag', got {len(fields)}")
            q, _, doc, rank, score, _ = fields
            try:
                int(rank)
                value = float(np.float32(score))  # exactly the float32 score that was written
            except ValueError:
                raise DataError(
                    f"{path}:{line_no}: rank {rank!r} / score {score!r}: expected an integer and a number"
                ) from None
            if q != qid:
                if known is not None and q not in known:
                    raise DataError(f"{path}:{line_no}: query {q!r} is not a query of this split; "
                                    "is the file from another dataset or split?")
                if q in seen:
                    raise DataError(
                        f"{path}:{line_no}: query {q!r} appears again after other queries; lines must be grouped by query"
                    )
                if qid is not None:
                    yield qid, docs
                seen.add(q)
                qid, docs = q, {}
            if doc in docs:
                raise DataError(f"{path}:{line_no}: document {doc!r} listed twice for query {q!r}")
            docs[doc] = value
    if qid is not None:
        yield qid, docs


def read_run(path: str | Path, known: Container[str] | None = None) -> dict[str, dict[str, float]]:
    """Read a whole run file as a BEIR run ``{qid: {doc_id: score}}`` (rank order kept; see :func:`iter_run`)."""
    return dict(iter_run(path, known))


# --------------------------------------------------------------------------------------- the order (arrays)


def id_ranks(doc_ids: Sequence[str]) -> np.ndarray:
    """Each document's position when the ids are sorted as strings (code-point order). ``(N,)`` uint32."""
    if len(doc_ids) >= 2**32:
        raise ValueError("more than 2**32 documents")
    order = np.argsort(np.asarray(doc_ids, dtype=str), kind="stable")
    ranks = np.empty(len(doc_ids), dtype=np.uint32)
    ranks[order] = np.arange(len(doc_ids), dtype=np.uint32)
    return ranks


def order_keys(scores: np.ndarray, ranks: np.ndarray) -> np.ndarray:
    """Sort keys: ascending key = score descending, then document id ascending.

    Args:
        scores: float scores (cast to float32; NaN is not allowed).
        ranks: :func:`id_ranks` of the same documents, broadcastable to ``scores``.
    """
    # "+ 0" turns -0.0 into 0.0, so that the two zeros (equal as floats) get one key.
    bits = (np.asarray(scores, dtype=np.float32) + np.float32(0)).view(np.uint32)
    # IEEE-754 floats order like sign-magnitude integers: flip all bits of negatives, the sign bit
    # of positives, and the result orders like the floats (ascending). Invert for descending.
    ascending = np.where(bits & _SIGN, ~bits, bits | _SIGN)
    return (~ascending).astype(np.uint64) << np.uint64(32) | ranks.astype(np.uint64)


def from_order_keys(keys: np.ndarray, id_order: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The inverse of :func:`order_keys`: the float32 scores and the document rows the keys were made of.

    Args:
        keys: :func:`order_keys` of some documents.
        id_order: the corpus' rows sorted by id (row of each id rank).
    """
    ascending = ~(keys >> np.uint64(32)).astype(np.uint32)
    bits = np.where(ascending & _SIGN, ascending & ~_SIGN, ~ascending)
    return bits.view(np.float32), np.asarray(id_order)[(keys & np.uint64(0xFFFFFFFF)).astype(np.int64)]


def top_k(scores: np.ndarray, indices: np.ndarray, ranks: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
    """The best ``k`` entries of each row, in the deterministic order.

    Args:
        scores: ``(Q, M)`` scores.
        indices: ``(Q, M)`` or broadcastable document rows the scores belong to (-1: no document).
        ranks: ``(N,)`` :func:`id_ranks` of the whole corpus.
        k: how many to keep (at most ``M``).

    Returns:
        ``(scores, indices)``, each ``(Q, min(k, M))``, best first.
    """
    indices = np.broadcast_to(indices, scores.shape)
    valid = indices >= 0
    keys = np.where(valid, order_keys(scores, ranks[np.where(valid, indices, 0)]), np.uint64(2**64 - 1))
    k = min(k, keys.shape[1])
    if k < keys.shape[1]:
        part = np.argpartition(keys, k - 1, axis=1)[:, :k]
    else:
        part = np.broadcast_to(np.arange(keys.shape[1]), keys.shape)
    order = np.take_along_axis(part, np.argsort(np.take_along_axis(keys, part, axis=1), axis=1), axis=1)
    return np.take_along_axis(scores, order, axis=1), np.take_along_axis(indices, order, axis=1)
