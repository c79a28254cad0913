"""Query embeddings, kept: a query text is encoded once per (model, backend, max_seq_length), as a corpus is.

Mining and evaluation encode the same queries with the same model: the demo's warm start mines the test sets'
candidates and is then evaluated on the same test queries; a gate scores its frozen queries with the champion at
every decision. So, like a corpus's embeddings, a model's query embeddings are kept under
``Paths.query_embeddings(model key, max_seq_length)`` (the key of :func:`pgrank.models.backends.embedding_key`:
the model's weights or pinned revision and its backend), keyed by each query's text::

    <digest>.vectors.npy    float32 (n, dim): the model's output for n texts (before any cosine normalisation)
    <digest>.keys.npy       (n,) 16-byte BLAKE2b digests of the same texts, in the same order; written last,
                            so a shard whose keys exist is complete (each file is written atomically)

A shard is the misses of one call (its name: the digest of its keys, so two processes that encode the same texts
write the same file). Only the keys are read when a store opens (16 bytes a query: a million queries are 16 MB);
vectors are read memory-mapped, a shard at a time. The texts are hashed as the encoder receives them (its query
prompt, if any, is part of the model).
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Sequence
from pathlib import Path

import numpy as np

from pgrank.atomic import atomic_path

KEY = np.dtype("S16")
KEYS, VECTORS = ".keys.npy", ".vectors.npy"


def text_keys(texts: Sequence[str]) -> np.ndarray:
    """The 16-byte BLAKE2b digests of ``texts`` (UTF-8), as an ``S16`` array."""
    return np.array([hashlib.blake2b(t.encode("utf-8"), digest_size=16).digest() for t in texts], dtype=KEY)


def _save(path: Path, array: np.ndarray) -> None:
    with atomic_path(path) as tmp, open(tmp, "wb") as fh:
        np.save(fh, array, allow_pickle=False)


class QueryEmbeddings:
    """The query embeddings kept in ``folder`` for one model (see the module docstring).

    :meth:`encode` returns every text's vector, encoding (with ``encode``) only the texts not kept yet, and keeps
    those. Shards written by this instance are added to its index without reading the folder again.
    """

    def __init__(self, folder: str | Path):
        self.folder = Path(folder)
        self._names: list[str] = []
        self._keys = np.zeros(0, KEY)  # sorted, with the (shard, row) of each
        self._shard = np.zeros(0, np.int32)
        self._row = np.zeros(0, np.int64)
        self._loaded = False

    def _add(self, shards: list[tuple[str, np.ndarray]]) -> None:
        """Index shards ``(name, keys)``: one sort for all of them."""
        if not shards:
            return
        first = len(self._names)
        self._names += [name for name, _ in shards]
        keys = np.concatenate([self._keys, *(k for _, k in shards)])
        shard = np.concatenate([self._shard, *(np.full(len(k), first + i, np.int32) for i, (_, k) in enumerate(shards))])
        row = np.concatenate([self._row, *(np.arange(len(k), dtype=np.int64) for _, k in shards)])
        order = np.argsort(keys, kind="stable")
        self._keys, self._shard, self._row = keys[order], shard[order], row[order]

    def _load(self) -> None:
        if self._loaded:
            return
        self._loaded = True
        shards = []
        for path in sorted(self.folder.glob(f"*{KEYS}")) if self.folder.is_dir() else []:
            name = path.name[: -len(KEYS)]
            if not (self.folder / f"{name}{VECTORS}").is_file():
                continue
            try:
                keys = np.load(path, allow_pickle=False)
            except (OSError, ValueError):  # unreadable: encoded again, and written again under the same name
                continue
            if keys.dtype == KEY and keys.ndim == 1:
                shards.append((name, keys))
        self._add(shards)

    def _find(self, keys: np.ndarray) -> np.ndarray:
        """The position in the sorted index of each key, -1 where it is not kept."""
        if not len(self._keys):
            return np.full(len(keys), -1, np.int64)
        at = np.searchsorted(self._keys, keys)
        found = (at < len(self._keys)) & (self._keys[np.minimum(at, len(self._keys) - 1)] == keys)
        return np.where(found, at, -1)

    def _vectors(self, shard: int) -> np.ndarray:
        return np.load(self.folder / f"{self._names[shard]}{VECTORS}", mmap_mode="r", allow_pickle=False)

    def encode(self, texts: Sequence[str], encode: Callable[[list[str]], np.ndarray]) -> np.ndarray:
        """float32 ``(len(texts), dim)``: kept vectors where there are, ``encode(misses)`` for the rest (kept)."""
        if not len(texts):
            return np.asarray(encode([]), dtype=np.float32)
        self._load()
        keys = text_keys(texts)
        at = self._find(keys)
        miss = np.flatnonzero(at < 0)
        fresh = None
        if len(miss):
            _, first, inverse = np.unique(keys[miss], return_index=True, return_inverse=True)
            order = np.argsort(first)  # the new texts in the caller's order, each once
            position = np.empty_like(order)
            position[order] = np.arange(len(order))
            new = miss[first[order]]
            fresh = np.asarray(encode([texts[i] for i in new]), dtype=np.float32)
            if fresh.ndim != 2 or len(fresh) != len(new):
                raise ValueError(f"the encoder returned shape {fresh.shape} for {len(new)} texts")
            name = hashlib.blake2b(keys[new].tobytes(), digest_size=16).hexdigest()
            _save(self.folder / f"{name}{VECTORS}", fresh)
            _save(self.folder / f"{name}{KEYS}", keys[new])
            self._add([(name, keys[new])])
            fresh = fresh[position[inverse.reshape(-1)]]
        hit = np.flatnonzero(at >= 0)
        dim = fresh.shape[1] if fresh is not None else self._vectors(int(self._shard[at[hit[0]]])).shape[1]
        out = np.empty((len(texts), dim), np.float32)
        if fresh is not None:
            out[miss] = fresh
        if len(hit):
            shards, rows = self._shard[at[hit]], self._row[at[hit]]
            for shard in np.unique(shards):
                mine = shards == shard
                vectors = self._vectors(int(shard))
                if vectors.shape[1] != dim:
                    raise ValueError(f"{self.folder}: {self._names[shard]}{VECTORS} holds {vectors.shape[1]}-d "
                                     f"vectors, not {dim}-d; remove the folder to encode the queries again")
                out[hit[mine]] = vectors[rows[mine]]
        return out
