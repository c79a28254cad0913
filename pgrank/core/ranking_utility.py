"""Ranking utilities Delta(r|q) (paper Sec. "Setting"), batched over queries and sampled rankings.

Named utilities are *prefix-decomposable*: ``Delta(r) = sum_k c_k(r_{1:k})``, the contribution at
place ``k`` depending only on the first ``k`` places. That is what the per-rank credit estimator
(Eq. 9) needs, so every named utility exposes ``per_rank`` contributions; ``whole`` is their sum.

Gains follow trec_eval / pytrec_eval exactly: ``ndcg_cut`` uses the relevance grade itself as the
gain (not ``2^rel - 1``) with discount ``1 / log2(rank + 1)``, the ideal DCG comes from the grades of
all candidates, and a document is relevant when its grade is ``>= 1``. With integer qrels (BEIR's)
these equal trec_eval's ``ndcg_cut_k``, ``recip_rank`` (cut at ``k``), ``recall_k`` and
``map_cut_k`` whenever every judged-relevant document is in the candidate set, which is how
:mod:`pgrank.mining.candidate_sets` builds candidate sets.

``dcg``, ``ndcg`` and ``recall`` are moreover *linear in the placed documents' gains*,
``Delta(r) = sum_k theta_k g(r_k)`` (a weight per place times a gain per document), the form PL-Rank-3
(:mod:`pgrank.core.plrank`) needs; ``rr`` and ``ap`` read the prefix above each place, so are not.

A custom utility is any importable callable, named ``"module:function"``, with signature
``fn(rankings (B, N, K) long, relevance (B, n), mask (B, n) bool) -> (B, N)``. It may declare how
many leading places it reads with an integer attribute ``fn.depth`` (default: the whole ranking).

Example:
    >>> u = get_utility("ndcg@10")
    >>> u.depth
    10
"""

from __future__ import annotations

import functools
import importlib
import re
from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import Tensor

from pgrank.core.policy import rank_mask

PerRank = Callable[[Tensor, Tensor, int], Tensor]  # (ranked_rel (B,N,K), relevance (B,n), k) -> (B,N,K)


@functools.lru_cache(maxsize=64)
def _discount_table(K: int, device: torch.device, dtype: torch.dtype) -> Tensor:
    """``1 / log2(j + 1)`` for places ``j = 1..K``: a constant, built once per (K, device, dtype) and never
    written to (callers only read it), so the cache changes no result, only the per-call cost."""
    with torch.inference_mode(False), torch.no_grad():  # a plain tensor even if first asked for under inference_mode
        return 1.0 / torch.log2(torch.arange(2, K + 2, device=device, dtype=dtype))  # (K,)


def _discounts(K: int, like: Tensor) -> Tensor:
    return _discount_table(K, like.device, like.dtype)


def _cut(contrib: Tensor, k: int) -> Tensor:
    K = contrib.shape[-1]
    if k >= K:
        return contrib
    keep = torch.arange(K, device=contrib.device) < k
    return contrib * keep


def dcg_per_rank(ranked_rel: Tensor, relevance: Tensor, k: int) -> Tensor:
    """DCG@k contributions ``rel(r_j) / log2(j + 1)`` for places ``j <= k``."""
    return _cut(ranked_rel.clamp_min(0) * _discounts(ranked_rel.shape[-1], ranked_rel), k)


def ideal_dcg(relevance: Tensor, k: int) -> Tensor:
    """``(B,)`` DCG@k of the ideal ordering of each query's candidates."""
    kk = min(k, relevance.shape[-1])
    top = relevance.clamp_min(0).topk(kk, dim=-1).values  # (B, kk)
    return (top * _discounts(kk, top)).sum(-1)


def ndcg_per_rank(ranked_rel: Tensor, relevance: Tensor, k: int) -> Tensor:
    """nDCG@k contributions: DCG@k contributions over the ideal DCG@k (0 for queries with none)."""
    idcg = ideal_dcg(relevance, k)  # (B,)
    scale = (idcg > 0) / idcg.clamp_min(torch.finfo(idcg.dtype).tiny)  # 1 / idcg, or 0
    return dcg_per_rank(ranked_rel, relevance, k) * scale.view(-1, 1, 1)


