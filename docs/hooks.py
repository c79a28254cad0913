"""MkDocs hook: the generated pages (configuration and CLI references, benchmarks) are written afresh before every
build, so the site cannot drift from the code (``docs/generate.py``)."""

from __future__ import annotations

import sys
from pathlib import Path


def on_pre_build(config, **kwargs) -> None:
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from generate import write_all

    write_all()
