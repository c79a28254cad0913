"""A gate set that is refreshed: after a promotion, or after ``champion.refresh_after`` decisions on one set.

Every decision on a gate set spends a little of its independence: the champion that a set kept or promoted was
chosen *because* of how it scored on those queries, so the next comparison on the same queries favours it, and a
challenger tuned by a person who read the earlier tables favours the set's quirks. A fresh set of queries that no
decision has seen removes both. The fresh set comes from the gate *reserve*: judged queries below the carve-out's
gate bound that arrived after the set was frozen (:mod:`pgrank.download.carve_out`), held out of training and
selection since. The old set is retired: its ``gate.json`` lists it under ``retired``, and the next carve-out
returns its queries to training. Without new judgments there is no reserve, the old set stays, and each further
decision on it is counted (:func:`pgrank.pipeline.decisions.decisions_on`).
"""

from __future__ import annotations

import json
import logging
from typing import TYPE_CHECKING

from pgrank.data.beir import load_qrels
from pgrank.errors import PgrankError
from pgrank.paths import CARVED_FILES, GATE, Paths
from pgrank.pipeline import gate

if TYPE_CHECKING:
    from mlflow.tracking import MlflowClient

    from pgrank.config import Params
    from pgrank.pipeline.decisions import Record

log = logging.getLogger(__name__)


def due(params: Params, on_set: list[Record]) -> str | None:
    """Why the gate set is to be refreshed now (``None``: it is not): its last decision promoted, or it has made
    ``champion.refresh_after`` decisions. ``on_set``: the records of decisions on it, oldest first."""
    refresh_after = params.champion.refresh_after
    if on_set and on_set[-1].outcome == "promote":
        return f"its last decision promoted version {on_set[-1].challenger}"
    if refresh_after is not None and len(on_set) >= refresh_after:
        return f"it has made {len(on_set)} decisions (champion.refresh_after={refresh_after})"
    return None


def reserve(params: Params, paths: Paths, current: gate.GateSet) -> list[str]:
    """The gate split's queries outside the current gate set and its retired ones (new judgments), in hash order."""
    from pgrank.download.carve_out import position

    dataset = params.data.train.split("/")[0]
    split_file = paths.carved_qrels(dataset, CARVED_FILES[GATE])
    held = set(load_qrels(split_file)) if split_file.is_file() else set()
    meta = _meta(current)
    fresh = held - set(current.qrels) - set(meta.get("retired", ()))
    return sorted(fresh, key=lambda q: position(params.data.validation_seed, q))


def _meta(current: gate.GateSet) -> dict:
    file = current.documents / "gate.json" if current.documents is not None else None
    return json.loads(file.read_text(encoding="utf-8")) if file is not None and file.is_file() else {}


def refresh_gate_set(client: MlflowClient, params: Params, paths: Paths, current: gate.GateSet,
                     parent_run_id: str | None, fresh: list[str] | None = None) -> gate.GateSet:
    """Freeze a fresh gate set from the reserve and retire the current one (see the module docstring).

    The fresh set has ``data.gate_size`` queries (the current set's size when that is 0), the first in hash order
    of ``fresh`` (default: :func:`reserve`, read here).

    Raises:
        PgrankError: fewer new judged queries than that (the message says how many exist); nothing is changed.
    """
    size = params.data.gate_size or len(current.qrels)
    fresh = reserve(params, paths, current) if fresh is None else fresh
    if len(fresh) < size:
        raise PgrankError(f"champion.refresh_after: a fresh gate set needs data.gate_size={size} newly judged queries "
                          f"of {params.data.train} below the gate bound, and {len(fresh)} exist; judge more queries, "
                          "or lower data.gate_size")
    meta = _meta(current)
    record = {"retired": sorted(set(meta.get("retired", ())) | set(current.qrels)),
              "refreshed_from": gate.frozen_run(client, params)}
    if meta.get("carve"):
        record["carve"] = meta["carve"]  # the first carve-out's bounds stay: no query moves
    return gate.freeze_gate_set(client, params, paths, parent_run_id, only=fresh[:size], record=record)


def refreshed(client: MlflowClient, params: Params, paths: Paths, current: gate.GateSet, on_set: list[Record],
              parent_run_id: str | None) -> tuple[gate.GateSet, str | None]:
    """The gate set to decide on: a fresh one when a refresh is due and the reserve suffices, else ``current``;
    and a note for the run's log when a due refresh could not happen."""
    why = due(params, on_set)
    if why is None:
        return current, None
    size = params.data.gate_size or len(current.qrels)
    fresh = reserve(params, paths, current)
    available = len(fresh)
    if available < size:
        note = (f"the gate set is due for a refresh ({why}), but only {available} of the {size} newly judged "
                f"queries it needs exist; decision {len(on_set) + 1} is made on the same set")
        log.warning("%s", note)
        return current, note
    return refresh_gate_set(client, params, paths, current, parent_run_id, fresh), None
