"""The paper's configuration executed end to end, shrunk: data and models for ``profiles/paper-smoke.yaml``.

``params.yaml`` is the paper: 14 BEIR datasets (15 evaluation sets), gtr-t5-xl mining, the SBERT and TAS-B warm
starts trained in ``tower: both``, BM25, SBERT, TAS-B and SPLADEv2 as comparison systems, every table. The
paper-smoke profile changes only sizes, so :func:`prepare` makes, offline and deterministically, what it reads:

* **a BEIR mirror folder** (``mirror/NAME.zip``, members ``NAME/...`` as in BEIR's zips, and ``SHA256SUMS``,
  which ``pgrank download`` verifies instead of BEIR's MD5s) with a synthetic set for each of the paper's
  datasets, with the splits BEIR has for it (:data:`SHAPES`): 120 documents (MS MARCO: 200, with 48 training
  queries, enough for a few batches), a few queries per split, graded judgments where the real set is graded
  (TREC-DL 2019 0-3; TREC-COVID, Touché-2020 and DBPedia 0-2 with judged non-relevant documents; NFCorpus 1-2)
  and binary ones elsewhere (SCIDOCS with its judged negatives), and, in ArguAna and Quora, queries that are
  documents of the corpus under the same id (what ``evaluate.ignore_identical_ids`` is for);
* **the four paper models**, tiny and with random weights but the real module stacks
  (:mod:`paper_models`): ``models/gtr-t5``, ``models/sbert``, ``models/tas-b``, ``models/splade``.

Text has learnable structure: the words are :func:`paper_models.words` (one token each under the models'
tokenizers, no stop word, so BM25 sees them all); each document has a topic (a few words it shares with its
topic's documents), words of its own and common filler; a query has one topic word and two words of its own of
the document it targets (graded sets: the targeted document is the most relevant, its topic's others less so).

``python bench/paper_smoke.py`` prepares ``data/paper-smoke/``, runs ``pgrank --profile paper-smoke repro`` and
checks the tables with :func:`table_problems` (what ``tests/test_paper_smoke.py`` checks): every score table
has a row per evaluation set and a reproduced number in every cell, every published number in its place;
every table in every format of ``tables.formats``.

Example:
    >>> prepare(Path("data/paper-smoke"))  # doctest: +SKIP
    {'mirror': PosixPath('data/paper-smoke/mirror'), 'models': {...}}
"""

from __future__ import annotations

import argparse
import hashlib
import io
import json
import os
import random
import re
import subprocess
import sys
import time
import zipfile
from dataclasses import dataclass, field
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(HERE))

from paper_models import KINDS, build, words  # noqa: E402
from record import add_set_option, set_args  # noqa: E402

PROFILE = "paper-smoke"
FOLDER = ROOT / "data" / PROFILE  # profiles/paper-smoke.yaml reads its mirror and models here

# Judgment schemes: the grades a query's judged documents get (see _judgments).
BINARY, BINARY_WITH_NEGATIVES, GRADED, GRADED_POSITIVE, TREC_DL = "binary", "binary+0", "0-2", "1-2", "0-3"


@dataclass(frozen=True)
class Shape:
    """One synthetic dataset: documents, queries per split and their judgment scheme, query ids, titles."""

    documents: int
    splits: dict[str, tuple[int, str]]  # split -> (queries, judgment scheme)
    self_queries: bool = False  # a query is a document of the corpus, under the same id (ArguAna, Quora)
    titles: bool = True
    relevant: int = 1  # binary: relevant documents per query (HotpotQA: 2, the hops)
    numeric_ids: bool = False  # MS MARCO: passages 0..N-1, queries 1000000..


