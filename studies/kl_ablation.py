"""Question: Which KL term to the warm start trades the least in-domain gain for the most out-of-domain hold?
Record: ``studies/out/kl_ablation*.json``
Page: ``docs/findings/tools.md``

The KL regulariser's trade-off on the demo: in-domain gain against out-of-domain loss.

Trains the demo policy (all-MiniLM-L6-v2 warm start, scifact, ``tower: query``, the demo profile's
settings) once per ``(train.pg.kl, train.pg.kl_coef)`` with one seed, validating each epoch on
scifact's carved validation split (in domain) and on ``nfcorpus/dev`` (out of domain), then evaluates
each run's last epoch and the epoch the ``guarded`` rule selects on scifact/test and nfcorpus/test,
reranking and first stage, with paired t-tests against the warm start. Everything runs through the
stages' own library functions; the datasets, corpus embeddings and candidate sets are built once
and shared by every run (the runs differ only in training).

Tuning uses validation figures only: the printed ``chosen`` row is the setting with the best
in-domain validation gain among those whose nfcorpus/dev loss stays within the margin. The test
columns are reported, never used for choosing. Writes ``studies/out/kl_ablation.json`` (``--out``; with the machine)
and prints the table.

Usage::

    python studies/kl_ablation.py --work W [--mirror M] \
        [--coefs 0 0.1 1 10] [--kinds top1 ranking] [--out studies/out/kl_ablation.json]
"""

from __future__ import annotations

import argparse
import sys
import json
import os
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench"))  # record: the plumbing shared with bench/
from record import add_mirror_option, add_out_option, new_record, save, table  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
SHARED = ("datasets", "splits", "training-sets", "candidates")  # built once, linked into every run's root
COLUMNS = ["scifact/rerank", "scifact/full", "nfcorpus/rerank", "nfcorpus/full"]  # test nDCG@10 reported per run
TITLE = "The KL regulariser's trade-off on the demo: in-domain gain against out-of-domain loss"


def link_shared(root: Path, base: Path) -> None:
    """A run's ``paths.root`` whose data, carve-out, training and candidate sets and the warm start's results are
    links into the shared ``base`` root: every run trains on the same candidates, built once."""
    root.mkdir(parents=True, exist_ok=True)
    for name in SHARED:
        if not (root / name).exists():
            (root / name).symlink_to(base / name)
    (root / "results").mkdir(exist_ok=True)
    if not (root / "results" / "minilm").exists():
        (root / "results" / "minilm").symlink_to(base / "results" / "minilm")


def _params(work: Path, mirror: str, root: Path, ood: list[str], extra: list[str]):
    from pgrank.config import load_params

    return load_params(ROOT / "params.yaml", [
        f"paths.root={root}", f"paths.data={work / 'data'}", f"paths.embeddings={work / 'embeddings'}",
        f"data.mirror={mirror}", "tracking.enabled=false", "data.eval_sets={scifact: [test], nfcorpus: [test]}",
        f"train.validation_sets=[{', '.join(ood)}]", "evaluate.policy_epochs=[]", *extra], profile="demo")


