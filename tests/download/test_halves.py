"""Half-document retrieval built from another dataset's corpus (``data.sources.<name>.halves``): a label-free
out-of-domain validation set, installed by the download stage after the corpus it cuts."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from pgrank.config import HalvesConfig, SourceConfig, parse_params
from pgrank.data.beir import load_split
from pgrank.download.halves import sample_halves
from pgrank.download.stage import download, with_parents
from pgrank.errors import ConfigError, DataError
from pgrank.paths import Paths


def write_corpus(folder: Path, lengths: list[int]) -> Path:
    """A BEIR folder whose document i has ``lengths[i]`` words ``w<i>x<j>``, three queries judged in train and test."""
    (folder / "qrels").mkdir(parents=True, exist_ok=True)
    docs = [{"_id": f"d{i}", "title": f"T{i}", "text": " ".join(f"w{i}x{j}" for j in range(n))}
            for i, n in enumerate(lengths)]
    (folder / "corpus.jsonl").write_text("".join(json.dumps(d) + "\n" for d in docs))
    (folder / "queries.jsonl").write_text("".join(json.dumps({"_id": f"q{i}", "text": f"question {i}"}) + "\n"
                                                  for i in range(3)))
    for split in ("train", "test"):
        (folder / "qrels" / f"{split}.tsv").write_text("query-id\tcorpus-id\tscore\n"
                                                       + "".join(f"q{i}\td{i}\t1\n" for i in range(3)))
    return folder


def params_for(tmp_path: Path, halves: dict, **sources):
    return parse_params({
        "paths": {"root": "runs", "data": "data", "embeddings": "emb"},
        "data": {"sources": {"acme": {"path": "acme-beir"}, "acme-halves": {"halves": halves}, **sources},
                 "train": "acme/train", "validation_size": 1, "eval_sets": ["acme/test"]},
        "train": {"warm_starts": ["sbert"], "validation_sets": ["acme-halves/dev"]},
        "evaluate": {"systems": {"bm25": ["bm25"], "dense": ["sbert"]}},
        "tracking": {"enabled": False},
    })


def test_each_query_is_a_first_half_and_its_one_relevant_document_its_own_second_half(tmp_path):
    write_corpus(tmp_path / "acme-beir", [10, 3, 12, 20, 9, 11])
    params = params_for(tmp_path, {"of": "acme", "queries": 2, "documents": 4, "min_words": 10})
    paths = Paths.from_config(params.paths, base=tmp_path)
    report = download(params, paths, config_dir=tmp_path, progress=False)

    assert [(f.name, f.status) for f in report.datasets] == [("acme", "validated"), ("acme-halves", "validated")]
    split = load_split(paths, "acme-halves", "dev", progress=False)
    corpus, queries, qrels = split.corpus, split.queries, split.qrels
    assert len(corpus) == 4 and len(queries) == 2  # d1 and d4 are too short (3 and 9 words)
    assert {d[2:] for d in corpus} == {"d0", "d2", "d3", "d5"}
    for qid, text in queries.items():
        doc = qid[2:]
        assert qrels[qid] == {f"d:{doc}": 1}
        words = text.split() + corpus[f"d:{doc}"]["text"].split()
        assert words == [f"w{doc[1:]}x{j}" for j in range(len(words))]  # the two halves make the text again
        assert corpus[f"d:{doc}"]["title"] == ""  # the title would give the query away
    assert json.loads(paths.dataset_manifest("acme-halves").read_text())["dataset"] == "acme-halves"

    again = download(params, paths, config_dir=tmp_path, progress=False)
    assert [f.status for f in again.datasets] == ["present", "present"]  # nothing changed: not rebuilt

    changed = params_for(tmp_path, {"of": "acme", "queries": 2, "documents": 4, "min_words": 10, "seed": 1})
    assert [f.status for f in download(changed, paths, config_dir=tmp_path, progress=False).datasets][1] == "validated"


def test_the_draw_is_uniform_and_seeded_and_holds_at_most_the_documents_it_keeps(tmp_path):
    corpus = write_corpus(tmp_path / "c", [12] * 200) / "corpus.jsonl"
    cfg = HalvesConfig(of="c", documents=20, min_words=10, seed=3)
    first = sample_halves(corpus, cfg, "c")
    assert first == sample_halves(corpus, cfg, "c")  # seeded
    assert len(first) == 20 and len({d for d, _, _ in first}) == 20
    assert first != sample_halves(corpus, cfg.model_copy(update={"seed": 4}), "c")
    late = sum(int(d[1:]) >= 100 for seed in range(20)
               for d, _, _ in sample_halves(corpus, cfg.model_copy(update={"seed": seed}), "c"))
    assert 150 < late < 250  # about half of 400 draws from the corpus's second half: not just its first lines


def test_a_corpus_without_two_long_documents_is_an_error_naming_the_source_and_the_setting(tmp_path):
    write_corpus(tmp_path / "acme-beir", [5, 6, 90])
    params = params_for(tmp_path, {"of": "acme"})
    paths = Paths.from_config(params.paths, base=tmp_path)
    with pytest.raises(DataError, match=r"data.sources.acme-halves: 1 document\(s\) of at least 80 words.*min_words"):
        download(params, paths, config_dir=tmp_path, progress=False)
    assert not paths.dataset("acme-halves").exists()  # nothing half-written


def test_a_folder_of_the_same_name_that_pgrank_did_not_build_is_refused_and_left_alone(tmp_path):
    write_corpus(tmp_path / "acme-beir", [10, 12, 20])
    params = params_for(tmp_path, {"of": "acme", "queries": 2, "documents": 3, "min_words": 10})
    paths = Paths.from_config(params.paths, base=tmp_path)
    foreign = write_corpus(paths.dataset("acme-halves"), [4])  # e.g. a BEIR download of that name: no record
    before = (foreign / "corpus.jsonl").read_bytes()
    with pytest.raises(DataError, match=r"data.sources.acme-halves: .*acme-halves already holds a dataset that is "
                                        r"not this source"):
        download(params, paths, config_dir=tmp_path, progress=False)
    assert (foreign / "corpus.jsonl").read_bytes() == before


def test_half_documents_come_after_the_corpus_they_cut():
    sources = {"h": SourceConfig(halves=HalvesConfig(of="scifact")), "acme": SourceConfig(path="acme-beir")}
    assert with_parents(["nfcorpus", "h", "acme"], sources) == ["nfcorpus", "scifact", "h", "acme"]
    assert with_parents(["scifact", "h"], sources) == ["scifact", "h"]


@pytest.mark.parametrize("source, message", [
    ({"halves": {"of": "acme"}, "path": "x"}, "give exactly one of 'path'"),
    ({"halves": {"of": "acme", "typo": 1}}, "typo"),
    ({"halves": {"of": "acme"}, "sha256": "0" * 64}, "sha256 pins a zip"),
    ({"halves": {"of": "acme-halves"}}, "is this source itself"),
    ({"halves": {"of": "acme", "documents": 1}}, "greater than or equal to 2"),
])
def test_bad_half_document_settings_name_the_key(tmp_path, source, message):
    with pytest.raises(ConfigError, match=message):
        parse_params({
            "paths": {"root": "runs"},
            "data": {"sources": {"acme": {"path": "a"}, "acme-halves": source}, "train": "acme/train",
                     "eval_sets": ["acme/test"]},
            "train": {"warm_starts": ["sbert"]},
            "evaluate": {"systems": {"bm25": ["bm25"], "dense": ["sbert"]}},
        })
