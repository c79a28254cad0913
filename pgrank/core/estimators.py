"""Policy-gradient estimators for Plackett-Luce ranking policies (paper Eq. 5, 8 and 9).

All estimators are pure tensor functions, vectorised over queries ``B`` and samples ``N`` (no Python
loop over samples; the placements' denominators are a ``K``-step recurrence over all rankings at
once). Each returns a *surrogate loss* whose gradient with respect to the scores is the negative of
the policy-gradient estimate, so ``loss.backward()`` followed by an optimizer step ascends the
expected utility::

    loss = -(advantage.detach() * log_prob).mean()

Estimators:
    * ``"whole"`` — REINFORCE over whole (top-K) rankings, Eq. 8: each sample's log-probability is
      weighted by its utility, minus (``baseline="loo"``) the mean utility of the other ``N-1``
      samples (Kool et al., 2019).
    * ``"per_rank"`` — per-rank credit, Eq. 9 (Oosterhuis, 2021): the log-probability of each
      placement ``k`` is weighted by that sample's reward-to-go from ``k``, minus the mean reward-to-go
      from ``k`` of the other ``N-1`` samples. Unbiased for any prefix-decomposable utility because a
      placement cannot influence the utility collected before it.
    * ``"plrank3"`` — PL-Rank-3 (Oosterhuis, SIGIR 2022; :mod:`pgrank.core.plrank`), not in the paper: from
      the same sampled rankings, per-document weights whose mean is unbiased for the gradient of the expected
      utility, with every document's probability of each place after the sampled prefix taken exactly
      rather than sampled. For utilities linear in the placed documents' gains (nDCG@K, DCG@K, recall@K).
      The surrogate is ``-(logits * weights.detach()).sum(-1)``, averaged over queries like the others. The
      ranking entropy and ranking KL below are not of that form: their gradients are ``per_rank``'s
      score-function estimate of those terms alone, added to it.

Entropy regularisation (coefficient ``entropy_coef``; the paper's table gives 0.01 without saying which
entropy, see PAPER.md):
    * ``"top1"`` — exact entropy of the first-place distribution ``softmax(scores / T)``.
    * ``"ranking"`` — entropy of the sampled top-K ranking, ``-E[log pi(r)]``, estimated by the same
      score-function estimator (its reward is ``-log pi(r)``, per placement for ``per_rank``).

Reference-policy regularisation (not in the paper; coefficient ``kl_coef``, default 0): a penalty
``kl_coef * KL(pi || pi_ref)`` toward the Plackett-Luce policy of ``reference_scores`` (the frozen warm
start over the same candidates, with the same temperature), the recipe of RL fine-tuning of language
models, so that in-domain gains cost less out of domain:
    * ``"top1"`` — exact KL between the first-place distributions ``softmax(s / T)`` and ``softmax(s_ref / T)``;
    * ``"ranking"`` — KL between the two Plackett-Luce distributions over top-K rankings, estimated from
      the rankings already sampled for the policy gradient (no extra sampling): the value is the mean of
      ``log pi(r) - log pi_ref(r)``, and its gradient the score-function estimate with that reward,
      negated (per placement for ``per_rank``: ``log pi`` and ``log pi_ref`` both decompose over placements).

Example:
    >>> scores = torch.randn(2, 20, requires_grad=True)
    >>> relevance = (torch.rand(2, 20) > 0.8).float()
    >>> loss = pg_loss(scores, relevance, num_samples=16, temperature=1.0)
    >>> loss.backward()
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Literal, NamedTuple

import torch
from torch import Tensor

from pgrank.core.plrank import plrank3_weights
from pgrank.core.policy import (
    placement_log_probs,
    sample_rankings,
    top1_entropy,
    top1_kl,
)
from pgrank.core.ranking_utility import Utility, get_utility

Estimator = Literal["per_rank", "whole", "plrank3"]


class PGOutput(NamedTuple):
    """What one estimator call computes; only ``loss`` carries gradient."""

    loss: Tensor  # scalar surrogate loss
    utility: Tensor  # scalar: mean utility of the sampled rankings
    entropy: Tensor  # scalar: mean entropy of the chosen kind (top1 exact, or sampled-ranking estimate)
    kl: Tensor  # scalar: mean KL to the reference policy of the chosen kind (0 without reference scores)


def _leave_one_out(x: Tensor) -> Tensor:
    """``x_i - mean_{j != i} x_j`` along dim 1 (the sample axis)."""
    N = x.shape[1]
    return x - (x.sum(1, keepdim=True) - x) / (N - 1)


class _Samples(NamedTuple):
    """The sampled rankings of one call and what every estimator reads of them."""

    logits: Tensor  # (B, n) scores / T, differentiable
    rel: Tensor  # (B, n) grades
    mask: Tensor | None  # (B, n)
    rankings: Tensor  # (B, N, K)
    step_logp: Tensor  # (B, N, K) placement log-probabilities, differentiable
    util: Utility
    baseline: str
    entropy_coef: float  # of the ranking entropy (0 with the exact top-1 entropy)
    kl_coef: float
    ranking_kl: Tensor | None  # (B, N, K) log pi - log pi_ref per placement, when the ranking KL is asked for


def _penalised(reward: Tensor, s: _Samples, per_place: bool) -> Tensor:
    """``reward`` minus the ranking entropy's and ranking KL's sampled terms, per placement or per ranking."""
    total = (lambda t: t) if per_place else (lambda t: t.sum(-1))
    if s.entropy_coef:
        reward = reward - s.entropy_coef * total(s.step_logp.detach())
    if s.ranking_kl is not None and s.kl_coef:
        reward = reward - s.kl_coef * total(s.ranking_kl)
    return reward


def _per_rank_objective(contrib: Tensor, s: _Samples) -> Tensor:
    """``(B, N)`` Eq. 9's surrogate for per-placement rewards ``contrib (B, N, K)``: reward-to-go, then baseline."""
    reward = contrib.flip(-1).cumsum(-1).flip(-1)  # (B, N, K) reward-to-go from each place
    advantage = _leave_one_out(reward) if s.baseline == "loo" else reward
    return (advantage.detach() * s.step_logp).sum(-1)


