"""Benchmark: the policy-gradient estimator against its floor and against a naive loop.

Measures, for B queries of n candidates, top-K utility and N sampled rankings per query:

* ``estimator`` — one full :func:`pgrank.core.estimators.pg_loss` call, forward and backward
  (Gumbel sampling, exact log-probabilities, per-rank nDCG@K credit, leave-one-out baseline).
* ``floor`` — only drawing the same ``B*N*n`` Gumbel numbers and taking the top-K: the work any
  sampler of N rankings must do. Ratio ``estimator / floor`` (target <= 1.5).
* ``loop`` — a straightforward reference that loops over samples and places in Python, computing
  the same loss (checked to give the same gradient on shared rankings). Ratio ``loop / estimator``
  (target >= 50 at N=1000). The loop is timed on the first ``--loop-queries`` queries and scaled
  linearly to B (its cost is exactly linear in the number of queries).

Writes ``bench/out/estimator.json`` (``--out``; with the machine) and prints its table; asserts nothing about
time. Usage::

    python bench/estimator.py                 # B=8, n=1000, K=10, N in 100 1000 5000
    python bench/estimator.py -N 100 1000 --loop-samples 0 --repeats 20   # ratios only, no loop
    python bench/estimator.py --device cuda
"""

from __future__ import annotations

import argparse
import math
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from record import add_out_option, new_record, save, table  # noqa: E402

from pgrank.core.estimators import pg_loss  # noqa: E402
from pgrank.core.policy import placement_log_probs  # noqa: E402

TITLE = "The policy-gradient estimator against its sampling floor and a naive Python loop"


