"""The gate set, and models evaluated side by side on it (the fair champion test).

Gate set (``champion.gate_set``):

* ``frozen`` (default): ``data.train``'s gate split (``gate-pg``, :mod:`pgrank.download.carve_out`:
  ``data.gate_size`` queries apart from training and validation) of the first gated pipeline run, frozen
  at that moment: its judgments, its texts and its candidate sets. They are logged to MLflow as the
  artifacts of a ``gate-set`` run, whose id the registered model carries in the tag ``pgrank.gate_set``,
  so later data cannot change them. Scheduled retraining hands their judgments to the pipeline as
  ``data.holdout`` (:func:`holdout_override`): they stay the gate split, never trained on nor used for
  selection, however the training data grows.
* ``dataset/split``: a split you keep fixed yourself (e.g. ``acme/gate``), read as it is now.

Candidate sets stay arrays: the frozen set keeps a copy of the gate split's candidate store
(:mod:`pgrank.data.candidate_store`, ``candidates/``) and the ids of its documents (``documents.*.npy``:
the corpus changes, the ids stay), so that reranking needs no TREC file nor a Python object per candidate.

Evaluation (:func:`evaluate_system`): a model is evaluated like a dense system of the evaluate stage:
queries through the model, documents through its document encoder (a ``tower: query`` policy's frozen
warm start, whose corpus-embedding artifact mining already built; for a rerank gate, a model without an
artifact encodes only the candidates, as the evaluate stage does), reranking the gate set's candidate
sets (``champion.stage: rerank``, streamed in chunks by :func:`pgrank.evaluation.stage.rerank_runs`) or
searching the whole corpus (``full``), scored per query by pytrec_eval. The models are registered
versions (:func:`fetch_version`, ``models:/NAME/VERSION`` kept under ``{root}/registry/<run id>/``) and,
for the first gated run, the challenger's warm start (:func:`warm_start_system`). The decision is
:func:`pgrank.pipeline.champion.decide`; the gate of a retraining run as a whole,
:func:`pgrank.pipeline.retraining.gate_workspace`.
"""

from __future__ import annotations

import json
import logging
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from pgrank.atomic import atomic_path, write_json, write_text
from pgrank.config import GATE_METRIC, Params
from pgrank.data.artifact_meta import META
from pgrank.data.beir import Qrels, load_qrels, load_queries, load_topics, write_qrels
from pgrank.data.candidate_store import CandidateStore, CandidateStoreWriter, open_candidate_store
from pgrank.data.columns import StringColumn, write_taken
from pgrank.errors import PgrankError
from pgrank.paths import CARVED_FILES, CARVED_TRAIN, GATE, VALIDATION, Paths

if TYPE_CHECKING:
    from mlflow.tracking import MlflowClient

    from pgrank.data.corpus_store import CorpusStore
    from pgrank.retrieval.dense.retriever import DenseSystem

log = logging.getLogger(__name__)

GATE_SET_TAG = "pgrank.gate_set"  # on the registered model: the MLflow run holding the frozen gate set
ARTIFACTS = "gate-set"
FORMAT = "pgrank-gate-set/2"  # 1 (no "format"): frozen from the validation carve-out, candidates as a TREC file
ST_FOLDER = "model.sentence_transformer"  # where MLflow's sentence_transformers flavor keeps the model
PerQuery = dict[str, dict[str, float]]


@dataclass(frozen=True)
class GateSet:
    """The queries champion and challenger are both evaluated on."""

    description: str
    dataset: str  # whose corpus the documents come from
    queries: dict[str, str]
    qrels: Qrels
    candidates: Path | None  # a candidate store folder: what champion.stage rerank reranks (None: not mined)
    documents: Path | None = None  # frozen sets: the folder of documents.*.npy, the ids of the store's rows
    holdout: Path | None = None  # the judgments file handed to the pipeline as data.holdout (frozen sets)
    note: str | None = None  # a migration of an older frozen set, said once


