"""The evaluation stage: metric parity with BEIR/pytrec_eval, BM25 vs Anserini, systems end to end."""

from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest
import pytrec_eval
import yaml
from toy_project import make_project

from pgrank.config import parse_params
from pgrank.core.trec_eval import evaluate_run
from pgrank.core.significance import paired_test
from pgrank.evaluation.stage import evaluate
from pgrank.paths import Paths

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def beir_project(tmp_path_factory, beir_mirror, minilm_path):
    """scifact and nfcorpus downloaded from the mirror into a fresh project."""
    from pgrank.download.stage import download

    tmp = tmp_path_factory.mktemp("beir")
    doc = yaml.safe_load((ROOT / "params.yaml").read_text())
    doc["paths"] = {"root": str(tmp / "runs"), "data": str(tmp / "data"), "embeddings": str(tmp / "emb")}
    doc["data"].update({"train": "scifact/train", "validation_size": 100, "eval_sets": ["scifact/test", "nfcorpus/test"]})
    doc["tracking"]["enabled"] = False
    doc["mine"].update({"source": "bm25", "candidates": 100})
    doc["evaluate"].update({"systems": {"bm25": ["bm25"], "dense": ["sbert", "tas-b", "minilm"]}, "max_seq_length": 128, "batch_size": 32})
    params = parse_params(doc)
    paths = Paths.from_config(params.paths)
    download(params, paths, ["scifact", "nfcorpus"], str(beir_mirror), progress=False)
    return params, paths


@pytest.mark.integration
@pytest.mark.parametrize("eval_set,anserini,pinned", [("scifact/test", 0.679, 0.6804), ("nfcorpus/test", 0.322, 0.3202)])
def test_bm25_first_stage_matches_anserini(beir_project, eval_set, anserini, pinned):
    """Within 0.015 of Anserini's flat BM25, and within 0.001 of pgrank's pinned figures (0.6804 and 0.3202): the
    tokenizer, the saved index and batched retrieval do not move the scores."""
    params, paths = beir_project
    (result,) = evaluate(params, paths, "bm25", eval_set, ["full"])
    assert abs(result.metrics["ndcg@10"] - anserini) <= 0.015, result.metrics["ndcg@10"]
    assert abs(result.metrics["ndcg@10"] - pinned) <= 0.001, result.metrics["ndcg@10"]
    saved = json.loads((result.folder / "metrics.json").read_text())
    assert saved["metrics"]["ndcg@10"] == result.metrics["ndcg@10"] and saved["stage"] == "full"
    lines = (result.folder / "run.trec").read_text().splitlines()
    assert len(lines) >= 1000 and lines[0].split()[1] == "Q0" and lines[0].split()[3] == "1"


@pytest.mark.integration
def test_graded_ndcg_on_nfcorpus_equals_pytrec_eval(beir_project):
    params, paths = beir_project
    from pgrank.data.beir import load_topics

    (result,) = evaluate(params, paths, "bm25", "nfcorpus/test", ["full"])
    _, qrels = load_topics(paths, "nfcorpus", "test")
    assert {g for docs in qrels.values() for g in docs.values()} >= {1, 2}  # graded
    run = {}
    for line in (result.folder / "run.trec").read_text().splitlines():
        qid, _, doc, _, score, _ = line.split()
        run.setdefault(qid, {})[doc] = float(score)
    ref = pytrec_eval.RelevanceEvaluator(qrels, {"ndcg_cut.10"}).evaluate(run)
    per_query = json.loads((result.folder / "per_query.json").read_text())
    assert per_query.keys() == ref.keys()
    for qid in ref:
        assert per_query[qid]["ndcg@10"] == pytest.approx(ref[qid]["ndcg_cut_10"], abs=1e-12)


