"""Rows of the epoch-ablation table for weight-space mixtures with the warm start (WiSE-FT).

With ``train.selection.interpolation`` (for example ``[0.25, 0.5, 0.75, 1]``), training validates, after every
epoch, each mixture ``(1 - alpha) * warm start + alpha * epoch`` on the carved in-domain validation split and
on ``train.validation_sets``, and the selection rule picks ``(epoch, alpha)`` (:mod:`pgrank.training.selection`).
Only the chosen mixture becomes a checkpoint, so the others are reported with the figures the choice was made on:
one row per validation set and alpha, one column per epoch of the ablation, read from the run's ``history.json``.
Epoch 0 is the warm start, the same for every alpha.
"""

from __future__ import annotations

from pgrank.config import Params
from pgrank.core.history import alpha, in_domain_key, set_key
from pgrank.reporting.rendering import DASH, Cell, Row, eval_set_name


def mixture_rows(params: Params, histories: dict[str, list[dict]], columns: list[tuple[str, int]]) -> list[Row]:
    """Validation nDCG@10 per (validation set, alpha) for the ablation's ``(warm start, epoch)`` columns.

    ``histories`` maps each warm start to its PG-Rank run's ``history.json`` rows. No rows when the profile
    validates no mixture (``interpolation: [1]``).
    """
    cfg = params.train
    if cfg.selection.interpolation == [1.0]:
        return []
    dataset = params.data.train.split("/")[0]
    sets = [(f"{eval_set_name(dataset + '/validation')}", in_domain_key()),
            *((eval_set_name(name), set_key(name)) for name in cfg.validation_sets)]

    def value(warm: str, epoch: int, weight: float, key: str) -> float | None:
        for row in histories.get(warm, []):
            if row["epoch"] == epoch and (epoch == 0 or alpha(row) == weight) and key in row:
                return float(row[key])
        return None

    rows = []
    for weight in sorted({*cfg.selection.interpolation, 1.0}, reverse=True):
        for label, key in sets:
            shown = [value(w, e, weight, key) for w, e in columns]
            rows.append(Row(f"Validation: {label}, α = {weight:g}", tuple(
                Cell(DASH if v is None else f"{v:.{params.tables.decimals}f}", compared=False) for v in shown)))
    return rows
