"""The paper's encoders, module for module, with random weights and tokenizers built in code (no download).

For benchmarks on machines without network access (``bench/gpu.py``) and for the paper-smoke profile
(``bench/paper_smoke.py``), which must run every kind of model the paper runs without fetching any:

========== ================================================================ ==========================
name       module stack (as on the hub)                                     stands in for
========== ================================================================ ==========================
gtr-t5     T5 encoder, mean pooling, Dense (no bias, identity), Normalize;  sentence-transformers/gtr-t5-xl
           a SentencePiece-style Unigram tokenizer (T5's ``</s>`` and ``<pad>``)
sbert      DistilBERT, mean pooling; dot-product similarity;                 .../msmarco-distilbert-dot-v5
           a WordPiece tokenizer (lower case, ``[CLS] ... [SEP]``)
tas-b      DistilBERT, CLS pooling; dot-product similarity                   .../msmarco-distilbert-base-tas-b
splade     DistilBERT with its masked-language-model head, SPLADE pooling    naver/splade_v2_distil
           (max over tokens of log(1 + relu(logits)))
========== ================================================================ ==========================

Sizes: ``paper`` has the real dimensions (gtr-t5-xl's encoder: d_model 2048, 24 layers, 32 heads, gated-GELU
feed-forward of 5120, 1.2B parameters; DistilBERT: 6 layers of 768, 66M), for throughput and memory;
``tiny`` keeps every module but shrinks the widths, for a pipeline that must finish in minutes on a CPU;
``depth`` keeps the paper models' depth and vocabulary at a width of 8.

The vocabulary is :func:`words`: deterministic pseudo-words (so synthetic text tokenizes into about one
token per word, as English does with real vocabularies), plus single characters (and WordPiece's
``##`` continuations), so that no text maps to the unknown token.

Example:
    >>> folder = build("sbert", Path("/tmp/sbert-tiny"), size="tiny")
    >>> SentenceTransformer(str(folder)).encode(["a query"]).shape
    (1, 32)
"""

from __future__ import annotations

import string
from pathlib import Path

# Widths by size. Vocabulary sizes are the real models' (T5: 32,000 pieces + 100 sentinels, padded to 32,128
# embedding rows; DistilBERT uncased: 30,522) at paper size.
SIZES = {
    "paper": {
        "t5": dict(d_model=2048, d_ff=5120, d_kv=64, num_heads=32, num_layers=24, vocab=32_000, dense=768),
        "distilbert": dict(dim=768, hidden_dim=3072, n_layers=6, n_heads=12, vocab=30_522),
    },
    "tiny": {
        "t5": dict(d_model=32, d_ff=64, d_kv=8, num_heads=4, num_layers=2, vocab=4_000, dense=24),
        "distilbert": dict(dim=32, hidden_dim=64, n_layers=2, n_heads=2, vocab=4_000),
    },
    # The paper models' depth and vocabulary at a width whose arithmetic costs nearly nothing: what a step costs
    # beyond its arithmetic (bench/step_overhead.py).
    "depth": {
        "t5": dict(d_model=8, d_ff=8, d_kv=4, num_heads=2, num_layers=24, vocab=32_000, dense=8),
        "distilbert": dict(dim=8, hidden_dim=8, n_layers=6, n_heads=2, vocab=30_522, attention_dropout=0.0),
    },
}
KINDS = ("gtr-t5", "sbert", "tas-b", "splade")
CONSONANTS, VOWELS = "bcdfghjklmnprstvwz", "aeiou"


def words(n: int) -> list[str]:
    """``n`` distinct lower-case pseudo-words, shortest first, the same for every call (no randomness)."""
    syllables = [c + v for c in CONSONANTS for v in VOWELS]
    out: list[str] = []
    level = [""]
    while len(out) < n:
        level = [w + s for w in level for s in syllables]
        out.extend(level[: n - len(out)])
    return out


def _wordpiece(folder: Path, vocab_size: int):
    from transformers import DistilBertTokenizer

    specials = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
    chars = list(string.ascii_lowercase + string.digits + string.punctuation)
    pieces = specials + chars + ["##" + c for c in string.ascii_lowercase + string.digits]
    pieces += words(vocab_size - len(pieces))
    tokenizer = DistilBertTokenizer(vocab={p: i for i, p in enumerate(pieces)}, do_lower_case=True)
    tokenizer.model_max_length = 512
    tokenizer.save_pretrained(folder)
    return tokenizer


