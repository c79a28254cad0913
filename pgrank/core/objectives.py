"""Training objectives on a candidate set: Neural PG-Rank and the losses everyone already uses.

Every objective is a pure tensor function of ``(scores, relevance, mask)`` with the same temperature
handling as the policy gradient (logits ``= scores / T``), returning an :class:`ObjectiveOutput` whose
``loss`` is minimised. They see exactly the same candidate sets (the mined hard negatives), so that
``train.objective`` changes the loss and nothing else (paper comparison: issue "Does policy gradient
beat standard fine-tuning?"):

* ``pg`` — Neural PG-Rank (:func:`pgrank.core.estimators.policy_gradient`, Eq. 8/9).
* ``infonce`` — contrastive InfoNCE / MultipleNegativesRanking over the mined negatives: each relevant
  candidate against all non-relevant candidates of its query, ``-log e^{l_p} / (e^{l_p} + sum_neg e^{l_n})``,
  averaged over the query's relevant candidates (the multiple-positives form; grades > 0 are positives).
* ``listnet`` — ListNet's top-one softmax cross-entropy against graded relevance: the target first-place
  distribution is ``rel / sum(rel)`` (the linear normalisation of TF-Ranking's softmax loss, so that
  non-relevant candidates get no target mass).
* ``listmle`` — ListMLE: the negative Plackett-Luce log-likelihood of the relevance-sorted ranking of
  the whole candidate set, ties broken uniformly at random (seeded, per query).
* ``listmle_topk`` — top-k ListMLE (Xia et al., 2009): the same likelihood of the top places only, those of
  the query's relevant candidates (by grade, ties random): the order among the non-relevant ones, most of a
  candidate set and all tied, is not asked for.
* ``lambdaloss`` — LambdaLoss with the NDCG-Loss2++ weighting (Wang et al., 2018), the scheme the paper
  found strongest: ``-sum_{i,j: y_i > y_j} w_ij log2 sigmoid(l_i - l_j)`` over pairs of the current
  ranking, with trec_eval's linear gains ``rel / IDCG`` (the evaluation metric's).

Why not sentence-transformers' own losses: its ``MultipleNegativesRankingLoss`` takes (anchor,
positive, negatives) triplets with in-batch negatives, and its ListNet/ListMLE/LambdaLoss are
CrossEncoder losses that encode (query, document) pairs inside ``forward``; neither takes a padded
candidate set of a bi-encoder with a mask, nor GradCache-chunked document encoding. The LambdaLoss
weighting is the same arithmetic as its ``NDCGLoss2PPScheme`` (checked in the tests).

Example:
    >>> out = OBJECTIVES["listnet"](scores, relevance, mask, temperature=0.05)
    >>> out.loss.backward()
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import NamedTuple

import torch
from torch import Tensor

from pgrank.core.policy import log_prob, placement_log_probs, top1_entropy

# A finite stand-in for -inf on padded slots: exp() of it is 0 and gradients stay finite.
_FILL = -1e9


class ObjectiveOutput(NamedTuple):
    """What one objective call computes; only ``loss`` carries gradient."""

    loss: Tensor  # scalar, minimised
    utility: Tensor  # scalar: nDCG@10 of the candidates sorted by score (PG-Rank: of its sampled rankings)
    entropy: Tensor  # scalar: mean entropy of the first-place distribution softmax(scores / T)
    kl: Tensor  # scalar: KL to the reference policy (PG-Rank only; 0 here)


def _checked(scores: Tensor, relevance: Tensor, mask: Tensor | None, temperature: float) -> tuple[Tensor, Tensor, Tensor]:
    if scores.dim() != 2 or relevance.shape != scores.shape:
        raise ValueError(f"scores and relevance must both be (B, n); got {tuple(scores.shape)} and {tuple(relevance.shape)}")
    if temperature <= 0:
        raise ValueError(f"temperature must be > 0, got {temperature}")
    mask = torch.ones_like(scores, dtype=torch.bool) if mask is None else mask.bool()
    dtype = torch.float64 if scores.dtype == torch.float64 else torch.float32
    logits = torch.where(mask, scores.to(dtype) / temperature, torch.full((), _FILL, dtype=dtype, device=scores.device))
    rel = torch.where(mask, relevance.to(dtype), torch.zeros((), dtype=dtype, device=scores.device)).clamp_min(0)
    return logits, rel, mask


def _diagnostics(loss: Tensor, logits: Tensor, rel: Tensor, mask: Tensor) -> ObjectiveOutput:
    """The loss with the deterministic (sorted) ranking's nDCG@10 and the first-place entropy."""
    from pgrank.core.ranking_utility import get_utility

    with torch.no_grad():
        order = logits.argsort(dim=-1, descending=True)[:, None, :10]  # (B, 1, K)
        ndcg = get_utility("ndcg@10").whole(order, rel, mask).mean()
        entropy = top1_entropy(logits, mask).mean()
    return ObjectiveOutput(loss, ndcg, entropy, torch.zeros((), dtype=loss.dtype, device=loss.device))


