"""The training stage on a toy BEIR project with a tiny in-code BERT (real scifact run: -m integration)."""

from __future__ import annotations

import hashlib
import os
import socket
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file
from toy_project import make_project, plain_backprop, step_of

from pgrank import tracking
from pgrank.models.checkpoint_meta import read_checkpoint_meta
from pgrank.models.loading import load_encoder
from pgrank.training import checkpoints
from pgrank.training.batches import make_batch
from pgrank.data.token_store import TokenRows, corpus_tokens, tokenize
from pgrank.models.packing import packs, run_chunk, scatter
from pgrank.training.grad_cache import encode, encode_cached, token_chunks
from pgrank.training.trainer import TrainingError, accumulate_gradients, train


def _tiny(path, eval_mode=True):
    from sentence_transformers import SentenceTransformer

    model = SentenceTransformer(str(path), device="cpu")
    return model.eval() if eval_mode else model.train()


def _toy_batch(params, paths, split="train-pg", size=4):
    from pgrank.data.candidate_store import open_candidates
    from pgrank.data.corpus_store import open_corpus
    from pgrank.training.batches import TrainingSet

    examples = TrainingSet(open_candidates(paths, "toy", split)).examples(range(size))
    return examples, open_corpus(paths, "toy")


def _grads(model):
    return {n: p.grad.detach().clone() for n, p in model.named_parameters() if p.grad is not None}


def test_cached_gradient_chunking_equals_full_backprop(tmp_path, tiny_model_dir):
    params, paths = make_project(tmp_path, tiny_model_dir, overrides={"train.tower": "both", "train.chunk_tokens": 40})
    examples, corpus = _toy_batch(params, paths)
    batch = make_batch(examples)
    cached = _tiny(tiny_model_dir)
    inputs = step_of(params, paths, cached, examples, corpus)
    assert len(inputs.documents) > 2 and packs(cached)  # several packed chunks
    accumulate_gradients(cached, inputs, params, epoch=1, frozen=None)

    plain = _tiny(tiny_model_dir)
    plain_backprop(plain, examples, batch, corpus, params)
    a, b = _grads(cached), _grads(plain)
    assert a.keys() == b.keys() and len(a) > 10
    for name in a:
        assert torch.allclose(a[name], b[name], atol=1e-6, rtol=1e-4), name
    assert any(g.abs().sum() > 0 for g in a.values())


def test_rng_replay_reproduces_dropout_masks(tiny_model_dir):
    model = _tiny(tiny_model_dir, eval_mode=False)  # dropout active
    texts = [f"document number {i} about rivers and deltas" + " and lakes" * (i % 4) for i in range(9)]
    ids, lengths, layout = tokenize(model, texts, task="document", max_length=32)
    chunks = token_chunks(model, TokenRows(ids, lengths), layout, 60)
    assert len(chunks) > 2
    emb, states = encode_cached(model, chunks, len(texts), task="document")
    again = []
    for chunk, state in zip(chunks, states):
        with state.replay(torch.device("cpu")):
            again.append(run_chunk(model, chunk, task="document"))
    assert torch.equal(emb.detach(), scatter(again, chunks, len(texts)).detach())
    fresh = run_chunk(model, chunks[0], task="document")  # without replay: other masks
    assert not torch.allclose(fresh.detach(), emb[chunks[0].index].detach())


def _weights(folder: Path) -> dict:
    files = sorted(folder.rglob("model.safetensors"))
    return {f"{f.relative_to(folder)}:{k}": v for f in files for k, v in load_file(f).items()}


