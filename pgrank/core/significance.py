"""Paired significance tests over per-query values (pure: numbers in, a p-value out).

Used by evaluation (a policy against its warm start), the tables (each objective against PG-Rank) and
the promotion gate (challenger against champion). Queries are paired by id; only queries both
systems answer count.
"""

from __future__ import annotations

import numpy as np


def paired_test(a: dict[str, float], b: dict[str, float], test: str) -> float:
    """Two-sided p-value of a paired test between per-query values of two systems (same queries)."""
    from scipy import stats

    qids = sorted(set(a) & set(b))
    x, y = np.array([a[q] for q in qids]), np.array([b[q] for q in qids])
    if len(qids) < 2 or np.allclose(x, y):
        return 1.0
    if test == "student":
        return float(stats.ttest_rel(x, y).pvalue)
    if test == "wilcoxon":
        return float(stats.wilcoxon(x, y).pvalue)
    result = stats.permutation_test((x, y), lambda u, v: np.mean(u - v), permutation_type="samples",
                                    n_resamples=9999, random_state=0)  # Fisher's randomization test
    return float(result.pvalue)
