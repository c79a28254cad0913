"""BEIR folders read with BEIR's exact contract, plus the seeded validation carve-out.

The contract is the one of ``beir.datasets.data_loader.GenericDataLoader`` (tests check equality):

* corpus ``{doc_id: {"title": str, "text": str}}`` from ``corpus.jsonl``;
* queries ``{qid: text}`` from ``queries.jsonl``, restricted to the query ids of the split's qrels
  (``queries.jsonl`` holds the queries of every split), in qrels order;
* qrels ``{qid: {doc_id: int}}`` from ``qrels/SPLIT.tsv`` read with the ``csv`` module (BEIR wrote
  them CRLF), header row skipped, graded relevance kept, a repeated pair keeps its last score.

Unlike BEIR, a malformed JSON line, a duplicate ``_id``, a non-integer score or an empty corpus is a
:class:`DataError` naming the file and line, and a missing ``title`` reads as ``""`` (BEIR: None).
Judgments pointing at documents absent from the corpus are kept (as BEIR does) and reported as a
warning: ArguAna really has such rows.

Split names (:func:`qrels_path`, the one rule every stage goes through):

* ``train``, ``dev``, ``test``, ... are BEIR's own ``{data}/{dataset}/qrels/{split}.tsv``;
* ``train-pg`` and ``validation`` are the carve-out of ``data.train`` written by
  :func:`write_carve_out` (``Paths.carved_qrels(dataset, "train" | "validation")``): the paper
  trains on ``train-pg`` and selects checkpoints on ``validation``; together they are the BEIR split.

Example:
    >>> split = load_split(paths, "scifact", "test")
    >>> len(split.corpus), len(split.queries)
    (5183, 300)
"""

from __future__ import annotations

import csv
import hashlib
import json
import logging
import random
import re
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from tqdm.auto import tqdm

from pgrank.atomic import atomic_path
from pgrank.config import DataConfig
from pgrank.errors import DataError
from pgrank.paths import Paths

log = logging.getLogger(__name__)

Corpus = dict[str, dict[str, str]]
Queries = dict[str, str]
Qrels = dict[str, dict[str, int]]

CARVED_TRAIN = "train-pg"
VALIDATION = "validation"
# carved split name -> file name under Paths.carved_qrels
_CARVED_FILES = {CARVED_TRAIN: "train", VALIDATION: "validation"}
# Written by `pgrank download` into each dataset folder; caches the corpus checksum.
DOWNLOAD_RECORD = ".pgrank-download.json"
_NAME = re.compile(r"^[\w.-]+$")
_QRELS_HEADER = ["query-id", "corpus-id", "score"]


@dataclass(frozen=True)
class BeirSplit:
    """One split of a BEIR dataset: the whole corpus, the split's queries and its judgments."""

    dataset: str
    split: str
    corpus: Corpus
    queries: Queries
    qrels: Qrels


@dataclass(frozen=True)
class FolderSummary:
    """What :func:`validate_folder` found: counts per file and the corpus checksum."""

    documents: int
    queries: int
    judgments: dict[str, int]  # split -> judged (query, document) pairs
    missing_documents: dict[str, int]  # split -> judgments whose document is not in the corpus
    corpus_sha256: str


@dataclass(frozen=True)
class CarveOut:
    dataset: str
    split: str  # the BEIR split that was carved
    train_path: Path
    validation_path: Path
    train_queries: int
    validation_queries: int


# --------------------------------------------------------------------------------------- parsing


def _jsonl(path: Path, display: str, *, progress: bool = False, digest=None) -> Iterator[tuple[int, str, dict]]:
    """Yield ``(line number, _id, record)`` for each non-blank line; bad lines raise DataError."""
    if not path.is_file():
        raise DataError(f"{display}: no such file")
    with open(path, "rb") as fh, tqdm(
        total=path.stat().st_size, unit="B", unit_scale=True, desc=f"reading {path.name}",
        disable=not progress, leave=False, mininterval=1.0,
    ) as bar:
        for line_no, raw in enumerate(fh, 1):
            bar.update(len(raw))
            if digest is not None:
                digest.update(raw)
            if not raw.strip():
                continue
            try:
                record = json.loads(raw)
            except ValueError as exc:  # JSONDecodeError and UnicodeDecodeError
                raise DataError(f"{display}:{line_no}: not a valid JSON line ({exc})") from None
            if not isinstance(record, dict):
                raise DataError(f"{display}:{line_no}: expected a JSON object, got {type(record).__name__}")
            doc_id = record.get("_id")
            if not isinstance(doc_id, str) or not doc_id:
                raise DataError(f"{display}:{line_no}: expected a non-empty string \"_id\" (got {doc_id!r})")
            yield line_no, doc_id, record


