"""Benchmark: one training step of each mode, the estimator's share of it, and tower:both memory.

Measures (real all-MiniLM-L6-v2 by default, synthetic texts, one step = forward + backward of a
batch through :func:`pgrank.training.trainer.accumulate_gradients`):

* throughput in queries/s for ``tower: query`` and ``tower: both`` at ``n`` candidates per query;
* the estimator's share of a step: :func:`pgrank.core.estimators.policy_gradient` forward + backward on
  scores of the same shape, over the whole step's time (target <= 5% at n=100);
* peak memory of ``tower: both`` at 1000 vs 100 candidates, with cached-gradient chunking and without
  (chunk = n), as the increase of the process's peak RSS over its RSS before the step, each in a
  fresh process (target ratio <= 1.3 chunked, against ~10 unchunked).

Prints; asserts nothing. Usage: ``python bench/training.py [--model minilm] [--doc-len 64]``.
"""

from __future__ import annotations

import argparse
import json
import random
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

WORDS = ("protein cell gene study trial dose risk model data effect river solar market tax vaccine "
         "climate carbon neural quantum coral glacier engine policy analysis results method").split()


def _text(rng: random.Random, n: int) -> str:
    return " ".join(rng.choice(WORDS) for _ in range(n))


def _setup(model_name: str, tower: str, n: int, chunk: int, doc_len: int, queries: int, tmp: Path):
    from pgrank.config import load_params
    from pgrank.models.hub import load_encoder
    from pgrank.retrieval.dense.corpus_embeddings import build_corpus_embeddings
    from pgrank.training.batches import Example, FrozenDocuments, make_batch

    rng = random.Random(0)
    params = load_params(ROOT / "params.yaml", [
        f"train.tower={tower}", f"train.grad_chunk_size={chunk}", f"train.max_doc_length={doc_len}",
        "train.max_query_length=32", "train.pg.num_samples=200", "train.warm_starts=[minilm]",
        "evaluate.systems={dense: [minilm]}", "evaluate.policy_epochs=[]", "train.amp=off"])
    corpus = {f"d{i}": {"title": "", "text": _text(rng, doc_len)} for i in range(n * queries)}
    examples = [Example(f"q{b}", _text(rng, 8), tuple(f"d{b * n + j}" for j in range(n)),
                        tuple(float(j < 2) for j in range(n))) for b in range(queries)]
    model = load_encoder(model_name, params.models, device="cpu", max_seq_length=doc_len)
    model.train()
    frozen = None
    if tower == "query":
        emb = build_corpus_embeddings(lambda: model, "bench", corpus, tmp / "emb", corpus_sha256="0" * 64,
                                      max_seq_length=doc_len, batch_size=64, chunk_size=4096, show_progress=False)
        frozen = FrozenDocuments(emb)
    return params, model, make_batch(examples), frozen, corpus


def step_time(model_name: str, tower: str, n: int, queries: int, doc_len: int, repeats: int) -> tuple[float, float]:
    """(seconds per step, seconds of the estimator alone on the same shapes)."""
    from pgrank.core.estimators import policy_gradient
    from pgrank.training.trainer import accumulate_gradients

    with tempfile.TemporaryDirectory() as tmp:
        params, model, batch, frozen, corpus = _setup(model_name, tower, n, 64, doc_len, queries, Path(tmp))
        best = float("inf")
        for _ in range(repeats + 1):  # the first is a warm-up
            model.zero_grad(set_to_none=True)
            start = time.perf_counter()
            accumulate_gradients(model, batch, params, epoch=1, frozen=frozen, corpus=corpus)
            best = min(best, time.perf_counter() - start)
        pg = params.train.pg
        est = float("inf")
        for _ in range(repeats + 1):
            scores = torch.randn(batch.relevance.shape, requires_grad=True)
            start = time.perf_counter()
            policy_gradient(scores, batch.relevance, batch.mask, num_samples=pg.num_samples, utility=pg.utility,
                            temperature=pg.temperature, entropy_coef=pg.entropy_coef).loss.backward()
            est = min(est, time.perf_counter() - start)
    return best, est


def _rss_kb() -> int:
    with open("/proc/self/status") as fh:
        return next(int(line.split()[1]) for line in fh if line.startswith("VmRSS"))


def memory_child(model_name: str, n: int, chunk: int, doc_len: int) -> None:
    """Run in a fresh process: print the peak-RSS increase (MiB) of one tower:both step."""
    from pgrank.training.trainer import accumulate_gradients

    with tempfile.TemporaryDirectory() as tmp:
        params, model, batch, frozen, corpus = _setup(model_name, "both", n, chunk, doc_len, 1, Path(tmp))
        import gc

        gc.collect()
        before = _rss_kb()
        peak_before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        accumulate_gradients(model, batch, params, epoch=1, frozen=None, corpus=corpus)
        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    print(json.dumps({"increase_mib": (max(peak, peak_before) - before) / 1024}))


def memory(model_name: str, n: int, chunk: int, doc_len: int) -> float:
    out = subprocess.run([sys.executable, __file__, "--memory-child", model_name, str(n), str(chunk), str(doc_len)],
                         capture_output=True, text=True, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])["increase_mib"]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="minilm")
    ap.add_argument("--candidates", "-n", type=int, default=100)
    ap.add_argument("--doc-len", type=int, default=64)
    ap.add_argument("--queries", type=int, default=8, help="queries per step for tower: query")
    ap.add_argument("--both-queries", type=int, default=1, help="queries per step for tower: both")
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--chunk", type=int, default=64)
    ap.add_argument("--skip-memory", action="store_true")
    ap.add_argument("--memory-child", nargs=4, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.memory_child:
        name, n, chunk, doc_len = args.memory_child
        memory_child(name, int(n), int(chunk), int(doc_len))
        return
    print(f"model={args.model} n={args.candidates} doc_len={args.doc_len} threads={torch.get_num_threads()}")
    for tower, queries in (("query", args.queries), ("both", args.both_queries)):
        step, est = step_time(args.model, tower, args.candidates, queries, args.doc_len, args.repeats)
        print(f"tower={tower:5s} {queries} queries/step: {queries / step:8.2f} queries/s  "
              f"step {step * 1e3:8.1f} ms, estimator {est * 1e3:6.1f} ms = {100 * est / step:5.2f}% of the step")
    if args.skip_memory:
        return
    rows = {}
    for label, chunk_of in (("chunked", lambda n: args.chunk), ("unchunked", lambda n: n)):
        small, large = (memory(args.model, n, chunk_of(n), args.doc_len) for n in (100, 1000))
        rows[label] = large / small
        print(f"tower=both {label:9s} peak RSS increase: n=100 {small:8.1f} MiB, n=1000 {large:8.1f} MiB, "
              f"ratio {large / small:5.2f}")


if __name__ == "__main__":
    main()
