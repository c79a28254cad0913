"""A synthetic BEIR dataset of MS MARCO's shape at a fraction ``f`` of its size (for bench/scale.py).

MS MARCO passage ranking in BEIR: 8,841,823 passages (no titles, 56 words on average, ids "0".."N-1"),
502,939 training queries with 532,761 judgments (about 1.06 relevant passages each), 6,980 dev
queries. At fraction ``f`` this writes ``round(N * f)`` passages and ``round(Q * f)`` queries of each
split, with

* passage lengths drawn from a log-normal fitted to MS MARCO's words per passage (median 50, mean 56,
  clipped to 4..250 words);
* words drawn from a Zipf law (exponent 1) over a 300k-word vocabulary whose most frequent words are
  English function words (so stop-word removal and stemming behave as on real text) and the rest
  pronounceable pseudo-words, so that the number of distinct terms grows with ``f`` as in real text;
* queries of 3-9 words (MS MARCO: 6 on average) made of the rarer words of one passage, its only
  judged-relevant document (grade 1), plus a few frequent words ("what is the ...").

Quality is not the point: the files have MS MARCO's sizes, length distribution and term statistics,
so every stage does MS MARCO's work at ``f`` of the size. Deterministic for a seed.

Example:
    >>> stats = write_dataset(Path("/tmp/x/msmarco"), fraction=0.01)
    >>> stats["passages"], stats["train_queries"]
    (88418, 5029)
"""

from __future__ import annotations

import hashlib
import json
import zipfile
from pathlib import Path

import numpy as np

PASSAGES, TRAIN_QUERIES, DEV_QUERIES = 8_841_823, 502_939, 6_980
VOCABULARY = 300_000
FUNCTION_WORDS = ("the of and to a in is for that are or as on with be by it this from can was an at you your "
                  "not which have also has more may they what how when does their one its will used about all "
                  "other than most these been some there were many into if only who between")
CONSONANTS, VOWELS = "bcdfghjklmnprstvwz", "aeiou"


def _vocabulary(rng: np.random.Generator) -> np.ndarray:
    """Function words first, then pseudo-words of 1-4 consonant-vowel syllables (with an -s/-ing/-ed
    suffix on some, for the stemmer), all distinct."""
    words = list(dict.fromkeys(FUNCTION_WORDS.split()))
    syllables = np.array([c + v for c in CONSONANTS for v in VOWELS], dtype=object)
    suffixes = np.array(["", "", "", "", "s", "ing", "ed"], dtype=object)
    seen = set(words)
    while len(words) < VOCABULARY:
        n = 2 * VOCABULARY
        lengths = rng.choice([1, 2, 3, 4], size=n, p=[0.1, 0.55, 0.3, 0.05])
        parts = syllables[rng.integers(0, len(syllables), (n, 4))]
        ends = suffixes[rng.integers(0, len(suffixes), n)]
        for row, k, end in zip(parts.tolist(), lengths.tolist(), ends.tolist()):
            word = "".join(row[:k]) + end
            if word not in seen:
                seen.add(word)
                words.append(word)
                if len(words) == VOCABULARY:
                    break
    return np.array(words, dtype=object)


def _zipf_cdf() -> np.ndarray:
    weights = 1.0 / (np.arange(VOCABULARY) + 2.7)
    return np.cumsum(weights) / weights.sum()


def _lengths(rng: np.random.Generator, n: int) -> np.ndarray:
    return np.clip(np.rint(rng.lognormal(np.log(50.0), 0.45, n)), 4, 250).astype(np.int64)


def write_dataset(folder: Path, fraction: float, *, seed: int = 0, block: int = 50_000) -> dict:
    """Write ``corpus.jsonl``, ``queries.jsonl`` and ``qrels/{train,dev}.tsv`` into ``folder``.

    Returns:
        ``{"passages", "train_queries", "dev_queries", "words", "corpus_bytes"}``.
    """
    rng = np.random.default_rng(seed)
    vocab = _vocabulary(rng)
    cdf = _zipf_cdf()
    n_docs = max(1, round(PASSAGES * fraction))
    n_train, n_dev = max(2, round(TRAIN_QUERIES * fraction)), max(1, round(DEV_QUERIES * fraction))
    relevant = rng.choice(n_docs, size=n_train + n_dev, replace=n_train + n_dev > n_docs)
    want = {int(d): [] for d in relevant}  # passage -> the query numbers it is relevant to
    for q, d in enumerate(relevant.tolist()):
        want[d].append(q)
    query_text: dict[int, str] = {}
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "qrels").mkdir(exist_ok=True)
    words = 0
    with open(folder / "corpus.jsonl", "w", encoding="utf-8") as fh:
        for lo in range(0, n_docs, block):
            hi = min(lo + block, n_docs)
            lengths = _lengths(rng, hi - lo)
            ranks = np.searchsorted(cdf, rng.random(int(lengths.sum())))
            words += len(ranks)
            cuts = np.concatenate([[0], np.cumsum(lengths)])
            lines = []
            for i in range(hi - lo):
                doc = ranks[cuts[i] : cuts[i + 1]]
                lines.append(json.dumps({"_id": str(lo + i), "title": "", "text": " ".join(vocab[doc])}) + "\n")
                for q in want.get(lo + i, ()):
                    query_text[q] = _query(rng, vocab, cdf, doc)
            fh.writelines(lines)
    qids = [str(1_000_000 + q) for q in range(n_train + n_dev)]
    with open(folder / "queries.jsonl", "w", encoding="utf-8") as fh:
        fh.writelines(json.dumps({"_id": qids[q], "text": query_text[q]}) + "\n" for q in range(n_train + n_dev))
    for split, span in (("train", range(n_train)), ("dev", range(n_train, n_train + n_dev))):
        rows = [f"{qids[q]}\t{relevant[q]}\t1" for q in span]
        (folder / "qrels" / f"{split}.tsv").write_text("\r\n".join(["query-id\tcorpus-id\tscore", *rows]) + "\r\n")
    return {"passages": n_docs, "train_queries": n_train, "dev_queries": n_dev, "words": words,
            "corpus_bytes": (folder / "corpus.jsonl").stat().st_size}


def _query(rng: np.random.Generator, vocab: np.ndarray, cdf: np.ndarray, doc: np.ndarray) -> str:
    """3-9 words: 2-5 of the passage's rarer words and 1-4 frequent ones, shuffled."""
    content = np.unique(doc[doc >= 60])
    if len(content) == 0:
        content = np.unique(doc)
    take = rng.choice(content, size=min(len(content), int(rng.integers(2, 6))), replace=False)
    common = np.searchsorted(cdf, rng.random(int(rng.integers(1, 5))) * cdf[59])
    terms = np.concatenate([take, common])
    rng.shuffle(terms)
    return " ".join(vocab[terms])


def write_mirror(dataset_folder: Path, mirror: Path, name: str = "msmarco") -> Path:
    """``mirror/NAME.zip`` (members ``NAME/...`` as in BEIR's zips) and its ``SHA256SUMS``."""
    mirror.mkdir(parents=True, exist_ok=True)
    target = mirror / f"{name}.zip"
    with zipfile.ZipFile(target, "w", zipfile.ZIP_DEFLATED, compresslevel=1) as zf:
        for path in sorted(p for p in dataset_folder.rglob("*") if p.is_file()):
            zf.write(path, f"{name}/{path.relative_to(dataset_folder).as_posix()}")
    with open(target, "rb") as fh:
        digest = hashlib.file_digest(fh, "sha256").hexdigest()
    (mirror / "SHA256SUMS").write_text(f"{digest}  {name}.zip\n")
    return target
