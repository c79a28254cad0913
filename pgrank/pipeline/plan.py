"""``pgrank plan``: what a configured run costs, before anything runs.

For the configured profile (the paper by default) and every stage of ``dvc.yaml`` (mining, training per
warm start, evaluation per system and dataset) the plan counts:

* **documents / queries encoded**: texts run through a model without gradient: corpus-embedding
  artifacts (each (model, length, corpus) once, reused by later stages exactly as the pipeline reuses
  them), rerank-only candidate subsets, validation passes, the first pass of cached-gradient chunking;
* **documents / queries with grad**: forward+backward passes with gradient (``tower: both``
  re-encodes every candidate of every training query each epoch; ``tower: query`` only the queries);
* **rankings**: Plackett-Luce rankings sampled (``train.pg.num_samples`` per query per epoch);
* **pairs**: (query, document) candidate pairs mined or reranked;
* **disk**: bytes of what the stage writes (embeddings float16, candidate stores at 5 bytes a pair,
  TREC runs, checkpoints); "?" where it depends on a model the plan does not know (``--calibrate``
  loads it).

Dataset sizes come from the data on disk when it is downloaded, else from BEIR's published sizes
(:data:`pgrank.download.catalogue.BEIR_SIZES`). Hours come from throughput rates (:mod:`pgrank.pipeline.rates`):
``--calibrate`` measures each model on the machine at hand (inference and, for warm starts, forward+backward, at
texts of 32 to 512 tokens, CUDA-synchronised); without it the paper's models are priced from the rates
``bench/gpu.py`` measured on a GPU (``measured_rates.yaml``). Either way each stage's texts are as long as its
dataset's mean length, and the output says which rates it used; one more line says when the table's rates were
measured before the data path this code runs (:func:`pgrank.pipeline.rates.stale_note`).

The paper's "# rankings sampled per epoch: 5000" is ambiguous (PAPER.md): read as samples per query
with every training query each epoch (``train.queries_per_epoch: null``), ``tower: both`` encodes
about 3x10^9 documents with gradient over 6 epochs; the plan prints that next to the other reading,
``train.queries_per_epoch: 5000``.

Example:
    >>> plan = make_plan(load_params("params.yaml"), paths)
    >>> print(render(plan))
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace

from pgrank.config import Params
from pgrank.download.catalogue import BEIR_SIZES
from pgrank.errors import PgrankError
from pgrank.paths import CARVED_FILES, CARVED_TRAIN, GATE, VALIDATION, Paths, carved_splits, policy_name, run_key
from pgrank.pipeline.rates import (ModelRates, mean_words, measure_rates, stale_note, table_device, table_rates,
                                   tokens_of)

# What a model is, for artifact sizes without loading it: embedding dimension, parameters.
MODEL_FACTS: dict[str, tuple[int, int]] = {
    "sentence-transformers/gtr-t5-xl": (768, 1_240_000_000),
    "sentence-transformers/msmarco-distilbert-dot-v5": (768, 66_400_000),
    "sentence-transformers/msmarco-distilbert-base-tas-b": (768, 66_400_000),
    "sentence-transformers/all-MiniLM-L6-v2": (384, 22_700_000),
    "naver/splade_v2_distil": (30_522, 67_000_000),
}
STORE_PAIR_BYTES = 5  # int32 row + int8 grade
CORPUS_STORE_DOC_BYTES = 60  # offsets, id ranks/order, id hashes and rows, ~8 bytes of id (measured layout)
TREC_LINE_BYTES = 45  # "qid Q0 doc rank score tag\n", measured on the rehearsal's runs


@dataclass
class Line:
    """One row of the plan: one stage (and model) of the pipeline."""

    stage: str
    model: str
    docs: int = 0
    queries: int = 0
    grad_docs: int = 0
    grad_queries: int = 0
    rankings: int = 0
    pairs: int = 0
    disk: int | None = 0
    note: str = ""
    encode_model: str | None = None  # whose throughput prices the encodes (default: model)
    hours: float | None = None
    doc_tokens: int = 0  # mean tokens of the documents it encodes (its corpus's mean length, truncated)
    query_tokens: int = 0  # likewise for its queries


@dataclass
class Plan:
    profile: str
    sizes: dict[str, dict[str, int]]
    lines: list[Line] = field(default_factory=list)
    rates: dict[str, ModelRates | str] = field(default_factory=dict)  # model -> its rates, or why it has none
    device: str | None = None
    pricing: str = ""  # which rates priced the hours
    stale: str = ""  # one line when those rates predate the data path this code runs (rates.stale_note)
    words: dict[str, tuple[float, float]] = field(default_factory=dict)  # dataset -> (query, document) mean words


def dataset_sizes(params: Params, paths: Paths, dataset: str) -> dict[str, int]:
    """``{"documents": N, split: queries, ...}``: counted on disk if the dataset is there, else BEIR's sizes."""
    folder = paths.dataset(dataset)
    if (folder / "corpus.jsonl").is_file():
        from pgrank.data.beir import load_qrels
        from pgrank.reporting.setup_tables import count_lines

        sizes = {"documents": count_lines(folder / "corpus.jsonl")}
        for qrels in sorted((folder / "qrels").glob("*.tsv")):
            sizes[qrels.stem] = len(load_qrels(qrels))
        return sizes
    if dataset in BEIR_SIZES:
        return dict(BEIR_SIZES[dataset])
    source = params.data.sources.get(dataset)
    if source is not None and source.halves is not None:  # half documents: at most as many as it is set to cut
        return {"documents": source.halves.documents, "dev": min(source.halves.queries, source.halves.documents)}
    if source is not None and source.split is not None:  # a hash split: the parent's corpus, its split in two
        parent = dataset_sizes(params, paths, source.split.of)
        n = parent.get(source.split.split, 0)
        dev = min(max(round(source.split.dev_share * n), 1), n - 1) if n > 1 else 0
        return {"documents": parent["documents"], "dev": dev, "test": n - dev}
    raise PgrankError(f"{dataset}: not downloaded and not a BEIR dataset of known size; run `pgrank download {dataset}`")


