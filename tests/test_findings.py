"""The findings' pages and the generated records pages: the figures render from the records (the README's picture
plots the record's numbers), a page's prose states only figures its generated tables print, every study opens with
its question, record and page, and the commands printed from records name no machine path."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from script_modules import load_script

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"
OUT = ROOT / "studies" / "out"  # the findings' records are studies'
PAGES = {"benchmarks": ROOT / "bench" / "out", "studies": OUT}  # each generated records page and its folder
MACHINE_PATH = re.compile(r"/tmp/|/root/|/work/|/home/|\.\./shared")


def _load(name: str):
    return load_script(DOCS / f"{name}.py", f"_docs_{name}")


def _record(name: str) -> dict:
    return json.loads((OUT / name).read_text(encoding="utf-8"))


# --------------------------------------------------------------------------------------- figures


def test_every_figure_is_a_committed_png():
    """Each figure is committed (``tests/test_docs.py`` checks that its bytes are what its record draws)."""
    plots = _load("plots")
    for name in plots.FIGURES:
        data = (plots.IMAGES / name).read_bytes()
        assert data.startswith(b"\x89PNG\r\n\x1a\n") and len(data) > 10_000, name


@pytest.mark.parametrize("name", _load("plots").FIGURES)
def test_each_figure_is_shown_on_its_page_which_names_its_record(name):
    page, record = _load("plots").FIGURES[name]
    text = (ROOT / page).read_text(encoding="utf-8")
    target = f"img/findings/{name})"
    assert target in text, f"{page} does not show {name}"
    after = text.split(target, 1)[1].split("\n## ", 1)[0]
    folder = "bench/out" if record.startswith("demo_time") else "studies/out"
    assert f"`{folder}/{record}`" in after or f"`{folder}/demo_time-*.json`" in after, (page, record)
    assert (ROOT / folder / record).is_file()


def test_the_headline_picture_plots_the_records_numbers():
    """The README's picture: per set, the warm start's and the policy's first-stage nDCG@10 (the policy's error bar
    its sd over seeds) are the record's, and BM25's the published table's."""
    plots = _load("plots")
    record = _record("variants-demo-test.json")
    fig = plots.headline_chart(record)
    (ax,) = fig.axes
    heights = [round(bar.get_height(), 10) for bar in ax.patches]
    demo = record["summary"]["variants"]["demo"]["test"]
    bm25 = plots.bm25_published()
    expected = []
    for name in ("scifact", "nfcorpus", "dbpedia"):
        expected += [record["warm"][f"{name}/full"]["ndcg@10"], demo[f"{name}/full"]["mean"]]
        expected += [bm25[name]] if name in bm25 else []
    assert heights == [round(x, 10) for x in expected]
    assert bm25 == {"scifact": 0.665, "nfcorpus": 0.325}  # the paper's appendix table, BEIR's figures
    texts = {t.get_text() for t in ax.texts}
    assert {f"{x:.3f}" for x in expected} <= texts
    assert "studies/out/variants-demo-test.json" in (ROOT / "README.md").read_text(encoding="utf-8")


def test_the_readme_shows_the_headline_picture_on_its_first_screen():
    lines = (ROOT / "README.md").read_text(encoding="utf-8").splitlines()
    picture = next(i for i, line in enumerate(lines) if "docs/img/findings/headline.png" in line)
    assert picture < 30 and lines[picture].startswith("![")


def test_the_kl_plot_shows_the_demo_as_it_is():
    """The KL plot's demo is the demo's configuration as committed (float32 documents, the anchor): its record runs
    the demo profile's `demo` variant with no override."""
    page, name = _load("plots").FIGURES["kl-tradeoff.png"]
    record = _record(name)
    demo = next(run for run in record["runs"] if run["variant"] == "demo")
    assert demo["overrides"] == [] and "--set" not in record["command"]
    assert "models.backends" not in record["command"]


