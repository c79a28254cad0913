"""The Prefect flows without a server: tasks read from DVC, dataset selection, retries, runners, bad input.

Plain functions and ``task.fn`` are tested directly on the toy DVC project (:mod:`toy_pipeline`).
"""

from __future__ import annotations

import logging
import os
import subprocess
import sys
from pathlib import Path

import pytest

from toy_pipeline import TOY_STAGES

from flows.pipeline import select_datasets, stage_graph, stage_task
from pgrank.errors import PgrankError

ROOT = Path(__file__).resolve().parents[2]

def test_stages_and_edges_come_from_dvc(toy):
    graph = stage_graph(toy)
    assert set(graph) == TOY_STAGES
    assert graph["download"] == [] and graph["mine@nf"] == ["download"]
    assert sorted(graph["evaluate@w-nf"]) == ["mine@nf", "train@w"]
    assert sorted(graph["tables"]) == sorted(s for s in TOY_STAGES if s.startswith("evaluate@"))


def test_datasets_select_their_fanned_out_stages_and_keep_the_shared_ones():
    graph = {"download": [], "mine-train": ["download"], "mine@sci": ["download"], "mine@climate-fever": ["download"],
             "mine@fever": ["download"], "train@w": ["mine-train"],
             "evaluate@bm25-sci": ["mine@sci"], "evaluate@bm25-climate-fever": ["mine@climate-fever"],
             "evaluate@bm25-fever": ["mine@fever"], "evaluate-policy@w-fever": ["mine@fever", "train@w"],
             "tables": ["evaluate@bm25-sci", "evaluate@bm25-climate-fever", "evaluate@bm25-fever", "train@w"]}
    kept = select_datasets(graph, ["fever"])
    assert set(kept) == {"download", "mine-train", "train@w", "mine@fever", "evaluate@bm25-fever",
                         "evaluate-policy@w-fever", "tables"}
    assert sorted(kept["tables"]) == ["evaluate@bm25-fever", "train@w"]
    order = list(kept)
    assert all(order.index(u) < order.index(s) for s in kept for u in kept[s])  # topological
    assert set(select_datasets(graph, None)) == set(graph)
    with pytest.raises(PgrankError, match="available: climate-fever, fever, sci"):
        select_datasets(graph, ["scifact"])


def test_a_stage_task_runs_dvc_and_streams_its_output(toy, monkeypatch, caplog):
    task = stage_task("download")
    with caplog.at_level(logging.INFO, logger="pgrank.flows"):
        assert task.fn(str(toy), "download") == "download"
    assert (toy / "data.txt").is_file()
    assert "writing data.txt" in caplog.text and "Running stage 'download'" in caplog.text
    caplog.clear()
    with caplog.at_level(logging.INFO, logger="pgrank.flows"):
        task.fn(str(toy), "download")
    assert "didn't change, skipping" in caplog.text  # DVC decides what is up to date
    monkeypatch.setenv("TOY_FAIL", "mine-sci.txt")
    with pytest.raises(PgrankError, match=r"(?s)stage mine@sci: .*failing on purpose"):
        stage_task("mine@sci").fn(str(toy), "mine@sci")


def test_only_the_download_stage_retries_with_exponential_backoff():
    download = stage_task("download")
    assert download.name == "download" and download.retries == 3
    assert download.retry_delay_seconds == [10, 20, 40]
    assert stage_task("train@w").retries == 0


def _pgrank(*args: str, env: dict | None = None, **kwargs) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, str(ROOT / "cli.py"), *args], cwd=ROOT, env=env, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, **kwargs)


def test_schedule_rejects_a_bad_cron_string_and_a_missing_server():
    env = {k: v for k, v in os.environ.items() if k != "PREFECT_API_URL"}
    bad = _pgrank("schedule", "--cron", "61 3 * * 0", env=env)
    _, err = bad.communicate(timeout=60)
    assert bad.returncode == 2 and "Traceback" not in err
    assert "--cron '61 3 * * 0'" in err and "five fields" in err
    from prefect.settings import PREFECT_API_URL, temporary_settings

    from flows.retraining import check_server

    with temporary_settings(restore_defaults={PREFECT_API_URL}):
        with pytest.raises(PgrankError, match="prefect server start --host 127.0.0.1"):
            check_server()


def test_stages_that_run_a_model_are_tagged_and_bounded_and_the_others_are_not():
    from flows.pipeline import DEFAULT_MAX_WORKERS, DEVICE_TAG, pgrank_pipeline

    for stage in ("mine-train", "mine@scifact", "train@minilm-pg", "evaluate-dense@minilm-scifact",
                  "evaluate-sparse@splade-v2-nfcorpus", "evaluate-policy@minilm-pg-scifact"):
        assert stage_task(stage).tags == {DEVICE_TAG}, stage
    for stage in ("download", "evaluate-bm25@bm25-scifact", "tables"):
        assert stage_task(stage).tags == set(), stage
    import inspect

    assert inspect.signature(pgrank_pipeline.fn).parameters["max_workers"].default == DEFAULT_MAX_WORKERS > 0


def test_every_dvc_stage_that_loads_a_model_is_a_device_stage():
    import yaml

    from flows.pipeline import uses_device

    stages = yaml.safe_load((ROOT / "dvc.yaml").read_text())["stages"]
    for name, stage in stages.items():
        deps = (stage.get("do") or stage)["deps"]
        assert uses_device(f"{name}@x") == ("pgrank/models" in deps), name
