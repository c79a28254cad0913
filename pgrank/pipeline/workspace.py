"""Where ``dvc repro`` runs for a profile: the project itself, or a composed profile workspace.

``params.yaml`` as committed is the paper's configuration, and ``dvc repro`` in the project runs it.
A profile (``profiles/<name>.yaml``) or ``--set`` overrides never edit a tracked file: they are
composed into a self-contained DVC workspace at the profile's ``paths.root`` (``runs/demo`` for the
demo), holding

* ``dvc.yaml`` and the code it declares as dependencies (``cli.py``, ``pgrank/``), synced from the
  project byte for byte, so the one DAG is the project's ``dvc.yaml``;
* ``params.yaml``: the composed, validated configuration with every key explicit. ``paths.root`` is the
  workspace itself (so its outputs, ``dvc.lock`` and DVC cache live apart from the paper's);
  ``paths.data`` and ``paths.embeddings`` point, relative to the workspace, at the folders the profile
  names (by default the project's ``data/``, shared by every profile: a dataset is downloaded once and a
  (model, corpus) pair encoded once); a relative ``data.mirror``, ``data.sources`` path or ``models.offline``
  path (relative to the params file) is made absolute, since the stages run in the workspace;
* a ``--no-scm`` DVC project (``.dvc/``), with the cache linked rather than copied.

Files are rewritten only when their bytes change, so an unchanged re-run is a DVC no-op, and
changing one training knob re-runs only the stages that read it.

One pipeline at a time per workspace: :func:`repro` holds the workspace's lock (:func:`locked`, the
file ``.pgrank.lock`` in it) from composing the files to the end of ``dvc repro``, so a second
invocation, even with other ``--set`` values, never changes a file under a running pipeline; it stops
at once with "... is in use by PID N (command, since ...)". :func:`prepare` alone takes the same lock.
The lock is ``flock(2)``, released by the kernel however its holder ends (SIGKILL included).

Stopping: ``dvc`` runs in a session, and so a process group, of its own (no terminal's job control pauses
it), so that a stop reaches DVC and every stage process it started, and nothing outlives pgrank. SIGINT,
SIGTERM or SIGHUP to pgrank (Ctrl-C, a process manager or a cancelling scheduler, a closed terminal)
interrupts the group as Ctrl-C does (SIGINT): the running stage ends its MLflow run ``KILLED`` and exits, and
DVC records nothing for it and exits; whatever is left of the group after :data:`STOP_GRACE_S` (or at a
second signal) is killed. pgrank then ends the parent run ``KILLED`` (with any run of the group still
``RUNNING``), prints one line and exits with 128 + the signal's number. The stages that completed keep
their ``dvc.lock`` entries and ``FINISHED`` runs, so the next ``repro`` resumes after them.

Example:
    >>> ws = prepare(Path("params.yaml"), "demo", ["train.epochs=1"])
    >>> subprocess.run(["dvc", "repro"], cwd=ws, check=True)
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import yaml

from pgrank.atomic import atomic_path, exclusive
from pgrank.config import Params, load_params
from pgrank.errors import PgrankError, Stopped
from pgrank.paths import WORKSPACE_PARAMS

# What dvc.yaml's stages depend on, relative to the project (synced into workspaces).
SYNCED = ("dvc.yaml", "cli.py", "pgrank")
LOCK_NAME = ".pgrank.lock"  # in the workspace (ignored by git: .gitignore)
DVC_CONFIG = "[core]\n    no_scm = True\n[cache]\n    type = hardlink,symlink\n"


def _write_if_changed(path: Path, data: bytes) -> bool:
    if path.is_file() and path.read_bytes() == data:
        return False
    with atomic_path(path) as tmp:
        tmp.write_bytes(data)
    return True


def _sync(src: Path, dst: Path) -> None:
    """Mirror a file or folder (sources only: no caches), touching only what differs."""
    if src.is_file():
        _write_if_changed(dst, src.read_bytes())
        return
    wanted = set()
    for file in src.rglob("*"):
        if file.is_file() and "__pycache__" not in file.parts and file.suffix not in (".pyc",):
            rel = file.relative_to(src)
            wanted.add(rel)
            _write_if_changed(dst / rel, file.read_bytes())
    if dst.is_dir():
        for file in sorted(dst.rglob("*"), reverse=True):
            rel = file.relative_to(dst)
            if file.is_file() and rel not in wanted and "__pycache__" not in rel.parts:
                file.unlink()


def _relative_to(path: str, project: Path, ws: Path) -> str:
    """A project-relative path as seen from the workspace (absolute paths stay absolute)."""
    if Path(path).expanduser().is_absolute():
        return str(Path(path).expanduser())
    return os.path.relpath(project / path, ws)


def workspace_params(params: Params, project: Path, ws: Path) -> dict:
    """The composed params as written into a workspace: explicit, DVC-friendly, workspace-relative."""
    doc = params.model_dump(mode="json")
    doc["paths"] = {"root": ".", "data": _relative_to(params.paths.data, project, ws),
                    "embeddings": _relative_to(params.paths.embeddings, project, ws)}
    mirror = params.data.mirror
    if mirror and "://" not in mirror:
        doc["data"]["mirror"] = str((project / Path(mirror).expanduser()).resolve())
    for name, source in params.data.sources.items():  # datasets of your own: relative to the params file
        if source.path is not None:
            doc["data"]["sources"][name]["path"] = str((project / Path(source.path).expanduser()).resolve())
    for hub_id, copy in params.models.offline.items():  # offline model copies: relative to the params file
        if copy.path is not None:
            doc["models"]["offline"][hub_id]["path"] = str((project / Path(copy.path).expanduser()).resolve())
    if params.data.holdout:
        doc["data"]["holdout"] = str((project / Path(params.data.holdout).expanduser()).resolve())
    dataset, split = params.data.train.split("/")
    doc["data"]["train"] = {"dataset": dataset, "split": split}
    doc["data"]["eval_sets"] = params.data.eval_sets_by_dataset()
    return doc


def _composition(params_file: Path, profile: str | None, overrides) -> tuple[Path, Params | None, Path]:
    """``(project, composed params or None for the project itself, workspace)``; validates, writes nothing."""
    project = params_file.parent
    if not profile and not overrides:
        return project, None, project
    params = load_params(params_file, overrides, profile)
    ws = (project / params.paths.root).resolve()
    if ws == project or project not in ws.parents:
        raise PgrankError(f"paths.root={params.paths.root!r}: a profile's root must be a folder inside {project}")
    return project, params, ws


def locked(ws: Path):
    """The lock of workspace ``ws`` (a context manager); raises :class:`pgrank.atomic.Busy` when it is taken."""
    return exclusive(ws / LOCK_NAME, what=f"the pipeline workspace {ws}", wait=False)


def prepare(params_file: str | Path, profile: str | None = None, overrides: list[str] | tuple[str, ...] = ()) -> Path:
    """The directory to run ``dvc`` in for this profile and these overrides (see the module docstring).

    Without a profile or overrides it is the project itself. Raises :class:`PgrankError` (via the
    config) for an invalid composition, before anything is written, and :class:`pgrank.atomic.Busy`
    while another process holds the workspace (a running pipeline).
    """
    project, params, ws = _composition(Path(params_file).resolve(), profile, overrides)
    if params is None:
        return project
    ws.mkdir(parents=True, exist_ok=True)
    with locked(ws):
        _compose(project, params, ws, profile, overrides)
    return ws


def _compose(project: Path, params: Params, ws: Path, profile: str | None, overrides) -> None:
    for name in SYNCED:
        if not (project / name).exists():
            raise PgrankError(f"{project / name}: missing; run from a pgrank checkout")
        _sync(project / name, ws / name)
    text = "# Composed by pgrank from params.yaml"
    text += f" + profiles/{profile}.yaml" if profile else ""
    text += "".join(f" + --set {o}" for o in overrides)
    text += "; do not edit (edit the sources and re-run).\n"
    _write_if_changed(ws / WORKSPACE_PARAMS, (text + yaml.safe_dump(workspace_params(params, project, ws), sort_keys=False)).encode())
    if not (ws / ".dvc").is_dir():
        run_dvc(["init", "--no-scm", "-q"], ws)
    _write_if_changed(ws / ".dvc" / "config", DVC_CONFIG.encode())


# Read by the CLI, so never passed to stage commands: a workspace's params.yaml is composed already.
PROFILE_ENV = "PGRANK_PROFILE"


def stage_environment(extra: dict[str, str] | None = None) -> dict[str, str]:
    """The environment of DVC and the stage commands it runs: this one, less ``$PGRANK_PROFILE``, with this
    interpreter's scripts folder first on ``$PATH``: ``.venv/bin/pgrank demo`` from a shell whose virtual
    environment is not activated runs DVC and every stage's ``pgrank`` of that environment, not another
    installation's."""
    env = {k: v for k, v in os.environ.items() if k != PROFILE_ENV}
    env["PATH"] = scripts_first(env.get("PATH", ""))
    return {**env, **(extra or {})}


