"""The DVC pipeline end to end: the README's demo line, verbatim, on the shrunk demo; and the paper DAG.

The module's fixture does what CI does: a fresh clone with ``../shared/data/beir`` beside it (here a sliced
mirror of scifact and nfcorpus), a fresh virtualenv, and the README's demo line run verbatim in the clone (read
from the README as ``.ci/run`` reads the test line) in ``.ci/run``'s environment (``.ci/env``, which names that
folder as the mirror). ``PGRANK_PROFILE=smoke``
selects the shrunk demo (tests/shrunk.py writes ``profiles/smoke.yaml``: the demo profile with the tiny
in-code BERT and one epoch). pip runs offline (``PIP_NO_INDEX``): everything is installed already.
"""

from __future__ import annotations

import json
import os
import re
import site
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from dependency_closure import stage_files
from shrunk import project_copy, sliced_mirror, write_smoke_profile

ROOT = Path(__file__).resolve().parents[2]


def readme_line(tag: str) -> str:
    """The README line ending in ``# <tag>``, as .ci/run reads it."""
    return next(line.strip() for line in (ROOT / "README.md").read_text().splitlines() if line.rstrip().endswith(f"# {tag}"))


def _dvc(args: list[str], cwd: Path) -> str:
    out = subprocess.run(["dvc", *args], cwd=cwd, capture_output=True, text=True)
    assert out.returncode == 0, out.stderr + out.stdout
    return out.stdout


def _ran(output: str) -> set[str]:
    return set(re.findall(r"Running stage '([^']+)'", output))


# `download` is always_changed: every repro re-fingerprints the datasets (a no-op for unchanged data).
ALWAYS = {"download"}


def _status(ws: Path) -> dict:
    """``dvc status --json`` without the always-changed stage."""
    status = json.loads(_dvc(["status", "--json"], ws) or "{}")
    return {k: v for k, v in status.items() if v != ["always changed"]}


def fresh_venv(path: Path) -> Path:
    """A new venv that sees every package the tests run with, so that pip has nothing to fetch.

    ``--system-site-packages`` shows the base interpreter's packages: all of them when the tests run on a
    plain interpreter (CI), none of the user's when they run inside a venv, whose ``python -m venv`` builds
    on the base interpreter too. So a venv's own site-packages are added with ``site.addsitedir`` (from a
    ``.pth`` file, which also runs their ``.pth`` files, as the base interpreter's are run), after the new
    venv's own: what the new venv installs comes first, as on a plain interpreter.
    """
    subprocess.run([sys.executable, "-m", "venv", "--system-site-packages", str(path)], check=True)
    python = path / "bin" / "python"
    # the venv's own old setuptools would shadow the installed one that builds the editable wheel
    subprocess.run([str(python), "-m", "pip", "uninstall", "-y", "-q", "setuptools"], check=True, capture_output=True)
    if sys.prefix != sys.base_prefix:
        own = subprocess.run([str(python), "-c", "import sysconfig; print(sysconfig.get_path('purelib'))"],
                             check=True, capture_output=True, text=True).stdout.strip()
        outer = [d for d in site.getsitepackages() if not d.startswith(sys.base_prefix)]
        # named to sort after the .pth files pip writes there (an editable install's), which run first
        Path(own, "~outer-venv.pth").write_text("".join(f"import site; site.addsitedir({d!r})\n" for d in outer))
    return path


@pytest.fixture(scope="module")
def demo_run(tmp_path_factory, beir_mirror, tiny_model_dir):
    """A fresh clone, ../shared/data/beir beside it, a fresh venv, and the README's demo line run in the clone in
    .ci/run's environment (.ci/env)."""
    tmp = tmp_path_factory.mktemp("readme")
    source = project_copy(tmp / "source")
    clone = tmp / "pgrank"
    subprocess.run(["git", "clone", "-q", str(source), str(clone)], check=True)
    sliced_mirror(beir_mirror, tmp / "shared" / "data" / "beir")
    write_smoke_profile(clone, tiny_model_dir)
    venv = fresh_venv(tmp / "venv")
    env = {k: v for k, v in os.environ.items() if k not in ("MLFLOW_TRACKING_URI", "PGRANK_BEIR_MIRROR", "VIRTUAL_ENV")}
    env.update(PATH=f"{venv / 'bin'}{os.pathsep}{env['PATH']}", PGRANK_PROFILE="smoke", HF_HUB_OFFLINE="1",
               PIP_NO_INDEX="1", PIP_NO_BUILD_ISOLATION="0", PIP_DISABLE_PIP_VERSION_CHECK="1")
    line = readme_line("demo")
    out = subprocess.run(["bash", "-c", f". .ci/env; set -eo pipefail; {line}"], cwd=clone, env=env, capture_output=True,
                         text=True)
    assert out.returncode == 0, out.stderr[-3000:]
    return clone, clone / "runs" / "smoke", env, out


