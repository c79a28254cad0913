"""Pre-tokenized texts (pgrank.data.token_store): the model's own ids, built once, resumable, checked on open."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from pgrank.data.token_store import (TokenRows, build_token_store, open_token_store, spans, tokenize,
                                     tokenizer_identity)
from pgrank.errors import DataError

TEXTS = [f"document {i} about rivers" + " and their deltas" * (i % 5) for i in range(23)]


@pytest.fixture
def tiny(tiny_model_dir):
    from sentence_transformers import SentenceTransformer

    return SentenceTransformer(str(tiny_model_dir), device="cpu")


def _build(model, folder, texts=TEXTS, **kw):
    return build_token_store(model, lambda lo, hi: texts[lo:hi], len(texts), folder, task="document", max_length=12,
                             source={"name": "t", "sha256": "ab" * 32}, **kw)


def test_the_ids_are_what_preprocess_gives_without_its_padding(tmp_path, tiny):
    store = _build(tiny, tmp_path / "tok", block=5)
    features = tiny.preprocess(TEXTS, task="document", max_length=12)
    rows = store.gather(np.array([7, 0, 22]))
    for i, row in enumerate([7, 0, 22]):
        expected = features["input_ids"][row][features["attention_mask"][row].bool()].tolist()
        start = int(rows.lengths[:i].sum())
        assert rows.ids[start : start + rows.lengths[i]].tolist() == expected
    assert store.lengths(np.arange(len(TEXTS))).max() == 12  # truncated to max_length
    assert not list(store.folder.glob("part-*"))  # parts joined and removed
    assert len(store) == len(TEXTS) and store.features["pad_id"] == 0


def test_an_interrupted_build_resumes_from_its_finished_parts(tmp_path, tiny, monkeypatch):
    import pgrank.data.token_store as ts

    real, calls = ts.tokenize, []

    def dies_on_the_third(model, texts, **kw):
        calls.append(len(texts))
        if len(calls) == 3:
            raise KeyboardInterrupt
        return real(model, texts, **kw)

    monkeypatch.setattr(ts, "tokenize", dies_on_the_third)
    with pytest.raises(KeyboardInterrupt):
        _build(tiny, tmp_path / "tok", block=5)
    assert not (tmp_path / "tok" / "meta.json").exists() and len(list((tmp_path / "tok").glob("part-*.ids.npy"))) == 2
    calls.clear()
    monkeypatch.setattr(ts, "tokenize", lambda model, texts, **kw: calls.append(len(texts)) or real(model, texts, **kw))
    resumed = _build(tiny, tmp_path / "tok", block=5)
    assert calls == [5, 5, 5, 3]  # the first part again (for the layout), then the three never written
    fresh = _build(tiny, tmp_path / "fresh", block=5)
    assert np.array_equal(np.asarray(resumed.ids), np.asarray(fresh.ids))
    assert np.array_equal(np.asarray(resumed.offsets), np.asarray(fresh.offsets))


def test_a_models_prompts_are_in_its_ids_as_encode_query_and_encode_document_put_them(tmp_path, tiny_model_dir):
    from sentence_transformers import SentenceTransformer

    plain = SentenceTransformer(str(tiny_model_dir), device="cpu")
    prompted = SentenceTransformer(str(tiny_model_dir), device="cpu",
                                   prompts={"query": "query: ", "document": "passage: "})
    for task, prompt in (("query", "query: "), ("document", "passage: ")):
        ids, lengths, layout = tokenize(prompted, TEXTS[:3], task=task, max_length=12)
        expected = prompted.preprocess(TEXTS[:3], prompt=prompt, task=task, max_length=12)
        assert ids.tolist() == expected["input_ids"][expected["attention_mask"].bool()].tolist()
        assert layout["prompt_length"] == expected["prompt_length"] == 3  # [CLS] and the prompt's two tokens
        assert tokenizer_identity(prompted, task, 12)["sha256"] != tokenizer_identity(plain, task, 12)["sha256"]
    assert tokenizer_identity(prompted, "query", 12) != tokenizer_identity(prompted, "document", 12)
    # an empty prompt is no prompt: the ids, and so the store's identity, are the plain model's
    empty = SentenceTransformer(str(tiny_model_dir), device="cpu", prompts={"query": "", "document": ""})
    assert tokenizer_identity(empty, "query", 12) == tokenizer_identity(plain, "query", 12)
    assert tokenize(empty, TEXTS[:3], task="query", max_length=12)[0].tolist() == \
        tokenize(plain, TEXTS[:3], task="query", max_length=12)[0].tolist()
    # a default prompt applies to a task without its own, as sentence-transformers applies it
    default = SentenceTransformer(str(tiny_model_dir), device="cpu", prompts={"query": "q: ", "all": "text: "},
                                  default_prompt_name="all")
    default.prompts.pop("document")  # the folder's own empty "document" prompt would take precedence
    assert tokenize(default, ["rivers"], task="document", max_length=12)[0].tolist() == \
        default.preprocess(["rivers"], prompt="text: ", max_length=12)["input_ids"][0].tolist()
    np.testing.assert_allclose(default.encode_document(["rivers"]), default.encode(["rivers"], prompt="text: "))


def test_another_tokenizer_is_refused(tmp_path, tiny, tiny_model_dir):
    from sentence_transformers import SentenceTransformer

    store = _build(tiny, tmp_path / "tok")
    other = SentenceTransformer(str(tiny_model_dir), device="cpu")
    other[0].tokenizer.do_lower_case = False
    other[0].tokenizer.backend_tokenizer.normalizer.lowercase = False  # a cased tokenizer: other ids
    identity = tokenizer_identity(other, "document", 12)
    assert identity["sha256"] != store.meta["tokenizer"]["sha256"]
    with pytest.raises(DataError, match="another tokenizer"):
        open_token_store(store.folder, identity)
    assert open_token_store(store.folder, tokenizer_identity(tiny, "document", 12)).meta == store.meta


@pytest.mark.parametrize("damage", ["shorter", "unordered", "too long", "not numbers"])
def test_a_damaged_offsets_file_is_a_clear_error(tmp_path, tiny, damage):
    store = _build(tiny, tmp_path / "tok")
    path = store.folder / "offsets.npy"
    offsets = np.load(path)
    if damage == "shorter":
        np.save(path, offsets[:-3])
    elif damage == "unordered":
        offsets[5], offsets[6] = offsets[6], offsets[5]
        np.save(path, offsets)
    elif damage == "too long":
        offsets[1:] += 20
        offsets[-1] -= 20
        np.save(path, offsets)
    else:
        path.write_bytes(b"garbage")
    with pytest.raises(DataError, match="offsets.npy"):
        open_token_store(store.folder)


def test_an_empty_source_and_a_foreign_meta_are_errors(tmp_path, tiny):
    with pytest.raises(DataError, match="nothing to tokenize"):
        _build(tiny, tmp_path / "empty", texts=[])
    store = _build(tiny, tmp_path / "tok")
    meta = json.loads((store.folder / "meta.json").read_text())
    (store.folder / "meta.json").write_text(json.dumps({**meta, "format": "something/9"}))
    with pytest.raises(DataError, match="format"):
        open_token_store(store.folder)


def test_rows_are_taken_and_spanned_without_a_loop():
    rows = TokenRows(np.arange(10, dtype=np.int32), np.array([3, 0, 2, 5]))
    taken = rows.take(np.array([3, 0]))
    assert taken.ids.tolist() == [5, 6, 7, 8, 9, 0, 1, 2] and taken.lengths.tolist() == [5, 3]
    assert spans(np.array([4, 0]), np.array([2, 3])).tolist() == [4, 5, 0, 1, 2]


def test_tokenize_keeps_the_layout_preprocess_uses(tiny):
    ids, lengths, layout = tokenize(tiny, ["a b c", "a"], task="query", max_length=8)
    assert lengths.tolist() == [5, 3] and ids.dtype == np.int32
    assert layout["keys"] == ["attention_mask", "input_ids", "token_type_ids"] and layout["padding_side"] == "right"
    assert torch.is_tensor(tiny.preprocess(["a"], task="query")["input_ids"])
