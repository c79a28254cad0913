"""The champion: the registered model version that serves, moved only when a challenger passes a fair gate.

Training registers every final model as a version of ``tracking.registered_model`` (default
``pgrank-retriever``); the alias ``tracking.champion_alias`` (default ``champion``) marks the version
that serves. Scheduled retraining (:func:`pgrank.pipeline.retraining.gate_workspace`) evaluates the chosen
challenger and its baseline *side by side on one fixed gate set* (:mod:`pgrank.pipeline.gate`), queries
that no model was trained on nor selected with.

One test per decision. With several challengers (the versions one run registered: warm starts,
objectives), the one sent to the gate is the best on the selection split, its validation nDCG@10
(:func:`best_challenger`, :func:`selection_scores`); only it meets the gate. The baseline is the champion,
or with no champion yet the challenger's warm start (``champion.first: gate``; ``promote``: no
comparison). :func:`decide` is the rule, :func:`pgrank.core.promotion.judge` on per-query values. Superiority
(the default): promote only if the challenger's mean ``champion.metric`` over the gate queries beats the baseline's
by more than ``champion.min_gain`` and a one-sided test of the mean gain, ``champion.test`` (``betting``: exact for
any distribution of per-query gains, :mod:`pgrank.core.betting`), gives ``p`` below the decision's level.
Non-inferiority (``champion.margin`` m): promote unless the challenger is worse by more than m (one-sided test of
H0 "gain <= -m"). The level is ``champion.alpha``, or with ``champion.budget`` the level the error budget gives
this decision (:func:`pgrank.pipeline.retraining.budget_level`; ``alpha: null`` and no budget: no significance
required). How often this promotes by chance is measured by ``studies/gate_power.py``.
:func:`pgrank.pipeline.decisions.commit` records the decision in the registry first, then moves the alias
(compare-and-set) and tags the challenger's version (the crash-safe ledger); :func:`log_decision` records the
decision and its table (baseline vs challenger, per metric, with p-values) in MLflow as run tags, metrics and
artifacts.

Example:
    >>> decision = decide({"q1": {"ndcg@10": 0.9}, ...}, {"q1": {"ndcg@10": 0.7}, ...}, params.champion,
    ...                   challenger="4", champion="3", metrics=["ndcg@10"], gate="frozen ...")
    >>> print(decision.message)
    promoted version 4: ndcg@10 0.7421 vs 0.6930 (+0.0491 > min_gain 0), betting p = 0.0016 < level 0.05
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING

import numpy as np

from pgrank.config import ChampionConfig
from pgrank.core.promotion import choose, judge

if TYPE_CHECKING:
    from mlflow.tracking import MlflowClient

    from pgrank.config import Params
    from pgrank.paths import Paths

PARENT_TAG = "mlflow.parentRunId"
DECISION_TAG = "pgrank.gate"  # on the challenger's model version, and (as pgrank.gate.*) on the gate's MLflow run
RECORD_RUN_TAG = "pgrank.gate.record"  # on the gate's MLflow run: "<registered model> <its decision record's key>"
CHAMPION = "the champion"  # the baseline when there is one
# What a version's training run logged of its validation nDCG@10 (pgrank.training.trainer, MLflow names): the epoch
# train.selection chose, else (rule last) the last epoch's, the latest value of the per-epoch metric.
SELECTION_METRICS = ("selected_in_domain_ndcg_at_10", "val_ndcg_at_10")
PerQuery = dict[str, dict[str, float]]  # qid -> metric -> value


@dataclass(frozen=True)
class Row:
    """One metric of the gate table: both means over the gate queries, the gain and the paired p-value.

    ``champion`` is the baseline's mean: the champion's, or the warm start's in a first gated run."""

    metric: str
    challenger: float
    champion: float | None = None
    gain: float | None = None
    p_value: float | None = None


