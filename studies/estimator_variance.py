"""Question: How far is each policy-gradient estimator's gradient from the exact one, per second of compute?
Record: ``studies/out/estimator_variance.json``
Page: ``docs/findings/robust.md``

Benchmark: each policy-gradient estimator's error against the exact gradient, per second of compute.

On REAL score distributions: the warm start's (all-MiniLM-L6-v2, the demo's) scores of the demo's training
queries (SciFact ``train-pg``) over their mined candidates (100 per query), as the demo trains on them
(``tower: query``: frozen document embeddings, the warm start's query encoder, ``train.similarity``). For each
temperature, estimator (``whole``, ``per_rank``: the paper's; ``plrank3``: PL-Rank-3) and number of sampled
rankings ``N``, it measures:

* ``MSE`` — the mean over queries and repeats of ``||g_hat - g||^2``, the squared error of the estimate of
  ``d E[nDCG@10] / d scores`` summed over the candidates (unbiased estimators: the variance);
* ``CPU s`` — the least processor time of one estimate for all the queries at once (sampling,
  log-probabilities, weights, backward to the scores; no model), on one thread (``--threads``): processor time
  of one thread rather than wall time, so that other work on a shared machine inflates it little (with more
  threads, those waiting at a barrier for a descheduled one spin and count); the wall time is recorded too;
* ``MSE x CPU s`` — the error per second of compute: the error the estimator reaches with one second of it
  (MSE falls as ``1/N`` and time grows as ``N``, so this is nearly constant in ``N``); lower is better.

The exact gradient of a 100-candidate Plackett-Luce policy is not enumerable. The reference ``g`` is a PL-Rank-3
estimate from ``--reference-samples`` rankings per query (independent of the measured ones), drawn in
``--reference-parts`` parts; the spread of the parts gives the reference's own error, ``E||g_ref - g||^2``,
which adds to every measured MSE (independent draws) and is subtracted from it. It is printed, so that the
corrected figures can be judged.

Writes ``studies/out/estimator_variance.json`` (atomically) with a machine record, prints a markdown table.
A benchmark, never a test. Needs the demo's candidates: ``PGRANK_BEIR_MIRROR=M pgrank
--profile demo repro mine-train``. Usage::

    python studies/estimator_variance.py                         # 200 queries, N in 100 200 1000 5000, T 0.05 0.2 1
    python studies/estimator_variance.py --queries 0 --repeats 5   # every training query (~4x longer)
"""

from __future__ import annotations

import argparse
import math
import sys
import time
from pathlib import Path

import numpy as np
import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))  # record: the plumbing shared with bench/

from pgrank.core.estimators import policy_gradient  # noqa: E402
from record import add_out_option, new_record, save  # noqa: E402

ESTIMATORS = ("whole", "per_rank", "plrank3")
UTILITY = "ndcg@10"


def demo_scores(queries: int, seed: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, dict]:
    """``(scores, relevance, mask)`` of the demo's training queries under the warm start, ``(Q, n)`` each."""
    from pgrank.config import load_params
    from pgrank.data.corpus_store import open_corpus
    from pgrank.models.loading import load_encoder
    from pgrank.models.names import resolve_model
    from pgrank.paths import CARVED_TRAIN, Paths
    from pgrank.training.batches import candidate_scores, make_batch
    from pgrank.training.grad_cache import encode
    from pgrank.training.batches import frozen_documents, training_set

    params = load_params(ROOT / "params.yaml", profile="demo")
    paths = Paths.from_config(params.paths, ROOT)
    cfg = params.train
    dataset = params.data.train.split("/")[0]
    corpus = open_corpus(paths, dataset)
    examples = training_set(paths, dataset, CARVED_TRAIN, corpus)
    chosen = range(len(examples)) if not queries or queries >= len(examples) else \
        sorted(np.random.default_rng(seed).choice(len(examples), queries, replace=False).tolist())
    batch = make_batch(examples.examples(chosen))
    ref = resolve_model(cfg.warm_starts[0], params.models)
    frozen = frozen_documents(params, paths, ref, corpus)
    model = load_encoder(ref, params.models, device="cpu", max_seq_length=cfg.max_doc_length).eval()
    with torch.no_grad():
        q = encode(model, [ex.query for ex in batch.examples], task="query", max_length=cfg.max_query_length)
        docs = frozen.vectors(batch.unique_rows, torch.device("cpu"))
        scores = candidate_scores(q, docs, batch.index, cfg.similarity)
    source = {"dataset": f"{dataset}/{CARVED_TRAIN}", "queries": len(batch.examples), "of": len(examples),
              "candidates": int(batch.mask.sum(-1).max()), "warm_start": ref.key, "similarity": cfg.similarity,
              "relevant_per_query": float((batch.relevance > 0).sum(-1).float().mean())}
    return scores, batch.relevance, batch.mask, source


def estimate(scores, relevance, mask, estimator: str, N: int, T: float, seed: int) -> tuple[torch.Tensor, float, float]:
    """``(Q, n)`` one estimate of ``d E[nDCG@10] / d scores`` per query, its processor time and its wall time."""
    s = scores.clone().requires_grad_(True)
    cpu, wall = time.process_time(), time.perf_counter()
    out = policy_gradient(s, relevance, mask, num_samples=N, utility=UTILITY, estimator=estimator, temperature=T,
                          generator=torch.Generator().manual_seed(seed))
    out.loss.backward()
    cpu, wall = time.process_time() - cpu, time.perf_counter() - wall
    return -s.grad * s.shape[0], cpu, wall  # the loss averages over queries


