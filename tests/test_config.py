"""params.yaml parsing: the paper's values, and a clear message for every bad config."""

from __future__ import annotations

from pathlib import Path

import pytest

from pgrank.config import load_params
from pgrank.errors import ConfigError

ROOT = Path(__file__).resolve().parents[1]
PARAMS = ROOT / "params.yaml"


def test_committed_params_carry_the_paper_hyperparameters():
    p = load_params(PARAMS)
    t = p.train
    assert (t.epochs, t.batch_size, t.learning_rate, t.similarity) == (6, 220, 1e-6, "dot")
    assert (t.pg.entropy_coef, t.pg.num_samples, t.pg.temperature, t.pg.utility) == (0.01, 5000, 0.05, "ndcg@10")
    assert (t.pg.estimator, t.pg.baseline, t.tower) == ("per_rank", "loo", "both")
    assert p.mine.candidates == 1000
    assert p.models.aliases[p.mine.model] == "sentence-transformers/gtr-t5-xl"
    assert [p.models.aliases[w] for w in t.warm_starts] == [
        "sentence-transformers/msmarco-distilbert-dot-v5",
        "sentence-transformers/msmarco-distilbert-base-tas-b",
    ]
    assert p.data.validation_size == 7000 and p.data.train == "msmarco/train"
    assert len(p.data.eval_sets) == 15  # MS MARCO dev, TREC-DL 2019 and 13 BEIR sets


def test_params_are_frozen():
    from pydantic import ValidationError

    p = load_params(PARAMS)
    with pytest.raises(ValidationError, match="frozen"):
        p.train.epochs = 3  # type: ignore[misc]
    assert load_params(PARAMS).train.epochs == 6


def test_yaml_booleans_for_amp():
    assert load_params(PARAMS, ["train.amp=off"]).train.amp == "off"  # YAML reads `off` as False
    assert load_params(PARAMS, ["train.amp=bf16"]).train.amp == "bf16"


def test_overrides_are_typed():
    p = load_params(PARAMS, ["train.epochs=2", "train.pg.temperature=0.1", "train.keep_epochs=[0, 1]"])
    assert p.train.epochs == 2 and p.train.pg.temperature == 0.1 and p.train.keep_epochs == [0, 1]


def _line_of(text: str, needle: str) -> int:
    return next(i for i, line in enumerate(text.splitlines(), 1) if needle in line)


@pytest.mark.parametrize(
    "needle,replacement,key,expect",
    [
        ("temperature: 0.05", "temperature: -1", "train.pg.temperature", "greater than 0"),
        ("epochs: 6 ", "epochs: six ", "train.epochs", "valid integer"),
        ("num_samples: 5000", "num_samples: 1", "train.pg.num_samples", "leave-one-out"),
        ("entropy: top1", "entropy: gibbs", "train.pg.entropy", "'top1' or 'ranking'"),
        ("utility: ndcg@10", "utility: bleu", "train.pg.utility", "ndcg@K"),
        ("tower: both", "tower: both\n  towr: query", "train.towr", "unknown key"),
        ("candidates: 1000", "candidates: 0", "mine.candidates", "greater than 0"),
        ("keep_epochs: [0, 2, 6]", "keep_epochs: [0, 2, 9]", "train.keep_epochs", "beyond train.epochs=6"),
    ],
)
def test_bad_values_name_file_line_key_and_expectation(tmp_path, needle, replacement, key, expect):
    text = PARAMS.read_text()
    assert needle in text
    bad = text.replace(needle, replacement, 1)
    path = tmp_path / "params.yaml"
    path.write_text(bad)
    with pytest.raises(ConfigError) as err:
        load_params(path)
    msg = str(err.value)
    line = _line_of(bad, replacement.splitlines()[-1].strip())
    assert f"{path}:{line}: {key}:" in msg, msg
    assert expect in msg, msg


def test_missing_section_and_bad_override(tmp_path):
    path = tmp_path / "params.yaml"
    path.write_text(PARAMS.read_text().replace("\nevaluate:", "\nnot_evaluate:"))
    msg = str(pytest.raises(ConfigError, load_params, path).value)
    assert "evaluate: required key is missing" in msg and "not_evaluate: unknown key" in msg
    msg = str(pytest.raises(ConfigError, load_params, PARAMS, ["train.pg.num_samples=1"]).value)
    assert "override --set train.pg.num_samples=1" in msg and "train.pg.num_samples" in msg
    with pytest.raises(ConfigError, match="KEY=VALUE"):
        load_params(PARAMS, ["train.epochs"])


def test_not_yaml_and_missing_file(tmp_path):
    path = tmp_path / "params.yaml"
    path.write_text("paths: [1\n")
    with pytest.raises(ConfigError, match=r"params.yaml:2: not valid YAML"):
        load_params(path)
    with pytest.raises(ConfigError, match="no such file"):
        load_params(tmp_path / "absent.yaml")


def test_demo_profile_overlays_the_paper_params():
    paper, demo = load_params(PARAMS), load_params(PARAMS, profile="demo")
    assert demo.paths.root == "runs/demo" != paper.paths.root
    assert (demo.train.tower, demo.mine.candidates, demo.train.warm_starts) == ("query", 100, ["minilm"])
    assert demo.data.eval_sets == ["scifact/test", "nfcorpus/test"]  # nfcorpus: out of domain
    assert (demo.train.validation_sets, demo.train.selection.rule) == (["nfcorpus/dev"], "guarded")
    assert demo.train.pg.utility == paper.train.pg.utility  # untouched keys keep the paper's values
    assert demo.mine.bm25 == paper.mine.bm25
    assert load_params(PARAMS, ["train.epochs=2", "train.keep_epochs=[0]"], profile="demo").train.epochs == 2


def test_profile_errors_name_the_profile_file_and_line(tmp_path):
    (tmp_path / "profiles").mkdir()
    (tmp_path / "params.yaml").write_text(PARAMS.read_text())
    (tmp_path / "profiles" / "small.yaml").write_text("train:\n  epochs: 2\n  keep_epochs: [0]\n  pg:\n    temprature: 1\n")
    msg = str(pytest.raises(ConfigError, load_params, tmp_path / "params.yaml", profile="small").value)
    assert f"{tmp_path / 'profiles' / 'small.yaml'}:5: train.pg.temprature: unknown key" in msg
    msg = str(pytest.raises(ConfigError, load_params, tmp_path / "params.yaml", profile="nope").value)
    assert "no profile 'nope'" in msg and "small" in msg


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
