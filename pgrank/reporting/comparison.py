"""The objective comparison: Neural PG-Rank against standard losses on the same candidates and budget.

Written by ``pgrank tables`` as ``objectives.md`` / ``.tex`` when ``train.objectives`` lists more than
one loss (the ``compare`` profile). Per warm start, one row for the warm start itself and one per
objective or variant (``train.variants``); per evaluation set and stage, one column of nDCG@10 with two paired
p-values (``evaluate.significance.test`` over the same queries): against PG-Rank (``pgrank-<warm>``) and against
the warm start; then the training wall time per epoch. With ``train.extra_seeds``, the nDCG@10 is the mean ±
standard deviation over seeds and the tests pair per-query means over seeds.

Inputs: the ``per_query.json`` and ``metrics.json`` files of ``pgrank evaluate`` (DVC-tracked) and
``Paths.timings`` (the wall time ``pgrank train`` measured around each epoch's updates, validation
excluded). The timings are measurements, not results: they sit outside every DVC-tracked folder, so a
rerun that reproduces the same models leaves the pipeline's outputs (this table's scores included)
byte-identical, and only the time column can differ.
"""

from __future__ import annotations

import functools
import json
import statistics
from pathlib import Path

from pgrank.config import EVAL_STAGES, Params
from pgrank.core.significance import paired_test
from pgrank.errors import PgrankError
from pgrank.paths import DEFAULT_OBJECTIVE, Paths, policy_name, run_key
from pgrank.reporting.rendering import DASH, OBJECTIVE_NAMES, Cell, Column, Row, Table, eval_set_name, system_name

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


def _flat(overrides: dict, prefix: str = "") -> list[str]:
    """``{pg: {num_samples: 1000}}`` -> ``["pg.num_samples=1000"]``."""
    out = []
    for key, value in overrides.items():
        if isinstance(value, dict):
            out += _flat(value, f"{prefix}{key}.")
        else:
            out.append(f"{prefix}{key}={value}")
    return out


def row_label(params: Params, warm: str, objective: str) -> str:
    """"ListNet with minilm"; a variant: "PG-Rank (pg.num_samples=1000) with minilm"."""
    variant = params.train.variants.get(objective)
    if variant is None:
        return system_name(policy_name(warm, objective))
    loss = OBJECTIVE_NAMES.get(variant.objective, variant.objective)
    return f"{loss} ({', '.join(_flat(variant.overrides)) or objective}) with {system_name(warm)}"


def seed_mean(runs: list[dict[str, float]]) -> dict[str, float]:
    """Per query, the mean over seeds (the queries every seed's run scored)."""
    common = set(runs[0]).intersection(*runs[1:])
    return {q: sum(r[q] for r in runs) / len(runs) for q in runs[0] if q in common}


def score_text(runs: list[dict[str, float]], decimals: int) -> str:
    """The mean nDCG@10 of one run, or the mean +- standard deviation of the seeds' means."""
    means = [sum(r.values()) / len(r) for r in runs]
    text = f"{statistics.fmean(means):.{decimals}f}"
    return text if len(means) == 1 else f"{text} ± {statistics.stdev(means):.{decimals}f}"


def comparison_table(params: Params, paths: Paths) -> Table:
    """Rows: each warm start, then its policies by objective; columns: eval set x stage, then s/epoch.

    With ``train.extra_seeds``, a cell is the mean +- sample standard deviation over the seeds of each seed's
    nDCG@10, and its p-values pair the per-query means over seeds (the seeds a run has results for)."""
    decimals, test, cfg = params.tables.decimals, params.evaluate.significance.test, params.train
    columns = [(eval_set, stage) for eval_set in params.data.eval_sets for stage in params.evaluate.stages
               if stage in EVAL_STAGES]
    seeds = [None, *cfg.extra_seeds]

    @functools.cache  # PG-Rank's and the warm start's files are compared with every row: read each once
    def values(system: str, eval_set: str, stage: str) -> dict[str, float] | None:
        dataset, split = eval_set.split("/")
        return read_per_query(paths.results(system, dataset, split, stage) / "per_query.json")

    def seeded(warm: str, objective: str, eval_set: str, stage: str) -> list[dict[str, float]]:
        found = (values(policy_name(warm, run_key(objective, s)), eval_set, stage) for s in seeds)
        return [v for v in found if v]

    rows = []
    for warm in cfg.warm_starts:
        for objective in [None, *cfg.objectives]:
            cells = []
            for eval_set, stage in columns:
                runs = seeded(warm, objective, eval_set, stage) if objective else [
                    v for v in [values(warm, eval_set, stage)] if v]
                if not runs:
                    cells.append(Cell(DASH, compared=False))
                    continue
                text = score_text(runs, decimals)
                if objective is not None:
                    ours = seed_mean(runs)
                    pg = seeded(warm, DEFAULT_OBJECTIVE, eval_set, stage) if objective != DEFAULT_OBJECTIVE else []
                    against_warm = values(warm, eval_set, stage)
                    text += (f" ({_p(paired_test(ours, seed_mean(pg), test) if pg else None)} / "
                             f"{_p(paired_test(ours, against_warm, test) if against_warm else None)})")
                cells.append(Cell(text, compared=False))
            rate = cfg.learning_rate_for(objective) if objective else None
            cells.append(Cell(DASH if rate is None else f"{rate:g}", compared=False))
            timed = [epoch_seconds(paths.timings(warm, run_key(objective, s))) for s in seeds] if objective else []
            timed = [t for t in timed if t is not None]
            cells.append(Cell(f"{statistics.fmean(timed):.0f}" if timed else DASH, compared=False))
            label = f"{system_name(warm)} (warm start)" if objective is None else row_label(params, warm, objective)
            rows.append(Row(label, tuple(cells)))
    table_columns = tuple(
        Column(f"{eval_set}/{stage}", f"{eval_set_name(eval_set)} {STAGE_NAMES[stage]}", STAGE_NAMES[stage],
               group=eval_set_name(eval_set)) for eval_set, stage in columns
    ) + (Column("lr", "Learning rate", "lr"), Column("seconds", "Train s/epoch", "s/epoch"))
    over = (f"mean ± sd over {len(seeds)} seeds ({', '.join(map(str, [cfg.seed, *cfg.extra_seeds]))}) of nDCG@10; p: "
            "paired over the per-query means over seeds" if cfg.extra_seeds else "nDCG@10")
    note = (f"Cells: {over} (p against PG-Rank / p against the warm start; paired {test} test over the same "
            f"queries); every objective trains on the same candidate sets for {cfg.epochs} epochs of "
            f"batches of {cfg.batch_size} queries, at its own learning rate (train.learning_rates, chosen "
            f"on validation); s/epoch: wall time of an epoch's updates, validation excluded "
            f"(measured, not reproducible)")
    return Table("objectives", "Same candidates, same budget: Neural PG-Rank against standard losses (nDCG@10)",
                 table_columns, tuple(rows), row_header="Objective", legend=False, note=note)
