"""Every artifact path of the pipeline, defined once.

``params.yaml``'s ``paths`` section gives three roots; everything else is derived here, and
``dvc.yaml`` interpolates the same ``paths.*`` keys, so no path literal is written twice.

Layout (``root`` is per profile; ``data`` and ``embeddings`` may be shared by profiles)::

    {data}/{dataset}/corpus.jsonl, queries.jsonl, qrels/{split}.tsv     BEIR folders
    {embeddings}/{model}--L{len}--{corpus sha}/                          corpus-embedding artifact
    {embeddings}/{model}--L{len}--{corpus sha}--sparse/                  SPLADE corpus matrix (CSR shards)
    {embeddings}/{model}--L{len}--queries/                               query embeddings, by query text
    {embeddings}/bm25--{settings}--{corpus sha}/                         BM25 index (bm25s, memory-mapped)
    {data}/.fingerprints/{dataset}.json                                  file checksums by (size, mtime)
    {data}/.stores/{dataset}--{corpus sha}/                              corpus store: ids, id lookup, line offsets
    {root}/datasets/{dataset}.json                                       content manifest (what DVC tracks)
    {root}/splits/{dataset}/qrels/{train,validation,gate}.tsv            seeded carve-out: train-pg, validation, gate-pg
    {root}/splits/{dataset}/validation-sets.json                         manifests of train.validation_sets
    {root}/candidates/{dataset}/{split}/                                 stage-1 candidate sets (columnar store)
    {root}/candidates/{dataset}/{split}.trec                             ... and as a TREC run, beside it
    {root}/training-sets/{dataset}/{train-pg,validation,gate-pg}/        candidate stores of the carved splits
    {root}/training-sets/{dataset}/{split}/                              ... and of train.validation_sets
    {root}/models/{warm}/{objective}/epoch-{e}/                          sentence-transformers checkpoints
    {root}/models/{warm}/{objective}/selected/                           the epoch train.selection chose
    {root}/models/{warm}/{objective}/state/                              resumable training state
    {root}/training/{warm}/{objective}/curve.csv, validation.csv, history.json  training curves
    {root}/timings/{warm}/{objective}.json                               training wall time per epoch (not DVC-tracked)
    {root}/results/{system}/{dataset}/[epoch-{e}/]{split}/{stage}/       metrics.json, per_query.json, run.trec
    {root}/results/pgrank-{warm}/{objective}/{dataset}/...               ... of a trained policy
    {root}/metrics/{system}/{dataset}.json                               every split and stage, for DVC
    {root}/metrics/pgrank-{warm}/{objective}/{dataset}.json              ... of a trained policy
    {root}/tables/                                                       Markdown, LaTeX, PNG
    {root}/mlflow.db                                                     default MLflow store
    {root}/mlartifacts/                                                  its artifacts (beside any sqlite store)
    {root}/mlflow-spool/                                                 runs a stage spooled for the store (pgrank.tracking)
    {root}/gate/{run id}/                                                the frozen gate set, fetched from MLflow
    {root}/registry/{run id}/                                            a registered model version, fetched from MLflow
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from pgrank.config import DataConfig, PathsConfig

# An sqlite MLflow store's artifacts: this folder beside its database file (pgrank.tracking.artifact_root).
MLFLOW_ARTIFACTS = "mlartifacts"
# Runs recorded by a stage that does not load MLflow, for the next process that opens the store (pgrank.tracking).
MLFLOW_SPOOL = "mlflow-spool"
# A workspace's composed configuration (params.yaml + profile + --set), which its DVC stages read.
WORKSPACE_PARAMS = "params.yaml"


# The carve-out of data.train (pgrank.download.carve_out): split name -> file name under carved_qrels.
# Three disjoint query sets: train-pg (trained on), validation (selection) and gate-pg (the champion gate's).
CARVED_TRAIN = "train-pg"
VALIDATION = "validation"
GATE = "gate-pg"
CARVED_FILES = {CARVED_TRAIN: "train", VALIDATION: "validation", GATE: "gate"}
CARVED_SPLITS = tuple(CARVED_FILES)


def carved_splits(data: DataConfig) -> list[str]:
    """The carved splits a configuration has: ``train-pg`` and ``validation``, and ``gate-pg`` when
    ``data.gate_size`` or ``data.holdout`` (the frozen gate set) gives it queries."""
    return [CARVED_TRAIN, VALIDATION, *([GATE] if data.gate_size or data.holdout else [])]


# A trained policy is named ``pgrank-<warm start>[+<objective>][@<epoch>]``: ``pgrank-sbert`` is Neural
# PG-Rank from SBERT (objective ``pg``; ``pgrank-sbert+pg`` is the same policy), ``pgrank-sbert+listnet`` the
# ListNet-trained one on the same candidates, ``@2`` its epoch-2 checkpoint.
POLICY_PREFIX = "pgrank-"
DEFAULT_OBJECTIVE = "pg"
# A run at one of train.extra_seeds appends ``.s<seed>`` to its objective: ``pgrank-minilm+infonce.s43``.
_POLICY = re.compile(r"^pgrank-(?P<warm>.+?)(?:\+(?P<objective>[a-z0-9_]+(?:\.s\d+)?))?(?:@(?P<epoch>\d+))?$")
_SEEDED = re.compile(r"^(?P<name>[a-z0-9_]+)\.s(?P<seed>\d+)$")


def run_key(objective: str, seed: int | None = None) -> str:
    """One training run's name in folders and policy names: the ``train.objectives`` entry at ``train.seed``
    (``seed`` None), ``<entry>.s<seed>`` at one of ``train.extra_seeds``."""
    return objective if seed is None else f"{objective}.s{seed}"


def split_run_key(key: str) -> tuple[str, int | None]:
    """:func:`run_key` undone: ``"infonce.s43"`` -> ``("infonce", 43)``, ``"pg"`` -> ``("pg", None)``."""
    found = _SEEDED.match(key)
    return (found["name"], int(found["seed"])) if found else (key, None)


@dataclass(frozen=True)
class PolicyName:
    """A trained policy's system name, parsed (:func:`parse_policy_name`): its warm start, its training
    objective and (if named) an epoch."""

    warm: str
    objective: str = DEFAULT_OBJECTIVE
    epoch: int | None = None

    @property
    def name(self) -> str:
        """The canonical system name (``pg`` is left out; the epoch kept)."""
        return policy_name(self.warm, self.objective, self.epoch)

    @property
    def final(self) -> str:
        """The policy itself (no epoch)."""
        return policy_name(self.warm, self.objective)


def policy_name(warm: str, objective: str = DEFAULT_OBJECTIVE, epoch: int | None = None) -> str:
    """``pgrank-<warm>`` for Neural PG-Rank, ``pgrank-<warm>+<objective>`` otherwise, with ``@<epoch>``."""
    name = POLICY_PREFIX + warm + ("" if objective == DEFAULT_OBJECTIVE else f"+{objective}")
    return name if epoch is None else f"{name}@{epoch}"


def parse_policy_name(system: str) -> PolicyName | None:
    """The parts of a system's name when it names a trained policy (``pgrank-minilm+listnet@2``), else ``None``."""
    found = _POLICY.match(system)
    if not found:
        return None
    epoch = found["epoch"]
    return PolicyName(found["warm"], found["objective"] or DEFAULT_OBJECTIVE, None if epoch is None else int(epoch))


