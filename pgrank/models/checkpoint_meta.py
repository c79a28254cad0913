"""What pgrank records beside every checkpoint it trains (``pgrank.json``: warm start, tower, epoch, document
encoder, ...), and reading it back."""

from __future__ import annotations

import json
from pathlib import Path

from pgrank.models.names import model_name_of

# Beside the weights of every checkpoint pgrank trains: what it is (warm start, tower, epoch, ...).
CHECKPOINT_META = "pgrank.json"


def document_encoder_of(meta: dict) -> str | None:
    """The frozen document encoder a ``tower: query`` checkpoint's ``pgrank.json`` (``meta``) names, as a name
    :func:`resolve_model` takes; ``None`` for any other model."""
    name = meta.get("document_encoder") if meta.get("tower") == "query" else None
    return model_name_of(name) if name else None


def read_checkpoint_meta(folder: str | Path) -> dict:
    """The ``pgrank.json`` of a trained checkpoint folder (``{}`` for any other model)."""
    meta = Path(folder) / CHECKPOINT_META
    return json.loads(meta.read_text(encoding="utf-8")) if meta.is_file() else {}
