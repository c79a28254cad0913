"""The documentation: generated pages equal what the code generates, a short README that starts with its two
commands, no development-process language in any tracked text file, no history (revision hashes, "is now", "before
that change") in the pages, and a strict MkDocs build."""

from __future__ import annotations

import importlib.util
import re
import subprocess
import sys
from pathlib import Path

import pytest
from script_modules import load_script

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"

# The README's two commands, verbatim: .ci/run runs the line ending in "# tests", and
# tests/pipeline/test_dvc_pipeline.py the line ending in "# demo".
DEMO = "pip install torch==2.13.0 && pip install -e '.[cpu,dev]' && pgrank demo   # demo"
TESTS = "pip install torch==2.13.0 && pip install -e '.[cpu,dev]' && python -m pytest   # tests"

TEXT_SUFFIXES = {".py", ".md", ".yaml", ".yml", ".toml", ".txt", ".cfg", ".ini", ".sh", ".tex", ".csv", ".tsv", ""}
# Not prose about the project: benchmark records keep the date and load of the run they record; the check's own
# pattern and its examples name what they catch.
NOT_CHECKED = ("bench/out/", "docs/hooks.py", "tests/test_docs.py")


def _load(name: str):
    return load_script(DOCS / f"{name}.py", f"_docs_{name}")


def test_the_generated_pages_equal_what_the_code_generates():
    generate = _load("generate")
    for page, text in generate.generate().items():
        committed = (DOCS / page).read_text(encoding="utf-8")
        assert committed == text, f"docs/{page} is stale: run `python docs/generate.py`"


def test_the_generated_blocks_equal_what_their_records_give():
    """The README's headline lines, the findings map and each finding's tables, commands and machines."""
    filled = _load("generate").filled()
    assert {page.relative_to(ROOT).as_posix() for page in filled} >= {"README.md", "docs/results.md"}
    for page, text in filled.items():
        assert page.read_text(encoding="utf-8") == text, (
            f"{page.relative_to(ROOT)} is stale: run `python docs/generate.py`")


def test_the_committed_figures_are_what_their_records_draw(tmp_path):
    """Every findings image (the README's headline picture among them) is committed, byte for byte as drawn."""
    plots = _load("plots")
    plots.write_all(images=tmp_path)
    for name in plots.FIGURES:
        assert (plots.IMAGES / name).is_file(), f"docs/img/findings/{name} is not there: run `python docs/generate.py`"
        assert (plots.IMAGES / name).read_bytes() == (tmp_path / name).read_bytes(), (
            f"docs/img/findings/{name} is stale: run `python docs/generate.py`")
    ignored = subprocess.run(["git", "check-ignore", "-q", "docs/img/findings/headline.png"], cwd=ROOT)
    assert ignored.returncode == 1, "the findings images are ignored by git: they must be committed"


def test_every_configuration_key_says_what_it_means():
    rows = [line for line in _load("generate").generate()["reference/configuration.md"].splitlines()
            if line.startswith("| `")]
    cells = [[c.strip() for c in re.split(r"(?<!\\)\|", row)[1:-1]] for row in rows]
    assert len(cells) > 100 and all(len(c) == 5 for c in cells)
    undescribed = [key for key, _type, _default, meaning, _stages in cells if not meaning]
    assert not undescribed, "keys without a description (Field(description=...) in pgrank/config/):\n" + \
        "\n".join(undescribed)


@pytest.mark.parametrize("page", ["reference/configuration.md", "reference/cli.md"])
def test_generated_pages_show_no_sphinx_roles(page):
    text = _load("generate").generate()[page]
    assert not re.findall(r":(?:mod|func|class|meth|attr|data|obj):`", text)


def test_the_readme_is_short_and_starts_with_its_two_commands():
    lines = (ROOT / "README.md").read_text(encoding="utf-8").splitlines()
    assert len(lines) <= 150, f"README.md has {len(lines)} lines"
    fence = lines.index("```bash")
    assert lines[fence + 1: fence + 3] == [DEMO, TESTS]
    assert all(line.startswith("#") or not line.strip() for line in lines[:fence])  # nothing before them but the title


