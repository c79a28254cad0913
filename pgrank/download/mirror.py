"""Where ``NAME.zip`` files come from: BEIR's server, or a mirror (a folder or an http(s) URL).

The mirror is ``--mirror``, else ``$PGRANK_BEIR_MIRROR``, else ``data.mirror``, else BEIR's server
(:func:`resolve_source`); an unset or empty one is no mirror. A relative folder means what it meant where the
user typed it: the commands that start DVC make ``$PGRANK_BEIR_MIRROR`` absolute first (:func:`absolute_mirror_env`),
because DVC runs ``pgrank download`` inside a profile workspace, another directory.
"""

from __future__ import annotations

import os
import urllib.parse
from dataclasses import dataclass, field
from pathlib import Path

from pgrank.download.catalogue import BEIR_BASE_URL
from pgrank.errors import DataError

MIRROR_ENV = "PGRANK_BEIR_MIRROR"


@dataclass(frozen=True)
class Source:
    """Where ``NAME.zip`` files come from: BEIR's server, a mirror URL or a mirror folder."""

    base: str
    local: bool = False
    mirror: bool = False
    named_by: str = field(default="", compare=False)  # for messages: "--mirror", "$PGRANK_BEIR_MIRROR" or "data.mirror"

    def locate(self, filename: str) -> str:
        return str(Path(self.base) / filename) if self.local else f"{self.base}/{filename}"


def _is_url(base: str) -> bool:
    return base.startswith(("http://", "https://"))


def absolute_mirror_env() -> None:
    """Make a relative ``$PGRANK_BEIR_MIRROR`` folder absolute, against the current directory.

    The commands that start DVC call this first, so that a relative folder means what it meant where the
    user typed it, also in the stage processes DVC starts later inside a profile workspace (another directory).
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
        return Source(base.rstrip("/"), mirror=True, named_by=where)
    if base.startswith("file://"):
        base = urllib.parse.unquote(urllib.parse.urlparse(base).path)
    folder = (relative_to / Path(base).expanduser()).resolve()
    if not folder.is_dir():
        raise DataError(f"{where} {base!r}: no such folder {folder} (expected a folder or an http(s) URL holding "
                        "NAME.zip files)")
    return Source(str(folder), local=True, mirror=True, named_by=where)
