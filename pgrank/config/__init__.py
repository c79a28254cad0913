"""``params.yaml`` parsed once into frozen, typed objects.

Every knob of the pipeline lives in ``params.yaml`` (one section per stage plus the shared
``paths``, ``models`` and ``tracking``). :func:`load_params` is the only place that reads it; library
functions receive these objects, never a dict or a file name.

* :mod:`pgrank.config.sections`: every section but ``train``;
* :mod:`pgrank.config.training`: the ``train`` section;
* :mod:`pgrank.config.params`: the whole file (:class:`Params`), its cross-field rules and :func:`load_params`;
* :mod:`pgrank.config.files`: reading YAML with each key's line, profiles and overrides, error messages.

Errors name the file, the line, the dotted key and what was expected, for example::

    params.yaml:31: train.pg.temperature: must be > 0 (got -1)

Example:
    >>> from pgrank.config import load_params
    >>> params = load_params("params.yaml", overrides=["train.epochs=2"])
    >>> params.train.pg.temperature
    0.05
"""

from __future__ import annotations

from pgrank.config.params import (
    Params,
    load_params,
    parse_params,
    profile_path,
)
from pgrank.config.sections import (
    Bm25Config,
    ChampionConfig,
    DataConfig,
    EVAL_STAGES,
    EvalStage,
    EvaluateConfig,
    GATE_METRIC,
    HalvesConfig,
    InferenceBackend,
    MineConfig,
    ModelsConfig,
    NonNegFloat,
    NonNegInt,
    OfflineModel,
    PathsConfig,
    PositiveFloat,
    PositiveInt,
    SearchConfig,
    Section,
    SignificanceConfig,
    SourceConfig,
    SystemsConfig,
    TablesConfig,
    TrackingConfig,
)
from pgrank.config.training import (
    DocumentAnchorConfig,
    OBJECTIVE_NAMES,
    Objective,
    PolicyGradientConfig,
    RunName,
    SelectionConfig,
    TrainConfig,
    VariantConfig,
)

__all__ = [
    "Bm25Config",
    "ChampionConfig",
    "DataConfig",
    "DocumentAnchorConfig",
    "EVAL_STAGES",
    "EvalStage",
    "EvaluateConfig",
    "GATE_METRIC",
    "HalvesConfig",
    "InferenceBackend",
    "MineConfig",
    "ModelsConfig",
    "NonNegFloat",
    "NonNegInt",
    "OBJECTIVE_NAMES",
    "Objective",
    "OfflineModel",
    "Params",
    "PathsConfig",
    "PolicyGradientConfig",
    "PositiveFloat",
    "PositiveInt",
    "RunName",
    "SearchConfig",
    "Section",
    "SelectionConfig",
    "SignificanceConfig",
    "SourceConfig",
    "SystemsConfig",
    "TablesConfig",
    "TrackingConfig",
    "TrainConfig",
    "VariantConfig",
    "load_params",
    "parse_params",
    "profile_path",
]
