"""BEIR's table of datasets: download base URL, published archive MD5s, and the ones not public.

The MD5s are those BEIR publishes for its own zips (``md5sum NAME.zip``): the "Available Datasets"
table of the BEIR README (github.com/beir-cellar/beir) and, for the multilingual sets, the BEIR
wiki page "Multilingual datasets". Where BEIR's older ``examples/dataset/md5.csv`` disagrees
(webis-touche2020 and fever were re-uploaded), the README's current value is used.

A name missing from :data:`BEIR_MD5` (msmarco-v2, trec-covid-v2, mmarco, ...) can still be
downloaded: it is verified against a mirror's ``SHA256SUMS`` when one covers it, and otherwise
extracted with a warning that it could not be verified.
"""

from __future__ import annotations

BEIR_BASE_URL = "https://public.ukp.informatik.tu-darmstadt.de/thakur/BEIR/datasets"

BEIR_MD5: dict[str, str] = {
    # BEIR README, "Available Datasets"
    "msmarco": "444067daf65d982533ea17ebd59501e4",
    "trec-covid": "ce62140cb23feb9becf6270d0d1fe6d1",
    "nfcorpus": "a89dba18a62ef92f7d323ec890a0d38d",
    "nq": "d4d3d2e48787a744b6f6e691ff534307",
    "hotpotqa": "f412724f78b0d91183a0e86805e16114",
    "fiqa": "17918ed23cd04fb15047f73e6c3bd9d9",
    "arguana": "8ad3e3c2a5867cdced806d6503f29b99",
    "webis-touche2020": "46f650ba5a527fc69e0a6521c5a23563",
    "cqadupstack": "4e41456d7df8ee7760a7f866133bda78",
    "quora": "18fb154900ba42a600f84b839c173167",
    "dbpedia-entity": "c2a39eb420a3164af735795df012ac2c",
    "scidocs": "38121350fc3a4d2f48850f6aff52e4a9",
    "fever": "5a818580227bfb4b35bb6fa46d9b6c03",
    "climate-fever": "8b66f0a9126c521bae2bde127b4dc99d",
    "scifact": "5f7d1de60b170fc8027bb7898e2efca1",
    # BEIR wiki, "Multilingual datasets"
    "germanquad": "95a581c3162d10915a418609bcce851b",
    "vihealthqa": "7685a360a837934624a8018d826c383f",
}

# BEIR lists these but does not host them (licenses); each must be rebuilt by the user and served
# from a mirror. Value: BEIR's instructions.
NOT_PUBLIC: dict[str, str] = {
    "bioasq": "https://github.com/beir-cellar/beir/blob/main/examples/dataset#2-bioasq",
    "signal1m": "https://github.com/beir-cellar/beir/blob/main/examples/dataset#4-signal-1m",
    "trec-news": "https://github.com/beir-cellar/beir/blob/main/examples/dataset#1-trec-news",
    "robust04": "https://github.com/beir-cellar/beir/blob/main/examples/dataset#3-robust04",
}

# The datasets of the paper (its appendix table), by BEIR name. msmarco's test split is TREC-DL 2019.
PAPER_DATASETS: tuple[str, ...] = (
    "msmarco", "trec-covid", "nfcorpus", "nq", "hotpotqa", "fiqa", "arguana", "webis-touche2020",
    "quora", "dbpedia-entity", "scidocs", "fever", "climate-fever", "scifact",
)

# Sizes of BEIR's datasets (the BEIR paper's Table 1; scifact and nfcorpus checked against the files):
# documents in the corpus, and judged queries per split. `pgrank plan` prices a run with them before
# anything is downloaded (a dataset on disk is counted instead).
BEIR_SIZES: dict[str, dict] = {
    "msmarco": {"documents": 8_841_823, "train": 502_939, "dev": 6_980, "test": 43},
    "trec-covid": {"documents": 171_332, "test": 50},
    "nfcorpus": {"documents": 3_633, "train": 2_590, "dev": 324, "test": 323},
    "nq": {"documents": 2_681_468, "test": 3_452},
    "hotpotqa": {"documents": 5_233_329, "train": 85_000, "dev": 5_447, "test": 7_405},
    "fiqa": {"documents": 57_638, "train": 5_500, "dev": 500, "test": 648},
    "arguana": {"documents": 8_674, "test": 1_406},
    "webis-touche2020": {"documents": 382_545, "test": 49},
    "quora": {"documents": 522_931, "dev": 5_000, "test": 10_000},
    "dbpedia-entity": {"documents": 4_635_922, "dev": 67, "test": 400},
    "scidocs": {"documents": 25_657, "test": 1_000},
    "fever": {"documents": 5_416_568, "train": 109_810, "dev": 6_666, "test": 6_666},
    "climate-fever": {"documents": 5_416_593, "test": 1_535},
    "scifact": {"documents": 5_183, "train": 809, "test": 300},
    # not BEIR's: the pooled DBPedia-Entity subset that the offline mirror holds (the demo's), counted on its files
    "dbpedia-entity-subset": {"documents": 5_000, "test": 40},
}
