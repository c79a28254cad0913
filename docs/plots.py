"""The findings' figures, drawn from their records by ``python docs/generate.py`` and committed.

:func:`write_all` draws each figure of :data:`FIGURES` from its record and writes it as a PNG under
``docs/img/findings/`` (committed, so that the repository's pages show it; ``tests/test_docs.py`` checks that the
committed images equal what the records draw, and ``tests/test_findings.py`` that the numbers drawn are the records').
The figures follow ``pgrank tables``'s conventions (``pgrank/reporting/figures.py``): matplotlib's object API on the
Agg canvas, its default style, and ``figures.write_png``, which saves the same bytes for the same inputs.
"""

from __future__ import annotations

import json
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "studies" / "out"
BENCH = ROOT / "bench" / "out"
IMAGES = ROOT / "docs" / "img" / "findings"
PUBLISHED = ROOT / "pgrank" / "reporting" / "published.yaml"

# {PNG name: (the page that shows it, the record it is drawn from)}; each page names the same record.
FIGURES = {
    "headline.png": ("README.md", "variants-demo-test.json"),
    "demo-validation.png": ("docs/findings/demo.md", "variants-demo-test.json"),
    "export.png": ("docs/findings/export.md", "exported_policy-demo.json"),
    "kl-tradeoff.png": ("docs/findings/tools.md", "variants-demo-tools-float32.json"),
    "nfcorpus-train.png": ("docs/findings/nfcorpus-train.md", "variants-demo-tools-nfcorpus-train.json"),
    "selection.png": ("docs/findings/selection.md", "variants-demo-one-se.json"),
    "robust.png": ("docs/findings/robust.md", "variants-demo.json"),
    "anchor.png": ("docs/findings/anchor.md", "variants-demo-tools-float32-halves.json"),
    "halves.png": ("docs/findings/halves.md", "variants-demo-halves.json"),
    "objectives.png": ("docs/findings/objectives.md", "variants-compare.json"),
    "demo-time.png": ("docs/findings/demo-time.md", "demo_time-amx-auto.json"),
    "forgetting-guard.png": ("docs/findings/forgetting-guard.md", "variants-demo-forgetting-guard.json"),
}
HALVES = {"halves:scifact": "scifact half documents", "halves:nfcorpus": "NFCorpus half documents"}


def read_record(name: str, folder: Path = OUT) -> dict:
    """A record of ``folder`` as a dict; a missing or malformed record is an error that names its file."""
    path = Path(folder) / name
    try:
        record = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise FileNotFoundError(f"{path}: no such benchmark record (run the command its findings page names)") from None
    except json.JSONDecodeError as exc:
        raise ValueError(f"{path}: not a JSON benchmark record ({exc})") from None
    if not isinstance(record, dict) or not isinstance(record.get("runs"), list) and "result" not in record:
        raise ValueError(f"{path}: a variants record needs a list of `runs`")
    return record


def bm25_published() -> dict[str, float]:
    """BM25's first-stage nDCG@10 on scifact and NFCorpus test as the paper's appendix table prints it (BEIR's
    figures, full corpora), from ``pgrank/reporting/published.yaml``."""
    import yaml

    table = yaml.safe_load(PUBLISHED.read_text(encoding="utf-8"))["full-out-of-domain"]
    return {"scifact": table["scifact/test"]["bm25"], "nfcorpus": table["nfcorpus/test"]["bm25"]}


def _in_domain(key: str) -> bool:
    return key == "val_ndcg@10"


def validation_chart(record: dict):
    """One panel per validation set (in domain first), one line per seed: nDCG@10 at each epoch as trained."""
    import matplotlib.style
    from matplotlib.figure import Figure

    runs = record["runs"]
    keys = {key for run in runs for row in run["history"] for key in row}
    sets = [key for key in ["val_ndcg@10"] + [f"val_{name}_ndcg@10" for name in record.get("ood", [])] if key in keys]
    with matplotlib.style.context("default"):
        fig = Figure(figsize=(4 * len(sets), 3.4), layout="constrained")
        axes = fig.subplots(1, len(sets), squeeze=False).ravel()
        for ax, key in zip(axes, sets):
            for run in runs:
                rows = [row for row in run["history"] if row.get("alpha", 1.0) == 1.0 and key in row]
                ax.plot([row["epoch"] for row in rows], [row[key] for row in rows], marker="o",
                        label=f"seed {run['seed']}")
            name = key.removeprefix("val_").removesuffix("_ndcg@10")
            ax.set_title("scifact validation (in domain)" if _in_domain(key) else
                         f"{name} (half documents)" if "-halves/" in name else f"{name} (out of domain)")
            ax.set_xlabel("epoch (0: the warm start)")
            ax.grid(alpha=0.3)
        axes[0].set_ylabel("nDCG@10")
        axes[0].legend(fontsize="small")
        fig.suptitle(f"{record['profile']} profile: validation nDCG@10 per epoch")
    return fig


