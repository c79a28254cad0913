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

:func:`train` goes in named steps over one :class:`pgrank.training.run.Run`: :func:`setup` (the data, the
models from one read of each weight file, :mod:`pgrank.training.warm_start`, the optimizer), :func:`resume`,
then per epoch :func:`train_epoch` (the updates, :mod:`pgrank.training.step`) and :func:`end_epoch`
(validation; the checkpoints, curve and timings of :mod:`pgrank.training.epoch_records`; the resumable state),
and :func:`finish`.
"""

from __future__ import annotations

import hashlib
import json
import logging
import math
import random
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import torch
from tqdm.auto import tqdm

from pgrank import tracking
from pgrank.atomic import write_json
from pgrank.config import Params
from pgrank.core.history import DISTANCE, METRIC, per_query_key, per_query_set_key, scalars, set_key
from pgrank.core.objectives import OBJECTIVES
from pgrank.errors import PgrankError
from pgrank.paths import Paths, run_key
from pgrank.training import checkpoints, distributed, selection
from pgrank.training.weight_space import Anchor
from pgrank.training.batches import epoch_order
from pgrank.training.epoch_records import keep_epoch, record_time, write_curve, write_validation
from pgrank.training.grad_cache import encode
from pgrank.training.run import Run, open_data
from pgrank.training.step import TrainingError, accumulate_gradients, adamw, clip_gradients
from pgrank.training.step_inputs import Prefetcher, open_tokens, prepare_step
from pgrank.models.packing import packing_off
from pgrank.training.validation_ndcg import averages, validate_queries
from pgrank.training.warm_start import load_models

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class TrainResult:
    model_dir: Path
    final: Path
    history: list[dict]
    registered_version: str | None
    policy: dict  # the history row of the policy: the last epoch as trained, or train.selection's choice


# --------------------------------------------------------------------------------------- setup, resume


def _fingerprint(params: Params, warm_key: str, objective: str, data: Sequence[str | None] = ()) -> str:
    """What resumes a run or invalidates it: its settings, and ``data``, the content digests of the candidate
    stores it trains and validates on (new judgments under the same split name must not resume old state)."""
    # How long to wait changes no result, nor do the other objectives' runs.
    train = params.train.model_dump(mode="json", exclude={"ddp_timeout_minutes", "objectives", "learning_rates",
                                                          "variants", "extra_seeds"})
    train.update(objective=objective, learning_rate=params.train.learning_rate_for(objective))
    blob = json.dumps({"train": train, "data": params.data.train,
                       "validation": [params.data.validation_size, params.data.validation_seed],
                       "warm_start": warm_key, "content": list(data)}, sort_keys=True)
    return hashlib.sha256(blob.encode()).hexdigest()


def setup(params: Params, paths: Paths, warm_start: str, objective: str, device: str | None, *,
          progress: bool, name: str | None = None) -> Run:
    """Resolve the warm start, open the data, build the models (each weight file read once), seed, and make
    the optimizer: everything of a run before its trainer state. ``params.train`` is the run's own
    (:meth:`TrainConfig.for_run`); ``name`` its folders' (:func:`pgrank.paths.run_key`; default ``objective``)."""
    from pgrank.models.names import resolve_model

    cfg = params.train
    world, dev = distributed.setup(device, timeout_minutes=cfg.ddp_timeout_minutes)
    ref = resolve_model(warm_start, params.models)
    # A tower:query checkpoint as the warm start (continual training): its query route trains, its documents stay.
    doc_ref = (checkpoints.document_encoder(ref, params.models) if cfg.tower == "query" else None) or ref
    data = open_data(params, paths, doc_ref, progress=progress and world.is_main)
    fingerprint = _fingerprint(params, ref.key, objective, data.digests())
    random.seed(cfg.seed)
    torch.manual_seed(cfg.seed)
    models = load_models(ref, doc_ref, params, dev,
                         reference=cfg.kl_on(objective) or (cfg.tower == "both" and bool(cfg.document_anchor.coef)))
    model = models.policy
    model.eval()  # the probe must not consume RNG (dropout): resumed runs replay the RNG exactly
    unused = distributed.freeze_unused(
        model, lambda m: encode(m, ["probe"], task="query", max_length=8, amp=cfg.amp).sum())
    if unused:
        log.info("not training %d parameters the embeddings do not use: %s", len(unused), ", ".join(unused[:4]))
    tokens = open_tokens(params, paths, data, models, progress=progress and world.is_main)
    trainable = [p for p in model.parameters() if p.requires_grad]
    optimizer = adamw(trainable, lr=cfg.learning_rate_for(objective), weight_decay=cfg.weight_decay)
    scheduler = torch.optim.lr_scheduler.LambdaLR(
        optimizer, lambda step: min(1.0, (step + 1) / cfg.warmup_steps) if cfg.warmup_steps else 1.0)
    # The warm start's weights, for mixtures with it and the L2 pull toward it (taken before a resume loads state).
    anchored = cfg.l2_to_warm_start > 0 or cfg.selection.interpolation != [1.0] or bool(cfg.selection.within_se)
    return Run(params, paths, warm_start, objective, ref, doc_ref, world, dev, data, fingerprint, models, trainable,
               optimizer, scheduler, anchor=Anchor.of(model) if anchored else None, name=name or objective,
               tokens=tokens)


