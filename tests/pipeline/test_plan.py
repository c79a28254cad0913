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
    # demo: MiniLM mines 100 candidates at length 256 (so training and evaluation reuse its embeddings),
    # tower: query, 4 epochs, 200 rankings a query, checkpoints of epochs 0, 2, 4 (query + document model).
    _, plan = _plan(tmp_path, "demo")
    lines = {line.stage: line for line in plan.lines if line.stage != "mine-train"}
    dim, size = MINILM
    sci, nf = [line for line in plan.lines if line.stage == "mine-train"]  # data.train, train.validation_sets
    assert (sci.docs, sci.queries, sci.pairs) == (5_183, 809, 809 * 100)
    assert sci.disk == 809 * 100 * 5 + 5_183 * dim * 2  # a store, no TREC run of training splits
    assert (nf.docs, nf.queries, nf.pairs, nf.disk) == (3_633, 324, 32_400, 32_400 * 5 + 3_633 * dim * 2)
    for dataset, queries in (("scifact", 300), ("nfcorpus", 323)):
        mine = lines[f"mine@{dataset}"]
        assert (mine.docs, mine.queries, mine.pairs) == (0, queries, queries * 100)  # each corpus is encoded once
        assert mine.disk == queries * 100 * 5 + queries * 100 * 45  # store + TREC run
    train = lines["train@minilm-pg"]
    assert (train.docs, train.grad_docs, train.grad_queries) == (0, 0, 709 * 4)
    assert (train.queries, train.rankings, train.pairs) == ((100 + 324) * 5, 709 * 200 * 4, 709 * 100 * 4)
    assert train.disk == 3 * 2 * size * 4
    other = lines["  (other reading)"]
    assert (other.grad_queries, other.rankings) == (200 * 4, 200 * 200 * 4) and "queries_per_epoch=200" in other.note
    for stage in ("evaluate-dense@minilm-scifact", "evaluate-bm25@bm25-scifact"):
        assert (lines[stage].docs, lines[stage].pairs) == (0, 30_000)
    policy = lines["evaluate-policy@minilm-pg-scifact"]
    assert (policy.docs, policy.queries, policy.pairs) == (0, 600, 60_000)  # last epoch + epoch 2, rerank only
    total = totals(plan)
    assert (total.docs, total.grad_queries, total.rankings) == (5_183 + 3_633, 709 * 4, 709 * 200 * 4)


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
    priced = calibrate(params, Paths.from_config(params.paths, base=ROOT), plan, device="cpu", seconds=0.2)
    rates = priced.rates[str(tiny_model_dir)] if str(tiny_model_dir) in priced.rates else priced.rates["minilm"]
    assert set(rates) == {"docs", "queries", "grad_docs", "grad_queries"} and all(r > 0 for r in rates.values())
    for line in priced.lines:
        if line.model not in ("bm25", "-") and (line.docs or line.queries or line.grad_queries):
            assert line.hours is not None and line.hours > 0, line
    assert totals(priced).hours > 0 and "calibrated on cpu" in render(priced)


@pytest.mark.parametrize("override", ["data.eval_sets=[scifact/dev]"])
def test_an_unknown_split_is_an_error(tmp_path, override):
    from pgrank.errors import PgrankError

    with pytest.raises(PgrankError, match="scifact has no split 'dev'"):
        _plan(tmp_path, "demo", override)
