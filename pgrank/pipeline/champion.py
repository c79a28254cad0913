"""The champion: the registered model version that serves, moved only when a challenger passes a fair gate.

Training registers every final model as a version of ``tracking.registered_model`` (default
``pgrank-retriever``); the alias ``tracking.champion_alias`` (default ``champion``) marks the version
that serves. Scheduled retraining (:func:`pgrank.pipeline.retraining.gate_workspace`) evaluates the versions
a pipeline run registered (the challengers) and the champion *side by side on one fixed gate set*
(:mod:`pgrank.pipeline.gate`), never on each model's own validation split, which moves with the data.

:func:`decide` is the rule, a pure function of per-query values: the best challenger on
``champion.metric`` (:func:`best_challenger`) is promoted only if its mean over the gate queries beats the champion's by more
than ``champion.min_gain`` and a paired ``champion.test`` (:func:`pgrank.core.significance.paired_test`)
gives ``p < champion.alpha`` (``alpha: null``: no significance required). The first challenger is
promoted when there is no champion yet. :func:`apply` moves the alias and tags the challenger's
version with the decision; :func:`log_decision` records the decision and its table (champion vs
challenger, per metric, with p-values) in MLflow as run tags, metrics and artifacts.

Example:
    >>> decision = decide({"q1": {"ndcg@10": 0.9}, ...}, {"q1": {"ndcg@10": 0.7}, ...}, params.champion,
    ...                   challenger="4", champion="3", metrics=["ndcg@10"], gate="frozen ...")
    >>> print(decision.message)
    promoted version 4: ndcg@10 0.7421 vs 0.6930 (+0.0491 > min_gain 0.0), student p = 0.0031 < 0.05
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING

import numpy as np

from pgrank.config import ChampionConfig
from pgrank.core.significance import paired_test

if TYPE_CHECKING:
    from mlflow.tracking import MlflowClient

    from pgrank.config import Params
    from pgrank.paths import Paths

PARENT_TAG = "mlflow.parentRunId"
DECISION_TAG = "pgrank.gate"  # on the challenger's model version, and (as pgrank.gate.*) on the gate's MLflow run
PerQuery = dict[str, dict[str, float]]  # qid -> metric -> value


@dataclass(frozen=True)
class Row:
    """One metric of the gate table: both means over the gate queries, the gain and the paired p-value."""

    metric: str
    challenger: float
    champion: float | None = None
    gain: float | None = None
    p_value: float | None = None


@dataclass(frozen=True)
class Decision:
    """The outcome of one gate: which version, against which champion, on what, and why."""

    promoted: bool
    reason: str
    metric: str
    challenger: str | None = None  # the model version judged
    champion: str | None = None  # the champion before this decision
    rows: list[Row] = field(default_factory=list)
    gate: str = ""  # what the gate set is, in words
    queries: int = 0
    test: str = "student"
    alpha: float | None = 0.05
    min_gain: float = 0.0

    @property
    def message(self) -> str:
        return (f"promoted version {self.challenger}: " if self.promoted else "kept the champion: ") + self.reason

    def row(self, metric: str) -> Row | None:
        return next((r for r in self.rows if r.metric == metric), None)

    def markdown(self) -> str:
        """The decision and its table, as shown in the Prefect UI and logged to MLflow."""
        verdict = "**Promoted**" if self.promoted else "**Kept the champion**"
        lines = [f"# Champion gate: {verdict}", "", self.message, ""]
        if not self.rows:
            return "\n".join(lines)
        lines += [f"Gate set: {self.gate} ({self.queries} queries). Rule: promote if the challenger's mean "
                  f"`{self.metric}` beats the champion's by more than {self.min_gain:g}"
                  + (f" with a paired {self.test} test p < {self.alpha:g}." if self.alpha is not None else "."), ""]
        champ = f"champion (v{self.champion})" if self.champion else "champion (none)"
        lines += [f"| metric | {champ} | challenger (v{self.challenger}) | gain | p ({self.test}) |",
                  "| --- | ---: | ---: | ---: | ---: |"]
        fmt = lambda v, spec: "–" if v is None else format(v, spec)  # noqa: E731
        for r in self.rows:
            name = f"**{r.metric}**" if r.metric == self.metric else r.metric
            lines.append(f"| {name} | {fmt(r.champion, '.4f')} | {fmt(r.challenger, '.4f')} | {fmt(r.gain, '+.4f')} "
                         f"| {fmt(r.p_value, '.2g')} |")
        return "\n".join(lines) + "\n"

    def as_dict(self) -> dict:
        return asdict(self) | {"message": self.message}


def _mean(values: PerQuery, qids: list[str], metric: str) -> float:
    return float(np.mean([values[q][metric] for q in qids])) if qids else 0.0


def best_challenger(per_query: dict[str, PerQuery], metric: str) -> str:
    """The version whose mean ``metric`` over its gate queries is highest (a tie goes to the newer version)."""
    return max(per_query, key=lambda v: (np.mean([q[metric] for q in per_query[v].values()] or [0.0]), int(v)))


def decide(challenger_values: PerQuery, champion_values: PerQuery | None, cfg: ChampionConfig, *,
           challenger: str, champion: str | None, metrics: list[str], gate: str = "") -> Decision:
    """The gate's rule (see the module docstring), on per-query values of both models on the same gate queries.

    Args:
        challenger_values: qid -> metric -> value of the challenger on the gate set.
        champion_values: the same for the champion (``None``: there is no champion yet).
        cfg: ``champion`` section: metric, min_gain, test, alpha.
        challenger, champion: their model versions (for messages).
        metrics: the table's rows (``cfg.metric`` is added first if missing).
        gate: the gate set in words.

    Returns:
        A :class:`Decision` with one :class:`Row` per metric. Only queries both models were evaluated
        on are compared (the gate set makes them the same).
    """
    metrics = list(dict.fromkeys([cfg.metric, *metrics]))
    qids = sorted(set(challenger_values) & set(champion_values)) if champion_values is not None else sorted(challenger_values)
    base = dict(metric=cfg.metric, challenger=challenger, champion=champion, gate=gate, queries=len(qids),
                test=cfg.test, alpha=cfg.alpha, min_gain=cfg.min_gain)
    if champion_values is None:
        rows = [Row(m, _mean(challenger_values, qids, m)) for m in metrics]
        return Decision(True, f"there was no champion yet ({cfg.metric} {rows[0].challenger:.4f} on the gate set)",
                        rows=rows, **base)
    if not qids:
        return Decision(False, "the gate set has no query both models were evaluated on", **base)
    rows = []
    for m in metrics:
        ours, theirs = _mean(challenger_values, qids, m), _mean(champion_values, qids, m)
        p = paired_test({q: challenger_values[q][m] for q in qids}, {q: champion_values[q][m] for q in qids}, cfg.test)
        rows.append(Row(m, ours, theirs, ours - theirs, p))
    head = rows[0]
    scores = f"{cfg.metric} {head.challenger:.4f} vs {head.champion:.4f} ({head.gain:+.4f}"
    if head.gain <= cfg.min_gain:
        return Decision(False, f"version {challenger} is not better: {scores} <= min_gain {cfg.min_gain:g})",
                        rows=rows, **base)
    if cfg.alpha is not None and not head.p_value < cfg.alpha:
        return Decision(False, f"version {challenger}'s gain is not significant: {scores}), {cfg.test} p = "
                        f"{head.p_value:.2g} >= {cfg.alpha:g}", rows=rows, **base)
    significance = f", {cfg.test} p = {head.p_value:.2g} < {cfg.alpha:g}" if cfg.alpha is not None else ""
    return Decision(True, f"{scores} > min_gain {cfg.min_gain:g}){significance}", rows=rows, **base)


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


def apply(client: MlflowClient, model_name: str, alias: str, decision: Decision) -> None:
    """Move the alias to the challenger if promoted; tag the challenger's version with the decision either way."""
    if decision.challenger is None:
        return
    if decision.promoted:
        client.set_registered_model_alias(model_name, alias, decision.challenger)
    client.set_model_version_tag(model_name, decision.challenger, DECISION_TAG,
                                 ("promoted: " if decision.promoted else "kept: ") + decision.reason[:4900])


