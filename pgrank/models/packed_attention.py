"""Attention over a packed chunk: the texts' tokens one after the other in one row, each text attending to itself.

Registered with transformers' ``AttentionInterface`` as :data:`PACKED` (:func:`register`), so a BERT or DistilBERT
model switched to it (:func:`pgrank.models.packing.enable_packing`) runs it in every layer. On CUDA, without
attention dropout, in half precision, it is FlashAttention's variable-length kernel
(``torch.nn.attention.varlen.varlen_attn``); otherwise the chunk's keys, queries and values are laid into a
``(texts, longest)`` grid by one precomputed index (:class:`PadIndex`) and run through
``scaled_dot_product_attention`` with a key mask. Either way it costs a fixed number of operations per layer,
whatever the number of texts.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

PACKED = "pgrank_packed"
PACKED_LAYOUT = "pgrank_pad"  # the features key of a packed chunk's attention layout (PadIndex)


@dataclass(frozen=True)
class PadIndex:
    """Where each packed token sits in a ``(texts, longest)`` grid: one chunk's attention layout, made once."""

    flat: Tensor  # (T,) long: text * longest + position
    keep: Tensor  # (texts, 1, 1, longest) bool: the grid's real keys
    cu: Tensor  # (texts + 1,) int32 cumulative lengths
    texts: int
    longest: int


def packed_attention(module, query: Tensor, key: Tensor, value: Tensor, attention_mask, dropout: float = 0.0,
                     scaling: float | None = None, is_causal=None, **kwargs):
    """Attention over a packed chunk (``query``: ``(1, heads, T, head_dim)``; the output's ``T`` tokens in order, the
    caller reshaping it to ``(1, T, hidden)``); any other call goes to the model's own attention
    (``module.config._pgrank_fallback``)."""
    from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

    pad: PadIndex | None = kwargs.pop(PACKED_LAYOUT, None)
    if pad is None:
        name = getattr(module.config, "_pgrank_fallback", "sdpa")
        fallback = ALL_ATTENTION_FUNCTIONS[name] if name in ALL_ATTENTION_FUNCTIONS else ALL_ATTENTION_FUNCTIONS["sdpa"]
        return fallback(module, query, key, value, attention_mask, dropout=dropout, scaling=scaling,
                        is_causal=is_causal, **kwargs)
    heads, width = query.shape[1], query.shape[3]
    out = attend_tokens(query[0].transpose(0, 1), key[0].transpose(0, 1), value[0].transpose(0, 1), pad,
                        dropout=dropout, scaling=scaling)
    return out.view(-1, heads, width), None  # (T, heads, head_dim): the caller's reshape to (1, T, hidden) is a view


def attend_tokens(query: Tensor, key: Tensor, value: Tensor, pad: PadIndex, *, dropout: float = 0.0,
                  scaling: float | None = None) -> Tensor:
    """Attention over a packed chunk whose ``query``, ``key`` and ``value`` are ``(T, heads, head_dim)`` (views of the
    projections' ``(T, hidden)`` outputs); the output ``(T, heads * head_dim)``, the tokens in order.

    The same operations whatever the number of texts: FlashAttention's variable-length kernel on CUDA (half
    precision, no attention dropout), otherwise one grid of the three laid out by one ``index_copy_`` and one
    ``scaled_dot_product_attention`` with a key mask.
    """
    tokens, heads, width = query.shape
    if query.is_cuda and dropout == 0.0 and query.dtype in (torch.float16, torch.bfloat16) and _varlen() is not None:
        out = _varlen()(query, key, value, pad.cu, pad.cu, pad.longest, pad.longest, scale=scaling)
        return out.reshape(tokens, heads * width)
    qkv = torch.stack((query, key, value))  # (3, T, heads, head_dim)
    grid = qkv.new_zeros(3, pad.texts * pad.longest, heads, width).index_copy_(1, pad.flat, qkv)
    q, k, v = grid.view(3, pad.texts, pad.longest, heads, width).transpose(2, 3).unbind(0)  # (texts, heads, ...)
    out = torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=pad.keep, dropout_p=dropout, scale=scaling)
    return out.transpose(1, 2).reshape(pad.texts * pad.longest, heads * width).index_select(0, pad.flat)


def _varlen():
    try:
        from torch.nn.attention.varlen import varlen_attn
    except ImportError:
        return None
    return varlen_attn


def register() -> None:
    """Register :func:`packed_attention` (and SDPA's mask) with transformers under :data:`PACKED`."""
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

    AttentionInterface.register(PACKED, packed_attention)
    AttentionMaskInterface.register(PACKED, sdpa_mask)
