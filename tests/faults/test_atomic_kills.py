"""Atomic writes under SIGKILL at each step of their protocol (pgrank/atomic.py), in real child processes.

A child replaces an artifact with ``atomic_path`` and is killed by its own fault point
(``PGRANK_FAULT=kill:POINT:1``: a real SIGKILL, nothing mocked). Whatever the step, the final path
must hold the old artifact or the new one, complete; leftovers of the dead writer disappear at the next
write of the same path, and a live writer's temporaries are never touched.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from pgrank import atomic
from pgrank.atomic import atomic_path, exchange, leftovers, recover

WRITER = textwrap.dedent("""
    import sys
    from pathlib import Path
    from pgrank import atomic

    target, directory, fallback = Path(sys.argv[1]), sys.argv[2] == "dir", sys.argv[3] == "fallback"
    if fallback:  # as on a system or file system without an atomic exchange
        atomic.exchange = lambda a, b: False
    with atomic.atomic_path(target, directory=directory) as tmp:
        if directory:
            tmp.mkdir(exist_ok=True)
            for i in range(3):
                (tmp / f"part-{i}.txt").write_text("new " * 1000)
        else:
            tmp.write_text("new " * 1000)
""")


def _write(target: Path, *, directory: bool, kill_at: str | None, fallback: bool = False) -> int:
    env = {**os.environ}
    if kill_at:
        env[atomic.FAULT_ENV] = f"kill:{kill_at}:1"
    out = subprocess.run([sys.executable, "-c", WRITER, str(target), "dir" if directory else "file",
                          "fallback" if fallback else "exchange"], env=env, capture_output=True, text=True)
    return out.returncode


def _old_folder(path: Path) -> None:
    path.mkdir()
    for i in range(2):
        (path / f"part-{i}.txt").write_text("old")


def _content(path: Path) -> str:
    if path.is_file():
        return path.read_text()[:3]
    names = sorted(p.name for p in path.iterdir())
    texts = {(path / n).read_text()[:3] for n in names}
    assert len(texts) == 1, f"{path} mixes old and new files: {names}"
    return texts.pop()


@pytest.mark.parametrize("fallback", [False, True], ids=["exchange", "two-renames"])
@pytest.mark.parametrize("kill_at", ["atomic.written", "atomic.swapped"])
def test_a_folder_killed_at_any_step_is_old_or_new_and_never_missing_after_recovery(tmp_path, kill_at, fallback):
    if not fallback and not _exchange_supported(tmp_path):
        pytest.skip("this file system has no atomic exchange (renameat2 RENAME_EXCHANGE)")
    target = tmp_path / "epoch-1"
    _old_folder(target)
    assert _write(target, directory=True, kill_at=kill_at, fallback=fallback) == -signal.SIGKILL
    stale = leftovers(target)
    assert stale, "the killed writer left its temporary folder"
    if kill_at == "atomic.swapped" and fallback:
        assert not target.exists()  # the one instant the two-rename fallback has no folder at the path...
        recover(target)  # ...which the next reader (or writer) of the path undoes
        assert _content(target) == "old"
    elif kill_at == "atomic.swapped":
        assert _content(target) == "new"  # the exchange is one step: the new folder is in place
    else:
        assert _content(target) == "old"
    recover(target)
    assert not leftovers(target) and not [p for p in tmp_path.iterdir() if p.name.startswith(".")]
    assert _write(target, directory=True, kill_at=None, fallback=fallback) == 0
    assert _content(target) == "new" and sorted(p.name for p in tmp_path.iterdir()) == ["epoch-1"]


def test_the_next_write_restores_a_folder_left_renamed_aside(tmp_path):
    target = tmp_path / "tables"
    _old_folder(target)
    assert _write(target, directory=True, kill_at="atomic.swapped", fallback=True) == -signal.SIGKILL
    assert not target.exists()
    with atomic_path(target, directory=True) as tmp:  # a later writer recovers first, then replaces
        assert _content(target) == "old"
        (tmp / "part-0.txt").write_text("new")
    assert _content(target) == "new" and sorted(p.name for p in tmp_path.iterdir()) == ["tables"]


@pytest.mark.parametrize("kill_at", ["atomic.written", "atomic.renamed"])
def test_a_file_killed_before_or_after_its_rename_is_old_or_new(tmp_path, kill_at):
    target = tmp_path / "metrics.json"
    target.write_text("old")
    assert _write(target, directory=False, kill_at=kill_at) == -signal.SIGKILL
    assert _content(target) == ("old" if kill_at == "atomic.written" else "new")
    assert bool(leftovers(target)) == (kill_at == "atomic.written")
    assert _write(target, directory=False, kill_at=None) == 0
    assert sorted(p.name for p in tmp_path.iterdir()) == ["metrics.json"]


def test_a_live_writers_temporaries_are_left_alone(tmp_path):
    target = tmp_path / "shard-00000.npy"
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    try:
        live = tmp_path / f".{target.name}.{child.pid}.abcdefgh.tmp"
        live.write_text("being written")
        dead = tmp_path / f".{target.name}.999999999.abcdefgh.tmp"  # no such PID
        dead.write_text("abandoned")
        assert leftovers(target) == [dead]
        with atomic_path(target) as tmp:
            tmp.write_text("x")
        assert live.exists() and not dead.exists()
    finally:
        child.kill()
        child.wait()


def test_renames_are_fsynced_in_their_folder(tmp_path, monkeypatch):
    synced = []
    monkeypatch.setattr(atomic, "_fsync_dir", lambda folder: synced.append(Path(folder)))
    with atomic_path(tmp_path / "a.json") as tmp:
        tmp.write_text("{}")
    _old_folder(tmp_path / "epoch-0")
    with atomic_path(tmp_path / "epoch-0", directory=True) as tmp:
        (tmp / "x").write_text("new")
    assert synced.count(tmp_path) == 2  # after each rename, the folder that holds the new name
    assert any(s.name.startswith(".epoch-0.") for s in synced)  # the new folder's own entries, before


def test_artifacts_get_the_usual_permissions_not_tempfiles_private_ones(tmp_path):
    umask = os.umask(0o022)
    os.umask(umask)
    with atomic_path(tmp_path / "metrics.json") as tmp:
        tmp.write_text("{}")
    with atomic_path(tmp_path / "scifact", directory=True) as tmp:
        (tmp / "corpus.jsonl").write_text("")
    assert (tmp_path / "metrics.json").stat().st_mode & 0o777 == 0o666 & ~umask
    assert (tmp_path / "scifact").stat().st_mode & 0o777 == 0o777 & ~umask


def _exchange_supported(tmp_path: Path) -> bool:
    a, b = tmp_path / ".probe-a", tmp_path / ".probe-b"
    a.mkdir()
    b.mkdir()
    try:
        return exchange(a, b)
    finally:
        a.rmdir()
        b.rmdir()
