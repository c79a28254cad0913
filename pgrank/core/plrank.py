"""PL-Rank-3: the gradient of a Plackett-Luce policy's expected ranking metric, from sampled rankings.

For a metric linear in the placed documents' gains, ``Delta(r) = sum_k theta_k g(r_k)`` (nDCG@K, DCG@K,
recall@K: :attr:`pgrank.core.ranking_utility.Utility.rank_gains`), the gradient of ``E_{r ~ PL(l)}[Delta(r)]``
with respect to the logits ``l`` is estimated from ``N`` sampled top-``K`` rankings by (per sample, with
``pi_k(d) = exp(l_d) / D_k`` the probability of placing ``d`` at place ``k`` after the sampled prefix,
``D_k`` the mass still unplaced there, and ``R_k = sum_{j >= k} theta_j g(r_j)`` the reward from ``k`` on)::

    grad_d = R_{rank(d) + 1}                                          (placement reward; 0 if not placed)
           + sum_{k <= min(rank(d), K - 1)} pi_k(d) (theta_k g(d) - R_k)  (direct reward minus risk)

averaged over the samples. It is unbiased: the expectation of the first term over the rankings is the sum
over places of the reward after ``d`` is placed, and the second term is the exact expectation, given the
prefix, of the score-function baseline of each place. Computing it costs ``O(N (n + K))`` after sampling,
like sampling itself: the sum over places factorises as ``exp(l_d - log D_k)`` times per-place sums that a
``K``-step recurrence over all rankings at once accumulates.

Numerics: the authors' code multiplies ``exp(l_d)`` by sums of ``1 / D_k`` in float64, which overflows or
underflows in float32 at a temperature of 0.05 (logits spread over tens of units). Here every exponential is
of a number ``<= 0``: with ``L_k = log D_k`` (from the exact placement log-probabilities,
:func:`pgrank.core.policy.placement_log_probs`) the placed document at ``k`` has ``pi_k = exp(log p_k)``, the
per-place sums are kept relative to ``D_k`` (``a_k = sum_{j <= k} theta_j D_k / D_j``, a recurrence with
factors ``D_{k+1} / D_k <= 1``), and an unplaced document's ``exp(l_d - L_{K-1}) <= 1``.

References:
    H. Oosterhuis, "Learning-to-Rank at the Speed of Sampling: Plackett-Luce Gradient Estimation With Minimal
    Computational Complexity", SIGIR 2022 (PL-Rank-3); the authors' NumPy code is ``PL_rank_3`` in
    ``algorithms/PLRank.py`` of HarrieO/2022-SIGIR-plackett-luce, of which this is a batched torch version.

Example:
    >>> logits = torch.randn(2, 20)
    >>> rankings = sample_rankings(logits, None, 100, k=10)
    >>> gains, theta = get_utility("ndcg@10").rank_gains(relevance, None)
    >>> w = plrank3_weights(logits, rankings, placement_log_probs(logits, rankings), gains, theta)
    >>> loss = -(logits_with_grad * w).sum(-1).mean()  # d loss / d logits = -w
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from pgrank.core.policy import rank_mask

# Elements of the (chunk, N, n) tensor of unplaced documents materialised at once (256 MiB in float32), as in
# pgrank.core.policy.sample_rankings.
_MAX_ELEMENTS = 1 << 26


def _exp_nonpos(z: Tensor) -> Tensor:
    """``exp(min(z, 0))`` with results below the smallest normal float raised to it: every use here adds terms
    into sums or products that are at most ``K`` times larger, and the CPU's vectorised ``exp`` slows ~100x on
    subnormal or zero results (see :func:`pgrank.core.policy._exp_nonpos`)."""
    return torch.exp(z.clamp(math.log(torch.finfo(z.dtype).tiny) + 1.0, 0.0))


def _relative_sums(x: Tensor, decay: Tensor) -> Tensor:
    """``s_k = sum_{j <= k} x_j D_k / D_j`` along the last axis, given ``decay_k = D_{k+1} / D_k``: ``s_0 = x_0``,
    ``s_k = s_{k-1} decay_{k-1} + x_k``. ``x (..., K)``, ``decay (..., K - 1)``; a ``K``-step loop over all rows."""
    out = x.movedim(-1, 0).clone()  # (K, ...)
    rows, steps = out.unbind(0), decay.movedim(-1, 0).unbind(0)
    for k in range(1, len(rows)):
        rows[k].addcmul_(rows[k - 1], steps[k - 1])
    return out.movedim(0, -1)


def plrank3_weights(
    logits: Tensor,
    rankings: Tensor,
    step_log_probs: Tensor,
    gains: Tensor,
    theta: Tensor,
    mask: Tensor | None = None,
) -> Tensor:
    """The PL-Rank-3 estimate of ``d E[Delta] / d logits``, averaged over the sampled rankings, ``(B, n)``.

    Args:
        logits: ``(B, n)`` policy logits (read, not differentiated).
        rankings: ``(B, N, K)`` top-``K`` rankings sampled from ``PL(logits)`` (:func:`~pgrank.core.policy.sample_rankings`).
        step_log_probs: ``(B, N, K)`` their placement log-probabilities
            (:func:`~pgrank.core.policy.placement_log_probs`), 0 at places beyond a query's real candidates.
        gains: ``(B, n)`` each document's gain ``g(d) >= 0``, 0 at padded slots.
        theta: ``(>= K,)`` each place's weight ``theta_k >= 0`` (the first ``K`` are used).
        mask: ``(B, n)`` bool, ``True`` for real candidates (``None``: all real).

    Returns:
        ``(B, n)`` per-document weights, 0 at padded slots; ``-(logits * weights.detach()).sum()`` is a
        surrogate whose gradient is the negated estimate.
    """
    with torch.no_grad():
        B, N, K = rankings.shape
        n = logits.shape[-1]
        dtype = step_log_probs.dtype
        lg = logits.detach().to(dtype)
        valid = rank_mask(mask, rankings)  # (B, 1, K) places holding real candidates
        flat = rankings.reshape(B, N * K)
        placed_logit = torch.gather(lg, 1, flat).view(B, N, K)
        log_denom = torch.where(valid, placed_logit - step_log_probs, placed_logit.new_zeros(()))  # (B, N, K) L_k
        th = theta[:K].to(dtype)
        gains_d = gains.to(dtype)
        placed_gain = torch.gather(gains_d, 1, flat).view(B, N, K) * valid
        reward = placed_gain * th  # (B, N, K) theta_k g(r_k)
        to_go = reward.flip(-1).cumsum(-1).flip(-1)  # (B, N, K) R_k, the reward from place k on
        decay = _exp_nonpos(log_denom[..., 1:] - log_denom[..., :-1])  # (B, N, K - 1) D_{k+1} / D_k
        sums = _relative_sums(torch.stack([th.expand(B, N, K), to_go]), decay)  # (2, B, N, K): a_k, b_k
        a, b = sums.unbind(0)

        # the placed documents: placement reward R_{k+1} plus pi_k (theta-weighted direct reward a_k g - risk b_k)
        placed = (to_go - reward) + _exp_nonpos(step_log_probs) * (placed_gain * a - b)
        weights = torch.zeros(B, n, dtype=dtype, device=lg.device)
        weights.scatter_add_(1, flat, (placed * valid).view(B, N * K))

        # the never-placed real documents: exp(l_d - L_last) (g(d) a_last - b_last), summed over the samples
        if mask is None:
            last = torch.full((B, 1, 1), K - 1, device=lg.device)
        else:
            last = (mask.sum(-1).clamp(1, K) - 1).view(B, 1, 1)
        last = last.expand(B, N, 1)
        log_last = log_denom.gather(-1, last)  # (B, N, 1)
        ab = torch.cat([a.gather(-1, last), b.gather(-1, last)], dim=-1)  # (B, N, 2)
        real_lg = lg if mask is None else lg.masked_fill(~mask, -math.inf)
        floor = math.log(torch.finfo(dtype).tiny) + 1.0  # see _exp_nonpos; the placed and padded end there, not at 0
        chunk = max(1, _MAX_ELEMENTS // max(1, N * n))
        for b0 in range(0, B, chunk):  # a loop over query chunks only, to bound memory
            sl = slice(b0, b0 + chunk)
            ratio = real_lg[sl].unsqueeze(1) - log_last[sl]  # (c, N, n) log pi_{K-1}(d) where d is unplaced
            ratio.scatter_(-1, rankings[sl], -math.inf)  # the placed documents
            ratio.clamp_(floor, 0.0).exp_()
            with torch.autocast(lg.device.type, enabled=False):  # in the working dtype, never narrowed
                per_doc = torch.bmm(ratio.transpose(1, 2), ab[sl])  # (c, n, 2) sums over the samples
            weights[sl] += gains_d[sl] * per_doc[..., 0] - per_doc[..., 1]
        if mask is not None:
            weights.masked_fill_(~mask, 0.0)
        return weights / N