def scripts_first(path: str) -> str:
    """``path`` (a ``$PATH``) with this interpreter's scripts folder first, and only there."""
    scripts = str(Path(sys.executable).parent)
    return os.pathsep.join([scripts, *(p for p in path.split(os.pathsep) if p and p != scripts)])


def dvc_executable(env: dict[str, str]) -> str:
    """The ``dvc`` that ``env``'s ``$PATH`` finds (:func:`stage_environment`: this environment's first)."""
    exe = shutil.which("dvc", path=env["PATH"])
    if exe is None:
        raise PgrankError("dvc is not installed; pip install dvc")
    return exe


# Ctrl-C, a process manager's or a cancelling scheduler's stop, a closed terminal.
STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
STOP_GRACE_S = 30.0  # what a stopped stage gets to end its MLflow run and exit before its process group is killed


def _signal_group(group: int, signum: int) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.killpg(group, signum)


class _Stopping:
    """While active in the main thread, a stop signal stops the process group :meth:`run` started (see the module
    docstring) and then raises :class:`Stopped`; with no group running it raises at once. Entered while another
    is active, it is that one (one stop for a whole run). Elsewhere (a thread of a Prefect flow) it only runs
    the command."""

    def __init__(self, what: str):
        self.what = what
        self.signum: int | None = None
        self._group: int | None = None
        self._starting = False
        self._timer: threading.Timer | None = None
        self._previous: dict = {}
        self._raised: Stopped | None = None

    def __enter__(self) -> _Stopping:
        if threading.current_thread() is not threading.main_thread():
            return self
        active = getattr(signal.getsignal(STOP_SIGNALS[0]), "__self__", None)
        if isinstance(active, _Stopping):
            return active
        self._previous = {s: signal.signal(s, self._handle) for s in STOP_SIGNALS}
        return self

    def __exit__(self, *exc) -> None:
        for signum, handler in self._previous.items():
            signal.signal(signum, handler)
        if self._timer is not None:
            self._timer.cancel()

    def _handle(self, signum: int, frame) -> None:
        # A stop that a finalizer dropped comes back as its signal once more (pgrank/errors.py keep_interrupts):
        # it is raised again, or, if DVC has started meanwhile (and so been stopped), taken as no second signal.
        resent = self._raised is not None and self._raised.dropped
        first, self.signum = self.signum is None, self.signum or signum
        if resent:
            self._raised.dropped = False
        if self._group is not None:
            if not resent:
                self._stop_group()
        elif (first or resent) and not self._starting:  # a later signal finds the stop under way: nothing to do
            self._raised = self.stopped()
            raise self._raised

    def _stop_group(self) -> None:
        if self._timer is not None:  # a second signal: no more grace
            _signal_group(self._group, signal.SIGKILL)
            return
        _signal_group(self._group, signal.SIGINT)
        self._timer = threading.Timer(STOP_GRACE_S, _signal_group, (self._group, signal.SIGKILL))
        self._timer.daemon = True
        self._timer.start()

    def stopped(self) -> Stopped:
        name = signal.Signals(self.signum).name
        return Stopped(self.signum, f"stopped by {name}: {self.what} and its stage processes have ended; "
                                    "the next pgrank repro resumes after the stages that completed")

    def run(self, argv: list[str], cwd: Path, env: dict[str, str], capture: bool) -> subprocess.CompletedProcess:
        """``argv`` in a session and process group of its own; raises :class:`Stopped` once a stop has ended the group.

        Where no signal is handled here (not the main thread), it stays in this process group, which a stop reaches.
        """
        pipe = subprocess.PIPE if capture else None
        self._starting = True  # a signal now is handled once the group exists
        try:
            proc = subprocess.Popen(argv, cwd=cwd, env=env, text=True, stdout=pipe, stderr=pipe,
                                    start_new_session=bool(self._previous))
            self._group = proc.pid
            if self.signum is not None and self._timer is None:
                self._stop_group()
        finally:
            self._starting = False
        try:
            out, err = proc.communicate()
        finally:
            self._group = None
        if self.signum is not None:
            _signal_group(proc.pid, signal.SIGKILL)  # what outlived DVC (a stage's own workers)
            raise self.stopped()
        return subprocess.CompletedProcess(argv, proc.returncode, out, err)


