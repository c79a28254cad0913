"""Pre-tokenized texts: a corpus (or a split's queries) as one model's token ids, built once, memory-mapped.

Every step that encodes documents with a PyTorch model needs their token ids, and tokenizing strings is host
work that the GPU waits for: MS MARCO's 8.8M passages cost a single thread about 30 minutes per pass, and a
paper-shape training step tokenizes 220,000 passages twice. So the ids are an artifact of their own, keyed
like the corpus embeddings by what they depend on (:meth:`pgrank.paths.Paths.token_store`): the source's
checksum, the tokenizer's identity (:func:`tokenizer_identity`, a digest of the fast tokenizer's whole
definition, the model's prompts and the task) and the maximum length::

    plan.json              what is being tokenized: guards a resume
    part-00000.ids.npy     while building: one block's ids and int64 offsets, each written atomically
    part-00000.offsets.npy
    ids.npy                (T,) int32 token ids of every text, one after the other (the parts joined)
    offsets.npy            (N + 1,) int64: text ``i`` is ``ids[offsets[i]:offsets[i + 1]]``
    meta.json              written last: format, source checksum, tokenizer identity, length, counts

The ids are exactly what the model's own ``preprocess`` gives (special tokens, prompt, truncation), with the
padding removed. Building goes block by block through ``preprocess`` (the fast tokenizer encodes a block on
all cores); an interruption loses at most the block in flight. Joining the parts streams through a memory map,
so building and reading take memory bounded by a block, whatever the corpus. MS MARCO's store is about 2.7 GB.

Example:
    >>> store = corpus_tokens(model, paths, corpus, task="document", max_length=256)
    >>> rows = store.gather([3, 0])
    >>> rows.lengths, rows.ids[: rows.lengths[0]]
"""

from __future__ import annotations

import hashlib
import json
import logging
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from tqdm.auto import tqdm

from pgrank.atomic import atomic_path, clear_stale_lock, exclusive, lock_file, write_json
from pgrank.data.artifact_meta import META, read_meta
from pgrank.data.columns import open_array
from pgrank.errors import DataError

log = logging.getLogger(__name__)

FORMAT = "pgrank-token-store/1"
BLOCK = 16384  # texts per part: the resume granularity and the tokenizer's batch


@dataclass(frozen=True)
class TokenRows:
    """Some texts' token ids: ``ids`` the texts' tokens one after the other (int32), ``lengths`` (n,) int64."""

    ids: np.ndarray
    lengths: np.ndarray

    def __len__(self) -> int:
        return len(self.lengths)

    def take(self, order: np.ndarray) -> "TokenRows":
        """The rows ``order`` (positions into these rows), in that order."""
        starts = np.concatenate([[0], np.cumsum(self.lengths)[:-1]]).astype(np.int64)
        return TokenRows(self.ids[spans(starts[order], self.lengths[order])], self.lengths[order])


def spans(starts: np.ndarray, lengths: np.ndarray) -> np.ndarray:
    """The positions ``starts[i] : starts[i] + lengths[i]`` of every ``i``, one after the other (vectorised)."""
    lengths = np.asarray(lengths, dtype=np.int64)
    total = int(lengths.sum())
    shift = np.repeat(np.asarray(starts, dtype=np.int64) - (np.cumsum(lengths) - lengths), lengths)
    return shift + np.arange(total, dtype=np.int64)


@dataclass(frozen=True)
class TokenStore:
    """A complete store, memory-mapped (see the module docstring). ``len(store)`` is the number of texts."""

    folder: Path
    ids: np.ndarray
    offsets: np.ndarray
    meta: dict

    def __len__(self) -> int:
        return len(self.offsets) - 1

    @property
    def max_length(self) -> int:
        return int(self.meta["max_length"])

    @property
    def features(self) -> dict:
        """How the model's ``preprocess`` lays out a batch: ``pad_id``, ``keys`` (its tensors), ``prompt_length``."""
        return self.meta["features"]

    def lengths(self, rows) -> np.ndarray:
        rows = np.asarray(rows, dtype=np.int64)
        return np.asarray(self.offsets[rows + 1] - self.offsets[rows], dtype=np.int64)

    def gather(self, rows) -> TokenRows:
        """The token ids of ``rows`` (int64 array of row numbers), in that order."""
        rows = np.asarray(rows, dtype=np.int64)
        if len(rows) and (rows.min() < 0 or rows.max() >= len(self)):
            raise KeyError(f"rows outside the {len(self)} texts of {self.folder}")
        starts = np.asarray(self.offsets[rows], dtype=np.int64)
        lengths = np.asarray(self.offsets[rows + 1], dtype=np.int64) - starts
        return TokenRows(np.asarray(self.ids[spans(starts, lengths)]), lengths)


