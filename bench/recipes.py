"""The recipes of the docs (``docs/recipes/*.md``), run as their pages state them, and recorded.

A page's commands are its fenced ``bash`` blocks, in order, run as one bash session (``set -euo pipefail``: a command
that fails, or a variable the page never set, stops it) from the project's root (:func:`page_script`). A page may say
how to **try it small**: one line with ``--set`` overrides in a code span, which :func:`shrunk` adds to each of the
page's ``pgrank`` commands (before the subcommand, after the page's own options, so they win) and ``python studies/...``
commands (at the end). ``tests/test_recipes.py`` runs every page so; this script records a run in
``bench/out/recipe-<page>[-small].json``: each block's command, its output (trimmed) and its seconds.

* ``paper-table``: ``pgrank --profile paper-table plan``, the price of reproducing the paper's in-domain reranking
  table (and three out-of-domain rows) from the SBERT warm start on the authors' published candidate sets; run with an
  empty data folder, so that it prints what a checkout with nothing downloaded prints (BEIR's published sizes). The
  page's ``repro`` needs a GPU machine with internet, which this machine is not.
* ``own-data``, ``compare-objectives`` (``--small``: shrunk by the page's own overrides): the page's blocks, with
  ``HOME`` a fresh folder (``--home``, default a temporary one), so that the work folder the page names under ``~``
  is new, and the BEIR mirror of ``$PGRANK_BEIR_MIRROR`` (``--mirror``) where the machine is offline.

Usage::

    python bench/recipes.py paper-table
    python bench/recipes.py own-data --small [--mirror M] [--home H]
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shlex
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from record import OUT, add_mirror_option, new_record, save

ROOT = Path(__file__).resolve().parents[1]
PAGES = ROOT / "docs" / "recipes"
BIN = Path(sys.executable).parent  # the environment's console scripts: pgrank, dvc
PGRANK = [str(BIN / "pgrank")]
OUTPUT_LINES = 40  # lines of a command's output kept in the record (head and tail)
STEP = "@@pgrank-recipe-step"

PAPER_TABLE = ["--profile", "paper-table"]

# "To try it small" ... `--set KEY=VALUE --set ...`: the page's own shrinking overrides.
_SMALL = re.compile(r"try it small.*?`(--set [^`]+)`", re.S | re.I)
# A pgrank command up to its subcommand: the program and its global options (--profile, --set, --params with values).
_PGRANK = re.compile(r"""^(\s*pgrank(?:\s+--(?:profile|set|params)\s+(?:'[^']*'|"[^"]*"|\S+))*)(?=\s+\w)""")
_STUDY = re.compile(r"^\s*python\s+studies/\S+\.py\b")


def blocks(page: str, language: str = "bash") -> list[str]:
    """The fenced blocks of ``docs/recipes/<page>.md`` in ``language``, in order, without their fences."""
    text = (PAGES / f"{page}.md").read_text(encoding="utf-8")
    return [m.group(1) for m in re.finditer(rf"^```{language}\n(.*?)^```$", text, re.S | re.M)]


def small_overrides(page: str) -> list[str]:
    """The ``KEY=VALUE`` overrides of the page's "try it small" line (none when it has none)."""
    match = _SMALL.search((PAGES / f"{page}.md").read_text(encoding="utf-8"))
    if match is None:
        return []
    words = shlex.split(match.group(1))
    if words[::2] != ["--set"] * (len(words) // 2) or len(words) % 2:
        raise ValueError(f"docs/recipes/{page}.md: the 'try it small' span is not '--set KEY=VALUE ...': {match.group(1)}")
    return words[1::2]


def shrunk(block: str, overrides: list[str]) -> str:
    """``block`` with ``--set`` of each override added to its ``pgrank`` and ``python studies/...`` commands (a command
    continued over lines with a backslash is one command)."""
    if not overrides:
        return block
    sets = " ".join(f"--set {shlex.quote(o)}" for o in overrides)
    lines = []
    for line in block.replace("\\\n", " ").split("\n"):
        if match := _PGRANK.match(line):
            line = f"{line[:match.end(1)]} {sets}{line[match.end(1):]}"
        elif _STUDY.match(line):
            line = f"{line} {sets}"
        lines.append(line)
    return "\n".join(lines)


def page_script(page: str, small: bool = False) -> list[str]:
    """The page's blocks as they run: shrunk by its own overrides when ``small``."""
    overrides = small_overrides(page) if small else []
    if small and not overrides:
        raise ValueError(f"docs/recipes/{page}.md states no 'try it small' overrides")
    return [shrunk(block, overrides) for block in blocks(page)]


def _clean(text: str) -> str:
    """Output as a terminal would leave it: of a line redrawn with carriage returns (a progress bar), its last state."""
    return "\n".join(line.rsplit("\r", 1)[-1] for line in text.splitlines())


def trimmed(text: str, lines: int = OUTPUT_LINES) -> str:
    """The first and last ``lines // 2`` lines of ``text`` (with how many were left out between them)."""
    rows = text.rstrip("\n").splitlines()
    if len(rows) <= lines:
        return "\n".join(rows)
    half = lines // 2
    return "\n".join([*rows[:half], f"... ({len(rows) - lines} lines)", *rows[-half:]])


def run_page(page: str, *, cwd: Path, env: dict, small: bool = False, timeout: float | None = None) -> dict:
    """Run the page's blocks in one bash session in ``cwd``; ``{"returncode", "steps": [{command, output, seconds}]}``,
    one step a block (a failed block is the last step)."""
    script = ["set -euo pipefail", "export TQDM_DISABLE=1"]
    runs = page_script(page, small)
    for i, block in enumerate(runs):
        script += [f"printf '\\n{STEP} {i} %s\\n' \"$(date +%s.%N)\"", block]
    script.append(f"printf '\\n{STEP} end %s\\n' \"$(date +%s.%N)\"")
    done = subprocess.run(["bash", "-c", "\n".join(script)], cwd=cwd, env=env, stdout=subprocess.PIPE,
                          stderr=subprocess.STDOUT, text=True, timeout=timeout)
    parts = re.split(rf"\n?{STEP} (\d+|end) ([\d.]+)\n", done.stdout)
    marks = [(parts[i], float(parts[i + 1]), parts[i + 2]) for i in range(1, len(parts) - 2, 3)]
    steps = []
    for (index, started, output), nxt in zip(marks, [*marks[1:], None]):
        if index == "end":
            break
        ended = nxt[1] if nxt is not None else time.time()
        steps.append({"command": runs[int(index)], "output": _clean(output).strip("\n"),
                      "seconds": round(ended - started, 1)})
    return {"returncode": done.returncode, "steps": steps}


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


def page_run(args) -> dict:
    """A page run as written (``--small``: shrunk by its own overrides), in a fresh ``HOME``."""
    home = Path(args.home or tempfile.mkdtemp(prefix="pgrank-recipe-home-")).resolve()
    home.mkdir(parents=True, exist_ok=True)
    env = {**os.environ, "HOME": str(home), "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1",
           "TOKENIZERS_PARALLELISM": "false", "DVC_NO_ANALYTICS": "1",
           "PATH": f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}"}
    env.pop("PGRANK_PROFILE", None)
    if args.mirror:
        env["PGRANK_BEIR_MIRROR"] = str(Path(args.mirror).resolve())
    else:
        env.pop("PGRANK_BEIR_MIRROR", None)
    size = "shrunk by the page's own 'try it small' overrides" if args.small else "as written"
    record = new_record(f"docs/recipes/{args.recipe}.md, every command {size}, in one bash session")
    record["small_overrides"] = small_overrides(args.recipe) if args.small else []
    result = run_page(args.recipe, cwd=ROOT, env=env, small=args.small)
    for step in result["steps"]:
        step["output"] = trimmed(step["output"].replace(str(home), "~").replace(f"{ROOT}/", ""))
    record.update(steps=result["steps"], returncode=result["returncode"],
                  seconds=round(sum(s["seconds"] for s in result["steps"]), 1),
                  load_average=os.getloadavg())
    if result["returncode"]:
        print(json.dumps(record["steps"][-1], indent=1))
        raise SystemExit(f"docs/recipes/{args.recipe}.md: exit {result['returncode']} in the block above")
    return record


def render(record: dict) -> str:
    """Each step as a shell transcript: its command and seconds, then its output (one fenced block a step)."""
    return "\n\n".join(f"```text\n$ {s['command']}   # {s['seconds']:.1f} s\n{s['output']}\n```" for s in record["steps"])


RECIPES = {"paper-table": paper_table, "own-data": page_run, "compare-objectives": page_run}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("recipe", choices=sorted(RECIPES))
    parser.add_argument("--small", action="store_true", help="shrunk by the page's own 'try it small' overrides")
    parser.add_argument("--home", default=None, help="HOME for the page's commands (default: a new temporary folder)")
    add_mirror_option(parser, required=False)
    parser.add_argument("--out", type=Path, default=None,
                        help="default: bench/out/recipe-<recipe>[-small].json")
    args = parser.parse_args()
    record = RECIPES[args.recipe](args)
    save(record, args.out or OUT / f"recipe-{args.recipe}{'-small' if args.small else ''}.json", render)


if __name__ == "__main__":
    main()