def _pgrank(args: list[str], run, **env) -> subprocess.CompletedProcess:
    clone, _, base, _ = run
    return subprocess.run(["pgrank", *args], cwd=clone, env={**base, **env}, capture_output=True, text=True)


@pytest.mark.integration
def test_the_readme_demo_line_runs_verbatim_from_a_fresh_clone(demo_run):
    clone, ws, env, out = demo_run
    assert "shared" not in readme_line("demo")  # a stranger's line: CI's mirror comes from .ci/env
    installed = subprocess.run(["python", "-c", "import cli; print(cli.__file__)"], env=env, cwd="/",
                               capture_output=True, text=True).stdout.strip()
    assert installed == str(clone / "cli.py")
    stages = set(_dvc(["stage", "list", "--name-only"], ws).split())
    assert stages == {"download", "mine-train", "mine@scifact", "train@minilm-pg", "evaluate-bm25@bm25-scifact",
                      "evaluate-dense@minilm-scifact", "evaluate-policy@minilm-pg-scifact", "tables"}
    assert "Second-stage reranking: nDCG@10, in-domain" in out.stdout and "PG-Rank with" in out.stdout
    assert "mlflow ui --backend-store-uri sqlite:///" in out.stdout and "prefect server start" in out.stdout
    for name in ["rerank-in-domain.md", "full-in-domain.tex", "bars-rerank.png", "tables.md"]:
        assert (ws / "tables" / name).is_file()
    assert re.search(r"pgrank: train-minilm: wall [\d.]+ s, peak RSS \d+ MiB", out.stderr)  # each stage's resources
    assert (clone / "data" / "beir" / "scifact" / "corpus.jsonl").is_file()  # datasets: shared, not per profile
    dense = [p for p in (clone / "data" / "embeddings").iterdir() if (p / "meta.json").is_file() and not p.name.startswith("bm25--")]
    assert len(dense) == 1  # encoded once (beside the BM25 index artifact)
    assert not (ws / "data").exists()
    assert (ws / "dvc.lock").is_file() and not (clone / "dvc.lock").exists()  # apart from the paper
    status = subprocess.run(["git", "status", "--porcelain"], cwd=clone, capture_output=True, text=True).stdout
    assert status.split() == ["??", "profiles/smoke.yaml"]  # nothing tracked was touched
    lock = (ws / "dvc.lock").read_text()
    assert str(clone) not in lock and str(ws) not in lock  # no absolute paths in what DVC records
    outs = {out["path"] for stage in yaml.safe_load(lock)["stages"].values() for out in stage.get("outs", [])}
    files = [f for out in outs for f in ([ws / out] if (ws / out).is_file() else (ws / out).rglob("*")) if f.is_file()]
    assert len(files) > 50 and not [f for f in files if str(clone).encode() in f.read_bytes()]  # nor in its outputs


@pytest.mark.integration
def test_mlflow_has_one_parent_run_with_nested_stage_runs(demo_run):
    _, ws, _, _ = demo_run
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri=f"sqlite:///{ws / 'mlflow.db'}")
    exp = client.get_experiment_by_name("pgrank")
    runs = client.search_runs([exp.experiment_id])
    parents = [r for r in runs if r.data.tags.get("stage") == "pipeline"]
    first = min(parents, key=lambda r: r.info.start_time)  # the README's demo run
    children = [r for r in runs if r.data.tags.get("mlflow.parentRunId") == first.info.run_id]
    stages = sorted(r.data.tags.get("stage") for r in children)
    # one run per stage process, each with its wall time and peak memory
    assert stages == ["download", "evaluate", "evaluate", "evaluate", "mine", "mine", "tables", "train"]
    assert all({"wall_seconds", "peak_rss_mib"} <= set(r.data.metrics) for r in children)
    train = next(r for r in children if r.data.tags["stage"] == "train")
    assert "val_ndcg_at_10" in train.data.metrics
    evals = [r for r in children if r.data.tags["stage"] == "evaluate"]  # bm25, minilm, pgrank-minilm on scifact
    results = [r for r in runs if r.data.tags.get("mlflow.parentRunId") in {e.info.run_id for e in evals}]
    assert len(results) == 6 and all("ndcg_at_10" in r.data.metrics for r in results)  # x (rerank, full)
    (tables,) = [r for r in children if r.data.tags["stage"] == "tables"]
    logged = {Path(a.path).name for a in client.list_artifacts(tables.info.run_id, "tables")}
    assert {"rerank-in-domain.md", "rerank-in-domain.tex", "bars-rerank.png"} <= logged


