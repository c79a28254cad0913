"""The packed chunk's attention kernels (pgrank.models.packed_attention): the jagged kernel that trains on CUDA computes
what the CPU's padded grid computes, outputs and gradients, and applies attention dropout."""

from __future__ import annotations

import types
import warnings

import numpy as np
import pytest
import torch

from pgrank.models.packed_attention import KERNELS, PadIndex, attend_tokens, kernel_for

LENGTHS = [9, 1, 4, 7, 7, 2]
HEADS, WIDTH = 3, 8


@pytest.fixture(autouse=True)
def _quiet():
    with warnings.catch_warnings():  # SDPA's math backend on a CPU warns that strided nested tensors are a prototype
        warnings.simplefilter("ignore")
        yield


def _layout(lengths) -> PadIndex:
    from pgrank.data.token_store import TokenRows
    from pgrank.models.packed_attention import PACKED_LAYOUT
    from pgrank.models.packing import chunk_features

    rows = TokenRows(np.arange(sum(lengths), dtype=np.int32), np.asarray(lengths, dtype=np.int64))
    return chunk_features(rows, {"keys": ["input_ids"], "pad_id": 0}, packed=True)[PACKED_LAYOUT]


def _qkv(seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(sum(LENGTHS), HEADS, WIDTH, generator=g, requires_grad=True) for _ in range(3)]


def _reference(q, k, v, lengths) -> torch.Tensor:
    """Each text's attention on its own, one text at a time: what every kernel must compute."""
    outs, start = [], 0
    for n in lengths:
        part = [t[start : start + n].transpose(0, 1) for t in (q, k, v)]  # (heads, n, width)
        outs.append(torch.nn.functional.scaled_dot_product_attention(*part).transpose(0, 1).reshape(n, -1))
        start += n
    return torch.cat(outs)


@pytest.mark.parametrize("kernel", ["grid", "jagged"])
def test_each_cpu_kernel_attends_within_each_text_with_the_gradients_of_plain_attention(kernel):
    pad = _layout(LENGTHS)
    q, k, v = _qkv()
    out = attend_tokens(q, k, v, pad, kernel=kernel)
    expected = _reference(q, k, v, LENGTHS)
    assert out.shape == (sum(LENGTHS), HEADS * WIDTH)
    torch.testing.assert_close(out, expected, atol=1e-6, rtol=1e-5)
    cotangent = torch.randn_like(out)
    got = torch.autograd.grad(out, (q, k, v), cotangent)
    want = torch.autograd.grad(expected, (q, k, v), cotangent)
    for a, b in zip(got, want):
        torch.testing.assert_close(a, b, atol=1e-6, rtol=1e-5)


def test_the_jagged_kernel_equals_the_grid_with_a_scale_and_one_long_text():
    for lengths in ([5], [12, 3, 3, 1]):
        pad = _layout(lengths)
        q, k, v = (torch.randn(sum(lengths), HEADS, WIDTH) for _ in range(3))
        torch.testing.assert_close(attend_tokens(q, k, v, pad, kernel="jagged", scaling=0.2),
                                   attend_tokens(q, k, v, pad, kernel="grid", scaling=0.2), atol=1e-6, rtol=1e-5)


def test_the_jagged_kernel_applies_attention_dropout_unbiased():
    """SDPA draws its own dropout mask (no API takes a given one), so the jagged kernel's dropout is checked for what
    it must do: change the output, drop at the rate asked, and leave the mean over draws at the undropped output."""
    pad = _layout(LENGTHS)
    q, k, v = (t.detach() for t in _qkv(1))
    v = torch.ones_like(v)  # an output row is then the kept share of its attention weights, over 1 - p
    p, draws = 0.25, 60
    torch.manual_seed(0)
    outs = torch.stack([attend_tokens(q, k, v, pad, dropout=p, kernel="jagged") for _ in range(draws)])
    undropped = attend_tokens(q, k, v, pad, kernel="jagged")
    torch.testing.assert_close(undropped, torch.ones_like(undropped))
    assert not torch.allclose(outs[0], undropped)
    assert (outs == 0).any()  # a token of a one-token text loses its only key now and then
    assert abs(outs.mean().item() - 1.0) < 0.03
    q.requires_grad_(True)
    (g,) = torch.autograd.grad(attend_tokens(q, k, k, pad, dropout=p, kernel="jagged").square().sum(), q)
    assert torch.isfinite(g).all() and g.abs().sum() > 0


