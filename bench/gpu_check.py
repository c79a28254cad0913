"""What to run first on a GPU at hand: one call, within 8 minutes, that prices the paper: ``python3 bench/gpu_check.py``.

Five sections, the most valuable first. Each writes its record (JSON, atomically) as soon as it ends, so a call cut
short by a timeout or a kill still returns every section that finished; a section that fails records its error
and the next one runs. Records go to ``--records`` (default ``bench/out``) as ``gpu_check-<label>-<n>-<section>.json``
(``label``: the GPU's model, ``h100``; ``cpu`` on a CPU):

1. ``environment``: the machine, library versions, and the CUDA path's first-run risks: the torch floor
   (:func:`pgrank.torch_floor`), the variable-length attention call's signature and its ``scale``
   argument, one such call in bf16 against SDPA, FlashAttention's availability, the imports the sections need;
2. ``step``: the paper-shape ``tower: both`` step (``train.batch_size`` queries x ``mine.candidates`` candidates,
   ``train.pg.num_samples`` rankings a query) on synthetic token stores made in place, at two chunk budgets
   (``--chunk-tokens``): 1 profiled warm-up and 3 timed steps through the prefetcher and the fused optimizer, split
   into preparation, no-grad forward, estimator, re-forward and backward, and optimizer, with peak memory and the
   top kernels (``bench/paper_step.py``), written again after each budget; then the warm start's forward and
   backward texts a second in chunks (``bench/gpu.py``'s training rates: the ``grad`` rates that price the queries'
   tower);
3. ``encoders``: DistilBERT (SBERT, TAS-B) and gtr-t5-xl at their real sizes (``bench/paper_models.py``) through the
   corpus encoder's token path (:func:`pgrank.retrieval.dense.encoding.encode_token_rows`: token-store rows, chunks,
   packed where the model packs, bf16 weights on CUDA), at 64, 128 and 256 tokens, with whether packing stayed on;
   SPLADE through its own (strings, float32);
4. ``tests``: ``pytest -m gpu`` over the test files that hold GPU tests (its log beside the records);
5. ``faiss``: exact search through torch on the GPU, and through faiss-gpu against it where faiss-gpu is installed.

With ``--rates`` (on a GPU, at paper size) the sections' rates go into that rates table
(``bench/rates_table.py``) right after the encoders; ``python3 bench/rates_table.py RECORD...`` does the same later.

``--device cpu`` (tiny models and a small step shape by default) is the rehearsal of the same call, every section
through the same code (``tests/test_bench_gpu_check.py`` runs it, makes a section fail, and kills it mid-section).
On a lent machine, see ``bench/gpu_check.sh``.

Example:
    $ python3 bench/gpu_check.py --records "$OUT" --rates "$OUT/measured_rates.yaml"
    $ python3 bench/gpu_check.py --device cpu --records /tmp/rehearsal
"""

from __future__ import annotations

import argparse
import datetime
import importlib
import json
import shlex
import subprocess
import sys
import tempfile
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "bench")]

BUDGET_S = 480  # the stated budget of one call: 8 minutes
SECTIONS = ("environment", "step", "encoders", "tests", "faiss")
ENCODER_LENGTHS = (64, 128, 256)
ENCODERS = {"distilbert (sbert, tas-b)": "sbert", "gtr-t5-xl": "gtr-t5"}  # bench/rates_table.py's labels
TEXTS = {"sbert": 8192, "gtr-t5": 1024}  # documents a timed encoding call (tiny: 64)
TESTS_TIMEOUT_S = 240
IMPORTS = ("pgrank.config", "pytrec_eval", "transformers", "sentence_transformers", "faiss")


