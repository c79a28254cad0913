"""Outputs do not depend on where the workspace is: two clones doing the same computation write the same bytes.

DVC identifies an output by its content hash, so an output that records an absolute path (a policy's
folder in ``metrics.json``, say) differs between two clones of the project, and a DVC remote or run cache
shared between machines never matches it. Here every stage's library function runs, as its DVC stage
does (in the workspace), on the shrunk demo (tests/shrunk.py: sliced scifact, the tiny in-code BERT, one
epoch) in two workspaces at different paths, each with its own shared data folder beside it, and every
file of the two workspaces must be byte-identical (``timings/``, wall times kept out of DVC, aside).
"""

from __future__ import annotations

import os
from pathlib import Path

from shrunk import shrunk_overrides, sliced_scifact_mirror

ROOT = Path(__file__).resolve().parents[2]


def _pipeline(clone: Path, mirror: Path, tiny_model_dir: Path) -> Path:
    """The shrunk demo's stages, through their library functions, in ``clone/runs/demo``; returns that folder."""
    from pgrank.config import load_params
    from pgrank.download.stage import download
    from pgrank.evaluation.stage import evaluate_dataset
    from pgrank.evaluation.systems import policy_systems
    from pgrank.mining.candidate_sets import mine_splits, select_targets
    from pgrank.paths import Paths
    from pgrank.reporting.tables import make_tables
    from pgrank.training.trainer import train

    clone.mkdir(parents=True)
    (clone / "params.yaml").write_bytes((ROOT / "params.yaml").read_bytes())
    (clone / "profiles").mkdir()
    (clone / "profiles" / "demo.yaml").write_bytes((ROOT / "profiles" / "demo.yaml").read_bytes())
    overrides = [*shrunk_overrides(tiny_model_dir), f"data.mirror={mirror}", "tracking.enabled=false",
                 "paths.data=data", "paths.embeddings=data/embeddings"]
    params = load_params(clone / "params.yaml", overrides, "demo")
    paths = Paths.from_config(params.paths, base=clone)
    paths.root.mkdir(parents=True)
    cwd = Path.cwd()
    os.chdir(paths.root)  # where DVC runs the stages
    try:
        download(params, paths, config_dir=clone, progress=False)
        for dataset, training in [(None, True), ("scifact", False)]:  # mine-train, mine@scifact
            mine_splits(params, paths, select_targets(params, dataset, (), training), progress=False)
        train(params, paths, "minilm", device="cpu", progress=False)
        for system in [*params.evaluate.systems.all(), *policy_systems(params)]:
            evaluate_dataset(params, paths, system, "scifact")
        make_tables(params, paths)
    finally:
        os.chdir(cwd)
    return paths.root


def _files(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*"))
            if p.is_file() and p.relative_to(root).parts[0] != "timings"}


def test_two_workspaces_at_different_paths_write_identical_bytes(tmp_path, beir_mirror, tiny_model_dir):
    mirror = sliced_scifact_mirror(beir_mirror / "scifact.zip", tmp_path / "mirror")
    first = _files(_pipeline(tmp_path / "one" / "pgrank", mirror, tiny_model_dir))
    second = _files(_pipeline(tmp_path / "elsewhere" / "two" / "pgrank", mirror, tiny_model_dir))
    assert {"results/pgrank-minilm/pg/scifact/test/rerank/metrics.json", "models/minilm/pg/epoch-1/pgrank.json",
            "datasets/scifact.json", "tables/tables.md"} <= set(first)
    assert set(first) == set(second)
    differ = sorted(name for name in first if first[name] != second[name])
    assert not differ, differ
    assert not [name for name, data in first.items() if str(tmp_path).encode() in data]  # no absolute path at all