@dataclass(frozen=True)
class Decision:
    """The outcome of one gate: which version, against what, on what, and why."""

    promoted: bool
    reason: str
    metric: str
    challenger: str | None = None  # the model version judged
    champion: str | None = None  # the champion before this decision
    rows: list[Row] = field(default_factory=list)
    gate: str = ""  # what the gate set is, in words
    queries: int = 0
    test: str = "betting"
    alpha: float | None = 0.05  # the level this decision's test ran at (champion.alpha, or the error budget's)
    min_gain: float = 0.0
    margin: float | None = None  # non-inferiority margin (None: superiority with min_gain)
    budget: str = ""  # where the level came from, in words, with an error budget ("": champion.alpha)
    baseline: str = CHAMPION  # what the challenger met: the champion, or its warm start ("its warm start NAME")
    selection: dict[str, float] = field(default_factory=dict)  # version -> validation nDCG@10, with several challengers
    e_value: float | None = None  # the betting test's e-value of the decision's metric (p = min(1, 1 / e))

    @property
    def message(self) -> str:
        if self.promoted:
            return f"promoted version {self.challenger}: {self.reason}"
        return ("kept the champion: " if self.champion else "no champion yet: ") + self.reason

    def row(self, metric: str) -> Row | None:
        return next((r for r in self.rows if r.metric == metric), None)

    def markdown(self) -> str:
        """The decision and its table, as shown in the Prefect UI and logged to MLflow."""
        verdict = "**Promoted**" if self.promoted else "**Kept the champion**" if self.champion else "**Not promoted**"
        lines = [f"# Champion gate: {verdict}", "", self.message, ""]
        if len(self.selection) > 1:
            scores = ", ".join(f"v{v} {s:.4f}" for v, s in self.selection.items())
            lines += [f"Challengers: {scores} (validation nDCG@10, the selection split); only the best, version "
                      f"{self.challenger}, meets the gate: one test per decision.", ""]
        if not self.rows:
            return "\n".join(lines)
        lines += [f"Gate set: {self.gate} ({self.queries} queries). Rule: {self.rule}.", ""]
        if self.baseline == CHAMPION:
            base = f"champion (v{self.champion})" if self.champion else "champion (none)"
        else:
            base = self.baseline.removeprefix("its ")
        lines += [f"| metric | {base} | challenger (v{self.challenger}) | gain | one-sided p ({self.test}) |",
                  "| --- | ---: | ---: | ---: | ---: |"]
        fmt = lambda v, spec: "–" if v is None else format(v, spec)  # noqa: E731
        for r in self.rows:
            name = f"**{r.metric}**" if r.metric == self.metric else r.metric
            lines.append(f"| {name} | {fmt(r.champion, '.4f')} | {fmt(r.challenger, '.4f')} | {fmt(r.gain, '+.4f')} "
                         f"| {fmt(r.p_value, '.2g')} |")
        return "\n".join(lines) + "\n"

    @property
    def rule(self) -> str:
        """The rule the decision applied, in words: superiority or non-inferiority, the test and its level."""
        if self.margin is None:
            said = f"promote if the challenger's mean `{self.metric}` beats {self.baseline}'s by more than {self.min_gain:g}"
        else:
            said = (f"promote unless the challenger's mean `{self.metric}` is worse than {self.baseline}'s by more than "
                    f"the margin {self.margin:g} (non-inferiority)")
        if self.alpha is None:
            return said
        said += f", with a one-sided {self.test} test of the mean gain, p < {self.alpha:.3g}"
        return said + (f", the level {self.budget}" if self.budget else " (champion.alpha)")

    def as_dict(self) -> dict:
        return asdict(self) | {"message": self.message}


def tuning_level(cfg: ChampionConfig) -> float:
    """The level the betting test's bets are tuned for, fixed before any data: the budget's share per decision
    (``budget / horizon``), else ``alpha`` (0.05 when no significance is asked for)."""
    return cfg.budget / cfg.horizon if cfg.budget is not None else cfg.alpha or 0.05


