"""Every measured figure in the prose names its record under ``bench/out/`` or ``studies/out/``.

The rule for ``README.md``, ``PAPER.md`` and every page under ``docs/`` (``docs/reference/`` excepted: it is
generated from the code and states no measurement): each table, paragraph or list item that states a measured figure
names the record that holds it, as a literal path such as ``studies/out/variants-demo.json``, in the same block, or -- for
a table or a list -- in the paragraph that directly introduces it. Every ``bench/out/...`` path the prose names exists.

How a page is read (:func:`blocks`):

* Fenced code blocks (````` and ``~~~``) are commands and output, not prose: skipped, but a fence does not break the
  link between a table and the paragraph introducing it (a paragraph, its command, then the table).
* The rest splits into blocks at blank lines; a heading is a block of its own line; each list item (``*``, ``-``,
  ``+``, ``1.``) is a block with its indented continuation lines; consecutive ``|`` lines are one table block.
* A table, or a list item, may name its record in the paragraph directly before the table or the list (headings end
  that search: a heading introduces nothing).

What counts as a measured figure (:func:`figures`), after inline code spans, link targets, HTML comments and the
``bench/out/`` paths themselves are removed (a value in backticks is configuration or a command, not a measurement):

* a score: a decimal with at least three decimals (``0.732``, ``p < 0.001``) or a signed decimal (``+0.08``,
  ``−0.003``);
* a time: a number with a unit (``813 s``, ``29.11 µs``, ``17 hours``, ``2,720 GPU-hours``, ``41.9 min``);
* a rate: ``1,956 docs/s``, ``111 documents a second``;
* a size: ``59.6 GiB``, ``243 MiB``, ``16.1 GB``;
* a percentage (``87%``) or a ratio (``12.4×``, ``5x faster``);
* a count of test results (``10 passed``, ``1 skipped``, ``11 tests``, ``0 mismatches``).

Integers without a unit (counts of queries, epochs, candidates), configuration values (``1e-6``, ``0.05``) and
version numbers are not figures. A block whose figures are the paper's own cites their source instead of a record:
it names ``the paper's Table N`` (or appendix, or figure), the paper's arXiv address, or
``pgrank/reporting/published.yaml`` (where the paper's numbers are transcribed). That marker is precise on purpose:
a block that mixes the paper's numbers with measured ones still needs its record.
"""

from __future__ import annotations

import glob
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
EXEMPT = ("docs/reference/",)

RECORD = re.compile(r"(?:bench|studies)/out/[\w.*?{}\[\]-]*[\w*?}\]]")
CODE_SPAN = re.compile(r"(`+)(?:(?!\1).)+?\1", re.DOTALL)
LINK_TARGET = re.compile(r"\]\([^)\s]*\)")
COMMENT = re.compile(r"<!--.*?-->", re.DOTALL)
FENCE = re.compile(r"^\s*(```|~~~)")
ITEM = re.compile(r"^(\s*)(?:[*+-]|\d+[.)])\s+\S")
HEADING = re.compile(r"^#{1,6}\s")

NUM = r"\d(?:[\d,]*\d)?(?:\.\d+)?"
FIGURE = re.compile(rf"""
      (?<![\w.,/^-])[+−±]?\d*\.\d{{3,}}(?![\d.])                        # a score: 0.732, p < 0.001
    | (?:(?<=[\s(/])|^)[+−-]\d*\.\d+(?![\d.])                            # a signed difference: +0.08, −0.003
    | (?<![\w.,^-]){NUM}\s?(?:µs|us|ms|s|sec|seconds|min|minutes?|h|hours?|days?|GPU-hours?)(?![\w/-])  # a time
    | (?<![\w.,^-]){NUM}\s?[A-Za-z-]+/s\b                                # a rate: 1,956 docs/s
    | (?<![\w.,^-]){NUM}\s(?:documents|docs|queries|passages|texts|tokens|steps|rankings)\s(?:a|per)\s(?:second|s)\b
    | (?<![\w.,^-]){NUM}\s?[KMGTP]i?B\b(?!\s?HBM)                       # a size: 59.6 GiB (not a GPU's name)
    | (?<![\w.,^-]){NUM}\s?%                                             # a percentage
    | (?<![\w.,^-]){NUM}(?:×|x\b)                                        # a ratio: 12.4×, 5x faster
    | (?<![\w.,^-])\d+\s(?:passed|failed|skipped|tests|mismatches)\b     # a count of test results
""", re.VERBOSE)
PAPER_SOURCE = re.compile(r"\bthe paper's (?:Table|table|appendix|Figure|figure)\b|arxiv\.org/abs/2310\.04407"
                          r"|pgrank/reporting/published\.yaml")


