"""pgrank plan: the demo's counts against counts done by hand, the paper's cost, calibration."""

from __future__ import annotations

from pathlib import Path

import pytest

from pgrank.config import load_params
from pgrank.paths import Paths
from pgrank.pipeline.plan import calibrate, make_plan, render, totals

ROOT = Path(__file__).resolve().parents[2]
MINILM = (384, 22_700_000)  # all-MiniLM-L6-v2: dimension, parameters


def _plan(tmp_path, profile=None, *overrides):
    params = load_params(ROOT / "params.yaml", [f"paths.data={tmp_path / 'data'}", *overrides], profile)
    return params, make_plan(params, Paths.from_config(params.paths, base=ROOT), profile or "paper")


def test_the_demo_plan_equals_counts_done_by_hand(tmp_path):
    # scifact: 5,183 documents; train 809 queries = 709 train-pg + 100 validation; test 300.
    # nfcorpus (out of domain): 3,633 documents; dev 324 queries (validated every epoch), test 323.
    # dbpedia (out of domain): the DBPedia-Entity subset's 5,000-document pool, its 40 judged test queries cut by
    # hash into dev 20 (validated every epoch) and test 20 (reported).
    # half documents of each corpus (validated every epoch): 300 queries among 1,000 documents of its own.
    # demo: MiniLM mines 100 candidates at length 256 (so training and evaluation reuse its embeddings),
    # tower: query, 4 epochs, 200 rankings a query, checkpoints of epochs 0, 2, 4 (query + document model).
    _, plan = _plan(tmp_path, "demo")
    lines = {line.stage: line for line in plan.lines if line.stage != "mine-train"}
    dim, size = MINILM
    sci, nf, db, *halves = [line for line in plan.lines if line.stage == "mine-train"]  # data.train, validation sets
    assert (sci.docs, sci.queries, sci.pairs) == (5_183, 809, 809 * 100)
    assert sci.disk == 809 * 100 * 5 + 5_183 * dim * 2  # a store, no TREC run of training splits
    assert (nf.docs, nf.queries, nf.pairs, nf.disk) == (3_633, 324, 32_400, 32_400 * 5 + 3_633 * dim * 2)
    assert (db.docs, db.queries, db.pairs, db.disk) == (5_000, 20, 2_000, 2_000 * 5 + 5_000 * dim * 2)
    assert [(h.docs, h.queries, h.pairs, h.disk) for h in halves] == [(1_000, 300, 30_000, 30_000 * 5 + 1_000 * dim * 2)] * 3
    for dataset, queries in (("scifact", 300), ("nfcorpus", 323), ("dbpedia", 20)):
        mine = lines[f"mine@{dataset}"]
        assert (mine.docs, mine.queries, mine.pairs) == (0, queries, queries * 100)  # each corpus is encoded once
        assert mine.disk == queries * 100 * 5 + queries * 100 * 45  # store + TREC run
    train = lines["train@minilm-pg"]
    assert (train.docs, train.grad_docs, train.grad_queries) == (0, 0, 709 * 4)
    assert (train.queries, train.rankings, train.pairs) == ((100 + 324 + 20 + 3 * 300) * 5, 709 * 200 * 4, 709 * 100 * 4)
    assert train.disk == 3 * 2 * size * 4
    other = lines["  (other reading)"]
    assert (other.grad_queries, other.rankings) == (200 * 4, 200 * 200 * 4) and "queries_per_epoch=200" in other.note
    for stage in ("evaluate-dense@minilm-scifact", "evaluate-bm25@bm25-scifact"):
        assert (lines[stage].docs, lines[stage].pairs) == (0, 30_000)
    policy = lines["evaluate-policy@minilm-pg-scifact"]
    assert (policy.docs, policy.queries, policy.pairs) == (0, 600, 60_000)  # last epoch + epoch 2, rerank only
    total = totals(plan)
    assert (total.docs, total.grad_queries, total.rankings) == (5_183 + 3_633 + 5_000 + 3 * 1_000, 709 * 4, 709 * 200 * 4)


def test_a_rerank_only_tower_both_policy_is_charged_its_candidates_not_its_corpus(tmp_path):
    # The policy's last epoch and epoch 2 rerank 100 candidates a query. scifact test: 300 queries, 5,183
    # documents (the candidates may hold them all); dbpedia's report half: 20 queries, 5,000 documents.
    _, plan = _plan(tmp_path, "demo", "train.tower=both", "evaluate.stages=[rerank]")
    lines = {line.stage: line for line in plan.lines}
    for dataset, queries, documents in (("scifact", 300, 5_183), ("dbpedia", 20, 5_000)):
        policy = lines[f"evaluate-policy@minilm-pg-{dataset}"]
        assert policy.docs == 2 * min(documents, queries * 100)  # each model encodes the candidates' documents
        assert policy.disk == 2 * queries * 100 * 45  # two TREC runs, no corpus embeddings
    _, plan = _plan(tmp_path, "demo", "train.tower=both")
    policy = {line.stage: line for line in plan.lines}["evaluate-policy@minilm-pg-dbpedia"]
    assert policy.docs == 5_000 + 2_000 and policy.disk > 5_000 * MINILM[0] * 2  # first stage: its own corpus


