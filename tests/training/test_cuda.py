"""Training on CUDA (``python -m pytest -m gpu``): bf16 steps in both towers, cached-gradient chunking against plain
back-propagation, one-GPU DDP over NCCL, and a whole (tiny) training run. The models are tiny random-weight copies of
the paper's module stacks (``paper_model``: a T5 encoder with a Dense head as gtr-t5-xl, DistilBERT as SBERT), so the
tests need no download."""

from __future__ import annotations

import os
import socket
from pathlib import Path

import pytest
import torch
from toy_project import make_project, plain_backprop, step_of

from pgrank.models.loading import load_encoder

from pgrank.models.names import resolve_model
from pgrank.training.batches import make_batch
from pgrank.training.grad_cache import encode
from pgrank.training.trainer import accumulate_gradients, train

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="a CUDA device is needed")]


def _examples(params, paths, size=6):
    from pgrank.data.candidate_store import open_candidates
    from pgrank.data.corpus_store import open_corpus
    from pgrank.training.batches import TrainingSet

    return TrainingSet(open_candidates(paths, "toy", "train-pg")).examples(range(size)), open_corpus(paths, "toy")


def _model(folder, params, *, train_mode=False):
    model = load_encoder(str(folder), params.models, device="cuda", max_seq_length=params.train.max_doc_length)
    model.similarity_fn_name = params.train.similarity
    return model.train() if train_mode else model.eval()


def _frozen(params, paths, folder, corpus):
    from pgrank.training.batches import frozen_documents

    return frozen_documents(params, paths, resolve_model(str(folder), params.models), corpus)


def _grads(model) -> dict[str, torch.Tensor]:
    return {n: p.grad.detach().float().clone() for n, p in model.named_parameters() if p.grad is not None}


def _cosine(a: dict, b: dict) -> float:
    x = torch.cat([a[n].flatten() for n in sorted(a)])
    y = torch.cat([b[n].flatten() for n in sorted(b)])
    return float(x @ y / (x.norm() * y.norm()))


@pytest.mark.parametrize("kind", ["gtr-t5", "sbert"])
@pytest.mark.parametrize("tower", ["both", "query"])
def test_a_bf16_step_follows_the_float32_gradient_and_keeps_float32_weights(tmp_path, paper_model, kind, tower):
    folder = paper_model(kind)
    params, paths = make_project(tmp_path, folder, overrides={"train.tower": tower, "train.chunk_tokens": 80,
                                                               "train.similarity": "dot"})
    examples, corpus = _examples(params, paths)
    frozen = _frozen(params, paths, folder, corpus) if tower == "query" else None
    grads = {}
    for amp in ("bf16", "off"):
        cfg = params.model_copy(update={"train": params.train.model_copy(update={"amp": amp})})
        model = _model(folder, cfg)
        inputs = step_of(cfg, paths, model, examples, corpus, device="cuda")
        stats = accumulate_gradients(model, inputs, cfg, epoch=1, frozen=frozen)
        assert all(torch.isfinite(torch.tensor(v)) for v in (stats.loss, stats.utility, stats.entropy))
        grads[amp] = _grads(model)
        assert {p.dtype for p in model.parameters()} == {torch.float32}  # master weights stay float32 under autocast
    assert grads["bf16"].keys() == grads["off"].keys() and len(grads["bf16"]) > 5
    assert all(torch.isfinite(g).all() for g in grads["bf16"].values())
    assert _cosine(grads["bf16"], grads["off"]) > 0.9


