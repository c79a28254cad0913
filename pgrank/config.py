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
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

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

    @model_validator(mode="after")
    def _one_source(self) -> "OfflineModel":
        if (self.path is None) == (self.package is None):
            raise ValueError("give exactly one of 'path' or 'package'")
        return self


class ModelsConfig(_Section):
    """Hub ids by short alias, plus offline copies keyed by hub id."""

    aliases: dict[str, str] = Field(default_factory=dict)
    offline: dict[str, OfflineModel] = Field(default_factory=dict)


class TrackingConfig(_Section):
    enabled: bool = True
    experiment: str = "pgrank"
    registered_model: str = "pgrank-retriever"
    champion_alias: str = "champion"
    # None: sqlite file under paths.root (absolute URI); MLFLOW_TRACKING_URI overrides either.
    uri: str | None = None


# --------------------------------------------------------------------------------------- stages


class DataConfig(_Section):
    mirror: str | None = Field(default=None, description="Folder or URL replacing BEIR's base URL.")
    train: str = Field(pattern=r"^[\w.-]+/[\w.-]+$", description="dataset/split used for training")
    validation_size: PositiveInt = 7000
    validation_seed: int = 13
    eval_sets: list[Annotated[str, Field(pattern=r"^[\w.-]+/[\w.-]+$")]] = Field(min_length=1)


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
    published_dir: str | None = Field(
        default=None, description="folder holding the authors' candidate files (source: published); null: download from the hub"
    )


class PolicyGradientConfig(_Section):
    """Knobs of :func:`pgrank.estimators.pg_loss` (paper Eq. 8/9 and appendix table)."""

    utility: str = "ndcg@10"
    estimator: Literal["per_rank", "whole"] = "per_rank"
    baseline: Literal["loo", "none"] = "loo"
    num_samples: PositiveInt = 5000
    temperature: PositiveFloat = 0.05
    entropy_coef: NonNegFloat = 0.01
    entropy: Literal["top1", "ranking"] = "top1"

    @field_validator("utility")
    @classmethod
    def _utility_name(cls, v: str) -> str:
        if not _UTILITY_NAME.match(v):
            raise ValueError(f"expected 'ndcg@K', 'dcg@K', 'mrr@K', 'recall@K', 'ap@K' or 'module:function' (got {v!r})")
        return v


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
    pg: PolicyGradientConfig = PolicyGradientConfig()


class SignificanceConfig(_Section):
    test: Literal["student", "wilcoxon", "fisher"] = "student"
    alpha: Annotated[float, Field(gt=0, lt=1)] = 0.05


class EvaluateConfig(_Section):
    stages: list[Literal["rerank", "full"]] = Field(default_factory=lambda: ["rerank", "full"])
    systems: list[str] = Field(min_length=1)
    ks: list[PositiveInt] = Field(default_factory=lambda: [1, 3, 5, 10])
    top_k: PositiveInt = 1000
    batch_size: PositiveInt = 128
    ignore_identical_ids: bool = True
    significance: SignificanceConfig = SignificanceConfig()


class TablesConfig(_Section):
    formats: list[Literal["md", "tex", "png"]] = Field(default_factory=lambda: ["md", "tex", "png"])
    decimals: Annotated[int, Field(ge=1, le=6)] = 3


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


def _consistency(params: Params) -> list[tuple[tuple, str]]:
    """Cross-field rules that no single field can check. Returns (key path, message) pairs."""
    problems: list[tuple[tuple, str]] = []
    pg = params.train.pg
    if pg.baseline == "loo" and pg.num_samples < 2:
        problems.append(
            (("train", "pg", "num_samples"), f"must be >= 2 with the leave-one-out baseline (got {pg.num_samples})")
        )
    if pg.estimator == "per_rank" and ":" in pg.utility:
        problems.append(
            (("train", "pg", "estimator"), "'per_rank' needs a named rank-decomposable utility; use 'whole' with a custom callable")
        )
    for i, name in enumerate(params.train.warm_starts):
        if not name.strip():
            problems.append((("train", "warm_starts", i), "empty model name"))
    bad_epochs = [e for e in params.train.keep_epochs if e > params.train.epochs]
    if bad_epochs:
        problems.append(
            (("train", "keep_epochs"), f"epochs {bad_epochs} are beyond train.epochs={params.train.epochs}")
        )
    return problems


def _format(file: str, lines: dict[tuple, int], loc: tuple, msg: str, overridden: dict[tuple, str]) -> str:
    # A key set by an override is reported against the override, not the file.
    for key, text in overridden.items():
        if loc[: len(key)] == key:
            return f"{file} (override --set {text}): {'.'.join(str(p) for p in loc)}: {msg}"
    # Walk up the key path until a key with a known line is found (missing keys have none).
    line = None
    for cut in range(len(loc), 0, -1):
        if loc[:cut] in lines:
            line = lines[loc[:cut]]
            break
    where = f"{file}:{line}" if line else file
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


def parse_params(
    doc: Any,
    file: str = "params.yaml",
    lines: dict[tuple, int] | None = None,
    overridden: dict[tuple, str] | None = None,
) -> Params:
    """Validate an already-loaded mapping. Raises :class:`ConfigError` naming file, line and key.

    ``lines`` maps key paths to line numbers; ``overridden`` maps key paths to the ``key=value``
    override that set them, so that errors point at the override rather than the file.
    """
    lines, overridden = lines or {}, overridden or {}
    if not isinstance(doc, dict):
        raise ConfigError(f"{file}: expected a mapping of sections at the top level")
    try:
        params = Params.model_validate(doc)
    except ValidationError as exc:
        messages = [_format(file, lines, tuple(e["loc"]), _pydantic_message(e), overridden) for e in exc.errors()]
        raise ConfigError("\n".join(messages)) from None
    problems = _consistency(params)
    if problems:
        raise ConfigError("\n".join(_format(file, lines, loc, msg, overridden) for loc, msg in problems))
    return params


def load_params(path: str | Path = "params.yaml", overrides: list[str] | tuple[str, ...] = ()) -> Params:
    """Read, override and validate ``params.yaml``.

    Args:
        path: the YAML file.
        overrides: ``dotted.key=value`` strings, values parsed as YAML (``train.epochs=2``).

    Returns:
        The frozen :class:`Params`.

    Raises:
        ConfigError: the file is missing or not YAML, or a key is unknown, mistyped or out of range.
    """
    path = Path(path)
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
    lines = _key_lines(node) if node is not None else {}
    doc = doc if doc is not None else {}
    for override in overrides:
        _set_override(doc, override)
    overridden = {tuple(o.split("=", 1)[0].strip().split(".")): o for o in overrides}
    return parse_params(doc, str(path), lines, overridden)
