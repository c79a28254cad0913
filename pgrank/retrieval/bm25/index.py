"""BM25 with ``bm25s``: its tokenizer and stemmer, an index built once per (corpus, settings), batched search.

Analysis follows Anserini's flat BEIR indexes (Lucene's StandardTokenizer, an English possessive
filter, lower casing, Lucene's 33 English stop words, a Porter/Snowball stemmer) as closely as
``bm25s.tokenization.Tokenizer`` allows: lower-cased ``\\w+`` tokens (one-letter tokens and numbers
kept, as Lucene does; bm25s' default drops them) with a trailing ``'s`` consumed, the stop words of
``mine.bm25.stopwords`` and PyStemmer's ``mine.bm25.stemmer``. Scores are Lucene's BM25 (k1=0.9,
b=0.4). On scifact test nDCG@10 is 0.680 (Anserini: 0.679), on nfcorpus 0.320 (0.322).

The index is an artifact, like corpus embeddings: built once per corpus (its SHA-256) and settings, at
``Paths.bm25_index(settings_key(cfg), sha)``, and memory-mapped by every process that searches it
(mining and evaluation). Building streams the corpus store (:mod:`pgrank.data.corpus_store`): token ids
go to a temporary file, and ``bm25s`` builds its sparse score matrix from it without a Python list per
document. The vocabulary is numbered in first-seen order, so the artifact is identical from build to build.

Search imposes the run order of pgrank (score descending, then document id ascending) exactly, on
bm25s' own scores (:meth:`Bm25Index.search`): large batches go through bm25s' batched multi-threaded
retrieval (numba backend) a quarter deeper than asked, which settles almost every tie across the cut-off
(bm25s keeps an arbitrary subset of a tie; BM25 ties at rank 1000 in 9 queries of 10, and 1,250 deep
settles all of them in 2,048 MS MARCO-shaped queries); the others, and small batches, are selected from
the query's score vector without a sort key over the whole corpus.

Example:
    >>> index = bm25_index(paths, "scifact", params.mine.bm25)
    >>> scores, rows = index.search(index.token_ids(["what causes fever"]), k=10)
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
from array import array
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from pgrank.atomic import atomic_path, write_json
from pgrank.config import Bm25Config
from pgrank.data.artifact_meta import META
from pgrank.data.columns import Appender, open_raw
from pgrank.data.corpus_store import CorpusStore, open_corpus
from pgrank.data.runs import from_order_keys, order_keys, top_k
from pgrank.errors import ConfigError
from pgrank.paths import Paths

log = logging.getLogger(__name__)

FORMAT = "pgrank-bm25-index/1"
# Lower-cased \w+ tokens; a trailing possessive 's is consumed with its word (Lucene's possessive filter).
SPLITTER = r"(?u)(\w+)(?:'s\b)?"
# Batched retrieval goes through bm25s' numba backend (all cores; about 30 s of JIT compilation per
# process, so only worth it for large batches) when a search scores at least this many pairs.
NUMBA_WORK = 2 * 10**9
# bm25s' stop-word lists by the names params.yaml may use.
_STOPWORDS = {
    "en": "STOPWORDS_EN", "english": "STOPWORDS_EN", "en_plus": "STOPWORDS_EN_PLUS",
    "de": "STOPWORDS_GERMAN", "german": "STOPWORDS_GERMAN", "nl": "STOPWORDS_DUTCH", "dutch": "STOPWORDS_DUTCH",
    "fr": "STOPWORDS_FRENCH", "french": "STOPWORDS_FRENCH", "es": "STOPWORDS_SPANISH", "spanish": "STOPWORDS_SPANISH",
    "pt": "STOPWORDS_PORTUGUESE", "portuguese": "STOPWORDS_PORTUGUESE", "it": "STOPWORDS_ITALIAN",
    "italian": "STOPWORDS_ITALIAN", "ru": "STOPWORDS_RUSSIAN", "russian": "STOPWORDS_RUSSIAN",
}


def make_tokenizer(cfg: Bm25Config):
    """A fresh ``bm25s.tokenization.Tokenizer`` with ``mine.bm25``'s stop words and stemmer.

    Raises:
        ConfigError: unknown stemmer or stop-word list, naming the key.
    """
    import bm25s.stopwords
    import Stemmer
    from bm25s.tokenization import Tokenizer

    if cfg.stopwords is None:
        stopwords: list[str] = []
    elif cfg.stopwords in _STOPWORDS:
        stopwords = list(getattr(bm25s.stopwords, _STOPWORDS[cfg.stopwords]))
    else:
        raise ConfigError(
            f"params.yaml: mine.bm25.stopwords: unknown list {cfg.stopwords!r}; one of {sorted(_STOPWORDS)} or null"
        )
    stemmer = None
    if cfg.stemmer is not None:
        if cfg.stemmer not in Stemmer.algorithms():
            raise ConfigError(
                f"params.yaml: mine.bm25.stemmer: unknown stemmer {cfg.stemmer!r}; one of {Stemmer.algorithms()} or null"
            )
        stemmer = Stemmer.Stemmer(cfg.stemmer)
    return Tokenizer(lower=True, splitter=SPLITTER, stopwords=stopwords, stemmer=stemmer)


def settings_key(cfg: Bm25Config) -> str:
    """What the index depends on besides the corpus: ``{method}-{hash of the settings and analysis}``."""
    blob = json.dumps({"format": FORMAT, "splitter": SPLITTER, **cfg.model_dump(mode="json")}, sort_keys=True)
    return f"{cfg.method}-{hashlib.sha256(blob.encode()).hexdigest()[:12]}"


def _vocabulary(tokenizer, stemmed: bool) -> dict[str, int]:
    return tokenizer.stem_to_sid if stemmed else tokenizer.word_to_id


class _TokenStream:
    """The corpus' token ids, re-iterable one document at a time from a memory-mapped file (what
    ``bm25s.BM25.build_index_from_ids`` reads three times), instead of a list of lists in memory."""

    def __init__(self, flat: np.ndarray, offsets: np.ndarray):
        self.flat, self.offsets = flat, offsets

    def __len__(self) -> int:
        return len(self.offsets) - 1

    def __iter__(self):
        flat, offsets = self.flat, self.offsets
        for lo in range(0, len(self), 65536):
            hi = min(lo + 65536, len(self))
            block = flat[offsets[lo] : offsets[hi]].tolist()
            cuts = (offsets[lo : hi + 1] - offsets[lo]).tolist()
            for a, b in zip(cuts[:-1], cuts[1:]):
                yield block[a:b]


class Bm25Index:
    """A bm25s index over one corpus store, memory-mapped, with the tokenizer that goes with it."""

    def __init__(self, retriever, tokenizer, ranks: np.ndarray, id_order: np.ndarray, folder: Path | None = None):
        self.retriever = retriever
        self.tokenizer = tokenizer
        self.ranks = ranks  # (N,) id rank of each row: the tie order
        self.id_order = id_order  # (N,) rows sorted by id
        self.folder = folder
        self.num_docs = int(retriever.scores["num_docs"])
        # Lucene, Robertson and ATIRE scores are >= 0 and exactly 0 for a document without a query term.
        self.nonnegative = retriever.nonoccurrence_array is None

    def token_ids(self, texts: Sequence[str]) -> list[list[int]]:
        """Each query's token ids (words whose stem is not in the vocabulary are dropped)."""
        return list(self.tokenizer.streaming_tokenize(list(texts), update_vocab=False, allow_empty=False))

    def scores(self, ids: Sequence[int]) -> np.ndarray:
        """BM25 score of every document for one query's token ids, float32 ``(N,)`` (zeros if none)."""
        if not len(ids):
            return np.zeros(self.num_docs, dtype=np.float32)
        return np.asarray(self.retriever.get_scores_from_ids(list(ids)), dtype=np.float32)

    def pair_scores(self, ids: Sequence[int], rows: np.ndarray) -> np.ndarray:
        """BM25 scores of the given documents only, equal to ``scores(ids)[rows]`` (the same float32 sum
        in the same order) without a vector over the corpus."""
        rows = np.asarray(rows, dtype=np.int64)
        out = np.zeros(len(rows), dtype=np.float32)
        s = self.retriever.scores
        data, indices, indptr = s["data"], s["indices"], s["indptr"]
        for t in ids:
            lo, hi = int(indptr[t]), int(indptr[t + 1])
            if hi == lo:
                continue
            posting = indices[lo:hi]
            at = np.minimum(np.searchsorted(posting, rows), hi - lo - 1)
            hit = posting[at] == rows
            out[hit] += data[lo:hi][at[hit]]
        extra = self.retriever.nonoccurrence_array
        if extra is not None and len(ids):
            out += extra[np.asarray(ids)].sum()
        return out

    def _smallest_ids(self, rows: np.ndarray, need: int) -> np.ndarray:
        """The ``need`` rows of ``rows`` with the smallest ids."""
        if need >= len(rows):
            return rows
        return rows[np.argpartition(self.ranks[rows], need - 1)[:need]]

    def _matching(self, ids: Sequence[int]) -> np.ndarray:
        """The documents that contain a query term (the union of its posting lists), sorted."""
        s = self.retriever.scores
        indptr, indices = s["indptr"], s["indices"]
        parts = [np.asarray(indices[int(indptr[t]) : int(indptr[t + 1])]) for t in dict.fromkeys(ids)]
        if not parts:
            return np.zeros(0, dtype=np.int64)
        rows = np.sort(np.concatenate(parts)).astype(np.int64)  # (a sort: np.unique hashes, 20x slower here)
        return rows[np.concatenate([[True], rows[1:] != rows[:-1]])]

    def _fill_zeros(self, positive: np.ndarray, need: int) -> np.ndarray:
        """The ``need`` documents with the smallest ids outside ``positive`` (they all score 0)."""
        walk = self.id_order[: need + len(positive)]
        return walk[~np.isin(walk, positive)][:need]

    def top(self, ids: Sequence[int], n: int) -> tuple[np.ndarray, np.ndarray]:
        """One query's exact top ``n`` (``n <= N``), in the run order.

        With non-negative scores the threshold is found among the documents that contain a query term
        (the union of its posting lists: a small share of the corpus), and documents tied at it are
        taken by smallest id (the documents without a query term score 0 and are taken in id order),
        so no pass and no sort key over the whole corpus is needed.
        """
        s = self.scores(ids)
        if self.nonnegative:
            matching = self._matching(ids)
            positive = matching[s[matching] > 0]
            if len(positive) >= n:
                cut = np.partition(s[positive], len(positive) - n)[len(positive) - n]
                above, tied = positive[s[positive] > cut], positive[s[positive] == cut]
                chosen = self._smallest_ids(tied, n - len(above))
            else:
                above, chosen = positive, self._fill_zeros(positive, n - len(positive))
        else:
            cut = np.partition(s, self.num_docs - n)[self.num_docs - n]
            above = np.flatnonzero(s > cut)
            chosen = self._smallest_ids(np.flatnonzero(s == cut), n - len(above))
        rows = np.concatenate([above, chosen])
        return tuple(a[0] for a in top_k(s[rows][None, :], rows[None, :], self.ranks, n))

    def search(self, queries: list[list[int]], k: int, *, threads: int | None = None) -> tuple[np.ndarray, np.ndarray]:
        """Top ``k`` documents of each query, score descending then id ascending.

        Large batches (at least :data:`NUMBA_WORK` query-document pairs) go through bm25s' batched
        retrieval on its numba backend, on every core, :func:`search_depth` deep: a query whose last
        score there is below its ``k``-th has all its documents tied at the ``k``-th among them, and is
        ordered exactly from them (one sort of their keys); the rest (and small batches) take :meth:`top`.

        Args:
            queries: token ids of each query (:meth:`token_ids`).
            k: documents per query.
            threads: retrieval threads (default: every core this process may use).

        Returns:
            ``(scores, rows)``, each ``(Q, min(k, N))`` float32 / int64.
        """
        n = min(k, self.num_docs)
        out_s = np.zeros((len(queries), n), dtype=np.float32)
        out_r = np.zeros((len(queries), n), dtype=np.int64)
        if not queries or n == 0:
            return out_s, out_r
        todo = list(range(len(queries)))
        depth = min(search_depth(n), self.num_docs)
        if len(queries) * self.num_docs >= NUMBA_WORK and n < self.num_docs:
            self.retriever.backend = "numba"
            threads = threads or len(os.sched_getaffinity(0))
            nonempty = [i for i in todo if queries[i]]
            docs, scores = self.retriever.retrieve([queries[i] for i in nonempty], k=depth, sorted=True,
                                                   n_threads=threads, show_progress=False)
            docs, scores = np.asarray(docs, dtype=np.int64), np.asarray(scores, dtype=np.float32)
            cut, last = scores[:, n - 1], scores[:, depth - 1]
            resolved = (last < cut) | (depth == self.num_docs)
            keys = order_keys(scores[resolved], self.ranks[docs[resolved]])
            keys.sort(axis=1)  # bm25s' order already (score descending); the sort settles ties by id
            s, r = from_order_keys(keys[:, :n], self.id_order)
            done = np.asarray(nonempty, dtype=np.int64)[resolved]
            out_s[done], out_r[done] = s, r
            if self.nonnegative:  # cut at 0: every positive score is among those retrieved, the rest are 0
                zero = np.flatnonzero(~resolved & (cut == 0))
                for j in zero.tolist():
                    keep = scores[j] > 0
                    fill = self._fill_zeros(docs[j][keep], n - int(keep.sum()))
                    rows = np.concatenate([docs[j][keep], fill])
                    values = np.concatenate([scores[j][keep], np.zeros(len(fill), dtype=np.float32)])
                    out_s[nonempty[j]], out_r[nonempty[j]] = (a[0] for a in top_k(values[None, :], rows[None, :],
                                                                                   self.ranks, n))
                done = np.concatenate([done, np.asarray(nonempty, dtype=np.int64)[zero]])
            todo = sorted(set(todo) - set(done.tolist()))
        for i in todo:
            out_s[i], out_r[i] = self.top(queries[i], n)
        return out_s, out_r


