"""The decision ledger on a real sqlite MLflow registry: the record is written before the alias moves, the alias
moves only if the champion is still the one compared with, a record number is never reused, and a kill between any
two steps, followed by a restart, leaves a record and an alias that agree, with one decision run per record. The
gate lease lives in the registry (``tests/pipeline/test_gate_server.py`` runs gates against a real tracking
server)."""

from __future__ import annotations

import itertools
import subprocess
import sys
import textwrap

import pytest
from mlflow_registry import fresh_store, register

from pgrank.config import ChampionConfig, parse_params
from pgrank.errors import PgrankError
from pgrank.paths import Paths
from pgrank.pipeline.champion import DECISION_TAG, champion, decide, log_decision, record_marker
from pgrank.pipeline.decisions import COUNTER, commit, decisions_on, gate_lock, records, recover, settle
from pgrank.pipeline.retraining import budget_after, budget_level, budget_words, challengers

mlflow = pytest.importorskip("mlflow")

ALIAS = "champion"
_names = itertools.count()


class Killed(BaseException):
    """The process dies here (a BaseException: no ``except Exception`` of the code under test sees it)."""


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    folder = tmp_path_factory.mktemp("mlflow")
    with fresh_store(folder) as (client, experiment, uri):
        params = parse_params({"paths": {"root": "r", "data": "d", "embeddings": "e"}, "data": {"train": "x/train",
                               "eval_sets": ["x/test"]}, "train": {"warm_starts": ["m"]},
                               "evaluate": {"systems": {"dense": ["m"]}}, "tracking": {"uri": uri, "experiment": "pgrank"}})
        paths = Paths.from_config(params.paths, base=folder)
        def log(decision, key=None):  # as the gate of the model being tested logs (its params name that model)
            tracking = params.tracking.model_copy(update={"registered_model": _current["model"]})
            return log_decision(params.model_copy(update={"tracking": tracking}), paths, decision, parent_run_id=None,
                                record=key)

        yield client, experiment, log


_current = {"model": "pgrank-retriever"}


def _model(client, experiment, count: int) -> tuple[str, list[str]]:
    name = _current["model"] = f"pgrank-ledger-{next(_names)}"
    return name, [register(experiment, name) for _ in range(count)]


def per_query(values):
    return {f"q{i}": {"ndcg@10": v} for i, v in enumerate(values)}


BASE = [0.2, 0.3, 0.4, 0.5, 0.6, 0.25, 0.35, 0.45]


def _decision(challenger: str, current: str | None, better: bool):
    if current is None:
        return decide(per_query(BASE), None, ChampionConfig(first="promote"), challenger=challenger, champion=None,
                      metrics=[], gate="frozen: 8 queries")
    gain = 0.1 if better else -0.05
    return decide(per_query([v + gain for v in BASE]), per_query(BASE), ChampionConfig(test="student"),
                  challenger=challenger, champion=current, metrics=[], gate="frozen: 8 queries")


def _killing(monkeypatch, client, log, after: int):
    """The client and log function of a process killed after ``after`` registry writes (the run counts as one)."""
    done = [0]

    def step(fn):
        def wrapped(*args, **kwargs):
            if done[0] == after:
                raise Killed
            result = fn(*args, **kwargs)
            done[0] += 1
            return result
        return wrapped

    for method in ("set_registered_model_tag", "set_registered_model_alias", "set_model_version_tag"):
        monkeypatch.setattr(client, method, step(getattr(client, method)))
    return step(log), done


def assert_agree(client, name: str) -> None:
    """The last record and the alias agree, every record has its run, the judged version carries the verdict."""
    found = records(client, name)
    last, now = found[-1], champion(client, name, ALIAS)
    expected = {"promote": last.challenger, "keep": last.champion}.get(last.outcome, now)
    assert now == expected and all(r.run_id for r in found)
    assert client.get_model_version(name, last.challenger).tags[DECISION_TAG].split(":")[0] in (
        "promoted", "kept", "not promoted", "stale")
    movers = [r.challenger for r in found if r.outcome == "promote"]
    assert now is None or now == movers[-1]  # the alias is where the last recorded promotion put it


