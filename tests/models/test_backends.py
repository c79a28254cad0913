"""pgrank.models.backends: the auto rule, ONNX exports as verified artifacts, embeddings equal to torch's."""

from __future__ import annotations

import json
import os
import threading
from pathlib import Path

import numpy as np
import pytest

from pgrank.config import ModelsConfig
from pgrank.errors import PgrankError
from pgrank.models.backends import (
    ONNX_MAX_WEIGHT_BYTES,
    OnnxEncoder,
    auto_inference_backend,
    effective_backend,
    embedding_key,
    int8_isa,
    load_inference_encoder,
)
from pgrank.models.names import resolve_model
from pgrank.paths import Paths

pytest.importorskip("onnxruntime")

TEXTS = ["what causes fever", "Aspirin lowers the risk of heart attacks in adults over fifty.",
         "A much longer passage " * 20, "x"]


def paths_at(tmp_path: Path) -> Paths:
    return Paths(root=tmp_path / "root", data=tmp_path / "data", embeddings=tmp_path / "emb")


def cosine(a, b):
    a = a / np.linalg.norm(a, axis=1, keepdims=True)
    b = b / np.linalg.norm(b, axis=1, keepdims=True)
    return (a * b).sum(1)


def test_auto_is_bf16_on_cuda_bf16_with_amx_and_int8_elsewhere():
    assert auto_inference_backend("cuda:0", frozenset()) == "torch-bf16"
    assert auto_inference_backend("cpu", frozenset({"amx_bf16", "avx512_vnni"})) == "torch-bf16"
    assert auto_inference_backend("cpu", frozenset({"avx512_vnni"})) == "onnx-int8"
    assert auto_inference_backend("cpu", frozenset({"avx2"})) == "onnx-int8"
    assert int8_isa(frozenset({"avx512_vnni"})) == "avx512_vnni"
    assert int8_isa(frozenset({"avx2", "fma"})) == "avx2"


def test_backends_per_model_override_the_default(tiny_model_dir):
    ref = resolve_model(str(tiny_model_dir), ModelsConfig())
    assert effective_backend(ref, ModelsConfig(backend="onnx")) == "onnx"
    cfg = ModelsConfig(backend="onnx", backends={str(tiny_model_dir): "torch"})
    assert effective_backend(ref, cfg) == "torch"


def test_a_backend_named_by_alias_applies_where_the_model_is_reached_by_its_hub_id(tiny_model_dir):
    """A ``tower: query`` policy's checkpoint names its frozen document encoder by hub id; ``models.backends`` keyed
    by the alias the configuration uses must reach it, or the policy's documents run another backend than the warm
    start's."""
    from pgrank.models.backends import requested_backend

    hub = "sentence-transformers/all-MiniLM-L6-v2"
    models = ModelsConfig(aliases={"minilm": hub, "tiny": str(tiny_model_dir)}, backend="auto",
                          backends={"minilm": "onnx"})
    by_hub_id = resolve_model(hub, ModelsConfig())  # the name as a checkpoint's pgrank.json records it
    assert (by_hub_id.name, requested_backend(by_hub_id, models)) == (hub, "onnx")
    assert requested_backend(resolve_model(str(tiny_model_dir), ModelsConfig()), models) == "auto"
    assert requested_backend(by_hub_id, ModelsConfig(backends={hub: "torch", "minilm": "onnx"})) == "torch"


def test_a_model_refused_by_its_alias_entry_is_named_by_that_key(tmp_path, tiny_model_dir):
    folder = _router_model(tmp_path, tiny_model_dir)
    ref = resolve_model(str(folder), ModelsConfig())  # reached by its folder, configured by an alias of it
    models = ModelsConfig(aliases={"routed": str(folder)}, backends={"routed": "onnx"})
    with pytest.raises(PgrankError, match=r"models\.backends\.routed = 'onnx'"):
        effective_backend(ref, models)


def test_every_backend_has_its_own_embedding_artifact_and_torch_keeps_the_old_key(tiny_model_dir):
    ref = resolve_model(str(tiny_model_dir), ModelsConfig())
    keys = {b: embedding_key(ref, b, "cpu") for b in ("torch", "torch-bf16", "onnx", "onnx-int8")}
    assert keys["torch"] == ref.key
    assert len(set(keys.values())) == 4
    assert keys["onnx-int8"].endswith(int8_isa())
    # bf16 weights on CUDA and bf16 autocast on a CPU are not the same numbers: two artifacts
    assert embedding_key(ref, "torch-bf16", "cuda") not in keys.values()


