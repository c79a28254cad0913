"""The console script: fast help, and bad input as one message with a non-zero exit."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def run(*args: str, cwd: Path = ROOT) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(ROOT / "cli.py"), *args], cwd=cwd, capture_output=True, text=True)


def test_help_imports_nothing_heavy():
    out = run("--help")
    assert out.returncode == 0 and "params" in out.stdout
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


def test_a_relative_params_file_is_relative_to_where_pgrank_runs(tmp_path):
    from shrunk import project_copy

    project = project_copy(tmp_path / "project")
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    out = run("--params", "../project/params.yaml", "--profile", "demo", "repro", "--dry", "download", cwd=elsewhere)
    assert out.returncode == 0, out.stderr[-2000:]
    assert (project / "runs" / "demo" / "dvc.yaml").is_file()  # the workspace sits under the params file's folder
    assert list(elsewhere.iterdir()) == []



def test_each_log_message_reaches_the_console_once_even_when_a_library_logs_through_the_root_logger():
    """A library that calls ``logging.warning`` installs logging's default handler on the root logger unless one is
    there; pgrank's messages must not print a second time through it (``INFO:pgrank.<module>:...``)."""
    script = ("import logging, cli\ncli._log_to_stderr()\ncli._log_to_stderr()\n"
              "logging.getLogger('pgrank.stage').info('before')\n"
              "logging.warning('a library speaks through the root logger')\n"
              "logging.getLogger('pgrank.stage').info('after')\n"
              "logging.getLogger('sentence_transformers').info('library detail, not shown')\n")
    err = subprocess.run([sys.executable, "-c", script], cwd=ROOT, capture_output=True, text=True, timeout=60).stderr
    assert err.splitlines() == ["pgrank: before", "WARNING:root:a library speaks through the root logger", "pgrank: after"]


def test_train_refuses_a_seed_the_params_do_not_list():
    out = run("--set", "train.extra_seeds=[43]", "train", "--seed", "7")
    assert out.returncode != 0 and "Traceback" not in out.stderr
    assert "--seed 7" in out.stderr and "train.extra_seeds [43]" in out.stderr


def test_every_command_keeps_a_ctrl_c_that_lands_in_a_finalizer():
    """A stage's Ctrl-C can arrive while Python runs an object's ``__del__``, which would drop it (pgrank/errors.py
    ``keep_interrupts``); once a command has started, the interrupt still reaches the code that runs."""
    from test_errors import stop_in_a_finalizer

    run = stop_in_a_finalizer("import cli\ncli.app(['params', 'train'], standalone_mode=False)")
    assert run.stdout.splitlines()[-1] == "interrupted", run.stderr
    assert "Exception ignored" not in run.stderr
