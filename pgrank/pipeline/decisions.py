"""The decision ledger: every gate decision recorded in the registry before the alias moves, one writer at a time.

A decision is committed in four steps (:func:`commit`, then the caller's MLflow run and :func:`mark_logged`):

1. **record**: the registered-model tag ``pgrank.decision.NNNNNN`` (one JSON value, written in one call) holds the
   decision: the challenger, the champion it was compared with, the figures, the gate set, the error-budget
   level spent and the budget left. The record is the commit point. Its number is never reused: it is one more than
   both the last record and the counter ``pgrank.decision.next`` (which only grows, so a record deleted by hand
   frees no number), and an existing record is never overwritten.
2. **move**: only for a promotion, and only if the alias still points at the champion the challenger was compared
   with (compare-and-set under the gate lease); otherwise the record is rewritten as ``stale`` and nothing moves.
3. **tag**: the challenger's version gets the ``pgrank.gate`` tag with the verdict.
4. **log**: the ``champion-gate`` MLflow run, tagged with its record's key from its first write; its id goes to
   ``pgrank.decision.NNNNNN.run``.

A kill between any two steps leaves a record and an alias that agree once :func:`reconcile` has run, which every
gate does first: a promotion recorded but not applied (its run not logged yet: the commit stopped) is applied, its
compare-and-set still holding under the lease; a missing tag is set, and a missing run is logged from the record,
unless a finished run of that record exists already (a kill after the run and before step 4's tag): then that run
is the one, and an unfinished one is deleted first, so no decision run is ever logged twice. An alias that matches
neither side of the last record was moved outside pgrank: that is a :class:`~pgrank.errors.PgrankError` naming the
alias and the record, and nothing changes. ``tests/pipeline/test_gate_server.py`` kills a gate process with SIGKILL
at every step on a real tracking server.

MLflow has no compare-and-set of an alias, so the single writer is what makes the read-compare-move atomic:
:func:`gate_lock`, a lease held in the registry itself (:mod:`pgrank.pipeline.lease`: an owner, an expiry, a
heartbeat), checked before every write (``guard``), whatever the store: a tracking server, sqlite or a database; and
the ``pgrank-gate`` Prefect concurrency limit of one slot (``flows/retraining.py``).

Decisions per gate set are counted from the records (:func:`decisions_on`), which is what ``champion.refresh_after``
reads.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from dataclasses import dataclass, fields
from typing import TYPE_CHECKING, Literal

from pgrank.errors import PgrankError
from pgrank.pipeline.champion import DECISION_TAG, Decision, Row, champion
from pgrank.pipeline.lease import Lease

if TYPE_CHECKING:
    from mlflow.tracking import MlflowClient

RECORD_PREFIX = "pgrank.decision."  # registered-model tags pgrank.decision.000001, ... (and .run once logged)
_RECORD_KEY = re.compile(r"^pgrank\.decision\.(\d{6})$")
COUNTER = "pgrank.decision.next"  # the next record number: it only grows, so no number is ever used twice
Guard = Callable[[], None]  # raises unless this gate may still write (Lease.check)
Outcome = Literal["promote", "keep", "stale"]


@dataclass(frozen=True)
class Record:
    """One committed decision, as the registry holds it."""

    number: int
    outcome: Outcome  # promote: the alias moves to the challenger; keep: it stays; stale: the champion changed first
    decision: dict  # Decision.as_dict(): challenger, champion compared with, rows (figures), gate set, reason
    gate_set: str = ""  # the gate set's id (the frozen set's MLflow run, or dataset/split)
    level: float | None = None  # the error-budget level this test spent (None: no budget)
    budget: dict | None = None  # the budget after it: {"spent": ..., "left": ..., "state": ...}
    run_id: str | None = None  # the champion-gate MLflow run, once logged

    @property
    def key(self) -> str:
        return f"{RECORD_PREFIX}{self.number:06d}"

    @property
    def challenger(self) -> str | None:
        return self.decision.get("challenger")

    @property
    def champion(self) -> str | None:
        return self.decision.get("champion")

    def to_json(self) -> str:
        raw = {f.name: getattr(self, f.name) for f in fields(self) if f.name not in ("number", "run_id")}
        return json.dumps(raw, sort_keys=True)

    def as_decision(self) -> Decision:
        """The recorded decision (for a run logged after a kill)."""
        known = {f.name for f in fields(Decision)}
        raw = {k: v for k, v in self.decision.items() if k in known}
        return Decision(**{**raw, "rows": [Row(**r) for r in raw.get("rows", [])]})


def _tags(client: MlflowClient, name: str) -> dict[str, str]:
    from mlflow.exceptions import MlflowException

    try:
        return dict(client.get_registered_model(name).tags)
    except MlflowException as exc:
        if exc.error_code == "RESOURCE_DOES_NOT_EXIST":
            return {}
        raise


def records(client: MlflowClient, name: str) -> list[Record]:
    """Every decision recorded for registered model ``name``, oldest first."""
    tags = _tags(client, name)
    found = []
    for key, value in tags.items():
        match = _RECORD_KEY.match(key)
        if match:
            raw = json.loads(value)
            found.append(Record(int(match.group(1)), raw["outcome"], raw["decision"], raw.get("gate_set", ""),
                                raw.get("level"), raw.get("budget"), tags.get(f"{key}.run")))
    return sorted(found, key=lambda r: r.number)


def decisions_on(client: MlflowClient, name: str, gate_set: str) -> int:
    """How many recorded decisions were made on gate set ``gate_set``."""
    return sum(r.gate_set == gate_set for r in records(client, name))


def gate_lock(client: MlflowClient, name: str, *, ttl: float = 600.0, wait: float = 0.0) -> Lease:
    """The single-writer lease of the gate of registered model ``name``, held in the registry itself (a context
    manager; :mod:`pgrank.pipeline.lease`): ``ttl`` seconds without a renewal before it lapses, ``wait`` seconds to
    wait for another gate's before refusing with one line that names it and its expiry."""
    return Lease(client, name, ttl=ttl, wait=wait)


