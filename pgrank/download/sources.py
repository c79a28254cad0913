"""Datasets of your own in BEIR format (``data.sources``): read in place, validated, fingerprinted.

A source is named in ``params.yaml`` and then used like a BEIR name::

    data:
      sources:
        acme: {path: /data/acme-beir}                          # a folder: read in place, never copied
        news: {url: https://host/news-beir.zip, sha256: ...}   # an http(s) zip: fetched like a BEIR download
        legal: {path: exports/legal-beir.zip}                  # a local zip (e.g. from `dvc import-url`)
        subset: {mirror: dbpedia-entity-subset.zip}            # a zip on the BEIR mirror, not on BEIR's server
      train: acme/train
      eval_sets: {acme: [test]}

Every stage reads a dataset from ``Paths.dataset(name)``. For a source that is:

* a **folder**: a small folder of links, ``corpus.jsonl``, ``queries.jsonl`` and ``qrels/`` pointing at
  your folder, plus pgrank's record. Nothing is copied and nothing is written into your folder (it may
  be DVC-tracked or read-only). A relative ``path`` is relative to the params file.
* a **zip** (``url``, ``mirror`` or a ``path`` ending in ``.zip``): the extracted folder, installed atomically as a
  BEIR download is (:mod:`pgrank.download.archive`: zip-slip and symlink members refused). ``sha256`` pins
  the zip. A URL is re-checked on each run with its HTTP validators (ETag, Last-Modified, length) and
  fetched again only when they changed (or when the server sends none); a local zip is re-extracted
  when its SHA-256 changes. A ``mirror`` zip is one the BEIR mirror holds beside BEIR's own zips
  (:mod:`pgrank.download.mirror`: ``$PGRANK_BEIR_MIRROR``, ``--mirror`` or ``data.mirror``), such as a subset
  BEIR's server does not have. When pgrank ships a zip of that name (:mod:`pgrank.download.shipped`: the demo's
  DBPedia-Entity subset), the shipped copy stands in wherever the mirror is not named or lacks it; otherwise a
  missing file is an error that names it and where pgrank looked.

Validation is a BEIR download's (:func:`pgrank.download.dataset_checks.validate_folder`: bad lines named by file
and line, duplicate ids, judged queries without text), plus judgments whose document is not in the
corpus, which are errors here (``missing_documents: warn`` keeps them, as BEIR does). It runs when the
content changed: the record keeps the fingerprint that was last validated.

Change detection is the manifests' (:mod:`pgrank.download.manifests`): ``dvc.yaml``'s ``download`` stage is
``always_changed``, so each ``dvc repro`` re-fingerprints every dataset (SHA-256 per file, cached by size
and modification time, so unchanged files are not read) and writes identical manifest bytes when
nothing changed; DVC then re-runs nothing downstream. A new qrels line or a new document changes the
dataset's manifest, and DVC re-runs exactly that dataset's stages (and training, through the carve-out,
when it is ``data.train``'s dataset).
"""

from __future__ import annotations

import json
import logging
import os
import urllib.error
import urllib.request
from pathlib import Path

from pgrank.atomic import atomic_path, write_json
from pgrank.config import SourceConfig
from pgrank.data.checksums import DOWNLOAD_RECORD, file_sha256
from pgrank.download.archive import beir_folders, extract
from pgrank.download.dataset_checks import validate_folder
from pgrank.download.manifests import fingerprint
from pgrank.download.mirror import MIRROR_ENV, Source
from pgrank.download.shipped import SHIPPED, shipped_zip
from pgrank.download.transfer import TIMEOUT_S, transfer
from pgrank.errors import DataError

log = logging.getLogger(__name__)

# The files of a BEIR folder that a folder source links to (qrels/ as a whole: new splits appear by themselves).
LINKED = ("corpus.jsonl", "queries.jsonl", "qrels")
_VALIDATORS = ("etag", "last-modified", "content-length")


