"""One writer and real kills, against a real ``mlflow server`` on 127.0.0.1 (its own store, a free port), the way a
team shares one registry.

* Two gates at once (``tests/pipeline/gate_process.py``, the product's lease, ledger and rule in processes of
  their own): exactly one decides; the other refuses with one ``pgrank: error:`` line naming the lease's owner and
  its expiry, or, told to wait, decides after it against the champion the first one left. Every record survives,
  numbered 1, 2, ... with none reused.
* A gate process SIGKILLed at a step of its decision (taking the lease, freezing the gate set: inside its run, at
  the model's tag naming it, after that tag; the record, the counter, the alias, the version tag, inside its MLflow
  run, after the run, the run's mark, the release), then a new gate: its lease waits for the dead one's to lapse, it
  reconciles and decides. Afterwards the alias agrees with the records, no record is
  lost, the error budget counts every tested decision once, and every record has exactly one decision run. The
  kill inside the run and after the record run by default; the other steps are ``slow``.

One server per module: starting it takes seconds.
"""

from __future__ import annotations

import re
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
from mlflow_registry import register

from pgrank.pipeline.champion import champion, record_marker
from pgrank.pipeline.decisions import GATE_SET_MODEL_TAG, records
from pgrank.pipeline.gate import GATE_SET_TAG

mlflow = pytest.importorskip("mlflow")

ROOT = Path(__file__).resolve().parents[2]
GATE = Path(__file__).with_name("gate_process.py")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    """``(client, experiment id, uri)`` of a fresh ``mlflow server`` of this module."""
    folder = tmp_path_factory.mktemp("mlflow-server")
    port = _free_port()
    proc = subprocess.Popen([sys.executable, "-m", "mlflow", "server", "--host", "127.0.0.1", "--port", str(port),
                             "--backend-store-uri", f"sqlite:///{folder / 'mlflow.db'}",
                             "--default-artifact-root", str(folder / "artifacts"), "--workers", "1"],
                            stdout=subprocess.DEVNULL, stderr=open(folder / "server.log", "w"))
    uri = f"http://127.0.0.1:{port}"
    try:
        import urllib.request

        deadline = time.monotonic() + 180
        while True:
            try:
                with urllib.request.urlopen(f"{uri}/health", timeout=5) as answer:
                    if answer.status == 200:
                        break
            except OSError:
                pass
            assert proc.poll() is None and time.monotonic() < deadline, (folder / "server.log").read_text()
            time.sleep(1)
        mlflow.set_tracking_uri(uri)
        client = mlflow.MlflowClient(uri)
        yield client, client.create_experiment("pgrank"), uri
    finally:
        mlflow.set_tracking_uri(None)
        proc.terminate()
        proc.wait(timeout=30)


def _gate(uri: str, model: str, challenger: str, *extra: str) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, str(GATE), uri, model, challenger, *extra], cwd=ROOT,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def _finish(proc: subprocess.Popen) -> tuple[int, str, str]:
    out, err = proc.communicate(timeout=300)
    return proc.returncode, out, err


def _runs_of(client, experiment: str, model: str, key: str) -> list:
    return client.search_runs([experiment], filter_string=f"tags.`pgrank.gate.record` = '{record_marker(model, key)}'")


def assert_ledger(client, experiment: str, model: str) -> list:
    """Records numbered 1..n, the alias where the last applied promotion put it, one finished run per record, and
    an error budget that counts each tested decision once."""
    found = records(client, model)
    assert [r.number for r in found] == list(range(1, len(found) + 1))
    movers = [r.challenger for r in found if r.outcome == "promote"]
    assert champion(client, model, "champion") == (movers[-1] if movers else None)
    for r in found:
        runs = _runs_of(client, experiment, model, r.key)
        assert len(runs) == 1 and runs[0].info.status == "FINISHED" and r.run_id == runs[0].info.run_id, r.key
    tested = [r.budget["state"]["decisions"] for r in found if r.budget]
    assert tested == list(range(1, len(tested) + 1))  # no budget spent twice, none skipped
    return found


def _holding(proc: subprocess.Popen) -> None:
    """Wait until a gate process holds the lease (it says so on stdout)."""
    for line in proc.stdout:
        if line.startswith("holding"):
            return
    raise AssertionError(proc.stderr.read())