def blocks(text: str) -> list[tuple[int, str, str]]:
    """``(first line, kind, text)`` of each block of a Markdown page, fenced code left out; kind is ``paragraph``,
    ``item``, ``table``, ``heading`` or ``code`` (a fenced block, kept as a marker, its text empty)."""
    out: list[tuple[int, str, str]] = []
    current: list[str] = []
    start, kind, fence, indent = 0, "", "", 0

    def close():
        nonlocal current
        if current:
            out.append((start, kind, "\n".join(current)))
        current = []

    for number, line in enumerate(text.splitlines(), 1):
        opened = FENCE.match(line)
        if fence:
            if opened and opened.group(1) == fence:
                fence = ""
            continue
        if opened:
            close()
            fence = opened.group(1)
            out.append((number, "code", ""))
            continue
        item = ITEM.match(line)
        if not line.strip():
            close()
        elif HEADING.match(line):
            close()
            out.append((number, "heading", line))
        elif line.lstrip().startswith("|"):
            if kind != "table" or not current:
                close()
                start, kind = number, "table"
            current.append(line)
        elif item:
            close()
            start, kind, indent = number, "item", len(item.group(1))
            current.append(line)
        else:
            if not current or kind == "table":
                close()
                start, kind = number, "paragraph"
            current.append(line)
    close()
    return out


def prose(text: str) -> str:
    """The words of a block that can state a figure: no code spans, link targets, comments or record paths."""
    for pattern in (COMMENT, CODE_SPAN, LINK_TARGET, RECORD):
        text = pattern.sub(" ", text)
    return text


def figures(text: str) -> list[str]:
    """The measured figures a block states (see the module's docstring)."""
    return [m.group(0).strip() for m in FIGURE.finditer(prose(text))]


def records(text: str) -> list[str]:
    return RECORD.findall(COMMENT.sub(" ", text))


def exists(record: str, root: Path = ROOT) -> bool:
    if any(c in record for c in "*?[{"):
        return bool(glob.glob(str(root / re.sub(r"\{[^}]*\}", "*", record))))
    return (root / record).is_file()


def untraced(text: str, root: Path = ROOT) -> list[tuple[int, str, list[str]]]:
    """``(line, block's first words, its figures)`` of every block that states a figure and names neither an existing
    record nor (for the paper's numbers) the paper's table."""
    found = []
    parts = blocks(text)
    for index, (line, kind, body) in enumerate(parts):
        stated = figures(body) if kind != "code" else []
        if not stated:
            continue
        sources = [body]
        if kind in ("table", "item"):
            sources.append(_introduction(parts, index))
        if any(exists(r, root) for s in sources for r in records(s)) or any(PAPER_SOURCE.search(s) for s in sources):
            continue
        found.append((line, " ".join(body.split())[:90], stated))
    return found


def _introduction(parts: list[tuple[int, str, str]], index: int) -> str:
    """The paragraph directly before a table or a list (over fenced code and the list's earlier items)."""
    kind = parts[index][1]
    for _, before, body in reversed(parts[:index]):
        if before == "code" or (kind == "item" and before == "item"):
            continue
        return body if before == "paragraph" else ""
    return ""


def _pages() -> list[Path]:
    pages = [ROOT / "README.md", ROOT / "PAPER.md", *sorted((ROOT / "docs").rglob("*.md"))]
    return [p for p in pages if p.is_file() and not p.relative_to(ROOT).as_posix().startswith(EXEMPT)]


def test_every_measured_figure_names_its_record():
    problems = []
    for page in _pages():
        name = page.relative_to(ROOT).as_posix()
        for line, words, stated in untraced(page.read_text(encoding="utf-8")):
            problems.append(f"{name}:{line}: {', '.join(stated[:4])} in {words!r}")
    assert not problems, ("figures without a record (name one as bench/out/NAME in the paragraph or table, or in the "
                          "paragraph introducing the table):\n" + "\n".join(problems))


def test_every_record_the_prose_names_exists():
    missing = []
    for page in [ROOT / "README.md", ROOT / "PAPER.md", *sorted((ROOT / "docs").rglob("*.md"))]:
        if not page.is_file():
            continue
        for number, line in enumerate(page.read_text(encoding="utf-8").splitlines(), 1):
            missing += [f"{page.relative_to(ROOT)}:{number}: {r}" for r in records(line) if not exists(r)]
    assert not missing, "records named but not in bench/out/ or studies/out/:\n" + "\n".join(missing)


