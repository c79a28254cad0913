"""``dvc plots show`` on a finished run's workspace: every plot ``dvc.yaml`` declares, the validation history included,
and no warning.

The run is trained for real on the toy project as the demo trains (``tower: query``, an out-of-domain validation set,
the guarded rule with its noise guard, warm-start mixtures and the one-standard-error step), so its ``history.json``
has the demo's shape: rows of mixtures beside rows of epochs as trained, per-query figures, weight distances. The
workspace is composed as ``pgrank repro`` composes one (the project's ``dvc.yaml``, the params as
:func:`pgrank.pipeline.workspace.workspace_params` writes them).
"""

from __future__ import annotations

import csv
import json
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml
from toy_project import with_other_dataset

ROOT = Path(__file__).resolve().parents[2]
OOD = "other/dev"
WARM = "tiny"  # an alias, as the demo's minilm: DVC names the stages and plot files by it


@pytest.fixture(scope="module")
def workspace(tmp_path_factory, tiny_model_dir):
    from pgrank.pipeline.workspace import workspace_params
    from pgrank.training.trainer import train

    tmp = tmp_path_factory.mktemp("plots")
    params, paths = with_other_dataset(tmp, tiny_model_dir, {  # the out-of-domain set, mined as a training set is
        "models.aliases": {WARM: str(tiny_model_dir)}, "train.warm_starts": [WARM],
        "evaluate.systems": {"bm25": ["bm25"], "dense": [WARM], "sparse": []},
        "train.validation_sets": [OOD], "train.learning_rate": 3e-3, "train.epochs": 1, "train.keep_epochs": [0, 1],
        "train.selection": {"rule": "guarded", "guard": "noise", "noise_se": 1, "interpolation": [0.5, 1],
                            "within_se": 1, "standard_error": "paired"},
        "train.document_anchor": {"coef": 0.3, "documents": 2}, "train.pg.kl": "top1", "train.pg.kl_coef": 0.1})
    train(params, paths, WARM, device="cpu", progress=False)

    ws = paths.root  # the run's root is the workspace, as in runs/demo
    (ws / "params.yaml").write_text(yaml.safe_dump(workspace_params(params, tmp, ws), sort_keys=False))
    shutil.copy(ROOT / "dvc.yaml", ws / "dvc.yaml")
    subprocess.run(["dvc", "init", "--no-scm", "-q"], cwd=ws, check=True)
    return ws, params


def _plots(ws: Path, *args: str) -> subprocess.CompletedProcess:
    out = subprocess.run(["dvc", "plots", "show", *args], cwd=ws, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    return out


def test_the_history_has_the_demo_s_shape(workspace):
    """Rows whose keys differ (a mixture's ``alpha``) are what DVC refused to plot in ``history.json``."""
    ws, params = workspace
    history = json.loads((ws / "training" / WARM / "pg" / "history.json").read_text())
    assert {row.get("alpha", 1.0) for row in history} == {0.5, 1.0}
    assert len({frozenset(row) for row in history}) > 1  # keys differ from row to row
    assert all("per_query_ndcg@10" in row and "distance" in row for row in history)


def test_dvc_plots_show_every_declared_plot_and_the_validation_history_without_a_warning(workspace):
    ws, params = workspace
    out = _plots(ws, "--json")
    assert "WARNING" not in out.stderr and "ERROR" not in out.stderr, out.stderr
    shown = json.loads(out.stdout)
    assert "errors" not in shown, shown.get("errors")
    folder = f"training/{WARM}/pg"
    assert set(shown["data"]) == {f"{folder}/curve.csv", f"{folder}/validation.csv"}  # every plot dvc.yaml declares
    assert all(shown["data"][name] for name in shown["data"])  # each with its figure
    points = shown["data"][f"{folder}/validation.csv"][0]["content"]["data"]["values"]
    rows = list(csv.DictReader((ws / folder / "validation.csv").open()))
    assert [int(p["epoch"]) for p in points] == list(range(params.train.epochs + 1))  # the warm start, every epoch
    assert [float(p["val_ndcg@10"]) for p in points] == [float(r["val_ndcg@10"]) for r in rows]
    assert list(rows[0])[:2] == ["epoch", "val_ndcg@10"] and f"val_{OOD}_ndcg@10" in rows[0]  # in and out of domain
    assert all(column.startswith("val_") for column in list(rows[0])[1:])
    history = json.loads((ws / folder / "history.json").read_text())
    trained = [row for row in history if "alpha" not in row]
    assert [float(r[f"val_{OOD}_ndcg@10"]) for r in rows] == pytest.approx([r[f"val_{OOD}_ndcg@10"] for r in trained])
    # and the HTML page the findings page points to
    html = _plots(ws, "-o", "plots")
    assert "WARNING" not in html.stderr and (ws / "plots" / "index.html").is_file()
    assert "validation.csv" in (ws / "plots" / "index.html").read_text()
