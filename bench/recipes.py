"""The recipes of the docs (``docs/recipes/``), executed: each writes ``bench/out/recipe-<name>.json`` with the commands
the page shows, their output (trimmed) and the seconds each took.

* ``paper-table``: ``pgrank --profile paper-table plan``, the price of reproducing the paper's in-domain reranking
  table (and three out-of-domain rows) from the SBERT warm start on the authors' published candidate sets; run with
  an empty data folder, so that it prints what a checkout with nothing downloaded prints (BEIR's published sizes).
* ``own-data``: a BEIR-format folder as "your own data" (NFCorpus, unzipped from the BEIR mirror into ``W``), named
  under ``data.sources`` as ``acme``: ``pgrank repro`` with the demo profile and a small overlay (one epoch of 320
  queries, the warm start and the policy evaluated), ``dvc metrics show``, ``pgrank export`` and a search of the
  corpus in five lines of plain sentence-transformers. Minutes on a CPU (the corpus embeddings of pgrank's stages
  come from the project's shared cache, ``paths.embeddings``, when the demo encoded the same corpus before).

Usage::

    python bench/recipes.py paper-table
    PGRANK_BEIR_MIRROR=M python bench/recipes.py own-data --work W     # or --mirror M

Commands are recorded with the work folder written ``W``, as the pages show them.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import subprocess
import sys
import tempfile
import time
import zipfile
from pathlib import Path

from record import OUT, new_record, save

ROOT = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent  # the environment's console scripts: pgrank, dvc
PGRANK = [str(BIN / "pgrank")]
OUTPUT_LINES = 40  # lines of a command's output kept in the record (head and tail)

PAPER_TABLE = ["--profile", "paper-table"]

# "Your own data": the demo profile, the folder named under data.sources, and a small budget.
OWN_DATA_OVERLAY = [
    "data.sources.acme.path=W/nfcorpus",
    "data.train=acme/train",
    "data.eval_sets=[acme/test]",
    "train.validation_sets=[]",
    "train.selection={rule: in_domain}",
    "train.epochs=1",
    "train.keep_epochs=[0, 1]",
    "train.queries_per_epoch=320",
    "evaluate.systems={bm25: [], dense: [minilm], sparse: []}",
    "evaluate.policy_epochs=[]",
    "paths.root=runs/acme",          # a profile's workspace: a folder inside the project
    "paths.data=W/data",
]

# The search of the page (docs/recipes/own-data.md): the exported folder and the corpus, five lines after the imports.
SEARCH = """\
import json
from sentence_transformers import SentenceTransformer
model = SentenceTransformer("acme-ranker")
docs = [json.loads(line) for line in open("nfcorpus/corpus.jsonl", encoding="utf-8")]
top = model.similarity(model.encode_query(["do statins prevent heart disease"]), model.encode_document([f"{d['title']} {d['text']}" for d in docs]))[0].topk(3)
for score, i in zip(top.values.tolist(), top.indices.tolist()): print(f"{score:.3f} {docs[i]['_id']} {docs[i]['title']}")
"""
# What the page leaves out of `pgrank repro`'s output: DVC's bookkeeping and the list of table files written.
NOISE = ("Updating lock file", "Use `dvc push`", "-> runs/acme/tables/")


def trimmed(text: str, lines: int = OUTPUT_LINES) -> str:
    """The first and last ``lines // 2`` lines of ``text`` (with how many were left out between them)."""
    rows = text.rstrip("\n").splitlines()
    if len(rows) <= lines:
        return "\n".join(rows)
    half = lines // 2
    return "\n".join([*rows[:half], f"... ({len(rows) - lines} lines)", *rows[-half:]])


def shown(argv: list[str], work: Path | None) -> str:
    """``argv`` as the page shows it: ``pgrank`` for the CLI, the work folder as ``W``."""
    words = [Path(argv[0]).name if Path(argv[0]).parent == BIN else argv[0], *argv[1:]]
    text = shlex.join(words)
    return text.replace(str(work), "W") if work is not None else text


def run_step(argv: list[str], *, cwd: Path, work: Path | None = None, env: dict | None = None,
             lines: int = OUTPUT_LINES) -> dict:
    """Run one command; its shown form, output (paths relative to the project, the work folder as ``W``, without
    :data:`NOISE` lines, trimmed to ``lines``) and seconds. Stops the recipe on failure."""
    print(f"$ {shown(argv, work)}", flush=True)
    started = time.perf_counter()
    done = subprocess.run(argv, cwd=cwd, env={**os.environ, **(env or {})}, capture_output=True, text=True)
    seconds = time.perf_counter() - started
    output = (done.stdout + (done.stderr if done.returncode else "")).replace(f"{ROOT}/", "")
    if work is not None:
        output = output.replace(str(work), "W")
    output = trimmed("\n".join(row for row in output.splitlines() if not row.startswith(NOISE)), lines)
    print(output, flush=True)
    if done.returncode:
        raise SystemExit(f"exit {done.returncode} after {seconds:.0f} s: {shown(argv, work)}\n{done.stderr[-3000:]}")
    return {"command": shown(argv, work), "output": output, "seconds": round(seconds, 1)}


