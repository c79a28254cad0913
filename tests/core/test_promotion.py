"""The champion gate's rule and its measured false-promotion rate (pure functions, seconds).

* :func:`judge` promotes only a gain over ``min_gain`` with ``p < alpha``; :func:`choose` breaks ties toward
  the newer challenger; the paired t-test equals scipy's.
* The Monte Carlo on SciFact's real per-query spread (``bench/data/scifact-demo-per-query.json``, what
  ``bench/gate_power.py`` reads): under the null, the gate promotes at most ``alpha`` of the time (within the
  Monte-Carlo error) with one challenger and with three, since the three are compared on the selection split.
* The same check fails on broken rules, kept as tests: choosing the best of three on the gate's own mean and
  testing it there, or a rule that ignores significance.
"""

from __future__ import annotations

import math
import sys
from pathlib import Path

import numpy as np
import pytest

from pgrank.core import promotion
from pgrank.core.promotion import choose, judge, simulate_gates
from pgrank.core.significance import paired_p_value

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "bench"))

from gate_power import read_spread  # noqa: E402

ALPHA, TRIALS = 0.05, 2000


@pytest.fixture(scope="module")
def spread() -> tuple[np.ndarray, np.ndarray]:
    differences, baseline, _ = read_spread()
    return differences, baseline


def test_the_rule_promotes_a_significant_gain_over_the_margin_only():
    base = np.linspace(0.2, 0.8, 40)
    assert judge(base + 0.05, base, min_gain=0.0, test="student", alpha=ALPHA).reason == "promoted"
    noisy = judge(base + 0.005 + np.tile([0.2, -0.2], 20), base, min_gain=0.0, test="student", alpha=ALPHA)
    assert (noisy.promoted, noisy.reason) == (False, "not_significant") and noisy.gain == pytest.approx(0.005)
    assert judge(base - 0.01, base, min_gain=0.0, test="student", alpha=ALPHA).reason == "not_better"
    assert judge(base + 0.02, base, min_gain=0.05, test="student", alpha=None).reason == "not_better"
    assert judge(base + 0.005 + np.tile([0.2, -0.2], 20), base, min_gain=0.0, test="student", alpha=None).promoted
    assert judge(base, base, min_gain=0.0, test="student", alpha=ALPHA).p_value == 1.0


def test_the_best_selection_score_is_chosen_and_a_tie_goes_to_the_later_challenger():
    assert choose([0.5, 0.7, 0.6]) == 1
    assert choose([0.7, 0.5, 0.7]) == 2
    with pytest.raises(ValueError):
        choose([])


def test_the_paired_t_test_is_scipys():
    from scipy import stats

    rng = np.random.default_rng(0)
    for n in (2, 3, 30, 300):
        x = rng.uniform(0, 1, n)
        y = x + rng.normal(0.01, 0.1, n) * (rng.uniform(0, 1, n) < 0.6)
        expected = 1.0 if np.allclose(x, y) else stats.ttest_rel(x, y).pvalue  # equal values: no evidence (scipy: nan)
        assert paired_p_value(x, y, "student") == pytest.approx(expected, rel=1e-9)
    assert paired_p_value(np.ones(5) * 0.3, np.ones(5) * 0.2, "student") == 0.0  # the same gain on every query


def at_most_alpha(sim) -> bool:
    """The false-promotion rate is at most alpha within its Monte-Carlo error (two standard errors at alpha)."""
    return sim.rate <= ALPHA + 2 * math.sqrt(ALPHA * (1 - ALPHA) / sim.trials)


@pytest.mark.parametrize("challengers", [1, 3])
def test_under_the_null_the_gate_promotes_at_most_alpha_of_the_time(spread, challengers):
    sim = simulate_gates(*spread, gate_size=300, challengers=challengers, trials=TRIALS, alpha=ALPHA, seed=1)
    assert sim.trials >= 2000 and at_most_alpha(sim), (sim.rate, sim.error)
    assert sim.rate > 0.005  # it does promote by chance (about alpha / 2: a positive gain, two-sided p)


def test_choosing_the_best_of_three_on_the_gate_itself_promotes_too_often(spread):
    """The mutation the selection split prevents: pick by the gate's own mean, then test on the same queries."""
    sim = simulate_gates(*spread, gate_size=300, challengers=3, choose_on="gate", trials=TRIALS, alpha=ALPHA, seed=1)
    assert not at_most_alpha(sim), sim.rate


def test_a_rule_that_ignores_significance_fails_the_null_check(spread, monkeypatch):
    """The Monte Carlo runs the gate's own rule: break the rule and the null check fails."""
    real = promotion.judge
    monkeypatch.setattr(promotion, "judge", lambda a, b, **kw: real(a, b, **{**kw, "alpha": None}))
    sim = simulate_gates(*spread, gate_size=300, trials=500, alpha=ALPHA, seed=1)
    assert not at_most_alpha(sim), sim.rate


def test_power_grows_with_the_gate_and_the_gain(spread):
    rates = {(n, d): simulate_gates(*spread, gate_size=n, delta=d, trials=400, seed=2).rate
             for n in (100, 1000) for d in (0.01, 0.03)}
    assert rates[100, 0.01] < rates[1000, 0.01] and rates[100, 0.01] < rates[100, 0.03]
    assert rates[1000, 0.03] > 0.9
