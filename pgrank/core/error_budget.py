"""A pre-registered error budget for a sequence of gate decisions (pure: a state in, a level out).

Scheduled retraining takes many decisions, most of them on one frozen gate set. ``champion.budget`` is the error
allowed over a *period* of ``champion.horizon`` decisions, for example 0.05 over 52 weekly decisions. A rule spends it
decision by decision: :func:`level` gives the significance level of the next decision from the state before it, and
:func:`spend` gives the state after it. The registry keeps the state (:meth:`BudgetState.to_json`), so every decision
names its level and the budget spent and left. Every decision counts, scheduled or started by hand: a manual run
takes the next decision's share, so extra runs end a period early. After ``horizon`` decisions a new period starts
with a fresh budget (:func:`pgrank.pipeline.retraining.budget_level`): each period's guarantee holds on its own, and
over ``k`` periods the bounds add up to ``k * budget`` (the union bound; the FDR of the promotions of ``k`` periods
together is at most the sum of the periods' FDRs).

Every rule holds under *arbitrary* dependence between the decisions, which is what a frozen gate set (every
decision on the same queries) and continual training (every challenger grown from the champion) produce. Each
needs only that a decision's test is valid on its own: a p-value with ``P(p <= a) <= a`` under its null, or for
``elond`` an e-value with ``E[e] <= 1`` (the betting test, :mod:`pgrank.core.betting`, gives both).

* ``spending``: alpha spending with a fixed sequence, ``budget / horizon`` per decision for ``horizon`` decisions,
  then 0. A false promotion at decision ``i`` needs ``p_i < alpha_i``, so by the union bound
  ``P(any false promotion in the period) <= sum_i alpha_i = budget`` (the familywise error rate, FWER; a weighted
  Bonferroni test, Tian & Ramdas 2021, Sec. 3).
* ``fallback``: the online fallback procedure (Tian & Ramdas 2021, Sec. 4; Wiens & Dmitrienko 2005): the same
  fresh allocation ``budget / horizon`` per decision, plus the whole level of the previous decision when that one
  promoted, ``alpha_i = gamma_i * budget + R_{i-1} * alpha_{i-1}``. The same FWER bound; never less powerful.
* ``elond``: e-LOND (Xu & Ramdas 2024), online control of the false discovery rate with e-values: decision ``i``
  promotes when ``e_i >= 1 / alpha_i`` with ``alpha_i = budget * gamma_i * (R_{i-1} + 1)``, ``gamma_i = 1 / horizon``
  and ``R_{i-1}`` the promotions of the period before it. Then ``FDR = E[false promotions / max(promotions, 1)] <=
  budget * sum_i gamma_i = budget`` over the period, under arbitrary dependence (each false promotion ``i`` adds at
  most ``1{e_i >= 1/alpha_i} / (R_{i-1} + 1) <= budget * gamma_i * e_i`` to the ratio). Before the first promotion
  its levels equal ``spending``'s, and when no challenger of the period is better the FDR *is* the chance of any
  false promotion, so a period of no-better challengers is promoted falsely with probability at most ``budget``,
  as under the FWER rules; every true promotion raises the next levels (two promotions: three times the share),
  so a gate that keeps finding real gains keeps its power. What it does not bound is the chance that one of many
  promotions in a good period is false (at most ``budget`` of them in expectation).

LORD++ is not offered: its FDR guarantee needs independent p-values, which a frozen gate set does not give.

References:
    Tian, J. and Ramdas, A. (2021). Online control of the familywise error rate. Statistical Methods in Medical
    Research 30(4), 976-993.
    Wiens, B. L. and Dmitrienko, A. (2005). The fallback procedure for evaluating a single family of hypotheses.
    Journal of Biopharmaceutical Statistics 15(6), 929-942.
    Xu, Z. and Ramdas, A. (2024). Online multiple testing with e-values. AISTATS, PMLR 238, 3997-4005.

Example:
    >>> state = BudgetState()
    >>> a = level("spending", 0.05, 52, state)              # 0.05 / 52 = 0.000962
    >>> state = spend(state, a, promoted=False)
    >>> round(left("spending", 0.05, 52, state), 6)         # 0.05 - 0.000962
    0.049038
    >>> round(level("elond", 0.05, 52, spend(state, a, promoted=True)), 6)   # after a promotion: twice the share
    0.001923
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass


@dataclass(frozen=True)
class BudgetState:
    """A budget's state between decisions: the level spent, the decisions taken, and which of them promoted."""

    spent: float = 0.0  # level spent so far (sum of the levels of past decisions under the rule)
    decisions: int = 0  # decisions taken so far under this budget
    rejections: tuple[int, ...] = ()  # 1-based indices of the decisions that promoted

    def to_json(self) -> dict:
        return {"spent": self.spent, "decisions": self.decisions, "rejections": list(self.rejections)}

    @classmethod
    def from_json(cls, raw: dict) -> BudgetState:
        """The state :meth:`to_json` wrote; a missing key takes its start value. Raises ``ValueError`` on a bad one."""
        state = cls(spent=float(raw.get("spent", 0.0)), decisions=int(raw.get("decisions", 0)),
                    rejections=tuple(int(i) for i in raw.get("rejections", ())))
        if state.spent < 0 or state.decisions < 0 or any(not 1 <= i <= state.decisions for i in state.rejections):
            raise ValueError(f"not a budget state: {raw!r} (spent >= 0, decisions >= 0, rejections within 1..decisions)")
        return state