def test_resume_after_kill_reaches_the_same_weights(tmp_path, tiny_model_dir, monkeypatch):
    overrides = {"train.tower": "both", "train.epochs": 2, "train.keep_epochs": [1, 2]}
    params, paths = make_project(tmp_path / "a", tiny_model_dir, overrides=overrides)
    full = train(params, paths, str(tiny_model_dir), device="cpu", progress=False)
    assert not paths.train_state(str(tiny_model_dir)).exists()  # removed once training completes

    params_b, paths_b = make_project(tmp_path / "b", tiny_model_dir, overrides=overrides)
    real_save = checkpoints.save_model

    def killed_at_epoch_2(model, path, meta, **kw):
        if meta["epoch"] == 2:
            raise KeyboardInterrupt("simulated kill")
        return real_save(model, path, meta, **kw)

    monkeypatch.setattr(checkpoints, "save_model", killed_at_epoch_2)
    with pytest.raises(KeyboardInterrupt):
        train(params_b, paths_b, str(tiny_model_dir), device="cpu", progress=False)
    state_dir = paths_b.train_state(str(tiny_model_dir))
    assert checkpoints.load_state(state_dir).epoch == 1
    assert not paths_b.checkpoint(str(tiny_model_dir), 2).exists()
    monkeypatch.setattr(checkpoints, "save_model", real_save)
    # what a kill can leave beside the state: a half-built epoch-2 folder, a checkpoint of other settings
    (paths_b.checkpoint(str(tiny_model_dir), 2) / "junk").mkdir(parents=True)
    (paths_b.model_dir(str(tiny_model_dir)) / "epoch-9").mkdir()
    resumed = train(params_b, paths_b, str(tiny_model_dir), device="cpu", progress=False)
    assert sorted(p.name for p in paths_b.model_dir(str(tiny_model_dir)).iterdir()) == ["epoch-1", "epoch-2"]
    assert not (paths_b.checkpoint(str(tiny_model_dir), 2) / "junk").exists()

    wa, wb = _weights(full.final), _weights(resumed.final)
    assert wa.keys() == wb.keys()
    assert all(torch.equal(wa[k], wb[k]) for k in wa)
    assert [round(h["val_ndcg@10"], 12) for h in full.history] == [round(h["val_ndcg@10"], 12) for h in resumed.history]
    assert (paths.training_log(str(tiny_model_dir)) / "curve.csv").read_text() == (paths_b.training_log(str(tiny_model_dir)) / "curve.csv").read_text()


def test_new_judgments_under_the_same_split_name_start_a_killed_run_over(tmp_path, tiny_model_dir, monkeypatch, caplog):
    """A run killed after epoch 1 resumes only on the data it was trained on: once the training split's
    candidate sets change (new judgments, same ``data.train``), the state is stale and training starts over,
    ending with the weights of a fresh run on the new data."""
    from pgrank.data.beir import load_topics
    from pgrank.data.candidate_store import run_sets, write_candidates
    from pgrank.data.corpus_store import open_corpus
    from pgrank.data.runs import read_run

    name, overrides = str(tiny_model_dir), {"train.epochs": 2, "train.keep_epochs": [2]}
    real_save = checkpoints.save_model

    def killed_at_epoch_2(model, path, meta, **kw):
        if meta["epoch"] == 2:
            raise KeyboardInterrupt("simulated kill")
        return real_save(model, path, meta, **kw)

    def change_the_training_sets(paths):  # one query's judgments removed: what `dvc repro` re-mines
        queries, qrels = load_topics(paths, "toy", "train-pg")
        run = read_run(paths.candidates("toy", "train-pg"))
        del run[sorted(run)[0]]
        write_candidates(paths, "toy", "train-pg", run_sets(run, open_corpus(paths, "toy"), queries, qrels),
                         corpus=open_corpus(paths, "toy"), tag="pgrank-test", trec=True)

    params, paths = make_project(tmp_path / "a", tiny_model_dir, overrides=overrides)
    monkeypatch.setattr(checkpoints, "save_model", killed_at_epoch_2)
    with pytest.raises(KeyboardInterrupt):
        train(params, paths, name, device="cpu", progress=False)
    assert checkpoints.load_state(paths.train_state(name)).epoch == 1
    monkeypatch.setattr(checkpoints, "save_model", real_save)
    change_the_training_sets(paths)
    with caplog.at_level("WARNING", logger="pgrank"):
        retrained = train(params, paths, name, device="cpu", progress=False)
    assert "settings changed since this state was saved; starting over" in caplog.text

    params_b, paths_b = make_project(tmp_path / "b", tiny_model_dir, overrides=overrides)
    change_the_training_sets(paths_b)
    fresh = train(params_b, paths_b, name, device="cpu", progress=False)
    wa, wb = _weights(retrained.final), _weights(fresh.final)
    assert all(torch.equal(wa[k], wb[k]) for k in wa)


