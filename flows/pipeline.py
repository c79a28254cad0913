"""The pipeline as a Prefect flow whose tasks are ``dvc.yaml``'s stages, read from DVC at run time.

No second copy of the DAG exists here. The flow prepares the profile's DVC workspace
(:func:`pgrank.pipeline.workspace.prepare`), then asks DVC for its stages (``dvc stage list --name-only``) and
edges (``dvc dag --dot``), and submits one task per stage. Each task runs
``dvc --wait-for-lock repro --single-item <stage>``: DVC skips a stage that is up to date, records it
in ``dvc.lock``, and releases its repository lock while the stage's command runs, so independent
stages (for example the per-dataset evaluations) run in parallel through the task runner. Each task
is submitted with the futures of the stages upstream of it as Prefect dependencies (``wait_for=``): it
stays Pending until they are done and is Running only while its own DVC stage runs, so the flow-run
graph shows what ran when. It streams DVC's output into its run logger (the task's logs in the UI).

* Retries: the ``download`` stage (network) retries with exponential backoff.
* MLflow: the flow opens the pipeline's parent run (:func:`pgrank.pipeline.workspace.pipeline_run`) and hands
  its id to every stage, so stage runs nest under it exactly as under ``pgrank repro``.
* Task runners: ``threads`` (default, ``ThreadPoolTaskRunner``), ``dask`` (``pip install 'pgrank[dask]'``,
  ``prefect_dask.DaskTaskRunner`` on a local cluster) and ``ray`` (``pip install 'pgrank[ray]'``,
  ``prefect_ray.RayTaskRunner``). Tasks only start DVC processes, so threads are enough on one machine.
* Bounded concurrency by default: at most ``max_workers`` stages at once (default
  :data:`DEFAULT_MAX_WORKERS`), and the stages that run a model (mining, training, dense and sparse
  evaluation: :data:`DEVICE_STAGES`) are tagged ``pgrank-device``, a Prefect tag concurrency limit:
  Prefect's task engine holds one of its slots from the moment such a task is Running until it ends
  (a task waiting for a slot stays Pending), across every flow run on the server (a scheduled
  retraining next to a manual run). The flow creates the limit when it is missing, with one slot per
  CUDA device (one on a CPU-only machine) or ``device_slots``; an existing limit is left as the user
  set it. Raise it with ``prefect concurrency-limit create pgrank-device 4`` (or ``device_slots=4``
  on a server that has no such limit yet).

Example:
    >>> from flows.pipeline import pgrank_pipeline
    >>> run = pgrank_pipeline(profile="demo", datasets=["scifact"], task_runner="threads")
    >>> run.workspace, run.stages[-1]
    ('/path/to/pgrank/runs/demo', 'tables')
"""

# No `from __future__ import annotations`: Prefect validates flow parameters from their annotations,
# and a flow run started by a served deployment cannot resolve postponed (string) ones.

import logging
import re
import subprocess
from collections import deque
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from graphlib import TopologicalSorter
from pathlib import Path
from typing import Any, Literal

from prefect import flow, get_run_logger, task
from prefect.cache_policies import NO_CACHE
from prefect.exceptions import MissingContextError
from prefect.futures import wait
from prefect.tasks import exponential_backoff

from pgrank.errors import PgrankError
from pgrank.pipeline.workspace import dvc_executable, pipeline_run, prepare, run_dvc, stage_environment
from pgrank.tracking import PARENT_ENV

# Per-stage task options: the download stage talks to the network, so it retries (10 s, 20 s, 40 s).
STAGE_OPTIONS: dict[str, dict[str, Any]] = {
    "download": {"retries": 3, "retry_delay_seconds": exponential_backoff(backoff_factor=10),
                 "retry_jitter_factor": 0.2},
}
# dvc.yaml's per-dataset stage is `foreach: data.eval_sets` named `mine@<dataset>`; every other
# per-dataset stage is downstream of it, which is how `datasets` selects stages without a second DAG.
DATASET_STAGE = "mine"
# Readable task logs: tqdm bars (in stage commands) redraw at most every few seconds in a pipe.
STAGE_ENV = {"PYTHONUNBUFFERED": "1", "TQDM_MININTERVAL": "5"}

_EDGE = re.compile(r'^\s*"([^"]+)"\s*->\s*"([^"]+)"')

TaskRunnerName = Literal["threads", "dask", "ray"]

# Stages that run a model on the accelerator (the part of the name before "@"); the others (download,
# BM25 evaluation, tables) are CPU and I/O only.
DEVICE_STAGES = ("mine-train", "mine", "train", "train-seeds", "evaluate-dense", "evaluate-sparse", "evaluate-policy",
                 "evaluate-policy-seeds")
