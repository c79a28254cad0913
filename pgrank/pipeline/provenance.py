"""What a registered version learned from, for the gate's leak check beyond the current carve-out.

Every model ``pgrank train`` registers carries, as its training run's artifact ``provenance/queries.json``
(:func:`pgrank.training.trainer.provenance`), the ids of the queries it trained on and was selected with, and its
warm start. A model continued from a registered version (continual training from the champion, fetched into
``{root}/registry/<run id>/``) learned from that version's queries too, so the record is followed down the
chain of warm starts. The gate refuses a challenger or a champion whose queries meet the gate set
(:func:`meets`); a model whose training data cannot be known (a hub model, a version registered outside
``pgrank train``) is gated with a warning.

Example:
    >>> found = learned_from(client, "pgrank-retriever", "4")
    >>> meets(found, gate_set)
    ['q17', 'q230']
"""

from __future__ import annotations

import json
import re
import tempfile
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from mlflow.tracking import MlflowClient

    from pgrank.pipeline.gate import GateSet

ARTIFACT = "provenance/queries.json"
_REGISTRY_RUN = re.compile(r"[/\\]registry[/\\]([0-9a-f]{32})[/\\]")  # a warm start fetched by gate.fetch_version


@dataclass(frozen=True)
class Provenance:
    """The queries a model (and the registered models it was continued from) trained on or was selected with."""

    queries: dict[str, frozenset[str]] = field(default_factory=dict)  # data.train's dataset -> query ids
    unknown: list[str] = field(default_factory=list)  # what cannot be known, in words (hub warm starts, ...)


def _recorded(client: MlflowClient, run_id: str) -> dict | None:
    import mlflow
    from mlflow.exceptions import MlflowException

    with tempfile.TemporaryDirectory(prefix="pgrank-provenance-") as tmp:
        try:
            path = mlflow.artifacts.download_artifacts(run_id=run_id, artifact_path=ARTIFACT, dst_path=tmp,
                                                       tracking_uri=client.tracking_uri)
        except (MlflowException, OSError):
            return None
        with open(path, encoding="utf-8") as fh:
            return json.load(fh)


def learned_from(client: MlflowClient, model_name: str, version: str) -> Provenance:
    """The recorded queries of a registered version and of the registered versions it was continued from."""
    mv = client.get_model_version(model_name, version)
    queries: dict[str, set[str]] = {}
    unknown: list[str] = []
    run_id, what, seen = mv.run_id, f"{model_name} version {version}", set()
    while run_id and run_id not in seen:
        seen.add(run_id)
        record = _recorded(client, run_id)
        if record is None:
            unknown.append(f"{what}: its training run {run_id[:8]} recorded no training queries ({ARTIFACT})")
            break
        dataset = record["data.train"].split("/")[0]
        queries.setdefault(dataset, set()).update(record["train"], record["validation"])
        warm = record.get("warm_start") or ""
        found = _REGISTRY_RUN.search(warm)
        if found is None:
            unknown.append(f"its warm start {warm.rpartition('@')[0] or warm}: what it was trained on is not known")
            break
        run_id, what = found.group(1), f"its warm start (run {found.group(1)[:8]})"
    if not mv.run_id:
        unknown.append(f"{model_name} version {version}: registered without a training run")
    return Provenance({d: frozenset(q) for d, q in queries.items()}, unknown)


def meets(found: Provenance, gate: GateSet) -> list[str]:
    """The gate queries among the recorded ones, sorted (empty: none)."""
    return sorted(found.queries.get(gate.dataset, frozenset()) & set(gate.qrels))
