"""The error budget over a horizon of gate decisions (pure functions, milliseconds).

* ``spending`` gives every decision ``budget / horizon`` and nothing after the horizon; ``fallback`` gives the same
  until a decision promotes, then hands that decision's whole level on to the next.
* The chance of any false promotion stays at most the budget under the worst dependence there is: p-values whose
  rejection regions never overlap, where the union bound is exact. A fixed level per decision (no budget) spends
  ``horizon`` times as much.
* The state round-trips through the registry's JSON; a bad state, rule or budget is an error.
"""

from __future__ import annotations

import numpy as np
import pytest

from pgrank.core.error_budget import RULES, BudgetState, allocation, left, level, schedule, spend

BUDGET, HORIZON = 0.05, 52


def test_spending_gives_every_decision_an_equal_share_summing_to_the_budget():
    levels = schedule("spending", BUDGET, HORIZON, [False] * 60)
    assert levels[:HORIZON] == [pytest.approx(BUDGET / HORIZON)] * HORIZON
    assert sum(levels) == pytest.approx(BUDGET) and levels[HORIZON:] == [0.0] * 8  # spent: no promotion after it
    promoted = schedule("spending", BUDGET, HORIZON, [True, False, True] + [False] * 49)
    assert promoted == pytest.approx(levels[:HORIZON])  # a promotion does not give its level back


def test_fallback_hands_a_promotions_level_to_the_next_decision():
    g = BUDGET / HORIZON
    assert schedule("fallback", BUDGET, HORIZON, [False] * HORIZON) == pytest.approx(
        schedule("spending", BUDGET, HORIZON, [False] * HORIZON))
    levels = schedule("fallback", BUDGET, HORIZON, [False, True, True, False, False])
    assert levels == pytest.approx([g, g, 2 * g, 3 * g, g])
    last = BudgetState(spent=HORIZON * g, decisions=HORIZON, rejections=(HORIZON,))
    assert level("fallback", BUDGET, HORIZON, last) == pytest.approx(g)  # beyond the horizon only the handed-on level
    assert level("spending", BUDGET, HORIZON, last) == 0.0


@pytest.mark.parametrize("rule", sorted(RULES))
def test_the_chance_of_any_false_promotion_is_at_most_the_budget_under_the_worst_dependence(rule):
    """p_i = (U + i / horizon) mod 1 for one uniform U: every p_i is uniform (the null), and the regions
    p_i < budget / horizon never overlap, so P(any p_i < a_i) is the sum of the levels: the union bound holds with
    equality."""
    u = (np.arange(200_000) + 0.5) / 200_000  # U on a fine grid: the integral up to 1e-5
    false = np.zeros_like(u, dtype=bool)
    # Under the null every promotion is false: a year counts from its first one, and until then no decision
    # promoted, so the levels are those of a year without promotions.
    for i, a in enumerate(schedule(rule, BUDGET, HORIZON, [False] * HORIZON)):
        false |= (u + i / HORIZON) % 1.0 < a
    assert false.mean() == pytest.approx(BUDGET, abs=1e-5)
    every = np.zeros_like(u, dtype=bool)
    for i in range(HORIZON):
        every |= (u + i / HORIZON) % 1.0 < BUDGET  # the same p-values, each decision at 0.05: no budget
    assert every.mean() == 1.0  # some decision promotes, whatever U is


def test_the_state_is_spent_without_touching_the_old_one_and_round_trips_through_json():
    start = BudgetState()
    after = spend(spend(start, 0.001, promoted=False), 0.002, promoted=True)
    assert start == BudgetState() and after == BudgetState(spent=0.003, decisions=2, rejections=(2,))
    assert BudgetState.from_json(after.to_json()) == after
    assert BudgetState.from_json({}) == BudgetState()
    for bad in ({"spent": -1}, {"decisions": 1, "rejections": [2]}, {"decisions": "many"}):
        with pytest.raises(ValueError):
            BudgetState.from_json(bad)


def test_what_is_left_is_the_budget_minus_what_was_spent_plus_a_handed_on_level():
    g = BUDGET / HORIZON
    state = spend(spend(BudgetState(), g, False), g, True)
    assert left("spending", BUDGET, HORIZON, state) == pytest.approx(BUDGET - state.spent)
    assert left("fallback", BUDGET, HORIZON, state) == pytest.approx(BUDGET - 2 * g + g)
    assert allocation(BUDGET, HORIZON, 0) == allocation(BUDGET, HORIZON, HORIZON + 1) == 0.0


def test_an_unknown_rule_or_a_budget_outside_0_1_is_an_error():
    with pytest.raises(ValueError, match="unknown budget rule 'lord'"):
        level("lord", BUDGET, HORIZON, BudgetState())
    for budget, horizon in ((0.0, 52), (1.0, 52), (0.05, 0)):
        with pytest.raises(ValueError, match="budget"):
            level("spending", budget, horizon, BudgetState())
