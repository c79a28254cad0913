"""The findings page and the generated benchmarks page: the figures render from the records, the summary table's
numbers are the records', and the commands printed from records name no machine path."""

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


def _summary_rows() -> dict[str, list[str]]:
    """``{record file name: the summary table's rows naming it}`` of docs/findings.md."""
    text = (DOCS / "findings.md").read_text(encoding="utf-8")
    section = text.split("## In one table", 1)[1].split("\n## ", 1)[0]
    rows: dict[str, list[str]] = {}
    for line in section.splitlines():
        found = re.search(r"`(?:bench|studies)/out/([\w.-]+\.json)`", line)
        if line.startswith("|") and found:
            rows.setdefault(found.group(1), []).append(line)
    return rows


def _table_body(section: str) -> list[list[str]]:
    """The cells of each body row of the first Markdown table in ``section`` (its header row and rule left out)."""
    lines = section.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("| "))
    end = next((i for i in range(start, len(lines)) if not lines[i].startswith("|")), len(lines))
    return [[c.strip() for c in line.strip().strip("|").split("|")] for line in lines[start + 2:end]]


def _signed(cell: str) -> list[float]:
    """The signed four-decimal figures of a table cell, in order (``−`` read as a minus)."""
    return [float(x.replace("−", "-")) for x in re.findall(r"[−+-]\d\.\d{4}", cell)]


def _assert_changes(cell: str, entry: dict, warm: dict, dataset: str, name: str, *, every_p: bool = False) -> None:
    """A results-table cell "Δrerank [(p P)] / Δfirst [(p P)]" states, to the printed digits, the record's change of
    ``dataset`` against the warm start in both stages and the record's p against the first variant where it prints
    one; ``every_p``: it prints one exactly where the record has one."""
    figures = re.findall(r"([−+-]\d\.\d{4})(?: \(p (\d[\d.e-]*)\))?", cell)
    assert len(figures) == 2, (name, cell)
    for (delta, p), stage in zip(figures, ("rerank", "full")):
        figure = entry["test"][f"{dataset}/{stage}"]
        assert float(delta.replace("−", "-")) == pytest.approx(
            figure["mean"] - warm[f"{dataset}/{stage}"]["ndcg@10"], abs=5e-5), (name, dataset, stage)
        if every_p:
            assert (p == "") == (figure["p_first"] is None), (name, dataset, stage)
        if p:
            assert float(p) == pytest.approx(figure["p_first"], rel=0.06), (name, dataset, stage)


# --------------------------------------------------------------------------------------- figures


def test_every_figure_renders_from_its_record_as_a_png(tmp_path):
    plots = _load("plots")
    written = plots.write_all(images=tmp_path)
    assert sorted(p.name for p in written) == sorted(plots.FIGURES)
    for path in written:
        data = path.read_bytes()
        assert data.startswith(b"\x89PNG\r\n\x1a\n") and len(data) > 10_000, path
    assert plots.write_all(images=tmp_path) == []  # the same records give the same bytes: nothing rewritten


def test_the_findings_page_shows_every_figure_and_names_its_record():
    plots = _load("plots")
    text = (DOCS / "findings.md").read_text(encoding="utf-8")
    for name, record in plots.FIGURES.items():
        assert f"(img/findings/{name})" in text
        after = text.split(f"(img/findings/{name})", 1)[1].split("\n## ", 1)[0]
        assert f"`studies/out/{record}`" in after, f"the paragraph under {name} names no record {record}"
        assert (OUT / record).is_file()


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


# --------------------------------------------------------------------------------------- the summary table


