"""The test suite's own time: the README's test command with every test's duration, the fast subset's time, and
what the suite covers of ``pgrank``.

The README's test command (the line ending in ``# tests``, as ``.ci/run`` reads it; its ``python -m pytest``, with
pyproject's ``addopts``: two worker processes, the default marks) runs with ``--durations=0``; the record keeps

* ``suite``: the wall time (process start to exit, collection and the workers' start included), pytest's own time,
  the counts (passed, skipped, failed, ...), the machine's load average before and after (the suite runs on every
  core it has: a busy machine shows there);
* ``files``: seconds per test file, setup, call and teardown of its tests summed (what ``tests/conftest.py`` reads to
  hand the heaviest files to the workers first); ``tests``: each test's seconds (those pytest reports, 5 ms and
  over), and ``slowest``: the slowest tests by phase;
* ``fast``: the same for the unit tests of the pure packages (:data:`FAST`, the README's edit-test loop);
* ``coverage`` (``--cov``): the lines of ``pgrank/`` the suite runs, in this process and in every Python process it
  starts (the stages that DVC runs included: ``coverage``'s ``patch = subprocess``);
* ``suite.cpu_s``: the CPU seconds (user and system) of the suite's process and every process it started and waited
  for, and ``processes`` (``--processes``): where they went. A ``sitecustomize`` on ``PYTHONPATH`` has each Python
  process the suite starts (those given the suite's environment: a test that clears ``PYTHONPATH`` hides its child)
  write, as it exits normally, its CPU seconds, its test and which of the heavy libraries it imported; the record sums
  them per library and per test file.

Usage::

    python bench/test_suite.py [--cov] [--processes] [--skip-fast] [--out bench/out/test_suite.json] [-- PYTEST_ARGS]
    python bench/test_suite.py --durations-from LOG    # a finished run's output (pytest --durations=0), e.g. CI's,
                                                       # and the fast subset timed here (unless --skip-fast)

``PYTEST_ARGS`` go to both runs after the README's arguments (for example ``-- -n 4``). A run read from its log has
pytest's own time, not the wall time, and no load average.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import resource
import shlex
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from record import ROOT, add_out_option, new_record, save, table

FAST = ["tests/core", "tests/config", "tests/data", "tests/models", "tests/reporting"]
FAST_GOAL_S = 120
SUITE_GOAL_S = 600
DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?)s (setup|call|teardown)\s+(\S.*?)\s*$")
COUNT = re.compile(r"(\d+) (passed|failed|skipped|deselected|xfailed|xpassed|errors?|warnings?)\b")
SUMMARY = re.compile(r"\bin (\d+(?:\.\d+)?)s\b")


def readme_command(readme: Path = ROOT / "README.md") -> list[str]:
    """The README's test command, as ``.ci/run`` reads it (the line ending in ``# tests``), without the installs before
    it: its last ``&&`` part, with this interpreter for ``python``."""
    line = next((line for line in readme.read_text(encoding="utf-8").splitlines()
                 if re.search(r"# tests\s*$", line)), None)
    if line is None:
        raise SystemExit(f"bench/test_suite.py: no line ending in '# tests' in {readme}")
    words = shlex.split(line.split("&&")[-1].split("#")[0])
    return [sys.executable if words[0] in ("python", "python3") else words[0], *words[1:]]


def parse(output: str) -> dict:
    """pytest's terminal output (``--durations=0``) as ``{"seconds", "counts", "tests", "files"}``: pytest's own time,
    its outcome counts, each test's ``{setup, call, teardown}`` seconds and each file's sum."""
    tests: dict[str, dict[str, float]] = {}
    in_durations = False
    for line in output.splitlines():
        if "slowest" in line and "durations" in line and line.startswith("="):
            in_durations = True
            continue
        if in_durations:
            found = DURATION.match(line)
            if found:
                seconds, phase, test = float(found[1]), found[2], found[3]
                tests.setdefault(test, {})[phase] = seconds
            elif line.startswith("=") or (line.strip() and not line.startswith("(")):
                in_durations = False
    summary = next((line for line in reversed(output.splitlines()) if COUNT.search(line) and SUMMARY.search(line)), "")
    counts = {}
    for n, word in COUNT.findall(summary):
        word = {"error": "errors", "warning": "warnings"}.get(word, word)
        counts[word] = int(n)
    files: dict[str, float] = {}
    for test, phases in tests.items():
        name = test.split("::")[0]
        files[name] = round(files.get(name, 0.0) + sum(phases.values()), 2)
    seconds = SUMMARY.search(summary)
    return {"seconds": float(seconds[1]) if seconds else None, "counts": counts, "tests": tests,
            "files": dict(sorted(files.items(), key=lambda kv: -kv[1]))}


def _coverage_rc(folder: Path) -> Path:
    """A coverage configuration that measures every Python process the tests start too, each into its own data file."""
    rc = folder / "coveragerc"
    rc.write_text(f"[run]\nsource = pgrank\nparallel = true\npatch = subprocess\ndata_file = {folder / '.coverage'}\n"
                  "[report]\nomit = */tests/*\n")
    return rc


def coverage_totals(report: Path, package: Path = ROOT / "pgrank") -> dict:
    """``coverage json``'s report, cut to the files of ``package`` (this checkout's ``pgrank/``; a copy of the code in a
    test's temporary checkout is another file): statements, covered lines and their share, per subpackage too."""
    files = json.loads(report.read_text(encoding="utf-8"))["files"]
    per: dict[str, list[int]] = {}
    total = [0, 0]
    for name, data in files.items():
        path = Path(name) if Path(name).is_absolute() else ROOT / name
        try:
            rel = path.resolve().relative_to(package.resolve())
        except ValueError:
            continue
        part = rel.parts[0] if len(rel.parts) > 1 else "(top level)"
        summary = data["summary"]
        cell = per.setdefault(part, [0, 0])
        for acc in (cell, total):
            acc[0] += summary["num_statements"]
            acc[1] += summary["covered_lines"]
    share = lambda s, c: round(100 * c / s, 1) if s else 0.0  # noqa: E731
    return {"statements": total[0], "covered_lines": total[1], "percent": share(*total),
            "packages": {k: {"statements": s, "covered_lines": c, "percent": share(s, c)}
                         for k, (s, c) in sorted(per.items())}}


