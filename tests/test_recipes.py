"""The recipes (``docs/recipes/``) run as written: each page's ``bash`` blocks, as they stand in the page, run in one
bash session (``set -euo pipefail``) in a fresh checkout, shrunk only by the ``--set`` overrides of the page's own "try
it small" line (``bench/recipes.py``: the same runner records a page's run). No block names a variable the page does
not set, nor writes where the project keeps its records (``bench/out``, ``studies/out``). The figures a page copies
from a record are the record's: ``pgrank plan`` prints today the block the paper-table page shows, the compare page's
tables are what the scripts render from their records, and ``studies/compare_lr.py`` and ``studies/variants.py`` take
the profile, the warm start, the objectives and ``--set`` from their arguments."""

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
from shrunk import project_copy

ROOT = Path(__file__).resolve().parents[1]
BENCH = ROOT / "bench"
RECIPES = ROOT / "docs" / "recipes"
PAGES = ("paper-table", "own-data", "compare-objectives")
# The pages that run here (shrunk): paper-table's run needs a GPU machine with internet (its plan runs below).
RUNNABLE = ("own-data", "compare-objectives")


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
    text = (RECIPES / f"{page}.md").read_text(encoding="utf-8")
    return [m.group(1) for m in re.finditer(r"^```[a-z]*\n(.*?)^```$", text, re.S | re.M)]


def record(name: str) -> dict:
    """A record by name: a study's under ``studies/out/``, a benchmark's under ``bench/out/``."""
    study = ROOT / "studies" / "out" / f"{name}.json"
    return json.loads((study if study.is_file() else BENCH / "out" / f"{name}.json").read_text(encoding="utf-8"))


def test_every_recipe_names_the_records_it_shows():
    for page in PAGES:
        text = (RECIPES / f"{page}.md").read_text(encoding="utf-8")
        named = set(re.findall(r"`((?:bench|studies)/out/[\w.-]+\.json)`", text))
        assert named, page
        assert all((ROOT / path).is_file() for path in named), (page, named)


# ------------------------------------------------------------------------------------------ as written


@pytest.mark.parametrize("page", PAGES)
def test_no_recipe_depends_on_an_unset_variable_or_writes_into_the_records(bench, page):
    """Every ``$NAME`` a page's commands use is one the page sets before (or the shell's ``HOME``), and no command
    writes into ``bench/out`` or ``studies/out`` (``--out`` goes under the work folder)."""
    script = "\n".join(bench["recipes"].blocks(page))
    assert script, page
    set_before: set[str] = {"HOME"}
    for line in script.splitlines():
        used = set(re.findall(r"\$\{?([A-Za-z_]\w*)", line))
        assert used <= set_before, (page, line, used - set_before)
        set_before |= set(re.findall(r"^\s*(?:export\s+)?([A-Za-z_]\w*)=", line))
    assert "PGRANK_BEIR_MIRROR" not in script and "--mirror" not in script
    assert not re.search(r"(?:bench|studies)/out\b", script), page
    for out in re.findall(r"--out\s+(\S+)", script):
        assert out.startswith("$W/"), (page, out)


def test_try_it_small_is_read_from_the_page_and_added_to_each_command(bench):
    recipes = bench["recipes"]
    small = recipes.small_overrides("own-data")
    assert "train.queries_per_epoch=32" in small and "train.extra_seeds=[]" in small
    assert all("=" in o for o in small)
    shown = ("pgrank --profile compare \\\n    --set 'data.eval_sets=[acme/test]' \\\n    --set paths.root=runs/acme "
             "export --to $W/x --objective infonce\npython studies/variants.py --work $W --objectives pg\n"
             "dvc --cd runs/acme metrics show\n")
    ran = recipes.shrunk(shown, ["a.b=1", "c=[x, y]"]).splitlines()
    # after the page's own options (so they win), before the subcommand; studies scripts: at the end; others untouched
    assert ran[0] == ("pgrank --profile compare      --set 'data.eval_sets=[acme/test]'      --set paths.root=runs/acme "
                      "--set a.b=1 --set 'c=[x, y]' export --to $W/x --objective infonce")
    assert ran[1] == "python studies/variants.py --work $W --objectives pg --set a.b=1 --set 'c=[x, y]'"
    assert ran[2] == "dvc --cd runs/acme metrics show"
    for page in RUNNABLE:
        assert recipes.small_overrides(page), page


