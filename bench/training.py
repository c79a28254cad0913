"""Benchmark: one training step of each mode, the estimator's share of it, and tower:both memory.

Measures (real all-MiniLM-L6-v2 by default, synthetic texts, the settings of ``--profile``, by default
``demo``: queries per step ``train.batch_size``, ``mine.candidates`` candidates, ``train.pg``; one step =
forward + backward of a batch through :func:`pgrank.training.trainer.accumulate_gradients`, with the frozen
reference policy when ``train.pg.kl_coef > 0``):

* throughput in queries/s for ``tower: query`` and ``tower: both``;
* the estimator's share of a step: :func:`pgrank.core.estimators.policy_gradient` forward + backward,
  called as the trainer calls it (same mask, per-query generators and ``train.pg`` knobs, reference
  scores when ``kl_coef > 0``) on scores of the same shape, over the whole step's time (target <= 5%
  for ``tower: query``);
* peak memory of ``tower: both`` at 1000 vs 100 candidates, with cached-gradient chunking and without
  (chunk = n), as the increase of the process's peak RSS over its RSS before the step, each in a
  fresh process (target ratio <= 1.3 chunked, against ~10 unchunked).

Writes ``bench/out/training.json`` (``--out``; with the machine) and prints its tables; asserts nothing. Usage:
``python bench/training.py [--profile demo] [--skip-both] [--skip-memory]``.
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

import numpy as np
import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from record import add_out_option, new_record, save, table  # noqa: E402

TITLE = "One training step of each tower mode, the estimator's share of it, and tower: both memory"

WORDS = ("protein cell gene study trial dose risk model data effect river solar market tax vaccine "
         "climate carbon neural quantum coral glacier engine policy analysis results method").split()


def _text(rng: random.Random, n: int) -> str:
    return " ".join(rng.choice(WORDS) for _ in range(n))


def _params(profile: str, tower: str, chunk: int, doc_len: int):
    from pgrank.config import load_params

    return load_params(ROOT / "params.yaml", [
        f"train.tower={tower}", f"train.chunk_tokens={chunk * doc_len}", f"train.max_doc_length={doc_len}",
        "train.warm_starts=[minilm]", "evaluate.systems={dense: [minilm]}", "evaluate.policy_epochs=[]",
        "train.amp=off"], profile=profile or None)


def _setup(model_name: str, params, n: int, queries: int, tmp: Path):
    """(model, the step's inputs, frozen documents, reference policy) for one synthetic batch."""
    from pgrank.models.loading import load_encoder
    from pgrank.retrieval.dense.corpus_embeddings import build_corpus_embeddings
    from pgrank.training.batches import Example, FrozenDocuments
    from pgrank.training.reference import ReferencePolicy
    from pgrank.training.step_inputs import prepare_step, scratch_tokens

    cfg = params.train
    rng = random.Random(0)
    # tower: query shares a pool of 4n documents between the queries (encoded once, untimed).
    num_docs = n * queries if cfg.tower == "both" else 4 * n
    corpus = {f"d{i}": {"title": "", "text": _text(rng, cfg.max_doc_length)} for i in range(num_docs)}
    examples = []
    for b in range(queries):
        rows = np.arange(b * n, (b + 1) * n) if cfg.tower == "both" else np.asarray(rng.sample(range(num_docs), n))
        examples.append(Example(f"q{b}", _text(rng, 8), rows.astype(np.int64), (np.arange(n) < 2).astype(np.float32), b))
    model = load_encoder(model_name, params.models, device="cpu", max_seq_length=cfg.max_doc_length)
    model.train()
    frozen = None
    if cfg.tower == "query":
        emb = build_corpus_embeddings(lambda: model, "bench", corpus, tmp / "emb", corpus_sha256="0" * 64,
                                      max_seq_length=cfg.max_doc_length, batch_size=64, chunk_size=4096,
                                      show_progress=False)
        frozen = FrozenDocuments(emb)
        model.train()
    reference = None
    if cfg.pg.kl_coef:
        reference = ReferencePolicy(load_encoder(model_name, params.models, device="cpu",
                                                 max_seq_length=cfg.max_doc_length), cfg)
    texts = [doc["text"] for doc in corpus.values()]
    tokens = scratch_tokens(params, model, texts, [ex.query for ex in examples], tmp / "tokens")
    return model, prepare_step(examples, params, tokens, epoch=1, model=model, device=torch.device("cpu")), frozen, reference


def estimator_time(batch, params, repeats: int, reference_scores=None) -> float:
    """Best seconds of one estimator call (forward + backward) as the trainer makes it, on random scores."""
    from pgrank.core.estimators import policy_gradient
    from pgrank.training.batches import query_generators

    pg = params.train.pg
    qids = [ex.qid for ex in batch.examples]
    best = float("inf")
    for i in range(repeats + 1):  # the first is a warm-up
        scores = torch.randn(batch.relevance.shape, requires_grad=True)
        gens = query_generators(params.train.seed, i, qids, batch.relevance.device)  # the trainer's cost, not timed
        start = time.perf_counter()
        policy_gradient(scores, batch.relevance, batch.mask, num_samples=pg.num_samples, utility=pg.utility,
                        estimator=pg.estimator, baseline=pg.baseline, temperature=pg.temperature,
                        entropy_coef=pg.entropy_coef, entropy=pg.entropy, generator=gens,
                        reference_scores=reference_scores, kl_coef=pg.kl_coef, kl=pg.kl).loss.backward()
        best = min(best, time.perf_counter() - start)
    return best


def step_time(model_name: str, params, n: int, queries: int, repeats: int) -> tuple[float, float]:
    """(seconds per step, seconds of the estimator alone on the same shapes)."""
    from pgrank.training.trainer import accumulate_gradients

    with tempfile.TemporaryDirectory() as tmp:
        model, inputs, frozen, reference = _setup(model_name, params, n, queries, Path(tmp))
        batch = inputs.batch
        best = float("inf")
        for _ in range(repeats + 1):  # the first is a warm-up
            model.zero_grad(set_to_none=True)
            start = time.perf_counter()
            accumulate_gradients(model, inputs, params, epoch=1, frozen=frozen, reference=reference)
            best = min(best, time.perf_counter() - start)
        ref_scores = None if reference is None else reference.scores(inputs, frozen=frozen)
        est = estimator_time(batch, params, repeats, ref_scores)
    return best, est


def _rss_kb() -> int:
    with open("/proc/self/status") as fh:
        return next(int(line.split()[1]) for line in fh if line.startswith("VmRSS"))


def memory_child(model_name: str, profile: str, n: int, chunk: int, doc_len: int) -> None:
    """Run in a fresh process: print the peak-RSS increase (MiB) of one tower:both step."""
    from pgrank.training.trainer import accumulate_gradients

    params = _params(profile, "both", chunk, doc_len)
    with tempfile.TemporaryDirectory() as tmp:
        model, inputs, _, reference = _setup(model_name, params, n, 1, Path(tmp))
        import gc

        gc.collect()
        before = _rss_kb()
        peak_before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        accumulate_gradients(model, inputs, params, epoch=1, frozen=None, reference=reference)
        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    print(json.dumps({"increase_mib": (max(peak, peak_before) - before) / 1024}))


def memory(model_name: str, profile: str, n: int, chunk: int, doc_len: int) -> float:
    out = subprocess.run([sys.executable, __file__, "--memory-child", model_name, profile, str(n), str(chunk),
                          str(doc_len)], capture_output=True, text=True, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])["increase_mib"]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="minilm")
    ap.add_argument("--profile", default="demo", help="profile laid over params.yaml ('' for none)")
    ap.add_argument("--candidates", "-n", type=int, default=None, help="default: the profile's mine.candidates")
    ap.add_argument("--doc-len", type=int, default=64)
    ap.add_argument("--queries", type=int, default=None, help="queries per step for tower: query "
                    "(default: the profile's train.batch_size)")
    ap.add_argument("--both-queries", type=int, default=1, help="queries per step for tower: both")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--chunk", type=int, default=64)
    ap.add_argument("--skip-both", action="store_true", help="time tower: query only")
    ap.add_argument("--skip-memory", action="store_true")
    ap.add_argument("--memory-child", nargs=5, help=argparse.SUPPRESS)
    add_out_option(ap, __file__)
    args = ap.parse_args()
    if args.memory_child:
        name, profile, n, chunk, doc_len = args.memory_child
        memory_child(name, profile, int(n), int(chunk), int(doc_len))
        return
    base = _params(args.profile, "query", args.chunk, args.doc_len)
    n = args.candidates or base.mine.candidates
    queries = args.queries or base.train.batch_size
    pg = base.train.pg
    record = new_record(TITLE)
    record.update(model=args.model, profile=args.profile, candidates=n, doc_len=args.doc_len, chunk=args.chunk,
                  repeats=args.repeats, threads=torch.get_num_threads(),
                  pg={"num_samples": pg.num_samples, "utility": pg.utility, "estimator": pg.estimator,
                      "temperature": pg.temperature, "entropy": pg.entropy, "entropy_coef": pg.entropy_coef,
                      "kl": pg.kl, "kl_coef": pg.kl_coef},
                  towers=[], memory=[])
    towers = [("query", queries)] + ([] if args.skip_both else [("both", args.both_queries)])
    for tower, q in towers:
        params = _params(args.profile, tower, args.chunk, args.doc_len)
        step, est = step_time(args.model, params, n, q, args.repeats)
        record["towers"].append({"tower": tower, "queries": q, "step_s": step, "estimator_s": est})
        print(f"  tower={tower}: step {step * 1e3:.1f} ms, estimator {est * 1e3:.1f} ms", flush=True)
    if not args.skip_memory:
        for label, chunk_of in (("chunked", lambda n: args.chunk), ("unchunked", lambda n: n)):
            small, large = (memory(args.model, args.profile, n, chunk_of(n), args.doc_len) for n in (100, 1000))
            record["memory"].append({"chunks": label, "n100_mib": small, "n1000_mib": large})
            print(f"  tower=both {label}: n=100 {small:.1f} MiB, n=1000 {large:.1f} MiB", flush=True)
    save(record, args.out, render)


