"""The champion gate: the rule, the registry, the gate set and side-by-side evaluation, continual training.

* :func:`decide` on per-query values (a pure function): promotion needs a gain over ``min_gain`` and a
  paired test with ``p < alpha``.
* The registry on a real sqlite MLflow store: which versions a pipeline run registered, the alias,
  the decision as version tag, run tags, metrics and artifacts.
* The gate on the toy project with the tiny in-code BERT, trained and registered for real: the gate
  set frozen into MLflow and fetched back, versions fetched from the registry and evaluated side by
  side, and continual training from a registered ``tower: query`` version.

The acceptance test on real MiniLM and real scifact data (new judgments promote, noise does not) is in
``tests/flows/test_retraining_scifact.py`` (``-m slow``).
"""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import numpy as np
import pytest
from toy_project import make_project

from pgrank.config import ChampionConfig
from pgrank.pipeline.champion import DECISION_TAG, apply, champion, decide, log_decision, versions_of_run

mlflow = pytest.importorskip("mlflow")

MODEL, ALIAS = "pgrank-retriever", "champion"


def per_query(values: list[float], metric: str = "ndcg@10") -> dict[str, dict[str, float]]:
    return {f"q{i}": {metric: v, "mrr@10": v} for i, v in enumerate(values)}


# --------------------------------------------------------------------------------------- the rule


def test_a_significant_gain_promotes_and_the_table_says_why():
    rng = np.random.default_rng(0)
    old = rng.uniform(0.2, 0.6, 60)
    new = old + 0.1 + rng.normal(0, 0.02, 60)
    decision = decide(per_query(list(new)), per_query(list(old)), ChampionConfig(), challenger="4", champion="3",
                      metrics=["ndcg@10", "mrr@10"], gate="frozen: 60 queries")
    assert decision.promoted and decision.queries == 60
    head = decision.row("ndcg@10")
    assert head.gain == pytest.approx(np.mean(new) - np.mean(old)) and head.p_value < 1e-10
    assert re.match(r"promoted version 4: ndcg@10 0\.\d{4} vs 0\.\d{4} \(\+0\.\d{4} > min_gain 0\), student p = "
                    r"\S+ < 0\.05$", decision.message)
    table = decision.markdown()
    assert "| **ndcg@10** |" in table and "| mrr@10 |" in table and "champion (v3)" in table and "challenger (v4)" in table
    assert "Gate set: frozen: 60 queries (60 queries)" in table


def test_no_gain_an_insignificant_gain_or_a_gain_below_the_margin_keeps_the_champion():
    rng = np.random.default_rng(1)
    old = rng.uniform(0.2, 0.6, 40)
    noisy = old + rng.normal(0.005, 0.2, 40)  # a small mean gain buried in noise
    kept = decide(per_query(list(noisy)), per_query(list(old)), ChampionConfig(), challenger="5", champion="4",
                  metrics=["ndcg@10"])
    gain = kept.row("ndcg@10").gain
    if gain > 0:
        assert not kept.promoted and "not significant" in kept.reason and kept.row("ndcg@10").p_value >= 0.05
    worse = decide(per_query(list(old - 0.01)), per_query(list(old)), ChampionConfig(), challenger="5", champion="4",
                   metrics=["ndcg@10"])
    assert not worse.promoted and "is not better" in worse.reason
    margin = ChampionConfig(min_gain=0.05, alpha=None)
    small = decide(per_query(list(old + 0.02)), per_query(list(old)), margin, challenger="5", champion="4",
                   metrics=["ndcg@10"])
    assert not small.promoted and "<= min_gain 0.05" in small.reason
    any_gain = decide(per_query(list(old + 0.02)), per_query(list(old)), ChampionConfig(alpha=None), challenger="5",
                      champion="4", metrics=["ndcg@10"])
    assert any_gain.promoted and " p = " not in any_gain.reason  # no significance asked for
    equal = decide(per_query(list(old)), per_query(list(old)), ChampionConfig(min_gain=0.0), challenger="5",
                   champion="4", metrics=["ndcg@10"])
    assert not equal.promoted and equal.row("ndcg@10").p_value == 1.0


def test_the_first_challenger_is_promoted_when_there_is_no_champion():
    decision = decide(per_query([0.5, 0.7]), None, ChampionConfig(metric="mrr@10"), challenger="1", champion=None,
                      metrics=["ndcg@10"])
    assert decision.promoted and decision.rows[0].metric == "mrr@10" and decision.rows[0].champion is None
    assert decision.message == "promoted version 1: there was no champion yet (mrr@10 0.6000 on the gate set)"


# --------------------------------------------------------------------------------------- the registry


