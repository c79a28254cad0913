"""The rows of a training run's ``history.json``: what ``pgrank train`` validates after each epoch.

One mapping per validated epoch, and with ``train.selection.interpolation`` one more per mixture with the warm
start: ``{"epoch": e, "alpha": a, "val_ndcg@10": ..., "val_<dataset>/<split>_ndcg@10": ...}`` (no ``alpha``: an
epoch as trained). Selection (:mod:`pgrank.training.selection`) and the tables read them by these keys.
"""

from __future__ import annotations

METRIC = "ndcg@10"


def in_domain_key(metric: str = METRIC) -> str:
    """History key of the carved in-domain validation split's metric, ``val_ndcg@10``."""
    return f"val_{metric}"


def set_key(name: str, metric: str = METRIC) -> str:
    """History key of an out-of-domain validation set's metric, e.g. ``val_nfcorpus/dev_ndcg@10``."""
    return f"val_{name}_{metric}"


def alpha(row: dict) -> float:
    """A history row's interpolation weight: 1 for an epoch as trained."""
    return float(row.get("alpha", 1.0))
