"""``bench/gpu.py``'s arithmetic (``bench/flops.py``) and the rates table it writes (``bench/rates_table.py``)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from tests.script_modules import load_script

ROOT = Path(__file__).resolve().parents[1]
flops = load_script(ROOT / "bench" / "flops.py", "bench_flops_for_tests")
rates_table = load_script(ROOT / "bench" / "rates_table.py", "bench_rates_table_for_tests")


@pytest.mark.parametrize("name, tflops", [
    ("NVIDIA H100 80GB HBM3", 989.4), ("NVIDIA H100 PCIe", 756.0), ("NVIDIA H200", 989.4), ("NVIDIA H200 NVL", 835.5),
    ("NVIDIA A100-SXM4-80GB", 312.0), ("NVIDIA L40S", 362.0), ("NVIDIA L4", 121.0),
    ("NVIDIA L40", None), ("NVIDIA A10G", None), ("Tesla T4", None), (None, None),
])
def test_a_gpu_s_published_peak_is_found_by_whole_words_of_its_name(name, tflops):
    assert flops.spec_peak(name) == tflops


def test_a_bert_encoding_counts_two_flops_per_weight_and_token(tiny_model_dir):
    """One text through sentence-transformers' encode: every linear layer of every layer once per token, BERT's pooler
    once per text; attention's own products are not counted."""
    import torch
    from sentence_transformers import SentenceTransformer

    model = SentenceTransformer(str(tiny_model_dir), device="cpu")
    text = "policy gradient training of dense retrievers for ranking"
    tokens = len(model.tokenizer(text)["input_ids"])
    bert = model[0].auto_model
    per_token = sum(m.in_features * m.out_features for m in bert.encoder.modules() if isinstance(m, torch.nn.Linear))
    pooler = bert.pooler.dense.in_features * bert.pooler.dense.out_features if bert.pooler is not None else 0
    assert flops.counted_flops(lambda: model.encode([text])) == 2 * (tokens * per_token + pooler)


def test_backward_counts_twice_the_forward_of_a_layer_whose_input_needs_a_gradient():
    import torch

    layer = torch.nn.Linear(16, 32)
    x = torch.randn(5, 16, requires_grad=True)
    forward = flops.counted_flops(lambda: layer(x))
    assert forward == 2 * 5 * 16 * 32
    assert flops.counted_flops(lambda: layer(x).sum().backward()) == 3 * forward


def test_a_row_gets_its_real_tokens_a_second_and_its_share_of_the_peak():
    row = flops.with_arithmetic({"docs_per_s": 1000.0}, flops_per_item=2e9, items_per_s=1000.0, tokens_per_item=120.0,
                                peak=100.0)
    assert row == {"docs_per_s": 1000.0, "tokens_per_s": 120_000, "tflops": 2.0, "peak_share": 0.02}
    assert flops.with_arithmetic({}, 2e9, 1000.0, 120.0, None)["peak_share"] is None
    assert flops.percent(0.0234) == "2.3%" and flops.percent(None) == "-"


def test_the_peak_of_a_cpu_is_the_faster_of_its_measured_products(monkeypatch):
    monkeypatch.setattr(flops, "measured_peak", lambda device, dtype: {"bfloat16": 0.5, "float32": 1.25}[dtype])
    peak = flops.device_peak("cpu", None)
    assert peak["tflops"] == 1.25 and "float32" in peak["source"] and peak["spec_bf16_tflops"] is None
    gpu = flops.device_peak("cuda", "NVIDIA H100 80GB HBM3")
    assert gpu["tflops"] == 989.4 and gpu["measured_tflops"] == {"bfloat16": 0.5, "float32": 1.25}


def test_a_dense_product_is_measured_in_tflops():
    assert 0 < flops.measured_peak("cpu", "float32", seconds=0.05, n=128) < 100


def _record(gpu="NVIDIA H200"):
    encoding = [{"model": label, "backend": backend, "tokens": n, "docs_per_s": 1000.0 * k / n}
                for k, (label, (_, backend)) in enumerate(rates_table.ARCHITECTURES.items(), 1) for n in (64, 256)]
    encoding.append({"model": "gtr-t5-xl", "backend": "torch", "tokens": 64, "docs_per_s": 1.0})  # not what auto runs
    training = [{"task": "document", "tokens": 256, "texts_per_s": 900.0}, {"task": "query", "tokens": 12,
                                                                              "texts_per_s": 9000.0}]
    return {"machine": {"gpu": gpu}, "encoding": encoding, "training": training,
            "step": {"documents": 220_000, "seconds": 17.6, "mean_tokens": 84.6, "chunk_tokens": 131_072}}


