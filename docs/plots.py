"""The findings page's figures, drawn from the study records under ``studies/out/`` at docs build time.

``docs/hooks.py`` calls :func:`generate.write_all` before every ``mkdocs build``, which calls :func:`write_all` here:
each figure is read from its record and written as a PNG under ``docs/img/findings/`` (ignored by git, so that no
stale image outlives its record). The figures follow ``pgrank tables``'s conventions
(``pgrank/reporting/figures.py``): matplotlib's object API on the Agg canvas, its default style, and
``figures.write_png``, which saves the same bytes for the same inputs.

* ``demo-validation.png``: the demo's validation nDCG@10 per epoch and seed, in domain and on each out-of-domain
  validation set (``studies/out/variants-demo-ood.json``);
* ``kl-tradeoff.png``: the test change against the warm start in domain (scifact) and out of domain (NFCorpus) of
  the demo's selection rules with the KL term and without it (``studies/out/variants-demo-one-se.json``);
* ``objectives.png``: PG-Rank's variants against InfoNCE on scifact's validation split
  (``studies/out/variants-compare.json``).
"""

from __future__ import annotations

import json
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "studies" / "out"
IMAGES = ROOT / "docs" / "img" / "findings"

# {PNG name: the record it is drawn from}; the findings page names the same records.
FIGURES = {
    "demo-validation.png": "variants-demo-ood.json",
    "kl-tradeoff.png": "variants-demo-one-se.json",
    "objectives.png": "variants-compare.json",
}


def read_record(name: str, folder: Path = OUT) -> dict:
    """A record of ``folder`` as a dict; a missing or malformed record is an error that names its file."""
    path = Path(folder) / name
    try:
        record = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise FileNotFoundError(f"{path}: no such benchmark record (run the command of docs/findings.md)") from None
    except json.JSONDecodeError as exc:
        raise ValueError(f"{path}: not a JSON benchmark record ({exc})") from None
    if not isinstance(record, dict) or not isinstance(record.get("runs"), list):
        raise ValueError(f"{path}: a variants record needs a list of `runs`")
    return record


def _in_domain(key: str) -> bool:
    return key == "val_ndcg@10"


def validation_chart(record: dict):
    """One panel per validation set (in domain first), one line per seed: nDCG@10 at each epoch as trained."""
    import matplotlib
    from matplotlib.figure import Figure

    runs = record["runs"]
    sets = ["val_ndcg@10"] + [f"val_{name}_ndcg@10" for name in record.get("ood", [])]
    with matplotlib.style.context("default"):
        fig = Figure(figsize=(4 * len(sets), 3.4), layout="constrained")
        axes = fig.subplots(1, len(sets), squeeze=False).ravel()
        for ax, key in zip(axes, sets):
            for run in runs:
                rows = [row for row in run["history"] if row.get("alpha", 1.0) == 1.0 and key in row]
                ax.plot([row["epoch"] for row in rows], [row[key] for row in rows], marker="o",
                        label=f"seed {run['seed']}")
            ax.set_title("scifact validation (in domain)" if _in_domain(key)
                         else key.removeprefix("val_").removesuffix("_ndcg@10") + " (out of domain)")
            ax.set_xlabel("epoch (0: the warm start)")
            ax.grid(alpha=0.3)
        axes[0].set_ylabel("nDCG@10")
        axes[0].legend(fontsize="small")
        fig.suptitle(f"{record['profile']} profile: validation nDCG@10 per epoch")
    return fig


def _changes(record: dict, test_set: str) -> dict[str, tuple[float, float]]:
    """``{variant: (mean change against the warm start, sd over seeds)}`` on one test cell."""
    warm = record["warm"][test_set]["ndcg@10"]
    out = {}
    for name, summary in record["summary"]["variants"].items():
        cell = summary.get("test", {}).get(test_set)
        if cell:
            out[name] = (cell["mean"] - warm, cell.get("sd") or 0.0)
    return out


