"""Plackett-Luce sampling and log-probabilities, checked against exact enumeration."""

from __future__ import annotations

import itertools
import math

import pytest
import torch
from scipy.stats import chisquare

from pgrank.core.policy import (
    log_prob,
    placement_log_probs,
    rank_mask,
    sample_rankings,
    top1_entropy,
)


def naive_log_prob(logits: list[float], ranking: list[int]) -> float:
    """Eq. 3 term by term, in float64 Python: the definition, not the implementation."""
    remaining = list(range(len(logits)))
    total = 0.0
    for item in ranking:
        m = max(logits[j] for j in remaining)
        lse = m + math.log(sum(math.exp(logits[j] - m) for j in remaining))
        total += logits[item] - lse
        remaining.remove(item)
    return total


@pytest.mark.parametrize("k", [1, 3, 7])
def test_log_prob_matches_definition(k):
    g = torch.Generator().manual_seed(0)
    logits = torch.randn(3, 7, generator=g, dtype=torch.float64) * 3
    rankings = sample_rankings(logits, num_samples=40, k=k, generator=g)
    got = log_prob(logits, rankings)
    for b in range(3):
        for i in range(40):
            want = naive_log_prob(logits[b].tolist(), rankings[b, i].tolist())
            assert got[b, i].item() == pytest.approx(want, abs=1e-12)


def test_full_rankings_probabilities_sum_to_one():
    logits = torch.tensor([[0.3, -1.2, 2.0, 0.0, 0.7]], dtype=torch.float64)
    perms = torch.tensor(list(itertools.permutations(range(5)))).unsqueeze(0)  # (1, 120, 5)
    assert log_prob(logits, perms).exp().sum().item() == pytest.approx(1.0, abs=1e-12)
    prefixes = torch.tensor(list(itertools.permutations(range(5), 2))).unsqueeze(0)  # top-2 marginals
    assert log_prob(logits, prefixes).exp().sum().item() == pytest.approx(1.0, abs=1e-12)


@pytest.mark.parametrize("k", [4, 2])
def test_sampling_frequencies_match_exact_probabilities(k):
    """Chi-square goodness of fit of sampled (partial) rankings against exact PL probabilities."""
    logits = torch.tensor([[1.0, 0.2, -0.5, 0.8]], dtype=torch.float64)
    n_samples = 40_000
    g = torch.Generator().manual_seed(1234)
    rankings = sample_rankings(logits, num_samples=n_samples, k=k, generator=g)[0]
    outcomes = list(itertools.permutations(range(4), k))
    index = {o: i for i, o in enumerate(outcomes)}
    counts = torch.zeros(len(outcomes))
    for row in rankings.tolist():
        counts[index[tuple(row)]] += 1
    probs = log_prob(logits, torch.tensor(outcomes).unsqueeze(0)).exp()[0]
    stat, p = chisquare(counts.numpy(), (probs * n_samples).numpy())
    assert p > 1e-3, f"chi2={stat:.1f}, p={p:.2e}"


def test_padded_slots_are_never_sampled_and_get_no_gradient():
    g = torch.Generator().manual_seed(0)
    scores = torch.randn(3, 9, generator=g)
    mask = torch.ones(3, 9, dtype=torch.bool)
    mask[1, 4:] = False  # 4 real candidates
    mask[2, 1:] = False  # 1 real candidate
    scores = scores.masked_fill(~mask, 1e6).requires_grad_(True)  # huge scores must not leak in
    rankings = sample_rankings(scores, mask, num_samples=500, k=6, generator=g)
    valid = rank_mask(mask, rankings).expand_as(rankings)
    picked_mask = torch.take_along_dim(mask.unsqueeze(1), rankings, dim=-1)
    assert picked_mask[valid].all()
    assert valid[1].sum(-1).eq(4).all() and valid[2].sum(-1).eq(1).all()
    # each real candidate appears once per sample
    assert all(len(set(r[:4])) == 4 for r in rankings[1].tolist())
    lp = placement_log_probs(scores, rankings, mask)
    assert (lp[~valid] == 0).all()
    assert lp[2, :, 0].abs().max() < 1e-6  # a single real candidate is placed with probability 1
    (lp.sum() + top1_entropy(scores, mask).sum()).backward()
    assert torch.isfinite(scores.grad).all()
    assert (scores.grad[~mask] == 0).all()


def test_padding_does_not_change_log_probs():
    g = torch.Generator().manual_seed(3)
    logits = torch.randn(1, 5, generator=g, dtype=torch.float64)
    padded = torch.cat([logits, torch.full((1, 3), 50.0, dtype=torch.float64)], dim=1)
    mask = torch.tensor([[True] * 5 + [False] * 3])
    rankings = sample_rankings(logits, num_samples=30, k=3, generator=g)
    assert torch.allclose(log_prob(logits, rankings), log_prob(padded, rankings, mask), atol=1e-12)


@pytest.mark.parametrize("scale", [1e2, 1e3, 1e4])
def test_log_prob_stable_for_huge_logits(scale):
    g = torch.Generator().manual_seed(0)
    logits = (torch.rand(4, 50, generator=g) * 2 - 1) * scale
    logits[0, 0] = scale  # one dominant item, the case that breaks total-minus-cumsum
    logits = logits.requires_grad_(True)
    rankings = sample_rankings(logits, num_samples=64, k=10, generator=g)
    lp = log_prob(logits, rankings)
    lp.sum().backward()
    assert torch.isfinite(lp).all() and torch.isfinite(logits.grad).all()
    assert (lp <= 1e-3).all()
    # compare with float64 evaluation of the same rankings
    ref = log_prob(logits.detach().double(), rankings)
    assert torch.allclose(lp.double(), ref, rtol=1e-5, atol=1e-2)


def test_dominant_item_with_tiny_rest_is_exact():
    """logits [100, 0 x 999], K=10: the rest's mass is invisible next to the top item in float32."""
    logits = torch.zeros(1, 1000)
    logits[0, 0] = 100.0
    rankings = sample_rankings(logits, num_samples=8, k=10, generator=torch.Generator().manual_seed(0))
    got = log_prob(logits, rankings)[0]
    for i in range(8):
        want = naive_log_prob(logits[0].double().tolist(), rankings[0, i].tolist())
        assert got[i].item() == pytest.approx(want, rel=1e-5)


def test_top1_entropy_matches_definition():
    logits = torch.tensor([[0.0, 1.0, 2.0, 9.0]], dtype=torch.float64)
    mask = torch.tensor([[True, True, True, False]])
    p = torch.softmax(logits[0, :3], 0)
    assert top1_entropy(logits, mask).item() == pytest.approx(-(p * p.log()).sum().item(), abs=1e-12)


def test_sampling_is_reproducible_with_a_generator():
    logits = torch.randn(2, 30)
    a = sample_rankings(logits, num_samples=10, k=5, generator=torch.Generator().manual_seed(7))
    b = sample_rankings(logits, num_samples=10, k=5, generator=torch.Generator().manual_seed(7))
    assert torch.equal(a, b)


def test_bad_shapes_are_rejected():
    with pytest.raises(ValueError):
        sample_rankings(torch.randn(5), num_samples=2)
    with pytest.raises(ValueError):
        sample_rankings(torch.randn(2, 5), torch.ones(2, 4, dtype=torch.bool), num_samples=2)