def test_two_gates_at_once_one_decides_the_other_refuses_naming_the_owner_and_expiry(server, tmp_path):
    client, experiment, uri = server
    model = "gate-two"
    v1, v2, v3, v4, v5 = (register(experiment, model) for _ in range(5))
    assert _finish(_gate(uri, model, v1))[0] == 0  # the first champion
    go = tmp_path / "go"
    first = _gate(uri, model, v2, "--hold-until", str(go))
    _holding(first)
    code2, _, err2 = _finish(_gate(uri, model, v3))  # meanwhile a second gate: refused at once
    go.touch()
    code1, out1, err1 = _finish(first)
    assert code1 == 0 and "decided True" in out1, err1
    errors = [line for line in err2.splitlines() if line.startswith("pgrank: error:")]
    assert code2 == 2 and len(errors) == 1, err2
    assert re.search(r"held by \S+ pid \d+ \([0-9a-f]{16}\) until \d{4}-\d\d-\d\d \d\d:\d\d:\d\d UTC", errors[0])
    found = assert_ledger(client, experiment, model)
    assert [r.challenger for r in found] == [v1, v2] and champion(client, model, "champion") == v2
    # told to wait, the second decides after the first, against the champion the first left
    go = tmp_path / "go-again"
    first = _gate(uri, model, v4, "--hold-until", str(go), "--worse")
    _holding(first)
    second = _gate(uri, model, v5, "--wait", "300")
    for line in second.stderr:
        if "waiting up to 300 s" in line:
            break
    go.touch()
    assert _finish(first)[0] == 0 and _finish(second)[0] == 0
    found = assert_ledger(client, experiment, model)
    assert [r.challenger for r in found] == [v1, v2, v4, v5] and found[-1].champion == v2
    assert champion(client, model, "champion") == v5


KILLS = ["record", "alias", "run", "run logged"]


@pytest.mark.parametrize("step", [
    *(pytest.param(s, marks=pytest.mark.slow) for s in ("lease", "counter", "version tag", "mark", "release")),
    *(s if s in ("run", "alias") else pytest.param(s, marks=pytest.mark.slow) for s in KILLS)])
def test_a_gate_killed_at_a_step_is_reconciled_by_the_next_run(server, step):
    client, experiment, uri = server
    model = f"gate-kill-{step.replace(' ', '-')}"
    v1, v2, v3 = (register(experiment, model) for _ in range(3))
    assert _finish(_gate(uri, model, v1))[0] == 0
    killed = _gate(uri, model, v2, "--kill-at", step, "--ttl", "4")
    code, _, err = _finish(killed)
    assert code == -9, err  # SIGKILL: no clean-up of any kind
    after = records(client, model)
    recorded = step not in ("lease", "record")
    assert len(after) == (2 if recorded else 1)
    code, out, err = _finish(_gate(uri, model, v3, "--wait", "120"))  # waits for the dead lease to lapse
    assert code == 0 and "decided" in out, err
    found = assert_ledger(client, experiment, model)
    assert [r.challenger for r in found] == ([v1, v2, v3] if recorded else [v1, v3])
    if recorded:  # a recorded promotion is applied, then the next one compares with it
        assert found[1].outcome == "promote" and found[2].champion == v2
    assert champion(client, model, "champion") == v3


@pytest.fixture(scope="module")
def toy_workspace(tmp_path_factory):
    """A toy project with a gate split of 6 queries and their candidate sets (tests/toy_project.py)."""
    from toy_project import make_project

    folder = tmp_path_factory.mktemp("gate-freeze")
    make_project(folder, folder / "no-model", overrides={"data.gate_size": 6})
    return folder


@pytest.mark.parametrize("step", ["freeze", pytest.param("freeze tag", marks=pytest.mark.slow), "freeze adopted"])
def test_a_gate_killed_while_freezing_its_gate_set_leaves_one_set_that_every_decision_names(server, toy_workspace,
                                                                                             step):
    """Killed inside the gate-set run (before its artifacts, or before the model's tag names it), the next gate
    deletes that run and freezes again; killed after the tag, it finishes the run and decides on that set."""
    client, experiment, uri = server
    model = f"gate-freeze-{step.replace(' ', '-')}"
    v1, v2 = (register(experiment, model) for _ in range(2))
    freeze = ("--freeze", str(toy_workspace))
    code, _, err = _finish(_gate(uri, model, v1, *freeze, "--kill-at", step, "--ttl", "4"))
    assert code == -9, err
    assert records(client, model) == []
    named = client.get_registered_model(model).tags.get(GATE_SET_TAG)
    assert (named is not None) == (step == "freeze adopted")
    for version in (v1, v2):
        code, out, err = _finish(_gate(uri, model, version, *freeze, "--wait", "120"))
        assert code == 0 and "decided" in out, err
    found = assert_ledger(client, experiment, model)
    frozen = client.get_registered_model(model).tags[GATE_SET_TAG]
    assert named in (None, frozen)  # an adopted set stays the set
    runs = client.search_runs([experiment], filter_string=f"tags.`{GATE_SET_MODEL_TAG}` = '{model}'")
    assert [(r.info.run_id, r.info.status) for r in runs] == [(frozen, "FINISHED")]  # the unadopted one deleted
    assert [r.gate_set for r in found] == [frozen, frozen]
