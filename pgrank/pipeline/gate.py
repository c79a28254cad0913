"""The gate set, and model versions evaluated side by side on it (the fair champion test).

Gate set (``champion.gate_set``):

* ``frozen`` (default): ``data.train``'s validation queries of the first gated pipeline run, frozen at
  that moment: their judgments, their texts and their candidate sets (read from the carve-out's
  candidate store, :mod:`pgrank.data.candidate_store`, and frozen as a TREC file whose scores are the
  stage-1 ranks, ``n`` down to ``1``: the store keeps the order, not the scores, and reranking needs only
  the sets). They are logged to MLflow as the
  artifacts of a ``gate-set`` run, whose id the registered model carries in the tag ``pgrank.gate_set``,
  so later data cannot change them. Scheduled retraining hands their judgments to the pipeline as
  ``data.holdout`` (:func:`holdout_override`): they stay in the validation carve-out and are never trained
  on, however the training data grows.
* ``dataset/split``: a split you keep fixed yourself (e.g. ``acme/gate``), read as it is now.

Evaluation (:func:`evaluate_version`): a model version is fetched from the registry
(``models:/NAME/VERSION``, kept under ``{root}/registry/<run id>/``) and evaluated like a dense system of
the evaluate stage: queries through the version, documents through its document encoder's
corpus-embedding artifact (for a ``tower: query`` policy the frozen warm start, whose artifact mining
already built), reranking the gate set's candidate sets (``champion.stage: rerank``, streamed in chunks by
:func:`pgrank.evaluation.stage.rerank_runs` from a candidate store of the sets written for the
evaluation) or searching the whole corpus (``full``, :func:`pgrank.evaluation.stage.search_runs`),
scored per query by pytrec_eval. The decision is :func:`pgrank.pipeline.champion.decide`; the gate of a
retraining run as a whole, :func:`pgrank.pipeline.retraining.gate_workspace`.
"""

from __future__ import annotations

import json
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from pgrank.atomic import atomic_path, write_json, write_text
from pgrank.config import GATE_METRIC, Params
from pgrank.data.beir import Qrels, load_qrels, load_topics, write_qrels
from pgrank.data.candidate_store import (
    CandidateStoreWriter,
    open_candidate_store,
    open_candidates,
)
from pgrank.data.runs import ranked, read_run, write_run
from pgrank.errors import PgrankError
from pgrank.paths import VALIDATION, Paths

if TYPE_CHECKING:
    from mlflow.tracking import MlflowClient

GATE_SET_TAG = "pgrank.gate_set"  # on the registered model: the MLflow run holding the frozen gate set
ARTIFACTS = "gate-set"
ST_FOLDER = "model.sentence_transformer"  # where MLflow's sentence_transformers flavor keeps the model


@dataclass(frozen=True)
class GateSet:
    """The queries champion and challenger are both evaluated on."""

    description: str
    dataset: str  # whose corpus the documents come from
    queries: dict[str, str]
    qrels: Qrels
    candidates: dict[str, dict[str, float]] | None  # what champion.stage rerank reranks (None: not mined)
    holdout: Path | None = None  # the judgments file handed to the pipeline as data.holdout (frozen sets)


@dataclass(frozen=True)
class VersionModel:
    """A registered model version, ready to evaluate."""

    version: str
    folder: Path  # a sentence-transformers folder
    document_model: str  # what encodes its documents (a name pgrank.models.names resolves)
    similarity: str


def gate_metrics(params: Params) -> tuple[list[str], list[int], int]:
    """The gate table's metrics, the cut-offs pytrec_eval computes, and the MRR cut-off."""
    cfg = params.champion
    kind, k = GATE_METRIC.match(cfg.metric).groups()
    ks = sorted(set(params.evaluate.ks) | ({int(k)} if kind != "mrr" else set()))
    mrr_k = int(k) if kind == "mrr" else 10
    table = [cfg.metric, *(f"ndcg@{k}" for k in params.evaluate.ks), f"mrr@{mrr_k}", f"recall@{max(ks)}"]
    return list(dict.fromkeys(table)), ks, mrr_k


# --------------------------------------------------------------------------------------- gate sets


def _candidate_sets(paths: Paths, dataset: str, split: str) -> dict[str, dict[str, float]]:
    """``dataset/split``'s candidate sets from its candidate store, as a run whose scores are the stage-1
    ranks (``n`` for the first of ``n`` candidates down to ``1``: the store keeps the order, not the scores).

    Raises:
        DataError: the split has no candidate store (mining has not run).
    """
    from pgrank.data.corpus_store import open_corpus

    store, corpus = open_candidates(paths, dataset, split), open_corpus(paths, dataset)
    sets = {}
    for i, qid in enumerate(store.qids):
        rows, _ = store.candidates(i)
        sets[qid] = {d: float(len(rows) - r) for r, d in enumerate(corpus.ids.take(rows))}
    return sets


