"""A stage imports only what it runs: the evaluation stage's and tracking's modules load no model library and no
MLflow when imported; sentence-transformers, torch and MLflow come in only inside the calls that use them."""

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
