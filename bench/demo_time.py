"""The demo's time against an earlier revision of pgrank, on one machine: ``python bench/demo_time.py``.

A change that adds work to the demo (a regulariser, more validation) is judged by how much longer ``pgrank demo``
takes on the same machine, not by stage times taken on different days or CPUs. Each ``--rev`` is cloned from this
checkout into ``--work`` (a fresh clone per run, so every run builds everything from nothing: datasets, the ONNX
export, corpus embeddings, candidates, training and evaluation) and ``pgrank demo`` runs there with that revision's
code first on ``PYTHONPATH``, under this interpreter and its installed packages. The runs are interleaved (A, B, A,
B, ...) so that a machine growing slower or faster during the benchmark weighs on every revision alike. A ``--rev``
may carry ``--set KEY=VALUE`` overrides after the revision (``--rev "HEAD --set models.backends.minilm=auto"``):
that run is ``pgrank --set KEY=VALUE demo``, so one revision can be timed under another setting beside itself.

Recorded per run: the wall time of ``pgrank demo``, the stage walls it logs (``pgrank: <stage>: wall X s``; a
process running several stages logs its own wall since it started after each) and the training stages' sum;
printed: each run with its training time and the rest, and each revision's mean with its ratio to the first
revision's.

Writes ``bench/out/demo_time.json`` (``--out``) with the machine, and prints the table.

Example:
    $ python bench/demo_time.py --work W --mirror M --rev v1 --rev HEAD \\
        --repeats 2
"""

from __future__ import annotations

import argparse
import os
import shlex
import shutil
import statistics
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from record import add_out_option, new_record, save, table  # noqa: E402
from scale import RESOURCES  # noqa: E402  the stage processes' resource lines, as bench/scale.py reads them

ROOT = Path(__file__).resolve().parents[1]


def stage_walls(output: str) -> dict[str, float]:
    """``{stage: seconds}`` from the ``pgrank: <stage>: wall X s, peak RSS Y MiB`` lines of a run's output, also where
    a progress bar shares the line (a stage logged twice keeps its last figure)."""
    return {m["name"]: float(m["wall"]) for m in RESOURCES.finditer(output)}


def training_seconds(walls: dict[str, float]) -> float:
    """The training stages' walls (``train-<warm start>``), summed."""
    return sum(seconds for stage, seconds in walls.items() if stage.startswith("train-"))


def parse_rev(spec: str) -> tuple[str, list[str]]:
    """``"REV --set K=V ..."`` -> ``(REV, ["--set", "K=V", ...])``: a revision and the overrides its demo runs with."""
    words = shlex.split(spec)
    if not words or words[0].startswith("-"):
        raise SystemExit(f"--rev {spec!r}: expected a git revision first, then optional --set KEY=VALUE")
    rev, rest = words[0], words[1:]
    if len(rest) % 2 or any(flag != "--set" or "=" not in value for flag, value in zip(rest[::2], rest[1::2])):
        raise SystemExit(f"--rev {spec!r}: after the revision only --set KEY=VALUE pairs may follow")
    return rev, rest


def clone(rev: str, folder: Path) -> str:
    """A fresh clone of this checkout at ``rev``; returns its full commit id."""
    if folder.exists():
        shutil.rmtree(folder)
    for command in (["git", "clone", "--quiet", str(ROOT), str(folder)],
                    ["git", "-C", str(folder), "checkout", "--quiet", rev]):
        done = subprocess.run(command, capture_output=True, text=True)
        if done.returncode != 0:
            raise SystemExit(f"--rev {rev}: `{shlex.join(command)}` failed: {done.stderr.strip()}")
    return subprocess.run(["git", "-C", str(folder), "rev-parse", "HEAD"], check=True, capture_output=True,
                          text=True).stdout.strip()


def run_demo(folder: Path, mirror: Path, log: Path, overrides: Sequence[str] = ()) -> tuple[int, float, str]:
    """``pgrank [--set K=V ...] demo`` in ``folder`` with that clone's code imported first; ``(exit code, wall seconds,
    output)``."""
    env = dict(os.environ, PYTHONPATH=str(folder), PGRANK_BEIR_MIRROR=str(mirror))
    pgrank = Path(sys.executable).parent / "pgrank"
    start = time.perf_counter()
    with log.open("w", encoding="utf-8") as out:
        code = subprocess.run([str(pgrank), *overrides, "demo"], cwd=folder, env=env, stdout=out, stderr=subprocess.STDOUT).returncode
    wall = time.perf_counter() - start
    return code, wall, log.read_text(encoding="utf-8", errors="replace")


def render(record: dict) -> str:
    revs = record["revisions"]
    rows = [[r["rev"], r["commit"][:10], r["repeat"], f"{r['seconds']:.0f}", f"{r['training']:.0f}",
             f"{r['seconds'] - r['training']:.0f}"] for r in record["runs"]]
    lines = table(["revision", "commit", "run", "`pgrank demo` s", "training s", "the rest s"], rows, "llrrrr")
    first = revs[0]["mean_seconds"]
    lines += ["", *table(["revision", "runs", "mean s", "against the first"],
                         [[r["rev"], r["runs"], f"{r['mean_seconds']:.0f}", f"{r['mean_seconds'] / first:.2f}x"]
                          for r in revs], "lrrr")]
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--work", type=Path, required=True, help="where the clones and their runs go")
    parser.add_argument("--mirror", type=Path, required=True, help="a local copy of BEIR's download server")
    parser.add_argument("--rev", action="append", required=True, help="a git revision of this checkout, optionally "
                        "followed by --set KEY=VALUE overrides for its demo (repeatable)")
    parser.add_argument("--repeats", type=int, default=1)
    add_out_option(parser, __file__)
    args = parser.parse_args()
    specs = [parse_rev(spec) for spec in args.rev]  # a malformed --rev stops before any run
    mirror = args.mirror.resolve()
    args.work.mkdir(parents=True, exist_ok=True)
    runs = []
    for repeat in range(1, args.repeats + 1):
        for i, (rev, (checkout, overrides)) in enumerate(zip(args.rev, specs)):
            folder = args.work / f"rev{i}-run{repeat}"
            commit = clone(checkout, folder)
            code, wall, output = run_demo(folder, mirror, args.work / f"rev{i}-run{repeat}.log", overrides)
            if code != 0:
                raise SystemExit(f"{rev}: pgrank demo exited {code}; its output: {args.work / f'rev{i}-run{repeat}.log'}")
            walls = stage_walls(output)
            runs.append({"rev": rev, "commit": commit, "repeat": repeat, "seconds": wall, "walls": walls,
                         "training": training_seconds(walls)})
            print(f"{rev} ({commit[:10]}) run {repeat}: {wall:.0f} s", flush=True)
            shutil.rmtree(folder)  # the next run of this revision builds everything again
    revisions = [{"rev": rev, "runs": len(mine), "mean_seconds": statistics.mean(r["seconds"] for r in mine)}
                 for rev in args.rev for mine in [[r for r in runs if r["rev"] == rev]]]
    record = new_record("The demo's time against an earlier revision, on one machine")
    record.update(revisions=revisions, runs=runs)
    save(record, args.out, render)


if __name__ == "__main__":
    main()