def _text(record: dict, key: str, display: str, line_no: int, *, default: str | None = None) -> str:
    value = record.get(key, default)
    if value is None and default is not None:
        value = default
    if not isinstance(value, str):
        raise DataError(f"{display}:{line_no}: expected a string \"{key}\" (got {value!r})")
    return value


def _first_line(path: Path, doc_id: str) -> int:
    """Line on which ``doc_id`` first occurs (only called to explain a duplicate, so a rescan is fine)."""
    for line_no, other, _ in _jsonl(path, str(path)):
        if other == doc_id:
            return line_no
    return 0


def _duplicate(path: Path, display: str, line_no: int, doc_id: str) -> DataError:
    return DataError(f"{display}:{line_no}: duplicate _id {doc_id!r} (first on line {_first_line(path, doc_id)})")


def _qrels_rows(path: Path, display: str) -> Iterator[tuple[int, str, str, int]]:
    """Yield ``(line, qid, doc_id, score)``; the first row is a header and skipped, as in BEIR."""
    if not path.is_file():
        raise DataError(f"{display}: no such file")
    with open(path, encoding="utf-8", newline="") as fh:
        reader = csv.reader(fh, delimiter="\t", quoting=csv.QUOTE_MINIMAL)
        try:
            header = next(reader, None)
            if header and len(header) >= 3 and header[2].strip().lstrip("-").isdigit():
                log.warning("%s:1: first row %r looks like data, but it is skipped as the header (BEIR does the same)",
                            display, "\t".join(header))
            for row in reader:
                if not any(cell.strip() for cell in row):
                    continue
                if len(row) < 3:
                    raise DataError(f"{display}:{reader.line_num}: "
                                    f"expected query-id<TAB>corpus-id<TAB>score (got {row!r})")
                try:
                    score = int(row[2])
                except ValueError:
                    raise DataError(f"{display}:{reader.line_num}: score {row[2]!r} is not an integer") from None
                yield reader.line_num, row[0], row[1], score
        except (csv.Error, UnicodeDecodeError) as exc:
            raise DataError(f"{display}:{reader.line_num}: unreadable TSV row ({exc})") from None


# --------------------------------------------------------------------------------------- loading


def load_corpus(dataset_dir: str | Path, *, progress: bool = True) -> Corpus:
    """Read ``corpus.jsonl`` into ``{doc_id: {"title", "text"}}``.

    Raises:
        DataError: a malformed line, a duplicate ``_id`` or an empty corpus, naming file and line.
    """
    path = Path(dataset_dir) / "corpus.jsonl"
    corpus: Corpus = {}
    for line_no, doc_id, record in _jsonl(path, str(path), progress=progress):
        if doc_id in corpus:
            raise _duplicate(path, str(path), line_no, doc_id)
        corpus[doc_id] = {
            "text": _text(record, "text", str(path), line_no),
            "title": _text(record, "title", str(path), line_no, default=""),
        }
    if not corpus:
        raise DataError(f"{path}: empty corpus (no documents)")
    return corpus


def load_queries(dataset_dir: str | Path) -> Queries:
    """Read all of ``queries.jsonl`` (every split) into ``{qid: text}``."""
    path = Path(dataset_dir) / "queries.jsonl"
    queries: Queries = {}
    for line_no, qid, record in _jsonl(path, str(path)):
        if qid in queries:
            raise _duplicate(path, str(path), line_no, qid)
        queries[qid] = _text(record, "text", str(path), line_no)
    return queries


def load_qrels(path: str | Path) -> Qrels:
    """Read a BEIR qrels TSV into ``{qid: {doc_id: score}}`` (a repeated pair keeps its last score)."""
    path = Path(path)
    qrels: Qrels = {}
    for _, qid, doc_id, score in _qrels_rows(path, str(path)):
        qrels.setdefault(qid, {})[doc_id] = score
    return qrels


def qrels_path(paths: Paths, dataset: str, split: str) -> Path:
    """The qrels file of ``dataset/split`` (see the module docstring for the naming rule)."""
    for kind, name in (("dataset", dataset), ("split", split)):
        if not _NAME.match(name) or name in (".", ".."):
            raise DataError(f"{kind} name {name!r}: expected letters, digits, '_', '-' or '.'")
    if split in _CARVED_FILES:
        return paths.carved_qrels(dataset, _CARVED_FILES[split])
    return paths.dataset(dataset) / "qrels" / f"{split}.tsv"


