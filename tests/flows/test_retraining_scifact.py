"""Scheduled retraining on a dataset of your own that grows: real MiniLM, real scifact data (``-m slow``).

The user's folder ``sci`` is real scifact (its whole corpus, 100 test queries) with a training split
that grows between two runs of the retraining flow (against a real Prefect server). Its queries are carved
into three disjoint sets by the hash of their ids (:mod:`pgrank.download.carve_out`): 300 gate queries
(``data.gate_size``: with 100, a +0.043 gain had p = 0.089), 50 validation queries (selection) and the rest,
trained on.

1. 360 training queries: the 300 of the gate split become the frozen gate set, and the carve-out's bounds are
   frozen with it; the model trained on 10 queries meets its warm start there (there is no champion yet,
   ``champion.first: gate``), and does not beat it: there is still no champion.
2. The other 449 training queries are appended. DVC re-runs the pipeline; no query of the first run moves
   between splits, and each new query lands by its own hash: in training, in validation, or in the gate
   split's reserve (held out of both, for a refreshed gate set). The new model meets its warm start on the
   same 300 gate queries.

The decisions, with their gate tables, are printed (``-s``) and kept in ``$PGRANK_FIGURES`` if set.
"""

from __future__ import annotations

import json
import os
import sys
import zipfile
from pathlib import Path

import pytest
from shrunk import project_copy

pytestmark = [pytest.mark.slow, pytest.mark.integration, pytest.mark.timeout(7200)]

FIRST, GATE, VALIDATION, TEST = 360, 300, 50, 100


def decisions_table(figures: dict) -> str:
    """The record's Markdown: one row per run's decision on the gate's metric."""
    lines = ["| run | gate queries | challenger | baseline | gain | one-sided p | level | decision |",
             "| --- | ---: | ---: | ---: | ---: | ---: | ---: | --- |"]
    for name, d in figures.items():
        head = d["rows"][0] if d["rows"] else None
        cells = [f"{head['challenger']:.4f}", f"{head['champion']:.4f}", f"{head['gain']:+.4f}",
                 f"{head['p_value']:.2g}"] if head and head["champion"] is not None else ["", "", "", ""]
        level = "" if d["alpha"] is None else f"{d['alpha']:.3g}"
        lines.append(f"| {name} | {d['queries']} | " + " | ".join(cells) + f" | {level} | {d['message']} |")
    return "\n".join(lines)


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


def test_new_judgments_land_by_their_hash_and_the_frozen_gate_set_holds(prefect_server, beir_mirror, tmp_path,
                                                                        monkeypatch):
    from flows.retraining import pgrank_retrain
    from pgrank.data.beir import load_qrels
    from pgrank.download.carve_out import position

    project = project_copy(tmp_path / "project")
    source = tmp_path / "sci-beir"
    rest, _ = write_source(beir_mirror / "scifact.zip", source)
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    monkeypatch.delenv("PGRANK_BEIR_MIRROR", raising=False)
    overrides = [f"data.sources={{sci: {{path: {source}}}}}", "data.train=sci/train", "data.eval_sets={sci: [test]}",
                 f"data.gate_size={GATE}", f"data.validation_size={VALIDATION}", "evaluate.policy_epochs=[]",
                 "train.validation_sets=[]", "train.selection={rule: last, patience: null}"]  # no nfcorpus here
    run = lambda start_from="warm_start": pgrank_retrain(  # noqa: E731  (one stage at a time: two cores)
        profile="demo", overrides=overrides, params_file=str(project / "params.yaml"), start_from=start_from,
        max_workers=1)
    ws = project / "runs" / "demo"
    figures = {}

    def report(name: str, decision) -> None:
        """Print a run's decision and keep it in $PGRANK_FIGURES as it comes (a failing run is reported too)."""
        figures[name] = decision.as_dict()
        print(f"\n== {name}: {decision.queries} gate queries, against {decision.baseline}\n{decision.message}")
        for row in decision.rows:
            print(f"  {row.metric}: baseline {row.champion}, challenger {row.challenger:.4f}, gain {row.gain}, "
                  f"p {row.p_value}")
        if os.environ.get("PGRANK_FIGURES"):  # a bench/out-style record: the command, the machine, the decisions
            sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))
            from record import machine_record

            record = {"command": "PGRANK_FIGURES=F python -m pytest -m slow -n 0 -s tests/flows/test_retraining_scifact.py",
                      "title": "Scheduled retraining on a growing scifact folder: the champion gate's decisions",
                      "machine": machine_record(), "decisions": figures, "markdown": decisions_table(figures)}
            Path(os.environ["PGRANK_FIGURES"]).write_text(json.dumps(record, indent=2))

    carved = ws / "splits" / "sci" / "qrels"

    def splits() -> dict[str, set[str]]:
        return {name: set(load_qrels(carved / f"{name}.tsv")) for name in ("train", "validation", "gate")}

    first = run()
    report("1: first model, against its warm start", first)
    assert first.champion is None and first.queries == GATE and first.baseline.startswith("its warm start ")
    assert not first.promoted and first.message.startswith("no champion yet: version 1"), first.message
    before = splits()
    gate_qids = before["gate"]
    assert len(gate_qids) == GATE and len(before["validation"]) == VALIDATION and len(before["train"]) == FIRST - 350
    bounds = json.loads((ws / "splits" / "sci" / "carve.json").read_text())

    with open(source / "qrels" / "train.tsv", "a") as fh:  # new judgments arrive
        fh.write("".join("\t".join(r) + "\n" for r in rest))
    second = run()
    report("2: new training queries", second)
    after = splits()
    for name in ("train", "validation", "gate"):  # no query of the first run moved
        assert before[name] <= after[name], name
    assert after["gate"] >= gate_qids  # the frozen gate set, and the reserve: held out of training and selection
    assert after["train"].isdisjoint(gate_qids) and after["validation"].isdisjoint(gate_qids)
    assert after["train"].isdisjoint(after["validation"])
    new = {r[0] for r in rest}
    seed = bounds["seed"]
    for qid in new:  # each new query by its own place
        u = position(seed, qid)
        where = "train" if u >= bounds["validation_below"] else "validation" if u >= bounds["gate_below"] else None
        if where is None:  # the gate reserve
            assert qid in after["gate"] and qid not in after["train"] and qid not in after["validation"], qid
        else:
            assert qid in after[where], (qid, where)
    assert second.queries == GATE and second.challenger not in (None, first.challenger), second.message
