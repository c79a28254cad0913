"""Policy-gradient estimators: unbiased against the exact gradient from enumerating all n! rankings."""

from __future__ import annotations

import itertools
import sys
import types

import pytest
import torch

from pgrank.core.estimators import pg_loss, policy_gradient
from pgrank.core.policy import log_prob, top1_entropy
from pgrank.core.ranking_utility import get_utility

N_SAMPLES = 8
N_COPIES = 6000  # independent estimates (one per copy of the query), vectorised as a batch


def exact_gradient(scores, relevance, mask, utility: str, temperature: float, entropy_coef: float = 0.0):
    """d/d scores of E_{r ~ PL(scores/T)}[Delta(r)] + coef * H(PL), by enumerating every permutation."""
    scores = scores.detach().clone().requires_grad_(True)
    real = [j for j in range(scores.shape[-1]) if mask is None or bool(mask[0, j])]
    pad = [j for j in range(scores.shape[-1]) if j not in real]
    perms = torch.tensor([list(p) + pad for p in itertools.permutations(real)]).unsqueeze(0)
    logp = log_prob(scores / temperature, perms, mask)  # (1, n!)
    delta = get_utility(utility).whole(perms, relevance, mask)
    objective = (logp.exp() * delta).sum() - entropy_coef * (logp.exp() * logp).sum()
    objective.backward()
    return scores.grad[0]


def mean_estimate(scores, relevance, mask, reference_scores_one=None, **kwargs):
    """Mean and standard error of the estimator's gradient over N_COPIES independent draws."""
    B = N_COPIES
    s = scores.repeat(B, 1).requires_grad_(True)
    rel = relevance.repeat(B, 1)
    m = None if mask is None else mask.repeat(B, 1)
    if reference_scores_one is not None:
        kwargs["reference_scores"] = reference_scores_one.repeat(B, 1)
    loss = pg_loss(s, rel, m, num_samples=N_SAMPLES, generator=torch.Generator().manual_seed(0), **kwargs)
    loss.backward()
    estimates = -s.grad * B  # the loss averages over copies; each copy's estimate is -B * its grad
    return estimates.mean(0), estimates.std(0) / B**0.5


def problem(seed: int, n: int = 4, padded: bool = False):
    g = torch.Generator().manual_seed(seed)
    scores = torch.randn(1, n, generator=g, dtype=torch.float64)
    relevance = torch.tensor([[3.0, 0.0, 1.0, 2.0, 0.0][:n]], dtype=torch.float64)
    mask = None
    if padded:  # two padded slots with garbage scores and grades
        scores = torch.cat([scores, torch.tensor([[40.0, -3.0]], dtype=torch.float64)], 1)
        relevance = torch.cat([relevance, torch.tensor([[5.0, 5.0]], dtype=torch.float64)], 1)
        mask = torch.tensor([[True] * n + [False, False]])
    return scores, relevance, mask


CASES = [
    # estimator, baseline, utility, temperature, padded
    ("per_rank", "loo", "ndcg@10", 1.0, False),
    ("per_rank", "loo", "ndcg@2", 0.5, False),  # top-K sampling path (K < n)
    ("per_rank", "none", "dcg@3", 2.0, False),
    ("per_rank", "loo", "mrr@3", 0.7, True),
    ("per_rank", "loo", "ap@4", 1.0, False),
    ("whole", "loo", "ndcg@10", 1.0, False),
    ("whole", "loo", "ndcg@2", 0.5, True),
    ("whole", "none", "recall@2", 1.5, False),
    ("plrank3", "loo", "ndcg@10", 1.0, False),
    ("plrank3", "loo", "ndcg@2", 0.5, True),
    ("plrank3", "none", "dcg@3", 2.0, False),
    ("plrank3", "loo", "recall@2", 1.5, True),
]


@pytest.mark.parametrize("case", range(len(CASES)), ids=["-".join(map(str, c)) for c in CASES])
def test_estimators_are_unbiased(case):
    estimator, baseline, utility, temperature, padded = CASES[case]
    scores, relevance, mask = problem(seed=case, padded=padded)
    exact = exact_gradient(scores, relevance, mask, utility, temperature)
    mean, se = mean_estimate(
        scores, relevance, mask, utility=utility, estimator=estimator, baseline=baseline, temperature=temperature
    )
    assert torch.all((mean - exact).abs() <= 4 * se + 1e-9), f"exact={exact}\nmean={mean}\nse={se}"
    if mask is not None:
        assert torch.all(mean[~mask[0]] == 0)


