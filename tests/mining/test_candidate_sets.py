"""pgrank.mining.candidate_sets: candidate sets as the paper builds them, from BM25, dense retrieval or the authors' files."""

from __future__ import annotations

import json
import zipfile
from pathlib import Path

import numpy as np
import pytest

from pgrank.config import load_params
from pgrank.data.beir import load_corpus, load_topics
from pgrank.data.candidate_store import open_candidates
from pgrank.data.corpus_store import open_corpus
from pgrank.data.runs import read_run
from pgrank.errors import DataError, PgrankError
from pgrank.mining.candidate_sets import candidate_set, mine, select_targets
from pgrank.paths import Paths

ROOT = Path(__file__).resolve().parents[2]


def make_params(tmp_path: Path, *overrides: str):
    params = load_params(ROOT / "params.yaml", [
        f"paths.root={tmp_path / 'runs'}", f"paths.data={tmp_path / 'data'}",
        f"paths.embeddings={tmp_path / 'embeddings'}", *overrides,
    ])
    return params, Paths.from_config(params.paths, base=tmp_path)


def write_beir(folder: Path, corpus: dict, queries: dict, qrels: dict, split: str = "test") -> None:
    (folder / "qrels").mkdir(parents=True, exist_ok=True)
    with open(folder / "corpus.jsonl", "w") as fh:
        fh.writelines(json.dumps({"_id": d, "title": v["title"], "text": v["text"]}) + "\n" for d, v in corpus.items())
    with open(folder / "queries.jsonl", "w") as fh:
        fh.writelines(json.dumps({"_id": q, "text": t}) + "\n" for q, t in queries.items())
    rows = "".join(f"{q}\t{d}\t{r}\r\n" for q, docs in qrels.items() for d, r in docs.items())
    (folder / "qrels" / f"{split}.tsv").write_text("query-id\tcorpus-id\tscore\r\n" + rows)


# --------------------------------------------------------------------------------------- pure parts


IDS = ["d1", "d2", "d3", "d4", "r1", "r2", "r3", "a", "b"]  # a corpus: row -> id
RANKS = np.argsort(np.argsort(np.array(IDS)))  # id ranks


def _set(relevant: dict, retrieved: list, size: int) -> list:
    row = {d: i for i, d in enumerate(IDS)}
    rows, scores = candidate_set(np.array([row[d] for d in relevant], dtype=np.int64), np.array(list(relevant.values())),
                                 np.array([row[d] for d, _ in retrieved], dtype=np.int64),
                                 np.array([s for _, s in retrieved]), size, RANKS)
    return [(IDS[r], float(s)) for r, s in zip(rows, scores)]


def test_candidate_set_puts_every_relevant_document_in_and_fills_up():
    retrieved = [("d1", 9.0), ("r1", 8.0), ("d2", 7.0), ("d3", 7.0), ("d4", 1.0)]
    got = _set({"r1": 8.0, "r2": -5.0}, retrieved, size=4)
    assert got == [("d1", 9.0), ("r1", 8.0), ("d2", 7.0), ("r2", -5.0)]


def test_candidate_set_keeps_all_relevant_documents_beyond_the_size():
    got = _set({"r1": 1.0, "r2": 2.0, "r3": 3.0}, [("d1", 9.0)], size=2)
    assert [d for d, _ in got] == ["r3", "r2", "r1"]


def test_candidate_set_is_smaller_only_when_retrieval_runs_out():
    assert len(_set({}, [("a", 1.0), ("b", 0.5)], size=10)) == 2


def test_candidate_set_breaks_score_ties_by_id():
    assert _set({"r2": 1.0}, [("d3", 1.0), ("b", 1.0), ("d1", 2.0)], size=4) == [
        ("d1", 2.0), ("b", 1.0), ("d3", 1.0), ("r2", 1.0)]