# ------------------------------------------------------------------------------------------- identity


def text_modules(model) -> list:
    """The model's text modules that own a tokenizer (one, or one per route of a ``Router``)."""
    return [m for m in model.modules() if getattr(m, "tokenizer", None) is not None and hasattr(m, "auto_model")]


PROMPT_NAMES = {"query": ("query",), "document": ("document", "passage", "corpus")}


def task_prompt(model, task: str) -> str | None:
    """The prompt sentence-transformers' ``encode_query`` / ``encode_document`` put before a ``task`` text: the
    first of :data:`PROMPT_NAMES` in the model's ``prompts``, else its ``default_prompt_name``'s, else none."""
    prompts = getattr(model, "prompts", None) or {}
    for name in PROMPT_NAMES.get(task, ()):
        if name in prompts:
            return prompts[name] or None
    default = getattr(model, "default_prompt_name", None)
    return (prompts.get(default) or None) if default else None


def tokenizer_identity(model, task: str, max_length: int) -> dict:
    """What the ids of ``task`` texts depend on: every tokenizer's definition (the fast tokenizer's JSON, less its
    truncation and padding settings, which ``preprocess`` sets per call), the length, and the task where a
    ``Router`` sends queries and documents to different modules, and the task's prompt (:func:`task_prompt`) where
    the model has one. ``sha256`` digests it all."""
    parts = []
    for module in [m for m in model.modules() if m is not model and getattr(m, "tokenizer", None) is not None]:
        tok = module.tokenizer
        backend = getattr(tok, "backend_tokenizer", None) or (tok if hasattr(tok, "to_str") else None)
        if backend is not None:
            spec = json.loads(backend.to_str())
            spec.pop("truncation", None)
            spec.pop("padding", None)
        else:  # a slow tokenizer: its vocabulary and settings
            spec = {"vocab": sorted(tok.get_vocab().items()), "init": str(getattr(tok, "init_kwargs", {}))}
        parts.append({"class": type(tok).__name__, "spec": spec, "padding_side": getattr(tok, "padding_side", None)})
    routed = any(type(m).__name__ == "Router" for m in model.modules())
    identity = {"tokenizers": parts, "task": task if routed else None, "max_length": max_length}
    prompt = task_prompt(model, task)
    if prompt:  # only then: stores of models without prompts keep their digests
        identity["prompt"] = prompt
    blob = json.dumps(identity, sort_keys=True, default=str)
    return {"sha256": hashlib.sha256(blob.encode()).hexdigest(), "task": task if routed else None,
            "max_length": max_length}


def tokenize(model, texts: list[str], *, task: str, max_length: int) -> tuple[np.ndarray, np.ndarray, dict]:
    """``(ids, lengths, layout)`` of ``texts`` as the model's ``preprocess`` tokenizes them for ``encode_query`` or
    ``encode_document`` (the task's prompt included, :func:`task_prompt`), padding removed."""
    features = model.preprocess(list(texts), prompt=task_prompt(model, task), task=task, max_length=max_length)
    if "attention_mask" not in features and "offsets" in features:  # an embedding bag (StaticEmbedding): flat ids
        ids = features["input_ids"].numpy().astype(np.int32)
        ends = np.append(features["offsets"].numpy()[1:], len(ids)).astype(np.int64)
        lengths = ends - features["offsets"].numpy().astype(np.int64)
        return ids, lengths, {"bag": True, "pad_id": 0, "keys": ["input_ids", "offsets"], "padding_side": "right",
                              "prompt_length": None}
    mask = features["attention_mask"].bool()
    ids = features["input_ids"][mask].numpy().astype(np.int32)
    lengths = mask.sum(1).numpy().astype(np.int64)
    types = features.get("token_type_ids")
    if types is not None and bool(types.any()):
        raise DataError("pre-tokenized texts need single-segment inputs; this model's tokenizer gave token type ids")
    pad = [m.tokenizer.pad_token_id for m in text_modules(model)][:1] or [0]
    keys = sorted(k for k, v in features.items() if hasattr(v, "shape") and getattr(v, "ndim", 0) == 2)
    prompt = features.get("prompt_length")
    sides = [m.tokenizer.padding_side for m in text_modules(model)][:1] or ["right"]
    layout = {"pad_id": int(pad[0] or 0), "keys": keys, "padding_side": sides[0],
              "prompt_length": None if prompt is None else int(prompt.reshape(-1)[0] if hasattr(prompt, "reshape") else prompt)}
    return ids, lengths, layout


