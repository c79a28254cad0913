"""Paired significance tests over per-query values (pure: numbers in, p-values out).

Used by evaluation (a policy against its warm start, :func:`paired_tests`; the paper reports none),
the tables (each objective against PG-Rank) and the promotion gate (challenger against champion). The
test is ``student`` (paired t-test), ``wilcoxon`` (signed-rank) or ``fisher`` (randomization test, 9999
random sign flips). Queries are paired by id; only queries both systems answer count.

Evaluation and the tables report two-sided p-values (``alternative="two-sided"``, the default). The gate asks a
one-sided question, ``alternative="greater"``: is the challenger better than the baseline, or, with a
non-inferiority ``margin``, worse by less than the margin (H0: mean difference <= -margin)?

Queries on which both systems score the same (a tie, difference exactly 0, 70% of SciFact's queries between a
warm start and its policy) carry no sign. The gate's one-sided signed-rank test ranks them with the others and
then drops them (Pratt's method, ``zero_method="pratt"``): under random signs of the differences, the null the
gate is simulated under, its mean and variance are exact with any number of ties. The two-sided test of the
tables keeps scipy's default (``wilcox``: ties dropped before ranking), so their p-values do not move.
"""

from __future__ import annotations

from typing import Literal

import numpy as np

Alternative = Literal["two-sided", "greater"]


def paired_test(a: dict[str, float], b: dict[str, float], test: str) -> float:
    """Two-sided p-value of a paired test between per-query values of two systems (same queries)."""
    qids = sorted(set(a) & set(b))
    return paired_p_value(np.array([a[q] for q in qids]), np.array([b[q] for q in qids]), test)


def student_p_values(differences: np.ndarray, alternative: Alternative = "two-sided") -> np.ndarray:
    """The paired t-test's p-values (scipy.stats.ttest_rel's), computed directly for a batch of gates: the gate's
    Monte Carlo runs it millions of times.

    Args:
        differences: ``(..., Q)`` per-query differences (``x - y``, shifted by a margin where one applies).
        alternative: ``two-sided``, or ``greater`` (H1: mean difference > 0).

    Returns:
        ``(...)`` p-values: 1.0 where every difference is 0 (or fewer than two queries); where every difference
        is the same nonzero value, 0.0 (or 1.0 for ``greater`` when it is negative).
    """
    from scipy import special

    d = np.asarray(differences, dtype=np.float64)
    n = d.shape[-1]
    if n < 2:
        return np.ones(d.shape[:-1])
    mean, sd = d.mean(axis=-1), d.std(axis=-1, ddof=1)
    with np.errstate(divide="ignore", invalid="ignore"):
        t = mean / (sd / np.sqrt(n))  # (...)
    p = 2 * special.stdtr(n - 1, -np.abs(t)) if alternative == "two-sided" else special.stdtr(n - 1, -t)
    p = np.where(sd == 0, np.where(mean == 0, 1.0, np.where((mean > 0) | (alternative == "two-sided"), 0.0, 1.0)), p)
    return np.where(np.all(np.abs(d) <= 1e-8, axis=-1), 1.0, p)  # np.isclose(d, 0.0), without its cost


# The paired tests by name, as tables and model cards print them.
TEST_NAMES = {"student": "paired Student's t-test", "wilcoxon": "Wilcoxon signed-rank test",
              "fisher": "Fisher's randomization test"}


def paired_p_value(x: np.ndarray, y: np.ndarray, test: str, alternative: Alternative = "two-sided",
                   margin: float = 0.0) -> float:
    """The p-value of a paired test between two systems' values on the same queries, in the same order.

    Args:
        x, y: ``(Q,)`` per-query values; fewer than two queries, or no difference at all, give 1.0.
        test: ``student``, ``wilcoxon`` or ``fisher``.
        alternative: ``two-sided`` (evaluation, the tables), or ``greater``, one-sided in the direction of a gain
            of ``x`` over ``y`` (the gate).
        margin: tests the differences ``x - y + margin`` (H0 for ``greater``: mean ``x - y <= -margin``, the
            non-inferiority hypothesis); 0 for every other use.
    """
    from scipy import stats

    d = np.asarray(x, dtype=np.float64) - np.asarray(y, dtype=np.float64) + margin  # (Q,)
    if len(d) < 2 or np.allclose(d, 0.0):
        return 1.0
    if test == "student":
        return float(student_p_values(d, alternative))
    if test == "wilcoxon":
        d = np.round(d, 12)  # equal differences rank as ties, whatever the rounding of x - y left in them
        if np.all(d == 0.0):
            return 1.0
        zeros = "wilcox" if alternative == "two-sided" else "pratt"
        return float(stats.wilcoxon(d, zero_method=zeros, alternative=alternative).pvalue)
    if test != "fisher":
        raise ValueError(f"unknown paired test {test!r}: expected student, wilcoxon or fisher")
    # Fisher's randomization test: the mean difference under random sign flips (scipy's paired permutations).
    result = stats.permutation_test((d,), np.mean, permutation_type="samples", n_resamples=9999,
                                    alternative=alternative, random_state=0)
    return float(result.pvalue)


def paired_tests(per_query: dict[str, dict[str, float]], baseline_values: dict[str, dict[str, float]],
                 baseline: str, test: str, alpha: float) -> dict:
    """Every metric of ``per_query`` (qid -> metric -> value) tested against the baseline's (two-sided), with the verdict.

    Returns:
        ``{"baseline", "test", "alpha", "p_values": {metric: p}, "significant": {metric: p < alpha}}``.
    """
    metrics = sorted(next(iter(per_query.values())).keys()) if per_query else []
    p = {m: paired_test({q: v[m] for q, v in per_query.items()}, {q: v[m] for q, v in baseline_values.items()}, test)
         for m in metrics}
    return {"baseline": baseline, "test": test, "alpha": alpha, "p_values": p,
            "significant": {m: v < alpha for m, v in p.items()}}
