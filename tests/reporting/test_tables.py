"""``pgrank tables``: golden Markdown/LaTeX, the marking rules on specific cells, the paper's numbers.

The synthetic results set (:func:`write_project`) is small and hand-made so that each rule has a cell
that shows it. Goldens live in ``tests/golden/tables/``; after an intended change of the output,
regenerate them with ``PGRANK_UPDATE_GOLDEN=1 python -m pytest tests/reporting/test_tables.py`` and review the diff.
The LaTeX compile test runs where ``pdflatex`` is installed (CI does not install TeX: skipped there).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from pgrank.config import load_params
from pgrank.errors import PgrankError
from pgrank.paths import Paths
from pgrank.reporting.result_files import collect_results, load_published
from pgrank.reporting.setup_tables import collect_statistics
from pgrank.reporting.tables import (
    SCORE_TABLES,
    TABLE_NAMES,
    build_tables,
    domains,
    make_tables,
    needed_systems,
    rank_marks,
    score_cell,
)

ROOT = Path(__file__).resolve().parents[2]
GOLDEN = ROOT / "tests" / "golden" / "tables"
PAPER = Path(__file__).resolve().parents[3] / "shared" / "paper" / "policy-gradient-ranking.tex"
UPDATE = os.environ.get("PGRANK_UPDATE_GOLDEN") == "1"

OVERRIDES = [
    "paths.root=runs", "paths.data=data", "paths.embeddings=emb",
    "data.eval_sets=[msmarco/dev, msmarco/test, scifact/test, nfcorpus/test]",
    "evaluate.systems={bm25: [bm25], dense: [sbert], sparse: [splade-v2]}", "evaluate.policy_epochs=[2]",
    "train.warm_starts=[sbert]",
]
SIG = {"baseline": "sbert", "test": "student", "alpha": 0.05}
# (system, eval set, stage) -> (metrics, significant metrics)
RESULTS = {
    # MS MARCO dev rerank: PG-Rank best, significant and above SBERT; SPLADEv2 second; BM25 not computed.
    ("sbert", "msmarco/dev", "rerank"): ({"ndcg@10": 0.8904, "ndcg@5": 0.88, "ndcg@3": 0.87, "ndcg@1": 0.82}, []),
    ("splade-v2", "msmarco/dev", "rerank"): ({"ndcg@10": 0.9, "ndcg@5": 0.89, "ndcg@3": 0.88, "ndcg@1": 0.83}, []),
    ("pgrank-sbert", "msmarco/dev", "rerank"): ({"ndcg@10": 0.98, "ndcg@5": 0.979, "ndcg@3": 0.97, "ndcg@1": 0.96},
                                                ["ndcg@10", "ndcg@1"]),
    ("pgrank-sbert@2", "msmarco/dev", "rerank"): ({"ndcg@10": 0.95}, ["ndcg@10"]),
    # TREC-DL 2019 rerank: a tie for the best (both bold), PG-Rank second and below its warm start.
    ("sbert", "msmarco/test", "rerank"): ({"ndcg@10": 0.743}, []),
    ("splade-v2", "msmarco/test", "rerank"): ({"ndcg@10": 0.7431}, []),
    ("pgrank-sbert", "msmarco/test", "rerank"): ({"ndcg@10": 0.7}, []),
    # SciFact: every ablation column, for the average.
    ("sbert", "scifact/test", "rerank"): ({"ndcg@10": 0.6}, []),
    ("pgrank-sbert@2", "scifact/test", "rerank"): ({"ndcg@10": 0.5}, []),
    ("pgrank-sbert", "scifact/test", "rerank"): ({"ndcg@10": 0.4}, []),
    # Full retrieval: equal once printed (0.300), so a tie and no gain; BM25 equal to the paper; NFCorpus:
    # one number in the row (no marks).
    ("bm25", "msmarco/dev", "full"): ({"ndcg@10": 0.2284}, []),
    ("sbert", "msmarco/dev", "full"): ({"ndcg@10": 0.3001}, []),
    ("pgrank-sbert", "msmarco/dev", "full"): ({"ndcg@10": 0.3004}, ["ndcg@10"]),
    ("bm25", "nfcorpus/test", "full"): ({"ndcg@10": 0.3251}, []),
}


def write_metrics(paths: Paths, system: str, eval_set: str, stage: str, metrics: dict, significant: list[str]) -> None:
    dataset, split = eval_set.split("/")
    folder = paths.results(system, dataset, split, stage)
    folder.mkdir(parents=True, exist_ok=True)
    significance = None
    if system.startswith("pgrank-"):
        significance = {**SIG, "p_values": {k: 0.01 if k in significant else 0.5 for k in metrics},
                        "significant": {k: k in significant for k in metrics}}
    doc = {"system": system, "model": system, "epoch": None, "dataset": dataset, "split": split, "stage": stage,
           "queries": 3, "metrics": {**metrics, "mrr@10": 0.5, "recall@100": 0.9}, "significance": significance}
    (folder / "metrics.json").write_text(json.dumps(doc))


def write_beir(folder: Path, qrels: list[tuple[str, str, int]], documents: int) -> None:
    (folder / "qrels").mkdir(parents=True)
    (folder / "corpus.jsonl").write_text("".join(json.dumps({"_id": f"d{i}", "title": "", "text": f"doc {i}"}) + "\n"
                                                 for i in range(documents)))
    queries = sorted({q for q, _, _ in qrels} | {"q-other"})
    (folder / "queries.jsonl").write_text("".join(json.dumps({"_id": q, "text": f"query {q}"}) + "\n" for q in queries))
    lines = ["query-id\tcorpus-id\tscore", *(f"{q}\t{d}\t{s}" for q, d, s in qrels)]
    (folder / "qrels" / "test.tsv").write_text("\r\n".join(lines) + "\r\n")


def write_project(base: Path, *extra: str):
    """The synthetic project: params, metrics files, two tiny BEIR folders, a training curve."""
    params = load_params(ROOT / "params.yaml", overrides=[*OVERRIDES, *extra])
    paths = Paths.from_config(params.paths, base=base)
    for (system, eval_set, stage), (metrics, significant) in RESULTS.items():
        write_metrics(paths, system, eval_set, stage, metrics, significant)
    write_beir(paths.dataset("scifact"), [("q1", "d0", 1), ("q1", "d1", 1), ("q2", "d2", 1)], documents=5)
    write_beir(paths.dataset("nfcorpus"), [("q1", "d0", 2), ("q1", "d1", 1), ("q1", "d2", 0), ("q2", "d2", 1)], documents=4)
    log_dir = paths.training_log("sbert")
    log_dir.mkdir(parents=True)
    (log_dir / "curve.csv").write_text("step,epoch,loss,utility,grad_norm,entropy\n"
                                         + "".join(f"{s},{1 + s // 5},{1 / s:.4f},{s / 20:.4f},0.5,{2 - s / 10:.4f}\n"
                                                   for s in range(1, 13)))
    (log_dir / "history.json").write_text(json.dumps([{"epoch": e, "val_ndcg@10": 0.5 + e / 20} for e in range(4)]))
    return params, paths


def tables_of(params, paths) -> dict:
    results = collect_results(paths, needed_systems(params), list(params.data.eval_sets))
    built = build_tables(params, results, collect_statistics(params, paths), load_published())
    return {t.name: t for t in built}


def cell(table, row_label: str, column: str):
    row = next(r for r in table.rows if r.label.startswith(row_label))
    return row.cells[[c.key for c in table.columns].index(column)]


@pytest.fixture
def project(tmp_path):
    return write_project(tmp_path, "tables.formats=[md, tex]")


# --------------------------------------------------------------------------------------- golden


def test_markdown_and_latex_match_the_golden_files(project):
    params, paths = project
    written = make_tables(params, paths)
    names = sorted(p.name for p in written)
    assert names == sorted([*(f"{n}.md" for n in TABLE_NAMES), *(f"{n}.tex" for n in TABLE_NAMES),
                            "tables.md", "tables.tex"])
    if UPDATE:
        shutil.rmtree(GOLDEN, ignore_errors=True)
        GOLDEN.mkdir(parents=True)
        for path in written:
            shutil.copyfile(path, GOLDEN / path.name)
    assert sorted(p.name for p in GOLDEN.iterdir()) == names, "set PGRANK_UPDATE_GOLDEN=1 to regenerate"
    for path in written:
        assert path.read_text(encoding="utf-8") == (GOLDEN / path.name).read_text(encoding="utf-8"), (
            f"{path.name} differs from {GOLDEN / path.name}; if intended, regenerate with PGRANK_UPDATE_GOLDEN=1")


@pytest.mark.skipif(shutil.which("pdflatex") is None,
                    reason="pdflatex not installed (CI installs no TeX; apt-get install texlive-latex-recommended)")
def test_latex_compiles(project, tmp_path):
    params, paths = project
    make_tables(params, paths)
    out = subprocess.run(["pdflatex", "-interaction=nonstopmode", "-halt-on-error", "tables.tex"],
                         cwd=paths.tables, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stdout[-3000:]
    assert (paths.tables / "tables.pdf").stat().st_size > 0
    assert "Overfull \\hbox" not in (paths.tables / "tables.log").read_text(errors="replace")


# --------------------------------------------------------------------------------------- rules


def test_best_second_gain_significance_and_dashes(project):
    params, paths = project
    tables = tables_of(params, paths)
    ood, ind = tables["rerank-out-of-domain"], tables["rerank-in-domain"]
    # In-domain: PG-Rank best, significant, above SBERT; SPLADEv2 second; BM25 left out, as in the paper.
    assert "bm25" not in [c.key for c in ind.columns]
    pg = cell(ind, "MS MARCO dev", "pgrank-sbert")
    assert (pg.ours, pg.paper, pg.delta, pg.best, pg.gain, pg.significant) == ("0.980", "0.987", "−0.007", 1, True, True)
    assert cell(ind, "MS MARCO dev", "splade-v2").best == 2
    assert (cell(ind, "MS MARCO dev", "sbert").best, cell(ind, "MS MARCO dev", "sbert").gain) == (0, False)
    # A tie for the best after rounding: both bold; PG-Rank second, below its warm start, no gain.
    assert [cell(ood, "TREC-DL 2019", s).best for s in ("sbert", "splade-v2", "pgrank-sbert")] == [1, 1, 2]
    assert cell(ood, "TREC-DL 2019", "sbert").delta == "±0.000"
    assert not cell(ood, "TREC-DL 2019", "pgrank-sbert").gain
    # Nothing computed: "—", and the paper's number stays; one number in a row: no marks.
    assert cell(ood, "NFCorpus", "sbert").ours is None and cell(ood, "NFCorpus", "sbert").paper == "0.308"
    assert cell(tables["full-out-of-domain"], "NFCorpus", "bm25").best == 0
    # Printed equal (0.300 vs 0.300): a tie, and no gain though the raw value is higher.
    full = tables["full-in-domain"]
    assert [cell(full, "MS MARCO dev", s).best for s in ("bm25", "sbert", "pgrank-sbert")] == [2, 1, 1]
    assert not cell(full, "MS MARCO dev", "pgrank-sbert").gain
    assert cell(full, "MS MARCO dev", "pgrank-sbert").significant

    make_tables(params, paths)
    md = (paths.tables / "rerank-in-domain.md").read_text()
    assert ("| MS MARCO dev | 0.890 (0.892, −0.002) | <u>0.900</u> (0.900, ±0.000) "
            "| **0.980**† ▲ (0.987, −0.007) |") in md
    tex = (paths.tables / "rerank-in-domain.tex").read_text()
    assert r"\cellcolor{lightgreen}\textbf{0.980}$^\dagger$ {\scriptsize (0.987, $-$0.007)}" in tex
    assert r"\underline{0.900} {\scriptsize (0.900, $\pm$0.000)}" in tex
    nfcorpus = next(line for line in (paths.tables / "rerank-out-of-domain.md").read_text().splitlines()
                    if line.startswith("| NFCorpus"))
    assert nfcorpus == "| NFCorpus | — (0.308) | — (0.341) | — (0.249) |"  # "—", never 0


def test_bm25_in_the_rerank_tables_is_omitted_or_context_outside_the_marks(tmp_path):
    best_bm25 = {"ndcg@10": 0.999, "ndcg@5": 0.999, "ndcg@3": 0.999, "ndcg@1": 0.999}
    for mode in ("omit", "context"):
        params, paths = write_project(tmp_path / mode, "tables.formats=[md]", f"tables.rerank_bm25={mode}")
        write_metrics(paths, "bm25", "msmarco/dev", "rerank", best_bm25, [])
        tables = tables_of(params, paths)
        columns = [c.key for c in tables["rerank-in-domain"].columns]
        assert ("bm25" in columns) == (mode == "context")
        assert "bm25" in [c.key for c in tables["full-in-domain"].columns]  # first stage: a system like any other
        if mode == "context":
            assert tables["rerank-in-domain"].columns[columns.index("bm25")].title == "BM25 (context)"
            bm25 = cell(tables["rerank-in-domain"], "MS MARCO dev", "bm25")
            assert bm25.ours == "0.999" and bm25.best == 0  # the highest number, yet no mark
        # the marks are the same as without BM25: PG-Rank best, SPLADEv2 second
        assert cell(tables["rerank-in-domain"], "MS MARCO dev", "pgrank-sbert").best == 1
        assert cell(tables["rerank-in-domain"], "MS MARCO dev", "splade-v2").best == 2


def test_in_domain_rows_are_marked_in_tables_of_every_eval_set(project):
    params, paths = project
    tables = tables_of(params, paths)
    assert [r.in_domain for r in tables["rerank-ndcg1"].rows] == [True, False, False, False]
    assert not any(r.in_domain for r in tables["rerank-in-domain"].rows)  # its title says it
    assert cell(tables["rerank-ndcg1"], "MS MARCO dev", "pgrank-sbert").significant
    assert not cell(tables["rerank-ndcg5"], "MS MARCO dev", "pgrank-sbert").significant


def test_ablation_columns_and_average(project):
    params, paths = project
    table = tables_of(params, paths)["epoch-ablation"]
    assert [c.key for c in table.columns] == ["sbert", "pgrank-sbert@2", "pgrank-sbert"]
    at2 = cell(table, "MS MARCO dev", "pgrank-sbert@2")
    assert (at2.ours, at2.paper, at2.gain, at2.significant, at2.best) == ("0.950", "0.982", True, True, 2)
    # Averages over the out-of-domain sets where every column was computed: SciFact only. The paper
    # averages over its 14 sets, so its number is not set beside ours.
    avg = table.rows[-1]
    assert avg.label == "Avg. on other BEIR datasets (n = 1)"
    assert [(c.ours, c.paper) for c in avg.cells] == [("0.600", None), ("0.500", None), ("0.400", None)]


def test_average_shows_the_paper_number_on_the_papers_sets(tmp_path):
    params = load_params(ROOT / "params.yaml", overrides=["paths.root=runs", "tables.formats=[md]"])
    paths = Paths.from_config(params.paths, base=tmp_path)
    _, outside = domains(params)
    for eval_set in outside:
        for system in ("sbert", "pgrank-sbert@2", "pgrank-sbert", "tas-b", "pgrank-tas-b@2", "pgrank-tas-b"):
            write_metrics(paths, system, eval_set, "rerank", {"ndcg@10": 0.5}, [])
    avg = tables_of(params, paths)["epoch-ablation"].rows[-1]
    assert avg.label.endswith("(n = 14)")
    assert [c.paper for c in avg.cells] == ["0.579", "0.546", "0.539", "0.582", "0.573", "0.553"]


def test_rank_marks_and_score_cell():
    assert rank_marks([0.5, 0.7, None, 0.7, 0.6]) == [0, 1, 0, 1, 2]
    assert rank_marks([0.5, None]) == [0, 0]
    assert rank_marks([0.5, 0.5]) == [1, 1]
    assert score_cell(0.75, 0.742, warm=0.75).delta == "+0.008" and not score_cell(0.75, 0.742, warm=0.75).gain
    assert score_cell(None, 0.742, significant=True) == score_cell(None, 0.742)  # no mark without a number
    assert score_cell(0.1234, None, decimals=4).ours == "0.1234"


def test_domains_follow_params(tmp_path):
    paper = load_params(ROOT / "params.yaml")
    inside, outside = domains(paper)
    assert inside == ["msmarco/dev"] and outside[0] == "msmarco/test" and len(outside) == 14
    demo = load_params(ROOT / "params.yaml", profile="demo")
    assert domains(demo) == (["scifact/test"], ["nfcorpus/test", "dbpedia/test"])  # no scifact/dev: the training dataset's eval sets


# --------------------------------------------------------------------------------------- appendix


def test_dataset_statistics_are_computed_from_the_data(project):
    params, paths = project
    table = tables_of(params, paths)["dataset-statistics"]
    scifact = [(c.ours, c.paper) for c in next(r for r in table.rows if r.label == "SciFact").cells]
    assert scifact == [("scientific", None), ("2", "300"), ("5", "5.2k"), ("1.5", "1.1"), ("binary", "binary")]
    nfcorpus = [(c.ours, c.paper) for c in next(r for r in table.rows if r.label == "NFCorpus").cells]
    assert nfcorpus[1:] == [("2", "323"), ("4", "3.6k"), ("1.5", "38.2"), ("3-level", "3-level")]
    msmarco = [(c.ours, c.paper) for c in next(r for r in table.rows if r.label == "MS MARCO dev").cells]
    assert msmarco[1:] == [(None, "6,980"), (None, "8.8M"), (None, "1.1"), (None, "binary")]  # not downloaded


def test_hyperparameters_come_from_params(tmp_path):
    params, paths = write_project(tmp_path, "train.epochs=4", "train.keep_epochs=[0, 2, 4]", "train.pg.temperature=0.1")
    rows = {r.label: (r.cells[0].ours, r.cells[1].ours) for r in tables_of(params, paths)["hyperparameters"].rows}
    assert rows["epochs"] == ("4", "6")
    assert rows["softmax temperature"] == ("0.1", "0.05")
    assert rows["learning rate"] == ("1e-6", "1e-6")
    assert rows["model (warm starts)"] == ("SBERT", "SBERT, TAS-B")
    assert rows["utility"] == ("ndcg@10", None)


# --------------------------------------------------------------------------------------- outputs


def test_output_is_deterministic_with_pngs(tmp_path):
    outputs = []
    for name in ("one", "two"):
        params, paths = write_project(tmp_path / name)
        written = make_tables(params, paths)
        outputs.append({p.name: p.read_bytes() for p in written})
    assert outputs[0] == outputs[1]  # byte-identical, PNGs included, from two different folders
    files = outputs[0]
    for name in ("bars-rerank.png", "bars-full.png", "curve-sbert.png"):
        assert files[name].startswith(b"\x89PNG\r\n\x1a\n") and len(files[name]) > 5000
    text = b"".join(data for name, data in files.items() if not name.endswith(".png"))
    assert str(tmp_path).encode() not in text
    assert b"![bars-rerank.png](bars-rerank.png)" in files["tables.md"]


def test_formats_and_stale_files(tmp_path):
    params, paths = write_project(tmp_path, "tables.formats=[md]")
    paths.tables.mkdir(parents=True)
    (paths.tables / "old-table.md").write_text("stale")
    written = make_tables(params, paths)
    assert all(p.suffix == ".md" for p in written)
    assert sorted(p.name for p in paths.tables.iterdir()) == sorted(p.name for p in written)


def test_demo_profile_gets_small_tables_with_dashes(tmp_path):
    params = load_params(ROOT / "params.yaml", profile="demo", overrides=["paths.root=runs", "tables.formats=[md]"])
    paths = Paths.from_config(params.paths, base=tmp_path)
    write_metrics(paths, "bm25", "scifact/test", "full", {"ndcg@10": 0.6652}, [])
    write_metrics(paths, "minilm", "scifact/test", "rerank", {"ndcg@10": 0.61}, [])
    write_metrics(paths, "pgrank-minilm", "scifact/test", "rerank", {"ndcg@10": 0.65}, ["ndcg@10"])
    make_tables(params, paths)
    rerank = (paths.tables / "rerank-in-domain.md").read_text()
    assert "| SciFact | — | <u>0.610</u> (—) | **0.650**† ▲ (—) |" in rerank
    assert "| SciFact | 0.665 (0.665, ±0.000) | — | — |" in (paths.tables / "full-in-domain.md").read_text()
    # nfcorpus/test, the demo's out-of-domain set, not evaluated yet: its rows are there, with dashes
    assert "| NFCorpus | — | — | — |" in (paths.tables / "rerank-out-of-domain.md").read_text()
    assert "| NFCorpus | — (0.325) | — | — |" in (paths.tables / "full-out-of-domain.md").read_text()


def test_a_malformed_metrics_file_is_named(project):
    params, paths = project
    bad = paths.results("sbert", "scifact", "test", "rerank") / "metrics.json"
    bad.write_text('{"metrics": {"ndcg@10": "high"}}')
    with pytest.raises(PgrankError, match=re.escape(str(bad)) + ".*metrics.ndcg@10: expected a number"):
        make_tables(params, paths)
    bad.write_text("{not json")
    with pytest.raises(PgrankError, match="not valid JSON"):
        make_tables(params, paths)
    assert not paths.tables.exists()  # nothing half-written


def test_cli_prints_the_main_tables(project, tmp_path):
    from typer.testing import CliRunner

    from cli import app

    params, paths = project
    params_file = tmp_path / "params.yaml"
    shutil.copyfile(ROOT / "params.yaml", params_file)
    args = [f"--set={o}" for o in [*OVERRIDES, "tables.formats=[md]"]]
    out = CliRunner().invoke(app, ["--params", str(params_file), *args, "tables"])
    assert out.exit_code == 0, out.output
    assert "## Second-stage reranking: nDCG@10, in-domain" in out.output
    assert "**0.980**† ▲ (0.987, −0.007)" in out.output
    assert f"-> {paths.tables / 'tables.md'}" in out.output


# --------------------------------------------------------------------------------------- the paper


def paper_rows(tex: str, label: str) -> dict[str, list[str]]:
    """Rows of the paper's table ``label``: first cell (daggers dropped) -> the other cells, stripped of markup."""
    end = tex.index(r"\label{" + label + "}")
    start = tex.rindex(r"\midrule", 0, end)
    body = tex[start + len(r"\midrule"): tex.index(r"\bottomrule", start)]
    rows = {}
    for line in body.strip().splitlines():
        cells = [re.sub(r"\\(cellcolor\{\w+\}|textbf|underline)|[{}]", "", c).strip()
                 for c in line.strip().rstrip("\\").split("&")]
        rows[cells[0].replace("$^\\ddagger$", "").strip()] = [c for c in cells[1:] if c]
    return rows


