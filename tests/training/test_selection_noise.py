"""train.selection guard: noise: a point is accepted only when no out-of-domain set loses more than its own
per-query noise against the warm start (every set must pass), then the best in domain among the accepted."""

from __future__ import annotations

import math
import random
import statistics
from pathlib import Path

import numpy as np
import pytest
from pydantic import ValidationError

from pgrank.config import SelectionConfig, load_params
from pgrank.core.history import per_query_set_key, scalars
from pgrank.errors import ConfigError
from pgrank.training.selection import (accepted, failing, held_back_by, paired_difference, passes, per_query_needed,
                                       select_row, summary)

PARAMS = Path(__file__).resolve().parents[2] / "params.yaml"

NF, DB = "nfcorpus/dev", "dbpedia/dev"
NOISE = SelectionConfig(rule="guarded", guard="noise", interpolation=[0.5, 1])
WARM_NF = [0.5, 0.3, 0.6, 0.2, 0.4, 0.7, 0.1, 0.5]  # the warm start's nDCG@10 per query
WARM_DB = [0.2, 0.8, 0.4, 0.6]


def row(epoch, in_domain, nf_diffs, db_diffs, alpha=1.0):
    """A history row whose out-of-domain sets score the warm start's per-query values plus ``*_diffs``."""
    out = {"epoch": epoch, "val_ndcg@10": in_domain}
    for name, warm, diffs in ((NF, WARM_NF, nf_diffs), (DB, WARM_DB, db_diffs)):
        per_query = {f"q{i}": w + d for i, (w, d) in enumerate(zip(warm, diffs))}
        out[per_query_set_key(name)] = per_query
        out[f"val_{name}_ndcg@10"] = statistics.mean(per_query.values())
    return {**out, "alpha": alpha} if alpha != 1.0 else out


ZERO_NF, ZERO_DB = [0.0] * 8, [0.0] * 4
# mean -0.01, stdev 0.1069: paired error 0.0378, so a loss of a quarter of an error: within the noise
SMALL_LOSS = [0.1, -0.12, 0.1, -0.12, 0.1, -0.12, 0.1, -0.12]
# every query loses 0.05 with a little spread: a loss of many errors
CLEAR_LOSS = [-0.05, -0.06, -0.04, -0.05, -0.06, -0.04, -0.05, -0.05]
WARM = row(0, 0.50, ZERO_NF, ZERO_DB)


def test_the_paired_difference_is_the_mean_and_standard_error_of_the_per_query_differences():
    mean, se, n = paired_difference(row(1, 0.6, SMALL_LOSS, ZERO_DB), WARM, per_query_set_key(NF))
    assert n == 8 and mean == pytest.approx(-0.01)
    assert se == pytest.approx(statistics.stdev(SMALL_LOSS) / math.sqrt(8))


def test_a_set_passes_when_its_loss_is_within_noise_se_paired_errors():
    small = row(1, 0.6, SMALL_LOSS, ZERO_DB)
    assert passes(small, WARM, NF, NOISE)  # -0.01 >= -1 x 0.0378
    assert not passes(small, WARM, NF, SelectionConfig(rule="guarded", guard="noise", noise_se=0.2))  # > 0.2 errors
    assert not passes(row(1, 0.6, CLEAR_LOSS, ZERO_DB), WARM, NF, NOISE)
    assert passes(row(1, 0.6, [-x for x in CLEAR_LOSS], ZERO_DB), WARM, NF, NOISE)  # a gain always passes
    # the fixed margin reads only the means: a loss of 0.01 fails margin 0.005, whatever the noise
    assert not passes(small, WARM, NF, SelectionConfig(rule="guarded", margin=0.005))


