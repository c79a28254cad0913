"""What a table is (:class:`Table` of :class:`Cell`), what things are called, and its Markdown and LaTeX.

Pure functions, no I/O.

A score cell reads ``reproduced (published, reproduced − published)``, the reproduced number carrying
the marks (see :mod:`pgrank.reporting.tables` for the rules that set them):

* best / second of the row: ``**0.735**`` / ``<u>0.735</u>``; LaTeX ``\\textbf{}`` / ``\\underline{}``;
* a PG-Rank policy above its warm start: ``0.735 ▲``; LaTeX ``\\cellcolor{lightgreen}`` (the paper's);
* significantly different from the warm start: ``0.735†``; LaTeX ``0.735$^\\dagger$``;
* an in-domain row: ``MS MARCO dev‡``; LaTeX ``MS MARCO dev$^\\ddagger$``;
* not computed, or not published: ``—``; LaTeX ``---``.

The LaTeX fragments need ``booktabs``, ``graphicx`` and ``xcolor`` with the ``table`` option, and the
paper's colour ``\\definecolor{lightgreen}{HTML}{d9ead3}``; :func:`latex_document` is a standalone
document with exactly that preamble that ``\\input``s them.

Example:
    >>> print(markdown(table))  # doctest: +SKIP
"""

from __future__ import annotations

from dataclasses import dataclass

from pgrank.paths import parse_policy_name

DASH = "—"
GAIN = "▲"
SIGNIFICANT = "†"
IN_DOMAIN = "‡"
LIGHTGREEN = "d9ead3"  # the paper's \definecolor{lightgreen}{HTML}{d9ead3}

DATASET_NAMES = {
    "msmarco": "MS MARCO", "trec-covid": "TREC-COVID", "nfcorpus": "NFCorpus", "nq": "NQ", "hotpotqa": "HotpotQA",
    "fiqa": "FiQA-2018", "arguana": "ArguAna", "webis-touche2020": "Touché-2020", "quora": "Quora",
    "dbpedia-entity": "DBPedia", "scidocs": "SCIDOCS", "fever": "FEVER", "climate-fever": "Climate-FEVER",
    "scifact": "SciFact",
}
EVAL_SET_NAMES = {"msmarco/test": "TREC-DL 2019"}
SYSTEM_NAMES = {"bm25": "BM25", "sbert": "SBERT", "tas-b": "TAS-B", "splade-v2": "SPLADEv2"}
# Training objectives (train.objectives) by display name; pg is the paper's.
OBJECTIVE_NAMES = {"pg": "PG-Rank", "infonce": "InfoNCE", "listnet": "ListNet", "listmle": "ListMLE",
                   "listmle_topk": "Top-k ListMLE", "lambdaloss": "LambdaLoss"}


# --------------------------------------------------------------------------------------- model


@dataclass(frozen=True)
class Cell:
    """One table cell: printed strings plus marks. ``compared=False``: a plain value, no "(paper)"."""

    ours: str | None = None
    paper: str | None = None
    delta: str | None = None  # "+0.005", "−0.007", "±0.000"
    best: int = 0  # 1: best of the row (bold), 2: second (underline)
    gain: bool = False
    significant: bool = False
    compared: bool = True


@dataclass(frozen=True)
class Column:
    key: str
    title: str  # full header (Markdown)
    label: str = ""  # header under the group (LaTeX); the title when empty
    group: str | None = None
    align: str = "r"


@dataclass(frozen=True)
class Row:
    label: str
    cells: tuple[Cell, ...]
    in_domain: bool = False


@dataclass(frozen=True)
class Table:
    name: str  # file stem
    title: str
    columns: tuple[Column, ...]
    rows: tuple[Row, ...]
    row_header: str = "Dataset"
    legend: bool = True  # a score table: print the legend of the marks
    significance: str = ""  # the test behind "†", for the legend
    empty: str = "No evaluation set of this kind in data.eval_sets."
    note: str = ""  # a plain sentence after the legend
    source: str = ""  # the paper's table label


# --------------------------------------------------------------------------------------- names


def warm_start(system: str) -> str | None:
    """``sbert`` for ``pgrank-sbert``, ``pgrank-sbert@2`` and ``pgrank-sbert+listnet``; None for a system that
    is not a trained policy."""
    policy = parse_policy_name(system)
    return policy.warm if policy else None


