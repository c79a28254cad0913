"""Utilities equal pytrec_eval (trec_eval) on random graded runs, to 1e-9."""

from __future__ import annotations

import pytest
import pytrec_eval
import torch

from pgrank.core.ranking_utility import get_utility, ideal_dcg

MEASURES = {"ndcg_cut", "recip_rank", "recall", "map_cut"}


def random_graded_problem(seed: int, B: int = 25, n: int = 30):
    g = torch.Generator().manual_seed(seed)
    relevance = torch.randint(0, 4, (B, n), generator=g).to(torch.float64)
    relevance[torch.rand(B, n, generator=g) < 0.6] = 0  # mostly non-relevant, as in real qrels
    relevance[:, 0] = relevance[:, 0].clamp_min(1)  # at least one relevant document per query
    rankings = torch.stack([torch.randperm(n, generator=g) for _ in range(B)]).unsqueeze(1)  # (B, 1, n)
    return relevance, rankings


def trec_eval(relevance, rankings, k: int, truncate_run: bool) -> dict:
    B, n = relevance.shape
    qrels = {f"q{b}": {f"d{j}": int(relevance[b, j]) for j in range(n)} for b in range(B)}
    run = {}
    for b in range(B):
        order = rankings[b, 0].tolist()[: (k if truncate_run else n)]
        run[f"q{b}"] = {f"d{j}": float(n - place) for place, j in enumerate(order)}  # distinct scores
    evaluator = pytrec_eval.RelevanceEvaluator(qrels, {f"ndcg_cut.{k}", "recip_rank", f"recall.{k}", f"map_cut.{k}"})
    return evaluator.evaluate(run)


@pytest.mark.parametrize("k", [1, 3, 5, 10, 30])
def test_named_utilities_equal_pytrec_eval(k):
    relevance, rankings = random_graded_problem(seed=k)
    full = trec_eval(relevance, rankings, k, truncate_run=False)
    cut = trec_eval(relevance, rankings, k, truncate_run=True)  # recip_rank has no cut-off in trec_eval
    pairs = {
        f"ndcg@{k}": lambda q: full[q][f"ndcg_cut_{k}"],
        f"mrr@{k}": lambda q: cut[q]["recip_rank"],
        f"recall@{k}": lambda q: full[q][f"recall_{k}"],
        f"ap@{k}": lambda q: full[q][f"map_cut_{k}"],
    }
    for name, want in pairs.items():
        got = get_utility(name).whole(rankings, relevance, None)[:, 0]
        for b in range(relevance.shape[0]):
            assert got[b].item() == pytest.approx(want(f"q{b}"), abs=1e-9), (name, b)


def test_dcg_uses_linear_gains_and_log2_discount():
    relevance = torch.tensor([[3.0, 0.0, 2.0]], dtype=torch.float64)
    ranking = torch.tensor([[[2, 1, 0]]])
    want = 2.0 / 1.0 + 0.0 + 3.0 / 2.0  # log2(2)=1, log2(4)=2
    assert get_utility("dcg@3").whole(ranking, relevance, None).item() == pytest.approx(want)
    assert ideal_dcg(relevance, 3).item() == pytest.approx(3.0 + 2.0 / torch.log2(torch.tensor(3.0)).item())


def test_per_rank_contributions_sum_to_the_whole_utility():
    relevance, rankings = random_graded_problem(seed=0)
    for name in ["ndcg@10", "dcg@5", "mrr@10", "recall@10", "ap@10"]:
        u = get_utility(name)
        per_rank = u.per_rank(rankings, relevance, None)
        assert per_rank.shape == rankings.shape
        assert torch.allclose(per_rank.sum(-1), u.whole(rankings, relevance, None))
        assert (per_rank[..., u.depth :] == 0).all()  # nothing beyond the cut-off