@pytest.mark.parametrize("better,writes", [(True, 6), (False, 5)], ids=["promote", "keep"])
def test_a_kill_between_any_two_steps_and_a_restart_leave_record_and_alias_in_agreement(store, monkeypatch, better,
                                                                                      writes):
    client, experiment, log = store
    for after in range(writes + 1):  # 0: killed before the record; `writes`: not killed
        name, (v1, v2, v3) = _model(client, experiment, 3)
        settle(client, name, ALIAS, _decision(v1, None, True), log)  # v1 is the champion
        with monkeypatch.context() as patched:
            dying_log, done = _killing(patched, client, log, after)
            try:
                settle(client, name, ALIAS, _decision(v2, v1, better), dying_log)
            except Killed:
                pass
        assert done[0] == after
        recover(client, name, ALIAS, log)  # the restart: every run reconciles first
        assert_agree(client, name)
        expected = v2 if better and after >= 1 else v1  # once recorded, a promotion is applied
        assert champion(client, name, ALIAS) == expected
        assert len(records(client, name)) == (2 if after >= 1 else 1)
        marker = record_marker(name, records(client, name)[-1].key)
        runs = client.search_runs([experiment], filter_string=f"tags.`pgrank.gate.record` = '{marker}'")
        assert len(runs) == 1  # however the kill fell, one decision run per record
        # the next run compares with the champion as it is, and agrees as well
        current = champion(client, name, ALIAS)
        settle(client, name, ALIAS, _decision(v3, current, True), log)
        assert_agree(client, name)
        assert records(client, name)[-1].champion == current
        assert champion(client, name, ALIAS) == v3


def test_the_alias_moves_only_if_the_champion_is_still_the_one_compared_with(store):
    client, experiment, log = store
    name, (v1, v2, v3) = _model(client, experiment, 3)
    settle(client, name, ALIAS, _decision(v1, None, True), log)
    late = _decision(v3, v1, True)  # compared with v1 ...
    settle(client, name, ALIAS, _decision(v2, v1, True), log)  # ... but v2 was promoted meanwhile
    record = commit(client, name, ALIAS, late, gate_set="run-a")
    assert record.outcome == "stale" and champion(client, name, ALIAS) == v2
    assert not record.as_decision().promoted and "the alias moved from version 1 to version 2" in record.decision["reason"]
    assert client.get_model_version(name, v3).tags[DECISION_TAG].startswith("stale: ")
    recover(client, name, ALIAS, log)
    assert_agree(client, name)
    assert decisions_on(client, name, "run-a") == 1 and decisions_on(client, name, "") == 2


def test_an_alias_moved_outside_pgrank_is_an_error_that_changes_nothing(store):
    client, experiment, log = store
    name, (v1, v2, v3) = _model(client, experiment, 3)
    settle(client, name, ALIAS, _decision(v1, None, True), log)
    settle(client, name, ALIAS, _decision(v2, v1, True), log)
    client.set_registered_model_alias(name, ALIAS, v3)  # by hand
    before = dict(client.get_registered_model(name).tags)
    with pytest.raises(PgrankError, match=rf"registry {name}: alias 'champion' points at version {v3}, but the last "
                                          rf"decision \(pgrank.decision.000002\) promoted version {v2} over version {v1}"):
        recover(client, name, ALIAS, log)
    assert dict(client.get_registered_model(name).tags) == before and champion(client, name, ALIAS) == v3
    client.set_registered_model_alias(name, ALIAS, v1)  # back to the old champion after a finished commit: also an error
    with pytest.raises(PgrankError, match="the alias was moved outside pgrank"):
        recover(client, name, ALIAS, log)


