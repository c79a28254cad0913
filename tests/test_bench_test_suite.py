"""bench/test_suite.py, the record of the suite's own time, and the order the workers take test files in.

The script's measurement runs for real here, on a small folder of tests written for the purpose (pytest in a
subprocess, as the script runs the README's command); the docs' benchmarks page renders what it records.
"""

from __future__ import annotations

import json
import sys
import textwrap
import tomllib
from pathlib import Path
from types import SimpleNamespace

import pytest
from script_modules import load_script

ROOT = Path(__file__).resolve().parents[1]
CONFTEST = load_script(ROOT / "tests" / "conftest.py", "_tests_conftest_ts")  # its functions, not its fixtures


@pytest.fixture(scope="module")
def suite():
    with pytest.MonkeyPatch.context() as mp:
        mp.syspath_prepend(str(ROOT / "bench"))
        yield load_script(ROOT / "bench" / "test_suite.py", "_bench_test_suite")


TOY = {
    "test_alpha.py": """
        import time
        import pytest

        @pytest.fixture
        def slow_setup():
            time.sleep(0.3)

        def test_waits_in_setup(slow_setup):
            pass

        def test_fails():
            assert 1 == 2

        @pytest.mark.skip(reason="not here")
        def test_skipped():
            pass
        """,
    "test_beta.py": """
        import subprocess, sys

        def test_runs_pgrank_in_a_child_process():
            assert subprocess.run([sys.executable, "-c", "import pgrank.atomic"]).returncode == 0

        def test_runs_dvc_in_a_child_process():
            assert subprocess.run([sys.executable, "-c", "import dvc"]).returncode == 0
        """,
}


def _toy(folder: Path) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    for name, text in TOY.items():
        (folder / name).write_text(textwrap.dedent(text))
    return folder


