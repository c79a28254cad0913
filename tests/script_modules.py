"""Scripts that are not packages (``bench/*.py``, ``docs/*.py``), imported by path for the tests that check them."""

from __future__ import annotations

import importlib.util
from pathlib import Path


def load_script(path: Path, name: str):
    """The module of the script at ``path``, executed under ``name`` (unique per test file, so copies never clash)."""
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module
