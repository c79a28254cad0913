"""What a paper-shape training step costs the host, measured on a CPU: the GPU path's overhead by proxy.

The real step of ``params.yaml`` (``tower: both``, cached gradients, the paper's estimator, token stores,
length-sorted chunks of ``train.chunk_tokens`` tokens, packed where the model packs) over documents of MS MARCO's
length distribution, with an encoder of DistilBERT's depth and vocabulary at a width of 8
(``bench/paper_models.py``, size ``depth``), so that its arithmetic costs little. Per step:

* ``host_us_per_doc``: the step's time outside its dispatched operations (laying out its inputs, Python, the
  trainer's bookkeeping), per document, on this CPU, with the step's own tensors (chunks of up to
  ``train.chunk_tokens`` tokens): the median of three profiled steps (each one's time outside its operations:
  ``host_s``). On a GPU the ops' arithmetic runs on the device, and issuing them costs the
  host what ``ops_per_doc`` counts;
* ``ops_per_doc``: operations dispatched (top-level ``aten::`` ops in the profiler, the autograd engine's
  included), per document;
* ``real_token_fraction``: tokens of text over tokens through the linear layers (``attention_real_fraction``:
  the same inside attention, where a packed chunk is laid into a grid on a CPU; FlashAttention's varlen kernel
  on CUDA wastes nothing there);
* ``dispatch_us_per_doc``: ``host_us_per_doc`` without what this CPU spends outside the operations because of their
  tensors' size: the same measure for the *twin* step, the same step (queries, number of chunks, estimator, clip and
  update, so nearly the same operations) over a few candidates of 10 tokens per query, whose tensors are a few
  kilobytes (the median of three profiled twins), with the twin's input layout replaced by the full step's
  (``prepare_s``, counted whole although the trainer lays out the next step on a background thread), divided by the
  full step's documents.
  That is the host's time between the operations when the device holds the tensors, as a GPU does; each operation's
  own dispatch (the dispatcher, autograd's recording, the allocation, a kernel launch on a GPU) runs inside the
  operation, where a CPU cannot tell it from the arithmetic. ``twin_wall_us_per_doc``, the twin's whole time (its
  operations included) with the same layout, bounds both from above;
* ``floor_us_per_op``: what the same measure gives for operations issued from Python with nothing else between them
  (a ``Linear``, an add, a ``LayerNorm`` and three views of a ``(64, 8)`` tensor, in a loop, profiled alike): this
  CPU's cost of dispatching one operation from Python, which no step layout removes. ``floor_us_per_doc`` is that
  times ``ops_per_doc``, the part of ``dispatch_us_per_doc`` that only fewer operations per document lower.
  ``sized_floor_us_per_op``: the same loop on a tensor of the step's real tokens per chunk (``sized_floor_rows``):
  on a CPU the time outside the operations grows with the tensors they touch, which a GPU's host never touches
  (``sized_floor_us_per_doc`` at the step's operations per document);
* ``probe_us``: why a CPU's time outside the operations grows with them. A one-microsecond operation is issued right
  after another such operation (``after_tiny``) and right after a matrix product as long as the step's mean
  operation (``after_long``, ``long_op_ms``), into preallocated outputs, nothing else between them: the median time
  from the end of the operation before to the end of the probe, profiled alike. After the product the host's own
  work runs on the core that has just run the arithmetic; a GPU's host issues the product and never runs it;
* ``syncs_per_step``: reads of device values by the host (``aten::_local_scalar_dense`` at any depth, data-dependent
  shapes such as ``nonzero``, and ``tolist``/``numpy``/``cpu`` of tensors), which on a GPU each wait for the
  device; reads inside the optimizer's step are not counted (the trainer's fused AdamW makes none; PyTorch's other
  implementations read their step counters, host tensors on every device).

The update is the trainer's: :func:`pgrank.training.step.clip_gradients` and the AdamW of
:func:`pgrank.training.step.adamw` (fused where PyTorch has the kernel, the CPU included).

Packed chunks run through :mod:`pgrank.models.packed_encoder`, as in training; ``--modules`` runs them through
transformers' modules instead. The twin runs through both, interleaved (``compared``): a paired comparison in one
run.

Run: ``python bench/step_overhead.py [--documents 8192] [--modules] [--out F]`` (under 3 minutes on 2 cores).
"""