def test_a_missing_or_malformed_record_is_an_error_naming_its_file(tmp_path):
    plots = _load("plots")
    with pytest.raises(FileNotFoundError, match="variants-demo-ood.json"):
        plots.read_record("variants-demo-ood.json", tmp_path)
    (tmp_path / "broken.json").write_text("{not json", encoding="utf-8")
    with pytest.raises(ValueError, match="broken.json"):
        plots.read_record("broken.json", tmp_path)
    (tmp_path / "no-runs.json").write_text('{"title": "x"}', encoding="utf-8")
    with pytest.raises(ValueError, match="runs"):
        plots.read_record("no-runs.json", tmp_path)


# --------------------------------------------------------------------------------------- the findings' pages

FINDINGS = ROOT / "docs" / "findings"
FOUR_DECIMALS = re.compile(r"(?<![\w.])[+−-]?\d\.\d{4}(?!\d)")


def _generated(text: str) -> str:
    return "\n".join(m.group(0) for m in _load("blocks").BLOCK.finditer(text))


def _prose(text: str) -> str:
    return re.sub(r"`[^`\n]+`", " ", _load("blocks").BLOCK.sub(" ", text))


def _numbers(text: str) -> set[str]:
    return {x.replace("−", "-").lstrip("+") for x in FOUR_DECIMALS.findall(text)}


# A finding's page written with its own study, checked by that study's tests.
OWN_CHECKS = ("forgetting-guard.md",)


@pytest.mark.parametrize("page", ["README.md", "docs/results.md", *sorted(
    p.relative_to(ROOT).as_posix() for p in (ROOT / "docs" / "findings").glob("*.md") if p.name not in OWN_CHECKS)])
def test_a_figure_in_a_pages_prose_is_one_its_generated_tables_print(page):
    """A finding's page states a record's figure only as its generated blocks print it: every four-decimal figure of
    its prose is one of its generated tables' (so that prose and record cannot differ)."""
    text = (ROOT / page).read_text(encoding="utf-8")
    stray = _numbers(_prose(text)) - _numbers(_generated(text))
    assert not stray, f"{page}: figures in prose that no generated table of the page prints: {sorted(stray)}"


def test_every_finding_has_a_page_with_question_answer_figure_tables_command_and_machine():
    for page in sorted(FINDINGS.glob("*.md")):
        if page.name in OWN_CHECKS:
            continue
        text = page.read_text(encoding="utf-8")
        title = text.splitlines()[0]
        assert title.startswith("# ") and title.rstrip().endswith("?"), f"{page.name}: the title asks the question"
        assert "**Answer: " in text, page.name
        assert "![" in text and "](../img/findings/" in text, page.name
        assert "<!-- generated: run-" in text, f"{page.name}: no command and machine"
        blocks = _load("blocks").BLOCK.findall(text)
        assert any(not name.startswith("run-") for _, name, _, _ in blocks), f"{page.name}: no generated table"
        assert "Machine of `" in text and "```bash" in text, page.name


def test_the_findings_map_is_short_and_links_every_finding_page():
    text = (ROOT / "docs" / "results.md").read_text(encoding="utf-8")
    assert len(text.splitlines()) <= 80
    for page in FINDINGS.glob("*.md"):
        assert f"(findings/{page.name})" in text, f"the map has no line for {page.name}"
    nav = (ROOT / "mkdocs.yml").read_text(encoding="utf-8")
    for page in FINDINGS.glob("*.md"):
        assert f"findings/{page.name}" in nav, f"mkdocs.yml's nav has no {page.name}"


def test_an_unknown_generated_block_is_an_error_naming_it():
    blocks = _load("blocks")
    with pytest.raises(KeyError, match="no-such-table"):
        blocks.fill("<!-- generated: no-such-table -->\n<!-- end generated -->")
    assert blocks.fill("a\n<!-- generated: run-gate_power -->\nstale\n<!-- end generated -->\n").count("Machine of ") == 1


def test_every_demo_time_record_says_what_each_of_its_revisions_runs():
    blocks = _load("blocks")
    for path in (ROOT / "bench" / "out").glob("demo_time*.json"):
        revisions = json.loads(path.read_text(encoding="utf-8"))["revisions"]
        assert len(blocks.CONFIGURATIONS[path.name]) == len(revisions), path.name


