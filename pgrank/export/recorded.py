"""The configuration a run was trained with, as its workspace records it: what ``pgrank export`` reads.

A profile's run (``pgrank demo``, ``pgrank --profile P repro``) is a DVC workspace at the profile's ``paths.root``
whose ``params.yaml`` is the composed configuration, ``--set`` overrides included (:mod:`pgrank.pipeline.workspace`).
``pgrank --profile demo export --to DIR`` reads that file, so the overrides the run was made with are never repeated;
``--profile`` and ``--set`` only name the workspace. A ``--set`` that disagrees with what the run recorded is refused
(its key and both values named), since the export would describe a run that never happened. Without a profile or
overrides the run is the project's own (``params.yaml`` as it stands, the paper's). A profile whose workspace holds
no ``params.yaml`` (stages run by hand, not through DVC) is read from the command line's configuration, as before.

Example:
    >>> run = recorded_run(Path("params.yaml").resolve(), "demo", [])
    >>> run.params.train.epochs, run.source
    (4, PosixPath('.../runs/demo/params.yaml'))
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from pgrank.config import Params, load_params
from pgrank.errors import PgrankError
from pgrank.paths import WORKSPACE_PARAMS, Paths


@dataclass(frozen=True)
class RecordedRun:
    """A run's configuration, its artifact paths, and the file they were read from."""

    params: Params
    paths: Paths
    source: Path


def _value(doc: dict, key: str):
    node = doc
    for part in key.split("."):
        if not isinstance(node, dict) or part not in node:
            return None
        node = node[part]
    return node


def _same(given, recorded, project: Path, ws: Path) -> bool:
    if given == recorded:
        return True
    if isinstance(given, str) and isinstance(recorded, str):  # a path, relative to the project or the workspace
        return (project / Path(given).expanduser()).resolve() == (ws / Path(recorded).expanduser()).resolve()
    return False


def _check_overrides(composed: Params, recorded: Params, overrides: list[str], project: Path, ws: Path) -> None:
    given, kept = composed.model_dump(mode="json"), recorded.model_dump(mode="json")
    for override in overrides:
        key = override.partition("=")[0].strip()
        if key == "paths" or key.startswith("paths."):
            continue  # where the workspace is, not how the run was made
        if not _same(_value(given, key), _value(kept, key), project, ws):
            raise PgrankError(f"--set {override}: the run in {ws} was made with {key}={_value(kept, key)!r} "
                              f"({ws / WORKSPACE_PARAMS}); export reads the run's own configuration: drop the --set")


def recorded_run(params_file: Path, profile: str | None, overrides: list[str]) -> RecordedRun:
    """The configuration and paths of the run that ``--profile`` and ``--set`` name (see the module docstring).

    Raises:
        PgrankError: an invalid configuration, or a ``--set`` that disagrees with the run's recorded configuration.
    """
    project = params_file.parent
    composed = load_params(params_file, overrides, profile)
    ws = (project / composed.paths.root).resolve()
    if (profile or overrides) and ws != project and (ws / WORKSPACE_PARAMS).is_file():
        recorded = load_params(ws / WORKSPACE_PARAMS)
        _check_overrides(composed, recorded, overrides, project, ws)
        return RecordedRun(recorded, Paths.from_config(recorded.paths, base=ws), ws / WORKSPACE_PARAMS)
    return RecordedRun(composed, Paths.from_config(composed.paths, base=project), params_file)
