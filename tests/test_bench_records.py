"""Every benchmark writes a record (command, title, machine, results) that the docs' benchmarks page renders.

The scripts that measure something in seconds run here for real, with their smallest arguments and a tiny encoder,
into a temporary ``--out`` folder; ``docs/generate.py`` then renders the benchmarks page from that folder, and every
record must appear on it with its command, its machine and its script's ``render(record)``, the text the script
printed. The scripts whose smallest run takes minutes (``compare_lr``, ``kl_ablation`` and ``scale`` train or run
the pipeline; ``embedding_precision`` encodes whole corpora with MiniLM), and the parts of the others that do
(``backends``' quality guard, ``mining``'s peak RSS, ``training``'s memory), are rendered from records shaped by the
scripts' own functions over fixture values, which are not measurements.
"""

from __future__ import annotations

import contextlib
import io
import json
import runpy
import sys
from pathlib import Path

import numpy as np
import pytest
from script_modules import load_script

ROOT = Path(__file__).resolve().parents[1]
BENCH = ROOT / "bench"
STUDIES = ROOT / "studies"


def _folder(name: str) -> Path:
    """The folder of script ``name``: ``studies/`` for a study, else ``bench/``."""
    return STUDIES if (STUDIES / f"{name}.py").is_file() else BENCH


@pytest.fixture(scope="module")
def generate():
    """``docs/generate.py`` and the scripts' own imports (``bench/record.py``, and a study's neighbours)."""
    with pytest.MonkeyPatch.context() as mp:
        mp.syspath_prepend(str(STUDIES))
        mp.syspath_prepend(str(BENCH))
        yield load_script(ROOT / "docs" / "generate.py", "_docs_generate")


def script(name: str):
    """``bench/<name>.py`` or ``studies/<name>.py`` as a module (its ``render`` and result functions), without running
    it."""
    return load_script(_folder(name) / f"{name}.py", f"_bench_{name}")


def _runs(tiny: Path, mirror: Path, work: Path) -> dict[str, list[str]]:
    """Each quick script with its smallest arguments."""
    return {
        "estimator": ["-B", "2", "-n", "50", "-N", "10", "20", "--loop-samples", "10", "--repeats", "1"],
        "search": ["--docs", "2000", "--queries", "10", "--k", "10", "--repeats", "1"],
        "evaluation": ["--docs", "1000", "--queries", "5", "--candidates", "100"],
        "tables": ["--repeats", "1", "--formats", "md", "--steps-per-epoch", "1"],
        "training": ["--model", str(tiny), "--skip-memory", "-n", "10", "--queries", "2", "--repeats", "1",
                     "--doc-len", "8"],
        "mining": ["--model", str(tiny), "--mirror", str(mirror), "--docs", "8", "--batch-size", "4", "--chunk-size", "4",
                   "--max-seq-length", "32", "--repeats", "1", "--skip", "rss"],
        "backends": ["--work", str(work / "backends"), "--model", str(tiny), "--backends", "torch", "--docs", "8",
                     "--batch-size", "4", "--repeats", "1", "--eval-sets", "scifact/test", "--skip-quality"],
        "gate_power": ["--trials", "2000"],
        "forgetting": ["--corpus", str(_first_documents(mirror / "scifact.zip", work / "corpus.jsonl", 40)),
                       "--policy", f"tiny={tiny}", "--warm-start", str(tiny), "--alphas", "1", "0.5", "--queries", "8",
                       "--documents", "20", "--max-length", "32"],
    }


def _first_documents(archive: Path, out: Path, n: int) -> Path:
    """The first ``n`` lines of a BEIR zip's corpus.jsonl, as a corpus file of their own."""
    import zipfile

    with zipfile.ZipFile(archive) as z:
        name = next(m for m in z.namelist() if m.endswith("corpus.jsonl"))
        lines = z.read(name).decode("utf-8").splitlines()[:n]
    out.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return out


