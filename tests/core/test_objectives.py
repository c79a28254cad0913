"""The objectives next to PG-Rank, each against its defining property computed by hand."""

from __future__ import annotations

import itertools
import math

import pytest
import torch

from pgrank.core.objectives import OBJECTIVES, ideal_rankings, lambda_weights


def batch(seed: int = 0, B: int = 3, n: int = 6, graded: bool = True):
    g = torch.Generator().manual_seed(seed)
    scores = torch.randn(B, n, generator=g, dtype=torch.float64)
    relevance = torch.randint(0, 3 if graded else 2, (B, n), generator=g).to(torch.float64)
    relevance[:, 0] = 1  # every query has a relevant candidate...
    relevance[-1] = 0  # ...but the last, which must contribute nothing
    mask = torch.ones(B, n, dtype=torch.bool)
    mask[1, -2:] = False  # padded slots (garbage scores and grades)
    scores[1, -2:], relevance[1, -2:] = 50.0, 2.0
    return scores, relevance, mask


def test_infonce_is_the_cross_entropy_of_each_positive_against_the_negatives():
    scores, rel, mask = batch()
    T = 0.5
    out = OBJECTIVES["infonce"](scores, rel, mask, temperature=T)
    per_query = []
    for b in range(scores.shape[0]):
        real = [j for j in range(scores.shape[1]) if mask[b, j]]
        pos = [j for j in real if rel[b, j] > 0]
        neg = [j for j in real if rel[b, j] == 0]
        if not pos:
            continue
        losses = [torch.nn.functional.cross_entropy((scores[b, [p] + neg] / T)[None], torch.tensor([0])) for p in pos]
        per_query.append(torch.stack(losses).mean())
    assert torch.allclose(out.loss, torch.stack(per_query).mean())


def test_listnet_is_the_cross_entropy_against_normalised_grades():
    scores, rel, mask = batch(1)
    T = 0.7
    out = OBJECTIVES["listnet"](scores, rel, mask, temperature=T)
    per_query = []
    for b in range(scores.shape[0]):
        real = [j for j in range(scores.shape[1]) if mask[b, j]]
        r = rel[b, real]
        if r.sum() == 0:
            continue
        per_query.append(-(r / r.sum() * torch.log_softmax(scores[b, real] / T, -1)).sum())
    assert torch.allclose(out.loss, torch.stack(per_query).mean())


def test_listmle_is_the_exact_negative_pl_likelihood_of_the_relevance_sorted_ranking():
    scores = torch.randn(1, 5, dtype=torch.float64, generator=torch.Generator().manual_seed(2))
    rel = torch.tensor([[0.0, 3.0, 1.0, 2.0, 4.0]], dtype=torch.float64)  # distinct grades: one ideal ranking
    out = OBJECTIVES["listmle"](scores, rel, None, temperature=0.5)
    # Plackett-Luce likelihood by the product formula of the paper's Eq. 3, written out
    order, remaining, nll = [4, 1, 3, 2, 0], [0, 1, 2, 3, 4], 0.0
    for d in order:
        nll -= scores[0, d] / 0.5 - torch.logsumexp(scores[0, remaining] / 0.5, 0)
        remaining.remove(d)
    assert torch.allclose(out.loss, nll)


def test_listmle_breaks_ties_uniformly_at_random():
    rel = torch.tensor([[1.0, 0.0, 1.0, 0.0]])
    mask = torch.ones(1, 4, dtype=torch.bool)
    seen = {tuple(ideal_rankings(rel, mask, torch.Generator().manual_seed(s))[0, 0].tolist()) for s in range(200)}
    assert seen == {(a, b, c, d) for a, b in itertools.permutations([0, 2]) for c, d in itertools.permutations([1, 3])}


def test_listmle_topk_is_the_pl_likelihood_of_the_relevant_places_only():
    scores = torch.randn(2, 6, dtype=torch.float64, generator=torch.Generator().manual_seed(3))
    rel = torch.tensor([[0.0, 2.0, 0.0, 1.0, 0.0, 0.0], [0.0, 0.0, 0.0, 0.0, 0.0, 0.0]], dtype=torch.float64)
    mask = torch.ones(2, 6, dtype=torch.bool)
    mask[0, -1] = False  # a padded slot never enters a denominator
    T = 0.5
    out = OBJECTIVES["listmle_topk"](scores, rel, mask, temperature=T)
    # the grade-2 document first, then the grade-1 one, out of the real candidates; nothing after them
    remaining, nll = [0, 1, 2, 3, 4], 0.0
    for d in [1, 3]:
        nll -= scores[0, d] / T - torch.logsumexp(scores[0, remaining] / T, 0)
        remaining.remove(d)
    assert torch.allclose(out.loss, nll)  # the query without a relevant candidate contributes nothing
    # one relevant candidate: exactly InfoNCE's cross-entropy over the whole candidate set
    one = torch.tensor([[0.0, 1.0, 0.0, 0.0, 0.0, 0.0]], dtype=torch.float64)
    topk = OBJECTIVES["listmle_topk"](scores[:1], one, None, temperature=T).loss
    assert torch.allclose(topk, torch.nn.functional.cross_entropy(scores[:1] / T, torch.tensor([1])))