def paper_table_plan(data: Path, *overrides: str) -> str:
    """What ``pgrank --profile paper-table [--set ...] plan`` prints with nothing downloaded (``paths.data`` = ``data``,
    an empty folder)."""
    sets = [w for item in [*overrides, f"paths.data={data}"] for w in ("--set", item)]
    done = subprocess.run([*PGRANK, *PAPER_TABLE, *sets, "plan"], cwd=ROOT, env={**os.environ, "HF_HUB_OFFLINE": "1"},
                          capture_output=True, text=True, check=True)
    return done.stdout.rstrip("\n")


def paper_table(args) -> dict:
    record = new_record("Reproduce one paper table within a budget: what `pgrank plan` prices "
                        "(docs/recipes/paper-table.md)")
    with tempfile.TemporaryDirectory() as empty:
        started = time.perf_counter()
        output = paper_table_plan(Path(empty))
        seconds = time.perf_counter() - started
    record["note"] = ("nothing downloaded (paths.data an empty folder): dataset sizes and lengths are BEIR's "
                      "published ones")
    record["steps"] = [{"command": shlex.join(["pgrank", *PAPER_TABLE, "plan"]), "output": output,
                        "seconds": round(seconds, 1)}]
    return record


def file_heads(folder: Path, lines: int = 2, width: int = 160) -> dict[str, list[str]]:
    """The first ``lines`` lines of each file of a BEIR folder, cut at ``width`` characters."""
    heads = {}
    for name in ("corpus.jsonl", "queries.jsonl", "qrels/train.tsv", "qrels/test.tsv"):
        with open(folder / name, encoding="utf-8") as fh:
            heads[name] = [line.rstrip("\n")[:width] for _, line in zip(range(lines + name.endswith(".tsv")), fh)]
    return heads


def own_data(args) -> dict:
    mirror = args.mirror or os.environ.get("PGRANK_BEIR_MIRROR")
    if not mirror:
        raise SystemExit("own-data: give --mirror or set PGRANK_BEIR_MIRROR (a folder holding nfcorpus.zip)")
    archive = Path(mirror) / "nfcorpus.zip"
    if not archive.is_file():
        raise SystemExit(f"own-data: {archive}: no such file")
    work = args.work.resolve()
    work.mkdir(parents=True, exist_ok=True)
    env = {"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false",
           "PGRANK_BEIR_MIRROR": str(Path(mirror).resolve())}
    record = new_record("Your own data, end to end: a BEIR folder named under data.sources, trained, read, exported "
                        "and searched (docs/recipes/own-data.md)")
    record["command"] = record["command"].replace(str(work), "W")
    if not (work / "nfcorpus" / "corpus.jsonl").is_file():
        with zipfile.ZipFile(archive) as zf:
            zf.extractall(work)
    record["files"] = file_heads(work / "nfcorpus")
    sets = [w for item in OWN_DATA_OVERLAY for w in ("--set", item.replace("W/", f"{work}/"))]
    pgrank = [*PGRANK, "--profile", "demo", *sets]
    steps = [run_step([*pgrank, "repro"], cwd=ROOT, work=work, env=env, lines=80)]
    steps.append(run_step([str(BIN / "dvc"), "metrics", "show", "--precision", "3"], cwd=ROOT / "runs" / "acme",
                          work=work, env=env))
    steps.append(run_step([*pgrank, "export", "--to", str(work / "acme-ranker")], cwd=ROOT, work=work, env=env))
    (work / "search.py").write_text(SEARCH, encoding="utf-8")
    steps.append(run_step([sys.executable, "search.py"], cwd=work, work=work, env=env))
    record.update(overlay=OWN_DATA_OVERLAY, search=SEARCH, steps=steps)
    record["model_card"] = trimmed((work / "acme-ranker" / "README.md").read_text(encoding="utf-8"), 60)
    return record


def render(record: dict) -> str:
    """Each step as a shell transcript: its command and seconds, then its output (one fenced block a step)."""
    return "\n\n".join(f"```text\n$ {s['command']}   # {s['seconds']:.1f} s\n{s['output']}\n```" for s in record["steps"])


RECIPES = {"paper-table": paper_table, "own-data": own_data}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("recipe", choices=sorted(RECIPES))
    parser.add_argument("--work", type=Path, help="own-data: a work folder (the data, the workspace, the export)")
    parser.add_argument("--mirror", default=None, help="own-data: the BEIR mirror folder (default: PGRANK_BEIR_MIRROR)")
    parser.add_argument("--out", type=Path, default=None, help="default: bench/out/recipe-<recipe>.json")
    args = parser.parse_args()
    if args.recipe == "own-data" and args.work is None:
        parser.error("own-data needs --work W")
    record = RECIPES[args.recipe](args)
    save(record, args.out or OUT / f"recipe-{args.recipe}.json", render)


if __name__ == "__main__":
    main()