@pytest.fixture(scope="module")
def recorded(generate, tmp_path_factory, tiny_model_dir, beir_mirror) -> tuple[Path, dict[str, str]]:
    """``(the --out folder, {script: what it printed})``: every quick script run once, as ``python bench/<name>.py``
    runs it (in this process, which has torch and sentence-transformers imported already)."""
    pytest.importorskip("faiss", reason="bench/search.py compares against FAISS (pgrank[cpu])")
    work = tmp_path_factory.mktemp("bench-work")
    out = work / "out"
    printed = {}
    with pytest.MonkeyPatch.context() as mp:
        mp.chdir(work)  # MLflow's default artifact folder (./mlruns) lands here, not in the checkout
        mp.setenv("PGRANK_BEIR_MIRROR", str(beir_mirror))
        mp.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{work / 'mlflow.db'}")  # one tracking database for all
        for name, args in _runs(tiny_model_dir, beir_mirror, work).items():
            mp.setattr(sys, "argv", [f"{_folder(name).name}/{name}.py", *args, "--out", str(out / f"{name}.json")])
            buffer = io.StringIO()
            with contextlib.redirect_stdout(buffer):
                runpy.run_path(str(_folder(name) / f"{name}.py"), run_name="__main__")
            printed[name] = buffer.getvalue()
    return out, printed


QUICK = ["estimator", "search", "evaluation", "tables", "training", "mining", "backends", "gate_power", "forgetting"]


@pytest.mark.parametrize("name", QUICK)
def test_a_script_writes_its_record_and_prints_its_rendering(recorded, name):
    out, printed = recorded
    record = json.loads((out / f"{name}.json").read_text())
    assert record["command"].startswith(f"python {_folder(name).name}/{name}.py ")
    assert record["command"].endswith(f"--out {out / f'{name}.json'}")
    assert record["title"] and "\n" not in record["title"]
    assert record["machine"]["cores"] >= 1 and record["machine"]["libraries"]["torch"]
    rendered = script(name).render(record)
    assert "| --- " in rendered or "| ---: " in rendered  # at least one Markdown table
    assert rendered in printed[name]  # what it printed is what the docs render


def test_the_benchmarks_page_renders_every_record(generate, recorded):
    out, _ = recorded
    page = generate.benchmarks(out)
    for name in QUICK:
        record = json.loads((out / f"{name}.json").read_text())
        section = page.split(f"## {record['title']}", 1)[1].split("\n## ", 1)[0]
        assert f"`bench/out/{name}.json`" in section  # the record is named where its figures are
        assert f"{generate._machine(record['machine'])}." in section
        tables = [line for line in script(name).render(record).splitlines() if line.startswith("|")]
        assert tables and all(line in section for line in tables)


# --------------------------------------------------------------------------------------- fixture records


@pytest.fixture(scope="module")
def head() -> dict:
    """A record's head as ``bench/record.py`` writes it, on this machine."""
    return {"title": "fixture", "machine": load_script(BENCH / "record.py", "_bench_machine").machine_record()}


def as_written(record: dict) -> dict:
    """The record as ``bench/record.py`` writes it and the docs read it back (JSON, keys sorted)."""
    return json.loads(json.dumps(record, sort_keys=True))


def test_compare_lr_renders_its_grid_and_the_chosen_rates(generate, head):
    compare_lr = script("compare_lr")
    results = {"pg": {1e-5: (0.60, 0.03, 100.0), 3e-5: (0.65, 0.08, 101.0), 1e-4: (0.62, 0.05, 99.0)},
               "listmle": {1e-6: (0.57, 0.0, 98.0), 1e-5: (0.43, -0.14, 97.0)}}
    record = {**head, "command": "python studies/compare_lr.py --work /tmp/lr", "profile": "compare",
              "grid": [1e-5, 3e-5, 1e-4], "extend": 2, "objectives": ["pg", "listmle"], "setup_seconds": 60.0,
              **compare_lr.grid_results(results)}
    text = generate._render(as_written(record))
    assert text.splitlines()[0] == "| objective | lr 1e-06 | lr 1e-05 | lr 3e-05 | lr 0.0001 | chosen |"
    assert "| pg |  | 0.6000 (+0.0300, 100 s) | 0.6500 (+0.0800, 101 s) | 0.6200 (+0.0500, 99 s) | 3e-05 |" in text
    assert text.endswith("{pg: 3e-05, listmle: 1e-06}")


