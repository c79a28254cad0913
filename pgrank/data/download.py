"""``pgrank download``: fetch BEIR zips, verify them, extract safely, validate, rename into place.

For each dataset ``NAME``:

1. ``NAME.zip`` is fetched from BEIR's server or a mirror (``--mirror``, ``$PGRANK_BEIR_MIRROR`` or
   ``data.mirror``: a folder or an http(s) URL) into ``{data}/NAME.zip.part``. The transfer resumes
   where a previous one stopped (HTTP ``Range``, or an offset copy from a folder) and retries a
   connection cut mid-way by itself.
2. The file is checked against the mirror's ``SHA256SUMS`` when it lists ``NAME.zip``, otherwise
   against BEIR's published MD5 (:mod:`pgrank.data.catalogue`); a name in neither is used with a warning.
3. Members are extracted into a temporary folder beside the target; a member whose path is absolute
   or escapes the folder (zip-slip), or that is a symbolic link, is refused. The folder is then
   validated as the loader would read it (:func:`pgrank.data.beir.validate_folder`).
4. Only then is the folder renamed to ``{data}/NAME`` and the ``.part`` file deleted.

Datasets named under ``data.sources`` are the user's own: read in place from a folder, or fetched from
their own zip, validated and fingerprinted the same way (:mod:`pgrank.data.sources`).

A checksum mismatch, a corrupt or truncated archive, an unsafe member or a malformed file raises
:class:`DataError` and leaves the data folder as it was (a ``.part`` file is kept only for an
interrupted transfer, so the next run resumes it). A folder that already carries its download
record is left alone.

Example:
    >>> report = download(params, paths, ["scifact"], mirror="../shared/data/beir")
    >>> report.datasets[0].status
    'downloaded'
"""

from __future__ import annotations

import http.client
import json
import logging
import os
import re
import shutil
import time
import urllib.error
import urllib.parse
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from tqdm.auto import tqdm

from pgrank import tracking
from pgrank.atomic import atomic_path, clear_stale_lock, exclusive, fault_point, lock_file
from pgrank.config import Params
from pgrank.data.archive import beir_folders, extract
from pgrank.data.carve_out import CarveOut, write_carve_out
from pgrank.data.catalogue import BEIR_BASE_URL, BEIR_MD5, NOT_PUBLIC
from pgrank.data.checksums import DOWNLOAD_RECORD, file_digest
from pgrank.data.manifests import write_manifest, write_validation_sets_manifest
from pgrank.data.sources import install_source
from pgrank.data.validation import FolderSummary, validate_folder
from pgrank.errors import DataError
from pgrank.paths import Paths

log = logging.getLogger(__name__)

MIRROR_ENV = "PGRANK_BEIR_MIRROR"
SUMS_FILE = "SHA256SUMS"
_CHUNK = 1 << 16  # bytes per read and write: an interrupted transfer keeps all but the last chunk
_TIMEOUT_S = 60
_NAME = re.compile(r"^[\w][\w.-]*$")
_SUMS_LINE = re.compile(r"^([0-9a-fA-F]{64}) [ *](.+)$")


@dataclass(frozen=True)
class Source:
    """Where ``NAME.zip`` files come from: BEIR's server, a mirror URL or a mirror folder."""

    base: str
    local: bool = False
    mirror: bool = False

    def locate(self, filename: str) -> str:
        return str(Path(self.base) / filename) if self.local else f"{self.base}/{filename}"


@dataclass(frozen=True)
class Checksum:
    algorithm: Literal["sha256", "md5"]
    digest: str
    origin: str  # for messages: where the expected value comes from


@dataclass(frozen=True)
class Fetched:
    name: str
    path: Path
    # downloaded now | present with pgrank's download record | present, put there by someone else |
    # a data.sources dataset whose new or changed content was validated now
    status: Literal["downloaded", "present", "unrecorded", "validated"]
    checksum: Checksum | None = None


@dataclass(frozen=True)
class DownloadReport:
    datasets: list[Fetched]
    carve_out: CarveOut | None


