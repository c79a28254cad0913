"""The champion gate's rule, and how often it promotes by chance (pure: numbers in, a verdict out).

Scheduled retraining moves the champion alias only when a challenger passes one gate
(:mod:`pgrank.pipeline.champion` applies these functions to a model registry):

* :func:`choose`: with several challengers, the one to send to the gate is the best on the *selection*
  split (its validation nDCG@10), never on the gate queries themselves. Only the chosen one is tested on
  the gate, so each gate decision is one test however many challengers there were (a Holm correction over
  all of them is the alternative not taken: it would spend the gate's power on challengers the selection
  split already ruled out).
* :func:`judge`: one decision at a given level. **Superiority** (``margin`` unset): the challenger is promoted
  only if its mean gain over the baseline (the champion, or for the first run its warm start) exceeds
  ``min_gain`` and a one-sided test of H0 "mean gain <= 0" against H1 "mean gain > 0" gives ``p < level``.
  **Non-inferiority** (``margin`` m >= 0): it is promoted unless it is worse by more than m, that is when the
  one-sided test of H0 "mean gain <= -m" gives ``p < level``. The claim is about the *mean* gain, so the test must
  be one of the mean: ``betting`` (the default, :mod:`pgrank.core.betting`: valid at every level and sample size for
  any distribution of per-query differences on [-1, 1], skewed and tied ones included) or ``student`` (the paired
  t-test: its normal approximation fails in the tails, so at a budget's small levels it is approximate and, under
  skew, promotes a no-better challenger several times as often as its level). The rank and sign-flip tests
  (``wilcoxon``, ``fisher``) test a symmetric null, not the mean: they are refused (:data:`MEAN_TESTS`).
* The level comes from ``champion.alpha`` (the same for every decision), or from an error budget over a horizon
  of decisions (:mod:`pgrank.core.error_budget`), which bounds the chance of any false promotion (or, with e-LOND,
  the expected share of false promotions) over ``horizon`` decisions.
* :func:`simulate_years`: a Monte Carlo of a year of decisions on one frozen gate set, on per-query differences
  resampled from a real evaluation (SciFact's, in ``studies/gate_power.py``), with the ties kept: the per-decision
  and yearly false-promotion rates and the power, through the rule :func:`judge` applies (:func:`gate_p_values`,
  :func:`promotes`).

Example:
    >>> base = np.linspace(0.2, 0.8, 400)
    >>> judge(base + 0.05, base, min_gain=0.0, test="betting", alpha=0.05).reason
    'promoted'
    >>> judge(base - 0.005, base, min_gain=0.0, test="betting", alpha=0.05, margin=0.01).promoted  # non-inferior
    True
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

import numpy as np

from pgrank.core import betting
from pgrank.core.significance import paired_p_value, student_p_values

# The tests of a mean the gate accepts: betting (exact for bounded values, any distribution) and student (approximate).
MEAN_TESTS = ("betting", "student")
RANK_TESTS = {"wilcoxon": "the signed-rank test's null is a distribution symmetric about 0, not a mean of 0",
              "fisher": "the sign-flip randomization test's null is a distribution symmetric about 0, not a mean of 0"}

Reason = Literal["promoted", "not_better", "not_significant"]
Training = Literal["warm_start", "continual"]


@dataclass(frozen=True)
class Verdict:
    """One gate decision on per-query values: promoted or not, the mean gain, its one-sided p-value, why, and the
    level the test was run at (``None``: no significance asked for)."""

    promoted: bool
    gain: float
    p_value: float
    reason: Reason
    level: float | None = None
    e_value: float | None = None  # the betting test's e-value (p = min(1, 1 / e)); None for student


def refuse_rank_test(test: str) -> None:
    """A ``ValueError`` saying why a rank or sign-flip test cannot decide a claim about the mean gain."""
    if test in RANK_TESTS:
        raise ValueError(f"test {test!r} cannot decide a claim about the mean gain (or a margin on it): "
                         f"{RANK_TESTS[test]}, so under skewed per-query gains it promotes a no-better challenger far "
                         f"more often than its level; use betting (valid for any distribution on [-1, 1]) or student")
    if test not in MEAN_TESTS:
        raise ValueError(f"unknown gate test {test!r}: expected one of {', '.join(MEAN_TESTS)}")


def promotes(gain, p_value, *, min_gain: float, margin: float | None, level: float | None):
    """The rule on a decision's mean gain and one-sided p-value (arrays broadcast): superiority, gain above
    ``min_gain`` and ``p < level``; non-inferiority (``margin`` set), gain above ``-margin`` and ``p < level``.
    ``level`` ``None``: no significance asked for; ``level`` 0 (a spent budget) never promotes."""
    better = np.asarray(gain) > (min_gain if margin is None else -margin)
    return better if level is None else better & (np.asarray(p_value) < level)


def judge(challenger: np.ndarray, baseline: np.ndarray, *, min_gain: float, test: str, alpha: float | None,
          margin: float | None = None, tune: float | None = None, by_e_value: bool = False) -> Verdict:
    """The gate's rule on two systems' values over the same gate queries (same order).

    Args:
        challenger, baseline: ``(Q,)`` per-query values of ``champion.metric`` (in [0, 1] for the betting test).
        min_gain: superiority: the mean gain must exceed it (ignored with a ``margin``).
        test: a test of the mean (:data:`MEAN_TESTS`), one-sided in the direction of a gain; a rank test is a
            ``ValueError`` (:func:`refuse_rank_test`).
        alpha: the level of this decision, ``champion.alpha`` or the error budget's level; the one-sided ``p`` must
            be below it (``None``: no significance required; 0: a spent budget, never promoted).
        margin: ``None``: superiority. A margin ``m >= 0`` in the metric's units: non-inferiority, promote unless
            the challenger is worse than the baseline by more than ``m`` (H0: gain <= -m).
        tune: ``betting``: the level its bets are tuned for and its wealth stopped at, fixed before the data are
            seen (the error budget's allocation per decision); default ``alpha`` (0.05 when ``alpha`` is unset or 0).
        by_e_value: ``betting`` under e-LOND: decide by the e-value, ``e >= 1 / alpha``, instead of ``p < alpha``
            (:mod:`pgrank.core.betting`: the p-value is Ville's, ``1 / max_t K_t``; the e-value is the wealth
            stopped at ``1 / tune``).
    """
    refuse_rank_test(test)
    challenger, baseline = np.asarray(challenger, dtype=np.float64), np.asarray(baseline, dtype=np.float64)
    gain = float(challenger.mean() - baseline.mean()) if len(challenger) else 0.0
    e = None
    if test == "betting":
        a = tune or alpha or 0.05
        e = float(betting.e_values(challenger - baseline, tune=a, margin=margin or 0.0))
        p = float(betting.p_values(challenger - baseline, tune=a, margin=margin or 0.0))
    else:
        if by_e_value:
            raise ValueError(f"test {test!r} gives no e-value: deciding by e-value needs the betting test")
        p = paired_p_value(challenger, baseline, test, alternative="greater", margin=margin or 0.0)
    if not promotes(gain, 0.0, min_gain=min_gain, margin=margin, level=None):
        return Verdict(False, gain, p, "not_better", alpha, e)
    significant = alpha is None or (e * alpha >= 1 if by_e_value else p < alpha)  # level 0: never
    if not significant:
        return Verdict(False, gain, p, "not_significant", alpha, e)
    return Verdict(True, gain, p, "promoted", alpha, e)


def choose(selection_scores: Sequence[float]) -> int:
    """The index of the challenger to gate: the highest selection score; a tie goes to the later one (the newer version)."""
    scores = np.asarray(selection_scores, dtype=np.float64)
    if not len(scores):
        raise ValueError("no challenger to choose from")
    return len(scores) - 1 - int(np.argmax(scores[::-1]))


# --------------------------------------------------------------------------------------- Monte Carlo


def gate_p_values(differences: np.ndarray, test: str, margin: float = 0.0, tune: float = 0.05) -> np.ndarray:
    """:func:`judge`'s one-sided p-values for a batch of gates: ``(..., Q)`` per-query differences (challenger minus
    baseline) -> ``(...)``. ``betting`` (bets tuned for ``tune``), ``student`` and ``wilcoxon`` run vectorized (the
    same values as :func:`judge` and :func:`pgrank.core.significance.paired_p_value`, checked by the tests);
    ``fisher`` gate by gate. The rank tests are here only to measure how they fail (``studies/gate_power.py``)."""
    from scipy import stats

    if test == "betting":
        return betting.p_values(differences, tune=tune, margin=margin)
    d = np.asarray(differences, dtype=np.float64) + margin
    if test == "student":
        return student_p_values(d, "greater")
    if test == "wilcoxon":
        d = np.round(d, 12)  # as paired_p_value: equal differences are ties
        p = stats.wilcoxon(d, axis=-1, zero_method="pratt", alternative="greater").pvalue
        return np.where(np.all(d == 0, axis=-1), 1.0, p)
    flat = d.reshape(-1, d.shape[-1])
    return np.array([paired_p_value(x, np.zeros_like(x), test, "greater") for x in flat]).reshape(d.shape[:-1])


@dataclass(frozen=True)
class Simulation:
    """How often simulated gates promoted: ``promotions`` of ``trials``, and the rate's Monte-Carlo standard error."""

    trials: int
    promotions: int
    clustered: float | None = None  # the standard error between years, when the decisions of a year depend on each other

    @property
    def rate(self) -> float:
        return self.promotions / self.trials

    @property
    def error(self) -> float:
        """Standard error of :attr:`rate`: binomial, ``sqrt(r (1 - r) / trials)``, or the one between years."""
        return self.clustered if self.clustered is not None else math.sqrt(self.rate * (1 - self.rate) / self.trials)


