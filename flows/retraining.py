"""Scheduled retraining: re-run the pipeline, then promote the new model only if it is better.

Each run of :func:`pgrank_retrain`

1. runs :func:`flows.pipeline.pgrank_pipeline` (a subflow; DVC re-runs only what changed),
2. compares the validation nDCG@10 of the versions its training stages registered (or, when nothing
   was retrained, the newest version) with the current champion's in MLflow,
3. moves ``tracking.champion_alias`` on ``tracking.registered_model`` only on improvement
   (:func:`pgrank.pipeline.champion.promote_if_better`).

:func:`serve` (``pgrank schedule --cron ...``) serves a deployment of it with a cron schedule
against the Prefect server at ``PREFECT_API_URL``; start one with::

    prefect server start --host 127.0.0.1          # UI and API on http://127.0.0.1:4200
    prefect config set PREFECT_API_URL=http://127.0.0.1:4200/api
    pgrank --profile demo schedule --cron "0 3 * * 0"   # Sundays 03:00 UTC; Ctrl-C stops serving
"""

# No `from __future__ import annotations`: Prefect validates flow parameters from their annotations,
# and a flow run started by a served deployment cannot resolve postponed (string) ones.

from pathlib import Path

from prefect import flow, get_run_logger, task
from prefect.cache_policies import NO_CACHE

from flows.pipeline import pgrank_pipeline
from pgrank.errors import PgrankError
from pgrank.pipeline.champion import Decision, promote_if_better, versions_of_run

FLOW_NAME = "pgrank-retrain"


@task(cache_policy=NO_CACHE)
def promote_champion(workspace: str, parent_run_id: str | None) -> Decision:
    """Promote the best model a pipeline run registered if it beats the champion (see the module docstring)."""
    from mlflow.tracking import MlflowClient

    from pgrank.config import load_params
    from pgrank.paths import Paths
    from pgrank.tracking import tracking_uri

    params = load_params(Path(workspace) / "params.yaml")
    if not params.tracking.enabled:
        return Decision(False, "tracking.enabled is false: no registry to compare in")
    client = MlflowClient(tracking_uri(params, Paths.from_config(params.paths, base=workspace)))
    name, alias = params.tracking.registered_model, params.tracking.champion_alias
    new = versions_of_run(client, name, parent_run_id) if parent_run_id else []
    decision = promote_if_better(client, name, alias, candidates=new or None)
    get_run_logger().info("%s: %s", name, decision.message)
    return decision


@flow(name=FLOW_NAME)
def pgrank_retrain(profile: str | None = None, overrides: list[str] | None = None,
                   params_file: str = "params.yaml") -> Decision:
    """Re-run the pipeline for a profile and promote its model to champion only on improvement."""
    run = pgrank_pipeline(profile=profile, overrides=list(overrides or []), params_file=params_file)
    return promote_champion(run.workspace, run.mlflow_run_id)


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


def serve(params_file: str | Path, profile: str | None, overrides: list[str], cron: str, *,
          name: str | None = None, timezone: str = "UTC") -> None:
    """Serve a deployment of :func:`pgrank_retrain` with a cron schedule until interrupted (``pgrank schedule``).

    The deployment is ``pgrank-retrain/<name>`` (default ``retrain-<profile or paper>``); its
    parameters are this profile, these overrides and the absolute params file. Scheduled runs execute
    in this process's environment; stopping it pauses the schedule.
    """
    from prefect.types.entrypoint import EntrypointType

    schedule = cron_schedule(cron, timezone)
    check_server()
    pgrank_retrain.serve(
        name=name or f"retrain-{profile or 'paper'}",
        schedule=schedule,
        parameters={"profile": profile, "overrides": list(overrides), "params_file": str(Path(params_file).resolve())},
        description=f"Scheduled retraining ({profile or 'paper'} profile): pipeline, then champion promotion on improvement.",
        entrypoint_type=EntrypointType.MODULE_PATH,  # flows.retraining.pgrank_retrain, importable where pgrank is installed
    )
