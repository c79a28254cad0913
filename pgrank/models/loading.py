"""Loading a resolved model (:mod:`pgrank.models.names`) as a sentence-transformers model, safely.

* Only safetensors weights: transformers is told ``use_safetensors=True``, so that it never falls back to a
  pickle, also for hub downloads.
* At the pinned revision (``models.revisions``). Offline (``HF_HUB_OFFLINE=1``), a pinned revision missing from
  the local cache is an error, not a silent fallback to another one.
* As float32, whatever dtype a checkpoint was saved in: T5 overflows in float16 (its feed-forward activations
  exceed 65,504), and training keeps float32 master weights under bf16 autocast; forward-only encoding chooses its
  own precision (:mod:`pgrank.models.backends`).
* TF32 matrix products on CUDA.

Example:
    >>> model = load_encoder("minilm", params.models, device="cpu", max_seq_length=256)
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from pgrank.config import ModelsConfig
from pgrank.errors import PgrankError
from pgrank.models.names import ModelRef, resolve_model

if TYPE_CHECKING:
    from sentence_transformers import SentenceTransformer

log = logging.getLogger(__name__)


def on_cuda(device: str | None = None) -> bool:
    """Whether models run on CUDA: ``device`` as given, or (``None``) wherever torch sees a GPU."""
    import torch

    return (device or "").startswith("cuda") or (device is None and torch.cuda.is_available())


def use_tf32() -> None:
    """Let float32 matrix products on CUDA run as TF32 (Ampere and later: about 8x the fp32 rate; 10 bits of
    mantissa in the products, float32 accumulation). Called wherever pgrank puts a model on a GPU."""
    import torch

    torch.set_float32_matmul_precision("high")
    torch.backends.cudnn.allow_tf32 = True


def capped_length(name: str, max_seq_length: int, limit: int | None) -> int:
    """``max_seq_length`` capped at a model's position ``limit`` (BERT-like models cannot read past it), with a
    warning where it is."""
    if limit is not None and max_seq_length > limit:
        log.warning("%s: max_seq_length %d exceeds its %d positions; using %d", name, max_seq_length, limit, limit)
        return limit
    return max_seq_length


def position_limit(model: "SentenceTransformer") -> int | None:
    """The longest input the model's position embeddings allow (None: no fixed limit, e.g. T5)."""
    config = getattr(getattr(model[0], "auto_model", None), "config", None)
    limit = getattr(config, "max_position_embeddings", None)
    return int(limit) if isinstance(limit, int) and limit > 0 else None


def load_encoder(
    name: str | ModelRef,
    models: ModelsConfig,
    *,
    device: str | None = None,
    max_seq_length: int | None = None,
    sparse: bool = False,
) -> "SentenceTransformer":
    """Load a sentence-transformers bi-encoder (``sparse``: a ``SparseEncoder``, e.g. SPLADE) by name, from
    safetensors weights only, as float32, at its pinned revision.

    Args:
        name: hub id, alias, local directory, or an already resolved :class:`ModelRef`.
        models: the ``models`` section of the params.
        device: torch device (``None``: sentence-transformers' choice, CUDA when present). On CUDA, float32
            matrix products run as TF32 (:func:`use_tf32`).
        max_seq_length: truncate inputs to this many tokens. Capped at the model's position limit
            (BERT-like models cannot read past it), with a warning.
        sparse: load a ``SparseEncoder`` (masked-language-model head and SPLADE pooling).

    Returns:
        The model, in eval mode.

    Raises:
        PgrankError: the model cannot be resolved or loaded (no network, not on the hub, a pinned revision
            that is not there, ...).

    Example:
        >>> model = load_encoder("minilm", params.models, device="cpu", max_seq_length=256)
    """
    import torch
    from sentence_transformers import SentenceTransformer, SparseEncoder

    ref = name if isinstance(name, ModelRef) else resolve_model(name, models)
    revision = ref.revision if ref.local_dir is None else None
    try:
        model = (SparseEncoder if sparse else SentenceTransformer)(
            ref.source, device=device, revision=revision, model_kwargs={"use_safetensors": True, "dtype": torch.float32})
    except (OSError, ValueError) as exc:
        hint = (
            "" if ref.local_dir is not None
            else f"; without network access, add an offline copy under models.offline.{ref.hub_id} in params.yaml"
        )
        at = f" at revision {revision!r} (models.revisions)" if revision else ""
        reason = " ".join(str(exc).split())  # one line: the CLI prints it as a one-line error
        raise PgrankError(f"cannot load model {ref.name!r} from {ref.source}{at}: {reason}{hint}") from None
    if model.device.type == "cuda":
        use_tf32()
    if max_seq_length is not None:
        max_seq_length = capped_length(ref.name, max_seq_length, position_limit(model))
        try:
            model.max_seq_length = max_seq_length
        except AttributeError:  # a model without a truncation length (StaticEmbedding) reads whole texts
            log.debug("%s: no max_seq_length to set; inputs are not truncated", ref.name)
    model.eval()
    return model