def test_a_retried_gate_never_judges_a_version_that_was_decided_or_is_the_champion(store):
    client, experiment, log = store
    name, (v1, v2) = _model(client, experiment, 2)
    settle(client, name, ALIAS, _decision(v1, None, True), log)
    assert challengers(client, name, v1, [v1, v2]) == [v2]  # the champion never meets itself
    settle(client, name, ALIAS, _decision(v2, v1, False), log)
    assert challengers(client, name, v1, [v1, v2]) == []  # a retry of the same run judges nothing again


def test_one_gate_at_a_time(tmp_path):
    """Two processes take the gate lease of one registry (a sqlite store here) in turn, never both at once."""
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    mlflow.MlflowClient(uri).search_registered_models()  # the store's tables, made once before the two race
    script = textwrap.dedent(f"""
        import time
        from mlflow.tracking import MlflowClient
        from pgrank.pipeline.decisions import gate_lock
        with gate_lock(MlflowClient({uri!r}), "m", ttl=30, wait=60):
            print("start", time.time(), flush=True)
            time.sleep(1.0)
            print("end", time.time(), flush=True)
    """)
    procs = [subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for _ in range(2)]
    spans = []
    for proc in procs:
        out, err = proc.communicate(timeout=120)
        assert proc.returncode == 0, err
        times = dict(line.split() for line in out.splitlines())
        spans.append((float(times["start"]), float(times["end"])))
    (a0, a1), (b0, b1) = sorted(spans)
    assert a1 <= b0  # the second started after the first ended


def test_a_record_number_is_never_reused_even_after_its_record_is_deleted(store):
    client, experiment, log = store
    name, (v1, v2, v3) = _model(client, experiment, 3)
    settle(client, name, ALIAS, _decision(v1, None, True), log)
    second = settle(client, name, ALIAS, _decision(v2, v1, False), log)
    client.delete_registered_model_tag(name, second.key)  # a void decision deleted by hand
    third = settle(client, name, ALIAS, _decision(v3, v1, False), log)
    assert (second.number, third.number) == (2, 3) and client.get_registered_model(name).tags[COUNTER] == "4"


def test_a_process_that_dies_between_the_record_and_the_move_is_completed_by_the_next_run(store, tmp_path):
    """The same with a real process death (``os._exit``, no clean-up of any kind) after the record is written."""
    client, experiment, log = store
    name, (v1, v2) = _model(client, experiment, 2)
    settle(client, name, ALIAS, _decision(v1, None, True), log)
    script = textwrap.dedent(f"""
        import os
        from mlflow.tracking import MlflowClient
        from pgrank.config import ChampionConfig
        from pgrank.pipeline.champion import decide
        from pgrank.pipeline.decisions import commit, gate_lock

        client = MlflowClient({client.tracking_uri!r})
        client.set_registered_model_alias = lambda *args: os._exit(9)  # dies where the alias would move
        base = {BASE!r}
        decision = decide({{f"q{{i}}": {{"ndcg@10": v + 0.1}} for i, v in enumerate(base)}},
                          {{f"q{{i}}": {{"ndcg@10": v}} for i, v in enumerate(base)}}, ChampionConfig(test="student"),
                          challenger={v2!r}, champion={v1!r}, metrics=[])
        with gate_lock(client, {name!r}, ttl=8, wait=0) as lease:
            commit(client, {name!r}, {ALIAS!r}, decision, guard=lease.check)
    """)
    died = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert died.returncode == 9, died.stderr
    assert records(client, name)[-1].outcome == "promote" and champion(client, name, ALIAS) == v1  # recorded, not moved
    with gate_lock(client, name, ttl=30, wait=30):  # the dead holder's lease lapses within its ttl
        recover(client, name, ALIAS, log)
    assert_agree(client, name)
    assert champion(client, name, ALIAS) == v2


