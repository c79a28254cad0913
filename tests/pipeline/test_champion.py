"""The champion gate: the rule, the registry, the gate set and side-by-side evaluation, continual training.

* :func:`decide` on per-query values (a pure function): promotion needs a gain over ``min_gain`` and a
  one-sided test of the mean gain with ``p < alpha`` (the betting test by default; under e-LOND its e-value of at
  least 1 / level); a rank test is refused.
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
from mlflow_registry import Echo, fresh_store, register
from toy_project import make_project

from pgrank.config import ChampionConfig
from pgrank.pipeline.champion import DECISION_TAG, champion, decide, log_decision, versions_of_run
from pgrank.pipeline.decisions import commit

mlflow = pytest.importorskip("mlflow")

MODEL, ALIAS = "pgrank-retriever", "champion"


def per_query(values: list[float], metric: str = "ndcg@10") -> dict[str, dict[str, float]]:
    return {f"q{i}": {metric: v, "mrr@10": v} for i, v in enumerate(values)}


# --------------------------------------------------------------------------------------- the rule


def test_a_significant_gain_promotes_and_the_table_says_why():
    rng = np.random.default_rng(0)
    old = rng.uniform(0.2, 0.6, 60)
    new = old + 0.1 + rng.normal(0, 0.02, 60)
    decision = decide(per_query(list(new)), per_query(list(old)), ChampionConfig(test="student"), challenger="4", champion="3",
                      metrics=["ndcg@10", "mrr@10"], gate="frozen: 60 queries")
    assert decision.promoted and decision.queries == 60
    head = decision.row("ndcg@10")
    assert head.gain == pytest.approx(np.mean(new) - np.mean(old)) and head.p_value < 1e-10
    assert re.match(r"promoted version 4: ndcg@10 0\.\d{4} vs 0\.\d{4} \(\+0\.\d{4} > min_gain 0\), student p = "
                    r"\S+ < level 0\.05$", decision.message)
    table = decision.markdown()
    assert "| **ndcg@10** |" in table and "| mrr@10 |" in table and "champion (v3)" in table and "challenger (v4)" in table
    assert "Gate set: frozen: 60 queries (60 queries)" in table


def keeps_what_it_should(rule) -> None:
    """What a gate rule must keep: no gain, a positive gain that is not significant, a gain within the margin."""
    rng = np.random.default_rng(1)
    old = rng.uniform(0.2, 0.6, 40)
    noisy = old + 0.005 + np.tile([0.2, -0.2], 20)  # a mean gain of exactly +0.005, buried in noise
    kept = rule(per_query(list(noisy)), per_query(list(old)), ChampionConfig(test="student"), challenger="5", champion="4",
                metrics=["ndcg@10"])
    head = kept.row("ndcg@10")
    assert head.gain == pytest.approx(0.005) and head.p_value > 0.25  # one-sided: about 0.44
    assert not kept.promoted and "not significant" in kept.reason and kept.message.startswith("kept the champion: ")
    worse = rule(per_query(list(old - 0.01)), per_query(list(old)), ChampionConfig(test="student"), challenger="5", champion="4",
                 metrics=["ndcg@10"])
    assert not worse.promoted and "is not better than the champion" in worse.reason
    margin = ChampionConfig(test="student", min_gain=0.05, alpha=None)
    small = rule(per_query(list(old + 0.02)), per_query(list(old)), margin, challenger="5", champion="4",
                 metrics=["ndcg@10"])
    assert not small.promoted and "<= min_gain 0.05" in small.reason
    equal = rule(per_query(list(old)), per_query(list(old)), ChampionConfig(test="student", min_gain=0.0), challenger="5",
                 champion="4", metrics=["ndcg@10"])
    assert not equal.promoted and equal.row("ndcg@10").p_value == 1.0


def test_no_gain_an_insignificant_gain_or_a_gain_below_the_margin_keeps_the_champion():
    keeps_what_it_should(decide)
    any_gain = decide(per_query(list(np.linspace(0.2, 0.6, 40) + 0.02)), per_query(list(np.linspace(0.2, 0.6, 40))),
                      ChampionConfig(test="student", alpha=None), challenger="5", champion="4", metrics=["ndcg@10"])
    assert any_gain.promoted and " p = " not in any_gain.reason  # no significance asked for


@pytest.mark.parametrize("mutant", ["significance ignored", "margin ignored", "any gain"])
def test_the_rule_test_fails_on_a_broken_rule(mutant):
    """Mutations of the rule that keeps_what_it_should catches: a rule that forgets alpha, min_gain or both."""
    forget = {"significance ignored": {"alpha": None}, "margin ignored": {"min_gain": -1.0},
              "any gain": {"alpha": None, "min_gain": -1.0}}[mutant]

    def broken(a, b, cfg, **kwargs):
        return decide(a, b, cfg.model_copy(update=forget), **kwargs)

    with pytest.raises(AssertionError):
        keeps_what_it_should(broken)


def test_with_no_champion_the_first_challenger_meets_its_warm_start_or_is_promoted_if_told():
    rng = np.random.default_rng(2)
    warm = rng.uniform(0.2, 0.6, 50)
    same = decide(per_query(list(warm + 0.003 + np.tile([0.1, -0.1], 25))), per_query(list(warm)), ChampionConfig(test="student"),
                  challenger="1", champion=None, metrics=["ndcg@10"], baseline="its warm start minilm")
    assert not same.promoted and same.message.startswith("no champion yet: version 1's gain over its warm start minilm "
                                                         "is not significant")
    assert "| metric | warm start minilm | challenger (v1) |" in same.markdown() and "**Not promoted**" in same.markdown()
    better = decide(per_query(list(warm + 0.05)), per_query(list(warm)), ChampionConfig(test="student"), challenger="1",
                    champion=None, metrics=["ndcg@10"], baseline="its warm start minilm")
    assert better.promoted and re.search(r"ndcg@10 0\.\d{4} vs its warm start minilm's 0\.\d{4} \(\+0\.0500 > min_gain 0\)",
                                         better.reason)
    told = decide(per_query([0.5, 0.7]), None, ChampionConfig(metric="mrr@10", first="promote"), challenger="1",
                  champion=None, metrics=["ndcg@10"])
    assert told.promoted and told.rows[0].metric == "mrr@10" and told.rows[0].champion is None
    assert told.message == ("promoted version 1: there was no champion yet and champion.first is promote (mrr@10 "
                            "0.6000 on the gate set)")


def test_several_challengers_are_compared_on_selection_and_only_the_chosen_one_is_in_the_table():
    decision = decide(per_query([0.9, 0.8]), per_query([0.5, 0.4]), ChampionConfig(test="student"), challenger="6", champion="3",
                      metrics=[], selection={"4": 0.61, "5": 0.60, "6": 0.63})
    assert "Challengers: v4 0.6100, v5 0.6000, v6 0.6300 (validation nDCG@10, the selection split); only the best, " \
           "version 6, meets the gate: one test per decision." in decision.markdown()


def test_a_worse_model_with_a_few_large_gains_is_not_promoted_and_a_rank_test_is_refused():
    """40 queries lose 0.02, 5 gain 0.25, 55 tie: the mean is up, but the one-sided test of the mean does not say
    better, and every row of the table is one-sided. A rank test cannot decide this claim about the mean."""
    old = np.full(100, 0.5)
    new = old + np.concatenate([np.full(40, -0.02), np.full(5, 0.25), np.zeros(55)])
    decision = decide(per_query(list(new)), per_query(list(old)), ChampionConfig(), challenger="7",
                      champion="6", metrics=["mrr@10"])
    assert decision.row("ndcg@10").gain > 0 and decision.row("ndcg@10").p_value > 0.05
    assert decision.row("mrr@10").p_value > 0.05 and not decision.promoted
    assert "one-sided p (betting)" in decision.markdown()
    for test in ("wilcoxon", "fisher"):
        with pytest.raises(ValueError, match="not a mean gain of 0"):
            ChampionConfig(test=test)


def test_the_default_betting_test_promotes_a_real_gain_and_names_its_e_value_under_elond():
    rng = np.random.default_rng(5)
    old = rng.uniform(0.2, 0.6, 1000)
    new = np.clip(old + rng.normal(0.03, 0.1, 1000), 0, 1)
    cfg = ChampionConfig(alpha=None, budget=0.05, horizon=52, budget_rule="elond")
    assert cfg.test == "betting"
    passed = decide(per_query(list(new)), per_query(list(old)), cfg, challenger="9", champion="8", metrics=[],
                    level=2 * 0.05 / 52, budget="decision 3 (elond, one promotion before)")
    assert passed.promoted and passed.e_value * passed.alpha >= 1
    assert re.search(r"betting e-value \S+ >= 1 / level 0\.00192", passed.reason), passed.reason
    noise = decide(per_query(list(np.clip(old + rng.normal(0.0, 0.1, 1000), 0, 1))), per_query(list(old)), cfg,
                   challenger="9", champion="8", metrics=[], level=0.05 / 52, budget="decision 1")
    assert not noise.promoted and "< 1 / level 0.000962" in noise.reason


def test_non_inferiority_promotes_a_slightly_worse_model_and_keeps_one_worse_by_more_than_the_margin():
    rng = np.random.default_rng(3)
    old = rng.uniform(0.2, 0.6, 200)
    cfg = ChampionConfig(test="student", margin=0.02)
    close = decide(per_query(list(old - 0.005 + rng.normal(0, 0.01, 200))), per_query(list(old)), cfg,
                   challenger="8", champion="7", metrics=[])
    assert close.promoted and close.row("ndcg@10").gain < 0 and close.row("ndcg@10").p_value < 1e-6
    assert "> -0.02, the margin)" in close.reason
    assert "worse than the champion's by more than the margin 0.02 (non-inferiority)" in close.markdown()
    far = decide(per_query(list(old - 0.03)), per_query(list(old)), cfg, challenger="8", champion="7", metrics=[])
    assert not far.promoted and "worse by more than champion.margin than the champion" in far.reason
    superiority = decide(per_query(list(old - 0.005)), per_query(list(old)), ChampionConfig(test="student"), challenger="8",
                         champion="7", metrics=[])
    assert not superiority.promoted


def test_with_an_error_budget_the_decision_runs_at_the_level_given_and_names_it():
    rng = np.random.default_rng(4)
    old = rng.uniform(0.2, 0.6, 60)
    new = old + 0.02 + rng.normal(0, 0.03, 60)  # one-sided student p about 1e-6
    cfg = ChampionConfig(test="student", alpha=None, budget=0.05, horizon=52)
    said = "decision 3 of the error budget 0.05 over 52 decisions (spending)"
    passed = decide(per_query(list(new)), per_query(list(old)), cfg, challenger="9", champion="8", metrics=[],
                    level=0.05 / 52, budget=said)
    assert passed.promoted and passed.alpha == pytest.approx(0.05 / 52)
    assert f"< level 0.000962 ({said})" in passed.reason and f"p < 0.000962, the level {said}" in passed.markdown()
    spent = decide(per_query(list(new)), per_query(list(old)), cfg, challenger="9", champion="8", metrics=[],
                   level=0.0, budget=said)
    assert not spent.promoted and spent.reason.endswith("the error budget is spent")
    with pytest.raises(ValueError, match="a level comes with champion.budget"):
        decide(per_query(list(new)), per_query(list(old)), cfg, challenger="9", champion="8", metrics=[])
    with pytest.raises(ValueError, match="a level comes with champion.budget"):
        decide(per_query(list(new)), per_query(list(old)), ChampionConfig(test="student"), challenger="9", champion="8", metrics=[],
               level=0.01)


# --------------------------------------------------------------------------------------- the registry


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    """A fresh sqlite MLflow store in tmp (created once: its migrations take seconds), artifacts in tmp too."""
    with fresh_store(tmp_path_factory.mktemp("mlflow")) as (client, experiment, _):
        yield client, experiment


def test_the_registry_knows_a_runs_versions_and_moves_the_alias_only_on_promotion(store):
    client, experiment = store
    model = f"{MODEL}-registry"
    older = register(experiment, model)  # not from this pipeline run: never a challenger here
    with mlflow.start_run(experiment_id=experiment) as parent:
        pass
    new = [register(experiment, model, parent.info.run_id) for _ in range(2)]
    assert versions_of_run(client, model, parent.info.run_id) == new and older not in new
    assert champion(client, model, ALIAS) is None

    promoted = decide(per_query([0.5]), None, ChampionConfig(), challenger=new[0], champion=None, metrics=[])
    commit(client, model, ALIAS, promoted)
    assert champion(client, model, ALIAS) == new[0]
    kept = decide(per_query([0.4]), per_query([0.5]), ChampionConfig(), challenger=new[1], champion=new[0], metrics=[])
    commit(client, model, ALIAS, kept)
    assert champion(client, model, ALIAS) == new[0]
    assert client.get_model_version(model, new[1]).tags[DECISION_TAG].startswith(f"kept: version {new[1]} is not better")
    assert client.get_model_version(model, new[0]).tags[DECISION_TAG].startswith("promoted: there was no champion")


def test_challengers_are_compared_by_the_validation_ndcg_their_training_logged(store):
    """selection_scores reads what the trainer logs: the selected epoch's in-domain nDCG@10, else the last epoch's."""
    from pgrank.errors import PgrankError
    from pgrank.pipeline.champion import selection_scores
    from pgrank.pipeline.retraining import challengers

    client, experiment = store
    model = f"{MODEL}-selection"
    with mlflow.start_run(experiment_id=experiment) as parent:
        pass
    logged = {}
    for metrics in ({"val_ndcg@10": [0.40, 0.52]}, {"val_ndcg@10": [0.40, 0.50], "selected_in_domain_ndcg@10": [0.55]},
                    {"val_ndcg@10": [0.40, 0.49]}):
        with mlflow.start_run(experiment_id=experiment, parent_run_id=parent.info.run_id, nested=True):
            for key, values in metrics.items():
                for step, value in enumerate(values):
                    mlflow.log_metric(key.replace("@", "_at_"), value, step=step)
            info = mlflow.pyfunc.log_model(name="model", python_model=Echo(), registered_model_name=model,
                                           pip_requirements=["mlflow"])
        logged[str(info.registered_model_version)] = metrics
    versions = versions_of_run(client, model, parent.info.run_id)
    scores = selection_scores(client, model, versions)
    assert scores == {versions[0]: 0.52, versions[1]: 0.55, versions[2]: 0.49}
    assert challengers(client, model, None, versions) == versions
    assert challengers(client, model, None, []) == [versions[-1]]  # no champion: the newest, never gated
    client.set_model_version_tag(model, versions[-1], DECISION_TAG, "not promoted: ...")
    assert challengers(client, model, None, []) == []  # gated already: nothing to judge again
    assert challengers(client, model, versions[0], []) == []
    older = register(experiment, model)  # registered with no validation metric
    with pytest.raises(PgrankError, match=f"version {older}: its training run logged no validation nDCG@10"):
        selection_scores(client, model, [*versions, older])


def test_the_decision_and_its_table_are_logged_to_mlflow(store, tmp_path):
    client, experiment = store
    from pgrank.config import parse_params
    from pgrank.paths import Paths

    params = parse_params({"paths": {"root": "r", "data": "d", "embeddings": "e"}, "data": {"train": "x/train",
                           "eval_sets": ["x/test"]}, "train": {"warm_starts": ["m"]}, "evaluate": {"systems": {"dense": ["m"]}},
                           "tracking": {"uri": client.tracking_uri}})
    with mlflow.start_run(experiment_id=experiment) as parent:
        pass
    decision = decide(per_query([0.9, 0.8, 0.85]), per_query([0.5, 0.4, 0.45]), ChampionConfig(test="student"),
                      challenger="7", champion="6", metrics=["ndcg@10", "mrr@10"], gate="frozen: 3 queries")
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


def test_a_gate_set_frozen_by_an_earlier_pgrank_is_converted_once_with_a_one_line_message(store, tmp_path, caplog):
    """The earlier format: frozen from the validation carve-out, its candidate sets as a TREC file."""
    from tiny_beir import write_tiny

    from pgrank.config import parse_params
    from pgrank.data.candidate_store import open_candidate_store
    from pgrank.data.columns import StringColumn
    from pgrank.paths import Paths
    from pgrank.pipeline import gate

    client, experiment = store
    model = f"{MODEL}-migrated"
    register(experiment, model)
    params = parse_params({"paths": {"root": "r", "data": "d", "embeddings": "e"},
                           "data": {"train": "tiny/train", "eval_sets": ["tiny/test"], "validation_size": 2},
                           "train": {"warm_starts": ["m"]}, "evaluate": {"systems": {"dense": ["m"]}},
                           "tracking": {"uri": client.tracking_uri, "registered_model": model}})
    paths = Paths.from_config(params.paths, base=tmp_path)
    write_tiny(paths)
    old = tmp_path / "old"
    old.mkdir()
    (old / "qrels.tsv").write_text("query-id\tcorpus-id\tscore\nq4\td1\t1\nq6\td3\t1\n")
    (old / "queries.jsonl").write_text('{"_id": "q4", "text": "query 4"}\n{"_id": "q6", "text": "query 6"}\n')
    (old / "candidates.trec").write_text("q4 Q0 d2 1 3.0 gate-set\nq4 Q0 d1 2 2.0 gate-set\nq4 Q0 gone 3 1.0 gate-set\n"
                                         "q6 Q0 d3 1 2.0 gate-set\nq6 Q0 d4 2 1.0 gate-set\n")
    (old / "gate.json").write_text(json.dumps({"dataset": "tiny", "queries": 2, "description": "frozen: 2 validation "
                                               "queries of tiny/train, frozen by run 0123abcd"}))
    with mlflow.start_run(experiment_id=experiment, run_name="gate-set") as run:
        mlflow.log_artifacts(str(old), gate.ARTIFACTS)
    client.set_registered_model_tag(model, gate.GATE_SET_TAG, run.info.run_id)

    with caplog.at_level("WARNING", logger="pgrank.pipeline.gate"):
        converted = gate.frozen_gate_set(client, params, paths)
    assert converted.note.startswith(f"gate set {run.info.run_id[:8]} was frozen from the validation carve-out by an "
                                     "earlier pgrank") and caplog.text.count("was frozen from the validation") == 1
    assert set(converted.qrels) == {"q4", "q6"} and converted.description.endswith("frozen by run 0123abcd")
    sets = open_candidate_store(converted.candidates)
    corpus_ids = StringColumn.open(converted.documents, "documents")
    assert list(sets.qids) == ["q4", "q6"] and sets.pairs == 4  # "gone" is not in the corpus: left out
    from pgrank.data.corpus_store import open_corpus

    ids = open_corpus(paths, "tiny").ids
    assert ids.take(sets.candidates(0)[0]) == ["d2", "d1"] and list(sets.candidates(0)[1]) == [0, 1]  # order, grades
    assert sorted(corpus_ids) == ["d1", "d2", "d3", "d4"]
    assert not (converted.documents / "candidates.trec").exists()
    again = gate.frozen_gate_set(client, params, paths)  # converted once: the message is not repeated
    assert again.note is None and again.qrels == converted.qrels


# --------------------------------------------------------------------------------------- the gate, for real


@pytest.fixture
def trained(tmp_path, tiny_model_dir, monkeypatch):
    """The toy project with tracking on and a gate split, one tower:query policy trained and registered as version 1."""
    from mlflow.tracking import MlflowClient

    from pgrank.training.trainer import train

    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    params, paths = make_project(tmp_path, tiny_model_dir, overrides={
        "tracking.enabled": True, "train.epochs": 1, "train.keep_epochs": [1], "train.learning_rate": 5e-3,
        "evaluate.max_seq_length": 32, "data.gate_size": 6})
    result = train(params, paths, str(tiny_model_dir), device="cpu", progress=False)
    mlflow.set_tracking_uri(paths.mlflow_uri())
    yield params, paths, MlflowClient(paths.mlflow_uri()), result
    mlflow.set_tracking_uri(None)


def test_versions_are_gated_side_by_side_on_a_frozen_gate_set_and_continual_training_keeps_the_documents(
        trained, tiny_model_dir, tmp_path):
    from pgrank.data.beir import load_qrels
    from pgrank.data.candidate_store import open_candidate_store
    from pgrank.data.corpus_store import open_corpus
    from pgrank.pipeline import gate
    from pgrank.retrieval.dense.retriever import DenseSystem
    from pgrank.training.trainer import train

    params, paths, client, first = trained
    name = params.tracking.registered_model
    v1 = gate.fetch_version(client, paths, name, first.registered_version)
    assert v1.document_model == str(tiny_model_dir) == v1.warm_start  # tower: query: documents through the warm start
    assert json.loads((v1.folder / "pgrank.json").read_text())["tower"] == "query"

    frozen = gate.freeze_gate_set(client, params, paths, parent_run_id=None)
    carved = paths.root / "splits" / "toy" / "qrels"
    assert set(frozen.qrels) == set(load_qrels(carved / "gate.tsv")) and len(frozen.queries) == params.data.gate_size
    for split in ("train", "validation"):  # the gate split: neither trained on nor selected with
        assert set(load_qrels(carved / f"{split}.tsv")).isdisjoint(frozen.qrels)
    assert gate.leaked(params, paths, frozen) == {}
    store = open_candidate_store(frozen.candidates)
    assert list(store.qids) == sorted(frozen.qrels) and store.pairs == 10 * params.data.gate_size
    assert gate.holdout_override(client, params, paths)[0] == [f"data.holdout={frozen.holdout}"]
    shutil.rmtree(paths.root / "gate")  # fetched back from MLflow: the tag names the run that holds it
    again = gate.frozen_gate_set(client, params, paths)
    assert (again.queries, again.qrels) == (frozen.queries, frozen.qrels) and again.note is None
    assert np.array_equal(open_candidate_store(again.candidates).rows, store.rows)

    artifacts = corpus_artifacts(paths)
    first_values = gate.evaluate_system(params, paths, again, v1.system)
    assert set(first_values) == set(frozen.qrels)
    assert {"ndcg@10", "mrr@10", "recall@10"} <= set(next(iter(first_values.values())))
    # A rerank gate of a model with no corpus-embedding artifact (a tower: both policy) encodes the candidates only.
    copy = shutil.copytree(tiny_model_dir, tmp_path / "both-towers")
    both = gate.evaluate_system(params, paths, again, DenseSystem("both", str(copy), str(copy)))
    assert set(both) == set(frozen.qrels)
    assert corpus_artifacts(paths) == artifacts

    # Continual: the registered version is the warm start; its query route trains, its documents stay.
    second = train(params, paths, str(v1.folder), device="cpu", progress=False)
    assert corpus_artifacts(paths) == artifacts
    meta = json.loads((second.final / "pgrank.json").read_text())
    assert meta["document_encoder"] == json.loads((first.final / "pgrank.json").read_text())["document_encoder"]
    from sentence_transformers import SentenceTransformer

    pair, warm = SentenceTransformer(str(second.final), device="cpu"), SentenceTransformer(str(tiny_model_dir), device="cpu")
    texts = ["Coral Reef coral reef the data", "tax policy small analysis"]
    assert np.allclose(pair.encode_document(texts), warm.encode(texts), atol=1e-6)  # a flat pair, not nested
    assert not np.allclose(pair.encode_query(texts), v1_query(v1.folder, texts), atol=1e-5)  # trained further

    v2 = gate.fetch_version(client, paths, name, second.registered_version)
    assert v2.document_model == str(tiny_model_dir)

    # Provenance: each version records the queries it trained and was selected on; v2's chain runs through v1's
    # record (its warm start, fetched from the registry) down to the hub-like warm start, which cannot be known.
    from pgrank.pipeline.provenance import learned_from, meets

    learned = {q for split in ("train", "validation") for q in load_qrels(carved / f"{split}.tsv")}
    found = learned_from(client, name, v2.version)
    assert found.queries == {"toy": frozenset(learned)} and meets(found, again) == []
    assert found.unknown == [f"its warm start {tiny_model_dir}: what it was trained on is not known"]
    leaky = gate.GateSet("leaky", "toy", {}, {q: {"d": 1} for q in sorted(learned)[:2]}, None)
    assert meets(found, leaky) == sorted(learned)[:2]
    second_values = gate.evaluate_system(params, paths, again, v2.system)
    metrics, _, _ = gate.gate_metrics(params)
    decision = decide(second_values, first_values, params.champion, challenger=v2.version, champion=v1.version,
                      metrics=metrics, gate=again.description, level=0.05 / 52)
    assert decision.queries == len(frozen.qrels) and [r.metric for r in decision.rows] == metrics
    assert decision.row("ndcg@10").champion == pytest.approx(np.mean([v["ndcg@10"] for v in first_values.values()]))

    # The corpus changes after the freeze (a document added at the top, a candidate deleted): the frozen sets
    # are read over today's corpus by document id, the deleted one left out.
    corpus_file = paths.dataset("toy") / "corpus.jsonl"
    lines = corpus_file.read_text().splitlines(keepends=True)
    old = open_corpus(paths, "toy")
    gone = old.ids[int(store.rows[0])]
    corpus_file.write_text(json.dumps({"_id": "new", "title": "", "text": "a new document"}) + "\n"
                           + "".join(line for line in lines if json.loads(line)["_id"] != gone))
    today = open_corpus(paths, "toy")
    assert today.sha256 != old.sha256
    moved = gate.gate_candidates(again, today, tmp_path)
    for i, qid in enumerate(moved.qids):
        before = [d for d in old.ids.take(store.candidates(i)[0]) if d != gone]
        assert today.ids.take(moved.candidates(i)[0]) == before and qid == store.qids[i]
    assert moved.pairs == store.pairs - int((np.asarray(store.rows) == store.rows[0]).sum())


def test_the_gate_of_a_workspace_meets_the_warm_start_first_then_keeps_what_nothing_retrained(trained, tiny_model_dir):
    """gate_workspace, as scheduled retraining runs it: with no champion yet, the version training registered
    (before any gated run) meets its warm start (champion.first: gate), by the rule, on the frozen gate split;
    it is tagged, so a run that registered nothing judges nothing. With champion.first: promote it is promoted."""
    import yaml

    from pgrank.pipeline import gate
    from pgrank.pipeline.retraining import gate_workspace
    from pgrank.retrieval.dense.retriever import comparison_system

    params, paths, client, first = trained
    ws = paths.root
    (ws / "params.yaml").write_text(yaml.safe_dump(params.model_dump(mode="json")))
    decision = gate_workspace(ws, None)
    assert decision.challenger == first.registered_version and decision.champion is None
    assert decision.baseline == f"its warm start {tiny_model_dir}" and decision.queries == params.data.gate_size
    frozen = gate.frozen_gate_set(client, params, paths)
    warm = gate.evaluate_system(params, paths, frozen, comparison_system(params, str(tiny_model_dir)))
    head = decision.row("ndcg@10")
    assert head.champion == pytest.approx(np.mean([v["ndcg@10"] for v in warm.values()]))
    assert not decision.promoted and decision.message.startswith("no champion yet: version 1")  # 12 training queries
    assert champion(client, params.tracking.registered_model, params.tracking.champion_alias) is None
    tag = client.get_model_version(params.tracking.registered_model, first.registered_version).tags[DECISION_TAG]
    assert tag.startswith("not promoted: version 1")
    with mlflow.start_run() as parent:  # a later pipeline run that registered no version
        pass
    again = gate_workspace(ws, parent.info.run_id)
    assert not again.promoted and again.reason.startswith("nothing was retrained") and again.champion is None

    from pgrank.pipeline.decisions import records

    (record,) = records(client, params.tracking.registered_model)  # the first decision, recorded in the registry
    assert (record.outcome, record.challenger, record.champion, record.run_id is not None) == ("keep", "1", None, True)
    assert record.level == pytest.approx(0.05 / 52) and record.budget["state"]["decisions"] == 1  # params.yaml's budget
    assert "p < 0.000962, the level decision 1 of the error budget 0.05 over 52 decisions (elond)" in decision.markdown()
    assert "< 1 / level 0.000962" in decision.reason  # e-LOND decides by the betting test's e-value
    for key in (record.key, f"{record.key}.run"):  # voided: the version is judged again
        client.delete_registered_model_tag(params.tracking.registered_model, key)
    client.delete_model_version_tag(params.tracking.registered_model, first.registered_version, DECISION_TAG)
    told = params.model_copy(update={"champion": params.champion.model_copy(update={"first": "promote"})})
    (ws / "params.yaml").write_text(yaml.safe_dump(told.model_dump(mode="json")))
    promoted = gate_workspace(ws, None)
    assert promoted.promoted and promoted.reason.startswith("there was no champion yet and champion.first is promote")
    assert champion(client, params.tracking.registered_model, params.tracking.champion_alias) == first.registered_version
    assert client.get_registered_model(params.tracking.registered_model).tags["pgrank.gate_set"]  # frozen on the way


def v1_query(folder: Path, texts: list[str]) -> np.ndarray:
    from sentence_transformers import SentenceTransformer

    return SentenceTransformer(str(folder), device="cpu").encode_query(texts)


def test_a_version_trained_before_the_gate_split_existed_is_refused_by_its_recorded_queries(tmp_path, tiny_model_dir,
                                                                                            monkeypatch):
    """A model trained with data.gate_size 0 learned from every query; once a gate split is carved, the workspace's
    carve-out no longer shows it, but the queries the version recorded do: the gate refuses it, and records why."""
    import yaml
    from mlflow.tracking import MlflowClient

    from pgrank.pipeline.decisions import records
    from pgrank.pipeline.retraining import gate_workspace
    from pgrank.training.trainer import train

    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    settings = {"tracking.enabled": True, "train.epochs": 1, "train.keep_epochs": [1], "evaluate.max_seq_length": 32}
    params, paths = make_project(tmp_path, tiny_model_dir, overrides=settings)
    first = train(params, paths, str(tiny_model_dir), device="cpu", progress=False)
    params, paths = make_project(tmp_path, tiny_model_dir, overrides={**settings, "data.gate_size": 6})
    mlflow.set_tracking_uri(paths.mlflow_uri())
    try:
        ws = paths.root
        (ws / "params.yaml").write_text(yaml.safe_dump(params.model_dump(mode="json")))
        decision = gate_workspace(ws, None)
        client = MlflowClient(paths.mlflow_uri())
        assert decision.challenger == first.registered_version and not decision.promoted
        assert re.match(r"the challenger trained on or was selected with gate queries: 6 in its recorded training "
                        r"queries \(e\.g\. \['q", decision.reason)
        (record,) = records(client, params.tracking.registered_model)
        assert record.outcome == "keep" and record.decision["reason"] == decision.reason
        assert champion(client, params.tracking.registered_model, params.tracking.champion_alias) is None
    finally:
        mlflow.set_tracking_uri(None)


def test_a_champion_that_trained_on_todays_gate_queries_cannot_be_compared_on_them(tmp_path, tiny_model_dir, monkeypatch):
    """The champion (set before the gate split existed) learned from every query; a clean challenger is not
    compared with it on a gate set it has seen: the gate says so, records it, and keeps the alias."""
    import yaml
    from mlflow.tracking import MlflowClient

    from pgrank.pipeline.decisions import records
    from pgrank.pipeline.retraining import gate_workspace
    from pgrank.tracking import PARENT_ENV
    from pgrank.training.trainer import train

    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    settings = {"tracking.enabled": True, "train.epochs": 1, "train.keep_epochs": [1], "evaluate.max_seq_length": 32}
    params, paths = make_project(tmp_path, tiny_model_dir, overrides=settings)
    old = train(params, paths, str(tiny_model_dir), device="cpu", progress=False)
    client = MlflowClient(paths.mlflow_uri())
    name, alias = params.tracking.registered_model, params.tracking.champion_alias
    client.set_registered_model_alias(name, alias, old.registered_version)
    params, paths = make_project(tmp_path, tiny_model_dir, overrides={**settings, "data.gate_size": 6})
    mlflow.set_tracking_uri(paths.mlflow_uri())
    try:
        with mlflow.start_run(run_name="pipeline") as parent:
            pass
        monkeypatch.setenv(PARENT_ENV, parent.info.run_id)
        new = train(params, paths, str(tiny_model_dir), device="cpu", progress=False)  # the gate split held out
        monkeypatch.delenv(PARENT_ENV)
        ws = paths.root
        (ws / "params.yaml").write_text(yaml.safe_dump(params.model_dump(mode="json")))
        decision = gate_workspace(ws, parent.info.run_id)
        assert (decision.challenger, decision.champion) == (new.registered_version, old.registered_version)
        assert not decision.promoted and decision.reason.startswith(
            f"the champion, version {old.registered_version}, trained on or was selected with 6 gate queries")
        assert records(client, name)[-1].outcome == "keep"
        assert champion(client, name, alias) == old.registered_version
    finally:
        mlflow.set_tracking_uri(None)


def corpus_artifacts(paths) -> list[str]:
    """The embeddings folder's artifacts but the query embeddings (a gate keeps its queries' vectors)."""
    return sorted(p.name for p in paths.embeddings.iterdir() if not p.name.startswith(".") and not p.name.endswith("--queries"))