def test_the_packed_models_embeddings_and_gradients_are_the_same_through_the_jagged_kernel(tiny_model_dir, monkeypatch):
    """The whole packed encoder with its attention on the jagged kernel that trains on CUDA, against the CPU's grid."""
    from sentence_transformers import SentenceTransformer

    from pgrank.data.token_store import TokenRows, tokenize
    from pgrank.models import packed_attention
    from pgrank.models.packing import chunk_features, enable_packing, run_features

    model = SentenceTransformer(str(tiny_model_dir), device="cpu")
    texts = [("harbours and tides " * (1 + i % 5)).strip() + f" {i}" for i in range(12)]
    ids, lengths, layout = tokenize(model, texts, task="document", max_length=48)
    rows = TokenRows(ids, lengths)
    assert enable_packing(model, rows.take(np.arange(4)), layout)
    features = chunk_features(rows, layout, packed=True)
    model.eval()  # no dropout: the two kernels draw no masks to compare
    params = [p for p in model.parameters() if p.requires_grad]

    def run():
        emb = run_features(model, features, task="document")
        return emb, torch.autograd.grad(emb.square().sum(), params, allow_unused=True)

    grid = run()
    monkeypatch.setattr(packed_attention, "kernel_for", lambda query, dropout: "jagged")
    jagged = run()
    torch.testing.assert_close(jagged[0], grid[0], atol=1e-5, rtol=1e-5)
    for a, b in zip(jagged[1], grid[1]):
        assert (a is None) == (b is None)
        if a is not None:
            torch.testing.assert_close(a, b, atol=1e-4, rtol=1e-4)


def test_training_on_cuda_never_runs_the_padded_grid():
    def query(cuda: bool, dtype):
        return types.SimpleNamespace(is_cuda=cuda, dtype=dtype)

    assert kernel_for(query(False, torch.float32), 0.1) == "grid"
    assert kernel_for(query(True, torch.bfloat16), 0.1) == "jagged"  # training: attention dropout
    assert kernel_for(query(True, torch.float32), 0.0) == "jagged"
    assert kernel_for(query(True, torch.bfloat16), 0.0) in {"varlen", "jagged"}  # varlen where torch has it
    assert set(KERNELS) == {"varlen", "jagged", "grid"}
    with pytest.raises(ValueError, match="dropout"):
        KERNELS["varlen"](*(torch.zeros(2, 1, 4) for _ in range(3)), _layout([2]), 0.1, None)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="a CUDA device is needed")
def test_on_cuda_the_jagged_kernel_trains_with_dropout_and_replays_its_masks():
    """bf16 on CUDA: without dropout the jagged kernel gives what varlen_attn gives; with dropout it runs forward and
    backward without the grid, and the same RNG state draws the same masks (what cached-gradient chunking replays)."""
    from pgrank.data.token_store import TokenRows
    from pgrank.models.packed_attention import PACKED_LAYOUT
    from pgrank.models.packing import chunk_features

    lengths = [300, 17, 64, 1, 128]
    rows = TokenRows(np.zeros(sum(lengths), np.int32), np.asarray(lengths, dtype=np.int64))
    pad = chunk_features(rows, {"keys": ["input_ids"], "pad_id": 0}, packed=True, device="cuda")[PACKED_LAYOUT]
    q, k, v = (torch.randn(sum(lengths), 12, 64, device="cuda", dtype=torch.bfloat16, requires_grad=True)
               for _ in range(3))
    assert kernel_for(q, 0.1) == "jagged"
    if kernel_for(q, 0.0) == "varlen":
        torch.testing.assert_close(attend_tokens(q, k, v, pad, kernel="jagged"), attend_tokens(q, k, v, pad),
                                   atol=2e-2, rtol=2e-2)
    torch.testing.assert_close(attend_tokens(q, k, v, pad, kernel="jagged").float(),
                               _reference(q.float(), k.float(), v.float(), lengths), atol=3e-2, rtol=3e-2)
    state = torch.cuda.get_rng_state()
    first = attend_tokens(q, k, v, pad, dropout=0.1)
    torch.cuda.set_rng_state(state)
    second = attend_tokens(q, k, v, pad, dropout=0.1)
    assert torch.equal(first, second) and not torch.equal(first, attend_tokens(q, k, v, pad, dropout=0.1))
    first.float().square().sum().backward()
    assert all(t.grad is not None and torch.isfinite(t.grad).all() for t in (q, k, v))
