"""Atomic writes: every artifact appears complete or not at all.

Writers create a temporary sibling (same directory, so the final ``os.replace`` is a rename on one
file system) and rename it into place only after the content is fully written and flushed. A crash,
a kill or an exception leaves the previous file (or nothing) and no temporary behind.

Example:
    >>> with atomic_path("out/metrics.json") as tmp:
    ...     tmp.write_text("{}")
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any


@contextlib.contextmanager
def atomic_path(path: str | Path, *, directory: bool = False) -> Iterator[Path]:
    """Yield a temporary path beside ``path``; on success rename it onto ``path``.

    Args:
        path: the final file (or folder, with ``directory=True``).
        directory: create a temporary folder instead of a file. An existing folder at ``path`` is
            replaced (moved aside, then deleted) only after the new one is complete.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    if directory:
        tmp = Path(tempfile.mkdtemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent))
    else:
        fd, name = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
        os.close(fd)
        tmp = Path(name)
    try:
        yield tmp
        if directory:
            if path.exists():
                old = Path(tempfile.mkdtemp(prefix=f".{path.name}.", suffix=".old", dir=path.parent))
                os.replace(path, old / "x")
                os.replace(tmp, path)
                shutil.rmtree(old, ignore_errors=True)
            else:
                os.replace(tmp, path)
        else:
            with open(tmp, "rb+") as fh:
                os.fsync(fh.fileno())
            os.replace(tmp, path)
    except BaseException:
        if tmp.is_dir():
            shutil.rmtree(tmp, ignore_errors=True)
        else:
            tmp.unlink(missing_ok=True)
        raise


def write_text(path: str | Path, text: str) -> None:
    """Write ``text`` to ``path`` atomically (UTF-8)."""
    with atomic_path(path) as tmp:
        tmp.write_text(text, encoding="utf-8")


def write_json(path: str | Path, obj: Any) -> None:
    """Write ``obj`` as sorted, indented JSON atomically (stable bytes for DVC)."""
    write_text(path, json.dumps(obj, indent=2, sort_keys=True) + "\n")
