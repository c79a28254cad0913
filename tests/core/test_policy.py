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


def naive_placement_log_probs(logits: torch.Tensor, rankings: torch.Tensor, mask=None) -> torch.Tensor:
    """Eq. 3 place by place with autograd's own logsumexp (softmax gradient): a differentiable definition."""
    B, N, K = rankings.shape
    rows = []
    for b in range(B):
        real = torch.ones(logits.shape[1], dtype=torch.bool) if mask is None else mask[b].clone()
        n_real = int(real.sum())
        for i in range(N):
            remaining, row = real.clone(), []
            for k in range(K):
                if k >= n_real:
                    row.append(logits.new_zeros(()))
                    continue
                item = rankings[b, i, k]
                row.append(logits[b, item] - torch.logsumexp(logits[b][remaining], 0))
                remaining = remaining.clone()
                remaining[item] = False
            rows.append(torch.stack(row))
    return torch.stack(rows).view(B, N, K)


@pytest.mark.parametrize("n,k,scale,masked,ties", [
    (12, 4, 3.0, False, False), (12, 12, 3.0, True, False), (40, 10, 30.0, True, False),
    (9, 5, 2.0, False, True), (9, 3, 300.0, True, True),
])
def test_placement_log_prob_gradients_match_the_definition(n, k, scale, masked, ties):
    """The hand-written backward (reverse log-cumsum-exp recurrence, top-(K+1) head) against autograd of Eq. 3."""
    g = torch.Generator().manual_seed(n + k)
    logits = torch.randn(3, n, generator=g, dtype=torch.float64) * scale
    if ties:
        logits = logits.round()
    mask = None
    if masked:
        mask = torch.ones(3, n, dtype=torch.bool)
        mask[0, n // 2:] = False
        mask[2, 2:] = False
        logits = logits.masked_fill(~mask, 5 * scale)
    rankings = sample_rankings(logits, mask, num_samples=6, k=k, generator=g)
    weights = torch.randn(rankings.shape, generator=g, dtype=torch.float64)
    got = logits.clone().requires_grad_(True)
    want = logits.clone().requires_grad_(True)
    lp = placement_log_probs(got, rankings, mask)
    (lp * weights).sum().backward()
    ref = naive_placement_log_probs(want, rankings, mask)
    (ref * weights).sum().backward()
    assert torch.allclose(lp, ref, rtol=0, atol=1e-12)
    assert torch.allclose(got.grad, want.grad, rtol=1e-10, atol=1e-12 * want.grad.abs().max().item())


@pytest.mark.parametrize("n,k,masked", [(30, 10, False), (30, 10, True), (12, 12, True), (11, 10, False), (40, 1, True)])
def test_hand_written_gradient_equals_autograd(n, k, masked):
    """The recurrences and the hand-written backward against autograd through torch's logcumsumexp."""
    from pgrank.core.policy import _placement_parts, _PlacementLogProbs

    g = torch.Generator().manual_seed(n * k)
    logits = torch.randn(4, n, generator=g, dtype=torch.float64) * 4
    mask = None
    if masked:
        mask = torch.ones(4, n, dtype=torch.bool)
        mask[1, 7:] = False
        mask[3, 1:] = False
    rankings = sample_rankings(logits, mask, num_samples=9, k=k, generator=g)
    weights = torch.randn(rankings.shape, generator=g, dtype=torch.float64)
    fill = torch.finfo(torch.float64).min / 8
    safe = logits if mask is None else logits.masked_fill(~mask, fill)
    a, b = safe.clone().requires_grad_(True), safe.clone().requires_grad_(True)
    got = _PlacementLogProbs.apply(a, rankings, mask, fill)
    want = _placement_parts(b, rankings, mask, fill, recurrence=False)[0]
    (got * weights).sum().backward()
    (want * weights).sum().backward()
    assert torch.allclose(got, want, rtol=1e-13, atol=1e-13)
    real = slice(None) if mask is None else mask
    assert torch.allclose(a.grad[real], b.grad[real], rtol=1e-10, atol=1e-12)
    small = torch.randn(2, 9, dtype=torch.float64, generator=g)
    r = sample_rankings(small, num_samples=3, k=4, generator=g)
    assert torch.autograd.gradcheck(lambda x: _PlacementLogProbs.apply(x, r, None, fill), (small.requires_grad_(True),))


def test_first_free_head_position_both_ways():
    """The int64 bitmask and the scatter/argmin computations of the rest's sorted position agree."""
    from pgrank.core.policy import _first_free

    g = torch.Generator().manual_seed(1)
    for K in (1, 3, 10):
        K1 = K + 1
        # distinct head positions per sample, some places in the tail (K1) or on padding (K1 + 1)
        pos = torch.stack([torch.randperm(K1 + 3, generator=g)[:K] for _ in range(200)]).clamp(max=K1 + 1).view(20, 10, K)
        taken = torch.zeros(20, 10, K1 + 2, dtype=torch.uint8).scatter_(-1, pos, 1)
        assert torch.equal(_first_free(pos, K1).long(), taken[..., : K1 + 1].argmin(-1))


def test_per_query_generators_draw_what_each_query_draws_alone(monkeypatch):
    """Each query's rankings depend only on its own generator: not on the batch, nor on memory chunking."""
    from pgrank.core import policy

    g = torch.Generator().manual_seed(4)
    logits = torch.randn(5, 30, generator=g)
    mask = torch.ones(5, 30, dtype=torch.bool)
    mask[2, 10:] = False

    def gens():
        return [torch.Generator().manual_seed(100 + b) for b in range(5)]

    batched = sample_rankings(logits, mask, num_samples=7, k=4, generator=gens())
    for b, gen in enumerate(gens()):
        alone = sample_rankings(logits[b : b + 1], mask[b : b + 1], num_samples=7, k=4, generator=[gen])
        assert torch.equal(batched[b : b + 1], alone)
    shared = sample_rankings(logits, mask, num_samples=7, k=4, generator=torch.Generator().manual_seed(9))
    monkeypatch.setattr(policy, "_MAX_GUMBEL_ELEMENTS", 2 * 7 * 30)  # two queries per chunk
    assert torch.equal(sample_rankings(logits, mask, num_samples=7, k=4, generator=gens()), batched)
    assert torch.equal(sample_rankings(logits, mask, num_samples=7, k=4, generator=torch.Generator().manual_seed(9)), shared)


def test_cached_head_tables_change_no_result():
    """The head-position tables are built once per (K + 1, width, device): results equal a fresh build."""
    from pgrank.core.policy import _head_tables

    cases = [(n, k, dtype) for n, k in ((30, 10), (8, 8), (30, 3)) for dtype in (torch.float32, torch.float64)]

    def run(n, k, dtype):
        logits = (torch.randn(3, n, generator=torch.Generator().manual_seed(n + k)) * 3).to(dtype).requires_grad_(True)
        rankings = sample_rankings(logits, num_samples=5, k=k, generator=torch.Generator().manual_seed(k))
        lp = placement_log_probs(logits, rankings)
        lp.sum().backward()
        return lp.detach(), logits.grad

    _head_tables.cache_clear()
    cached = [run(*c) for c in cases + cases]
    for c, (lp, grad) in zip(cases + cases, cached):
        _head_tables.cache_clear()
        fresh_lp, fresh_grad = run(*c)
        assert torch.equal(lp, fresh_lp) and torch.equal(grad, fresh_grad), c
    ar, before = _head_tables(4, 5, torch.device("cpu"))
    assert torch.equal(ar, torch.arange(4)) and torch.equal(before, torch.arange(5) < torch.arange(4)[:, None])