def test_a_model_too_large_to_export_runs_torch_with_a_warning(tmp_path, tiny_model_dir, monkeypatch, caplog):
    from pgrank.models import backends

    ref = resolve_model(str(tiny_model_dir), ModelsConfig())
    assert effective_backend(ref, ModelsConfig(backend="onnx-int8")) == "onnx-int8"
    weights = sum(p.stat().st_size for p in tiny_model_dir.rglob("*.safetensors"))
    assert backends.weight_bytes(ref) == weights
    monkeypatch.setattr(backends, "ONNX_MAX_WEIGHT_BYTES", weights - 1)  # this model is now over the limit
    with caplog.at_level("WARNING", logger="pgrank.models.backends"):
        assert effective_backend(ref, ModelsConfig(backend="onnx-int8")) == "torch"
        assert effective_backend(ref, ModelsConfig(backend="auto"), "cpu") in {"torch", "torch-bf16"}
    assert "too large to export to ONNX" in caplog.text
    assert ONNX_MAX_WEIGHT_BYTES == 2**31  # ONNX's protobuf limit: gtr-t5-xl's 4.9 GB is over it


@pytest.mark.parametrize("backend", ["onnx", "onnx-int8"])
def test_an_onnx_embedding_depends_on_its_text_alone_not_on_its_batch(tmp_path, tiny_model_dir, backend):
    """Dynamic int8 quantization scales activations per run: texts are run one at a time, so a text's
    embedding is the same alone, among others, and whatever batch size is asked for."""
    encoder, _ = load_inference_encoder(str(tiny_model_dir), ModelsConfig(), paths_at(tmp_path), backend=backend)
    together = encoder.encode_document(TEXTS, batch_size=4)
    for i, text in enumerate(TEXTS):
        np.testing.assert_array_equal(encoder.encode_document([text], batch_size=1)[0], together[i])


@pytest.mark.parametrize("backend", ["onnx", "onnx-int8"])
def test_onnx_texts_run_in_parallel_give_the_embeddings_of_one_thread_in_order(tmp_path, tiny_model_dir, backend):
    encoder, _ = load_inference_encoder(str(tiny_model_dir), ModelsConfig(), paths_at(tmp_path), backend=backend)
    texts = [f"{t} {i}" * (1 + i % 5) for i, t in enumerate(TEXTS * 40)]  # 160: more than one window of runs
    encoder.threads = 1
    one = encoder.encode_document(texts)
    encoder.threads = 2
    run, where = encoder._run, set()
    encoder._run = lambda feed: (where.add(threading.current_thread().name), run(feed))[1]
    parallel = encoder.encode_document(texts)
    assert where and all(name.startswith("pgrank-onnx") for name in where)
    assert parallel.dtype == np.float32 and parallel.shape == one.shape
    np.testing.assert_array_equal(parallel, one)
    assert encoder.encode_query([]).shape == (0, one.shape[1])


def _router_model(tmp_path, tiny_model_dir) -> Path:
    """The tiny model with a Router module after it: a model that does not export to ONNX."""
    import shutil

    folder = tmp_path / "router-model"
    shutil.copytree(tiny_model_dir, folder)
    modules = json.loads((folder / "modules.json").read_text())
    modules.append({"idx": len(modules), "name": "2", "path": "2", "type": "sentence_transformers.models.Router"})
    (folder / "modules.json").write_text(json.dumps(modules))
    return folder


def test_a_model_that_does_not_export_runs_torch_under_auto_and_is_refused_by_name(tmp_path, tiny_model_dir):
    folder = _router_model(tmp_path, tiny_model_dir)
    ref = resolve_model(str(folder), ModelsConfig())
    assert effective_backend(ref, ModelsConfig(backend="auto"), "cpu") in {"torch", "torch-bf16"}
    with pytest.raises(PgrankError, match="does not export to ONNX"):
        effective_backend(ref, ModelsConfig(backend="onnx-int8"))


def test_pooling_that_leaves_the_prompt_out_does_not_export(tmp_path, tiny_model_dir):
    import shutil

    folder = tmp_path / "prompt-free-pooling"
    shutil.copytree(tiny_model_dir, folder)
    [pooling] = [m for m in json.loads((folder / "modules.json").read_text()) if m["type"].endswith("Pooling")]
    config = folder / pooling["path"] / "config.json"
    config.write_text(json.dumps(dict(json.loads(config.read_text()), include_prompt=False)))
    ref = resolve_model(str(folder), ModelsConfig())
    assert effective_backend(ref, ModelsConfig(backend="auto"), "cpu") in {"torch", "torch-bf16"}
    with pytest.raises(PgrankError, match="does not export to ONNX"):
        effective_backend(ref, ModelsConfig(backend="onnx"))
    assert effective_backend(resolve_model(str(tiny_model_dir), ModelsConfig()), ModelsConfig(backend="onnx")) == "onnx"


