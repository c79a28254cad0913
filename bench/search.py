"""Benchmark: exact first-stage search, the torch backend against the NumPy and FAISS ``IndexFlatIP`` backends, side by
side.

All run :func:`pgrank.retrieval.dense.exact_search.dense_search` on the same random unit float32 vectors,
streamed in blocks as the corpus-embedding artifact streams them, with the same deterministic tie order;
the figure is the best of ``--repeats`` runs after one warm-up on a few queries. Also reports whether each
backend returned torch's rows (as it should, up to last-bit rounding of near-tied scores).

Writes ``bench/out/search.json`` (``--out``; with the machine) and prints its table; asserts nothing. Usage:
``python bench/search.py [--docs 100000] [--queries 300] [--dim 384]``.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from record import add_out_option, new_record, save, table  # noqa: E402

TITLE = "Exact first-stage search: the torch backend against NumPy and FAISS IndexFlatIP"


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
    add_out_option(ap, __file__)
    args = ap.parse_args()
    rng = np.random.default_rng(0)
    docs, queries = unit(rng, args.docs, args.dim), unit(rng, args.queries, args.dim)
    blocks = [(lo, docs[lo : lo + args.block]) for lo in range(0, args.docs, args.block)]
    ranks = id_ranks([f"d{i}" for i in range(args.docs)])

    best, results = {}, {}
    for backend in ("torch", "numpy", "faiss"):
        dense_search(queries[:4], blocks, ranks, args.k, backend=backend)  # warm-up (imports, threads)
        times = []
        for _ in range(args.repeats):
            start = time.perf_counter()
            results[backend] = dense_search(queries, blocks, ranks, args.k, backend=backend)
            times.append(time.perf_counter() - start)
        best[backend] = min(times)

    ts, tr = results["torch"]
    record = new_record(TITLE)
    record.update(docs=args.docs, dim=args.dim, queries=args.queries, k=args.k, block=args.block, repeats=args.repeats,
                  threads=torch.get_num_threads(), faiss_gpu=faiss_gpu_available(), auto=auto_search_backend(),
                  backends=[{"backend": b, "seconds": t, "rows_identical": float(np.mean(results[b][1] == tr)),
                             "max_score_difference": float(np.abs(results[b][0] - ts).max())} for b, t in best.items()])
    save(record, args.out, render)


def render(record: dict) -> str:
    """The record as the Markdown the script prints."""
    r = record
    seconds = {row["backend"]: row["seconds"] for row in r["backends"]}
    rows = [[row["backend"], f"{row['seconds']:.3f}", f"{r['queries'] / row['seconds']:.0f}",
             f"{row['seconds'] / seconds['torch']:.2f}", f"{row['rows_identical']:.6f}", f"{row['max_score_difference']:.2e}"]
            for row in r["backends"]]
    return "\n".join([
        f"exact search: {r['queries']} queries x {r['docs']} docs x {r['dim']} dims, top {r['k']}, blocks of "
        f"{r['block']} rows, best of {r['repeats']} (torch threads={r['threads']}, FAISS GPU: {r['faiss_gpu']}, "
        f"auto -> {r['auto']})", "",
        *table(["backend", "seconds", "queries/s", "time / torch", "rows as torch's", "max score difference"], rows,
               "lrrrrr")])


if __name__ == "__main__":
    main()
