"""``pgrank.core.trec_eval``: the cut of a run for MRR@k keeps what trec_eval's own order keeps at a tie."""

from __future__ import annotations

import pytrec_eval

from pgrank.core.trec_eval import evaluate_run, trec_eval_cut


def test_the_cut_breaks_score_ties_as_trec_eval_does_a_longer_id_before_its_prefix():
    """trec_eval orders tied documents by ``strcmp`` of their ids, descending: ``d10`` before ``d1``, ``b`` before
    ``a``. pytrec_eval's reciprocal rank over the whole run says where it puts the relevant one; the cut keeps the same
    documents in front."""
    qrels = {"q": {"d1": 1}}
    run = {"q": {"d1": 1.0, "d10": 1.0, "a": 1.0, "e": 0.5}}
    full = pytrec_eval.RelevanceEvaluator(qrels, {"recip_rank"}).evaluate(run)["q"]["recip_rank"]
    assert full == 0.5  # trec_eval: d10, d1, a, e
    assert list(trec_eval_cut(run, 2)["q"]) == ["d10", "d1"]
    assert list(trec_eval_cut(run, 1)["q"]) == ["d10"]
    assert evaluate_run(qrels, run, ks=[10], mrr_k=1)[1]["q"]["mrr@1"] == 0.0
    assert evaluate_run(qrels, run, ks=[10], mrr_k=2)[1]["q"]["mrr@2"] == full


def test_the_cut_of_a_long_run_equals_a_full_sort_whatever_ties_cross_the_cut_off():
    import random

    rng = random.Random(0)
    for _ in range(200):
        n, k = rng.randint(1, 60), rng.randint(1, 15)
        docs = {f"d{rng.randint(0, 10**6)}": float(rng.randint(0, 5)) for _ in range(n)}  # many ties
        full = sorted(docs.items(), reverse=True)
        full.sort(key=lambda kv: -kv[1])
        assert list(trec_eval_cut({"q": docs}, k)["q"].items()) == full[:k]