class _Interrupted(Exception):
    """A transfer stopped mid-way; the ``.part`` file holds what arrived and can be resumed."""


# --------------------------------------------------------------------------------------- source


def _is_url(base: str) -> bool:
    return base.startswith(("http://", "https://"))


def absolute_mirror_env() -> None:
    """Make a relative ``$PGRANK_BEIR_MIRROR`` folder absolute, against the current directory.

    The CLI calls this first, so that a relative folder means what it meant where the user typed it,
    also in the stage processes DVC starts later inside a profile workspace (another directory).
    """
    value = os.environ.get(MIRROR_ENV)
    if value and not _is_url(value) and not value.startswith("file://"):
        os.environ[MIRROR_ENV] = str(Path(value).expanduser().resolve())


def resolve_source(mirror: str | None = None, configured: str | None = None, *,
                   config_dir: str | Path | None = None) -> Source:
    """The download source: ``mirror`` (CLI), else ``$PGRANK_BEIR_MIRROR``, else ``configured``
    (``data.mirror``), else BEIR's server.

    A relative folder is relative to the working directory, except ``data.mirror``, which is relative
    to the params file's folder (``config_dir``).
    """
    base = mirror or os.environ.get(MIRROR_ENV)
    where = "--mirror" if mirror else f"${MIRROR_ENV}"
    relative_to = Path.cwd()
    if not base and configured:
        base, where = configured, "data.mirror"
        relative_to = Path(config_dir) if config_dir is not None else relative_to
    if not base:
        return Source(BEIR_BASE_URL)
    if _is_url(base):
        return Source(base.rstrip("/"), mirror=True)
    if base.startswith("file://"):
        base = urllib.parse.unquote(urllib.parse.urlparse(base).path)
    folder = (relative_to / Path(base).expanduser()).resolve()
    if not folder.is_dir():
        raise DataError(f"{where} {base!r}: no such folder {folder} (expected a folder or an http(s) URL holding "
                        "NAME.zip files)")
    return Source(str(folder), local=True, mirror=True)


def parse_sha256sums(text: str, where: str) -> dict[str, str]:
    """Parse ``sha256sum`` output (``<hex>  <file>``) into ``{file: hex}``; blank and ``#`` lines skipped."""
    sums = {}
    for line_no, line in enumerate(text.splitlines(), 1):
        if not line.strip() or line.lstrip().startswith("#"):
            continue
        match = _SUMS_LINE.match(line.strip())
        if not match:
            raise DataError(f"{where}:{line_no}: expected '<sha256>  <name>.zip' (got {line!r})")
        sums[match.group(2).strip().removeprefix("./")] = match.group(1).lower()
    return sums


def read_sha256sums(source: Source) -> dict[str, str] | None:
    """The mirror's ``SHA256SUMS`` as ``{file: hex}``, or None where it has none (or is BEIR's server)."""
    if not source.mirror:
        return None
    where = source.locate(SUMS_FILE)
    if source.local:
        path = Path(where)
        return parse_sha256sums(path.read_text(encoding="utf-8"), where) if path.is_file() else None
    try:
        with urllib.request.urlopen(_request(where), timeout=_TIMEOUT_S) as resp:
            return parse_sha256sums(resp.read().decode("utf-8"), where)
    except urllib.error.HTTPError as exc:
        if exc.code == 404:
            return None
        raise DataError(f"{where}: HTTP {exc.code} {exc.reason}") from None
    except (urllib.error.URLError, OSError) as exc:
        raise DataError(f"{where}: cannot reach the mirror ({getattr(exc, 'reason', exc)})") from None


def expected_checksum(name: str, sums: dict[str, str] | None) -> Checksum | None:
    """The mirror's SHA-256 for ``NAME.zip`` if listed, else BEIR's published MD5, else None."""
    if sums and f"{name}.zip" in sums:
        return Checksum("sha256", sums[f"{name}.zip"], f"the mirror's {SUMS_FILE}")
    if name in BEIR_MD5:
        return Checksum("md5", BEIR_MD5[name], "BEIR's published MD5")
    return None


