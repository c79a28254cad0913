"""The authors' published candidate sets (``mine.source: published``), converted to runs.

The paper's own evaluation candidates are on the Hugging Face hub (datasets
``NeuralPGRank/<dataset>-hard-negatives``, files ``<dataset>_candidate-set_gtrxl+gt_1000_<split>.json``):
records ``{"qid": ..., "topk": {doc_id: score or null}}``, either as one JSON list or one record
per line (both are read). A ``null`` score (documents without a gtr-t5-xl score, i.e. the injected
ground truth) becomes a score below every real score of that query, the nulls keeping the file's
order: ``min(real scores, 0 if none) - 1 - j`` for the j-th null.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import numpy as np

from pgrank.data.runs import ranked
from pgrank.errors import DataError

PUBLISHED_REPO = "NeuralPGRank/{dataset}-hard-negatives"
PUBLISHED_FILE = "{dataset}_candidate-set_gtrxl+gt_1000_{split}.json"
PUBLISHED_SPLITS = ("dev", "test")


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