def resume(run: Run) -> None:
    """Continue from the saved trainer state of these settings (weights, optimizer, scheduler, RNG), or start
    afresh; then keep in the output only this configuration's work, and wrap the policy for DDP."""
    from pgrank.models.loading import load_encoder

    paths, model = run.paths, run.models.policy
    state_dir = paths.train_state(run.warm_start, run.name)
    state = checkpoints.load_state(state_dir)
    if state is not None and state.fingerprint != run.fingerprint:
        log.warning("%s: settings changed since this state was saved; starting over", state_dir)
        state = None
    if state is not None:
        saved = load_encoder(str(state_dir / "model"), run.params.models, device=str(run.device))
        model.load_state_dict(saved.state_dict())
        run.optimizer.load_state_dict(state.optimizer)
        run.scheduler.load_state_dict(state.scheduler)
        checkpoints.restore_rng(state)
        log.info("resuming %s after epoch %d (step %d)", run.warm_start, state.epoch, state.step)
    else:
        state = checkpoints.TrainerState(epoch=0, step=0, fingerprint=run.fingerprint)
        if run.world.is_main:
            (paths.training_log(run.warm_start, run.name) / "curve.csv").unlink(missing_ok=True)  # a fresh curve
    if run.world.is_main:
        # The output (DVC `persist`, so that a killed run resumes) holds only this configuration's work.
        model_dir = paths.model_dir(run.warm_start, run.name)
        stale = checkpoints.prune(model_dir, run.fingerprint, state.epoch)
        if stale:
            log.info("%s: removed %s, left by another configuration or an unfinished epoch", model_dir, ", ".join(stale))
    run.state = state
    model.train()
    run.forward = distributed.wrap(model, run.world, run.device)
    run.no_sync = distributed.no_sync(run.forward)


# --------------------------------------------------------------------------------------- validation


def validated(run: Run) -> dict:
    """In-domain (``val_<metric>``) and out-of-domain (``val_<set>_<metric>``) validation metrics, the weights'
    distance from the warm start's when the run holds them, and with ``selection.within_se`` or ``guard: noise``
    the nDCG@10 of each query of every set (:mod:`pgrank.core.history`)."""
    data, model = run.data, run.models.policy
    queries = validate_queries(model, data.validation, data.validation_qrels, run.params, frozen=data.frozen,
                               documents=run.tokens.documents, queries=run.tokens.validation_queries, world=run.world)
    row: dict = {f"val_{k}": v for k, v in averages(queries).items()}
    per_query = selection.per_query_needed(run.cfg.selection)
    if per_query:
        row[per_query_key()] = {q: m[METRIC] for q, m in queries.items()}
    if run.anchor is not None:
        row[DISTANCE] = run.anchor.distance(model)
    for vs in data.out_of_domain:
        theirs = validate_queries(model, vs.examples, vs.qrels, run.params, frozen=vs.frozen,
                                  documents=run.tokens.validation.get(vs.name),
                                  queries=run.tokens.ood_queries[vs.name], world=run.world)
        row.update({set_key(vs.name, k): v for k, v in averages(theirs).items()})
        if per_query:
            row[per_query_set_key(vs.name)] = {q: m[METRIC] for q, m in theirs.items()}
    return row


