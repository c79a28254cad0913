"""The champion gate's rule and its measured false-promotion rate (pure functions, seconds).

* :func:`judge` is one-sided in the direction of the gain for every test: a challenger that loses on many queries
  and wins big on a few is not promoted by a rank test that only says "different". It promotes only a gain over
  ``min_gain`` with ``p`` below the decision's level, which the verdict names; with a non-inferiority margin, a
  challenger worse by less than the margin. A spent budget (level 0) never promotes.
* The one-sided p-values are scipy's (``ttest_rel``, ``wilcoxon`` with Pratt's zeros, the sign-flip
  randomization), and the Monte Carlo's vectorized ones are :func:`judge`'s.
* On SciFact's real per-query spread with the ties kept (random signs, ``studies/data/scifact-demo-per-query.json``,
  what ``studies/gate_power.py`` reads), one decision promotes a challenger that is no better at its level: the rate
  is bounded tightly enough (within 10% at 0.05, 50% at an error budget's 0.05 / 52) that a doubled rate fails,
  and it does fail for a rule run at twice its level. A year of 52 decisions on one frozen gate, each at
  0.05 / 52, promotes falsely in at most 5% of the years.
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest

from pgrank.core.error_budget import schedule
from pgrank.core.promotion import choose, gate_p_values, judge, simulate_years
from pgrank.core.significance import paired_p_value

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "bench"))
sys.path.insert(0, str(ROOT / "studies"))

from gate_power import read_spread  # noqa: E402

ALPHA, BUDGET, HORIZON = 0.05, 0.05, 52


@pytest.fixture(scope="module")
def differences() -> np.ndarray:
    return read_spread()[0]


def test_the_rule_promotes_a_significant_gain_over_the_margin_only():
    base = np.linspace(0.2, 0.8, 40)
    promoted = judge(base + 0.05, base, min_gain=0.0, test="student", alpha=ALPHA)
    assert (promoted.reason, promoted.level) == ("promoted", ALPHA)
    noisy = judge(base + 0.005 + np.tile([0.2, -0.2], 20), base, min_gain=0.0, test="student", alpha=ALPHA)
    assert (noisy.promoted, noisy.reason) == (False, "not_significant") and noisy.gain == pytest.approx(0.005)
    assert judge(base - 0.01, base, min_gain=0.0, test="student", alpha=ALPHA).reason == "not_better"
    assert judge(base + 0.02, base, min_gain=0.05, test="student", alpha=None).reason == "not_better"
    assert judge(base + 0.005 + np.tile([0.2, -0.2], 20), base, min_gain=0.0, test="student", alpha=None).promoted
    assert judge(base, base, min_gain=0.0, test="student", alpha=ALPHA).p_value == 1.0


def test_a_spent_budget_promotes_nothing():
    base = np.linspace(0.2, 0.8, 40)
    spent = judge(base + 0.3, base, min_gain=0.0, test="student", alpha=0.0)
    assert (spent.promoted, spent.reason, spent.level) == (False, "not_significant", 0.0)


@pytest.mark.parametrize("test", ["student", "wilcoxon", "fisher"])
def test_a_worse_model_with_a_few_big_wins_is_not_promoted(test):
    """40 queries at -0.02, 5 at +0.25, 55 ties: the mean gain is positive, yet the challenger loses far more
    queries than it wins. Two-sided, the signed-rank test calls that significant (p = 0.00018); one-sided in the
    direction of the gain it is not."""
    base = np.full(100, 0.5)
    challenger = base + np.r_[np.full(40, -0.02), np.full(5, 0.25), np.zeros(55)]
    verdict = judge(challenger, base, min_gain=0.0, test=test, alpha=ALPHA)
    assert verdict.gain > 0 and not verdict.promoted and verdict.reason == "not_significant"
    if test == "wilcoxon":
        assert paired_p_value(challenger, base, test) == pytest.approx(0.00018, rel=0.02)  # the tables: two-sided
        assert verdict.p_value > 0.999


def test_non_inferiority_promotes_unless_worse_by_more_than_the_margin():
    rng = np.random.default_rng(0)
    base = rng.uniform(0.3, 0.9, 500)
    noise = rng.normal(0, 0.02, 500)
    noise -= noise.mean()  # the gains below are exact
    slightly_worse = judge(base - 0.004 + noise, base, min_gain=0.0, test="student", alpha=ALPHA, margin=0.01)
    assert slightly_worse.promoted and slightly_worse.gain < 0
    assert not judge(base - 0.004 + noise, base, min_gain=0.0, test="student", alpha=ALPHA).promoted  # superiority
    assert judge(base - 0.02 + noise, base, min_gain=0.0, test="student", alpha=ALPHA, margin=0.01).reason == "not_better"
    close = judge(base - 0.009 + noise, base, min_gain=0.0, test="student", alpha=ALPHA, margin=0.01)
    assert close.reason == "not_significant"  # within the margin, but not significantly so
    for test in ("student", "wilcoxon", "fisher"):  # H0 gain <= -m: the superiority test of the shifted values
        p = judge(base - 0.004 + noise, base, min_gain=0.0, test=test, alpha=ALPHA, margin=0.01).p_value
        assert p == pytest.approx(paired_p_value(base + 0.006 + noise, base, test, "greater"))


def test_the_best_selection_score_is_chosen_and_a_tie_goes_to_the_later_challenger():
    assert choose([0.5, 0.7, 0.6]) == 1
    assert choose([0.7, 0.5, 0.7]) == 2
    with pytest.raises(ValueError):
        choose([])


def test_the_paired_tests_are_scipys_two_sided_and_one_sided():
    from scipy import stats

    rng = np.random.default_rng(0)
    for n in (2, 3, 30, 300):
        x = rng.uniform(0, 1, n)
        y = x + rng.normal(0.01, 0.1, n) * (rng.uniform(0, 1, n) < 0.6)
        for alternative in ("two-sided", "greater"):
            expected = 1.0 if np.allclose(x, y) else stats.ttest_rel(x, y, alternative=alternative).pvalue
            assert paired_p_value(x, y, "student", alternative) == pytest.approx(expected, rel=1e-9)
        if n >= 30:
            expected = stats.wilcoxon(x, y, zero_method="pratt", alternative="greater").pvalue
            assert paired_p_value(x, y, "wilcoxon", "greater") == pytest.approx(expected, rel=1e-12)
            assert paired_p_value(x, y, "wilcoxon") == pytest.approx(stats.wilcoxon(x, y).pvalue, rel=1e-12)
            less = paired_p_value(y, x, "fisher", "greater")
            assert paired_p_value(x, y, "fisher", "greater") + less == pytest.approx(1.0, abs=5e-4)  # (k + 1) / 10000
    assert paired_p_value(np.ones(5) * 0.3, np.ones(5) * 0.2, "student", "greater") == 0.0  # the same gain everywhere
    assert paired_p_value(np.ones(5) * 0.2, np.ones(5) * 0.3, "student", "greater") == 1.0  # the same loss everywhere


@pytest.mark.parametrize("test", ["student", "wilcoxon"])
def test_the_monte_carlo_decides_with_judges_p_values(differences, test):
    rng = np.random.default_rng(3)
    d = differences[rng.integers(len(differences), size=(6, 300))] * rng.choice([-1.0, 1.0], size=(6, 300))
    d[0] += 0.03
    base = np.full(300, 0.5)
    expected = [judge(base + row, base, min_gain=0.0, test=test, alpha=ALPHA).p_value for row in d]
    assert gate_p_values(d, test) == pytest.approx(expected, rel=1e-9)


@pytest.fixture(scope="module")
def per_decision(differences) -> dict[tuple[str, float], object]:
    """Per-decision false-promotion rates over null decisions on 300 gate queries: 208k at 0.05 and at twice it,
    416k at an error budget's 0.05 / 52 and at twice it (each pair on the same draws)."""
    found = {}
    for level, years, seed in ((ALPHA, 4000, 1), (BUDGET / HORIZON, 8000, 2)):
        sims = simulate_years(differences, {"rule": [level] * HORIZON, "doubled": [2 * level] * HORIZON},
                              gate_size=300, training="continual", years=years, seed=seed)
        found |= {(name, level): decisions for name, (decisions, _) in sims.items()}
    return found


