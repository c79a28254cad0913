"""Safe extraction of a BEIR zip into a folder.

A member whose path is absolute or escapes the folder (zip-slip), or that is a symbolic link, is
refused; BEIR's single top folder ``NAME/`` is stripped, so its content becomes the dataset folder.
A corrupt or truncated archive is a :class:`DataError`.
"""

from __future__ import annotations

import re
import stat
import zipfile
import zlib
from pathlib import Path, PurePosixPath

from tqdm.auto import tqdm

from pgrank.errors import DataError

_CHUNK = 1 << 20


def _bar(desc: str, total: int | None, initial: int, progress: bool) -> tqdm:
    return tqdm(total=total, initial=initial, unit="B", unit_scale=True, unit_divisor=1024, desc=desc,
                disable=not progress, mininterval=0.5)


def safe_members(archive: zipfile.ZipFile, label: str) -> list[tuple[zipfile.ZipInfo, PurePosixPath]]:
    """Every member with its relative path; refuses absolute, escaping and symlink members."""
    members = []
    for info in archive.infolist():
        name = info.filename
        if name.startswith("__MACOSX/"):  # resource forks added by macOS zip tools
            continue
        if stat.S_ISLNK(info.external_attr >> 16):
            raise DataError(f"{label}: refusing member {name!r}: symbolic links are not allowed")
        rel = PurePosixPath(name.replace("\\", "/"))
        if rel.is_absolute() or re.match(r"^[A-Za-z]:", name) or ".." in rel.parts:
            raise DataError(f"{label}: refusing member {name!r}: its path escapes the dataset folder (zip-slip)")
        if rel.parts:
            members.append((info, rel))
    if not members:
        raise DataError(f"{label}: the archive is empty")
    # BEIR zips hold one folder NAME/...; its content becomes {data}/NAME.
    one_top = len({rel.parts[0] for _, rel in members}) == 1
    if one_top and all(len(rel.parts) > 1 or info.is_dir() for info, rel in members):
        members = [(info, PurePosixPath(*rel.parts[1:])) for info, rel in members if len(rel.parts) > 1]
    return members


def extract(zip_path: Path, target: Path, label: str, progress: bool) -> None:
    root = target.resolve()
    try:
        with zipfile.ZipFile(zip_path) as archive:
            members = safe_members(archive, label)
            total = sum(info.file_size for info, _ in members)
            with _bar(f"extracting {label}", total, 0, progress) as bar:
                for info, rel in members:
                    out = target.joinpath(*rel.parts)
                    if not out.resolve().is_relative_to(root):  # defence in depth against zip-slip
                        raise DataError(f"{label}: refusing member {info.filename!r}: "
                                        "its path escapes the dataset folder (zip-slip)")
                    if info.is_dir():
                        out.mkdir(parents=True, exist_ok=True)
                        continue
                    out.parent.mkdir(parents=True, exist_ok=True)
                    with archive.open(info) as src, open(out, "wb") as dst:
                        while chunk := src.read(_CHUNK):
                            dst.write(chunk)
                            bar.update(len(chunk))
    except (zipfile.BadZipFile, zlib.error, EOFError, NotImplementedError) as exc:
        raise DataError(f"{label}: corrupt or truncated archive ({exc}); "
                        "it was deleted, run again to fetch it afresh") from None


def beir_folders(root: Path, label: str) -> list[str]:
    """Relative BEIR folders in an extracted archive: ``"."``, or subfolders (cqadupstack/android...)."""
    if (root / "corpus.jsonl").is_file():
        return ["."]
    found = sorted(p.name for p in root.iterdir() if (p / "corpus.jsonl").is_file())
    if not found:
        raise DataError(f"{label}: no corpus.jsonl in the archive "
                        "(expected NAME/corpus.jsonl, NAME/queries.jsonl, NAME/qrels/*.tsv)")
    return found
