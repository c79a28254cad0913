"""A judged split cut in two by query hash (``data.sources.<name>.split``): dev for selection, test for results;
and a zip of the BEIR mirror named as a source (``data.sources.<name>.mirror``)."""

from __future__ import annotations

import hashlib
import json
import shutil
import zipfile
from pathlib import Path

import pytest

from pgrank.config import SourceConfig, parse_params
from pgrank.config.sections import HashSplitConfig
from pgrank.data.beir import load_qrels
from pgrank.download.hash_split import hash_split
from pgrank.download.stage import download, with_parents
from pgrank.errors import ConfigError, DataError
from pgrank.paths import Paths

QRELS = {f"q{i}": {f"d{i}": 1 + i % 2, f"d{i + 1}": 0} for i in range(40)}


def test_the_halves_are_disjoint_cover_the_split_and_depend_only_on_the_ids_and_the_seed():
    dev, test = hash_split(QRELS, 0.5, seed=0)
    assert len(dev) == len(test) == 20 and not set(dev) & set(test) and set(dev) | set(test) == set(QRELS)
    assert all(dev[q] == QRELS[q] for q in dev) and all(test[q] == QRELS[q] for q in test)
    shuffled = dict(reversed(list(QRELS.items())))
    assert hash_split(shuffled, 0.5, seed=0)[0].keys() == dev.keys()  # the file's order does not matter
    assert hash_split(QRELS, 0.5, seed=0) == (dev, test)  # deterministic
    other = hash_split(QRELS, 0.5, seed=1)[0]
    assert other.keys() != dev.keys()  # the seed places the queries
    assert len(hash_split(QRELS, 0.25, seed=0)[0]) == 10
    assert set(hash_split(QRELS, 0.25, seed=0)[0]) < set(dev)  # the first in hash order: a smaller share is a subset
    assert [len(part) for part in hash_split({"a": {}, "b": {}}, 0.01, 0)] == [1, 1]  # one query in each at least
    with pytest.raises(DataError, match="at least 2"):
        hash_split({"a": {"d": 1}}, 0.5, 0)
    assert QRELS["q0"] == {"d0": 1, "d1": 0}  # the input is not modified


def write_beir(folder: Path, splits=("test",), queries: int = 12) -> Path:
    (folder / "qrels").mkdir(parents=True, exist_ok=True)
    (folder / "corpus.jsonl").write_text("".join(json.dumps({"_id": f"d{i}", "title": "", "text": f"doc {i}"}) + "\n"
                                                 for i in range(queries + 1)))
    (folder / "queries.jsonl").write_text("".join(json.dumps({"_id": f"q{i}", "text": f"query {i}"}) + "\n"
                                                  for i in range(queries)))
    for split in splits:
        (folder / "qrels" / f"{split}.tsv").write_text(
            "query-id\tcorpus-id\tscore\n" + "".join(f"q{i}\td{i}\t{1 + i % 2}\nq{i}\td{i + 1}\t0\n" for i in range(queries)))
    return folder


def params_for(sources: dict, *, eval_sets=("acme-split/test",), validation_sets=("acme-split/dev",)):
    return parse_params({
        "paths": {"root": "runs", "data": "data", "embeddings": "emb"},
        "data": {"sources": {"train-set": {"path": "train-beir"}, **sources}, "train": "train-set/train",
                 "validation_size": 1, "eval_sets": list(eval_sets)},
        "train": {"warm_starts": ["sbert"], "validation_sets": list(validation_sets)},
        "evaluate": {"systems": {"bm25": ["bm25"], "dense": ["sbert"]}},
        "tracking": {"enabled": False},
    })


def test_the_download_stage_builds_the_halves_after_their_parent_and_records_how(tmp_path):
    write_beir(tmp_path / "train-beir", splits=("train",))
    write_beir(tmp_path / "acme-beir")
    params = params_for({"acme": {"path": "acme-beir"}, "acme-split": {"split": {"of": "acme", "seed": 3}}})
    paths = Paths.from_config(params.paths, base=tmp_path)
    report = download(params, paths, config_dir=tmp_path, progress=False)
    assert [(f.name, f.status) for f in report.datasets] == [
        ("train-set", "validated"), ("acme", "validated"), ("acme-split", "validated")]

    folder = paths.dataset("acme-split")
    dev, test = (load_qrels(folder / "qrels" / f"{s}.tsv") for s in ("dev", "test"))
    assert (dev, test) == hash_split(load_qrels(tmp_path / "acme-beir" / "qrels" / "test.tsv"), 0.5, seed=3)
    assert sorted(p.name for p in (folder / "qrels").iterdir()) == ["dev.tsv", "test.tsv"]  # the cut split is gone
    assert (folder / "corpus.jsonl").is_symlink() and not Path((folder / "corpus.jsonl").readlink()).is_absolute()
    assert (folder / "corpus.jsonl").read_bytes() == (tmp_path / "acme-beir" / "corpus.jsonl").read_bytes()
    record = json.loads((folder / ".pgrank-download.json").read_text())
    assert record["origin"]["split"] == {"of": "acme", "split": "test", "dev_share": 0.5, "seed": 3}
    assert record["origin"]["queries"] == {"dev": 6, "test": 6}
    assert record["origin"]["parent"]["qrels/test.tsv"] == hashlib.sha256(
        (tmp_path / "acme-beir" / "qrels" / "test.tsv").read_bytes()).hexdigest()
    assert (paths.root / "datasets" / "acme-split.json").is_file()  # its manifest, what DVC tracks

    again = download(params, paths, ["acme-split"], config_dir=tmp_path, progress=False)
    assert [(f.name, f.status) for f in again.datasets] == [("acme", "present"), ("acme-split", "present")]
    reseeded = params_for({"acme": {"path": "acme-beir"}, "acme-split": {"split": {"of": "acme", "seed": 4}}})
    statuses = [f.status for f in download(reseeded, paths, ["acme-split"], config_dir=tmp_path, progress=False).datasets]
    assert statuses == ["present", "validated"]  # a new seed rebuilds it
    assert load_qrels(folder / "qrels" / "dev.tsv") == hash_split(
        load_qrels(tmp_path / "acme-beir" / "qrels" / "test.tsv"), 0.5, seed=4)[0]


