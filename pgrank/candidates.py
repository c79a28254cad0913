"""Candidate files: stage-1 candidate sets stored as TREC runs, and the authors' published sets.

A candidate set is a BEIR run ``{qid: {doc_id: score}}``. On disk it is one TREC run per dataset
and split (``Paths.candidates(dataset, split)``)::

    qid Q0 doc_id rank score pgrank-<source>

grouped by query (queries in sorted id order), and within a query ranked by score descending, then
document id ascending; ``rank`` counts from 1. Scores are the stage-1 scores, float32, written with 9
significant digits (which round-trips float32 exactly).

The paper's own evaluation candidates are on the Hugging Face hub (datasets
``NeuralPGRank/<dataset>-hard-negatives``, files ``<dataset>_candidate-set_gtrxl+gt_1000_<split>.json``):
records ``{"qid": ..., "topk": {doc_id: score or null}}``, either as one JSON list or one record
per line (both are read). A ``null`` score (documents without a gtr-t5-xl score, i.e. the injected
ground truth) becomes a score below every real score of that query, the nulls keeping the file's
order: ``min(real scores, 0 if none) - 1 - j`` for the j-th null.

Example:
    >>> write_candidates("runs/x/candidates/scifact/test.trec", {"q1": [("d1", 2.5), ("d7", 1.0)]}, "bm25")
    >>> read_candidates("runs/x/candidates/scifact/test.trec")
    {'q1': {'d1': 2.5, 'd7': 1.0}}
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator, Mapping, Sequence
from pathlib import Path

import numpy as np

from pgrank.atomic import atomic_path
from pgrank.errors import DataError

PUBLISHED_REPO = "NeuralPGRank/{dataset}-hard-negatives"
PUBLISHED_FILE = "{dataset}_candidate-set_gtrxl+gt_1000_{split}.json"
PUBLISHED_SPLITS = ("dev", "test")

Ranked = Sequence[tuple[str, float]]


def ranked(scores: Mapping[str, float]) -> list[tuple[str, float]]:
    """A candidate set in file order: float32 score descending, then document id ascending."""
    items = [(doc, float(np.float32(s))) for doc, s in scores.items()]
    return sorted(items, key=lambda item: (-item[1], item[0]))


def _check_id(kind: str, value: str, path: Path) -> None:
    if not value or any(c.isspace() for c in value):
        raise DataError(f"{path}: {kind} {value!r} is empty or contains whitespace; a TREC run cannot hold it")


def write_candidates(path: str | Path, sets: Mapping[str, Ranked] | Iterable[tuple[str, Ranked]], source: str) -> None:
    """Write candidate sets as a TREC run, atomically.

    Args:
        path: the output file.
        sets: ``{qid: [(doc_id, score), ...]}`` (written in sorted qid order), or ``(qid, ranked)``
            pairs written as they come (a generator streams a large split to disk); each list
            already in rank order (see :func:`ranked`).
        source: the stage-1 source, written as the run tag ``pgrank-<source>``.

    Raises:
        DataError: an id with whitespace, or a query given twice; nothing is left behind.
    """
    path = Path(path)
    tag = f"pgrank-{source}"
    items = ((q, sets[q]) for q in sorted(sets)) if isinstance(sets, Mapping) else sets
    seen: set[str] = set()
    with atomic_path(path) as tmp, open(tmp, "w", encoding="utf-8", newline="\n") as fh:
        for qid, docs in items:
            _check_id("query id", qid, path)
            if qid in seen:
                raise DataError(f"{path}: query {qid!r} given twice")
            seen.add(qid)
            lines = []
            for rank, (doc, score) in enumerate(docs, start=1):
                _check_id("document id", doc, path)
                lines.append(f"{qid} Q0 {doc} {rank} {float(score):.9g} {tag}\n")
            fh.writelines(lines)


def iter_candidates(path: str | Path) -> Iterator[tuple[str, dict[str, float]]]:
    """Stream a candidate file query by query: ``(qid, {doc_id: score})`` in rank order.

    Memory holds one query's set at a time (MS MARCO train has 500k of them).

    Raises:
        DataError: a malformed line, a repeated document, or a query whose lines are not
            contiguous, naming the file and line.
    """
    path = Path(path)
    if not path.is_file():
        raise DataError(f"{path}: no candidate file; run `pgrank mine` first")
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


def read_candidates(path: str | Path) -> dict[str, dict[str, float]]:
    """Read a whole candidate file as a BEIR run ``{qid: {doc_id: score}}`` (rank order kept)."""
    return dict(iter_candidates(path))


# --------------------------------------------------------------------------------------- published


def _published_records(path: Path) -> Iterator[tuple[str, object]]:
    """Yield ``(where, record)`` from a JSON list or a JSON-lines file."""
    with open(path, encoding="utf-8") as fh:
        head = fh.read(4096).lstrip()
        fh.seek(0)
        if head.startswith("["):
            try:
                records = json.load(fh)
            except json.JSONDecodeError as exc:
                raise DataError(f"{path}:{exc.lineno}: not valid JSON ({exc.msg})") from None
            for i, record in enumerate(records):
                yield f"{path}: record {i + 1}", record
            return
        for line_no, line in enumerate(fh, start=1):
            if not line.strip():
                continue
            try:
                yield f"{path}:{line_no}", json.loads(line)
            except json.JSONDecodeError as exc:
                raise DataError(f"{path}:{line_no}: not valid JSON ({exc.msg})") from None


def read_published(path: str | Path) -> dict[str, list[tuple[str, float]]]:
    """Convert one of the authors' candidate files into ranked candidate sets.

    Returns:
        ``{qid: [(doc_id, score), ...]}`` in rank order: real scores first (descending, ties by id),
        then the ``null``-scored documents in the file's order (see the module docstring).

    Raises:
        DataError: a malformed record or a repeated query, naming the file and line (or record).
    """
    path = Path(path)
    if not path.is_file():
        raise DataError(f"{path}: no such file")
    out: dict[str, list[tuple[str, float]]] = {}
    for where, record in _published_records(path):
        if not isinstance(record, dict) or "qid" not in record or not isinstance(record.get("topk"), dict):
            raise DataError(f"{where}: expected {{\"qid\": ..., \"topk\": {{doc_id: score or null}}}}")
        qid = str(record["qid"])
        if qid in out:
            raise DataError(f"{where}: query {qid!r} appears twice")
        real, nulls = {}, []
        for doc, score in record["topk"].items():
            if score is None:
                nulls.append(str(doc))
            elif isinstance(score, (int, float)) and not isinstance(score, bool) and np.isfinite(score):
                real[str(doc)] = score
            else:
                raise DataError(f"{where}: query {qid!r}, document {doc!r}: score {score!r} is not a number or null")
        ordered = ranked(real)
        floor = min((s for _, s in ordered), default=0.0) - 1.0
        out[qid] = ordered + [(doc, float(np.float32(floor - j))) for j, doc in enumerate(nulls)]
    if not out:
        raise DataError(f"{path}: no records")
    return out


def fetch_published(dataset: str, split: str, folder: str | None) -> Path:
    """Locate the authors' candidate file: in ``folder`` (``mine.published_dir``) or on the hub.

    Raises:
        DataError: a split the authors did not publish, or the file cannot be found or downloaded.
    """
    if split not in PUBLISHED_SPLITS:
        raise DataError(
            f"{dataset}/{split}: the authors published candidate sets for the {' and '.join(PUBLISHED_SPLITS)} "
            "splits only; mine this split with mine.source=dense or bm25"
        )
    name = PUBLISHED_FILE.format(dataset=dataset, split=split)
    if folder is not None:
        path = Path(folder).expanduser() / name
        if not path.is_file():
            raise DataError(f"{path}: no such file (mine.published_dir); download it from "
                            f"https://huggingface.co/datasets/{PUBLISHED_REPO.format(dataset=dataset)}")
        return path
    from huggingface_hub import hf_hub_download

    repo = PUBLISHED_REPO.format(dataset=dataset)
    try:
        return Path(hf_hub_download(repo_id=repo, filename=name, repo_type="dataset"))
    except Exception as exc:  # network, missing repo or file: all are the user's to fix
        raise DataError(f"cannot download {name} from the Hugging Face dataset {repo}: {exc}; "
                        "or set mine.published_dir to a folder holding it") from None
