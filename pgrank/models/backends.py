"""Inference backends: how a sentence-transformers model runs forward when no gradient is needed.

Mining, the frozen document tower, and the evaluation of baselines and policies only run models
forward; on a CPU, how they run decides most of a cold run's time. Backends (``models.backend``, per
model ``models.backends``):

``torch``       sentence-transformers as is, fp32 (the reference); on CUDA with TF32 matrix products
                (:func:`pgrank.models.loading.use_tf32`).
``torch-bf16``  bfloat16. On CUDA the weights are cast to bf16 (sentence-transformers' documented way to run a
                model in half precision), so that the model stays a ``SentenceTransformer`` and several GPUs
                encode through its multi-process pool. On a CPU the forward passes run under
                ``torch.autocast(bfloat16)``: on CPUs with AMX-BF16 (Sapphire Rapids and later) oneDNN runs
                the matrix products on AMX tiles. bf16 keeps float32's range, so T5 (which overflows in
                float16) is safe in it.
``onnx``        the whole pipeline (transformer, pooling, normalization) exported with ``torch.onnx`` and
                run by ONNX Runtime, fp32.
``onnx-int8``   that graph with ONNX Runtime's dynamic int8 quantization of its MatMul weights, per
                channel; without AVX512-VNNI the weights use 7 bits (``reduce_range``, ONNX Runtime's
                advice for non-VNNI CPUs). The instruction set is detected at run time and is part of the
                export's key.
``auto``        ``torch-bf16`` on CUDA; on a CPU, the backend measured fastest for it within the quality
                bounds (:func:`auto_inference_backend`). A model whose pipeline does not export (a ``Router``,
                a static embedding, prompts excluded from pooling), or whose weights are too large to export
                sensibly on a CPU (:data:`ONNX_MAX_WEIGHT_BYTES`: gtr-t5-xl's 4.9 GB), runs ``torch``.

sentence-transformers' own ``backend="onnx"`` needs ``optimum-onnx``, whose releases pin
``transformers<4.58`` while sentence-transformers 6 needs ``transformers>=5``; so the export here uses
``torch.onnx`` and ``onnxruntime.quantization`` directly. An export is an artifact like corpus
embeddings (:meth:`pgrank.paths.Paths.model_export`): built once per (model weights, backend,
instruction set, exporter versions), under a lock, into a folder renamed into place, with the SHA-256
of every file in its ``meta.json``, verified on every load (a mismatch exports again).

Example:
    >>> encoder, backend = load_inference_encoder("minilm", params.models, paths, max_seq_length=256)
    >>> encoder.encode_document(["a passage"], batch_size=32).shape
    (1, 384)
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import json
import logging
import os
import sys
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from pgrank.atomic import atomic_path, exclusive, lock_file, write_json
from pgrank.data.artifact_meta import META
from pgrank.data.checksums import file_sha256
from pgrank.errors import PgrankError
from pgrank.models.loading import on_cuda
from pgrank.models.onnx_encoder import OUTPUT as _OUTPUT
from pgrank.models.onnx_encoder import OnnxEncoder, write_text_files
from pgrank.models.onnx_encoder import features as tokenized

if TYPE_CHECKING:
    from sentence_transformers import SentenceTransformer

    from pgrank.config import ModelsConfig
    from pgrank.models.names import ModelRef
    from pgrank.paths import Paths

log = logging.getLogger(__name__)

# The backends that compute in float32, as plain sentence-transformers does, so that their figures match its to
# rounding: ONNX's float32 graph reproduces every figure of the demo (studies/out/exported_policy-demo.json); int8 and
# bf16 do not.
FLOAT32_BACKENDS = frozenset({"torch", "onnx"})

FORMAT = "pgrank-onnx-export/2"  # 2: the tokenizer and text settings beside the graph (pgrank.models.onnx_encoder)
_EXPORTABLE = {"Transformer", "Pooling", "Normalize", "Dense"}  # sentence-transformers module classes
# Above ONNX's 2 GB protobuf limit a graph needs external data files, and exporting and quantizing a
# billion-parameter model takes a CPU tens of minutes and several times its size in memory: such models run torch.
ONNX_MAX_WEIGHT_BYTES = 2**31


@functools.cache  # read once per process: every backend resolution and int8 key asks for them
def cpu_flags() -> frozenset[str]:
    """The CPU's feature flags from ``/proc/cpuinfo`` (empty where there is none)."""
    try:
        text = Path("/proc/cpuinfo").read_text(encoding="utf-8", errors="replace")
    except OSError:
        return frozenset()
    for line in text.splitlines():
        if line.startswith("flags"):
            return frozenset(line.partition(":")[2].split())
    return frozenset()