@pytest.mark.integration
def test_a_repeat_is_a_noop(demo_run):
    again = _pgrank(["repro"], demo_run)
    assert again.returncode == 0, again.stderr[-2000:]
    assert _ran(again.stdout + again.stderr) == ALWAYS  # it re-fingerprints the datasets; nothing else runs


@pytest.mark.integration
@pytest.mark.parametrize("module", [
    "pgrank/retrieval/bm25/index.py",               # BM25: evaluate-bm25@*, and mining only if mine.source is bm25
    "pgrank/training/trainer.py",                   # train@*
    "pgrank/retrieval/dense/corpus_embeddings.py",  # mining, training and dense evaluation, not BM25's
    "pgrank/pipeline/champion.py",                  # no stage runs it: nothing
])
def test_editing_code_reruns_exactly_the_stages_that_run_it(demo_run, module):
    from pgrank.config import load_params

    _, ws, _, _ = demo_run
    params = load_params(ws / "params.yaml")
    expected = set()
    with _stages(ws) as stages:
        for name, cmd in stages:
            if ws / module in stage_files(cmd, params, ws):
                expected.add(name)
    edited = ws / module  # the workspace's synced copy, which its dvc.yaml depends on
    original = edited.read_bytes()
    try:
        edited.write_bytes(original + b"\n# an edit\n")
        changed = set(_status(ws))
    finally:
        edited.write_bytes(original)
    assert changed == expected
    assert {"pgrank/retrieval/bm25/index.py": {"evaluate-bm25@bm25-scifact"},
            "pgrank/training/trainer.py": {"train@minilm-pg"},
            "pgrank/pipeline/champion.py": set()}.get(module, changed) == changed
    if module.endswith("corpus_embeddings.py"):
        assert changed == {"mine-train", "mine@scifact", "train@minilm-pg", "evaluate-dense@minilm-scifact",
                           "evaluate-policy@minilm-pg-scifact"}
    assert _status(ws) == {}


class _stages:
    """``(name, cmd)`` of every stage of a workspace, read through DVC's own API."""

    def __init__(self, ws: Path):
        from dvc.repo import Repo

        self.repo = Repo(str(ws))

    def __enter__(self):
        return [(s.name, s.cmd) for s in self.repo.index.stages]

    def __exit__(self, *exc):
        self.repo.close()


@pytest.mark.integration
def test_a_single_stage_reads_and_writes_where_the_demo_does(demo_run):
    """`pgrank --profile smoke train` in the checkout: the workspace's inputs, the same outputs, byte for byte."""
    _, ws, _, _ = demo_run
    model = ws / "models" / "minilm" / "pg"
    before = {p.relative_to(model): p.read_bytes() for p in model.rglob("*") if p.is_file()}
    out = _pgrank(["train"], demo_run)
    assert out.returncode == 0, out.stderr[-2000:]
    after = {p.relative_to(model): p.read_bytes() for p in model.rglob("*") if p.is_file()}
    assert after == before  # deterministic training, into the demo's own output
    assert _status(ws) == {}  # DVC sees nothing to redo


@pytest.mark.integration
def test_a_training_knob_reruns_only_what_reads_it_and_a_new_dataset_only_its_stages(demo_run):
    knob = ["--set", "train.pg.num_samples=12"]
    out = _pgrank([*knob, "repro"], demo_run)
    assert out.returncode == 0, out.stderr[-2000:]
    assert _ran(out.stdout) == ALWAYS | {"train@minilm-pg", "evaluate-policy@minilm-pg-scifact", "tables"}
    # one more dataset: its own stages and the tables; nothing of scifact's is redone
    more = ["--set", "data.eval_sets={scifact: [test], nfcorpus: [test]}"]
    out = _pgrank([*knob, *more, "repro"], demo_run, PGRANK_BEIR_MIRROR="../shared/data/beir")
    assert out.returncode == 0, out.stderr[-2000:]
    assert _ran(out.stdout) == {"download", "mine@nfcorpus", "evaluate-bm25@bm25-nfcorpus", "evaluate-dense@minilm-nfcorpus",
                                "evaluate-policy@minilm-pg-nfcorpus", "tables"}
    _, ws, _, _ = demo_run
    assert "NFCorpus" in (ws / "tables" / "rerank-out-of-domain.md").read_text()