def test_each_demo_time_table_is_one_machines():
    text = _load("blocks").demo_time()
    tables = text.split("\n\nOn ")
    machines = [t.split(" (records", 1)[0].removeprefix("On ") for t in tables]
    assert len(machines) == len(set(machines)) >= 2


# --------------------------------------------------------------------------------------- the studies

STUDY_HEAD = re.compile(r"Question: (?P<question>.+\?)\nRecord: ``(?P<record>studies/out/[\w*.-]+\.json)``\n"
                        r"Page: ``(?P<page>[\w/.-]+\.md)``\n")


@pytest.mark.parametrize("script", sorted(p.name for p in (ROOT / "studies").glob("*.py")))
def test_every_study_opens_with_its_question_record_and_page(script):
    """Each ``studies/*.py`` docstring's first three lines: the question it answers, the record it writes (under
    ``studies/out/``) and the docs page that reports it, which exists and names the study or its record."""
    import ast

    source = (ROOT / "studies" / script).read_text(encoding="utf-8")
    doc = ast.get_docstring(ast.parse(source), clean=False) or ""
    head = STUDY_HEAD.match(doc)
    assert head, f"studies/{script}: its docstring opens with Question:, Record: and Page: lines"
    page = ROOT / head["page"]
    assert page.is_file(), head["page"]
    text = page.read_text(encoding="utf-8")
    stem = script.removesuffix(".py")
    named = {stem, head["record"].removeprefix("studies/out/").split("*")[0].split(".json")[0]}
    assert any(name in text for name in named), f"{head['page']} does not name {script} or its record"


# --------------------------------------------------------------------------------------- the benchmarks page


@pytest.mark.parametrize("page", PAGES)
def test_generated_commands_name_no_machine_path(page):
    folder = PAGES[page]
    text = getattr(_load("generate"), page)()
    commands = re.findall(r"```bash\n(.*?)\n```", text, flags=re.S)
    assert len(commands) == len(list(folder.glob("*.json")))
    for command in commands:
        assert not MACHINE_PATH.search(command), command
    for path in folder.glob("*.json"):
        if "--out" in json.loads(path.read_text(encoding="utf-8"))["command"]:
            assert f"--out {page if page == 'studies' else 'bench'}/out/{path.name}" in text


@pytest.mark.parametrize("command, expected", [
    ("python studies/variants.py --work /tmp/v42 --mirror ../shared/data/beir --out /tmp/v42/record.json",
     "python studies/variants.py --work W --mirror $PGRANK_BEIR_MIRROR --out studies/out/x.json"),
    ("python studies/forgetting.py --corpus /tmp/vd4/data/a.jsonl --policy demo=/tmp/vd4/runs/m",
     "python studies/forgetting.py --corpus W/data/a.jsonl --policy demo=W/runs/m"),
    ("python studies/variants.py --work /tmp/w --variant wise-ft: a=[0.25, 1] --variant demo: --seeds 42 43",
     "python studies/variants.py --work W --variant 'wise-ft: a=[0.25, 1]' --variant demo: --seeds 42 43"),
])
def test_a_command_is_rewritten_as_a_reader_reruns_it(command, expected):
    assert _load("generate").rerunnable(command, "x.json", "studies/out") == expected


@pytest.mark.parametrize("page", PAGES)
def test_every_records_page_section_has_its_own_title_and_names_its_record(page):
    folder = PAGES[page]
    text = re.sub(r"^```.*?^```$", "", getattr(_load("generate"), page)(), flags=re.M | re.S)  # transcripts hold "## "
    headings = re.findall(r"^## (.+?) \{ #[\w-]+ \}$", text, flags=re.M)
    assert len(headings) == len(set(headings)) == len(list(folder.glob("*.json")))
    assert not [h for h in headings if re.fullmatch(r"[\w.-]+", h)], "a raw file name as a heading"
    for section in text.split("\n## ")[1:]:
        name = re.search(r"\{ #([\w-]+) \}", section).group(1)
        assert re.search(rf"`{'studies' if page == 'studies' else 'bench'}/out/[\w.-]+\.json`", section), name


