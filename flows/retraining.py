"""Scheduled retraining: re-run the pipeline, then promote the new model only if it passes a fair gate.

A thin Prefect wrapper of :mod:`pgrank.pipeline.retraining`, as :mod:`flows.pipeline` is of the pipeline.
Each run of :func:`pgrank_retrain`

1. adds its overrides (:func:`pgrank.pipeline.retraining.retraining_overrides`): the frozen gate set's
   judgments as ``data.holdout``, so gate queries stay the gate split, never trained on nor used for
   selection; with ``start_from="champion"`` the current champion, fetched from the registry, as the warm
   start (continual training);
2. runs :func:`flows.pipeline.pgrank_pipeline` (a subflow; DVC re-runs only what changed: new
   judgments or documents in a dataset of your own re-run its stages, unchanged data re-runs nothing);
3. gates the versions this run registered (:func:`pgrank.pipeline.retraining.gate_workspace`): the best
   on the selection split (validation nDCG@10) and its baseline (the champion; with none yet, its warm
   start) are evaluated side by side on one fixed gate set, and the alias ``tracking.champion_alias``
   moves only if the challenger beats the baseline on ``champion.metric`` by more than
   ``champion.min_gain`` with a one-sided test of the mean gain, ``p`` below the decision's level (the yearly error
   budget's, ``champion.budget``, or ``champion.alpha``): one test per decision. One gate runs at
   a time (a lease in the registry, and the ``pgrank-gate`` concurrency limit, one slot, corrected if larger),
   holding a ``pgrank-device`` slot; the decision is recorded in the registry before
   the alias moves (:mod:`pgrank.pipeline.decisions`), and its table goes to MLflow (run tags, metrics,
   ``gate/decision.md``) and to this flow run as the markdown artifact ``champion-gate``.

``pgrank schedule --cron ...`` puts it on a schedule against the Prefect server at ``PREFECT_API_URL``,
either served from that process (:func:`serve`) or deployed to a process work pool that
``prefect worker start --pool NAME`` runs (:func:`deploy`)::

    prefect server start --host 127.0.0.1                     # UI and API on http://127.0.0.1:4200
    prefect config set PREFECT_API_URL=http://127.0.0.1:4200/api
    prefect work-pool create pgrank --type process
    pgrank --profile demo --set data.gate_size=300 schedule --cron "0 3 * * 0" --pool pgrank
    prefect worker start --pool pgrank
"""

# No `from __future__ import annotations`: Prefect validates flow parameters from their annotations,
# and a flow run started by a deployment cannot resolve postponed (string) ones.

from pathlib import Path

from prefect import flow, get_run_logger, task
from prefect.cache_policies import NO_CACHE

from flows.pipeline import DEFAULT_MAX_WORKERS, DEVICE_TAG, pgrank_pipeline
from pgrank.errors import PgrankError
from pgrank.pipeline.champion import Decision
from pgrank.pipeline.retraining import START_FROM, StartFrom

FLOW_NAME = "pgrank-retrain"
ARTIFACT_KEY = "champion-gate"
GATE_TAG = "pgrank-gate"  # the gate task's tag, and its Prefect tag concurrency limit: one gate at a time


def ensure_gate_limit() -> tuple[int, str | None]:
    """The ``pgrank-gate`` tag concurrency limit with one slot: created if missing, corrected to one slot if a user
    made it larger (two gates at once would both read the same champion). Returns the slots it had and what was
    done, in words (``None``: it was right).

    Prefect holds a gate task that finds the slot taken in Pending, across every flow run on the server, so a
    manual run beside a scheduled one waits instead of racing it. Every gate also holds the lease in the registry
    (:func:`pgrank.pipeline.decisions.gate_lock`), inside Prefect or not.
    """
    from prefect.client.orchestration import get_client
    from prefect.exceptions import ObjectNotFound

    with get_client(sync_client=True) as client:
        try:
            slots = client.read_concurrency_limit_by_tag(GATE_TAG).concurrency_limit
        except ObjectNotFound:
            client.create_concurrency_limit(tag=GATE_TAG, concurrency_limit=1)
            return 0, f"created the {GATE_TAG} concurrency limit with one slot"
        if slots == 1:
            return 1, None
        client.create_concurrency_limit(tag=GATE_TAG, concurrency_limit=1)  # an upsert: the limit is corrected
        return slots, (f"corrected the {GATE_TAG} concurrency limit from {slots} slots to 1: one gate at a time "
                       "(the lease in the registry keeps it so regardless)")


