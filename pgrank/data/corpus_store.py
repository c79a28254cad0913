"""The corpus store: a BEIR corpus read by row, with no Python object per document.

Every stage that touches a corpus needs three things of it: the id of a row, the row of an id, and the
text of the few rows it is encoding or tokenizing right now. Loading ``corpus.jsonl`` into a dict gives
all three at the price of the whole corpus in memory (MS MARCO: 8.8M documents, 8-10 GB, minutes per
process). The store gives them from a few memory-mapped arrays beside the data, built once per corpus
(keyed by its SHA-256, ``Paths.corpus_store``) in one streaming pass::

    ids.offsets.npy, ids.bytes.npy    the document ids in row order (a StringColumn)
    line_offsets.npy                  (N + 1,) int64 byte offset of each document's line in corpus.jsonl
    id_ranks.npy                      (N,) uint32 rank of each row's id in code-point order (the run order)
    id_order.npy                      (N,) int64 the rows sorted by id (the inverse of id_ranks)
    id_hashes.npy, id_hash_rows.npy   (N,) uint64 sorted 64-bit hashes of the ids, and their rows
    meta.json                         written last: format, dataset, checksum, number of documents

Rows follow the file's order (as BEIR's dict does). Text is read from ``corpus.jsonl`` itself at the
recorded offsets, only for the rows asked for: ``(title + " " + text).strip()`` as BEIR joins them.
An id is found with a binary search over the hashes and a comparison of the id itself (no 8.8M-entry
dict). MS MARCO's store is about 240 MB on disk; opening it costs no private memory.

Building validates the corpus like :func:`pgrank.data.beir.load_corpus` does: every line is a JSON object
with a string ``_id``, ``text`` and (optional) ``title``, ids are unique, and the corpus is not empty.

Example:
    >>> store = open_corpus(paths, "scifact")
    >>> store.rows(["4983", "no-such-id"])
    array([ 0, -1])
    >>> store.texts([0])[0][:40]
    'Microstructural development of human new'
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
from array import array
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from tqdm.auto import tqdm

from pgrank.atomic import atomic_path, write_json
from pgrank.data.artifact_meta import META, read_meta
from pgrank.data.beir import TEXT_SEP, first_line_of, parse_record, string_field
from pgrank.data.checksums import corpus_sha256
from pgrank.data.columns import StringColumn, open_array
from pgrank.errors import DataError
from pgrank.paths import Paths

log = logging.getLogger(__name__)

FORMAT = "pgrank-corpus-store/1"


def id_hash(doc_id: str | bytes) -> int:
    """The 64-bit hash that locates an id in the store (BLAKE2b, stable across processes and machines)."""
    raw = doc_id.encode("utf-8") if isinstance(doc_id, str) else doc_id
    return int.from_bytes(hashlib.blake2b(raw, digest_size=8).digest(), "little")


def _document_text(record: dict, display: str, line_no: int) -> str:
    title = string_field(record, "title", display, line_no, default="")
    return (title + TEXT_SEP + string_field(record, "text", display, line_no)).strip()


@dataclass(frozen=True)
class CorpusStore:
    """A built store, memory-mapped (see the module docstring). ``len(store)`` is the number of documents."""

    folder: Path
    corpus_file: Path
    ids: StringColumn
    line_offsets: np.ndarray
    id_ranks: np.ndarray
    id_order: np.ndarray
    id_hashes: np.ndarray
    id_hash_rows: np.ndarray
    meta: dict

    def __len__(self) -> int:
        return len(self.ids)

    @property
    def sha256(self) -> str:
        return self.meta["corpus_sha256"]

    # ---- ids
    def rows(self, doc_ids: Iterable[str]) -> np.ndarray:
        """The row of each id, ``-1`` where the id is not in the corpus. ``(n,)`` int64."""
        doc_ids = list(doc_ids)
        hashes = np.fromiter((id_hash(d) for d in doc_ids), dtype=np.uint64, count=len(doc_ids))
        start = np.searchsorted(self.id_hashes, hashes, side="left")
        out = np.full(len(doc_ids), -1, dtype=np.int64)
        n = len(self.id_hashes)
        for i, (doc_id, at) in enumerate(zip(doc_ids, start.tolist())):
            raw = doc_id.encode("utf-8")
            while at < n and self.id_hashes[at] == hashes[i]:  # one entry, unless two ids share a hash
                row = int(self.id_hash_rows[at])
                if self.ids.encoded(row) == raw:
                    out[i] = row
                    break
                at += 1
        return out

    def __contains__(self, doc_id: object) -> bool:
        return isinstance(doc_id, str) and self.rows([doc_id])[0] >= 0

    # ---- text
    def _line(self, fd: int, row: int) -> bytes:
        lo, hi = int(self.line_offsets[row]), int(self.line_offsets[row + 1])
        return os.pread(fd, hi - lo, lo)

    def texts(self, rows: Iterable[int]) -> list[str]:
        """BEIR's document string of each row, read from ``corpus.jsonl`` at the recorded offsets."""
        rows = [int(r) for r in rows]
        out = []
        fd = os.open(self.corpus_file, os.O_RDONLY)
        try:
            for row in rows:
                record = json.loads(self._line(fd, row))
                out.append(((record.get("title") or "") + TEXT_SEP + record["text"]).strip())
        finally:
            os.close(fd)
        return out

    def records(self, rows: Iterable[int]) -> list[dict[str, str]]:
        """BEIR's ``{"title", "text"}`` of each row."""
        out = []
        fd = os.open(self.corpus_file, os.O_RDONLY)
        try:
            for row in rows:
                record = json.loads(self._line(fd, int(row)))
                out.append({"title": record.get("title") or "", "text": record["text"]})
        finally:
            os.close(fd)
        return out

    def text_blocks(self, lo: int = 0, hi: int | None = None, block: int = 4096) -> Iterator[tuple[int, list[str]]]:
        """``(first row, texts)`` of rows ``lo:hi`` in order, ``block`` rows at a time (one read per block)."""
        hi = len(self) if hi is None else hi
        with open(self.corpus_file, "rb") as fh:
            for start in range(lo, hi, block):
                end = min(start + block, hi)
                fh.seek(int(self.line_offsets[start]))
                data = fh.read(int(self.line_offsets[end]) - int(self.line_offsets[start]))
                base = int(self.line_offsets[start])
                cuts = (self.line_offsets[start : end + 1] - base).tolist()
                texts = []
                for a, b in zip(cuts[:-1], cuts[1:]):
                    record = json.loads(data[a:b])
                    texts.append(((record.get("title") or "") + TEXT_SEP + record["text"]).strip())
                yield start, texts