def draw_differences(rng: np.random.Generator, magnitudes: np.ndarray, weeks: int, *, training: Training,
                     gain: float = 0.0, scale: float = 1.0) -> np.ndarray:
    """Per-query differences (challenger minus champion) of ``weeks`` decisions on frozen gates.

    Args:
        rng: the random generator.
        magnitudes: ``(Y, Q)`` the absolute per-query differences of a real model pair on each year's gate
            queries; a 0 (a tie: both models rank the query alike) stays 0 in every decision.
        weeks: decisions per year.
        training: ``continual``: each challenger is the champion trained further, so its difference is a fresh
            draw, ``magnitude * sign`` with independent signs, whatever happened before (decisions independent
            given the gate). ``warm_start``: each challenger is trained afresh from one warm start; every model
            deviates from the common quality by ``magnitude * z / sqrt(2)`` (z standard normal), so a difference
            has the real pair's spread and ties, and every decision of the year shares the champion's deviation
            (decisions positively dependent).
        gain: the true mean gain of every challenger. ``continual``: a sign is positive with probability
            ``(1 + gain / scale) / 2``, a better model wins more of the queries the two rank differently, by the
            same amounts. ``warm_start``: the null only.
        scale: the mean of the magnitudes of the spread (so the mean difference is ``gain``).

    Returns:
        ``(Y, weeks, Q)`` differences.
    """
    years, queries = magnitudes.shape
    if training == "continual":
        positive = rng.random((years, weeks, queries)) < (1 + gain / scale) / 2
        return magnitudes[:, None, :] * np.where(positive, 1.0, -1.0)  # (Y, W, Q)
    if gain:
        raise ValueError("warm_start draws the null only")
    champion = rng.standard_normal((years, 1, queries))
    challengers = rng.standard_normal((years, weeks, queries))
    return magnitudes[:, None, :] * (challengers - champion) / math.sqrt(2)  # (Y, W, Q)


