"""Policy names and where each (warm start, objective) run writes (pgrank/paths.py)."""

from __future__ import annotations

from pathlib import Path

import pytest

from pgrank.config import PathsConfig
from pgrank.paths import Paths, PolicyName, parse_policy_name, policy_name, run_key, split_run_key


@pytest.mark.parametrize(("name", "policy", "canonical"), [
    ("pgrank-sbert", PolicyName("sbert", "pg", None), "pgrank-sbert"),
    ("pgrank-sbert+pg", PolicyName("sbert", "pg", None), "pgrank-sbert"),  # what dvc.yaml's matrix spells
    ("pgrank-tas-b@2", PolicyName("tas-b", "pg", 2), "pgrank-tas-b@2"),
    ("pgrank-minilm+listnet", PolicyName("minilm", "listnet", None), "pgrank-minilm+listnet"),
    ("pgrank-minilm+lambdaloss@4", PolicyName("minilm", "lambdaloss", 4), "pgrank-minilm+lambdaloss@4"),
    ("pgrank-org/model+infonce", PolicyName("org/model", "infonce", None), "pgrank-org/model+infonce"),
    ("pgrank-minilm+pg.s43", PolicyName("minilm", "pg.s43", None), "pgrank-minilm+pg.s43"),  # an extra seed's run
    ("pgrank-minilm+pg_n1000.s44@1", PolicyName("minilm", "pg_n1000.s44", 1), "pgrank-minilm+pg_n1000.s44@1"),
])
def test_policy_names_round_trip(name, policy, canonical):
    assert parse_policy_name(name) == policy
    assert policy.name == canonical == policy_name(policy.warm, policy.objective, policy.epoch)
    assert parse_policy_name(canonical) == policy


@pytest.mark.parametrize("system", ["sbert", "bm25", "tas-b", "splade-v2", "pgrank-"])
def test_comparison_systems_are_not_policies(system):
    assert parse_policy_name(system) is None


def test_each_objective_has_its_own_folders_and_pg_keeps_the_plain_name(tmp_path):
    paths = Paths.from_config(PathsConfig(root="runs/x", data="data", embeddings="emb"), tmp_path)
    root = tmp_path / "runs/x"
    assert paths.checkpoint("minilm", 2) == root / "models/minilm/pg/epoch-2"
    assert paths.checkpoint("minilm", 2, "listnet") == root / "models/minilm/listnet/epoch-2"
    assert paths.training_log("minilm", "infonce") == root / "training/minilm/infonce"
    assert paths.timings("minilm", "infonce") == root / "timings/minilm/infonce.json"
    # results and metrics of a policy: under pgrank-<warm>/<objective>, the same folder whichever spelling
    assert paths.results("pgrank-minilm", "scifact", "test", "rerank") == root / "results/pgrank-minilm/pg/scifact/test/rerank"
    assert paths.results("pgrank-minilm+pg", "scifact", "test", "rerank") == paths.results("pgrank-minilm", "scifact", "test", "rerank")
    assert paths.results("pgrank-minilm+listnet@2", "scifact", "test", "rerank") == (
        root / "results/pgrank-minilm/listnet/scifact/epoch-2/test/rerank")
    assert paths.metrics_summary("pgrank-minilm+listnet", "scifact") == root / "metrics/pgrank-minilm/listnet/scifact.json"
    # comparison systems are unchanged
    assert paths.results("minilm", "scifact", "test", "full") == root / "results/minilm/scifact/test/full"
    assert paths.metrics_summary("bm25", "nfcorpus") == root / "metrics/bm25/nfcorpus.json"


def test_an_extra_seed_is_a_run_of_its_own_beside_the_objective():
    assert run_key("infonce", None) == "infonce" and run_key("infonce", 43) == "infonce.s43"
    assert split_run_key("infonce.s43") == ("infonce", 43) and split_run_key("pg_n1000") == ("pg_n1000", None)
    paths = Paths.from_config(PathsConfig(root="r", data="data", embeddings="emb"), Path("/p"))
    assert paths.checkpoint("minilm", 2, run_key("pg", 43)) == Path("/p/r/models/minilm/pg.s43/epoch-2")
    assert paths.results("pgrank-minilm+pg.s43", "scifact", "test", "full") == Path(
        "/p/r/results/pgrank-minilm/pg.s43/scifact/test/full")  # what dvc.yaml's evaluate-policy-seeds writes
