"""The table that prices ``pgrank plan``, written from a ``bench/gpu.py`` record: ``pgrank/pipeline/measured_rates.yaml``.

A record's GPU gets, for each architecture (:data:`ARCHITECTURES`: the record's encoder labels as the table names
them), what :mod:`pgrank.pipeline.rates` reads:

* ``inference``: documents a second by tokens, under the backend the stages pick on a GPU (``models.backend: auto``:
  bf16 weights for the dense models; SPLADE in float32);
* ``grad``: the warm start's forward and backward texts a second by tokens (documents and queries, as the record
  measured them in cached-gradient chunks);
* ``step``: the whole ``tower: both`` step at the paper's shape, in seconds per candidate document, at the step's
  mean real tokens per document.

Rates of other GPUs in the table are kept, and so are the table's architecture names and its opening comment; the
GPU's entry says which command and record it came from (``source``). The file is written atomically.
"""

from __future__ import annotations

from pathlib import Path

import yaml

# bench/gpu.py's encoder labels -> the table's architecture names, and the backend whose rates price them.
ARCHITECTURES = {"gtr-t5-xl": ("t5-xl", "torch-bf16"), "distilbert (sbert, tas-b)": ("distilbert", "torch-bf16"),
                 "splade": ("splade-distilbert", "torch")}
WARM_START = "distilbert (sbert, tas-b)"  # the architecture whose training rates bench/gpu.py measures


def device_rates(record: dict) -> dict:
    """The table entry of ``record``'s GPU: ``{architecture: {inference, grad, step}}``, with what it measured."""
    entry: dict = {}
    for label, (arch, backend) in ARCHITECTURES.items():
        rows = [r for r in record.get("encoding", []) if r["model"] == label and r["backend"] == backend]
        if rows:
            entry.setdefault(arch, {})["inference"] = {int(r["tokens"]): float(r["docs_per_s"]) for r in rows}
    arch = ARCHITECTURES[WARM_START][0]
    if record.get("training"):
        entry.setdefault(arch, {})["grad"] = {int(r["tokens"]): float(r["texts_per_s"])
                                              for r in sorted(record["training"], key=lambda r: r["tokens"])}
    step = record.get("step")
    if step and step.get("mean_tokens"):
        entry.setdefault(arch, {})["step"] = {"tokens": int(round(step["mean_tokens"])),
                                              "seconds_per_document": round(step["seconds"] / step["documents"], 7)}
    return entry


def _opening_comment(text: str) -> str:
    lines = []
    for line in text.splitlines():
        if not line.startswith("#"):
            break
        lines.append(line)
    return "\n".join(lines) + ("\n" if lines else "")


def write_rates(record: dict, table: Path, source: str) -> dict:
    """Put ``record``'s GPU rates into the YAML ``table`` (created if missing); returns the GPU's new entry.

    Raises:
        ValueError: the record was not measured on a GPU, or measured nothing the table holds.
    """
    from pgrank.atomic import write_text

    device = (record.get("machine") or {}).get("gpu")
    if not device:
        raise ValueError("the record was not measured on a GPU: its rates cannot price a GPU in the table")
    entry = device_rates(record)
    if not entry:
        raise ValueError("the record holds no encoding, training or step rates")
    text = table.read_text(encoding="utf-8") if table.exists() else ""
    current = (yaml.safe_load(text) if text else None) or {}
    architectures = current.get("architectures") or {}
    devices = dict(current.get("devices") or {})
    devices[device] = {"source": source, **entry}
    body = (yaml.safe_dump({"architectures": architectures}, sort_keys=False, default_flow_style=False)
            + yaml.safe_dump({"devices": devices}, sort_keys=False, default_flow_style=None, width=120))
    write_text(table, _opening_comment(text) + body)
    return devices[device]
