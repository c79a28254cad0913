"""Training examples and batch tensors: a query, its candidate set and the candidates' grades.

A batch of ``B`` queries becomes padded tensors over the batch's *unique* candidate documents (a
document shared by several queries is encoded once): ``index (B, n)`` into the unique list,
``relevance (B, n)`` and ``mask (B, n)``.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np
import torch
from torch import Tensor

from pgrank.retrieval.dense.corpus_embeddings import CorpusEmbeddings


@dataclass(frozen=True)
class Example:
    qid: str
    query: str
    doc_ids: tuple[str, ...]
    relevance: tuple[float, ...]


def build_examples(
    queries: Mapping[str, str],
    qrels: Mapping[str, Mapping[str, int]],
    candidates: Mapping[str, Mapping[str, float]],
) -> list[Example]:
    """One example per query that has a candidate set, candidates in stage-1 order (score desc, id).

    Queries without candidates are skipped (the caller reports how many).
    """
    examples = []
    for qid in queries:
        cands = candidates.get(qid)
        if not cands:
            continue
        ordered = sorted(cands.items(), key=lambda kv: (-kv[1], kv[0]))
        judged = qrels.get(qid, {})
        ids = tuple(d for d, _ in ordered)
        examples.append(Example(qid, queries[qid], ids, tuple(float(judged.get(d, 0)) for d in ids)))
    return examples


@dataclass(frozen=True)
class Batch:
    examples: tuple[Example, ...]
    unique_ids: tuple[str, ...]  # documents to encode (or look up), each once
    index: Tensor  # (B, n) long, into unique_ids (0 at padded slots)
    relevance: Tensor  # (B, n) float
    mask: Tensor  # (B, n) bool


def make_batch(examples: Sequence[Example], device: torch.device | str = "cpu") -> Batch:
    position: dict[str, int] = {}
    for ex in examples:
        for d in ex.doc_ids:
            position.setdefault(d, len(position))
    B, n = len(examples), max(len(ex.doc_ids) for ex in examples)
    index = torch.zeros(B, n, dtype=torch.long)
    relevance = torch.zeros(B, n)
    mask = torch.zeros(B, n, dtype=torch.bool)
    for b, ex in enumerate(examples):
        k = len(ex.doc_ids)
        index[b, :k] = torch.tensor([position[d] for d in ex.doc_ids])
        relevance[b, :k] = torch.tensor(ex.relevance)
        mask[b, :k] = True
    return Batch(tuple(examples), tuple(position), index.to(device), relevance.to(device), mask.to(device))


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
    """Document embeddings looked up from a corpus-embedding artifact (``tower: query``)."""

    def __init__(self, embeddings: CorpusEmbeddings):
        self.embeddings = embeddings
        self.row = {d: i for i, d in enumerate(embeddings.doc_ids)}

    def vectors(self, doc_ids: Sequence[str], device: torch.device) -> Tensor:
        missing = [d for d in doc_ids if d not in self.row]
        if missing:
            raise KeyError(f"{len(missing)} candidate documents are not in {self.embeddings.folder} (e.g. {missing[:3]})")
        rows = np.fromiter((self.row[d] for d in doc_ids), dtype=np.int64, count=len(doc_ids))
        return torch.from_numpy(self.embeddings.vectors(rows)).to(device)