@dataclass(frozen=True)
class VersionModel:
    """A registered model version, ready to evaluate."""

    version: str
    folder: Path  # a sentence-transformers folder
    document_model: str  # what encodes its documents (a name pgrank.models.names resolves)
    similarity: str
    warm_start: str | None = None  # what it was trained from (the training run's parameter)

    @property
    def system(self) -> DenseSystem:
        from pgrank.retrieval.dense.retriever import DenseSystem

        return DenseSystem(f"v{self.version}", str(self.folder), self.document_model, self.similarity)


def gate_metrics(params: Params) -> tuple[list[str], list[int], int]:
    """The gate table's metrics, the cut-offs pytrec_eval computes, and the MRR cut-off."""
    cfg = params.champion
    kind, k = GATE_METRIC.match(cfg.metric).groups()
    ks = sorted(set(params.evaluate.ks) | ({int(k)} if kind != "mrr" else set()))
    mrr_k = int(k) if kind == "mrr" else 10
    table = [cfg.metric, *(f"ndcg@{k}" for k in params.evaluate.ks), f"mrr@{mrr_k}", f"recall@{max(ks)}"]
    return list(dict.fromkeys(table)), ks, mrr_k


# --------------------------------------------------------------------------------------- gate sets


def _read(folder: Path, note: str | None = None) -> GateSet:
    meta = json.loads((folder / "gate.json").read_text(encoding="utf-8"))
    return GateSet(meta["description"], meta["dataset"], load_queries(folder), load_qrels(folder / "qrels.tsv"),
                   folder / "candidates", folder, folder / "qrels.tsv", note)


def _write(folder: Path, meta: dict, queries: dict[str, str], qrels: Qrels) -> None:
    write_qrels(folder / "qrels.tsv", qrels)
    write_text(folder / "queries.jsonl", "".join(json.dumps({"_id": q, "text": t}) + "\n" for q, t in queries.items()))
    write_json(folder / "gate.json", {**meta, "format": FORMAT})


def _write_documents(folder: Path, store: CandidateStore, corpus: CorpusStore) -> None:
    """``documents.rows.npy`` (the store's distinct corpus rows, sorted) and the ids of those documents."""
    rows = np.unique(np.asarray(store.rows, dtype=np.int64))
    np.save(folder / "documents.rows.npy", rows)
    write_taken(folder, "documents", corpus.ids, rows)


def _registered_tags(client: MlflowClient, name: str) -> dict[str, str] | None:
    from mlflow.exceptions import MlflowException

    try:
        return dict(client.get_registered_model(name).tags)
    except MlflowException as exc:
        if exc.error_code == "RESOURCE_DOES_NOT_EXIST":
            return None
        raise


def frozen_run(client: MlflowClient, params: Params) -> str | None:
    """The MLflow run holding the registered model's frozen gate set (``None``: none frozen yet)."""
    return (_registered_tags(client, params.tracking.registered_model) or {}).get(GATE_SET_TAG)


def frozen_gate_set(client: MlflowClient, params: Params, paths: Paths) -> GateSet | None:
    """The registered model's frozen gate set, fetched once into ``{root}/gate/<run id>/`` (``None``: not frozen yet).

    A set frozen by an earlier pgrank (the validation carve-out, its candidate sets as a TREC file) is
    converted once, with a one-line message (:attr:`GateSet.note`): its queries become the gate split.
    """
    import mlflow

    run_id = frozen_run(client, params)
    if run_id is None:
        return None
    folder = paths.root / "gate" / run_id
    note = None
    if not (folder / "gate.json").is_file():
        with atomic_path(folder, directory=True) as tmp:
            mlflow.artifacts.download_artifacts(run_id=run_id, artifact_path=ARTIFACTS, dst_path=str(tmp),
                                                tracking_uri=client.tracking_uri)
            for file in (tmp / ARTIFACTS).iterdir():
                file.rename(tmp / file.name)
            (tmp / ARTIFACTS).rmdir()
            if (tmp / "candidates.trec").is_file():
                _migrate(tmp, paths)
                note = (f"gate set {run_id[:8]} was frozen from the validation carve-out by an earlier pgrank; its "
                        "queries are now the gate split, apart from validation, and its candidate sets a store")
                log.warning("%s", note)
    return _read(folder, note)