def log_decision(params: Params, paths: Paths, decision: Decision, *, parent_run_id: str | None,
                 per_query: dict[str, PerQuery] | None = None) -> str | None:
    """An MLflow run ``champion-gate`` (nested under the pipeline run) with the decision; returns its id.

    Tags ``pgrank.gate.decision`` (promoted | kept), ``pgrank.gate.reason``, ``pgrank.gate.metric``,
    ``pgrank.gate.challenger`` and ``pgrank.gate.champion``; metrics ``gate.<champion|challenger|gain|p>.<metric>``;
    artifacts ``gate/decision.md`` (the table), ``gate/decision.json`` and ``gate/per_query.json``.
    """
    import mlflow

    from pgrank import tracking

    if not params.tracking.enabled:
        return None
    tags = {"stage": "gate", f"{DECISION_TAG}.decision": "promoted" if decision.promoted else "kept",
            f"{DECISION_TAG}.reason": decision.reason[:4900], f"{DECISION_TAG}.metric": decision.metric,
            f"{DECISION_TAG}.challenger": str(decision.challenger), f"{DECISION_TAG}.champion": str(decision.champion),
            f"{DECISION_TAG}.gate_set": decision.gate[:4900]}
    tracking.configure(params, paths)
    with mlflow.start_run(run_name="champion-gate", nested=parent_run_id is not None, parent_run_id=parent_run_id,
                          tags=tags) as run:
        metrics = {}
        for r in decision.rows:
            for who, value in (("challenger", r.challenger), ("champion", r.champion), ("gain", r.gain), ("p", r.p_value)):
                if value is not None:
                    metrics[f"gate.{who}.{r.metric}"] = value
        tracking.log_metrics(run, metrics)
        mlflow.log_text(decision.markdown(), "gate/decision.md")
        mlflow.log_text(json.dumps(decision.as_dict(), indent=2, sort_keys=True), "gate/decision.json")
        if per_query:
            mlflow.log_text(json.dumps(per_query, sort_keys=True), "gate/per_query.json")
    return run.info.run_id
