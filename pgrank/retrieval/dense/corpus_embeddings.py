"""Corpus embeddings: an artifact computed once per (model, max_seq_length, corpus checksum).

Mining and first-stage evaluation both need every document of a corpus encoded; for MS MARCO that
is 8.8M documents, hours on a GPU, and 13.5 GB at float16. So the embeddings are an artifact of
their own, at ``Paths.corpus_embeddings(model key, max_seq_length, corpus sha256)``::

    plan.json           what is being encoded (model, length, checksum, documents, shard size): guards a resume
    shard-00000.npy     float16 (chunk_size, dim) rows, one file per chunk, each written atomically
    ...
    meta.json           written last: its presence means the artifact is complete

Encoding goes shard by shard, so an interruption loses at most the shard in flight: the next run
finds the finished shards (same plan, right shape) and encodes only the rest. The artifacts are shared
by profiles and stages, so one process builds an artifact under its lock (``.NAME.lock`` beside it)
while any other that needs it waits, then reads it. Readers open the shards memory-mapped and hand
them out one block at a time as float32. Rows are the rows of the corpus store
(:mod:`pgrank.data.corpus_store`: the corpus file's order), whose ids and id lookup go with them; the
texts of each shard are read from the store when the shard is encoded, so no stage holds the corpus.

Document text follows BEIR (``DenseRetrievalExactSearch`` / ``SentenceBERT.encode_corpus``):
``(title + " " + text).strip()``. Models are applied as saved: a model whose pipeline ends in a
``Normalize`` module (gtr-t5-xl, all-MiniLM-L6-v2) gives cosine scores under inner product, a dot
model (msmarco-distilbert-dot-v5) gives dot scores.

Example:
    >>> emb = build_corpus_embeddings(lambda: load_encoder(ref, models), ref.key, store, folder,
    ...                               corpus_sha256=sha, max_seq_length=512, batch_size=128,
    ...                               chunk_size=65536)
    >>> for start, block in emb.blocks():   # float32 (rows, dim), one shard at a time
    ...     ...
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
from tqdm.auto import tqdm

from pgrank.atomic import atomic_path, clear_stale_lock, exclusive, lock_file, write_json
from pgrank.data.artifact_meta import META, read_meta
from pgrank.data.beir import document_text
from pgrank.data.corpus_store import CorpusStore
from pgrank.errors import DataError
from pgrank.data.token_store import TokenStore
from pgrank.retrieval.dense.encoding import encode_documents, encode_token_rows, encodes_tokens, encoding_devices
from pgrank.retrieval.dense.token_pool import TokenPool

if TYPE_CHECKING:
    from sentence_transformers import SentenceTransformer

log = logging.getLogger(__name__)

FORMAT = "pgrank-corpus-embeddings/1"


VECTORS = np.float16  # what embeddings are stored as, in an artifact's shards and in a subset's memory map


def _shard_path(folder: Path, i: int) -> Path:
    return folder / f"shard-{i:05d}.npy"


@dataclass(frozen=True)
class CorpusEmbeddings:
    """A complete corpus-embedding artifact, read lazily.

    Attributes:
        folder: the artifact folder.
        num_docs: rows (documents, in corpus-store row order).
        dim: embedding dimension.
        chunk_size: rows per shard (the last shard may be shorter).
        meta: the artifact's ``meta.json``.
    """

    folder: Path
    num_docs: int
    dim: int
    chunk_size: int
    meta: dict

    @property
    def num_shards(self) -> int:
        return -(-self.num_docs // self.chunk_size)

    def shard(self, i: int) -> np.ndarray:
        """Shard ``i`` as a read-only float16 memory map."""
        return np.load(_shard_path(self.folder, i), mmap_mode="r")

    def rows(self, lo: int, hi: int) -> np.ndarray:
        """float32 embeddings of corpus rows ``lo:hi`` (may span shards)."""
        parts = []
        for i in range(lo // self.chunk_size, -(-hi // self.chunk_size)):
            base = i * self.chunk_size
            parts.append(self.shard(i)[max(lo - base, 0) : hi - base])
        return np.concatenate(parts).astype(np.float32, copy=False) if len(parts) > 1 else np.asarray(parts[0], np.float32)

    def blocks(self, rows: int | None = None) -> Iterator[tuple[int, np.ndarray]]:
        """Yield ``(start_row, float32 block)`` over the corpus, ``rows`` rows at a time (default: a shard).

        Only one block is materialized at a time; ``rows`` larger than a shard joins shards.
        """
        step = rows or self.chunk_size
        for lo in range(0, self.num_docs, step):
            yield lo, self.rows(lo, min(lo + step, self.num_docs))

    def vectors(self, rows: np.ndarray) -> np.ndarray:
        """float32 embeddings of the given corpus rows ``(n, dim)``, read from the memory maps."""
        rows = np.asarray(rows, dtype=np.int64)
        out = np.empty((len(rows), self.dim), dtype=np.float32)
        shard_of = rows // self.chunk_size
        for i in np.unique(shard_of):
            mask = shard_of == i
            out[mask] = self.shard(int(i))[rows[mask] - i * self.chunk_size]
        return out


def open_corpus_embeddings(folder: str | Path) -> CorpusEmbeddings:
    """Open a complete artifact.

    Raises:
        DataError: the folder is missing or incomplete (no ``meta.json``: encoding never finished).
    """
    folder = Path(folder)
    meta = read_meta(folder, FORMAT, missing="not a complete corpus-embedding artifact (no meta.json); run `pgrank mine` "
                     "to build it", remedy=f"delete {folder} and the next stage encodes the corpus again",
                     keys=("num_docs", "dim", "chunk_size"))
    return CorpusEmbeddings(folder, int(meta["num_docs"]), int(meta["dim"]), int(meta["chunk_size"]), meta)


def _shard_done(path: Path, rows: int, dim: int | None) -> bool:
    if not path.is_file():
        return False
    try:
        arr = np.load(path, mmap_mode="r")
    except (ValueError, OSError):
        return False
    return arr.dtype == VECTORS and arr.shape[0] == rows and (dim is None or arr.shape[1] == dim)


def _start_or_resume(folder: Path, plan: dict) -> None:
    """Write the plan, or keep a partial artifact that has exactly the same one (the plan names the
    corpus by its checksum and size, so the same plan means the same rows)."""
    plan_path = folder / "plan.json"
    if plan_path.is_file():
        if json.loads(plan_path.read_text(encoding="utf-8")) == plan:
            return
        log.warning("%s: partial artifact from a different plan or corpus; starting over", folder)
    for stale in folder.glob("shard-*.npy"):
        stale.unlink()
    write_json(plan_path, plan)


def row_texts(corpus: CorpusStore | Mapping[str, Mapping[str, str]]) -> tuple[int, Callable[[int, int], list[str]]]:
    """``(number of rows, texts(lo, hi))`` of a corpus store, or of a small in-memory BEIR corpus (tests)."""
    if isinstance(corpus, CorpusStore):
        return len(corpus), lambda lo, hi: next(corpus.text_blocks(lo, hi, block=hi - lo))[1]
    ids = list(corpus)
    return len(ids), lambda lo, hi: [document_text(corpus[d]) for d in ids[lo:hi]]


def build_corpus_embeddings(
    load_model: Callable[[], "SentenceTransformer"],
    model_key: str,
    corpus: CorpusStore | Mapping[str, Mapping[str, str]],
    folder: str | Path,
    *,
    corpus_sha256: str,
    max_seq_length: int,
    batch_size: int,
    chunk_size: int,
    show_progress: bool = True,
    processes_per_gpu: int = 1,
    tokens: Callable[["SentenceTransformer"], TokenStore] | None = None,
) -> CorpusEmbeddings:
    """Encode the corpus into ``folder`` shard by shard, resuming from finished shards.

    Args:
        load_model: returns the encoder; called only when some shard still has to be encoded.
        model_key: the model's identity (:attr:`pgrank.models.names.ModelRef.key`), recorded in the plan.
        corpus: the corpus store (rows in its order), or a small BEIR corpus dict (rows in its order).
        folder: the artifact folder (``Paths.corpus_embeddings(...)``).
        corpus_sha256: the corpus checksum the folder is keyed by, recorded in the plan.
        max_seq_length: the truncation length the folder is keyed by, recorded in the plan.
        batch_size: sentence-transformers batch size.
        chunk_size: documents per shard (the resume granularity).
        show_progress: tqdm bar over documents.
        processes_per_gpu: processes of sentence-transformers' multi-process pool on each GPU
            (``models.processes_per_gpu``), for a model encoding strings.
        tokens: the corpus's token store for a loaded model (:func:`pgrank.data.token_store.corpus_tokens`).

    Returns:
        The complete artifact. A model that :func:`pgrank.retrieval.dense.encoding.encodes_tokens` encodes
        ``tokens``' ids in token-budget chunks of ``batch_size x max_seq_length`` tokens, on several GPUs in one
        process per GPU (:class:`pgrank.retrieval.dense.token_pool.TokenPool`). Any other (an ONNX export, no
        ``tokens``) encodes strings: through sentence-transformers' multi-process pool on several devices
        (:func:`pgrank.retrieval.dense.encoding.encoding_devices`), else a plain ``encode`` on the model's device.
    """
    folder = Path(folder)
    if (folder / META).is_file():
        clear_stale_lock(lock_file(folder))  # a holder killed after meta.json was written
        return open_corpus_embeddings(folder)
    num_docs, texts = row_texts(corpus)
    if not num_docs:
        raise DataError("cannot embed an empty corpus")
    # paths.embeddings is shared by profiles and stages: one process encodes, the others wait and reuse it.
    with exclusive(lock_file(folder), what=f"the corpus-embedding artifact {folder}"):
        if (folder / META).is_file():
            return open_corpus_embeddings(folder)
        return _build(load_model, model_key, num_docs, texts, folder, corpus_sha256=corpus_sha256, max_seq_length=max_seq_length,
                      batch_size=batch_size, chunk_size=chunk_size, show_progress=show_progress,
                      processes_per_gpu=processes_per_gpu, tokens=tokens)


def _build(load_model, model_key, num_docs: int, texts, folder: Path, *, corpus_sha256, max_seq_length, batch_size, chunk_size,
           show_progress, processes_per_gpu, tokens) -> CorpusEmbeddings:
    folder.mkdir(parents=True, exist_ok=True)
    plan = {"model": model_key, "max_seq_length": max_seq_length, "corpus_sha256": corpus_sha256,
            "num_docs": num_docs, "chunk_size": chunk_size, "text": "(title + ' ' + text).strip()"}
    _start_or_resume(folder, plan)

    num_shards = -(-num_docs // chunk_size)
    rows_of = [min(chunk_size, num_docs - i * chunk_size) for i in range(num_shards)]
    dim = None
    todo = []
    for i in range(num_shards):
        if _shard_done(_shard_path(folder, i), rows_of[i], dim):
            dim = dim or int(np.load(_shard_path(folder, i), mmap_mode="r").shape[1])
        else:
            todo.append(i)
    if todo:
        log.info("%s: %d of %d shards to encode", folder, len(todo), num_shards)
    bar = tqdm(total=num_docs, initial=num_docs - sum(rows_of[i] for i in todo), unit="doc",
               desc="Encoding corpus", disable=not show_progress or not todo, smoothing=0.05)
    pool = token_pool = model = home = ids = None
    budget = batch_size * max_seq_length
    try:
        for i in todo:
            if model is None:
                model = load_model()
                remaining = sum(rows_of[j] for j in todo[todo.index(i):])
                if tokens is not None and encodes_tokens(model):
                    ids = tokens(model)
                    devices = encoding_devices(remaining, 1)  # one process per GPU: nothing to tokenize
                    if devices:
                        token_pool = TokenPool(model, ids, devices, budget=budget)
                    else:
                        from pgrank.models.packing import enable_packing_for  # PyTorch: only where it encodes

                        enable_packing_for(model, ids)
                else:
                    devices = (encoding_devices(remaining, processes_per_gpu)
                               if hasattr(model, "start_multi_process_pool") else None)
                    if devices:
                        home = model.device  # the pool moves the model to CPU; it goes back afterwards
                        pool = model.start_multi_process_pool(devices)
            lo = i * chunk_size
            if token_pool is not None:
                emb = token_pool.encode(lo, lo + rows_of[i])
            elif ids is not None:
                emb = encode_token_rows(model, ids.gather(np.arange(lo, lo + rows_of[i])), ids.features, budget=budget)
            else:
                emb = encode_documents(model, texts(lo, lo + rows_of[i]), batch_size=batch_size, pool=pool)
            if dim is not None and emb.shape[1] != dim:
                raise DataError(f"{folder}: shard {i} has dimension {emb.shape[1]}, earlier shards {dim}")
            dim = emb.shape[1]
            with atomic_path(_shard_path(folder, i)) as tmp, open(tmp, "wb") as fh:
                np.save(fh, emb.astype(VECTORS))
            bar.update(rows_of[i])
    finally:
        bar.close()
        if token_pool is not None:
            token_pool.close()
        if pool is not None:
            model.stop_multi_process_pool(pool)
            model.to(home)

    meta = dict(plan, format=FORMAT, dim=dim, dtype=np.dtype(VECTORS).name, num_shards=num_shards)
    write_json(folder / META, meta)
    return open_corpus_embeddings(folder)


def corpus_embedding_folder(ref, backend: str, paths, *, max_seq_length: int,
                            corpus_sha256: str) -> Path:
    """The folder of model ``ref``'s embeddings of a corpus under ``backend`` (as
    :func:`pgrank.models.backends.effective_backend` resolves it): one artifact per model and backend
    (:func:`pgrank.models.backends.embedding_key`), length and corpus checksum. ``paths``: :class:`pgrank.paths.Paths`."""
    from pgrank.models.backends import embedding_key

    return paths.corpus_embeddings(embedding_key(ref, backend), max_seq_length, corpus_sha256)


def model_corpus_embeddings(
    ref,
    models,
    paths,
    store: CorpusStore,
    *,
    max_seq_length: int,
    batch_size: int,
    chunk_size: int,
    load_model: Callable[[], "SentenceTransformer"] | None = None,
    backend: str | None = None,
    show_progress: bool = True,
) -> CorpusEmbeddings:
    """The artifact of model ``ref`` over a corpus, built on first use (mining, training and evaluation
    all come here, so one (model, length, corpus) is encoded once).

    Args:
        ref: a :class:`pgrank.models.names.ModelRef`; ``models``: the ``models`` params section;
            ``paths``: :class:`pgrank.paths.Paths`.
        store: the dataset's corpus store (:func:`pgrank.data.corpus_store.open_corpus`; its token store is read, built on
            first use), or a small BEIR corpus dict with a ``sha256`` (tests), whose texts are encoded as strings.
        load_model: returns the encoder (default: ``ref`` under its inference backend,
            :func:`pgrank.models.backends.load_inference_encoder`; the artifact is keyed by the backend).
        backend: the model's backend where the caller has resolved it already (default:
            :func:`pgrank.models.backends.effective_backend`).
    """
    from pgrank.data.token_store import corpus_tokens
    from pgrank.models.backends import effective_backend, embedding_key, load_inference_encoder

    sha = store.sha256
    backend = backend or effective_backend(ref, models)
    key = embedding_key(ref, backend)  # fp32 and bf16 / int8 embeddings are separate artifacts
    folder = corpus_embedding_folder(ref, backend, paths, max_seq_length=max_seq_length, corpus_sha256=sha)
    loader = load_model or (lambda: load_inference_encoder(ref, models, paths, max_seq_length=max_seq_length,
                                                           backend=backend)[0])
    return build_corpus_embeddings(loader, key, store, folder, corpus_sha256=sha,
                                   max_seq_length=max_seq_length, batch_size=batch_size, chunk_size=chunk_size,
                                   show_progress=show_progress, processes_per_gpu=models.processes_per_gpu,
                                   tokens=(lambda model: corpus_tokens(model, paths, store, max_length=max_seq_length))
                                   if isinstance(store, CorpusStore) else None)


class SubsetEmbeddings:
    """Embeddings of some corpus rows only: a rerank-only system (an epoch-ablation checkpoint) needs the
    documents of its candidate sets, not the whole corpus. They are encoded once, in chunks, into a
    float16 memory map in a temporary folder that lives as long as this object.

    A model that :func:`pgrank.retrieval.dense.encoding.encodes_tokens` encodes the rows' ids from the corpus's
    token store (``tokens``; the evaluation passes the store training built, never tokenizing a whole corpus for a
    few of its rows) as the whole corpus's artifact does, in token-budget chunks of ``batch_size x
    max_seq_length`` tokens, packed where it packs; any other model, or no store, encodes their strings.

    Args:
        rows: the corpus rows to encode (any order; duplicates are encoded once).
        tokens: the corpus's token store for ``model`` (:func:`pgrank.data.token_store.corpus_tokens`).
        max_seq_length: the model's truncation length (the token budget's factor; default: the store's).
    """

    def __init__(self, model, store: CorpusStore, rows: np.ndarray, scratch: str | Path, *, batch_size: int,
                 chunk_size: int, show_progress: bool = False,
                 tokens: Callable[["SentenceTransformer"], TokenStore] | None = None, max_seq_length: int | None = None):
        import tempfile
        import weakref

        self.rows = np.unique(np.asarray(rows, dtype=np.int64))
        Path(scratch).mkdir(parents=True, exist_ok=True)
        self._tmp = tempfile.TemporaryDirectory(prefix=".subset-", dir=scratch)
        weakref.finalize(self, self._tmp.cleanup)
        self._vectors = None
        ids = tokens(model) if tokens is not None and encodes_tokens(model) else None  # None: not built
        if ids is not None:
            from pgrank.models.packing import enable_packing_for

            enable_packing_for(model, ids)
        budget = batch_size * (max_seq_length or (ids.max_length if ids is not None else 0))
        bar = tqdm(total=len(self.rows), unit="doc", desc="Encoding candidates", disable=not show_progress)
        for lo in range(0, len(self.rows), chunk_size):
            part = self.rows[lo : lo + chunk_size]
            if ids is not None:
                emb = encode_token_rows(model, ids.gather(part), ids.features, budget=budget)
            else:
                emb = encode_documents(model, store.texts(part), batch_size=batch_size)
            if self._vectors is None:
                self._vectors = np.lib.format.open_memmap(Path(self._tmp.name) / "vectors.npy", mode="w+",
                                                          dtype=VECTORS, shape=(len(self.rows), emb.shape[1]))
            self._vectors[lo : lo + len(part)] = emb.astype(VECTORS)
            bar.update(len(part))
        bar.close()
        self.dim = 0 if self._vectors is None else self._vectors.shape[1]

    def __len__(self) -> int:
        return len(self.rows)

    def vectors(self, rows: np.ndarray) -> np.ndarray:
        """float32 embeddings of the given corpus rows (each must be one of the encoded rows)."""
        rows = np.asarray(rows, dtype=np.int64)
        at = np.searchsorted(self.rows, rows)
        if len(rows) and (at.max() >= len(self.rows) or not np.array_equal(self.rows[at], rows)):
            raise KeyError("rows outside the encoded subset")
        return np.asarray(self._vectors[at], dtype=np.float32)
