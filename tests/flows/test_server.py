"""The flows against a real Prefect server (``prefect server start``), a real worker and the real UI.

* ``pgrank schedule --pool`` deploys scheduled retraining of the shrunk demo to a process work pool;
  ``prefect worker start`` (a subprocess) runs a flow run triggered through the API. Read back from the
  API: one task run per DVC stage, each with its log; the champion gate's artifact; each task Running
  only after its upstream stages finished (``wait_for``), so the flow-run graph tells the truth.
* Headless Chromium opens the UI at the deployment, the flow run and its pipeline subflow run:
  screenshots (PNG) and the rendered DOM, which shows the deployment's name and schedule and the runs'
  names and states. Skipped where ``chromium`` is
  not installed (Debian: ``apt-get install chromium``); ``PGRANK_SCREENSHOTS=DIR`` keeps the PNGs.
* ``pgrank schedule`` serving from its own process; a failing stage; every way scheduling fails (no
  server, a server that is down, a missing work pool) gives one line and exit 2.

The worker tests (the shrunk demo, run twice: minutes) and serving are ``slow``; the default suite keeps
the real-server smoke tests: scheduling failures, a failing stage, the device slot.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import pytest
from prefect_server import PrefectServer, free_port, latest_flow_run, stop, task_log, task_runs
from shrunk import project_copy, shrunk_overrides, sliced_scifact_mirror
from toy_pipeline import TOY_STAGES

from pgrank.errors import PgrankError

ROOT = Path(__file__).resolve().parents[2]
POOL, DEPLOYMENT = "pgrank-test-pool", "nightly-demo"
CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")


def _cli(args: list[str], cwd: Path, env: dict, timeout: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(ROOT / "cli.py"), *args], cwd=cwd, env=env, capture_output=True,
                          text=True, timeout=timeout)


def _wait_final(client, flow_run_id, timeout: float):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        run = client.read_flow_run(flow_run_id)
        if run.state.is_final():
            return run
        time.sleep(1)
    return client.read_flow_run(flow_run_id)


# --------------------------------------------------------------------------------------- failures


def test_scheduling_fails_in_one_line_without_a_server_or_a_work_pool(prefect_server: PrefectServer, tmp_path):
    home = {"PREFECT_HOME": str(tmp_path / "home")}  # no profile that sets PREFECT_API_URL
    unset = {k: v for k, v in prefect_server.env.items() if k != "PREFECT_API_URL"} | home
    down = prefect_server.env | home | {"PREFECT_API_URL": f"http://127.0.0.1:{free_port()}/api"}
    cases = [
        (unset, ["--pool", POOL], "PREFECT_API_URL is not set: a schedule needs a Prefect server"),
        (down, ["--pool", POOL], f"the Prefect server at {down['PREFECT_API_URL']} does not answer"),
        (down, [], "does not answer"),  # serving needs the server too
        (prefect_server.env, ["--pool", "no-such-pool"],
         "work pool 'no-such-pool' does not exist on the Prefect server; create it with `prefect work-pool create "
         "no-such-pool --type process`"),
        (prefect_server.env, ["--start-from", "yesterday", "--pool", POOL], "--start-from 'yesterday': expected one of"),
        (prefect_server.env, ["--cron", "0 25 * * *"], "--cron '0 25 * * *'"),
    ]
    for env, extra, message in cases:
        args = ["schedule", *(["--cron", "0 3 * * 0"] if "--cron" not in extra else []), *extra]
        out = _cli(args, ROOT, env)
        assert out.returncode == 2, (args, out.stderr)
        assert "Traceback" not in out.stderr and out.stderr.startswith("pgrank: error: "), out.stderr
        assert message in out.stderr, (message, out.stderr)


# --------------------------------------------------------------------------------------- toy flows


def test_a_failing_stage_fails_the_flow_and_skips_what_depends_on_it(prefect_server, toy, monkeypatch):
    from flows.pipeline import pgrank_pipeline

    monkeypatch.setenv("TOY_FAIL", "mine-nf.txt")
    with pytest.raises(PgrankError, match="stage\\(s\\) mine@nf failed"):
        pgrank_pipeline(datasets=["sci", "nf"], params_file=str(toy / "params.yaml"))
    runs = task_runs(latest_flow_run("pgrank-pipeline").id)
    states = {t.name: t.state for t in runs}
    assert set(states) == TOY_STAGES
    assert states["mine@nf"].is_failed()
    assert all(states[s].is_completed() for s in ("download", "mine@sci", "train@w", "evaluate@bm25-sci", "evaluate@w-sci"))
    assert not any(states[s].is_completed() for s in ("evaluate@bm25-nf", "evaluate@w-nf", "tables"))
    assert (toy / "evals" / "w-sci.txt").is_file() and not (toy / "tables.txt").exists()
    assert "failing on purpose" in task_log(next(t for t in runs if t.name == "mine@nf"))


@pytest.mark.slow  # serves from its own process and runs the toy pipeline through the server
def test_schedule_serves_a_deployment_with_the_cron_schedule_that_runs(prefect_server, toy):
    from prefect import get_client

    from flows.pipeline import DEFAULT_MAX_WORKERS

    env = {**prefect_server.env, "PREFECT_RUNNER_POLL_FREQUENCY": "1"}
    serving = subprocess.Popen([sys.executable, str(ROOT / "cli.py"), "--params", str(toy / "params.yaml"), "schedule",
                                "--cron", "0 3 * * 0", "--name", "served-test"], cwd=ROOT, env=env, text=True,
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True)
    try:
        deployment, deadline = None, time.monotonic() + 120
        with get_client(sync_client=True) as client:
            while deployment is None and time.monotonic() < deadline and serving.poll() is None:
                try:
                    deployment = client.read_deployment_by_name("pgrank-retrain/served-test")
                except Exception:  # not created yet
                    time.sleep(1)
            assert deployment is not None, serving.stderr.read() if serving.poll() is not None else "timed out"
            assert [s.schedule.cron for s in deployment.schedules] == ["0 3 * * 0"]
            assert deployment.parameters == {"profile": None, "overrides": [], "params_file": str(toy / "params.yaml"),
                                             "start_from": "warm_start", "max_workers": DEFAULT_MAX_WORKERS}
            assert deployment.entrypoint == "flows.retraining.pgrank_retrain"
            run = client.create_flow_run_from_deployment(deployment.id)  # what the schedule does each Sunday
            state = _wait_final(client, run.id, 180).state
        assert state.is_completed(), state
        assert (toy / "tables.txt").is_file()  # the served run ran the pipeline (tracking is off: no gate)
    finally:
        stop(serving)  # Ctrl-C: serve stops and pauses the schedule


# --------------------------------------------------------------------------------------- worker, end to end


@dataclass(frozen=True)
class WorkerRun:
    server: PrefectServer
    project: Path
    workspace: Path
    deployment: object
    flow_run: object
    pipeline_run: object
    again: object  # a second run, with nothing changed
    again_pipeline: object
    schedule_output: str
    shots: Path


@pytest.fixture(scope="module")
def worker_run(prefect_server, tmp_path_factory, beir_mirror, tiny_model_dir) -> WorkerRun:
    """The shrunk demo deployed to a process work pool with `pgrank schedule --pool`, run once by a real worker."""
    from prefect import get_client
    from prefect.client.schemas.filters import FlowRunFilter, FlowRunFilterParentFlowRunId

    tmp = tmp_path_factory.mktemp("worker")
    project = project_copy(tmp / "project")
    mirror = sliced_scifact_mirror(beir_mirror / "scifact.zip", tmp / "mirror")
    env = {**prefect_server.env, "PGRANK_BEIR_MIRROR": str(mirror), "PREFECT_WORKER_QUERY_SECONDS": "1",
           "PREFECT_WORKER_PREFETCH_SECONDS": "5"}
    for var in ("MLFLOW_TRACKING_URI", "PGRANK_PROFILE"):
        env.pop(var, None)
    created = subprocess.run(["prefect", "work-pool", "create", POOL, "--type", "process"], env=env, capture_output=True,
                             text=True)
    assert created.returncode == 0, created.stdout + created.stderr
    # A gate split to freeze; the tiny model is promoted without meeting its warm start (this test is about the worker).
    gated = ["data.gate_size=10", "champion.first=promote"]
    sets = [a for o in [*shrunk_overrides(tiny_model_dir), *gated] for a in ("--set", o)]
    scheduled = _cli(["--profile", "demo", *sets, "schedule", "--cron", "0 3 * * 0", "--pool", POOL, "--name", DEPLOYMENT],
                     project, env)  # default max_workers: every stage is submitted at once, upstream stages still running
    assert scheduled.returncode == 0, scheduled.stderr
    worker = subprocess.Popen(["prefect", "worker", "start", "--pool", POOL, "--type", "process"], cwd=tmp, env=env,
                              stdout=open(tmp / "worker.log", "w"), stderr=subprocess.STDOUT, start_new_session=True)
    try:
        with get_client(sync_client=True) as client:
            deployment = client.read_deployment_by_name(f"pgrank-retrain/{DEPLOYMENT}")
            runs = []
            for _ in range(2):  # what the schedule does each Sunday; the second time nothing has changed
                run = _wait_final(client, client.create_flow_run_from_deployment(deployment.id).id, 900)
                assert run.state.is_completed(), f"{run.state}\n{(tmp / 'worker.log').read_text()[-4000:]}"
                (pipeline,) = client.read_flow_runs(flow_run_filter=FlowRunFilter(
                    parent_flow_run_id=FlowRunFilterParentFlowRunId(any_=[run.id])))
                runs += [run, pipeline]
    finally:
        stop(worker)
    return WorkerRun(prefect_server, project, project / "runs" / "demo", deployment, *runs, scheduled.stdout,
                     tmp / "screenshots")


@pytest.mark.slow  # the shrunk demo, run twice by a real worker: about 5 minutes on 2 cores
@pytest.mark.integration
@pytest.mark.timeout(1800)  # whichever runs first sets up `worker_run`: the shrunk demo, run twice by the worker
def test_a_worker_runs_the_deployment_one_task_per_dvc_stage_with_logs_and_the_gate_artifact(worker_run):
    from mlflow.tracking import MlflowClient

    from pgrank.pipeline.workspace import run_dvc

    deployment, ws = worker_run.deployment, worker_run.workspace
    assert [s.schedule.cron for s in deployment.schedules] == ["0 3 * * 0"] and deployment.work_pool_name == POOL
    assert deployment.entrypoint == "flows.retraining.pgrank_retrain"
    assert f"deployment pgrank-retrain/{DEPLOYMENT} ({deployment.id}) in work pool '{POOL}'" in worker_run.schedule_output
    assert f"prefect worker start --pool {POOL}" in worker_run.schedule_output

    stages = run_dvc(["stage", "list", "--name-only"], ws, capture=True).stdout.split()
    tasks = task_runs(worker_run.pipeline_run.id)
    assert sorted(t.name for t in tasks) == sorted(stages)  # one task run per dvc.yaml stage
    assert all(t.state.is_completed() for t in tasks)
    for t in tasks:
        assert f"Running stage '{t.name}'" in task_log(t), t.name  # DVC's output, streamed into the task's log

    artifact = _gate_artifact(worker_run.flow_run.id)
    assert "# Champion gate: **Promoted**" in artifact
    assert "there was no champion yet" in artifact and "| **ndcg@10** |" in artifact

    client = MlflowClient(f"sqlite:///{ws / 'mlflow.db'}")
    version = client.get_model_version_by_alias("pgrank-retriever", "champion")
    assert version.tags["pgrank.gate"].startswith("promoted: there was no champion yet")
    gate_runs = client.search_runs([client.get_experiment_by_name("pgrank").experiment_id], "tags.stage = 'gate'")
    assert sorted(r.data.tags["pgrank.gate.decision"] for r in gate_runs) == ["kept", "promoted"]  # two runs
    assert client.get_registered_model("pgrank-retriever").tags["pgrank.gate_set"]  # the gate set is frozen


def _gate_artifact(flow_run_id) -> str:
    from prefect import get_client
    from prefect.client.schemas.filters import ArtifactFilter, ArtifactFilterFlowRunId, ArtifactFilterKey

    from flows.retraining import ARTIFACT_KEY

    with get_client(sync_client=True) as client:
        (artifact,) = client.read_artifacts(artifact_filter=ArtifactFilter(
            key=ArtifactFilterKey(any_=[ARTIFACT_KEY]), flow_run_id=ArtifactFilterFlowRunId(any_=[flow_run_id])))
    assert artifact.type == "markdown"
    return artifact.data


@pytest.mark.slow  # the shrunk demo, run twice by a real worker: about 5 minutes on 2 cores
@pytest.mark.integration
@pytest.mark.timeout(1800)  # whichever runs first sets up `worker_run`: the shrunk demo, run twice by the worker
def test_a_run_with_nothing_changed_retrains_nothing_and_keeps_the_champion_for_that_reason(worker_run):
    from mlflow.tracking import MlflowClient

    tasks = task_runs(worker_run.again_pipeline.id)
    assert all(t.state.is_completed() for t in tasks) and len(tasks) == len(task_runs(worker_run.pipeline_run.id))
    ran = [t.name for t in tasks if "Running stage" in task_log(t)]
    assert ran == ["download"]  # it re-fingerprints the data; DVC skips every other stage
    assert "# Champion gate: **Kept the champion**" in _gate_artifact(worker_run.again.id)
    assert "nothing was retrained: this run registered no new model version" in _gate_artifact(worker_run.again.id)
    client = MlflowClient(f"sqlite:///{worker_run.workspace / 'mlflow.db'}")
    assert str(client.get_model_version_by_alias("pgrank-retriever", "champion").version) == "1"


@pytest.mark.slow  # the shrunk demo, run twice by a real worker: about 5 minutes on 2 cores
@pytest.mark.integration
@pytest.mark.timeout(1800)  # whichever runs first sets up `worker_run`: the shrunk demo, run twice by the worker
def test_each_task_runs_only_after_its_upstream_stages_finished(worker_run):
    from flows.pipeline import stage_graph

    tasks = {t.name: t for t in task_runs(worker_run.pipeline_run.id)}
    graph = stage_graph(worker_run.workspace)
    checked = 0
    for stage, upstream in graph.items():
        for u in upstream:
            # Pending while its inputs are produced (wait_for), Running only while its own DVC stage runs.
            assert tasks[stage].start_time >= tasks[u].end_time, (stage, u, tasks[stage].start_time, tasks[u].end_time)
            checked += 1
    assert checked >= 10
    # Submitted at once, so a task exists (Pending) while its upstream stages run; it starts only after them.
    train, mine = tasks["train@minilm-pg"], tasks["mine-train"]
    assert train.created < mine.end_time <= train.start_time  # its bar begins when its own stage does


def _chromium(url: str, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
                           "--disable-dev-shm-usage", "--virtual-time-budget=20000", "--window-size=1400,900", *args, url],
                          capture_output=True, text=True, timeout=180)


@pytest.mark.slow  # the shrunk demo, run twice by a real worker: about 5 minutes on 2 cores
@pytest.mark.integration
@pytest.mark.timeout(1800)  # whichever runs first sets up `worker_run`: the shrunk demo, run twice by the worker
@pytest.mark.skipif(CHROMIUM is None, reason="no chromium (Debian: apt-get install chromium)")
def test_the_ui_shows_the_deployment_and_the_completed_run(worker_run):
    ui, shots = worker_run.server.ui, worker_run.shots
    shots.mkdir(exist_ok=True)
    pages = {"deployment": (f"{ui}/deployments/deployment/{worker_run.deployment.id}", DEPLOYMENT),
             "flow-run": (f"{ui}/runs/flow-run/{worker_run.flow_run.id}", worker_run.flow_run.name),
             "pipeline-run": (f"{ui}/runs/flow-run/{worker_run.pipeline_run.id}", worker_run.pipeline_run.name)}
    for page, (url, name) in pages.items():
        dom = _chromium(url, "--dump-dom").stdout
        assert name in dom, (page, dom[-2000:])
        if page != "deployment":
            assert "Completed" in dom, dom[-2000:]  # the run's state
        else:
            assert "At 03:00 AM, only on Sunday" in dom and POOL in dom  # its schedule and work pool
        png = shots / f"{page}.png"
        _chromium(url, f"--screenshot={png}")
        assert png.is_file() and png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and png.stat().st_size > 20_000
    keep = os.environ.get("PGRANK_SCREENSHOTS")
    if keep:
        Path(keep).mkdir(parents=True, exist_ok=True)
        for png in shots.glob("*.png"):
            shutil.copy(png, Path(keep) / png.name)


def test_stages_that_run_a_model_hold_a_device_slot_one_at_a_time(prefect_server, toy):
    """The toy's mine@sci, mine@nf and train@w run a model: with one pgrank-device slot they never overlap."""
    from prefect import get_client

    from flows.pipeline import DEVICE_TAG, ensure_device_limit, pgrank_pipeline

    pgrank_pipeline(datasets=["sci", "nf"], params_file=str(toy / "params.yaml"), max_workers=8, device_slots=1)
    with get_client(sync_client=True) as client:
        assert client.read_concurrency_limit_by_tag(DEVICE_TAG).concurrency_limit == 1  # created by the flow
    assert ensure_device_limit(5) == 1  # an existing limit is the user's: kept
    runs = {t.name: t for t in task_runs(latest_flow_run("pgrank-pipeline").id)}
    device = sorted((runs[s].start_time, runs[s].end_time) for s in ("mine@sci", "mine@nf", "train@w"))
    assert all(end <= start for (_, end), (start, _) in zip(device, device[1:])), device
    assert runs["train@w"].tags == [DEVICE_TAG] and runs["download"].tags == []


def test_a_gate_concurrency_limit_of_several_slots_is_corrected_to_one_and_the_run_says_so(prefect_server):
    from prefect.client.orchestration import get_client

    from flows.retraining import GATE_TAG, ensure_gate_limit

    with get_client(sync_client=True) as client:
        client.create_concurrency_limit(tag=GATE_TAG, concurrency_limit=3)  # made by hand, too large
    slots, note = ensure_gate_limit()
    assert slots == 3 and note.startswith(f"corrected the {GATE_TAG} concurrency limit from 3 slots to 1")
    with get_client(sync_client=True) as client:
        assert client.read_concurrency_limit_by_tag(GATE_TAG).concurrency_limit == 1
    assert ensure_gate_limit() == (1, None)  # right as it is: nothing said
