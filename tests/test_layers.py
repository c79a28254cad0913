"""The layout is the pipeline, and imports only run downward.

Layers, bottom to top: ``core`` (pure math: imports nothing of pgrank); the top-level modules (the config
package, paths, errors, atomic writes, tracking, the torch floor); ``data`` (the storage every stage reads); ``download`` (the
download stage, which writes it); ``models``; the retriever kinds ``retrieval/<kind>`` (none imports
another kind); ``mining``; ``training``; ``evaluation``; ``reporting``; ``pipeline``. A module may import
its own package and any layer below it, never one above (every import statement counts, including those
inside functions), and no modules import each other in a circle. Each stage of ``dvc.yaml`` is one
package: the test also checks that every stage command's package exists. That no stage but ``download``
runs ``pgrank/download`` is checked with the stages' import closures (tests/pipeline/test_dependencies.py).
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest
from dependency_closure import ROOT

LAYERS = ["core", "top", "data", "download", "models", "retrieval", "mining", "training", "evaluation", "export", "reporting",
          "pipeline"]
TOP = {"__init__", "atomic", "config", "errors", "paths", "torch_floor", "tracking"}


def _unit(module: str) -> tuple[str, str]:
    """(layer, package) of a pgrank module: ``pgrank.retrieval.bm25.index`` -> ("retrieval", "retrieval.bm25")."""
    parts = module.split(".")[1:] or ["__init__"]
    if parts[0] in TOP:  # a top-level module, or the top-level package pgrank.config
        return "top", "top"
    if parts[0] == "retrieval":
        return "retrieval", ".".join(parts[:2])
    return parts[0], parts[0]


def _modules() -> list[tuple[str, Path]]:
    out = []
    for path in sorted((ROOT / "pgrank").rglob("*.py")):
        rel = path.relative_to(ROOT).with_suffix("")
        out.append((".".join(rel.parts[:-1] if rel.name == "__init__" else rel.parts), path))
    return out


def _module_of(name: str, known: set[str]) -> str | None:
    """The pgrank module an imported name runs: itself, or the module it is a name in (``pgrank.x.f`` -> ``pgrank.x``)."""
    while name and name not in known:
        name = name.rpartition(".")[0]
    return name or None


def _imports(path: Path) -> list[tuple[int, str]]:
    found = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            found += [(node.lineno, a.name) for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module:
            found.append((node.lineno, node.module))
    return [(line, name) for line, name in found if name.split(".")[0] == "pgrank"]


@pytest.mark.parametrize("module,path", _modules(), ids=[m for m, _ in _modules()])
def test_imports_only_run_downward(module, path):
    layer, package = _unit(module)
    for line, imported in _imports(path):
        if imported == "pgrank":
            continue  # `from pgrank import tracking`: the name is checked as pgrank.tracking below
        their_layer, their_package = _unit(imported)
        where = f"{path.relative_to(ROOT)}:{line}: imports {imported}"
        if layer == "core":
            assert their_layer == "core", f"{where}; core imports nothing of pgrank"
        elif their_package == package:
            continue
        else:
            assert LAYERS.index(their_layer) < LAYERS.index(layer) or (layer == their_layer == "top"), \
                f"{where}, which is not below {package}"


def test_no_modules_import_each_other_in_a_circle():
    """Every import statement (module level and inside functions) is an edge; the graph has no cycle."""
    from graphlib import CycleError, TopologicalSorter

    modules = dict(_modules())
    edges = {}
    for module, path in modules.items():
        tree = ast.parse(path.read_text(encoding="utf-8"))
        names = [f"{node.module}.{a.name}" for node in ast.walk(tree)  # `from pgrank.x import y`: y may be a module
                 if isinstance(node, ast.ImportFrom) and node.module and node.module.split(".")[0] == "pgrank"
                 for a in node.names]
        names += [a.name for node in ast.walk(tree) if isinstance(node, ast.Import) for a in node.names
                  if a.name.split(".")[0] == "pgrank"]
        found = {_module_of(name, set(modules)) for name in names}
        edges[module] = {m for m in found if m is not None and m != module}
    try:
        TopologicalSorter(edges).prepare()
    except CycleError as exc:
        pytest.fail(f"modules import each other in a circle: {' -> '.join(exc.args[1])}")


def test_from_pgrank_import_names_only_top_level_modules():
    for module, path in _modules():
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.ImportFrom) and node.module == "pgrank":
                assert {a.name for a in node.names} <= TOP, f"{path}:{node.lineno}"


def test_every_stage_maps_to_one_package():
    import yaml

    stages = yaml.safe_load((ROOT / "dvc.yaml").read_text())["stages"]
    package_of = {"download": "download", "mine-train": "mining", "mine": "mining", "train": "training",
                  "train-seeds": "training", "evaluate-bm25": "evaluation", "evaluate-dense": "evaluation",
                  "evaluate-sparse": "evaluation", "evaluate-policy": "evaluation", "evaluate-policy-seeds": "evaluation",
                  "tables": "reporting"}
    assert set(stages) == set(package_of)
    for stage, package in package_of.items():
        deps = (stages[stage].get("do") or stages[stage])["deps"]
        assert f"pgrank/{package}" in deps and (ROOT / "pgrank" / package / "__init__.py").is_file(), stage
