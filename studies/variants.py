"""Question: Which training variant of a profile does validation choose, and what do the test sets say of each?
Record: ``studies/out/variants-*.json``
Page: ``docs/results.md``

Training variants of a profile's policy, side by side, chosen on validation only: ``python studies/variants.py``.

Trains the profile's policy (``--profile demo``: all-MiniLM-L6-v2 on scifact, ``tower: query``; ``--profile compare``:
the same data with the compare profile's settings) once per variant and seed, from ``--warm-start`` (default: the
profile's first ``train.warm_starts``). A variant is a name and ``--set``-style overrides (``objective=O`` picks the
loss), e.g.::

    --variant "plrank3: train.pg.estimator=plrank3"
    --variant "wise-ft: train.selection.interpolation=[0.25, 0.5, 0.75, 1]"
    --variant "infonce: objective=infonce"

and ``--objectives pg infonce`` adds one variant per loss, named after it (``--variant "infonce: objective=infonce"``).

The datasets, corpus embeddings and candidate sets are built once and shared (the variants differ only in
training). Every run validates each epoch (and each mixture with the warm start, with ``interpolation``) on
scifact's carved validation split (in domain) and on the profile's out-of-domain validation sets (``nfcorpus/dev``
for the demo), and its selection rule picks the policy. **Choosing** uses those validation figures only: the record's
``chosen`` variant is the one with the best mean in-domain validation gain among those whose mean out-of-domain
validation loss stays within ``--margin``. ``--forgetting`` adds label-free checks of another kind to those
out-of-domain ones: half-document retrieval (``studies/forgetting.py``) on the corpora of the training set and of the
out-of-domain validation sets, each policy's change against the warm start. ``--test`` also evaluates each run's
policy on the profile's ``data.eval_sets`` (reranking and first stage), for reporting: mean and standard deviation
over seeds, and a paired t-test of per-query means over seeds against the first variant and against the warm
start.

Writes ``studies/out/variants-<profile>.json`` (``--out``) with the machine, and prints its tables.

Example:
    $ python studies/variants.py --profile demo --work /tmp/variants --seeds 42 \\
        --variant "demo:" --variant "wise-ft: train.selection.interpolation=[0.25, 0.5, 0.75, 1]"
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "bench"), str(ROOT / "studies")]

from compare_lr import run_overrides  # noqa: E402
from forgetting import HalfDocuments  # noqa: E402
from kl_ablation import link_shared  # noqa: E402
from record import machine_record  # noqa: E402
from record import add_mirror_option, add_set_option  # noqa: E402

STAGES = ("rerank", "full")


def test_cells(params) -> list[tuple[str, str, str]]:
    """``(dataset, split, stage)`` of every test figure: the profile's ``data.eval_sets`` (its test splits, and a
    set's report half such as ``dbpedia-entity-subset/test``), each reranked and as a first stage."""
    return [(d, split, stage) for d, splits in params.data.eval_sets_by_dataset().items() for split in splits
            for stage in STAGES]


def cell_key(dataset: str, split: str, stage: str) -> str:
    return f"{dataset}/{stage}" if split == "test" else f"{dataset}/{split}/{stage}"


def names_its_split(key: str) -> bool:
    """Whether a :func:`cell_key` is of a split other than test (``dataset/split/stage``)."""
    return key.count("/") > 1


def parse_variant(text: str) -> tuple[str, str, list[str]]:
    """``"name: key=value key=value"`` -> ``(name, objective, overrides)``; values may hold spaces inside brackets."""
    name, _, rest = text.partition(":")
    overrides, objective, depth, token = [], "pg", 0, ""
    for ch in rest.strip() + " ":
        depth += ch in "[{" and 1 or (-1 if ch in "]}" else 0)
        if ch == " " and depth == 0:
            if token:
                key, _, value = token.partition("=")
                if key == "objective":
                    objective = value
                else:
                    overrides.append(token)
            token = ""
        else:
            token += ch
    return name.strip(), objective, overrides


def _params(args, root: Path, extra: list[str]):
    from pgrank.config import load_params

    return load_params(ROOT / "params.yaml", run_overrides(args, root, extra, fixed=["evaluate.policy_epochs=[]"]),
                       profile=args.profile)