@pytest.mark.integration
def test_second_stage_with_minilm_agrees_with_beir(beir_project, minilm_path, tmp_path):
    """MiniLM reranking scifact test candidates (a slice: 30 queries x 20 candidates) vs BEIR's evaluator."""
    from beir.retrieval.evaluation import EvaluateRetrieval

    from pgrank.data.beir import load_topics

    params, paths = beir_project
    sliced = _scifact_slice(paths, tmp_path, queries=30, per_query=20)
    (result,) = evaluate(params, sliced, "minilm", "scifact/test", ["rerank"])
    _, qrels = load_topics(sliced, "scifact", "test")
    run = {}
    for line in (result.folder / "run.trec").read_text().splitlines():
        qid, _, doc, _, score, _ = line.split()
        run.setdefault(qid, {})[doc] = float(score)
    ndcg, _map, recall, precision = EvaluateRetrieval.evaluate(qrels, copy.deepcopy(run), [1, 3, 5, 10, 100])
    for k in [1, 3, 5, 10]:
        assert result.metrics[f"ndcg@{k}"] == pytest.approx(ndcg[f"NDCG@{k}"], abs=1e-5)
        assert result.metrics[f"map@{k}"] == pytest.approx(_map[f"MAP@{k}"], abs=1e-5)
        assert result.metrics[f"recall@{k}"] == pytest.approx(recall[f"Recall@{k}"], abs=1e-5)
    assert 0.3 < result.metrics["ndcg@10"] < 1.0


def _scifact_slice(paths: Paths, tmp: Path, *, queries: int, per_query: int) -> Paths:
    """A scifact copy whose corpus is cut to the BM25 candidates of the first test queries."""
    from pgrank.data.beir import load_topics
    from pgrank.data.candidate_store import run_sets, write_candidates
    from pgrank.data.corpus_store import open_corpus
    from pgrank.retrieval.bm25.index import bm25_index

    topics, qrels = load_topics(paths, "scifact", "test")
    corpus = open_corpus(paths, "scifact")
    qids = sorted(topics)[:queries]
    index = bm25_index(paths, "scifact", parse_params(yaml.safe_load((ROOT / "params.yaml").read_text())).mine.bm25)
    _, rows = index.search(index.token_ids([topics[q] for q in qids]), per_query)
    run = {}
    for q, r in zip(qids, rows):
        docs = list(dict.fromkeys([d for d in qrels[q] if d in corpus] + corpus.ids.take(r)))[:per_query]
        run[q] = {d: float(per_query - j) for j, d in enumerate(docs)}
    keep = {d for docs in run.values() for d in docs}
    sliced = Paths(root=tmp / "runs", data=tmp / "data", embeddings=tmp / "emb")
    folder = sliced.dataset("scifact")
    (folder / "qrels").mkdir(parents=True)
    with open(paths.dataset("scifact") / "corpus.jsonl") as src, open(folder / "corpus.jsonl", "w") as dst:
        dst.writelines(line for line in src if json.loads(line)["_id"] in keep)
    (folder / "queries.jsonl").write_text((paths.dataset("scifact") / "queries.jsonl").read_text())
    rows_out = ["query-id\tcorpus-id\tscore"] + [f"{q}\t{d}\t{s}" for q in qids for d, s in qrels[q].items()]
    (folder / "qrels" / "test.tsv").write_text("\r\n".join(rows_out) + "\r\n")
    sliced_corpus = open_corpus(sliced, "scifact")
    sliced_topics, sliced_qrels = load_topics(sliced, "scifact", "test")
    write_candidates(sliced, "scifact", "test", run_sets(run, sliced_corpus, sliced_topics, sliced_qrels),
                     corpus=sliced_corpus, tag="pgrank-bm25", trec=True)
    return sliced


def test_ignore_identical_ids_changes_only_coinciding_queries():
    qrels = {"q1": {"d1": 1}, "q2": {"d2": 1}, "q3": {"d3": 2, "q3x": 1}}
    run = {"q1": {"q1": 9.0, "d1": 5.0, "d9": 1.0}, "q2": {"d2": 3.0, "d8": 2.0}, "q3": {"d3": 1.0, "q3x": 2.0}}
    before = copy.deepcopy(run)
    _, on = evaluate_run(qrels, run, [1, 10], ignore_identical_ids=True)
    _, off = evaluate_run(qrels, run, [1, 10], ignore_identical_ids=False)
    assert run == before  # the caller's run is never mutated
    assert on["q1"]["ndcg@1"] == 1.0 and off["q1"]["ndcg@1"] == 0.0  # q1 retrieved itself first
    assert on["q2"] == off["q2"] and on["q3"] == off["q3"]  # no identical ids: identical results


def test_paired_tests():
    a = {f"q{i}": 0.5 + 0.01 * i for i in range(30)}
    b = {q: v - 0.2 for q, v in a.items()}
    for test in ["student", "wilcoxon", "fisher"]:
        assert paired_test(a, b, test) < 0.001
        assert paired_test(a, a, test) == 1.0


