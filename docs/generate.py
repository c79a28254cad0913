"""The docs pages generated from the code, so that they cannot drift from it (``mkdocs build`` regenerates them through
``docs/hooks.py``; ``tests/test_docs.py`` checks that the committed pages equal what this writes):

* ``reference/configuration.md``: every key of ``params.yaml`` from the typed config (``pgrank/config/``): its
  default (the paper's value as committed), its meaning (the field's description, else the comment beside the key in
  ``params.yaml``) and the DVC stages that read it (their ``params:`` in ``dvc.yaml``);
* ``reference/cli.md``: every ``pgrank`` command with its arguments and options, from the Typer app (``cli.py``);
* ``benchmarks.md``: every benchmark record under ``bench/out/`` (each written by a ``bench/*.py`` script with the
  machine it ran on) as tables.

Run ``python docs/generate.py`` to rewrite the three pages.
"""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"
PAGES = {"reference/configuration.md": "configuration", "reference/cli.md": "cli", "benchmarks.md": "benchmarks"}


# --------------------------------------------------------------------------------------- configuration


def _yaml_comments(path: Path) -> dict[str, str]:
    """``{dotted key: the comment on its line}`` of a YAML file written one key per line (continuation comment lines,
    indented under a key's comment, are joined to it)."""
    comments: dict[str, str] = {}
    stack: list[tuple[int, str]] = []
    last = None
    for line in path.read_text(encoding="utf-8").splitlines():
        match = re.match(r"^(\s*)([\w./-]+):(.*)$", line)
        if not match:
            cont = re.match(r"^\s+#\s?(.*)$", line)
            if cont and last is not None and last in comments:
                comments[last] += " " + cont.group(1).strip()
            continue
        indent, key, rest = len(match.group(1)), match.group(2), match.group(3)
        while stack and stack[-1][0] >= indent:
            stack.pop()
        dotted = ".".join([k for _, k in stack] + [key])
        stack.append((indent, key))
        comment = rest.split(" #", 1)[1].strip() if " #" in rest else ""
        if comment:
            comments[dotted] = comment
        last = dotted
    return comments


def _stages_reading(dotted: str, stage_params: dict[str, list[str]]) -> list[str]:
    return [stage for stage, keys in stage_params.items()
            if any(dotted == k or dotted.startswith(k + ".") or k.startswith(dotted + ".") for k in keys)]


def _dvc_params() -> dict[str, list[str]]:
    import yaml

    stages = yaml.safe_load((ROOT / "dvc.yaml").read_text(encoding="utf-8"))["stages"]
    out = {}
    for name, stage in stages.items():
        body = stage.get("do", stage)
        keys = [k if isinstance(k, str) else next(iter(k)) for k in body.get("params", [])]
        out[name] = [re.sub(r"\.\$\{[^}]+\}$", "", k) for k in keys]  # data.eval_sets.${key} -> data.eval_sets
    return out


def _type_name(annotation) -> str:
    """A type as a user reads it: ``list[str]``, ``int | None``, ``'auto' | 'torch'`` (constraints left out)."""
    import types
    import typing

    origin, args = typing.get_origin(annotation), typing.get_args(annotation)
    if origin is typing.Annotated:
        return _type_name(args[0])
    if origin is typing.Literal:
        return " \\| ".join(repr(a) for a in args)
    if origin in (typing.Union, types.UnionType):
        return " \\| ".join(_type_name(a) for a in args)
    if origin is not None:
        return f"{getattr(origin, '__name__', str(origin))}[{', '.join(_type_name(a) for a in args)}]"
    return "None" if annotation is type(None) else getattr(annotation, "__name__", str(annotation))


def _model_of(annotation):
    """``(section model, keyed)``: the config section a field holds, directly or as the values of a dict (keyed)."""
    from pydantic import BaseModel

    for arg in (annotation, *getattr(annotation, "__args__", ())):
        if isinstance(arg, type) and issubclass(arg, BaseModel):
            return arg, False
        if getattr(arg, "__origin__", None) is dict:
            value = arg.__args__[1]
            if isinstance(value, type) and issubclass(value, BaseModel):
                return value, True
    return None, False


def _rows(model, prefix: str, comments: dict[str, str], stage_params, params_doc: dict) -> list[str]:
    from pydantic import BaseModel

    rows = []
    for name, field in model.model_fields.items():
        dotted = f"{prefix}{name}"
        value = params_doc.get(name, None if field.is_required() else field.get_default(call_default_factory=True))
        if isinstance(value, BaseModel):
            value = value.model_dump(mode="json")
        nested, keyed = _model_of(field.annotation)
        meaning = (field.description or comments.get(dotted, "")).replace("|", "\\|")
        stages = ", ".join(f"`{s}`" for s in _stages_reading(dotted, stage_params)) or "—"
        shown = "required" if field.is_required() and name not in params_doc else f"`{json.dumps(value)}`"
        if nested is None or keyed:
            rows.append(f"| `{dotted}` | `{_type_name(field.annotation)}` | {shown} | {meaning} | {stages} |")
        else:
            rows.append(f"| `{dotted}` | section | | {meaning} | {stages} |")
        if nested is not None:
            rows += _rows(nested, f"{dotted}.<name>." if keyed else f"{dotted}.", comments, stage_params,
                          {} if keyed or not isinstance(value, dict) else value)
    return rows