def rr_per_rank(ranked_rel: Tensor, relevance: Tensor, k: int) -> Tensor:
    """Reciprocal rank@k: ``1/j`` at the first relevant place ``j <= k``, 0 elsewhere."""
    rel = (ranked_rel >= 1).to(ranked_rel.dtype)
    first = rel * (rel.cumsum(-1) == 1)
    places = torch.arange(1, rel.shape[-1] + 1, device=rel.device, dtype=rel.dtype)
    return _cut(first / places, k)


def _num_relevant(relevance: Tensor) -> Tensor:
    return (relevance >= 1).sum(-1).to(relevance.dtype).view(-1, 1, 1)  # (B, 1, 1)


def recall_per_rank(ranked_rel: Tensor, relevance: Tensor, k: int) -> Tensor:
    """Recall@k: ``1/R`` at each relevant place ``j <= k`` (``R`` = relevant candidates; 0 if none)."""
    R = _num_relevant(relevance)
    rel = (ranked_rel >= 1).to(ranked_rel.dtype)
    return _cut(torch.where(R > 0, rel / R.clamp_min(1), torch.zeros_like(rel)), k)


def ap_per_rank(ranked_rel: Tensor, relevance: Tensor, k: int) -> Tensor:
    """Average precision@k (trec_eval ``map_cut``): ``precision@j / R`` at each relevant place ``j <= k``."""
    R = _num_relevant(relevance)
    rel = (ranked_rel >= 1).to(ranked_rel.dtype)
    places = torch.arange(1, rel.shape[-1] + 1, device=rel.device, dtype=rel.dtype)
    prec = rel.cumsum(-1) / places
    return _cut(torch.where(R > 0, rel * prec / R.clamp_min(1), torch.zeros_like(rel)), k)


def _dcg_gains(relevance: Tensor, k: int) -> tuple[Tensor, Tensor]:
    return relevance.clamp_min(0), _discounts(k, relevance)


def _ndcg_gains(relevance: Tensor, k: int) -> tuple[Tensor, Tensor]:
    idcg = ideal_dcg(relevance, k)  # (B,)
    scale = (idcg > 0) / idcg.clamp_min(torch.finfo(idcg.dtype).tiny)  # 1 / idcg, or 0
    return relevance.clamp_min(0) * scale.unsqueeze(-1), _discounts(k, relevance)


def _recall_gains(relevance: Tensor, k: int) -> tuple[Tensor, Tensor]:
    R = (relevance >= 1).sum(-1, keepdim=True).to(relevance.dtype)  # (B, 1)
    return (relevance >= 1) / R.clamp_min(1), torch.ones(k, dtype=relevance.dtype, device=relevance.device)


# One dict for dispatch by name (STYLE.md principle 5).
PER_RANK: dict[str, PerRank] = {
    "dcg": dcg_per_rank,
    "ndcg": ndcg_per_rank,
    "rr": rr_per_rank,
    "mrr": rr_per_rank,
    "recall": recall_per_rank,
    "ap": ap_per_rank,
    "map": ap_per_rank,
}

# (relevance (B, n), k) -> (gains (B, n), place weights theta (k,)) with Delta(r) = sum_{j <= k} theta_j g(r_j).
RankGains = Callable[[Tensor, int], tuple[Tensor, Tensor]]

# The utilities of that form, by name (those absent read the prefix above each place).
RANK_GAINS: dict[str, RankGains] = {"dcg": _dcg_gains, "ndcg": _ndcg_gains, "recall": _recall_gains}

_NAMED = re.compile(r"^(?P<name>[a-z]+)@(?P<k>\d+)$")


