"""A judged split cut in two by query hash (``data.sources.<name>.split``): a selection half and a report half.

Many BEIR-format sets publish one judged split, ``test``. To guard selection against forgetting on such a set
(``train.validation_sets``) while still reporting on it (``data.eval_sets``), its queries are cut into two disjoint
halves, so that no query a policy was selected on is ever reported::

    data:
      sources:
        arguana-split: {split: {of: arguana}}       # arguana's test split, cut in two
      eval_sets: [scifact/test, arguana-split/test] # results: the test half only
    train:
      validation_sets: [arguana-split/dev]          # selection: the dev half

Each query gets the carve-out's stable position ``u`` in [0, 1) (:func:`pgrank.download.carve_out.position`,
blake2b of ``"{seed}/{qid}"``); the first ``round(dev_share * n)`` queries in that order are ``dev`` and the rest
``test`` (at least one in each). The result depends on the ids and the seed, not on their order in the file. The
folder holds ``qrels/dev.tsv`` and ``qrels/test.tsv`` and links to the parent's ``corpus.jsonl`` and
``queries.jsonl`` (nothing large is copied; relative links, so the data folder may move). Its record keeps the
settings, the parent's file checksums and the query counts; it is rebuilt, atomically, only when either changes.
"""

from __future__ import annotations

import os
from pathlib import Path

from pgrank.atomic import atomic_path
from pgrank.config.sections import HashSplitConfig
from pgrank.data.beir import Qrels, load_qrels, write_qrels
from pgrank.download.carve_out import position
from pgrank.download.dataset_checks import validate_folder
from pgrank.download.manifests import fingerprint
from pgrank.download.sources import installed_record, write_install_record
from pgrank.errors import DataError

SELECTION, REPORT = "dev", "test"  # the halves' split names: dev for selection, test for results
LINKED = ("corpus.jsonl", "queries.jsonl")


def hash_split(qrels: Qrels, dev_share: float, seed: int) -> tuple[Qrels, Qrels]:
    """``(dev, test)``: the judged queries cut by their hash positions, the first ``round(dev_share * n)`` (at least
    one, and one fewer than all) in ``dev``. Pure: ``qrels`` is not modified; each part keeps the input's order.

    Raises:
        DataError: fewer than two judged queries.
    """
    if len(qrels) < 2:
        raise DataError(f"{len(qrels)} judged quer{'y' if len(qrels) == 1 else 'ies'}: a split needs at least 2")
    order = sorted(qrels, key=lambda q: (position(seed, q), q))
    size = min(max(round(dev_share * len(order)), 1), len(order) - 1)
    dev = set(order[:size])
    part = lambda keep: {q: dict(docs) for q, docs in qrels.items() if keep(q)}  # noqa: E731
    return part(dev.__contains__), part(lambda q: q not in dev)


def install_split(name: str, cfg: HashSplitConfig, parent: Path, target: Path, cache_file: Path) -> str:
    """Build the source ``name`` at ``target`` from the installed dataset folder ``parent`` (``cache_file``: its
    fingerprint cache, so that an unchanged parent is not read again).

    Returns:
        ``"validated"`` when it was (re)built, ``"present"`` when the parent's files and the settings are the ones
        it was built from.
    """
    label = f"data.sources.{name}.split"
    qrels_file = parent / "qrels" / f"{cfg.split}.tsv"
    if not qrels_file.is_file():
        raise DataError(f"{label}: {cfg.of!r} has no judged split {cfg.split!r} at {qrels_file}")
    files = fingerprint(parent, cache_file)
    origin = {"split": cfg.model_dump(mode="json"), "parent": {f: files[f] for f in (*LINKED, f"qrels/{cfg.split}.tsv")}}
    record = installed_record(name, target)
    if record is not None and {k: v for k, v in record["origin"].items() if k != "queries"} == origin:
        return "present"
    try:
        dev, test = hash_split(load_qrels(qrels_file), cfg.dev_share, cfg.seed)
    except DataError as exc:
        raise DataError(f"{label}: {qrels_file}: {exc}") from None
    with atomic_path(target, directory=True) as tmp:
        for file in LINKED:  # relative (../<parent>/corpus.jsonl): valid wherever the data folder moves
            (tmp / file).symlink_to(os.path.relpath(parent.resolve() / file, target.parent.resolve() / target.name))
        write_qrels(tmp / "qrels" / f"{SELECTION}.tsv", dev)
        write_qrels(tmp / "qrels" / f"{REPORT}.tsv", test)
        origin["queries"] = {SELECTION: len(dev), REPORT: len(test)}
        write_install_record(tmp, name, origin, vars(validate_folder(tmp, label, missing_documents="warn")))
    return "validated"