from __future__ import annotations

import argparse
import collections
import json
import math
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

import paper_models  # noqa: E402
from record import add_out_option, add_set_option, new_record, save, table  # noqa: E402

SYNC_OPS = ("aten::_local_scalar_dense", "aten::nonzero", "aten::masked_select", "aten::_unique2",
            "aten::unique_consecutive", "aten::unique_dim", "aten::nonzero_static")
READS = ("tolist", "numpy", "cpu")
TWIN_WORDS = 8  # words per document of the twin step (one token each, plus the tokenizer's two)
TWIN_REPEATS = 3  # profiled twin steps (the median host time is reported)
STEP_REPEATS = 3  # profiled full steps (the median host time is reported)
SIZED_FLOOR_LOOPS = 20


def corpus(work: Path, n_docs: int, rng: np.random.Generator) -> Path:
    """``n_docs`` passages of MS MARCO's words per passage (log-normal: median 50, mean 56)."""
    vocab = paper_models.words(20_000)
    lengths = np.clip(np.round(rng.lognormal(math.log(50), 0.48, n_docs)), 4, 250).astype(int)
    path = work / "corpus.jsonl"
    with open(path, "w") as fh:
        for i, words in enumerate(lengths):
            picks = rng.integers(0, len(vocab), words)
            fh.write(json.dumps({"_id": str(i), "title": "", "text": " ".join(vocab[j] for j in picks)}) + "\n")
    return path


def top_level_ops(prof) -> list:
    """The profiler's ``aten::`` events not nested in another ``aten::`` event: the dispatched operations."""
    out = []
    for event in prof.events():
        if not event.name.startswith("aten::"):
            continue
        parent = event.cpu_parent
        while parent is not None and not parent.name.startswith("aten::"):
            parent = parent.cpu_parent
        if parent is None:
            out.append(event)
    return out


def seconds_in(ops: list) -> float:
    """Seconds spent inside these dispatched operations (their CPU time, nested calls included)."""
    return sum(e.cpu_time_total for e in ops) / 1e6


def _in_optimizer(event) -> bool:
    """Whether ``event`` runs inside the optimizer's step, whose step counters are host tensors on every device
    (PyTorch keeps them on the CPU unless ``capturable``): reading them waits for nothing."""
    parent = event.cpu_parent
    while parent is not None:
        if parent.name.startswith("Optimizer.step"):
            return True
        parent = parent.cpu_parent
    return False


class HostReads:
    """Counts ``tolist``/``numpy``/``cpu`` calls on tensors while active (each a device read on a GPU)."""

    def __init__(self):
        import torch

        self.torch, self.count, self.saved = torch, 0, {}

    def __enter__(self):
        for name in READS:
            real = getattr(self.torch.Tensor, name)
            self.saved[name] = real

            def counted(tensor, *a, _real=real, **k):
                self.count += 1
                return _real(tensor, *a, **k)

            setattr(self.torch.Tensor, name, counted)
        return self

    def __exit__(self, *exc):
        for name, real in self.saved.items():
            setattr(self.torch.Tensor, name, real)


def dispatch_floor(loops: int = 1000, rows: int = 64) -> float:
    """Microseconds outside the dispatched operations per operation, for a loop that does nothing but issue
    operations (module calls and views, as an encoder layer issues them) on a ``(rows, 8)`` tensor, measured as
    :func:`measure` measures a step."""
    import torch
    from torch.profiler import profile

    x = torch.randn(rows, 8)
    linear, norm = torch.nn.Linear(8, 8), torch.nn.LayerNorm(8)

    def issue():
        for _ in range(loops):
            x.view(-1, 8).transpose(0, 1).reshape(8, -1)
            norm(linear(x) + x)

    issue()  # warm-up
    with profile() as prof:
        started = time.perf_counter()
        issue()
        wall = time.perf_counter() - started
    ops = top_level_ops(prof)
    return max(wall - seconds_in(ops), 0.0) / len(ops) * 1e6


