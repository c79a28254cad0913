"""The demo's time against an earlier revision of pgrank, on one machine: ``python bench/demo_time.py``.

A change that adds work to the demo (a regulariser, more validation) is judged by how much longer ``pgrank demo``
takes on the same machine, not by stage times taken on different days or CPUs. Each ``--rev`` is cloned from this
checkout into ``--work`` (a fresh clone per run, so every run builds everything from nothing: datasets, the ONNX
export, corpus embeddings, candidates, training and evaluation) and ``pgrank demo`` runs there with that revision's
code first on ``PYTHONPATH``, under this interpreter and its installed packages. The runs are interleaved (A, B, A,
B, ...) so that a machine growing slower or faster during the benchmark weighs on every revision alike. A ``--rev``
may carry ``--set KEY=VALUE`` overrides after the revision (``--rev "HEAD --set models.backends.minilm=auto"``):
that run is ``pgrank --set KEY=VALUE demo``, so one revision can be timed under another setting beside itself.

Recorded per run: the wall time of ``pgrank demo``, the stage walls it logs (``pgrank: <stage>: wall X s``; a
process running several stages logs its own wall since it started after each) and the training stages' sum;
printed: each run with its training time and the rest, and each revision's mean with its ratio to the first
revision's.

Each run's wall is also split three ways: encoding, training, and everything else (process starts, imports, DVC,
MLflow, search, evaluation's arithmetic). Encoding is the time of every corpus-embedding artifact the demo built, from
its ``plan.json`` to its ``meta.json`` (the encoder's loading included; queries, a few hundred short texts, are
left in everything else). Its share of the CPU's float32 peak is the artifacts' arithmetic (their documents' real
tokens, up to the artifact's length, times the model's weight-product FLOPs a token, counted as
``bench/backends.py`` counts them) over those seconds, against a large float32 dense product timed on the same
machine after the runs (``bench/flops.py``'s ``measured_peak``, as ``bench/backends.py`` measures it).

Writes ``bench/out/demo_time.json`` (``--out``) with the machine, and prints the table.

Example:
    $ python bench/demo_time.py --work W --mirror M --rev v1 --rev HEAD \\
        --repeats 2
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import shutil
import statistics
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from record import add_out_option, new_record, save, table  # noqa: E402
from scale import RESOURCES  # noqa: E402  the stage processes' resource lines, as bench/scale.py reads them

ROOT = Path(__file__).resolve().parents[1]


def stage_walls(output: str) -> dict[str, float]:
    """``{stage: seconds}`` from the ``pgrank: <stage>: wall X s, peak RSS Y MiB`` lines of a run's output, also where
    a progress bar shares the line (a stage logged twice keeps its last figure)."""
    return {m["name"]: float(m["wall"]) for m in RESOURCES.finditer(output)}


def training_seconds(walls: dict[str, float]) -> float:
    """The training stages' walls (``train-<warm start>``), summed."""
    return sum(seconds for stage, seconds in walls.items() if stage.startswith("train-"))


def artifact_seconds(embeddings: Path) -> list[dict]:
    """The corpus-embedding artifacts under ``embeddings`` (a workspace's ``paths.embeddings``) that are complete:
    each one's plan (corpus checksum, documents, length) and ``seconds``, from its ``plan.json`` to its ``meta.json``."""
    out = []
    for plan_file in sorted(embeddings.glob("*/plan.json")):
        meta = plan_file.with_name("meta.json")
        if meta.is_file():
            plan = json.loads(plan_file.read_text(encoding="utf-8"))
            out.append({"folder": plan_file.parent.name, "corpus_sha256": plan["corpus_sha256"],
                        "documents": int(plan["num_docs"]), "max_seq_length": int(plan["max_seq_length"]),
                        "seconds": meta.stat().st_mtime - plan_file.stat().st_mtime})
    return out


def corpus_files(root: Path, data: Path) -> dict[str, Path]:
    """``{corpus.jsonl checksum: its file}`` of the datasets a workspace installed (``<root>/datasets/*.json``)."""
    out = {}
    for record in root.glob("datasets/*.json"):
        facts = json.loads(record.read_text(encoding="utf-8"))
        sha = facts.get("files", {}).get("corpus.jsonl")
        if sha:
            out[sha] = data / facts.get("dataset", record.stem) / "corpus.jsonl"
    return out


def document_texts(corpus: Path) -> list[str]:
    """A BEIR corpus's documents as encoded: ``(title + " " + text).strip()``."""
    with corpus.open(encoding="utf-8") as f:
        return [f"{d.get('title') or ''} {d.get('text') or ''}".strip() for d in map(json.loads, f)]


