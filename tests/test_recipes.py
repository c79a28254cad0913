"""The recipes (``docs/recipes/``): each page's commands and outputs are the ones ``bench/recipes.py`` or a bench script
recorded under ``bench/out/``, and what can run in seconds runs here: ``pgrank plan`` prints today exactly the block
the paper-table page shows, the own-data page's five-line search runs in plain sentence-transformers on a tiny
query/document model, and ``studies/compare_lr.py`` hands ``--profile`` and ``--set`` to every run."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from script_modules import load_script

ROOT = Path(__file__).resolve().parents[1]
BENCH = ROOT / "bench"
RECIPES = ROOT / "docs" / "recipes"


@pytest.fixture(scope="module")
def bench(monkeypatch_module):
    """The scripts this file checks (``bench/recipes.py``, ``studies/compare_lr.py`` and ``studies/variants.py``),
    importable as they import their neighbours and ``bench/record.py``."""
    monkeypatch_module.syspath_prepend(str(ROOT / "studies"))
    monkeypatch_module.syspath_prepend(str(BENCH))
    monkeypatch_module.syspath_prepend(str(ROOT / "docs"))
    return {name: load_script((BENCH if name == "recipes" else ROOT / "studies") / f"{name}.py", f"_recipes_{name}")
            for name in ("recipes", "compare_lr", "variants")}


@pytest.fixture(scope="module")
def monkeypatch_module():
    with pytest.MonkeyPatch.context() as mp:
        yield mp


def blocks(page: str) -> list[str]:
    """The fenced code blocks of a page, in order, without their fences."""
    text = (RECIPES / page).read_text(encoding="utf-8")
    return [m.group(1) for m in re.finditer(r"^```[a-z]*\n(.*?)^```$", text, re.S | re.M)]


def record(name: str) -> dict:
    """A record by name: a study's under ``studies/out/``, a benchmark's under ``bench/out/``."""
    study = ROOT / "studies" / "out" / f"{name}.json"
    return json.loads((study if study.is_file() else BENCH / "out" / f"{name}.json").read_text(encoding="utf-8"))


def test_every_recipe_names_the_records_it_shows():
    for page in ("paper-table.md", "own-data.md", "compare-objectives.md"):
        text = (RECIPES / page).read_text(encoding="utf-8")
        named = set(re.findall(r"`((?:bench|studies)/out/[\w.-]+\.json)`", text))
        assert named, page
        assert all((ROOT / path).is_file() for path in named), (page, named)


# ----------------------------------------------------------------------------------------------- paper table


def test_the_paper_table_page_shows_its_profile_as_committed():
    profile = (ROOT / "profiles" / "paper-table.yaml").read_text(encoding="utf-8")
    assert profile in blocks("paper-table.md")


def test_the_paper_table_page_shows_what_pgrank_plan_prints_today(tmp_path):
    """The page's plan, as the record holds it and as the CLI prints it now (nothing downloaded)."""
    from typer.testing import CliRunner

    sys.path.insert(0, str(ROOT))
    try:
        from cli import app
    finally:
        sys.path.remove(str(ROOT))
    shown = blocks("paper-table.md")
    [step] = record("recipe-paper-table")["steps"]
    assert step["command"] == "pgrank --profile paper-table plan"
    assert step["command"] + "\n" in shown and step["output"] + "\n" in shown
    # the authors published evaluation candidates only: the training split is mined dense, and priced
    assert "| mine-train | gtr-t5-xl |" in step["output"]
    env = {k: v for k, v in os.environ.items() if k != "PGRANK_PROFILE"}
    result = CliRunner().invoke(app, ["--profile", "paper-table", "--set", f"paths.data={tmp_path}", "plan"],
                                env={**env, "HF_HUB_OFFLINE": "1"}, catch_exceptions=False)
    assert result.exit_code == 0, result.output
    assert result.output.rstrip("\n") == step["output"], \
        "docs/recipes/paper-table.md is stale: python bench/recipes.py paper-table"


# ------------------------------------------------------------------------------------------------- own data


def test_the_own_data_page_shows_the_recorded_run(bench):
    rec = record("recipe-own-data")
    shown = blocks("own-data.md")
    text = "\n".join(shown)
    for name, lines in rec["files"].items():
        assert "\n".join(lines) + "\n" in shown, name
    for step in rec["steps"]:
        assert step["command"].replace(" --set ", " \\\n    --set ") in text or step["command"] in text, step["command"]
        assert step["output"] + "\n" in shown, step["command"]
    assert rec["search"] in shown
    assert rec["search"] == bench["recipes"].SEARCH and rec["overlay"] == bench["recipes"].OWN_DATA_OVERLAY


