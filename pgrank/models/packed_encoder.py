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

Compiled regions (:func:`compile_regions`, ``train.compile_layers``): what follows each layer's attention (the output
projection, dropout, residual and LayerNorm, the feed-forward with its activation, dropout, residual and LayerNorm)
is one function, :func:`_distilbert_tail` or :func:`_bert_tail`, that ``torch.compile`` compiles once for every layer
(the layer is an argument, its weights the graph's inputs) with the chunk's token count dynamic
(``torch._dynamo.maybe_mark_dynamic``), so inductor fuses the bias, activation, dropout, residual and LayerNorm
kernels whatever the chunk. Attention stays outside the compiled regions: its kernels are fused already. Compiled
and eager layers agree to float rounding, embeddings and gradients (tested on the CPU with inductor); dropout draws
its masks from inductor's generator, not eager's.
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
    auto_model.__dict__.pop(_COMPILE_FLAG, None)


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


def compile_regions(auto_model, on: bool = True) -> bool:
    """Run ``auto_model``'s packed layers' tails compiled (``on``) or eager; returns whether they now run compiled
    (only a model with the packed forward, :func:`installed`, has them)."""
    on = bool(on) and installed(auto_model)
    auto_model.__dict__[_COMPILE_FLAG] = on
    return on


def compiles(auto_model) -> bool:
    return bool(auto_model.__dict__.get(_COMPILE_FLAG, False))


_COMPILE_FLAG = "_pgrank_compiled"
_COMPILED: dict = {}  # eager tail -> its torch.compile wrapper, shared by every model (Dynamo caches per code object)


def _tail(model, fn):
    """``fn`` (a layer's tail), or its compiled wrapper with the token count of its inputs dynamic."""
    if not compiles(model):
        return fn
    compiled = _COMPILED.get(fn)
    if compiled is None:
        compiled = _COMPILED[fn] = torch.compile(fn)

    def run(layer, h: Tensor, x: Tensor) -> Tensor:
        torch._dynamo.maybe_mark_dynamic(h, 0)
        torch._dynamo.maybe_mark_dynamic(x, 0)
        return compiled(layer, h, x)

    return run


def _distilbert(model, ids: Tensor, positions: Tensor, pad) -> Tensor:
    embeddings = model.embeddings
    x = embeddings.word_embeddings(ids) + embeddings.position_embeddings(positions)
    x = _dropout(embeddings.dropout, _norm(embeddings.LayerNorm, x))
    tail = _tail(model, _distilbert_tail)
    for layer in model.transformer.layer:
        attention = layer.attention
        x = tail(layer, _attend(attention, x, attention.q_lin, attention.k_lin, attention.v_lin, pad), x)
    return x


def _distilbert_tail(layer, h: Tensor, x: Tensor) -> Tensor:
    """A DistilBERT layer after its attention ``h``: output projection, residual, LayerNorm, feed-forward, dropout,
    residual, LayerNorm."""
    x = _norm(layer.sa_layer_norm, _linear(layer.attention.out_lin, h) + x)
    ffn = layer.ffn
    y = _dropout(ffn.dropout, _linear(ffn.lin2, ffn.activation(_linear(ffn.lin1, x))))
    return _norm(layer.output_layer_norm, y + x)


def _bert(model, ids: Tensor, positions: Tensor, token_types: Tensor | None, pad) -> Tensor:
    embeddings = model.embeddings
    if token_types is None:
        token_types = torch.zeros_like(ids)  # transformers' buffered token types: zeros
    x = embeddings.word_embeddings(ids) + embeddings.token_type_embeddings(token_types)
    x = x + embeddings.position_embeddings(positions)
    x = _dropout(embeddings.dropout, _norm(embeddings.LayerNorm, x))
    tail = _tail(model, _bert_tail)
    for layer in model.encoder.layer:
        attention = layer.attention.self
        x = tail(layer, _attend(attention, x, attention.query, attention.key, attention.value, pad), x)
    return x


def _bert_tail(layer, h: Tensor, x: Tensor) -> Tensor:
    """A BERT layer after its attention ``h``: output projection, dropout, residual, LayerNorm, feed-forward,
    dropout, residual, LayerNorm."""
    out = layer.attention.output
    x = _norm(out.LayerNorm, _dropout(out.dropout, _linear(out.dense, h)) + x)
    inner, out = layer.intermediate, layer.output
    y = inner.intermediate_act_fn(_linear(inner.dense, x))
    return _norm(out.LayerNorm, _dropout(out.dropout, _linear(out.dense, y)) + x)


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