def validate_mixtures(run: Run, epoch: int, tracker) -> None:
    """Validate the epoch's mixtures with the warm start (``train.selection.interpolation`` below 1) and add their
    rows to the history (:mod:`pgrank.training.weight_space`)."""
    for weight in [a for a in run.cfg.selection.interpolation if a < 1.0]:
        with run.anchor.interpolated(run.models.policy, weight):
            metrics = validated(run)
        run.state.history.append({"epoch": epoch, "alpha": weight, **metrics})
        figures = scalars(metrics)
        tracking.log_metrics(tracker, {f"alpha{weight:g}_{k}": v for k, v in figures.items()}, step=run.state.step)
        if run.world.is_main:
            log.info("epoch %d, alpha %g: %s", epoch, weight, ", ".join(f"{k}={v:.4f}" for k, v in figures.items()))


# --------------------------------------------------------------------------------------- epochs


def train_epoch(run: Run, epoch: int, tracker, *, progress: bool) -> tuple[dict, float, list[dict]]:
    """One epoch of updates: its mean loss and utility, its wall time and its per-step curve points."""
    cfg, state, dev, world = run.cfg, run.state, run.device, run.world
    order = epoch_order(len(run.data.train), cfg.seed, epoch, cfg.queries_per_epoch)
    batches = [order[i : i + cfg.batch_size] for i in range(0, len(order), cfg.batch_size)]
    bar = tqdm(batches, desc=f"epoch {epoch}/{cfg.epochs}", disable=not (progress and world.is_main), unit="batch")
    sums = {"loss": 0.0, "utility": 0.0}
    curve: list[dict] = []
    epoch_started = time.perf_counter()
    policy = run.models.policy

    def prepare(batch_ids):
        local = run.data.train.examples(distributed.shard(batch_ids, world))
        return prepare_step(local, run.params, run.tokens, epoch=epoch, model=policy, device=dev)

    started = time.perf_counter()
    for batch_ids, inputs in zip(bar, Prefetcher(prepare, batches)):
        stats = accumulate_gradients(policy, inputs, run.params, epoch=epoch, frozen=run.data.frozen,
                                     forward=run.forward, no_sync=run.no_sync, reference=run.models.reference,
                                     objective=run.objective)
        if cfg.l2_to_warm_start:
            run.anchor.add_l2_gradient(run.models.policy, cfg.l2_to_warm_start)
        norm = float(clip_gradients(run.trainable, cfg.grad_clip or math.inf))  # the step's one read
        if not math.isfinite(norm):
            raise TrainingError(
                f"epoch {epoch}, step {state.step + 1}: the gradient norm is {norm}; stopped before "
                f"updating. The last good checkpoint and resumable state are in "
                f"{run.paths.model_dir(run.warm_start, run.name)}. Lower train.learning_rate or raise "
                "train.pg.temperature.")
        run.optimizer.step()
        run.scheduler.step()
        run.optimizer.zero_grad(set_to_none=True)
        state.step += 1
        loss = distributed.all_mean(stats.loss, world, dev)
        utility = distributed.all_mean(stats.utility, world, dev)
        point = {"step": state.step, "epoch": epoch, "loss": loss, "utility": utility,
                 "grad_norm": norm, "entropy": stats.entropy}
        curve.append(point)
        logged = {k: point[k] for k in ("loss", "utility", "grad_norm", "entropy")}
        if cfg.kl_on(run.objective):
            logged["kl"] = distributed.all_mean(stats.kl, world, dev)
        if cfg.document_anchor.coef:
            logged["drift"] = distributed.all_mean(stats.drift, world, dev)
        tracking.log_metrics(tracker, logged, step=state.step)
        sums["loss"] += loss
        sums["utility"] += utility
        now = time.perf_counter()
        rate, started = len(batch_ids) / max(now - started, 1e-9), now
        bar.set_postfix(loss=f"{loss:.4f}", utility=f"{utility:.4f}", q_s=f"{rate:.1f}",
                        rankings_s=f"{rate * cfg.pg.num_samples:.0f}")
    seconds = time.perf_counter() - epoch_started  # the updates alone: validation is the same for every loss
    means = {"train_loss": sums["loss"] / len(batches), "train_utility": sums["utility"] / len(batches)}
    return means, seconds, curve