def test_rank_gains_give_the_whole_utility_where_the_utility_is_linear_in_gains():
    relevance, rankings = random_graded_problem(seed=1)
    mask = torch.ones_like(relevance, dtype=torch.bool)
    mask[::2, -5:] = False  # padded slots with real grades: neither gained nor in the ideal
    rankings = torch.stack([torch.cat([r[m], r[~m]]) for r, m in zip(torch.arange(30).expand(25, 30), mask)])
    rankings = rankings.unsqueeze(1)  # (B, 1, n): the real candidates first, as in every sampled ranking
    for name in ["ndcg@10", "dcg@5", "recall@10", "ndcg@100"]:
        u = get_utility(name)
        gains, theta = u.rank_gains(relevance, mask)
        K = min(u.depth, rankings.shape[-1])
        linear = (torch.gather(gains, 1, rankings[:, 0, :K]) * theta[:K]).sum(-1)
        assert torch.allclose(linear, u.whole(rankings, relevance, mask)[:, 0]), name
        assert (gains[~mask] == 0).all()
    assert get_utility("mrr@10").rank_gains is None and get_utility("ap@10").rank_gains is None


def test_zero_relevance_gives_zero_utility():
    rankings = torch.arange(6).view(1, 1, 6)
    for name in ["ndcg@10", "mrr@10", "recall@10", "ap@10"]:
        assert get_utility(name).whole(rankings, torch.zeros(1, 6), None).item() == 0.0


def test_padded_slots_count_as_non_relevant():
    relevance = torch.tensor([[1.0, 0.0, 5.0]])
    mask = torch.tensor([[True, True, False]])
    ranking = torch.tensor([[[0, 1, 2]]])
    # the padded slot's grade 5 is neither gained nor part of the ideal ordering
    assert get_utility("ndcg@10").whole(ranking, relevance, mask).item() == pytest.approx(1.0)


def test_custom_callable_utility(tmp_path, monkeypatch):
    module = tmp_path / "my_utilities.py"
    module.write_text(
        "def top_is_best(rankings, relevance, mask):\n"
        "    import torch\n"
        "    top = torch.take_along_dim(relevance.unsqueeze(1), rankings[..., :1], dim=-1)[..., 0]\n"
        "    return (top == relevance.max(-1, keepdim=True).values).to(relevance.dtype)\n"
        "top_is_best.depth = 1\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    u = get_utility("my_utilities:top_is_best")
    assert u.depth == 1 and u.per_rank is None
    relevance = torch.tensor([[0.0, 2.0, 1.0]])
    assert u.whole(torch.tensor([[[1], [2]]]), relevance, None).tolist() == [[1.0, 0.0]]


@pytest.mark.parametrize("name", ["ndcg", "foo@10", "ndcg@0", "nope.module:fn"])
def test_bad_utility_names(name):
    with pytest.raises(ValueError):
        get_utility(name)


def test_cached_discount_table_changes_no_result():
    """The DCG discounts are built once per (K, device, dtype): results equal a fresh build, whatever the call order."""
    from pgrank.core.estimators import policy_gradient
    from pgrank.core.ranking_utility import _discount_table

    devices = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])
    calls = [(dev, dtype, n, util) for dev in devices for dtype in (torch.float32, torch.float64)
             for n, util in ((30, "ndcg@10"), (7, "ndcg@10"), (30, "dcg@5"), (4, "ndcg@3"))]

    def run(dev, dtype, n, util):
        g = torch.Generator().manual_seed(n)
        scores = torch.randn(3, n, generator=g, dtype=dtype).to(dev).requires_grad_(True)
        relevance = torch.randint(0, 3, (3, n), generator=g).to(dev, dtype)
        gen = torch.Generator(device=dev).manual_seed(1)
        out = policy_gradient(scores, relevance, num_samples=6, utility=util, temperature=0.5, generator=gen)
        out.loss.backward()
        return out.loss.detach(), out.utility, scores.grad

    _discount_table.cache_clear()
    first = {c: run(*c) for c in calls}  # each (K, device, dtype) built on first use, then reused
    again = {c: run(*c) for c in reversed(calls)}  # all from the cache, in another order
    for c in calls:
        _discount_table.cache_clear()  # a fresh build for this call alone
        fresh = run(*c)
        for a, b, f in zip(first[c], again[c], fresh):
            assert torch.equal(a, b) and torch.equal(a, f), c
    table = _discount_table(10, torch.device("cpu"), torch.float64)
    assert torch.equal(table, 1.0 / torch.log2(torch.arange(2, 12, dtype=torch.float64)))
    assert not table.requires_grad
    with torch.inference_mode():
        _discount_table.cache_clear()
        get_utility("ndcg@3").whole(torch.tensor([[[0, 1, 2]]]), torch.ones(1, 3), None)
    assert not _discount_table(3, torch.device("cpu"), torch.float32).is_inference()
