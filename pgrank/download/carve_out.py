"""The carve-out of the training split: three disjoint query sets of ``data.train``, stable as judgments arrive.

Each judged query gets a position ``u`` in [0, 1), a stable hash of ``data.validation_seed`` and its id
(:func:`position`: blake2b of ``"{seed}/{qid}"``), and its split follows from two bounds on it:

* ``gate-pg`` (``u < gate_below``): the champion gate's queries (:mod:`pgrank.pipeline.gate`), never trained on
  nor used for selection. While a gate set is frozen (``data.holdout``, set by scheduled retraining) its
  queries are in the gate split too, whatever their position; the other queries below ``gate_below`` are the
  gate *reserve*, held out of training and selection so that a refreshed gate set can be drawn from them.
* ``validation`` (``gate_below <= u < validation_below``; paper: "a validation set of 7k examples"):
  selection: epochs, early stopping, the out-of-domain guard, learning rates and the choice among several
  challengers of a retraining run.
* ``train-pg``: the rest, and the queries of gate sets retired by a refresh (they return to training).

The first carve-out sets the bounds so that the splits have exactly ``data.gate_size`` and
``data.validation_size`` queries: ``gate_below`` is the position of the ``gate_size + 1``-th query in hash
order, ``validation_below`` the same over the others. The bounds are written to ``splits/<dataset>/carve.json``
and frozen with the gate set (its ``gate.json``, read beside ``data.holdout``); from then on a new query lands
by its own position, so **adding judged queries never moves an existing query between splits**, and the sizes
stay the expected shares (a new query goes to validation with probability ``validation_size / N0`` of the
first carve-out's ``N0`` queries). Without frozen bounds (no gate set frozen yet) each carve-out re-fills the
quotas in hash order: one new query moves at most one old query per bound, never reshuffles the split.

Each split is written as BEIR qrels under ``Paths.carved_qrels`` and read back through
:func:`pgrank.data.beir.load_topics` like any split.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from pathlib import Path

from pgrank.atomic import write_json
from pgrank.config import DataConfig
from pgrank.data.beir import Qrels, load_qrels, split_qrels, write_qrels
from pgrank.errors import DataError
from pgrank.paths import CARVED_FILES, CARVED_TRAIN, GATE, VALIDATION, Paths

BOUNDS_FILE = "carve.json"  # splits/<dataset>/carve.json, and the "carve" entry of a frozen gate set's gate.json


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
    bounds_path: Path | None = None  # splits/<dataset>/carve.json


@dataclass(frozen=True)
class Bounds:
    """Where the splits end on the hash positions: gate ``u < gate_below``, validation ``u < validation_below``."""

    seed: int
    gate_below: float
    validation_below: float

    def as_dict(self) -> dict:
        return {"seed": self.seed, "gate_below": self.gate_below, "validation_below": self.validation_below}

    @classmethod
    def from_dict(cls, raw: dict) -> Bounds:
        return cls(int(raw["seed"]), float(raw["gate_below"]), float(raw["validation_below"]))


@dataclass(frozen=True)
class Carved:
    """The three disjoint parts of one split's judgments, and the bounds that cut them."""

    train: Qrels
    validation: Qrels
    gate: Qrels
    bounds: Bounds | None = None


def position(seed: int, qid: str) -> float:
    """A query's stable place in [0, 1): the first 8 bytes of blake2b(``"{seed}/{qid}"``) over 2**64."""
    digest = hashlib.blake2b(f"{seed}/{qid}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big") / 2.0**64


def _quota_bound(positions: list[float], size: int) -> float:
    """The bound below which exactly ``size`` of the sorted ``positions`` lie (1.0: all of them)."""
    return positions[size] if size < len(positions) else 1.0


