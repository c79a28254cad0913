"""A corpus's token store encoded on several devices at once: one process per device, each with its own model.

The token path (:func:`pgrank.retrieval.dense.encoding.encode_token_rows`) leaves the host nothing to tokenize, so a
GPU needs one process to keep it busy; on several GPUs a :class:`TokenPool` starts one process on each (spawned,
as CUDA requires), hands each a copy of the model (in its own precision: bf16 weights on CUDA under
``models.backend: auto``) and the token store's folder, which every process memory-maps, and splits each range of
rows it is asked for between them. Each process switches packing on for its copy
(:func:`pgrank.models.packing.enable_packing_for`) and encodes its part exactly as one process would; the parts
come back as float32 arrays and are joined in row order. A process that fails or dies stops the pool with its
error, never a hang.

Example:
    >>> with TokenPool(model, store, ["cuda:0", "cuda:1"], budget=128 * 256) as pool:
    ...     emb = pool.encode(0, 65536)   # float32 (65536, dim), rows 0:65536 of the store
"""

from __future__ import annotations

import queue
import traceback

import numpy as np

from pgrank.errors import PgrankError

POLL_S = 2.0  # how often a wait for results checks that the processes are alive


class TokenPool:
    """One process per entry of ``devices`` encoding rows of ``store`` (a :class:`pgrank.data.token_store.TokenStore`)
    with a copy of ``model``, in token-budget chunks of ``budget`` tokens."""

    def __init__(self, model, store, devices: list[str], *, budget: int, task: str = "document"):
        import torch

        ctx = torch.multiprocessing.get_context("spawn")
        self.tasks, self.results = ctx.Queue(), ctx.Queue()
        home = next(model.parameters()).device
        model.to("cpu")  # each process gets its copy through pickling, then moves it to its device
        try:
            self.processes = [ctx.Process(target=_work, args=(device, model, str(store.folder), budget, task,
                                                              self.tasks, self.results), daemon=True)
                              for device in devices]
            for process in self.processes:
                process.start()
        finally:
            model.to(home)

    def __enter__(self) -> "TokenPool":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def encode(self, lo: int, hi: int) -> np.ndarray:
        """float32 embeddings of the store's rows ``lo:hi``, split between the processes."""
        cuts = np.linspace(lo, hi, len(self.processes) + 1).round().astype(np.int64)
        parts = [(i, int(a), int(b)) for i, (a, b) in enumerate(zip(cuts[:-1], cuts[1:])) if b > a]
        for part in parts:
            self.tasks.put(part)
        done: dict[int, np.ndarray] = {}
        while len(done) < len(parts):
            try:
                i, emb = self.results.get(timeout=POLL_S)
            except queue.Empty:
                dead = [p.exitcode for p in self.processes if not p.is_alive()]
                if dead:
                    raise PgrankError(f"an encoding process exited (exit code {dead[0]}) while encoding rows "
                                      f"{lo}:{hi}") from None
                continue
            if isinstance(emb, str):
                raise PgrankError(f"an encoding process failed on rows {lo}:{hi}:\n{emb}")
            done[i] = emb
        return np.concatenate([done[i] for i, _, _ in parts])

    def close(self) -> None:
        for _ in self.processes:
            self.tasks.put(None)
        for process in self.processes:
            process.join(timeout=30)
            if process.is_alive():
                process.terminate()
                process.join()


def _work(device: str, model, folder: str, budget: int, task: str, tasks, results) -> None:
    """One process of the pool: its copy of the model on ``device``, the store memory-mapped, parts until ``None``."""
    from pgrank.data.token_store import open_token_store
    from pgrank.models.packed_attention import register
    from pgrank.models.packing import enable_packing_for
    from pgrank.retrieval.dense.encoding import encode_token_rows

    register()  # a copy of a model that packs already names the packed attention, which this process registers
    model.to(device).eval()
    store = open_token_store(folder)
    enable_packing_for(model, store)
    for part in iter(tasks.get, None):
        i, lo, hi = part
        try:
            emb = encode_token_rows(model, store.gather(np.arange(lo, hi)), store.features, budget=budget, task=task)
        except Exception:  # noqa: BLE001 - reported to the parent, which stops the pool with it
            results.put((i, traceback.format_exc()))
        else:
            results.put((i, emb))
