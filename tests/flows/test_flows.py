"""The Prefect flows: tasks read from DVC, dataset selection, retries, runners, schedule, end to end.

Plain functions and ``task.fn`` are tested directly on a toy DVC project. One Prefect test server
(``prefect_test_harness``, 12-25 s to start) is shared by the tests that need an API: the shrunk demo
pipeline end to end through the retraining flow, a failing toy stage, and ``pgrank schedule``.
"""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml
from shrunk import project_copy, shrunk_overrides, sliced_scifact_mirror

from flows.pipeline import make_task_runner, select_datasets, stage_graph, stage_task
from pgrank.errors import PgrankError

ROOT = Path(__file__).resolve().parents[2]

# The toy pipeline has the real one's shape: download -> mine@<dataset> / train@<warm> -> evaluate@<system>-<dataset> -> tables.
TOY_DVC = """
stages:
  download:
    cmd: python step.py data.txt
    outs: [data.txt]
  mine:
    foreach: [sci, nf]
    do:
      cmd: python step.py mine-${item}.txt
      deps: [data.txt]
      outs: ["mine-${item}.txt"]
  train:
    foreach: [w]
    do:
      cmd: python step.py model-${item}.txt
      deps: [data.txt]
      outs: ["model-${item}.txt"]
  evaluate:
    matrix:
      system: [bm25, w]
      dataset: [sci, nf]
    cmd: python step.py evals/${item.system}-${item.dataset}.txt
    deps: ["mine-${item.dataset}.txt", model-w.txt]
    outs: ["evals/${item.system}-${item.dataset}.txt"]
  tables:
    cmd: python step.py tables.txt
    deps: [evals]
    outs: [tables.txt]
"""
# Writes its output, says so, and fails when TOY_FAIL names it.
TOY_STEP = """
import os, sys
out = sys.argv[1]
print(f"writing {out}", flush=True)
if os.environ.get("TOY_FAIL") == out:
    sys.exit(f"{out}: failing on purpose")
os.makedirs(os.path.dirname(out) or ".", exist_ok=True)
open(out, "w").write(out)
"""
TOY_STAGES = {"download", "mine@sci", "mine@nf", "train@w", "evaluate@bm25-sci", "evaluate@bm25-nf", "evaluate@w-sci",
              "evaluate@w-nf", "tables"}


@pytest.fixture
def toy(tmp_path) -> Path:
    """A DVC project with the pipeline's shape and a params file with tracking off."""
    (tmp_path / "dvc.yaml").write_text(TOY_DVC)
    (tmp_path / "step.py").write_text(TOY_STEP)
    params = yaml.safe_load((ROOT / "params.yaml").read_text())
    params["tracking"]["enabled"] = False
    (tmp_path / "params.yaml").write_text(yaml.safe_dump(params))
    subprocess.run(["dvc", "init", "--no-scm", "-q"], cwd=tmp_path, check=True)
    return tmp_path


def test_stages_and_edges_come_from_dvc(toy):
    graph = stage_graph(toy)
    assert set(graph) == TOY_STAGES
    assert graph["download"] == [] and graph["mine@nf"] == ["download"]
    assert sorted(graph["evaluate@w-nf"]) == ["mine@nf", "train@w"]
    assert sorted(graph["tables"]) == sorted(s for s in TOY_STAGES if s.startswith("evaluate@"))


def test_datasets_select_their_fanned_out_stages_and_keep_the_shared_ones():
    graph = {"download": [], "mine-train": ["download"], "mine@sci": ["download"], "mine@climate-fever": ["download"],
             "mine@fever": ["download"], "train@w": ["mine-train"],
             "evaluate@bm25-sci": ["mine@sci"], "evaluate@bm25-climate-fever": ["mine@climate-fever"],
             "evaluate@bm25-fever": ["mine@fever"], "evaluate-policy@w-fever": ["mine@fever", "train@w"],
             "tables": ["evaluate@bm25-sci", "evaluate@bm25-climate-fever", "evaluate@bm25-fever", "train@w"]}
    kept = select_datasets(graph, ["fever"])
    assert set(kept) == {"download", "mine-train", "train@w", "mine@fever", "evaluate@bm25-fever",
                         "evaluate-policy@w-fever", "tables"}
    assert sorted(kept["tables"]) == ["evaluate@bm25-fever", "train@w"]
    order = list(kept)
    assert all(order.index(u) < order.index(s) for s in kept for u in kept[s])  # topological
    assert set(select_datasets(graph, None)) == set(graph)
    with pytest.raises(PgrankError, match="available: climate-fever, fever, sci"):
        select_datasets(graph, ["scifact"])