def test_kl_ablation_renders_every_run_and_the_setting_chosen_on_validation(generate, head):
    kl = script("kl_ablation")

    def test_figures(value: float, p: float | None) -> dict:
        return {c: {"ndcg_at_10": value, "p": p} for c in kl.COLUMNS}

    runs = [{"kl": label, "rule": rule, "epoch": epoch, "seconds": 100.0, "test": test_figures(value, 0.01),
             "val_in": gain, "val_ood": {"nfcorpus/dev": ood}}
            for label, rule, epoch, value, gain, ood in [("none", "last", 4, 0.73, 0.10, -0.006),
                                                         ("none", "guarded", 4, 0.73, 0.10, -0.006),
                                                         ("top1 0.1", "last", 4, 0.72, 0.09, 0.004),
                                                         ("top1 0.1", "guarded", 3, 0.71, 0.08, 0.004)]]
    record = {**head, "command": "python studies/kl_ablation.py --work /tmp/kl", "coefs": [0.1], "kinds": ["top1"],
              "ood": ["nfcorpus/dev"], "margin": 0.005, "columns": kl.COLUMNS, "setup_seconds": 60.0,
              "warm_start": test_figures(0.65, None), "runs": runs, "chosen": kl.choose(runs, 0.005)}
    text = generate._render(as_written(record))
    assert "| (warm start) | 0 |  |  | 0.6500 | 0.6500 | 0.6500 | 0.6500 |" in text
    assert "| top1 0.1 | 3 (guarded) | +0.0800 | +0.0040 | 0.7100 (+0.0600, p=0.01) |" in text
    assert text.endswith("top1 0.1, guarded epoch 3")  # "none" gains more in domain but loses 0.006 > 0.005 out of it


def test_variants_never_chooses_a_variant_that_did_not_validate_out_of_domain(generate, head):
    variants = script("variants")

    def run(name: str, seed: int, gain: float, ood: dict, seconds: float | None) -> dict:
        return {"variant": name, "objective": "pg", "overrides": [], "seed": seed, "seconds": seconds, "epoch": 4,
                "alpha": 1.0, "val_in": gain, "val_ood": ood, "history": []}

    runs = [run("demo", 42, 0.10, {"nfcorpus/dev": 0.002}, 90.0), run("demo", 43, 0.11, {"nfcorpus/dev": 0.001}, 94.0),
            run("in-domain", 42, 0.12, {}, None), run("in-domain", 43, 0.13, {}, None)]  # read back with --reuse
    record = {**head, "command": "python studies/variants.py --work /tmp/v --reuse", "profile": "demo",
              "ood": ["nfcorpus/dev"], "setup_seconds": 10, "warm": None, "runs": runs}
    record["summary"] = variants.summarise(record, 0.005)
    assert record["summary"]["chosen"] == "demo"  # in-domain gains more, but never showed that it is safe
    assert record["summary"]["variants"]["demo"]["seconds"] == 92.0
    assert record["summary"]["variants"]["in-domain"]["seconds"] is None
    text = generate._render(as_written(record))
    assert "| in-domain | 2 | (4, 1), (4, 1) | +0.1250 | not validated |" in text
    assert "Validation only chooses: **demo**" in text