def test_reconfigured_training_leaves_no_checkpoint_of_the_old_settings(tmp_path, tiny_model_dir):
    name = str(tiny_model_dir)
    params, paths = make_project(tmp_path, tiny_model_dir, overrides={"train.epochs": 2, "train.keep_epochs": [0, 1, 2]})
    train(params, paths, name, device="cpu", progress=False)
    assert sorted(p.name for p in paths.model_dir(name).iterdir()) == ["epoch-0", "epoch-1", "epoch-2"]
    old = read_checkpoint_meta(paths.checkpoint(name, 0))["fingerprint"]
    params, paths = make_project(tmp_path, tiny_model_dir, overrides={"train.epochs": 1, "train.keep_epochs": [0, 1]})
    train(params, paths, name, device="cpu", progress=False)
    assert sorted(p.name for p in paths.model_dir(name).iterdir()) == ["epoch-0", "epoch-1"]  # no stale epoch-2
    new = {read_checkpoint_meta(paths.checkpoint(name, e))["fingerprint"] for e in (0, 1)}
    assert len(new) == 1 and old not in new


def test_nan_guard_stops_and_keeps_the_last_good_checkpoint(tmp_path, tiny_model_dir, monkeypatch):
    params, paths = make_project(tmp_path, tiny_model_dir, overrides={"train.epochs": 2, "train.keep_epochs": [0, 1, 2]})
    import pgrank.training.trainer as training

    real = training.OBJECTIVES["pg"]
    calls = {"n": 0}

    def poisoned(*args, **kwargs):
        out = real(*args, **kwargs)
        calls["n"] += 1
        return out._replace(loss=out.loss * float("nan")) if calls["n"] > 3 else out  # epoch 2 goes bad

    monkeypatch.setitem(training.OBJECTIVES, "pg", poisoned)
    name = str(tiny_model_dir)
    with pytest.raises(TrainingError, match="loss is nan"):
        train(params, paths, name, device="cpu", progress=False)
    assert paths.checkpoint(name, 1).is_dir() and not paths.checkpoint(name, 2).exists()
    for tensor in _weights(paths.checkpoint(name, 1)).values():
        assert torch.isfinite(tensor).all()
    assert checkpoints.load_state(paths.train_state(name)).epoch == 1


def _sha(folder: Path) -> str:
    h = hashlib.sha256()
    for f in sorted(folder.iterdir()):
        h.update(f.name.encode() + f.read_bytes())
    return h.hexdigest()


def test_query_tower_never_changes_document_embeddings(tmp_path, tiny_model_dir):
    params, paths = make_project(tmp_path, tiny_model_dir, overrides={"train.tower": "query", "train.learning_rate": 5e-3})
    name = str(tiny_model_dir)
    result = train(params, paths, name, device="cpu", progress=False)
    (artifact,) = [p for p in paths.embeddings.iterdir() if (p / "meta.json").is_file()]  # not exports, queries
    before = _sha(artifact)

    from sentence_transformers import SentenceTransformer

    pair = SentenceTransformer(str(result.final), device="cpu")
    warm = _tiny(tiny_model_dir)
    texts = ["Solar Wind solar wind the data", "coral reef small analysis"]
    assert torch.allclose(torch.as_tensor(pair.encode_document(texts)), torch.as_tensor(warm.encode(texts)), atol=1e-6)
    assert not torch.allclose(torch.as_tensor(pair.encode_query(texts)), torch.as_tensor(warm.encode(texts)), atol=1e-4)
    assert read_checkpoint_meta(result.final)["document_encoder"] == read_checkpoint_meta(result.final)["warm_start_model"]
    train(params, paths, name, device="cpu", progress=False)  # a second run reuses the artifact untouched
    assert _sha(artifact) == before