def _order(record: dict) -> list[str]:
    """The record's variants in the order its command names them (its first is what its p-values compare against)."""
    return list(dict.fromkeys(run["variant"] for run in record["runs"]))


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
    import matplotlib.style
    from matplotlib.figure import Figure

    x, y = _changes(record, in_domain), _changes(record, out_of_domain)
    overrides = {run["variant"]: run.get("overrides", []) for run in record["runs"]}
    with matplotlib.style.context("default"):
        fig = Figure(figsize=(7, 4.6), layout="constrained")
        ax = fig.subplots()
        for name in [n for n in _order(record) if n in x and n in y]:
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
    import matplotlib.style
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


SETS = {"scifact": "scifact test\n(in domain)", "nfcorpus": "NFCorpus test\n(out of domain)",
        "dbpedia": "DBPedia-Entity report half\n(out of domain, 20 queries)"}


def headline_chart(record: dict):
    """The demo's test nDCG@10 in the first stage on each set: the warm start, the policy (mean ± sd over seeds) and
    BM25 as the paper's appendix table prints it (BEIR's full corpora; none for the DBPedia-Entity subset)."""
    import matplotlib.style
    from matplotlib.figure import Figure

    demo, bm25 = record["summary"]["variants"]["demo"]["test"], bm25_published()
    with matplotlib.style.context("default"):
        fig = Figure(figsize=(8, 3.6), layout="constrained")
        ax = fig.subplots()
        for i, name in enumerate(SETS):
            cell = f"{name}/full"
            bars = [("all-MiniLM-L6-v2 (warm start)", record["warm"][cell]["ndcg@10"], 0.0, "tab:grey", -0.27),
                    ("pgrank's policy, mean ± sd over seeds", demo[cell]["mean"], demo[cell]["sd"], "tab:blue", 0.0)]
            if name in bm25:
                bars.append(("BM25 (BEIR's published figure)", bm25[name], 0.0, "tab:orange", 0.27))
            for label, height, sd, colour, offset in bars:
                ax.bar(i + offset, height, width=0.25, yerr=sd or None, capsize=4, color=colour,
                       label=label if i == 0 else None)
                ax.text(i + offset, height + 0.01, f"{height:.3f}", ha="center", fontsize="small")
        ax.set_xticks(range(len(SETS)), list(SETS.values()))
        ax.set_ylabel("test nDCG@10, first stage")
        ax.set_ylim(0, 0.85)
        ax.grid(axis="y", alpha=0.3)
        ax.legend(fontsize="small", loc="upper right")
        seeds = record["summary"]["variants"]["demo"]["seeds"]
        fig.suptitle(f"pgrank demo on 2 CPU cores: the policy against its warm start and BM25 ({seeds} seeds)")
    return fig


def _change_axis(ax, label: str) -> None:
    """A panel of horizontal bars of changes against the warm start: the zero line, the first bar on top, a grid."""
    ax.axvline(0, color="black", linewidth=0.8)
    ax.invert_yaxis()
    ax.set_title(label)
    ax.set_xlabel("nDCG@10 change against the warm start")
    ax.grid(axis="x", alpha=0.3)


