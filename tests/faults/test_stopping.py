"""Stopping ``pgrank repro`` stops DVC and every stage process with it; the next ``repro`` resumes.

A real ``pgrank --profile demo repro`` of the shrunk demo (tests/shrunk.py, MLflow on) runs as a subprocess,
and the signal goes to pgrank's process alone, as a process manager or a cancelling scheduler sends it (DVC
runs in a process group of its own, so a terminal's Ctrl-C reaches pgrank alone too). SIGINT while mining,
then SIGTERM while training; after each stop

* pgrank exits with 128 + the signal's number and one ``pgrank: error: stopped by ...`` line;
* no process of the tree it started (DVC, the stage, the stage's own workers) is left;
* MLflow tells what happened: the pipeline's parent run and the stopped stage's run are ``KILLED``, the runs
  of the stages that completed ``FINISHED``, none ``RUNNING``;
* the stopped stage has no ``dvc.lock`` entry; the stages that completed keep theirs.

Then a third ``repro`` runs the stopped stage and what follows it, nothing that completed, and completes.
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import sqlite3
import subprocess
import threading
import time
from pathlib import Path

import psutil
import pytest
import yaml
from shrunk import project_copy, shrunk_overrides, sliced_scifact_mirror

WAIT_S = 600  # for a stage to start, on a loaded machine


class Repro:
    """``pgrank --profile demo --set ... repro`` running in ``project``; its output and its process tree."""

    def __init__(self, project: Path, env: dict, overrides: list[str]):
        args = [shutil.which("pgrank"), "--profile", "demo", *(a for o in overrides for a in ("--set", o)), "repro"]
        self.proc = subprocess.Popen(args, cwd=project, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
        self.chunks: list[bytes] = []
        read = lambda: self.chunks.extend(iter(lambda: self.proc.stdout.read1(65536), b""))  # noqa: E731
        self.reader = threading.Thread(target=read, daemon=True)
        self.reader.start()
        self.tree: dict[int, psutil.Process] = {}
        self.commands: dict[int, str] = {}

    def watch(self) -> None:
        """Remember every process of pgrank's tree seen so far, and its command line."""
        try:
            for child in psutil.Process(self.proc.pid).children(recursive=True):
                self.tree.setdefault(child.pid, child)
                self.commands.setdefault(child.pid, " ".join(child.cmdline()))
        except psutil.Error:
            pass

    def wait(self, timeout: float = WAIT_S) -> int:
        code = self.proc.wait(timeout)
        self.reader.join(10)
        return code

    @property
    def output(self) -> str:
        return b"".join(self.chunks).decode("utf-8", "replace")


def _runs(ws: Path) -> list[tuple[str, str, str]]:
    """``(run id, stage tag, status)`` of every MLflow run, read from the store as it is written."""
    if not (ws / "mlflow.db").is_file():
        return []
    with sqlite3.connect(f"file:{ws / 'mlflow.db'}?mode=ro", uri=True, timeout=30) as db:
        try:
            return db.execute("SELECT r.run_uuid, t.value, r.status FROM runs r JOIN tags t ON t.run_uuid = r.run_uuid"
                              " AND t.key = 'stage'").fetchall()
        except sqlite3.OperationalError:  # the schema is not there yet
            return []


# A stage that spools its MLflow run inside a pipeline (pgrank.tracking) has no run in the store while it works:
# it is at work once its progress shows after DVC started it.
AT_WORK = {"mine": re.compile(r"Running stage 'mine[^']*'.*(Encoding corpus|searching)", re.S)}


def _stop_in(run: Repro, ws: Path, stage_tag: str, signum: int) -> str | None:
    """Send ``signum`` to pgrank once a stage process (MLflow tag ``stage_tag``) has opened its run; its run id
    (``None`` for a spooled run, which the store has only after the stop)."""
    deadline = time.time() + WAIT_S
    while True:
        run.watch()
        running = [rid for rid, stage, status in _runs(ws) if stage == stage_tag and status == "RUNNING"]
        if running or (stage_tag in AT_WORK and AT_WORK[stage_tag].search(run.output)):
            break
        assert run.proc.poll() is None, f"pgrank ended before a {stage_tag} stage ran:\n{run.output[-3000:]}"
        assert time.time() < deadline, f"no {stage_tag} stage within {WAIT_S} s:\n{run.output[-3000:]}"
        time.sleep(0.2)
    run.watch()
    assert any(re.search(r"\bdvc repro\b", c) for c in run.commands.values()), run.commands
    run.proc.send_signal(signum)
    return running[0] if running else None


