"""The champion gate's keys: the test, the error budget, non-inferiority and the gate set's refresh.

A budget outside (0, 1), a budget beside a fixed ``alpha``, a margin below 0, of 1 or more, or beside a nonzero
``min_gain``, an unknown budget rule, e-LOND without the betting test's e-values, a rank test (its null is
symmetry, not a mean: with or without a margin) and a refresh after 0 decisions are errors naming the key; through
the CLI, one ``pgrank: error:`` line and no traceback.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from pgrank.config import ChampionConfig, load_params
from pgrank.errors import ConfigError

ROOT = Path(__file__).resolve().parents[2]
PARAMS = ROOT / "params.yaml"


def test_params_yaml_gates_under_a_yearly_elond_budget_with_the_betting_test_and_superiority():
    cfg = load_params(PARAMS).champion
    assert (cfg.alpha, cfg.budget, cfg.horizon, cfg.budget_rule) == (None, 0.05, 52, "elond")
    assert (cfg.test, cfg.margin, cfg.min_gain, cfg.refresh_after) == ("betting", None, 0.0, None)
    assert ChampionConfig().test == "betting"


def test_one_level_for_every_decision_is_the_alternative_to_a_budget():
    cfg = load_params(PARAMS, ["champion.budget=null", "champion.alpha=0.05"]).champion
    assert (cfg.alpha, cfg.budget) == (0.05, None)
    bare = ChampionConfig()
    assert (bare.alpha, bare.budget, bare.budget_rule) == (0.05, None, "spending")


def test_a_budget_with_alpha_null_a_margin_and_a_refresh_are_read():
    cfg = load_params(PARAMS, ["champion.alpha=null", "champion.budget=0.05", "champion.horizon=26",
                               "champion.budget_rule=fallback", "champion.margin=0.005", "champion.test=student",
                               "champion.refresh_after=12"]).champion
    assert (cfg.alpha, cfg.budget, cfg.horizon, cfg.budget_rule) == (None, 0.05, 26, "fallback")
    assert (cfg.margin, cfg.min_gain, cfg.refresh_after) == (0.005, 0.0, 12)


@pytest.mark.parametrize("overrides,key,expect", [
    (["champion.alpha=null", "champion.budget=0"], "champion.budget", "greater than 0"),
    (["champion.alpha=null", "champion.budget=1"], "champion.budget", "less than 1"),
    (["champion.alpha=0.05"], "champion.budget", "champion.alpha must be null"),
    (["champion.margin=-0.01"], "champion.margin", "greater than or equal to 0"),
    (["champion.min_gain=0.01", "champion.margin=0.01"], "champion.margin", "champion.min_gain must be 0"),
    (["champion.budget_rule=lord"], "champion.budget_rule", "'spending', 'fallback' or 'elond'"),
    (["champion.test=student"], "champion.budget_rule", "elond combines e-values"),
    (["champion.test=wilcoxon", "champion.budget_rule=fallback"], "champion.test", "not a mean gain of 0"),
    (["champion.test=fisher", "champion.budget_rule=spending", "champion.margin=0.01"], "champion.test",
     "nor a margin on it"),
    (["champion.margin=1.0"], "champion.margin", "below 1"),
    (["champion.refresh_after=0"], "champion.refresh_after", "greater than 0"),
    (["champion.horizon=0"], "champion.horizon", "greater than 0"),
])
def test_bad_champion_keys_name_the_key_and_what_was_expected(overrides, key, expect):
    with pytest.raises(ConfigError) as err:
        load_params(PARAMS, overrides)
    msg = str(err.value)
    assert f"{key}:" in msg and expect in msg, msg


def test_the_config_class_checks_the_same_on_its_own():
    with pytest.raises(ValueError, match="alpha must be null"):
        ChampionConfig(budget=0.05)
    assert ChampionConfig(alpha=None, budget=0.05).budget == 0.05


def test_the_cli_says_it_in_one_error_line():
    out = subprocess.run([sys.executable, str(ROOT / "cli.py"), "--set", "champion.budget=1.5", "plan"], cwd=ROOT,
                         capture_output=True, text=True, timeout=120)
    assert out.returncode != 0 and "Traceback" not in out.stderr
    errors = [line for line in out.stderr.splitlines() if line.startswith("pgrank: error:")]
    assert len(errors) == 1 and "champion.budget" in errors[0], out.stderr