# Each Python process that imports it at start (``sitecustomize`` on ``PYTHONPATH``) appends one JSON line to the
# file PGRANK_SUITE_PROCESSES names as it exits normally (a process killed by a signal writes nothing).
HOOK = """
import atexit, json, os, resource, sys
def _pgrank_suite_process():
    try:
        usage = resource.getrusage(resource.RUSAGE_SELF)
        row = {"cpu_s": round(usage.ru_utime + usage.ru_stime, 3),
               "test": os.environ.get("PYTEST_CURRENT_TEST", "").split("::")[0],
               "imports": [m for m in HEAVY if m in sys.modules]}
        with open(os.environ["PGRANK_SUITE_PROCESSES"], "a", encoding="utf-8") as f:
            f.write(json.dumps(row) + "\\n")
    except Exception:
        pass
HEAVY = %r
atexit.register(_pgrank_suite_process)
"""
HEAVY = ("sentence_transformers", "torch", "mlflow", "prefect", "dvc")


def _process_hook(folder: Path, env: dict) -> tuple[dict, Path]:
    """``env`` with the per-process hook on ``PYTHONPATH``, and the file the processes write to."""
    (folder / "hook").mkdir(parents=True, exist_ok=True)
    (folder / "hook" / "sitecustomize.py").write_text(HOOK % (HEAVY,), encoding="utf-8")
    rows = folder / "processes.jsonl"
    path = os.pathsep.join(filter(None, [str(folder / "hook"), env.get("PYTHONPATH", "")]))
    return {**env, "PYTHONPATH": path, "PGRANK_SUITE_PROCESSES": str(rows)}, rows


def process_totals(rows: Path, n: int = 15) -> dict:
    """The per-process lines summed: all of them, per heavy library imported, and per test file (the ``n`` heaviest;
    ``(none)``: the pytest processes themselves, their workers included, outside any test)."""
    found = [json.loads(line) for line in rows.read_text(encoding="utf-8").splitlines() if line.strip()] \
        if rows.is_file() else []
    def cell(items: list[dict]) -> dict:
        return {"count": len(items), "cpu_s": round(sum(r["cpu_s"] for r in items), 1)}
    files: dict[str, list[dict]] = {}
    for row in found:
        files.setdefault(row["test"] or "(none)", []).append(row)
    ranked = sorted(files.items(), key=lambda kv: -sum(r["cpu_s"] for r in kv[1]))[:n]
    return {**cell(found), "by_import": {m: cell([r for r in found if m in r["imports"]]) for m in HEAVY},
            "by_file": {name: cell(items) for name, items in ranked}}


