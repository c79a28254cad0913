"""PL-Rank-3: the authors' estimate on the same rankings, unbiased where scores tie, stable in float32, and its
variance against per_rank's. Unbiasedness by enumeration, with masks, graded relevance, the entropy and the KL
terms, is in test_estimators.py beside the other estimators."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
import torch

from pgrank.core.estimators import pg_loss
from pgrank.core.plrank import plrank3_weights
from pgrank.core.policy import log_prob, placement_log_probs, sample_rankings
from pgrank.core.ranking_utility import get_utility


def authors_pl_rank_3(rank_weights, labels, scores, sampled_rankings):
    """``PL_rank_3`` of HarrieO/2022-SIGIR-plackett-luce (algorithms/PLRank.py, MIT licence), NumPy, one query,
    given its sampled full rankings; transcribed without change but for the sampling."""
    n_docs = labels.shape[0]
    result = np.zeros(n_docs, dtype=np.float64)
    cutoff = min(rank_weights.shape[0], n_docs)
    scores = scores.copy() - np.amax(scores) + 10.0
    n_samples = sampled_rankings.shape[0]
    cutoff_sampled_rankings = sampled_rankings[:, :cutoff]
    srange = np.arange(n_samples)
    relevant_docs = np.where(np.not_equal(labels, 0))[0]
    weighted_labels = labels[cutoff_sampled_rankings] * rank_weights[None, :cutoff]
    cumsum_labels = np.cumsum(weighted_labels[:, ::-1], axis=1)[:, ::-1]
    np.add.at(result, cutoff_sampled_rankings[:, :-1], cumsum_labels[:, 1:])
    result /= n_samples
    exp_scores = np.exp(scores).astype(np.float64)
    denom_per_rank = np.cumsum(exp_scores[sampled_rankings[:, ::-1]], axis=1)[:, : -cutoff - 1 : -1]
    cumsum_weight_denom = np.cumsum(rank_weights[:cutoff] / denom_per_rank, axis=1)
    cumsum_reward_denom = np.cumsum(cumsum_labels / denom_per_rank, axis=1)
    if cutoff < n_docs:
        second_part = -exp_scores[None, :] * cumsum_reward_denom[:, -1, None]
        second_part[:, relevant_docs] += (labels[relevant_docs][None, :] * exp_scores[None, relevant_docs]
                                          * cumsum_weight_denom[:, -1, None])
    else:
        second_part = np.empty((n_samples, n_docs), dtype=np.float64)
    sampled_direct_reward = labels[cutoff_sampled_rankings] * exp_scores[cutoff_sampled_rankings] * cumsum_weight_denom
    sampled_following_reward = exp_scores[cutoff_sampled_rankings] * cumsum_reward_denom
    second_part[srange[:, None], cutoff_sampled_rankings] = sampled_direct_reward - sampled_following_reward
    return result + np.mean(second_part, axis=0)


def weights_for(logits, rankings, relevance, utility: str, mask=None):
    gains, theta = get_utility(utility).rank_gains(relevance, mask)
    return plrank3_weights(logits, rankings, placement_log_probs(logits, rankings, mask), gains, theta, mask)


@pytest.mark.parametrize("n,utility", [(20, "dcg@5"), (30, "ndcg@10"), (6, "ndcg@10"), (8, "dcg@8"), (12, "recall@3")])
def test_equals_the_authors_pl_rank_3_on_the_same_rankings(n, utility):
    g = torch.Generator().manual_seed(n)
    logits = torch.randn(1, n, generator=g, dtype=torch.float64) * 2
    relevance = torch.randint(0, 3, (1, n), generator=g).double()
    full = sample_rankings(logits, None, 64, generator=g)  # (1, 64, n): the authors' denominators need them whole
    K = min(get_utility(utility).depth, n)
    ours = weights_for(logits, full[..., :K].contiguous(), relevance, utility)[0]
    gains, theta = get_utility(utility).rank_gains(relevance, None)
    # the authors' labels times rank weights; recall's gains are its labels over R
    theirs = authors_pl_rank_3(theta.numpy(), gains[0].numpy(), logits[0].numpy(), full[0].numpy())
    np.testing.assert_allclose(ours.numpy(), theirs, rtol=1e-10, atol=1e-13)


def test_padded_slots_change_nothing_and_get_nothing():
    """A query padded with garbage slots gets the weights it gets alone, and 0 on the padding; fewer real
    candidates than the cut-off too."""
    g = torch.Generator().manual_seed(4)
    for n_real in (12, 3):
        logits = torch.randn(1, n_real, generator=g, dtype=torch.float64)
        relevance = torch.randint(0, 3, (1, n_real), generator=g).double()
        rankings = sample_rankings(logits, None, 32, k=5, generator=g)
        alone = weights_for(logits, rankings, relevance, "ndcg@5")
        padded_logits = torch.cat([logits, torch.tensor([[50.0, -7.0]], dtype=torch.float64)], 1)
        padded_rel = torch.cat([relevance, torch.tensor([[4.0, 4.0]], dtype=torch.float64)], 1)
        mask = torch.tensor([[True] * n_real + [False, False]])
        K = rankings.shape[-1]
        beyond = torch.tensor([n_real, n_real + 1])[: 5 - K].expand(1, 32, -1)  # padded slots fill the places
        padded_rankings = torch.cat([rankings, beyond], -1)  # as sample_rankings draws them with the mask
        padded = weights_for(padded_logits, padded_rankings, padded_rel, "ndcg@5", mask)
        assert torch.allclose(padded[:, :n_real], alone, rtol=1e-12, atol=1e-15)
        assert torch.equal(padded[:, n_real:], torch.zeros(1, 2, dtype=torch.float64))


def test_unbiased_where_scores_tie():
    scores = torch.tensor([[0.5, 0.5, 0.5, -1.0, -1.0]], dtype=torch.float64)
    relevance = torch.tensor([[0.0, 2.0, 1.0, 1.0, 0.0]], dtype=torch.float64)
    perms = torch.tensor(list(itertools.permutations(range(5)))).unsqueeze(0)
    s = scores.clone().requires_grad_(True)
    (log_prob(s / 0.7, perms).exp() * get_utility("ndcg@3").whole(perms, relevance, None)).sum().backward()
    B = 4000
    copies = scores.repeat(B, 1).requires_grad_(True)
    pg_loss(copies, relevance.repeat(B, 1), num_samples=8, estimator="plrank3", utility="ndcg@3", temperature=0.7,
            generator=torch.Generator().manual_seed(0)).backward()
    estimates = -copies.grad * B
    se = estimates.std(0) / B**0.5
    assert torch.all((estimates.mean(0) - s.grad[0]).abs() <= 4 * se + 1e-12), (s.grad, estimates.mean(0), se)


def test_float32_agrees_with_float64_at_a_low_temperature():
    """At T = 0.05 logits lie a hundred units apart: exp(logit) overflows a float32 (beyond 88), exp(logit - max)
    underflows it."""
    g = torch.Generator().manual_seed(7)
    scores = torch.rand(8, 100, generator=g, dtype=torch.float64) * 2 - 1  # cosine-like, logits within +-20
    scores[:, :5] += 4.0  # a confident head: logits up to 100
    relevance = (torch.rand(8, 100, generator=g) > 0.9).double()
    logits = scores / 0.05
    rankings = sample_rankings(logits, None, 200, k=10, generator=g)
    w64 = weights_for(logits, rankings, relevance, "ndcg@10")
    w32 = weights_for(logits.float(), rankings, relevance.float(), "ndcg@10")
    assert torch.isfinite(w32).all()
    assert torch.allclose(w32.double(), w64, rtol=1e-3, atol=1e-4 * w64.abs().max().item())  # float32's cancellations


def test_lower_variance_than_per_rank_for_a_positive_ranked_low():
    """The case PL-Rank-3 is for: one relevant document among 100 that the policy ranks 60th, so that few
    sampled rankings place it in the top 10. PL-Rank-3 credits every document with its exact probability of
    each place after the sampled prefix; per_rank credits it only when sampled. (With a confident policy that
    already ranks the relevant document first, per_rank's leave-one-out baseline does better:
    studies/estimator_variance.py measures both on real scores.)"""
    n, B, N = 100, 1000, 8
    scores = torch.linspace(3, -3, n, dtype=torch.float64).view(1, n)
    relevance = torch.zeros(1, n, dtype=torch.float64)
    relevance[0, 60] = 1.0
    variance = {}
    for estimator in ("per_rank", "plrank3"):
        copies = scores.repeat(B, 1).requires_grad_(True)
        pg_loss(copies, relevance.repeat(B, 1), num_samples=N, estimator=estimator, temperature=1.0,
                generator=torch.Generator().manual_seed(1)).backward()
        estimates = -copies.grad * B  # (B, n) one estimate per copy
        variance[estimator] = ((estimates - estimates.mean(0)) ** 2).sum(-1).mean().item()
    assert variance["plrank3"] < 0.75 * variance["per_rank"], variance


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="a CUDA device is needed")
def test_cuda_computes_what_the_cpu_computes():
    g = torch.Generator().manual_seed(3)
    logits = torch.randn(4, 60, generator=g) * 5
    relevance = torch.randint(0, 3, (4, 60), generator=g).float()
    mask = torch.rand(4, 60, generator=g) > 0.2
    rankings = sample_rankings(logits, mask, 300, k=10, generator=g)
    cpu = weights_for(logits, rankings, relevance, "ndcg@10", mask)
    cuda = weights_for(logits.cuda(), rankings.cuda(), relevance.cuda(), "ndcg@10", mask.cuda())
    assert torch.allclose(cuda.cpu(), cpu, rtol=1e-4, atol=1e-6)