def render(record: dict) -> str:
    """The record as the Markdown the script prints."""
    r, pg = record, record["pg"]
    out = [f"model={r['model']} profile={r['profile'] or '-'} n={r['candidates']} doc_len={r['doc_len']} "
           f"threads={r['threads']} pg: N={pg['num_samples']} {pg['utility']} {pg['estimator']} T={pg['temperature']} "
           f"entropy={pg['entropy']}:{pg['entropy_coef']} kl={pg['kl']}:{pg['kl_coef']}; best of {r['repeats']}", ""]
    out += table(["tower", "queries/step", "queries/s", "step ms", "estimator ms", "estimator share"],
                  [[t["tower"], t["queries"], f"{t['queries'] / t['step_s']:.2f}", f"{t['step_s'] * 1e3:.1f}",
                    f"{t['estimator_s'] * 1e3:.1f}", f"{100 * t['estimator_s'] / t['step_s']:.2f}%"] for t in r["towers"]],
                  "lrrrrr")
    if r["memory"]:
        out += ["", f"Peak RSS increase of one `tower: both` step (a fresh process each; chunks of {r['chunk']}, or "
                "unchunked: chunk = n):", ""]
        out += table(["tower=both", "n=100 MiB", "n=1000 MiB", "ratio"],
                     [[m["chunks"], f"{m['n100_mib']:.1f}", f"{m['n1000_mib']:.1f}", f"{m['n1000_mib'] / m['n100_mib']:.2f}"]
                      for m in r["memory"]], "lrrr")
    return "\n".join(out)


if __name__ == "__main__":
    main()