@pytest.fixture(scope="module")
def paper_tex() -> str:
    if not PAPER.is_file():
        pytest.skip(f"paper source not found at {PAPER}")
    return PAPER.read_text(encoding="utf-8")


NAMES = {"MS MARCO dev": "msmarco/dev", "TREC-DL 2019": "msmarco/test", "TREC-COVID": "trec-covid/test",
         "NFCorpus": "nfcorpus/test", "NQ": "nq/test", "HotpotQA": "hotpotqa/test", "FiQA-2018": "fiqa/test",
         "ArguAna": "arguana/test", "Touché-2020": "webis-touche2020/test", "Quora": "quora/test",
         "DBPedia": "dbpedia-entity/test", "SCIDOCS": "scidocs/test", "FEVER": "fever/test",
         "Climate-FEVER": "climate-fever/test", "SciFact": "scifact/test"}
RERANK = ["sbert", "tas-b", "splade-v2", "pgrank-sbert", "pgrank-tas-b"]
FULL = ["bm25", *RERANK]


def test_published_yaml_is_package_data_with_every_table():
    published = load_published()
    assert set(published) == set(TABLE_NAMES)
    for spec in SCORE_TABLES:
        assert set(published[spec.name]) <= set(NAMES.values())
        for values in published[spec.name].values():
            assert set(values) <= set(FULL) and all(0 < v < 1 for v in values.values())