class _Echo(mlflow.pyfunc.PythonModel):
    def predict(self, context, model_input: list[str], params=None) -> list[str]:
        return model_input


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    """A fresh sqlite MLflow store in tmp (created once: its migrations take seconds), artifacts in tmp too."""
    from mlflow.tracking import MlflowClient

    folder = tmp_path_factory.mktemp("mlflow")
    uri = f"sqlite:///{folder / 'mlflow.db'}"
    mlflow.set_tracking_uri(uri)
    client = MlflowClient(uri)
    experiment = client.create_experiment("pgrank", artifact_location=(folder / "artifacts").as_uri())
    yield client, experiment
    mlflow.set_tracking_uri(None)


def _register(client, experiment: str, model: str, parent: str | None = None) -> str:
    with mlflow.start_run(experiment_id=experiment, parent_run_id=parent, nested=parent is not None):
        info = mlflow.pyfunc.log_model(name="model", python_model=_Echo(), registered_model_name=model,
                                       pip_requirements=["mlflow"])
    return str(info.registered_model_version)


def test_the_registry_knows_a_runs_versions_and_moves_the_alias_only_on_promotion(store):
    client, experiment = store
    model = f"{MODEL}-registry"
    older = _register(client, experiment, model)  # not from this pipeline run: never a challenger here
    with mlflow.start_run(experiment_id=experiment) as parent:
        pass
    new = [_register(client, experiment, model, parent.info.run_id) for _ in range(2)]
    assert versions_of_run(client, model, parent.info.run_id) == new and older not in new
    assert champion(client, model, ALIAS) is None

    promoted = decide(per_query([0.5]), None, ChampionConfig(), challenger=new[0], champion=None, metrics=[])
    apply(client, model, ALIAS, promoted)
    assert champion(client, model, ALIAS) == new[0]
    kept = decide(per_query([0.4]), per_query([0.5]), ChampionConfig(), challenger=new[1], champion=new[0], metrics=[])
    apply(client, model, ALIAS, kept)
    assert champion(client, model, ALIAS) == new[0]
    assert client.get_model_version(model, new[1]).tags[DECISION_TAG].startswith(f"kept: version {new[1]} is not better")
    assert client.get_model_version(model, new[0]).tags[DECISION_TAG].startswith("promoted: there was no champion")


def test_the_decision_and_its_table_are_logged_to_mlflow(store, tmp_path):
    client, experiment = store
    from pgrank.config import parse_params
    from pgrank.paths import Paths

    params = parse_params({"paths": {"root": "r", "data": "d", "embeddings": "e"}, "data": {"train": "x/train",
                           "eval_sets": ["x/test"]}, "train": {"warm_starts": ["m"]}, "evaluate": {"systems": {"dense": ["m"]}},
                           "tracking": {"uri": client.tracking_uri}})
    with mlflow.start_run(experiment_id=experiment) as parent:
        pass
    decision = decide(per_query([0.9, 0.8, 0.85]), per_query([0.5, 0.4, 0.45]), ChampionConfig(), challenger="7",
                      champion="6", metrics=["ndcg@10", "mrr@10"], gate="frozen: 3 queries")
    run_id = log_decision(params, Paths.from_config(params.paths, base=tmp_path), decision,
                          parent_run_id=parent.info.run_id, per_query={"v7": per_query([0.9, 0.8, 0.85])})
    run = client.get_run(run_id)
    tags = run.data.tags
    assert tags["mlflow.parentRunId"] == parent.info.run_id and tags["stage"] == "gate"
    assert tags["pgrank.gate.decision"] == "promoted" and tags["pgrank.gate.challenger"] == "7"
    assert tags["pgrank.gate.reason"] == decision.reason and tags["pgrank.gate.metric"] == "ndcg@10"
    assert run.data.metrics["gate.challenger.ndcg_at_10"] == pytest.approx(0.85)
    assert run.data.metrics["gate.champion.ndcg_at_10"] == pytest.approx(0.45)
    assert run.data.metrics["gate.p.ndcg_at_10"] == pytest.approx(decision.row("ndcg@10").p_value)
    logged = {a.path for a in client.list_artifacts(run_id, "gate")}
    assert logged == {"gate/decision.md", "gate/decision.json", "gate/per_query.json"}
    text = Path(mlflow.artifacts.download_artifacts(run_id=run_id, artifact_path="gate/decision.md",
                                                    dst_path=str(tmp_path), tracking_uri=client.tracking_uri)).read_text()
    assert text == decision.markdown()


# --------------------------------------------------------------------------------------- the gate, for real


