"""Multi-GPU / multi-node data parallelism through ``torchrun`` and PyTorch DDP.

``torchrun --nproc-per-node=G -m cli train`` (the ``pgrank`` CLI module, run once per GPU) sets ``RANK``, ``WORLD_SIZE`` and ``LOCAL_RANK``; :func:`setup` reads them, initialises the process
group (NCCL on CUDA, gloo on CPU) and pins each process to its GPU. Every process takes a disjoint
shard of each global batch (:func:`shard`), the model is wrapped in ``DistributedDataParallel``, and
gradients are averaged by DDP's all-reduce. Since the loss is a mean over queries and every rank holds
the same number of queries, the averaged gradient equals single-process training on the whole batch
(tested with two gloo processes). Validation is sharded the same way (every rank reranks its share of
the validation queries; :func:`gather_dicts` joins their per-query metrics), so no rank idles in a
barrier while another validates. Rank 0 alone writes checkpoints and talks to MLflow; the process
group's timeout comes from ``train.ddp_timeout_minutes``.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TypeVar

import torch

T = TypeVar("T")


@dataclass(frozen=True)
class World:
    rank: int = 0
    size: int = 1
    local_rank: int = 0

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    @property
    def distributed(self) -> bool:
        return self.size > 1


def setup(device: str | None = None, *, timeout_minutes: float = 120) -> tuple[World, torch.device]:
    """Read torchrun's environment; initialise the process group when ``WORLD_SIZE > 1``.

    Args:
        device: ``cpu``, ``cuda``, ``cuda:1`` (default: CUDA when present).
        timeout_minutes: how long a collective may wait for the other ranks (``train.ddp_timeout_minutes``:
            NCCL's default of 10 minutes is shorter than rank 0 saving a large checkpoint).

    Returns:
        The world and the device this process should use.
    """
    size = int(os.environ.get("WORLD_SIZE", "1"))
    world = World(int(os.environ.get("RANK", "0")), size, int(os.environ.get("LOCAL_RANK", "0")))
    if device is None:
        device = "cuda" if torch.cuda.is_available() else "cpu"
    dev = torch.device(device)
    if dev.type == "cuda" and dev.index is None:
        dev = torch.device("cuda", world.local_rank if world.distributed else torch.cuda.current_device())
        torch.cuda.set_device(dev)
    if world.distributed and not torch.distributed.is_initialized():
        from datetime import timedelta

        torch.distributed.init_process_group(backend="nccl" if dev.type == "cuda" else "gloo",
                                             timeout=timedelta(minutes=timeout_minutes))
    return world, dev


def teardown(world: World) -> None:
    if world.distributed and torch.distributed.is_initialized():
        torch.distributed.destroy_process_group()


def shard(items: Sequence[T], world: World) -> list[T]:
    """This rank's share of a global batch: items ``rank, rank + size, ...``."""
    return list(items[world.rank :: world.size])


def freeze_unused(model: torch.nn.Module, probe) -> list[str]:
    """Stop training parameters that ``probe(model)`` (a scalar) does not depend on; return their names.

    Hub checkpoints carry weights sentence-transformers never uses (BERT's pooler under mean
    pooling). DDP without unused-parameter search never marks their bucket ready and then silently
    skips the all-reduce of every later bucket; DDP with it misjudges parameters here (both caught
    by the DDP test). Freezing them makes every remaining parameter used by every forward.
    """
    model.zero_grad(set_to_none=True)
    probe(model).backward()
    unused = [n for n, p in model.named_parameters() if p.requires_grad and p.grad is None]
    for name, param in model.named_parameters():
        if name in unused:
            param.requires_grad_(False)
    model.zero_grad(set_to_none=True)
    return unused


def wrap(model: torch.nn.Module, world: World, device: torch.device) -> torch.nn.Module:
    """``DistributedDataParallel(model)`` when distributed, else the model itself.

    Call :func:`freeze_unused` first: every trainable parameter must take part in every forward.
    """
    if not world.distributed:
        return model
    from torch.nn.parallel import DistributedDataParallel

    ids = [device.index] if device.type == "cuda" else None
    return DistributedDataParallel(model, device_ids=ids, output_device=ids[0] if ids else None)


def no_sync(wrapped: torch.nn.Module):
    """A factory for DDP's ``no_sync`` (local gradient accumulation); ``None`` when not wrapped."""
    if hasattr(wrapped, "no_sync"):
        return wrapped.no_sync
    return None


def barrier(world: World) -> None:
    if world.distributed:
        torch.distributed.barrier()


def gather_dicts(part: dict, world: World) -> dict:
    """The union of every rank's ``part`` (disjoint keys), on every rank: sharded validation's reduce.
    Only small values travel (per-query metrics: 7000 queries x 5 numbers)."""
    if not world.distributed:
        return dict(part)
    parts: list = [None] * world.size
    torch.distributed.all_gather_object(parts, part)
    out: dict = {}
    for p in parts:
        out.update(p)
    return out


def all_mean(value: float, world: World, device: torch.device) -> float:
    """Mean of a scalar over ranks (for logging)."""
    if not world.distributed:
        return value
    t = torch.tensor([value], dtype=torch.float64, device=device)
    torch.distributed.all_reduce(t)
    return t.item() / world.size

