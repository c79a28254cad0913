"""A training run's data and state: what the steps of :mod:`pgrank.training.trainer` share.

:class:`TrainingData` is what a run trains and validates on (:func:`open_data`); :class:`Run` holds it with
the run's models, optimizer and trainer state. Both are plain data: the steps are the trainer's functions.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from pgrank.config import Params
from pgrank.paths import CARVED_TRAIN, VALIDATION, Paths
from pgrank.training import checkpoints, distributed
from pgrank.training.batches import FrozenDocuments, TrainingSet, frozen_documents, training_set
from pgrank.training.validation_ndcg import ValidationSet, out_of_domain_set, qrels_by_row
from pgrank.training.warm_start import RunModels


@dataclass(frozen=True)
class TrainingData:
    """What a run trains and validates on. Every rank memory-maps the same corpus and candidate stores:
    nothing of either is a private copy."""

    corpus: Any  # the corpus store of data.train's dataset
    train: TrainingSet  # the carved train-pg split
    validation: TrainingSet  # the carved validation split
    validation_qrels: dict  # its judgments, keyed by corpus row
    frozen: FrozenDocuments | None  # tower: query: the document encoder's corpus embeddings
    out_of_domain: list[ValidationSet]  # train.validation_sets

    def digests(self) -> list[str | None]:
        """The content digests of the candidate stores trained and validated on (part of the fingerprint)."""
        return [s.store.meta.get("sha256") for s in (self.train, self.validation, *(v.examples for v in self.out_of_domain))]


def open_data(params: Params, paths: Paths, doc_ref, *, progress: bool) -> TrainingData:
    """Open ``data.train``'s carved splits, their corpus and the out-of-domain validation sets."""
    from pgrank.data.beir import load_topics
    from pgrank.data.corpus_store import open_corpus

    cfg = params.train
    dataset = params.data.train.split("/")[0]
    corpus = open_corpus(paths, dataset, progress=progress)
    train_examples = training_set(paths, dataset, CARVED_TRAIN, corpus)
    val_examples = training_set(paths, dataset, VALIDATION, corpus)
    val_qrels = qrels_by_row(load_topics(paths, dataset, VALIDATION)[1], corpus)
    frozen = frozen_documents(params, paths, doc_ref, corpus) if cfg.tower == "query" else None
    ood = [out_of_domain_set(params, paths, name, doc_ref) for name in cfg.validation_sets]
    return TrainingData(corpus, train_examples, val_examples, val_qrels, frozen, ood)


@dataclass
class Run:
    """One training run: what :func:`pgrank.training.trainer.setup` made (data, models, optimizer, the settings'
    fingerprint) and, once resumed, its trainer state and DDP wrapper."""

    params: Params
    paths: Paths
    warm_start: str  # as named by the user
    objective: str
    ref: Any  # the warm start, resolved
    doc_ref: Any  # what encodes the documents (the warm start, or a tower: query warm start's document encoder)
    world: distributed.World
    device: torch.device
    data: TrainingData
    fingerprint: str
    models: RunModels
    trainable: list[torch.nn.Parameter]
    optimizer: torch.optim.Optimizer
    scheduler: torch.optim.lr_scheduler.LRScheduler
    state: checkpoints.TrainerState | None = None
    forward: Any = None  # the DDP wrapper of the policy (the policy itself in one process)
    no_sync: Any = None
    anchor: Any = None  # the warm start's weights (pgrank.training.weight_space.Anchor), when mixtures or L2 need them
    name: str = ""  # the run's folders' name (pgrank.paths.run_key): the objectives entry, .s<seed> at an extra seed
    tokens: Any = None  # the steps' token stores (pgrank.training.step_inputs.StepTokens)

    @property
    def cfg(self):
        return self.params.train
