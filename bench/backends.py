"""Benchmark: inference backends side by side: encoding throughput, and nDCG@10 against torch fp32.

1. Throughput: the first ``--docs`` SciFact passages (``(title + " " + text).strip()``, 256 tokens) encoded
   by each backend in one process, best of ``--repeats``, after one warm-up batch; docs/s and the ratio
   to torch fp32. ``auto`` is what :func:`pgrank.models.backends.auto_inference_backend` picks on this machine.
   With it, how near each backend runs to the CPU's arithmetic floor: the model's products with weight matrices per
   passage, counted by PyTorch's flop counter on every tenth passage encoded alone by torch (``bench/flops.py``; the
   same arithmetic whatever the backend), times docs/s, against the TFLOPs of a large dense product measured in the
   backend's own precision (float32 for ``torch`` and ``onnx``, bf16 for ``torch-bf16``; none for int8).
2. Quality guard (:func:`pgrank.evaluation.backend_quality.compare_backends`): each backend encodes the
   whole SciFact and NFCorpus corpora into its own artifact and is evaluated first stage; nDCG@10 and
   the difference to torch fp32 against the bounds (0.005; onnx-int8 0.01).

Writes ``bench/out/backends.json`` (``--out``; with the machine) and prints its tables; asserts nothing. The datasets
come from ``$PGRANK_BEIR_MIRROR`` (or BEIR's server). Usage::

    PGRANK_BEIR_MIRROR=M python bench/backends.py --work W
    python bench/backends.py --work W --skip-quality --docs 1000
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path[:0] = [str(Path(__file__).resolve().parents[1]), str(Path(__file__).resolve().parent)]

from flops import counted_flops, measured_peak, percent, real_tokens, share  # noqa: E402
from record import add_out_option, new_record, save, table  # noqa: E402

ALL = ["torch", "torch-bf16", "onnx", "onnx-int8"]
PRECISION = {"torch": "float32", "onnx": "float32", "torch-bf16": "bfloat16"}  # the products each backend runs
TITLE = "Inference backends on the CPU: encoding throughput, and nDCG@10 against torch fp32"


def throughput(params, paths, model: str, texts: list[str], backends: list[str], repeats: int, batch: int) -> dict:
    from pgrank.models.backends import load_inference_encoder

    rates = {}
    for backend in backends:
        encoder, _ = load_inference_encoder(model, params.models, paths, max_seq_length=256, backend=backend)
        encoder.encode_document(texts[:batch], batch_size=batch)  # warm-up (and oneDNN's kernel choice)
        best = float("inf")
        for _ in range(repeats):
            start = time.perf_counter()
            encoder.encode_document(texts, batch_size=batch)
            best = min(best, time.perf_counter() - start)
        rates[backend] = len(texts) / best
        print(f"  {backend:<11} {rates[backend]:7.1f} docs/s", flush=True)
    return rates


def arithmetic(params, paths, model: str, texts: list[str], backends: list[str]) -> dict:
    """The model's weight products per passage (every tenth passage, each encoded alone by torch: no padding) and the
    CPU's dense-product TFLOPs in each precision the measured backends run (bfloat16's only where one runs it: without
    AMX it is emulated, and its peak takes minutes to measure)."""
    from pgrank.models.backends import load_inference_encoder

    encoder, _ = load_inference_encoder(model, params.models, paths, max_seq_length=256, backend="torch")
    sample = texts[::10]
    counted = counted_flops(lambda: [encoder.encode_document([t], batch_size=1) for t in sample])
    precisions = sorted({PRECISION[b] for b in backends if b in PRECISION})
    peaks = {dtype: round(measured_peak("cpu", dtype, seconds=1.0, n=2048), 4) for dtype in precisions}
    print(f"  {counted / len(sample) / 1e9:.2f} GFLOP a passage; dense products: {peaks} TFLOPs", flush=True)
    return {"flops_per_doc": counted / len(sample), "sampled": len(sample),
            "tokens_per_doc": real_tokens(encoder, texts), "peak_tflops": peaks}


def main() -> None:
    import torch

    from pgrank.config import load_params
    from pgrank.data.corpus_store import open_corpus
    from pgrank.download.stage import download
    from pgrank.evaluation.backend_quality import BOUNDS, compare_backends
    from pgrank.models.backends import auto_inference_backend, cpu_flags, int8_isa
    from pgrank.paths import Paths

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--work", type=Path, required=True, help="folder for datasets, embeddings and results (kept)")
    ap.add_argument("--model", default="minilm")
    ap.add_argument("--backends", nargs="+", default=ALL, choices=ALL)
    ap.add_argument("--docs", type=int, default=1000)
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--batch-size", type=int, default=64)
    ap.add_argument("--eval-sets", nargs="+", default=["scifact/test", "nfcorpus/test"])
    ap.add_argument("--skip-quality", action="store_true")
    add_out_option(ap, __file__)
    args = ap.parse_args()

    root = Path(__file__).resolve().parents[1]
    params = load_params(root / "params.yaml", profile="demo",
                         overrides=[f"paths.root={args.work}/runs", f"paths.data={args.work}/data",
                                    f"paths.embeddings={args.work}/embeddings", f"evaluate.batch_size={args.batch_size}"])
    paths = Paths.from_config(params.paths, root)
    datasets = sorted({s.partition("/")[0] for s in args.eval_sets} | {"scifact"})
    download(params, paths, datasets, config_dir=root, progress=False)
    flags = cpu_flags()
    record = new_record(TITLE)
    record.update(model=args.model, threads=torch.get_num_threads(), amx_bf16="amx_bf16" in flags,
                  avx512_vnni="avx512_vnni" in flags, int8_isa=int8_isa(flags), auto=auto_inference_backend("cpu", flags))

    store = open_corpus(paths, "scifact")
    _, texts = next(store.text_blocks(0, min(args.docs, len(store)), block=args.docs))
    print(f"  throughput: {len(texts)} SciFact passages", flush=True)
    rates = throughput(params, paths, args.model, texts, args.backends, args.repeats, args.batch_size)
    record["arithmetic"] = arithmetic(params, paths, args.model, texts, args.backends)
    work = record["arithmetic"]
    record["throughput"] = {"passages": len(texts), "tokens": 256, "batch": args.batch_size, "repeats": args.repeats,
                            "backends": [{"backend": b, "docs_per_s": r, **floor_share(work, b, r)}
                                         for b, r in rates.items()]}
    if not args.skip_quality:
        print("  quality: first-stage nDCG@10, whole corpora", flush=True)
        rows = compare_backends(params, paths, args.model, args.eval_sets, args.backends)
        record["quality"] = [{"backend": r.backend, "eval_set": r.eval_set, "ndcg_at_10": r.ndcg_at_10,
                              "bound": BOUNDS[r.backend], "docs_per_s": r.docs_per_second} for r in rows]
    save(record, args.out, render)


def floor_share(work: dict, backend: str, docs_per_s: float) -> dict:
    """TFLOPs a backend reaches at ``docs_per_s``, and their share of the dense product in its precision."""
    part = share(work["flops_per_doc"], docs_per_s, work["peak_tflops"].get(PRECISION.get(backend)))
    return {"tflops": round(work["flops_per_doc"] * docs_per_s / 1e12, 4),
            "peak_share": None if part is None else round(part, 4)}


def render(record: dict) -> str:
    """The record as the Markdown the script prints."""
    r, t = record, record["throughput"]
    first = t["backends"][0]
    out = [f"CPU: {r['threads']} threads, amx_bf16={r['amx_bf16']}, avx512_vnni={r['avx512_vnni']}; int8 for "
           f"{r['int8_isa']}; auto -> {r['auto']}", "",
           f"throughput: {r['model']}, {t['passages']} SciFact passages, {t['tokens']} tokens, batch {t['batch']}, best "
           f"of {t['repeats']}:", ""]
    if r.get("arithmetic"):
        a = r["arithmetic"]
        out += table(["backend", "docs/s", f"x {first['backend']}", "TFLOPs", "of the dense product in its precision"],
                     [[b["backend"], f"{b['docs_per_s']:.1f}", f"{b['docs_per_s'] / first['docs_per_s']:.2f}",
                       f"{b['tflops']:.3f}", percent(b["peak_share"])] for b in t["backends"]], "lrrrr")
        out += ["", f"{a['flops_per_doc'] / 1e9:.2f} GFLOP of weight products a passage of {a['tokens_per_doc']:.0f} "
                f"tokens on average (counted on {a['sampled']} passages encoded alone); a dense product of large "
                "matrices reaches " + ", ".join(f"{v:.3f} TFLOPs in {k}" for k, v in a["peak_tflops"].items())
                + " on this CPU."]
    else:
        out += table(["backend", "docs/s", f"x {first['backend']}"],
                     [[b["backend"], f"{b['docs_per_s']:.1f}", f"{b['docs_per_s'] / first['docs_per_s']:.2f}"]
                      for b in t["backends"]], "lrr")
    if r.get("quality"):
        base = {q["eval_set"]: q["ndcg_at_10"] for q in r["quality"] if q["backend"] == "torch"}
        rows = []
        for q in r["quality"]:
            delta = q["ndcg_at_10"] - base[q["eval_set"]] if q["eval_set"] in base else float("nan")
            ok = "ok" if abs(delta) <= q["bound"] + 1e-12 else "MISSED"
            rate = f"{q['docs_per_s']:.1f}" if q["docs_per_s"] else "(cached)"
            rows.append([q["backend"], q["eval_set"], f"{q['ndcg_at_10']:.4f}", f"{delta:+.4f}", f"{q['bound']} {ok}", rate])
        out += ["", "quality: first-stage nDCG@10, whole corpora, against torch fp32", ""]
        out += table(["backend", "eval set", "nDCG@10", "vs torch", "bound", "corpus docs/s"], rows, "llrrrr")
    return "\n".join(out)


if __name__ == "__main__":
    main()