def split_wall(seconds: float, training: float, encoding: dict) -> dict:
    """A run's wall in three: encoding (its seconds and share of the float32 peak), training, everything else."""
    rest = seconds - training - encoding["seconds"]
    return {"encoding_s": encoding["seconds"], "encoding_peak_share": encoding.get("peak_share"),
            "training_s": training, "else_s": rest, "else_share": rest / seconds}


def encoding_work(artifacts: list[dict], corpora: dict[str, Path], tokens_of, flops_per_token: float) -> dict:
    """The artifacts' seconds, documents, real tokens (``tokens_of(texts, max_length)``) and FLOPs, summed."""
    tokens = sum(tokens_of(document_texts(corpora[a["corpus_sha256"]]), a["max_seq_length"]) for a in artifacts)
    return {"artifacts": len(artifacts), "seconds": sum(a["seconds"] for a in artifacts),
            "documents": sum(a["documents"] for a in artifacts), "tokens": tokens, "flops": tokens * flops_per_token}


class Arithmetic:
    """The warm start's tokenizer and weight-product FLOPs a real token (PyTorch's flop counter over passages encoded
    one by one, as ``bench/backends.py`` counts them), loaded once."""

    def __init__(self, params, paths, sample: list[str]):
        from flops import counted_flops
        from pgrank.models.backends import load_inference_encoder

        self.encoder, _ = load_inference_encoder(params.mine.model, params.models, paths, backend="torch",
                                                 max_seq_length=params.mine.max_seq_length)
        counted = counted_flops(lambda: [self.encoder.encode_document([t], batch_size=1) for t in sample])
        self.flops_per_token = counted / self.tokens(sample, params.mine.max_seq_length)

    def tokens(self, texts: list[str], max_length: int) -> int:
        ids = self.encoder.tokenizer(texts, truncation=True, max_length=max_length)["input_ids"]
        return sum(map(len, ids))