def _mean_over_queries(per_query: Tensor, has_positive: Tensor) -> Tensor:
    """Mean over the queries that have a relevant candidate (the others carry no signal)."""
    count = has_positive.sum()
    return torch.where(count > 0, (per_query * has_positive).sum() / count.clamp_min(1), per_query.sum() * 0)


def infonce(scores: Tensor, relevance: Tensor, mask: Tensor | None = None, *, temperature: float = 1.0,
            **_: object) -> ObjectiveOutput:
    """InfoNCE with every relevant candidate as a positive and the non-relevant ones as negatives."""
    logits, rel, mask = _checked(scores, relevance, mask, temperature)
    positive = (rel > 0) & mask  # (B, n)
    negative = ~positive & mask
    neg_lse = torch.logsumexp(torch.where(negative, logits, torch.full_like(logits, _FILL)), dim=-1, keepdim=True)  # (B, 1)
    per_pair = torch.logaddexp(logits, neg_lse) - logits  # (B, n): -log softmax of each candidate vs the negatives
    count = positive.sum(-1)
    per_query = torch.where(positive, per_pair, torch.zeros_like(per_pair)).sum(-1) / count.clamp_min(1)
    return _diagnostics(_mean_over_queries(per_query, count > 0), logits, rel, mask)


def listnet(scores: Tensor, relevance: Tensor, mask: Tensor | None = None, *, temperature: float = 1.0,
            **_: object) -> ObjectiveOutput:
    """Top-one cross-entropy ``-sum_i t_i log softmax(l)_i`` with ``t = rel / sum(rel)``."""
    logits, rel, mask = _checked(scores, relevance, mask, temperature)
    total = rel.sum(-1, keepdim=True)
    target = rel / total.clamp_min(torch.finfo(rel.dtype).tiny)
    per_query = -(target * torch.log_softmax(logits, dim=-1)).sum(-1)
    return _diagnostics(_mean_over_queries(per_query, total[:, 0] > 0), logits, rel, mask)


def ideal_rankings(relevance: Tensor, mask: Tensor, generator: torch.Generator | Sequence[torch.Generator] | None) -> Tensor:
    """``(B, 1, n)`` candidates sorted by grade, descending, ties in a uniformly random order; padding last."""
    B, n = relevance.shape
    if isinstance(generator, (list, tuple)):
        noise = torch.stack([torch.rand(n, generator=g, device=relevance.device, dtype=relevance.dtype) for g in generator])
    else:
        noise = torch.rand(B, n, generator=generator, device=relevance.device, dtype=relevance.dtype)
    key = torch.where(mask, relevance * 2.0 + noise, torch.full_like(relevance, -1.0))  # grades are integers: noise < 1
    return key.argsort(dim=-1, descending=True)[:, None, :]


def listmle(scores: Tensor, relevance: Tensor, mask: Tensor | None = None, *, temperature: float = 1.0,
            generator: torch.Generator | Sequence[torch.Generator] | None = None, **_: object) -> ObjectiveOutput:
    """``-log PL(ideal ranking | logits)`` over the whole candidate set, per query, averaged."""
    logits, rel, mask = _checked(scores, relevance, mask, temperature)
    ideal = ideal_rankings(rel, mask, generator)
    per_query = -log_prob(logits, ideal, mask)[:, 0]  # padded places contribute 0
    return _diagnostics(_mean_over_queries(per_query, (rel > 0).any(-1)), logits, rel, mask)


