"""The train section (pgrank.config.training): the runs a profile trains, the estimators' utilities, variants and
seeds, and when the KL term is on."""

from __future__ import annotations

from pathlib import Path

import pytest

from pgrank.config import load_params
from pgrank.errors import ConfigError


ROOT = Path(__file__).resolve().parents[2]
PARAMS = ROOT / "params.yaml"

def test_objectives_and_their_learning_rates():
    p = load_params(PARAMS)
    assert p.train.objectives == ["pg"] and p.train.learning_rate_for("pg") == 1e-6  # the paper
    p = load_params(PARAMS, ["train.objectives=[pg, listnet]", "train.learning_rates={listnet: 1.0e-4}"])
    assert (p.train.learning_rate_for("listnet"), p.train.learning_rate_for("pg")) == (1e-4, 1e-6)
    msg = str(pytest.raises(ConfigError, load_params, PARAMS, ["train.objectives=[pg, pg]"]).value)
    assert "train.objectives" in msg and "more than once" in msg
    msg = str(pytest.raises(ConfigError, load_params, PARAMS, ["train.objectives=[pg, ranknet]"]).value)
    assert "train.objectives" in msg and "listnet" in msg  # names what it expects
    msg = str(pytest.raises(ConfigError, load_params, PARAMS, ["train.learning_rates={infonce: 1.0e-4}"]).value)
    assert "train.learning_rates.infonce" in msg and "not in train.objectives" in msg
    msg = str(pytest.raises(ConfigError, load_params, PARAMS, ["train.warm_starts=[sbert+x]"]).value)
    assert "train.warm_starts.0" in msg and "reserved" in msg


def test_estimators_and_the_utilities_they_take():
    assert load_params(PARAMS, ["train.pg.estimator=plrank3"]).train.pg.estimator == "plrank3"
    for estimator in ("per_rank", "plrank3"):
        msg = str(pytest.raises(ConfigError, load_params, PARAMS,
                                [f"train.pg.estimator={estimator}", "train.pg.utility=mymod:bleu"]).value)
        assert "train.pg.estimator" in msg and "use 'whole'" in msg
    assert load_params(PARAMS, ["train.pg.estimator=whole", "train.pg.utility=mymod:bleu"]).train.pg.utility == "mymod:bleu"
    msg = str(pytest.raises(ConfigError, load_params, PARAMS, ["train.pg.estimator=plrank3", "train.pg.utility=mrr@10"]).value)
    assert "train.pg.estimator" in msg and "linear in the documents' gains" in msg
    msg = str(pytest.raises(ConfigError, load_params, PARAMS, ["train.pg.estimator=plrank4"]).value)
    assert "train.pg.estimator" in msg and "plrank3" in msg


def test_variants_and_extra_seeds_name_runs_with_their_own_train_section():
    variant = "train.variants={pg_n1000: {objective: pg, overrides: {pg: {num_samples: 1000}}}}"
    p = load_params(PARAMS, ["train.objectives=[pg, listnet, pg_n1000]", variant, "train.extra_seeds=[43, 44]",
                             "train.learning_rates={pg: 3.0e-4}"])
    assert p.train.runs() == [("pg", None), ("listnet", None), ("pg_n1000", None), ("pg", 43), ("listnet", 43),
                              ("pg_n1000", 43), ("pg", 44), ("listnet", 44), ("pg_n1000", 44)]
    run = p.train.for_run("pg_n1000", 43)
    assert (run.pg.num_samples, run.seed, run.learning_rate, p.train.pg.num_samples) == (1000, 43, 3e-4, 5000)
    assert p.train.learning_rate_for("pg_n1000") == 3e-4 and p.train.learning_rate_for("listnet") == 1e-6
    assert p.train.objective_of("pg_n1000") == "pg" and p.train.for_run("listnet").seed == 42


@pytest.mark.parametrize(("overrides", "key", "expect"), [
    (["train.objectives=[pg, ranknet]"], "train.objectives.1", "neither a loss"),
    (["train.objectives=[pg, pg_x]", "train.variants={pg_x: {objective: pg, overrides: {pg: {estimatr: plrank3}}}}"],
     "train.variants.pg_x.overrides", "pg.estimatr: unknown key"),
    (["train.variants={pg_x: {objective: pg, overrides: {pg: {estimator: plrank3, utility: mrr@10}}}}"],
     "train.variants.pg_x.overrides.pg.estimator", "linear in the documents' gains"),
    (["train.variants={pg_x: {objective: pg, overrides: {extra_seeds: [1]}}}"], "train.variants.pg_x.overrides",
     "cannot differ per variant"),
    (["train.variants={listnet: {objective: pg}}"], "train.variants.listnet", "a loss's name"),
    (["train.variants={pg_x: {objective: ranknet}}"], "train.variants.pg_x.objective", "pg"),
    (["train.extra_seeds=[42]"], "train.extra_seeds", "is train.seed"),
    (["train.extra_seeds=[43, 43]"], "train.extra_seeds", "more than once"),
])
def test_bad_variants_and_seeds_are_named(overrides, key, expect):
    msg = str(pytest.raises(ConfigError, load_params, PARAMS, overrides).value)
    assert f"{key}:" in msg and expect in msg, msg


def test_the_kl_term_is_on_for_the_policy_gradient_with_a_coefficient_only():
    assert not load_params(PARAMS).train.kl_on("pg")  # the paper: no KL term
    demo = load_params(PARAMS, profile="demo").train
    assert demo.kl_on("pg") and not demo.kl_on("infonce")
    assert not load_params(PARAMS, ["train.pg.kl_coef=0"], profile="demo").train.kl_on("pg")


def test_a_chunk_budget_below_the_longest_text_is_refused_naming_the_key():
    assert load_params(PARAMS).train.chunk_tokens == 262144
    msg = str(pytest.raises(ConfigError, load_params, PARAMS, ["train.chunk_tokens=200"]).value)
    assert "train.chunk_tokens" in msg and "256" in msg  # max_doc_length of params.yaml
    assert load_params(PARAMS, ["train.chunk_tokens=256"]).train.chunk_tokens == 256


def test_the_cli_says_it_in_one_error_line(tmp_path):
    import subprocess
    import sys

    out = subprocess.run([sys.executable, str(ROOT / "cli.py"), "--set", "train.chunk_tokens=100", "plan"], cwd=ROOT,
                         capture_output=True, text=True, timeout=120)
    assert out.returncode != 0 and "Traceback" not in out.stderr
    assert any(line.startswith("pgrank: error:") and "train.chunk_tokens" in line for line in out.stderr.splitlines())
