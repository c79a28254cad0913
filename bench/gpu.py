"""What the paper's configuration costs on the GPU at hand, offline: ``python bench/gpu.py``.

No model is downloaded: the models are random-weight copies of the paper's module stacks at their real sizes
(``bench/paper_models.py``: gtr-t5-xl's 1.2B-parameter T5 encoder with its Dense head, DistilBERT as in SBERT and
TAS-B, and SPLADE's DistilBERT with its masked-language-model head), so throughput and memory are the real
models', whatever their weights. Everything runs through pgrank's own code paths:

1. **Encoding throughput** (documents a second, forward only, :func:`pgrank.models.backends.load_inference_encoder`
   and :func:`pgrank.retrieval.dense.encoding.encode_documents`, tokenization included) of each model under each
   CUDA backend (``torch``: float32 with TF32 matrix products; ``torch-bf16``: bf16 weights, what ``auto`` picks),
   at texts of 32 to 512 tokens, batch ``mine.batch_size`` (128).
2. **Training throughput** of the warm start (DistilBERT): documents and queries a second forward and backward
   under bf16 autocast (``train.amp``), at ``train.max_doc_length`` / ``train.max_query_length``.
3. **Processes per GPU** (``models.processes_per_gpu``): DistilBERT under bf16 encoding 8,192 texts of 256 tokens
   through sentence-transformers' multi-process pool with 1, 2 and 4 processes on each GPU, as
   :func:`pgrank.retrieval.dense.corpus_embeddings.build_corpus_embeddings` runs it.
4. **The estimators alone** (``per_rank``, ``whole``, ``plrank3``) at the paper's shape, on random scores: sampling,
   log-probabilities, credit and backward, milliseconds a batch and peak GPU memory.
5. **One ``tower: both`` step at the paper's shape**: ``train.batch_size`` (220) queries x ``mine.candidates``
   (1000) candidates, every candidate re-encoded with cached gradients (chunks of ``train.chunk_tokens`` tokens),
   ``train.pg.num_samples`` (5000) rankings per query, the paper's estimator: wall time and peak GPU memory,
   through the prefetcher, :func:`pgrank.training.step.accumulate_gradients` and the fused AdamW step, on synthetic
   token stores of MS MARCO's passage lengths (``bench/paper_step.py``).

Every rate comes with the real tokens it processed a second and the share of the device's peak it reaches: the
arithmetic of one item counted by PyTorch's flop counter on the same code path (``bench/flops.py``), against the
GPU's published dense bf16 peak, or, for a device without one in the table (a CPU), the fastest dense product
measured on it (``peak``).

Writes ``bench/out/gpu.json`` (with the machine: GPU, driver, CUDA, library versions) and prints Markdown tables.
On a GPU at the paper's sizes it also writes the GPU's rates into ``pgrank/pipeline/measured_rates.yaml``
(``--rates``; ``bench/rates_table.py``), from which ``pgrank plan`` prices the paper when it is not calibrated on the
machine itself.

Example:
    $ python bench/gpu.py                   # everything, about 8 minutes on one H100
    $ python bench/gpu.py --size tiny --device cpu --seconds 0.2   # a dry run of the script itself
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "bench")]

import paper_models  # noqa: E402
from flops import counted_flops, device_peak, percent, rate, real_tokens, sync, with_arithmetic  # noqa: E402
from record import machine_record  # noqa: E402
from record import add_set_option  # noqa: E402

LENGTHS = (32, 64, 128, 256, 512)
ENCODERS = {"gtr-t5-xl": "gtr-t5", "distilbert (sbert, tas-b)": "sbert", "splade": "splade"}


def encoding(folders: dict[str, Path], device: str, seconds: float, batch: int, lengths, peak: float | None = None
             ) -> list[dict]:
    import torch

    from pgrank.config import ModelsConfig
    from pgrank.models.backends import load_inference_encoder
    from pgrank.paths import Paths
    from pgrank.retrieval.dense.encoding import encode_documents
    from pgrank.retrieval.sparse.splade import encode_sparse, load_sparse_encoder

    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        paths = Paths(root=Path(tmp) / "r", data=Path(tmp) / "d", embeddings=Path(tmp) / "e")
        for label, folder in folders.items():
            sparse = ENCODERS[label] == "splade"
            for backend in (("torch",) if sparse else ("torch", "torch-bf16")):
                if sparse:  # evaluation runs SPLADE in float32 (TF32 products)
                    model = load_sparse_encoder(str(folder), ModelsConfig(), device=device, max_seq_length=max(lengths))
                    run = lambda texts: encode_sparse(model, texts, task="document", batch_size=batch)  # noqa: E731
                else:
                    model, _ = load_inference_encoder(str(folder), ModelsConfig(), paths, device=device,
                                                      max_seq_length=max(lengths), backend=backend)
                    run = lambda texts: encode_documents(model, texts, batch_size=batch)  # noqa: E731
                for length in lengths:
                    # Texts of about `length` tokens (the tokenizer adds its specials; truncation does the rest).
                    texts = [paper_models.text_of_length(length, seed=i) for i in range(batch)]
                    docs_s = rate(lambda: run(texts), batch, device, seconds)
                    flops = counted_flops(lambda: run(texts[:1])) / real_tokens(model, texts[:1])  # one text: no padding
                    tokens = real_tokens(model, texts)
                    rows.append(with_arithmetic({"model": label, "backend": backend, "tokens": length, "batch": batch,
                                                 "docs_per_s": round(docs_s, 1)}, flops * tokens, docs_s, tokens, peak))
                    print(f"  encode {label:<26} {backend:<10} {length:>4} tokens: {docs_s:9.1f} docs/s, "
                          f"{percent(rows[-1]['peak_share'])} of peak", flush=True)
                del model
                if device.startswith("cuda"):
                    torch.cuda.empty_cache()
    return rows


def pool_rates(folder: Path, device: str, batch: int, texts_n: int = 8192) -> list[dict]:
    """Documents a second through the multi-process pool with 1, 2 and 4 processes on every GPU."""
    from pgrank.config import ModelsConfig
    from pgrank.models.backends import load_inference_encoder
    from pgrank.paths import Paths
    from pgrank.retrieval.dense.encoding import encode_documents, encoding_devices

    rows = []
    texts = [paper_models.text_of_length(256, seed=i) for i in range(texts_n)]
    with tempfile.TemporaryDirectory() as tmp:
        paths = Paths(root=Path(tmp) / "r", data=Path(tmp) / "d", embeddings=Path(tmp) / "e")
        model, backend = load_inference_encoder(str(folder), ModelsConfig(), paths, device=device, max_seq_length=256,
                                                backend="torch-bf16")
        for per_gpu in (1, 2, 4):
            devices = encoding_devices(10**9, per_gpu)
            pool = model.start_multi_process_pool(devices) if devices else None
            try:
                encode_documents(model, texts[:1024], batch_size=batch, pool=pool)  # warm-up of every process
                sync(device)
                started = time.perf_counter()
                encode_documents(model, texts, batch_size=batch, pool=pool)
                sync(device)
                docs_s = texts_n / (time.perf_counter() - started)
            finally:
                if pool is not None:
                    model.stop_multi_process_pool(pool)
                    model.to(device)
            rows.append({"model": "distilbert (sbert, tas-b)", "backend": backend, "tokens": 256,
                         "processes_per_gpu": per_gpu, "devices": devices, "docs_per_s": round(docs_s, 1)})
            print(f"  pool   {per_gpu} process(es) per GPU: {docs_s:9.1f} docs/s", flush=True)
    return rows


def training_rates(folder: Path, device: str, seconds: float, params, peak: float | None = None) -> list[dict]:
    """Forward + backward texts a second of the warm start under ``train.amp``, as cached-gradient chunks run."""
    from pgrank.models.loading import load_encoder
    from pgrank.models.packing import run_chunk, text_chunks

    cfg = params.train
    model = load_encoder(str(folder), params.models, device=device, max_seq_length=cfg.max_doc_length).train()
    rows = []
    for task, length in (("document", cfg.max_doc_length), ("document", 80),  # about MS MARCO's mean passage
                         ("query", cfg.max_query_length), ("query", 12)):
        chunk = max(1, min(cfg.chunk_tokens // length, 4096))
        chunks = text_chunks(model, [paper_models.text_of_length(length, seed=i) for i in range(chunk)], task=task,
                             max_length=length, budget=cfg.chunk_tokens)  # tokenized untimed, as a step reads ids

        def step():
            for piece in chunks:
                run_chunk(model, piece, task=task, amp=cfg.amp).sum().backward()

        texts_s = rate(step, chunk, device, seconds)
        flops = counted_flops(step) / chunk  # forward and backward of a text, as the chunks run
        model.zero_grad(set_to_none=True)
        rows.append(with_arithmetic({"model": "distilbert (sbert, tas-b)", "task": task, "tokens": length,
                                     "chunk": chunk, "amp": cfg.amp, "texts_per_s": round(texts_s, 1)},
                                    flops, texts_s, sum(c.real for c in chunks) / chunk, peak))
        print(f"  train  {task:<9} {length:>4} tokens, chunks of {chunk}: {texts_s:9.1f} texts/s, "
              f"{percent(rows[-1]['peak_share'])} of peak", flush=True)
    return rows


def token_encoding(label: str, folder: Path, device: str, seconds: float, lengths, texts: int, batch: int,
                   work: Path, peak: float | None = None) -> tuple[list[dict], bool]:
    """Documents a second through the corpus encoder's token path (``models.backend: auto``: bf16 weights on CUDA;
    float32 on a CPU, where ``auto`` would pick ONNX, which reads strings):
    token-store rows of each length (``bench/paper_step.py``'s synthetic stores), in chunks of at most ``batch x
    max_seq_length`` tokens, packed where the model packs (:func:`pgrank.retrieval.dense.encoding.encode_token_rows`,
    as :func:`pgrank.retrieval.dense.corpus_embeddings.build_corpus_embeddings` runs it). Returns the rows and whether
    packing stayed on (its probe, on the first store, against the padded layout)."""
    import torch

    from paper_step import synthetic_store
    from pgrank.config import ModelsConfig
    from pgrank.models.backends import load_inference_encoder
    from pgrank.models.packing import enable_packing_for, packs
    from pgrank.paths import Paths
    from pgrank.retrieval.dense.encoding import encode_token_rows

    longest = max(lengths)
    paths = Paths(root=work / "r", data=work / "d", embeddings=work / "e")
    model, backend = load_inference_encoder(str(folder), ModelsConfig(), paths, device=device, max_seq_length=longest,
                                            backend="auto" if device.startswith("cuda") else "torch")
    rows = []
    for length in lengths:
        store = synthetic_store(model, work / f"tokens-{length}", np.full(texts, length), task="document",
                                max_length=longest)
        enable_packing_for(model, store)  # the first store's probe decides, as for a corpus
        ids = store.gather(np.arange(texts))
        budget = batch * longest
        run = lambda rows_=ids: encode_token_rows(model, rows_, store.features, budget=budget)  # noqa: E731
        docs_s = rate(run, texts, device, seconds)
        flops = counted_flops(lambda: encode_token_rows(model, ids.take(np.arange(1)), store.features, budget=budget))
        real = float(ids.lengths.mean())
        rows.append(with_arithmetic({"model": label, "backend": backend, "tokens": length, "texts": texts,
                                     "path": "token store, " + ("packed" if packs(model) else "padded"),
                                     "docs_per_s": round(docs_s, 1)}, flops, docs_s, real, peak))
        print(f"  encode {label:<26} {backend:<10} {length:>4} tokens (token path, "
              f"{'packed' if packs(model) else 'padded'}): {docs_s:9.1f} docs/s", flush=True)
    packed = packs(model)
    del model
    if device.startswith("cuda"):
        torch.cuda.empty_cache()
    return rows, packed


def paper_step(folder: Path, device: str, params, queries: int, candidates: int, work: Path,
               peak: float | None = None) -> dict:
    """One ``tower: both`` optimizer step at the paper's shape, as ``bench/paper_step.py`` times it (synthetic token
    stores, the prefetcher, the trainer's step, its fused optimizer): the median of 3 timed steps after a warm-up,
    its arithmetic counted on a step of 2 queries and scaled by the documents' real tokens."""
    from paper_step import synthetic_tokens, timed_steps
    from pgrank.models.loading import load_encoder
    from pgrank.training.step import accumulate_gradients

    cfg = params.train
    model = load_encoder(str(folder), params.models, device=device, max_seq_length=cfg.max_doc_length).train()
    tokens, examples = synthetic_tokens(model, params, work, queries, candidates)
    out = timed_steps(model, params, tokens, examples)
    from pgrank.training.step_inputs import prepare_step
    import torch

    two = prepare_step(examples[:2], params, tokens, epoch=1, model=model, device=torch.device(device))
    flops = counted_flops(lambda: accumulate_gradients(model, two, params, epoch=1, frozen=None))
    model.zero_grad(set_to_none=True)
    lengths = tokens.documents.lengths(np.arange(len(tokens.documents)))
    warm_tokens, all_tokens = int(lengths[: 2 * candidates].sum()), int(lengths.sum())
    with_arithmetic(out, flops / warm_tokens * all_tokens, 1 / out["seconds"], all_tokens, peak)
    print(f"  step   {queries} x {candidates} (tower both, {cfg.pg.num_samples} rankings/query): {out['seconds']:.1f} s, "
          f"{percent(out['peak_share'])} of peak, peak memory {out['peak_gib']} GiB", flush=True)
    return out


ESTIMATORS = ("per_rank", "whole", "plrank3")


def estimators_at_paper_shape(device: str, params, queries: int, candidates: int, seconds: float) -> list[dict]:
    """The policy gradient alone (sampling, log-probabilities, credit, backward) on random scores of the paper's
    shape, for every estimator, the rest of ``train.pg`` as configured."""
    import torch

    from pgrank.core.estimators import policy_gradient

    pg = params.train.pg
    rows = []
    for estimator in ESTIMATORS:
        g = torch.Generator(device=device).manual_seed(0)
        scores = torch.randn(queries, candidates, device=device, generator=g).requires_grad_(True)
        relevance = (torch.rand(queries, candidates, device=device, generator=g) < 0.002).float()

        def run():
            policy_gradient(scores, relevance, num_samples=pg.num_samples, utility=pg.utility, estimator=estimator,
                            baseline=pg.baseline, temperature=pg.temperature, entropy_coef=pg.entropy_coef,
                            entropy=pg.entropy, generator=g).loss.backward()

        if device.startswith("cuda"):
            torch.cuda.reset_peak_memory_stats()
        per_s = rate(run, 1, device, seconds)
        peak = torch.cuda.max_memory_allocated() if device.startswith("cuda") else None
        rows.append({"queries": queries, "candidates": candidates, "num_samples": pg.num_samples,
                     "estimator": estimator, "ms": round(1000 / per_s, 1),
                     "peak_gib": None if peak is None else round(peak / 2**30, 2)})
        print(f"  estimator {estimator:<8} {queries} x {candidates}, {pg.num_samples} rankings/query: "
              f"{1000 / per_s:.0f} ms", flush=True)
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--size", choices=["paper", "tiny"], default="paper", help="model widths (tiny: a dry run)")
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--seconds", type=float, default=3.0, help="time per throughput measurement")
    parser.add_argument("--queries", type=int, default=None, help="queries of the training step (default train.batch_size)")
    parser.add_argument("--candidates", type=int, default=None, help="candidates per query (default mine.candidates)")
    parser.add_argument("--skip", nargs="*", default=[], choices=["encoding", "pool", "training", "estimator", "step"])
    parser.add_argument("--lengths", type=int, nargs="*", default=list(LENGTHS), help="text lengths (tokens) to encode")
    add_set_option(parser, "train.chunk_tokens=131072")
    parser.add_argument("--out", type=Path, default=ROOT / "bench" / "out" / "gpu.json")
    parser.add_argument("--rates", type=Path, default=ROOT / "pgrank" / "pipeline" / "measured_rates.yaml",
                        help="the rates table to write this GPU's rates into (only on a GPU with --size paper)")
    parser.add_argument("--no-rates", action="store_true", help="leave the rates table alone")
    args = parser.parse_args()

    from pgrank.atomic import write_json
    from pgrank.config import load_params

    params = load_params(ROOT / "params.yaml", args.overrides)  # the paper's configuration, with --set overrides
    queries = args.queries or params.train.batch_size
    candidates = args.candidates or params.mine.candidates
    record = {"command": "python " + " ".join(["bench/gpu.py", *sys.argv[1:]]), "machine": machine_record(),
              "size": args.size, "overrides": args.overrides}
    print(f"# bench/gpu.py on {record['machine'].get('gpu') or record['machine']['cpu']}", flush=True)
    record["peak"] = device_peak(args.device, record["machine"].get("gpu") if args.device.startswith("cuda") else None)
    peak = record["peak"]["tflops"]
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        t = time.perf_counter()
        folders = {label: paper_models.build(kind, work / kind, size=args.size) for label, kind in ENCODERS.items()}
        print(f"  built the models in {time.perf_counter() - t:.0f} s", flush=True)
        if "encoding" not in args.skip:
            record["encoding"] = encoding(folders, args.device, args.seconds, params.mine.batch_size, args.lengths,
                                          peak)
        if "pool" not in args.skip and args.device.startswith("cuda"):
            record["pool"] = pool_rates(folders["distilbert (sbert, tas-b)"], args.device, params.mine.batch_size)
        if "training" not in args.skip:
            record["training"] = training_rates(folders["distilbert (sbert, tas-b)"], args.device, args.seconds, params,
                                                peak)
        if "estimator" not in args.skip:
            record["estimators"] = estimators_at_paper_shape(args.device, params, queries, candidates,
                                                             max(args.seconds, 2.0))
            record["estimator"] = next(r for r in record["estimators"] if r["estimator"] == params.train.pg.estimator)
        if "step" not in args.skip:
            (work / "step").mkdir()
            record["step"] = paper_step(folders["distilbert (sbert, tas-b)"], args.device, params, queries, candidates,
                                        work / "step", peak)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    write_json(args.out, record)
    print(f"\nGPU: {record['machine'].get('gpu')}; command: `{record['command']}`\n")
    print(render(record))
    if not args.no_rates and args.size == "paper" and args.device.startswith("cuda"):
        from rates_table import write_rates

        write_rates(record, args.rates, f"{record['command']} (record {args.out})")
        print(f"\n-> {args.rates}: the rates of {record['machine']['gpu']}")


def render(record: dict) -> str:
    """The record as Markdown tables."""
    out = []
    if record.get("encoding"):
        lengths = sorted({r["tokens"] for r in record["encoding"]})
        out += ["| encoding, docs/s | backend | " + " | ".join(f"{n} tokens" for n in lengths) + " |",
                "| --- | --- |" + " ---: |" * len(lengths)]
        for key in dict.fromkeys((r["model"], r["backend"]) for r in record["encoding"]):
            by = {r["tokens"]: r["docs_per_s"] for r in record["encoding"] if (r["model"], r["backend"]) == key}
            out.append(f"| {key[0]} | {key[1]} | " + " | ".join(f"{by[n]:,.0f}" for n in lengths) + " |")
        out.append("")
        if any("peak_share" in r for r in record["encoding"]):
            out += ["| encoding, real tokens/s and share of the peak | backend | "
                    + " | ".join(f"{n} tokens" for n in lengths) + " |", "| --- | --- |" + " ---: |" * len(lengths)]
            for key in dict.fromkeys((r["model"], r["backend"]) for r in record["encoding"]):
                by = {r["tokens"]: r for r in record["encoding"] if (r["model"], r["backend"]) == key}
                out.append(f"| {key[0]} | {key[1]} | "
                           + " | ".join(f"{by[n]['tokens_per_s']:,.0f}, {percent(by[n]['peak_share'])}" for n in lengths)
                           + " |")
            out.append("")
    if record.get("pool"):
        out += ["| processes per GPU (DistilBERT, bf16, 256 tokens) | docs/s |", "| ---: | ---: |"]
        out += [f"| {r['processes_per_gpu']} | {r['docs_per_s']:,.0f} |" for r in record["pool"]]
        out.append("")
    if record.get("training"):
        shares = all("peak_share" in r for r in record["training"])
        out += ["| training (forward + backward) | tokens | texts/s |" + (" real tokens/s | share of the peak |" if shares
                                                                          else ""),
                "| --- | ---: | ---: |" + (" ---: | ---: |" if shares else "")]
        out += [f"| {r['task']} ({r['amp']}) | {r['tokens']} | {r['texts_per_s']:,.0f} |"
                + (f" {r['tokens_per_s']:,.0f} | {percent(r['peak_share'])} |" if shares else "")
                for r in record["training"]]
        out.append("")
    if record.get("estimators"):
        first = record["estimators"][0]
        out += [f"| estimator alone, {first['queries']} x {first['candidates']}, {first['num_samples']} rankings per "
                "query | ms | peak GiB |", "| --- | ---: | ---: |"]
        out += [f"| `{r['estimator']}` | {r['ms']:,.0f} | {r['peak_gib']} |" for r in record["estimators"]]
        out.append("")
    if record.get("step"):
        s, e = record["step"], record.get("estimator")
        out += [f"One `tower: both` step, {s['queries']} queries x {s['candidates']} candidates ({s['documents']:,} "
                f"documents of " + (f"{s['mean_words']} words" if "mean_words" in s else f"{s['mean_tokens']} tokens")
                + f" on average, chunks of {s.get('chunk_tokens', s.get('grad_chunk_size'))} tokens, {s['num_samples']} "
                f"rankings per query, {s['amp']}): **{s['seconds']} s**, peak GPU memory **{s['peak_gib']} GiB**"
                + (f"; the estimator alone: {e['ms']} ms." if e else ".")
                + (f" {s['tokens_per_s']:,.0f} real tokens a second, {s['tflops']} TFLOPs: {percent(s['peak_share'])} "
                   "of the peak." if "peak_share" in s else "")]
    if record.get("peak"):
        p = record["peak"]
        out += ["", f"Shares are of {p['tflops']:,.2f} TFLOPs, {p['source']}; dense products measured on the device: "
                + ", ".join(f"{k} {v:,.2f}" for k, v in p["measured_tflops"].items()) + " TFLOPs."]
    return "\n".join(out)


if __name__ == "__main__":
    main()