def test_ranking_entropy_estimator_is_unbiased():
    scores, _, _ = problem(seed=5)
    zero = torch.zeros_like(scores)
    exact = exact_gradient(scores, zero, None, "ndcg@10", 0.8, entropy_coef=1.0)
    for estimator in ["per_rank", "whole", "plrank3"]:
        mean, se = mean_estimate(
            scores, zero, None, utility="ndcg@10", estimator=estimator, temperature=0.8,
            entropy_coef=1.0, entropy="ranking",
        )
        assert torch.all((mean - exact).abs() <= 4 * se + 1e-9), (estimator, exact, mean, se)


def test_custom_whole_ranking_utility_is_unbiased(monkeypatch):
    """The paper's point: any utility of a whole ranking, here a non-additive one."""
    module = types.ModuleType("pgrank_test_custom_utility")

    def pair_bonus(rankings, relevance, mask):
        top = torch.take_along_dim(relevance.unsqueeze(1), rankings[..., :2], dim=-1)
        return top[..., 0] * top[..., 1]  # rewards two relevant documents together at the top

    pair_bonus.depth = 2
    module.pair_bonus = pair_bonus
    monkeypatch.setitem(sys.modules, module.__name__, module)
    name = f"{module.__name__}:pair_bonus"
    scores, relevance, _ = problem(seed=11)
    exact = exact_gradient(scores, relevance, None, name, 1.0)
    mean, se = mean_estimate(scores, relevance, None, utility=name, estimator="whole", temperature=1.0)
    assert torch.all((mean - exact).abs() <= 4 * se + 1e-9), (exact, mean, se)
    for estimator in ["per_rank", "plrank3"]:
        with pytest.raises(ValueError, match="not rank-decomposable"):
            pg_loss(scores, relevance, num_samples=4, utility=name, estimator=estimator)
    for prefix_utility in ["mrr@3", "ap@4"]:  # not linear in the placed documents' gains
        with pytest.raises(ValueError, match="place weights times document gains"):
            pg_loss(scores, relevance, num_samples=4, utility=prefix_utility, estimator="plrank3")


def test_top1_entropy_term_is_exact():
    scores = torch.randn(3, 6, dtype=torch.float64, requires_grad=True)
    zero = torch.zeros_like(scores)
    loss = pg_loss(scores, zero, num_samples=4, temperature=0.5, entropy_coef=0.3)
    loss.backward()
    ref = scores.detach().clone().requires_grad_(True)
    (-0.3 * top1_entropy(ref / 0.5).mean()).backward()
    assert torch.allclose(scores.grad, ref.grad)


def test_zero_relevance_gives_zero_gradient_even_for_huge_scores():
    for scale in [1.0, 1e4]:
        scores = (torch.randn(4, 50) * scale).requires_grad_(True)
        for estimator in ["per_rank", "whole", "plrank3"]:
            scores.grad = None
            pg_loss(scores, torch.zeros(4, 50), num_samples=16, estimator=estimator, temperature=0.05).backward()
            assert torch.equal(scores.grad, torch.zeros_like(scores))


@pytest.mark.parametrize("estimator", ["per_rank", "whole", "plrank3"])
def test_no_nan_for_huge_logits(estimator):
    g = torch.Generator().manual_seed(0)
    scores = (torch.randn(4, 100, generator=g) * 500).requires_grad_(True)  # / 0.05 -> logits ~ 1e4
    relevance = (torch.rand(4, 100, generator=g) > 0.9).float()
    out = policy_gradient(
        scores, relevance, num_samples=32, estimator=estimator, temperature=0.05, entropy_coef=0.01,
        generator=g,
    )
    out.loss.backward()
    assert torch.isfinite(out.loss) and torch.isfinite(scores.grad).all()
    assert 0.0 <= out.utility.item() <= 1.0 and torch.isfinite(out.entropy)


