"""The oldest torch pgrank runs on (``pyproject.toml``'s floor), and one clear error below it.

The floor is the first release with every API pgrank's CUDA path calls. The newest of them is the ``scale``
argument of ``torch.nn.attention.varlen.varlen_attn`` (FlashAttention's variable-length kernel, which packed
attention calls with the model's own scaling: :mod:`pgrank.models.packed_attention`): torch 2.10 has ``varlen_attn``
without it, 2.11 with it. The others are older: the fused AdamW of every device
(``torch.utils._foreach_utils._get_fused_kernels_supported_devices``), nested jagged tensors through
``scaled_dot_product_attention``, ``torch.compile`` with dynamic marks, ``torch.cuda``'s RNG states.

Below the floor, the first packed encoding on CUDA would fail with a ``TypeError`` deep in a stage (a validation,
a corpus encoding); :func:`require` says so at once instead, as one ``pgrank: error:`` line.
"""

from __future__ import annotations

import re

FLOOR = "2.11"


def _release(version: str) -> tuple[int, int]:
    found = re.match(r"(\d+)\.(\d+)", version)
    return (int(found.group(1)), int(found.group(2))) if found else (0, 0)


def installed() -> str:
    """The installed torch's version, read from its metadata (no import of torch: the CLI checks it at every
    command)."""
    from importlib import metadata

    try:
        return metadata.version("torch")
    except metadata.PackageNotFoundError:  # a torch built from source without metadata
        import torch

        return torch.__version__


def missing(version: str | None = None, *, signature: bool = False) -> str | None:
    """What the installed torch (or one of ``version``) lacks of the floor, or ``None`` when it has it all;
    ``signature``: also check the installed ``varlen_attn`` for its ``scale`` argument."""
    version = version or installed()
    if _release(version) < _release(FLOOR):
        return f"torch {version} is older than {FLOOR}"
    if signature:
        import inspect

        try:
            from torch.nn.attention.varlen import varlen_attn
        except ImportError:
            return f"torch {version} has no torch.nn.attention.varlen"
        if "scale" not in inspect.signature(varlen_attn).parameters:
            return f"torch {version}'s torch.nn.attention.varlen.varlen_attn takes no scale argument"
    return None


def require(version: str | None = None, *, signature: bool = False) -> None:
    """Raise a :class:`pgrank.errors.PgrankError` naming the fix when the installed torch is below the floor
    (``signature``: see :func:`missing`)."""
    from pgrank.errors import PgrankError

    lack = missing(version, signature=signature)
    if lack:
        raise PgrankError(f"{lack}: pgrank's CUDA path calls torch.nn.attention.varlen.varlen_attn(..., scale=...), "
                          f"first in torch {FLOOR}; install torch>={FLOOR} (pip install 'torch>={FLOOR}')")