def measure_encoding(folder: Path, overrides: Sequence[str], arithmetic: "Arithmetic | None") -> tuple[dict, "Arithmetic"]:
    """The encoding work of the demo run in the clone ``folder`` (read before the clone is removed)."""
    from pgrank.config import load_params
    from pgrank.paths import Paths

    sets = [value for flag, value in zip(overrides[::2], overrides[1::2]) if flag == "--set"]
    params = load_params(folder / "params.yaml", sets, profile="demo")
    paths = Paths.from_config(params.paths, base=folder)
    artifacts = artifact_seconds(paths.embeddings)
    corpora = corpus_files(paths.root, paths.data)
    artifacts = [a for a in artifacts if a["corpus_sha256"] in corpora]
    if arithmetic is None:
        first = document_texts(corpora[artifacts[0]["corpus_sha256"]]) if artifacts else ["a passage"]
        arithmetic = Arithmetic(params, paths, first[:: max(1, len(first) // 32)][:32])
    return encoding_work(artifacts, corpora, arithmetic.tokens, arithmetic.flops_per_token), arithmetic


def parse_rev(spec: str) -> tuple[str, list[str]]:
    """``"REV --set K=V ..."`` -> ``(REV, ["--set", "K=V", ...])``: a revision and the overrides its demo runs with."""
    words = shlex.split(spec)
    if not words or words[0].startswith("-"):
        raise SystemExit(f"--rev {spec!r}: expected a git revision first, then optional --set KEY=VALUE")
    rev, rest = words[0], words[1:]
    if len(rest) % 2 or any(flag != "--set" or "=" not in value for flag, value in zip(rest[::2], rest[1::2])):
        raise SystemExit(f"--rev {spec!r}: after the revision only --set KEY=VALUE pairs may follow")
    return rev, rest


def clone(rev: str, folder: Path) -> str:
    """A fresh clone of this checkout at ``rev``; returns its full commit id."""
    if folder.exists():
        shutil.rmtree(folder)
    for command in (["git", "clone", "--quiet", str(ROOT), str(folder)],
                    ["git", "-C", str(folder), "checkout", "--quiet", rev]):
        done = subprocess.run(command, capture_output=True, text=True)
        if done.returncode != 0:
            raise SystemExit(f"--rev {rev}: `{shlex.join(command)}` failed: {done.stderr.strip()}")
    return subprocess.run(["git", "-C", str(folder), "rev-parse", "HEAD"], check=True, capture_output=True,
                          text=True).stdout.strip()


def run_demo(folder: Path, mirror: Path, log: Path, overrides: Sequence[str] = ()) -> tuple[int, float, str]:
    """``pgrank [--set K=V ...] demo`` in ``folder`` with that clone's code imported first; ``(exit code, wall seconds,
    output)``."""
    env = dict(os.environ, PYTHONPATH=str(folder), PGRANK_BEIR_MIRROR=str(mirror))
    pgrank = Path(sys.executable).parent / "pgrank"
    start = time.perf_counter()
    with log.open("w", encoding="utf-8") as out:
        code = subprocess.run([str(pgrank), *overrides, "demo"], cwd=folder, env=env, stdout=out, stderr=subprocess.STDOUT).returncode
    wall = time.perf_counter() - start
    return code, wall, log.read_text(encoding="utf-8", errors="replace")


def render(record: dict) -> str:
    revs = record["revisions"]
    rows = [[r["rev"], r["commit"][:10], r["repeat"], f"{r['seconds']:.0f}", f"{r['training']:.0f}",
             f"{r['seconds'] - r['training']:.0f}"] for r in record["runs"]]
    lines = table(["revision", "commit", "run", "`pgrank demo` s", "training s", "the rest s"], rows, "llrrrr")
    split = [r for r in record["runs"] if "split" in r]
    if split:
        lines += ["", *table(["revision", "run", "encoding s", "its share of the float32 peak", "training s",
                              "everything else s", "everything else, share of the wall"],
                             [[r["rev"], r["repeat"], f"{r['split']['encoding_s']:.0f}",
                               "-" if r["split"]["encoding_peak_share"] is None
                               else f"{100 * r['split']['encoding_peak_share']:.1f}%",
                               f"{r['split']['training_s']:.0f}", f"{r['split']['else_s']:.0f}",
                               f"{100 * r['split']['else_share']:.1f}%"] for r in split], "lrrrrrr")]
    first = revs[0]["mean_seconds"]
    lines += ["", *table(["revision", "runs", "mean s", "against the first"],
                         [[r["rev"], r["runs"], f"{r['mean_seconds']:.0f}", f"{r['mean_seconds'] / first:.2f}x"]
                          for r in revs], "lrrr")]
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--work", type=Path, required=True, help="where the clones and their runs go")
    parser.add_argument("--mirror", type=Path, required=True, help="a local copy of BEIR's download server")
    parser.add_argument("--rev", action="append", required=True, help="a git revision of this checkout, optionally "
                        "followed by --set KEY=VALUE overrides for its demo (repeatable)")
    parser.add_argument("--repeats", type=int, default=1)
    add_out_option(parser, __file__)
    args = parser.parse_args()
    specs = [parse_rev(spec) for spec in args.rev]  # a malformed --rev stops before any run
    mirror = args.mirror.resolve()
    args.work.mkdir(parents=True, exist_ok=True)
    runs, arithmetic = [], None
    for repeat in range(1, args.repeats + 1):
        for i, (rev, (checkout, overrides)) in enumerate(zip(args.rev, specs)):
            folder = args.work / f"rev{i}-run{repeat}"
            commit = clone(checkout, folder)
            code, wall, output = run_demo(folder, mirror, args.work / f"rev{i}-run{repeat}.log", overrides)
            if code != 0:
                raise SystemExit(f"{rev}: pgrank demo exited {code}; its output: {args.work / f'rev{i}-run{repeat}.log'}")
            walls = stage_walls(output)
            encoding, arithmetic = measure_encoding(folder, overrides, arithmetic)
            runs.append({"rev": rev, "commit": commit, "repeat": repeat, "seconds": wall, "walls": walls,
                         "training": training_seconds(walls), "encoding": encoding})
            print(f"{rev} ({commit[:10]}) run {repeat}: {wall:.0f} s, encoding {encoding['seconds']:.0f} s", flush=True)
            shutil.rmtree(folder)  # the next run of this revision builds everything again
    from flops import measured_peak, share

    peak = round(measured_peak("cpu", "float32", seconds=1.0, n=2048), 4)  # as bench/backends.py measures it
    for r in runs:
        e = r["encoding"]
        e["peak_share"] = share(e["flops"], 1.0 / e["seconds"], peak) if e["seconds"] > 0 else None
        r["split"] = split_wall(r["seconds"], r["training"], e)
    revisions = [{"rev": rev, "runs": len(mine), "mean_seconds": statistics.mean(r["seconds"] for r in mine)}
                 for rev in args.rev for mine in [[r for r in runs if r["rev"] == rev]]]
    record = new_record("The demo's time against an earlier revision, on one machine")
    record.update(revisions=revisions, runs=runs, float32_peak_tflops=peak)
    save(record, args.out, render)


if __name__ == "__main__":
    main()