def system_name(system: str) -> str:
    """Display name: ``tas-b`` -> "TAS-B", ``pgrank-sbert@2`` -> "PG-Rank with SBERT (epoch 2)",
    ``pgrank-sbert+listnet`` -> "ListNet with SBERT"."""
    policy = parse_policy_name(system)
    if policy is None:
        return SYSTEM_NAMES.get(system, system)
    epoch = f" (epoch {policy.epoch})" if policy.epoch is not None else ""
    return f"{OBJECTIVE_NAMES.get(policy.objective, policy.objective)} with {system_name(policy.warm)}{epoch}"


def eval_set_name(eval_set: str) -> str:
    """Display name as in the paper: ``msmarco/test`` -> "TREC-DL 2019", ``msmarco/dev`` -> "MS MARCO dev"."""
    if eval_set in EVAL_SET_NAMES:
        return EVAL_SET_NAMES[eval_set]
    dataset, split = eval_set.split("/")
    return DATASET_NAMES.get(dataset, dataset) + ("" if split == "test" else f" {split}")


_TEX = {
    "\\": r"\textbackslash{}", "&": r"\&", "%": r"\%", "$": r"\$", "#": r"\#", "_": r"\_", "{": r"\{", "}": r"\}",
    "~": r"\textasciitilde{}", "^": r"\textasciicircum{}", "—": "---", "−": "$-$", "±": r"$\pm$",
    "→": r"$\rightarrow$", "<": "$<$", ">": "$>$", "α": r"$\alpha$", "τ": r"$\tau$", "·": r"$\cdot$",
}


def tex_escape(text: str) -> str:
    """``text`` with LaTeX's special characters (and the few Unicode signs pgrank prints) escaped."""
    return "".join(_TEX.get(ch, ch) for ch in text)


def _legend(table: Table) -> list[tuple[str, str]]:
    """(Markdown, LaTeX) pairs of the legend's sentences for a score table."""
    parts = [
        ("Cells: reproduced (paper, reproduced − paper)", "Cells: reproduced (paper, reproduced $-$ paper)"),
        ("**bold**: best of the row, <u>underline</u>: second",
         r"\textbf{bold}: best of the row, \underline{underline}: second"),
        (f"{GAIN}: a PG-Rank policy above its warm start", "green: a PG-Rank policy above its warm start"),
    ]
    if table.significance:
        parts.append((f"{SIGNIFICANT}: significantly different from its warm start ({table.significance})",
                      rf"$^\dagger$: significantly different from its warm start ({tex_escape(table.significance)})"))
    if any(row.in_domain for row in table.rows):
        parts.append((f"{IN_DOMAIN}: in-domain", r"$^\ddagger$: in-domain"))
    parts.append((f"{DASH}: not computed, or not published", "---: not computed, or not published"))
    return parts


# --------------------------------------------------------------------------------------- Markdown


def _md_escape(text: str) -> str:
    return text.replace("|", r"\|")


def _md_cell(cell: Cell) -> str:
    if not cell.compared:
        return _md_escape(cell.ours) if cell.ours is not None else DASH
    if cell.ours is None and cell.paper is None:
        return DASH
    ours = DASH if cell.ours is None else _md_escape(cell.ours)
    if cell.best == 1:
        ours = f"**{ours}**"
    elif cell.best == 2:
        ours = f"<u>{ours}</u>"
    if cell.significant:
        ours += SIGNIFICANT
    if cell.gain:
        ours += f" {GAIN}"
    reference = DASH if cell.paper is None else _md_escape(cell.paper)
    if cell.delta is not None:
        reference += f", {cell.delta}"
    return f"{ours} ({reference})"


def markdown(table: Table) -> str:
    """The table as a Markdown section: heading, pipe table (or a note when empty), legend line."""
    lines = [f"## {table.title}", ""]
    if not table.rows:
        lines += [f"_{table.empty}_", ""]
    else:
        lines.append("| " + " | ".join([table.row_header, *(c.title for c in table.columns)]) + " |")
        lines.append("| " + " | ".join([":---", *(("---:" if c.align == "r" else ":---") for c in table.columns)]) + " |")
        for row in table.rows:
            label = _md_escape(row.label) + (IN_DOMAIN if row.in_domain else "")
            lines.append("| " + " | ".join([label, *(_md_cell(c) for c in row.cells)]) + " |")
        lines.append("")
    notes = [md for md, _ in _legend(table)] if table.legend and table.rows else []
    notes += [table.note] if table.note else []
    notes += [f"Paper: {table.source}"] if table.source else []
    if notes:
        lines += ["; ".join(notes) + ".", ""]
    return "\n".join(lines)


# --------------------------------------------------------------------------------------- LaTeX