def test_select_targets(tmp_path):
    params, _ = make_params(tmp_path, "data.train=scifact/train", "data.eval_sets=[nfcorpus/test, scifact/test]")
    assert select_targets(params) == [
        ("scifact", "train-pg"), ("scifact", "validation"), ("nfcorpus", "test"), ("scifact", "test"),
    ]
    assert select_targets(params, training=True) == [("scifact", "train-pg"), ("scifact", "validation")]
    gated, _ = make_params(tmp_path, "data.train=scifact/train", "data.gate_size=30")
    assert select_targets(gated, training=True) == [("scifact", "train-pg"), ("scifact", "validation"), ("scifact", "gate-pg")]
    # a dataset's DVC stage mines its evaluation splits only, never the training sets (mine-train's output)
    assert select_targets(params, dataset="scifact") == [("scifact", "test")]
    assert select_targets(params, "fiqa", ["dev", "test"]) == [("fiqa", "dev"), ("fiqa", "test")]
    with pytest.raises(PgrankError, match="--dataset fiqa: not in data.eval_sets"):
        select_targets(params, dataset="fiqa")
    with pytest.raises(PgrankError, match="--split needs --dataset"):
        select_targets(params, splits=["test"])
    with pytest.raises(PgrankError, match="takes no --dataset"):
        select_targets(params, dataset="scifact", training=True)
    # the authors published evaluation candidates only: the training sets are still mined (mine.training_source)
    params, _ = make_params(tmp_path, "mine.source=published", "data.train=scifact/train", "data.eval_sets=[nfcorpus/test]")
    assert params.mine.training_source == "dense"
    assert select_targets(params) == [("scifact", "train-pg"), ("scifact", "validation"), ("nfcorpus", "test")]
    assert select_targets(params, training=True) == [("scifact", "train-pg"), ("scifact", "validation")]


# --------------------------------------------------------------------------------------- small synthetic sets

TOY_CORPUS = {f"d{i:02d}": {"title": f"Item {i}", "text": f"about {'cats' if i % 2 else 'dogs'} and thing {i}"} for i in range(30)}
TOY_QUERIES = {"q1": "cats and things", "q2": "dogs", "q3": "nothing matches zebra"}
TOY_QRELS = {
    "q1": {"d01": 1, "d02": 2, "d28": 1, "d29": 0, "gone": 1},  # 'gone' is not in the corpus
    "q2": {"d00": 1, "d03": 1, "d05": 1, "d07": 1, "d09": 1},  # more relevant documents than candidates
    "q3": {"d10": 1},
}


@pytest.fixture
def toy(tmp_path):
    write_beir(tmp_path / "data" / "toy", TOY_CORPUS, TOY_QUERIES, TOY_QRELS)
    return tmp_path


@pytest.mark.parametrize("source", ["bm25", "dense"])
def test_mining_a_small_dataset(toy, source, tiny_model_dir):
    params, paths = make_params(toy, f"mine.source={source}", f"mine.model={tiny_model_dir}", "mine.candidates=4",
                                "mine.chunk_size=7", "mine.max_seq_length=32")
    result = mine(params, paths, "toy", "test", progress=False)
    sets = read_run(paths.candidates("toy", "test"))
    assert result.path == paths.candidate_store("toy", "test") and result.source == source
    assert sorted(sets) == ["q1", "q2", "q3"]
    assert {d for d in sets["q1"]} >= {"d01", "d02", "d28"} and len(sets["q1"]) == 4
    assert set(sets["q2"]) == {"d00", "d03", "d05", "d07", "d09"}  # all relevant, nothing else
    assert "d10" in sets["q3"] and len(sets["q3"]) == 4
    assert (result.queries, result.min_size, result.max_size) == (3, 4, 5)
    assert (result.relevant, result.relevant_missing, result.oversized) == (9, 1, 1)
    for docs in sets.values():  # file order: score descending, then id ascending
        items = list(docs.items())
        assert items == sorted(items, key=lambda x: (-x[1], x[0]))
    # the store holds the same sets, by corpus row, with their grades
    store, corpus = open_candidates(paths, "toy", "test"), open_corpus(paths, "toy")
    assert list(store.qids) == sorted(sets) and store.pairs == sum(map(len, sets.values()))
    for i, qid in enumerate(store.qids):
        rows, grades = store.candidates(i)
        assert corpus.ids.take(rows) == list(sets[qid])
        assert grades.tolist() == [TOY_QRELS[qid].get(d, 0) for d in sets[qid]]
        assert store.queries[i] == TOY_QUERIES[qid]


