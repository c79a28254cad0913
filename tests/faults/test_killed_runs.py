"""MLflow after kill -9: a run whose process died is marked KILLED by the next stage, a live one is not.

A process SIGKILLed inside ``tracking.stage_run`` never ends its run, so MLflow would show it RUNNING
forever. The next stage that opens the store (``tracking.configure``) ends it; the kill harness checks
the same on the real pipeline, and that a resumed training run names the run it continues.
"""

from __future__ import annotations

import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import yaml

from pgrank import tracking
from pgrank.config import Params, load_params
from pgrank.paths import Paths

ROOT = Path(__file__).resolve().parents[2]

STAGE = textwrap.dedent("""
    import os, signal, sys, time
    from pgrank import tracking
    from pgrank.config import load_params
    from pgrank.paths import Paths

    params = load_params(sys.argv[1])
    with tracking.stage_run(params, Paths.from_config(params.paths, base=os.path.dirname(sys.argv[1])), sys.argv[2],
                            tags={"stage": "train"}) as run:
        print(run.info.run_id, flush=True)
        if sys.argv[2] == "killed":
            os.kill(os.getpid(), signal.SIGKILL)
        time.sleep(120)
""")


def workspace_params(tmp_path: Path, monkeypatch) -> Params:
    """The paper's params with the workspace's paths, written to ``tmp_path/params.yaml`` and loaded (MLflow's store
    then lives in ``tmp_path``)."""
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    doc = yaml.safe_load((ROOT / "params.yaml").read_text())
    doc["paths"] = {"root": "runs", "data": "data", "embeddings": "emb"}
    (tmp_path / "params.yaml").write_text(yaml.safe_dump(doc))
    return load_params(tmp_path / "params.yaml")


def test_a_run_whose_process_was_killed_is_ended_and_a_live_one_is_not(tmp_path, monkeypatch):
    params = workspace_params(tmp_path, monkeypatch)
    killed = subprocess.run([sys.executable, "-c", STAGE, str(tmp_path / "params.yaml"), "killed"],
                            capture_output=True, text=True, timeout=300)
    assert killed.returncode == -9, killed.stderr[-2000:]
    live = subprocess.Popen([sys.executable, "-c", STAGE, str(tmp_path / "params.yaml"), "live"],
                            stdout=subprocess.PIPE, text=True)
    try:
        live_id = live.stdout.readline().strip()
        tracking.configure(params, Paths.from_config(params.paths, base=tmp_path))  # what the next stage does
        from mlflow.tracking import MlflowClient

        client = MlflowClient(tracking.tracking_uri(params, Paths.from_config(params.paths, base=tmp_path)))
        dead = client.get_run(killed.stdout.strip())
        assert dead.info.status == "KILLED" and "pgrank.ended" in dead.data.tags
        assert client.get_run(live_id).info.status == "RUNNING"  # its process is still there
    finally:
        live.kill()
        live.wait()


def test_a_stop_while_a_stage_logs_its_params_ends_its_run_killed(tmp_path, monkeypatch):
    import mlflow

    params = workspace_params(tmp_path, monkeypatch)
    paths = Paths.from_config(params.paths, base=tmp_path)

    def interrupted(*args, **kwargs):  # Ctrl-C arriving while the run's first batch of params is written
        raise KeyboardInterrupt

    monkeypatch.setattr(mlflow, "log_params", interrupted)
    try:
        with tracking.stage_run(params, paths, "stopped", log_params={"a": 1}, tags={"stage": "train"}):
            raise AssertionError("the stage body must not run")
    except KeyboardInterrupt:
        pass
    client = mlflow.MlflowClient(tracking.tracking_uri(params, paths))
    (run,) = client.search_runs([e.experiment_id for e in client.search_experiments()], "tags.stage = 'train'")
    assert run.info.status == "KILLED"


class _ShortBusyTimeout:
    """``sqlalchemy.sql`` as MLflow's sqlite sessions see it, with their 20 s busy timeout cut to 1 s."""

    def __init__(self, sql):
        self._sql = sql

    def __getattr__(self, name):
        return getattr(self._sql, name)

    def text(self, clause: str):
        return self._sql.text(re.sub(r"PRAGMA busy_timeout = \d+;", "PRAGMA busy_timeout = 1000;", clause))


def short_busy_timeout(monkeypatch) -> None:
    """A store held past its busy timeout is the same event at 1 s as at MLflow's hard-coded 20 s: each write that
    meets the held store waits it out once, so the test waits seconds, not minutes."""
    from mlflow.store.db import utils

    monkeypatch.setattr(utils, "sql", _ShortBusyTimeout(utils.sql))


@pytest.mark.parametrize("resources", [False, True])  # a stage process's run logs its resources on the way out
def test_a_stop_while_another_writer_holds_the_store_ends_with_the_stop_not_a_store_error(tmp_path, monkeypatch, caplog,
                                                                                         resources):
    import sqlite3

    import mlflow

    params = workspace_params(tmp_path, monkeypatch)
    paths = Paths.from_config(params.paths, base=tmp_path)
    short_busy_timeout(monkeypatch)
    holder = None
    try:
        with caplog.at_level("WARNING", logger="pgrank.tracking"):
            with tracking.stage_run(params, paths, "stopped", tags={"stage": "train"}, resources=resources) as run:
                # another process writes the sqlite store past its busy timeout when the stop arrives
                holder = sqlite3.connect(paths.mlflow_db, isolation_level=None)
                holder.execute("BEGIN IMMEDIATE")
                raise KeyboardInterrupt
    except KeyboardInterrupt:
        pass
    finally:
        if holder is not None:
            holder.execute("ROLLBACK")
            holder.close()
    assert mlflow.active_run() is None
    assert f"run {run.info.run_id} not marked KILLED" in caplog.text
    assert (f"run {run.info.run_id}'s resource figures not logged" in caplog.text) == resources
    client = mlflow.MlflowClient(tracking.tracking_uri(params, paths))
    assert client.get_run(run.info.run_id).info.status == "RUNNING"  # this process lives: a later stage ends it