def _check_split(paths: Paths, dataset: str, split: str) -> Path:
    folder = paths.dataset(dataset)
    if not (folder / "corpus.jsonl").is_file():
        raise DataError(f"{folder}: dataset {dataset!r} is not downloaded; run `pgrank download {dataset}`")
    path = qrels_path(paths, dataset, split)
    if path.is_file():
        return path
    if split in _CARVED_FILES:
        raise DataError(f"{path}: no validation carve-out for {dataset!r}; run `pgrank download` with "
                        f"data.train set to {dataset}/<split>")
    available = sorted(p.stem for p in (folder / "qrels").glob("*.tsv"))
    raise DataError(f"{path}: {dataset} has no split {split!r}; it has {', '.join(available) or 'no qrels'}"
                    f" (and the carved {CARVED_TRAIN!r} / {VALIDATION!r} of data.train)")


def load_topics(paths: Paths, dataset: str, split: str) -> tuple[Queries, Qrels]:
    """Queries and qrels of one split, without the corpus (BEIR: queries taken from the qrels)."""
    path = _check_split(paths, dataset, split)
    qrels = load_qrels(path)
    if not qrels:
        raise DataError(f"{path}: no judgments (only a header); {dataset}/{split} has no queries")
    all_queries = load_queries(paths.dataset(dataset))
    missing = [qid for qid in qrels if qid not in all_queries]
    if missing:
        raise DataError(f"{path}: {len(missing)} judged queries have no text in "
                        f"{paths.dataset(dataset) / 'queries.jsonl'} (e.g. {missing[:3]})")
    return {qid: all_queries[qid] for qid in qrels}, qrels


def missing_documents(qrels: Qrels, corpus_ids) -> list[tuple[str, str]]:
    """``(qid, doc_id)`` judgments whose document is not in ``corpus_ids`` (a dict or a set)."""
    return [(qid, doc_id) for qid, docs in qrels.items() for doc_id in docs if doc_id not in corpus_ids]


def _warn_missing(where: str, missing: list[tuple[str, str]]) -> None:
    if missing:
        log.warning("%s: %d judgments point at documents missing from the corpus (kept, as BEIR does), e.g. %s",
                    where, len(missing), ", ".join(f"{q}->{d}" for q, d in missing[:3]))


def load_split(paths: Paths, dataset: str, split: str, *, progress: bool = True) -> BeirSplit:
    """Load ``dataset/split`` exactly as ``GenericDataLoader(folder).load(split)`` does.

    Args:
        paths: artifact locations (``paths.dataset(name)`` holds the BEIR folder).
        dataset: BEIR name, e.g. ``"scifact"``.
        split: ``"train"``, ``"dev"``, ``"test"``, or the carved ``"train-pg"`` / ``"validation"``.
        progress: show a progress bar while reading the corpus.

    Raises:
        DataError: the dataset or split is missing, or a file is malformed (file and line named).
    """
    queries, qrels = load_topics(paths, dataset, split)
    corpus = load_corpus(paths.dataset(dataset), progress=progress)
    _warn_missing(f"{dataset}/{split}", missing_documents(qrels, corpus))
    return BeirSplit(dataset=dataset, split=split, corpus=corpus, queries=queries, qrels=qrels)


def _file_sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as fh:
        while chunk := fh.read(1 << 20):
            digest.update(chunk)
    return digest.hexdigest()


def corpus_sha256(dataset_dir: str | Path) -> str:
    """SHA-256 of ``corpus.jsonl`` (keys corpus-embedding artifacts).

    ``pgrank download`` records it; the record is trusted only while the file's size and
    modification time are unchanged, otherwise the file is hashed again.
    """
    folder = Path(dataset_dir)
    path = folder / "corpus.jsonl"
    if not path.is_file():
        raise DataError(f"{path}: no such file; run `pgrank download {folder.name}`")
    try:
        record = json.loads((folder / DOWNLOAD_RECORD).read_text(encoding="utf-8"))["corpus"]
        st = path.stat()
        if record["bytes"] == st.st_size and record["mtime_ns"] == st.st_mtime_ns:
            return record["sha256"]
    except (OSError, ValueError, KeyError, TypeError):
        pass
    return _file_sha256(path)


# --------------------------------------------------------------------------------------- validation