def variant_specs(args) -> list[str]:
    """The ``--variant`` specs, then one ``"O: objective=O"`` a loss of ``--objectives``."""
    return [*args.variant, *(f"{o}: objective={o}" for o in args.objectives)]


def _test(params, paths, system: str) -> dict:
    out = {}
    for dataset, split, stage in test_cells(params):
        folder = paths.results(system, dataset, split, stage)
        record = json.loads((folder / "metrics.json").read_text())
        per_query = json.loads((folder / "per_query.json").read_text())
        out[cell_key(dataset, split, stage)] = {"ndcg@10": record["metrics"]["ndcg@10"],
                                                "per_query": {q: m["ndcg@10"] for q, m in per_query.items()}}
    return out


def _finished(params, paths, warm_start: str, objective: str, system: str) -> list[dict] | None:
    """A run's history when it trained and was tested before (``--reuse``), else None."""
    history = paths.training_log(warm_start, objective) / "history.json"
    tested = all((paths.results(system, d, sp, st) / "per_query.json").exists() for d, sp, st in test_cells(params))
    return json.loads(history.read_text()) if history.exists() and tested else None


def _query_route(folder: Path, params):
    from pgrank.models.loading import load_encoder
    from pgrank.training.checkpoints import query_route

    return query_route(load_encoder(str(folder), params.models, device="cpu", max_seq_length=256))


def _half_documents(params, paths, warm_start: str) -> list:
    """``--forgetting``: the half-document task (``studies/forgetting.py``) of the training set's corpus and of every
    out-of-domain validation set's (not those that are half documents already), with the warm start's figures."""
    from pgrank.models.loading import load_encoder

    warm = load_encoder(warm_start, params.models, device="cpu", max_seq_length=256)
    sources = params.data.sources
    datasets = dict.fromkeys(n.split("/")[0] for n in [params.data.train, *params.train.validation_sets])
    return [HalfDocuments(paths.dataset(d) / "corpus.jsonl", warm) for d in datasets
            if not (d in sources and sources[d].halves is not None)]


def run(args) -> dict:
    from pgrank.download.stage import download
    from pgrank.evaluation.stage import evaluate_dataset
    from pgrank.mining.candidate_sets import evaluation_targets, mine_splits, training_targets, validation_targets
    from pgrank.paths import Paths, policy_name
    from pgrank.core.history import alpha, set_key
    from pgrank.training.selection import select_row
    from pgrank.training.trainer import train

    base = args.work / "runs" / "base"
    params = _params(args, base, [])
    paths = Paths.from_config(params.paths)
    warm_start = params.train.warm_starts[0]  # --warm-start, else the profile's first
    started = time.perf_counter()
    download(params, paths, progress=False)
    mine_splits(params, paths, training_targets(params) + evaluation_targets(params), progress=False)
    if params.train.validation_sets:
        mine_splits(params, paths, validation_targets(params), progress=False, training=True)
    if args.test:
        for dataset in params.data.eval_sets_by_dataset():
            evaluate_dataset(params, paths, warm_start, dataset)
    halves = _half_documents(params, paths, warm_start) if args.forgetting else []
    record = {"setup_seconds": round(time.perf_counter() - started),
              "ood": list(params.train.validation_sets) + [f"halves:{t.name}" for t in halves],
              "warm_start": warm_start, "warm": _test(params, paths, warm_start) if args.test else None, "runs": [],
              "test_cells": [cell_key(*c) for c in test_cells(params)]}
    print(f"shared setup: {record['setup_seconds']} s", flush=True)
    for spec in variant_specs(args):
        name, objective, overrides = parse_variant(spec)
        for seed in args.seeds:
            root = args.work / "runs" / f"{name}-s{seed}"
            link_shared(root, base)
            p = _params(args, root, [*overrides, f"train.seed={seed}"])
            run_paths = Paths.from_config(p.paths)
            system = policy_name(warm_start, objective)
            finished = _finished(p, run_paths, warm_start, objective, system) if args.reuse else None
            if finished:
                history, seconds = finished, None  # its time was measured by the invocation that trained it
            else:
                t0 = time.perf_counter()
                history = train(p, run_paths, warm_start, objective=objective, device="cpu", progress=False).history
                seconds = time.perf_counter() - t0
            chosen = select_row(history, p.train.validation_sets, p.train.selection)
            warm = history[0]
            row = {"variant": name, "objective": objective, "overrides": overrides, "seed": seed,
                   "seconds": round(seconds, 1) if seconds is not None else None, "epoch": chosen["epoch"], "alpha": alpha(chosen),
                   "val_in": chosen["val_ndcg@10"] - warm["val_ndcg@10"],
                   "val_ood": {s: chosen[set_key(s)] - warm[set_key(s)] for s in p.train.validation_sets},
                   "history": history}
            if halves:
                policy = _query_route(run_paths.selected_checkpoint(warm_start, objective), p)
                row["val_ood"].update({f"halves:{t.name}": t.change(policy)[0] for t in halves})
            if args.test:
                for dataset in p.data.eval_sets_by_dataset() if not finished else ():
                    evaluate_dataset(p, run_paths, system, dataset)
                row["test"] = _test(p, run_paths, system)
            record["runs"].append(row)
            print(f"{name} seed {seed}: epoch {row['epoch']} alpha {row['alpha']:g}, val in {row['val_in']:+.4f}, "
                  f"ood {json.dumps({k: round(v, 4) for k, v in row['val_ood'].items()})}"
                  + (f", {seconds:.0f} s" if seconds is not None else ", reused"), flush=True)
    return record


