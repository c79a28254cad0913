"""What the tables read: the metrics files of ``pgrank evaluate``, training curves, and the paper's numbers.

* ``Paths.results(system, dataset, split, stage) / "metrics.json"`` (written by ``pgrank evaluate``)::

      {"system": "pgrank-sbert", "dataset": "msmarco", "split": "dev", "stage": "rerank", ...,
       "metrics": {"ndcg@10": 0.98, ...},
       "significance": {"baseline": "sbert", ..., "significant": {"ndcg@10": true, ...}} | null}

  A missing file is a result not computed; a malformed one is a :class:`PgrankError` naming it.
* ``Paths.training_log(warm start) / "curve.csv"`` (step,epoch,loss,utility,grad_norm,entropy) and
  ``history.json`` (``[{"epoch": 0, "val_ndcg@10": ...}, ...]``), written by ``pgrank train``.
* ``pgrank/reporting/published.yaml``: table -> eval set -> system -> value, as printed in the paper.
"""

from __future__ import annotations

import csv
import importlib.resources
import json
import math
from dataclasses import dataclass
from pathlib import Path

import yaml

from pgrank.config import EVAL_STAGES
from pgrank.errors import PgrankError
from pgrank.paths import Paths


@dataclass(frozen=True)
class Result:
    """One metrics file: metric -> value, and metric -> significantly different from the warm start."""

    metrics: dict[str, float]
    significant: dict[str, bool]


Results = dict[tuple[str, str, str], Result]  # (system, eval set, stage) -> result


def load_published() -> dict:
    """The paper's numbers (package data ``pgrank/reporting/published.yaml``), a fresh copy on every call."""
    text = importlib.resources.files("pgrank.reporting").joinpath("published.yaml").read_text(encoding="utf-8")
    return yaml.safe_load(text)


def read_result(path: Path) -> Result | None:
    """One ``metrics.json``, or None when absent. Non-finite values read as not computed."""
    if not path.is_file():
        return None
    try:
        doc = json.loads(path.read_text(encoding="utf-8"))
    except ValueError as exc:
        raise PgrankError(f"{path}: not valid JSON ({exc})") from None
    metrics = doc.get("metrics") if isinstance(doc, dict) else None
    if not isinstance(metrics, dict):
        raise PgrankError(f'{path}: expected a JSON object with a "metrics" mapping')
    for key, value in metrics.items():
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise PgrankError(f"{path}: metrics.{key}: expected a number (got {value!r})")
    significance = doc.get("significance") or {}
    flags = significance.get("significant") if isinstance(significance, dict) else None
    if flags is not None and not isinstance(flags, dict):
        raise PgrankError(f"{path}: significance.significant: expected a mapping of metric -> true/false")
    return Result({k: float(v) for k, v in metrics.items() if math.isfinite(v)},
                  {k: bool(v) for k, v in (flags or {}).items()})


def collect_results(paths: Paths, systems: list[str], eval_sets: list[str]) -> Results:
    """Every metrics file of ``systems`` x ``eval_sets`` x :data:`pgrank.config.EVAL_STAGES` that exists."""
    results: Results = {}
    for system in systems:
        for eval_set in eval_sets:
            dataset, split = eval_set.split("/")
            for stage in EVAL_STAGES:
                result = read_result(paths.results(system, dataset, split, stage) / "metrics.json")
                if result is not None:
                    results[(system, eval_set, stage)] = result
    return results


def read_curve(path: Path) -> dict[str, list[float]]:
    """``curve.csv`` of a training run as columns of numbers (empty when absent)."""
    if not path.is_file():
        return {}
    columns: dict[str, list[float]] = {}
    with open(path, encoding="utf-8", newline="") as fh:
        reader = csv.DictReader(fh)
        for row in reader:
            try:
                values = {key: float(value) for key, value in row.items()}
            except (TypeError, ValueError):
                raise PgrankError(f"{path}:{reader.line_num}: expected a number in every column (got {row!r})") from None
            for key, value in values.items():
                columns.setdefault(key, []).append(value)
    return columns


def read_history(path: Path) -> list[dict]:
    """``history.json`` of a training run: one mapping per epoch (empty when absent)."""
    if not path.is_file():
        return []
    try:
        history = json.loads(path.read_text(encoding="utf-8"))
    except ValueError as exc:
        raise PgrankError(f"{path}: not valid JSON ({exc})") from None
    if not isinstance(history, list) or not all(isinstance(h, dict) and "epoch" in h for h in history):
        raise PgrankError(f'{path}: expected a list of {{"epoch": ..., "val_ndcg@10": ...}} objects')
    return history