def changes_chart(record: dict, cells: dict[str, str] | None = None):
    """One group of bars per variant: its test nDCG@10 change against the warm start on each of ``cells``
    (``{record cell: label}``), ± sd over seeds."""
    import matplotlib.style
    from matplotlib.figure import Figure

    cells = cells or {"scifact/rerank": "scifact test (in domain)", "nfcorpus/rerank": "NFCorpus test"}
    names = _order(record)
    with matplotlib.style.context("default"):
        fig = Figure(figsize=(9, 0.45 * len(names) + 1.6), layout="constrained")
        axes = fig.subplots(1, len(cells), squeeze=False).ravel()
        for ax, (cell, label) in zip(axes, cells.items()):
            change = _changes(record, cell)
            ax.barh(names, [change[n][0] for n in names], xerr=[change[n][1] for n in names], capsize=3,
                    color=["tab:blue" if n == names[0] else "tab:grey" for n in names])
            _change_axis(ax, label)
        fig.suptitle("Test changes (reported, never used to choose): mean ± sd over seeds")
    return fig


def halves_chart(record: dict):
    """One group of bars per variant: its half-document validation change against the warm start per corpus."""
    import matplotlib.style
    from matplotlib.figure import Figure

    names = _order(record)
    entries = record["summary"]["variants"]
    with matplotlib.style.context("default"):
        fig = Figure(figsize=(8, 0.6 * len(names) + 1.8), layout="constrained")
        axes = fig.subplots(1, len(HALVES), squeeze=False).ravel()
        for ax, (key, label) in zip(axes, HALVES.items()):
            ax.barh(names, [entries[n]["val_ood"][key] for n in names],
                    color=["tab:blue" if n == names[0] else "tab:grey" for n in names])
            ax.axvline(-0.005, color="tab:red", linewidth=0.8, linestyle="--")
            _change_axis(ax, label)
        fig.suptitle("Half-document retrieval, mean over seeds (dashed: the chooser's margin)")
    return fig


def guard_chart(record: dict, labelled: dict | None = None):
    """Test changes per guard, ± sd over seeds: the labelled guard (its own record) beside each variant of the
    guard record, in domain and on each out-of-domain set's first stage."""
    import matplotlib.style
    from matplotlib.figure import Figure

    labelled = labelled or read_record("variants-demo-ood.json")
    cells = {"scifact/rerank": "scifact test (in domain)", "nfcorpus/full": "NFCorpus test, first stage",
             "dbpedia/full": "DBPedia report half, first stage"}
    bars = {"labelled guard": (labelled, "demo")}
    bars.update({name: (record, name) for name in _order(record)})
    with matplotlib.style.context("default"):
        fig = Figure(figsize=(12, 0.5 * len(bars) + 1.8), layout="constrained")
        axes = fig.subplots(1, len(cells), squeeze=False).ravel()
        for ax, (cell, label) in zip(axes, cells.items()):
            values = [_changes(rec, cell)[name] for rec, name in bars.values()]
            ax.barh(list(bars), [v[0] for v in values], xerr=[v[1] for v in values], capsize=3,
                    color=["tab:grey", *["tab:blue"] * (len(bars) - 1)])
            if cell != "scifact/rerank":
                ax.axvline(-0.003, color="tab:red", linewidth=0.8, linestyle="--")
            _change_axis(ax, label)
        fig.suptitle("Test changes by guard (reported, never used to choose): mean ± sd over seeds; dashed: −0.003")
    return fig


def export_chart(record: dict, int8: dict | None = None):
    """The policy's gain over the warm start on each test set in the first stage, as ``pgrank evaluate`` measured it
    and with both models loaded in plain sentence-transformers: the demo's float32 documents (``record``) and, beside
    it, int8 documents (``exported_policy-demo-int8.json``)."""
    import matplotlib.style
    from matplotlib.figure import Figure

    int8 = int8 or read_record("exported_policy-demo-int8.json")
    panels = [("float32 documents (the demo)", record), ("ONNX int8 documents", int8)]
    with matplotlib.style.context("default"):
        fig = Figure(figsize=(9, 3.4), layout="constrained")
        axes = fig.subplots(1, 2, sharey=True)
        for ax, (title, rec) in zip(axes, panels):
            sets = rec["result"]["sets"]
            names = list(sets)
            for offset, key, label, colour in ((-0.2, "gain_pgrank", "as pgrank evaluated it", "tab:blue"),
                                               (0.2, "gain_plain", "SentenceTransformer(DIR), float32", "tab:orange")):
                ax.bar([i + offset for i in range(len(names))], [sets[n]["full"][key] for n in names], width=0.4,
                       color=colour, label=label)
            ax.axhline(0, color="black", linewidth=0.8)
            ax.set_xticks(range(len(names)), names)
            ax.set_title(title)
            ax.grid(axis="y", alpha=0.3)
        axes[0].set_ylabel("nDCG@10 gain over the warm start, first stage")
        axes[0].legend(fontsize="small")
        fig.suptitle("The exported policy, seed 42: pgrank's figures and plain sentence-transformers'")
    return fig