def _migrate(folder: Path, paths: Paths) -> None:
    """An older frozen set (candidate sets as ``candidates.trec``) as this format, over today's corpus."""
    from pgrank.data.corpus_store import open_corpus
    from pgrank.data.runs import iter_run

    meta = json.loads((folder / "gate.json").read_text(encoding="utf-8"))
    qrels = load_qrels(folder / "qrels.tsv")
    texts = load_queries(folder)
    corpus = open_corpus(paths, meta["dataset"])
    sets = sorted(iter_run(folder / "candidates.trec"))  # a one-time conversion: one gate set's candidates
    with CandidateStoreWriter(folder / "candidates", {"dataset": meta["dataset"], "split": GATE,
                                                      "corpus_sha256": corpus.sha256}) as out:
        for qid, docs in sets:
            ids = list(docs)
            rows = corpus.rows(ids)
            judged = qrels.get(qid, {})
            grades = np.array([judged.get(d, 0) for d, r in zip(ids, rows) if r >= 0], dtype=np.int64)
            out.add(qid, texts.get(qid, ""), rows[rows >= 0], grades)
    _write_documents(folder, open_candidate_store(folder / "candidates"), corpus)
    (folder / "candidates.trec").unlink()
    write_json(folder / "gate.json", {**meta, "format": FORMAT, "migrated_from": "validation carve-out, TREC candidates"})


def freeze_gate_set(client: MlflowClient, params: Params, paths: Paths, parent_run_id: str | None, *,
                    only: list[str] | None = None, record: dict | None = None) -> GateSet:
    """Freeze ``data.train``'s current gate split (judgments, texts, candidate sets) as the gate set.

    ``gate.json`` records the carve-out's bounds (``carve``, :mod:`pgrank.download.carve_out`), so that every
    later carve-out keeps each query in its split. ``only`` freezes those queries of the gate split (a refresh,
    :mod:`pgrank.pipeline.refresh`), and ``record`` adds to ``gate.json`` (the bounds and retired queries it keeps).

    Raises:
        PgrankError: there is no gate split (``data.gate_size`` is 0) or it was not mined.
    """
    import mlflow

    from pgrank import tracking
    from pgrank.data.corpus_store import open_corpus
    from pgrank.download.carve_out import read_bounds

    dataset, split = params.data.train.split("/")
    if not paths.carved_qrels(dataset, CARVED_FILES[GATE]).is_file():
        raise PgrankError(f"data.gate_size is 0: {dataset}/{split} has no gate split to freeze as the gate set; set "
                          "data.gate_size (studies/gate_power.py's table says how many queries a gain needs) or "
                          "champion.gate_set: dataset/split")
    store_folder = paths.candidate_store(dataset, GATE)
    if not (store_folder / META).is_file():
        raise PgrankError(f"{store_folder}: the gate split has no candidate sets; run `pgrank mine --training`")
    tracking.configure(params, paths)  # the run goes to the registry's store
    queries, qrels = load_topics(paths, dataset, GATE)
    if only is not None:
        queries, qrels = {q: queries[q] for q in only}, {q: qrels[q] for q in only}
    manifest = paths.dataset_manifest(dataset)
    bounds = read_bounds(paths, dataset)
    meta = {"dataset": dataset, "split": GATE, "frozen_from": f"the gate split of {dataset}/{split}",
            "queries": len(qrels), "pipeline_run": parent_run_id,
            "data": json.loads(manifest.read_text()) if manifest.is_file() else None,
            "carve": bounds.as_dict() if bounds is not None else None, "retired": [], **(record or {})}
    from pgrank.pipeline.decisions import GATE_SET_MODEL_TAG

    name = params.tracking.registered_model
    with mlflow.start_run(run_name="gate-set", nested=parent_run_id is not None, parent_run_id=parent_run_id,
                          tags={"stage": "gate-set", GATE_SET_MODEL_TAG: name}) as run:
        meta["description"] = (f"frozen: {len(qrels)} gate queries of {dataset}/{split}, frozen by run "
                               f"{run.info.run_id[:8]}")
        folder = paths.root / "gate" / run.info.run_id
        with atomic_path(folder, directory=True) as tmp:
            _write(tmp, meta, queries, qrels)
            _copy_store(store_folder, tmp / "candidates", None if only is None else set(only))
            _write_documents(tmp, open_candidate_store(tmp / "candidates"), open_corpus(paths, dataset))
            mlflow.log_artifacts(str(tmp), ARTIFACTS)
        client.set_registered_model_tag(name, GATE_SET_TAG, run.info.run_id)  # adopted before the run ends
    return _read(folder)


