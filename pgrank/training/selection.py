"""Which epoch becomes the policy, and when training stops: ``train.selection`` (beyond the paper).

The paper trains a fixed number of epochs and keeps the last (``rule: last``); its validation split
tunes hyperparameters. Policy-gradient fine-tuning can gain in domain while it loses out of domain, so
validation may include out-of-domain sets (``train.validation_sets``, e.g. ``nfcorpus/dev``), and the
policy can be the epoch that

* ``in_domain``: has the best in-domain validation nDCG@10, or
* ``guarded``: has the best in-domain validation nDCG@10 among the points that pass the out-of-domain guard
  on *every* out-of-domain set (an intersection: one failing set rejects the point) against epoch 0, the warm
  start, which always passes: when no other point does, the policy is the warm start, and the log and the
  summary (``accepted``: 0) say so. The guard (``guard``) is

  - ``margin``: the set's nDCG@10 is at most ``margin`` below the warm start's; or
  - ``noise``: the set loses no more than its own noise, measured per query. With ``d_q`` the point's nDCG@10 on
    query ``q`` minus the warm start's (paired: both rank the same queries), ``n`` the set's queries, ``mean(d)``
    and ``se = stdev(d) / sqrt(n)`` (the paired standard error), the point passes when
    ``mean(d) >= -noise_se * se``: a one-sided z-test of "no loss" (normal approximation) rejects it at level
    0.16 for ``noise_se: 1`` and 0.05 for 1.645. Each set is tested at that level on its own; since every set
    must pass, more sets reject more points under no loss (the error is toward the warm start, not away from
    it). A set of fewer than two queries passes when ``mean(d) >= 0``. The sets are validation splits (e.g.
    ``nfcorpus/dev``), never a test split that results report.

  A set may need no judgments at all: half documents (``data.sources.<name>.halves``,
  :mod:`pgrank.download.halves`) of a corpus the run already holds, whose queries are the first halves of its
  documents and whose one relevant document is a query's own second half. Guarded by ``noise``, such sets make the
  rule label-free against forgetting: a point may be chosen only if, on every corpus, it retrieves documents'
  second halves from their first halves no worse than the warm start, beyond the paired noise of the documents drawn
  (each query is one document, so the test is paired over documents). Its level under the skewed, tied per-query
  differences of such sets (most documents tied at rank 1, rare losses of a whole rank-1 document against frequent
  small gains, or the reverse) stays near the normal approximation's at 300 documents: 0.12 to 0.19 for
  ``noise_se: 1``, 0.02 to 0.08 for 1.645 (simulated in ``tests/training/test_selection_noise.py``).

Ties go to the earlier epoch, then to the larger alpha. With ``interpolation``, each trained epoch also has rows
of its weight-space mixtures with the warm start (``{"epoch": e, "alpha": a, ...}``,
:mod:`pgrank.training.weight_space`): the rule chooses among the rows whose alpha is listed (an epoch as trained
is alpha 1), so that the policy can be a mixture.

With ``within_se`` (the one-standard-error rule of model selection, Breiman et al., *Classification and
Regression Trees*, 1984, pointed at the warm start instead of at the simplest model), the policy is then the point
nearest the warm start on the path from it to the rule's choice (that epoch's mixtures, ``alpha`` from 0, the warm
start, to the choice's) whose in-domain validation nDCG@10 is within ``within_se`` standard errors of the
choice's. The error is the choice's over the validation queries (``standard_error: best``, the classic rule;
Hastie et al., *The Elements of Statistical Learning*, 7.10) or that of the per-query differences between the two
(``paired``: both rank the same queries, so the error is smaller and the policy farther from the warm start). A
move away from the warm start is kept only as far as validation shows it is worth it, whatever the set: fewer
validation queries mean larger errors and a policy nearer the warm start. The path's points are the current
epoch's whenever the choice changes, so the chosen weights always exist when they are chosen (the warm start's
are the run's anchor).

With ``patience``, training stops once that many epochs have passed without a newly selected one (early stopping
by the same rule). These are pure functions of the history rows the trainer records (``{"epoch": e, "val_ndcg@10": ...,
"val_<set>_ndcg@10": ...}``; with ``guard: noise`` or ``within_se`` also the per-query values,
:mod:`pgrank.core.history`).
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence

import numpy as np

from pgrank.config import SelectionConfig
from pgrank.core.history import DISTANCE, alpha, in_domain_key, per_query_key, per_query_set_key, set_key


def per_query_needed(cfg: SelectionConfig) -> bool:
    """Whether the history rows must hold per-query values (``within_se``, ``guard: noise``)."""
    return bool(cfg.within_se) or (cfg.rule == "guarded" and cfg.guard == "noise")


def paired_difference(row: dict, warm: dict, key: str) -> tuple[float, float, int]:
    """``(mean, standard error, n)`` of the per-query differences ``row - warm`` of the per-query values under
    ``key``, over the warm start's queries (standard error 0 for fewer than two queries)."""
    theirs, mine = warm[key], row[key]
    diffs = np.fromiter((mine[q] - theirs[q] for q in theirs), dtype=np.float64, count=len(theirs))
    if not len(diffs):
        return 0.0, 0.0, 0
    se = float(diffs.std(ddof=1)) / math.sqrt(len(diffs)) if len(diffs) > 1 else 0.0
    return float(diffs.mean()), se, len(diffs)


