"""The models of a training run, built from one read of each weight file.

A run needs up to three models with the warm start's weights:

* the policy being trained: the warm start (from a ``tower: query`` checkpoint, continual training: its
  query route, :func:`pgrank.training.checkpoints.query_route`);
* the KL reference (``train.pg.kl_coef > 0``, :mod:`pgrank.training.reference`): the same weights, frozen;
* the frozen document side of a ``tower: query`` checkpoint: the document encoder's weights, the warm
  start's own unless the warm start is a ``tower: query`` checkpoint, whose document encoder they are.

The warm start is read once; the reference and a document side with the same weights are copies of it in
memory, made before training changes the policy. A document encoder of its own (continual training) is
read once, when the first checkpoint is saved. Copying draws no random numbers, so the run's random
stream is the one of a run that reads the weights for each model.

Example:
    >>> models = load_models(ref, doc_ref, params, torch.device("cpu"), reference=True)
    >>> models.policy.train(); models.reference.scores(batch, frozen=frozen)
"""

from __future__ import annotations

import copy
import functools
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from pgrank.config import Params
from pgrank.training import checkpoints
from pgrank.training.reference import ReferencePolicy


@dataclass(frozen=True)
class RunModels:
    """The policy being trained, its frozen KL reference (or ``None``) and, for ``tower: query``, the frozen
    document side that every checkpoint is saved with (or ``None``)."""

    policy: Any
    reference: ReferencePolicy | None
    documents: Callable[[], Any] | None


def policy_model(ref: Any, doc_ref: Any, params: Params, device: torch.device | str) -> Any:
    """The warm start as the policy is built from it: read from ``ref``'s weights (a ``tower: query``
    checkpoint, ``doc_ref`` not ``ref``: its query route), with ``train.similarity``."""
    from pgrank.models.loading import load_encoder

    model = load_encoder(ref, params.models, device=str(device), max_seq_length=params.train.max_doc_length)
    if doc_ref is not ref:
        model = checkpoints.query_route(model)
    model.similarity_fn_name = params.train.similarity
    return model


def load_models(ref: Any, doc_ref: Any, params: Params, device: torch.device, *, reference: bool) -> RunModels:
    """The run's models (see the module docstring); ``doc_ref`` is ``ref`` unless the warm start is a
    ``tower: query`` checkpoint, ``reference``: whether the objective needs the KL reference."""
    from pgrank.models.loading import load_encoder

    cfg = params.train
    policy = policy_model(ref, doc_ref, params, device)
    documents = None
    if cfg.tower == "query" and doc_ref is ref:
        pristine = copy.deepcopy(policy)
        documents = lambda: pristine  # noqa: E731
    elif cfg.tower == "query":
        documents = functools.cache(
            lambda: load_encoder(doc_ref, params.models, device=str(device), max_seq_length=cfg.max_doc_length))
    frozen = ReferencePolicy(copy.deepcopy(policy), cfg) if reference else None
    return RunModels(policy, frozen, documents)
