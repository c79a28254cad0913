"""``pgrank.tracking``: a run nested in this process's open run opens no store of its own; an sqlite store keeps its
artifacts beside itself, wherever the process that creates its experiment runs."""

from __future__ import annotations

import os
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


def _spooled_evaluation(params, paths, status_error: type[BaseException] | None = None) -> None:
    """An evaluation stage's runs as ``pgrank.evaluation.stage`` opens them, spooled (optionally ended by an error)."""
    with tracking.stage_run(params, paths, "evaluate/minilm/scifact", tags={"stage": "evaluate"},
                            log_params={"system": "minilm"}, resources=True, spool=True) as outer:
        for stage in ("rerank", "full"):
            with tracking.stage_run(params, paths, f"evaluate/minilm/scifact/test/{stage}",
                                    tags={"stage": "evaluate-result"}) as inner:
                tracking.log_metrics(inner, {"ndcg@10": 0.5 if stage == "rerank" else 0.25})
        assert isinstance(outer, tracking.SpooledRun)
        if status_error is not None:
            raise status_error("stopped")


def test_a_stage_inside_a_pipeline_spools_its_runs_without_mlflow_and_the_next_store_user_writes_them(tmp_path,
                                                                                                  monkeypatch):
    """Inside a pipeline (DVC's DVC_STAGE), an evaluation's runs go to the workspace's spool, MLflow unloaded; the next
    process that opens the store writes them nested as they were (status, times, metrics, parameters) and removes
    the files; a failed and a stopped stage are written FAILED and KILLED."""
    import subprocess
    import sys

    from mlflow.tracking import MlflowClient

    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    monkeypatch.delenv(tracking.PARENT_ENV, raising=False)
    params, paths = _params(tmp_path)
    probe = ("import sys; from pathlib import Path; sys.path.insert(0, {tests!r}); import test_tracking as t; "
             "params, paths = t._params(Path({tmp!r})); t._spooled_evaluation(params, paths); "
             "print(sorted(m for m in ('mlflow', 'sqlalchemy') if m in sys.modules))")
    child = subprocess.run([sys.executable, "-c", probe.format(tests=str(Path(__file__).parent), tmp=str(tmp_path))],
                           capture_output=True, text=True, env={**os.environ, "DVC_STAGE": "evaluate"})
    assert child.returncode == 0 and child.stdout.strip() == "[]", child.stderr[-2000:]
    assert len(list(paths.mlflow_spool.glob("*.json"))) == 1 and not paths.mlflow_db.exists()
    monkeypatch.setenv("DVC_STAGE", "evaluate")
    for error in (RuntimeError, KeyboardInterrupt):
        try:
            _spooled_evaluation(params, paths, error)
        except (RuntimeError, KeyboardInterrupt):
            pass
    monkeypatch.delenv("DVC_STAGE")

    with tracking.stage_run(params, paths, "tables", tags={"stage": "tables"}) as tables:  # opens the store: writes them
        pass
    assert list(paths.mlflow_spool.iterdir()) == []
    client = MlflowClient(tracking.tracking_uri(params, paths))
    runs = client.search_runs([tables.info.experiment_id])
    outers = sorted((r for r in runs if r.data.tags.get("stage") == "evaluate"), key=lambda r: r.info.start_time)
    assert [r.info.status for r in outers] == ["FINISHED", "FAILED", "KILLED"]
    for outer in outers:
        assert outer.info.run_name == "evaluate/minilm/scifact" and outer.data.params == {"system": "minilm"}
        assert {"wall_seconds", "peak_rss_mib"} <= set(outer.data.metrics)
        assert outer.info.start_time <= outer.info.end_time
        children = [r for r in runs if r.data.tags.get("mlflow.parentRunId") == outer.info.run_id]
        assert {r.info.run_name: r.data.metrics for r in children} == {
            "evaluate/minilm/scifact/test/rerank": {"ndcg_at_10": 0.5},
            "evaluate/minilm/scifact/test/full": {"ndcg_at_10": 0.25}}
        assert all(outer.info.start_time <= r.info.start_time <= r.info.end_time <= outer.info.end_time for r in children)


def test_a_spool_file_claimed_by_a_dead_process_is_written_once_and_another_stores_file_is_left(tmp_path, monkeypatch):
    """A process killed while writing the spool into the store leaves its claim: the next one finishes it, skipping
    the runs the store has already. A file spooled for another store waits for that store."""
    import json

    from mlflow.tracking import MlflowClient

    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    monkeypatch.delenv(tracking.PARENT_ENV, raising=False)
    params, paths = _params(tmp_path)
    uri = tracking.tracking_uri(params, paths)
    with tracking.stage_run(params, paths, "pipeline", nested=False):  # the store and experiment exist from here on
        pass
    monkeypatch.setenv("DVC_STAGE", "evaluate")
    _spooled_evaluation(params, paths)
    (spooled,) = paths.mlflow_spool.glob("*.json")
    other = json.loads(spooled.read_text())
    other["uri"] = "http://127.0.0.1:5000"
    (paths.mlflow_spool / "0-other.json").write_text(json.dumps(other))
    monkeypatch.delenv("DVC_STAGE")
    # a flush killed after writing the outer run and its first child: its claim names a process that is gone
    record = json.loads(spooled.read_text())
    client = MlflowClient(uri)
    exp = client.get_experiment_by_name(params.tracking.experiment).experiment_id
    partial = {**record["run"], "children": record["run"]["children"][:1]}
    tracking._write_spooled(client, exp, partial, None, spooled.stem, resumed=False)
    dead = 2**22 + 12345  # above Linux's largest PID: no process has it
    spooled.rename(paths.mlflow_spool / f"{spooled.stem}.{tracking._claimant().rpartition('-')[0]}-{dead}.claim")
    assert tracking.flush_spool(paths.mlflow_spool, uri) == 1
    runs = [r for r in client.search_runs([exp]) if r.data.tags.get("stage", "").startswith("evaluate")]
    assert sorted(r.info.run_name for r in runs) == ["evaluate/minilm/scifact", "evaluate/minilm/scifact/test/full",
                                                     "evaluate/minilm/scifact/test/rerank"]
    assert all(r.info.status == "FINISHED" for r in runs)
    assert [p.name for p in paths.mlflow_spool.iterdir()] == ["0-other.json"]
