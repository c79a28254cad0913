"""Fixtures of the flow tests: a toy DVC project with the pipeline's shape, and a real Prefect server.

``prefect_server``: ``prefect server start`` on 127.0.0.1 on a free port, as a subprocess; one per test
session (it takes 15-30 s to start), with its own ``PREFECT_HOME`` (database, profiles) in tmp. Tests
talk to it through ``PREFECT_API_URL``, in this process and in the ones they start (the ``pgrank`` CLI,
``prefect worker start``). The fixture stops it at the end.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from prefect_server import start_server, stop
from toy_pipeline import make_toy_pipeline


@pytest.fixture
def toy(tmp_path) -> Path:
    """A DVC project with the pipeline's shape and a params file with tracking off (:mod:`toy_pipeline`)."""
    return make_toy_pipeline(tmp_path)


@pytest.fixture(scope="session")
def prefect_server(tmp_path_factory):
    """A running ``prefect server start`` (see the module docstring); in-process Prefect clients point at it."""
    from prefect.settings import PREFECT_API_URL, PREFECT_HOME, PREFECT_SERVER_ANALYTICS_ENABLED, temporary_settings

    home = tmp_path_factory.mktemp("prefect-home")
    try:
        server = start_server(home)
    except RuntimeError as exc:
        pytest.fail(str(exc))
    patch = pytest.MonkeyPatch()
    for key, value in server.settings.items():
        patch.setenv(key, value)
    try:
        with temporary_settings({PREFECT_HOME: home, PREFECT_API_URL: server.api, PREFECT_SERVER_ANALYTICS_ENABLED: False}):
            yield server
    finally:
        patch.undo()
        stop(server.process)  # what Ctrl-C does to `prefect server start`
