"""Scheduled retraining's rules: what a run holds out and trains from, and the gate that judges what it trained.

The Prefect flow (``flows/retraining.py``) only calls these and reports; both are callable without Prefect.

* :func:`retraining_overrides`, before the pipeline: the frozen gate set's judgments as ``data.holdout``
  (:func:`pgrank.pipeline.gate.holdout_override`), so gate queries stay the gate split, never trained on
  nor used for selection; with ``start_from="champion"`` the current champion, fetched from the
  registry, as the warm start (continual training).
* :func:`gate_workspace`, after it: the challengers are the versions this pipeline run registered (or,
  with no champion yet, the newest version if it was never gated, e.g. one ``pgrank repro`` registered);
  a challenger that trained on, or was selected with, gate queries is rejected (the leak check). The
  best challenger on the selection split (validation nDCG@10, :func:`pgrank.pipeline.champion.best_challenger`)
  is the only one that meets the gate: it and its baseline (the champion; with none yet, its warm start
  unless ``champion.first: promote``) are evaluated side by side on the gate set
  (:mod:`pgrank.pipeline.gate`) and judged by :func:`pgrank.pipeline.champion.decide`; the alias moves
  only if it passes, and the decision goes to MLflow (:func:`pgrank.pipeline.champion.log_decision`).

Example:
    >>> decision = gate_workspace(Path("runs/demo"), parent_run_id)
    >>> decision.message
    'kept the champion: nothing was retrained: ...'
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Literal, get_args

from pgrank.config import Params, load_params
from pgrank.errors import PgrankError
from pgrank.paths import Paths
from pgrank.pipeline import gate
from pgrank.pipeline.champion import (
    CHAMPION,
    DECISION_TAG,
    Decision,
    apply,
    best_challenger,
    champion,
    decide,
    log_decision,
    selection_scores,
    versions,
    versions_of_run,
)

if TYPE_CHECKING:
    from mlflow.tracking import MlflowClient

StartFrom = Literal["warm_start", "champion"]
START_FROM: tuple[str, ...] = get_args(StartFrom)


@dataclass(frozen=True)
class Overrides:
    """What a retraining run adds to the user's overrides, and why (for the run's log)."""

    extra: list[str]  # --set-style key=value overrides
    notes: list[str]


def registry(params: Params, base: Path) -> tuple[MlflowClient, Paths]:
    """The model registry of a configuration (its MLflow store) and its paths, relative to ``base``."""
    from mlflow.tracking import MlflowClient

    from pgrank.tracking import tracking_uri

    paths = Paths.from_config(params.paths, base=base)
    return MlflowClient(tracking_uri(params, paths)), paths


def retraining_overrides(params_file: str | Path, profile: str | None, overrides: list[str],
                         start_from: str) -> Overrides:
    """The overrides a retraining run adds: ``data.holdout`` (the frozen gate set) and, for continual
    training (``start_from="champion"``), the champion as the warm start.

    Raises:
        PgrankError: an unknown ``start_from``; ``champion`` without a model registry (tracking off); or a
            first gated run with ``champion.gate_set: frozen`` and no gate split to freeze (``data.gate_size`` 0),
            said before the pipeline runs rather than after it.
    """
    if start_from not in START_FROM:
        raise PgrankError(f"start_from={start_from!r}: expected one of {', '.join(START_FROM)}")
    params = load_params(params_file, overrides, profile)
    if not params.tracking.enabled:
        if start_from == "champion":
            raise PgrankError("start_from='champion' needs the model registry: set tracking.enabled: true")
        return Overrides([], [])
    client, paths = registry(params, Path(params_file).resolve().parent)
    extra, frozen = gate.holdout_override(client, params, paths)
    if (params.champion.gate_set == "frozen" and not params.data.gate_size and not params.data.holdout
            and gate.frozen_run(client, params) is None):
        raise PgrankError("champion.gate_set is frozen, but data.train has no gate split to freeze in this first gated "
                          "run: set data.gate_size (e.g. --set data.gate_size=300; bench/gate_power.py's table says "
                          "how many gate queries a gain needs) or champion.gate_set: dataset/split")
    notes = [f"gate queries held out of training and selection: {extra[0]}"] if extra else []
    if frozen is not None and frozen.note:
        notes.append(frozen.note)
    if start_from == "champion":
        name, alias = params.tracking.registered_model, params.tracking.champion_alias
        version = champion(client, name, alias)
        if version is None:
            notes.append(f"start_from=champion: {name} has no {alias!r} yet; training from the configured warm start(s)")
        else:
            model = gate.fetch_version(client, paths, name, version)
            dense = [s for s in params.evaluate.systems.dense if s != alias] + [alias]
            extra += [f"models.aliases.{alias}={model.folder}", f"train.warm_starts=[{alias}]",
                      f"evaluate.systems.dense=[{', '.join(dense)}]"]
            notes.append(f"continual training from {name} version {version} ({model.folder})")
    return Overrides(extra, notes)


def challengers(client: MlflowClient, name: str, current: str | None, retrained: list[str]) -> list[str]:
    """The versions to judge: those this run registered; with none, the newest version when there is no
    champion yet and it was never gated (registered earlier, e.g. by ``pgrank repro``); else none."""
    if retrained:
        return retrained
    newest = versions(client, name)[-1:]
    if current is not None or not newest:
        return []
    return [] if DECISION_TAG in client.get_model_version(name, newest[0]).tags else newest


def gate_workspace(ws: Path, parent_run_id: str | None) -> Decision:
    """Gate the versions a pipeline run registered against the champion (see the module docstring).

    Args:
        ws: the run's DVC workspace (its ``params.yaml`` is the composed configuration).
        parent_run_id: the pipeline's MLflow run, under which its stage runs registered their versions.

    Returns:
        The decision, also logged to MLflow (and applied to the alias when a version is judged).
    """
    params = load_params(ws / "params.yaml")
    cfg = params.champion
    if not params.tracking.enabled:
        return Decision(False, "tracking.enabled is false: there is no model registry to gate in", cfg.metric)
    client, paths = registry(params, ws)
    name, alias = params.tracking.registered_model, params.tracking.champion_alias
    current = champion(client, name, alias)
    retrained = versions_of_run(client, name, parent_run_id) if parent_run_id else []
    judged = challengers(client, name, current, retrained)
    if not judged:
        decision = Decision(False, "nothing was retrained: this run registered no new model version (DVC found "
                            "the data and the settings unchanged)", cfg.metric, champion=current)
        log_decision(params, paths, decision, parent_run_id=parent_run_id)
        return decision
    if cfg.gate_set == "frozen":
        gate_set = gate.frozen_gate_set(client, params, paths) or gate.freeze_gate_set(client, params, paths, parent_run_id)
    else:
        gate_set = gate.named_gate_set(params, paths)
    selection = selection_scores(client, name, judged) if len(judged) > 1 else {}
    chosen = best_challenger(selection) if selection else judged[0]
    leaked = gate.leaked(params, paths, gate_set)
    if leaked:
        found = "; ".join(f"{len(q)} in {split} (e.g. {q[:3]})" for split, q in leaked.items())
        decision = Decision(False, f"the challenger trained on or was selected with gate queries: {found}; run the "
                            "pipeline through scheduled retraining, which holds them out", cfg.metric,
                            challenger=chosen, champion=current, gate=gate_set.description, selection=selection)
        apply(client, name, alias, decision)
        log_decision(params, paths, decision, parent_run_id=parent_run_id)
        return decision
    model = gate.fetch_version(client, paths, name, chosen)
    per_query = {f"v{chosen}": gate.evaluate_system(params, paths, gate_set, model.system)}
    baseline, baseline_values = CHAMPION, None
    if current is not None:
        per_query[f"v{current}"] = baseline_values = gate.evaluate_system(
            params, paths, gate_set, gate.fetch_version(client, paths, name, current).system)
    elif cfg.first == "gate":
        warm = gate.warm_start_system(params, model)
        baseline = f"its warm start {warm.name}"
        per_query["warm start"] = baseline_values = gate.evaluate_system(params, paths, gate_set, warm)
    metrics, _, _ = gate.gate_metrics(params)
    decision = decide(per_query[f"v{chosen}"], baseline_values, cfg, challenger=chosen, champion=current,
                      metrics=metrics, gate=gate_set.description, baseline=baseline, selection=selection)
    apply(client, name, alias, decision)
    log_decision(params, paths, decision, parent_run_id=parent_run_id, per_query=per_query)
    return decision
