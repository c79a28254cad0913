"""A run whose policy the packing probe switches off says so once in its log and in its MLflow metrics."""

from __future__ import annotations

import json
import logging
import shutil

from toy_project import make_project

from pgrank.training.trainer import train


def test_a_run_whose_probe_switches_packing_off_logs_it_once_and_records_the_metric(tmp_path, tiny_model_dir,
                                                                                    monkeypatch, caplog):
    """A BERT whose tokenizer pads on the left: its absolute positions shift with the padding, so a packed chunk no
    longer encodes as the padded layout (or ``encode``) does, and the run trains padded."""
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    model = tmp_path / "left-padded"
    shutil.copytree(tiny_model_dir, model)
    for config in model.rglob("tokenizer_config.json"):
        data = json.loads(config.read_text())
        config.write_text(json.dumps({**data, "padding_side": "left"}))
    params, paths = make_project(tmp_path, model, overrides={"tracking.enabled": True, "train.tower": "both",
                                                              "train.epochs": 1, "train.keep_epochs": [1]})
    with caplog.at_level(logging.WARNING, logger="pgrank.models.packing"):
        train(params, paths, str(model), device="cpu", progress=False)
    warned = [r.getMessage() for r in caplog.records if "packing is off" in r.getMessage()]
    assert len(warned) == 1 and "differ from the padded layout's" in warned[0]
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri=paths.mlflow_uri())
    (run,) = client.search_runs([client.get_experiment_by_name(params.tracking.experiment).experiment_id])
    assert run.data.metrics["packing_off"] == 1.0