def test_every_set_must_pass_and_the_best_in_domain_of_the_accepted_points_is_chosen():
    history = [WARM,
               row(1, 0.60, SMALL_LOSS, ZERO_DB),                  # passes both
               row(2, 0.70, ZERO_NF, [-0.3, -0.25, -0.3, -0.35]),  # best in domain, loses dbpedia clearly
               row(2, 0.65, SMALL_LOSS, [0.05, -0.05, 0.02, -0.04], alpha=0.5),  # passes both
               row(3, 0.80, CLEAR_LOSS, ZERO_DB)]                  # loses nfcorpus only: rejected all the same
    chosen = select_row(history, [NF, DB], NOISE)
    assert (chosen["epoch"], chosen.get("alpha", 1.0)) == (2, 0.5)
    assert [(r["epoch"], r.get("alpha", 1.0)) for r in accepted(history, [NF, DB], NOISE)] == [(0, 1.0), (1, 1.0), (2, 0.5)]
    assert select_row(history, [NF], NOISE)["epoch"] == 2  # without dbpedia, epoch 2 as trained passes
    assert select_row(history, [DB], NOISE)["epoch"] == 3  # without nfcorpus, epoch 3 passes
    assert select_row(history, [NF, DB], SelectionConfig(rule="in_domain"))["epoch"] == 3  # no guard
    facts = summary(history, [NF, DB], NOISE)
    assert (facts["guard"], facts["accepted"], facts["epoch"], facts["alpha"]) == ("noise", 2, 2, 0.5)
    assert facts[f"{DB}_paired_se"] == pytest.approx(statistics.stdev([0.05, -0.05, 0.02, -0.04]) / 2)
    assert facts[f"{DB}_paired_z"] == pytest.approx(-0.005 / facts[f"{DB}_paired_se"])
    # what the guard rejected: the best in domain without it (epoch 3) loses nfcorpus, and only nfcorpus
    assert held_back_by(history, [NF, DB], NOISE) == [NF]
    assert failing(history[2], WARM, [NF, DB], NOISE) == [DB] and failing(WARM, WARM, [NF, DB], NOISE) == []
    assert held_back_by(history, [NF, DB], SelectionConfig(rule="in_domain")) == []  # no guard, nothing held back
    # alphas that interpolation does not list are never candidates
    assert select_row(history, [NF, DB], SelectionConfig(rule="guarded", guard="noise"))["epoch"] == 1


def test_when_no_point_beyond_the_warm_start_passes_the_policy_is_the_warm_start_and_the_summary_says_so():
    history = [WARM, row(1, 0.6, CLEAR_LOSS, ZERO_DB), row(2, 0.7, ZERO_NF, [-0.3, -0.25, -0.3, -0.35])]
    assert select_row(history, [NF, DB], NOISE) is WARM
    facts = summary(history, [NF, DB], NOISE)
    assert facts["accepted"] == 0 and facts["epoch"] == 0 and facts["in_domain_gain"] == 0.0


def test_the_one_standard_error_step_still_applies_among_the_accepted_points():
    def with_in_domain(r, values):
        return {**r, "val_ndcg@10": statistics.mean(values), "per_query_ndcg@10": {f"i{j}": v for j, v in enumerate(values)}}

    base = [0.5, 0.6, 0.4, 0.5]
    best = [v + 0.2 for v in base]
    history = [with_in_domain(WARM, base),
               with_in_domain(row(1, 0, ZERO_NF, ZERO_DB), best),
               with_in_domain(row(1, 0, ZERO_NF, ZERO_DB, alpha=0.5), [v - d for v, d in zip(best, [0.01, -0.01] * 2)]),
               with_in_domain(row(2, 0, CLEAR_LOSS, ZERO_DB), [v + 0.1 for v in best])]  # better, but rejected
    cfg = SelectionConfig(rule="guarded", guard="noise", interpolation=[0.5, 1], within_se=1, standard_error="paired")
    chosen = select_row(history, [NF, DB], cfg)
    assert (chosen["epoch"], chosen.get("alpha")) == (1, 0.5)  # no loss against epoch 1 beyond one paired error


def test_a_set_of_one_query_passes_only_without_a_loss():
    def one(diff):
        return {per_query_set_key(NF): {"q0": 0.5 + diff}, "epoch": 1}

    warm = {per_query_set_key(NF): {"q0": 0.5}, "epoch": 0}
    assert passes(one(0.0), warm, NF, NOISE) and passes(one(0.1), warm, NF, NOISE)
    assert not passes(one(-0.01), warm, NF, NOISE)


def test_per_query_values_are_recorded_for_the_noise_guard_and_kept_out_of_mlflow():
    assert per_query_needed(NOISE) and not per_query_needed(SelectionConfig(rule="guarded"))
    assert per_query_needed(SelectionConfig(rule="in_domain", within_se=1))
    assert scalars(WARM) == {"epoch": 0, "val_ndcg@10": 0.5, f"val_{NF}_ndcg@10": pytest.approx(0.4125),
                             f"val_{DB}_ndcg@10": pytest.approx(0.5)}


@pytest.mark.parametrize("selection, message", [
    ({"rule": "in_domain", "guard": "noise"}, "guard: noise .* needs rule: guarded"),
    ({"rule": "guarded", "guard": "noise", "margin": 0.01}, "guard: noise uses noise_se"),
    ({"rule": "guarded", "noise_se": 2}, "set guard: noise"),
    ({"rule": "guarded", "guard": "noise", "noise_se": 0}, "greater than 0"),
    ({"rule": "guarded", "guard": "variance"}, "'margin' or 'noise'"),
    ({"rule": "guarded", "guard": "noise", "noise_k": 1}, "noise_k"),
])
def test_bad_guard_settings_are_errors_that_name_the_key(selection, message):
    with pytest.raises(ValidationError, match=message):
        SelectionConfig(**selection)
    overrides = [f"train.selection={selection}", "train.validation_sets=[nfcorpus/dev]"]
    with pytest.raises(ConfigError, match="train.selection"):
        load_params(PARAMS, overrides)


