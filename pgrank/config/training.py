"""The ``train`` section of ``params.yaml``: the optimiser, the policy gradient's knobs (``train.pg``), the
selection of the policy among epochs and mixtures (``train.selection``), the document anchor, and the runs a
profile trains (``objectives``, ``variants``, ``extra_seeds``)."""

from __future__ import annotations

import re
from typing import Annotated, Any, Literal

from pydantic import Field, ValidationError, field_validator, model_validator

from pgrank.config.files import merge, pydantic_message
from pgrank.config.sections import NonNegFloat, NonNegInt, PositiveFloat, PositiveInt, Section

_UTILITY_NAME = re.compile(r"^(ndcg|dcg|mrr|rr|recall|ap|map)@(\d+)$|^[\w.]+:[\w.]+$")


class PolicyGradientConfig(Section):
    """Knobs of ``pgrank.core.estimators.pg_loss`` (paper Eq. 8/9 and appendix table)."""

    utility: str = "ndcg@10"
    estimator: Literal["per_rank", "whole", "plrank3"] = Field(
        default="per_rank", description="per_rank: Eq. 9; whole: Eq. 8; plrank3: PL-Rank-3 (Oosterhuis, SIGIR 2022), "
                                        "for ndcg, dcg and recall")
    baseline: Literal["loo", "none"] = "loo"
    num_samples: PositiveInt = 5000
    temperature: PositiveFloat = 0.05
    entropy_coef: NonNegFloat = 0.01
    entropy: Literal["top1", "ranking"] = "top1"
    kl_coef: NonNegFloat = Field(default=0.0, description="weight of the KL to the warm start's policy (0: the paper; objective pg only)")
    kl: Literal["top1", "ranking"] = Field(
        default="top1", description="top1: exact KL of the first-place softmaxes; ranking: sampled KL of the PL rankings")

    @field_validator("utility")
    @classmethod
    def _utility_name(cls, v: str) -> str:
        if not _UTILITY_NAME.match(v):
            raise ValueError(f"expected 'ndcg@K', 'dcg@K', 'mrr@K', 'recall@K', 'ap@K' or 'module:function' (got {v!r})")
        return v


class DocumentAnchorConfig(Section):
    """The query tower kept close to the warm start's document tower on documents (``pgrank.core.drift``)."""

    coef: NonNegFloat = Field(
        default=0.0, description="weight of the mean 1 - cos(query tower(d), warm start's document tower(d)) over "
                                 "documents d drawn from each batch's candidates (0: the paper)")
    documents: PositiveInt = Field(default=8, description="candidate documents drawn per (local) batch, read by "
                                                          "the query tower up to train.max_doc_length tokens")


class SelectionConfig(Section):
    """Which epoch is the policy (``pgrank-<warm start>``), and when training stops early."""

    rule: Literal["last", "in_domain", "guarded"] = Field(
        default="last", description="last: the final epoch (the paper); in_domain: the best in-domain validation "
                                    "nDCG@10; guarded: the best in-domain one among the points that pass `guard` on "
                                    "every train.validation_sets set against the warm start (none: the warm start)")
    guard: Literal["margin", "noise"] = Field(
        default="margin", description="guarded: what an out-of-domain set may lose against the warm start. margin: "
                                      "at most `margin` nDCG@10; noise: no more than its own noise, the mean per-query "
                                      "difference at least -noise_se paired standard errors (every set must pass)")
    margin: NonNegFloat = Field(default=0.005, description="guard margin: the out-of-domain nDCG@10 loss allowed")
    noise_se: PositiveFloat = Field(
        default=1.0, description="guard noise: the paired standard errors of per-query nDCG@10 differences an "
                                 "out-of-domain set may lose (a one-sided z-test of no loss: 1 rejects at level "
                                 "0.16, 1.645 at 0.05)")
    patience: PositiveInt | None = Field(
        default=None, description="stop after this many epochs without a newly selected one (null: never)")
    interpolation: list[Annotated[float, Field(gt=0, le=1)]] = Field(
        default_factory=lambda: [1.0],
        description="weight-space mixtures (1 - alpha) * warm start + alpha * epoch validated for every epoch (WiSE-FT); "
                    "the rule picks (epoch, alpha). [1]: the epochs as trained (the paper)")
    within_se: NonNegFloat = Field(
        default=0.0, description="the one-standard-error rule toward the warm start: on the path from the warm start "
                                 "to the rule's choice (its epoch's mixtures), the point nearest the warm start whose "
                                 "in-domain validation nDCG@10 is within this many standard errors (standard_error) of "
                                 "the choice's (1: the classic rule; 0: off, the choice itself)")
    standard_error: Literal["best", "paired"] = Field(
        default="best", description="within_se's error: best: of the best candidate's mean over the in-domain "
                                    "validation queries (the classic rule); paired: of the per-query differences "
                                    "between the two (smaller: a policy farther from the warm start)")

    @model_validator(mode="after")
    def _guard_keys(self) -> SelectionConfig:
        if self.guard == "noise" and self.rule != "guarded":
            raise ValueError("guard: noise (the out-of-domain noise test) needs rule: guarded")
        defaults = type(self).model_fields
        if self.guard == "noise" and self.margin != defaults["margin"].default:
            raise ValueError("margin is the guard: margin's allowance; guard: noise uses noise_se instead")
        if self.guard == "margin" and self.noise_se != defaults["noise_se"].default:
            raise ValueError("noise_se is the guard: noise's allowance; set guard: noise, or margin instead")
        return self

    @field_validator("interpolation")
    @classmethod
    def _distinct_alphas(cls, value: list[float]) -> list[float]:
        if not value or len(set(value)) != len(value):
            raise ValueError("expected distinct alphas in (0, 1], e.g. [0.25, 0.5, 0.75, 1]")
        return sorted(value, reverse=True)


