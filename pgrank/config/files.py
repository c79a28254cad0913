"""Reading the params files: YAML with the line each key was written on, a profile and ``--set`` overrides laid
over it, and the messages of configuration errors, which name that file and line (:func:`format_problem`)."""

from __future__ import annotations

from pathlib import Path

import yaml

from pgrank.errors import ConfigError


def key_lines(node: yaml.Node, prefix: tuple = ()) -> dict[tuple, int]:
    """Map every dotted key path of a composed YAML document to its 1-based line number."""
    lines: dict[tuple, int] = {}
    if isinstance(node, yaml.MappingNode):
        for key_node, value_node in node.value:
            path = prefix + (key_node.value,)
            lines[path] = key_node.start_mark.line + 1
            lines.update(key_lines(value_node, path))
    elif isinstance(node, yaml.SequenceNode):
        for i, item in enumerate(node.value):
            lines[prefix + (i,)] = item.start_mark.line + 1
            lines.update(key_lines(item, prefix + (i,)))
    return lines


def read_yaml(path: Path) -> tuple[dict, dict[tuple, str]]:
    """The document and, for every key path, where it was written (``file:line``)."""
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise ConfigError(f"{path}: no such file") from None
    try:
        node = yaml.compose(text)
        doc = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f"{path}:{mark.line + 1}" if mark else str(path)
        raise ConfigError(f"{where}: not valid YAML ({getattr(exc, 'problem', exc)})") from None
    if doc is not None and not isinstance(doc, dict):
        raise ConfigError(f"{path}: expected a mapping of sections at the top level")
    lines = key_lines(node) if node is not None else {}
    return doc or {}, {key: f"{path}:{line}" for key, line in lines.items()}


def merge(base: dict, overlay: dict) -> dict:
    """Deep merge: mappings merge key by key, anything else (lists too) is replaced."""
    out = dict(base)
    for key, value in overlay.items():
        out[key] = merge(out[key], value) if isinstance(value, dict) and isinstance(out.get(key), dict) else value
    return out


def set_override(doc: dict, override: str) -> None:
    if "=" not in override:
        raise ConfigError(f"override {override!r}: expected KEY=VALUE, e.g. train.epochs=2")
    key, raw = override.split("=", 1)
    parts = key.strip().split(".")
    node = doc
    for part in parts[:-1]:
        nxt = node.get(part) if isinstance(node, dict) else None
        if nxt is None:
            nxt = node[part] = {}
        if not isinstance(nxt, dict):
            raise ConfigError(f"override {override!r}: {'.'.join(parts[:-1])} is not a section")
        node = nxt
    node[parts[-1]] = yaml.safe_load(raw) if raw.strip() else None


def format_problem(default: str, origins: dict[tuple, str], loc: tuple, msg: str) -> str:
    # Walk up the key path to the nearest key whose origin is known (missing keys have none).
    where = default
    for cut in range(len(loc), 0, -1):
        if loc[:cut] in origins:
            where = origins[loc[:cut]]
            break
    return f"{where}: {'.'.join(str(p) for p in loc)}: {msg}"


def pydantic_message(err: dict) -> str:
    kind, msg = err["type"], err["msg"]
    if kind == "extra_forbidden":
        return "unknown key"
    if kind == "missing":
        return "required key is missing"
    got = err.get("input")
    msg = msg[0].lower() + msg[1:] if msg else msg
    msg = msg.removeprefix("value error, ")
    if not isinstance(got, (dict, list)):
        msg += f" (got {got!r})"
    return msg