# --------------------------------------------------------------------------------------- transfer


def _request(url: str, start: int = 0) -> urllib.request.Request:
    headers = {"User-Agent": "pgrank"}
    if start:
        headers["Range"] = f"bytes={start}-"
    return urllib.request.Request(url, headers=headers)


def _bar(desc: str, total: int | None, initial: int, progress: bool) -> tqdm:
    return tqdm(total=total, initial=initial, unit="B", unit_scale=True, unit_divisor=1024, desc=desc,
                disable=not progress, mininterval=0.5)


def _copy_local(src: Path, part: Path, progress: bool) -> None:
    if not src.is_file():
        raise DataError(f"{src}: not in the mirror (expected {src.name} there)")
    size = src.stat().st_size
    have = part.stat().st_size if part.exists() else 0
    if have > size:  # a stale .part of some other file: start over
        have = 0
    with open(src, "rb") as fin, open(part, "ab" if have else "wb") as fout, \
            _bar(src.name, size, have, progress) as bar:
        fin.seek(have)
        while chunk := fin.read(_CHUNK):
            fout.write(chunk)
            bar.update(len(chunk))
            fault_point("download.chunk")


def _fetch_http(url: str, part: Path, progress: bool) -> None:
    have = part.stat().st_size if part.exists() else 0
    try:
        resp = urllib.request.urlopen(_request(url, have), timeout=_TIMEOUT_S)
    except urllib.error.HTTPError as exc:
        if exc.code == 416 and have:  # nothing left to send: the .part is complete; the checksum decides
            return
        hint = " (is the name a BEIR dataset?)" if exc.code == 404 else ""
        raise DataError(f"{url}: HTTP {exc.code} {exc.reason}{hint}") from None
    except (urllib.error.URLError, OSError) as exc:
        raise DataError(f"{url}: cannot connect ({getattr(exc, 'reason', exc)}); "
                        f"use --mirror or ${MIRROR_ENV} where BEIR's server is unreachable") from None
    with resp:
        start, total = 0, None
        if resp.status == 206:
            match = re.match(r"bytes (\d+)-\d+/(\d+|\*)", resp.headers.get("Content-Range", ""))
            if not match or int(match.group(1)) != have:
                part.unlink(missing_ok=True)
                raise _Interrupted("the server answered a different byte range; starting over")
            start = have
            total = int(match.group(2)) if match.group(2) != "*" else None
        elif resp.headers.get("Content-Length"):
            total = int(resp.headers["Content-Length"])
        with open(part, "ab" if start else "wb") as out, _bar(url.rsplit("/", 1)[-1], total, start, progress) as bar:
            while True:
                try:
                    chunk = resp.read(_CHUNK)
                except (http.client.HTTPException, OSError) as exc:  # the connection, not the disk
                    raise _Interrupted(f"{type(exc).__name__}: {exc}") from None
                if not chunk:
                    break
                out.write(chunk)
                bar.update(len(chunk))
                fault_point("download.chunk")
    if total is not None and part.stat().st_size < total:
        raise _Interrupted(f"connection closed at {part.stat().st_size} of {total} bytes")


def _transfer(source: Source, filename: str, part: Path, progress: bool, attempts: int = 3) -> None:
    """Bring ``filename`` into ``part``, resuming what is there; retry cut connections."""
    for attempt in range(1, attempts + 1):
        try:
            if source.local:
                _copy_local(Path(source.locate(filename)), part, progress)
            else:
                _fetch_http(source.locate(filename), part, progress)
            return
        except OSError as exc:  # a full disk: the .part keeps what arrived, a rerun resumes it
            if exc.filename is None:
                exc.filename = str(part)
            raise
        except _Interrupted as exc:
            got = part.stat().st_size if part.exists() else 0
            if attempt == attempts:
                raise DataError(f"{filename}: download interrupted after {got} bytes ({exc}); "
                                f"run the command again to resume") from None
            log.warning("%s: download interrupted after %d bytes (%s); resuming (attempt %d of %d)",
                        filename, got, exc, attempt + 1, attempts)
            time.sleep(attempt - 1)


