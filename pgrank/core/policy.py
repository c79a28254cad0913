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

import functools
import math
from collections.abc import Sequence

import torch
from torch import Tensor
from torch.autograd.function import once_differentiable

# Elements of the (chunk, N, n) Gumbel tensor materialised at once (256 MiB in float32).
_MAX_GUMBEL_ELEMENTS = 1 << 26
# Up to this many places, the placements' denominators run as K-step recurrences with a hand-written gradient
# (:class:`_PlacementLogProbs`); beyond it (full rankings) as torch's logcumsumexp under autograd.
_RECURRENCE_MAX_K = 32


def _checked_mask(logits: Tensor, mask: Tensor | None) -> Tensor | None:
    """``mask`` as bool, or ``None`` (all real): the hot paths skip every masking op then."""
    if mask is None:
        return None
    if mask.shape != logits.shape:
        raise ValueError(f"mask shape {tuple(mask.shape)} != logits shape {tuple(logits.shape)}")
    return mask.bool()


def _exp_nonpos(z: Tensor) -> Tensor:
    """``exp(z)``, for ``z`` at most a few units above 0, where results below ~3e-38 (3e-308 in float64) are as good as 0.

    The arguments are first raised to ``1 + log`` of the smallest normal float: the CPU's vectorised ``exp`` falls
    back to a scalar path ~100x slower wherever its result is subnormal or zero (wide logits, padding). Every use
    here adds the results into a sum that holds a term ``>= 1`` (a shifted log-sum-exp) or is a softmax's, so the
    raised terms change nothing at float precision; their gradient, through the clamp, is 0 instead of subnormal.
    """
    return torch.exp(z.clamp_min(math.log(torch.finfo(z.dtype).tiny) + 1.0))


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
    mask = _checked_mask(logits, mask)
    B, n = logits.shape
    K = n if k is None else max(1, min(int(k), n))
    per_query = isinstance(generator, (list, tuple))
    if per_query and len(generator) != B:
        raise ValueError(f"got {len(generator)} generators for {B} queries")
    with torch.no_grad():
        lg = logits.detach().to(_work_dtype(logits))
        if mask is not None:
            lg = lg.masked_fill(~mask, float("-inf"))
        tiny = torch.finfo(lg.dtype).tiny
        chunk = max(1, _MAX_GUMBEL_ELEMENTS // max(1, num_samples * n))
        out = None if chunk >= B else torch.empty(B, num_samples, K, dtype=torch.long, device=logits.device)
        for b0 in range(0, B, chunk):  # a loop over query chunks only, to bound memory
            sub = lg[b0 : b0 + chunk].unsqueeze(1)  # (c, 1, n)
            # Gumbel(0,1) = -log(-log U). A uniform draw and two logs run ~5x faster than torch's
            # CPU exponential_ (bench/estimator.py); U starts at the smallest normal float, never 0.
            noise = torch.empty(sub.shape[0], num_samples, n, dtype=lg.dtype, device=lg.device)
            if per_query:  # each query's uniforms from its own generator, the very numbers it draws alone
                for i, row in enumerate(noise):
                    row.uniform_(tiny, 1.0, generator=generator[b0 + i])
            else:
                noise.uniform_(tiny, 1.0, generator=generator)
            noise.log_().neg_().log_().neg_()  # Gumbel noise
            noise.add_(sub)  # (c, N, n) perturbed logits
            top = noise.argsort(dim=-1, descending=True) if K == n else noise.topk(K, dim=-1, sorted=True).indices
            if out is None:  # one chunk holds every query
                return top
            out[b0 : b0 + chunk] = top
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
    return _valid_places(mask, K)


def _valid_places(mask: Tensor, K: int) -> Tensor:
    """``(B, 1, K)`` bool, place < number of real candidates of each query."""
    places = torch.arange(K, device=mask.device)
    return places.view(1, 1, K) < mask.sum(-1).view(-1, 1, 1)


def _denominators(x: Tensor, rest: Tensor) -> tuple[Tensor, Tensor]:
    """Place-major ``xs = [x_0, ..., x_{K-1}, rest]`` and ``ys_k = log sum_{j >= k} exp(xs_j)``, both ``(K + 1, B, N)``.

    ``x (B, N, K)`` are the placed logits and ``rest (B, N)`` the log-mass of the never-placed candidates, so ``ys_k``
    is the denominator of place ``k``. One place at a time over all rankings at once (torch's ``logcumsumexp`` runs
    a scalar ``log1p(exp(.))`` per element on CPU): ``top_k = max_{j >= k} xs_j`` and ``s_k = sum_{j >= k}
    exp(xs_j - top_k) = exp(xs_k - top_k) + exp(top_{k+1} - top_k) s_{k+1}``, then ``ys = top + log s`` (``s >= 1``).
    """
    K = x.shape[-1]
    xs = torch.cat([x, rest.unsqueeze(-1)], dim=-1).movedim(-1, 0).contiguous()  # (K + 1, B, N)
    top = xs.clone()
    top_rows = top.unbind(0)
    for k in range(K - 1, -1, -1):
        torch.maximum(top_rows[k], top_rows[k + 1], out=top_rows[k])
    mass = _exp_nonpos(xs - top)  # exp(xs_k - top_k), then s_k in place
    steps = _exp_nonpos(top[1:] - top[:-1])  # exp(top_{k+1} - top_k)
    rows, step_rows = mass.unbind(0), steps.unbind(0)
    for k in range(K - 1, -1, -1):
        rows[k].addcmul_(rows[k + 1], step_rows[k])
    return xs, mass.log_().add_(top)


def _denominators_backward(xs: Tensor, ys: Tensor, grad: Tensor) -> tuple[Tensor, Tensor]:
    """Given ``dL/d log p (B, N, K)`` for ``log p_k = xs_k - ys_k``: ``dL/dx (K, B, N)`` and ``dL/d rest (B, N)``.

    ``dL/dxs_j = g_j - sum_{k <= j} g_k exp(xs_j - ys_k) = g_j - exp(xs_j - ys_j) S_j`` with ``S_0 = g_0`` and
    ``S_j = g_j + exp(ys_j - ys_{j-1}) S_{j-1}`` (``g_K = 0``): every factor is the ``exp`` of a number ``<= 0``.
    """
    g = grad.movedim(-1, 0)
    acc = torch.cat([g, torch.zeros_like(g[:1])])  # (K + 1, B, N) becomes S in place
    decay = torch.exp(ys[1:] - ys[:-1])  # exp(ys_j - ys_{j-1})
    rows, steps = acc.unbind(0), decay.unbind(0)
    for j in range(1, len(rows)):
        rows[j].addcmul_(rows[j - 1], steps[j - 1])
    soft = torch.exp(xs - ys).mul_(acc)
    return g - soft[:-1], soft[-1].neg_()


@functools.lru_cache(maxsize=64)
def _head_tables(K1: int, width: int, device: torch.device) -> tuple[Tensor, Tensor]:
    """Constants: the head positions ``0..K1-1`` and the ``(K1, width)`` mask ``j < i`` (built once per shape and
    device, never written to)."""
    with torch.inference_mode(False), torch.no_grad():
        ar = torch.arange(K1, device=device)
        return ar, torch.arange(width, device=device) < ar.unsqueeze(-1)


def _first_free(pos: Tensor, K1: int) -> Tensor:
    """``(B, N)``: the smallest head position in ``0..K1`` that no place of ``pos (B, N, K)`` holds (positions are
    distinct below ``K1``; ``K1`` stands for the tail and ``K1 + 1`` for no position). It is ``<= K``: ``K``
    places cannot hold ``K + 1`` head positions, and with no tail (``K1 = n``) it is at most ``n``."""
    if K1 + 2 < 63:  # the taken positions as bits of an int64: the lowest clear bit, isolated, is 2**mex
        bits = (torch.ones((), dtype=torch.long, device=pos.device) << pos).sum(-1)  # carries reach bits > K1 only
        lowest_clear = (~bits & (bits + 1)).float()  # exact: a power of two below 2**63
        return (lowest_clear.view(torch.int32) >> 23) - 127  # its float32 exponent
    taken = torch.zeros(*pos.shape[:-1], K1 + 2, dtype=torch.uint8, device=pos.device).scatter_(-1, pos, 1)
    return taken[..., : K1 + 1].argmin(-1)  # the first 0 (there is one: see above)


def placement_log_probs(logits: Tensor, rankings: Tensor, mask: Tensor | None = None) -> Tensor:
    """Exact log-probability of each placement, ``log pi(r_k | q, r_{1:k-1})`` (paper Eq. 3).

    At place ``k`` the remaining set is "everything not yet placed". For a partial ranking of the
    top ``K`` it splits into the placed-later items ``r_k..r_K`` (a reverse cumulative
    log-sum-exp over ``K`` values) and the never-placed rest. The rest's log-sum-exp is computed
    without any cancellation-prone ``total - cumsum``: the rest's maximum is the first item in sorted
    order that is not placed (the "mex" of the placed sorted positions), always among the first
    ``K + 1``, so only those are sorted (a top-``K + 1`` per query) and the others enter as one
    log-sum-exp; the rest's mass relative to its maximum is a suffix sum of that sorted head and tail
    minus at most ``K`` terms each ``<= 1``. Relative error is therefore bounded by ``(K + 1) * eps``
    for any logits, ``+-1e4`` included. Cost: ``O(n)`` per query plus ``O(N * K)`` per sample; never
    ``O(N * n)``.

    Up to :data:`_RECURRENCE_MAX_K` places the gradient is written by hand (:class:`_PlacementLogProbs`): one
    autograd node instead of some fifty small ones.

    Args:
        logits: ``(B, n)`` policy logits (differentiable).
        rankings: ``(B, N, K)`` candidate indices, e.g. from :func:`sample_rankings`; a query's real candidates
            come before its padded slots (as in every ranking of positive probability).
        mask: ``(B, n)`` bool, ``True`` for real candidates.

    Returns:
        ``(B, N, K)`` log-probabilities; ``0`` at places beyond a query's number of real candidates.
    """
    mask = _checked_mask(logits, mask)
    dtype = _work_dtype(logits)
    # A finite stand-in for -inf keeps every gradient finite; exp(fill - anything real) == 0.
    fill = torch.finfo(dtype).min / 8
    safe = logits.to(dtype)
    if mask is not None:
        safe = torch.where(mask, safe, fill)
    K = rankings.shape[-1]
    if K <= _RECURRENCE_MAX_K:
        logp = _PlacementLogProbs.apply(safe, rankings, mask, fill)
    else:  # long (full) rankings: autograd through torch's logcumsumexp, vectorised over places
        logp = _placement_parts(safe, rankings, mask, fill, recurrence=False)[0]
    return logp if mask is None else logp * _valid_places(mask, K)


def _placement_parts(safe: Tensor, rankings: Tensor, mask: Tensor | None, fill: float, recurrence: bool):
    """:func:`placement_log_probs` from the masked logits ``safe (B, n)``: ``(log p (B, N, K), saved)``.

    ``recurrence``: the denominators by :func:`_denominators` (no autograd; ``saved`` holds what
    :class:`_PlacementLogProbs` differentiates by hand), else by torch's ``logcumsumexp`` (``saved`` is None).
    """
    B, n = safe.shape
    K = rankings.shape[-1]
    placed = _gather(safe, rankings)  # (B, N, K); fill at padded slots

    # --- the never-placed rest, without cancellation -------------------------------------------
    K1 = min(K + 1, n)
    head_vals, head_idx = safe.topk(K1, dim=-1)  # (B, K1) the first K1 logits in sorted order
    sorted_head, tail_mass, tail_sum = head_vals, None, None
    if K1 < n:  # the tail after them as one log-sum-exp (the head set to fill), shifted by its max
        rest = safe.scatter(-1, head_idx, fill)
        shift = rest.detach().amax(-1, keepdim=True)  # (B, 1); the gradient is the softmax without it
        tail_mass = _exp_nonpos(rest - shift)  # (B, n)
        tail_sum = tail_mass.sum(-1, keepdim=True)
        sorted_head = torch.cat([head_vals, shift + tail_sum.log()], dim=-1)  # (B, K1 + 1); tail <= head + log(n)
    # the mass of sorted[i:] relative to head_i, sum_{j >= i} exp(sorted_j - head_i): K1 x (K1 + 1) terms per query
    gap = sorted_head.unsqueeze(1) - head_vals.unsqueeze(-1)  # (B, K1, K1 + 1), <= log(n) where j >= i
    ar, before = _head_tables(K1, sorted_head.shape[-1], safe.device)
    ratios = _exp_nonpos(gap.masked_fill(before, -math.inf))  # exp(sorted_j - head_i), j >= i
    suffix_mass = ratios.sum(-1)  # (B, K1) sum over sorted[i:] of exp(. - head_i), >= 1
    sorted_pos = torch.full((B, n), K1, dtype=torch.long, device=safe.device)  # K1: somewhere in the tail
    sorted_pos.scatter_(-1, head_idx, ar.expand(B, K1))
    if mask is not None:
        sorted_pos.masked_fill_(~mask, K1 + 1)  # padded slots hold no position
    pos = _gather(sorted_pos, rankings)  # (B, N, K) sorted position of each placed item (head only)
    mex = _first_free(pos, K1)  # (B, N): sorted position of the rest's max
    rest_empty = mex >= (n if mask is None else mask.sum(-1, keepdim=True))  # (B, N)
    mex_c = mex.long().clamp_(max=K1 - 1)
    top_rest = torch.gather(head_vals, 1, mex_c)  # (B, N)
    head = torch.gather(suffix_mass, 1, mex_c)  # (B, N) everything from the rest's max on, relative to it
    later = pos > mex.unsqueeze(-1)  # placed items sorted after the rest's max (padded ones add exp(fill) ~ 0)
    # (their logits are <= top_rest; clamping the others keeps exp finite for the backward pass)
    leaving = _exp_nonpos((placed - top_rest.unsqueeze(-1)).clamp_max(0)) * later  # (B, N, K)
    rest_mass = (head - leaving.sum(-1)).clamp_min(1.0)  # >= 1: the rest holds its own maximum
    rest_lse = torch.where(rest_empty, fill, top_rest + rest_mass.log())  # (B, N)

    if not recurrence:
        seq = torch.cat([placed, rest_lse.unsqueeze(-1)], dim=-1)
        return placed - torch.logcumsumexp(seq.flip(-1), dim=-1).flip(-1)[..., :-1], None
    xs, ys = _denominators(placed, rest_lse)
    logp = (xs[:K] - ys[:K]).movedim(0, -1).contiguous()
    return logp, (xs, ys, head_idx, ratios, mex_c, rest_empty, rest_mass, leaving, tail_mass, tail_sum)


class _PlacementLogProbs(torch.autograd.Function):
    """:func:`_placement_parts` with its gradient by hand, for rankings of at most :data:`_RECURRENCE_MAX_K` places.

    With ``g = dL/d log p``: the placed logits get ``g`` minus their share of every denominator they sit in
    (:func:`_denominators_backward`), which also gives ``T = dL/d rest_lse``. The rest's log-mass
    ``R = log sum_{j in rest} exp(l_j)`` has ``dR/dl_j = exp(l_j - R)`` on the rest, so with
    ``w = T exp(top_rest - R) = T / rest_mass`` (``|w| <= |T|``): every candidate at or after the rest's maximum in
    sorted order gets ``w exp(l_j - top_rest)``, collected per sorted head position ``p`` as
    ``sum_{m <= p} W_m exp(head_p - head_m)`` (``W_m``: the ``w`` of the samples whose rest's maximum sits at ``m``;
    the tail as one entry, shared out by its softmax), and the placed candidates after it give theirs back
    (``leaving``). Every factor is ``<= 1`` (times ``n`` for the tail).
    """

    @staticmethod
    def forward(ctx, safe: Tensor, rankings: Tensor, mask: Tensor | None, fill: float) -> Tensor:
        logp, saved = _placement_parts(safe, rankings, mask, fill, recurrence=True)
        ctx.save_for_backward(rankings, *saved)
        return logp

    @staticmethod
    @once_differentiable
    def backward(ctx, grad: Tensor):
        rankings, xs, ys, head_idx, ratios, mex_c, rest_empty, rest_mass, leaving, tail_mass, tail_sum = ctx.saved_tensors
        B, N, K = rankings.shape
        K1 = head_idx.shape[-1]
        g_placed, g_rest = _denominators_backward(xs, ys, grad)  # (K, B, N), (B, N)
        w = torch.where(rest_empty, 0.0, g_rest / rest_mass)  # (B, N)
        g_placed = g_placed.movedim(0, -1).contiguous().sub_(leaving * w.unsqueeze(-1))  # (B, N, K)
        out = torch.zeros_like(tail_mass if tail_mass is not None else ratios[:, 0])  # (B, n)
        out.scatter_add_(1, rankings.reshape(B, N * K), g_placed.view(B, N * K))
        per_max = torch.zeros_like(ratios[:, :, 0]).scatter_add_(1, mex_c, w)  # (B, K1) the W_m
        sorted_grad = (per_max.unsqueeze(-1) * ratios).sum(1)  # (B, K1 [+ 1]); not bmm, which autocast would narrow
        out.scatter_add_(1, head_idx, sorted_grad[:, :K1])
        if tail_mass is not None:
            out.addcmul_(tail_mass, sorted_grad[:, K1:] / tail_sum)
        return out, None, None, None


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


def _top1_log_probs(logits: Tensor, mask: Tensor | None) -> Tensor:
    """``log softmax(logits)`` over the real candidates, in the working dtype; finite at padded slots."""
    lg = logits.to(_work_dtype(logits))
    if mask is not None:
        lg = torch.where(mask, lg, torch.finfo(lg.dtype).min / 8)
    return torch.log_softmax(lg, dim=-1)


def _sum_real(terms: Tensor, mask: Tensor | None) -> Tensor:
    return (terms if mask is None else torch.where(mask, terms, 0.0)).sum(-1)


def top1_entropy(logits: Tensor, mask: Tensor | None = None) -> Tensor:
    """Exact entropy of the first-place distribution ``softmax(logits)`` over real candidates, ``(B,)``."""
    mask = _checked_mask(logits, mask)
    logp = _top1_log_probs(logits, mask)
    # p >= ~1e-38 (see _exp_nonpos): the terms of candidates that far down add < 1e-30 to the sum, and padded
    # slots, where logp is finite (no NaN gradients), are left out of it
    p = _exp_nonpos(logp)
    return -_sum_real(p * logp, mask)


def top1_kl(logits: Tensor, reference_logits: Tensor, mask: Tensor | None = None) -> Tensor:
    """Exact ``KL(softmax(logits) || softmax(reference_logits))`` of the first-place distributions, ``(B,)``.

    Over the real candidates only; differentiable in ``logits`` (the reference is a constant).
    """
    mask = _checked_mask(logits, mask)
    logp = _top1_log_probs(logits, mask)
    logq = _top1_log_probs(reference_logits.detach().to(logp.dtype), mask)
    return _sum_real(_exp_nonpos(logp) * (logp - logq), mask)