def slug(name: str) -> str:
    """A file-system-safe name for a model id or path (``org/model`` -> ``org--model``)."""
    return re.sub(r"[^\w.-]+", "-", name.strip().rstrip("/").replace("/", "--")).strip("-") or "model"


@dataclass(frozen=True)
class Paths:
    """Artifact locations, resolved against ``base`` (the project directory)."""

    root: Path
    data: Path
    embeddings: Path

    @classmethod
    def from_config(cls, cfg: PathsConfig, base: str | Path = ".") -> "Paths":
        base = Path(base).resolve()
        return cls(root=base / cfg.root, data=base / cfg.data, embeddings=base / cfg.embeddings)

    # ---- data
    def dataset(self, name: str) -> Path:
        return self.data / name

    def fingerprint_cache(self, name: str) -> Path:
        """SHA-256 of each file of a dataset, cached by (size, mtime) (:mod:`pgrank.download.manifests`)."""
        return self.data / ".fingerprints" / f"{name}.json"

    def corpus_store(self, name: str, corpus_sha256: str) -> Path:
        """Row access to a corpus without loading it (:mod:`pgrank.data.corpus_store`), keyed by its checksum."""
        return self.data / ".stores" / f"{name}--{corpus_sha256[:16]}"

    def token_store(self, name: str, tokenizer_sha256: str, max_length: int, source_sha256: str) -> Path:
        """A corpus's or a split's queries' token ids for one tokenizer (:mod:`pgrank.data.token_store`), keyed by
        the texts' checksum, the tokenizer's identity and the maximum length."""
        return self.data / ".tokens" / f"{slug(name)}--{tokenizer_sha256[:16]}--L{max_length}--{source_sha256[:16]}"

    def dataset_manifest(self, name: str) -> Path:
        """The content fingerprint of a dataset that DVC tracks (the data itself is shared, in ``data``)."""
        return self.root / "datasets" / f"{name}.json"

    def carved_qrels(self, dataset: str, split: str) -> Path:
        return self.root / "splits" / dataset / "qrels" / f"{split}.tsv"

    # ---- mining
    def corpus_embeddings(self, model: str, max_seq_length: int, corpus_sha256: str) -> Path:
        return self.embeddings / f"{slug(model)}--L{max_seq_length}--{corpus_sha256[:16]}"

    def query_embeddings(self, model: str, max_seq_length: int) -> Path:
        """A model's kept query embeddings (:mod:`pgrank.retrieval.dense.query_embeddings`), keyed like
        :meth:`corpus_embeddings` but for every query set at once."""
        return self.embeddings / f"{slug(model)}--L{max_seq_length}--queries"

    def model_export(self, model: str, backend: str, key: str) -> Path:
        """A model exported for an inference backend (:mod:`pgrank.models.backends`); ``key``: the digest of
        what the export depends on (weights, backend, instruction set, exporter versions)."""
        return self.embeddings / "exports" / f"{slug(model)}--{backend}--{key}"

    def sparse_corpus(self, model: str, max_seq_length: int, corpus_sha256: str) -> Path:
        """A learned-sparse model's corpus matrix, keyed like :meth:`corpus_embeddings`."""
        return self.embeddings / f"{slug(model)}--L{max_seq_length}--{corpus_sha256[:16]}--sparse"

    def bm25_index(self, settings: str, corpus_sha256: str) -> Path:
        """A BM25 index of one corpus with one set of ``mine.bm25`` settings (``settings``: their key)."""
        return self.embeddings / f"bm25--{settings}--{corpus_sha256[:16]}"

    def validation_sets_manifest(self, dataset: str) -> Path:
        """The content of ``train.validation_sets``' datasets, beside ``dataset``'s carve-out (what mine-train
        depends on for them)."""
        return self.root / "splits" / dataset / "validation-sets.json"

    def candidate_store(self, dataset: str, split: str, training: bool = False) -> Path:
        """Candidate sets (:mod:`pgrank.data.candidate_store`); the training sets (the carved splits, and
        ``train.validation_sets`` with ``training``) live apart from the evaluation ones (their own DVC stage)."""
        folder = "training-sets" if training or split in CARVED_SPLITS else "candidates"
        return self.root / folder / dataset / split

    def candidates(self, dataset: str, split: str, training: bool = False) -> Path:
        """The same candidate sets as a TREC run, beside the store (the interchange format)."""
        store = self.candidate_store(dataset, split, training)
        return store.with_name(f"{split}.trec")

    # ---- training (one run per warm start and objective)
    def model_dir(self, name: str, objective: str = DEFAULT_OBJECTIVE) -> Path:
        return self.root / "models" / slug(name) / objective

    def checkpoint(self, name: str, epoch: int, objective: str = DEFAULT_OBJECTIVE) -> Path:
        return self.model_dir(name, objective) / f"epoch-{epoch}"

    def selected_checkpoint(self, name: str, objective: str = DEFAULT_OBJECTIVE) -> Path:
        """The epoch ``train.selection`` chose (rules other than ``last``): the policy ``pgrank-<name>[+objective]``."""
        return self.model_dir(name, objective) / "selected"

    def train_state(self, name: str, objective: str = DEFAULT_OBJECTIVE) -> Path:
        return self.model_dir(name, objective) / "state"

    def training_log(self, name: str, objective: str = DEFAULT_OBJECTIVE) -> Path:
        """``curve.csv`` (per step), ``validation.csv`` and ``history.json`` (per epoch): DVC plots, apart from the model."""
        return self.root / "training" / slug(name) / objective

    def timings(self, name: str, objective: str = DEFAULT_OBJECTIVE) -> Path:
        """Training wall time per epoch. A measurement, not a result: outside every DVC-tracked folder, so
        that a rerun that reproduces the same model leaves the pipeline's outputs byte-identical."""
        return self.root / "timings" / slug(name) / f"{objective}.json"

    # ---- evaluation and tables
    def _system_folder(self, top: str, system: str) -> tuple[Path, str]:
        """``top/<system>`` (a policy: ``top/pgrank-<warm>/<objective>``) and the epoch named, if any."""
        policy = parse_policy_name(system)
        if policy is None:
            base, _, epoch = system.partition("@")
            return self.root / top / slug(base), epoch
        epoch = "" if policy.epoch is None else str(policy.epoch)
        return self.root / top / slug(POLICY_PREFIX + policy.warm) / policy.objective, epoch

    def results(self, system: str, dataset: str, split: str, stage: str) -> Path:
        """Results of ``system`` (``pgrank-X@E``: epoch ``E`` of ``pgrank-X``, kept beside it)."""
        base, epoch = self._system_folder("results", system)
        folder = base / dataset
        return (folder / f"epoch-{epoch}" if epoch else folder) / split / stage

    def metrics_summary(self, system: str, dataset: str) -> Path:
        """One JSON of every split and stage of ``system`` on ``dataset`` (DVC metrics)."""
        base, _ = self._system_folder("metrics", system)
        return base / f"{dataset}.json"

    @property
    def tables(self) -> Path:
        return self.root / "tables"

    @property
    def mlflow_db(self) -> Path:
        return self.root / "mlflow.db"

    @property
    def mlflow_spool(self) -> Path:
        return self.root / MLFLOW_SPOOL

    def mlflow_uri(self) -> str:
        """Absolute sqlite URI of the default store (MLflow's relative default depends on the cwd)."""
        return f"sqlite:///{self.mlflow_db.resolve()}"