def _unigram(folder: Path, vocab_size: int):
    """A Unigram (SentencePiece) tokenizer laid out as T5's: ``<pad>`` 0, ``</s>`` 1, ``<unk>`` 2, word pieces
    ``▁word`` with log-probabilities by rank, single characters last, and T5's 100 sentinel tokens."""
    import math

    from transformers import T5Tokenizer

    chars = list(string.ascii_lowercase + string.digits + string.punctuation)
    body = words(vocab_size - 4 - len(chars))
    vocab = [("<pad>", 0.0), ("</s>", 0.0), ("<unk>", 0.0), ("▁", -2.0)]
    vocab += [("▁" + w, -3.0 - math.log(1 + i)) for i, w in enumerate(body)]
    vocab += [(c, -20.0) for c in chars]
    tokenizer = T5Tokenizer(vocab=vocab, extra_ids=100)
    tokenizer.model_max_length = 512
    tokenizer.save_pretrained(folder)
    return tokenizer


def _distilbert(hf: Path, size: str, *, masked_lm: bool) -> None:
    from transformers import DistilBertConfig, DistilBertForMaskedLM, DistilBertModel

    dims = SIZES[size]["distilbert"]
    tokenizer = _wordpiece(hf, dims["vocab"])
    config = DistilBertConfig(vocab_size=len(tokenizer), dim=dims["dim"], hidden_dim=dims["hidden_dim"],
                              n_layers=dims["n_layers"], n_heads=dims["n_heads"], max_position_embeddings=512,
                              pad_token_id=tokenizer.pad_token_id, attention_dropout=dims.get("attention_dropout", 0.1))
    (DistilBertForMaskedLM if masked_lm else DistilBertModel)(config).save_pretrained(hf, safe_serialization=True)


def build(kind: str, folder: Path, *, size: str = "tiny", seed: int = 0) -> Path:
    """Write a sentence-transformers model of ``kind`` (:data:`KINDS`) at ``size`` into ``folder`` (reused if there).

    Returns:
        ``folder``, loadable with ``SentenceTransformer`` (``SparseEncoder`` for ``splade``).
    """
    import torch
    from sentence_transformers import SentenceTransformer
    from sentence_transformers.models import Dense, Normalize, Pooling, Transformer

    if kind not in KINDS:
        raise ValueError(f"unknown model kind {kind!r}; expected one of {', '.join(KINDS)}")
    folder = Path(folder)
    if (folder / "modules.json").is_file():
        return folder
    torch.manual_seed(seed)
    hf = folder.with_name(folder.name + ".hf")
    hf.mkdir(parents=True, exist_ok=True)
    if kind == "gtr-t5":
        from transformers import T5Config, T5EncoderModel

        dims = SIZES[size]["t5"]
        tokenizer = _unigram(hf, dims["vocab"])
        config = T5Config(vocab_size=len(tokenizer) + (-len(tokenizer)) % 128, d_model=dims["d_model"], d_ff=dims["d_ff"],
                          d_kv=dims["d_kv"], num_heads=dims["num_heads"], num_layers=dims["num_layers"],
                          feed_forward_proj="gated-gelu", decoder_start_token_id=0, pad_token_id=0, eos_token_id=1)
        T5EncoderModel(config).save_pretrained(hf, safe_serialization=True)
        word = Transformer(str(hf), max_seq_length=512)
        width = word.get_embedding_dimension()
        modules = [word, Pooling(width, pooling_mode="mean"),
                   Dense(width, dims["dense"], bias=False, activation_function=torch.nn.Identity()), Normalize()]
        SentenceTransformer(modules=modules, device="cpu", similarity_fn_name="cosine").save(str(folder))
    elif kind == "splade":
        from sentence_transformers import SparseEncoder
        from sentence_transformers.sparse_encoder.modules import MLMTransformer, SpladePooling

        _distilbert(hf, size, masked_lm=True)
        SparseEncoder(modules=[MLMTransformer(str(hf), max_seq_length=512), SpladePooling("max")],
                      device="cpu").save(str(folder))
    else:
        _distilbert(hf, size, masked_lm=False)
        word = Transformer(str(hf), max_seq_length=512)
        pooling = Pooling(word.get_embedding_dimension(), pooling_mode="mean" if kind == "sbert" else "cls")
        SentenceTransformer(modules=[word, pooling], device="cpu", similarity_fn_name="dot").save(str(folder))
    import shutil

    shutil.rmtree(hf)
    return folder


def text_of_length(tokens: int, seed: int = 0, vocabulary: int = 2_000) -> str:
    """A text of ``tokens`` pseudo-words (about as many tokens under either tokenizer above)."""
    pool = words(vocabulary)
    return " ".join(pool[(seed * 7919 + i * 104729) % vocabulary] for i in range(tokens))