@dataclass(frozen=True)
class Utility:
    """A utility resolved from its name.

    Attributes:
        name: as given, e.g. ``"ndcg@10"`` or ``"mypkg.metrics:bleu"``.
        depth: leading places the utility reads (``None``: the whole ranking).
        per_rank: ``(rankings, relevance, mask) -> (B, N, K)`` contributions, or ``None`` when the
            utility is not prefix-decomposable (custom callables).
        whole: ``(rankings, relevance, mask) -> (B, N)`` utility of each sampled ranking.
        rank_gains: ``(relevance, mask) -> (gains (B, n), theta (depth,))`` with ``Delta(r) = sum_k theta_k
            gains[r_k]`` (gains 0 at padded slots), or ``None`` when the utility is not of that form (rr, ap,
            custom callables).
    """

    name: str
    depth: int | None
    per_rank: Callable[[Tensor, Tensor, Tensor | None], Tensor] | None
    whole: Callable[[Tensor, Tensor, Tensor | None], Tensor]
    rank_gains: Callable[[Tensor, Tensor | None], tuple[Tensor, Tensor]] | None = None


def ranked_relevance(rankings: Tensor, relevance: Tensor, mask: Tensor | None) -> Tensor:
    """``(B, N, K)`` grades in ranked order; 0 at places beyond a query's real candidates."""
    rel = relevance if mask is None else torch.where(mask, relevance, torch.zeros_like(relevance))
    return _ranked(rankings, rel, mask)


def _ranked(rankings: Tensor, rel: Tensor, mask: Tensor | None) -> Tensor:
    """:func:`ranked_relevance` of grades ``rel`` already 0 at padded slots."""
    B, N, K = rankings.shape
    ranked = torch.gather(rel, 1, rankings.reshape(B, N * K)).reshape(B, N, K)
    return ranked if mask is None else ranked * rank_mask(mask, rankings)


def _named(name: str, fn: PerRank, k: int, linear: RankGains | None) -> Utility:
    def per_rank(rankings: Tensor, relevance: Tensor, mask: Tensor | None = None) -> Tensor:
        rel = relevance if mask is None else torch.where(mask, relevance, torch.zeros_like(relevance))
        return fn(_ranked(rankings, rel, mask), rel, k)

    def whole(rankings: Tensor, relevance: Tensor, mask: Tensor | None = None) -> Tensor:
        return per_rank(rankings, relevance, mask).sum(-1)

    def rank_gains(relevance: Tensor, mask: Tensor | None = None) -> tuple[Tensor, Tensor]:
        rel = relevance if mask is None else torch.where(mask, relevance, torch.zeros_like(relevance))
        return linear(rel, k)

    return Utility(name=name, depth=k, per_rank=per_rank, whole=whole, rank_gains=None if linear is None else rank_gains)


def get_utility(name: str) -> Utility:
    """Resolve ``"ndcg@10"``, ``"dcg@5"``, ``"mrr@10"``, ``"recall@100"``, ``"ap@10"`` or ``"module:function"``.

    Raises:
        ValueError: unknown name, ``k < 1``, or a custom callable that cannot be imported.
    """
    m = _NAMED.match(name)
    if m:
        return _named_utility(name)
    if ":" in name:
        module, _, attr = name.partition(":")
        try:
            fn = getattr(importlib.import_module(module), attr)
        except (ImportError, AttributeError) as exc:
            raise ValueError(f"utility {name!r}: cannot import ({exc})") from None
        depth = getattr(fn, "depth", None)
        return Utility(name=name, depth=None if depth is None else int(depth), per_rank=None, whole=fn)
    raise ValueError(f"unknown utility {name!r}; expected NAME@K (ndcg, dcg, mrr, recall, ap) or 'module:function'")


@functools.lru_cache(maxsize=64)
def _named_utility(name: str) -> Utility:
    """A ``NAME@K`` utility, resolved once per name (the estimator asks on every call; a Utility is immutable)."""
    m = _NAMED.match(name)
    base, k = m["name"], int(m["k"])
    if base not in PER_RANK:
        raise ValueError(f"unknown utility {name!r}; known: {sorted(PER_RANK)} as NAME@K, or 'module:function'")
    if k < 1:
        raise ValueError(f"utility {name!r}: the cut-off must be >= 1")
    return _named(name, PER_RANK[base], k, RANK_GAINS.get(base))
