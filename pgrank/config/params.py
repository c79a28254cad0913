"""The whole ``params.yaml`` (:class:`Params`), its cross-field rules, and :func:`load_params`, the only place
that reads it."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from pydantic import ValidationError

from pgrank.config.files import format_problem, merge, pydantic_message, read_yaml, set_override
from pgrank.config.sections import (
    ChampionConfig,
    DataConfig,
    EvaluateConfig,
    MineConfig,
    ModelsConfig,
    PathsConfig,
    SearchConfig,
    Section,
    TablesConfig,
    TrackingConfig,
)
from pgrank.config.training import OBJECTIVE_NAMES, PolicyGradientConfig, TrainConfig
from pgrank.errors import ConfigError


class Params(Section):
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
    backend = params.models.backend
    if backend.startswith("onnx") and any(params.train.for_run(o, s).tower == "query" for o, s in params.train.runs()):
        warm = params.train.warm_starts[0] if params.train.warm_starts else "<warm start>"
        problems.append((("models", "backend"), f"{backend!r} asks ONNX of every model, and a tower: query policy is a "
                         "query/document Router, which does not export; name the models to run with ONNX under "
                         f"models.backends (e.g. {{{warm}: {backend}}}) and keep models.backend auto or torch"))
    gate = params.champion
    if gate.gate_set != "frozen" and gate.stage == "rerank" and gate.gate_set not in params.data.eval_sets:
        problems.append((("champion", "gate_set"), f"{gate.gate_set!r} is reranked (champion.stage: rerank), so it must "
                         "be one of data.eval_sets, where its candidates are mined; or set champion.stage: full"))
    return problems



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
        raise ConfigError("\n".join(format_problem(file, origins, tuple(e["loc"]), pydantic_message(e)) for e in exc.errors())) from None
    problems = _consistency(params)
    if problems:
        raise ConfigError("\n".join(format_problem(file, origins, loc, msg) for loc, msg in problems))
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
    doc, origins = read_yaml(path)
    if profile:
        overlay_path = profile_path(path, profile)
        if not overlay_path.is_file():
            known = sorted(p.stem for p in overlay_path.parent.glob("*.yaml"))
            raise ConfigError(f"{overlay_path}: no profile {profile!r} (known: {', '.join(known) or 'none'})")
        overlay, overlay_origins = read_yaml(overlay_path)
        doc = merge(doc, overlay)
        origins.update(overlay_origins)
    for override in overrides:
        set_override(doc, override)
        key = tuple(override.split("=", 1)[0].strip().split("."))
        origins = {k: v for k, v in origins.items() if k[: len(key)] != key}
        origins[key] = f"{path} (override --set {override})"
    return parse_params(doc, str(path), origins)