def test_variants_heads_a_split_other_than_test_by_its_split_not_as_a_test_set(generate, head):
    variants = script("variants")
    cells = ["nfcorpus/rerank", "nfcorpus/train/rerank"]
    figure = {"ndcg@10": 0.33, "per_query": {"q1": 0.3, "q2": 0.36}}
    runs = [{"variant": "demo", "objective": "pg", "overrides": [], "seed": 42, "seconds": 90.0, "epoch": 4,
             "alpha": 1.0, "val_in": 0.1, "val_ood": {"nfcorpus/dev": 0.002}, "history": [],
             "test": {c: figure for c in cells}}]
    record = {**head, "command": "python studies/variants.py --work /tmp/v --test", "profile": "demo",
              "ood": ["nfcorpus/dev"], "setup_seconds": 10,
              "warm": {c: {"ndcg@10": 0.32, "per_query": {"q1": 0.3, "q2": 0.34}} for c in cells},
              "runs": runs, "test_cells": cells}
    record["summary"] = variants.summarise(record, 0.005)
    text = generate._render(as_written(record))
    assert "| test nfcorpus/rerank | nfcorpus/train/rerank |" in text
    assert "Cells named by their split (nfcorpus/train/rerank) evaluate that split, not a test split" in text


def test_variants_with_forgetting_checks_never_chooses_a_variant_that_forgets_half_documents(generate, head):
    variants = script("variants")

    def run(name: str, gain: float, halves: float) -> dict:
        return {"variant": name, "objective": "pg", "overrides": [], "seed": 42, "seconds": 90.0, "epoch": 4,
                "alpha": 1.0, "val_in": gain, "val_ood": {"nfcorpus/dev": 0.002, "halves:nfcorpus": halves},
                "history": []}

    runs = [run("demo", 0.11, -0.026), run("anchor", 0.10, -0.003)]
    record = {**head, "command": "python studies/variants.py --work /tmp/v --forgetting", "profile": "demo",
              "ood": ["nfcorpus/dev", "halves:nfcorpus"], "setup_seconds": 10, "warm": None, "runs": runs}
    record["summary"] = variants.summarise(record, 0.005)
    assert record["summary"]["chosen"] == "anchor"  # demo gains more in domain, but forgets half-documents
    text = generate._render(as_written(record))
    assert "| demo | 1 | (4, 1) | +0.1100 | +0.0020 | -0.0260 |" in text


def test_a_half_document_task_scores_each_query_by_its_own_second_half(tmp_path):
    forgetting = script("forgetting")
    import numpy as np

    docs = np.eye(12)[:, :12]
    queries = docs.copy()
    queries[3] = docs[5]  # query 3 now points at document 5: its own is ranked below
    got = forgetting.ndcg_own(queries, docs)
    assert got[0] == 1.0  # first: ties with the others (all at 0) do not count against it
    assert got[3] == pytest.approx(1 / np.log2(3))  # second: document 5 scores above its own
    corpus = tmp_path / "corpus.jsonl"
    corpus.write_text("\n".join(json.dumps({"_id": str(i), "title": "", "text": " ".join(f"w{i}x{j}" for j in range(n))})
                                for i, n in enumerate([10, 3, 12])) + "\n")
    first, second = forgetting.halves(corpus, min_words=10, documents=5, seed=0)
    assert sorted(first) == ["w0x0 w0x1 w0x2 w0x3 w0x4", "w2x0 w2x1 w2x2 w2x3 w2x4 w2x5"]  # the short one is left out
    assert sorted(second) == ["w0x5 w0x6 w0x7 w0x8 w0x9", "w2x6 w2x7 w2x8 w2x9 w2x10 w2x11"]
    assert [a.split("x")[0] for a in first] == [b.split("x")[0] for b in second]  # query i's document is i


def test_scale_renders_its_fits_in_the_pipelines_order(generate, head):
    scale = script("scale")
    stages = ["download", "train@static", "evaluate-bm25@bm25-msmarco"]  # the order of the run, not of the alphabet

    def fraction(f: float) -> dict:
        return {"fraction": f, "stats": {"passages": int(8_841_823 * f)},
                "stages": {s: {"wall_s": 4000 * f, "rss_mib": int(500 + 8000 * f)} for s in stages},
                "sizes": {"corpus.jsonl": 2**20}, "train_pairs": 1000,
                "bm25": {"queries": 64, "new_qps": 100.0, "old_qps": 10.0, "ratio": 10.0, "first_batch_s": 1.0,
                         "numba": False}}

    results = [fraction(0.01), fraction(0.1)]
    record = {**head, "command": "python bench/scale.py", "fractions": [0.01, 0.1], "results": results,
              "fits": scale.fit(results)}
    lines = generate._render(as_written(record)).splitlines()
    assert [line.split(" | ")[0] for line in lines[2:5]] == [f"| {s}" for s in stages]
    assert lines[2].endswith("| 500 + 8000 f | 8.3 GiB | 1.1 h (f^1.00) |")
    assert "f=0.1: 1,000 training candidate pairs; on disk: corpus.jsonl 1 MiB; BM25 mining 100.0 queries/s" in lines[-1]


