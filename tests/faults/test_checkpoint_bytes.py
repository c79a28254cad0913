"""Saving a checkpoint neither changes the model being trained nor depends on what it encoded before.

The mismatch the kill harness found: after a resume, ``tokenizer.json`` of a ``tower: query`` checkpoint
said ``max_length: 128`` / ``Fixed 128`` where an uninterrupted run said ``BatchLongest``, and the
weights differed too. sentence-transformers' ``save`` writes a model card by *encoding* examples; that
switched the training model's modules to eval mode (no dropout from the first checkpoint on, while a
resumed run trained with dropout) and left each fast tokenizer's last truncation and padding in what
``save_pretrained`` writes. ``checkpoints.save_model`` / ``save_state`` now save as if freshly loaded.
"""

from __future__ import annotations

import json

from sentence_transformers import SentenceTransformer

from pgrank.training import checkpoints
from pgrank.training.grad_cache import encode


def _load(path):
    return SentenceTransformer(str(path), device="cpu")


def test_saving_a_query_document_checkpoint_leaves_the_training_model_in_train_mode(tmp_path, tiny_model_dir):
    model, document = _load(tiny_model_dir).train(), _load(tiny_model_dir)
    checkpoints.save_model(model, tmp_path / "epoch-0", {"epoch": 0}, document_model=document)
    assert all(m.training for m in model.modules())  # dropout stays on for the next epoch
    assert (tmp_path / "epoch-0" / "README.md").is_file()  # the model card is still written


def test_checkpoint_bytes_do_not_depend_on_what_the_model_encoded_before(tmp_path, tiny_model_dir):
    fresh_q, fresh_d = _load(tiny_model_dir), _load(tiny_model_dir)
    used_q, used_d = _load(tiny_model_dir), _load(tiny_model_dir)
    for m, length in ((used_q, 16), (used_d, 48)):  # leaves truncation/padding state in the tokenizers
        encode(m, ["a query about rivers", "another one"], task="query", max_length=length)
    checkpoints.save_model(fresh_q, tmp_path / "a", {"epoch": 1}, document_model=fresh_d)
    checkpoints.save_model(used_q, tmp_path / "b", {"epoch": 1}, document_model=used_d)
    files = sorted(p.relative_to(tmp_path / "a") for p in (tmp_path / "a").rglob("*") if p.is_file())
    assert files and files == sorted(p.relative_to(tmp_path / "b") for p in (tmp_path / "b").rglob("*") if p.is_file())
    differ = [str(f) for f in files if (tmp_path / "a" / f).read_bytes() != (tmp_path / "b" / f).read_bytes()]
    assert not differ
    tokenizer = json.loads(next((tmp_path / "a").rglob("tokenizer.json")).read_text())
    assert tokenizer["truncation"] is None and tokenizer["padding"] is None


def test_the_resumable_state_is_saved_as_loaded_too(tmp_path, tiny_model_dir):
    model = _load(tiny_model_dir).train()
    encode(model, ["some text"], task="query", max_length=12)
    checkpoints.save_state(tmp_path / "state", model, checkpoints.TrainerState(epoch=1, step=4, fingerprint="f"))
    tokenizer = json.loads((tmp_path / "state" / "model" / "tokenizer.json").read_text())
    assert tokenizer["truncation"] is None and all(m.training for m in model.modules())
    assert checkpoints.load_state(tmp_path / "state").epoch == 1