def _read(folder: Path) -> GateSet:
    meta = json.loads((folder / "gate.json").read_text(encoding="utf-8"))
    queries = {}
    for line in (folder / "queries.jsonl").read_text(encoding="utf-8").splitlines():
        if line.strip():
            record = json.loads(line)
            queries[record["_id"]] = record["text"]
    return GateSet(meta["description"], meta["dataset"], queries, load_qrels(folder / "qrels.tsv"),
                   read_run(folder / "candidates.trec"), folder / "qrels.tsv")


def _write(folder: Path, meta: dict, queries: dict[str, str], qrels: Qrels, candidates) -> None:
    write_qrels(folder / "qrels.tsv", qrels)
    write_text(folder / "queries.jsonl", "".join(json.dumps({"_id": q, "text": t}) + "\n" for q, t in queries.items()))
    write_run(folder / "candidates.trec", ((q, ranked(candidates[q])) for q in sorted(candidates)), "gate-set")
    write_json(folder / "gate.json", meta)


def _registered_tags(client: MlflowClient, name: str) -> dict[str, str] | None:
    from mlflow.exceptions import MlflowException

    try:
        return dict(client.get_registered_model(name).tags)
    except MlflowException as exc:
        if exc.error_code == "RESOURCE_DOES_NOT_EXIST":
            return None
        raise


def frozen_gate_set(client: MlflowClient, params: Params, paths: Paths) -> GateSet | None:
    """The registered model's frozen gate set, fetched once into ``{root}/gate/<run id>/`` (``None``: not frozen yet)."""
    import mlflow

    run_id = (_registered_tags(client, params.tracking.registered_model) or {}).get(GATE_SET_TAG)
    if run_id is None:
        return None
    folder = paths.root / "gate" / run_id
    if not (folder / "gate.json").is_file():
        with atomic_path(folder, directory=True) as tmp:
            mlflow.artifacts.download_artifacts(run_id=run_id, artifact_path=ARTIFACTS, dst_path=str(tmp),
                                                tracking_uri=client.tracking_uri)
            for file in (tmp / ARTIFACTS).iterdir():
                file.rename(tmp / file.name)
            (tmp / ARTIFACTS).rmdir()
    return _read(folder)


def freeze_gate_set(client: MlflowClient, params: Params, paths: Paths, parent_run_id: str | None) -> GateSet:
    """Freeze ``data.train``'s current validation carve-out (judgments, texts, candidate sets) as the gate set."""
    import mlflow

    from pgrank import tracking

    tracking.configure(params, paths)  # the run goes to the registry's store
    dataset, split = params.data.train.split("/")
    queries, qrels = load_topics(paths, dataset, VALIDATION)
    candidates = _candidate_sets(paths, dataset, VALIDATION)
    manifest = paths.dataset_manifest(dataset)
    meta = {"dataset": dataset, "frozen_from": f"the validation carve-out of {dataset}/{split}",
            "queries": len(qrels), "pipeline_run": parent_run_id,
            "data": json.loads(manifest.read_text()) if manifest.is_file() else None}
    with mlflow.start_run(run_name="gate-set", nested=parent_run_id is not None, parent_run_id=parent_run_id,
                          tags={"stage": "gate-set"}) as run:
        meta["description"] = (f"frozen: {len(qrels)} validation queries of {dataset}/{split}, frozen by run "
                               f"{run.info.run_id[:8]}")
        folder = paths.root / "gate" / run.info.run_id
        with atomic_path(folder, directory=True) as tmp:
            _write(tmp, meta, queries, qrels, candidates)
            mlflow.log_artifacts(str(tmp), ARTIFACTS)
    client.set_registered_model_tag(params.tracking.registered_model, GATE_SET_TAG, run.info.run_id)
    return _read(folder)


def named_gate_set(params: Params, paths: Paths) -> GateSet:
    """``champion.gate_set: dataset/split``: that split as it is now (its mined candidates when reranking)."""
    dataset, split = params.champion.gate_set.split("/")
    queries, qrels = load_topics(paths, dataset, split)
    candidates = None
    if params.champion.stage == "rerank":
        folder = paths.candidate_store(dataset, split)
        if not (folder / "meta.json").is_file():
            raise PgrankError(f"{folder}: no candidate sets for the gate set {dataset}/{split}; it must be one of "
                              "data.eval_sets (mined by mine@<dataset>), or set champion.stage: full")
        candidates = _candidate_sets(paths, dataset, split)
    return GateSet(f"{dataset}/{split}", dataset, queries, qrels, candidates)


def holdout_override(client: MlflowClient, params: Params, paths: Paths) -> list[str]:
    """``["data.holdout=<frozen judgments>"]`` when a frozen gate set of ``data.train``'s dataset exists, else ``[]``."""
    if params.champion.gate_set != "frozen":
        return []
    gate = frozen_gate_set(client, params, paths)
    if gate is None or gate.dataset != params.data.train.split("/")[0]:
        return []
    return [f"data.holdout={gate.holdout}"]


