"""Half-document retrieval: a label-free BEIR-format dataset derived from any corpus (``data.sources.<name>.halves``).

A policy fine-tuned on one collection's queries can gain there, and on a nearby collection, while it forgets how
to embed other kinds of text: long passages as queries, as in argument retrieval or duplicate detection. Judged
sets of that kind are rare, but one can be built from any corpus with no judgments and nothing fitted to a set:
each document of at least ``min_words`` words is cut in two halves; the second halves of ``documents`` of them
are the collection, the first halves of ``queries`` of those are the queries, and the one relevant document of a
query is its own second half. Named in ``train.validation_sets`` (``<name>/dev``), it is one more out-of-domain
check for the guarded selection rule (:mod:`pgrank.training.selection`), built from the training set's own corpus::

    data:
      sources:
        scifact-halves: {halves: {of: scifact}}
    train:
      validation_sets: [nfcorpus/dev, scifact-halves/dev]

The documents are drawn by seeded reservoir sampling over one pass of the corpus (at most ``documents`` are held
at a time, so a corpus of millions is read as a stream). The folder is rebuilt, atomically, only when the parent
corpus or the settings change: its record keeps both. A document's text is cut by whitespace; titles are left out
(they would give the query away).
"""

from __future__ import annotations

import json
import random
from pathlib import Path

from pgrank.atomic import atomic_path
from pgrank.config import HalvesConfig
from pgrank.data.beir import read_jsonl
from pgrank.download.dataset_checks import validate_folder
from pgrank.download.manifests import fingerprint
from pgrank.download.sources import installed_record, write_install_record
from pgrank.errors import DataError

SPLIT = "dev"  # the one judged split: a validation set, never trained on


def sample_halves(corpus: Path, cfg: HalvesConfig, label: str) -> list[tuple[str, str, str]]:
    """``(document id, first half, second half)`` of ``cfg.documents`` documents of at least ``cfg.min_words``
    words, drawn uniformly by ``cfg.seed`` (reservoir sampling, Algorithm R), in a seeded random order."""
    rng = random.Random(cfg.seed)
    kept: list[tuple[str, str, str]] = []
    seen = 0
    for _, doc_id, record in read_jsonl(corpus, f"{label}/corpus.jsonl"):
        words = str(record.get("text") or "").split()
        if len(words) < cfg.min_words:
            continue
        seen += 1
        slot = len(kept) if len(kept) < cfg.documents else rng.randrange(seen)
        if slot >= cfg.documents:
            continue
        half = len(words) // 2
        item = (doc_id, " ".join(words[:half]), " ".join(words[half:]))
        if slot == len(kept):
            kept.append(item)
        else:
            kept[slot] = item
    if len(kept) < 2:
        raise DataError(f"{label}: {seen} document(s) of at least {cfg.min_words} words in {corpus}; half-document "
                        f"retrieval needs 2 or more (lower data.sources.<name>.halves.min_words)")
    rng.shuffle(kept)
    return kept


def write_halves(folder: Path, kept: list[tuple[str, str, str]], queries: int) -> None:
    """The BEIR folder: ``corpus.jsonl`` (second halves), ``queries.jsonl`` (first halves of the first
    ``queries``), ``qrels/dev.tsv`` (each query's own second half, grade 1)."""
    (folder / "qrels").mkdir(parents=True, exist_ok=True)
    with (folder / "corpus.jsonl").open("w", encoding="utf-8") as f:
        for doc_id, _, second in kept:
            f.write(json.dumps({"_id": f"d:{doc_id}", "title": "", "text": second}, ensure_ascii=False) + "\n")
    chosen = kept[:queries]
    with (folder / "queries.jsonl").open("w", encoding="utf-8") as f:
        for doc_id, first, _ in chosen:
            f.write(json.dumps({"_id": f"q:{doc_id}", "text": first}, ensure_ascii=False) + "\n")
    with (folder / "qrels" / f"{SPLIT}.tsv").open("w", encoding="utf-8") as f:
        f.write("query-id\tcorpus-id\tscore\n")
        for doc_id, _, _ in chosen:
            f.write(f"q:{doc_id}\td:{doc_id}\t1\n")


def install_halves(name: str, cfg: HalvesConfig, parent: Path, target: Path, cache_file: Path) -> str:
    """Build the source ``name`` at ``target`` from the dataset folder ``parent`` (already installed; ``cache_file``:
    its fingerprint cache, so that an unchanged corpus is not read again to learn that it is unchanged).

    Returns:
        ``"validated"`` when it was (re)built, ``"present"`` when the parent corpus and the settings are the
        ones it was built from.
    """
    label = f"data.sources.{name}"
    corpus = parent / "corpus.jsonl"
    if not corpus.is_file():
        raise DataError(f"{label}.halves.of: {cfg.of!r} has no corpus.jsonl at {parent}")
    origin = {"halves": cfg.model_dump(mode="json"), "corpus_sha256": fingerprint(parent, cache_file)["corpus.jsonl"]}
    record = installed_record(name, target)
    if record is not None and record["origin"] == origin:
        return "present"
    kept = sample_halves(corpus, cfg, label)
    with atomic_path(target, directory=True) as tmp:
        write_halves(tmp, kept, cfg.queries)
        write_install_record(tmp, name, origin, vars(validate_folder(tmp, label, missing_documents="error")))
    return "validated"
