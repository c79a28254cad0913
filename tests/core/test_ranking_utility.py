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
