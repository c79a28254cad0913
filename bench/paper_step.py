"""The paper-shape training step, measured as the trainer runs it: ``bench/gpu_check.py``'s step and ``bench/gpu.py``'s.

:func:`synthetic_tokens` makes the step's token stores in place, in seconds: ``queries x candidates`` documents
whose lengths follow MS MARCO's passages (words per passage log-normal, median 50, mean 56, clipped to 4..250,
as ``bench/synthetic_msmarco.py``; ``tokens_per_word`` WordPiece tokens a word), each the model's own special
tokens around random ids of its vocabulary, written as a :mod:`pgrank.data.token_store` folder and opened
through :func:`pgrank.data.token_store.open_token_store`, so the step reads them as a run reads its corpus. No
text is tokenized but the queries'.

:func:`timed_steps` runs the trainer's step over them (``tower: both``): inputs made one step ahead by
:class:`pgrank.training.step_inputs.Prefetcher` with :func:`pgrank.training.step_inputs.prepare_step`, then
:func:`pgrank.training.step.accumulate_gradients`, :func:`pgrank.training.step.clip_gradients` with the trainer's
one read of the norm, and the fused AdamW of :func:`pgrank.training.step.adamw`. One warm-up step, profiled (the
top kernels by device time; operators on a CPU), then ``steps`` timed ones. Each timed step is split at the
trainer's own boundaries (:class:`Phases`) by events on the device's stream (CUDA events; the host clock on a CPU),
so the split adds no synchronisation:

* ``no_grad_forward``: the queries' forward and the no-grad forward of every candidate chunk (``encode_cached``);
* ``estimator``: the policy gradient and its backward into the embeddings and the query tower (``add_gradients``);
* ``reforward_backward``: every chunk re-encoded with gradients and back-propagated (``backward_cached``);
* ``optimizer``: the clip, its read, the update and the zeroing;
* ``preparation_s``: the prefetcher's host time laying out the step's inputs (off the critical path), and
  ``waited_s``: what the step waited for them.
"""

from __future__ import annotations

import contextlib
import math
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np

PHASES = ("no_grad_forward", "estimator", "reforward_backward", "optimizer")
TOP_KERNELS = 15


def document_lengths(n: int, rng: np.random.Generator, *, tokens_per_word: float, specials: int,
                     max_length: int) -> np.ndarray:
    """Tokens of ``n`` documents of MS MARCO's words per passage, ``specials`` included, cut at ``max_length``."""
    words = np.clip(np.round(rng.lognormal(math.log(50), 0.48, n)), 4, 250)
    return np.minimum(np.round(words * tokens_per_word).astype(np.int64) + specials, max_length)


def synthetic_store(model, folder: Path, lengths: np.ndarray, *, task: str, max_length: int, seed: int = 0):
    """A token store of ``len(lengths)`` texts of those lengths for ``model``, made in place: the model's own leading
    and trailing special tokens around uniform random ids of its vocabulary's ordinary tokens."""
    from pgrank.atomic import write_json
    from pgrank.data.artifact_meta import META
    from pgrank.data.token_store import FORMAT, open_token_store, tokenize, tokenizer_identity, text_modules

    sample, sample_lengths, layout = tokenize(model, ["a"], task=task, max_length=max_length)
    tokenizer = text_modules(model)[0].tokenizer
    special = set(tokenizer.all_special_ids)
    ids = [int(i) for i in sample[: int(sample_lengths[0])]]
    head = [i for i in ids[: next((k for k, i in enumerate(ids) if i not in special), len(ids))]]
    tail = [i for i in ids[len(ids) - next((k for k, i in enumerate(reversed(ids)) if i not in special), 0):]]
    lengths = np.maximum(np.asarray(lengths, dtype=np.int64), len(head) + len(tail) + 1)
    ordinary = np.setdiff1d(np.arange(len(tokenizer), dtype=np.int32), np.fromiter(special, dtype=np.int32))
    rng = np.random.default_rng(seed)
    offsets = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64)
    body = ordinary[rng.integers(0, len(ordinary), int(offsets[-1]))]
    starts = offsets[:-1]
    for k, token in enumerate(head):
        body[starts + k] = token
    for k, token in enumerate(reversed(tail)):
        body[offsets[1:] - 1 - k] = token
    folder.mkdir(parents=True, exist_ok=True)
    np.save(folder / "ids.npy", body)
    np.save(folder / "offsets.npy", offsets)
    identity = tokenizer_identity(model, task, max_length)
    write_json(folder / META, {"format": FORMAT, "source": {"name": "synthetic", "sha256": "-"}, "tokenizer": identity,
                               "max_length": max_length, "task": identity["task"], "num_texts": len(lengths),
                               "num_tokens": int(offsets[-1]), "features": layout})
    return open_token_store(folder, identity)


