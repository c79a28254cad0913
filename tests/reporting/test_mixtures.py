"""WiSE-FT mixtures as validation rows of the epoch-ablation table (pgrank/reporting/mixtures.py)."""

from __future__ import annotations

from pathlib import Path

from pgrank.config import load_params
from pgrank.reporting.mixtures import mixture_rows

ROOT = Path(__file__).resolve().parents[2]


def _history() -> list[dict]:
    rows = [{"epoch": 0, "val_ndcg@10": 0.5, "val_nfcorpus/dev_ndcg@10": 0.3}]
    for epoch in (1, 2):
        rows.append({"epoch": epoch, "val_ndcg@10": 0.5 + 0.1 * epoch, "val_nfcorpus/dev_ndcg@10": 0.3 - 0.01 * epoch})
        rows.append({"epoch": epoch, "alpha": 0.5, "val_ndcg@10": 0.5 + 0.05 * epoch,
                     "val_nfcorpus/dev_ndcg@10": 0.3 - 0.001 * epoch})
    return rows


def test_each_alpha_and_validation_set_is_a_row_over_the_ablation_epochs():
    params = load_params(ROOT / "params.yaml", profile="demo",
                         overrides=["train.selection.interpolation=[0.5, 1]", "train.validation_sets=[nfcorpus/dev]"])
    rows = mixture_rows(params, {"minilm": _history()}, [("minilm", 0), ("minilm", 1), ("minilm", 2)])
    assert [r.label for r in rows] == ["Validation: SciFact validation, α = 1", "Validation: NFCorpus dev, α = 1",
                                       "Validation: SciFact validation, α = 0.5", "Validation: NFCorpus dev, α = 0.5"]
    assert [c.ours for c in rows[2].cells] == ["0.500", "0.550", "0.600"]  # epoch 0 is the warm start for every alpha
    assert [c.ours for c in rows[3].cells] == ["0.300", "0.299", "0.298"]
    assert [c.ours for c in rows[1].cells] == ["0.300", "0.290", "0.280"]
    # an epoch not validated yet shows a dash; without mixtures there are no rows
    assert [c.ours for c in mixture_rows(params, {"minilm": _history()[:3]}, [("minilm", 2)])[0].cells] == ["—"]
    plain = load_params(ROOT / "params.yaml", profile="demo",
                        overrides=["train.selection.interpolation=[1]", "train.selection.within_se=0"])
    assert mixture_rows(plain, {"minilm": _history()}, [("minilm", 1)]) == []


def test_the_epoch_ablation_table_carries_the_mixture_rows_in_markdown():
    from pgrank.reporting.rendering import markdown
    from pgrank.reporting.tables import ablation_table

    params = load_params(ROOT / "params.yaml", profile="demo", overrides=["train.selection.interpolation=[0.5, 1]"])
    text = markdown(ablation_table(params, {}, {}, {"minilm": _history()}))
    assert "| Validation: NFCorpus dev, α = 0.5 | 0.300 |" in text, text
