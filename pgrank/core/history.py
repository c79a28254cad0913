"""The rows of a training run's ``history.json``: what ``pgrank train`` validates after each epoch.

One mapping per validated epoch, and with ``train.selection.interpolation`` one more per mixture with the warm
start: ``{"epoch": e, "alpha": a, "val_ndcg@10": ..., "val_<dataset>/<split>_ndcg@10": ...}`` (no ``alpha``: an
epoch as trained). When the run holds the warm start's weights (interpolation, L2-SP, the one-standard-error rule)
a row also has ``"distance"``, the L2 distance of its weights from the warm start's; with
``train.selection.within_se`` or ``guard: noise`` it has ``"per_query_ndcg@10"``, the in-domain validation nDCG@10
of each query, and ``"per_query_<dataset>/<split>_ndcg@10"``, the same of each out-of-domain set's queries.
Selection (:mod:`pgrank.training.selection`) and the tables read them by these keys.
"""

from __future__ import annotations

METRIC = "ndcg@10"


def in_domain_key(metric: str = METRIC) -> str:
    """History key of the carved in-domain validation split's metric, ``val_ndcg@10``."""
    return f"val_{metric}"


def set_key(name: str, metric: str = METRIC) -> str:
    """History key of an out-of-domain validation set's metric, e.g. ``val_nfcorpus/dev_ndcg@10``."""
    return f"val_{name}_{metric}"


DISTANCE = "distance"


def per_query_key(metric: str = METRIC) -> str:
    """History key of the in-domain validation metric per query (``{qid: value}``), ``per_query_ndcg@10``."""
    return f"per_query_{metric}"


def per_query_set_key(name: str, metric: str = METRIC) -> str:
    """History key of an out-of-domain set's metric per query, e.g. ``per_query_nfcorpus/dev_ndcg@10``."""
    return f"per_query_{name}_{metric}"


def scalars(row: dict) -> dict[str, float]:
    """A row's figures without its per-query values: what MLflow and the log get."""
    return {k: v for k, v in row.items() if not k.startswith("per_query_")}


def alpha(row: dict) -> float:
    """A history row's interpolation weight: 1 for an epoch as trained."""
    return float(row.get("alpha", 1.0))


def place(row: dict) -> tuple[int, float]:
    """Where a history row's weights are: its epoch and alpha."""
    return row["epoch"], alpha(row)