def open_corpus_store(folder: str | Path, corpus_file: str | Path) -> CorpusStore:
    """Open a built store (``meta.json`` present) over ``corpus_file``."""
    folder = Path(folder)
    meta = read_meta(folder, FORMAT, missing="not a complete corpus store (no meta.json)",
                     remedy=f"delete {folder} and the next stage builds it again", keys=("num_docs", "corpus_sha256"))
    store = CorpusStore(
        folder, Path(corpus_file), StringColumn.open(folder, "ids"), open_array(folder / "line_offsets.npy"),
        open_array(folder / "id_ranks.npy"), open_array(folder / "id_order.npy"), open_array(folder / "id_hashes.npy"),
        open_array(folder / "id_hash_rows.npy"), meta,
    )
    if len(store) != meta["num_docs"]:
        raise DataError(f"{folder}: {len(store)} ids, meta.json says {meta['num_docs']}")
    return store


def _code_point_order(id_offsets: np.ndarray, id_bytes: bytes) -> np.ndarray:
    """Rows sorted by id (UTF-8 byte order is code-point order), with Arrow: no Python string per id."""
    import pyarrow as pa
    import pyarrow.compute as pc

    n = len(id_offsets) - 1
    column = pa.LargeBinaryArray.from_buffers(pa.large_binary(), n, [None, pa.py_buffer(id_offsets),
                                                                      pa.py_buffer(id_bytes)])
    return pc.sort_indices(column).to_numpy().astype(np.int64)


