"""Scheduled retraining on a dataset of your own that grows: real MiniLM, real scifact data (``-m slow``).

The user's folder ``sci`` is real scifact (its whole corpus, 100 test queries) with a training split
that grows between three runs of the retraining flow (against a real Prefect server). Its queries are carved
into three disjoint sets: 300 gate queries (``data.gate_size``: with 100, a +0.043 gain had p = 0.089),
50 validation queries (selection) and the rest, trained on.

1. 360 training queries: the 300 of the gate split become the frozen gate set; the model trained on 10
   queries meets its warm start there (there is no champion yet, ``champion.first: gate``), and does not
   beat it: there is still no champion.
2. The other 449 training queries are appended. DVC re-runs the pipeline; the gate split stays the frozen
   set (``data.holdout``), apart from training and validation; the new model is trained on 459 queries,
   beats its warm start on the gate set with a significant gain, and is promoted: the first champion.
3. Noise is appended: 5 random documents judged relevant for every training query. Continual training
   from the champion on it gives a model that the gate rejects; the alias stays.

The decisions, with their gate tables, are printed (``-s``) and kept in ``$PGRANK_FIGURES`` if set.
"""

from __future__ import annotations

import json
import os
import random
import zipfile
from pathlib import Path

import pytest
from shrunk import project_copy

pytestmark = [pytest.mark.slow, pytest.mark.integration, pytest.mark.timeout(7200)]

FIRST, GATE, VALIDATION, TEST = 360, 300, 50, 100


def _rows(text: str) -> list[list[str]]:
    return [r.split("\t") for r in text.splitlines()[1:] if r.strip()]


def _qrels(rows) -> str:
    return "query-id\tcorpus-id\tscore\n" + "".join("\t".join(map(str, r)) + "\n" for r in rows)


def write_source(scifact_zip: Path, folder: Path) -> tuple[list[list[str]], list[str]]:
    """The ``sci`` folder with the first training queries; returns (the remaining train rows, corpus ids)."""
    with zipfile.ZipFile(scifact_zip) as zf:
        read = lambda name: zf.read(f"scifact/{name}").decode("utf-8")  # noqa: E731
        corpus = [json.loads(line) for line in read("corpus.jsonl").splitlines() if line.strip()]
        queries, train, test = read("queries.jsonl"), _rows(read("qrels/train.tsv")), _rows(read("qrels/test.tsv"))
    test_qids = sorted({r[0] for r in test})[:TEST]
    test = [r for r in test if r[0] in set(test_qids)]
    first_qids = set(sorted({r[0] for r in train})[:FIRST])
    (folder / "qrels").mkdir(parents=True)
    (folder / "corpus.jsonl").write_text("".join(json.dumps(d) + "\n" for d in corpus))
    (folder / "queries.jsonl").write_text(queries)
    (folder / "qrels" / "test.tsv").write_text(_qrels(test))
    (folder / "qrels" / "train.tsv").write_text(_qrels([r for r in train if r[0] in first_qids]))
    return [r for r in train if r[0] not in first_qids], sorted(d["_id"] for d in corpus)


def test_new_judgments_promote_a_better_model_and_noise_keeps_the_champion(prefect_server, beir_mirror, tmp_path,
                                                                            monkeypatch):
    from mlflow.tracking import MlflowClient

    from flows.retraining import pgrank_retrain
    from pgrank.data.beir import load_qrels

    project = project_copy(tmp_path / "project")
    source = tmp_path / "sci-beir"
    rest, corpus_ids = write_source(beir_mirror / "scifact.zip", source)
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    monkeypatch.delenv("PGRANK_BEIR_MIRROR", raising=False)
    overrides = [f"data.sources={{sci: {{path: {source}}}}}", "data.train=sci/train", "data.eval_sets={sci: [test]}",
                 f"data.gate_size={GATE}", f"data.validation_size={VALIDATION}", "evaluate.policy_epochs=[]",
                 "train.validation_sets=[]", "train.selection={rule: last, patience: null}"]  # no nfcorpus here
    run = lambda start_from="warm_start": pgrank_retrain(  # noqa: E731  (one stage at a time: two cores)
        profile="demo", overrides=overrides, params_file=str(project / "params.yaml"), start_from=start_from,
        max_workers=1)
    ws = project / "runs" / "demo"
    client = MlflowClient(f"sqlite:///{ws / 'mlflow.db'}")
    figures = {}

    def report(name: str, decision) -> None:
        """Print a run's decision and keep it in $PGRANK_FIGURES as it comes (a failing run is reported too)."""
        figures[name] = decision.as_dict()
        print(f"\n== {name}: {decision.queries} gate queries, against {decision.baseline}\n{decision.message}")
        for row in decision.rows:
            print(f"  {row.metric}: baseline {row.champion}, challenger {row.challenger:.4f}, gain {row.gain}, "
                  f"p {row.p_value}")
        if os.environ.get("PGRANK_FIGURES"):
            Path(os.environ["PGRANK_FIGURES"]).write_text(json.dumps(figures, indent=2))

    carved = ws / "splits" / "sci" / "qrels"

    def splits() -> dict[str, set[str]]:
        return {name: set(load_qrels(carved / f"{name}.tsv")) for name in ("train", "validation", "gate")}

    first = run()
    report("1: first model, against its warm start", first)
    assert first.champion is None and first.queries == GATE and first.baseline.startswith("its warm start ")
    assert not first.promoted and first.message.startswith("no champion yet: version 1"), first.message
    gate_qids = splits()["gate"]
    assert len(gate_qids) == GATE
    seen = [splits()]

    with open(source / "qrels" / "train.tsv", "a") as fh:  # new judgments arrive
        fh.write("".join("\t".join(r) + "\n" for r in rest))
    second = run()
    report("2: new training queries", second)
    seen.append(splits())
    assert seen[-1]["gate"] == gate_qids  # the frozen gate split: held out of training and selection
    assert len(seen[-1]["train"]) == 809 - GATE - VALIDATION
    assert second.promoted and second.champion is None, second.message
    head = second.row("ndcg@10")
    assert head.gain > 0 and head.p_value < 0.05 and second.queries == GATE
    assert client.get_model_version_by_alias("pgrank-retriever", "champion").version == int(second.challenger)

    rng = random.Random(1)
    train_qids = sorted(seen[-1]["train"])
    with open(source / "qrels" / "train.tsv", "a") as fh:  # a batch of bad annotations
        fh.write("".join(f"{q}\t{d}\t1\n" for q in train_qids for d in rng.sample(corpus_ids, 5)))
    third = run(start_from="champion")
    report("3: noise, continual from the champion", third)
    seen.append(splits())
    assert not third.promoted and third.champion == second.challenger and third.baseline == "the champion", third.message
    assert third.challenger not in (None, second.challenger)
    assert client.get_model_version_by_alias("pgrank-retriever", "champion").version == int(second.challenger)
    warm = client.get_run(client.get_model_version("pgrank-retriever", third.challenger).run_id).data.params
    assert "registry" in warm["warm_start"]  # trained from the champion fetched from the registry
    for split in seen:  # in every run, the gate is disjoint from what was trained on and what selected
        assert split["gate"] == gate_qids and split["train"].isdisjoint(gate_qids)
        assert split["validation"].isdisjoint(gate_qids) and split["train"].isdisjoint(split["validation"])

