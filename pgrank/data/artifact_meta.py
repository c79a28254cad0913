"""The ``meta.json`` of a folder artifact (a corpus or candidate store, corpus embeddings, a sparse corpus).

Every such folder is written with its ``meta.json`` last (:mod:`pgrank.atomic`), so the file's presence means
the artifact is complete, and its ``format`` names the layout of the files beside it. :data:`META` is the file's
one name, for every folder artifact's writer and completeness check (a BM25 index and an ONNX export too), and
:func:`read_meta` the stores', embeddings' and sparse corpora's reader: a missing, damaged or foreign ``meta.json``
is a :class:`pgrank.errors.DataError` that names the file and says what to do, never a traceback.

Example:
    >>> meta = read_meta(folder, "pgrank-corpus-embeddings/1", missing="no corpus embeddings; run `pgrank mine`",
    ...                  remedy="delete the folder and run the stage again", keys=("num_docs", "dim"))
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from pathlib import Path

from pgrank.errors import DataError

META = "meta.json"


def read_meta(folder: str | Path, fmt: str, *, missing: str, remedy: str, keys: Iterable[str] = ()) -> dict:
    """The checked ``meta.json`` of the artifact in ``folder``.

    Args:
        fmt: the ``format`` the reader understands.
        missing: what the error says when there is no ``meta.json`` (the artifact was never finished).
        remedy: what the error tells the user to do about a damaged or foreign one.
        keys: the entries the reader needs.

    Raises:
        DataError: no ``meta.json``; not a JSON object; another format; a needed entry missing.
    """
    path = Path(folder) / META
    if not path.is_file():
        raise DataError(f"{folder}: {missing}")
    try:
        meta = json.loads(path.read_text(encoding="utf-8"))
    except (ValueError, UnicodeDecodeError) as exc:
        raise DataError(f"{path}: not valid JSON ({exc}); a damaged artifact: {remedy}") from None
    if not isinstance(meta, dict):
        raise DataError(f"{path}: a JSON {type(meta).__name__}, not an object; a damaged artifact: {remedy}")
    if meta.get("format") != fmt:
        raise DataError(f"{path}: format {meta.get('format')!r}, expected {fmt!r}; {remedy}")
    absent = [key for key in keys if key not in meta]
    if absent:
        raise DataError(f"{path}: no {', '.join(map(repr, absent))}; a damaged artifact: {remedy}")
    return meta
