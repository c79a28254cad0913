"""Benchmark of ``pgrank mine``: encoding throughput, BM25 speed, peak memory. Measures; never asserts.

1. Corpus encoding throughput (docs/s) of the mining path (:func:`pgrank.retrieval.dense.corpus_embeddings.build_corpus_embeddings`:
   shards, float16, atomic writes) as a ratio to a bare ``SentenceTransformer.encode`` of the same
   texts, in the same process; runs alternate and the best of ``--repeats`` counts. Target >= 0.95.
2. BM25 index time and search time (all test queries, top ``--k``) on scifact and nfcorpus.
3. Peak RSS (VmHWM) of a fresh child process that mines scifact test (``--rss-sources``).

Data: the BEIR zips of ``--mirror`` (default: the shared offline mirror), unzipped to a temporary
folder. Sizes are arguments so that a CPU run takes a couple of minutes::

    python bench/mining.py --docs 256 --chunk-size 64 --repeats 3
    python bench/mining.py --skip encoding,bm25 --rss-sources bm25,dense   # dense from scratch: ~5 min on 2 CPUs
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import os
import resource
import sys
import tempfile
import time
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

from pgrank.config import load_params  # noqa: E402
from pgrank.paths import Paths  # noqa: E402


def unzip(mirror: Path, data: Path, names: list[str]) -> None:
    for name in names:
        if not (data / name / "corpus.jsonl").is_file():
            with zipfile.ZipFile(mirror / f"{name}.zip") as zf:
                zf.extractall(data)


def bench_encoding(args, params, data: Path, work: Path) -> None:
    from pgrank.data.beir import document_text, load_corpus
    from pgrank.models.loading import load_encoder
    from pgrank.models.names import resolve_model
    from pgrank.retrieval.dense.corpus_embeddings import build_corpus_embeddings

    corpus = load_corpus(data / "scifact", progress=False)
    corpus = dict(list(corpus.items())[: args.docs])
    texts = [document_text(d) for d in corpus.values()]
    ref = resolve_model(args.model, params.models)
    model = load_encoder(ref, params.models, device=args.device, max_seq_length=args.max_seq_length)
    model.encode(texts[: args.batch_size], batch_size=args.batch_size)  # warm-up

    bare, mined = [], []
    for rep in range(args.repeats):
        t = time.perf_counter()
        model.encode(texts, batch_size=args.batch_size)
        bare.append(time.perf_counter() - t)
        t = time.perf_counter()
        build_corpus_embeddings(lambda: model, ref.key, corpus, work / f"emb-{rep}", corpus_sha256="0" * 64,
                                max_seq_length=args.max_seq_length, batch_size=args.batch_size,
                                chunk_size=args.chunk_size, show_progress=False)
        mined.append(time.perf_counter() - t)
    n = len(texts)
    print(f"\n## Corpus encoding ({args.model}, {n} scifact docs, max_seq_length {args.max_seq_length}, "
          f"batch {args.batch_size}, {-(-n // args.chunk_size)} shards of {args.chunk_size}, {args.device})")
    print(f"bare SentenceTransformer.encode : {n / min(bare):8.1f} docs/s   (runs: {', '.join(f'{x:.1f}s' for x in bare)})")
    print(f"mining path (shards, fp16)     : {n / min(mined):8.1f} docs/s   (runs: {', '.join(f'{x:.1f}s' for x in mined)})")
    print(f"ratio mining / bare            : {min(bare) / min(mined):8.3f}   (target >= 0.95)")


def bench_bm25(args, params, data: Path) -> None:
    from pgrank.data.beir import load_corpus, load_qrels, load_queries
    from pgrank.retrieval.bm25.index import bm25_search, build_bm25

    print(f"\n## BM25 (k1={params.mine.bm25.k1}, b={params.mine.bm25.b}, {params.mine.bm25.method}, "
          f"stemmer {params.mine.bm25.stemmer}; top {args.k} of every test query)")
    for name in ("scifact", "nfcorpus"):
        corpus = load_corpus(data / name, progress=False)
        qrels = load_qrels(data / name / "qrels" / "test.tsv")
        all_queries = load_queries(data / name)
        queries = [all_queries[q] for q in qrels]
        t = time.perf_counter()
        index = build_bm25(corpus, params.mine.bm25)
        t_index = time.perf_counter() - t
        t = time.perf_counter()
        bm25_search(index, queries, k=args.k)
        t_search = time.perf_counter() - t
        print(f"{name:9s}: {len(corpus):5d} docs indexed in {t_index:6.2f}s; {len(queries)} queries searched in "
              f"{t_search:6.2f}s ({len(queries) / t_search:7.0f} queries/s)")


def _peak_rss_mib() -> float:
    """This process's peak RSS. VmHWM belongs to the current address space, so unlike ru_maxrss it
    does not count the parent's pages that a fork copied before exec."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
    except OSError:
        pass
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def _mine_child(overrides: list[str], base: str, out) -> None:
    from pgrank.mining.candidate_sets import mine

    params = load_params(ROOT / "params.yaml", overrides)
    mine(params, Paths.from_config(params.paths, base=base), "scifact", "test", progress=False)
    out.put(_peak_rss_mib())