def _copy_store(source: Path, target: Path, only: set[str] | None) -> None:
    """A candidate store, whole or with only the query ids ``only``."""
    if only is None:
        shutil.copytree(source, target)
        return
    store = open_candidate_store(source)
    with CandidateStoreWriter(target, dict(store.meta)) as out:
        for i, qid in enumerate(store.qids):
            if qid in only:
                rows, grades = store.candidates(i)
                out.add(qid, store.queries[i], np.asarray(rows), np.asarray(grades))


def named_gate_set(params: Params, paths: Paths) -> GateSet:
    """``champion.gate_set: dataset/split``: that split as it is now (its mined candidates when reranking)."""
    dataset, split = params.champion.gate_set.split("/")
    queries, qrels = load_topics(paths, dataset, split)
    candidates = None
    if params.champion.stage == "rerank":
        candidates = paths.candidate_store(dataset, split)
        if not (candidates / META).is_file():
            raise PgrankError(f"{candidates}: no candidate sets for the gate set {dataset}/{split}; it must be one of "
                              "data.eval_sets (mined by mine@<dataset>), or set champion.stage: full")
    return GateSet(f"{dataset}/{split}", dataset, queries, qrels, candidates)


def holdout_override(client: MlflowClient, params: Params, paths: Paths) -> tuple[list[str], GateSet | None]:
    """``["data.holdout=<frozen judgments>"]`` and the set, when a frozen gate set of ``data.train``'s dataset
    exists; else ``([], None)``."""
    if params.champion.gate_set != "frozen":
        return [], None
    gate = frozen_gate_set(client, params, paths)
    if gate is None or gate.dataset != params.data.train.split("/")[0]:
        return [], None
    return [f"data.holdout={gate.holdout}"], gate


def leaked(params: Params, paths: Paths, gate: GateSet) -> dict[str, list[str]]:
    """Gate queries in the workspace's current ``train-pg`` or ``validation`` carve-out (what this run's
    challengers trained on, or were selected with): ``{split: [qids]}``, empty when none."""
    dataset = params.data.train.split("/")[0]
    if dataset != gate.dataset:
        return {}
    found = {}
    for split in (CARVED_TRAIN, VALIDATION):
        carved = paths.carved_qrels(dataset, CARVED_FILES[split])
        both = sorted(set(load_qrels(carved)) & set(gate.qrels)) if carved.is_file() else []
        if both:
            found[split] = both
    return found


# --------------------------------------------------------------------------------------- models


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
    warm = model_name_of(run_params["warm_start"]) if run_params.get("warm_start") else None
    return VersionModel(str(version), model_dir, meta["document_encoder"] or str(model_dir), meta["similarity"], warm)