# ------------------------------------------------------------------------------------------- build


def _part(folder: Path, i: int, what: str) -> Path:
    return folder / f"part-{i:05d}.{what}.npy"


def _part_done(folder: Path, i: int, rows: int) -> bool:
    try:
        offsets = np.load(_part(folder, i, "offsets"), mmap_mode="r")
        ids = np.load(_part(folder, i, "ids"), mmap_mode="r")
    except (OSError, ValueError):
        return False
    return len(offsets) == rows + 1 and int(offsets[-1]) == len(ids)


def _start_or_resume(folder: Path, plan: dict) -> None:
    path = folder / "plan.json"
    if path.is_file():
        try:
            if json.loads(path.read_text(encoding="utf-8")) == plan:
                return
        except ValueError:
            pass
        log.warning("%s: partial token store from another plan; starting over", folder)
    for stale in folder.glob("part-*.npy"):
        stale.unlink()
    write_json(path, plan)


def build_token_store(model, texts: Callable[[int, int], list[str]], num_texts: int, folder: str | Path, *,
                      task: str, max_length: int, source: dict, block: int = BLOCK,
                      progress: bool = False) -> TokenStore:
    """Tokenize ``num_texts`` texts (``texts(lo, hi)`` gives rows ``lo:hi``) into ``folder``, resuming from
    finished parts; under the folder's lock, so that one process builds and the others wait and read it.

    Args:
        source: what the texts are (``name``, ``sha256``: the checksum the folder is keyed by), recorded.
    """
    folder = Path(folder)
    identity = tokenizer_identity(model, task, max_length)
    if (folder / META).is_file():
        clear_stale_lock(lock_file(folder))
        return open_token_store(folder, identity)
    if not num_texts:
        raise DataError(f"{source.get('name', folder)}: nothing to tokenize (no texts)")
    with exclusive(lock_file(folder), what=f"the token store {folder}"):
        if (folder / META).is_file():
            return open_token_store(folder, identity)
        folder.mkdir(parents=True, exist_ok=True)
        plan = {"source": source, "tokenizer": identity["sha256"], "task": identity["task"], "max_length": max_length,
                "num_texts": num_texts, "block": block}
        _start_or_resume(folder, plan)
        parts = -(-num_texts // block)
        layout = None
        bar = tqdm(total=num_texts, unit="text", desc=f"tokenizing {source.get('name', '')}", disable=not progress,
                   leave=False, mininterval=1.0)
        for i in range(parts):
            lo, hi = i * block, min((i + 1) * block, num_texts)
            if layout is not None and _part_done(folder, i, hi - lo):
                bar.update(hi - lo)
                continue
            ids, lengths, layout = tokenize(model, texts(lo, hi), task=task, max_length=max_length)
            if not _part_done(folder, i, hi - lo):
                for what, arr in (("ids", ids), ("offsets", np.concatenate([[0], np.cumsum(lengths)]))):
                    with atomic_path(_part(folder, i, what)) as tmp, open(tmp, "wb") as fh:
                        np.save(fh, arr)
            bar.update(hi - lo)
        bar.close()
        total = sum(int(np.load(_part(folder, i, "offsets"), mmap_mode="r")[-1]) for i in range(parts))
        with atomic_path(folder / "ids.npy") as tmp:
            ids_out = np.lib.format.open_memmap(tmp, mode="w+", dtype=np.int32, shape=(total,))
            offsets = np.empty(num_texts + 1, dtype=np.int64)
            offsets[0], at = 0, 0
            for i in range(parts):
                part_offsets = np.load(_part(folder, i, "offsets"))
                part_ids = np.load(_part(folder, i, "ids"), mmap_mode="r")
                ids_out[at : at + len(part_ids)] = part_ids
                lo = i * block
                offsets[lo + 1 : lo + len(part_offsets)] = part_offsets[1:] + at
                at += len(part_ids)
            ids_out.flush()
            del ids_out
        with atomic_path(folder / "offsets.npy") as tmp, open(tmp, "wb") as fh:
            np.save(fh, offsets)
        meta = {"format": FORMAT, "source": source, "tokenizer": identity, "max_length": max_length,
                "task": identity["task"], "num_texts": num_texts, "num_tokens": total, "features": layout}
        write_json(folder / META, meta)
        for stale in folder.glob("part-*.npy"):
            stale.unlink()
        log.info("%s: %d texts, %d tokens -> %s", source.get("name", ""), num_texts, total, folder)
        return open_token_store(folder, identity)


# ------------------------------------------------------------------------------------------- read


def open_token_store(folder: str | Path, identity: dict | None = None) -> TokenStore:
    """Open a complete store, checked: its tokenizer is ``identity``'s (when given), and its offsets are whole.

    Raises:
        DataError: no or a damaged ``meta.json``; built with another tokenizer; a damaged offsets file.
    """
    folder = Path(folder)
    remedy = f"delete {folder} and the next stage tokenizes the texts again"
    meta = read_meta(folder, FORMAT, missing="not a complete token store (no meta.json)", remedy=remedy,
                     keys=("tokenizer", "max_length", "num_texts", "num_tokens", "features"))
    if identity is not None and meta["tokenizer"].get("sha256") != identity["sha256"]:
        raise DataError(f"{folder}: tokenized with another tokenizer than the model's (tokenizer "
                        f"{str(meta['tokenizer'].get('sha256'))[:12]}, the model's {identity['sha256'][:12]}); {remedy}")
    path = folder / "offsets.npy"
    try:
        offsets, ids = open_array(path), open_array(folder / "ids.npy")
    except (OSError, ValueError) as exc:
        raise DataError(f"{path}: unreadable ({exc}); {remedy}") from None
    n, max_length = int(meta["num_texts"]), int(meta["max_length"])
    if offsets.ndim != 1 or len(offsets) != n + 1 or offsets.dtype != np.int64:
        raise DataError(f"{path}: damaged: {offsets.shape} {offsets.dtype} offsets for {n} texts; {remedy}")
    lengths = np.diff(offsets)
    bounded = not meta["features"].get("bag")  # an embedding bag's tokenizer does not truncate
    if int(offsets[0]) != 0 or int(offsets[-1]) != len(ids) or len(ids) != int(meta["num_tokens"]) \
            or (n and (lengths.min() < 0 or (bounded and lengths.max() > max_length))):
        raise DataError(f"{path}: damaged: offsets do not cut {len(ids)} token ids into {n} texts of at most "
                        f"{max_length} tokens; {remedy}")
    return TokenStore(folder, ids, offsets, meta)


def blocks_of(column) -> Callable[[int, int], list[str]]:
    """``texts(lo, hi)`` of a string column (a candidate store's queries)."""
    return lambda lo, hi: [column[i] for i in range(lo, hi)]


def corpus_blocks(corpus) -> Callable[[int, int], list[str]]:
    """``texts(lo, hi)`` of a corpus store: one read per block."""
    return lambda lo, hi: next(corpus.text_blocks(lo, hi, block=hi - lo))[1]


def corpus_tokens(model, paths, corpus, *, task: str = "document", max_length: int, progress: bool = False,
                  build: bool = True) -> TokenStore | None:
    """The token store of a corpus store's texts for ``model`` (built on first use; ``build=False``: ``None`` where
    it has not been built)."""
    identity = tokenizer_identity(model, task, max_length)
    name = corpus.meta.get("dataset", corpus.folder.name)
    folder = paths.token_store(name, identity["sha256"], max_length, corpus.sha256)
    if not build and not (folder / META).is_file():
        return None
    return build_token_store(model, corpus_blocks(corpus), len(corpus), folder, task=task, max_length=max_length,
                             source={"name": name, "sha256": corpus.sha256, "kind": "corpus"}, progress=progress)


def query_tokens(model, paths, store, *, max_length: int) -> TokenStore:
    """The token store of a candidate store's queries for ``model`` (built on first use)."""
    identity = tokenizer_identity(model, "query", max_length)
    sha = store.meta.get("sha256") or hashlib.sha256(str(store.folder).encode()).hexdigest()
    name = f"{store.meta.get('dataset', 'queries')}-{store.meta.get('split', store.folder.name)}-queries"
    folder = paths.token_store(name, identity["sha256"], max_length, sha)
    return build_token_store(model, blocks_of(store.queries), len(store), folder, task="query", max_length=max_length,
                             source={"name": name, "sha256": sha, "kind": "queries"})
