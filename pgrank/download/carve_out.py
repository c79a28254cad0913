"""The seeded validation carve-out of the training split (paper: "a validation set of 7k examples").

``data.validation_size`` queries of ``data.train``'s qrels, drawn with ``data.validation_seed``, become
the ``validation`` split; the rest is ``train-pg``. Both are written as BEIR qrels under
``Paths.carved_qrels`` and read back through :func:`pgrank.data.beir.load_topics` like any split.

``data.holdout`` (a qrels file; scheduled retraining sets it to its frozen gate set) names queries that
are always carved into validation and never trained on, whatever the data grew by since; the draw then
only tops them up to ``validation_size``.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from pathlib import Path

from pgrank.config import DataConfig
from pgrank.data.beir import Qrels, load_qrels, split_qrels, write_qrels
from pgrank.errors import DataError
from pgrank.paths import CARVED_FILES, CARVED_TRAIN, VALIDATION, Paths


@dataclass(frozen=True)
class CarveOut:
    dataset: str
    split: str  # the BEIR split that was carved
    train_path: Path
    validation_path: Path
    train_queries: int
    validation_queries: int



def carve_validation(qrels: Qrels, size: int, seed: int, held_out: frozenset[str] = frozenset()) -> tuple[Qrels, Qrels]:
    """Split judged queries into (train, validation) with ``size`` seeded validation queries.

    The draw is over the sorted query ids, so it depends only on the ids, ``size`` and ``seed``;
    both parts keep the input's order. Queries in ``held_out`` always go to validation; the draw tops
    them up to ``size`` from the others. Pure: ``qrels`` is not modified.
    """
    kept = [qid for qid in qrels if qid in held_out]
    rest = sorted(qid for qid in qrels if qid not in held_out)
    extra = max(0, size - len(kept))
    if extra >= len(rest):
        raise DataError(f"data.validation_size={size} must be smaller than the {len(qrels)} training queries")
    chosen = set(kept) | set(random.Random(seed).sample(rest, extra))
    train = {qid: dict(docs) for qid, docs in qrels.items() if qid not in chosen}
    validation = {qid: dict(docs) for qid, docs in qrels.items() if qid in chosen}
    return train, validation


def write_carve_out(paths: Paths, data: DataConfig) -> CarveOut:
    """Carve ``data.validation_size`` seeded validation queries out of ``data.train``'s qrels.

    Writes ``Paths.carved_qrels(dataset, "train")`` and ``(dataset, "validation")``, read back
    as the splits ``train-pg`` and ``validation``. Deterministic: rerunning rewrites identical bytes.
    """
    dataset, split = data.train.split("/")
    path = split_qrels(paths, dataset, split)
    qrels = load_qrels(path)
    held_out = frozenset()
    if data.holdout:
        holdout = Path(data.holdout).expanduser()
        if not holdout.is_file():
            raise DataError(f"data.holdout {data.holdout!r}: no such file {holdout.resolve()} (a BEIR qrels TSV)")
        held_out = frozenset(load_qrels(holdout)) & frozenset(qrels)
    try:
        train, validation = carve_validation(qrels, data.validation_size, data.validation_seed, held_out)
    except DataError:
        raise DataError(f"data.validation_size={data.validation_size} must be smaller than the {len(qrels)} "
                        f"queries of {data.train} ({path}); lower it, e.g. --set data.validation_size="
                        f"{max(1, len(qrels) // 8)}") from None
    train_path = paths.carved_qrels(dataset, CARVED_FILES[CARVED_TRAIN])
    validation_path = paths.carved_qrels(dataset, CARVED_FILES[VALIDATION])
    write_qrels(train_path, train)
    write_qrels(validation_path, validation)
    return CarveOut(dataset, split, train_path, validation_path, len(train), len(validation))
