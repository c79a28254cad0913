"""Benchmark of ``pgrank mine``: encoding throughput, BM25 speed, peak memory. Measures; never asserts.

1. Corpus encoding throughput (docs/s) of the mining path (:func:`pgrank.retrieval.dense.corpus_embeddings.build_corpus_embeddings`:
   shards, float16, atomic writes) as a ratio to a bare ``SentenceTransformer.encode`` of the same
   texts, in the same process; runs alternate and the best of ``--repeats`` counts. Target >= 0.95.
2. BM25 index time and search time (all test queries, top ``--k``) on scifact and nfcorpus.
3. Peak RSS (VmHWM) of a fresh child process that mines scifact test (``--rss-sources``).

Data: the BEIR zips of ``--mirror`` (default: ``$PGRANK_BEIR_MIRROR``), unzipped to a temporary
folder. Writes ``bench/out/mining.json`` (``--out``; with the machine) and prints its tables. Sizes are arguments so
that a CPU run takes a couple of minutes::

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
from record import add_mirror_option, add_out_option, new_record, save, table  # noqa: E402

TITLE = "pgrank mine: corpus encoding against bare sentence-transformers, BM25 speed, peak memory"


def unzip(mirror: Path, data: Path, names: list[str]) -> None:
    for name in names:
        if not (data / name / "corpus.jsonl").is_file():
            with zipfile.ZipFile(mirror / f"{name}.zip") as zf:
                zf.extractall(data)


def bench_encoding(args, params, data: Path, work: Path) -> dict:
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
    print(f"  encoding: bare {len(texts) / min(bare):.1f} docs/s, mining path {len(texts) / min(mined):.1f} docs/s",
          flush=True)
    return {"model": args.model, "docs": len(texts), "max_seq_length": args.max_seq_length, "batch": args.batch_size,
            "chunk_size": args.chunk_size, "device": args.device, "bare_s": bare, "mined_s": mined}


def bench_bm25(args, params, data: Path, work: Path) -> dict:
    from pgrank.data.beir import load_qrels, load_queries
    from pgrank.data.corpus_store import open_corpus
    from pgrank.retrieval.bm25.index import build_bm25_index

    bm25 = params.mine.bm25
    paths = Paths(root=work / "runs", data=data, embeddings=work / "embeddings")
    out = {"k1": bm25.k1, "b": bm25.b, "method": bm25.method, "stemmer": bm25.stemmer, "k": args.k, "datasets": []}
    for name in ("scifact", "nfcorpus"):
        store = open_corpus(paths, name)  # the corpus store, built untimed (it is the download's, not BM25's)
        qrels = load_qrels(data / name / "qrels" / "test.tsv")
        all_queries = load_queries(data / name)
        queries = [all_queries[q] for q in qrels]
        t = time.perf_counter()
        index = build_bm25_index(store, bm25, work / f"bm25-{name}")
        t_index = time.perf_counter() - t
        t = time.perf_counter()
        index.search(index.token_ids(queries), args.k)
        t_search = time.perf_counter() - t
        out["datasets"].append({"dataset": name, "docs": len(store), "queries": len(queries), "index_s": t_index,
                                "search_s": t_search})
        print(f"  bm25 {name}: indexed in {t_index:.2f} s, searched in {t_search:.2f} s", flush=True)
    return out


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


def bench_rss(args, work: Path, data: Path) -> dict:
    ctx = mp.get_context("spawn")
    out = {"model": args.model, "max_seq_length": args.rss_max_seq_length, "k": args.k, "sources": []}
    for source in args.rss_sources.split(","):
        overrides = [f"paths.root={work / 'runs'}", f"paths.data={data}", f"paths.embeddings={work / f'rss-emb-{source}'}",
                     f"mine.source={source}", f"mine.model={args.model}", f"mine.max_seq_length={args.rss_max_seq_length}",
                     f"mine.batch_size={args.batch_size}", f"mine.candidates={args.k}"]
        queue = ctx.Queue()
        t = time.perf_counter()
        child = ctx.Process(target=_mine_child, args=(overrides, str(work), queue))
        child.start()
        child.join()
        if child.exitcode != 0:
            out["sources"].append({"source": source, "exit_code": child.exitcode})
            print(f"  rss {source}: the mining child failed (exit code {child.exitcode})", flush=True)
            continue
        peak = queue.get(timeout=10)
        out["sources"].append({"source": source, "seconds": time.perf_counter() - t, "peak_mib": peak})
        print(f"  rss {source}: peak {peak:.0f} MiB", flush=True)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_mirror_option(parser)
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
    add_out_option(parser, __file__)
    args = parser.parse_args()

    params = load_params(ROOT / "params.yaml")
    skip = set(filter(None, args.skip.split(",")))
    record = new_record(TITLE)
    record.update(cpus=os.cpu_count(), threads=__import__("torch").get_num_threads())
    with tempfile.TemporaryDirectory(prefix="pgrank-bench-") as tmp:
        work = Path(tmp)
        data = work / "data"
        unzip(Path(args.mirror), data, ["scifact", "nfcorpus"])
        if "encoding" not in skip:
            record["encoding"] = bench_encoding(args, params, data, work)
        if "bm25" not in skip:
            record["bm25"] = bench_bm25(args, params, data, work)
        if "rss" not in skip:
            record["rss"] = bench_rss(args, work, data)
    save(record, args.out, render)


def render(record: dict) -> str:
    """The record as the Markdown the script prints."""
    out = [f"pgrank mine benchmark ({record['cpus']} CPUs, torch threads {record['threads']})"]
    if e := record.get("encoding"):
        bare, mined, n = min(e["bare_s"]), min(e["mined_s"]), e["docs"]
        out += ["", f"Corpus encoding ({e['model']}, {n} scifact docs, max_seq_length {e['max_seq_length']}, batch "
                f"{e['batch']}, {-(-n // e['chunk_size'])} shards of {e['chunk_size']}, {e['device']}; best of "
                f"{len(e['bare_s'])} alternating runs):", ""]
        out += table(["path", "docs/s", "runs"], [
            ["bare SentenceTransformer.encode", f"{n / bare:.1f}", ", ".join(f"{x:.1f}s" for x in e["bare_s"])],
            ["mining path (shards, fp16)", f"{n / mined:.1f}", ", ".join(f"{x:.1f}s" for x in e["mined_s"])]], "lrl")
        out += ["", f"ratio mining / bare: {bare / mined:.3f} (target >= 0.95)"]
    if b := record.get("bm25"):
        out += ["", f"BM25 (k1={b['k1']}, b={b['b']}, {b['method']}, stemmer {b['stemmer']}; top {b['k']} of every "
                "test query):", ""]
        out += table(["dataset", "docs", "index s", "queries", "search s", "queries/s"],
                     [[d["dataset"], d["docs"], f"{d['index_s']:.2f}", d["queries"], f"{d['search_s']:.2f}",
                       f"{d['queries'] / d['search_s']:.0f}"] for d in b["datasets"]], "lrrrrr")
    if r := record.get("rss"):
        dense = any(x["source"] == "dense" for x in r["sources"])
        out += ["", f"Peak RSS while mining scifact test (a fresh child process, VmHWM; 5183 docs, 300 queries x "
                f"{r['k']} candidates" + (f"; dense: {r['model']} at max_seq_length {r['max_seq_length']}, from "
                                          "scratch" if dense else "") + "):", ""]
        out += table(["source", "seconds", "peak RSS MiB"],
                     [[x["source"], f"{x['seconds']:.1f}", f"{x['peak_mib']:.0f}"] if "peak_mib" in x
                      else [x["source"], f"failed (exit code {x['exit_code']})", ""] for x in r["sources"]], "lrr")
    return "\n".join(out)


if __name__ == "__main__":
    main()
