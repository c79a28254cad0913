"""The sections of ``params.yaml`` but ``train`` (``pgrank.config.training``): frozen, typed, unknown keys
forbidden. The shared ``paths``, ``models`` and ``tracking``; the stages' ``data``, ``mine``, ``evaluate`` and
``tables``; scheduled retraining's ``champion``; and first-stage ``search``.
"""

from __future__ import annotations

import re
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationInfo, field_validator, model_validator

PositiveInt = Annotated[int, Field(gt=0)]
NonNegInt = Annotated[int, Field(ge=0)]
PositiveFloat = Annotated[float, Field(gt=0)]
NonNegFloat = Annotated[float, Field(ge=0)]


class Section(BaseModel):
    """A section of ``params.yaml``: frozen, and a key it does not know is an error."""

    model_config = ConfigDict(extra="forbid", frozen=True, strict=False)


# --------------------------------------------------------------------------------------- shared


class PathsConfig(Section):
    """Where artifacts go. All other paths are derived in ``pgrank.paths``."""

    root: str = Field(description="Folder for everything this profile writes (runs, models, results).")
    data: str = Field(description="Folder for downloaded BEIR datasets (shared between profiles).")
    embeddings: str = Field(description="Folder for corpus-embedding artifacts (shared between profiles).")


class OfflineModel(Section):
    """A local copy of a hub model: a directory, or a pip package that ships the weights."""

    path: str | None = Field(default=None, description="folder holding the copy (relative to the params file); "
                             "give path or package")
    package: str | None = Field(default=None, description="installed pip package that ships the weights; give path "
                                "or package")
    sha256: str | None = Field(default=None, pattern=r"^[0-9a-f]{64}$",
                               description="checksum of the copy's weights, checked on every load (null: not pinned)")
    revision: str | None = Field(default=None, description="the hub revision this copy holds; a different "
                                 "models.revisions pin is an error")

    @model_validator(mode="after")
    def _one_source(self) -> "OfflineModel":
        if (self.path is None) == (self.package is None):
            raise ValueError("give exactly one of 'path' or 'package'")
        return self


InferenceBackend = Literal["auto", "torch", "torch-bf16", "onnx", "onnx-int8"]  # pgrank.models.backends


class ModelsConfig(Section):
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
        default=4, description="processes encoding a corpus's strings on each GPU (sentence-transformers' pool, for a "
                               "model without a token path): tokenizing on the CPU overlaps the GPU's work; a token "
                               "store encodes in one process per GPU")


class TrackingConfig(Section):
    """MLflow tracking: one parent run per pipeline execution, nested runs per stage, registered policies."""

    enabled: bool = True
    experiment: str = Field(default="pgrank", description="MLflow experiment the runs are logged under")
    registered_model: str = Field(default="pgrank-retriever",
                                  description="MLflow registered-model name each trained policy is registered as")
    champion_alias: str = Field(default="champion", description="registry alias of the policy that the champion "
                                "gate promoted (scheduled retraining)")
    # None: sqlite file under paths.root (absolute URI); MLFLOW_TRACKING_URI overrides either.
    uri: str | None = None


# --------------------------------------------------------------------------------------- stages


_DATASET_NAME = r"^[\w][\w.-]*$"


class HalvesConfig(Section):
    """Half-document retrieval built from another dataset's corpus (``pgrank.download.halves``): a label-free
    out-of-domain validation set (``<source>/dev``)."""

    of: str = Field(pattern=_DATASET_NAME, description="the dataset (a BEIR name or another source) whose corpus is cut")
    queries: PositiveInt = Field(default=500, description="first halves that are queries (at most `documents`)")
    documents: int = Field(default=2000, ge=2, description="second halves that are the collection")
    min_words: PositiveInt = Field(default=80, description="documents shorter than this (words of text) are not cut")
    seed: int = Field(default=0, description="seed of the documents drawn")


