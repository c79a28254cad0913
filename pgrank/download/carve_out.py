"""The seeded carve-out of the training split: three disjoint query sets of ``data.train``.

* ``validation`` (selection; paper: "a validation set of 7k examples"): ``data.validation_size`` queries
  drawn with ``data.validation_seed``. Epochs, early stopping, the out-of-domain guard, learning rates and
  the choice among several challengers of a retraining run are made on it.
* ``gate-pg``: the champion gate's queries (:mod:`pgrank.pipeline.gate`), never trained on nor used for
  selection. ``data.holdout`` (a qrels file; scheduled retraining sets it to its frozen gate set) names
  them once a gate set is frozen, whatever the data grew by since; before that, ``data.gate_size`` seeded
  queries (0: no gate split). Validation is drawn from the queries outside the gate.
* ``train-pg``: the rest.

Each is written as BEIR qrels under ``Paths.carved_qrels`` and read back through
:func:`pgrank.data.beir.load_topics` like any split.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from pathlib import Path

from pgrank.config import DataConfig
from pgrank.data.beir import Qrels, load_qrels, split_qrels, write_qrels
from pgrank.errors import DataError
from pgrank.paths import CARVED_FILES, CARVED_TRAIN, GATE, VALIDATION, Paths


@dataclass(frozen=True)
class CarveOut:
    dataset: str
    split: str  # the BEIR split that was carved
    train_path: Path
    validation_path: Path
    train_queries: int
    validation_queries: int
    gate_path: Path | None = None  # None: no gate split
    gate_queries: int = 0


@dataclass(frozen=True)
class Carved:
    """The three disjoint parts of one split's judgments."""

    train: Qrels
    validation: Qrels
    gate: Qrels


def carve(qrels: Qrels, validation_size: int, seed: int, *, gate_size: int = 0,
          gate: frozenset[str] | None = None) -> Carved:
    """Split judged queries into train, validation and gate queries.

    The gate is ``gate`` (the frozen gate set's queries that are still judged) when given, else
    ``gate_size`` queries drawn first (with a generator of their own, seeded from ``seed``). Validation is
    then ``validation_size`` queries drawn from the others with ``seed``: the same draw whether the gate
    was just drawn or is the frozen one, so freezing the gate changes no split; with no gate it is the
    draw of a validation carve-out alone. Draws are over sorted query ids, so they depend only on the
    ids, the sizes and ``seed``. Every part keeps the input's order. Pure: ``qrels`` is not modified.

    Raises:
        DataError: the validation and gate queries would leave none to train on.
    """
    if gate is not None:
        in_gate = {qid for qid in qrels if qid in gate}
    else:
        if gate_size >= len(qrels):
            raise DataError(f"data.gate_size={gate_size} must be smaller than the {len(qrels)} queries")
        in_gate = set(random.Random(f"{seed}/gate").sample(sorted(qrels), gate_size))
    rest = sorted(qid for qid in qrels if qid not in in_gate)
    if validation_size >= len(rest):
        raise DataError(f"data.validation_size={validation_size} must be smaller than the {len(rest)} queries"
                        + (f" left beside the gate's {len(in_gate)}" if in_gate else ""))
    in_validation = set(random.Random(seed).sample(rest, validation_size))
    part = lambda keep: {q: dict(docs) for q, docs in qrels.items() if keep(q)}  # noqa: E731
    return Carved(part(lambda q: q not in in_validation and q not in in_gate), part(in_validation.__contains__),
                  part(in_gate.__contains__))


def write_carve_out(paths: Paths, data: DataConfig) -> CarveOut:
    """Carve ``data.train``'s qrels into ``train-pg``, ``validation`` and ``gate-pg`` (see the module docstring).

    Writes ``Paths.carved_qrels(dataset, "train")``, ``(dataset, "validation")`` and, when there is a gate
    split, ``(dataset, "gate")`` (removed when there is none). Deterministic: rerunning rewrites identical bytes.
    """
    dataset, split = data.train.split("/")
    path = split_qrels(paths, dataset, split)
    qrels = load_qrels(path)
    gate = None
    if data.holdout:
        holdout = Path(data.holdout).expanduser()
        if not holdout.is_file():
            raise DataError(f"data.holdout {data.holdout!r}: no such file {holdout.resolve()} (a BEIR qrels TSV)")
        gate = frozenset(load_qrels(holdout))
    try:
        carved = carve(qrels, data.validation_size, data.validation_seed, gate_size=data.gate_size, gate=gate)
    except DataError as exc:
        key = str(exc).partition("=")[0]  # data.validation_size or data.gate_size
        raise DataError(f"{exc} of {data.train} ({path}); lower it, e.g. --set {key}={max(1, len(qrels) // 8)}") from None
    train_path = paths.carved_qrels(dataset, CARVED_FILES[CARVED_TRAIN])
    validation_path = paths.carved_qrels(dataset, CARVED_FILES[VALIDATION])
    gate_path = paths.carved_qrels(dataset, CARVED_FILES[GATE])
    write_qrels(train_path, carved.train)
    write_qrels(validation_path, carved.validation)
    if gate is not None or data.gate_size:
        write_qrels(gate_path, carved.gate)
    else:
        gate_path.unlink(missing_ok=True)
    return CarveOut(dataset, split, train_path, validation_path, len(carved.train), len(carved.validation),
                    gate_path if gate_path.is_file() else None, len(carved.gate))
