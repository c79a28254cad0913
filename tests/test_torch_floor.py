"""pgrank's torch floor (pgrank.torch_floor): the first release with every API the CUDA path calls, and one
clear error below it."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

from pgrank.errors import PgrankError
from pgrank import torch_floor

ROOT = Path(__file__).resolve().parents[1]


def test_the_floor_is_pyproject_s_and_the_installed_torch_meets_it():
    pinned = re.search(r'"torch>=([\d.]+)"', (ROOT / "pyproject.toml").read_text()).group(1)
    assert pinned == torch_floor.FLOOR == "2.11"
    assert torch_floor.installed().split("+")[0] == __import__("torch").__version__.split("+")[0]
    assert torch_floor.missing(signature=True) is None
    torch_floor.require(signature=True)


@pytest.mark.parametrize("version", ["2.10.0", "2.3.1+cu121", "1.13.1"])
def test_an_older_torch_is_named_with_the_fix(version):
    assert torch_floor.missing(version) == f"torch {version} is older than 2.11"
    with pytest.raises(PgrankError, match=rf"torch {re.escape(version)} is older than 2.11: .*varlen_attn.*"
                                          r"install torch>=2\.11"):
        torch_floor.require(version)
    assert torch_floor.missing("2.11.0+cu130") is None and torch_floor.missing("3.0.0") is None


def test_the_cli_below_the_floor_is_one_error_line_and_no_traceback(tmp_path):
    """The real CLI where the installed torch is 2.10 (the release whose varlen_attn has no scale); the CLI reads the
    version from torch's metadata, without importing torch."""
    code = ("import sys; from importlib import metadata; real = metadata.version; "
            "metadata.version = lambda name: '2.10.0' if name == 'torch' else real(name); sys.path.insert(0, %r); "
            "import cli; sys.argv = ['pgrank', 'params']; cli.app()" % str(ROOT))
    done = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert done.returncode == 2
    lines = [line for line in done.stderr.splitlines() if line.strip()]
    assert [line for line in lines if line.startswith("pgrank: error:")] == [
        "pgrank: error: torch 2.10.0 is older than 2.11: pgrank's CUDA path calls "
        "torch.nn.attention.varlen.varlen_attn(..., scale=...), first in torch 2.11; install torch>=2.11 "
        "(pip install 'torch>=2.11')"]
    assert "Traceback" not in done.stderr
