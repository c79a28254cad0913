"""The policy-gradient training stage, ``pgrank train`` (paper Sec. "Method", "Ranking Policy").

A warm-start sentence-transformers bi-encoder scores each training query's mined candidate set,
``s(q, d) = phi(eta(q), eta(d))``; the scores define the Plackett-Luce policy ``PL(s / T)`` and
:func:`pgrank.core.estimators.policy_gradient` gives the surrogate loss (per-rank nDCG@10 credit with the
leave-one-out baseline and the entropy bonus by default). Two modes (``train.tower``):

* ``both`` (the paper): queries and candidates are re-encoded with gradients every step; candidates
  go through cached-gradient chunking (:mod:`pgrank.training.grad_cache`), so memory depends on
  ``train.grad_chunk_size``, not on the 1000 candidates per query.
* ``query``: document embeddings are frozen and read from the corpus-embedding artifact; only the
  query side trains. The checkpoint is a query/document ``Router`` model (see
  :mod:`pgrank.training.checkpoints`), and the corpus index never needs rebuilding.

Training runs on the carved ``train-pg`` split of ``data.train`` and reports nDCG@10 on the carved
``validation`` split before training (epoch 0) and after every epoch. It is deterministic for a
seed, resumes from the last finished epoch after a kill (same final weights), stops on a non-finite
loss or gradient keeping the last good checkpoint, runs data-parallel under ``torchrun``, and logs
to MLflow from rank 0.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import json
import logging
import math
import random
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import torch
from tqdm.auto import tqdm

from pgrank import tracking
from pgrank.atomic import write_json, write_text
from pgrank.config import Params
from pgrank.core.objectives import OBJECTIVES
from pgrank.errors import PgrankError
from pgrank.paths import CARVED_TRAIN, VALIDATION, Paths
from pgrank.training import checkpoints, distributed, selection
from pgrank.training.batches import (
    Batch,
    FrozenDocuments,
    candidate_scores,
    epoch_order,
    frozen_documents,
    make_batch,
    query_generators,
    training_set,
)
from pgrank.training.grad_cache import backward_cached, encode, encode_cached
from pgrank.training.reference import ReferencePolicy
from pgrank.training.validation_ndcg import out_of_domain_set, qrels_by_row, validate

log = logging.getLogger(__name__)



class TrainingError(PgrankError):
    """Training cannot go on (non-finite loss or gradient, no training data)."""


@dataclass(frozen=True)
class StepStats:
    loss: float
    utility: float
    entropy: float
    kl: float = 0.0


@dataclass(frozen=True)
class TrainResult:
    model_dir: Path
    final: Path
    history: list[dict]
    registered_version: str | None


# --------------------------------------------------------------------------------------- one step


def accumulate_gradients(model, batch: Batch, params: Params, *, epoch: int, frozen: FrozenDocuments | None,
                         corpus=None, forward=None, no_sync=None, reference: ReferencePolicy | None = None,
                         objective: str = "pg") -> StepStats:
    """Forward and backward of one (local) batch; leaves the gradients in ``model``'s parameters.

    Args:
        model: the trainable sentence-transformers model (``forward``: its DDP wrapper, if any).
        batch: queries, candidates, grades and mask.
        frozen: document embeddings for ``tower: query`` (``None`` for ``tower: both``).
        corpus: the corpus store for ``tower: both`` (only the batch's documents are read).
        no_sync: DDP's ``no_sync`` factory; all but the last backward then accumulate locally.
        reference: the frozen warm start, for ``train.pg.kl_coef > 0`` (:mod:`pgrank.training.reference`).

    The loss is ``objective``'s (:data:`pgrank.core.objectives.OBJECTIVES`, one of ``train.objectives``): the
    paper's policy gradient, or one of the standard losses on the same candidates with the same temperature.
    """
    cfg = params.train
    device = batch.relevance.device
    gens = query_generators(cfg.seed, epoch, [ex.qid for ex in batch.examples], device)
    enc = dict(amp=cfg.amp, forward=forward)
    first = no_sync() if (no_sync is not None and cfg.tower == "both") else contextlib.nullcontext()
    with first:
        q = encode(model, [ex.query for ex in batch.examples], task="query", max_length=cfg.max_query_length, **enc)
        if cfg.tower == "query":
            docs, texts, states = frozen.vectors(batch.unique_rows, device), None, None
        else:
            texts = corpus.texts(batch.unique_rows)
            docs, states = encode_cached(model, texts, chunk_size=cfg.grad_chunk_size, task="document",
                                         max_length=cfg.max_doc_length, **enc)
        scores = candidate_scores(q, docs, batch.index, cfg.similarity)
        pg = cfg.pg
        if objective == "pg":
            ref_scores = reference.scores(batch, frozen=frozen, corpus=corpus) if pg.kl_coef else None
            knobs = dict(num_samples=pg.num_samples, utility=pg.utility, estimator=pg.estimator, baseline=pg.baseline,
                         entropy_coef=pg.entropy_coef, entropy=pg.entropy, reference_scores=ref_scores,
                         kl_coef=pg.kl_coef, kl=pg.kl)
        else:
            knobs = {}
        out = OBJECTIVES[objective](scores, batch.relevance, batch.mask, temperature=pg.temperature,
                                        generator=gens, **knobs)
        if not torch.isfinite(out.loss):
            raise TrainingError(f"epoch {epoch}: the loss is {out.loss.item()} (queries {[e.qid for e in batch.examples][:5]})")
        out.loss.backward()
    if cfg.tower == "both":
        backward_cached(model, texts, docs.grad, states, chunk_size=cfg.grad_chunk_size, task="document",
                        max_length=cfg.max_doc_length, no_sync=no_sync, **enc)
    return StepStats(out.loss.item(), out.utility.item(), out.entropy.item(), out.kl.item())


# --------------------------------------------------------------------------------------- the stage


def _fingerprint(params: Params, warm_key: str, objective: str, data: Sequence[str | None] = ()) -> str:
    """What resumes a run or invalidates it: its settings, and ``data``, the content digests of the candidate
    stores it trains and validates on (new judgments under the same split name must not resume old state)."""
    # How long to wait changes no result, nor do the other objectives' runs.
    train = params.train.model_dump(mode="json", exclude={"ddp_timeout_minutes", "objectives", "learning_rates"})
    train.update(objective=objective, learning_rate=params.train.learning_rate_for(objective))
    blob = json.dumps({"train": train, "data": params.data.train,
                       "validation": [params.data.validation_size, params.data.validation_seed],
                       "warm_start": warm_key, "content": list(data)}, sort_keys=True)
    return hashlib.sha256(blob.encode()).hexdigest()


def _policy_model(ref, doc_ref, params: Params, dev):
    """The warm start as the trained policy is built from it (frozen here: the KL reference)."""
    from pgrank.models.hub import load_encoder

    model = load_encoder(ref, params.models, device=str(dev), max_seq_length=params.train.max_doc_length)
    if doc_ref is not ref:
        model = checkpoints.query_route(model)
    model.similarity_fn_name = params.train.similarity
    return model


def train(params: Params, paths: Paths, warm_start: str, *, objective: str = "pg", device: str | None = None,
          progress: bool = True) -> TrainResult:
    """Train Neural PG-Rank (``objective`` pg; or another loss of ``train.objectives``) from ``warm_start`` (an
    alias, hub id or folder) on ``data.train``, with ``train.learning_rates[objective]`` if set.

    Writes ``Paths.checkpoint(warm_start, e, objective)`` for every kept epoch (and the last), under
    ``Paths.training_log(warm_start, objective)`` ``history.json`` (per-epoch validation metrics) and
    ``curve.csv`` (per-step loss, utility, gradient norm, entropy), and the wall time of each epoch's
    updates to ``Paths.timings(warm_start, objective)``.

    Raises:
        TrainingError: missing candidates, or a non-finite loss or gradient (the last good
            checkpoint and resumable state are kept).
    """
    from pgrank.data.beir import load_topics
    from pgrank.data.corpus_store import open_corpus
    from pgrank.models.hub import load_encoder, resolve_model

    cfg = params.train
    if objective not in OBJECTIVES:
        raise PgrankError(f"objective {objective!r}: expected one of {', '.join(OBJECTIVES)}")
    learning_rate = cfg.learning_rate_for(objective)
    dataset = params.data.train.split("/")[0]
    world, dev = distributed.setup(device, timeout_minutes=cfg.ddp_timeout_minutes)
    ref = resolve_model(warm_start, params.models)
    # A tower:query checkpoint as the warm start (continual training): its query route trains, its documents stay.
    doc_ref = (checkpoints.document_encoder(ref, params.models) if cfg.tower == "query" else None) or ref
    model_dir, state_dir = paths.model_dir(warm_start, objective), paths.train_state(warm_start, objective)
    log_dir, timings = paths.training_log(warm_start, objective), paths.timings(warm_start, objective)

    # Every rank memory-maps the same corpus and candidate stores: nothing of either is a private copy.
    corpus = open_corpus(paths, dataset, progress=progress and world.is_main)
    train_examples = training_set(paths, dataset, CARVED_TRAIN, corpus)
    val_examples = training_set(paths, dataset, VALIDATION, corpus)
    val_qrels = qrels_by_row(load_topics(paths, dataset, VALIDATION)[1], corpus)
    frozen = frozen_documents(params, paths, doc_ref, corpus) if cfg.tower == "query" else None
    ood = [out_of_domain_set(params, paths, name, doc_ref) for name in cfg.validation_sets]
    fingerprint = _fingerprint(params, ref.key, objective,
                               [s.store.meta.get("sha256") for s in (train_examples, val_examples, *(v.examples for v in ood))])

    reference = None
    if objective == "pg" and cfg.pg.kl_coef:  # loaded before seeding: the run's random stream stays the same
        reference = ReferencePolicy(_policy_model(ref, doc_ref, params, dev), cfg)

    random.seed(cfg.seed)
    torch.manual_seed(cfg.seed)
    model = _policy_model(ref, doc_ref, params, dev)
    model.eval()  # the probe must not consume RNG (dropout): resumed runs replay the RNG exactly
    unused = distributed.freeze_unused(
        model, lambda m: encode(m, ["probe"], task="query", max_length=8, amp=cfg.amp).sum())
    if unused:
        log.info("not training %d parameters the embeddings do not use: %s", len(unused), ", ".join(unused[:4]))
    trainable = [p for p in model.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(trainable, lr=learning_rate, weight_decay=cfg.weight_decay)
    scheduler = torch.optim.lr_scheduler.LambdaLR(
        optimizer, lambda step: min(1.0, (step + 1) / cfg.warmup_steps) if cfg.warmup_steps else 1.0)

    state = checkpoints.load_state(state_dir)
    if state is not None and state.fingerprint != fingerprint:
        log.warning("%s: settings changed since this state was saved; starting over", state_dir)
        state = None
    if state is not None:
        saved = load_encoder(str(state_dir / "model"), params.models, device=str(dev))
        model.load_state_dict(saved.state_dict())
        optimizer.load_state_dict(state.optimizer)
        scheduler.load_state_dict(state.scheduler)
        checkpoints.restore_rng(state)
        log.info("resuming %s after epoch %d (step %d)", warm_start, state.epoch, state.step)
    else:
        state = checkpoints.TrainerState(epoch=0, step=0, fingerprint=fingerprint)
        if world.is_main:
            (log_dir / "curve.csv").unlink(missing_ok=True)  # a fresh run starts a fresh curve
    if world.is_main:
        # The output (DVC `persist`, so that a killed run resumes) holds only this configuration's work.
        stale = checkpoints.prune(model_dir, fingerprint, state.epoch)
        if stale:
            log.info("%s: removed %s, left by another configuration or an unfinished epoch", model_dir, ", ".join(stale))
    model.train()
    forward = distributed.wrap(model, world, dev)
    no_sync = distributed.no_sync(forward)

    # The frozen document side of a `tower: query` checkpoint: the warm start, loaded once when first saved.
    document_model = functools.cache(
        lambda: load_encoder(doc_ref, params.models, device=str(dev), max_seq_length=cfg.max_doc_length))

    def write_checkpoint(folder: Path, epoch: int, **extra) -> None:
        """The model as a sentence-transformers checkpoint (``tower: query``: with the frozen document side)."""
        meta = {"warm_start": warm_start, "warm_start_model": ref.key, "objective": objective, "tower": cfg.tower, "epoch": epoch,
                "similarity": cfg.similarity, "fingerprint": fingerprint, **extra,
                "document_encoder": doc_ref.key if cfg.tower == "query" else None}
        doc_model = None
        if cfg.tower == "query":
            doc_model = document_model()
            model[0].max_seq_length = cfg.max_query_length
        checkpoints.save_model(model, folder, meta, document_model=doc_model)
        if cfg.tower == "query":
            model[0].max_seq_length = cfg.max_doc_length

    def save(epoch: int) -> None:
        if world.is_main and (epoch in cfg.keep_epochs or epoch == cfg.epochs):
            write_checkpoint(paths.checkpoint(warm_start, epoch, objective), epoch)

    def keep_selected(epoch: int) -> None:
        """Under a selection rule, the epoch just validated becomes ``selected/`` when the rule picks it."""
        if not world.is_main or cfg.selection.rule == "last":
            return
        if selection.select_epoch(state.history, cfg.validation_sets, cfg.selection) == epoch:
            write_checkpoint(paths.selected_checkpoint(warm_start, objective), epoch, selected_by=cfg.selection.rule)

    run_params = {"train": params.train.model_dump(mode="json"), "data.train": params.data.train, "warm_start": ref.key,
                  "objective": objective, "learning_rate": learning_rate,
                  **({"document_encoder": doc_ref.key} if cfg.tower == "query" else {})}
    # A resumed run links the run that saved the state it continues (killed runs are marked KILLED).
    resumed = {"pgrank.resumed_from": state.mlflow_run_id} if state.epoch and state.mlflow_run_id else {}
    run_name = f"train-{warm_start}" + ("" if objective == "pg" else f"-{objective}")
    with tracking.stage_run(params, paths, run_name, log_params=run_params,
                            tags={"stage": "train", "warm_start": warm_start, "objective": objective, **resumed},
                            enabled=world.is_main and params.tracking.enabled, resources=True) as run:
        def validated() -> dict[str, float]:
            """In-domain (``val_<metric>``) and out-of-domain (``val_<set>_<metric>``) validation metrics."""
            row = {f"val_{k}": v for k, v in
                   validate(model, val_examples, val_qrels, params, frozen=frozen, corpus=corpus, world=world).items()}
            for vs in ood:
                metrics = validate(model, vs.examples, vs.qrels, params, frozen=vs.frozen, corpus=vs.corpus, world=world)
                row.update({selection.set_key(vs.name, k): v for k, v in metrics.items()})
            return row

        if state.epoch == 0 and not state.history:
            metrics = validated()
            state.history.append({"epoch": 0, **metrics})
            tracking.log_metrics(run, metrics, step=0)
            save(0)
            keep_selected(0)
        curve: list[dict] = []
        for epoch in range(state.epoch + 1, cfg.epochs + 1):
            if selection.should_stop(state.history, cfg.validation_sets, cfg.selection):
                log.info("early stopping before epoch %d: epoch %d is still the selected one (patience %d)", epoch,
                         selection.select_epoch(state.history, cfg.validation_sets, cfg.selection), cfg.selection.patience)
                break
            order = epoch_order(len(train_examples), cfg.seed, epoch, cfg.queries_per_epoch)
            batches = [order[i : i + cfg.batch_size] for i in range(0, len(order), cfg.batch_size)]
            bar = tqdm(batches, desc=f"epoch {epoch}/{cfg.epochs}", disable=not (progress and world.is_main), unit="batch")
            sums = {"loss": 0.0, "utility": 0.0}
            epoch_started = time.perf_counter()
            for batch_ids in bar:
                started = time.perf_counter()
                local = train_examples.examples(distributed.shard(batch_ids, world))
                stats = accumulate_gradients(model, make_batch(local, dev), params, epoch=epoch, frozen=frozen,
                                             corpus=corpus, forward=forward, no_sync=no_sync, reference=reference,
                                             objective=objective)
                norm = torch.nn.utils.clip_grad_norm_(trainable, cfg.grad_clip or math.inf)
                if not torch.isfinite(norm):
                    raise TrainingError(
                        f"epoch {epoch}, step {state.step + 1}: the gradient norm is {norm.item()}; stopped before "
                        f"updating. The last good checkpoint and resumable state are in {model_dir}. Lower "
                        "train.learning_rate or raise train.pg.temperature.")
                optimizer.step()
                scheduler.step()
                optimizer.zero_grad(set_to_none=True)
                state.step += 1
                loss = distributed.all_mean(stats.loss, world, dev)
                utility = distributed.all_mean(stats.utility, world, dev)
                point = {"step": state.step, "epoch": epoch, "loss": loss, "utility": utility,
                         "grad_norm": norm.item(), "entropy": stats.entropy}
                curve.append(point)
                logged = {k: point[k] for k in ("loss", "utility", "grad_norm", "entropy")}
                if reference is not None:
                    logged["kl"] = distributed.all_mean(stats.kl, world, dev)
                tracking.log_metrics(run, logged, step=state.step)
                sums["loss"] += loss
                sums["utility"] += utility
                rate = len(batch_ids) / max(time.perf_counter() - started, 1e-9)
                bar.set_postfix(loss=f"{loss:.4f}", utility=f"{utility:.4f}", q_s=f"{rate:.1f}",
                                rankings_s=f"{rate * cfg.pg.num_samples:.0f}")
            seconds = time.perf_counter() - epoch_started  # the updates alone: validation is the same for every loss
            row = {"epoch": epoch, "train_loss": sums["loss"] / len(batches), "train_utility": sums["utility"] / len(batches),
                   **validated()}
            state.history.append(row)
            tracking.log_metrics(run, {**{k: v for k, v in row.items() if k != "epoch"}, "epoch_seconds": seconds},
                                 step=state.step)
            if world.is_main:
                log.info("epoch %d: %s", epoch, ", ".join(f"{k}={v:.4f}" for k, v in row.items() if k != "epoch"))
                save(epoch)
                keep_selected(epoch)
                state.epoch = epoch
                state.optimizer, state.scheduler = optimizer.state_dict(), scheduler.state_dict()
                checkpoints.capture_rng(state)
                state.mlflow_run_id = run.info.run_id if run is not None else None
                state.curve += curve  # the state holds the whole curve: DVC deletes curve.csv before a rerun
                curve = []
                _write_curve(log_dir / "curve.csv", state.curve)
                _record_time(timings, epoch, seconds, world.size, dev)
                checkpoints.save_state(state_dir, model, state)
            distributed.barrier(world)

        final = paths.checkpoint(warm_start, cfg.epochs, objective)
        if cfg.selection.rule != "last":
            final = paths.selected_checkpoint(warm_start, objective)
            chosen = selection.summary(state.history, cfg.validation_sets, cfg.selection)
            log.info("selected epoch %s by rule %s: %s", chosen["epoch"], cfg.selection.rule,
                     ", ".join(f"{k}={v:+.4f}" if k.endswith("gain") else f"{k}={v}" for k, v in chosen.items()))
            tracking.log_metrics(run, {f"selected_{k}": v for k, v in chosen.items() if k != "rule"})
            if run is not None:
                import mlflow

                mlflow.set_tags({"pgrank.selection.rule": cfg.selection.rule, "pgrank.selection.epoch": chosen["epoch"]})
        version = None
        if world.is_main:
            _write_curve(log_dir / "curve.csv", state.curve)  # also when resumed at the end
            write_json(log_dir / "history.json", state.history)
            if run is not None:
                tracking.log_artifact(run, str(log_dir / "history.json"))
                from sentence_transformers import SentenceTransformer

                version = tracking.log_model(run, SentenceTransformer(str(final), device="cpu"),
                                             registered_name=params.tracking.registered_model)
            checkpoints.remove(state_dir)
    distributed.teardown(world)
    return TrainResult(model_dir, final, state.history, version)


def _record_time(path: Path, epoch: int, seconds: float, processes: int, device) -> None:
    """Add one epoch's wall time to ``Paths.timings`` (a resumed run keeps the epochs measured before)."""
    try:
        record = json.loads(path.read_text())
    except (OSError, ValueError):
        record = {}
    epochs = {k: v for k, v in record.get("epoch_seconds", {}).items() if int(k) < epoch}
    epochs[str(epoch)] = round(seconds, 3)
    write_json(path, {"epoch_seconds": epochs, "processes": processes, "device": str(device),
                      "threads": torch.get_num_threads()})


def _write_curve(path: Path, points: list[dict]) -> None:
    """Write ``curve.csv`` atomically: every per-step point of the finished epochs, from the trainer state."""
    header = "step,epoch,loss,utility,grad_norm,entropy\n"
    rows = "".join(f"{p['step']},{p['epoch']},{p['loss']:.8g},{p['utility']:.8g},{p['grad_norm']:.8g},{p['entropy']:.8g}\n"
                   for p in points)
    write_text(path, header + rows)
