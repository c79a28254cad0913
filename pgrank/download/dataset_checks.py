"""Checks of a whole BEIR dataset folder before it is installed, keeping only ids in memory.

``pgrank download`` checks every extracted folder the way :mod:`pgrank.data.beir` would read it: every
line parses, ids are unique, texts are strings, every judged query has a text, and the corpus is not
empty, every qrels file starts with its header. Judgments whose document is not in the corpus are
counted and reported (BEIR keeps them); a qrels file none of whose documents is in the corpus is an
error.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from pathlib import Path

from pgrank.data.beir import first_line_of, read_jsonl, read_qrels_rows, report_missing, string_field
from pgrank.errors import DataError


@dataclass(frozen=True)
class FolderSummary:
    """What :func:`validate_folder` found: counts per file and the corpus checksum."""

    documents: int
    queries: int
    judgments: dict[str, int]  # split -> judged (query, document) pairs
    missing_documents: dict[str, int]  # split -> judgments whose document is not in the corpus
    corpus_sha256: str



def validate_folder(folder: str | Path, label: str, *, progress: bool = False,
                    missing_documents: str = "warn") -> FolderSummary:
    """Check a BEIR folder the way loading would, keeping only ids in memory.

    Used by ``pgrank download`` before a dataset is renamed into place. ``label`` replaces the
    (temporary) folder in messages, e.g. ``"scifact.zip: scifact"``. ``missing_documents="error"``
    (datasets of your own, :mod:`pgrank.download.sources`) makes a judgment of a document that is not in
    the corpus an error naming its line, instead of a counted warning.
    """
    folder = Path(folder)
    corpus_file, queries_file = folder / "corpus.jsonl", folder / "queries.jsonl"
    digest = hashlib.sha256()
    doc_ids: set[str] = set()
    for line_no, doc_id, record in read_jsonl(corpus_file, f"{label}/corpus.jsonl", progress=progress, digest=digest):
        if doc_id in doc_ids:
            raise DataError(f"{label}/corpus.jsonl:{line_no}: duplicate _id {doc_id!r} "
                            f"(first on line {first_line_of(corpus_file, doc_id)})")
        doc_ids.add(doc_id)
        string_field(record, "text", f"{label}/corpus.jsonl", line_no)
        string_field(record, "title", f"{label}/corpus.jsonl", line_no, default="")
    if not doc_ids:
        raise DataError(f"{label}/corpus.jsonl: empty corpus (no documents)")
    query_ids: set[str] = set()
    for line_no, qid, record in read_jsonl(queries_file, f"{label}/queries.jsonl"):
        if qid in query_ids:
            raise DataError(f"{label}/queries.jsonl:{line_no}: duplicate _id {qid!r} "
                            f"(first on line {first_line_of(queries_file, qid)})")
        query_ids.add(qid)
        string_field(record, "text", f"{label}/queries.jsonl", line_no)
    judgments, missing = {}, {}
    for qrels_file in sorted((folder / "qrels").glob("*.tsv")):
        display = f"{label}/qrels/{qrels_file.name}"
        pairs: dict[tuple[str, str], int] = {}
        for line_no, qid, doc_id, score in read_qrels_rows(qrels_file, display):
            if qid not in query_ids:
                raise DataError(f"{display}:{line_no}: query {qid!r} has no text in queries.jsonl")
            if missing_documents == "error" and doc_id not in doc_ids:
                raise DataError(f"{display}:{line_no}: document {doc_id!r} is not in corpus.jsonl "
                                "(missing_documents: warn keeps such judgments, as BEIR does)")
            pairs[qid, doc_id] = score
        judgments[qrels_file.stem] = len(pairs)
        gone = [(q, d) for q, d in pairs if d not in doc_ids]
        missing[qrels_file.stem] = len(gone)
        report_missing(display, gone, len(pairs))
    return FolderSummary(len(doc_ids), len(query_ids), judgments, missing, digest.hexdigest())

