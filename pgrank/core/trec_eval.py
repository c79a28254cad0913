"""Run evaluation with pytrec_eval: a pure function ``(qrels, run, ks) -> metrics``.

Graded relevance is kept as in trec_eval (``ndcg_cut`` gains are the grades). The caller's run is
never mutated: documents whose id equals the query id are dropped from a *copy* when asked (BEIR
does it in place).

Metric names: ``ndcg@k``, ``mrr@k`` (reciprocal rank of the run cut at ``k``), ``recall@k``,
``map@k``, ``precision@k``.
"""

from __future__ import annotations

import heapq
from collections.abc import Iterable, Mapping

Run = Mapping[str, Mapping[str, float]]
Qrels = Mapping[str, Mapping[str, int]]


def without_identical_ids(run: Run) -> dict[str, dict[str, float]]:
    """A copy of ``run`` without documents whose id equals their query's id."""
    return {qid: {d: s for d, s in docs.items() if d != qid} for qid, docs in run.items()}


def trec_eval_cut(run: Run, k: int) -> dict[str, dict[str, float]]:
    """A copy of ``run`` cut to each query's ``k`` best documents (ties: trec_eval's order, ``strcmp`` of the
    document ids descending, which for UTF-8 is code point order: a longer id sorts before its own prefix)."""
    out = {}
    for qid, docs in run.items():
        if len(docs) > k:  # only the documents scoring at least the k-th best can be cut to: sort those alone
            kth = heapq.nlargest(k, docs.values())[-1]
            docs = {d: s for d, s in docs.items() if s >= kth}
        ranked = sorted(docs.items(), reverse=True)  # id descending (ids are unique), then a stable sort by score
        ranked.sort(key=lambda kv: -kv[1])
        out[qid] = dict(ranked[:k])
    return out


def evaluate_run(
    qrels: Qrels,
    run: Run,
    ks: Iterable[int] = (1, 3, 5, 10, 100),
    *,
    mrr_k: int = 10,
    ignore_identical_ids: bool = False,
) -> tuple[dict[str, float], dict[str, dict[str, float]]]:
    """Evaluate ``run`` against ``qrels``.

    Args:
        qrels: ``{qid: {doc_id: grade}}``.
        run: ``{qid: {doc_id: score}}`` (higher is better).
        ks: cut-offs for nDCG, recall, MAP and precision.
        mrr_k: cut-off of the reciprocal rank.
        ignore_identical_ids: drop documents whose id equals the query id (BEIR's default).

    Returns:
        ``(means, per_query)``: metric -> mean, and qid -> metric -> value. As in BEIR's
        ``EvaluateRetrieval.evaluate``, the mean is over the queries pytrec_eval evaluates (those of
        the qrels that the run answers); a query the run omits is absent, not zero.
    """
    import pytrec_eval

    ks = sorted(set(int(k) for k in ks))
    run = without_identical_ids(run) if ignore_identical_ids else {q: dict(d) for q, d in run.items()}
    qrels = {q: dict(d) for q, d in qrels.items()}
    kk = ",".join(map(str, ks))
    measures = {f"ndcg_cut.{kk}", f"recall.{kk}", f"map_cut.{kk}", f"P.{kk}"}
    evaluator = pytrec_eval.RelevanceEvaluator(qrels, measures)
    scores = evaluator.evaluate(run)
    rr = pytrec_eval.RelevanceEvaluator(qrels, {"recip_rank"}).evaluate(trec_eval_cut(run, mrr_k))
    per_query: dict[str, dict[str, float]] = {}
    for qid, row in scores.items():
        values = {}
        for k in ks:
            values[f"ndcg@{k}"] = row.get(f"ndcg_cut_{k}", 0.0)
            values[f"recall@{k}"] = row.get(f"recall_{k}", 0.0)
            values[f"map@{k}"] = row.get(f"map_cut_{k}", 0.0)
            values[f"precision@{k}"] = row.get(f"P_{k}", 0.0)
        values[f"mrr@{mrr_k}"] = rr.get(qid, {}).get("recip_rank", 0.0)
        per_query[qid] = values
    return mean_metrics(per_query), per_query


def mean_metrics(per_query: Mapping[str, Mapping[str, float]]) -> dict[str, float]:
    """Metric -> mean over the queries (what :func:`evaluate_run` returns; per-query values of several
    chunks of a run, evaluated one chunk at a time, average to the same means)."""
    n = max(1, len(per_query))
    names = next(iter(per_query.values())).keys() if per_query else []
    return {m: sum(v[m] for v in per_query.values()) / n for m in names}