def int8_isa(flags: frozenset[str] | None = None) -> str:
    """The instruction set int8 weights are quantized for: ``avx512_vnni`` (8-bit weights) or ``avx2`` (7-bit)."""
    flags = cpu_flags() if flags is None else flags
    return "avx512_vnni" if "avx512_vnni" in flags or "amx_int8" in flags else "avx2"


def auto_inference_backend(device: str | None = None, flags: frozenset[str] | None = None) -> str:
    """The measured rule behind ``models.backend: auto``: ``torch-bf16`` on CUDA (``python bench/gpu.py``);
    ``torch-bf16`` on a CPU with AMX-BF16 (2.7x torch fp32 for MiniLM, nDCG@10 within 0.005,
    ``python bench/backends.py``); ``onnx-int8`` on other CPUs."""
    if on_cuda(device):
        return "torch-bf16"
    flags = cpu_flags() if flags is None else flags
    return "torch-bf16" if "amx_bf16" in flags else "onnx-int8"


def _backends_key(ref: "ModelRef", models: "ModelsConfig") -> str | None:
    """The ``models.backends`` key that names this model: its name, its hub id or an alias of that hub id (a policy's
    checkpoint names its frozen document encoder by hub id, the configuration by alias); ``None`` if none does."""
    keys = (ref.name, ref.hub_id, *(alias for alias, target in models.aliases.items() if target == ref.hub_id))
    return next((key for key in keys if key in models.backends), None)


def requested_backend(ref: "ModelRef", models: "ModelsConfig") -> str:
    """What ``params.yaml`` asks for this model: ``models.backends`` under :func:`_backends_key`, else
    ``models.backend``."""
    key = _backends_key(ref, models)
    return models.backend if key is None else models.backends[key]


def _model_json(ref: "ModelRef", name: str) -> dict | list | None:
    """A JSON file of the model (its folder, or the hub's cache), or None where there is none."""
    if ref.local_dir is not None:
        path = ref.local_dir / name
    else:
        try:
            from huggingface_hub import hf_hub_download

            path = Path(hf_hub_download(ref.hub_id, name))
        except Exception:  # noqa: BLE001 - offline or not a sentence-transformers repo: decided at load time
            return None
    return json.loads(path.read_text(encoding="utf-8")) if path.is_file() else None


def exports(ref: "ModelRef") -> bool:
    """Whether the model's pipeline is one ONNX graph can hold: a transformer, then pooling, dense and normalize
    modules, with no pooling that leaves the prompt's tokens out (the graph pools every token it is given)."""
    modules = _model_json(ref, "modules.json") or []
    types = [m.get("type", "").rsplit(".", 1)[-1] for m in modules]
    if not types or types[0] != "Transformer" or not set(types) <= _EXPORTABLE:
        return False
    return not any((_model_json(ref, f"{m['path']}/config.json") or {}).get("include_prompt", True) is False
                   for m, t in zip(modules, types) if t == "Pooling")


def weight_bytes(ref: "ModelRef") -> int | None:
    """Bytes of the model's safetensors weights: a local folder's files, else the hub's file listing (at the
    pinned revision); ``None`` where neither can be read (offline and not cached)."""
    if ref.local_dir is not None:
        return sum(p.stat().st_size for p in ref.local_dir.rglob("*.safetensors")) or None
    try:
        from huggingface_hub import HfApi

        info = HfApi().model_info(ref.hub_id, revision=ref.revision, files_metadata=True)
        return sum(f.size or 0 for f in info.siblings or [] if f.rfilename.endswith(".safetensors")) or None
    except Exception:  # noqa: BLE001 - offline, or no such repository: decided at load time
        return None


def effective_backend(ref: "ModelRef", models: "ModelsConfig", device: str | None = None) -> str:
    """The backend a model runs with: ``auto`` resolved (:func:`auto_inference_backend`), ONNX only where the
    model exports and is small enough to (:data:`ONNX_MAX_WEIGHT_BYTES`; larger ones run torch, with a warning).

    Raises:
        PgrankError: an ONNX backend asked for by name for a model whose architecture does not export.
    """
    backend = requested_backend(ref, models)
    if backend == "auto":
        backend = auto_inference_backend(device)
        if backend.startswith("onnx") and not exports(ref):
            return "torch"
    elif backend.startswith("onnx") and not exports(ref):
        key = _backends_key(ref, models)
        raise PgrankError(f"params.yaml: models.backend{'' if key is None else 's.' + key} = {backend!r}: "
                          f"{ref.name} does not export to ONNX (modules other than {sorted(_EXPORTABLE)}, or pooling "
                          "without the prompt's tokens); use torch")
    if backend.startswith("onnx"):
        size = weight_bytes(ref)
        if size is not None and size > ONNX_MAX_WEIGHT_BYTES:
            log.warning("%s: %.1f GB of weights is too large to export to ONNX sensibly on a CPU (over %.1f GB); "
                        "running it with torch instead of %s", ref.name, size / 1e9, ONNX_MAX_WEIGHT_BYTES / 1e9, backend)
            return "torch"
    return backend


