"""A packed chunk through BERT or DistilBERT: transformers' own operations, without its module plumbing.

A packed chunk (:mod:`pgrank.models.packing`) runs the same operations whatever its number of texts, so what it
costs the host is what issuing them costs. Through transformers' modules each layer adds module calls, keyword
plumbing through the attention interface and output capture, and a signature inspection per feed-forward call,
about as much again as the operations themselves (``python bench/step_overhead.py``, the twin step).

:func:`install` gives a BERT or DistilBERT model (``auto_model`` of a sentence-transformers ``Transformer``) a
forward that, for a packed chunk, computes what transformers' modules compute, in the same order, on the same
weights, on the chunk's ``(T, hidden)`` tokens (no batch dimension to fold in and out around every projection):
the embeddings, then per layer the query, key and value projections and their attention
(:func:`~pgrank.models.packed_attention.attend_tokens`), the output projection, dropout, residual and LayerNorm,
the feed-forward (the model's own activation) and its dropout, residual and LayerNorm. The embeddings, the dropout
masks (the same random draws in the same order) and the gradients are bitwise those of the modules' forward
(tested, in training mode with dropout). BERT's pooler is left out: sentence-transformers pools the token
embeddings and never reads its output. Anything else (a padded batch, hidden states or attentions asked for, a
chunked feed-forward, a decoder) goes to transformers' forward.
"""

from __future__ import annotations

import types

import torch
from torch import Tensor
from torch.nn import functional as F

from pgrank.models.packed_attention import PACKED_LAYOUT, attend_tokens

ARCHITECTURES = ("bert", "distilbert")


def supported(auto_model) -> bool:
    """Whether :func:`install` applies to ``auto_model``: BERT or DistilBERT with absolute positions, an encoder,
    and an unchunked feed-forward."""
    config = auto_model.config
    return (config.model_type in ARCHITECTURES and not getattr(config, "chunk_size_feed_forward", 0)
            and not getattr(config, "is_decoder", False)
            and getattr(config, "position_embedding_type", "absolute") == "absolute")


def install(auto_model) -> bool:
    """Give ``auto_model`` the packed forward (:func:`forward`) when it is :func:`supported`; returns whether it
    now has it. The forward is bound to the instance, so a deep copy of the model gets its own."""
    if not supported(auto_model):
        return False
    auto_model.forward = types.MethodType(forward, auto_model)
    return True


def uninstall(auto_model) -> None:
    """Back to transformers' forward."""
    auto_model.__dict__.pop("forward", None)


def installed(auto_model) -> bool:
    return "forward" in auto_model.__dict__


def forward(self, **kwargs):
    """A packed chunk's ``last_hidden_state`` ``(1, T, hidden)``; any other call goes to transformers' forward."""
    from transformers.modeling_outputs import BaseModelOutput

    pad = kwargs.get(PACKED_LAYOUT)
    if (pad is None or kwargs.get("input_ids") is None or kwargs.get("inputs_embeds") is not None
            or kwargs.get("output_hidden_states") or kwargs.get("output_attentions")
            or self.config.output_hidden_states or self.config.output_attentions):
        return type(self).forward(self, **kwargs)
    ids, positions = kwargs["input_ids"][0], kwargs["position_ids"][0]  # (T,): the chunk's one row
    if self.config.model_type == "distilbert":
        hidden = _distilbert(self, ids, positions, pad)
    else:
        types = kwargs.get("token_type_ids")
        hidden = _bert(self, ids, positions, None if types is None else types[0], pad)
    return BaseModelOutput(last_hidden_state=hidden.unsqueeze(0))


def _distilbert(model, ids: Tensor, positions: Tensor, pad) -> Tensor:
    embeddings = model.embeddings
    x = embeddings.word_embeddings(ids) + embeddings.position_embeddings(positions)
    x = _dropout(embeddings.dropout, _norm(embeddings.LayerNorm, x))
    for layer in model.transformer.layer:
        attention = layer.attention
        h = _attend(attention, x, attention.q_lin, attention.k_lin, attention.v_lin, pad)
        x = _norm(layer.sa_layer_norm, _linear(attention.out_lin, h) + x)
        ffn = layer.ffn
        y = _dropout(ffn.dropout, _linear(ffn.lin2, ffn.activation(_linear(ffn.lin1, x))))
        x = _norm(layer.output_layer_norm, y + x)
    return x


def _bert(model, ids: Tensor, positions: Tensor, token_types: Tensor | None, pad) -> Tensor:
    embeddings = model.embeddings
    if token_types is None:
        token_types = torch.zeros_like(ids)  # transformers' buffered token types: zeros
    x = embeddings.word_embeddings(ids) + embeddings.token_type_embeddings(token_types)
    x = x + embeddings.position_embeddings(positions)
    x = _dropout(embeddings.dropout, _norm(embeddings.LayerNorm, x))
    for layer in model.encoder.layer:
        attention, out = layer.attention.self, layer.attention.output
        h = _attend(attention, x, attention.query, attention.key, attention.value, pad)
        x = _norm(out.LayerNorm, _dropout(out.dropout, _linear(out.dense, h)) + x)
        inner, out = layer.intermediate, layer.output
        y = inner.intermediate_act_fn(_linear(inner.dense, x))
        x = _norm(out.LayerNorm, _dropout(out.dropout, _linear(out.dense, y)) + x)
    return x


def _attend(module, x: Tensor, query, key, value, pad) -> Tensor:
    """Self-attention of the packed ``x`` ``(T, hidden)`` as transformers' attention modules compute it."""
    heads = (x.shape[0], -1, module.attention_head_size)
    return attend_tokens(_linear(query, x).view(heads), _linear(key, x).view(heads), _linear(value, x).view(heads),
                         pad, dropout=module.dropout.p if module.training else 0.0, scaling=module.scaling)


def _linear(layer, x: Tensor) -> Tensor:
    return F.linear(x, layer.weight, layer.bias)


def _norm(layer, x: Tensor) -> Tensor:
    return F.layer_norm(x, layer.normalized_shape, layer.weight, layer.bias, layer.eps)


def _dropout(layer, x: Tensor) -> Tensor:
    return F.dropout(x, layer.p, layer.training, layer.inplace)
