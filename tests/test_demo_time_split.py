"""``bench/demo_time.py``'s split of the demo's wall: encoding (from the corpus-embedding artifacts a run built),
training, and everything else."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import pytest
from script_modules import load_script

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def demo_time():
    sys.path.insert(0, str(ROOT / "bench"))
    try:
        yield load_script(ROOT / "bench" / "demo_time.py", "_split_demo_time")
    finally:
        sys.path.remove(str(ROOT / "bench"))


def _artifact(embeddings: Path, name: str, sha: str, documents: int, started: float, seconds: float | None) -> None:
    folder = embeddings / name
    folder.mkdir(parents=True)
    plan = folder / "plan.json"
    plan.write_text(json.dumps({"corpus_sha256": sha, "num_docs": documents, "max_seq_length": 8}))
    os.utime(plan, (started, started))
    if seconds is not None:  # an artifact still encoding has no meta.json
        meta = folder / "meta.json"
        meta.write_text("{}")
        os.utime(meta, (started + seconds, started + seconds))


def test_encoding_is_the_time_of_every_complete_artifact_and_its_arithmetic_comes_from_its_documents(tmp_path, demo_time):
    root, data, embeddings = tmp_path / "root", tmp_path / "data", tmp_path / "embeddings"
    (root / "datasets").mkdir(parents=True)
    for name, sha, texts in [("alpha", "a" * 64, ["one two three", "four"]), ("beta", "b" * 64, ["five six"])]:
        (data / name).mkdir(parents=True)
        with (data / name / "corpus.jsonl").open("w") as f:
            for i, text in enumerate(texts):
                f.write(json.dumps({"_id": str(i), "title": "t" if i == 0 else "", "text": text}) + "\n")
        (root / "datasets" / f"{name}.json").write_text(json.dumps({"dataset": name, "files": {"corpus.jsonl": sha}}))
    _artifact(embeddings, "m--L8--aaaa", "a" * 64, 2, 1000.0, 30.0)
    _artifact(embeddings, "m--L8--bbbb", "b" * 64, 1, 2000.0, 12.5)
    _artifact(embeddings, "m--L8--cccc", "c" * 64, 5, 3000.0, None)

    artifacts = demo_time.artifact_seconds(embeddings)
    assert [(a["folder"], a["documents"], a["seconds"]) for a in artifacts] == [("m--L8--aaaa", 2, 30.0),
                                                                             ("m--L8--bbbb", 1, 12.5)]
    corpora = demo_time.corpus_files(root, data)
    assert corpora == {"a" * 64: data / "alpha" / "corpus.jsonl", "b" * 64: data / "beta" / "corpus.jsonl"}
    assert demo_time.document_texts(corpora["a" * 64]) == ["t one two three", "four"]  # title and text, as encoded

    def words(texts, max_length):
        return sum(min(len(t.split()), max_length) for t in texts)

    work = demo_time.encoding_work(artifacts, corpora, words, flops_per_token=1e9)
    assert work == {"artifacts": 2, "seconds": 42.5, "documents": 3, "tokens": 8, "flops": 8e9}  # "t five six": 3


def test_the_wall_splits_into_encoding_training_and_everything_else_and_renders_each_run(demo_time):
    split = demo_time.split_wall(600.0, 150.0, {"seconds": 360.0, "peak_share": 0.81})
    assert split == {"encoding_s": 360.0, "encoding_peak_share": 0.81, "training_s": 150.0, "else_s": 90.0,
                     "else_share": 0.15}
    record = {"runs": [{"rev": "HEAD", "commit": "b" * 40, "repeat": 1, "seconds": 600.0, "training": 150.0,
                        "split": split}],
              "revisions": [{"rev": "HEAD", "runs": 1, "mean_seconds": 600.0}]}
    text = demo_time.render(record)
    assert "| HEAD | 1 | 360 | 81.0% | 150 | 90 | 15.0% |" in text
    old = {**record, "runs": [{k: v for k, v in record["runs"][0].items() if k != "split"}]}
    assert "everything else" not in demo_time.render(old)  # a record from before the split renders as it did