def _none() -> None:
    return None


def _verdict(decision: Decision, outcome: Outcome) -> str:
    if outcome == "stale":
        return "stale: " + decision.reason.removeprefix("not applied: ")
    return ("promoted: " if decision.promoted else "kept: " if decision.champion else "not promoted: ") + decision.reason


def _agrees(record: Record, alias_at: str | None) -> bool:
    if record.outcome == "promote":
        return alias_at == record.challenger
    if record.outcome == "keep":
        return alias_at == record.champion
    return alias_at != record.challenger  # stale: the move did not happen


def next_number(client: MlflowClient, name: str) -> int:
    """The number of the next record: one more than the last record and at least the counter (never reused)."""
    tags = _tags(client, name)
    numbers = [int(m.group(1)) for m in map(_RECORD_KEY.match, tags) if m]
    return max(max(numbers, default=0) + 1, int(tags.get(COUNTER, "1")))


def commit(client: MlflowClient, name: str, alias: str, decision: Decision, *, gate_set: str = "",
           level: float | None = None, budget: dict | None = None, guard: Guard = _none) -> Record:
    """Record a decision, then move the alias if it promotes and the champion is still the one compared with,
    then tag the challenger's version (steps 1 to 3 of the module docstring). Call under :func:`gate_lock`
    (``guard``: its check, run before every write), after :func:`reconcile`.

    Returns:
        The record as committed (``stale`` when the alias had moved since the comparison).

    Raises:
        PgrankError: the record's number is taken (another writer: nothing is overwritten).
    """
    number = next_number(client, name)
    record = Record(number, "promote" if decision.promoted else "keep", decision.as_dict(), gate_set, level, budget)
    guard()
    if record.key in _tags(client, name):
        raise PgrankError(f"registry {name}: decision record {record.key} exists already; another gate wrote it "
                          "without the gate lease. Nothing was overwritten; run the gate again")
    client.set_registered_model_tag(name, record.key, record.to_json())
    client.set_registered_model_tag(name, COUNTER, str(number + 1))
    if decision.promoted:
        guard()
        now = champion(client, name, alias)
        if now != decision.champion:  # compare-and-set: someone moved the alias since the comparison
            said = (f"not applied: the alias moved from version {decision.champion} to version {now} after the "
                    f"comparison ({decision.reason})")
            record = Record(number, "stale", {**record.decision, "promoted": False, "reason": said}, gate_set, level,
                            budget)
            client.set_registered_model_tag(name, record.key, record.to_json())
        else:
            client.set_registered_model_alias(name, alias, decision.challenger)
    guard()
    client.set_model_version_tag(name, decision.challenger, DECISION_TAG,
                                 _verdict(record.as_decision(), record.outcome)[:4900])
    return record


