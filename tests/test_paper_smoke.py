"""The paper's configuration end to end, shrunk: ``pgrank --profile paper-smoke repro`` (profiles/paper-smoke.yaml).

bench/paper_smoke.py writes what the profile reads (synthetic BEIR sets of the paper's 14 datasets, the four
paper models tiny and with random weights) into a checkout's ``data/paper-smoke/``; the pipeline then runs
through DVC as a user runs it, and the tables are read back as a reader reads them
(:func:`paper_smoke.table_problems`).

* By default, a slice: MS MARCO dev and TREC-DL 2019 (graded 0-3, with judged non-relevant documents) and ArguAna
  (queries that are documents of the corpus); every stage kind, every system, both warm starts in ``tower: both``,
  every table: 25 DVC stages.
* ``-m slow``: all 15 evaluation sets, 103 stages.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import time
import zipfile
from pathlib import Path

import pytest
import yaml
from shrunk import project_copy

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))

import paper_smoke  # noqa: E402

# Whichever test comes first runs the slice (25 stages, each a process of its own: minutes of CPU).
SLICE_TIMEOUT = pytest.mark.timeout(1800)
SLICE = ["msmarco/dev", "msmarco/test", "arguana/test"]
COLUMNS = ["BM25", "SBERT", "TAS-B", "SPLADEv2", "PG-Rank with SBERT", "PG-Rank with TAS-B"]
# What the profile may change of params.yaml: sizes, and where its data and models are.
SIZE_KEYS = {
    "paths.root", "paths.data", "paths.embeddings", "data.mirror", "data.validation_size",
    "mine.candidates", "mine.batch_size", "mine.max_seq_length", "mine.chunk_size",
    "train.epochs", "train.batch_size", "train.max_query_length", "train.max_doc_length", "train.chunk_tokens",
    "train.keep_epochs", "train.pg.num_samples",
    "evaluate.policy_epochs", "evaluate.top_k", "evaluate.batch_size", "evaluate.max_seq_length",
}
PAPER_MODELS = {"sentence-transformers/gtr-t5-xl": "gtr-t5", "sentence-transformers/msmarco-distilbert-dot-v5": "sbert",
                "sentence-transformers/msmarco-distilbert-base-tas-b": "tas-b", "naver/splade_v2_distil": "splade"}


def _flat(doc: dict, prefix: str = "") -> dict[str, object]:
    out = {}
    for key, value in doc.items():
        if isinstance(value, dict) and value:
            out.update(_flat(value, f"{prefix}{key}."))
        else:
            out[f"{prefix}{key}"] = value
    return out


def test_the_profile_is_the_paper_configuration_with_only_sizes_changed():
    from pgrank.config import load_params

    paper = load_params(ROOT / "params.yaml").model_dump(mode="json")
    smoke = load_params(ROOT / "params.yaml", profile="paper-smoke").model_dump(mode="json")
    offline = smoke["models"].pop("offline")
    assert offline.pop("sentence-transformers/all-MiniLM-L6-v2") == paper["models"].pop("offline").popitem()[1]
    assert {hub: entry["path"] for hub, entry in offline.items()} == {
        hub: f"data/paper-smoke/models/{kind}" for hub, kind in PAPER_MODELS.items()}
    assert all(entry["revision"] is None for entry in offline.values())  # accepted whatever models.revisions pins
    changed = {k for k, v in _flat(smoke).items() if _flat(paper).get(k) != v}
    assert changed <= SIZE_KEYS, changed - SIZE_KEYS
    assert {"train.epochs", "mine.candidates", "data.mirror"} <= changed  # the comparison sees the profile
    params = load_params(ROOT / "params.yaml", profile="paper-smoke")
    assert params.train.epochs >= 2 and 0 < params.evaluate.policy_epochs[0] < params.train.epochs  # a middle epoch
    assert len(params.data.eval_sets) == 15 and params.tracking.enabled and params.train.tower == "both"


def test_the_mirror_has_every_paper_dataset_with_beirs_splits_and_judgments(tmp_path):
    from pgrank.data.beir import load_split
    from pgrank.download.catalogue import BEIR_SIZES, PAPER_DATASETS
    from pgrank.download.dataset_checks import validate_folder
    from pgrank.paths import Paths

    mirror = paper_smoke.write_mirror(tmp_path / "mirror")
    again = paper_smoke.write_mirror(tmp_path / "again")
    assert (mirror / "SHA256SUMS").read_text() == (again / "SHA256SUMS").read_text()  # the same bytes every time
    assert sorted(p.stem for p in mirror.glob("*.zip")) == sorted(PAPER_DATASETS)
    paths = Paths(root=tmp_path / "runs", data=tmp_path / "beir", embeddings=tmp_path / "emb")
    grades = {}
    for name in PAPER_DATASETS:
        with zipfile.ZipFile(mirror / f"{name}.zip") as zf:
            zf.extractall(tmp_path / "beir")
        summary = validate_folder(tmp_path / "beir" / name, name)
        splits = set(BEIR_SIZES[name]) - {"documents"}
        assert set(summary.judgments) == splits and not any(summary.missing_documents.values())
        assert 100 <= summary.documents <= 200
        for split in splits:
            data = load_split(paths, name, split)
            grades[name, split] = {g for docs in data.qrels.values() for g in docs.values()}
            identical = [q for q in data.queries if q in data.corpus]
            if name in ("arguana", "quora"):  # BEIR's ignore_identical_ids matters there
                assert identical == list(data.queries) and all(data.corpus[q]["text"] == data.queries[q]
                                                               for q in identical)
            else:
                assert identical == []
    assert grades["msmarco", "test"] == {0, 1, 2, 3}  # TREC-DL 2019
    assert all(grades[name, "test"] == {0, 1, 2} for name in ("trec-covid", "webis-touche2020", "dbpedia-entity"))
    assert grades["nfcorpus", "test"] == {1, 2} and grades["scidocs", "test"] == {0, 1}
    assert all(grades[key] == {1} for key in grades if key[0] in ("nq", "fiqa", "arguana", "quora", "fever", "scifact"))
    assert len(load_split(paths, "msmarco", "train").queries) >= 40  # a few training batches


def _run(project: Path, overrides: list[str]) -> tuple[subprocess.CompletedProcess, float]:
    """``pgrank --profile paper-smoke [--set ...] repro`` in ``project``, as a user runs it."""
    env = {k: v for k, v in os.environ.items()
           if k not in ("MLFLOW_TRACKING_URI", "PGRANK_BEIR_MIRROR", "PGRANK_PROFILE")}
    env.update(PATH=f"{Path(sys.executable).parent}{os.pathsep}{env['PATH']}", HF_HUB_OFFLINE="1",
               TRANSFORMERS_OFFLINE="1")
    cmd = ["pgrank", "--profile", "paper-smoke", *(a for o in overrides for a in ("--set", o)), "repro"]
    start = time.perf_counter()
    out = subprocess.run(cmd, cwd=project, env=env, capture_output=True, text=True)
    return out, time.perf_counter() - start


@pytest.fixture(scope="module")
def sliced(tmp_path_factory):
    """The slice run in a fresh checkout: (workspace, completed process, seconds)."""
    project = project_copy(tmp_path_factory.mktemp("paper-smoke") / "pgrank")
    paper_smoke.prepare(project / "data" / "paper-smoke")
    out, seconds = _run(project, [f"data.eval_sets=[{', '.join(SLICE)}]"])
    assert out.returncode == 0, out.stderr[-3000:]
    return project / "runs" / "paper-smoke", out, seconds


@SLICE_TIMEOUT
def test_a_slice_of_the_paper_runs_every_stage_kind_and_fills_every_table(sliced):
    ws, out, seconds = sliced
    print(f"paper-smoke slice: {seconds:.0f} s")
    stages = set(re.findall(r"Running stage '([^']+)'", out.stdout))
    datasets = ["msmarco", "arguana"]
    expected = {"download", "mine-train", "tables", "train@sbert-pg", "train@tas-b-pg"}
    expected |= {f"mine@{d}" for d in datasets} | {f"evaluate-bm25@bm25-{d}" for d in datasets}
    expected |= {f"evaluate-dense@{s}-{d}" for s in ("sbert", "tas-b") for d in datasets}
    expected |= {f"evaluate-sparse@splade-v2-{d}" for d in datasets}
    expected |= {f"evaluate-policy@{w}-pg-{d}" for w in ("sbert", "tas-b") for d in datasets}
    assert stages == expected
    assert paper_smoke.table_problems(ws) == []
    header = (ws / "tables" / "full-out-of-domain.md").read_text().splitlines()[2]
    assert header == "| Dataset | " + " | ".join(COLUMNS) + " |"
    rows = [line.split(" | ")[0] for line in (ws / "tables" / "rerank-ndcg5.md").read_text().splitlines()
            if line.startswith("| ") and not line.startswith(("| Dataset", "| :---"))]
    assert rows == ["| MS MARCO dev‡", "| TREC-DL 2019", "| ArguAna"]
    statistics = (ws / "tables" / "dataset-statistics.md").read_text()
    assert "| TREC-DL 2019 | misc. | 5 (43) | 200 (9.1k) | 4.0 (95.4) | 4-level (3-level) |" in statistics


@SLICE_TIMEOUT
def test_the_paper_models_are_what_the_stages_loaded(sliced):
    ws, _, _ = sliced
    params = yaml.safe_load((ws / "params.yaml").read_text())
    for hub_id, kind in PAPER_MODELS.items():  # offline copies, made absolute for the workspace's stages
        assert params["models"]["offline"][hub_id]["path"] == str(ws.parents[1] / "data" / "paper-smoke" / "models" / kind)
    for warm, pooling in (("sbert", "mean"), ("tas-b", "cls")):  # each warm start's own stack, trained end to end
        model = ws / "models" / warm / "pg" / "epoch-2"
        assert json.loads((model / "1_Pooling" / "config.json").read_text())["pooling_mode"] == pooling
        assert json.loads((model / "config.json").read_text())["model_type"] == "distilbert"
        meta = json.loads((model / "pgrank.json").read_text())
        assert (meta["tower"], meta["similarity"], meta["epoch"]) == ("both", "dot", 2)
    history = json.loads((ws / "training" / "sbert" / "pg" / "history.json").read_text())
    assert [h["epoch"] for h in history] == [0, 1, 2]


@SLICE_TIMEOUT
def test_arguanas_queries_are_documents_and_their_own_ids_are_left_out_of_the_metrics(sliced):
    """ArguAna's queries are documents of its corpus: each finds itself (the runs keep it, as BEIR's do) and
    ``evaluate.ignore_identical_ids`` leaves it out of every metric, as BEIR does."""
    from pgrank.core.trec_eval import evaluate_run
    from pgrank.data.runs import read_run

    ws, _, _ = sliced
    qrels_file = ws.parents[1] / "data" / "paper-smoke" / "beir" / "arguana" / "qrels" / "test.tsv"
    qrels: dict[str, dict[str, int]] = {}
    for line in qrels_file.read_text().splitlines()[1:]:
        qid, doc, grade = line.split("\t")
        qrels.setdefault(qid, {})[doc] = int(grade)
    mined = read_run(ws / "candidates" / "arguana" / "test.trec")
    assert all(qid in docs for qid, docs in mined.items()) and set(mined) == set(qrels)
    for system in ("bm25", "sbert", "tas-b", "splade-v2", "pgrank-sbert/pg", "pgrank-tas-b/pg"):
        for stage in ("rerank", "full"):
            folder = ws / "results" / system / "arguana" / "test" / stage
            run = read_run(folder / "run.trec")
            reported = json.loads((folder / "metrics.json").read_text())["metrics"]["ndcg@10"]
            assert reported == pytest.approx(evaluate_run(qrels, run, ignore_identical_ids=True)[0]["ndcg@10"])
            if system == "bm25":  # the query's own text ranks first; its counter-argument is next, and counts as first
                assert all(max(docs, key=docs.get) == qid for qid, docs in run.items())
                assert evaluate_run(qrels, run)[0]["ndcg@1"] == 0 and reported == 1.0


@SLICE_TIMEOUT
def test_mlflow_tracked_every_stage_of_the_slice(sliced):
    ws, _, _ = sliced
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri=f"sqlite:///{ws / 'mlflow.db'}")
    runs = client.search_runs([client.get_experiment_by_name("pgrank").experiment_id])
    (parent,) = [r for r in runs if r.data.tags.get("stage") == "pipeline"]
    children = [r.data.tags.get("stage") for r in runs if r.data.tags.get("mlflow.parentRunId") == parent.info.run_id]
    assert sorted(children) == sorted(["download", *["mine"] * 3, "train", "train", *["evaluate"] * 12, "tables"])
    versions = client.search_model_versions("name='pgrank-retriever'")
    assert len(versions) == 2  # one registered policy per warm start


@SLICE_TIMEOUT
def test_each_stage_process_of_the_slice_reports_its_time_and_memory(sliced):
    """What bench/paper_smoke.py --out and bench/pipeline_resources.py record: every stage's own wall time and its
    process's peak RSS from its MLflow run, summed and maximised per stage kind; the stages' times add up to no more
    than the whole run's."""
    from stage_resources import disk_bytes, stage_resources

    ws, _, seconds = sliced
    used = stage_resources(ws)
    assert len(used["stages"]) == 19 and {s["status"] for s in used["stages"]} == {"FINISHED"}
    groups = used["groups"]
    assert {k: g["runs"] for k, g in groups.items()} == {"download": 1, "evaluate": 12, "mine": 3, "tables": 1,
                                                              "train": 2}
    assert all(0 < s["wall_s"] < seconds and s["peak_rss_mib"] > 40 for s in used["stages"])  # a Python with numpy
    assert groups["evaluate"]["wall_s"] == pytest.approx(sum(s["wall_s"] for s in used["stages"]
                                                             if s["stage"] == "evaluate"), abs=0.5)
    assert sum(s["wall_s"] for s in used["stages"]) < seconds
    assert disk_bytes(ws) >= disk_bytes(ws / "tables") > 0