def test_every_out_of_domain_rerank_number_matches_the_paper(paper_tex):
    published = load_published()["rerank-out-of-domain"]
    rows = paper_rows(paper_tex, "tab:eval_rerank_out-of-domain")
    assert len(rows) == 14 == len(published)
    for name, cells in rows.items():
        assert [f"{published[NAMES[name]][s]:.3f}" for s in RERANK] == cells, name


@pytest.mark.parametrize("table,label,systems,samples", [
    ("rerank-in-domain", "tab:eval_rerank_in-domain", RERANK, ["MS MARCO dev"]),
    ("full-in-domain", "tab:eval_full_in-domain", FULL, ["MS MARCO dev"]),
    ("rerank-ndcg5", "tab:eval_rerank_ndcg5", RERANK, ["MS MARCO dev", "Touché-2020", "Climate-FEVER", "SciFact"]),
    ("rerank-ndcg3", "tab:eval_rerank_ndcg3", RERANK, ["TREC-DL 2019", "DBPedia", "Quora"]),
    ("rerank-ndcg1", "tab:eval_rerank_ndcg1", RERANK, ["MS MARCO dev", "HotpotQA", "ArguAna", "FEVER"]),
    ("full-out-of-domain", "tab:eval_full", FULL, ["TREC-DL 2019", "ArguAna", "SCIDOCS", "Climate-FEVER", "SciFact"]),
])
def test_sampled_score_cells_match_the_paper(paper_tex, table, label, systems, samples):
    published, rows = load_published()[table], paper_rows(paper_tex, label)
    assert len(published) == len(rows)
    for name in samples:
        assert [f"{published[NAMES[name]][s]:.3f}" for s in systems] == rows[name], name