def end_epoch(run: Run, epoch: int, means: dict, seconds: float, curve: list[dict], tracker) -> None:
    """Validate the epoch, record it (history, MLflow, checkpoints, curve, timings) and save the resumable state."""
    state, paths = run.state, run.paths
    row = {"epoch": epoch, **means, **validated(run)}
    state.history.append(row)
    figures = {k: v for k, v in scalars(row).items() if k != "epoch"}
    tracking.log_metrics(tracker, {**figures, "epoch_seconds": seconds}, step=state.step)
    validate_mixtures(run, epoch, tracker)
    if run.world.is_main:
        log.info("epoch %d: %s", epoch, ", ".join(f"{k}={v:.4f}" for k, v in figures.items()))
        keep_epoch(run, epoch)
        state.epoch = epoch
        state.optimizer, state.scheduler = run.optimizer.state_dict(), run.scheduler.state_dict()
        checkpoints.capture_rng(state)
        state.mlflow_run_id = tracker.info.run_id if tracker is not None else None
        state.curve += curve  # the state holds the whole curve: DVC deletes curve.csv before a rerun
        log_dir = paths.training_log(run.warm_start, run.name)
        write_curve(log_dir / "curve.csv", state.curve)
        record_time(paths.timings(run.warm_start, run.name), epoch, seconds, run.world.size, run.device)
        checkpoints.save_state(paths.train_state(run.warm_start, run.name), run.models.policy, state)
    distributed.barrier(run.world)


# --------------------------------------------------------------------------------------- finish

PROVENANCE = "queries.json"  # the training run's artifact provenance/queries.json


def provenance(run: Run) -> dict:
    """What the model learned from: the query ids it trained on and was selected with, and its warm start (the
    champion gate refuses a model whose recorded queries meet the gate set, :mod:`pgrank.pipeline.provenance`)."""
    return {"data.train": run.params.data.train, "warm_start": run.ref.key, "train": list(run.data.train.store.qids),
            "validation": list(run.data.validation.store.qids)}


def finish(run: Run, tracker) -> TrainResult:
    """The policy (the last epoch, or the one ``train.selection`` chose), its history written and logged, its
    model registered; the resumable state removed."""
    cfg, state, paths = run.cfg, run.state, run.paths
    final = paths.checkpoint(run.warm_start, cfg.epochs, run.name)
    if cfg.selection.rule != "last":
        final = paths.selected_checkpoint(run.warm_start, run.name)
        chosen = selection.summary(state.history, cfg.validation_sets, cfg.selection)
        log.info("selected epoch %s by rule %s: %s", chosen["epoch"], cfg.selection.rule,
                 ", ".join(f"{k}={v:+.4f}" if k.endswith("gain") else f"{k}={v}" for k, v in chosen.items()))
        held = selection.held_back_by(state.history, cfg.validation_sets, cfg.selection)
        if held:
            log.info("the out-of-domain guard (%s) rejects the best in-domain point on %s", cfg.selection.guard,
                     ", ".join(held))
        if chosen.get("accepted") == 0:
            log.info("no epoch or mixture passes the out-of-domain guard (%s) on %s: the policy is the warm start",
                     cfg.selection.guard, ", ".join(cfg.validation_sets))
        tracking.log_metrics(tracker, {f"selected_{k}": v for k, v in chosen.items() if k not in ("rule", "guard")})
        if tracker is not None:
            import mlflow

            mlflow.set_tags({"pgrank.selection.rule": cfg.selection.rule, "pgrank.selection.epoch": chosen["epoch"],
                             "pgrank.selection.alpha": chosen["alpha"],
                             **({"pgrank.selection.guard": chosen["guard"],
                                 "pgrank.selection.warm_start_fallback": chosen["accepted"] == 0,
                                 "pgrank.selection.held_back_by": ", ".join(held)}
                                if "guard" in chosen else {})})
    version = None
    if run.world.is_main:
        log_dir = paths.training_log(run.warm_start, run.name)
        write_curve(log_dir / "curve.csv", state.curve)  # also when resumed at the end
        write_json(log_dir / "history.json", state.history)
        write_validation(log_dir / "validation.csv", state.history)  # the history as DVC plots it
        if tracker is not None:
            tracking.log_artifact(tracker, str(log_dir / "history.json"))
            with tempfile.TemporaryDirectory(prefix=".provenance-", dir=log_dir) as tmp:
                write_json(Path(tmp) / PROVENANCE, provenance(run))
                tracking.log_artifact(tracker, str(Path(tmp) / PROVENANCE), "provenance")
            from sentence_transformers import SentenceTransformer

            version = tracking.log_model(tracker, SentenceTransformer(str(final), device="cpu"),
                                         registered_name=run.params.tracking.registered_model)
        checkpoints.remove(paths.train_state(run.warm_start, run.name))
    return TrainResult(paths.model_dir(run.warm_start, run.name), final, state.history, version,
                       selection.select_row(state.history, cfg.validation_sets, cfg.selection))


