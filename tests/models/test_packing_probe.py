"""The probe that keeps packing on only where a packed chunk encodes as the padded layout does
(pgrank.models.packing.enable_packing): float32 to 1e-4, half precision to the CUDA tests' cosine, and a model it
switches off says so once."""

from __future__ import annotations

import logging

import numpy as np
import torch

from pgrank.data.token_store import TokenRows, tokenize
from pgrank.models.packing import PROBE_COSINE, enable_packing, packing_off, packs, probe_finding

TEXTS = [("rivers and deltas " * (1 + i % 7)).strip() + f" number {i}" for i in range(12)]


def _model(path):
    from sentence_transformers import SentenceTransformer

    return SentenceTransformer(str(path), device="cpu").eval()


def _rows(model):
    ids, lengths, layout = tokenize(model, TEXTS, task="document", max_length=64)
    return TokenRows(ids, lengths).take(np.arange(8)), layout


def test_half_precision_is_held_to_the_cuda_tests_cosine_and_float32_to_1e_4():
    """bf16 rounds a 768-wide embedding by about 1e-3 of its size, text by text (what FlashAttention's varlen kernel
    against SDPA over the padded grid gives on CUDA): under the CUDA tests' cosine, over float32's 1e-4."""
    g = torch.Generator().manual_seed(0)
    a = torch.randn(8, 768, generator=g)
    rounded = a + 2e-3 * a.abs().mean() * torch.randn(8, 768, generator=g)
    assert PROBE_COSINE == 0.999
    assert probe_finding(a, rounded, half=True) is None
    assert "float32: at most 1e-4" in probe_finding(a, rounded, half=False)
    assert probe_finding(a, a + 1e-6, half=False) is None
    other = a.roll(1, dims=0)  # each text's embedding is another text's: what a leak across texts looks like
    assert "least cosine" in probe_finding(a, other, half=True)
    assert "least cosine nan" in probe_finding(a, torch.full_like(a, float("nan")), half=True)
    assert "shape" in probe_finding(a, a[:4], half=True)


def test_bf16_weights_pack_under_the_cuda_tests_cosine(paper_model):
    model = _model(paper_model("sbert")).to(torch.bfloat16)
    rows, layout = _rows(model)
    assert PROBE_COSINE == 0.999
    assert enable_packing(model, rows, layout) and packs(model) and packing_off(model) is None


def test_a_probe_that_disagrees_switches_packing_off_and_says_so_once(paper_model, caplog):
    """Left padding shifts a padded text's absolute positions, so the padded layout no longer encodes as the
    packed one: the probe finds it and the model runs padded."""
    model = _model(paper_model("sbert"))
    rows, layout = _rows(model)
    with caplog.at_level(logging.WARNING, logger="pgrank.models.packing"):
        assert not enable_packing(model, rows, {**layout, "padding_side": "left"})
        assert not enable_packing(model, rows, {**layout, "padding_side": "left"})  # decided once per model
    assert not packs(model)
    assert "differ from the padded layout's by up to" in packing_off(model)
    warned = [r.getMessage() for r in caplog.records if "packing is off" in r.getMessage()]
    assert len(warned) == 1 and packing_off(model) in warned[0] and warned[0].endswith("its texts run padded")
    assert "pgrank" not in str(model[0].auto_model.config._attn_implementation)  # back to the model's own attention


def test_an_architecture_that_never_packs_is_not_switched_off(paper_model):
    model = _model(paper_model("gtr-t5"))
    rows, layout = _rows(model)
    assert not enable_packing(model, rows, layout) and packing_off(model) is None