def _values(values: PerQuery, qids: list[str], metric: str) -> np.ndarray:
    return np.array([values[q][metric] for q in qids], dtype=np.float64)


def best_challenger(selection: dict[str, float]) -> str:
    """The version with the highest selection score (validation nDCG@10; a tie goes to the newer version)."""
    ordered = sorted(selection, key=int)
    return ordered[choose([selection[v] for v in ordered])]


def decide(challenger_values: PerQuery, baseline_values: PerQuery | None, cfg: ChampionConfig, *,
           challenger: str, champion: str | None, metrics: list[str], gate: str = "", baseline: str = CHAMPION,
           selection: dict[str, float] | None = None, level: float | None = None, budget: str = "") -> Decision:
    """The gate's rule (see the module docstring), on per-query values of both models on the same gate queries.

    Args:
        challenger_values: qid -> metric -> value of the challenger on the gate set.
        baseline_values: the same for the baseline (the champion, or the warm start); ``None``: there is no
            champion and ``champion.first: promote``, so the challenger is promoted without a comparison.
        cfg: ``champion`` section: metric, min_gain or margin, test, alpha or budget.
        challenger, champion: their model versions (for messages; ``champion`` is ``None`` before the first).
        metrics: the table's rows (``cfg.metric`` is added first if missing). Every row's p-value is the same
            one-sided test as the decision's.
        gate: the gate set in words.
        baseline: what the challenger meets, in words (``"the champion"``, ``"its warm start NAME"``).
        selection: version -> validation nDCG@10 of the challengers the chosen one was picked among.
        level: with ``cfg.budget``, this decision's level from the error budget (required then; 0: the budget is
            spent and nothing is promoted); without one, ``cfg.alpha`` is the level and this must be ``None``.
        budget: where ``level`` came from, in words (the decision's record and table name it).

    Returns:
        A :class:`Decision` with one :class:`Row` per metric. Only queries both models were evaluated
        on are compared (the gate set makes them the same).
    """
    if (cfg.budget is not None) != (level is not None):
        raise ValueError("decide: a level comes with champion.budget, and only with it "
                         f"(budget {cfg.budget!r}, level {level!r})")
    alpha = cfg.alpha if cfg.budget is None else level
    metrics = list(dict.fromkeys([cfg.metric, *metrics]))
    qids = sorted(set(challenger_values) & set(baseline_values)) if baseline_values is not None else sorted(challenger_values)
    base = dict(metric=cfg.metric, challenger=challenger, champion=champion, gate=gate, queries=len(qids),
                test=cfg.test, alpha=alpha, min_gain=cfg.min_gain, margin=cfg.margin, budget=budget,
                baseline=baseline, selection=dict(selection or {}))
    if baseline_values is None:
        rows = [Row(m, float(_values(challenger_values, qids, m).mean()) if qids else 0.0) for m in metrics]
        return Decision(True, f"there was no champion yet and champion.first is promote ({cfg.metric} "
                        f"{rows[0].challenger:.4f} on the gate set)", rows=rows, **base)
    if not qids:
        return Decision(False, "the gate set has no query both models were evaluated on", **base)
    rows = []
    for m in metrics:
        ours, theirs = _values(challenger_values, qids, m), _values(baseline_values, qids, m)
        judged = judge(ours, theirs, min_gain=cfg.min_gain, test=cfg.test, alpha=alpha, margin=cfg.margin,
                       tune=tuning_level(cfg), by_e_value=cfg.budget is not None and cfg.budget_rule == "elond")
        if m == cfg.metric:  # the first row: the decision's own metric
            verdict = judged
        rows.append(Row(m, float(ours.mean()), float(theirs.mean()), judged.gain, judged.p_value))
    base["e_value"] = verdict.e_value
    head = rows[0]
    against = "" if baseline == CHAMPION else f"{baseline}'s "
    scores = f"{cfg.metric} {head.challenger:.4f} vs {against}{head.champion:.4f} ({head.gain:+.4f}"
    bound = f"min_gain {cfg.min_gain:g}" if cfg.margin is None else f"-{cfg.margin:g}, the margin"
    if verdict.reason == "not_better":
        what = "not better than" if cfg.margin is None else "worse by more than champion.margin than"
        return Decision(False, f"version {challenger} is {what} {baseline}: {scores} <= {bound})", rows=rows, **base)
    source = f" ({budget})" if budget else ""
    by_e = cfg.budget is not None and cfg.budget_rule == "elond"

    def evidence(passed: bool) -> str:
        if by_e:  # e-LOND: the e-value against 1 / level
            return f"{cfg.test} e-value {verdict.e_value:.3g} {'>=' if passed else '<'} 1 / level {alpha:.3g}"
        return f"{cfg.test} p = {head.p_value:.2g} {'<' if passed else '>='} level {alpha:.3g}"

    if verdict.reason == "not_significant":
        what = "gain over" if cfg.margin is None else "non-inferiority to"
        spent = "; the error budget is spent" if alpha == 0 else ""
        return Decision(False, f"version {challenger}'s {what} {baseline} is not significant: {scores}), "
                        f"{evidence(False)}{source}{spent}", rows=rows, **base)
    significance = f", {evidence(True)}{source}" if alpha is not None else ""
    return Decision(True, f"{scores} > {bound}){significance}", rows=rows, **base)

