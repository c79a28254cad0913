"""The docs pages generated from the code, so that they cannot drift from it (``mkdocs build`` regenerates them through
``docs/hooks.py``; ``tests/test_docs.py`` checks that the committed pages equal what this writes):

* ``reference/configuration.md``: every key of ``params.yaml`` from the typed config (``pgrank/config/``): its
  default (the paper's value as committed), its meaning (the field's description, else the comment beside the key in
  ``params.yaml``) and the DVC stages that read it (their ``params:`` in ``dvc.yaml``);
* ``reference/cli.md``: every ``pgrank`` command with its arguments and options, from the Typer app (``cli.py``);
* ``benchmarks.md`` and ``studies.md``: every record under ``bench/out/`` (written by a ``bench/*.py`` script) or
  ``studies/out/`` (a ``studies/*.py`` script), each with the machine it ran on, as tables, under its title, with its command as a reader reruns it (scratch folders as ``W``,
  the BEIR mirror as ``$PGRANK_BEIR_MIRROR``, the output as the record's own path);
* the generated blocks of the hand-written pages (``docs/blocks.py``): the README's headline lines, the findings map
  and each finding's tables, between ``<!-- generated: NAME -->`` and ``<!-- end generated -->``;
* the findings' figures (``docs/plots.py``), PNGs under ``docs/img/findings/`` drawn from their records (committed).

Sphinx roles in docstrings (``:mod:`x```, ``:func:`x```) and reStructuredText literals reach the pages as plain code.
Run ``python docs/generate.py`` to rewrite the four pages, the blocks and the figures.
"""

from __future__ import annotations

import json
import re
import shlex
import sys
from itertools import pairwise
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"
PAGES = {"reference/configuration.md": "configuration", "reference/cli.md": "cli", "benchmarks.md": "benchmarks",
         "studies.md": "studies"}


# --------------------------------------------------------------------------------------- text

SPHINX_ROLE = re.compile(r":(?:py:)?(?:mod|func|class|meth|attr|data|obj|exc|const):`~?([^`]+)`")
RST_LITERAL = re.compile(r"``([^`]+)``")


def plain_code(text: str) -> str:
    """Docstring markup as Markdown: ``:func:`x``` and ````x```` become ```x```."""
    return RST_LITERAL.sub(r"`\1`", SPHINX_ROLE.sub(r"`\1`", text))


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
    return plain_code("\n".join(out))


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
    return plain_code("\n".join(out))


# --------------------------------------------------------------------------------------- benchmarks


def _bench_on_path() -> None:
    """``bench/`` and ``studies/`` importable: the scripts import their neighbours and ``bench/record.py``."""
    for folder in ("studies", "bench"):
        if str(ROOT / folder) not in sys.path:
            sys.path.insert(0, str(ROOT / folder))


def _machine(m: dict) -> str:
    """One line: CPU (cores, memory; the flags that decide pgrank's CPU backends), GPU, Python and library versions."""
    _bench_on_path()
    from record import FLAGS  # bench/record.py

    gpu = f", {m['gpu']} ({m.get('cuda') and 'CUDA ' + m['cuda']})" if m.get("gpu") else ""
    versions = dict(m.get("libraries") or m.get("versions") or {})
    python = m.get("python") or versions.pop("python", None)
    libs = ", ".join(f"{k} {v}" for k, v in sorted(versions.items()))
    flags = " ".join(f for f in m.get("cpu_flags", []) if f in FLAGS)
    memory = m.get("memory_gib") or m.get("ram_gib")
    return f"{m.get('cpu')} ({m.get('cores')} cores, {memory} GiB; {flags}){gpu}; Python {python}; {libs}"


def rerunnable(command: str, record_name: str, where: str = "bench/out") -> str:
    """A record's command as a reader reruns it: the scratch folder (``--work``, and any other absolute path) as
    ``W``, the BEIR mirror as ``$PGRANK_BEIR_MIRROR``, the output as the record's own path under ``where``."""
    command = re.sub(r"--out\s+\S+", f"--out {where}/{record_name}", command)
    command = re.sub(r"--mirror\s+\S+", "--mirror $PGRANK_BEIR_MIRROR", command)
    command = re.sub(r"(?:\.\./)+shared/data/beir\b", "$PGRANK_BEIR_MIRROR", command)
    work = re.search(r"--work\s+(\S+)", command)
    if work:
        command = command.replace(work.group(1), "W")
    command = re.sub(r"(?:(?<=\s)|(?<==)|^)/[^\s/]+/[^\s/]+", "W", command)  # any other scratch folder
    return command if "'" in command or '"' in command else _quoted(command)


