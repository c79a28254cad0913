"""Which retriever kind evaluates a system, looked up by name through one dict.

``evaluate.systems`` lists the comparison systems by kind (``bm25``, ``dense``, ``sparse``); the trained
policies ``pgrank-<warm start>[+objective][@epoch]`` are dense. Each kind is the package
``pgrank/retrieval/<kind>``, imported only when a system of that kind is evaluated, so one DVC stage per
kind (``evaluate-<kind>``) depends on its own code and no other kind's.
"""

from __future__ import annotations

import importlib

from pgrank.config import Params
from pgrank.errors import PgrankError
from pgrank.paths import Paths, parse_policy_name, policy_name, run_key, split_run_key

# kind -> the module with for_evaluation(params, paths, system, dataset, *, candidates) -> retriever
KINDS: dict[str, str] = {
    "bm25": "pgrank.retrieval.bm25.retriever",
    "dense": "pgrank.retrieval.dense.retriever",
    "sparse": "pgrank.retrieval.sparse.retriever",
}


def policy_systems(params: Params) -> list[str]:
    """The trained policies, one per warm start, objective and seed: ``pgrank-<warm start>[+objective][.s<seed>]``."""
    return [policy_name(w, run_key(o, s)) for w in params.train.warm_starts for o, s in params.train.runs()]


def warm_start_of(system: str) -> str | None:
    """The warm start of a policy (``pgrank-minilm+listnet@2`` -> ``minilm``), else ``None``."""
    policy = parse_policy_name(system)
    return None if policy is None else policy.warm


def canonical(system: str) -> str:
    """A policy's canonical name (``pgrank-minilm+pg`` -> ``pgrank-minilm``); other systems unchanged."""
    policy = parse_policy_name(system)
    return system if policy is None else policy.name


def kind_of(params: Params, system: str) -> str:
    """``bm25``, ``dense`` or ``sparse``; a policy is dense.

    Raises:
        PgrankError: the name is neither a policy nor listed under ``evaluate.systems``.
    """
    policy = parse_policy_name(system)
    if policy is not None:
        objective, seed = split_run_key(policy.objective)
        if objective not in params.train.objectives:
            raise PgrankError(f"system {system!r}: objective {objective!r} is not in train.objectives "
                              f"{params.train.objectives}")
        if seed is not None and seed not in params.train.extra_seeds:
            raise PgrankError(f"system {system!r}: seed {seed} is not in train.extra_seeds {params.train.extra_seeds}")
        return "dense"
    kind = params.evaluate.systems.kind(system)
    if kind is None:
        raise PgrankError(f"system {system!r} is not listed under evaluate.systems (bm25: "
                          f"{params.evaluate.systems.bm25}, dense: {params.evaluate.systems.dense}, sparse: "
                          f"{params.evaluate.systems.sparse}) and is not a policy pgrank-<warm start>[+objective]")
    return kind


def open_system(params: Params, paths: Paths, system: str, dataset: str, *, candidates=None):
    """The retriever that evaluates ``system`` on ``dataset`` (opens its corpus, index or embeddings once).

    ``candidates``: for a rerank-only evaluation, the corpus rows of the candidate sets (a dense model
    without a corpus-embedding artifact then encodes only those).
    """
    module = importlib.import_module(KINDS[kind_of(params, system)])
    return module.for_evaluation(params, paths, system, dataset, candidates=candidates)
