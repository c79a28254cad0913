"""Benchmark: second-stage evaluation cost, and FAISS exact search against torch matmul + top-k.

* Second stage: scoring every candidate of every query from the corpus-embedding artifact and
  evaluating the run with pytrec_eval (what ``pgrank evaluate`` does after encoding), reported per
  1000 candidates.
* First stage: :func:`pgrank.retrieval.dense.exact_search.dense_search` (streaming FAISS ``IndexFlatIP`` over the shards,
  deterministic tie order) against a plain ``torch`` matmul + top-k on the same float32 embeddings
  held in memory, as one ratio (target: FAISS path no slower, ratio >= 1). ``bench/search.py`` compares the
  two backends of ``dense_search`` (``search.backend``: torch, faiss) side by side.

Prints; asserts nothing. Usage: ``python bench/evaluation.py [--docs 100000] [--queries 300]``.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def main() -> None:
    from pgrank.atomic import write_json
    from pgrank.core.trec_eval import evaluate_run
    from pgrank.data.runs import id_ranks
    from pgrank.retrieval.dense.corpus_embeddings import FORMAT, open_corpus_embeddings
    from pgrank.retrieval.dense.exact_search import dense_search

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--docs", type=int, default=100_000)
    ap.add_argument("--dim", type=int, default=384)
    ap.add_argument("--queries", type=int, default=300)
    ap.add_argument("--candidates", type=int, default=1000)
    ap.add_argument("--k", type=int, default=1000)
    ap.add_argument("--shard", type=int, default=65536)
    args = ap.parse_args()
    rng = np.random.default_rng(0)
    docs = rng.standard_normal((args.docs, args.dim), dtype=np.float32)
    docs /= np.linalg.norm(docs, axis=1, keepdims=True)
    queries = rng.standard_normal((args.queries, args.dim), dtype=np.float32)
    doc_ids = [f"d{i}" for i in range(args.docs)]
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        for i, lo in enumerate(range(0, args.docs, args.shard)):
            np.save(folder / f"shard-{i:05d}.npy", docs[lo : lo + args.shard].astype(np.float16))
        write_json(folder / "doc_ids.json", doc_ids)
        write_json(folder / "meta.json", {"format": FORMAT, "num_docs": args.docs, "dim": args.dim,
                                          "chunk_size": args.shard})
        emb = open_corpus_embeddings(folder)

        # second stage: score each query's candidates, then evaluate
        cands = [rng.choice(args.docs, args.candidates, replace=False) for _ in range(args.queries)]
        qrels = {f"q{i}": {doc_ids[int(c[0])]: 1} for i, c in enumerate(cands)}
        start = time.perf_counter()
        run = {}
        for i, rows in enumerate(cands):
            scores = emb.vectors(rows) @ queries[i]
            run[f"q{i}"] = {doc_ids[int(r)]: float(s) for r, s in zip(rows, scores)}
        scored = time.perf_counter() - start
        evaluate_run(qrels, run, [1, 3, 5, 10, 100])
        total = time.perf_counter() - start
        per_1000 = total / (args.queries * args.candidates / 1000)
        print(f"second stage: {args.queries} queries x {args.candidates} candidates: scoring {scored:.2f} s, "
              f"with pytrec_eval {total:.2f} s = {per_1000 * 1e3:.2f} ms per 1000 candidates")

        # first stage: FAISS (streaming, exact) vs torch matmul + topk on the same float32 matrix
        full = np.concatenate([emb.shard(i) for i in range(emb.num_shards)]).astype(np.float32)
        ranks = id_ranks(doc_ids)
        dense_search(queries[:4], emb.blocks(), ranks, args.k, backend="faiss")  # warm-up
        start = time.perf_counter()
        dense_search(queries, emb.blocks(), ranks, args.k, backend="faiss")
        t_faiss = time.perf_counter() - start
        d, q = torch.from_numpy(full), torch.from_numpy(queries)
        (q[:4] @ d.T).topk(args.k, dim=1)
        start = time.perf_counter()
        (q @ d.T).topk(args.k, dim=1)
        t_torch = time.perf_counter() - start
        print(f"first stage: {args.queries} queries over {args.docs} x {args.dim}, top {args.k}: "
              f"pgrank.retrieval.dense.exact_search.dense_search (FAISS) {t_faiss:.3f} s, torch matmul+topk {t_torch:.3f} s, "
              f"ratio torch/FAISS {t_torch / t_faiss:.2f} (threads={torch.get_num_threads()})")


if __name__ == "__main__":
    main()