@SLICE_TIMEOUT
def test_the_check_notices_a_missing_cell(sliced, tmp_path):
    ws, _, _ = sliced
    shutil.copy(ws / "params.yaml", tmp_path / "params.yaml")
    shutil.copytree(ws / "tables", tmp_path / "tables")
    table = tmp_path / "tables" / "rerank-out-of-domain.md"
    text = table.read_text()
    row = next(line for line in text.splitlines() if line.startswith("| ArguAna"))
    cells = row.split(" | ")
    cells[3] = "— (0.480)"  # SPLADEv2 not computed (the paper's figure shown)
    table.write_text(text.replace(row, " | ".join(cells)))
    (tmp_path / "tables" / "bars-full.png").unlink()
    assert paper_smoke.table_problems(tmp_path) == [
        f"{tmp_path / 'tables' / 'bars-full.png'}: missing",
        "rerank-out-of-domain: ArguAna / SPLADEv2: no reproduced number ('— (0.480)')"]


@pytest.mark.slow
@pytest.mark.timeout(3600)
def test_the_paper_configuration_runs_end_to_end_and_fills_every_table(tmp_path):
    """All 15 evaluation sets, 103 stages: every paper table complete."""
    project = project_copy(tmp_path / "pgrank")
    paper_smoke.prepare(project / "data" / "paper-smoke")
    out, seconds = _run(project, [])
    assert out.returncode == 0, out.stderr[-3000:]
    print(f"paper-smoke: {seconds:.0f} s")
    ws = project / "runs" / "paper-smoke"
    assert len(set(re.findall(r"Running stage '([^']+)'", out.stdout))) == 103
    assert paper_smoke.table_problems(ws) == []
    for name in ("rerank-ndcg5", "rerank-ndcg3", "rerank-ndcg1", "dataset-statistics"):
        rows = [line for line in (ws / "tables" / f"{name}.md").read_text().splitlines() if line.startswith("| ")]
        assert len(rows) == 2 + 15, name
    header = (ws / "tables" / "full-out-of-domain.md").read_text().splitlines()[2]
    assert header == "| Dataset | " + " | ".join(COLUMNS) + " |"
    ablation = (ws / "tables" / "epoch-ablation.md").read_text()
    assert "| Avg. on other BEIR datasets (n = 14) |" in ablation and "(0.579, " in ablation  # the paper's average