def _quoted(command: str) -> str:
    """A command recorded unquoted, quoted again: each ``--variant`` or ``--set`` takes the words up to the next
    option as one argument (``--variant 'wise-ft: train.selection.interpolation=[0.25, 0.5, 0.75, 1]'``)."""
    return re.sub(r"(--(?:variant|set)) (.+?)(?= --|$)", lambda m: f"{m[1]} {shlex.quote(m[2])}", command)


def _script_title(record: dict) -> str:
    """The title of a record that has none: the first sentence of its script's docstring."""
    import ast

    script = ROOT / record["command"].split()[1]
    doc = ast.get_docstring(ast.parse(script.read_text(encoding="utf-8"))) if script.is_file() else None
    if not doc:
        return script.stem
    return re.split(r"[:.]\s", plain_code(doc.split("\n\n")[0].replace("\n", " ")), maxsplit=1)[0].rstrip(".")


def _command_words(record: dict) -> list[str]:
    """A record's command as its arguments (a command recorded unquoted is quoted again first)."""
    command = record.get("command", "")
    return shlex.split(command if "'" in command or '"' in command else _quoted(command))


def _command_sets(words: list[str]) -> list[str]:
    """The ``--set`` overrides among a command's ``words``, but those that only move folders (``paths.*``)."""
    return [value for flag, value in pairwise(words) if flag == "--set" and not value.startswith("paths.")]


def _qualifier(record: dict, path: Path) -> str:
    """What sets a record apart from others of the same title: its variants and the overrides its command ran them
    under, its timings or what it measured."""
    variants = (record.get("summary") or {}).get("variants")
    words = _command_words(record)
    sets = _command_sets(words)
    if variants:
        seeds = max(v.get("seeds", 1) for v in variants.values())
        under = f" with `{'`, `'.join(sets)}`" if sets else ""
        return f"{', '.join(variants)} ({seeds} seed{'s' if seeds != 1 else ''}){under}"
    if "int8_isa" in record:  # bench/backends.py: what the CPU it ran on offers
        isa = "AMX-BF16" if record.get("amx_bf16") else "AVX-512 VNNI" if record.get("avx512_vnni") else "AVX2 alone"
        return f"a CPU with {isa}"
    if record.get("revisions"):
        first, last = record["revisions"][0]["mean_seconds"], record["revisions"][-1]["mean_seconds"]
        return f"the last `--rev` {'slower' if last > first else 'faster'} than the first"
    parts = ", ".join(key for key in ("encoding", "pool", "training", "estimators", "step") if record.get(key))
    overrides = record.get("overrides") or sets
    if not parts and not overrides and "--profile" in words[:-1]:
        return f"the {words[words.index('--profile') + 1]} profile as committed"
    return (parts + (f" with {', '.join(overrides)}" if overrides else "")).strip() or path.stem


TIMINGS = "`pgrank demo` from a fresh clone, timed at each revision its command names, on one machine"


def titles(records: dict[Path, dict]) -> dict[Path, str]:
    """``{record path: its section heading}``: the record's title (else its script's), made unique by a qualifier,
    else by the file name."""
    base = {path: TIMINGS if record.get("revisions") else record.get("title") or _script_title(record)
            for path, record in records.items()}
    shared = {title for title in base.values() if list(base.values()).count(title) > 1}
    out = {path: f"{title}: {_qualifier(records[path], path)}" if title in shared else title
           for path, title in base.items()}
    return {path: f"{title} ({path.stem})" if list(out.values()).count(title) > 1 else title
            for path, title in out.items()}


