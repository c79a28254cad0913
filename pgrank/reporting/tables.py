"""``pgrank tables``: every result table of the paper, regenerated next to the published numbers.

Inputs (:mod:`pgrank.reporting.result_files`): the metrics files of ``pgrank evaluate`` (a missing one is a result not
computed), the training curves, the BEIR folders (dataset statistics, :mod:`pgrank.reporting.setup_tables`),
``params`` (hyperparameters) and the paper's numbers (``pgrank/reporting/published.yaml``).

Rows are ``data.eval_sets``; columns are ``evaluate.systems`` (comparison systems, warm starts
included) then the policies ``pgrank-<warm start>`` of ``train.warm_starts``, so every profile gets its
own tables. The warm start of ``pgrank-X`` is ``X``; ``pgrank-X@E`` is that policy after epoch E. The
epoch ablation has, per warm start, epoch 0 (the warm start), each ``evaluate.policy_epochs`` epoch and
the last epoch. In-domain is the ``dev`` split of ``data.train``'s dataset (MS MARCO dev in the paper);
when ``data.eval_sets`` has no such split, every eval set of that dataset (the demo's scifact/test).

Rules (a score cell reads ``reproduced (paper, reproduced − paper)``; marks in :mod:`pgrank.reporting.rendering`):

* comparisons use the numbers as printed (rounded to ``tables.decimals``), so marks agree with the text;
* bold / underline: best / second-best reproduced number of the row; ties share the mark; a row with
  fewer than two reproduced numbers has no mark;
* gain: a PG-Rank column above its warm start's reproduced number in the same row (epoch 0 in the
  ablation), whether or not the warm start is a column;
* significant: the metrics file's ``significance.significant[metric]`` (vs. the warm start);
* "—": not computed, or not published; never 0.

Outputs, written together into ``Paths.tables`` (the folder is swapped in whole, so no stale file
survives), as ``tables.formats`` asks: ``{table}.md`` and ``{table}.tex`` for each of
:data:`TABLE_NAMES`, ``tables.md`` (all Markdown tables and the figures), ``tables.tex`` (a standalone
document that inputs the fragments), ``bars-{stage}.png`` (nDCG@10 reproduced vs. paper per eval set)
and ``curve-{warm start}[-objective].png`` (training curves); with more than one ``train.objectives``,
also ``objectives.md``/``.tex`` (:mod:`pgrank.reporting.comparison`). No timestamps or absolute paths: DVC caches them.

Example:
    >>> make_tables(params, paths)  # doctest: +SKIP
    [PosixPath('.../runs/paper/tables/dataset-statistics.md'), ...]
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from pgrank import tracking
from pgrank.atomic import atomic_path
from pgrank.config import Params
from pgrank.core.significance import TEST_NAMES
from pgrank.paths import Paths, policy_name, slug
from pgrank.reporting.comparison import comparison_table
from pgrank.reporting.mixtures import mixture_rows
from pgrank.reporting.rendering import (
    Cell,
    Column,
    Row,
    Table,
    eval_set_name,
    latex,
    latex_document,
    markdown,
    system_name,
    warm_start,
)
from pgrank.reporting.result_files import (
    Results,
    collect_results,
    load_published,
    read_curve,
    read_history,
)
from pgrank.reporting.setup_tables import (
    DatasetStats,
    collect_statistics,
    hyperparameter_table,
    statistics_table,
)

PAPER_DECIMALS = 3
AVERAGE_OTHER = "avg-other"  # published.yaml's key of the ablation row "Avg. on other BEIR datasets"
OURS = "Ours: Neural PG-Rank"
COMPARISON = "Comparison systems"


@dataclass(frozen=True)
class ScoreSpec:
    """A table of one metric at one stage; ``rows``: "in", "out" (of domain) or "all" eval sets."""

    name: str
    title: str
    stage: str
    metric: str
    rows: str
    source: str  # the paper's table


SCORE_TABLES = (
    ScoreSpec("rerank-in-domain", "Second-stage reranking: nDCG@10, in-domain", "rerank", "ndcg@10", "in",
              "Table 2 (tab:eval_rerank_in-domain)"),
    ScoreSpec("rerank-out-of-domain", "Second-stage reranking: nDCG@10, out-of-domain", "rerank", "ndcg@10", "out",
              "Table 3 (tab:eval_rerank_out-of-domain)"),
    ScoreSpec("full-in-domain", "First-stage retrieval: nDCG@10, in-domain", "full", "ndcg@10", "in",
              "Table 4 (tab:eval_full_in-domain)"),
    ScoreSpec("rerank-ndcg5", "Second-stage reranking: nDCG@5", "rerank", "ndcg@5", "all",
              "Table 7 (tab:eval_rerank_ndcg5)"),
    ScoreSpec("rerank-ndcg3", "Second-stage reranking: nDCG@3", "rerank", "ndcg@3", "all",
              "Table 8 (tab:eval_rerank_ndcg3)"),
    ScoreSpec("rerank-ndcg1", "Second-stage reranking: nDCG@1", "rerank", "ndcg@1", "all",
              "Table 9 (tab:eval_rerank_ndcg1)"),
    ScoreSpec("full-out-of-domain", "First-stage retrieval: nDCG@10, out-of-domain", "full", "ndcg@10", "out",
              "Table 11 (tab:eval_full)"),
)
# The paper's order: main text, then appendix.
TABLE_NAMES = ("rerank-in-domain", "rerank-out-of-domain", "full-in-domain", "dataset-statistics", "hyperparameters",
               "rerank-ndcg5", "rerank-ndcg3", "rerank-ndcg1", "epoch-ablation", "full-out-of-domain")
MAIN_TABLES = TABLE_NAMES[:3]


# --------------------------------------------------------------------------------------- systems


def domains(params: Params) -> tuple[list[str], list[str]]:
    """``data.eval_sets`` split into (in-domain, out-of-domain); see the module docstring."""
    dataset = params.data.train.split("/")[0]
    sets = params.data.eval_sets
    inside = [s for s in sets if s == f"{dataset}/dev"] or [s for s in sets if s.split("/")[0] == dataset]
    return inside, [s for s in sets if s not in inside]


def table_systems(params: Params) -> list[str]:
    """The columns of the score tables: the comparison systems, then one policy per warm start and objective."""
    policies = [policy_name(w, o) for w in params.train.warm_starts for o in params.train.objectives]
    return list(dict.fromkeys([*params.evaluate.systems.all(), *policies]))


def ablation_epochs(params: Params) -> list[int]:
    """0 (the warm start), the ``evaluate.policy_epochs`` and the last epoch."""
    return sorted({0, *params.evaluate.policy_epochs, params.train.epochs})


def epoch_system(warm: str, epoch: int, params: Params) -> str:
    """The system id of ``warm``'s PG-Rank policy after ``epoch`` epochs (0: the warm start itself)."""
    if epoch == 0:
        return warm
    return policy_name(warm) if epoch == params.train.epochs else policy_name(warm, epoch=epoch)