def test_listmle_topk_gradients_move_the_relevant_candidates_up():
    scores = torch.zeros(1, 8, dtype=torch.float64, requires_grad=True)
    rel = torch.tensor([[0.0, 0.0, 1.0, 0.0, 0.0, 2.0, 0.0, 0.0]], dtype=torch.float64)
    OBJECTIVES["listmle_topk"](scores, rel, None, temperature=1.0).loss.backward()
    grad = scores.grad[0]
    assert grad[5] < grad[2] < 0 and (grad[[0, 1, 3, 4, 6, 7]] > 0).all()


def lambdaloss_by_hand(scores: torch.Tensor, rel: torch.Tensor, T: float) -> torch.Tensor:
    """Wang et al. (2018), NDCG-Loss2++, pair by pair in the current ranking (linear gains)."""
    n = len(scores)
    order = sorted(range(n), key=lambda j: -float(scores[j]))
    idcg = sum(float(g) / math.log2(i + 2) for i, g in enumerate(sorted(rel.tolist(), reverse=True)))
    D = lambda p: math.log2(1 + p)  # noqa: E731
    total = 0.0
    for i in range(n):
        for j in range(n):
            a, b = order[i], order[j]
            if rel[a] <= rel[b]:
                continue
            gap = abs(float(rel[a] - rel[b])) / idcg
            delta = abs(1 / D(abs(i - j)) - 1 / D(abs(i - j) + 1))
            lambdarank = abs(1 / D(i + 1) - 1 / D(j + 1))
            weight = 10 * delta * gap + lambdarank * gap
            total = total - weight * math.log2(1 / (1 + math.exp(-(float(scores[a]) - float(scores[b])) / T)))
    return torch.tensor(total, dtype=torch.float64)


def test_lambdaloss_equals_the_papers_formula_pair_by_pair():
    scores, rel, _ = batch(3, B=2, n=6)
    T = 0.5
    out = OBJECTIVES["lambdaloss"](scores, rel, None, temperature=T)
    expected = [lambdaloss_by_hand(scores[b], rel[b], T) for b in range(2) if rel[b].sum() > 0]
    assert torch.allclose(out.loss, torch.stack(expected).mean())


def test_lambdaloss_weights_are_sentence_transformers_ndcg_loss2pp():
    from sentence_transformers.cross_encoder.losses.lambda_loss import NDCGLoss2PPScheme

    gain = torch.rand(2, 7, dtype=torch.float64)
    discount = torch.log2(1.0 + torch.arange(1, 8, dtype=torch.float64))[None, :]
    assert torch.allclose(lambda_weights(gain, 7), NDCGLoss2PPScheme(mu=10.0)(gain, discount, None))


def test_lambdaloss_is_lowest_for_the_ideal_ordering():
    rel = torch.tensor([2.0, 0.0, 1.0, 0.0, 1.0], dtype=torch.float64)
    values = torch.tensor([2.0, 1.0, 0.0, -1.0, -2.0], dtype=torch.float64)
    losses = {}
    for perm in itertools.permutations(range(5)):
        scores = torch.empty(5, dtype=torch.float64)
        scores[list(perm)] = values
        losses[perm] = OBJECTIVES["lambdaloss"](scores[None], rel[None], None, temperature=1.0).loss.item()
    best = min(losses, key=losses.get)
    assert [float(rel[d]) for d in best] == sorted(rel.tolist(), reverse=True)


@pytest.mark.parametrize("name", sorted(OBJECTIVES))
def test_every_objective_ignores_padding_and_descends_towards_relevance(name):
    scores, rel, mask = batch(4, B=4, n=8)
    s = scores.clone().requires_grad_(True)
    kwargs = {"num_samples": 8} if name == "pg" else {}
    out = OBJECTIVES[name](s, rel, mask, temperature=0.5, generator=torch.Generator().manual_seed(0), **kwargs)
    out.loss.backward()
    assert torch.isfinite(out.loss) and torch.isfinite(s.grad).all()
    assert torch.all(s.grad[~mask] == 0)  # padded slots get no gradient
    assert torch.all(s.grad[-1] == 0) or name == "pg"  # a query with nothing relevant: no signal
    assert 0 <= out.utility.item() <= 1
    # a few gradient steps raise the nDCG@10 of the sorted ranking
    opt = torch.optim.SGD([s], lr=0.5)
    before = out.utility.item()
    for step in range(40):
        opt.zero_grad()
        OBJECTIVES[name](s, rel, mask, temperature=0.5, generator=torch.Generator().manual_seed(step), **kwargs).loss.backward()
        opt.step()
    assert OBJECTIVES[name](s, rel, mask, temperature=0.5, **kwargs).utility.item() > before
