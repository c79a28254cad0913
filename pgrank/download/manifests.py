"""Dataset manifests: the content fingerprint of each dataset, which is what DVC tracks.

Datasets live in ``paths.data``, a folder shared by every profile (MS MARCO is downloaded once, not
once per profile), so they are not DVC outputs of any one profile's pipeline. What the ``download``
stage outputs instead is one small manifest per dataset, ``Paths.dataset_manifest(name)``::

    {"dataset": "scifact", "files": {"corpus.jsonl": "<sha256>", "qrels/test.tsv": "<sha256>", ...}}

Every per-dataset stage depends on its own dataset's manifest only, so adding a dataset re-runs only
that dataset's stages, and a changed file re-runs exactly the stages downstream of its dataset. The
SHA-256 of each file is cached by (size, modification time) in ``Paths.fingerprint_cache(name)``, so
an unchanged dataset is fingerprinted without reading it again.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path

from pgrank.atomic import write_json
from pgrank.data.checksums import file_sha256
from pgrank.errors import DataError
from pgrank.paths import Paths

log = logging.getLogger(__name__)


def beir_files(folder: Path) -> list[str]:
    """The files of a BEIR folder that its content is: corpus, queries and every qrels split (sorted)."""
    names = ["corpus.jsonl", "queries.jsonl"] + sorted(f"qrels/{p.name}" for p in (folder / "qrels").glob("*.tsv"))
    return [name for name in names if (folder / name).is_file()]


def fingerprint(folder: str | Path, cache_file: str | Path) -> dict[str, str]:
    """``{relative file: sha256}`` of a BEIR folder, rehashing only files whose size or mtime changed."""
    folder, cache_file = Path(folder), Path(cache_file)
    if not (folder / "corpus.jsonl").is_file():
        raise DataError(f"{folder}: not a BEIR folder (no corpus.jsonl); run `pgrank download {folder.name}`")
    try:
        cache = json.loads(cache_file.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        cache = {}
    fresh, out = {}, {}
    for name in beir_files(folder):
        st = (folder / name).stat()
        entry = cache.get(name)
        if not (isinstance(entry, dict) and entry.get("bytes") == st.st_size and entry.get("mtime_ns") == st.st_mtime_ns):
            entry = {"sha256": file_sha256(folder / name), "bytes": st.st_size, "mtime_ns": st.st_mtime_ns}
        fresh[name], out[name] = entry, entry["sha256"]
    if fresh != cache:
        try:
            write_json(cache_file, fresh)
        except OSError as exc:  # a read-only shared data folder: the cache only saves time
            log.info("%s: not cached (%s)", cache_file, exc.strerror)
    return out


def write_manifest(paths: Paths, name: str) -> Path:
    """Write ``Paths.dataset_manifest(name)`` (stable bytes: unchanged content gives an identical file)."""
    path = paths.dataset_manifest(name)
    files = fingerprint(paths.dataset(name), paths.fingerprint_cache(name))
    write_json(path, {"dataset": name, "files": files})
    return path


def write_validation_sets_manifest(paths: Paths, train_dataset: str, validation_sets: list[str]) -> Path:
    """Write ``Paths.validation_sets_manifest(train_dataset)``: each out-of-domain validation set with the
    checksum of its dataset's manifest, so that ``mine-train`` (which depends on the carve-out folder)
    re-runs exactly when one of those datasets changes or the list does."""
    import hashlib

    sets = [{"set": s, "manifest_sha256": hashlib.sha256(paths.dataset_manifest(s.split("/")[0]).read_bytes()).hexdigest()}
            for s in validation_sets]
    path = paths.validation_sets_manifest(train_dataset)
    write_json(path, {"validation_sets": sets})
    return path
