"""The generated blocks of the hand-written pages: tables drawn from the records, so that no page states a record's
figure differently from the record.

A page holds a block as::

    <!-- generated: NAME -->
    ...
    <!-- end generated -->

and ``python docs/generate.py`` (:func:`fill`) rewrites what lies between the two markers with :data:`BLOCKS`'s
``NAME`` drawn from the records under ``studies/out/`` and ``bench/out/``; ``tests/test_docs.py`` checks that every
committed page equals what this writes. The pages with blocks are :data:`PAGES`: the README (its headline lines),
the findings map (``docs/results.md``) and each finding's page under ``docs/findings/``.
"""

from __future__ import annotations

import json
import re
import textwrap
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
STUDIES = ROOT / "studies" / "out"
BENCH = ROOT / "bench" / "out"
# The demo as profiles/demo.yaml runs it, 3 seeds with test figures: the headline, the demo page and the findings map.
DEMO_RECORD = "studies/out/variants-demo-test.json"
BLOCK = re.compile(r"(<!-- generated: ([\w-]+) -->\n)(.*?)(<!-- end generated -->)", re.DOTALL)

# The sets of the demo's records, as the pages name them: {record's dataset key: name}.
SETS = {"scifact": "scifact test", "nfcorpus": "NFCorpus test", "nfcorpus/train": "NFCorpus train (2,590 queries)",
        "dbpedia": "DBPedia-Entity report half (20 queries)"}
STAGES = {"rerank": "rerank", "full": "first stage"}


def record(name: str) -> dict:
    """A record by its path under the repository (``studies/out/x.json``); a missing one is an error naming it."""
    path = ROOT / name
    if not path.is_file():
        raise FileNotFoundError(f"{name}: no such record (a generated block of the docs reads it)")
    return json.loads(path.read_text(encoding="utf-8"))


def pages() -> list[Path]:
    """Every page that holds a generated block."""
    found = [ROOT / "README.md", ROOT / "docs" / "results.md", *sorted((ROOT / "docs" / "findings").glob("*.md"))]
    return [page for page in found if page.is_file() and BLOCK.search(page.read_text(encoding="utf-8"))]


def fill(text: str) -> str:
    """``text`` with every generated block rewritten from its records; an unknown block name is an error.
    ``run-<record>`` is the command and machine of the record ``<record>.json`` (``studies/out/`` or ``bench/out/``)."""
    def one(match: re.Match) -> str:
        name = match.group(2)
        if name.startswith("run-"):
            body = run(name.removeprefix("run-"))
        elif name in BLOCKS:
            body = BLOCKS[name]()
        else:
            raise KeyError(f"no generated block named {name!r} (docs/blocks.py BLOCKS)")
        return f"{match.group(1)}{body.strip()}\n{match.group(4)}"

    return BLOCK.sub(one, text)


def run(stem: str) -> str:
    """A record's command as a reader reruns it, and the machine it ran on."""
    import sys

    if str(ROOT / "docs") not in sys.path:
        sys.path.insert(0, str(ROOT / "docs"))
    import generate  # docs/generate.py: the records pages' own rendering of commands and machines

    where = "studies/out" if (STUDIES / f"{stem}.json").is_file() else "bench/out"
    rec = record(f"{where}/{stem}.json")
    return (f"Command and machine of `{where}/{stem}.json` (`W`: a scratch folder; `$PGRANK_BEIR_MIRROR`: the folder "
            f"of the BEIR zips, or unset):\n\n```bash\n{generate.rerunnable(rec['command'], f'{stem}.json', where)}"
            f"\n```\n\nMachine of `{where}/{stem}.json`: {generate._machine(rec['machine'])}.")


# --------------------------------------------------------------------------------------- numbers


def signed(x: float) -> str:
    """A change to four decimals with its sign, a true minus for a loss: ``+0.0844``, ``−0.0030``."""
    return f"{x:+.4f}".replace("-", "−")


def pvalue(p: float | None) -> str:
    """A p-value as the pages print it: two significant figures, scientific below 0.001."""
    if p is None:
        return "—"
    return f"{p:.1e}" if p < 1e-3 else f"{p:.2g}"


def _variants(rec: dict) -> dict:
    return rec["summary"]["variants"]


def _first(rec: dict) -> str:
    """The variant the record's p-values compare against: its command's first."""
    return rec["runs"][0]["variant"]


