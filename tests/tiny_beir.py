"""A small BEIR folder written by hand (CRLF qrels, graded scores, queries of several splits) and a
configuration around it, shared by the tests of reading BEIR folders and of the carve-out."""

from __future__ import annotations

from pathlib import Path

from pgrank.config import parse_params
from pgrank.paths import Paths


def data_config(train: str = "tiny/train", size: int = 2, seed: int = 13):
    return parse_params({
        "paths": {"root": "runs", "data": "data", "embeddings": "emb"},
        "data": {"train": train, "validation_size": size, "validation_seed": seed, "eval_sets": ["tiny/test"]},
        "train": {"warm_starts": ["sbert"]},
        "evaluate": {"systems": {"bm25": ["bm25"], "dense": ["sbert"]}},
    })


# A small BEIR folder written by hand: CRLF qrels, graded scores, queries of several splits.
CORPUS = [
    '{"_id": "d1", "title": "Aspirin", "text": "Aspirin reduces fever."}',
    '{"_id": "d2", "title": "", "text": "Caf\\u00e9 culture."}',
    '{"_id": "d3", "title": "Sleep", "text": "Sleep improves memory.", "metadata": {"year": 2020}}',
    '{"_id": "d4", "title": "Tea", "text": "Green tea."}',
]
QUERIES = [f'{{"_id": "q{i}", "text": "query {i}"}}' for i in range(1, 8)]
TEST = [("q1", "d1", 2), ("q1", "d3", 1), ("q2", "d3", 0), ("q3", "d2", 1)]
TRAIN = [("q4", "d1", 1), ("q5", "d2", 1), ("q6", "d3", 1), ("q6", "d4", 1), ("q7", "d4", 1), ("q3", "d4", 1)]


def write_tiny(paths: Paths, corpus=CORPUS, queries=QUERIES, test=TEST, train=TRAIN) -> Path:
    folder = paths.dataset("tiny")
    (folder / "qrels").mkdir(parents=True)
    (folder / "corpus.jsonl").write_text("".join(line + "\n" for line in corpus), encoding="utf-8")
    (folder / "queries.jsonl").write_text("".join(line + "\n" for line in queries), encoding="utf-8")
    for split, rows in (("test", test), ("train", train)):
        text = "query-id\tcorpus-id\tscore\r\n" + "".join("\t".join(map(str, row)) + "\r\n" for row in rows)
        (folder / "qrels" / f"{split}.tsv").write_bytes(text.encode())
    return folder