# The training losses (pgrank.core.objectives.OBJECTIVES); pg is the paper's.
Objective = Literal["pg", "infonce", "listnet", "listmle", "listmle_topk", "lambdaloss"]
OBJECTIVE_NAMES: tuple[str, ...] = Objective.__args__
# What train.objectives lists: a loss, or a variant of one (train.variants); a folder and policy-name part.
RunName = Annotated[str, Field(pattern=r"^[a-z][a-z0-9_]*$")]
# train.* keys a variant may not change: they say which runs exist, or what mine-train mines for all of them.
_RUN_LIST_KEYS = ("objectives", "variants", "extra_seeds", "learning_rates", "seed", "warm_starts", "validation_sets")


class VariantConfig(Section):
    """A named training variant: a loss and ``train`` keys laid over the profile's for its runs only
    (``pg_plrank3: {objective: pg, overrides: {pg: {estimator: plrank3}}}``)."""

    objective: Objective = Field(description="the loss this variant trains (a train.objectives loss)")
    overrides: dict[str, Any] = Field(default_factory=dict, description="train keys, nested as in params.yaml")

    @field_validator("overrides")
    @classmethod
    def _no_run_list_keys(cls, value: dict[str, Any]) -> dict[str, Any]:
        bad = sorted(set(value) & set(_RUN_LIST_KEYS))
        if bad:
            raise ValueError(f"{bad} cannot differ per variant: they say which runs exist or what mine-train mines")
        return value