def test_dense_scores_of_relevant_documents_ranked_low_are_their_real_scores(toy, tiny_model_dir):
    from pgrank.models.loading import load_encoder
    from pgrank.models.names import resolve_model
    from pgrank.retrieval.dense.corpus_embeddings import open_corpus_embeddings
    from pgrank.retrieval.dense.encoding import encode_queries

    # fp32 torch (not the machine's auto backend), so that the scores below can be recomputed exactly
    params, paths = make_params(toy, "mine.source=dense", f"mine.model={tiny_model_dir}", "mine.candidates=3",
                                "mine.chunk_size=7", "mine.max_seq_length=32", "models.backend=torch")
    mine(params, paths, "toy", "test", progress=False)
    sets = read_run(paths.candidates("toy", "test"))
    emb = open_corpus_embeddings(next(p for p in (toy / "embeddings").iterdir() if (p / "meta.json").is_file()))
    assert emb.meta["model"] == resolve_model(str(tiny_model_dir), params.models).key
    model = load_encoder(str(tiny_model_dir), params.models, device="cpu", max_seq_length=32)
    qids, q = encode_queries(model, TOY_QUERIES, batch_size=4)
    full = np.concatenate([b for _, b in emb.blocks()]) @ q.T  # (N, Q)
    ids = list(open_corpus(paths, "toy").ids)
    for j, qid in enumerate(qids):
        for doc, score in sets[qid].items():
            assert score == pytest.approx(full[ids.index(doc), j], abs=1e-4)


def test_published_source(toy):
    published = toy / "published"
    published.mkdir()
    records = [{"qid": "q1", "topk": {"d05": 0.7, "d01": 0.9, "d02": None}}, {"qid": "q3", "topk": {"d11": 0.2}}]
    (published / "toy_candidate-set_gtrxl+gt_1000_test.json").write_text(json.dumps(records))
    params, paths = make_params(toy, "mine.source=published", f"mine.published_dir={published}")
    result = mine(params, paths, "toy", "test", progress=False)
    sets = read_run(paths.candidates("toy", "test"))
    assert list(sets["q1"]) == ["d01", "d05", "d02"] and list(sets["q3"]) == ["d11"]
    assert paths.candidates("toy", "test").read_text().splitlines()[0].endswith("pgrank-published")
    assert open_candidates(paths, "toy", "test").pairs == 4
    # q1: d28 and 'gone' are not in the published set; q2 has no set; q3's d10 is missing.
    assert result.relevant == 2 and result.relevant_missing == 8
    with pytest.raises(DataError, match="dev and test splits only"):
        mine(params, paths, "toy", "train", progress=False)


def test_missing_split_is_reported_before_any_work(toy):
    params, paths = make_params(toy, "mine.source=bm25")
    with pytest.raises(DataError, match="toy has no split 'dev'"):
        mine(params, paths, "toy", "dev", progress=False)


def test_cli_mine(toy):
    from typer.testing import CliRunner

    from cli import app

    sets = ["--set", f"paths.root={toy / 'runs'}", "--set", f"paths.data={toy / 'data'}",
            "--set", "mine.source=bm25", "--set", "mine.candidates=4"]
    out = CliRunner().invoke(app, ["--params", str(ROOT / "params.yaml"), *sets, "mine", "--dataset", "toy", "--split", "test"])
    assert out.exit_code == 0, out.output
    assert "toy/test: 3 queries x 4-5 candidates (bm25)" in out.output
    assert (toy / "runs" / "candidates" / "toy" / "test.trec").is_file()
    assert (toy / "runs" / "candidates" / "toy" / "test" / "meta.json").is_file()


