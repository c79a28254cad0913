"""Datasets of your own (``data.sources``): folders read in place, zips from a path or a URL, validated
like a BEIR download, fingerprinted so that only changed content counts.

Everything runs on small BEIR folders written here and a real HTTP server on 127.0.0.1; the DVC
behaviour (which stages re-run when the data changes) is tested end to end in
``tests/download/test_sources_dvc.py``.
"""

from __future__ import annotations

import functools
import hashlib
import http.server
import io
import json
import logging
import os
import subprocess
import sys
import threading
import time
import zipfile
from pathlib import Path

import pytest

from pgrank.config import parse_params
from pgrank.data.beir import load_split
from pgrank.data.checksums import DOWNLOAD_RECORD, corpus_sha256
from pgrank.download.stage import download
from pgrank.errors import ConfigError, DataError
from pgrank.paths import Paths

ROOT = Path(__file__).resolve().parents[2]

CORPUS = [{"_id": "d1", "title": "Aspirin", "text": "Aspirin reduces fever."},
          {"_id": "d2", "title": "", "text": "Cafe culture in Paris."},
          {"_id": "d3", "title": "Sleep", "text": "Sleep improves memory."},
          {"_id": "d4", "title": "Tides", "text": "The moon drives the tides."}]
QUERIES = [{"_id": f"q{i}", "text": text} for i, text in enumerate(
    ["does aspirin help fever", "sleep and memory", "paris cafes", "what causes tides", "fever drugs", "memory"], 1)]
TRAIN = [("q1", "d1", 2), ("q2", "d3", 1), ("q3", "d2", 1), ("q4", "d4", 1)]
TEST = [("q5", "d1", 1), ("q6", "d3", 1)]


def jsonl(rows) -> str:
    return "".join(json.dumps(r) + "\n" for r in rows)


def qrels(rows) -> str:
    return "query-id\tcorpus-id\tscore\n" + "".join(f"{q}\t{d}\t{s}\n" for q, d, s in rows)


def write_beir(folder: Path) -> Path:
    (folder / "qrels").mkdir(parents=True, exist_ok=True)
    (folder / "corpus.jsonl").write_text(jsonl(CORPUS))
    (folder / "queries.jsonl").write_text(jsonl(QUERIES))
    (folder / "qrels" / "train.tsv").write_text(qrels(TRAIN))
    (folder / "qrels" / "test.tsv").write_text(qrels(TEST))
    return folder


def zip_of(folder: Path, top: str = "acme") -> bytes:
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w") as zf:
        for file in sorted(folder.rglob("*")):
            if file.is_file():
                zf.write(file, f"{top}/{file.relative_to(folder)}")
    return buf.getvalue()


def make_params(source: dict, **data):
    return parse_params({
        "paths": {"root": "runs", "data": "data", "embeddings": "emb"},
        "data": {"sources": {"acme": source}, "train": "acme/train", "validation_size": 1,
                 "eval_sets": ["acme/test"], **data},
        "train": {"warm_starts": ["sbert"]},
        "evaluate": {"systems": {"bm25": ["bm25"], "dense": ["sbert"]}},
    })


def run_download(tmp_path: Path, source: dict, **data):
    params = make_params(source, **data)
    paths = Paths.from_config(params.paths, base=tmp_path)
    return download(params, paths, config_dir=tmp_path, progress=False), paths


def manifest(paths: Paths) -> dict:
    return json.loads(paths.dataset_manifest("acme").read_text())["files"]


def tree(folder: Path) -> dict[str, tuple[int, str]]:
    """Every file under a folder: (mtime_ns, sha256), to show that nothing was written there."""
    return {str(p.relative_to(folder)): (p.stat().st_mtime_ns, hashlib.sha256(p.read_bytes()).hexdigest())
            for p in sorted(folder.rglob("*")) if p.is_file()}


# --------------------------------------------------------------------------------------- folders


def test_a_folder_is_read_in_place_and_fingerprinted_like_a_download(tmp_path):
    src = write_beir(tmp_path / "acme-beir")
    before = tree(src)
    report, paths = run_download(tmp_path, {"path": "acme-beir"})  # relative to the params file's folder

    assert [(f.name, f.status) for f in report.datasets] == [("acme", "validated")]
    target = paths.dataset("acme")
    assert all((target / f).is_symlink() for f in ("corpus.jsonl", "queries.jsonl", "qrels"))  # nothing copied
    assert sorted(p.name for p in target.iterdir()) == [DOWNLOAD_RECORD, "corpus.jsonl", "qrels", "queries.jsonl"]
    assert tree(src) == before  # nothing written into the user's folder
    sha = lambda f: hashlib.sha256((src / f).read_bytes()).hexdigest()  # noqa: E731
    assert manifest(paths) == {f: sha(f) for f in ("corpus.jsonl", "queries.jsonl", "qrels/test.tsv", "qrels/train.tsv")}
    assert corpus_sha256(target) == sha("corpus.jsonl")  # trusted from the record, keys the embeddings
    split = load_split(paths, "acme", "test", progress=False)  # every stage reads it as a BEIR dataset
    assert split.queries == {"q5": "fever drugs", "q6": "memory"} and len(split.corpus) == 4
    assert report.carve_out.train_queries == 3 and report.carve_out.validation_queries == 1