def test_a_split_the_parent_does_not_have_is_an_error_that_names_the_key(tmp_path):
    write_beir(tmp_path / "train-beir", splits=("train",))
    write_beir(tmp_path / "acme-beir")
    params = params_for({"acme": {"path": "acme-beir"}, "acme-split": {"split": {"of": "acme", "split": "dev"}}})
    paths = Paths.from_config(params.paths, base=tmp_path)
    with pytest.raises(DataError, match=r"data.sources.acme-split.split: 'acme' has no judged split 'dev'"):
        download(params, paths, ["acme-split"], config_dir=tmp_path, progress=False)
    assert not paths.dataset("acme-split").exists()


def test_derived_sources_come_after_the_dataset_they_are_built_from():
    sources = {"s": SourceConfig(split=HashSplitConfig(of="arguana")), "acme": SourceConfig(path="x")}
    assert with_parents(["nfcorpus", "s", "acme"], sources) == ["nfcorpus", "arguana", "s", "acme"]


@pytest.mark.parametrize("source, message", [
    ({"split": {"of": "acme"}, "path": "x"}, "give exactly one of"),
    ({"split": {"of": "acme", "share": 0.5}}, "share"),
    ({"split": {"of": "acme", "dev_share": 1}}, "less than 1"),
    ({"split": {"of": "acme-split"}}, "is this source itself"),
    ({"split": {"of": "acme-halves"}}, "is itself derived"),
    ({"split": {"of": "acme"}, "sha256": "0" * 64}, "sha256 pins a zip"),
    ({"mirror": "subset"}, "mirror"),
])
def test_bad_split_and_mirror_settings_name_the_key(source, message):
    with pytest.raises(ConfigError, match=rf"data.*sources.acme-split.*{message}"):
        params_for({"acme": {"path": "a"}, "acme-halves": {"halves": {"of": "acme"}}, "acme-split": source})


def zipped(folder: Path, zip_path: Path) -> Path:
    with zipfile.ZipFile(zip_path, "w") as zf:
        for file in sorted(folder.rglob("*")):
            zf.write(file, f"subset/{file.relative_to(folder)}")
    return zip_path


def test_a_mirror_zip_comes_from_the_mirror_checked_by_its_sha256sums(tmp_path, monkeypatch):
    write_beir(tmp_path / "train-beir", splits=("train",))
    mirror = tmp_path / "mirror"
    mirror.mkdir()
    zip_path = zipped(write_beir(tmp_path / "subset-beir"), mirror / "subset.zip")
    digest = hashlib.sha256(zip_path.read_bytes()).hexdigest()
    params = params_for({"subset": {"mirror": "subset.zip"}, "acme-split": {"split": {"of": "subset"}}})
    paths = Paths.from_config(params.paths, base=tmp_path)

    monkeypatch.delenv("PGRANK_BEIR_MIRROR", raising=False)
    with pytest.raises(DataError, match=r"data.sources.subset.mirror 'subset.zip': not on BEIR's server, and pgrank "
                                        r"ships no subset.zip; set \$PGRANK_BEIR_MIRROR"):
        download(params, paths, ["subset"], config_dir=tmp_path, progress=False)

    (mirror / "SHA256SUMS").write_text(f"{'0' * 64}  subset.zip\n")
    monkeypatch.setenv("PGRANK_BEIR_MIRROR", str(mirror))
    with pytest.raises(DataError, match="sha256 mismatch"):
        download(params, paths, ["subset"], config_dir=tmp_path, progress=False)

    (mirror / "SHA256SUMS").write_text(f"{digest}  subset.zip\n")
    report = download(params, paths, ["acme-split"], config_dir=tmp_path, progress=False)
    assert [(f.name, f.status) for f in report.datasets] == [("subset", "validated"), ("acme-split", "validated")]
    record = json.loads((paths.dataset("subset") / ".pgrank-download.json").read_text())
    assert (record["origin"]["kind"], record["origin"]["sha256"]) == ("zip", digest)
    assert len(load_qrels(paths.dataset("acme-split") / "qrels" / "test.tsv")) == 6

    shutil.move(str(zip_path), str(tmp_path / "elsewhere.zip"))
    paths.dataset("subset").joinpath(".pgrank-download.json").unlink()
    shutil.rmtree(paths.dataset("subset"))
    with pytest.raises(DataError, match=r"no such file .*subset.zip in the BEIR mirror named by \$PGRANK_BEIR_MIRROR"):
        download(params, paths, ["subset"], config_dir=tmp_path, progress=False)
