"""Pre-tokenized texts into a model: length-sorted chunks cut by a token budget, packed without padding.

The one data path from a token store (:mod:`pgrank.data.token_store`) to a sentence-transformers model, for
training (:mod:`pgrank.training.grad_cache`) as for encoding a corpus:

1. :func:`plan_chunks` sorts the texts by length (longest first) and cuts them into chunks whose size times
   longest text is at most ``budget`` (``train.chunk_tokens``); the caller scatters each chunk's embeddings back
   to the texts' own order.
2. :func:`chunk_features` lays a chunk out for the model, on the host, into pinned memory, copied without
   blocking. *Packed* (:func:`enable_packing`): the chunk's tokens one after the other in one ``(1, T)``
   row with per-text position ids and sentence-transformers' flattened keys (``cu_seq_lens_q``), so the
   linear layers, which hold almost all of the arithmetic, see no padding at all and ``Pooling`` pools each
   text's span (its ``_forward_flattened``). *Padded*: ``preprocess``'s own layout (right-padded ids and an
   attention mask), which length sorting keeps nearly free of padding; models that cannot pack use it.
3. Attention of a packed chunk (:func:`pgrank.models.packed_attention.packed_attention`, registered with
   transformers' ``AttentionInterface``): on CUDA without padding, FlashAttention's variable-length kernel
   (``torch.nn.attention.varlen.varlen_attn``) without attention dropout, the tokens as nested jagged tensors
   through ``scaled_dot_product_attention`` with it (training); on a CPU the chunk's keys, queries and values are
   laid into a ``(texts, longest)`` grid by one precomputed index and run through ``scaled_dot_product_attention``
   with a key mask. Each costs a fixed number of operations per layer, whatever the number of texts.

Packing applies to encoders with absolute, per-text position ids (BERT, DistilBERT, MiniLM); each is checked on
a probe against the padded layout when packing is enabled, and a model that differs (or any other
architecture, T5 with its relative position buckets among them) runs padded. A chunk of packed tokens
and a padded one give the same embeddings to float rounding (tested). A packed chunk skips transformers' module
plumbing (:mod:`pgrank.models.packed_encoder`: the same operations, issued directly).
"""

from __future__ import annotations

import contextlib
import logging
from dataclasses import dataclass

import numpy as np
import torch
from torch import Tensor

from pgrank.data.token_store import TokenRows, TokenStore, text_modules
from pgrank.errors import PgrankError
from pgrank.models import packed_encoder
from pgrank.models.packed_attention import PACKED, PACKED_LAYOUT, PadIndex, register

_PACKABLE = {"bert", "distilbert"}  # absolute position ids per text, attention through transformers' interface
_FLAG = "_pgrank_packing"
_OFF = "_pgrank_packing_off"  # why a model whose architecture packs runs padded (the probe's finding)
PROBE_TEXTS = 8  # texts a model's packed layout is checked against the padded one on
PROBE_COSINE = 0.999  # half-precision weights: the least cosine of a probe text's packed and padded embeddings (the
# CUDA tests' bound in bf16); float32 ones agree to 1e-4

log = logging.getLogger(__name__)


class PackingError(PgrankError):
    """A chunk budget that cannot hold a text."""


def packs(model) -> bool:
    """Whether :func:`enable_packing` switched ``model`` to packed chunks."""
    return bool(getattr(model, _FLAG, False))


def packing_off(model) -> str | None:
    """Why ``model``, whose architecture packs, runs padded: its probe's finding (:func:`enable_packing`); else
    ``None`` (it packs, or its architecture never does)."""
    return getattr(model, _OFF, None)