def _children_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def measure(command: list[str], *, cwd: Path = ROOT, env: dict | None = None, log: Path | None = None,
            extra: list[str] | None = None, processes: Path | None = None) -> dict:
    """Run ``command`` (a pytest command line) with ``--durations=0`` and ``extra`` (arguments the record does not
    name: coverage's temporary files); its parsed output, wall time, CPU time, exit code and the load average before
    and after; with ``processes`` (an empty folder), where the CPU time went (:func:`process_totals`)."""
    rows = None
    if processes is not None:
        env, rows = _process_hook(processes, dict(os.environ if env is None else env))
    before = os.getloadavg()
    cpu = _children_cpu()
    started = time.perf_counter()
    out = subprocess.run([*command, *(extra or []), "--durations=0"], cwd=cwd, env=env, capture_output=True, text=True)
    wall = time.perf_counter() - started
    cpu = _children_cpu() - cpu
    after = os.getloadavg()
    output = out.stdout + out.stderr
    if log is not None:
        log.write_text(output, encoding="utf-8")
    parsed = parse(output)
    return {"command": shlex.join(["python" if c == sys.executable else c for c in command]),
            "exit_code": out.returncode,
            "wall_s": round(wall, 1), "cpu_s": round(cpu, 1), "pytest_s": parsed["seconds"], "counts": parsed["counts"],
            "load_average": {"before": round(before[0], 2), "after": round(after[0], 2)},
            "files": parsed["files"], "tests": parsed["tests"],
            **({"processes": process_totals(rows)} if rows is not None else {})}


def _slowest(tests: dict[str, dict[str, float]], n: int) -> list[dict]:
    ranked = sorted(tests.items(), key=lambda kv: -sum(kv[1].values()))[:n]
    return [{"test": test, "seconds": round(sum(phases.values()), 2), **phases} for test, phases in ranked]


def _passed(counts: dict) -> str:
    return ", ".join(f"{n:,} {word}" for word, n in counts.items()) or "no summary line"


def _minutes(seconds: float | None) -> str:
    return "?" if seconds is None else f"{seconds:,.0f} s ({seconds / 60:.1f} min)"


def _load(run: dict, cores) -> str:
    load = run.get("load_average")
    if not load:
        return ""
    busy = isinstance(cores, int) and max(load["before"], load["after"]) > cores
    return (f" Load average {load['before']} before, {load['after']} after"
            f"{' (above the core count: other work shared the machine)' if busy else ''}.")


def _cpu(run: dict, cores) -> str:
    if not run.get("cpu_s") or not run.get("wall_s"):
        return ""
    floor = f": at least {run['cpu_s'] / cores:,.0f} s of wall on {cores} cores" if isinstance(cores, int) else ""
    return (f" CPU time {run['cpu_s']:,.0f} s, the suite's processes and every one they started "
            f"({run['cpu_s'] / run['wall_s']:.2f} cores busy on average{floor}).")


NAMES = {"sentence_transformers": "sentence-transformers", "torch": "PyTorch", "mlflow": "MLflow", "prefect": "Prefect",
         "dvc": "DVC"}


def _processes(totals: dict | None) -> list[str]:
    if not totals:
        return []
    lines = ["", f"Where the CPU time went: {totals['count']:,} Python processes that exited normally wrote "
                 f"{totals['cpu_s']:,.0f} s (a process killed by a signal, or not a Python one, writes nothing). "
                 "A process is counted under each heavy library it imported:", ""]
    lines += table(["imported", "processes", "CPU s", "s a process"],
                   [(NAMES.get(m, m), f"{c['count']:,}", f"{c['cpu_s']:,.0f}",
                     f"{c['cpu_s'] / c['count']:.1f}" if c["count"] else "-") for m, c in totals["by_import"].items()],
                   "lrrr")
    lines += ["", "Per test file, the processes its tests started (`(none)`: pytest and its workers themselves, whose "
                  "CPU time holds the tests that run in-process):", ""]
    lines += table(["file", "processes", "CPU s"], [(f"`{name}`", f"{c['count']:,}", f"{c['cpu_s']:,.0f}")
                                                   for name, c in totals["by_file"].items()], "lrr")
    return lines