def _download_verified(source: Source, name: str, part: Path, checksum: Checksum | None, progress: bool) -> None:
    resumed = part.exists()
    _transfer(source, f"{name}.zip", part, progress)
    if checksum is None:
        return
    got = file_digest(part, checksum.algorithm)
    if got == checksum.digest:
        return
    part.unlink()
    if resumed:  # the old partial file may belong to another version of the zip: try once from scratch
        log.warning("%s.zip: the resumed download failed its checksum; downloading it afresh", name)
        return _download_verified(source, name, part, checksum, progress)
    raise DataError(f"{name}.zip from {source.locate(name + '.zip')}: {checksum.algorithm} checksum mismatch "
                    f"(expected {checksum.digest} from {checksum.origin}, got {got}); the file was deleted")


def _install(part: Path, target: Path, name: str, record: dict, progress: bool) -> dict[str, FolderSummary]:
    label = f"{name}.zip"
    with atomic_path(target, directory=True) as tmp:
        extract(part, tmp, label, progress)
        summaries = {}
        for rel in beir_folders(tmp, label):
            shown = f"{label}: {name}" if rel == "." else f"{label}: {name}/{rel}"
            summaries[rel] = validate_folder(tmp / rel, shown, progress=progress)
        record = dict(record, folders={rel: vars(s) for rel, s in summaries.items()})
        if "." in summaries:
            st = (tmp / "corpus.jsonl").stat()
            record["corpus"] = {"sha256": summaries["."].corpus_sha256, "bytes": st.st_size, "mtime_ns": st.st_mtime_ns}
        (tmp / DOWNLOAD_RECORD).write_text(json.dumps(record, indent=2, sort_keys=True) + "\n", encoding="utf-8")
    return summaries


# --------------------------------------------------------------------------------------- stage


def fetch_dataset(
    name: str, target: str | Path, source: Source, sums: dict[str, str] | None = None, *, progress: bool = True,
) -> Fetched:
    """Download, verify, extract and validate one BEIR dataset into ``target`` (a no-op if there).

    Args:
        name: BEIR name (``NAME.zip`` on the source).
        target: the dataset folder, normally ``paths.dataset(name)``.
        source: from :func:`resolve_source`.
        sums: the mirror's ``SHA256SUMS`` (:func:`read_sha256sums`), if any.
        progress: show progress bars.

    Raises:
        DataError: an unknown source file, an interrupted transfer (resumable), a checksum
            mismatch, a corrupt archive, an unsafe member or a malformed BEIR file.
    """
    if not _NAME.match(name):
        raise DataError(f"dataset name {name!r}: expected a BEIR name such as 'scifact' "
                        "(letters, digits, '_', '-', '.')")
    target = Path(target)
    if target.exists():  # installed, or a folder of the user's (a read-only shared folder needs no lock)
        if (target / DOWNLOAD_RECORD).is_file():
            clear_stale_lock(lock_file(target))  # a holder killed after the dataset was installed
        return _fetch(name, target, source, sums, progress)
    data_dir = target.parent
    created = not data_dir.exists()
    try:
        # paths.data is shared by every profile: one process downloads a dataset, the others wait and reuse it.
        with exclusive(lock_file(target), what=f"dataset {name} ({target})"):
            return _fetch(name, target, source, sums, progress)
    except BaseException:
        if created and data_dir.is_dir() and {p.name for p in data_dir.iterdir()} <= {lock_file(target).name}:
            shutil.rmtree(data_dir)  # leave no data folder behind that did not exist
        raise