def embedding_key(ref: "ModelRef", backend: str, device: str | None = None) -> str:
    """The key of a model's corpus embeddings under a backend: fp32 torch keeps the model's own key, every other
    backend gets its own artifact, so embeddings of two backends never mix; int8 per instruction set, and bf16 per
    kind of device (bf16 weights on CUDA, bf16 autocast on a CPU: not the same numbers).
    (Not per batch size: :class:`OnnxEncoder` runs one text at a time, so that dynamic quantization's
    activation scale is the text's own.)"""
    if backend == "torch":
        return ref.key
    if backend == "onnx-int8":
        return f"{ref.key}+{backend}-{int8_isa()}"
    if backend == "torch-bf16":
        return f"{ref.key}+{backend}{'-cuda' if on_cuda(device) else ''}"
    return f"{ref.key}+{backend}"


def _export_key(ref: "ModelRef", backend: str) -> dict:
    """What an export depends on; read from the packages' metadata, so that a stage that reuses an export imports
    neither PyTorch nor ONNX Runtime to find it."""
    from importlib.metadata import version

    return {"model": ref.key, "backend": backend, "isa": int8_isa() if backend == "onnx-int8" else None,
            "torch": version("torch"), "onnxruntime": version("onnxruntime"), "format": FORMAT}


def _tree_digest(folder: Path) -> dict[str, str]:
    return {p.relative_to(folder).as_posix(): file_sha256(p)
            for p in sorted(folder.rglob("*")) if p.is_file() and p.name != META}


def _input_names(model: "SentenceTransformer") -> list[str]:
    features = tokenized(model, ["a"])
    return [k for k in ("input_ids", "attention_mask", "token_type_ids") if k in features]


def _export(model: "SentenceTransformer", key: dict, folder: Path) -> None:
    """Export ``model`` (fp32, CPU) to ``folder/model.onnx`` (and its int8 ``model-int8.onnx``), meta.json last."""
    import torch

    names = _input_names(model)

    class Pipeline(torch.nn.Module):
        def __init__(self, st):
            super().__init__()
            self.st = st

        def forward(self, *inputs):
            return self.st(dict(zip(names, inputs)))[_OUTPUT]

    example = tokenized(model, ["an example passage to trace", "a second one"])
    args = tuple(example[n] for n in names)
    axes = {n: {0: "batch", 1: "sequence"} for n in names} | {_OUTPUT: {0: "batch"}}
    graph = folder / "model.onnx"
    with warnings_quiet():
        torch.onnx.export(Pipeline(model).eval(), args, str(graph), input_names=names, output_names=[_OUTPUT],
                          dynamic_axes=axes, opset_version=17, dynamo=False)
    file = graph.name
    if key["backend"] == "onnx-int8":
        from onnxruntime.quantization import QuantType, quantize_dynamic

        quantize_dynamic(str(graph), str(folder / "model-int8.onnx"), weight_type=QuantType.QInt8,
                         op_types_to_quantize=["MatMul"], per_channel=True, reduce_range=key["isa"] != "avx512_vnni",
                         extra_options={"DefaultTensorType": 1})  # 1: float, for outputs shape inference cannot type
        graph.unlink()
        file = "model-int8.onnx"
    write_text_files(model, folder)
    write_json(folder / META, dict(key, file=file, inputs=names, sha256=_tree_digest(folder)))


@contextlib.contextmanager
def warnings_quiet():
    """The tracer's warnings about Python control flow in the traced model (shapes are dynamic axes)."""
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        yield


def _verified(folder: Path, key: dict) -> dict | None:
    """The export's meta.json if it is complete, for ``key``, and every file matches its SHA-256."""
    meta_path = folder / META
    if not meta_path.is_file():
        return None
    meta = json.loads(meta_path.read_text(encoding="utf-8"))
    if any(meta.get(k) != v for k, v in key.items()):
        return None
    if _tree_digest(folder) != meta.get("sha256"):
        log.warning("%s: an exported file does not match its SHA-256 in meta.json; exporting again", folder)
        return None
    return meta