def _ddp_worker(rank, world, port, model_dir, project_dir, tower, out):
    os.environ.update(RANK=str(rank), WORLD_SIZE=str(world), LOCAL_RANK=str(rank), MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    from pgrank.training import distributed

    w, dev = distributed.setup("cpu")
    params, paths = make_project(Path(project_dir) / f"rank{rank}", Path(model_dir), overrides={"train.tower": tower})
    examples, corpus = _toy_batch(params, paths)
    model = _tiny(model_dir)
    distributed.freeze_unused(model, lambda m: encode(m, ["probe"], task="query", max_length=8).sum())
    wrapped = distributed.wrap(model, w, dev)
    frozen = None
    if tower == "query":
        from pgrank.models.names import resolve_model
        from pgrank.training.batches import frozen_documents

        frozen = frozen_documents(params, paths, resolve_model(str(model_dir), params.models), corpus)
    local = distributed.shard(examples, w)
    accumulate_gradients(model, step_of(params, paths, model, local, corpus), params, epoch=1, frozen=frozen,
                         forward=wrapped, no_sync=distributed.no_sync(wrapped))
    if rank == 0:
        torch.save(_grads(model), out)
    distributed.teardown(w)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.parametrize("tower", ["both", "query"])
def test_ddp_average_gradient_equals_single_process(tmp_path, tiny_model_dir, tower):
    import torch.multiprocessing as mp

    out = tmp_path / "ddp.pt"
    mp.spawn(_ddp_worker, args=(2, _free_port(), str(tiny_model_dir), str(tmp_path), tower, str(out)), nprocs=2, join=True)
    params, paths = make_project(tmp_path / "single", tiny_model_dir, overrides={"train.tower": tower})
    examples, corpus = _toy_batch(params, paths)
    model = _tiny(tiny_model_dir)
    frozen = None
    if tower == "query":
        from pgrank.models.names import resolve_model
        from pgrank.training.batches import frozen_documents

        frozen = frozen_documents(params, paths, resolve_model(str(tiny_model_dir), params.models), corpus)
    accumulate_gradients(model, step_of(params, paths, model, examples, corpus), params, epoch=1, frozen=frozen)
    single, ddp = _grads(model), torch.load(out)
    assert single.keys() == ddp.keys() and len(single) > 10
    for name in single:
        # Equal up to float32 noise: one batch pads tokens and candidates differently than two
        # half batches. A missing all-reduce (rank 0's own gradient) is off by O(1).
        scale = single[name].abs().max().item()
        assert (single[name] - ddp[name]).abs().max().item() <= 1e-3 * scale + 1e-8, name


def _validation(params, paths, model_dir, world):
    from pgrank.data.beir import load_topics
    from pgrank.data.corpus_store import open_corpus
    from pgrank.training.batches import training_set
    from pgrank.training.validation_ndcg import qrels_by_row, validate

    corpus = open_corpus(paths, "toy")
    examples = training_set(paths, "toy", "validation", corpus)
    qrels = qrels_by_row(load_topics(paths, "toy", "validation")[1], corpus)
    model = _tiny(model_dir)
    documents = corpus_tokens(model, paths, corpus, max_length=params.train.max_doc_length)
    return validate(model, examples, qrels, params, frozen=None, documents=documents, world=world, batch_size=2)


def _validation_worker(rank, world, port, model_dir, project_dir, out):
    os.environ.update(RANK=str(rank), WORLD_SIZE=str(world), LOCAL_RANK=str(rank), MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    from pgrank.training import distributed

    import pgrank.training.validation_ndcg as trainer

    w, _ = distributed.setup("cpu", timeout_minutes=5)
    params, paths = make_project(Path(project_dir) / f"rank{rank}", Path(model_dir), overrides={"train.tower": "both"})
    queries = []
    real = trainer.encode
    trainer.encode = lambda m, texts, task, **kw: (queries.extend(texts) if task == "query" else None) or real(m, texts, task=task, **kw)
    metrics = _validation(params, paths, model_dir, w)
    torch.save({"metrics": metrics, "queries": queries}, f"{out}.{rank}")
    distributed.teardown(w)


def test_sharded_validation_equals_the_single_process_result(tmp_path, tiny_model_dir):
    """Two gloo ranks each rerank half of the validation queries; both return the means over all of them."""
    import torch.multiprocessing as mp

    from pgrank.training.distributed import World

    out = tmp_path / "val.pt"
    mp.spawn(_validation_worker, args=(2, _free_port(), str(tiny_model_dir), str(tmp_path), str(out)), nprocs=2, join=True)
    params, paths = make_project(tmp_path / "single", tiny_model_dir, overrides={"train.tower": "both"})
    single = _validation(params, paths, tiny_model_dir, World())
    assert 0 < single["ndcg@10"] < 1
    encoded = []
    for rank in (0, 1):
        saved = torch.load(f"{out}.{rank}")
        sharded = saved["metrics"]
        assert sharded.keys() == single.keys()
        assert all(abs(sharded[k] - single[k]) < 1e-9 for k in single), (rank, sharded, single)
        encoded.append(saved["queries"])
    assert len(encoded[0]) == len(encoded[1]) == params.data.validation_size // 2  # each rank did half the work
    assert not set(encoded[0]) & set(encoded[1])


def test_mlflow_receives_the_run(tmp_path, tiny_model_dir, monkeypatch):
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    params, paths = make_project(tmp_path, tiny_model_dir, overrides={"tracking.enabled": True, "train.epochs": 1,
                                                                       "train.keep_epochs": [1]})
    result = train(params, paths, str(tiny_model_dir), device="cpu", progress=False)
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri=paths.mlflow_uri())
    exp = client.get_experiment_by_name(params.tracking.experiment)
    (run,) = client.search_runs([exp.experiment_id])
    assert run.data.params["train.pg.utility"] == "ndcg@10" and run.data.tags["stage"] == "train"
    steps = client.get_metric_history(run.info.run_id, "loss")
    curve = (paths.training_log(str(tiny_model_dir)) / "curve.csv").read_text().splitlines()[1:]
    assert [m.step for m in steps] == list(range(1, len(curve) + 1))
    assert [round(m.value, 6) for m in steps] == [round(float(row.split(",")[2]), 6) for row in curve]
    assert {"utility", "grad_norm", "entropy", "val_ndcg_at_10", "train_utility"} <= set(run.data.metrics)
    assert {"epoch_seconds", "val_ndcg_at_10"} <= set(run.data.metrics)  # the epoch's wall time, in MLflow too
    assert result.registered_version == "1"
    version = client.get_model_version(params.tracking.registered_model, "1")
    assert version.run_id == run.info.run_id
    import mlflow

    # the requirements are the pinned packages given (not inferred by reloading the model in a subprocess)
    monkeypatch.setenv("MLFLOW_TRACKING_URI", paths.mlflow_uri())  # for this test only
    requirements = mlflow.pyfunc.get_model_dependencies(f"models:/{params.tracking.registered_model}/1")
    assert tracking.model_requirements() and set(tracking.model_requirements()) <= set(Path(requirements).read_text().split())


@pytest.mark.integration
def test_short_real_run_on_a_scifact_slice_raises_training_utility(tmp_path, beir_mirror, minilm_path):
    """Real all-MiniLM-L6-v2 on a scifact slice (60 train queries, 20 BM25 candidates each), query tower."""
    import yaml
    from shrunk import sliced_scifact_mirror

    from pgrank.config import parse_params
    from pgrank.download.stage import download
    from pgrank.mining.candidate_sets import mine
    from pgrank.models.names import resolve_model
    from pgrank.paths import Paths
    from pgrank.training.batches import frozen_documents, training_set
    from pgrank.training.validation_ndcg import qrels_by_row, validate

    mirror = sliced_scifact_mirror(beir_mirror / "scifact.zip", tmp_path / "mirror", train=60, test=5, extra=100)
    root = Path(__file__).resolve().parents[2]
    doc = yaml.safe_load((root / "params.yaml").read_text())
    doc["paths"] = {"root": str(tmp_path / "runs"), "data": str(tmp_path / "data"), "embeddings": str(tmp_path / "emb")}
    doc["data"].update({"train": "scifact/train", "validation_size": 10, "eval_sets": ["scifact/test"]})
    doc["tracking"]["enabled"] = False
    doc["mine"].update({"source": "bm25", "candidates": 20, "batch_size": 32, "max_seq_length": 128})
    doc["evaluate"].update({"systems": {"dense": ["minilm"]}, "policy_epochs": []})
    doc["train"].update({"warm_starts": ["minilm"], "tower": "query", "epochs": 2, "keep_epochs": [0, 2],
                         "batch_size": 10, "learning_rate": 1e-4, "max_doc_length": 128})
    doc["train"]["pg"].update({"num_samples": 50})
    params = parse_params(doc)
    paths = Paths.from_config(params.paths)
    download(params, paths, ["scifact"], str(mirror), progress=False)
    for split in ("train-pg", "validation"):
        mine(params, paths, "scifact", split, progress=False)
    result = train(params, paths, "minilm", device="cpu", progress=False)

    from pgrank.data.beir import load_topics
    from pgrank.data.corpus_store import open_corpus

    corpus = open_corpus(paths, "scifact")
    examples = training_set(paths, "scifact", "train-pg", corpus)
    qrels = qrels_by_row(load_topics(paths, "scifact", "train-pg")[1], corpus)
    frozen = frozen_documents(params, paths, resolve_model("minilm", params.models), corpus)
    before = validate(load_encoder("minilm", params.models, device="cpu"), examples, qrels, params, frozen=frozen)
    from sentence_transformers import SentenceTransformer

    after = validate(SentenceTransformer(str(result.final), device="cpu"), examples, qrels, params, frozen=frozen)
    assert after["ndcg@10"] > before["ndcg@10"] + 0.02, (before, after)


def test_each_objective_trains_its_own_policy_at_its_own_learning_rate(tmp_path, tiny_model_dir):
    """train.objectives: one run per objective on the same candidates, in its own folders, at its own rate;
    epoch timings go to Paths.timings, never into the DVC-tracked history."""
    import json

    from pgrank.data.candidate_store import open_candidates
    from pgrank.training.trainer import _fingerprint

    name = str(tiny_model_dir)
    overrides = {"train.objectives": ["pg", "listnet"], "train.learning_rates": {"listnet": 5e-3},
                 "train.epochs": 1, "train.keep_epochs": [0, 1]}
    params, paths = make_project(tmp_path, tiny_model_dir, overrides=overrides)
    pg = train(params, paths, name, objective="pg", device="cpu", progress=False)
    listnet = train(params, paths, name, objective="listnet", device="cpu", progress=False)
    assert pg.final == paths.checkpoint(name, 1) and listnet.final == paths.checkpoint(name, 1, "listnet")
    assert read_checkpoint_meta(listnet.final)["objective"] == "listnet"
    assert _weights(paths.checkpoint(name, 0)).keys() == _weights(paths.checkpoint(name, 0, "listnet")).keys()
    w_pg, w_ln = _weights(pg.final), _weights(listnet.final)
    assert any(not torch.equal(w_pg[k], w_ln[k]) for k in w_pg)  # different losses, different policies
    for objective, result in (("pg", pg), ("listnet", listnet)):
        history = json.loads((paths.training_log(name, objective) / "history.json").read_text())
        assert history == result.history and all(k == "epoch" or k.startswith(("val_", "train_")) for h in history for k in h)
        timing = json.loads(paths.timings(name, objective).read_text())
        assert list(timing["epoch_seconds"]) == ["1"] and timing["epoch_seconds"]["1"] > 0
    # the fingerprint (what resumes or invalidates a run) is the objective's own: its learning rate counts,
    # the other objectives' settings do not
    fingerprint = read_checkpoint_meta(pg.final)["fingerprint"]
    alone, _ = make_project(tmp_path / "alone", tiny_model_dir, overrides={"train.epochs": 1, "train.keep_epochs": [0, 1]})
    key = read_checkpoint_meta(pg.final)["warm_start_model"]
    data = [open_candidates(paths, "toy", split).meta["sha256"] for split in ("train-pg", "validation")]
    assert _fingerprint(alone, key, "pg", data) == fingerprint
    assert _fingerprint(params, key, "listnet", data) == read_checkpoint_meta(listnet.final)["fingerprint"] != fingerprint
    faster = params.model_copy(update={"train": params.train.model_copy(update={"learning_rates": {"listnet": 1e-2}})})
    assert _fingerprint(faster, key, "listnet", data) != _fingerprint(params, key, "listnet", data)


def test_a_variant_at_an_extra_seed_trains_its_own_run_with_its_own_settings(tmp_path, tiny_model_dir):
    """train.variants + train.extra_seeds: the run pg_x.s7 trains the loss pg with the variant's keys at seed 7,
    into its own folders; the same variant at train.seed is another run with other weights; evaluation finds the
    policy at the variant's own last epoch."""
    import json

    from pgrank.retrieval.dense.retriever import policy_system

    name = str(tiny_model_dir)
    overrides = {"train.objectives": ["pg", "pg_x"], "train.extra_seeds": [7], "train.epochs": 1,
                 "train.keep_epochs": [0, 1],
                 "train.variants": {"pg_x": {"objective": "pg", "overrides": {"pg": {"num_samples": 4}, "epochs": 2}}}}
    params, paths = make_project(tmp_path, tiny_model_dir, overrides=overrides)
    main = train(params, paths, name, objective="pg_x", device="cpu", progress=False)
    seeded = train(params, paths, name, objective="pg_x", seed=7, device="cpu", progress=False)
    assert main.final == paths.checkpoint(name, 2, "pg_x") and seeded.final == paths.checkpoint(name, 2, "pg_x.s7")
    assert policy_system(params, paths, f"pgrank-{name}+pg_x.s7").query_model == str(seeded.final)
    meta = read_checkpoint_meta(seeded.final)
    assert (meta["objective"], meta["run"]) == ("pg", "pg_x.s7")
    assert read_checkpoint_meta(main.final)["fingerprint"] != meta["fingerprint"]  # the seed is part of a run
    w_main, w_seed = _weights(main.final), _weights(seeded.final)
    assert any(not torch.equal(w_main[k], w_seed[k]) for k in w_main)
    assert json.loads((paths.training_log(name, "pg_x.s7") / "history.json").read_text()) == seeded.history
    # the variant's own keys reach the step: 4 rankings per query, where the profile samples 8
    curve = (paths.training_log(name, "pg_x.s7") / "curve.csv").read_text().splitlines()
    assert curve and paths.timings(name, "pg_x.s7").is_file()
    assert params.train.for_run("pg_x", 7).pg.num_samples == 4 and params.train.pg.num_samples == 8
    with pytest.raises(Exception, match="objective 'ranknet'"):
        train(params, paths, name, objective="ranknet", device="cpu", progress=False)
