"""Kill-anywhere supervision: run ``dvc repro``, SIGKILL a stage process at a chosen moment, judge the rerun.

Nothing is mocked. :func:`repro` runs the real ``dvc repro`` of a profile workspace and watches the
process tree DVC spawns; a stage's process is recognised by its command line (the stage's ``cmd`` from
``dvc.lock``). The moment of a kill (:class:`Moment`) is one of

* ``point``: the N-th time the stage reaches a named fault point (:func:`pgrank.atomic.fault_point`,
  ``PGRANK_FAULT=kill:NAME:N``): inside an atomic write, between the two steps of a folder swap, after
  a chunk of a transfer or an extraction, after a query's candidate set is written. Exact.
* ``output``: once the stage's output (its progress bars, which DVC passes through) has matched a
  pattern N times: "mid-epoch 2" is the N-th tick of the ``epoch 2/2`` bar. The supervisor kills.
* ``bytes``: once the stage process has written N bytes (``/proc/PID/io``: ``wchar``).
* ``seconds``: N seconds after the stage process started.

With ``PGRANK_FAULT=trace:DIR`` an uninterrupted reference run records, per stage, its duration, the
bytes it wrote and the fault points it passed, from which seeded random moments are drawn
(:func:`draw_moments`).

:func:`unrun` turns a copy of a finished workspace into "stage S never completed": S's ``dvc.lock``
entry, outputs and DVC's run cache are removed (and the shared data or embeddings it would create),
while every other stage stays locked at the reference hashes. After the kill, ``dvc repro`` must
re-run S alone: a downstream stage runs again only if S's outputs differ from the reference, which
the comparison of every file (:func:`snapshot`) then shows.
"""

from __future__ import annotations

import hashlib
import json
import os
import random
import re
import shutil
import subprocess
import threading
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

import psutil
import yaml

POLL_S = 0.01  # seconds between looks at the stage processes found (bytes written, elapsed time)
# Seconds between scans for new stage processes. A scan reads every process of the machine (psutil's children(),
# about 5 ms of CPU with 150 processes): at every look it would take a third of a core from the run it watches.
SCAN_S = 0.1
# Files that record when something happened, not what: (size, mtime) caches of checksums.
MTIME_CACHES = re.compile(r"(^|/)(\.fingerprints/[^/]+\.json|\.pgrank-download\.json)$")
# What a killed writer may leave behind: temporaries of atomic writes, partial downloads, locks.
LEFTOVER = re.compile(r"(^|/)(\.[^/]+\.(tmp|old|lock)|[^/]+\.part|\.pgrank\.lock)$")


@dataclass(frozen=True)
class Moment:
    """When to kill a stage: ``kind`` in point | output | bytes | seconds (see the module docstring)."""

    kind: str
    value: object  # point: (name, n); output: (regex, n); bytes: int; seconds: float
    label: str  # what is interrupted, for reports: "mid-extract", "mid-epoch 2", ...
    fraction: float | None = None  # bytes, seconds: the share of the traced run's total it was drawn at

    def redrawn(self, trace: StageTrace) -> Moment:
        """The same share of what ``trace`` (a run this moment never came in) wrote or lasted.

        A stage rerun on a restored workspace can write less or finish sooner than in the reference run
        (warm page cache, content-keyed caches another stage built): a moment drawn from the reference may
        then never come.
        """
        if self.kind == "bytes":
            return _bytes_moment(trace, self.fraction)
        if self.kind == "seconds":
            return _seconds_moment(trace, self.fraction)
        raise ValueError(f"a {self.kind} moment is not drawn from a share of a run")

    def __str__(self) -> str:
        return f"{self.label} ({self.kind} {self.value})"


@dataclass
class StageTrace:
    """One stage process as the supervisor saw it."""

    stage: str
    pid: int
    started: float
    ended: float | None = None
    written: int = 0
    points: list[tuple[str, str]] = field(default_factory=list)  # (fault point, detail), in order

    @property
    def seconds(self) -> float:
        return (self.ended or time.time()) - self.started


