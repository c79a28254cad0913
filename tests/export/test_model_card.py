"""The model card's parts that need no trained policy: the citation, the objective's name, the repository link, the
pools of sets that are not BEIR's, and its front matter as the hub's parser reads it."""

from __future__ import annotations

import re
import subprocess
from dataclasses import replace
from pathlib import Path

import pytest
import yaml

from pgrank.config import load_params
from pgrank.export.model_card import CITATION, Figure, PolicyFacts, objective_name, policy_facts, render

ROOT = Path(__file__).resolve().parents[2]


def test_the_card_cites_the_paper_exactly_as_the_readme_does():
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    cited = re.findall(r"```bibtex\n(.*?)\n```", readme, flags=re.S)
    assert cited == [CITATION]


@pytest.mark.parametrize(("profile", "overrides", "name"), [
    (None, [], "PG-Rank (the policy gradient of Neural PG-Rank)"),  # the paper: nothing added
    ("demo", [], "PG-Rank (the policy gradient of Neural PG-Rank) plus a top-1 KL term to the warm start's first-place "
                 "distribution (`train.pg.kl_coef` 0.1), a document anchor to the warm start's document tower "
                 "(`train.document_anchor.coef` 0.3, on 2 candidates of each batch) and a selection rule over epochs "
                 "and weight mixtures with the warm start on validation splits (`train.selection.rule: guarded`)"),
    ("demo", ["train.pg.kl=ranking", "train.document_anchor.coef=0", "train.selection={rule: last}"],
     "PG-Rank (the policy gradient of Neural PG-Rank) plus a sampled ranking KL term to the warm start's policy "
     "(`train.pg.kl_coef` 0.1)"),
    ("demo", ["train.objectives=[infonce]", "train.pg.kl_coef=0", "train.selection={rule: last}",
              "train.document_anchor.coef=0"], "the `infonce` objective (not PG-Rank) on PG-Rank's candidate sets"),
])
def test_the_objective_is_named_for_everything_that_trained_it(profile, overrides, name):
    params = load_params(ROOT / "params.yaml", overrides, profile)
    assert objective_name(params, params.train.objectives[0]) == name


def test_the_repository_is_the_checkouts_origin_as_an_https_url(tmp_path):
    from pgrank.export.card_metadata import repository_url

    subprocess.run(["git", "init", "-q", str(tmp_path)], check=True)
    assert repository_url(tmp_path) is None  # no remote: no link, rather than a guessed one
    for remote, url in (("git@github.com:someone/pgrank.git", "https://github.com/someone/pgrank"),
                        ("https://gitlab.example.org/ir/pgrank.git", "https://gitlab.example.org/ir/pgrank")):
        subprocess.run(["git", "-C", str(tmp_path), "remote", "remove", "origin"], capture_output=True)
        subprocess.run(["git", "-C", str(tmp_path), "remote", "add", "origin", remote], check=True)
        assert repository_url(tmp_path) == url


def test_the_demo_cards_limitations_name_the_dbpedia_pool_and_its_20_queries(tmp_path):
    """The demo's DBPedia row is the report half of a 5,000-document pool's judged queries: the card says so."""
    from huggingface_hub import ModelCard
    from huggingface_hub.repocard_data import model_index_to_eval_results

    from pgrank.paths import Paths

    params = load_params(ROOT / "params.yaml", [], "demo")
    paths = Paths.from_config(params.paths, base=tmp_path)
    corpus = paths.dataset("dbpedia") / "corpus.jsonl"
    corpus.parent.mkdir(parents=True)
    corpus.write_text("".join(f'{{"_id": "d{i}", "text": "x"}}\n' for i in range(5000)))
    meta = {"epoch": 2, "alpha": 0.5, "selected_by": "guarded", "tower": "query", "similarity": "dot"}
    facts = policy_facts(params, paths, "pgrank-minilm", meta, "models/minilm/pg/selected")
    assert facts.not_evaluated[0] == "scifact/test (second stage (rerank))"  # nothing was evaluated in tmp_path
    onnx = (("document_vectors", "float16"), ("documents", "onnx"), ("queries", "onnx"))
    figures = [Figure("scifact", "test", "rerank", 300, 0.7295, 0.6451, 1e-12, onnx),
               Figure("dbpedia", "test", "full", 20, 0.41, 0.42, 0.5, onnx)]
    facts = replace(facts, figures=figures, not_evaluated=[], documents={"dbpedia": 5000},
                    pools={"dbpedia/test": "the report half, cut by query hash, of the test queries of the subset "
                                           "`dbpedia-entity-subset.zip` (not on BEIR's server)"})
    card = ModelCard(render(facts, "/models/pgrank-minilm"))
    body = " ".join(card.text.split())
    assert ("`dbpedia/test` is 20 queries over a 5,000-document pool (the report half, cut by query hash, of the test "
            "queries of the subset `dbpedia-entity-subset.zip` (not on BEIR's server)), not a BEIR corpus") in body
    assert "with 20 queries only large differences are significant" in body
    assert "`scifact/test`" not in body.split("## Limitations")[1].split("## Use it")[0].split("Precision")[0]
    assert 'SentenceTransformer("/models/pgrank-minilm")' in body
    assert card.data.license == "apache-2.0" and card.data.base_model == "sentence-transformers/all-MiniLM-L6-v2"
    name, results = model_index_to_eval_results(card.data.to_dict()["model-index"])
    assert name == "pgrank-minilm"  # a folder is named by its policy; a hub export by its repository
    assert [(r.dataset_type, r.dataset_split, r.task_type, r.metric_value) for r in results] == [
        ("BeIR/scifact", "test", "reranking", 0.7295), ("dbpedia", "test", "information-retrieval", 0.41)]
    hub = yaml.safe_load(render(facts, "me/pgrank-minilm").split("---\n")[1])
    assert hub["model-index"][0]["name"] == "me/pgrank-minilm"


def test_a_card_without_figures_has_no_model_index():
    facts = PolicyFacts(system="pgrank-x", warm_start="x", warm_start_model="x", base_model=None, loss="pg", run="pg",
                        tower="both", similarity="cosine", max_seq_length=64, train_set="toy/train", train_queries=None,
                        validation_queries=None, candidates="", epoch=1, epochs=1, selection="", objective="PG-Rank")
    meta = yaml.safe_load(render(facts).split("---\n")[1])
    assert "model-index" not in meta and meta["license"] == "other"