@pytest.fixture(scope="module")
def toy_run(suite, tmp_path_factory) -> dict:
    """The script's measurement of a run of :data:`TOY` (pytest in a subprocess, without xdist)."""
    folder = _toy(tmp_path_factory.mktemp("toy"))
    return suite.measure([sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-p", "no:xdist", str(folder)],
                         cwd=folder, processes=tmp_path_factory.mktemp("processes"))


def test_the_command_is_the_readmes_test_line_without_the_installs(suite):
    assert suite.readme_command() == [sys.executable, "-m", "pytest"]


def test_the_readme_names_the_fast_subset_the_record_times(suite):
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    assert f"python -m pytest {' '.join(suite.FAST)}" in readme
    assert all((ROOT / folder).is_dir() for folder in suite.FAST)


def test_a_run_is_measured_per_test_and_per_file_with_its_counts(toy_run):
    run = toy_run
    assert run["exit_code"] == 1  # the failing test
    assert run["counts"] == {"failed": 1, "passed": 3, "skipped": 1}
    assert run["wall_s"] >= run["pytest_s"] > 0.3
    setup = run["tests"]["test_alpha.py::test_waits_in_setup"]["setup"]
    assert setup >= 0.3
    assert set(run["files"]) == {"test_alpha.py", "test_beta.py"}
    assert list(run["files"].values()) == sorted(run["files"].values(), reverse=True)  # the heaviest first
    assert run["files"]["test_alpha.py"] == pytest.approx(sum(sum(p.values()) for t, p in run["tests"].items()
                                                              if t.startswith("test_alpha.py")), abs=0.02)
    assert set(run["load_average"]) == {"before", "after"}


def test_the_cpu_time_is_the_runs_and_each_python_process_it_starts_says_what_it_imported(toy_run):
    run = toy_run
    totals = run["processes"]
    assert totals["count"] == 3  # pytest itself and the two children
    assert totals["by_file"]["test_beta.py"]["count"] == 2 and totals["by_file"]["(none)"]["count"] == 1
    assert totals["by_import"]["dvc"]["count"] == 1  # the one child that imported it
    assert totals["by_import"]["sentence_transformers"] == {"count": 0, "cpu_s": 0}
    assert 0 < totals["cpu_s"] <= run["cpu_s"] + 0.05  # what the processes wrote is part of what the run used


def test_coverage_counts_the_lines_a_child_process_runs(suite, tmp_path):
    """Only a child process imports pgrank here: its lines are counted all the same (coverage's patch = subprocess)."""
    pytest.importorskip("pytest_cov", reason="pytest-cov (the dev extra) not installed")
    folder = _toy(tmp_path / "toy")
    report = tmp_path / "coverage.json"
    rc = suite._coverage_rc(tmp_path)
    run = suite.measure([sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-p", "no:xdist", str(folder),
                         "-k", "pgrank_in_a_child", f"--cov-config={rc}", "--cov=pgrank", f"--cov-report=json:{report}"],
                        cwd=folder)
    assert run["exit_code"] == 0 and run["counts"]["passed"] == 1, run
    totals = suite.coverage_totals(report)
    atomic = totals["packages"]["(top level)"]
    assert 0 < atomic["covered_lines"] <= atomic["statements"] <= totals["statements"]
    assert totals["statements"] > 1000  # every module of pgrank/, run or not (source = pgrank)


def test_the_benchmarks_page_renders_the_record(suite, toy_run, tmp_path):
    run = dict(toy_run)
    tests = run.pop("tests")
    record = {"command": "python bench/test_suite.py --out F", "title": "The test suite's time",
              "machine": load_script(ROOT / "bench" / "record.py", "_bench_record_ts").machine_record(),
              "suite": run, "fast": dict(run), "slowest": suite._slowest(tests, 15),
              "coverage": {"statements": 10, "covered_lines": 5, "percent": 50.0,
                           "packages": {"core": {"statements": 10, "covered_lines": 5, "percent": 50.0}}}}
    rendered = suite.render(record)
    assert "| `test_alpha.py` |" in rendered and "`test_alpha.py::test_waits_in_setup`" in rendered
    assert "1 failed, 3 passed, 1 skipped" in rendered and "5 of the 10 statements" in rendered
    assert "cores busy on average" in rendered and "| DVC | 1 |" in rendered  # the CPU time, and where it went
    out = tmp_path / "out"
    out.mkdir()
    (out / "test_suite.json").write_text(json.dumps(record, sort_keys=True))  # as bench/record.py writes it
    with pytest.MonkeyPatch.context() as mp:
        mp.syspath_prepend(str(ROOT / "bench"))
        generate = load_script(ROOT / "docs" / "generate.py", "_docs_generate_ts")
        page = generate.benchmarks(out)
    section = page.split("## The test suite's time", 1)[1]
    assert "`bench/out/test_suite.json`" in section
    assert all(line in section for line in rendered.splitlines() if line.startswith("|"))
    files = [line.split(" | ") for line in section.splitlines() if line.startswith("| `test_") and ".py` |" in line]
    seconds = [float(cells[1]) for cells in files if "::" not in cells[0] and cells[-1].endswith("% |")]  # durations
    assert len(seconds) == 2 and seconds == sorted(seconds, reverse=True)  # the heaviest file first


def test_workers_take_the_heaviest_files_first_and_keep_each_files_order(tmp_path):
    names = ["tests/a.py::x", "tests/a.py::y", "tests/b.py::x", "tests/c.py::x", "tests/c.py::y", "tests/d.py::x"]
    items = [SimpleNamespace(nodeid=n) for n in names]
    ordered = CONFTEST.heaviest_files_first(items, {"tests/c.py": 300.0, "tests/a.py": 5.0})
    assert [i.nodeid for i in ordered] == ["tests/c.py::x", "tests/c.py::y", "tests/a.py::x", "tests/a.py::y",
                                           "tests/b.py::x", "tests/d.py::x"]  # unknown files keep their order, last
    record = tmp_path / "test_suite.json"
    record.write_text(json.dumps({"suite": {"files": {"tests/c.py": 300.0}}}))
    assert CONFTEST.file_seconds(record) == {"tests/c.py": 300.0}
    assert CONFTEST.file_seconds(tmp_path / "none.json") == {}


def test_the_default_run_hands_files_out_in_the_order_the_workers_collected_them():
    """pyproject's addopts: whole files, in collection order (xdist would otherwise reorder by test count)."""
    addopts = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["pytest"]["ini_options"]["addopts"].split()
    assert {"--dist", "loadfile", "--no-loadscope-reorder"} <= set(addopts)
