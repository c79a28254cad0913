"""The datasets pgrank ships (``pgrank/download/datasets/``, :mod:`pgrank.download.shipped`): pinned, carried by the
package, documented, and installed wherever the BEIR mirror is not named or lacks them; a missing file that pgrank does
not ship is one line naming it and where pgrank looked; an unset or empty mirror variable is no mirror."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
import tomllib
from fnmatch import fnmatch
from pathlib import Path

import pytest

from pgrank.config import load_params
from pgrank.download.shipped import FOLDER, SHIPPED, shipped_zip
from pgrank.download.stage import download
from pgrank.errors import DataError
from pgrank.paths import Paths

ROOT = Path(__file__).resolve().parents[2]
SUBSET = "dbpedia-entity-subset.zip"


def test_every_shipped_zip_matches_its_pin_is_package_data_and_is_documented():
    package_data = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["package-data"]
    notice = (FOLDER / "README.md").read_text(encoding="utf-8")
    assert {p.name for p in FOLDER.glob("*.zip")} == set(SHIPPED)
    for name, pin in SHIPPED.items():
        assert hashlib.sha256((FOLDER / name).read_bytes()).hexdigest() == pin
        assert shipped_zip(name) == FOLDER / name
        assert any(fnmatch(f"datasets/{name}", glob) for glob in package_data["pgrank.download"]), name
        assert pin in notice and name in notice
    assert any(fnmatch("datasets/README.md", glob) for glob in package_data["pgrank.download"])
    assert "CC BY-SA" in notice and "DBpedia-Entity v2" in notice and "5,000" in notice
    assert shipped_zip("scifact.zip") is None  # BEIR's own zips come from BEIR's server or a mirror, never the package


def test_a_shipped_zip_whose_bytes_changed_is_refused(tmp_path):
    data = bytearray((FOLDER / SUBSET).read_bytes())
    data[len(data) // 2] ^= 0xFF
    (tmp_path / SUBSET).write_bytes(bytes(data))
    with pytest.raises(DataError, match=rf"{SUBSET}: sha256 mismatch \(expected {SHIPPED[SUBSET]}.*reinstall pgrank"):
        shipped_zip(SUBSET, tmp_path)
    with pytest.raises(DataError, match=rf"pgrank's copy of {SUBSET} is missing"):
        shipped_zip(SUBSET, tmp_path / "nowhere")


def _demo(tmp_path: Path):
    """The demo profile's parameters, its datasets and workspace under ``tmp_path``."""
    params = load_params(ROOT / "params.yaml", [f"paths.root={tmp_path / 'runs'}", f"paths.data={tmp_path / 'data'}",
                                                 f"paths.embeddings={tmp_path / 'emb'}", "tracking.enabled=false"],
                         profile="demo")
    return params, Paths.from_config(params.paths)


def _origin(paths: Paths) -> dict:
    return json.loads((paths.dataset("dbpedia-entity-subset") / ".pgrank-download.json").read_text())["origin"]


@pytest.mark.integration
def test_the_demo_downloads_from_a_mirror_of_scifact_and_nfcorpus_only(tmp_path, beir_mirror, monkeypatch):
    """The demo's download stage with a mirror folder that holds scifact.zip and nfcorpus.zip (and their lines of
    SHA256SUMS: the shared mirror's zips are rebuilt, so BEIR's MD5s do not fit them) and nothing else: the
    DBPedia-Entity subset is the copy pgrank ships, split into its selection and report halves."""
    mirror = tmp_path / "mirror"
    mirror.mkdir()
    for name in ("scifact.zip", "nfcorpus.zip"):
        (mirror / name).symlink_to(beir_mirror / name)
    sums = (beir_mirror / "SHA256SUMS").read_text().splitlines()
    (mirror / "SHA256SUMS").write_text("".join(f"{line}\n" for line in sums if SUBSET not in line))
    monkeypatch.setenv("PGRANK_BEIR_MIRROR", str(mirror))
    params, paths = _demo(tmp_path)
    report = download(params, paths, config_dir=ROOT, progress=False)
    assert [(f.name, f.status) for f in report.datasets] == [
        ("scifact", "downloaded"), ("nfcorpus", "downloaded"), ("dbpedia-entity-subset", "validated"),
        ("dbpedia", "validated"), ("scifact-halves", "validated"), ("nfcorpus-halves", "validated"),
        ("dbpedia-halves", "validated")]  # the half documents are cut from the corpora, not fetched
    assert _origin(paths)["path"] == str(FOLDER / SUBSET) and _origin(paths)["sha256"] == SHIPPED[SUBSET]
    halves = {split: len((paths.dataset("dbpedia") / "qrels" / f"{split}.tsv").read_text().splitlines()) > 1
              for split in ("dev", "test")}
    assert halves == {"dev": True, "test": True} and report.carve_out is not None
    # A mirror that holds the subset is read first; the same bytes reinstall nothing (the record's origin moves).
    shutil.copyfile(beir_mirror / SUBSET, mirror / SUBSET)
    again = download(params, paths, ["dbpedia-entity-subset"], config_dir=ROOT, progress=False)
    assert [f.status for f in again.datasets] == ["present"] and _origin(paths)["path"] == str(mirror / SUBSET)