# --------------------------------------------------------------------------------------- real data


@pytest.fixture(scope="module")
def scifact(beir_mirror, tmp_path_factory) -> Path:
    """A project folder whose data folder holds the real scifact, unzipped from the mirror."""
    root = tmp_path_factory.mktemp("scifact-project")
    with zipfile.ZipFile(beir_mirror / "scifact.zip") as zf:
        zf.extractall(root / "data")
    return root


def ndcg10(qrels, run) -> float:
    import pytrec_eval

    per_query = pytrec_eval.RelevanceEvaluator(qrels, {"ndcg_cut.10"}).evaluate(run)
    return float(np.mean([m["ndcg_cut_10"] for m in per_query.values()]))


@pytest.mark.integration
def test_bm25_mining_on_scifact_test(scifact):
    from pgrank.retrieval.bm25.index import bm25_index

    params, paths = make_params(scifact, "mine.source=bm25", "mine.candidates=1000")
    result = mine(params, paths, "scifact", "test", progress=False)
    sets = read_run(paths.candidates("scifact", "test"))
    queries, qrels = load_topics(paths, "scifact", "test")
    assert sorted(sets) == sorted(qrels) and len(sets) == 300
    assert all(len(docs) == 1000 for docs in sets.values())
    assert all(set(d for d, r in qrels[q].items() if r > 0) <= set(sets[q]) for q in qrels)
    assert result.relevant_missing == 0 and result.oversized == 0

    # First-stage quality of BM25 itself (its own top 10, before relevant documents are added)
    # against Anserini's flat BM25 on scifact (shared README): 0.679.
    corpus = open_corpus(paths, "scifact")
    index = bm25_index(paths, "scifact", params.mine.bm25)
    qids = list(queries)
    scores, rows = index.search(index.token_ids([queries[q] for q in qids]), k=10)
    own = {q: {corpus.ids[r]: float(s) for s, r in zip(scores[i], rows[i])} for i, q in enumerate(qids)}
    assert abs(ndcg10(qrels, own) - 0.679) <= 0.015
    # ... and the top of the candidate file (rank order) is exactly that top 10.
    assert all(list(sets[q])[:10] == list(own[q]) for q in qids)


