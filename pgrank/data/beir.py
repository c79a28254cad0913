"""BEIR folders read with BEIR's exact contract.

The contract is the one of ``beir.datasets.data_loader.GenericDataLoader`` (tests check equality):

* corpus ``{doc_id: {"title": str, "text": str}}`` from ``corpus.jsonl``;
* queries ``{qid: text}`` from ``queries.jsonl``, restricted to the query ids of the split's qrels
  (``queries.jsonl`` holds the queries of every split), in qrels order;
* qrels ``{qid: {doc_id: int}}`` from ``qrels/SPLIT.tsv`` read with the ``csv`` module (BEIR wrote
  them CRLF), header row skipped, graded relevance kept, a repeated pair keeps its last score.

Unlike BEIR, a malformed JSON line, a duplicate ``_id``, a non-integer score, an empty corpus or a
qrels file whose first row is a judgment rather than the header (BEIR silently drops it) is a
:class:`DataError` naming the file and line, and a missing ``title`` reads as ``""`` (BEIR: None).
Judgments pointing at documents absent from the corpus are kept (as BEIR does, so that published
numbers stay comparable) and reported as a warning: ArguAna really has such rows. When *none* of a
split's judged documents is in the corpus, the qrels and the corpus do not belong together, and that
is an error.

Split names (:func:`qrels_path`, the one rule every stage goes through):

* ``train``, ``dev``, ``test``, ... are BEIR's own ``{data}/{dataset}/qrels/{split}.tsv``;
* ``train-pg``, ``validation`` and ``gate-pg`` are the carve-out of ``data.train`` written by
  :func:`pgrank.download.carve_out.write_carve_out` (``Paths.carved_qrels``): the paper
  trains on ``train-pg`` and selects checkpoints on ``validation``; scheduled retraining's champion gate
  judges on ``gate-pg`` (empty unless ``data.gate_size`` or ``data.holdout``); together they are the BEIR split.

Example:
    >>> split = load_split(paths, "scifact", "test")
    >>> len(split.corpus), len(split.queries)
    (5183, 300)
"""

from __future__ import annotations

import csv
import json
import logging
import re
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from tqdm.auto import tqdm

from pgrank.atomic import atomic_path
from pgrank.errors import DataError
from pgrank.paths import CARVED_FILES, Paths

log = logging.getLogger(__name__)

Corpus = dict[str, dict[str, str]]
Queries = dict[str, str]
Qrels = dict[str, dict[str, int]]
TEXT_SEP = " "  # BEIR joins title and text with one space
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



def document_text(doc) -> str:
    """BEIR's document string: ``(title + " " + text).strip()``, or the text alone without a title."""
    if "title" in doc:
        return (doc["title"] + TEXT_SEP + doc["text"]).strip()
    return doc["text"].strip()


# --------------------------------------------------------------------------------------- parsing


def read_jsonl(path: Path, display: str, *, progress: bool = False, digest=None) -> Iterator[tuple[int, str, dict]]:
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
            yield line_no, *parse_record(raw, display, line_no)


def parse_record(raw: bytes, display: str, line_no: int) -> tuple[str, dict]:
    """``(_id, record)`` of one non-blank JSON line; a bad line raises DataError naming it."""
    try:
        record = json.loads(raw)
    except ValueError as exc:  # JSONDecodeError and UnicodeDecodeError
        raise DataError(f"{display}:{line_no}: not a valid JSON line ({exc})") from None
    if not isinstance(record, dict):
        raise DataError(f"{display}:{line_no}: expected a JSON object, got {type(record).__name__}")
    doc_id = record.get("_id")
    if not isinstance(doc_id, str) or not doc_id:
        raise DataError(f"{display}:{line_no}: expected a non-empty string \"_id\" (got {doc_id!r})")
    return doc_id, record


def string_field(record: dict, key: str, display: str, line_no: int, *, default: str | None = None) -> str:
    """``record[key]``, which must be a string (``default`` when absent or null); else a DataError naming the line."""
    value = record.get(key, default)
    if value is None and default is not None:
        value = default
    if not isinstance(value, str):
        raise DataError(f"{display}:{line_no}: expected a string \"{key}\" (got {value!r})")
    return value


def first_line_of(path: Path, doc_id: str) -> int:
    """Line on which ``doc_id`` first occurs (only called to explain a duplicate, so a rescan is fine)."""
    for line_no, other, _ in read_jsonl(path, str(path)):
        if other == doc_id:
            return line_no
    return 0


def _duplicate(path: Path, display: str, line_no: int, doc_id: str) -> DataError:
    return DataError(f"{display}:{line_no}: duplicate _id {doc_id!r} (first on line {first_line_of(path, doc_id)})")