@dataclass
class Check:
    """One call's settings and state: where records go, the clock, the scratch folder."""

    device: str
    size: str
    label: str
    records: Path
    work: Path
    command: str
    overrides: list[str]
    budgets: list[int]
    seconds: float
    budget_s: float
    rates: Path | None
    started: float = field(default_factory=time.perf_counter)
    written: list[Path] = field(default_factory=list)

    @property
    def cuda(self) -> bool:
        return self.device.startswith("cuda")

    def left(self) -> float:
        return self.budget_s - (time.perf_counter() - self.started)

    def path(self, n: int, name: str) -> Path:
        return self.records / f"gpu_check-{self.label}-{n}-{name}.json"

    def params(self, *extra: str):
        from pgrank.config import load_params

        return load_params(ROOT / "params.yaml", [*self.overrides, *extra])


def write_record(check: Check, n: int, name: str, body: dict) -> Path:
    """Section ``n``'s record, written atomically: its head (command, title, machine, date) and ``body``."""
    from pgrank.atomic import write_json
    from record import machine_record

    record = {"command": check.command, "title": f"GPU check, section {n}: {name} ({check.label})",
              "machine": machine_record(), "date": datetime.datetime.now(datetime.timezone.utc).date().isoformat(),
              "section": name, "label": check.label, "device": check.device, "size": check.size, **body}
    path = check.path(n, name)
    write_json(path, json.loads(json.dumps(record, default=lambda v: v.tolist() if hasattr(v, "tolist") else str(v))))
    if path not in check.written:
        check.written.append(path)
    return path


# ------------------------------------------------------------------------------------------- sections


def environment(check: Check, save: Callable[[dict], None]) -> dict:
    import inspect

    import torch

    from pgrank import torch_floor

    out: dict = {"torch": torch.__version__, "cuda": torch.version.cuda, "cuda_available": torch.cuda.is_available(),
                 "torch_floor": torch_floor.FLOOR, "torch_floor_met": torch_floor.missing(torch.__version__, signature=True) is None}
    try:
        from torch.nn.attention.varlen import varlen_attn

        signature = inspect.signature(varlen_attn)
        out["varlen_attn"] = {"signature": str(signature), "scale": "scale" in signature.parameters}
    except (ImportError, ValueError, TypeError) as err:
        out["varlen_attn"] = {"error": f"{type(err).__name__}: {err}"}
    if check.cuda:
        p = torch.cuda.get_device_properties(0)
        out["gpu"] = {"name": p.name, "capability": f"{p.major}.{p.minor}", "memory_gib": round(p.total_memory / 2**30, 1),
                      "flash_sdp": torch.backends.cuda.flash_sdp_enabled(),
                      "bf16": torch.cuda.is_bf16_supported()}
        try:
            smi = subprocess.run(["nvidia-smi"], capture_output=True, text=True, timeout=20)
            out["nvidia_smi"] = smi.stdout[-4000:]
        except (OSError, subprocess.SubprocessError) as err:
            out["nvidia_smi"] = f"{type(err).__name__}: {err}"
        out["varlen_call"] = varlen_call()
    out["imports"] = {}
    for name in IMPORTS:  # what the sections need beside torch: the carried wheels among them
        try:
            module = importlib.import_module(name)
            out["imports"][name] = str(getattr(module, "__version__", "ok"))
        except Exception as err:  # noqa: BLE001 - recorded, not raised: the section says what is missing
            out["imports"][name] = f"{type(err).__name__}: {err}"
    out["faiss_gpu"] = bool(getattr(sys.modules.get("faiss"), "get_num_gpus", lambda: 0)())
    return out


def varlen_call() -> dict:
    """FlashAttention's variable-length kernel as packed attention calls it (bf16, two texts, the model's scale),
    against ``scaled_dot_product_attention`` text by text: the least cosine of their outputs."""
    import torch

    try:
        from torch.nn.attention.varlen import varlen_attn

        g = torch.Generator(device="cuda").manual_seed(0)
        lengths = (37, 90)
        q, k, v = (torch.randn(sum(lengths), 12, 64, device="cuda", generator=g, dtype=torch.bfloat16) for _ in "qkv")
        cu = torch.tensor([0, lengths[0], sum(lengths)], device="cuda", dtype=torch.int32)
        out = varlen_attn(q, k, v, cu, cu, max(lengths), max(lengths), scale=0.125)
        cosines = []
        for a, b in ((0, lengths[0]), (lengths[0], sum(lengths))):
            ref = torch.nn.functional.scaled_dot_product_attention(*(x[a:b].transpose(0, 1) for x in (q, k, v)),
                                                                   scale=0.125).transpose(0, 1)
            cosines.append(float(torch.nn.functional.cosine_similarity(out[a:b].float().flatten(),
                                                                       ref.float().flatten(), dim=0)))
        return {"ok": True, "least_cosine": round(min(cosines), 6)}
    except Exception as err:  # noqa: BLE001 - the risk this section is for: recorded, and the call goes on
        return {"ok": False, "error": f"{type(err).__name__}: {err}"}