def test_a_stage_task_runs_dvc_and_streams_its_output(toy, monkeypatch, caplog):
    task = stage_task("download")
    with caplog.at_level(logging.INFO, logger="pgrank.flows"):
        assert task.fn(str(toy), "download") == "download"
    assert (toy / "data.txt").is_file()
    assert "writing data.txt" in caplog.text and "Running stage 'download'" in caplog.text
    caplog.clear()
    with caplog.at_level(logging.INFO, logger="pgrank.flows"):
        task.fn(str(toy), "download")
    assert "didn't change, skipping" in caplog.text  # DVC decides what is up to date
    monkeypatch.setenv("TOY_FAIL", "mine-sci.txt")
    with pytest.raises(PgrankError, match=r"(?s)stage mine@sci: .*failing on purpose"):
        stage_task("mine@sci").fn(str(toy), "mine@sci")


def test_only_the_download_stage_retries_with_exponential_backoff():
    download = stage_task("download")
    assert download.name == "download" and download.retries == 3
    assert download.retry_delay_seconds == [10, 20, 40]
    assert stage_task("train@w").retries == 0


def _pgrank(*args: str, env: dict | None = None, **kwargs) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, str(ROOT / "cli.py"), *args], cwd=ROOT, env=env, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, **kwargs)


def test_schedule_rejects_a_bad_cron_string_and_a_missing_server():
    env = {k: v for k, v in os.environ.items() if k != "PREFECT_API_URL"}
    bad = _pgrank("schedule", "--cron", "61 3 * * 0", env=env)
    _, err = bad.communicate(timeout=60)
    assert bad.returncode == 2 and "Traceback" not in err
    assert "--cron '61 3 * * 0'" in err and "five fields" in err
    from prefect.settings import PREFECT_API_URL, temporary_settings

    from flows.retraining import check_server

    with temporary_settings(restore_defaults={PREFECT_API_URL}):
        with pytest.raises(PgrankError, match="prefect server start --host 127.0.0.1"):
            check_server()


# ------------------------------------------------------------------------ against a Prefect test server


@pytest.fixture(scope="module")
def prefect_api(tmp_path_factory):
    """One Prefect test server for this module, with PREFECT_HOME in tmp; yields its API URL."""
    from prefect.settings import (
        PREFECT_API_URL,
        PREFECT_HOME,
        PREFECT_SERVER_ANALYTICS_ENABLED,
        PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS,
        temporary_settings,
    )
    from prefect.testing.utilities import prefect_test_harness

    home = tmp_path_factory.mktemp("prefect-home")
    env = {"PREFECT_HOME": str(home), "PREFECT_SERVER_ANALYTICS_ENABLED": "false",
           "PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS": "90"}
    patch = pytest.MonkeyPatch()
    for key, value in env.items():
        patch.setenv(key, value)
    try:
        with temporary_settings({PREFECT_HOME: home, PREFECT_SERVER_ANALYTICS_ENABLED: False,
                                 PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS: 90}):
            with prefect_test_harness(server_startup_timeout=None):
                yield PREFECT_API_URL.value()
    finally:
        patch.undo()


def _task_runs(flow_name: str) -> list:
    """The task runs of the latest run of a flow, read back from the Prefect API."""
    from prefect import get_client
    from prefect.client.schemas.filters import (
        FlowFilter,
        FlowFilterName,
        FlowRunFilter,
        FlowRunFilterId,
    )
    from prefect.client.schemas.sorting import FlowRunSort

    with get_client(sync_client=True) as client:
        runs = client.read_flow_runs(flow_filter=FlowFilter(name=FlowFilterName(any_=[flow_name])),
                                     sort=FlowRunSort.START_TIME_DESC, limit=1)
        return client.read_task_runs(flow_run_filter=FlowRunFilter(id=FlowRunFilterId(any_=[runs[0].id])))


def _task_log(task_run) -> str:
    """A task run's log as the UI shows it (DVC's and the stage command's output)."""
    from prefect import get_client
    from prefect.client.schemas.filters import LogFilter, LogFilterTaskRunId
    from prefect.logging.handlers import APILogHandler

    APILogHandler().flush()  # logs are shipped in batches in the background
    with get_client(sync_client=True) as client:
        logs = client.read_logs(LogFilter(task_run_id=LogFilterTaskRunId(any_=[task_run.id])))
    return "\n".join(log.message for log in logs)