def needed_systems(params: Params) -> list[str]:
    """Every system a table reads: the columns, their warm starts and the ablation's epochs."""
    systems = table_systems(params)
    systems += [w for s in systems if (w := warm_start(s))]
    systems += [epoch_system(w, e, params) for w in params.train.warm_starts for e in ablation_epochs(params)]
    return list(dict.fromkeys(systems))


def published_scores(published: dict, stage: str, metric: str) -> dict[str, dict[str, float]]:
    """Eval set -> system -> value, merged over the paper's tables of ``metric`` at ``stage``."""
    merged: dict[str, dict[str, float]] = {}
    for spec in SCORE_TABLES:
        if (spec.stage, spec.metric) == (stage, metric):
            for eval_set, values in published.get(spec.name, {}).items():
                merged.setdefault(eval_set, {}).update(values)
    return merged


# --------------------------------------------------------------------------------------- cells


def printed(value: float | None, decimals: int) -> float | None:
    """``value`` as the table prints it."""
    return None if value is None else float(f"{value:.{decimals}f}")


def rank_marks(values: list[float | None]) -> list[int]:
    """1 for the best value(s), 2 for the second best, 0 otherwise; no marks with < 2 values."""
    present = [v for v in values if v is not None]
    if len(present) < 2:
        return [0] * len(values)
    top = sorted(set(present), reverse=True)[:2]
    return [top.index(v) + 1 if v is not None and v in top else 0 for v in values]