def _queries(sizes: dict[str, int], dataset: str, split: str, params: Params) -> int:
    train_dataset, train_split = params.data.train.split("/")
    if split in CARVED_FILES and dataset == train_dataset:  # the gate as data.gate_size says (a frozen one: about as many)
        carved = {VALIDATION: params.data.validation_size, GATE: params.data.gate_size}
        return carved.get(split, sizes.get(train_split, 0) - sum(carved.values()))
    if split not in sizes:
        raise PgrankError(f"{dataset} has no split {split!r} (it has {', '.join(k for k in sizes if k != 'documents')})")
    return sizes[split]


def _facts(params: Params, name: str) -> tuple[str, int | None, int | None]:
    """``(hub id or folder, dimension, parameters)`` of a model name, without loading it."""
    hub = params.models.aliases.get(name, name)
    dim, size = MODEL_FACTS.get(hub, (None, None))
    return hub, dim, size


def make_plan(params: Params, paths: Paths, profile: str = "paper") -> Plan:
    """Count every stage's work for ``params`` (see the module docstring)."""
    train_dataset = params.data.train.split("/")[0]
    eval_sets = params.data.eval_sets_by_dataset()
    held_out = [name.split("/") for name in params.train.validation_sets]  # mined by mine-train, validated every epoch
    sizes = {d: dataset_sizes(params, paths, d)
             for d in dict.fromkeys([train_dataset, *(d for d, _ in held_out), *eval_sets])}
    plan = Plan(profile, sizes)
    plan.words = {d: mean_words(paths, d)[0] for d in sizes}
    built: set[tuple[str, int, str]] = set()  # corpus-embedding artifacts, as the pipeline reuses them
    mine, C = params.mine, params.mine.candidates

    def lengths(line: Line, dataset: str, doc_limit: int, query_limit: int) -> Line:
        q, d = plan.words[dataset]
        line.doc_tokens, line.query_tokens = tokens_of(d, doc_limit), tokens_of(q, query_limit)
        return line

    def artifact(model: str, length: int, dataset: str) -> tuple[int, int | None, str]:
        """Documents to encode and bytes for (model, length, corpus); 0 if an earlier stage built it."""
        hub, dim, _ = _facts(params, model)
        key = (hub, length, dataset)
        if key in built:
            return 0, 0, f"reuses {model} L{length}"
        built.add(key)
        n = sizes[dataset]["documents"]
        return n, (n * dim * 2 if dim else None), ""

    def add(line: Line) -> None:
        plan.lines.append(line)

    # ---- download: the corpus stores every stage reads by row
    for dataset, s in sizes.items():
        add(Line("download", dataset, disk=s["documents"] * CORPUS_STORE_DOC_BYTES, note="corpus store"))

    # ---- mining
    def mine_line(stage: str, dataset: str, splits: list[str], training: bool = False) -> None:
        source = mine.training_source if training else mine.source
        queries = sum(_queries(sizes[dataset], dataset, s, params) for s in splits)
        size = min(C, sizes[dataset]["documents"])
        pairs = queries * size
        trec = sum(_queries(sizes[dataset], dataset, s, params) * size for s in splits
                   if not training or mine.training_runs)
        disk = pairs * STORE_PAIR_BYTES + trec * TREC_LINE_BYTES
        if source == "dense":
            docs, emb, note = artifact(mine.model, mine.max_seq_length, dataset)
            add(lengths(Line(stage, mine.model, docs=docs, queries=queries, pairs=pairs,
                           disk=None if emb is None else disk + emb, note=note), dataset, mine.max_seq_length, mine.max_seq_length))
        elif source == "bm25":
            add(Line(stage, "bm25", pairs=pairs, disk=disk, note="BM25 index: ? bytes"))
        else:
            add(Line(stage, "published", pairs=pairs, disk=disk))

    mine_line("mine-train", train_dataset, carved_splits(params.data), training=True)
    for dataset, split in held_out:
        mine_line("mine-train", dataset, [split], training=True)
    for dataset, splits in eval_sets.items():
        mine_line(f"mine@{dataset}", dataset, splits)

    # ---- training, one policy per warm start and objective
    cfg = params.train
    train_queries = _queries(sizes[train_dataset], train_dataset, CARVED_TRAIN, params)
    validation = _queries(sizes[train_dataset], train_dataset, VALIDATION, params) + sum(
        _queries(sizes[d], d, split, params) for d, split in held_out)
    for warm, (objective, seed) in [(w, r) for w in cfg.warm_starts for r in cfg.runs()]:
        _, _, size = _facts(params, warm)
        run = cfg.for_run(objective, seed)  # a variant's own settings (pg.num_samples, epochs, ...)
        samples = run.pg.num_samples if cfg.objective_of(objective) == "pg" else 0  # the other losses sample no rankings
        kept = len(set(run.keep_epochs) | {run.epochs}) * (2 if run.tower == "query" else 1)
        checkpoints = kept * size * 4 if size else None
        per_epoch = run.queries_per_epoch or train_queries
        readings = [("train", per_epoch, "")]
        if run.queries_per_epoch is None and samples:
            other = min(run.pg.num_samples, train_queries)
            readings.append(("  (other reading)", other, f"train.queries_per_epoch={other}"))
        for label, queries, note in readings:
            stage = f"train@{warm}-{objective}" if seed is None else f"train-seeds@{warm}-{objective}-{seed}"
            line = Line(stage if label == "train" else label, warm,
                        rankings=queries * samples * run.epochs,
                        pairs=queries * C * run.epochs, note=note)
            val_queries = validation * (run.epochs + 1)
            line.grad_queries, line.queries = queries * run.epochs, val_queries
            if run.tower == "both":
                line.grad_docs = queries * C * run.epochs
                line.docs = line.grad_docs + val_queries * C  # the no-grad first pass; validation
                line.disk = checkpoints
            else:
                line.docs, emb, reuse = artifact(warm, run.max_doc_length, train_dataset)
                line.disk = None if checkpoints is None or emb is None else checkpoints + emb
                line.note = line.note or reuse
            add(lengths(line, train_dataset, run.max_doc_length, run.max_query_length))

    # ---- evaluation, one stage per system and dataset
    ev = params.evaluate
    for dataset, splits in eval_sets.items():
        queries = sum(_queries(sizes[dataset], dataset, s, params) for s in splits)
        n = sizes[dataset]["documents"]
        rerank = queries * min(C, n) if "rerank" in ev.stages else 0
        full = queries * min(ev.top_k, n) if "full" in ev.stages else 0
        results = (rerank + full) * TREC_LINE_BYTES
        for system in ev.systems.bm25:
            add(Line(f"evaluate-bm25@{system}-{dataset}", "bm25", pairs=rerank, disk=results))
        for system in ev.systems.dense:
            docs, emb, note = artifact(system, ev.max_seq_length, dataset) if full else (0, 0, "rerank only")
            add(lengths(Line(f"evaluate-dense@{system}-{dataset}", system, docs=docs, queries=queries, pairs=rerank,
                             disk=None if emb is None else emb + results, note=note), dataset, ev.max_seq_length, ev.max_seq_length))
        for system in ev.systems.sparse:
            add(lengths(Line(f"evaluate-sparse@{system}-{dataset}", system, docs=n, queries=queries, pairs=rerank, disk=None,
                             note="corpus matrix: ? bytes"), dataset, ev.max_seq_length, ev.max_seq_length))
        for warm, (objective, seed) in [(w, r) for w in cfg.warm_starts for r in cfg.runs()]:
            run = cfg.for_run(objective, seed)
            if run.tower == "query":
                docs, emb, note = artifact(warm, ev.max_seq_length, dataset) if full else (0, 0, "")
            elif full:  # the policy's own corpus embeddings
                docs, emb, note = (n, None if _facts(params, warm)[1] is None else n * _facts(params, warm)[1] * 2, "")
            else:  # rerank only: the documents of the candidate sets, and no artifact
                docs, emb, note = min(n, rerank), 0, "rerank only"
            kept = run.kept_inside(ev.policy_epochs)
            subset = 0 if run.tower == "query" else len(kept) * min(n, rerank)  # rerank-only: candidates alone
            stage = (f"evaluate-policy@{warm}-{objective}-{dataset}" if seed is None
                     else f"evaluate-policy-seeds@{warm}-{objective}-{seed}-{dataset}")
            add(lengths(Line(stage, policy_name(warm, run_key(objective, seed)), docs=docs + subset,
                             queries=queries * (1 + len(kept)), pairs=rerank * (1 + len(kept)),
                             disk=None if emb is None else emb + results * 2,
                             note=(note + (f"; epochs {kept}: rerank only" if kept else "")).strip("; "), encode_model=warm),
                        dataset, ev.max_seq_length, ev.max_seq_length))
    add(Line("tables", "-"))
    return price_from_table(params, plan)


