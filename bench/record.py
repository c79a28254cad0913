"""A benchmark's record: what every ``bench/*.py`` script writes to ``bench/out/<script>.json``.

A record is plain JSON: ``command`` (how the script was invoked, ``python bench/<script>.py <args>``), ``title`` (one
line saying what it measures), ``machine`` (:func:`machine.machine_record`: CPU and flags, cores, memory, GPUs,
library versions) and the script's results, the numbers behind every table it prints. Each script's
``render(record)`` turns a record into the Markdown it prints; the docs' benchmarks page (``docs/generate.py``) calls
the same function on the files under ``bench/out/``, so a figure on that page is the one the command printed.

Example:
    >>> parser = argparse.ArgumentParser()
    >>> add_out_option(parser, __file__)           # --out, by default bench/out/<script>.json
    >>> args = parser.parse_args()
    >>> record = new_record("Exact first-stage search, torch against FAISS")
    >>> record["seconds"] = {"torch": 0.47}
    >>> save(record, args.out, render)             # written atomically, then render(record) printed
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import sys
from collections.abc import Callable, Sequence
from pathlib import Path

from machine import machine_record

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "bench" / "out"


def add_out_option(parser: argparse.ArgumentParser, script: str) -> None:
    """``--out``: where the record of ``script`` (its ``__file__``) goes, by default ``bench/out/<script>.json``."""
    name = Path(script).stem
    parser.add_argument("--out", type=Path, default=OUT / f"{name}.json",
                        help=f"the JSON record to write (default: bench/out/{name}.json)")


def add_mirror_option(parser: argparse.ArgumentParser, *, required: bool = True) -> None:
    """``--mirror``: a local copy of BEIR's download server, by default ``$PGRANK_BEIR_MIRROR``.

    ``required``: the flag must be given when the variable is not set; otherwise a missing mirror means the
    profile's own ``data.mirror`` (or BEIR's server)."""
    env = os.environ.get("PGRANK_BEIR_MIRROR")
    otherwise = "" if required else ", else the profile's data.mirror"
    parser.add_argument("--mirror", default=env, required=required and env is None,
                        help=f"a local copy of BEIR's download server (default: $PGRANK_BEIR_MIRROR"
                             f"{otherwise})")


def add_set_option(parser: argparse.ArgumentParser, example: str = "train.epochs=2", what: str = "every run") -> None:
    """``--set KEY=VALUE`` (repeatable, into ``args.overrides``): a params override for ``what``, as ``pgrank --set``."""
    parser.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                        help=f"a params override for {what}, e.g. {example} (repeatable)")


def set_args(overrides: Sequence[str]) -> list[str]:
    """``pgrank``'s ``--set`` arguments for ``overrides``."""
    return [arg for override in overrides for arg in ("--set", override)]


def new_record(title: str) -> dict:
    """The record's head: the command as invoked (``python bench/<script>.py <args>``), ``title`` and the machine."""
    script = f"bench/{Path(sys.argv[0]).name}"
    return {"command": "python " + shlex.join([script, *sys.argv[1:]]), "title": title, "machine": machine_record()}


def _plain(value):
    """numpy scalars and arrays as JSON numbers and lists (json's ``default``)."""
    if hasattr(value, "tolist"):
        return value.tolist()
    raise TypeError(f"{type(value).__name__} is not JSON: {value!r}")


def save(record: dict, out: Path, render: Callable[[dict], str]) -> dict:
    """Write ``record`` to ``out`` atomically, print ``render`` of it as written, and return it as written (plain JSON:
    what the docs render is what was printed)."""
    from pgrank.atomic import write_json

    written = json.loads(json.dumps(record, default=_plain))
    write_json(out, written)
    print("\n" + render(written), flush=True)
    print(f"\n-> {out}")
    return written


def table(header: Sequence[str], rows: Sequence[Sequence], align: str) -> list[str]:
    """A Markdown table's lines; ``align`` has one letter a column, ``l`` (text) or ``r`` (numbers)."""
    rule = ["---:" if a == "r" else "---" for a in align]
    return ["| " + " | ".join(header) + " |", "| " + " | ".join(rule) + " |",
            *("| " + " | ".join(str(cell) for cell in row) + " |" for row in rows)]