def test_gradient_ascends_the_utility():
    """A few plain gradient steps on the scores raise the exact expected nDCG."""
    scores, relevance, _ = problem(seed=2, n=5)
    s = scores.clone().requires_grad_(True)
    opt = torch.optim.SGD([s], lr=0.5)
    perms = torch.tensor(list(itertools.permutations(range(5)))).unsqueeze(0)

    def expected(x):
        return (log_prob(x, perms).exp() * get_utility("ndcg@10").whole(perms, relevance, None)).sum().item()

    before = expected(scores)
    g = torch.Generator().manual_seed(0)
    for _ in range(30):
        opt.zero_grad()
        pg_loss(s, relevance, num_samples=16, generator=g).backward()
        opt.step()
    assert expected(s.detach()) > before + 0.05


def test_invalid_arguments_are_rejected():
    s, r = torch.randn(2, 5), torch.zeros(2, 5)
    with pytest.raises(ValueError, match="num_samples >= 2"):
        pg_loss(s, r, num_samples=1, baseline="loo")
    with pytest.raises(ValueError, match="temperature"):
        pg_loss(s, r, num_samples=4, temperature=0.0)
    with pytest.raises(ValueError):
        pg_loss(s, r[:, :3], num_samples=4)
    assert torch.isfinite(pg_loss(s, r, num_samples=1, baseline="none"))


# --------------------------------------------------------------------------------------- reference-policy KL


def prefixes(n: int, k: int, mask=None):
    """Every top-k ranking (prefix) of the real candidates, ``(1, P, k)``."""
    real = [j for j in range(n) if mask is None or bool(mask[0, j])]
    return torch.tensor(list(itertools.permutations(real, min(k, len(real))))).unsqueeze(0)


def exact_kl(scores, reference, mask, k: int, temperature: float):
    """KL(PL(scores/T) || PL(reference/T)) over top-k rankings, by enumerating every prefix."""
    perms = prefixes(scores.shape[-1], k, mask)
    logp = log_prob(scores / temperature, perms, mask)
    logq = log_prob(reference / temperature, perms, mask)
    return (logp.exp() * (logp - logq)).sum()


def exact_regularised_gradient(scores, reference, relevance, mask, utility: str, temperature: float, kl_coef: float):
    """d/d scores of E[Delta] - kl_coef * KL over top-K rankings (K: the utility's depth), by enumeration."""
    s = scores.detach().clone().requires_grad_(True)
    util = get_utility(utility)
    perms = prefixes(s.shape[-1], util.depth, mask)
    logp = log_prob(s / temperature, perms, mask)
    objective = (logp.exp() * util.whole(perms, relevance, mask)).sum() - kl_coef * exact_kl(s, reference, mask, util.depth, temperature)
    objective.backward()
    return s.grad[0]


def test_top1_kl_is_the_exact_kl_of_the_first_place_distributions():
    from pgrank.core.policy import top1_kl

    g = torch.Generator().manual_seed(3)
    scores = torch.randn(3, 5, generator=g, dtype=torch.float64, requires_grad=True)
    reference = torch.randn(3, 5, generator=g, dtype=torch.float64)
    mask = torch.tensor([[True] * 5, [True] * 5, [True, True, True, False, False]])
    p, q = (torch.softmax(torch.where(mask, x, torch.tensor(-1e30, dtype=x.dtype)), -1) for x in (scores / 0.5, reference / 0.5))
    by_hand = torch.where(mask, p * (p.clamp_min(1e-300).log() - q.clamp_min(1e-300).log()), torch.zeros((), dtype=p.dtype)).sum(-1)
    assert torch.allclose(top1_kl(scores / 0.5, reference / 0.5, mask), by_hand)
    assert torch.allclose(top1_kl(reference, reference), torch.zeros(3, dtype=torch.float64))
    # in the loss: exactly kl_coef * mean KL on top of the policy-gradient surrogate, with its exact gradient
    zero = torch.zeros_like(scores)
    out = policy_gradient(scores, zero, mask, num_samples=4, temperature=0.5, reference_scores=reference, kl_coef=0.7)
    assert torch.allclose(out.kl, by_hand.mean())
    out.loss.backward()
    ref = scores.detach().clone().requires_grad_(True)
    (0.7 * top1_kl(ref / 0.5, reference / 0.5, mask).mean()).backward()
    assert torch.allclose(scores.grad, ref.grad)


