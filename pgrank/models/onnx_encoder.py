"""ONNX Runtime encoding of an exported sentence-transformers pipeline (:mod:`pgrank.models.backends`), without
loading the model again.

An export folder holds the graph and, beside it, what encoding needs besides the graph:

    tokenizer.json   the model's fast tokenizer, as ``tokenizers`` saves it (its truncation and padding removed:
                     they are set per call, as sentence-transformers sets them)
    text.json        the model's task prompts, its embedding dimension, its default truncation length and the
                     longest input its position embeddings allow

so that a stage that encodes with a finished export (evaluation with cached corpus embeddings, a second mining
stage) runs ONNX Runtime and ``tokenizers`` alone: neither PyTorch nor sentence-transformers is imported, which is
most of such a stage's time on a CPU. The ids are the ones sentence-transformers' ``preprocess`` gives a single text
(special tokens, the task's prompt before the text, truncation at ``max_seq_length`` from the right), tested against
it. A model whose tokenizer is not a fast one, or that lowercases in sentence-transformers rather than in its
tokenizer, gets no such files and tokenizes through the loaded model instead.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from pgrank.atomic import write_json
from pgrank.data.token_store import task_prompt
from pgrank.models.loading import capped_length, position_limit

if TYPE_CHECKING:
    from sentence_transformers import SentenceTransformer

TOKENIZER = "tokenizer.json"
TEXT = "text.json"
OUTPUT = "sentence_embedding"


def features(model: "SentenceTransformer", texts: list[str]) -> dict:
    """Tokenized ``texts`` as the model tokenizes them (``preprocess`` in sentence-transformers >= 6)."""
    return (model.preprocess if hasattr(model, "preprocess") else model.tokenize)(texts)


def dimension_of(model: "SentenceTransformer") -> int:
    # sentence-transformers 6 renamed get_sentence_embedding_dimension (deprecated there) to get_embedding_dimension
    return int((getattr(model, "get_embedding_dimension", None) or model.get_sentence_embedding_dimension)())


def write_text_files(model: "SentenceTransformer", folder: Path) -> bool:
    """``tokenizer.json`` and ``text.json`` for ``model`` into its export ``folder``; False (nothing written) where
    the folder cannot encode alone (see the module docstring)."""
    from pgrank.models.loading import position_limit

    transformer = model[0]
    tokenizer = getattr(transformer, "tokenizer", None)
    backend = getattr(tokenizer, "backend_tokenizer", None)
    if backend is None or getattr(transformer, "do_lower_case", False):
        return False
    spec = json.loads(backend.to_str())
    spec["truncation"] = spec["padding"] = None
    (folder / TOKENIZER).write_text(json.dumps(spec, ensure_ascii=False), encoding="utf-8")
    write_json(folder / TEXT, {
        "prompts": {task: task_prompt(model, task) for task in ("query", "document")},
        "dimension": dimension_of(model),
        "position_limit": position_limit(model),
        "truncation_side": getattr(tokenizer, "truncation_side", "right"),
    })
    return True


class OnnxEncoder:
    """``encode_query`` / ``encode_document`` of an exported pipeline run by ONNX Runtime.

    ``tokenize(text)`` gives one text's features as int64 arrays (its prompt already before it); texts run one at a
    time (:meth:`_encode`), ``threads`` of them at once, each on one core. Build one with :meth:`from_folder` (the
    export alone) or :meth:`from_model` (tokenized by the loaded model).
    """

    def __init__(self, graph: Path, inputs: list[str], threads: int, *, tokenize: Callable[[str], dict],
                 prompts: dict[str, str | None], dimension: int, max_seq_length: int | None):
        import onnxruntime as ort

        options = ort.SessionOptions()
        options.intra_op_num_threads = 1  # one text per run, one core per run: parallel over texts instead
        options.inter_op_num_threads = 1
        self.inputs, self.threads, self.dimension = inputs, max(1, threads), dimension
        self.max_seq_length = max_seq_length  # the truncation in effect (capped at the position limit), as the model's
        self._tokenize, self.prompts = tokenize, prompts
        self.session = ort.InferenceSession(str(graph), options, providers=["CPUExecutionProvider"])

    @classmethod
    def from_model(cls, model: "SentenceTransformer", graph: Path, inputs: list[str], threads: int) -> "OnnxEncoder":
        def tokenize(text: str) -> dict:
            tokens = features(model, [text])
            return {n: tokens[n].numpy() for n in inputs}

        return cls(graph, inputs, threads, tokenize=tokenize, dimension=dimension_of(model),
                   prompts={task: task_prompt(model, task) for task in ("query", "document")},
                   max_seq_length=getattr(model, "max_seq_length", None))

    @classmethod
    def from_folder(cls, folder: Path, meta: dict, threads: int, *, max_seq_length: int | None = None,
                    name: str = "") -> "OnnxEncoder | None":
        """The export in ``folder`` alone; ``None`` where it has no text files (a model whose tokenization needs the
        model) or no ``max_seq_length`` is given (the model's own default is in its configuration, not in the
        export). ``max_seq_length``: as :func:`pgrank.models.loading.load_encoder` takes it, capped at the position
        limit with the same warning."""
        if max_seq_length is None or not (folder / TEXT).is_file() or not (folder / TOKENIZER).is_file():
            return None
        from tokenizers import Tokenizer

        text = json.loads((folder / TEXT).read_text(encoding="utf-8"))
        length = capped_length(name, max_seq_length, text["position_limit"])
        tokenizer = Tokenizer.from_file(str(folder / TOKENIZER))
        tokenizer.enable_truncation(int(length), strategy="longest_first", direction=text["truncation_side"])
        tokenizer.no_padding()
        fields = {"input_ids": "ids", "attention_mask": "attention_mask", "token_type_ids": "type_ids"}

        def tokenize(text_: str) -> dict:
            encoding = tokenizer.encode(text_)
            return {n: np.asarray([getattr(encoding, fields[n])], dtype=np.int64) for n in meta["inputs"]}

        return cls(folder / meta["file"], meta["inputs"], threads, tokenize=tokenize, prompts=text["prompts"],
                   dimension=int(text["dimension"]), max_seq_length=int(length))

    @property
    def device(self):
        import torch

        return torch.device("cpu")

    def _feed(self, text: str) -> dict[str, np.ndarray]:
        features_ = self._tokenize(text)
        return {n: np.asarray(features_[n], dtype=np.int64) for n in self.inputs}

    def _run(self, feed: dict[str, np.ndarray]) -> np.ndarray:
        (emb,) = self.session.run([OUTPUT], feed)
        return emb[0]

    def _encode(self, texts, prompt: str) -> np.ndarray:
        """One text per run: no padding, and an int8 embedding (one activation scale per run) depends on its
        text alone, not on the batch it came in.

        ``threads`` runs go at once on one shared session (ONNX Runtime's ``run`` is thread-safe and releases
        the GIL), each single-threaded; texts are tokenized in the calling thread, as the tokenizer is not
        safe to share across threads. A text's embedding is the same whatever the thread count (tested).
        ``python bench/backends.py`` measures the rates (docs/results.md)."""
        out = np.empty((len(texts), self.dimension), np.float32)
        if self.threads == 1 or len(texts) < 2:
            for i, text in enumerate(texts):
                out[i] = self._run(self._feed(prompt + text))
            return out
        from concurrent.futures import ThreadPoolExecutor

        window = 64 * self.threads  # texts tokenized ahead of the runs: bounded, whatever len(texts)
        with ThreadPoolExecutor(min(self.threads, len(texts)), thread_name_prefix="pgrank-onnx") as pool:
            for lo in range(0, len(texts), window):
                part = texts[lo : lo + window]
                out[lo : lo + len(part)] = np.stack(list(pool.map(self._run, (self._feed(prompt + t) for t in part))))
        return out

    def encode_query(self, texts, **_) -> np.ndarray:
        return self._encode(list(texts), self.prompts.get("query") or "")

    def encode_document(self, texts, **_) -> np.ndarray:
        return self._encode(list(texts), self.prompts.get("document") or "")

    def get_sentence_embedding_dimension(self) -> int:
        return self.dimension