def tradeoff_chart(record: dict, in_domain: str = "scifact/rerank", out_of_domain: str = "nfcorpus/rerank"):
    """Each variant as a point: its in-domain test change against its out-of-domain test change (± sd over seeds);
    variants trained without the KL term (``train.pg.kl_coef=0``) are drawn as squares."""
    import matplotlib
    from matplotlib.figure import Figure

    x, y = _changes(record, in_domain), _changes(record, out_of_domain)
    overrides = {run["variant"]: run.get("overrides", []) for run in record["runs"]}
    with matplotlib.style.context("default"):
        fig = Figure(figsize=(7, 4.6), layout="constrained")
        ax = fig.subplots()
        for name in sorted(set(x) & set(y)):
            no_kl = "train.pg.kl_coef=0" in overrides.get(name, [])
            ax.errorbar(x[name][0], y[name][0], xerr=x[name][1], yerr=y[name][1], fmt="s" if no_kl else "o",
                        color="tab:red" if no_kl else "tab:blue", capsize=3)
            ax.annotate(name, (x[name][0], y[name][0]), textcoords="offset points", xytext=(6, 4), fontsize="small")
        ax.axhline(0, color="grey", linewidth=0.8)
        ax.set_xlabel(f"{in_domain} nDCG@10 change against the warm start")
        ax.set_ylabel(f"{out_of_domain} nDCG@10 change")
        ax.grid(alpha=0.3)
        ax.legend(handles=[ax.plot([], [], "o", color="tab:blue", label="KL term 0.1")[0],
                           ax.plot([], [], "s", color="tab:red", label="no KL term")[0]], fontsize="small")
        fig.suptitle("Test changes (reported, never used to choose): mean ± sd over seeds")
    return fig


def objectives_chart(record: dict):
    """One bar per variant: its in-domain validation gain over the warm start (InfoNCE in its own colour)."""
    import matplotlib
    from matplotlib.figure import Figure

    gains = sorted(((summary["val_in"], name) for name, summary in record["summary"]["variants"].items()))
    with matplotlib.style.context("default"):
        fig = Figure(figsize=(7, 0.45 * len(gains) + 1.4), layout="constrained")
        ax = fig.subplots()
        ax.barh([name for _, name in gains], [gain for gain, _ in gains],
                color=["tab:blue" if name.startswith("pg") else "tab:orange" for _, name in gains])
        for i, (gain, _) in enumerate(gains):
            ax.text(gain, i, f" +{gain:.4f}", va="center", fontsize="small")
        ax.set_xlabel("scifact validation nDCG@10 gain over the warm start")
        ax.set_xlim(0, max(gain for gain, _ in gains) * 1.2)
        ax.grid(axis="x", alpha=0.3)
        fig.suptitle(f"{record['profile']} profile: PG-Rank's variants (blue) against InfoNCE, one seed")
    return fig


DRAW = {"demo-validation.png": validation_chart, "kl-tradeoff.png": tradeoff_chart, "objectives.png": objectives_chart}


def write_all(folder: Path = OUT, images: Path = IMAGES) -> list[Path]:
    """Draw every figure of :data:`FIGURES` from its record; write the PNGs whose bytes changed, return those."""
    import tempfile

    from pgrank.reporting.figures import write_png

    images.mkdir(parents=True, exist_ok=True)
    written = []
    for name, record in FIGURES.items():
        path = images / name
        with tempfile.TemporaryDirectory() as tmp:
            fresh = Path(tmp) / name
            write_png(DRAW[name](read_record(record, folder)), fresh)
            data = fresh.read_bytes()
        if not path.is_file() or path.read_bytes() != data:
            path.write_bytes(data)
            written.append(path)
    return written


if __name__ == "__main__":
    for written_path in write_all():
        print(f"wrote {written_path.relative_to(ROOT)}")