@pytest.mark.parametrize("utility,padded", [("ndcg@10", False), ("ndcg@2", True)], ids=["full-rankings", "top2-padded"])
def test_the_sampled_ranking_kl_is_unbiased_for_the_exact_kl(utility, padded):
    scores, _, mask = problem(seed=21, padded=padded)
    reference = scores + torch.randn(scores.shape, generator=torch.Generator().manual_seed(5), dtype=scores.dtype)
    depth = get_utility(utility).depth
    exact = exact_kl(scores, reference, mask, depth, 0.8).item()
    B = N_COPIES
    zero = torch.zeros(B, scores.shape[-1], dtype=scores.dtype)
    m = None if mask is None else mask.repeat(B, 1)
    out = policy_gradient(scores.repeat(B, 1), zero, m, num_samples=N_SAMPLES, utility=utility, temperature=0.8,
                          reference_scores=reference.repeat(B, 1), kl="ranking", generator=torch.Generator().manual_seed(1))
    # out.kl is the mean over B * N samples; compare with the spread of per-copy means
    assert abs(out.kl.item() - exact) < 0.03 * max(exact, 0.1), (out.kl.item(), exact)


@pytest.mark.parametrize("estimator,utility,kl_kind", [
    ("per_rank", "ndcg@10", "ranking"), ("per_rank", "ndcg@2", "ranking"), ("whole", "ndcg@10", "ranking"),
    ("per_rank", "ndcg@10", "top1"), ("plrank3", "ndcg@10", "ranking"), ("plrank3", "ndcg@2", "ranking"),
    ("plrank3", "ndcg@10", "top1"),
])
def test_the_regularised_estimator_is_unbiased(estimator, utility, kl_kind):
    scores, relevance, _ = problem(seed=13)
    reference = scores.flip(-1) * 0.8  # a reference policy that disagrees with the current one
    temperature, coef = 0.8, 0.5
    if kl_kind == "ranking":
        exact = exact_regularised_gradient(scores, reference, relevance, None, utility, temperature, coef)
    else:  # the exact top-1 term plus the unbiased utility gradient
        from pgrank.core.policy import top1_kl

        s = scores.detach().clone().requires_grad_(True)
        (-coef * top1_kl(s / temperature, reference / temperature)).sum().backward()
        exact = exact_gradient(scores, relevance, None, utility, temperature) + s.grad[0]
    mean, se = mean_estimate(scores, relevance, None, utility=utility, estimator=estimator, temperature=temperature,
                             reference_scores_one=reference, kl_coef=coef, kl=kl_kind)
    assert torch.all((mean - exact).abs() <= 4 * se + 1e-9), (exact, mean, se)
    unregularised = exact_gradient(scores, relevance, None, utility, temperature)
    assert (exact - unregularised).abs().max() > 8 * se.max()  # the KL term moves the gradient: the test has power


def test_kl_needs_reference_scores():
    s, r = torch.randn(2, 5), torch.zeros(2, 5)
    with pytest.raises(ValueError, match="needs reference_scores"):
        pg_loss(s, r, num_samples=4, kl_coef=0.1)
    with pytest.raises(ValueError, match="reference_scores must be"):
        pg_loss(s, r, num_samples=4, reference_scores=torch.zeros(2, 4))
    out = policy_gradient(s, r, num_samples=4)
    assert out.kl.item() == 0.0


@pytest.mark.parametrize("estimator", ["per_rank", "whole", "plrank3"])
def test_no_mask_is_an_all_true_mask(estimator):
    """mask=None skips every masking op; it must compute what an all-True mask computes."""
    g = torch.Generator().manual_seed(2)
    scores = torch.randn(3, 25, generator=g, dtype=torch.float64)
    relevance = torch.randint(0, 3, (3, 25), generator=g).double()
    reference = torch.randn(3, 25, generator=g, dtype=torch.float64)
    grads, outs = [], []
    for mask in (None, torch.ones(3, 25, dtype=torch.bool)):
        s = scores.clone().requires_grad_(True)
        out = policy_gradient(s, relevance, mask, num_samples=9, estimator=estimator, temperature=0.3, entropy_coef=0.1,
                              entropy="ranking", reference_scores=reference, kl_coef=0.2, kl="ranking",
                              generator=torch.Generator().manual_seed(5))
        out.loss.backward()
        grads.append(s.grad)
        outs.append(torch.stack([out.loss.detach(), out.utility, out.entropy, out.kl]))
    assert torch.allclose(outs[0], outs[1], rtol=1e-12, atol=1e-15)
    assert torch.allclose(grads[0], grads[1], rtol=1e-12, atol=1e-15)
