"""Paired significance tests over per-query values (pure: numbers in, p-values out).

Used by evaluation (a policy against its warm start, :func:`paired_tests`; the paper reports none),
the tables (each objective against PG-Rank) and the promotion gate (challenger against champion). The
test is ``student`` (paired t-test), ``wilcoxon`` (signed-rank) or ``fisher`` (randomization test, 9999
resamples). Queries are paired by id; only queries both systems answer count.
"""

from __future__ import annotations

import numpy as np


def paired_test(a: dict[str, float], b: dict[str, float], test: str) -> float:
    """Two-sided p-value of a paired test between per-query values of two systems (same queries)."""
    qids = sorted(set(a) & set(b))
    return paired_p_value(np.array([a[q] for q in qids]), np.array([b[q] for q in qids]), test)


def paired_p_value(x: np.ndarray, y: np.ndarray, test: str) -> float:
    """Two-sided p-value of a paired test between two systems' values on the same queries, in the same order.

    Args:
        x, y: ``(Q,)`` per-query values; fewer than two queries, or equal values, give 1.0.
        test: ``student``, ``wilcoxon`` or ``fisher``.
    """
    from scipy import special, stats

    if len(x) < 2 or np.allclose(x, y):
        return 1.0
    if test == "student":  # the paired t-test (scipy.stats.ttest_rel), computed directly: the gate's Monte Carlo runs it 10^4 times
        d = np.asarray(x, dtype=np.float64) - np.asarray(y, dtype=np.float64)
        sd = float(d.std(ddof=1))
        if sd == 0.0:
            return 0.0  # the same nonzero difference on every query
        t = float(d.mean()) / (sd / np.sqrt(len(d)))
        return float(2 * special.stdtr(len(d) - 1, -abs(t)))
    if test == "wilcoxon":
        return float(stats.wilcoxon(x, y).pvalue)
    result = stats.permutation_test((x, y), lambda u, v: np.mean(u - v), permutation_type="samples",
                                    n_resamples=9999, random_state=0)  # Fisher's randomization test
    return float(result.pvalue)


def paired_tests(per_query: dict[str, dict[str, float]], baseline_values: dict[str, dict[str, float]],
                 baseline: str, test: str, alpha: float) -> dict:
    """Every metric of ``per_query`` (qid -> metric -> value) tested against the baseline's, with the verdict.

    Returns:
        ``{"baseline", "test", "alpha", "p_values": {metric: p}, "significant": {metric: p < alpha}}``.
    """
    metrics = sorted(next(iter(per_query.values())).keys()) if per_query else []
    p = {m: paired_test({q: v[m] for q, v in per_query.items()}, {q: v[m] for q, v in baseline_values.items()}, test)
         for m in metrics}
    return {"baseline": baseline, "test": test, "alpha": alpha, "p_values": p,
            "significant": {m: v < alpha for m, v in p.items()}}
