"""A toy DVC project with the real pipeline's shape, for the Prefect flow tests (stages run in milliseconds).

download -> mine@<dataset> / train@<warm> -> evaluate@<system>-<dataset> -> tables; each stage writes its
output and says so, and fails when ``$TOY_FAIL`` names its output.
"""

from __future__ import annotations

import subprocess
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]

# The toy pipeline has the real one's shape: download -> mine@<dataset> / train@<warm> -> evaluate@<system>-<dataset> -> tables.
TOY_DVC = """
stages:
  download:
    cmd: python step.py data.txt
    outs: [data.txt]
  mine:
    foreach: [sci, nf]
    do:
      cmd: python step.py mine-${item}.txt
      deps: [data.txt]
      outs: ["mine-${item}.txt"]
  train:
    foreach: [w]
    do:
      cmd: python step.py model-${item}.txt
      deps: [data.txt]
      outs: ["model-${item}.txt"]
  evaluate:
    matrix:
      system: [bm25, w]
      dataset: [sci, nf]
    cmd: python step.py evals/${item.system}-${item.dataset}.txt
    deps: ["mine-${item.dataset}.txt", model-w.txt]
    outs: ["evals/${item.system}-${item.dataset}.txt"]
  tables:
    cmd: python step.py tables.txt
    deps: [evals]
    outs: [tables.txt]
"""
# Writes its output, says so, and fails when TOY_FAIL names it.
TOY_STEP = """
import os, sys
out = sys.argv[1]
print(f"writing {out}", flush=True)
if os.environ.get("TOY_FAIL") == out:
    sys.exit(f"{out}: failing on purpose")
os.makedirs(os.path.dirname(out) or ".", exist_ok=True)
open(out, "w").write(out)
"""
TOY_STAGES = {"download", "mine@sci", "mine@nf", "train@w", "evaluate@bm25-sci", "evaluate@bm25-nf", "evaluate@w-sci",
              "evaluate@w-nf", "tables"}


def make_toy_pipeline(folder: Path) -> Path:
    """Write the toy ``dvc.yaml``, its step script and a params file with tracking off; ``dvc init`` it."""
    (folder / "dvc.yaml").write_text(TOY_DVC)
    (folder / "step.py").write_text(TOY_STEP)
    params = yaml.safe_load((ROOT / "params.yaml").read_text())
    params["tracking"]["enabled"] = False
    (folder / "params.yaml").write_text(yaml.safe_dump(params))
    subprocess.run(["dvc", "init", "--no-scm", "-q"], cwd=folder, check=True)
    return folder