def _records_page(folder: Path, where: str, heading: str, intro: list[str], empty: str) -> str:
    """A page of every record of ``folder`` under its title, with its command and machine; ``where`` is the record's
    folder as the page names it (``bench/out`` or ``studies/out``)."""
    out = [f"# {heading}", "", *intro, ""]
    paths = sorted(Path(folder).glob("*.json"))
    if not paths:
        return "\n".join(out + [empty, ""])
    records = {path: json.loads(path.read_text(encoding="utf-8")) for path in paths}
    headings = titles(records)
    for path, record in records.items():
        anchor = re.sub(r"[^a-z0-9]+", "-", path.stem.lower()).strip("-")
        out += [f"## {headings[path]} {{ #{anchor} }}", "", f"Record `{where}/{path.name}`, written by:", "",
                "```bash", rerunnable(record["command"], path.name, where), "```", "",
                f"Machine of `{where}/{path.name}`: {_machine(record['machine'])}.", ""]
        out += [traced(_render(record), f"{where}/{path.name}"), ""]
    return "\n".join(out)


def benchmarks(folder: Path = ROOT / "bench" / "out") -> str:
    """The benchmarks page: every record of ``folder`` (``bench/out/``), what the product's speed, memory and cost
    are measured by."""
    return _records_page(Path(folder), "bench/out", "Benchmarks", [
        "Every figure here is read from a record under `bench/out/`, which a `bench/*.py` script wrote together",
        "with the machine it ran on; this page is generated from them by `python docs/generate.py`. Rerun a",
        "script to measure your own machine: each record gives its command, with `W` for a scratch folder of",
        "your choice and `$PGRANK_BEIR_MIRROR` for the folder of the BEIR zips. Studies, which answer a question",
        "about the method once, are on [their own page](studies.md)."], "No benchmark has been recorded yet.")


def studies(folder: Path = ROOT / "studies" / "out") -> str:
    """The studies page: every record of ``folder`` (``studies/out/``), each the answer of a ``studies/*.py`` script
    to one question about the method."""
    return _records_page(Path(folder), "studies/out", "Studies", [
        "Every figure here is read from a record under `studies/out/`, which a `studies/*.py` script wrote together",
        "with the machine it ran on; this page is generated from them by `python docs/generate.py`. Each study",
        "answers one question about the method (its script's first lines say which, and which page reports it);",
        "each record gives its command, with `W` for a scratch folder and `$PGRANK_BEIR_MIRROR` for the folder",
        "of the BEIR zips. The product's speed, memory and cost are on the [benchmarks page](benchmarks.md)."],
        "No study has been recorded yet.")


def traced(markdown: str, record: str) -> str:
    """A record's rendered Markdown with every figure-bearing paragraph naming the record, and every table introduced
    by a paragraph that names it (the rule of every page: a figure names its record). Code blocks are left as
    they are."""
    out: list[str] = []
    for kind, block in _segments(markdown):
        if kind == "table":
            if out and out[-1][0] == "text":
                out[-1] = ("text", _naming(out[-1][1], record))
            else:
                out.append(("text", f"From `{record}`:"))
        elif kind == "text" and block.startswith("$ "):  # a shell transcript: code, as it was printed
            kind, block = "code", f"```text\n{block}\n```"
        elif kind == "text" and re.search(r"\d", block):
            block = _naming(block, record)
        out.append((kind, block))
    return "\n\n".join(block for _, block in out)


def _segments(markdown: str) -> list[tuple[str, str]]:
    """``(kind, block)`` of Markdown: ``code`` (a fenced block, whole), ``table`` (consecutive ``|`` lines) or
    ``text`` (a paragraph: other consecutive lines)."""
    segments: list[tuple[str, list[str]]] = []
    fence = False
    for line in markdown.strip().splitlines():
        if fence:
            segments[-1][1].append(line)
            fence = not line.startswith("```")
            continue
        if line.startswith("```"):
            segments.append(("code", [line]))
            fence = True
            continue
        kind = "table" if line.startswith("|") else "text"
        if not line.strip():
            segments.append(("blank", []))
        elif segments and segments[-1][0] == kind and not (kind == "text" and re.match(r"[-*] ", line)
                                                          and not segments[-1][1][0].startswith("$ ")):
            segments[-1][1].append(line)
        else:
            segments.append((kind, [line]))
    return [(kind, "\n".join(lines)) for kind, lines in segments if kind != "blank"]