def _left(run: Repro, ws: Path) -> list[str]:
    """Processes of pgrank's tree still alive, and any process at work in the workspace."""
    def alive(p: psutil.Process) -> bool:
        try:
            return p.is_running() and p.status() != psutil.STATUS_ZOMBIE
        except psutil.Error:
            return False

    left = [p for p in run.tree.values() if alive(p)]
    for p in psutil.process_iter():
        try:
            if p.pid != os.getpid() and Path(p.cwd()) == ws and alive(p):
                left.append(p)
        except psutil.Error:
            continue
    return [f"{p.pid}: {run.commands.get(p.pid) or p.name()}" for p in left if alive(p)]


def _check_stopped(run: Repro, ws: Path, signum: int, stage_run: str | None, before: set[str], stage_tag: str) -> str:
    """Everything the module docstring promises after a stop; returns the stopped DVC stage. ``stage_run``: the
    stopped stage's run id, or ``None`` for a spooled run, which is this stop's one new run of ``stage_tag``."""
    code = run.wait()
    name = signal.Signals(signum).name
    assert code == 128 + signum, f"exit {code}:\n{run.output[-3000:]}"
    assert re.search(rf"^pgrank: error: stopped by {name}: .*resumes", run.output, re.M), run.output[-3000:]
    assert "Traceback" not in run.output, run.output[-3000:]
    assert not _left(run, ws), _left(run, ws)
    runs = {rid: (tag, status) for rid, tag, status in _runs(ws) if rid not in before}
    assert not [r for r in runs.values() if r[1] == "RUNNING"], runs
    if stage_run is None:
        (stage_run,) = [rid for rid, (tag, status) in runs.items() if tag == stage_tag and status != "FINISHED"]
    (parent,) = [status for tag, status in runs.values() if tag == "pipeline"]
    assert parent == "KILLED"
    assert runs[stage_run][1] == "KILLED"
    assert all(status == "FINISHED" for rid, (tag, status) in runs.items() if tag != "pipeline" and rid != stage_run)
    stage = re.findall(r"Running stage '([^']+)'", run.output)[-1]
    assert stage not in _locked(ws)
    return stage


def _locked(ws: Path) -> set[str]:
    return set(yaml.safe_load((ws / "dvc.lock").read_text())["stages"]) if (ws / "dvc.lock").is_file() else set()


def _ran(output: str) -> set[str]:
    return set(re.findall(r"Running stage '([^']+)'", output))


@pytest.mark.integration
@pytest.mark.timeout(1800)
def test_a_stop_signal_stops_dvc_and_its_stages_and_the_next_repro_resumes(tmp_path, beir_mirror, tiny_model_dir):
    project = project_copy(tmp_path / "project")
    ws = project / "runs" / "demo"
    mirror = sliced_scifact_mirror(beir_mirror / "scifact.zip", tmp_path / "mirror")
    env = {k: v for k, v in os.environ.items() if k not in ("MLFLOW_TRACKING_URI", "PGRANK_PROFILE")}
    env.update(PGRANK_BEIR_MIRROR=str(mirror), HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1")
    overrides = shrunk_overrides(tiny_model_dir)

    # Ctrl-C (SIGINT) while candidates are mined
    first = Repro(project, env, overrides)
    mining = _stop_in(first, ws, "mine", signal.SIGINT)
    assert _check_stopped(first, ws, signal.SIGINT, mining, set(), "mine").startswith("mine")
    assert "download" in _locked(ws)

    # a process manager's SIGTERM while the policy trains
    before = {rid for rid, _, _ in _runs(ws)}
    second = Repro(project, env, overrides)
    training = _stop_in(second, ws, "train", signal.SIGTERM)
    assert _check_stopped(second, ws, signal.SIGTERM, training, before, "train") == "train@minilm-pg"
    assert {"mine-train", "mine@scifact"} <= _locked(ws)

    # the next repro resumes: the stopped stage and what follows it, nothing that completed (download always runs)
    before, completed = {rid for rid, _, _ in _runs(ws)}, _locked(ws)
    third = Repro(project, env, overrides)
    assert third.wait() == 0, third.output[-3000:]
    assert "train@minilm-pg" in _ran(third.output)
    assert _ran(third.output) == {"download"} | (_locked(ws) - completed)
    runs = [(tag, status) for rid, tag, status in _runs(ws) if rid not in before]
    assert ("pipeline", "FINISHED") in runs and all(status == "FINISHED" for _, status in runs), runs
