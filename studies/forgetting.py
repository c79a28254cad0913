"""Question: What does fine-tuning forget on text of another kind, measured without judgments?
Record: ``studies/out/forgetting.json``
Page: ``docs/findings/anchor.md``

What fine-tuning forgets, measured without judgments: ``python studies/forgetting.py``.

A policy trained on one collection's queries can gain on it and on a nearby collection (scifact and NFCorpus) while
it forgets how to embed other kinds of text: long queries, or documents as queries, as in argument retrieval. This
benchmark builds such a task from any BEIR-format corpus, with no judgments and nothing fitted to a set: every
document of at least ``--min-words`` words is cut in two halves, the first half is a query, the second halves of
``--documents`` documents are the collection, and the relevant document of a query is its own second half. nDCG@10
(one relevant document, so the reciprocal-log rank of the right half) is reported, per corpus, for the warm start and
for each policy's WiSE-FT mixtures with the warm start at ``--alphas`` (1: the policy itself), with the paired t-test
against the warm start over the queries.

The queries are encoded by each policy's query route, and the halves by the warm start's document encoder: the frozen
document side of the ``tower: query`` policies this benchmark is for (a ``tower: both`` policy's own document
encoder is not used). Encoding is float32 torch on the CPU, up to ``--max-length`` tokens.

Writes ``studies/out/forgetting.json`` (``--out``) with the machine, and prints the table.

Example:
    $ python studies/forgetting.py --corpus W/data/nfcorpus/corpus.jsonl W/data/scifact/corpus.jsonl \\
        --policy demo=W/runs/demo-s42/models/minilm/pg/epoch-4 --alphas 1 0.75 0.5
"""

from __future__ import annotations

import argparse
import json
import random
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench"))  # record: the plumbing shared with bench/
sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from record import add_out_option, new_record, save  # noqa: E402


def halves(corpus: Path, min_words: int, documents: int, seed: int) -> tuple[list[str], list[str]]:
    """First and second halves (by words) of ``documents`` documents of at least ``min_words`` words of ``corpus``,
    drawn by ``seed``; a document's text is its title and text, as BEIR's evaluation joins them."""
    cut = []
    with corpus.open(encoding="utf-8") as f:
        for line in f:
            doc = json.loads(line)
            words = (doc.get("text") or "").split()
            if len(words) >= min_words:
                half = len(words) // 2
                cut.append((" ".join(words[:half]), " ".join(words[half:])))
    if len(cut) < 2:
        raise SystemExit(f"{corpus}: fewer than 2 documents of at least {min_words} words")
    random.Random(seed).shuffle(cut)
    cut = cut[:documents]
    return [a for a, _ in cut], [b for _, b in cut]


def ndcg_own(queries: np.ndarray, documents: np.ndarray) -> np.ndarray:
    """Per query i, nDCG@10 of document i, the only relevant one, among all ``documents`` (dot product)."""
    scores = queries @ documents.T
    own = scores[np.arange(len(queries)), np.arange(len(queries))]
    rank = (scores > own[:, None]).sum(axis=1)
    return np.where(rank < 10, 1.0 / np.log2(rank + 2.0), 0.0)


def embed(model, texts: list[str], task: str, max_length: int) -> np.ndarray:
    """``texts`` encoded by ``model``'s ``task`` route (float32, no gradient), 16 at a time."""
    import torch

    from pgrank.training.grad_cache import encode

    with torch.no_grad():
        return np.concatenate([encode(model, texts[i : i + 16], task=task, max_length=max_length, amp="off")
                               .float().numpy() for i in range(0, len(texts), 16)])


class HalfDocuments:
    """One corpus's half-document task: the collection embedded by the warm start's document route, and the warm
    start's own per-query figures, computed once; :meth:`score` gives a policy's."""

    def __init__(self, corpus: Path, warm, *, queries: int = 500, documents: int = 2000, min_words: int = 80,
                 max_length: int = 256, seed: int = 0):
        first, second = halves(corpus, min_words, documents, seed)
        self.name = corpus.parent.name if corpus.name == "corpus.jsonl" else corpus.stem
        self.path, self.first, self.documents, self.max_length = corpus, first[:queries], len(second), max_length
        self.collection = embed(warm, second, "document", max_length)
        self.warm = self.score(warm)

    def score(self, model) -> np.ndarray:
        """Per query, nDCG@10 of its own second half with ``model``'s query route."""
        return ndcg_own(embed(model, self.first, "query", self.max_length), self.collection)

    def change(self, model) -> tuple[float, float]:
        """``model``'s mean change against the warm start, and the paired t-test's p."""
        got = self.score(model)
        return float((got - self.warm).mean()), _paired_p(got, self.warm)


