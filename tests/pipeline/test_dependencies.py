"""dvc.yaml's code deps are exact: every stage lists all the pgrank code its command runs, and nothing else.

The code a stage runs is the static import closure of its command (tests/dependency_closure.py). Each
stage's deps must cover every file of it (else an edit would leave a stale cache: "up to date" while
the code changed), and every code dep must hold code the stage runs (else an edit elsewhere would
re-run it for nothing). Checked for the paper's DAG as committed and for every ``mine.source``; and no
stage but ``download`` runs the download package, so editing the byte transfer or the carve-out re-runs
``download`` alone (its outputs decide the rest).
"""

from __future__ import annotations

import ast
import textwrap
from pathlib import Path

import pytest
from dependency_closure import REGISTRIES, ROOT, command_modules, covered, stage_files

from pgrank.config import load_params


def _stages(project: Path):
    from dvc.repo import Repo

    with Repo(str(project)) as repo:
        return [(s.name, s.cmd, [Path(project, str(d.def_path)).resolve() for d in s.deps]) for s in repo.index.stages]


def _check(project: Path) -> int:
    params = load_params(project / "params.yaml")
    checked = 0
    for name, cmd, deps in _stages(project):
        code_deps = [d for d in deps if d == project / "cli.py" or (project / "pgrank") in d.parents]
        runs = stage_files(cmd, params, project)
        missing = sorted(str(f.relative_to(project)) for f in runs if not covered(f, code_deps))
        assert not missing, f"stage {name}: runs code its deps don't cover: {missing}"
        unused = [str(d.relative_to(project)) for d in code_deps if not any(covered(f, [d]) for f in runs)]
        # The one over-coverage dvc.yaml cannot avoid: a mine stage's deps name the retriever by
        # ${mine.source}, but pgrank/models (which only the dense source loads) is listed for every source.
        if name.split("@")[0] in ("mine", "mine-train") and params.mine.source != "dense":
            unused = [d for d in unused if d != "pgrank/models"]
        # mine-train lists the dense retriever for every source (it mines the training sets under published), and
        # ${mine.source}, which mines them otherwise: under bm25 the first, under published the second, goes unused.
        if name == "mine-train":
            unused = [d for d in unused if d not in ("pgrank/retrieval/dense", f"pgrank/retrieval/{params.mine.source}")]
        assert not unused, f"stage {name}: depends on code it never runs: {unused}"
        checked += 1
    return checked


def test_every_stage_of_the_paper_dag_depends_on_exactly_the_code_it_runs():
    assert _check(ROOT) == 3 + 14 + 2 + 4 * 14 + 2 * 14


@pytest.mark.parametrize("source", ["bm25", "published"])
def test_mining_depends_on_the_retriever_of_mine_source(tmp_path, source):
    from shrunk import project_copy

    project = project_copy(tmp_path / "project")
    text = (project / "params.yaml").read_text()
    (project / "params.yaml").write_text(text.replace("  source: dense ", f"  source: {source} "))
    assert load_params(project / "params.yaml").mine.source == source
    assert _check(project) > 0


def test_the_closure_sees_lazy_imports_and_dispatch_by_name():
    params = load_params(ROOT / "params.yaml")
    bm25 = stage_files("pgrank evaluate --system bm25 --dataset nq", params)
    dense = stage_files("pgrank evaluate --system sbert --dataset nq", params)
    index = ROOT / "pgrank/retrieval/bm25/index.py"
    embeddings = ROOT / "pgrank/retrieval/dense/corpus_embeddings.py"
    assert index in bm25 and index not in dense
    assert embeddings in dense and embeddings not in bm25
    assert ROOT / "pgrank/__init__.py" in bm25 and ROOT / "pgrank/evaluation/__init__.py" in bm25
    train = stage_files("pgrank train --warm-start sbert", params)
    assert ROOT / "pgrank/training/grad_cache.py" in train and index not in train


def test_no_stage_but_download_runs_the_download_package():
    params = load_params(ROOT / "params.yaml")
    package = ROOT / "pgrank" / "download"
    for name, cmd, _ in _stages(ROOT):
        runs = {f for f in stage_files(cmd, params) if package in f.parents}
        if name == "download":
            assert {package / "transfer.py", package / "carve_out.py", package / "stage.py"} <= runs
        else:
            assert not runs, f"stage {name} runs {sorted(str(f.relative_to(ROOT)) for f in runs)}"


def test_the_closure_reads_the_callback_and_the_helpers_of_cli_py(tmp_path):
    """What cli.py's callback imports runs before every subcommand, also through a helper it calls."""
    (tmp_path / "cli.py").write_text(textwrap.dedent('''
        import typer

        app = typer.Typer()


        def _helper():
            from pgrank.download.mirror import absolute_mirror_env


        @app.callback()
        def main():
            _helper()


        @app.command("mine")
        def mine_cmd():
            from pgrank.mining.candidate_sets import mine_splits
    '''))
    assert {"pgrank.download.mirror", "pgrank.mining.candidate_sets"} <= command_modules("mine", tmp_path)
    # the project's own cli.py: only the commands that start DVC make the mirror folder absolute
    assert "pgrank.download.mirror" in command_modules("repro") and "pgrank.download.mirror" not in command_modules("mine")


# Calls of importlib.import_module that name a module the user configures (never a pgrank module).
USER_MODULES = {("pgrank.models.names", "entry.package"), ("pgrank.core.ranking_utility", "module")}


def test_every_dispatch_by_name_goes_through_a_registry_the_closure_follows():
    for path in sorted((ROOT / "pgrank").rglob("*.py")):
        module = ".".join(path.relative_to(ROOT).with_suffix("").parts)
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if not (isinstance(node, ast.Call) and getattr(node.func, "attr", "") == "import_module" and node.args):
                continue
            arg = node.args[0]
            where = f"{path.relative_to(ROOT)}:{node.lineno}: import_module({ast.unparse(arg)})"
            if isinstance(arg, ast.Subscript) and isinstance(arg.value, ast.Name):
                assert (module, arg.value.id) in REGISTRIES, f"{where}: a registry tests/dependency_closure.py does not follow"
            else:
                assert (module, ast.unparse(arg)) in USER_MODULES, f"{where}: a module the closure cannot see"
