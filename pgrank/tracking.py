"""MLflow tracking, kept at the edges: stage functions call this module, the math never does.

* Store: ``MLFLOW_TRACKING_URI`` if set, else ``tracking.uri``, else an sqlite file under
  ``paths.root`` at an absolute URI (MLflow's own default depends on the working directory). An sqlite store's
  experiment keeps its artifacts in ``mlartifacts/`` beside the database (:func:`artifact_root`), never in the
  working directory of the process that created it.
* Runs: each stage process opens one :func:`stage_run` (``resources=True``). When
  ``PGRANK_MLFLOW_PARENT_RUN_ID`` is set (the pipeline driver sets it), it is nested under that parent
  run, so one pipeline execution is one parent run with one nested run per stage process; a run opened
  while another is active in the process (evaluation's per-split results) nests under that one.
* Resources: every stage process records its wall time and peak resident memory
  (:func:`process_resources`) as metrics of its stage run (``wall_seconds``, ``peak_rss_mib``,
  ``peak_rss_children_mib``) and in a log line, also with tracking off.
* Metric names: MLflow rejects ``@``; :func:`metric_name` writes ``ndcg@10`` as ``ndcg_at_10``.
* Killed runs: a process killed by SIGKILL (preemption, OOM killer) never ends its run, which would
  show ``RUNNING`` forever. Every run records its process (tag ``pgrank.process``: host, PID, start
  time); whenever a stage opens the store, :func:`end_orphaned_runs` marks ``KILLED`` the running runs
  whose process is gone.
* Stopped runs: a run that a stop signal ends (Ctrl-C's ``KeyboardInterrupt`` in a stage, :class:`Stopped` in
  the pipeline driver) ends ``KILLED``, as do the running runs of the processes the stop has ended.
* Spooled runs: importing MLflow and opening an sqlite store takes longer than a small evaluation's
  work. The download, mining and evaluation stages open their runs with ``spool=True``: inside a pipeline (DVC's
  ``DVC_STAGE``, or the driver's parent run in the environment) such a run does not load MLflow: the run, its
  nested runs, parameters, metrics, artifacts' paths and start and end times are
  written as one JSON file to ``Paths.mlflow_spool`` when it ends (atomically; a killed stage leaves none). The next
  process that opens the store (the ``tables`` stage, a training stage, the pipeline's parent run as it ends) writes
  the spooled runs into it as they were, nested where they were, and removes the files
  (:func:`flush_spool`). ``pgrank evaluate`` run by hand, outside a pipeline, logs to the store itself.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import re
import resource
import socket
import time
import uuid
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from types import SimpleNamespace
from typing import Any

from pgrank.config import Params
from pgrank.errors import PgrankError, Stopped
from pgrank.paths import MLFLOW_ARTIFACTS as ARTIFACTS
from pgrank.paths import Paths

PARENT_ENV = "PGRANK_MLFLOW_PARENT_RUN_ID"
PROCESS_TAG = "pgrank.process"
SPOOL_TAG = "pgrank.spooled"  # a spooled run's file and place in it: a reclaimed file is never written twice
SPOOL_FORMAT = "pgrank-mlflow-spool/1"

log = logging.getLogger(__name__)


def process_resources() -> dict[str, float]:
    """This process's wall time so far and peak resident memory (its own and its children's), in MiB."""
    import psutil

    return {
        "wall_seconds": time.time() - psutil.Process().create_time(),
        "peak_rss_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,  # Linux: KiB
        "peak_rss_children_mib": resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024,
    }


def tracking_uri(params: Params, paths: Paths) -> str:
    return os.environ.get("MLFLOW_TRACKING_URI") or params.tracking.uri or paths.mlflow_uri()


def metric_name(name: str) -> str:
    """``ndcg@10`` -> ``ndcg_at_10``; any other character MLflow rejects becomes ``_``."""
    return re.sub(r"[^\w\-. /]", "_", name.replace("@", "_at_"))


def flatten(obj: Any, prefix: str = "") -> dict[str, str]:
    """Dotted ``key -> str(value)`` pairs of a nested mapping (for ``log_params``)."""
    if isinstance(obj, Mapping):
        out: dict[str, str] = {}
        for k, v in obj.items():
            out.update(flatten(v, f"{prefix}{k}."))
        return out
    return {prefix.rstrip("."): str(obj)[:6000]}


def configure(params: Params, paths: Paths) -> None:
    import mlflow

    uri = tracking_uri(params, paths)
    if uri.startswith("sqlite:///"):
        os.makedirs(os.path.dirname(uri.removeprefix("sqlite:///")), exist_ok=True)
    mlflow.set_tracking_uri(uri)
    experiment = mlflow.set_experiment(experiment_id=_experiment_id(params.tracking.experiment, uri))
    end_orphaned_runs(experiment.experiment_id)
    flush_spool(paths.mlflow_spool, uri)


def artifact_root(uri: str) -> str | None:
    """Where a new experiment of an sqlite store keeps its artifacts: ``mlartifacts/`` beside the database file (MLflow's
    own default, ``./mlruns``, is resolved against the working directory of whichever process creates the experiment:
    the project's root when ``pgrank repro`` runs there). ``None`` for a server, which decides for itself."""
    if not uri.startswith("sqlite:///"):
        return None
    return (Path(uri.removeprefix("sqlite:///")).resolve().parent / ARTIFACTS).as_uri()


def _experiment_id(name: str, uri: str) -> str:
    """The experiment ``name``'s id, created with :func:`artifact_root`'s location when it does not exist (a stage that
    creates it at the same moment as another finds the other's)."""
    import mlflow
    from mlflow.exceptions import MlflowException

    client = mlflow.MlflowClient(uri)
    for _ in range(2):
        found = client.get_experiment_by_name(name)
        if found is not None:
            return found.experiment_id
        try:
            return client.create_experiment(name, artifact_location=artifact_root(uri))
        except MlflowException:  # created by another process in between
            continue
    raise PgrankError(f"MLflow store {uri}: experiment {name!r} could not be created or found")


def this_process() -> str:
    """``host:pid:start time`` of this process (the value of the ``pgrank.process`` tag)."""
    import psutil

    return f"{socket.gethostname()}:{os.getpid()}:{psutil.Process().create_time():.2f}"


def _gone(process: str) -> bool:
    """Whether the process a ``pgrank.process`` tag names has ended (False for other hosts: unknown)."""
    import psutil

    host, pid, started = process.rsplit(":", 2)
    if host != socket.gethostname():
        return False
    try:
        return f"{psutil.Process(int(pid)).create_time():.2f}" != started  # a reused PID is another process
    except (psutil.NoSuchProcess, ValueError):
        return True


def end_orphaned_runs(experiment_id: str) -> list[str]:
    """Mark ``KILLED`` the ``RUNNING`` runs of an experiment whose process is gone; return their ids."""
    import mlflow

    client = mlflow.MlflowClient()
    ended = []
    for run in client.search_runs([experiment_id], "attributes.status = 'RUNNING'", max_results=1000):
        process = run.data.tags.get(PROCESS_TAG)
        if process and _gone(process):
            client.set_tag(run.info.run_id, "pgrank.ended", "its process was killed; marked by a later stage")
            client.set_terminated(run.info.run_id, "KILLED")
            ended.append(run.info.run_id)
    return ended


def _end_killed(run: Any) -> None:
    """End a stopped run ``KILLED``, and the runs of the processes the stop ended, as far as the store lets it.

    A stop must end the process with its one line, not with a store error: when the store cannot be written
    now (an sqlite file another writer holds past its timeout), the run stays ``RUNNING`` and the next process
    that opens the store marks it ``KILLED`` once this one is gone (:func:`end_orphaned_runs`).
    """
    import mlflow

    for what, end in (("the runs of ended processes", lambda: end_orphaned_runs(run.info.experiment_id)),
                      (f"run {run.info.run_id}", lambda: mlflow.end_run("KILLED"))):
        _as_the_store_lets(end, f"{what} not marked KILLED", "the next stage that opens the store marks them")


def _as_the_store_lets(write: Callable[[], Any], failed: str, then: str) -> None:
    """``write()`` to the MLflow store on a stop's way out; a store that cannot be written now (an sqlite file another
    writer holds past its timeout) is a warning, so that the stop still ends the process with its one line."""
    try:
        write()
    except Exception as exc:  # noqa: BLE001 - MlflowException, sqlite's "database is locked"
        log.warning("MLflow: %s (%s); %s", failed, (str(exc).splitlines() or [type(exc).__name__])[0], then)


@contextlib.contextmanager
def stage_run(
    params: Params,
    paths: Paths,
    name: str,
    *,
    log_params: Mapping[str, Any] | None = None,
    tags: Mapping[str, str] | None = None,
    enabled: bool = True,
    nested: bool = True,
    resources: bool = False,
    spool: bool = False,
) -> Iterator[Any]:
    """Open the MLflow run of one stage (nested under the pipeline's parent run when there is one).

    Yields the active ``mlflow.ActiveRun``, or ``None`` when ``enabled`` is false (e.g. on
    non-zero DDP ranks), in which case every logging helper here is a no-op. ``nested=False`` opens a
    top-level run (the pipeline's parent run). ``resources=True`` (the run of a whole stage process)
    logs :func:`process_resources` when the run ends, and, when the stage succeeded, the same figures as
    a log line. ``spool=True`` spools the run inside a pipeline (see the module docstring); a run opened while a
    spooled run is open in this process is spooled as its nested run.
    """
    failed = False
    try:
        if not enabled:
            yield None
            return
        if _SPOOLING or (spool and nested and (os.environ.get(PARENT_ENV) or os.environ.get("DVC_STAGE"))):
            with _spooled(params, paths, name, log_params, tags, resources) as run:
                yield run
            return
        import mlflow

        active = mlflow.active_run()
        if active is None or mlflow.get_tracking_uri() != tracking_uri(params, paths):
            configure(params, paths)  # a run nested in this process's open one is in its store and experiment already
        parent = (active.info.run_id if active else os.environ.get(PARENT_ENV)) if nested else None
        with mlflow.start_run(run_name=name, nested=bool(parent), parent_run_id=parent or None,
                              tags={**dict(tags or {}), PROCESS_TAG: this_process()}) as run:
            stopped = False
            try:  # from the run's first moment: a stop while its params are logged ends it KILLED too
                if log_params:
                    items = flatten(dict(log_params))
                    keys = list(items)
                    for i in range(0, len(keys), 100):  # MLflow caps a batch at 100 params
                        mlflow.log_params({k: items[k] for k in keys[i : i + 100]})
                yield run
            except (KeyboardInterrupt, Stopped):
                stopped = True
                raise
            finally:
                if resources and stopped:
                    _as_the_store_lets(lambda: log_metrics(run, process_resources()),
                                       f"run {run.info.run_id}'s resource figures not logged", "the stop goes on")
                elif resources:
                    log_metrics(run, process_resources())
                if stopped:  # KILLED, not FAILED; and so are the runs of the processes the stop ended
                    _end_killed(run)
                if not parent:  # the pipeline's parent run: what its stages spooled goes in before it ends
                    _as_the_store_lets(lambda: flush_spool(paths.mlflow_spool, tracking_uri(params, paths)),
                                       "spooled runs not written", "the next process that opens the store writes them")
    except BaseException:
        failed = True  # a failing stage ends with its one error line, not a resource report after it
        raise
    finally:
        if resources and not failed:
            used = process_resources()
            log.info("%s: wall %.1f s, peak RSS %.0f MiB (children %.0f MiB)", name, used["wall_seconds"],
                     used["peak_rss_mib"], used["peak_rss_children_mib"])


class SpooledRun:
    """A stage run recorded for the store (:func:`stage_run` with ``spool=True``): its record, and ``info.run_id``."""

    def __init__(self, name: str, tags: Mapping[str, str], params: Mapping[str, str]) -> None:
        self.record: dict[str, Any] = {"name": name, "tags": dict(tags), "params": dict(params), "metrics": {},
                                       "artifacts": [], "children": [], "start_ms": _now_ms()}
        self.info = SimpleNamespace(run_id=None)  # as an MLflow run's: no id until the store writes it


_SPOOLING: list[SpooledRun] = []  # the spooled runs open in this process, innermost last


def _now_ms() -> int:
    return int(time.time() * 1000)


@contextlib.contextmanager
def _spooled(params: Params, paths: Paths, name: str, log_params: Mapping[str, Any] | None,
             tags: Mapping[str, str] | None, resources: bool) -> Iterator[SpooledRun]:
    """A :class:`SpooledRun`, nested in the one open in this process if any; the outermost one is written to the
    spool as it ends, with status ``FINISHED``, ``FAILED`` or (a stop) ``KILLED``."""
    run = SpooledRun(name, {**dict(tags or {}), PROCESS_TAG: this_process()}, flatten(dict(log_params or {})))
    outer = _SPOOLING[-1] if _SPOOLING else None
    _SPOOLING.append(run)
    status = "FAILED"
    try:
        yield run
        status = "FINISHED"
    except (KeyboardInterrupt, Stopped):
        status = "KILLED"
        raise
    finally:
        _SPOOLING.pop()
        if resources:
            log_metrics(run, process_resources())
        run.record.update(status=status, end_ms=_now_ms())
        if outer is not None:
            outer.record["children"].append(run.record)
        else:
            from pgrank.atomic import write_json

            write_json(paths.mlflow_spool / f"{run.record['start_ms']}-{uuid.uuid4().hex}.json",
                       {"format": SPOOL_FORMAT, "uri": tracking_uri(params, paths),
                        "experiment": params.tracking.experiment, "parent": os.environ.get(PARENT_ENV), "run": run.record})


def flush_spool(folder: Path, uri: str) -> int:
    """Write the runs spooled in ``folder`` for the store at ``uri`` into it, oldest first, and remove their files;
    the number of files written.

    A file is claimed by renaming it (one process writes it, whoever else flushes at the same time); a claim whose
    process is gone is taken over, and then every run it holds that the store already has (tag
    :data:`SPOOL_TAG`) is skipped, so that no run is written twice.
    """
    if not folder.is_dir():
        return 0
    client, experiments, written = None, {}, 0
    for file in sorted(folder.iterdir()):
        if file.suffix == ".json":
            resumed = False
        elif file.suffix == ".claim" and _gone_pid(file):
            resumed = True
        else:
            continue
        stem = file.name.split(".")[0]
        claim = folder / f"{stem}.{_claimant()}.claim"
        try:
            os.rename(file, claim)
        except FileNotFoundError:  # another process claimed it first
            continue
        record = json.loads(claim.read_text(encoding="utf-8"))
        if record.get("format") != SPOOL_FORMAT or record["uri"] != uri:  # another store's: left for it
            os.rename(claim, folder / f"{stem}.json")
            continue
        if client is None:
            import mlflow

            client = mlflow.MlflowClient(uri)
        if record["experiment"] not in experiments:
            experiments[record["experiment"]] = _experiment_id(record["experiment"], uri)
        _write_spooled(client, experiments[record["experiment"]], record["run"], record["parent"], stem, resumed)
        claim.unlink()
        written += 1
    return written


def _host() -> str:
    """This machine's name with no dot (a claim's name is ``<stem>.<host>-<pid>.claim``)."""
    return socket.gethostname().replace(".", "_")


def _claimant() -> str:
    """``<host>-<pid>`` of this process."""
    return f"{_host()}-{os.getpid()}"


def _gone_pid(claim: Path) -> bool:
    """Whether the process that claimed a spool file has ended (a claim of another machine is never taken over)."""
    import psutil

    host, _, pid = claim.name.split(".")[1].rpartition("-")
    return host == _host() and pid.isdigit() and not psutil.pid_exists(int(pid))


def _write_spooled(client: Any, experiment_id: str, run: Mapping[str, Any], parent: str | None, key: str,
                   resumed: bool) -> None:
    """One spooled run and its nested ones, into the store as they were (times, status, nesting)."""
    from mlflow.entities import Metric, Param

    if resumed and (found := client.search_runs([experiment_id], f"tags.`{SPOOL_TAG}` = '{key}'", max_results=1)):
        run_id = found[0].info.run_id
    else:
        tags = {**run["tags"], SPOOL_TAG: key, **({"mlflow.parentRunId": parent} if parent else {})}
        run_id = client.create_run(experiment_id, start_time=run["start_ms"], tags=tags, run_name=run["name"]).info.run_id
        params = [Param(k, v) for k, v in run["params"].items()]
        metrics = [Metric(k, v, run["end_ms"], 0) for k, v in run["metrics"].items()]
        for i in range(0, max(len(params), len(metrics)), 100):  # MLflow caps a batch at 100 params
            client.log_batch(run_id, metrics=metrics[i : i + 100], params=params[i : i + 100])
        for path, artifact_path in run["artifacts"]:
            if Path(path).is_file():
                client.log_artifact(run_id, path, artifact_path)
    for i, child in enumerate(run["children"]):
        _write_spooled(client, experiment_id, child, run_id, f"{key}/{i}", resumed)
    client.set_terminated(run_id, run["status"], end_time=run["end_ms"])


def log_metrics(run: Any, metrics: Mapping[str, float], step: int | None = None) -> None:
    if run is None:
        return
    if isinstance(run, SpooledRun):
        run.record["metrics"].update({metric_name(k): float(v) for k, v in metrics.items()})
        return
    import mlflow

    mlflow.log_metrics({metric_name(k): float(v) for k, v in metrics.items()}, step=step)


def log_artifact(run: Any, path: str, artifact_path: str | None = None) -> None:
    if run is None:
        return
    if isinstance(run, SpooledRun):  # logged from where it lies when the run is written into the store
        run.record["artifacts"].append([str(Path(path).resolve()), artifact_path])
        return
    import mlflow

    mlflow.log_artifact(path, artifact_path=artifact_path)


def model_requirements() -> list[str]:
    """The pinned packages a logged sentence-transformers model needs. Given explicitly: MLflow would
    otherwise infer them by loading the model again in a subprocess (seconds per training run)."""
    from importlib.metadata import version

    return [f"{name}=={version(name).split('+')[0]}" for name in ("sentence-transformers", "transformers", "torch")]


def log_model(run: Any, model: Any, *, registered_name: str | None, name: str = "model") -> str | None:
    """Log a sentence-transformers model with MLflow's flavor; register it when a name is given.

    Returns:
        The registered model version (as a string), or ``None``.
    """
    if run is None:
        return None
    import mlflow

    info = mlflow.sentence_transformers.log_model(model, name=name, registered_model_name=registered_name,
                                                  pip_requirements=model_requirements())
    version = getattr(info, "registered_model_version", None)
    return None if version is None else str(version)