def _paired_p(a: np.ndarray, b: np.ndarray) -> float:
    from scipy.stats import ttest_rel

    return float(ttest_rel(a, b).pvalue)


def render(record: dict) -> str:
    lines = [f"Half-document retrieval: per corpus, {record['queries']} first halves as queries and "
             f"{record['documents']} second halves as the collection (fewer where a corpus has fewer documents of "
             f"{record['min_words']} words or more); nDCG@10, with the paired t-test against the warm start",
             "", "| corpus | policy | alpha | nDCG@10 | change | p |", "| --- | --- | ---: | ---: | ---: | ---: |"]
    for corpus in record["corpora"]:
        lines.append(f"| {corpus['name']} ({corpus['queries']} / {corpus['documents']}) | warm start | | "
                     f"{corpus['warm_start']:.4f} | | |")
        for row in corpus["rows"]:
            lines.append(f"| {corpus['name']} | {row['policy']} | {row['alpha']:g} | {row['ndcg@10']:.4f} | "
                         f"{row['change']:+.4f} | {row['p']:.2g} |")
    machine = record["machine"]
    lines.append(f"\nEncoding: float32 torch, {record['max_length']} tokens; {machine['cores']} {machine['cpu']} cores.")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--corpus", type=Path, nargs="+", required=True, help="BEIR-format corpus.jsonl files")
    parser.add_argument("--policy", action="append", required=True, help="NAME=checkpoint folder (repeatable)")
    parser.add_argument("--warm-start", default="minilm", help="the policies' warm start (alias or hub id)")
    parser.add_argument("--profile", default="demo", help="whose params (models section) resolve the warm start")
    parser.add_argument("--alphas", type=float, nargs="+", default=[1.0])
    parser.add_argument("--queries", type=int, default=500)
    parser.add_argument("--documents", type=int, default=2000)
    parser.add_argument("--min-words", type=int, default=80)
    parser.add_argument("--max-length", type=int, default=256)
    parser.add_argument("--seed", type=int, default=0)
    add_out_option(parser, __file__)
    args = parser.parse_args()

    from pgrank.config import load_params
    from pgrank.models.loading import load_encoder
    from pgrank.training.checkpoints import query_route
    from pgrank.training.weight_space import Anchor

    policies = dict(p.split("=", 1) for p in args.policy)
    params = load_params(Path(__file__).resolve().parents[1] / "params.yaml", profile=args.profile)
    warm = load_encoder(args.warm_start, params.models, device="cpu", max_seq_length=args.max_length)
    anchor = Anchor.of(warm)
    models = {name: query_route(load_encoder(folder, params.models, device="cpu", max_seq_length=args.max_length))
              for name, folder in policies.items()}
    corpora = []
    for path in args.corpus:
        task = HalfDocuments(path, warm, queries=args.queries, documents=args.documents, min_words=args.min_words,
                             max_length=args.max_length, seed=args.seed)
        print(f"{task.name}: warm start {task.warm.mean():.4f}", flush=True)
        rows = []
        for policy, model in models.items():
            for alpha in args.alphas:
                with anchor.interpolated(model, alpha):
                    got = task.score(model)
                rows.append({"policy": policy, "checkpoint": policies[policy], "alpha": alpha,
                             "ndcg@10": float(got.mean()), "change": float((got - task.warm).mean()),
                             "p": _paired_p(got, task.warm)})
                print(f"{task.name}: {policy} alpha {alpha:g}: {got.mean():.4f} ({rows[-1]['change']:+.4f})",
                      flush=True)
        corpora.append({"name": task.name, "path": str(path), "queries": len(task.first),
                        "documents": task.documents, "warm_start": float(task.warm.mean()), "rows": rows})
    record = new_record("Half-document retrieval: what fine-tuning forgets, without judgments")
    record.update(queries=args.queries, documents=args.documents, min_words=args.min_words,
                  max_length=args.max_length, corpora=corpora)
    save(record, args.out, render)


if __name__ == "__main__":
    main()
