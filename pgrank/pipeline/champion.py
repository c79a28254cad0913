"""The champion: the registered model version that serves, moved only when a new one is better.

Training registers every final model as a version of ``tracking.registered_model`` (default
``pgrank-retriever``) from its MLflow run, where it logged ``val_ndcg_at_10`` per epoch. A version's
score is the last value of that metric in its source run (the final epoch's validation nDCG@10).
:func:`promote_if_better` moves the alias ``tracking.champion_alias`` (default ``champion``) to the
best candidate only if there is no champion yet or the candidate's score is strictly higher; the
scheduled retraining flow (``flows/retraining.py``) calls it after each pipeline run.

Example:
    >>> from mlflow.tracking import MlflowClient
    >>> decision = promote_if_better(MlflowClient("sqlite:///runs/demo/mlflow.db"), "pgrank-retriever", "champion")
    >>> print(decision.message)
    promoted version 3 (val_ndcg_at_10 0.7012) over version 2 (0.6930)
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from pgrank.tracking import metric_name

if TYPE_CHECKING:
    from mlflow.tracking import MlflowClient

DEFAULT_METRIC = metric_name("val_ndcg@10")  # "val_ndcg_at_10", as training logs it
PARENT_TAG = "mlflow.parentRunId"


@dataclass(frozen=True)
class Decision:
    """The outcome of one comparison: the candidate, the champion before it, and why."""

    promoted: bool
    reason: str
    metric: str = DEFAULT_METRIC
    candidate: str | None = None
    candidate_score: float | None = None
    champion: str | None = None  # the champion before this decision
    champion_score: float | None = None

    @property
    def message(self) -> str:
        return ("promoted " if self.promoted else "kept the champion: ") + self.reason


def version_score(client: MlflowClient, model_name: str, version: str, metric: str = DEFAULT_METRIC) -> float | None:
    """The last value of ``metric`` in the source run of a model version (``None`` when it has none)."""
    run_id = client.get_model_version(model_name, version).run_id
    if not run_id:
        return None
    return client.get_run(run_id).data.metrics.get(metric)  # MLflow keeps a metric's latest value here


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


def promote_if_better(
    client: MlflowClient,
    model_name: str,
    alias: str,
    *,
    candidates: list[str] | None = None,
    metric: str = DEFAULT_METRIC,
) -> Decision:
    """Point ``alias`` at the best candidate version if it beats the current champion on ``metric``.

    Args:
        client: an MLflow client on the tracking store that holds the registry.
        model_name: the registered model (``tracking.registered_model``).
        alias: the champion alias (``tracking.champion_alias``).
        candidates: versions to consider (default: the newest version). The best of them by
            ``metric`` is compared; ties go to the newer version.
        metric: higher is better; read as the last value in each version's source run.

    Returns:
        A :class:`Decision`. The alias moves only when there is no champion yet or the candidate's
        score is strictly higher; an equal or lower score, a candidate that already is the champion,
        or a champion without the metric leaves it where it is.
    """
    candidates = versions(client, model_name)[-1:] if candidates is None else [str(v) for v in candidates]
    if not candidates:
        return Decision(False, f"no registered version of {model_name} to compare", metric)
    scored = [(score, v) for v in candidates if (score := version_score(client, model_name, v, metric)) is not None]
    if not scored:
        return Decision(False, f"version(s) {', '.join(candidates)} have no {metric} in their runs", metric,
                        candidates[-1])
    score, version = max(scored, key=lambda sv: (sv[0], int(sv[1])))
    current = champion(client, model_name, alias)
    if current is None:
        client.set_registered_model_alias(model_name, alias, version)
        return Decision(True, f"version {version} ({metric} {score:.4f}): {model_name} had no {alias!r} yet",
                        metric, version, score)
    best = version_score(client, model_name, current, metric)
    if version == current:
        return Decision(False, f"version {version} already is {alias!r} ({metric} {score:.4f})", metric,
                        version, score, current, best)
    if best is None:
        return Decision(False, f"{alias!r} version {current} has no {metric} to compare with; move the alias by hand "
                        f"to adopt version {version} ({score:.4f})", metric, version, score, current, None)
    if score > best:
        client.set_registered_model_alias(model_name, alias, version)
        return Decision(True, f"version {version} ({metric} {score:.4f}) over version {current} ({best:.4f})",
                        metric, version, score, current, best)
    return Decision(False, f"version {version} ({metric} {score:.4f}) is not better than {alias!r} version {current} "
                    f"({best:.4f})", metric, version, score, current, best)