class TrainConfig(Section):
    warm_starts: list[str] = Field(min_length=1)
    tower: Literal["both", "query"] = "both"
    similarity: Literal["dot", "cosine"] = "dot"
    epochs: PositiveInt = 6
    batch_size: PositiveInt = 220
    queries_per_epoch: PositiveInt | None = None
    learning_rate: PositiveFloat = 1e-6
    weight_decay: NonNegFloat = 0.0
    optimizer: Literal["adamw"] = "adamw"
    warmup_steps: NonNegInt = 0
    grad_clip: PositiveFloat | None = 1.0
    max_query_length: PositiveInt = 64
    max_doc_length: PositiveInt = 256
    chunk_tokens: PositiveInt = Field(
        default=262144, description="token budget of one chunk of documents encoded at once (cached-gradient "
                                    "chunking, validation): documents sorted by length, packed without padding "
                                    "where the model allows; at least max_doc_length")
    amp: Literal["bf16", "off"] = "bf16"
    compile_layers: bool = Field(
        default=False, description="compile the packed encoder's layers with torch.compile (inductor), the chunk's "
                                   "token count dynamic: the layers' tails fused (pgrank.models.packed_encoder). Off "
                                   "until measured on a GPU; on a CPU a compiled chunk pass is faster and repays the "
                                   "cold compile after some chunk passes (bench/packed_layers.py)")
    keep_epochs: list[NonNegInt] = Field(default_factory=lambda: [0, 2, 6])
    seed: int = Field(default=42, description="seed of the run: initial shuffles, sampled rankings, dropout")
    validation_sets: list[Annotated[str, Field(pattern=r"^[\w.-]+/[\w.-]+$")]] = Field(
        default_factory=list, description="out-of-domain dataset/split sets validated each epoch next to the "
                                          "in-domain carve-out (mined by mine-train)")
    selection: SelectionConfig = Field(default=SelectionConfig(), description="which (epoch, mixture) becomes "
                                       "the policy, from validation only")
    objectives: list[RunName] = Field(
        default_factory=lambda: ["pg"], min_length=1,
        description="the losses (pgrank.core.objectives) or train.variants names, one policy per warm start and "
                    "entry: pg is the paper's policy gradient (pgrank-<warm>), the others pgrank-<warm>+<entry>")
    variants: dict[RunName, VariantConfig] = Field(
        default_factory=dict, description="named variants of a loss listed in objectives: {name: {objective, "
                                          "overrides: {train keys}}}, e.g. pg_plrank3 with pg.estimator plrank3")
    extra_seeds: list[int] = Field(
        default_factory=list, description="more seeds trained beside train.seed for every objective "
                                          "(pgrank-<warm>+<objective>.s<seed>); the objectives table reports "
                                          "mean +- sd over all seeds")
    learning_rates: dict[RunName, PositiveFloat] = Field(
        default_factory=dict, description="per-objective (or per-variant) learning rate (tuned on validation); "
                                          "a variant without one uses its loss's; the others use learning_rate")
    ddp_timeout_minutes: PositiveInt = Field(
        default=120, description="torch.distributed process-group timeout: a validation pass plus saving a checkpoint")
    l2_to_warm_start: NonNegFloat = Field(
        default=0.0, description="coefficient of ||theta - theta_warm||^2 added to the loss (L2-SP; 0: the paper)")
    document_anchor: DocumentAnchorConfig = Field(default=DocumentAnchorConfig(), description="the query tower "
                                                  "held to the warm start's document tower (off at coef 0)")
    pg: PolicyGradientConfig = Field(default=PolicyGradientConfig(), description="the policy-gradient "
                                     "estimator (paper Eq. 8/9 and its appendix table)")

    @model_validator(mode="after")
    def _selection_needs_sets(self) -> TrainConfig:
        if self.selection.rule == "guarded" and not self.validation_sets:
            raise ValueError("selection.rule=guarded needs out-of-domain validation_sets, e.g. [nfcorpus/dev]")
        if self.selection.patience and self.selection.rule == "last":
            raise ValueError("selection.patience (early stopping) needs selection.rule in_domain or guarded")
        if self.selection.interpolation != [1.0] and self.selection.rule == "last":
            raise ValueError("selection.interpolation (mixtures with the warm start) needs selection.rule in_domain "
                             "or guarded to choose among them")
        if self.selection.within_se and self.selection.rule == "last":
            raise ValueError("selection.within_se (the one-standard-error rule) needs selection.rule in_domain or "
                             "guarded to choose among the epochs")
        return self

    @field_validator("validation_sets")
    @classmethod
    def _no_test_split(cls, value: list[str]) -> list[str]:
        tests = [name for name in value if name.split("/")[1] == "test"]
        if tests:
            raise ValueError(f"{tests}: selection never reads a test split; name a dev split, or cut a set that has "
                             "only a test split in two (data.sources.<name>.split) and name its dev half")
        return value

    @field_validator("chunk_tokens")
    @classmethod
    def _chunk_holds_a_document(cls, value: int, info) -> int:
        longest = max(info.data.get("max_doc_length") or 0, info.data.get("max_query_length") or 0)
        if value < longest:
            raise ValueError(f"{value} tokens cannot hold a text of max_doc_length / max_query_length {longest} "
                             f"tokens; raise it to at least {longest}")
        return value

    @field_validator("objectives", "extra_seeds")
    @classmethod
    def _unique_objectives(cls, value: list) -> list:
        if len(set(value)) != len(value):
            raise ValueError(f"listed more than once: {sorted({o for o in value if value.count(o) > 1})}")
        return value

    def objective_of(self, name: str) -> str:
        """The loss of an ``objectives`` entry (a variant's ``objective``)."""
        return self.variants[name].objective if name in self.variants else name

    def learning_rate_for(self, objective: str) -> float:
        """``learning_rates[objective]``; a variant without its own, its loss's; else ``learning_rate``."""
        if objective in self.learning_rates:
            return self.learning_rates[objective]
        return self.learning_rates.get(self.objective_of(objective), self.learning_rate)

    def for_run(self, name: str, seed: int | None = None) -> TrainConfig:
        """The train section one run uses: ``name``'s variant overrides laid over this one (no variants left,
        its learning rate in ``learning_rate``), at ``seed`` (``None``: ``train.seed``)."""
        doc = self.model_dump(mode="python")
        doc = merge(doc, self.variants[name].overrides) if name in self.variants else doc
        doc.update(objectives=[self.objective_of(name)], variants={}, extra_seeds=[], learning_rates={},
                   learning_rate=self.learning_rate_for(name), seed=self.seed if seed is None else seed)
        try:
            return TrainConfig.model_validate(doc)
        except ValidationError as exc:
            raise ValueError("; ".join(f"{'.'.join(map(str, e['loc']))}: {pydantic_message(e)}"
                                       for e in exc.errors())) from None

    def kl_on(self, objective: str) -> bool:
        """Whether ``objective``'s loss has the KL term to the warm start: the policy gradient, ``pg.kl_coef > 0``."""
        return objective == "pg" and self.pg.kl_coef > 0

    def kept_inside(self, epochs: list[int]) -> list[int]:
        """Those of ``epochs`` (``evaluate.policy_epochs``) that are kept checkpoints strictly inside (0, epochs)."""
        return [e for e in epochs if e in self.keep_epochs and 0 < e < self.epochs]

    def runs(self) -> list[tuple[str, int | None]]:
        """Every training run: ``(objectives entry, None)`` at train.seed, then each entry at each extra seed."""
        return [(name, None) for name in self.objectives] + [(n, s) for s in self.extra_seeds for n in self.objectives]

    @field_validator("amp", mode="before")
    @classmethod
    def _yaml_booleans(cls, value: Any) -> Any:
        """YAML reads a bare ``off``/``no`` as ``False`` (and ``on`` as ``True``): accept them."""
        if isinstance(value, bool):
            return "bf16" if value else "off"
        return value