def test_unchanged_content_is_not_read_again_and_a_new_judgment_changes_the_manifest(tmp_path, monkeypatch):
    src = write_beir(tmp_path / "acme-beir")
    _, paths = run_download(tmp_path, {"path": str(src)})
    first = manifest(paths)
    manifest_bytes = paths.dataset_manifest("acme").read_bytes()

    import pgrank.download.sources as sources

    validated, real = [], sources.validate_folder

    def counting(folder, label, **kwargs):  # the real validation, counted
        validated.append(label)
        return real(folder, label, **kwargs)

    monkeypatch.setattr(sources, "validate_folder", counting)
    report, _ = run_download(tmp_path, {"path": str(src)})
    assert report.datasets[0].status == "present" and validated == []
    assert paths.dataset_manifest("acme").read_bytes() == manifest_bytes  # identical bytes: DVC re-runs nothing

    os.utime(src / "corpus.jsonl")  # touched, same content: rehashed, same manifest
    run_download(tmp_path, {"path": str(src)})
    assert paths.dataset_manifest("acme").read_bytes() == manifest_bytes

    with open(src / "qrels" / "train.tsv", "a") as fh:  # a new judgment
        fh.write("q5\td4\t1\n")
    report, _ = run_download(tmp_path, {"path": str(src)})
    assert report.datasets[0].status == "validated" and validated == [str(src)]
    changed = manifest(paths)
    assert {k for k in first if first[k] != changed[k]} == {"qrels/train.tsv"}
    assert report.carve_out.train_queries + report.carve_out.validation_queries == 5  # q5 now judged in train

    (src / "qrels" / "dev.tsv").write_text(qrels([("q1", "d2", 1)]))  # a new split appears through the qrels link
    run_download(tmp_path, {"path": str(src)})
    assert "qrels/dev.tsv" in manifest(paths)


@pytest.mark.parametrize("file,content,message", [
    ("corpus.jsonl", jsonl(CORPUS) + "{not json\n", r"acme-beir/corpus.jsonl:5: not a valid JSON line"),
    ("corpus.jsonl", jsonl(CORPUS + [CORPUS[1]]), r"acme-beir/corpus.jsonl:5: duplicate _id 'd2' \(first on line 2\)"),
    ("queries.jsonl", jsonl(QUERIES + [QUERIES[0]]), r"acme-beir/queries.jsonl:7: duplicate _id 'q1'"),
    ("qrels/train.tsv", qrels(TRAIN + [("q9", "d1", 1)]), r"acme-beir/qrels/train.tsv:6: query 'q9' has no text"),
    ("qrels/train.tsv", qrels(TRAIN + [("q1", "d99", 1)]),
     r"acme-beir/qrels/train.tsv:6: document 'd99' is not in corpus.jsonl \(missing_documents: warn"),
    ("qrels/test.tsv", qrels(TEST) + "q5\td1\tyes\n", r"acme-beir/qrels/test.tsv:4: score 'yes' is not an integer"),
], ids=["bad-json", "duplicate-document", "duplicate-query", "query-without-text", "missing-document", "bad-score"])
def test_bad_content_is_named_by_file_and_line_and_installs_no_manifest(tmp_path, file, content, message):
    src = write_beir(tmp_path / "acme-beir")
    (src / file).write_text(content)
    with pytest.raises(DataError, match=message):
        run_download(tmp_path, {"path": str(src)})
    assert not (tmp_path / "runs" / "datasets").exists()


def test_missing_documents_warn_keeps_the_judgments_as_beir_does(tmp_path, caplog):
    src = write_beir(tmp_path / "acme-beir")
    (src / "qrels" / "train.tsv").write_text(qrels(TRAIN + [("q1", "d99", 1)]))
    with caplog.at_level(logging.WARNING):
        report, paths = run_download(tmp_path, {"path": str(src), "missing_documents": "warn"})
    assert report.datasets[0].status == "validated"
    assert "1 judgments point at documents missing from the corpus" in caplog.text