def _change(rec: dict, entry: dict, cell: str) -> float:
    return entry["test"][cell]["mean"] - rec["warm"][cell]["ndcg@10"]


def _choices(entry: dict) -> str:
    return ", ".join(f"({epoch}, {alpha:g})" for epoch, alpha in entry["choices"])


# --------------------------------------------------------------------------------------- tables of a variants record


def variants_table(name: str, sets: list[str], *, validation: list[str] | None = None, seconds: bool | None = None,
                   labels: dict[str, str] | None = None) -> str:
    """One row per variant of a ``studies/variants.py`` record: the test change against the warm start on each of
    ``sets`` (rerank / first stage, with the paired p against the record's first variant), the validation gains
    (in domain, then each of ``validation``), the (epoch, α) chosen at each seed and a training's seconds; a first row
    gives the warm start's own nDCG@10."""
    rec = record(name)
    first = _first(rec)
    validation = validation or []
    if seconds is None:  # a record of reused runs times none of them
        seconds = any(entry.get("seconds") is not None for entry in _variants(rec).values())
    has_test = any(entry.get("test") for entry in _variants(rec).values())
    sets = sets if has_test else []
    head = ["variant", *(f"{SETS[s]}, rerank / first stage" for s in sets),
            "validation: " + " / ".join(["in domain", *validation]), "(epoch, α) per seed"] + (["s a run"] if seconds else [])
    aligns = ["---", *["---:"] * (len(sets) + 1), "---"] + (["---:"] if seconds else [])
    rows = ["| " + " | ".join(head) + " |", "| " + " | ".join(aligns) + " |"]
    if sets:
        warm = [" / ".join(f"{rec['warm'][f'{s}/{st}']['ndcg@10']:.4f}" for st in STAGES) for s in sets]
        rows.append("| warm start (nDCG@10) | " + " | ".join(warm) + " | | |" + (" |" if seconds else ""))
    order = list(dict.fromkeys(run["variant"] for run in rec["runs"]))
    for variant in order:
        entry = _variants(rec)[variant]
        cells = []
        for s in sets:
            parts = []
            for stage in STAGES:
                figure = entry["test"][f"{s}/{stage}"]
                p = "" if variant == first or figure.get("p_first") is None else f" (p {pvalue(figure['p_first'])})"
                parts.append(signed(_change(rec, entry, f"{s}/{stage}")) + p)
            cells.append(" / ".join(parts))
        gains = [entry["val_in"], *(entry["val_ood"][v] for v in validation)]
        cells += [" / ".join(signed(g) for g in gains), _choices(entry)]
        if seconds:
            cells.append("—" if entry.get("seconds") is None else f"{entry['seconds']:.0f}")
        label = (labels or {}).get(variant, variant)
        rows.append(f"| {label} | " + " | ".join(cells) + " |")
    seeds = max(entry["seeds"] for entry in _variants(rec).values())
    note = (f"nDCG@10 change against the warm start, mean over {seeds} seed{'s' if seeds > 1 else ''}"
            + (f"; p: paired t-test of per-query means over seeds against `{first}`" if sets else "")
            + f" (record `{name}`):")
    return note + "\n\n" + "\n".join(rows)


def demo_test() -> str:
    """The demo's test figures: the warm start and the policy (mean ± sd over seeds), the change and its p."""
    name = DEMO_RECORD
    rec = record(name)
    entry = _variants(rec)["demo"]
    rows = ["| set | stage | warm start | the demo's policy, mean ± sd | change | p against the warm start |",
            "| --- | --- | ---: | ---: | ---: | ---: |"]
    for s in ("scifact", "nfcorpus", "dbpedia"):
        for stage, label in STAGES.items():
            test = entry["test"][f"{s}/{stage}"]
            rows.append(f"| {SETS[s]} | {label} | {rec['warm'][f'{s}/{stage}']['ndcg@10']:.4f} | "
                        f"{test['mean']:.4f} ± {test['sd']:.4f} | {signed(_change(rec, entry, f'{s}/{stage}'))} | "
                        f"{pvalue(test['p_warm'])} |")
    head = (f"Test nDCG@10 over seeds {', '.join(str(s) for s in sorted({r['seed'] for r in rec['runs']}))}; "
            f"p: paired t-test of per-query means over seeds against the warm start (record `{name}`):")
    val = ("Validation, the selection's only input: in-domain gain "
           f"{signed(entry['val_in'])}, " + ", ".join(f"{k} {signed(v)}" for k, v in entry["val_ood"].items())
           + f"; (epoch, α) chosen per seed: {_choices(entry)} (record `{name}`).")
    return head + "\n\n" + "\n".join(rows) + "\n\n" + val