def test_records_of_one_title_are_told_apart_by_the_overrides_their_commands_ran_under():
    generate = _load("generate")
    variants = {"summary": {"variants": {"demo": {"seeds": 3}}}}
    records = {
        Path("a.json"): {**variants, "title": "T", "command": "python studies/variants.py --profile demo --variant demo:"},
        Path("b.json"): {**variants, "title": "T", "command": "python studies/variants.py --profile demo --set "
                         "'models.backends={}' --set paths.root=runs/x --variant demo:"},
        Path("c.json"): {"title": "E", "command": "python studies/exported_policy.py --profile demo --set paths.root=r"},
        Path("d.json"): {"title": "E", "command": "python studies/exported_policy.py --profile demo --set x.y=[1, 2]"},
    }
    assert generate.titles(records) == {
        Path("a.json"): "T: demo (3 seeds)", Path("b.json"): "T: demo (3 seeds) with `models.backends={}`",
        Path("c.json"): "E: the demo profile as committed", Path("d.json"): "E: with x.y=[1, 2]"}


def test_sphinx_markup_reaches_the_generated_pages_as_plain_code():
    generate = _load("generate")
    assert generate.plain_code("(:mod:`pgrank.paths`, ``flows/x.py``, :func:`~a.b`)") == "(`pgrank.paths`, `flows/x.py`, `a.b`)"
    for page, text in generate.generate().items():
        assert not re.search(r":(?:mod|func|class|meth|attr|data):`", text), page


def test_the_guard_page_compares_guards_over_one_training():
    """The forgetting-guard page sets the labelled guard (its own record) beside the label-free guards of another
    record: each seed of the two records trained alike, so that only the selection differs (the same validation figures
    at every epoch and mixture), and no guard is the labelled guard's choice at every seed."""
    blocks = _load("blocks")
    demo, guard = _record("variants-demo-ood.json"), _record("variants-demo-forgetting-guard.json")
    shared = ["val_ndcg@10", "val_nfcorpus/dev_ndcg@10", "val_dbpedia/dev_ndcg@10"]
    trained = {r["seed"]: r["history"] for r in demo["runs"]}
    for run in guard["runs"]:
        mine = [[round(row[k], 10) for k in shared] for row in run["history"]]
        assert mine == [[round(row[k], 10) for k in shared] for row in trained[run["seed"]]], (run["variant"], run["seed"])
    assert blocks.no_guard_is_the_labelled_guard(demo)
    assert {r["variant"] for r in guard["runs"]} == set(blocks.GUARDS)


def test_the_demo_record_is_the_label_free_guard_that_the_demo_profile_sets():
    """profiles/demo.yaml selects with the guard the forgetting-guard page keeps (its five sets at noise_se 2.326), and
    the demo's record (the README's headline) holds that guard's runs: at every seed the same validation history and
    the same test figures as the guard record's ``halves-guard-01``."""
    from pgrank.config import load_params

    blocks = _load("blocks")
    params = load_params(ROOT / "params.yaml", profile="demo")
    assert list(params.train.validation_sets) == blocks.GUARD_SETS
    assert params.train.selection.guard == "noise" and params.train.selection.noise_se == 2.326
    demo = _record("variants-demo-test.json")
    guard = {r["seed"]: r for r in _record("variants-demo-forgetting-guard.json")["runs"] if r["variant"] == "halves-guard-01"}
    assert sorted(r["seed"] for r in demo["runs"]) == sorted(guard) == [42, 43, 44]
    for run in demo["runs"]:
        twin = guard[run["seed"]]
        assert run["history"] == twin["history"] and (run["epoch"], run["alpha"]) == (twin["epoch"], twin["alpha"])
        assert {k: v["ndcg@10"] for k, v in run["test"].items()} == {k: v["ndcg@10"] for k, v in twin["test"].items()}