def test_a_source_that_is_not_a_beir_folder_or_clashes_with_a_download_is_refused(tmp_path):
    (tmp_path / "empty").mkdir()
    with pytest.raises(DataError, match=r"data.sources.acme.path 'empty': .* is not a BEIR folder \(no corpus.jsonl, "
                                        r"queries.jsonl, qrels/\*.tsv\)"):
        run_download(tmp_path, {"path": "empty"})
    with pytest.raises(DataError, match="no such folder"):
        run_download(tmp_path, {"path": "nowhere"})
    write_beir(tmp_path / "acme-beir")
    (tmp_path / "data" / "acme").mkdir(parents=True)  # e.g. a BEIR download of the same name
    (tmp_path / "data" / "acme" / "corpus.jsonl").write_text(jsonl(CORPUS))
    with pytest.raises(DataError, match="already holds a dataset that is not this source"):
        run_download(tmp_path, {"path": "acme-beir"})


def test_moving_the_source_relinks_it_and_keeps_the_manifest(tmp_path):
    src = write_beir(tmp_path / "acme-beir")
    _, paths = run_download(tmp_path, {"path": str(src)})
    before = paths.dataset_manifest("acme").read_bytes()
    moved = src.rename(tmp_path / "elsewhere")
    report, _ = run_download(tmp_path, {"path": str(moved)})
    assert os.readlink(paths.dataset("acme") / "corpus.jsonl") == str(moved / "corpus.jsonl")
    assert paths.dataset_manifest("acme").read_bytes() == before  # same content: DVC re-runs nothing


# --------------------------------------------------------------------------------------- zips


def test_a_local_zip_is_extracted_when_its_content_changes(tmp_path):
    src = write_beir(tmp_path / "acme-beir")
    archive = tmp_path / "acme.zip"
    archive.write_bytes(zip_of(src))
    report, paths = run_download(tmp_path, {"path": "acme.zip"})
    assert report.datasets[0].status == "validated" and not (paths.dataset("acme") / "corpus.jsonl").is_symlink()
    first = manifest(paths)
    assert run_download(tmp_path, {"path": "acme.zip"})[0].datasets[0].status == "present"

    with open(src / "corpus.jsonl", "a") as fh:  # a new document
        fh.write(json.dumps({"_id": "d5", "title": "", "text": "Volcanoes erupt."}) + "\n")
    archive.write_bytes(zip_of(src))
    report, _ = run_download(tmp_path, {"path": "acme.zip"})
    assert report.datasets[0].status == "validated"
    assert {k for k in first if first[k] != manifest(paths)[k]} == {"corpus.jsonl"}

    pin = "0" * 64
    with pytest.raises(DataError, match=f"sha256 mismatch \\(expected {pin} from data.sources.acme.sha256"):
        run_download(tmp_path, {"path": "acme.zip", "sha256": pin})


class _Handler(http.server.SimpleHTTPRequestHandler):
    """Static files (with Last-Modified and Content-Length), counting the requests by method."""

    def do_GET(self):  # noqa: N802
        self.server.requests.append("GET")
        super().do_GET()

    def do_HEAD(self):  # noqa: N802
        self.server.requests.append("HEAD")
        super().do_HEAD()

    def log_message(self, *args):
        pass


@pytest.fixture
def served(tmp_path, monkeypatch):
    monkeypatch.setenv("no_proxy", "127.0.0.1,localhost")
    for var in ("http_proxy", "HTTP_PROXY"):
        monkeypatch.delenv(var, raising=False)
    root = tmp_path / "served"
    root.mkdir()
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), functools.partial(_Handler, directory=str(root)))
    server.requests = []
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
    thread.start()
    yield root, f"http://127.0.0.1:{server.server_address[1]}", server
    server.shutdown()
    server.server_close()


def test_a_url_is_fetched_once_and_again_only_when_its_validators_change(tmp_path, served):
    root, base, server = served
    src = write_beir(tmp_path / "acme-beir")
    (root / "acme.zip").write_bytes(zip_of(src))
    url = f"{base}/acme.zip"
    report, paths = run_download(tmp_path, {"url": url})
    assert report.datasets[0].status == "validated" and server.requests == ["HEAD", "GET"]
    assert not (paths.data / "acme.zip.part").exists()
    first = manifest(paths)

    server.requests.clear()
    assert run_download(tmp_path, {"url": url})[0].datasets[0].status == "present"
    assert server.requests == ["HEAD"]  # same Last-Modified and length: not downloaded again

    with open(src / "qrels" / "test.tsv", "a") as fh:
        fh.write("q5\td2\t1\n")
    (root / "acme.zip").write_bytes(zip_of(src))
    os.utime(root / "acme.zip", (time.time() + 5, time.time() + 5))  # Last-Modified has one-second resolution
    server.requests.clear()
    report, _ = run_download(tmp_path, {"url": url})
    assert report.datasets[0].status == "validated" and server.requests == ["HEAD", "GET"]
    assert {k for k in first if first[k] != manifest(paths)[k]} == {"qrels/test.tsv"}

    digest = hashlib.sha256((root / "acme.zip").read_bytes()).hexdigest()
    server.requests.clear()
    assert run_download(tmp_path, {"url": url, "sha256": digest})[0].datasets[0].status == "present"
    assert server.requests == []  # pinned and installed: the server is not asked

    server.shutdown()  # unreachable later: the installed copy is used, with a warning
    server.server_close()
    assert run_download(tmp_path, {"url": url})[0].datasets[0].status == "present"
    with pytest.raises(DataError, match="cannot connect"):
        run_download(tmp_path / "fresh", {"url": url})