def validate_folder(folder: str | Path, label: str, *, progress: bool = False) -> FolderSummary:
    """Check a BEIR folder the way loading would, keeping only ids in memory.

    Used by ``pgrank download`` before a dataset is renamed into place. ``label`` replaces the
    (temporary) folder in messages, e.g. ``"scifact.zip: scifact"``.
    """
    folder = Path(folder)
    corpus_file, queries_file = folder / "corpus.jsonl", folder / "queries.jsonl"
    digest = hashlib.sha256()
    doc_ids: set[str] = set()
    for line_no, doc_id, record in _jsonl(corpus_file, f"{label}/corpus.jsonl", progress=progress, digest=digest):
        if doc_id in doc_ids:
            raise DataError(f"{label}/corpus.jsonl:{line_no}: duplicate _id {doc_id!r} "
                            f"(first on line {_first_line(corpus_file, doc_id)})")
        doc_ids.add(doc_id)
        _text(record, "text", f"{label}/corpus.jsonl", line_no)
        _text(record, "title", f"{label}/corpus.jsonl", line_no, default="")
    if not doc_ids:
        raise DataError(f"{label}/corpus.jsonl: empty corpus (no documents)")
    query_ids: set[str] = set()
    for line_no, qid, record in _jsonl(queries_file, f"{label}/queries.jsonl"):
        if qid in query_ids:
            raise DataError(f"{label}/queries.jsonl:{line_no}: duplicate _id {qid!r} "
                            f"(first on line {_first_line(queries_file, qid)})")
        query_ids.add(qid)
        _text(record, "text", f"{label}/queries.jsonl", line_no)
    judgments, missing = {}, {}
    for qrels_file in sorted((folder / "qrels").glob("*.tsv")):
        display = f"{label}/qrels/{qrels_file.name}"
        pairs: dict[tuple[str, str], int] = {}
        for line_no, qid, doc_id, score in _qrels_rows(qrels_file, display):
            if qid not in query_ids:
                raise DataError(f"{display}:{line_no}: query {qid!r} has no text in queries.jsonl")
            pairs[qid, doc_id] = score
        judgments[qrels_file.stem] = len(pairs)
        gone = [(q, d) for q, d in pairs if d not in doc_ids]
        missing[qrels_file.stem] = len(gone)
        _warn_missing(display, gone)
    return FolderSummary(len(doc_ids), len(query_ids), judgments, missing, digest.hexdigest())


# --------------------------------------------------------------------------------------- carve-out


def carve_validation(qrels: Qrels, size: int, seed: int) -> tuple[Qrels, Qrels]:
    """Split judged queries into (train, validation) with ``size`` seeded validation queries.

    The draw is over the sorted query ids, so it depends only on the ids, ``size`` and ``seed``;
    both parts keep the input's order. Pure: ``qrels`` is not modified.
    """
    if size >= len(qrels):
        raise DataError(f"data.validation_size={size} must be smaller than the {len(qrels)} training queries")
    chosen = set(random.Random(seed).sample(sorted(qrels), size))
    train = {qid: dict(docs) for qid, docs in qrels.items() if qid not in chosen}
    validation = {qid: dict(docs) for qid, docs in qrels.items() if qid in chosen}
    return train, validation


def write_qrels(path: str | Path, qrels: Qrels) -> None:
    """Write a BEIR qrels TSV atomically: header, then one ``qid<TAB>doc<TAB>score`` row, CRLF like BEIR."""
    with atomic_path(path) as tmp:
        with open(tmp, "w", encoding="utf-8", newline="") as fh:
            writer = csv.writer(fh, delimiter="\t", lineterminator="\r\n")
            writer.writerow(_QRELS_HEADER)
            writer.writerows([qid, doc_id, score] for qid, docs in qrels.items() for doc_id, score in docs.items())


def write_carve_out(paths: Paths, data: DataConfig) -> CarveOut:
    """Carve ``data.validation_size`` seeded validation queries out of ``data.train``'s qrels.

    Writes ``Paths.carved_qrels(dataset, "train")`` and ``(dataset, "validation")``, read back
    as the splits ``train-pg`` and ``validation``. Deterministic: rerunning rewrites identical bytes.
    """
    dataset, split = data.train.split("/")
    path = _check_split(paths, dataset, split)
    qrels = load_qrels(path)
    try:
        train, validation = carve_validation(qrels, data.validation_size, data.validation_seed)
    except DataError:
        raise DataError(f"data.validation_size={data.validation_size} must be smaller than the {len(qrels)} "
                        f"queries of {data.train} ({path}); lower it, e.g. --set data.validation_size="
                        f"{max(1, len(qrels) // 8)}") from None
    train_path = paths.carved_qrels(dataset, _CARVED_FILES[CARVED_TRAIN])
    validation_path = paths.carved_qrels(dataset, _CARVED_FILES[VALIDATION])
    write_qrels(train_path, train)
    write_qrels(validation_path, validation)
    return CarveOut(dataset, split, train_path, validation_path, len(train), len(validation))