def reference(scores, relevance, mask, T: float, samples: int, parts: int, seed: int) -> tuple[torch.Tensor, float]:
    """PL-Rank-3 from ``samples`` rankings per query in ``parts`` parts: the mean, and its own mean squared error
    ``E||g_ref - g||^2`` per query from the parts' spread."""
    per_part = samples // parts
    estimates = torch.stack([estimate(scores, relevance, mask, "plrank3", per_part, T, seed + p)[0]
                             for p in range(parts)])  # (parts, Q, n)
    mean = estimates.mean(0)
    own = ((estimates - mean) ** 2).sum(-1).sum(0) / (parts - 1) / parts  # (Q,) variance of the mean
    return mean, own.mean().item()


TITLE = "Policy-gradient estimators: error against the exact gradient per second of compute"


def render(record: dict) -> str:
    """The Markdown this script prints: one row per temperature, N and estimator."""
    source, rows = record["source"], record["rows"]
    lines = [f"{source['queries']} {source['dataset']} queries x {source['candidates']} candidates, "
             f"{source['warm_start']} scores, {record['utility']}; {record['repeats']} estimates each; reference: "
             f"PL-Rank-3 at {record['reference']['samples']:,} rankings per query; "
             f"{record['machine'].get('torch_threads', 1)} thread(s).", "",
             "| T | N | estimator | MSE | relative MSE | MSE / per_rank's | CPU s | MSE x CPU s |",
             "|---:|---:|---|---:|---:|---:|---:|---:|"]
    for row in rows:
        base = next((x for x in rows if (x["temperature"], x["N"], x["estimator"]) ==
                     (row["temperature"], row["N"], "per_rank")), None)
        ratio = f"{row['mse'] / base['mse']:.2f}" if base and base["mse"] > 0 else "-"
        lines.append(f"| {row['temperature']:g} | {row['N']} | {row['estimator']} | {row['mse']:.3g} "
                     f"| {row['relative_mse']:.3g} | {ratio} | {row['cpu_seconds']:.3f} | {row['mse_x_cpu_seconds']:.3g} |")
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--queries", type=int, default=200, help="random training queries (seeded); 0: all")
    ap.add_argument("-N", "--samples", type=int, nargs="+", default=[100, 200, 1000, 5000])
    ap.add_argument("-T", "--temperatures", type=float, nargs="+", default=[0.05, 0.2, 1.0])
    ap.add_argument("--estimators", nargs="+", default=list(ESTIMATORS), choices=ESTIMATORS)
    ap.add_argument("--repeats", type=int, default=3, help="independent estimates per query and setting")
    ap.add_argument("--reference-samples", type=int, default=100_000)
    ap.add_argument("--reference-parts", type=int, default=20)
    ap.add_argument("--threads", type=int, default=1, help="torch threads (1: processor time is compute time)")
    ap.add_argument("--seed", type=int, default=0)
    add_out_option(ap, __file__)
    args = ap.parse_args()

    started = time.perf_counter()
    scores, relevance, mask, source = demo_scores(args.queries, args.seed)
    torch.set_num_threads(args.threads)
    print(f"{source['queries']} of {source['of']} {source['dataset']} queries, {source['candidates']} candidates, "
          f"{source['relevant_per_query']:.2f} relevant per query; {torch.get_num_threads()} threads", flush=True)
    rows = []
    for T in args.temperatures:
        g, ref_mse = reference(scores, relevance, mask, T, args.reference_samples, args.reference_parts, seed=10**6)
        norm = (g**2).sum(-1).mean().item()
        print(f"T={T}: mean ||g||^2 = {norm:.4g}, reference's own error {ref_mse:.3g} ({ref_mse / norm:.2%} of it)",
              flush=True)
        for N in args.samples:
            for estimator in args.estimators:
                errors, cpus, walls = [], [], []
                for r in range(args.repeats):
                    est, cpu, wall = estimate(scores, relevance, mask, estimator, N, T, seed=1000 * r + N)
                    errors.append(((est - g) ** 2).sum(-1).mean().item())
                    cpus.append(cpu)
                    walls.append(wall)
                mse = float(np.mean(errors)) - ref_mse
                rows.append({"temperature": T, "N": N, "estimator": estimator, "mse": mse, "relative_mse": mse / norm,
                             "cpu_seconds": min(cpus), "wall_seconds": min(walls), "mse_x_cpu_seconds": mse * min(cpus),
                             "reference_mse": ref_mse, "grad_sq_norm": norm})
                print(f"  N={N:<5} {estimator:<8} MSE {mse:.4g} (relative {mse / norm:.3g}), {min(cpus):.3f} CPU s, "
                      f"{min(walls):.3f} s", flush=True)

    record = new_record(TITLE)
    record["machine"]["torch_threads"] = torch.get_num_threads()
    record.update({"source": source, "utility": UTILITY, "repeats": args.repeats,
                   "reference": {"estimator": "plrank3", "samples": args.reference_samples,
                                 "parts": args.reference_parts},
                   "wall_seconds": time.perf_counter() - started, "rows": rows})
    save(record, args.out, render)
    print(f"\nwall time {record['wall_seconds']:.0f} s; written {args.out}")


if __name__ == "__main__":
    main()