@pytest.mark.parametrize("value", [None, ""])
def test_with_no_mirror_the_shipped_subset_is_installed(tmp_path, monkeypatch, value):
    """No mirror at all (the variable unset, or set and empty): the subset needs no server."""
    if value is None:
        monkeypatch.delenv("PGRANK_BEIR_MIRROR", raising=False)
    else:
        monkeypatch.setenv("PGRANK_BEIR_MIRROR", value)
    params, paths = _demo(tmp_path)
    report = download(params, paths, ["dbpedia"], config_dir=ROOT, progress=False)
    assert [(f.name, f.status) for f in report.datasets] == [("dbpedia-entity-subset", "validated"),
                                                             ("dbpedia", "validated")]
    assert _origin(paths)["sha256"] == SHIPPED[SUBSET]


def _cli(tmp_path: Path, mirror: str | None, *args: str) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k not in ("PGRANK_BEIR_MIRROR", "PGRANK_PROFILE")}
    if mirror is not None:
        env["PGRANK_BEIR_MIRROR"] = mirror
    sets = [w for s in (f"paths.root={tmp_path / 'runs'}", f"paths.data={tmp_path / 'data'}", "tracking.enabled=false")
            for w in ("--set", s)]
    return subprocess.run([sys.executable, str(ROOT / "cli.py"), "--params", str(ROOT / "params.yaml"), "--profile",
                           "demo", *sets, "download", *args],
                          cwd=tmp_path, capture_output=True, text=True, env=env, timeout=300)


def test_a_mirror_that_lacks_a_beir_zip_names_the_file_and_where_pgrank_looked(tmp_path):
    (tmp_path / "mirror").mkdir()
    result = _cli(tmp_path, str(tmp_path / "mirror"), "scifact")
    assert result.returncode != 0 and "Traceback" not in result.stderr
    [error] = [line for line in result.stderr.splitlines() if line.startswith("pgrank: error:")]
    assert error == (f"pgrank: error: {tmp_path / 'mirror' / 'scifact.zip'}: not in the mirror named by "
                     "$PGRANK_BEIR_MIRROR; put scifact.zip there, or name no mirror (an unset or empty "
                     "$PGRANK_BEIR_MIRROR) to download it from BEIR's server")
    assert not (tmp_path / "data" / "scifact").exists()


def test_a_mirror_source_that_pgrank_does_not_ship_names_the_file_and_where_pgrank_looked(tmp_path, monkeypatch):
    from pgrank.config import SourceConfig
    from pgrank.download.mirror import resolve_source
    from pgrank.download.sources import mirror_zip

    (tmp_path / "mirror").mkdir()
    cfg = SourceConfig(mirror="other-subset.zip")
    with pytest.raises(DataError) as missing:
        mirror_zip("other", cfg, tmp_path / "other", resolve_source(str(tmp_path / "mirror")), None)
    assert str(missing.value) == (f"data.sources.other.mirror 'other-subset.zip': no such file "
                                  f"{tmp_path / 'mirror' / 'other-subset.zip'} in the BEIR mirror named by --mirror, and "
                                  "pgrank ships no other-subset.zip; put it there")
    monkeypatch.setenv("PGRANK_BEIR_MIRROR", "")
    with pytest.raises(DataError, match=r"not on BEIR's server, and pgrank ships no other-subset\.zip; set "
                                        r"\$PGRANK_BEIR_MIRROR"):
        mirror_zip("other", cfg, tmp_path / "other", resolve_source(None), None)
    assert not (tmp_path / "other").exists()


def test_a_pin_in_the_configuration_also_binds_the_shipped_copy(tmp_path, monkeypatch):
    monkeypatch.delenv("PGRANK_BEIR_MIRROR", raising=False)
    from pgrank.config import SourceConfig
    from pgrank.download.mirror import resolve_source
    from pgrank.download.sources import mirror_zip

    cfg = SourceConfig(mirror=SUBSET, sha256="0" * 64)
    with pytest.raises(DataError, match=r"data.sources.subset: .*sha256 mismatch \(expected 0{64} from "
                                        r"data.sources.subset.sha256"):
        mirror_zip("subset", cfg, tmp_path / "subset", resolve_source(None), None)
    assert not (tmp_path / "subset").exists()


def test_a_mirror_url_that_does_not_serve_the_subset_falls_back_to_the_shipped_copy(tmp_path, monkeypatch):
    import functools
    import http.server
    import threading

    from pgrank.config import SourceConfig
    from pgrank.download.mirror import resolve_source
    from pgrank.download.sources import mirror_zip

    monkeypatch.setenv("no_proxy", "127.0.0.1,localhost")
    for var in ("http_proxy", "HTTP_PROXY"):
        monkeypatch.delenv(var, raising=False)
    (tmp_path / "served").mkdir()
    handler = functools.partial(http.server.SimpleHTTPRequestHandler, directory=str(tmp_path / "served"))
    handler.log_message = lambda *args: None
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()
    try:
        source = resolve_source(f"http://127.0.0.1:{server.server_address[1]}")
        assert mirror_zip("subset", SourceConfig(mirror=SUBSET), tmp_path / "subset", source, None) == "validated"
        origin = json.loads((tmp_path / "subset" / ".pgrank-download.json").read_text())["origin"]
        assert (origin["path"], origin["sha256"]) == (str(FOLDER / SUBSET), SHIPPED[SUBSET])
        # a file pgrank does not ship is the transfer's error, naming the URL
        with pytest.raises(DataError, match=r"other\.zip: HTTP 404"):
            mirror_zip("other", SourceConfig(mirror="other.zip"), tmp_path / "other", source, None)
    finally:
        server.shutdown()
        server.server_close()