def export_table() -> str:
    """The exported policy in plain sentence-transformers against ``pgrank evaluate``, in float32 and with int8
    documents: the policy's gain over the warm start as each measures it."""
    out = []
    for name, label in (("studies/out/exported_policy-demo.json", "float32 documents (the demo)"),
                        ("studies/out/exported_policy-demo-int8.json", "ONNX int8 documents")):
        sets = record(name)["result"]["sets"]
        out += [f"{label}, seed 42: the policy's nDCG@10 gain over the warm start (record `{name}`):", "",
                "| set | stage | as `pgrank evaluate` measured it | both in plain `SentenceTransformer`, float32 | "
                "largest difference of the policy's nDCG@10 |", "| --- | --- | ---: | ---: | ---: |"]
        for key in ("scifact/test", "nfcorpus/test", "dbpedia/test"):
            for stage, stage_label in STAGES.items():
                cell = sets[key][stage]
                out.append(f"| {SETS[key.split('/')[0]]} | {stage_label} | {signed(cell['gain_pgrank'])} | "
                           f"{signed(cell['gain_plain'])} | {abs(cell['difference']):.4f} |")
        out.append("")
    return "\n".join(out)


def forgetting_table() -> str:
    """Half-document retrieval: each policy's nDCG@10 change against the warm start, per corpus, with its p."""
    name = "studies/out/forgetting.json"
    corpora = record(name)["corpora"]
    policies = [row["policy"] for row in corpora[0]["rows"]]
    rows = ["| policy | " + " | ".join(f"{c['name']} half documents: change (p)" for c in corpora) + " |",
            "| --- |" + " ---: |" * len(corpora),
            "| warm start (nDCG@10) | " + " | ".join(f"{c['warm_start']:.4f}" for c in corpora) + " |"]
    for policy in policies:
        cells = []
        for corpus in corpora:
            row = next(r for r in corpus["rows"] if r["policy"] == policy)
            cells.append(f"{signed(row['change'])} (p {pvalue(row['p'])})")
        rows.append(f"| {policy} | " + " | ".join(cells) + " |")
    return (f"Seed 42, {corpora[0]['queries']} first halves against {corpora[0]['documents']} second halves per corpus "
            f"(record `{name}`):\n\n" + "\n".join(rows))


# --------------------------------------------------------------------------------------- the demo's time

# What each ``--rev`` of each timing record runs, in words, by its place in the record (a page names no revision).
INT8 = "int8 documents, NFCorpus alone out of domain"
DEMO = "float32 documents, NFCorpus and DBPedia (the labelled guard alone)"
AUTO = "`models.backends.minilm=auto` (bf16 with AMX), NFCorpus and DBPedia"
GUARDED = "the demo with its half-document guard: float32 documents, NFCorpus, DBPedia and three half-document sets"
CONFIGURATIONS = {
    "demo_time-float32.json": [INT8, DEMO],
    "demo_time-float32-2.json": [INT8, DEMO],
    "demo_time-float32-vnni.json": [INT8, DEMO],
    "demo_time-float32-amx.json": [INT8, DEMO],
    "demo_time-amx-auto.json": [INT8, AUTO, DEMO],
    "demo_time-amx-auto-2.json": [INT8, AUTO],
    "demo_time-split.json": [GUARDED],
}