@pytest.mark.integration
def test_dense_mining_with_real_minilm_on_a_scifact_slice(scifact, tmp_path, monkeypatch):
    """End to end with the real all-MiniLM-L6-v2 (offline package) on 300 documents and 20 queries."""
    import pgrank.retrieval.dense.corpus_embeddings as embeddings

    corpus = load_corpus(scifact / "data" / "scifact", progress=False)
    params, paths = make_params(scifact)
    queries, qrels = load_topics(paths, "scifact", "test")
    qids = sorted(qrels)[:20]
    keep = {d for q in qids for d in qrels[q]}
    keep |= set(list(d for d in corpus if d not in keep)[: 300 - len(keep)])
    write_beir(tmp_path / "data" / "slice", {d: corpus[d] for d in corpus if d in keep},
               {q: queries[q] for q in qids}, {q: qrels[q] for q in qids})

    params, paths = make_params(tmp_path, "mine.source=dense", "mine.model=minilm", "mine.candidates=50",
                                "mine.chunk_size=128", "mine.max_seq_length=128", "mine.batch_size=32")
    mine(params, paths, "slice", "test", progress=False)
    sets = read_run(paths.candidates("slice", "test"))
    assert len(sets) == 20 and all(len(docs) == 50 for docs in sets.values())
    assert all(set(qrels[q]) <= set(sets[q]) for q in qids)
    from pgrank.data.corpus_store import open_corpus
    from pgrank.models.backends import effective_backend, embedding_key
    from pgrank.models.names import resolve_model
    from pgrank.paths import slug
    from pgrank.retrieval.dense.corpus_embeddings import corpus_embedding_folder

    [artifact] = [p for p in (tmp_path / "embeddings").iterdir() if (p / "meta.json").is_file()]  # not exports, queries
    ref = resolve_model("minilm", params.models)
    backend = effective_backend(ref, params.models)  # this machine's auto backend
    key = embedding_key(ref, backend)
    assert artifact.name.startswith(f"{slug(key)}--L128--") and key.startswith("sentence-transformers/all-MiniLM-L6-v2")
    assert artifact == corpus_embedding_folder(ref, backend, paths, max_seq_length=128,
                                               corpus_sha256=open_corpus(paths, "slice").sha256)
    assert len(list(artifact.glob("shard-*.npy"))) == 3
    # MiniLM's own top 10 is good on this easy slice (the full-corpus figure is about 0.645).
    top10 = {q: dict(list(docs.items())[:10]) for q, docs in sets.items()}
    assert ndcg10({q: qrels[q] for q in qids}, top10) > 0.6

    # A second run reuses the corpus embeddings: no document is encoded again.
    monkeypatch.setattr(embeddings, "encode_documents", lambda *a, **k: pytest.fail("re-encoded the corpus"))
    mine(params, paths, "slice", "test", progress=False)
    assert read_run(paths.candidates("slice", "test")) == sets


def test_published_evaluation_candidates_leave_the_training_sets_to_the_dense_miner(tmp_path, tiny_model_dir):
    """With mine.source: published, the carved training splits are mined dense with mine.model (the authors
    published no training candidates), so `pgrank repro` can run the mine-train stage."""
    from toy_project import make_project

    from pgrank.mining.candidate_sets import mine_splits, training_targets

    params, paths = make_project(tmp_path, tiny_model_dir, overrides={
        "mine.source": "published", "mine.model": str(tiny_model_dir), "mine.candidates": 5, "mine.max_seq_length": 32})
    results = mine_splits(params, paths, training_targets(params), progress=False)
    assert [(r.split, r.source) for r in results] == [("train-pg", "dense"), ("validation", "dense")]
    assert open_candidates(paths, "toy", "train-pg").pairs == 5 * results[0].queries


def test_training_splits_get_a_trec_run_only_on_request(tmp_path, tiny_model_dir):
    """The carved training splits' candidate sets are a store (what training reads); their TREC run (MS
    MARCO: 5x10^8 lines) is written only with mine.training_runs, and a stale one goes."""
    from toy_project import make_project

    from pgrank.mining.candidate_sets import mine_splits, training_targets

    params, paths = make_project(tmp_path, tiny_model_dir, overrides={"mine.source": "bm25", "mine.candidates": 5})
    assert paths.candidates("toy", "train-pg").is_file()  # left by the toy project
    results = mine_splits(params, paths, training_targets(params), progress=False)
    assert [r.path for r in results] == [paths.candidate_store("toy", s) for s in ("train-pg", "validation")]
    assert not paths.candidates("toy", "train-pg").exists() and not paths.candidates("toy", "validation").exists()
    assert open_candidates(paths, "toy", "train-pg").pairs == 5 * results[0].queries
    params, paths = make_project(tmp_path, tiny_model_dir, overrides={"mine.source": "bm25", "mine.candidates": 5,
                                                                        "mine.training_runs": True})
    mine_splits(params, paths, training_targets(params), progress=False)
    run = read_run(paths.candidates("toy", "train-pg"))
    store, corpus = open_candidates(paths, "toy", "train-pg"), open_corpus(paths, "toy")
    assert list(run) == list(store.qids)
    assert all(list(run[q]) == corpus.ids.take(store.candidates(i)[0]) for i, q in enumerate(store.qids))