def test_trained_pair_and_warm_start_end_to_end(tmp_path, tiny_model_dir):
    """Train the toy project (query tower), then evaluate warm start and policy with significance."""
    from pgrank.training.trainer import train

    name = str(tiny_model_dir)
    params, paths = make_project(tmp_path, tiny_model_dir, overrides={
        "train.epochs": 1, "train.keep_epochs": [1], "data.eval_sets": ["toy/validation"],
        "evaluate.max_seq_length": 32, "evaluate.top_k": 20})
    train(params, paths, name, device="cpu", progress=False)
    warm = {r.stage: r for r in evaluate(params, paths, name, "toy/validation")}
    pol = {r.stage: r for r in evaluate(params, paths, f"pgrank-{name}", "toy/validation")}
    assert warm.keys() == pol.keys() == {"rerank", "full"}
    record = json.loads((pol["rerank"].folder / "metrics.json").read_text())
    assert record["epoch"] == 1 and record["significance"]["baseline"] == name
    assert set(record["significance"]["p_values"]) == set(record["metrics"])
    assert json.loads((warm["rerank"].folder / "metrics.json").read_text())["significance"] is None
    # the query-tower pair reused the warm start's corpus artifact: only one was ever built
    assert len(corpus_artifacts(paths)) == 1


def test_a_dense_system_evaluated_again_finds_its_query_vectors_kept_and_loads_no_model(tmp_path, tiny_model_dir,
                                                                                       monkeypatch):
    """Query vectors are kept by text per model (pgrank.retrieval.dense.query_embeddings): evaluating a system
    again (another stage, a rerun, the gate) loads no model, and its figures and recorded backends are the same."""
    import pgrank.models.backends as backends

    name = str(tiny_model_dir)
    params, paths = make_project(tmp_path, tiny_model_dir, overrides={
        "data.eval_sets": ["toy/validation"], "evaluate.max_seq_length": 32, "evaluate.top_k": 20})
    first = {r.stage: r for r in evaluate(params, paths, name, "toy/validation")}
    before = {r.stage: json.loads((r.folder / "metrics.json").read_text()) for r in first.values()}
    monkeypatch.setattr(backends, "load_inference_encoder", lambda *a, **k: pytest.fail("a model was loaded"))
    again = {r.stage: r for r in evaluate(params, paths, name, "toy/validation")}
    assert {s: r.metrics for s, r in again.items()} == {s: r.metrics for s, r in first.items()}
    after = {r.stage: json.loads((r.folder / "metrics.json").read_text()) for r in again.values()}
    assert after == before and after["full"]["encoding"]["queries"] == after["full"]["encoding"]["documents"]


def test_a_query_tower_checkpoint_listed_as_a_dense_system_is_its_policy(tmp_path, tiny_model_dir):
    """A tower:query checkpoint named in evaluate.systems.dense (a registered version fetched back, the
    champion of continual retraining) scores exactly as its policy does, and its documents come from the
    warm start's corpus-embedding artifact: the corpus is not encoded again."""
    from pgrank.training.trainer import train

    name = str(tiny_model_dir)
    overrides = {"train.epochs": 1, "train.keep_epochs": [1], "data.eval_sets": ["toy/validation"],
                 "evaluate.max_seq_length": 32, "evaluate.top_k": 20}
    _, paths = make_project(tmp_path, tiny_model_dir, overrides=overrides)
    folder = str(paths.checkpoint(name, 1))
    params, paths = make_project(tmp_path, tiny_model_dir,
                                 overrides={**overrides, "evaluate.systems": {"dense": [name, folder]}})
    train(params, paths, name, device="cpu", progress=False)
    evaluate(params, paths, name, "toy/validation")
    policy = {r.stage: r.metrics for r in evaluate(params, paths, f"pgrank-{name}", "toy/validation")}
    listed = {r.stage: r.metrics for r in evaluate(params, paths, folder, "toy/validation")}
    assert listed == policy and set(listed) == {"rerank", "full"}
    assert len(corpus_artifacts(paths)) == 1


