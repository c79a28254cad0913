"""A stage imports only what it runs: the evaluation stage's and tracking's modules load no model library and no
MLflow when imported; sentence-transformers, torch and MLflow come in only inside the calls that use them, and a dense
evaluation stage on ONNX with its corpus embeddings cached needs none of them."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
HEAVY = ("torch", "sentence_transformers", "transformers", "mlflow", "sqlalchemy", "onnxruntime", "scipy")


def test_importing_the_evaluation_stage_and_tracking_loads_no_heavy_library():
    probe = ("import sys, cli, pgrank.evaluation.stage, pgrank.tracking, pgrank.training.selection; "
             f"print(sorted(m for m in {HEAVY!r} if m in sys.modules))")
    imported = subprocess.run([sys.executable, "-c", probe], cwd=ROOT, capture_output=True, text=True)
    assert imported.returncode == 0, imported.stderr
    assert imported.stdout.strip() == "[]", imported.stdout


def test_a_dense_evaluation_stage_inside_a_pipeline_runs_on_onnx_and_numpy_alone(tmp_path, tiny_model_dir):
    """A dense system encoded by ONNX, its corpus embeddings cached: the stage process, inside a pipeline, imports no
    torch, sentence-transformers or MLflow (its MLflow runs go to the workspace's spool) and writes its results."""
    import json
    import os

    from toy_project import make_project

    from pgrank.evaluation.stage import evaluate_dataset

    params, paths = make_project(tmp_path, tiny_model_dir, overrides={
        "models.aliases.tiny": str(tiny_model_dir), "models.backends.tiny": "onnx", "evaluate.systems.dense": ["tiny"],
        "train.warm_starts": ["tiny"],
        "data.eval_sets": ["toy/validation"], "evaluate.max_seq_length": 32, "evaluate.top_k": 20,
        "tracking.enabled": True})
    evaluate_dataset(params, paths, "tiny", "toy")  # here: the ONNX export and the corpus embeddings, logged to MLflow
    probe = ("import json, sys\nfrom pgrank.config import parse_params\nfrom pgrank.paths import Paths\n"
             "from pgrank.evaluation.stage import evaluate_dataset\n"
             "params = parse_params(json.loads(sys.argv[1]))\n"
             "results = evaluate_dataset(params, Paths.from_config(params.paths), 'tiny', 'toy')\n"
             f"print(json.dumps([m for m in {HEAVY!r} if m in sys.modules]), len(results))\n")
    env = {**os.environ, "DVC_STAGE": "evaluate-dense@tiny-toy"}
    env.pop("PGRANK_MLFLOW_PARENT_RUN_ID", None)
    child = subprocess.run([sys.executable, "-c", probe, json.dumps(params.model_dump(mode="json"))], cwd=ROOT,
                           env=env, capture_output=True, text=True, timeout=300)
    assert child.returncode == 0, child.stderr[-3000:]
    heavy = [m for m in HEAVY if m != "onnxruntime"]  # ONNX Runtime encodes the queries
    loaded, count = child.stdout.strip().splitlines()[-1].rsplit(" ", 1)
    assert [m for m in json.loads(loaded) if m in heavy] == [] and count == "2", child.stdout[-2000:]
    assert len(list(paths.mlflow_spool.glob("*.json"))) == 1