def finished_export(ref: "ModelRef", backend: str, paths: "Paths") -> tuple[Path, dict, dict | None]:
    """``(folder, key, meta)`` of the model's export for ``backend``; ``meta`` is ``None`` unless the export there is
    complete and verified (:func:`_verified`). Needs neither the model nor PyTorch."""
    key = _export_key(ref, backend)
    digest = hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()[:16]
    folder = paths.model_export(ref.key, backend, digest)
    return folder, key, _verified(folder, key)


def onnx_export(model: "SentenceTransformer", ref: "ModelRef", backend: str, paths: "Paths") -> tuple[Path, dict]:
    """The verified export of ``model`` for ``backend`` (``onnx`` or ``onnx-int8``), exported on first use.

    Returns:
        ``(folder, meta)``; ``meta["file"]`` is the graph to run, ``meta["inputs"]`` its input names.
    """
    folder, key, meta = finished_export(ref, backend, paths)
    if meta is not None:
        return folder, meta
    folder.parent.mkdir(parents=True, exist_ok=True)
    with exclusive(lock_file(folder), what=f"the {backend} export {folder}"):
        meta = _verified(folder, key)
        if meta is None:
            log.info("exporting %s to %s (%s)", ref.name, backend, folder)
            with atomic_path(folder, directory=True) as tmp:
                Path(tmp).mkdir(parents=True, exist_ok=True)
                _export(model, key, Path(tmp))
            meta = _verified(folder, key)
            if meta is None:
                raise PgrankError(f"{folder}: the export did not verify after writing it")
    return folder, meta


class AutocastEncoder:
    """A sentence-transformers model whose forward passes run under ``torch.autocast(bfloat16)``."""

    def __init__(self, model: "SentenceTransformer"):
        self.model = model

    @property
    def device(self):
        return self.model.device

    def _autocast(self):
        import torch

        return torch.autocast(self.model.device.type, dtype=torch.bfloat16)

    def encode_query(self, texts, **kwargs) -> np.ndarray:
        with self._autocast():
            return np.asarray(self.model.encode_query(texts, **kwargs), dtype=np.float32)

    def encode_document(self, texts, **kwargs) -> np.ndarray:
        with self._autocast():
            return np.asarray(self.model.encode_document(texts, **kwargs), dtype=np.float32)


def load_inference_encoder(name, models: "ModelsConfig", paths: "Paths", *, device: str | None = None,
                           max_seq_length: int | None = None, backend: str | None = None):
    """A model for forward-only encoding under its backend (``backend``: as resolved by :func:`effective_backend`).

    Returns:
        ``(encoder, backend)``: an object with ``encode_query`` / ``encode_document`` (a plain
        :class:`SentenceTransformer` for ``torch``) and the backend it runs.

    An ONNX backend whose export is there already runs from the export alone (:meth:`OnnxEncoder.from_folder`):
    the model is loaded, with PyTorch and sentence-transformers, only to export it.
    """
    from pgrank.models.names import resolve_model

    ref = name if not isinstance(name, str) else resolve_model(name, models)
    backend = backend or effective_backend(ref, models, device)
    on_cpu = backend.startswith("onnx")
    if on_cpu:
        folder, _, meta = finished_export(ref, backend, paths)
        encoder = meta and OnnxEncoder.from_folder(folder, meta, cpu_threads(), max_seq_length=max_seq_length,
                                                   name=ref.name)
        if encoder:
            return encoder, backend
    import torch

    from pgrank.models.loading import load_encoder

    model = load_encoder(ref, models, device="cpu" if on_cpu else device, max_seq_length=max_seq_length)
    if backend == "torch":
        return model, backend
    if backend == "torch-bf16":
        if model.device.type == "cuda":  # bf16 weights: still a SentenceTransformer, so the multi-GPU pool works
            return model.to(torch.bfloat16), backend
        return AutocastEncoder(model), backend
    folder, meta = onnx_export(model, ref, backend, paths)
    threads = torch.get_num_threads()
    encoder = OnnxEncoder.from_folder(folder, meta, threads, max_seq_length=model.max_seq_length, name=ref.name)
    return encoder or OnnxEncoder.from_model(model, folder / meta["file"], meta["inputs"], threads), backend


def cpu_threads() -> int:
    """The threads ONNX runs use: PyTorch's intra-op count where PyTorch is loaded, else ``OMP_NUM_THREADS``, else
    the cores this process may run on (an embedding does not depend on it; only the time does)."""
    if "torch" in sys.modules:
        return sys.modules["torch"].get_num_threads()
    omp = os.environ.get("OMP_NUM_THREADS", "")
    return int(omp) if omp.isdigit() and int(omp) > 0 else len(os.sched_getaffinity(0))