def test_paper_profile_validates_and_its_dag_lists_every_stage(tmp_path):
    from pgrank.config import load_params

    params = load_params(ROOT / "params.yaml")
    project = project_copy(tmp_path / "project")
    names = _dvc(["stage", "list", "--name-only"], project).split()
    datasets = list(params.data.eval_sets_by_dataset())
    expected = {"download", "mine-train", "tables"}
    expected |= {f"mine@{d}" for d in datasets} | {f"train@{w}-pg" for w in params.train.warm_starts}
    systems = params.evaluate.systems
    expected |= {f"evaluate-{kind}@{s}-{d}" for kind in ("bm25", "dense", "sparse") for s in getattr(systems, kind)
                 for d in datasets}
    expected |= {f"evaluate-policy@{w}-pg-{d}" for w in params.train.warm_starts for d in datasets}
    assert set(names) == expected
    assert len(datasets) == 14 and len(names) == 3 + 14 + 2 + 4 * 14 + 2 * 14  # 15 eval sets, 14 datasets
    dot = _dvc(["dag", "--dot"], project)
    nodes = set(re.findall(r'"([^"]+)"', dot))
    assert expected <= nodes  # every stage is in the DAG DVC derives from the one dvc.yaml
    edges = set(re.findall(r'"([^"]+)" -> "([^"]+)"', dot))
    for edge in [("download", "mine-train"), ("mine-train", "train@sbert-pg"), ("train@sbert-pg", "evaluate-policy@sbert-pg-nq"),
                 ("evaluate-dense@sbert-nq", "evaluate-policy@sbert-pg-nq"), ("mine@nq", "evaluate-bm25@bm25-nq"),
                 ("download", "mine@nq"), ("mine@nq", "evaluate-sparse@splade-v2-nq"),
                 ("evaluate-policy@tas-b-pg-scifact", "tables")]:
        assert edge in edges, edge


def test_compare_profile_fans_training_and_evaluation_out_over_objectives_and_seeds(tmp_path):
    """profiles/compare.yaml: one train stage and one evaluate-policy stage per dataset for each objective (losses
    and variants), again at each extra seed, all feeding the tables (the comparison table reads every run's results)."""
    from pgrank.config import load_params
    from pgrank.pipeline.workspace import prepare

    project = project_copy(tmp_path / "project")
    params = load_params(project / "params.yaml", profile="compare")
    assert params.train.objectives[:6] == ["pg", "infonce", "listnet", "listmle", "listmle_topk", "lambdaloss"]
    assert set(params.train.objectives[6:]) == set(params.train.variants) and params.train.extra_seeds == [43, 44]
    ws = prepare(project / "params.yaml", "compare")
    names = set(_dvc(["stage", "list", "--name-only"], ws).split())
    trains = {f"train@minilm-{o}" for o in params.train.objectives}
    trains |= {f"train-seeds@minilm-{o}-{s}" for o in params.train.objectives for s in (43, 44)}
    policies = {f"evaluate-policy@minilm-{o}-{d}" for o in params.train.objectives for d in ("scifact", "nfcorpus")}
    policies |= {f"evaluate-policy-seeds@minilm-{o}-{s}-{d}" for o in params.train.objectives for s in (43, 44)
                 for d in ("scifact", "nfcorpus")}
    assert trains | policies <= names and len(trains) == 30 and len(policies) == 60
    edges = set(re.findall(r'"([^"]+)" -> "([^"]+)"', _dvc(["dag", "--dot"], ws)))
    for o in params.train.objectives:
        assert ("mine-train", f"train@minilm-{o}") in edges
        assert (f"train@minilm-{o}", f"evaluate-policy@minilm-{o}-nfcorpus") in edges
        assert ("evaluate-dense@minilm-nfcorpus", f"evaluate-policy@minilm-{o}-nfcorpus") in edges
        assert (f"evaluate-policy@minilm-{o}-scifact", "tables") in edges
        assert ("mine-train", f"train-seeds@minilm-{o}-43") in edges
        assert (f"train-seeds@minilm-{o}-44", f"evaluate-policy-seeds@minilm-{o}-44-scifact") in edges
        assert (f"evaluate-policy-seeds@minilm-{o}-43-nfcorpus", "tables") in edges
