"""PNG figures of ``pgrank tables``: reproduced-vs-paper bars and training curves.

Figures are built with matplotlib's object API on the Agg canvas (no pyplot, no global backend), under
matplotlib's default style whatever the user's ``matplotlibrc`` says, and saved at a fixed dpi with
no ``Software`` metadata, so the same inputs give the same bytes (DVC caches them).

Example:
    >>> write_png(bar_chart("nDCG@10", ["SciFact"], ["BM25"], [[0.66]], [[0.665]]), Path("bars.png"))  # doctest: +SKIP
"""

from __future__ import annotations

import math
from pathlib import Path

import matplotlib
import matplotlib.style
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure
from matplotlib.lines import Line2D
from matplotlib.patches import Patch

DPI = 100
CURVE_PANELS = (("loss", "loss"), ("utility", "utility (sampled rankings)"), ("grad_norm", "gradient norm"),
                ("entropy", "entropy"))


def bar_chart(title: str, groups: list[str], series: list[str], ours: list[list[float | None]],
              paper: list[list[float | None]]) -> Figure:
    """One panel per eval set with one bar per system (reproduced) and the paper's number as a black
    tick over the bar's place. A missing bar is a result not computed.

    Args:
        groups: eval-set names (one panel each); series: system names (one colour each).
        ours, paper: ``[series][group]`` values, None where absent.
    """
    with matplotlib.style.context("default"):
        ncols = max(1, min(5, len(groups)))
        nrows = max(1, math.ceil(len(groups) / ncols))
        fig = Figure(figsize=(2.6 * ncols + 0.6, 2.2 * nrows + 1.0), layout="constrained")
        axes = fig.subplots(nrows, ncols, sharey=True, squeeze=False).ravel()
        colors = matplotlib.colormaps["tab10"].colors
        xs = list(range(len(series)))
        for i, ax in enumerate(axes):
            if i >= len(groups):
                ax.axis("off")
                continue
            for j, name in enumerate(series):
                if ours[j][i] is not None:
                    ax.bar(j, ours[j][i], width=0.8, color=colors[j % len(colors)], label=name)
                if paper[j][i] is not None:
                    ax.plot([j - 0.4, j + 0.4], [paper[j][i]] * 2, color="black", linewidth=2)
            ax.set_title(groups[i], fontsize="medium")
            ax.set_xticks(xs, [""] * len(xs))
            ax.set_xlim(-0.6, len(series) - 0.4)
            ax.set_ylim(0, 1.05)
            ax.grid(axis="y", alpha=0.3)
        for row in range(nrows):
            axes[row * ncols].set_ylabel("nDCG@10")
        handles = [Patch(color=colors[j % len(colors)], label=name) for j, name in enumerate(series)]
        handles.append(Line2D([], [], color="black", linewidth=2, label="paper"))
        fig.legend(handles=handles, loc="outside lower center", ncols=min(len(handles), 7), fontsize="small")
        fig.suptitle(f"{title}: reproduced (bars) vs. paper (black lines); no bar: not computed")
    return fig


def _smooth(values: list[float]) -> list[float]:
    """Trailing moving average over ~2% of the points (at least 1)."""
    window = max(1, len(values) // 50)
    out, total = [], 0.0
    for i, v in enumerate(values):
        total += v
        if i >= window:
            total -= values[i - window]
        out.append(total / min(i + 1, window))
    return out


def curve_chart(title: str, curve: dict[str, list[float]], history: list[dict]) -> Figure:
    """Per-step loss, utility, gradient norm and entropy (raw and smoothed; dotted lines at epoch
    ends), and the per-epoch validation metrics of ``history.json``."""
    with matplotlib.style.context("default"):
        fig = Figure(figsize=(12, 6.5), layout="constrained")
        axes = fig.subplots(2, 3).ravel()
        steps = curve.get("step", [])
        epochs = curve.get("epoch", [])
        ends = [steps[i] for i in range(len(steps) - 1) if epochs[i + 1] != epochs[i]] if epochs else []
        for ax, (key, label) in zip(axes, CURVE_PANELS):
            values = curve.get(key, [])
            points = [(s, v) for s, v in zip(steps, values) if math.isfinite(v)]
            if points:
                xs, ys = [p[0] for p in points], [p[1] for p in points]
                ax.plot(xs, ys, color="tab:blue", alpha=0.3, linewidth=0.8)
                ax.plot(xs, _smooth(ys), color="tab:blue", linewidth=1.5)
                for end in ends:
                    ax.axvline(end, color="grey", linestyle=":", linewidth=0.8)
            else:
                ax.text(0.5, 0.5, "no curve.csv", ha="center", va="center", transform=ax.transAxes, color="grey")
            ax.set_title(label)
            ax.set_xlabel("step")
            ax.grid(alpha=0.3)
        ax = axes[len(CURVE_PANELS)]
        history = [row for row in history if row.get("alpha", 1.0) == 1.0]  # the epochs as trained, not their mixtures
        keys = sorted({k for row in history for k in row if k.startswith("val_")})
        for key in keys:
            rows = [(row["epoch"], row[key]) for row in history if isinstance(row.get(key), (int, float))]
            ax.plot([r[0] for r in rows], [r[1] for r in rows], marker="o", label=key.removeprefix("val_"))
        if keys:
            ax.legend(fontsize="small")
        else:
            ax.text(0.5, 0.5, "no history.json", ha="center", va="center", transform=ax.transAxes, color="grey")
        ax.set_title("validation (per epoch)")
        ax.set_xlabel("epoch")
        ax.grid(alpha=0.3)
        axes[-1].axis("off")
        fig.suptitle(title)
    return fig


def write_png(fig: Figure, path: Path) -> None:
    """Save ``fig`` as PNG at :data:`DPI` with no metadata that varies (``path`` may be a temporary)."""
    FigureCanvasAgg(fig)
    with matplotlib.style.context("default"):
        fig.savefig(path, format="png", dpi=DPI, metadata={"Software": None})
