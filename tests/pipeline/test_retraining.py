"""Scheduled retraining's rules without Prefect: the overrides a run adds, the choice among challengers, the gate's
answer when there is no registry. The gate on a real registry is tested in tests/pipeline/test_champion.py and,
through the Prefect flow, in tests/flows/test_server.py.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from pgrank.errors import PgrankError
from pgrank.pipeline.champion import best_challenger
from pgrank.pipeline.retraining import gate_workspace, retraining_overrides

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def untracked(tmp_path) -> Path:
    """The paper's params with tracking off (no model registry), in a folder of their own."""
    doc = yaml.safe_load((ROOT / "params.yaml").read_text())
    doc["tracking"]["enabled"] = False
    (tmp_path / "params.yaml").write_text(yaml.safe_dump(doc))
    return tmp_path


def test_without_a_registry_retraining_adds_nothing_and_cannot_start_from_the_champion(untracked):
    params_file = untracked / "params.yaml"
    found = retraining_overrides(params_file, None, [], "warm_start")
    assert (found.extra, found.notes) == ([], [])
    with pytest.raises(PgrankError, match="start_from='champion' needs the model registry"):
        retraining_overrides(params_file, None, [], "champion")
    with pytest.raises(PgrankError, match=r"start_from='newest': expected one of warm_start, champion"):
        retraining_overrides(params_file, None, [], "newest")


def test_a_first_gated_run_without_a_gate_split_stops_before_the_pipeline(tmp_path, monkeypatch):
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    doc = yaml.safe_load((ROOT / "params.yaml").read_text())
    doc["tracking"] |= {"enabled": True, "uri": f"sqlite:///{tmp_path / 'mlflow.db'}"}
    (tmp_path / "params.yaml").write_text(yaml.safe_dump(doc))
    with pytest.raises(PgrankError, match=r"no gate split to freeze in this first gated run: set data.gate_size"):
        retraining_overrides(tmp_path / "params.yaml", None, [], "warm_start")
    assert retraining_overrides(tmp_path / "params.yaml", None, ["data.gate_size=300"], "warm_start").extra == []


def test_without_a_registry_the_gate_keeps_everything_as_it_is(untracked):
    decision = gate_workspace(untracked, None)
    assert not decision.promoted and decision.challenger is None
    assert decision.reason == "tracking.enabled is false: there is no model registry to gate in"


def test_the_best_challenger_has_the_highest_selection_score_and_a_tie_goes_to_the_newer_version():
    scores = {"3": 0.5, "4": 0.45, "10": 0.15}  # validation nDCG@10 of each version
    assert best_challenger(scores) == "3"
    assert best_challenger({**scores, "10": 0.5}) == "10"  # versions compare as numbers
    assert best_challenger({"9": 0.2}) == "9"
