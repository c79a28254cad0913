"""The bad-input catalogue: what a user can get wrong, and what pgrank must answer (docs/errors.md).

Each :class:`Case` builds a small project in its own folder (a params file whose paths point inside
it, a toy BEIR dataset, a mirror of crafted zips, candidate files, model folders), then names the
``pgrank`` command a user would run there. tests/errors/test_bad_input.py runs every command through
the real CLI and requires a one-line error naming the file, line or key (``expect``, a regex), the exit
code, no traceback, and the folder exactly as it was before (``keeps``: the one documented exception).
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import shutil
import stat
import subprocess
import sys
import zipfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import yaml
from toy_project import write_dataset

ROOT = Path(__file__).resolve().parents[2]
MINILM = "sentence-transformers/all-MiniLM-L6-v2"


@dataclass(frozen=True)
class Case:
    """One bad input: ``setup(folder)`` writes it and returns the ``pgrank`` arguments to run."""

    id: str
    area: str
    input: str  # for the docs table
    setup: Callable[[Path], list[str]]
    expect: str  # regex the error line must match (it names the file, line or key)
    exit: int = 2
    fsize_limit: int | None = None  # RLIMIT_FSIZE of the command (ulimit -f): a full disk
    read_only: bool = False  # the folder is read-only for the command
    keeps: str = ""  # a documented change the command may leave (regex of paths), e.g. a resumable download


# --------------------------------------------------------------------------------------- building blocks


def params(folder: Path, **changes) -> Path:
    """``folder/params.yaml``: the committed params, paths inside ``folder``, the toy dataset, no tracking."""
    doc = yaml.safe_load((ROOT / "params.yaml").read_text())
    doc["paths"] = {"root": "runs", "data": "data", "embeddings": "embeddings"}
    doc["tracking"]["enabled"] = False
    doc["data"].update({"train": "toy/train", "validation_size": 6, "eval_sets": ["toy/train"], "mirror": None})
    doc["train"]["warm_starts"] = ["minilm"]
    doc["evaluate"]["systems"] = {"bm25": ["bm25"], "dense": ["minilm"], "sparse": []}
    doc["evaluate"]["policy_epochs"] = []
    for key, value in changes.items():
        node = doc
        *head, last = key.split("__")
        for part in head:
            node = node[part]
        node[last] = value
    path = folder / "params.yaml"
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    return path


def toy_files(folder: Path) -> dict[str, bytes]:
    """The toy BEIR dataset as zip members ``toy/...``."""
    src = folder / ".toy-src"
    write_dataset(src)
    files = {f"toy/{p.relative_to(src).as_posix()}": p.read_bytes() for p in sorted(src.rglob("*")) if p.is_file()}
    shutil.rmtree(src)
    return files


def zip_bytes(files: dict[str, bytes], *, links: dict[str, str] | None = None) -> bytes:
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", zipfile.ZIP_DEFLATED) as zf:
        for name, data in files.items():
            zf.writestr(zipfile.ZipInfo(name, date_time=(2020, 1, 1, 0, 0, 0)), data, zipfile.ZIP_DEFLATED)
        for name, target in (links or {}).items():
            info = zipfile.ZipInfo(name, date_time=(2020, 1, 1, 0, 0, 0))
            info.external_attr = (stat.S_IFLNK | 0o777) << 16
            zf.writestr(info, target)
    return buf.getvalue()


def mirror(folder: Path, data: bytes, *, listed: bytes | None = None, name: str = "toy") -> Path:
    """``folder/mirror`` holding ``NAME.zip`` and a ``SHA256SUMS`` (of ``listed``, default the zip itself)."""
    where = folder / "mirror"
    where.mkdir(parents=True, exist_ok=True)
    (where / f"{name}.zip").write_bytes(data)
    (where / "SHA256SUMS").write_text(f"{hashlib.sha256(listed if listed is not None else data).hexdigest()}  {name}.zip\n")
    return where


def download_of(edit: Callable[[dict[str, bytes]], dict[str, bytes]]) -> Callable[[Path], list[str]]:
    """A case setup: the toy zip changed by ``edit``, served by a folder mirror, then ``pgrank download toy``."""

    def setup(folder: Path) -> list[str]:
        params(folder)
        where = mirror(folder, zip_bytes(edit(toy_files(folder))))
        return ["download", "toy", "--mirror", str(where)]

    return setup


def replace(member: str, old: bytes, new: bytes, count: int = 1):
    def edit(files):
        assert old in files[member], (member, old)
        return {**files, member: files[member].replace(old, new, count)}
    return edit


def line(member: str, number: int, text: bytes):
    """Replace line ``number`` (1-based) of ``member``."""
    def edit(files):
        lines = files[member].split(b"\n")
        lines[number - 1] = text
        return {**files, member: b"\n".join(lines)}
    return edit


def installed(folder: Path, **changes) -> Path:
    """A project whose toy dataset is already downloaded (``data/toy``), with its carve-out."""
    params(folder, **changes)
    write_dataset(folder / "data" / "toy")
    return folder


PUBLISHED = "toy_candidate-set_gtrxl+gt_1000_test.json"  # the authors' file name for toy/test (mine.published_dir)


def published(lines: list[dict | str] | None) -> Callable[[Path], list[str]]:
    """A case setup: the installed toy dataset with a ``test`` split, the authors' candidate file for it in
    ``published/`` (one JSON record per line; a string is written as is; ``None``: no file), then ``pgrank mine``
    from it.

    Candidate files a user brings are the authors' published sets (``mine.source: published``); the
    TREC runs pgrank writes beside its candidate stores are outputs, read by no stage.
    """

    def setup(folder: Path) -> list[str]:
        installed(folder, mine__source="published", mine__published_dir="published")
        shutil.copy(folder / "data" / "toy" / "qrels" / "train.tsv", folder / "data" / "toy" / "qrels" / "test.tsv")
        (folder / "published").mkdir()
        if lines is not None:
            text = "".join((x if isinstance(x, str) else json.dumps(x)) + "\n" for x in lines)
            (folder / "published" / PUBLISHED).write_text(text)
        return ["mine", "--dataset", "toy", "--split", "test"]

    return setup


def _record(qid: str = "q0-0", n: int = 3) -> dict:
    return {"qid": qid, "topk": {f"d0-{i}": 10.5 - i for i in range(n)}}


def damaged_store(folder: Path) -> list[str]:
    """A candidate store whose rows file was cut short (a disk that filled, a copy that stopped), then reranked."""
    installed(folder)
    subprocess.run([sys.executable, str(ROOT / "cli.py"), "--set", "mine.source=bm25", "mine", "--dataset", "toy"],
                   cwd=folder, check=True, capture_output=True, timeout=600,
                   env={**{k: v for k, v in os.environ.items() if k not in ("PGRANK_PROFILE", "MLFLOW_TRACKING_URI")},
                        "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"})
    rows = folder / "runs" / "candidates" / "toy" / "train" / "rows.i32"
    assert rows.is_file(), sorted(str(p.relative_to(folder)) for p in folder.rglob("*"))
    rows.write_bytes(rows.read_bytes()[:100])
    return ["evaluate", "--system", "bm25", "--dataset", "toy"]


def model_folder(folder: Path, tiny: Path, *, pickles_only: bool = False, no_weights: bool = False) -> Path:
    """A copy of the tiny sentence-transformers model with its weights pickled, or without weights."""
    dest = folder / "my-model"
    shutil.copytree(tiny, dest)
    for weights in dest.rglob("*.safetensors"):
        if pickles_only:
            weights.with_name("pytorch_model.bin").write_bytes(b"\x80\x04 pickled weights")
        weights.unlink()
    return dest


def with_model(make: Callable[[Path], dict]) -> Callable[[Path], list[str]]:
    """A case setup: the installed toy dataset, ``params.yaml`` changed by ``make(folder)``, the dense system evaluated."""

    def setup(folder: Path) -> list[str]:
        installed(folder, **make(folder))
        return ["evaluate", "--system", "minilm", "--dataset", "toy"]

    return setup


def plain(args: list[str], **changes) -> Callable[[Path], list[str]]:
    def setup(folder: Path) -> list[str]:
        params(folder, **changes)
        return args
    return setup


def edited_params(old: str, new: str, args: list[str] | None = None) -> Callable[[Path], list[str]]:
    def setup(folder: Path) -> list[str]:
        path = params(folder)
        text = path.read_text()
        assert old in text, old
        path.write_text(text.replace(old, new, 1))
        return args or ["params"]
    return setup


def bad_profile(folder: Path) -> list[str]:
    params(folder)
    (folder / "profiles").mkdir()
    (folder / "profiles" / "mine.yaml").write_text("train:\n  epochs: 2\n  learning_rat: 0.1\n")
    return ["--profile", "mine", "params"]


def truncated_zip(folder: Path) -> list[str]:
    params(folder)
    data = zip_bytes(toy_files(folder))
    cut = data[: len(data) // 2]
    return ["download", "toy", "--mirror", str(mirror(folder, cut))]


def wrong_checksum(folder: Path) -> list[str]:
    params(folder)
    data = zip_bytes(toy_files(folder))
    return ["download", "toy", "--mirror", str(mirror(folder, data, listed=b"another file"))]


def zip_bomb(folder: Path) -> list[str]:
    params(folder)
    files = toy_files(folder)
    files["toy/padding.txt"] = b"\0" * (17 << 20)  # 17 MiB of zeros: ~17 KiB compressed
    return ["download", "toy", "--mirror", str(mirror(folder, zip_bytes(files)))]


def symlink_member(folder: Path) -> list[str]:
    params(folder)
    data = zip_bytes(toy_files(folder), links={"toy/qrels/dev.tsv": "/etc/passwd"})
    return ["download", "toy", "--mirror", str(mirror(folder, data))]


def not_a_zip(folder: Path) -> list[str]:
    params(folder)
    return ["download", "toy", "--mirror", str(mirror(folder, b"<html>404 Not Found</html>\n" * 40))]


def bad_sums(folder: Path) -> list[str]:
    params(folder)
    where = mirror(folder, zip_bytes(toy_files(folder)))
    (where / "SHA256SUMS").write_text("toy.zip e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855\n")
    return ["download", "toy", "--mirror", str(where)]


def not_in_mirror(folder: Path) -> list[str]:
    params(folder)
    return ["download", "fiqa", "--mirror", str(mirror(folder, zip_bytes(toy_files(folder))))]


def installed_download(folder: Path) -> list[str]:
    """The toy dataset downloaded already: ``pgrank download toy`` only writes manifests and the carve-out."""
    installed(folder)
    return ["download", "toy", "--mirror", str(mirror(folder, zip_bytes(toy_files(folder))))]


def fresh_download(folder: Path) -> list[str]:
    params(folder)
    return ["download", "toy", "--mirror", str(mirror(folder, zip_bytes(toy_files(folder))))]


def _offline(**entry) -> Callable[[Path], dict]:
    def make(folder: Path) -> dict:
        doc = yaml.safe_load((ROOT / "params.yaml").read_text())["models"]
        doc["aliases"]["minilm"] = MINILM
        doc["offline"][MINILM].update(entry)
        return {"models": doc}
    return make


TINY_MODEL: list[Path] = []  # the tiny sentence-transformers model (set by the test module from its fixture)


def _alias_to(kind: str) -> Callable[[Path], dict]:
    def make(folder: Path) -> dict:
        doc = yaml.safe_load((ROOT / "params.yaml").read_text())["models"]
        doc["aliases"]["minilm"] = str(model_folder(folder, TINY_MODEL[0], **{kind: True}))
        return {"models": doc}
    return make


# --------------------------------------------------------------------------------------- the catalogue

_TOY_CORPUS = "toy/corpus.jsonl"
_TOY_QUERIES = "toy/queries.jsonl"
_TOY_QRELS = "toy/qrels/train.tsv"

CASES: list[Case] = [
    # params
    Case("params-wrong-type", "params", "`--set train.epochs=two`", plain(["--set", "train.epochs=two", "params"]),
         r"train\.epochs.*integer"),
    Case("params-out-of-range", "params", "`--set train.pg.temperature=-1`",
         plain(["--set", "train.pg.temperature=-1", "params"]), r"train\.pg\.temperature.*greater than 0"),
    Case("params-constraint", "params", "`--set train.pg.num_samples=1` with the leave-one-out baseline",
         plain(["--set", "train.pg.num_samples=1", "params"]), r"train\.pg\.num_samples: must be >= 2"),
    Case("params-champion-budget", "params", "`--set champion.budget=1.5` (a chance of any false promotion)",
         plain(["--set", "champion.budget=1.5", "params"]), r"champion\.budget.*less than 1"),
    Case("params-champion-margin", "params", "`--set champion.margin=-0.01` (a non-inferiority margin below 0)",
         plain(["--set", "champion.margin=-0.01", "params"]), r"champion\.margin.*greater than or equal to 0"),
    Case("params-selection-on-test", "params", "`--set train.validation_sets=[scifact/test]` (a test split chooses the policy)",
         plain(["--set", "train.validation_sets=[scifact/test]", "params"]),
         r"train\.validation_sets: \['scifact/test'\]: selection never reads a test split"),
    Case("params-noise-guard-unguarded", "params", "`--set train.selection.guard=noise` with `rule: last`",
         plain(["--set", "train.selection.guard=noise", "params"]), r"train\.selection: guard: noise .* needs rule: guarded"),
    Case("params-unknown-key-file", "params", "`learning_rat: 1e-6` (typo) in params.yaml",
         edited_params("  learning_rate:", "  learning_rat:"), r"params\.yaml:\d+: train\.learning_rat"),
    Case("params-unknown-key-set", "params", "`--set train.epoch=3` (typo)", plain(["--set", "train.epoch=3", "params"]),
         r"train\.epoch\b"),
    Case("params-yaml-syntax", "params", "a tab-indented, unclosed line in params.yaml",
         edited_params("  epochs: 6", "  epochs: [6\n\tkeep: 1"), r"params\.yaml.*not valid YAML"),
    Case("params-missing-profile", "params", "`--profile nope`", plain(["--profile", "nope", "params"]),
         r"profiles/nope\.yaml: no profile 'nope'"),
    Case("params-profile-unknown-key", "params", "a profile with an unknown key", bad_profile,
         r"profiles/mine\.yaml:3: train\.learning_rat"),
    Case("params-set-missing-section", "params", "`--set nosuch.epochs=1`", plain(["--set", "nosuch.epochs=1", "params"]),
         r"nosuch"),
    Case("params-set-syntax", "params", "`--set train.epochs` (no value)", plain(["--set", "train.epochs", "params"]),
         r"override 'train\.epochs': expected KEY=VALUE"),
    Case("params-missing-file", "params", "`--params missing.yaml`", plain(["--params", "missing.yaml", "params"]),
         r"missing\.yaml: no such file"),
    # BEIR files (checked when a download is installed)
    Case("beir-not-json", "BEIR files", "a corpus line that is not JSON",
         download_of(line(_TOY_CORPUS, 3, b'{"_id": "d0-2", "text": ')), r"toy/corpus\.jsonl:3: not a valid JSON line"),
    Case("beir-missing-id", "BEIR files", "a corpus line without `_id`",
         download_of(replace(_TOY_CORPUS, b'"_id": "d0-1", ', b"")), r"toy/corpus\.jsonl:2: expected a non-empty string \"_id\""),
    Case("beir-missing-text", "BEIR files", "a corpus line without `text`",
         download_of(line(_TOY_CORPUS, 2, b'{"_id": "d0-1", "title": "Protein Folding"}')),
         r"toy/corpus\.jsonl:2: expected a string \"text\""),
    Case("beir-duplicate-id", "BEIR files", "two corpus lines with one `_id`",
         download_of(replace(_TOY_CORPUS, b'"_id": "d0-2"', b'"_id": "d0-1"')),
         r"toy/corpus\.jsonl:3: duplicate _id 'd0-1' \(first on line 2\)"),
    Case("beir-duplicate-query", "BEIR files", "two queries with one `_id`",
         download_of(replace(_TOY_QUERIES, b'"_id": "q0-1"', b'"_id": "q0-0"')),
         r"toy/queries\.jsonl:2: duplicate _id 'q0-0'"),
    Case("beir-empty-corpus", "BEIR files", "an empty corpus.jsonl",
         download_of(lambda files: {**files, _TOY_CORPUS: b"\n"}), r"toy/corpus\.jsonl: empty corpus"),
    Case("beir-not-utf8", "BEIR files", "Latin-1 bytes in corpus.jsonl",
         download_of(replace(_TOY_CORPUS, b"Protein Folding", b"Prot\xe9in Folding")),
         r"toy/corpus\.jsonl:\d+: not a valid JSON line.*utf-8"),
    Case("beir-qrels-no-header", "BEIR files", "a qrels file without its header row",
         download_of(lambda files: {**files, _TOY_QRELS: files[_TOY_QRELS].split(b"\r\n", 1)[1]}),
         r"toy/qrels/train\.tsv:1: expected the header row"),
    Case("beir-qrels-grade", "BEIR files", "a qrels grade `high`",
         download_of(replace(_TOY_QRELS, b"q0-0\td0-0\t2", b"q0-0\td0-0\thigh")),
         r"toy/qrels/train\.tsv:2: score 'high' is not an integer"),
    Case("beir-qrels-columns", "BEIR files", "a qrels row with two columns",
         download_of(replace(_TOY_QRELS, b"q0-0\td0-0\t2", b"q0-0 d0-0\t2")),
         r"toy/qrels/train\.tsv:2: expected query-id<TAB>corpus-id<TAB>score"),
    Case("beir-qrels-unknown-query", "BEIR files", "a judgment of a query missing from queries.jsonl",
         download_of(replace(_TOY_QRELS, b"q0-0\td0-0\t2", b"q99\td0-0\t2")),
         r"toy/qrels/train\.tsv:2: query 'q99' has no text in queries\.jsonl"),
    Case("beir-qrels-no-documents", "BEIR files", "a qrels file none of whose documents is in the corpus",
         download_of(lambda files: {**files, _TOY_QRELS: files[_TOY_QRELS].replace(b"\td", b"\tdoc-")}),
         r"toy/qrels/train\.tsv: none of its 48 judged documents is in corpus\.jsonl"),
    # archives
    Case("archive-truncated", "archives", "a zip cut in half (its checksum listed as is)", truncated_zip,
         r"toy\.zip: corrupt or truncated archive"),
    Case("archive-checksum", "archives", "a zip whose SHA-256 is not the mirror's", wrong_checksum,
         r"toy\.zip from .*mirror/toy\.zip: sha256 checksum mismatch"),
    Case("archive-zip-slip", "archives", "a member `toy/../../evil.py`",
         download_of(lambda files: {**files, "toy/../../evil.py": b"print('owned')\n"}),
         r"toy\.zip: refusing member 'toy/\.\./\.\./evil\.py': its path escapes the dataset folder \(zip-slip\)"),
    Case("archive-symlink", "archives", "a member that is a symbolic link to /etc/passwd", symlink_member,
         r"toy\.zip: refusing member 'toy/qrels/dev\.tsv': symbolic links are not allowed"),
    Case("archive-bomb", "archives", "a 17 MiB member compressed 1000 times", zip_bomb,
         r"toy\.zip: refusing member 'toy/padding\.txt': \d+ bytes expand to \d+ \(\d+x, more than 200x\): a zip bomb"),
    Case("archive-no-corpus", "archives", "a zip without corpus.jsonl",
         download_of(lambda files: {k: v for k, v in files.items() if k != _TOY_CORPUS}),
         r"toy\.zip: no corpus\.jsonl in the archive"),
    Case("archive-not-zip", "archives", "an HTML error page saved as toy.zip", not_a_zip,
         r"toy\.zip: corrupt or truncated archive"),
    Case("archive-not-in-mirror", "archives", "`pgrank download fiqa` from a mirror without fiqa.zip", not_in_mirror,
         r"mirror/fiqa\.zip: not in the mirror"),
    Case("archive-bad-sums", "archives", "a SHA256SUMS line in the wrong order", bad_sums,
         r"mirror/SHA256SUMS:1: expected '<sha256>  <name>\.zip'"),
    # candidate files: the authors' published sets a user brings (`mine.source: published`), and the stores
    # that mining writes and training and evaluation read
    Case("candidates-truncated", "candidate files", "a published candidate line cut short",
         published([_record(), '{"qid": "q0-1", "topk": {"d0-1": 3.5, "d0']),
         r"toy_candidate-set_gtrxl\+gt_1000_test\.json:2: not valid JSON"),
    Case("candidates-twice", "candidate files", "a query given twice in a published file",
         published([_record(), _record("q0-1"), _record()]),
         r"toy_candidate-set_gtrxl\+gt_1000_test\.json:3: query 'q0-0' appears twice"),
    Case("candidates-unknown-query", "candidate files", "a published query that is not in the split",
         published([_record(), _record("q77")]),
         r"toy_candidate-set_gtrxl\+gt_1000_test\.json: query 'q77' is not a query of toy/test"),
    Case("candidates-score", "candidate files", "a published score `n/a`",
         published([{"qid": "q0-0", "topk": {"d0-0": "n/a"}}]),
         r"toy_candidate-set_gtrxl\+gt_1000_test\.json:1: query 'q0-0', document 'd0-0': score 'n/a' is not a number or null"),
    Case("candidates-missing-file", "candidate files", "`mine.published_dir` without the split's file",
         published(None), r"published/toy_candidate-set_gtrxl\+gt_1000_test\.json: no such file \(mine\.published_dir\)"),
    Case("candidates-store-truncated", "candidate files", "a candidate store whose `rows.i32` was cut short",
         damaged_store, r"candidates/toy/train/rows\.i32: 100 bytes, meta\.json says \d+ pairs"),
    # models
    Case("model-pickle-only", "models", "a model folder with `pytorch_model.bin` only",
         with_model(_alias_to("pickles_only")), r"pytorch_model\.bin: pickled weights with no safetensors beside them"),
    Case("model-no-weights", "models", "a model folder without weights", with_model(_alias_to("no_weights")),
         r"my-model: no \*\.safetensors weights found"),
    Case("model-checksum", "models", "a pinned SHA-256 that the offline copy does not match",
         with_model(_offline(sha256="0" * 64)), r"model\.safetensors: SHA-256 mismatch for sentence-transformers/all-MiniLM-L6-v2"),
    Case("model-offline-package", "models", "an offline package that is not installed",
         with_model(_offline(package="gt_no_such_model")),
         r"models\.offline\.sentence-transformers/all-MiniLM-L6-v2\.package: cannot import 'gt_no_such_model'"),
    Case("export-no-policy", "models", "`pgrank export --to out` before `pgrank train`", plain(["export", "--to", "out"]),
         r"runs/models/minilm/pg/epoch-6: no checkpoint for system 'pgrank-minilm'"),
    Case("export-unknown-warm-start", "models", "`pgrank export --to out --warm-start sbert` (not trained, not configured)",
         plain(["export", "--to", "out", "--warm-start", "sbert"]), r"--warm-start sbert: not in train\.warm_starts \['minilm'\]"),
    # the environment
    Case("env-read-only", "environment", "a read-only project folder", installed_download, r"Permission denied.*permissions",
         exit=74, read_only=True),
    Case("env-file-size", "environment", "a full disk (`ulimit -f`: 200 bytes) while writing manifests", installed_download,
         r"runs/datasets/toy\.json: File too large", exit=74, fsize_limit=200),
    Case("env-full-disk-extract", "environment", "a full disk (`ulimit -f`: 4 KiB) while extracting",
         fresh_download, r"data/toy: File too large", exit=74, fsize_limit=4096, keeps=r"^data(/toy\.zip\.part)?$"),
    Case("data-not-downloaded", "environment", "`pgrank mine` before `pgrank download`",
         plain(["mine", "--dataset", "toy"]), r"data/toy: dataset 'toy' is not downloaded; run `pgrank download toy`"),
    Case("data-bad-name", "environment", "`pgrank download ../etc`", plain(["download", "../etc"]), r"dataset name '\.\./etc'"),
]