def enable_packing(model, probe: TokenRows, layout: dict) -> bool:
    """Switch ``model``'s attention to :func:`packed_attention` when its architecture packs, and keep it only if a
    packed probe encodes like the padded layout (eval mode, in the model's own dtype: to 1e-4 in float32, every
    text's cosine above :data:`PROBE_COSINE` in half precision). Returns whether the model now packs; when the probe switches packing off, the log says
    so once, and :func:`packing_off` says why.

    Raises:
        PgrankError: on CUDA, a torch below pgrank's floor (:mod:`pgrank.torch_floor`).
    """
    if hasattr(model, _FLAG):
        return packs(model)
    modules = text_modules(model)
    ok = bool(modules) and all(m.auto_model.config.model_type in _PACKABLE for m in modules)
    if ok:
        if next(model.parameters()).device.type == "cuda":
            from pgrank import torch_floor

            torch_floor.require(signature=True)
        register()
        previous = [m.auto_model.config._attn_implementation for m in modules]
        try:
            for m, name in zip(modules, previous):
                m.auto_model.config._pgrank_fallback = name
                m.auto_model.set_attn_implementation(PACKED)
                packed_encoder.install(m.auto_model)
            off = _probe(model, probe, layout)
        except (ValueError, TypeError, RuntimeError, KeyError, AttributeError) as err:
            off = f"the packed probe failed ({type(err).__name__}: {err})"
        ok = off is None
        if not ok:
            for m, name in zip(modules, previous):
                packed_encoder.uninstall(m.auto_model)
                m.auto_model.set_attn_implementation(name)
            object.__setattr__(model, _OFF, off)
            log.warning("packing is off for %s: %s; its texts run padded", getattr(modules[0].auto_model.config,
                        "_name_or_path", "the model") or "the model", off)
    object.__setattr__(model, _FLAG, ok)
    return ok


def compile_layers(model, on: bool = True) -> bool:
    """Run the packed layers of ``model`` (a model that :func:`packs`) compiled (``train.compile_layers``:
    :func:`pgrank.models.packed_encoder.compile_regions`) or eager; returns whether they now run compiled."""
    modules = text_modules(model) if packs(model) else []
    return bool(modules) and all([packed_encoder.compile_regions(m.auto_model, on) for m in modules])


def enable_packing_for(model, store: TokenStore) -> bool:
    """:func:`enable_packing` with a probe of the first :data:`PROBE_TEXTS` texts of the token store ``model`` will
    read."""
    return enable_packing(model, store.gather(np.arange(min(PROBE_TEXTS, len(store)))), store.features)


def _probe(model, probe: TokenRows, layout: dict) -> str | None:
    """``None`` when the packed probe encodes as the padded layout (float32 weights: to 1e-4; half precision: each
    text's cosine above :data:`PROBE_COSINE`), else how it differs."""
    device = next(model.parameters()).device
    was = model.training
    model.eval()
    try:
        with torch.no_grad():
            a = model(chunk_features(probe, layout, packed=True, device=device))["sentence_embedding"].float()
            b = model(chunk_features(probe, layout, packed=False, device=device))["sentence_embedding"].float()
    finally:
        model.train(was)
    return probe_finding(a, b, half=next(model.parameters()).dtype != torch.float32)


def probe_finding(a: Tensor, b: Tensor, *, half: bool) -> str | None:
    """How a probe's packed embeddings ``a`` differ from its padded ones ``b`` (float32 ``(texts, d)``) beyond the
    rounding of the weights' precision (``half``: bf16 or float16), or ``None`` when they agree."""
    if a.shape != b.shape:
        return f"the packed probe's embeddings have shape {tuple(a.shape)}, the padded layout's {tuple(b.shape)}"
    if not half:  # float32 rounding: to 1e-4
        if not torch.allclose(a, b, atol=1e-4, rtol=1e-3):
            return (f"the packed probe's embeddings differ from the padded layout's by up to "
                    f"{float((a - b).abs().max()):.2e} (float32: at most 1e-4)")
        return None
    cosine = float(torch.nn.functional.cosine_similarity(a, b, dim=1).min())
    if not cosine > PROBE_COSINE:  # half precision's rounding, text by text; NaN fails too
        return (f"the packed probe's embeddings differ from the padded layout's (least cosine {cosine:.6f}, "
                f"{PROBE_COSINE} at least in half precision)")
    return None


# ------------------------------------------------------------------------------------------- chunks