@pytest.mark.parametrize("text, figure", [
    ("PG-Rank reaches 0.732 on scifact.", "0.732"),
    ("a gain of +0.08 over the warm start", "+0.08"),
    ("it loses −0.003 out of domain", "−0.003"),
    ("(p < 0.001)", "0.001"),
    ("the step takes 813 s", "813 s"),
    ("about 29.11 µs per document", "29.11 µs"),
    ("trains in about 17 hours", "17 hours"),
    ("about 2,720 GPU-hours in all", "2,720 GPU-hours"),
    ("it encodes 1,956 docs/s", "1,956 docs/s"),
    ("111 documents a second", "111 documents a second"),
    ("a peak of 59.6 GiB", "59.6 GiB"),
    ("bm25s' kernel is 87% of the time", "87%"),
    ("it is 12.4× faster", "12.4×"),
    ("1.21x the first", "1.21x"),
    ("about 5x faster than torch", "5x"),
    ("pytest passes 10 passed and 1 skipped", "10 passed"),
])
def test_a_measured_figure_is_caught(text, figure):
    assert figure in figures(text)


@pytest.mark.parametrize("text", [
    "`train.learning_rate: 1e-6`, temperature 0.05, entropy 0.01",
    "pip install torch==2.13.0",
    "6 epochs of batches of 220 queries, 1,000 candidates each",
    "Eq. 8 and Eq. 9; Table 2",
    "`--timeout 600s` and `0.7305`",
    "see [the record](bench/out/gpu-h100.json) and `bench/out/gpu-h100-chunk512.json`",
    "3 seeds, 4 epochs, 2 CPU cores",
    "a 64-d StaticEmbedding, a 2 x 1,000 grid, gpu-h100",
    "an NVIDIA H100 80GB HBM3; 2000 second halves; the first 8 bytes of a hash",
])
def test_a_non_measurement_is_not_caught(text):
    assert figures(text) == []


def test_a_record_in_the_block_or_the_paragraph_introducing_its_table_traces_it(tmp_path):
    (tmp_path / "bench" / "out").mkdir(parents=True)
    (tmp_path / "bench" / "out" / "x.json").write_text("{}")
    traced = ("It scores 0.732 (`bench/out/x.json`).\n\n"
              "From `bench/out/x.json`:\n\n```bash\npython bench/x.py\n```\n\n| a | b |\n| --- | --- |\n| x | 0.7 s |\n\n"
              "Record bench/out/x.json, per variant:\n\n* a: 0.732\n* b: 0.741\n\n"
              "As the paper's Table 2 prints: 0.741.\n")
    assert untraced(traced, tmp_path) == []
    assert [line for line, *_ in untraced("Intro.\n\n| a |\n| --- |\n| 0.732 |\n", tmp_path)] == [3]
    assert untraced("It scores 0.732 (`bench/out/missing.json`).\n", tmp_path)[0][2] == ["0.732"]
    # a record two paragraphs up, or above a heading, does not trace a table
    assert untraced("`bench/out/x.json`.\n\nIntro.\n\n| 0.732 |\n", tmp_path)
    assert untraced("`bench/out/x.json`:\n\n## Heading\n\n| 0.732 |\n", tmp_path)
    # a figure inside fenced code is output, not prose
    assert untraced("```\ntook 813 s\n```\n", tmp_path) == []


def test_blocks_split_paragraphs_items_tables_and_skip_code():
    text = "# T\n\npara one\ncontinued\n\n* item 1\n  more\n* item 2\n\n| a |\n| b |\n\n```\ncode 1 s\n```\nafter\n"
    assert [(line, kind) for line, kind, _ in blocks(text)] == [
        (1, "heading"), (3, "paragraph"), (6, "item"), (8, "item"), (10, "table"), (13, "code"), (16, "paragraph")]
    assert blocks(text)[2][2] == "* item 1\n  more"


def test_papers_estimator_table_states_its_records_ratios():
    """PAPER.md's estimator-variance table: each estimator's MSE relative to ``per_rank``'s at the same N, its range
    over N, is the one ``studies/out/estimator_variance.json`` gives, to the printed digits."""
    import json

    rows = json.loads((ROOT / "studies" / "out" / "estimator_variance.json").read_text(encoding="utf-8"))["rows"]
    mse = {(r["temperature"], r["N"], r["estimator"]): r["mse"] for r in rows}
    text = (ROOT / "PAPER.md").read_text(encoding="utf-8")
    table = [line for line in text.split("### Estimator variance", 1)[1].splitlines() if re.match(r"\| [\d.]+ ", line)]
    assert len(table) == len({t for t, _, _ in mse})
    for line in table:
        temperature, whole, per_rank, plrank3 = [c.strip() for c in line.strip("|").split("|")]
        t = float(temperature.split()[0])
        for cell, estimator in ((whole, "whole"), (plrank3, "plrank3")):
            ratios = [mse[(t, n, estimator)] / mse[(t, n, "per_rank")] for (tt, n, e) in mse if tt == t and e == estimator]
            assert cell == f"{min(ratios):.2f}–{max(ratios):.2f}×", (temperature, estimator, cell)
        assert per_rank == "1"
