"""What a profile's workspace ``params.yaml`` says of paths: the stages run inside the workspace, so every
path a profile gives relative to the params file must mean the same file there."""

from __future__ import annotations

from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_relative_offline_model_paths_are_made_absolute_against_the_project(tmp_path):
    from pgrank.config import load_params
    from pgrank.models.names import resolve_model
    from pgrank.pipeline.workspace import workspace_params

    project, copy = tmp_path / "project", tmp_path / "project" / "models" / "encoder"
    copy.mkdir(parents=True)
    (copy / "model.safetensors").write_bytes(b"")
    params = load_params(ROOT / "params.yaml", ["models.offline.org/encoder={path: models/encoder}",
                                                f"models.offline.org/elsewhere={{path: {tmp_path / 'elsewhere'}}}"])
    doc = workspace_params(params, project, project / "runs" / "x")
    offline = doc["models"]["offline"]
    assert offline["org/encoder"]["path"] == str(copy)
    assert offline["org/elsewhere"]["path"] == str(tmp_path / "elsewhere")  # absolute: as given
    assert offline["sentence-transformers/all-MiniLM-L6-v2"]["path"] is None  # a package copy: untouched
    from pgrank.config import parse_params

    ref = resolve_model("org/encoder", parse_params(doc).models)  # what a stage in the workspace resolves
    assert ref.local_dir == copy
