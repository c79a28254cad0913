"""A real sqlite MLflow registry for tests: a fresh store, and model versions registered in it."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path

import mlflow


class Echo(mlflow.pyfunc.PythonModel):
    """The smallest model a registry version can hold."""

    def predict(self, context, model_input: list[str], params=None) -> list[str]:
        return model_input


@contextlib.contextmanager
def fresh_store(folder: Path) -> Iterator[tuple[mlflow.MlflowClient, str, str]]:
    """A fresh sqlite store in ``folder`` with an experiment ``pgrank`` whose artifacts stay in ``folder``, the tracking
    URI while open: ``(client, experiment id, uri)``. Its migrations take seconds: open one per test module."""
    uri = f"sqlite:///{folder / 'mlflow.db'}"
    mlflow.set_tracking_uri(uri)
    try:
        client = mlflow.MlflowClient(uri)
        yield client, client.create_experiment("pgrank", artifact_location=(folder / "artifacts").as_uri()), uri
    finally:
        mlflow.set_tracking_uri(None)


def register(experiment: str | None, model: str, parent: str | None = None) -> str:
    """A new version of registered model ``model``, logged by a run of ``experiment`` (``None``: the active
    experiment), nested under run ``parent`` if given; its version number."""
    with mlflow.start_run(experiment_id=experiment, parent_run_id=parent, nested=parent is not None):
        info = mlflow.pyfunc.log_model(name="model", python_model=Echo(), registered_model_name=model,
                                       pip_requirements=["mlflow"])
    return str(info.registered_model_version)
