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
GPU's entry says which command and record it came from (``source``) and the data path its rates were measured on
(``data_path``, one of :data:`pgrank.pipeline.rates.DATA_PATHS`: :func:`data_path`), from which ``pgrank plan`` tells
rates that predate the code it prices. The file is written atomically.
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


def data_path(record: dict, given: str | None = None) -> str:
    """The data path ``record``'s rates were measured on: ``given``, else the record's own ``data_path``, else what its
    step shows (a step cut by ``chunk_tokens`` ran the packed path; one of ``grad_chunk_size`` documents, the padded).

    Raises:
        ValueError: none of these says, or it names a path :data:`pgrank.pipeline.rates.DATA_PATHS` does not know.
    """
    from pgrank.pipeline.rates import DATA_PATHS

    step = record.get("step") or {}
    path = given or record.get("data_path") or ("packed" if "chunk_tokens" in step else
                                               "padded" if "grad_chunk_size" in step else None)
    if path is None:
        raise ValueError("the record does not say which data path its rates were measured on (no data_path, no step): "
                         f"name it ({', '.join(DATA_PATHS)})")
    if path not in DATA_PATHS:
        raise ValueError(f"data path {path!r}: expected one of {', '.join(DATA_PATHS)}")
    return path


def _opening_comment(text: str) -> str:
    lines = []
    for line in text.splitlines():
        if not line.startswith("#"):
            break
        lines.append(line)
    return "\n".join(lines) + ("\n" if lines else "")


def write_rates(record: dict, table: Path, source: str, path: str | None = None) -> dict:
    """Put ``record``'s GPU rates into the YAML ``table`` (created if missing); returns the GPU's new entry.

    Args:
        record: a ``bench/gpu.py`` record.
        table: the rates table.
        source: the command and record the rates come from, as the entry names them.
        path: the data path they were measured on (default: :func:`data_path` of the record).

    Raises:
        ValueError: the record was not measured on a GPU, measured nothing the table holds, or does not say which
            data path it was measured on.
    """
    from pgrank.atomic import write_text

    device = (record.get("machine") or {}).get("gpu")
    if not device:
        raise ValueError("the record was not measured on a GPU: its rates cannot price a GPU in the table")
    entry = device_rates(record)
    if not entry:
        raise ValueError("the record holds no encoding, training or step rates")
    path = data_path(record, path)
    text = table.read_text(encoding="utf-8") if table.exists() else ""
    current = (yaml.safe_load(text) if text else None) or {}
    architectures = current.get("architectures") or {}
    devices = dict(current.get("devices") or {})
    devices[device] = {"source": source, "data_path": path, **entry}
    body = (yaml.safe_dump({"architectures": architectures}, sort_keys=False, default_flow_style=False)
            + yaml.safe_dump({"devices": devices}, sort_keys=False, default_flow_style=None, width=120))
    write_text(table, _opening_comment(text) + body)
    return devices[device]


def merged(records: list[dict]) -> dict:
    """One record of the shape :func:`write_rates` reads from ``bench/gpu_check.py``'s section records: the step at
    the first chunk budget (``train.chunk_tokens``, what a run uses) with the warm start's training rates, and the
    encoders' rates; sections that failed or were skipped add nothing. Their data path is ``packed`` (token stores,
    chunks cut by a token budget)."""
    out: dict = {"data_path": "packed", "sections": []}
    for record in records:
        if record.get("status") not in ("ok", "running"):
            continue
        out.setdefault("machine", record.get("machine"))
        out["sections"].append(record.get("section"))
        if record.get("section") == "step" and record.get("budgets"):
            out["step"] = record["budgets"][0]
            if record.get("training"):
                out["training"] = record["training"]
        elif record.get("section") == "encoders":
            out["encoding"] = record.get("encoding", [])
    return out


def main(argv: list[str] | None = None) -> None:
    """``python3 bench/rates_table.py RECORD... [--table PATH]``: the rates of ``bench/gpu_check.py``'s section records
    (or of one ``bench/gpu.py`` record) into the rates table."""
    import argparse
    import json

    parser = argparse.ArgumentParser(description=main.__doc__.split("\n\n")[0])
    parser.add_argument("records", type=Path, nargs="+", help="bench/gpu_check.py's section records, or a gpu.py record")
    parser.add_argument("--table", type=Path, default=Path(__file__).resolve().parents[1] / "pgrank" / "pipeline"
                        / "measured_rates.yaml", help="the rates table (default: the package's)")
    args = parser.parse_args(argv)
    loaded = [json.loads(p.read_text(encoding="utf-8")) for p in args.records]
    record = merged(loaded) if all("section" in r for r in loaded) else loaded[0]
    command = loaded[0].get("command", "").split(" --", 1)[0] or "bench/gpu_check.py"
    names = ", ".join(f"bench/out/{p.name}" for p in args.records)
    entry = write_rates(record, args.table, f"{command} (records {names})")
    print(f"-> {args.table}: {record['machine']['gpu']}: {', '.join(k for k in entry if k not in ('source', 'data_path'))}")


if __name__ == "__main__":
    import sys

    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    main()
