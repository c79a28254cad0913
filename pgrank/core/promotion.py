"""The champion gate's rule, and how often it promotes by chance (pure: numbers in, a verdict out).

Scheduled retraining moves the champion alias only when a challenger passes one gate
(:mod:`pgrank.pipeline.champion` applies these functions to a model registry):

* :func:`choose`: with several challengers, the one to send to the gate is the best on the *selection*
  split (its validation nDCG@10), never on the gate queries themselves. Only the chosen one is tested on
  the gate, so each gate decision is one test at level ``alpha`` however many challengers there were
  (a Holm correction over all of them is the alternative not taken: it would spend the gate's power on
  challengers the selection split already ruled out).
* :func:`judge`: the chosen challenger is promoted only if its mean over the gate queries beats the
  baseline's (the champion, or for the first run its warm start) by more than ``min_gain`` and a paired
  ``test`` gives ``p < alpha``. The test is two-sided and the gain must be positive, so under the null a
  symmetric difference promotes at rate about ``alpha / 2``.
* :func:`simulate_gates`: a Monte Carlo of that decision on per-query differences resampled from a real
  evaluation (SciFact's, in ``bench/gate_power.py``): the false-promotion rate under the null (true gain
  0) and the power under a true gain, through :func:`choose` and :func:`judge` themselves.

Example:
    >>> judge(np.array([0.7, 0.8, 0.9]), np.array([0.5, 0.6, 0.7]), min_gain=0.0, test="student", alpha=0.05)
    Verdict(promoted=True, gain=0.2, p_value=0.0, reason='promoted')
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

import numpy as np

from pgrank.core.significance import paired_p_value

Reason = Literal["promoted", "not_better", "not_significant"]


@dataclass(frozen=True)
class Verdict:
    """One gate decision on per-query values: promoted or not, the mean gain, its p-value and why."""

    promoted: bool
    gain: float
    p_value: float
    reason: Reason


def judge(challenger: np.ndarray, baseline: np.ndarray, *, min_gain: float, test: str, alpha: float | None) -> Verdict:
    """The gate's rule on two systems' values over the same gate queries (same order).

    Args:
        challenger, baseline: ``(Q,)`` per-query values of ``champion.metric``.
        min_gain: the mean gain must exceed it.
        test: the paired test (``student``, ``wilcoxon``, ``fisher``).
        alpha: the gain must also be significant, ``p < alpha`` (``None``: no significance required).
    """
    challenger, baseline = np.asarray(challenger, dtype=np.float64), np.asarray(baseline, dtype=np.float64)
    gain = float(challenger.mean() - baseline.mean()) if len(challenger) else 0.0
    p = paired_p_value(challenger, baseline, test)
    if not gain > min_gain:
        return Verdict(False, gain, p, "not_better")
    if alpha is not None and not p < alpha:
        return Verdict(False, gain, p, "not_significant")
    return Verdict(True, gain, p, "promoted")


def choose(selection_scores: Sequence[float]) -> int:
    """The index of the challenger to gate: the highest selection score; a tie goes to the later one (the newer version)."""
    scores = np.asarray(selection_scores, dtype=np.float64)
    if not len(scores):
        raise ValueError("no challenger to choose from")
    return len(scores) - 1 - int(np.argmax(scores[::-1]))


# --------------------------------------------------------------------------------------- Monte Carlo


@dataclass(frozen=True)
class Simulation:
    """How often simulated gates promoted: ``promotions`` of ``trials``, and the rate's Monte-Carlo standard error."""

    trials: int
    promotions: int

    @property
    def rate(self) -> float:
        return self.promotions / self.trials

    @property
    def error(self) -> float:
        """Binomial standard error of :attr:`rate`, ``sqrt(r (1 - r) / trials)``."""
        return math.sqrt(self.rate * (1 - self.rate) / self.trials)


def simulate_gates(differences: np.ndarray, baseline: np.ndarray, *, gate_size: int, delta: float = 0.0,
                   challengers: int = 1, selection_size: int = 100, choose_on: Literal["selection", "gate"] = "selection",
                   trials: int = 2000, min_gain: float = 0.0, test: str = "student", alpha: float | None = 0.05,
                   seed: int = 0) -> Simulation:
    """Simulate ``trials`` gate decisions and count the promotions.

    Each trial draws ``gate_size`` gate queries: the baseline's values resampled from ``baseline``, and for
    each of ``challengers`` challengers (independent of each other: the worst case for choosing on the
    gate) its per-query gain over the baseline resampled from ``differences`` centred at zero, plus the
    true gain ``delta``. The selection split is drawn the same way (``selection_size`` queries). The
    challenger :func:`choose` picks (on the selection split, as the gate does; ``choose_on="gate"``: on
    its gate mean, the rule this module replaces) meets the baseline in :func:`judge`.

    Args:
        differences: ``(N,)`` real per-query differences (challenger minus baseline) whose spread is simulated.
        baseline: ``(M,)`` real per-query values of the baseline.
        gate_size: gate queries per simulated gate.
        delta: the true mean gain of every challenger (0: the null hypothesis).
        challengers: how many challengers one run brings.
        selection_size: queries of the selection split.
        choose_on: where the challenger to gate is chosen.
        trials: simulated gates.
        min_gain, test, alpha: the rule (:func:`judge`).
        seed: of the random generator.

    Returns:
        The count of promotions (``rate`` and its ``error``).
    """
    rng = np.random.default_rng(seed)
    centred = np.asarray(differences, dtype=np.float64) - float(np.mean(differences))
    baseline = np.asarray(baseline, dtype=np.float64)
    promotions = 0
    for _ in range(trials):
        champion = baseline[rng.integers(len(baseline), size=gate_size)]  # (G,)
        gains = centred[rng.integers(len(centred), size=(challengers, gate_size))] + delta  # (C, G)
        if choose_on == "selection":
            scores = centred[rng.integers(len(centred), size=(challengers, selection_size))].mean(axis=1) + delta
        else:
            scores = gains.mean(axis=1)
        chosen = choose(scores)
        promotions += judge(champion + gains[chosen], champion, min_gain=min_gain, test=test, alpha=alpha).promoted
    return Simulation(trials, promotions)