def _encoders(plan: Plan) -> list[str]:
    """The models whose throughput prices some line (in plan order)."""
    return [m for m in dict.fromkeys(line.encode_model or line.model for line in plan.lines
                                     if line.docs or line.queries or line.grad_docs or line.grad_queries)
            if m not in ("bm25", "published", "-")]


def price(plan: Plan) -> Plan:
    """Set every line's hours from ``plan.rates`` at its texts' mean lengths (lines of a model without rates: none)."""
    for line in plan.lines:
        rates = plan.rates.get(line.encode_model or line.model)
        if not isinstance(rates, ModelRates):
            line.hours = None
            continue
        step = rates.step_seconds_at(line.doc_tokens) if line.grad_docs else None
        if step is not None:  # a measured tower:both step prices both cached-gradient passes of every candidate
            seconds = [line.grad_docs * step, (line.docs - line.grad_docs) / (rates.inference_at(line.doc_tokens) or math.nan)]
        else:
            seconds = [line.docs and line.docs / (rates.inference_at(line.doc_tokens) or math.nan),
                       line.grad_docs and line.grad_docs / (rates.grad_at(line.doc_tokens) or math.nan)]
        seconds += [line.queries and line.queries / (rates.inference_at(line.query_tokens) or math.nan),
                    line.grad_queries and line.grad_queries / (rates.grad_at(line.query_tokens) or math.nan)]
        total = sum(seconds)
        line.hours = None if math.isnan(total) else total / 3600
    return plan


