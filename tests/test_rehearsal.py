"""The rehearsal profile end to end on a tiny synthetic MS MARCO (the smoke test of bench/scale.py).

bench/scale.py runs profiles/rehearsal.yaml through ``dvc repro`` at 1-10% of MS MARCO's size (a
benchmark, never a test). Here the same profile, the same synthetic data (0.03%: 2,653 passages, 151
training queries with 1000 candidates each) and the same in-code encoder go through every stage's
library function in one process, in seconds.
"""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))

from scale import build_encoder  # noqa: E402
from synthetic_msmarco import write_dataset, write_mirror  # noqa: E402

from pgrank.config import load_params  # noqa: E402
from pgrank.paths import Paths  # noqa: E402


def test_the_rehearsal_profile_runs_every_stage_at_msmarco_shape(tmp_path, minilm_path, monkeypatch):
    monkeypatch.delenv("PGRANK_BEIR_MIRROR", raising=False)  # data.mirror below names the synthetic MS MARCO's folder
    from pgrank.data.candidate_store import open_candidates
    from pgrank.download.stage import download
    from pgrank.evaluation.stage import evaluate_dataset
    from pgrank.mining.candidate_sets import evaluation_targets, mine_splits, training_targets
    from pgrank.pipeline.plan import make_plan
    from pgrank.reporting.tables import make_tables
    from pgrank.training.trainer import train

    stats = write_dataset(tmp_path / "source" / "msmarco", 0.0003)
    write_mirror(tmp_path / "source" / "msmarco", tmp_path / "mirror")
    assert (stats["passages"], stats["train_queries"], stats["dev_queries"]) == (2653, 151, 2)
    assert 45 < stats["words"] / stats["passages"] < 65  # MS MARCO: 56 words a passage
    encoder = build_encoder(tmp_path / "encoder")
    params = load_params(ROOT / "params.yaml", [
        f"paths.root={tmp_path / 'runs'}", f"paths.data={tmp_path / 'data'}", f"paths.embeddings={tmp_path / 'emb'}",
        f"data.mirror={tmp_path / 'mirror'}", "data.validation_size=4", f"models.aliases.static={encoder}",
        "train.queries_per_epoch=16", "train.batch_size=8", "tracking.enabled=false"], profile="rehearsal")
    paths = Paths.from_config(params.paths)
    download(params, paths, config_dir=ROOT, progress=False)
    mined = mine_splits(params, paths, training_targets(params) + evaluation_targets(params), progress=False)
    assert [(r.split, r.queries) for r in mined] == [("train-pg", 147), ("validation", 4), ("dev", 2)]
    for r in mined:  # MS MARCO's shape: 1000 candidates a query, the judged passage among them
        store = open_candidates(paths, "msmarco", r.split)
        assert store.pairs == 1000 * r.queries and (r.min_size, r.max_size) == (1000, 1000)
        assert all(store.candidates(i)[1].sum() == 1 for i in range(len(store)))
    plan = {line.stage: line for line in make_plan(params, paths, "rehearsal").lines}
    assert plan["mine-train"].pairs == 151 * 1000 and plan["train@static-pg"].grad_docs == 16 * 1000

    result = train(params, paths, "static", device="cpu", progress=False)
    assert [h["epoch"] for h in result.history] == [0, 1]
    for system in ("bm25", "static", "pgrank-static"):
        results = {(r.split, r.stage): r.metrics for r in evaluate_dataset(params, paths, system, "msmarco")}
        assert set(results) == {("dev", "rerank"), ("dev", "full")}
        assert all(0 <= m["ndcg@10"] <= 1 for m in results.values())
    written = make_tables(params, paths)
    assert any(p.name == "rerank-in-domain.md" for p in written)