DEVICE_TAG = "pgrank-device"  # the task tag of those stages, and its Prefect tag concurrency limit
DEFAULT_MAX_WORKERS = 4  # stages at once: DVC processes, each of which may use every core


def uses_device(stage: str) -> bool:
    return stage.split("@")[0] in DEVICE_STAGES


def device_count() -> int:
    """CUDA devices visible here (at least 1: a CPU-only machine is one device)."""
    import torch

    return max(1, torch.cuda.device_count())


def ensure_device_limit(slots: int | None = None) -> int:
    """Create the ``pgrank-device`` tag concurrency limit if missing; return its limit.

    An existing limit is kept as configured (``prefect concurrency-limit create pgrank-device N``).
    """
    from prefect.client.orchestration import get_client
    from prefect.exceptions import ObjectNotFound

    with get_client(sync_client=True) as client:
        try:
            return client.read_concurrency_limit_by_tag(DEVICE_TAG).concurrency_limit
        except ObjectNotFound:
            limit = slots or device_count()
            client.create_concurrency_limit(tag=DEVICE_TAG, concurrency_limit=limit)
            return limit


@dataclass(frozen=True)
class PipelineRun:
    """What one flow run did: the DVC workspace, the stages it ran (in submission order), the MLflow parent run."""

    workspace: str
    stages: list[str]
    mlflow_run_id: str | None


def stage_graph(ws: Path) -> dict[str, list[str]]:
    """Every stage of the workspace's ``dvc.yaml`` mapped to the stages directly upstream of it (from DVC)."""
    names = run_dvc(["stage", "list", "--name-only"], ws, capture=True).stdout.split()
    upstream: dict[str, list[str]] = {name: [] for name in names}
    for line in run_dvc(["dag", "--dot"], ws, capture=True).stdout.splitlines():
        edge = _EDGE.match(line)
        if edge and edge[1] in upstream and edge[2] in upstream:
            upstream[edge[2]].append(edge[1])
    return upstream


def select_datasets(graph: Mapping[str, list[str]], datasets: list[str] | None) -> dict[str, list[str]]:
    """Drop the per-dataset stages of datasets not in ``datasets`` (``None``: keep every stage).

    A fanned-out stage (``name@key``) belongs to the datasets whose ``mine@<dataset>`` stage it is or
    descends from; it is kept when one of them is selected, or when it descends from none (for
    example ``train@<warm start>``). Stages that are not fanned out (download, tables) are always kept.
    """
    order = list(TopologicalSorter(graph).static_order())
    if datasets is None:
        return {stage: list(graph[stage]) for stage in order}
    prefix = f"{DATASET_STAGE}@"
    available = sorted(s.removeprefix(prefix) for s in graph if s.startswith(prefix))
    unknown = [d for d in datasets if d not in available]
    if unknown:
        raise PgrankError(f"datasets {unknown}: not in this pipeline's data.eval_sets; available: {', '.join(available)}")
    mines: dict[str, set[str]] = {}
    for stage in order:
        mines[stage] = set().union(*(mines[u] for u in graph[stage]), {stage} if stage.startswith(prefix) else set())
    wanted = {prefix + d for d in datasets}
    kept: dict[str, list[str]] = {}
    for stage in order:
        if "@" not in stage or not mines[stage] or mines[stage] & wanted:
            kept[stage] = [u for u in graph[stage] if u in kept]
    return kept


def _logger() -> logging.Logger | logging.LoggerAdapter:
    try:
        return get_run_logger()
    except MissingContextError:  # called as a plain function (`dvc_stage.fn`)
        return logging.getLogger("pgrank.flows")


@task(cache_policy=NO_CACHE)
def dvc_stage(workspace: str, stage: str, parent_run_id: str | None = None) -> str:
    """``dvc repro --single-item STAGE`` in the workspace, its output streamed into the task's log.

    Returns the stage name. Raises :class:`PgrankError` with the last lines of output when DVC fails.
    """
    env = stage_environment(STAGE_ENV)
    exe = dvc_executable(env)
    if parent_run_id:
        env[PARENT_ENV] = parent_run_id
    log = _logger()
    tail: deque[str] = deque(maxlen=8)
    cmd = [exe, "--wait-for-lock", "repro", "--single-item", stage]
    with subprocess.Popen(cmd, cwd=workspace, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                          text=True, errors="replace", bufsize=1) as proc:
        assert proc.stdout is not None
        for line in proc.stdout:  # text mode splits on "\r" too: each progress redraw is a line
            if line := line.rstrip():
                log.info(line)
                tail.append(line)
        code = proc.wait()
    if code != 0:
        raise PgrankError(f"stage {stage}: `dvc repro --single-item {stage}` failed in {workspace} (exit {code}):\n"
                          + "\n".join(tail))
    return stage


