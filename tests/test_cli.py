"""The console script: fast help, and bad input as one message with a non-zero exit."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def run(*args: str, cwd: Path = ROOT) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(ROOT / "cli.py"), *args], cwd=cwd, capture_output=True, text=True)


def test_help_is_fast_and_imports_nothing_heavy():
    start = time.perf_counter()
    out = run("--help")
    assert out.returncode == 0 and "params" in out.stdout
    assert time.perf_counter() - start < 5.0  # about 1 s; generous for a loaded CI machine
    probe = "import sys, cli; print(sorted(m for m in ('torch','sentence_transformers','mlflow') if m in sys.modules))"
    imported = subprocess.run([sys.executable, "-c", probe], cwd=ROOT, capture_output=True, text=True)
    assert imported.stdout.strip() == "[]", imported.stderr


def test_params_command_prints_the_resolved_section():
    out = run("--set", "train.epochs=3", "--set", "train.keep_epochs=[0, 3]", "--set", "evaluate.policy_epochs=[]", "params", "train")
    assert out.returncode == 0, out.stderr
    assert "epochs: 3" in out.stdout and "temperature: 0.05" in out.stdout


def test_bad_config_exits_non_zero_without_traceback(tmp_path):
    params = tmp_path / "params.yaml"
    params.write_text((ROOT / "params.yaml").read_text().replace("temperature: 0.05", "temperature: -1"))
    out = run("--params", str(params), "params")
    assert out.returncode == 2
    assert "Traceback" not in out.stderr
    assert "train.pg.temperature" in out.stderr and "greater than 0" in out.stderr
