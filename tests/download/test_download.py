"""``pgrank download``: mirror and HTTP sources, resume, checksums, safe extraction, atomicity, CLI.

Bad archives are built in temporary folders; HTTP behaviour is tested against a small Range-aware
server on 127.0.0.1 started by the test. Nothing here reaches the network or writes to shared/.
"""

from __future__ import annotations

import hashlib
import http.server
import io
import json
import logging
import os
import subprocess
import sys
import threading
import zipfile
from pathlib import Path

import pytest

from pgrank.config import parse_params
from pgrank.data.beir import load_split
from pgrank.data.checksums import DOWNLOAD_RECORD
from pgrank.download.beir_datasets import expected_checksum, fetch_dataset, parse_sha256sums
from pgrank.download.mirror import Source, resolve_source
from pgrank.download.stage import download
from pgrank.errors import DataError
from pgrank.paths import Paths

ROOT = Path(__file__).resolve().parents[2]

CORPUS = (
    b'{"_id": "d1", "title": "Aspirin", "text": "Aspirin reduces fever.", "metadata": {}}\n'
    b'{"_id": "d2", "title": "", "text": "Caf\\u00e9 culture in Paris.", "metadata": {}}\n'
    b'{"_id": "d3", "title": "Sleep", "text": "Sleep improves memory.", "metadata": {}}\n'
)
QUERIES = (
    b'{"_id": "q1", "text": "does aspirin help fever", "metadata": {}}\n'
    b'{"_id": "q2", "text": "sleep and memory", "metadata": {}}\n'
    b'{"_id": "q3", "text": "paris cafes", "metadata": {}}\n'
)
QRELS = b"query-id\tcorpus-id\tscore\r\nq1\td1\t2\r\nq1\td3\t1\r\nq2\td3\t1\r\nq3\td2\t1\r\n"


def tiny_members(**replace: bytes) -> dict[str, bytes]:
    members = {"tiny/corpus.jsonl": CORPUS, "tiny/queries.jsonl": QUERIES, "tiny/qrels/test.tsv": QRELS}
    members.update({f"tiny/{k.replace('__', '/')}": v for k, v in replace.items()})
    return members


def make_zip(members: dict[str, bytes], symlinks: dict[str, str] | None = None) -> bytes:
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", zipfile.ZIP_STORED) as zf:
        for name, data in members.items():
            zf.writestr(name, data)
        for name, points_to in (symlinks or {}).items():
            info = zipfile.ZipInfo(name)
            info.external_attr = (0o120777 << 16)  # S_IFLNK
            zf.writestr(info, points_to)
    return buf.getvalue()


def make_mirror(folder: Path, zips: dict[str, bytes], sums: bool | dict[str, str] = True) -> Path:
    """A mirror folder with NAME.zip files and, unless ``sums`` is False, a SHA256SUMS."""
    folder.mkdir(parents=True, exist_ok=True)
    for name, data in zips.items():
        (folder / f"{name}.zip").write_bytes(data)
    if sums is not False:
        digests = {n: hashlib.sha256(d).hexdigest() for n, d in zips.items()}
        digests.update(sums if isinstance(sums, dict) else {})
        (folder / "SHA256SUMS").write_text("".join(f"{h}  {n}.zip\n" for n, h in digests.items()))
    return folder


def listing(folder: Path) -> dict[str, str] | None:
    """Every file under ``folder`` with its SHA-256 (None if the folder does not exist)."""
    if not folder.exists():
        return None
    return {str(p.relative_to(folder)) + ("/" if p.is_dir() else ""):
            "" if p.is_dir() else hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(folder.rglob("*"))}


def make_params(tmp_path: Path, train: str = "tiny/test", size: int = 1, evals=("tiny/test",)):
    return parse_params({
        "paths": {"root": "runs", "data": "data", "embeddings": "emb"},
        "data": {"train": train, "validation_size": size, "eval_sets": list(evals)},
        "train": {"warm_starts": ["sbert"]},
        "evaluate": {"systems": {"bm25": ["bm25"], "dense": ["sbert"]}},
    })