def plan_chunks(lengths: np.ndarray, budget: int, *, max_padding: float | None = None) -> list[np.ndarray]:
    """Positions of the texts, longest first, cut into chunks whose size times longest text is at most ``budget``.

    Sorted by length, a chunk's texts are nearly as long as its longest, so the budget bounds the tokens a chunk
    processes in either layout (packed, its linear layers see only the texts' tokens; attention and a padded
    layout see the grid), and with it the chunk's activation memory. ``max_padding``: a chunk also ends before the
    text that would make its padded grid more than this share padding (a padded layout's bound: T5's encoding).

    Raises:
        PackingError: a text longer than the budget.
    """
    lengths = np.asarray(lengths, dtype=np.int64)
    if not len(lengths):
        return []
    if int(lengths.max()) > budget:
        raise PackingError(f"a text of {int(lengths.max())} tokens does not fit a chunk budget of {budget} tokens")
    order = np.argsort(-lengths, kind="stable")
    ordered = lengths[order]
    cuts, start, n = [], 0, len(order)
    while start < n:
        end = min(n, start + max(1, budget // int(max(ordered[start], 1))))
        if max_padding is not None and end - start > 1:
            # the grid's real share after each text: (sum of lengths so far) / (count x the chunk's longest)
            real = np.cumsum(ordered[start:end]) / (np.arange(1, end - start + 1) * max(int(ordered[start]), 1))
            end = start + int(np.argmin(real >= 1.0 - max_padding)) if not (real >= 1.0 - max_padding).all() else end
        cuts.append((start, end))
        start = end
    return [order[a:b] for a, b in cuts]


def processed_tokens(lengths: np.ndarray, *, packed: bool) -> int:
    """Tokens a chunk of these lengths puts through the model's linear layers."""
    lengths = np.asarray(lengths, dtype=np.int64)
    if not len(lengths):
        return 0
    return int(lengths.sum()) if packed else int(len(lengths) * lengths.max())


def _tensor(array: np.ndarray, device: torch.device) -> Tensor:
    """A host array on ``device``: through pinned memory and a non-blocking copy on CUDA."""
    t = torch.from_numpy(np.ascontiguousarray(array))
    if device.type == "cuda":
        return t.pin_memory().to(device, non_blocking=True)
    return t


def chunk_features(rows: TokenRows, layout: dict, *, packed: bool, device: torch.device | str = "cpu") -> dict:
    """The features dict of one chunk for the model's ``forward``: packed or padded (see the module docstring)."""
    device = torch.device(device)
    lengths = np.asarray(rows.lengths, dtype=np.int64)
    n, total = len(lengths), int(lengths.sum())
    longest = int(lengths.max()) if n else 0
    starts = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64)
    position = np.arange(total, dtype=np.int64) - np.repeat(starts[:-1], lengths)
    features: dict = {}
    if layout.get("bag"):  # an embedding bag (StaticEmbedding): flat ids and each text's first position
        features["input_ids"] = _tensor(rows.ids.astype(np.int64), device)
        features["offsets"] = _tensor(starts[:-1], device)
    elif packed:
        text = np.repeat(np.arange(n, dtype=np.int64), lengths)
        keep = np.arange(longest)[None, :] < lengths[:, None]
        features["input_ids"] = _tensor(rows.ids.astype(np.int64)[None, :], device)
        features["position_ids"] = _tensor(position[None, :], device)
        if "token_type_ids" in layout["keys"]:
            features["token_type_ids"] = torch.zeros(1, total, dtype=torch.long, device=device)
        cu = _tensor(starts.astype(np.int32), device)
        features["cu_seq_lens_q"] = cu
        features["seq_idx"] = _tensor(text[None, :], device)  # Pooling's segments, without a read of the lengths
        features[PACKED_LAYOUT] = PadIndex(_tensor(text * longest + position, device),
                                          _tensor(keep[:, None, None, :], device), cu, n, longest,
                                          int(lengths.min()) if n else 0)
    else:
        ids = np.full((n, longest), layout["pad_id"], dtype=np.int64)
        mask = np.zeros((n, longest), dtype=np.int64)
        text = np.repeat(np.arange(n, dtype=np.int64), lengths)
        column = position if layout.get("padding_side", "right") == "right" else position + np.repeat(longest - lengths, lengths)
        ids[text, column] = rows.ids
        mask[text, column] = 1
        features["input_ids"] = _tensor(ids, device)
        features["attention_mask"] = _tensor(mask, device)
        if "token_type_ids" in layout["keys"]:
            features["token_type_ids"] = torch.zeros(n, longest, dtype=torch.long, device=device)
    if layout.get("prompt_length") is not None:
        features["prompt_length"] = layout["prompt_length"]
    return features


@dataclass(frozen=True)
class Chunk:
    """One chunk of a step's texts: ``positions`` into the texts, and its features on the device."""

    positions: np.ndarray
    index: Tensor  # the positions on the device
    features: dict
    real: int  # tokens of text
    processed: int  # tokens through the linear layers


def chunks_of(rows: TokenRows, layout: dict, budget: int, *, packed: bool, device,
              max_padding: float | None = None) -> list[Chunk]:
    """The chunks of a step's texts (:func:`plan_chunks`, ``max_padding`` of a padded layout), laid out and on
    their way to ``device``.

    Raises:
        PackingError: a text longer than ``budget``.
    """
    out = []
    lengths = np.minimum(rows.lengths, budget) if layout.get("bag") else rows.lengths  # a bag has no length limit
    for positions in plan_chunks(lengths, budget, max_padding=None if packed else max_padding):
        part = rows.take(positions)
        out.append(Chunk(positions, _tensor(positions.astype(np.int64), torch.device(device)),
                         chunk_features(part, layout, packed=packed, device=device),
                         int(part.lengths.sum()), processed_tokens(part.lengths, packed=packed)))
    return out


def autocast(device: torch.device, amp: str) -> contextlib.AbstractContextManager:
    """bf16 autocast on CUDA when ``amp == "bf16"``; a no-op elsewhere (CPU trains in float32)."""
    if device.type == "cuda" and amp == "bf16":
        return torch.autocast("cuda", dtype=torch.bfloat16)
    return contextlib.nullcontext()


def run_features(model, features: dict, *, task: str, amp: str = "off", forward=None) -> Tensor:
    """``(n, d)`` float32 embeddings of laid-out features (:func:`chunk_features`), differentiable unless under
    ``no_grad``; ``forward``: the callable to run them through (a DDP wrapper of ``model``)."""
    device = next(model.parameters()).device
    with autocast(device, amp):
        out = (forward or model)(dict(features), task=task)  # a copy: the modules add their outputs to it
    emb = out["sentence_embedding"]
    return emb if emb.dtype == torch.float32 else emb.float()


def run_chunk(model, chunk: Chunk, *, task: str, amp: str = "off", forward=None) -> Tensor:
    """``(texts in the chunk, d)`` float32 embeddings of one chunk (:func:`run_features` of its features)."""
    return run_features(model, chunk.features, task=task, amp=amp, forward=forward)


def scatter(parts: list[Tensor], chunks: list[Chunk], n: int) -> Tensor:
    """The chunks' embeddings back in the texts' own order, ``(n, d)``."""
    order = torch.cat([c.index for c in chunks]) if len(chunks) > 1 else chunks[0].index
    stacked = torch.cat(parts) if len(parts) > 1 else parts[0]
    return stacked.new_empty(n, stacked.shape[1]).index_copy_(0, order, stacked)


def text_chunks(model, texts: list[str], *, task: str, max_length: int, budget: int) -> list[Chunk]:
    """``texts`` tokenized by ``model``'s ``preprocess`` and laid out as a step lays out its documents (packing
    switched on where the model packs): what measuring a training chunk's rate runs, tokenizing untimed."""
    from pgrank.data.token_store import tokenize

    ids, lengths, layout = tokenize(model, texts, task=task, max_length=max_length)
    rows = TokenRows(ids, lengths)
    enable_packing(model, rows.take(np.arange(min(PROBE_TEXTS, len(rows)))), layout)
    return chunks_of(rows, layout, budget, packed=packs(model), device=next(model.parameters()).device)
