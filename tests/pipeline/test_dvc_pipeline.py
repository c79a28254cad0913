"""The DVC pipeline end to end: the demo profile (shrunk) through `pgrank demo`, and the paper DAG."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from shrunk import project_copy, shrunk_overrides, sliced_scifact_mirror

ROOT = Path(__file__).resolve().parents[2]


def _pgrank(args: list[str], cwd: Path, env: dict) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(cwd / "cli.py"), *args], cwd=cwd, env=env, capture_output=True, text=True)


def _dvc(args: list[str], cwd: Path) -> str:
    out = subprocess.run(["dvc", *args], cwd=cwd, capture_output=True, text=True)
    assert out.returncode == 0, out.stderr + out.stdout
    return out.stdout


def _would_run(ws: Path) -> set[str]:
    return set(re.findall(r"Running stage '([^']+)'", _dvc(["repro", "--dry"], ws)))


@pytest.fixture(scope="module")
def demo_run(tmp_path_factory, beir_mirror, tiny_model_dir):
    """A git checkout of the working tree, a sliced scifact mirror, and one shrunk `pgrank demo` run."""
    tmp = tmp_path_factory.mktemp("pipeline")
    project = project_copy(tmp / "project")
    mirror = sliced_scifact_mirror(beir_mirror / "scifact.zip", tmp / "mirror")
    env = {**os.environ, "PGRANK_BEIR_MIRROR": str(mirror), "HF_HUB_OFFLINE": "1"}
    env.pop("MLFLOW_TRACKING_URI", None)
    env.pop("PGRANK_PROFILE", None)
    sets = [a for o in shrunk_overrides(tiny_model_dir) for a in ("--set", o)]
    out = _pgrank(["--profile", "demo", *sets, "demo"], project, env)
    assert out.returncode == 0, out.stderr[-3000:]
    return project, project / "runs" / "demo", sets, env, out


@pytest.mark.integration
def test_demo_runs_every_stage_and_prints_its_tables(demo_run):
    project, ws, _, _, out = demo_run
    stages = set(_dvc(["stage", "list", "--name-only"], ws).split())
    assert stages == {"download", "mine-train", "mine@scifact", "train@minilm", "evaluate-bm25@bm25-scifact",
                      "evaluate-dense@minilm-scifact", "evaluate-policy@minilm-scifact", "tables"}
    assert "Second-stage reranking: nDCG@10, in-domain" in out.stdout and "PG-Rank with" in out.stdout
    assert "mlflow ui --backend-store-uri sqlite:///" in out.stdout and "prefect server start" in out.stdout
    for name in ["rerank-in-domain.md", "full-in-domain.tex", "bars-rerank.png", "tables.md"]:
        assert (ws / "tables" / name).is_file()
    assert (ws / "dvc.lock").is_file() and not (project / "dvc.lock").exists()  # apart from the paper
    assert subprocess.run(["git", "status", "--porcelain"], cwd=project, capture_output=True, text=True).stdout == ""
    lock = (ws / "dvc.lock").read_text()
    assert str(project) not in lock and str(ws) not in lock  # no absolute paths in what DVC records


@pytest.mark.integration
def test_repeat_is_a_noop_and_a_training_knob_reruns_only_what_reads_it(demo_run):
    project, ws, sets, env, _ = demo_run
    again = _pgrank(["--profile", "demo", *sets, "repro"], project, env)
    assert again.returncode == 0, again.stderr[-2000:]
    assert _would_run(ws) == {"download"}  # always_changed: it re-fingerprints the datasets, nothing else runs
    from pgrank.pipeline.workspace import prepare

    overrides = [s for s in sets if s != "--set"] + ["train.pg.num_samples=12"]
    prepare(project / "params.yaml", "demo", overrides)
    ran = set(re.findall(r"Running stage '([^']+)'", _dvc(["repro"], ws)))
    assert ran == {"train@minilm", "evaluate-policy@minilm-scifact", "tables"}


@pytest.mark.integration
def test_mlflow_has_one_parent_run_with_nested_stage_runs(demo_run):
    _, ws, _, _, _ = demo_run
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri=f"sqlite:///{ws / 'mlflow.db'}")
    exp = client.get_experiment_by_name("pgrank")
    runs = client.search_runs([exp.experiment_id])
    parents = [r for r in runs if r.data.tags.get("stage") == "pipeline"]
    assert len(parents) == 2  # the demo run and the no-op repro
    first = min(parents, key=lambda r: r.info.start_time)
    children = [r for r in runs if r.data.tags.get("mlflow.parentRunId") == first.info.run_id]
    stages = {r.data.tags.get("stage") for r in children}
    assert {"train", "evaluate"} <= stages
    train = next(r for r in children if r.data.tags["stage"] == "train")
    assert "val_ndcg_at_10" in train.data.metrics
    evals = [r for r in children if r.data.tags["stage"] == "evaluate"]
    assert len(evals) == 6  # 3 systems x (rerank, full) on scifact/test
    assert all("ndcg_at_10" in r.data.metrics for r in evals)
    (tables,) = [r for r in children if r.data.tags["stage"] == "tables"]
    logged = {Path(a.path).name for a in client.list_artifacts(tables.info.run_id, "tables")}
    assert {"rerank-in-domain.md", "rerank-in-domain.tex", "bars-rerank.png"} <= logged


def test_paper_profile_validates_and_its_dag_lists_every_stage(tmp_path):
    from pgrank.config import load_params

    params = load_params(ROOT / "params.yaml")
    project = project_copy(tmp_path / "project")
    names = _dvc(["stage", "list", "--name-only"], project).split()
    datasets = list(params.data.eval_sets_by_dataset())
    expected = {"download", "mine-train", "tables"}
    expected |= {f"mine@{d}" for d in datasets} | {f"train@{w}" for w in params.train.warm_starts}
    systems = params.evaluate.systems
    expected |= {f"evaluate-{kind}@{s}-{d}" for kind in ("bm25", "dense", "sparse") for s in getattr(systems, kind)
                 for d in datasets}
    expected |= {f"evaluate-policy@{w}-{d}" for w in params.train.warm_starts for d in datasets}
    assert set(names) == expected
    assert len(datasets) == 14 and len(names) == 3 + 14 + 2 + 4 * 14 + 2 * 14  # 15 eval sets, 14 datasets
    dot = _dvc(["dag", "--dot"], project)
    nodes = set(re.findall(r'"([^"]+)"', dot))
    assert expected <= nodes  # every stage is in the DAG DVC derives from the one dvc.yaml
    edges = set(re.findall(r'"([^"]+)" -> "([^"]+)"', dot))
    for edge in [("download", "mine-train"), ("mine-train", "train@sbert"), ("train@sbert", "evaluate-policy@sbert-nq"),
                 ("evaluate-dense@sbert-nq", "evaluate-policy@sbert-nq"), ("mine@nq", "evaluate-bm25@bm25-nq"),
                 ("download", "mine@nq"), ("mine@nq", "evaluate-sparse@splade-v2-nq"),
                 ("evaluate-policy@tas-b-scifact", "tables")]:
        assert edge in edges, edge
