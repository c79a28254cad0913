"""Differentiable encoding with sentence-transformers models, and cached-gradient chunking.

Training needs embeddings *with* gradients, which ``SentenceTransformer.encode`` never gives. This
module runs the model's ``forward`` on pre-tokenized chunks (:mod:`pgrank.models.packing`: length-sorted,
cut by ``train.chunk_tokens``, packed without padding where the model allows), and implements the
cached-gradient trick (GradCache; Gao et al. 2021, as in sentence-transformers' CachedMNRL) that makes
``tower: both`` train over 1000 candidates per query in memory bounded by the chunk budget:

1. :func:`encode_cached` encodes every document without grad, chunk by chunk, remembering the RNG
   state of each chunk (dropout), and scatters the embeddings back to the documents' order;
2. the loss is computed on those embeddings (made leaves that require grad) and back-propagated to
   them only;
3. :func:`backward_cached` re-encodes the same chunks *with* grad, replaying each chunk's RNG state so
   dropout masks match exactly, and back-propagates each chunk's rows of the cached embedding gradient, adding
   each chunk's parameter gradients in one operation (:func:`add_gradients`).

The parameter gradients equal plain full back-propagation (tested). :func:`encode` still takes strings, for
the few texts outside a step (validation queries).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass

import torch
from torch import Tensor

from pgrank.data.token_store import TokenRows, task_prompt
from pgrank.models.packing import Chunk, autocast, chunks_of, packs, run_chunk, scatter


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

    device = model_device(model)  # the task's prompt, as encode_query / encode_document apply it
    features = model.preprocess(list(texts), prompt=task_prompt(model, task), task=task, max_length=max_length)
    features = batch_to_device(features, device)
    with autocast(device, amp):
        out = (forward or model)(features, task=task)
    return out["sentence_embedding"].float()


def token_chunks(model, rows: TokenRows, layout: dict, budget: int) -> list[Chunk]:
    """A step's texts as chunks for ``model`` (packed when it packs), on their way to its device."""
    return chunks_of(rows, layout, budget, packed=packs(model), device=model_device(model))


def encode_tokens(model: torch.nn.Module, chunks: list[Chunk], n: int, *, task: str, amp: str = "off",
                  forward: Callable | None = None) -> Tensor:
    """``(n, d)`` float32 embeddings of the chunks' texts in their own order; differentiable unless under
    ``no_grad``."""
    if not chunks:
        return torch.empty(0, 0, device=model_device(model))
    return scatter([run_chunk(model, c, task=task, amp=amp, forward=forward) for c in chunks], chunks, n)


def encode_cached(
    model: torch.nn.Module,
    chunks: list[Chunk],
    n: int,
    *,
    task: str,
    amp: str = "off",
    forward: Callable | None = None,
) -> tuple[Tensor, list[RngState]]:
    """Step 1 of cached-gradient chunking: encode without grad, keep each chunk's RNG state.

    Returns:
        ``(embeddings (n, d) in the texts' order, rng states)``; embeddings are a fresh leaf tensor that
        requires grad, ready for the loss.
    """
    device = model_device(model)
    states, parts = [], []
    with torch.no_grad():
        for chunk in chunks:
            states.append(RngState.capture(device))
            parts.append(run_chunk(model, chunk, task=task, amp=amp, forward=forward))
    return scatter(parts, chunks, n).requires_grad_(True), states


def backward_cached(
    model: torch.nn.Module,
    chunks: list[Chunk],
    grad: Tensor,
    states: list[RngState],
    *,
    task: str,
    amp: str = "off",
    forward: Callable | None = None,
    no_sync: Callable[[], contextlib.AbstractContextManager] | None = None,
) -> None:
    """Step 3: re-encode each chunk with grad (replaying its RNG state) and back-propagate its rows of ``grad``.

    Args:
        grad: ``(n, d)`` gradient of the loss with respect to the cached embeddings, in the texts' order.
        states: the RNG states returned by :func:`encode_cached` for the same chunks.
        no_sync: context for every chunk but the last (DDP's ``no_sync``: accumulate locally);
            the last chunk's backward then all-reduces the accumulated gradients once.
    """
    device = model_device(model)
    if len(chunks) != len(states):
        raise ValueError("backward_cached needs the chunks encode_cached ran")
    params = [p for p in model.parameters() if p.requires_grad]
    for i, (chunk, state) in enumerate(zip(chunks, states)):
        last = i == len(chunks) - 1
        ctx = no_sync() if (no_sync is not None and not last) else contextlib.nullcontext()
        with ctx, state.replay(device):
            emb = run_chunk(model, chunk, task=task, amp=amp, forward=forward)
            rows = grad.index_select(0, chunk.index)
            if no_sync is not None and last:
                emb.backward(rows)  # DDP all-reduces the accumulated gradients from its hooks on this backward
            else:
                add_gradients(emb, rows, params)


def add_gradients(output: Tensor, grad: Tensor | None, params: list[Tensor], inputs: Sequence[Tensor] = ()) -> tuple:
    """``output.backward(grad)`` for ``params``, whose gradients are added to their ``.grad`` in one operation rather
    than one accumulation each (the same values); returns the gradients of ``inputs`` (leaves outside ``params``,
    which ``.grad`` does not receive). A first gradient is kept as it is when it has its parameter's layout and is
    no other's, as ``backward`` keeps it; otherwise copied. DDP's hooks do not see these gradients: a backward that
    must all-reduce runs ``backward`` itself."""
    grads = torch.autograd.grad(output, [*inputs, *params], grad, allow_unused=True)
    held, new, owned = [], [], set()
    for p, g in zip(params, grads[len(inputs):]):
        if g is None:
            continue
        if p.grad is None:
            if g.stride() != p.stride() or g.data_ptr() in owned:
                g = torch.empty_like(p).copy_(g)
            owned.add(g.data_ptr())
            p.grad = g
        else:
            held.append(p.grad)
            new.append(g)
    if held:
        torch._foreach_add_(held, new)
    return grads[: len(inputs)]
