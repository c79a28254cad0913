"""Champion promotion: the alias moves only on improvement, on a real sqlite MLflow registry.

Each "training run" logs ``val_ndcg_at_10`` per epoch and registers a small pyfunc model, as
``pgrank train`` does with its sentence-transformers model; a version's score is the last value.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

import pytest

from pgrank.pipeline.champion import (
    DEFAULT_METRIC,
    champion,
    promote_if_better,
    version_score,
    versions_of_run,
)

mlflow = pytest.importorskip("mlflow")

MODEL, ALIAS = "pgrank-retriever", "champion"


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


@dataclass(frozen=True)
class Registry:
    client: Any
    experiment: str
    model: str  # a registered model of its own per test


@pytest.fixture
def registry(store, request) -> Registry:
    client, experiment = store
    return Registry(client, experiment, f"{MODEL}-{re.sub(r'[^0-9a-z]+', '-', request.node.name)}")


def _train(registry: Registry, *val_ndcg: float, parent: str | None = None) -> str:
    """A run that logs validation nDCG@10 per epoch and registers its model; returns the version."""
    with mlflow.start_run(experiment_id=registry.experiment, parent_run_id=parent, nested=parent is not None):
        for epoch, value in enumerate(val_ndcg):
            mlflow.log_metric(DEFAULT_METRIC, value, step=epoch * 10)
        info = mlflow.pyfunc.log_model(name="model", python_model=_Echo(), registered_model_name=registry.model,
                                       pip_requirements=["mlflow"])
    return str(info.registered_model_version)


def test_a_version_scores_the_last_value_of_its_validation_metric(registry):
    client, model = registry.client, registry.model
    version = _train(registry, 0.50, 0.42)
    assert version_score(client, model, version) == pytest.approx(0.42)
    assert version_score(client, model, version, "missing") is None


def test_the_first_version_is_promoted_when_there_is_no_champion(registry):
    client, model = registry.client, registry.model
    assert promote_if_better(client, model, ALIAS).promoted is False  # nothing registered yet
    version = _train(registry, 0.2, 0.3)
    decision = promote_if_better(client, model, ALIAS)
    assert decision.promoted and decision.candidate == version and decision.champion is None
    assert champion(client, model, ALIAS) == version
    assert "no 'champion' yet" in decision.message


def test_a_better_version_is_promoted(registry):
    client, model = registry.client, registry.model
    first = _train(registry, 0.30)
    promote_if_better(client, model, ALIAS)
    better = _train(registry, 0.10, 0.31)
    decision = promote_if_better(client, model, ALIAS)
    assert decision.promoted and (decision.champion, decision.candidate) == (first, better)
    assert decision.champion_score == pytest.approx(0.30) and decision.candidate_score == pytest.approx(0.31)
    assert champion(client, model, ALIAS) == better


@pytest.mark.parametrize("score", [0.29, 0.30], ids=["worse", "equal"])
def test_a_worse_or_equal_version_is_not_promoted(registry, score):
    client, model = registry.client, registry.model
    first = _train(registry, 0.30)
    promote_if_better(client, model, ALIAS)
    challenger = _train(registry, 0.5, score)  # a better earlier epoch does not count: the last value does
    decision = promote_if_better(client, model, ALIAS)
    assert not decision.promoted and decision.candidate == challenger and decision.champion == first
    assert champion(client, model, ALIAS) == first
    again = promote_if_better(client, model, ALIAS, candidates=[first])
    assert not again.promoted and "already is" in again.reason


def test_the_best_new_version_of_a_pipeline_run_is_the_candidate(registry):
    client, model = registry.client, registry.model
    older = _train(registry, 0.9)  # not from this pipeline run: never a candidate here
    with mlflow.start_run(experiment_id=registry.experiment) as parent:
        pass
    weaker = _train(registry, 0.40, parent=parent.info.run_id)
    stronger = _train(registry, 0.45, parent=parent.info.run_id)
    new = versions_of_run(client, model, parent.info.run_id)
    assert new == [weaker, stronger] and older not in new
    decision = promote_if_better(client, model, ALIAS, candidates=new)
    assert decision.promoted and decision.candidate == stronger


def test_a_champion_without_the_metric_is_not_replaced_automatically(registry):
    client, model = registry.client, registry.model
    with mlflow.start_run(experiment_id=registry.experiment):
        info = mlflow.pyfunc.log_model(name="model", python_model=_Echo(), registered_model_name=model,
                                       pip_requirements=["mlflow"])
    client.set_registered_model_alias(model, ALIAS, info.registered_model_version)
    _train(registry, 0.9)
    decision = promote_if_better(client, model, ALIAS)
    assert not decision.promoted and "by hand" in decision.reason
