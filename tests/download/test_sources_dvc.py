"""Datasets of your own through DVC: the shrunk demo on two source folders, and what re-runs when they change.

``acme`` (a slice of the real scifact) lives inside the project and is tracked with ``dvc add``, as the
README tells users to do; ``toy`` (a synthetic BEIR folder) lives outside it. ``data.train`` is
``acme/train``; both are evaluation sets. A change to one dataset re-runs exactly the stages downstream
of it, and unchanged data re-runs nothing but the fingerprinting ``download`` stage.

Two scales of the same scenario: ``mining`` reproduces the stages up to mining (every stage that reads a
dataset directly; tracking off), ``pipeline`` the whole shrunk demo (``-m slow``: each stage is a
process that imports torch, so twelve of them take minutes on two cores). The default suite runs only
the first test at the ``mining`` scale; the re-runs after new data are ``-m slow``.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest
from shrunk import project_copy, shrunk_overrides, sliced_scifact_mirror
from toy_project import write_dataset

# Stages downstream of each dataset, in the whole pipeline; the `mining` scale keeps those it reproduces.
ACME_STAGES = {"mine-train", "mine@acme", "train@minilm-pg", "evaluate-bm25@bm25-acme", "evaluate-dense@minilm-acme",
               "evaluate-policy@minilm-pg-acme", "evaluate-policy@minilm-pg-toy"}  # the policy is retrained on acme
TOY_STAGES = {"mine@toy", "evaluate-bm25@bm25-toy", "evaluate-dense@minilm-toy", "evaluate-policy@minilm-pg-toy"}
SCALES = {"mining": ["download", "mine-train", "mine@acme", "mine@toy"], "pipeline": []}


def _run(args: list[str], cwd: Path, env: dict) -> str:
    out = subprocess.run(args, cwd=cwd, env=env, capture_output=True, text=True)
    assert out.returncode == 0, out.stderr[-3000:] + out.stdout[-2000:]
    return out.stdout + out.stderr


@pytest.fixture(scope="module", params=["mining", pytest.param("pipeline", marks=pytest.mark.slow)])
def byo(request, tmp_path_factory, beir_mirror, tiny_model_dir):
    targets = SCALES[request.param]
    tmp = tmp_path_factory.mktemp("byo")
    project = project_copy(tmp / "project")
    mirror = sliced_scifact_mirror(beir_mirror / "scifact.zip", tmp / "mirror")
    with zipfile.ZipFile(mirror / "scifact.zip") as zf:
        zf.extractall(tmp / "unzipped")
    shutil.move(tmp / "unzipped" / "scifact", project / "sources" / "acme")
    toy = tmp / "toy-beir"
    write_dataset(toy)
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}
    for var in ("MLFLOW_TRACKING_URI", "PGRANK_PROFILE", "PGRANK_BEIR_MIRROR"):
        env.pop(var, None)
    _run(["dvc", "add", "-q", "sources/acme"], project, env)  # the user's own data, versioned by DVC
    sets = [a for o in shrunk_overrides(tiny_model_dir) + [
        f"data.sources={{acme: {{path: sources/acme}}, toy: {{path: {toy}}}}}",
        "data.train=acme/train", "data.eval_sets={acme: [test], toy: [train]}", "data.validation_size=10",
        f"tracking.enabled={str(not targets).lower()}",
    ] for a in ("--set", o)]
    cli = [sys.executable, str(project / "cli.py"), "--profile", "demo", *sets]
    out = _run([*cli, "repro", *targets], project, env)
    expected = (lambda stages: stages & set(targets)) if targets else (lambda stages: stages)
    return project, toy, [*cli, "repro", *targets], env, out, expected


def _repro(byo) -> set[str]:
    project, _, repro, env, _, _ = byo
    return set(re.findall(r"Running stage '([^']+)'", _run(repro, project, env)))


@pytest.mark.integration
def test_the_demo_runs_on_your_own_folders_and_a_repeat_only_refingerprints(byo):
    project, toy, _, _, out, expected = byo
    ws = project / "runs" / "demo"
    ran = set(re.findall(r"Running stage '([^']+)'", out))
    assert ran == expected({"download", "tables", *ACME_STAGES, *TOY_STAGES})
    assert (ws / "candidates" / "toy" / "train.trec").is_file()
    assert (project / "data" / "beir" / "acme" / "corpus.jsonl").is_symlink()  # read in place, not copied
    assert _repro(byo) == {"download"}  # nothing changed: the manifests are identical, nothing downstream runs
    os.utime(toy / "corpus.jsonl")  # touched, same bytes
    assert _repro(byo) == {"download"}


@pytest.mark.slow  # two more repros of the mining stages: minutes on two cores (the first test keeps the default run's DVC check)
@pytest.mark.integration
def test_new_judgments_rerun_exactly_their_datasets_stages(byo):
    project, toy, _, env, _, expected = byo
    with open(toy / "qrels" / "train.tsv", "a") as fh:
        fh.write("q0-0\td0-5\t1\r\n")
    assert _repro(byo) == expected({"download", "tables", *TOY_STAGES})

    # The DVC-tracked folder: unprotect (its files are links into DVC's cache), append, `dvc add` again.
    _run(["dvc", "unprotect", "sources/acme"], project, env)
    acme = project / "sources" / "acme"
    with open(acme / "corpus.jsonl", "a") as fh:
        fh.write(json.dumps({"_id": "new-1", "title": "A new abstract", "text": "Vitamin D and bone density."}) + "\n")
    before = (project / "sources" / "acme.dvc").read_text()
    _run(["dvc", "add", "-q", "sources/acme"], project, env)
    assert (project / "sources" / "acme.dvc").read_text() != before  # the new version is what git commits
    assert _repro(byo) == expected({"download", "tables", *ACME_STAGES})
    manifest = json.loads((project / "runs" / "demo" / "datasets" / "acme.json").read_text())["files"]
    assert set(manifest) == {"corpus.jsonl", "queries.jsonl", "qrels/test.tsv", "qrels/train.tsv"}