def summarise(record: dict, margin: float) -> dict:
    """Per variant: mean validation gains over seeds, the choice on validation only, and (with test figures) the
    means, standard deviations and paired t-tests of per-query means over seeds."""
    from pgrank.core.significance import paired_test

    variants = list(dict.fromkeys(r["variant"] for r in record["runs"]))
    out = {}
    for name in variants:
        runs = [r for r in record["runs"] if r["variant"] == name]
        ood = {s: statistics.mean(r["val_ood"][s] for r in runs) for s in record["ood"] if s in runs[0]["val_ood"]}
        entry = {"seeds": len(runs), "val_in": statistics.mean(r["val_in"] for r in runs), "val_ood": ood,
                 "choices": [(r["epoch"], r["alpha"]) for r in runs],
                 "seconds": statistics.mean(t) if (t := [r["seconds"] for r in runs if r["seconds"] is not None]) else None}
        if runs[0].get("test"):
            entry["test"] = {}
            for key in runs[0]["test"]:
                values = [r["test"][key]["ndcg@10"] for r in runs]
                qids = runs[0]["test"][key]["per_query"]
                per_query = {q: statistics.mean(r["test"][key]["per_query"][q] for r in runs) for q in qids}
                entry["test"][key] = {"mean": statistics.mean(values),
                                      "sd": statistics.stdev(values) if len(values) > 1 else None,
                                      "per_query": per_query}
        out[name] = entry
    # a variant that did not validate on every out-of-domain set cannot show that it is safe there
    eligible = [n for n in variants if set(out[n]["val_ood"]) == set(record["ood"])
                and all(v >= -margin for v in out[n]["val_ood"].values())]
    chosen = max(eligible, key=lambda n: out[n]["val_in"]) if eligible else None
    if record.get("warm") and variants and out[variants[0]].get("test"):
        first = variants[0]
        for name in variants:
            for key, cell in out[name]["test"].items():
                cell["p_first"] = None if name == first else paired_test(cell["per_query"], out[first]["test"][key]["per_query"], "student")
                cell["p_warm"] = paired_test(cell["per_query"], record["warm"][key]["per_query"], "student")
    for entry in out.values():
        for cell in entry.get("test", {}).values():
            cell.pop("per_query", None)
    return {"variants": out, "chosen": chosen, "margin": margin}


