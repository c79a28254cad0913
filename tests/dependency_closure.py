"""The pgrank code a DVC stage executes, computed from the source: the static import closure of its command.

A stage's ``cmd`` is ``pgrank <subcommand> ...``; what it runs is ``cli.py``'s module-level statements,
its callback (``@app.callback()``, run before every subcommand), that subcommand's function, and the
functions and classes of ``cli.py`` these name, with every import statement in them; then, transitively,
every import statement (module level and inside functions) of every pgrank module reached, plus the
``__init__.py`` of each package on the way. The dispatches by name through ``importlib`` registries
(:data:`REGISTRIES`) are resolved as the code resolves them: ``pgrank evaluate --system S`` imports the
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


def _decorated(node: ast.AST, attr: str) -> list[ast.Call]:
    """The ``@app.<attr>(...)`` decorators of a function of cli.py."""
    return [deco for deco in getattr(node, "decorator_list", [])
            if isinstance(deco, ast.Call) and getattr(deco.func, "attr", "") == attr]


def _command_name(node: ast.AST) -> str | None:
    """``download`` for the function under ``@app.command("download")``, else None."""
    return next((getattr(deco.args[0], "value", None) for deco in _decorated(node, "command") if deco.args), None)


def command_modules(subcommand: str, root: Path = ROOT) -> set[str]:
    """The pgrank modules ``cli.py`` imports when it runs ``subcommand``: at module level, in the callback,
    in the subcommand's function, and in the functions and classes of ``cli.py`` these name (transitively)."""
    tree = ast.parse((root / "cli.py").read_text(encoding="utf-8"))
    command = next((node for node in tree.body if _command_name(node) == subcommand), None)
    if command is None:
        raise KeyError(f"cli.py has no subcommand {subcommand!r}")
    defined = {node.name: node for node in tree.body if isinstance(node, (ast.FunctionDef, ast.ClassDef))
               and _command_name(node) is None and not _decorated(node, "callback")}
    runs = [node for node in tree.body if not isinstance(node, (ast.FunctionDef, ast.ClassDef))]
    runs += [node for node in tree.body if _decorated(node, "callback")] + [command]
    todo, seen = list(runs), set()
    while todo:  # the helpers of cli.py that what runs names
        for node in ast.walk(todo.pop()):
            if isinstance(node, ast.Name) and node.id in defined and node.id not in seen:
                seen.add(node.id)
                todo.append(defined[node.id])
    return _imports(runs + [defined[name] for name in seen], root)


def _retriever_kind(argv: list[str], params) -> str | None:
    from pgrank.evaluation.systems import KINDS, kind_of

    return KINDS[kind_of(params, argv[argv.index("--system") + 1])] if "--system" in argv else None


def _mining_source(argv: list[str], params) -> str | None:
    from pgrank.mining.candidate_sets import SOURCES

    return SOURCES[params.mine.training_source if "--training" in argv else params.mine.source]


# The dispatches by name of pgrank: (module, registry) -> the module a stage's command and params select.
# tests/pipeline/test_dependencies.py checks that every `importlib.import_module(REGISTRY[...])` is listed.
REGISTRIES = {
    ("pgrank.evaluation.systems", "KINDS"): _retriever_kind,
    ("pgrank.mining.candidate_sets", "SOURCES"): _mining_source,
}


def stage_files(cmd: str, params, root: Path = ROOT) -> set[Path]:
    """The files a DVC stage command executes (``cli.py`` included); ``params``: the stage's params."""
    files: set[Path] = set()
    for part in cmd.split("&&"):
        argv = shlex.split(part)
        assert argv[0] == "pgrank", cmd
        sub = next(a for a in argv[1:] if not a.startswith("-"))
        modules = command_modules(sub, root)
        while True:  # each registry the command reaches selects its entry, which may reach another
            reached = closure(modules, root)
            chosen = {select(argv, params) for (module, _), select in REGISTRIES.items()
                      if module_file(module, root) in reached} - {None}
            if chosen <= modules:
                break
            modules |= chosen
        files |= reached
    return files | {root / "cli.py"}


def covered(path: Path, deps: Iterable[Path]) -> bool:
    """Whether a file is one of ``deps`` or inside one of them."""
    return any(path == dep or dep in path.parents for dep in deps)
