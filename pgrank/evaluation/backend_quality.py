"""The quality guard of the inference backends: nDCG@10 of one model under each backend against torch fp32.

A backend other than ``torch`` computes slightly different embeddings (bf16 products, int8 weights);
whether that costs ranking quality is measured, not assumed: each backend encodes each evaluation set's
whole corpus into its own corpus-embedding artifact (:func:`pgrank.models.backends.embedding_key`),
searches it first stage (``evaluate.top_k``), and is scored with pytrec_eval like any system. The
bounds: ``onnx`` and ``torch-bf16`` within 0.005 of torch fp32, ``onnx-int8`` within 0.01.
Used by ``bench/backends.py`` (prints) and by the slow test ``tests/evaluation/test_backend_quality.py``
(asserts the bounds).

Example:
    >>> rows = compare_backends(params, paths, "minilm", ["scifact/test", "nfcorpus/test"],
    ...                         ["torch", "torch-bf16", "onnx", "onnx-int8"])
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Sequence
from dataclasses import dataclass

from pgrank.config import Params
from pgrank.data.artifact_meta import META
from pgrank.paths import Paths

BOUNDS = {"torch": 0.0, "torch-bf16": 0.005, "onnx": 0.005, "onnx-int8": 0.01}


@dataclass(frozen=True)
class BackendScore:
    """One backend on one evaluation set: nDCG@10 (first stage) and the corpus encoding it took."""

    backend: str
    eval_set: str
    ndcg_at_10: float
    docs: int
    encode_seconds: float  # 0.0 when the artifact already existed
    export_seconds: float  # loading (and, the first time, exporting) the model

    @property
    def docs_per_second(self) -> float | None:
        return self.docs / self.encode_seconds if self.encode_seconds else None


def _with_backend(params: Params, backend: str) -> Params:
    models = params.models.model_copy(update={"backend": backend, "backends": {}})
    return params.model_copy(update={"models": models})


def compare_backends(params: Params, paths: Paths, model: str, eval_sets: Sequence[str],
                     backends: Sequence[str]) -> list[BackendScore]:
    """nDCG@10 of ``model`` (a system of ``evaluate.systems.dense``) on each ``dataset/split`` under each backend.

    The datasets must be downloaded (``pgrank download``). Corpus embeddings go to ``paths.embeddings``
    (kept: a second call reuses them); results to ``paths.results``, one tree per backend
    (``paths.root/<backend>``).
    """
    from pgrank.data.corpus_store import open_corpus
    from pgrank.evaluation.stage import evaluate
    from pgrank.models.backends import load_inference_encoder
    from pgrank.models.names import resolve_model
    from pgrank.retrieval.dense.corpus_embeddings import corpus_embedding_folder, model_corpus_embeddings

    cfg = params.evaluate
    out = []
    for backend in backends:
        p = _with_backend(params, backend)
        where = dataclasses.replace(paths, root=paths.root / backend)
        ref = resolve_model(model, p.models)
        start = time.perf_counter()
        encoder, _ = load_inference_encoder(ref, p.models, paths, max_seq_length=cfg.max_seq_length, backend=backend)
        export_seconds = time.perf_counter() - start
        for eval_set in eval_sets:
            dataset = eval_set.partition("/")[0]
            store = open_corpus(paths, dataset)
            built = (corpus_embedding_folder(ref, backend, paths, max_seq_length=cfg.max_seq_length,
                                             corpus_sha256=store.sha256) / META).is_file()
            start = time.perf_counter()
            model_corpus_embeddings(ref, p.models, paths, store, max_seq_length=cfg.max_seq_length,
                                    batch_size=cfg.batch_size, chunk_size=p.mine.chunk_size,
                                    load_model=lambda encoder=encoder: encoder, backend=backend,
                                    show_progress=False)
            encode_seconds = 0.0 if built else time.perf_counter() - start
            [result] = evaluate(p, where, model, eval_set, stages=["first_stage"])
            out.append(BackendScore(backend, eval_set, float(result.metrics["ndcg@10"]), len(store),
                                    encode_seconds, export_seconds))
    return out