def test_a_test_split_is_never_a_validation_set():
    with pytest.raises(ConfigError, match=r"train.validation_sets.*never reads a test split"):
        load_params(PARAMS, ["train.validation_sets=[nfcorpus/dev, dbpedia/test]"])
    assert load_params(PARAMS, ["train.validation_sets=[nfcorpus/dev, dbpedia/dev]"]).train.validation_sets \
        == ["nfcorpus/dev", "dbpedia/dev"]


def test_the_demo_guards_on_two_unlike_sets_and_three_of_half_documents_and_reports_only_the_other_half():
    demo = load_params(PARAMS, profile="demo")
    sel = demo.train.selection
    assert (sel.rule, sel.guard, sel.noise_se) == ("guarded", "noise", 2.326)
    assert demo.train.validation_sets == [NF, DB, "scifact-halves/dev", "nfcorpus-halves/dev", "dbpedia-halves/dev"]
    assert {name: demo.data.sources[f"{name}-halves"].halves.of for name in ("scifact", "nfcorpus", "dbpedia")} == {
        "scifact": "scifact", "nfcorpus": "nfcorpus", "dbpedia": "dbpedia-entity-subset"}
    assert "dbpedia/test" in demo.data.eval_sets and "dbpedia/dev" not in demo.data.eval_sets
    assert demo.data.sources["dbpedia"].split.of == "dbpedia-entity-subset"
    assert demo.data.sources["dbpedia-entity-subset"].mirror == "dbpedia-entity-subset.zip"


# nDCG@10 of a query with one relevant document at rank r (1..10): what half-document retrieval scores per query
GAIN = [1 / math.log2(r + 1) for r in range(1, 11)]
DROP = GAIN[0]            # rank 1 -> out of the top 10: the whole query lost
STEP = GAIN[0] - GAIN[1]  # rank 2 -> rank 1: the commonest small gain


def _null(losses: float, loss: float, gain: float) -> list[tuple[float, float]]:
    """``(difference, probability)`` of a per-query difference with mean exactly 0: a share ``losses`` of the
    queries lose ``loss``, as many gain ``gain`` as balance it, the others are tied."""
    gains = losses * loss / gain
    return [(-loss, losses), (gain, gains), (0.0, 1.0 - losses - gains)]


@pytest.mark.parametrize("name, null", [
    ("symmetric: a step up or down", _null(0.05, STEP, STEP)),
    ("rare whole losses, frequent small gains", _null(0.02, DROP, STEP)),
    ("rare whole gains, frequent small losses", _null(0.02 * DROP / STEP, STEP, DROP)),
])
@pytest.mark.parametrize("noise_se, nominal, band", [(1.0, 0.159, (0.10, 0.22)), (1.645, 0.05, (0.01, 0.11)),
                                                     (2.326, 0.01, (0.0, 0.05))])  # the demo's: about 0.03 at worst
def test_the_noise_guard_rejects_a_point_that_loses_nothing_at_about_its_level_on_half_documents(
        name, null, noise_se, nominal, band):
    """The guard's one-sided z-test under no loss, on sets shaped as half documents are: 300 queries whose
    nDCG@10 differences from the warm start are mostly ties, the others skewed (a whole query lost against many
    one-rank gains, or the reverse). The level stays near the nominal one (a normal approximation, so not exactly):
    at the demo's 0.01, frequent small losses against rare whole gains reject about 0.03 of such points, so the
    guard then falls back toward the warm start more often than its level says."""
    values, weights = zip(*null)
    trials, qids = 1000, [f"q{i}" for i in range(300)]
    draws = np.random.default_rng(7).choice(values, size=(trials, len(qids)), p=weights)
    cfg = SelectionConfig(rule="guarded", guard="noise", noise_se=noise_se)
    warm = {"epoch": 0, per_query_set_key(NF): dict.fromkeys(qids, 1.0)}
    rejected = sum(not passes({"epoch": 1, per_query_set_key(NF): dict(zip(qids, (1.0 + diffs).tolist()))}, warm, NF, cfg)
                   for diffs in draws)
    assert band[0] <= rejected / trials <= band[1], (name, rejected / trials, nominal)


def test_the_noise_guard_rejects_a_real_loss_of_half_documents_most_of_the_time():
    """Power: one query in 40 loses its rank-1 document (a mean loss of 0.025 over 300 queries) and nothing gains."""
    rng = random.Random(3)
    warm = {"epoch": 0, per_query_set_key(NF): {f"q{i}": 1.0 for i in range(300)}}
    rejected = 0
    for _ in range(200):
        point = {"epoch": 1, per_query_set_key(NF): {f"q{i}": 0.0 if rng.random() < 0.025 else 1.0 for i in range(300)}}
        rejected += not passes(point, warm, NF, NOISE)
    assert rejected / 200 > 0.9