@pytest.mark.parametrize("kind", ["gtr-t5", "sbert"])
def test_cached_gradient_chunking_equals_plain_backprop_on_cuda(tmp_path, paper_model, kind):
    folder = paper_model(kind)
    params, paths = make_project(tmp_path, folder, overrides={"train.tower": "both", "train.chunk_tokens": 64,
                                                               "train.amp": "off"})
    examples, corpus = _examples(params, paths)
    batch = make_batch(examples, "cuda")
    cached = _model(folder, params)
    torch.backends.cuda.matmul.allow_tf32 = False  # the same float32 arithmetic in both, chunked or not
    try:
        accumulate_gradients(cached, step_of(params, paths, cached, examples, corpus, device="cuda"), params, epoch=1,
                             frozen=None)
        plain = _model(folder, params)
        torch.backends.cuda.matmul.allow_tf32 = False
        plain_backprop(plain, examples, batch, corpus, params, torch.device("cuda"))
    finally:
        torch.set_float32_matmul_precision("high")
    a, b = _grads(cached), _grads(plain)
    assert a.keys() == b.keys() and len(a) > 5
    for name in a:
        scale = b[name].abs().max().item()
        assert (a[name] - b[name]).abs().max().item() <= 1e-4 * scale + 1e-7, name
    assert any(g.abs().sum() > 0 for g in a.values())


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _nccl_worker(rank: int, port: int, folder: str, project: str, out: str) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.distributed.init_process_group("nccl", rank=0, world_size=1)
    try:
        torch.cuda.set_device(0)
        params, paths = make_project(Path(project), Path(folder), overrides={"train.tower": "both"})
        examples, corpus = _examples(params, paths)
        from pgrank.training import distributed

        model = _model(folder, params)
        distributed.freeze_unused(model, lambda m: encode(m, ["probe"], task="query", max_length=8).sum())
        wrapped = torch.nn.parallel.DistributedDataParallel(model, device_ids=[0], output_device=0)
        accumulate_gradients(model, step_of(params, paths, model, examples, corpus, device="cuda"), params, epoch=1,
                             frozen=None,
                             forward=wrapped, no_sync=distributed.no_sync(wrapped))
        torch.save(_grads(model), out)
    finally:
        torch.distributed.destroy_process_group()


def test_one_gpu_ddp_over_nccl_gives_the_single_process_gradient(tmp_path, paper_model):
    import torch.multiprocessing as mp

    if not torch.distributed.is_nccl_available():
        pytest.skip("this torch build has no NCCL")
    folder = paper_model("sbert")
    out = tmp_path / "ddp.pt"
    mp.spawn(_nccl_worker, args=(_free_port(), str(folder), str(tmp_path / "ddp"), str(out)), nprocs=1, join=True)
    params, paths = make_project(tmp_path / "single", folder, overrides={"train.tower": "both"})
    examples, corpus = _examples(params, paths)
    from pgrank.training import distributed

    model = _model(folder, params)
    distributed.freeze_unused(model, lambda m: encode(m, ["probe"], task="query", max_length=8).sum())
    accumulate_gradients(model, step_of(params, paths, model, examples, corpus, device="cuda"), params, epoch=1,
                         frozen=None)
    single, ddp = _grads(model), torch.load(out)
    assert single.keys() == ddp.keys() and len(single) > 5
    for name in single:
        scale = single[name].abs().max().item()
        assert (single[name] - ddp[name].to(single[name].device)).abs().max().item() <= 1e-3 * scale + 1e-8, name


def test_a_whole_training_run_on_cuda_in_both_towers_writes_checkpoints_that_load(tmp_path, paper_model):
    folder = paper_model("gtr-t5")
    params, paths = make_project(tmp_path, folder, overrides={"train.tower": "both", "train.epochs": 1,
                                                               "train.keep_epochs": [0, 1], "train.amp": "bf16"})
    result = train(params, paths, str(folder), device="cuda", progress=False)
    assert [row["epoch"] for row in result.history] == [0, 1]
    assert all(v == v for row in result.history for v in row.values())  # no NaN
    from sentence_transformers import SentenceTransformer

    policy = SentenceTransformer(str(result.final), device="cuda")
    assert [type(m).__name__ for m in policy] == ["Transformer", "Pooling", "Dense", "Normalize"]
    assert policy.encode(["a query"]).shape == (1, 24)


def test_a_packed_bf16_step_reads_the_device_a_handful_of_times(tmp_path, paper_model):
    """The step's synchronisations, counted by CUDA's sync debug mode: its figures read once, the queries' padding
    check once; the gradient norm is the trainer's one read after it."""
    import warnings

    from pgrank.models.packing import packs

    folder = paper_model("sbert")
    params, paths = make_project(tmp_path, folder, overrides={"train.tower": "both", "train.chunk_tokens": 512})
    examples, corpus = _examples(params, paths)
    model = _model(folder, params, train_mode=True)
    inputs = step_of(params, paths, model, examples, corpus, device="cuda")
    assert packs(model) and len(inputs.documents) > 1
    accumulate_gradients(model, inputs, params, epoch=1, frozen=None)  # warm-up
    model.zero_grad(set_to_none=True)
    inputs = step_of(params, paths, model, examples, corpus, device="cuda")
    torch.cuda.synchronize()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        torch.cuda.set_sync_debug_mode("warn")
        try:
            stats = accumulate_gradients(model, inputs, params, epoch=1, frozen=None)
        finally:
            torch.cuda.set_sync_debug_mode("default")
    syncs = [w for w in caught if "synchroniz" in str(w.message)]
    assert torch.isfinite(torch.tensor(stats.loss))
    assert len(syncs) <= 8, [str(w.message) for w in syncs]