def carve(qrels: Qrels, validation_size: int, seed: int, *, gate_size: int = 0,
          gate: frozenset[str] | None = None, bounds: Bounds | None = None,
          retired: frozenset[str] = frozenset()) -> Carved:
    """Split judged queries into train, validation and gate queries by their hash positions (module docstring).

    Args:
        qrels: the judged queries of ``data.train``.
        validation_size, gate_size: the split sizes, used to set the bounds when ``bounds`` is not given.
        seed: the hash seed (``data.validation_seed``).
        gate: the frozen gate set's queries, in the gate split whatever their position (those no longer
            judged are left out).
        bounds: frozen bounds (the first carve-out's); ``None`` (or another seed's): quotas in hash order.
        retired: queries of gate sets a refresh retired; they train, unless ``gate`` holds them again.

    Returns:
        The parts, each in the input's order, and the bounds used. Pure: ``qrels`` is not modified; the result
        depends on the ids, not on their order.

    Raises:
        DataError: the validation and gate queries would leave none to train on.
    """
    u = {qid: position(seed, qid) for qid in qrels}
    frozen = {qid for qid in qrels if gate is not None and qid in gate}
    if bounds is None or bounds.seed != seed:
        if gate is None and gate_size >= len(qrels):
            raise DataError(f"data.gate_size={gate_size} must be smaller than the {len(qrels)} queries")
        gate_below = _quota_bound(sorted(u.values()), gate_size) if gate is None and gate_size else 0.0
        held = frozen | {q for q in qrels if u[q] < gate_below and q not in retired}
        rest = sorted(u[q] for q in qrels if q not in held and q not in retired)
        if validation_size >= len(rest):
            raise DataError(f"data.validation_size={validation_size} must be smaller than the {len(rest)} queries"
                            + (f" left beside the gate's {len(held)}" if held else ""))
        bounds = Bounds(seed, gate_below, _quota_bound(rest, validation_size))
    in_gate = frozen | {q for q in qrels if u[q] < bounds.gate_below and q not in retired}
    in_validation = {q for q in qrels if q not in in_gate and q not in retired and u[q] < bounds.validation_below}
    part = lambda keep: {q: dict(docs) for q, docs in qrels.items() if keep(q)}  # noqa: E731
    carved = Carved(part(lambda q: q not in in_validation and q not in in_gate), part(in_validation.__contains__),
                    part(in_gate.__contains__), bounds)
    if not carved.train:
        raise DataError(f"data.validation_size={validation_size} leaves no query of the {len(qrels)} to train on")
    return carved


def frozen_bounds(holdout: Path) -> tuple[Bounds | None, frozenset[str]]:
    """The bounds and retired queries a frozen gate set records in the ``gate.json`` beside its judgments
    (``data.holdout``); ``(None, {})`` for a set frozen before sets recorded them."""
    meta_file = holdout.parent / "gate.json"
    meta = json.loads(meta_file.read_text(encoding="utf-8")) if meta_file.is_file() else {}
    raw = meta.get("carve")
    return (Bounds.from_dict(raw) if raw else None), frozenset(meta.get("retired", ()))


def write_carve_out(paths: Paths, data: DataConfig) -> CarveOut:
    """Carve ``data.train``'s qrels into ``train-pg``, ``validation`` and ``gate-pg`` (see the module docstring).

    Writes ``Paths.carved_qrels(dataset, "train")``, ``(dataset, "validation")`` and, when there is a gate
    split, ``(dataset, "gate")`` (removed when there is none), and the bounds to ``splits/<dataset>/carve.json``.
    With ``data.holdout`` the frozen gate set's bounds and retired queries (its ``gate.json``) are used.
    Deterministic: rerunning rewrites identical bytes.
    """
    dataset, split = data.train.split("/")
    path = split_qrels(paths, dataset, split)
    qrels = load_qrels(path)
    gate, bounds, retired = None, None, frozenset()
    if data.holdout:
        holdout = Path(data.holdout).expanduser()
        if not holdout.is_file():
            raise DataError(f"data.holdout {data.holdout!r}: no such file {holdout.resolve()} (a BEIR qrels TSV)")
        gate = frozenset(load_qrels(holdout))
        bounds, retired = frozen_bounds(holdout)
    try:
        carved = carve(qrels, data.validation_size, data.validation_seed, gate_size=data.gate_size, gate=gate,
                       bounds=bounds, retired=retired)
    except DataError as exc:
        key = str(exc).partition("=")[0]  # data.validation_size or data.gate_size
        raise DataError(f"{exc} of {data.train} ({path}); lower it, e.g. --set {key}={max(1, len(qrels) // 8)}") from None
    train_path = paths.carved_qrels(dataset, CARVED_FILES[CARVED_TRAIN])
    validation_path = paths.carved_qrels(dataset, CARVED_FILES[VALIDATION])
    gate_path = paths.carved_qrels(dataset, CARVED_FILES[GATE])
    bounds_path = bounds_file(paths, dataset)
    write_qrels(train_path, carved.train)
    write_qrels(validation_path, carved.validation)
    if gate is not None or data.gate_size:
        write_qrels(gate_path, carved.gate)
    else:
        gate_path.unlink(missing_ok=True)
    write_json(bounds_path, {**carved.bounds.as_dict(), "queries": len(qrels)})
    return CarveOut(dataset, split, train_path, validation_path, len(carved.train), len(carved.validation),
                    gate_path if gate_path.is_file() else None, len(carved.gate), bounds_path)


def bounds_file(paths: Paths, dataset: str) -> Path:
    """``splits/<dataset>/carve.json``: the bounds of the last carve-out (what freezing a gate set records)."""
    return paths.carved_qrels(dataset, CARVED_FILES[CARVED_TRAIN]).parent.parent / BOUNDS_FILE


def read_bounds(paths: Paths, dataset: str) -> Bounds | None:
    """The bounds the last carve-out of ``dataset`` wrote (``None``: none written)."""
    file = bounds_file(paths, dataset)
    return Bounds.from_dict(json.loads(file.read_text(encoding="utf-8"))) if file.is_file() else None