def step(check: Check, save: Callable[[dict], None]) -> dict:
    import torch

    import paper_models
    from paper_step import synthetic_tokens, timed_steps
    from pgrank.models.loading import load_encoder

    params = check.params()
    by_budget = {budget: check.params(f"train.chunk_tokens={budget}") for budget in check.budgets}  # checked first
    queries, candidates = params.train.batch_size, params.mine.candidates
    folder = paper_models.build("sbert", check.work / "sbert", size=check.size)
    model = load_encoder(str(folder), params.models, device=check.device,
                         max_seq_length=params.train.max_doc_length).train()
    started = time.perf_counter()
    tokens, examples = synthetic_tokens(model, params, check.work / "step", queries, candidates)
    out = {"model": "distilbert (sbert, tas-b)", "stores_s": round(time.perf_counter() - started, 1), "budgets": []}
    for budget in check.budgets:
        if out["budgets"] and check.left() < 2 * out["budgets"][-1]["section_s"]:
            out.setdefault("skipped", []).append({"chunk_tokens": budget, "why": "the call's time budget"})
            continue
        started = time.perf_counter()
        row = timed_steps(model, by_budget[budget], tokens, examples)
        row["section_s"] = round(time.perf_counter() - started, 1)
        out["budgets"].append(row)
        print(f"  step   {queries} x {candidates}, chunks of {budget:,} tokens: {row['seconds']} s "
              f"({row['split_s']}), peak {row['peak_gib']} GiB, packed {row['packed']}", flush=True)
        save(out)
        if check.cuda:
            torch.cuda.empty_cache()
    del model, tokens
    if check.left() > 60 or check.size == "tiny":  # the warm start's forward + backward texts a second (grad rates)
        from gpu import training_rates

        out["training"] = training_rates(folder, check.device, check.seconds, params)
    return out


def encoders(check: Check, save: Callable[[dict], None]) -> dict:
    import paper_models
    from gpu import token_encoding

    params = check.params()
    out: dict = {"encoding": [], "packed": {}}
    lengths = ENCODER_LENGTHS
    peak = None
    if check.cuda:  # shares of the GPU's published dense bf16 peak (bench/flops.py)
        import torch
        from flops import spec_peak

        peak = spec_peak(torch.cuda.get_device_name(0))
        out["peak_tflops"] = peak
    for label, kind in ENCODERS.items():
        folder = paper_models.build(kind, check.work / kind, size=check.size)
        texts = TEXTS[kind] if check.size == "paper" else 64
        rows, packed = token_encoding(label, folder, check.device, check.seconds, lengths, texts,
                                      params.mine.batch_size, check.work / f"{kind}-tokens", peak)
        out["encoding"] += rows
        out["packed"][label] = packed
        save(out)
    from gpu import encoding  # SPLADE as evaluation runs it: strings, float32 (TF32 products)

    folder = paper_models.build("splade", check.work / "splade", size=check.size)
    out["encoding"] += encoding({"splade": folder}, check.device, check.seconds, params.mine.batch_size, lengths,
                                peak)
    if check.rates is not None and check.cuda and check.size == "paper":
        import rates_table

        written = [json.loads(p.read_text(encoding="utf-8")) for p in check.written]
        merged = rates_table.merged(written + [{"section": "encoders", "status": "ok", **out}])
        lacking = [key for key in ("step", "training", "encoding") if not merged.get(key)]
        if lacking:  # a partial entry would replace the GPU's whole entry, and leave the plan unpriced
            out["rates"] = f"not written: no {', '.join(lacking)} rates"
        else:
            rates_table.write_rates(merged, check.rates,
                                    f"{check.command} (records {check.records}/gpu_check-{check.label}-*.json)")
            out["rates"] = str(check.rates)
    return out


