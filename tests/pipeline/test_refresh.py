"""A gate set that is refreshed from newly judged queries, on a real sqlite MLflow registry and a BEIR folder
written by hand: freezing records the carve-out's bounds, so judgments that arrive later keep every query in its
split and fill the gate reserve; a refresh freezes a fresh set from the reserve and returns the old one to training;
too few new queries is an error that says how many exist and changes nothing."""

from __future__ import annotations

import json
import shutil

import numpy as np
import pytest
from mlflow_registry import register
from tiny_beir import CORPUS, write_tiny

from pgrank.config import parse_params
from pgrank.data.beir import load_qrels
from pgrank.data.candidate_store import CandidateStoreWriter, open_candidate_store
from pgrank.data.corpus_store import open_corpus
from pgrank.errors import PgrankError
from pgrank.paths import GATE, Paths
from pgrank.pipeline import gate
from pgrank.pipeline.decisions import Record
from pgrank.pipeline.refresh import due, refresh_gate_set, refreshed, reserve

mlflow = pytest.importorskip("mlflow")

MODEL = "pgrank-refresh"


def _judged(n: int, prefix: str = "t") -> tuple[list[str], list[tuple]]:
    queries = [f'{{"_id": "{prefix}{i}", "text": "question {prefix}{i}"}}' for i in range(n)]
    return queries, [(f"{prefix}{i}", f"d{1 + i % 4}", 1) for i in range(n)]


def _write(paths: Paths, queries, train) -> None:
    shutil.rmtree(paths.dataset("tiny"), ignore_errors=True)
    write_tiny(paths, CORPUS, queries, [("t0", "d1", 1)], train)


def _mine_gate_split(paths: Paths) -> None:
    """The gate split's candidate sets (every document, as mine-train would write them for the toy corpus)."""
    corpus = open_corpus(paths, "tiny")
    qrels = load_qrels(paths.carved_qrels("tiny", "gate"))
    folder = paths.candidate_store("tiny", GATE)
    shutil.rmtree(folder, ignore_errors=True)
    with CandidateStoreWriter(folder, {"dataset": "tiny", "split": GATE, "corpus_sha256": corpus.sha256}) as out:
        for qid in sorted(qrels):
            rows = np.arange(len(corpus.ids), dtype=np.int64)
            out.add(qid, f"question {qid}", rows, np.array([qrels[qid].get(d, 0) for d in corpus.ids.take(rows)]))


def _splits(paths: Paths) -> dict[str, str]:
    return {q: split for split in ("train", "validation", "gate") for q in load_qrels(paths.carved_qrels("tiny", split))}


@pytest.fixture
def project(tmp_path, monkeypatch):
    from mlflow.tracking import MlflowClient

    from pgrank.download.carve_out import write_carve_out

    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    params = parse_params({"paths": {"root": "runs", "data": "data", "embeddings": "emb"},
                           "data": {"train": "tiny/train", "eval_sets": ["tiny/test"], "validation_size": 6,
                                    "gate_size": 5},
                           "train": {"warm_starts": ["m"]}, "evaluate": {"systems": {"dense": ["m"]}},
                           "tracking": {"uri": uri, "registered_model": MODEL}})
    paths = Paths.from_config(params.paths, base=tmp_path)
    from pgrank import tracking

    tracking.configure(params, paths)  # this store and its experiment, as freezing uses them
    client = MlflowClient(uri)
    register(None, MODEL)  # in the experiment configure set
    _write(paths, *_judged(30))
    write_carve_out(paths, params.data)
    _mine_gate_split(paths)
    yield params, paths, client
    mlflow.set_tracking_uri(None)


def test_new_judgments_keep_every_split_and_a_refresh_retires_the_old_gate_set(project):
    from pgrank.download.carve_out import write_carve_out

    params, paths, client = project
    first = gate.freeze_gate_set(client, params, paths, parent_run_id=None)
    meta = json.loads((first.documents / "gate.json").read_text())
    assert meta["carve"]["seed"] == params.data.validation_seed and meta["retired"] == []
    held = params.data.model_copy(update={"holdout": str(first.holdout)})
    before = _splits(paths)

    with pytest.raises(PgrankError, match=r"needs data.gate_size=5 newly judged queries of tiny/train below the gate "
                                          r"bound, and 0 exist"):
        refresh_gate_set(client, params, paths, first, None)
    assert gate.frozen_run(client, params) == first.documents.name  # nothing changed

    # 90 more judged queries arrive: no old query moves, and those below the gate bound are the reserve
    queries, train = _judged(30)
    more_queries, more_train = _judged(90, prefix="n")
    _write(paths, queries + more_queries, train + more_train)
    write_carve_out(paths, held)
    grown = _splits(paths)
    assert {q: grown[q] for q in before} == before
    fresh = reserve(params, paths, first)
    assert len(fresh) >= params.data.gate_size and all(q.startswith("n") and grown[q] == "gate" for q in fresh)

    _mine_gate_split(paths)
    second = refresh_gate_set(client, params, paths, first, None)
    assert gate.frozen_run(client, params) == second.documents.name != first.documents.name
    assert set(second.qrels) == set(fresh[:params.data.gate_size]) and set(second.qrels).isdisjoint(first.qrels)
    assert list(open_candidate_store(second.candidates).qids) == sorted(second.qrels)
    second_meta = json.loads((second.documents / "gate.json").read_text())
    assert second_meta["retired"] == sorted(first.qrels) and second_meta["carve"] == meta["carve"]

    # the next carve-out: the old set trains, the new set is the gate, nothing else moves
    write_carve_out(paths, params.data.model_copy(update={"holdout": str(second.holdout)}))
    after = _splits(paths)
    assert all(after[q] == "train" for q in first.qrels) and all(after[q] == "gate" for q in second.qrels)
    assert {q: after[q] for q in grown if q not in first.qrels} == {q: grown[q] for q in grown if q not in first.qrels}


def test_a_refresh_is_due_after_a_promotion_and_waits_for_new_judgments(project, caplog):
    params, paths, client = project
    first = gate.freeze_gate_set(client, params, paths, parent_run_id=None)
    kept = Record(1, "keep", {"challenger": "2", "champion": "1"}, first.documents.name)
    promoted = Record(2, "promote", {"challenger": "3", "champion": "1"}, first.documents.name)
    assert due(params, []) is None and due(params, [kept]) is None
    assert due(params, [kept, promoted]) == "its last decision promoted version 3"
    with caplog.at_level("WARNING", logger="pgrank.pipeline.refresh"):
        same, note = refreshed(client, params, paths, first, [kept, promoted], None)
    assert same is first and note == ("the gate set is due for a refresh (its last decision promoted version 3), but "
                                      "only 0 of the 5 newly judged queries it needs exist; decision 3 is made on the "
                                      "same set") and note in caplog.text
    if "refresh_after" in type(params.champion).model_fields:
        counted = params.model_copy(update={"champion": params.champion.model_copy(update={"refresh_after": 2})})
        assert due(counted, [kept, kept]) == "it has made 2 decisions (champion.refresh_after=2)"