def _per_rank(s: _Samples) -> tuple[Tensor, Tensor]:
    contrib = s.util.per_rank(s.rankings, s.rel, s.mask).to(s.step_logp.dtype)  # (B, N, K)
    return _per_rank_objective(_penalised(contrib, s, per_place=True), s), contrib.sum(-1)


def _whole(s: _Samples) -> tuple[Tensor, Tensor]:
    sampled_utility = s.util.whole(s.rankings, s.rel, s.mask).to(s.step_logp.dtype)  # (B, N)
    reward = _penalised(sampled_utility, s, per_place=False)
    advantage = _leave_one_out(reward) if s.baseline == "loo" else reward
    return advantage.detach() * s.step_logp.sum(-1), sampled_utility


def _plrank3(s: _Samples) -> tuple[Tensor, Tensor]:
    dtype = s.step_logp.dtype
    gains, theta = s.util.rank_gains(s.rel, s.mask)
    weights = plrank3_weights(s.logits, s.rankings, s.step_logp.detach(), gains, theta, s.mask)  # (B, n), 0 if padded
    logits = s.logits.to(dtype) if s.mask is None else torch.where(s.mask, s.logits.to(dtype), 0.0)
    objective = (logits * weights).sum(-1)  # (B,) the house surrogate: its gradient is the weights
    if s.entropy_coef or (s.ranking_kl is not None and s.kl_coef):  # the sampled regularisers, per_rank's way
        penalties = _penalised(torch.zeros_like(s.step_logp.detach()), s, per_place=True)  # (B, N, K)
        objective = objective + _per_rank_objective(penalties, s).mean(1)
    sampled_utility = s.util.per_rank(s.rankings, s.rel, s.mask).to(dtype).sum(-1)  # (B, N)
    return objective, sampled_utility