def tests(check: Check, save: Callable[[dict], None]) -> dict:
    files = sorted(str(p.relative_to(ROOT)) for p in (ROOT / "tests").rglob("test_*.py")
                   if "mark.gpu" in p.read_text(encoding="utf-8"))
    timeout = max(10, int(min(TESTS_TIMEOUT_S, check.left())))
    command = [sys.executable, "-m", "pytest", "-m", "gpu", "-n", "0", "-q", "-p", "no:cacheprovider", *files]
    log = check.records / f"gpu_check-{check.label}-4-tests.log"
    started = time.perf_counter()
    try:
        done = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=timeout)
        output, code = done.stdout + done.stderr, done.returncode
    except subprocess.TimeoutExpired as err:
        output = (err.stdout or b"").decode(errors="replace") if isinstance(err.stdout, bytes) else (err.stdout or "")
        code = None
    from pgrank.atomic import write_text

    write_text(log, output)
    counts = {}
    for line in output.splitlines()[::-1]:
        import re

        found = re.findall(r"(\d+) (passed|failed|skipped|errors?|deselected|xfailed|xpassed)", line)
        if found:
            counts = {word: int(n) for n, word in found}
            break
    return {"files": files, "exit_code": code, "timed_out": code is None, "timeout_s": timeout,
            "seconds": round(time.perf_counter() - started, 1), "counts": counts, "log": log.name,
            "tail": output.splitlines()[-25:]}


def faiss(check: Check, save: Callable[[dict], None]) -> dict:
    import numpy as np

    from pgrank.data.runs import id_ranks
    from pgrank.retrieval.dense.exact_search import dense_search, faiss_gpu_available

    n, dim, queries, k = (1_000_000, 768, 1024, 1000) if check.size == "paper" else (20_000, 32, 64, 100)
    rng = np.random.default_rng(0)
    corpus = rng.standard_normal((n, dim), dtype=np.float32)
    asked = rng.standard_normal((queries, dim), dtype=np.float32)
    ranks = id_ranks([str(i) for i in range(n)])
    backends = ["torch"] + (["faiss-gpu"] if faiss_gpu_available() else [])
    out: dict = {"documents": n, "dim": dim, "queries": queries, "k": k, "rows": []}
    if not faiss_gpu_available():
        out["faiss_gpu"] = "not installed or sees no GPU: faiss-gpu's wheel was not carried (bench/gpu_wheels.py)"
    results = {}
    for backend in backends:
        search = lambda: dense_search(asked, ((s, corpus[s:s + 262_144]) for s in range(0, n, 262_144)), ranks, k,  # noqa: E731
                                      backend=backend, use_gpu=check.cuda)
        search()
        started = time.perf_counter()
        results[backend] = search()
        out["rows"].append({"backend": backend, "seconds": round(time.perf_counter() - started, 3)})
    if len(results) == 2:
        out["agreement"] = float((results["torch"][1] == results["faiss-gpu"][1]).mean())
    return out


RUN: dict[str, Callable[[Check, Callable[[dict], None]], dict]] = {
    "environment": environment, "step": step, "encoders": encoders, "tests": tests, "faiss": faiss}