def test_embedding_precision_backends_mining_and_training_render_their_long_parts(generate, head):
    ndcg = {"first_stage": 0.6451, "second_stage": 0.6452}
    records = {
        "embedding_precision": {"model": "sentence-transformers/all-MiniLM-L6-v2", "max_seq_length": 256,
                                "split": "test", "datasets": [{"dataset": "scifact", "docs": 5183, "encode_s": 100.0,
                                                               "ndcg_at_10": {"float32": ndcg, "float16": ndcg}}]},
        "backends": {"model": "minilm", "threads": 2, "amx_bf16": False, "avx512_vnni": True, "int8_isa": "avx512_vnni",
                     "auto": "onnx-int8", "throughput": {"passages": 8, "tokens": 256, "batch": 4, "repeats": 1,
                                                         "backends": [{"backend": "torch", "docs_per_s": 40.0}]},
                     "quality": [{"backend": "torch", "eval_set": "scifact/test", "ndcg_at_10": 0.6451, "bound": 0.005,
                                  "docs_per_s": 30.0},
                                 {"backend": "onnx-int8", "eval_set": "scifact/test", "ndcg_at_10": 0.6600,
                                  "bound": 0.01, "docs_per_s": None}]},
        "mining": {"cpus": 2, "threads": 2, "rss": {"model": "minilm", "max_seq_length": 64, "k": 1000, "sources": [
            {"source": "bm25", "seconds": 20.0, "peak_mib": 400.0}, {"source": "dense", "exit_code": 1}]}},
        "training": {"model": "minilm", "profile": "demo", "candidates": 100, "doc_len": 64, "chunk": 64, "repeats": 3,
                     "threads": 2, "pg": {"num_samples": 200, "utility": "ndcg@10", "estimator": "per_rank",
                                          "temperature": 0.05, "entropy": "top1", "entropy_coef": 0.01, "kl": "top1",
                                          "kl_coef": 0.1},
                     "towers": [], "memory": [{"chunks": "chunked", "n100_mib": 100.0, "n1000_mib": 120.0}]},
    }
    expected = {"embedding_precision": "| scifact | 5183 | second stage (rerank) | 0.64520 | 0.64520 | +0.00000 |",
                "backends": "| onnx-int8 | scifact/test | 0.6600 | +0.0149 | 0.01 MISSED | (cached) |",
                "mining": "| dense | failed (exit code 1) |  |",
                "training": "| chunked | 100.0 | 120.0 | 1.20 |"}
    for name, body in records.items():
        record = {**head, "command": f"python {_folder(name).name}/{name}.py", **body}
        assert expected[name] in generate._render(as_written(record)), name


