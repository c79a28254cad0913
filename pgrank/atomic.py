"""Atomic writes: every artifact appears complete or not at all, also after ``kill -9`` or a power cut.

Writers create a temporary sibling (same directory, so the final step is a rename on one file system)
and move it into place only after the content is fully written and fsynced; the directory is fsynced
after the rename, so the rename itself survives a power cut. A crash, a kill or an exception leaves
the previous file (or nothing) at the final path.

* Files: ``os.replace`` of the temporary file, one atomic step.
* Folders: on Linux, ``renameat2(RENAME_EXCHANGE)`` swaps the new folder and the old one in one
  atomic step (macOS: ``renamex_np(RENAME_SWAP)``), then the old one, now under the temporary name,
  is deleted. Where neither exists (other systems, file systems without the flag) the old folder is
  renamed aside (``.NAME.PID.XXXXXXXX.old``) and the new one renamed in; a crash between the two
  renames leaves no folder at the final path, and the next :func:`atomic_path` of that path (or
  :func:`recover`) renames the old one back first. (An exchange rather than a symlink swap: DVC,
  sentence-transformers and users open these folders by path, and a DVC output that is a link to a
  versioned folder is not the folder's content.)
* Leftovers: temporary names carry the writer's PID (``.NAME.PID.XXXXXXXX.tmp``). What a killed
  writer left behind is deleted by the next write of the same path, never what a live process is
  still writing.
* Written once: :func:`exclusive` is an inter-process lock (``flock(2)`` through ``filelock``,
  released by the kernel when its holder dies, even by SIGKILL) for artifacts that several
  pipelines share (datasets, corpus embeddings) and for a whole profile workspace.

Fault injection (``tests/faults``): :func:`fault_point` marks the moments inside these protocols
where a kill is most damaging. It does nothing unless ``$PGRANK_FAULT`` is set (see there).

Example:
    >>> with atomic_path("out/metrics.json") as tmp:
    ...     tmp.write_text("{}")
"""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import errno
import json
import os
import re
import shutil
import signal
import socket
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from pgrank.errors import PgrankError

FAULT_ENV = "PGRANK_FAULT"
_fault_counts: dict[str, int] = {}


def fault_point(name: str, detail: str = "") -> None:
    """A named moment at which the kill-anywhere tests may kill this process; a no-op by default.

    Inert unless ``$PGRANK_FAULT`` is set (one dictionary lookup). Two forms, for ``tests/faults``:

    * ``kill:NAME:N`` sends SIGKILL to this process the ``N``-th time it reaches point ``NAME``
      (``*`` counts every point);
    * ``trace:DIR`` appends ``NAME<TAB>DETAIL`` to ``DIR/<pid>`` (``detail``: e.g. the file being
      written), so a test learns which points a stage passes, in order.
    """
    spec = os.environ.get(FAULT_ENV)
    if not spec:
        return
    kind, _, arg = spec.partition(":")
    if kind == "trace":
        with open(Path(arg) / str(os.getpid()), "a", encoding="utf-8") as fh:
            fh.write(f"{name}\t{detail}\n")
    elif kind == "kill":
        target, _, nth = arg.rpartition(":")
        if target in ("*", name):
            _fault_counts[target] = _fault_counts.get(target, 0) + 1
            if _fault_counts[target] == int(nth):
                os.kill(os.getpid(), signal.SIGKILL)


# --------------------------------------------------------------------------------------- durability


