"""BM25 with ``bm25s``, tokenized the way Anserini's flat BEIR indexes are.

Anserini's default analyzer is Lucene's StandardTokenizer, an English possessive filter, lower
casing, Lucene's 33 English stop words and a Porter stemmer, scored with Lucene's BM25
(k1=0.9, b=0.4). We approximate the tokenizer with ``\\w+`` (Lucene keeps one-letter tokens and
numbers, unlike bm25s' default ``\\w\\w+``), strip ``'s``, lower-case, drop the stop words that
``bm25s`` ships (the same 33 for ``en``) and stem with PyStemmer. On scifact test this gives nDCG@10
0.680 against Anserini's 0.679 (``english`` Snowball stemmer; ``porter`` gives 0.677).

The document string is BEIR's ``title + " " + text``. The vocabulary is numbered in first-seen
order, so scores are identical from run to run.

Example:
    >>> index = build_bm25(corpus, params.mine.bm25)
    >>> scores, rows = bm25_search(index, ["what causes fever"], k=10)
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from pgrank.config import Bm25Config
from pgrank.data.beir import document_text
from pgrank.data.runs import id_ranks, top_k
from pgrank.errors import ConfigError

_TOKEN = re.compile(r"\w+")
_POSSESSIVE = re.compile(r"'s\b")
# bm25s' stop-word lists by the names params.yaml may use.
_STOPWORDS = {
    "en": "STOPWORDS_EN", "english": "STOPWORDS_EN", "en_plus": "STOPWORDS_EN_PLUS",
    "de": "STOPWORDS_GERMAN", "german": "STOPWORDS_GERMAN", "nl": "STOPWORDS_DUTCH", "dutch": "STOPWORDS_DUTCH",
    "fr": "STOPWORDS_FRENCH", "french": "STOPWORDS_FRENCH", "es": "STOPWORDS_SPANISH", "spanish": "STOPWORDS_SPANISH",
    "pt": "STOPWORDS_PORTUGUESE", "portuguese": "STOPWORDS_PORTUGUESE", "it": "STOPWORDS_ITALIAN",
    "italian": "STOPWORDS_ITALIAN", "ru": "STOPWORDS_RUSSIAN", "russian": "STOPWORDS_RUSSIAN",
}


@dataclass(frozen=True)
class Tokenizer:
    """Lower-case ``\\w+`` tokens, possessives stripped, stop words dropped, stemmed."""

    stopwords: frozenset[str]
    stemmer: object | None  # a PyStemmer Stemmer

    def __call__(self, text: str) -> list[str]:
        tokens = [t for t in _TOKEN.findall(_POSSESSIVE.sub("", text.lower())) if t not in self.stopwords]
        return self.stemmer.stemWords(tokens) if self.stemmer is not None and tokens else tokens


def make_tokenizer(cfg: Bm25Config) -> Tokenizer:
    """The tokenizer ``mine.bm25`` describes.

    Raises:
        ConfigError: unknown stemmer or stop-word list, naming the key.
    """
    import bm25s.stopwords
    import Stemmer

    if cfg.stopwords is None:
        stopwords = frozenset()
    elif cfg.stopwords in _STOPWORDS:
        stopwords = frozenset(getattr(bm25s.stopwords, _STOPWORDS[cfg.stopwords]))
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
    return Tokenizer(stopwords, stemmer)


@dataclass(frozen=True)
class Bm25Index:
    """A bm25s index over a corpus, with the ids and tokenizer that go with it."""

    retriever: object  # bm25s.BM25
    vocab: dict[str, int]
    tokenizer: Tokenizer
    doc_ids: list[str]
    ranks: np.ndarray  # id_ranks(doc_ids)

    def token_ids(self, query: str) -> list[int]:
        return [self.vocab[t] for t in self.tokenizer(query) if t in self.vocab]

    def scores(self, query: str) -> np.ndarray:
        """BM25 score of every document for one query, float32 ``(N,)`` (zeros if no term matches)."""
        ids = self.token_ids(query)
        if not ids:
            return np.zeros(len(self.doc_ids), dtype=np.float32)
        return np.asarray(self.retriever.get_scores_from_ids(ids), dtype=np.float32)


def build_bm25(corpus: Mapping[str, Mapping[str, str]], cfg: Bm25Config, *, show_progress: bool = False) -> Bm25Index:
    """Index a BEIR corpus (rows follow its order) with the ``mine.bm25`` settings."""
    import bm25s

    tokenizer = make_tokenizer(cfg)
    doc_ids = list(corpus)
    vocab: dict[str, int] = {}
    token_ids = [[vocab.setdefault(t, len(vocab)) for t in tokenizer(document_text(corpus[d]))] for d in doc_ids]
    retriever = bm25s.BM25(k1=cfg.k1, b=cfg.b, method=cfg.method)
    retriever.index((token_ids, vocab), show_progress=show_progress)
    return Bm25Index(retriever, retriever.vocab_dict, tokenizer, doc_ids, id_ranks(doc_ids))


def bm25_search(index: Bm25Index, queries: Sequence[str], k: int) -> tuple[np.ndarray, np.ndarray]:
    """Top ``k`` documents per query, score descending then id ascending.

    Returns:
        ``(scores, rows)``, each ``(Q, min(k, N))``; rows index ``index.doc_ids``.
    """
    n = min(k, len(index.doc_ids))
    scores = np.empty((len(queries), n), dtype=np.float32)
    rows = np.empty((len(queries), n), dtype=np.int64)
    everyone = np.arange(len(index.doc_ids))[None, :]
    for i, query in enumerate(queries):
        scores[i], rows[i] = (a[0] for a in top_k(index.scores(query)[None, :], everyone, index.ranks, n))
    return scores, rows
