"""Throughput rates that turn a plan's counts into hours (:func:`pgrank.pipeline.plan.price`).

A model's rate is texts a second as a function of tokens per text: ``inference`` (forward only, under its inference
backend) and, for warm starts, ``grad`` (forward and backward in cached-gradient chunks, under ``train.amp``). Rates
come from one of two places, and the plan says which:

* **calibrated** on the machine at hand (``pgrank plan --calibrate``): each model measured at texts of 32 to 512
  tokens, at the batch sizes of ``params.yaml``, CUDA-synchronised;
* **measured elsewhere**: ``measured_rates.yaml`` beside this module, the figures of ``python bench/gpu.py`` by GPU
  and architecture. On a GPU the table has, its own figures; otherwise the table's GPU, named in the output.

Each GPU of the table records the data path its rates were measured on (``data_path``, one of :data:`DATA_PATHS`).
A rate measured on another path than the one this code runs (:data:`DATA_PATH`), or with none recorded, predates the
code it prices, and the plan says so (:func:`stale_note`).

Each stage's texts are as long as its corpus's and queries' mean length in tokens: words counted on a sample of the
corpus when it is on disk, else BEIR's published averages (:data:`BEIR_WORDS`), times :data:`TOKENS_PER_WORD`, cut at
the stage's truncation length.

Example:
    >>> rates = table_rates("sentence-transformers/gtr-t5-xl", "NVIDIA H100 80GB HBM3")
    >>> round(rates.inference_at(140))
    493
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path

import numpy as np

TABLE = Path(__file__).with_name("measured_rates.yaml")
# WordPiece and SentencePiece tokens per whitespace word: all-MiniLM-L6-v2's tokenizer gives 1.57 on SciFact's corpus and
# 1.51 on NFCorpus's (scientific text; web text runs lower), so 1.5 prices a corpus at or above its real length.
TOKENS_PER_WORD = 1.5
SPECIAL_TOKENS = 2  # [CLS] ... [SEP], or T5's </s> and a leading piece
# BEIR's average words per query and per document (title and text), Thakur et al. 2021, Table 1.
BEIR_WORDS: dict[str, tuple[float, float]] = {
    "msmarco": (5.96, 55.98), "trec-covid": (10.60, 160.77), "nfcorpus": (3.30, 232.26), "nq": (9.16, 78.88),
    "hotpotqa": (17.61, 46.30), "fiqa": (10.77, 132.32), "arguana": (192.98, 166.80),
    "webis-touche2020": (6.55, 292.37), "quora": (9.53, 11.44), "dbpedia-entity": (5.39, 49.68),
    "scidocs": (9.38, 176.19), "fever": (8.13, 84.76), "climate-fever": (20.13, 84.76), "scifact": (12.37, 213.63),
}
# How a stage reads its texts, which changes what a second of GPU buys: the data path a rate was measured on.
DATA_PATHS = {
    "padded": "texts tokenized inside the timed loops, training in chunks of a fixed number of documents padded to "
              "their longest",
    "packed": "token ids read from pre-tokenized stores, in length-sorted chunks cut by a token budget "
              "(train.chunk_tokens) and packed without padding where the model allows",
}
DATA_PATH = "packed"  # the data path this code runs, and so the one a plan prices
UNKNOWN_WORDS = (10.0, 100.0)  # a dataset of your own, not on disk yet
SAMPLE = 2000  # corpus documents whose words are counted


@dataclass(frozen=True)
class ModelRates:
    """Texts a second by tokens per text."""

    inference: dict[int, float] = field(default_factory=dict)
    grad: dict[int, float] = field(default_factory=dict)
    step: tuple[int, float] | None = None  # (tokens, seconds per candidate document of a whole tower:both step)
    data_path: str | None = None  # the data path they were measured on (DATA_PATHS; None: not recorded)

    def inference_at(self, tokens: float) -> float | None:
        return interpolate(self.inference, tokens)

    def grad_at(self, tokens: float) -> float | None:
        return interpolate(self.grad, tokens)

    def step_seconds_at(self, tokens: float) -> float | None:
        """Seconds a candidate document costs a ``tower: both`` step (both cached-gradient passes), scaled from the
        measured step's length to ``tokens`` as forward+backward throughput scales; ``None`` where unmeasured."""
        if self.step is None or not self.grad:
            return None
        at, seconds = self.step
        return seconds * interpolate(self.grad, at) / interpolate(self.grad, tokens)