def search_depth(k: int) -> int:
    """How deep batched retrieval goes to order a top ``k`` exactly: ``k`` plus a quarter (at least 64)."""
    return k + max(64, k // 4)


def build_bm25_index(store: CorpusStore, cfg: Bm25Config, folder: str | Path, *, progress: bool = False) -> Bm25Index:
    """Tokenize the corpus and build the bm25s index into ``folder`` (atomically)."""
    import bm25s
    from tqdm.auto import tqdm

    folder = Path(folder)
    tokenizer = make_tokenizer(cfg)
    with atomic_path(folder, directory=True) as tmp:
        flat = Appender(tmp / "tokens.tmp", "int32")
        offsets = array("q", [0])
        with tqdm(total=len(store), unit="doc", desc="BM25: tokenizing", disable=not progress, leave=False) as bar:
            for _, texts in store.text_blocks(block=8192):
                ids = list(tokenizer.streaming_tokenize(texts, update_vocab=True, allow_empty=False))
                for doc in ids:
                    offsets.append(offsets[-1] + len(doc))
                flat.append(np.fromiter((t for doc in ids for t in doc), dtype=np.int32, count=offsets[-1] - flat.count))
                bar.update(len(texts))
        flat.close()
        vocab = _vocabulary(tokenizer, cfg.stemmer is not None)
        tokens = _TokenStream(open_raw(flat.path, "int32", flat.count), np.frombuffer(offsets, dtype=np.int64))
        retriever = bm25s.BM25(k1=cfg.k1, b=cfg.b, method=cfg.method, csc_backend="scipy")
        retriever.scores = retriever.build_index_from_ids(list(vocab.values()), tokens, show_progress=progress)
        retriever.vocab_dict = vocab
        del tokens
        flat.path.unlink()
        retriever.save(str(tmp))
        write_json(tmp / META, {"format": FORMAT, "settings": cfg.model_dump(mode="json"), "splitter": SPLITTER,
                                       "corpus_sha256": store.sha256, "num_docs": len(store), "vocabulary": len(vocab)})
    log.info("BM25 index of %d documents, %d terms -> %s", len(store), len(vocab), folder)
    return open_bm25_index(folder, cfg, store)


def open_bm25_index(folder: str | Path, cfg: Bm25Config, store: CorpusStore) -> Bm25Index:
    """Load a built index, memory-mapped."""
    import bm25s

    folder = Path(folder)
    retriever = bm25s.BM25.load(str(folder), mmap=True, load_vocab=True, show_progress=False)
    tokenizer = make_tokenizer(cfg)
    if cfg.stemmer is not None:
        tokenizer.stem_to_sid = retriever.vocab_dict
    else:
        tokenizer.word_to_id = retriever.vocab_dict
    return Bm25Index(retriever, tokenizer, store.id_ranks, store.id_order, folder)


def bm25_index(paths: Paths, dataset: str, cfg: Bm25Config, *, store: CorpusStore | None = None,
               progress: bool = False) -> Bm25Index:
    """The BM25 index of ``dataset`` with settings ``cfg``, built on first use (mining and evaluation both
    come here, so a corpus is indexed once per settings)."""
    store = store or open_corpus(paths, dataset, progress=progress)
    folder = paths.bm25_index(settings_key(cfg), store.sha256)
    if (folder / META).is_file():
        return open_bm25_index(folder, cfg, store)
    return build_bm25_index(store, cfg, folder, progress=progress)