def demo_time_split() -> str:
    """Each timed run's wall in three (``bench/demo_time.py``): encoding, with its share of the CPU's float32 peak;
    training; and everything else (process starts, imports, DVC, MLflow, search, evaluation's arithmetic). Then each
    evaluation stage's own wall in those runs, as its process logged it."""
    rows, stages = [], []
    for path in sorted(BENCH.glob("demo_time*.json")):
        rec = json.loads(path.read_text(encoding="utf-8"))
        for run in (r for r in rec["runs"] if "split" in r):
            s = run["split"]
            share = "—" if s["encoding_peak_share"] is None else f"{100 * s['encoding_peak_share']:.1f}%"
            rows.append(f"| `{path.name}` | {_machine_key(rec['machine'])} | {run['seconds']:.0f} | "
                        f"{s['encoding_s']:.0f} | {share} | {s['training_s']:.0f} | {s['else_s']:.0f} | "
                        f"{100 * s['else_share']:.1f}% |")
            stages += [f"| `{path.name}` | {name.split('/', 1)[1]} | {seconds:.1f} |"
                       for name, seconds in run["walls"].items() if name.startswith("evaluate/")]
    if not rows:
        raise KeyError("no bench/out/demo_time*.json record has a split run: python bench/demo_time.py")
    return ("`pgrank demo` from nothing, its wall in three (records `bench/out/demo_time-*.json` with a split):\n\n"
            "| record | machine | wall s | encoding s | encoding's share of the float32 peak | training s | "
            "everything else s | everything else, share of the wall |\n"
            "| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: |\n" + "\n".join(rows) + "\n\n"
            "Each evaluation stage's own wall in those runs (its process from start to exit; a comparison system's "
            "corpus and queries were encoded when its candidates were mined; a policy loads its query encoders with "
            "PyTorch, the selected point's and the epoch ablation's, and encodes its queries):\n\n"
            "| record | system/dataset | wall s |\n| --- | --- | ---: |\n" + "\n".join(stages))


def _machine_key(m: dict) -> str:
    flags = set(m.get("cpu_flags", []))
    isa = "AMX" if "amx_bf16" in flags else "AVX-512 VNNI" if "avx512_vnni" in flags else "AVX2"
    return f"{m.get('cores')} {m.get('cpu')} cores with {isa}"


def demo_time() -> str:
    """One table per machine of every ``bench/demo_time.py`` record: each configuration's `pgrank demo` seconds
    from nothing, its training's, and its ratio to the first configuration of the same record."""
    by_machine: dict[str, list[tuple[str, dict]]] = {}
    for path in sorted(BENCH.glob("demo_time*.json")):
        rec = json.loads(path.read_text(encoding="utf-8"))
        by_machine.setdefault(_machine_key(rec["machine"]), []).append((f"bench/out/{path.name}", rec))
    out = []
    for machine, recs in sorted(by_machine.items()):
        out += [f"On {machine} (records {', '.join(f'`{n}`' for n, _ in recs)}; one interleaved set of runs per "
                "record):", "",
                "| record | configuration | runs | `pgrank demo` s | training s | against the record's first |",
                "| --- | --- | ---: | ---: | ---: | ---: |"]
        for name, rec in recs:
            first = rec["revisions"][0]["mean_seconds"]
            if name.removeprefix("bench/out/") not in CONFIGURATIONS:
                raise KeyError(f"{name}: say what each --rev runs in docs/blocks.py CONFIGURATIONS")
            for rev, configuration in zip(rec["revisions"], CONFIGURATIONS[name.removeprefix("bench/out/")]):
                runs = [r for r in rec["runs"] if r["rev"] == rev["rev"]]
                training = sum(r["training"] for r in runs) / len(runs)
                out.append(f"| `{name.removeprefix('bench/out/')}` | {configuration} | {len(runs)} | "
                           f"{rev['mean_seconds']:.0f} | {training:.0f} | {rev['mean_seconds'] / first:.2f}x |")
        out.append("")
    return "\n".join(out)


# --------------------------------------------------------------------------------------- the README's headline