def price_from_table(params: Params, plan: Plan) -> Plan:
    """Price the paper's models from ``measured_rates.yaml`` (:mod:`pgrank.pipeline.rates`), for this machine's GPU
    where the table has it, else for the table's GPU, which the plan then names."""
    import torch

    here = torch.cuda.get_device_name(0) if torch.cuda.is_available() else None
    device = table_device(here)
    rates = {m: table_rates(_facts(params, m)[0], device) for m in _encoders(plan)}
    plan = replace(plan, rates={m: r for m, r in rates.items() if r is not None}, device=device)
    plan.pricing = (f"hours from throughput measured on an {device} (`python bench/gpu.py`, pgrank/pipeline/"
                    f"measured_rates.yaml){'' if here == device else ', not on this machine'}; models without "
                    "measured rates are not priced: `pgrank plan --calibrate` measures every model here")
    plan.stale = stale_note(device, plan.rates) or ""
    return price(plan) if plan.rates else plan


# --------------------------------------------------------------------------------------- calibration


def calibrate(params: Params, paths: Paths, plan: Plan, *, device: str | None = None, seconds: float = 3.0) -> Plan:
    """Measure each model's throughput on ``device`` and price every line in hours.

    Per model, texts a second at texts of 32 to 512 tokens (up to its truncation length), each for about ``seconds``,
    CUDA-synchronised: forward only at its stage's batch size (``mine.batch_size`` for the miner,
    ``evaluate.batch_size`` otherwise), under its inference backend; for warm starts also forward and backward under
    ``train.amp`` in chunks of ``train.grad_chunk_size``. Each line is then priced at its texts' mean length. A model
    that cannot be loaded here (no network, say) is reported and left unpriced.
    """
    import torch

    device = device or ("cuda" if torch.cuda.is_available() else "cpu")
    plan = replace(plan, rates={}, device=device, stale="")
    for name in _encoders(plan):
        try:
            plan.rates[name] = measure_rates(params, paths, name, device, seconds, train=name in params.train.warm_starts)
        except Exception as exc:  # a model that will not load here: say so, price the rest
            plan.rates[name] = f"{type(exc).__name__}: {str(exc).splitlines()[0][:80]}"
    plan.pricing = f"hours from throughput calibrated here, on {device}"
    return price(plan)