def simulate_years(differences: np.ndarray, levels: dict[str, Sequence[float | None]], *, gate_size: int,
                   training: Training, gain: float = 0.0, years: int = 2000, test: str = "student",
                   min_gain: float = 0.0, margin: float | None = None, seed: int = 0,
                   chunk: int = 20, tune: float = 0.05) -> dict[str, tuple[Simulation, Simulation]]:
    """Simulate ``years`` years of decisions, each year on one frozen gate set, and count the promotions.

    Each year draws its gate once: ``gate_size`` queries resampled from the real ``differences`` (their magnitudes
    and ties, :func:`draw_differences`). Every decision of the year meets the same gate queries, with the
    dependence ``training`` gives; :func:`gate_p_values` and :func:`promotes` decide it as :func:`judge` does.

    Under the null (``gain`` 0) every promotion is false, so a year counts once its first decision promotes;
    until then every decision was kept, which is the history the level sequences in ``levels`` assume (an error
    budget's levels before the first promotion, :func:`pgrank.core.error_budget.schedule`).

    Args:
        differences: ``(N,)`` real per-query differences of two models.
        levels: name -> the levels of the year's decisions, one per week (``None``: no significance asked for).
        gate_size: gate queries.
        training: ``continual`` or ``warm_start`` (:func:`draw_differences`).
        gain: the true gain of every challenger (``continual``; 0: the null).
        years: simulated years.
        test, min_gain, margin: the rule (:func:`judge`).
        tune: the level the betting test's bets are tuned for (:func:`judge`'s ``tune``).
        seed: of the random generator.
        chunk: years drawn at once (memory: ``chunk * weeks * gate_size`` floats).

    Returns:
        name -> (the decisions: promotions of ``years * weeks``, with the standard error of their rate from the
        spread of the yearly counts, since one year's decisions share a gate and a champion; the years with at
        least one promotion).
    """
    rng = np.random.default_rng(seed)
    magnitudes = np.abs(np.asarray(differences, dtype=np.float64))
    scale = float(magnitudes.mean())
    weeks = len(next(iter(levels.values())))
    decided = {name: [] for name in levels}  # name -> promotions per year
    yearly = {name: 0 for name in levels}
    for start in range(0, years, chunk):
        y = min(chunk, years - start)
        gate = magnitudes[rng.integers(len(magnitudes), size=(y, gate_size))]  # (Y, Q)
        d = draw_differences(rng, gate, weeks, training=training, gain=gain, scale=scale)  # (Y, W, Q)
        p, mean = gate_p_values(d, test, margin or 0.0, tune), d.mean(axis=-1)  # (Y, W)
        for name, sequence in levels.items():
            outcome = np.stack([promotes(mean[:, w], p[:, w], min_gain=min_gain, margin=margin, level=a)
                                for w, a in enumerate(sequence)], axis=1)  # (Y, W)
            decided[name] += outcome.sum(axis=1).tolist()
            yearly[name] += int(outcome.any(axis=1).sum())
    found = {}
    for name, counts in decided.items():
        share = np.asarray(counts, dtype=np.float64) / weeks  # (Y,)
        error = float(share.std(ddof=1) / math.sqrt(years)) if years > 1 else None
        found[name] = (Simulation(years * weeks, int(sum(counts)), error), Simulation(years, yearly[name]))
    return found
