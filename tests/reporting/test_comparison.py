"""The objective comparison table (pgrank/reporting/comparison.py): scores, paired p-values, timings."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from pgrank.config import load_params
from pgrank.core.significance import paired_test
from pgrank.errors import PgrankError
from pgrank.paths import Paths
from pgrank.reporting.comparison import comparison_table
from pgrank.reporting.tables import make_tables

ROOT = Path(__file__).resolve().parents[2]
SETS = ("scifact/test", "nfcorpus/test")


def _project(tmp_path: Path, objectives: str = "[pg, listnet]"):
    params = load_params(ROOT / "params.yaml", profile="demo", overrides=[
        "paths.root=runs", "tables.formats=[md]", f"train.objectives={objectives}",
        "train.learning_rates={listnet: 1.0e-4}" if "listnet" in objectives else "train.learning_rates={}"])
    return params, Paths.from_config(params.paths, base=tmp_path)


def _per_query(paths: Paths, system: str, eval_set: str, stage: str, values: np.ndarray) -> dict[str, float]:
    dataset, split = eval_set.split("/")
    folder = paths.results(system, dataset, split, stage)
    folder.mkdir(parents=True, exist_ok=True)
    doc = {f"q{i}": {"ndcg@10": float(v), "mrr@10": 0.5} for i, v in enumerate(values)}
    (folder / "per_query.json").write_text(json.dumps(doc))
    (folder / "metrics.json").write_text(json.dumps({"metrics": {"ndcg@10": float(values.mean())}, "significance": None}))
    return {q: v["ndcg@10"] for q, v in doc.items()}


def test_rows_are_objectives_with_p_values_against_pg_rank_and_the_warm_start(tmp_path):
    params, paths = _project(tmp_path)
    rng = np.random.default_rng(0)
    written = {}
    for eval_set in SETS:
        for stage in ("rerank", "full"):
            base = rng.uniform(0.2, 0.8, 40)
            for system, shift in (("minilm", 0.0), ("pgrank-minilm", 0.05), ("pgrank-minilm+listnet", 0.02)):
                noise = rng.normal(0, 0.03, 40) if shift else 0.0
                written[system, eval_set, stage] = _per_query(paths, system, eval_set, stage,
                                                              np.clip(base + shift + noise, 0, 1))
    for objective, seconds in (("pg", {"1": 30.0, "2": 34.0}), ("listnet", {"1": 12.5})):
        paths.timings("minilm", objective).parent.mkdir(parents=True, exist_ok=True)
        paths.timings("minilm", objective).write_text(json.dumps({"epoch_seconds": seconds}))
    table = comparison_table(params, paths)
    assert [r.label for r in table.rows] == ["minilm (warm start)", "PG-Rank with minilm", "ListNet with minilm"]
    assert [c.title for c in table.columns] == ["SciFact rerank", "SciFact first stage", "NFCorpus rerank",
                                                "NFCorpus first stage", "dbpedia rerank", "dbpedia first stage",
                                                "Learning rate", "Train s/epoch"]
    warm_row, pg_row, listnet_row = table.rows
    ln, pg, warm = (written[s, "scifact/test", "rerank"] for s in ("pgrank-minilm+listnet", "pgrank-minilm", "minilm"))
    p_pg, p_warm = paired_test(ln, pg, "student"), paired_test(ln, warm, "student")
    fmt = lambda p: "<0.001" if p < 0.001 else f"{p:.3f}"  # noqa: E731
    assert listnet_row.cells[0].ours == f"{np.mean(list(ln.values())):.3f} ({fmt(p_pg)} / {fmt(p_warm)})"
    assert pg_row.cells[0].ours.endswith(f"(— / {fmt(paired_test(pg, warm, 'student'))})")  # PG-Rank vs itself: none
    assert warm_row.cells[0].ours == f"{np.mean(list(warm.values())):.3f}"  # the warm start: no p-values
    assert [r.cells[-2].ours for r in table.rows] == ["—", "3e-05", "0.0001"]  # the demo's rate; listnet's own
    assert [r.cells[-1].ours for r in table.rows] == ["—", "32", "12"]  # mean seconds per epoch


def test_the_table_is_written_only_when_objectives_are_compared(tmp_path):
    params, paths = _project(tmp_path / "one", "[pg]")
    assert not any(p.name.startswith("objectives") for p in make_tables(params, paths))
    params, paths = _project(tmp_path / "two")
    written = {p.name for p in make_tables(params, paths)}
    assert "objectives.md" in written
    text = (paths.tables / "objectives.md").read_text()
    assert "| ListNet with" in text and "| — | — | — | — | 0.0001 | — |" in text  # nothing evaluated, no timing


def test_a_malformed_per_query_file_is_named(tmp_path):
    params, paths = _project(tmp_path)
    folder = paths.results("pgrank-minilm+listnet", "scifact", "test", "rerank")
    folder.mkdir(parents=True)
    (folder / "per_query.json").write_text('{"q1": {"mrr@10": 1}}')
    with pytest.raises(PgrankError, match=r"per_query\.json.*ndcg@10"):
        comparison_table(params, paths)


def test_extra_seeds_give_mean_and_sd_with_tests_on_per_query_means_over_seeds(tmp_path):
    """train.extra_seeds: a cell is mean ± sd of the seeds' nDCG@10; its p-values pair the per-query means over
    seeds; a variant row names its loss and keys; the time is the mean over the seeds' runs."""
    params = load_params(ROOT / "params.yaml", profile="demo", overrides=[
        "paths.root=runs", "tables.formats=[md]", "train.objectives=[pg, listnet, pg_n9]", "train.extra_seeds=[7, 8]",
        "train.variants={pg_n9: {objective: pg, overrides: {pg: {num_samples: 9}}}}", "data.eval_sets=[scifact/test]",
        "evaluate.stages=[rerank]"])
    paths = Paths.from_config(params.paths, base=tmp_path)
    rng = np.random.default_rng(1)
    base = rng.uniform(0.2, 0.8, 30)
    warm = _per_query(paths, "minilm", "scifact/test", "rerank", base)
    runs = {}
    for objective, shift in (("pg", 0.04), ("listnet", 0.01), ("pg_n9", 0.05)):
        for seed in (None, 7, 8):
            key = objective if seed is None else f"{objective}.s{seed}"
            values = np.clip(base + shift + rng.normal(0, 0.05, 30), 0, 1)
            runs[objective, seed] = _per_query(paths, f"pgrank-minilm+{key}", "scifact/test", "rerank", values)
            paths.timings("minilm", key).parent.mkdir(parents=True, exist_ok=True)
            paths.timings("minilm", key).write_text(json.dumps({"epoch_seconds": {"1": 10.0 + (seed or 0)}}))
    table = comparison_table(params, paths)
    assert [r.label for r in table.rows] == ["minilm (warm start)", "PG-Rank with minilm", "ListNet with minilm",
                                             "PG-Rank (pg.num_samples=9) with minilm"]
    fmt = lambda p: "<0.001" if p < 0.001 else f"{p:.3f}"  # noqa: E731
    per_seed = lambda o: [runs[o, s] for s in (None, 7, 8)]  # noqa: E731
    means = [np.mean(list(r.values())) for r in per_seed("listnet")]
    over_seeds = {q: np.mean([r[q] for r in per_seed("listnet")]) for q in warm}
    pg_over_seeds = {q: np.mean([r[q] for r in per_seed("pg")]) for q in warm}
    expected = (f"{np.mean(means):.3f} ± {np.std(means, ddof=1):.3f} ({fmt(paired_test(over_seeds, pg_over_seeds, 'student'))}"
                f" / {fmt(paired_test(over_seeds, warm, 'student'))})")
    assert table.rows[2].cells[0].ours == expected
    assert table.rows[0].cells[0].ours == f"{np.mean(base):.3f}"  # the warm start: one run, no spread
    assert [r.cells[-1].ours for r in table.rows] == ["—", "15", "15", "15"]  # mean over seeds: (10 + 17 + 18) / 3
    assert "mean ± sd over 3 seeds (42, 7, 8)" in table.note
    # a seed whose run is missing: the cell covers the seeds evaluated
    (paths.results("pgrank-minilm+listnet.s8", "scifact", "test", "rerank") / "per_query.json").unlink()
    two = [np.mean(list(r.values())) for r in per_seed("listnet")[:2]]
    assert comparison_table(params, paths).rows[2].cells[0].ours.startswith(f"{np.mean(two):.3f} ± {np.std(two, ddof=1):.3f} (")


def test_every_loss_has_a_display_name():
    from pgrank.config import OBJECTIVE_NAMES
    from pgrank.reporting.rendering import OBJECTIVE_NAMES as DISPLAYED

    assert set(DISPLAYED) == set(OBJECTIVE_NAMES)