def test_the_paper_plan_shows_what_5000_rankings_per_epoch_cost(tmp_path):
    params, plan = _plan(tmp_path)
    lines = {line.stage: line for line in plan.lines}
    train_pg = 502_939 - 7_000
    sbert = lines["train@sbert-pg"]
    assert sbert.grad_docs == train_pg * 1000 * 6 > 2.9e9  # every candidate of every query, every epoch
    assert sbert.rankings == train_pg * 5000 * 6
    other = [line for line in plan.lines if line.stage.startswith(" ") and line.model == "sbert"][0]
    assert other.grad_docs == 5000 * 1000 * 6 and "train.queries_per_epoch=5000" in other.note
    assert lines["mine-train"].pairs == 502_939 * 1000 and lines["mine-train"].docs == 8_841_823
    assert lines["mine@msmarco"].docs == 0  # reuses mine-train's gtr-t5-xl embeddings of the same corpus
    text = render(plan)
    assert "2.98e9" in text and "train.queries_per_epoch=5000" in text and "8,841,823 documents" in text


def test_the_cli_prints_the_plan(tmp_path):
    from typer.testing import CliRunner

    from cli import app

    out = CliRunner().invoke(app, ["--params", str(ROOT / "params.yaml"), "--set", f"paths.data={tmp_path}", "plan"])
    assert out.exit_code == 0, out.output
    assert "| train@tas-b-pg | tas-b |" in out.output and "**total**" in out.output


def test_calibration_prices_every_stage_in_hours(tmp_path, tiny_model_dir):
    params, plan = _plan(tmp_path, "demo", f"models.aliases.minilm={tiny_model_dir}")
    priced = calibrate(params, Paths.from_config(params.paths, base=ROOT), plan, device="cpu", seconds=0.05)
    rates = priced.rates["minilm"]
    assert sorted(rates.inference) == sorted(rates.grad) == [32, 64, 128]  # up to the tiny BERT's 128 positions
    assert all(r > 0 for r in [*rates.inference.values(), *rates.grad.values()])
    for line in priced.lines:
        if line.model not in ("bm25", "-") and (line.docs or line.queries or line.grad_queries):
            assert line.hours is not None and line.hours > 0, line
    assert totals(priced).hours > 0 and "calibrated here, on cpu" in render(priced)
    assert "stale rates" not in render(priced)  # calibrated on this machine, by this code


def test_the_paper_is_priced_from_the_measured_gpu_rates_at_each_corpus_length(tmp_path):
    from pgrank.pipeline.rates import BEIR_WORDS, TOKENS_PER_WORD, table_rates

    params, plan = _plan(tmp_path)
    lines = {line.stage: line for line in plan.lines}
    assert "measured on an NVIDIA H100 80GB HBM3 (`python bench/gpu.py`" in render(plan)
    mine = lines["mine@nq"]  # gtr-t5-xl over NQ's 2.68M passages of 78.88 words, and its 3,452 queries
    assert mine.doc_tokens == round(78.88 * TOKENS_PER_WORD) + 2 and mine.query_tokens == round(9.16 * TOKENS_PER_WORD) + 2
    t5 = table_rates("sentence-transformers/gtr-t5-xl", "NVIDIA H100 80GB HBM3")
    assert mine.hours == pytest.approx((mine.docs / t5.inference_at(mine.doc_tokens)
                                        + mine.queries / t5.inference_at(mine.query_tokens)) / 3600)
    train = lines["train@sbert-pg"]  # every candidate re-encoded: priced by the measured tower:both step
    step_seconds = 352.67 / 220_000  # bench/out/gpu-h100.json: 220 x 1000 at 55.6 words (about 85 tokens) a document
    distilbert = table_rates("sentence-transformers/msmarco-distilbert-dot-v5", "NVIDIA H100 80GB HBM3")
    at_length = train.grad_docs * step_seconds * distilbert.grad_at(85) / distilbert.grad_at(train.doc_tokens)
    assert train.hours == pytest.approx(at_length / 3600, rel=0.02)  # plus validation and queries: under 2%
    assert 1000 < train.hours < 2000  # the paper's reading: about 2,286 steps an epoch, 6 epochs, on one GPU
    assert all(line.hours is not None for line in plan.lines if line.docs or line.queries or line.grad_docs)
    assert BEIR_WORDS["msmarco"] == (5.96, 55.98)


def test_rates_interpolate_in_length_and_never_extrapolate_faster():
    from pgrank.pipeline.rates import interpolate

    table = {64: 1000.0, 256: 250.0}
    assert interpolate(table, 64) == 1000 and interpolate(table, 128) == pytest.approx(500)  # log-log: 1/length here
    assert interpolate(table, 16) == 1000  # shorter than measured: the shortest's rate
    assert interpolate(table, 512) == pytest.approx(125)  # longer: at least linear in length
    assert interpolate({}, 100) is None


