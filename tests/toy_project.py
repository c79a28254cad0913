"""A tiny BEIR-shaped project on disk: corpus, queries, qrels, carve-out, candidate runs, params.

The corpus is synthetic but structured: every query shares topic words with its relevant documents,
so even a small encoder can learn the task. Used by the training tests with the tiny in-code BERT.
"""

from __future__ import annotations

import json
import random
from pathlib import Path

import yaml

from pgrank.config import Params, parse_params
from pgrank.data.beir import load_topics
from pgrank.data.candidate_store import run_sets, write_candidates
from pgrank.data.corpus_store import open_corpus
from pgrank.download.carve_out import write_carve_out
from pgrank.paths import Paths, carved_splits

ROOT = Path(__file__).resolve().parents[1]
TOPICS = ["protein folding", "solar wind", "tax policy", "river delta", "neural network", "coral reef",
          "vaccine trial", "bond market", "glacier melt", "quantum dot", "soil carbon", "jet engine"]
FILLER = "the of and in study results data method analysis effect model new large small".split()


def write_dataset(folder: Path, *, docs_per_topic: int = 6, queries_per_topic: int = 2, seed: int = 0) -> None:
    rng = random.Random(seed)
    (folder / "qrels").mkdir(parents=True, exist_ok=True)
    corpus, queries, qrels = [], [], []
    for t, topic in enumerate(TOPICS):
        for j in range(docs_per_topic):
            words = topic.split() * 2 + rng.sample(FILLER, 6)
            rng.shuffle(words)
            corpus.append({"_id": f"d{t}-{j}", "title": topic.title() if j % 2 else "", "text": " ".join(words)})
        for j in range(queries_per_topic):
            qid = f"q{t}-{j}"
            queries.append({"_id": qid, "text": f"what is known about {topic} {rng.choice(FILLER)}"})
            for rel_doc in range(2):  # two relevant documents, graded 2 and 1
                qrels.append((qid, f"d{t}-{(j + rel_doc) % docs_per_topic}", 2 - rel_doc))
    (folder / "corpus.jsonl").write_text("".join(json.dumps(d) + "\n" for d in corpus))
    (folder / "queries.jsonl").write_text("".join(json.dumps(q) + "\n" for q in queries))
    lines = ["query-id\tcorpus-id\tscore"] + [f"{q}\t{d}\t{s}" for q, d, s in qrels]
    (folder / "qrels" / "train.tsv").write_text("\r\n".join(lines) + "\r\n")


def make_project(tmp: Path, model_dir: Path, *, overrides: dict | None = None, candidates: int = 10) -> tuple[Params, Paths]:
    """Write the toy dataset, carve-out and candidate sets (stores and runs); return (params, paths)."""
    doc = yaml.safe_load((ROOT / "params.yaml").read_text())
    doc["paths"] = {"root": str(tmp / "runs"), "data": str(tmp / "data"), "embeddings": str(tmp / "emb")}
    doc["data"].update({"train": "toy/train", "validation_size": 6, "eval_sets": ["toy/train"], "mirror": None})
    doc["evaluate"].update({"systems": {"dense": [str(model_dir)]}, "policy_epochs": []})
    doc["tracking"]["enabled"] = False
    doc["mine"].update({"batch_size": 16, "chunk_size": 32})
    doc["train"].update({
        "warm_starts": [str(model_dir)], "tower": "query", "epochs": 2, "batch_size": 6, "learning_rate": 1e-3,
        "keep_epochs": [0, 1, 2], "max_query_length": 32, "max_doc_length": 32, "chunk_tokens": 100, "seed": 3,
    })
    doc["train"]["pg"].update({"num_samples": 8})
    for key, value in (overrides or {}).items():
        node = doc
        *head, last = key.split(".")
        for part in head:
            node = node.setdefault(part, {})
        node[last] = value
    params = parse_params(doc, "test-params")
    paths = Paths.from_config(params.paths)
    write_dataset(paths.dataset("toy"))
    write_carve_out(paths, params.data)
    rng = random.Random(1)
    corpus_ids = [json.loads(line)["_id"] for line in (paths.dataset("toy") / "corpus.jsonl").read_text().splitlines()]
    from pgrank.data.beir import load_topics

    corpus = open_corpus(paths, "toy")
    for split in carved_splits(params.data):
        queries, qrels = load_topics(paths, "toy", split)
        run = {}
        for qid, judged in qrels.items():
            others = [d for d in corpus_ids if d not in judged]
            chosen = list(judged) + rng.sample(others, candidates - len(judged))
            run[qid] = {d: float(candidates - i) for i, d in enumerate(chosen)}
        write_candidates(paths, "toy", split, run_sets(run, corpus, queries, qrels), corpus=corpus, tag="pgrank-test",
                         trec=True)
    return params, paths


