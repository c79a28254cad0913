"""The Plackett-Luce ranking policy (paper Eq. 3): sampling and exact log-probabilities.

Everything here is a pure function of tensors: batched over queries ``B``, with candidate sets padded
to ``n`` and a boolean ``mask`` (``True`` = real candidate). Padded slots are never sampled and never
receive gradient. Shapes: logits ``(B, n)``, rankings ``(B, N, K)`` (``N`` samples of the top ``K``).

The policy's logits are ``scores / temperature`` (see :func:`pgrank.core.estimators.policy_gradient`);
these functions take logits so that sampling and log-probabilities see the very same policy.

References:
    Plackett (1975), Luce (1959); Gumbel-max sampling of rankings: Kool et al. (2019),
    "Stochastic Beams and Where to Find Them"; cumulative-sum log-probabilities: Oosterhuis (2021),
    "Computationally Efficient Optimization of Plackett-Luce Ranking Models".
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor

# Elements of the (chunk, N, n) Gumbel tensor materialised at once (256 MiB in float32).
_MAX_GUMBEL_ELEMENTS = 1 << 26


def _full_mask(logits: Tensor, mask: Tensor | None) -> Tensor:
    if mask is None:
        return torch.ones_like(logits, dtype=torch.bool)
    if mask.shape != logits.shape:
        raise ValueError(f"mask shape {tuple(mask.shape)} != logits shape {tuple(logits.shape)}")
    return mask.bool()


def _work_dtype(t: Tensor) -> torch.dtype:
    # bf16/fp16 logits (autocast) are too coarse for log-probabilities of 1000-way softmaxes.
    return t.dtype if t.dtype in (torch.float32, torch.float64) else torch.float32


def sample_rankings(
    logits: Tensor,
    mask: Tensor | None = None,
    num_samples: int = 1,
    *,
    k: int | None = None,
    generator: torch.Generator | Sequence[torch.Generator] | None = None,
) -> Tensor:
    """Draw ``num_samples`` rankings per query from PL(logits) with the Gumbel-max trick.

    Adding i.i.d. Gumbel(0, 1) noise to the logits and sorting gives an exact PL sample; taking only
    the top ``k`` gives an exact sample of the ranking's first ``k`` places. Cost: ``O(N * n)`` noise
    plus a top-``k`` per sample. Sampling is not differentiated (rankings are discrete).

    Args:
        logits: ``(B, n)`` policy logits.
        mask: ``(B, n)`` bool, ``True`` for real candidates. ``None`` means all real.
        num_samples: ``N``, rankings per query.
        k: number of leading places to draw (``None`` or ``>= n``: the full ranking).
        generator: torch RNG for reproducible draws (must live on ``logits.device``), or one
            generator per query: then each query's rankings depend only on its own generator, not
            on which other queries share the batch (data-parallel shards sample what one process
            would).

    Returns:
        ``(B, N, K)`` long tensor of candidate indices, ``K = min(k, n)``. For a query with fewer than
        ``K`` real candidates, places beyond its count hold padded slots and must be ignored (see
        :func:`rank_mask`).

    Example:
        >>> r = sample_rankings(torch.tensor([[2.0, 0.0, -1.0]]), num_samples=4, k=2)
        >>> r.shape
        torch.Size([1, 4, 2])
    """
    if logits.dim() != 2:
        raise ValueError(f"logits must be (B, n), got shape {tuple(logits.shape)}")
    if num_samples < 1:
        raise ValueError(f"num_samples must be >= 1, got {num_samples}")
    mask = _full_mask(logits, mask)
    B, n = logits.shape
    K = n if k is None else max(1, min(int(k), n))
    with torch.no_grad():
        lg = logits.detach().to(_work_dtype(logits)).masked_fill(~mask, float("-inf"))
        out = torch.empty(B, num_samples, K, dtype=torch.long, device=logits.device)
        per_query = isinstance(generator, (list, tuple))
        if per_query and len(generator) != B:
            raise ValueError(f"got {len(generator)} generators for {B} queries")
        chunk = 1 if per_query else max(1, _MAX_GUMBEL_ELEMENTS // max(1, num_samples * n))
        for b0 in range(0, B, chunk):  # a loop over query chunks only, to bound memory
            sub = lg[b0 : b0 + chunk].unsqueeze(1)  # (c, 1, n)
            # Gumbel(0,1) = -log(-log U). A uniform draw and two logs run ~5x faster than torch's
            # CPU exponential_ (bench/estimator.py); U starts at the smallest normal float, never 0.
            noise = torch.empty(sub.shape[0], num_samples, n, dtype=lg.dtype, device=lg.device)
            noise.uniform_(torch.finfo(lg.dtype).tiny, 1.0, generator=generator[b0] if per_query else generator)
            noise.log_().neg_().log_().neg_()  # Gumbel noise
            noise.add_(sub)  # (c, N, n) perturbed logits
            if K == n:
                out[b0 : b0 + chunk] = noise.argsort(dim=-1, descending=True)
            else:
                out[b0 : b0 + chunk] = noise.topk(K, dim=-1, sorted=True).indices
    return out


def _gather(values: Tensor, rankings: Tensor) -> Tensor:
    """``values[b, rankings[b, i, k]]`` as ``(B, N, K)``; gathers from the flat ``(B, n)`` tensor, so
    the backward scatters into ``(B, n)`` rather than a broadcast ``(B, N, n)``."""
    B, N, K = rankings.shape
    return torch.gather(values, 1, rankings.reshape(B, N * K)).reshape(B, N, K)


def rank_mask(mask: Tensor | None, rankings: Tensor) -> Tensor:
    """``(B, 1, K)`` bool: which places of ``rankings`` hold real candidates (place < #real)."""
    B, _, K = rankings.shape
    if mask is None:
        return torch.ones(B, 1, K, dtype=torch.bool, device=rankings.device)
    n_valid = mask.sum(-1)  # (B,)
    places = torch.arange(K, device=rankings.device)
    return (places.view(1, 1, K) < n_valid.view(B, 1, 1))


def placement_log_probs(logits: Tensor, rankings: Tensor, mask: Tensor | None = None) -> Tensor:
    """Exact log-probability of each placement, ``log pi(r_k | q, r_{1:k-1})`` (paper Eq. 3).

    At place ``k`` the remaining set is "everything not yet placed". For a partial ranking of the
    top ``K`` it splits into the placed-later items ``r_k..r_K`` (a reverse cumulative
    log-sum-exp over ``K`` values) and the never-placed rest. The rest's log-sum-exp is computed
    without any cancellation-prone ``total - cumsum``: the logits are sorted once per query, the
    rest's maximum is the first sorted item that is not placed (the "mex" of the placed sorted
    positions, among the first ``K + 1``), and the rest's mass relative to that maximum is a
    precomputed suffix sum minus at most ``K`` terms each ``<= 1``. Relative error is therefore
    bounded by ``(K + 1) * eps`` for any logits, ``+-1e4`` included. Cost: ``O(n log n)`` per query
    plus ``O(N * K log K)`` per sample; never ``O(N * n)``.

    Args:
        logits: ``(B, n)`` policy logits (differentiable).
        rankings: ``(B, N, K)`` candidate indices, e.g. from :func:`sample_rankings`.
        mask: ``(B, n)`` bool, ``True`` for real candidates.

    Returns:
        ``(B, N, K)`` log-probabilities; ``0`` at places beyond a query's number of real candidates.
    """
    mask = _full_mask(logits, mask)
    dtype = _work_dtype(logits)
    B, n = logits.shape
    _, N, K = rankings.shape
    # A finite stand-in for -inf keeps every gradient finite; exp(fill - anything real) == 0.
    fill = torch.finfo(dtype).min / 8
    safe = torch.where(mask, logits.to(dtype), torch.full((), fill, dtype=dtype, device=logits.device))
    valid = rank_mask(mask, rankings)  # (B, 1, K)

    placed = _gather(safe, rankings)  # (B, N, K)
    placed = torch.where(valid, placed, torch.full((), fill, dtype=dtype, device=placed.device))
    placed_later = torch.logcumsumexp(placed.flip(-1), dim=-1).flip(-1)  # (B, N, K) LSE of r_k..r_K

    # --- the never-placed rest, without cancellation -------------------------------------------
    sorted_vals, order = safe.sort(dim=-1, descending=True)  # (B, n)
    suffix = torch.logcumsumexp(sorted_vals.flip(-1), dim=-1).flip(-1)  # (B, n) LSE of sorted[i:]
    sorted_pos = torch.empty_like(order).scatter_(-1, order, torch.arange(n, device=order.device).expand(B, n))
    pos = _gather(sorted_pos, rankings)  # (B, N, K)
    pos = torch.where(valid, pos, torch.full((), n + K, dtype=pos.dtype, device=pos.device))
    pos_sorted = pos.sort(dim=-1).values
    ar = torch.arange(K, device=pos.device)
    mex = (pos_sorted == ar).long().cumprod(-1).sum(-1)  # (B, N): sorted position of the rest's max
    n_valid = mask.sum(-1, keepdim=True)  # (B, 1)
    rest_empty = mex >= n_valid  # (B, N)
    mex_c = mex.clamp(max=n - 1)
    top_rest = torch.gather(sorted_vals, 1, mex_c)  # (B, N)
    head = torch.exp(torch.gather(suffix, 1, mex_c) - top_rest)  # (B, N), >= 1
    later = valid & (pos > mex.unsqueeze(-1))  # placed items sorted after the rest's max
    # (their logits are <= top_rest; clamping the others keeps exp finite for the backward pass)
    placed_mass = torch.where(later, torch.exp((placed - top_rest.unsqueeze(-1)).clamp_max(0)), torch.zeros((), dtype=dtype, device=placed.device))
    rest_mass = (head - placed_mass.sum(-1)).clamp_min(torch.finfo(dtype).tiny)
    rest_lse = torch.where(rest_empty, torch.full((), fill, dtype=dtype, device=placed.device), top_rest + rest_mass.log())

    denom = torch.logaddexp(rest_lse.unsqueeze(-1), placed_later)  # (B, N, K)
    return torch.where(valid, placed - denom, torch.zeros((), dtype=dtype, device=placed.device))


def log_prob(logits: Tensor, rankings: Tensor, mask: Tensor | None = None) -> Tensor:
    """Exact log-probability ``log pi(r | q)`` of each (partial) ranking, ``(B, N)``.

    For a top-``K`` prefix this is the marginal probability of that prefix under the full PL
    distribution (the product of the first ``K`` factors of Eq. 3).

    Example:
        >>> lg = torch.tensor([[1.0, 0.0]])
        >>> log_prob(lg, torch.tensor([[[0, 1]]])).exp()  # e / (e + 1)
        tensor([[0.7311]])
    """
    return placement_log_probs(logits, rankings, mask).sum(-1)


def top1_entropy(logits: Tensor, mask: Tensor | None = None) -> Tensor:
    """Exact entropy of the first-place distribution ``softmax(logits)`` over real candidates, ``(B,)``."""
    mask = _full_mask(logits, mask)
    dtype = _work_dtype(logits)
    fill = torch.full((), torch.finfo(dtype).min / 8, dtype=dtype, device=logits.device)
    logp = torch.log_softmax(torch.where(mask, logits.to(dtype), fill), dim=-1)
    p = logp.exp()  # exactly 0 at padded slots, and logp stays finite there: no NaN gradients
    return -torch.where(mask, p * logp, torch.zeros((), dtype=dtype, device=p.device)).sum(-1)


def top1_kl(logits: Tensor, reference_logits: Tensor, mask: Tensor | None = None) -> Tensor:
    """Exact ``KL(softmax(logits) || softmax(reference_logits))`` of the first-place distributions, ``(B,)``.

    Over the real candidates only; differentiable in ``logits`` (the reference is a constant).
    """
    mask = _full_mask(logits, mask)
    dtype = _work_dtype(logits)
    fill = torch.full((), torch.finfo(dtype).min / 8, dtype=dtype, device=logits.device)
    logp = torch.log_softmax(torch.where(mask, logits.to(dtype), fill), dim=-1)
    logq = torch.log_softmax(torch.where(mask, reference_logits.detach().to(dtype), fill), dim=-1)
    terms = logp.exp() * (logp - logq)
    return torch.where(mask, terms, torch.zeros((), dtype=dtype, device=terms.device)).sum(-1)