def build_corpus_store(corpus_file: str | Path, folder: str | Path, *, dataset: str, corpus_sha256: str,
                       progress: bool = False) -> CorpusStore:
    """Read ``corpus_file`` once and write the store into ``folder`` (atomically).

    Raises:
        DataError: a malformed line, a duplicate ``_id`` or an empty corpus, naming file and line.
    """
    corpus_file, folder = Path(corpus_file), Path(folder)
    display = str(corpus_file)
    if not corpus_file.is_file():
        raise DataError(f"{display}: no such file")
    line_offsets = array("q")
    id_offsets = array("q", [0])
    id_bytes = bytearray()
    hashes = array("Q")
    pos = 0
    with open(corpus_file, "rb") as fh, tqdm(total=corpus_file.stat().st_size, unit="B", unit_scale=True,
                                             desc=f"indexing {dataset} corpus", disable=not progress,
                                             leave=False, mininterval=1.0) as bar:
        for line_no, raw in enumerate(fh, 1):
            if raw.strip():
                doc_id, record = parse_record(raw, display, line_no)
                _document_text(record, display, line_no)  # text and title must be strings
                encoded = doc_id.encode("utf-8")
                line_offsets.append(pos)
                id_bytes += encoded
                id_offsets.append(len(id_bytes))
                hashes.append(id_hash(encoded))
            pos += len(raw)
            bar.update(len(raw))
    line_offsets.append(pos)
    n = len(hashes)
    if n == 0:
        raise DataError(f"{display}: empty corpus (no documents)")
    offsets = np.frombuffer(id_offsets, dtype=np.int64)
    order = _code_point_order(offsets, bytes(id_bytes))
    starts, ends = offsets[order], offsets[order + 1]
    data = np.frombuffer(bytes(id_bytes), dtype=np.uint8)
    same_len = (ends - starts)[1:] == (ends - starts)[:-1]
    for k in np.flatnonzero(same_len).tolist():  # neighbours in sorted order with equal lengths
        a, b = order[k], order[k + 1]
        if data[offsets[a] : offsets[a + 1]].tobytes() == data[offsets[b] : offsets[b + 1]].tobytes():
            doc_id = data[offsets[b] : offsets[b + 1]].tobytes().decode("utf-8")
            later = max(a, b)
            line = _line_of(corpus_file, later)
            raise DataError(f"{display}:{line}: duplicate _id {doc_id!r} (first on line {first_line_of(corpus_file, doc_id)})")
    ranks = np.empty(n, dtype=np.uint32)
    ranks[order] = np.arange(n, dtype=np.uint32)
    hash_values = np.frombuffer(hashes, dtype=np.uint64)
    hash_order = np.argsort(hash_values, kind="stable")
    with atomic_path(folder, directory=True) as tmp:
        np.save(tmp / "ids.offsets.npy", offsets)
        np.save(tmp / "ids.bytes.npy", data)
        np.save(tmp / "line_offsets.npy", np.frombuffer(line_offsets, dtype=np.int64))
        np.save(tmp / "id_ranks.npy", ranks)
        np.save(tmp / "id_order.npy", order)
        np.save(tmp / "id_hashes.npy", hash_values[hash_order])
        np.save(tmp / "id_hash_rows.npy", hash_order.astype(np.int64))
        write_json(tmp / META, {"format": FORMAT, "dataset": dataset, "corpus_sha256": corpus_sha256,
                                       "num_docs": n, "corpus_bytes": pos})
    log.info("%s: corpus store of %d documents -> %s", dataset, n, folder)
    return open_corpus_store(folder, corpus_file)


def _line_of(corpus_file: Path, row: int) -> int:
    """The line number of document ``row`` (blank lines count; only called to explain an error)."""
    seen = -1
    with open(corpus_file, "rb") as fh:
        for line_no, raw in enumerate(fh, 1):
            if raw.strip():
                seen += 1
                if seen == row:
                    return line_no
    return 0


def open_corpus(paths: Paths, dataset: str, *, progress: bool = False) -> CorpusStore:
    """The store of ``dataset``'s corpus, built on first use (every stage that reads a corpus comes here).

    Raises:
        DataError: the dataset is not downloaded, or its corpus is malformed (file and line named).
    """
    folder = paths.dataset(dataset)
    corpus_file = folder / "corpus.jsonl"
    if not corpus_file.is_file():
        raise DataError(f"{folder}: dataset {dataset!r} is not downloaded; run `pgrank download {dataset}`")
    sha = corpus_sha256(folder)
    store = paths.corpus_store(dataset, sha)
    if (store / META).is_file():
        return open_corpus_store(store, corpus_file)
    return build_corpus_store(corpus_file, store, dataset=dataset, corpus_sha256=sha, progress=progress)
