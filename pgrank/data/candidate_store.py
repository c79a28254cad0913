"""The candidate store: every query's candidate set as columns on disk, memory-mapped by its readers.

A split's candidate sets (MS MARCO train: 500k queries x 1000 documents, 5x10^8 pairs) are what
training iterates over and what reranking scores. As Python objects they would not fit in memory (an
estimated 50-80 GB); as a TREC run they are 25 GB of text to parse. The store keeps exactly what its
readers need, in ``Paths.candidate_store(dataset, split)``::

    qids.offsets.npy, qids.bytes.npy          query ids, sorted (a StringColumn)
    queries.offsets.npy, queries.bytes.npy    their texts
    offsets.npy                               (Q + 1,) int64: query i's candidates are pairs offsets[i]:offsets[i+1]
    rows.i32                                  (P,) int32 corpus rows (:mod:`pgrank.data.corpus_store`)
    grades.i8                                 (P,) int8 judged grade of each candidate (0: unjudged)
    meta.json                                 written last: dataset, split, corpus checksum, counts, and
                                              ``sha256``, a digest of the sets' content (ids, texts, rows,
                                              grades), taken while they stream in

Each set is in stage-1 rank order (score descending, then document id ascending). 5 bytes a pair: MS
MARCO's training candidates take 2.5 GB. Readers memory-map the files, so every DDP rank shares the
same pages of the page cache and none holds a private copy. The stage-1 scores are not kept here: the
TREC run beside the store (``Paths.candidates``) has them, the interchange format for other tools.

Example:
    >>> store = open_candidates(paths, "scifact", "test")
    >>> rows, grades = store.candidates(store.index("1"))
"""

from __future__ import annotations

import bisect
import hashlib
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from pgrank.atomic import atomic_path, write_json
from pgrank.data.artifact_meta import META, read_meta
from pgrank.data.columns import Appender, StringColumn, open_array, open_raw, write_strings
from pgrank.data.corpus_store import CorpusStore
from pgrank.data.runs import ranked, write_run
from pgrank.errors import DataError
from pgrank.paths import Paths

FORMAT = "pgrank-candidate-store/1"
ROW_DTYPE, GRADE_DTYPE = "int32", "int8"


@dataclass(frozen=True)
class CandidateStore:
    """A split's candidate sets, memory-mapped (see the module docstring)."""

    folder: Path
    qids: StringColumn
    queries: StringColumn
    offsets: np.ndarray
    rows: np.ndarray
    grades: np.ndarray
    meta: dict

    def __len__(self) -> int:
        return len(self.qids)

    @property
    def pairs(self) -> int:
        return len(self.rows)

    def candidates(self, i: int) -> tuple[np.ndarray, np.ndarray]:
        """Query ``i``'s candidate rows and grades, best stage-1 rank first (views of the memory maps)."""
        lo, hi = int(self.offsets[i]), int(self.offsets[i + 1])
        return self.rows[lo:hi], self.grades[lo:hi]

    def sizes(self) -> np.ndarray:
        return np.diff(self.offsets)

    def index(self, qid: str) -> int | None:
        """Position of ``qid`` (binary search over the sorted ids), or ``None``."""
        at = bisect.bisect_left(self.qids, qid)
        return at if at < len(self) and self.qids[at] == qid else None


def open_candidate_store(folder: str | Path) -> CandidateStore:
    """Open a complete store.

    Raises:
        DataError: no store there (mining has not run), or an incomplete or foreign one.
    """
    folder = Path(folder)
    meta = read_meta(folder, FORMAT, missing="no candidate sets (no meta.json); run `pgrank mine` first",
                     remedy="mine again", keys=("pairs",))
    pairs = int(meta["pairs"])
    for name, dtype in (("rows.i32", ROW_DTYPE), ("grades.i8", GRADE_DTYPE)):  # a short file cannot be mapped
        size, expected = _size(folder / name), pairs * np.dtype(dtype).itemsize
        if size != expected:
            raise DataError(f"{folder / name}: {size} bytes, meta.json says {pairs} pairs ({expected} bytes): "
                            "a damaged store; mine again")
    store = CandidateStore(folder, StringColumn.open(folder, "qids"), StringColumn.open(folder, "queries"),
                           open_array(folder / "offsets.npy"), open_raw(folder / "rows.i32", ROW_DTYPE, pairs),
                           open_raw(folder / "grades.i8", GRADE_DTYPE, pairs), meta)
    if len(store) != meta["queries"] or int(store.offsets[-1]) != pairs:
        raise DataError(f"{folder}: the columns disagree with meta.json (a damaged store); mine again")
    return store


def _size(path: Path) -> int | None:
    try:
        return path.stat().st_size
    except FileNotFoundError:
        return None


def open_candidates(paths: Paths, dataset: str, split: str, training: bool = False) -> CandidateStore:
    """The candidate store of ``dataset/split`` (``Paths.candidate_store``)."""
    folder = paths.candidate_store(dataset, split, training)
    if not (folder / META).is_file():
        flag = "--training" if training or folder.parent.parent.name == "training-sets" else f"--dataset {dataset}"
        raise DataError(f"{folder}: no candidate sets for {dataset}/{split}; run `pgrank mine {flag}`")
    return open_candidate_store(folder)


