"""Safe extraction of a BEIR zip into a folder.

A member whose path is absolute or escapes the folder (zip-slip), or that is a symbolic link, is
refused; BEIR's single top folder ``NAME/`` is stripped, so its content becomes the dataset folder.
A corrupt or truncated archive is a :class:`DataError`, and so is a zip bomb: a member larger than
:data:`BOMB_FLOOR` that expands more than :data:`MAX_RATIO` times (text compresses 3-10 times; BEIR's
largest member, MS MARCO's corpus, 3.3 times), a member that inflates past its declared size, or an
archive that would not fit in the free disk space.
"""

from __future__ import annotations

import re
import shutil
import stat
import zipfile
import zlib
from pathlib import Path, PurePosixPath

from tqdm.auto import tqdm

from pgrank.atomic import fault_point
from pgrank.errors import DataError

_CHUNK = 1 << 16
MAX_RATIO = 200  # uncompressed / compressed size of one member beyond which it is refused
BOMB_FLOOR = 1 << 24  # members below 16 MiB uncompressed are too small to matter


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


def check_sizes(members: list[tuple[zipfile.ZipInfo, PurePosixPath]], target: Path, label: str) -> int:
    """Refuse zip bombs and archives that cannot fit on disk; return the uncompressed total."""
    for info, _ in members:
        if info.file_size > BOMB_FLOOR and info.file_size > MAX_RATIO * max(info.compress_size, 1):
            raise DataError(f"{label}: refusing member {info.filename!r}: {info.compress_size} bytes expand to "
                            f"{info.file_size} ({info.file_size // max(info.compress_size, 1)}x, more than "
                            f"{MAX_RATIO}x): a zip bomb, not a BEIR dataset")
    total = sum(info.file_size for info, _ in members)
    free = shutil.disk_usage(target).free
    if total > free:
        raise DataError(f"{label}: extracting needs {total / 2**20:.0f} MiB, but only {free / 2**20:.0f} MiB are "
                        f"free in {target.parent}; free some space and run again")
    return total


def extract(zip_path: Path, target: Path, label: str, progress: bool) -> None:
    root = target.resolve()
    try:
        with zipfile.ZipFile(zip_path) as archive:
            members = safe_members(archive, label)
            total = check_sizes(members, target, label)
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
                    written = 0
                    with archive.open(info) as src, open(out, "wb") as dst:
                        while chunk := src.read(_CHUNK):
                            written += len(chunk)
                            if written > info.file_size:
                                raise DataError(f"{label}: member {info.filename!r} inflates past its declared "
                                                f"{info.file_size} bytes; refusing it (a corrupt archive or a zip bomb)")
                            dst.write(chunk)
                            bar.update(len(chunk))
                            fault_point("extract.chunk", str(rel))
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