def test_mean_lengths_are_counted_on_disk_else_beir_s(tmp_path):
    import json

    from pgrank.pipeline.rates import mean_words

    paths = Paths(root=tmp_path / "r", data=tmp_path / "d", embeddings=tmp_path / "e")
    assert mean_words(paths, "scifact") == ((12.37, 213.63), "BEIR's published averages")
    folder = paths.dataset("mine")
    folder.mkdir(parents=True)
    (folder / "corpus.jsonl").write_text("".join(json.dumps({"_id": str(i), "title": "a b", "text": "c d e f"}) + "\n"
                                                 for i in range(5000)))
    (folder / "queries.jsonl").write_text("".join(json.dumps({"_id": str(i), "text": "x y z"}) + "\n" for i in range(90)))
    assert mean_words(paths, "mine") == ((3.0, 6.0), "counted on disk")


@pytest.mark.parametrize("override", ["data.eval_sets=[scifact/dev]"])
def test_an_unknown_split_is_an_error(tmp_path, override):
    from pgrank.errors import PgrankError

    with pytest.raises(PgrankError, match="scifact has no split 'dev'"):
        _plan(tmp_path, "demo", override)


def test_the_compare_plan_counts_each_variant_and_seed_as_a_run_of_its_own(tmp_path):
    params, plan = _plan(tmp_path, "compare")
    lines = {line.stage: line for line in plan.lines}
    runs = len(params.train.objectives) * (1 + len(params.train.extra_seeds))
    assert len([s for s in lines if s.startswith(("train@", "train-seeds@"))]) == runs
    assert lines["train-seeds@minilm-pg_n5000-44"].rankings == 709 * 5000 * 2  # the variant's own rankings per query
    assert lines["train@minilm-pg_n1000"].rankings == 709 * 1000 * 2 and lines["train@minilm-infonce"].rankings == 0
    assert "evaluate-policy-seeds@minilm-listnet-43-scifact" in lines


def _table_with(tmp_path, monkeypatch, data_path):
    """The shipped rates table with its GPU's ``data_path`` set to ``data_path`` (``None``: not recorded)."""
    import yaml

    from pgrank.pipeline import rates

    table = yaml.safe_load(rates.TABLE.read_text(encoding="utf-8"))
    for entry in table["devices"].values():
        entry.pop("data_path", None)
        if data_path is not None:
            entry["data_path"] = data_path
    (tmp_path / "rates.yaml").write_text(yaml.safe_dump(table))
    monkeypatch.setattr(rates, "TABLE", tmp_path / "rates.yaml")
    rates._table.cache_clear()  # and again when the test ends (fresh_table)


@pytest.fixture
def fresh_table():
    from pgrank.pipeline import rates

    rates._table.cache_clear()
    yield
    rates._table.cache_clear()


@pytest.mark.parametrize(("data_path", "says"), [
    ("padded", "were measured on the padded path, texts tokenized inside the timed loops"),
    (None, "were measured with no data path recorded"),
    ("packed", None),
])
def test_a_price_from_rates_measured_before_the_packed_path_says_so_in_one_line(tmp_path, monkeypatch, fresh_table,
                                                                               data_path, says):
    from pgrank.pipeline.rates import DATA_PATH

    _table_with(tmp_path, monkeypatch, data_path)
    _, plan = _plan(tmp_path)
    stale = [line for line in render(plan).splitlines() if line.startswith("stale rates")]
    if says is None:
        assert DATA_PATH == "packed" and stale == []
        return
    assert len(stale) == 1
    assert stale[0].startswith("stale rates: priced from rates measured before the packed data path this code runs. "
                               "The NVIDIA H100 80GB HBM3's ")
    assert says in stale[0] and "`python bench/gpu.py` on that GPU measures them again" in stale[0]


def test_the_shipped_rates_say_their_data_path_and_the_readme_says_what_the_plan_says(tmp_path, fresh_table):
    """Until a record of the packed path prices the paper, the plan flags its rates and the README's status table and
    "Reproducing the paper" say so; once one does, neither does."""
    import re

    from pgrank.pipeline.rates import DATA_PATH, DATA_PATHS, _table

    devices = _table()["devices"]
    assert all(entry.get("data_path") in DATA_PATHS for entry in devices.values())
    stale = any(entry["data_path"] != DATA_PATH for entry in devices.values())
    _, plan = _plan(tmp_path)
    assert ("stale rates: " in render(plan)) == stale
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    row = next(line for line in readme.splitlines() if line.startswith("| the full paper run |"))
    section = readme.split("## Reproducing the paper", 1)[1].split("\n## ", 1)[0]
    phrase = "priced from rates measured before the packed path"
    assert (phrase in row) == stale and (phrase in re.sub(r"\s+", " ", section)) == stale