def interpolate(table: dict[int, float], tokens: float) -> float | None:
    """The rate at ``tokens``: log-log between the two measured lengths around it; beyond the measured range, the rate
    of the nearest measured length (never extrapolated faster); ``None`` for an empty table."""
    if not table:
        return None
    xs = sorted(table)
    if tokens <= xs[0]:
        return table[xs[0]]
    if tokens >= xs[-1]:
        return table[xs[-1]] * min(1.0, xs[-1] / tokens)  # longer than measured: at least linear in length
    hi = next(i for i, x in enumerate(xs) if x >= tokens)
    x0, x1 = xs[hi - 1], xs[hi]
    t = (math.log(tokens) - math.log(x0)) / (math.log(x1) - math.log(x0))
    return math.exp((1 - t) * math.log(table[x0]) + t * math.log(table[x1]))


def tokens_of(words: float, limit: int) -> int:
    """Mean tokens per text of ``words`` words, truncated at ``limit``."""
    return max(1, min(limit, round(words * TOKENS_PER_WORD) + SPECIAL_TOKENS))


def _sampled_lines(path: Path, n: int) -> list[bytes]:
    """About ``n`` lines of a JSONL file, evenly spaced through it (each the first whole line after an offset)."""
    size = path.stat().st_size
    lines = []
    with open(path, "rb") as fh:
        for offset in np.linspace(0, size, n, endpoint=False).astype(int):
            fh.seek(int(offset))
            if offset:
                fh.readline()  # the rest of the line the offset fell in
            line = fh.readline()
            if line.strip():
                lines.append(line)
    return lines


def mean_words(paths, dataset: str) -> tuple[tuple[float, float], str]:
    """``((query words, document words), source)``: counted on a sample of the dataset on disk (documents as BEIR
    joins them: title and text), else BEIR's published averages."""
    import json

    folder = paths.dataset(dataset)
    corpus, queries = folder / "corpus.jsonl", folder / "queries.jsonl"
    if corpus.is_file() and queries.is_file():
        docs = [json.loads(line) for line in _sampled_lines(corpus, SAMPLE)]
        asked = [json.loads(line) for line in _sampled_lines(queries, SAMPLE)]
        words = (float(np.mean([len(q.get("text", "").split()) for q in asked] or [0])),
                 float(np.mean([len(f"{d.get('title', '')} {d.get('text', '')}".split()) for d in docs] or [0])))
        return words, "counted on disk"
    if dataset in BEIR_WORDS:
        return BEIR_WORDS[dataset], "BEIR's published averages"
    return UNKNOWN_WORDS, "assumed (not on disk)"


@cache
def _table() -> dict:
    import yaml

    return yaml.safe_load(TABLE.read_text(encoding="utf-8"))


def table_device(device_name: str | None) -> str:
    """The GPU of :data:`TABLE` that prices a plan on ``device_name``: itself where the table has it, else the table's
    first GPU."""
    devices = _table()["devices"]
    return device_name if device_name in devices else next(iter(devices))


def table_rates(hub_id: str, device: str) -> ModelRates | None:
    """The measured rates of ``hub_id``'s architecture on ``device`` (a GPU of :data:`TABLE`), or ``None``."""
    table = _table()
    arch = table["architectures"].get(hub_id)
    entry = table["devices"].get(device, {})
    rates = entry.get(arch)
    if rates is None:
        return None
    step = rates.get("step")
    return ModelRates({int(k): float(v) for k, v in rates.get("inference", {}).items()},
                      {int(k): float(v) for k, v in rates.get("grad", {}).items()},
                      (int(step["tokens"]), float(step["seconds_per_document"])) if step else None,
                      entry.get("data_path"))


