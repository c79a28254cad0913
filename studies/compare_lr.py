"""Question: Which learning rate does each objective take on the compare profile, chosen on validation only?
Record: ``studies/out/compare_lr-*.json``
Page: ``docs/findings/objectives.md``

Choose each objective's learning rate for a profile (the compare profile by default), on validation only.

Trains every ``train.objectives`` loss of the profile (``--profile``, with ``--set`` overrides, e.g.
``--set data.train=nfcorpus/train`` for another dataset), or the losses of ``--objectives``, at each learning rate of
a small grid (one seed, the profile's epochs and batches, from ``--warm-start``, by default the profile's first warm
start), validating on ``data.train``'s carved validation split (never a
test split), and picks per loss the rate with the best validation nDCG@10 at the last epoch (the compare profile's
policy is its last epoch); a loss whose best rate is the grid's highest (lowest) gets the next rate up (down) by 3x,
at most ``--extend`` times, so that no choice sits on the grid's edge. The datasets, corpus embeddings and training
candidate sets are built once and shared by every run; the runs differ only in the loss and its rate.

Writes ``studies/out/compare_lr.json`` (``--out``; with the machine) and prints a Markdown table (validation nDCG@10
per loss and rate, the seconds each run took) and the ``train.learning_rates`` mapping to put into the profile.

Usage::

    python studies/compare_lr.py --work W [--mirror DIR] [--profile compare] [--warm-start minilm] \
        [--set data.train=nfcorpus/train ...] [--rates 1e-5 3e-5 1e-4] [--extend 2] [--objectives pg listnet] \
        [--out studies/out/compare_lr.json]
"""

from __future__ import annotations

import argparse
import sys
import json
import os
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench"))  # record: the plumbing shared with bench/
from record import add_mirror_option, add_out_option, add_set_option, new_record, save, table  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
SHARED = ("datasets", "splits", "training-sets")  # built once, linked into every run's root