# The paper's datasets with BEIR's splits (pgrank.download.catalogue.BEIR_SIZES), shrunk.
SHAPES: dict[str, Shape] = {
    "msmarco": Shape(200, {"train": (48, BINARY), "dev": (6, BINARY), "test": (5, TREC_DL)}, titles=False,
                     numeric_ids=True),
    "trec-covid": Shape(120, {"test": (5, GRADED)}),
    "nfcorpus": Shape(120, {"train": (4, BINARY), "dev": (4, GRADED_POSITIVE), "test": (5, GRADED_POSITIVE)}),
    "nq": Shape(120, {"test": (6, BINARY)}),
    "hotpotqa": Shape(120, {"train": (4, BINARY), "dev": (4, BINARY), "test": (6, BINARY)}, relevant=2),
    "fiqa": Shape(120, {"train": (4, BINARY), "dev": (4, BINARY), "test": (6, BINARY)}, titles=False),
    "arguana": Shape(120, {"test": (6, BINARY)}, self_queries=True),
    "webis-touche2020": Shape(120, {"test": (5, GRADED)}),
    "quora": Shape(120, {"dev": (4, BINARY), "test": (6, BINARY)}, self_queries=True, titles=False),
    "dbpedia-entity": Shape(120, {"dev": (4, GRADED), "test": (5, GRADED)}),
    "scidocs": Shape(120, {"test": (6, BINARY_WITH_NEGATIVES)}),
    "fever": Shape(120, {"train": (4, BINARY), "dev": (4, BINARY), "test": (6, BINARY)}),
    "climate-fever": Shape(120, {"test": (6, BINARY)}, relevant=2),
    "scifact": Shape(120, {"train": (4, BINARY), "test": (6, BINARY)}),
}
DOCS_PER_TOPIC = 10
TOPIC_WORDS, OWN_WORDS = 6, 3
# Pseudo-words of 4 letters and more (the 90 two-letter ones include English stop words: "be", "to", "we").
VOCABULARY = words(3_800)[90:]
FILLER = VOCABULARY[:200]  # common words of every dataset
CONTENT = VOCABULARY[200:]  # topic words and documents' own words, drawn per dataset


@dataclass
class _Document:
    id: str
    topic: int
    own: list[str]
    words: list[str]
    title: str = ""
    extra: list[str] = field(default_factory=list)  # words of another document (a self-query's target)

    def text(self) -> str:
        return " ".join(self.words + self.extra)


def _judgments(scheme: str, target: _Document, same_topic: list[_Document], other: list[_Document],
               relevant: int) -> list[tuple[str, int]]:
    """(document id, grade) pairs of one query: the target first, then its topic's documents, then others."""
    if scheme == TREC_DL:  # TREC-DL 2019: 0-3, many judged documents a query
        return [(target.id, 3), (same_topic[0].id, 2), (same_topic[1].id, 1), (same_topic[2].id, 1),
                (same_topic[3].id, 0), (other[0].id, 0)]
    if scheme == GRADED:
        return [(target.id, 2), (same_topic[0].id, 1), (same_topic[1].id, 1), (same_topic[2].id, 0),
                (other[0].id, 0)]
    if scheme == GRADED_POSITIVE:  # NFCorpus: grades 1 and 2 only
        return [(target.id, 2), (same_topic[0].id, 1), (same_topic[1].id, 1), (same_topic[2].id, 1)]
    pairs = [(target.id, 1)] + [(d.id, 1) for d in same_topic[: relevant - 1]]
    if scheme == BINARY_WITH_NEGATIVES:  # SCIDOCS: judged negatives (grade 0) beside each relevant one
        pairs += [(d.id, 0) for d in same_topic[relevant - 1: relevant + 2]]
    return pairs


