"""A test of the mean of bounded per-query differences by betting (pure: numbers in, e-values out).

The champion gate asks whether the mean per-query difference ``d`` (challenger minus baseline) of ``champion.metric``
exceeds ``-m`` (``m`` the non-inferiority margin, 0 for superiority). Every per-query nDCG, MRR or recall difference
lies in ``[-1, 1]``. For bounded values a test exists whose level holds at every sample size and every level, with no
symmetry and no normal approximation: a gambler bets against H0 "mean <= -m" one query after another, staking a
fraction ``lambda_t >= 0`` of the wealth on ``d_t + m``:

    K_t = prod_{i <= t} (1 + lambda_i (d_i + m)),   K_0 = 1,

with each ``lambda_i`` chosen from the queries before it (predictable) and small enough that a factor stays positive
(``lambda_i <= c / (1 - m)``, since ``d_i + m >= -(1 - m)``). Under H0, whatever the distribution of the ``d_i``
(skewed, tied, any shape on ``[-1, 1]``), as long as each has conditional mean at most ``-m`` given the queries before
it (independent draws of a fixed gate set in a fixed order do), ``K`` is a nonnegative supermartingale with
``K_0 = 1``: ``E[K_tau] <= 1`` at every stopping time (an e-value) and ``P(sup_t K_t >= 1 / alpha) <= alpha``
(Ville's inequality). Nothing else is assumed.

The bets are Waudby-Smith and Ramdas's predictable plug-in (the "PrPl" bets of their hedged-capital
interval, one-sided, tuned for a fixed sample size ``n``), in units of ``d``:

    mu_t     = (0 + sum_{i <= t} d_i) / (t + 1)                       (a prior mean 0, one pseudo-observation)
    sigma2_t = (1 + sum_{i <= t} (d_i - mu_i)^2) / (t + 1)            (a prior variance 1: the largest on [-1, 1])
    lambda_t = min( sqrt(2 log(1 / a) / (n sigma2_{t-1})), c / (1 - m) )

with ``n`` the number of gate queries and ``a`` the level the bets are tuned for (the decision's pre-registered
allocation). Tuning for ``n`` and ``a`` makes ``log K_n`` near ``n mu^2 / (2 sigma^2)`` when the true mean is ``mu``,
the growth of the best constant bet, so the test adapts to the variance: its detectable gain is about
``sqrt(2 log(1 / a)) / (z_a + z_0.8)`` times the t-test's (``1.18`` at ``a = 0.001``), where the t-test holds at all.

:func:`p_values` returns ``p = min(1, 1 / max_t K_t)``, a p-value at every level by Ville's inequality
(``P(p <= a) <= a`` for every fixed ``a``), which the familywise rules of :mod:`pgrank.core.error_budget` compare
with their levels. :func:`e_values` returns the wealth stopped the first time it reaches ``1 / a`` (``K_{tau ^ n}``,
``E <= 1`` by optional stopping), the e-value e-LOND needs: it rejects at a level ``alpha_i >= a`` when
``e >= 1 / alpha_i``. At ``alpha_i = a`` both say the same: the wealth reached ``1 / a``.

References:
    Waudby-Smith, I. and Ramdas, A. (2024). Estimating means of bounded random variables by betting. Journal of the
    Royal Statistical Society Series B 86(1), 1-27.
    Ville, J. (1939). Etude critique de la notion de collectif. Gauthier-Villars.

Example:
    >>> d = np.full(400, 0.05)                      # every query gains 0.05: certain
    >>> float(e_values(d, tune=0.001)) >= 1000      # the wealth reached 1 / 0.001
    True
    >>> float(p_values(-d, tune=0.001))             # every query loses: the wealth only shrinks
    1.0
"""

from __future__ import annotations

import math

import numpy as np

TRUNCATION = 0.9  # c: a bet never stakes more than 90% of the wealth on the worst case d = -1 (any c < 1 is valid)
PRIOR_MEAN, PRIOR_VARIANCE = 0.0, 1.0  # one pseudo-observation: mean 0, the largest variance on [-1, 1]


def bets(differences: np.ndarray, *, tune: float, margin: float = 0.0, gate_size: int | None = None) -> np.ndarray:
    """The predictable plug-in bets ``lambda_t`` (module docstring): ``(..., Q)`` differences -> ``(..., Q)`` bets.

    Args:
        differences: per-query differences in ``[-1, 1]`` (challenger minus baseline), in the gate's order.
        tune: the level ``a`` the bets are tuned for, in (0, 1).
        margin: ``m`` in ``[0, 1)``: H0 is "mean <= -m".
        gate_size: ``n`` of the tuning (default: ``Q``).
    """
    d = np.asarray(differences, dtype=np.float64)
    q = d.shape[-1]
    n = gate_size or q
    t = np.arange(1, q + 1, dtype=np.float64)  # (Q,)
    mu = (PRIOR_MEAN + np.cumsum(d, axis=-1)) / (t + 1)  # (..., Q) mu_t, after query t
    sigma2 = (PRIOR_VARIANCE + np.cumsum((d - mu) ** 2, axis=-1)) / (t + 1)  # (..., Q) sigma2_t
    before = np.concatenate([np.full(d.shape[:-1] + (1,), PRIOR_VARIANCE), sigma2[..., :-1]], axis=-1)  # sigma2_{t-1}
    raw = np.sqrt(2 * math.log(1 / tune) / (n * before))
    return np.minimum(raw, TRUNCATION / (1 - margin))