def score_cell(ours: float | None, paper: float | None, *, warm: float | None = None, significant: bool = False,
               best: int = 0, decimals: int = 3) -> Cell:
    """A score cell from printed numbers (``ours`` and ``warm`` already through :func:`printed`)."""
    delta = None
    if ours is not None and paper is not None:
        diff = round(ours - paper, decimals)
        delta = f"±{0:.{decimals}f}" if diff == 0 else f"{diff:+.{decimals}f}".replace("-", "−")
    return Cell(
        ours=None if ours is None else f"{ours:.{decimals}f}",
        paper=None if paper is None else f"{paper:.{PAPER_DECIMALS}f}",
        delta=delta, best=best, gain=ours is not None and warm is not None and ours > warm,
        significant=ours is not None and significant,
    )


def score_row(label: str, systems: list[str], ours: list[float | None], paper: list[float | None], *,
              warm: dict[str, float | None], significant: list[bool], decimals: int, in_domain: bool = False,
              unmarked: frozenset[str] = frozenset()) -> Row:
    """One row; ``warm`` maps each warm start to its (raw) value in this row, for the gain mark.

    Systems in ``unmarked`` are shown but take no part in the bold/underline marks (context columns).
    """
    shown = [printed(v, decimals) for v in ours]
    marks = rank_marks([None if s in unmarked else v for s, v in zip(systems, shown)])
    cells = tuple(
        score_cell(value, reference, warm=printed(warm.get(warm_start(system) or ""), decimals),
                   significant=sig, best=mark, decimals=decimals)
        for system, value, reference, sig, mark in zip(systems, shown, paper, significant, marks)
    )
    return Row(label, cells, in_domain)


def _value(results: Results, system: str, eval_set: str, stage: str, metric: str) -> float | None:
    result = results.get((system, eval_set, stage))
    return result.metrics.get(metric) if result else None


def _significant(results: Results, system: str, eval_set: str, stage: str, metric: str) -> bool:
    result = results.get((system, eval_set, stage))
    return bool(result and result.significant.get(metric))


def _significance_note(params: Params) -> str:
    sig = params.evaluate.significance
    return f"{TEST_NAMES[sig.test]}, p < {sig.alpha:g}"


def system_column(system: str, context: bool = False) -> Column:
    if warm_start(system) is None:
        return Column(system, system_name(system) + (" (context)" if context else ""), group=COMPARISON)
    return Column(system, system_name(system), system_name(system).removeprefix("PG-Rank "), OURS)


# --------------------------------------------------------------------------------------- tables


def score_table(spec: ScoreSpec, params: Params, results: Results, published: dict) -> Table:
    """One metric at one stage: rows = eval sets (``spec.rows``), columns = :func:`table_systems`."""
    inside, outside = domains(params)
    sets = {"in": inside, "out": outside, "all": list(params.data.eval_sets)}[spec.rows]
    paper = published_scores(published, spec.stage, spec.metric)
    systems = table_systems(params)
    # The paper leaves BM25 out of its second-stage tables ("commonly used only as a first-stage
    # approach"): tables.rerank_bm25 omits it, or shows it as context outside the marks.
    context = frozenset({"bm25"} if spec.stage == "rerank" else ())
    if context and params.tables.rerank_bm25 == "omit":
        systems, context = [s for s in systems if s not in context], frozenset()
    warms = {w for s in systems if (w := warm_start(s))}
    rows = tuple(
        score_row(eval_set_name(eval_set), systems,
                  [_value(results, s, eval_set, spec.stage, spec.metric) for s in systems],
                  [paper.get(eval_set, {}).get(s) for s in systems],
                  warm={w: _value(results, w, eval_set, spec.stage, spec.metric) for w in warms},
                  significant=[_significant(results, s, eval_set, spec.stage, spec.metric) for s in systems],
                  decimals=params.tables.decimals, in_domain=spec.rows == "all" and eval_set in inside,
                  unmarked=context)
        for eval_set in sets
    )
    empty = {"in": "No in-domain evaluation set in data.eval_sets (in-domain: data.train's dataset, its dev split "
                   "when listed).", "out": "No out-of-domain evaluation set in data.eval_sets.", "all": ""}[spec.rows]
    return Table(spec.name, spec.title, tuple(system_column(s, s in context) for s in systems), rows,
                 significance=_significance_note(params), source=spec.source, empty=empty)


