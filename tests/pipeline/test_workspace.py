"""What a profile's workspace ``params.yaml`` says of paths: the stages run inside the workspace, so every
path a profile gives relative to the params file must mean the same file there."""

from __future__ import annotations

import signal
import subprocess
import threading
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def test_relative_offline_model_paths_are_made_absolute_against_the_project(tmp_path):
    from pgrank.config import load_params
    from pgrank.models.names import resolve_model
    from pgrank.pipeline.workspace import workspace_params

    project, copy = tmp_path / "project", tmp_path / "project" / "models" / "encoder"
    copy.mkdir(parents=True)
    (copy / "model.safetensors").write_bytes(b"")
    params = load_params(ROOT / "params.yaml", ["models.offline.org/encoder={path: models/encoder}",
                                                f"models.offline.org/elsewhere={{path: {tmp_path / 'elsewhere'}}}"])
    doc = workspace_params(params, project, project / "runs" / "x")
    offline = doc["models"]["offline"]
    assert offline["org/encoder"]["path"] == str(copy)
    assert offline["org/elsewhere"]["path"] == str(tmp_path / "elsewhere")  # absolute: as given
    assert offline["sentence-transformers/all-MiniLM-L6-v2"]["path"] is None  # a package copy: untouched
    from pgrank.config import parse_params

    ref = resolve_model("org/encoder", parse_params(doc).models)  # what a stage in the workspace resolves
    assert ref.local_dir == copy


def test_stages_run_this_interpreters_dvc_and_pgrank_even_when_its_environment_is_not_activated(monkeypatch):
    """``.venv/bin/pgrank demo`` from a shell where another installation's ``pgrank`` comes first on $PATH: DVC
    and the stage commands it starts must resolve to this interpreter's scripts."""
    import os
    import sys
    from pathlib import Path

    from pgrank.pipeline.workspace import stage_environment

    scripts = str(Path(sys.executable).parent)
    monkeypatch.setenv("PATH", os.pathsep.join(["/opt/other/bin", scripts, "/usr/bin"]))
    monkeypatch.setenv("PGRANK_PROFILE", "demo")
    env = stage_environment({"EXTRA": "1"})
    assert env["PATH"].split(os.pathsep) == [scripts, "/opt/other/bin", "/usr/bin"]
    assert "PGRANK_PROFILE" not in env and env["EXTRA"] == "1"


@pytest.mark.parametrize("mode", ["kept", "python's default"])
def test_a_stop_signal_that_lands_in_a_finalizer_still_stops_the_pipeline_once_interrupts_are_kept(mode):
    """A stop signal to `pgrank repro` while no DVC runs raises Stopped at once; here it lands while an object's
    ``__del__`` runs, where Python would drop it."""
    from test_errors import stop_in_a_finalizer

    setup = "from pgrank.errors import Stopped, keep_interrupts\nfrom pgrank.pipeline.workspace import _Stopping\n"
    run = stop_in_a_finalizer(setup + ("keep_interrupts()" if mode == "kept" else ""), signal="SIGTERM",
                              around='_Stopping("the pipeline")', caught="Stopped")
    if mode == "kept":
        assert run.stdout.strip() == "interrupted 143", run.stderr  # 128 + SIGTERM, as a shell reports it
        assert "Exception ignored" not in run.stderr and "Traceback" not in run.stderr, run.stderr
    else:  # what the hook is for: without it the stop is reported, dropped, and the pipeline runs on
        assert run.stdout.strip() == "ran on"
        assert "Exception ignored" in run.stderr and "Stopped: stopped by SIGTERM" in run.stderr


@pytest.mark.parametrize("dropped", [True, False])
def test_a_dropped_stop_sent_again_after_dvc_started_is_not_taken_for_a_second_signal(dropped):
    """Between a finalizer dropping the stop and its signal coming back, DVC may have started, and been stopped
    with its grace period running. The signal sent again must leave that grace alone; a real second signal ends it
    (SIGKILL to DVC's process group)."""
    from pgrank.errors import Stopped
    from pgrank.pipeline.workspace import _Stopping

    group = subprocess.Popen(["sleep", "60"], start_new_session=True)
    stopping = _Stopping("the pipeline")
    stopping.signum, stopping._group = signal.SIGTERM, group.pid
    stopping._timer = threading.Timer(3600, lambda: None)  # the grace period, under way
    stopping._raised = Stopped(signal.SIGTERM, "stopped")
    stopping._raised.dropped = dropped
    try:
        stopping._handle(signal.SIGTERM, None)
        if dropped:
            with pytest.raises(subprocess.TimeoutExpired):
                group.wait(1)
            assert not stopping._raised.dropped  # the resend is consumed: a later signal is a second one
        else:
            assert group.wait(10) == -signal.SIGKILL
    finally:
        group.kill()
        group.wait()