def trained_on_gate(params: Params, paths: Paths, gate: GateSet) -> list[str]:
    """Gate queries in the workspace's current ``train-pg`` carve-out (what this run's challengers trained on)."""
    from pgrank.paths import CARVED_FILES, CARVED_TRAIN

    dataset = params.data.train.split("/")[0]
    train = paths.carved_qrels(dataset, CARVED_FILES[CARVED_TRAIN])
    if dataset != gate.dataset or not train.is_file():
        return []
    return sorted(set(load_qrels(train)) & set(gate.qrels))


# --------------------------------------------------------------------------------------- versions


def fetch_version(client: MlflowClient, paths: Paths, model_name: str, version: str) -> VersionModel:
    """A registered version's model, downloaded once into ``{root}/registry/<run id>/``, with what encodes its documents.

    A ``tower: query`` policy encodes documents with its frozen warm start (read from its training
    run's parameters), so the warm start's corpus-embedding artifact is reused. ``pgrank.json`` is written
    beside the weights, so that the folder can also be a warm start (continual training).
    """
    import mlflow

    from pgrank.models.checkpoint_meta import CHECKPOINT_META

    from pgrank.models.names import model_name_of

    mv = client.get_model_version(model_name, version)
    run_params = client.get_run(mv.run_id).data.params if mv.run_id else {}
    folder = paths.root / "registry" / (mv.run_id or f"{model_name}-v{version}")
    model_dir = folder / ST_FOLDER
    tower = run_params.get("train.tower", "both")
    documents = model_name_of(run_params.get("document_encoder") or run_params.get("warm_start", ""))
    meta = {"registered_model": model_name, "version": str(version), "tower": tower,
            "similarity": run_params.get("train.similarity", "dot"),
            "document_encoder": documents if tower == "query" and documents else None}
    if not (model_dir / CHECKPOINT_META).is_file():
        with atomic_path(folder, directory=True) as tmp:
            mlflow.artifacts.download_artifacts(artifact_uri=f"models:/{model_name}/{version}", dst_path=str(tmp),
                                                tracking_uri=client.tracking_uri)
            if not (tmp / ST_FOLDER).is_dir():
                raise PgrankError(f"models:/{model_name}/{version}: not a sentence-transformers model (no {ST_FOLDER})")
            (tmp / ST_FOLDER / CHECKPOINT_META).write_text(json.dumps(meta, indent=2, sort_keys=True) + "\n")
    return VersionModel(str(version), model_dir, meta["document_encoder"] or str(model_dir), meta["similarity"])


def evaluate_version(params: Params, paths: Paths, gate: GateSet, model: VersionModel) -> dict[str, dict[str, float]]:
    """Per-query metrics (:func:`gate_metrics`) of one version on the gate set, as the evaluate stage scores a dense system."""
    from pgrank.evaluation.stage import rerank_runs, search_runs
    from pgrank.retrieval.dense.retriever import DenseRetriever, DenseSystem

    cfg = params.evaluate
    system = DenseSystem(f"v{model.version}", str(model.folder), model.document_model, model.similarity)
    retriever = DenseRetriever(params, paths, system, gate.dataset, max_seq_length=cfg.max_seq_length,
                               batch_size=cfg.batch_size)
    qids = list(gate.queries)
    encoded = retriever.encode([gate.queries[q] for q in qids])
    if params.champion.stage == "rerank":
        if gate.candidates is None:
            raise PgrankError(f"gate set {gate.description}: no candidate sets to rerank; set champion.stage: full")
        with tempfile.TemporaryDirectory(prefix=".gate-candidates-", dir=paths.root) as tmp:
            store = _gate_store(Path(tmp) / "store", retriever.store, gate)
            per_query = _scored(gate, rerank_runs(retriever, encoded, qids, store), params)
    else:
        per_query = _scored(gate, search_runs(retriever, encoded, qids, cfg.top_k + (1 if cfg.ignore_identical_ids else 0)),
                            params)
    return per_query


def _gate_store(folder: Path, corpus, gate: GateSet):
    """The gate set's candidate sets as a candidate store over today's corpus, what ``rerank_runs`` streams.

    A document deleted from the corpus since the freeze can't be ranked: it is left out of its set.
    """
    import numpy as np

    with CandidateStoreWriter(folder, {"dataset": gate.dataset, "split": "gate", "corpus_sha256": corpus.sha256}) as out:
        for qid in sorted(gate.candidates):
            docs = ranked(gate.candidates[qid])
            rows = corpus.rows(d for d, _ in docs)
            rows = rows[rows >= 0]
            out.add(qid, gate.queries.get(qid, ""), rows, np.zeros(len(rows), dtype=np.int8))
    return open_candidate_store(folder)


def _scored(gate: GateSet, runs, params: Params) -> dict[str, dict[str, float]]:
    """Per-query metrics of streamed runs (chunks of queries) against the gate set's judgments."""
    from pgrank.core.trec_eval import evaluate_run

    _, ks, mrr_k = gate_metrics(params)
    per_query: dict[str, dict[str, float]] = {}
    for run in runs:
        per_query.update(evaluate_run({q: gate.qrels[q] for q in run if q in gate.qrels}, run, ks, mrr_k=mrr_k,
                                      ignore_identical_ids=params.evaluate.ignore_identical_ids)[1])
    return per_query

