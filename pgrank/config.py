"""``params.yaml`` parsed once into frozen, typed objects.

Every knob of the pipeline lives in ``params.yaml`` (one section per stage plus the shared
``paths``, ``models`` and ``tracking``). :func:`load_params` is the only place that reads it; library
functions receive these objects, never a dict or a file name.

Errors name the file, the line, the dotted key and what was expected, for example::

    params.yaml:31: train.pg.temperature: must be > 0 (got -1)

Example:
    >>> from pgrank.config import load_params
    >>> params = load_params("params.yaml", overrides=["train.epochs=2"])
    >>> params.train.pg.temperature
    0.05
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Annotated, Any, Literal

import yaml
from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    ValidationError,
    field_validator,
    model_validator,
)

from pgrank.errors import ConfigError

PositiveInt = Annotated[int, Field(gt=0)]
NonNegInt = Annotated[int, Field(ge=0)]
PositiveFloat = Annotated[float, Field(gt=0)]
NonNegFloat = Annotated[float, Field(ge=0)]

_UTILITY_NAME = re.compile(r"^(ndcg|dcg|mrr|rr|recall|ap|map)@(\d+)$|^[\w.]+:[\w.]+$")


class _Section(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, strict=False)


# --------------------------------------------------------------------------------------- shared


class PathsConfig(_Section):
    """Where artifacts go. All other paths are derived in :mod:`pgrank.paths`."""

    root: str = Field(description="Folder for everything this profile writes (runs, models, results).")
    data: str = Field(description="Folder for downloaded BEIR datasets (shared between profiles).")
    embeddings: str = Field(description="Folder for corpus-embedding artifacts (shared between profiles).")


class OfflineModel(_Section):
    """A local copy of a hub model: a directory, or a pip package that ships the weights."""

    path: str | None = None
    package: str | None = None
    sha256: str | None = Field(default=None, pattern=r"^[0-9a-f]{64}$")
    revision: str | None = Field(default=None, description="the hub revision this copy holds; a different "
                                 "models.revisions pin is an error")

    @model_validator(mode="after")
    def _one_source(self) -> "OfflineModel":
        if (self.path is None) == (self.package is None):
            raise ValueError("give exactly one of 'path' or 'package'")
        return self


InferenceBackend = Literal["auto", "torch", "torch-bf16", "onnx", "onnx-int8"]  # pgrank.models.backends


class ModelsConfig(_Section):
    """Hub ids by short alias, plus offline copies keyed by hub id."""

    aliases: dict[str, str] = Field(default_factory=dict)
    offline: dict[str, OfflineModel] = Field(default_factory=dict)
    backend: InferenceBackend = Field(
        default="auto", description="how models run forward outside training (pgrank.models.backends); auto: by device and CPU")
    backends: dict[str, InferenceBackend] = Field(
        default_factory=dict, description="per model (alias or hub id), overriding backend")
    revisions: dict[str, str] = Field(
        default_factory=dict, description="hub revision (commit, tag, branch or refs/pr/N) per model (alias or hub id)")
    processes_per_gpu: PositiveInt = Field(
        default=4, description="processes encoding a corpus on each GPU (sentence-transformers' pool): tokenizing on the "
                               "CPU overlaps the GPU's work")


class TrackingConfig(_Section):
    enabled: bool = True
    experiment: str = "pgrank"
    registered_model: str = "pgrank-retriever"
    champion_alias: str = "champion"
    # None: sqlite file under paths.root (absolute URI); MLFLOW_TRACKING_URI overrides either.
    uri: str | None = None


# --------------------------------------------------------------------------------------- stages


_DATASET_NAME = r"^[\w][\w.-]*$"


class HalvesConfig(_Section):
    """Half-document retrieval built from another dataset's corpus (:mod:`pgrank.download.halves`): a label-free
    out-of-domain validation set (``<source>/dev``)."""

    of: str = Field(pattern=_DATASET_NAME, description="the dataset (a BEIR name or another source) whose corpus is cut")
    queries: PositiveInt = Field(default=500, description="first halves that are queries (at most `documents`)")
    documents: int = Field(default=2000, ge=2, description="second halves that are the collection")
    min_words: PositiveInt = Field(default=80, description="documents shorter than this (words of text) are not cut")
    seed: int = Field(default=0, description="seed of the documents drawn")


class SourceConfig(_Section):
    """A BEIR-format dataset of your own (:mod:`pgrank.download.sources`): a folder read in place, a local
    zip, or an http(s) URL of a zip; validated and fingerprinted like a BEIR download. Or half-document
    retrieval built from another dataset's corpus (``halves``, :mod:`pgrank.download.halves`)."""

    path: str | None = Field(default=None, description="folder (or .zip) relative to the params file")
    url: str | None = Field(default=None, description="http(s) URL of a zip of the folder")
    halves: HalvesConfig | None = Field(
        default=None, description="half-document retrieval over another dataset's corpus (no judgments needed)")
    sha256: str | None = Field(default=None, pattern=r"^[0-9a-f]{64}$", description="pin of the zip (url or .zip path)")
    missing_documents: Literal["error", "warn"] = Field(
        default="error", description="a judgment whose document is not in corpus.jsonl: an error, or a warning as in BEIR")

    @model_validator(mode="after")
    def _one_location(self) -> "SourceConfig":
        if sum(x is not None for x in (self.path, self.url, self.halves)) != 1:
            raise ValueError("give exactly one of 'path' (a folder or .zip), 'url' (an http(s) URL of a zip) or "
                             "'halves' (half documents of another dataset)")
        if self.url is not None and not self.url.startswith(("http://", "https://")):
            raise ValueError(f"url {self.url!r}: expected an http(s) URL of a zip (a local folder goes under 'path')")
        if self.sha256 is not None and (self.halves is not None or (self.path is not None and not self.path.endswith(".zip"))):
            raise ValueError("sha256 pins a zip (url or a .zip path); a folder is fingerprinted file by file")
        return self