def test_a_record_s_rates_go_into_the_table_that_prices_the_plan(tmp_path, monkeypatch):
    from pgrank.pipeline import rates

    table = tmp_path / "measured_rates.yaml"
    shipped = yaml.safe_load(rates.TABLE.read_text(encoding="utf-8"))
    table.write_text("# how the table is made\n# (kept)\n" + yaml.safe_dump(shipped))
    before = yaml.safe_load(table.read_text())
    entry = rates_table.write_rates(_record(), table, "python bench/gpu.py (record bench/out/gpu-h200.json)")
    text = table.read_text()
    assert text.startswith("# how the table is made\n# (kept)\n")
    after = yaml.safe_load(text)
    assert after["architectures"] == before["architectures"]
    for device, archs in before["devices"].items():  # other GPUs' rates are kept
        assert after["devices"][device] == archs
    assert entry["source"] == "python bench/gpu.py (record bench/out/gpu-h200.json)"
    assert entry["data_path"] == "packed"  # a step cut by a token budget: the packed path
    monkeypatch.setattr(rates, "TABLE", table)
    rates._table.cache_clear()
    try:
        assert rates.table_device("NVIDIA H200") == "NVIDIA H200"
        t5 = rates.table_rates("sentence-transformers/gtr-t5-xl", "NVIDIA H200")
        assert t5.inference == {64: 1000.0 / 64, 256: 1000.0 / 256}  # bf16 weights, what auto runs on a GPU
        distilbert = rates.table_rates("sentence-transformers/msmarco-distilbert-dot-v5", "NVIDIA H200")
        assert distilbert.grad == {12: 9000.0, 256: 900.0}
        assert distilbert.step == (85, pytest.approx(17.6 / 220_000))
        splade = rates.table_rates("naver/splade_v2_distil", "NVIDIA H200")
        assert splade.inference == {64: 3000.0 / 64, 256: 3000.0 / 256}
        assert {t5.data_path, distilbert.data_path, splade.data_path} == {"packed"}
    finally:
        rates._table.cache_clear()


def test_the_data_path_of_a_record_s_rates_is_named_or_read_from_its_step(tmp_path):
    from pgrank.pipeline import rates

    record = _record()
    assert rates_table.data_path(record) == "packed"
    record["step"] = {"documents": 220_000, "seconds": 352.67, "grad_chunk_size": 64}  # chunks of 64 padded documents
    assert rates_table.data_path(record) == "padded"
    assert rates_table.data_path({**record, "data_path": "packed"}) == "packed"  # the record says so itself
    assert rates_table.data_path(record, "packed") == "packed"  # or the caller does
    with pytest.raises(ValueError, match="does not say which data path"):
        rates_table.data_path({**record, "step": None})
    with pytest.raises(ValueError, match="data path 'fast': expected one of padded, packed"):
        rates_table.data_path(record, "fast")
    table = tmp_path / "measured_rates.yaml"
    with pytest.raises(ValueError, match="does not say which data path"):
        rates_table.write_rates({**_record(), "step": None}, table, "x")
    assert not table.exists()
    # the shipped table's GPU was measured on the path its record shows
    shipped = yaml.safe_load(rates.TABLE.read_text(encoding="utf-8"))["devices"]["NVIDIA H100 80GB HBM3"]
    record = json.loads((ROOT / "bench" / "out" / "gpu-h100.json").read_text())
    assert shipped["data_path"] == rates_table.data_path(record) == "padded"


def test_a_record_without_a_gpu_or_rates_leaves_the_table_alone(tmp_path):
    table = tmp_path / "measured_rates.yaml"
    table.write_text("# kept\narchitectures: {}\ndevices: {}\n")
    with pytest.raises(ValueError, match="not measured on a GPU"):
        rates_table.write_rates({"machine": {"gpu": None}, "encoding": []}, table, "x")
    with pytest.raises(ValueError, match="no encoding, training or step rates"):
        rates_table.write_rates({"machine": {"gpu": "NVIDIA H200"}}, table, "x")
    assert table.read_text() == "# kept\narchitectures: {}\ndevices: {}\n"


def test_the_tables_show_tokens_and_shares_and_old_records_still_render():
    gpu = load_script(ROOT / "bench" / "gpu.py", "bench_gpu_for_tests")
    old = {"encoding": [{"model": "m", "backend": "torch", "tokens": 64, "docs_per_s": 10.0}],
           "training": [{"task": "document", "amp": "bf16", "tokens": 256, "texts_per_s": 5.0}]}
    assert "share of the peak" not in gpu.render(old)
    new = {"encoding": [flops.with_arithmetic(dict(old["encoding"][0]), 1e9, 10.0, 60.0, 1.0)],
           "training": [flops.with_arithmetic(dict(old["training"][0]), 4e9, 5.0, 250.0, 1.0)],
           "peak": {"tflops": 1.0, "source": "measured: the fastest dense product on the device (float32)",
                    "measured_tflops": {"bfloat16": 0.5, "float32": 1.0}}}
    text = gpu.render(new)
    assert "| m | torch | 600, 1.0% |" in text
    assert "| document (bf16) | 256 | 5 | 1,250 | 2.0% |" in text
    assert "Shares are of 1.00 TFLOPs, measured: the fastest dense product on the device (float32)" in text
