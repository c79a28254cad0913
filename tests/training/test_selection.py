"""train.selection: which epoch is the policy (in domain, or guarded by out-of-domain validation sets), and early stopping."""

from __future__ import annotations

import json

import pytest
from toy_project import make_project, with_other_dataset

from pgrank.config import SelectionConfig
from pgrank.errors import ConfigError
from pgrank.training.selection import select_epoch, should_stop, summary

OOD = "other/dev"
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


def test_training_validates_out_of_domain_and_keeps_the_selected_epoch_as_the_policy(tmp_path, tiny_model_dir):
    from pgrank.models.checkpoint_meta import read_checkpoint_meta
    from pgrank.retrieval.dense.retriever import policy_system
    from pgrank.training.trainer import train

    name = str(tiny_model_dir)
    params, paths = with_other_dataset(tmp_path, tiny_model_dir, {
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


def test_the_noise_guard_records_every_sets_per_query_values_and_selects_by_them(tmp_path, tiny_model_dir):
    from pgrank.core.history import per_query_set_key
    from pgrank.models.checkpoint_meta import read_checkpoint_meta
    from pgrank.training.trainer import train

    name = str(tiny_model_dir)
    params, paths = with_other_dataset(tmp_path, tiny_model_dir, {
        "train.epochs": 2, "train.learning_rate": 3e-3,
        "train.selection": {"rule": "guarded", "guard": "noise", "noise_se": 1.0}})
    result = train(params, paths, name, device="cpu", progress=False)
    for row in result.history:
        per_query = row[per_query_set_key(OOD)]
        assert per_query and sum(per_query.values()) / len(per_query) == pytest.approx(row[f"val_{OOD}_ndcg@10"])
        assert row["per_query_ndcg@10"]
    chosen = select_epoch(result.history, [OOD], params.train.selection)
    assert read_checkpoint_meta(result.final)["epoch"] == chosen
    assert summary(result.history, [OOD], params.train.selection)["guard"] == "noise"


MIXED = HISTORY + [{"epoch": e, "alpha": a, "val_ndcg@10": ind, f"val_{OOD}_ndcg@10": ood}
                   for e, a, ind, ood in [(3, 0.5, 0.58, 0.399), (4, 0.5, 0.61, 0.398), (4, 0.25, 0.56, 0.401)]]


def test_the_rule_picks_an_epoch_and_its_mixture_among_the_listed_alphas():
    from pgrank.training.selection import select_row

    guarded = SelectionConfig(rule="guarded", margin=0.005, interpolation=[0.25, 0.5, 1])
    assert (select_row(MIXED, [OOD], guarded)["epoch"], select_row(MIXED, [OOD], guarded).get("alpha")) == (4, 0.5)
    only_plain = SelectionConfig(rule="guarded", margin=0.005)  # interpolation [1]: mixtures are not candidates
    assert select_row(MIXED, [OOD], only_plain) == HISTORY[2]
    assert select_row(MIXED, [OOD], SelectionConfig(rule="last")) == HISTORY[-1]  # last: the last epoch as trained
    assert summary(MIXED, [OOD], guarded)["alpha"] == 0.5
    assert SelectionConfig(interpolation=[0.5, 1, 0.25]).interpolation == [1, 0.5, 0.25]


def test_mixtures_need_a_rule_that_chooses_and_alphas_in_range(tmp_path, tiny_model_dir):
    with pytest.raises(ConfigError, match="interpolation .* needs selection.rule"):
        make_project(tmp_path, tiny_model_dir, overrides={"train.selection": {"interpolation": [0.5, 1]}})
    with pytest.raises(ConfigError, match="interpolation"):
        make_project(tmp_path, tiny_model_dir, overrides={"train.selection": {"rule": "in_domain", "interpolation": [0, 1]}})


def test_a_selected_mixture_is_the_policy_and_equals_the_interpolated_weights(tmp_path, tiny_model_dir, monkeypatch):
    """Every epoch's mixtures are validated; the chosen (epoch, alpha) is saved as the policy, with weights
    (1 - alpha) * warm start + alpha * that epoch's, in every parameter. (A toy model may not beat its warm start
    in domain: the choice is pinned to the latest mixture, so that the mixture is what gets saved.)"""
    import torch
    from safetensors.torch import load_file

    from pgrank.models.checkpoint_meta import read_checkpoint_meta
    from pgrank.training.trainer import train
    from pgrank.training.weight_space import Anchor

    name = str(tiny_model_dir)
    params, paths = with_other_dataset(tmp_path, tiny_model_dir, {
        "train.epochs": 2, "train.tower": "both", "train.learning_rate": 3e-3, "train.keep_epochs": [0, 1, 2],
        "train.selection": {"rule": "guarded", "margin": 1.0, "interpolation": [0.3]}})
    from pgrank.training import selection

    monkeypatch.setattr(selection, "select_row", lambda history, sets, cfg: history[-1])
    result = train(params, paths, name, device="cpu", progress=False)
    assert [(r["epoch"], r.get("alpha", 1.0)) for r in result.history] == [(0, 1.0), (1, 1.0), (1, 0.3), (2, 1.0), (2, 0.3)]
    chosen = result.history[-1]
    assert chosen.get("alpha") == 0.3
    meta = read_checkpoint_meta(result.final)
    assert meta["epoch"] == chosen["epoch"] and meta.get("alpha", 1.0) == chosen.get("alpha", 1.0)
    # the policy's weights are (1 - alpha) * warm start + alpha * the chosen epoch's, checked against both checkpoints
    weight = chosen.get("alpha", 1.0)
    warm, epoch = (load_file(str(paths.checkpoint(name, e) / "model.safetensors")) for e in (0, chosen["epoch"]))
    policy = load_file(str(result.final / "model.safetensors"))
    for key in warm:
        if warm[key].is_floating_point():
            assert torch.allclose(policy[key], (1 - weight) * warm[key] + weight * epoch[key], atol=1e-6), key
    with open(paths.training_log(name) / "history.json") as fh:
        assert json.load(fh) == result.history
    # and the mixing itself, on a model of two parameters
    model = torch.nn.Linear(3, 2)
    anchor = Anchor.of(model)
    with torch.no_grad():
        model.weight.add_(1.0)
    with anchor.interpolated(model, 0.3):
        assert torch.allclose(model.weight, anchor.weights["weight"] + 0.3)
    assert torch.allclose(model.weight, anchor.weights["weight"] + 1.0)  # restored


def test_l2_to_the_warm_start_adds_its_gradient_and_keeps_the_policy_closer(tmp_path, tiny_model_dir):
    import torch

    from pgrank.training.trainer import train
    from pgrank.training.weight_space import Anchor

    model = torch.nn.Linear(3, 2)
    anchor = Anchor.of(model)
    with torch.no_grad():
        model.weight.add_(0.5)
    model.weight.grad = torch.zeros_like(model.weight)
    anchor.add_l2_gradient(model, 0.1)
    assert torch.allclose(model.weight.grad, torch.full_like(model.weight, 2 * 0.1 * 0.5))
    assert model.bias.grad is None  # a parameter without a gradient gets none

    distances = {}
    for coef in (0.0, 10.0):
        params, paths = make_project(tmp_path / f"l2-{coef}", tiny_model_dir, overrides={
            "train.tower": "both", "train.epochs": 1, "train.keep_epochs": [0, 1], "train.learning_rate": 3e-3,
            "train.l2_to_warm_start": coef})
        final = train(params, paths, str(tiny_model_dir), device="cpu", progress=False).final
        from safetensors.torch import load_file

        warm = load_file(str(paths.checkpoint(str(tiny_model_dir), 0) / "model.safetensors"))
        last = load_file(str(final / "model.safetensors"))
        distances[coef] = sum(float((last[k] - warm[k]).pow(2).sum()) for k in warm if warm[k].is_floating_point())
    assert 0 < distances[10.0] < distances[0.0]


def _row(epoch, alpha, values):
    row = {"epoch": epoch, "val_ndcg@10": sum(values) / len(values),
           "per_query_ndcg@10": {f"q{i}": v for i, v in enumerate(values)}}
    return {**row, "alpha": alpha} if alpha != 1.0 else row


BEST = [0.9 + e for e in [0.1, -0.1] * 5]  # mean 0.9, standard error 0.033
NOISY = [0.1, -0.08] * 5  # mean 0.01; the standard error of these differences is 0.030
PATH = [_row(0, 1.0, [b - d for b, d in zip(BEST, [0.4, 0.3] * 5)]),    # 0.35 worse, paired error 0.017
        _row(1, 1.0, [b - d for b, d in zip(BEST, NOISY)]),             # as good as the best's mixture, not on its path
        _row(2, 1.0, BEST),                                             # the best
        _row(2, 0.5, [b - d for b, d in zip(BEST, NOISY)]),             # within one paired error of the best
        _row(2, 0.25, [b - d for b, d in zip(BEST, [0.03, 0.01] * 5)])]  # 0.02 worse, paired error 0.0033


def test_the_one_standard_error_rule_takes_the_point_nearest_the_warm_start_that_validation_cannot_tell_from_the_best():
    from pgrank.training.selection import select_row

    def chosen(k, history=PATH, error="paired"):
        cfg = SelectionConfig(rule="in_domain", interpolation=[0.25, 0.5, 1], within_se=k, standard_error=error)
        row = select_row(history, [], cfg)
        return row["epoch"], row.get("alpha", 1.0)

    assert chosen(0) == (2, 1.0)  # off: the best
    assert chosen(0.1) == (2, 1.0)  # a tenth of an error: only the best itself
    assert chosen(1) == (2, 0.5)  # on the best epoch's path to the warm start, not epoch 1
    assert chosen(18) == (2, 0.25)  # 0.02 <= 18 errors; the warm start's 0.35 > 18 x 0.017
    assert chosen(25) == (0, 1.0)  # the warm start itself is within 25 errors
    # the classic rule: the best's own error (0.033 over these ten queries) is larger than the paired ones
    assert chosen(1, error="best") == (2, 0.25)
    assert SelectionConfig().standard_error == "best"
    one_query = [{**row, "per_query_ndcg@10": {"q0": row["per_query_ndcg@10"]["q0"]}} for row in PATH]
    assert chosen(1, one_query) == (0, 1.0) == chosen(1, one_query, "best")  # one query proves nothing: the warm start


def test_the_one_standard_error_rule_needs_a_rule_that_chooses(tmp_path, tiny_model_dir):
    with pytest.raises(ConfigError, match="within_se"):
        make_project(tmp_path, tiny_model_dir, overrides={"train.selection": {"within_se": 1}})


def test_a_policy_the_one_standard_error_rule_brings_back_to_the_warm_start_has_its_weights(tmp_path, tiny_model_dir):
    """Validation on a handful of toy queries cannot tell any trained epoch from the warm start at 10^6 errors:
    after epochs of training (``pgrank train``) the policy is the warm start's weights, the command says so, and
    every row records its distance from them and its per-query values."""
    import torch
    import yaml
    from safetensors.torch import load_file
    from typer.testing import CliRunner

    from cli import app
    from pgrank.models.checkpoint_meta import read_checkpoint_meta

    name = str(tiny_model_dir)
    params, paths = make_project(tmp_path, tiny_model_dir, overrides={
        "train.epochs": 2, "train.tower": "both", "train.learning_rate": 3e-3, "train.keep_epochs": [0, 2],
        "train.selection": {"rule": "in_domain", "interpolation": [0.5, 1], "within_se": 1e6}})
    params_file = tmp_path / "params.yaml"
    params_file.write_text(yaml.safe_dump(params.model_dump(mode="json")))
    out = CliRunner().invoke(app, ["--params", str(params_file), "train", "--device", "cpu"])
    assert out.exit_code == 0, out.output
    history = json.loads((paths.training_log(name) / "history.json").read_text())
    assert f"-> {history[0]['val_ndcg@10']:.4f} (epoch 0); model -> {paths.selected_checkpoint(name)}" in out.output
    assert [(r["epoch"], r.get("alpha", 1.0)) for r in history] == [(0, 1.0), (1, 1.0), (1, 0.5), (2, 1.0), (2, 0.5)]
    assert history[0]["distance"] == 0.0
    trained = {(r["epoch"], r.get("alpha", 1.0)): r["distance"] for r in history[1:]}
    assert all(d > 0 for d in trained.values()) and trained[(2, 0.5)] == pytest.approx(0.5 * trained[(2, 1.0)], rel=1e-4)
    for row in history:
        per_query = row["per_query_ndcg@10"]
        assert per_query and sum(per_query.values()) / len(per_query) == pytest.approx(row["val_ndcg@10"])
    assert read_checkpoint_meta(paths.selected_checkpoint(name))["epoch"] == 0
    warm = load_file(str(paths.checkpoint(name, 0) / "model.safetensors"))
    policy = load_file(str(paths.selected_checkpoint(name) / "model.safetensors"))
    last = load_file(str(paths.checkpoint(name, 2) / "model.safetensors"))
    moved = [k for k in warm if warm[k].is_floating_point() and not torch.equal(last[k], warm[k])]
    assert moved and all(torch.equal(policy[k], warm[k]) for k in warm)


def test_a_choice_that_moves_back_to_the_warm_start_after_training_saves_the_warm_starts_weights(
        tmp_path, tiny_model_dir, monkeypatch):
    """A rule that chose epoch 1 and comes back to the warm start at epoch 2 replaces the saved policy by the warm
    start's weights (the anchor's), even though those weights are no longer the model's."""
    import torch
    from safetensors.torch import load_file

    from pgrank.models.checkpoint_meta import read_checkpoint_meta
    from pgrank.training import selection
    from pgrank.training.trainer import train

    name = str(tiny_model_dir)
    params, paths = make_project(tmp_path, tiny_model_dir, overrides={
        "train.epochs": 2, "train.tower": "both", "train.learning_rate": 3e-3, "train.keep_epochs": [0, 1, 2],
        "train.selection": {"rule": "in_domain", "interpolation": [0.5, 1]}})
    monkeypatch.setattr(selection, "select_row",
                        lambda history, sets, cfg: history[-1] if history[-1]["epoch"] < 2 else history[0])
    result = train(params, paths, name, device="cpu", progress=False)
    assert read_checkpoint_meta(result.final)["epoch"] == 0 and result.policy == result.history[0]
    warm = load_file(str(paths.checkpoint(name, 0) / "model.safetensors"))
    trained = load_file(str(paths.checkpoint(name, 1) / "model.safetensors"))
    policy = load_file(str(result.final / "model.safetensors"))
    assert any(not torch.equal(trained[k], warm[k]) for k in warm)  # epoch 1, chosen before, had moved
    assert all(torch.equal(policy[k], warm[k]) for k in warm)