class DataConfig(_Section):
    mirror: str | None = Field(default=None, description="Folder or URL replacing BEIR's base URL.")
    sources: dict[Annotated[str, Field(pattern=_DATASET_NAME)], SourceConfig] = Field(
        default_factory=dict, description="datasets of your own by name, used in train/eval_sets like BEIR names")
    holdout: str | None = Field(
        default=None, description="qrels file whose queries are the gate split (gate-pg), never trained on nor used "
                                  "for selection (set by scheduled retraining to its frozen gate set)")
    train: str = Field(pattern=r"^[\w.-]+/[\w.-]+$", description="dataset/split used for training")

    @field_validator("train", mode="before")
    @classmethod
    def _train_mapping(cls, value: Any) -> Any:
        """``{dataset: msmarco, split: train}`` (the form dvc.yaml interpolates) -> ``"msmarco/train"``."""
        if isinstance(value, dict):
            if set(value) != {"dataset", "split"}:
                raise ValueError("expected {dataset: NAME, split: NAME} or 'dataset/split'")
            return f"{value['dataset']}/{value['split']}"
        return value
    validation_size: PositiveInt = Field(
        default=7000, description="seeded queries of data.train carved out as the validation split (selection: epochs, "
                                  "early stopping, learning rates; and the choice among several challengers)")
    validation_seed: int = 13
    gate_size: NonNegInt = Field(
        default=0, description="seeded queries of data.train carved out as the gate split (gate-pg), apart from training "
                               "and validation: the champion gate's frozen gate set (0: none; data.holdout, once set, "
                               "is the gate split instead)")
    eval_sets: list[Annotated[str, Field(pattern=r"^[\w.-]+/[\w.-]+$")]] = Field(
        min_length=1, description="dataset/split ids; in YAML a mapping {dataset: [splits]} (what DVC fans out over) or a list")

    @field_validator("eval_sets", mode="before")
    @classmethod
    def _mapping_form(cls, value: Any) -> Any:
        """``{msmarco: [dev, test], scifact: [test]}`` -> ``["msmarco/dev", "msmarco/test", "scifact/test"]``."""
        if not isinstance(value, dict):
            return value
        ids = []
        for dataset, splits in value.items():
            splits = [splits] if isinstance(splits, str) else splits
            if not isinstance(splits, list) or not splits:
                raise ValueError(f"{dataset}: expected a list of splits, e.g. [test]")
            ids += [f"{dataset}/{split}" for split in splits]
        return ids

    @model_validator(mode="after")
    def _halves_of_a_dataset(self) -> "DataConfig":
        for name, source in self.sources.items():
            of = source.halves.of if source.halves is not None else None
            if of is not None and (of == name or (of in self.sources and self.sources[of].halves is not None)):
                raise ValueError(f"sources.{name}.halves.of: {of!r} is itself half documents; name a dataset "
                                 f"with a corpus of its own")
        return self

    def eval_sets_by_dataset(self) -> dict[str, list[str]]:
        """The evaluation sets as ``{dataset: [splits]}``, in order (the form DVC fans out over)."""
        out: dict[str, list[str]] = {}
        for eval_set in self.eval_sets:
            dataset, split = eval_set.split("/")
            out.setdefault(dataset, []).append(split)
        return out