def test_demo_time_reads_the_stage_walls_a_demo_logs_and_renders_each_revision_against_the_first(generate, head):
    demo_time = script("demo_time")
    output = ("reading corpus.jsonl: 100%|##| 6.22M/6.22M \r"  # a progress bar ends on the line of the next stage
              "pgrank: download: wall 3.5 s, peak RSS 300 MiB (children 0 MiB)\n"
              "INFO:pgrank.tracking:mine/scifact/test: wall 9.4 s\n"  # the logger's copy of the line is not counted
              "pgrank: mine/scifact/test: wall 9.4 s, peak RSS 900 MiB (children 225 MiB)\n"
              "epoch 4/4: 100%|| 23/23 [00:19<00:00]\n"
              "pgrank: train-minilm: wall 101.5 s, peak RSS 2400 MiB (children 1002 MiB)\n")
    walls = demo_time.stage_walls(output)
    assert walls == {"download": 3.5, "mine/scifact/test": 9.4, "train-minilm": 101.5}
    assert demo_time.training_seconds(walls) == 101.5
    runs = [{"rev": rev, "commit": commit * 40, "repeat": 1, "seconds": seconds, "walls": {}, "training": training}
            for rev, commit, seconds, training in [("old", "a", 450.0, 100.0), ("HEAD", "b", 540.0, 185.0)]]
    record = {**head, "command": "python bench/demo_time.py --work /tmp/t --mirror m --rev old --rev HEAD",
              "runs": runs, "revisions": [{"rev": "old", "runs": 1, "mean_seconds": 450.0},
                                          {"rev": "HEAD", "runs": 1, "mean_seconds": 540.0}]}
    text = generate._render(as_written(record))
    assert "| 2 | 1 | 540 | 185 | 355 |" in text  # each revision by its place in the command, never its hash
    assert "by its place: 1 for the first, 2 for the second." in text
    assert "bbbbbbb" not in text and "| HEAD |" not in text
    assert text.endswith("| 2 | 1 | 540 | 1.20x |")


def test_demo_time_runs_a_revision_under_its_own_overrides_and_refuses_anything_else_after_it():
    demo_time = script("demo_time")
    assert demo_time.parse_rev("819672c") == ("819672c", [])
    assert demo_time.parse_rev("HEAD --set models.backends.minilm=auto --set train.epochs=2") == (
        "HEAD", ["--set", "models.backends.minilm=auto", "--set", "train.epochs=2"])
    for spec in ["", "--set a=b", "HEAD --set", "HEAD --set a", "HEAD --profile demo", "HEAD extra"]:
        with pytest.raises(SystemExit, match="--rev"):
            demo_time.parse_rev(spec)


def test_pipeline_resources_and_paper_smoke_render_each_stage_kind_and_the_disk(generate, head):
    groups = {"download": {"runs": 1, "wall_s": 8.0, "peak_rss_mib": 255.5},
              "train": {"runs": 1, "wall_s": 306.0, "peak_rss_mib": 2251.2}}
    run = {"pipeline_s": 1115.2, "stages": [{}, {}], "groups": groups}
    demo = {**head, "command": "python bench/pipeline_resources.py --profile demo",
            "run": {**run, "profile": "demo", "disk_bytes": {"workspace": 2**20, "data": 2 * 2**20, "embeddings": 0}}}
    text = generate._render(as_written(demo))
    assert "1,115 s in all, 2 stage runs" in text and "datasets 2.0 MiB" in text
    assert "| train | 1 | 306.0 | 2,251 |" in text
    smoke = {**head, "command": "python bench/paper_smoke.py --out F",
             "run": {**run, "problems": [], "disk_bytes": {"workspace": 2**20, "data": 3 * 2**20}}}
    text = generate._render(as_written(smoke))
    assert "tables complete" in text and "| download | 1 | 8.0 | 256 |" in text


