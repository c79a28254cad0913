"""A real Prefect server for tests, and reading runs back from its API.

:func:`start_server` runs ``prefect server start`` on 127.0.0.1 on a free port as a subprocess (in its own
session), with its own ``PREFECT_HOME`` (database, profiles); :func:`stop` sends it Ctrl-C.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import time
import urllib.request
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class PrefectServer:
    api: str  # http://127.0.0.1:PORT/api
    ui: str  # http://127.0.0.1:PORT
    env: dict[str, str]  # os.environ plus the server's settings, for subprocesses
    settings: dict[str, str]  # the server's settings alone
    home: Path
    process: subprocess.Popen


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _healthy(api: str) -> bool:
    try:
        with urllib.request.urlopen(f"{api}/health", timeout=2) as resp:
            return resp.status == 200
    except OSError:
        return False


def start_server(home: Path, timeout: float = 180) -> PrefectServer:
    """``prefect server start`` with ``PREFECT_HOME=home``, once its API answers; raises RuntimeError if it does not."""
    port = free_port()
    api, ui = f"http://127.0.0.1:{port}/api", f"http://127.0.0.1:{port}"
    settings = {"PREFECT_HOME": str(home), "PREFECT_API_URL": api, "PREFECT_UI_API_URL": api,
                "PREFECT_SERVER_ANALYTICS_ENABLED": "false", "PREFECT_LOGGING_TO_API_BATCH_INTERVAL": "0.5"}
    env = {**os.environ, **settings}
    with open(home / "server.log", "w") as log:
        process = subprocess.Popen(["prefect", "server", "start", "--host", "127.0.0.1", "--port", str(port)], env=env,
                                   stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    deadline = time.monotonic() + timeout
    while not _healthy(api):
        if process.poll() is not None or time.monotonic() > deadline:
            stop(process)
            raise RuntimeError(f"prefect server did not start:\n{(home / 'server.log').read_text()[-3000:]}")
        time.sleep(0.5)
    return PrefectServer(api, ui, env, settings, home, process)


def stop(process: subprocess.Popen, timeout: float = 30) -> None:
    """Ctrl-C, then, if it does not exit, kill its session (only what it started)."""
    if process.poll() is None:
        process.send_signal(signal.SIGINT)
    try:
        process.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        process.wait()


def task_runs(flow_run_id) -> list:
    """The task runs of one flow run, read back from the Prefect API."""
    from prefect import get_client
    from prefect.client.schemas.filters import FlowRunFilter, FlowRunFilterId

    with get_client(sync_client=True) as client:
        return client.read_task_runs(flow_run_filter=FlowRunFilter(id=FlowRunFilterId(any_=[flow_run_id])))


def latest_flow_run(flow_name: str):
    from prefect import get_client
    from prefect.client.schemas.filters import FlowFilter, FlowFilterName
    from prefect.client.schemas.sorting import FlowRunSort

    with get_client(sync_client=True) as client:
        (run,) = client.read_flow_runs(flow_filter=FlowFilter(name=FlowFilterName(any_=[flow_name])),
                                       sort=FlowRunSort.START_TIME_DESC, limit=1)
    return run


def task_log(task_run) -> str:
    """A task run's log as the UI shows it (DVC's and the stage command's output)."""
    from prefect import get_client
    from prefect.client.schemas.filters import LogFilter, LogFilterTaskRunId
    from prefect.logging.handlers import APILogHandler

    APILogHandler().flush()  # logs are shipped in batches in the background
    with get_client(sync_client=True) as client:
        logs = client.read_logs(LogFilter(task_run_id=LogFilterTaskRunId(any_=[task_run.id])))
    return "\n".join(log.message for log in logs)