def _read_record(target: Path) -> dict | None:
    try:
        return json.loads((target / DOWNLOAD_RECORD).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None


def installed_record(name: str, target: Path) -> dict | None:
    """The record of a previous install of the source ``name`` at ``target``, ``None`` if none; a BEIR download of
    the same name is an error (sources of every kind, half documents included, record an ``origin``)."""
    if not target.exists() and not target.is_symlink():
        return None
    record = _read_record(target)
    if record is None or "origin" not in record:
        raise DataError(f"data.sources.{name}: {target} already holds a dataset that is not this source (a BEIR "
                        f"download?); give the source another name, or delete {target}")
    return record


def _summary(folder: Path, label: str, missing_documents: str) -> dict:
    summary = validate_folder(folder, label, missing_documents=missing_documents)
    return vars(summary)


def _corpus_entry(folder: Path, corpus_sha256: str) -> dict:
    """What :func:`pgrank.data.checksums.corpus_sha256` trusts while the corpus' size and mtime are unchanged."""
    st = (folder / "corpus.jsonl").stat()
    return {"sha256": corpus_sha256, "bytes": st.st_size, "mtime_ns": st.st_mtime_ns}


def write_install_record(folder: Path, name: str, origin: dict, summary: dict) -> None:
    """The record of the source ``name`` installed in ``folder`` (still being built, before its atomic rename): its
    origin, the validated folder's summary and its corpus entry; :func:`installed_record` reads it back."""
    record = {"dataset": name, "origin": origin, "folders": {".": summary},
              "corpus": _corpus_entry(folder, summary["corpus_sha256"])}
    write_json(folder / DOWNLOAD_RECORD, record)


# --------------------------------------------------------------------------------------- folders


def _source_folder(name: str, cfg: SourceConfig, config_dir: Path) -> Path:
    folder = (config_dir / Path(cfg.path).expanduser()).resolve()
    where = f"data.sources.{name}.path {cfg.path!r}"
    if not folder.is_dir():
        raise DataError(f"{where}: no such folder {folder} (expected a BEIR folder: corpus.jsonl, queries.jsonl, "
                        "qrels/*.tsv)")
    missing = [f for f in ("corpus.jsonl", "queries.jsonl") if not (folder / f).is_file()]
    if not (folder / "qrels").is_dir() or not any((folder / "qrels").glob("*.tsv")):
        missing.append("qrels/*.tsv")
    if missing:
        raise DataError(f"{where}: {folder} is not a BEIR folder (no {', '.join(missing)})")
    return folder


def _links_point_at(target: Path, folder: Path) -> bool:
    return all((target / f).is_symlink() and Path(os.readlink(target / f)) == folder / f for f in LINKED)


def link_folder(name: str, cfg: SourceConfig, target: Path, cache_file: Path, config_dir: Path) -> str:
    """Make ``target`` read the source folder in place; validate it when its content changed.

    Returns ``"validated"`` (new or changed content, validated now) or ``"present"`` (unchanged).
    """
    folder = _source_folder(name, cfg, config_dir)
    record = installed_record(name, target)
    if record is None or not _links_point_at(target, folder):
        if record is not None:
            log.info("data.sources.%s: now %s (was %s)", name, folder, record["origin"].get("path"))
        with atomic_path(target, directory=True) as tmp:
            for file in LINKED:
                (tmp / file).symlink_to(folder / file, target_is_directory=(file == "qrels"))
            record = {"dataset": name, "origin": {"kind": "folder", "path": str(folder)}}
            write_json(tmp / DOWNLOAD_RECORD, record)
    files = fingerprint(target, cache_file)
    if record.get("validated") == files:
        return "present"
    summary = _summary(target, str(folder), cfg.missing_documents)
    record = dict(record, validated=files, folders={".": summary},
                  corpus=_corpus_entry(target, summary["corpus_sha256"]))
    write_json(target / DOWNLOAD_RECORD, record)
    return "validated"


# --------------------------------------------------------------------------------------- zips


def _install_zip(name: str, cfg: SourceConfig, zip_path: Path, target: Path, origin: dict, label: str) -> None:
    """Extract, validate and atomically install a zip of one BEIR folder as ``target``."""
    with atomic_path(target, directory=True) as tmp:
        extract(zip_path, tmp, label, progress=False)
        folders = beir_folders(tmp, label)
        if folders != ["."]:
            raise DataError(f"{label}: holds several BEIR folders ({', '.join(folders)}); a source is one dataset "
                            "(corpus.jsonl, queries.jsonl, qrels/ at the top, or in one top folder)")
        write_install_record(tmp, name, origin, _summary(tmp, f"{label}: {name}", cfg.missing_documents))


def _check_pin(name: str, cfg: SourceConfig, digest: str, where: str) -> None:
    if cfg.sha256 is not None and digest != cfg.sha256:
        raise DataError(f"data.sources.{name}: {where}: sha256 mismatch (expected {cfg.sha256} from data.sources."
                        f"{name}.sha256, got {digest})")


def local_zip(name: str, cfg: SourceConfig, target: Path, config_dir: Path) -> str:
    """A ``path: *.zip`` source: (re-)extracted when the zip's SHA-256 differs from the installed one's."""
    zip_path = (config_dir / Path(cfg.path).expanduser()).resolve()
    if not zip_path.is_file():
        raise DataError(f"data.sources.{name}.path {cfg.path!r}: no such file {zip_path}")
    record = installed_record(name, target)
    st = zip_path.stat()
    origin = (record or {}).get("origin", {})
    if origin.get("path") == str(zip_path) and (origin.get("bytes"), origin.get("mtime_ns")) == (st.st_size, st.st_mtime_ns):
        digest = origin["sha256"]  # unchanged size and mtime: the recorded hash stands
    else:
        digest = file_sha256(zip_path)
    _check_pin(name, cfg, digest, str(zip_path))
    origin_now = {"kind": "zip", "path": str(zip_path), "sha256": digest, "bytes": st.st_size, "mtime_ns": st.st_mtime_ns}
    if origin.get("sha256") == digest:
        if origin != origin_now:
            write_json(target / DOWNLOAD_RECORD, dict(record, origin=origin_now))
        return "present"
    _install_zip(name, cfg, zip_path, target, origin_now, zip_path.name)
    return "validated"


def _head(url: str) -> dict[str, str]:
    """The validators of a URL's current content (HEAD request); empty when the server sends none."""
    request = urllib.request.Request(url, method="HEAD", headers={"User-Agent": "pgrank"})
    with urllib.request.urlopen(request, timeout=TIMEOUT_S) as resp:
        return {k: resp.headers[k] for k in _VALIDATORS if resp.headers.get(k)}


def url_zip(name: str, cfg: SourceConfig, target: Path, *, progress: bool = True) -> str:
    """A ``url`` source: fetched and installed when its validators (or pinned sha256) say it changed."""
    record = installed_record(name, target)
    origin = (record or {}).get("origin", {})
    same_url = origin.get("url") == cfg.url
    if same_url and cfg.sha256 is not None and origin.get("sha256") == cfg.sha256:
        return "present"  # pinned content that is installed: nothing to ask the server
    try:
        validators = _head(cfg.url)
    except (urllib.error.URLError, OSError) as exc:
        if same_url:
            log.warning("data.sources.%s: cannot reach %s (%s); using the copy installed from it", name, cfg.url,
                        getattr(exc, "reason", exc))
            return "present"
        validators = {}  # the GET below reports the failure
    if same_url and validators and origin.get("validators") == validators:
        return "present"
    data_dir = target.parent
    data_dir.mkdir(parents=True, exist_ok=True)
    part = data_dir / f"{name}.zip.part"
    part.unlink(missing_ok=True)  # the content may have changed since a partial transfer: start afresh
    base, _, filename = cfg.url.rpartition("/")
    try:
        transfer(Source(base, mirror=True), filename, part, progress)  # resumable, retrying, as BEIR's
        digest = file_sha256(part)
        _check_pin(name, cfg, digest, cfg.url)
        origin_now = {"kind": "url", "url": cfg.url, "sha256": digest, "validators": validators}
        if same_url and origin.get("sha256") == digest:
            write_json(target / DOWNLOAD_RECORD, dict(record, origin=origin_now))  # same bytes: only the validators moved
            return "present"
        _install_zip(name, cfg, part, target, origin_now, f"{name}.zip from {cfg.url}")
    finally:
        part.unlink(missing_ok=True)
    return "validated"


def _served(url: str) -> bool:
    """Whether a mirror URL serves a file (a GET of its first byte): false on HTTP 404 or 410, and when the mirror
    cannot be reached; any other answer is the transfer's to report."""
    request = urllib.request.Request(url, headers={"User-Agent": "pgrank", "Range": "bytes=0-0"})
    try:
        with urllib.request.urlopen(request, timeout=TIMEOUT_S):
            return True
    except urllib.error.HTTPError as exc:
        return exc.code not in (404, 410)
    except (urllib.error.URLError, OSError):
        return False


def mirror_zip(name: str, cfg: SourceConfig, target: Path, mirror: Source | None, sums: dict[str, str] | None, *,
               progress: bool = True) -> str:
    """A ``mirror: NAME.zip`` source: the zip of that name on the BEIR mirror, installed as a local zip (a mirror
    folder) or a URL (a mirror URL) is, pinned by ``sha256``, else by the mirror's ``SHA256SUMS`` when it lists it, else
    by the pin of the copy pgrank ships of that name (:mod:`pgrank.download.shipped`).

    When pgrank ships the file, the mirror is optional: with no mirror named, a mirror folder that lacks the file or a
    mirror URL that does not serve it (or cannot be reached), the shipped copy is installed, checked against ``sha256``
    when given and always against its own pin. Otherwise a missing file is one error naming it and where pgrank looked.
    """
    where = f"data.sources.{name}.mirror {cfg.mirror!r}"
    mirrored = mirror is not None and mirror.mirror
    located = mirror.locate(cfg.mirror) if mirrored else None
    if not mirrored:
        on_mirror = False
    elif mirror.local:
        on_mirror = Path(located).is_file()
    else:  # a mirror URL: asked only when there is a shipped copy to fall back to (url_zip reports its own failures)
        on_mirror = cfg.mirror not in SHIPPED or _served(located)
    if on_mirror:
        pin = cfg.sha256 or (sums or {}).get(cfg.mirror) or SHIPPED.get(cfg.mirror)
        if mirror.local:
            update = {"path": located, "mirror": None, "sha256": pin}
            return local_zip(name, cfg.model_copy(update=update), target, Path.cwd())
        return url_zip(name, cfg.model_copy(update={"url": located, "mirror": None, "sha256": pin}), target,
                       progress=progress)
    shipped = shipped_zip(cfg.mirror)
    if shipped is None:
        if mirrored:
            raise DataError(f"{where}: no such file {located} in the BEIR mirror named by {mirror.named_by or 'data.mirror'},"
                            f" and pgrank ships no {cfg.mirror}; put it there")
        raise DataError(f"{where}: not on BEIR's server, and pgrank ships no {cfg.mirror}; set ${MIRROR_ENV} (or --mirror,"
                        f" or data.mirror) to a folder or URL that holds it")
    if mirrored:
        log.info("data.sources.%s: %s is not in the BEIR mirror (%s); installing the copy pgrank ships", name,
                 cfg.mirror, located)
    update = {"path": str(shipped), "mirror": None, "sha256": cfg.sha256 or SHIPPED[cfg.mirror]}
    return local_zip(name, cfg.model_copy(update=update), target, Path.cwd())


def install_source(name: str, cfg: SourceConfig, target: str | Path, cache_file: str | Path,
                   config_dir: str | Path, *, progress: bool = True, mirror: Source | None = None,
                   sums: dict[str, str] | None = None) -> str:
    """Make the source ``name`` readable at ``target`` (``Paths.dataset(name)``), validated.

    Args:
        name: the source's name under ``data.sources``.
        cfg: its configuration.
        target: ``Paths.dataset(name)``.
        cache_file: ``Paths.fingerprint_cache(name)`` (file checksums by size and mtime).
        config_dir: the params file's folder, against which a relative ``path`` is resolved.
        progress: show a progress bar while a URL downloads.
        mirror, sums: the BEIR mirror and its ``SHA256SUMS`` (:mod:`pgrank.download.mirror`), for ``mirror`` sources.

    Returns:
        ``"validated"`` when new or changed content was validated and installed, ``"present"`` when
        nothing changed.

    Raises:
        DataError: a missing folder or file, an unreachable URL, a pin mismatch, a bad archive, or a
            malformed BEIR file (file and line named); ``target`` is then left as it was.
    """
    target, config_dir = Path(target), Path(config_dir)
    if cfg.mirror is not None:
        return mirror_zip(name, cfg, target, mirror, sums, progress=progress)
    if cfg.url is not None:
        return url_zip(name, cfg, target, progress=progress)
    if cfg.path.endswith(".zip"):
        return local_zip(name, cfg, target, config_dir)
    return link_folder(name, cfg, target, Path(cache_file), config_dir)

