"""Scheduled retraining's rules: what a run holds out and trains from, and the gate that judges what it trained.

The Prefect flow (``flows/retraining.py``) only calls these and reports; both are callable without Prefect.

* :func:`retraining_overrides`, before the pipeline: the frozen gate set's judgments as ``data.holdout``
  (:func:`pgrank.pipeline.gate.holdout_override`), so gate queries stay the gate split, never trained on
  nor used for selection; with ``start_from="champion"`` the current champion, fetched from the
  registry, as the warm start (continual training).
* :func:`gate_workspace`, after it, one gate at a time (:func:`pgrank.pipeline.decisions.gate_lock`, a lease held in
  the registry itself, whatever the store) and after
  reconciling the registry with its last decision record: the challengers are the versions this pipeline run
  registered and nobody judged yet (or, with no champion yet, the newest version if it was never gated, e.g. one
  ``pgrank repro`` registered). The gate set is frozen on the first gated run and refreshed when due
  (:mod:`pgrank.pipeline.refresh`). A challenger that trained on, or was selected with, gate queries (in the
  workspace's carve-out or in the queries it recorded, :mod:`pgrank.pipeline.provenance`) is rejected, and so is
  a comparison with a champion whose recorded queries meet the gate set (the leak check). The best challenger on
  the selection split (validation nDCG@10, :func:`pgrank.pipeline.champion.best_challenger`) is the only one that
  meets the gate: it and its baseline (the champion; with none yet, its warm start unless
  ``champion.first: promote``) are evaluated side by side on the gate set (:mod:`pgrank.pipeline.gate`) and judged
  by :func:`pgrank.pipeline.champion.decide`. The decision is recorded in the registry first, the alias moves only
  if it passes and the champion is still the one compared with, and the decision goes to MLflow
  (:func:`pgrank.pipeline.decisions.settle`, :func:`pgrank.pipeline.champion.log_decision`).

Example:
    >>> decision = gate_workspace(Path("runs/demo"), parent_run_id)
    >>> decision.message
    'kept the champion: nothing was retrained: ...'
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Literal, get_args

from pgrank.config import Params, load_params
from pgrank.errors import PgrankError
from pgrank.paths import WORKSPACE_PARAMS, Paths
from pgrank.core import error_budget
from pgrank.pipeline import decisions, gate, provenance, refresh
from pgrank.pipeline.champion import (
    CHAMPION,
    DECISION_TAG,
    Decision,
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

log = logging.getLogger(__name__)

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
                          "run: set data.gate_size (e.g. --set data.gate_size=300; studies/gate_power.py's table says "
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
    """The versions to judge: those this run registered and never judged (a retried gate judges nothing twice, and
    the champion never meets itself); with none registered, the newest version when there is no champion yet and
    it was never gated (registered earlier, e.g. by ``pgrank repro``); else none."""
    def judged(version: str) -> bool:
        return DECISION_TAG in client.get_model_version(name, version).tags

    if retrained:
        return [v for v in retrained if v != current and not judged(v)]
    newest = versions(client, name)[-1:]
    if current is not None or not newest:
        return []
    return [] if judged(newest[0]) else newest


def gate_workspace(ws: Path, parent_run_id: str | None) -> Decision:
    """Gate the versions a pipeline run registered against the champion (see the module docstring).

    One gate at a time (:func:`pgrank.pipeline.decisions.gate_lock`: a lease in the registry, ``champion.lease``
    seconds without a renewal, ``champion.lease_wait`` seconds of waiting for another gate's before refusing): the
    registry is reconciled first (a decision a kill interrupted is completed), the champion is read, and the
    decision is recorded before the alias moves (:func:`pgrank.pipeline.decisions.settle`), the lease checked
    before every write.

    Args:
        ws: the run's DVC workspace (its ``params.yaml`` is the composed configuration).
        parent_run_id: the pipeline's MLflow run, under which its stage runs registered their versions.

    Returns:
        The decision, also recorded in the registry and logged to MLflow (and applied to the alias when a version
        is judged).
    """
    params = load_params(ws / WORKSPACE_PARAMS)
    cfg = params.champion
    if not params.tracking.enabled:
        return Decision(False, "tracking.enabled is false: there is no model registry to gate in", cfg.metric)
    client, paths = registry(params, ws)
    name, alias = params.tracking.registered_model, params.tracking.champion_alias

    def log_run(decision: Decision, record: str | None = None, per_query: dict | None = None) -> str | None:
        return log_decision(params, paths, decision, parent_run_id=parent_run_id, per_query=per_query, record=record)

    with decisions.gate_lock(client, name, ttl=cfg.lease, wait=cfg.lease_wait) as lease:
        decisions.recover(client, name, alias, log_run, lease.check)
        return _gate(params, paths, client, parent_run_id, log_run, lease.check)


def _gate(params: Params, paths: Paths, client: MlflowClient, parent_run_id: str | None, log_run,
          guard: decisions.Guard) -> Decision:
    """The gate itself, under the lock and after the reconciliation (:func:`gate_workspace`)."""
    cfg = params.champion
    name, alias = params.tracking.registered_model, params.tracking.champion_alias
    current = champion(client, name, alias)
    retrained = versions_of_run(client, name, parent_run_id) if parent_run_id else []
    judged = challengers(client, name, current, retrained)
    if not judged:
        decision = Decision(False, "nothing was retrained: this run registered no new model version (DVC found "
                            "the data and the settings unchanged)", cfg.metric, champion=current)
        log_run(decision)
        return decision
    if cfg.gate_set == "frozen":
        guard()  # the freeze writes to the registry
        decisions.settle_gate_set_runs(client, params.tracking.experiment, name, gate.frozen_run(client, params))
        gate_set = gate.frozen_gate_set(client, params, paths) or gate.freeze_gate_set(client, params, paths, parent_run_id)
        on_set = [r for r in decisions.records(client, name) if r.gate_set == gate.frozen_run(client, params)]
        gate_set, _ = refresh.refreshed(client, params, paths, gate_set, on_set, parent_run_id)
        gate_id = gate.frozen_run(client, params) or ""
    else:
        gate_set = gate.named_gate_set(params, paths)
        gate_id = cfg.gate_set
    selection = selection_scores(client, name, judged) if len(judged) > 1 else {}
    chosen = best_challenger(selection) if selection else judged[0]
    level, budget = budget_level(params, client, name)
    refused = _leak(params, paths, client, gate_set, chosen, current)
    if refused:
        decision = Decision(False, refused, cfg.metric, challenger=chosen, champion=current,
                            gate=gate_set.description, selection=selection)
        decisions.settle(client, name, alias, decision, log_run, gate_set=gate_id, guard=guard)
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
                      metrics=metrics, gate=gate_set.description, baseline=baseline, selection=selection,
                      level=level, budget=budget_words(budget, level))
    record = decisions.settle(client, name, alias, decision, lambda d, key: log_run(d, key, per_query),
                              gate_set=gate_id, level=level, guard=guard,
                              budget=budget_after(params, budget, level, decision.promoted))
    return record.as_decision()


def _leak(params: Params, paths: Paths, client: MlflowClient, gate_set: gate.GateSet, chosen: str,
          current: str | None) -> str | None:
    """Why the gate cannot compare these two fairly (``None``: it can): gate queries in the workspace's carve-out,
    or among the queries the challenger or the champion recorded (:mod:`pgrank.pipeline.provenance`). What
    cannot be known (a hub warm start's training data) is a warning."""
    name = params.tracking.registered_model
    found = {split: q for split, q in gate.leaked(params, paths, gate_set).items()}
    learned = {"challenger": provenance.learned_from(client, name, chosen)}
    if current is not None:
        learned["champion"] = provenance.learned_from(client, name, current)
    for who, record in learned.items():
        for note in record.unknown:
            log.warning("champion gate, the %s: %s", who, note)
    recorded = {who: provenance.meets(record, gate_set) for who, record in learned.items()}
    if recorded["challenger"]:
        found["its recorded training queries"] = recorded["challenger"]
    if found:
        said = "; ".join(f"{len(q)} in {split} (e.g. {q[:3]})" for split, q in found.items())
        return (f"the challenger trained on or was selected with gate queries: {said}; run the pipeline through "
                "scheduled retraining, which holds them out")
    if recorded.get("champion"):
        met = recorded["champion"]
        return (f"the champion, version {current}, trained on or was selected with {len(met)} gate queries (e.g. "
                f"{met[:3]}): it cannot be compared fairly on this gate set; refresh it (champion.refresh_after)")
    return None


def budget_level(params: Params, client: MlflowClient, name: str) -> tuple[float | None, dict | None]:
    """The error-budget level of the next decision and the budget before it (``(None, None)``: no
    ``champion.budget``), from the last decision record that holds a budget (:mod:`pgrank.core.error_budget`).

    The budget is pre-registered: its record keeps ``budget``, ``horizon`` and ``rule`` beside the state, and a
    configuration that names other ones while its horizon still runs is an error. Once ``horizon`` decisions have
    been taken, the next one starts a new budget (``period`` + 1): 0.05 over 52 weekly decisions is 0.05 a year.
    Decisions that ran no test (nothing retrained, a leak refused) spend nothing.

    Raises:
        PgrankError: the registry's budget differs from the configuration's mid-horizon, or its state is damaged.
    """
    cfg = params.champion
    if cfg.budget is None:
        return None, None
    said = {"budget": cfg.budget, "horizon": cfg.horizon, "rule": cfg.budget_rule}
    last = next((r for r in reversed(decisions.records(client, name)) if r.budget), None)
    before = {**said, "period": 1, "state": error_budget.BudgetState().to_json()}
    if last is not None:
        try:
            state = error_budget.BudgetState.from_json(last.budget["state"])
            period = int(last.budget.get("period", 1))
        except (KeyError, TypeError, ValueError) as e:
            raise PgrankError(f"registered model {name}: decision record {last.key}'s error budget is damaged "
                              f"({e}); it holds {last.budget!r}") from None
        recorded = {k: last.budget.get(k) for k in said}
        if state.decisions >= int(recorded["horizon"] or 0):
            before = {**said, "period": period + 1, "state": error_budget.BudgetState().to_json()}
        elif recorded != said:
            raise PgrankError(
                f"registered model {name}: the error budget was pre-registered as {_budget_words(recorded)} and "
                f"{state.decisions} of its decisions are taken; champion.* now says {_budget_words(said)}. A budget "
                "cannot change before its horizon ends: restore those champion keys (or gate under a new "
                "tracking.registered_model)")
        else:
            before = {**said, "period": period, "state": state.to_json()}
    state = error_budget.BudgetState.from_json(before["state"])
    return error_budget.level(cfg.budget_rule, cfg.budget, cfg.horizon, state), before


def _budget_words(b: dict) -> str:
    return f"{b['budget']} over {b['horizon']} decisions ({b['rule']})"


def budget_words(before: dict | None, level: float | None) -> str:
    """Where a decision's level came from, in words (``""``: no budget), for its message and table."""
    if before is None or level is None:
        return ""
    n = before["state"]["decisions"] + 1
    return (f"decision {n} of the error budget {_budget_words(before)}, period {before['period']}, "
            f"{before['state']['spent']:.3g} spent before it")


def budget_after(params: Params, before: dict | None, level: float | None, promoted: bool) -> dict | None:
    """The budget after a decision taken at ``level``, for its record (``None``: no budget): the pre-registered
    ``budget``/``horizon``/``rule``, the ``period``, the ``state`` and its ``spent`` and ``left``
    (:func:`pgrank.core.error_budget.left`)."""
    if before is None or level is None:
        return None
    cfg = params.champion
    state = error_budget.spend(error_budget.BudgetState.from_json(before["state"]), level, promoted)
    left = error_budget.left(cfg.budget_rule, cfg.budget, cfg.horizon, state)
    return {**before, "state": state.to_json(), "spent": state.spent, "left": left}
