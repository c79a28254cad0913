"""Paired significance of a policy against its warm start, query by query (the paper reports none).

``evaluate.significance.test``: ``student`` (paired t-test), ``wilcoxon`` (signed-rank) or ``fisher``
(randomization test, 9999 resamples). Queries are paired by id; only queries both systems answer
count.
"""

from __future__ import annotations

import json
import logging

import numpy as np

from pgrank.config import SignificanceConfig

log = logging.getLogger(__name__)


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


def against_baseline(per_query: dict[str, dict[str, float]], baseline_file, baseline: str,
                     cfg: SignificanceConfig) -> dict | None:
    """Every metric of ``per_query`` tested against the baseline's ``per_query.json``.

    Returns ``None`` (with a warning) when the baseline has not been evaluated.
    """
    if not baseline_file.is_file():
        log.warning("%s: no results of the warm start %r; run it first for a significance test", baseline_file, baseline)
        return None
    other = json.loads(baseline_file.read_text(encoding="utf-8"))
    metrics = sorted(next(iter(per_query.values())).keys()) if per_query else []
    p = {m: paired_test({q: v[m] for q, v in per_query.items()}, {q: v[m] for q, v in other.items()}, cfg.test)
         for m in metrics}
    return {"baseline": baseline, "test": cfg.test, "alpha": cfg.alpha, "p_values": p,
            "significant": {m: v < cfg.alpha for m, v in p.items()}}
