"""BEIR datasets: fetch a zip, verify it, extract it safely, validate it, rename it into place.

For each dataset ``NAME``:

1. ``NAME.zip`` is fetched from BEIR's server or a mirror (:mod:`pgrank.download.mirror`) into
   ``{data}/NAME.zip.part`` by :func:`pgrank.download.transfer.transfer` (resumed, retried).
2. The file is checked against the mirror's ``SHA256SUMS`` when it lists ``NAME.zip``, otherwise
   against BEIR's published MD5 (:mod:`pgrank.download.catalogue`); a name in neither is used with a warning.
3. Members are extracted into a temporary folder beside the target; a member whose path is absolute
   or escapes the folder (zip-slip), or that is a symbolic link, is refused. The folder is then
   validated as the loader would read it (:func:`pgrank.download.dataset_checks.validate_folder`).
4. Only then is the folder renamed to ``{data}/NAME`` and the ``.part`` file deleted.

A checksum mismatch, a corrupt or truncated archive, an unsafe member or a malformed file raises
:class:`DataError` and leaves the data folder as it was (a ``.part`` file is kept only for an
interrupted transfer, so the next run resumes it). A folder that already carries its download
record is left alone.

Example:
    >>> source = resolve_source(mirror="../shared/data/beir")
    >>> fetch_dataset("scifact", paths.dataset("scifact"), source, read_sha256sums(source)).status
    'downloaded'
"""

from __future__ import annotations

import json
import logging
import re
import shutil
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from pgrank.atomic import atomic_path, clear_stale_lock, exclusive, lock_file
from pgrank.data.checksums import DOWNLOAD_RECORD, file_digest
from pgrank.download.archive import beir_folders, extract
from pgrank.download.catalogue import BEIR_MD5, NOT_PUBLIC
from pgrank.download.dataset_checks import FolderSummary, validate_folder
from pgrank.download.mirror import Source
from pgrank.download.transfer import TIMEOUT_S, request, transfer
from pgrank.errors import DataError

log = logging.getLogger(__name__)

SUMS_FILE = "SHA256SUMS"
_NAME = re.compile(r"^[\w][\w.-]*$")
_SUMS_LINE = re.compile(r"^([0-9a-fA-F]{64}) [ *](.+)$")


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


# --------------------------------------------------------------------------------------- checksums


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
        with urllib.request.urlopen(request(where), timeout=TIMEOUT_S) as resp:
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


# --------------------------------------------------------------------------------------- fetching


def _download_verified(source: Source, name: str, part: Path, checksum: Checksum | None, progress: bool) -> None:
    resumed = part.exists()
    transfer(source, f"{name}.zip", part, progress)
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
        source: from :func:`pgrank.download.mirror.resolve_source`.
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


