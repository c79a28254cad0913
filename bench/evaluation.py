"""Benchmark: second-stage evaluation cost.

Scoring every candidate of every query from the corpus-embedding artifact and evaluating the run with
pytrec_eval (what ``pgrank evaluate`` does after encoding), reported per 1000 candidates. First-stage
search (both backends of :func:`pgrank.retrieval.dense.exact_search.dense_search` side by side) is
``bench/search.py``.

Writes ``bench/out/evaluation.json`` (``--out``; with the machine) and prints its figures; asserts nothing. Usage:
``python bench/evaluation.py [--docs 100000] [--queries 300]``.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from record import add_out_option, new_record, save, table  # noqa: E402

TITLE = "Second-stage evaluation: scoring every candidate from the corpus embeddings, then pytrec_eval"


def main() -> None:
    from pgrank.atomic import write_json
    from pgrank.core.trec_eval import evaluate_run
    from pgrank.retrieval.dense.corpus_embeddings import FORMAT, open_corpus_embeddings

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--docs", type=int, default=100_000)
    ap.add_argument("--dim", type=int, default=384)
    ap.add_argument("--queries", type=int, default=300)
    ap.add_argument("--candidates", type=int, default=1000)
    ap.add_argument("--shard", type=int, default=65536)
    add_out_option(ap, __file__)
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
    record = new_record(TITLE)
    record.update(docs=args.docs, dim=args.dim, queries=args.queries, candidates=args.candidates, shard=args.shard,
                  scoring_s=scored, total_s=total)
    save(record, args.out, render)


def render(record: dict) -> str:
    """The record as the Markdown the script prints."""
    r = record
    per_1000 = r["total_s"] / (r["queries"] * r["candidates"] / 1000)
    return "\n".join([
        f"second stage: {r['queries']} queries x {r['candidates']} candidates from {r['docs']:,} float16 embeddings "
        f"of {r['dim']} dims (shards of {r['shard']:,})", "",
        *table(["scoring s", "with pytrec_eval s", "ms per 1000 candidates"],
               [[f"{r['scoring_s']:.2f}", f"{r['total_s']:.2f}", f"{per_1000 * 1e3:.2f}"]], "rrr")])


if __name__ == "__main__":
    main()