def probe_after(long_s: float, loops: int = 20) -> dict:
    """Median microseconds from the end of one operation to the end of the next, a one-microsecond ``neg`` into a
    preallocated output: after another such ``neg`` and after a float32 matrix product, into a preallocated output,
    of about ``long_s`` seconds (``probe_us``)."""
    import torch
    from torch.profiler import profile

    tiny, tiny_out = torch.ones(4), torch.empty(4)
    n = 64
    while n < 4096:  # the smallest product of at least long_s seconds
        a, out = torch.randn(n, n), torch.empty(n, n)
        started = time.perf_counter()
        torch.mm(a, a, out=out)
        took = time.perf_counter() - started
        if took >= long_s:
            break
        n = int(n * max(1.1, min(2.0, (long_s / max(took, 1e-7)) ** (1 / 3))))

    def median_gap(first) -> float:
        first()
        torch.neg(tiny, out=tiny_out)  # warm-up
        with profile() as prof:
            for _ in range(loops):
                first()
                torch.neg(tiny, out=tiny_out)
        ops = sorted(top_level_ops(prof), key=lambda e: e.time_range.start)
        return statistics.median(ops[i + 1].time_range.end - ops[i].time_range.end for i in range(0, len(ops) - 1, 2))

    return {"after_tiny": round(median_gap(lambda: torch.neg(tiny, out=tiny_out)), 2),
            "after_long": round(median_gap(lambda: torch.mm(a, a, out=out)), 2),
            "long_op_ms": round(took * 1e3, 2)}


def short_corpus(work: Path, n_docs: int, words: int) -> Path:
    """``n_docs`` passages of ``words`` words each: the twin step's documents, all of one length."""
    vocab = paper_models.words(20_000)
    path = work / "short.jsonl"
    with open(path, "w") as fh:
        for i in range(n_docs):
            fh.write(json.dumps({"_id": str(i), "title": "", "text": " ".join(vocab[(i * words + j) % len(vocab)]
                                                                            for j in range(words))}) + "\n")
    return path