@dataclass
class Outcome:
    returncode: int
    output: str
    traces: dict[str, StageTrace]
    killed: str | None = None  # the stage that was killed, None if the moment never came

    def ran(self) -> set[str]:
        return set(re.findall(r"Running stage '([^']+)'", self.output))


def _stage_of(proc: psutil.Process, commands: dict[str, list[str]]) -> str | None:
    try:
        argv = proc.cmdline()
    except psutil.Error:
        return None
    for i, arg in enumerate(argv):
        if os.path.basename(arg) in ("pgrank", "cli.py"):
            rest = argv[i + 1 :]
            return next((name for name, cmd in commands.items() if rest == cmd), None)
    return None


def repro(ws: Path, env: dict, *, target: str | None = None, moment: Moment | None = None,
          trace: Path | None = None, timeout: float = 900) -> Outcome:
    """``dvc repro`` in ``ws``; SIGKILL stage ``target`` at ``moment`` (if given); trace stages (if asked).

    Stage processes are recognised by the command DVC prints before it starts one
    (``Running stage 'S':`` then ``> pgrank ...``).
    """
    env = dict(env)
    env.pop("PGRANK_FAULT", None)
    if trace is not None:
        trace.mkdir(parents=True, exist_ok=True)
        env["PGRANK_FAULT"] = f"trace:{trace}"
    if moment is not None and moment.kind == "point":
        name, n = moment.value
        env["PGRANK_FAULT"] = f"kill:{name}:{n}"  # only the target stage runs (--single-item)
    # A supervised kill runs its target alone (--single-item: every other stage is locked at the reference's
    # hashes anyway): an always_changed stage (download) would otherwise run first, under the same
    # PGRANK_FAULT, and could be the one that dies at the fault point.
    command = ["dvc", "repro", "--single-item", target] if target is not None and moment is not None else ["dvc", "repro"]
    proc = subprocess.Popen(command, cwd=ws, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    chunks: list[bytes] = []
    ticks = Counter()  # output matches while the target runs
    state = {"target_running": False, "stage": None}
    commands: dict[str, list[str]] = {}  # stage -> argv after "pgrank", as DVC announces them
    pattern = re.compile(moment.value[0]) if moment is not None and moment.kind == "output" else None

    def read() -> None:
        pending = b""
        while data := os.read(proc.stdout.fileno(), 65536):
            chunks.append(data)
            pending += data
            *lines, pending = re.split(rb"[\r\n]", pending)
            for raw in lines:
                line = raw.decode("utf-8", "replace")
                if announced := re.match(r"Running stage '([^']+)':", line):
                    state["stage"] = announced.group(1)
                elif line.startswith("> pgrank ") and state["stage"]:
                    commands[state["stage"]] = line[2:].split()[1:]
                elif pattern is not None and state["target_running"] and pattern.search(line):
                    ticks["hits"] += 1

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    traces: dict[int, StageTrace] = {}
    live: dict[int, psutil.Process] = {}
    killed = None
    root = psutil.Process(proc.pid)
    deadline = time.time() + timeout
    next_scan = 0.0
    while proc.poll() is None:
        if time.time() > deadline:
            proc.kill()
            raise TimeoutError(f"dvc repro in {ws} took more than {timeout} s")
        children = []
        if time.time() >= next_scan:  # stage processes live for seconds: a tenth of a second finds each one
            next_scan = time.time() + SCAN_S
            try:
                children = root.children(recursive=True)
            except psutil.Error:
                pass
        for child in children:
            if child.pid not in traces:
                stage = _stage_of(child, commands)
                if stage is not None and all(t.stage != stage for t in traces.values()):
                    traces[child.pid] = StageTrace(stage, child.pid, child.create_time())
                    live[child.pid] = child
        for pid, child in list(live.items()):
            trace_ = traces[pid]
            try:
                trace_.written = child.io_counters().write_chars
                alive = child.is_running() and child.status() != psutil.STATUS_ZOMBIE
            except psutil.Error:
                alive = False
            if not alive:
                trace_.ended = time.time()
                del live[pid]
                continue
            if trace_.stage != target or moment is None or killed:
                continue
            state["target_running"] = True
            fire = ((moment.kind == "output" and ticks["hits"] >= moment.value[1])
                    or (moment.kind == "bytes" and trace_.written >= moment.value)
                    or (moment.kind == "seconds" and time.time() - trace_.started >= moment.value))
            if fire:
                child.kill()
                killed = target
        time.sleep(POLL_S)
    reader.join(timeout=10)
    output = b"".join(chunks).decode("utf-8", "replace")
    by_stage = {}
    for trace_ in traces.values():
        trace_.ended = trace_.ended or time.time()
        if trace is not None and (trace / str(trace_.pid)).is_file():
            lines = (trace / str(trace_.pid)).read_text(encoding="utf-8").splitlines()
            trace_.points = [tuple(line.split("\t", 1)) for line in lines]
        by_stage[trace_.stage] = trace_
    if moment is not None and moment.kind == "point" and re.search(r"exited with (-9|137)\b", output):
        # It killed itself at the fault point. DVC reports the signal as -9 when it ran the stage directly,
        # or as 137 (128 + SIGKILL) when a shell ran it without exec (whether one does depends on $SHELL).
        killed = target
    return Outcome(proc.returncode, output, by_stage, killed)


# --------------------------------------------------------------------------------------- states


def always_changed(ws: Path) -> set[str]:
    """Stages of ``ws/dvc.yaml`` marked ``always_changed`` (download: it notices new data.sources content),
    which every ``dvc repro`` runs; their outputs stay the same, so nothing downstream runs because of them."""
    stages = yaml.safe_load((ws / "dvc.yaml").read_text())["stages"]
    return {name for name, stage in stages.items() if isinstance(stage, dict) and stage.get("always_changed")}


def snapshot(*folders: Path) -> dict[str, str]:
    """``{path: sha256}`` of every file under ``folders`` but DVC's own folder, MLflow's store and artifacts, (size, mtime)
    checksum caches and ``timings/`` (wall-time measurements, outside DVC by design: ``Paths.timings``); symbolic links by target; ``dvc.lock`` by its entries (their order
    is the order stages last ran in)."""
    files = {}
    for folder in folders:
        for path in sorted(folder.rglob("*")):
            rel = f"{folder.name}/{path.relative_to(folder)}"
            parts = path.relative_to(folder).parts
            if parts[0] in (".dvc", "mlruns", "mlartifacts", "mlflow-spool", "timings") or parts[0].startswith("mlflow.db") or MTIME_CACHES.search(rel):
                continue
            if path.is_symlink():
                files[rel] = "-> " + os.readlink(path)
            elif path.name == "dvc.lock":  # DVC writes a stage's entry where it lands: compare the entries
                entries = json.dumps(yaml.safe_load(path.read_text()), sort_keys=True)
                files[rel] = "entries " + hashlib.sha256(entries.encode()).hexdigest()
            elif path.is_file():
                files[rel] = hashlib.sha256(path.read_bytes()).hexdigest()
    return files


def differences(files: dict[str, str], reference: dict[str, str], caches: tuple[str, ...] = ()) -> list[str]:
    """The paths whose content differs between two :func:`snapshot` s.

    ``caches``: snapshot prefixes (``"data/beir/.stores/"``) of content-keyed caches that a stage builds on
    first use, whoever runs first (``{paths.data}/.stores/``, ``{paths.embeddings}/``). Each entry (the
    first folder under a prefix; in a folder of kept query vectors, ``*--queries/``, each shard: its keys and vectors)
    may be absent, since the next stage that needs it builds it from the same content; an entry that is there must be
    the reference's, file for file and byte for byte.
    """
    def entry(path: str) -> str | None:
        prefix = next((c for c in caches if path.startswith(c)), None)
        if prefix is None:
            return None
        first, _, rest = path[len(prefix):].partition("/")
        if first.endswith("--queries") and rest:  # pgrank.retrieval.dense.query_embeddings: a shard per encoding call
            return f"{prefix}{first}/{rest.split('.', 1)[0]}"
        return prefix + first

    present = {entry(k) for k in files} - {None}
    return sorted(k for k in files.keys() | reference.keys()
                  if files.get(k) != reference.get(k) and (entry(k) is None or entry(k) in present))


def leftovers(*folders: Path) -> list[str]:
    """Temporaries, partial downloads and lock files anywhere under ``folders`` (DVC's folder aside)."""
    found = []
    for folder in folders:
        for path in folder.rglob("*"):
            rel = str(path.relative_to(folder))
            if not rel.startswith(".dvc") and LEFTOVER.search(rel):
                found.append(f"{folder.name}/{rel}")
    return sorted(found)


def unrun(ws: Path, stage: str, shared: dict[str, list[Path]] | None = None) -> None:
    """Make ``stage`` "never completed" in workspace ``ws`` (see the module docstring).

    ``shared``: per stage, the shared artifacts (outside the workspace) it would create, removed too.
    """
    lock_path = ws / "dvc.lock"
    lock = yaml.safe_load(lock_path.read_text())
    entry = lock["stages"].pop(stage)
    lock_path.write_text(yaml.safe_dump(lock, sort_keys=False))
    for out in entry.get("outs", []):
        target = ws / out["path"]
        if target.is_dir():
            shutil.rmtree(target)
        else:
            target.unlink(missing_ok=True)
    shutil.rmtree(ws / ".dvc" / "cache" / "runs", ignore_errors=True)  # the run cache would skip the stage
    for path in (shared or {}).get(stage, []):
        if path.is_dir():
            shutil.rmtree(path)
        else:
            path.unlink(missing_ok=True)


# --------------------------------------------------------------------------------------- moments


def at_point(trace: StageTrace, rng: random.Random, name: str, detail: str = "", label: str = "") -> Moment | None:
    """A seeded occurrence of fault point ``name`` (whose detail matches the regex ``detail``) in ``trace``."""
    hits = [i for i, (n, d) in enumerate(trace.points) if n == name and re.search(detail, d)]
    if not hits:
        return None
    at = rng.choice(hits)
    nth = sum(1 for n, _ in trace.points[: at + 1] if n == name)
    return Moment("point", (name, nth), f"{label or name} ({trace.points[at][1]})")


def draw_moments(trace: StageTrace, rng: random.Random, n: int, extra: list[Moment] = ()) -> list[Moment]:
    """``n`` seeded moments inside ``trace`` (the stage's reference run): ``extra`` first, then any
    fault point, written bytes and elapsed seconds in turn."""
    kinds = ["point", "bytes", "seconds"] if trace.points else ["bytes", "seconds"]
    moments = list(extra)
    i = 0
    while len(moments) < n:
        kind = kinds[i % len(kinds)]
        i += 1
        if kind == "point":
            name = rng.choice(sorted({p for p, _ in trace.points}))
            moments.append(at_point(trace, rng, name))
        elif kind == "bytes":
            moments.append(_bytes_moment(trace, rng.uniform(0.05, 0.8)))
        else:
            moments.append(_seconds_moment(trace, rng.uniform(0.1, 0.7)))
    return moments


def _bytes_moment(trace: StageTrace, fraction: float) -> Moment:
    written = int(trace.written * fraction)
    return Moment("bytes", written, f"after {written} of {trace.written} bytes written", fraction)


def _seconds_moment(trace: StageTrace, fraction: float) -> Moment:
    seconds = round(trace.seconds * fraction, 2)
    return Moment("seconds", seconds, f"{seconds} of {trace.seconds:.1f} s in", fraction)
