"""The models of a training run come from one read of each weight file (pgrank/training/warm_start.py)."""

from __future__ import annotations

from toy_project import make_project

from pgrank.training.trainer import train


def _count_reads(monkeypatch) -> list[str]:
    """Every model that pgrank reads from disk from now on, by the folder it names."""
    from pgrank.models import hub

    read, real = [], hub.load_encoder

    def counted(name, *args, **kwargs):
        read.append(str(getattr(name, "local_dir", None) or name))
        return real(name, *args, **kwargs)

    monkeypatch.setattr(hub, "load_encoder", counted)
    return read


def test_the_policy_its_kl_reference_and_its_document_side_come_from_one_read(tmp_path, tiny_model_dir, monkeypatch):
    """tower: query with the KL term needs the warm start's weights three times: the policy, the frozen reference
    and the document side of every checkpoint; a resumed run reads its saved state once more, and nothing else."""
    from pgrank.data.corpus_store import open_corpus
    from pgrank.models.hub import resolve_model
    from pgrank.training import checkpoints
    from pgrank.training.batches import frozen_documents

    params, paths = make_project(tmp_path, tiny_model_dir, overrides={
        "train.tower": "query", "train.pg.kl_coef": 0.1, "train.epochs": 2, "train.keep_epochs": [0, 1, 2]})
    frozen_documents(params, paths, resolve_model(str(tiny_model_dir), params.models), open_corpus(paths, "toy"))
    read = _count_reads(monkeypatch)  # from here on: the corpus-embedding artifact is built already
    real_save = checkpoints.save_model

    def killed_at_epoch_2(model, path, meta, **kw):
        if meta["epoch"] == 2:
            raise KeyboardInterrupt("simulated kill")
        return real_save(model, path, meta, **kw)

    monkeypatch.setattr(checkpoints, "save_model", killed_at_epoch_2)
    try:
        train(params, paths, str(tiny_model_dir), device="cpu", progress=False)
    except KeyboardInterrupt:
        pass
    assert read == [str(tiny_model_dir)]  # epochs 0 and 1 were saved with their document side
    monkeypatch.setattr(checkpoints, "save_model", real_save)
    read.clear()
    train(params, paths, str(tiny_model_dir), device="cpu", progress=False)
    assert read == [str(tiny_model_dir), str(paths.train_state(str(tiny_model_dir)) / "model")]