def render(record: dict) -> str:
    summary, ood = record["summary"], record["ood"]
    head = ["variant", "seeds", "policy (epoch, alpha)", "val in-domain Δ", *[f"val {s} Δ" for s in ood]]
    has_test = any("test" in v for v in summary["variants"].values())
    cells = record.get("test_cells") or [f"{d}/{s}" for d in ("scifact", "nfcorpus") for s in STAGES]
    if has_test:
        head += [c if names_its_split(c) else f"test {c}" for c in cells]
    lines = ["| " + " | ".join(head) + " |", "|" + " --- |" * 3 + " ---: |" * (len(head) - 3)]
    if has_test and record.get("warm"):
        lines.append("| warm start | | | | " + " | ".join("" for _ in ood) + " | "
                     + " | ".join(f"{record['warm'][c]['ndcg@10']:.4f}" for c in cells) + " |")
    for name, v in summary["variants"].items():
        choices = ", ".join(f"({e}, {a:g})" for e, a in v["choices"])
        row = [name, str(v["seeds"]), choices, f"{v['val_in']:+.4f}",
               *[f"{v['val_ood'][s]:+.4f}" if s in v["val_ood"] else "not validated" for s in ood]]
        for key in cells if "test" in v else []:
            c = v["test"][key]
            sd = f" ± {c['sd']:.4f}" if c.get("sd") is not None else ""
            ps = ", ".join(f"{label} {c[k]:.2g}" for label, k in (("p₁", "p_first"), ("p₀", "p_warm")) if c.get(k) is not None)
            row.append(f"{c['mean']:.4f}{sd} ({ps})" if ps else f"{c['mean']:.4f}{sd}")
        lines.append("| " + " | ".join(row) + " |")
    chosen = f"**{summary['chosen']}**" if summary["chosen"] else "no variant"
    text = ["\n".join(lines), "",
            f"Validation only chooses: {chosen} (the best mean in-domain validation gain among the variants "
            f"whose mean out-of-domain validation change is at least −{summary['margin']})."]
    if has_test:
        text.append("Test cells: nDCG@10, mean ± standard deviation over seeds (p₁: paired t-test of per-query means over "
                    "seeds against the first variant; p₀: against the warm start). They are reported, never used to choose.")
        named = [c for c in cells if names_its_split(c)]
        if named:
            text.append(f"Cells named by their split ({', '.join(named)}) evaluate that split, not a test split, the same "
                        "way; they are reported and never used to choose either.")
    return "\n".join(text)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """The command line; at least one ``--variant`` or ``--objectives``."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--profile", default="demo")
    parser.add_argument("--work", type=Path, required=True)
    add_mirror_option(parser, required=False)
    parser.add_argument("--warm-start", default=None,
                        help="the model every variant trains from (default: the profile's first train.warm_starts)")
    parser.add_argument("--variant", action="append", default=[], help='"name: key=value ..." (repeatable)')
    parser.add_argument("--objectives", nargs="+", default=[],
                        help='one variant a loss, named after it (--objectives pg infonce: --variant "pg: objective=pg" '
                             '--variant "infonce: objective=infonce")')
    parser.add_argument("--seeds", type=int, nargs="+", default=[42])
    add_set_option(parser, "train.validation_sets=[nfcorpus/dev]", "every variant (and the shared setup)")
    parser.add_argument("--margin", type=float, default=0.005, help="out-of-domain validation loss allowed in the choice")
    parser.add_argument("--test", action="store_true", help="also evaluate every policy on the test sets (reporting only)")
    parser.add_argument("--reuse", action="store_true",
                        help="take a run's history, timings and test results from --work when it finished before")
    parser.add_argument("--forgetting", action="store_true",
                        help="also check every policy on half-document retrieval (studies/forgetting.py) over the "
                             "corpora of the training and out-of-domain validation sets; the choice counts them as "
                             "out-of-domain checks")
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args(argv)
    if not args.variant and not args.objectives:
        parser.error("give at least one --variant or --objectives")
    args.work = args.work.resolve()
    return args


def main() -> None:
    args = parse_args()
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    from pgrank.atomic import write_json
    from pgrank.core.history import scalars

    record = {"command": "python " + " ".join(["studies/variants.py", *sys.argv[1:]]),
              "title": f"Training variants of the {args.profile} profile, chosen on validation", "machine": machine_record(),
              "profile": args.profile, **run(args)}
    record["summary"] = summarise(record, args.margin)
    for r in record["runs"]:  # per-query figures stay out of the record (the summary holds their tests)
        for cell in (r.get("test") or {}).values():
            cell.pop("per_query", None)
        r["history"] = [scalars(row) for row in r["history"]]
    if record.get("warm"):
        for cell in record["warm"].values():
            cell.pop("per_query", None)
    out = args.out or ROOT / "studies" / "out" / f"variants-{args.profile}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    write_json(out, record)
    print(render(record))


if __name__ == "__main__":
    main()
