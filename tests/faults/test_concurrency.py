"""Pipelines at once: two on one workspace, and two profiles sharing datasets and corpus embeddings.

* One workspace: the first ``pgrank repro`` holds the workspace's lock from composing its files to
  the end of ``dvc repro``. It is frozen (SIGSTOP) while it holds it, mid-way, and a second
  ``pgrank repro`` with other ``--set`` values is started: it must stop at once, "in use by PID <first>",
  touching nothing; the first, resumed, completes with its own parameters in ``dvc.lock``.
* Two profiles: ``demo`` and ``other`` (its own ``paths.root``) share ``paths.data`` and
  ``paths.embeddings``. The test holds the dataset's and the embedding artifact's locks while both
  pipelines start, so that both must wait on each; released, one process writes and the other reuses.
  The fault-point trace of every process shows each file of the dataset extracted once and each
  embedding shard written once; both workspaces get identical outputs.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import signal
import subprocess
import sys
import time
import zipfile
from pathlib import Path

import pytest
import yaml
from shrunk import project_copy, shrunk_overrides, sliced_scifact_mirror
from supervision import leftovers, snapshot

from pgrank.atomic import exclusive, lock_file


def _env(mirror: Path, **extra) -> dict:
    env = {k: v for k, v in os.environ.items() if k not in ("MLFLOW_TRACKING_URI", "PGRANK_PROFILE", "PGRANK_FAULT")}
    return {**env, "PGRANK_BEIR_MIRROR": str(mirror), "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", **extra}


def _pgrank(project: Path, profile: str, sets: list[str], *args: str) -> list[str]:
    return [sys.executable, str(project / "cli.py"), "--profile", profile, *[a for s in sets for a in ("--set", s)], *args]


def _wait(condition, what: str, timeout: float = 600) -> None:
    deadline = time.time() + timeout
    while not condition():
        if time.time() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.05)


def _holder(lock: Path) -> int | None:
    try:
        return json.loads(lock.read_text())["pid"]
    except (OSError, ValueError, KeyError):
        return None


@pytest.mark.integration
def test_a_second_pipeline_on_a_busy_workspace_stops_at_once_and_changes_nothing(tmp_path, beir_mirror, tiny_model_dir):
    project = project_copy(tmp_path / "project")
    mirror = sliced_scifact_mirror(beir_mirror / "scifact.zip", tmp_path / "mirror")
    sets = shrunk_overrides(tiny_model_dir)
    ws = project / "runs" / "demo"
    first = subprocess.Popen(_pgrank(project, "demo", sets, "repro", "download"), cwd=project, env=_env(mirror),
                             stdout=subprocess.PIPE, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        _wait(lambda: _holder(ws / ".pgrank.lock") == first.pid or first.poll() is not None, "the first pipeline's lock")
        os.killpg(first.pid, signal.SIGSTOP)  # frozen while it holds the workspace, wherever it is
        before = snapshot(ws)
        second = subprocess.run(_pgrank(project, "demo", [*sets, "data.validation_size=12", "train.epochs=3"], "repro"),
                                cwd=project, env=_env(mirror), capture_output=True, text=True, timeout=300)
        assert second.returncode == 2, second.stderr[-2000:]
        assert f"is in use by PID {first.pid} on " in second.stderr and "Traceback" not in second.stderr
        assert re.search(r"^pgrank: error: the pipeline workspace \S*runs/demo is in use by PID \d+ on \S+ \(cli\.py "
                         r"--profile demo .* repro download, since [\d-]+ [\d:]+\); wait for it to finish", second.stderr, re.M)
        assert snapshot(ws) == before  # not one file written under the first pipeline
    finally:
        os.killpg(first.pid, signal.SIGCONT)
    output = first.communicate(timeout=900)[0].decode()
    assert first.returncode == 0, output[-3000:]
    lock = yaml.safe_load((ws / "dvc.lock").read_text())["stages"]["download"]
    assert lock["params"]["params.yaml"]["data.validation_size"] == 10  # the first's, not the second's 12
    assert not (ws / ".pgrank.lock").exists()


def _artifact(project: Path, mirror: Path, sets: list[str]) -> Path:
    """The corpus-embedding folder the demo's mining will build with ``sets``: the key of the model under its
    inference backend (the demo's is ONNX int8, keyed by instruction set), the length, the corpus checksum."""
    from pgrank.config import load_params
    from pgrank.models.backends import effective_backend
    from pgrank.models.names import resolve_model
    from pgrank.paths import Paths
    from pgrank.retrieval.dense.corpus_embeddings import corpus_embedding_folder

    params = load_params(project / "params.yaml", sets, "demo")
    with zipfile.ZipFile(mirror / "scifact.zip") as zf:
        sha = hashlib.sha256(zf.read("scifact/corpus.jsonl")).hexdigest()
    ref = resolve_model(params.mine.model, params.models)
    paths = Paths.from_config(params.paths, base=project)
    return corpus_embedding_folder(ref, effective_backend(ref, params.models), paths,
                                   max_seq_length=params.mine.max_seq_length, corpus_sha256=sha)


@pytest.mark.slow  # two shrunk pipelines side by side: minutes on CI's 2 cores
@pytest.mark.integration
def test_two_profiles_at_once_write_shared_datasets_and_embeddings_once(tmp_path, beir_mirror, tiny_model_dir):
    project = project_copy(tmp_path / "project")
    demo = yaml.safe_load((project / "profiles" / "demo.yaml").read_text())
    (project / "profiles" / "other.yaml").write_text(yaml.safe_dump({**demo, "paths": {"root": "runs/other"}}))
    mirror = sliced_scifact_mirror(beir_mirror / "scifact.zip", tmp_path / "mirror")
    sets = shrunk_overrides(tiny_model_dir) + ["mine.chunk_size=64"]
    dataset, artifact = project / "data" / "beir" / "scifact", _artifact(project, mirror, sets)
    trace = tmp_path / "trace"
    trace.mkdir()
    logs = {name: tmp_path / f"{name}.log" for name in ("demo", "other")}
    waiting = f"is in use by PID {os.getpid()} on "  # this test's
    with exclusive(lock_file(artifact), what="test"):
        with exclusive(lock_file(dataset), what="test"):
            procs = {name: subprocess.Popen(_pgrank(project, name, sets, "repro", "mine-train"), cwd=project,
                                            env=_env(mirror, PGRANK_FAULT=f"trace:{trace}"),
                                            stdout=logs[name].open("wb"), stderr=subprocess.STDOUT)
                     for name in logs}
            for name in logs:
                _wait(lambda: re.search(rf"dataset scifact \(.*\) {waiting}", logs[name].read_text()),
                      f"{name} to wait for the dataset")
        for name in logs:  # both downloaded (one of them) and went on to mining: both wait for the embeddings
            _wait(lambda: re.search(rf"corpus-embedding artifact .* {waiting}", logs[name].read_text()),
                  f"{name} to wait for the corpus embeddings")
    for name, proc in procs.items():
        assert proc.wait(timeout=1200) == 0, logs[name].read_text()[-3000:]
    points = {f.name: [tuple(line.split("\t")) for line in f.read_text().splitlines()] for f in trace.iterdir()}
    extracted = {pid for pid, seen in points.items() if any(p == "extract.chunk" for p, _ in seen)}
    assert len(extracted) == 1, f"the dataset was extracted by {len(extracted)} processes"
    shards = {pid: [d for p, d in seen if p == "atomic.renamed" and d.startswith("shard-")] for pid, seen in points.items()}
    writers = {pid: written for pid, written in shards.items() if written}
    meta = json.loads((artifact / "meta.json").read_text())
    assert len(writers) == 1, f"embedding shards written by {len(writers)} processes"
    assert sorted(*writers.values()) == [f"shard-{i:05d}.npy" for i in range(meta["num_shards"])]  # each once
    files = {name: {k.split("/", 1)[1]: v for k, v in snapshot(project / "runs" / name).items()
                    if k.split("/", 1)[1].split("/")[0] in ("datasets", "splits", "training-sets")} for name in logs}
    assert files["demo"] and files["demo"] == files["other"]
    assert not leftovers(project / "data")