@pytest.fixture(scope="module")
def checkout(tmp_path_factory, beir_mirror):
    """One fresh checkout of the working tree and one ``HOME`` for every page run here: the pages share their work
    folder (``~/pgrank-work``), so its datasets and corpus embeddings are made once."""
    tmp = tmp_path_factory.mktemp("recipes")
    clone = project_copy(tmp / "pgrank")
    home = tmp / "home"
    home.mkdir()
    env = {k: v for k, v in os.environ.items() if k not in ("PGRANK_PROFILE", "MLFLOW_TRACKING_URI", "VIRTUAL_ENV")}
    env.update(HOME=str(home), PGRANK_BEIR_MIRROR=str(beir_mirror), HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1",
               PATH=f"{Path(sys.executable).parent}{os.pathsep}{env['PATH']}")
    return clone, home, env


def _run(bench, page: str, checkout) -> tuple[dict, Path]:
    clone, home, env = checkout
    result = bench["recipes"].run_page(page, cwd=clone, env=env, small=True, timeout=900)
    last = result["steps"][-1] if result["steps"] else {"command": "", "output": ""}
    assert result["returncode"] == 0, f"{page}: {last['command']}\n{last['output'][-3000:]}"
    assert len(result["steps"]) == len(bench["recipes"].blocks(page))
    status = subprocess.run(["git", "status", "--porcelain", "--ignored"], cwd=clone, capture_output=True, text=True,
                            check=True).stdout.split("\n")
    written = {line[3:].split("/")[0] for line in status if line and "__pycache__" not in line}
    assert written <= {"runs"}, written  # the work folder holds the rest; no records, nothing tracked touched
    return result, home / "pgrank-work"


@pytest.mark.integration
@pytest.mark.slow  # minutes of real MiniLM training on NFCorpus; `-m slow` runs it
def test_the_own_data_page_runs_as_written(bench, checkout):
    result, work = _run(bench, "own-data", checkout)
    # the page's file heads are the files the download brought
    shown = blocks("own-data")
    for name, lines in (("corpus.jsonl", 2), ("queries.jsonl", 2), ("qrels/train.tsv", 3)):
        head = (work / "nfcorpus" / name).read_text(encoding="utf-8").splitlines()[:lines]
        assert "\n".join(line[:160] for line in head) + "\n" in shown, name
    repro = next(s for s in result["steps"] if s["command"].rstrip().endswith(" repro"))
    assert "Same candidates, same budget" in repro["output"], repro["output"][-2000:]  # objectives.md, printed
    assert (checkout[0] / "runs" / "acme" / "tables" / "objectives.md").is_file()
    metrics = next(s for s in result["steps"] if "metrics show" in s["command"])
    assert "metrics/pgrank-minilm/infonce/acme.json" in metrics["output"]
    assert (work / "acme-ranker" / "README.md").is_file()
    hits = result["steps"][-1]["output"].splitlines()[-3:]
    assert len(hits) == 3 and all(re.fullmatch(r"-?\d\.\d{3} MED-\d+ .*", h) for h in hits), hits


@pytest.mark.integration
@pytest.mark.slow  # minutes of real MiniLM training on NFCorpus; `-m slow` runs it
def test_the_compare_page_runs_as_written(bench, checkout):
    result, work = _run(bench, "compare-objectives", checkout)
    chosen = json.loads((work / "compare_lr.json").read_text())["chosen"]
    assert set(chosen) == {"pg", "infonce"}  # the small line's two losses
    variants = json.loads((work / "variants.json").read_text())
    assert variants["warm_start"] == "minilm" and {r["variant"] for r in variants["runs"]} == {"pg", "infonce"}
    assert (checkout[0] / "runs" / "compare-nfcorpus" / "tables" / "objectives.md").is_file()


# ----------------------------------------------------------------------------------------------- paper table


def test_the_paper_table_page_shows_its_profile_as_committed():
    profile = (ROOT / "profiles" / "paper-table.yaml").read_text(encoding="utf-8")
    assert profile in blocks("paper-table")


def test_the_paper_table_page_shows_what_pgrank_plan_prints_today(tmp_path):
    """The page's plan, as the record holds it and as the CLI prints it now (nothing downloaded)."""
    from typer.testing import CliRunner

    sys.path.insert(0, str(ROOT))
    try:
        from cli import app
    finally:
        sys.path.remove(str(ROOT))
    shown = blocks("paper-table")
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


