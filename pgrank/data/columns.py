"""Columns on disk, memory-mapped: the building block of the corpus and candidate stores.

A :class:`StringColumn` holds ``n`` strings as one UTF-8 byte array and ``n + 1`` int64 offsets
(``NAME.bytes.npy``, ``NAME.offsets.npy``); string ``i`` is ``bytes[offsets[i]:offsets[i + 1]]``.
Opened memory-mapped, it costs no private memory however long it is (MS MARCO's 8.8M document ids
are 62 MB on disk and a few pages in RAM), unlike a Python list of the same strings (~600 MB).

Fixed-width numeric columns are plain ``.npy`` files (:func:`open_array`), or raw files appended to
while a store is streamed to disk (:class:`Appender`), read back with :func:`open_raw`.

Example:
    >>> write_strings(folder, "ids", ["d1", "d20", "d3"])
    >>> ids = StringColumn.open(folder, "ids")
    >>> ids[1], ids.take([2, 0]), len(ids)
    ('d20', ['d3', 'd1'], 3)
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence
from pathlib import Path

import numpy as np


def open_array(path: str | Path) -> np.ndarray:
    """A ``.npy`` file, memory-mapped read-only."""
    return np.load(path, mmap_mode="r")


def open_raw(path: str | Path, dtype: str, count: int) -> np.ndarray:
    """A raw file of ``count`` values of ``dtype``, memory-mapped read-only (an empty file gives ``[]``)."""
    if count == 0:
        return np.empty(0, dtype=dtype)
    return np.memmap(path, dtype=dtype, mode="r", shape=(count,))


class StringColumn(Sequence[str]):
    """``n`` strings stored as UTF-8 bytes plus offsets (see the module docstring)."""

    def __init__(self, offsets: np.ndarray, data: np.ndarray):
        self.offsets = offsets
        self.data = data

    @classmethod
    def open(cls, folder: str | Path, name: str) -> "StringColumn":
        folder = Path(folder)
        return cls(open_array(folder / f"{name}.offsets.npy"), open_array(folder / f"{name}.bytes.npy"))

    def __len__(self) -> int:
        return len(self.offsets) - 1

    def __getitem__(self, i):
        if isinstance(i, slice):
            return self.take(range(*i.indices(len(self))))
        if i < 0:
            i += len(self)
        if not 0 <= i < len(self):
            raise IndexError(i)
        return self.data[self.offsets[i] : self.offsets[i + 1]].tobytes().decode("utf-8")

    def __iter__(self) -> Iterator[str]:
        for lo in range(0, len(self), 65536):
            yield from self.take(range(lo, min(lo + 65536, len(self))))

    def take(self, rows: Iterable[int]) -> list[str]:
        """The strings of ``rows`` (any integer iterable), in that order (decoded from a memoryview of the bytes: a
        numpy slice per string would cost a memmap object each)."""
        rows = np.asarray(rows if isinstance(rows, np.ndarray) else list(rows), dtype=np.int64)
        starts, ends = self.offsets[rows], self.offsets[rows + 1]
        data = memoryview(np.ascontiguousarray(self.data)) if len(self.data) else memoryview(b"")
        return [str(data[s:e], "utf-8") for s, e in zip(starts.tolist(), ends.tolist())]

    def encoded(self, i: int) -> bytes:
        """String ``i`` as its UTF-8 bytes."""
        return self.data[self.offsets[i] : self.offsets[i + 1]].tobytes()


def write_strings(folder: str | Path, name: str, strings: Iterable[str | bytes]) -> int:
    """Write a :class:`StringColumn` as ``NAME.offsets.npy`` and ``NAME.bytes.npy``; return its length.

    The caller writes into a folder that becomes visible atomically (``atomic_path(..., directory=True)``).
    """
    folder = Path(folder)
    data = bytearray()
    offsets = [0]
    for s in strings:
        data += s.encode("utf-8") if isinstance(s, str) else s
        offsets.append(len(data))
    np.save(folder / f"{name}.offsets.npy", np.asarray(offsets, dtype=np.int64))
    np.save(folder / f"{name}.bytes.npy", np.frombuffer(bytes(data), dtype=np.uint8))
    return len(offsets) - 1


def write_taken(folder: str | Path, name: str, column: StringColumn, rows: np.ndarray) -> int:
    """Write the strings ``rows`` of ``column`` as the column ``name`` in ``folder``; return its length.

    The bytes are gathered as arrays (no Python string per row), so a column of millions of ids is cheap.
    """
    folder = Path(folder)
    rows = np.asarray(rows, dtype=np.int64)
    starts = np.asarray(column.offsets[rows], dtype=np.int64)
    lengths = np.asarray(column.offsets[rows + 1], dtype=np.int64) - starts
    offsets = np.zeros(len(rows) + 1, dtype=np.int64)
    np.cumsum(lengths, out=offsets[1:])
    at = np.repeat(starts - offsets[:-1], lengths) + np.arange(offsets[-1], dtype=np.int64)  # (bytes,) source index
    np.save(folder / f"{name}.offsets.npy", offsets)
    np.save(folder / f"{name}.bytes.npy", np.asarray(column.data, dtype=np.uint8)[at])
    return len(rows)


class Appender:
    """A raw column written piece by piece (a store streamed to disk, one query at a time)."""

    def __init__(self, path: str | Path, dtype: str):
        self.path = Path(path)
        self.dtype = np.dtype(dtype)
        self.count = 0
        self._fh = open(self.path, "wb")

    def append(self, values: np.ndarray) -> None:
        values = np.ascontiguousarray(values, dtype=self.dtype)
        self._fh.write(values.tobytes())
        self.count += len(values)

    def close(self) -> None:
        self._fh.flush()
        self._fh.close()