def warm_start_system(params: Params, model: VersionModel) -> DenseSystem:
    """The warm start a version was trained from, as the evaluate stage scores it (the first gated run's baseline).

    Raises:
        PgrankError: the version's training run does not say its warm start.
    """
    from pgrank.retrieval.dense.retriever import comparison_system

    if model.warm_start is None:
        raise PgrankError(f"version {model.version}: its training run records no warm_start to gate it against; "
                          "set champion.first: promote to promote a first version without a comparison")
    return comparison_system(params, model.warm_start)


def evaluate_system(params: Params, paths: Paths, gate: GateSet, system: DenseSystem) -> PerQuery:
    """Per-query metrics (:func:`gate_metrics`) of one model on the gate set, as the evaluate stage scores a dense system."""
    from pgrank.data.corpus_store import open_corpus
    from pgrank.evaluation.stage import rerank_runs, search_runs
    from pgrank.retrieval.dense.retriever import DenseRetriever

    cfg = params.evaluate
    qids = list(gate.queries)
    if params.champion.stage != "rerank":
        retriever = DenseRetriever(params, paths, system, gate.dataset, max_seq_length=cfg.max_seq_length,
                                   batch_size=cfg.batch_size)
        encoded = retriever.encode([gate.queries[q] for q in qids])
        return _scored(gate, search_runs(retriever, encoded, qids, cfg.top_k + (1 if cfg.ignore_identical_ids else 0)),
                       params)
    if gate.candidates is None:
        raise PgrankError(f"gate set {gate.description}: no candidate sets to rerank; set champion.stage: full")
    with tempfile.TemporaryDirectory(prefix=".gate-candidates-", dir=paths.root) as tmp:
        store = gate_candidates(gate, open_corpus(paths, gate.dataset), Path(tmp))
        retriever = DenseRetriever(params, paths, system, gate.dataset, max_seq_length=cfg.max_seq_length,
                                   batch_size=cfg.batch_size, candidates=np.asarray(store.rows))
        encoded = retriever.encode([gate.queries[q] for q in qids])
        return _scored(gate, rerank_runs(retriever, encoded, qids, store), params)


def gate_candidates(gate: GateSet, corpus: CorpusStore, scratch: Path) -> CandidateStore:
    """The gate set's candidate store, over today's corpus.

    A frozen store whose corpus has changed since the freeze is rewritten into ``scratch`` with today's
    rows (its documents found by id, once each); a document deleted since is left out of its set.
    """
    store = open_candidate_store(gate.candidates)
    if store.meta.get("corpus_sha256") == corpus.sha256 or gate.documents is None:
        return store
    frozen_rows = np.load(gate.documents / "documents.rows.npy")
    today = corpus.rows(StringColumn.open(gate.documents, "documents"))  # (D,) one lookup per distinct document
    rows = today[np.searchsorted(frozen_rows, np.asarray(store.rows, dtype=np.int64))]  # (P,)
    with CandidateStoreWriter(scratch / "store", {**store.meta, "corpus_sha256": corpus.sha256}) as out:
        for i, qid in enumerate(store.qids):
            lo, hi = int(store.offsets[i]), int(store.offsets[i + 1])
            keep = rows[lo:hi] >= 0
            out.add(qid, store.queries[i], rows[lo:hi][keep], np.asarray(store.grades[lo:hi])[keep])
    return open_candidate_store(scratch / "store")


def _scored(gate: GateSet, runs, params: Params) -> PerQuery:
    """Per-query metrics of streamed runs (chunks of queries) against the gate set's judgments."""
    from pgrank.core.trec_eval import evaluate_run

    _, ks, mrr_k = gate_metrics(params)
    per_query: PerQuery = {}
    for run in runs:
        per_query.update(evaluate_run({q: gate.qrels[q] for q in run if q in gate.qrels}, run, ks, mrr_k=mrr_k,
                                      ignore_identical_ids=params.evaluate.ignore_identical_ids)[1])
    return per_query