def test_one_decision_promotes_a_model_that_is_no_better_at_its_level(per_decision):
    """At 0.05 (standard error 0.0005): within 10%; at 0.05 / 52 (about 400 expected promotions, standard error
    5%): within 50%. A doubled rate is 20 and 10 standard errors beyond."""
    at_alpha = per_decision["rule", ALPHA]
    assert at_alpha.trials >= 200_000 and 0.9 * ALPHA <= at_alpha.rate <= 1.1 * ALPHA, at_alpha
    level = BUDGET / HORIZON
    at_budget = per_decision["rule", level]
    assert at_budget.trials >= 400_000 and 0.5 * level <= at_budget.rate <= 1.5 * level, at_budget
    assert at_budget.error < 0.1 * level  # the bound is tight enough to see a doubled rate


def test_the_same_check_fails_on_a_rule_that_runs_at_twice_its_level(per_decision):
    assert not per_decision["doubled", ALPHA].rate <= 1.1 * ALPHA, per_decision["doubled", ALPHA]
    level = BUDGET / HORIZON
    assert not per_decision["doubled", level].rate <= 1.5 * level, per_decision["doubled", level]


@pytest.mark.parametrize("training", ["warm_start", "continual"])
def test_a_year_on_one_frozen_gate_promotes_falsely_at_most_the_budget(differences, training):
    levels = {"spending": schedule("spending", BUDGET, HORIZON, [False] * HORIZON), "none": [ALPHA] * HORIZON}
    found = simulate_years(differences, levels, gate_size=300, training=training, years=3000, seed=4)
    decisions, yearly = found["spending"]
    assert yearly.rate <= BUDGET + 2 * yearly.error, yearly  # 0.05 over the year, each decision at 0.05 / 52
    assert found["none"][1].rate > 0.4  # 52 decisions at 0.05 each: many years promote a model that is no better


def test_power_grows_with_the_gate_and_the_gain(differences):
    rates = {(n, d): simulate_years(differences, {"a": [ALPHA] * 4}, gate_size=n, training="continual", gain=d,
                                    years=100, seed=5)["a"][0].rate
             for n in (100, 1000) for d in (0.01, 0.03)}
    assert rates[100, 0.01] < rates[1000, 0.01] and rates[100, 0.01] < rates[100, 0.03]
    assert rates[1000, 0.03] > 0.95