def title(profile: str, dataset: str) -> str:
    return f"Each objective's learning rate for the {profile} profile, chosen on {dataset}'s validation split"


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """The command line: ``--profile`` and the repeatable ``--set KEY=VALUE`` go to every run's params."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--work", type=Path, required=True)
    add_mirror_option(parser, required=False)
    parser.add_argument("--profile", default="compare", help="profiles/NAME.yaml laid over params.yaml")
    parser.add_argument("--warm-start", default=None,
                        help="the model every run trains from (default: the profile's first train.warm_starts)")
    add_set_option(parser, "data.train=nfcorpus/train", "every run (and the shared setup)")
    parser.add_argument("--rates", type=float, nargs="+", default=[1e-5, 3e-5, 1e-4])
    parser.add_argument("--objectives", nargs="+", default=None, help="default: the profile's train.objectives")
    parser.add_argument("--extend", type=int, default=2, help="times the grid may grow past an edge (x3 or /3 each)")
    add_out_option(parser, __file__)
    args = parser.parse_args(argv)
    bad = [o for o in args.overrides if "=" not in o or not o.partition("=")[0].strip()]
    if bad:
        parser.error(f"--set {bad[0]!r}: expected KEY=VALUE, e.g. --set data.train=nfcorpus/train")
    return args


def run_overrides(args: argparse.Namespace, root: Path, extra: list[str] = (), fixed: list[str] = ()) -> list[str]:
    """A run's overrides, in order: its own folders and no tracking, the mirror, the script's ``fixed`` settings
    (which ``--set`` may change), then ``--set``, then the warm start of ``--warm-start`` (the one policy trained, and
    the one dense system its policy is tested against), then the run's own (its objective and rate), so that ``--set``
    never changes what the grid varies."""
    work = args.work.resolve()
    warm = getattr(args, "warm_start", None)
    return [f"paths.root={root}", f"paths.data={work / 'data'}", f"paths.embeddings={work / 'embeddings'}",
            *([f"data.mirror={args.mirror}"] if args.mirror else []), "tracking.enabled=false", *fixed,
            *args.overrides, *([f"train.warm_starts=[{warm}]", f"evaluate.systems.dense=[{warm}]"] if warm else []),
            *extra]


def _params(args: argparse.Namespace, root: Path, extra: list[str] = ()):
    from pgrank.config import load_params

    return load_params(ROOT / "params.yaml", run_overrides(args, root, extra), profile=args.profile)


def main() -> None:
    args = parse_args()
    os.environ.setdefault("HF_HUB_OFFLINE", "1")

    from pgrank.atomic import write_json
    from pgrank.download.stage import download
    from pgrank.mining.candidate_sets import mine_splits, training_targets
    from pgrank.paths import Paths
    from pgrank.training.trainer import train

    work = args.work.resolve()
    base_root = work / "runs" / "base"
    params = _params(args, base_root)
    warm = params.train.warm_starts[0]
    objectives = args.objectives or params.train.objectives
    paths = Paths.from_config(params.paths)
    started = time.perf_counter()
    download(params, paths, progress=False)
    mine_splits(params, paths, training_targets(params), progress=False)
    setup_seconds = time.perf_counter() - started
    print(f"shared setup: {setup_seconds:.0f} s", flush=True)

    def run(objective: str, rate: float) -> tuple[float, float, float]:
        """Validation nDCG@10 after the last epoch, its gain over the warm start, and the run's seconds
        (a finished run of the same profile and overrides in ``--work`` is read back, not retrained)."""
        root = work / "runs" / f"{objective}-{rate:g}"
        root.mkdir(parents=True, exist_ok=True)
        for name in SHARED:
            if not (root / name).exists():
                (root / name).symlink_to(base_root / name)
        own = [f"train.objectives=[{objective}]", f"train.learning_rates={{{objective}: {rate}}}"]
        settings = {"profile": args.profile, "overrides": run_overrides(args, root, own)}
        cached = root / "grid-result.json"  # read back only under the same profile and overrides
        done = json.loads(cached.read_text()) if cached.is_file() else None
        if isinstance(done, dict) and done.get("settings") == settings:
            return tuple(done["result"])
        p = _params(args, root, own)
        t0 = time.perf_counter()
        result = train(p, Paths.from_config(p.paths), warm, objective=objective, device="cpu", progress=False)
        seconds = time.perf_counter() - t0
        first, last = result.history[0]["val_ndcg@10"], result.history[-1]["val_ndcg@10"]
        write_json(cached, {"settings": settings, "result": [last, last - first, seconds]})
        print(json.dumps({"objective": objective, "rate": rate, "val_ndcg@10": last, "gain": last - first,
                          "seconds": round(seconds)}), flush=True)
        return last, last - first, seconds

    results: dict[str, dict[float, tuple[float, float, float]]] = {}
    for objective in objectives:
        by_rate = results.setdefault(objective, {})
        for rate in args.rates:
            by_rate[rate] = run(objective, rate)
        # A best rate at an edge of the grid is not a choice: extend the grid past it (x3 or /3) until it is not.
        for _ in range(args.extend):
            best = max(by_rate, key=lambda r: by_rate[r][0])
            if best not in (min(by_rate), max(by_rate)):
                break
            step = float(f"{best * 3:.0e}") if best == max(by_rate) else float(f"{best / 3:.0e}")
            by_rate[step] = run(objective, step)

    record = new_record(title(args.profile, params.data.train.split("/")[0]))
    record.update(profile=args.profile, warm_start=warm, overrides=args.overrides, train=params.data.train, grid=args.rates,
                  extend=args.extend, objectives=list(results),
                  setup_seconds=setup_seconds, **grid_results(results))
    save(record, args.out, render)


def grid_results(results: dict[str, dict[float, tuple[float, float, float]]]) -> dict:
    """``{objective: {rate: (validation nDCG@10, gain over the warm start, seconds)}}`` as the record holds it: every
    run, and per objective the rate with the best validation nDCG@10."""
    runs = [{"objective": objective, "rate": rate, "val_ndcg_at_10": v, "gain": g, "seconds": s}
            for objective, by_rate in results.items() for rate, (v, g, s) in sorted(by_rate.items())]
    chosen = {objective: max(by_rate, key=lambda r: by_rate[r][0]) for objective, by_rate in results.items()}
    return {"runs": runs, "chosen": chosen}


def render(record: dict) -> str:
    """The record as the Markdown table and mapping the script prints."""
    rates = sorted({run["rate"] for run in record["runs"]})
    cell = {(run["objective"], run["rate"]): run for run in record["runs"]}
    rows = []
    for objective in record["objectives"]:
        runs = [cell.get((objective, r)) for r in rates]
        rows.append([objective, *(f"{x['val_ndcg_at_10']:.4f} ({x['gain']:+.4f}, {x['seconds']:.0f} s)" if x else ""
                                  for x in runs), f"{record['chosen'][objective]:g}"])
    return "\n".join([
        *table(["objective", *(f"lr {r:g}" for r in rates), "chosen"], rows, "l" + "r" * (len(rates) + 1)), "",
        f"Cells: {record.get('train', 'scifact/train').split('/')[0]} validation nDCG@10 after the last epoch (gain over "
        f"the warm start, wall time of the run). train.learning_rates for profiles/{record['profile']}.yaml:",
        "{" + ", ".join(f"{o}: {record['chosen'][o]:g}" for o in record["objectives"]) + "}"])


if __name__ == "__main__":
    main()
