"""The objective comparison: Neural PG-Rank against standard losses on the same candidates and budget.

Written by ``pgrank tables`` as ``objectives.md`` / ``.tex`` when ``train.objectives`` lists more than
one loss (the ``compare`` profile). Per warm start, one row for the warm start itself and one per
objective; per evaluation set and stage, one column of nDCG@10 with two paired p-values
(``evaluate.significance.test`` over the same queries): against PG-Rank (``pgrank-<warm>``) and against
the warm start; then the training wall time per epoch.

Inputs: the ``per_query.json`` and ``metrics.json`` files of ``pgrank evaluate`` (DVC-tracked) and
``Paths.timings`` (the wall time ``pgrank train`` measured around each epoch's updates, validation
excluded). The timings are measurements, not results: they sit outside every DVC-tracked folder, so a
rerun that reproduces the same models leaves the pipeline's outputs (this table's scores included)
byte-identical, and only the time column can differ.
"""

from __future__ import annotations

import json
from pathlib import Path

from pgrank.config import EVAL_STAGES, Params
from pgrank.core.significance import paired_test
from pgrank.errors import PgrankError
from pgrank.paths import Paths, policy_name
from pgrank.reporting.rendering import DASH, Cell, Column, Row, Table, eval_set_name, system_name

METRIC = "ndcg@10"
STAGE_NAMES = {"rerank": "rerank", "full": "first stage"}


def read_per_query(path: Path, metric: str = METRIC) -> dict[str, float] | None:
    """One metric of a ``per_query.json`` (query id -> value), or None when absent."""
    if not path.is_file():
        return None
    try:
        doc = json.loads(path.read_text(encoding="utf-8"))
        return {q: float(v[metric]) for q, v in doc.items()}
    except (ValueError, TypeError, KeyError, AttributeError) as exc:
        raise PgrankError(f"{path}: expected {{query id: {{{metric!r}: number, ...}}}} ({exc!r})") from None


def epoch_seconds(path: Path) -> float | None:
    """The mean wall time of an epoch's updates in a ``Paths.timings`` file (None when absent or unreadable:
    a measurement, never a reason to fail the tables)."""
    try:
        seconds = list(json.loads(path.read_text(encoding="utf-8"))["epoch_seconds"].values())
        return sum(map(float, seconds)) / len(seconds) if seconds else None
    except (OSError, ValueError, TypeError, KeyError, AttributeError, ZeroDivisionError):
        return None


def _p(value: float | None) -> str:
    if value is None:
        return DASH
    return "<0.001" if value < 0.001 else f"{value:.3f}"


def comparison_table(params: Params, paths: Paths) -> Table:
    """Rows: each warm start, then its policies by objective; columns: eval set x stage, then s/epoch."""
    decimals, test = params.tables.decimals, params.evaluate.significance.test
    columns = [(eval_set, stage) for eval_set in params.data.eval_sets for stage in params.evaluate.stages
               if stage in EVAL_STAGES]

    def values(system: str, eval_set: str, stage: str) -> dict[str, float] | None:
        dataset, split = eval_set.split("/")
        return read_per_query(paths.results(system, dataset, split, stage) / "per_query.json")

    rows = []
    for warm in params.train.warm_starts:
        pg = policy_name(warm)
        for system, objective in [(warm, None), *((policy_name(warm, o), o) for o in params.train.objectives)]:
            cells = []
            for eval_set, stage in columns:
                ours = values(system, eval_set, stage)
                if ours is None:
                    cells.append(Cell(DASH, compared=False))
                    continue
                text = f"{sum(ours.values()) / len(ours):.{decimals}f}"
                if objective is not None:
                    against_pg = values(pg, eval_set, stage) if system != pg else None
                    against_warm = values(warm, eval_set, stage)
                    text += (f" ({_p(paired_test(ours, against_pg, test) if against_pg else None)} / "
                             f"{_p(paired_test(ours, against_warm, test) if against_warm else None)})")
                cells.append(Cell(text, compared=False))
            rate = params.train.learning_rate_for(objective) if objective else None
            cells.append(Cell(DASH if rate is None else f"{rate:g}", compared=False))
            seconds = epoch_seconds(paths.timings(warm, objective)) if objective else None
            cells.append(Cell(DASH if seconds is None else f"{seconds:.0f}", compared=False))
            label = f"{system_name(warm)} (warm start)" if objective is None else system_name(system)
            rows.append(Row(label, tuple(cells)))
    table_columns = tuple(
        Column(f"{eval_set}/{stage}", f"{eval_set_name(eval_set)} {STAGE_NAMES[stage]}", STAGE_NAMES[stage],
               group=eval_set_name(eval_set)) for eval_set, stage in columns
    ) + (Column("lr", "Learning rate", "lr"), Column("seconds", "Train s/epoch", "s/epoch"))
    note = (f"Cells: nDCG@10 (p against PG-Rank / p against the warm start; paired {test} test over the same "
            f"queries); every objective trains on the same candidate sets for {params.train.epochs} epochs of "
            f"batches of {params.train.batch_size} queries, at its own learning rate (train.learning_rates, chosen "
            f"on validation); s/epoch: wall time of an epoch's updates, validation excluded "
            f"(measured, not reproducible)")
    return Table("objectives", "Same candidates, same budget: Neural PG-Rank against standard losses (nDCG@10)",
                 table_columns, tuple(rows), row_header="Objective", legend=False, note=note)