def _fetch(name: str, target: Path, source: Source, sums: dict[str, str] | None, progress: bool) -> Fetched:
    if (target / DOWNLOAD_RECORD).is_file():  # installed by another process while this one waited
        return Fetched(name, target, "present")
    if target.exists():
        log.warning("%s: %s exists but was not downloaded by pgrank; using it unverified (delete it to download again)",
                    name, target)
        return Fetched(name, target, "unrecorded")
    if name in NOT_PUBLIC and not source.mirror:
        raise DataError(f"{name}: BEIR does not distribute this dataset; build it as described at "
                        f"{NOT_PUBLIC[name]} and serve it from a mirror (--mirror DIR)")
    checksum = expected_checksum(name, sums)
    part = target.parent / f"{name}.zip.part"
    _download_verified(source, name, part, checksum, progress)
    if checksum is None:
        log.warning("%s.zip: no published checksum (not in BEIR's MD5 table%s); it cannot be verified",
                    name, f" nor the mirror's {SUMS_FILE}" if sums is not None else "")
    record = {"dataset": name, "source": source.locate(f"{name}.zip"),
              "checksum": vars(checksum) if checksum else None}
    try:
        _install(part, target, name, record, progress)
    except DataError:
        part.unlink(missing_ok=True)  # complete but bad: a rerun must fetch it afresh
        raise
    part.unlink()
    return Fetched(name, target, "downloaded", checksum)


def default_datasets(params: Params) -> list[str]:
    """Every dataset named in ``data.train``, ``train.validation_sets`` and ``data.eval_sets``, in that
    order, once each."""
    names = [params.data.train.split("/")[0]] + [s.split("/")[0] for s in params.train.validation_sets] \
        + [s.split("/")[0] for s in params.data.eval_sets]
    return list(dict.fromkeys(names))


def download(
    params: Params, paths: Paths, datasets: list[str] | None = None, mirror: str | None = None,
    *, config_dir: str | Path | None = None, progress: bool = True,
) -> DownloadReport:
    """The ``pgrank download`` stage: fetch ``datasets`` and write the validation carve-out.

    Args:
        params: the parsed ``params.yaml`` (reads ``data.*``).
        paths: artifact locations (datasets go to ``paths.dataset(name)``).
        datasets: BEIR names or ``data.sources`` names; default :func:`default_datasets`.
        mirror: folder or URL replacing BEIR's server; default ``$PGRANK_BEIR_MIRROR``, then ``data.mirror``.
        config_dir: the params file's folder, against which a relative ``data.mirror`` or source path is resolved.
        progress: show progress bars.

    Returns:
        What happened to each dataset, and the carve-out when ``data.train``'s dataset was among them.
        Each dataset's manifest (:mod:`pgrank.data.manifests`) is written, the DVC-tracked output.
    """
    names = list(dict.fromkeys(datasets)) if datasets else default_datasets(params)
    if params.data.train.split("/")[0] in names:  # its carve-out records the out-of-domain validation sets too
        names = list(dict.fromkeys(names + [s.split("/")[0] for s in params.train.validation_sets]))
    own = params.data.sources  # datasets of your own (pgrank.data.sources): read in place, or fetched from their URL
    with tracking.stage_run(params, paths, "download", tags={"stage": "download"}, log_params={"datasets": names},
                            enabled=params.tracking.enabled, resources=True):
        source = resolve_source(mirror, params.data.mirror, config_dir=config_dir) if set(names) - set(own) else None
        sums = read_sha256sums(source) if source is not None else None
        fetched = [Fetched(name, paths.dataset(name), install_source(name, own[name], paths.dataset(name),
                                                                     paths.fingerprint_cache(name), config_dir or Path.cwd(),
                                                                     progress=progress))
                   if name in own else fetch_dataset(name, paths.dataset(name), source, sums, progress=progress)
                   for name in names]
        for name in names:
            write_manifest(paths, name)
        carve = None
        if params.data.train.split("/")[0] in names:
            carve = write_carve_out(paths, params.data)
            write_validation_sets_manifest(paths, carve.dataset, params.train.validation_sets)
    return DownloadReport(fetched, carve)