@pytest.mark.parametrize("backend, floor", [("onnx", 0.99999), ("onnx-int8", 0.95), ("torch-bf16", 0.99)])
def test_backends_encode_like_torch(tmp_path, tiny_model_dir, backend, floor):
    models, paths = ModelsConfig(), paths_at(tmp_path)
    torch_model, _ = load_inference_encoder(str(tiny_model_dir), models, paths, device="cpu", backend="torch")
    encoder, got = load_inference_encoder(str(tiny_model_dir), models, paths, device="cpu", backend=backend)
    assert got == backend
    for task in ("encode_document", "encode_query"):
        ref = getattr(torch_model, task)(TEXTS, batch_size=2, convert_to_numpy=True)
        emb = getattr(encoder, task)(TEXTS, batch_size=2)
        assert emb.shape == ref.shape and emb.dtype == np.float32
        assert cosine(emb, ref).min() >= floor


def _prompted(tmp_path: Path, tiny_model_dir: Path) -> Path:
    """The tiny model with query and document prompts in its sentence-transformers configuration."""
    import shutil

    folder = tmp_path / "prompted"
    shutil.copytree(tiny_model_dir, folder)
    cfg_path = folder / "config_sentence_transformers.json"
    cfg = json.loads(cfg_path.read_text()) if cfg_path.is_file() else {}
    cfg["prompts"] = {"query": "query: ", "document": "passage: "}
    cfg_path.write_text(json.dumps(cfg))
    return folder


def test_prompts_apply_as_in_sentence_transformers(tmp_path, tiny_model_dir):
    folder = _prompted(tmp_path, tiny_model_dir)
    models, paths = ModelsConfig(), paths_at(tmp_path)
    torch_model, _ = load_inference_encoder(str(folder), models, paths, device="cpu", backend="torch")
    encoder, _ = load_inference_encoder(str(folder), models, paths, device="cpu", backend="onnx")
    assert torch_model.prompts["query"] == "query: "
    np.testing.assert_allclose(encoder.encode_query(TEXTS), torch_model.encode_query(TEXTS, convert_to_numpy=True), atol=1e-5)
    np.testing.assert_allclose(encoder.encode_document(TEXTS),
                               torch_model.encode_document(TEXTS, convert_to_numpy=True), atol=1e-5)
    # the prompt matters: without it the embeddings differ
    assert not np.allclose(encoder.encode_query(TEXTS), torch_model.encode(TEXTS, convert_to_numpy=True), atol=1e-4)


def test_an_export_is_built_once_reused_and_rebuilt_when_a_file_no_longer_matches(tmp_path, tiny_model_dir):
    models, paths = ModelsConfig(), paths_at(tmp_path)
    first, _ = load_inference_encoder(str(tiny_model_dir), models, paths, backend="onnx-int8")
    assert isinstance(first, OnnxEncoder)
    [folder] = (paths.embeddings / "exports").iterdir()
    meta = json.loads((folder / "meta.json").read_text())
    graph = folder / meta["file"]
    assert meta["backend"] == "onnx-int8" and meta["isa"] == int8_isa()
    assert set(meta["sha256"]) == {meta["file"], "tokenizer.json", "text.json"}
    stamp = graph.stat().st_mtime_ns
    load_inference_encoder(str(tiny_model_dir), models, paths, backend="onnx-int8")
    assert graph.stat().st_mtime_ns == stamp  # reused, not exported again
    with open(graph, "r+b") as fh:  # corrupt one byte
        fh.seek(100)
        byte = fh.read(1)
        fh.seek(100)
        fh.write(bytes([byte[0] ^ 0xFF]))
    again, _ = load_inference_encoder(str(tiny_model_dir), models, paths, backend="onnx-int8")
    assert json.loads((folder / "meta.json").read_text())["sha256"] == meta["sha256"]  # exported afresh, same bytes
    np.testing.assert_allclose(again.encode_document(TEXTS), first.encode_document(TEXTS), atol=1e-6)
    assert [p.name for p in (paths.embeddings / "exports").iterdir()] == [folder.name]  # nothing left beside it
    assert not [p for p in os.listdir(paths.embeddings / "exports") if p.endswith(".tmp")]


