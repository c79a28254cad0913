"""pgrank.data.runs: the TREC candidate file and the authors' published format."""

from __future__ import annotations

import json

import pytest

from pgrank.data.runs import iter_run, ranked, read_run, write_run
from pgrank.errors import DataError
from pgrank.retrieval.published.candidates import fetch_published, read_published


def test_ranked_orders_by_score_then_id():
    assert ranked({"b": 1.0, "a": 1.0, "c": 2.0}) == [("c", 2.0), ("a", 1.0), ("b", 1.0)]


def test_round_trip_keeps_order_and_float32_scores(tmp_path):
    path = tmp_path / "c" / "test.trec"
    run = {"q2": ranked({"d1": 0.123456789, "d2": -3.5}), "q1": ranked({"d9": 7.0})}
    write_run(path, run, "pgrank-bm25")
    lines = path.read_text().splitlines()
    assert lines[0] == "q1 Q0 d9 1 7 pgrank-bm25"
    assert lines[1].startswith("q2 Q0 d1 1 0.12345679") and lines[2] == "q2 Q0 d2 2 -3.5 pgrank-bm25"
    back = read_run(path)
    assert list(back) == ["q1", "q2"] and list(back["q2"]) == ["d1", "d2"]
    assert back["q2"]["d1"] == dict(run["q2"])["d1"]  # float32 round-trips exactly
    assert [q for q, _ in iter_run(path)] == ["q1", "q2"]
    assert not list(tmp_path.glob("c/.*tmp"))


def test_ids_with_whitespace_are_refused(tmp_path):
    with pytest.raises(DataError, match="contains whitespace"):
        write_run(tmp_path / "x.trec", {"q 1": [("d", 1.0)]}, "pgrank-bm25")
    assert not (tmp_path / "x.trec").exists()


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("q1 Q0 d1 1 0.5\n", r"x\.trec:1: expected 6 fields"),
        ("q1 Q0 d1 1 0.5 t\nq1 Q0 d2 2 high t\n", r"x\.trec:2: rank '2' / score 'high'"),
        ("q1 Q0 d1 1 0.5 t\nq1 Q0 d1 2 0.4 t\n", r"x\.trec:2: document 'd1' listed twice"),
        ("q1 Q0 d1 1 0.5 t\nq2 Q0 d1 1 0.5 t\nq1 Q0 d2 2 0.4 t\n", r"x\.trec:3: query 'q1' appears again"),
    ],
)
def test_malformed_candidate_files_name_file_and_line(tmp_path, text, message):
    path = tmp_path / "x.trec"
    path.write_text(text)
    with pytest.raises(DataError, match=message):
        read_run(path)


def test_missing_candidate_file_says_what_to_run(tmp_path):
    with pytest.raises(DataError, match="run `pgrank mine`"):
        read_run(tmp_path / "none.trec")


RECORDS = [
    {"qid": 7, "topk": {"d5": 0.5, "g1": None, "d2": 0.9, "d3": 0.5, "g0": None}},
    {"qid": "q8", "topk": {"g9": None}},
]


@pytest.mark.parametrize("layout", ["list", "lines"])
def test_published_file_is_converted(tmp_path, layout):
    path = tmp_path / "scifact_candidate-set_gtrxl+gt_1000_test.json"
    if layout == "list":
        path.write_text(json.dumps(RECORDS, indent=1))
    else:
        path.write_text("".join(json.dumps(r) + "\n" for r in RECORDS))
    sets = read_published(path)
    assert list(sets) == ["7", "q8"]
    docs = [d for d, _ in sets["7"]]
    assert docs == ["d2", "d3", "d5", "g1", "g0"]  # real scores ranked; nulls below, in file order
    scores = [s for _, s in sets["7"]]
    assert scores == sorted(scores, reverse=True) and len(set(scores)) == 4  # d3/d5 tie only
    assert max(scores[3:]) < min(scores[:3])
    assert sets["q8"] == [("g9", -1.0)]
    # The converted sets are ordinary candidate files.
    write_run(tmp_path / "out.trec", sets, "pgrank-published")
    assert list(read_run(tmp_path / "out.trec")["7"]) == docs


@pytest.mark.parametrize(
    ("content", "message"),
    [
        ('{"qid": 1, "topk": {"d": "high"}}\n', r":1: query '1', document 'd': score 'high'"),
        ('{"qid": 1, "topk": {}}\n{"qid": 1, "topk": {}}\n', r":2: query '1' appears twice"),
        ('{"qid": 1}\n', r":1: expected \{\"qid\""),
        ('{"qid": 1, "topk": {}\n', r":1: not valid JSON"),
        ('[{"qid": 1, "topk": []}]', r"record 1: expected"),
        ("", "no records"),
    ],
)
def test_malformed_published_files(tmp_path, content, message):
    path = tmp_path / "p.json"
    path.write_text(content)
    with pytest.raises(DataError, match=message):
        read_published(path)


def test_fetch_published_from_a_local_folder(tmp_path):
    path = tmp_path / "nfcorpus_candidate-set_gtrxl+gt_1000_dev.json"
    path.write_text("[]")
    assert fetch_published("nfcorpus", "dev", str(tmp_path)) == path
    with pytest.raises(DataError, match="no such file \\(mine.published_dir\\).*NeuralPGRank/nfcorpus-hard-negatives"):
        fetch_published("nfcorpus", "test", str(tmp_path))


def test_published_sets_exist_for_dev_and_test_only(tmp_path):
    with pytest.raises(DataError, match="dev and test splits only"):
        fetch_published("msmarco", "train-pg", str(tmp_path))