# One dict for dispatch by name (train.pg.estimator): each maps the samples to the surrogate objective, per query
# ``(B,)`` or per query and sample ``(B, N)``, whose mean's gradient is the estimate averaged over queries, and
# the sampled rankings' utilities ``(B, N)``.
ESTIMATORS: dict[str, Callable[[_Samples], tuple[Tensor, Tensor]]] = {
    "per_rank": _per_rank, "whole": _whole, "plrank3": _plrank3,
}


def policy_gradient(
    scores: Tensor,
    relevance: Tensor,
    mask: Tensor | None = None,
    *,
    num_samples: int,
    utility: str | Utility = "ndcg@10",
    estimator: Estimator = "per_rank",
    baseline: Literal["loo", "none"] = "loo",
    temperature: float = 1.0,
    entropy_coef: float = 0.0,
    entropy: Literal["top1", "ranking"] = "top1",
    generator: torch.Generator | Sequence[torch.Generator] | None = None,
    reference_scores: Tensor | None = None,
    kl_coef: float = 0.0,
    kl: Literal["top1", "ranking"] = "top1",
) -> PGOutput:
    """The policy-gradient surrogate with its diagnostics. See :func:`pg_loss` for the arguments."""
    if scores.dim() != 2 or relevance.shape != scores.shape:
        raise ValueError(f"scores and relevance must both be (B, n); got {tuple(scores.shape)} and {tuple(relevance.shape)}")
    if temperature <= 0:
        raise ValueError(f"temperature must be > 0, got {temperature}")
    if baseline == "loo" and num_samples < 2:
        raise ValueError(f"the leave-one-out baseline needs num_samples >= 2, got {num_samples}")
    util = get_utility(utility) if isinstance(utility, str) else utility
    if estimator in ("per_rank", "plrank3") and util.per_rank is None:
        raise ValueError(f"utility {util.name!r} is not rank-decomposable; use estimator='whole'")
    if estimator == "plrank3" and util.rank_gains is None:
        raise ValueError(f"utility {util.name!r} is not a sum of place weights times document gains, which "
                         "estimator='plrank3' needs (ndcg, dcg, recall); use estimator='per_rank'")
    if estimator not in ESTIMATORS or baseline not in ("loo", "none") or entropy not in ("top1", "ranking"):
        raise ValueError(f"unknown estimator/baseline/entropy: {estimator!r}/{baseline!r}/{entropy!r}")
    if kl not in ("top1", "ranking") or kl_coef < 0:
        raise ValueError(f"kl must be 'top1' or 'ranking' and kl_coef >= 0 (got {kl!r}, {kl_coef})")
    if kl_coef and reference_scores is None:
        raise ValueError("kl_coef > 0 needs reference_scores (the reference policy's scores of the same candidates)")
    if reference_scores is not None and reference_scores.shape != scores.shape:
        raise ValueError(f"reference_scores must be (B, n) like scores; got {tuple(reference_scores.shape)}")

    logits = scores / temperature  # (B, n) the tempered policy, sampled and differentiated alike
    rel = relevance.to(torch.float64 if scores.dtype == torch.float64 else torch.float32)
    rankings = sample_rankings(logits, mask, num_samples, k=util.depth, generator=generator)  # (B, N, K)
    step_logp = placement_log_probs(logits, rankings, mask)  # (B, N, K)
    step_logp_d = step_logp.detach()
    ref_logits = None if reference_scores is None else reference_scores.detach() / temperature
    ranking_kl = None  # (B, N, K) log pi - log pi_ref per placement, when the ranking KL is asked for
    if ref_logits is not None and kl == "ranking":
        ranking_kl = step_logp_d - placement_log_probs(ref_logits.to(step_logp.dtype), rankings, mask)

    samples = _Samples(logits, rel, mask, rankings, step_logp, util, baseline,
                       entropy_coef if entropy == "ranking" else 0.0, kl_coef, ranking_kl)
    objective, sampled_utility = ESTIMATORS[estimator](samples)  # (B,) or (B, N), (B, N)

    loss = -objective.mean()
    if entropy == "top1":
        ent = top1_entropy(logits, mask)  # (B,)
        if entropy_coef:
            loss = loss - entropy_coef * ent.mean()
        ent_value = ent.detach().mean()
    else:
        ent_value = -step_logp_d.sum(-1).mean()
    if ref_logits is None:
        kl_value = torch.zeros((), dtype=step_logp.dtype, device=scores.device)
    elif kl == "top1":
        divergence = top1_kl(logits, ref_logits, mask)  # (B,), exact and differentiable
        if kl_coef:
            loss = loss + kl_coef * divergence.mean()
        kl_value = divergence.detach().mean()
    else:
        kl_value = ranking_kl.sum(-1).mean()
    return PGOutput(loss=loss, utility=sampled_utility.detach().mean(), entropy=ent_value, kl=kl_value)