@pytest.fixture
def trained(tmp_path, tiny_model_dir, monkeypatch):
    """The toy project with tracking on, one tower:query policy trained and registered as version 1."""
    from mlflow.tracking import MlflowClient

    from pgrank.training.trainer import train

    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    params, paths = make_project(tmp_path, tiny_model_dir, overrides={
        "tracking.enabled": True, "train.epochs": 1, "train.keep_epochs": [1], "train.learning_rate": 5e-3,
        "evaluate.max_seq_length": 32})
    result = train(params, paths, str(tiny_model_dir), device="cpu", progress=False)
    mlflow.set_tracking_uri(paths.mlflow_uri())
    yield params, paths, MlflowClient(paths.mlflow_uri()), result
    mlflow.set_tracking_uri(None)


def test_versions_are_gated_side_by_side_on_a_frozen_gate_set_and_continual_training_keeps_the_documents(
        trained, tiny_model_dir, tmp_path):
    from pgrank.pipeline import gate
    from pgrank.training.trainer import train

    params, paths, client, first = trained
    name = params.tracking.registered_model
    v1 = gate.fetch_version(client, paths, name, first.registered_version)
    assert v1.document_model == str(tiny_model_dir)  # tower: query: documents through the frozen warm start
    assert json.loads((v1.folder / "pgrank.json").read_text())["tower"] == "query"

    frozen = gate.freeze_gate_set(client, params, paths, parent_run_id=None)
    assert len(frozen.queries) == params.data.validation_size == len(frozen.qrels) == len(frozen.candidates)
    assert gate.holdout_override(client, params, paths) == [f"data.holdout={frozen.holdout}"]
    shutil.rmtree(paths.root / "gate")  # fetched back from MLflow: the tag names the run that holds it
    again = gate.frozen_gate_set(client, params, paths)
    assert (again.queries, again.qrels, again.candidates) == (frozen.queries, frozen.qrels, frozen.candidates)

    artifacts = sorted(p.name for p in paths.embeddings.iterdir())
    first_values = gate.evaluate_version(params, paths, again, v1)
    assert set(first_values) == set(frozen.qrels)
    assert {"ndcg@10", "mrr@10", "recall@10"} <= set(next(iter(first_values.values())))

    # Continual: the registered version is the warm start; its query route trains, its documents stay.
    second = train(params, paths, str(v1.folder), device="cpu", progress=False)
    assert sorted(p.name for p in paths.embeddings.iterdir()) == artifacts  # no corpus re-encoded
    meta = json.loads((second.final / "pgrank.json").read_text())
    assert meta["document_encoder"] == json.loads((first.final / "pgrank.json").read_text())["document_encoder"]
    from sentence_transformers import SentenceTransformer

    pair, warm = SentenceTransformer(str(second.final), device="cpu"), SentenceTransformer(str(tiny_model_dir), device="cpu")
    texts = ["Coral Reef coral reef the data", "tax policy small analysis"]
    assert np.allclose(pair.encode_document(texts), warm.encode(texts), atol=1e-6)  # a flat pair, not nested
    assert not np.allclose(pair.encode_query(texts), v1_query(v1.folder, texts), atol=1e-5)  # trained further

    v2 = gate.fetch_version(client, paths, name, second.registered_version)
    assert v2.document_model == str(tiny_model_dir)
    second_values = gate.evaluate_version(params, paths, again, v2)
    metrics, _, _ = gate.gate_metrics(params)
    decision = decide(second_values, first_values, params.champion, challenger=v2.version, champion=v1.version,
                      metrics=metrics, gate=again.description)
    assert decision.queries == len(frozen.qrels) and [r.metric for r in decision.rows] == metrics
    assert decision.row("ndcg@10").champion == pytest.approx(np.mean([v["ndcg@10"] for v in first_values.values()]))


def test_the_gate_of_a_workspace_promotes_the_first_version_then_keeps_it_when_nothing_was_retrained(trained):
    """gate_workspace, as scheduled retraining runs it: with no champion yet, the version training registered
    (before any gated run) is the challenger and is promoted; a run that registered nothing keeps it."""
    import yaml

    from pgrank.pipeline.retraining import gate_workspace

    params, paths, client, first = trained
    ws = paths.root
    (ws / "params.yaml").write_text(yaml.safe_dump(params.model_dump(mode="json")))
    decision = gate_workspace(ws, None)
    assert decision.promoted and decision.challenger == first.registered_version and decision.champion is None
    assert champion(client, params.tracking.registered_model, params.tracking.champion_alias) == first.registered_version
    assert client.get_registered_model(params.tracking.registered_model).tags["pgrank.gate_set"]  # frozen on the way
    with mlflow.start_run() as parent:  # a later pipeline run that registered no version
        pass
    again = gate_workspace(ws, parent.info.run_id)
    assert not again.promoted and again.reason.startswith("nothing was retrained")
    assert again.champion == first.registered_version


def v1_query(folder: Path, texts: list[str]) -> np.ndarray:
    from sentence_transformers import SentenceTransformer

    return SentenceTransformer(str(folder), device="cpu").encode_query(texts)