@pytest.mark.integration
def test_the_retraining_flow_runs_the_dvc_stages_then_crowns_the_model(prefect_api, beir_mirror, tiny_model_dir,
                                                                        tmp_path, monkeypatch):
    from mlflow.tracking import MlflowClient

    from flows.retraining import pgrank_retrain
    from pgrank.pipeline.workspace import prepare, run_dvc

    project = project_copy(tmp_path / "project")
    monkeypatch.setenv("PGRANK_BEIR_MIRROR", str(sliced_scifact_mirror(beir_mirror / "scifact.zip", tmp_path / "mirror")))
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    overrides = shrunk_overrides(tiny_model_dir)
    decision = pgrank_retrain(profile="demo", overrides=overrides, params_file=str(project / "params.yaml"))

    ws = prepare(project / "params.yaml", "demo", overrides)
    stages = run_dvc(["stage", "list", "--name-only"], ws, capture=True).stdout.split()
    tasks = _task_runs("pgrank-pipeline")
    assert sorted(t.name for t in tasks) == sorted(stages)  # the flow's tasks are dvc.yaml's stages
    assert all(t.state.is_completed() for t in tasks)
    assert (ws / "tables" / "rerank-in-domain.md").is_file() and (ws / "tables" / "tables.md").is_file()
    assert run_dvc(["status", "--quiet"], ws, capture=True).returncode == 0  # dvc.lock records every stage

    client = MlflowClient(f"sqlite:///{ws / 'mlflow.db'}")
    assert decision.promoted and decision.champion is None  # the first model becomes the champion
    assert client.get_model_version_by_alias("pgrank-retriever", "champion").version in (decision.candidate,
                                                                                        int(decision.candidate))
    train_run = client.get_run(client.get_model_version("pgrank-retriever", decision.candidate).run_id)
    parent = client.get_run(train_run.data.tags["mlflow.parentRunId"])
    assert parent.data.tags["stage"] == "pipeline"  # stage runs nest under the flow's parent run


def test_a_failing_stage_fails_the_flow_and_skips_what_depends_on_it(prefect_api, toy, monkeypatch):
    from flows.pipeline import pgrank_pipeline

    monkeypatch.setenv("TOY_FAIL", "mine-nf.txt")
    with pytest.raises(PgrankError, match="stage\\(s\\) mine@nf failed"):
        pgrank_pipeline(datasets=["sci", "nf"], params_file=str(toy / "params.yaml"))
    states = {t.name: t.state for t in _task_runs("pgrank-pipeline")}
    assert set(states) == TOY_STAGES
    assert states["mine@nf"].is_failed()
    assert all(states[s].is_completed() for s in ("download", "mine@sci", "train@w", "evaluate@bm25-sci", "evaluate@w-sci"))
    assert not any(states[s].is_completed() for s in ("evaluate@bm25-nf", "evaluate@w-nf", "tables"))
    assert (toy / "evals" / "w-sci.txt").is_file() and not (toy / "tables.txt").exists()
    assert "failing on purpose" in _task_log(next(t for t in _task_runs("pgrank-pipeline") if t.name == "mine@nf"))


def test_schedule_serves_a_deployment_with_the_cron_schedule_that_runs(prefect_api, toy):
    from prefect import get_client

    env = {**os.environ, "PREFECT_API_URL": prefect_api, "PREFECT_RUNNER_POLL_FREQUENCY": "1"}
    serving = _pgrank("--params", str(toy / "params.yaml"), "schedule", "--cron", "0 3 * * 0", "--name", "nightly-test",
                      env=env)
    try:
        deployment, deadline = None, time.monotonic() + 90
        with get_client(sync_client=True) as client:
            while deployment is None and time.monotonic() < deadline and serving.poll() is None:
                try:
                    deployment = client.read_deployment_by_name("pgrank-retrain/nightly-test")
                except Exception:  # not created yet
                    time.sleep(1)
            assert deployment is not None, serving.stderr.read() if serving.poll() is not None else "timed out"
            assert [s.schedule.cron for s in deployment.schedules] == ["0 3 * * 0"]
            assert deployment.parameters == {"profile": None, "overrides": [], "params_file": str(toy / "params.yaml")}
            assert deployment.entrypoint == "flows.retraining.pgrank_retrain"

            run = client.create_flow_run_from_deployment(deployment.id)  # what the schedule does each Sunday
            while not client.read_flow_run(run.id).state.is_final() and time.monotonic() < deadline + 90:
                time.sleep(1)
            state = client.read_flow_run(run.id).state
        assert state.is_completed(), state
        assert (toy / "tables.txt").is_file()  # the served run ran the pipeline (tracking is off: no promotion)
    finally:
        serving.send_signal(signal.SIGINT)  # Ctrl-C: serve stops and pauses the schedule
        try:
            serving.wait(timeout=30)
        except subprocess.TimeoutExpired:
            serving.kill()
            serving.wait()