def synthetic_tokens(model, params, folder: Path, queries: int, candidates: int, *, tokens_per_word: float = 1.3,
                     seed: int = 0):
    """``(StepTokens, examples)`` of a paper-shape step: ``queries`` examples, each with its own ``candidates``
    documents of the synthetic store (disjoint candidate sets, as MS MARCO's training queries nearly are) and one
    relevant document; packing switched on for ``model`` where it packs (its probe on the store's first texts)."""
    from pgrank.data.token_store import build_token_store
    from pgrank.models.packing import enable_packing_for
    from pgrank.training.batches import Example
    from pgrank.training.step_inputs import StepTokens

    import paper_models

    cfg = params.train
    rng = np.random.default_rng(seed)
    n = queries * candidates
    lengths = document_lengths(n, rng, tokens_per_word=tokens_per_word, specials=2, max_length=cfg.max_doc_length)
    documents = synthetic_store(model, folder / "documents", lengths, task="document", max_length=cfg.max_doc_length,
                                seed=seed)
    vocab = paper_models.words(20_000)
    texts = [" ".join(vocab[j] for j in rng.integers(0, len(vocab), 6)) for _ in range(queries)]
    asked = build_token_store(model, lambda lo, hi: texts[lo:hi], queries, folder / "queries", task="query",
                              max_length=cfg.max_query_length, source={"name": "queries", "sha256": "-"})
    enable_packing_for(model, documents)
    examples = []
    for q in range(queries):
        grades = np.zeros(candidates, dtype=np.int8)
        grades[rng.integers(0, candidates)] = 1
        examples.append(Example(f"q{q}", texts[q], np.arange(q * candidates, (q + 1) * candidates), grades, q))
    return StepTokens(asked, documents), examples


class Phases:
    """Marks at the trainer's step boundaries: device events recorded on the stream (the host clock on a CPU), read
    once the step has synchronised. Installed by wrapping the functions :mod:`pgrank.training.step` calls."""

    def __init__(self, device):
        import torch

        self.cuda = device.type == "cuda"
        self.torch = torch
        self.marks: list[tuple[str, object]] = []

    def mark(self, name: str) -> None:
        if self.cuda:
            event = self.torch.cuda.Event(enable_timing=True)
            event.record()
            self.marks.append((name, event))
        else:
            self.marks.append((name, time.perf_counter()))

    def seconds(self) -> dict[str, float]:
        """Seconds between consecutive marks, by the later mark's name (the step must have synchronised)."""
        out = {}
        for (_, a), (name, b) in zip(self.marks, self.marks[1:]):
            out[name] = a.elapsed_time(b) / 1e3 if self.cuda else b - a
        return out

    @contextlib.contextmanager
    def installed(self):
        from pgrank.training import step

        def after(fn, name):
            def wrapped(*a, **k):
                out = fn(*a, **k)
                self.mark(name)
                return out
            return wrapped

        saved = {name: getattr(step, name) for name in ("encode_cached", "add_gradients", "backward_cached")}
        step.encode_cached = after(saved["encode_cached"], "no_grad_forward")
        step.add_gradients = after(saved["add_gradients"], "estimator")
        step.backward_cached = after(saved["backward_cached"], "reforward_backward")
        try:
            yield self
        finally:
            for name, fn in saved.items():
                setattr(step, name, fn)


@dataclass
class Prepared:
    """A step's inputs and the host seconds the prefetcher spent laying them out."""

    inputs: object
    seconds: float


def top_kernels(prof, device, n: int = TOP_KERNELS) -> list[dict]:
    """The ``n`` kernels (operators on a CPU) that took the most time in a profiled step, with their share."""
    import torch

    cuda = device.type == "cuda"
    rows = []
    for e in prof.key_averages():
        if cuda:
            if getattr(e, "device_type", None) != torch.autograd.DeviceType.CUDA:
                continue
            us = getattr(e, "self_device_time_total", None) or getattr(e, "self_cuda_time_total", 0)
        else:
            if not e.key.startswith("aten::"):
                continue
            us = e.self_cpu_time_total
        rows.append((e.key, int(e.count), float(us)))
    total = sum(r[2] for r in rows) or 1.0
    rows.sort(key=lambda r: -r[2])
    return [{"name": name[:160], "calls": calls, "ms": round(us / 1e3, 2), "share": round(us / total, 4)}
            for name, calls, us in rows[:n]]


