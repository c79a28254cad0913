"""Differentiable encoding with sentence-transformers models, and cached-gradient chunking.

Training needs embeddings *with* gradients, which ``SentenceTransformer.encode`` never gives. This
module runs the model's own ``preprocess`` and ``forward`` on text batches, and implements the
cached-gradient trick (GradCache; Gao et al. 2021, as in sentence-transformers' CachedMNRL) that makes
``tower: both`` train over 1000 candidates per query in memory bounded by the chunk size:

1. :func:`encode_cached` encodes every document without grad, chunk by chunk, remembering the RNG
   state of each chunk (dropout);
2. the loss is computed on those embeddings (made leaves that require grad) and back-propagated to
   them only;
3. :func:`backward_cached` re-encodes chunk by chunk *with* grad, replaying each chunk's RNG state so
   dropout masks match exactly, and back-propagates the cached embedding gradient.

The parameter gradients equal plain full back-propagation (tested).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass

import torch
from torch import Tensor


@dataclass(frozen=True)
class RngState:
    """CPU and CUDA RNG states, captured before a chunk's no-grad pass and replayed for its grad pass."""

    cpu: Tensor
    cuda: tuple[Tensor, ...]

    @classmethod
    def capture(cls, device: torch.device) -> "RngState":
        cuda = tuple(torch.cuda.get_rng_state_all()) if device.type == "cuda" else ()
        return cls(torch.get_rng_state(), cuda)

    @contextlib.contextmanager
    def replay(self, device: torch.device) -> Iterator[None]:
        devices = list(range(torch.cuda.device_count())) if self.cuda else []
        with torch.random.fork_rng(devices=devices, enabled=True):
            torch.set_rng_state(self.cpu)
            if self.cuda:
                torch.cuda.set_rng_state_all(list(self.cuda))
            yield


def model_device(model: torch.nn.Module) -> torch.device:
    return next(model.parameters()).device


def autocast(device: torch.device, amp: str) -> contextlib.AbstractContextManager:
    """bf16 autocast on CUDA when ``amp == "bf16"``; a no-op elsewhere (CPU trains in float32)."""
    if device.type == "cuda" and amp == "bf16":
        return torch.autocast("cuda", dtype=torch.bfloat16)
    return contextlib.nullcontext()


def encode(
    model: torch.nn.Module,
    texts: Sequence[str],
    *,
    task: str,
    max_length: int,
    amp: str = "off",
    forward: Callable | None = None,
) -> Tensor:
    """``(len(texts), d)`` float32 embeddings; differentiable unless called under ``no_grad``.

    Args:
        model: a ``SentenceTransformer`` (plain or with a query/document ``Router``).
        texts: the inputs.
        task: ``"query"`` or ``"document"`` (routes asymmetric models; ignored by symmetric ones).
        max_length: truncate inputs to this many tokens.
        amp: ``"bf16"`` autocast on CUDA, ``"off"`` otherwise.
        forward: the callable to run the features through (e.g. a DDP wrapper of ``model``);
            defaults to ``model`` itself.
    """
    from sentence_transformers.util import batch_to_device

    device = model_device(model)
    features = model.preprocess(list(texts), task=task, max_length=max_length)
    features = batch_to_device(features, device)
    with autocast(device, amp):
        out = (forward or model)(features, task=task)
    return out["sentence_embedding"].float()


def chunks(n: int, size: int) -> list[slice]:
    return [slice(i, min(i + size, n)) for i in range(0, n, size)]


@torch.no_grad()
def encode_chunks(model: torch.nn.Module, texts: Sequence[str], *, chunk_size: int, task: str, max_length: int,
                  amp: str = "off") -> Tensor:
    """Encode ``texts`` without gradient, ``chunk_size`` at a time (bounded activation memory)."""
    return torch.cat([encode(model, texts[sl], task=task, max_length=max_length, amp=amp)
                      for sl in chunks(len(texts), chunk_size)])


def encode_cached(
    model: torch.nn.Module,
    texts: Sequence[str],
    *,
    chunk_size: int,
    task: str,
    max_length: int,
    amp: str = "off",
    forward: Callable | None = None,
) -> tuple[Tensor, list[RngState]]:
    """Step 1 of cached-gradient chunking: encode without grad, keep each chunk's RNG state.

    Returns:
        ``(embeddings (len(texts), d), rng states)``; embeddings are a fresh leaf tensor that
        requires grad, ready for the loss.
    """
    device = model_device(model)
    states, parts = [], []
    with torch.no_grad():
        for sl in chunks(len(texts), chunk_size):
            states.append(RngState.capture(device))
            parts.append(encode(model, texts[sl], task=task, max_length=max_length, amp=amp, forward=forward))
    return torch.cat(parts).requires_grad_(True), states


def backward_cached(
    model: torch.nn.Module,
    texts: Sequence[str],
    grad: Tensor,
    states: list[RngState],
    *,
    chunk_size: int,
    task: str,
    max_length: int,
    amp: str = "off",
    forward: Callable | None = None,
    no_sync: Callable[[], contextlib.AbstractContextManager] | None = None,
) -> None:
    """Step 3: re-encode each chunk with grad (replaying its RNG state) and back-propagate ``grad``.

    Args:
        grad: ``(len(texts), d)`` gradient of the loss with respect to the cached embeddings.
        states: the RNG states returned by :func:`encode_cached` for the same chunking.
        no_sync: context for every chunk but the last (DDP's ``no_sync``: accumulate locally);
            the last chunk's backward then all-reduces the accumulated gradients once.
    """
    device = model_device(model)
    slices = chunks(len(texts), chunk_size)
    if len(slices) != len(states):
        raise ValueError("backward_cached needs the chunking used by encode_cached")
    for i, (sl, state) in enumerate(zip(slices, states)):
        last = i == len(slices) - 1
        ctx = no_sync() if (no_sync is not None and not last) else contextlib.nullcontext()
        with ctx, state.replay(device):
            emb = encode(model, texts[sl], task=task, max_length=max_length, amp=amp, forward=forward)
            emb.backward(grad[sl])
