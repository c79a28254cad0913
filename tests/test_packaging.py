"""Exactly one FAISS per install: faiss-cpu and faiss-gpu both ship the ``faiss`` module, and one installed over the
other breaks GPU search (``module 'faiss' has no attribute 'StandardGpuResources'``). ``pgrank[cpu]`` brings faiss-cpu,
``pgrank[gpu]`` faiss-gpu, and nothing else brings either.

pip itself says what an install of the project requires: its resolver report (``pip install --dry-run --report``) of the
project, offline (``--no-index --no-deps``: the project's own metadata, with the extras asked for). That no
dependency brings a FAISS of its own is read from the metadata of every installed distribution the project pulls in.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from importlib import metadata
from pathlib import Path

import pytest
from packaging.markers import default_environment
from packaging.requirements import Requirement

ROOT = Path(__file__).resolve().parents[1]
FAISS = {"faiss-cpu", "faiss-gpu"}


def _name(requirement: str) -> str:
    return re.sub(r"[-_.]+", "-", Requirement(requirement).name).lower()


@pytest.fixture(scope="module")
def project_report(tmp_path_factory) -> dict:
    """pip's report of ``pip install --dry-run`` of this project with every extra asked for (offline)."""
    out = tmp_path_factory.mktemp("report") / "report.json"
    subprocess.run([sys.executable, "-m", "pip", "install", "--dry-run", "--no-deps", "--no-index", "--no-build-isolation",
                    "--ignore-installed", "--quiet", "--report", str(out), f"{ROOT}[cpu,gpu,dev,dask,ray]"],
                   check=True, capture_output=True, text=True, timeout=300)
    [project] = json.loads(out.read_text())["install"]
    assert project["metadata"]["name"] == "pgrank"
    return project["metadata"]


def _required(meta: dict, extras: set[str]) -> set[str]:
    """The distributions an install of ``pgrank[extras]`` requires directly (markers evaluated as pip does)."""
    out = set()
    for text in meta["requires_dist"]:
        req = Requirement(text)
        if req.marker is None or any(req.marker.evaluate({**default_environment(), "extra": e}) for e in extras | {""}):
            out.add(_name(text))
    return out


@pytest.mark.parametrize(("extras", "faiss"), [
    ({"cpu"}, {"faiss-cpu"}), ({"gpu"}, {"faiss-gpu"}), ({"cpu", "dev"}, {"faiss-cpu"}), ({"gpu", "dev"}, {"faiss-gpu"}),
    ({"gpu", "dev", "dask", "ray"}, {"faiss-gpu"}), (set(), set()),
])
def test_each_install_asks_for_exactly_the_faiss_of_its_extra(project_report, extras, faiss):
    assert _required(project_report, extras) & FAISS == faiss


def test_no_dependency_brings_a_faiss_of_its_own(project_report):
    """Walk the installed dependency tree of every requirement but FAISS: none of them requires faiss-cpu or faiss-gpu."""
    seen, todo = set(), sorted(_required(project_report, {"dev", "dask", "ray"}) - FAISS)
    while todo:
        name = todo.pop()
        if name in seen:
            continue
        seen.add(name)
        try:
            requires = metadata.requires(name) or []
        except metadata.PackageNotFoundError:
            continue  # an extra's package not installed here: its own requirements are not in play
        for text in requires:
            req = Requirement(text)
            if req.marker is not None and not req.marker.evaluate({**default_environment(), "extra": ""}):
                continue
            assert _name(text) not in FAISS, f"{name} requires {text}"
            todo.append(_name(text))
    assert {"sentence-transformers", "beir", "torch"} <= seen  # the walk reached the tree


def test_the_readme_installs_name_an_extra_with_a_faiss():
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    installs = re.findall(r"pip install (?:-e )?'\.\[([\w,]+)\]'", readme)
    assert installs and all(set(extras.split(",")) & {"cpu", "gpu"} for extras in installs), installs