def stage_task(stage: str):
    """The task of one stage: named after it, with its options (retries for download) and, for a stage
    that runs a model, the ``pgrank-device`` tag."""
    return dvc_stage.with_options(name=stage, task_run_name=stage, tags={DEVICE_TAG} if uses_device(stage) else set(),
                                  **STAGE_OPTIONS.get(stage, {}))


def _threads(max_workers: int | None):
    from prefect.task_runners import ThreadPoolTaskRunner

    return ThreadPoolTaskRunner(max_workers=max_workers)


def _dask(max_workers: int | None):
    try:
        from prefect_dask import DaskTaskRunner
    except ImportError as exc:
        raise PgrankError("task_runner='dask' needs prefect-dask: pip install 'pgrank[dask]'") from exc
    cluster = {"n_workers": max_workers, "threads_per_worker": 1} if max_workers else None
    return DaskTaskRunner(cluster_kwargs=cluster)


def _ray(max_workers: int | None):
    try:
        from prefect_ray import RayTaskRunner
    except ImportError as exc:
        raise PgrankError("task_runner='ray' needs prefect-ray: pip install 'pgrank[ray]'") from exc
    return RayTaskRunner(init_kwargs={"num_cpus": max_workers} if max_workers else None)


TASK_RUNNERS: dict[str, Callable[[int | None], Any]] = {"threads": _threads, "dask": _dask, "ray": _ray}


def make_task_runner(name: str, max_workers: int | None = None):
    """The Prefect task runner called ``name`` (threads, dask, ray); extras are imported only when asked for."""
    if name not in TASK_RUNNERS:
        raise PgrankError(f"task_runner={name!r}: expected one of {', '.join(TASK_RUNNERS)}")
    return TASK_RUNNERS[name](max_workers)


@flow(name="pgrank-pipeline")
def pgrank_pipeline(
    profile: str | None = None,
    datasets: list[str] | None = None,
    overrides: list[str] | None = None,
    task_runner: TaskRunnerName = "threads",
    max_workers: int | None = DEFAULT_MAX_WORKERS,
    params_file: str = "params.yaml",
    device_slots: int | None = None,
) -> PipelineRun:
    """Run ``dvc.yaml``'s stages for a profile, one Prefect task per stage.

    Args:
        profile: ``profiles/<name>.yaml`` laid over the params file (``None``: the paper).
        datasets: only the per-dataset stages of these ``data.eval_sets`` datasets (``None``: all).
        overrides: ``--set``-style ``key=value`` overrides.
        task_runner: ``threads``, ``dask`` or ``ray`` (the last two need the extras of the same name).
        max_workers: at most this many stages at once (``None``: the runner's own default, unbounded
            in practice for threads).
        params_file: the project's params file (relative to the working directory).
        device_slots: the ``pgrank-device`` limit to create when the server has none (default: one per
            CUDA device); stages that run a model hold one slot each.
    """
    overrides = list(overrides or [])
    log = get_run_logger()
    ws = prepare(params_file, profile, overrides)
    graph = select_datasets(stage_graph(ws), datasets)
    log.info("workspace %s: %d stages from dvc.yaml", ws, len(graph))
    if any(uses_device(stage) for stage in graph):
        log.info("stages that run a model share %d %s slot(s)", ensure_device_limit(device_slots), DEVICE_TAG)
    with pipeline_run(ws, profile, overrides) as parent_run_id:
        futures: dict[str, Any] = {}
        with make_task_runner(task_runner, max_workers) as runner:
            for stage, upstream in graph.items():  # topological: every upstream future exists already
                futures[stage] = runner.submit(stage_task(stage),
                                               {"workspace": str(ws), "stage": stage, "parent_run_id": parent_run_id},
                                               wait_for=[futures[u] for u in upstream])
            wait(list(futures.values()))
        unfinished = [stage for stage, future in futures.items() if not future.state.is_completed()]
        if unfinished:
            failed = [stage for stage in unfinished if futures[stage].state.is_failed()]
            raise PgrankError(f"pipeline in {ws}: stage(s) {', '.join(failed) or '?'} failed; not run: "
                              f"{', '.join(s for s in unfinished if s not in failed) or 'none'} (see the task logs)")
    return PipelineRun(str(ws), list(graph), parent_run_id)
