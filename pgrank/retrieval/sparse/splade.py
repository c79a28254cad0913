"""Learned sparse retrieval (SPLADEv2) through sentence-transformers' ``SparseEncoder``, in bounded memory.

Documents and queries become sparse vocabulary-sized vectors; scores are their dot products.

* The corpus matrix is an artifact, like corpus embeddings: encoded once per (model, max length,
  corpus checksum) at ``Paths.sparse_corpus(...)``, one CSR shard of ``chunk_size`` rows at a time
  (``shard-NNNNN.{data,indices,indptr}.npy``; ``plan.json`` guards a resume, ``meta.json`` is written
  last), and memory-mapped by readers. MS MARCO's is about 8 GB on disk, none of it in private memory.
* Exact top-k search multiplies a block of queries with one block of corpus rows at a time and keeps
  the running best ``k`` in the run order (score descending, then id ascending;
  :func:`pgrank.data.runs.top_k`), so memory is ``query_block x doc_block`` scores, never ``Q x N``.

Example:
    >>> corpus = sparse_corpus(lambda: model, ref.key, store, folder, corpus_sha256=store.sha256,
    ...                        max_seq_length=512, batch_size=32, chunk_size=65536)
    >>> scores, rows = sparse_search(encode_sparse(model, ["fever"], task="query", batch_size=32),
    ...                              corpus, store.id_ranks, k=10)
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from tqdm.auto import tqdm

from pgrank.atomic import atomic_path, write_json
from pgrank.data.artifact_meta import META, read_meta
from pgrank.data.corpus_store import CorpusStore
from pgrank.data.runs import top_k

log = logging.getLogger(__name__)

FORMAT = "pgrank-sparse-corpus/1"
PARTS = {"data": np.float32, "indices": np.int32, "indptr": np.int64}  # the CSR arrays of a shard


def load_sparse_encoder(name, models, *, device: str | None = None, max_seq_length: int | None = None):
    """A ``SparseEncoder`` by name (alias, hub id at its pinned revision, or folder; a
    :class:`pgrank.models.names.ModelRef`), loaded as every model is (:func:`pgrank.models.loading.load_encoder`):
    safetensors only, float32, TF32 on CUDA. SPLADE checkpoints load as MLM + max pooling."""
    from pgrank.models.loading import load_encoder

    return load_encoder(name, models, device=device, max_seq_length=max_seq_length, sparse=True)


def _to_csr(tensor):
    """A torch sparse tensor as a float32 ``scipy.sparse.csr_matrix``."""
    import scipy.sparse as sp

    coo = tensor.coalesce().cpu()
    rows, cols = coo.indices().numpy()
    return sp.csr_matrix((coo.values().float().numpy(), (rows, cols)), shape=tuple(coo.shape), dtype=np.float32)


def encode_sparse(model, texts: Sequence[str], *, task: str, batch_size: int, chunk: int = 4096):
    """CSR ``(len(texts), vocab)`` of ``encode_query`` / ``encode_document`` outputs, chunk by chunk."""
    import scipy.sparse as sp

    encode = model.encode_query if task == "query" else model.encode_document
    parts = [
        _to_csr(encode(list(texts[i : i + chunk]), batch_size=batch_size, convert_to_sparse_tensor=True))
        for i in range(0, len(texts), chunk)
    ]
    return sp.vstack(parts).tocsr() if parts else sp.csr_matrix((0, 0), dtype=np.float32)


def _shard(folder: Path, i: int, part: str) -> Path:
    return folder / f"shard-{i:05d}.{part}.npy"


@dataclass(frozen=True)
class SparseCorpus:
    """A complete sparse corpus artifact, read shard by shard from memory maps."""

    folder: Path
    num_docs: int
    vocab: int
    chunk_size: int
    meta: dict

    @property
    def num_shards(self) -> int:
        return -(-self.num_docs // self.chunk_size)

    def shard(self, i: int):
        """Shard ``i`` as a CSR matrix over memory-mapped arrays."""
        import scipy.sparse as sp

        data, indices, indptr = (np.load(_shard(self.folder, i, part), mmap_mode="r") for part in PARTS)
        rows = len(indptr) - 1
        return sp.csr_matrix((data, indices, indptr), shape=(rows, self.vocab), copy=False)

    def blocks(self) -> Iterator[tuple[int, object]]:
        """``(first row, CSR shard)`` over the corpus."""
        for i in range(self.num_shards):
            yield i * self.chunk_size, self.shard(i)

    def take(self, rows: np.ndarray):
        """CSR of the given corpus rows, in that order."""
        import scipy.sparse as sp

        rows = np.asarray(rows, dtype=np.int64)
        shard_of = rows // self.chunk_size
        parts, where = [], []
        for i in np.unique(shard_of).tolist():
            mask = np.flatnonzero(shard_of == i)
            parts.append(self.shard(i)[rows[mask] - i * self.chunk_size])
            where.append(mask)
        if not parts:
            return sp.csr_matrix((0, self.vocab), dtype=np.float32)
        stacked = sp.vstack(parts).tocsr()
        order = np.empty(len(rows), dtype=np.int64)
        order[np.concatenate(where)] = np.arange(len(rows))
        return stacked[order]


def open_sparse_corpus(folder: str | Path) -> SparseCorpus:
    folder = Path(folder)
    meta = read_meta(folder, FORMAT, missing="not a complete sparse corpus artifact (no meta.json)",
                     remedy=f"delete {folder} and the next stage encodes the corpus again",
                     keys=("num_docs", "vocab", "chunk_size"))
    return SparseCorpus(folder, int(meta["num_docs"]), int(meta["vocab"]), int(meta["chunk_size"]), meta)


def _shard_done(folder: Path, i: int, rows: int) -> bool:
    try:
        indptr = np.load(_shard(folder, i, "indptr"), mmap_mode="r")
        data = np.load(_shard(folder, i, "data"), mmap_mode="r")
        indices = np.load(_shard(folder, i, "indices"), mmap_mode="r")
    except (OSError, ValueError):
        return False
    return len(indptr) == rows + 1 and len(data) == len(indices) == int(indptr[-1])


def build_sparse_corpus(load_model: Callable[[], object], model_key: str, store: CorpusStore, folder: str | Path, *,
                        corpus_sha256: str, max_seq_length: int, batch_size: int, chunk_size: int,
                        show_progress: bool = False) -> SparseCorpus:
    """Encode the corpus into ``folder`` shard by shard (resuming from finished shards); see the module docstring."""
    folder = Path(folder)
    if (folder / META).is_file():
        return open_sparse_corpus(folder)
    folder.mkdir(parents=True, exist_ok=True)
    plan = {"model": model_key, "max_seq_length": max_seq_length, "corpus_sha256": corpus_sha256,
            "num_docs": len(store), "chunk_size": chunk_size, "text": "(title + ' ' + text).strip()"}
    plan_path = folder / "plan.json"
    if not plan_path.is_file() or json.loads(plan_path.read_text(encoding="utf-8")) != plan:
        for stale in folder.glob("shard-*.npy"):
            stale.unlink()
        write_json(plan_path, plan)
    num_shards = -(-len(store) // chunk_size)
    model, vocab = None, None
    bar = tqdm(total=len(store), unit="doc", desc="Encoding corpus (sparse)", disable=not show_progress)
    for i in range(num_shards):
        lo, hi = i * chunk_size, min((i + 1) * chunk_size, len(store))
        if not _shard_done(folder, i, hi - lo):
            model = model or load_model()
            _, texts = next(store.text_blocks(lo, hi, block=hi - lo))
            matrix = encode_sparse(model, texts, task="document", batch_size=batch_size)
            for part, dtype in PARTS.items():
                with atomic_path(_shard(folder, i, part)) as tmp, open(tmp, "wb") as fh:
                    np.save(fh, getattr(matrix, part).astype(dtype))
            vocab = matrix.shape[1]
        bar.update(hi - lo)
    bar.close()
    if vocab is None:  # every shard was there already
        model = model or load_model()
        vocab = encode_sparse(model, ["x"], task="document", batch_size=1).shape[1]
    write_json(folder / META, dict(plan, format=FORMAT, vocab=int(vocab), num_shards=num_shards))
    return open_sparse_corpus(folder)


def sparse_search(queries, corpus: SparseCorpus, ranks: np.ndarray, k: int, *, query_block: int = 256,
                  doc_block: int = 16384) -> tuple[np.ndarray, np.ndarray]:
    """Exact top ``k`` per query: ``(scores, rows)`` each ``(Q, min(k, N))``, best first.

    Memory: one ``(query_block, doc_block)`` float32 block of scores and the running top ``k``.
    """
    n = min(k, corpus.num_docs)
    out_s = np.empty((queries.shape[0], n), dtype=np.float32)
    out_r = np.empty((queries.shape[0], n), dtype=np.int64)
    for qlo in range(0, queries.shape[0], query_block):
        q = queries[qlo : qlo + query_block]
        best_s = np.full((q.shape[0], 0), -np.inf, dtype=np.float32)
        best_r = np.full((q.shape[0], 0), -1, dtype=np.int64)
        for start, shard in corpus.blocks():
            for lo in range(0, shard.shape[0], doc_block):
                block = shard[lo : lo + doc_block]
                scores = np.asarray((q @ block.T).toarray(), dtype=np.float32)  # (Qb, Db)
                rows = np.arange(start + lo, start + lo + block.shape[0])[None, :]
                s, r = top_k(scores, np.broadcast_to(rows, scores.shape), ranks, n)
                best_s, best_r = top_k(np.concatenate([best_s, s], 1), np.concatenate([best_r, r], 1), ranks, n)
        out_s[qlo : qlo + q.shape[0]], out_r[qlo : qlo + q.shape[0]] = best_s[:, :n], best_r[:, :n]
    return out_s, out_r