class HashSplitConfig(Section):
    """One judged split of another dataset cut in two by a seeded hash of the query ids
    (``pgrank.download.hash_split``): ``dev``, for selection, and ``test``, for results, disjoint."""

    of: str = Field(pattern=_DATASET_NAME, description="the dataset (a BEIR name or another source) whose split is cut")
    split: str = Field(default="test", pattern=r"^[\w.-]+$", description="its judged split that is cut (e.g. its only one)")
    dev_share: float = Field(default=0.5, gt=0, lt=1, description="the share of its queries in dev (selection), the "
                                                                   "first in hash order; the others are test (results)")
    seed: int = Field(default=0, description="seed of the hash that places each query")


class SourceConfig(Section):
    """A BEIR-format dataset of your own (``pgrank.download.sources``): a folder read in place, a local
    zip, or an http(s) URL of a zip; validated and fingerprinted like a BEIR download. Or half-document
    retrieval built from another dataset's corpus (``halves``, ``pgrank.download.halves``), or one of another
    dataset's splits cut in two by query hash (``split``, ``pgrank.download.hash_split``)."""

    path: str | None = Field(default=None, description="folder (or .zip) relative to the params file")
    url: str | None = Field(default=None, description="http(s) URL of a zip of the folder")
    mirror: str | None = Field(
        default=None, pattern=r"^[\w.-]+\.zip$",
        description="NAME.zip on the BEIR mirror ($PGRANK_BEIR_MIRROR, --mirror or data.mirror; not BEIR's server), "
                    "verified against the mirror's SHA256SUMS when it lists it")
    halves: HalvesConfig | None = Field(
        default=None, description="half-document retrieval over another dataset's corpus (no judgments needed)")
    split: HashSplitConfig | None = Field(
        default=None, description="another dataset's split cut by query hash into dev (selection) and test (results)")
    sha256: str | None = Field(default=None, pattern=r"^[0-9a-f]{64}$",
                               description="pin of the zip (url, mirror or .zip path)")
    missing_documents: Literal["error", "warn"] = Field(
        default="error", description="a judgment whose document is not in corpus.jsonl: an error, or a warning as in BEIR")

    @property
    def derived_of(self) -> str | None:
        """The dataset a derived source (``halves``, ``split``) is built from; ``None`` for the others."""
        derived = self.halves or self.split
        return derived.of if derived is not None else None

    @model_validator(mode="after")
    def _one_location(self) -> "SourceConfig":
        if sum(x is not None for x in (self.path, self.url, self.mirror, self.halves, self.split)) != 1:
            raise ValueError("give exactly one of 'path' (a folder or .zip), 'url' (an http(s) URL of a zip), 'mirror' "
                             "(a NAME.zip on the BEIR mirror), 'halves' (half documents of another dataset) or 'split' "
                             "(another dataset's split cut in two)")
        if self.url is not None and not self.url.startswith(("http://", "https://")):
            raise ValueError(f"url {self.url!r}: expected an http(s) URL of a zip (a local folder goes under 'path')")
        if self.sha256 is not None and (self.derived_of is not None or (self.path is not None and not self.path.endswith(".zip"))):
            raise ValueError("sha256 pins a zip (url, mirror or a .zip path); a folder is fingerprinted file by file")
        return self


class DataConfig(Section):
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
        default=7000, description="queries of data.train carved out as the validation split (selection: epochs, "
                                  "early stopping, learning rates; and the choice among several challengers), by the hash "
                                  "of their ids; once a gate set is frozen, new queries join it at the same share "
                                  "(splits/<dataset>/carve.json)")
    validation_seed: int = Field(default=13, description="the seed of the hash that places each query in its split")
    gate_size: NonNegInt = Field(
        default=0, description="queries of data.train carved out as the gate split (gate-pg), apart from training "
                               "and validation, by the hash of their ids: the champion gate's frozen gate set (0: none; "
                               "data.holdout, once set, names it, and new queries at the same share are its reserve)")
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
    def _derived_of_a_dataset(self) -> "DataConfig":
        for name, source in self.sources.items():
            of, kind = source.derived_of, "halves" if source.halves is not None else "split"
            if of is not None and (of == name or (of in self.sources and self.sources[of].derived_of is not None)):
                what = "is this source itself" if of == name else "is itself derived (halves or split)"
                raise ValueError(f"sources.{name}.{kind}.of: {of!r} {what}; name a dataset with a corpus of its own")
        return self

    def eval_sets_by_dataset(self) -> dict[str, list[str]]:
        """The evaluation sets as ``{dataset: [splits]}``, in order (the form DVC fans out over)."""
        out: dict[str, list[str]] = {}
        for eval_set in self.eval_sets:
            dataset, split = eval_set.split("/")
            out.setdefault(dataset, []).append(split)
        return out