# --------------------------------------------------------------------------------------- registry


def versions(client: MlflowClient, model_name: str) -> list[str]:
    """Every version of a registered model, oldest first (none when it is not registered)."""
    found = client.search_model_versions(f"name = '{model_name}'")
    return sorted((str(mv.version) for mv in found), key=int)


def versions_of_run(client: MlflowClient, model_name: str, parent_run_id: str) -> list[str]:
    """The versions registered by stage runs nested under one pipeline run (its new models)."""
    found = []
    for mv in client.search_model_versions(f"name = '{model_name}'"):
        if mv.run_id and client.get_run(mv.run_id).data.tags.get(PARENT_TAG) == parent_run_id:
            found.append(str(mv.version))
    return sorted(found, key=int)


def selection_scores(client: MlflowClient, model_name: str, versions: list[str]) -> dict[str, float]:
    """Each version's validation nDCG@10 as its training run logged it (:data:`SELECTION_METRICS`), oldest first.

    Raises:
        PgrankError: a version whose run logged none (registered outside ``pgrank train``): the challengers
            cannot be compared on the selection split.
    """
    from pgrank.errors import PgrankError

    scores = {}
    for version in sorted(versions, key=int):
        mv = client.get_model_version(model_name, version)
        metrics = client.get_run(mv.run_id).data.metrics if mv.run_id else {}
        found = next((metrics[k] for k in SELECTION_METRICS if k in metrics), None)
        if found is None:
            raise PgrankError(f"{model_name} version {version}: its training run logged no validation nDCG@10 "
                              f"({' or '.join(SELECTION_METRICS)}), so the challengers cannot be compared on the "
                              "selection split")
        scores[version] = float(found)
    return scores


def champion(client: MlflowClient, model_name: str, alias: str) -> str | None:
    """The version the alias points at, or ``None`` (no alias, or no such registered model)."""
    from mlflow.exceptions import MlflowException

    try:
        aliases = client.get_registered_model(model_name).aliases
    except MlflowException as exc:
        if exc.error_code == "RESOURCE_DOES_NOT_EXIST":
            return None
        raise
    version = aliases.get(alias)
    return None if version is None else str(version)


def record_marker(model_name: str, record: str) -> str:
    """The value of a decision run's ``pgrank.gate.record`` tag: the registered model and the record's key (record
    numbers are per registered model, and several may share an experiment)."""
    return f"{model_name} {record}"