def demo_time_chart(_record: dict, folder: Path = BENCH):
    """Every timing record's configurations: ``pgrank demo``'s seconds from nothing, one bar each, by record."""
    import matplotlib.style
    from matplotlib.figure import Figure
    from matplotlib.patches import Patch

    sys_path_blocks()
    import blocks

    rows = []
    for path in sorted(Path(folder).glob("demo_time*.json")):
        rec = json.loads(path.read_text(encoding="utf-8"))
        machine = blocks._machine_key(rec["machine"])
        for rev, configuration in zip(rec["revisions"], blocks.CONFIGURATIONS[path.name]):
            rows.append((f"{path.stem.removeprefix('demo_time-')}: {machine.split(' with ')[1]}", configuration,
                         rev["mean_seconds"]))
    colours = {blocks.INT8: "tab:grey", blocks.AUTO: "tab:orange", blocks.DEMO: "tab:blue", blocks.GUARDED: "tab:green"}
    with matplotlib.style.context("default"):
        fig = Figure(figsize=(8, 0.32 * len(rows) + 1.6), layout="constrained")
        ax = fig.subplots()
        ax.barh(range(len(rows)), [s for *_, s in rows], color=[colours[c] for _, c, _ in rows])
        for i, (*_, seconds) in enumerate(rows):
            ax.text(seconds, i, f" {seconds:.0f} s", va="center", fontsize="small")
        ax.set_yticks(range(len(rows)), [record for record, _, _ in rows], fontsize="small")
        ax.invert_yaxis()
        ax.set_xlabel("pgrank demo from nothing, seconds")
        ax.set_xlim(0, max(s for *_, s in rows) * 1.15)
        fig.legend(handles=[Patch(color=c, label=label.replace("`", "")) for label, c in colours.items()],
                   fontsize="small", loc="outside lower center")
        ax.grid(axis="x", alpha=0.3)
        fig.suptitle("The demo's time on 2 CPU cores, by record and machine")
    return fig


def sys_path_blocks() -> None:
    import sys

    if str(ROOT / "docs") not in sys.path:
        sys.path.insert(0, str(ROOT / "docs"))


DRAW = {
    "headline.png": headline_chart,
    "demo-validation.png": validation_chart,
    "export.png": export_chart,
    "kl-tradeoff.png": tradeoff_chart,
    "nfcorpus-train.png": lambda r: changes_chart(r, {"nfcorpus/train/full": "NFCorpus train (2,590 queries)",
                                                      "nfcorpus/full": "NFCorpus test (323 queries)"}),
    "selection.png": changes_chart,
    "robust.png": changes_chart,
    "anchor.png": halves_chart,
    "halves.png": validation_chart,
    "objectives.png": objectives_chart,
    "demo-time.png": demo_time_chart,
    "forgetting-guard.png": guard_chart,
}


def draw(name: str, folder: Path = OUT):
    """The figure ``name`` of :data:`FIGURES`, drawn from its record."""
    record = FIGURES[name][1]
    return DRAW[name](read_record(record, BENCH if record.startswith("demo_time") else folder))


def write_all(folder: Path = OUT, images: Path = IMAGES) -> list[Path]:
    """Draw every figure of :data:`FIGURES` from its record; write the PNGs whose bytes changed, return those."""
    import tempfile

    from pgrank.reporting.figures import write_png

    images.mkdir(parents=True, exist_ok=True)
    written = []
    for name in FIGURES:
        path = images / name
        with tempfile.TemporaryDirectory() as tmp:
            fresh = Path(tmp) / name
            write_png(draw(name, folder), fresh)
            data = fresh.read_bytes()
        if not path.is_file() or path.read_bytes() != data:
            path.write_bytes(data)
            written.append(path)
    return written


if __name__ == "__main__":
    for written_path in write_all():
        print(f"wrote {written_path.relative_to(ROOT)}")
