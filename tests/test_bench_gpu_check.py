"""The GPU check's rehearsal on the CPU (``bench/gpu_check.py --device cpu``): the same call a lent GPU runs, with tiny
models, every section through the same code; each section's record written as it ends, whatever comes after it."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from tests.script_modules import load_script

ROOT = Path(__file__).resolve().parents[1]

def _script(path: Path, name: str):
    """A script with dataclasses, imported by path (registered first: a dataclass looks its module up)."""
    import importlib.util

    spec = importlib.util.spec_from_file_location(name, path)
    module = sys.modules[name] = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


check = _script(ROOT / "bench" / "gpu_check.py", "bench_gpu_check_for_tests")
rates_table = load_script(ROOT / "bench" / "rates_table.py", "bench_rates_table_for_gpu_check_tests")
ENV = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false",
       "PYTHONUNBUFFERED": "1"}


def _start(records: Path, *args: str) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "bench/gpu_check.py", "--device", "cpu", "--records", str(records), *args],
                            cwd=ROOT, env=ENV, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            start_new_session=True)  # its own process group: pytest's child dies with it


def _records(folder: Path) -> dict[str, dict]:
    return {json.loads(p.read_text())["section"]: json.loads(p.read_text()) for p in sorted(folder.glob("*.json"))}


@pytest.fixture(scope="module")
def rehearsal(tmp_path_factory):
    """One whole rehearsal: ``(records by section, seconds, output)``."""
    records = tmp_path_factory.mktemp("gpu-check")
    started = time.perf_counter()
    proc = _start(records)
    output, _ = proc.communicate(timeout=600)
    assert proc.returncode == 0, output[-3000:]
    return records, time.perf_counter() - started, output


def test_the_rehearsal_writes_every_section_in_order_each_complete(rehearsal):
    folder, seconds, output = rehearsal
    names = [p.name for p in sorted(folder.glob("*.json"))]
    assert names == [f"gpu_check-cpu-{n}-{name}.json" for n, name in enumerate(check.SECTIONS, 1)]
    records = _records(folder)
    for name, record in records.items():
        assert record["status"] == "ok", (name, record.get("error"), record.get("traceback"))
        assert record["command"].startswith("python3 bench/gpu_check.py --device cpu")
        assert record["machine"]["cpu"] and record["date"] and record["seconds"] >= 0
        assert check.render(record).startswith(f"Section `{name}` on cpu")
    print(f"rehearsal: {seconds:.0f} s")  # -s shows it; the budget is a minute on two idle cores


def test_the_environment_names_the_varlen_call_and_the_torch_floor(rehearsal):
    env = _records(rehearsal[0])["environment"]
    assert env["torch_floor_met"] and env["torch_floor"] == "2.11"
    assert env["varlen_attn"]["scale"] and "cu_seq_q" in env["varlen_attn"]["signature"]


def test_the_step_is_timed_at_two_budgets_split_at_the_trainer_s_boundaries(rehearsal):
    step = _records(rehearsal[0])["step"]
    assert [b["chunk_tokens"] for b in step["budgets"]] == [512, 256]
    for budget in step["budgets"]:
        assert budget["packed"] and budget["documents"] == 2 * 8 and len(budget["steps"]) == 3
        split = budget["split_s"]
        assert set(split) == {"preparation", "waited", "no_grad_forward", "estimator", "reforward_backward", "optimizer"}
        assert split["no_grad_forward"] > 0 and split["reforward_backward"] > 0 and split["estimator"] > 0
        for one in budget["steps"]:  # the split is the step, to the host's clock
            parts = sum(one[f"{p}_s"] for p in ("no_grad_forward", "estimator", "reforward_backward", "optimizer"))
            assert parts <= one["seconds"] * 1.05 + 0.01
        assert budget["top_kernels"] and budget["top_kernels"][0]["ms"] >= budget["top_kernels"][-1]["ms"]
        assert budget["real_token_fraction"] == 1.0  # packed: the linear layers see no padding
    assert {r["task"] for r in step["training"]} == {"document", "query"}


def test_the_encoders_run_the_token_path_and_say_whether_they_packed(rehearsal):
    enc = _records(rehearsal[0])["encoders"]
    assert enc["packed"] == {"distilbert (sbert, tas-b)": True, "gtr-t5-xl": False}
    got = {(r["model"], r["tokens"]) for r in enc["encoding"]}
    assert got == {(m, n) for m in ("distilbert (sbert, tas-b)", "gtr-t5-xl", "splade") for n in (64, 128, 256)}
    assert all(r["docs_per_s"] > 0 for r in enc["encoding"])
    assert {r["path"] for r in enc["encoding"] if r["model"] != "splade"} == {"token store, packed",
                                                                               "token store, padded"}


def test_the_gpu_tests_run_and_their_log_comes_back(rehearsal):
    folder = rehearsal[0]
    tests = _records(folder)["tests"]
    assert tests["exit_code"] == 0 and not tests["timed_out"]
    assert tests["counts"].get("skipped", 0) > 0 and "tests/training/test_cuda.py" in tests["files"]
    assert "skipped" in (folder / tests["log"]).read_text()


def test_the_records_reseed_the_rates_table_on_the_packed_path(rehearsal, tmp_path, monkeypatch):
    from pgrank.pipeline import rates

    records = list(_records(rehearsal[0]).values())
    with pytest.raises(ValueError, match="not measured on a GPU"):  # a CPU's rates never price a GPU
        rates_table.write_rates(rates_table.merged(records), tmp_path / "t.yaml", "x")
    for record in records:  # the same figures, as a GPU's (where auto encodes the dense models in bf16)
        record["machine"] = {**record["machine"], "gpu": "NVIDIA H200"}
        for row in record.get("encoding", []):
            row["backend"] = "torch" if row["model"] == "splade" else "torch-bf16"
    table = tmp_path / "measured_rates.yaml"
    table.write_text(rates.TABLE.read_text(encoding="utf-8"))
    paths = []
    for record in records:
        paths.append(tmp_path / f"{record['section']}.json")
        paths[-1].write_text(json.dumps(record))
    rates_table.main([*map(str, paths), "--table", str(table)])
    entry = yaml.safe_load(table.read_text())["devices"]["NVIDIA H200"]
    assert entry["data_path"] == "packed" and entry["source"].startswith("python3 bench/gpu_check.py")
    assert set(entry) >= {"t5-xl", "distilbert", "splade-distilbert"}
    assert set(entry["distilbert"]) == {"inference", "grad", "step"}
    step = _records(rehearsal[0])["step"]["budgets"][0]
    assert entry["distilbert"]["step"]["seconds_per_document"] == pytest.approx(step["seconds"] / step["documents"],
                                                                                rel=1e-3)
    monkeypatch.setattr(rates, "TABLE", table)
    rates._table.cache_clear()
    try:
        got = rates.table_rates("sentence-transformers/msmarco-distilbert-dot-v5", "NVIDIA H200")
        assert got.data_path == "packed" and got.step and got.inference and got.grad
    finally:
        rates._table.cache_clear()


def test_a_failing_section_is_recorded_and_the_next_one_runs(tmp_path):
    proc = _start(tmp_path, "--only", "environment", "step", "faiss", "--chunk-tokens", "8")  # no text fits 8 tokens
    output, _ = proc.communicate(timeout=300)
    assert proc.returncode == 0, output[-3000:]
    records = _records(tmp_path)
    assert records["environment"]["status"] == "ok" and records["faiss"]["status"] == "ok"
    assert records["step"]["status"] == "failed" and records["step"]["error"].startswith("ConfigError")
    assert "train.chunk_tokens: 8 tokens cannot hold a text" in check.render(records["step"])
    assert records["step"]["traceback"]


def test_a_call_killed_mid_section_leaves_every_record_written_before(tmp_path):
    proc = _start(tmp_path, "--only", "environment", "step", "tests")
    step = tmp_path / "gpu_check-cpu-2-step.json"
    deadline = time.monotonic() + 300
    try:
        while not step.exists():  # the step's first budget is recorded as soon as it is timed
            assert proc.poll() is None and time.monotonic() < deadline, "the step never wrote its first budget"
            time.sleep(0.02)
    finally:
        os.killpg(proc.pid, signal.SIGKILL)  # mid-section: the second budget, the training rates or the tests
        proc.communicate(timeout=60)
    assert proc.returncode == -signal.SIGKILL
    records = _records(tmp_path)  # every file is whole JSON: written atomically
    assert records["environment"]["status"] == "ok"
    assert records["step"]["status"] in ("running", "ok") and records["step"]["budgets"][0]["chunk_tokens"] == 512
    assert not (tmp_path / "gpu_check-cpu-4-tests.json").exists()
