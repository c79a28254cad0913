"""The KL regulariser's trade-off on the demo: in-domain gain against out-of-domain loss.

Trains the demo policy (all-MiniLM-L6-v2 warm start, scifact, ``tower: query``, the demo profile's
settings) once per ``(train.pg.kl, train.pg.kl_coef)`` with one seed, validating each epoch on
scifact's carved validation split (in domain) and on ``nfcorpus/dev`` (out of domain), then evaluates
each run's last epoch and the epoch the ``guarded`` rule selects on scifact/test and nfcorpus/test,
reranking and first stage, with paired t-tests against the warm start. Everything runs through the
stages' own library functions; the datasets, corpus embeddings and candidate sets are built once
and shared by every run (the runs differ only in training).

Tuning uses validation figures only: the printed ``chosen`` row is the setting with the best
in-domain validation gain among those whose nfcorpus/dev loss stays within the margin. The test
columns are reported, never used for choosing.

Usage::

    python bench/kl_ablation.py --work /tmp/kl [--mirror ../shared/data/beir] \
        [--coefs 0 0.1 1 10] [--kinds top1 ranking] [--out bench/out/kl_ablation.md]
"""

from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SHARED = ("datasets", "splits", "training-sets", "candidates")  # built once, linked into every run's root


def _params(work: Path, mirror: str, root: Path, ood: list[str], extra: list[str]):
    from pgrank.config import load_params

    return load_params(ROOT / "params.yaml", [
        f"paths.root={root}", f"paths.data={work / 'data'}", f"paths.embeddings={work / 'embeddings'}",
        f"data.mirror={mirror}", "tracking.enabled=false", "data.eval_sets={scifact: [test], nfcorpus: [test]}",
        f"train.validation_sets=[{', '.join(ood)}]", "evaluate.policy_epochs=[]", *extra], profile="demo")


def _metrics(paths, system: str) -> dict:
    out = {}
    for dataset in ("scifact", "nfcorpus"):
        for stage in ("rerank", "full"):
            record = json.loads((paths.results(system, dataset, "test", stage) / "metrics.json").read_text())
            p = (record.get("significance") or {}).get("p_values", {}).get("ndcg@10")
            out[f"{dataset}/{stage}"] = (record["metrics"]["ndcg@10"], p)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--work", type=Path, required=True)
    parser.add_argument("--mirror", default=str(ROOT.parent / "shared" / "data" / "beir"))
    parser.add_argument("--coefs", type=float, nargs="+", default=[0.0, 0.1, 1.0, 10.0])
    parser.add_argument("--kinds", nargs="+", default=["top1", "ranking"])
    parser.add_argument("--margin", type=float, default=0.005)
    parser.add_argument("--ood", nargs="+", default=["nfcorpus/dev"],
                        help="out-of-domain validation sets (never a test split)")
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()
    os.environ.setdefault("HF_HUB_OFFLINE", "1")

    from pgrank.download.stage import download
    from pgrank.evaluation.stage import evaluate, evaluate_dataset
    from pgrank.mining.candidate_sets import evaluation_targets, mine_splits, training_targets, validation_targets
    from pgrank.paths import Paths
    from pgrank.training.selection import select_epoch, set_key
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
    print(f"shared setup: {time.perf_counter() - started:.0f} s", flush=True)
    warm = _metrics(paths, "minilm")

    configs = [("top1", 0.0)] + [(k, c) for k in args.kinds for c in args.coefs if c > 0]
    rows = []
    for kind, coef in configs:
        label = "none" if coef == 0 else f"{kind} {coef:g}"
        root = work / "runs" / label.replace(" ", "-")
        root.mkdir(parents=True, exist_ok=True)
        for name in SHARED:
            if not (root / name).exists():
                (root / name).symlink_to(base_root / name)
        (root / "results").mkdir(exist_ok=True)
        if not (root / "results" / "minilm").exists():
            (root / "results" / "minilm").symlink_to(base_root / "results" / "minilm")
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
        run_rows = {}
        for rule, system in (("last", f"pgrank-minilm@{last}"), ("guarded", "pgrank-minilm")):
            chosen = last if rule == "last" else select_epoch(result.history, args.ood, p.train.selection)
            row = next(r for r in result.history if r["epoch"] == chosen)
            run_rows[rule] = {"epoch": chosen, "seconds": round(seconds), "test": _metrics(run_paths, system),
                              "val_in": row["val_ndcg@10"] - result.history[0]["val_ndcg@10"],
                              "val_ood": {s: row[set_key(s)] - result.history[0][set_key(s)] for s in args.ood}}
            print(label, rule, json.dumps(run_rows[rule]), flush=True)
        rows.append((label, run_rows))

    cols = ["scifact/rerank", "scifact/full", "nfcorpus/rerank", "nfcorpus/full"]
    lines = ["| KL | policy epoch | val scifact Δ | " + " | ".join(f"val {s} Δ" for s in args.ood) + " | "
             + " | ".join(f"test {c}" for c in cols) + " |",
             "| --- | --- | ---: | " + " | ".join("---:" for _ in [*args.ood, *cols]) + " |",
             "| (warm start) | 0 | | " + " | ".join("" for _ in args.ood) + " | " + " | ".join(f"{warm[c][0]:.4f}" for c in cols) + " |"]
    for label, run_rows in rows:
        for rule, r in run_rows.items():
            cells = []
            for c in cols:
                value, p = r["test"][c]
                cells.append(f"{value:.4f} ({value - warm[c][0]:+.4f}{', p=%.2g' % p if p is not None else ''})")
            ood = " | ".join(f"{r['val_ood'][s]:+.4f}" for s in args.ood)
            lines.append(f"| {label} | {r['epoch']} ({rule}) | {r['val_in']:+.4f} | {ood} | " + " | ".join(cells) + " |")
    ok = [(label, r["guarded"]) for label, r in rows if min(r["guarded"]["val_ood"].values()) >= -args.margin]
    if ok:
        label, r = max(ok, key=lambda x: x[1]["val_in"])
        lines.append(f"\nchosen on validation only (best in-domain validation gain with nfcorpus/dev loss <= {args.margin}): "
                     f"{label}, guarded epoch {r['epoch']}")
    text = "\n".join(lines)
    print(text)
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(text + "\n")


if __name__ == "__main__":
    main()