def bench_rss(args, work: Path, data: Path) -> None:
    print("\n## Peak RSS while mining scifact test (a fresh child process, VmHWM)")
    ctx = mp.get_context("spawn")
    for source in args.rss_sources.split(","):
        overrides = [f"paths.root={work / 'runs'}", f"paths.data={data}", f"paths.embeddings={work / f'rss-emb-{source}'}",
                     f"mine.source={source}", f"mine.model={args.model}", f"mine.max_seq_length={args.rss_max_seq_length}",
                     f"mine.batch_size={args.batch_size}", f"mine.candidates={args.k}"]
        out = ctx.Queue()
        t = time.perf_counter()
        child = ctx.Process(target=_mine_child, args=(overrides, str(work), out))
        child.start()
        child.join()
        if child.exitcode != 0:
            print(f"{source:6s}: the mining child failed (exit code {child.exitcode})")
            continue
        peak = out.get(timeout=10)
        extra = f", {args.model} at max_seq_length {args.rss_max_seq_length}, from scratch" if source == "dense" else ""
        print(f"{source:6s}: {time.perf_counter() - t:6.1f}s, peak RSS {peak:7.0f} MiB "
              f"(5183 docs, 300 queries x {args.k} candidates{extra})")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--mirror", type=Path, default=Path(os.environ.get("PGRANK_BEIR_MIRROR", ROOT.parent / "shared" / "data" / "beir")))
    parser.add_argument("--model", default="minilm", help="model for encoding and dense mining (alias, hub id or folder)")
    parser.add_argument("--docs", type=int, default=256, help="scifact documents encoded for the throughput ratio")
    parser.add_argument("--chunk-size", type=int, default=64, help="documents per shard on the mining path")
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--max-seq-length", type=int, default=256)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--k", type=int, default=1000, help="candidates / BM25 depth")
    parser.add_argument("--rss-sources", default="bm25",
                        help="comma-separated sources to mine for the RSS figure; dense encodes all 5183 docs (minutes on CPU)")
    parser.add_argument("--rss-max-seq-length", type=int, default=64, help="dense RSS run: shorter inputs keep CPU time down")
    parser.add_argument("--skip", default="", help="comma-separated parts to skip: encoding, bm25, rss")
    args = parser.parse_args()

    params = load_params(ROOT / "params.yaml")
    skip = set(filter(None, args.skip.split(",")))
    with tempfile.TemporaryDirectory(prefix="pgrank-bench-") as tmp:
        work = Path(tmp)
        data = work / "data"
        unzip(args.mirror, data, ["scifact", "nfcorpus"])
        print(f"# pgrank mine benchmark ({os.cpu_count()} CPUs, torch threads {__import__('torch').get_num_threads()})")
        if "encoding" not in skip:
            bench_encoding(args, params, data, work)
        if "bm25" not in skip:
            bench_bm25(args, params, data)
        if "rss" not in skip:
            bench_rss(args, work, data)


if __name__ == "__main__":
    main()