def test_appendix_cells_match_the_paper(paper_tex):
    published = load_published()
    ablation = paper_rows(paper_tex, "tab:eval_rerank_epoch_comparison")
    for row, key in (("MS MARCO dev", "msmarco/dev"), ("Avg. on other BEIR datasets", "avg-other")):
        numbers = re.findall(r"\d\.\d{3}", " ".join(ablation[row]))
        values = published["epoch-ablation"][key]
        order = ["sbert", "pgrank-sbert@2", "pgrank-sbert", "tas-b", "pgrank-tas-b@2", "pgrank-tas-b"]
        assert [f"{values[s]:.3f}" for s in order] == numbers
    stats = paper_rows(paper_tex, "tab:data_stats")
    for name in ("MS MARCO dev", "TREC-COVID", "Touché-2020", "Quora", "SCIDOCS"):
        domain, queries, documents, relevant, annotation = stats[name]
        ours = published["dataset-statistics"][NAMES[name]]
        assert (ours["domain"], f"{ours['queries']:,}", ours["documents"], f"{ours['relevant_per_query']:.1f}",
                ours["annotation"]) == (domain, queries, documents, relevant, annotation), name
    hparams = paper_tex[paper_tex.index(r"\caption{Hyperparameters"): paper_tex.index(r"\label{tbl:hparams}")]
    hp = published["hyperparameters"]
    for text in (f"epochs: {hp['epochs']}", f"batch size: {hp['batch_size']}", "learning rate: 1e-6",
                 f"entropy coeff: {hp['entropy_coef']}", f"sampled per epoch: {hp['num_samples']}",
                 f"($\\tau$): {hp['temperature']}", "similarity function: dot product", "[SBERT, TAS-B]"):
        assert text in hparams, text
    assert hp["learning_rate"] == 1e-6 and hp["similarity"] == "dot" and hp["warm_starts"] == ["sbert", "tas-b"]