def _fsync_dir(folder: Path) -> None:
    """Make renames inside ``folder`` durable (a no-op where directories cannot be opened, e.g. Windows)."""
    try:
        fd = os.open(folder, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:  # some file systems refuse fsync on directories
        pass
    finally:
        os.close(fd)


def _fsync_file(path: Path) -> None:
    with open(path, "rb+") as fh:
        os.fsync(fh.fileno())


def _fsync_tree(folder: Path) -> None:
    for root, _, files in os.walk(folder):
        for name in files:
            path = Path(root) / name
            if not path.is_symlink():
                _fsync_file(path)
        _fsync_dir(Path(root))


# --------------------------------------------------------------------------------------- folder swap

_AT_FDCWD = -100
_RENAME_EXCHANGE = 2  # linux/fs.h
_RENAME_SWAP = 2  # macOS sys/stdio.h


def _libc():
    try:
        return ctypes.CDLL(ctypes.util.find_library("c") or None, use_errno=True)
    except OSError:
        return None


_LIBC = _libc()


def exchange(a: str | Path, b: str | Path) -> bool:
    """Atomically swap two existing paths; False where the system or file system cannot.

    Linux: ``renameat2(..., RENAME_EXCHANGE)`` (glibc >= 2.28); macOS: ``renamex_np(..., RENAME_SWAP)``.
    """
    a, b = os.fsencode(str(a)), os.fsencode(str(b))
    if sys.platform.startswith("linux") and _LIBC is not None and hasattr(_LIBC, "renameat2"):
        rc = _LIBC.renameat2(_AT_FDCWD, a, _AT_FDCWD, b, _RENAME_EXCHANGE)
    elif sys.platform == "darwin" and _LIBC is not None and hasattr(_LIBC, "renamex_np"):
        rc = _LIBC.renamex_np(a, b, _RENAME_SWAP)
    else:
        return False
    if rc == 0:
        return True
    err = ctypes.get_errno()
    if err in (errno.EINVAL, errno.ENOSYS, errno.ENOTSUP, errno.EOPNOTSUPP):  # not supported here
        return False
    raise OSError(err, os.strerror(err), os.fsdecode(b))


def _replace_folder(tmp: Path, path: Path) -> None:
    """Put folder ``tmp`` at ``path``; at every instant ``path`` is the old folder or the new one."""
    if not path.exists():
        os.rename(tmp, path)
        fault_point("atomic.renamed", path.name)
        _fsync_dir(path.parent)
        return
    if exchange(tmp, path):
        fault_point("atomic.swapped", path.name)
        _fsync_dir(path.parent)
        shutil.rmtree(tmp)  # the old folder, now under the temporary name
        return
    # Portable fallback: two renames; recover() undoes a crash between them.
    old = Path(tempfile.mkdtemp(prefix=_prefix(path), suffix=".old", dir=path.parent))
    os.rmdir(old)
    os.rename(path, old)
    fault_point("atomic.swapped", path.name)
    os.rename(tmp, path)
    _fsync_dir(path.parent)
    shutil.rmtree(old)


# --------------------------------------------------------------------------------------- leftovers


def _prefix(path: Path) -> str:
    return f".{path.name}.{os.getpid()}."


def _leftover(path: Path) -> re.Pattern:
    return re.compile(rf"^\.{re.escape(path.name)}\.(\d+)\.[A-Za-z0-9_]{{8}}\.(tmp|old)$")


def _alive(pid: int) -> bool:
    if pid == os.getpid():
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def leftovers(path: str | Path) -> list[Path]:
    """Temporary siblings of ``path`` left by writers that are gone (killed mid-write)."""
    path = Path(path)
    pattern = _leftover(path)
    found = []
    with contextlib.suppress(FileNotFoundError):
        for entry in os.scandir(path.parent):
            match = pattern.match(entry.name)
            if match and not _alive(int(match.group(1))):
                found.append(Path(entry.path))
    return sorted(found)


def recover(path: str | Path) -> None:
    """Clean up after writers of ``path`` that were killed: restore a folder that a crash left renamed
    aside (only where :func:`exchange` is unavailable), delete their temporaries."""
    path = Path(path)
    for stale in leftovers(path):
        if stale.suffix == ".old" and not path.exists():
            os.rename(stale, path)
            _fsync_dir(path.parent)
        elif stale.is_dir() and not stale.is_symlink():
            shutil.rmtree(stale, ignore_errors=True)
        else:
            stale.unlink(missing_ok=True)


# --------------------------------------------------------------------------------------- the writer

_UMASK = os.umask(0o022)
os.umask(_UMASK)  # read once: tempfile creates 0600 files and 0700 folders; artifacts get the usual modes


@contextlib.contextmanager
def atomic_path(path: str | Path, *, directory: bool = False) -> Iterator[Path]:
    """Yield a temporary path beside ``path``; on success move it onto ``path`` (see the module docstring).

    Args:
        path: the final file (or folder, with ``directory=True``).
        directory: create a temporary folder instead of a file. An existing folder at ``path`` is
            replaced by an atomic exchange where the system has one, then deleted.
    """
    path = Path(path)
    created = [p for p in [path.parent, *path.parent.parents] if not p.exists()]
    path.parent.mkdir(parents=True, exist_ok=True)
    recover(path)
    if directory:
        tmp = Path(tempfile.mkdtemp(prefix=_prefix(path), suffix=".tmp", dir=path.parent))
        os.chmod(tmp, 0o777 & ~_UMASK)
    else:
        fd, name = tempfile.mkstemp(prefix=_prefix(path), suffix=".tmp", dir=path.parent)
        os.close(fd)
        tmp = Path(name)
        os.chmod(tmp, 0o666 & ~_UMASK)
    try:
        yield tmp
        fault_point("atomic.written", path.name)
        if directory:
            _fsync_tree(tmp)
            _replace_folder(tmp, path)
        else:
            _fsync_file(tmp)
            os.replace(tmp, path)
            fault_point("atomic.renamed", path.name)
            _fsync_dir(path.parent)
    except BaseException as exc:
        if tmp.is_dir() and not tmp.is_symlink():
            shutil.rmtree(tmp, ignore_errors=True)
        else:
            tmp.unlink(missing_ok=True)
        for folder in created:  # nothing half-written: not even the empty folders made for it
            with contextlib.suppress(OSError):
                folder.rmdir()
        if isinstance(exc, OSError) and exc.filename is None:
            exc.filename = str(path)  # a failed write() names no file: name the artifact
        raise


def write_text(path: str | Path, text: str) -> None:
    """Write ``text`` to ``path`` atomically (UTF-8)."""
    with atomic_path(path) as tmp:
        tmp.write_text(text, encoding="utf-8")


def write_json(path: str | Path, obj: Any) -> None:
    """Write ``obj`` as sorted, indented JSON atomically (stable bytes for DVC)."""
    write_text(path, json.dumps(obj, indent=2, sort_keys=True) + "\n")


# --------------------------------------------------------------------------------------- written once

_LOCKS: dict[str, Any] = {}  # one FileLock per lock file: re-entrant within this process


class Busy(PgrankError):
    """Another process holds the lock (:func:`exclusive` with ``wait=False``)."""


def lock_file(path: str | Path) -> Path:
    """The lock guarding artifact ``path``: the hidden sibling ``.NAME.lock``."""
    path = Path(path)
    return path.parent / f".{path.name}.lock"


def _holder(lock: Path) -> str:
    try:
        owner = json.loads(lock.read_text(encoding="utf-8"))
        since = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(owner["since"]))
        return f"PID {owner['pid']} on {owner['host']} ({owner['command']}, since {since})"
    except (OSError, ValueError, KeyError, TypeError):
        return "another process"


