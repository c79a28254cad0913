"""What each stage of one pipeline run used, read back from its MLflow runs, and what the run left on disk.

Every stage process opens one MLflow run with ``resources=True`` (:func:`pgrank.tracking.stage_run`), which logs
``wall_seconds`` (the process's wall time so far) and ``peak_rss_mib`` (its peak resident memory so far) when it
ends; a process that runs several stages (``mine-train`` mines the training split and the out-of-domain validation
sets) logs after each, so a stage's own time is the step from the process's previous figure (the runs carry their
process in a tag). The
pipeline's parent run (``pipeline-<profile>``) holds them all, so one pipeline execution's stages are the children
of its newest parent run. Stages that DVC found up to date ran no process and have no figures.

Example:
    >>> used = stage_resources(Path("runs/paper-smoke"))          # doctest: +SKIP
    >>> used["groups"]["train"]                                    # doctest: +SKIP
    {'runs': 2, 'wall_s': 61.2, 'peak_rss_mib': 1480.0}
"""

from __future__ import annotations

import os
from pathlib import Path


def disk_bytes(*folders: Path) -> int:
    """Bytes of the regular files under ``folders`` (links not followed, each file counted once)."""
    seen, total = set(), 0
    for folder in folders:
        for dirpath, _, files in os.walk(folder):
            for name in files:
                st = os.lstat(os.path.join(dirpath, name))
                if (st.st_dev, st.st_ino) not in seen and not os.path.islink(os.path.join(dirpath, name)):
                    seen.add((st.st_dev, st.st_ino))
                    total += st.st_size
    return total


def stage_resources(ws: Path) -> dict:
    """The stage runs of the newest pipeline run in workspace ``ws``: each one's own wall time and its process's
    peak RSS, and per stage kind (the run's ``stage`` tag: download, mine, train, evaluate, tables) their count, summed wall
    time and largest peak RSS."""
    import mlflow

    from pgrank.config import load_params
    from pgrank.paths import Paths
    from pgrank.tracking import PROCESS_TAG, tracking_uri

    params = load_params(ws / "params.yaml")
    client = mlflow.MlflowClient(tracking_uri(params, Paths.from_config(params.paths, base=ws)))
    experiments = [e.experiment_id for e in client.search_experiments()]
    parents = client.search_runs(experiments, "tags.stage = 'pipeline'", order_by=["attributes.start_time DESC"],
                                 max_results=1)
    if not parents:
        raise SystemExit(f"no pipeline run in the MLflow store of {ws}")
    parent = parents[0]
    children = client.search_runs([parent.info.experiment_id],
                                  f"tags.mlflow.parentRunId = '{parent.info.run_id}'", max_results=10_000)
    stages, since = [], {}
    timed = sorted((r for r in children if "wall_seconds" in r.data.metrics), key=lambda r: r.data.metrics["wall_seconds"])
    for run in timed:  # a process that runs several stages logs its wall since it started after each: take the steps
        metrics, process = run.data.metrics, run.data.tags.get(PROCESS_TAG, run.info.run_id)
        kind = run.data.tags.get("stage") or run.info.run_name.split("-")[0].split("/")[0]
        stages.append({"run": run.info.run_name, "stage": kind, "status": run.info.status,
                       "wall_s": round(metrics["wall_seconds"] - since.get(process, 0.0), 1),
                       "peak_rss_mib": round(max(metrics.get("peak_rss_mib", 0.0),
                                                 metrics.get("peak_rss_children_mib", 0.0)), 1)})
        since[process] = metrics["wall_seconds"]
    stages.sort(key=lambda s: (s["stage"], s["run"]))
    groups: dict[str, dict] = {}
    for s in stages:
        g = groups.setdefault(s["stage"], {"runs": 0, "wall_s": 0.0, "peak_rss_mib": 0.0})
        g["runs"] += 1
        g["wall_s"] = round(g["wall_s"] + s["wall_s"], 1)
        g["peak_rss_mib"] = max(g["peak_rss_mib"], s["peak_rss_mib"])
    return {"pipeline_run": parent.info.run_id, "stages": stages, "groups": groups}


def group_table(groups: dict) -> list[str]:
    """The Markdown lines of the per-kind table: runs, summed own wall time, largest peak RSS."""
    from record import table

    rows = [(kind, g["runs"], f"{g['wall_s']:,.1f}", f"{g['peak_rss_mib']:,.0f}") for kind, g in groups.items()]
    return table(("stage", "stage runs", "wall s (sum)", "peak RSS MiB (largest)"), rows, "lrrr")