def configuration() -> str:
    import yaml

    from pgrank.config import Params

    comments = _yaml_comments(ROOT / "params.yaml")
    doc = yaml.safe_load((ROOT / "params.yaml").read_text(encoding="utf-8"))
    stage_params = _dvc_params()
    out = ["# Configuration reference", "",
           "Generated from the typed configuration (`pgrank/config/`) by `python docs/generate.py`: every key of",
           "`params.yaml`, its value as committed (the paper's configuration; a profile overrides some, see",
           "[profiles](../pipeline.md#profiles)), what it means, and the DVC stages that read it (a change re-runs",
           "exactly those). Unknown keys are errors; `pgrank params [SECTION]` prints the resolved configuration.", ""]
    for name, field in Params.model_fields.items():
        section = field.annotation
        out += [f"## `{name}`", "", (section.__doc__ or "").strip().split("\n\n")[0].replace("\n", " "), "",
                "| key | type | value | meaning | DVC stages |", "| --- | --- | --- | --- | --- |"]
        out += _rows(section, f"{name}.", comments, stage_params, doc.get(name, {}))
        out.append("")
    return "\n".join(out)


# --------------------------------------------------------------------------------------- CLI


def cli() -> str:
    import typer

    sys.path.insert(0, str(ROOT))
    from cli import app

    root = typer.main.get_command(app)
    out = ["# Command-line reference", "",
           "Generated from the Typer app (`cli.py`) by `python docs/generate.py`. Every stage of `dvc.yaml` is one",
           "command, which calls one library function ([the pipeline](../pipeline.md)). Options before the command",
           "apply to all of them:", ""]

    def options(command) -> list[str]:
        rows = ["| argument or option | meaning | default |", "| --- | --- | --- |"]
        for param in command.params:
            if param.name == "help":
                continue
            names = (", ".join(f"`{o}`" for o in (*param.opts, *param.secondary_opts)) if param.param_type_name == "option"
                     else f"`{param.name.upper()}`")
            default = "" if param.default in (None, False, ()) or callable(param.default) else f"`{param.default}`"
            text = (getattr(param, "help", None) or "").replace("|", "\\|")
            rows.append(f"| {names} | {text} | {default} |")
        return rows

    out += options(root) + [""]
    for name, command in sorted(root.commands.items()):
        help_text = (command.help or "").strip()
        out += [f"## `pgrank {name}`", "", help_text.replace("\b\n", ""), ""]
        if [p for p in command.params if p.name != "help"]:
            out += options(command) + [""]
    return "\n".join(out)


# --------------------------------------------------------------------------------------- benchmarks


def _bench_on_path() -> None:
    """``bench/`` importable: the scripts import their neighbours (``bench/record.py``, ``bench/machine.py``)."""
    if str(ROOT / "bench") not in sys.path:
        sys.path.insert(0, str(ROOT / "bench"))


def _machine(m: dict) -> str:
    """One line: CPU (cores, memory; the flags that decide pgrank's CPU backends), GPU, Python and library versions."""
    _bench_on_path()
    from machine import FLAGS  # bench/machine.py

    gpu = f", {m['gpu']} ({m.get('cuda') and 'CUDA ' + m['cuda']})" if m.get("gpu") else ""
    versions = dict(m.get("libraries") or m.get("versions") or {})
    python = m.get("python") or versions.pop("python", None)
    libs = ", ".join(f"{k} {v}" for k, v in sorted(versions.items()))
    flags = " ".join(f for f in m.get("cpu_flags", []) if f in FLAGS)
    memory = m.get("memory_gib") or m.get("ram_gib")
    return f"{m.get('cpu')} ({m.get('cores')} cores, {memory} GiB; {flags}){gpu}; Python {python}; {libs}"


def benchmarks(folder: Path = ROOT / "bench" / "out") -> str:
    """The benchmarks page: every record of ``folder`` (``bench/out/``) under its title, with its command and machine."""
    out = ["# Benchmarks", "",
           "Every figure here is read from a record under `bench/out/`, which a `bench/*.py` script wrote together",
           "with the machine it ran on; this page is generated from them by `python docs/generate.py`. Rerun a",
           "script to measure your own machine (the command is given with each record).", ""]
    records = sorted(Path(folder).glob("*.json"))
    if not records:
        return "\n".join(out + ["No benchmark has been recorded yet.", ""])
    for path in records:
        record = json.loads(path.read_text(encoding="utf-8"))
        out += [f"## {record.get('title', path.stem)}", "", f"`{record['command']}` (record `bench/out/{path.name}`)", "",
                f"Machine: {_machine(record['machine'])}.", ""]
        rendered = _render(record)
        out += [rendered, ""]
    return "\n".join(out)


def _render(record: dict) -> str:
    """A record's own Markdown: its ``markdown`` field, or its script's ``render(record)`` (the script loaded from its
    file, so that ``bench/search.py`` or ``bench/training.py`` is never confused with another module of that name)."""
    import importlib.util

    if record.get("markdown"):
        return record["markdown"]
    script = ROOT / record["command"].split()[1]  # python bench/NAME.py ...
    _bench_on_path()
    spec = importlib.util.spec_from_file_location(f"_bench_{script.stem}", script)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.render(record)


# --------------------------------------------------------------------------------------- all


def generate() -> dict[str, str]:
    """``{page path under docs/: its content}`` of every generated page."""
    sys.path.insert(0, str(ROOT))
    makers = {"configuration": configuration, "cli": cli, "benchmarks": benchmarks}
    return {page: makers[name]().rstrip() + "\n" for page, name in PAGES.items()}


def write_all() -> list[Path]:
    written = []
    for page, text in generate().items():
        path = DOCS / page
        path.parent.mkdir(parents=True, exist_ok=True)
        if not path.is_file() or path.read_text(encoding="utf-8") != text:
            path.write_text(text, encoding="utf-8")
            written.append(path)
    return written


if __name__ == "__main__":
    for path in write_all():
        print(f"wrote {path.relative_to(ROOT)}")