def run_check(check: Check, only: list[str] | None = None) -> list[Path]:
    """Every section in order (``only``: those), each record written as the section ends."""
    check.records.mkdir(parents=True, exist_ok=True)
    for n, name in enumerate(SECTIONS, 1):
        if only and name not in only:
            continue
        if check.left() <= 0:
            write_record(check, n, name, {"status": "skipped", "why": f"the call's {check.budget_s:.0f} s budget"})
            continue
        print(f"# section {n}: {name} ({check.left():.0f} s of the budget left)", flush=True)
        started = time.perf_counter()

        def save(partial: dict, n=n, name=name, started=started) -> None:
            write_record(check, n, name, {"status": "running", "seconds": round(time.perf_counter() - started, 1),
                                          **partial})

        try:
            body = {"status": "ok", **RUN[name](check, save)}
        except Exception as err:  # a failed section is recorded, and the next one runs
            body = {"status": "failed", "error": f"{type(err).__name__}: {err}",
                    "traceback": traceback.format_exc().splitlines()[-30:]}
            print(f"  {name} failed: {body['error']}", flush=True)
        body["seconds"] = round(time.perf_counter() - started, 1)
        print(f"-> {write_record(check, n, name, body)} ({body['status']}, {body['seconds']} s)", flush=True)
    return check.written


# ------------------------------------------------------------------------------------------- rendering


def render(record: dict) -> str:
    """A section's record as Markdown."""
    head = f"Section `{record['section']}` on {record['label']} ({record.get('date', '?')}): **{record['status']}**" \
           f" in {record.get('seconds', '?')} s."
    if record["status"] in ("failed", "skipped"):
        return head + f" {record.get('error') or record.get('why', '')}".rstrip()
    out = [head, ""]
    name = record["section"]
    if name == "environment":
        v = record.get("varlen_attn", {})
        out.append(f"torch {record['torch']} (CUDA {record['cuda']}), floor {record['torch_floor']} "
                   f"{'met' if record['torch_floor_met'] else 'NOT met'}; varlen attention: "
                   + (f"`{v['signature']}`, `scale` {'accepted' if v.get('scale') else 'missing'}" if "signature" in v
                      else v.get("error", "-")) + f"; faiss-gpu: {'yes' if record.get('faiss_gpu') else 'no'}.")
        call = record.get("varlen_call")
        if call:
            out.append("The varlen call in bf16 against SDPA text by text: " + (
                f"least cosine {call['least_cosine']}." if call.get("ok") else f"failed, {call.get('error')}."))
        failed = {k: v for k, v in record.get("imports", {}).items() if "Error" in v}
        if failed:
            out.append("Imports that failed: " + "; ".join(f"`{k}`: {v}" for k, v in failed.items()) + ".")
    elif name == "step":
        out += ["| chunk tokens | step s | preparation | waited | no-grad forward | estimator | re-forward + backward"
                " | optimizer | peak GiB | packed |", "| ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | --- |"]
        for b in record["budgets"]:
            s = b["split_s"]
            out.append(f"| {b['chunk_tokens']:,} | {b['seconds']} | {s['preparation']} | {s['waited']} | "
                       f"{s['no_grad_forward']} | {s['estimator']} | {s['reforward_backward']} | {s['optimizer']} | "
                       f"{b['peak_gib']} | {b['packed']} |")
        if record["budgets"]:
            b = record["budgets"][0]
            out += ["", f"{b['queries']} queries x {b['candidates']} candidates ({b['documents']:,} documents of "
                        f"{b['mean_tokens']} tokens on average), {b['num_samples']} rankings per query, {b['amp']}; "
                        "medians of 3 timed steps. Top kernels of the profiled warm-up step at "
                        f"{b['chunk_tokens']:,} tokens:", "", "| kernel | calls | ms | share |", "| --- | ---: | ---: | ---: |"]
            out += [f"| `{k['name'][:80]}` | {k['calls']} | {k['ms']} | {100 * k['share']:.1f}% |"
                    for k in b["top_kernels"][:10] if "name" in k]
            out += [f"Profiler: {k['error']}" for k in b["top_kernels"] if "error" in k]
    elif name == "encoders":
        lengths = sorted({r["tokens"] for r in record["encoding"]})
        out += ["| docs/s (token path) | backend | packed | " + " | ".join(f"{n} tokens" for n in lengths) + " |",
                "| --- | --- | --- |" + " ---: |" * len(lengths)]
        for label in dict.fromkeys(r["model"] for r in record["encoding"]):
            by = {r["tokens"]: r for r in record["encoding"] if r["model"] == label}
            first = next(iter(by.values()))
            out.append(f"| {label} | {first['backend']} | {record['packed'].get(label, '-')} | "
                       + " | ".join(f"{by[n]['docs_per_s']:,.0f}" + (f" ({100 * by[n]['peak_share']:.1f}% of peak)"
                                                                       if by[n].get("peak_share") else "")
                                    for n in lengths if n in by) + " |")
    elif name == "tests":
        out.append(f"`pytest -m gpu` over {len(record['files'])} files: {record['counts'] or 'no summary'} "
                   f"(exit {record['exit_code']}{', timed out' if record['timed_out'] else ''}); log `{record['log']}`.")
    elif name == "faiss":
        out.append(f"Exact top {record['k']} of {record['queries']} queries over {record['documents']:,} documents of "
                   f"{record['dim']} dimensions: " + ", ".join(f"{r['backend']} {r['seconds']} s" for r in record["rows"])
                   + (f"; agreement {record['agreement']:.4f}" if "agreement" in record else "")
                   + (f"; faiss-gpu {record['faiss_gpu']}" if "faiss_gpu" in record else "") + ".")
    return "\n".join(out)


