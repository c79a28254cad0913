"""The machine a benchmark ran on, recorded beside its figures (``bench/out/*.json``).

CPU model, the instruction-set flags that decide pgrank's CPU backends (AVX2, AVX-512, VNNI, AMX), cores, memory,
the GPUs torch sees (name, memory, compute capability, driver and CUDA versions), and the versions of the libraries
whose kernels the figures measure.

Example:
    >>> record = machine_record()
    >>> record["cores"], record["gpu"]
    (2, None)
"""

from __future__ import annotations

import os
import platform
from importlib import metadata
from pathlib import Path

LIBRARIES = ("torch", "transformers", "sentence-transformers", "onnxruntime", "faiss-cpu", "faiss-gpu", "numpy",
             "tokenizers", "bm25s")
FLAGS = ("avx2", "fma", "avx512f", "avx512_vnni", "avx512_bf16", "amx_bf16", "amx_int8", "amx_tile")


def _cpuinfo() -> tuple[str, list[str]]:
    try:
        text = Path("/proc/cpuinfo").read_text(encoding="utf-8", errors="replace")
    except OSError:
        return platform.processor() or platform.machine(), []
    model, flags = platform.processor(), set()
    for line in text.splitlines():
        key, _, value = line.partition(":")
        if key.strip() == "model name" and value.strip():
            model = value.strip()
        elif key.strip() == "flags":
            flags = set(value.split())
    return model, [f for f in FLAGS if f in flags]


def _memory_gib() -> float | None:
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal:"):
                return round(int(line.split()[1]) / 2**20, 1)
    except OSError:
        pass
    return None


def _gpus() -> list[dict]:
    try:
        import torch
    except ImportError:
        return []
    if not torch.cuda.is_available():
        return []
    out = []
    for i in range(torch.cuda.device_count()):
        p = torch.cuda.get_device_properties(i)
        out.append({"name": p.name, "memory_gib": round(p.total_memory / 2**30, 1),
                    "capability": f"{p.major}.{p.minor}", "multiprocessors": p.multi_processor_count})
    return out


def _driver() -> str | None:
    """The NVIDIA kernel module's version ("NVRM version: NVIDIA UNIX Open Kernel Module for x86_64  580.159.04 ...")."""
    import re

    try:
        found = re.search(r"Kernel Module.*?\s(\d+\.\d+(?:\.\d+)?)\b", Path("/proc/driver/nvidia/version").read_text())
    except OSError:
        return None
    return found.group(1) if found else None


def machine_record() -> dict:
    """Everything above as one JSON-ready dict."""
    model, flags = _cpuinfo()
    versions = {}
    for name in LIBRARIES:
        try:
            versions[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            continue
    gpus = _gpus()
    cuda = None
    if gpus:
        import torch

        cuda = torch.version.cuda
    return {"cpu": model, "cpu_flags": flags, "cores": os.cpu_count(), "memory_gib": _memory_gib(),
            "gpu": gpus[0]["name"] if gpus else None, "gpus": gpus, "nvidia_driver": _driver(), "cuda": cuda,
            "python": platform.python_version(), "platform": platform.platform(), "libraries": versions}
