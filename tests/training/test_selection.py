"""train.selection: which epoch is the policy (in domain, or guarded by out-of-domain validation sets), and early stopping."""

from __future__ import annotations

import json
import random

import pytest
from toy_project import make_project, write_dataset

from pgrank.config import SelectionConfig
from pgrank.errors import ConfigError
from pgrank.training.selection import select_epoch, should_stop, summary

OOD = "other/test"
# in-domain nDCG@10 rises every epoch; out of domain it drops after epoch 1
HISTORY = [{"epoch": e, "val_ndcg@10": ind, f"val_{OOD}_ndcg@10": ood}
           for e, ind, ood in [(0, 0.50, 0.40), (1, 0.55, 0.402), (2, 0.60, 0.396), (3, 0.62, 0.38), (4, 0.62, 0.37)]]


def test_each_rule_selects_its_epoch():
    assert select_epoch(HISTORY, [OOD], SelectionConfig(rule="last")) == 4  # the paper
    assert select_epoch(HISTORY, [OOD], SelectionConfig(rule="in_domain")) == 3  # ties: the earlier epoch
    assert select_epoch(HISTORY, [OOD], SelectionConfig(rule="guarded", margin=0.005)) == 2  # 0.396 >= 0.40 - 0.005
    assert select_epoch(HISTORY, [OOD], SelectionConfig(rule="guarded", margin=0.0)) == 1
    worse = [HISTORY[0]] + [{**row, f"val_{OOD}_ndcg@10": 0.1} for row in HISTORY[1:]]
    assert select_epoch(worse, [OOD], SelectionConfig(rule="guarded")) == 0  # nothing qualifies: the warm start


def test_early_stopping_follows_the_rule():
    cfg = SelectionConfig(rule="guarded", margin=0.0, patience=2)
    assert [should_stop(HISTORY[: n + 1], [OOD], cfg) for n in range(5)] == [False, False, False, True, True]
    assert not should_stop(HISTORY, [OOD], SelectionConfig(rule="in_domain", patience=2))  # epoch 3 is 1 back
    chosen = summary(HISTORY, [OOD], cfg)
    assert chosen["epoch"] == 1 and chosen["in_domain_gain"] == pytest.approx(0.05)
    assert chosen[f"{OOD}_gain"] == pytest.approx(0.002)


def test_rules_that_need_what_is_not_there_are_config_errors(tmp_path, tiny_model_dir):
    with pytest.raises(ConfigError, match="guarded needs out-of-domain validation_sets"):
        make_project(tmp_path, tiny_model_dir, overrides={"train.selection": {"rule": "guarded"}})
    with pytest.raises(ConfigError, match="patience"):
        make_project(tmp_path, tiny_model_dir, overrides={"train.selection": {"patience": 1}})


def _with_other_dataset(tmp_path, tiny_model_dir, overrides):
    """The toy project plus a second toy dataset as an out-of-domain validation set, mined as a training set."""
    from pgrank.data.beir import load_topics
    from pgrank.data.candidate_store import run_sets, write_candidates
    from pgrank.data.corpus_store import open_corpus

    params, paths = make_project(tmp_path, tiny_model_dir, overrides={"train.validation_sets": [OOD], **overrides})
    write_dataset(paths.dataset("other"), seed=7)
    (paths.dataset("other") / "qrels" / "train.tsv").rename(paths.dataset("other") / "qrels" / "test.tsv")
    corpus = open_corpus(paths, "other")
    queries, qrels = load_topics(paths, "other", "test")
    ids = [json.loads(line)["_id"] for line in (paths.dataset("other") / "corpus.jsonl").read_text().splitlines()]
    rng = random.Random(2)
    run = {q: {d: 1.0 / (i + 1) for i, d in enumerate(list(judged) + rng.sample([d for d in ids if d not in judged], 8))}
           for q, judged in qrels.items()}
    write_candidates(paths, "other", "test", run_sets(run, corpus, queries, qrels), corpus=corpus, tag="test",
                     trec=False, training=True)
    return params, paths


def test_training_validates_out_of_domain_and_keeps_the_selected_epoch_as_the_policy(tmp_path, tiny_model_dir):
    from pgrank.models.checkpoint_meta import read_checkpoint_meta
    from pgrank.retrieval.dense.retriever import policy_system
    from pgrank.training.trainer import train

    name = str(tiny_model_dir)
    params, paths = _with_other_dataset(tmp_path, tiny_model_dir, {
        "train.epochs": 3, "train.learning_rate": 3e-3, "train.selection": {"rule": "guarded", "margin": 0.0, "patience": 1}})
    result = train(params, paths, name, device="cpu", progress=False)
    key = f"val_{OOD}_ndcg@10"
    assert all(key in row and "val_ndcg@10" in row for row in result.history)
    chosen = select_epoch(result.history, [OOD], params.train.selection)
    assert result.final == paths.selected_checkpoint(name)
    assert read_checkpoint_meta(result.final)["epoch"] == chosen
    stopped = result.history[-1]["epoch"]
    assert stopped == min(params.train.epochs, chosen + 1)  # patience 1: one epoch past the selected one, at most
    assert policy_system(params, paths, f"pgrank-{name}").query_model == str(paths.selected_checkpoint(name))
