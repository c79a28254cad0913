"""The byte transfer: one file from a URL or a folder into a ``.part`` file, resumed and retried.

The transfer resumes where a previous one stopped (HTTP ``Range``, or an offset copy from a folder) and
retries a connection cut mid-way by itself; the ``.part`` file keeps what arrived, so a failed run is
resumed by the next. BEIR downloads (:mod:`pgrank.download.beir_datasets`) and datasets of your own
fetched from a URL (:mod:`pgrank.download.sources`) both go through :func:`transfer`.
"""

from __future__ import annotations

import http.client
import logging
import re
import time
import urllib.error
import urllib.request
from pathlib import Path

from tqdm.auto import tqdm

from pgrank.atomic import fault_point
from pgrank.download.mirror import MIRROR_ENV, Source
from pgrank.errors import DataError

log = logging.getLogger(__name__)

CHUNK = 1 << 16  # bytes per read and write: an interrupted transfer keeps all but the last chunk
TIMEOUT_S = 60


class _Interrupted(Exception):
    """A transfer stopped mid-way; the ``.part`` file holds what arrived and can be resumed."""


def request(url: str, start: int = 0) -> urllib.request.Request:
    """A GET of ``url`` as pgrank sends it, from byte ``start`` on (HTTP ``Range``)."""
    headers = {"User-Agent": "pgrank"}
    if start:
        headers["Range"] = f"bytes={start}-"
    return urllib.request.Request(url, headers=headers)


def _bar(desc: str, total: int | None, initial: int, progress: bool) -> tqdm:
    return tqdm(total=total, initial=initial, unit="B", unit_scale=True, unit_divisor=1024, desc=desc,
                disable=not progress, mininterval=0.5)


def _copy_local(src: Path, part: Path, progress: bool, source: Source | None = None) -> None:
    if not src.is_file():
        named = f" named by {source.named_by}" if source is not None and source.named_by else ""
        raise DataError(f"{src}: not in the mirror{named}; put {src.name} there, or name no mirror (an unset or empty "
                        f"${MIRROR_ENV}) to download it from BEIR's server")
    size = src.stat().st_size
    have = part.stat().st_size if part.exists() else 0
    if have > size:  # a stale .part of some other file: start over
        have = 0
    with open(src, "rb") as fin, open(part, "ab" if have else "wb") as fout, \
            _bar(src.name, size, have, progress) as bar:
        fin.seek(have)
        while chunk := fin.read(CHUNK):
            fout.write(chunk)
            bar.update(len(chunk))
            fault_point("download.chunk")


def _fetch_http(url: str, part: Path, progress: bool) -> None:
    have = part.stat().st_size if part.exists() else 0
    try:
        resp = urllib.request.urlopen(request(url, have), timeout=TIMEOUT_S)
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
                    chunk = resp.read(CHUNK)
                except (http.client.HTTPException, OSError) as exc:  # the connection, not the disk
                    raise _Interrupted(f"{type(exc).__name__}: {exc}") from None
                if not chunk:
                    break
                out.write(chunk)
                bar.update(len(chunk))
                fault_point("download.chunk")
    if total is not None and part.stat().st_size < total:
        raise _Interrupted(f"connection closed at {part.stat().st_size} of {total} bytes")


def transfer(source: Source, filename: str, part: Path, progress: bool, attempts: int = 3) -> None:
    """Bring ``filename`` from ``source`` into ``part``, resuming what is there; retry cut connections.

    Raises:
        DataError: the file is not there, the server refuses it, or the connection was cut ``attempts``
            times (the ``.part`` file is kept: running the command again resumes it).
        OSError: the disk is full or read-only (the ``.part`` file keeps what arrived).
    """
    for attempt in range(1, attempts + 1):
        try:
            if source.local:
                _copy_local(Path(source.locate(filename)), part, progress, source)
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
