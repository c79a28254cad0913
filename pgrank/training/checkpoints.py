"""Checkpoints: sentence-transformers folders per kept epoch, and resumable training state.

``{model_dir}/epoch-{e}/`` is a plain sentence-transformers model (safetensors) plus ``pgrank.json``
describing it. For ``tower: query`` the checkpoint is an asymmetric model: a sentence-transformers
``Router`` whose ``query`` route is the trained encoder and whose ``document`` route is the frozen
warm start, so ``encode_query`` / ``encode_document`` do the right thing for any user, and
``pgrank.json``'s ``document_encoder`` names the warm start whose corpus-embedding artifact can be
reused.

``{model_dir}/state/`` exists only while a run is incomplete: the trainable model after the last
finished epoch, and ``trainer.pt`` with the optimizer, scheduler, RNG states, counters and a
fingerprint of the settings. It is read with ``torch.load(weights_only=True)``: no pickle.
Everything is written atomically, so a kill leaves the previous complete checkpoint.

A ``tower: query`` checkpoint can itself be a warm start (continual training, e.g. from the champion):
its query route is trained (:func:`query_route`) and its ``document_encoder`` stays the frozen document
side (:func:`document_encoder`), whose corpus-embedding artifact is reused.
"""

from __future__ import annotations

import contextlib
import json
import random
import shutil
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from pgrank.atomic import atomic_path
from pgrank.models.checkpoint_meta import CHECKPOINT_META

TRAINER_STATE = "trainer.pt"


def save_model(model: Any, path: Path, meta: dict, *, document_model: Any | None = None) -> None:
    """Save ``model`` (or the query/document pair) as a sentence-transformers folder, atomically."""
    from sentence_transformers import SentenceTransformer
    from sentence_transformers.base.modules import Router

    to_save = model
    if document_model is not None:
        router = Router.for_query_document(query_modules=list(model), document_modules=list(document_model))
        to_save = SentenceTransformer(modules=[router], device=str(next(model.parameters()).device),
                                      prompts=dict(model.prompts or {}), default_prompt_name=model.default_prompt_name)
        to_save.similarity_fn_name = model.similarity_fn_name  # and the warm start's prompts, as training applied them
    with atomic_path(path, directory=True) as tmp, _saved_as_loaded(model, document_model):
        to_save.save(str(tmp), safe_serialization=True)
        (tmp / CHECKPOINT_META).write_text(json.dumps(meta, indent=2, sort_keys=True) + "\n")


@contextlib.contextmanager
def _saved_as_loaded(*models: Any) -> Iterator[None]:
    """Save ``models`` with bytes that depend on their weights only, and leave them as they were.

    Two side effects of sentence-transformers' ``save`` made a resumed run's checkpoints differ from
    an uninterrupted run's:

    * the model card's usage example *encodes* sentences, and ``encode`` switches every module it runs
      to eval mode. For a ``tower: query`` checkpoint the Router is built from the training model's
      own modules, so after the first save the training went on without dropout (the model's own
      ``training`` flag still said True), while a resumed run, which calls ``train()``, had dropout:
      different weights. The modules' modes are restored here.
    * a fast tokenizer keeps the truncation and padding of its last call in its backend, and
      ``save_pretrained`` writes them into ``tokenizer.json``: the file recorded what the model had
      encoded before (a resumed run's fresh document tower had encoded nothing and saved the shipped
      ``max_length: 128`` / ``Fixed 128``; an uninterrupted one, ``256`` / ``BatchLongest``). Both are
      cleared before saving; every call sets its own, so nothing reads them.
    """
    models = [m for m in models if m is not None]
    modules = [module for model in models for module in model.modules()]
    modes = [module.training for module in modules]
    for module in modules:
        backend = getattr(getattr(module, "tokenizer", None), "backend_tokenizer", None)
        if backend is not None:
            backend.no_truncation()
            backend.no_padding()
    try:
        yield
    finally:
        for module, mode in zip(modules, modes):
            module.training = mode


@dataclass
class TrainerState:
    """Everything besides the model weights needed to continue a run exactly."""

    epoch: int  # epochs completed
    step: int  # optimizer steps completed
    fingerprint: str
    optimizer: dict = field(default_factory=dict)
    scheduler: dict = field(default_factory=dict)
    torch_rng: torch.Tensor | None = None
    cuda_rng: list[torch.Tensor] = field(default_factory=list)
    python_rng: tuple | None = None
    history: list[dict] = field(default_factory=list)
    curve: list[dict] = field(default_factory=list)  # per-step points of the finished epochs (curve.csv)
    mlflow_run_id: str | None = None  # the run that saved this state: a resumed run links to it


