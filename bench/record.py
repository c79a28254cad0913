"""The plumbing shared by benchmarks and studies: a record, what every ``bench/*.py`` script writes to
``bench/out/<script>.json`` and every ``studies/*.py`` script to ``studies/out/<script>.json``, and the machine it ran on.

A record is plain JSON: ``command`` (how the script was invoked, ``python bench/<script>.py <args>``), ``title`` (one
line saying what it measures), ``machine`` (:func:`machine_record`: CPU and flags, cores, memory, GPUs,
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
import platform
import re
import shlex
import sys
from collections.abc import Callable, Sequence
from importlib import metadata
from pathlib import Path

LIBRARIES = ("torch", "transformers", "sentence-transformers", "onnxruntime", "faiss-cpu", "faiss-gpu", "numpy",
             "tokenizers", "bm25s")
FLAGS = ("avx2", "fma", "avx512f", "avx512_vnni", "avx512_bf16", "amx_bf16", "amx_int8", "amx_tile")


def _cpuinfo() -> tuple[str, list[str]]:
    try:
        text = Path("/proc/cpuinfo").read_text(encoding="utf-8", errors="replace")
    except OSError:
        return platform.processor() or platform.machine(), []
    model, flags = platform.processor(), set()
    for line in text.splitlines():
        key, _, value = line.partition(":")
        if key.strip() == "model name" and value.strip():
            model = value.strip()
        elif key.strip() == "flags":
            flags = set(value.split())
    return model, [f for f in FLAGS if f in flags]


def _memory_gib() -> float | None:
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal:"):
                return round(int(line.split()[1]) / 2**20, 1)
    except OSError:
        pass
    return None


def _gpus() -> list[dict]:
    try:
        import torch
    except ImportError:
        return []
    if not torch.cuda.is_available():
        return []
    out = []
    for i in range(torch.cuda.device_count()):
        p = torch.cuda.get_device_properties(i)
        out.append({"name": p.name, "memory_gib": round(p.total_memory / 2**30, 1),
                    "capability": f"{p.major}.{p.minor}", "multiprocessors": p.multi_processor_count})
    return out


def _driver() -> str | None:
    """The NVIDIA kernel module's version ("NVRM version: NVIDIA UNIX Open Kernel Module for x86_64  580.159.04 ...")."""
    try:
        found = re.search(r"Kernel Module.*?\s(\d+\.\d+(?:\.\d+)?)\b", Path("/proc/driver/nvidia/version").read_text())
    except OSError:
        return None
    return found.group(1) if found else None


def machine_record() -> dict:
    """Everything above as one JSON-ready dict."""
    model, flags = _cpuinfo()
    versions = {}
    for name in LIBRARIES:
        try:
            versions[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            continue
    gpus = _gpus()
    cuda = None
    if gpus:
        import torch

        cuda = torch.version.cuda
    return {"cpu": model, "cpu_flags": flags, "cores": os.cpu_count(), "memory_gib": _memory_gib(),
            "gpu": gpus[0]["name"] if gpus else None, "gpus": gpus, "nvidia_driver": _driver(), "cuda": cuda,
            "python": platform.python_version(), "platform": platform.platform(), "libraries": versions}


ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "bench" / "out"


def add_out_option(parser: argparse.ArgumentParser, script: str) -> None:
    """``--out``: where the record of ``script`` (its ``__file__``) goes, by default ``out/<script>.json`` beside it
    (``bench/out/`` for a benchmark, ``studies/out/`` for a study)."""
    path = Path(script).resolve()
    folder = path.parent.name
    parser.add_argument("--out", type=Path, default=path.parent / "out" / f"{path.stem}.json",
                        help=f"the JSON record to write (default: {folder}/out/{path.stem}.json)")


def add_mirror_option(parser: argparse.ArgumentParser, *, required: bool = True) -> None:
    """``--mirror``: a local copy of BEIR's download server, by default ``$PGRANK_BEIR_MIRROR``.

    ``required``: the flag must be given when the variable is not set; otherwise a missing mirror means the
    profile's own ``data.mirror`` (or BEIR's server)."""
    env = os.environ.get("PGRANK_BEIR_MIRROR") or None  # an empty variable is no mirror
    otherwise = "" if required else ", else the profile's data.mirror"
    # nargs="?": `--mirror $PGRANK_BEIR_MIRROR` with the variable unset or empty is no mirror, not an argument error
    parser.add_argument("--mirror", default=env, nargs="?", const=None, required=required and env is None,
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
    """The record's head: the command as invoked (``python bench/<script>.py <args>`` or ``python
    studies/<script>.py <args>``), ``title`` and the machine."""
    invoked = Path(sys.argv[0])
    script = f"{'studies' if invoked.parent.name == 'studies' else 'bench'}/{invoked.name}"
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