def _sync(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.synchronize()


def best_time(fn, repeats: int, device: str) -> float:
    fn()  # warm-up
    _sync(device)
    best = math.inf
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        _sync(device)
        best = min(best, time.perf_counter() - start)
    return best


def floor(logits: torch.Tensor, N: int, K: int, gen: torch.Generator) -> torch.Tensor:
    B, n = logits.shape
    # the fastest Gumbel draw we know of here (uniform + two logs; torch's CPU exponential_ is ~5x slower)
    noise = torch.empty(B, N, n, device=logits.device).uniform_(torch.finfo(torch.float32).tiny, 1.0, generator=gen)
    return noise.log_().neg_().log_().neg_().add_(logits.unsqueeze(1)).topk(K, dim=-1).indices


def loop_reference(scores, relevance, N: int, K: int, temperature: float, gen, rankings=None):
    """Per-query, per-sample, per-place Python loops; same loss as pg_loss(per_rank, loo, ndcg@K)."""
    B, n = scores.shape
    logits = scores / temperature
    discounts = [1.0 / math.log2(k + 2) for k in range(K)]
    total = scores.new_zeros(())
    for b in range(B):
        ideal = sorted(relevance[b].tolist(), reverse=True)[:K]
        idcg = sum(g * d for g, d in zip(ideal, discounts))
        rewards, logps = [], []
        for i in range(N):
            if rankings is None:
                gumbel = -torch.empty(n, device=scores.device).uniform_(1e-38, 1.0, generator=gen).log().neg().log()
                ranking = (logits[b].detach() + gumbel).topk(K).indices.tolist()
            else:
                ranking = rankings[b, i].tolist()
            remaining = torch.ones(n, dtype=torch.bool, device=scores.device)
            step_logps, gains = [], []
            for k, doc in enumerate(ranking):
                step_logps.append(logits[b, doc] - torch.logsumexp(logits[b][remaining], 0))
                remaining = remaining.clone()  # the indexing above saved the old mask for backward
                remaining[doc] = False
                gains.append(float(relevance[b, doc]) * discounts[k] / idcg if idcg > 0 else 0.0)
            to_go = [sum(gains[k:]) for k in range(K)]
            rewards.append(to_go)
            logps.append(step_logps)
        for i in range(N):
            for k in range(K):
                others = sum(rewards[j][k] for j in range(N) if j != i) / (N - 1)
                total = total - (rewards[i][k] - others) * logps[i][k]
    return total / (B * N)


def check_reference(device: str) -> float:
    """Max abs gradient difference between the loop and the vectorised estimator on shared rankings."""
    g = torch.Generator(device=device).manual_seed(0)
    scores = torch.randn(2, 40, device=device, dtype=torch.float64, generator=g)
    relevance = (torch.rand(2, 40, device=device, generator=g) > 0.8).double()
    rankings = floor(scores.float() / 0.5, 6, 10, g)
    a = scores.clone().requires_grad_(True)
    loop_reference(a, relevance, 6, 10, 0.5, g, rankings=rankings).backward()
    b = scores.clone().requires_grad_(True)
    lp = placement_log_probs(b / 0.5, rankings)
    from pgrank.core.ranking_utility import get_utility

    contrib = get_utility("ndcg@10").per_rank(rankings, relevance, None)
    to_go = contrib.flip(-1).cumsum(-1).flip(-1)
    adv = to_go - (to_go.sum(1, keepdim=True) - to_go) / 5
    (-(adv * lp).sum(-1).mean()).backward()
    return (a.grad - b.grad).abs().max().item()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--queries", "-B", type=int, default=8)
    ap.add_argument("--candidates", "-n", type=int, default=1000)
    ap.add_argument("--depth", "-K", type=int, default=10)
    ap.add_argument("--samples", "-N", type=int, nargs="+", default=[100, 1000, 5000])
    ap.add_argument("--loop-samples", type=int, nargs="+", default=[100, 1000], help="N values to run the loop at")
    ap.add_argument("--loop-queries", type=int, default=1)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--device", default="cpu")
    add_out_option(ap, __file__)
    args = ap.parse_args()
    dev, B, n, K = args.device, args.queries, args.candidates, args.depth
    T = 0.05
    record = new_record(TITLE)
    record.update(device=dev, threads=torch.get_num_threads(), torch=torch.__version__, queries=B, candidates=n,
                  depth=K, temperature=T, repeats=args.repeats, loop_queries=args.loop_queries,
                  reference_check=check_reference(dev), rows=[])
    g = torch.Generator(device=dev).manual_seed(0)
    scores = torch.randn(B, n, device=dev, generator=g) * 5
    relevance = (torch.rand(B, n, device=dev, generator=g) > 0.99).float() * torch.randint(1, 3, (B, n), device=dev, generator=g)
    for N in args.samples:
        s = scores.clone().requires_grad_(True)

        def run_estimator():
            s.grad = None
            pg_loss(s, relevance, num_samples=N, temperature=T, entropy_coef=0.01, generator=g).backward()

        t_est = best_time(run_estimator, args.repeats, dev)
        t_floor = best_time(lambda: floor(scores / T, N, K, g), args.repeats, dev)
        t_loop = None
        if N in args.loop_samples:
            q = args.loop_queries
            sub = scores[:q].clone().requires_grad_(True)
            start = time.perf_counter()
            loop_reference(sub, relevance[:q], N, K, T, g).backward()
            _sync(dev)
            t_loop = (time.perf_counter() - start) * B / q
        record["rows"].append({"samples": N, "estimator_ms": t_est * 1e3, "floor_ms": t_floor * 1e3,
                               "loop_ms": None if t_loop is None else t_loop * 1e3})
        print(f"  N={N}: estimator {t_est * 1e3:.1f} ms, floor {t_floor * 1e3:.1f} ms", flush=True)
    save(record, args.out, render)


def render(record: dict) -> str:
    """The record as the Markdown table the script prints."""
    r = record
    rows = [[row["samples"], f"{row['estimator_ms']:.1f}", f"{row['floor_ms']:.1f}",
             f"{row['estimator_ms'] / row['floor_ms']:.2f}",
             "-" if row["loop_ms"] is None else f"{row['loop_ms']:.0f}",
             "-" if row["loop_ms"] is None else f"{row['loop_ms'] / row['estimator_ms']:.0f}x"] for row in r["rows"]]
    return "\n".join([
        f"device={r['device']} threads={r['threads']} torch={r['torch']} B={r['queries']} n={r['candidates']} "
        f"K={r['depth']} T={r['temperature']}, best of {r['repeats']}; reference check: "
        f"max |grad(loop) - grad(pg_loss)| = {r['reference_check']:.2e}", "",
        *table(["N", "estimator ms", "floor ms", "est/floor", "loop ms", "loop/est"], rows, "rrrrrr"), "",
        "estimator: one `pg_loss` forward and backward; floor: drawing the same B·N·n Gumbel numbers and taking the "
        f"top K alone; loop: the per-sample Python reference, timed on {r['loop_queries']} "
        "quer" + ("y" if r["loop_queries"] == 1 else "ies") + " and scaled to B."])


if __name__ == "__main__":
    main()