@pytest.mark.parametrize("text", ["I measured two", "measured 23 Nov 2026", "on the AVX2 host", "this AMX host",
                                  "an earlier session's host", "on branch fix-13", "(issue 12)", "Across hosts:"])
def test_development_process_language_is_caught(text):
    assert _load("hooks").process_language(text)


@pytest.mark.parametrize("text", ["I/O only", "my-model/pytorch_model.bin", "PID 1234 on host (since 2026-11-23)",
                                  "a Prefect session", "a session and process group of its own", "Table I"])
def test_prose_about_the_project_is_not_caught(text):
    assert not _load("hooks").process_language(text)


@pytest.mark.parametrize("text", ["fixed at `4baae99`", "since 7c99e8a the demo", "The demo now follows the rule",
                                  "the present code takes 375 s", "against the earlier demo",
                                  "The demo as committed measured 831 s",
                                  "the default is now 4", "now uses bf16", "before that change it took longer",
                                  "read back from an earlier invocation", "the policy is the same as before",
                                  "it no longer needs `--calibrate`"])
def test_history_in_a_page_is_caught(text):
    assert _load("hooks").history_language(text)


@pytest.mark.parametrize("text", ["`bench/out/demo_time-7677876.json`", "models/ab12cd34ef/weights",
                                  "```bash\npython bench/demo_time.py --rev 7015d3b\n```",
                                  "`python bench/demo_time.py --rev 7015d3b`",
                                  "sha256: 100ef6a71bac925f709fe9c114c60460bf6e472cfdb9d44bd8adf1698135260f",
                                  "gtr-t5-xl at 23a8d667a1ad2578af181ce762867003c498d1bf", "a decade of facade",
                                  "Now run `pgrank demo`.", "the known issues", "1234567 documents"])
def test_present_tense_prose_is_not_caught(text):
    assert not _load("hooks").history_language(text)


def test_no_page_tells_history():
    history_language = _load("hooks").history_language
    pages = [ROOT / "README.md", ROOT / "PAPER.md", ROOT / "flows" / "README.md", *sorted(DOCS.rglob("*.md"))]
    hits = [f"{page.relative_to(ROOT)}:{line}: {words!r}" for page in pages if page.is_file()
            for line, words in history_language(page.read_text(encoding="utf-8"))]
    assert not hits, "history in the pages (say what the project does, in the present tense):\n" + "\n".join(hits)


def test_no_tracked_text_speaks_of_how_the_project_was_developed():
    process_language = _load("hooks").process_language
    files = subprocess.run(["git", "ls-files", "-z"], cwd=ROOT, capture_output=True, text=True, check=True).stdout
    if not files:
        pytest.skip("not a git checkout: no tracked files to read")
    hits = []
    for name in files.split("\0"):
        path = ROOT / name
        if not name or name.startswith(NOT_CHECKED) or path.suffix not in TEXT_SUFFIXES or not path.is_file():
            continue
        try:
            text = path.read_text(encoding="utf-8")
        except UnicodeDecodeError:
            continue
        hits += [f"{name}:{line}: {words!r}" for line, words in process_language(text)]
    assert not hits, "development-process language:\n" + "\n".join(hits)


def test_the_site_builds_strictly(tmp_path):
    if importlib.util.find_spec("mkdocs") is None or importlib.util.find_spec("material") is None:
        pytest.skip("mkdocs-material is not installed (the dev extra installs it)")
    result = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(tmp_path / "site")],
                            cwd=ROOT, capture_output=True, text=True, env={**_env(), "NO_MKDOCS_2_WARNING": "1"})
    assert result.returncode == 0, result.stdout + result.stderr
    assert (tmp_path / "site" / "index.html").is_file()
    assert (tmp_path / "site" / "retraining" / "index.html").is_file()


def _env() -> dict[str, str]:
    import os

    return {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
