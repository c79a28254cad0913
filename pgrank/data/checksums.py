"""File checksums, computed once and recorded.

* :func:`file_sha256` / :func:`file_digest`: a file's digest with :func:`hashlib.file_digest` (the one
  hasher of the project: downloads, model weights, corpus files).
* :func:`corpus_sha256`: the SHA-256 of a dataset's ``corpus.jsonl``, which keys corpus-embedding and
  index artifacts. ``pgrank download`` records it in the dataset folder (:data:`DOWNLOAD_RECORD`); the
  record is trusted only while the file's size and modification time are unchanged.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

from pgrank.errors import DataError

# Written by `pgrank download` into each dataset folder; caches the corpus checksum.
DOWNLOAD_RECORD = ".pgrank-download.json"


def file_digest(path: str | Path, algorithm: str = "sha256") -> str:
    """Hex digest of a file (``sha256``, ``md5``, ...), streamed by :func:`hashlib.file_digest`."""
    with open(path, "rb") as fh:
        return hashlib.file_digest(fh, algorithm).hexdigest()


def file_sha256(path: str | Path) -> str:
    """Hex SHA-256 of a file."""
    return file_digest(path, "sha256")


def corpus_sha256(dataset_dir: str | Path) -> str:
    """SHA-256 of ``corpus.jsonl`` (keys corpus-embedding artifacts).

    ``pgrank download`` records it; the record is trusted only while the file's size and
    modification time are unchanged, otherwise the file is hashed again.
    """
    folder = Path(dataset_dir)
    path = folder / "corpus.jsonl"
    if not path.is_file():
        raise DataError(f"{path}: no such file; run `pgrank download {folder.name}`")
    try:
        record = json.loads((folder / DOWNLOAD_RECORD).read_text(encoding="utf-8"))["corpus"]
        st = path.stat()
        if record["bytes"] == st.st_size and record["mtime_ns"] == st.st_mtime_ns:
            return record["sha256"]
    except (OSError, ValueError, KeyError, TypeError):
        pass
    return file_sha256(path)
