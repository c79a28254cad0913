"""The pgrank code a DVC stage executes, computed from the source: the static import closure of its command.

A stage's ``cmd`` is ``pgrank <subcommand> ...``; what it runs is ``cli.py``'s module-level imports, the
imports inside that subcommand's function, and, transitively, every import statement (module level and
inside functions) of every pgrank module reached, plus the ``__init__.py`` of each package on the way.
Two dispatches by name are resolved as the code resolves them: ``pgrank evaluate --system S`` imports the
retriever kind of ``S`` (:data:`pgrank.evaluation.systems.KINDS`), and ``pgrank mine`` the retriever of
``mine.source`` (:data:`pgrank.mining.candidate_sets.SOURCES`).

Used by tests/pipeline/test_dependencies.py (dvc.yaml's deps cover exactly this) and by the demo tests
(editing a module re-runs exactly the stages whose closure holds it).
"""

from __future__ import annotations

import ast
import shlex
from collections.abc import Iterable
from functools import cache
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def module_file(name: str, root: Path = ROOT) -> Path | None:
    """The file of module ``name`` under ``root`` (``pgrank.data.beir`` -> pgrank/data/beir.py), or None."""
    base = root.joinpath(*name.split("."))
    for candidate in (base.with_suffix(".py"), base / "__init__.py"):
        if candidate.is_file():
            return candidate
    return None


def _imports(nodes: Iterable[ast.AST], root: Path) -> set[str]:
    """pgrank/flows modules named by the import statements among ``nodes`` (and below them)."""
    found: set[str] = set()
    for top in nodes:
        for node in ast.walk(top):
            if isinstance(node, ast.Import):
                found |= {a.name for a in node.names}
            elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                found.add(node.module)
                found |= {f"{node.module}.{a.name}" for a in node.names if module_file(f"{node.module}.{a.name}", root)}
    return {name for name in found if name.split(".")[0] == "pgrank"}


@cache
def _file_imports(path: Path, root: Path) -> frozenset[str]:
    return frozenset(_imports([ast.parse(path.read_text(encoding="utf-8"))], root))


def closure(modules: Iterable[str], root: Path = ROOT) -> set[Path]:
    """Every pgrank file executed when ``modules`` are imported (package ``__init__`` files included)."""
    files: set[Path] = set()
    todo = list(modules)
    seen: set[str] = set()
    while todo:
        name = todo.pop()
        if name in seen:
            continue
        seen.add(name)
        parts = name.split(".")
        todo += [".".join(parts[:i]) for i in range(1, len(parts))]  # parent packages run first
        path = module_file(name, root)
        if path is None:
            continue  # a namespace package (pgrank.retrieval) or a name inside a module
        files.add(path)
        todo += _file_imports(path, root)
    return files


def command_modules(subcommand: str, root: Path = ROOT) -> set[str]:
    """The pgrank modules ``cli.py`` imports at module level and inside the function of ``subcommand``."""
    tree = ast.parse((root / "cli.py").read_text(encoding="utf-8"))
    module_level = [n for n in tree.body if isinstance(n, (ast.Import, ast.ImportFrom))]
    for node in tree.body:
        if isinstance(node, ast.FunctionDef):
            for deco in node.decorator_list:
                if (isinstance(deco, ast.Call) and getattr(deco.func, "attr", "") == "command" and deco.args
                        and getattr(deco.args[0], "value", None) == subcommand):
                    return _imports(module_level + node.body, root)
    raise KeyError(f"cli.py has no subcommand {subcommand!r}")


def stage_files(cmd: str, params, root: Path = ROOT) -> set[Path]:
    """The files a DVC stage command executes (``cli.py`` included); ``params``: the stage's params."""
    from pgrank.evaluation.systems import KINDS, kind_of
    from pgrank.mining.candidate_sets import SOURCES

    modules: set[str] = set()
    for part in cmd.split("&&"):
        argv = shlex.split(part)
        assert argv[0] == "pgrank", cmd
        sub = next(a for a in argv[1:] if not a.startswith("-"))
        modules |= command_modules(sub, root)
        if sub == "evaluate":
            modules.add(KINDS[kind_of(params, argv[argv.index("--system") + 1])])
        if sub == "mine":
            modules.add(SOURCES[params.mine.source])
    return closure(modules, root) | {root / "cli.py"}


def covered(path: Path, deps: Iterable[Path]) -> bool:
    """Whether a file is one of ``deps`` or inside one of them."""
    return any(path == dep or dep in path.parents for dep in deps)
