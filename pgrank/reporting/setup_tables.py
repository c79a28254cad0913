"""The paper's appendix tables that are not scores: evaluation-set statistics and hyperparameters.

* Statistics are computed from the BEIR folders (an eval set whose dataset is not downloaded shows
  "—"): queries of the split, documents of the corpus (lines of ``corpus.jsonl``, counted without
  parsing), relevant documents (grade > 0) per query, and the annotation: "binary" when no grade
  exceeds 1, else "N-level" for grades 0..N-1 (the paper's reading for TREC-COVID, NFCorpus, Touché,
  DBPedia; it prints TREC-DL 2019, graded 0..3, as 3-level). The Domain column is the paper's.
* Hyperparameters are the resolved ``params`` (``train``, ``train.pg``, ``mine.candidates``,
  ``mine.model``) next to the paper's appendix table; settings the paper does not state show "—".
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from pgrank.config import Params
from pgrank.data.beir import Qrels, load_topics
from pgrank.paths import Paths
from pgrank.reporting.rendering import (
    Cell,
    Column,
    Row,
    Table,
    eval_set_name,
    system_name,
)

SIMILARITY_NAMES = {"dot": "dot product", "cosine": "cosine"}


@dataclass(frozen=True)
class DatasetStats:
    queries: int
    documents: int
    relevant_per_query: float
    annotation: str


def count_lines(path) -> int:
    """Lines of a text file, read in 1 MiB blocks (a last line without a newline counts)."""
    count, last = 0, b"\n"
    with open(path, "rb") as fh:
        while block := fh.read(1 << 20):
            count += block.count(b"\n")
            last = block[-1:]
    return count + (last != b"\n")


def annotation(qrels: Qrels) -> str:
    top = max((grade for docs in qrels.values() for grade in docs.values()), default=0)
    return "binary" if top <= 1 else f"{top + 1}-level"


def split_statistics(qrels: Qrels, documents: int) -> DatasetStats:
    relevant = [sum(grade > 0 for grade in docs.values()) for docs in qrels.values()]
    return DatasetStats(len(qrels), documents, sum(relevant) / max(len(relevant), 1), annotation(qrels))


def collect_statistics(params: Params, paths: Paths) -> dict[str, DatasetStats | None]:
    """Statistics of every ``data.eval_sets`` entry whose dataset is downloaded (else None)."""
    documents: dict[str, int] = {}  # a corpus is counted once (msmarco dev and test share it)
    stats: dict[str, DatasetStats | None] = {}
    for eval_set in params.data.eval_sets:
        dataset, split = eval_set.split("/")
        corpus = paths.dataset(dataset) / "corpus.jsonl"
        if not corpus.is_file():
            stats[eval_set] = None
            continue
        _, qrels = load_topics(paths, dataset, split)
        if dataset not in documents:
            documents[dataset] = count_lines(corpus)
        stats[eval_set] = split_statistics(qrels, documents[dataset])
    return stats


def statistics_table(params: Params, stats: dict[str, DatasetStats | None], published: dict) -> Table:
    """Domain, # Q, # D, # Rel. D/Q and annotation per eval set, computed (paper's)."""
    paper = published.get("dataset-statistics", {})
    domain = {key.split("/")[0]: value["domain"] for key, value in paper.items()}
    rows = []
    for eval_set in params.data.eval_sets:
        ours, ref = stats.get(eval_set), paper.get(eval_set)
        cells = (
            Cell(ours=domain.get(eval_set.split("/")[0]), compared=False),
            Cell(ours=ours and f"{ours.queries:,}", paper=ref and f"{ref['queries']:,}"),
            Cell(ours=ours and f"{ours.documents:,}", paper=ref and str(ref["documents"])),
            Cell(ours=ours and f"{ours.relevant_per_query:.1f}", paper=ref and f"{ref['relevant_per_query']:.1f}"),
            Cell(ours=ours and ours.annotation, paper=ref and ref["annotation"]),
        )
        rows.append(Row(eval_set_name(eval_set), cells))
    columns = (Column("domain", "Domain", align="l"), Column("queries", "# Q"), Column("documents", "# D"),
               Column("relevant", "# Rel. D/Q"), Column("annotation", "Annotation", align="l"))
    return Table("dataset-statistics", "Evaluation sets", columns, tuple(rows), legend=False,
                 note="Cells: computed from the data (paper); —: dataset not downloaded, or not in the paper; "
                      "# Rel. D/Q: relevant documents (grade > 0) per query",
                 source="Table 5 (tab:data_stats)")


def _number(value: float | int) -> str:
    """``1e-06`` -> "1e-6", ``0.05`` -> "0.05", ``220`` -> "220"."""
    return re.sub(r"e([+-])0*(\d)", r"e\1\2", f"{value:g}").replace("e+", "e")


def _models(names: list[str]) -> str:
    return ", ".join(system_name(n) for n in names)


def hyperparameter_table(params: Params, published: dict) -> Table:
    """The resolved training settings next to the paper's appendix table."""
    train, pg, paper = params.train, params.train.pg, published.get("hyperparameters", {})
    # (setting, this run, key of published.yaml's hyperparameters, formatter of the paper's value)
    rows: list[tuple[str, str, str | None, object]] = [
        ("model (warm starts)", _models(train.warm_starts), "warm_starts", _models),
        ("epochs", str(train.epochs), "epochs", str),
        ("batch size (queries per step)", str(train.batch_size), "batch_size", str),
        ("learning rate", _number(train.learning_rate), "learning_rate", _number),
        ("entropy coefficient", _number(pg.entropy_coef), "entropy_coef", _number),
        ("# rankings sampled", str(pg.num_samples), "num_samples", str),
        ("softmax temperature", _number(pg.temperature), "temperature", _number),
        ("similarity function", SIMILARITY_NAMES[train.similarity], "similarity", SIMILARITY_NAMES.get),
        ("candidates per query", str(params.mine.candidates), "candidates", str),
        ("stage-1 retriever", params.mine.model, "mine_model", str),
        ("utility", pg.utility, None, None),
        ("estimator / baseline", f"{pg.estimator} / {pg.baseline}", None, None),
        ("entropy", pg.entropy, None, None),
        ("trained tower", train.tower, None, None),
        ("optimizer", f"{train.optimizer}, weight decay {_number(train.weight_decay)}", None, None),
        ("warmup steps", str(train.warmup_steps), None, None),
        ("gradient clipping", "off" if train.grad_clip is None else _number(train.grad_clip), None, None),
        ("max query / document tokens", f"{train.max_query_length} / {train.max_doc_length}", None, None),
        ("mixed precision", train.amp, None, None),
        ("queries per epoch", "all" if train.queries_per_epoch is None else str(train.queries_per_epoch), None, None),
        ("kept epochs", ", ".join(map(str, train.keep_epochs)), None, None),
        ("seed", str(train.seed), None, None),
    ]
    table_rows = tuple(
        Row(setting, (Cell(ours=ours, compared=False),
                      Cell(ours=fmt(paper[key]) if key in paper else None, compared=False)))
        for setting, ours, key, fmt in rows
    )
    return Table("hyperparameters", "Hyperparameters of Neural PG-Rank", (
        Column("ours", "This run", align="l"), Column("paper", "Paper", align="l")), table_rows,
        row_header="Setting", legend=False,
        note="This run: the resolved params (params.yaml, profile and --set); candidates and stage-1 retriever "
             "are from the paper's Sec. 4; —: not stated in the paper. The paper counts its sampled rankings per "
             "epoch, pgrank per query (PAPER.md)",
        source="Table 6 (tbl:hparams)")