def _tex_cell(cell: Cell) -> str:
    if not cell.compared:
        return tex_escape(cell.ours) if cell.ours is not None else "---"
    if cell.ours is None and cell.paper is None:
        return "---"
    ours = "---" if cell.ours is None else tex_escape(cell.ours)
    if cell.best == 1:
        ours = rf"\textbf{{{ours}}}"
    elif cell.best == 2:
        ours = rf"\underline{{{ours}}}"
    if cell.significant:
        ours += r"$^\dagger$"
    if cell.gain:
        ours = r"\cellcolor{lightgreen}" + ours
    reference = "---" if cell.paper is None else tex_escape(cell.paper)
    if cell.delta is not None:
        reference += f", {tex_escape(cell.delta)}"
    return rf"{ours} {{\scriptsize ({reference})}}"


def _tex_header(table: Table) -> list[str]:
    first = rf"\textbf{{{tex_escape(table.row_header)}}}"
    if not any(c.group for c in table.columns):
        return [" & ".join([first, *(rf"\textbf{{{tex_escape(c.title)}}}" for c in table.columns)]) + r" \\"]
    spans: list[tuple[str | None, int]] = []  # consecutive columns of one group
    for column in table.columns:
        if spans and spans[-1][0] == column.group:
            spans[-1] = (column.group, spans[-1][1] + 1)
        else:
            spans.append((column.group, 1))
    cells, rules, start = [first], [], 2
    for group, width in spans:
        if group:
            cells.append(rf"\multicolumn{{{width}}}{{c}}{{\textbf{{{tex_escape(group)}}}}}")
            rules.append(rf"\cmidrule(lr){{{start}-{start + width - 1}}}")
        else:
            cells += [""] * width
        start += width
    labels = " & ".join(["", *(tex_escape(c.label or c.title) for c in table.columns)]) + r" \\"
    return [" & ".join(cells) + r" \\", " ".join(rules), labels]


def latex(table: Table) -> str:
    """The table as a LaTeX ``table`` float (booktabs), caption carrying the legend."""
    caption = tex_escape(table.title) + "."
    if table.legend and table.rows:
        caption += " " + "; ".join(tex for _, tex in _legend(table)) + "."
    if table.note:
        caption += f" {tex_escape(table.note)}."
    if table.source:
        caption += f" Paper: {tex_escape(table.source)}."
    spec = "l" + "".join(c.align for c in table.columns)
    body = [
        " & ".join([tex_escape(row.label) + (r"$^\ddagger$" if row.in_domain else ""), *map(_tex_cell, row.cells)])
        + r" \\" for row in table.rows
    ] or [rf"\multicolumn{{{len(table.columns) + 1}}}{{c}}{{\emph{{{tex_escape(table.empty)}}}}} \\"]
    lines = [
        f"% pgrank tables: {table.name}. Generated by `pgrank tables`; do not edit.",
        r"% Needs \usepackage{booktabs}, \usepackage{graphicx}, \usepackage[table]{xcolor} and",
        rf"% \definecolor{{lightgreen}}{{HTML}}{{{LIGHTGREEN}}} (see tables.tex).",
        r"\begin{table}[tb!]",
        r"\centering\small",
        rf"\caption{{{caption}}}",
        rf"\label{{tab:pgrank-{table.name}}}",
        r"\sbox0{%",  # shrunk to the line width only when wider (score cells are wide)
        rf"\begin{{tabular}}{{{spec}}}",
        r"\toprule",
        *_tex_header(table),
        r"\midrule",
        *body,
        r"\bottomrule",
        r"\end{tabular}}%",
        r"\ifdim\wd0>\linewidth\resizebox{\linewidth}{!}{\usebox0}\else\usebox0\fi",
        r"\end{table}",
        "",
    ]
    return "\n".join(lines)


def latex_document(names: list[str]) -> str:
    """A standalone document that ``\\input``s the fragments ``names`` (compile it in their folder)."""
    inputs = [rf"\input{{{name}}}" for name in names]
    return "\n".join([
        "% pgrank tables: every table in one document. Generated by `pgrank tables`; compile with pdflatex here.",
        r"\documentclass{article}",
        r"\usepackage[T1]{fontenc}",
        r"\usepackage[utf8]{inputenc}",
        r"\usepackage{booktabs}",
        r"\usepackage{graphicx}",
        r"\usepackage[table]{xcolor}",
        rf"\definecolor{{lightgreen}}{{HTML}}{{{LIGHTGREEN}}}",
        r"\begin{document}",
        *inputs,
        r"\end{document}",
        "",
    ])