def twin_shape(chunks: int, queries: int, length: int, longest_allowed: int) -> tuple[int, int]:
    """``(candidates per query, chunk budget)`` of a step over texts of ``length`` tokens that cuts into ``chunks``
    chunks of as few texts as the budget allows (it must hold a text of ``longest_allowed`` tokens)."""
    per_chunk = max(2, math.ceil(longest_allowed / length))
    per = max(2, math.ceil(chunks * per_chunk / queries))
    while True:
        n = per * queries
        budget = length * math.ceil(n / chunks)
        if budget >= longest_allowed and math.ceil(n / (budget // length)) == chunks:
            return per, budget
        per += 1


def measure(n_docs: int, queries: int, overrides: list[str], repeats: int, modules: bool = False) -> dict:
    import torch
    from torch.profiler import profile

    from pgrank.config import load_params
    from pgrank.core.objectives import OBJECTIVES
    from pgrank.data.corpus_store import build_corpus_store
    from pgrank.data.token_store import build_token_store, corpus_blocks, open_token_store, text_modules
    from pgrank.models.loading import load_encoder
    from pgrank.models import packed_encoder
    from pgrank.models.packing import PACKED_LAYOUT, enable_packing_for, packs
    from pgrank.training.batches import Example, candidate_scores, query_generators
    from pgrank.training.step import accumulate_gradients, adamw, clip_gradients
    from pgrank.training.step_inputs import StepTokens, prepare_step

    torch.set_num_threads(1)  # one core: the host thread of a GPU step
    params = load_params(ROOT / "params.yaml", ["train.tower=both", *overrides])
    cfg = params.train
    rng = np.random.default_rng(0)
    with tempfile.TemporaryDirectory(prefix="step-overhead-") as tmp:
        work = Path(tmp)
        folder = paper_models.build("sbert", work / "model", size="depth")
        model = load_encoder(str(folder), params.models, device="cpu", max_seq_length=cfg.max_doc_length).train()

        def token_store(path: Path, name: str):
            store = build_corpus_store(path, work / f"{name}-store", dataset=name, corpus_sha256="0" * 64)
            return build_token_store(model, corpus_blocks(store), len(store), work / f"{name}-tokens", task="document",
                                     max_length=cfg.max_doc_length, source={"name": name, "sha256": "0" * 64})

        started = time.perf_counter()
        documents = token_store(corpus(work, n_docs, rng), "bench")
        tokenize_s = time.perf_counter() - started
        vocab = paper_models.words(20_000)
        texts = [" ".join(vocab[j] for j in rng.integers(0, len(vocab), 6)) for _ in range(queries)]
        query_store = build_token_store(model, lambda lo, hi: texts[lo:hi], queries, work / "queries", task="query",
                                        max_length=cfg.max_query_length, source={"name": "q", "sha256": "1" * 64})
        enable_packing_for(model, documents)

        def use_packed_encoder(on: bool) -> None:
            """Packed chunks through pgrank.models.packed_encoder (``on``) or through transformers' modules."""
            for module in text_modules(model):
                (packed_encoder.install if on else packed_encoder.uninstall)(module.auto_model)

        if modules:
            use_packed_encoder(False)
        lean = any(packed_encoder.installed(m.auto_model) for m in text_modules(model))
        forward = FORWARD_NAMES[lean]
        trainable = [p for p in model.parameters() if p.requires_grad]
        optimizer = adamw(trainable, lr=cfg.learning_rate, weight_decay=cfg.weight_decay)  # the trainer's optimizer
        device = torch.device("cpu")

        def examples_over(per: int, relevant: np.ndarray) -> list:
            out = []
            for q in range(queries):  # disjoint candidate sets, as MS MARCO's training queries nearly are
                grades = np.zeros(per, dtype=np.int8)
                grades[relevant[q] % per] = 1
                out.append(Example(f"q{q}", texts[q], np.arange(q * per, (q + 1) * per), grades, q))
            return out

        def stepper(examples: list, run_params, tokens: StepTokens):
            def step():
                inputs = prepare_step(examples, run_params, tokens, epoch=1, model=model, device=device)
                accumulate_gradients(model, inputs, run_params, epoch=1, frozen=None)
                float(clip_gradients(trainable, cfg.grad_clip or math.inf))  # the trainer's clip and its one read
                optimizer.step()
                optimizer.zero_grad(set_to_none=True)
                return inputs
            return step

        def profiled(step) -> tuple[float, float, list, object, int]:
            with HostReads() as reads, profile() as prof:
                started = time.perf_counter()
                step()
                wall = time.perf_counter() - started
            ops = top_level_ops(prof)
            return wall, seconds_in(ops), ops, prof, reads.count

        per = n_docs // queries
        relevant = rng.integers(0, 1 << 30, queries)
        examples = examples_over(per, relevant)
        docs = queries * per
        tokens = StepTokens(open_token_store(query_store.folder), documents)
        step = stepper(examples, params, tokens)
        prepare_step(examples[:2], params, tokens, epoch=1, model=model, device=device)  # warm-up: allocator, kernels
        walls = []
        for _ in range(repeats):
            started = time.perf_counter()
            inputs = step()
            walls.append(time.perf_counter() - started)
        full_runs = [profiled(step) for _ in range(STEP_REPEATS)]
        by_host = sorted(full_runs, key=lambda run: run[0] - run[1])  # time outside the operations
        profiled_s, in_ops, ops, prof, host_reads = by_host[len(by_host) // 2]
        load = os.getloadavg()[0]  # other processes on these cores stretch the in-op and host times alike
        started = time.perf_counter()
        prepare_step(examples, params, tokens, epoch=1, model=model, device=device)
        prepare = time.perf_counter() - started
        names = collections.Counter(e.name for e in ops)
        reads_of_device = collections.Counter(e.name for e in prof.events() if e.name in SYNC_OPS and not _in_optimizer(e))
        syncs = sum(reads_of_device.values()) + host_reads

        # The twin: the same step (queries, chunks, estimator, update) over a few short candidates per query, so that
        # its tensors are a few kilobytes and its time outside its operations is the host's alone.
        chunks = len(inputs.documents)
        short = token_store(short_corpus(work, 1, TWIN_WORDS), "short-probe")
        length = int(short.lengths(np.array([0]))[0])
        twin_per, twin_budget = twin_shape(chunks, queries, length, max(cfg.max_doc_length, cfg.max_query_length))
        twin_tokens = StepTokens(tokens.queries, token_store(short_corpus(work, twin_per * queries, TWIN_WORDS),
                                                             "short"))
        twin_params = load_params(ROOT / "params.yaml", ["train.tower=both", *overrides,
                                                         f"train.chunk_tokens={twin_budget}"])
        twin_examples = examples_over(twin_per, relevant)
        twin = stepper(twin_examples, twin_params, twin_tokens)
        forwards = (lean, not lean) if packs(model) else (lean,)  # the other one too, interleaved: a paired comparison
        runs: dict[bool, list] = {choice: [] for choice in forwards}
        for repeat in range(TWIN_REPEATS + 1):  # the first round warms up
            for choice in forwards:
                use_packed_encoder(choice)
                if repeat:
                    runs[choice].append(profiled(twin))
                else:
                    twin()
        use_packed_encoder(lean)
        twin_runs = runs[lean]
        twin_prepares = []
        for _ in range(TWIN_REPEATS):
            started = time.perf_counter()
            twin_inputs = prepare_step(twin_examples, twin_params, twin_tokens, epoch=1, model=model, device=device)
            twin_prepares.append(time.perf_counter() - started)
        twin_prepare = statistics.median(twin_prepares)
        twin_ops = len(twin_runs[0][2])

        scores = candidate_scores(torch.randn(queries, 8), torch.randn(docs, 8, requires_grad=True),
                                  inputs.batch.index, cfg.similarity)
        pg = cfg.pg
        with profile() as prof:
            gens = query_generators(cfg.seed, 1, [ex.qid for ex in examples], device)
            OBJECTIVES["pg"](scores, inputs.batch.relevance, inputs.batch.mask, temperature=pg.temperature,
                             generator=gens, num_samples=pg.num_samples, utility=pg.utility, estimator=pg.estimator,
                             baseline=pg.baseline, entropy_coef=pg.entropy_coef, entropy=pg.entropy,
                             reference_scores=None, kl_coef=0.0, kl=pg.kl).loss.backward()
        estimator_ops = len(top_level_ops(prof))
        real = sum(c.real for c in inputs.documents)
        floor = dispatch_floor()
        sized_rows = max(64, real // max(chunks, 1))
        sized_floor = dispatch_floor(loops=SIZED_FLOOR_LOOPS, rows=sized_rows)
        probe = probe_after(in_ops / len(ops))
    wall = statistics.median(walls)

    def twin_us_per_doc(seconds: list[float]) -> float:
        """The twin's median ``seconds`` with the full step's input layout instead of its own, per document of the
        full step."""
        return round((statistics.median(seconds) - twin_prepare + prepare) / docs * 1e6, 2)

    def outside(profiled_runs: list) -> list[float]:
        return [wall - in_op for wall, in_op, *_ in profiled_runs]

    processed = sum(c.processed for c in inputs.documents)
    grid = sum(int(c.features[PACKED_LAYOUT].texts * c.features[PACKED_LAYOUT].longest) if PACKED_LAYOUT in c.features
               else c.processed for c in inputs.documents)
    return {
        "documents": docs, "queries": queries, "candidates": per, "chunk_tokens": cfg.chunk_tokens,
        "chunks": chunks, "packed": packs(model), "forward": forward, "estimator": pg.estimator,
        "num_samples": pg.num_samples, "max_doc_length": cfg.max_doc_length,
        "mean_tokens": round(real / docs, 1), "tokenize_s": round(tokenize_s, 2),
        "load_average": round(load, 2), "wall_s": round(wall, 3), "profiled_s": round(profiled_s, 3),
        "prepare_s": round(prepare, 4), "in_ops_s": round(in_ops, 3),
        "host_us_per_doc": round(max(profiled_s - in_ops, 0.0) / docs * 1e6, 2),
        "host_s": [round(t, 4) for t in outside(full_runs)],
        "wall_us_per_doc": round(wall / docs * 1e6, 1),
        "ops_per_step": len(ops), "estimator_ops": estimator_ops, "ops_per_doc": round(len(ops) / docs, 3),
        "floor_us_per_op": round(floor, 2), "floor_us_per_doc": round(floor * len(ops) / docs, 2),
        "sized_floor_rows": sized_rows, "sized_floor_us_per_op": round(sized_floor, 2),
        "sized_floor_us_per_doc": round(sized_floor * len(ops) / docs, 2),
        "probe_us": probe,
        "twin": {"documents": twin_per * queries, "candidates": twin_per, "tokens_per_document": length,
                 "chunk_tokens": twin_budget, "chunks": len(twin_inputs.documents), "ops_per_step": twin_ops,
                 "host_s": [round(t, 4) for t in outside(twin_runs)],
                 "wall_s": [round(wall, 4) for wall, *_ in twin_runs],
                 "prepare_s": round(twin_prepare, 4)},
        "dispatch_us_per_doc": twin_us_per_doc(outside(twin_runs)),
        "compared": {FORWARD_NAMES[choice]: {"host_s": [round(t, 4) for t in outside(runs[choice])],
                                             "dispatch_us_per_doc": twin_us_per_doc(outside(runs[choice]))}
                     for choice in forwards},
        "twin_wall_us_per_doc": twin_us_per_doc([wall for wall, *_ in twin_runs]),
        "real_token_fraction": round(real / processed, 4), "attention_real_fraction": round(real / grid, 4),
        "syncs_per_step": syncs, "sync_ops": dict(reads_of_device), "host_reads": host_reads,
        "top_ops": dict(names.most_common(12)),
    }


FORWARDS = {"packed encoder": "pgrank's packed encoder", "transformers modules": "transformers' modules"}
FORWARD_NAMES = {True: "packed encoder", False: "transformers modules"}  # whether packed_encoder is installed
GOALS = {"host_us_per_doc": ("<=", 5), "dispatch_us_per_doc": ("<=", 5), "ops_per_doc": ("<=", 0.5),
         "real_token_fraction": (">=", 0.95),
         "syncs_per_step": ("<=", 8)}


def render(record: dict) -> str:
    s = record["step"]
    rows = []
    for key, (cmp, bound) in GOALS.items():
        if key not in s:  # a record from before the figure
            continue
        value = s[key]
        met = value <= bound if cmp == "<=" else value >= bound
        rows.append((f"`{key}`", value, f"{cmp} {bound}", "met" if met else "not met"))
    lines = [f"{s['documents']:,} documents ({s['queries']} queries x {s['candidates']} candidates, {s['mean_tokens']} "
             f"tokens on average), chunks of {s['chunk_tokens']:,} tokens ({s['chunks']} chunks, "
             f"{'packed' if s['packed'] else 'padded'}{', through ' + FORWARDS[s['forward']] if 'forward' in s else ''}), "
             f"estimator {s['estimator']} with {s['num_samples']} rankings "
             f"per query. Step {s['wall_s']} s on this CPU (load average {s.get('load_average', '?')} on its "
             f"{record['machine'].get('cores', '?')} cores), {s['in_ops_s']} s of the profiled {s['profiled_s']} s "
             f"inside its {s['ops_per_step']:,} dispatched operations ({s['estimator_ops']} of them the estimator's); "
             f"laying out its inputs took {s['prepare_s']} s."
             + (f" Profiled {len(s['host_s'])} times, the step spent {s['host_s']} s outside its operations (the "
                f"median gives `host_us_per_doc`)." if "host_s" in s else "")
             + (f" Issuing an operation from Python costs this CPU {s['floor_us_per_op']} µs outside the operation "
                f"when nothing else runs between operations: {s['floor_us_per_doc']} µs per document at this step's "
                f"operations per document." if "floor_us_per_op" in s else "")
             + (f" On a tensor of the step's {s['sized_floor_rows']:,} real tokens per chunk the same loop spends "
                f"{s['sized_floor_us_per_op']} µs outside each operation ({s['sized_floor_us_per_doc']} µs per "
                f"document "
                f"at this step's operations per document): on a CPU that time grows with the tensors the operations "
                f"touch. The twin step (the same {s['twin']['chunks']} chunks, estimator and update over "
                f"{s['twin']['documents']} documents of {s['twin']['tokens_per_document']} tokens; "
                f"{s['twin']['ops_per_step']:,} operations) spends {s['twin']['host_s']} s outside its operations, "
                f"{s['twin']['prepare_s']} s of it laying out its inputs: with the full step's layout instead, "
                f"{s['dispatch_us_per_doc']} µs per document of the full step (`dispatch_us_per_doc`)."
                if "twin" in s else "")
             + (f" Its whole time, operations included (each one's dispatch, autograd recording and allocation, "
                f"which a GPU's host pays too, and its arithmetic on kilobytes, which it does not), is "
                f"{s['twin']['wall_s']} s: {s['twin_wall_us_per_doc']} µs per document, a bound on what the host "
                f"spends on the step." if "twin_wall_us_per_doc" in s else "")
             + (f" A one-microsecond operation takes {s['probe_us']['after_tiny']} µs from the end of the one before "
                f"it to its own end after another such operation, and {s['probe_us']['after_long']} µs after a "
                f"{s['probe_us']['long_op_ms']} ms matrix product (the step's mean operation): on a CPU the host's "
                f"own work slows after the arithmetic, which a GPU runs elsewhere (`probe_us`)."
                if "probe_us" in s else "")
             + ("" if len(s.get("compared", {})) < 2 else " Interleaved with those runs, the twin through each "
                "forward: " + "; ".join(f"{FORWARDS[name]} {c['host_s']} s outside its operations, "
                                        f"{c['dispatch_us_per_doc']} µs per document" for name, c in s["compared"].items())
                + "."),
             "",
             *table(("figure", "measured", "goal", ""), rows, "lrll"), "",
             f"Attention's real-token fraction on this CPU's grid layout: {s['attention_real_fraction']}. "
             f"Sync ops: {s['sync_ops'] or 'none'}, host reads: {s['host_reads']}."]
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--documents", type=int, default=8192, help="documents in the step (default 8192)")
    parser.add_argument("--queries", type=int, default=8, help="queries, each with documents / queries candidates")
    parser.add_argument("--repeats", type=int, default=1, help="timed steps (the median is reported)")
    parser.add_argument("--modules", action="store_true",
                        help="run packed chunks through transformers' modules, not pgrank.models.packed_encoder")
    add_set_option(parser, "train.chunk_tokens=65536", "the step")
    add_out_option(parser, __file__)
    args = parser.parse_args()
    record = new_record("Host overhead of a paper-shape training step (CPU proxy)")
    record["step"] = measure(args.documents, args.queries, args.overrides, args.repeats, args.modules)
    save(record, args.out, render)


if __name__ == "__main__":
    main()