def render(record: dict) -> str:
    suite, cores = record["suite"], record["machine"].get("cores", "?")
    took = (f"{_minutes(suite['wall_s'])} from start to exit" if suite.get("wall_s") is not None else
            f"{_minutes(suite['pytest_s'])} by pytest's own clock, read from the run's log (`{suite['log']}`)")
    code = f"; exit code {suite['exit_code']}" if suite.get("exit_code") is not None else ""
    readme = suite["command"] == shlex.join(["python", *readme_command()[1:]])
    what = "the README's test command" if readme else "the README's test command with more arguments"
    lines = [f"`{suite['command']}` ({what}) on {cores} cores: {took}, against a goal of "
             f"{SUITE_GOAL_S // 60} minutes; {_passed(suite['counts'])}{code}.{_load(suite, cores)}{_cpu(suite, cores)}"]
    lines += _processes(suite.get("processes"))
    fast = record.get("fast")
    if fast:
        lines += ["", f"The fast subset `{fast['command']}`: {_minutes(fast['wall_s'])}, against a goal of "
                      f"{FAST_GOAL_S // 60} minutes; {_passed(fast['counts'])}; exit code {fast['exit_code']}."
                      f"{_load(fast, cores)}"]
    cov = record.get("coverage")
    if cov:
        lines += ["", f"The suite runs {cov['covered_lines']:,} of the {cov['statements']:,} statements of `pgrank/` "
                      f"({cov['percent']}%), in its own processes and in those it starts:", ""]
        lines += table(["package", "statements", "covered", "%"],
                       [(f"`{k}`", f"{v['statements']:,}", f"{v['covered_lines']:,}", v["percent"])
                        for k, v in cov["packages"].items()], "lrrr")
    files = sorted(suite["files"].items(), key=lambda kv: -kv[1])  # a record's keys are written sorted
    total = sum(s for _, s in files)
    lines += ["", f"The heaviest test files, setup, call and teardown of their tests summed ({len(files)} files, "
                  f"{total:,.0f} s in all over the workers):", ""]
    lines += table(["file", "s", "share"], [(f"`{name}`", f"{s:,.1f}", f"{100 * s / total:.0f}%")
                                            for name, s in files[:15]], "lrr")
    lines += ["", "The slowest tests:", ""]
    lines += table(["test", "s", "setup s", "call s"],
                   [(f"`{t['test']}`", f"{t['seconds']:,.1f}", f"{t.get('setup', 0):,.1f}", f"{t.get('call', 0):,.1f}")
                    for t in record["slowest"]], "lrrr")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    add_out_option(parser, __file__)
    parser.add_argument("--cov", action="store_true", help="also measure the lines of pgrank/ the suite runs "
                                                           "(pytest-cov; slower)")
    parser.add_argument("--processes", action="store_true", help="also record where the suite's CPU time went: each "
                                                                  "Python process it starts, by library and test file")
    parser.add_argument("--skip-fast", action="store_true", help="do not time the fast subset")
    parser.add_argument("--log", type=Path, help="keep pytest's output of the suite in this file")
    parser.add_argument("--durations-from", type=Path, metavar="LOG",
                        help="record the run whose output (with --durations=0) is in LOG instead of running the suite")
    parser.add_argument("pytest_args", nargs="*", help="more pytest arguments for both runs (after --)")
    args = parser.parse_args()
    if args.durations_from is not None and (args.processes or args.cov):
        parser.error("--processes and --cov measure a run made here, not one read from --durations-from")

    command = [*readme_command(), *args.pytest_args]
    record = new_record("The test suite's time: the README's test command, per test file, and the fast subset")
    if args.durations_from is not None:
        parsed = parse(args.durations_from.read_text(encoding="utf-8", errors="replace"))
        if not parsed["counts"] or not parsed["tests"]:
            raise SystemExit(f"bench/test_suite.py: {args.durations_from}: no summary line or no durations "
                             "(pytest --durations=0)")
        suite = {"command": shlex.join(["python", *command[1:]]), "log": args.durations_from.name, "exit_code": None,
                 "wall_s": None, "cpu_s": None, "pytest_s": parsed["seconds"], "counts": parsed["counts"], "load_average": None,
                 "files": parsed["files"], "tests": parsed["tests"]}
    else:
        suite = _run_suite(command, record, args)
    if not args.skip_fast:
        fast = measure([command[0], "-m", "pytest", *FAST, *args.pytest_args])
        record["fast"] = {k: v for k, v in fast.items() if k != "tests"}
    _finish(record, suite, args.out)


def _run_suite(command: list[str], record: dict, args: argparse.Namespace) -> dict:
    """The README's test command run here (with ``--cov``, its coverage into ``record``); its parsed output."""
    with tempfile.TemporaryDirectory(prefix="pgrank-test-suite-") as tmp:
        report = Path(tmp) / "coverage.json"
        cov = ["--cov=pgrank"] if args.cov else []
        files = [f"--cov-config={_coverage_rc(Path(tmp))}", f"--cov-report=json:{report}"] if args.cov else []
        suite = measure([*command, *cov], log=args.log, extra=files,
                        processes=Path(tmp) / "processes" if args.processes else None)
        if args.cov and report.is_file():
            record["coverage"] = coverage_totals(report)
    return suite


def _finish(record: dict, suite: dict, out: Path) -> None:
    tests = suite.pop("tests")
    record["slowest"] = _slowest(tests, 15)
    record["suite"] = suite
    record["tests"] = {t["test"]: t["seconds"] for t in _slowest(tests, len(tests))}
    save(record, out, render)


if __name__ == "__main__":
    main()