def test_source_config_errors_name_the_key():
    with pytest.raises(ConfigError, match=r"data.sources.acme: .*exactly one of 'path'"):
        make_params({"path": "a", "url": "https://x/a.zip"})
    with pytest.raises(ConfigError, match=r"data.sources.acme: .*expected an http\(s\) URL"):
        make_params({"url": "ftp://x/a.zip"})
    with pytest.raises(ConfigError, match=r"data.sources.acme.colour: unknown key"):
        make_params({"path": "a", "colour": "red"})
    with pytest.raises(ConfigError, match=r"sha256 pins a zip"):
        make_params({"path": "folder", "sha256": "0" * 64})


def test_the_cli_reports_a_bad_source_in_one_line(tmp_path):
    src = write_beir(tmp_path / "acme-beir")
    (src / "qrels" / "test.tsv").write_text(qrels(TEST + [("q5", "gone", 1)]))
    params = tmp_path / "params.yaml"
    params.write_text((ROOT / "params.yaml").read_text())
    sets = ["--set", "data.sources={acme: {path: acme-beir}}", "--set", "data.train=acme/train", "--set",
            "data.eval_sets=[acme/test]", "--set", "data.validation_size=1", "--set", "paths.data=data"]
    out = subprocess.run([sys.executable, str(ROOT / "cli.py"), "--params", str(params), *sets, "download"],
                         capture_output=True, text=True, cwd=tmp_path)
    assert out.returncode == 2 and "Traceback" not in out.stderr
    assert out.stderr.strip() == (f"pgrank: error: {src}/qrels/test.tsv:4: document 'gone' is not in corpus.jsonl "
                                  "(missing_documents: warn keeps such judgments, as BEIR does)")


def test_a_holdout_is_the_gate_split_apart_from_training_and_validation_however_the_data_grows(tmp_path):
    src = write_beir(tmp_path / "acme-beir")
    holdout = tmp_path / "gate.tsv"
    holdout.write_text(qrels([("q3", "d2", 1)]))
    report, paths = run_download(tmp_path, {"path": str(src)}, holdout=str(holdout))
    carved = lambda split: {r.split("\t")[0] for r in paths.carved_qrels("acme", split).read_text().split("\n")[1:] if r}  # noqa: E731
    assert carved("gate") == {"q3"} and report.carve_out.gate_queries == 1
    with open(src / "qrels" / "train.tsv", "a") as fh:  # more training data: the other draws move
        fh.writelines(f"{q}\td1\t1\n" for q in ("q5", "q6"))
    run_download(tmp_path, {"path": str(src)}, holdout=str(holdout))
    assert carved("gate") == {"q3"}
    assert "q3" not in carved("train") | carved("validation")
    with pytest.raises(DataError, match="data.holdout 'nope.tsv': no such file"):
        run_download(tmp_path, {"path": str(src)}, holdout="nope.tsv")


def test_a_zip_imported_with_dvc_import_url_is_a_source_and_dvc_update_brings_the_new_version(tmp_path, served):
    root, base, _ = served
    src = write_beir(tmp_path / "acme-beir")
    (root / "acme.zip").write_bytes(zip_of(src))
    project = tmp_path / "project"
    (project / "sources").mkdir(parents=True)
    dvc = lambda *args: subprocess.run(["dvc", *args], cwd=project, capture_output=True, text=True, check=True)  # noqa: E731
    dvc("init", "--no-scm", "-q")
    dvc("import-url", f"{base}/acme.zip", "sources/acme.zip")  # DVC records where it came from
    report, paths = run_download(project, {"path": "sources/acme.zip"})
    assert report.datasets[0].status == "validated"
    first = manifest(paths)

    with open(src / "qrels" / "train.tsv", "a") as fh:  # the publisher adds judgments
        fh.write("q5\td2\t1\n")
    (root / "acme.zip").write_bytes(zip_of(src))
    os.utime(root / "acme.zip", (time.time() + 5, time.time() + 5))
    assert run_download(project, {"path": "sources/acme.zip"})[0].datasets[0].status == "present"  # not updated yet
    dvc("update", "sources/acme.zip.dvc")
    report, _ = run_download(project, {"path": "sources/acme.zip"})
    assert report.datasets[0].status == "validated"
    assert {k for k in first if first[k] != manifest(paths)[k]} == {"qrels/train.tsv"}