@pytest.fixture
def paths(tmp_path) -> Paths:
    paths = Paths.from_config(make_params(tmp_path).paths, base=tmp_path)
    # An earlier, complete dataset that every failure must leave untouched.
    (paths.data / "earlier").mkdir(parents=True)
    (paths.data / "earlier" / "corpus.jsonl").write_bytes(CORPUS)
    return paths


# --------------------------------------------------------------------------------------- HTTP server


class _Server(http.server.ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self, root: Path):
        super().__init__(("127.0.0.1", 0), _RangeHandler)
        self.root, self.requests, self.cuts = root, [], 0  # cuts: how many next responses to cut short


class _RangeHandler(http.server.BaseHTTPRequestHandler):
    """Serves files from ``server.root`` with HTTP Range support; can cut a response mid-way."""

    def do_GET(self):  # noqa: N802
        rng = self.headers.get("Range")
        self.server.requests.append((self.path, rng))
        file = self.server.root / self.path.lstrip("/")
        if not file.is_file():
            self.send_error(404)
            return
        data = file.read_bytes()
        start = int(rng.removeprefix("bytes=").split("-")[0]) if rng else 0
        if start >= len(data):
            self.send_response(416)
            self.send_header("Content-Range", f"bytes */{len(data)}")
            self.send_header("Content-Length", "0")
            self.end_headers()
            return
        self.send_response(206 if rng else 200)
        if rng:
            self.send_header("Content-Range", f"bytes {start}-{len(data) - 1}/{len(data)}")
        body = data[start:]
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        if self.server.cuts > 0:  # send a third of the body, then drop the connection
            self.server.cuts -= 1
            self.wfile.write(body[: max(1, len(body) // 3)])
            self.wfile.flush()
            self.close_connection = True
            return
        self.wfile.write(body)

    def log_message(self, *args):
        pass


@pytest.fixture
def http_mirror(tmp_path, monkeypatch):
    monkeypatch.setenv("no_proxy", "127.0.0.1,localhost")
    monkeypatch.delenv("http_proxy", raising=False)
    monkeypatch.delenv("HTTP_PROXY", raising=False)
    root = make_mirror(tmp_path / "served", {"tiny": make_zip(tiny_members())})
    server = _Server(root)
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
    thread.start()
    yield server, f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()


# --------------------------------------------------------------------------------------- real data


@pytest.mark.integration
def test_shared_mirror_downloads_scifact_and_nfcorpus(tmp_path, beir_mirror):
    params = make_params(tmp_path, train="scifact/train", size=100, evals=("scifact/test", "nfcorpus/test"))
    paths = Paths.from_config(params.paths, base=tmp_path)
    report = download(params, paths, mirror=str(beir_mirror), progress=False)

    assert [(f.name, f.status) for f in report.datasets] == [("scifact", "downloaded"), ("nfcorpus", "downloaded")]
    assert all(f.checksum.algorithm == "sha256" for f in report.datasets)
    assert sorted(p.name for p in paths.data.iterdir()) == [".fingerprints", "nfcorpus", "scifact"]  # no .part, no temp
    manifest = json.loads(paths.dataset_manifest("scifact").read_text())  # what DVC tracks of the shared data
    assert manifest == {"dataset": "scifact", "files": {
        "corpus.jsonl": "dec31c8182f3d744c7d2c09423756fd1d17cbef75808db13ba01cc0aab4d1ac6",
        "queries.jsonl": "8ff84a7c903f722981cd8d595c022660140c51867b27608a6d4910db86080313",
        "qrels/test.tsv": "0864bb985e0ca2367ba217977e72004d549054b2b06666ed9d4825ac7c21284c",
        "qrels/train.tsv": "a53f2114831916c096b6c37d9e54da68cef4efdcdbd5ed46533601af972acf1d"}}  # the shared README's
    assert sorted(p.name for p in (paths.dataset("nfcorpus") / "qrels").iterdir()) == ["dev.tsv", "test.tsv",
                                                                                         "train.tsv"]
    summary = json.loads((paths.dataset("scifact") / DOWNLOAD_RECORD).read_text())["folders"]["."]
    assert summary["documents"] == 5183 and summary["judgments"] == {"test": 339, "train": 919}
    assert report.carve_out.train_queries == 709 and report.carve_out.validation_queries == 100

    before = listing(paths.data)
    again = download(params, paths, mirror=str(beir_mirror), progress=False)
    assert [f.status for f in again.datasets] == ["present", "present"]
    assert listing(paths.data) == before
    assert len(load_split(paths, "scifact", "validation", progress=False).queries) == 100


# --------------------------------------------------------------------------------------- resume


def test_http_connection_cut_midway_resumes_to_a_verified_dataset(paths, http_mirror, caplog):
    server, url = http_mirror
    server.cuts = 1
    with caplog.at_level(logging.WARNING):
        fetched = fetch_dataset("tiny", paths.dataset("tiny"), resolve_source(url), {}, progress=False)
    assert fetched.status == "downloaded"
    ranges = [r for path, r in server.requests if path == "/tiny.zip"]
    assert ranges[0] is None and ranges[1].startswith("bytes=") and ranges[1] != "bytes=0-"
    assert "resuming" in caplog.text
    assert not (paths.data / "tiny.zip.part").exists()
    assert (paths.dataset("tiny") / "corpus.jsonl").read_bytes() == CORPUS


def test_interrupted_run_keeps_part_and_the_next_run_resumes(paths, http_mirror, monkeypatch):
    monkeypatch.setattr("pgrank.download.transfer.time.sleep", lambda seconds: None)  # no back-off in tests
    server, url = http_mirror
    source = resolve_source(url)
    sums = parse_sha256sums((server.root / "SHA256SUMS").read_text(), "SHA256SUMS")
    server.cuts = 3  # every attempt of the first run is cut
    interrupted = r"tiny\.zip: download interrupted after \d+ bytes .*run the command again to resume"
    with pytest.raises(DataError, match=interrupted):
        fetch_dataset("tiny", paths.dataset("tiny"), source, sums, progress=False)
    part = paths.data / "tiny.zip.part"
    assert part.exists() and not paths.dataset("tiny").exists()

    have = part.stat().st_size
    server.requests.clear()
    fetched = fetch_dataset("tiny", paths.dataset("tiny"), source, sums, progress=False)
    assert fetched.status == "downloaded" and fetched.checksum.algorithm == "sha256"
    assert server.requests == [("/tiny.zip", f"bytes={have}-")]
    assert not part.exists()


def test_existing_part_file_is_resumed_over_http(paths, http_mirror):
    server, url = http_mirror
    data = (server.root / "tiny.zip").read_bytes()
    (paths.data / "tiny.zip.part").write_bytes(data[:100])
    fetch_dataset("tiny", paths.dataset("tiny"), resolve_source(url), None, progress=False)
    assert server.requests == [("/tiny.zip", "bytes=100-")]
    assert (paths.dataset("tiny") / "queries.jsonl").read_bytes() == QUERIES


def test_complete_part_file_gets_416_and_is_used(paths, http_mirror):
    server, url = http_mirror
    data = (server.root / "tiny.zip").read_bytes()
    (paths.data / "tiny.zip.part").write_bytes(data)
    sums = {"tiny.zip": hashlib.sha256(data).hexdigest()}
    fetched = fetch_dataset("tiny", paths.dataset("tiny"), resolve_source(url), sums, progress=False)
    assert fetched.status == "downloaded"
    assert server.requests == [("/tiny.zip", f"bytes={len(data)}-")]


def test_existing_part_file_is_resumed_from_a_folder_mirror(paths, tmp_path):
    data = make_zip(tiny_members())
    mirror = make_mirror(tmp_path / "mirror", {"tiny": data})
    (paths.data / "tiny.zip.part").write_bytes(data[: len(data) // 2])
    source = resolve_source(str(mirror))
    fetched = fetch_dataset("tiny", paths.dataset("tiny"), source, parse_sha256sums(
        (mirror / "SHA256SUMS").read_text(), "SHA256SUMS"), progress=False)
    assert fetched.status == "downloaded"
    assert (paths.dataset("tiny") / "qrels" / "test.tsv").read_bytes() == QRELS


def test_stale_part_file_failing_the_checksum_is_downloaded_afresh(paths, tmp_path, caplog):
    data = make_zip(tiny_members())
    mirror = make_mirror(tmp_path / "mirror", {"tiny": data})
    (paths.data / "tiny.zip.part").write_bytes(b"X" * 50)  # some other file's beginning
    sums = {"tiny.zip": hashlib.sha256(data).hexdigest()}
    with caplog.at_level(logging.WARNING):
        fetched = fetch_dataset("tiny", paths.dataset("tiny"), resolve_source(str(mirror)), sums, progress=False)
    assert fetched.status == "downloaded" and "afresh" in caplog.text


# --------------------------------------------------------------------------------------- failures


def _flip_in_member(zip_bytes: bytes, needle: bytes) -> bytes:
    at = zip_bytes.index(needle)  # stored (uncompressed) members appear verbatim
    return zip_bytes[:at] + needle.swapcase() + zip_bytes[at + len(needle):]


GOOD = make_zip(tiny_members())
WRONG = {"tiny": "0" * 64}  # a SHA256SUMS entry that matches nothing
CORRUPT = "tiny\\.zip: corrupt or truncated archive"
# (zip bytes, SHA256SUMS override or None, expected message regex)
BAD_ARCHIVES = [
    pytest.param(GOOD, WRONG, r"tiny\.zip from .*sha256 checksum mismatch \(expected 0{64} from the mirror's "
                 r"SHA256SUMS, got [0-9a-f]{64}\); the file was deleted", id="wrong-checksum"),
    pytest.param(b"<html>502 Bad Gateway</html>", None, CORRUPT + r" \(File is not a zip file\)", id="not-a-zip"),
    pytest.param(GOOD[: len(GOOD) // 2], None, CORRUPT, id="truncated"),
    pytest.param(_flip_in_member(GOOD, b"Aspirin reduces"), None, CORRUPT + r" \(Bad CRC-32", id="bad-crc"),
    pytest.param(make_zip({**tiny_members(), "tiny/../../evil.txt": b"x"}), None,
                 r"refusing member 'tiny/\.\./\.\./evil\.txt': its path escapes", id="zip-slip-parent"),
    pytest.param(make_zip({**tiny_members(), "/tmp/evil.txt": b"x"}), None,
                 r"refusing member '/tmp/evil\.txt': its path escapes", id="zip-slip-absolute"),
    pytest.param(make_zip(tiny_members(), symlinks={"tiny/link": "/etc/passwd"}), None,
                 r"refusing member 'tiny/link': symbolic links", id="symlink"),
    pytest.param(make_zip(tiny_members(**{"corpus.jsonl": CORPUS.replace(b'"d2",', b'"d2"', 1)})), None,
                 r"tiny\.zip: tiny/corpus\.jsonl:2: not a valid JSON line", id="malformed-json"),
    pytest.param(make_zip(tiny_members(**{"corpus.jsonl": CORPUS + CORPUS.splitlines(True)[0]})), None,
                 r"tiny/corpus\.jsonl:4: duplicate _id 'd1' \(first on line 1\)", id="duplicate-doc"),
    pytest.param(make_zip(tiny_members(**{"queries.jsonl": QUERIES + QUERIES.splitlines(True)[1]})), None,
                 r"tiny/queries\.jsonl:4: duplicate _id 'q2' \(first on line 2\)", id="duplicate-query"),
    pytest.param(make_zip(tiny_members(**{"corpus.jsonl": b""})), None,
                 r"tiny/corpus\.jsonl: empty corpus", id="empty-corpus"),
    pytest.param(make_zip(tiny_members(**{"qrels__test.tsv": QRELS + b"q2\td1\thigh\r\n"})), None,
                 r"tiny/qrels/test\.tsv:6: score 'high' is not an integer", id="bad-score"),
]


@pytest.mark.parametrize("data, sums, message", BAD_ARCHIVES)
def test_bad_archive_raises_a_clear_error_and_leaves_the_data_folder_as_before(data, sums, message, paths, tmp_path):
    mirror = make_mirror(tmp_path / "mirror", {"tiny": data}, sums=sums or True)
    before = listing(paths.data)
    with pytest.raises(DataError, match=message):
        download(make_params(tmp_path), paths, ["tiny"], str(mirror), progress=False)
    assert listing(paths.data) == before
    assert not (tmp_path / "evil.txt").exists() and not paths.root.exists()


def test_md5_from_beirs_table_is_checked_when_the_mirror_has_no_sums(paths, tmp_path):
    mirror = make_mirror(tmp_path / "mirror", {"scifact": GOOD}, sums=False)
    expected = r"scifact\.zip from .*md5 checksum mismatch \(expected 5f7d1de60b170fc8027bb7898e2efca1 from BEIR's"
    with pytest.raises(DataError, match=expected):
        fetch_dataset("scifact", paths.dataset("scifact"), resolve_source(str(mirror)), None, progress=False)


def test_failure_does_not_leave_a_data_folder_that_did_not_exist(tmp_path):
    mirror = make_mirror(tmp_path / "mirror", {"tiny": GOOD}, sums={"tiny": "1" * 64})
    with pytest.raises(DataError, match="checksum mismatch"):
        fetch_dataset("tiny", tmp_path / "nothing" / "tiny", resolve_source(str(mirror)), {"tiny.zip": "1" * 64},
                      progress=False)
    assert not (tmp_path / "nothing").exists()


def test_unknown_dataset_without_any_checksum_is_used_with_a_warning(paths, tmp_path, caplog):
    mirror = make_mirror(tmp_path / "mirror", {"tiny": GOOD}, sums=False)
    with caplog.at_level(logging.WARNING):
        fetched = fetch_dataset("tiny", paths.dataset("tiny"), resolve_source(str(mirror)), None, progress=False)
    assert fetched.status == "downloaded" and fetched.checksum is None
    assert "no published checksum" in caplog.text and "cannot be verified" in caplog.text


def test_present_and_foreign_folders_are_left_alone(paths, tmp_path, caplog):
    mirror = make_mirror(tmp_path / "mirror", {"tiny": GOOD})
    source = resolve_source(str(mirror))
    assert fetch_dataset("tiny", paths.dataset("tiny"), source, None, progress=False).status == "downloaded"
    assert fetch_dataset("tiny", paths.dataset("tiny"), source, None, progress=False).status == "present"
    with caplog.at_level(logging.WARNING):
        assert fetch_dataset("earlier", paths.dataset("earlier"), source, None, progress=False).status == "unrecorded"
    assert "not downloaded by pgrank" in caplog.text


@pytest.mark.parametrize("name", ["../tiny", "a/b", ".hidden", ""])
def test_bad_dataset_names_are_refused(name, paths):
    with pytest.raises(DataError, match="dataset name"):
        fetch_dataset(name, paths.data / "x", Source("http://127.0.0.1:9"), None, progress=False)


def test_non_public_beir_dataset_needs_a_mirror(paths, monkeypatch):
    monkeypatch.delenv("PGRANK_BEIR_MIRROR", raising=False)  # BEIR's server, as CI's own variable may name a mirror
    with pytest.raises(DataError, match=r"bioasq: BEIR does not distribute this dataset.*--mirror"):
        fetch_dataset("bioasq", paths.dataset("bioasq"), resolve_source(None), None, progress=False)


def test_source_precedence_and_checksum_choice(tmp_path, monkeypatch):
    a, b = (tmp_path / "a"), (tmp_path / "b")
    a.mkdir(), b.mkdir()
    monkeypatch.setenv("PGRANK_BEIR_MIRROR", str(b))
    assert resolve_source(str(a), "http://configured").base == str(a.resolve())
    assert resolve_source(None, "http://configured").base == str(b.resolve())
    monkeypatch.delenv("PGRANK_BEIR_MIRROR")
    assert resolve_source(None, "http://x/beir/") == Source("http://x/beir", mirror=True)
    assert not resolve_source(None, None).mirror
    with pytest.raises(DataError, match="no such folder"):
        resolve_source(str(tmp_path / "missing"))
    assert expected_checksum("scifact", {"scifact.zip": "a" * 64}).algorithm == "sha256"
    assert expected_checksum("scifact", None).digest == "5f7d1de60b170fc8027bb7898e2efca1"
    assert expected_checksum("msmarco-v2", {}) is None


def test_sha256sums_parsing():
    text = f"# comment\n{'a' * 64}  scifact.zip\n{'B' * 64} *./nfcorpus.zip\n\n"
    assert parse_sha256sums(text, "SUMS") == {"scifact.zip": "a" * 64, "nfcorpus.zip": "b" * 64}
    with pytest.raises(DataError, match=r"SUMS:2: expected '<sha256>  <name>\.zip'"):
        parse_sha256sums(f"{'a' * 64}  ok.zip\nnot a line\n", "SUMS")


# --------------------------------------------------------------------------------------- CLI


def _cli(tmp_path: Path, *args: str) -> subprocess.CompletedProcess:
    params = tmp_path / "params.yaml"
    params.write_text(
        "paths: {root: runs, data: data, embeddings: emb}\n"
        "data: {train: tiny/test, validation_size: 1, eval_sets: [tiny/test]}\n"
        "train: {warm_starts: [sbert]}\nevaluate: {systems: {bm25: [bm25], dense: [sbert]}}\n"
    )
    env = {k: v for k, v in os.environ.items() if k != "PGRANK_BEIR_MIRROR"}
    return subprocess.run([sys.executable, str(ROOT / "cli.py"), "--params", str(params), "download", *args],
                          cwd=tmp_path, capture_output=True, text=True, env=env, timeout=120)


def test_cli_bad_checksum_exits_non_zero_with_one_line_and_no_traceback(tmp_path):
    mirror = make_mirror(tmp_path / "mirror", {"tiny": GOOD}, sums={"tiny": "0" * 64})
    result = _cli(tmp_path, "tiny", "--mirror", str(mirror))
    assert result.returncode != 0
    errors = [line for line in result.stderr.splitlines() if line.startswith("pgrank: error:")]
    assert len(errors) == 1 and "checksum mismatch" in errors[0]
    assert "Traceback" not in result.stderr
    assert not (tmp_path / "data").exists()


def test_cli_downloads_the_params_datasets_and_carves_validation(tmp_path):
    mirror = make_mirror(tmp_path / "mirror", {"tiny": GOOD})
    result = _cli(tmp_path, "--mirror", str(mirror))
    assert result.returncode == 0, result.stderr
    assert "tiny: downloaded, verified by the mirror's SHA256SUMS" in result.stdout
    assert "tiny/test: 2 train-pg + 1 validation queries" in result.stdout
    assert (tmp_path / "runs" / "splits" / "tiny" / "qrels" / "validation.tsv").is_file()


def test_relative_mirrors_mean_what_the_user_typed(tmp_path, monkeypatch):
    from pgrank.download.mirror import MIRROR_ENV, absolute_mirror_env

    (tmp_path / "conf" / "mirror").mkdir(parents=True)
    (tmp_path / "here" / "mirror").mkdir(parents=True)
    monkeypatch.chdir(tmp_path / "here")
    monkeypatch.delenv(MIRROR_ENV, raising=False)
    # data.mirror: relative to the params file's folder
    assert resolve_source(configured="mirror", config_dir=tmp_path / "conf").base == str(tmp_path / "conf" / "mirror")
    # --mirror and $PGRANK_BEIR_MIRROR: relative to where pgrank was run; the env var is made absolute for
    # the stage processes that DVC starts later in another directory
    assert resolve_source("mirror").base == str(tmp_path / "here" / "mirror")
    monkeypatch.setenv(MIRROR_ENV, "mirror")
    absolute_mirror_env()
    assert os.environ[MIRROR_ENV] == str(tmp_path / "here" / "mirror")
    monkeypatch.chdir(tmp_path)
    assert resolve_source(configured="elsewhere", config_dir=tmp_path / "conf").base == str(tmp_path / "here" / "mirror")
    with pytest.raises(DataError, match=r"data.mirror 'nowhere': no such folder"):
        monkeypatch.delenv(MIRROR_ENV)
        resolve_source(configured="nowhere", config_dir=tmp_path / "conf")