def readme_headline() -> str:
    """The README's findings, each line's figures read from its record."""
    ood = record(DEMO_RECORD)
    demo, warm = _variants(ood)["demo"], ood["warm"]
    sci = demo["test"]["scifact/rerank"]
    ch = {k: _change(ood, demo, k) for k in demo["test"]}
    compare = _variants(record("studies/out/variants-compare-test.json"))
    val = _variants(record("studies/out/variants-compare.json"))
    info, pg = compare["infonce"]["test"], compare["pg"]["test"]
    p_max = max(info["scifact/rerank"]["p_first"], info["scifact/full"]["p_first"])
    ood_p = min(demo["test"][f"{s}/{st}"]["p_warm"] for s in ("nfcorpus", "dbpedia") for st in STAGES)
    best = max((v["val_in"], n) for n, v in val.items() if n.startswith("pg"))
    lines = [
        f"* **[The demo's policy gains in domain and holds out of domain](docs/findings/demo.md).** scifact test "
        f"nDCG@10 {warm['scifact/rerank']['ndcg@10']:.4f} (the all-MiniLM-L6-v2 warm start) → {sci['mean']:.4f} ± "
        f"{sci['sd']:.4f} (mean ± sd over {demo['seeds']} seeds, p {pvalue(sci['p_warm'])}), reranking and first stage "
        f"alike; NFCorpus {signed(ch['nfcorpus/rerank'])} / {signed(ch['nfcorpus/full'])} and the DBPedia-Entity "
        f"subset's report half {signed(ch['dbpedia/rerank'])} / {signed(ch['dbpedia/full'])} (rerank / first stage, "
        f"p ≥ {pvalue(ood_p)}). The policy is PG-Rank **plus** a top-1 KL term to the warm start, a document anchor "
        "and a selection rule guarded by half-document retrieval, not plain PG-Rank (record "
        f"`{DEMO_RECORD}`); "
        "[exported](docs/findings/export.md), it gives the same figures in plain sentence-transformers.",
        f"* **[On the same candidates, a standard loss beats PG-Rank](docs/findings/objectives.md).** InfoNCE "
        f"{info['scifact/rerank']['mean']:.4f} ± {info['scifact/rerank']['sd']:.4f} scifact test nDCG@10 reranking, "
        f"PG-Rank {pg['scifact/rerank']['mean']:.4f} ± {pg['scifact/rerank']['sd']:.4f} ({compare['pg']['seeds']} "
        f"seeds, p ≤ {pvalue(p_max)}; record `studies/out/variants-compare-test.json`); no PG-Rank setting tried on "
        f"validation closes the gap (best {signed(best[0])} against InfoNCE's {signed(val['infonce']['val_in'])}, "
        "record `studies/out/variants-compare.json`).",
    ]
    return "\n".join(textwrap.fill(line, width=118, subsequent_indent="  ", break_long_words=False,
                                   break_on_hyphens=False) for line in lines)


# --------------------------------------------------------------------------------------- the map of findings


def _dp(rec: dict, variant: str, cell: str) -> str:
    """A variant's change on one test cell, rerank / first stage: ``−0.0030 / −0.0037``."""
    entry = _variants(rec)[variant]
    return " / ".join(signed(_change(rec, entry, f"{cell}/{stage}")) for stage in STAGES)


