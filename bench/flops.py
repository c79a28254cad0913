"""Arithmetic a benchmark did, and the device's peak it is measured against (``bench/gpu.py``).

* :func:`counted_flops`: the floating-point operations of one call's products with weight matrices (``mm`` and
  ``addmm``: every linear layer, forward and backward), counted by PyTorch's own ``torch.utils.flop_counter.FlopCounterMode``
  as the call runs, on the code path the stages run. Attention's products of queries with keys and of scores with
  values are left out: PyTorch's counter sees some attention kernels and not others (none on a CPU, nor
  variable-length attention), and left out everywhere they make every device's figures comparable. This is the
  usual "2 x parameters per token" arithmetic (DistilBERT: about 86 MFLOP a token forward), so a share of the peak
  is slightly low for long texts (about 3% at 128 tokens and 11% at 512 for DistilBERT).
* :data:`BF16_DENSE_TFLOPS` and :func:`spec_peak`: NVIDIA's published dense (no sparsity) bf16 Tensor Core peak of a
  GPU, looked up by the name CUDA reports; ``None`` for a device the table does not know.
* :func:`measured_peak`: the TFLOPs a large square matrix product reaches on the device in a dtype: the ceiling that
  this machine's PyTorch actually gets, for CPUs (which have no one published figure) and beside a GPU's spec.

A rate's share of a peak is then ``flops per item x items a second / peak`` (:func:`share`); :func:`with_arithmetic`
adds it to a benchmark row with the real tokens a second, and :func:`device_peak` picks the peak of a run: the spec
where the table has the GPU, else the faster of the bf16 and float32 products measured. :func:`rate` times items a
second on a device (CUDA-synchronised), for the peak and for every benchmark rate of ``bench/gpu.py``.
"""

from __future__ import annotations

import re
import time

# Dense bf16 Tensor Core TFLOPS from NVIDIA's data sheets (the "with sparsity" figures halved). Looked up by the
# longest entry that stands as whole words in the device name: "H200 NVL" wins over "H200", and "L4" does not
# match an L40 nor "A10" an A10G.
BF16_DENSE_TFLOPS: dict[str, float] = {
    "H100 80GB HBM3": 989.4,  # H100 SXM5
    "H100 PCIe": 756.0,
    "H100 NVL": 835.5,
    "H200": 989.4,  # H200 SXM
    "H200 NVL": 835.5,
    "A100": 312.0,  # SXM4 and PCIe, 40 and 80 GB
    "L40S": 362.0,
    "L4": 121.0,
    "A10": 125.0,
}


def spec_peak(device_name: str | None) -> float | None:
    """The published dense bf16 peak (TFLOPs) of the GPU called ``device_name``, or ``None`` if not in the table."""
    if not device_name:
        return None
    known = [key for key in BF16_DENSE_TFLOPS if re.search(rf"(^|[\s-]){re.escape(key)}($|[\s-])", device_name)]
    return BF16_DENSE_TFLOPS[max(known, key=len)] if known else None


WEIGHT_PRODUCTS = ("aten.mm", "aten.addmm", "aten._addmm_activation")  # what linear layers run, forward and backward


def counted_flops(fn) -> int:
    """Floating-point operations of ``fn()``'s products with weight matrices (forward and, if it runs one, backward),
    counted as it runs."""
    from torch.utils.flop_counter import FlopCounterMode

    with FlopCounterMode(display=False) as counter:
        fn()
    return int(sum(n for op, n in counter.get_flop_counts()["Global"].items() if str(op) in WEIGHT_PRODUCTS))


def sync(device: str) -> None:
    """Wait for the device's queued work (a CUDA device; nothing to wait for on a CPU)."""
    import torch

    if device.startswith("cuda"):
        torch.cuda.synchronize()


def rate(fn, items: int, device: str, seconds: float) -> float:
    """Items a second of ``fn()`` (which handles ``items``), after one warm-up call, for about ``seconds``."""
    fn()
    sync(device)
    done, started = 0, time.perf_counter()
    while True:
        fn()
        sync(device)
        done += items
        elapsed = time.perf_counter() - started
        if elapsed >= seconds:
            return done / elapsed


def measured_peak(device: str, dtype: str, seconds: float = 1.0, n: int | None = None) -> float:
    """TFLOPs of ``n x n`` by ``n x n`` products in ``dtype`` (``bfloat16`` or ``float32``) on ``device``, repeated
    for about ``seconds`` after one warm-up (``n``: 8192 on a GPU, 1024 on a CPU)."""
    import torch

    n = n or (8192 if device.startswith("cuda") else 1024)
    kind = getattr(torch, dtype)
    generator = torch.Generator(device=device).manual_seed(0)
    a = torch.randn(n, n, device=device, generator=generator).to(kind)
    b = torch.randn(n, n, device=device, generator=generator).to(kind)
    return 2 * n**3 * rate(lambda: a @ b, 1, device, seconds) / 1e12


def real_tokens(model, texts: list[str]) -> float:
    """Mean tokens per text of ``texts`` as ``model`` (or the sentence-transformers model it wraps) cuts them: the
    tokens per item of :func:`with_arithmetic`."""
    st = getattr(model, "model", model)
    ids = st.tokenizer(texts, truncation=True, max_length=st.max_seq_length)["input_ids"]
    return sum(len(x) for x in ids) / len(ids)


def share(flops_per_item: float, items_per_s: float, peak_tflops: float | None) -> float | None:
    """The share of ``peak_tflops`` that ``items_per_s`` items of ``flops_per_item`` each reach (``None``: no peak)."""
    if not peak_tflops:
        return None
    return flops_per_item * items_per_s / (peak_tflops * 1e12)


def with_arithmetic(row: dict, flops_per_item: float, items_per_s: float, tokens_per_item: float, peak: float | None):
    """``row`` with the real tokens a second, the TFLOPs reached and their share of ``peak``."""
    row.update(tokens_per_s=round(items_per_s * tokens_per_item), tflops=round(flops_per_item * items_per_s / 1e12, 2))
    part = share(flops_per_item, items_per_s, peak)
    row["peak_share"] = None if part is None else round(part, 4)
    return row


def percent(part: float | None) -> str:
    """A share as a percentage with one decimal, ``-`` for none."""
    return "-" if part is None else f"{100 * part:.1f}%"


def device_peak(device: str, gpu: str | None) -> dict:
    """The peak that shares are taken of: the GPU's published dense bf16 peak where :data:`BF16_DENSE_TFLOPS`
    has it, else the faster of a bf16 and a float32 dense product measured on it; both measured figures recorded."""
    measured = {dtype: round(measured_peak(device, dtype), 2) for dtype in ("bfloat16", "float32")}
    spec = spec_peak(gpu)
    out = {"measured_tflops": measured, "spec_bf16_tflops": spec}
    if spec:
        out.update(tflops=spec, source=f"dense bf16 peak of the {gpu} (NVIDIA data sheet)")
    else:
        best = max(measured, key=measured.get)
        out.update(tflops=measured[best], source=f"measured: the fastest dense product on the device ({best})")
    print(f"  peak {out['tflops']:,.2f} TFLOPs ({out['source']}); measured products: {measured}", flush=True)
    return out