def test_the_search_runs_in_plain_sentence_transformers(bench, tiny_model_dir, tmp_path):
    """The page's search, unchanged, on a query/document Router of two tiny encoders (the shape of a ``tower: query``
    export) and a corpus of four documents, in an interpreter that never imports pgrank: it prints the three best
    documents, best first, as the loaded model scores them."""
    import torch
    from sentence_transformers import SentenceTransformer
    from sentence_transformers.base.modules import Router

    query, document = (SentenceTransformer(str(tiny_model_dir), device="cpu") for _ in range(2))
    with torch.no_grad():
        for p in query.parameters():
            p.add_(0.05 * torch.randn_like(p))  # the trained query tower differs from the frozen document tower
    model = SentenceTransformer(modules=[Router.for_query_document(query_modules=list(query),
                                                                   document_modules=list(document))], device="cpu")
    model.save(str(tmp_path / "acme-ranker"), safe_serialization=True)
    docs = [{"_id": f"MED-{i}", "title": title, "text": text} for i, (title, text) in enumerate([
        ("Statins", "Statins lower LDL cholesterol and the risk of heart attacks."),
        ("Vitamin D", "Vitamin D is made in the skin under sunlight."),
        ("Green tea", "Green tea contains catechins."),
        ("Heart disease", "Diet and heart disease in a cohort study.")])]
    (tmp_path / "nfcorpus").mkdir()
    (tmp_path / "nfcorpus" / "corpus.jsonl").write_text("".join(json.dumps(d) + "\n" for d in docs), encoding="utf-8")
    (tmp_path / "search.py").write_text(bench["recipes"].SEARCH + "import sys\n"
                                        "print(any(m.split('.')[0] == 'pgrank' for m in sys.modules))\n")
    proc = subprocess.run([sys.executable, "search.py"], cwd=tmp_path, capture_output=True, text=True, timeout=300,
                          env={**os.environ, "HF_HUB_OFFLINE": "1", "PYTHONPATH": ""})
    assert proc.returncode == 0, proc.stderr
    *hits, imported = proc.stdout.strip().splitlines()
    assert imported == "False" and len(hits) == 3

    loaded = SentenceTransformer(str(tmp_path / "acme-ranker"), device="cpu")
    q = loaded.encode_query(["do statins prevent heart disease"])
    scores = loaded.similarity(q, loaded.encode_document([f"{d['title']} {d['text']}" for d in docs]))[0]
    best = scores.argsort(descending=True)[:3].tolist()
    assert hits == [f"{scores[i]:.3f} {docs[i]['_id']} {docs[i]['title']}" for i in best]
    assert not np.allclose(q, loaded.encode_document(["do statins prevent heart disease"]), atol=1e-4)


# ------------------------------------------------------------------------------------------ compare objectives


def test_compare_lr_hands_profile_and_set_to_every_run_before_the_grid(bench, tmp_path):
    compare_lr = bench["compare_lr"]
    args = compare_lr.parse_args(["--work", str(tmp_path), "--profile", "demo", "--set", "data.train=nfcorpus/train",
                                  "--set", "data.eval_sets=[nfcorpus/test]", "--set", "train.objectives=[pg]"])
    assert args.profile == "demo" and args.overrides == ["data.train=nfcorpus/train", "data.eval_sets=[nfcorpus/test]",
                                                         "train.objectives=[pg]"]
    params = compare_lr._params(args, tmp_path / "runs" / "base", ["train.objectives=[infonce]"])
    assert params.data.train == "nfcorpus/train" and params.data.eval_sets_by_dataset() == {"nfcorpus": ["test"]}
    assert params.train.objectives == ["infonce"]  # the grid's own override wins over --set
    assert params.train.tower == "query" and params.train.epochs == 4  # the demo profile's, not the compare one's
    assert params.paths.data == str(tmp_path.resolve() / "data") and params.tracking.enabled is False


def test_compare_lr_defaults_to_the_compare_profile_and_the_mirror_variable(bench, tmp_path, monkeypatch):
    monkeypatch.setenv("PGRANK_BEIR_MIRROR", str(tmp_path / "mirror"))
    compare_lr = bench["compare_lr"]
    args = compare_lr.parse_args(["--work", str(tmp_path)])
    assert (args.profile, args.overrides, args.mirror) == ("compare", [], str(tmp_path / "mirror"))
    assert f"data.mirror={tmp_path / 'mirror'}" in compare_lr.run_overrides(args, tmp_path)
    assert compare_lr._params(args, tmp_path).data.train == "scifact/train"


@pytest.mark.parametrize("bad", ["data.train", "=scifact/train"])
def test_compare_lr_refuses_a_set_that_is_not_key_value(bench, tmp_path, bad, capsys):
    with pytest.raises(SystemExit) as stop:
        bench["compare_lr"].parse_args(["--work", str(tmp_path), "--set", bad])
    assert stop.value.code == 2
    assert f"--set {bad!r}: expected KEY=VALUE" in capsys.readouterr().err


def test_the_compare_page_shows_what_the_scripts_printed(bench):
    generate = load_script(ROOT / "docs" / "generate.py", "_recipes_generate")
    shown = blocks("compare-objectives.md")
    for name, script in (("compare_lr-listmle_topk", bench["compare_lr"]), ("variants-compare", bench["variants"])):
        rec = record(name)
        assert generate.rerunnable(rec["command"], f"{name}.json", "studies/out") + "\n" in shown, name
        assert script.render(rec) + "\n" in shown, name
