"""A packed chunk through BERT or DistilBERT without transformers' module plumbing (pgrank.models.packed_encoder)."""

from __future__ import annotations

import copy

import numpy as np
import pytest
import torch

from pgrank.data.token_store import TokenRows, tokenize
from pgrank.models import packed_encoder
from pgrank.models.packing import chunk_features, enable_packing, run_features

TEXTS = [("rivers and deltas " * (1 + i % 7)).strip() + f" number {i}" for i in range(30)]


def _packed(path):
    from sentence_transformers import SentenceTransformer

    model = SentenceTransformer(str(path), device="cpu")
    ids, lengths, layout = tokenize(model, TEXTS, task="document", max_length=64)
    rows = TokenRows(ids, lengths)
    assert enable_packing(model, rows.take(np.arange(4)), layout)
    return model, rows, layout


def _embeddings_and_gradients(model, features, seed: int = 5):
    params = [p for p in model.parameters() if p.requires_grad]
    torch.manual_seed(seed)  # the dropout masks
    emb = run_features(model, features, task="document")
    return emb, torch.autograd.grad(emb.square().sum(), params, allow_unused=True)


@pytest.mark.parametrize("kind", ["bert", "distilbert"])
def test_a_packed_chunk_trains_bitwise_as_through_transformers_modules(kind, tiny_model_dir, paper_model):
    model, rows, layout = _packed(tiny_model_dir if kind == "bert" else paper_model("sbert"))
    auto_model = model[0].auto_model
    assert auto_model.config.model_type == kind and packed_encoder.installed(auto_model)
    features = chunk_features(rows, layout, packed=True)
    model.train()  # dropout on: the masks must be drawn alike
    lean = _embeddings_and_gradients(model, features)
    packed_encoder.uninstall(auto_model)
    plain = _embeddings_and_gradients(model, features)
    assert torch.equal(lean[0], plain[0])
    assert all((a is None) == (b is None) and (a is None or torch.equal(a, b)) for a, b in zip(lean[1], plain[1]))
    assert sum(g is not None for g in lean[1]) > 10
    with torch.no_grad():  # another seed, other masks: the comparison above is not vacuous
        torch.manual_seed(6)
        assert not torch.equal(run_features(model, features, task="document"), plain[0])


def test_a_padded_batch_and_a_deep_copy_keep_their_own_forward(tiny_model_dir):
    model, rows, layout = _packed(tiny_model_dir)
    padded = chunk_features(rows, layout, packed=False)
    with torch.no_grad():
        expected = torch.as_tensor(model.encode(TEXTS))
        assert torch.allclose(run_features(model, padded, task="document"), expected, atol=1e-5)
        twin = copy.deepcopy(model)
        assert twin[0].auto_model.forward.__self__ is twin[0].auto_model
        for p in twin.parameters():
            p.mul_(0.5)
        packed = chunk_features(rows, layout, packed=True)
        assert torch.allclose(run_features(model, packed, task="document"), expected, atol=1e-5)
        assert not torch.allclose(run_features(twin, packed, task="document"), expected, atol=1e-3)


def test_a_chunked_feed_forward_stays_with_transformers(tiny_model_dir):
    from sentence_transformers import SentenceTransformer

    auto_model = SentenceTransformer(str(tiny_model_dir), device="cpu")[0].auto_model
    auto_model.config.chunk_size_feed_forward = 4
    assert not packed_encoder.install(auto_model) and not packed_encoder.installed(auto_model)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="a CUDA device is needed")
def test_on_cuda_in_bf16_a_packed_chunk_encodes_bitwise_as_through_transformers_modules(paper_model):
    from pgrank.models.packing import autocast

    model, rows, layout = _packed(paper_model("sbert"))
    model.to("cuda").eval()
    auto_model = model[0].auto_model
    features = chunk_features(rows, layout, packed=True, device="cuda")
    out = {}
    for lean in (True, False):
        if not lean:
            packed_encoder.uninstall(auto_model)
        params = [p for p in model.parameters() if p.requires_grad]
        with autocast(torch.device("cuda"), "bf16"):
            emb = run_features(model, features, task="document")  # eval mode: FlashAttention's varlen kernel
        grads = torch.autograd.grad(emb.square().sum(), params, allow_unused=True)
        out[lean] = emb, torch.cat([g.float().flatten() for g in grads if g is not None])
    assert torch.equal(out[True][0], out[False][0])
    a, b = out[True][1], out[False][1]
    assert float(a @ b / (a.norm() * b.norm())) > 0.9999  # CUDA's embedding backward adds in any order


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="a CUDA device is needed")
def test_on_cuda_in_bf16_a_packed_chunk_encodes_as_the_padded_batch_does(paper_model):
    from pgrank.models.packing import autocast

    model, rows, layout = _packed(paper_model("sbert"))
    model.to("cuda").eval()
    out = {}
    with torch.no_grad(), autocast(torch.device("cuda"), "bf16"):
        for packed in (True, False):  # FlashAttention's varlen kernel over the packed row; SDPA over the padded grid
            features = chunk_features(rows, layout, packed=packed, device="cuda")
            out[packed] = run_features(model, features, task="document")
    assert out[True].shape == out[False].shape == (len(TEXTS), out[False].shape[1])
    cosine = torch.nn.functional.cosine_similarity(out[True], out[False], dim=1)
    assert float(cosine.min()) > 0.999  # bf16's rounding, text by text


def test_compiled_layers_agree_with_eager_ones(tiny_model_dir):
    """train.compile_layers: the layers' tails compiled by inductor, the token count dynamic (two chunk sizes, one
    compile), against the eager layers: embeddings to 1e-5 and gradients to 1e-4 in float32."""
    from torch._inductor import config as inductor

    from pgrank.models.packing import compile_layers

    model, rows, layout = _packed(tiny_model_dir)
    model.eval()  # dropout off: inductor draws its own masks
    chunks = [chunk_features(rows.take(np.arange(lo, hi)), layout, packed=True) for lo, hi in ((0, 30), (5, 17))]
    eager = [_embeddings_and_gradients(model, f) for f in chunks]
    assert compile_layers(model)
    torch._dynamo.reset()
    with inductor.patch(compile_threads=1):  # no pool of compile workers to start on a small CPU
        compiled = [_embeddings_and_gradients(model, f) for f in chunks]
        with torch.no_grad():
            forward_only = run_features(model, chunks[0], task="document")
    for (emb, grads), (emb_c, grads_c) in zip(eager, compiled):
        torch.testing.assert_close(emb_c, emb, atol=1e-5, rtol=1e-5)
        for a, b in zip(grads_c, grads):
            assert (a is None) == (b is None)
            if a is not None:
                torch.testing.assert_close(a, b, atol=1e-4, rtol=1e-4)
    torch.testing.assert_close(forward_only, eager[0][0], atol=1e-5, rtol=1e-5)
    assert not compile_layers(model, False)
    assert torch.equal(_embeddings_and_gradients(model, chunks[0])[0], eager[0][0])  # eager again, bitwise