def summary() -> str:
    """The findings map: one row per finding, its measure, what it is measured against, its result, its record
    and its page."""
    ood = record(DEMO_RECORD)
    demo = _variants(ood)["demo"]["test"]
    sci = demo["scifact/rerank"]
    ood_p = min(demo[f"{s}/{st}"]["p_warm"] for s in ("nfcorpus", "dbpedia") for st in STAGES)
    export = record("studies/out/exported_policy-demo.json")["result"]["sets"]
    largest = max(abs(c["difference"]) for stages in export.values() for c in stages.values())
    int8 = record("studies/out/exported_policy-demo-int8.json")["result"]["sets"]["dbpedia/test"]["full"]
    tools = record("studies/out/variants-demo-tools-float32.json")
    halves = _variants(record("studies/out/variants-demo-tools-float32-halves.json"))
    train = record("studies/out/variants-demo-tools-nfcorpus-train.json")
    one_se = record("studies/out/variants-demo-one-se.json")
    robust = _variants(record("studies/out/variants-demo.json"))
    guard = _variants(record("studies/out/variants-demo-halves.json"))["guard"]["val_ood"]
    compare = _variants(record("studies/out/variants-compare-test.json"))
    val = _variants(record("studies/out/variants-compare.json"))
    best = max((v["val_in"], n) for n, v in val.items() if n.startswith("pg"))
    times = {}
    for path in sorted(BENCH.glob("demo_time*.json")):
        rec = json.loads(path.read_text(encoding="utf-8"))
        for rev, configuration in zip(rec["revisions"], CONFIGURATIONS.get(path.name, [])):
            times.setdefault(configuration, []).append(rev["mean_seconds"])
    span = lambda c: f"{min(times[c]):.0f} to {max(times[c]):.0f} s"  # noqa: E731
    rows = [
        ("demo", "The demo's policy gains in domain and holds out of domain",
         "scifact test nDCG@10 (rerank = first stage); NFCorpus and DBPedia-Entity change, rerank / first stage",
         f"warm start {ood['warm']['scifact/rerank']['ndcg@10']:.4f}",
         f"{sci['mean']:.4f} ± {sci['sd']:.4f} (p {pvalue(sci['p_warm'])}); NFCorpus {_dp(ood, 'demo', 'nfcorpus')}, "
         f"DBPedia {_dp(ood, 'demo', 'dbpedia')} (p ≥ {pvalue(ood_p)})", DEMO_RECORD),
        ("export", "Its export reproduces every figure in plain sentence-transformers, where int8 documents flatter",
         "largest nDCG@10 difference, `SentenceTransformer(DIR)` against `pgrank evaluate`; DBPedia gain with int8 "
         "documents", "1e-4 (the goal)",
         f"{largest:.4f}; int8: {signed(int8['gain_pgrank'])} as evaluated, {signed(int8['gain_plain'])} in float32",
         "studies/out/exported_policy-demo.json"),
        ("tools", "Its KL term and document anchor hold the out-of-domain sets, which labelled validation cannot see",
         "NFCorpus test change, rerank / first stage, 3 seeds", f"the demo {_dp(tools, 'demo', 'nfcorpus')}",
         f"the selection rule alone {_dp(tools, 'rule-only', 'nfcorpus')}", "studies/out/variants-demo-tools-float32.json"),
        ("nfcorpus-train", "On NFCorpus's 2,590 train queries the demo's policy is at the warm start",
         "NFCorpus train change, rerank / first stage", f"no KL term {_dp(train, 'no-kl', 'nfcorpus/train')}",
         f"the demo {_dp(train, 'demo', 'nfcorpus/train')}", "studies/out/variants-demo-tools-nfcorpus-train.json"),
        ("anchor", "Without the document anchor the policy forgets on text of another kind",
         "NFCorpus half-document change, 3 seeds", f"no anchor {signed(halves['no-anchor']['val_ood']['halves:nfcorpus'])}",
         f"the demo {signed(halves['demo']['val_ood']['halves:nfcorpus'])}",
         "studies/out/variants-demo-tools-float32-halves.json"),
        ("halves", "Half documents as a guard do not carry over to another corpus",
         "NFCorpus half-document change of the policy guarded on scifact's", "the chooser's margin −0.0050",
         f"{signed(guard['halves:nfcorpus'])}", "studies/out/variants-demo-halves.json"),
        ("selection", "The one-standard-error rule keeps most of the in-domain gain with the paired error",
         "scifact test change", f"guarded rule {_dp(one_se, 'guarded', 'scifact').split(' / ')[0]}",
         f"paired {_dp(one_se, 'demo', 'scifact').split(' / ')[0]}, classic "
         f"{_dp(one_se, 'classic', 'scifact').split(' / ')[0]}", "studies/out/variants-demo-one-se.json"),
        ("robust", "WiSE-FT, L2-SP and PL-Rank-3 do not beat the demo's training on validation",
         "in-domain validation gain, one seed", f"the demo {signed(robust['demo']['val_in'])}",
         f"WiSE-FT {signed(robust['wise-ft']['val_in'])}, L2-SP {signed(robust['l2-sp']['val_in'])}, PL-Rank-3 "
         f"{signed(robust['plrank3']['val_in'])}", "studies/out/variants-demo.json"),
        ("objectives", "A standard loss beats PG-Rank on the same candidates, and no PG-Rank setting tried closes the gap",
         "scifact test nDCG@10 change, rerank, 3 seeds; validation gain, one seed",
         f"InfoNCE {_dp(record('studies/out/variants-compare-test.json'), 'infonce', 'scifact').split(' / ')[0]}; "
         f"{signed(val['infonce']['val_in'])}",
         f"PG-Rank {_dp(record('studies/out/variants-compare-test.json'), 'pg', 'scifact').split(' / ')[0]} "
         f"(p {pvalue(compare['infonce']['test']['scifact/rerank']['p_first'])}); best setting {signed(best[0])}",
         "studies/out/variants-compare-test.json"),
        ("demo-time", "The demo's float32 documents cost time on every CPU measured",
         "`pgrank demo` from nothing on 2 cores, by record and machine", f"int8 documents: {span(INT8)}",
         f"float32 documents: {span(DEMO)}", "bench/out/demo_time-float32.json"),
        ("retraining", "The champion gate's error budget holds, at a price in power (its figures: on its page)",
         "false promotions a year, and promotions of a better challenger, per error-budget rule", "—", "—",
         "studies/out/gate_power.json"),
    ]
    guard_page = ROOT / "docs" / "findings" / "forgetting-guard.md"
    if guard_page.is_file():
        guarded, demo = record(GUARD), record(LABELLED)
        cells = ("scifact/rerank", "nfcorpus/full", "dbpedia/full")

        def figures(rec: dict, variant: str) -> str:
            return " / ".join(signed(_change(rec, _variants(rec)[variant], c)) for c in cells)

        rows.append(("forgetting-guard", "A guard on half documents, at level 0.01 a set, holds every out-of-domain "
                     "set and keeps most of the in-domain gain",
                     "scifact rerank / NFCorpus first stage / DBPedia first stage change, 3 seeds",
                     f"labelled guard {figures(demo, 'demo')}",
                     f"level 0.16: {figures(guarded, 'halves-guard')}; 0.01: {figures(guarded, 'halves-guard-01')}",
                     GUARD))
    out = ["| finding | measure | reference | result | record |", "| --- | --- | ---: | ---: | --- |"]
    for page, finding, measure, reference, result, rec in rows:
        target = f"{page}.md" if page == "retraining" else f"findings/{page}.md"
        out.append(f"| [{finding}]({target}) | {measure} | {reference} | {result} | {f'`{rec}`' if rec else ''} |")
    return "\n".join(out)


