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
                                                "NFCorpus first stage", "Learning rate", "Train s/epoch"]
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