class Bm25Config(_Section):
    k1: PositiveFloat = 0.9
    b: Annotated[float, Field(ge=0, le=1)] = 0.4
    stemmer: str | None = "english"
    stopwords: str | None = "en"
    method: Literal["robertson", "lucene", "atire", "bm25l", "bm25+"] = "lucene"


class MineConfig(_Section):
    source: Literal["dense", "bm25", "published"] = "dense"
    model: str = "gtr-t5-xl"
    candidates: PositiveInt = 1000
    batch_size: PositiveInt = 128
    max_seq_length: PositiveInt = 512
    chunk_size: PositiveInt = Field(default=65536, description="documents per embedding shard")
    bm25: Bm25Config = Bm25Config()
    training_runs: bool = Field(
        default=False, description="also write the carved training splits' candidate sets as TREC runs (MS MARCO: ~25 GB)")
    published_dir: str | None = Field(
        default=None, description="folder holding the authors' candidate files (source: published); null: download from the hub"
    )


class PolicyGradientConfig(_Section):
    """Knobs of :func:`pgrank.core.estimators.pg_loss` (paper Eq. 8/9 and appendix table)."""

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


class DocumentAnchorConfig(_Section):
    """The query tower kept close to the warm start's document tower on documents (:mod:`pgrank.core.drift`)."""

    coef: NonNegFloat = Field(
        default=0.0, description="weight of the mean 1 - cos(query tower(d), warm start's document tower(d)) over "
                                 "documents d drawn from each batch's candidates (0: the paper)")
    documents: PositiveInt = Field(default=8, description="candidate documents drawn per (local) batch, read by "
                                                          "the query tower up to train.max_doc_length tokens")


class SelectionConfig(_Section):
    """Which epoch is the policy (``pgrank-<warm start>``), and when training stops early."""

    rule: Literal["last", "in_domain", "guarded"] = Field(
        default="last", description="last: the final epoch (the paper); in_domain: the best in-domain validation "
                                    "nDCG@10; guarded: the best in-domain one among the epochs that lose at most "
                                    "`margin` nDCG@10 on every train.validation_sets set against the warm start")
    margin: NonNegFloat = Field(default=0.005, description="guarded: the out-of-domain nDCG@10 loss allowed")
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


class VariantConfig(_Section):
    """A named training variant: a loss and ``train`` keys laid over the profile's for its runs only
    (``pg_plrank3: {objective: pg, overrides: {pg: {estimator: plrank3}}}``)."""

    objective: Objective
    overrides: dict[str, Any] = Field(default_factory=dict, description="train keys, nested as in params.yaml")

    @field_validator("overrides")
    @classmethod
    def _no_run_list_keys(cls, value: dict[str, Any]) -> dict[str, Any]:
        bad = sorted(set(value) & set(_RUN_LIST_KEYS))
        if bad:
            raise ValueError(f"{bad} cannot differ per variant: they say which runs exist or what mine-train mines")
        return value