def test_the_demo_rows_equal_the_record():
    record = _record("variants-demo-ood.json")
    rows = " ".join(_summary_rows()["variants-demo-ood.json"])
    demo = record["summary"]["variants"]["demo"]
    for cell in ("scifact/rerank", "nfcorpus/rerank", "nfcorpus/full", "dbpedia/rerank", "dbpedia/full"):
        test, warm = demo["test"][cell], record["warm"][cell]["ndcg@10"]
        assert f"{warm:.4f}" in rows, cell
        assert f"{test['mean']:.4f}** ± {test['sd']:.4f}" in rows or f"{test['mean']:.4f} ± {test['sd']:.4f}" in rows, cell
    scifact = demo["test"]["scifact/rerank"]
    assert f"+{scifact['mean'] - record['warm']['scifact/rerank']['ndcg@10']:.4f}" in rows
    assert f"p {scifact['p_warm']:.1e}" in rows
    assert demo["test"]["scifact/full"]["mean"] == scifact["mean"]  # "first stage: the same"
    for cell in ("nfcorpus/rerank", "nfcorpus/full", "dbpedia/rerank", "dbpedia/full"):
        assert f"p {demo['test'][cell]['p_warm']:.2f}" in rows, cell


def test_the_nfcorpus_train_row_equals_the_record():
    record = _record("variants-demo-tools-nfcorpus-train.json")
    (row,) = _summary_rows()["variants-demo-tools-nfcorpus-train.json"]
    demo = record["summary"]["variants"]["demo"]
    for cell in ("nfcorpus/train/rerank", "nfcorpus/train/full"):
        test, warm = demo["test"][cell], record["warm"][cell]["ndcg@10"]
        assert f"{warm:.4f}" in row, cell
        assert f"{test['mean']:.4f} ± {test['sd']:.4f} (p {test['p_warm']:.2f})" in row, cell


def test_the_export_row_states_the_records_largest_difference():
    sets = _record("exported_policy-demo.json")["result"]["sets"]
    (row,) = _summary_rows()["exported_policy-demo.json"]
    largest = max(abs(s["difference"]) for stages in sets.values() for s in stages.values())
    assert f"| {largest:.4f} " in row and largest <= 1e-4


def test_the_int8_row_equals_the_record():
    sets = _record("exported_policy-demo-int8.json")["result"]["sets"]
    (row,) = _summary_rows()["exported_policy-demo-int8.json"]
    signed = lambda x: f"{x:+.4f}".replace("-", "−")  # noqa: E731
    for key in ("gain_pgrank", "gain_plain"):
        cells = " / ".join(signed(sets[s]["full"][key]) for s in ("scifact/test", "nfcorpus/test", "dbpedia/test"))
        assert cells in row, (key, cells)


def test_the_objectives_row_equals_the_record():
    variants = _record("variants-compare.json")["summary"]["variants"]
    (row,) = _summary_rows()["variants-compare.json"]
    assert f"InfoNCE +{variants['infonce']['val_in']:.4f}" in row
    assert f"PG-Rank +{variants['pg']['val_in']:.4f}" in row
    best = max((v["val_in"], name) for name, v in variants.items() if name.startswith("pg"))
    assert best[1] == "pg-N1000" and f"+{best[0]:.4f}" in row and "1,000 rankings" in row


def test_the_objectives_test_row_equals_the_record():
    record = _record("variants-compare-test.json")
    variants = record["summary"]["variants"]
    (row,) = _summary_rows()["variants-compare-test.json"]
    for name, label in (("infonce", "InfoNCE"), ("pg", "PG-Rank")):
        test = variants[name]["test"]
        rerank, full = test["scifact/rerank"], test["scifact/full"]
        assert f"{label} {rerank['mean']:.4f} ± {rerank['sd']:.4f} / {full['mean']:.4f} ± {full['sd']:.4f}" in row
    p = variants["infonce"]["test"]
    assert f"p {p['scifact/rerank']['p_first']:.1e} / {p['scifact/full']['p_first']:.1e}" in row
    assert "3 seeds" in row and record["summary"]["variants"]["pg"]["seeds"] == 3


def test_the_gate_rows_equal_the_record():
    record = _record("gate_power.json")
    yearly, power = _summary_rows()["gate_power.json"]
    null = {row["rule"]: row for row in record["null"]
            if (row["test"], row["training"], row["gate_size"]) == ("student", "continual", 300)}
    assert f"{null['none']['yearly_rate']:.3f} at alpha {null['none']['level']}" in yearly
    assert f"{null['spending']['yearly_rate']:.3f} under the budget of {record['rule']['budget']}" in yearly
    assert f"({record['rule']['horizon']} decisions" in yearly
    gains = {row["rule"]: row for row in record["power"]
             if (row["test"], row["gate_size"], row["delta"]) == ("student", 300, 0.02)}
    assert f"{gains['none']['rate']:.3f} at alpha" in power and f"{gains['spending']['rate']:.3f} under" in power


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