# --------------------------------------------------------------------------------------- all

DEMO_SETS = ["scifact", "nfcorpus", "dbpedia"]
# The label-free forgetting guard against the labelled one and none (docs/findings/forgetting-guard.md).
GUARD = "studies/out/variants-demo-forgetting-guard.json"
LABELLED = "studies/out/variants-demo-ood.json"  # the labelled guard alone
GUARD_SETS = ["nfcorpus/dev", "dbpedia/dev", "scifact-halves/dev", "nfcorpus-halves/dev", "dbpedia-halves/dev"]
GUARDS = {"halves-guard": "the labelled sets and half documents of the three corpora, each at level 0.16 (noise_se 1)",
          "halves-guard-01": "the same five, each at level 0.01 (noise_se 2.326): 0.05 over the five (Bonferroni)"}


def no_guard_is_the_labelled_guard(rec: dict) -> bool:
    """Whether no guard chooses what the labelled guard chose at every seed of ``rec``: where the guard's choice is the
    best in-domain point of the whole history, no guard starts its one-standard-error step from that same point, along
    the same mixtures, and ends where the guard did."""
    from pgrank.core.history import alpha

    return all((best["epoch"], alpha(best)) == (run["epoch"], run["alpha"])
               for run in rec["runs"] for best in [max(run["history"], key=lambda r: r["val_ndcg@10"])])


def forgetting_guard() -> str:
    """The label-free guard against the labelled guard and no guard: each rule's test change against the warm start
    (mean over seeds) and the (epoch, α) it chose per seed. The labelled guard is its own record, whose runs trained
    as the guard record's did (the same validation history at every seed: ``tests/test_findings.py``); no guard is
    shown where it chooses what the labelled guard chose (:func:`no_guard_is_the_labelled_guard`)."""
    guard, demo = record(GUARD), record(LABELLED)
    head = ["rule", "what a point must pass", *(f"{SETS[s]}, rerank / first stage" for s in DEMO_SETS),
            "in-domain validation gain", "(epoch, α) per seed"]
    rows = ["| " + " | ".join(head) + " |", "| " + " | ".join(["---", "---", *["---:"] * 4, "---"]) + " |",
            "| warm start (nDCG@10) | | " + " | ".join(
                " / ".join(f"{demo['warm'][f'{s}/{st}']['ndcg@10']:.4f}" for st in STAGES) for s in DEMO_SETS)
            + " | | |"]

    def row(label: str, what: str, rec: dict, entry: dict, choices: str) -> str:
        changes = [" / ".join(signed(_change(rec, entry, f"{s}/{st}")) for st in STAGES) for s in DEMO_SETS]
        return f"| {label} | {what} | " + " | ".join(changes) + f" | {signed(entry['val_in'])} | {choices} |"

    labelled = _variants(demo)["demo"]
    rows.append(row("labelled guard", "nfcorpus/dev and dbpedia/dev, each at level 0.16", demo, labelled,
                    _choices(labelled)))
    if no_guard_is_the_labelled_guard(demo):  # else the page has no figures of it
        rows.append(row("no guard", "nothing", demo, labelled, "the labelled guard's at every seed (its choice is the "
                        "best in-domain point of the whole history)"))
    for variant, what in GUARDS.items():
        entry = _variants(guard).get(variant)
        if entry is not None:
            rows.append(row(f"`{variant}`", what, guard, entry, _choices(entry)))
    seeds = ", ".join(str(s) for s in sorted({r["seed"] for r in guard["runs"]}))
    return (f"nDCG@10 change against the warm start on the test sets (reported, never used to choose), mean over seeds "
            f"{seeds} (records `{LABELLED}` and `{GUARD}`):\n\n"
            + "\n".join(rows))