# --------------------------------------------------------------------------------------- rendering


def _count(n: int) -> str:
    if n == 0:
        return "0"
    if n < 10_000:
        return f"{n:,}"
    exp = int(math.floor(math.log10(n)))
    return f"{n / 10**exp:.2f}e{exp}"


def _bytes(n: int | None) -> str:
    if n is None:
        return "?"
    for unit, size in (("TB", 1e12), ("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if n >= size:
            return f"{n / size:.1f} {unit}"
    return f"{n} B"


COUNTS = ("docs", "queries", "grad_docs", "grad_queries", "rankings", "pairs")


def totals(plan: Plan) -> Line:
    """The sum of the plan's stages (the alternative readings, indented, are not part of it)."""
    main = [line for line in plan.lines if not line.stage.startswith(" ")]
    total = Line("total", "", **{k: sum(getattr(x, k) for x in main) for k in COUNTS})
    total.disk = None if any(x.disk is None for x in main) else sum(x.disk for x in main)
    hours = [x.hours for x in main if x.hours is not None]
    total.hours = sum(hours) if hours else None
    priced = [x for x in main if x.docs or x.queries or x.grad_docs or x.grad_queries]
    total.note = "hours of the priced stages only" if hours and len(hours) < len(priced) else ""
    return total


def render(plan: Plan) -> str:
    """The plan as a Markdown table (with totals) and the dataset sizes it used."""
    head = ["stage", "model", "docs encoded", "queries encoded", "docs with grad", "queries with grad", "rankings",
            "pairs", "disk", "hours", "note"]
    out = [f"# pgrank plan: {plan.profile}", "", "| " + " | ".join(head) + " |", "|" + " --- |" * len(head)]
    for line in [*plan.lines, totals(plan)]:
        cells = [line.stage if line.stage != "total" else "**total**", line.model,
                 *(_count(getattr(line, k)) for k in COUNTS), _bytes(line.disk),
                 "-" if line.hours is None else f"{line.hours:.3g}", line.note]
        out.append("| " + " | ".join(cells) + " |")
    out += ["", "datasets: " + "; ".join(f"{d} {s['documents']:,} documents, "
                                          + ", ".join(f"{k} {v:,}" for k, v in s.items() if k != "documents")
                                          for d, s in plan.sizes.items())]
    if plan.pricing:
        out.append(plan.pricing)
    if plan.stale:
        out.append(plan.stale)
    for model, r in plan.rates.items():
        if isinstance(r, str):
            out.append(f"- {model}: not priced ({r})")
        else:
            out.append(f"- {model} (texts a second by tokens): inference " + ", ".join(f"{k}: {v:,.0f}" for k, v in sorted(r.inference.items()))
                       + ("; forward+backward " + ", ".join(f"{k}: {v:,.0f}" for k, v in sorted(r.grad.items())) if r.grad else ""))
    return "\n".join(out)
