"""The betting test of a bounded mean (Waudby-Smith & Ramdas 2024), checked against its formulas and its guarantee.

* The vectorized bets and wealth equal a query-by-query loop that writes the paper's predictable plug-in
  (fixed-``n`` tuning) and capital process literally.
* Under a null whose mean is exactly ``-margin``, the stopped wealth is an e-value and the p-value holds its level,
  checked *exactly* by enumerating every sequence of a skewed two-point null (no Monte Carlo): ``E[e] <= 1`` and
  ``P(p <= a) <= a``, at several levels and margins.
* Under skewed nulls where the t-test's normal approximation fails, the betting test stays at or below its level.
"""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest

from pgrank.core import betting
from pgrank.core.significance import student_p_values


def _literal(d: list[float], tune: float, margin: float) -> tuple[list[float], list[float]]:
    """The paper's bets and log-capital, one query at a time (the reference)."""
    n, lambdas, log_k = len(d), [], []
    mu_sum, sq_sum, k = 0.0, 0.0, 0.0
    sigma2_prev = betting.PRIOR_VARIANCE
    for t, x in enumerate(d, start=1):
        lam = min(math.sqrt(2 * math.log(1 / tune) / (n * sigma2_prev)), betting.TRUNCATION / (1 - margin))
        k += math.log(1 + lam * (x + margin))
        lambdas.append(lam)
        log_k.append(k)
        mu_sum += x
        mu_t = (betting.PRIOR_MEAN + mu_sum) / (t + 1)
        sq_sum += (x - mu_t) ** 2
        sigma2_prev = (betting.PRIOR_VARIANCE + sq_sum) / (t + 1)
    return lambdas, log_k


@pytest.mark.parametrize("margin", [0.0, 0.02])
def test_the_bets_and_the_wealth_are_the_papers_predictable_plug_in(margin):
    rng = np.random.default_rng(3)
    d = np.clip(rng.normal(0.03, 0.2, 50), -1, 1)
    lambdas, log_k = _literal(list(d), 0.01, margin)
    np.testing.assert_allclose(betting.bets(d, tune=0.01, margin=margin), lambdas, rtol=1e-12)
    np.testing.assert_allclose(betting.wealth(d, tune=0.01, margin=margin), log_k, rtol=1e-10, atol=1e-12)
    batch = np.stack([d, -d, d[::-1]])  # (3, Q): a batch gives each row's own
    for row, got in zip(batch, betting.wealth(batch, tune=0.01, margin=margin)):
        np.testing.assert_allclose(got, _literal(list(row), 0.01, margin)[1], rtol=1e-10, atol=1e-12)


def test_the_e_value_stops_at_the_threshold_and_the_p_value_is_villes():
    d = np.full(500, 0.05)
    log_k = betting.wealth(d, tune=0.001)
    first = int(np.argmax(log_k >= math.log(1000)))
    assert log_k[-1] > math.log(1000) and float(betting.e_values(d, tune=0.001)) == pytest.approx(math.exp(log_k[first]))
    assert float(betting.p_values(d, tune=0.001)) == pytest.approx(math.exp(-log_k.max()))
    assert float(betting.e_values(-d, tune=0.001)) < 1.0 and float(betting.p_values(-d, tune=0.001)) == 1.0
    assert float(betting.p_values(d[:0], tune=0.05)) == 1.0


def _enumerate(values: list[float], probs: list[float], n: int, tune: float, margin: float):
    """(probability, e-value, p-value) of every sequence of ``n`` draws."""
    seqs = np.array(list(itertools.product(values, repeat=n)))  # (2^n, n)
    index = np.array(list(itertools.product(range(len(values)), repeat=n)))
    prob = np.prod(np.asarray(probs)[index], axis=1)
    return prob, betting.e_values(seqs, tune=tune, margin=margin), betting.p_values(seqs, tune=tune, margin=margin)


@pytest.mark.parametrize("margin", [0.0, 0.05])
@pytest.mark.parametrize("tune", [0.3, 0.1, 0.02])
def test_exactly_an_e_value_and_a_valid_p_value_under_a_skewed_null(tune, margin):
    # a skewed two-point null with mean exactly -margin: wins of +0.15 (80%), losses that balance them
    win = 0.15
    loss = (-margin - 0.8 * win) / 0.2
    prob, e, p = _enumerate([win, loss], [0.8, 0.2], 14, tune, margin)
    assert prob.sum() == pytest.approx(1.0)
    assert float(prob @ e) <= 1 + 1e-9  # the stopped wealth of a martingale: E = 1 exactly
    assert float(prob @ e) == pytest.approx(1.0, abs=1e-9)
    for a in (tune, 2 * tune, 0.5):
        assert float(prob[p <= a].sum()) <= a + 1e-12  # Ville's inequality, exactly


def test_a_null_worse_than_its_margin_is_even_less_likely_to_pass():
    prob, e, _ = _enumerate([0.3, -0.9], [0.7, 0.3], 12, 0.1, 0.0)  # mean -0.06 < 0
    assert float(prob @ e) < 1.0


def test_it_holds_its_level_under_skew_where_the_t_test_does_not():
    rng = np.random.default_rng(0)
    level, n, trials = 0.01, 60, 40000
    d = np.where(rng.random((trials, n)) < 0.9, 0.05, -0.45)  # mean 0: many small wins, a few large losses
    bet = float((betting.p_values(d, tune=level) <= level).mean())
    t = float((student_p_values(d, "greater") < level).mean())
    assert bet <= level and t > 2 * level, (bet, t)


def test_it_detects_a_real_gain_and_adapts_to_the_variance():
    rng = np.random.default_rng(1)
    quiet = np.clip(rng.normal(0.02, 0.1, (1000, 1000)), -1, 1)
    loud = np.clip(rng.normal(0.02, 0.3, (1000, 1000)), -1, 1)
    assert (betting.p_values(quiet, tune=0.001) <= 0.001).mean() > 0.95
    assert (betting.p_values(loud, tune=0.001) <= 0.001).mean() < 0.3  # the same gain, six times the noise


@pytest.mark.parametrize("kwargs,match", [
    (dict(tune=0.0), "level must lie in"), (dict(tune=1.0), "level must lie in"),
    (dict(tune=0.05, margin=1.0), "margin must lie in"), (dict(tune=0.05, margin=-0.1), "margin must lie in")])
def test_parameters_out_of_range_are_refused(kwargs, match):
    with pytest.raises(ValueError, match=match):
        betting.e_values(np.zeros(5), **kwargs)


def test_differences_outside_minus_one_one_are_refused():
    with pytest.raises(ValueError, match=r"\[-1, 1\]"):
        betting.p_values(np.array([0.5, 1.5]), tune=0.05)