def save_state(path: Path, model: Any, state: TrainerState) -> None:
    """Write the resumable state (model + trainer) atomically as one folder."""
    with atomic_path(path, directory=True) as tmp, _saved_as_loaded(model):
        model.save(str(tmp / "model"), safe_serialization=True)
        torch.save(
            {
                "epoch": state.epoch,
                "step": state.step,
                "fingerprint": state.fingerprint,
                "optimizer": state.optimizer,
                "scheduler": state.scheduler,
                "torch_rng": state.torch_rng,
                "cuda_rng": state.cuda_rng,
                "python_rng": _py_rng_to_list(state.python_rng),
                "history": json.dumps(state.history),
                "curve": json.dumps(state.curve),
                "mlflow_run_id": state.mlflow_run_id or "",
            },
            tmp / TRAINER_STATE,
        )


def load_state(path: Path) -> TrainerState | None:
    """The saved trainer state, or ``None`` if there is no complete one."""
    file = Path(path) / TRAINER_STATE
    if not file.is_file() or not (Path(path) / "model").is_dir():
        return None
    raw = torch.load(file, map_location="cpu", weights_only=True)
    return TrainerState(
        epoch=raw["epoch"], step=raw["step"], fingerprint=raw["fingerprint"], optimizer=raw["optimizer"],
        scheduler=raw["scheduler"], torch_rng=raw["torch_rng"], cuda_rng=list(raw["cuda_rng"]),
        python_rng=_py_rng_from_list(raw["python_rng"]), history=json.loads(raw["history"]),
        curve=json.loads(raw.get("curve", "[]")), mlflow_run_id=raw.get("mlflow_run_id") or None,
    )


def capture_rng(state: TrainerState) -> None:
    state.torch_rng = torch.get_rng_state()
    state.cuda_rng = list(torch.cuda.get_rng_state_all()) if torch.cuda.is_available() else []
    state.python_rng = random.getstate()


def restore_rng(state: TrainerState) -> None:
    if state.torch_rng is not None:
        torch.set_rng_state(state.torch_rng)
    if state.cuda_rng and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state.cuda_rng)
    if state.python_rng is not None:
        random.setstate(state.python_rng)


def remove(path: Path) -> None:
    shutil.rmtree(path, ignore_errors=True)


def prune(model_dir: Path, fingerprint: str, epochs_done: int) -> list[str]:
    """Delete from ``model_dir`` everything but this run's work; return what was deleted.

    Kept: ``state/`` (its own fingerprint is checked on load) and each ``epoch-E/`` (and ``selected/``
    of an epoch ``E``) with ``E <= epochs_done`` whose ``pgrank.json`` carries ``fingerprint``. Anything else (checkpoints of other
    settings, epochs a resumed run will write again, stray files) goes, so that the output DVC hashes
    is exactly what this configuration produces.
    """
    from pgrank.models.checkpoint_meta import read_checkpoint_meta

    removed = []
    for entry in sorted(Path(model_dir).iterdir()) if Path(model_dir).is_dir() else []:
        if entry.name == "state":
            continue
        if entry.name == "selected" and entry.is_dir():  # the epoch train.selection chose (rules other than last)
            meta = read_checkpoint_meta(entry)
            ours = meta.get("fingerprint") == fingerprint and meta.get("epoch", epochs_done + 1) <= epochs_done
        else:
            epoch = entry.name.removeprefix("epoch-")
            ours = (entry.is_dir() and entry.name.startswith("epoch-") and epoch.isdigit() and int(epoch) <= epochs_done
                    and read_checkpoint_meta(entry).get("fingerprint") == fingerprint)
        if not ours:
            shutil.rmtree(entry) if entry.is_dir() else entry.unlink()
            removed.append(entry.name)
    return removed


# Python's RNG state is a nested tuple of ints; weights_only loading accepts lists of ints.
def _py_rng_to_list(state: tuple | None) -> list | None:
    if state is None:
        return None
    version, internal, gauss = state
    return [version, list(internal), gauss]


def _py_rng_from_list(raw: list | None) -> tuple | None:
    if raw is None:
        return None
    version, internal, gauss = raw
    return (version, tuple(internal), gauss)


def document_encoder(ref: Any, models: Any) -> Any | None:
    """The frozen document encoder of a ``tower: query`` checkpoint used as a warm start, else ``None``."""
    from pgrank.models.checkpoint_meta import document_encoder_of, read_checkpoint_meta
    from pgrank.models.names import resolve_model

    name = document_encoder_of(read_checkpoint_meta(ref.local_dir)) if ref.local_dir is not None else None
    return resolve_model(name, models) if name else None


def query_route(model: Any) -> Any:
    """The query route of a query/document ``Router`` model as a plain model (any other model as it is)."""
    from sentence_transformers import SentenceTransformer
    from sentence_transformers.base.modules import Router

    if not isinstance(model[0], Router):
        return model
    plain = SentenceTransformer(modules=list(model[0].sub_modules["query"]), device=str(next(model.parameters()).device),
                                prompts=dict(model.prompts or {}), default_prompt_name=model.default_prompt_name)
    plain.similarity_fn_name = model.similarity_fn_name
    return plain