def test_corpus_embeddings_are_keyed_by_backend(tmp_path, tiny_model_dir):
    from pgrank.retrieval.dense.corpus_embeddings import model_corpus_embeddings

    class Store(dict):  # a small in-memory BEIR corpus stands in for the store (rows in its order)
        sha256 = "0" * 64

    corpus = Store({f"d{i}": {"title": "", "text": t} for i, t in enumerate(TEXTS)})
    paths = paths_at(tmp_path)
    ref = resolve_model(str(tiny_model_dir), ModelsConfig())
    arts = {b: model_corpus_embeddings(ref, ModelsConfig(backend=b), paths, corpus, max_seq_length=64, batch_size=2,
                                       chunk_size=3, show_progress=False) for b in ("torch", "onnx")}
    assert arts["torch"].folder != arts["onnx"].folder
    assert arts["torch"].meta["model"] == ref.key and arts["onnx"].meta["model"] == embedding_key(ref, "onnx")
    a, b = arts["torch"].rows(0, len(TEXTS)), arts["onnx"].rows(0, len(TEXTS))
    np.testing.assert_allclose(a, b, atol=2e-3)  # float16 shards of the same embeddings


def test_a_finished_export_encodes_alone_with_the_ids_sentence_transformers_gives(tmp_path, tiny_model_dir):
    """The export's tokenizer and text settings give each text the ids ``preprocess`` gives it (prompt, special tokens,
    truncation at the asked length), so the export alone encodes as the loaded model's tokenization does."""
    from pgrank.models.backends import finished_export
    from pgrank.models.loading import load_encoder
    from pgrank.models.onnx_encoder import features

    folder = _prompted(tmp_path, tiny_model_dir)
    models, paths = ModelsConfig(), paths_at(tmp_path)
    ref = resolve_model(str(folder), models)
    first, _ = load_inference_encoder(ref, models, paths, backend="onnx", max_seq_length=16)  # exports
    export, _, meta = finished_export(ref, "onnx", paths)
    texts = [*TEXTS, "", "  spaces\tand\nnew lines  ", "Ünïcödé façade naïve café", "word " * 40]
    for length in (16, 64, 500):  # 500: over the tiny model's 128 positions, capped as load_encoder caps it
        model = load_encoder(ref, models, device="cpu", max_seq_length=length)
        alone = OnnxEncoder.from_folder(export, meta, 1, max_seq_length=length)
        assert alone.max_seq_length == model.max_seq_length == min(length, 128)
        for text in texts:
            for task in ("query", "document"):
                prompt = alone.prompts[task]
                want = {n: features(model, [prompt + text])[n].numpy().tolist() for n in meta["inputs"]}
                got = {n: a.tolist() for n, a in alone._tokenize(prompt + text).items()}
                assert got == want, (length, task, text)
    model = load_encoder(ref, models, device="cpu", max_seq_length=16)
    by_model = OnnxEncoder.from_model(model, export / meta["file"], meta["inputs"], 1)
    for task in ("encode_query", "encode_document"):
        np.testing.assert_array_equal(getattr(first, task)(TEXTS), getattr(by_model, task)(TEXTS))
    assert OnnxEncoder.from_folder(export, meta, 1, max_seq_length=None) is None  # the model's default is the model's


def test_a_stage_that_reuses_an_export_imports_neither_torch_nor_sentence_transformers(tmp_path, tiny_model_dir):
    import subprocess
    import sys

    models, paths = ModelsConfig(), paths_at(tmp_path)
    loaded, _ = load_inference_encoder(str(tiny_model_dir), models, paths, backend="onnx", max_seq_length=32)
    np.save(tmp_path / "want.npy", loaded.encode_document(TEXTS))
    script = f"""
import sys
import numpy as np
from pgrank.config import ModelsConfig
from pgrank.models.backends import load_inference_encoder
from pathlib import Path
from pgrank.paths import Paths
paths = Paths(root=Path({str(paths.root)!r}), data=Path({str(paths.data)!r}), embeddings=Path({str(paths.embeddings)!r}))
encoder, backend = load_inference_encoder({str(tiny_model_dir)!r}, ModelsConfig(), paths, backend="onnx", max_seq_length=32)
np.testing.assert_array_equal(encoder.encode_document({TEXTS!r}), np.load({str(tmp_path / "want.npy")!r}))
print(sorted(m for m in ("torch", "sentence_transformers", "transformers") if m in sys.modules))
"""
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.split("\n")[-2] == "[]"
