"""A shrunk demo for end-to-end pipeline tests: sliced BEIR mirrors, overrides and a smoke profile.

The real demo profile runs unchanged except for size: scifact cut to ~60 train, 20 test queries and
the documents they judge plus distractors (nfcorpus likewise, for a second dataset), served as a BEIR
mirror folder with its own ``SHA256SUMS``; the ``minilm`` alias pointed at the tiny in-code BERT; one
epoch; 20 candidates. ``write_smoke_profile`` writes all of that as ``profiles/smoke.yaml`` into a
checkout, so that the README's demo line runs verbatim with ``PGRANK_PROFILE=smoke``.
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


_SLICED: dict[tuple, bytes] = {}  # the slices this process has cut (several tests cut the same one)


def sliced_zip(source_zip: Path, name: str, splits: dict[str, int], extra: int) -> bytes:
    """A BEIR zip of ``name`` cut to the first ``n`` queries of each split, the documents they judge and
    ``extra`` seeded distractors (members in sorted order, fixed timestamps: identical bytes every time, so a slice
    is cut once per process and handed out again while the source zip is unchanged)."""
    stat = Path(source_zip).stat()
    key = (str(Path(source_zip).resolve()), stat.st_size, stat.st_mtime_ns, name, tuple(splits.items()), extra)
    if key not in _SLICED:
        _SLICED[key] = _cut(source_zip, name, splits, extra)
    return _SLICED[key]


def _cut(source_zip: Path, name: str, splits: dict[str, int], extra: int) -> bytes:
    rng = random.Random(0)
    with zipfile.ZipFile(source_zip) as zf:
        read = lambda member: zf.read(member).decode("utf-8")  # noqa: E731
        corpus = [json.loads(line) for line in read(f"{name}/corpus.jsonl").splitlines() if line.strip()]
        queries = read(f"{name}/queries.jsonl")
        qrels = {split: read(f"{name}/qrels/{split}.tsv").splitlines() for split in splits}
    keep_rows, judged = {}, set()
    for split, n in splits.items():
        rows = [r for r in qrels[split][1:] if r.strip()]
        qids = sorted({r.split("\t")[0] for r in rows})[:n]
        keep_rows[split] = [r for r in rows if r.split("\t")[0] in set(qids)]
        judged |= {r.split("\t")[1] for r in keep_rows[split]}
    others = [d["_id"] for d in corpus if d["_id"] not in judged]
    keep = judged | set(rng.sample(others, extra))
    files = {
        f"{name}/corpus.jsonl": "".join(json.dumps(d) + "\n" for d in corpus if d["_id"] in keep),
        f"{name}/queries.jsonl": queries,
        **{f"{name}/qrels/{s}.tsv": "\r\n".join([qrels[s][0], *keep_rows[s]]) + "\r\n" for s in keep_rows},
    }
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", zipfile.ZIP_DEFLATED) as zf:
        for member in sorted(files):
            zf.writestr(zipfile.ZipInfo(member, date_time=(2020, 1, 1, 0, 0, 0)), files[member])
    return buf.getvalue()


def write_mirror(folder: Path, zips: dict[str, bytes]) -> Path:
    """``folder/NAME.zip`` for each zip, and the ``SHA256SUMS`` that covers them."""
    folder.mkdir(parents=True, exist_ok=True)
    for name, data in zips.items():
        (folder / f"{name}.zip").write_bytes(data)
    (folder / "SHA256SUMS").write_text("".join(f"{hashlib.sha256(data).hexdigest()}  {name}.zip\n"
                                               for name, data in sorted(zips.items())))
    return folder


def sliced_scifact_mirror(source_zip: Path, folder: Path, *, train: int = 60, test: int = 20, extra: int = 150) -> Path:
    """Write ``folder/scifact.zip`` (a slice of the real one) and ``folder/SHA256SUMS``."""
    return write_mirror(folder, {"scifact": sliced_zip(source_zip, "scifact", {"train": train, "test": test}, extra)})


def sliced_mirror(source: Path, folder: Path) -> Path:
    """Sliced scifact (60 train, 20 test queries) and nfcorpus (15 test queries) from the mirror ``source``."""
    return write_mirror(folder, {
        "scifact": sliced_zip(source / "scifact.zip", "scifact", {"train": 60, "test": 20}, 150),
        "nfcorpus": sliced_zip(source / "nfcorpus.zip", "nfcorpus", {"test": 15}, 100),
    })


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
        "data.eval_sets=[scifact/test]",  # the sliced mirrors: no nfcorpus out-of-domain validation
        "train.validation_sets=[]",
        "train.selection={rule: last, patience: null}",
    ]


def write_smoke_profile(project: Path, tiny_model_dir: Path, name: str = "smoke") -> Path:
    """``profiles/<name>.yaml`` in ``project``: the demo profile with :func:`shrunk_overrides` applied."""
    import yaml

    doc = yaml.safe_load((project / "profiles" / "demo.yaml").read_text())
    for override in shrunk_overrides(tiny_model_dir):
        key, _, value = override.partition("=")
        *head, last = key.split(".")
        node = doc
        for part in head:
            node = node.setdefault(part, {})
        node[last] = yaml.safe_load(value)
    doc["paths"]["root"] = f"runs/{name}"
    path = project / "profiles" / f"{name}.yaml"
    path.write_text("# The shrunk demo (tests/shrunk.py): the demo profile, tiny model, sliced data.\n"
                    + yaml.safe_dump(doc, sort_keys=False))
    return path


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