# --------------------------------------------------------------------------------------- the stage


def train(params: Params, paths: Paths, warm_start: str, *, objective: str = "pg", seed: int | None = None,
          device: str | None = None, progress: bool = True) -> TrainResult:
    """Train Neural PG-Rank (``objective`` pg; or another loss of ``train.objectives``, or a ``train.variants``
    name) from ``warm_start`` (an alias, hub id or folder) on ``data.train``, with
    ``train.learning_rates[objective]`` if set, at ``seed`` (``None``: ``train.seed``; one of
    ``train.extra_seeds`` trains the run ``<objective>.s<seed>``, :func:`pgrank.paths.run_key`).

    With ``R`` that run's name: writes ``Paths.checkpoint(warm_start, e, R)`` for every kept epoch (and the last),
    under ``Paths.training_log(warm_start, R)`` ``history.json`` (per-epoch validation metrics) and
    ``curve.csv`` (per-step loss, utility, gradient norm, entropy), and the wall time of each epoch's
    updates to ``Paths.timings(warm_start, R)``. The steps: :func:`setup`, :func:`resume`, then per
    epoch :func:`train_epoch` and :func:`end_epoch` (validation and selection), and :func:`finish`.

    Raises:
        TrainingError: missing candidates, or a non-finite loss or gradient (the last good
            checkpoint and resumable state are kept).
    """
    if objective not in OBJECTIVES and objective not in params.train.variants:
        raise PgrankError(f"objective {objective!r}: expected one of {', '.join(OBJECTIVES)} or a train.variants name")
    name = run_key(objective, None if seed in (None, params.train.seed) else seed)
    loss = params.train.objective_of(objective)
    params = params.model_copy(update={"train": params.train.for_run(objective, seed)})
    run = setup(params, paths, warm_start, loss, device, progress=progress, name=name)
    resume(run)
    cfg, state = run.cfg, run.state
    run_params = {"train": cfg.model_dump(mode="json"), "data.train": params.data.train, "warm_start": run.ref.key,
                  "objective": run.objective, "run": name, "learning_rate": cfg.learning_rate,
                  **({"document_encoder": run.doc_ref.key} if cfg.tower == "query" else {})}
    # A resumed run links the run that saved the state it continues (killed runs are marked KILLED).
    resumed = {"pgrank.resumed_from": state.mlflow_run_id} if state.epoch and state.mlflow_run_id else {}
    run_name = f"train-{warm_start}" + ("" if name == "pg" else f"-{name}")
    with tracking.stage_run(params, paths, run_name, log_params=run_params,
                            tags={"stage": "train", "warm_start": warm_start, "objective": run.objective, "run": name,
                                  "seed": str(cfg.seed), **resumed},
                            enabled=run.world.is_main and params.tracking.enabled, resources=True) as tracker:
        if packing_off(run.models.policy):  # the probe switched packing off (pgrank.models.packing logs why, once)
            tracking.log_metrics(tracker, {"packing_off": 1.0}, step=0)
        if state.epoch == 0 and not state.history:
            metrics = validated(run)
            state.history.append({"epoch": 0, **metrics})
            tracking.log_metrics(tracker, scalars(metrics), step=0)
            keep_epoch(run, 0)
        for epoch in range(state.epoch + 1, cfg.epochs + 1):
            if selection.should_stop(state.history, cfg.validation_sets, cfg.selection):
                log.info("early stopping before epoch %d: epoch %d is still the selected one (patience %d)", epoch,
                         selection.select_epoch(state.history, cfg.validation_sets, cfg.selection), cfg.selection.patience)
                break
            means, seconds, curve = train_epoch(run, epoch, tracker, progress=progress)
            end_epoch(run, epoch, means, seconds, curve, tracker)
        result = finish(run, tracker)
    distributed.teardown(run.world)
    return result
