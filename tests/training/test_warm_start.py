"""The models of a training run come from one read of each weight file (pgrank/training/warm_start.py)."""

from __future__ import annotations

from toy_project import make_project

from pgrank.training.trainer import train


def _count_reads(monkeypatch) -> list[str]:
    """Every model that pgrank reads from disk from now on, by the folder it names."""
    from pgrank.models import loading

    read, real = [], loading.load_encoder

    def counted(name, *args, **kwargs):
        read.append(str(getattr(name, "local_dir", None) or name))
        return real(name, *args, **kwargs)

    monkeypatch.setattr(loading, "load_encoder", counted)
    return read


def test_the_policy_its_kl_reference_and_its_document_side_come_from_one_read(tmp_path, tiny_model_dir, monkeypatch):
    """tower: query with the KL term needs the warm start's weights three times: the policy, the frozen reference
    and the document side of every checkpoint (here three); the run reads them once."""
    from pgrank.data.corpus_store import open_corpus
    from pgrank.models.names import resolve_model
    from pgrank.training.batches import frozen_documents

    params, paths = make_project(tmp_path, tiny_model_dir, overrides={
        "train.tower": "query", "train.pg.kl_coef": 0.1, "train.epochs": 2, "train.keep_epochs": [0, 1, 2]})
    frozen_documents(params, paths, resolve_model(str(tiny_model_dir), params.models), open_corpus(paths, "toy"))
    read = _count_reads(monkeypatch)  # from here on: the corpus-embedding artifact is built already
    result = train(params, paths, str(tiny_model_dir), device="cpu", progress=False)
    assert read == [str(tiny_model_dir)]
    assert sorted(p.name for p in result.model_dir.iterdir()) == ["epoch-0", "epoch-1", "epoch-2"]