def test_step_overhead_renders_each_goal_and_the_cpus_dispatch_floor(generate, head):
    step_overhead = script("step_overhead")
    floor = step_overhead.dispatch_floor(loops=20)
    assert 0 < floor < 10_000  # microseconds outside the operations, per operation
    assert 0 < step_overhead.dispatch_floor(loops=2, rows=4096) < 100_000
    step = {"documents": 8192, "queries": 8, "candidates": 1024, "mean_tokens": 58.1, "chunk_tokens": 262144,
            "chunks": 3, "packed": True, "estimator": "per_rank", "num_samples": 5000, "wall_s": 19.3,
            "load_average": 0.7, "in_ops_s": 18.7, "profiled_s": 18.9, "ops_per_step": 3811, "estimator_ops": 278,
            "prepare_s": 0.011, "host_us_per_doc": 16.32, "ops_per_doc": 0.465, "real_token_fraction": 1.0,
            "syncs_per_step": 3, "attention_real_fraction": 0.64, "sync_ops": {}, "host_reads": 1,
            "floor_us_per_op": 15.0, "floor_us_per_doc": round(15.0 * 3811 / 8192, 2),
            "sized_floor_rows": 158769, "sized_floor_us_per_op": 59.55, "sized_floor_us_per_doc": 27.7,
            "twin": {"documents": 80, "candidates": 10, "tokens_per_document": 10, "chunk_tokens": 270, "chunks": 3,
                     "ops_per_step": 3799, "host_s": [0.0362, 0.0466, 0.0451], "prepare_s": 0.004,
                     "wall_s": [0.07, 0.08, 0.09]},
            "dispatch_us_per_doc": 6.38, "twin_wall_us_per_doc": 10.5,
            "compared": {"packed encoder": {"host_s": [0.03, 0.031, 0.032], "dispatch_us_per_doc": 4.2},
                         "transformers modules": {"host_s": [0.034, 0.035, 0.036], "dispatch_us_per_doc": 4.7}}}
    text = generate._render(as_written({**head, "command": "python bench/step_overhead.py", "step": step}))
    assert "| `host_us_per_doc` | 16.32 | <= 5 | not met |" in text and "| `syncs_per_step` | 3 | <= 8 | met |" in text
    assert "| `dispatch_us_per_doc` | 6.38 | <= 5 | not met |" in text
    assert "costs this CPU 15.0 µs outside the operation" in text and "6.98 µs per document" in text
    assert "158,769 real tokens per chunk the same loop spends 59.55 µs" in text
    assert "over 80 documents of 10 tokens; 3,799 operations" in text and "0.004 s of it laying out" in text
    assert "is [0.07, 0.08, 0.09] s: 10.5 µs per document, a bound" in text
    assert ("pgrank's packed encoder [0.03, 0.031, 0.032] s outside its operations, 4.2 µs per document; "
            "transformers' modules [0.034, 0.035, 0.036] s outside its operations, 4.7 µs per document." in text)
    assert "after another such operation" not in text and "Profiled" not in text  # a record from before them
    text = generate._render(as_written({**head, "command": "python bench/step_overhead.py",
                                        "step": {**step, "probe_us": {"after_tiny": 1.14, "after_long": 75.05,
                                                                      "long_op_ms": 4.12},
                                                 "host_s": [0.066, 0.134, 0.2]}}))
    assert "Profiled 3 times, the step spent [0.066, 0.134, 0.2] s outside its operations" in text
    assert "takes 1.14 µs from the end of the one before it to its own end after another such operation, and 75.05 µs" \
        " after a 4.12 ms matrix product" in text
    for key in ("floor_us_per_op", "floor_us_per_doc", "sized_floor_rows", "sized_floor_us_per_op",
                "sized_floor_us_per_doc", "twin", "dispatch_us_per_doc", "twin_wall_us_per_doc", "compared"):
        del step[key]  # a record from before these figures
    text = generate._render(as_written({**head, "command": "python bench/step_overhead.py", "step": step}))
    assert "costs this CPU" not in text and "twin" not in text and "dispatch_us_per_doc" not in text


def test_step_overhead_probe_times_a_tiny_operation_after_a_tiny_one_and_after_a_product_of_the_asked_length():
    step_overhead = script("step_overhead")
    probe = step_overhead.probe_after(0.002, loops=4)
    assert probe["long_op_ms"] >= 2.0  # the smallest product of at least the asked length
    assert 0 < probe["after_tiny"] < 10_000 and 0 < probe["after_long"] < 10_000  # microseconds, one probe each


def test_step_overhead_twin_cuts_as_many_chunks_as_the_step_and_holds_the_longest_text():
    from pgrank.models.packing import plan_chunks

    step_overhead = script("step_overhead")
    for chunks, queries, length in [(1, 8, 10), (3, 8, 10), (9, 8, 10), (63, 220, 10), (3, 1, 3)]:
        per, budget = step_overhead.twin_shape(chunks, queries, length, 256)
        assert budget >= 256  # train.chunk_tokens must hold max_doc_length
        assert len(plan_chunks(np.full(per * queries, length), budget)) == chunks