@task(cache_policy=NO_CACHE)
def retraining_overrides(params_file: str, profile: str | None, overrides: list[str], start_from: StartFrom) -> list[str]:
    """Overrides this run adds: ``data.holdout`` (the frozen gate set) and, for continual training, the champion as warm start."""
    from pgrank.pipeline import retraining

    found = retraining.retraining_overrides(params_file, profile, overrides, start_from)
    for note in found.notes:
        get_run_logger().info("%s", note)
    return found.extra


@task(cache_policy=NO_CACHE, tags=[GATE_TAG, DEVICE_TAG])  # one gate at a time, and it runs models on the device
def champion_gate(workspace: str, parent_run_id: str | None) -> Decision:
    """Gate this run's best new model version against the champion (or its warm start) on the gate set; move the
    alias only if it passes."""
    from prefect.artifacts import create_markdown_artifact

    from pgrank.pipeline.retraining import gate_workspace

    decision = gate_workspace(Path(workspace), parent_run_id)
    create_markdown_artifact(key=ARTIFACT_KEY, markdown=decision.markdown(), description=decision.message[:500])
    get_run_logger().info("%s", decision.message)
    return decision


@flow(name=FLOW_NAME)
def pgrank_retrain(profile: str | None = None, overrides: list[str] | None = None,
                   params_file: str = "params.yaml", start_from: StartFrom = "warm_start",
                   max_workers: int | None = DEFAULT_MAX_WORKERS) -> Decision:
    """Re-run the pipeline for a profile and promote its new model only if it passes the champion gate.

    Args:
        profile: ``profiles/<name>.yaml`` laid over the params file (``None``: the paper).
        overrides: ``--set``-style ``key=value`` overrides.
        params_file: the project's params file.
        start_from: ``warm_start`` (train from ``train.warm_starts``) or ``champion`` (continual: train
            from the current champion version).
        max_workers: at most this many stages at once (default ``DEFAULT_MAX_WORKERS``; stages that run a
            model are bounded apart by the ``pgrank-device`` limit, see :mod:`flows.pipeline`).
    """
    overrides = list(overrides or [])
    extra = retraining_overrides(str(Path(params_file).resolve()), profile, overrides, start_from)
    run = pgrank_pipeline(profile=profile, overrides=overrides + extra, params_file=params_file, max_workers=max_workers)
    _, note = ensure_gate_limit()
    if note:
        get_run_logger().warning("%s", note)
    return champion_gate(run.workspace, run.mlflow_run_id)


# --------------------------------------------------------------------------------------- scheduling


def cron_schedule(cron: str, timezone: str = "UTC"):
    """A Prefect cron schedule; a bad cron string or time zone is a :class:`PgrankError`."""
    from prefect.client.schemas.schedules import CronSchedule
    from prefect.schedules import Cron
    from pydantic import ValidationError

    try:
        CronSchedule(cron=cron, timezone=timezone)  # Prefect's own validation, before anything is served
    except ValidationError as exc:
        hints = {"cron": "expected five fields, minute hour day-of-month month day-of-week, e.g. '0 3 * * 0' "
                         "(Sundays 03:00)"}
        problems = []
        for err in exc.errors():
            field = str(err["loc"][0]) if err.get("loc") else "cron"
            problems.append(f"--{field} {cron if field == 'cron' else timezone!r}: "
                            f"{err['msg'].removeprefix('Value error, ')}; {hints.get(field, '')}".rstrip("; "))
        raise PgrankError("\n".join(problems)) from None
    return Cron(cron, timezone=timezone)