def pg_loss(
    scores: Tensor,
    relevance: Tensor,
    mask: Tensor | None = None,
    *,
    num_samples: int,
    utility: str | Utility = "ndcg@10",
    estimator: Estimator = "per_rank",
    baseline: Literal["loo", "none"] = "loo",
    temperature: float = 1.0,
    entropy_coef: float = 0.0,
    entropy: Literal["top1", "ranking"] = "top1",
    generator: torch.Generator | Sequence[torch.Generator] | None = None,
    reference_scores: Tensor | None = None,
    kl_coef: float = 0.0,
    kl: Literal["top1", "ranking"] = "top1",
) -> Tensor:
    """Surrogate loss of Neural PG-Rank; ``-d loss / d scores`` is the policy-gradient estimate.

    Args:
        scores: ``(B, n)`` model scores ``s(q, d)`` of each query's candidates (differentiable).
        relevance: ``(B, n)`` relevance grades (0 = not relevant), as in the qrels.
        mask: ``(B, n)`` bool, ``True`` for real candidates (``None``: all real).
        num_samples: ``N`` rankings sampled per query (Gumbel trick, top-``depth`` only).
        utility: ``"ndcg@10"`` (paper), ``"dcg@k"``, ``"mrr@k"``, ``"recall@k"``, ``"ap@k"``, a
            ``"module:function"`` callable, or a resolved :class:`~pgrank.core.ranking_utility.Utility`.
        estimator: ``"per_rank"`` (Eq. 9), ``"whole"`` (Eq. 8) or ``"plrank3"`` (PL-Rank-3, not in the paper;
            nDCG, DCG and recall only).
        baseline: ``"loo"`` leave-one-out (Eq. 8/9) or ``"none"`` (plain REINFORCE, Eq. 5).
        temperature: ``T``; the policy is ``PL(scores / T)`` (paper: 0.05).
        entropy_coef: weight of the entropy bonus (paper: 0.01).
        entropy: ``"top1"`` (exact) or ``"ranking"`` (sampled), see the module docstring.
        generator: RNG for the Gumbel noise, or one generator per query (see
            :func:`pgrank.core.policy.sample_rankings`).
        reference_scores: ``(B, n)`` scores of the reference policy (the frozen warm start) over the
            same candidates; treated as constants.
        kl_coef: weight of the penalty ``KL(pi || pi_ref)`` (0: the paper's objective).
        kl: ``"top1"`` (exact) or ``"ranking"`` (sampled), see the module docstring.

    Returns:
        Scalar loss: the mean over queries of the negated surrogate objective (for the score-function
        estimators, its mean over samples).

    References:
        Gao et al., "Policy-Gradient Training of Language Models for Ranking", Eq. 8 and 9.
    """
    return policy_gradient(
        scores, relevance, mask, num_samples=num_samples, utility=utility, estimator=estimator,
        baseline=baseline, temperature=temperature, entropy_coef=entropy_coef, entropy=entropy,
        generator=generator, reference_scores=reference_scores, kl_coef=kl_coef, kl=kl,
    ).loss