def with_other_dataset(tmp: Path, model_dir: Path, overrides: dict) -> tuple[Params, Paths]:
    """The toy project plus a second toy dataset, ``other``, as the out-of-domain validation set ``other/dev``: its
    train queries renamed to dev, and their candidate sets mined as a training set's are (the judged documents and 8
    random others per query)."""
    params, paths = make_project(tmp, model_dir, overrides={"train.validation_sets": ["other/dev"], **overrides})
    write_dataset(paths.dataset("other"), seed=7)
    (paths.dataset("other") / "qrels" / "train.tsv").rename(paths.dataset("other") / "qrels" / "dev.tsv")
    corpus = open_corpus(paths, "other")
    queries, qrels = load_topics(paths, "other", "dev")
    ids = [json.loads(line)["_id"] for line in (paths.dataset("other") / "corpus.jsonl").read_text().splitlines()]
    rng = random.Random(2)
    run = {q: {d: 1.0 / (i + 1) for i, d in enumerate(list(judged) + rng.sample([d for d in ids if d not in judged], 8))}
           for q, judged in qrels.items()}
    write_candidates(paths, "other", "dev", run_sets(run, corpus, queries, qrels), corpus=corpus, tag="dev",
                     trec=False, training=True)
    return params, paths


def plain_backprop(model, examples, batch, corpus, params: Params, device="cpu") -> None:
    """The reference the cached-gradient training step is compared with: the batch's policy-gradient loss through
    one uncached forward of both towers and one ``backward()``, with the step's own per-query random streams."""
    from pgrank.core.estimators import policy_gradient
    from pgrank.training.batches import candidate_scores, query_generators
    from pgrank.training.grad_cache import encode

    cfg, pg = params.train, params.train.pg
    q = encode(model, [e.query for e in examples], task="query", max_length=cfg.max_query_length)
    d = encode(model, corpus.texts(batch.unique_rows), task="document", max_length=cfg.max_doc_length)
    policy_gradient(candidate_scores(q, d, batch.index, cfg.similarity), batch.relevance, batch.mask,
                    num_samples=pg.num_samples, utility=pg.utility, estimator=pg.estimator, baseline=pg.baseline,
                    temperature=pg.temperature, entropy_coef=pg.entropy_coef, entropy=pg.entropy,
                    generator=query_generators(cfg.seed, 1, [e.qid for e in examples], device)).loss.backward()


def training_batch(tmp: Path, model_dir: Path, tower: str, **overrides):
    """A toy project with ``train.tower`` and ``overrides``, and what one training step reads: ``(params, paths,
    the warm start's ModelRef, the corpus store, the frozen documents (tower: query, else None), a batch of six
    train-pg queries)``."""
    from pgrank.data.candidate_store import open_candidates
    from pgrank.models.names import resolve_model
    from pgrank.training.batches import TrainingSet, frozen_documents, make_batch

    params, paths = make_project(tmp, model_dir, overrides={"train.tower": tower, **overrides})
    corpus = open_corpus(paths, "toy")
    ref = resolve_model(str(model_dir), params.models)
    frozen = frozen_documents(params, paths, ref, corpus) if tower == "query" else None
    batch = make_batch(TrainingSet(open_candidates(paths, "toy", "train-pg")).examples(range(6)))
    return params, paths, ref, corpus, frozen, batch


def step_of(params: Params, paths, model, examples, corpus, *, reference=None, device="cpu", epoch: int = 1,
            split: str = "train-pg"):
    """What the trainer hands a step over ``examples`` of the toy split: its token stores (built on first use,
    packing switched on where the model packs) and the laid-out inputs (:mod:`pgrank.training.step_inputs`)."""
    import torch

    from pgrank.data.candidate_store import open_candidates
    from pgrank.training.step_inputs import prepare_step, step_tokens

    tokens = step_tokens(params, paths, open_candidates(paths, "toy", split), corpus, model,
                         reference=getattr(reference, "model", None))
    return prepare_step(list(examples), params, tokens, epoch=epoch, model=model, device=torch.device(device))
