"""params.yaml parsing (pgrank.config.params and .files): the paper's values, profiles and overrides, and a clear message
naming the file, line and key for every bad config."""

from __future__ import annotations

from pathlib import Path

import pytest

from pgrank.config import load_params
from pgrank.errors import ConfigError


ROOT = Path(__file__).resolve().parents[2]
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
    assert demo.data.eval_sets == ["scifact/test", "nfcorpus/test", "dbpedia/test"]  # out of domain: the last two
    assert demo.train.validation_sets == ["nfcorpus/dev", "dbpedia/dev",  # dbpedia: the subset's selection half
                                          "scifact-halves/dev", "nfcorpus-halves/dev", "dbpedia-halves/dev"]
    assert (demo.train.selection.rule, demo.train.selection.guard) == ("guarded", "noise")
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


def test_an_onnx_backend_for_every_model_is_refused_before_a_query_tower_policy_fails_on_it():
    """A ``tower: query`` policy is a query/document Router, which does not export to ONNX: asking ONNX of every model
    is an error at once, naming the key and the per-model form, not at the policy's evaluation after training."""
    msg = str(pytest.raises(ConfigError, load_params, PARAMS, ["models.backend=onnx"], "demo").value)
    assert "override --set models.backend=onnx" in msg and "models.backends" in msg and "{minilm: onnx}" in msg
    demo = load_params(PARAMS, ["models.backends={minilm: onnx-int8}"], "demo")  # the warm start alone: fine
    assert (demo.models.backend, demo.models.backends) == ("auto", {"minilm": "onnx-int8"})
    assert load_params(PARAMS, ["models.backend=onnx"]).train.tower == "both"  # the paper's policies export