def passes(row: dict, warm: dict, name: str, cfg: SelectionConfig) -> bool:
    """Whether ``row`` passes the out-of-domain guard on the set ``name`` against the warm start's row."""
    if cfg.guard == "margin":
        return row[set_key(name)] >= warm[set_key(name)] - cfg.margin
    mean, se, _ = paired_difference(row, warm, per_query_set_key(name))
    return mean >= -cfg.noise_se * se


def failing(row: dict, warm: dict, sets: Sequence[str], cfg: SelectionConfig) -> list[str]:
    """The sets on which ``row`` fails the guard against the warm start's row (none under a rule other than
    ``guarded``, and none for the warm start itself)."""
    if cfg.rule != "guarded" or row is warm:
        return []
    return [s for s in sets if not passes(row, warm, s, cfg)]


def eligible(row: dict, warm: dict, sets: Sequence[str], cfg: SelectionConfig) -> bool:
    """Whether a row may be selected under ``cfg.rule`` (``warm``: epoch 0's row, which always may): under
    ``guarded``, it passes the guard on every out-of-domain set."""
    return not failing(row, warm, sets, cfg)


def accepted(history: Sequence[dict], sets: Sequence[str], cfg: SelectionConfig) -> list[dict]:
    """The rows the rule chooses among: the warm start, and the rows of listed alphas that are eligible."""
    warm, listed = history[0], set(cfg.interpolation)
    return [row for row in history
            if row is warm or (row["epoch"] != 0 and alpha(row) in listed and eligible(row, warm, sets, cfg))]


def best_in_domain(rows: Sequence[dict]) -> dict:
    """The row of the best in-domain validation nDCG@10; ties go to the earlier epoch, then to the larger alpha."""
    return max(rows, key=lambda row: (row[in_domain_key()], -row["epoch"], alpha(row)))


def held_back_by(history: Sequence[dict], sets: Sequence[str], cfg: SelectionConfig) -> list[str]:
    """The sets on which the guard rejects the point the rule would choose without it (the best in domain among
    the listed alphas): empty when the guard changes nothing."""
    warm, listed = history[0], set(cfg.interpolation)
    unguarded = best_in_domain([row for row in history if row is warm or alpha(row) in listed])
    return failing(unguarded, warm, sets, cfg)


def select_row(history: Sequence[dict], sets: Sequence[str], cfg: SelectionConfig) -> dict:
    """The history row the rule selects: an epoch as trained, or one of its mixtures with the warm start."""
    if not history:
        raise ValueError("no validated epoch to select from")
    plain = [row for row in history if alpha(row) == 1.0]
    if cfg.rule == "last":
        return plain[-1]
    warm = history[0]
    candidates = accepted(history, sets, cfg)
    best = best_in_domain(candidates)
    if not cfg.within_se:
        return best
    path = [row for row in candidates if row is warm or (row["epoch"] == best["epoch"] and alpha(row) <= alpha(best))]
    near = [row for row in path if within_errors(row, best, cfg.within_se, paired=cfg.standard_error == "paired")]
    return min(near, key=lambda row: 0.0 if row is warm else alpha(row))


def within_errors(row: dict, best: dict, k: float, *, paired: bool = False) -> bool:
    """Whether ``row``'s in-domain validation nDCG@10 is within ``k`` standard errors of ``best``'s, over the
    best's queries: the error of the best's mean, or with ``paired`` of the mean per-query difference (fewer than
    two queries: always)."""
    theirs = best[per_query_key()]
    mine = [row[per_query_key()][q] for q in theirs]
    diffs = [theirs[q] - m for q, m in zip(theirs, mine)]
    if len(diffs) < 2:
        return True
    spread = statistics.stdev(diffs) if paired else statistics.stdev(theirs.values())
    return statistics.mean(diffs) <= k * spread / math.sqrt(len(diffs))


def select_epoch(history: Sequence[dict], sets: Sequence[str], cfg: SelectionConfig) -> int:
    """The epoch of the row the rule selects (:func:`select_row`)."""
    return select_row(history, sets, cfg)["epoch"]


def should_stop(history: Sequence[dict], sets: Sequence[str], cfg: SelectionConfig) -> bool:
    """Early stopping: ``cfg.patience`` epochs have passed since the selected one."""
    if not cfg.patience or cfg.rule == "last" or not history:
        return False
    return history[-1]["epoch"] - select_epoch(history, sets, cfg) >= cfg.patience


def summary(history: Sequence[dict], sets: Sequence[str], cfg: SelectionConfig) -> dict[str, float | int | str]:
    """The choice and its figures (for MLflow): selected epoch, its in-domain and out-of-domain nDCG@10
    and their changes against the warm start."""
    row = select_row(history, sets, cfg)
    warm = history[0]
    out: dict[str, float | int | str] = {"rule": cfg.rule, "epoch": row["epoch"], "alpha": alpha(row)}
    if cfg.rule == "guarded":
        out["guard"] = cfg.guard
        out["accepted"] = len(accepted(history, sets, cfg)) - 1  # points beyond the warm start that pass the guard
    if DISTANCE in row:
        out[DISTANCE] = row[DISTANCE]
    for name, key in [("in_domain", in_domain_key()), *((s, set_key(s)) for s in sets)]:
        out[f"{name}_ndcg@10"] = row[key]
        out[f"{name}_gain"] = row[key] - warm[key]
        if name != "in_domain" and cfg.rule == "guarded" and cfg.guard == "noise":
            mean, se, _ = paired_difference(row, warm, per_query_set_key(name))
            out[f"{name}_paired_se"] = se
            out[f"{name}_paired_z"] = mean / se if se else 0.0  # passes at >= -noise_se
    return out