class CandidateStoreWriter:
    """Streams candidate sets into a store, query by query; the store appears complete or not at all.

    Example:
        >>> with CandidateStoreWriter(folder, meta={"dataset": "scifact", "split": "test"}) as out:
        ...     out.add("1", "what causes fever", rows, grades)
    """

    def __init__(self, folder: str | Path, meta: dict):
        self.folder = Path(folder)
        self.meta = dict(meta)
        self._atomic = atomic_path(self.folder, directory=True)
        self._qids: list[str] = []
        self._queries: list[str] = []
        self._offsets = [0]
        self._last: str | None = None
        self._sha = hashlib.sha256()  # what the trainer's fingerprint compares: new judgments change it

    def __enter__(self) -> "CandidateStoreWriter":
        self.tmp = self._atomic.__enter__()
        self._rows = Appender(self.tmp / "rows.i32", ROW_DTYPE)
        self._grades = Appender(self.tmp / "grades.i8", GRADE_DTYPE)
        return self

    def add(self, qid: str, query: str, rows: np.ndarray, grades: np.ndarray) -> None:
        """Append one query's set (queries must come in sorted id order)."""
        if self._last is not None and qid <= self._last:
            raise DataError(f"{self.folder}: query {qid!r} after {self._last!r}; sets must come in sorted id order")
        grades = np.asarray(grades)
        if grades.size and (grades.min() < -128 or grades.max() > 127):
            raise DataError(f"{self.folder}: query {qid!r} has a grade outside -128..127")
        self._last = qid
        rows, grades = np.ascontiguousarray(rows, dtype=ROW_DTYPE), np.ascontiguousarray(grades, dtype=GRADE_DTYPE)
        self._sha.update(f"{len(qid)}:{qid}{len(query)}:{query}{rows.size}:".encode())
        self._sha.update(rows.tobytes())
        self._sha.update(grades.tobytes())
        self._qids.append(qid)
        self._queries.append(query)
        self._rows.append(rows)
        self._grades.append(grades)
        self._offsets.append(self._rows.count)

    def __exit__(self, exc_type, exc, tb):
        self._rows.close()
        self._grades.close()
        if exc_type is None:
            write_strings(self.tmp, "qids", self._qids)
            write_strings(self.tmp, "queries", self._queries)
            np.save(self.tmp / "offsets.npy", np.asarray(self._offsets, dtype=np.int64))
            sizes = np.diff(self._offsets)
            write_json(self.tmp / META, {
                **self.meta, "format": FORMAT, "queries": len(self._qids), "pairs": int(self._rows.count),
                "min_size": int(sizes.min()) if len(sizes) else 0, "max_size": int(sizes.max()) if len(sizes) else 0,
                "rows": ROW_DTYPE, "grades": GRADE_DTYPE, "sha256": self._sha.hexdigest()})
        return self._atomic.__exit__(exc_type, exc, tb)


# One query's candidate set as mining produces it: (qid, query text, corpus rows, stage-1 scores,
# grades), rows in rank order.
ScoredSet = tuple[str, str, np.ndarray, np.ndarray, np.ndarray]


def write_candidates(paths: Paths, dataset: str, split: str, sets: Iterable[ScoredSet], *, corpus: CorpusStore,
                     tag: str, trec: bool, meta: dict | None = None, training: bool = False) -> Path:
    """Write a split's candidate sets (in sorted query-id order) as a store, and as a TREC run beside it
    when ``trec`` (else a TREC run left by an earlier configuration is removed); one streaming pass.

    Returns:
        The store folder (``Paths.candidate_store``).
    """
    folder, run_path = paths.candidate_store(dataset, split, training), paths.candidates(dataset, split, training)
    meta = {"dataset": dataset, "split": split, "corpus_sha256": corpus.sha256, "tag": tag, **(meta or {})}
    with CandidateStoreWriter(folder, meta) as out:
        def stream():
            for qid, query, rows, scores, grades in sets:
                out.add(qid, query, rows, grades)
                yield qid, list(zip(corpus.ids.take(rows), scores.tolist()))

        if trec:
            write_run(run_path, stream(), tag)
        else:
            for _ in stream():
                pass
            run_path.unlink(missing_ok=True)
    return folder


def run_sets(run: Mapping[str, Mapping[str, float]], corpus: CorpusStore, queries: Mapping[str, str],
             qrels: Mapping[str, Mapping[str, int]]) -> Iterator[ScoredSet]:
    """A BEIR run ``{qid: {doc_id: score}}`` (candidate sets from elsewhere: a TREC file, a test) as the sets
    :func:`write_candidates` takes: queries in sorted order, each set in rank order, grades from ``qrels``.

    Raises:
        DataError: a document that is not in the corpus, or a query without a text.
    """
    for qid in sorted(run):
        if qid not in queries:
            raise DataError(f"candidate sets: query {qid!r} has no text in the split's queries")
        docs = ranked(run[qid])
        rows = corpus.rows(d for d, _ in docs)
        if (rows < 0).any():
            missing = [d for (d, _), r in zip(docs, rows) if r < 0]
            raise DataError(f"candidate sets: query {qid!r}: {len(missing)} documents are not in the corpus (e.g. {missing[:3]})")
        judged = qrels.get(qid, {})
        grades = np.array([judged.get(d, 0) for d, _ in docs], dtype=np.int64)
        yield qid, queries[qid], rows, np.array([s for _, s in docs], dtype=np.float32), grades
