"""Attention over a packed chunk: the texts' tokens one after the other in one row, each text attending to itself.

Registered with transformers' ``AttentionInterface`` as :data:`PACKED` (:func:`register`), so a BERT or DistilBERT
model switched to it (:func:`pgrank.models.packing.enable_packing`) runs it in every layer. One of three kernels
(:data:`KERNELS`, chosen per call by :func:`kernel_for`), none of which sees padding on CUDA:

``varlen``  CUDA, half precision, no attention dropout (inference, frozen towers): FlashAttention's
            variable-length kernel (``torch.nn.attention.varlen.varlen_attn``) on the packed tokens.
``jagged``  CUDA otherwise (training, where attention dropout is on: ``varlen_attn`` takes no dropout): the
            packed tokens viewed as a nested jagged tensor (``torch.nested.nested_tensor_from_jagged``, the
            chunk's cumulative lengths as offsets, no copy) through ``scaled_dot_product_attention``, whose
            FlashAttention backend takes dropout on jagged inputs (memory-efficient attention in float32).
``grid``    the CPU: the chunk's keys, queries and values laid into a ``(texts, longest)`` grid by one
            precomputed index (:class:`PadIndex`) and run through ``scaled_dot_product_attention`` with a key
            mask. (On a CPU, SDPA of jagged tensors runs its math backend text by text:
            ``python bench/step_overhead.py --attention`` measures both.)

Each costs a fixed number of operations per layer, whatever the number of texts, and the three compute the same
attention (tested against each other on the CPU, outputs and gradients, and the jagged kernel's dropout for its
rate and mean).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

PACKED = "pgrank_packed"
PACKED_LAYOUT = "pgrank_pad"  # the features key of a packed chunk's attention layout (PadIndex)


@dataclass(frozen=True)
class PadIndex:
    """One chunk's attention layout, made once on the host: where each packed token sits in a ``(texts, longest)``
    grid (the CPU's kernel) and the texts' cumulative lengths (the CUDA kernels')."""

    flat: Tensor  # (T,) long: text * longest + position
    keep: Tensor  # (texts, 1, 1, longest) bool: the grid's real keys
    cu: Tensor  # (texts + 1,) int32 cumulative lengths
    texts: int
    longest: int
    shortest: int = 1


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
                  scaling: float | None = None, kernel: str | None = None) -> Tensor:
    """Attention over a packed chunk whose ``query``, ``key`` and ``value`` are ``(T, heads, head_dim)`` (views of the
    projections' ``(T, hidden)`` outputs); the output ``(T, heads * head_dim)``, the tokens in order.

    Args:
        kernel: one of :data:`KERNELS` (default: :func:`kernel_for` the inputs and the dropout).
    """
    return KERNELS[kernel or kernel_for(query, dropout)](query, key, value, pad, dropout, scaling)


def kernel_for(query: Tensor, dropout: float) -> str:
    """The kernel of :data:`KERNELS` a packed chunk's attention runs (see the module docstring)."""
    if not query.is_cuda:
        return "grid"
    if dropout == 0.0 and query.dtype in (torch.float16, torch.bfloat16) and _varlen() is not None:
        return "varlen"
    return "jagged"


def _varlen_kernel(query: Tensor, key: Tensor, value: Tensor, pad: PadIndex, dropout: float, scaling) -> Tensor:
    if dropout:
        raise ValueError("varlen_attn takes no attention dropout: use the jagged kernel")
    tokens, heads, width = query.shape
    out = _varlen()(query, key, value, pad.cu, pad.cu, pad.longest, pad.longest, scale=scaling)
    return out.reshape(tokens, heads * width)


def _jagged_kernel(query: Tensor, key: Tensor, value: Tensor, pad: PadIndex, dropout: float, scaling) -> Tensor:
    """The packed tokens as ``(texts, heads, {length}, head_dim)`` jagged views (no copy) through SDPA. The
    chunk's shortest and longest lengths come from the host, so no backend reads them from the device."""
    from torch.nested import nested_tensor_from_jagged

    tokens, heads, width = query.shape

    def jagged(x: Tensor) -> Tensor:
        return nested_tensor_from_jagged(x, pad.cu, min_seqlen=pad.shortest, max_seqlen=pad.longest).transpose(1, 2)

    out = torch.nn.functional.scaled_dot_product_attention(jagged(query), jagged(key), jagged(value),
                                                           dropout_p=dropout, scale=scaling)
    return out.transpose(1, 2).values().reshape(tokens, heads * width)


def _grid_kernel(query: Tensor, key: Tensor, value: Tensor, pad: PadIndex, dropout: float, scaling) -> Tensor:
    """One grid of the three laid out by one ``index_copy_``, one masked SDPA, the real tokens read back."""
    tokens, heads, width = query.shape
    qkv = torch.stack((query, key, value))  # (3, T, heads, head_dim)
    grid = qkv.new_zeros(3, pad.texts * pad.longest, heads, width).index_copy_(1, pad.flat, qkv)
    q, k, v = grid.view(3, pad.texts, pad.longest, heads, width).transpose(2, 3).unbind(0)  # (texts, heads, ...)
    out = torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=pad.keep, dropout_p=dropout, scale=scaling)
    return out.transpose(1, 2).reshape(pad.texts * pad.longest, heads * width).index_select(0, pad.flat)


KERNELS = {"varlen": _varlen_kernel, "jagged": _jagged_kernel, "grid": _grid_kernel}


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