def _search(bench) -> str:
    """The page's ``search.py``, as its heredoc writes it."""
    script = "\n".join(bench["recipes"].blocks("own-data"))
    return re.search(r"<<'EOF'\n(.*?\n)EOF\n", script, re.S).group(1)


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
    (tmp_path / "search.py").write_text(_search(bench) + "import sys\n"
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


def test_the_own_data_page_says_what_the_project_found(bench):
    """InfoNCE against PG-Rank on the same candidates, from the comparison's record, before any training command."""
    text = (RECIPES / "own-data.md").read_text(encoding="utf-8")
    rec = record("variants-compare-test")["summary"]["variants"]
    gap = rec["infonce"]["test"]["scifact/rerank"]["mean"] - rec["pg"]["test"]["scifact/rerank"]["mean"]
    assert round(gap, 2) == 0.05 and "about 0.05 nDCG@10" in text
    assert text.index("variants-compare-test.json") < text.index("--profile compare")
    assert "export --to $W/acme-ranker --objective infonce" in text.replace("\\\n    ", "")


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
    assert (args.profile, args.overrides, args.mirror, args.warm_start) == ("compare", [], str(tmp_path / "mirror"), None)
    assert f"data.mirror={tmp_path / 'mirror'}" in compare_lr.run_overrides(args, tmp_path)
    assert compare_lr._params(args, tmp_path).data.train == "scifact/train"


@pytest.mark.parametrize("value", [None, ""])
def test_an_unset_or_empty_mirror_variable_is_no_mirror_never_an_argument_error(bench, tmp_path, monkeypatch, value):
    """``--mirror $PGRANK_BEIR_MIRROR`` with the variable unset leaves ``--mirror`` without its value: no mirror."""
    if value is None:
        monkeypatch.delenv("PGRANK_BEIR_MIRROR", raising=False)
    else:
        monkeypatch.setenv("PGRANK_BEIR_MIRROR", value)
    for script in ("compare_lr", "variants"):
        args = bench[script].parse_args(["--work", str(tmp_path), "--mirror", "--set", "train.epochs=1",
                                         *(["--objectives", "pg"] if script == "variants" else [])])
        assert not args.mirror and args.overrides == ["train.epochs=1"], script
        assert not [o for o in bench["compare_lr"].run_overrides(args, tmp_path) if o.startswith("data.mirror")]


def test_the_warm_start_and_the_objectives_come_from_the_arguments(bench, tmp_path):
    compare_lr, variants = bench["compare_lr"], bench["variants"]
    args = compare_lr.parse_args(["--work", str(tmp_path), "--warm-start", "sbert", "--objectives", "infonce"])
    assert compare_lr._params(args, tmp_path).train.warm_starts == ["sbert"] and args.objectives == ["infonce"]
    assert compare_lr._params(compare_lr.parse_args(["--work", str(tmp_path)]), tmp_path).train.warm_starts == ["minilm"]
    args = variants.parse_args(["--work", str(tmp_path), "--profile", "compare", "--warm-start", "tas-b",
                                "--objectives", "pg", "infonce", "--variant", "pg-T1: train.pg.temperature=1"])
    assert variants._params(args, tmp_path, []).train.warm_starts == ["tas-b"]
    specs = [variants.parse_variant(v) for v in variants.variant_specs(args)]
    assert specs == [("pg-T1", "pg", ["train.pg.temperature=1"]), ("pg", "pg", []), ("infonce", "infonce", [])]
    # as before: the profile's warm start, and --variant alone
    args = variants.parse_args(["--work", str(tmp_path), "--variant", "demo:"])
    assert args.warm_start is None and variants._params(args, tmp_path, []).train.warm_starts == ["minilm"]
    with pytest.raises(SystemExit):
        variants.parse_args(["--work", str(tmp_path)])


@pytest.mark.parametrize("bad", ["data.train", "=scifact/train"])
def test_compare_lr_refuses_a_set_that_is_not_key_value(bench, tmp_path, bad, capsys):
    with pytest.raises(SystemExit) as stop:
        bench["compare_lr"].parse_args(["--work", str(tmp_path), "--set", bad])
    assert stop.value.code == 2
    assert f"--set {bad!r}: expected KEY=VALUE" in capsys.readouterr().err


def test_the_compare_page_shows_what_the_scripts_printed(bench):
    shown = blocks("compare-objectives")
    text = (RECIPES / "compare-objectives.md").read_text(encoding="utf-8")
    for name, script in (("compare_lr-listmle_topk", bench["compare_lr"]), ("variants-compare", bench["variants"])):
        assert script.render(record(name)) + "\n" in shown, name
        assert f"`studies/out/{name}.json`" in text, name


@pytest.mark.parametrize("page", ["own-data"])
def test_a_page_states_the_time_of_its_recorded_run_as_it_stands(bench, page):
    """The page's time is its record's (``python bench/recipes.py PAGE --small``), and the record ran the page's
    commands as they stand now, shrunk by the page's own overrides."""
    recipes = bench["recipes"]
    rec = record(f"recipe-{page}-small")
    assert rec["returncode"] == 0 and rec["small_overrides"] == recipes.small_overrides(page)
    assert [s["command"] for s in rec["steps"]] == recipes.page_script(page, small=True), \
        f"docs/recipes/{page}.md changed since its record: python bench/recipes.py {page} --small"
    text = (RECIPES / f"{page}.md").read_text(encoding="utf-8")
    assert f"took {rec['seconds']:,.0f} s here" in text and f"`bench/out/recipe-{page}-small.json`" in text