def dataset_files(name: str, shape: Shape) -> dict[str, str]:
    """``corpus.jsonl``, ``queries.jsonl`` and ``qrels/SPLIT.tsv`` of one synthetic dataset (deterministic)."""
    rng = random.Random(f"paper-smoke/{name}")
    topics = -(-shape.documents // DOCS_PER_TOPIC)
    drawn = rng.sample(CONTENT, topics * TOPIC_WORDS + shape.documents * OWN_WORDS)
    topic_words = [drawn[t * TOPIC_WORDS:(t + 1) * TOPIC_WORDS] for t in range(topics)]
    own_words = drawn[topics * TOPIC_WORDS:]
    docs = []
    for i in range(shape.documents):
        topic, own = i % topics, own_words[i * OWN_WORDS:(i + 1) * OWN_WORDS]
        text = rng.sample(topic_words[topic], 3) + own + rng.sample(FILLER, rng.randint(8, 20))
        rng.shuffle(text)
        title = " ".join([rng.choice(topic_words[topic]), own[0]]).title() if shape.titles and i % 3 else ""
        docs.append(_Document(str(i) if shape.numeric_ids else f"{name[:3]}-d{i:03d}", topic, own, text, title))
    order = rng.sample(range(shape.documents), shape.documents)  # the queries' targets, in order
    queries: list[tuple[str, str]] = []
    qrels: dict[str, list[tuple[str, str, int]]] = {}
    k, used = 0, set()  # used: the targets, and the documents that are queries
    for split, (count, scheme) in shape.splits.items():
        rows = qrels.setdefault(split, [])
        for _ in range(count):
            target = next(docs[i] for i in order if docs[i].id not in used)
            used.add(target.id)
            same_topic = [d for d in docs if d.topic == target.topic and d is not target]
            rng.shuffle(same_topic)
            other = rng.sample([d for d in docs if d.topic != target.topic], 2)
            words_ = [rng.choice(topic_words[target.topic]), *rng.sample(target.own, 2), *rng.sample(FILLER, 2)]
            if shape.self_queries:  # the query is a document of the target's topic, with the target's words
                source = next(d for d in same_topic if d.id not in used)
                used.add(source.id)
                source.extra = words_[1:3]
                qid, text = source.id, source.text()
                same_topic = [d for d in same_topic if d is not source]
            else:
                rng.shuffle(words_)
                qid = str(1_000_000 + k) if shape.numeric_ids else f"{name[:3]}-q{k:03d}"
                text = " ".join(words_)
            if scheme == BINARY and shape.relevant > 1:  # HotpotQA's second hop: named in the query too
                words_ += [same_topic[0].own[0]]
                text = text if shape.self_queries else " ".join(words_)
            queries.append((qid, text))
            rows += [(qid, doc, grade) for doc, grade in _judgments(scheme, target, same_topic, other, shape.relevant)]
            k += 1
    files = {
        "corpus.jsonl": "".join(json.dumps({"_id": d.id, "title": d.title, "text": d.text()}) + "\n" for d in docs),
        "queries.jsonl": "".join(json.dumps({"_id": q, "text": t}) + "\n" for q, t in queries),
    }
    for split, rows in qrels.items():  # BEIR's qrels: a header, tab-separated, CRLF
        lines = ["query-id\tcorpus-id\tscore", *(f"{q}\t{d}\t{g}" for q, d, g in rows)]
        files[f"qrels/{split}.tsv"] = "\r\n".join(lines) + "\r\n"
    return files


def dataset_zip(name: str, files: dict[str, str]) -> bytes:
    """A BEIR zip of ``files`` (members ``NAME/...``, sorted, fixed timestamps: the same bytes every time)."""
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", zipfile.ZIP_DEFLATED) as zf:
        for member in sorted(files):
            zf.writestr(zipfile.ZipInfo(f"{name}/{member}", date_time=(2020, 1, 1, 0, 0, 0)), files[member])
    return buf.getvalue()


def write_mirror(folder: Path, datasets: list[str] | None = None) -> Path:
    """``folder/NAME.zip`` for each dataset of :data:`SHAPES` (or ``datasets``) and the ``SHA256SUMS`` covering them."""
    folder.mkdir(parents=True, exist_ok=True)
    zips = {name: dataset_zip(name, dataset_files(name, SHAPES[name])) for name in datasets or SHAPES}
    for name, data in zips.items():
        target = folder / f"{name}.zip"
        if not target.is_file() or target.read_bytes() != data:
            target.write_bytes(data)
    (folder / "SHA256SUMS").write_text("".join(f"{hashlib.sha256(data).hexdigest()}  {name}.zip\n"
                                               for name, data in sorted(zips.items())))
    return folder


def prepare(folder: Path = FOLDER) -> dict:
    """Write the mirror (``folder/mirror``) and the four tiny paper models (``folder/models/<kind>``), offline.

    Deterministic; a model folder already there is kept. Returns ``{"mirror": path, "models": {kind: path}}``.
    """
    folder = Path(folder)
    mirror = write_mirror(folder / "mirror")
    models = {kind: build(kind, folder / "models" / kind, size="tiny") for kind in KINDS}
    return {"mirror": mirror, "models": models}


# --------------------------------------------------------------------------------------- the check


def _cells(markdown: str) -> list[list[str]]:
    """The body rows of the first pipe table in ``markdown`` (header and rule dropped), split into cells."""
    lines = [line for line in markdown.splitlines() if line.startswith("|")]
    return [[c.strip() for c in re.split(r"(?<!\\)\|", line)[1:-1]] for line in lines[2:]]


def _header(markdown: str) -> list[str]:
    line = next(line for line in markdown.splitlines() if line.startswith("|"))
    return [c.strip() for c in line.split("|")[1:-1]]


def _ours(cell: str) -> str:
    """The reproduced part of a score cell ``0.735† ▲ (0.892, −0.157)``, marks stripped."""
    ours = cell.split(" (")[0]
    return re.sub(r"\*\*|</?u>|†| ▲", "", ours).strip()


def _paper(cell: str) -> str | None:
    match = re.search(r"\(([^,()]+)(?:, [^()]+)?\)$", cell)
    return match.group(1) if match else None


def table_problems(ws: Path) -> list[str]:
    """What is missing from the tables of the pipeline workspace ``ws`` (empty: every table complete).

    Reads the written files, as a reader would: for each score table of :mod:`pgrank.reporting.tables`, a
    row per evaluation set of its kind with a reproduced number in every column (the comparison systems and
    the policies of every warm start; BM25 where the table shows it), and the paper's number wherever
    ``published.yaml`` has one; the epoch ablation with its average row; the dataset statistics computed for
    every evaluation set; every hyperparameter of this run; and each table in every format of
    ``tables.formats``, with the figures.
    """
    from pgrank.config import load_params
    from pgrank.paths import Paths
    from pgrank.reporting.rendering import DASH, eval_set_name, system_name
    from pgrank.reporting.result_files import load_published
    from pgrank.reporting.tables import (AVERAGE_OTHER, SCORE_TABLES, TABLE_NAMES, ablation_epochs, domains,
                                         epoch_system, table_systems)

    params = load_params(ws / "params.yaml")
    tables = Paths.from_config(params.paths, base=ws).tables
    published = load_published()
    problems: list[str] = []
    formats = params.tables.formats
    expected = [f"{name}.{ext}" for name in TABLE_NAMES for ext in ("md", "tex") if ext in formats]
    expected += ["tables.md"] * ("md" in formats) + ["tables.tex"] * ("tex" in formats)
    if "png" in formats:
        expected += [f"bars-{stage}.png" for stage in params.evaluate.stages]
        expected += [f"curve-{w}.png" for w in params.train.warm_starts]
    problems += [f"{tables / name}: missing" for name in expected if not (tables / name).is_file()]
    if "md" not in formats:
        return problems + ["tables.formats has no md: the check reads the Markdown tables"]
    md = {name: (tables / f"{name}.md").read_text(encoding="utf-8") for name in TABLE_NAMES
          if (tables / f"{name}.md").is_file()}
    inside, outside = domains(params)
    for spec in SCORE_TABLES:
        if spec.name not in md:
            continue
        systems = [s for s in table_systems(params)
                   if not (spec.stage == "rerank" and s == "bm25" and params.tables.rerank_bm25 == "omit")]
        sets = {"in": inside, "out": outside, "all": list(params.data.eval_sets)}[spec.rows]
        paper = published.get(spec.name, {})
        problems += _grid(spec.name, md[spec.name], sets, systems, paper, eval_set_name, system_name, DASH)
    if "epoch-ablation" in md:
        systems = [epoch_system(w, e, params) for w in params.train.warm_starts for e in ablation_epochs(params)]
        rows = _cells(md["epoch-ablation"])
        labels = [eval_set_name(s) for s in inside] + [f"Avg. on other BEIR datasets (n = {len(outside)})"]
        if [r[0].rstrip("‡") for r in rows] != labels:
            problems.append(f"epoch-ablation: rows {[r[0] for r in rows]}, expected {labels}")
        else:  # the paper's average is shown where the average runs over the paper's out-of-domain sets
            paper = published.get("epoch-ablation", {})
            same_sets = set(outside) == set(published.get("rerank-out-of-domain", {}))
            keys = inside + ([AVERAGE_OTHER] if same_sets else [None])
            for key, row in zip(keys, rows):
                for system, cell in zip(systems, row[1:]):
                    if _ours(cell) == DASH:
                        problems.append(f"epoch-ablation: {row[0]} / {system}: no reproduced number")
                    value = paper.get(key, {}).get(system)
                    if value is not None and _paper(cell) != f"{value:.3f}":
                        problems.append(f"epoch-ablation: {row[0]} / {system}: the paper's {value:.3f} not shown")
    if "dataset-statistics" in md:
        rows = _cells(md["dataset-statistics"])
        if [r[0] for r in rows] != [eval_set_name(s) for s in params.data.eval_sets]:
            problems.append(f"dataset-statistics: rows {[r[0] for r in rows]}")
        problems += [f"dataset-statistics: {row[0]}, column {i + 1}: not computed"
                     for row in rows for i, cell in enumerate(row[1:]) if _ours(cell) == DASH]
    if "hyperparameters" in md:
        problems += [f"hyperparameters: {row[0]}: no value for this run"
                     for row in _cells(md["hyperparameters"]) if row[1] == DASH]
    return problems


def _grid(name, markdown, sets, systems, paper, set_name, sys_name, dash) -> list[str]:
    """Problems of one score table: its rows, columns, reproduced numbers and the paper's numbers."""
    problems = []
    header = _header(markdown)[1:]
    columns = [sys_name(s) for s in systems]
    if [h.removesuffix(" (context)") for h in header] != columns:
        problems.append(f"{name}: columns {header}, expected {columns}")
        return problems
    rows = _cells(markdown)
    if [r[0].rstrip("‡") for r in rows] != [set_name(s) for s in sets]:
        problems.append(f"{name}: rows {[r[0] for r in rows]}, expected {[set_name(s) for s in sets]}")
        return problems
    for eval_set, row in zip(sets, rows):
        for system, cell in zip(systems, row[1:]):
            where = f"{name}: {set_name(eval_set)} / {sys_name(system)}"
            if not re.fullmatch(r"\d+\.\d+", _ours(cell)):
                problems.append(f"{where}: no reproduced number ({cell!r})")
            published = paper.get(eval_set, {}).get(system)
            if published is not None and _paper(cell) != f"{published:.3f}":
                problems.append(f"{where}: the paper's {published:.3f} not shown ({cell!r})")
    return problems


def render(record: dict) -> str:
    """The run's time, memory and disk, per stage kind, as printed and shown on the benchmarks page."""
    from stage_resources import group_table

    run = record["run"]
    return "\n".join([
        f"`pgrank --profile {PROFILE} repro` from an empty workspace: {run['pipeline_s']:,.0f} s in all, "
        f"{len(run['stages'])} stage runs; tables {'complete' if not run['problems'] else 'INCOMPLETE'}. "
        f"Disk after the run: workspace {run['disk_bytes']['workspace'] / 2**20:,.1f} MiB, data/{PROFILE}/ (mirror, models, "
        f"downloaded sets, embeddings) {run['disk_bytes']['data'] / 2**20:,.1f} MiB.", "",
        *group_table(run["groups"])])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add_set_option(parser, "'data.eval_sets=[msmarco/dev, msmarco/test, nq/test]'", "the pipeline")
    parser.add_argument("--prepare-only", action="store_true", help="write data/paper-smoke/ and stop")
    parser.add_argument("--out", type=Path, default=None,
                        help="also write a record of the run (time, peak RSS and disk per stage kind) to this JSON "
                             "file, e.g. bench/out/paper_smoke.json; the workspace must not exist yet")
    args = parser.parse_args(argv)
    from pgrank.config import load_params

    ws = ROOT / load_params(ROOT / "params.yaml", args.overrides, PROFILE).paths.root
    if args.out and ws.exists():
        print(f"paper_smoke: error: {ws} exists; a record times every stage, so remove it first", file=sys.stderr)
        return 2
    start = time.perf_counter()
    made = prepare(FOLDER)
    print(f"prepared {made['mirror']} and {len(made['models'])} models in {time.perf_counter() - start:.0f} s")
    if args.prepare_only:
        return 0
    start = time.perf_counter()
    cmd = ["pgrank", "--profile", PROFILE, *set_args(args.overrides), "repro"]
    print("+ " + " ".join(cmd), flush=True)
    env = {k: v for k, v in os.environ.items() if k != "PGRANK_BEIR_MIRROR"}  # it would win over data.mirror
    subprocess.run(cmd, cwd=ROOT, env=env, check=True)
    pipeline_s = time.perf_counter() - start
    print(f"pipeline: {pipeline_s:.0f} s")
    problems = table_problems(ws)
    for problem in problems:
        print(f"incomplete: {problem}", file=sys.stderr)
    print(f"tables: {'complete' if not problems else f'{len(problems)} problems'} ({ws / 'tables' / 'tables.md'})")
    if args.out:
        from record import new_record, save
        from stage_resources import disk_bytes, stage_resources

        record = new_record("The paper's configuration, shrunk (paper-smoke), end to end on a CPU")
        record["run"] = {"pipeline_s": round(pipeline_s, 1), "problems": problems, **stage_resources(ws),
                         "disk_bytes": {"workspace": disk_bytes(ws), "data": disk_bytes(FOLDER)}}
        save(record, args.out, render)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