def run_dvc(args: list[str], cwd: Path, *, capture: bool = False) -> subprocess.CompletedProcess:
    """Run ``dvc ARGS`` in ``cwd``; a failure raises :class:`PgrankError` with DVC's message, a stop signal
    :class:`Stopped` once DVC and its stages have ended (the module docstring)."""
    env = stage_environment()
    exe = dvc_executable(env)
    with _Stopping(f"`dvc {' '.join(args)}`") as stopping:
        proc = stopping.run([exe, *args], cwd, env, capture)
    if proc.returncode != 0:
        detail = (proc.stderr or proc.stdout or "").strip().splitlines()[-5:] if capture else []
        raise PgrankError(f"`dvc {' '.join(args)}` failed in {cwd} (exit {proc.returncode})"
                          + (":\n" + "\n".join(detail) if detail else ""))
    return proc


def repro(params_file: str | Path, profile: str | None = None, overrides: list[str] | tuple[str, ...] = (),
          targets: list[str] | tuple[str, ...] = (), *, dry: bool = False) -> Path:
    """``dvc repro`` for a profile, inside one MLflow parent run that every stage nests under.

    Returns the workspace (the project itself for the paper without overrides).
    """
    from pgrank import tracking

    _, _, ws = _composition(Path(params_file).resolve(), profile, overrides)
    ws.mkdir(parents=True, exist_ok=True)
    # the lock: held from composing the files to the end of the run; a stop before DVC starts ends it too
    args = ["repro", *(["--dry"] if dry else []), *targets]
    with _Stopping(f"`dvc {' '.join(args)}`"), locked(ws):
        prepare(params_file, profile, overrides)
        with pipeline_run(ws, profile, overrides, enabled=not dry) as run_id, _env(tracking.PARENT_ENV, run_id):
            run_dvc(args, ws)
    return ws


@contextlib.contextmanager
def pipeline_run(ws: Path, profile: str | None = None, overrides: list[str] | tuple[str, ...] = (), *,
                 enabled: bool = True) -> Iterator[str | None]:
    """The MLflow parent run of one pipeline execution in workspace ``ws``; yields its id.

    Stage runs nest under it when their process sees the id in ``tracking.PARENT_ENV``. Yields
    ``None`` when tracking is off (``tracking.enabled: false`` or ``enabled=False``). Shared by
    :func:`repro` and the Prefect flow (``flows/pipeline.py``).
    """
    from pgrank import tracking
    from pgrank.paths import Paths

    params = load_params(ws / WORKSPACE_PARAMS)
    paths = Paths.from_config(params.paths, base=ws)
    with tracking.stage_run(params, paths, f"pipeline{'-' + profile if profile else ''}", tags={"stage": "pipeline"},
                            log_params={"profile": profile or "paper", "overrides": list(overrides)},
                            enabled=params.tracking.enabled and enabled, nested=False) as run:
        yield run.info.run_id if run is not None else None


@contextlib.contextmanager
def _env(name: str, value: str | None):
    old = os.environ.get(name)
    if value is not None:
        os.environ[name] = value
    try:
        yield
    finally:
        if old is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = old
