"""Paired significance of a policy against its warm start, query by query (the paper reports none).

``evaluate.significance.test``: ``student`` (paired t-test), ``wilcoxon`` (signed-rank) or ``fisher``
(randomization test, 9999 resamples). Queries are paired by id; only queries both systems answer
count.
"""

from __future__ import annotations

import json
import logging

from pgrank.config import SignificanceConfig
from pgrank.core.significance import paired_test

log = logging.getLogger(__name__)


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