def test_exported_policy_renders_both_figures_and_their_difference_per_set_and_stage(generate, head):
    record = {**head, "command": "python studies/exported_policy.py --profile demo",
              "result": {"policy": "pgrank-minilm", "backend": "auto", "sets": {
                  "scifact/test": {"rerank": {"queries": 300, "plain": 0.7321, "pgrank": 0.7318, "difference": 0.0003}}}}}
    text = generate._render(as_written(record))
    assert "| scifact/test | rerank | 300 | 0.7318 | 0.7321 | +0.0003 |" in text
    assert "`models.backend: auto`" in text
    assert "gain over its warm start" not in text  # a record of the policy alone


def test_exported_policy_renders_the_policys_gain_over_its_warm_start_both_ways(generate, head):
    stage = {"queries": 323, "plain": 0.3111, "pgrank": 0.3137, "difference": -0.0026, "warm_start_plain": 0.3135,
             "warm_start_pgrank": 0.3162, "gain_plain": -0.0024, "gain_pgrank": -0.0025}
    record = {**head, "command": "python studies/exported_policy.py --profile demo",
              "result": {"policy": "pgrank-minilm", "warm_start": "minilm", "backend": "auto", "tower": "query",
                         "backends": {"minilm": "onnx"}, "sets": {"nfcorpus/test": {"full": stage}}}}
    text = generate._render(as_written(record))
    assert "(`models.backend: auto`, `models.backends.minilm: onnx`, corpus embeddings" in text
    assert "gain over its warm start `minilm`" in text
    assert "| nfcorpus/test | full | 0.3162 | 0.3135 | -0.0025 | -0.0024 |" in text


def test_no_bench_option_defaults_to_a_folder_beside_the_clone():
    """A benchmark's folders come from its flags or the environment (``PGRANK_BEIR_MIRROR``), never from where this
    clone happens to sit: no ``add_argument(..., default=...)`` names a ``shared`` folder."""
    import ast

    offenders = []
    for path in sorted([*BENCH.glob("*.py"), *STUDIES.glob("*.py")]):
        tree = ast.parse(path.read_text(), str(path))
        for node in ast.walk(tree):
            if isinstance(node, ast.Call) and getattr(node.func, "attr", "") == "add_argument":
                for kw in node.keywords:
                    if kw.arg == "default" and "shared" in ast.unparse(kw.value):
                        offenders.append(f"{path.name}:{node.lineno}")
    assert not offenders


def test_the_mirror_and_set_options_read_as_the_scripts_document_them(generate, monkeypatch, capsys):
    """``--mirror`` defaults to ``$PGRANK_BEIR_MIRROR`` and is required without it where a script needs one;
    ``--set`` collects ``pgrank`` overrides in order, which ``set_args`` hands back as ``pgrank``'s arguments."""
    import argparse

    record = script("record")

    def parser(**mirror) -> argparse.ArgumentParser:
        p = argparse.ArgumentParser()
        record.add_mirror_option(p, **mirror)
        record.add_set_option(p)
        return p

    monkeypatch.delenv("PGRANK_BEIR_MIRROR", raising=False)
    with pytest.raises(SystemExit):
        parser().parse_args([])
    assert "--mirror" in capsys.readouterr().err
    assert parser(required=False).parse_args([]).mirror is None  # the profile's data.mirror, then BEIR's server
    monkeypatch.setenv("PGRANK_BEIR_MIRROR", "/srv/beir")
    args = parser().parse_args(["--set", "train.epochs=2", "--set", "data.train=nfcorpus/train"])
    assert args.mirror == "/srv/beir"
    assert record.set_args(args.overrides) == ["--set", "train.epochs=2", "--set", "data.train=nfcorpus/train"]