class Bm25Config(Section):
    """BM25 through bm25s, over one field, ``title + " " + text``."""

    k1: PositiveFloat = Field(default=0.9, description="term-frequency saturation")
    b: Annotated[float, Field(ge=0, le=1)] = Field(default=0.4, description="document-length normalisation "
                                                   "(0: none, 1: full)")
    stemmer: str | None = Field(default="english", description="Snowball stemmer language (null: no stemming)")
    stopwords: str | None = Field(default="en", description="stop-word list removed before indexing (en: "
                                  "Lucene's English list; null: none)")
    method: Literal["robertson", "lucene", "atire", "bm25l", "bm25+"] = Field(
        default="lucene", description="the BM25 variant bm25s scores with")


class MineConfig(Section):
    source: Literal["dense", "bm25", "published"] = "dense"
    model: str = "gtr-t5-xl"
    candidates: PositiveInt = 1000
    batch_size: PositiveInt = Field(default=128, description="texts per encoding batch of the stage-1 model")
    max_seq_length: PositiveInt = Field(default=512, description="tokens a text is truncated to when the stage-1 "
                                        "model encodes it")
    chunk_size: PositiveInt = Field(default=65536, description="documents per embedding shard")
    bm25: Bm25Config = Field(default=Bm25Config(), description="BM25's settings, for source: bm25 and the bm25 system")
    training_runs: bool = Field(
        default=False, description="also write the carved training splits' candidate sets as TREC runs (MS MARCO: ~25 GB)")
    published_dir: str | None = Field(
        default=None, description="folder holding the authors' candidate files (source: published); null: download from the hub"
    )
    @property
    def training_source(self) -> str:
        """The source that mines the training sets (data.train's carved splits, train.validation_sets): ``source``,
        but ``dense`` (``model``) when that is ``published``: the authors published evaluation candidates only."""
        return "dense" if self.source == "published" else self.source


class SignificanceConfig(Section):
    """Paired significance of each policy against its warm start, over the test queries (the paper reports none)."""

    test: Literal["student", "wilcoxon", "fisher"] = Field(
        default="student", description="paired test: student (t-test), wilcoxon (signed-rank) or fisher "
                                       "(randomization)")
    alpha: Annotated[float, Field(gt=0, lt=1)] = Field(default=0.05, description="level below which a p-value "
                                                       "marks a difference as significant († in the tables)")


# The two evaluation stages of the paper: second-stage reranking and first-stage retrieval.
EVAL_STAGES = ("rerank", "full")
EvalStage = Literal["rerank", "full"]


class SystemsConfig(Section):
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


class EvaluateConfig(Section):
    stages: list[EvalStage] = Field(default_factory=lambda: list(EVAL_STAGES),
                                    description="rerank: second stage, over the mined candidates; full: first "
                                                "stage, over the whole corpus")
    systems: SystemsConfig = SystemsConfig()
    policy_epochs: list[NonNegInt] = Field(default_factory=list, description="extra epochs of each policy to rerank with")
    ks: list[PositiveInt] = Field(default_factory=lambda: [1, 3, 5, 10],
                                  description="cut-offs k of the reported metrics (nDCG@k, recall@k, ...)")
    top_k: PositiveInt = 1000
    batch_size: PositiveInt = Field(default=128, description="texts per encoding batch")
    max_seq_length: PositiveInt = Field(default=512, description="tokens a text is truncated to when it is encoded "
                                        "for evaluation")
    ignore_identical_ids: bool = True
    significance: SignificanceConfig = Field(default=SignificanceConfig(),
                                             description="paired significance against the warm start")