def clear_stale_lock(lock: str | Path) -> None:
    """Delete ``lock`` if it is a killed holder's leftover, for a caller that found the artifact complete.

    :func:`exclusive`'s holder deletes its file on the way out, but one killed after the artifact was
    finished (its last file renamed into place) leaves it behind, and a later process that finds the
    artifact complete never takes the lock, so never deletes it. A lock nobody holds is taken and given
    back at once (which deletes it); one that is held is left to its holder.
    """
    lock = Path(lock)
    if not lock.exists():
        return
    try:
        with exclusive(lock, what=str(lock), wait=False):
            pass
    except (Busy, OSError):  # its holder's to delete; or a read-only shared folder, which no process can tidy
        pass


@contextlib.contextmanager
def exclusive(lock: str | Path, *, what: str, wait: bool = True) -> Iterator[None]:
    """Hold the inter-process lock ``lock`` (a file; for an artifact, :func:`lock_file`) during the block.

    The lock file records its holder (PID, host, command line, start), which is what a process that
    finds it taken reports. Re-entrant within one process. The holder deletes the file before it
    releases the lock, so nothing stays behind; a waiter that then gets the lock of the deleted file
    notices and starts over (filelock >= 4), so no two processes ever hold it. A killed holder's file
    stays until the next holder is done with it.

    Args:
        lock: the lock file.
        what: how messages name what the lock protects.
        wait: wait for the holder to finish (said on stderr); ``False``: raise :class:`Busy` at once.

    Raises:
        Busy: ``wait=False`` and another process holds the lock.
    """
    from filelock import FileLock, Timeout

    lock = Path(lock)
    lock.parent.mkdir(parents=True, exist_ok=True)
    handle = _LOCKS.setdefault(str(lock.resolve()), FileLock(str(lock)))
    try:
        handle.acquire(timeout=0)
    except Timeout:
        holder = _holder(lock)
        if not wait:
            raise Busy(f"{what} is in use by {holder}; wait for it to finish, or stop it") from None
        print(f"pgrank: {what} is in use by {holder}; waiting for it", file=sys.stderr, flush=True)
        handle.acquire()
    try:
        if handle.lock_counter == 1:
            command = " ".join([Path(sys.argv[0]).name, *sys.argv[1:]])
            command = command if len(command) <= 200 else f"{command[:90]} ... {command[-90:]}"
            owner = {"pid": os.getpid(), "host": socket.gethostname(), "since": time.time(), "command": command}
            with open(lock, "r+", encoding="utf-8") as fh:  # in place: the lock is on this very file
                fh.truncate()
                fh.write(json.dumps(owner))
        yield
    finally:
        if handle.lock_counter == 1:  # gone with its last holder (filelock >= 4 makes waiters retry a deleted one)
            lock.unlink(missing_ok=True)
        handle.release()