def _budgeted(uri: str, **champion) -> object:
    return parse_params({"paths": {"root": "r", "data": "d", "embeddings": "e"},
                         "data": {"train": "x/train", "eval_sets": ["x/test"]}, "train": {"warm_starts": ["m"]},
                         "evaluate": {"systems": {"dense": ["m"]}}, "tracking": {"uri": uri, "experiment": "pgrank"},
                         "champion": {"alpha": None, "budget": 0.05, "horizon": 3, **champion}})


def _gate_with_budget(client, name, params, challenger, current, better, log) -> tuple[float, object]:
    """One decision as the gate takes it: the level from the ledger, the rule at that level, the budget recorded."""
    level, before = budget_level(params, client, name)
    gain = 0.3 if better else -0.05
    decision = decide(per_query([v + gain for v in BASE * 4]), per_query(BASE * 4), params.champion,
                      challenger=challenger, champion=current, metrics=[], level=level,
                      budget=budget_words(before, level))
    return level, settle(client, name, ALIAS, decision, log, level=level,
                         budget=budget_after(params, before, level, decision.promoted))


@pytest.mark.parametrize("rule", ["spending", "fallback", "elond"])
def test_the_registry_keeps_the_error_budget_spent_and_left_and_every_decision_names_its_level(store, rule):
    client, experiment, log = store
    name, (v1, v2, v3, v4, v5) = _model(client, experiment, 5)
    settle(client, name, ALIAS, _decision(v1, None, True), log)  # the first champion: no test, nothing spent
    params = _budgeted(client.tracking_uri, budget_rule=rule)
    a = 0.05 / 3
    level, first = _gate_with_budget(client, name, params, v2, v1, True, log)
    assert level == pytest.approx(a) and first.outcome == "promote" and first.level == pytest.approx(a)
    assert first.budget["spent"] == pytest.approx(a) and first.budget["left"] == pytest.approx(0.05 - a + (a if rule != "spending" else 0))
    assert f"decision 1 of the error budget 0.05 over 3 decisions ({rule}), period 1" in first.decision["reason"]
    level, second = _gate_with_budget(client, name, params, v3, v2, False, log)
    # fallback: the promotion before hands its level on; elond: one promotion in the period, twice the share
    assert level == pytest.approx(a if rule == "spending" else 2 * a) and second.outcome == "keep"
    level, third = _gate_with_budget(client, name, params, v4, v2, False, log)
    assert level == pytest.approx(2 * a if rule == "elond" else a)  # e-LOND keeps it for the rest of the period
    assert third.budget["state"]["decisions"] == 3 and third.budget["period"] == 1
    level, fourth = _gate_with_budget(client, name, params, v5, v2, False, log)  # the horizon is over: a new period
    assert level == pytest.approx(a) and fourth.budget["period"] == 2 and fourth.budget["state"]["decisions"] == 1
    assert [r.level for r in records(client, name)][0] is None  # the untested first promotion spent nothing


def test_an_error_budget_cannot_change_before_its_horizon_ends_and_a_damaged_one_is_named(store):
    client, experiment, log = store
    name, (v1, v2, v3) = _model(client, experiment, 3)
    settle(client, name, ALIAS, _decision(v1, None, True), log)
    _gate_with_budget(client, name, _budgeted(client.tracking_uri), v2, v1, False, log)
    with pytest.raises(PgrankError, match=r"pre-registered as 0\.05 over 3 decisions \(spending\) and 1 of its "
                                          r"decisions are taken; champion\.\* now says 0\.1 over 3 decisions"):
        budget_level(_budgeted(client.tracking_uri, budget=0.1), client, name)
    last = records(client, name)[-1]
    commit(client, name, ALIAS, decide(per_query(BASE), per_query(BASE), ChampionConfig(test="student"), challenger=v3,
                                       champion=v1, metrics=[]), budget={"state": {"spent": -1}})
    with pytest.raises(PgrankError, match=rf"decision record {last.key[:-1]}\d's error budget is damaged"):
        budget_level(_budgeted(client.tracking_uri), client, name)