class TablesConfig(Section):
    formats: list[Literal["md", "tex", "png"]] = Field(default_factory=lambda: ["md", "tex", "png"],
                                                       description="files written per table: Markdown, LaTeX, and "
                                                                   "bar charts (png)")
    decimals: Annotated[int, Field(ge=1, le=6)] = Field(default=3, description="decimals of every score in the "
                                                        "tables")
    # The paper leaves BM25 out of its second-stage tables (footnote: "commonly used only as a first-stage
    # approach"): omit the column, or show it as context that takes no part in the bold/underline marks.
    rerank_bm25: Literal["omit", "context"] = "omit"


GATE_METRIC = re.compile(r"^(ndcg|mrr|recall|map|precision)@(\d+)$")


class ChampionConfig(Section):
    """The promotion gate of scheduled retraining (``pgrank.pipeline.gate``, ``flows/retraining.py``).

    Champion and challenger are evaluated side by side on one gate set. Superiority (``margin`` unset): the
    challenger is promoted only if its mean ``metric`` beats the champion's by more than ``min_gain`` and a
    one-sided ``test`` of the mean gain over the gate queries gives ``p`` below the decision's level.
    Non-inferiority (``margin`` set): it is promoted unless it is worse by more than ``margin`` (one-sided test of
    H0: mean gain <= -margin). The level is ``alpha`` for every decision, or, with ``budget`` set (and ``alpha:
    null``), the level ``budget_rule`` gives each decision so that the error over a period of ``horizon`` decisions
    is at most ``budget`` (``pgrank.core.error_budget``).
    """

    gate_set: str = Field(default="frozen", pattern=r"^frozen$|^[\w.-]+/[\w.-]+$",
                          description="frozen: data.train's gate split (data.gate_size queries) at the first gated run, "
                                      "frozen; or dataset/split")
    first: Literal["gate", "promote"] = Field(
        default="gate", description="with no champion yet, gate: the challenger must beat its warm start by the same "
                                    "rule; promote: it is promoted without a comparison")
    stage: EvalStage = "rerank"
    metric: str = "ndcg@10"
    min_gain: float = Field(default=0.0, description="superiority: the challenger's mean gain over the champion must "
                                                     "exceed it (leave 0 with a margin)")
    test: Literal["betting", "student", "wilcoxon", "fisher"] = Field(
        default="betting", description="the one-sided test of the mean gain over the gate queries: betting (exact for "
                                       "per-query differences in [-1, 1], any distribution; Waudby-Smith & Ramdas) or "
                                       "student (paired t-test, approximate at small levels); wilcoxon and fisher "
                                       "test a symmetric null, not the mean, and are refused")
    alpha: Annotated[float, Field(gt=0, lt=1)] | None = Field(
        default=0.05, description="the level of every decision, p < alpha (null: no significance required, or the "
                                  "levels come from budget)")
    budget: Annotated[float, Field(gt=0, lt=1)] | None = Field(
        default=None, description="the error allowed over a period of horizon decisions (e.g. 0.05), spent by "
                                  "budget_rule: the chance of any false promotion (spending, fallback) or the false "
                                  "discovery rate (elond); needs alpha: null (null: every decision at alpha)")
    horizon: PositiveInt = Field(default=52, description="decisions the budget covers (52: a year of weekly runs); "
                                                        "after them a new budget starts (the next period)")
    budget_rule: Literal["spending", "fallback", "elond"] = Field(
        default="spending", description="spending: budget / horizon per decision (alpha spending); fallback: the "
                                        "same, plus the level of the previous decision when it promoted; elond: "
                                        "e-LOND, budget / horizon times one more than the period's promotions so "
                                        "far (false discovery rate; needs test: betting)")
    margin: NonNegFloat | None = Field(
        default=None, description="non-inferiority: promote unless the challenger is worse by more than margin (in "
                                  "the metric's units, e.g. 0.005 nDCG@10; null: superiority with min_gain)")
    refresh_after: PositiveInt | None = Field(
        default=None, description="decisions on one gate set before it is refreshed from newly judged queries "
                                  "(null: only after a promotion)")
    lease: Annotated[float, Field(gt=0)] = Field(
        default=600.0, description="seconds the gate's lease in the registry lasts without a renewal (one gate at a "
                                   "time; renewed every lease / 3 seconds while the gate works, so a killed gate's "
                                   "lease lapses within it)")
    lease_wait: Annotated[float, Field(ge=0)] = Field(
        default=0.0, description="seconds to wait for another gate's lease before refusing with its owner and expiry")

    @field_validator("metric")
    @classmethod
    def _metric_name(cls, v: str) -> str:
        if not GATE_METRIC.match(v):
            raise ValueError("expected ndcg@K, mrr@K, recall@K, map@K or precision@K")
        return v

    @field_validator("budget")
    @classmethod
    def _budget_or_alpha(cls, v: float | None, info: ValidationInfo) -> float | None:
        if v is not None and info.data.get("alpha") is not None:
            raise ValueError(f"a budget sets every decision's level (budget_rule), so champion.alpha must be null "
                             f"with it (it is {info.data['alpha']!r}): set champion.alpha: null, or drop the budget")
        return v

    @field_validator("margin")
    @classmethod
    def _margin_or_min_gain(cls, v: float | None, info: ValidationInfo) -> float | None:
        if v is not None and info.data.get("min_gain"):
            raise ValueError(f"a margin asks for non-inferiority, min_gain for superiority, so champion.min_gain must "
                             f"be 0 with it (it is {info.data['min_gain']!r})")
        if v is not None and v >= 1:
            raise ValueError(f"a margin is in the metric's units, below 1 (it is {v!r})")
        return v

    @field_validator("test")
    @classmethod
    def _a_test_of_the_mean(cls, v: str) -> str:
        # The gate claims a mean gain (or a margin on it); a rank or sign-flip test's null is symmetry about 0
        # (pgrank.core.promotion.refuse_rank_test says the same to library callers).
        if v in ("wilcoxon", "fisher"):
            raise ValueError(f"{v} tests a null symmetric about 0, not a mean gain of 0, so it cannot decide the "
                             "gate's claim about the mean (nor a margin on it): under skewed per-query gains it "
                             "promotes a no-better challenger far more often than its level; use betting (exact for "
                             "any distribution on [-1, 1]) or student (approximate)")
        return v

    @field_validator("budget_rule")
    @classmethod
    def _e_values_for_elond(cls, v: str, info: ValidationInfo) -> str:
        if v == "elond" and "test" in info.data and info.data["test"] != "betting":
            raise ValueError(f"{v} combines e-values, which only champion.test: betting gives (it is "
                             f"{info.data.get('test')!r}): set champion.test: betting, or budget_rule: spending or "
                             "fallback")
        return v


class SearchConfig(Section):
    """First-stage dense search (``pgrank.retrieval.dense.exact_search.dense_search``), for mining and evaluation."""

    backend: Literal["auto", "torch", "numpy", "faiss", "faiss-gpu"] = Field(
        default="auto", description="auto: FAISS where it sees a GPU (faiss-gpu); else numpy for a search of at most 2**25 "
                                    "query-document scores (no torch import; as fast as torch on a CPU), else torch (on CUDA where torch sees a GPU; "
                                    "faster than FAISS on a CPU); all exact with index Flat")
    index: str = Field(
        default="Flat", min_length=1,
        description="FAISS index_factory string: Flat is exact; e.g. IVF4096,Flat or HNSW32 is approximate (FAISS, whole corpus in memory)")
    nprobe: PositiveInt = Field(default=64, description="inverted lists visited per query by an IVF index")
    ef_search: PositiveInt = Field(default=128, description="search depth (efSearch) of an HNSW index")