BLOCKS: dict[str, Callable[[], str]] = {
    "readme-headline": readme_headline,
    "summary": summary,
    "demo-test": demo_test,
    "export": export_table,
    "forgetting": forgetting_table,
    "demo-time": demo_time,
    "demo-time-split": demo_time_split,
    "tools": lambda: variants_table("studies/out/variants-demo-tools-float32.json", DEMO_SETS,
                                    validation=["nfcorpus/dev", "dbpedia/dev"]),
    "tools-halves": lambda: variants_table("studies/out/variants-demo-tools-float32-halves.json", [],
                                           validation=["halves:nfcorpus", "halves:scifact", "halves:dbpedia"],
                                           seconds=False),
    "nfcorpus-train": lambda: variants_table("studies/out/variants-demo-tools-nfcorpus-train.json",
                                             ["nfcorpus/train", "nfcorpus"], validation=["nfcorpus/dev"]),
    "nfcorpus-train-guard": lambda: variants_table("studies/out/variants-demo-nfcorpus-train-guard.json",
                                                   ["scifact", "nfcorpus"],
                                                   validation=["nfcorpus/dev", "nfcorpus/train"]),
    "one-se": lambda: _one_se(),
    "robust": lambda: variants_table("studies/out/variants-demo.json", ["scifact", "nfcorpus"],
                                     validation=["nfcorpus/dev"]),
    "anchor-coef": lambda: variants_table("studies/out/variants-demo-anchor-coef-float32.json", DEMO_SETS,
                                          validation=["nfcorpus/dev", "dbpedia/dev", "halves:scifact",
                                                      "halves:nfcorpus"]),
    "anchor-seeds": lambda: variants_table("studies/out/variants-demo-anchor.json", ["scifact", "nfcorpus"],
                                           validation=["nfcorpus/dev", "halves:scifact", "halves:nfcorpus"]),
    "anchor-2docs": lambda: variants_table("studies/out/variants-demo-anchor-2docs.json", ["scifact", "nfcorpus"],
                                           validation=["nfcorpus/dev", "halves:scifact", "halves:nfcorpus"]),
    "halves": lambda: variants_table("studies/out/variants-demo-halves.json", ["scifact", "nfcorpus"],
                                     validation=["nfcorpus/dev", "scifact-halves/dev", "halves:scifact",
                                                 "halves:nfcorpus"]),
    "compare-test": lambda: variants_table("studies/out/variants-compare-test.json", ["scifact", "nfcorpus"]),
    "forgetting-guard": lambda: forgetting_guard(),
    "forgetting-guard-validation": lambda: variants_table(GUARD, [], validation=GUARD_SETS, seconds=False),
    "compare-validation": lambda: variants_table("studies/out/variants-compare.json", []),
}


def _one_se() -> str:
    """The selection rules' record: the variants without out-of-domain validation have no nfcorpus/dev figure."""
    name = "studies/out/variants-demo-one-se.json"
    rec = record(name)
    table = variants_table(name, ["scifact", "nfcorpus"], validation=[])
    ood = {v: e["val_ood"].get("nfcorpus/dev") for v, e in _variants(rec).items()}
    guarded = ", ".join(f"`{v}` {signed(g)}" for v, g in ood.items() if g is not None)
    return (table + f"\n\nnfcorpus/dev validation change of the rules that validate on it: {guarded} "
            f"(record `{name}`).")