def ablation_table(params: Params, results: Results, published: dict,
                   histories: dict[str, list[dict]] | None = None) -> Table:
    """Second-stage nDCG@10 of each warm start's policy at epoch 0 -> kept epochs -> last; with
    ``train.selection.interpolation``, then the validation nDCG@10 of each mixture with the warm start
    (:mod:`pgrank.reporting.mixtures`; ``histories``: each warm start's PG-Rank ``history.json``)."""
    stage, metric, decimals = "rerank", "ndcg@10", params.tables.decimals
    inside, outside = domains(params)
    paper = published.get("epoch-ablation", {})
    epochs = ablation_epochs(params)
    systems = [epoch_system(w, e, params) for w in params.train.warm_starts for e in epochs]
    columns = tuple(Column(epoch_system(w, e, params), f"{system_name(w)}, epoch {e}", f"epoch {e}",
                           f"with {system_name(w)}") for w in params.train.warm_starts for e in epochs)

    def row(label: str, values: list[float | None], reference: list[float | None], significant: list[bool],
            in_domain: bool) -> Row:
        warm = {w: values[systems.index(w)] for w in params.train.warm_starts}
        return score_row(label, systems, values, reference, warm=warm, significant=significant,
                         decimals=decimals, in_domain=in_domain)

    rows = [row(eval_set_name(e), [_value(results, s, e, stage, metric) for s in systems],
                [paper.get(e, {}).get(s) for s in systems],
                [_significant(results, s, e, stage, metric) for s in systems], True) for e in inside]
    # The average runs over the out-of-domain sets where every column was computed, so that its
    # columns are comparable; the paper's average (over its 14 sets) is shown only for the same sets.
    complete = [e for e in outside if all(_value(results, s, e, stage, metric) is not None for s in systems)]
    averages = [sum(_value(results, s, e, stage, metric) for e in complete) / len(complete) if complete else None
                for s in systems]
    same_sets = set(complete) == set(published.get("rerank-out-of-domain", {}))
    rows.append(row(f"Avg. on other BEIR datasets (n = {len(complete)})", averages,
                    [paper.get(AVERAGE_OTHER, {}).get(s) if same_sets else None for s in systems],
                    [False] * len(systems), False))
    rows += mixture_rows(params, histories or {}, [(w, e) for w in params.train.warm_starts for e in epochs])
    title = "Second-stage reranking: nDCG@10 at epoch " + " → ".join(map(str, epochs))
    return Table("epoch-ablation", title, columns, tuple(rows), significance=_significance_note(params),
                 source="Table 10 (tab:eval_rerank_epoch_comparison)")


def build_tables(params: Params, results: Results, statistics: dict[str, DatasetStats | None],
                 published: dict, histories: dict[str, list[dict]] | None = None) -> list[Table]:
    """Every table, in :data:`TABLE_NAMES` order (pure: inputs already read)."""
    built = {spec.name: score_table(spec, params, results, published) for spec in SCORE_TABLES}
    built["epoch-ablation"] = ablation_table(params, results, published, histories)
    built["dataset-statistics"] = statistics_table(params, statistics, published)
    built["hyperparameters"] = hyperparameter_table(params, published)
    return [built[name] for name in TABLE_NAMES]


def table_names(params: Params) -> tuple[str, ...]:
    """:data:`TABLE_NAMES`, and ``objectives`` when ``train.objectives`` lists more than one loss."""
    return TABLE_NAMES + (("objectives",) if len(params.train.objectives) > 1 else ())