def wealth(differences: np.ndarray, *, tune: float, margin: float = 0.0) -> np.ndarray:
    """``log K_t`` for t = 1..Q: ``(..., Q)`` differences -> ``(..., Q)`` log-wealth of the bets against "mean <= -m"."""
    d = np.asarray(differences, dtype=np.float64)
    return np.cumsum(np.log1p(bets(d, tune=tune, margin=margin) * (d + margin)), axis=-1)


def e_values(differences: np.ndarray, *, tune: float, margin: float = 0.0) -> np.ndarray:
    """The e-value of H0 "mean difference <= -margin": the wealth stopped when it first reaches ``1 / tune``.

    Args:
        differences: ``(..., Q)`` per-query differences in ``[-1, 1]``, in the gate's order.
        tune: the level the bets are tuned for and the stopping threshold ``1 / tune`` (the decision's
            pre-registered allocation, e.g. ``budget / horizon``).
        margin: the non-inferiority margin ``m`` in ``[0, 1)`` (0: superiority).

    Returns:
        ``(...)`` e-values ``K_{tau ^ Q} >= 0``; 1.0 with no queries.

    Raises:
        ValueError: a difference outside ``[-1, 1]``, a margin outside ``[0, 1)`` or ``tune`` outside (0, 1).
    """
    d = np.asarray(differences, dtype=np.float64)
    if not 0 < tune < 1:
        raise ValueError(f"the betting test's level must lie in (0, 1), got {tune!r}")
    if not 0 <= margin < 1:
        raise ValueError(f"the betting test's margin must lie in [0, 1), got {margin!r}")
    if d.size and (np.abs(d) > 1 + 1e-12).any():
        raise ValueError(f"the betting test needs differences in [-1, 1]; got one of {float(np.abs(d).max()):.6g}")
    if d.shape[-1] == 0:
        return np.ones(d.shape[:-1])
    log_k = wealth(np.clip(d, -1.0, 1.0), tune=tune, margin=margin)  # (..., Q)
    threshold = math.log(1 / tune)
    reached = log_k >= threshold
    first = np.argmax(reached, axis=-1)  # (...) the first query at which the wealth reached 1 / tune
    stopped = np.take_along_axis(log_k, first[..., None], axis=-1)[..., 0]
    return np.exp(np.where(reached.any(axis=-1), stopped, log_k[..., -1]))


def evidence(differences: np.ndarray, *, tune: float, margin: float = 0.0) -> tuple[np.ndarray, np.ndarray]:
    """``(p_values(...), e_values(...))`` of the same differences, from one pass of the wealth (the Monte Carlo)."""
    d = np.asarray(differences, dtype=np.float64)
    if d.shape[-1] == 0:
        return p_values(d, tune=tune, margin=margin), e_values(d, tune=tune, margin=margin)
    e_values(d[..., :0], tune=tune, margin=margin)  # the checks of the arguments
    if (np.abs(d) > 1 + 1e-12).any():
        raise ValueError(f"the betting test needs differences in [-1, 1]; got one of {float(np.abs(d).max()):.6g}")
    log_k = wealth(np.clip(d, -1.0, 1.0), tune=tune, margin=margin)  # (..., Q)
    reached = log_k >= math.log(1 / tune)
    stopped = np.take_along_axis(log_k, np.argmax(reached, axis=-1)[..., None], axis=-1)[..., 0]
    e = np.exp(np.where(reached.any(axis=-1), stopped, log_k[..., -1]))
    return np.minimum(1.0, np.exp(-np.maximum(log_k.max(axis=-1), 0.0))), e


def p_values(differences: np.ndarray, *, tune: float, margin: float = 0.0) -> np.ndarray:
    """``min(1, 1 / max_t K_t)``: a p-value at every level (``P(p <= a) <= a`` under H0, Ville's inequality), with
    the bets of :func:`e_values` (same arguments); 1.0 with no queries."""
    d = np.asarray(differences, dtype=np.float64)
    e_values(d[..., :0], tune=tune, margin=margin)  # the same checks of the arguments
    if d.size and (np.abs(d) > 1 + 1e-12).any():
        raise ValueError(f"the betting test needs differences in [-1, 1]; got one of {float(np.abs(d).max()):.6g}")
    if d.shape[-1] == 0:
        return np.ones(d.shape[:-1])
    top = wealth(np.clip(d, -1.0, 1.0), tune=tune, margin=margin).max(axis=-1)  # (...) log max_t K_t
    return np.minimum(1.0, np.exp(-np.maximum(top, 0.0)))