def test_sparse_encoder_baseline_runs_end_to_end(tmp_path, tiny_model_dir, tiny_splade_dir):
    """A tiny SPLADE-style model (BERT MLM head + max pooling) built in code, through both stages."""
    splade = tiny_splade_dir
    params, paths = make_project(tmp_path / "p", tiny_model_dir, overrides={
        "data.eval_sets": ["toy/validation"], "evaluate.systems": {"dense": [str(tiny_model_dir)], "sparse": [str(splade)]},
        "evaluate.max_seq_length": 32, "evaluate.top_k": 15})
    results = {r.stage: r for r in evaluate(params, paths, str(splade), "toy/validation")}
    assert results.keys() == {"rerank", "full"}
    for r in results.values():
        assert 0.0 <= r.metrics["ndcg@10"] <= 1.0 and r.metrics["recall@100"] > 0
    full_run = (results["full"].folder / "run.trec").read_text().splitlines()
    assert len({line.split()[0] for line in full_run}) == 6  # every validation query answered


def test_splits_of_a_dataset_share_one_index(tmp_path, tiny_model_dir, monkeypatch):
    """evaluate_dataset opens a system's retriever (corpus, BM25 index, embeddings, models) once for all splits."""
    import pgrank.retrieval.bm25.retriever as bm25
    from pgrank.evaluation.stage import evaluate_dataset

    params, paths = make_project(tmp_path, tiny_model_dir, overrides={
        "data.eval_sets": {"toy": ["train-pg", "validation"]}, "evaluate.systems": {"bm25": ["bm25"], "dense": [str(tiny_model_dir)]},
        "evaluate.top_k": 20})
    separate = {(r.split, r.stage): r.metrics for s in ("train-pg", "validation") for r in evaluate(params, paths, "bm25", f"toy/{s}")}
    calls = []
    real = bm25.bm25_index
    monkeypatch.setattr(bm25, "bm25_index", lambda *a, **k: calls.append(1) or real(*a, **k))
    shared = {(r.split, r.stage): r.metrics for r in evaluate_dataset(params, paths, "bm25", "toy")}
    assert len(calls) == 1
    assert shared == separate


def test_rerank_only_checkpoints_encode_only_their_candidates(tmp_path, tiny_model_dir, monkeypatch):
    """The epoch ablation reranks with a tower:both checkpoint: the documents of the candidate sets are
    encoded (each once), the corpus is not, and no corpus-embedding artifact is built for it."""
    import numpy as np

    import pgrank.retrieval.dense.corpus_embeddings as embeddings
    from pgrank.data.candidate_store import open_candidates
    from pgrank.evaluation.stage import evaluate_dataset
    from pgrank.training.trainer import train

    name = str(tiny_model_dir)
    params, paths = make_project(tmp_path, tiny_model_dir, overrides={
        "train.tower": "both", "train.epochs": 2, "train.keep_epochs": [1, 2], "data.eval_sets": ["toy/validation"],
        "evaluate.policy_epochs": [1], "evaluate.max_seq_length": 32, "evaluate.top_k": 20})
    train(params, paths, name, device="cpu", progress=False)
    evaluate_dataset(params, paths, name, "toy")  # the warm start (its results are the baseline)
    encoded = []
    real = embeddings.encode_documents
    monkeypatch.setattr(embeddings, "encode_documents", lambda m, texts, **kw: encoded.append(len(texts)) or real(m, texts, **kw))
    before = {p.name for p in paths.embeddings.iterdir()}
    results = evaluate_dataset(params, paths, f"pgrank-{name}", "toy")
    assert {(r.system.partition("@")[2], r.stage) for r in results} == {("", "rerank"), ("", "full"), ("1", "rerank")}
    candidates = np.unique(open_candidates(paths, "toy", "validation").rows)
    corpus_size = 12 * 6
    built = {p.name for p in corpus_artifacts(paths) if not p.name.startswith(".")} - before
    assert len(built) == 1  # the last epoch's artifact (first stage); none for epoch 1
    assert sum(encoded) == corpus_size + len(candidates) and len(candidates) < corpus_size
    assert not [p for p in paths.embeddings.iterdir() if p.name.startswith(".subset-")]  # scratch removed


def corpus_artifacts(paths) -> list:
    """The corpus-embedding artifacts built (not the ONNX exports a CPU's auto backend keeps beside them, nor the
    query embeddings)."""
    return [p for p in paths.embeddings.iterdir() if p.is_dir() and p.name != "exports" and not p.name.endswith("--queries")]
