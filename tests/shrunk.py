"""A shrunk demo for end-to-end pipeline tests: a sliced scifact mirror and overrides.

The real demo profile runs unchanged except for size: scifact cut to ~60 train, 20 test queries and
the documents they judge plus distractors, served as a BEIR mirror folder with its own
``SHA256SUMS``; the ``minilm`` alias pointed at the tiny in-code BERT; one epoch; 20 candidates.
``project_copy`` makes a temporary git checkout of the working tree to run DVC in.
"""

from __future__ import annotations

import hashlib
import io
import json
import random
import shutil
import subprocess
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def sliced_scifact_mirror(source_zip: Path, folder: Path, *, train: int = 60, test: int = 20, extra: int = 150) -> Path:
    """Write ``folder/scifact.zip`` (a slice of the real one) and ``folder/SHA256SUMS``."""
    rng = random.Random(0)
    with zipfile.ZipFile(source_zip) as zf:
        read = lambda name: zf.read(name).decode("utf-8")  # noqa: E731
        corpus = [json.loads(line) for line in read("scifact/corpus.jsonl").splitlines() if line.strip()]
        queries = read("scifact/queries.jsonl")
        qrels = {split: read(f"scifact/qrels/{split}.tsv").splitlines() for split in ("train", "test")}
    keep_rows, judged = {}, set()
    for split, n in (("train", train), ("test", test)):
        rows = [r for r in qrels[split][1:] if r.strip()]
        qids = sorted({r.split("\t")[0] for r in rows})[:n]
        keep_rows[split] = [r for r in rows if r.split("\t")[0] in set(qids)]
        judged |= {r.split("\t")[1] for r in keep_rows[split]}
    others = [d["_id"] for d in corpus if d["_id"] not in judged]
    keep = judged | set(rng.sample(others, extra))
    files = {
        "scifact/corpus.jsonl": "".join(json.dumps(d) + "\n" for d in corpus if d["_id"] in keep),
        "scifact/queries.jsonl": queries,
        **{f"scifact/qrels/{s}.tsv": "\r\n".join([qrels[s][0], *keep_rows[s]]) + "\r\n" for s in keep_rows},
    }
    folder.mkdir(parents=True, exist_ok=True)
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", zipfile.ZIP_DEFLATED) as zf:
        for name in sorted(files):
            zf.writestr(zipfile.ZipInfo(name, date_time=(2020, 1, 1, 0, 0, 0)), files[name])
    (folder / "scifact.zip").write_bytes(buf.getvalue())
    digest = hashlib.sha256(buf.getvalue()).hexdigest()
    (folder / "SHA256SUMS").write_text(f"{digest}  scifact.zip\n")
    return folder


def shrunk_overrides(tiny_model_dir: Path) -> list[str]:
    """``--set`` overrides that shrink the demo profile to a one-minute pipeline."""
    return [
        f"models.aliases.minilm={tiny_model_dir}",
        "data.validation_size=10",
        "mine.candidates=20",
        "mine.max_seq_length=64",
        "train.max_doc_length=64",
        "evaluate.max_seq_length=64",
        "train.epochs=1",
        "train.keep_epochs=[0, 1]",
        "train.batch_size=16",
        "train.pg.num_samples=16",
        "evaluate.policy_epochs=[]",
        "evaluate.top_k=100",
    ]


def project_copy(dest: Path) -> Path:
    """A temporary git checkout of the working tree (tracked and untracked-but-not-ignored files)."""
    names = subprocess.run(["git", "ls-files", "-co", "--exclude-standard", "-z"], cwd=ROOT, capture_output=True,
                           check=True).stdout.decode().split("\0")
    for name in filter(None, names):
        src = ROOT / name
        if src.is_file():
            (dest / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, dest / name)
    subprocess.run(["git", "init", "-q"], cwd=dest, check=True)
    subprocess.run(["git", "add", "-A"], cwd=dest, check=True)
    subprocess.run(["git", "-c", "user.email=t@t", "-c", "user.name=t", "commit", "-qm", "snapshot"], cwd=dest, check=True)
    return dest
