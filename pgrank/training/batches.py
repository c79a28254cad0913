"""Training examples and batch tensors: a query, its candidate set and the candidates' grades.

Examples come from a split's candidate store (:mod:`pgrank.data.candidate_store`), memory-mapped: a
:class:`TrainingSet` (:func:`training_set`) hands out one batch of queries at a time, so no process (and no
DDP rank) holds a split's candidate sets (MS MARCO: 5x10^8 pairs) as Python objects or in private memory.
In ``tower: query`` mode the documents are :class:`FrozenDocuments` (:func:`frozen_documents`), rows of the
warm start's corpus-embedding artifact.

A batch of ``B`` queries becomes padded tensors over the batch's *unique* candidate documents (a
document shared by several queries is encoded once, in first-seen order): ``index (B, n)`` into the
unique corpus rows, ``relevance (B, n)`` and ``mask (B, n)``.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch
from torch import Tensor

from pgrank.config import Params
from pgrank.data.candidate_store import CandidateStore, open_candidates
from pgrank.errors import DataError
from pgrank.paths import Paths
from pgrank.retrieval.dense.corpus_embeddings import CorpusEmbeddings, model_corpus_embeddings


@dataclass(frozen=True)
class Example:
    qid: str
    query: str
    rows: np.ndarray  # (n,) corpus rows of the candidates, in stage-1 rank order
    relevance: np.ndarray  # (n,) their grades
    row: int = -1  # the query's row in the candidate store (and in its queries' token store)


class TrainingSet:
    """A split's candidate sets as training examples, read from the memory-mapped store on demand."""

    def __init__(self, store: CandidateStore):
        self.store = store

    def __len__(self) -> int:
        return len(self.store)

    def __getitem__(self, i: int) -> Example:
        rows, grades = self.store.candidates(i)
        return Example(self.store.qids[i], self.store.queries[i], rows, grades, int(i))

    def examples(self, indices: Sequence[int]) -> list[Example]:
        return [self[int(i)] for i in indices]


@dataclass(frozen=True)
class Batch:
    examples: tuple[Example, ...]
    unique_rows: np.ndarray  # (U,) corpus rows to encode (or look up), each once, in first-seen order
    index: Tensor  # (B, n) long, into unique_rows (0 at padded slots)
    relevance: Tensor  # (B, n) float
    mask: Tensor  # (B, n) bool


def make_batch(examples: Sequence[Example], device: torch.device | str = "cpu") -> Batch:
    sizes = [len(ex.rows) for ex in examples]
    flat = np.concatenate([np.asarray(ex.rows, dtype=np.int64) for ex in examples])
    unique, first, inverse = np.unique(flat, return_index=True, return_inverse=True)
    seen_order = np.argsort(first, kind="stable")  # unique rows in first-seen order
    position = np.empty(len(unique), dtype=np.int64)
    position[seen_order] = np.arange(len(unique))
    B, n = len(examples), max(sizes)
    index = torch.zeros(B, n, dtype=torch.long)
    relevance = torch.zeros(B, n)
    mask = torch.zeros(B, n, dtype=torch.bool)
    at = 0
    for b, ex in enumerate(examples):
        k = sizes[b]
        index[b, :k] = torch.from_numpy(position[inverse[at : at + k]])
        relevance[b, :k] = torch.as_tensor(np.asarray(ex.relevance, dtype=np.float32))
        mask[b, :k] = True
        at += k
    return Batch(tuple(examples), unique[seen_order], index.to(device), relevance.to(device), mask.to(device))


def query_generators(seed: int, epoch: int, qids: Sequence[str], device: torch.device) -> list[torch.Generator]:
    """One RNG per query, seeded by (seed, epoch, qid): sampling is independent of batch layout."""
    gens = []
    for qid in qids:
        digest = hashlib.sha256(f"{seed}\x00{epoch}\x00{qid}".encode()).digest()
        gens.append(torch.Generator(device=device).manual_seed(int.from_bytes(digest[:8], "little") >> 1))
    return gens


def epoch_order(num: int, seed: int, epoch: int, limit: int | None) -> list[int]:
    """The seeded order in which an epoch visits the examples (first ``limit`` only, if given)."""
    order = np.random.default_rng([seed, epoch]).permutation(num).tolist()
    return order[:limit] if limit else order


class FrozenDocuments:
    """Document embeddings looked up by corpus row from a corpus-embedding artifact (``tower: query``)."""

    def __init__(self, embeddings: CorpusEmbeddings):
        self.embeddings = embeddings

    def vectors(self, rows: np.ndarray, device: torch.device) -> Tensor:
        rows = np.asarray(rows, dtype=np.int64)
        if len(rows) and (rows.min() < 0 or rows.max() >= self.embeddings.num_docs):
            raise KeyError(f"candidate rows outside the {self.embeddings.num_docs} rows of {self.embeddings.folder}")
        return torch.from_numpy(self.embeddings.vectors(rows)).to(device)


def training_set(paths: Paths, dataset: str, split: str, corpus, training: bool = False) -> TrainingSet:
    """The candidate store of ``dataset/split`` (``training``: a ``train.validation_sets`` set, among the
    training sets), checked against ``corpus``."""
    store = open_candidates(paths, dataset, split, training)
    if store.meta.get("corpus_sha256") != corpus.sha256:
        raise DataError(f"{store.folder}: mined from another version of the {dataset} corpus; run `pgrank mine --training`")
    if not len(store):
        raise DataError(f"{store.folder}: no query of {dataset}/{split} has a candidate set")
    return TrainingSet(store)


def frozen_documents(params: Params, paths: Paths, ref, corpus) -> FrozenDocuments:
    """The warm start's corpus-embedding artifact (shared with mining when the model and length match)."""
    cfg = params.train
    return FrozenDocuments(model_corpus_embeddings(
        ref, params.models, paths, corpus, max_seq_length=cfg.max_doc_length, batch_size=params.mine.batch_size,
        chunk_size=params.mine.chunk_size))


def candidate_scores(q: Tensor, docs: Tensor, index: Tensor, similarity: str) -> Tensor:
    """``(B, n)`` scores of each query against its candidates (``index`` into ``docs``' rows)."""
    if similarity == "cosine":
        q, docs = torch.nn.functional.normalize(q, dim=-1), torch.nn.functional.normalize(docs, dim=-1)
    return torch.einsum("bd,bnd->bn", q, docs[index])