# --------------------------------------------------------------------------------------- stage


def bar_series(params: Params, results: Results, published: dict, stage: str) -> dict:
    """Arguments of :func:`pgrank.reporting.figures.bar_chart`: nDCG@10 per eval set and system, ours and paper's."""
    paper = published_scores(published, stage, "ndcg@10")
    systems, sets = table_systems(params), list(params.data.eval_sets)
    return {
        "title": f"{'Second-stage reranking' if stage == 'rerank' else 'First-stage retrieval'}: nDCG@10",
        "groups": [eval_set_name(e) for e in sets],
        "series": [system_name(s) for s in systems],
        "ours": [[_value(results, s, e, stage, "ndcg@10") for e in sets] for s in systems],
        "paper": [[paper.get(e, {}).get(s) for e in sets] for s in systems],
    }


def _index(tables: list[Table], texts: dict[str, str], figures: list[str]) -> str:
    lines = ["# Neural PG-Rank: reproduced results next to the paper's", "",
             "Generated by `pgrank tables` from the metrics files of `pgrank evaluate`. Each table is also in "
             "`<name>.md` and `<name>.tex` (LaTeX, booktabs); `tables.tex` compiles them all.", ""]
    lines += [texts[f"{t.name}.md"] for t in tables]
    if figures:
        lines += ["## Figures", "", *(f"![{name}]({name})" for name in figures), ""]
    return "\n".join(lines)


def make_tables(params: Params, paths: Paths) -> list[Path]:
    """Write every table (Markdown, LaTeX) and figure (PNG) into ``paths.tables``; return the files.

    The folder is built aside and swapped in whole (:func:`pgrank.atomic.atomic_path`): a failure
    leaves the previous tables, and no stale file survives a change of params.

    Raises:
        PgrankError: a malformed metrics, curve or history file, or a missing split (naming the file).
    """
    published = load_published()
    results = collect_results(paths, needed_systems(params), list(params.data.eval_sets))
    histories = {w: read_history(paths.training_log(w) / "history.json") for w in params.train.warm_starts}
    tables = build_tables(params, results, collect_statistics(params, paths), published, histories)
    if "objectives" in table_names(params):
        tables.append(comparison_table(params, paths))
    formats = params.tables.formats
    texts: dict[str, str] = {}
    if "tex" in formats:
        texts.update({f"{t.name}.tex": latex(t) for t in tables})
        texts["tables.tex"] = latex_document([t.name for t in tables])
    figures: dict[str, tuple] = {}
    if "png" in formats:
        from pgrank.reporting import figures as plots  # matplotlib: only when asked for

        for stage in params.evaluate.stages:
            figures[f"bars-{stage}.png"] = (plots.bar_chart, bar_series(params, results, published, stage))
        for warm in params.train.warm_starts:
            for objective in params.train.objectives:
                folder = paths.training_log(warm, objective)
                curve, history = read_curve(folder / "curve.csv"), read_history(folder / "history.json")
                suffix = "" if objective == "pg" else f"-{objective}"
                if curve or history:
                    figures[f"curve-{slug(warm)}{suffix}.png"] = (plots.curve_chart, {
                        "title": f"Training of {system_name(policy_name(warm, objective))}", "curve": curve,
                        "history": history})
    if "md" in formats:
        md = {f"{t.name}.md": markdown(t) for t in tables}
        texts.update(md)
        texts["tables.md"] = _index(tables, md, list(figures))
    with atomic_path(paths.tables, directory=True) as tmp:
        for name, text in texts.items():
            (tmp / name).write_text(text, encoding="utf-8")
        for name, (draw, kwargs) in figures.items():
            plots.write_png(draw(**kwargs), tmp / name)
    written = [paths.tables / name for name in sorted([*texts, *figures])]
    with tracking.stage_run(params, paths, "tables", tags={"stage": "tables"}, enabled=params.tracking.enabled,
                            resources=True) as run:
        for path in written:  # the tables and plots as artifacts of the pipeline's MLflow run
            tracking.log_artifact(run, str(path), "tables")
    return written