def _metrics(paths, system: str) -> dict:
    """``{column: {"ndcg_at_10": test nDCG@10, "p": p against the warm start or None}}``."""
    out = {}
    for column in COLUMNS:
        dataset, stage = column.split("/")
        metrics = json.loads((paths.results(system, dataset, "test", stage) / "metrics.json").read_text())
        p = (metrics.get("significance") or {}).get("p_values", {}).get("ndcg@10")
        out[column] = {"ndcg_at_10": metrics["metrics"]["ndcg@10"], "p": p}
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--work", type=Path, required=True)
    add_mirror_option(parser)
    parser.add_argument("--coefs", type=float, nargs="+", default=[0.0, 0.1, 1.0, 10.0])
    parser.add_argument("--kinds", nargs="+", default=["top1", "ranking"])
    parser.add_argument("--margin", type=float, default=0.005)
    parser.add_argument("--ood", nargs="+", default=["nfcorpus/dev"],
                        help="out-of-domain validation sets (never a test split)")
    add_out_option(parser, __file__)
    args = parser.parse_args()
    os.environ.setdefault("HF_HUB_OFFLINE", "1")

    from pgrank.download.stage import download
    from pgrank.evaluation.stage import evaluate, evaluate_dataset
    from pgrank.mining.candidate_sets import evaluation_targets, mine_splits, training_targets, validation_targets
    from pgrank.paths import Paths
    from pgrank.core.history import set_key
    from pgrank.training.selection import select_epoch
    from pgrank.training.trainer import train

    work = args.work.resolve()
    base_root = work / "runs" / "base"
    if any(name.endswith("/test") for name in args.ood):
        parser.error("--ood: tuning never sees a test split")
    params = _params(work, args.mirror, base_root, args.ood, [])
    paths = Paths.from_config(params.paths)
    started = time.perf_counter()
    download(params, paths, progress=False)
    mine_splits(params, paths, training_targets(params) + evaluation_targets(params), progress=False)
    mine_splits(params, paths, validation_targets(params), progress=False, training=True)
    for dataset in ("scifact", "nfcorpus"):
        evaluate_dataset(params, paths, "minilm", dataset)
    setup_seconds = time.perf_counter() - started
    print(f"shared setup: {setup_seconds:.0f} s", flush=True)
    warm = _metrics(paths, "minilm")

    configs = [("top1", 0.0)] + [(k, c) for k in args.kinds for c in args.coefs if c > 0]
    runs = []
    for kind, coef in configs:
        label = "none" if coef == 0 else f"{kind} {coef:g}"
        root = work / "runs" / label.replace(" ", "-")
        link_shared(root, base_root)
        p = _params(work, args.mirror, root, args.ood, [f"train.pg.kl={kind}", f"train.pg.kl_coef={coef}",
                                              f"train.selection={{rule: guarded, margin: {args.margin}}}"])
        run_paths = Paths.from_config(p.paths)
        t0 = time.perf_counter()
        result = train(p, run_paths, "minilm", device="cpu", progress=False)
        seconds = time.perf_counter() - t0
        last = p.train.epochs
        for dataset in ("scifact", "nfcorpus"):
            evaluate_dataset(p, run_paths, "pgrank-minilm", dataset)  # the guarded selection
            evaluate(p, run_paths, f"pgrank-minilm@{last}", f"{dataset}/test", ["rerank", "full"])
        for rule, system in (("last", f"pgrank-minilm@{last}"), ("guarded", "pgrank-minilm")):
            chosen = last if rule == "last" else select_epoch(result.history, args.ood, p.train.selection)
            row = next(r for r in result.history if r["epoch"] == chosen)
            run = {"kl": label, "rule": rule, "epoch": chosen, "seconds": seconds, "test": _metrics(run_paths, system),
                   "val_in": row["val_ndcg@10"] - result.history[0]["val_ndcg@10"],
                   "val_ood": {s: row[set_key(s)] - result.history[0][set_key(s)] for s in args.ood}}
            print(label, rule, json.dumps(run), flush=True)
            runs.append(run)

    record = new_record(TITLE)
    record.update(coefs=args.coefs, kinds=args.kinds, ood=args.ood, margin=args.margin, columns=COLUMNS,
                  setup_seconds=setup_seconds, warm_start=warm, runs=runs, chosen=choose(runs, args.margin))
    save(record, args.out, render)


def choose(runs: list[dict], margin: float) -> dict | None:
    """The setting chosen on validation only: the best in-domain validation gain among the guarded runs whose
    out-of-domain validation loss stays within ``margin``."""
    ok = [r for r in runs if r["rule"] == "guarded" and min(r["val_ood"].values()) >= -margin]
    best = max(ok, key=lambda r: r["val_in"], default=None)
    return None if best is None else {"kl": best["kl"], "epoch": best["epoch"]}


def render(record: dict) -> str:
    """The record as the Markdown table the script prints."""
    ood, cols, warm = record["ood"], record["columns"], record["warm_start"]
    rows = [["(warm start)", "0", "", *("" for _ in ood), *(f"{warm[c]['ndcg_at_10']:.4f}" for c in cols)]]
    for r in record["runs"]:
        cells = []
        for c in cols:
            value, p = r["test"][c]["ndcg_at_10"], r["test"][c]["p"]
            cells.append(f"{value:.4f} ({value - warm[c]['ndcg_at_10']:+.4f}{', p=%.2g' % p if p is not None else ''})")
        rows.append([r["kl"], f"{r['epoch']} ({r['rule']})", f"{r['val_in']:+.4f}",
                     *(f"{r['val_ood'][s]:+.4f}" for s in ood), *cells])
    out = table(["KL", "policy epoch", "val scifact Δ", *(f"val {s} Δ" for s in ood), *(f"test {c}" for c in cols)],
                rows, "llr" + "r" * (len(ood) + len(cols)))
    if chosen := record["chosen"]:
        out += ["", f"chosen on validation only (best in-domain validation gain with {', '.join(ood)} loss <= "
                f"{record['margin']}): {chosen['kl']}, guarded epoch {chosen['epoch']}"]
    return "\n".join(out)


if __name__ == "__main__":
    main()