def read_qrels_rows(path: Path, display: str) -> Iterator[tuple[int, str, str, int]]:
    """Yield ``(line, qid, doc_id, score)``; the first row is a header and skipped, as in BEIR."""
    if not path.is_file():
        raise DataError(f"{display}: no such file")
    with open(path, encoding="utf-8", newline="") as fh:
        reader = csv.reader(fh, delimiter="\t", quoting=csv.QUOTE_MINIMAL)
        try:
            header = next(reader, None)
            if header and len(header) >= 3 and header[2].strip().lstrip("-").isdigit():
                raise DataError(f"{display}:1: expected the header row query-id<TAB>corpus-id<TAB>score, got the "
                                f"judgment {chr(9).join(header)!r}; BEIR skips the first row, so it would be lost. "
                                "Add the header line")
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
    for line_no, doc_id, record in read_jsonl(path, str(path), progress=progress):
        if doc_id in corpus:
            raise _duplicate(path, str(path), line_no, doc_id)
        corpus[doc_id] = {
            "text": string_field(record, "text", str(path), line_no),
            "title": string_field(record, "title", str(path), line_no, default=""),
        }
    if not corpus:
        raise DataError(f"{path}: empty corpus (no documents)")
    return corpus


def load_queries(dataset_dir: str | Path) -> Queries:
    """Read all of ``queries.jsonl`` (every split) into ``{qid: text}``."""
    path = Path(dataset_dir) / "queries.jsonl"
    queries: Queries = {}
    for line_no, qid, record in read_jsonl(path, str(path)):
        if qid in queries:
            raise _duplicate(path, str(path), line_no, qid)
        queries[qid] = string_field(record, "text", str(path), line_no)
    return queries


def load_qrels(path: str | Path) -> Qrels:
    """Read a BEIR qrels TSV into ``{qid: {doc_id: score}}`` (a repeated pair keeps its last score)."""
    path = Path(path)
    qrels: Qrels = {}
    for _, qid, doc_id, score in read_qrels_rows(path, str(path)):
        qrels.setdefault(qid, {})[doc_id] = score
    return qrels


def write_qrels(path: str | Path, qrels: Qrels) -> None:
    """Write a BEIR qrels TSV atomically: header, then one ``qid<TAB>doc<TAB>score`` row, CRLF like BEIR."""
    with atomic_path(path) as tmp:
        with open(tmp, "w", encoding="utf-8", newline="") as fh:
            writer = csv.writer(fh, delimiter="\t", lineterminator="\r\n")
            writer.writerow(_QRELS_HEADER)
            writer.writerows([qid, doc_id, score] for qid, docs in qrels.items() for doc_id, score in docs.items())


def qrels_path(paths: Paths, dataset: str, split: str) -> Path:
    """The qrels file of ``dataset/split`` (see the module docstring for the naming rule)."""
    for kind, name in (("dataset", dataset), ("split", split)):
        if not _NAME.match(name) or name in (".", ".."):
            raise DataError(f"{kind} name {name!r}: expected letters, digits, '_', '-' or '.'")
    if split in CARVED_FILES:
        return paths.carved_qrels(dataset, CARVED_FILES[split])
    return paths.dataset(dataset) / "qrels" / f"{split}.tsv"


def split_qrels(paths: Paths, dataset: str, split: str) -> Path:
    """The qrels file of ``dataset/split``, which must exist; else a DataError saying what to run or which splits exist."""
    folder = paths.dataset(dataset)
    if not (folder / "corpus.jsonl").is_file():
        raise DataError(f"{folder}: dataset {dataset!r} is not downloaded; run `pgrank download {dataset}`")
    path = qrels_path(paths, dataset, split)
    if path.is_file():
        return path
    if split in CARVED_FILES:
        raise DataError(f"{path}: no validation carve-out for {dataset!r}; run `pgrank download` with "
                        f"data.train set to {dataset}/<split>")
    available = sorted(p.stem for p in (folder / "qrels").glob("*.tsv"))
    raise DataError(f"{path}: {dataset} has no split {split!r}; it has {', '.join(available) or 'no qrels'}"
                    f" (and the carved {' / '.join(map(repr, CARVED_FILES))} of data.train)")


def load_topics(paths: Paths, dataset: str, split: str) -> tuple[Queries, Qrels]:
    """Queries and qrels of one split, without the corpus (BEIR: queries taken from the qrels)."""
    path = split_qrels(paths, dataset, split)
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


def report_missing(where: str, missing: list[tuple[str, str]], judged: int) -> None:
    """Report judgments of absent documents (kept, as BEIR does); all of them absent is an error."""
    if missing and len(missing) == judged:
        raise DataError(f"{where}: none of its {judged} judged documents is in corpus.jsonl (e.g. "
                        f"{', '.join(repr(d) for _, d in missing[:3])}); the qrels and the corpus do not belong together")
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
    report_missing(f"{dataset}/{split}", missing_documents(qrels, corpus), sum(map(len, qrels.values())))
    return BeirSplit(dataset=dataset, split=split, corpus=corpus, queries=queries, qrels=qrels)

