"""What a finished epoch leaves on disk in ``pgrank train``: the kept and the selected checkpoints
(``train.keep_epochs``, ``train.selection``), the per-step curve, the validation history and the epoch's wall time.
Every file is written atomically (:mod:`pgrank.atomic`), and only by the main process of a data-parallel run."""

from __future__ import annotations

import csv
import io
import json
from pathlib import Path

import torch

from pgrank.atomic import write_json, write_text
from pgrank.core.history import alpha, in_domain_key, place
from pgrank.training import checkpoints, selection
from pgrank.training.run import Run


def write_checkpoint(run: Run, folder: Path, epoch: int, **extra) -> None:
    """The policy as a sentence-transformers checkpoint (``tower: query``: with the frozen document side)."""
    cfg, model = run.cfg, run.models.policy
    meta = {"warm_start": run.warm_start, "warm_start_model": run.ref.key, "objective": run.objective, "run": run.name,
            "tower": cfg.tower,
            "epoch": epoch, "similarity": cfg.similarity, "fingerprint": run.fingerprint, **extra,
            "document_encoder": run.doc_ref.key if cfg.tower == "query" else None}
    doc_model = None
    if cfg.tower == "query":
        doc_model = run.models.documents()
        model[0].max_seq_length = cfg.max_query_length
    checkpoints.save_model(model, folder, meta, document_model=doc_model)
    if cfg.tower == "query":
        model[0].max_seq_length = cfg.max_doc_length


def keep_epoch(run: Run, epoch: int) -> None:
    """Save a validated epoch: as ``epoch-E/`` when ``train.keep_epochs`` keeps it (and the last), and as
    ``selected/`` when a selection rule other than ``last`` changes its choice to it, to one of its mixtures with
    the warm start, or back to the warm start."""
    cfg = run.cfg
    if not run.world.is_main:
        return
    if epoch in cfg.keep_epochs or epoch == cfg.epochs:
        write_checkpoint(run, run.paths.checkpoint(run.warm_start, epoch, run.name), epoch)
    if cfg.selection.rule == "last":
        return
    history, sets = run.state.history, cfg.validation_sets
    chosen = selection.select_row(history, sets, cfg.selection)
    earlier = [row for row in history if row["epoch"] < epoch]
    if earlier and place(selection.select_row(earlier, sets, cfg.selection)) == place(chosen):
        return  # selected/ holds it already
    if chosen["epoch"] not in (epoch, 0):
        return  # the rules change their choice only to a row of this epoch, or back to the warm start
    # The warm start, which the one-standard-error rule can come back to after training, is the anchor's weights.
    weight = alpha(chosen) if chosen["epoch"] == epoch else 0.0
    folder = run.paths.selected_checkpoint(run.warm_start, run.name)
    meta = {"selected_by": cfg.selection.rule, **({} if alpha(chosen) == 1.0 else {"alpha": alpha(chosen)})}
    if weight == 1.0:
        write_checkpoint(run, folder, chosen["epoch"], **meta)
    else:
        with run.anchor.interpolated(run.models.policy, weight):
            write_checkpoint(run, folder, chosen["epoch"], **meta)


def record_time(path: Path, epoch: int, seconds: float, processes: int, device) -> None:
    """Add one epoch's wall time to ``Paths.timings`` (a resumed run keeps the epochs measured before)."""
    try:
        record = json.loads(path.read_text())
    except (OSError, ValueError):
        record = {}
    epochs = {k: v for k, v in record.get("epoch_seconds", {}).items() if int(k) < epoch}
    epochs[str(epoch)] = round(seconds, 3)
    write_json(path, {"epoch_seconds": epochs, "processes": processes, "device": str(device),
                      "threads": torch.get_num_threads()})


def write_curve(path: Path, points: list[dict]) -> None:
    """Write ``curve.csv`` atomically: every per-step point of the finished epochs, from the trainer state."""
    header = "step,epoch,loss,utility,grad_norm,entropy\n"
    rows = "".join(f"{p['step']},{p['epoch']},{p['loss']:.8g},{p['utility']:.8g},{p['grad_norm']:.8g},{p['entropy']:.8g}\n"
                   for p in points)
    write_text(path, header + rows)


def write_validation(path: Path, history: list[dict]) -> None:
    """Write ``validation.csv`` atomically: DVC's plot of the validation history, one row per epoch as trained
    (``epoch``, ``val_ndcg@10`` in domain, then ``val_<set>_ndcg@10`` of each out-of-domain set).

    ``history.json`` keeps every row, the warm-start mixtures and the per-query figures included; its rows differ in
    their keys (a mixture has an ``alpha``, an epoch as trained none), and DVC plots no file whose rows do, so the plot
    reads this file, whose rows all have the same columns.
    """
    rows = [row for row in history if alpha(row) == 1.0]
    sets = [key for key in dict.fromkeys(k for row in rows for k in row)
            if key.startswith("val_") and key != in_domain_key()]
    out = io.StringIO()
    writer = csv.writer(out, lineterminator="\n")
    writer.writerow(["epoch", in_domain_key(), *sets])
    for row in rows:
        writer.writerow([row["epoch"], *(_figure(row.get(key)) for key in (in_domain_key(), *sets))])
    write_text(path, out.getvalue())


def _figure(value) -> str:
    return "" if value is None else f"{value:.8g}"