def allocation(budget: float, horizon: int, decision: int) -> float:
    """The fresh level of decision ``decision`` (1-based) in the fixed sequence: ``budget / horizon`` within the
    horizon, 0 after it (the sequence sums to ``budget``)."""
    return budget / horizon if 1 <= decision <= horizon else 0.0


def _spending(budget: float, horizon: int, state: BudgetState) -> float:
    return allocation(budget, horizon, state.decisions + 1)


def _fallback(budget: float, horizon: int, state: BudgetState) -> float:
    # alpha_i = gamma_i * budget + R_{i-1} alpha_{i-1}: the fresh allocations of decision i and of the run of
    # consecutive promotions just before it, each of which passed its whole level on.
    promoted, i = set(state.rejections), state.decisions + 1
    total = allocation(budget, horizon, i)
    while i - 1 in promoted:
        i -= 1
        total += allocation(budget, horizon, i)
    return total


def _elond(budget: float, horizon: int, state: BudgetState) -> float:
    # alpha_i = budget * gamma_i * (R_{i-1} + 1): the fresh share, once more for every promotion of the period so far.
    return allocation(budget, horizon, state.decisions + 1) * (len(state.rejections) + 1)


RULES: dict[str, Callable[[float, int, BudgetState], float]] = {"spending": _spending, "fallback": _fallback,
                                                                 "elond": _elond}
E_VALUE_RULES = ("elond",)  # rules that need an e-value (the betting test), not only a p-value


def level(rule: str, budget: float, horizon: int, state: BudgetState) -> float:
    """The significance level of the next decision (0.0 when the budget is exhausted).

    Args:
        rule: a name in :data:`RULES` (``champion.budget_rule``).
        budget: the error allowed over the period, in (0, 1) (``champion.budget``): the chance of any false
            promotion (``spending``, ``fallback``) or the false discovery rate (``elond``).
        horizon: the decisions the budget covers (``champion.horizon``).
        state: the state before this decision.
    """
    if rule not in RULES:
        raise ValueError(f"unknown budget rule {rule!r}: expected one of {sorted(RULES)}")
    if not 0 < budget < 1 or horizon < 1:
        raise ValueError(f"expected 0 < budget < 1 and horizon >= 1, got budget {budget!r}, horizon {horizon!r}")
    return RULES[rule](budget, horizon, state)


def spend(state: BudgetState, level: float, promoted: bool) -> BudgetState:
    """The state after a decision taken at ``level`` (which :func:`level` gave), promoted or not. Pure: ``state``
    is not changed."""
    n = state.decisions + 1
    return BudgetState(spent=state.spent + level, decisions=n, rejections=state.rejections + ((n,) if promoted else ()))


def left(rule: str, budget: float, horizon: int, state: BudgetState) -> float:
    """The budget still available to future decisions: the fixed sequence's allocations not yet reached, plus
    the level a promotion adds to the next decision (``fallback``, ``elond``). With ``spending`` it is
    ``budget - spent``."""
    reached = sum(allocation(budget, horizon, i) for i in range(1, min(state.decisions, horizon) + 1))
    carried = level(rule, budget, horizon, state) - allocation(budget, horizon, state.decisions + 1)
    return max(budget - reached, 0.0) + carried


def schedule(rule: str, budget: float, horizon: int, promoted: list[bool]) -> list[float]:
    """The levels of a sequence of decisions with the given outcomes (a convenience for tables and simulations)."""
    state, levels = BudgetState(), []
    for outcome in promoted:
        levels.append(level(rule, budget, horizon, state))
        state = spend(state, levels[-1], outcome)
    return levels