def check_server() -> str:
    """The API URL of a reachable Prefect server, or a :class:`PgrankError` saying how to start one."""
    from prefect.client.orchestration import get_client
    from prefect.settings import PREFECT_API_URL

    url = PREFECT_API_URL.value()
    start = ("start one with `prefect server start --host 127.0.0.1` and point PREFECT_API_URL at it: "
             "`prefect config set PREFECT_API_URL=http://127.0.0.1:4200/api`")
    if not url:
        raise PgrankError(f"PREFECT_API_URL is not set: a schedule needs a Prefect server; {start}")
    with get_client(sync_client=True) as client:
        failure = client.api_healthcheck()
    if failure is not None:
        raise PgrankError(f"the Prefect server at {url} does not answer ({failure}); {start}")
    return url


def check_pool(pool: str) -> None:
    """A :class:`PgrankError` unless the work pool exists and is of the process type."""
    from prefect.client.orchestration import get_client
    from prefect.exceptions import ObjectNotFound

    create = f"create it with `prefect work-pool create {pool} --type process`"
    with get_client(sync_client=True) as client:
        try:
            work_pool = client.read_work_pool(pool)
        except ObjectNotFound:
            raise PgrankError(f"work pool {pool!r} does not exist on the Prefect server; {create}, then run "
                              f"`prefect worker start --pool {pool}` where pgrank is installed") from None
    if work_pool.type != "process":
        raise PgrankError(f"work pool {pool!r} is of type {work_pool.type!r}; pgrank deploys to a process work pool, "
                          "whose worker runs the flow where pgrank is installed: `prefect work-pool create NAME --type "
                          "process`")


def _deployment(params_file: str | Path, profile: str | None, overrides: list[str], cron: str, name: str | None,
                timezone: str, start_from: str, max_workers: int | None) -> dict:
    if start_from not in START_FROM:
        raise PgrankError(f"--start-from {start_from!r}: expected one of {', '.join(START_FROM)}")
    if max_workers is not None and max_workers < 1:
        raise PgrankError(f"--max-workers {max_workers}: expected at least 1")
    return dict(
        name=name or f"retrain-{profile or 'paper'}",
        schedule=cron_schedule(cron, timezone),
        parameters={"profile": profile, "overrides": list(overrides), "params_file": str(Path(params_file).resolve()),
                    "start_from": start_from, "max_workers": max_workers or DEFAULT_MAX_WORKERS},
        description=f"Scheduled retraining ({profile or 'paper'} profile, from the {start_from.replace('_', ' ')}): "
                    "the pipeline, then the champion gate.",
    )


def serve(params_file: str | Path, profile: str | None, overrides: list[str], cron: str, *,
          name: str | None = None, timezone: str = "UTC", start_from: str = "warm_start",
          max_workers: int | None = None) -> None:
    """Serve a deployment of :func:`pgrank_retrain` with a cron schedule until interrupted.

    The deployment is ``pgrank-retrain/<name>`` (default ``retrain-<profile or paper>``); scheduled runs
    execute in this process's environment; stopping it pauses the schedule.
    """
    from prefect.types.entrypoint import EntrypointType

    spec = _deployment(params_file, profile, overrides, cron, name, timezone, start_from, max_workers)
    check_server()
    pgrank_retrain.serve(**spec, entrypoint_type=EntrypointType.MODULE_PATH)


def deploy(params_file: str | Path, profile: str | None, overrides: list[str], cron: str, *, pool: str,
           name: str | None = None, timezone: str = "UTC", start_from: str = "warm_start",
           max_workers: int | None = None) -> str:
    """Create (or update) the deployment in a process work pool; returns its id.

    The schedule lives in the Prefect server; ``prefect worker start --pool POOL``, started where pgrank
    is installed, runs each scheduled run as a subprocess in the project folder. Nothing keeps running here.
    """
    from prefect.types.entrypoint import EntrypointType

    spec = _deployment(params_file, profile, overrides, cron, name, timezone, start_from, max_workers)
    check_server()
    check_pool(pool)
    project = Path(params_file).resolve().parent
    deployment_id = pgrank_retrain.deploy(
        **spec, work_pool_name=pool, build=False, push=False, job_variables={"working_dir": str(project)},
        entrypoint_type=EntrypointType.MODULE_PATH,  # flows.retraining.pgrank_retrain, importable where pgrank is installed
        print_next_steps=False, ignore_warnings=True)
    return str(deployment_id)