# --------------------------------------------------------------------------------------- the results page


def test_the_results_table_of_the_tools_is_its_records():
    """docs/results.md's KL / anchor / rule table: every change against the warm start, every p against the demo,
    every validation gain and every run's seconds is the one ``studies/out/variants-demo-tools-float32.json`` holds, to
    the printed digits."""
    record = _record("variants-demo-tools-float32.json")
    warm, variants = record["warm"], record["summary"]["variants"]
    text = (DOCS / "results.md").read_text(encoding="utf-8")
    section = text.split("{ #tools }", 1)[1].split("\n### ", 1)[0]
    rows = _table_body(section)
    assert {row[0].split()[0] for row in rows} == set(variants)
    for name, *cells in rows:
        entry = variants[name.split()[0]]
        for cell, dataset in zip(cells[:3], ("scifact", "nfcorpus", "dbpedia")):
            _assert_changes(cell, entry, warm, dataset, name)
        validation = _signed(cells[3])
        assert validation == pytest.approx([entry["val_in"], entry["val_ood"]["nfcorpus/dev"],
                                            entry["val_ood"]["dbpedia/dev"]], abs=5e-5), name
        assert int(cells[4]) == round(entry["seconds"]), name


def test_the_results_table_of_nfcorpus_train_queries_is_its_record():
    """docs/results.md's table of NFCorpus's train and test queries: every change against the warm start, every p
    against the demo and every run's seconds is the one ``studies/out/variants-demo-tools-nfcorpus-train.json`` holds,
    to the printed digits."""
    record = _record("variants-demo-tools-nfcorpus-train.json")
    warm, variants = record["warm"], record["summary"]["variants"]
    text = (DOCS / "results.md").read_text(encoding="utf-8")
    section = text.split("{ #nfcorpus-train }", 1)[1].split("\n### ", 1)[0]
    rows = _table_body(section)
    assert sorted(row[0].split()[0] for row in rows) == sorted(variants)
    for name, train, test, seconds in rows:
        entry = variants[name.split()[0]]
        for cell, dataset in ((train, "nfcorpus/train"), (test, "nfcorpus")):
            _assert_changes(cell, entry, warm, dataset, name, every_p=True)
        assert int(seconds) == round(entry["seconds"]), name


def test_the_results_table_of_the_anchors_weight_is_its_record():
    """docs/results.md's table of the anchor's weight under the demo as it is: every validation gain, half-document
    change and test change against the warm start is the one ``studies/out/variants-demo-anchor-coef-float32.json``
    holds, to the printed digits."""
    record = _record("variants-demo-anchor-coef-float32.json")
    warm, variants = record["warm"], record["summary"]["variants"]
    names = {"0.3 (the demo)": "demo", "0.6": "anchor-0.6", "1": "anchor-1"}
    text = (DOCS / "results.md").read_text(encoding="utf-8")
    section = text.split("**The anchor's weight, with the demo as it is**", 1)[1].split("\n* ", 1)[0]
    rows = _table_body(section)
    assert [row[0] for row in rows] == list(names)
    for label, validation, halves, scifact, nfcorpus, dbpedia in rows:
        entry = variants[names[label]]
        ood = entry["val_ood"]
        assert _signed(validation) == pytest.approx([entry["val_in"], ood["nfcorpus/dev"], ood["dbpedia/dev"]], abs=5e-5)
        assert _signed(halves) == pytest.approx([ood["halves:scifact"], ood["halves:nfcorpus"]], abs=5e-5)
        change = {key: cell["mean"] - warm[key]["ndcg@10"] for key, cell in entry["test"].items()}
        assert _signed(scifact) == pytest.approx([change["scifact/rerank"]], abs=5e-5)
        assert _signed(nfcorpus) == pytest.approx([change["nfcorpus/rerank"], change["nfcorpus/full"]], abs=5e-5)
        assert _signed(dbpedia) == pytest.approx([change["dbpedia/rerank"], change["dbpedia/full"]], abs=5e-5)
