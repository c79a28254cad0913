"""``pgrank.tracking``: a run nested in this process's open run opens no store of its own; an sqlite store keeps its
artifacts beside itself, wherever the process that creates its experiment runs."""

from __future__ import annotations

from pathlib import Path

import yaml

from pgrank import tracking
from pgrank.config import load_params
from pgrank.paths import Paths

ROOT = Path(__file__).resolve().parents[1]


def _params(tmp_path: Path):
    doc = yaml.safe_load((ROOT / "params.yaml").read_text())
    doc["paths"] = {"root": "runs", "data": "data", "embeddings": "emb"}
    (tmp_path / "params.yaml").write_text(yaml.safe_dump(doc))
    params = load_params(tmp_path / "params.yaml")
    return params, Paths.from_config(params.paths, base=tmp_path)


def test_an_sqlite_store_keeps_its_artifacts_beside_it_not_in_the_working_directory(tmp_path, monkeypatch):
    """``pgrank repro`` runs in the project's root and creates the experiment there: MLflow's default artifact root,
    ``./mlruns``, would land in the checkout. The workspace's store keeps them in ``mlartifacts/`` beside it."""
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    monkeypatch.delenv(tracking.PARENT_ENV, raising=False)
    params, paths = _params(tmp_path)
    elsewhere = tmp_path / "project-root"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    (tmp_path / "note.txt").write_text("an artifact")
    with tracking.stage_run(params, paths, "pipeline", nested=False) as run:
        tracking.log_artifact(run, str(tmp_path / "note.txt"), "notes")
    with tracking.stage_run(params, paths, "tables"):  # the experiment exists: found, not created again
        pass
    assert (paths.root / "mlartifacts").is_dir()
    assert [p.name for p in (paths.root / "mlartifacts").rglob("note.txt")] == ["note.txt"]
    assert list(elsewhere.iterdir()) == []
    assert tracking.artifact_root("http://127.0.0.1:5000") is None  # a server decides for itself


def test_a_run_nested_in_an_open_one_reuses_its_store_and_experiment(tmp_path, monkeypatch):
    """Evaluation opens one run per dataset and one per (split, stage) inside it: the store is configured (its
    experiment set, killed runs ended) once, by the outer run, and the inner runs are its children."""
    from mlflow.tracking import MlflowClient

    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    monkeypatch.delenv(tracking.PARENT_ENV, raising=False)
    params, paths = _params(tmp_path)
    calls = []
    real = tracking.configure
    monkeypatch.setattr(tracking, "configure", lambda *a: (calls.append(a), real(*a))[1])

    with tracking.stage_run(params, paths, "evaluate/minilm/scifact", resources=True) as outer:
        for stage in ("rerank", "full"):
            with tracking.stage_run(params, paths, f"evaluate/minilm/scifact/test/{stage}") as inner:
                tracking.log_metrics(inner, {"ndcg@10": 0.5})
    assert len(calls) == 1
    client = MlflowClient(tracking.tracking_uri(params, paths))
    children = client.search_runs([outer.info.experiment_id], f"tags.mlflow.parentRunId = '{outer.info.run_id}'")
    assert sorted(r.info.run_name for r in children) == ["evaluate/minilm/scifact/test/full",
                                                         "evaluate/minilm/scifact/test/rerank"]
    assert all(r.data.metrics == {"ndcg_at_10": 0.5} for r in children)

    with tracking.stage_run(params, paths, "evaluate/minilm/nfcorpus"):  # a run of its own configures again
        pass
    assert len(calls) == 2