# ------------------------------------------------------------------------------------------- entry point


def default_label(device: str) -> str:
    if not device.startswith("cuda"):
        return "cpu"
    import torch

    words = torch.cuda.get_device_name(0).split()
    return (words[1] if len(words) > 1 else words[0]).lower()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", default="cuda", help="cuda (a lent GPU) or cpu (the rehearsal)")
    parser.add_argument("--size", choices=["paper", "tiny"], default=None,
                        help="model widths and shapes (default: paper on CUDA, tiny on a CPU)")
    parser.add_argument("--records", type=Path, default=ROOT / "bench" / "out", help="the folder of the records")
    parser.add_argument("--label", default=None, help="the records' label (default: the GPU's model, or cpu)")
    parser.add_argument("--only", nargs="*", choices=SECTIONS, default=None, help="these sections only")
    parser.add_argument("--chunk-tokens", type=int, nargs="*", default=None,
                        help="the step's two chunk budgets (default: train.chunk_tokens and half of it; tiny: 512 256)")
    parser.add_argument("--seconds", type=float, default=None, help="time per encoding rate (default 1.5; tiny 0.05)")
    parser.add_argument("--budget", type=float, default=BUDGET_S, help="seconds for the whole call (default 480)")
    parser.add_argument("--rates", type=Path, default=None, help="a rates table to write the GPU's rates into")
    parser.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                        help="a params override (repeatable); tiny adds a small step shape")
    args = parser.parse_args(argv)

    size = args.size or ("paper" if args.device.startswith("cuda") else "tiny")
    overrides = list(args.overrides)
    if size == "tiny":  # a step of a few queries, candidates and rankings: what runs is the same code
        overrides = ["train.batch_size=2", "mine.candidates=8", "train.pg.num_samples=4", "mine.batch_size=4",
                     "train.chunk_tokens=512", *overrides]
    if not args.device.startswith("cuda"):
        import torch

        torch.set_num_threads(1)  # the host thread of a GPU step; and no worker threads waiting on a busy machine
    command = "python3 " + shlex.join(["bench/gpu_check.py", *(sys.argv[1:] if argv is None else argv)])
    with tempfile.TemporaryDirectory(prefix="gpu-check-") as tmp:
        check = Check(args.device, size, args.label or default_label(args.device), args.records, Path(tmp), command,
                      overrides, [], args.seconds or (1.5 if size == "paper" else 0.05), args.budget, args.rates)
        params = check.params()
        check.budgets = args.chunk_tokens or ([params.train.chunk_tokens, params.train.chunk_tokens // 2]
                                              if size == "paper" else [512, 256])
        written = run_check(check, args.only)
    for path in written:
        print("\n" + render(json.loads(path.read_text(encoding="utf-8"))))
    return 0


if __name__ == "__main__":
    sys.exit(main())