class TrainConfig(_Section):
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
    grad_chunk_size: PositiveInt = 64
    amp: Literal["bf16", "off"] = "bf16"
    keep_epochs: list[NonNegInt] = Field(default_factory=lambda: [0, 2, 6])
    seed: int = 42
    validation_sets: list[Annotated[str, Field(pattern=r"^[\w.-]+/[\w.-]+$")]] = Field(
        default_factory=list, description="out-of-domain dataset/split sets validated each epoch next to the "
                                          "in-domain carve-out (mined by mine-train)")
    selection: SelectionConfig = SelectionConfig()
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
    document_anchor: DocumentAnchorConfig = DocumentAnchorConfig()
    pg: PolicyGradientConfig = PolicyGradientConfig()

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
        doc = _merge(doc, self.variants[name].overrides) if name in self.variants else doc
        doc.update(objectives=[self.objective_of(name)], variants={}, extra_seeds=[], learning_rates={},
                   learning_rate=self.learning_rate_for(name), seed=self.seed if seed is None else seed)
        try:
            return TrainConfig.model_validate(doc)
        except ValidationError as exc:
            raise ValueError("; ".join(f"{'.'.join(map(str, e['loc']))}: {_pydantic_message(e)}"
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


class SignificanceConfig(_Section):
    test: Literal["student", "wilcoxon", "fisher"] = "student"
    alpha: Annotated[float, Field(gt=0, lt=1)] = 0.05


# The two evaluation stages of the paper: second-stage reranking and first-stage retrieval.
EVAL_STAGES = ("rerank", "full")
EvalStage = Literal["rerank", "full"]


class SystemsConfig(_Section):
    """Comparison systems by retriever kind; each kind is one DVC stage (``evaluate-<kind>``) whose code
    is ``pgrank/retrieval/<kind>``, so editing one kind re-runs only its evaluations."""

    bm25: list[Literal["bm25"]] = Field(default_factory=list, description="[bm25] or []: BM25 with mine.bm25's settings")
    dense: list[str] = Field(default_factory=list, description="sentence-transformers bi-encoders (aliases, hub ids, folders)")
    sparse: list[str] = Field(default_factory=list, description="learned sparse models (SPLADE) through SparseEncoder")

    def all(self) -> list[str]:
        """Every comparison system, in column order: BM25, dense, sparse."""
        return [*self.bm25, *self.dense, *self.sparse]

    def kind(self, name: str) -> str | None:
        """``bm25`` | ``dense`` | ``sparse`` for a listed system, else ``None``."""
        return next((kind for kind in ("bm25", "dense", "sparse") if name in getattr(self, kind)), None)


class EvaluateConfig(_Section):
    stages: list[EvalStage] = Field(default_factory=lambda: list(EVAL_STAGES))
    systems: SystemsConfig = SystemsConfig()
    policy_epochs: list[NonNegInt] = Field(default_factory=list, description="extra epochs of each policy to rerank with")
    ks: list[PositiveInt] = Field(default_factory=lambda: [1, 3, 5, 10])
    top_k: PositiveInt = 1000
    batch_size: PositiveInt = 128
    max_seq_length: PositiveInt = 512
    ignore_identical_ids: bool = True
    significance: SignificanceConfig = SignificanceConfig()


class TablesConfig(_Section):
    formats: list[Literal["md", "tex", "png"]] = Field(default_factory=lambda: ["md", "tex", "png"])
    decimals: Annotated[int, Field(ge=1, le=6)] = 3
    # The paper leaves BM25 out of its second-stage tables (footnote: "commonly used only as a first-stage
    # approach"): omit the column, or show it as context that takes no part in the bold/underline marks.
    rerank_bm25: Literal["omit", "context"] = "omit"


GATE_METRIC = re.compile(r"^(ndcg|mrr|recall|map|precision)@(\d+)$")


class ChampionConfig(_Section):
    """The promotion gate of scheduled retraining (:mod:`pgrank.pipeline.gate`, ``flows/retraining.py``).

    Champion and challenger are evaluated side by side on one gate set; the challenger is promoted only
    if its mean ``metric`` beats the champion's by more than ``min_gain`` and a paired ``test`` over the
    gate queries gives ``p < alpha`` (``alpha: null``: no significance required).
    """

    gate_set: str = Field(default="frozen", pattern=r"^frozen$|^[\w.-]+/[\w.-]+$",
                          description="frozen: data.train's gate split (data.gate_size queries) at the first gated run, "
                                      "frozen; or dataset/split")
    first: Literal["gate", "promote"] = Field(
        default="gate", description="with no champion yet, gate: the challenger must beat its warm start by the same "
                                    "rule; promote: it is promoted without a comparison")
    stage: EvalStage = "rerank"
    metric: str = "ndcg@10"
    min_gain: float = 0.0
    test: Literal["student", "wilcoxon", "fisher"] = "student"
    alpha: Annotated[float, Field(gt=0, lt=1)] | None = 0.05

    @field_validator("metric")
    @classmethod
    def _metric_name(cls, v: str) -> str:
        if not GATE_METRIC.match(v):
            raise ValueError("expected ndcg@K, mrr@K, recall@K, map@K or precision@K")
        return v


class SearchConfig(_Section):
    """First-stage dense search (:func:`pgrank.retrieval.dense.exact_search.dense_search`), for mining and evaluation."""

    backend: Literal["auto", "torch", "faiss", "faiss-gpu"] = Field(
        default="auto", description="auto: FAISS where it sees a GPU (faiss-gpu), else torch (on CUDA where torch sees a GPU; "
                                    "faster than FAISS on a CPU); all exact with index Flat")
    index: str = Field(
        default="Flat", min_length=1,
        description="FAISS index_factory string: Flat is exact; e.g. IVF4096,Flat or HNSW32 is approximate (FAISS, whole corpus in memory)")
    nprobe: PositiveInt = Field(default=64, description="inverted lists visited per query by an IVF index")
    ef_search: PositiveInt = Field(default=128, description="search depth (efSearch) of an HNSW index")


class Params(_Section):
    """The whole ``params.yaml``."""

    paths: PathsConfig
    models: ModelsConfig = ModelsConfig()
    tracking: TrackingConfig = TrackingConfig()
    data: DataConfig
    mine: MineConfig = MineConfig()
    train: TrainConfig
    evaluate: EvaluateConfig
    tables: TablesConfig = TablesConfig()
    champion: ChampionConfig = ChampionConfig()
    search: SearchConfig = SearchConfig()


# --------------------------------------------------------------------------------------- loading


def _key_lines(node: yaml.Node, prefix: tuple = ()) -> dict[tuple, int]:
    """Map every dotted key path of a composed YAML document to its 1-based line number."""
    lines: dict[tuple, int] = {}
    if isinstance(node, yaml.MappingNode):
        for key_node, value_node in node.value:
            path = prefix + (key_node.value,)
            lines[path] = key_node.start_mark.line + 1
            lines.update(_key_lines(value_node, path))
    elif isinstance(node, yaml.SequenceNode):
        for i, item in enumerate(node.value):
            lines[prefix + (i,)] = item.start_mark.line + 1
            lines.update(_key_lines(item, prefix + (i,)))
    return lines


def _read_yaml(path: Path) -> tuple[dict, dict[tuple, str]]:
    """The document and, for every key path, where it was written (``file:line``)."""
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise ConfigError(f"{path}: no such file") from None
    try:
        node = yaml.compose(text)
        doc = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f"{path}:{mark.line + 1}" if mark else str(path)
        raise ConfigError(f"{where}: not valid YAML ({getattr(exc, 'problem', exc)})") from None
    if doc is not None and not isinstance(doc, dict):
        raise ConfigError(f"{path}: expected a mapping of sections at the top level")
    lines = _key_lines(node) if node is not None else {}
    return doc or {}, {key: f"{path}:{line}" for key, line in lines.items()}


def _merge(base: dict, overlay: dict) -> dict:
    """Deep merge: mappings merge key by key, anything else (lists too) is replaced."""
    out = dict(base)
    for key, value in overlay.items():
        out[key] = _merge(out[key], value) if isinstance(value, dict) and isinstance(out.get(key), dict) else value
    return out


def _set_override(doc: dict, override: str) -> None:
    if "=" not in override:
        raise ConfigError(f"override {override!r}: expected KEY=VALUE, e.g. train.epochs=2")
    key, raw = override.split("=", 1)
    parts = key.strip().split(".")
    node = doc
    for part in parts[:-1]:
        nxt = node.get(part) if isinstance(node, dict) else None
        if nxt is None:
            nxt = node[part] = {}
        if not isinstance(nxt, dict):
            raise ConfigError(f"override {override!r}: {'.'.join(parts[:-1])} is not a section")
        node = nxt
    node[parts[-1]] = yaml.safe_load(raw) if raw.strip() else None


def _pg_problems(pg: PolicyGradientConfig) -> list[tuple[tuple, str]]:
    """The policy-gradient settings' cross-field rules (for train.pg, and for each variant's)."""
    problems: list[tuple[tuple, str]] = []
    if pg.baseline == "loo" and pg.num_samples < 2:
        problems.append(
            (("train", "pg", "num_samples"), f"must be >= 2 with the leave-one-out baseline (got {pg.num_samples})")
        )
    if pg.estimator in ("per_rank", "plrank3") and ":" in pg.utility:
        problems.append(
            (("train", "pg", "estimator"),
             f"{pg.estimator!r} needs a named rank-decomposable utility; use 'whole' with a custom callable")
        )
    elif pg.estimator == "plrank3" and pg.utility.split("@")[0] not in ("ndcg", "dcg", "recall"):
        problems.append(
            (("train", "pg", "estimator"), f"'plrank3' needs a utility linear in the documents' gains (ndcg, dcg or "
             f"recall), not {pg.utility!r}; use 'per_rank'")
        )
    return problems


def _run_problems(train: TrainConfig) -> list[tuple[tuple, str]]:
    """What makes train.objectives, train.variants and train.extra_seeds name runs that cannot be trained."""
    problems = [(("train", "pg") + loc[2:], msg) for loc, msg in _pg_problems(train.pg)]
    for i, name in enumerate(train.objectives):
        if name not in OBJECTIVE_NAMES and name not in train.variants:
            problems.append((("train", "objectives", i), f"{name!r} is neither a loss ({', '.join(OBJECTIVE_NAMES)}) "
                             "nor a train.variants name"))
    for name in train.variants:
        where = ("train", "variants", name)
        if name in OBJECTIVE_NAMES:
            problems.append((where, "a variant cannot take a loss's name"))
            continue
        try:
            variant = train.for_run(name)
        except ValueError as exc:
            problems.append((where + ("overrides",), str(exc)))
            continue
        if variant.pg != train.pg:  # an inherited problem is reported once, at train.pg
            problems += [(where + ("overrides", "pg") + loc[2:], msg) for loc, msg in _pg_problems(variant.pg)]
    if train.seed in train.extra_seeds:
        problems.append((("train", "extra_seeds"), f"{train.seed} is train.seed, trained already"))
    return problems


def _consistency(params: Params) -> list[tuple[tuple, str]]:
    """Cross-field rules that no single field can check. Returns (key path, message) pairs."""
    problems: list[tuple[tuple, str]] = []
    problems += _run_problems(params.train)
    for i, name in enumerate(params.train.warm_starts):
        if not name.strip():
            problems.append((("train", "warm_starts", i), "empty model name"))
        elif "+" in name or "@" in name:
            problems.append((("train", "warm_starts", i), f"{name!r}: '+' and '@' are reserved for policy names "
                             "(pgrank-<warm start>+<objective>@<epoch>); add an alias under models.aliases"))
    for objective in params.train.learning_rates:
        if objective not in params.train.objectives and objective not in (
                params.train.objective_of(o) for o in params.train.objectives):
            problems.append((("train", "learning_rates", objective), f"{objective!r} is not in train.objectives "
                             f"{params.train.objectives}"))
    systems = params.evaluate.systems
    if not systems.all():
        problems.append((("evaluate", "systems"), "no comparison system; list at least one under bm25, dense or sparse"))
    for kind in ("dense", "sparse"):
        for i, name in enumerate(getattr(systems, kind)):
            if name.startswith("pgrank-") or "@" in name or not name.strip():
                problems.append((("evaluate", "systems", kind, i), f"{name!r}: list comparison systems here; the "
                                 "policies pgrank-<warm start>[+objective] are evaluated for every train.warm_starts and "
                                 "train.objectives entry"))
    for i, warm in enumerate(params.train.warm_starts):
        if warm not in systems.dense:
            problems.append((("train", "warm_starts", i), f"{warm!r} must also be listed under evaluate.systems.dense: "
                             "each policy is tested against its warm start's results"))
    seen = [n for n in systems.all() if systems.all().count(n) > 1]
    if seen:
        problems.append((("evaluate", "systems"), f"{sorted(set(seen))} listed under more than one kind"))
    bad_epochs = [e for e in params.train.keep_epochs if e > params.train.epochs]
    if bad_epochs:
        problems.append(
            (("train", "keep_epochs"), f"epochs {bad_epochs} are beyond train.epochs={params.train.epochs}")
        )
    gate = params.champion
    if gate.gate_set != "frozen" and gate.stage == "rerank" and gate.gate_set not in params.data.eval_sets:
        problems.append((("champion", "gate_set"), f"{gate.gate_set!r} is reranked (champion.stage: rerank), so it must "
                         "be one of data.eval_sets, where its candidates are mined; or set champion.stage: full"))
    return problems


def _format(default: str, origins: dict[tuple, str], loc: tuple, msg: str) -> str:
    # Walk up the key path to the nearest key whose origin is known (missing keys have none).
    where = default
    for cut in range(len(loc), 0, -1):
        if loc[:cut] in origins:
            where = origins[loc[:cut]]
            break
    return f"{where}: {'.'.join(str(p) for p in loc)}: {msg}"


def _pydantic_message(err: dict) -> str:
    kind, msg = err["type"], err["msg"]
    if kind == "extra_forbidden":
        return "unknown key"
    if kind == "missing":
        return "required key is missing"
    got = err.get("input")
    msg = msg[0].lower() + msg[1:] if msg else msg
    msg = msg.removeprefix("value error, ")
    if kind not in ("missing",) and not isinstance(got, (dict, list)):
        msg += f" (got {got!r})"
    return msg


def parse_params(doc: Any, file: str = "params.yaml", origins: dict[tuple, str] | None = None) -> Params:
    """Validate an already-loaded mapping. Raises :class:`ConfigError` naming file, line and key.

    ``origins`` maps key paths to where they were set (``params.yaml:12``, a profile's line, or a
    ``--set`` override); keys without one are reported against ``file``.
    """
    origins = origins or {}
    if not isinstance(doc, dict):
        raise ConfigError(f"{file}: expected a mapping of sections at the top level")
    try:
        params = Params.model_validate(doc)
    except ValidationError as exc:
        raise ConfigError("\n".join(_format(file, origins, tuple(e["loc"]), _pydantic_message(e)) for e in exc.errors())) from None
    problems = _consistency(params)
    if problems:
        raise ConfigError("\n".join(_format(file, origins, loc, msg) for loc, msg in problems))
    return params


def profile_path(params_file: str | Path, profile: str) -> Path:
    """Where profile ``name`` lives: ``profiles/<name>.yaml`` beside the params file."""
    return Path(params_file).parent / "profiles" / f"{profile}.yaml"


def load_params(
    path: str | Path = "params.yaml",
    overrides: list[str] | tuple[str, ...] = (),
    profile: str | None = None,
) -> Params:
    """Read ``params.yaml``, lay a profile and overrides over it, and validate the result.

    Args:
        path: the YAML file (as committed: the paper's configuration).
        overrides: ``dotted.key=value`` strings, values parsed as YAML (``train.epochs=2``).
        profile: a profile name, e.g. ``"demo"``: ``profiles/demo.yaml`` (beside ``path``) is
            deep-merged over the file before the overrides.

    Returns:
        The frozen :class:`Params`.

    Raises:
        ConfigError: a file is missing or not YAML, or a key is unknown, mistyped or out of range
            (the message names the file, line and key that set it).
    """
    path = Path(path)
    doc, origins = _read_yaml(path)
    if profile:
        overlay_path = profile_path(path, profile)
        if not overlay_path.is_file():
            known = sorted(p.stem for p in overlay_path.parent.glob("*.yaml"))
            raise ConfigError(f"{overlay_path}: no profile {profile!r} (known: {', '.join(known) or 'none'})")
        overlay, overlay_origins = _read_yaml(overlay_path)
        doc = _merge(doc, overlay)
        origins.update(overlay_origins)
    for override in overrides:
        _set_override(doc, override)
        key = tuple(override.split("=", 1)[0].strip().split("."))
        origins = {k: v for k, v in origins.items() if k[: len(key)] != key}
        origins[key] = f"{path} (override --set {override})"
    return parse_params(doc, str(path), origins)