def logged_run(client: MlflowClient, experiment_id: str, marker: str) -> str | None:
    """The finished ``champion-gate`` run whose ``pgrank.gate.record`` tag is ``marker`` (:func:`record_marker`), if
    one was logged; an unfinished one (its process killed while logging) is deleted, so that a record's run is logged
    once and whole."""
    found = client.search_runs([experiment_id], filter_string=f"tags.`{RECORD_RUN_TAG}` = '{marker}'")
    finished = [r.info.run_id for r in found if r.info.status == "FINISHED"]
    for run in found:
        if run.info.run_id not in finished[:1]:
            client.delete_run(run.info.run_id)
    return finished[0] if finished else None


def log_decision(params: Params, paths: Paths, decision: Decision, *, parent_run_id: str | None,
                 per_query: dict[str, PerQuery] | None = None, record: str | None = None) -> str | None:
    """An MLflow run ``champion-gate`` (nested under the pipeline run) with the decision; returns its id.

    With ``record`` (the decision record's key), the run carries the tag ``pgrank.gate.record`` (the registered model
    and the key) from its start, and a finished run of that record is returned instead of logging a second one
    (:func:`logged_run`).

    Tags ``pgrank.gate.decision`` (promoted | kept), ``pgrank.gate.baseline`` (what the challenger met),
    ``pgrank.gate.reason``, ``pgrank.gate.metric``, ``pgrank.gate.challenger``, ``pgrank.gate.champion`` and
    ``pgrank.gate.rule`` (the rule and its level, in words); metrics ``gate.<champion|challenger|gain|p>.<metric>``
    (``champion``: the baseline's mean; ``p``: one-sided), ``gate.level`` (the test's level) and, with several
    challengers, ``gate.selection.v<version>`` (their validation nDCG@10); artifacts ``gate/decision.md`` (the
    table), ``gate/decision.json`` and ``gate/per_query.json``.
    """
    import mlflow

    from pgrank import tracking

    if not params.tracking.enabled:
        return None
    tracking.configure(params, paths)
    marker = record_marker(params.tracking.registered_model, record) if record else None
    if marker is not None:
        client = mlflow.MlflowClient()
        experiment = client.get_experiment_by_name(params.tracking.experiment)
        done = logged_run(client, experiment.experiment_id, marker) if experiment is not None else None
        if done is not None:
            return done
    tags = {"stage": "gate", **({RECORD_RUN_TAG: marker} if marker else {}), f"{DECISION_TAG}.decision": "promoted" if decision.promoted else "kept",
            f"{DECISION_TAG}.baseline": decision.baseline,
            f"{DECISION_TAG}.reason": decision.reason[:4900], f"{DECISION_TAG}.metric": decision.metric,
            f"{DECISION_TAG}.challenger": str(decision.challenger), f"{DECISION_TAG}.champion": str(decision.champion),
            f"{DECISION_TAG}.gate_set": decision.gate[:4900], f"{DECISION_TAG}.rule": decision.rule[:4900]}
    with mlflow.start_run(run_name="champion-gate", nested=parent_run_id is not None, parent_run_id=parent_run_id,
                          tags=tags) as run:
        metrics = {}
        for r in decision.rows:
            for who, value in (("challenger", r.challenger), ("champion", r.champion), ("gain", r.gain), ("p", r.p_value)):
                if value is not None:
                    metrics[f"gate.{who}.{r.metric}"] = value
        metrics.update({f"gate.selection.v{v}": score for v, score in decision.selection.items()})
        if decision.alpha is not None and decision.rows:
            metrics["gate.level"] = decision.alpha
        tracking.log_metrics(run, metrics)
        mlflow.log_text(decision.markdown(), "gate/decision.md")
        mlflow.log_text(json.dumps(decision.as_dict(), indent=2, sort_keys=True), "gate/decision.json")
        if per_query:
            mlflow.log_text(json.dumps(per_query, sort_keys=True), "gate/per_query.json")
    return run.info.run_id