def _naming(paragraph: str, record: str) -> str:
    if record in paragraph:
        return paragraph
    if paragraph.endswith(":"):
        return f"{paragraph[:-1]} (record `{record}`):"
    return f"{paragraph} (record `{record}`)" if not paragraph.endswith(".") else f"{paragraph[:-1]} (record `{record}`)."


def _timings(record: dict) -> str:
    """A record that times the code at the revisions its command names (``bench/demo_time.py --rev A --rev B``):
    the revisions by their place in the command (a revision's name is git's business, not the page's)."""
    place = {r["rev"]: i + 1 for i, r in enumerate(record["revisions"])}
    nth = ("first", "second", "third", "fourth")
    places = ", ".join(f"{i} for the {word}" for i, word in enumerate(nth[: len(place)], 1))
    out = [f"Each `--rev` of the command by its place: {places}{', and so on' if len(place) > len(nth) else ''}.", "",
           "| `--rev` | run | `pgrank demo` s | training s | the rest s |", "| ---: | ---: | ---: | ---: | ---: |"]
    out += [f"| {place[r['rev']]} | {r['repeat']} | {r['seconds']:.0f} | {r['training']:.0f} | "
            f"{r['seconds'] - r['training']:.0f} |" for r in record["runs"]]
    first = record["revisions"][0]["mean_seconds"]
    out += ["", "| `--rev` | runs | mean s | against the first |", "| ---: | ---: | ---: | ---: |"]
    out += [f"| {place[r['rev']]} | {r['runs']} | {r['mean_seconds']:.0f} | {r['mean_seconds'] / first:.2f}x |"
            for r in record["revisions"]]
    return "\n".join(out)


def _render(record: dict) -> str:
    """A record's own Markdown: its ``markdown`` field, or its script's ``render(record)`` (the script loaded from its
    file, so that ``bench/search.py`` or ``bench/training.py`` is never confused with another module of that name)."""
    import importlib.util

    if record.get("markdown"):
        return record["markdown"]
    if record.get("revisions"):
        return _timings(record)
    script = ROOT / record["command"].split()[1]  # python bench/NAME.py ...
    _bench_on_path()
    spec = importlib.util.spec_from_file_location(f"_bench_{script.stem}", script)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # a script's dataclasses look their module up there
    spec.loader.exec_module(module)
    return module.render(record)


# --------------------------------------------------------------------------------------- all


def generate() -> dict[str, str]:
    """``{page path under docs/: its content}`` of every generated page."""
    sys.path.insert(0, str(ROOT))
    makers = {"configuration": configuration, "cli": cli, "benchmarks": benchmarks, "studies": studies}
    return {page: makers[name]().rstrip() + "\n" for page, name in PAGES.items()}


def _module(name: str):
    """``docs/<name>.py`` as a module, loaded from its file (this file is run as a script and loaded by path)."""
    import importlib.util

    if str(DOCS) not in sys.path:
        sys.path.insert(0, str(DOCS))
    spec = importlib.util.spec_from_file_location(f"_docs_{name}", DOCS / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def plots():
    """``docs/plots.py`` as a module."""
    return _module("plots")


def filled() -> dict[Path, str]:
    """``{page: its text with every generated block rewritten from its records}`` of every page with blocks."""
    blocks = _module("blocks")
    return {page: blocks.fill(page.read_text(encoding="utf-8")) for page in blocks.pages()}


def write_all() -> list[Path]:
    """Write every generated page and figure whose content changed; return those files."""
    written = []
    for page, text in generate().items():
        path = DOCS / page
        path.parent.mkdir(parents=True, exist_ok=True)
        if not path.is_file() or path.read_text(encoding="utf-8") != text:
            path.write_text(text, encoding="utf-8")
            written.append(path)
    for path, text in filled().items():
        if path.read_text(encoding="utf-8") != text:
            path.write_text(text, encoding="utf-8")
            written.append(path)
    return written + plots().write_all()


if __name__ == "__main__":
    for path in write_all():
        print(f"wrote {path.relative_to(ROOT)}")
