"""What an exported policy's model card says, as data: :class:`PolicyFacts` (gathered by
:func:`pgrank.export.model_card.policy_facts`) and the nDCG@10 figures in it (:class:`Figure`)."""

from __future__ import annotations

from dataclasses import dataclass, field

UNKNOWN_LICENSE = "other"  # the hub's license id when no license is known


@dataclass(frozen=True)
class Figure:
    """nDCG@10 of the policy on one ``dataset/split`` and stage, beside its warm start's."""

    dataset: str
    split: str
    stage: str
    queries: int
    ndcg: float
    warm_start: float | None = None
    p_value: float | None = None  # paired test against the warm start (evaluate.significance.test)
    encoding: tuple[tuple[str, str], ...] = ()  # metrics.json's "encoding": backends and stored precision


@dataclass(frozen=True)
class PolicyFacts:
    """What the model card says about one policy."""

    system: str
    warm_start: str  # as configured (alias, hub id or folder)
    warm_start_model: str  # what it stands for (hub id or folder)
    base_model: str | None  # its hub id, when it is a hub model
    loss: str  # the objective's loss: pg, infonce, ...
    run: str  # the run's name: train.objectives entry [.s<seed>]
    tower: str
    similarity: str
    max_seq_length: int
    train_set: str  # data.train
    train_queries: int | None
    validation_queries: int | None
    candidates: str  # how each query's candidate set was mined
    epoch: int
    epochs: int
    selection: str
    hyperparameters: dict[str, str] = field(default_factory=dict)
    figures: list[Figure] = field(default_factory=list)
    datasets: list[str] = field(default_factory=list)  # hub dataset ids of the training and evaluation data
    significance_test: str = ""
    backend: str = ""
    objective: str = ""  # what trained it, truthfully named (objective_name)
    license: str = UNKNOWN_LICENSE
    license_source: str = ""  # where the license was read
    repository: str | None = None  # pgrank's code (card_metadata.repository_url)
    pools: dict[str, str] = field(default_factory=dict)  # dataset/split -> what it is when it is not BEIR's own
    documents: dict[str, int] = field(default_factory=dict)  # dataset -> corpus documents, where counted
    not_evaluated: list[str] = field(default_factory=list)  # configured dataset/split/stage without results