def stale_note(device: str, rates: dict[str, ModelRates]) -> str | None:
    """One line when any of ``rates`` (measured on ``device``) predates the data path this code runs
    (:data:`DATA_PATH`): measured on another path, or with none recorded; else ``None``."""
    older = sorted({r.data_path or "" for r in rates.values() if r.data_path != DATA_PATH})
    if not older:
        return None
    how = "; ".join(f"on the {path} path, {DATA_PATHS[path]}" if path in DATA_PATHS else
                    (f"on a path this code does not know ({path!r})" if path else "with no data path recorded")
                    for path in older)
    return (f"stale rates: priced from rates measured before the {DATA_PATH} data path this code runs. The {device}'s "
            f"were measured {how}. `python bench/gpu.py` on that GPU measures them again; `pgrank plan --calibrate` "
            "measures this machine.")


GRID = (32, 64, 128, 256, 512)  # tokens per text at which calibration measures


def _texts(n: int, words: int) -> list[str]:
    """``n`` distinct texts of ``words`` common English words (about a token each)."""
    vocab = "protein cell gene study trial dose risk model data effect river solar market tax vaccine".split()
    return [" ".join(vocab[(i * 7 + j * 3 + j // len(vocab)) % len(vocab)] for j in range(words)) for i in range(n)]


def measure_rates(params, paths, name: str, device: str, seconds: float, *, train: bool) -> ModelRates:
    """``name``'s rates measured on ``device`` (:func:`pgrank.pipeline.plan.calibrate` says how)."""
    from pgrank.models.loading import load_encoder

    ev, cfg = params.evaluate, params.train
    mining = name == params.mine.model and "dense" in (params.mine.source, params.mine.training_source)
    limit = max(params.mine.max_seq_length if mining else 0, ev.max_seq_length)
    batch = params.mine.batch_size if mining else ev.batch_size
    if name in ev.systems.sparse:
        from pgrank.retrieval.sparse.splade import load_sparse_encoder

        encoder = load_sparse_encoder(name, params.models, device=device, max_seq_length=limit)
    else:  # encoding runs under the model's inference backend (pgrank.models.backends), training in torch
        from pgrank.models.backends import load_inference_encoder

        encoder, _ = load_inference_encoder(name, params.models, paths, device=device, max_seq_length=limit)
    st = getattr(encoder, "model", encoder)  # an autocast encoder wraps the sentence-transformers model; ONNX's is its own
    limit = min(limit, getattr(st, "max_seq_length", None) or limit)  # capped at the model's positions when loaded
    rates = ModelRates()
    for tokens in [t for t in GRID if t <= limit]:
        texts = _texts(batch, tokens - 2)
        rates.inference[tokens] = _rate(lambda t=texts: encoder.encode_document(t, batch_size=batch), batch, device, seconds)
    if train:
        from pgrank.models.packing import run_chunk, text_chunks

        model = load_encoder(name, params.models, device=device, max_seq_length=cfg.max_doc_length).train()
        longest = min(max(cfg.max_doc_length, cfg.max_query_length), model.max_seq_length)
        for tokens in [t for t in GRID if t <= longest]:  # a training chunk: pre-tokenized, cut by train.chunk_tokens
            count = max(1, min(cfg.chunk_tokens // tokens, 1024))
            chunks = text_chunks(model, _texts(count, tokens - 2), task="document", max_length=tokens,
                                 budget=cfg.chunk_tokens)

            def step(chunks=chunks):
                for chunk in chunks:
                    run_chunk(model, chunk, task="document", amp=cfg.amp).sum().backward()

            rates.grad[tokens] = _rate(step, count, device, seconds)
        model.zero_grad(set_to_none=True)
    return rates


def _rate(fn, items: int, device: str, seconds: float) -> float:
    """Items a second of ``fn()`` (which handles ``items``) after a warm-up call, CUDA-synchronised."""
    import torch

    def sync():
        if device.startswith("cuda"):
            torch.cuda.synchronize()

    fn()
    sync()
    done, started = 0, time.perf_counter()
    while time.perf_counter() - started < seconds or not done:
        fn()
        sync()
        done += items
    return done / (time.perf_counter() - started)