def mark_logged(client: MlflowClient, name: str, record: Record, run_id: str | None) -> None:
    """Step 4 done: the decision's MLflow run is logged (``run_id`` ``None``: tracking logs no run; recorded as ``-``)."""
    client.set_registered_model_tag(name, f"{record.key}.run", run_id or "-")


def reconcile(client: MlflowClient, name: str, alias: str, guard: Guard = _none) -> list[Record]:
    """Make the alias and the version tag agree with the last record (see the module docstring).

    Returns:
        The records whose MLflow run is still to be logged (the caller logs them, then :func:`mark_logged`).

    Raises:
        PgrankError: the alias agrees with neither side of the last record (moved outside pgrank); nothing
            is changed.
    """
    found = records(client, name)
    if not found:
        return []
    last = found[-1]
    now = champion(client, name, alias)
    if not _agrees(last, now):
        if last.outcome == "promote" and now == last.champion and last.run_id is None:
            guard()
            client.set_registered_model_alias(name, alias, last.challenger)  # recorded, not yet moved: the CAS holds
        else:
            said = {"promote": f"promoted version {last.challenger} over version {last.champion}",
                    "keep": f"kept version {last.champion}", "stale": f"did not move it to version {last.challenger}"}
            raise PgrankError(
                f"registry {name}: alias {alias!r} points at version {now}, but the last decision ({last.key}) "
                f"{said[last.outcome]}; the alias was moved outside pgrank. Point it where it should be "
                f"(MlflowClient().set_registered_model_alias({name!r}, {alias!r}, VERSION)) and record why, or "
                f"delete the tag {last.key} if that decision is void")
    if last.challenger is not None:
        decision = last.as_decision()
        verdict = _verdict(decision, last.outcome)[:4900]
        if client.get_model_version(name, last.challenger).tags.get(DECISION_TAG) != verdict:
            guard()
            client.set_model_version_tag(name, last.challenger, DECISION_TAG, verdict)
    return [r for r in found if r.run_id is None]


# Logs a decision's MLflow run tagged with its record's key (or finds the finished run of that record), returns its
# id (None: tracking logs none).
Log = Callable[[Decision, "str | None"], "str | None"]


def settle(client: MlflowClient, name: str, alias: str, decision: Decision, log: Log, *, gate_set: str = "",
           level: float | None = None, budget: dict | None = None, guard: Guard = _none) -> Record:
    """All four steps of a decision: :func:`commit`, ``log`` (the MLflow run) and :func:`mark_logged`."""
    record = commit(client, name, alias, decision, gate_set=gate_set, level=level, budget=budget, guard=guard)
    run_id = log(record.as_decision(), record.key)
    guard()
    mark_logged(client, name, record, run_id)
    return record


def recover(client: MlflowClient, name: str, alias: str, log: Log, guard: Guard = _none) -> list[Record]:
    """:func:`reconcile`, then the runs a kill left unlogged; returns the records it completed."""
    pending = reconcile(client, name, alias, guard)
    for record in pending:
        run_id = log(record.as_decision(), record.key)
        guard()
        mark_logged(client, name, record, run_id)
    return pending


GATE_SET_MODEL_TAG = "pgrank.gate_set.model"  # on a gate-set run: the registered model it was frozen for


def settle_gate_set_runs(client: MlflowClient, experiment: str, name: str, adopted: str | None) -> None:
    """What a gate killed while freezing its gate set left (called under the gate's lease): a ``gate-set`` run of
    registered model ``name`` that never finished is deleted if the model never adopted it (killed before its tag
    named it), else finished (``adopted``: killed between the tag and the run's end, after its artifacts). Every
    finished gate-set run was adopted once, so records that name it keep it."""
    found = client.get_experiment_by_name(experiment)
    if found is None:
        return
    for run in client.search_runs([found.experiment_id], filter_string=(
            f"tags.stage = 'gate-set' and tags.`{GATE_SET_MODEL_TAG}` = '{name}' and attributes.status != 'FINISHED'")):
        if run.info.run_id == adopted:
            client.set_terminated(run.info.run_id, "FINISHED")
        else:
            client.delete_run(run.info.run_id)
