"""``pgrank export``: a policy trained for real on the toy project, exported, loads in plain sentence-transformers
(a fresh interpreter that never imports pgrank), encodes as pgrank's own encoders do, and reranks the evaluated
candidates to the nDCG@10 that ``pgrank evaluate`` wrote. Its model card holds the facts; the upload runs the real
``huggingface_hub`` client against a local stand-in for the hub (tests/export/hub_stand_in.py)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import yaml
from hub_stand_in import HubStandIn
from toy_project import make_project

ROOT = Path(__file__).resolve().parents[2]

# Loads the export with sentence-transformers alone, reranks each query's candidates, and proves pgrank stayed out.
PLAIN = """
import json, sys
import numpy as np
from sentence_transformers import SentenceTransformer

folder, inputs, out = sys.argv[1:]
task = json.load(open(inputs))
model = SentenceTransformer(folder, device="cpu")
q = model.encode_query(task["queries"], convert_to_tensor=True)
d = model.encode_document(task["documents"], convert_to_tensor=True)
scores = model.similarity(q, d).numpy()
np.save(out + "/queries.npy", q.numpy())
np.save(out + "/documents.npy", d.numpy())
run = {qid: {doc: float(scores[i, j]) for doc, j in task["candidates"][qid]} for i, qid in enumerate(task["qids"])}
json.dump({"run": run, "pgrank_imported": any(m.split(".")[0] == "pgrank" for m in sys.modules)}, open(out + "/run.json", "w"))
"""


def cli(*args: str, cwd: Path, env: dict | None = None) -> subprocess.CompletedProcess:
    base = {k: v for k, v in os.environ.items() if k not in ("PGRANK_PROFILE", "MLFLOW_TRACKING_URI")}
    return subprocess.run([sys.executable, str(ROOT / "cli.py"), *args], cwd=cwd, capture_output=True, text=True,
                          env={**base, **(env or {})}, timeout=300)


def tree(folder: Path) -> dict[str, bytes]:
    return {p.relative_to(folder).as_posix(): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


def one_error(proc: subprocess.CompletedProcess) -> str:
    """The one ``pgrank: error:`` line a refused command prints, checked to be all it printed after its logs."""
    assert proc.returncode == 2, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert lines[-1].startswith("pgrank: error: ") and "Traceback" not in proc.stderr, proc.stderr
    return lines[-1]


@pytest.fixture(scope="module")
def project(tmp_path_factory, tiny_model_dir):
    """The toy project with a query-tower policy trained for one epoch, and it and its warm start evaluated under the
    torch backend; its params file written where the CLI reads it."""
    from pgrank.evaluation.stage import evaluate_dataset
    from pgrank.training.trainer import train

    tmp = tmp_path_factory.mktemp("export")
    params, paths = make_project(tmp, tiny_model_dir, overrides={
        "train.epochs": 1, "train.keep_epochs": [1], "data.eval_sets": ["toy/validation"], "models.backend": "torch",
        "evaluate.max_seq_length": 32, "evaluate.top_k": 20})
    warm = str(tiny_model_dir)
    train(params, paths, warm, device="cpu", progress=False)
    for system in (warm, f"pgrank-{warm}"):
        evaluate_dataset(params, paths, system, "toy")
    (tmp / "params.yaml").write_text(yaml.safe_dump(params.model_dump(mode="json"), sort_keys=False))
    return params, paths, tmp


@pytest.fixture(scope="module")
def exported(project):
    params, paths, tmp = project
    proc = cli("export", "--to", "out/policy", cwd=tmp)
    assert proc.returncode == 0, proc.stderr
    assert ": epoch 1 of 1, the last; nDCG@10 of 2 evaluated sets and stages in the model card -> out/policy" in proc.stdout
    assert f"configuration: {tmp / 'params.yaml'}; license: other" in proc.stdout  # the project's own run
    return tmp / "out" / "policy"


def test_the_export_loads_in_plain_sentence_transformers_and_reproduces_the_evaluated_ndcg(project, exported, tmp_path):
    from pgrank.core.trec_eval import evaluate_run, mean_metrics
    from pgrank.data.beir import load_topics
    from pgrank.data.candidate_store import open_candidates
    from pgrank.evaluation.systems import open_system
    from pgrank.models.backends import load_inference_encoder
    from pgrank.retrieval.dense.encoding import encode_documents

    params, paths, _ = project
    system = f"pgrank-{params.train.warm_starts[0]}"
    queries, qrels = load_topics(paths, "toy", "validation")
    store = open_candidates(paths, "toy", "validation")
    qids = sorted(q for q in queries if store.index(q) is not None)
    retriever = open_system(params, paths, system, "toy")
    rows = np.unique(np.concatenate([store.candidates(store.index(q))[0] for q in qids])).astype(np.int64)
    where = {int(r): j for j, r in enumerate(rows)}
    ids = retriever.doc_ids.take(rows)
    task = {"qids": qids, "queries": [queries[q] for q in qids], "documents": retriever.store.texts(rows),
            "candidates": {q: [[str(ids[where[int(r)]]), where[int(r)]] for r in store.candidates(store.index(q))[0]]
                           for q in qids}}
    (tmp_path / "task.json").write_text(json.dumps(task))
    proc = subprocess.run([sys.executable, "-c", PLAIN, str(exported), str(tmp_path / "task.json"), str(tmp_path)],
                          cwd=tmp_path, capture_output=True, text=True, timeout=300,
                          env={**os.environ, "HF_HUB_OFFLINE": "1", "PYTHONPATH": ""})
    assert proc.returncode == 0, proc.stderr
    plain = json.loads((tmp_path / "run.json").read_text())
    assert plain["pgrank_imported"] is False

    # the same embeddings as pgrank's own encoders of the policy: the trained query route, the frozen documents
    np.testing.assert_allclose(np.load(tmp_path / "queries.npy"), retriever.encode(task["queries"]), atol=1e-5)
    documents, _ = load_inference_encoder(retriever.system.document_model, params.models, paths,
                                          max_seq_length=params.evaluate.max_seq_length)
    exported_documents = np.load(tmp_path / "documents.npy")
    np.testing.assert_allclose(exported_documents, encode_documents(documents, task["documents"], batch_size=8), atol=1e-5)
    # ... which evaluation reads back from the corpus-embedding artifact, stored at float16
    np.testing.assert_allclose(exported_documents, retriever.emb.vectors(rows), rtol=2e-3, atol=2e-3)

    # reranking the evaluated candidate sets with the export gives the nDCG@10 that pgrank evaluate wrote
    recorded = json.loads((paths.results(system, "toy", "validation", "rerank") / "metrics.json").read_text())
    _, per_query = evaluate_run({q: qrels[q] for q in qids}, plain["run"], (10,))
    assert recorded["queries"] == len(qids) == 6
    assert mean_metrics(per_query)["ndcg@10"] == pytest.approx(recorded["metrics"]["ndcg@10"], abs=1e-4)


def test_the_model_card_holds_the_warm_start_the_objective_and_the_figures(project, exported):
    params, paths, _ = project
    warm = params.train.warm_starts[0]
    card = (exported / "README.md").read_text()
    _, front, body = card.split("---\n", 2)
    meta = yaml.safe_load(front)
    assert meta["library_name"] == "sentence-transformers" and meta["pipeline_tag"] == "sentence-similarity"
    assert {"pgrank", "neural-pg-rank"} <= set(meta["tags"])
    assert "base_model" not in meta  # a local warm start
    assert meta["license"] == "other" and "no license in the warm start's model card on this machine" in body
    assert f"# pgrank-{warm}" in body and f"`{warm}`" in body
    assert "(loss `pg`, run `pg`)" in body and "| `train.pg.num_samples` | 8 |" in body and "| `train.epochs` | 1 |" in body
    assert "`toy/train` (`data.train`): 18 training queries, 6 validation queries." in body
    assert "Candidate documents: 10 per query." in body
    for stage, label in (("rerank", "second stage (rerank)"), ("full", "first stage (full corpus)")):
        ours = json.loads((paths.results(f"pgrank-{warm}", "toy", "validation", stage) / "metrics.json").read_text())
        theirs = json.loads((paths.results(warm, "toy", "validation", stage) / "metrics.json").read_text())
        row = (f"| toy/validation | {label} | 6 | {theirs['metrics']['ndcg@10']:.4f} | "
               f"{ours['metrics']['ndcg@10']:.4f} ({ours['metrics']['ndcg@10'] - theirs['metrics']['ndcg@10']:+.4f}) |")
        assert row in body
    # how the figures were computed, as metrics.json recorded it: here the torch backend, which the export reproduces
    assert ours["encoding"] == {"queries": "torch", "documents": "torch", "document_vectors": "float16"}
    assert ("nDCG@10 from `pgrank evaluate` (queries encoded with the `torch` backend, documents with `torch`, "
            "document embeddings stored as float16); p:") in body and "can differ" not in body
    assert "Policy-Gradient Training of Language Models for Ranking" in body and "Joachims" in body
    assert f'SentenceTransformer("{exported.resolve()}")' in body and "encode_query" in body and "encode_document" in body
    record = json.loads((exported / "pgrank.json").read_text())
    assert record["exported_as"] == f"pgrank-{warm}" and record["tower"] == "query" and record["epoch"] == 1
    assert record["checkpoint"].startswith("models/") and record["checkpoint"].endswith("/pg/epoch-1")  # as results name it


def test_the_card_says_which_backends_computed_its_figures_and_that_plain_float32_can_differ():
    from dataclasses import replace

    from pgrank.export.model_card import Figure, PolicyFacts, _figures_table

    facts = PolicyFacts(system="pgrank-minilm", warm_start="minilm", warm_start_model="m", base_model=None, loss="pg",
                        run="pg", tower="query", similarity="dot", max_seq_length=256, train_set="scifact/train",
                        train_queries=None, validation_queries=None, candidates="", epoch=4, epochs=4, selection="",
                        significance_test="wilcoxon", backend="auto")
    int8 = (("document_vectors", "float16"), ("documents", "onnx-int8"), ("queries", "torch"))
    line = _figures_table(replace(facts, figures=[Figure("scifact", "test", s, 300, 0.73, 0.65, encoding=int8)
                                                  for s in ("rerank", "full")]))[0]
    assert "queries encoded with the `torch` backend, documents with `onnx-int8`, document embeddings stored as " \
           "float16; plain `SentenceTransformer` runs this folder's float32 weights, so its nDCG@10 can differ" in line
    # float32 ONNX documents compute what plain float32 sentence-transformers computes: no warning
    onnx = (("document_vectors", "float16"), ("documents", "onnx"), ("queries", "torch"))
    line = _figures_table(replace(facts, figures=[Figure("scifact", "test", "rerank", 300, 0.73, encoding=onnx)]))[0]
    assert "documents with `onnx`" in line and "can differ" not in line
    # results written without the record, or under different backends, fall back to the configured backend
    old = _figures_table(replace(facts, figures=[Figure("scifact", "test", "rerank", 300, 0.73, 0.65)]))[0]
    assert "(`models.backend: auto`)" in old
    mixed = [Figure("scifact", "test", "rerank", 300, 0.73, encoding=int8), Figure("nfcorpus", "test", "rerank", 323, 0.3)]
    assert "(`models.backend: auto`)" in _figures_table(replace(facts, figures=mixed))[0]


def test_the_committed_demos_export_reproduces_every_figure_it_was_evaluated_at_to_1e4():
    """The record of ``python studies/exported_policy.py --profile demo``: the demo's policy exported and searched with
    plain ``SentenceTransformer(DIR)`` in float32, on every evaluation set and stage, against ``pgrank evaluate``;
    taken under the backends the committed demo profile runs."""
    from pgrank.config import load_params

    params = load_params(ROOT / "params.yaml", [], "demo")
    record = json.loads((ROOT / "studies" / "out" / "exported_policy-demo.json").read_text())["result"]
    assert record["backend"] == params.models.backend and record["backends"] == dict(params.models.backends)
    assert set(record["sets"]) == set(params.data.eval_sets)
    for eval_set, stages in record["sets"].items():
        assert set(stages) == {"rerank", "full"}, eval_set
        for stage, figures in stages.items():
            assert abs(figures["plain"] - figures["pgrank"]) <= 1e-4, (eval_set, stage, figures)
            assert abs(figures["warm_start_plain"] - figures["warm_start_pgrank"]) <= 1e-4, (eval_set, stage, figures)


def test_a_hub_model_warm_start_is_the_cards_base_model():
    from pgrank.export.model_card import _hub_id

    assert _hub_id("sentence-transformers/all-MiniLM-L6-v2@8b3219a9") == "sentence-transformers/all-MiniLM-L6-v2"
    assert _hub_id("minilm") is None and _hub_id(str(ROOT)) is None


def test_an_earlier_export_is_replaced_and_anything_else_refused(project, exported):
    from pgrank.export.folder import export_policy

    params, paths, tmp = project
    before = tree(exported)
    assert export_policy(params, paths, exported).folder == exported
    assert tree(exported) == before  # the same policy writes the same bytes
    taken = tmp / "taken"
    taken.mkdir()
    (taken / "notes.txt").write_text("mine")
    assert "--to taken: the folder exists and is not an earlier pgrank export" in one_error(cli("export", "--to", "taken", cwd=tmp))
    assert tree(taken) == {"notes.txt": b"mine"}


@pytest.mark.parametrize(("args", "expect"), [
    (["--warm-start", "sbert"], "--warm-start sbert: not in train.warm_starts"),
    (["--objective", "listnet"], "objective 'listnet' is not in train.objectives"),
    (["--private"], "--private: only with --hub"),
    (["--hub", "me/pgrank/toy"], "--hub me/pgrank/toy: not a repository id"),
    (["--hub", "me/pgrank-toy"], "--hub me/pgrank-toy: HF_HUB_OFFLINE is set"),  # the tests run offline
])
def test_bad_export_options_give_one_error_line_and_write_nothing(project, args, expect):
    _, _, tmp = project
    proc = cli("export", "--to", "refused", *args, cwd=tmp, env={"HF_HUB_OFFLINE": "1"})
    assert expect in one_error(proc)
    assert not (tmp / "refused").exists()


def test_no_trained_policy_gives_one_error_line_and_writes_nothing(tmp_path, tiny_model_dir):
    params, _ = make_project(tmp_path, tiny_model_dir)
    (tmp_path / "params.yaml").write_text(yaml.safe_dump(params.model_dump(mode="json"), sort_keys=False))
    assert "no checkpoint for system" in one_error(cli("export", "--to", "out", cwd=tmp_path))
    assert not (tmp_path / "out").exists()


def test_the_upload_sends_the_exported_folder_to_the_hub_through_huggingface_hub(project, exported):
    _, _, tmp = project
    with HubStandIn() as hub:
        env = {"HF_ENDPOINT": hub.url, "HF_TOKEN": "hf_stand_in", "HF_HUB_OFFLINE": "0", "HF_HUB_DISABLE_TELEMETRY": "1"}
        proc = cli("export", "--to", "out/hub", "--hub", "me/pgrank-toy", "--private", cwd=tmp, env=env)
    assert proc.returncode == 0, proc.stderr
    assert f"uploaded -> {hub.url}/me/pgrank-toy/commit/" in proc.stdout
    record = hub.record
    assert record.unknown == [] and record.tokens == {"Bearer hf_stand_in"}
    assert record.repos["me/pgrank-toy"]["visibility"] == "private"
    assert record.files["me/pgrank-toy"] == tree(tmp / "out" / "hub")
    assert {"modules.json", "README.md", "query_0_Transformer/model.safetensors"} <= set(record.files["me/pgrank-toy"])
    assert 'SentenceTransformer("me/pgrank-toy")' in (tmp / "out" / "hub" / "README.md").read_text()



def test_the_card_of_the_demo_configuration_names_its_hub_warm_start_data_and_selection(tmp_path):
    from pgrank.config import load_params
    from pgrank.export.model_card import policy_facts, render
    from pgrank.paths import Paths

    params = load_params(ROOT / "params.yaml", [], "demo")
    paths = Paths.from_config(params.paths, base=tmp_path)  # nothing trained or evaluated there
    meta = {"epoch": 2, "alpha": 0.5, "selected_by": "guarded", "tower": "query", "similarity": "dot"}
    card = render(policy_facts(params, paths, "pgrank-minilm", meta, "models/minilm/pg/selected"), "me/pgrank-minilm")
    _, front, body = card.split("---\n", 2)
    meta = yaml.safe_load(front)
    assert meta["base_model"] == "sentence-transformers/all-MiniLM-L6-v2"
    assert {"BeIR/scifact", "BeIR/nfcorpus"} <= set(meta["datasets"]) and "BeIR/dbpedia" not in meta["datasets"]
    train = params.train
    assert (f"epoch 2 of {train.epochs}, its weights 0.5 x that epoch's + 0.5 x the warm start's, chosen by "
            "train.selection.rule guarded") in body
    for key, value in (("pg.num_samples", train.pg.num_samples), ("learning_rate", train.learning_rate),
                       ("selection.rule", train.selection.rule), ("tower", "query")):
        assert f"| `train.{key}` | {value} |" in body
    assert (f"| `train.pg.kl_coef` | {train.pg.kl_coef} |" in body) == (train.pg.kl_coef > 0)
    assert (f"| `train.document_anchor.coef` | {train.document_anchor.coef} |" in body) == (train.document_anchor.coef > 0)
    assert "No results of `pgrank evaluate` for this checkpoint were found" in body
    assert 'SentenceTransformer("me/pgrank-minilm")' in body
    assert meta["license"] == "apache-2.0" and "(the warm start's, from its model card)" in body  # the offline copy's
    # the demo's objective, named for what it is: PG-Rank plus a KL term, a document anchor and a selection rule
    assert ("PG-Rank (the policy gradient of Neural PG-Rank) plus a top-1 KL term to the warm start's first-place "
            "distribution (`train.pg.kl_coef` 0.1), a document anchor to the warm start's document tower") in body
    assert "a selection rule over epochs and weight mixtures with the warm start on validation splits" in body
    assert "Objective: this is not plain PG-Rank." in body and "A Neural PG-Rank policy" not in body


def test_an_upload_to_an_existing_repository_adds_a_commit_and_an_unreachable_hub_one_error(exported, monkeypatch):
    import socket

    from huggingface_hub import constants

    from pgrank.errors import PgrankError
    from pgrank.export.hub import upload

    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)  # the suite runs offline; these requests stay on 127.0.0.1
    monkeypatch.setenv("HF_TOKEN", "hf_stand_in")
    with HubStandIn() as hub:
        monkeypatch.setattr(constants, "ENDPOINT", hub.url)
        upload(exported, "me/again")
        upload(exported, "me/again")  # the repository exists: create_repo(exist_ok=True) goes on
    assert list(hub.record.repos) == ["me/again"] and len(hub.record.commits) >= 2 and hub.record.unknown == []
    assert hub.record.files["me/again"] == tree(exported)
    with socket.socket() as free:
        free.bind(("127.0.0.1", 0))
        port = free.getsockname()[1]
    monkeypatch.setattr(constants, "ENDPOINT", f"http://127.0.0.1:{port}")  # nothing listens there
    with pytest.raises(PgrankError, match=rf"--hub me/again: upload to http://127.0.0.1:{port} failed: "):
        upload(exported, "me/again")


def test_the_cards_front_matter_parses_with_huggingface_hub_and_its_model_index_holds_the_evaluated_ndcg(project,
                                                                                                       exported):
    from huggingface_hub import ModelCard
    from huggingface_hub.repocard_data import model_index_to_eval_results

    params, paths, _ = project
    system = f"pgrank-{params.train.warm_starts[0]}"
    card = ModelCard.load(exported / "README.md")
    assert card.data.license == "other" and card.data.library_name == "sentence-transformers"
    name, results = model_index_to_eval_results(card.data.to_dict()["model-index"])
    assert name == system
    got = {(r.dataset_name, r.dataset_split, r.task_type): r.metric_value for r in results}
    for stage, task in (("rerank", "reranking"), ("full", "information-retrieval")):
        recorded = json.loads((paths.results(system, "toy", "validation", stage) / "metrics.json").read_text())
        assert got[("toy (validation, 6 queries)", "validation", task)] == round(recorded["metrics"]["ndcg@10"], 4)
    assert {r.metric_type for r in results} == {"ndcg_at_10"} and len(results) == 2
    assert card.data.eval_results == results  # what the hub itself reads from the card
    body = card.text
    assert "## Limitations" in body and "Evaluated: nDCG@10 on the 2 sets and stages of the table above" in body
    assert "Precision: the figures were computed with queries encoded with the `torch` backend" in body
    assert "PG-Rank (the policy gradient of Neural PG-Rank)" in body and "not plain PG-Rank" not in body  # plain here


def test_the_cards_usage_snippet_loads_the_export_from_any_directory(exported, tmp_path):
    card = (exported / "README.md").read_text()
    snippet = card.split("```python\n", 1)[1].split("```", 1)[0]
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    proc = subprocess.run([sys.executable, "-c", snippet], cwd=elsewhere, capture_output=True, text=True, timeout=300,
                          env={**os.environ, "HF_HUB_OFFLINE": "1", "PYTHONPATH": ""})
    assert proc.returncode == 0, proc.stderr
    assert "tensor([[" in proc.stdout  # one row of two similarities


@pytest.fixture(scope="module")
def workspace_project(project, tmp_path_factory):
    """A project whose profile ``toy`` names a workspace (``runs/toy``, the trained toy run) holding the run's
    composed ``params.yaml``, as ``pgrank --profile toy repro`` leaves it; the project's own params are the paper's."""
    from pgrank.pipeline.workspace import workspace_params

    params, paths, _ = project
    proj = tmp_path_factory.mktemp("workspace-project")
    (proj / "params.yaml").write_text((ROOT / "params.yaml").read_text())
    (proj / "profiles").mkdir()
    (proj / "profiles" / "toy.yaml").write_text("paths:\n  root: runs/toy\n")
    (proj / "runs").mkdir()
    (proj / "runs" / "toy").symlink_to(paths.root, target_is_directory=True)
    ws = (proj / "runs" / "toy").resolve()
    (ws / "params.yaml").write_text("# Composed by pgrank from params.yaml + profiles/toy.yaml + --set ...\n"
                                    + yaml.safe_dump(workspace_params(params, proj, ws), sort_keys=False))
    yield proj, ws
    (ws / "params.yaml").unlink()


def test_export_reads_the_workspaces_recorded_configuration_so_no_set_is_repeated(workspace_project):
    proj, ws = workspace_project
    proc = cli("--profile", "toy", "export", "--to", "out/policy", cwd=proj)
    assert proc.returncode == 0, proc.stderr
    assert f"configuration: {ws / 'params.yaml'}" in proc.stdout  # not the paper's params.yaml + profile
    assert "nDCG@10 of 2 evaluated sets and stages" in proc.stdout
    body = (proj / "out" / "policy" / "README.md").read_text()
    assert "| `train.pg.num_samples` | 8 |" in body and "| `train.epochs` | 1 |" in body  # the run's, not the paper's
    # a --set the run was made with is accepted; one it was not made with would describe another run: refused
    same = cli("--profile", "toy", "--set", "train.pg.num_samples=8", "export", "--to", "out/same", cwd=proj)
    assert same.returncode == 0, same.stderr
    line = one_error(cli("--profile", "toy", "--set", "train.pg.num_samples=16", "export", "--to", "out/other", cwd=proj))
    assert (f"--set train.pg.num_samples=16: the run in {ws} was made with train.pg.num_samples=8 "
            f"({ws / 'params.yaml'}); export reads the run's own configuration: drop the --set") in line
    assert not (proj / "out" / "other").exists()


def test_a_license_is_given_or_refused_in_one_line(project, tmp_path):
    _, _, tmp = project
    proc = cli("export", "--to", str(tmp_path / "mit"), "--license", "mit", cwd=tmp)
    assert proc.returncode == 0, proc.stderr
    card = (tmp_path / "mit" / "README.md").read_text()
    assert "license: mit\n" in card and "given to `pgrank export --license`" in card
    assert "--license Apache 2: not a hub license id" in one_error(cli("export", "--to", "x", "--license", "Apache 2",
                                                                       cwd=tmp))