def timed_steps(model, params, tokens, examples, *, steps: int = 3, profile: bool = True) -> dict:
    """One warm-up step (profiled when ``profile``) and ``steps`` timed ones over ``examples`` (each step all of
    them), through the prefetcher, the trainer's step and its fused optimizer; see the module docstring."""
    import torch
    from torch.profiler import ProfilerActivity
    from torch.profiler import profile as profiler

    from pgrank.models.packing import packs
    from pgrank.training.step import accumulate_gradients, adamw, clip_gradients
    from pgrank.training.step_inputs import Prefetcher, prepare_step

    cfg = params.train
    device = next(model.parameters()).device
    trainable = [p for p in model.parameters() if p.requires_grad]
    optimizer = adamw(trainable, lr=cfg.learning_rate, weight_decay=cfg.weight_decay)

    def sync():
        if device.type == "cuda":
            torch.cuda.synchronize()

    def prepare(_):
        started = time.perf_counter()
        inputs = prepare_step(examples, params, tokens, epoch=1, model=model, device=device)
        return Prepared(inputs, time.perf_counter() - started)

    def one_step(prepared: Prepared, phases: Phases) -> float:
        with phases.installed():
            phases.mark("start")
            accumulate_gradients(model, prepared.inputs, params, epoch=1, frozen=None)
            norm = float(clip_gradients(trainable, cfg.grad_clip or math.inf))  # the trainer's one read
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
            phases.mark("optimizer")
        sync()
        return norm

    rows, kernels, warm_s = [], [], None
    sync()
    waited_from = time.perf_counter()
    for i, prepared in enumerate(Prefetcher(prepare, range(steps + 1))):
        started = time.perf_counter()
        waited = started - waited_from
        phases = Phases(device)
        if i == 0:
            if device.type == "cuda":
                torch.cuda.reset_peak_memory_stats()
            activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.type == "cuda" else [])
            prof = profiler(activities=activities) if profile else None
            try:
                if prof is not None:
                    prof.__enter__()
            except Exception as err:  # a profiler that cannot start here costs the kernels, not the step
                prof, kernels = None, [{"error": f"{type(err).__name__}: {err}"}]
            one_step(prepared, phases)
            warm_s = time.perf_counter() - started
            if prof is not None:
                try:
                    prof.__exit__(None, None, None)
                    kernels = top_kernels(prof, device)
                except Exception as err:
                    kernels = [{"error": f"{type(err).__name__}: {err}"}]
        else:
            norm = one_step(prepared, phases)
            wall = time.perf_counter() - started
            split = phases.seconds()
            rows.append({"seconds": round(wall, 3), "waited_s": round(waited, 4),
                         "preparation_s": round(prepared.seconds, 3),
                         **{f"{name}_s": round(split.get(name, 0.0), 3) for name in PHASES},
                         "grad_norm": round(norm, 4)})
        waited_from = time.perf_counter()
    chunks = prepared.inputs.documents
    real = sum(c.real for c in chunks)
    processed = sum(c.processed for c in chunks)
    lengths = tokens.documents.lengths(np.arange(len(tokens.documents)))
    seconds = float(np.median([r["seconds"] for r in rows]))
    return {"chunk_tokens": cfg.chunk_tokens, "queries": len(examples), "candidates": len(examples[0].rows),
            "documents": int(sum(len(ex.rows) for ex in examples)), "mean_tokens": round(float(lengths.mean()), 1),
            "num_samples": cfg.pg.num_samples, "estimator": cfg.pg.estimator, "amp": cfg.amp,
            "max_doc_length": cfg.max_doc_length, "packed": packs(model), "chunks": len(chunks),
            "real_token_fraction": round(real / max(processed, 1), 4), "warm_up_s": round(warm_s, 2),
            "steps": rows, "seconds": round(seconds, 3),
            "split_s": {name: round(float(np.median([r[f"{name}_s"] for r in rows])), 3)
                        for name in ("preparation", "waited", *PHASES)},
            "peak_gib": round(torch.cuda.max_memory_allocated() / 2**30, 2) if device.type == "cuda" else None,
            "top_kernels": kernels, "kernels_from": "the profiled warm-up step"}