def listmle_topk(scores: Tensor, relevance: Tensor, mask: Tensor | None = None, *, temperature: float = 1.0,
                 generator: torch.Generator | Sequence[torch.Generator] | None = None, **_: object) -> ObjectiveOutput:
    """``-log PL(the relevant candidates in the top places, by grade | logits)``: the first ``k`` places of the ideal
    ranking, ``k`` the query's number of relevant candidates, per query, averaged."""
    logits, rel, mask = _checked(scores, relevance, mask, temperature)
    relevant = (rel > 0) & mask
    k = relevant.sum(-1)  # (B,)
    depth = max(int(k.max()), 1)
    ideal = ideal_rankings(rel, mask, generator)[:, :, :depth]  # (B, 1, K) the relevant ones first
    places = placement_log_probs(logits, ideal, mask)[:, 0]  # (B, K)
    inside = torch.arange(depth, device=logits.device)[None, :] < k[:, None]
    per_query = -torch.where(inside, places, torch.zeros_like(places)).sum(-1)
    return _diagnostics(_mean_over_queries(per_query, k > 0), logits, rel, mask)


def lambda_weights(gain: Tensor, n: int) -> Tensor:
    """NDCG-Loss2++ pair weights ``mu * delta_ij |G_i - G_j| + |1/D_i - 1/D_j| |G_i - G_j|`` (mu = 10).

    ``gain``: ``(B, n)`` normalised gains in the current ranking's order. ``delta_ij = |1/D(|i-j|) -
    1/D(|i-j|+1)|`` with ``D(p) = log2(1 + p)`` (Wang et al., 2018, Eq. 13 and the "++" mixture).
    """
    positions = torch.arange(1, n + 2, device=gain.device, dtype=gain.dtype)
    inv_discount = 1.0 / torch.log2(1.0 + positions)  # 1/D(p), p = 1..n+1
    gap = (torch.arange(n, device=gain.device)[:, None] - torch.arange(n, device=gain.device)[None, :]).abs()
    delta = (inv_discount[(gap - 1).clamp_min(0)] - inv_discount[gap]).abs()
    delta.fill_diagonal_(0)
    gain_gap = (gain[:, :, None] - gain[:, None, :]).abs()
    rank_gap = (inv_discount[:n][:, None] - inv_discount[:n][None, :]).abs()
    return 10.0 * delta[None] * gain_gap + rank_gap[None] * gain_gap


def lambdaloss(scores: Tensor, relevance: Tensor, mask: Tensor | None = None, *, temperature: float = 1.0,
               **_: object) -> ObjectiveOutput:
    """LambdaLoss, NDCG-Loss2++ (see the module docstring); pairs in the current sorted ranking."""
    logits, rel, mask = _checked(scores, relevance, mask, temperature)
    B, n = logits.shape
    sorted_logits, order = logits.sort(dim=-1, descending=True)  # (B, n) the current ranking
    sorted_rel = rel.gather(1, order)
    sorted_mask = mask.gather(1, order)
    ideal = rel.sort(dim=-1, descending=True).values
    discount = torch.log2(torch.arange(2, n + 2, device=rel.device, dtype=rel.dtype))
    idcg = (ideal / discount).sum(-1, keepdim=True)  # linear gains over the whole set
    gain = sorted_rel / idcg.clamp_min(torch.finfo(rel.dtype).tiny)
    weights = lambda_weights(gain, n).detach()
    pairs = (sorted_rel[:, :, None] > sorted_rel[:, None, :]) & sorted_mask[:, :, None] & sorted_mask[:, None, :]
    log2_sigmoid = torch.nn.functional.logsigmoid(sorted_logits[:, :, None] - sorted_logits[:, None, :]) / math.log(2)
    per_query = -torch.where(pairs, weights * log2_sigmoid, torch.zeros_like(log2_sigmoid)).sum((-1, -2))
    return _diagnostics(_mean_over_queries(per_query, pairs.flatten(1).any(-1)), logits, rel, mask)


def _pg(scores: Tensor, relevance: Tensor, mask: Tensor | None = None, **kwargs) -> ObjectiveOutput:
    from pgrank.core.estimators import policy_gradient

    out = policy_gradient(scores, relevance, mask, **kwargs)
    return ObjectiveOutput(out.loss, out.utility, out.entropy, out.kl)


# One dict for dispatch by name (train.objective).
OBJECTIVES: dict[str, Callable[..., ObjectiveOutput]] = {
    "pg": _pg,
    "infonce": infonce,
    "listnet": listnet,
    "listmle": listmle,
    "listmle_topk": listmle_topk,
    "lambdaloss": lambdaloss,
}

__all__ = ["OBJECTIVES", "ObjectiveOutput", "ideal_rankings", "infonce", "lambda_weights", "lambdaloss", "listmle",
           "listmle_topk", "listnet"]
