"""Bad input everywhere: every case of the catalogue (tests/errors/bad_inputs.py) through the real CLI.

Each case runs ``python cli.py ARGS`` in its own folder, as a user would, and must give: exit code
``case.exit`` (2 for bad input, 74 for the machine: a full disk or a read-only folder), stderr ending in
exactly one line ``pgrank: error: ...`` that matches ``case.expect`` (the file, line or key; a configuration
error with several problems: that line, then one line per further problem, and nothing else), no
traceback, and the folder unchanged: every file and folder, its bytes and mode, as before the
command (``case.keeps`` names the one documented exception). The commands are independent, so they
run a few at a time; docs/errors.md must list every case.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import resource
import shutil
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import bad_inputs
import pytest
from bad_inputs import CASES, Case

ROOT = Path(__file__).resolve().parents[2]


def state(folder: Path) -> dict[str, str]:
    """Every file and folder under ``folder``: ``{path: mode + sha256}``."""
    out = {}
    for path in sorted(folder.rglob("*")):
        rel = str(path.relative_to(folder))
        mode = oct(path.lstat().st_mode)
        if path.is_file() and not path.is_symlink():
            out[rel] = f"{mode} {hashlib.sha256(path.read_bytes()).hexdigest()}"
        else:
            out[rel] = mode
    return out


def _run(case: Case, folder: Path) -> dict:
    args = case.setup(folder)
    env = {k: v for k, v in os.environ.items() if k not in ("PGRANK_PROFILE", "PGRANK_BEIR_MIRROR", "MLFLOW_TRACKING_URI")}
    env.update(HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1")
    cmd = [sys.executable, str(ROOT / "cli.py"), *args]
    if case.read_only:
        for path in [folder, *folder.rglob("*")]:
            if path.is_dir() and not path.is_symlink():
                path.chmod(0o555)
        if os.geteuid() == 0:  # root writes anywhere: run without the capability that allows it
            if shutil.which("setpriv") is None:
                return {"skip": "running as root without setpriv to drop CAP_DAC_OVERRIDE"}
            cmd = ["setpriv", "--bounding-set", "-dac_override", *cmd]
    limit = case.fsize_limit

    def preexec():
        if limit is not None:
            resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))

    before = state(folder)
    proc = subprocess.run(cmd, cwd=folder, env=env, capture_output=True, text=True, preexec_fn=preexec, timeout=600)
    after = state(folder)
    if case.read_only:
        for path in [folder, *folder.rglob("*")]:
            if path.is_dir():
                path.chmod(0o755)
    changed = sorted(k for k in before.keys() | after.keys()
                     if before.get(k) != after.get(k) and not (case.keeps and re.search(case.keeps, k)))
    return {"args": args, "code": proc.returncode, "stderr": proc.stderr, "stdout": proc.stdout, "changed": changed}


@pytest.fixture(scope="module")
def outcomes(tmp_path_factory, tiny_model_dir) -> dict[str, dict]:
    """Every case, run once, a few at a time (they share nothing)."""
    bad_inputs.TINY_MODEL[:] = [tiny_model_dir]
    base = tmp_path_factory.mktemp("catalogue")
    folders = {case.id: base / case.id for case in CASES}
    for folder in folders.values():
        folder.mkdir()
    with ThreadPoolExecutor(max_workers=max(2, os.cpu_count() or 2)) as pool:
        futures = {case.id: pool.submit(_run, case, folders[case.id]) for case in CASES}
        results = {name: future.result() for name, future in futures.items()}
    if os.environ.get("PGRANK_CATALOGUE_DUMP"):  # what docs/errors.md quotes
        Path(os.environ["PGRANK_CATALOGUE_DUMP"]).write_text(json.dumps(results, indent=1))
    return results


def test_the_catalogue_has_at_least_thirty_cases_across_every_area():
    assert len(CASES) >= 30 and len({c.id for c in CASES}) == len(CASES)
    assert {c.area for c in CASES} == {"params", "BEIR files", "archives", "candidate files", "models", "environment"}


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_bad_input_gives_one_clear_line_a_non_zero_exit_and_changes_nothing(case, outcomes):
    out = outcomes[case.id]
    if "skip" in out:
        pytest.skip(out["skip"])
    stderr = out["stderr"]
    errors = [line for line in stderr.splitlines() if line.startswith("pgrank: error:")]
    assert "Traceback" not in stderr, stderr[-3000:]
    assert len(errors) == 1 and ends_with_the_error(stderr), stderr[-2000:]
    assert re.search(case.expect, errors[0]), f"{errors[0]!r} does not match {case.expect!r}"
    assert out["code"] == case.exit, (out["code"], stderr[-2000:])
    assert not out["changed"], f"the command changed {out['changed']}"


# One problem of a configuration error that has several: ``<where>: <key path>: <message>`` (pgrank.config.files.format_problem),
# where is ``params.yaml:12``, a profile's line or ``--set key=value``.
PROBLEM = re.compile(r"^\S.*?: [\w.\[\]-]+: \S")


def ends_with_the_error(stderr: str) -> bool:
    """Whether stderr ends with its ``pgrank: error:`` line, or with that line and the further problems of the
    same configuration error (one per line, each shaped like the first), and nothing else after it."""
    lines = stderr.rstrip().splitlines()
    at = [i for i, line in enumerate(lines) if line.startswith("pgrank: error:")]
    if len(at) != 1:
        return False
    first, rest = lines[at[0]].removeprefix("pgrank: error: "), lines[at[0] + 1:]
    return not rest or all(PROBLEM.match(line) for line in [first, *rest])


def test_the_last_line_check_accepts_one_error_or_one_config_error_and_nothing_after_it():
    assert ends_with_the_error("warming up\npgrank: error: data.train: no such split\n")
    assert ends_with_the_error("pgrank: error: params.yaml:12: train.epochs: input should be greater than 0 (got 0)\n"
                               "params.yaml:14: train.seed: unknown key\n--set a.b=1: a.b: unknown key\n")
    assert not ends_with_the_error("pgrank: error: data.train: no such split\nINFO: cleaning up\n")  # output after it
    assert not ends_with_the_error("pgrank: error: params.yaml:12: train.epochs: bad\nand a log line afterwards\n")
    assert not ends_with_the_error("pgrank: error: first\npgrank: error: second\n")
    assert not ends_with_the_error("Traceback (most recent call last):\n  ...\nValueError: boom\n")


def test_docs_errors_lists_every_case():
    text = (ROOT / "docs" / "errors.md").read_text(encoding="utf-8")
    missing = [c.id for c in CASES if f"`{c.id}`" not in text]
    assert not missing, f"docs/errors.md does not list {missing}"
