"""Benchmark: exact first-stage search, the torch backend against the FAISS ``IndexFlatIP`` backend, side by side.

Both run :func:`pgrank.retrieval.dense.exact_search.dense_search` on the same random unit float32 vectors,
streamed in blocks as the corpus-embedding artifact streams them, with the same deterministic tie order;
the figure is the best of ``--repeats`` runs after one warm-up on a few queries. Also reports whether the
two backends returned the same rows (as they should, up to last-bit rounding of near-tied scores).

Prints; asserts nothing. Usage: ``python bench/search.py [--docs 100000] [--queries 300] [--dim 384]``.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def unit(rng: np.random.Generator, n: int, dim: int) -> np.ndarray:
    x = rng.standard_normal((n, dim), dtype=np.float32)
    return x / np.linalg.norm(x, axis=1, keepdims=True)


def main() -> None:
    import torch

    from pgrank.data.runs import id_ranks
    from pgrank.retrieval.dense.exact_search import auto_search_backend, dense_search, faiss_gpu_available

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--docs", type=int, default=100_000)
    ap.add_argument("--dim", type=int, default=384)
    ap.add_argument("--queries", type=int, default=300)
    ap.add_argument("--k", type=int, default=1000)
    ap.add_argument("--block", type=int, default=65_536, help="corpus rows per streamed block")
    ap.add_argument("--repeats", type=int, default=3)
    args = ap.parse_args()
    rng = np.random.default_rng(0)
    docs, queries = unit(rng, args.docs, args.dim), unit(rng, args.queries, args.dim)
    blocks = [(lo, docs[lo : lo + args.block]) for lo in range(0, args.docs, args.block)]
    ranks = id_ranks([f"d{i}" for i in range(args.docs)])

    best, results = {}, {}
    for backend in ("torch", "faiss"):
        dense_search(queries[:4], blocks, ranks, args.k, backend=backend)  # warm-up (imports, threads)
        times = []
        for _ in range(args.repeats):
            start = time.perf_counter()
            results[backend] = dense_search(queries, blocks, ranks, args.k, backend=backend)
            times.append(time.perf_counter() - start)
        best[backend] = min(times)

    print(f"exact search: {args.queries} queries x {args.docs} docs x {args.dim} dims, top {args.k}, blocks of "
          f"{args.block} rows, best of {args.repeats} (torch threads={torch.get_num_threads()}, FAISS GPU: "
          f"{faiss_gpu_available()}, auto -> {auto_search_backend()})")
    print("| backend | seconds | queries/s | time / torch |\n|---|---:|---:|---:|")
    for backend, seconds in best.items():
        print(f"| {backend} | {seconds:.3f} | {args.queries / seconds:.0f} | {seconds / best['torch']:.2f} |")
    (ts, tr), (fs, fr) = results["torch"], results["faiss"]
    print(f"ratio faiss/torch = {best['faiss'] / best['torch']:.2f}; rows identical: {np.mean(tr == fr):.6f} of "
          f"entries; max |score difference| = {np.abs(ts - fs).max():.2e}")


if __name__ == "__main__":
    main()
